/* Hugging Face's config.json to and from fsc_gpt_config.
 *
 * LlamaConfig's fields (Qwen2Config's: the same names, q/k/v biases always
 * on) and GPT2Config's. A field fsc cannot honour (another activation, MLP
 * biases, a sliding window, a rope_scaling type other than llama3, a
 * head_dim that is not hidden_size / heads) is refused by name rather than
 * loaded into a model that would compute something else.
 *
 * MixtralConfig's (model_type "mixtral") are LlamaConfig's plus the MoE
 * layers' (fsc/moe.h with SwiGLU experts): num_local_experts,
 * num_experts_per_tok (2: fsc routes top-2), router_aux_loss_coef (the
 * weight of fsc's l_aux when output_router_logits, else 0) and
 * router_jitter_noise (0). fsc's own fields beyond Mixtral's say what
 * Mixtral cannot: decoder_sparse_step (an MoE layer every k, Qwen2-MoE's
 * name), moe_intermediate_size (experts of another width than the dense
 * MLP's) and moe_capacity_factor (absent: dropless, as Mixtral).
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/moe.h"
#include "fsc/weights.h"
#include "io/io_internal.h"

#define CONFIG_MAX ((size_t)4 << 20) /* bytes of config.json accepted */

/* A positive integer field; absent leaves *out (the default) unless required. */
static int get_int(const cJSON *j, const char *what, const char *key, bool required, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (!required) return FSC_OK;
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" is missing", what, key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1 << 30 ||
        v->valuedouble != floor(v->valuedouble))
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be an integer in [1, 2^30]", what, key);
    *out = (int)v->valuedouble;
    return FSC_OK;
}

/* A positive finite number; absent leaves *out. */
static int get_pos(const cJSON *j, const char *what, const char *key, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return FSC_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite((float)v->valuedouble))
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be a positive number", what, key);
    *out = (float)v->valuedouble;
    return FSC_OK;
}

static int get_bool(const cJSON *j, const char *what, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return FSC_OK;
    if (!cJSON_IsBool(v))
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return FSC_OK;
}

/* rope_scaling: null, or LLaMA-3.1's {"rope_type": "llama3", "factor", ...}. */
static int rope_scaling(const cJSON *j, const char *what, fsc_rope_scaling *s) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!r || cJSON_IsNull(r)) return FSC_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(r, "type");
    if (!cJSON_IsObject(r) || !cJSON_IsString(type) || strcmp(type->valuestring, "llama3"))
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: \"rope_scaling\" of type %s: fsc has LLaMA-3.1's \"llama3\" "
                         "scaling (or null)",
                         what, cJSON_IsString(type) ? type->valuestring : "(none)");
    int rc = get_pos(r, what, "factor", &s->factor);
    if (!rc) rc = get_pos(r, what, "low_freq_factor", &s->low_freq_factor);
    if (!rc) rc = get_pos(r, what, "high_freq_factor", &s->high_freq_factor);
    if (!rc)
        rc = get_int(r, what, "original_max_position_embeddings", true,
                     &s->original_max_position_embeddings);
    if (!rc &&
        !(s->factor > 0 && s->low_freq_factor > 0 && s->low_freq_factor < s->high_freq_factor))
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: \"rope_scaling\" needs factor > 0 and 0 < low_freq_factor < "
                       "high_freq_factor",
                       what);
    return rc;
}

/* A field whose only value fsc computes: anything else is refused by name. */
static int must_be(const cJSON *j, const char *what, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return FSC_OK;
    char *got = cJSON_PrintUnformatted(v);
    const bool ok = got && !strcmp(got, want);
    int rc = ok ? FSC_OK
                : fsc_error(FSC_ERR_UNSUPPORTED, "%s: \"%s\" is %s; fsc's LLaMA runs %s", what, key,
                            got ? got : "?", want);
    free(got);
    return rc;
}

