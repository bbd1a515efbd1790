/* fsc-sample: text from a trained GPT.
 *
 * Reads a weights file (fsc-train --save, a Hugging Face GPT-2
 * model.safetensors) or a checkpoint directory (--checkpoint-dir), takes
 * the model's shape from the file (fsc's metadata, else the tensors'
 * shapes), and generates with a key/value cache (fsc/gpt.h), or with a
 * whole forward per token under --no-kv-cache, which draws the same tokens
 * for the same seed. A Mixture-of-Experts model samples with no expert
 * capacity limit in both paths (see moe_from_file). Text goes to stdout as
 * it is made; the speed to stderr. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/checkpoint.h"
#include "fsc/gpt.h"
#include "fsc/moe.h"
#include "fsc/tokenizer.h"
#include "fsc/version.h"
#include "fsc/weights.h"
#include "tool_flags.h"

typedef struct {
    const char *model, *prompt, *prompt_ids, *tokenizer, *logits;
    int max_new, top_k, heads, threads;
    double temperature;
    uint64_t seed;
    bool no_cache, print_ids, quiet;
} sample_options;

#define F(name_, kind_, field, meta_, help_)                                                       \
    {                                                                                              \
        .name = name_, .kind = kind_, .offset = offsetof(sample_options, field), .meta = meta_,    \
        .help = help_                                                                              \
    }
static const tool_flag FLAGS[] = {
    F("model", ARG_STR, model, "PATH", "weights file or checkpoint directory (required)"),
    F("prompt", ARG_STR, prompt, "TEXT",
      "text to continue (default: <|endoftext|>, else the tokenizer's BOS, else a newline)"),
    F("prompt-ids", ARG_STR, prompt_ids, "1,2,3",
      "token ids to continue (models without a tokenizer)"),
    F("tokenizer", ARG_STR, tokenizer, "DIR|FILE",
      "a tokenizer.json file, or a directory with tokenizer.json, GPT-2's encoder.json + "
      "vocab.bpe, or vocab.json + merges.txt (default: one beside the model); without it a "
      "256-token model reads and writes bytes, others ids"),
    F("max-new-tokens", ARG_INT, max_new, "N", "tokens to generate (default 200) [0, 2^30]"),
    F("temperature", ARG_DOUBLE, temperature, "X",
      "softmax temperature; 0 is greedy (default 1.0)"),
    F("top-k", ARG_INT, top_k, "K", "sample among the K likeliest tokens; 0 for all (default 40)"),
    F("seed", ARG_U64, seed, "N", "seed of the draws (default 1337): same seed, same text"),
    F("heads", ARG_INT, heads, "N",
      "attention heads of a file without fsc metadata (default d_model/64) [1, 65536]"),
    F("threads", ARG_INT, threads, "N", "BLAS and OpenMP threads (default 1) [1, 1024]"),
    F("no-kv-cache", ARG_FLAG, no_cache, NULL,
      "a whole forward over the context per token (for comparison)"),
    F("ids", ARG_FLAG, print_ids, NULL, "print token ids, one per line, instead of text"),
    F("quiet", ARG_FLAG, quiet, NULL, "no speed report"),
    F("logits", ARG_STR, logits, "FILE",
      "also write the prompt's logits, one row per position, as safetensors (tensor "
      "\"logits\", F32 (n,V)) from one full forward: for comparing with another implementation"),
};
#undef F

/* 0, 1 for --help/--version (printed), -1 on a bad flag (printed). */
static int parse(int argc, char **argv, sample_options *o) {
    *o = (sample_options){
        .max_new = 200, .top_k = 40, .threads = 1, .temperature = 1.0, .seed = 1337};
    const tool_cli cli = {
        .prog = "fsc-sample",
        .usage = "usage: fsc-sample --model PATH [flags]\n"
                 "Generates text from a GPT: PATH is a weights file (fsc-train --save, or a "
                 "Hugging Face\nGPT-2 model.safetensors) or a checkpoint directory (its latest "
                 "checkpoint).",
        .flags = FLAGS,
        .nflags = (int)(sizeof FLAGS / sizeof *FLAGS)};
    unsigned char given[sizeof FLAGS / sizeof *FLAGS] = {0};
    int rc = tool_flags_parse(&cli, o, given, argc, argv, NULL);
    if (rc == TOOL_FLAGS_DONE) return 1;
    const char *why = NULL;
    if (rc)
        why = fsc_last_error();
    else if (o->max_new < 0 || o->max_new > 1 << 30)
        why = "--max-new-tokens: expected an integer in [0, 1073741824]";
    else if (o->top_k < 0 || o->top_k > 1 << 30)
        why = "--top-k: expected an integer in [0, 1073741824]";
    else if (o->heads < 0 || o->heads > 1 << 16 || (o->heads == 0 && given[8])) /* --heads */
        why = "--heads: expected an integer in [1, 65536]";
    else if (o->threads < 1 || o->threads > 1024)
        why = "--threads: expected an integer in [1, 1024]";
    else if (!(o->temperature >= 0))
        why = "--temperature: expected a number >= 0";
    else if (!o->model)
        why = "--model PATH is required";
    else if (o->prompt && o->prompt_ids)
        why = "give --prompt or --prompt-ids, not both";
    if (!why) return 0;
    fprintf(stderr, "fsc-sample: %s (see --help)\n", why);
    return -1;
}

