/* fsc-train and Hugging Face LLaMA directories.
 *
 * --init-from DIR (or a LLaMA weights file with config.json beside it, or
 * fsc's own save) takes the model from its config: a model flag left out is
 * taken, one that says otherwise is refused by name, since a model of
 * another shape could not load the weights anyway and a silently different
 * rope_theta or eps would load them and compute something else. --seq may
 * be shorter than max_position_embeddings (rotary positions have no table).
 * --save DIR / --save-init DIR under --arch llama write what
 * LlamaForCausalLM.from_pretrained reads: config.json and
 * model.safetensors, cut into shards past --shard-size.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/moe.h"
#include "fsc/weights.h"
#include "train_common.h"

static bool is_dir(const char *path) {
    struct stat sb;
    return path && !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

bool train_hf_dir_target(const train_options *o, const char *path) {
    const size_t n = path ? strlen(path) : 0, k = strlen(".safetensors");
    return o->model.arch == FSC_ARCH_LLAMA && n && (n < k || strcmp(path + n - k, ".safetensors"));
}

int train_hf_shard_bytes(const char *text, int64_t *out) {
    *out = FSC_HF_SHARD_BYTES;
    if (!text) return FSC_OK;
    char *end;
    const double v = strtod(text, &end);
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1},       {"KB", 1e3},          {"MB", 1e6},     {"GB", 1e9},
                 {"KiB", 1024}, {"MiB", 1024 * 1024}, {"GiB", 1 << 30}};
    for (size_t i = 0; end != text && i < sizeof units / sizeof *units; i++)
        if (!strcmp(end, units[i].suffix) && v * units[i].scale >= 1 &&
            v * units[i].scale < 9.2e18) {
            *out = (int64_t)(v * units[i].scale);
            return FSC_OK;
        }
    return fsc_error(FSC_ERR_INVALID,
                     "--shard-size \"%s\": expected bytes, or a number with KB, MB, GB (powers "
                     "of 1000) or KiB, MiB, GiB",
                     text);
}

/* The LLaMA config of --init-from, if it is one: *found false for GPT-2;
 * *moe its MoE layers (Mixtral's fields; experts 0 for a dense model). */
static int read_config(const char *from, fsc_gpt_config *c, fsc_moe_options *moe, char *what,
                       size_t n, bool *found) {
    *found = false;
    *moe = (fsc_moe_options){0};
    char *text = NULL;
    int rc = FSC_OK;
    if (is_dir(from)) {
        snprintf(what, n, "%s/config.json", from);
        rc = fsc_hf_config_read(from, c);
        *found = !rc && c->arch == FSC_ARCH_LLAMA;
        if (*found && !(rc = fsc_file_read_all(what, (size_t)4 << 20, &text, NULL)))
            rc = fsc_hf_config_parse_moe(text, what, moe);
        free(text);
        return rc;
    }
    const char *slash = strrchr(from, '/');
    snprintf(what, n, "%.*sconfig.json", slash ? (int)(slash - from + 1) : 0, from);
    struct stat sb;
    if (!stat(what, &sb) && !(rc = fsc_file_read_all(what, (size_t)4 << 20, &text, NULL))) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
        const bool llama = cJSON_IsString(type) && (!strcmp(type->valuestring, "llama") ||
                                                    !strcmp(type->valuestring, "mixtral") ||
                                                    !strcmp(type->valuestring, "qwen2"));
        cJSON_Delete(j);
        if (llama && !(rc = fsc_hf_config_parse(text, what, c))) *found = true;
        if (*found) rc = fsc_hf_config_parse_moe(text, what, moe);
        free(text);
        if (rc || *found) return rc;
    }
    if (rc) return rc;
    fsc_st_file *f = fsc_st_open(from, NULL); /* fsc's own save: its metadata */
    const char *meta = fsc_st_metadata(f, "fsc.gpt_config");
    cJSON *j = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "llama")) {
        snprintf(what, n, "%s (its fsc.gpt_config metadata)", from);
        if (!(rc = fsc_hf_config_parse(meta, what, c))) *found = true;
    }
    cJSON_Delete(j);
    fsc_st_close(f);
    return rc;
}

/* A given flag's value against the file's: 0 when they agree. */
static int contradicts(const char *flag, double given, double file, const char *what) {
    if (fabs(given - file) <= 1e-6 * fabs(file)) return FSC_OK;
    return fsc_error(FSC_ERR_INVALID,
                     "--init-from: --%s %g contradicts %s, which says %g (leave --%s out to take "
                     "the model's)",
                     flag, given, what, file, flag);
}

/* A Mixtral config's MoE layers into the --moe-* flags left out; the
 * shape's flags given must agree (a model of another shape cannot load the
 * weights), the routing's (capacity, aux coefficient) may differ. */
