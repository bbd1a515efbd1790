/* Staged checkpoint files: a save's output held in memory, then written by a
 * background thread with POSIX calls and checked like a synchronous save
 * (see ckpt_stage.h).
 *
 * The one idea: the capture takes the same collective path as the save it
 * replaces (a path broadcast, an agreement, one all-gather), so ranks never
 * disagree on which collectives they are in; after it, each rank's bytes are
 * a list of runs (file offset, length) that no other rank touches, and the
 * parallel file's CRC-32 is put together from the runs' own CRCs, as
 * safetensors_mpiio.c does from its rounds.
 */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/fault.h"
#include "io/checkpoint_internal.h"
#include "io/ckpt_stage.h"
#include "io/io_internal.h"
#include "io/st_parallel.h"

enum { PATH_WORDS = ST_PATH_WORDS }; /* as st_parallel_save's broadcast */

/* One file: a one-writer file (g NULL, written whole by this rank), or this
 * rank's part of a parallel file over g. */
typedef struct stage_file {
    fsc_group *g;
    bool is_root;         /* the parallel file's root (renames it) */
    char *path, *tmp;     /* tmp: the parallel file's temporary */
    unsigned char *bytes; /* this rank's bytes, runs back to back */
    size_t nbytes, bytes_cap;
    int64_t *runs; /* (offset, length, CRC-32) per run */
    int nruns;
    uint64_t total;     /* the parallel file's size */
    int64_t *all, nall; /* root: every rank's runs, after the gather */
    uint32_t crc;       /* the whole file's CRC-32, once verified */
    bool renamed;
} stage_file;

enum { SPARE_MAX = 16 };

struct ckpt_stage {
    stage_file *f;
    int n, cap;
    /* byte buffers of the saves before, kept for the next capture: fresh
     * memory takes a page fault per 4 KiB page at first touch, which cost
     * the capture as much as a synchronous save's whole write (see
     * docs/checkpoints.md) */
    unsigned char *spare[SPARE_MAX];
    size_t spare_cap[SPARE_MAX];
    int nspare;
};

static _Thread_local ckpt_stage *current;

bool ckpt_stage_threads_ok(void) {
    int on = 0, provided = MPI_THREAD_SINGLE;
    if (MPI_Initialized(&on) != MPI_SUCCESS || !on) return true;
    return MPI_Query_thread(&provided) == MPI_SUCCESS && provided >= MPI_THREAD_FUNNELED;
}

ckpt_stage *ckpt_stage_new(void) {
    ckpt_stage *s = calloc(1, sizeof *s);
    if (!s) fsc_error(FSC_ERR_NOMEM, "asynchronous save: out of memory");
    return s;
}

/* The smallest spare buffer of at least n bytes, else a new one; *cap its size. */
static unsigned char *take(ckpt_stage *s, size_t n, size_t *cap) {
    int best = -1;
    for (int i = 0; i < s->nspare; i++)
        if (s->spare_cap[i] >= n && (best < 0 || s->spare_cap[i] < s->spare_cap[best])) best = i;
    if (best < 0) {
        *cap = n;
        return malloc(n);
    }
    unsigned char *p = s->spare[best];
    *cap = s->spare_cap[best];
    s->nspare--;
    s->spare[best] = s->spare[s->nspare], s->spare_cap[best] = s->spare_cap[s->nspare];
    return p;
}

static void give(ckpt_stage *s, unsigned char *p, size_t cap) {
    if (!p) return;
    if (s->nspare == SPARE_MAX) {
        free(p);
        return;
    }
    s->spare[s->nspare] = p, s->spare_cap[s->nspare++] = cap;
}

void ckpt_stage_recycle(ckpt_stage *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        stage_file *f = &s->f[i];
        if (f->is_root && f->tmp && !f->renamed) unlink(f->tmp);
        free(f->path), free(f->tmp), free(f->runs), free(f->all);
        give(s, f->bytes, f->bytes_cap);
    }
    s->n = 0;
}

void ckpt_stage_free(ckpt_stage *s) {
    if (!s) return;
    ckpt_stage_recycle(s);
    for (int i = 0; i < s->nspare; i++) free(s->spare[i]);
    free(s->f);
    free(s);
}

void ckpt_stage_capture(ckpt_stage *s) {
    current = s;
}

ckpt_stage *ckpt_stage_current(void) {
    return current;
}