/* ---- the model's shape and weights ----------------------------------------------------------- */

/* {"vocab_size": V, "n_positions": T, "n_layer": L, "n_embd": C, "n_head": H} */
static int config_from_json(const char *text, fsc_gpt_config *cfg) {
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    const char *keys[] = {"vocab_size", "n_positions", "n_layer", "n_embd", "n_head"};
    int *dst[] = {&cfg->vocab, &cfg->seq, &cfg->layers, &cfg->d_model, &cfg->heads};
    int ok = j != NULL;
    for (int i = 0; ok && i < 5; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
        ok = cJSON_IsNumber(v);
        if (ok) *dst[i] = v->valueint;
    }
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

/* Without fsc's metadata (a Hugging Face file): the shape from the tensors. */
static int config_from_tensors(const fsc_st_file *f, int heads, fsc_gpt_config *cfg) {
    const fsc_st_entry *wte = fsc_weights_find(f, "wte.weight"),
                       *wpe = fsc_weights_find(f, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
        return fsc_error(FSC_ERR_FORMAT, "no fsc metadata and no 2-dim wte.weight and wpe.weight "
                                         "tensors: not a GPT-2 weights file");
    cfg->vocab = (int)wte->shape[0], cfg->d_model = (int)wte->shape[1];
    cfg->seq = (int)wpe->shape[0];
    char name[64];
    for (cfg->layers = 0;; cfg->layers++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", cfg->layers);
        if (!fsc_weights_find(f, name)) break;
    }
    cfg->heads = heads ? heads : cfg->d_model % 64 == 0 ? cfg->d_model / 64 : 1;
    return FSC_OK;
}

/* A Mixture-of-Experts model (fsc-train --moe-experts): the experts, their
 * spacing and width from the first block with a gate. The capacity factor
 * is the number of experts, whatever training used: capacity T per
 * sequence, so no choice is dropped. Both paths must route alike to draw
 * the same ids: the KV cache drops nothing (a token step fits any
 * capacity; a prompt's prefill routes with capacity n), while a forward
 * over the whole context at training's capacity may drop a token's choice
 * (its place in an expert's queue even depends on later tokens); without
 * drops they agree, and the cache refuses a model that could drop. */
static fsc_moe_options sample_moe;

static void moe_from_file(const fsc_st_file *f, fsc_gpt_config *cfg) {
    char name[96];
    for (int l = 0; l < cfg->layers && l < fsc_st_count(f); l++) {
        snprintf(name, sizeof name, "h.%d.mlp.gate.weight", l);
        const fsc_st_entry *gate = fsc_weights_find(f, name);
        snprintf(name, sizeof name, "h.%d.mlp.experts.0.c_fc.weight", l);
        const fsc_st_entry *fc = fsc_weights_find(f, name);
        if (!gate || gate->ndim != 2 || !fc || fc->ndim != 2) continue;
        sample_moe = (fsc_moe_options){.experts = (int)gate->shape[0],
                                       .every = l + 1,
                                       .capacity_factor = (float)gate->shape[0],
                                       .hidden = (int)fc->shape[1]};
        cfg->moe = &sample_moe;
        return;
    }
}

/* A Mixtral config's MoE layers into cfg (sample_moe, dropless as above);
 * a dense LLaMA's leave it dense. */
static int moe_from_config(const char *text, const char *what, fsc_gpt_config *cfg) {
    int rc = fsc_hf_config_parse_moe(text, what, &sample_moe);
    if (rc || !sample_moe.experts) return rc;
    sample_moe.capacity_factor = (float)sample_moe.experts;
    cfg->moe = &sample_moe;
    return FSC_OK;
}

/* A LLaMA-family model's config (fsc_hf_config_parse) from text that says
 * model_type llama, mixtral or qwen2: 1 when it does (parsed, or *rc set),
 * 0 when it is another family's. */
static int llama_config(const char *text, const char *what, fsc_gpt_config *cfg, int *rc) {
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const int llama = cJSON_IsString(type) && (!strcmp(type->valuestring, "llama") ||
                                               !strcmp(type->valuestring, "mixtral") ||
                                               !strcmp(type->valuestring, "qwen2"));
    cJSON_Delete(j);
    if (llama) *rc = fsc_hf_config_parse(text, what, cfg);
    if (llama && !*rc) *rc = moe_from_config(text, what, cfg);
    return llama;
}

/* A Hugging Face model directory: config.json with model.safetensors or
 * the shards of model.safetensors.index.json (fsc_st_open reads either). */
static bool hf_dir(const char *dir) {
    struct stat st;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (stat(path, &st)) return false;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!stat(path, &st)) return true;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return !stat(path, &st);
}

/* Positions a LLaMA's cache holds at most: max_position_embeddings can be
 * 128K, whose cache would be gigabytes; past this the window slides. */
#define LLAMA_CONTEXT_MAX 4096

/* The weights file of PATH and the model's shape. *weights is malloc'ed. */
static int resolve(const sample_options *o, char **weights, fsc_gpt_config *cfg) {
    struct stat st;
    if (stat(o->model, &st))
        return fsc_error(FSC_ERR_IO, "--model %s: no such file or directory", o->model);
    const char *from_ckpt = NULL;
    fsc_ckpt *c = NULL;
    int rc = FSC_OK;
    if (S_ISDIR(st.st_mode) && hf_dir(o->model)) { /* its config.json says the shape */
        *weights = strdup(o->model);
        if ((rc = fsc_hf_config_read(o->model, cfg))) return rc;
        if (cfg->arch == FSC_ARCH_LLAMA) { /* and a Mixtral's experts */
            char path[4200], *text = NULL;
            snprintf(path, sizeof path, "%s/config.json", o->model);
            if (!(rc = fsc_file_read_all(path, 1 << 22, &text, NULL)))
                rc = moe_from_config(text, path, cfg);
            free(text);
            if (rc) return rc;
            goto checked;
        }
        *cfg = (fsc_gpt_config){0}; /* GPT-2: from the tensors, as a file of it */
    } else if (S_ISDIR(st.st_mode)) {
        if ((rc = fsc_ckpt_open(o->model, &c)))
            return fsc_error_context(rc, "--model %s: ", o->model);
        const char *p = fsc_ckpt_path(c, "model.safetensors");
        *weights = p ? strdup(p) : NULL;
        from_ckpt = fsc_ckpt_get(c, "model");
        if (!p)
            rc = fsc_error(FSC_ERR_FORMAT, "--model %s: the checkpoint has no model.safetensors",
                           o->model);
    } else {
        *weights = strdup(o->model);
    }
    fsc_st_file *f = rc ? NULL : fsc_st_open(*weights, &rc);
    if (!rc) {
        const char *meta = fsc_st_metadata(f, "fsc.gpt_config");
        if (!meta) meta = fsc_st_metadata(f, "fsc.model");
        if (!meta) meta = from_ckpt;
        char beside[4200], *text = NULL;
        const char *slash = strrchr(*weights, '/');
        snprintf(beside, sizeof beside, "%.*sconfig.json", slash ? (int)(slash - *weights + 1) : 0,
                 *weights);
        if (!meta && !stat(beside, &st) && !fsc_file_read_all(beside, 1 << 22, &text, NULL))
            meta = text; /* a Hugging Face LLaMA file with its config.json */
        if (!llama_config(meta, meta == text ? beside : *weights, cfg, &rc) &&
            (!meta || config_from_json(meta, cfg)))
            rc = config_from_tensors(f, o->heads, cfg);
        free(text);
        if (!rc && o->heads && cfg->arch != FSC_ARCH_LLAMA) cfg->heads = o->heads;
        if (!rc && cfg->arch != FSC_ARCH_LLAMA) moe_from_file(f, cfg);
    }
    fsc_st_close(f);
    fsc_ckpt_close(c);
    if (rc) return rc;
checked:
    if (cfg->arch == FSC_ARCH_LLAMA && o->heads && o->heads != cfg->heads)
        return fsc_error(FSC_ERR_INVALID, "--heads %d: the model's config says %d", o->heads,
                         cfg->heads);
    if (cfg->arch == FSC_ARCH_LLAMA && cfg->seq > LLAMA_CONTEXT_MAX) {
        if (!o->quiet)
            fprintf(stderr,
                    "fsc-sample: a window of %d positions (the model has %d; the window slides "
                    "past it)\n",
                    LLAMA_CONTEXT_MAX, cfg->seq);
        cfg->seq = LLAMA_CONTEXT_MAX;
    }
    if (!rc && (rc = fsc_gpt_config_check(cfg)))
        rc = fsc_error_context(rc, "the model's shape from %s: ", o->model);
    return rc;
}

/* ---- text in, text out ------------------------------------------------------------------------
 */

/* GPT-2's vocabulary: a model this wide reads BPE; bytes would be ids of
 * other tokens, and its ids printed bare are no text to read. */
#define GPT2_VOCAB 50257

/* DIR holding the model (the directory given, or the weights file's) when it
 * has a tokenizer fsc_bpe_load reads (tokenizer.json, GPT-2's encoder.json +
 * vocab.bpe, or vocab.json + merges.txt); false when it has none. */
static bool tokenizer_beside(const char *model, char *dir, size_t n) {
    struct stat st;
    const char *slash = strrchr(model, '/');
    if (!stat(model, &st) && S_ISDIR(st.st_mode))
        snprintf(dir, n, "%s", model);
    else if (slash)
        snprintf(dir, n, "%.*s", (int)(slash - model), model);
    else
        snprintf(dir, n, ".");
    static const char *const files[][2] = {{"tokenizer.json", "tokenizer.json"},
                                           {"encoder.json", "vocab.bpe"},
                                           {"vocab.json", "merges.txt"}};
    for (int i = 0; i < 3; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/%s", dir, files[i][0]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i][1]);
        if (!stat(a, &st) && !stat(b, &st)) return true;
    }
    return false;
}

static int needs_tokenizer(int V) {
    return fsc_error(FSC_ERR_INVALID,
                     "a %d-token model reads BPE and no tokenizer.json (or encoder.json and "
                     "vocab.bpe) is beside it: give --tokenizer DIR|FILE "
                     "(scripts/fetch_gpt2_bpe.sh fetches GPT-2's into ~/.cache/fsc/gpt2, "
                     "scripts/fetch_tokenizers.sh LLaMA-3's tokenizer.json), or --prompt-ids "
                     "with --ids for ids in and out",
                     V);
}

/* The prompt as ids (malloc'ed into *ids). */
static int encode_prompt(const sample_options *o, const fsc_bpe *bpe, int V, int32_t **ids,
                         int *n) {
    int64_t count = 0;
    *ids = NULL;
    if (o->prompt_ids) {
        *ids = malloc((strlen(o->prompt_ids) / 2 + 2) * sizeof **ids);
        for (const char *p = o->prompt_ids; *ids && *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= V || (*end && *end != ','))
                return fsc_error(FSC_ERR_INVALID,
                                 "--prompt-ids \"%s\": expected ids in [0, %d) "
                                 "separated by commas",
                                 o->prompt_ids, V);
            (*ids)[count++] = (int32_t)v;
            p = *end ? end + 1 : end;
        }
    } else if (o->prompt && *o->prompt && bpe) {
        int rc = fsc_bpe_encode(bpe, o->prompt, strlen(o->prompt), ids, &count);
        if (rc) return rc;
        const int32_t bos = fsc_bpe_bos(bpe); /* tokenizer.json's BOS leads, as in training */
        int32_t *with = bos >= 0 ? realloc(*ids, (size_t)(count + 1) * sizeof **ids) : NULL;
        if (bos >= 0 && !with) return fsc_error(FSC_ERR_NOMEM, "out of memory");
        if (with) {
            memmove(with + 1, with, (size_t)count * sizeof *with);
            with[0] = bos, *ids = with, count++;
        }
    } else if (!bpe && V >= GPT2_VOCAB && !(o->print_ids && !o->prompt)) {
        return needs_tokenizer(V);                    /* text or the default prompt: not as bytes */
    } else if (o->prompt && *o->prompt && V >= 256) { /* bytes */
        size_t len = strlen(o->prompt);
        *ids = malloc(len * sizeof **ids);
        for (size_t i = 0; *ids && i < len; i++) (*ids)[count++] = (unsigned char)o->prompt[i];
    } else if (o->prompt && *o->prompt) {
        return fsc_error(FSC_ERR_INVALID,
                         "--prompt needs --tokenizer for a %d-token model (or "
                         "give --prompt-ids)",
                         V);
    }
    if (!count) { /* nothing to continue: GPT-2's document separator, a BOS, or a newline */
        free(*ids);
        *ids = malloc(sizeof **ids);
        const int32_t eot = bpe ? fsc_bpe_eot(bpe) : -1, start = eot >= 0 ? eot
                                                                 : bpe    ? fsc_bpe_bos(bpe)
                                                                          : -1;
        if (*ids) (*ids)[count++] = start >= 0 ? start : V > 10 ? 10 : 0;
    }
    if (!*ids) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    *n = (int)count;
    return FSC_OK;
}

