/* fsc-train: trains a GPT on token data and reports what it did.
 *
 * Progress goes to stderr (a live line on a terminal, a line every
 * --log-every steps or --log-seconds otherwise: train_progress.c); --metrics
 * gets one JSON object per step; the closing summary gives throughput, model
 * FLOP/s against the sgemm peak (FSC_PEAK_GFLOPS, else measured in the same
 * process), and peak
 * memory by tag. Flags may come from --config, a checkpoint or a weights
 * file (train_config.c); SIGINT/SIGTERM stop after the current step with a
 * checkpoint (train_signals.c). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/tokenizer.h"
#include "fsc/version.h"
#include "fsc/checkpoint.h"
#include "fsc/cp.h"
#include "fsc/profile.h"
#include "train_common.h"
#include "train_profile.h"
#include "train_run.h"
#include "train_validation.h"
#include "tool_report.h"

static const char *USAGE =
    "Trains a GPT-2 style model: in one process (--strategy single), over threads (dp), or\n"
    "over MPI ranks (ddp, under mpirun). Data order: step s uses sequences s*G .. s*G+G-1\n"
    "(G = batch * grad-accum * ranks); sequence i is tokens [i*T, i*T+T] (wrapping).\n"
    "Validation (--eval-every N): the mean loss over --eval-batches global batches of --val-data,\n"
    "by default llm.c's *_val.bin shards beside the training shards (a --data glob then skips\n"
    "them) or else the last --val-fraction of the data, held out of training.\n"
    "--resume takes the checkpoint's flags (model, data, schedule, batch, and the outputs:\n"
    "--checkpoint-dir, --save-every, --keep-last, --metrics, --save) unless given;\n"
    "--init-from takes the model flags from the file (metadata, config.json beside it, shapes)\n"
    "or a Hugging Face LLaMA directory (config.json; flags that contradict it are refused);\n"
    "with --arch llama, --save/--save-init DIR write one (config.json, safetensors shards).\n"
    "SIGINT/SIGTERM stop after the current step, write a checkpoint into --checkpoint-dir and\n"
    "exit with status 75; a second signal stops at once.";

static void summary(const trainer *t, double first_loss, double last_loss, double seconds,
                    int64_t steps, double peak_gflops, bool peak_fixed, double comm_s,
                    const int64_t *mem, const validation *v) {
    const train_options *o = &t->opt;
    const bool threads = fsc_strategy_takes(o->strategy, "threads");
    /* the strategy's world counts --cp's ranks, which share each sequence */
    double tokens = (double)steps * o->batch * o->grad_accum * o->model.seq * t->world / o->cp;
    double tok_s = seconds > 0 ? tokens / seconds : 0;
    double gflops = tok_s * fsc_gpt_flops_per_token(&o->model, o->model.seq) / 1e9;
    const int ranks = fsc_dist_size();
    int cores = threads ? o->threads : ranks * o->threads;
    fprintf(stderr, "\n== fsc-train summary (--strategy %s, %d rank%s%s", o->strategy, ranks,
            ranks > 1 ? "s" : "", threads ? ", threads" : "");
    /* the strategy's world is replicas x cp (the ranks that hold the same parameters) */
    if (o->pp > 1 || o->tp > 1 || o->cp > 1) fprintf(stderr, ": %d replica(s)", t->world / o->cp);
    if (o->cp > 1) fprintf(stderr, " x cp %d", o->cp);
    if (o->pp > 1) fprintf(stderr, " x pp %d", o->pp);
    if (o->tp > 1) fprintf(stderr, " x tp %d", o->tp);
    fprintf(stderr, ") ==\n");
    char name[96];
    fprintf(stderr, "model      %s, %.2fM parameters\n",
            progress_model_name(&o->model, name, sizeof name),
            (double)fsc_gpt_num_params(&o->model) / 1e6);
    fprintf(stderr, "loss       %.4f -> %.4f over %" PRId64 " steps (%.1f s)\n", first_loss,
            last_loss, steps, seconds);
    if (v->on && !isnan(v->loss))
        fprintf(stderr,
                "val loss   %.4f after step %" PRId64 " (%d batches of %d sequences from %s)\n",
                v->loss, v->step, o->eval_batches, o->batch * o->grad_accum * t->world / o->cp,
                v->source);
    const fsc_cp_stats ring = fsc_cp_get_stats(fsc_gpt_plan_cp(t->plan));
    if (o->cp > 1)
        fprintf(stderr,
                "cp ring    rank 0: %.2f s waiting on K/V blocks, %.2f s in attention tiles, %.1f "
                "MB sent\n",
                ring.wait_s, ring.compute_s, (double)ring.bytes / 1e6);
    fprintf(stderr,
            "throughput %.0f tokens/s, %.1f model GFLOP/s = %.0f%% of %d x %.1f GFLOP/s sgemm "
            "peak (%s)\n",
            tok_s, gflops, peak_gflops > 0 ? 100 * gflops / (peak_gflops * cores) : 0, cores,
            peak_gflops, peak_fixed ? "FSC_PEAK_GFLOPS" : "measured at start-up");
    fsc_strategy_stats st = fsc_strategy_get_stats(t->s);
    if (st.messages)
        fprintf(stderr,
                "pipeline   %.1f%% of step time waiting on the other stages (rank 0), %lld "
                "messages sent\n",
                seconds > 0 ? 100 * comm_s / seconds : 0, (long long)st.messages);
    if (st.reductions || st.gathers) {
        fprintf(stderr,
                "comm       %.1f%% of step time waiting on communication (rank 0): %lld "
                "gradient reductions",
                seconds > 0 ? 100 * comm_s / seconds : 0, (long long)st.reductions);
        if (st.units)
            fprintf(stderr, ", %lld all-gathers over %d units", (long long)st.gathers, st.units);
        fprintf(stderr, "\n");
    }
    if (o->tp > 1) /* the activations' all-reduces inside forward and backward */
        fprintf(stderr, "tp comm    %.1f%% of step time in tensor-parallel collectives (rank 0)\n",
                seconds > 0 ? 100 * st.tp_wait_s / seconds : 0);
    train_moe_report(t, seconds, stderr);
    for (int r = 0; r < mem_ranks(t); r++) {
        fprintf(stderr, "peak memory");
        if (mem_ranks(t) > 1) fprintf(stderr, " rank %d:", r);
        for (int tag = 0; tag < FSC_MEM_TAG_COUNT; tag++)
            fprintf(stderr, " %s %.1f MiB%s", fsc_mem_tag_name((fsc_mem_tag)tag),
                    (double)mem[r * FSC_MEM_TAG_COUNT + tag] / 1048576.0,
                    tag + 1 < FSC_MEM_TAG_COUNT ? "," : "");
        fprintf(stderr, "\n");
    }
    /* ZeRO's analytical model-state bytes per rank beside the allocator's */
    fsc_strategy_memory m = fsc_strategy_memory_plan(t->s);
    /* sharding over the data-parallel replicas (ZeRO), beside the split over
     * the pipeline and TP ranks, which every layout has whatever its ZeRO */
    static const char *const stage[] = {"replicated over dp", "ZeRO-1 over dp", "ZeRO-2 over dp",
                                        "ZeRO-3 over dp"};
    char split[64] = "";
    if (t->opt.pp > 1 || t->opt.tp > 1)
        snprintf(split, sizeof split, "; this rank's share of pp %d x tp %d", t->opt.pp, t->opt.tp);
    fsc_optim_config cfg = fsc_optim_get_config(fsc_strategy_optim(t->s));
    fprintf(stderr,
            "model state analytical per rank (%s%s): params %.1f MiB%s, grads %.1f MiB%s, "
            "optimizer %.1f MiB (K=%d bytes/param over %d rank%s); measured optimizer "
            "state rank 0: %.1f MiB\n",
            stage[m.zero_stage], split, m.params_bytes / 1048576.0,
            m.params_shards > 1 ? " + gathered units" : "", m.grads_bytes / 1048576.0,
            m.params_shards > 1  ? " + gathered units"
            : m.grads_shards > 1 ? " + buckets in use"
                                 : "",
            m.optim_bytes / 1048576.0, 4 * fsc_optim_state_count(&cfg), m.optim_shards,
            m.optim_shards > 1 ? "s" : "", (double)m.optim_measured / 1048576.0);
    fsc_grad_scaler *sc = fsc_trainer_grad_scaler(t->tr);
    if (sc) {
        fsc_grad_scaler_state gs = fsc_grad_scaler_get_state(sc);
        fprintf(stderr, "fp16       loss scale %g, %lld step%s skipped (inf/NaN gradients)\n",
                gs.scale, (long long)gs.skipped_steps, gs.skipped_steps == 1 ? "" : "s");
    }
}