size_t ckpt_stage_bytes(const ckpt_stage *s) {
    size_t n = 0;
    for (int i = 0; s && i < s->n; i++) n += s->f[i].nbytes;
    return n;
}

static stage_file *add(ckpt_stage *s) {
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 8;
        stage_file *f = realloc(s->f, (size_t)nc * sizeof *f);
        if (!f) return NULL;
        s->f = f, s->cap = nc;
    }
    stage_file *f = &s->f[s->n++];
    memset(f, 0, sizeof *f);
    return f;
}

int ckpt_stage_add_file(ckpt_stage *s, const char *path, char *bytes, size_t n) {
    stage_file *f = add(s);
    int64_t *run = f ? malloc(3 * sizeof *run) : NULL;
    char *p = run ? strdup(path) : NULL;
    if (!p) {
        free(run), free(bytes);
        if (f) s->n--;
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory staging it", path);
    }
    f->path = p, f->bytes = (unsigned char *)bytes, f->nbytes = f->bytes_cap = n;
    f->is_root = true;
    f->runs = run, f->nruns = 1, f->total = n;
    run[0] = 0, run[1] = (int64_t)n, run[2] = 0;
    return FSC_OK;
}

/* ---- capture of a parallel file ------------------------------------------------ */

typedef struct {
    uint64_t off; /* in the file */
    int k;        /* the piece */
} placed;

