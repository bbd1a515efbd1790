/* Checkpoint directories: whole or absent. A committed checkpoint opens and
 * verifies; a torn file, a flipped byte or a missing member is refused with a
 * message naming it; an aborted or failed save leaves the previous one and
 * `latest` untouched. A save killed at any of its commit points (the
 * FSC_CKPT_POINT_* of core/fault.h) leaves a directory from which the next
 * open finds the newest complete checkpoint and the next save succeeds.
 * state.json is checked end to end: its own checksum, numbers in range, no
 * trailing bytes. Special files and links are refused, never read. Every
 * refusal and every killed or aborted save is also checked to leave what was
 * saved before it byte for byte as it was (tree_sum.h). */
#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/fault.h"
#include "fsc/checkpoint.h"
#include "fsc/io.h"
#include "tmpdir.h"
#include "tree_sum.h"

static void write_text(const char *path, const char *text) {
    write_raw(path, text, strlen(text));
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* tree_sum of d, which must exist (a sum of nothing would compare equal to nothing). */
static uint64_t fingerprint(const char *d) {
    const uint64_t sum = tree_sum(d);
    if (!sum) fail_msg("%s: cannot be walked", d);
    return sum;
}

/* Opening d fails with want_rc and a message containing needle, and
 * leaves every file under d as it was: a reader never repairs or removes. */
static void expect_refused(const char *d, int want_rc, const char *needle) {
    char dir_copy[512];
    snprintf(dir_copy, sizeof dir_copy, "%s", d); /* d may be a tmp() buffer */
    const uint64_t before = fingerprint(dir_copy);
    fsc_ckpt *c = NULL;
    int rc = fsc_ckpt_open(dir_copy, &c);
    if (rc != want_rc || !strstr(fsc_last_error(), needle))
        fail_msg("%s: expected %d with \"%s\", got %d: %s", dir_copy, want_rc, needle, rc,
                 fsc_last_error());
    assert_null(c);
    assert_int_equal(tree_sum(dir_copy), before);
}

/* One save of step `step` into dir, pruning to keep_last (0: keep all). */
static int save_in(const char *dir, int64_t step, const char *payload, int keep_last) {
    fsc_ckpt_writer *w;
    int rc = fsc_ckpt_begin(dir, step, &w);
    if (rc) return rc;
    write_text(fsc_ckpt_member(w, "model.bin"), payload);
    write_text(fsc_ckpt_member(w, "optim.bin"), "state");
    assert_int_equal(fsc_ckpt_set(w, "strategy", "\"oss\""), FSC_OK);
    assert_int_equal(fsc_ckpt_set(w, "world", "2"), FSC_OK);
    assert_int_equal(fsc_ckpt_keep_last(w, keep_last), FSC_OK);
    return fsc_ckpt_commit(w);
}

static void save(int64_t step, const char *payload) {
    assert_int_equal(save_in(tmp("ck"), step, payload, 0), FSC_OK);
}

static void test_round_trip_and_latest(void **state) {
    (void)state;
    save(5, "weights at 5");
    save(10, "weights at 10");
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 10);
    assert_string_equal(fsc_ckpt_get(c, "strategy"), "\"oss\"");
    assert_string_equal(fsc_ckpt_get(c, "world"), "2");
    assert_null(fsc_ckpt_get(c, "nope"));
    assert_non_null(strstr(fsc_ckpt_path(c, "model.bin"), "step-000010/model.bin"));
    assert_null(fsc_ckpt_path(c, "other.bin"));
    fsc_ckpt_close(c);
    /* a step directory opens directly too */
    assert_int_equal(fsc_ckpt_open(tmp("ck/step-000005"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 5);
    fsc_ckpt_close(c);
    /* the same step is never overwritten, and the refused save leaves no trace */
    const uint64_t saved = fingerprint(tmp("ck"));
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("ck"), 10, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), "other");
    assert_int_equal(fsc_ckpt_commit(w), FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), "already exists"));
    assert_int_equal(tree_sum(tmp("ck")), saved);
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 10);
    fsc_ckpt_close(c);
}