/* Fault injection for the tests: FSC_FAULT="sleep@R:S" makes rank R stop
 * participating (sleep) before step S, "exit@R:S" makes it exit(3),
 * "kill@R:S" sends it SIGKILL (no clean-up at all), and
 * "inf@R:S" puts an inf into one of rank R's gradients in step S (fp16 loss
 * scaling must then skip that step on every rank). */
bool fsc_fault_set(const char *name); /* src/core/fault.h, for FSC_FAULT=ckpt@R:K */

static void inject_fault(int rank, int64_t step) {
    const char *f; /* checked at start-up (train_env_check) */
    fsc_env_string("FSC_FAULT", &f);
    char kind[8];
    int r;
    long long s;
    if (!f || sscanf(f, "%7[a-z]@%d:%lld", kind, &r, &s) != 3 || r != rank || s != step) return;
    if (!strcmp(kind, "inf")) return; /* armed at start-up, see main */
    fprintf(stderr, "fsc-train: FSC_FAULT: rank %d %s before step %lld\n", rank, kind, s);
    if (!strcmp(kind, "exit")) exit(3);
    if (!strcmp(kind, "kill")) raise(SIGKILL);
    if (!strcmp(kind, "sleep")) sleep(3600);
}

/* Ends the process after a failure. Under a launcher the other ranks may be
 * blocked in a collective: MPI_Finalize would hang, so exit without it and let
 * the launcher end the job (every rank exits non-zero). */
