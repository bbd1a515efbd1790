/* main() of a cmocka test program (tests/<folder>/test_<name>.c): the
 * entries given (cmocka_unit_test(...)) run as one group between setup and
 * teardown (NULL for none); cmocka's exit status. And the entry of a
 * table's row. */
#ifndef FSC_TEST_TEST_MAIN_H
#define FSC_TEST_TEST_MAIN_H

#define FSC_TEST_MAIN(setup, teardown, ...)                                                        \
    int main(void) {                                                                               \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                           \
        return cmocka_run_group_tests(tests, setup, teardown);                                     \
    }

/* One row of a table-driven test: cmocka's test `name` runs fn with *state
 * set to row (a pointer to the row, not const), so that one function serves
 * every row of a table and each row still passes, fails or skips under its
 * own name. */
#define FSC_TEST_ROW(name, fn, row)                                                                \
    { (name), (fn), NULL, NULL, (row) }

#endif
