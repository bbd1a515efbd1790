/* The pipeline executor: this rank's stages, and one loop that runs its
 * action list from the schedule, in order, and makes no decision of its own.
 * Every micro-batch's activations and saved state live in an arena taken
 * from a pool at its first action on this rank and given back (memory kept
 * for the next) after its last action here: the schedule alone decides how
 * many are held at once, and the pool never grows past that. Sends are
 * non-blocking, waited for before their arena goes back (unless that wait
 * could hang, pipe_release.c); a receive is posted and waited for where
 * the schedule places it, which the validator proved cannot deadlock. Each message carries a small
 * header with its shape, so a stage that produces the wrong shape fails on both ends instead of
 * hanging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipe_exec_internal.h"

/* One optimizer over the parameters this rank owns (a shared parameter's
 * copies are updated by its owner and sent to them). */
static int make_optim(fsc_pipe *p, const fsc_optim_config *cfg) {
    int rc = pipe_owned_ranges(p, &p->ranges, &p->nranges);
    if (!rc) rc = pipe_dp_setup(p); /* sharded: cut to this replica's slices */
    if (!rc) rc = pipe_state_setup(p);
    if (rc) return rc;
    p->optim = fsc_optim_new(cfg, p->ranges, p->nranges);
    return p->optim ? FSC_OK : fsc_error_context(FSC_ERR_INVALID, "pipeline optimizer: ");
}

fsc_pipe *fsc_pipe_new(fsc_group *g, const fsc_pipe_schedule *schedule,
                       const fsc_optim_config *optim, const fsc_pipe_options *opt) {
    if (!g || !schedule || !optim || !opt || !opt->make_stage || opt->layers < 1 ||
        opt->act_ndim < 1 || opt->act_ndim > FSC_MAX_DIMS) {
        fsc_error(FSC_ERR_INVALID, "pipeline: needs a group, a schedule, an optimizer config, "
                                   "make_stage, layers >= 1 and the activation's shape");
        return NULL;
    }
    fsc_pipe *p = calloc(1, sizeof *p);
    if (!p) {
        fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
        return NULL;
    }
    p->g = g, p->sched = schedule, p->opt = *opt, p->opt.balance = NULL;
    p->rank = fsc_group_rank(g);
    int rc = fsc_pipe_schedule_config(schedule, &p->cfg);
    p->stages = p->cfg.ranks * p->cfg.chunks;
    if (!rc && p->cfg.ranks != fsc_group_size(g))
        rc = fsc_error(FSC_ERR_INVALID, "pipeline: the schedule is for %d ranks, the group has %d",
                       p->cfg.ranks, fsc_group_size(g));
    /* one rank is a pipeline only as the unit a mesh shards (fsdp over TP replicas) */
    if (!rc && p->cfg.ranks < 2 && !opt->mesh && !opt->layout)
        rc = fsc_error(FSC_ERR_INVALID, "pipeline: needs at least 2 ranks (one process trains the "
                                        "whole model without one)");
    if (!rc && p->cfg.split_backward && opt->checkpoint != FSC_PIPE_CKPT_NEVER)
        rc = fsc_error(FSC_ERR_UNSUPPORTED,
                       "pipeline: a schedule that splits backward into B and W keeps every "
                       "activation until W; it does not combine with activation checkpointing");
    if (!rc && p->cfg.forward_only)
        rc = fsc_error(FSC_ERR_INVALID, "pipeline: the schedule is forward only (an evaluation "
                                        "pass); training needs one with backwards");
    if (!rc && 2 * p->stages * p->cfg.micros > 16384)
        rc = fsc_error(FSC_ERR_INVALID,
                       "pipeline: %d stages x %d micro-batches need more message "
                       "tags than MPI guarantees",
                       p->stages, p->cfg.micros);
    if (!rc && opt->balance) {
        int *b = malloc(sizeof(int) * (size_t)p->stages);
        if (b) memcpy(b, opt->balance, sizeof(int) * (size_t)p->stages);
        p->opt.balance = b;
        if (!b) rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    }
    if (!rc) rc = pipe_make_stages(p);
    if (!rc) rc = pipe_plan_release(p);
    if (!rc) rc = pipe_mesh_setup(p);
    if (!rc) rc = pipe_find_shared(p);
    if (!rc) rc = make_optim(p, optim);
    if (rc) {
        fsc_pipe_free(p);
        return NULL;
    }
    return p;
}

