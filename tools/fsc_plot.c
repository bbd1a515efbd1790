/* fsc-plot: loss curves from fsc-train --metrics files, as one SVG picture.
 *
 * Three panels share the step axis: train loss (a line) with val loss (open
 * points where a row has one), learning rate, and tokens/s; one colour per
 * file, a legend naming the files and keying the marks, so several runs
 * compare on one plot. --smooth A adds the train loss's exponential moving
 * average (TensorBoard's debiased one) over a faint raw line; --log-y draws
 * the loss panel on a log scale.
 *
 * Why an SVG writer in C rather than gnuplot (or a PNG): nothing to install
 * at run time (gnuplot drags in a display stack, and fsc's tools must work on
 * a bare cluster node), the file opens in any browser, and SVG is text, so a
 * picture in a repository or a CI artifact diffs like code.
 *
 * The one idea: a metrics file may be huge (millions of rows), so it is
 * streamed twice and never held: the first pass finds the axes' ranges, the
 * second maps each row to pixels and keeps, per half-pixel column, only the
 * lowest and highest point, which draws the same picture in bounded memory
 * and a bounded file. Rows without a number for a field (NaN written as
 * `nan`, null, missing) leave a gap in that series only. */
#define _POSIX_C_SOURCE 200809L /* getline */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/core.h"
#include "fsc/io.h"
#include "plot_rows.h"
#include "tool_flags.h"

enum { S_LOSS, S_VAL, S_LR, S_TOKS, S_SMOOTH, NSERIES };
static const char *const KEYS[NSERIES] = {"loss", "val_loss", "lr", "tokens_per_s", "loss_smooth"};
static const char *const COLOURS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLOURS (sizeof COLOURS / sizeof *COLOURS)

/* Geometry (SVG user units = pixels). */
#define WIDTH 960.0
#define LEFT 84.0
#define RIGHT 24.0
#define PLOT_W (WIDTH - LEFT - RIGHT)
#define LEGEND_ROW 18.0
#define PANEL_GAP 56.0

typedef struct {
    double lo, hi; /* lo > hi while empty */
} range;

typedef struct {
    float *xy; /* pixel pairs */
    size_t n, cap;
} points;

/* One file's decimation state for one series: the current half-pixel column's
 * lowest and highest points, in the order they came. */
typedef struct {
    long col;
    bool have;
    float minx, miny, maxx, maxy;
    bool min_first;
} bucket;

/* The debiased exponential moving average of a series (TensorBoard's
 * smoothing): s = a s + (1 - a) x over the finite values, divided by
 * 1 - a^n so that the first points are not pulled towards 0. */
typedef struct {
    double a, sum, weight;
} ema;

static double ema_add(ema *e, double x) {
    e->sum = e->a * e->sum + (1 - e->a) * x;
    e->weight = e->a * e->weight + (1 - e->a);
    return e->sum / e->weight;
}

typedef struct {
    const char *path;
    long rows, bad;       /* metrics rows (with a step); lines that are not JSON */
    ema smooth;           /* the train loss's average (--smooth), restarted each pass */
    long nval;            /* rows with a val_loss */
    double last[NSERIES]; /* last finite value of each series, NaN if none */
    points pts[NSERIES];
    bucket bk[NSERIES];
} run;

typedef struct {
    const char *title, *ylabel;
    int series[3], nseries;
    double y, h; /* top and height of the plotting area */
    range r;     /* of the plotted values: log10 of the data on a log scale */
    bool log;    /* --log-y: the data's log10 is plotted; values <= 0 are left out */
} panel;

static void range_add(range *r, double v) {
    if (v < r->lo) r->lo = v;
    if (v > r->hi) r->hi = v;
}

/* 1: a metrics row (step and the series' values, NaN where absent); 0: JSON
 * without a step (not a metrics row); -1: not JSON (plot_rows.c). */
