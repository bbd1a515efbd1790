/* fsc-train's configuration as data: --config FILE.json holds any flags, a
 * checkpoint stores the effective flags, and --resume / --init-from take
 * the model (and, for --resume, the run) from them, so nothing is typed
 * twice. One rule decides every value: the command line, then --config, then
 * the checkpoint or weights file, then the default. A resume that would
 * quietly change the run (another model, global batch or learning-rate
 * schedule) is refused with the flag named, unless --allow-change. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/checkpoint.h"
#include "fsc/weights.h"
#include "train_common.h"

/* String values (from JSON) live until train_config_free. */
static char **kept;
static int nkept, capkept;

static const char *keep(const char *s) {
    if (nkept == capkept) {
        int nc = capkept ? 2 * capkept : 32;
        char **k = realloc(kept, (size_t)nc * sizeof *k);
        if (!k) return NULL;
        kept = k, capkept = nc;
    }
    return (kept[nkept] = strdup(s)) ? kept[nkept++] : NULL;
}

void train_config_free(void) {
    for (int i = 0; i < nkept; i++) free(kept[i]);
    free(kept);
    kept = NULL, nkept = capkept = 0;
}

static int flag_index(const char *name) {
    char canon[64];
    snprintf(canon, sizeof canon, "%s", name);
    for (char *c = canon; *c; c++)
        if (*c == '_') *c = '-';
    for (int i = 0; train_flag_name(i); i++)
        if (!strcmp(train_flag_name(i), canon)) return i;
    return -1;
}

/* Edit distance of a and b (lengths under 64), for a misspelt key's suggestion. */
static int distance(const char *a, const char *b) {
    int row[64], la = (int)strlen(a), lb = (int)strlen(b);
    if (la >= 64 || lb >= 64) return 64;
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            const int up = row[j], cost = a[i - 1] != b[j - 1];
            const int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = diag + cost < best ? diag + cost : best;
            diag = up;
        }
    }
    return row[lb];
}

/* The flag a --config key most likely meant, as " (did you mean \"layers\"?)",
 * or "" when none is close: the one flag it begins (as the command line's
 * --lay), else the nearest within a third of its length. */
static void suggestion(const char *key, char *out, size_t n) {
    char canon[64];
    snprintf(canon, sizeof canon, "%s", key);
    for (char *c = canon; *c; c++)
        if (*c == '_') *c = '-';
    const char *best = NULL;
    int best_d = (int)strlen(canon) / 3 + 1, prefixed = 0;
    for (int i = 0; train_flag_name(i); i++)
        if (*canon && !strncmp(train_flag_name(i), canon, strlen(canon)))
            best = prefixed++ ? NULL : train_flag_name(i);
    for (int i = 0; !prefixed && train_flag_name(i); i++) {
        const int d = distance(canon, train_flag_name(i));
        if (d < best_d) best_d = d, best = train_flag_name(i);
    }
    if (best && strcmp(best, "config"))
        snprintf(out, n, " (did you mean \"%s\"?)", best);
    else
        out[0] = '\0';
}

/* Flags of one invocation: never stored, never taken from a checkpoint. The
 * outputs (--checkpoint-dir, --save-every, --keep-last, --metrics, --metrics-csv, --save,
 * --save-sharded) are stored: a resume keeps saving where the run saved. */
static bool per_run(const char *name) {
    static const char *const names[] = {"config",    "resume",       "init-from",
                                        "save-init", "trace",        "print-schedule",
                                        "quiet",     "allow-change", "progress",
                                        "profile",   "async-save"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i])) return true;
    return false;
}

static bool is_model_flag(const char *name) {
    return !strcmp(name, "layers") || !strcmp(name, "d-model") || !strcmp(name, "heads") ||
           !strcmp(name, "seq") || !strcmp(name, "vocab") || !strcmp(name, "moe-experts") ||
           !strcmp(name, "moe-every") || !strcmp(name, "moe-hidden");
}

