/* bf16 GEMM with fp32 accumulation, or sgemm where that is not faster.
 *
 * fsc_gemm(FSC_GEMM_BF16, ...) rounds A and B to bf16 (nearest even) while
 * packing them densely, multiplies them with oneDNN's matmul (fp32
 * accumulation and output), and applies alpha and beta in fp32. Whether a
 * GEMM shape pays for that depends on the CPU (avx512_bf16 or AMX: 2-6x
 * sgemm; emulated bf16: slower) and on the shape (a 64x64x64 block is
 * overhead), so each shape's path is chosen once, by measuring both on the
 * shape's first call, and kept with its oneDNN primitive. The fallback is
 * plain fsc_sgemm on the unrounded inputs: never slower, and more accurate.
 * FSC_BF16_GEMM=off|on|auto (or fsc_bf16_gemm_set_mode) overrides the
 * choice; fsc_bf16_gemm_describe says which paths run and why. Two costs
 * beyond oneDNN's are avoided where they can be: a C += product (weight
 * gradients) accumulates inside oneDNN (a sum post-op) rather than through
 * a staging copy, and an operand the caller already holds in bf16 (a
 * gathered FSDP weight, a gradient two GEMMs share) is not rounded again. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "fsc/profile.h"
#include "kernels/blas_internal.h"
#include "kernels/dnnl_internal.h"
#include "kernels/gemm_bf16_internal.h"

enum { UNDECIDED = 0, PICK_BF16, PICK_F32 };

/* One GEMM shape: its key, its primitive, and what measuring found. */
typedef struct {
    bool ta, tb;
    int M, N, K, ldc; /* ldc: C's row stride when oneDNN writes C itself, else N */
    bool acc;         /* oneDNN adds into C (alpha 1, beta 1) */
    bool bias;        /* oneDNN adds a row of N to C (alpha 1, beta 0) */
    bool tried;       /* primitive creation attempted */
    fsc_dnnl_matmul *mm;
    int pick;
    double t_bf16, t_f32; /* best measured seconds of each path */
} shape;

#define SLOTS 4096 /* open addressing; a GPT step has a few dozen shapes */

static struct {
    pthread_mutex_t lock;
    pthread_once_t once;
    _Atomic int mode; /* -1: FSC_BF16_GEMM not read yet */
    bool cpu_bf16;    /* avx512_bf16 or amx_bf16 */
    shape *slots[SLOTS];
    int nshapes;
    pthread_key_t ws_key;
    _Atomic int64_t calls[2], ns[2], mflop[2]; /* [0] bf16 path, [1] sgemm fallback */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT, .mode = -1};

/* ---- conversion ------------------------------------------------------------ */

#define to_bf16 fsc_bf16_round

// dst (rows, cols) dense = bf16(src), src rows of stride ld
static void pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld) {
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * ld;
        uint16_t *d = dst + (size_t)r * cols;
#pragma omp simd
        for (int c = 0; c < cols; c++) d[c] = to_bf16(s[c]);
    }
}

void fsc_round_bf16(float *dst, const float *src, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)to_bf16(src[i]) << 16;
        memcpy(&dst[i], &u, 4);
    }
}

void fsc_narrow_bf16(uint16_t *dst, const float *src, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(src[i]);
}

/* ---- per-thread workspace (FSC_MEM_WORK, kept for reuse) ----------------- */

static void init_once(void);

enum { WS_A, WS_B, WS_C, WS_SCRATCH, WS_NARROW, WS_CALLER, WS_COUNT = WS_CALLER + FSC_BF16_WS_SLOTS };

typedef struct {
    void *buf[WS_COUNT]; /* packed A, packed B, C staging, oneDNN scratch, the callers' */
    size_t cap[WS_COUNT];
} workspace;

static void ws_free(void *p) {
    workspace *w = p;
    for (int i = 0; i < WS_COUNT; i++) fsc_mem_free(w->buf[i]);
    free(w);
}

/* Buffer i of this thread's workspace with at least bytes; NULL if out of memory. */
static void *ws_get(int i, size_t bytes) {
    workspace *w = pthread_getspecific(g.ws_key);
    if (!w) {
        if (!(w = calloc(1, sizeof *w))) return NULL;
        if (pthread_setspecific(g.ws_key, w)) {
            free(w);
            return NULL;
        }
    }
    if (bytes > w->cap[i]) {
        fsc_mem_free(w->buf[i]);
        size_t cap = (bytes + 65535) & ~(size_t)65535;
        w->buf[i] = fsc_mem_alloc(FSC_MEM_WORK, cap);
        w->cap[i] = w->buf[i] ? cap : 0;
    }
    return w->buf[i] ? w->buf[i] : (bytes ? NULL : w);
}

