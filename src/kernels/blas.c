/* OpenBLAS, loaded at run time so that fsc chooses its kernels.
 *
 * Debian's OpenBLAS 0.3.21 is built for many CPUs and picks kernels when it is
 * loaded; on some recent Xeons it mis-detects the CPU and runs SSE3 kernels at
 * a fifth of the speed. It reads OPENBLAS_CORETYPE only at load time, so fsc
 * does not link it: fsc_blas_init sets OPENBLAS_CORETYPE from the CPU's own
 * feature flags (unless the user set it) and then dlopens the library. If the
 * process already has OpenBLAS loaded, that copy is used and reported as is.
 * A user's OPENBLAS_CORETYPE is obeyed, but when it names older kernels than
 * the CPU supports, fsc_blas_hint says which faster ones to use. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "fsc/profile.h"
#include "kernels/blas_internal.h"

/* CBLAS enums (cblas.h): row-major 101, no-trans 111, trans 112. */
typedef void (*sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc);
typedef char *(*corename_fn)(void);
typedef void (*set_threads_fn)(int);

static struct {
    void *lib;
    sgemm_fn sgemm;
    corename_fn corename;
    set_threads_fn set_threads;
    char describe[768];
    char hint[256];
    char chosen[32]; /* what fsc set OPENBLAS_CORETYPE to, or "" */
    int threads;
} blas;

/* The OpenBLAS kernel family this CPU supports best, from CPUID. */
static const char *coretype_for_cpu(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

/* Kernel families by the widest vectors they use, with the per-core sgemm
 * GFLOP/s each reached on one machine (fsc_sgemm_peak_gflops(1024), Debian's
 * OpenBLAS 0.3.21, AMD EPYC with AVX-512): only the ratios matter, to tell the
 * user roughly what an old choice costs. The SSE row is the best of Prescott,
 * Core2, Penryn, Nehalem, Atom, Barcelona and Bobcat (43-52). */
static const struct {
    const char *isa;
    int sgemm_gflops;
} FAMILIES[] = {{"SSE", 47}, {"AVX", 112}, {"AVX2", 120}, {"AVX-512", 228}};

/* OPENBLAS_CORETYPE names (OpenBLAS's own spelling), oldest first, each with
 * its row in FAMILIES: a name is slower than another when its family is older.
 * OpenBLAS falls back to its own detection for names it does not know; so do
 * we (no hint). */
static const struct {
    const char *name;
    int family;
} CORETYPES[] = {
    {"Katmai", 0},       {"Coppermine", 0},     {"Northwood", 0},  {"Prescott", 0},
    {"Banias", 0},       {"Atom", 0},           {"Core2", 0},      {"Penryn", 0},
    {"Dunnington", 0},   {"Nehalem", 0},        {"Athlon", 0},     {"Opteron", 0},
    {"Opteron_SSE3", 0}, {"Barcelona", 0},      {"Nano", 0},       {"Bobcat", 0},
    {"Sandybridge", 1},  {"Bulldozer", 1},      {"Piledriver", 1}, {"Steamroller", 1},
    {"Haswell", 2},      {"Excavator", 2},      {"Zen", 2},        {"SkylakeX", 3},
    {"Cooperlake", 3},   {"SapphireRapids", 3},
};

/* Index into CORETYPES, or -1 for a name OpenBLAS would not recognize. */
static int coretype_index(const char *name) {
    for (int i = 0; name && i < (int)(sizeof CORETYPES / sizeof *CORETYPES); i++)
        if (!strcasecmp(name, CORETYPES[i].name)) return i;
    return -1;
}

bool fsc_blas_coretype_hint(char *out, size_t size, const char *user, const char *best) {
    int u = coretype_index(user), b = coretype_index(best);
    if (size) out[0] = '\0';
    if (u < 0 || b < 0 || CORETYPES[u].family >= CORETYPES[b].family) return false;
    int fu = CORETYPES[u].family, fb = CORETYPES[b].family;
    snprintf(out, size,
             "OPENBLAS_CORETYPE=%s is set; this CPU supports %s kernels (%s rather than %s: "
             "about %.1fx the sgemm speed): unset it or set OPENBLAS_CORETYPE=%s",
             user, CORETYPES[b].name, FAMILIES[fb].isa, FAMILIES[fu].isa,
             (double)FAMILIES[fb].sgemm_gflops / FAMILIES[fu].sgemm_gflops, CORETYPES[b].name);
    return true;
}

static void *open_openblas(void) {
    static const char *names[] = {"libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0",
                                  "libblas.so.3"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (h && dlsym(h, "cblas_sgemm")) return h;
        if (h) dlclose(h);
    }
    return NULL;
}

/* POSIX guarantees dlsym's object pointer converts to a function pointer; ISO C
 * does not, so the bits are copied rather than cast. */
static void load_symbol(void *lib, const char *name, void *fn_ptr, size_t size) {
    void *sym = dlsym(lib, name);
    memcpy(fn_ptr, &sym, size);
}

int fsc_blas_init(int threads) {
    if (blas.lib) {
        if (threads > 0) fsc_blas_set_threads(threads);
        return FSC_OK;
    }
    /* Already loaded by someone else? Then the choice was made at their load. */
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        const char *ct = coretype_for_cpu();
        if (!getenv("OPENBLAS_CORETYPE") && ct) {
            setenv("OPENBLAS_CORETYPE", ct, 0);
            snprintf(blas.chosen, sizeof blas.chosen, "%s", ct);
        }
        /* One BLAS thread unless asked: fsc runs one rank per core. */
        if (!getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 0);
        h = open_openblas();
    }
    if (!h)
        return fsc_error(FSC_ERR_NOT_FOUND,
                         "cannot load OpenBLAS (libopenblas.so.0): %s; "
                         "install libopenblas0 (scripts/install-deps.sh)",
                         dlerror());
    blas.lib = h;
    load_symbol(h, "cblas_sgemm", &blas.sgemm, sizeof blas.sgemm);
    load_symbol(h, "openblas_get_corename", &blas.corename, sizeof blas.corename);
    load_symbol(h, "openblas_set_num_threads", &blas.set_threads, sizeof blas.set_threads);
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    blas.threads = env ? atoi(env) : 1;
    if (threads > 0) fsc_blas_set_threads(threads);
    return FSC_OK;
}