static int parse_row(const char *line, double *step, double v[NSERIES]) {
    v[S_SMOOTH] = NAN; /* computed from the loss (scan), not read */
    return plot_row_parse(line, KEYS, S_SMOOTH, step, v);
}

static bool blank(const char *s) {
    while (isspace((unsigned char)*s)) s++;
    return !*s;
}

typedef void (*row_fn)(void *ctx, run *r, double step, const double v[NSERIES]);

/* Streams `r->path` line by line, calling fn for each metrics row (at most
 * `limit` of them when limit >= 0: a file that grows between the passes is
 * drawn as it was). 0, or -1 with a message. */
static int scan(run *r, long limit, row_fn fn, void *ctx, long *rows, long *bad) {
    FILE *f; /* a regular file: a FIFO or /dev/zero is refused, not waited on or read forever */
    if (fsc_file_open_read(r->path, &f)) {
        fprintf(stderr, "fsc-plot: %s\n", fsc_last_error());
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    *rows = *bad = 0;
    r->smooth.sum = r->smooth.weight = 0;
    while ((limit < 0 || *rows < limit) && getline(&line, &cap, f) != -1) {
        if (blank(line)) continue;
        double step, v[NSERIES];
        int k = parse_row(line, &step, v);
        if (k < 0) ++*bad;
        if (k <= 0) continue;
        ++*rows;
        if (r->smooth.a > 0 && !isnan(v[S_LOSS])) v[S_SMOOTH] = ema_add(&r->smooth, v[S_LOSS]);
        fn(ctx, r, step, v);
    }
    int err = ferror(f);
    free(line);
    fclose(f);
    if (err) {
        fprintf(stderr, "fsc-plot: %s: read error\n", r->path);
        return -1;
    }
    return 0;
}

/* ---- pass 1: ranges ----------------------------------------------------------------------------
 */

typedef struct {
    range x, y[NSERIES];
    range logy[NSERIES]; /* of log10 of the positive values, for --log-y */
} ranges;

static void first_pass(void *ctx, run *r, double step, const double v[NSERIES]) {
    ranges *rg = ctx;
    range_add(&rg->x, step);
    for (int k = 0; k < NSERIES; k++) {
        if (isnan(v[k])) continue;
        range_add(&rg->y[k], v[k]), r->last[k] = v[k];
        if (v[k] > 0) range_add(&rg->logy[k], log10(v[k]));
    }
    if (!isnan(v[S_VAL])) r->nval++;
}

/* ---- pass 2: pixels, decimated -----------------------------------------------------------------
 */

typedef struct {
    range x;
    const panel *of[NSERIES]; /* the panel each series is drawn in */
    bool out_of_memory;
} mapping;

static int points_push(points *p, float x, float y) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        float *xy = realloc(p->xy, 2 * cap * sizeof *xy);
        if (!xy) return -1;
        p->xy = xy, p->cap = cap;
    }
    p->xy[2 * p->n] = x, p->xy[2 * p->n + 1] = y, p->n++;
    return 0;
}

static int bucket_flush(bucket *b, points *p) {
    if (!b->have) return 0;
    b->have = false;
    float ax = b->minx, ay = b->miny, bx = b->maxx, by = b->maxy;
    if (!b->min_first) ax = b->maxx, ay = b->maxy, bx = b->minx, by = b->miny;
    if (points_push(p, ax, ay)) return -1;
    return ax == bx && ay == by ? 0 : points_push(p, bx, by);
}