/* A JSON member's value as flag text (kept), or NULL for null. */
static int member_text(const cJSON *item, const char **out) {
    *out = NULL;
    if (cJSON_IsNull(item)) return FSC_OK;
    if (cJSON_IsString(item)) {
        *out = keep(item->valuestring);
    } else if (cJSON_IsNumber(item) && item->valuedouble > -9007199254740992.0 &&
               item->valuedouble < 9007199254740992.0 &&
               item->valuedouble == (double)(long long)item->valuedouble) {
        char digits[32]; /* cJSON would print 2e+15, which an integer flag refuses */
        snprintf(digits, sizeof digits, "%lld", (long long)item->valuedouble);
        *out = keep(digits);
    } else if (cJSON_IsNumber(item) || cJSON_IsBool(item)) {
        char *p = cJSON_PrintUnformatted(item);
        *out = p ? keep(p) : NULL;
        free(p);
    } else {
        return fsc_error(FSC_ERR_INVALID, "\"%s\": expected a string, number or boolean",
                         item->string);
    }
    return *out ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory");
}

/* A JSON file a run reads (--config, config.json): a regular file of at most
 * 64 MiB (a FIFO or /dev/zero is refused, never waited on or read forever). */
static int read_file(const char *path, char **out) {
    return fsc_file_read_all(path, (size_t)64 << 20, out, NULL);
}

/* config.json beside the weights, parsed into *out; none there is no error
 * (*out NULL), one that cannot be read is. */
static int read_beside(const char *path, cJSON **out) {
    struct stat sb;
    char *text = NULL;
    *out = NULL;
    if (stat(path, &sb) != 0) return FSC_OK;
    int rc = read_file(path, &text);
    if (!rc) *out = cJSON_Parse(text);
    free(text);
    return rc;
}

int train_config_load(train_options *o, const char *path) {
    char *text;
    int rc = read_file(path, &text);
    if (rc) return fsc_error_context(rc, "--config: ");
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fsc_error(FSC_ERR_FORMAT,
                         "--config %s: not a JSON object of flags "
                         "({\"layers\": 6, \"lr\": 3e-4, ...})",
                         path);
    }
    for (const cJSON *m = j->child; m && !rc; m = m->next) {
        const int i = flag_index(m->string);
        const char *v;
        const cJSON *first = cJSON_GetObjectItemCaseSensitive(j, m->string);
        char hint[96];
        if (i < 0 || !strcmp(m->string, "config")) {
            suggestion(m->string, hint, sizeof hint);
            rc = fsc_error(FSC_ERR_INVALID, "\"%s\" is not a flag of this tool%s", m->string, hint);
        } else if (first != m) /* JSON leaves duplicates undefined; cJSON would keep both */
            rc = fsc_error(FSC_ERR_INVALID, "\"%s\" is given twice", m->string);
        else if (o->given[i] == 2) /* the command line wins */
            continue;
        else if (!(rc = member_text(m, &v)) && v)
            rc = train_flag_set(o, m->string, v, 1) < 0 ? FSC_ERR_INVALID : FSC_OK;
    }
    cJSON_Delete(j);
    return rc ? fsc_error_context(rc, "--config %s: ", path) : FSC_OK;
}

char *train_config_json(const train_options *o) {
    size_t cap = 4096, n = 0;
    char *s = malloc(cap), value[4200];
    if (!s) return NULL;
    n += (size_t)snprintf(s, cap, "{");
    for (int i = 0; train_flag_name(i); i++) {
        const char *name = train_flag_name(i);
        if (per_run(name)) continue;
        train_flag_json(o, i, value, sizeof value);
        if (!strcmp(value, "null")) continue;
        size_t need = strlen(name) + strlen(value) + 8;
        if (n + need + 2 > cap) {
            char *b = realloc(s, cap = 2 * cap + need);
            if (!b) {
                free(s);
                return NULL;
            }
            s = b;
        }
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\": %s", n > 1 ? ", " : "", name, value);
    }
    snprintf(s + n, cap - n, "}");
    return s;
}