static int llama_fields(const cJSON *j, const char *what, bool qwen2, fsc_gpt_config *c) {
    c->arch = FSC_ARCH_LLAMA;
    c->seq = 2048;       /* LlamaConfig's default max_position_embeddings */
    c->norm_eps = 1e-6f; /* LlamaConfig's default rms_norm_eps */
    c->qkv_bias = qwen2; /* Qwen 2 always has them */
    c->tie_embeddings = false;
    /* fsc's own metadata (fsc.gpt_config) names the shape as GPT-2 does */
    const bool gpt2_names = !cJSON_GetObjectItemCaseSensitive(j, "hidden_size") &&
                            cJSON_GetObjectItemCaseSensitive(j, "n_embd");
    int rc = get_int(j, what, "vocab_size", true, &c->vocab);
    if (!rc) rc = get_int(j, what, gpt2_names ? "n_embd" : "hidden_size", true, &c->d_model);
    if (!rc) rc = get_int(j, what, gpt2_names ? "n_layer" : "num_hidden_layers", true, &c->layers);
    if (!rc) rc = get_int(j, what, gpt2_names ? "n_head" : "num_attention_heads", true, &c->heads);
    if (!rc) rc = get_int(j, what, "intermediate_size", true, &c->ffn_hidden);
    c->kv_heads = c->heads;
    if (!rc) rc = get_int(j, what, "num_key_value_heads", false, &c->kv_heads);
    if (!rc)
        rc = get_int(j, what, gpt2_names ? "n_positions" : "max_position_embeddings", false,
                     &c->seq);
    c->rope_theta = 10000.f;
    if (!rc) rc = get_pos(j, what, "rope_theta", &c->rope_theta);
    if (!rc) rc = get_pos(j, what, "rms_norm_eps", &c->norm_eps);
    if (!rc) rc = get_bool(j, what, "tie_word_embeddings", &c->tie_embeddings);
    if (!rc && !qwen2) rc = get_bool(j, what, "attention_bias", &c->qkv_bias);
    if (!rc) rc = rope_scaling(j, what, &c->rope_scaling);
    if (!rc) rc = must_be(j, what, "hidden_act", "\"silu\"");
    if (!rc) rc = must_be(j, what, "mlp_bias", "false");
    if (!rc) rc = must_be(j, what, "use_sliding_window", "false");
    if (rc) return rc;
    if (c->d_model % c->heads)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: \"num_attention_heads\" %d does not divide \"hidden_size\" %d", what,
                         c->heads, c->d_model);
    if (c->heads % c->kv_heads)
        return fsc_error(
            FSC_ERR_FORMAT,
            "%s: \"num_key_value_heads\" %d does not divide \"num_attention_heads\" %d", what,
            c->kv_heads, c->heads);
    int head_dim = c->d_model / c->heads;
    if ((rc = get_int(j, what, "head_dim", false, &head_dim))) return rc;
    if (head_dim != c->d_model / c->heads)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: \"head_dim\" %d is not hidden_size / num_attention_heads (%d): "
                         "fsc's attention has heads of hidden_size / heads",
                         what, head_dim, c->d_model / c->heads);
    return FSC_OK;
}

static int gpt2_fields(const cJSON *j, const char *what, fsc_gpt_config *c) {
    c->arch = FSC_ARCH_GPT2;
    int rc = get_int(j, what, "vocab_size", true, &c->vocab);
    if (!rc) rc = get_int(j, what, "n_embd", true, &c->d_model);
    if (!rc) rc = get_int(j, what, "n_layer", true, &c->layers);
    if (!rc) rc = get_int(j, what, "n_head", true, &c->heads);
    if (!rc) rc = get_int(j, what, "n_positions", true, &c->seq);
    if (!rc) rc = must_be(j, what, "activation_function", "\"gelu_new\"");
    if (!rc && c->d_model % c->heads)
        rc = fsc_error(FSC_ERR_FORMAT, "%s: \"n_head\" %d does not divide \"n_embd\" %d", what,
                       c->heads, c->d_model);
    return rc;
}

/* Both parsers' start: config.json's text as an object, and its
 * "model_type" (NULL when absent or not a string); the caller deletes *out. */
