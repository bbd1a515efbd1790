/* fsc core: status codes, logging, dtypes, tagged memory, arenas, tensors, Philox RNG.
 *
 * Floor 1 of the house. Everything above reports errors through the status
 * codes here, allocates large buffers through the tagged allocator (so memory
 * claims can be checked exactly) and draws randomness by meaning, not by order.
 */
#ifndef FSC_CORE_H
#define FSC_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsc/env.h" /* the FSC_* variables: fsc_env_check and the getters */
#include "fsc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes: 0 is success, negative is failure ---------------------- */
enum {
    FSC_OK = 0,
    FSC_ERR_INVALID = -1,     /* a bad argument or configuration */
    FSC_ERR_NOMEM = -2,       /* an allocation failed */
    FSC_ERR_IO = -3,          /* a file could not be opened, read or written */
    FSC_ERR_FORMAT = -4,      /* a file's contents are malformed */
    FSC_ERR_SHAPE = -5,       /* tensor shapes do not agree */
    FSC_ERR_DTYPE = -6,       /* unsupported or mismatched dtype */
    FSC_ERR_UNSUPPORTED = -7, /* valid but not implemented */
    FSC_ERR_NOT_FOUND = -8,   /* a named item is missing */
    FSC_ERR_NUMERIC = -9,     /* a NaN or inf where none may be */
    FSC_ERR_INTERNAL = -10,   /* a broken invariant: a bug in fsc */
};

/* Short fixed description of a status code ("invalid argument"); static
 * storage, never NULL. Codes it does not list (the dist codes of fsc/dist.h
 * among them) give "unknown error". */
FSC_API const char *fsc_strerror(int status);
/* The specific message of the last failure on this thread ("" if none). The
 * buffer is this thread's and is overwritten by its next failure: copy it to
 * keep it. Messages are truncated to 1023 characters. */
FSC_API const char *fsc_last_error(void);
/* Records a message for this thread and returns `status`, so callers can write
 * `return fsc_error(FSC_ERR_INVALID, "--heads %d must divide --d-model %d", h, c);` */