void fsc_pipe_free(fsc_pipe *p) {
    if (!p) return;
    pipe_state_free(p);
    pipe_free_shared(p);
    pipe_dp_free(p);
    pipe_mesh_free(p);
    fsc_optim_free(p->optim);
    free(p->ranges);
    for (int c = 0; p->params && c < p->nchunks; c++) fsc_params_free(&p->params[c]);
    for (int c = 0; p->chunk && c < p->nchunks; c++) fsc_module_free(p->chunk[c]);
    for (int i = 0; i < p->narena; i++) fsc_arena_free(p->arena[i]);
    free(p->arena);
    free(p->params);
    free(p->chunk);
    free(p->first);
    free(p->cut);
    free(p->lazy);
    free(p->trace_t0), free(p->trace_t1);
    free((void *)p->opt.balance);
    free(p);
}

int fsc_pipe_chunks(const fsc_pipe *p) {
    return p ? p->nchunks : 0;
}

int fsc_pipe_chunk_stage(const fsc_pipe *p, int c) {
    return p && c >= 0 && c < p->nchunks ? c * p->cfg.ranks + p->rank : -1;
}

fsc_module *fsc_pipe_chunk_module(fsc_pipe *p, int c) {
    return p && c >= 0 && c < p->nchunks ? p->chunk[c] : NULL;
}

fsc_params *fsc_pipe_chunk_params(fsc_pipe *p, int c) {
    return p && c >= 0 && c < p->nchunks ? &p->params[c] : NULL;
}

fsc_pipe_run_stats fsc_pipe_get_stats(const fsc_pipe *p) {
    return p->stats;
}

void fsc_pipe_zero_grad(fsc_pipe *p) {
    pipe_dp_zero_grad(p);
}

/* ---- the action loop ------------------------------------------------------------------- */

/* Per (chunk, micro-batch): what forward kept for backward, and (split
 * schedules) the weight gradients B left for W. */
typedef struct {
    void *saved;
    fsc_tensor in, out, dy, dx;
    fsc_deferred *deferred;
    bool fused; /* the last stage ran its head with the loss (fsc_pipe_io.targets) */
} slot;

typedef struct {
    fsc_pipe *p;
    const fsc_ctx *base;
    const fsc_pipe_io *io;
    slot *slots;                 /* nchunks x micros */
    int *finished;               /* per micro: 1 when done here, its arena back once sent */
    fsc_request **sends;         /* per action index: a send in flight */
    int *send_micro;             /* per action index: its micro-batch */
    const fsc_pipe_action *acts; /* this rank's list */
    int nacts, inflight;
    double loss;
    int *held;      /* per micro: its arena in p->arena, or -1 */
    int *last;      /* per micro: the index of its last action here, or -1 */
    int *free_list; /* arenas of the pool not in use */
    int nfree;
} run_state;

/* Micro-batch i's arena, taken from the pool (or a new one) at first use. */
static fsc_arena *arena_of(run_state *r, int micro) {
    fsc_pipe *p = r->p;
    if (r->held[micro] >= 0) return p->arena[r->held[micro]];
    if (r->nfree) {
        r->held[micro] = r->free_list[--r->nfree];
    } else {
        fsc_arena **grown = realloc(p->arena, sizeof *grown * (size_t)(p->narena + 1));
        if (!grown) return NULL;
        p->arena = grown;
        if (!(p->arena[p->narena] = fsc_arena_new(FSC_MEM_ACTIV, 1 << 20))) return NULL;
        r->held[micro] = p->narena++;
    }
    return p->arena[r->held[micro]];
}

