/* The file readers when memory runs out (issue 29, SQLite's malloc-failure
 * loop): each reader runs again and again on a valid input with its N-th
 * allocation failing, N = 1, 2, ... until a run makes fewer than N
 * allocations (then nothing failed and the reader must succeed). A run with
 * a failed allocation must return an error with a message (or, where the
 * reader degrades by design, succeed), never crash, and leave no allocation
 * of its own behind.
 *
 * How: the program is linked with -Wl,--wrap for malloc, calloc, realloc,
 * free, strdup, strndup, posix_memalign and aligned_alloc
 * (tests/CMakeLists.txt), so every allocation made by libfsc and by the
 * tools' reader files linked in (tools/plot_rows.c, tools/tokenize_input.c)
 * comes through __wrap_*; cJSON's are routed there by cJSON_InitHooks. The
 * wrappers count calls, fail the chosen one, and keep the set of live
 * pointers they handed out, so "no leak" is an exact count, in the Release
 * build as under ASan (whose own checks run underneath: __real_malloc is its
 * malloc). Allocations inside libc (fopen's buffer, getline) are not ours to
 * fail and are not counted.
 *
 * Readers: safetensors (open and read), llm.c token shards and byte files,
 * a checkpoint's state.json, the flat-shard layout, GPT-2's BPE files and a
 * Hugging Face tokenizer.json (loaded and encoding), fsc-plot's metrics
 * line, fsc-tokenize's input files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fsc/checkpoint.h"
#include "fsc/flat_shards.h"
#include "fsc/io.h"
#include "fsc/tokenizer.h"
#include "plot_rows.h"
#include "tmpdir.h"
#include "tokenize_input.h"

/* ---- the allocator shim -----------------------------------------------------------------------
 */

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

static long fail_at;  /* the allocation (1-based) that fails; 0: none */
static long calls;    /* allocations since the count was reset */
static long injected; /* failures handed out since then */

/* Live pointers handed out by the wrappers: an open-addressing set (a reader
 * holds far fewer than its size at once), tombstones for removed entries. */
#define LIVE_CAP (1u << 20)
#define TOMB ((void *)1)
static void *live[LIVE_CAP];
static long nlive;

static size_t slot(const void *p) {
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 44) & (LIVE_CAP - 1);
}

static void live_add(void *p) {
    if (!p) return;
    size_t i = slot(p);
    while (live[i] && live[i] != TOMB) i = (i + 1) & (LIVE_CAP - 1);
    live[i] = p, nlive++;
}

/* Removes p if the wrappers handed it out (libc's own allocations are freed
 * through free too: those are not in the set). */
static void live_remove(void *p) {
    if (!p) return;
    for (size_t i = slot(p); live[i]; i = (i + 1) & (LIVE_CAP - 1))
        if (live[i] == p) {
            live[i] = TOMB, nlive--;
            return;
        }
}

/* Whether this allocation is the one to fail. */
static bool fail_now(void) {
    if (++calls == fail_at) {
        injected++;
        return true;
    }
    return false;
}

/* p, recorded as live (NULL passes through). */
static void *track(void *p) {
    live_add(p);
    return p;
}

void *__wrap_malloc(size_t n) {
    return fail_now() ? NULL : track(__real_malloc(n));
}
void *__wrap_calloc(size_t k, size_t n) {
    return fail_now() ? NULL : track(__real_calloc(k, n));
}
char *__wrap_strdup(const char *s) {
    return fail_now() ? NULL : track(__real_strdup(s));
}
char *__wrap_strndup(const char *s, size_t n) {
    return fail_now() ? NULL : track(__real_strndup(s, n));
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    return fail_now() ? NULL : track(__real_aligned_alloc(align, n));
}

void *__wrap_realloc(void *old, size_t n) {
    if (fail_now()) return NULL; /* the old block stays valid, as realloc promises */
    void *p = __real_realloc(old, n);
    if (p || !n) live_remove(old);
    return track(p);
}

void __wrap_free(void *p) {
    live_remove(p);
    __real_free(p);
}

int __wrap_posix_memalign(void **out, size_t align, size_t n) {
    if (fail_now()) return 12; /* ENOMEM */
    int rc = __real_posix_memalign(out, align, n);
    if (!rc) live_add(*out);
    return rc;
}

/* ---- the loop ---------------------------------------------------------------------------------
 */

/* One reader run: FSC_OK, or an error (its message in fsc_last_error());
 * it frees whatever it got before returning. ctx: the reader's input. */
typedef int (*reader_fn)(const void *ctx);

/* Runs reader with allocation N failing for N = 1, 2, ... Returns how many
 * allocations the reader makes when nothing fails. may_succeed: a failure
 * the reader absorbs by design (it then returns FSC_OK) is allowed. */
