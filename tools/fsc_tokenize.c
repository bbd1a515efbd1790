/* fsc-tokenize: text files into llm.c token shards, train and val.
 *
 *   fsc-tokenize -o data/book book.txt [more.txt ...] [--val-fraction 0.1 | --val v.txt]
 *
 * writes data/book_train_000000.bin ... and data/book_val_000000.bin, the
 * names llm.c's scripts use, so `fsc-train --data 'data/book_*.bin'` trains
 * on the first and evaluates on the second. Each file is encoded whole with
 * a byte-level BPE (fsc/tokenizer.h: GPT-2's files or a Hugging Face
 * tokenizer.json; "--tokenizer bytes": one token per byte),
 * the files in the order given; the val tokens are the last --val-fraction
 * of that stream (the tail fsc-train's own --val-fraction would hold out),
 * or the encoding of --val's files. Shards are version 1 (uint16 tokens)
 * when the vocabulary fits 16 bits, else version 7 (uint32), each written
 * to a temporary name and renamed, so a shard that exists is whole. */
#define _POSIX_C_SOURCE 200809L /* fileno, fsync */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsc/core.h"
#include "fsc/io.h"
#include "fsc/tokenizer.h"
#include "tokenize_input.h"
#include "tool_flags.h"

#define SHARD_MAGIC_V1 20240520
#define SHARD_MAGIC_V7 20240801
#define SHARD_MAX_TOKENS 2147483647LL /* the header's count is an int32 */

typedef struct {
    const char *output, *tokenizer, *val;
    double val_fraction;
    int64_t shard_tokens;
    int shard_version; /* 0: by the vocabulary */
    bool eot, quiet;
} tokenize_options;

#define F(name_, kind_, field, meta_, help_)                                                       \
    {                                                                                              \
        .name = name_, .kind = kind_, .offset = offsetof(tokenize_options, field), .meta = meta_,  \
        .help = help_                                                                              \
    }
static const tool_flag FLAGS[] = {
    {.name = "output",
     .kind = ARG_STR,
     .offset = offsetof(tokenize_options, output),
     .meta = "PREFIX",
     .short_name = 'o',
     .help = "write PREFIX_train_NNNNNN.bin and PREFIX_val_NNNNNN.bin (required)"},
    F("tokenizer", ARG_STR, tokenizer, "DIR|FILE",
      "a tokenizer.json file, or a directory with tokenizer.json, GPT-2's encoder.json + "
      "vocab.bpe, or vocab.json + merges.txt (default $FSC_GPT2_BPE_DIR or ~/.cache/fsc/gpt2, "
      "where scripts/fetch_gpt2_bpe.sh puts GPT-2's), or \"bytes\": one token per byte "
      "(vocab 256)"),
    F("val-fraction", ARG_DOUBLE, val_fraction, "X",
      "the last X of the tokens go to the val shards (default 0.1; 0: no val shards) [0, 1)"),
    F("val", ARG_STR, val, "FILE[,FILE]", "text files for the val shards instead of a tail"),
    F("eot", ARG_FLAG, eot, NULL,
      "put <|endoftext|> (else the tokenizer's BOS, else <|begin_of_text|>) before each file, "
      "as llm.c's scripts do between documents"),
    F("shard-tokens", ARG_I64, shard_tokens, "N",
      "tokens per shard, the last one shorter (default 100000000) [1, 2147483647]"),
    F("shard-version", ARG_INT, shard_version, "1|7",
      "1: uint16 tokens, 7: uint32 tokens (default: 1 when the vocabulary fits 16 bits)"),
    F("quiet", ARG_FLAG, quiet, NULL, "no summary on stderr"),
};
#undef F

/* One shard: 256 little-endian int32 header words (magic, version, count,
 * and the vocabulary's size: a word llm.c leaves 0 and ignores, from which
 * fsc-train takes --vocab), then the tokens, 2 or 4 bytes each; written atomically (an
 * unpredictable temporary, fsynced, renamed: a link planted beside it is never followed). */
static int write_shard(const char *path, const int32_t *ids, int64_t n, int version, int vocab) {
    const int width = version == 1 ? 2 : 4;
    const size_t bytes = 1024 + (size_t)n * (size_t)width;
    unsigned char *h = calloc(bytes, 1), *t = h + 1024;
    if (!h) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory for %zu bytes", path, bytes);
    const uint32_t words[4] = {version == 1 ? SHARD_MAGIC_V1 : SHARD_MAGIC_V7, (uint32_t)version,
                               (uint32_t)n, (uint32_t)vocab};
    for (int w = 0; w < 4; w++)
        for (int k = 0; k < 4; k++) h[4 * w + k] = (unsigned char)(words[w] >> (8 * k));
    for (int64_t j = 0; j < n; j++)
        for (int b = 0; b < width; b++)
            t[j * width + b] = (unsigned char)((uint32_t)ids[j] >> (8 * b));
    int rc = fsc_file_write_atomic(path, h, bytes);
    free(h);
    return rc;
}

