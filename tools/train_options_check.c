/* The checks of fsc-train's and fsc-bench's options that need no model or
 * data: each numeric flag against its documented range (the table below,
 * which --help prints too), the combinations of flags, output paths
 * writable; and resolving --arch into the model's fields. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tool_flags.h"
#include "train_common.h"

/* Every numeric flag's range, inclusive ([lo, hi]; open_hi: [lo, hi)),
 * enforced by train_options_check and printed by --help. The bounds on sizes
 * are sanity bounds far past any real run: --steps and the step counts at most
 * 2^35 (a year of steps at 1 ms each); --grad-accum at most 65536 micro-batches
 * per step (2147483647 at 1 ms a micro-batch would be 25 days per step). */
typedef struct {
    const char *name;
    double lo, hi;
    bool open_hi;
} flag_range;

#define STEPS_MAX 34359738368.0 /* 2^35 */
static const flag_range ranges[] = {
    {"layers", 1, 1024, false},
    {"d-model", 1, 65536, false},
    {"heads", 1, 1024, false},
    {"seq", 1, 1048576, false},
    {"vocab", 1, 16777216, false},
    {"dropout", 0, 1, true},
    {"kv-heads", 0, 1024, false},
    {"ffn-hidden", 0, 1048576, false},
    {"rope-theta", 0, 1e9, false},
    {"norm-eps", 0, 1, false},
    {"tie-embeddings", 0, 1, false},
    {"qkv-bias", 0, 1, false},
    {"lora-rank", 0, 65536, false},
    {"lora-alpha", 0, 1e6, false},
    {"lora-dropout", 0, 1, true},
    {"batch", 1, 1048576, false},
    {"grad-accum", 1, 65536, false},
    {"steps", 0, STEPS_MAX, false},
    {"lr", 0, 100, false},
    {"min-lr-ratio", 0, 1, false},
    {"warmup", 0, STEPS_MAX, false},
    {"weight-decay", 0, 100, false},
    {"beta1", 0, 1, true},
    {"beta2", 0, 1, true},
    {"eps", 0, 1, false}, /* 0: the optimizer's default, 1e-8 */
    {"momentum", 0, 1, false},
    {"clip", 0, 1e9, false},
    {"seed", 0, 18446744073709551615.0, false}, /* every uint64; a sign is refused */
    {"threads", 1, 1024, false},
    {"bucket-mb", 0, 1048576, false}, /* and > 0 */
    {"min-params", 0, 1099511627776.0, false},
    {"reshard-after-forward", 0, 1, false},
    {"shard-group", 0, 1048576, false},
    {"pp", 1, 4096, false},
    {"tp", 1, 4096, false},
    {"cp", 1, 4096, false},
    {"localsgd-frequency", 0, 1000000, false},
    {"slowmo-frequency", 0, 1000000, false},
    {"slowmo-momentum", 0, 1, true},
    {"slowmo-lr", 0, 1000, false},
    {"moe-experts", 0, 4096, false}, /* and not 1 */
    {"moe-every", 1, 1024, false},
    {"moe-capacity", 0, 1024, false}, /* and > 0 */
    {"moe-aux-coef", 0, 1000, false},
    {"moe-hidden", 0, 1048576, false}, /* 0: 4 x --d-model */
    {"virtual", 0, 1024, false},
    {"save-every", 0, STEPS_MAX, false},
    {"log-every", 0, 1000000000, false}, /* 0: every step */
    {"log-seconds", 0, 1000000, false},
    {"keep-last", 0, 1000000, false},
    {"keep-best", 0, 1000000, false},
    {"val-fraction", 0, 1, true},
    {"eval-every", 0, STEPS_MAX, false},
    {"eval-batches", 1, 1000000, false},
};

static const flag_range *range_of(const char *name) {
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
        if (!strcmp(ranges[i].name, name)) return &ranges[i];
    return NULL;
}

static void range_text(const flag_range *r, char *buf, size_t n) {
    snprintf(buf, n, "[%.17g, %.17g%s", r->lo, r->hi, r->open_hi ? ")" : "]");
    if (!strcmp(r->name, "seed")) snprintf(buf, n, "[0, 18446744073709551615]");
}

bool train_flag_range_text(const char *name, char *buf, size_t n) {
    const flag_range *r = range_of(name);
    if (r) range_text(r, buf, n);
    return r != NULL;
}

/* Fails early, before any training, if `path` could not be written later. */
static int check_writable(const char *flag, const char *path) {
    if (!path || fsc_dist_rank() != 0) return FSC_OK; /* rank 0 writes */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0)
        return fsc_error(FSC_ERR_IO, "%s %s: directory %s is not writable (%s)", flag, path, dir,
                         strerror(errno));
    return FSC_OK;
}

/* Each numeric flag against its range (NaN and inf fail every range), then
 * the sizes that multiply: a run's token index, steps x batch x grad-accum x
 * ranks x seq, must stay below 2^62 (the data order indexes sequences and
 * tokens in int64). */
