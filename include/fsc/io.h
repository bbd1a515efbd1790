/* fsc io: safetensors files and token data sources (floor 6).
 *
 * Files interoperate (docs/architecture.md, decision 9): weights are safetensors, token
 * data is llm.c's shard format, read as is. Every reader validates a file
 * completely before trusting any number in it, so a lying header gives a
 * clear error, never a crash or a giant allocation. Every writer is atomic:
 * a failed save leaves the previous file untouched.
 */
#ifndef FSC_IO_H
#define FSC_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fsc/core.h"
#include "fsc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== safetensors ========================================================== */
/* Layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * then the data buffer; offsets are relative to the start of the data. */

#define FSC_ST_MAX_HEADER (100u * 1000u * 1000u) /* header bytes accepted by the reader */

typedef struct fsc_st_file fsc_st_file;

/* One tensor in a file. Names and pointers live as long as the file handle. */
typedef struct fsc_st_entry {
    const char *name;
    fsc_dtype dtype;
    int ndim; /* 0..FSC_MAX_DIMS (0 is a scalar) */
    int64_t shape[FSC_MAX_DIMS];
    uint64_t offset; /* absolute byte offset of the data in the file */
    uint64_t nbytes;
} fsc_st_entry;

/* Opens and fully validates `path` (header length, JSON, every entry, offsets,
 * overlaps, duplicates, metadata). Data is read lazily with pread. A tensor of
 * a safetensors dtype fsc has no tensors of (BOOL, U8, I8, I16, U32, U64, F64)
 * is checked, then left out of the index with an info-level note. Returns
 * NULL and sets *status (if non-NULL) and the error message on failure
 * (FSC_ERR_IO, FSC_ERR_FORMAT, FSC_ERR_INVALID for a NULL path). The caller
 * owns the handle, which keeps the file open until fsc_st_close. */
FSC_API fsc_st_file *fsc_st_open(const char *path, int *status);
/* Closes the file and frees the handle, its entries and names. Accepts NULL. */
FSC_API void fsc_st_close(fsc_st_file *f);

/* Entries are ordered by their data offset. */
FSC_API int fsc_st_count(const fsc_st_file *f); /* tensors in the file; 0 for NULL */
FSC_API const fsc_st_entry *fsc_st_entry_at(const fsc_st_file *f, int i); /* NULL if out of range */
FSC_API const fsc_st_entry *fsc_st_find(const fsc_st_file *f,
                                        const char *name); /* NULL if absent */
/* The metadata value for `key` (owned by f), or NULL (also for NULL f or key). */
FSC_API const char *fsc_st_metadata(const fsc_st_file *f, const char *key);
FSC_API int fsc_st_metadata_count(const fsc_st_file *f); /* metadata pairs; 0 for NULL */
/* The i-th metadata pair (strings owned by f; key or value may be NULL to
 * skip it); FSC_ERR_INVALID if i is out of range or f is NULL. */
FSC_API int fsc_st_metadata_at(const fsc_st_file *f, int i, const char **key, const char **value);

/* Copies tensor `name` into dst->data (caller storage). dst's shape must equal
 * the file's; the dtype may differ between F32 and BF16/F16 (converted).
 * FSC_ERR_NOT_FOUND, FSC_ERR_SHAPE or FSC_ERR_DTYPE with the name and both shapes;
 * FSC_ERR_INVALID for a NULL argument or dst->data; FSC_ERR_IO if the read fails. */
FSC_API int fsc_st_read(fsc_st_file *f, const char *name, fsc_tensor *dst);
/* Raw bytes [offset, offset+nbytes) of an entry's data, for reading slices
 * (shards) without the whole tensor. e must be an entry of f. FSC_ERR_INVALID
 * if the range is outside or an argument is NULL (dst may be NULL for 0 bytes). */
FSC_API int fsc_st_read_bytes(fsc_st_file *f, const fsc_st_entry *e, uint64_t offset, void *dst,
                              size_t nbytes);

/* ---- streaming writer --------------------------------------------------------
 * Two phases, so data is never buffered: declare every tensor (and metadata),
 * then write the data in declaration order. The header goes out with the first
 * data write; a tensor's data may arrive in several chunks. Everything goes to
 * `path.tmp.<pid>`, which close() fsyncs and renames over `path`.
 * After any failure the writer is failed: later calls return that first error,
 * and close() removes the temporary and returns it. close() also fails if a
 * declared tensor was not completely written. Zero-byte tensors need no write. */
typedef struct fsc_st_writer fsc_st_writer;

/* Starts writing `path.tmp.<pid>`. NULL (error set, *status if non-NULL) for
 * an empty path or an unwritable place. The caller owns the writer until
 * fsc_st_writer_close or fsc_st_writer_abort, which free it. */
