/* One flag parser for every fsc tool. A tool describes its flags as a table
 * (name, kind, where the value goes, help); the table is turned into glibc's
 * getopt_long option array, so every tool takes --flag value and
 * --flag=value, --help and --version, positional arguments anywhere, and "--"
 * to end the flags. A flag must be spelled whole (getopt's abbreviations are
 * refused, so adding a flag never changes what an old command line means). */
#ifndef FSC_TOOLS_TOOL_FLAGS_H
#define FSC_TOOLS_TOOL_FLAGS_H

#include <stdbool.h>
#include <stddef.h>

/* What a flag's value is. ARG_FLAG is a bool: "--quiet" sets it,
 * "--quiet=false" (or =0, =true, =1) says so explicitly. */
typedef enum { ARG_INT, ARG_I64, ARG_U64, ARG_DOUBLE, ARG_FLOAT, ARG_STR, ARG_FLAG } arg_kind;

typedef struct tool_flag {
    const char *name; /* without "--" */
    arg_kind kind;
    size_t offset; /* of the value in the tool's options struct */
    const char *help;
    void *ptr;        /* where the value goes instead, when not in a struct (NULL: offset) */
    const char *meta; /* the value's name in --help ("PATH"; NULL: from the kind) */
    char short_name;  /* 'o' for -o (0: none) */
} tool_flag;

typedef struct tool_cli {
    const char *prog;  /* "fsc-sample": starts --version and names the tool */
    const char *usage; /* the first lines of --help, before the flag list */
    const tool_flag *flags;
    int nflags;
    /* Optional: text after flag i's help in --help (a range, say) into buf. */
    void (*flag_note)(int i, char *buf, size_t n);
    /* Optional: printed after the flag list (the strategies, say). */
    void (*help_tail)(void);
} tool_cli;

/* tool_flags_parse returns this after printing --help or --version. */
#define TOOL_FLAGS_DONE 1

/* Parses argv[1..argc) into the struct at `base` by cli's table. given, when
 * not NULL, has cli->nflags entries: given[i] = 2 for flag i on the command
 * line. Positional arguments are moved to argv[*first .. argc) in their
 * order (first may be NULL when the tool takes none: one is then refused).
 * Returns 0, TOOL_FLAGS_DONE when --help or --version was printed on
 * stdout, or FSC_ERR_INVALID with fsc_last_error() naming the flag and what
 * was wrong (unknown, abbreviated, missing or malformed value); the caller
 * prints it after its name. String values point into argv. */
int tool_flags_parse(const tool_cli *cli, void *base, unsigned char *given, int argc, char **argv,
                     int *first);

/* Stores text v as flag f's value at f->ptr or base + f->offset (ARG_FLAG: "true",
 * "false", "1" or "0"; ARG_STR keeps the pointer). FSC_ERR_INVALID naming
 * the flag for a malformed or out-of-type value (a sign on ARG_U64). */
int tool_flag_set_value(const tool_flag *f, const char *v, void *base);

/* Prints cli's --help text on stdout: usage, one line per flag, the tail. */
void tool_flags_help(const tool_cli *cli);

#endif