static slot *slot_of(run_state *r, int stage, int micro) {
    return &r->slots[(stage / r->p->cfg.ranks) * r->p->cfg.micros + micro];
}

static void describe(fsc_pipe_action a, char *buf) {
    if (fsc_pipe_action_format(a, buf, FSC_PIPE_ACTION_TEXT) < 0) snprintf(buf, 8, "?");
}

static void shape_text(const float *h, char *buf, size_t n) {
    int nd = (int)h[2], at = snprintf(buf, n, "(");
    for (int d = 0; d < nd && d < 4 && at < (int)n; d++)
        at += snprintf(buf + at, n - (size_t)at, "%s%lld", d ? "," : "", (long long)h[3 + d]);
    if (at < (int)n) snprintf(buf + at, n - (size_t)at, ")");
}

/* The cut action a's message crosses: a forward's output and the gradient
 * that comes back for it are at its stage's end, the rest at its start. */
static const pipe_cut *cut_of(const fsc_pipe *p, fsc_pipe_action a) {
    return &p->cut[a.stage + (a.op == FSC_PIPE_SEND_F || a.op == FSC_PIPE_RECV_B)];
}

static void plan_header(const fsc_pipe *p, const pipe_cut *c, float *h) {
    memset(h, 0, sizeof(float) * PIPE_HEADER);
    h[0] = 7.f, h[2] = (float)p->opt.act_ndim;
    for (int d = 0; d < p->opt.act_ndim && d < 4; d++) h[3 + d] = (float)c->shape[d];
}

/* A message's header and payload, in micro-batch i's arena; NULL (error
 * set) when out of memory. */
static float *message_buffer(run_state *r, int micro, const pipe_cut *c) {
    fsc_arena *ar = arena_of(r, micro);
    float *buf = ar ? fsc_arena_alloc(ar, sizeof(float) * (size_t)(PIPE_HEADER + c->numel)) : NULL;
    if (!buf) fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory for a message");
    return buf;
}

/* Posts the send of t (header + data) for action a. */
static int post_send(run_state *r, int k, fsc_pipe_action a, const fsc_tensor *t) {
    fsc_pipe *p = r->p;
    const pipe_cut *c = cut_of(p, a);
    float *buf = message_buffer(r, a.micro, c);
    if (!buf) return FSC_ERR_NOMEM;
    float plan[PIPE_HEADER];
    plan_header(p, c, plan);
    memset(buf, 0, sizeof(float) * PIPE_HEADER);
    buf[0] = 7.f, buf[2] = (float)t->ndim;
    bool same = t->ndim == p->opt.act_ndim && t->dtype == FSC_DTYPE_F32;
    for (int d = 0; d < t->ndim && d < 4; d++) {
        buf[3 + d] = (float)t->shape[d];
        same = same && t->shape[d] == c->shape[d];
    }
    buf[1] = same ? 0.f : 1.f;
    if (same)
        memcpy(buf + PIPE_HEADER, t->data, sizeof(float) * (size_t)c->numel);
    else
        memset(buf + PIPE_HEADER, 0, sizeof(float) * (size_t)c->numel);
    int rc = fsc_group_isend(p->g, buf, PIPE_HEADER + c->numel, FSC_DTYPE_F32,
                             fsc_pipe_action_peer(p->sched, a), fsc_pipe_action_tag(p->sched, a),
                             &r->sends[k]);
    r->send_micro[k] = a.micro;
    p->stats.messages++;
    if (rc) return rc;
    if (!same) {
        char what[FSC_PIPE_ACTION_TEXT], got[64], want[64];
        describe(a, what);
        shape_text(buf, got, sizeof got), shape_text(plan, want, sizeof want);
        return fsc_error(FSC_ERR_SHAPE,
                         "pipeline rank %d, action %s (stage %d, micro-batch %d): the tensor to "
                         "send is %s, the plan says %s",
                         p->rank, what, a.stage, a.micro, got, want);
    }
    return FSC_OK;
}