static int parse_object(const char *json, const char *what, cJSON **out, const char **type) {
    cJSON *j = cJSON_Parse(json);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fsc_error(FSC_ERR_FORMAT, "%s: not a JSON object", what);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    *type = cJSON_IsString(t) ? t->valuestring : NULL;
    *out = j;
    return FSC_OK;
}

int fsc_hf_config_parse(const char *json, const char *what, fsc_gpt_config *cfg) {
    if (!json || !what || !cfg)
        return fsc_error(FSC_ERR_INVALID, "fsc_hf_config_parse: NULL argument");
    cJSON *j = NULL;
    const char *type = NULL;
    int rc = parse_object(json, what, &j, &type);
    if (rc) return rc;
    fsc_gpt_config c = {0};
    if (!type)
        rc =
            fsc_error(FSC_ERR_FORMAT, "%s: \"model_type\" is missing (llama, qwen2 or gpt2)", what);
    else if (!strcmp(type, "llama") || !strcmp(type, "qwen2") || !strcmp(type, "mixtral"))
        rc = llama_fields(j, what, !strcmp(type, "qwen2"), &c);
    else if (!strcmp(type, "gpt2"))
        rc = gpt2_fields(j, what, &c);
    else
        rc = fsc_error(FSC_ERR_UNSUPPORTED,
                       "%s: \"model_type\" \"%s\": fsc reads llama, qwen2, mixtral and gpt2 "
                       "models",
                       what, type);
    cJSON_Delete(j);
    if (!rc) *cfg = c;
    return rc;
}

/* A non-negative finite number; absent leaves *out. */
static int get_nonneg(const cJSON *j, const char *what, const char *key, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return FSC_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite((float)v->valuedouble))
        return fsc_error(FSC_ERR_FORMAT, "%s: \"%s\" must be a number >= 0", what, key);
    *out = (float)v->valuedouble;
    return FSC_OK;
}

static int mixtral_fields(const cJSON *j, const char *what, fsc_moe_options *o) {
    int k = 2;
    bool router_logits = false;
    float jitter = 0.f, coef = 0.f;
    o->every = 1, o->expert = FSC_MOE_EXPERT_SWIGLU;
    int rc = get_int(j, what, "num_local_experts", true, &o->experts);
    if (!rc) rc = get_int(j, what, "num_experts_per_tok", false, &k);
    if (!rc && k != 2)
        rc = fsc_error(FSC_ERR_UNSUPPORTED,
                       "%s: \"num_experts_per_tok\" is %d; fsc's router is top-2", what, k);
    if (!rc && o->experts < 2)
        rc = fsc_error(FSC_ERR_FORMAT, "%s: \"num_local_experts\" %d: top-2 needs at least 2", what,
                       o->experts);
    if (!rc) rc = get_int(j, what, "decoder_sparse_step", false, &o->every);
    if (!rc) rc = get_int(j, what, "moe_intermediate_size", false, &o->hidden);
    o->capacity_factor = (float)o->experts; /* dropless, as Mixtral */
    if (!rc) rc = get_pos(j, what, "moe_capacity_factor", &o->capacity_factor);
    if (!rc) rc = get_bool(j, what, "output_router_logits", &router_logits);
    if (!rc) rc = get_nonneg(j, what, "router_aux_loss_coef", &coef);
    if (!rc) rc = get_nonneg(j, what, "router_jitter_noise", &jitter);
    if (!rc && jitter > 0)
        rc = fsc_error(FSC_ERR_UNSUPPORTED,
                       "%s: \"router_jitter_noise\" %g: fsc's router is deterministic (0)", what,
                       (double)jitter);
    o->aux_coef = router_logits ? coef : 0.f; /* HF adds the term only with router logits */
    return rc;
}

int fsc_hf_config_parse_moe(const char *json, const char *what, fsc_moe_options *moe) {
    if (!json || !what || !moe)
        return fsc_error(FSC_ERR_INVALID, "fsc_hf_config_parse_moe: NULL argument");
    cJSON *j = NULL;
    const char *type = NULL;
    int rc = parse_object(json, what, &j, &type);
    if (rc) return rc;
    fsc_moe_options o = {0};
    if (type && !strcmp(type, "mixtral")) rc = mixtral_fields(j, what, &o);
    cJSON_Delete(j);
    if (!rc) *moe = o;
    return rc;
}

