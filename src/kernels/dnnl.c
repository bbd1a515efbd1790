/* oneDNN's matmul, loaded at run time: the bf16 GEMM engine.
 *
 * fsc must build and run where oneDNN is absent (CI installs only what
 * scripts/install-deps.sh names), so it neither links oneDNN nor includes its
 * headers: the entry points are looked up with dlsym and declared below with
 * the values of oneDNN's C API (dnnl.h, dnnl_types.h). Versions 2 and 3
 * differ only in how descriptors are made: 2.x fills caller-owned structs
 * (dnnl_memory_desc_t, dnnl_matmul_desc_t) by pointer, 3.x returns handles.
 * fsc keeps every descriptor behind a `void *` that is what both versions
 * pass on (the struct's address, or the handle), and gives 2.x's structs
 * storage larger than they are (696 and 2800 bytes in 2.6). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/dnnl_internal.h"

/* dnnl_types.h, unchanged from 2.x to 3.x */
enum { DNNL_BF16 = 2, DNNL_F32 = 3 };                                  /* dnnl_data_type_t */
enum { DNNL_CPU = 1 };                                                 /* dnnl_engine_kind_t */
enum { DNNL_STREAM_IN_ORDER = 1 };                                     /* dnnl_stream_flags_t */
enum { DNNL_SCRATCHPAD_USER = 1 };                                     /* dnnl_scratchpad_mode_t */
enum { DNNL_QUERY_IMPL_INFO_STR = 8, DNNL_QUERY_SCRATCHPAD_MD = 136 }; /* dnnl_query_t */
enum { DNNL_ARG_SRC = 1, DNNL_ARG_DST = 17, DNNL_ARG_WEIGHTS = 33, DNNL_ARG_BIAS = 41 };
enum { DNNL_ARG_SCRATCHPAD = 80 };
#define DNNL_MAX_NDIMS 12
typedef int64_t dnnl_dims[DNNL_MAX_NDIMS];
typedef struct {
    int arg;
    void *memory;
} dnnl_exec_arg;
typedef struct {
    int major, minor, patch;
    const char *hash;
    unsigned cpu_runtime, gpu_runtime;
} dnnl_version_t;

#define MD_BYTES 2048     /* >= sizeof(dnnl_memory_desc_t) in 2.x */
#define OPDESC_BYTES 8192 /* >= sizeof(dnnl_matmul_desc_t) in 2.x */

typedef int (*engine_create_fn)(void **, int, size_t);
typedef int (*stream_create_fn)(void **, void *, unsigned);
typedef int (*handle_fn)(void *); /* *_destroy, dnnl_stream_wait */
typedef int (*md_init_v2_fn)(void *, int, const dnnl_dims, int, const dnnl_dims);
typedef int (*md_create_v3_fn)(void **, int, const dnnl_dims, int, const dnnl_dims);
typedef int (*matmul_desc_v2_fn)(void *, const void *, const void *, const void *, const void *);
typedef int (*pd_create_v2_fn)(void **, const void *, const void *, void *, const void *);
typedef int (*matmul_pd_v3_fn)(void **, void *, const void *, const void *, const void *,
                               const void *, const void *);
typedef int (*attr_create_fn)(void **);
typedef int (*attr_set_scratchpad_fn)(void *, int);
typedef int (*post_ops_create_fn)(void **);
typedef int (*sum_v2_fn)(void *, float);               /* 2.x: (post_ops, scale) */
typedef int (*sum_v3_fn)(void *, float, int32_t, int); /* 3.x: + zero point, data type */
typedef int (*attr_set_post_ops_fn)(void *, const void *);
typedef const void *(*query_md_fn)(const void *, int, int);
typedef int (*query_fn)(const void *, int, int, void *);
typedef size_t (*md_size_fn)(const void *);
typedef int (*prim_create_fn)(void **, const void *);
typedef int (*mem_create_fn)(void **, const void *, void *, void *);
typedef int (*execute_fn)(const void *, void *, int, const dnnl_exec_arg *);
typedef const dnnl_version_t *(*version_fn)(void);

static struct {
    pthread_once_t once;
    _Atomic bool tried;
    bool ok;
    char why[256], version[96];
    void *engine;
    pthread_key_t stream_key; /* each thread's in-order stream */
    engine_create_fn engine_create;
    stream_create_fn stream_create;
    handle_fn stream_wait, stream_destroy, attr_destroy, pd_destroy, prim_destroy, mem_destroy,
        md_destroy_v3, post_ops_destroy;
    post_ops_create_fn post_ops_create;
    sum_v2_fn sum_v2;
    sum_v3_fn sum_v3;
    attr_set_post_ops_fn attr_set_post_ops;
    md_init_v2_fn md_init_v2;
    md_create_v3_fn md_create_v3;
    matmul_desc_v2_fn matmul_desc_v2;
    pd_create_v2_fn pd_create_v2;
    matmul_pd_v3_fn matmul_pd_v3;
    attr_create_fn attr_create;
    attr_set_scratchpad_fn attr_set_scratchpad;
    query_md_fn query_md;
    query_fn query;
    md_size_fn md_size;
    prim_create_fn prim_create;
    mem_create_fn mem_create;
    execute_fn execute;
} dnnl = {.once = PTHREAD_ONCE_INIT};

