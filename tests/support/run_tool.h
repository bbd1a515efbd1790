/* Running one of the tools from a cmocka test program (test_tokenize.c,
 * test_flat_shards.c): the tool's stdout and stderr go to a log file, which
 * comes back as text, so a test checks both the exit status and the message
 * it printed. Include after cmocka.h. */
#ifndef FSC_TEST_RUN_TOOL_H
#define FSC_TEST_RUN_TOOL_H

#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs tool with args (NULL-terminated, argv[0] omitted), its output into the
 * file logp and then into log (cap bytes, NUL-terminated); its exit status. */
static inline int run_tool_logged(const char *tool, const char *const *args, const char *logp,
                                  char *log, size_t cap) {
    const char *argv[32] = {tool};
    int n = 1;
    for (; args[n - 1]; n++) {
        assert_true(n < 31);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(99);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(tool, (char *const *)argv);
        _exit(98);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    FILE *fp = fopen(logp, "rb");
    assert_non_null(fp);
    size_t got = fread(log, 1, cap - 1, fp);
    log[got] = '\0';
    fclose(fp);
    return WEXITSTATUS(st);
}

#endif
