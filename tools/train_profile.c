/* --profile FILE: the recorder's events of every rank merged into one
 * Chrome trace (pid = rank, opens in Perfetto or chrome://tracing) and the
 * run's summary, printed by rank 0.
 *
 * The one idea: each rank serialises its own events, so rank 0 only
 * concatenates bytes; the totals travel as raw doubles in int64 slots. The
 * trace carries the summary's per-rank totals under "fscProfile" (a key
 * trace viewers ignore), so a test reads both from one file.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/kernels.h"
#include "fsc/profile.h"
#include "train_profile.h"

enum { NCAT = FSC_PROF_CAT_COUNT, NTOT = 2 + 2 * NCAT + 2 }; /* steps, step_s, cat, outside, ev */

static void totals_pack(const fsc_prof_totals *t, int64_t *out) {
    double d[NTOT];
    d[0] = (double)t->steps, d[1] = t->step_s;
    for (int c = 0; c < NCAT; c++) d[2 + c] = t->cat_s[c], d[2 + NCAT + c] = t->outside_s[c];
    d[2 + 2 * NCAT] = (double)t->events, d[3 + 2 * NCAT] = (double)t->dropped;
    memcpy(out, d, sizeof d);
}

static fsc_prof_totals totals_unpack(const int64_t *in) {
    double d[NTOT];
    memcpy(d, in, sizeof d);
    fsc_prof_totals t = {.steps = (int64_t)d[0], .step_s = d[1]};
    for (int c = 0; c < NCAT; c++) t.cat_s[c] = d[2 + c], t.outside_s[c] = d[2 + NCAT + c];
    t.events = (int64_t)d[2 + 2 * NCAT], t.dropped = (int64_t)d[3 + 2 * NCAT];
    return t;
}

/* The summary's categories: a step's own time is "other". */
static double cat_time(const fsc_prof_totals *t, int c) {
    return c == FSC_PROF_OTHER  ? t->cat_s[FSC_PROF_OTHER] + t->cat_s[FSC_PROF_STEP]
           : c == FSC_PROF_STEP ? 0
                                : t->cat_s[c];
}

/* Best copy bandwidth of 64 MiB (read + write), the elementwise ops' peak. */
static double copy_peak_gbs(void) {
    const size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n), memset(b, 2, n);
        for (int r = 0; r < 4; r++) {
            double t = fsc_now();
            memcpy(b, a, n);
            double g = 2.0 * (double)n / (fsc_now() - t) / 1e9;
            if (g > best) best = g;
            a[r] = b[n - 1 - r]; /* keep the copy observable */
        }
    }
    free(a), free(b);
    return best;
}

static int write_trace(const char *path, int P, const char *text, const int64_t *len16,
                       const fsc_prof_totals *tot) {
    FILE *f = fopen(path, "w");
    if (!f) return fsc_error(FSC_ERR_IO, "--profile %s: cannot open it for writing", path);
    fputs("{\"traceEvents\": [\n", f);
    size_t at = 0;
    for (int r = 0; r < P; r++) {
        fprintf(f,
                "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                "\"args\": {\"name\": \"rank %d\"}}",
                r ? ",\n" : "", r, r);
        const char *s = text + at;
        size_t n = strnlen(s, (size_t)len16[r] * 2);
        if (n) fputs(",\n", f), fwrite(s, 1, n, f);
        at += (size_t)len16[r] * 2;
    }
    fputs("\n],\n\"displayTimeUnit\": \"ms\",\n\"fscProfile\": {\"categories\": [", f);
    for (int c = 0; c < NCAT; c++)
        if (c != FSC_PROF_STEP) fprintf(f, "%s\"%s\"", c ? ", " : "", fsc_prof_cat_name(c));
    fputs("], \"ranks\": [", f);
    for (int r = 0; r < P; r++) {
        fprintf(f, "%s\n  {\"rank\": %d, \"steps\": %lld, \"step_s\": %.9f, \"category_s\": {",
                r ? "," : "", r, (long long)tot[r].steps, tot[r].step_s);
        for (int c = 0; c < NCAT; c++)
            if (c != FSC_PROF_STEP)
                fprintf(f, "%s\"%s\": %.9f", c ? ", " : "", fsc_prof_cat_name(c),
                        cat_time(&tot[r], c));
        fprintf(f, "}, \"events\": %lld, \"dropped\": %lld}", (long long)tot[r].events,
                (long long)tot[r].dropped);
    }
    fputs("\n]}}\n", f);
    if (ferror(f) | (fclose(f) != 0))
        return fsc_error(FSC_ERR_IO, "--profile %s: writing it failed", path);
    return FSC_OK;
}

static int cmp_self(const void *a, const void *b) {
    const fsc_prof_op *x = *(const fsc_prof_op *const *)a, *y = *(const fsc_prof_op *const *)b;
    return x->self_s < y->self_s ? 1 : x->self_s > y->self_s ? -1 : 0;
}