uint16_t *fsc_bf16_ws(int slot, size_t elems) {
    pthread_once(&g.once, init_once);
    if (slot < 0 || slot >= FSC_BF16_WS_SLOTS) return NULL;
    return ws_get(WS_CALLER + slot, elems * sizeof(uint16_t));
}

float *fsc_bf16_narrow_scratch(int64_t n) {
    pthread_once(&g.once, init_once);
    return n < 0 ? NULL : (float *)ws_get(WS_NARROW, (size_t)n * sizeof(float));
}

void fsc_pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld) {
    pack_bf16(dst, src, rows, cols, ld);
}

/* ---- modes and the CPU ---------------------------------------------------- */

static bool cpu_has_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || __get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 1, a, b, c, d);
    bool avx512_bf16 = a & (1u << 5);
    __cpuid_count(7, 0, a, b, c, d);
    bool amx_bf16 = d & (1u << 22);
    return avx512_bf16 || amx_bf16;
#else
    return false;
#endif
}

static void init_once(void) {
    g.cpu_bf16 = cpu_has_bf16();
    pthread_key_create(&g.ws_key, ws_free);
}

/* FSC_BF16_GEMM into *out (auto when unset or empty); FSC_ERR_INVALID naming
 * the accepted values otherwise. */
static int mode_from_env(fsc_bf16_gemm_mode *out) {
    static const fsc_bf16_gemm_mode modes[] = {/* the table's words: auto|on|off|1|0 */
                                               FSC_BF16_GEMM_AUTO, FSC_BF16_GEMM_ON,
                                               FSC_BF16_GEMM_OFF, FSC_BF16_GEMM_ON,
                                               FSC_BF16_GEMM_OFF};
    int i;
    int rc = fsc_env_enum("FSC_BF16_GEMM", &i);
    *out = modes[i];
    return rc;
}

/* At first use an invalid value is an error in the log (the mode getter has no
 * status to return; tools refuse it at start-up through fsc_env_check). */
static fsc_bf16_gemm_mode env_mode(void) {
    fsc_bf16_gemm_mode m;
    if (mode_from_env(&m)) fsc_log(FSC_LOG_ERROR, "%s; using auto", fsc_last_error());
    return m;
}

fsc_bf16_gemm_mode fsc_bf16_gemm_get_mode(void) {
    int m = atomic_load(&g.mode);
    if (m < 0) {
        int want = (int)env_mode(), unset = -1;
        atomic_compare_exchange_strong(&g.mode, &unset, want);
        m = atomic_load(&g.mode);
    }
    return (fsc_bf16_gemm_mode)m;
}

void fsc_bf16_gemm_set_mode(fsc_bf16_gemm_mode mode) {
    atomic_store(&g.mode, (int)mode);
}

int fsc_bf16_gemm_init(void) {
    pthread_once(&g.once, init_once);
    char why[256];
    if (!fsc_dnnl_load(why, sizeof why)) return fsc_error(FSC_ERR_NOT_FOUND, "bf16 GEMM: %s", why);
    return FSC_OK;
}

bool fsc_bf16_gemm_available(void) {
    return fsc_bf16_gemm_init() == FSC_OK;
}

/* ---- shapes -------------------------------------------------------------- */

static shape *find_shape(bool ta, bool tb, int M, int N, int K, int ldc, bool acc, bool bias) {
    uint64_t h = ((((uint64_t)M * 1000003u + (uint64_t)N) * 1000003u + (uint64_t)K) * 1000003u +
                  (uint64_t)ldc) *
                     16u +
                 (uint64_t)bias * 8u + (uint64_t)acc * 4u + (uint64_t)ta * 2u + (uint64_t)tb;
    h ^= h >> 29, h *= 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < SLOTS; i++) {
        shape **slot = &g.slots[(h + i) % SLOTS];
        shape *s = *slot;
        if (s && s->ta == ta && s->tb == tb && s->M == M && s->N == N && s->K == K &&
            s->ldc == ldc && s->acc == acc && s->bias == bias)
            return s;
        if (!s) {
            if (g.nshapes >= SLOTS / 2 || !(s = calloc(1, sizeof *s))) return NULL;
            *s = (shape){
                .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .ldc = ldc, .acc = acc, .bias = bias};
            g.nshapes++;
            return *slot = s;
        }
    }
    return NULL;
}

