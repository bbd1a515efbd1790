/* Internal to the kernels: the tile sizes and per-tile steps that flash
 * attention's forward (attention_flash.c) and backward
 * (attention_flash_backward.c) share, so that backward recomputes exactly
 * the probabilities forward normalised. */
#ifndef FSC_KERNELS_ATTENTION_FLASH_INTERNAL_H
#define FSC_KERNELS_ATTENTION_FLASH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsc/kernels.h"

/* Query rows x key columns of one tile. 64 x 128 fp32 scores are 32 KiB and
 * a 128-key block of K and V at hd = 64 another 64 KiB: the working set of
 * a tile stays in a core's L2 (512 KiB and up on the CPUs measured). */
#define FSC_FLASH_BR 64
#define FSC_FLASH_BC 128

/* Keys [0, n) of this call that query row r (of the call) can see: key j is
 * visible when k_pos0 + j <= q_pos0 + r. Clamped to [0, Tk]. */
static inline int fsc_flash_visible(const fsc_attn_dims *d, int r) {
    int64_t n = d->q_pos0 + r - d->k_pos0 + 1;
    return n < 0 ? 0 : n > d->Tk ? d->Tk : (int)n;
}

/* One tile product for attention_flash_tile.c: C[i, 0..N) = alpha *
 * sum_k A[i*sai + k*sak] * B[k*ldb + 0..N) for i < M, k < K, added to C's
 * old values when accumulate. The mask bounds what a row group computes by
 * the causal diagonal diag (row i sees columns, or k, up to i + diag):
 * N_UPPER and K_UPPER stop at the last row's bound (what lies past a row's
 * own bound is zero in A, or masked by the caller), K_LOWER starts k at
 * i - diag (for products over query rows, whose A is zero before it). */
typedef enum {
    FSC_FLASH_MASK_NONE,
    FSC_FLASH_MASK_N_UPPER,
    FSC_FLASH_MASK_K_UPPER,
    FSC_FLASH_MASK_K_LOWER
} fsc_flash_mask;

/* The span rows i .. i + R - 1 of a masked product need: columns [0, *n)
 * and terms [*k0, *k1) of the whole [0, N) x [0, K), as fsc_flash_mask says. */
static inline void fsc_flash_span(fsc_flash_mask mask, int64_t diag, int i, int R, int *n, int *k0,
                                  int *k1) {
    const int64_t last = (int64_t)i + R - 1 + diag + 1, first = (int64_t)i - diag;
    if (mask == FSC_FLASH_MASK_N_UPPER && last < *n) *n = last < 0 ? 0 : (int)last;
    if (mask == FSC_FLASH_MASK_K_UPPER && last < *k1) *k1 = last < 0 ? 0 : (int)last;
    if (mask == FSC_FLASH_MASK_K_LOWER && first > 0) *k0 = first > *k1 ? *k1 : (int)first;
}

/* The lanes of a 16-lane vector below n (n clamped to [0, 16]): what a
 * masked load or store of a row's first n floats from this vector on uses. */
static inline uint16_t fsc_flash_lanes(int n) {
    return n >= 16 ? (uint16_t)0xFFFF : n <= 0 ? 0 : (uint16_t)((1u << n) - 1);
}

/* Rows of C that a tile product's register block holds (both kernels). */
#define FSC_FLASH_MR 6

/* Calls BLOCK(m, R, ...) with the row count R (1 .. FSC_FLASH_MR) spelled
 * as a constant, so that each count compiles to a block whose accumulators
 * stay in registers. */
