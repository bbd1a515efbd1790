/* main() of a cmocka test program (tests/<folder>/test_<name>.c): the
 * entries given (cmocka_unit_test(...)) run as one group between setup and
 * teardown (NULL for none); cmocka's exit status. */
#ifndef FSC_TEST_TEST_MAIN_H
#define FSC_TEST_TEST_MAIN_H

#define FSC_TEST_MAIN(setup, teardown, ...)                                                        \
    int main(void) {                                                                               \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        return cmocka_run_group_tests(tests, setup, teardown);                                     \
    }

#endif
