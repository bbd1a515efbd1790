/* Parallel checkpoint saves through MPI-IO (src/io/safetensors_mpiio.c) on
 * 1, 2 and 4 ranks: under ddp, oss, sdp and fsdp the weights and optimizer
 * state written by every rank together are byte for byte the files of the
 * one-writer path (FSC_PARALLEL_IO=0), also when the staging buffer is a few
 * bytes and every piece is split over rounds; a run resumed from a parallel
 * checkpoint has the losses of an uninterrupted one; a save that fails on
 * one rank (the io-write fault) or cannot start (a missing directory) fails
 * on every rank with the same message and leaves the previous checkpoint
 * as it was; FSC_PARALLEL_IO and FSC_IO_TIMEOUT_S are range-checked. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "fsc/checkpoint.h"
#include "fsc/trainer.h"
#include "fsc/weights.h"
#include "io/st_parallel.h"
#include "mpi_test.h"
#include "mse_test.h"
#include "test_main.h"

static int rank, world;
static char dir[64]; /* rank 0's scratch directory, known to every rank */

enum { IN = 7, H = 33, OUT = 5, G = 8 };

static const fsc_optim_config ADAMW = {
    .kind = FSC_OPTIM_ADAMW, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};

/* Odd sizes: shards, tiles and rounds end inside tensors. */
static fsc_module *model_new(void) {
    fsc_module *parts[3] = {fsc_linear_new("fc_in", IN, H, true, FSC_WEIGHT_OUT_IN, 0.3f),
                            fsc_gelu_new("act"),
                            fsc_linear_new("head", H, OUT, true, FSC_WEIGHT_OUT_IN, 0.2f)};
    return fsc_sequential_new("mlp", 3, parts);
}

/* Inputs and targets are functions of the global sample index. */
static float input(int64_t sample, int j) {
    return (float)(sample * 5 % 11 + j) / 9.f - 0.5f;
}
static float target(int64_t sample, int k) {
    return (float)((sample * 3 + k) % 4 - 1.5) / 2.f;
}

/* Half the squared error over the global count of targets (mse_test.h). */
static mse_data DATA = {IN, OUT, input, target};

static fsc_trainer *trainer_new(const char *strategy, fsc_module **m) {
    *m = model_new();
    fsc_trainer_config cfg = {.strategy = {.name = strategy, .seed = 3},
                              .optim = ADAMW,
                              .batch = G / world,
                              .loss = mse_loss,
                              .user = &DATA};
    fsc_trainer *t = fsc_trainer_new(*m, &cfg);
    if (!t) fail_msg("%s: %s", strategy, fsc_last_error());
    return t;
}

static void train(fsc_trainer *t, int steps, double *losses) {
    for (int i = 0; i < steps; i++) {
        fsc_step_result r;
        assert_int_equal(fsc_trainer_step(t, &r), FSC_OK);
        if (losses) losses[i] = r.loss;
    }
}

static void set_parallel(bool on) {
    setenv("FSC_PARALLEL_IO", on ? "1" : "0", 1);
}

/* Rank 0 compares two files byte for byte; every rank learns the verdict. */
static bool same_bytes(const char *a, const char *b) {
    int32_t same = 0;
    if (rank == 0) {
        long na = -1, nb = -2;
        unsigned char *x = mpi_read_file(a, &na), *y = mpi_read_file(b, &nb);
        same = x && y && na == nb && na > 0 && memcmp(x, y, (size_t)na) == 0;
        if (!same) fprintf(stderr, "%s (%ld bytes) and %s (%ld bytes) differ\n", a, na, b, nb);
        free(x), free(y);
    }
    fsc_group_broadcast(fsc_group_world(), &same, 1, FSC_DTYPE_I32, 0);
    return same != 0;
}

static void member(char *out, size_t n, const char *ckpt, const char *file) {
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(ckpt, &c), FSC_OK);
    snprintf(out, n, "%s", fsc_ckpt_path(c, file));
    fsc_ckpt_close(c);
}

/* Both paths, the parallel one with tiny rounds and with 16 MiB ones. */
static void check_strategy(const char *strategy) {
    fsc_module *m;
    fsc_trainer *t = trainer_new(strategy, &m);
    train(t, 2, NULL);
    const char *modes[3] = {"one", "par", "tiny"};
    char ck[3][128];
    for (int i = 0; i < 3; i++) {
        snprintf(ck[i], sizeof ck[i], "%s/%s-%s", dir, strategy, modes[i]);
        set_parallel(i > 0);
        st_parallel_set_chunk(i == 2 ? 24 : 0);
        int rc = fsc_trainer_save_checkpoint(t, ck[i], 0, NULL, NULL);
        if (rc) fail_msg("%s %s: %s", strategy, modes[i], fsc_last_error());
    }
    st_parallel_set_chunk(0);
    for (int f = 0; f < 2; f++) {
        const char *file = f ? "optim.safetensors" : "model.safetensors";
        char one[256], par[256], tiny[256];
        member(one, sizeof one, ck[0], file);
        member(par, sizeof par, ck[1], file);
        member(tiny, sizeof tiny, ck[2], file);
        if (!same_bytes(one, par) || !same_bytes(one, tiny))
            fail_msg("%s: the parallel %s differs from the one-writer file", strategy, file);
    }
    fsc_trainer_free(t);
    fsc_module_free(m);
}

/* One test per strategy (FSC_TEST_ROW: the row is the strategy's name). */
static void test_byte_identical(void **state) {
    check_strategy(*state);
}

/* Two steps, a parallel checkpoint, a fresh trainer resumed from it: the
 * next two losses are those of four steps in one go. */
