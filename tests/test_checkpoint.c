/* Checkpoint directories: whole or absent. A committed checkpoint opens and
 * verifies; a torn file, a flipped byte or a missing member is refused with a
 * message naming it; an aborted or failed save leaves the previous one and
 * `latest` untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "fsc/checkpoint.h"
#include "tmpdir.h"

static void write_text(const char *path, const char *text) {
    write_raw(path, text, strlen(text));
}

static void save(int64_t step, const char *payload) {
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("ck"), step, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), payload);
    write_text(fsc_ckpt_member(w, "optim.bin"), "state");
    assert_int_equal(fsc_ckpt_set(w, "strategy", "\"oss\""), FSC_OK);
    assert_int_equal(fsc_ckpt_set(w, "world", "2"), FSC_OK);
    assert_int_equal(fsc_ckpt_commit(w), FSC_OK);
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
    /* the same step is never overwritten */
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("ck"), 10, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), "other");
    assert_int_equal(fsc_ckpt_commit(w), FSC_ERR_IO);
    assert_non_null(strstr(fsc_last_error(), "already exists"));
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 10);
    fsc_ckpt_close(c);
}

static void test_damage_is_refused(void **state) {
    (void)state;
    save(20, "weights at 20, longer");
    fsc_ckpt *c;
    /* torn: truncated member */
    assert_int_equal(truncate(tmp("ck/step-000020/model.bin"), 5), 0);
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "model.bin has 5 bytes"));
    /* same size, one byte changed */
    write_text(tmp("ck/step-000020/model.bin"), "weights at 20, longeR");
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "fails its checksum"));
    /* a member missing */
    unlink(tmp("ck/step-000020/optim.bin"));
    write_text(tmp("ck/step-000020/model.bin"), "weights at 20, longer");
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "optim.bin"));
    /* not JSON */
    write_text(tmp("ck/step-000020/state.json"), "{ nope");
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_ERR_FORMAT);
    assert_non_null(strstr(fsc_last_error(), "state.json"));
    /* no checkpoint at all */
    assert_int_equal(fsc_ckpt_open(tmp("nothing-here"), &c), FSC_ERR_NOT_FOUND);
}

static void test_abort_keeps_previous(void **state) {
    (void)state;
    save(30, "good");
    fsc_ckpt_writer *w;
    assert_int_equal(fsc_ckpt_begin(tmp("ck"), 31, &w), FSC_OK);
    write_text(fsc_ckpt_member(w, "model.bin"), "half writ");
    fsc_ckpt_abort(w);
    struct stat st;
    assert_int_not_equal(stat(tmp("ck/step-000031"), &st), 0);
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(tmp("ck"), &c), FSC_OK);
    assert_int_equal(fsc_ckpt_step(c), 30);
    fsc_ckpt_close(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_latest),
        cmocka_unit_test(test_damage_is_refused),
        cmocka_unit_test(test_abort_keeps_previous),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
