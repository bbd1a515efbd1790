/* OSS (ZeRO stage 1, like fairscale.optim.OSS): every rank runs the ordinary
 * optimizer over the part of the flat parameter buffer it owns, so optimizer
 * state per rank is K x (owned elements), exactly; after the step the owners
 * share their updated parameters so every rank again holds the full model.
 *
 * Sharing costs one collective per owner (GREEDY: a broadcast of the owner's
 * tensors, in place when they form one run of the flat buffer, packed
 * otherwise) or one in total (EVEN: an in-place allgather of the shards over
 * the flat buffer; shards past its end are cut, so the padding to
 * world * shard is never materialised). With a half-precision share_dtype
 * every rank, the owner included, takes the rounded values, so the replicas
 * never diverge: the owner's fp32 update is rounded exactly as its peers see
 * it (FairScale's broadcast_fp16 leaves the owner unrounded; we prefer
 * bit-identical replicas). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "oss_internal.h"
#include "parallel/shard/sharded_internal.h"

void fsc_oss_free(fsc_oss *o) {
    if (!o) return;
    fsc_optim_free(o->local);
    fsc_optim_ranges_free(o->ranges);
    fsc_partition_free(o->part);
    fsc_mem_free(o->comm);
    free(o->counts);
    free(o->lo);
    free(o->contiguous);
    free(o);
}

static bool is_frozen(const fsc_oss *o, const fsc_shard_range *s) {
    return o->ps->entries[s->entry].param->frozen;
}

/* Flat span of rank r's trainable ranges (frozen tensors never change, so
 * they are never shared), their elements, and whether nothing else (another
 * rank's tensor, a frozen one) lies in the span. */
static void greedy_spans(fsc_oss *o) {
    const fsc_partition *p = o->part;
    for (int r = 0; r < o->world; r++) {
        o->lo[r] = o->hi[r] = o->moved[r] = 0;
        o->contiguous[r] = true;
        for (int k = 0; k < p->nranges[r]; k++) {
            const fsc_shard_range *a = &p->ranges[r][k];
            if (is_frozen(o, a)) continue;
            const int64_t lo = o->ps->entries[a->entry].offset + a->begin;
            if (!o->moved[r]) o->lo[r] = lo;
            o->hi[r] = lo + a->count;
            o->moved[r] += a->count;
        }
    }
    for (int r = 0; r < o->world; r++)
        for (int q = 0; q < o->world && o->contiguous[r]; q++)
            for (int k = 0; k < p->nranges[q]; k++) {
                if (q == r && !is_frozen(o, &p->ranges[q][k])) continue;
                int64_t at = o->ps->entries[p->ranges[q][k].entry].offset + p->ranges[q][k].begin;
                if (at >= o->lo[r] && at < o->hi[r]) {
                    o->contiguous[r] = false;
                    break;
                }
            }
}

/* Sets up what sharing needs: EVEN's allgather layout, GREEDY's spans, and
 * the communication buffer (only for packing or half precision). */
static int plan_sharing(fsc_oss *o) {
    const fsc_partition *p = o->part;
    const int64_t numel = o->ps->numel;
    const size_t esz = fsc_dtype_size(o->opt.share_dtype);
    size_t comm = 0;
    if (p->policy == FSC_PARTITION_EVEN) {
        o->counts = malloc(2 * (size_t)o->world * sizeof *o->counts);
        if (!o->counts) return fsc_error(FSC_ERR_NOMEM, "oss: out of memory");
        o->displs = o->counts + o->world;
        for (int r = 0; r < o->world; r++) {
            int64_t d = (int64_t)r * p->shard, c = numel - d;
            o->displs[r] = d < numel ? d : numel;
            o->counts[r] = c < 0 ? 0 : c > p->shard ? p->shard : c;
        }
        if (o->opt.share_dtype != FSC_DTYPE_F32) comm = (size_t)numel * esz;
    } else {
        o->lo = malloc(3 * (size_t)o->world * sizeof *o->lo);
        o->contiguous = malloc((size_t)o->world * sizeof *o->contiguous);
        if (!o->lo || !o->contiguous) return fsc_error(FSC_ERR_NOMEM, "oss: out of memory");
        o->hi = o->lo + o->world, o->moved = o->hi + o->world;
        greedy_spans(o);
        for (int r = 0; r < o->world; r++)
            if (o->opt.share_dtype != FSC_DTYPE_F32 || !o->contiguous[r])
                if ((size_t)o->moved[r] * esz > comm) comm = (size_t)o->moved[r] * esz;
    }
    if (comm > 0 && !(o->comm = fsc_mem_alloc(FSC_MEM_COMM, comm)))
        return fsc_error_context(FSC_ERR_NOMEM, "oss: parameter-sharing buffer: ");
    return FSC_OK;
}