static int check_ranges(const train_options *o) {
    const tool_flag *f;
    for (int i = 0; (f = train_flag_at(i)); i++) {
        const void *p = (const char *)o + f->offset;
        double x;
        char text[64];
        switch (f->kind) {
        case ARG_INT:
            x = *(const int *)p, snprintf(text, sizeof text, "%d", *(const int *)p);
            break;
        case ARG_I64:
            x = (double)*(const int64_t *)p;
            snprintf(text, sizeof text, "%lld", (long long)*(const int64_t *)p);
            break;
        case ARG_U64:
            continue; /* --seed: every uint64 (parse_value refuses a sign) */
        case ARG_DOUBLE:
            x = *(const double *)p, snprintf(text, sizeof text, "%g", x);
            break;
        case ARG_FLOAT:
            x = *(const float *)p, snprintf(text, sizeof text, "%g", x);
            break;
        default:
            continue;
        }
        const flag_range *r = range_of(f->name);
        if (!r) return fsc_error(FSC_ERR_INTERNAL, "--%s has no documented range", f->name);
        if (!(x >= r->lo && (r->open_hi ? x < r->hi : x <= r->hi))) {
            char want[96];
            range_text(r, want, sizeof want);
            return fsc_error(
                FSC_ERR_INVALID, "--%s %s is out of range: expected %s %s", f->name, text,
                f->kind == ARG_DOUBLE || f->kind == ARG_FLOAT ? "a number in" : "an integer in",
                want);
        }
    }
    const double ranks = fsc_dist_size() > 1 ? fsc_dist_size() : 1;
    const double tokens =
        (o->steps > 1 ? (double)o->steps : 1.0) * o->batch * o->grad_accum * ranks * o->model.seq;
    if (!(tokens < 4611686018427387904.0)) /* 2^62 */
        return fsc_error(FSC_ERR_INVALID,
                         "--steps %lld x --batch %d x --grad-accum %d x %g ranks x --seq %d = %.3g "
                         "tokens: expected fewer than 2^62 (4.6e18) over the run",
                         (long long)o->steps, o->batch, o->grad_accum, ranks, o->model.seq, tokens);
    return FSC_OK;
}

int train_env_check(void) {
    int rc = fsc_env_check();                           /* the library's variables */
    return rc ? rc : fsc_env_check_reader("fsc-train"); /* and FSC_FAULT */
}

int train_model_resolve(train_options *o) {
    /* under a launcher with more ranks, no --strategy means ddp (the header says so) */
    if (!train_flag_given(o, "strategy") && fsc_strategy_is_single(o->strategy) &&
        fsc_dist_size() > 1)
        o->strategy = "ddp";
    if (!strcmp(o->arch, "gpt2")) {
        o->model.arch = FSC_ARCH_GPT2;
    } else if (!strcmp(o->arch, "llama")) {
        o->model.arch = FSC_ARCH_LLAMA;
    } else {
        return fsc_error(FSC_ERR_INVALID, "--arch \"%s\": expected gpt2 or llama", o->arch);
    }
    static const char *const llama_only[] = {"kv-heads", "ffn-hidden",     "rope-theta",
                                             "norm-eps", "tie-embeddings", "qkv-bias"};
    for (size_t i = 0; o->model.arch == FSC_ARCH_GPT2 && i < sizeof llama_only / sizeof *llama_only;
         i++)
        if (train_flag_given(o, llama_only[i]))
            return fsc_error(FSC_ERR_INVALID, "--%s is a LLaMA-family setting: add --arch llama",
                             llama_only[i]);
    o->model.tie_embeddings = o->tie_embeddings != 0;
    o->model.qkv_bias = o->qkv_bias != 0;
    return FSC_OK;
}