/* Receives the message of action a into a tensor of the planned shape. */
static int receive(run_state *r, fsc_pipe_action a, fsc_tensor *out) {
    fsc_pipe *p = r->p;
    const pipe_cut *c = cut_of(p, a);
    float *buf = message_buffer(r, a.micro, c);
    if (!buf) return FSC_ERR_NOMEM;
    char what[FSC_PIPE_ACTION_TEXT];
    describe(a, what);
    const int peer = fsc_pipe_action_peer(p->sched, a);
    fsc_request *req;
    double t0 = fsc_now();
    int rc = fsc_group_irecv(p->g, buf, PIPE_HEADER + c->numel, FSC_DTYPE_F32, peer,
                             fsc_pipe_action_tag(p->sched, a), &req);
    if (!rc) rc = fsc_request_wait(&req);
    p->stats.wait_s += fsc_now() - t0;
    if (rc)
        return fsc_error_context(rc,
                                 "pipeline rank %d waiting at %s (stage %d, micro-batch %d) "
                                 "for rank %d: ",
                                 p->rank, what, a.stage, a.micro, peer);
    float plan[PIPE_HEADER];
    plan_header(p, c, plan);
    if (buf[1] != 0.f || memcmp(buf + 2, plan + 2, sizeof(float) * 5)) {
        char got[64], want[64];
        shape_text(buf, got, sizeof got), shape_text(plan, want, sizeof want);
        return fsc_error(FSC_ERR_SHAPE,
                         "pipeline rank %d, action %s (stage %d, micro-batch %d): rank %d sent "
                         "%s, the plan says %s",
                         p->rank, what, a.stage, a.micro, peer, got, want);
    }
    *out = (fsc_tensor){.data = buf + PIPE_HEADER, .dtype = FSC_DTYPE_F32, .ndim = p->opt.act_ndim};
    memcpy(out->shape, c->shape, sizeof out->shape);
    return FSC_OK;
}

static fsc_ctx micro_ctx(run_state *r, int micro) {
    fsc_ctx c = *r->base;
    c.arena = arena_of(r, micro);
    c.sample0 = r->io->sample0(r->io->user, micro);
    c.keyed = true;
    c.no_checkpoint =
        r->p->opt.checkpoint == FSC_PIPE_CKPT_EXCEPT_LAST && micro == r->p->cfg.micros - 1;
    return c;
}

/* The last stage's loss: from its fused head (its (1,) output, filled in
 * backward when training), else io->loss on its output, which writes
 * dloss/dy in place. */
static int last_stage_loss(run_state *r, const fsc_ctx *ctx, int micro, slot *sl) {
    sl->fused = ctx->head_loss && sl->out.ndim == 1 && sl->out.shape[0] == 1;
    if (sl->fused) { /* dy = d(loss)/d(loss) */
        sl->dy = fsc_tensor_arena(ctx->arena, FSC_DTYPE_F32, 1, (int64_t[]){1});
        if (!sl->dy.data) return FSC_ERR_NOMEM;
        *(float *)sl->dy.data = 1.f;
        if (!ctx->training) r->loss += *(const float *)sl->out.data;
        return FSC_OK;
    }
    float part = 0;
    int rc = r->io->loss(r->io->user, micro, &sl->out, ctx->arena, &part);
    r->loss += part;
    sl->dy = sl->out;
    return rc;
}