/* The bf16 path for one call: C = alpha * op(A) op(B) + beta * C (+ the
 * bias row, for a shape made with one), with A (B) taken from Ah (Bh) when
 * given, else rounded into the workspace. Returns false (C untouched) if the
 * workspace cannot be had or oneDNN fails. */
static bool run_bf16(const shape *s, float alpha, const float *A, const uint16_t *Ah, int lda,
                     const float *B, const uint16_t *Bh, int ldb, float beta, float *C, int ldc,
                     const float *bias) {
    const int M = s->M, N = s->N, K = s->K;
    const uint16_t *a = Ah ? Ah : ws_get(WS_A, (size_t)M * K * 2);
    const uint16_t *b = Bh ? Bh : ws_get(WS_B, (size_t)K * N * 2);
    bool direct = alpha == 1.f && beta == (s->acc ? 1.f : 0.f) && ldc == s->ldc;
    float *c = direct ? C : ws_get(WS_C, (size_t)M * s->ldc * sizeof(float));
    void *scratch = ws_get(WS_SCRATCH, fsc_dnnl_matmul_scratch(s->mm));
    if (!a || !b || !c || !scratch) return false;
    if (!Ah) pack_bf16((uint16_t *)a, A, s->ta ? K : M, s->ta ? M : K, lda);
    if (!Bh) pack_bf16((uint16_t *)b, B, s->tb ? N : K, s->tb ? K : N, ldb);
    if (fsc_dnnl_matmul_run(s->mm, a, b, c, bias, scratch, fsc_blas_threads())) return false;
    if (direct) return true;
    for (int i = 0; i < M; i++) { /* BLAS semantics: beta 0 never reads C */
        float *ci = C + (size_t)i * ldc;
        const float *ti = c + (size_t)i * s->ldc;
        if (beta == 0.f)
#pragma omp simd
            for (int j = 0; j < N; j++) ci[j] = alpha * ti[j];
        else
#pragma omp simd
            for (int j = 0; j < N; j++) ci[j] = alpha * ti[j] + beta * ci[j];
    }
    return true;
}

/* The fallback: sgemm on the unrounded inputs, the bias row first (as
 * fsc_matmul_forward's fp32 path). */
static void run_f32(const shape *s, float alpha, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc, const float *bias) {
    for (int i = 0; bias && i < s->M; i++) memcpy(C + (size_t)i * ldc, bias, (size_t)s->N * 4);
    fsc_sgemm(s->ta, s->tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, bias ? 1.f : beta, C, ldc);
}

enum { BF16_MARGIN_PERCENT = 110 };
#define BF16_MARGIN (BF16_MARGIN_PERCENT / 100.0)

/* Times both paths as this call runs them (same operands, alpha and beta),
 * each at its best of 3 after a warm-up, into staging memory (C is not
 * touched), and keeps the faster. */
static void measure(shape *s, float alpha, const float *A, const uint16_t *Ah, int lda,
                    const float *B, const uint16_t *Bh, int ldb, float beta, const float *bias) {
    size_t bytes = (size_t)s->M * s->ldc * sizeof(float);
    float *tmp = fsc_mem_alloc(FSC_MEM_WORK, bytes);
    s->t_bf16 = s->t_f32 = 1e30;
    if (tmp) memset(tmp, 0, bytes);
    for (int r = 0; tmp && r < 4; r++) {
        double t0 = fsc_now();
        if (!run_bf16(s, alpha, A, Ah, lda, B, Bh, ldb, beta, tmp, s->ldc, bias)) break;
        double t1 = fsc_now();
        run_f32(s, alpha, A, lda, B, ldb, beta, tmp, s->ldc, bias);
        double t2 = fsc_now();
        if (r == 0) continue; /* warm-up: first touches, oneDNN's lazy set-up */
        if (t1 - t0 < s->t_bf16) s->t_bf16 = t1 - t0;
        if (t2 - t1 < s->t_f32) s->t_f32 = t2 - t1;
    }
    fsc_mem_free(tmp);
    /* Timed alone, with its operands warm and nothing else in the caches,
     * sgemm looks better than it does inside a training step: there, forcing
     * bf16 on every shape measured 2.6% faster than this choice without a
     * margin (medium config, alternated). sgemm must win by 10%. */
    s->pick = s->t_bf16 < BF16_MARGIN * s->t_f32 ? PICK_BF16 : PICK_F32;
}

/* The shape's path under the current mode, creating and measuring on first
 * use; NULL means sgemm. */