static void ensure_loaded(void) {
    if (!blas.lib && fsc_blas_init(0) != FSC_OK) {
        fsc_log(FSC_LOG_ERROR, "%s", fsc_last_error());
        abort(); /* no BLAS at all: nothing can compute; install-deps.sh prevents this */
    }
}

void fsc_blas_set_threads(int threads) {
    ensure_loaded();
    if (threads < 1) threads = 1;
    blas.threads = threads;
    if (blas.set_threads) blas.set_threads(threads);
}

const char *fsc_blas_corename(void) {
    ensure_loaded();
    return blas.corename ? blas.corename() : "unknown";
}

int fsc_blas_threads(void) {
    ensure_loaded();
    return blas.threads;
}

const char *fsc_blas_describe(void) {
    ensure_loaded();
    snprintf(blas.describe, sizeof blas.describe,
             "BLAS: OpenBLAS, %s kernels, %d thread%s (%s); %s", fsc_blas_corename(), blas.threads,
             blas.threads == 1 ? "" : "s",
             blas.chosen[0]                ? "OPENBLAS_CORETYPE chosen by fsc from CPUID"
             : getenv("OPENBLAS_CORETYPE") ? "OPENBLAS_CORETYPE set by the user"
                                           : "OpenBLAS's own CPU detection",
             fsc_bf16_gemm_describe());
    return blas.describe;
}

const char *fsc_blas_hint(void) {
    /* fsc's own choice is never slower than itself; only a user's value can be */
    const char *user = blas.chosen[0] ? NULL : getenv("OPENBLAS_CORETYPE");
    return fsc_blas_coretype_hint(blas.hint, sizeof blas.hint, user, coretype_for_cpu()) ? blas.hint
                                                                                         : NULL;
}

void fsc_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
    ensure_loaded();
    if (fsc_prof_enabled) fsc_prof_gemm_begin(FSC_PROF_GEMM_F32, ta, tb, M, N, K);
    blas.sgemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (fsc_prof_enabled) fsc_prof_end(2.0 * M * N * (double)K, 0);
}

double fsc_sgemm_peak_gflops(int n, int reps) {
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = fsc_mem_alloc(FSC_MEM_WORK, bytes), *b = fsc_mem_alloc(FSC_MEM_WORK, bytes),
          *c = fsc_mem_alloc(FSC_MEM_WORK, bytes);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 17) * 0.01f;
        fsc_sgemm(false, false, n, n, n, 1.f, a, n, b, n, 0.f, c, n); /* warm-up */
        for (int r = 0; r < reps; r++) {
            double t = fsc_now();
            fsc_sgemm(false, false, n, n, n, 1.f, a, n, b, n, 0.f, c, n);
            double g = 2.0 * n * n * (double)n / (fsc_now() - t) / 1e9;
            if (g > best) best = g;
        }
    }
    fsc_mem_free(a), fsc_mem_free(b), fsc_mem_free(c);
    return best;
}