static int forward(run_state *r, fsc_pipe_action a) {
    fsc_pipe *p = r->p;
    slot *sl = slot_of(r, a.stage, a.micro);
    fsc_ctx ctx = micro_ctx(r, a.micro);
    const bool last = a.stage == p->stages - 1;
    int rc = a.stage == 0 ? r->io->input(r->io->user, a.micro, &sl->in) : FSC_OK;
    fsc_head_loss hl;
    if (!rc && last && r->io->targets && !(ctx.training && p->cfg.split_backward)) {
        rc = r->io->targets(r->io->user, a.micro, &hl);
        ctx.head_loss = &hl;
    }
    if (rc) return rc;
    /* held activations: (stage, micro-batch) pairs forwarded, not yet backward */
    if (++r->inflight > p->stats.peak_inflight) p->stats.peak_inflight = r->inflight;
    double t0 = fsc_now();
    rc = fsc_module_forward(p->chunk[a.stage / p->cfg.ranks], &ctx, &sl->in, &sl->out, &sl->saved);
    if (!rc && last) rc = last_stage_loss(r, &ctx, a.micro, sl);
    p->stats.compute_s += fsc_now() - t0;
    return rc;
}

/* Completes the send of action k; a peer that never takes it is named with
 * the action, as a receive's wait is. */
static int wait_send(run_state *r, int k) {
    const fsc_pipe_action a = r->acts[k];
    int rc = fsc_request_wait(&r->sends[k]);
    if (!rc) return FSC_OK;
    char what[FSC_PIPE_ACTION_TEXT];
    describe(a, what);
    return fsc_error_context(
        rc, "pipeline rank %d, %s (stage %d, micro-batch %d) to rank %d: ", r->p->rank, what,
        a.stage, a.micro, fsc_pipe_action_peer(r->p->sched, a));
}

/* Waits for the sends of micro-batch i, then gives its arena back. */
static int release_micro(run_state *r, int micro) {
    int rc = FSC_OK;
    double t0 = fsc_now();
    for (int k = 0; k < r->nacts; k++)
        if (r->sends[k] && r->send_micro[k] == micro) {
            int w = wait_send(r, k);
            if (!rc) rc = w;
        }
    r->p->stats.wait_s += fsc_now() - t0;
    fsc_arena *a = r->p->arena[r->held[micro]]; /* back to the pool, its memory kept */
    fsc_arena_reset(a);
    r->free_list[r->nfree++] = r->held[micro];
    r->held[micro] = -1;
    return rc;
}

/* Micro-batch i's arena back if its sends are taken, tested and never
 * waited for (a rank waiting for a send before a later receive can
 * deadlock: the forward-only order needs the receive first, and so may a
 * hand-written training order, pipe_release.c). */
static int release_if_sent(run_state *r, int micro) {
    for (int k = 0; k < r->nacts; k++)
        if (r->sends[k] && r->send_micro[k] == micro) {
            bool done = false;
            int rc = fsc_request_test(&r->sends[k], &done);
            if (rc || !done) return rc;
        }
    return release_micro(r, micro); /* nothing left to wait for */
}

static int backward(run_state *r, fsc_pipe_action a) {
    fsc_pipe *p = r->p;
    slot *sl = slot_of(r, a.stage, a.micro);
    fsc_ctx ctx = micro_ctx(r, a.micro);
    if (p->cfg.split_backward) { /* B: input gradients now, weight gradients at W */
        if (!(sl->deferred = fsc_deferred_new(ctx.arena))) return FSC_ERR_NOMEM;
        ctx.defer = sl->deferred;
    }
    double t0 = fsc_now();
    int rc = fsc_module_backward(p->chunk[a.stage / p->cfg.ranks], &ctx, sl->saved, &sl->dy,
                                 a.stage == 0 ? NULL : &sl->dx);
    p->stats.compute_s += fsc_now() - t0;
    if (rc) return rc;
    if (sl->fused) r->loss += *(const float *)sl->out.data; /* the head ran just now */
    r->inflight--;
    return FSC_OK;
}

/* W: the weight gradients B deferred. */
static int weights(run_state *r, fsc_pipe_action a) {
    slot *sl = slot_of(r, a.stage, a.micro);
    double t0 = fsc_now();
    fsc_deferred_run(sl->deferred);
    r->p->stats.compute_s += fsc_now() - t0;
    sl->deferred = NULL;
    return FSC_OK;
}