static int take_moe(train_options *o, const fsc_moe_options *moe, int ffn, const char *what) {
    if (!moe->experts) return FSC_OK; /* a dense LLaMA: --moe-experts makes a new one */
    const struct {
        const char *flag;
        int *field, given, file; /* the width compared as resolved: 0 is the dense one */
    } shape[] = {{"moe-experts", &o->moe_experts, o->moe_experts, moe->experts},
                 {"moe-every", &o->moe_every, o->moe_every, moe->every},
                 {"moe-hidden", &o->moe_hidden, o->moe_hidden ? o->moe_hidden : ffn,
                  moe->hidden ? moe->hidden : ffn}};
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++) {
        int rc = train_flag_given(o, shape[i].flag)
                     ? contradicts(shape[i].flag, shape[i].given, shape[i].file, what)
                     : FSC_OK;
        if (rc) return rc;
        *shape[i].field = shape[i].file;
    }
    if (!train_flag_given(o, "moe-capacity")) o->moe_capacity = moe->capacity_factor;
    if (!train_flag_given(o, "moe-aux-coef")) o->moe_aux_coef = moe->aux_coef;
    return FSC_OK;
}

int train_hf_init_from(train_options *o, bool verbose, bool *handled) {
    fsc_gpt_config c;
    fsc_moe_options moe;
    char what[4200];
    int rc = read_config(o->init_from, &c, &moe, what, sizeof what, handled);
    if (rc) return fsc_error_context(rc, "--init-from %s: ", o->init_from);
    if (!*handled) return FSC_OK;
    if (train_flag_given(o, "arch") && strcmp(o->arch, "llama"))
        return fsc_error(FSC_ERR_INVALID,
                         "--init-from: --arch %s contradicts %s: a LLaMA-family "
                         "model (give --arch llama, or leave it out)",
                         o->arch, what);
    const fsc_gpt_config *m = &o->model;
    const int kv = m->kv_heads ? m->kv_heads : m->heads;
    const struct {
        const char *flag;
        double given, file;
    } model[] = {{"vocab", m->vocab, c.vocab},
                 {"layers", m->layers, c.layers},
                 {"d-model", m->d_model, c.d_model},
                 {"heads", m->heads, c.heads},
                 {"kv-heads", kv, c.kv_heads},
                 {"ffn-hidden", fsc_gpt_ffn_hidden(m), c.ffn_hidden},
                 {"rope-theta", m->rope_theta > 0 ? m->rope_theta : 10000.f, c.rope_theta},
                 {"norm-eps", m->norm_eps > 0 ? m->norm_eps : 1e-5f, c.norm_eps},
                 {"tie-embeddings", o->tie_embeddings != 0, c.tie_embeddings},
                 {"qkv-bias", o->qkv_bias != 0, c.qkv_bias}};
    for (size_t i = 0; i < sizeof model / sizeof *model; i++)
        if (train_flag_given(o, model[i].flag) &&
            (rc = contradicts(model[i].flag, model[i].given, model[i].file, what)))
            return rc;
    if ((rc = take_moe(o, &moe, c.ffn_hidden, what))) return rc;
    if (train_flag_given(o, "seq") && m->seq > c.seq)
        return fsc_error(FSC_ERR_INVALID,
                         "--init-from: --seq %d is longer than %s's max_position_embeddings %d",
                         m->seq, what, c.seq);
    if (train_flag_given(o, "seq")) c.seq = m->seq; /* a shorter context trains the same weights */
    c.dropout = m->dropout;
    c.moe = m->moe;
    o->model = c;
    o->arch = "llama";
    o->tie_embeddings = c.tie_embeddings, o->qkv_bias = c.qkv_bias;
    if (verbose)
        fprintf(stderr,
                "fsc-train: --init-from: from %s: --arch llama --vocab %d --seq %d --layers %d "
                "--d-model %d --heads %d --kv-heads %d --ffn-hidden %d --rope-theta %g "
                "--norm-eps %g --tie-embeddings %d --qkv-bias %d%s\n",
                what, c.vocab, c.seq, c.layers, c.d_model, c.heads, c.kv_heads, c.ffn_hidden,
                (double)c.rope_theta, (double)c.norm_eps, c.tie_embeddings, c.qkv_bias,
                c.rope_scaling.factor > 0 ? " (and its llama3 rope_scaling)" : "");
    if (verbose && moe.experts)
        fprintf(stderr,
                "fsc-train: --init-from: Mixtral: --moe-experts %d --moe-every %d --moe-hidden %d "
                "--moe-capacity %g --moe-aux-coef %g\n",
                o->moe_experts, o->moe_every, o->moe_hidden, o->moe_capacity, o->moe_aux_coef);
    return FSC_OK;
}

const char *train_hf_torch_dtype(const train_options *o) {
    return o->save_dtype && !strcmp(o->save_dtype, "bf16") ? "bfloat16" : NULL;
}

int train_hf_finish(const train_options *o, const char *dir) {
    int64_t bytes;
    int n = 1, rc = train_hf_shard_bytes(o->shard_size, &bytes);
    if (!rc && train_hf_torch_dtype(o)) rc = fsc_hf_narrow_bf16(dir); /* shards of bf16 bytes */
    if (!rc) rc = fsc_hf_shard(dir, bytes, &n);
    if (!rc) rc = fsc_hf_config_write(dir, &o->model, train_hf_torch_dtype(o));
    if (!rc && !o->quiet && n > 1)
        fprintf(stderr, "fsc-train: %s: %d shards of at most %lld bytes\n", dir, n,
                (long long)bytes);
    return rc;
}