/* Ranks that share the global batch (the data-parallel world). */
static int dp_world(const train_options *o) {
    fsc_strategy_info info;
    if (fsc_strategy_info_get(o->strategy, &info) || !info.spans_ranks) return 1;
    const int per = (o->pp > 1 ? o->pp : 1) * (o->tp > 1 ? o->tp : 1);
    return fsc_dist_size() / per > 0 ? fsc_dist_size() / per : 1;
}

/* The flags whose change alters the learning rates of the steps to come. */
static void schedule_changes(const train_options *was, const train_options *now, char *out,
                             size_t n) {
    const bool cosine = !strcmp(now->schedule, "cosine");
    const int64_t span_was = was->steps > was->warmup ? was->steps : was->warmup;
    const int64_t span_now = now->steps > now->warmup ? now->steps : now->warmup;
    size_t k = 0;
    out[0] = '\0';
#define CHANGED(cond, fmt, ...)                                                                    \
    if ((cond) && k < n) k += (size_t)snprintf(out + k, n - k, fmt, __VA_ARGS__)
    CHANGED(strcmp(was->schedule, now->schedule), " --schedule %s -> %s", was->schedule,
            now->schedule);
    CHANGED(was->lr != now->lr, " --lr %g -> %g", was->lr, now->lr);
    CHANGED(strcmp(now->schedule, "constant") && was->warmup != now->warmup,
            " --warmup %" PRId64 " -> %" PRId64, was->warmup, now->warmup);
    CHANGED(cosine && was->min_lr_ratio != now->min_lr_ratio, " --min-lr-ratio %g -> %g",
            was->min_lr_ratio, now->min_lr_ratio);
    CHANGED(cosine && span_was != span_now,
            " --steps %" PRId64 " -> %" PRId64 " (the cosine decays over another span)", was->steps,
            now->steps);
    const char *pg_was = was->param_group ? was->param_group : "",
               *pg_now = now->param_group ? now->param_group : ""; /* each group's lr */
    CHANGED(strcmp(pg_was, pg_now), " --param-group '%s' -> '%s'", pg_was, pg_now);
#undef CHANGED
}

/* Takes the checkpoint's flags into o; *notes lists what was taken. */
static int take_flags(train_options *o, const cJSON *j, train_options *was, char *notes, size_t n) {
    size_t k = 0;
    notes[0] = '\0';
    train_options_default(was);
    for (const cJSON *m = j->child; m; m = m->next) { /* the checkpoint's run, in full */
        const char *v;
        int i = flag_index(m->string), rc;
        if (i < 0 || per_run(train_flag_name(i))) continue; /* a flag this build lacks */
        if ((rc = member_text(m, &v))) return rc;
        if (v && train_flag_set(was, m->string, v, 0) < 0)
            return fsc_error_context(FSC_ERR_FORMAT, "its config: ");
    }
    for (int i = 0; train_flag_name(i); i++) {
        const char *name = train_flag_name(i);
        char a[4200], b[4200];
        if (per_run(name) || !cJSON_GetObjectItemCaseSensitive(j, name)) continue;
        train_flag_json(was, i, a, sizeof a);
        train_flag_json(o, i, b, sizeof b);
        if (!strcmp(a, b)) continue;
        if (!o->given[i]) { /* taken: the value was parsed into `was` already */
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, name);
            const char *v;
            int rc = member_text(m, &v);
            if (!rc && v && train_flag_set(o, name, v, 0) < 0) rc = FSC_ERR_FORMAT;
            if (rc) return rc;
            if (k < n) k += (size_t)snprintf(notes + k, n - k, " --%s %s", name, a);
        } else if (is_model_flag(name)) {
            return fsc_error(FSC_ERR_INVALID,
                             "the checkpoint is of another model: --%s %s there, %s given "
                             "(leave the model flags out to take the checkpoint's)",
                             name, a, b);
        }
    }
    return FSC_OK;
}

/* The global batch stays unless --allow-change: a --batch not given is
 * rescaled to the ranks of this run when that keeps it. */