static shape *choose(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *Ah, int lda, const float *B, const uint16_t *Bh, int ldb,
                     float beta, int ldc, const float *bias) {
    fsc_bf16_gemm_mode mode = fsc_bf16_gemm_get_mode();
    pthread_once(&g.once, init_once);
    if (mode == FSC_BF16_GEMM_OFF || (mode == FSC_BF16_GEMM_AUTO && !g.cpu_bf16)) return NULL;
    /* oneDNN writes C itself for C = AB and C += AB; other alpha and beta
     * go through a staging C of row stride N */
    bool direct = alpha == 1.f && (beta == 0.f || beta == 1.f), acc = direct && beta == 1.f;
    if (!direct) ldc = N;
    pthread_mutex_lock(&g.lock);
    shape *s = find_shape(ta, tb, M, N, K, ldc, acc, bias != NULL);
    if (s && !s->tried) {
        char why[256];
        s->tried = true;
        s->mm = fsc_dnnl_matmul_new(ta, tb, M, N, K, ldc, acc, bias != NULL, fsc_blas_threads(),
                                    why, sizeof why);
    }
    if (s && s->mm && mode == FSC_BF16_GEMM_AUTO && s->pick == UNDECIDED)
        measure(s, alpha, A, Ah, lda, B, Bh, ldb, beta, bias);
    pthread_mutex_unlock(&g.lock);
    if (!s || !s->mm) return NULL;
    return mode == FSC_BF16_GEMM_ON || s->pick == PICK_BF16 ? s : NULL;
}

bool fsc_gemm_bf16_runs(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0) return false;
    return choose(ta, tb, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, beta, ldc, NULL) != NULL;
}

bool fsc_bf16_gemm_wanted(void) {
    fsc_bf16_gemm_mode mode = fsc_bf16_gemm_get_mode();
    pthread_once(&g.once, init_once);
    if (mode == FSC_BF16_GEMM_OFF || (mode == FSC_BF16_GEMM_AUTO && !g.cpu_bf16)) return false;
    char why[256];
    return fsc_dnnl_load(why, sizeof why);
}

void fsc_gemm_bf16_count(bool bf16, double seconds, double flops) {
    int path = bf16 ? 0 : 1;
    atomic_fetch_add(&g.calls[path], 1);
    atomic_fetch_add(&g.ns[path], (int64_t)(seconds * 1e9));
    atomic_fetch_add(&g.mflop[path], (int64_t)(1e-6 * flops));
}

/* fsc_gemm_bf16, with a bias row when bias is not NULL (alpha 1, beta 0). */
static void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                      const uint16_t *Ah, int lda, const float *B, const uint16_t *Bh, int ldb,
                      float beta, float *C, int ldc, const float *bias) {
    double t0 = fsc_now();
    shape *s = choose(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta, ldc, bias);
    if (s && fsc_prof_enabled) fsc_prof_gemm_begin(FSC_PROF_GEMM_BF16, ta, tb, M, N, K);
    int path = s && run_bf16(s, alpha, A, Ah, lda, B, Bh, ldb, beta, C, ldc, bias) ? 0 : 1;
    if (s && fsc_prof_enabled) fsc_prof_end(path ? 0 : 2.0 * M * N * (double)K, 0);
    if (path)
        run_f32(&(shape){.ta = ta, .tb = tb, .M = M, .N = N, .K = K}, alpha, A, lda, B, ldb, beta,
                C, ldc, bias);
    fsc_gemm_bf16_count(path == 0, fsc_now() - t0, 2.0 * M * N * (double)K);
}

void fsc_gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   const uint16_t *Ah, int lda, const float *B, const uint16_t *Bh, int ldb,
                   float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0)
        fsc_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        gemm_bf16(ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta, C, ldc, NULL);
}

void fsc_gemm_bf16_bias(bool tb, int M, int N, int K, const float *A, const uint16_t *Ah, int lda,
                        const float *B, const uint16_t *Bh, int ldb, const float *bias, float *C,
                        int ldc) {
    if (M > 0 && N > 0 && K > 0)
        gemm_bf16(false, tb, M, N, K, 1.f, A, Ah, lda, B, Bh, ldb, 0.f, C, ldc, bias);
    else if (M > 0 && N > 0) /* K = 0: the product is empty, C is the bias */
        for (int i = 0; i < M; i++) memcpy(C + (size_t)i * ldc, bias, (size_t)N * sizeof(float));
}

void fsc_gemm(fsc_gemm_prec prec, bool ta, bool tb, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (prec != FSC_GEMM_BF16)
        fsc_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        fsc_gemm_bf16(ta, tb, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, beta, C, ldc);
}

/* ---- reports ---------------------------------------------------------------- */

