/* safetensors: round trips, conversion on read, the streaming writer's rules,
 * atomic saves, and malformed files (each with its own clear error), plus a
 * mutation fuzz loop in which every open must succeed or fail cleanly. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/io.h"

#include "tmpdir.h"
#include "test_main.h"

static size_t read_raw(const char *path, unsigned char *buf, size_t cap) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    size_t n = fread(buf, 1, cap, fp);
    fclose(fp);
    return n;
}

/* A file with header length `hlen` (as given), header text, and ndata zero bytes. */
static void write_st(const char *path, uint64_t hlen, const char *header, size_t ndata) {
    size_t hn = strlen(header), total = 8 + hn + ndata;
    unsigned char *b = calloc(total, 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, hn);
    write_raw(path, b, total);
    free(b);
}

static void expect_open_fails(const char *path, int status, const char *needle) {
    int rc = 12345;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (f || rc != status || !strstr(fsc_last_error(), needle))
        print_error("file %s: status %d (want %d), message \"%s\" (want \"%s\")\n", path, rc,
                    status, fsc_last_error(), needle);
    assert_null(f);
    assert_int_equal(rc, status);
    assert_non_null(strstr(fsc_last_error(), needle));
}

static void expect_header_fails(const char *header, size_t ndata, int status, const char *needle) {
    write_st(tmp("bad.safetensors"), strlen(header), header, ndata);
    expect_open_fails(tmp("bad.safetensors"), status, needle);
}

/* ---- round trips ------------------------------------------------------------------ */

static void test_round_trip(void **state) {
    (void)state;
    float a[6] = {1, -2, 3.5f, 0.25f, -1e3f, 7};
    uint16_t b[4] = {fsc_f32_to_bf16(1.5f), fsc_f32_to_bf16(-2.f), 0, fsc_f32_to_bf16(3.f)};
    uint16_t h[8];
    for (int i = 0; i < 8; i++) h[i] = fsc_f32_to_f16((float)i / 4);
    int32_t c[3] = {-1, 0, 2147483647};
    int64_t d[2] = {-5, 1ll << 40};
    uint16_t u[5] = {0, 1, 2, 65535, 7};
    float s = 42.f, empty[1];
    fsc_tensor t[] = {
        fsc_tensor_2d(a, FSC_DTYPE_F32, 2, 3),       fsc_tensor_1d(b, FSC_DTYPE_BF16, 4),
        fsc_tensor_3d(h, FSC_DTYPE_F16, 2, 2, 2),    fsc_tensor_1d(c, FSC_DTYPE_I32, 3),
        fsc_tensor_1d(d, FSC_DTYPE_I64, 2),          fsc_tensor_4d(u, FSC_DTYPE_U16, 1, 5, 1, 1),
        fsc_tensor_make(&s, FSC_DTYPE_F32, 0, NULL), fsc_tensor_2d(empty, FSC_DTYPE_F32, 0, 3),
    };
    const char *names[] = {
        "h.0.attn.c_attn.weight", "b\"quoted\\", "half", "ints", "longs", "u16", "scalar", "empty"};
    const char *meta[] = {"format", "pt", "note", "tab\there", NULL};
    assert_int_equal(fsc_st_save(tmp("rt.safetensors"), 8, names, t, meta), FSC_OK);

    unsigned char raw[4096];
    size_t n = read_raw(tmp("rt.safetensors"), raw, sizeof raw);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    assert_int_equal(hlen % 8, 0); /* padded like the reference implementation */
    assert_int_equal(n, 8 + hlen + 24 + 8 + 16 + 12 + 16 + 10 + 4);

    int rc;
    fsc_st_file *f = fsc_st_open(tmp("rt.safetensors"), &rc);
    assert_non_null(f);
    assert_int_equal(fsc_st_count(f), 8);
    assert_string_equal(fsc_st_metadata(f, "format"), "pt");
    assert_string_equal(fsc_st_metadata(f, "note"), "tab\there");
    assert_null(fsc_st_metadata(f, "missing"));
    assert_int_equal(fsc_st_metadata_count(f), 2);
    unsigned char buf[64];
    for (int i = 0; i < 8; i++) {
        const fsc_st_entry *e = fsc_st_find(f, names[i]);
        assert_non_null(e);
        assert_int_equal(e->dtype, t[i].dtype);
        assert_int_equal(e->ndim, t[i].ndim);
        assert_int_equal(e->nbytes, fsc_tensor_nbytes(&t[i]));
        fsc_tensor dst = t[i];
        dst.data = buf;
        assert_int_equal(fsc_st_read(f, names[i], &dst), FSC_OK);
        assert_memory_equal(buf, t[i].data, e->nbytes);
    }
    /* entries come in offset order, which is declaration order for our writer */
    assert_string_equal(fsc_st_entry_at(f, 0)->name, names[0]);
    assert_null(fsc_st_entry_at(f, 8));
    /* a slice of raw bytes */
    float mid[2];
    assert_int_equal(fsc_st_read_bytes(f, fsc_st_find(f, names[0]), 8, mid, 8), FSC_OK);
    assert_true(mid[0] == 3.5f && mid[1] == 0.25f);
    assert_int_equal(fsc_st_read_bytes(f, fsc_st_find(f, names[0]), 20, mid, 8), FSC_ERR_INVALID);
    fsc_st_close(f);
}