/* PREFIX_<split>_000000.bin, ...: n tokens in shards of --shard-tokens. */
static int write_split(const tokenize_options *o, const char *split, const int32_t *ids, int64_t n,
                       int version, int vocab) {
    int64_t shards = (n + o->shard_tokens - 1) / o->shard_tokens;
    for (int64_t s = 0; s < shards; s++) {
        char path[4096];
        const int64_t first = s * o->shard_tokens;
        const int64_t k = n - first < o->shard_tokens ? n - first : o->shard_tokens;
        snprintf(path, sizeof path, "%s_%s_%06" PRId64 ".bin", o->output, split, s);
        int rc = write_shard(path, ids + first, k, version, vocab);
        if (rc) return rc;
        if (!o->quiet)
            fprintf(stderr, "fsc-tokenize: %s: %" PRId64 " tokens (version %d)\n", path, k,
                    version);
    }
    return FSC_OK;
}

/* The directories of -o PREFIX (data/gpt2/book: data and data/gpt2), made
 * as mkdir -p would, before any encoding: a prefix that cannot be written is
 * refused at once, naming the directory and why. */
static int make_output_dirs(const char *prefix) {
    char dir[4096];
    const char *slash = strrchr(prefix, '/');
    if (!slash || slash == prefix) return FSC_OK; /* the working directory, or / */
    if ((size_t)(slash - prefix) >= sizeof dir)
        return fsc_error(FSC_ERR_INVALID, "-o %.64s...: the path is too long", prefix);
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - prefix), prefix);
    for (char *p = dir + 1;; p++) {
        const bool end = *p == '\0';
        if (!end && *p != '/') continue;
        *p = '\0';
        struct stat sb;
        if (mkdir(dir, 0777) && errno != EEXIST)
            return fsc_error(FSC_ERR_IO, "-o %s: cannot create the directory %s (%s)", prefix, dir,
                             strerror(errno));
        if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
            return fsc_error(FSC_ERR_IO, "-o %s: %s is not a directory", prefix, dir);
        if (end) return FSC_OK;
        *p = '/';
    }
}

static const char *USAGE =
    "usage: fsc-tokenize -o PREFIX [flags] TEXT [TEXT ...]\n"
    "Encodes text files (in the order given) with a byte-level BPE (GPT-2's files or a\n"
    "tokenizer.json) into llm.c token shards:\n"
    "PREFIX_train_000000.bin, ... and PREFIX_val_000000.bin, which fsc-train --data\n"
    "'PREFIX_*.bin' trains on and evaluates on. Version-1 shards (uint16 tokens) when the\n"
    "vocabulary fits 16 bits, else version 7 (uint32). Exit status: 0 done, 1 error, 2 usage.";

/* 0, or 2 after printing why the command line is wrong. */
static int check(const tokenize_options *o, const unsigned char *given, int nfiles) {
    const char *why = NULL;
    if (!o->output)
        why = "-o/--output PREFIX is required";
    else if (nfiles < 1)
        why = "no text file given";
    else if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        why = "--val-fraction: expected a number in [0, 1)";
    else if (o->val && given[2]) /* FLAGS[2]: --val-fraction */
        why = "give --val or --val-fraction, not both";
    else if (o->shard_tokens < 1 || o->shard_tokens > SHARD_MAX_TOKENS)
        why = "--shard-tokens: expected an integer in [1, 2147483647]";
    else if (o->shard_version != 0 && o->shard_version != 1 && o->shard_version != 7)
        why = "--shard-version: expected 1 or 7";
    if (!why) return 0;
    fprintf(stderr, "fsc-tokenize: %s (see --help)\n", why);
    return 2;
}

