/* Parallel safetensors saves: every rank writes its own pieces of one file
 * through collective MPI-IO (see st_parallel.h).
 *
 * The one idea: nothing after the start can make one rank skip a
 * collective its peers are in. Everything that may fail locally (the header,
 * the pieces, the staging buffer) is checked and agreed on before the file
 * is opened; from then on a rank whose conversion or write fails keeps
 * joining every round with zero bytes, and the outcome is agreed on once the
 * file is closed. The MPI-IO calls block, so they run in an io busy scope
 * (io_busy.c): one deadline, FSC_IO_TIMEOUT_S, kept by comm's heartbeat
 * thread, and a slow disk is never taken for a stalled peer by the
 * communication watchdog.
 *
 * io sits on dist (floor 6 over 5): MPI-IO needs the group's communicator
 * and the heartbeat's deadline, both internal to dist, so this file includes
 * dist's internal headers, as io includes core's fault switches.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/fault.h"
#include "comm/heartbeat.h"
#include "io/checkpoint_internal.h"
#include "io/ckpt_stage.h"
#include "io/io_internal.h"
#include "io/st_parallel.h"

enum { DEFAULT_CHUNK = 16 << 20, PATH_WORDS = ST_PATH_WORDS };

static size_t chunk_bytes = DEFAULT_CHUNK;

void st_parallel_set_chunk(size_t bytes) {
    chunk_bytes = bytes ? (bytes + 7) / 8 * 8 : DEFAULT_CHUNK;
}

/* ---- the environment -------------------------------------------------------------- */

int st_parallel_mode(const fsc_group *g, bool *on) {
    int rc = fsc_env_bool("FSC_PARALLEL_IO", on);
    if (fsc_group_size(g) <= 1) *on = false;
    return rc;
}

/* ---- pieces ----------------------------------------------------------------------- */

int st_pieces_add(st_pieces *ps, int tensor, int64_t elem0, int64_t count, const void *src,
                  fsc_dtype src_dtype) {
    if (count == 0) return FSC_OK;
    if (ps->n == ps->cap) {
        int nc = ps->cap ? 2 * ps->cap : 64;
        st_piece *p = realloc(ps->p, (size_t)nc * sizeof *p);
        if (!p) return fsc_error(FSC_ERR_NOMEM, "parallel save: out of memory for the pieces");
        ps->p = p, ps->cap = nc;
    }
    ps->p[ps->n++] = (st_piece){tensor, elem0, count, src, src_dtype};
    return FSC_OK;
}