static void test_read_converts_and_checks(void **state) {
    (void)state;
    uint16_t b[6];
    float want[6] = {1.5f, -2.f, 0.f, 3.f, 0.0078125f, -100.f}, got[6];
    for (int i = 0; i < 6; i++) b[i] = fsc_f32_to_bf16(want[i]);
    fsc_tensor t = fsc_tensor_2d(b, FSC_DTYPE_BF16, 2, 3);
    int32_t ints[2] = {1, 2};
    fsc_tensor ti = fsc_tensor_1d(ints, FSC_DTYPE_I32, 2);
    const char *names[] = {"w", "i"};
    fsc_tensor ts[] = {t, ti};
    assert_int_equal(fsc_st_save(tmp("bf.safetensors"), 2, names, ts, NULL), FSC_OK);
    int rc;
    fsc_st_file *f = fsc_st_open(tmp("bf.safetensors"), &rc);
    assert_non_null(f);
    fsc_tensor dst = fsc_tensor_2d(got, FSC_DTYPE_F32, 2, 3);
    assert_int_equal(fsc_st_read(f, "w", &dst), FSC_OK);
    assert_memory_equal(got, want, sizeof want);

    fsc_tensor wrong = fsc_tensor_2d(got, FSC_DTYPE_F32, 3, 2);
    assert_int_equal(fsc_st_read(f, "w", &wrong), FSC_ERR_SHAPE);
    assert_non_null(strstr(fsc_last_error(), "\"w\" has shape [2, 3] in the file"));
    assert_non_null(strstr(fsc_last_error(), "[3, 2]"));
    fsc_tensor fi = fsc_tensor_1d(got, FSC_DTYPE_F32, 2);
    assert_int_equal(fsc_st_read(f, "i", &fi), FSC_ERR_DTYPE);
    assert_non_null(strstr(fsc_last_error(), "\"i\" is I32"));
    assert_int_equal(fsc_st_read(f, "nope", &fi), FSC_ERR_NOT_FOUND);
    assert_non_null(strstr(fsc_last_error(), "no tensor named \"nope\""));
    fsc_st_close(f);

    /* F32 in memory, saved as F16 via write_tensor, read back as F32 */
    fsc_st_writer *w = fsc_st_writer_open(tmp("f16.safetensors"), &rc);
    assert_non_null(w);
    assert_int_equal(fsc_st_writer_declare(w, "x", FSC_DTYPE_F16, 1, (int64_t[]){6}), FSC_OK);
    fsc_tensor src = fsc_tensor_1d(want, FSC_DTYPE_F32, 6);
    assert_int_equal(fsc_st_writer_write_tensor(w, "x", &src), FSC_OK);
    assert_int_equal(fsc_st_writer_close(w), FSC_OK);
    f = fsc_st_open(tmp("f16.safetensors"), &rc);
    assert_non_null(f);
    assert_int_equal(fsc_st_find(f, "x")->dtype, FSC_DTYPE_F16);
    fsc_tensor back = fsc_tensor_1d(got, FSC_DTYPE_F32, 6);
    assert_int_equal(fsc_st_read(f, "x", &back), FSC_OK);
    assert_memory_equal(got, want, sizeof want); /* all exactly representable in f16 */
    fsc_st_close(f);
}