/* Metadata doubles come back bit for bit, at the top and nested, and a step
 * past 10^15 too. cJSON's own print keeps 15 digits whenever they read back
 * within an epsilon: 0.1 + 0.2 came back as 0.3 and 1 + 2^-52 as 1 (AdaScale's
 * progress failed to resume exactly on one CPU that way). */
static void test_metadata_doubles_exact(void **state) {
    (void)state;
    const double v[] = {0.1 + 0.2, 1.0 + DBL_EPSILON, 3.0000000000000004,
                        1e300 * 1.0000000000000002, -2.5e-310};
    const int64_t step = 4503599627370497; /* 2^52 + 1: 16 digits */
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("exact"), step, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), "w");
    char json[512];
    int at = snprintf(json, sizeof json, "{\"v\": [");
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        at += snprintf(json + at, sizeof json - (size_t)at, "%s%.17g", i ? ", " : "", v[i]);
    snprintf(json + at, sizeof json - (size_t)at, "]}");
    assert_int_equal(fsc_ckpt_set(w, "nested", json), FSC_OK);
    char top[32];
    snprintf(top, sizeof top, "%.17g", v[0]);
    assert_int_equal(fsc_ckpt_set(w, "top", top), FSC_OK);
    assert_int_equal(fsc_ckpt_commit(w), FSC_OK);
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(tmp("exact"), &c), FSC_OK);
    assert_true(fsc_ckpt_step(c) == step);
    assert_true(strtod(fsc_ckpt_get(c, "top"), NULL) == v[0]);
    const char *got = fsc_ckpt_get(c, "nested");
    const char *p = strchr(got, '[');
    assert_non_null(p);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char *end;
        const double d = strtod(p + 1, &end);
        if (d != v[i]) fail_msg("value %zu: %.17g came back as %.17g (%s)", i, v[i], d, got);
        p = end;
    }
    fsc_ckpt_close(c);
}

static void test_damage_is_refused(void **state) {
    (void)state;
    save(20, "weights at 20, longer");
    fsc_ckpt *c;
    /* torn: truncated member */
    assert_int_equal(truncate(tmp("ck/step-000020/model.bin"), 5), 0);
    expect_refused(tmp("ck"), FSC_ERR_FORMAT, "model.bin has 5 bytes");
    /* same size, one byte changed */
    write_text(tmp("ck/step-000020/model.bin"), "weights at 20, longeR");
    expect_refused(tmp("ck"), FSC_ERR_FORMAT, "fails its checksum");
    /* a member missing */
    unlink(tmp("ck/step-000020/optim.bin"));
    write_text(tmp("ck/step-000020/model.bin"), "weights at 20, longer");
    expect_refused(tmp("ck"), FSC_ERR_FORMAT, "optim.bin");
    /* not JSON */
    write_text(tmp("ck/step-000020/state.json"), "{ nope");
    expect_refused(tmp("ck"), FSC_ERR_FORMAT, "state.json");
    /* no checkpoint at all */
    assert_int_equal(fsc_ckpt_open(tmp("nothing-here"), &c), FSC_ERR_NOT_FOUND);
}

static void test_abort_keeps_previous(void **state) {
    (void)state;
    save(30, "good");
    const uint64_t saved = fingerprint(tmp("ck"));
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("ck"), 31, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), "half writ");
    fsc_ckpt_abort(w);
    assert_int_equal(tree_sum(tmp("ck")), saved); /* no temporary left, nothing touched */
    struct stat st;
    assert_int_not_equal(stat(tmp("ck/step-000031"), &st), 0);
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 30);
    fsc_ckpt_close(c);
}

/* Names in dir, sorted, joined by spaces ("latest step-000003 ..."). */
static const char *listing(const char *d) {
    static char out[4096];
    struct dirent **names;
    int n = scandir(d, &names, NULL, alphasort);
    assert_true(n >= 0);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            if (out[0]) strcat(out, " ");
            strncat(out, names[i]->d_name, sizeof out - strlen(out) - 64);
        }
        free(names[i]);
    }
    free(names);
    return out;
}