void st_pieces_free(st_pieces *ps) {
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

/* First byte of rank r's even share of D bytes (no overflow for any world). */
static uint64_t share_start(uint64_t D, int r, int world) {
    uint64_t base = D / (uint64_t)world, rem = D % (uint64_t)world;
    return base * (uint64_t)r + ((uint64_t)r < rem ? (uint64_t)r : rem);
}

/* Elements of a tensor at [b, b + n) whose first byte lies before x. */
static int64_t elems_before(uint64_t x, uint64_t b, uint64_t n, uint64_t es) {
    if (x <= b) return 0;
    if (x >= b + n) return (int64_t)(n / es);
    return (int64_t)((x - b + es - 1) / es);
}

void st_plan_tile(const fsc_st_writer *plan, int i, int rank, int world, int64_t *e0, int64_t *e1) {
    fsc_dtype dt;
    uint64_t b, n, D = st_plan_data_bytes(plan);
    st_plan_tensor(plan, i, &dt, &b, &n);
    *e0 = elems_before(share_start(D, rank, world), b, n, fsc_dtype_size(dt));
    *e1 = elems_before(share_start(D, rank + 1, world), b, n, fsc_dtype_size(dt));
}

/* ---- rounds: pieces in file order, packed into the staging buffer ---------------- */

typedef struct job {
    fsc_st_writer *plan;
    const char *path;
    uint64_t hdr; /* header bytes: data offsets start here */
    st_piece *p;  /* this rank's pieces, sorted by file offset */
    int n;
    char *stage;
    size_t cap;
    int64_t *runs; /* (offset, bytes, CRC-32) of each round this rank wrote */
    int nruns;
} job;

static uint64_t piece_offset(const job *j, const st_piece *p, size_t *es) {
    fsc_dtype dt;
    uint64_t b, n;
    st_plan_tensor(j->plan, p->tensor, &dt, &b, &n);
    *es = fsc_dtype_size(dt);
    return j->hdr + b + (uint64_t)p->elem0 * *es;
}

static fsc_dtype file_dtype(const job *j, const st_piece *p) {
    fsc_dtype dt;
    uint64_t b, n;
    st_plan_tensor(j->plan, p->tensor, &dt, &b, &n);
    return dt;
}

static const fsc_st_writer *sort_plan; /* qsort has no user pointer */

static int by_offset(const void *a, const void *b) {
    const st_piece *x = a, *y = b;
    fsc_dtype d;
    uint64_t bx, by, n;
    st_plan_tensor(sort_plan, x->tensor, &d, &bx, &n);
    bx += (uint64_t)x->elem0 * fsc_dtype_size(d);
    st_plan_tensor(sort_plan, y->tensor, &d, &by, &n);
    by += (uint64_t)y->elem0 * fsc_dtype_size(d);
    return bx < by ? -1 : bx > by;
}

/* Where the next round starts: piece k, element `done` of it. */
typedef struct cursor {
    int k;
    int64_t done;
} cursor;

/* The next round: a run of bytes contiguous in the file, at most cap, from
 * the cursor on. Converts into j->stage when fill; *n = 0 when none is left.
 * Counting (fill false) and writing take the very same rounds. */
static int next_round(const job *j, cursor *c, bool fill, uint64_t *off, size_t *n) {
    *n = 0;
    uint64_t end = 0;
    while (c->k < j->n) {
        const st_piece *p = &j->p[c->k];
        size_t es;
        uint64_t at = piece_offset(j, p, &es) + (uint64_t)c->done * es;
        if (*n && at != end) break; /* a gap in the file: the next round */
        int64_t room = (int64_t)((j->cap - *n) / es), m = p->count - c->done;
        if (m > room) m = room;
        if (m <= 0) break;
        if (!*n) *off = at;
        if (fill) {
            size_t ss = fsc_dtype_size(p->src_dtype);
            fsc_tensor s = fsc_tensor_1d((char *)p->src + (size_t)c->done * ss, p->src_dtype, m);
            fsc_tensor d = fsc_tensor_1d(j->stage + *n, file_dtype(j, p), m);
            int rc = p->src_dtype == d.dtype ? (memcpy(d.data, s.data, (size_t)m * es), FSC_OK)
                                             : fsc_tensor_convert(&s, &d);
            if (rc) return rc;
        }
        *n += (size_t)m * es;
        end = at + (uint64_t)m * es;
        c->done += m;
        if (c->done == p->count) c->k++, c->done = 0;
    }
    return FSC_OK;
}

static bool convertible(fsc_dtype a, fsc_dtype b) {
    bool ha = a == FSC_DTYPE_BF16 || a == FSC_DTYPE_F16,
         hb = b == FSC_DTYPE_BF16 || b == FSC_DTYPE_F16;
    return a == b || (a == FSC_DTYPE_F32 && hb) || (b == FSC_DTYPE_F32 && ha);
}

/* Checks this rank's pieces against the plan, sorts them by file offset,
 * and counts its rounds and bytes; allocates the staging buffer. */
static int prepare(job *j, const st_pieces *in, int64_t *rounds, int64_t *bytes) {
    *rounds = *bytes = 0;
    if (in->n && !(j->p = malloc((size_t)in->n * sizeof *j->p)))
        return fsc_error(FSC_ERR_NOMEM, "%s: out of memory for the pieces", j->path);
    j->n = in->n;
    if (in->n) memcpy(j->p, in->p, (size_t)in->n * sizeof *j->p);
    const int nt = st_plan_count(j->plan);
    uint64_t total = 0;
    for (int k = 0; k < j->n; k++) {
        const st_piece *p = &j->p[k];
        fsc_dtype dt;
        uint64_t b, nb;
        if (p->tensor < 0 || p->tensor >= nt)
            return fsc_error(FSC_ERR_INVALID, "%s: piece of tensor #%d; the file has %d", j->path,
                             p->tensor, nt);
        st_plan_tensor(j->plan, p->tensor, &dt, &b, &nb);
        const char *name = st_plan_name(j->plan, p->tensor);
        if (p->elem0 < 0 || p->count < 0 ||
            (uint64_t)(p->elem0 + p->count) > nb / fsc_dtype_size(dt))
            return fsc_error(FSC_ERR_SHAPE,
                             "%s: tensor %s: piece [%lld, +%lld) outside its %llu elements",
                             j->path, name, (long long)p->elem0, (long long)p->count,
                             (unsigned long long)(nb / fsc_dtype_size(dt)));
        if (!p->src || !convertible(p->src_dtype, dt))
            return fsc_error(FSC_ERR_DTYPE, "%s: tensor %s (%s): piece without data or of dtype %s",
                             j->path, name, fsc_dtype_name(dt), fsc_dtype_name(p->src_dtype));
        total += (uint64_t)p->count * fsc_dtype_size(dt);
    }
    sort_plan = j->plan;
    if (j->n) qsort(j->p, (size_t)j->n, sizeof *j->p, by_offset);
    for (int k = 1; k < j->n; k++) {
        size_t ea, eb;
        uint64_t a = piece_offset(j, &j->p[k - 1], &ea), b = piece_offset(j, &j->p[k], &eb);
        if (a + (uint64_t)j->p[k - 1].count * ea > b)
            return fsc_error(FSC_ERR_INVALID, "%s: pieces of %s and %s overlap", j->path,
                             st_plan_name(j->plan, j->p[k - 1].tensor),
                             st_plan_name(j->plan, j->p[k].tensor));
    }
    j->cap = total < chunk_bytes ? (size_t)(total + 7) / 8 * 8 : chunk_bytes;
    if (total && !(j->stage = fsc_mem_alloc(FSC_MEM_WORK, j->cap)))
        return fsc_error_context(FSC_ERR_NOMEM, "%s: staging %zu bytes: ", j->path, j->cap);
    cursor c = {0, 0};
    for (;;) {
        uint64_t off;
        size_t n;
        next_round(j, &c, false, &off, &n);
        if (!n) break;
        ++*rounds;
    }
    *bytes = (int64_t)total;
    return FSC_OK;
}

/* ---- errors ---------------------------------------------------------------------- */

static int mpi_error(int rc, const char *what, const char *path) {
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len] = '\0';
    return fsc_error(FSC_ERR_IO, "%s: %s failed: %s (MPI error %d)", path, what, len ? text : "?",
                     rc);
}

