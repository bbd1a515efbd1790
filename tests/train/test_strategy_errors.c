/* The messages of common mistakes with a strategy, as a user reads them: a
 * strategy that needs ranks without fsc_dist_init says to call it, and no
 * prefix is said twice ("DDP: DDP:", "strategy ddp: strategy ddp:"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/strategy.h"
#include "test_main.h"

/* Exits the test unless msg holds none of the prefixes twice in a row. */
static void assert_no_doubled_prefix(const char *msg) {
    static const char *const twice[] = {
        "DDP: DDP:", "FSDP: FSDP:", "strategy ddp: strategy ddp:", "strategy fsdp: strategy fsdp:"};
    for (size_t i = 0; i < sizeof twice / sizeof *twice; i++)
        if (strstr(msg, twice[i])) fail_msg("doubled prefix in: %s", msg);
}

static const char *refusal(const fsc_strategy_options *opt) {
    fsc_module *m = fsc_linear_new("fc", 4, 3, true, FSC_WEIGHT_OUT_IN, 0.02f);
    assert_non_null(m);
    const fsc_optim_config adamw = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-3};
    fsc_clear_error();
    fsc_strategy *s = fsc_strategy_new(m, &adamw, opt);
    assert_null(s);
    fsc_module_free(m);
    return fsc_last_error();
}

static void test_ddp_without_dist_init(void **state) {
    (void)state;
    const char *msg = refusal(&(fsc_strategy_options){.name = "ddp"});
    assert_no_doubled_prefix(msg);
    if (!strstr(msg, "fsc_dist_init")) fail_msg("no hint to call fsc_dist_init: %s", msg);
}

static void test_option_that_does_not_apply(void **state) {
    (void)state;
    const char *msg = refusal(&(fsc_strategy_options){.name = "ddp", .min_params = 10});
    assert_no_doubled_prefix(msg);
    if (strncmp(msg, "strategy ddp: ", 14)) fail_msg("the strategy is not named: %s", msg);
}

static void test_error_context_names_once(void **state) {
    (void)state;
    fsc_error(FSC_ERR_INVALID, "FSDP: unit 'h.0' has no parameters");
    fsc_error_context(FSC_ERR_INVALID, "FSDP: ");
    assert_string_equal(fsc_last_error(), "FSDP: unit 'h.0' has no parameters");
    fsc_error_context(FSC_ERR_INVALID, "strategy fsdp: ");
    assert_string_equal(fsc_last_error(), "strategy fsdp: FSDP: unit 'h.0' has no parameters");
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_ddp_without_dist_init),
              cmocka_unit_test(test_option_that_does_not_apply),
              cmocka_unit_test(test_error_context_names_once))
