/* Hugging Face model directories: a LLaMA's weights cut into shards with
 * model.safetensors.index.json load back bit for bit; a lying index, a
 * missing shard, a tensor the map leaves out and a shape that differs are
 * refused naming what is wrong; config.json round-trips and refuses what
 * fsc cannot run, naming the field. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/weights.h"

#include "tmpdir.h"

static const fsc_gpt_config LLAMA = {.vocab = 40,
                                     .seq = 16,
                                     .layers = 2,
                                     .d_model = 16,
                                     .heads = 4,
                                     .arch = FSC_ARCH_LLAMA,
                                     .kv_heads = 2,
                                     .ffn_hidden = 24,
                                     .qkv_bias = true};

typedef struct {
    fsc_module *m;
    fsc_params ps;
} model;

static void model_new(model *m, const fsc_gpt_config *c, uint64_t seed) {
    m->m = fsc_gpt_new(c);
    assert_non_null(m->m);
    assert_int_equal(fsc_params_bind(m->m, seed, false, &m->ps), FSC_OK);
}

static void model_free(model *m) {
    fsc_params_free(&m->ps);
    fsc_module_free(m->m);
}

static bool exists(const char *path) {
    struct stat sb;
    return !stat(path, &sb);
}

static char *slurp(const char *path) {
    char *text[1] = {NULL};
    assert_int_equal(fsc_file_read_all(path, 1 << 20, text, NULL), FSC_OK);
    return text[0];
}

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Replaces the first `from` in path's text with `to`. */
static void edit(const char *path, const char *from, const char *to) {
    char *text = slurp(path);
    assert_non_null(strstr(text, from));
    const size_t at = (size_t)(strstr(text, from) - text);
    char *out = malloc(strlen(text) + strlen(to) + 1);
    sprintf(out, "%.*s%s%s", (int)at, text, to, text + at + strlen(from));
    spit(path, out);
    free(out), free(text);
}

static void expect_error(int rc, const char *needle) {
    assert_int_not_equal(rc, FSC_OK);
    if (!strstr(fsc_last_error(), needle))
        fail_msg("\"%s\" lacks \"%s\"", fsc_last_error(), needle);
}

/* DIR with a seed-3 LLaMA cut into shards of 4 KiB: 3 shards or more. */
static int sharded(const char *name, model *src) {
    const char *d = tmp(name);
    assert_int_equal(mkdir(d, 0777), 0);
    model_new(src, &LLAMA, 3);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    assert_int_equal(fsc_weights_save(path, &src->ps, 0, NULL, NULL), FSC_OK);
    int n = 0;
    assert_int_equal(fsc_hf_shard(d, 4096, &n), FSC_OK);
    return n;
}

static void test_shards_round_trip(void **state) {
    (void)state;
    model a, b;
    const int n = sharded("rt", &a);
    assert_true(n >= 3);
    assert_false(exists(tmp("rt/model.safetensors")));
    assert_true(exists(tmp("rt/model.safetensors.index.json")));
    char shard[64];
    snprintf(shard, sizeof shard, "rt/model-00001-of-%05d.safetensors", n);
    assert_true(exists(tmp(shard)));
    fsc_st_file *first = fsc_st_open(tmp(shard), NULL); /* whole tensors, within the size */
    assert_non_null(first);
    uint64_t bytes = 0;
    for (int i = 0; i < fsc_st_count(first); i++) bytes += fsc_st_entry_at(first, i)->nbytes;
    assert_true(bytes <= 4096 || fsc_st_count(first) == 1);
    fsc_st_close(first);
    model_new(&b, &LLAMA, 9);
    int unused = -1;
    assert_int_equal(fsc_weights_load(tmp("rt"), &b.ps, &unused), FSC_OK);
    assert_int_equal(unused, 0);
    for (int i = 0; i < a.ps.count; i++) {
        const fsc_param *p = a.ps.entries[i].param, *q = b.ps.entries[i].param;
        assert_memory_equal(p->data, q->data, sizeof(float) * (size_t)p->numel);
    }
    model_free(&a), model_free(&b);
}