/* A write call's status: MPI's error, or fewer bytes than asked. Open MPI
 * 4.1's posix fbtl returns MPI_SUCCESS with a count of 0 when pwritev fails
 * (EIO, ENOSPC), so the count is the only sign of a torn file. */
static int write_status(int mrc, const MPI_Status *st, size_t want, const char *what,
                        const char *path, uint64_t off) {
    if (mrc) return mpi_error(mrc, what, path);
    int got = 0;
    if (MPI_Get_count(st, MPI_BYTE, &got) != MPI_SUCCESS || got == MPI_UNDEFINED) got = -1;
    if ((size_t)got == want || (want == 0 && got <= 0)) return FSC_OK;
    return fsc_error(FSC_ERR_IO,
                     "%s: %s wrote %d of %zu bytes at offset %llu (a failed or short write: "
                     "disk full or an I/O error?)",
                     path, what, got, want, (unsigned long long)off);
}

/* The temporary's size once closed: exactly the plan's, or the file is torn. */
static int check_size(const char *tmp, uint64_t want) {
    struct stat sb;
    if (stat(tmp, &sb) != 0)
        return fsc_error(FSC_ERR_IO, "%s: cannot stat after writing: %s", tmp, strerror(errno));
    if ((uint64_t)sb.st_size != want)
        return fsc_error(FSC_ERR_IO, "%s: %llu bytes on disk after writing, the plan has %llu", tmp,
                         (unsigned long long)sb.st_size, (unsigned long long)want);
    return FSC_OK;
}

