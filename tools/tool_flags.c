/* The flag parser every fsc tool shares: a tool's table becomes glibc's
 * getopt_long option array (flag i answers with FLAG_VAL + i), and each value
 * is converted by its kind into the tool's options struct. getopt_long does
 * the splitting (--flag value, --flag=value, positional arguments moved to
 * the end); this file adds what getopt leaves to the caller: messages that
 * name the flag, whole spellings only, typed values. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/version.h"
#include "tool_flags.h"

enum { FLAG_VAL = 1000, HELP_VAL = 900, VERSION_VAL = 901 };

int tool_flag_set_value(const tool_flag *f, const char *v, void *base) {
    void *dst = f->ptr ? f->ptr : (char *)base + f->offset;
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case ARG_FLAG: { /* "--quiet" alone: v is NULL */
        bool on = !v || !strcmp(v, "true") || !strcmp(v, "1");
        if (!on && strcmp(v, "false") && strcmp(v, "0"))
            return fsc_error(FSC_ERR_INVALID, "--%s: \"%s\" is not true or false", f->name, v);
        *(bool *)dst = on;
        return FSC_OK;
    }
    case ARG_STR:
        *(const char **)dst = v;
        return FSC_OK;
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (x < INT32_MIN || x > INT32_MAX) errno = ERANGE;
        *(int *)dst = (int)x;
        break;
    }
    case ARG_I64:
        *(int64_t *)dst = strtoll(v, &end, 10);
        break;
    case ARG_U64: /* strtoull would take "-1" as 2^64 - 1 */
        if (strchr(v, '-'))
            return fsc_error(FSC_ERR_INVALID,
                             "--%s %s is out of range: expected an integer in [0, "
                             "18446744073709551615]",
                             f->name, v);
        *(uint64_t *)dst = strtoull(v, &end, 10);
        break;
    case ARG_DOUBLE:
        *(double *)dst = strtod(v, &end);
        break;
    case ARG_FLOAT:
        *(float *)dst = strtof(v, &end);
        break;
    }
    if (errno || end == v || *end)
        return fsc_error(FSC_ERR_INVALID, "--%s: \"%s\" is not a valid %s", f->name, v,
                         f->kind == ARG_DOUBLE || f->kind == ARG_FLOAT ? "number" : "integer");
    return FSC_OK;
}

static const char *meta_of(const tool_flag *f) {
    if (f->meta) return f->meta;
    switch (f->kind) {
    case ARG_FLAG:
        return "";
    case ARG_STR:
        return "TEXT";
    case ARG_DOUBLE:
    case ARG_FLOAT:
        return "X";
    default:
        return "N";
    }
}

static void help_line(const char *left, const char *help, const char *note) {
    if (strlen(left) <= 22)
        printf("  %-22s %s%s%s\n", left, help, *note ? " " : "", note);
    else
        printf("  %s\n  %-22s %s%s%s\n", left, "", help, *note ? " " : "", note);
}

void tool_flags_help(const tool_cli *cli) {
    printf("%s\n", cli->usage);
    for (int i = 0; i < cli->nflags; i++) {
        const tool_flag *f = &cli->flags[i];
        char left[96], note[96] = "";
        const char *meta = meta_of(f);
        if (f->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", f->short_name, f->name, *meta ? " " : "",
                     meta);
        else
            snprintf(left, sizeof left, "--%s%s%s", f->name, *meta ? " " : "", meta);
        if (cli->flag_note) cli->flag_note(i, note, sizeof note);
        help_line(left, f->help, note);
    }
    help_line("-h, --help", "this text", "");
    help_line("--version", "the version of fsc", "");
    if (cli->help_tail) cli->help_tail();
}

/* The flag a value of getopt_long belongs to (NULL for help and version). */
static const tool_flag *flag_of(const tool_cli *cli, int val) {
    if (val >= FLAG_VAL && val < FLAG_VAL + cli->nflags) return &cli->flags[val - FLAG_VAL];
    for (int i = 0; i < cli->nflags; i++)
        if (cli->flags[i].short_name && cli->flags[i].short_name == val) return &cli->flags[i];
    return NULL;
}

/* The command-line word that named the option getopt_long just returned:
 * with a separate value ("--lr 3e-4") it is the word before the value. */