static void expect_step(const char *d, int64_t step) {
    fsc_ckpt *c;
    int rc = fsc_ckpt_open(d, &c);
    if (rc) print_error("%s: %s\n", d, fsc_last_error());
    assert_int_equal(rc, FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), step);
    char want[32];
    snprintf(want, sizeof want, "w%lld", (long long)step);
    assert_string_equal(read_all(fsc_ckpt_path(c, "model.bin")), want);
    fsc_ckpt_close(c);
}

/* For every commit point k: steps 1 and 2 saved (keep_last 2); a child saving
 * step 3 is killed at k; the same "command" then resumes (the newest complete
 * checkpoint: 2 before the rename, 3 after), saves 3 if it resumed from 2,
 * and saves 4. It must end with step-3, step-4 and latest, and nothing else:
 * the dead writer's temporaries are gone and step 1 is pruned. One more k
 * than there are points runs to the end: the count is exact. */
static void test_kill_at_every_commit_point(void **state) {
    (void)state;
    for (int k = 1; k <= FSC_CKPT_POINTS + 1; k++) {
        char name[32];
        snprintf(name, sizeof name, "kill%02d", k);
        char d[512];
        snprintf(d, sizeof d, "%s", tmp(name));
        assert_int_equal(save_in(d, 1, "w1", 2), FSC_OK);
        assert_int_equal(save_in(d, 2, "w2", 2), FSC_OK);
        char step2[600];
        snprintf(step2, sizeof step2, "%s/step-000002", d);
        const uint64_t saved2 = fingerprint(step2);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char fault[32];
            snprintf(fault, sizeof fault, "ckpt-kill:%d", k);
            if (k <= FSC_CKPT_POINTS && !fsc_fault_set(fault)) _exit(3);
            _exit(save_in(d, 3, "w3", 2) == FSC_OK ? 0 : 4);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (k <= FSC_CKPT_POINTS) {
            if (!WIFSIGNALED(status)) print_error("commit point %d was not reached\n", k);
            assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        } else {
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        /* whatever the point, step 2 (kept by keep_last 2) is byte for byte as saved */
        if (tree_sum(step2) != saved2) print_error("k=%d: step-000002 changed\n", k);
        assert_int_equal(tree_sum(step2), saved2);
        /* the dead writer's step 3 is complete once renamed into place */
        fsc_ckpt *c;
        assert_int_equal(fsc_ckpt_open(d, &c), FSC_OK);
        int64_t resumed = fsc_ckpt_step(c);
        fsc_ckpt_close(c);
        assert_int_equal(resumed, k >= FSC_CKPT_POINT_RENAMED ? 3 : 2);
        expect_step(d, resumed);
        if (resumed == 2) assert_int_equal(save_in(d, 3, "w3", 2), FSC_OK);
        int rc = save_in(d, 4, "w4", 2);
        if (rc) print_error("k=%d: %s\n", k, fsc_last_error());
        assert_int_equal(rc, FSC_OK);
        expect_step(d, 4);
        assert_string_equal(listing(d), "latest step-000003 step-000004");
    }
}

/* A step directory newer than `latest` that does not verify is skipped by
 * readers (with a warning) and set aside by the writer of that step: never
 * "already exists" forever. */
static void test_newer_incomplete_set_aside(void **state) {
    (void)state;
    const char *d = strdup(tmp("aside"));
    assert_int_equal(save_in(d, 1, "w1", 0), FSC_OK);
    assert_int_equal(save_in(d, 2, "w2", 0), FSC_OK);
    write_text(tmp("aside/latest"), "step-000001\n");     /* as if the save of 2 was cut short */
    write_text(tmp("aside/step-000002/model.bin"), "w9"); /* ... and 2 then damaged */
    expect_step(d, 1);
    const uint64_t saved1 = fingerprint(tmp("aside/step-000001"));
    assert_int_equal(save_in(d, 2, "w2", 0), FSC_OK);
    expect_step(d, 2);
    assert_int_equal(tree_sum(tmp("aside/step-000001")), saved1);
    const char *names = listing(d);
    assert_non_null(strstr(names, "step-000002.aside-"));
    /* the checkpoint `latest` names is still never overwritten */
    const uint64_t saved = fingerprint(d);
    assert_int_equal(save_in(d, 2, "w2", 0), FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), "already exists"));
    assert_int_equal(tree_sum(d), saved);
    free((void *)d);
}