static int run_action(run_state *r, int k, fsc_pipe_action a) {
    slot *sl = slot_of(r, a.stage, a.micro);
    switch (a.op) {
    case FSC_PIPE_RECV_F:
        return receive(r, a, &sl->in);
    case FSC_PIPE_RECV_B:
        return receive(r, a, &sl->dy);
    case FSC_PIPE_F:
        return forward(r, a);
    case FSC_PIPE_B:
        return backward(r, a);
    case FSC_PIPE_W:
        return weights(r, a);
    case FSC_PIPE_SEND_F:
        return post_send(r, k, a, &sl->out);
    case FSC_PIPE_SEND_B:
        return post_send(r, k, a, &sl->dx);
    default:
        return fsc_error(FSC_ERR_UNSUPPORTED, "pipeline: action kind %d is not run here", a.op);
    }
}

/* Runs this rank's list of sched: p's own schedule (a training step) or a
 * forward-only one of the same shape (an evaluation pass: no gradients, so
 * nothing is summed or reduced after it). */
static int run_list(fsc_pipe *p, const fsc_pipe_schedule *sched, const fsc_ctx *ctx,
                    const fsc_pipe_io *io, float *loss) {
    if (!p || !ctx || !io || !io->sample0 || !loss || (p->rank == 0 && !io->input) ||
        (fsc_pipe_stage_rank(p->sched, p->stages - 1) == p->rank && !io->loss))
        return fsc_error(FSC_ERR_INVALID,
                         "pipeline run: needs ctx, io (input on the first stage's rank, loss on "
                         "the last's, sample0) and loss");
    const fsc_pipe_action *acts;
    int n, rc = fsc_pipe_schedule_actions(sched, p->rank, &acts, &n);
    if (rc) return rc;
    const int m = p->cfg.micros;
    fsc_pipe_config cfg;
    fsc_pipe_schedule_config(sched, &cfg);
    run_state r = {.p = p, .base = ctx, .io = io, .acts = acts, .nacts = n};
    r.slots = calloc((size_t)p->nchunks * (size_t)m, sizeof *r.slots);
    r.finished = calloc((size_t)m, sizeof *r.finished);
    r.sends = calloc((size_t)n + 1, sizeof *r.sends);
    r.send_micro = calloc((size_t)n + 1, sizeof *r.send_micro);
    r.held = malloc(sizeof *r.held * (size_t)m);
    r.last = malloc(sizeof *r.last * (size_t)m);
    for (int i = 0; r.last && i < m; i++) r.last[i] = -1;
    for (int k = 0; r.last && k < n; k++) r.last[acts[k].micro] = k;
    r.free_list = malloc(sizeof *r.free_list * (size_t)(p->narena + m));
    for (int i = 0; r.held && i < m; i++) r.held[i] = -1;
    for (int i = 0; r.free_list && i < p->narena; i++) r.free_list[r.nfree++] = i;
    if (!r.slots || !r.finished || !r.sends || !r.send_micro || !r.held || !r.last || !r.free_list)
        rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    p->stats = (fsc_pipe_run_stats){0};
    if (!rc) rc = pipe_dp_gather(p); /* sharded parameters: the stages whole for the step */
    double *t0s = realloc(p->trace_t0, sizeof(double) * (size_t)(n ? n : 1));
    if (t0s) p->trace_t0 = t0s;
    double *t1s = realloc(p->trace_t1, sizeof(double) * (size_t)(n ? n : 1));
    if (t1s) p->trace_t1 = t1s;
    if (!rc && (!t0s || !t1s)) rc = fsc_error(FSC_ERR_NOMEM, "pipeline: out of memory");
    p->ntrace = 0;
    const double start = fsc_now();
    for (int k = 0; !rc && k < n; k++) {
        const fsc_pipe_action a = acts[k];
        if (cfg.forward_only) r.finished[a.micro] = 0; /* in use again (a later chunk) */
        p->trace_t0[k] = fsc_now() - start;
        rc = run_action(&r, k, a);
        p->trace_t1[k] = fsc_now() - start;
        p->ntrace = k + 1;
        if (!rc && a.op == FSC_PIPE_F) { /* after a forward: the most held */
            size_t held = 0;
            for (int i = 0; i < m; i++)
                if (r.held[i] >= 0) held += fsc_arena_used(p->arena[r.held[i]]);
            if (held > p->stats.peak_held_bytes) p->stats.peak_held_bytes = held;
        }
        bool sends_next =
            k + 1 < n && (acts[k + 1].op == FSC_PIPE_SEND_B || acts[k + 1].op == FSC_PIPE_SEND_F) &&
            acts[k + 1].micro == a.micro && acts[k + 1].stage == a.stage;
        if (cfg.forward_only) { /* done here after its forward (and send): back once sent */
            if (!sends_next && (a.op == FSC_PIPE_F || a.op == FSC_PIPE_SEND_F))
                r.finished[a.micro] = 1;
        } else if (!rc && k == r.last[a.micro]) { /* its last action here: its arena back */
            if (p->lazy[a.micro])
                r.finished[a.micro] = 1; /* once its sends are taken (pipe_release.c) */
            else
                rc = release_micro(&r, a.micro);
        }
        for (int i = 0; !rc && i < m; i++)
            if (r.finished[i] == 1 && r.held[i] >= 0) rc = release_if_sent(&r, i);
    }
    /* every send completes, even after an error, so no buffer is left to MPI */
    double t0 = fsc_now();
    for (int k = 0; k < n; k++)
        if (r.sends[k]) {
            int w = wait_send(&r, k);
            if (!rc) rc = w;
        }
    /* the loss first: waiting here is the pipeline's drain (a later rank still
     * computing), part of this rank's bubble; the gradient sums come after */
    float total = (float)r.loss;
    if (!rc) rc = fsc_group_allreduce(p->g, &total, 1, FSC_DTYPE_F32, FSC_REDUCE_SUM);
    *loss = total;
    p->stats.wait_s += fsc_now() - t0;
    p->stats.span_s = fsc_now() - start;
    if (!rc && !cfg.forward_only) rc = pipe_sum_shared(p);
    if (!rc) rc = cfg.forward_only ? pipe_dp_release(p) : pipe_dp_reduce(p);
    for (int i = 0; r.held && i < m; i++) /* after an error: every arena back */
        if (r.held[i] >= 0) fsc_arena_reset(p->arena[r.held[i]]);
    free(r.slots), free(r.finished), free(r.sends), free(r.send_micro), free(r.held), free(r.last),
        free(r.free_list);
    return rc;
}

