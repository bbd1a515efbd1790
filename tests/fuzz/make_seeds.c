/* Writes the seed corpora of tests/fuzz (run by hand after a format change:
 * `build-fuzz/tests/fuzz/fsc_fuzz_make_seeds tests/fuzz/corpus`), each seed a
 * small file the library itself wrote, plus hand-made variants: the readers'
 * formats as they really are, so the fuzzer starts past the first checks.
 * The BPE seeds are tests/data/bpe_tiny's files (found beside CORPUS_ROOT).
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_members.h"
#include "fsc/checkpoint.h"
#include "fsc/flat_shards.h"
#include "fsc/io.h"

static char out_root[512];

static void die(const char *what) {
    fprintf(stderr, "make_seeds: %s: %s\n", what, fsc_last_error());
    exit(1);
}

static void put(const char *harness, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_root, harness);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", out_root, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die(path);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) die(path);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void safetensors(const char *tmp) {
    char path[600];
    snprintf(path, sizeof path, "%s/st.safetensors", tmp);
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (!w) die("st writer");
    const float a[6] = {1, 2, 3, 4, 5, 6};
    const uint16_t h[3] = {0x3f80, 0x4000, 0xc040};
    const int64_t sa[2] = {2, 3}, sh[1] = {3}, sz[2] = {0, 4};
    if (fsc_st_writer_set_metadata(w, "format", "pt") ||
        fsc_st_writer_declare(w, "h.0.attn.c_attn.weight", FSC_DTYPE_F32, 2, sa) ||
        fsc_st_writer_declare(w, "ln_f.bias", FSC_DTYPE_BF16, 1, sh) ||
        fsc_st_writer_declare(w, "empty", FSC_DTYPE_F16, 2, sz) ||
        fsc_st_writer_declare(w, "scalar", FSC_DTYPE_F32, 0, sz) ||
        fsc_st_writer_write(w, "h.0.attn.c_attn.weight", a, sizeof a) ||
        fsc_st_writer_write(w, "ln_f.bias", h, sizeof h) ||
        fsc_st_writer_write(w, "scalar", a, sizeof(float)) || fsc_st_writer_close(w))
        die("st seed");
    size_t n;
    char *buf = slurp(path, &n);
    put("safetensors", "seed-written", buf, n);
    free(buf);
    const char hand[] = "\x20\0\0\0\0\0\0\0{\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                        "\"data_offsets\":[0,4]}}\0\0\x80\x3f";
    put("safetensors", "seed-hand", hand, sizeof hand - 1);
}

static void tokens(const char *tmp) {
    char path[600];
    snprintf(path, sizeof path, "%s/t.bin", tmp);
    const uint16_t tok[16] = {1, 50256, 3, 7, 0, 65535, 9, 9, 2, 4, 6, 8, 10, 12, 14, 16};
    if (fsc_shard_write(path, tok, 16)) die("shard seed");
    size_t n;
    char *buf = slurp(path, &n);
    put("tokens", "seed-shard", buf, n);
    free(buf);
    put("tokens", "seed-text", "hello, fsc\n", 11);
    /* version 7 (uint32 tokens): magic 20240801, 3 tokens; and nanoGPT's raw uint16 */
    unsigned char v7[1024 + 12] = {0xa1, 0xd9, 0x34, 0x01, 7, 0, 0, 0, 3, 0, 0, 0};
    /* 1, 50257 and the largest id a stream may hold, 2^31 - 2 */
    const unsigned char ids[12] = {1, 0, 0, 0, 0x51, 0xc4, 0, 0, 0xfe, 0xff, 0xff, 0x7f};
    memcpy(v7 + 1024, ids, sizeof ids);
    put("tokens", "seed-v7", v7, sizeof v7);
    put("tokens", "seed-nanogpt", "\x01\x00\x50\xc4\xff\xff\x09\x00", 8);
}

