/* The flags of fsc-train and fsc-bench: defaults, and the table with each
 * flag's help (parsed by the tools' one parser, tool_flags.c), read and
 * written by name. Their checks are train_options_check.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool_flags.h"
#include "train_common.h"

void train_options_default(train_options *o) {
    memset(o, 0, sizeof *o);
    o->strategy = "single";
    o->model = (fsc_gpt_config){.vocab = 256, .seq = 128, .layers = 4, .d_model = 256, .heads = 4};
    o->data = "builtin";
    o->data_format = "auto";
    o->batch = 8;
    o->grad_accum = 1;
    o->steps = 200;
    o->lr = 1e-3;
    o->min_lr_ratio = 0.1;
    o->warmup = 20;
    o->schedule = "cosine";
    o->optimizer = "adamw";
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->clip = 1.0;
    o->seed = 1337;
    o->threads = 1;
    o->bucket_mb = 25;
    o->partition = "even";
    o->share_dtype = "f32";
    o->reshard_after_forward = 1;
    o->mixed_precision = "fp32";
    o->attention = "auto";
    o->log_every = 10;
    o->log_seconds = 10;
    o->progress = "auto";
    o->val_fraction = 0.1;
    o->eval_batches = 4;
    o->pp = 1;
    o->tp = 1;
    o->cp = 1;
    o->pipe_schedule = "1f1b";
    o->pipe_checkpoint = "never";
    o->arch = "gpt2";
    o->moe_every = 2;
    o->moe_capacity = 2.0;
    o->moe_aux_coef = 0.01;
}

typedef tool_flag flag;

#define F(name_, kind_, field, help_)                                                              \
    { .name = name_, .kind = kind_, .offset = offsetof(train_options, field), .help = help_ }
static const flag flags[] = {
    F("strategy", ARG_STR, strategy,
      "how to spread training (the list follows; default single, ddp under a launcher with "
      "more than one rank)"),
    F("layers", ARG_INT, model.layers, "transformer blocks (L)"),
    F("d-model", ARG_INT, model.d_model, "model width (C)"),
    F("heads", ARG_INT, model.heads, "attention heads (must divide --d-model)"),
    F("seq", ARG_INT, model.seq, "sequence length (T)"),
    F("vocab", ARG_INT, model.vocab, "vocabulary size (256 for bytes; 50257 for GPT-2 shards)"),
    F("dropout", ARG_FLOAT, model.dropout, "embedding and residual dropout"),
    F("arch", ARG_STR, arch,
      "gpt2 | llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases)"),
    F("kv-heads", ARG_INT, model.kv_heads, "llama: key/value heads, dividing --heads (0: --heads)"),
    F("ffn-hidden", ARG_INT, model.ffn_hidden,
      "llama: SwiGLU width (0: 2/3 of 4 x --d-model rounded up to a multiple of 256)"),
    F("rope-theta", ARG_FLOAT, model.rope_theta, "llama: rotary base (0: 10000)"),
    F("norm-eps", ARG_FLOAT, model.norm_eps, "llama: RMSNorm epsilon (0: 1e-5)"),
    F("tie-embeddings", ARG_INT, tie_embeddings, "llama: 1 ties lm_head to embed_tokens"),
    F("qkv-bias", ARG_INT, qkv_bias, "llama: 1 gives q_proj, k_proj, v_proj biases (Qwen 2)"),
    F("data", ARG_STR, data,
      "builtin[:SEED[:BYTES]] | shard.bin[,more.bin] | 'dir/*.bin' | text file (bytes)"),
    F("data-format", ARG_STR, data_format,
      "auto (.bin: llm.c shard, version 1 or 7; other files: bytes) | llmc | nanogpt (raw "
      "uint16 .bin, no header); for --data and --val-data"),
    F("batch", ARG_INT, batch, "sequences per micro-batch per rank"),
    F("grad-accum", ARG_INT, grad_accum, "micro-batches per optimizer step"),
    F("steps", ARG_I64, steps, "optimizer steps"),
    F("lr", ARG_DOUBLE, lr, "peak learning rate"),
    F("min-lr-ratio", ARG_DOUBLE, min_lr_ratio, "cosine floor as a fraction of --lr"),
    F("warmup", ARG_I64, warmup, "linear warm-up steps"),
    F("schedule", ARG_STR, schedule, "cosine | constant | warmup-constant"),
    F("optimizer", ARG_STR, optimizer, "adamw | adam | sgd"),
    F("weight-decay", ARG_DOUBLE, weight_decay, "weight decay (AdamW: on >= 2-dim params)"),
    F("beta1", ARG_DOUBLE, beta1, "Adam beta1"),
    F("beta2", ARG_DOUBLE, beta2, "Adam beta2"),
    F("eps", ARG_DOUBLE, eps, "Adam epsilon"),
    F("momentum", ARG_DOUBLE, momentum, "SGD momentum"),
    F("clip", ARG_DOUBLE, clip, "global grad-norm clip (0 = off)"),
    F("seed", ARG_U64, seed, "seed for initial weights and dropout"),
    F("threads", ARG_INT, threads, "BLAS and OpenMP threads; with --strategy dp, worker threads"),
    F("bucket-mb", ARG_DOUBLE, bucket_mb,
      "DDP gradient bucket size in MB; sdp: the other ranks' gradient memory held at once"),
    F("partition", ARG_STR, partition, "oss: even (flat, balanced) | greedy (whole tensors)"),
    F("share-dtype", ARG_STR, share_dtype, "oss: dtype updated parameters travel in: f32|bf16|f16"),
    F("min-params", ARG_I64, min_params,
      "fsdp: auto-wrap every module reaching N parameters (0: one unit per block)"),
    F("reshard-after-forward", ARG_INT, reshard_after_forward,
      "fsdp: 1 frees a unit's parameters after forward (gathers again in backward), 0 keeps them"),
    F("mixed-precision", ARG_STR, mixed_precision,
      "fp32 | bf16 (autocast, under every strategy) | fp16 (fsdp: parameters gathered and "
      "rounded, with loss scaling)"),
    F("attention", ARG_STR, attention,
      "auto | naive | flash: the attention kernel (flash keeps per-row statistics instead of "
      "the T x T probabilities; auto: flash from T = 512)"),
    F("reduce-dtype", ARG_STR, reduce_dtype,
      "fsdp, sdp: f32 | bf16 | f16 gradient reduction (fsdp default: the compute dtype)"),
    F("shard-group", ARG_INT, shard_group,
      "hsdp: ranks per shard group (FSDP within each group of N consecutive ranks, the groups "
      "replicas of each other; N divides the ranks)"),
    F("accum-no-sync", ARG_FLAG, accum_no_sync,
      "fsdp: with --grad-accum, keep full gradients and reduce once (more memory, less traffic)"),
    F("checkpoint-activations", ARG_FLAG, checkpoint_activations,
      "recompute each block's activations in backward (less memory, ~1/3 more compute)"),
    F("pp", ARG_INT, pp,
      "pipeline stages: ranks / pp data-parallel replicas of pp consecutive ranks (with ddp, "
      "oss, sdp or fsdp between them); "
      "--grad-accum M is the pipeline's micro-batch count"),
    F("pipe-schedule", ARG_STR, pipe_schedule,
      "with --pp: gpipe | 1f1b | interleaved | zbh1 (alias zb1, "
      "as older configs and checkpoints say)"),
    F("tp", ARG_INT, tp,
      "tensor-parallel ranks per model replica (adjacent ranks; Megatron's layers): ranks / tp "
      "data-parallel replicas under ddp, oss, sdp or fsdp; with --pp each stage over tp ranks, "
      "ranks / (tp x pp) replicas under ddp, oss, sdp or fsdp"),
    F("cp", ARG_INT, cp,
      "context-parallel ranks per model replica (ring attention): each holds 2 of 2 x cp chunks "
      "of every sequence (--seq must divide by 2 x cp); ranks / (cp x tp x pp) replicas under "
      "ddp, oss, sdp or fsdp, gradients summed over replicas x cp; with --tp and --pp, not with "
      "MoE or --sequence-parallel"),
    F("sequence-parallel", ARG_FLAG, sequence_parallel,
      "with --tp: LayerNorm, dropout and residuals on sequence shards (less activation memory)"),
    F("recompute-attention", ARG_FLAG, recompute_attention,
      "with --tp: attention keeps q, k, v only and recomputes its softmax probabilities in "
      "backward (selective recomputation: B x heads/tp x T x T floats less per layer)"),
    F("recompute-activation", ARG_FLAG, recompute_activation,
      "with --tp: the MLP keeps GELU's input only and recomputes its output in backward (4 x "
      "d_model/tp floats less per token per layer)"),
    F("adascale", ARG_FLAG, adascale,
      "AdaScale (ddp, oss, sdp, fsdp, single; with --tp/--pp: ddp, oss, sdp, not zbh1): the "
      "lr times the gain measured from the replicas' and micro-batches' gradients; --steps "
      "then counts scale-invariant steps"),
    F("localsgd-frequency", ARG_INT, localsgd_frequency,
      "slowmo: average the parameters every N local steps (default 3)"),
    F("slowmo-frequency", ARG_INT, slowmo_frequency,
      "slowmo: the slow-momentum update every N steps, a multiple of --localsgd-frequency "
      "(default 48)"),
    F("slowmo-momentum", ARG_DOUBLE, slowmo_momentum,
      "slowmo: slow momentum in [0, 1) (default 0)"),
    F("slowmo-lr", ARG_DOUBLE, slowmo_lr, "slowmo: slow learning rate > 0 (default 1)"),
    F("moe-experts", ARG_INT, moe_experts,
      "Mixture of Experts: E experts per MoE MLP, top-2 gating (0: dense; ddp spreads them "
      "over the ranks)"),
    F("moe-every", ARG_INT, moe_every, "with --moe-experts: an MoE MLP every N blocks (default 2)"),
    F("moe-capacity", ARG_DOUBLE, moe_capacity,
      "with --moe-experts: capacity factor, tokens per expert = F x T / E (default 2)"),
    F("moe-aux-coef", ARG_DOUBLE, moe_aux_coef,
      "with --moe-experts: weight of the load-balancing loss (default 0.01)"),
    F("moe-hidden", ARG_INT, moe_hidden,
      "with --moe-experts: expert MLP width (0: 4 x --d-model; --arch llama: --ffn-hidden)"),
    F("virtual", ARG_INT, virtual_stages, "with --pipe-schedule interleaved: stages per rank"),
    F("balance", ARG_STR, balance,
      "with --pp: layers per stage, e.g. 3,6 (the GPT has L + 2 layers: embedding, blocks, "
      "head; a block splits at .5, after its attention half, e.g. 5.5,4.5, and at .75, after "
      "its MLP's c_fc and GELU, e.g. 5.75,4.25), or auto (each part of each block timed, the "
      "slowest stage made fastest within FSC_MEM_LIMIT_MB); default even"),
    F("pipe-checkpoint", ARG_STR, pipe_checkpoint,
      "with --pp: recompute the stages' activations in backward for every micro-batch "
      "(always), every one but the last (except_last), or none (never; "
      "--checkpoint-activations means always)"),
    F("trace", ARG_STR, trace,
      "with --pp: write the last step's actions, per rank, as a Chrome trace (Perfetto)"),
    F("profile", ARG_STR, profile,
      "write every rank's spans (steps, modules, GEMMs, collectives, ...) as one Chrome trace "
      "and print where the steps' time went (docs/performance.md)"),
    F("print-schedule", ARG_FLAG, print_schedule,
      "with --pp: print the schedule's grid, one row per rank, and its bubble"),
    F("save-every", ARG_I64, save_every,
      "write a checkpoint every N steps (needs --checkpoint-dir)"),
    F("async-save", ARG_FLAG, async_save,
      "write checkpoints in the background while training goes on (docs/checkpoints.md)"),
    F("checkpoint-dir", ARG_STR, checkpoint_dir, "directory of checkpoints (step-N/, latest)"),
    F("resume", ARG_STR, resume, "resume from this checkpoint directory's latest checkpoint"),
    F("save-sharded", ARG_STR, save_sharded,
      "fsdp: at the end, each rank writes its shard file into this directory"),
    F("init-from", ARG_STR, init_from,
      "start from these weights (safetensors; llama: a Hugging Face directory, config.json "
      "and model.safetensors or shards with model.safetensors.index.json)"),
    F("lora-rank", ARG_INT, lora_rank,
      "fine-tuning with LoRA adapters of this rank on --lora-targets (every other parameter "
      "frozen, as PEFT does); 0: none"),
    F("lora-alpha", ARG_DOUBLE, lora_alpha, "with --lora-rank: scale = alpha / rank (0: rank)"),
    F("lora-dropout", ARG_DOUBLE, lora_dropout,
      "with --lora-rank: dropout on the adapters' input (default 0)"),
    F("lora-targets", ARG_STR, lora_targets,
      "with --lora-rank: comma-separated Linear names to adapt (default q_proj,v_proj; GPT-2: "
      "c_attn,c_proj,c_fc)"),
    F("save-adapter", ARG_STR, save_adapter,
      "with --lora-rank: write the adapters at the end as a Hugging Face PEFT directory "
      "(adapter_model.safetensors, adapter_config.json)"),
    F("lora-from", ARG_STR, lora_from,
      "with --lora-rank: start the adapters from this PEFT directory (after --init-from's "
      "base); its r, lora_alpha, target_modules and tensors must match"),
    F("lora-merge", ARG_FLAG, lora_merge,
      "with --lora-rank: --save (and --save-init) write the base weights with B A alpha/r "
      "merged in and no adapters"),
    F("param-group", ARG_STR, param_group,
      "optimizer parameter groups as torch's param_groups, 'PATTERN:lr=X,wd=Y' (either "
      "setting may be left out), several separated by ';', the first whose glob matches a "
      "parameter wins; the schedule scales each group's lr; unmatched parameters keep --lr "
      "and --weight-decay"),
    F("freeze", ARG_STR, freeze,
      "fine-tuning: freeze the parameters whose names match these comma-separated globs "
      "(e.g. 'model.embed_tokens.*,model.layers.*.mlp.*'): no gradient, no optimizer state, "
      "no update; a glob that matches nothing is an error"),
    F("save-init", ARG_STR, save_init, "save the weights before step 1"),
    F("save", ARG_STR, save,
      "save the weights at the end (llama: a PATH not ending in .safetensors is a Hugging "
      "Face directory, as for --save-init)"),
    F("save-dir", ARG_STR, save_dir,
      "at the end, a directory Hugging Face's from_pretrained reads: model.safetensors, "
      "config.json and the tokenizer's files (from --tokenizer or --init-from's directory)"),
    F("shard-size", ARG_STR, shard_size,
      "llama --save/--save-init DIR: safetensors shards of at most this size (2GB, 500MiB, "
      "bytes; default 2GB)"),
    F("save-dtype", ARG_STR, save_dtype,
      "llama --save/--save-init DIR: the tensors' dtype, fp32 (default) or bf16 (rounded to "
      "nearest even as torch rounds; config.json's torch_dtype says which)"),
    F("metrics", ARG_STR, metrics, "write one JSON object per step to this file"),
    F("metrics-csv", ARG_STR, metrics_csv,
      "also write the metrics as CSV to this file (a header, then a row per step)"),
    F("log-every", ARG_INT, log_every, "progress lines every N steps when not on a terminal"),
    F("log-seconds", ARG_DOUBLE, log_seconds,
      "not on a terminal (under mpirun): a progress line at least every N seconds too (0: off)"),
    F("progress", ARG_STR, progress,
      "auto: a live line on a terminal (stderr's, or under mpirun rank 0's controlling "
      "terminal), else plain lines; plain: lines on stderr every --log-every steps / "
      "--log-seconds"),
    F("config", ARG_STR, config,
      "JSON object of flags ({\"layers\": 6, \"lr\": 3e-4, ...}); command-line flags override"),
    F("allow-change", ARG_FLAG, allow_change,
      "let --resume change the global batch or the learning-rate schedule"),
    F("keep-last", ARG_INT, keep_last, "keep only the last N checkpoints (0: all)"),
    F("keep-best", ARG_INT, keep_best,
      "also keep the N checkpoints of lowest val loss; saves one after each evaluation"),
    F("val-data", ARG_STR, val_data,
      "held-out data, as --data (default: the *_val.bin shards beside --data's, which "
      "training then skips; else the tail given by --val-fraction)"),
    F("val-fraction", ARG_DOUBLE, val_fraction,
      "without val shards or --val-data: hold out this tail fraction of --data (fsc-train)"),
    F("eval-every", ARG_I64, eval_every, "validation loss every N steps and at the end (0: never)"),
    F("eval-batches", ARG_INT, eval_batches,
      "global batches (batch x grad-accum x ranks sequences) per validation"),
    F("tokenizer", ARG_STR, tokenizer,
      "a tokenizer.json file, or a directory with tokenizer.json or GPT-2's encoder.json + "
      "vocab.bpe (scripts/fetch_tokenizers.sh, scripts/fetch_gpt2_bpe.sh): a text --data is "
      "encoded with it (--vocab defaults to its size)"),
    F("quiet", ARG_FLAG, quiet, "no progress output"),
};
#undef F

static void flag_note(int i, char *buf, size_t n) {
    train_flag_range_text(flags[i].name, buf, n);
}

static void strategy_list(void) {
    printf("strategies (--strategy):\n");
    for (const char *const *n = fsc_strategy_names(); *n; n++) {
        fsc_strategy_info info;
        fsc_strategy_info_get(*n, &info);
        printf("  %-16s %s\n", *n, info.summary);
    }
}

int train_options_parse(train_options *o, int argc, char **argv, const char *prog,
                        const char *extra) {
    char usage[4096];
    snprintf(usage, sizeof usage, "usage: %s [flags]\n%s", prog, extra ? extra : "");
    const tool_cli cli = {.prog = prog,
                          .usage = usage,
                          .flags = flags,
                          .nflags = (int)(sizeof flags / sizeof *flags),
                          .flag_note = flag_note,
                          .help_tail = strategy_list};
    int rc = tool_flags_parse(&cli, o, o->given, argc, argv, NULL);
    if (rc) return rc;
    return o->config ? train_config_load(o, o->config) : FSC_OK;
}

_Static_assert(sizeof flags / sizeof *flags <= sizeof((train_options *)0)->given,
               "train_options.given has a slot per flag");

const char *train_flag_name(int i) {
    return i >= 0 && (size_t)i < sizeof flags / sizeof *flags ? flags[i].name : NULL;
}

void train_flag_json(const train_options *o, int i, char *buf, size_t n) {
    const flag *f = &flags[i];
    const void *v = (const char *)o + f->offset;
    switch (f->kind) {
    case ARG_INT:
        snprintf(buf, n, "%d", *(const int *)v);
        break;
    case ARG_I64:
        snprintf(buf, n, "%lld", (long long)*(const int64_t *)v);
        break;
    case ARG_U64: /* beyond 2^53 a JSON number loses digits: a string then */
        snprintf(buf, n, *(const uint64_t *)v >> 53 ? "\"%llu\"" : "%llu",
                 (unsigned long long)*(const uint64_t *)v);
        break;
    case ARG_DOUBLE: /* the shortest text that reads back as the same double (0.003, not
                      * %.17g's 0.0030000000000000001) */
        for (int digits = 6; digits <= 17; digits++) {
            snprintf(buf, n, "%.*g", digits, *(const double *)v);
            if (strtod(buf, NULL) == *(const double *)v) break;
        }
        break;
    case ARG_FLOAT: /* the shortest text that reads back as the same float */
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(buf, n, "%.*g", digits, (double)*(const float *)v);
            if (strtof(buf, NULL) == *(const float *)v) break;
        }
        break;
    case ARG_FLAG:
        snprintf(buf, n, "%s", *(const bool *)v ? "true" : "false");
        break;
    case ARG_STR: {
        const char *str = *(const char *const *)v;
        if (!str) {
            snprintf(buf, n, "null");
            break;
        }
        size_t k = 0;
        if (k + 1 < n) buf[k++] = '"';
        for (; *str && k + 3 < n; str++) { /* paths and names: escape quotes, backslashes */
            if (*str == '"' || *str == '\\') buf[k++] = '\\';
            buf[k++] = (unsigned char)*str < 0x20 ? ' ' : *str;
        }
        if (k + 1 < n) buf[k++] = '"';
        buf[k < n ? k : n - 1] = '\0';
        break;
    }
    }
}

int train_flag_set(train_options *o, const char *name, const char *value, int source) {
    char canon[64];
    snprintf(canon, sizeof canon, "%s", name);
    for (char *c = canon; *c; c++)
        if (*c == '_') *c = '-';
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
        if (strcmp(flags[k].name, canon)) continue;
        int rc = tool_flag_set_value(&flags[k], value, o);
        if (rc) return rc;
        if (source) o->given[k] = (unsigned char)source;
        return (int)k;
    }
    return fsc_error(FSC_ERR_INVALID, "unknown flag \"%s\"", name); /* callers add "see --help" */
}

bool train_flag_given(const train_options *o, const char *name) {
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (!strcmp(flags[i].name, name)) return o->given[i] != 0;
    return false;
}

const tool_flag *train_flag_at(int i) {
    return i >= 0 && (size_t)i < sizeof flags / sizeof *flags ? &flags[i] : NULL;
}
