/* Learning-rate schedules (fsc_lr_schedule): constant, warmup + cosine
 * (to min_lr or a ratio of max_lr), warmup + constant, at their ends and
 * in between; invalid schedules refused naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/optim.h"
#include "test_main.h"

static void test_schedules(void **state) {
    (void)state;
    fsc_lr_schedule_config constant = {.kind = FSC_LR_CONSTANT, .max_lr = 0.5f};
    assert_int_equal(fsc_lr_schedule_check(&constant), FSC_OK);
    assert_true(fsc_lr_schedule(&constant, 0) == 0.5f);
    assert_true(fsc_lr_schedule(&constant, 1000000) == 0.5f);

    /* warm-up 4, cosine over steps 4..13 to 0.1 */
    fsc_lr_schedule_config cos = {.kind = FSC_LR_WARMUP_COSINE,
                                  .max_lr = 1.0f,
                                  .warmup_steps = 4,
                                  .total_steps = 14,
                                  .min_lr = 0.1f};
    assert_int_equal(fsc_lr_schedule_check(&cos), FSC_OK);
    const float want[] = {
        0.25f,
        0.5f,
        0.75f,
        1.0f,                                      /* (s+1)/4 */
        1.0f,                                      /* s=4: progress 0 */
        0.1f + 0.9f * 0.5f * (1.0f + 0.95105652f), /* s=5: cos(pi/10) */
        0.1f + 0.9f * 0.5f * (1.0f + 0.80901699f), /* s=6: cos(pi/5) */
        0.1f + 0.9f * 0.5f * (1.0f + 0.58778525f), /* s=7 */
        0.1f + 0.9f * 0.5f * (1.0f + 0.30901699f), /* s=8 */
        0.55f,                                     /* s=9: half way, cos(pi/2) = 0 */
        0.1f + 0.9f * 0.5f * (1.0f - 0.30901699f), /* s=10 */
        0.1f + 0.9f * 0.5f * (1.0f - 0.58778525f), /* s=11 */
        0.1f + 0.9f * 0.5f * (1.0f - 0.80901699f), /* s=12 */
        0.1f + 0.9f * 0.5f * (1.0f - 0.95105652f), /* s=13 */
        0.1f,
        0.1f, /* s >= total: min_lr */
    };
    for (int s = 0; s < (int)(sizeof want / sizeof *want); s++) {
        float got = fsc_lr_schedule(&cos, s);
        if (fabsf(got - want[s]) > 1e-6f)
            fprintf(stderr, "cosine step %d: %g vs %g\n", s, got, want[s]);
        assert_true(fabsf(got - want[s]) <= 1e-6f);
    }
    assert_true(fsc_lr_schedule(&cos, -3) == 0.25f); /* negative counts as 0 */
    assert_true(fsc_lr_schedule(&cos, 1000) == 0.1f);

    /* min from a ratio; no warm-up */
    fsc_lr_schedule_config ratio = {
        .kind = FSC_LR_WARMUP_COSINE, .max_lr = 2.0f, .total_steps = 10, .min_lr_ratio = 0.1f};
    assert_true(fsc_lr_schedule(&ratio, 0) == 2.0f);
    assert_true(fabsf(fsc_lr_schedule(&ratio, 5) - 1.1f) <= 1e-6f);
    assert_true(fabsf(fsc_lr_schedule(&ratio, 10) - 0.2f) <= 1e-7f);

    fsc_lr_schedule_config wc = {
        .kind = FSC_LR_WARMUP_CONSTANT, .max_lr = 3e-4f, .warmup_steps = 10};
    assert_true(fabsf(fsc_lr_schedule(&wc, 0) - 3e-5f) <= 1e-11f);
    assert_true(fabsf(fsc_lr_schedule(&wc, 4) - 1.5e-4f) <= 1e-10f);
    assert_true(fsc_lr_schedule(&wc, 9) == 3e-4f);
    assert_true(fsc_lr_schedule(&wc, 500) == 3e-4f);

    /* invalid schedules are refused by name */
    fsc_lr_schedule_config bad[] = {cos, cos, cos, constant};
    bad[0].total_steps = 2, bad[1].warmup_steps = -1, bad[2].min_lr = 2.0f, bad[3].max_lr = -1.0f;
    const char *field[] = {"total_steps", "warmup_steps", "min_lr", "max_lr"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(fsc_lr_schedule_check(&bad[i]), FSC_ERR_INVALID);
        assert_non_null(strstr(fsc_last_error(), field[i]));
    }
}

FSC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_schedules))
