/* The hsdp row: hybrid sharding (PyTorch's HYBRID_SHARD, DeepSpeed's
 * MiCS). The data-parallel group of R ranks is cut into R / N shard groups
 * of N consecutive ranks; each shard group runs FSDP (ZeRO-3) over itself,
 * and the groups are replicas of one another. Rank r's peers across groups
 * (the replica group: every rank with the same r mod N) own the same shard.
 *
 * The one idea: a step's gradient travels twice. The reduce-scatter within
 * the shard group sums the group's ranks into each shard (FSDP's own,
 * overlapped with backward); then one all-reduce over the replica group sums
 * the shards across groups, so every copy of a shard holds the gradient of
 * the whole global batch (losses are normalised by the global batch, decision
 * 12), and the identical optimizer steps keep the replicas identical. Only
 * that all-reduce crosses groups: 2 (G - 1) / G x the shard's bytes per rank
 * and step, G = R / N, where FSDP over all R ranks moves every gather and
 * reduce-scatter across them. Parameters are gathered within the group only.
 *
 * The groups are splits of the data-parallel group (fsc_group_split), not
 * mesh dimensions: the mesh (src/comm/mesh.c) lays out dp x pp x tp and
 * hsdp divides its dp line (docs/architecture.md, floor 8). Files are the
 * fsdp row's, written by the first shard group alone: a checkpoint resumes
 * under any strategy and world size, and any checkpoint resumes here. */
#include <stdlib.h>
#include <string.h>

#include "strategy_internal.h"

struct hsdp_state {
    fsc_group *shard, *replica; /* N ranks of one group; the G owners of this shard */
    bool last_micro;            /* the micro-step being run is the step's last */
    float *stage;               /* the shard's gradient pieces, packed (FSC_MEM_COMM) */
    int64_t owned;              /* floats in stage */
    int64_t allreduces;
    double wait_s;
};

static int setup(fsc_strategy *s, const fsc_optim_config *optim) {
    const int N = s->opt.shard_group, R = s->world;
    if (N < 1 || R % N)
        return fsc_error(FSC_ERR_INVALID,
                         "shard_group %d must be >= 1 and divide the data-parallel group's "
                         "%d ranks (it is the ranks each FSDP group shards over)",
                         N, R);
    struct hsdp_state *h = s->hsdp = calloc(1, sizeof *h);
    if (!h) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    int rc = fsc_group_split(s->group, s->rank / N, s->rank, "hsdp.shard", &h->shard);
    if (!rc) rc = fsc_group_split(s->group, s->rank % N, s->rank, "hsdp.replica", &h->replica);
    if (rc) return fsc_error_context(rc, "splitting the data-parallel group: ");
    /* the fsdp row sets up over the shard group; the data-parallel group
     * stays the strategy's (the trainer's data order and loss normaliser) */
    fsc_group *dp = s->group;
    s->group = h->shard;
    rc = fsc_strategy_fsdp.setup(s, optim);
    s->group = dp;
    if (rc) return rc;
    s->shard_ranks = N;
    int n;
    const fsc_optim_range *r = fsc_fsdp_ranges(s->fsdp, &n);
    for (int i = 0; i < n; i++) h->owned += r[i].n;
    h->stage = fsc_mem_alloc(FSC_MEM_COMM, sizeof(float) * (size_t)(h->owned + 1));
    if (!h->stage)
        return fsc_error(FSC_ERR_NOMEM, "staging %lld floats: out of memory", (long long)h->owned);
    return FSC_OK;
}

static void teardown(fsc_strategy *s) {
    struct hsdp_state *h = s->hsdp;
    fsc_fsdp_free(s->fsdp); /* its requests done before its group goes */
    if (!h) return;
    fsc_mem_free(h->stage);
    fsc_group_free(h->replica);
    fsc_group_free(h->shard);
    free(h);
}

static void set_no_sync(fsc_strategy *s, bool no_sync) {
    s->hsdp->last_micro = !no_sync;
    fsc_strategy_fsdp.set_no_sync(s, no_sync);
}