static double clampd(double v, double lo, double hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

static void second_pass(void *ctx, run *r, double step, const double v[NSERIES]) {
    mapping *m = ctx;
    const double px = LEFT + clampd((step - m->x.lo) / (m->x.hi - m->x.lo), 0, 1) * PLOT_W;
    const long col = lround(floor(2 * px));
    for (int k = 0; k < NSERIES; k++) {
        if (isnan(v[k])) continue;
        const panel *pn = m->of[k];
        if (pn->log && !(v[k] > 0)) continue; /* no place on a log scale */
        const double val = pn->log ? log10(v[k]) : v[k];
        const double f = clampd((val - pn->r.lo) / (pn->r.hi - pn->r.lo), 0, 1);
        const float py = (float)(pn->y + pn->h - f * pn->h);
        bucket *b = &r->bk[k];
        if (b->have && b->col != col && bucket_flush(b, &r->pts[k])) m->out_of_memory = true;
        if (!b->have) {
            *b = (bucket){.col = col, .have = true, .min_first = true};
            b->minx = b->maxx = (float)px, b->miny = b->maxy = py;
            continue;
        }
        /* pixel y grows downwards: the lowest value is the largest py */
        if (py > b->miny) b->minx = (float)px, b->miny = py, b->min_first = false;
        if (py < b->maxy) b->maxx = (float)px, b->maxy = py, b->min_first = true;
    }
}

/* ---- SVG ---------------------------------------------------------------------------------------
 */

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc((unsigned char)*s < 0x20 ? '?' : *s, f);
        }
    }
}

/* 1, 2 or 5 times a power of ten, about span/target. */
static double nice_step(double span, int target) {
    double raw = span / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return mag * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

static void tick_label(char *buf, size_t n, double v, double step) {
    if (fabs(v) < step * 1e-6) v = 0;
    if (step >= 1 && fabs(v) < 1e7) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    int prec = (int)(floor(log10(fmax(fabs(v), step))) - floor(log10(step))) + 1;
    snprintf(buf, n, "%.*g", prec < 1 ? 1 : prec > 9 ? 9 : prec, v);
}

/* An empty range becomes [0, 1]; a flat one is widened; y ranges get a margin. */
static range fit(range r, bool margin) {
    if (r.lo > r.hi) return (range){0, 1};
    if (r.hi - r.lo <= 1e-12 * fmax(1, fabs(r.hi))) {
        double d = fabs(r.hi) > 0 ? 0.1 * fabs(r.hi) : 1;
        return (range){r.lo - d, r.hi + d};
    }
    if (!margin) return r;
    double d = 0.05 * (r.hi - r.lo);
    return (range){r.lo - d, r.hi + d};
}

/* A y grid line and its label at plotted value v. */
static void draw_y_tick(FILE *f, const panel *p, double v, const char *label) {
    double py = p->y + p->h - (v - p->r.lo) / (p->r.hi - p->r.lo) * p->h;
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            LEFT, py, LEFT + PLOT_W, py, LEFT - 6, py + 4, label);
}

/* Log-scale ticks: 1, 2 and 5 times each power of ten in the range (only the
 * powers when it spans more than three decades, or 1..9 within one). */
static void draw_log_ticks(FILE *f, const panel *p) {
    static const int some[] = {1, 2, 5}, all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const double span = p->r.hi - p->r.lo;
    const int *m = span > 3 ? some : span < 1 ? all : some;
    const int nm = span > 3 ? 1 : span < 1 ? 9 : 3;
    for (double e = floor(p->r.lo); e <= ceil(p->r.hi); e++)
        for (int i = 0; i < nm; i++) {
            double t = m[i] * pow(10, e), lt = log10(t);
            if (lt < p->r.lo || lt > p->r.hi) continue;
            char buf[32];
            snprintf(buf, sizeof buf, "%g", t);
            draw_y_tick(f, p, lt, buf);
        }
}