static int keep_global_batch(train_options *o, const char *stored, bool verbose) {
    if (!stored) return FSC_OK;
    const long long was = strtoll(stored, NULL, 10), world = dp_world(o);
    const long long now = (long long)o->batch * o->grad_accum * world;
    if (was <= 0 || was == now) return FSC_OK;
    if (!train_flag_given(o, "batch") && was % ((long long)o->grad_accum * world) == 0) {
        o->batch = (int)(was / ((long long)o->grad_accum * world));
        if (verbose)
            fprintf(stderr,
                    "fsc-train: --resume: --batch %d per rank keeps the global batch of "
                    "%lld sequences over %lld rank(s)\n",
                    o->batch, was, world);
        return FSC_OK;
    }
    if (o->allow_change) {
        if (verbose)
            fprintf(stderr,
                    "fsc-train: --resume: the global batch changes from %lld to %lld "
                    "sequences (--allow-change)\n",
                    was, now);
        return FSC_OK;
    }
    return fsc_error(FSC_ERR_INVALID,
                     "the checkpoint's global batch is %lld sequences; --batch %d x --grad-accum "
                     "%d x %lld rank(s) makes %lld (change --batch or --grad-accum, or give "
                     "--allow-change)",
                     was, o->batch, o->grad_accum, world, now);
}

int train_config_resume(train_options *o, bool verbose) {
    fsc_ckpt *c;
    int rc = fsc_ckpt_open(o->resume, &c);
    if (rc) return fsc_error_context(rc, "--resume %s: ", o->resume);
    const char *text = fsc_ckpt_get(c, "config");
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    if (text && !cJSON_IsObject(j)) rc = fsc_error(FSC_ERR_FORMAT, "its config is not an object");
    train_options was;
    char notes[2048] = "", changes[1024] = "";
    if (!rc && j) rc = take_flags(o, j, &was, notes, sizeof notes);
    if (!rc && j) {
        schedule_changes(&was, o, changes, sizeof changes);
        if (*changes && !o->allow_change)
            rc = fsc_error(FSC_ERR_INVALID,
                           "this would change the learning-rate schedule of the steps to "
                           "come:%s (give the checkpoint's values, or --allow-change)",
                           changes);
    }
    if (!rc && verbose && *notes)
        fprintf(stderr, "fsc-train: --resume: from the checkpoint:%s\n", notes);
    if (!rc && j) rc = keep_global_batch(o, fsc_ckpt_get(c, "global_batch"), verbose);
    if (!rc && verbose && *changes)
        fprintf(stderr, "fsc-train: --resume: schedule changed:%s (--allow-change)\n", changes);
    cJSON_Delete(j);
    fsc_ckpt_close(c);
    return rc ? fsc_error_context(rc, "--resume %s: ", o->resume) : FSC_OK;
}

/* ---- --init-from: the model of a weights file ---------------------------------------------- */

typedef struct {
    int vocab, seq, layers, d_model, heads; /* 0: unknown */
    /* MoE (Qwen2-MoE's config.json names where they exist): 0 / < 0 unknown */
    int experts, every, hidden;
    double capacity, aux_coef;
} model_dims;

static void dims_from_json(const cJSON *j, model_dims *d) {
    const cJSON *v;
#define GET(key, field)                                                                            \
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, key)) && !d->field)                 \
    d->field = v->valueint
    GET("vocab_size", vocab);
    GET("n_positions", seq);
    GET("n_ctx", seq);
    GET("n_layer", layers);
    GET("n_embd", d_model);
    GET("n_head", heads);
    GET("num_experts", experts);
    GET("decoder_sparse_step", every);
    GET("moe_intermediate_size", hidden);
#undef GET
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "moe_capacity_factor")) &&
        d->capacity < 0)
        d->capacity = v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "router_aux_loss_coef")) &&
        d->aux_coef < 0)
        d->aux_coef = v->valuedouble;
}