static void emit(const sample_options *o, const fsc_bpe *bpe, int V, int32_t id) {
    size_t len;
    const char *b = bpe ? fsc_bpe_token_bytes(bpe, id, &len) : NULL;
    if (o->print_ids)
        printf("%d\n", id);
    else if (b)
        fwrite(b, 1, len, stdout);
    else if (V <= 256)
        putchar(id);
    else
        printf("[%d]", id);
    fflush(stdout);
}

/* ---- generation -------------------------------------------------------------------------------
 */

typedef struct {
    fsc_module *gpt;
    fsc_gpt_config cfg;
    fsc_gpt_kv *kv; /* NULL under --no-kv-cache */
    fsc_arena *arena;
    int32_t *ctx; /* the tokens so far; the window is ctx[start, n) */
    int start, n;
    float *logits; /* (V): the next token's */
} generator;

/* Logits of the token after ctx[start, n) given ctx[start, n-fresh) are
 * already in the cache. */
static int next_logits(generator *g, int fresh) {
    const int V = g->cfg.vocab;
    if (g->kv) return fsc_gpt_kv_append(g->kv, g->ctx + g->n - fresh, fresh, g->logits, false);
    fsc_arena_reset(g->arena);
    fsc_ctx ctx = {.arena = g->arena, .training = false};
    fsc_tensor x = fsc_tensor_2d(g->ctx + g->start, FSC_DTYPE_I32, 1, g->n - g->start), y;
    void *saved;
    int rc = fsc_module_forward(g->gpt, &ctx, &x, &y, &saved);
    if (!rc)
        memcpy(g->logits, (float *)y.data + (size_t)(g->n - g->start - 1) * V, sizeof(float) * V);
    return rc;
}