#define FSC_FLASH_BY_ROWS(R, BLOCK, m, ...)                                                        \
    switch (R) {                                                                                   \
    case 6:                                                                                        \
        BLOCK(m, 6, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    case 5:                                                                                        \
        BLOCK(m, 5, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    case 4:                                                                                        \
        BLOCK(m, 4, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    case 3:                                                                                        \
        BLOCK(m, 3, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    case 2:                                                                                        \
        BLOCK(m, 2, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    default:                                                                                       \
        BLOCK(m, 1, __VA_ARGS__);                                                                  \
        break;                                                                                     \
    }

/* A tile product's fields, its A and B of element type T (fp32 values, or
 * bf16 pairs for fsc_flash_mm16). */
#define FSC_FLASH_MM_FIELDS(T)                                                                     \
    int M, N, K;                                                                                   \
    const T *A;                                                                                    \
    int64_t sai, sak;                                                                              \
    const T *B;                                                                                    \
    int64_t ldb;                                                                                   \
    float *C;                                                                                      \
    int64_t ldc;                                                                                   \
    float alpha;                                                                                   \
    bool accumulate;                                                                               \
    fsc_flash_mask mask;                                                                           \
    int64_t diag

typedef struct {
    FSC_FLASH_MM_FIELDS(float);
} fsc_flash_mm;

/* True when the tiles run fsc_flash_mm (fp32 on a CPU with AVX-512, unless
 * FSC_FLASH_TILES=gemm); otherwise they are fsc_gemm calls. */
bool fsc_flash_fused(fsc_gemm_prec prec);
void fsc_flash_mm_run(const fsc_flash_mm *m);
/* The fused tiles' row steps (attention_flash_rows.c), on rows of
 * FSC_FLASH_BC floats whose row r sees keys up to r + diag (clamped to
 * [0, cols)), written whole with zeros past that bound. Forward: folds each
 * row of the scores S into its running max m and sum l, turns it into
 * exp(s - m), and scales its output row (hd floats of O) by the change of
 * m. Backward: P = exp(S - lse) in place and dS = P (dP - delta) scale in
 * place of dP (rows with lse = -inf see nothing). */
void fsc_flash_softmax_rows(float *S, int rows, int cols, int64_t diag, float *m, float *l,
                            float *O, int hd);
void fsc_flash_probs_rows(float *P, float *dS, int rows, int cols, int64_t diag, const float *lse,
                          const float *delta, float scale);
/* This thread's scratch buffer slot (FSC_MEM_WORK, kept and grown for the
 * thread's next call, freed when it exits) of at least floats; NULL
 * (fsc_last_error says why) when out of memory. Slots: the call's k^T and
 * v^T, and the tiles' per-thread scratch. */
enum {
    FSC_FLASH_KT,
    FSC_FLASH_VT,
    FSC_FLASH_KH, /* fsc_flash_heads of k, v, q and dout */
    FSC_FLASH_VH,
    FSC_FLASH_QH,
    FSC_FLASH_GH,
    FSC_FLASH_WS,
    FSC_FLASH_QR, /* bf16 tiles' q and dout in pairs of rows */
    FSC_FLASH_GR,
    FSC_FLASH_SCRATCH_SLOTS
};
float *fsc_flash_scratch(int slot, size_t floats);
/* k^T (or v^T) of a whole call into scratch slot, the B of every tile's
 * S = q k^T (dP = dout v^T): KV head j of batch row b at (b * NKV + j) * hd
 * rows of fsc_flash_t_ld(d) floats, key t of element e at row e, column t
 * (zeros past Tk). src is k (v) with its ld. NULL when out of memory. */
float *fsc_flash_transpose(const fsc_attn_dims *d, const float *src, int ld, int slot);
int64_t fsc_flash_t_ld(const fsc_attn_dims *d);
/* 16 rows of src (stride ld) by ne <= 16 columns, transposed: column e as
 * row e of dst (stride tld) for e < ne, rows past n read as zero; 32-bit
 * values moved bit for bit. AVX-512 only (fsc_flash_fused's machines). */
void fsc_flash_transpose16(float *dst, int64_t tld, const float *src, int ld, int n, int ne);
/* src (B, T, ld) with H heads of hd floats at h * hd, copied head by head
 * into scratch slot: head h of batch row b at rows (b * H + h) * T of hd
 * floats. The B of the products over keys or queries (O += P v, dq += dS k,
 * dk += dS^T q, dv += P^T dout): their rows are then neighbours in memory,
 * where rows 3C apart crowd a few L1 sets. NULL when out of memory. */
float *fsc_flash_heads(const fsc_attn_dims *d, const float *src, int ld, int T, int H, int slot);

/* bf16 tiles (attention_flash_bf16.c): one product as fsc_flash_mm, with
 * A's and B's values rounded to bf16 and packed in 32-bit pairs along k
 * (bf16 k in the low half, k + 1 in the high half): pair p of row i of A
 * at A[i * sai + p * sak], pair p of B's column n at B[p * ldb + n]. K, the
 * mask and diag count k as fsc_flash_mm does (not pairs); a pair a bound
 * cuts in two is summed whole, its other term being zero in A. */
typedef struct {
    FSC_FLASH_MM_FIELDS(uint32_t);
} fsc_flash_mm16;

/* True when bf16 tiles run fsc_flash_mm16 (FSC_GEMM_BF16 on a CPU with
 * avx512_bf16, unless FSC_FLASH_TILES=gemm); otherwise fsc_gemm calls. */
bool fsc_flash_bf16_tiles(fsc_gemm_prec prec);
void fsc_flash_mm16_run(const fsc_flash_mm16 *m);

/* One product of either kind, its fields in the struct's order (as a BLAS
 * call lists them): what the forward and backward tiles call. */
static inline void fsc_flash_mm_do(int M, int N, int K, const float *A, int64_t sai, int64_t sak,
                                   const float *B, int64_t ldb, float *C, int64_t ldc, float alpha,
                                   bool acc, fsc_flash_mask mask, int64_t diag) {
    fsc_flash_mm_run(&(fsc_flash_mm){M, N, K, A, sai, sak, B, ldb, C, ldc, alpha, acc, mask, diag});
}

static inline void fsc_flash_mm16_do(int M, int N, int K, const uint32_t *A, int64_t sai,
                                     int64_t sak, const uint32_t *B, int64_t ldb, float *C,
                                     int64_t ldc, float alpha, bool acc, fsc_flash_mask mask,
                                     int64_t diag) {
    fsc_flash_mm16_run(
        &(fsc_flash_mm16){M, N, K, A, sai, sak, B, ldb, C, ldc, alpha, acc, mask, diag});
}
/* How a whole call's (B, T, ld) operand with H heads is packed, head by
 * head (fsc_flash_pack_per_head pairs each): KEYS_T as the B of S = q k^T
 * and dP = dout v^T (pair p of key t at p * fsc_flash_t_ld + t, elements
 * 2p and 2p + 1); ELEMS as their A (row t at t * fsc_flash_pairs_ld(hd));
 * ROWS as the B of products over keys or queries (pair p of element e at
 * p * hd + e, rows 2p and 2p + 1; a last odd row paired with zero). */
typedef enum {
    FSC_FLASH_PACK_KEYS_T,
    FSC_FLASH_PACK_ELEMS,
    FSC_FLASH_PACK_ROWS
} fsc_flash_pack_kind;
uint32_t *fsc_flash_pack(const fsc_attn_dims *d, const float *src, int ld, int T, int H,
                         fsc_flash_pack_kind kind, int slot);
int64_t fsc_flash_pack_per_head(const fsc_attn_dims *d, int T, fsc_flash_pack_kind kind);
int64_t fsc_flash_pairs_ld(int n); /* pairs of n floats, rounded up to 16 */
/* A tile (rows x cols floats, row stride lds) as pairs along its rows
 * (dst[r * ldd + c / 2]) or down its columns (dst[r / 2 * ldd + c], rows r
 * and r + 1); a cut pair's missing term is zero. */
void fsc_flash_pairs_of_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                             int cols);
void fsc_flash_pairs_down(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int rows,
                          int cols);

/* Checks a call's dimensions; false (error logged, naming the field) when
 * they cannot be run. */
bool fsc_flash_dims_ok(const fsc_attn_dims *d, const char *who);

#endif