static int by_off(const void *a, const void *b) {
    const placed *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* This rank's bytes of the file: root's header, then its pieces in file
 * order, converted to the file's dtypes; contiguous pieces make one run. */
static int stage_pieces(ckpt_stage *s, stage_file *f, fsc_st_writer *plan, const st_pieces *in,
                        const unsigned char *hdr, size_t hlen, uint64_t *data_bytes) {
    const int nt = st_plan_count(plan);
    placed *pl = in->n ? malloc((size_t)in->n * sizeof *pl) : NULL;
    if (in->n && !pl) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    uint64_t total = f->is_root ? hlen : 0;
    int rc = FSC_OK;
    for (int k = 0; k < in->n && !rc; k++) {
        const st_piece *p = &in->p[k];
        fsc_dtype dt;
        uint64_t b, nb;
        if (p->tensor < 0 || p->tensor >= nt) {
            rc = fsc_error(FSC_ERR_INVALID, "%s: piece of tensor #%d; the file has %d", f->path,
                           p->tensor, nt);
            break;
        }
        st_plan_tensor(plan, p->tensor, &dt, &b, &nb);
        const uint64_t es = fsc_dtype_size(dt);
        if (p->elem0 < 0 || p->count < 0 || !p->src || (uint64_t)(p->elem0 + p->count) > nb / es)
            rc = fsc_error(FSC_ERR_SHAPE, "%s: tensor %s: piece [%lld, +%lld) outside it", f->path,
                           st_plan_name(plan, p->tensor), (long long)p->elem0, (long long)p->count);
        pl[k] = (placed){hlen + b + (uint64_t)p->elem0 * es, k};
        total += (uint64_t)p->count * es;
    }
    if (!rc && in->n) qsort(pl, (size_t)in->n, sizeof *pl, by_off);
    f->bytes = rc || !total ? NULL : take(s, total, &f->bytes_cap);
    f->runs = rc ? NULL : malloc(3 * sizeof *f->runs * (size_t)(in->n + 1));
    if (!rc && ((total && !f->bytes) || !f->runs))
        rc = fsc_error(FSC_ERR_NOMEM, "%s: staging %llu bytes: out of memory", f->path,
                       (unsigned long long)total);
    size_t at = 0;
    if (!rc && f->is_root && hlen) {
        memcpy(f->bytes, hdr, hlen);
        f->runs[0] = 0, f->runs[1] = (int64_t)hlen, f->nruns = 1, at = hlen;
    }
    for (int i = 0; i < in->n && !rc; i++) {
        const st_piece *p = &in->p[pl[i].k];
        fsc_dtype dt;
        uint64_t b, nb;
        st_plan_tensor(plan, p->tensor, &dt, &b, &nb);
        const size_t len = (size_t)p->count * fsc_dtype_size(dt);
        if (!len) continue;
        fsc_tensor s = fsc_tensor_1d((void *)p->src, p->src_dtype, p->count);
        fsc_tensor d = fsc_tensor_1d(f->bytes + at, dt, p->count);
        rc =
            p->src_dtype == dt ? (memcpy(d.data, s.data, len), FSC_OK) : fsc_tensor_convert(&s, &d);
        if (rc) break;
        int64_t *last = f->nruns ? f->runs + 3 * (f->nruns - 1) : NULL;
        if (last && (uint64_t)(last[0] + last[1]) == pl[i].off) {
            last[1] += (int64_t)len;
        } else if (last && (uint64_t)(last[0] + last[1]) > pl[i].off) {
            rc = fsc_error(FSC_ERR_INVALID, "%s: pieces overlap at tensor %s", f->path,
                           st_plan_name(plan, p->tensor));
        } else {
            int64_t *r = f->runs + 3 * f->nruns++;
            r[0] = (int64_t)pl[i].off, r[1] = (int64_t)len;
        }
        at += len;
    }
    free(pl);
    f->nbytes = at;
    *data_bytes = f->is_root ? at - hlen : at;
    return rc;
}

int ckpt_stage_parallel(fsc_group *g, int root, const char *path, fsc_st_writer *plan,
                        const st_pieces *pieces, int status) {
    ckpt_stage *s = current;
    const bool is_root = fsc_group_rank(g) == root;
    static _Thread_local int32_t names[2 * PATH_WORDS]; /* root's path, then its temporary */
    char *rpath = (char *)names, *tmp = (char *)(names + PATH_WORDS);
    int rc, brc = st_parallel_names(g, root, path, plan, status, names, &rc);
    if (brc) return brc;
    const bool made = is_root && !rc;
    stage_file *f = rc ? NULL : add(s);
    if (!rc && !f) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory staging it", rpath);
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    uint64_t mine = 0;
    if (f) {
        f->g = g, f->is_root = is_root;
        f->path = strdup(rpath), f->tmp = strdup(tmp);
        if (!f->path || !f->tmp) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", rpath);
        if (!rc) rc = st_plan_header(plan, &hdr, &hlen);
        if (!rc) rc = stage_pieces(s, f, plan, pieces, hdr, hlen, &mine);
        f->total = hlen + (plan ? st_plan_data_bytes(plan) : 0);
    }
    free(hdr);
    rc = fsc_group_agree(g, rc, "staging the parallel save");
    /* the ranks' pieces together cover every data byte once */
    const int world = fsc_group_size(g);
    int64_t *all = rc ? NULL : calloc((size_t)world, sizeof *all), covered = 0, m = (int64_t)mine;
    if (!rc && !all) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", rpath);
    rc = fsc_group_agree(g, rc, "staging the parallel save");
    if (!rc) rc = fsc_group_allgather(g, &m, all, 1, FSC_DTYPE_I64);
    for (int r = 0; !rc && r < world; r++) covered += all[r];
    if (!rc && (uint64_t)covered != st_plan_data_bytes(plan))
        rc = fsc_error(FSC_ERR_INVALID,
                       "%s: the ranks' pieces hold %lld of its %llu data bytes (a gap or an "
                       "overlap between ranks); nothing written",
                       rpath, (long long)covered, (unsigned long long)st_plan_data_bytes(plan));
    free(all);
    if (rc && f) { /* the last file added: drop it (and the root's temporary) */
        if (made) unlink(tmp);
        free(f->path), free(f->tmp), free(f->runs);
        give(s, f->bytes, f->bytes_cap);
        s->n--;
    } else if (rc && made) {
        unlink(tmp);
    }
    fsc_st_writer_abort(plan);
    return rc;
}

/* ---- the background writes ----------------------------------------------------- */

static int pwrite_all(int fd, const unsigned char *p, size_t n, uint64_t off, const char *path,
                      int rank) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return fsc_error(FSC_ERR_IO, "rank %d: %s: write at offset %llu failed: %s", rank, path,
                             (unsigned long long)off, w < 0 ? strerror(errno) : "no progress");
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return FSC_OK;
}