/* NaN or inf logits (weights that diverged or were damaged) would sample
 * token 0 without a word: refused, naming the position. */
static int check_logits(const generator *g) {
    for (int v = 0; v < g->cfg.vocab; v++)
        if (!isfinite(g->logits[v]))
            return fsc_error(FSC_ERR_INVALID,
                             "the logits after position %d are not finite (logit %d is %g): the "
                             "model's weights hold NaN or inf values",
                             g->n, v, (double)g->logits[v]);
    return FSC_OK;
}

/* A full window: keep its last half and run it again (both paths alike, so
 * they stay token for token equal). Returns the tokens to (re)feed. */
static int slide(generator *g) {
    if (g->n - g->start <= g->cfg.seq) return 1;
    g->start = g->n - g->cfg.seq / 2;
    if (g->kv) fsc_gpt_kv_reset(g->kv);
    return g->n - g->start;
}

/* --logits: the prompt's logits (n,V) from one full forward over it. */
static int dump_logits(const generator *g, const int32_t *prompt, int n, const char *path) {
    if (n > g->cfg.seq)
        return fsc_error(FSC_ERR_INVALID,
                         "--logits: the prompt has %d tokens, the model %d positions", n,
                         g->cfg.seq);
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20);
    if (!arena) return FSC_ERR_NOMEM;
    fsc_ctx ctx = {.arena = arena, .training = false};
    fsc_tensor x = fsc_tensor_2d((void *)prompt, FSC_DTYPE_I32, 1, n), y;
    void *saved;
    int rc = fsc_module_forward(g->gpt, &ctx, &x, &y, &saved);
    if (!rc) {
        const char *names[] = {"logits"};
        const fsc_tensor out = fsc_tensor_2d(y.data, FSC_DTYPE_F32, n, g->cfg.vocab);
        rc = fsc_st_save(path, 1, names, &out, NULL);
    }
    fsc_arena_free(arena);
    return rc ? fsc_error_context(rc, "--logits %s: ", path) : FSC_OK;
}

