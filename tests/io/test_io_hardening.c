/* Hardened file handling in the io floor: inputs that are FIFOs or links to
 * devices are refused at open (never block, never read forever), temporary
 * names cannot be planted, and a safetensors header's parse is priced before
 * it runs: a dense 99 MB header is refused cheaply (peak memory measured in a
 * child process against 2x the header + 16 MiB), and the price counts
 * against the memory budget (FSC_MEM_LIMIT_MB). A regression that would hang
 * fails by alarm() instead. Every refusal names the file and leaves the
 * scratch directory, a file saved before it included, exactly as it was
 * (tree_sum.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "fsc/io.h"
#include "tmpdir.h"
#include "tree_sum.h"
#include "test_main.h"

/* The fingerprint of the whole scratch directory (FIFOs are never opened). */
static uint64_t scratch_sum(void) {
    const uint64_t sum = tree_sum(dir);
    assert_true(sum != 0);
    return sum;
}

static void expect_st_refused(const char *path, const char *needle) {
    const uint64_t before = scratch_sum();
    int rc = 0;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (f || rc == FSC_OK || !strstr(fsc_last_error(), needle))
        fail_msg("%s: expected refusal with \"%s\", got %d: %s", path, needle, rc,
                 fsc_last_error());
    assert_non_null(strstr(fsc_last_error(), path));
    assert_int_equal(scratch_sum(), before);
}

static void expect_tokens_refused(const char *path, const char *needle) {
    const uint64_t before = scratch_sum();
    fsc_tokens tk;
    int rc = fsc_tokens_load(path, &tk);
    if (rc == FSC_OK || !strstr(fsc_last_error(), needle))
        fail_msg("%s: expected refusal with \"%s\", got %d: %s", path, needle, rc,
                 fsc_last_error());
    assert_int_equal(scratch_sum(), before);
}

static void test_special_inputs_refused(void **state) {
    (void)state;
    alarm(20); /* a FIFO opened without O_NONBLOCK would block here forever */
    /* saved before: must survive every refusal below */
    float x[2] = {1, 2};
    fsc_tensor t = fsc_tensor_1d(x, FSC_DTYPE_F32, 2);
    const char *names[] = {"x"};
    assert_int_equal(fsc_st_save(tmp("saved.safetensors"), 1, names, &t, NULL), FSC_OK);
    assert_int_equal(mkfifo(tmp("pipe.safetensors"), 0666), 0);
    expect_st_refused(tmp("pipe.safetensors"), "is a FIFO, not a regular file");
    assert_int_equal(symlink("/dev/zero", tmp("zero.safetensors")), 0);
    expect_st_refused(tmp("zero.safetensors"), "is a character device, not a regular file");
    assert_int_equal(mkdir(tmp("adir.safetensors"), 0777), 0);
    expect_st_refused(tmp("adir.safetensors"), "is a directory");
    /* token data: llm.c shards and byte files alike */
    assert_int_equal(mkfifo(tmp("pipe.bin"), 0666), 0);
    expect_tokens_refused(tmp("pipe.bin"), "pipe.bin: is a FIFO");
    assert_int_equal(mkfifo(tmp("pipe.txt"), 0666), 0);
    expect_tokens_refused(tmp("pipe.txt"), "pipe.txt: is a FIFO");
    assert_int_equal(symlink("/dev/zero", tmp("zero.txt")), 0);
    expect_tokens_refused(tmp("zero.txt"), "zero.txt: is a character device");
    alarm(0);
    int rc;
    fsc_st_file *f = fsc_st_open(tmp("saved.safetensors"), &rc);
    assert_non_null(f);
    fsc_st_close(f);
    unlink(tmp("saved.safetensors"));
}

/* The temporary of a save has an unpredictable name created with O_EXCL: a
 * link planted at the old predictable name (path.tmp.<pid>) is not followed,
 * the victim is untouched, and nothing is left behind. */