static void test_one_shard_stays_whole(void **state) {
    (void)state;
    model a;
    model_new(&a, &LLAMA, 3);
    assert_int_equal(mkdir(tmp("one"), 0777), 0);
    assert_int_equal(fsc_weights_save(tmp("one/model.safetensors"), &a.ps, 0, NULL, NULL), FSC_OK);
    int n = 0;
    assert_int_equal(fsc_hf_shard(tmp("one"), FSC_HF_SHARD_BYTES, &n), FSC_OK);
    assert_int_equal(n, 1);
    assert_true(exists(tmp("one/model.safetensors")));
    assert_false(exists(tmp("one/model.safetensors.index.json")));
    assert_int_equal(fsc_weights_load(tmp("one"), &a.ps, NULL), FSC_OK);
    model_free(&a);
}

static void test_bad_directories(void **state) {
    (void)state;
    model a, b;
    model_new(&b, &LLAMA, 9);
    const int n = sharded("bad", &a);
    char index[600];
    assert_true(n > 1);
    snprintf(index, sizeof index, "%s", tmp("bad/model.safetensors.index.json"));
    char *good = slurp(index);

    /* the map leaves a tensor out: the model's load names it */
    edit(index, "\"model.norm.weight\": ", "\"model.norm.weight.renamed\": ");
    expect_error(fsc_st_open(tmp("bad"), NULL) ? FSC_OK : FSC_ERR_FORMAT, "renamed");
    spit(index, good);
    edit(index, "\"model.norm.weight\"", "\"unused\"");
    expect_error(fsc_st_open(tmp("bad"), NULL) ? FSC_OK : FSC_ERR_FORMAT, "has no such tensor");
    spit(index, good);
    /* a tensor the map omits entirely */
    {
        char *text = slurp(index);
        const size_t at = (size_t)(strstr(text, "\"model.norm.weight\"") - text);
        const size_t end = (size_t)(strchr(text + at, ',') - text) + 1; /* not the map's last */
        char *out = malloc(strlen(text) + 1);
        sprintf(out, "%.*s%s", (int)at, text, text + end);
        spit(index, out);
        free(out), free(text);
        expect_error(fsc_weights_load(tmp("bad"), &b.ps, NULL), "model.norm.weight");
        spit(index, good);
    }
    /* a shard outside the directory */
    edit(index, "\"model-00001", "\"../model-00001");
    expect_error(fsc_st_open(tmp("bad"), NULL) ? FSC_OK : FSC_ERR_FORMAT, "must name a shard");
    spit(index, good);
    free(good);
    model_free(&a), model_free(&b);
}

static void test_missing_shard_and_shapes(void **state) {
    (void)state;
    model a;
    const int n = sharded("miss", &a);
    char shard[128], away[600];
    snprintf(shard, sizeof shard, "miss/model-%05d-of-%05d.safetensors", n, n);
    snprintf(away, sizeof away, "%s.away", tmp(shard));
    assert_int_equal(rename(tmp(shard), away), 0);
    char want[96];
    snprintf(want, sizeof want, "shard model-%05d-of-%05d.safetensors", n, n);
    int rc = FSC_OK;
    assert_null(fsc_st_open(tmp("miss"), &rc));
    expect_error(rc, want);
    assert_true(strstr(fsc_last_error(), "is missing") != NULL);
    assert_int_equal(rename(away, tmp(shard)), 0);
    /* a model of another width: the tensor and both shapes named */
    fsc_gpt_config wide = LLAMA;
    wide.ffn_hidden = 32;
    model w;
    model_new(&w, &wide, 1);
    expect_error(fsc_weights_load(tmp("miss"), &w.ps, NULL),
                 "gate_proj.weight has shape [24,16], the model expects [32,16]");
    /* neither file nor index */
    assert_int_equal(mkdir(tmp("empty"), 0777), 0);
    assert_null(fsc_st_open(tmp("empty"), &rc));
    expect_error(rc, "directory");
    model_free(&a), model_free(&w);
}