/* ---- the streaming writer ----------------------------------------------------------- */

static void test_writer_streams_in_order(void **state) {
    (void)state;
    int rc;
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    fsc_st_writer *w = fsc_st_writer_open(tmp("stream.safetensors"), &rc);
    assert_non_null(w);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){4}), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "z", FSC_DTYPE_F32, 1, (int64_t[]){0}), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "b", FSC_DTYPE_F32, 1, (int64_t[]){2}), FSC_OK);
    assert_int_equal(fsc_st_writer_set_metadata(w, "step", "10"), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "a", a, 8), FSC_OK); /* in two chunks */
    assert_int_equal(fsc_st_writer_write(w, "a", a + 2, 8), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "b", b, 8), FSC_OK);
    assert_int_equal(fsc_st_writer_close(w), FSC_OK);
    fsc_st_file *f = fsc_st_open(tmp("stream.safetensors"), &rc);
    assert_non_null(f);
    assert_int_equal(fsc_st_count(f), 3);
    assert_string_equal(fsc_st_metadata(f, "step"), "10");
    float got[2];
    fsc_tensor t = fsc_tensor_1d(got, FSC_DTYPE_F32, 2);
    assert_int_equal(fsc_st_read(f, "b", &t), FSC_OK);
    assert_true(got[0] == 5 && got[1] == 6);
    fsc_st_close(f);

    /* out of order, too many bytes, late declarations: each a clear error, and sticky */
    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){4}), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){4}),
                     FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "declared twice"));
    assert_int_equal(fsc_st_writer_close(w), FSC_ERR_INVALID);
    assert_int_equal(access(tmp("order.safetensors"), F_OK), -1);

    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){4}), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "b", FSC_DTYPE_F32, 1, (int64_t[]){2}), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "b", b, 8), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "next in declaration order is \"a\""));
    assert_int_equal(fsc_st_writer_write(w, "a", a, 16), FSC_ERR_INVALID); /* sticky */
    assert_non_null(strstr(fsc_last_error(), "out of order"));
    fsc_st_writer_abort(w);

    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){1}), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "a", a, 8), FSC_ERR_SHAPE);
    assert_non_null(strstr(fsc_last_error(), "only 4 remain"));
    fsc_st_writer_abort(w);

    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "a", FSC_DTYPE_F32, 1, (int64_t[]){1}), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "a", a, 4), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "c", FSC_DTYPE_F32, 1, (int64_t[]){1}),
                     FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "after data writing began"));
    assert_int_equal(fsc_st_writer_close(w), FSC_ERR_INVALID);
    assert_int_equal(fsc_st_writer_declare(NULL, "a", FSC_DTYPE_F32, 0, NULL), FSC_ERR_INVALID);

    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "neg", FSC_DTYPE_F32, 1, (int64_t[]){-1}),
                     FSC_ERR_SHAPE);
    fsc_st_writer_abort(w);
    w = fsc_st_writer_open(tmp("order.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "__metadata__", FSC_DTYPE_F32, 0, NULL),
                     FSC_ERR_INVALID);
    fsc_st_writer_abort(w);
    assert_int_equal(access(tmp("order.safetensors"), F_OK), -1);

    assert_null(fsc_st_writer_open("/nonexistent-dir/x.safetensors", &rc));
    assert_int_equal(rc, FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), "/nonexistent-dir/x.safetensors"));
}