/* Sums this rank's gradient shard over the replica group: packed into one
 * buffer so that a step crosses groups in one all-reduce. */
static int reduce_across(fsc_strategy *s) {
    struct hsdp_state *h = s->hsdp;
    if (fsc_group_size(h->replica) == 1) return FSC_OK;
    int n;
    const fsc_optim_range *r = fsc_fsdp_ranges(s->fsdp, &n);
    int64_t at = 0;
    for (int i = 0; i < n; i++, at += r[i - 1].n)
        memcpy(h->stage + at, r[i].grad, sizeof(float) * (size_t)r[i].n);
    const double t0 = fsc_now();
    int rc = fsc_group_allreduce(h->replica, h->stage, h->owned, FSC_DTYPE_F32, FSC_REDUCE_SUM);
    h->wait_s += fsc_now() - t0;
    h->allreduces++;
    if (rc) return fsc_error_context(rc, "hsdp: all-reduce of the gradient shards across groups: ");
    at = 0;
    for (int i = 0; i < n; i++, at += r[i - 1].n)
        memcpy(r[i].grad, h->stage + at, sizeof(float) * (size_t)r[i].n);
    return FSC_OK;
}

/* The micro-batch on the model (FSDP's hooks reduce-scatter within the
 * group as backward runs), then, after the step's last, across groups. */
static int run(fsc_strategy *s, const fsc_ctx *ctx, int rows, fsc_dp_work_fn fn, void *user,
               float *loss) {
    if (!ctx->arena) return fsc_error(FSC_ERR_INVALID, "strategy hsdp: ctx->arena is NULL");
    fsc_arena_reset(ctx->arena);
    int rc = fn(s->module, ctx, 0, rows, user, loss);
    return rc || !s->hsdp->last_micro ? rc : reduce_across(s);
}

/* The first shard group writes (the root's); the others hold the same
 * shards. Every rank returns the writers' status. */
static bool writes(const fsc_strategy *s, int root) {
    return s->rank / s->opt.shard_group == root / s->opt.shard_group;
}

static int save_weights(fsc_strategy *s, const char *path, int root, int n_meta,
                        const char *const *keys, const char *const *values) {
    int rc = FSC_OK;
    if (writes(s, root))
        rc = fsc_fsdp_save_weights(s->fsdp, s->rank == root ? path : NULL,
                                   root % s->opt.shard_group, n_meta, keys, values);
    return fsc_group_agree(s->group, rc, "saving the weights");
}

static int save_optim(fsc_strategy *s, const char *path, int root) {
    int rc = FSC_OK;
    if (writes(s, root))
        rc = fsc_fsdp_save_optim(s->fsdp, s->rank == root ? path : "", root % s->opt.shard_group);
    return fsc_group_agree(s->group, rc, "saving the optimizer state");
}

fsc_group *strategy_hsdp_replica(const fsc_strategy *s) {
    return s && s->hsdp ? s->hsdp->replica : NULL;
}

static void stats(const fsc_strategy *s, fsc_strategy_stats *out) {
    fsc_strategy_fsdp.stats(s, out);
    out->reductions += s->hsdp->allreduces;
    out->wait_s += s->hsdp->wait_s;
}

/* zero_grad, clip, step and the loads are the fsdp row's, over the shard
 * group: zeroing and stepping the shards, the norm (each group holds the
 * whole model once), loading slices by name (every group reads). */
const strategy_ops fsc_strategy_hsdp = {
    .name = "hsdp",
    .summary = "hybrid sharding: FSDP within groups of shard_group ranks, the groups replicas "
               "(gradients reduce-scattered within, then all-reduced across)",
    .spans_ranks = true,
    .zero_stage = 3,
    .accepts = OPT_REDUCE | OPT_FSDP | OPT_HSDP,
    .setup = setup,
    .teardown = teardown,
    .set_no_sync = set_no_sync,
    .run = run,
    .save_weights = save_weights,
    .save_optim = save_optim,
    .stats = stats,
    STRATEGY_FSDP_SHARED_OPS,
};