static int depth_of(const char *path) {
    int d = 0;
    for (; *path; path++) d += *path == '.';
    return d;
}

static void print_categories(FILE *out, int P, const fsc_prof_totals *tot) {
    int64_t steps = tot[0].steps > 0 ? tot[0].steps : 1;
    fprintf(out, "\n| category | ms/step (mean over %d rank%s) | share | max over ranks |\n", P,
            P > 1 ? "s" : "");
    fprintf(out, "|---|---:|---:|---:|\n");
    double step_mean = 0, step_max = 0, sum = 0;
    for (int r = 0; r < P; r++) {
        double s = tot[r].step_s / (double)(tot[r].steps > 0 ? tot[r].steps : 1);
        step_mean += s / P, step_max = s > step_max ? s : step_max;
    }
    for (int c = 0; c < NCAT; c++) {
        if (c == FSC_PROF_STEP) continue;
        double mean = 0, max = 0;
        for (int r = 0; r < P; r++) {
            double v = cat_time(&tot[r], c) / (double)(tot[r].steps > 0 ? tot[r].steps : 1);
            mean += v / P, max = v > max ? v : max;
        }
        sum += mean;
        if (mean == 0 && max == 0) continue;
        fprintf(out, "| %s | %.2f | %.1f%% | %.2f |\n", fsc_prof_cat_name(c), 1e3 * mean,
                step_mean > 0 ? 100 * mean / step_mean : 0, 1e3 * max);
    }
    fprintf(out, "| **step** | %.2f | %.1f%% | %.2f |\n", 1e3 * step_mean,
            step_mean > 0 ? 100 * sum / step_mean : 0, 1e3 * step_max);
    double outside = 0;
    for (int c = 0; c < NCAT; c++) outside += tot[0].outside_s[c];
    if (outside > 0)
        fprintf(out, "(rank 0 also spent %.1f ms outside the %lld steps: checkpoints, saves)\n",
                1e3 * outside, (long long)steps);
}

static void print_ops(FILE *out, const fsc_prof_totals *t0, double sgemm, double bf16,
                      double copy) {
    const fsc_prof_op *ops;
    int n = fsc_prof_get_ops(&ops);
    const fsc_prof_op **by = malloc((size_t)(n ? n : 1) * sizeof *by);
    if (!by) return;
    for (int i = 0; i < n; i++) by[i] = &ops[i];
    qsort(by, (size_t)n, sizeof *by, cmp_self);
    const double steps = (double)(t0->steps > 0 ? t0->steps : 1), step = t0->step_s / steps;
    char bf[48] = "not run";
    if (bf16 > 0) snprintf(bf, sizeof bf, "%.1f GFLOP/s", bf16);
    fprintf(out,
            "\ntop 15 ops by self time, rank 0 (peaks measured now, 1024^3: sgemm %.1f GFLOP/s, "
            "bf16 GEMM %s; a 64 MiB copy %.1f GB/s)\n",
            sgemm, bf, copy);
    fprintf(out, "| op | category | calls/step | ms/step | share | achieved | of peak |\n");
    fprintf(out, "|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n && i < 15; i++) {
        const fsc_prof_op *o = by[i];
        char got[48] = "", share[16] = "";
        if (o->flops > 0 && o->total_s > 0) {
            double g = o->flops / o->total_s / 1e9;
            double peak = o->cat == FSC_PROF_GEMM_BF16 ? bf16 : sgemm;
            snprintf(got, sizeof got, "%.1f GFLOP/s", g);
            if (peak > 0) snprintf(share, sizeof share, "%.0f%%", 100 * g / peak);
        } else if (o->bytes > 0 && o->total_s > 0) {
            double g = o->bytes / o->total_s / 1e9;
            snprintf(got, sizeof got, "%.2f GB/s", g);
            if (copy > 0 && o->cat != FSC_PROF_COMM && o->cat != FSC_PROF_COMM_WAIT)
                snprintf(share, sizeof share, "%.0f%%", 100 * g / copy);
        }
        fprintf(out, "| %s | %s | %.1f | %.2f | %.1f%% | %s | %s |\n", o->name,
                fsc_prof_cat_name(o->cat == FSC_PROF_STEP ? FSC_PROF_OTHER : o->cat),
                (double)o->calls / steps, 1e3 * o->self_s / steps,
                step > 0 ? 100 * o->self_s / steps / step : 0, got, share);
    }
    free(by);
}

/* FairScale's LayerMemoryTracker, from the arena: what each module's
 * forward keeps and its backward adds, per call; the shallowest levels of
 * the tree that fit in 24 rows. */
