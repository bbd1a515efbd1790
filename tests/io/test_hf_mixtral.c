/* Mixtral's config.json (fsc_hf_config_parse_moe, fsc_hf_config_write): a
 * MixtralConfig reads as a LLaMA with top-2 SwiGLU experts, dropless, its
 * aux coefficient only with output_router_logits; what fsc writes for an
 * MoE LLaMA reads back as the same options (fsc's own fields for what
 * Mixtral cannot say); a dense config has no experts; what fsc's router
 * cannot do (top-1 or top-3, jitter noise) is refused naming the field. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "equivalence.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/moe.h"
#include "fsc/weights.h"

#include "tmpdir.h"

/* A MixtralConfig as Hugging Face writes one (Mixtral-8x7B's fields, a tiny shape). */
static const char *MIXTRAL =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", "
    "\"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"max_position_embeddings\": 64, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-05, "
    "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"sliding_window\": null, "
    "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"output_router_logits\": %s, "
    "\"router_aux_loss_coef\": 0.02, \"router_jitter_noise\": %s}";

static void parse(const char *logits, const char *jitter, fsc_gpt_config *c, fsc_moe_options *o,
                  int want) {
    char text[2048];
    snprintf(text, sizeof text, MIXTRAL, logits, jitter);
    assert_int_equal(fsc_hf_config_parse(text, "config.json", c), FSC_OK);
    int rc = fsc_hf_config_parse_moe(text, "config.json", o);
    if (rc != want) fprintf(stderr, "%s\n", fsc_last_error());
    assert_int_equal(rc, want);
}

static void test_mixtral_reads(void **state) {
    (void)state;
    fsc_gpt_config c;
    fsc_moe_options o;
    parse("true", "0.0", &c, &o, FSC_OK);
    assert_int_equal(c.arch, FSC_ARCH_LLAMA);
    assert_int_equal(c.ffn_hidden, 48);
    assert_int_equal(c.kv_heads, 2);
    assert_int_equal(o.experts, 8);
    assert_int_equal(o.every, 1);
    assert_int_equal(o.hidden, 0); /* the dense width, intermediate_size */
    assert_int_equal(o.expert, FSC_MOE_EXPERT_SWIGLU);
    assert_true(o.capacity_factor == 8.0f); /* dropless */
    assert_true(o.aux_coef == 0.02f);
    parse("false", "0.0", &c, &o, FSC_OK); /* Hugging Face adds no aux term then */
    assert_true(o.aux_coef == 0.f);
    /* a model of it builds, with Mixtral's names */
    c.moe = &o;
    fsc_module *m = fsc_gpt_new(&c);
    assert_non_null(m);
    fsc_params ps;
    assert_int_equal(fsc_params_bind(m, 1, false, &ps), FSC_OK);
    assert_non_null(fsc_params_find(&ps, "model.layers.1.block_sparse_moe.experts.7.w3.weight"));
    fsc_params_free(&ps);
    fsc_module_free(m);
    /* a dense LLaMA's config has no experts */
    fsc_moe_options none = {.experts = 5};
    assert_int_equal(fsc_hf_config_parse_moe("{\"model_type\": \"llama\"}", "x", &none), FSC_OK);
    assert_int_equal(none.experts, 0);
}

static void refused(const char *text, const char *needle) {
    fsc_moe_options o = {.experts = 3};
    assert_int_not_equal(fsc_hf_config_parse_moe(text, "config.json", &o), FSC_OK);
    if (!strstr(fsc_last_error(), needle)) fprintf(stderr, "message: %s\n", fsc_last_error());
    assert_non_null(strstr(fsc_last_error(), needle));
    assert_int_equal(o.experts, 3); /* unchanged on failure */
}

static void test_mixtral_refusals(void **state) {
    (void)state;
    fsc_gpt_config c;
    fsc_moe_options o;
    parse("true", "0.01", &c, &o, FSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(fsc_last_error(), "router_jitter_noise"));
    refused("{\"model_type\": \"mixtral\", \"num_local_experts\": 8, \"num_experts_per_tok\": 1}",
            "num_experts_per_tok");
    refused("{\"model_type\": \"mixtral\", \"num_local_experts\": 8, \"num_experts_per_tok\": 3}",
            "top-2");
    refused("{\"model_type\": \"mixtral\"}", "num_local_experts");
    refused("{\"model_type\": \"mixtral\", \"num_local_experts\": 1}", "at least 2");
    refused("{\"model_type\": \"mixtral\", \"num_local_experts\": 4, \"router_aux_loss_coef\": -1}",
            "router_aux_loss_coef");
    refused("[1]", "not a JSON object");
}

/* What fsc writes reads back as the same model and options: Mixtral's own
 * layout, and one with dense layers between, wider experts and drops. */
static void test_write_read_back(void **state) {
    (void)state;
    const fsc_moe_options cases[] = {
        {.experts = 4, .every = 1, .capacity_factor = 4.0f, .aux_coef = 0.02f},
        {.experts = 4, .every = 2, .capacity_factor = 1.5f, .aux_coef = 0.f, .hidden = 40},
    };
    for (int i = 0; i < 2; i++) {
        fsc_moe_options o = cases[i];
        fsc_gpt_config c = EQ_LLAMA_MOE;
        c.moe = &o;
        assert_int_equal(fsc_hf_config_write(tmp(""), &c, NULL), FSC_OK);
        fsc_gpt_config back;
        assert_int_equal(fsc_hf_config_read(tmp(""), &back), FSC_OK);
        char *text = NULL;
        assert_int_equal(fsc_file_read_all(tmp("config.json"), 1 << 20, &text, NULL), FSC_OK);
        assert_non_null(strstr(text, "\"model_type\": \"mixtral\""));
        fsc_moe_options ob;
        assert_int_equal(fsc_hf_config_parse_moe(text, "config.json", &ob), FSC_OK);
        free(text);
        assert_int_equal(ob.experts, o.experts);
        assert_int_equal(ob.every, o.every);
        assert_int_equal(ob.hidden, o.hidden);
        assert_true(ob.capacity_factor == o.capacity_factor);
        assert_true(ob.aux_coef == o.aux_coef);
        back.moe = &ob; /* the same model: the same parameter count */
        assert_int_equal(fsc_gpt_num_params(&back), fsc_gpt_num_params(&c));
        assert_int_equal(fsc_gpt_ffn_hidden(&back), 48);
    }
}

int main(void) {
    (void)write_raw; /* tmpdir.h's, unused here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral_reads),
        cmocka_unit_test(test_mixtral_refusals),
        cmocka_unit_test(test_write_read_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