FSC_API fsc_st_writer *fsc_st_writer_open(const char *path, int *status);
/* Declares a tensor (name copied). FSC_ERR_INVALID for a NULL writer, a NULL,
 * "__metadata__" or repeated name, or a declaration after data writing began;
 * FSC_ERR_DTYPE, FSC_ERR_SHAPE for a bad dtype, ndim or dim. */
FSC_API int fsc_st_writer_declare(fsc_st_writer *w, const char *name, fsc_dtype dtype, int ndim,
                                  const int64_t *shape);
/* Adds a metadata pair (copied). FSC_ERR_INVALID for a NULL writer, key or
 * value, a key set twice, or a call after data writing began. */
FSC_API int fsc_st_writer_set_metadata(fsc_st_writer *w, const char *key, const char *value);
/* Appends nbytes of raw data to tensor `name`, which must be the first
 * declared tensor not yet complete; nbytes may not exceed what it still needs
 * (FSC_ERR_NOT_FOUND for an undeclared name, FSC_ERR_INVALID out of order,
 * FSC_ERR_SHAPE for too many bytes). data is borrowed for the call. */
FSC_API int fsc_st_writer_write(fsc_st_writer *w, const char *name, const void *data,
                                size_t nbytes);
/* Writes the whole of tensor `name` from t, converting F32 <-> BF16/F16 when
 * t's dtype differs from the declared one; t's numel must match the declaration. */
FSC_API int fsc_st_writer_write_tensor(fsc_st_writer *w, const char *name, const fsc_tensor *t);
/* Commits (fsync + rename) and frees w. Returns the first error, if any; on
 * error nothing at `path` has changed. Accepts NULL (returns FSC_ERR_INVALID). */
FSC_API int fsc_st_writer_close(fsc_st_writer *w);
/* Discards everything written and frees w; `path` is untouched. Accepts NULL. */
FSC_API void fsc_st_writer_abort(fsc_st_writer *w);

/* Saves n tensors under names[i] (dtypes as the tensors have them) in one
 * atomic write. metadata is NULL or a NULL-terminated list of key, value pairs:
 * (const char *[]){"format", "pt", NULL}. Errors as the writer's calls;
 * FSC_ERR_INVALID for n < 0, or n > 0 with NULL names or tensors. */
FSC_API int fsc_st_save(const char *path, int n, const char *const *names,
                        const fsc_tensor *tensors, const char *const *metadata);

/* ==== token data ============================================================ */

/* A token stream in memory. Owns `data` (tagged FSC_MEM_WORK). */
typedef struct fsc_tokens {
    void *data;      /* count tokens of `dtype` */
    fsc_dtype dtype; /* FSC_DTYPE_U16 (bytes, version-1 shards, nanoGPT) or FSC_DTYPE_I32 */
    int64_t count;
    int vocab; /* declared (256 for byte streams) or max token + 1 */
} fsc_tokens;

/* Loads a token stream from `spec`:
 *   "builtin"                  the generated corpus, seed 1337, 2 MB
 *   "builtin:SEED" / "builtin:SEED:BYTES"
 *   "a.bin,b.bin" or "dir/train_*.bin"   llm.c shards, concatenated in order;
 *                              globs sorted. A shard is magic 20240520, version 1,
 *                              uint16 tokens (GPT-2), or magic 20240801, version 7,
 *                              uint32 tokens (LLaMA-3); a list may mix them
 *   "book.txt"                 any other file: its bytes are the tokens (vocab 256)
 * Items of a comma list are each a path or a glob; a list may not mix shards
 * (".bin") with byte files. On failure *out is zeroed and the message says which
 * file and what was wrong. The caller owns *out (fsc_tokens_free).
 * FSC_ERR_INVALID for a NULL out or an empty spec. Same as
 * fsc_tokens_load_as(spec, FSC_DATA_AUTO, out). */
FSC_API int fsc_tokens_load(const char *spec, fsc_tokens *out);

/* How the files of a token spec are read. */
typedef enum fsc_data_format {
    FSC_DATA_AUTO = 0, /* by name, as fsc_tokens_load: ".bin" an llm.c shard, else bytes */
    FSC_DATA_LLMC,     /* every file an llm.c shard (version 1 or 7), whatever its name */
    FSC_DATA_NANOGPT,  /* every file nanoGPT's raw train.bin: uint16 tokens, no header */
} fsc_data_format;

/* fsc_tokens_load with the files read as `format`. Streams of uint32 tokens
 * (version-7 shards) are FSC_DTYPE_I32; a token id at or above 2^31 - 1 is
 * refused (FSC_ERR_FORMAT, naming the file and the token). The built-in
 * corpus takes FSC_DATA_AUTO only (FSC_ERR_INVALID otherwise). */