/* tests/data/bpe_tiny's files as the harness's parts (FF FF between). */
static void bpe(void) {
    char path[1100];
    size_t ne, nm;
    snprintf(path, sizeof path, "%s/../../data/bpe_tiny/encoder.json", out_root);
    char *enc = slurp(path, &ne);
    snprintf(path, sizeof path, "%s/../../data/bpe_tiny/vocab.bpe", out_root);
    char *merges = slurp(path, &nm);
    const char text[] = "hello world, it's 2020: aaaaa  b\xc3\xa9\xff\n\t \xe2\x80\x83x";
    char *buf = malloc(ne + nm + sizeof text + 8);
    if (!buf) die("bpe seed");
    size_t k = 0;
#define ADD(p, n) (memcpy(buf + k, p, n), k += (n))
    ADD(enc, ne), ADD("\xff\xff", 2), ADD(merges, nm), ADD("\xff\xff", 2);
    ADD(text, sizeof text - 1);
    put("bpe", "seed-tiny", buf, k);
    /* "+": the harness writes the 256 byte tokens; the seed gives the rest */
    const char *tail = strstr(enc, ", \"ll\": 256");
    if (!tail) die("bpe_tiny encoder.json without \"ll\": 256");
    k = 0;
    ADD("+", 1), ADD(tail, strlen(tail)), ADD("\xff\xff", 2), ADD(merges, nm);
    ADD("\xff\xff", 2), ADD(text, sizeof text - 1);
    put("bpe", "seed-base", buf, k);
    k = 0;
    const char empty[] = "+}\xff\xff#version: 0.2\n\xff\xff";
    ADD(empty, sizeof empty - 1), ADD(text, sizeof text - 1);
    put("bpe", "seed-bytes-only", buf, k);
#undef ADD
    free(buf), free(enc), free(merges);
}

/* A --config file and, after FF FF, a Hugging Face config.json (fsc-train --save's). */
static void config(void) {
    const char flags[] =
        "{\"strategy\": \"fsdp\", \"layers\": 2, \"d_model\": 64, \"heads\": 2, \"seq\": 32,\n"
        " \"vocab\": 256, \"dropout\": 0.1, \"lr\": 3e-4, \"schedule\": \"cosine\",\n"
        " \"warmup\": 10,"
        " \"steps\": 100, \"seed\": \"18446744073709551615\", \"checkpoint-activations\": true,\n"
        " \"mixed-precision\": \"bf16\", \"balance\": null, \"data\": \"a \\\"q\\\" \\\\ b\"}";
    const char hf[] =
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
        "  \"vocab_size\": 8,\n  \"n_positions\": 32,\n  \"n_ctx\": 32,\n  \"n_embd\": 4,\n"
        "  \"n_layer\": 1,\n  \"n_head\": 2,\n  \"n_inner\": null\n}\n";
    char buf[2048];
    int k = snprintf(buf, sizeof buf, "%s\xff\xff%s", flags, hf);
    put("config", "seed-flags-hf", buf, (size_t)k);
    k = snprintf(buf, sizeof buf,
                 "{\"optimizer\": \"sgd\", \"momentum\": 0.9}\xff\xff"
                 "{\"n_embd\": 4, \"n_layer\": 3}");
    put("config", "seed-no-heads", buf, (size_t)k);
    /* regression (issue 13): "n_layer": 61e40064 (INT_MAX layers) made --init-from look
     * for a MoE gate in each of 2^31 blocks */
    k = snprintf(buf, sizeof buf, "{}\xff\xff{\"n_embd\": 4, \"n_layer\": 61e40064}");
    put("config", "regress-layers-61e40064", buf, (size_t)k);
    /* regression (issue 13): a --seed of 1e15 or more was stored as a JSON number that
     * read back as "2e+15", so a checkpoint's flags did not load */
    k = snprintf(buf, sizeof buf, "{\"seed\": \"2000000000000000\"}\xff\xff{}");
    put("config", "regress-seed-2e15", buf, (size_t)k);
}