static void draw_panel(FILE *f, const panel *p, range x, bool empty) {
    fprintf(f, "<g class=\"panel\" id=\"panel-%s\">\n", p->ylabel);
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#444\"/>\n",
            LEFT, p->y, PLOT_W, p->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">", LEFT, p->y - 8);
    xml_text(f, p->title);
    fputs("</text>\n", f);
    char buf[64];
    if (p->log) {
        draw_log_ticks(f, p);
    } else {
        double ys = nice_step(p->r.hi - p->r.lo, 5);
        for (double k = ceil(p->r.lo / ys); k * ys <= p->r.hi; k++) {
            tick_label(buf, sizeof buf, k * ys, ys);
            draw_y_tick(f, p, k * ys, buf);
        }
    }
    double xs = fmax(1, nice_step(x.hi - x.lo, 8));
    for (double k = ceil(x.lo / xs); k * xs <= x.hi; k++) {
        double px = LEFT + (k * xs - x.lo) / (x.hi - x.lo) * PLOT_W;
        tick_label(buf, sizeof buf, k * xs, xs);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                px, p->y, px, p->y + p->h, px, p->y + p->h + 16, buf);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">step</text>\n",
            LEFT + PLOT_W, p->y + p->h + 32);
    if (empty)
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">"
                "no data in any file</text>\n",
                LEFT + PLOT_W / 2, p->y + p->h / 2);
    fputs("</g>\n", f);
}

static void draw_series(FILE *f, const run *r, int file, int k) {
    const points *p = &r->pts[k];
    const char *colour = COLOURS[file % NCOLOURS];
    if (p->n == 0) return;
    if (k == S_VAL) {
        for (size_t i = 0; i < p->n; i++)
            fprintf(f,
                    "<circle class=\"val_loss\" data-file=\"%d\" cx=\"%.1f\" cy=\"%.1f\" "
                    "r=\"3.5\" fill=\"white\" stroke=\"%s\" stroke-width=\"1.8\"/>\n",
                    file, p->xy[2 * i], p->xy[2 * i + 1], colour);
        return;
    }
    /* with --smooth the raw train loss is drawn faint under its average */
    const bool faint = k == S_LOSS && r->smooth.a > 0;
    fprintf(f,
            "<polyline class=\"%s\" data-file=\"%d\" fill=\"none\" stroke=\"%s\" "
            "stroke-width=\"%s\"%s stroke-linejoin=\"round\" points=\"",
            KEYS[k], file, colour, k == S_SMOOTH ? "1.8" : "1.4",
            faint ? " stroke-opacity=\"0.3\"" : "");
    for (size_t i = 0; i < p->n; i++)
        fprintf(f, "%s%.1f,%.1f", i ? " " : "", p->xy[2 * i], p->xy[2 * i + 1]);
    fputs("\"/>\n", f);
}

static void draw_legend(FILE *f, const run *runs, int nruns, double top) {
    fputs("<g class=\"legend\">\n", f);
    for (int i = 0; i < nruns; i++) {
        const run *r = &runs[i];
        double y = top + i * LEGEND_ROW;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"3\"/>",
                LEFT, y - 4, LEFT + 24, y - 4, COLOURS[i % NCOLOURS]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", LEFT + 32, y);
        xml_text(f, r->path);
        fprintf(f, "</text><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">%ld rows",
                LEFT + PLOT_W, y, r->rows);
        if (!isnan(r->last[S_LOSS])) fprintf(f, ", last loss %.4f", r->last[S_LOSS]);
        if (!isnan(r->last[S_VAL])) fprintf(f, ", last val %.4f", r->last[S_VAL]);
        fputs("</text>\n", f);
    }
    /* the key of the marks, in grey: what a line and an open point are */
    const double y = top + nruns * LEGEND_ROW;
    const bool smooth = nruns > 0 && runs[0].smooth.a > 0;
    fprintf(f,
            "<g class=\"key\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#555\" stroke-width=\"1.8\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>",
            LEFT, y - 4, LEFT + 24, y - 4, LEFT + 32, y,
            smooth ? "train loss, smoothed (faint: raw)" : "train loss");
    fprintf(f,
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"white\" stroke=\"#555\" "
            "stroke-width=\"1.8\"/><text x=\"%.1f\" y=\"%.1f\">val loss</text></g>\n",
            LEFT + 262, y - 4, LEFT + 272, y);
    fputs("</g>\n", f);
}