static int fail(trainer *t, int world, int code) {
    if (code == 1) code = fsc_dist_exit_status(code); /* a lost rank: FSC_DIST_LOST_EXIT */
    if (t) trainer_free(t);
    if (world > 1) {
        fflush(NULL);
        _exit(code);
    }
    fsc_dist_finalize();
    return code;
}

/* A run that ends well (or stops cleanly on a signal): everything freed, MPI
 * finalised. */
static void finish(trainer *t, validation *val, char *config_json, fsc_bpe *bpe) {
    trainer_free(t);
    validation_free(val);
    free(config_json);
    fsc_bpe_free(bpe);
    train_config_free();
    fsc_dist_finalize();
}

int main(int argc, char **argv) {
    int rc = fsc_dist_init(&argc, &argv, NULL);
    if (rc) {
        fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        return 1;
    }
    int rank = fsc_dist_rank(), world = fsc_dist_size();
    if ((rc = train_env_check())) { /* FSC_* variables: refused before any work */
        fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        return fail(NULL, world, 2);
    }
    train_options o;
    train_options_default(&o);
    rc = train_options_parse(&o, argc, argv, "fsc-train", USAGE);
    if (rc == 1) return fail(NULL, 1, 0);
    if (rc) {
        if (rank == 0) fprintf(stderr, "fsc-train: %s (see --help)\n", fsc_last_error());
        return fail(NULL, world, 2);
    }
    if (rank != 0) o.quiet = true; /* rank 0 writes --save, --save-init, --metrics */
    if ((o.resume && (rc = train_config_resume(&o, !o.quiet))) || (rc = train_model_resolve(&o)) ||
        (o.init_from && !o.resume && (rc = train_config_init_from(&o, !o.quiet)))) {
        if (rank == 0) fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        return fail(NULL, world, 2);
    }
    if ((rc = train_options_check(&o))) { /* the same verdict on every rank: said once */
        if (rank == 0) fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        return fail(NULL, world, 2);
    }
    validation val = {.on = o.eval_every > 0, .loss = NAN};
    fsc_bpe *bpe = NULL;
    if (o.tokenizer && (rc = fsc_bpe_load(o.tokenizer, &bpe))) {
        if (rank == 0) fprintf(stderr, "fsc-train: --tokenizer: %s\n", fsc_last_error());
        return fail(NULL, world, 2);
    }
    if (bpe && (rc = train_vocab_tokenizer(&o, bpe))) {
        if (rank == 0) fprintf(stderr, "fsc-train: %s\n", fsc_last_error());
        fsc_bpe_free(bpe);
        return fail(NULL, world, 2);
    }
    if ((rc = train_consistency_check(&o))) { /* every rank says it, before any training */
        fprintf(stderr, "fsc-train: rank %d: %s\n", rank, fsc_last_error());
        fsc_bpe_free(bpe);
        return fail(NULL, world, 2);
    }
    char *config_json = train_config_json(&o); /* before --data loses its *_val shards */
    o.config_json = config_json;
    if ((rc = validation_find_shards(&o, &val))) {
        if (rank == 0) fprintf(stderr, "fsc-train: --data %s: %s\n", o.data, fsc_last_error());
        return fail(NULL, world, 2);
    }
    const char *data_spec = o.data;              /* as given, for the checkpoint's config */
    if (val.train_spec) o.data = val.train_spec; /* llm.c's *_val shards are not trained on */
    trainer t;
    if ((rc = tool_agree(trainer_init(&t, &o), "setting up"))) { /* said once */
        tool_report("fsc-train", "%s", "");
        return fail(&t, world, 1);
    }
    if (t.opt.model.vocab != o.model.vocab) { /* taken from the data: the config says so */
        o.model.vocab = t.opt.model.vocab;
        const char *trained_on = o.data;
        o.data = data_spec;
        free(config_json);
        t.opt.config_json = o.config_json = config_json = train_config_json(&o);
        o.data = trained_on;
    }
    if (bpe && strncmp(o.data, "builtin", 7) && !strstr(o.data, ".bin")) { /* text: GPT-2 ids */
        fsc_tokens_free(&t.tokens);
        if ((rc = fsc_bpe_encode_file(bpe, o.data, &t.tokens)) ||
            t.tokens.count < (int64_t)o.model.seq + 1 || t.tokens.vocab > o.model.vocab) {
            if (!rc)
                fsc_error(FSC_ERR_INVALID,
                          "%" PRId64 " tokens of vocab %d: needs --seq + 1 (%d) tokens and "
                          "--vocab >= %d",
                          t.tokens.count, t.tokens.vocab, o.model.seq + 1, t.tokens.vocab);
            tool_report("fsc-train", "--tokenizer, --data %s: ", o.data);
            return fail(&t, world, 1);
        }
        if (!o.quiet)
            fprintf(stderr, "fsc-train: --data %s: %" PRId64 " GPT-2 BPE tokens\n", o.data,
                    t.tokens.count);
    }
    if (val.on &&
        (rc = tool_agree(validation_load(&t, bpe, &val), "loading the validation data"))) {
        tool_report("fsc-train", "%s", "");
        return fail(&t, world, 1);
    }
    if (val.train_spec && !o.quiet)
        fprintf(stderr, "fsc-train: --data: llm.c validation shards left out of training: %s\n",
                val.val_spec);
    if (val.on && !o.quiet)
        fprintf(stderr, "fsc-train: validation every %" PRId64 " steps: %d batches of %s\n",
                o.eval_every, o.eval_batches, val.source);
    const char *fault;
    fsc_env_string("FSC_FAULT", &fault);
    int fault_rank;
    long long fault_step;
    if (fault && sscanf(fault, "inf@%d:%lld", &fault_rank, &fault_step) == 2 && fault_rank == rank)
        t.poison_step = fault_step;
    /* ckpt@R:K: rank R dies at commit point K of its first checkpoint save
     * (the library's test switch, core/fault.h; fsc-train links it statically) */
    if (fault && sscanf(fault, "ckpt@%d:%lld", &fault_rank, &fault_step) == 2 &&
        fault_rank == rank) {
        char name[32];
        snprintf(name, sizeof name, "ckpt-kill:%lld", fault_step);
        if (!fsc_fault_set(name)) {
            fprintf(stderr, "fsc-train: FSC_FAULT=%s: no commit point %lld\n", fault, fault_step);
            return fail(&t, world, 2);
        }
    }
    /* a save's needs are checked now, not at the first save many steps in */
    if (o.checkpoint_dir &&
        tool_agree(fsc_ckpt_check_dir(o.checkpoint_dir), "checking --checkpoint-dir")) {
        tool_report("fsc-train", "--checkpoint-dir: ");
        return fail(&t, world, 1);
    }
    FILE *metrics = NULL;
    /* resume: append; every rank keeps o.metrics, as the checkpoint's config is one text */
    if (rank == 0 && o.metrics && !(metrics = fopen(o.metrics, o.resume ? "a" : "w"))) {
        fprintf(stderr, "fsc-train: --metrics %s: cannot open for writing\n", o.metrics);
        return fail(&t, world, 1);
    }
    FILE *csv = NULL; /* the header starts the file, not each resumed segment */
    if (rank == 0 && o.metrics_csv) {
        if (!(csv = fopen(o.metrics_csv, o.resume ? "a" : "w"))) {
            fprintf(stderr, "fsc-train: --metrics-csv %s: cannot open for writing\n",
                    o.metrics_csv);
            if (metrics) fclose(metrics);
            return fail(&t, world, 1);
        }
        if (ftell(csv) == 0) fprintf(csv, "%s\n", PROGRESS_CSV_HEADER);
    }
    if (!o.quiet) fprintf(stderr, "fsc-train: %s\n", fsc_blas_describe());
    if (!o.quiet && fsc_blas_hint()) fprintf(stderr, "fsc-train: %s\n", fsc_blas_hint());
    const bool threads = fsc_strategy_takes(o.strategy, "threads");
    /* MFU's peak per core: FSC_PEAK_GFLOPS when set (one figure, so runs compare),
     * else measured now, which the machine's load moves (docs/performance.md) */
    double peak = 0;
    const bool peak_fixed = fsc_env_given("FSC_PEAK_GFLOPS") &&
                            !fsc_env_double("FSC_PEAK_GFLOPS", &peak); /* checked at start-up */
    if (!peak_fixed && rank == 0) peak = fsc_sgemm_peak_gflops(1024, 3) / (threads ? 1 : o.threads);
    double first_loss = NAN, last_loss = NAN, comm = 0, t0 = fsc_now();
    int64_t steps = 0;
    double tokens_per_step = (double)o.batch * o.grad_accum * o.model.seq * t.world / o.cp;
    const int64_t first_step = trainer_next_step(&t);
    if (first_step && !o.quiet)
        fprintf(stderr, "fsc-train: resumed at step %" PRId64 " from %s\n", first_step, o.resume);
    progress prog; /* MFU against every core's share of the sgemm peak */
    const int cores = threads ? o.threads : world * o.threads;
    /* t.opt: the flags with the model as built (--moe-experts: its MoE layers) */
    progress_start(&prog, &t.opt, first_step, tokens_per_step, peak * 1e9 * cores);
    progress_header(&prog, &t.opt, world);
    train_signals_install();
    int stop = 0;
    if (o.profile && fsc_prof_start()) {
        fprintf(stderr, "fsc-train: --profile %s: %s\n", o.profile, fsc_last_error());
        return fail(&t, world, 1);
    }
    /* under --adascale --steps counts scale-invariant steps (each advances by the gain) */
    for (int64_t s = first_step;
         (o.adascale ? fsc_trainer_progress(t.tr) < (double)o.steps : s < o.steps) && !stop; s++) {
        fsc_step_result r;
        inject_fault(rank, s + 1);
        if ((rc = trainer_step(&t, &r))) {
            progress_end(&prog);
            tool_report("fsc-train", "step %" PRId64 ": ", s + 1);
            break;
        }
        steps++;
        comm += r.comm_wait_s;
        if ((rc = train_signals_agree(&stop))) {
            progress_end(&prog);
            tool_report("fsc-train", "after step %" PRId64 ": ", s + 1);
            break;
        }
        if (s == first_step) first_loss = r.loss;
        last_loss = r.loss;
        double tok_s = tokens_per_step / r.seconds;
        /* the last step: under --adascale the one that carries progress to --steps */
        const bool last_step =
            o.adascale ? fsc_trainer_progress(t.tr) >= (double)o.steps : s + 1 == o.steps;
        const bool eval_now = val.on && ((s + 1) % o.eval_every == 0 || last_step);
        if (eval_now && (rc = validation_run(&t, &val, s + 1))) {
            progress_end(&prog);
            tool_report("fsc-train", "validation after step %" PRId64 ": ", s + 1);
            break;
        }
        /* evaluated first, so that the checkpoint carries its val loss; with
         * --keep-best every evaluation is also a checkpoint */
        t.val_loss_now = eval_now ? val.loss : NAN;
        const bool saved_now =
            (o.save_every && (s + 1) % o.save_every == 0) || (o.keep_best > 0 && eval_now);
        if (((stop && o.checkpoint_dir) || saved_now) && (rc = trainer_checkpoint(&t))) {
            progress_end(&prog);
            tool_report("fsc-train", "checkpoint at step %" PRId64 ": ", s + 1);
            break;
        }
        if (metrics) progress_metrics(&prog, metrics, s + 1, &r, tok_s, eval_now ? val.loss : NAN);
        if (csv) progress_metrics_csv(&prog, csv, s + 1, &r, tok_s, eval_now ? val.loss : NAN);
        if (eval_now && !o.quiet)
            progress_note(&prog,
                          "step %" PRId64 "/%" PRId64 "  val loss %.4f  (%d batches, %.2f s)",
                          s + 1, o.steps, val.loss, o.eval_batches, val.seconds);
        progress_step(&prog, s + 1, &r, val.loss);
        const char *sig = stop == SIGINT ? "SIGINT" : stop == SIGTERM ? "SIGTERM" : "a signal";
        if (stop && rank == 0 && o.checkpoint_dir)
            progress_note(&prog,
                          "fsc-train: %s: stopped after step %" PRId64 ", checkpoint "
                          "saved in %s (continue with --resume %s); exit %d",
                          sig, s + 1, o.checkpoint_dir, o.checkpoint_dir, TRAIN_EXIT_STOPPED);
        else if (stop && rank == 0)
            progress_note(&prog,
                          "fsc-train: %s: stopped after step %" PRId64 ", nothing saved "
                          "(no --checkpoint-dir); exit %d",
                          sig, s + 1, TRAIN_EXIT_STOPPED);
    }
    progress_end(&prog);
    /* --async-save: the checkpoint still in flight is committed (or its
     * failure reported) before the run ends, then pruned as a synchronous one */
    if (!rc && (rc = fsc_trainer_checkpoint_wait(t.tr))) {
        tool_report("fsc-train", "checkpoint written in the background: ");
    } else if (!rc && o.async_save && (o.keep_last > 0 || o.keep_best > 0) && rank == 0 &&
               fsc_ckpt_prune_best(o.checkpoint_dir, o.keep_last, o.keep_best, "val_loss")) {
        fprintf(stderr, "fsc-train: --keep-last %d --keep-best %d: %s\n", o.keep_last, o.keep_best,
                fsc_last_error());
    }
    double seconds = fsc_now() - t0;
    if (metrics && (ferror(metrics) | (fclose(metrics) != 0))) { /* a full disk, say */
        fprintf(stderr, "fsc-train: --metrics %s: writing its rows failed: %s\n", o.metrics,
                strerror(errno));
        rc = rc ? rc : 1;
    }
    if (csv && (ferror(csv) | (fclose(csv) != 0))) {
        fprintf(stderr, "fsc-train: --metrics-csv %s: writing its rows failed: %s\n", o.metrics_csv,
                strerror(errno));
        rc = rc ? rc : 1;
    }
    if (rc) return fail(&t, world, 1);
    if (stop) { /* every rank agreed: a clean stop, nothing more to write */
        finish(&t, &val, config_json, bpe);
        return TRAIN_EXIT_STOPPED;
    }
    if (o.trace && steps && fsc_strategy_write_trace(t.s, o.trace)) {
        tool_report("fsc-train", "--trace %s: ", o.trace);
        return fail(&t, world, 1);
    }
    if (o.save && trainer_save(&t, o.save)) {
        tool_report("fsc-train", "--save %s: ", o.save);
        return fail(&t, world, 1);
    }
    if (o.save_adapter && train_lora_save_adapter(&t, o.save_adapter)) {
        tool_report("fsc-train", "--save-adapter %s: ", o.save_adapter);
        return fail(&t, world, 1);
    }
    if (o.save && rank == 0 && train_config_write_hf(&t.opt, o.save)) /* Hugging Face's */
        fprintf(stderr, "fsc-train: --save: config.json: %s\n", fsc_last_error());
    if (o.save_dir && train_save_dir(&t, o.save_dir)) {
        tool_report("fsc-train", "--save-dir %s: ", o.save_dir);
        return fail(&t, world, 1);
    }
    if (o.save_sharded && trainer_save_sharded(&t, o.save_sharded)) {
        tool_report("fsc-train", "--save-sharded %s: ", o.save_sharded);
        return fail(&t, world, 1);
    }
    if (o.profile && train_profile_finish(o.profile, fsc_group_world(), stdout)) {
        fprintf(stderr, "fsc-train: --profile %s: %s\n", o.profile, fsc_last_error());
        return fail(&t, world, 1);
    }
    int64_t *mem = calloc((size_t)mem_ranks(&t) * FSC_MEM_TAG_COUNT, sizeof *mem);
    if (!mem || gather_mem_peaks(&t, mem)) {
        tool_report("fsc-train", "gathering memory figures: ");
        free(mem);
        return fail(&t, world, 1);
    }
    if (!o.quiet && steps)
        summary(&t, first_loss, last_loss, seconds, steps, peak, peak_fixed, comm, mem, &val);
    if (o.save && !o.quiet) fprintf(stderr, "saved %s (and config.json beside it)\n", o.save);
    free(mem);
    finish(&t, &val, config_json, bpe);
    return 0;
}