static void test_planted_temporary_ignored(void **state) {
    (void)state;
    write_raw(tmp("victim"), "precious", 8);
    char planted[512];
    snprintf(planted, sizeof planted, "%s.tmp.%ld", tmp("out.safetensors"), (long)getpid());
    assert_int_equal(symlink(tmp("victim"), planted), 0);
    float x[4] = {1, 2, 3, 4};
    fsc_tensor t = fsc_tensor_1d(x, FSC_DTYPE_F32, 4);
    const char *names[] = {"x"};
    assert_int_equal(fsc_st_save(tmp("out.safetensors"), 1, names, &t, NULL), FSC_OK);
    char buf[16] = "";
    FILE *f = fopen(tmp("victim"), "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, sizeof buf, f), 8);
    fclose(f);
    assert_memory_equal(buf, "precious", 8);
    char target[512] = ""; /* the planted link itself is left alone too */
    assert_true(readlink(planted, target, sizeof target - 1) > 0);
    assert_string_equal(target, tmp("victim"));
    int rc;
    fsc_st_file *st = fsc_st_open(tmp("out.safetensors"), &rc);
    assert_non_null(st);
    fsc_st_close(st);
    unlink(planted);
    unlink(tmp("victim"));
}

/* A file whose header is `prefix` then "0," repeated to n bytes, closed by
 * `suffix`: a JSON array of zeros (the input). */
static void write_dense(const char *path, uint64_t n, const char *prefix, const char *suffix) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, fp);
    fputs(prefix, fp);
    uint64_t body = n - strlen(prefix) - strlen(suffix);
    static char block[1 << 16];
    for (size_t i = 0; i < sizeof block; i += 2) block[i] = '0', block[i + 1] = ',';
    for (uint64_t at = 0; at < body;) {
        size_t m = body - at < sizeof block ? (size_t)(body - at) : sizeof block;
        assert_int_equal(fwrite(block, 1, m, fp), m);
        at += m;
    }
    fputs(suffix, fp);
    static char data[512 << 10]; /* and 0.5 MB of data */
    fwrite(data, 1, sizeof data, fp);
    assert_int_equal(fclose(fp), 0);
}

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Opens path in a child process; returns the growth of its peak RSS in KiB. */
static long open_in_child(const char *path, const char *needle) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        long before = max_rss_kib();
        int rc = 0;
        fsc_st_file *f = fsc_st_open(path, &rc);
        long grew = max_rss_kib() - before;
        bool ok = !f && rc == FSC_ERR_FORMAT && strstr(fsc_last_error(), needle);
        if (!ok) fprintf(stderr, "child: %d %s\n", rc, fsc_last_error());
        if (write(fds[1], &grew, sizeof grew) != (ssize_t)sizeof grew) _exit(2);
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    long grew = -1;
    assert_int_equal(read(fds[0], &grew, sizeof grew), sizeof grew);
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return grew;
}

static void test_dense_header_refused_cheaply(void **state) {
    (void)state;
    const uint64_t n = 99u * 1000u * 1000u; /* 99 MB of "0,0,0,..." */
    const long bound_kib = (long)((2 * n + (16u << 20)) / 1024);
    const char *cases[][2] = {{"[", "0]"}, {"{\"a\":{\"dtype\":\"F32\",\"shape\":[", "0]}}"}};
    for (int i = 0; i < 2; i++) {
        write_dense(tmp("dense.safetensors"), n, cases[i][0], cases[i][1]);
        long grew = open_in_child(tmp("dense.safetensors"), "is too dense to parse");
        print_message("99 MB dense header (%s...): peak RSS grew by %ld KiB (bound %ld KiB)\n",
                      cases[i][0], grew, bound_kib);
        assert_true(grew >= 0 && grew <= bound_kib);
        unlink(tmp("dense.safetensors"));
    }
}

/* A header whose parse fits its own bound but not the memory budget. */
static void test_header_counts_against_budget(void **state) {
    (void)state;
    const size_t big = 3u << 20;
    char *h = malloc(big + 64);
    assert_non_null(h);
    int k = sprintf(h, "{\"__metadata__\":{\"k\":\"");
    memset(h + k, 'x', big);
    strcpy(h + k + big, "\"}}");
    size_t hn = strlen(h);
    FILE *fp = fopen(tmp("meta.safetensors"), "wb");
    assert_non_null(fp);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hn >> (8 * i));
    fwrite(len, 1, 8, fp);
    fwrite(h, 1, hn, fp);
    fclose(fp);
    free(h);
    int rc;
    fsc_st_file *f = fsc_st_open(tmp("meta.safetensors"), &rc);
    assert_non_null(f); /* fine without a budget */
    fsc_st_close(f);
    size_t old = fsc_mem_get_limit();
    fsc_mem_set_limit(4u << 20);
    f = fsc_st_open(tmp("meta.safetensors"), &rc);
    fsc_mem_set_limit(old);
    assert_null(f);
    assert_int_equal(rc, FSC_ERR_NOMEM);
    assert_non_null(strstr(fsc_last_error(), "FSC_MEM_LIMIT_MB"));
    assert_non_null(strstr(fsc_last_error(), "meta.safetensors"));
}

FSC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_special_inputs_refused),
              cmocka_unit_test(test_planted_temporary_ignored),
              cmocka_unit_test(test_dense_header_refused_cheaply),
              cmocka_unit_test(test_header_counts_against_budget))