int fsc_hf_config_read(const char *dir, fsc_gpt_config *cfg) {
    if (!dir || !cfg) return fsc_error(FSC_ERR_INVALID, "fsc_hf_config_read: NULL argument");
    char path[4096], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = fsc_file_read_all(path, CONFIG_MAX, &text, NULL);
    if (!rc) rc = fsc_hf_config_parse(text, path, cfg);
    free(text);
    return rc;
}

/* The shortest decimal that reads back as f (1e-05, not 9.99999975e-06). */
static void fmt_float(char *out, size_t n, float f) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, n, "%.*g", digits, (double)f);
        if (strtof(out, NULL) == f) return;
    }
}

int fsc_hf_config_write(const char *dir, const fsc_gpt_config *m, const char *torch_dtype) {
    if (!dir || !m) return fsc_error(FSC_ERR_INVALID, "fsc_hf_config_write: NULL argument");
    if (m->arch != FSC_ARCH_LLAMA)
        return fsc_error(FSC_ERR_INVALID,
                         "fsc_hf_config_write: the LLaMA family's config (GPT-2's is "
                         "fsc-train's, with its MoE fields)");
    char path[4096], *text = NULL, scaling[256] = "null", theta[32], eps[32];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    const fsc_rope_scaling *s = &m->rope_scaling;
    fmt_float(theta, sizeof theta, m->rope_theta > 0 ? m->rope_theta : 10000.f);
    fmt_float(eps, sizeof eps, m->norm_eps > 0 ? m->norm_eps : 1e-5f);
    if (s->factor > 0)
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %.9g, \"low_freq_factor\": %.9g, "
                 "\"high_freq_factor\": %.9g, \"original_max_position_embeddings\": %d}",
                 (double)s->factor, (double)s->low_freq_factor, (double)s->high_freq_factor,
                 s->original_max_position_embeddings);
    const fsc_moe_options *o = m->moe && m->moe->experts ? m->moe : NULL;
    const int F = fsc_gpt_ffn_hidden(m), H = o && o->hidden ? o->hidden : F;
    const int every = o && o->every > 1 ? o->every : 1;
    FILE *f = open_memstream(&text, &len); /* then written atomically */
    if (!f) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n"
            "  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n  \"rms_norm_eps\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n  \"attention_bias\": %s,\n  \"mlp_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n"
            "  \"torch_dtype\": \"%s\"",
            o ? "MixtralForCausalLM" : "LlamaForCausalLM", o ? "mixtral" : "llama", m->vocab,
            m->seq, m->d_model, every == 1 ? H : F, m->layers, m->heads,
            m->kv_heads ? m->kv_heads : m->heads, m->d_model / m->heads, theta, scaling, eps,
            m->tie_embeddings ? "true" : "false", m->qkv_bias ? "true" : "false",
            torch_dtype ? torch_dtype : "float32");
    if (o) { /* Mixtral's fields, then fsc's where Mixtral has no word (see the top) */
        char coef[32];
        fmt_float(coef, sizeof coef, o->aux_coef);
        fprintf(f,
                ",\n  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": 2,\n"
                "  \"router_aux_loss_coef\": %s,\n  \"output_router_logits\": %s,\n"
                "  \"router_jitter_noise\": 0.0",
                o->experts, coef, o->aux_coef > 0 ? "true" : "false");
        if (every > 1) fprintf(f, ",\n  \"decoder_sparse_step\": %d", every);
        if (every > 1 && H != F) fprintf(f, ",\n  \"moe_intermediate_size\": %d", H);
        const float cf = o->capacity_factor > 0 ? o->capacity_factor : 2.0f; /* fsc/moe.h's 0 */
        if (cf < (float)o->experts) fprintf(f, ",\n  \"moe_capacity_factor\": %.9g", (double)cf);
    }
    fprintf(f, "\n}\n");
    return fsc_memstream_write_atomic(f, &text, &len, path);
}