/* A writer that died leaves its temporary; the next writer removes it without
 * following the link planted inside, and leaves a live writer's alone. */
static void test_stale_temporaries(void **state) {
    (void)state;
    const char *d = strdup(tmp("stale"));
    assert_int_equal(save_in(d, 1, "w1", 0), FSC_OK);
    assert_int_equal(mkdir(tmp("victim"), 0777), 0);
    write_text(tmp("victim/precious"), "keep me");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fsc_ckpt_writer *w;
        if (fsc_ckpt_begin(d, 2, &w)) _exit(1);
        char link[4096];
        snprintf(link, sizeof link, "%s", fsc_ckpt_member(w, "evil"));
        _exit(symlink(tmp("victim"), link) == 0 ? 0 : 2); /* dies mid-save */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_non_null(strstr(listing(d), ".step-000002.tmp-"));
    /* a temporary of a writer that is alive (pid 1) stays */
    char host[256], live[1024];
    gethostname(host, sizeof host);
    for (char *h = host; *h; h++)
        if (*h == '-') *h = '_';
    snprintf(live, sizeof live, "%s/.step-000007.tmp-1-%s-abcdefabcdef", d, host);
    assert_int_equal(mkdir(live, 0777), 0);
    const uint64_t saved1 = fingerprint(tmp("stale/step-000001"));
    assert_int_equal(save_in(d, 2, "w2", 0), FSC_OK);
    assert_int_equal(tree_sum(tmp("stale/step-000001")), saved1);
    assert_null(strstr(listing(d), ".step-000002.tmp-"));
    assert_non_null(strstr(listing(d), ".step-000007.tmp-1-"));
    assert_string_equal(read_all(tmp("victim/precious")), "keep me");
    free((void *)d);
}

static void test_keep_last(void **state) {
    (void)state;
    const char *d = strdup(tmp("keep"));
    for (int s = 1; s <= 5; s++) {
        char p[16];
        snprintf(p, sizeof p, "w%d", s);
        assert_int_equal(save_in(d, s, p, 2), FSC_OK);
    }
    assert_string_equal(listing(d), "latest step-000004 step-000005");
    assert_int_equal(fsc_ckpt_prune(d, 1), FSC_OK);
    assert_string_equal(listing(d), "latest step-000005");
    expect_step(d, 5);
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(d, 6, &w), FSC_OK);
    assert_int_equal(fsc_ckpt_keep_last(w, -1), FSC_ERR_INVALID);
    fsc_ckpt_abort(w);
    assert_int_equal(fsc_ckpt_prune(tmp("no-such-dir"), 1), FSC_OK);
    free((void *)d);
}

/* Replaces the first `from` in path's text by `to`. */
/* --keep-best: the step directories with the lowest "val_loss" stay beside
 * the newest (and the keep_last newest); one without the key never counts
 * as best, and a corrupt state.json only loses its candidacy. */