fsc_oss *fsc_oss_new(const fsc_optim_config *cfg, fsc_params *ps, fsc_group *g,
                     const fsc_oss_options *opt) {
    fsc_oss_options op = opt ? *opt : (fsc_oss_options){0};
    if (!ps || !g) {
        fsc_error(FSC_ERR_INVALID, "oss: %s must not be NULL", ps ? "group" : "params");
        return NULL;
    }
    if (!ps->data || !ps->grad) {
        fsc_error(FSC_ERR_INVALID, "oss: the parameters have no flat %s buffer (bind with grads)",
                  ps->data ? "gradient" : "parameter");
        return NULL;
    }
    if (op.share_dtype != FSC_DTYPE_F32 && op.share_dtype != FSC_DTYPE_BF16 &&
        op.share_dtype != FSC_DTYPE_F16) {
        fsc_error(FSC_ERR_DTYPE, "oss: share_dtype %d must be F32, BF16 or F16",
                  (int)op.share_dtype);
        return NULL;
    }
    fsc_oss *o = calloc(1, sizeof *o);
    if (!o) {
        fsc_error(FSC_ERR_NOMEM, "oss: out of memory");
        return NULL;
    }
    o->opt = op;
    o->ps = ps;
    o->g = g;
    o->rank = fsc_group_rank(g);
    o->world = fsc_group_size(g);
    int rc = fsc_optim_config_resolve(cfg, &o->cfg);
    if (!rc) o->K = fsc_optim_state_count(&o->cfg);
    if (!rc) rc = fsc_partition_new(ps, o->world, op.policy, 0, &o->part);
    if (!rc) rc = fsc_partition_ranges(o->part, ps, o->rank, &o->ranges, &o->nranges);
    if (!rc && !(o->local = fsc_optim_new(&o->cfg, o->ranges, o->nranges))) rc = FSC_ERR_INVALID;
    if (!rc) rc = plan_sharing(o);
    if (rc) {
        fsc_error_context(rc, "oss (rank %d of %d, group %s): ", o->rank, o->world,
                          fsc_group_name(g));
        fsc_oss_free(o);
        return NULL;
    }
    return o;
}

/* ---- sharing updated parameters ------------------------------------------- */
static int f32_to_share(const float *src, void *dst, int64_t n, fsc_dtype dt) {
    fsc_tensor s = fsc_tensor_1d((void *)src, FSC_DTYPE_F32, n), d = fsc_tensor_1d(dst, dt, n);
    return fsc_tensor_convert(&s, &d);
}

static int share_to_f32(const void *src, float *dst, int64_t n, fsc_dtype dt) {
    fsc_tensor s = fsc_tensor_1d((void *)src, dt, n), d = fsc_tensor_1d(dst, FSC_DTYPE_F32, n);
    return fsc_tensor_convert(&s, &d);
}

static int share_even(fsc_oss *o) {
    const fsc_dtype dt = o->opt.share_dtype;
    float *data = o->ps->data;
    const int64_t me = o->displs[o->rank], n = o->counts[o->rank];
    const int64_t *displs = o->displs;
    int64_t *shifted = NULL; /* test-only fault: every shard but the first lands one early */
    if (fsc_fault_is(FSC_FAULT_SHARD_OFFSET) && (shifted = malloc(sizeof(int64_t) * o->world))) {
        for (int r = 0; r < o->world; r++) shifted[r] = o->displs[r] - (o->displs[r] > 0);
        displs = shifted;
    }
    int rc;
    if (dt == FSC_DTYPE_F32) {
        rc = fsc_group_allgatherv(o->g, data + me, data, o->counts, displs, FSC_DTYPE_F32);
    } else {
        const size_t esz = fsc_dtype_size(dt);
        char *buf = o->comm;
        rc = f32_to_share(data + me, buf + (size_t)me * esz, n, dt);
        if (!rc)
            rc = fsc_group_allgatherv(o->g, buf + (size_t)me * esz, buf, o->counts, displs, dt);
        if (!rc) rc = share_to_f32(buf, data, o->ps->numel, dt);
    }
    free(shifted);
    return rc;
}

/* Copies rank r's ranges between the flat buffer and the packed buffer (as
 * dt: F32 or half), in range order. */
static int pack(fsc_oss *o, int r, bool into_buf) {
    const fsc_partition *p = o->part;
    const fsc_dtype dt = o->opt.share_dtype;
    const size_t esz = fsc_dtype_size(dt);
    char *buf = o->comm;
    int64_t at = 0;
    for (int k = 0; k < p->nranges[r]; k++) {
        const fsc_shard_range *s = &p->ranges[r][k];
        if (is_frozen(o, s)) continue;
        float *x = o->ps->data + o->ps->entries[s->entry].offset + s->begin;
        /* test-only fault: peers unpack the owner's first range one element early */
        if (!into_buf && at == 0 && r != o->rank && fsc_fault_is(FSC_FAULT_SHARD_OFFSET) &&
            x > o->ps->data)
            x--;
        int rc = into_buf ? f32_to_share(x, buf + (size_t)at * esz, s->count, dt)
                          : share_to_f32(buf + (size_t)at * esz, x, s->count, dt);
        if (rc) return rc;
        at += s->count;
    }
    return FSC_OK;
}

