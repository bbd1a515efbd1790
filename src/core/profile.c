/* The profiler's recorder: a stack of open spans on the one recording
 * thread, closed spans kept as trace events, and running totals by category,
 * by op name and by module (include/fsc/profile.h says what is recorded).
 *
 * The one idea: totals are kept as spans close, so the summary covers every
 * step even when the trace buffer is full, and a closed span's self time is
 * its length less the lengths of the spans it contained, which makes the
 * categories of a step add up to the step. Names are interned once; an
 * event is a few integers.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fsc/core.h"
#include "fsc/profile.h"

int fsc_prof_enabled = 0;

enum { MAX_EVENTS = 1 << 21, NO_MEM = -1 };

typedef struct {
    int64_t t0, t1;       /* ns since start; t1 < 0: a counter at t0 of value mem */
    int32_t name, detail; /* string ids; detail -1: none */
    int32_t cat;
    double flops, bytes;
    int64_t mem;
} event;

typedef struct {
    int64_t t0, child, mem0;
    int32_t name, detail, cat;
} frame;

static struct {
    _Atomic(void *) owner_token; /* the recording thread's token address */
    int64_t origin;
    frame stack[FSC_PROF_MAX_DEPTH];
    int depth, lost; /* lost: opened past the maximum depth, not kept */
    event *ev;
    int64_t nev, cap, dropped;
    /* interned strings; names and details share the table */
    char **str;
    int32_t nstr, capstr, *hash; /* hash: open addressing over hcap slots, -1 empty */
    int32_t hcap;
    int32_t *op_of;   /* string id -> op index, -1 */
    int32_t *mem_of;  /* string id -> memory row, -1 */
    fsc_prof_op *ops; /* by op index */
    int32_t nops, capops;
    fsc_prof_mem_row *mem;
    int32_t nmem, capmem;
    fsc_prof_totals tot;
} P;

static _Thread_local char token; /* its address tells the recording thread apart */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spans count on the recording thread, outside OpenMP regions. */
static bool recording_here(void) {
    if (P.owner_token != (void *)&token) return false;
#ifdef _OPENMP
    if (omp_get_level() > 0) return false;
#endif
    return true;
}

/* p (*cap elements of elem bytes) reallocated to hold need, doubling from
 * 256, and *cap set; p itself, *cap kept, when it already holds need or
 * realloc fails (the caller checks *cap). It returns the pointer, since
 * taking the caller's T ** as a void ** would be a pun. */
static void *grow(void *p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return p;
    int32_t n = *cap ? *cap * 2 : 256;
    while (n < need) n *= 2;
    void *q = realloc(p, (size_t)n * elem);
    if (!q) return p;
    *cap = n;
    return q;
}

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static bool rehash(int32_t hcap) {
    int32_t *h = malloc((size_t)hcap * sizeof *h);
    if (!h) return false;
    for (int32_t i = 0; i < hcap; i++) h[i] = -1;
    for (int32_t id = 0; id < P.nstr; id++) {
        uint32_t k = hash_str(P.str[id]) & (uint32_t)(hcap - 1);
        while (h[k] >= 0) k = (k + 1) & (uint32_t)(hcap - 1);
        h[k] = id;
    }
    free(P.hash);
    P.hash = h, P.hcap = hcap;
    return true;
}

/* The id of s, added if new; -1 when out of memory. */
static int32_t intern(const char *s) {
    if (2 * (P.nstr + 1) > P.hcap && !rehash(P.hcap ? 2 * P.hcap : 1024)) return -1;
    uint32_t k = hash_str(s) & (uint32_t)(P.hcap - 1);
    for (; P.hash[k] >= 0; k = (k + 1) & (uint32_t)(P.hcap - 1))
        if (!strcmp(P.str[P.hash[k]], s)) return P.hash[k];
    if (P.nstr == P.capstr) { /* the three per-string arrays grow together */
        int32_t n = P.capstr ? 2 * P.capstr : 256;
        char **str = realloc(P.str, (size_t)n * sizeof *str);
        if (str) P.str = str;
        int32_t *op_of = str ? realloc(P.op_of, (size_t)n * sizeof *op_of) : NULL;
        if (op_of) P.op_of = op_of;
        int32_t *mem_of = op_of ? realloc(P.mem_of, (size_t)n * sizeof *mem_of) : NULL;
        if (!mem_of) return -1;
        P.mem_of = mem_of, P.capstr = n;
    }
    char *copy = strdup(s);
    if (!copy) return -1;
    P.str[P.nstr] = copy;
    P.op_of[P.nstr] = P.mem_of[P.nstr] = -1;
    P.hash[k] = P.nstr;
    return P.nstr++;
}

