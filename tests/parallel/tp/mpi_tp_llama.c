/* The LLaMA family under tensor parallelism (Megatron's split, tp_llama.c)
 * over the world as one TP group (t = 1, 2, 4), against one process:
 *  - the file a TP group saves from its initial shards is the one-process
 *    file byte for byte (every shard is the slice of the one-process weight
 *    under Hugging Face's names, lm_head included);
 *  - 5 AdamW steps on the whole global batch equal one process's by
 *    equivalence.h's noise floor, which also sums the LLaMA projections as
 *    the TP group does (q/k/v/gate/up column-parallel, o/down row-parallel):
 *    grouped-query attention with key/value heads split over the group,
 *    untied and tied heads, q/k/v biases (Qwen 2), sequence parallelism
 *    (RMSNorm on sequence shards), a vocabulary the group does not divide,
 *    decoder layers activation-checkpointed;
 *  - a group that does not divide the key/value heads is refused by name.
 * The fault row "tp_llama:drop-grad" reruns this program with the last
 * rank's share of every TP gradient reduction lost; each comparison must
 * catch it (non-SP: a column layer's input gradient; SP: RMSNorm's). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/tp.h"
#include "fsc/weights.h"
#include "mpi_test.h"
#include "tp_test.h"

static int rank, world;
static char dir[64];

/* EQ_LLAMA (8 query heads on 4 key/value heads) with this vocabulary, tied
 * embeddings and q/k/v biases or not. */
static fsc_gpt_config llama(int vocab, bool tie, bool bias) {
    fsc_gpt_config c = EQ_LLAMA;
    c.vocab = vocab, c.tie_embeddings = tie, c.qkv_bias = bias;
    return c;
}

typedef struct {
    fsc_gpt_config model;
    bool sp, checkpoint;
} llama_run;

/* Trains EQ_STEPS steps of the whole global batch over the world as one TP
 * group; returns the parameters as saved by global name, in the one-process
 * layout. With `init_file`, the initial weights are saved there too. */
static float *run_tp(const llama_run *c, const char *init_file, int64_t *numel) {
    fsc_tp_options opt = {.group = fsc_group_world(), .sequence_parallel = c->sp};
    fsc_module *m = fsc_tp_gpt_new(&c->model, &opt);
    if (!m) fail_msg("fsc_tp_gpt_new: %s", fsc_last_error());
    if (c->checkpoint)
        for (int i = 0; i < m->nchildren; i++)
            if (!strncmp(m->children[i]->name, "model.layers.", 13))
                assert_int_equal(fsc_checkpoint_wrap(m->children[i]), FSC_OK);
    fsc_params ps;
    assert_int_equal(fsc_tp_params_bind(m, 5, true, &ps), FSC_OK);
    if (init_file)
        assert_int_equal(fsc_tp_save_weights(init_file, m, &ps, fsc_group_world(), 0, NULL, NULL),
                         FSC_OK);
    char path[128];
    snprintf(path, sizeof path, "%s/tp_%d.safetensors", dir, world);
    tp_test_train_save(m, &ps, fsc_group_world(), c->model.seq, 0, NULL, path);
    float *out = eq_read_weights(&c->model, path, numel);
    if (!out) fail_msg("rank %d: %s: %s", rank, path, fsc_last_error());
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK); /* read before rewritten */
    fsc_params_free(&ps);
    fsc_module_free(m);
    return out;
}

static unsigned char *slurp(const char *path, long *n) {
    unsigned char *b = mpi_read_file(path, n);
    assert_non_null(b);
    return b;
}

/* The runs share a model; the reference and its noise floor are computed once. */
static void expect_one_process(const llama_run *runs, int n) {
    const fsc_gpt_config *model = &runs[0].model;
    int64_t ref_n;
    float *ref = eq_reference_ex(&(eq_options){.model = model, .tp = {world}}, &ref_n);
    char one[128], init[128];
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(init, sizeof init, "%s/init.safetensors", dir);
    if (rank == 0) { /* the one-process initial weights, by the same seed */
        fsc_module *m = fsc_gpt_new(model);
        fsc_params ps;
        assert_int_equal(fsc_params_bind(m, 5, false, &ps), FSC_OK);
        assert_int_equal(fsc_weights_save(one, &ps, 0, NULL, NULL), FSC_OK);
        fsc_params_free(&ps), fsc_module_free(m);
    }
    for (int i = 0; i < n; i++) {
        int64_t numel;
        float *got = run_tp(&runs[i], i == 0 ? init : NULL, &numel);
        assert_int_equal(numel, ref_n);
        if (i == 0) {
            long n1, n2;
            unsigned char *f1 = slurp(one, &n1), *f2 = slurp(init, &n2);
            assert_int_equal(n1, n2);
            assert_memory_equal(f1, f2, (size_t)n1);
            free(f1), free(f2);
        }
        char label[160];
        snprintf(label, sizeof label, "LLaMA TP %d%s, V %d%s%s%s, rank %d", world,
                 runs[i].sp ? " + SP" : "", runs[i].model.vocab,
                 runs[i].model.tie_embeddings ? ", tied" : "",
                 runs[i].model.qkv_bias ? ", qkv bias" : "", runs[i].checkpoint ? ", ckpt" : "",
                 rank);
        assert_int_equal(eq_compare(label, got, ref, ref_n), 0);
        free(got);
    }
    assert_int_equal(fsc_group_barrier(fsc_group_world()), FSC_OK);
    free(ref);
}

static void test_untied(void **state) {
    (void)state;
    llama_run runs[3] = {{.model = llama(64, false, false)},
                         {.model = llama(64, false, false), .sp = true},
                         {.model = llama(64, false, false), .sp = true, .checkpoint = true}};
    expect_one_process(runs, 3);
}

static void test_tied_bias(void **state) {
    (void)state;
    llama_run runs[2] = {{.model = llama(64, true, true)},
                         {.model = llama(64, true, true), .sp = true}};
    expect_one_process(runs, 2);
}

/* V 67: ceil(67/t) rows of embed_tokens and lm_head per rank, padding on the last */
static void test_padded_vocab(void **state) {
    (void)state;
    llama_run runs[2] = {{.model = llama(67, false, true)},
                         {.model = llama(67, false, true), .sp = true}};
    expect_one_process(runs, 2);
}

static void test_refusals(void **state) {
    (void)state;
    if (world < 2) skip();
    fsc_gpt_config c = llama(64, false, false);
    c.kv_heads = 1; /* multi-query: one key/value head cannot be split */
    fsc_tp_options opt = {.group = fsc_group_world()};
    assert_null(fsc_tp_gpt_new(&c, &opt));
    assert_non_null(strstr(fsc_last_error(), "key/value heads 1"));
    assert_non_null(strstr(fsc_last_error(), "not replicated"));
    c = llama(64, false, false);
    c.ffn_hidden = 2 * world + 1; /* the SwiGLU width must split too */
    assert_null(fsc_tp_gpt_new(&c, &opt));
    assert_non_null(strstr(fsc_last_error(), "--ffn-hidden"));
    opt.recompute_attention = true; /* GPT-2's TP option */
    c = llama(64, false, false);
    assert_null(fsc_tp_gpt_new(&c, &opt));
    assert_non_null(strstr(fsc_last_error(), "recompute_attention"));
}

MPI_EQ_MAIN_IN_SCRATCH("fsc_tp_llama", dir, cmocka_unit_test(test_untied),
                       cmocka_unit_test(test_tied_bias), cmocka_unit_test(test_padded_vocab),
                       cmocka_unit_test(test_refusals))