static int by_run_offset(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The file's CRC-32 from the bytes every rank handed MPI (the header, then
 * each rank's runs in file order, joined with crc32_combine) against a
 * re-read of what is on disk: a write that MPI reported whole but that did
 * not land (a lost or garbled write of the right size) fails the save here.
 * Collective; the verdict is the root's. */
static int verify_written(fsc_group *g, const job *j, const char *tmp, bool is_root,
                          const unsigned char *hdr, size_t hlen, uint64_t total) {
    const int world = fsc_group_size(g);
    int64_t mine = 3 * (int64_t)j->nruns, *counts = calloc((size_t)world, 2 * sizeof *counts);
    int rc = counts ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "%s: out of memory", tmp);
    rc = fsc_group_agree(g, rc, "checking the bytes written");
    if (!rc) rc = fsc_group_allgather(g, &mine, counts, 1, FSC_DTYPE_I64);
    int64_t *displs = counts ? counts + world : NULL, all = 0;
    for (int r = 0; !rc && r < world; r++) displs[r] = all, all += counts[r];
    int64_t *runs = rc ? NULL : malloc(sizeof *runs * (size_t)(all ? all : 1));
    if (!rc && !runs) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", tmp);
    rc = fsc_group_agree(g, rc, "checking the bytes written");
    if (!rc) rc = fsc_group_allgatherv(g, j->runs, runs, counts, displs, FSC_DTYPE_I64);
    if (!rc && is_root) rc = check_size(tmp, total);
    if (!rc && is_root) {
        qsort(runs, (size_t)(all / 3), 3 * sizeof *runs, by_run_offset);
        uLong want = crc32(crc32(0L, Z_NULL, 0), hdr, (uInt)hlen);
        uint64_t at = hlen;
        for (int64_t i = 0; !rc && i < all; i += 3) {
            if ((uint64_t)runs[i] != at)
                rc = fsc_error(FSC_ERR_IO, "%s: the ranks wrote byte %lld next where %llu was due",
                               tmp, (long long)runs[i], (unsigned long long)at);
            want = crc32_combine(want, (uLong)runs[i + 2], (z_off_t)runs[i + 1]);
            at += (uint64_t)runs[i + 1];
        }
        if (!rc && at != total)
            rc = fsc_error(FSC_ERR_IO, "%s: the ranks wrote %llu of its %llu bytes", tmp,
                           (unsigned long long)at, (unsigned long long)total);
        uint32_t got;
        int64_t size;
        if (!rc) rc = ckpt_file_crc(tmp, &got, &size);
        if (!rc && (got != (uint32_t)want || (uint64_t)size != total))
            rc = fsc_error(FSC_ERR_IO,
                           "%s: the bytes on disk are not the bytes written (CRC-32 %08x of "
                           "%lld bytes read back, %08lx of %llu written)",
                           tmp, got, (long long)size, want, (unsigned long long)total);
    }
    free(runs);
    free(counts);
    return rc;
}

/* ---- the save --------------------------------------------------------------------- */