void fsc_prof_free(void) {
    fsc_prof_enabled = 0;
    P.owner_token = NULL;
    for (int32_t i = 0; i < P.nstr; i++) free(P.str[i]);
    free(P.str), free(P.hash), free(P.op_of), free(P.mem_of), free(P.ev), free(P.ops), free(P.mem);
    memset(&P, 0, sizeof P);
}

int fsc_prof_start(void) {
    fsc_prof_free();
    P.cap = 1 << 16;
    P.ev = malloc((size_t)P.cap * sizeof *P.ev);
    if (!P.ev || !rehash(1024)) {
        fsc_prof_free();
        return fsc_error(FSC_ERR_NOMEM, "profile: out of memory for the trace buffer");
    }
    P.origin = now_ns();
    P.owner_token = &token;
    fsc_prof_enabled = 1;
    return FSC_OK;
}

void fsc_prof_stop(void) {
    if (!fsc_prof_enabled) return;
    if (recording_here())
        while (P.depth > 0) fsc_prof_end(0, 0);
    fsc_prof_enabled = 0;
    P.owner_token = NULL;
}

void fsc_prof_begin_mem(fsc_prof_cat cat, const char *name, const char *detail,
                        int64_t mem_before) {
    if (!fsc_prof_enabled || !recording_here()) return;
    if (P.depth >= FSC_PROF_MAX_DEPTH) {
        P.lost++;
        return;
    }
    frame *f = &P.stack[P.depth++];
    f->name = intern(name ? name : "?");
    f->detail = detail ? intern(detail) : -1;
    f->cat = cat >= 0 && cat < FSC_PROF_CAT_COUNT ? (int32_t)cat : FSC_PROF_OTHER;
    f->mem0 = mem_before;
    f->child = 0;
    f->t0 = now_ns() - P.origin; /* last: the bookkeeping stays out of the span */
}

void fsc_prof_begin(fsc_prof_cat cat, const char *name, const char *detail) {
    fsc_prof_begin_mem(cat, name, detail, NO_MEM);
}

void fsc_prof_beginf(fsc_prof_cat cat, const char *fmt, ...) {
    if (!fsc_prof_enabled || !recording_here()) return;
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    fsc_prof_begin_mem(cat, name, NULL, NO_MEM);
}

void fsc_prof_gemm_begin(fsc_prof_cat cat, bool ta, bool tb, int M, int N, int K) {
    fsc_prof_beginf(cat, "%s %dx%dx%d %c%c", cat == FSC_PROF_GEMM_BF16 ? "gemm bf16" : "sgemm", M,
                    N, K, ta ? 'T' : 'N', tb ? 'T' : 'N');
}

static fsc_prof_op *op_for(int32_t name, int32_t cat) {
    if (name < 0) return NULL;
    if (P.op_of[name] < 0) {
        P.ops = grow(P.ops, &P.capops, P.nops + 1, sizeof *P.ops);
        if (P.capops <= P.nops) return NULL;
        P.ops[P.nops] = (fsc_prof_op){.name = P.str[name], .cat = (fsc_prof_cat)cat};
        P.op_of[name] = P.nops++;
    }
    return &P.ops[P.op_of[name]];
}

static fsc_prof_mem_row *mem_for(int32_t detail) {
    if (detail < 0) return NULL;
    if (P.mem_of[detail] < 0) {
        P.mem = grow(P.mem, &P.capmem, P.nmem + 1, sizeof *P.mem);
        if (P.capmem <= P.nmem) return NULL;
        P.mem[P.nmem] = (fsc_prof_mem_row){.module = P.str[detail]};
        P.mem_of[detail] = P.nmem++;
    }
    return &P.mem[P.mem_of[detail]];
}

static event *new_event(void) {
    if (P.nev == P.cap) {
        if (P.cap >= MAX_EVENTS) return NULL;
        event *e = realloc(P.ev, (size_t)(2 * P.cap) * sizeof *e);
        if (!e) return NULL;
        P.ev = e, P.cap *= 2;
    }
    return &P.ev[P.nev++];
}

