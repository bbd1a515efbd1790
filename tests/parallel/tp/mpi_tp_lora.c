/* LoRA under tensor parallelism (src/parallel/tp/tp_lora.c) over the world
 * as one TP group (t = 1, 2, 4), against one process with src/nn/lora.c's
 * adapters on the same global batch: a small LLaMA with r = 4 adapters on
 * every Linear (q/k/v and gate/up column-parallel: lora_B split by output
 * rows; o and down row-parallel: lora_A split by input columns), 5 AdamW
 * steps, the parameters saved by global name equal one process's by
 * equivalence.h's noise floor (the frozen base bit for bit, since it never
 * moves), with and without sequence parallelism and with adapter dropout
 * (the one-process masks, column slices of them on the row-parallel
 * inputs). The TP orders' hooks of equivalence.h redo only a Linear's base
 * product, so the floor here is the micro-batch orders' alone. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
#include "mpi_test.h"
#include "test_main.h"
#include "tp_test.h"

static int rank, world;
static char dir[64];

static const char *const TARGETS[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};

static fsc_lora_config lora(float dropout) {
    return (fsc_lora_config){
        .rank = 4, .alpha = 8.f, .dropout = dropout, .targets = TARGETS, .ntargets = 7};
}

/* The parameters of a weights file in the one-process adapted model's flat layout. */
static float *read_adapted(const fsc_lora_config *lc, const char *path, int64_t *numel) {
    fsc_module *whole = fsc_gpt_new(&EQ_LLAMA);
    fsc_params ps;
    float *out = NULL;
    assert_int_equal(fsc_lora_apply(whole, lc, NULL), FSC_OK);
    assert_int_equal(fsc_params_bind(whole, 99, false, &ps), FSC_OK);
    if (fsc_weights_load(path, &ps, NULL) == FSC_OK) {
        out = malloc(sizeof(float) * (size_t)ps.numel);
        memcpy(out, ps.data, sizeof(float) * (size_t)ps.numel);
        *numel = ps.numel;
    }
    fsc_params_free(&ps);
    fsc_module_free(whole);
    return out;
}

/* EQ_STEPS steps of the whole global batch over the world as one TP group. */
static float *run_tp(const fsc_lora_config *lc, bool sp, int64_t *numel) {
    fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = sp};
    fsc_module *m = fsc_tp_gpt_new(&EQ_LLAMA, &opt);
    if (!m) fail_msg("fsc_tp_gpt_new: %s", fsc_last_error());
    int adapted = 0;
    if (fsc_tp_lora_apply(m, lc, &adapted)) fail_msg("fsc_tp_lora_apply: %s", fsc_last_error());
    assert_int_equal(adapted, 7 * EQ_LLAMA.layers);
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    char path[128];
    snprintf(path, sizeof path, "%s/tp_lora_%d.safetensors", dir, world);
    tp_test_train_save(m, &ps, fsc_group_world(), EQ_LLAMA.seq, 0, NULL, path);
    float *out = read_adapted(lc, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK); /* read before rewritten */
    fsc_params_free(&ps);
    fsc_module_free(m);
    return out;
}

static void expect_one_process(float dropout) {
    const fsc_lora_config lc = lora(dropout);
    int64_t ref_n;
    float *ref = eq_reference_ex(&(eq_options){.model = &EQ_LLAMA, .lora = &lc}, &ref_n);
    for (int sp = 0; sp < 2; sp++) {
        int64_t numel;
        float *got = run_tp(&lc, sp, &numel);
        assert_int_equal(numel, ref_n);
        char label[128];
        snprintf(label, sizeof label, "LLaMA LoRA r 4, dropout %g, TP %d%s, rank %d",
                 (double)dropout, world, sp ? " + SP" : "", rank);
        assert_int_equal(eq_compare(label, got, ref, ref_n), 0);
        free(got);
    }
    free(ref);
}

/* One test per adapter dropout (FSC_TEST_ROW). */
static float dropouts[] = {0.f, 0.1f};

static void test_lora(void **state) {
    expect_one_process(*(const float *)*state);
}

/* The vocabulary-parallel head is no Linear: refused by name. */
static void test_refusals(void **state) {
    (void)state;
    fsc_tp_options opt = {.group = fsc_group_world()};
    fsc_module *m = fsc_tp_gpt_new(&EQ_LLAMA, &opt);
    static const char *const head[] = {"lm_head"};
    fsc_lora_config lc = lora(0.f);
    lc.targets = head, lc.ntargets = 1;
    assert_int_equal(fsc_tp_lora_apply(m, &lc, NULL), FSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(fsc_last_error(), "lm_head is a VocabParallelEmbedding"));
    lc = lora(0.f);
    assert_int_equal(fsc_tp_lora_apply(m, &lc, NULL), FSC_OK);
    assert_int_equal(fsc_tp_lora_apply(m, &lc, NULL), FSC_ERR_INVALID); /* twice */
    assert_non_null(strstr(fsc_last_error(), "adapted already"));
    fsc_module_free(m);
}

MPI_EQ_MAIN_IN_SCRATCH("fsc_tp_lora", dir, FSC_TEST_ROW("lora", test_lora, &dropouts[0]),
                       FSC_TEST_ROW("lora_dropout", test_lora, &dropouts[1]),
                       cmocka_unit_test(test_refusals))