FSC_API int fsc_tokens_load_as(const char *spec, fsc_data_format format, fsc_tokens *out);
/* "auto", "llmc" or "nanogpt" into *out; FSC_ERR_INVALID naming the choices. */
FSC_API int fsc_data_format_parse(const char *name, fsc_data_format *out);
FSC_API void fsc_tokens_free(fsc_tokens *tk); /* frees data and zeroes *tk; accepts NULL */
/* Copies n int32 tokens; vocab 0 means max token + 1. Tokens must be in [0, vocab).
 * FSC_ERR_INVALID (naming the first bad token) for NULL tok, n <= 0, vocab < 0
 * or a token out of range. The caller owns *out (fsc_tokens_free); zeroed on failure. */
FSC_API int fsc_tokens_from_i32(const int32_t *tok, int64_t n, int vocab, fsc_tokens *out);
/* The byte-level corpus, as tokens (vocab 256): nbytes in 1..2^32
 * (FSC_ERR_INVALID otherwise). The caller owns *out (fsc_tokens_free). */
FSC_API int fsc_tokens_builtin(uint64_t seed, size_t nbytes, fsc_tokens *out);
/* Token i (0 <= i < count); no checks: tk must be loaded and i in range. */
FSC_API int32_t fsc_tokens_at(const fsc_tokens *tk, int64_t i);
/* Windows of T tokens in one pass over the stream: floor(count / T); 0 for
 * NULL tk or T < 1. */
FSC_API int64_t fsc_tokens_num_windows(const fsc_tokens *tk, int T);

/* ---- guarded files (for programs: the tools use these) ------------------------ */
/* Reads the whole of path into *data (malloc'd, NUL-terminated; *len its bytes
 * when len is not NULL). Only a regular file is read: a FIFO, a device, a
 * directory or a file over max_bytes is refused (FSC_ERR_IO naming path and
 * what it is), and nothing blocks or grows without bound. */
FSC_API int fsc_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len);
/* A stdio stream on path for reading, refused as fsc_file_read_all refuses
 * anything but a regular file. The caller fcloses *out. */
FSC_API int fsc_file_open_read(const char *path, FILE **out);
/* Writes n bytes as path atomically: into a new temporary beside it with an
 * unpredictable name (created O_EXCL | O_NOFOLLOW, so no planted link is
 * followed), fsynced, renamed over path, the directory fsynced. On failure
 * path is as it was and the temporary is gone. */
FSC_API int fsc_file_write_atomic(const char *path, const void *data, size_t n);

/* Writes an llm.c shard (256 int32 header words, then uint16 tokens), atomically.
 * FSC_ERR_INVALID for n outside [0, INT32_MAX] or NULL tok with n > 0. */
FSC_API int fsc_shard_write(const char *path, const uint16_t *tok, int64_t n);

/* ---- the built-in corpus ------------------------------------------------------
 * Deterministic in the seed, printable ASCII plus '\n': sentences from a small
 * grammar with subject-verb agreement, additions ("17+25=42"), counting runs,
 * and lines that repeat an earlier phrase. Fills out[0..nbytes). If nats_per_byte
 * is non-NULL it receives the randomness drawn per byte, an upper bound on the
 * best achievable loss (uniform bytes would be ln 256 = 5.55). FSC_ERR_INVALID
 * for NULL out with nbytes > 0. */
FSC_API int fsc_corpus_generate(uint64_t seed, size_t nbytes, char *out, double *nats_per_byte);

/* ---- batches: the public contract every data-parallel layout shares -----------
 * Sequence i is x = tok[i*T .. i*T+T), y = tok[i*T+1 .. i*T+T+1), token indices
 * taken modulo count. Step s uses sequences s*G .. s*G+G-1, G = batch*grad_accum*dp;
 * micro-step k of rank r takes sequences s*G + k*batch*dp + r*batch + [0, batch).
 * So ranks 0..dp-1 of one micro-step together read one contiguous run. */

/* Global sequence index of row 0 for (step, micro, rank); keys dropout.
 * Returns -1 if an argument is out of range or the index overflows. */
FSC_API int64_t fsc_batch_first_sample(int64_t step, int micro, int rank, int batch, int grad_accum,
                                       int dp);
/* Fills x and y, each (batch, T) int32 (caller storage). Refuses streams shorter
 * than T+1 tokens; FSC_ERR_INVALID for that, a NULL argument, or indices that
 * fsc_batch_first_sample refuses. */
FSC_API int fsc_tokens_batch(const fsc_tokens *tk, int64_t step, int micro, int rank, int batch,
                             int grad_accum, int dp, int T, int32_t *x, int32_t *y);

#ifdef __cplusplus
}
#endif
#endif