static const char *option_word(char **argv, const char *value) {
    return value && value == argv[optind - 1] ? argv[optind - 2] : argv[optind - 1];
}

/* getopt_long takes any unambiguous prefix ("--lay" for --layers): refused. */
static int check_spelling(const char *word, const char *name) {
    size_t len = strcspn(word + 2, "=");
    if (!strncmp(word, "--", 2) && strlen(name) == len && !strncmp(word + 2, name, len))
        return FSC_OK;
    return fsc_error(FSC_ERR_INVALID, "unknown flag \"%.*s\" (flags are spelled in full: --%s?)",
                     (int)(len + 2), word, name);
}

/* One getopt_long result: a flag's value stored, or the reason it is not. */
static int take(const tool_cli *cli, void *base, unsigned char *given, char **argv, int c,
                int longindex) {
    const tool_flag *f = c == '?' || c == ':' ? flag_of(cli, optopt) : flag_of(cli, c);
    const char *word = c == '?' || c == ':' ? argv[optind - 1] : option_word(argv, optarg);
    if (c == ':') /* only a flag with a value can miss it */
        return fsc_error(FSC_ERR_INVALID, "--%s needs a value", f ? f->name : "?");
    if (c == '?') {
        if (optopt == HELP_VAL || optopt == VERSION_VAL)
            return fsc_error(FSC_ERR_INVALID, "--%s takes no value",
                             optopt == HELP_VAL ? "help" : "version");
        if (optopt && optopt < FLAG_VAL && !f) /* a short option this tool lacks */
            return fsc_error(FSC_ERR_INVALID, "unknown flag \"-%c\"", optopt);
        return fsc_error(FSC_ERR_INVALID, "unknown flag \"%.*s\"", (int)(strcspn(word, "=")), word);
    }
    if (longindex >= 0) {
        const char *name = f ? f->name : c == HELP_VAL ? "help" : "version";
        int rc = check_spelling(word, name);
        if (rc) return rc;
    }
    if (c == HELP_VAL || c == 'h') {
        tool_flags_help(cli);
        return TOOL_FLAGS_DONE;
    }
    if (c == VERSION_VAL) {
        printf("%s %s\n", cli->prog, fsc_version());
        return TOOL_FLAGS_DONE;
    }
    int rc = tool_flag_set_value(f, optarg, base);
    if (!rc && given) given[f - cli->flags] = 2;
    return rc;
}

int tool_flags_parse(const tool_cli *cli, void *base, unsigned char *given, int argc, char **argv,
                     int *first) {
    struct option *opts = calloc((size_t)cli->nflags + 3, sizeof *opts);
    char *shorts = malloc(2 * (size_t)cli->nflags + 3);
    if (!opts || !shorts) {
        free(opts), free(shorts);
        return fsc_error(FSC_ERR_NOMEM, "out of memory for %d flags", cli->nflags);
    }
    size_t ns = 0;
    shorts[ns++] = ':'; /* a missing value returns ':', an unknown flag '?' */
    shorts[ns++] = 'h';
    for (int i = 0; i < cli->nflags; i++) {
        const tool_flag *f = &cli->flags[i];
        int has_arg = f->kind == ARG_FLAG ? optional_argument : required_argument;
        opts[i] = (struct option){f->name, has_arg, NULL, FLAG_VAL + i};
        if (f->short_name) {
            shorts[ns++] = f->short_name;
            if (f->kind != ARG_FLAG) shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    opts[cli->nflags] = (struct option){"help", no_argument, NULL, HELP_VAL};
    opts[cli->nflags + 1] = (struct option){"version", no_argument, NULL, VERSION_VAL};
    optind = 0; /* glibc: start afresh */
    opterr = 0; /* the messages are ours */
    int rc = FSC_OK;
    for (;;) {
        int longindex = -1;
        int c = getopt_long(argc, argv, shorts, opts, &longindex);
        if (c == -1) break;
        if ((rc = take(cli, base, given, argv, c, longindex))) break;
    }
    if (!rc && first)
        *first = optind;
    else if (!rc && optind < argc)
        rc = fsc_error(FSC_ERR_INVALID, "unexpected argument \"%s\" (flags start with --)",
                       argv[optind]);
    free(opts), free(shorts);
    return rc;
}