int fsc_pipe_run(fsc_pipe *p, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss) {
    return run_list(p, p ? p->sched : NULL, ctx, io, loss);
}

int fsc_pipe_eval(fsc_pipe *p, const fsc_ctx *ctx, const fsc_pipe_io *io, float *loss) {
    if (!p || !ctx || ctx->training)
        return fsc_error(FSC_ERR_INVALID, "pipeline eval: needs a pipe and a ctx with training "
                                          "false (an evaluation pass keeps nothing for backward)");
    fsc_pipe_schedule *fwd;
    int rc = fsc_pipe_schedule_make_forward(p->cfg.ranks, p->cfg.chunks, p->cfg.micros, &fwd);
    if (rc) return rc;
    /* the last training step's figures and trace stay what the caller reads */
    const fsc_pipe_run_stats keep = p->stats;
    double *t0 = p->trace_t0, *t1 = p->trace_t1;
    const int ntrace = p->ntrace;
    p->trace_t0 = p->trace_t1 = NULL;
    rc = run_list(p, fwd, ctx, io, loss);
    free(p->trace_t0), free(p->trace_t1);
    p->trace_t0 = t0, p->trace_t1 = t1, p->ntrace = ntrace, p->stats = keep;
    fsc_pipe_schedule_free(fwd);
    return rc;
}