static void test_keep_best(void **state) {
    (void)state;
    const char *d = strdup(tmp("best"));
    const char *val[] = {"5.0", "3.0", "4.0", "1.0", "6.0", NULL, "2.5", "7.0"};
    for (int s = 1; s <= 8; s++) {
        fsc_ckpt_writer *w;
        assert_int_equal(fsc_ckpt_begin(d, s, &w), FSC_OK);
        char payload[16];
        snprintf(payload, sizeof payload, "w%d", s);
        write_text(fsc_ckpt_member(w, "model.bin"), payload);
        if (val[s - 1]) assert_int_equal(fsc_ckpt_set(w, "val_loss", val[s - 1]), FSC_OK);
        assert_int_equal(fsc_ckpt_commit(w), FSC_OK);
    }
    /* best two: steps 4 (1.0) and 7 (2.5); the last two: 7 and 8 (step 6 has no val_loss) */
    assert_int_equal(fsc_ckpt_prune_best(d, 2, 2, "val_loss"), FSC_OK);
    assert_string_equal(listing(d), "latest step-000004 step-000007 step-000008");
    expect_step(d, 8);
    /* keep_last 0: the newest and the one best */
    assert_int_equal(fsc_ckpt_prune_best(d, 0, 1, "val_loss"), FSC_OK);
    assert_string_equal(listing(d), "latest step-000004 step-000008");
    assert_int_equal(fsc_ckpt_prune_best(d, 0, 1, NULL), FSC_ERR_INVALID);
    assert_int_equal(fsc_ckpt_prune_best(d, -1, 1, "val_loss"), FSC_ERR_INVALID);
    free((void *)d);
}

static void edit(const char *path, const char *from, const char *to) {
    char text[1 << 16], *at;
    snprintf(text, sizeof text, "%s", read_all(path));
    assert_non_null(at = strstr(text, from));
    char out[1 << 16];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    write_text(path, out);
}

/* state.json without its own checksum, as written before it existed. */
static void strip_sum(const char *path) {
    char text[1 << 16];
    snprintf(text, sizeof text, "%s", read_all(path));
    char *at = strstr(text, ",\n\t\"state_crc32\"");
    assert_non_null(at);
    strcpy(at, "\n}\n");
    write_text(path, text);
}

static void test_state_integrity(void **state) {
    (void)state;
    const char *d = strdup(tmp("integ")), *sj = strdup(tmp("integ/step-000006/state.json"));
    assert_int_equal(save_in(d, 6, "w6", 0), FSC_OK);
    char good[1 << 16];
    snprintf(good, sizeof good, "%s", read_all(sj));
    assert_non_null(strstr(good, "\"state_crc32\""));
    /* the step edited 6 -> 2: its own checksum catches it */
    edit(sj, "\"step\":\t6", "\"step\":\t2");
    expect_refused(d, FSC_ERR_FORMAT, "state.json: fails its own checksum");
    /* an old checkpoint without the checksum still opens ... */
    write_text(sj, good);
    strip_sum(sj);
    expect_step(d, 6);
    /* ... but its step must be the directory's, and in range */
    edit(sj, "\"step\":\t6", "\"step\":\t2");
    expect_refused(d, FSC_ERR_FORMAT, "says step 2 but the directory is step 6");
    edit(sj, "\"step\":\t2", "\"step\":\t61e300");
    expect_refused(d, FSC_ERR_FORMAT, "\"step\" must be an integer in [0, 2^53]");
    edit(sj, "\"step\":\t61e300", "\"step\":\t-1");
    expect_refused(d, FSC_ERR_FORMAT, "\"step\" must be an integer in [0, 2^53]");
    edit(sj, "\"step\":\t-1", "\"step\":\t6.5");
    expect_refused(d, FSC_ERR_FORMAT, "\"step\" must be an integer in [0, 2^53]");
    edit(sj, "\"step\":\t6.5", "\"step\":\t6");
    edit(sj, "\"size\":\t", "\"size\":\t1e30+");
    expect_refused(d, FSC_ERR_FORMAT, "state.json");
    write_text(sj, good);
    strip_sum(sj);
    edit(sj, "\"crc32\":\t", "\"crc32\":\t9999999999");
    expect_refused(d, FSC_ERR_FORMAT, "bad entry for");
    /* trailing garbage after the object */
    write_text(sj, good);
    edit(sj, "\"\n}\n", "\"\n}\n{}");
    expect_refused(d, FSC_ERR_FORMAT, "unexpected bytes after the JSON object");
    /* a `latest` that names something else */
    write_text(sj, good);
    expect_step(d, 6);
    write_text(tmp("integ/latest"), "../../etc\n");
    expect_refused(d, FSC_ERR_FORMAT, "latest: does not name a step directory");
    free((void *)d), free((void *)sj);
}

