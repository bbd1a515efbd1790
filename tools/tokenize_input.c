/* fsc-tokenize's input side (tokenize_input.h): text files read whole and
 * encoded into one growing stream of token ids. Apart from fsc_tokenize.c so
 * that its libFuzzer harness (tests/fuzz/fuzz_tokenize_input.c) and the
 * allocation-failure loop (tests/io/test_alloc_failures.c) run the very code
 * the tool runs. */
#define _POSIX_C_SOURCE 200809L /* strdup, strtok_r */
#include "tokenize_input.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/io.h"

static int stream_add(tokenize_stream *s, const int32_t *ids, int64_t n) {
    if (s->n + n > s->cap) {
        int64_t cap = s->cap ? s->cap : 1 << 16;
        while (cap < s->n + n) cap *= 2;
        int32_t *p = realloc(s->ids, (size_t)cap * sizeof *p);
        if (!p) return fsc_error(FSC_ERR_NOMEM, "out of memory for %" PRId64 " tokens", cap);
        s->ids = p, s->cap = cap;
    }
    if (n) memcpy(s->ids + s->n, ids, (size_t)n * sizeof *ids);
    s->n += n;
    return FSC_OK;
}

/* A text file, whole: regular files only (a FIFO or /dev/zero is refused,
 * not waited on or read until memory runs out), of at most 16 GiB. */
static int read_file(const char *path, char **text, size_t *len) {
    return fsc_file_read_all(path, (size_t)16 << 30, text, len);
}

/* The id --eot puts before each file: <|endoftext|>, else the post-
 * processor's BOS, else LLaMA-3's <|begin_of_text|> (what llm.c's LLaMA-3
 * scripts put between documents; its tokenizer.json may have no template). */
int32_t tokenize_separator(const fsc_bpe *bpe) {
    if (!bpe) return -1;
    if (fsc_bpe_eot(bpe) >= 0) return fsc_bpe_eot(bpe);
    if (fsc_bpe_bos(bpe) >= 0) return fsc_bpe_bos(bpe);
    return fsc_bpe_token_id(bpe, "<|begin_of_text|>", 17);
}

/* Appends path's tokens (after the separator under --eot); bpe NULL: bytes. */
int tokenize_encode_file(const fsc_bpe *bpe, const char *path, bool eot, tokenize_stream *out,
                         double *bytes) {
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(path, &text, &len);
    if (rc) return rc;
    *bytes += (double)len;
    const int32_t e = tokenize_separator(bpe);
    if (eot) rc = stream_add(out, &e, 1);
    if (!rc && bpe) {
        int32_t *ids = NULL;
        int64_t n = 0;
        rc = fsc_bpe_encode(bpe, text, len, &ids, &n);
        if (!rc) rc = stream_add(out, ids, n);
        free(ids);
    } else if (!rc) {
        for (size_t i = 0; !rc && i < len; i += 65536) {
            int32_t chunk[65536];
            size_t k = len - i < 65536 ? len - i : 65536;
            for (size_t j = 0; j < k; j++) chunk[j] = (unsigned char)text[i + j];
            rc = stream_add(out, chunk, (int64_t)k);
        }
    }
    free(text);
    return rc ? fsc_error_context(rc, "%s: ", path) : FSC_OK;
}

/* Encodes a comma list of files into out. */
int tokenize_encode_list(const fsc_bpe *bpe, const char *list, bool eot, tokenize_stream *out,
                         double *bytes) {
    char *copy = strdup(list), *save = NULL;
    if (!copy) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    int rc = FSC_OK;
    for (char *p = strtok_r(copy, ",", &save); p && !rc; p = strtok_r(NULL, ",", &save))
        rc = tokenize_encode_file(bpe, p, eot, out, bytes);
    free(copy);
    return rc;
}