static long failure_loop(const char *what, reader_fn reader, const void *ctx, bool may_succeed) {
    for (long n = 1;; n++) {
        const long before = nlive;
        calls = injected = 0, fail_at = n;
        fsc_clear_error();
        const int rc = reader(ctx);
        fail_at = 0;
        const long made = calls;
        if (nlive != before)
            fail_msg("%s: allocation %ld failing left %ld allocation(s) behind (rc %d: %s)", what,
                     n, nlive - before, rc, fsc_last_error());
        if (!injected) { /* the reader made fewer than n allocations: nothing failed */
            if (rc != FSC_OK)
                fail_msg("%s failed with no failed allocation: %s", what, fsc_last_error());
            print_message("%s: %ld allocations, each failed in turn\n", what, made);
            return made;
        }
        if (rc == FSC_OK && !may_succeed)
            fail_msg("%s: allocation %ld failed, yet the reader returned FSC_OK", what, n);
        if (rc != FSC_OK && !fsc_last_error()[0])
            fail_msg("%s: allocation %ld failed: error %d without a message", what, n, rc);
    }
}

/* ---- the readers ------------------------------------------------------------------------------
 */

static int read_safetensors(const void *ctx) {
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(ctx, &rc);
    if (!f) return rc;
    const fsc_st_entry *e = fsc_st_entry_at(f, 0);
    float *out = e ? malloc(e->nbytes) : NULL;
    if (e && !out) rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (out) {
        fsc_tensor t = {.data = out, .dtype = FSC_DTYPE_F32, .ndim = e->ndim};
        memcpy(t.shape, e->shape, sizeof t.shape);
        rc = fsc_st_read(f, e->name, &t);
    }
    free(out);
    fsc_st_close(f);
    return rc;
}

static int read_tokens(const void *ctx) {
    fsc_tokens tk;
    const int rc = fsc_tokens_load(ctx, &tk);
    if (!rc) fsc_tokens_free(&tk);
    return rc;
}

static int read_checkpoint(const void *ctx) {
    fsc_ckpt *c = NULL;
    const int rc = fsc_ckpt_open(ctx, &c);
    if (!rc) fsc_ckpt_close(c);
    return rc;
}

static int read_flat_layout(const void *ctx) {
    fsc_flat_layout L;
    int rank = -1;
    const int rc = fsc_flat_layout_read(ctx, &L, &rank);
    if (!rc) fsc_flat_layout_free(&L);
    return rc;
}

/* Loads a tokenizer (a directory or a tokenizer.json) and encodes a line. */
static int read_tokenizer(const void *ctx) {
    fsc_bpe *bpe = NULL;
    const char *path = ctx;
    int rc = strstr(path, ".json") ? fsc_bpe_load_json(path, &bpe) : fsc_bpe_load(path, &bpe);
    if (rc) return rc;
    int32_t *ids = NULL;
    int64_t n = 0;
    static const char text[] = "Hello world, the quick brown fox's tail.";
    rc = fsc_bpe_encode(bpe, text, sizeof text - 1, &ids, &n);
    free(ids);
    fsc_bpe_free(bpe);
    return rc;
}

static const char *const PLOT_KEYS[] = {"loss", "val_loss", "lr", "tokens_per_s"};

/* fsc-plot's line reader: a line it cannot rewrite or parse for want of
 * memory is counted as unreadable (-1), which fsc-plot reports in its
 * summary; a full parse must give the row's values. */
static int read_plot_row(const void *ctx) {
    double step = NAN, v[4];
    const int rc = plot_row_parse(ctx, PLOT_KEYS, 4, &step, v);
    if (rc == -1) return fsc_error(FSC_ERR_NOMEM, "metrics line unreadable");
    if (rc != 1 || step != 7 || v[0] != 2.5) return fsc_error(FSC_ERR_INVALID, "wrong row");
    return FSC_OK;
}

typedef struct {
    const char *path;
    const fsc_bpe *bpe;
} tokenize_ctx;

static int read_tokenize_input(const void *ctx) {
    const tokenize_ctx *t = ctx;
    tokenize_stream s = {0};
    double bytes = 0;
    const int rc = tokenize_encode_list(t->bpe, t->path, t->bpe != NULL, &s, &bytes);
    free(s.ids);
    return rc;
}

/* ---- the tests --------------------------------------------------------------------------------
 */