struct fsc_dnnl_matmul {
    void *pd, *prim;
    void *md[4]; /* A, B, C, bias (or NULL): the descriptors as the API takes them */
    const void *scratch_md;
    size_t scratch;
    const char *impl;
    _Alignas(16) unsigned char md_v2[4][MD_BYTES]; /* 2.x: the structs md[] points at */
};

/* dlsym's object pointer into a function pointer: copied, as ISO C has no cast. */
static bool sym(void *lib, const char *name, void *fn_ptr, size_t size, bool required) {
    void *s = dlsym(lib, name);
    memcpy(fn_ptr, &s, size);
    if (!s && required)
        snprintf(dnnl.why, sizeof dnnl.why, "oneDNN has no %s (not a 2.x or 3.x C API)", name);
    return s || !required;
}
#define SYM(field, name) sym(lib, name, &dnnl.field, sizeof dnnl.field, true)

static void stream_free(void *s) {
    if (s) dnnl.stream_destroy(s);
}

static void load_once(void) {
    atomic_store(&dnnl.tried, true);
    static const char *names[] = {"libdnnl.so.3", "libdnnl.so.2"};
    void *lib = NULL;
    const char *name = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
        if ((lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) name = names[i];
    if (!lib) {
        snprintf(dnnl.why, sizeof dnnl.why,
                 "oneDNN not found (libdnnl.so.3, libdnnl.so.2; Debian: libdnnl2)");
        return;
    }
    version_fn version;
    bool v3 = dlsym(lib, "dnnl_matmul_primitive_desc_create") != NULL;
    bool ok =
        SYM(engine_create, "dnnl_engine_create") && SYM(stream_create, "dnnl_stream_create") &&
        SYM(stream_wait, "dnnl_stream_wait") && SYM(stream_destroy, "dnnl_stream_destroy") &&
        SYM(attr_create, "dnnl_primitive_attr_create") &&
        SYM(attr_destroy, "dnnl_primitive_attr_destroy") &&
        SYM(attr_set_scratchpad, "dnnl_primitive_attr_set_scratchpad_mode") &&
        SYM(pd_destroy, "dnnl_primitive_desc_destroy") &&
        SYM(query_md, "dnnl_primitive_desc_query_md") && SYM(query, "dnnl_primitive_desc_query") &&
        SYM(md_size, "dnnl_memory_desc_get_size") && SYM(prim_create, "dnnl_primitive_create") &&
        SYM(prim_destroy, "dnnl_primitive_destroy") && SYM(mem_create, "dnnl_memory_create") &&
        SYM(mem_destroy, "dnnl_memory_destroy") && SYM(execute, "dnnl_primitive_execute") &&
        SYM(post_ops_create, "dnnl_post_ops_create") &&
        SYM(post_ops_destroy, "dnnl_post_ops_destroy") &&
        SYM(attr_set_post_ops, "dnnl_primitive_attr_set_post_ops") &&
        sym(lib, "dnnl_version", &version, sizeof version, true);
    /* the same name, one argument pair more in 3.x */
    if (ok && v3)
        ok = SYM(sum_v3, "dnnl_post_ops_append_sum");
    else if (ok)
        ok = SYM(sum_v2, "dnnl_post_ops_append_sum");
    if (ok && v3)
        ok = SYM(md_create_v3, "dnnl_memory_desc_create_with_strides") &&
             SYM(md_destroy_v3, "dnnl_memory_desc_destroy") &&
             SYM(matmul_pd_v3, "dnnl_matmul_primitive_desc_create");
    else if (ok)
        ok = SYM(md_init_v2, "dnnl_memory_desc_init_by_strides") &&
             SYM(matmul_desc_v2, "dnnl_matmul_desc_init") &&
             SYM(pd_create_v2, "dnnl_primitive_desc_create");
    const dnnl_version_t *v = ok ? version() : NULL;
    if (ok && (!v || v->major != (v3 ? 3 : 2))) {
        snprintf(dnnl.why, sizeof dnnl.why, "%s reports version %d, expected %d", name,
                 v ? v->major : -1, v3 ? 3 : 2);
        ok = false;
    }
    if (ok && (dnnl.engine_create(&dnnl.engine, DNNL_CPU, 0) ||
               pthread_key_create(&dnnl.stream_key, stream_free))) {
        snprintf(dnnl.why, sizeof dnnl.why, "%s: cannot create a CPU engine", name);
        ok = false;
    }
    if (!ok) {
        dlclose(lib);
        return;
    }
    snprintf(dnnl.version, sizeof dnnl.version, "oneDNN %d.%d.%d (%s)", v->major, v->minor,
             v->patch, name);
    dnnl.ok = true; /* the library stays loaded for the life of the process */
}

bool fsc_dnnl_load(char *why, size_t size) {
    pthread_once(&dnnl.once, load_once);
    if (size) snprintf(why, size, "%s", dnnl.ok ? "" : dnnl.why);
    return dnnl.ok;
}

bool fsc_dnnl_tried(void) {
    return atomic_load(&dnnl.tried);
}

const char *fsc_dnnl_version(void) {
    return dnnl.ok ? dnnl.version : "";
}

/* Descriptor i from a layout (dims and strides in elements). */
static int make_md(fsc_dnnl_matmul *mm, int i, const fsc_dnnl_layout *l, int dt) {
    dnnl_dims dims = {0}, strides = {0};
    for (int d = 0; d < l->ndims; d++) dims[d] = l->dims[d], strides[d] = l->strides[d];
    if (dnnl.md_create_v3) return dnnl.md_create_v3(&mm->md[i], l->ndims, dims, dt, strides);
    mm->md[i] = mm->md_v2[i];
    return dnnl.md_init_v2(mm->md[i], l->ndims, dims, dt, strides);
}

/* oneDNN with the OpenMP runtime plans for and runs on omp_get_max_threads():
 * pinned to fsc's BLAS thread count around each call, outside parallel regions. */
static int threads_enter(int threads) {
#ifdef _OPENMP
    if (threads < 1 || omp_in_parallel()) return 0;
    int old = omp_get_max_threads();
    if (old != threads) omp_set_num_threads(threads);
    return old;
#else
    (void)threads;
    return 0;
#endif
}
static void threads_leave(int old) {
#ifdef _OPENMP
    if (old > 0 && old != omp_get_max_threads()) omp_set_num_threads(old);
#else
    (void)old;
#endif
}

/* Makes the primitive add into C (a sum post-op with scale 1) instead of
 * overwriting it. */
static int set_accumulate(void *attr) {
    void *po = NULL;
    int st = dnnl.post_ops_create(&po);
    if (!st) st = dnnl.sum_v3 ? dnnl.sum_v3(po, 1.f, 0, 0) : dnnl.sum_v2(po, 1.f);
    if (!st) st = dnnl.attr_set_post_ops(attr, po);
    if (po) dnnl.post_ops_destroy(po);
    return st;
}

fsc_dnnl_matmul *fsc_dnnl_matmul_new_nd(const fsc_dnnl_layout *a, const fsc_dnnl_layout *b,
                                        const fsc_dnnl_layout *c, bool accumulate, bool bias,
                                        int threads, char *why, size_t size) {
    if (size) why[0] = '\0';
    if (!fsc_dnnl_load(why, size)) return NULL;
    fsc_dnnl_matmul *mm = calloc(1, sizeof *mm);
    if (!mm) {
        snprintf(why, size, "out of memory");
        return NULL;
    }
    void *attr = NULL;
    /* the bias is a row of N broadcast over every other dimension */
    fsc_dnnl_layout lb = {c->ndims, {1, 1, 1, 1}, {0}};
    lb.dims[c->ndims - 1] = c->dims[c->ndims - 1];
    for (int d = c->ndims - 1, st = 1; d >= 0; st *= (int)lb.dims[d--]) lb.strides[d] = st;
    int st = make_md(mm, 0, a, DNNL_BF16);
    if (!st) st = make_md(mm, 1, b, DNNL_BF16);
    if (!st) st = make_md(mm, 2, c, DNNL_F32);
    if (!st && bias) st = make_md(mm, 3, &lb, DNNL_F32);
    if (!st) st = dnnl.attr_create(&attr);
    if (!st) st = dnnl.attr_set_scratchpad(attr, DNNL_SCRATCHPAD_USER);
    if (!st && accumulate) st = set_accumulate(attr);
    int old = threads_enter(threads);
    if (!st && dnnl.matmul_pd_v3) {
        st = dnnl.matmul_pd_v3(&mm->pd, dnnl.engine, mm->md[0], mm->md[1], mm->md[3], mm->md[2],
                               attr);
    } else if (!st) {
        _Alignas(16) static _Thread_local unsigned char op[OPDESC_BYTES];
        st = dnnl.matmul_desc_v2(op, mm->md[0], mm->md[1], mm->md[3], mm->md[2]);
        if (!st) st = dnnl.pd_create_v2(&mm->pd, op, attr, dnnl.engine, NULL);
    }
    if (!st) st = dnnl.prim_create(&mm->prim, mm->pd);
    threads_leave(old);
    if (attr) dnnl.attr_destroy(attr);
    int n = c->ndims;
    if (st) {
        snprintf(why, size, "oneDNN refused a bf16 matmul %lldx%lldx%lld%s%s (status %d)",
                 (long long)c->dims[n - 2], (long long)c->dims[n - 1], (long long)a->dims[n - 1],
                 accumulate ? " accumulating" : "", bias ? " with bias" : "", st);
        fsc_dnnl_matmul_free(mm);
        return NULL;
    }
    mm->scratch_md = dnnl.query_md(mm->pd, DNNL_QUERY_SCRATCHPAD_MD, 0);
    mm->scratch = mm->scratch_md ? dnnl.md_size(mm->scratch_md) : 0;
    if (dnnl.query(mm->pd, DNNL_QUERY_IMPL_INFO_STR, 0, &mm->impl) || !mm->impl) mm->impl = "?";
    return mm;
}

fsc_dnnl_layout fsc_dnnl_matrix(int64_t rows, int64_t cols, bool trans, int64_t ld) {
    /* element (i, j) at i * ld + j, or j * ld + i when transposed */
    return (fsc_dnnl_layout){2, {rows, cols}, {trans ? 1 : ld, trans ? ld : 1}};
}

fsc_dnnl_matmul *fsc_dnnl_matmul_new(bool ta, bool tb, int M, int N, int K, int ldc,
                                     bool accumulate, bool bias, int threads, char *why,
                                     size_t size) {
    fsc_dnnl_layout a = fsc_dnnl_matrix(M, K, ta, ta ? M : K);
    fsc_dnnl_layout b = fsc_dnnl_matrix(K, N, tb, tb ? K : N);
    fsc_dnnl_layout c = fsc_dnnl_matrix(M, N, false, ldc);
    return fsc_dnnl_matmul_new_nd(&a, &b, &c, accumulate, bias, threads, why, size);
}

size_t fsc_dnnl_matmul_scratch(const fsc_dnnl_matmul *mm) {
    return mm->scratch;
}

const char *fsc_dnnl_matmul_impl(const fsc_dnnl_matmul *mm) {
    return mm->impl;
}

static void *thread_stream(void) {
    void *s = pthread_getspecific(dnnl.stream_key);
    if (!s && !dnnl.stream_create(&s, dnnl.engine, DNNL_STREAM_IN_ORDER) &&
        pthread_setspecific(dnnl.stream_key, s)) {
        dnnl.stream_destroy(s);
        s = NULL;
    }
    return s;
}

int fsc_dnnl_matmul_run(const fsc_dnnl_matmul *mm, const uint16_t *A, const uint16_t *B, float *C,
                        const float *bias, void *scratch, int threads) {
    void *stream = thread_stream(), *mem[5] = {0};
    if (!stream) return -1;
    if (!bias != !mm->md[3]) return -1; /* a bias where the primitive has none, or none given */
    dnnl_exec_arg args[5] = {{DNNL_ARG_SRC, NULL}, {DNNL_ARG_WEIGHTS, NULL}, {DNNL_ARG_DST, NULL}};
    int st = dnnl.mem_create(&mem[0], mm->md[0], dnnl.engine, (void *)A);
    if (!st) st = dnnl.mem_create(&mem[1], mm->md[1], dnnl.engine, (void *)B);
    if (!st) st = dnnl.mem_create(&mem[2], mm->md[2], dnnl.engine, C);
    int nargs = 3;
    if (!st && bias) {
        args[nargs].arg = DNNL_ARG_BIAS;
        st = dnnl.mem_create(&mem[nargs++], mm->md[3], dnnl.engine, (void *)bias);
    }
    if (!st && mm->scratch) {
        args[nargs].arg = DNNL_ARG_SCRATCHPAD;
        st = dnnl.mem_create(&mem[nargs++], mm->scratch_md, dnnl.engine, scratch);
    }
    for (int i = 0; i < nargs; i++) args[i].memory = mem[i];
    if (!st) {
        int old = threads_enter(threads);
        st = dnnl.execute(mm->prim, stream, nargs, args);
        if (!st) st = dnnl.stream_wait(stream);
        threads_leave(old);
    }
    for (int i = 0; i < 5; i++)
        if (mem[i]) dnnl.mem_destroy(mem[i]);
    return st;
}

void fsc_dnnl_matmul_free(fsc_dnnl_matmul *mm) {
    if (!mm) return;
    if (mm->prim) dnnl.prim_destroy(mm->prim);
    if (mm->pd) dnnl.pd_destroy(mm->pd);
    for (int i = 0; i < 4 && dnnl.md_destroy_v3; i++)
        if (mm->md[i]) dnnl.md_destroy_v3(mm->md[i]);
    free(mm);
}