/* The root's temporary beside path (created empty, O_EXCL: its name is ours). */
static int make_temporary(const char *path, char *tmp, size_t cap) {
    if (!path || !*path) return fsc_error(FSC_ERR_INVALID, "parallel save: output path is empty");
    char prefix[PATH_WORDS * 4];
    if ((size_t)snprintf(prefix, sizeof prefix, "%s.tmp.%ld.", path, (long)getpid()) + 13 > cap)
        return fsc_error(FSC_ERR_INVALID, "%s: path too long for a parallel save", path);
    int fd;
    int rc = fsc_create_unique(prefix, tmp, cap, &fd);
    if (rc) return fsc_error_context(rc, "%s: cannot create its temporary: ", path);
    close(fd);
    return FSC_OK;
}

int st_parallel_names(fsc_group *g, int root, const char *path, fsc_st_writer *plan, int status,
                      int32_t names[2 * ST_PATH_WORDS], int *rc) {
    const bool is_root = fsc_group_rank(g) == root;
    memset(names, 0, 2 * ST_PATH_WORDS * sizeof *names);
    char *rpath = (char *)names, *tmp = (char *)(names + PATH_WORDS);
    *rc = status    ? status
          : !plan   ? fsc_error(FSC_ERR_INVALID, "parallel save: no plan")
          : is_root ? make_temporary(path, tmp, PATH_WORDS * 4)
                    : FSC_OK;
    const bool made = is_root && !*rc;
    if (made) snprintf(rpath, PATH_WORDS * 4, "%s", path);
    int brc = fsc_group_broadcast(g, names, 2 * PATH_WORDS, FSC_DTYPE_I32, root);
    if (brc) {
        if (made) unlink(tmp);
        fsc_st_writer_abort(plan);
        return fsc_error_context(brc, "parallel save %s: ", is_root && path ? path : "");
    }
    rpath[PATH_WORDS * 4 - 1] = tmp[PATH_WORDS * 4 - 1] = '\0';
    return FSC_OK;
}

/* The collective MPI-IO part: open, header, rounds, sync, close. Returns this
 * rank's status; *opened false when the open failed somewhere. */
static int write_file(fsc_group *g, job *j, const char *tmp, bool is_root, const unsigned char *hdr,
                      size_t hlen, int64_t rounds) {
    MPI_File fh;
    int mrc = MPI_File_open(g->ctrl, tmp, MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
    int rc = mrc ? mpi_error(mrc, "MPI_File_open", tmp) : FSC_OK;
    rc = fsc_group_agree(g, rc, "opening the file");
    if (rc) {
        /* closing is collective over every opener: a handle opened here while
         * a peer's open failed cannot be closed, so it is left to MPI_Finalize */
        if (!mrc) fsc_log(FSC_LOG_WARN, "%s: left open after a peer's open failed", tmp);
        return rc;
    }
    MPI_Status st;
    if (is_root) {
        mrc = MPI_File_write_at(fh, 0, hdr, (int)hlen, MPI_BYTE, &st);
        rc = write_status(mrc, &st, hlen, "MPI_File_write_at(header)", tmp, 0);
    }
    if (!rc && fsc_fault_is(FSC_FAULT_IO_WRITE) && fsc_group_rank(g) == fsc_group_size(g) - 1)
        rc = fsc_error(FSC_ERR_IO, "%s: write failed: simulated I/O error (fault io-write)", tmp);
    cursor c = {0, 0};
    for (int64_t r = 0; r < rounds; r++) {
        uint64_t off = 0;
        size_t n = 0;
        if (!rc) rc = next_round(j, &c, true, &off, &n);
        if (rc) n = 0; /* a failed rank still joins every round, writing nothing */
        mrc = MPI_File_write_at_all(fh, (MPI_Offset)off, j->stage, (int)n, MPI_BYTE, &st);
        const int wrc = write_status(mrc, &st, n, "MPI_File_write_at_all", tmp, off);
        if (wrc && !rc) rc = wrc;
        if (!rc && n) {
            int64_t *run = j->runs + 3 * j->nruns++;
            run[0] = (int64_t)off, run[1] = (int64_t)n;
            run[2] = (int64_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)j->stage, (uInt)n);
        }
    }
    if ((mrc = MPI_File_sync(fh)) && !rc) rc = mpi_error(mrc, "MPI_File_sync", tmp);
    if ((mrc = MPI_File_close(&fh)) && !rc) rc = mpi_error(mrc, "MPI_File_close", tmp);
    return rc;
}