/* The MoE blocks' shapes: the first block with a gate gives every (l + 1),
 * its gate (E, C) the experts, expert 0's c_fc (C, H) the width. */
static void moe_from_shapes(fsc_st_file *f, model_dims *d) {
    char name[96];
    /* a config.json may claim any number of layers; the file has no more than its tensors */
    for (int l = 0; l < d->layers && l < fsc_st_count(f) && !d->experts; l++) {
        snprintf(name, sizeof name, "h.%d.mlp.gate.weight", l);
        const fsc_st_entry *gate = fsc_weights_find(f, name);
        snprintf(name, sizeof name, "h.%d.mlp.experts.0.c_fc.weight", l);
        const fsc_st_entry *fc = fsc_weights_find(f, name);
        if (!gate || gate->ndim != 2 || !fc || fc->ndim != 2) continue;
        d->experts = (int)gate->shape[0], d->every = l + 1, d->hidden = (int)fc->shape[1];
    }
}

/* DIR/config.json for weights file DIR/x.safetensors, or for DIR itself. */
static void config_json_path(const char *weights, char *out, size_t n) {
    const char *slash = strrchr(weights, '/');
    struct stat sb;
    if (!stat(weights, &sb) && S_ISDIR(sb.st_mode))
        snprintf(out, n, "%s/config.json", weights);
    else if (slash)
        snprintf(out, n, "%.*s/config.json", (int)(slash - weights), weights);
    else
        snprintf(out, n, "config.json");
}

int train_config_init_from(train_options *o, bool verbose) {
    char first[4096];
    if (train_sharded_dir(o->init_from, NULL)) { /* the shapes from its first shard file */
        const char *dir = o->init_from;
        int rc = train_sharded_first(dir, first, sizeof first);
        o->init_from = first;
        if (!rc) rc = train_config_init_from(o, verbose);
        o->init_from = dir;
        return rc;
    }
    bool llama = false; /* the LLaMA family's config: train_hf.c */
    int status = train_hf_init_from(o, verbose, &llama);
    if (status || llama) return status;
    fsc_st_file *f = fsc_st_open(o->init_from, &status);
    if (!f) return FSC_OK; /* the loader says what is wrong with it */
    model_dims d = {.capacity = -1, .aux_coef = -1};
    const char *source = "its metadata";
    const char *meta = fsc_st_metadata(f, "fsc.gpt_config");
    cJSON *j = meta ? cJSON_Parse(meta) : NULL;
    char path[4096];
    config_json_path(o->init_from, path, sizeof path);
    if (!j) source = "config.json beside it";
    cJSON *hf = NULL; /* config.json: the shapes when the file has none, and MoE's settings */
    int rc = read_beside(path, &hf);
    if (rc) {
        cJSON_Delete(j);
        fsc_st_close(f);
        return fsc_error_context(rc, "--init-from %s: ", o->init_from);
    }
    if (j) dims_from_json(j, &d);
    cJSON_Delete(j);
    if (hf) dims_from_json(hf, &d);
    cJSON_Delete(hf);
    if (!d.d_model) { /* the shapes: wte (V, C), wpe (P, C), blocks h.N */
        source = "its tensor shapes";
        const fsc_st_entry *wte = fsc_weights_find(f, "wte.weight"),
                           *wpe = fsc_weights_find(f, "wpe.weight");
        if (wte && wte->ndim == 2) d.vocab = (int)wte->shape[0], d.d_model = (int)wte->shape[1];
        if (wpe && wpe->ndim == 2) d.seq = (int)wpe->shape[0];
        char name[64];
        for (d.layers = 0;; d.layers++) {
            snprintf(name, sizeof name, "h.%d.ln_1.weight", d.layers);
            if (!fsc_weights_find(f, name)) break;
        }
    }
    if (d.layers && !d.experts) moe_from_shapes(f, &d);
    fsc_st_close(f);
    if (!d.d_model) return FSC_OK; /* not a GPT: the loader names what is missing */
    const struct {
        const char *flag;
        int value, *field;
    } take[] = {{"vocab", d.vocab, &o->model.vocab},    {"seq", d.seq, &o->model.seq},
                {"layers", d.layers, &o->model.layers}, {"d-model", d.d_model, &o->model.d_model},
                {"heads", d.heads, &o->model.heads},    {"moe-experts", d.experts, &o->moe_experts},
                {"moe-every", d.every, &o->moe_every},  {"moe-hidden", d.hidden, &o->moe_hidden}};
    char notes[512] = "";
    size_t k = 0;
    for (size_t i = 0; i < sizeof take / sizeof *take; i++) {
        if (take[i].value <= 0 || train_flag_given(o, take[i].flag)) continue;
        *take[i].field = take[i].value;
        k += (size_t)snprintf(notes + k, sizeof notes - k, " --%s %d", take[i].flag, take[i].value);
    }
    const struct {
        const char *flag;
        double value, *field;
    } moe_take[] = {{"moe-capacity", d.capacity, &o->moe_capacity},
                    {"moe-aux-coef", d.aux_coef, &o->moe_aux_coef}};
    for (size_t i = 0; d.experts > 0 && i < sizeof moe_take / sizeof *moe_take; i++) {
        if (moe_take[i].value < 0 || train_flag_given(o, moe_take[i].flag)) continue;
        *moe_take[i].field = moe_take[i].value;
        k += (size_t)snprintf(notes + k, sizeof notes - k, " --%s %g", moe_take[i].flag,
                              moe_take[i].value);
    }
    if (!d.heads && !train_flag_given(o, "heads"))
        return fsc_error(FSC_ERR_INVALID,
                         "--init-from %s: neither its metadata nor a config.json beside it says "
                         "how many attention heads it has: give --heads",
                         o->init_from);
    if (verbose && *notes) fprintf(stderr, "fsc-train: --init-from: from %s:%s\n", source, notes);
    return FSC_OK;
}