FSC_API int fsc_error(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prepends context to this thread's message ("--data x.bin: " + message) and
 * returns `status`; the way to add context while propagating a failure. */
FSC_API int fsc_error_context(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Empties this thread's message (fsc_last_error() then returns ""). */
FSC_API void fsc_clear_error(void);

/* ---- logging ------------------------------------------------------------- */
typedef enum {
    FSC_LOG_DEBUG = 0,
    FSC_LOG_INFO,
    FSC_LOG_WARN,
    FSC_LOG_ERROR,
    FSC_LOG_OFF
} fsc_log_level;

/* Default level is INFO, or the FSC_LOG_LEVEL environment variable (debug|info|warn|error|off). */
FSC_API void fsc_log_set_level(fsc_log_level level);
/* The current level (FSC_LOG_LEVEL is read on first use; another value is
 * reported there as an error, naming the accepted ones, and INFO is used). */
FSC_API fsc_log_level fsc_log_get_level(void);
/* Prints "fsc <level>: <message>" to stderr when level is at or above the
 * current one; the message is truncated to 2047 characters. */
FSC_API void fsc_log(fsc_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- dtypes -------------------------------------------------------------- */
typedef enum {
    FSC_DTYPE_F32 = 0,
    FSC_DTYPE_BF16,
    FSC_DTYPE_F16,
    FSC_DTYPE_I32,
    FSC_DTYPE_I64,
    FSC_DTYPE_U16,
    FSC_DTYPE_COUNT
} fsc_dtype;

/* Bytes per element; 0 for a value outside fsc_dtype. */
FSC_API size_t fsc_dtype_size(fsc_dtype dt);
/* Name as safetensors spells it: "F32", "BF16", "F16", "I32", "I64", "U16"
 * (static storage; "?" for a value outside fsc_dtype). */
FSC_API const char *fsc_dtype_name(fsc_dtype dt);
/* Parses a safetensors dtype name into *out; returns FSC_ERR_DTYPE for unknown
 * names and NULL (then *out is untouched). out must not be NULL. */
FSC_API int fsc_dtype_parse(const char *name, fsc_dtype *out);

FSC_API float fsc_bf16_to_f32(uint16_t h); /* exact */
FSC_API uint16_t fsc_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
FSC_API float fsc_f16_to_f32(uint16_t h);  /* exact, subnormals, inf and NaN included */
FSC_API uint16_t fsc_f32_to_f16(float f);  /* round to nearest even; overflow gives inf */

/* ---- tagged memory -------------------------------------------------------- */
/* Every large allocation carries a tag; current and peak bytes are kept per tag
 * (thread-safe), so ZeRO's promises can be checked against exact figures. */
typedef enum {
    FSC_MEM_PARAMS = 0,
    FSC_MEM_GRADS,
    FSC_MEM_OPTIM,
    FSC_MEM_ACTIV,
    FSC_MEM_COMM,
    FSC_MEM_WORK,
    FSC_MEM_GATHERED, /* FSDP: full parameters and gradients of units while they compute */
    FSC_MEM_TAG_COUNT
} fsc_mem_tag;

/* 64-byte aligned, zero-filled; the caller owns it and frees it with
 * fsc_mem_free. Returns NULL and sets the error on failure: FSC_ERR_INVALID
 * for a bad tag, FSC_ERR_NOMEM when out of memory or past the budget. */
FSC_API void *fsc_mem_alloc(fsc_mem_tag tag, size_t bytes);
/* Frees a block of fsc_mem_alloc and stops counting it. Accepts NULL; a
 * pointer fsc_mem_alloc did not return is logged and ignored (best effort). */
FSC_API void fsc_mem_free(void *p);
/* Gives back the memory of bytes [offset, offset+bytes) of block p, which then
 * reads as zero, and stops counting them; for sharded buffers whose parts are
 * dead between uses (ZeRO-2 gradients). fsc_mem_recommit counts a discarded
 * range again before it is written. The caller pairs the two per range.
 * FSC_ERR_INVALID if p is not a block of fsc_mem_alloc or the range leaves it. */
FSC_API int fsc_mem_discard(void *p, size_t offset, size_t bytes);
/* Counts a discarded range again; FSC_ERR_INVALID as discard, or for more
 * bytes than the block has discarded; FSC_ERR_NOMEM past the budget. */
FSC_API int fsc_mem_recommit(void *p, size_t offset, size_t bytes);
FSC_API size_t fsc_mem_current(fsc_mem_tag tag); /* bytes counted now; 0 for a bad tag */
/* Highest fsc_mem_current(tag) since start-up or fsc_mem_reset_peaks; 0 for a bad tag. */
FSC_API size_t fsc_mem_peak(fsc_mem_tag tag);
FSC_API size_t fsc_mem_current_total(void); /* bytes counted now, all tags */
/* Peak of the sum over tags (not the sum of per-tag peaks). */
FSC_API size_t fsc_mem_peak_total(void);
/* Sets every peak to the current figure, to measure one phase from here. */
FSC_API void fsc_mem_reset_peaks(void);
/* A budget for the sum over tags (0: none, the default; FSC_MEM_LIMIT_MB in
 * the environment sets it at start-up): an allocation that would take the
 * total past it fails with FSC_ERR_NOMEM naming the budget, as a machine with
 * that much memory would. For showing what fits where. */
FSC_API void fsc_mem_set_limit(size_t bytes);
FSC_API size_t fsc_mem_get_limit(void); /* the budget in bytes; 0: none */
/* "params", "grads", ... (static storage; "?" for a bad tag). */
FSC_API const char *fsc_mem_tag_name(fsc_mem_tag tag);

/* ---- arena ---------------------------------------------------------------- */
/* A bump allocator for one step's activations and saved state. Memory comes
 * from the tagged allocator in blocks that are kept across resets, so a
 * steady-state training loop allocates nothing after its first step. */
typedef struct fsc_arena fsc_arena;

/* An empty arena whose blocks are block_bytes (0: 1 MiB), or one allocation's
 * size if larger, charged to `tag`. NULL (error set) if out of memory. The
 * arena owns everything allocated from it; the arena functions below take a
 * non-NULL arena (only fsc_arena_free accepts NULL). */
FSC_API fsc_arena *fsc_arena_new(fsc_mem_tag tag, size_t block_bytes);
/* Frees the arena and every allocation made from it. Accepts NULL. */
FSC_API void fsc_arena_free(fsc_arena *a);
/* 64-byte aligned, NOT zeroed; valid until the next reset, release or free.
 * NULL (error set) only if memory (or the budget) is exhausted. */
FSC_API void *fsc_arena_alloc(fsc_arena *a, size_t bytes);
/* Zero-filled variant. */
FSC_API void *fsc_arena_calloc(fsc_arena *a, size_t bytes);
/* Forgets every allocation; keeps the blocks. If the last step needed more than
 * one block, they are merged into one block of the high-water size, whose
 * pages the reset touches (maps) up to that size: the next step takes no page
 * faults in it. A reset with nothing allocated since the last one changes
 * nothing. */
FSC_API void fsc_arena_reset(fsc_arena *a);
/* A position to return to: everything allocated after fsc_arena_mark is given
 * back by fsc_arena_release (a stack discipline for short-lived buffers, such
 * as the gradients inside one block's backward). If the arena had to grow after
 * the mark (only before its first reset), release keeps the memory until reset. */
typedef struct {
    const void *block;
    size_t used;
} fsc_arena_mark_t;
FSC_API fsc_arena_mark_t fsc_arena_mark(const fsc_arena *a); /* the current position */
/* Gives back everything allocated since m, a mark of this arena taken since
 * its last reset (a stale or foreign mark is not detected). */
FSC_API void fsc_arena_release(fsc_arena *a, fsc_arena_mark_t m);
FSC_API size_t fsc_arena_used(const fsc_arena *a); /* bytes in use now (64-byte rounded) */
/* Most bytes in use at once over the arena's life (resets do not lower it). */
FSC_API size_t fsc_arena_high_water(const fsc_arena *a);

/* ---- tensors -------------------------------------------------------------- */
#define FSC_MAX_DIMS 4

/* A contiguous row-major view. It never owns its data: storage belongs to a flat
 * buffer, an arena or the caller. Passed by value; cheap to copy. */
typedef struct fsc_tensor {
    void *data;
    fsc_dtype dtype;
    int ndim;
    int64_t shape[FSC_MAX_DIMS];
} fsc_tensor;

/* A view of data (borrowed, never copied or freed) with shape[0..ndim). No
 * checks: ndim must be 0..FSC_MAX_DIMS and shape hold ndim sizes. */
FSC_API fsc_tensor fsc_tensor_make(void *data, fsc_dtype dt, int ndim, const int64_t *shape);
/* Convenience constructors for 1-4 dims. */
FSC_API fsc_tensor fsc_tensor_1d(void *data, fsc_dtype dt, int64_t d0);
FSC_API fsc_tensor fsc_tensor_2d(void *data, fsc_dtype dt, int64_t d0, int64_t d1); /* (d0,d1) */
/* (d0,d1,d2) */
FSC_API fsc_tensor fsc_tensor_3d(void *data, fsc_dtype dt, int64_t d0, int64_t d1, int64_t d2);
/* (d0,d1,d2,d3) */
FSC_API fsc_tensor fsc_tensor_4d(void *data, fsc_dtype dt, int64_t d0, int64_t d1, int64_t d2,
                                 int64_t d3);
FSC_API int64_t fsc_tensor_numel(const fsc_tensor *t); /* product of the dims; 1 for ndim 0 */
FSC_API size_t fsc_tensor_nbytes(const fsc_tensor *t); /* numel x the dtype's size */
/* Same data, new shape with equal numel, into *out; FSC_ERR_SHAPE (*out
 * untouched) for another numel or ndim outside 1..FSC_MAX_DIMS. */
FSC_API int fsc_tensor_reshape(const fsc_tensor *t, int ndim, const int64_t *shape,
                               fsc_tensor *out);
/* Rows [start, start+count) of dimension 0, as a view; FSC_ERR_SHAPE (*out
 * untouched) if they are not inside t. */
FSC_API int fsc_tensor_narrow0(const fsc_tensor *t, int64_t start, int64_t count, fsc_tensor *out);
/* Allocates a tensor from an arena (not zeroed; the arena owns the storage).
 * data is NULL on failure. */
FSC_API fsc_tensor fsc_tensor_arena(fsc_arena *a, fsc_dtype dt, int ndim, const int64_t *shape);
/* Same ndim and dims (dtypes are not compared). */
FSC_API bool fsc_tensor_same_shape(const fsc_tensor *a, const fsc_tensor *b);
/* Copies src into dst's storage element-wise, converting f32 <-> bf16/f16 (the
 * same dtype is a plain copy). FSC_ERR_SHAPE if the element counts differ,
 * FSC_ERR_DTYPE for any other pair of dtypes; dst is untouched then. */
FSC_API int fsc_tensor_convert(const fsc_tensor *src, fsc_tensor *dst);

/* ---- Philox4x32-10 counter-based RNG -------------------------------------- */
/* Randomness keyed by meaning (docs/architecture.md, decision 5): a key names *what* is
 * being drawn (seed + parameter name, or seed + layer), a counter names *which*
 * draw (element index, step, sample). Any parallel layout draws the same
 * numbers for the same element. */
typedef struct {
    uint32_t v[4];
} fsc_philox_out;

/* Philox4x32-10: 128 random bits, a pure function of key and the 128-bit counter. */
FSC_API fsc_philox_out fsc_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo);
/* A 64-bit key from a seed and a name (FNV-1a mixed with splitmix64); NULL
 * names hash as "". */
FSC_API uint64_t fsc_rng_key(uint64_t seed, const char *name);
/* A 64-bit key from a seed and small integers (layer, stream id). */
FSC_API uint64_t fsc_rng_key_ints(uint64_t seed, uint64_t a, uint64_t b);
/* Uniform in [0,1) from 32 random bits (24-bit resolution). */
FSC_API float fsc_rng_uniform(uint32_t bits);
/* Fills out[i] ~ N(mean, std) for global element indices [first, first+n):
 * element j of any slice draws exactly what it would in the full tensor. */
FSC_API void fsc_rng_normal_fill(float *out, int64_t n, int64_t first, uint64_t key, float mean,
                                 float std);

/* ---- threads --------------------------------------------------------------- */
/* Threads for fsc's own OpenMP loops (n < 1 means 1). Until this is called the
 * count is FSC_NUM_THREADS from the environment, or 1. */
FSC_API void fsc_set_num_threads(int n);
FSC_API int fsc_get_num_threads(void); /* the count in force (>= 1) */

/* Monotonic wall time in seconds. */
FSC_API double fsc_now(void);

#ifdef __cplusplus
}
#endif
#endif