int st_parallel_save(fsc_group *g, int root, const char *path, fsc_st_writer *plan,
                     const st_pieces *pieces, int status) {
    /* an asynchronous save keeps the pieces, written later (checkpoint_stage.c) */
    if (ckpt_stage_current()) return ckpt_stage_parallel(g, root, path, plan, pieces, status);
    const int me = fsc_group_rank(g), world = fsc_group_size(g);
    const bool is_root = me == root;
    int32_t names[2 * PATH_WORDS]; /* root's path, then its temporary */
    char *rpath = (char *)names, *tmp = (char *)(names + PATH_WORDS);
    int rc, crc = st_parallel_names(g, root, path, plan, status, names, &rc);
    if (crc) return crc;
    const bool made = is_root && !rc;
    job j = {.plan = plan, .path = rpath[0] ? rpath : "(the root's path)"};
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    int64_t mine[3] = {0}, *all = calloc(3 * (size_t)world, sizeof *all);
    if (!rc) rc = st_plan_header(plan, &hdr, &hlen);
    j.hdr = hlen;
    if (!rc) rc = prepare(&j, pieces, &mine[1], &mine[2]);
    if (!rc && !all) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", j.path);
    /* one collective: statuses, rounds and bytes of every rank */
    rc = fsc_group_agree(g, rc, "preparing the parallel save");
    int64_t rounds = 0, covered = 0;
    if (!rc) rc = fsc_group_allgather(g, mine, all, 3, FSC_DTYPE_I64);
    for (int r = 0; !rc && r < world; r++) {
        rounds = all[3 * r + 1] > rounds ? all[3 * r + 1] : rounds;
        covered += all[3 * r + 2];
    }
    if (!rc && (uint64_t)covered != st_plan_data_bytes(plan))
        rc = fsc_error(FSC_ERR_INVALID,
                       "%s: the ranks' pieces hold %lld of its %llu data bytes (a gap or an "
                       "overlap between ranks); nothing written",
                       j.path, (long long)covered, (unsigned long long)st_plan_data_bytes(plan));
    if (!rc) {
        char what[160]; /* what peers and the deadline's message show */
        snprintf(what, sizeof what, "the MPI-IO save of %.100s", j.path);
        rc = fsc_io_busy_begin(what);
        const bool busy = !rc;
        if (!rc) j.runs = malloc(sizeof *j.runs * 3 * (size_t)(rounds ? rounds : 1));
        if (!rc && !j.runs) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", j.path);
        rc = fsc_group_agree(g, rc, "preparing the parallel save");
        if (!rc) rc = write_file(g, &j, tmp, is_root, hdr, hlen, rounds);
        const uint64_t total = hlen + st_plan_data_bytes(plan);
        rc = fsc_group_agree(g, rc, "writing its part");
        if (!rc) rc = verify_written(g, &j, tmp, is_root, hdr, hlen, total);
        rc = fsc_group_agree(g, rc, "checking the file written");
        if (is_root && !rc && rename(tmp, rpath) != 0)
            rc = fsc_error(FSC_ERR_IO, "cannot rename %s to %s: %s", tmp, rpath, strerror(errno));
        if (is_root && !rc) rc = fsc_fsync_parent(rpath);
        if (busy) fsc_io_busy_end();
        rc = fsc_group_agree(g, rc, "committing the file");
    }
    if (made && rc) unlink(tmp);
    free(all);
    free(hdr);
    free(j.p);
    free(j.runs);
    fsc_mem_free(j.stage);
    fsc_st_writer_abort(plan);
    return rc;
}