/* CRC-32 of n bytes of fd at off, read back in 1 MiB pieces. */
static int crc_back(int fd, uint64_t off, size_t n, uLong *crc, const char *shown, int rank) {
    enum { PIECE = 1 << 20 };
    unsigned char *buf = malloc(n < PIECE ? (n ? n : 1) : PIECE);
    if (!buf) return fsc_error(FSC_ERR_NOMEM, "rank %d: %s: out of memory", rank, shown);
    uLong c = crc32(0L, Z_NULL, 0);
    int rc = FSC_OK;
    while (n > 0 && !rc) {
        ssize_t got = pread(fd, buf, n < PIECE ? n : PIECE, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            rc = fsc_error(FSC_ERR_IO, "rank %d: %s: reading back offset %llu failed: %s", rank,
                           shown, (unsigned long long)off, got < 0 ? strerror(errno) : "end");
        else
            c = crc32(c, buf, (uInt)got), off += (uint64_t)got, n -= (size_t)got;
    }
    free(buf);
    *crc = c;
    return rc;
}

/* Every run of f at its offset in fd (their CRC-32s recorded), then fsync. */
static int write_runs(stage_file *f, int fd, const char *shown, int rank) {
    const unsigned char *p = f->bytes;
    int rc = FSC_OK;
    for (int i = 0; i < f->nruns && !rc; i++) {
        int64_t *r = f->runs + 3 * i;
        rc = pwrite_all(fd, p, (size_t)r[1], (uint64_t)r[0], shown, rank);
        r[2] = (int64_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)r[1]);
        p += r[1];
    }
    if (!rc && fsync(fd) != 0)
        rc = fsc_error(FSC_ERR_IO, "rank %d: %s: fsync failed: %s", rank, shown, strerror(errno));
    return rc;
}

/* Each run of f read back from path against the CRC-32 of the bytes written:
 * every rank checks its own bytes on disk, so the root's commit re-reads
 * nothing (the ranks share the reading, and a write that reported success
 * but did not land is still caught). */
static int check_runs(const stage_file *f, const char *path, int rank) {
    if (!f->nruns) return FSC_OK;
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return fsc_error(FSC_ERR_IO, "rank %d: %s: cannot open to read back: %s", rank, path,
                         strerror(errno));
    int rc = FSC_OK;
    for (int i = 0; i < f->nruns && !rc; i++) {
        const int64_t *r = f->runs + 3 * i;
        uLong got = 0;
        rc = crc_back(fd, (uint64_t)r[0], (size_t)r[1], &got, path, rank);
        if (!rc && got != (uLong)r[2])
            rc = fsc_error(FSC_ERR_IO,
                           "rank %d: %s: the bytes on disk are not the bytes written (CRC-32 "
                           "%08lx read back from the %lld bytes at offset %lld, %08lx written)",
                           rank, path, got, (long long)r[1], (long long)r[0], (unsigned long)r[2]);
    }
    close(fd);
    return rc;
}

/* A one-writer file: temporary, writes, fsync, close, rename, fsync of the directory. */
static int write_whole(stage_file *f, int rank) {
    size_t cap = strlen(f->path) + 64;
    char *prefix = malloc(cap), *tmp = malloc(cap);
    int fd = -1, rc = prefix && tmp ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (!rc) snprintf(prefix, cap, "%s.tmp.%ld.", f->path, (long)getpid());
    if (!rc) rc = fsc_create_unique(prefix, tmp, cap, &fd);
    if (!rc) rc = write_runs(f, fd, tmp, rank);
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = fsc_error(FSC_ERR_IO, "rank %d: %s: close failed: %s", rank, tmp, strerror(errno));
    if (!rc) rc = check_runs(f, tmp, rank);
    if (!rc) f->crc = (uint32_t)f->runs[2];
    if (!rc && rename(tmp, f->path) != 0)
        rc = fsc_error(FSC_ERR_IO, "rank %d: cannot rename %s to %s: %s", rank, tmp, f->path,
                       strerror(errno));
    if (rc && fd >= 0) unlink(tmp);
    if (!rc) rc = fsc_fsync_parent(f->path);
    f->renamed = !rc;
    free(prefix), free(tmp);
    return rc;
}

int ckpt_stage_write(ckpt_stage *s, int rank) {
    int rc = FSC_OK;
    for (int i = 0; i < s->n && !rc; i++) {
        stage_file *f = &s->f[i];
        if (!f->g) {
            rc = write_whole(f, rank);
            continue;
        }
        /* the in-fsc fault the synchronous path has too: the last rank's write fails */
        if (fsc_fault_is(FSC_FAULT_IO_WRITE) && fsc_group_rank(f->g) == fsc_group_size(f->g) - 1)
            rc = fsc_error(FSC_ERR_IO,
                           "rank %d: %s: write failed: simulated I/O error (fault "
                           "io-write)",
                           rank, f->tmp);
        if (rc || !f->nruns) continue;
        int fd = open(f->tmp, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            rc = fsc_error(FSC_ERR_IO, "rank %d: %s: cannot open: %s", rank, f->tmp,
                           strerror(errno));
            break;
        }
        rc = write_runs(f, fd, f->tmp, rank);
        if (close(fd) != 0 && !rc)
            rc = fsc_error(FSC_ERR_IO, "rank %d: %s: close failed: %s", rank, f->tmp,
                           strerror(errno));
        if (!rc) rc = check_runs(f, f->tmp, rank);
    }
    return rc;
}

