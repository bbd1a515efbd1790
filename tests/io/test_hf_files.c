/* Hugging Face GPT-2 files as they come: an unused tensor of a dtype fsc has
 * no tensors of (GPT-2's BOOL attention mask) is skipped, not fatal, yet still
 * checked; a file of more positions than the model loads the first rows of
 * wpe; anything else that does not fit is refused as before. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/weights.h"

#include "tmpdir.h"

static fsc_gpt_config cfg_seq(int seq) {
    return (fsc_gpt_config){.vocab = 16, .seq = seq, .layers = 1, .d_model = 8, .heads = 2};
}

/* Writes a GPT of `seq` positions (seed 7) to path; *m and *ps stay for the caller. */
static void save_gpt(const char *path, int seq, fsc_module **m, fsc_params *ps) {
    fsc_gpt_config c = cfg_seq(seq);
    *m = fsc_gpt_new(&c);
    assert_non_null(*m);
    assert_int_equal(fsc_params_bind(*m, 7, false, ps), FSC_OK);
    assert_int_equal(fsc_weights_save(path, ps, 0, NULL, NULL), FSC_OK);
}

/* Copies src to dst with one extra tensor `name` of `dtype` and `shape`
 * ("[4,4]"), its data `nbytes` bytes (declared as `declared` bytes). */
static void add_tensor(const char *src, const char *dst, const char *name, const char *dtype,
                       const char *shape, size_t nbytes, size_t declared) {
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *raw = malloc(size);
    assert_int_equal(fread(raw, 1, size, f), size);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)raw[i] << (8 * i);
    char *htext = strndup((char *)raw + 8, hlen);
    cJSON *h = cJSON_Parse(htext);
    assert_non_null(h);
    const size_t data = size - 8 - hlen;
    char entry[256];
    snprintf(entry, sizeof entry, "{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
             dtype, shape, data, data + declared);
    cJSON_AddItemToObject(h, name, cJSON_Parse(entry));
    char *out = cJSON_PrintUnformatted(h);
    const uint64_t n = strlen(out);
    FILE *g = fopen(dst, "wb");
    assert_non_null(g);
    for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, g);
    fwrite(out, 1, n, g);
    fwrite(raw + 8 + hlen, 1, data, g);
    for (size_t i = 0; i < nbytes; i++) fputc(i & 1, g);
    fclose(g);
    free(out), free(htext), free(raw);
    cJSON_Delete(h);
}

static const float *param_data(const fsc_params *ps, const char *name) {
    for (int i = 0; i < ps->count; i++)
        if (!strcmp(ps->entries[i].name, name)) return ps->entries[i].param->data;
    fail_msg("no parameter %s", name);
    return NULL;
}

static void test_unused_bool_tensor_skipped(void **state) {
    (void)state;
    fsc_module *m;
    fsc_params ps;
    save_gpt(tmp("plain.safetensors"), 8, &m, &ps);
    add_tensor(tmp("plain.safetensors"), tmp("mask.safetensors"), "h.0.attn.bias", "BOOL",
               "[1,1,4,4]", 16, 16);
    int rc;
    fsc_st_file *f = fsc_st_open(tmp("mask.safetensors"), &rc);
    assert_non_null(f);
    assert_null(fsc_st_find(f, "h.0.attn.bias")); /* skipped ... */
    assert_int_equal(fsc_st_count(f), ps.count);  /* ... and only it */
    fsc_st_close(f);
    fsc_gpt_config c = cfg_seq(8);
    fsc_module *m2 = fsc_gpt_new(&c);
    fsc_params ps2;
    assert_int_equal(fsc_params_bind(m2, 99, false, &ps2), FSC_OK);
    int unused = -1;
    assert_int_equal(fsc_weights_load(tmp("mask.safetensors"), &ps2, &unused), FSC_OK);
    assert_int_equal(unused, 0);
    assert_memory_equal(ps2.data, ps.data, sizeof(float) * (size_t)ps.numel);
    /* a U8 tensor too; a foreign tensor is still checked: a lying size is refused */
    add_tensor(tmp("plain.safetensors"), tmp("u8.safetensors"), "extra", "U8", "[3]", 3, 3);
    assert_int_equal(fsc_weights_load(tmp("u8.safetensors"), &ps2, NULL), FSC_OK);
    add_tensor(tmp("plain.safetensors"), tmp("lie.safetensors"), "h.0.attn.bias", "BOOL", "[4,4]",
               12, 12);
    f = fsc_st_open(tmp("lie.safetensors"), &rc);
    assert_null(f);
    assert_int_equal(rc, FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "data_offsets span"));
    /* a dtype nobody knows is refused, naming it */
    add_tensor(tmp("plain.safetensors"), tmp("odd.safetensors"), "x", "Q4", "[2]", 2, 2);
    assert_null(fsc_st_open(tmp("odd.safetensors"), &rc));
    assert_non_null(strstr(fsc_last_error(), "unknown dtype \"Q4\""));
    fsc_params_free(&ps), fsc_params_free(&ps2);
    fsc_module_free(m), fsc_module_free(m2);
}

static void test_wpe_leading_rows(void **state) {
    (void)state;
    fsc_module *big;
    fsc_params pb;
    save_gpt(tmp("long.safetensors"), 32, &big, &pb);
    fsc_gpt_config c = cfg_seq(8);
    fsc_module *m = fsc_gpt_new(&c);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 99, false, &ps), FSC_OK);
    assert_int_equal(fsc_weights_load(tmp("long.safetensors"), &ps, NULL), FSC_OK);
    assert_memory_equal(param_data(&ps, "wpe.weight"), param_data(&pb, "wpe.weight"),
                        sizeof(float) * 8 * 8); /* the first 8 of 32 rows */
    assert_memory_equal(param_data(&ps, "wte.weight"), param_data(&pb, "wte.weight"),
                        sizeof(float) * 16 * 8);
    /* fewer positions than the model's is still refused */
    fsc_gpt_config c2 = cfg_seq(64);
    fsc_module *m2 = fsc_gpt_new(&c2);
    fsc_params p2;
    assert_int_equal(fsc_params_bind(m2, 99, false, &p2), FSC_OK);
    assert_int_equal(fsc_weights_load(tmp("long.safetensors"), &p2, NULL), FSC_ERR_SHAPE);
    assert_non_null(strstr(fsc_last_error(), "wpe.weight has shape [32,8]"));
    fsc_params_free(&ps), fsc_params_free(&pb), fsc_params_free(&p2);
    fsc_module_free(m), fsc_module_free(big), fsc_module_free(m2);
}

int main(void) {
    (void)write_raw; /* tmpdir.h's, unused here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unused_bool_tensor_skipped),
        cmocka_unit_test(test_wpe_leading_rows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