int train_options_check(const train_options *o) {
    int rc = fsc_gpt_config_check(&o->model);
    if (rc) return fsc_error_context(rc, "bad model: ");
    if (o->batch < 1) return fsc_error(FSC_ERR_INVALID, "--batch %d must be positive", o->batch);
    if (o->grad_accum < 1)
        return fsc_error(FSC_ERR_INVALID, "--grad-accum %d must be positive", o->grad_accum);
    if (o->steps < 0) return fsc_error(FSC_ERR_INVALID, "--steps must be >= 0");
    if (o->threads < 1) return fsc_error(FSC_ERR_INVALID, "--threads must be >= 1");
    if (!(o->bucket_mb > 0))
        return fsc_error(FSC_ERR_INVALID, "--bucket-mb %g must be positive", o->bucket_mb);
    if (o->save_every < 0) return fsc_error(FSC_ERR_INVALID, "--save-every must be >= 0");
    if (o->eval_every < 0) return fsc_error(FSC_ERR_INVALID, "--eval-every must be >= 0");
    if (o->eval_batches < 1)
        return fsc_error(FSC_ERR_INVALID, "--eval-batches %d must be >= 1", o->eval_batches);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return fsc_error(FSC_ERR_INVALID, "--val-fraction %g must be in [0, 1)", o->val_fraction);
    if (o->trace && o->pp < 2) return fsc_error(FSC_ERR_INVALID, "--trace needs --pp >= 2");
    if (o->tp < 1) return fsc_error(FSC_ERR_INVALID, "--tp %d must be >= 1", o->tp);
    if (o->cp < 1) return fsc_error(FSC_ERR_INVALID, "--cp %d must be >= 1", o->cp);
    if (o->cp > 1 && o->eval_every > 0)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "--eval-every with --cp %d: validation does not split the sequence over "
                         "the cp ranks yet; evaluate the saved weights without --cp",
                         o->cp);
    if (o->sequence_parallel && o->tp < 2)
        return fsc_error(FSC_ERR_INVALID, "--sequence-parallel needs --tp >= 2");
    if (o->recompute_attention && o->tp < 2)
        return fsc_error(FSC_ERR_INVALID, "--recompute-attention needs --tp >= 2");
    if (o->recompute_activation && o->tp < 2)
        return fsc_error(FSC_ERR_INVALID, "--recompute-activation needs --tp >= 2");
    if (o->localsgd_frequency < 0 || o->slowmo_frequency < 0)
        return fsc_error(FSC_ERR_INVALID,
                         "--localsgd-frequency and --slowmo-frequency must be >= 0");
    if (!(o->slowmo_momentum >= 0 && o->slowmo_momentum < 1) || !(o->slowmo_lr >= 0))
        return fsc_error(FSC_ERR_INVALID,
                         "--slowmo-momentum %g must be in [0, 1) and --slowmo-lr %g >= 0",
                         o->slowmo_momentum, o->slowmo_lr);
    if (o->balance && o->pp < 2)
        return fsc_error(FSC_ERR_INVALID, "--balance %s needs --pp >= 2 (it cuts pipeline stages)",
                         o->balance);
    if (o->save_every > 0 && !o->checkpoint_dir)
        return fsc_error(FSC_ERR_INVALID, "--save-every needs --checkpoint-dir");
    if (o->async_save && !o->checkpoint_dir)
        return fsc_error(FSC_ERR_INVALID, "--async-save needs --checkpoint-dir");
    if (o->keep_last < 0)
        return fsc_error(FSC_ERR_INVALID, "--keep-last %d must be >= 0", o->keep_last);
    if (o->keep_last > 0 && !o->checkpoint_dir)
        return fsc_error(FSC_ERR_INVALID, "--keep-last needs --checkpoint-dir");
    if (o->keep_best > 0 && (!o->checkpoint_dir || o->eval_every <= 0))
        return fsc_error(FSC_ERR_INVALID,
                         "--keep-best needs --checkpoint-dir and --eval-every (it keeps the "
                         "checkpoints of lowest val loss)");
    if (strcmp(o->progress, "auto") && strcmp(o->progress, "plain"))
        return fsc_error(FSC_ERR_INVALID, "--progress \"%s\": expected auto or plain", o->progress);
    if (!(o->log_seconds >= 0))
        return fsc_error(FSC_ERR_INVALID, "--log-seconds %g must be >= 0", o->log_seconds);
    if (o->reshard_after_forward != 0 && o->reshard_after_forward != 1)
        return fsc_error(FSC_ERR_INVALID, "--reshard-after-forward %d: expected 0 or 1",
                         o->reshard_after_forward);
    if (o->min_params < 0)
        return fsc_error(FSC_ERR_INVALID, "--min-params %lld must be >= 0",
                         (long long)o->min_params);
    if ((rc = check_ranges(o))) return rc;
    if ((rc = train_moe_check(o))) return rc;
    fsc_data_format format;
    if (fsc_data_format_parse(o->data_format, &format))
        return fsc_error_context(FSC_ERR_INVALID, "--data-format: ");
    fsc_strategy_info info;
    if (fsc_strategy_info_get(o->strategy, &info))
        return fsc_error_context(FSC_ERR_INVALID, "--strategy \"%s\": ", o->strategy);
    if (!info.spans_ranks && fsc_dist_size() > 1 && !o->local_in_world)
        return fsc_error(FSC_ERR_INVALID,
                         "--strategy %s runs in one process but %d were launched; "
                         "use --strategy ddp under mpirun",
                         o->strategy, fsc_dist_size());
    int64_t shard_bytes;
    if ((rc = train_hf_shard_bytes(o->shard_size, &shard_bytes))) return rc;
    if (o->save_dtype && strcmp(o->save_dtype, "fp32") && strcmp(o->save_dtype, "bf16"))
        return fsc_error(FSC_ERR_INVALID, "--save-dtype \"%s\": expected fp32 or bf16",
                         o->save_dtype);
    int rc2 = check_writable("--save", o->save);
    if (!rc2) rc2 = check_writable("--save-init", o->save_init);
    if (!rc2) rc2 = check_writable("--save-dir", o->save_dir);
    if (!rc2) rc2 = check_writable("--metrics", o->metrics);
    if (!rc2) rc2 = check_writable("--metrics-csv", o->metrics_csv);
    if (!rc2) rc2 = check_writable("--profile", o->profile);
    return rc2;
}