static int count_temps(void) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_atomic_write_keeps_old_file(void **state) {
    (void)state;
    float a[3] = {1, 2, 3};
    fsc_tensor t = fsc_tensor_1d(a, FSC_DTYPE_F32, 3);
    const char *name = "a";
    assert_int_equal(fsc_st_save(tmp("keep.safetensors"), 1, &name, &t, NULL), FSC_OK);
    unsigned char before[512], after[512];
    size_t nb = read_raw(tmp("keep.safetensors"), before, sizeof before);

    int rc;
    fsc_st_writer *w = fsc_st_writer_open(tmp("keep.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "x", FSC_DTYPE_F32, 1, (int64_t[]){3}), FSC_OK);
    assert_int_equal(fsc_st_writer_declare(w, "y", FSC_DTYPE_F32, 1, (int64_t[]){3}), FSC_OK);
    assert_int_equal(fsc_st_writer_write(w, "x", a, 12), FSC_OK);
    assert_int_equal(count_temps(), 1); /* the work goes to a temporary */
    assert_int_equal(fsc_st_writer_close(w), FSC_ERR_INVALID);
    assert_non_null(strstr(fsc_last_error(), "\"y\" was declared but only 0 of its 12 bytes"));
    assert_int_equal(read_raw(tmp("keep.safetensors"), after, sizeof after), nb);
    assert_memory_equal(before, after, nb);
    assert_int_equal(count_temps(), 0);

    /* a save whose tensor cannot be converted fails the same way */
    int32_t ints[3] = {1, 2, 3};
    w = fsc_st_writer_open(tmp("keep.safetensors"), &rc);
    assert_int_equal(fsc_st_writer_declare(w, "x", FSC_DTYPE_BF16, 1, (int64_t[]){3}), FSC_OK);
    fsc_tensor ti = fsc_tensor_1d(ints, FSC_DTYPE_I32, 3);
    assert_int_equal(fsc_st_writer_write_tensor(w, "x", &ti), FSC_ERR_DTYPE);
    assert_int_equal(fsc_st_writer_close(w), FSC_ERR_DTYPE);
    assert_int_equal(read_raw(tmp("keep.safetensors"), after, sizeof after), nb);
    assert_memory_equal(before, after, nb);
    assert_int_equal(count_temps(), 0);

    /* and a successful save replaces it */
    a[0] = 9;
    assert_int_equal(fsc_st_save(tmp("keep.safetensors"), 1, &name, &t, NULL), FSC_OK);
    read_raw(tmp("keep.safetensors"), after, sizeof after);
    assert_memory_not_equal(before, after, nb);
    assert_int_equal(count_temps(), 0);
}

/* ---- malformed files ------------------------------------------------------------------ */

#define ENTRY(dt, shape, offs)                                                                     \
    "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static void test_malformed_lengths(void **state) {
    (void)state;
    write_raw(tmp("empty"), "", 0);
    expect_open_fails(tmp("empty"), FSC_ERR_FORMAT, "is 0 bytes, too short");
    write_raw(tmp("seven"), "\x02\0\0\0\0\0\0", 7);
    expect_open_fails(tmp("seven"), FSC_ERR_FORMAT, "is 7 bytes, too short");
    write_st(tmp("zero"), 0, "{}", 0);
    expect_open_fails(tmp("zero"), FSC_ERR_FORMAT, "header length 0 is too small");
    write_st(tmp("long"), 1000, "{}", 10);
    expect_open_fails(tmp("long"), FSC_ERR_FORMAT, "header length 1000 is larger than the file");
    write_st(tmp("huge"), 1ull << 60, "{}", 0);
    expect_open_fails(tmp("huge"), FSC_ERR_FORMAT, "exceeds the 100000000-byte limit");
    write_st(tmp("max"), UINT64_MAX, "{}", 0);
    expect_open_fails(tmp("max"), FSC_ERR_FORMAT, "exceeds");
    expect_open_fails(tmp("does-not-exist"), FSC_ERR_IO, "cannot open");
    expect_open_fails(dir, FSC_ERR_IO, "not a regular file");
}

static void test_malformed_json(void **state) {
    (void)state;
    expect_header_fails("{not json}", 0, FSC_ERR_FORMAT, "not valid JSON");
    expect_header_fails("[1, 2]", 0, FSC_ERR_FORMAT, "must be a JSON object");
    expect_header_fails("\"str\"", 0, FSC_ERR_FORMAT, "must be a JSON object");
    expect_header_fails("{}garbage", 0, FSC_ERR_FORMAT, "unexpected bytes after the JSON header");
    expect_header_fails("{\"a\":", 0, FSC_ERR_FORMAT, "not valid JSON");
    char deep[6002];
    memset(deep, '[', 6000);
    deep[6000] = ']';
    deep[6001] = '\0';
    expect_header_fails(deep, 0, FSC_ERR_FORMAT, "not valid JSON");
}

static void test_malformed_entries(void **state) {
    (void)state;
    /* each header (ndata bytes of data after it) with the status and the
     * words its refusal must give */
    static const struct {
        const char *header;
        size_t ndata;
        int status;
        const char *needle;
    } cases[] = {
        {"{\"a\": 5}", 0, FSC_ERR_FORMAT, "tensor \"a\" must be a JSON object"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FSC_ERR_FORMAT,
         "tensor \"a\" has no \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, FSC_ERR_FORMAT,
         "tensor \"a\" has no \"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, FSC_ERR_FORMAT,
         "tensor \"a\" has no \"data_offsets\""},
        {"{\"a\":" ENTRY("F8_E4M3", "[1]", "[0,1]") "}", 1, FSC_ERR_DTYPE,
         "unknown dtype \"F8_E4M3\""},
        {"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FSC_ERR_FORMAT,
         "\"dtype\" must be a string"},
        {"{\"a\":" ENTRY("F32", "[-1]", "[0,4]") "}", 4, FSC_ERR_FORMAT,
         "shape[0] must be a non-negative integer"},
        {"{\"a\":" ENTRY("F32", "[2, 2.5]", "[0,4]") "}", 4, FSC_ERR_FORMAT,
         "shape[1] must be a non-negative integer"},
        {"{\"a\":" ENTRY("F32", "[\"2\"]", "[0,8]") "}", 8, FSC_ERR_FORMAT,
         "shape[0] must be a non-negative integer"},
        {"{\"a\":" ENTRY("F32", "4", "[0,16]") "}", 16, FSC_ERR_FORMAT,
         "\"shape\" must be an array"},
        {"{\"a\":" ENTRY("F32", "[1,1,1,1,1]", "[0,4]") "}", 4, FSC_ERR_UNSUPPORTED,
         "has 5 dims; fsc tensors have at most 4"},
        {"{\"a\":" ENTRY("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, FSC_ERR_FORMAT,
         "has 9 dims (at most 8)"},
        {"{\"a\":" ENTRY("F32", "[4294967296,4294967296,4294967296]", "[0,4]") "}", 4,
         FSC_ERR_FORMAT, "the product of its shape overflows"},
        {"{\"a\":" ENTRY("F32", "[4294967296,2147483648]", "[0,4]") "}", 4, FSC_ERR_FORMAT,
         "elements of F32 overflow a 64-bit byte count"},
        {"{\"a\":" ENTRY("F32", "[1e300]", "[0,4]") "}", 4, FSC_ERR_FORMAT,
         "shape[0] must be a non-negative integer"},
        {"{\"a\":" ENTRY("F32", "[1]", "[8,4]") "}", 8, FSC_ERR_FORMAT,
         "data_offsets begin 8 > end 4"},
        {"{\"a\":" ENTRY("F32", "[2]", "[0,8]") "}", 4, FSC_ERR_FORMAT,
         "data ends at byte 8 but the data region has only 4 bytes"},
        {"{\"a\":" ENTRY("F32", "[3]", "[0,8]") "}", 8, FSC_ERR_FORMAT,
         "shape holds 3 elements of F32 (12 bytes) but data_offsets span 8 bytes"},
        {"{\"a\":" ENTRY("F32", "[1]", "[0]") "}", 4, FSC_ERR_FORMAT,
         "\"data_offsets\" must be an array of 2 integers"},
        {"{\"a\":" ENTRY("F32", "[1]", "[0,4,8]") "}", 8, FSC_ERR_FORMAT,
         "\"data_offsets\" must be an array of 2 integers"},
        {"{\"a\":" ENTRY("F32", "[1]", "{\"b\":0}") "}", 8, FSC_ERR_FORMAT,
         "\"data_offsets\" must be an array of 2 integers"},
        {"{\"a\":" ENTRY("F32", "[1]", "[-4,0]") "}", 4, FSC_ERR_FORMAT,
         "data_offsets must be non-negative integers"},
        {"{\"a\":" ENTRY("F32", "[1]", "[0.5,4.5]") "}", 8, FSC_ERR_FORMAT,
         "data_offsets must be non-negative integers"},
        {"{\"a\":" ENTRY("F32", "[1]", "[0,4]") ",\"b\":" ENTRY("F32", "[2]", "[2,10]") "}", 12,
         FSC_ERR_FORMAT, "tensors \"a\" and \"b\" overlap"},
        {"{\"a\":" ENTRY("F32", "[4]", "[0,16]") ",\"b\":" ENTRY("F32", "[1]", "[4,8]") "}", 16,
         FSC_ERR_FORMAT, "tensors \"a\" and \"b\" overlap"},
        {"{\"a\":" ENTRY("F32", "[1]", "[0,4]") ",\"a\":" ENTRY("F32", "[1]", "[4,8]") "}", 8,
         FSC_ERR_FORMAT, "duplicate tensor name \"a\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_header_fails(cases[i].header, cases[i].ndata, cases[i].status, cases[i].needle);
}

static void test_malformed_metadata_and_data(void **state) {
    (void)state;
    expect_header_fails("{\"__metadata__\":{\"k\":1}}", 0, FSC_ERR_FORMAT,
                        "metadata \"k\" must be a string");
    expect_header_fails("{\"__metadata__\":[\"k\"]}", 0, FSC_ERR_FORMAT,
                        "\"__metadata__\" must be an object of strings");
    expect_header_fails("{\"__metadata__\":{},\"__metadata__\":{}}", 0, FSC_ERR_FORMAT,
                        "duplicate \"__metadata__\"");
    expect_header_fails("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, FSC_ERR_FORMAT,
                        "duplicate metadata key \"k\"");
    /* a valid file cut short in its data */
    float a[8] = {0};
    fsc_tensor t = fsc_tensor_1d(a, FSC_DTYPE_F32, 8);
    const char *name = "w";
    assert_int_equal(fsc_st_save(tmp("full.safetensors"), 1, &name, &t, NULL), FSC_OK);
    unsigned char buf[512];
    size_t n = read_raw(tmp("full.safetensors"), buf, sizeof buf);
    write_raw(tmp("cut.safetensors"), buf, n - 5);
    expect_open_fails(tmp("cut.safetensors"), FSC_ERR_FORMAT, "(truncated file?)");
    /* valid edge cases: empty header, only metadata, trailing bytes, spaces */
    write_st(tmp("ok1"), 2, "{}", 0);
    const char *only_meta = "{\"__metadata__\":{\"a\":\"b\"}}         ";
    write_st(tmp("ok2"), strlen(only_meta), only_meta, 100);
    int rc;
    fsc_st_file *f = fsc_st_open(tmp("ok1"), &rc);
    assert_non_null(f);
    assert_int_equal(fsc_st_count(f), 0);
    fsc_st_close(f);
    f = fsc_st_open(tmp("ok2"), &rc);
    assert_non_null(f);
    assert_string_equal(fsc_st_metadata(f, "a"), "b");
    fsc_st_close(f);
}

/* ---- fuzz ------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x123456789abcdefull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* One mutation: a random byte, a digit for another digit (keeps JSON valid but
 * lies about shapes and offsets), a length byte, or a truncation. */
static size_t mutate(unsigned char *b, size_t n, size_t hend) {
    if (n <= 8 || hend <= 8) return n;
    switch (rnd(4)) {
    case 0:
        b[rnd((uint32_t)n)] = (unsigned char)rnd(256);
        return n;
    case 1:
        for (int tries = 0; tries < 50; tries++) {
            size_t i = 8 + rnd((uint32_t)(hend - 8));
            if (b[i] >= '0' && b[i] <= '9') {
                b[i] = (unsigned char)('0' + rnd(10));
                break;
            }
        }
        return n;
    case 2:
        b[rnd(8)] = (unsigned char)rnd(256);
        return n;
    default:
        return rnd((uint32_t)n + 1);
    }
}

static void test_fuzz_mutations(void **state) {
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[4] = {1, 2, 3, 4};
    int32_t c[2] = {7, 8};
    fsc_tensor t[] = {fsc_tensor_2d(a, FSC_DTYPE_F32, 2, 3), fsc_tensor_1d(h, FSC_DTYPE_BF16, 4),
                      fsc_tensor_1d(c, FSC_DTYPE_I32, 2)};
    const char *names[] = {"wte", "ln.w", "idx"};
    const char *meta[] = {"format", "pt", NULL};
    assert_int_equal(fsc_st_save(tmp("seed.safetensors"), 3, names, t, meta), FSC_OK);
    unsigned char orig[1024], buf[1024];
    size_t n = read_raw(tmp("seed.safetensors"), orig, sizeof orig);
    size_t hend = 8 + (size_t)orig[0] + ((size_t)orig[1] << 8);
    size_t work = fsc_mem_current(FSC_MEM_WORK);
    int ok = 0, bad = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, orig, n);
        size_t m = n;
        for (int k = 1 + (int)rnd(3); k > 0; k--) m = mutate(buf, m, hend < m ? hend : m);
        write_raw(tmp("fuzz.safetensors"), buf, m);
        int rc = 1;
        fsc_st_file *f = fsc_st_open(tmp("fuzz.safetensors"), &rc);
        if (!f) {
            assert_true(rc < 0);
            assert_true(strlen(fsc_last_error()) > 0);
            bad++;
            continue;
        }
        assert_int_equal(rc, FSC_OK);
        ok++;
        for (int i = 0; i < fsc_st_count(f); i++) { /* every validated entry is readable */
            const fsc_st_entry *e = fsc_st_entry_at(f, i);
            assert_true(e->offset + e->nbytes <= m);
            unsigned char *dst = malloc(e->nbytes + 1);
            fsc_tensor d = fsc_tensor_make(dst, e->dtype, e->ndim, e->shape);
            assert_int_equal(fsc_st_read(f, e->name, &d), FSC_OK);
            free(dst);
        }
        fsc_st_close(f);
    }
    assert_true(ok > 0 && bad > 0);
    assert_int_equal(fsc_mem_current(FSC_MEM_WORK), work);
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_round_trip),
              cmocka_unit_test(test_read_converts_and_checks),
              cmocka_unit_test(test_writer_streams_in_order),
              cmocka_unit_test(test_atomic_write_keeps_old_file),
              cmocka_unit_test(test_malformed_lengths), cmocka_unit_test(test_malformed_json),
              cmocka_unit_test(test_malformed_entries),
              cmocka_unit_test(test_malformed_metadata_and_data),
              cmocka_unit_test(test_fuzz_mutations))