int main(int argc, char **argv) {
    sample_options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    fsc_set_num_threads(o.threads);
    if (fsc_blas_init(o.threads)) return fprintf(stderr, "fsc-sample: %s\n", fsc_last_error()), 1;
    char *weights = NULL;
    generator g = {0};
    fsc_params ps = {0};
    fsc_bpe *bpe = NULL;
    int32_t *prompt = NULL;
    int np = 0, unused = 0;
    float *work = NULL;
    if ((rc = resolve(&o, &weights, &g.cfg))) goto done;
    char beside[4096];
    struct stat model_st; /* a directory ships its tokenizer on purpose, whatever its size */
    const bool model_dir = !stat(o.model, &model_st) && S_ISDIR(model_st.st_mode);
    if (!o.tokenizer && (g.cfg.vocab >= GPT2_VOCAB || model_dir) &&
        tokenizer_beside(o.model, beside, sizeof beside)) {
        o.tokenizer = beside; /* a Hugging Face directory ships them */
        if (!o.quiet) fprintf(stderr, "fsc-sample: --tokenizer %s (beside the model)\n", beside);
    }
    if (o.tokenizer && (rc = fsc_bpe_load(o.tokenizer, &bpe))) goto done;
    if (bpe && fsc_bpe_vocab_size(bpe) > g.cfg.vocab) {
        rc = fsc_error(FSC_ERR_INVALID, "--tokenizer has %d tokens, the model %d",
                       fsc_bpe_vocab_size(bpe), g.cfg.vocab);
        goto done;
    }
    if (!(g.gpt = fsc_gpt_new(&g.cfg))) {
        rc = FSC_ERR_INVALID;
        goto done;
    }
    if ((rc = fsc_params_bind(g.gpt, 0, false, &ps))) goto done;
    if ((rc = fsc_weights_load(weights, &ps, &unused))) goto done;
    if ((rc = encode_prompt(&o, bpe, g.cfg.vocab, &prompt, &np))) goto done;
    if (o.logits && (rc = dump_logits(&g, prompt, np, o.logits))) goto done;
    const int V = g.cfg.vocab;
    g.ctx = malloc(((size_t)np + (size_t)o.max_new) * sizeof *g.ctx);
    g.logits = malloc((size_t)V * sizeof *g.logits);
    work = malloc((size_t)V * sizeof *work);
    if (!g.ctx || !g.logits || !work) {
        rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (o.no_cache ? !(g.arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20))
                   : !(g.kv = fsc_gpt_kv_new(g.gpt, &g.cfg))) {
        rc = FSC_ERR_NOMEM;
        goto done;
    }
    memcpy(g.ctx, prompt, (size_t)np * sizeof *prompt);
    g.n = np;
    g.start = np > g.cfg.seq ? np - g.cfg.seq : 0;
    if (!o.quiet)
        fprintf(stderr, "fsc-sample: %s L%d C%d H%d T%d V%d from %s%s; %d prompt tokens, %s\n",
                g.cfg.arch == FSC_ARCH_LLAMA ? "LLaMA" : "GPT", g.cfg.layers, g.cfg.d_model,
                g.cfg.heads, g.cfg.seq, V, weights, unused ? " (some tensors unused)" : "", np,
                o.no_cache ? "a full forward per token" : "KV cache");
    if (!o.quiet && g.cfg.moe)
        fprintf(stderr,
                "fsc-sample: Mixture of Experts: %d experts in %d of %d blocks, no capacity "
                "limit (every token reaches its two experts, with or without the KV cache)\n",
                g.cfg.moe->experts, g.cfg.layers / g.cfg.moe->every, g.cfg.layers);
    if (!o.print_ids && o.prompt) fputs(o.prompt, stdout);
    double t0 = fsc_now();
    rc = next_logits(&g, g.n - g.start); /* the prompt: one prefill */
    double t1 = fsc_now();
    for (int i = 0; !rc && i < o.max_new; i++) {
        if ((rc = check_logits(&g))) break;
        int32_t id = fsc_gpt_sample(g.logits, V, (float)o.temperature, o.top_k, o.seed, i, work);
        g.ctx[g.n++] = id;
        emit(&o, bpe, V, id);
        if (i + 1 < o.max_new) rc = next_logits(&g, slide(&g));
    }
    double t2 = fsc_now();
    if (!o.print_ids) putchar('\n');
    if (!rc && !o.quiet)
        fprintf(stderr,
                "fsc-sample: prompt %d tokens in %.3f s; %d new tokens in %.3f s: %.1f tokens/s "
                "(%s, %d thread%s)\n",
                np, t1 - t0, o.max_new, t2 - t1, o.max_new > 0 ? o.max_new / (t2 - t1) : 0,
                o.no_cache ? "no KV cache" : "KV cache", o.threads, o.threads > 1 ? "s" : "");
done:
    if (rc) fprintf(stderr, "fsc-sample: %s\n", fsc_last_error());
    fsc_gpt_kv_free(g.kv);
    fsc_arena_free(g.arena);
    fsc_params_free(&ps);
    fsc_module_free(g.gpt);
    fsc_bpe_free(bpe);
    free(weights), free(prompt), free(g.ctx), free(g.logits), free(work);
    return rc ? 1 : 0;
}