/* A checkpoint whose model.safetensors says fsc.step = member_step and
 * fsc.run = member_run, while state.json says step 8 and run "a". */
static int save_with_member(const char *d, const char *member_step, const char *member_run) {
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(d, 8, &w), FSC_OK);
    float x[2] = {1, 2};
    fsc_tensor t = fsc_tensor_1d(x, FSC_DTYPE_F32, 2);
    const char *names[] = {"x"};
    const char *meta[] = {"format", "pt", "fsc.step", member_step, "fsc.run", member_run, NULL};
    assert_int_equal(fsc_st_save(fsc_ckpt_member(w, "model.safetensors"), 1, names, &t, meta),
                     FSC_OK);
    assert_int_equal(fsc_ckpt_set(w, "run", "\"a\""), FSC_OK);
    return fsc_ckpt_commit(w);
}

/* Each member's own record of its step (and the state pairs) must agree with
 * state.json: a member of another checkpoint is refused, naming it. */
static void test_member_step_agrees(void **state) {
    (void)state;
    fsc_ckpt *c;
    assert_int_equal(save_with_member(tmp("mem-ok"), "8", "\"a\""), FSC_OK);
    assert_int_equal(fsc_ckpt_open(tmp("mem-ok"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 8);
    fsc_ckpt_close(c);
    assert_int_equal(save_with_member(tmp("mem-step"), "5", "\"a\""), FSC_OK);
    expect_refused(tmp("mem-step"), FSC_ERR_FORMAT,
                   "model.safetensors records step 5 but state.json says step 8");
    assert_int_equal(save_with_member(tmp("mem-run"), "8", "\"b\""), FSC_OK);
    expect_refused(tmp("mem-run"), FSC_ERR_FORMAT, "model.safetensors records fsc.run = \"b\"");
}

/* A member that is a FIFO (open would block, reads would wait) or a link to
 * /dev/zero (reads never end) is refused at once; alarm() turns a regression
 * into a failure instead of a hang. */
static void test_special_files_refused(void **state) {
    (void)state;
    const char *d = strdup(tmp("special")), *m = strdup(tmp("special/step-000001/model.bin"));
    assert_int_equal(save_in(d, 1, "w1", 0), FSC_OK);
    alarm(20);
    unlink(m);
    assert_int_equal(mkfifo(m, 0666), 0);
    expect_refused(d, FSC_ERR_FORMAT, "model.bin: is a FIFO, not a regular file");
    unlink(m);
    assert_int_equal(symlink("/dev/zero", m), 0);
    expect_refused(d, FSC_ERR_FORMAT, "model.bin: is a symbolic link");
    unlink(m);
    const char *sj = tmp("special/step-000001/state.json");
    unlink(sj);
    assert_int_equal(mkfifo(sj, 0666), 0);
    expect_refused(d, FSC_ERR_IO, "state.json: is a FIFO");
    alarm(0);
    free((void *)d), free((void *)m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_latest),
        cmocka_unit_test(test_metadata_doubles_exact),
        cmocka_unit_test(test_damage_is_refused),
        cmocka_unit_test(test_abort_keeps_previous),
        cmocka_unit_test(test_kill_at_every_commit_point),
        cmocka_unit_test(test_newer_incomplete_set_aside),
        cmocka_unit_test(test_stale_temporaries),
        cmocka_unit_test(test_keep_last),
        cmocka_unit_test(test_keep_best),
        cmocka_unit_test(test_state_integrity),
        cmocka_unit_test(test_special_files_refused),
        cmocka_unit_test(test_member_step_agrees),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