int ckpt_stage_gather(ckpt_stage *s) {
    int rc = FSC_OK;
    for (int i = 0; i < s->n; i++) {
        stage_file *f = &s->f[i];
        if (!f->g) continue;
        const int world = fsc_group_size(f->g);
        int64_t mine = 3 * (int64_t)f->nruns, *counts = calloc((size_t)world, 2 * sizeof *counts);
        int lrc = counts ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
        lrc = fsc_group_agree(f->g, lrc, "gathering the checksums of the bytes written");
        if (!lrc) lrc = fsc_group_allgather(f->g, &mine, counts, 1, FSC_DTYPE_I64);
        int64_t *displs = counts ? counts + world : NULL, n = 0;
        for (int r = 0; !lrc && r < world; r++) displs[r] = n, n += counts[r];
        f->all = lrc ? NULL : malloc(sizeof *f->all * (size_t)(n ? n : 1));
        if (!lrc && !f->all) lrc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
        lrc = fsc_group_agree(f->g, lrc, "gathering the checksums of the bytes written");
        if (!lrc) lrc = fsc_group_allgatherv(f->g, f->runs, f->all, counts, displs, FSC_DTYPE_I64);
        f->nall = n;
        free(counts);
        if (lrc && !rc) rc = lrc;
    }
    return rc;
}

static int by_run_offset(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The temporary holds exactly the bytes the ranks wrote: its size is the
 * plan's and the runs tile it. Each rank read its own runs back before the
 * agreement (check_runs), so the whole file's CRC-32 is their combination. */
static int verify(stage_file *f) {
    struct stat sb;
    if (stat(f->tmp, &sb) != 0)
        return fsc_error(FSC_ERR_IO, "%s: cannot stat after writing: %s", f->tmp, strerror(errno));
    if ((uint64_t)sb.st_size != f->total)
        return fsc_error(FSC_ERR_IO, "%s: %llu bytes on disk after writing, the plan has %llu",
                         f->tmp, (unsigned long long)sb.st_size, (unsigned long long)f->total);
    qsort(f->all, (size_t)(f->nall / 3), 3 * sizeof *f->all, by_run_offset);
    uLong want = crc32(0L, Z_NULL, 0);
    uint64_t at = 0;
    for (int64_t i = 0; i < f->nall; i += 3) {
        if ((uint64_t)f->all[i] != at)
            return fsc_error(FSC_ERR_IO, "%s: the ranks wrote byte %lld next where %llu was due",
                             f->tmp, (long long)f->all[i], (unsigned long long)at);
        want = crc32_combine(want, (uLong)f->all[i + 2], (z_off_t)f->all[i + 1]);
        at += (uint64_t)f->all[i + 1];
    }
    if (at != f->total)
        return fsc_error(FSC_ERR_IO, "%s: the ranks wrote %llu of its %llu bytes", f->tmp,
                         (unsigned long long)at, (unsigned long long)f->total);
    f->crc = (uint32_t)want;
    return FSC_OK;
}

int ckpt_stage_finish(ckpt_stage *s, fsc_ckpt_writer *w) {
    int rc = FSC_OK;
    for (int i = 0; i < s->n && !rc; i++) {
        stage_file *f = &s->f[i];
        if (!f->is_root) continue;
        if (f->g) rc = verify(f);
        if (!rc && f->g && rename(f->tmp, f->path) != 0)
            rc = fsc_error(FSC_ERR_IO, "cannot rename %s to %s: %s", f->tmp, f->path,
                           strerror(errno));
        if (!rc && f->g) f->renamed = true, rc = fsc_fsync_parent(f->path);
        /* the commit records these instead of reading the file again */
        if (!rc && w && f->renamed) ckpt_writer_known(w, f->path, (int64_t)f->total, f->crc);
    }
    return rc;
}