int train_config_write_hf(const train_options *o, const char *weights) {
    if (train_hf_dir_target(o, weights))
        return fsc_hf_config_write(weights, &o->model, train_hf_torch_dtype(o));
    char path[4096], *text = NULL;
    if (o->model.arch == FSC_ARCH_LLAMA) { /* LlamaConfig's fields, beside the file */
        const char *slash = strrchr(weights, '/');
        snprintf(path, sizeof path, "%.*s", slash ? (int)(slash - weights) : 1,
                 slash ? weights : ".");
        return fsc_hf_config_write(path, &o->model, NULL);
    }
    size_t len = 0;
    config_json_path(weights, path, sizeof path);
    FILE *f = open_memstream(&text, &len); /* then written atomically, never at a fixed name */
    if (!f) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    const fsc_gpt_config *m = &o->model;
    const float p = m->dropout;
    fprintf(f,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
            "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"resid_pdrop\": %g,\n"
            "  \"embd_pdrop\": %g,\n  \"attn_pdrop\": 0.0,\n  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": true,\n"
            "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"",
            m->vocab, m->seq, m->seq, m->d_model, m->layers, m->heads, (double)p, (double)p,
            m->vocab - 1, m->vocab - 1);
    if (o->moe_experts) /* top-2 MoE MLPs in blocks l with (l + 1) % step == 0, as Qwen2-MoE's */
        fprintf(f,
                ",\n  \"num_experts\": %d,\n  \"num_experts_per_tok\": 2,\n"
                "  \"decoder_sparse_step\": %d,\n  \"moe_intermediate_size\": %d,\n"
                "  \"moe_capacity_factor\": %.17g,\n  \"router_aux_loss_coef\": %.17g",
                o->moe_experts, o->moe_every, o->moe_hidden ? o->moe_hidden : 4 * m->d_model,
                o->moe_capacity, o->moe_aux_coef);
    fprintf(f, "\n}\n");
    const bool bad = ferror(f) | (fclose(f) != 0);
    int rc = bad || !text ? fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path)
                          : fsc_file_write_atomic(path, text, len);
    free(text);
    return rc;
}