static void test_resume_from_parallel_checkpoint(void **state) {
    (void)state;
    set_parallel(true);
    const char *strategies[2] = {"fsdp", "oss"};
    for (int s = 0; s < 2; s++) {
        char ck[128];
        snprintf(ck, sizeof ck, "%s/resume-%s", dir, strategies[s]);
        double whole[4], resumed[2];
        fsc_module *m;
        fsc_trainer *t = trainer_new(strategies[s], &m);
        train(t, 4, whole);
        fsc_trainer_free(t), fsc_module_free(m);
        t = trainer_new(strategies[s], &m);
        train(t, 2, NULL);
        assert_int_equal(fsc_trainer_save_checkpoint(t, ck, 0, NULL, NULL), FSC_OK);
        fsc_trainer_free(t), fsc_module_free(m);
        t = trainer_new(strategies[s], &m);
        assert_int_equal(fsc_trainer_resume(t, ck, 0, NULL, NULL), FSC_OK);
        train(t, 2, resumed);
        for (int i = 0; i < 2; i++)
            if (resumed[i] != whole[2 + i])
                fail_msg("%s: step %d after resuming: loss %.9g, uninterrupted %.9g", strategies[s],
                         2 + i, resumed[i], whole[2 + i]);
        fsc_trainer_free(t), fsc_module_free(m);
    }
}

/* One rank's write fails (io-write: the last rank's, in the MPI-IO path
 * only, so this also proves each strategy takes it): every rank reports it,
 * naming that rank, and the previous checkpoint is still the newest. */
static void check_failed_write(const char *strategy) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/fail-%s", dir, strategy);
    fsc_module *m;
    fsc_trainer *t = trainer_new(strategy, &m);
    train(t, 1, NULL);
    assert_int_equal(fsc_trainer_save_checkpoint(t, ck, 0, NULL, NULL), FSC_OK);
    train(t, 1, NULL);
    assert_true(fsc_fault_set("io-write"));
    int rc = fsc_trainer_save_checkpoint(t, ck, 0, NULL, NULL);
    fsc_fault_set(NULL);
    assert_int_not_equal(rc, FSC_OK);
    char want[64];
    snprintf(want, sizeof want, "rank %d of group", world - 1);
    if (!strstr(fsc_last_error(), "simulated I/O error") || !strstr(fsc_last_error(), want))
        fail_msg("rank %d: the failure is not named: %s", rank, fsc_last_error());
    fsc_ckpt *c;
    assert_int_equal(fsc_ckpt_open(ck, &c), FSC_OK); /* verifies sizes and checksums too */
    assert_int_equal(fsc_ckpt_step(c), 1);
    fsc_ckpt_close(c);
    /* and the next save goes through */
    rc = fsc_trainer_save_checkpoint(t, ck, 0, NULL, NULL);
    if (rc) fail_msg("rank %d: the save after a failed one: %s", rank, fsc_last_error());
    fsc_trainer_free(t), fsc_module_free(m);
}

static void test_failed_write_keeps_previous(void **state) {
    (void)state;
    if (world == 1) skip(); /* one process writes alone: no MPI-IO */
    set_parallel(true);
    const char *strategies[4] = {"ddp", "oss", "sdp", "fsdp"};
    for (int s = 0; s < 4; s++) check_failed_write(strategies[s]);
}

/* A file in a directory that does not exist: refused on every rank, naming it. */
static void test_missing_directory_named_everywhere(void **state) {
    (void)state;
    set_parallel(true);
    char path[128];
    snprintf(path, sizeof path, "%s/no-such-dir/w.safetensors", dir);
    fsc_module *m = model_new();
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 3, false, &ps), FSC_OK);
    int rc = fsc_weights_save_group(fsc_group_world(), 0, path, &ps, 0, NULL, NULL);
    if (rc != FSC_ERR_IO) fail_msg("rank %d: %d %s", rank, rc, fsc_last_error());
    if (!strstr(fsc_last_error(), "no-such-dir/w.safetensors"))
        fail_msg("rank %d: %s", rank, fsc_last_error());
    fsc_params_free(&ps);
    fsc_module_free(m);
}

static void test_env_values_checked(void **state) {
    (void)state;
    const char *bad[][2] = {
        {"FSC_PARALLEL_IO", "yes"}, {"FSC_IO_TIMEOUT_S", "0"}, {"FSC_IO_TIMEOUT_S", "1e9"}};
    for (int i = 0; i < 3; i++) {
        char *old = getenv(bad[i][0]) ? strdup(getenv(bad[i][0])) : NULL;
        setenv(bad[i][0], bad[i][1], 1);
        assert_int_equal(fsc_env_check(), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), bad[i][0]));
        if (old)
            setenv(bad[i][0], old, 1), free(old);
        else
            unsetenv(bad[i][0]);
    }
    setenv("FSC_IO_TIMEOUT_S", "30", 1);
    assert_int_equal(fsc_env_check(), FSC_OK);
    unsetenv("FSC_IO_TIMEOUT_S");
}

MPI_TEST_MAIN_IN_SCRATCH("fsc_pio", dir, cmocka_unit_test(test_env_values_checked),
                         FSC_TEST_ROW("byte_identical_ddp", test_byte_identical, "ddp"),
                         FSC_TEST_ROW("byte_identical_oss", test_byte_identical, "oss"),
                         FSC_TEST_ROW("byte_identical_sdp", test_byte_identical, "sdp"),
                         FSC_TEST_ROW("byte_identical_fsdp", test_byte_identical, "fsdp"),
                         cmocka_unit_test(test_resume_from_parallel_checkpoint),
                         cmocka_unit_test(test_failed_write_keeps_previous),
                         cmocka_unit_test(test_missing_directory_named_everywhere))