static int share_greedy(fsc_oss *o) {
    const fsc_dtype dt = o->opt.share_dtype;
    for (int r = 0; r < o->world; r++) {
        int64_t n = o->moved[r];
        if (n == 0) continue; /* every rank knows r updates nothing */
        int rc;
        if (dt == FSC_DTYPE_F32 && o->contiguous[r]) {
            /* test-only fault: peers place every shard but the first one early */
            int64_t lo =
                o->lo[r] - (fsc_fault_is(FSC_FAULT_SHARD_OFFSET) && r != o->rank && o->lo[r] > 0);
            rc = fsc_group_broadcast(o->g, o->ps->data + lo, o->hi[r] - o->lo[r], FSC_DTYPE_F32, r);
        } else {
            rc = r == o->rank ? pack(o, r, true) : FSC_OK;
            if (!rc) rc = fsc_group_broadcast(o->g, o->comm, n, dt, r);
            /* the owner unpacks too: it takes the rounded values its peers take */
            if (!rc && (r != o->rank || dt != FSC_DTYPE_F32)) rc = pack(o, r, false);
        }
        if (rc) return fsc_error_context(rc, "oss: sharing rank %d's parameters: ", r);
    }
    return FSC_OK;
}

int fsc_oss_step(fsc_oss *o) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "oss step: o must not be NULL");
    int rc = fsc_optim_step(o->local);
    if (rc) return fsc_error_context(rc, "oss step (rank %d): ", o->rank);
    rc = o->part->policy == FSC_PARTITION_EVEN ? share_even(o) : share_greedy(o);
    return rc ? fsc_error_context(rc, "oss step: ") : FSC_OK;
}

int fsc_oss_set_lr(fsc_oss *o, double lr) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "oss set_lr: o must not be NULL");
    return fsc_optim_set_lr(o->local, lr);
}

/* ---- clipping ---------------------------------------------------------------- */
int fsc_oss_clip_grad_norm(fsc_oss *o, float max_norm, bool inf_norm, float *total) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "oss clip: o must not be NULL");
    return sharded_clip_grad_norm(o->g, o->ranges, o->nranges, max_norm, inf_norm, total,
                                  "oss clip");
}

/* ---- optimizer state by name --------------------------------------------------- */
static optim_shards state_view(fsc_oss *o, const char *who) {
    return (optim_shards){.ps = o->ps,
                          .part = o->part,
                          .local = o->local,
                          .g = o->g,
                          .policy = o->part->policy == FSC_PARTITION_EVEN ? "even" : "greedy",
                          .who = who,
                          .io = o->g};
}

int fsc_oss_save_optim(fsc_oss *o, const char *path, int root) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "oss save_optim: o must not be NULL");
    optim_shards v = state_view(o, "oss save_optim");
    return optim_shards_save(&v, path, root);
}

int fsc_oss_save_optim_replicated(fsc_oss *o, fsc_group *g, const char *path, int root) {
    if (!o || !g)
        return fsc_error(FSC_ERR_INVALID, "oss save_optim_replicated: o and g must not be NULL");
    if (fsc_group_size(o->g) != 1)
        return fsc_error(FSC_ERR_INVALID,
                         "oss save_optim_replicated: the state is sharded over %d ranks (use "
                         "fsc_oss_save_optim)",
                         fsc_group_size(o->g));
    optim_shards v = state_view(o, "oss save_optim");
    v.io = g;
    return optim_shards_save(&v, path, root);
}

int fsc_oss_load_optim(fsc_oss *o, const char *path) {
    if (!o) return fsc_error(FSC_ERR_INVALID, "oss load_optim: o must not be NULL");
    optim_shards v = state_view(o, "oss load_optim");
    return optim_shards_load(&v, path);
}

/* ---- accessors ----------------------------------------------------------------- */
size_t fsc_oss_state_bytes(const fsc_oss *o) {
    return o ? fsc_optim_state_bytes(o->local) : 0;
}

const fsc_partition *fsc_oss_partition(const fsc_oss *o) {
    return o ? o->part : NULL;
}

fsc_group *fsc_oss_group(const fsc_oss *o) {
    return o->g;
}

fsc_optim *fsc_oss_local(fsc_oss *o) {
    return o ? o->local : NULL;
}