static int write_svg(const char *path, const char *title, const run *runs, int nruns,
                     const panel *panels, int npanels, range x, const bool *empty, double height) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "fsc-plot: -o %s: cannot open for writing: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            WIDTH, height, WIDTH, height);
    fputs("<title>", f);
    xml_text(f, title);
    fprintf(f, "</title>\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", WIDTH, height);
    fprintf(f,
            "<text class=\"title\" x=\"%.1f\" y=\"28\" text-anchor=\"middle\" "
            "font-size=\"17\" font-weight=\"bold\">",
            WIDTH / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
    draw_legend(f, runs, nruns, 54);
    for (int p = 0; p < npanels; p++) {
        draw_panel(f, &panels[p], x, empty[p]);
        for (int i = 0; i < nruns; i++)
            for (int s = 0; s < panels[p].nseries; s++)
                draw_series(f, &runs[i], i, panels[p].series[s]);
    }
    fputs("</svg>\n", f);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "fsc-plot: -o %s: write failed\n", path);
        return -1;
    }
    return 0;
}

/* ---- main --------------------------------------------------------------------------------------
 */

typedef struct {
    const char *out, *title;
    double smooth; /* EMA weight of the train loss's average, in [0, 1); 0: none */
    bool log_y;    /* the loss panel on a log scale */
} plot_options;

static const tool_flag FLAGS[] = {
    {.name = "output",
     .kind = ARG_STR,
     .offset = offsetof(plot_options, out),
     .meta = "FILE",
     .short_name = 'o',
     .help = "the SVG file to write (required)"},
    {.name = "title",
     .kind = ARG_STR,
     .offset = offsetof(plot_options, title),
     .meta = "TEXT",
     .short_name = 't',
     .help = "the picture's title (default: fsc-train metrics)"},
    {.name = "smooth",
     .kind = ARG_DOUBLE,
     .offset = offsetof(plot_options, smooth),
     .meta = "A",
     .help = "also draw the train loss's moving average, weight A in [0, 1) (TensorBoard's "
             "smoothing; 0.9 is a good start; default 0: none)"},
    {.name = "log-y",
     .kind = ARG_FLAG,
     .offset = offsetof(plot_options, log_y),
     .help = "draw the loss panel on a log scale"},
};

/* 0, 1 for --help/--version (printed), -1 on a bad flag (printed); *first is
 * the first metrics file in argv. */
static int parse(int argc, char **argv, plot_options *o, int *first) {
    const tool_cli cli = {
        .prog = "fsc-plot",
        .usage = "usage: fsc-plot METRICS.jsonl [MORE.jsonl ...] -o curve.svg [--title TEXT]\n"
                 "                [--smooth A] [--log-y]\n"
                 "Draws train loss and val loss (points where present), learning rate and "
                 "tokens/s against\nsteps from fsc-train --metrics files, one colour per file, "
                 "as an SVG picture.",
        .flags = FLAGS,
        .nflags = (int)(sizeof FLAGS / sizeof *FLAGS)};
    int rc = tool_flags_parse(&cli, o, NULL, argc, argv, first);
    if (rc == TOOL_FLAGS_DONE) return 1;
    const char *why = rc                                   ? fsc_last_error()
                      : *first >= argc                     ? "no metrics file given"
                      : !o->out                            ? "-o FILE.svg is required"
                      : !(o->smooth >= 0 && o->smooth < 1) ? "--smooth: expected a weight in [0, 1)"
                                                           : NULL;
    if (!why) return 0;
    fprintf(stderr, "fsc-plot: %s (see --help)\n", why);
    return -1;
}