static void state_json(const char *tmp) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/ck", tmp);
    fsc_ckpt_writer *w;
    if (fsc_ckpt_begin(dir, FUZZ_STEP, &w)) die("ckpt begin");
    char member_dir[700];
    snprintf(member_dir, sizeof member_dir, "%s", fsc_ckpt_member(w, "a.bin"));
    *strrchr(member_dir, '/') = '\0';
    if (fuzz_write_members(member_dir) || fsc_ckpt_set(w, "optimizer", "\"adamw\"") ||
        fsc_ckpt_set(w, "lr", "0.0003") || fsc_ckpt_set(w, "model", "{\"layers\": 2}") ||
        fsc_ckpt_commit(w))
        die("ckpt seed");
    snprintf(path, sizeof path, "%s/step-%06d/state.json", dir, FUZZ_STEP);
    size_t n;
    char *text = slurp(path, &n);
    put("state_json", "seed-written", text, n);
    /* without its self-checksum (older checkpoints): mutations are not all refused by it */
    char *sum = strstr(text, "\"state_crc32\"");
    char *comma = sum ? sum : NULL;
    while (comma && comma > text && *comma != ',') comma--;
    if (!comma || comma == text) die("state.json seed without state_crc32");
    strcpy(comma, "\n}\n");
    put("state_json", "seed-nosum", text, strlen(text));
    /* regression (issue 13): a step far outside int64 was undefined behaviour */
    char *step = strstr(text, "\"step\"");
    char *colon = step ? strchr(step, ':') : NULL, *end = colon ? strpbrk(colon, ",}") : NULL;
    if (!end) die("state.json seed without a step");
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s: 61e300%s", (int)(colon - text), text, end);
    put("state_json", "regress-step-61e300", buf, strlen(buf));
    free(text);
}

static void flat_layout(const char *tmp) {
    fsc_flat_unit units[2] = {{.name = "", .numel = 5, .shard = 3},
                              {.name = "h.0", .numel = 4, .shard = 2}};
    fsc_flat_param params[3] = {
        {.name = "wte.weight", .ndim = 2, .shape = {2, 2}, .unit = 0, .offset = 0},
        {.name = "ln_f.bias", .ndim = 1, .shape = {1}, .unit = 0, .offset = 4},
        {.name = "h.0.mlp.c_fc.weight", .ndim = 1, .shape = {4}, .unit = 1, .offset = 0}};
    fsc_flat_layout L = {.world = 2, .nunits = 2, .units = units, .nparams = 3, .params = params};
    const float s0[3] = {1, 2, 3}, s1[2] = {4, 5};
    const float *shards[2] = {s0, s1};
    const char *keys[1] = {"fsc.step"}, *values[1] = {"6"};
    char path[600];
    snprintf(path, sizeof path, "%s/shard.safetensors", tmp);
    if (fsc_flat_shard_save(path, &L, 1, shards, 1, keys, values)) die("flat seed");
    size_t n;
    char *buf = slurp(path, &n);
    put("flat_layout", "seed-file", buf, n);
    free(buf);
    int rc;
    fsc_st_file *f = fsc_st_open(path, &rc);
    const char *layout = f ? fsc_st_metadata(f, FSC_FLAT_LAYOUT_KEY) : NULL;
    if (!layout) die("flat seed layout");
    put("flat_layout", "seed-layout-json", layout, strlen(layout));
    fsc_st_close(f);
}

static int rm_entry(const char *p, const struct stat *s, int flag, struct FTW *ftw) {
    (void)s, (void)flag, (void)ftw;
    return remove(p);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_ROOT (tests/fuzz/corpus)\n", argv[0]);
        return 2;
    }
    snprintf(out_root, sizeof out_root, "%s", argv[1]);
    mkdir(out_root, 0755);
    char tmp[] = "/tmp/fsc_seeds_XXXXXX";
    if (!mkdtemp(tmp)) die("mkdtemp");
    safetensors(tmp);
    tokens(tmp);
    state_json(tmp);
    flat_layout(tmp);
    bpe();
    config();
    nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("seeds written under %s\n", out_root);
    return 0;
}