static int load_tokenizer(const char *dir, fsc_bpe **bpe) {
    char deflt[4096];
    if (!dir) {
        const char *env, *xdg = getenv("XDG_CACHE_HOME");
        fsc_env_string("FSC_GPT2_BPE_DIR", &env);
        if (env)
            snprintf(deflt, sizeof deflt, "%s", env);
        else if (xdg && *xdg)
            snprintf(deflt, sizeof deflt, "%s/fsc/gpt2", xdg);
        else
            snprintf(deflt, sizeof deflt, "~/.cache/fsc/gpt2");
        dir = deflt;
    }
    if (!strcmp(dir, "bytes")) return FSC_OK;
    int rc = fsc_bpe_load(dir, bpe);
    if (rc)
        fprintf(stderr,
                "fsc-tokenize: --tokenizer %s: %s\n"
                "GPT-2's encoder.json and vocab.bpe are not shipped with fsc: "
                "scripts/fetch_gpt2_bpe.sh [DIR] fetches them into ~/.cache/fsc/gpt2, the "
                "default (scripts/fetch_tokenizers.sh: LLaMA-3's and GPT-2's tokenizer.json); "
                "or give --tokenizer bytes for byte tokens\n",
                dir, fsc_last_error());
    return rc;
}

int main(int argc, char **argv) {
    tokenize_options o = {.val_fraction = 0.1, .shard_tokens = 100000000};
    unsigned char given[sizeof FLAGS / sizeof *FLAGS] = {0};
    const tool_cli cli = {.prog = "fsc-tokenize",
                          .usage = USAGE,
                          .flags = FLAGS,
                          .nflags = (int)(sizeof FLAGS / sizeof *FLAGS)};
    int first = 0, rc = tool_flags_parse(&cli, &o, given, argc, argv, &first);
    if (rc == TOOL_FLAGS_DONE) return 0;
    if (rc) return fprintf(stderr, "fsc-tokenize: %s (see --help)\n", fsc_last_error()), 2;
    if ((rc = check(&o, given, argc - first))) return rc;
    if (make_output_dirs(o.output))
        return fprintf(stderr, "fsc-tokenize: %s\n", fsc_last_error()), 1;
    fsc_bpe *bpe = NULL;
    if (load_tokenizer(o.tokenizer, &bpe)) return 1;
    const int vocab = bpe ? fsc_bpe_vocab_size(bpe) : 256;
    const int version = o.shard_version ? o.shard_version : vocab <= 65536 ? 1 : 7;
    tokenize_stream train = {0}, val = {0};
    double bytes = 0, t0 = fsc_now();
    if (o.eot && !bpe)
        rc = fsc_error(FSC_ERR_INVALID, "--eot: --tokenizer bytes has no <|endoftext|> token");
    else if (o.eot && tokenize_separator(bpe) < 0)
        rc = fsc_error(FSC_ERR_INVALID,
                       "--eot: this vocabulary has no <|endoftext|>, BOS or <|begin_of_text|>");
    else if (version == 1 && vocab > 65536)
        rc = fsc_error(FSC_ERR_INVALID,
                       "--shard-version 1 holds uint16 tokens, but the vocabulary has %d", vocab);
    for (int i = first; !rc && i < argc; i++) rc = tokenize_encode_file(bpe, argv[i], o.eot, &train, &bytes);
    if (!rc && o.val) rc = tokenize_encode_list(bpe, o.val, o.eot, &val, &bytes);
    int64_t nval = o.val ? val.n : (int64_t)llround(o.val_fraction * (double)train.n);
    if (!rc && !o.val && o.val_fraction > 0 && (nval < 1 || nval >= train.n))
        rc = fsc_error(FSC_ERR_INVALID,
                       "--val-fraction %g of %" PRId64 " tokens leaves %s: give more text, "
                       "another fraction, or --val-fraction 0",
                       o.val_fraction, train.n, nval < 1 ? "no val tokens" : "no train tokens");
    if (!rc && train.n - (o.val ? 0 : nval) < 1)
        rc = fsc_error(FSC_ERR_INVALID, "the text files hold no tokens");
    const double seconds = fsc_now() - t0;
    const int32_t *val_ids = o.val ? val.ids : train.ids + (train.n - nval);
    const int64_t ntrain = train.n - (o.val ? 0 : nval);
    if (!rc) rc = write_split(&o, "train", train.ids, ntrain, version, vocab);
    if (!rc && nval) rc = write_split(&o, "val", val_ids, nval, version, vocab);
    if (rc)
        fprintf(stderr, "fsc-tokenize: %s\n", fsc_last_error());
    else if (!o.quiet)
        fprintf(stderr,
                "fsc-tokenize: %.0f bytes of text -> %" PRId64 " train + %" PRId64
                " val tokens (%s, vocab %d), encoded in %.2f s (%.2f MB/s)\n",
                bytes, ntrain, nval, bpe ? "BPE" : "bytes", vocab, seconds,
                seconds > 0 ? bytes / seconds / 1e6 : 0);
    free(train.ids), free(val.ids);
    fsc_bpe_free(bpe);
    return rc ? 1 : 0;
}