int main(int argc, char **argv) {
    plot_options o = {.title = "fsc-train metrics"};
    int first = 0;
    int rc = parse(argc, argv, &o, &first);
    if (rc) return rc > 0 ? 0 : 2;
    const char *out = o.out, *title = o.title;
    const int nruns = argc - first;
    run *runs = calloc((size_t)nruns, sizeof *runs);
    if (!runs) return fprintf(stderr, "fsc-plot: out of memory\n"), 1;
    ranges rg = {.x = {INFINITY, -INFINITY}};
    for (int k = 0; k < NSERIES; k++) rg.y[k] = rg.logy[k] = (range){INFINITY, -INFINITY};
    rc = 1;
    for (int i = 0; i < nruns; i++) {
        run *r = &runs[i];
        r->path = argv[first + i];
        r->smooth.a = o.smooth;
        for (int k = 0; k < NSERIES; k++) r->last[k] = NAN;
        if (scan(r, -1, first_pass, &rg, &r->rows, &r->bad)) goto done;
        if (r->rows == 0) {
            if (r->bad)
                fprintf(stderr, "fsc-plot: %s: no metrics rows (%ld lines, none of them JSON)\n",
                        r->path, r->bad);
            else
                fprintf(stderr,
                        "fsc-plot: %s: no metrics rows (empty file, or no row has a "
                        "\"step\")\n",
                        r->path);
            goto done;
        }
        if (r->bad)
            fprintf(stderr, "fsc-plot: %s: skipped %ld lines that are not JSON\n", r->path, r->bad);
    }

    /* layout: title, legend, then the panels stacked on one step axis */
    /* the loss panel's range: train and val (the average stays inside the
     * train loss's), of log10 of the positive values on a log scale */
    const range *ly = o.log_y ? rg.logy : rg.y;
    range yl = ly[S_LOSS];
    if (ly[S_VAL].lo <= ly[S_VAL].hi) range_add(&yl, ly[S_VAL].lo), range_add(&yl, ly[S_VAL].hi);
    panel panels[3] = {
        {o.log_y ? "loss, log scale (line: train, points: val)" : "loss (line: train, points: val)",
         "loss",
         {S_LOSS, S_VAL, S_SMOOTH},
         3,
         0,
         300,
         fit(yl, !o.log_y),
         o.log_y},
        {"learning rate", "lr", {S_LR}, 1, 0, 150, fit(rg.y[S_LR], true), false},
        {"tokens/s", "tokens_per_s", {S_TOKS}, 1, 0, 150, fit(rg.y[S_TOKS], true), false}};
    const bool empty[3] = {yl.lo > yl.hi, rg.y[S_LR].lo > rg.y[S_LR].hi,
                           rg.y[S_TOKS].lo > rg.y[S_TOKS].hi};
    double y = 54 + (nruns + 1) * LEGEND_ROW + 16; /* a row per file and the key */
    for (int p = 0; p < 3; p++) panels[p].y = y, y += panels[p].h + PANEL_GAP;
    mapping m = {.x = fit(rg.x, false),
                 .of = {&panels[0], &panels[0], &panels[1], &panels[2], &panels[0]}};

    for (int i = 0; i < nruns; i++) {
        run *r = &runs[i];
        long rows, bad;
        if (scan(r, r->rows, second_pass, &m, &rows, &bad)) goto done;
        for (int k = 0; k < NSERIES; k++)
            if (bucket_flush(&r->bk[k], &r->pts[k])) m.out_of_memory = true;
        if (rows < r->rows)
            fprintf(stderr, "fsc-plot: %s: shrank while being read (%ld rows, then %ld)\n", r->path,
                    r->rows, rows);
    }
    if (m.out_of_memory) {
        fprintf(stderr, "fsc-plot: out of memory\n");
        goto done;
    }
    if (write_svg(out, title, runs, nruns, panels, 3, m.x, empty, y - PANEL_GAP + 40)) goto done;
    rc = 0;
done:
    for (int i = 0; i < nruns; i++)
        for (int k = 0; k < NSERIES; k++) free(runs[i].pts[k].xy);
    free(runs);
    return rc;
}
