/* --vocab taken from the data or the tokenizer when it is not given, and
 * checked against them when it is (issue 28, friction 8).
 *
 * fsc-tokenize records the vocabulary's size in word 3 of an llm.c shard's
 * header (llm.c reads words 0-2 and leaves the rest 0); other shards and
 * files give their largest token id + 1. A --vocab may be larger than either
 * (nanoGPT pads GPT-2's 50257 to 50304), never smaller. */
#define _POSIX_C_SOURCE 200809L /* strtok_r, glob */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/tokenizer.h"
#include "train_common.h"

/* The first file a --data spec names (its first item, a glob's first match). */
static bool first_file(const char *spec, char *out, size_t n) {
    snprintf(out, n, "%.*s", (int)strcspn(spec, ","), spec);
    if (!strpbrk(out, "*?[")) return true;
    glob_t g;
    const int r = glob(out, 0, NULL, &g);
    const bool found = !r && g.gl_pathc > 0;
    if (found) snprintf(out, n, "%s", g.gl_pathv[0]);
    if (!r) globfree(&g);
    return found;
}

int train_vocab_declared(const train_options *o, char *source, size_t n) {
    char path[4096];
    const bool shards = !strcmp(o->data_format, "llmc") ||
                        (!strcmp(o->data_format, "auto") && strstr(o->data, ".bin"));
    if (!shards || !first_file(o->data, path, sizeof path)) return 0;
    FILE *f = fopen(path, "rb");
    unsigned char h[16];
    const bool read = f && fread(h, 1, sizeof h, f) == sizeof h;
    if (f) fclose(f);
    if (!read) return 0; /* the loader says what is wrong with it */
    uint32_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)h[4 * i] | (uint32_t)h[4 * i + 1] << 8 | (uint32_t)h[4 * i + 2] << 16 |
               (uint32_t)h[4 * i + 3] << 24;
    const bool llmc = (w[0] == 20240520 && w[1] == 1) || (w[0] == 20240801 && w[1] == 7);
    if (!llmc || w[3] == 0 || w[3] > 16777216) return 0;
    snprintf(source, n, "the header of %s", path);
    return (int)w[3];
}

int train_vocab_resolve(train_options *o, const fsc_tokens *data, const char *declared_by,
                        int declared, bool verbose) {
    const int needed = declared > data->vocab ? declared : data->vocab;
    if (train_flag_given(o, "vocab") || o->resume || o->init_from || o->tokenizer) {
        if (declared > o->model.vocab)
            return fsc_error(FSC_ERR_INVALID,
                             "--vocab %d is smaller than the %d-token vocabulary %s records "
                             "(leave --vocab out to take it)",
                             o->model.vocab, declared, declared_by);
        if (data->vocab > o->model.vocab)
            return fsc_error(FSC_ERR_INVALID,
                             "--data %s has token ids up to %d but --vocab is %d%s; raise --vocab",
                             o->data, data->vocab - 1, o->model.vocab,
                             train_flag_given(o, "vocab") ? "" : " (the model's)");
        return FSC_OK;
    }
    if (needed <= o->model.vocab) return FSC_OK; /* bytes and small ids: the default 256 */
    o->model.vocab = needed;
    if (verbose)
        fprintf(stderr, "fsc-train: --vocab %d, from %s\n", needed,
                declared ? declared_by : "the largest token id in --data");
    return FSC_OK;
}

int train_vocab_tokenizer(train_options *o, const fsc_bpe *bpe) {
    const int size = fsc_bpe_vocab_size(bpe);
    if (!train_flag_given(o, "vocab")) {
        o->model.vocab = size;
        return FSC_OK;
    }
    if (o->model.vocab < size)
        return fsc_error(FSC_ERR_INVALID,
                         "--vocab %d is smaller than --tokenizer %s's %d tokens (leave --vocab "
                         "out to take its size)",
                         o->model.vocab, o->tokenizer, size);
    return FSC_OK;
}