static void close_span(double flops, double bytes, int64_t mem_after, int slot) {
    const int64_t t1 = now_ns() - P.origin; /* first: the bookkeeping stays out of the span */
    if (P.lost > 0) {
        P.lost--;
        return;
    }
    if (P.depth == 0) return; /* started inside a span: its end is not ours */
    frame *f = &P.stack[--P.depth];
    const int64_t dur = t1 - f->t0, self = dur - f->child;
    if (P.depth > 0) P.stack[P.depth - 1].child += dur;
    bool in_step = f->cat == FSC_PROF_STEP;
    for (int d = 0; d < P.depth && !in_step; d++) in_step = P.stack[d].cat == FSC_PROF_STEP;
    (in_step ? P.tot.cat_s : P.tot.outside_s)[f->cat] += 1e-9 * (double)self;
    if (f->cat == FSC_PROF_STEP) P.tot.steps++, P.tot.step_s += 1e-9 * (double)dur;
    fsc_prof_op *op = op_for(f->name, f->cat);
    if (op) {
        op->calls++, op->self_s += 1e-9 * (double)self, op->total_s += 1e-9 * (double)dur;
        op->flops += flops, op->bytes += bytes;
    }
    const bool has_mem = f->mem0 != NO_MEM && mem_after != NO_MEM;
    fsc_prof_mem_row *row = has_mem ? mem_for(f->detail) : NULL;
    if (row) row->calls[slot]++, row->bytes[slot] += mem_after - f->mem0;
    event *e = new_event();
    if (!e) {
        P.dropped++;
        return;
    }
    *e = (event){.t0 = f->t0,
                 .t1 = t1,
                 .name = f->name,
                 .detail = f->detail,
                 .cat = f->cat,
                 .flops = flops,
                 .bytes = bytes,
                 .mem = NO_MEM};
    if (!has_mem) return;
    e = new_event();
    if (e)
        *e = (event){.t0 = t1, .t1 = -1, .name = -1, .detail = -1, .mem = mem_after};
    else
        P.dropped++;
}

void fsc_prof_end(double flops, double bytes) {
    if (fsc_prof_enabled && recording_here()) close_span(flops, bytes, NO_MEM, 0);
}

void fsc_prof_end_mem(int64_t mem_after, int slot, double bytes) {
    if (fsc_prof_enabled && recording_here()) close_span(0, bytes, mem_after, slot ? 1 : 0);
}

fsc_prof_totals fsc_prof_get_totals(void) {
    fsc_prof_totals t = P.tot;
    t.events = P.nev, t.dropped = P.dropped;
    return t;
}

int fsc_prof_get_ops(const fsc_prof_op **out) {
    *out = P.ops;
    return P.nops;
}

int fsc_prof_get_mem(const fsc_prof_mem_row **out) {
    *out = P.mem;
    return P.nmem;
}

const char *fsc_prof_cat_name(fsc_prof_cat cat) {
    static const char *names[FSC_PROF_CAT_COUNT] = {
        "other", "step",      "gemm_bf16", "gemm_fp32", "attention", "elementwise",
        "loss",  "optimizer", "comm",      "comm_wait", "data",      "checkpoint"};
    return cat >= 0 && cat < FSC_PROF_CAT_COUNT ? names[cat] : "?";
}

static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* ns as microseconds with three decimals: exact, so nesting survives */
static void put_us(FILE *f, int64_t ns) {
    fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

int64_t fsc_prof_write_events(FILE *f, int pid) {
    for (int64_t i = 0; i < P.nev; i++) {
        const event *e = &P.ev[i];
        if (i) fputs(",\n", f);
        if (e->t1 < 0) {
            fprintf(f,
                    "{\"name\": \"arena bytes\", \"ph\": \"C\", \"pid\": %d, \"tid\": 0, \"ts\": ",
                    pid);
            put_us(f, e->t0);
            fprintf(f, ", \"args\": {\"used\": %lld}}", (long long)e->mem);
            continue;
        }
        fputs("{\"name\": ", f);
        put_string(f, e->name >= 0 ? P.str[e->name] : "?");
        fprintf(f, ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": ",
                fsc_prof_cat_name((fsc_prof_cat)e->cat), pid);
        put_us(f, e->t0);
        fputs(", \"dur\": ", f);
        put_us(f, e->t1 - e->t0);
        const double s = 1e-9 * (double)(e->t1 - e->t0);
        if (e->detail >= 0 || e->flops > 0 || e->bytes > 0) {
            const char *sep = "";
            fputs(", \"args\": {", f);
            if (e->detail >= 0) fputs("\"module\": ", f), put_string(f, P.str[e->detail]);
            if (e->detail >= 0) sep = ", ";
            if (e->flops > 0)
                fprintf(f, "%s\"gflop\": %.4g, \"gflops\": %.4g", sep, 1e-9 * e->flops,
                        s > 0 ? 1e-9 * e->flops / s : 0),
                    sep = ", ";
            if (e->bytes > 0)
                fprintf(f, "%s\"bytes\": %.0f, \"gb_per_s\": %.4g", sep, e->bytes,
                        s > 0 ? 1e-9 * e->bytes / s : 0);
            fputc('}', f);
        }
        fputc('}', f);
    }
    return ferror(f) ? fsc_error(FSC_ERR_IO, "profile: writing the trace events failed") : P.nev;
}
