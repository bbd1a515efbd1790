/* The hook-order tests' log (tests/nn/test_modules.c, test_checkpoint_wrapper.c):
 * "kind:module" lines in the order hooks and modules fired, and one
 * training step of a module on a fixed (2, 4) input to fire them. Include
 * after cmocka.h. */
#ifndef FSC_TEST_HOOK_LOG_H
#define FSC_TEST_HOOK_LOG_H

#include <stdio.h>

#include "fsc/nn.h"

typedef struct {
    char log[64][160];
    int n;
} hook_log;

/* Appends "what:who". */
static inline void hook_log_note(hook_log *l, const char *what, const char *who) {
    assert_true(l->n < 64);
    snprintf(l->log[l->n++], sizeof l->log[0], "%s:%s", what, who);
}

/* A hook (user: the hook_log) that logs "kind:module", kind suffixed with
 * "_recompute" when ctx says so (activation checkpointing's re-run). */
static inline int hook_log_record(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                                  const fsc_tensor *t, void *user) {
    (void)t;
    static const char *names[2][4] = {
        {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd"},
        {"pre_fwd_recompute", "post_fwd_recompute", "pre_bwd_recompute", "post_bwd_recompute"}};
    hook_log_note(user, names[ctx->recompute][kind], m->name);
    return 0;
}

/* One training forward of m on a fixed (2, 4) input and a backward with
 * its output as the output gradient; fails the test on an error. */
static inline void hook_log_step(fsc_module *m) {
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 16);
    fsc_ctx ctx = {.arena = arena, .training = true};
    float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fsc_tensor x = fsc_tensor_2d(xd, FSC_DTYPE_F32, 2, 4), y, dx;
    void *saved;
    assert_int_equal(fsc_module_forward(m, &ctx, &x, &y, &saved), FSC_OK);
    assert_int_equal(fsc_module_backward(m, &ctx, saved, &y, &dx), FSC_OK);
    fsc_arena_free(arena);
}

#endif