fsc_bf16_gemm_stats fsc_bf16_gemm_get_stats(void) {
    fsc_bf16_gemm_stats st = {0};
    st.calls_bf16 = atomic_load(&g.calls[0]), st.calls_f32 = atomic_load(&g.calls[1]);
    st.seconds_bf16 = 1e-9 * (double)atomic_load(&g.ns[0]);
    st.seconds_f32 = 1e-9 * (double)atomic_load(&g.ns[1]);
    st.flops_bf16 = 1e6 * (double)atomic_load(&g.mflop[0]);
    st.flops_f32 = 1e6 * (double)atomic_load(&g.mflop[1]);
    return st;
}

void fsc_bf16_gemm_reset_stats(void) {
    for (int i = 0; i < 2; i++)
        atomic_store(&g.calls[i], 0), atomic_store(&g.ns[i], 0), atomic_store(&g.mflop[i], 0);
}

const char *fsc_bf16_gemm_describe(void) {
    static _Thread_local char out[384];
    static const char *names[] = {"auto", "on", "off"};
    fsc_bf16_gemm_mode mode = fsc_bf16_gemm_get_mode();
    pthread_once(&g.once, init_once);
    char why[256] = "";
    const char *src = fsc_env_given("FSC_BF16_GEMM") ? "FSC_BF16_GEMM" : "mode";
    if (mode == FSC_BF16_GEMM_OFF) {
        snprintf(out, sizeof out, "bf16 GEMM: sgemm for every shape (%s off)", src);
    } else if (mode == FSC_BF16_GEMM_AUTO && !g.cpu_bf16) {
        snprintf(out, sizeof out,
                 "bf16 GEMM: sgemm for every shape (this CPU has neither avx512_bf16 nor "
                 "amx_bf16; FSC_BF16_GEMM=on forces oneDNN's emulation)");
    } else if (!fsc_dnnl_tried()) {
        snprintf(out, sizeof out,
                 "bf16 GEMM: not loaded (no bf16 GEMM so far; CPU %s native bf16, %s %s)",
                 g.cpu_bf16 ? "has" : "lacks", src, names[mode]);
    } else if (!fsc_dnnl_load(why, sizeof why)) {
        snprintf(out, sizeof out, "bf16 GEMM: sgemm for every shape (%s)", why);
    } else {
        int n[3] = {0};
        pthread_mutex_lock(&g.lock);
        for (int i = 0; i < SLOTS; i++)
            if (g.slots[i]) n[g.slots[i]->mm ? g.slots[i]->pick : PICK_F32]++;
        pthread_mutex_unlock(&g.lock);
        if (mode == FSC_BF16_GEMM_ON)
            snprintf(out, sizeof out,
                     "bf16 GEMM: %s for every shape oneDNN accepts (%s on; CPU %s native "
                     "bf16); %d shapes so far, %d refused",
                     fsc_dnnl_version(), src, g.cpu_bf16 ? "has" : "lacks", n[0] + n[1] + n[2],
                     n[PICK_F32]);
        else
            snprintf(out, sizeof out,
                     "bf16 GEMM: %s where measured faster than sgemm (auto; CPU has native "
                     "bf16): %d shapes bf16, %d sgemm, %d not yet measured",
                     fsc_dnnl_version(), n[PICK_BF16], n[PICK_F32], n[UNDECIDED]);
    }
    return out;
}

double fsc_bf16_gemm_peak_gflops(int n, int reps) {
    char why[256];
    fsc_dnnl_matmul *mm = n > 0 ? fsc_dnnl_matmul_new(false, false, n, n, n, n, false, false,
                                                      fsc_blas_threads(), why, sizeof why)
                                : NULL;
    size_t e = (size_t)n * n;
    uint16_t *a = mm ? fsc_mem_alloc(FSC_MEM_WORK, 4 * e) : NULL;
    float *c = mm ? fsc_mem_alloc(FSC_MEM_WORK, 4 * e) : NULL;
    void *scratch = mm ? fsc_mem_alloc(FSC_MEM_WORK, fsc_dnnl_matmul_scratch(mm) + 64) : NULL;
    double best = 0;
    if (a && c && scratch) {
        for (size_t i = 0; i < 2 * e; i++) a[i] = to_bf16((float)(i % 17) * 0.01f);
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            double t = fsc_now();
            if (fsc_dnnl_matmul_run(mm, a, a + e, c, NULL, scratch, fsc_blas_threads())) break;
            double gf = 2.0 * n * n * (double)n / (fsc_now() - t) / 1e9;
            if (r >= 0 && gf > best) best = gf;
        }
    }
    fsc_mem_free(a), fsc_mem_free(c), fsc_mem_free(scratch);
    fsc_dnnl_matmul_free(mm);
    return best;
}