static void print_memory(FILE *out) {
    const fsc_prof_mem_row *rows;
    int n = fsc_prof_get_mem(&rows), depth = 0;
    if (!n) return;
    for (int d = 0; d < 16; d++) {
        int k = 0;
        for (int i = 0; i < n; i++) k += depth_of(rows[i].module) <= d;
        if (k > 24) break;
        depth = d;
    }
    fprintf(out,
            "\nper-module activation memory, rank 0 (arena bytes per call; modules to depth "
            "%d)\n| module | forward keeps | backward adds |\n|---|---:|---:|\n",
            depth);
    for (int i = 0; i < n; i++) {
        const fsc_prof_mem_row *m = &rows[i];
        if (depth_of(m->module) > depth) continue;
        double f = m->calls[0] ? (double)m->bytes[0] / (double)m->calls[0] : 0;
        double b = m->calls[1] ? (double)m->bytes[1] / (double)m->calls[1] : 0;
        fprintf(out, "| %s | %.2f MiB | %.2f MiB |\n", m->module[0] ? m->module : "(root)",
                f / 1048576.0, b / 1048576.0);
    }
}

int train_profile_finish(const char *path, fsc_group *g, FILE *out) {
    fsc_prof_stop();
    const int P = fsc_group_size(g) > 0 ? fsc_group_size(g) : 1, rank = fsc_group_rank(g);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int rc = mem ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "--profile: out of memory");
    if (!rc && fsc_prof_write_events(mem, rank < 0 ? 0 : rank) < 0) rc = FSC_ERR_IO;
    if (mem && fclose(mem) && !rc) rc = fsc_error(FSC_ERR_NOMEM, "--profile: out of memory");
    /* U16 elements: the text padded with a NUL to an even length */
    int64_t mine[NTOT + 1], *all = calloc((size_t)P * (NTOT + 1), sizeof *all);
    int64_t *len16 = calloc((size_t)P, sizeof *len16), *displs = calloc((size_t)P, sizeof *displs);
    fsc_prof_totals t = fsc_prof_get_totals(), *tot = calloc((size_t)P, sizeof *tot);
    if (!rc && (!all || !len16 || !displs || !tot))
        rc = fsc_error(FSC_ERR_NOMEM, "--profile: out of memory");
    int64_t n16 = (int64_t)(len + 2) / 2;
    char *padded = rc ? NULL : calloc((size_t)n16, 2);
    if (!rc && !padded) rc = fsc_error(FSC_ERR_NOMEM, "--profile: out of memory");
    if (!rc) memcpy(padded, text, len);
    free(text);
    totals_pack(&t, mine);
    mine[NTOT] = n16;
    /* every rank takes part even after a local failure: its count is then 0 */
    if (rc) mine[NTOT] = n16 = 0;
    int crc = all ? fsc_group_allgather(g, mine, all, NTOT + 1, FSC_DTYPE_I64) : FSC_ERR_NOMEM;
    int64_t total = 0;
    for (int r = 0; !crc && r < P; r++)
        tot[r] = totals_unpack(all + (size_t)r * (NTOT + 1)),
        len16[r] = all[(size_t)r * (NTOT + 1) + NTOT], displs[r] = total, total += len16[r];
    char *merged = crc ? NULL : malloc((size_t)(total ? total : 1) * 2);
    if (!crc && !merged) crc = fsc_error(FSC_ERR_NOMEM, "--profile: out of memory");
    if (!crc) crc = fsc_group_allgatherv(g, padded, merged, len16, displs, FSC_DTYPE_U16);
    int wrc = rc ? rc : crc;
    if (!wrc && rank <= 0) {
        wrc = write_trace(path, P, merged, len16, tot);
        const double sgemm = fsc_sgemm_peak_gflops(1024, 3);
        const bool ran_bf16 = fsc_bf16_gemm_get_stats().calls_bf16 > 0; /* then it runs here */
        const double bf16 = ran_bf16 ? fsc_bf16_gemm_peak_gflops(1024, 3) : 0;
        const double copy = copy_peak_gbs();
        int64_t events = 0, dropped = 0;
        for (int r = 0; r < P; r++) events += tot[r].events, dropped += tot[r].dropped;
        fprintf(out, "\nprofile: %lld steps on %d rank%s, %s (%lld events%s)\n",
                (long long)tot[0].steps, P, P > 1 ? "s" : "", wrc ? "not written" : path,
                (long long)events, dropped ? "; the buffer filled, the totals cover all" : "");
        print_categories(out, P, tot);
        print_ops(out, &tot[0], sgemm, bf16, copy);
        print_memory(out);
        fflush(out);
    }
    free(padded), free(merged), free(all), free(len16), free(displs), free(tot);
    fsc_prof_free();
    if (crc) return crc;
    int32_t status = wrc;
    if (fsc_group_broadcast(g, &status, 1, FSC_DTYPE_I32, 0)) return FSC_ERR_MPI;
    return status && !wrc ? fsc_error(status, "--profile: rank 0 could not write %s", path) : wrc;
}