static void test_config_round_trip(void **state) {
    (void)state;
    fsc_gpt_config c = LLAMA, back;
    c.tie_embeddings = true;
    c.rope_theta = 500000.f;
    c.norm_eps = 1e-6f;
    c.rope_scaling = (fsc_rope_scaling){8.f, 1.f, 4.f, 8192};
    assert_int_equal(mkdir(tmp("cfg"), 0777), 0);
    assert_int_equal(fsc_hf_config_write(tmp("cfg"), &c, NULL), FSC_OK);
    assert_int_equal(fsc_hf_config_read(tmp("cfg"), &back), FSC_OK);
    assert_int_equal(back.arch, FSC_ARCH_LLAMA);
    assert_int_equal(back.vocab, c.vocab);
    assert_int_equal(back.seq, c.seq);
    assert_int_equal(back.layers, c.layers);
    assert_int_equal(back.d_model, c.d_model);
    assert_int_equal(back.heads, c.heads);
    assert_int_equal(back.kv_heads, c.kv_heads);
    assert_int_equal(back.ffn_hidden, 24);
    assert_true(back.rope_theta == c.rope_theta && back.norm_eps == c.norm_eps);
    assert_true(back.tie_embeddings && back.qkv_bias);
    assert_true(back.rope_scaling.factor == 8.f && back.rope_scaling.high_freq_factor == 4.f);
    assert_int_equal(back.rope_scaling.original_max_position_embeddings, 8192);
    char *text = slurp(tmp("cfg/config.json"));
    assert_non_null(strstr(text, "\"torch_dtype\": \"float32\""));
    assert_non_null(strstr(text, "\"LlamaForCausalLM\""));
    free(text);
    /* Qwen 2: q/k/v biases without saying so */
    const char *qwen = "{\"model_type\": \"qwen2\", \"vocab_size\": 40, \"hidden_size\": 16, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"intermediate_size\": 24, "
                       "\"use_sliding_window\": false}";
    assert_int_equal(fsc_hf_config_parse(qwen, "qwen", &back), FSC_OK);
    assert_true(back.qkv_bias && back.kv_heads == 2 && back.seq == 2048);
}

static void test_config_refusals(void **state) {
    (void)state;
    static const struct {
        const char *edit, *needle;
    } cases[] = {
        {"\"model_type\": \"mamba\"", "\"model_type\" \"mamba\""},
        {"\"num_attention_heads\": 5", "\"num_attention_heads\" 5 does not divide"},
        {"\"num_key_value_heads\": 3", "\"num_key_value_heads\" 3 does not divide"},
        {"\"hidden_act\": \"gelu\"", "\"hidden_act\""},
        {"\"hidden_size\": -16", "\"hidden_size\" must be"},
        {"\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}", "rope_scaling"},
        {"\"rope_theta\": \"big\"", "\"rope_theta\" must be"},
        {"\"head_dim\": 8", "\"head_dim\" 8"},
        {"\"mlp_bias\": true", "\"mlp_bias\""},
    };
    fsc_gpt_config c = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{%s, \"model_type\": \"llama\", \"vocab_size\": 40, \"hidden_size\": 16, "
                 "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 2, \"intermediate_size\": 24}",
                 cases[i].edit);
        /* cJSON keeps the first of a repeated key: the case's value wins */
        expect_error(fsc_hf_config_parse(json, "config.json", &c), cases[i].needle);
    }
    expect_error(
        fsc_hf_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 40}", "c.json", &c),
        "\"hidden_size\" is missing");
    assert_int_equal(c.vocab, 0); /* untouched on failure */
}

int main(void) {
    (void)write_raw; /* tmpdir.h's, unused here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_round_trip), cmocka_unit_test(test_one_shard_stays_whole),
        cmocka_unit_test(test_bad_directories),   cmocka_unit_test(test_missing_shard_and_shapes),
        cmocka_unit_test(test_config_round_trip), cmocka_unit_test(test_config_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