/* A test-data path in a static buffer. */
static const char *data_path(const char *name) {
    static char buf[4][512];
    static int k;
    const char *root = getenv("FSC_TEST_DATA");
    assert_non_null(root);
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static void test_io_readers(void **state) {
    (void)state;
    /* a golden file of the repository: metadata and several tensors */
    failure_loop("safetensors", read_safetensors, data_path("golden_linear_torch.safetensors"),
                 false);
    /* two llm.c shards (a comma list) and a byte file */
    uint16_t tok[300];
    for (int i = 0; i < 300; i++) tok[i] = (uint16_t)(i * 7 % 50257);
    assert_int_equal(fsc_shard_write(tmp("a.bin"), tok, 300), FSC_OK);
    assert_int_equal(fsc_shard_write(tmp("b.bin"), tok, 200), FSC_OK);
    char spec[1100];
    snprintf(spec, sizeof spec, "%s,%s", tmp("a.bin"), tmp("b.bin"));
    failure_loop("llm.c shards", read_tokens, spec, false);
    write_raw(tmp("book.txt"), "some bytes of text\n", 19);
    failure_loop("byte file", read_tokens, tmp("book.txt"), false);
}

static void test_checkpoint_and_shards(void **state) {
    (void)state;
    /* a checkpoint: two members, state.json and latest written by the library */
    const char *ck = tmp("ck");
    fsc_ckpt_writer *w = NULL;
    assert_int_equal(fsc_ckpt_begin(ck, 4, &w), FSC_OK);
    write_raw(fsc_ckpt_member(w, "model.bin"), "weights", 7);
    write_raw(fsc_ckpt_member(w, "optim.bin"), "state", 5);
    assert_int_equal(fsc_ckpt_set(w, "strategy", "\"oss\""), FSC_OK);
    assert_int_equal(fsc_ckpt_set(w, "lr", "{\"base\": 0.001, \"step\": [1, 2]}"), FSC_OK);
    assert_int_equal(fsc_ckpt_commit(w), FSC_OK);
    failure_loop("checkpoint state.json", read_checkpoint, ck, false);
    /* a flat shard with its layout metadata, as FSDP saves it */
    fsc_flat_unit units[2] = {{.name = "", .numel = 10, .shard = 5},
                              {.name = "h.0", .numel = 6, .shard = 3}};
    fsc_flat_param params[3] = {
        {.name = "wte.weight", .ndim = 2, .shape = {2, 4}, .unit = 0},
        {.name = "ln_f.bias", .ndim = 1, .shape = {2}, .unit = 0, .offset = 8},
        {.name = "h.0.w", .ndim = 2, .shape = {2, 3}, .unit = 1}};
    const fsc_flat_layout L = {
        .world = 2, .nunits = 2, .units = units, .nparams = 3, .params = params};
    const float s0[5] = {1, 2, 3, 4, 5}, s1[3] = {6, 7, 8};
    const float *const shards[2] = {s0, s1};
    const char *const keys[1] = {"note"}, *const values[1] = {"saved by the test"};
    assert_int_equal(fsc_flat_shard_save(tmp("shard.safetensors"), &L, 1, shards, 1, keys, values),
                     FSC_OK);
    failure_loop("flat layout", read_flat_layout, tmp("shard.safetensors"), false);
}

static void test_tokenizers(void **state) {
    (void)state;
    failure_loop("GPT-2 BPE files", read_tokenizer, data_path("bpe_tiny"), false);
    failure_loop("tokenizer.json", read_tokenizer, data_path("tokenizer_json/pairs.json"), false);
}

static void test_tool_readers(void **state) {
    (void)state;
    /* nan written bare: the reader's rewrite (plot_row_nonfinite_to_null) runs too. A
     * failure in the first parse is absorbed (the rewritten line parses), and then the
     * row must still come out right (read_plot_row checks it). */
    failure_loop("fsc-plot metrics line", read_plot_row,
                 "{\"step\": 7, \"loss\": 2.5, \"lr\": nan, \"tokens_per_s\": -inf}\n", true);
    write_raw(tmp("t1.txt"), "Hello world, the quick brown fox.\n", 34);
    write_raw(tmp("t2.txt"), "More text: 's tail.\n", 20);
    char list[1100];
    snprintf(list, sizeof list, "%s,%s", tmp("t1.txt"), tmp("t2.txt"));
    tokenize_ctx bytes = {.path = list};
    failure_loop("fsc-tokenize input, bytes", read_tokenize_input, &bytes, false);
    fsc_bpe *bpe = NULL;
    assert_int_equal(fsc_bpe_load(data_path("bpe_tiny"), &bpe), FSC_OK);
    tokenize_ctx bpe_ctx = {.path = list, .bpe = bpe};
    failure_loop("fsc-tokenize input, BPE with --eot", read_tokenize_input, &bpe_ctx, false);
    fsc_bpe_free(bpe);
}

int main(void) {
    /* cJSON's allocations through the wrappers as well (it is a shared library) */
    cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = __wrap_malloc, .free_fn = __wrap_free});
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_io_readers),
        cmocka_unit_test(test_checkpoint_and_shards),
        cmocka_unit_test(test_tokenizers),
        cmocka_unit_test(test_tool_readers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
