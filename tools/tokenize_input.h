/* fsc-tokenize's input side (tools/tokenize_input.c). */
#ifndef FSC_TOOLS_TOKENIZE_INPUT_H
#define FSC_TOOLS_TOKENIZE_INPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "fsc/tokenizer.h"

/* A growing stream of token ids (ids malloc'd; free(ids) when done). */
typedef struct {
    int32_t *ids;
    int64_t n, cap;
} tokenize_stream;

/* The id --eot puts before each file (-1 when the vocabulary has none). */
int32_t tokenize_separator(const fsc_bpe *bpe);

/* Appends path's tokens to out (after the separator when eot); bpe NULL:
 * one token per byte. *bytes grows by the file's size. FSC_OK, or an error
 * naming the file (a FIFO, device or file past 16 GiB is refused). */
int tokenize_encode_file(const fsc_bpe *bpe, const char *path, bool eot, tokenize_stream *out,
                         double *bytes);

/* tokenize_encode_file over a comma list of files (--val). */
int tokenize_encode_list(const fsc_bpe *bpe, const char *list, bool eot, tokenize_stream *out,
                         double *bytes);

#endif
