/* FSDP (ZeRO-3): units, their shards, and the hooks that gather full
 * parameters just before a unit computes and reduce-scatter its gradients
 * just after.
 *
 * Everything happens in hooks on the model's own modules (fsc/fsdp.h says
 * why in place): pre-forward gathers (finishing a prefetch if one was
 * started) and starts the next unit's gather; post-forward frees; pre-backward
 * gathers again, starts the gather of the unit that backward reaches next and
 * binds a zeroed full gradient; post-backward shows it to the probe (AdaScale),
 * launches the reduce-scatter and frees. The root's post-backward closes the
 * step: every reduction is waited for and only shards remain. Progress hooks
 * on every module keep non-blocking collectives moving while layers compute
 * (MPI does not move them by itself). Every rank reaches the same hooks in
 * the same order, so the collectives match without any extra agreement.
 *
 * Wrapping in place leaves no inner model to call by mistake: the caller
 * trains the root itself. What remains is running backward on a submodule:
 * one inside a unit finds its views unbound (fsc_module_backward says so),
 * and a unit's own would reduce-scatter with nobody to finish it before the
 * step, so its pre-backward hook refuses to run outside the root's backward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "fsc/kernels.h"
#include "fsdp_internal.h"

/* ---- views ---------------------------------------------------------------------------- */

static void bind_params(fsc_fsdp *f, fsdp_unit *u, float *full) {
    for (int i = 0; i < u->n; i++) fsdp_member(f, u, i)->data = full ? full + u->offset[i] : NULL;
}

/* full: the trainable region's gradient; frozen members have none */
static void bind_grads(fsc_fsdp *f, fsdp_unit *u, float *full) {
    for (int i = 0; i < u->n; i++) {
        fsc_param *p = fsdp_member(f, u, i);
        p->grad = full && !p->frozen ? full + u->offset[i] : NULL;
    }
}

/* ---- gathering ------------------------------------------------------------------------- */

static int gather_start(fsc_fsdp *f, fsdp_unit *u, bool exact) {
    if (u->full || !u->padded) return FSC_OK; /* there, in flight, or nothing to gather */
    const fsc_dtype dt = exact ? FSC_DTYPE_F32 : f->opt.compute_dtype;
    u->full = fsdp_buf_get(f, u->padded, false, &u->full_cap);
    if (!u->full) return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
    const char *send = (const char *)u->shard_data;
    char *recv = (char *)u->full;
    if (dt != FSC_DTYPE_F32) {
        u->send_half = fsdp_half_get(f, FSC_MEM_COMM, (size_t)u->shard * 2);
        u->recv_half = fsdp_half_get(f, FSC_MEM_GATHERED, (size_t)u->padded * 2);
        if (!u->send_half || !u->recv_half)
            return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
        fsdp_narrow(u->send_half, u->shard_data, u->shard, dt);
        send = u->send_half, recv = u->recv_half;
    }
    /* each region is gathered alone: the trainable one, then the frozen one */
    const size_t es = fsc_dtype_size(dt);
    const int64_t fshard = u->shard - u->gshard;
    int rc = FSC_OK;
    if (u->gshard) {
        rc = fsc_group_iallgather(f->g, send, recv, u->gshard, dt, &u->gather_req);
        f->stats.allgathers++;
    }
    if (!rc && fshard) {
        rc = fsc_group_iallgather(f->g, send + (size_t)u->gshard * es,
                                  recv + (size_t)u->gpadded * es, fshard, dt, &u->fgather_req);
        f->stats.allgathers++;
    }
    return rc ? fsc_error_context(rc, "FSDP gather of unit '%s': ", u->name) : FSC_OK;
}

/* Waits for the unit's gather (if in flight), widens a half-precision one and
 * binds the model's views to the full parameters. A bf16 gather is kept
 * beside its widening as the full parameters' bf16 view: the bf16 GEMMs
 * (Linear, the tied head) read the gathered values instead of rounding the
 * widened ones back, and fp32 consumers (LayerNorm, biases, embeddings)
 * read the widened. The view goes in fsdp_release, before the buffers. */
static int gather_finish(fsc_fsdp *f, fsdp_unit *u) {
    for (int k = 0; k < 2; k++) {
        fsc_request **req = k ? &u->fgather_req : &u->gather_req;
        if (!*req) continue;
        double t0 = fsc_now();
        int rc = fsc_request_wait(req);
        f->stats.wait_s += fsc_now() - t0;
        if (rc) return fsc_error_context(rc, "FSDP gather of unit '%s': ", u->name);
    }
    /* a unit still gathered (the root) comes here again with its view in place */
    bool view = u->recv_half && fsc_bf16_view_find(u->full, u->padded) == u->recv_half;
    if (u->recv_half && !view) {
        fsdp_widen(u->full, u->recv_half, u->padded, f->opt.compute_dtype, false);
        view = f->opt.compute_dtype == FSC_DTYPE_BF16 &&
               fsc_bf16_view_add(u->full, u->recv_half, u->padded) == FSC_OK;
        if (!view) fsdp_half_put(f, u->recv_half, FSC_MEM_GATHERED, (size_t)u->padded * 2);
        if (!view) u->recv_half = NULL;
        fsdp_half_put(f, u->send_half, FSC_MEM_COMM, (size_t)u->shard * 2);
        u->send_half = NULL;
    }
    if (fsc_fault_is(FSC_FAULT_SHARD_OFFSET) && f->world > 1) { /* both copies, as one */
        /* the last rank's slice of the trainable region (else the frozen one) */
        const int64_t n = u->gshard ? u->gshard : u->shard - u->gshard;
        const int64_t at = (u->gshard ? 0 : u->gpadded) + (f->world - 1) * n;
        memmove(u->full + at + 1, u->full + at, sizeof(float) * (size_t)(n - 1));
        uint16_t *h = view ? (uint16_t *)u->recv_half + at : NULL;
        if (h) memmove(h + 1, h, sizeof(uint16_t) * (size_t)(n - 1));
    }
    bind_params(f, u, u->full);
    return FSC_OK;
}

int fsdp_gather(fsc_fsdp *f, fsdp_unit *u, bool exact) {
    int rc = gather_start(f, u, exact);
    return rc ? rc : gather_finish(f, u);
}

void fsdp_release(fsdp_unit *u) {
    /* a buffer MPI may still write into is never freed: after a failed wait
     * (timeout) it is left to the process's end */
    if (u->gather_req && fsc_request_wait(&u->gather_req)) return;
    if (u->fgather_req && fsc_request_wait(&u->fgather_req)) return;
    if (u->full) fsc_bf16_view_remove(u->full);
    bind_params(u->f, u, NULL);
    fsdp_buf_put(u->f, u->full, u->full_cap);
    fsdp_half_put(u->f, u->recv_half, FSC_MEM_GATHERED, (size_t)u->padded * 2);
    fsdp_half_put(u->f, u->send_half, FSC_MEM_COMM, (size_t)u->shard * 2);
    u->full = NULL, u->recv_half = u->send_half = NULL;
}

/* The unit after (step +1) or before (-1) u in the recorded forward order, if
 * it should be prefetched: known order, not the root, not already there. */
static fsdp_unit *neighbour(fsc_fsdp *f, const fsdp_unit *u, int step) {
    if (f->opt.no_prefetch || !f->order_known || u->fwd_pos < 0) return NULL;
    int pos = u->fwd_pos + step;
    if (pos < 0 || pos >= f->norder) return NULL;
    fsdp_unit *v = &f->units[f->order[pos]];
    return v->index == 0 || v->full ? NULL : v;
}

/* ---- reducing --------------------------------------------------------------------------- */

/* The probe sees each member of u's gradient g (unit layout) where the whole
 * model's flat layout would hold it, so its offsets are ddp's, whatever the
 * units. */
static void probe_unit(const fsc_fsdp *f, const fsdp_unit *u, const float *g) {
    for (int i = 0; i < u->n; i++) {
        const fsc_param_entry *e = &f->ps.entries[u->entries[i]];
        if (e->param->frozen) continue; /* no gradient */
        f->opt.probe(f->opt.probe_user, e->offset, g + u->offset[i], e->param->numel);
    }
}

/* After u's backward: the probe sees this backward's gradient alone, in fp32
 * (before any rounding to the reduce dtype); a separate one under no_sync
 * then joins the kept sum. */
static void probe_backward(fsc_fsdp *f, fsdp_unit *u) {
    if (!f->opt.probe || !u->full_grad) return;
    probe_unit(f, u, u->own_grad ? u->own_grad : u->full_grad);
    if (!u->own_grad) return;
    fsc_add_inplace(u->full_grad, u->own_grad, u->gpadded);
    bind_grads(f, u, u->full_grad);
    fsdp_buf_put(f, u->own_grad, u->own_cap);
    u->own_grad = NULL;
}

/* Only the trainable region is reduced: frozen members have no gradient. */
static int rs_start(fsc_fsdp *f, fsdp_unit *u) {
    if (!u->gpadded) return FSC_OK;
    const fsc_dtype dt = f->opt.reduce_dtype;
    void *in = u->full_grad;
    if (u->index == f->nunits - 1 && fsc_fault_is(FSC_FAULT_DROP_GRAD) && f->rank == f->world - 1)
        memset(in, 0, sizeof(float) * (size_t)u->gpadded);
    if (dt != FSC_DTYPE_F32) { /* round, and give the fp32 buffer back at once */
        if (!(u->rs_in = fsdp_half_get(f, FSC_MEM_COMM, (size_t)u->gpadded * 2)))
            return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
        fsdp_narrow(u->rs_in, u->full_grad, u->gpadded, dt);
        bind_grads(f, u, NULL);
        fsdp_buf_put(f, u->full_grad, u->grad_cap);
        u->full_grad = NULL;
        in = u->rs_in;
    }
    /* straight into the shard when it is zero (the first micro-step) and fp32 */
    void *out = u->shard_grad;
    if (!(u->grad_zero && dt == FSC_DTYPE_F32) &&
        !(out = u->rs_out = fsdp_half_get(f, FSC_MEM_COMM, (size_t)u->gshard * fsc_dtype_size(dt))))
        return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
    u->grad_zero = false;
    u->rs_pending = true;
    f->stats.reduce_scatters++;
    f->stats.reduced_bytes += u->gpadded * (int64_t)fsc_dtype_size(dt);
    int rc = fsc_group_ireduce_scatter(f->g, in, out, u->gshard, dt, FSC_REDUCE_SUM, &u->rs_req);
    return rc ? fsc_error_context(rc, "FSDP reduce-scatter of unit '%s': ", u->name) : FSC_OK;
}

/* Completes u's reduce-scatter (waiting, or only if already done): adds the
 * result into the gradient shard and frees the full gradient. */
static int rs_finish(fsc_fsdp *f, fsdp_unit *u, bool wait) {
    if (!u->rs_pending) return FSC_OK;
    if (u->rs_req) {
        int rc;
        if (wait) {
            double t0 = fsc_now();
            rc = fsc_request_wait(&u->rs_req);
            f->stats.wait_s += fsc_now() - t0;
        } else {
            bool done = false;
            rc = fsc_request_test(&u->rs_req, &done);
            if (!rc && !done) return FSC_OK;
        }
        if (rc) return fsc_error_context(rc, "FSDP reduce-scatter of unit '%s': ", u->name);
    }
    if (u->rs_out) fsdp_widen(u->shard_grad, u->rs_out, u->gshard, f->opt.reduce_dtype, true);
    if (u->index == f->nunits - 1 &&
        fsc_fault_fires(FSC_FAULT_REDUCE_TWICE)) /* the shard, accumulated or not */
        for (int64_t i = 0; i < u->gshard / 2; i++) u->shard_grad[i] *= 2;
    fsdp_half_put(f, u->rs_out, FSC_MEM_COMM,
                  (size_t)u->gshard * fsc_dtype_size(f->opt.reduce_dtype));
    fsdp_half_put(f, u->rs_in, FSC_MEM_COMM, (size_t)u->gpadded * 2);
    u->rs_out = u->rs_in = NULL;
    bind_grads(f, u, NULL);
    fsdp_buf_put(f, u->full_grad, u->grad_cap);
    u->full_grad = NULL;
    u->rs_pending = false;
    return FSC_OK;
}

/* Before another full gradient comes into use, every reduction but the
 * newest completes: the root's gradient, the one computing and one in flight
 * are all a rank holds beyond its shards. */
static int make_room(fsc_fsdp *f, const fsdp_unit *newest) {
    for (int i = 0; i < f->nunits; i++) {
        fsdp_unit *u = &f->units[i];
        if (u != newest && u->rs_pending) {
            int rc = rs_finish(f, u, true);
            if (rc) return rc;
        }
    }
    return FSC_OK;
}

static int end_of_backward(fsc_fsdp *f) {
    int rc = FSC_OK;
    for (int i = 0; i < f->nunits; i++) {
        int w = rs_finish(f, &f->units[i], true);
        if (!rc) rc = w;
    }
    for (int i = 0; i < f->nunits; i++) fsdp_release(&f->units[i]); /* the root, stray prefetches */
    return rc;
}

/* ---- hooks -------------------------------------------------------------------------------- */

static int on_pre_forward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                          const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)t;
    fsdp_unit *u = user;
    fsc_fsdp *f = u->f;
    if (f->summoned)
        return fsc_error(FSC_ERR_INVALID, "FSDP: forward while full parameters are summoned "
                                          "(call fsc_fsdp_release_full_params first)");
    if (u->index == 0 && !ctx->recompute) f->in_backward = false; /* after a failed one */
    if (!ctx->recompute && !f->order_known && u->fwd_pos < 0) {
        u->fwd_pos = f->norder;
        f->order[f->norder++] = u->index;
    }
    int rc = fsdp_gather(f, u, false);
    fsdp_unit *next = ctx->recompute ? NULL : neighbour(f, u, +1);
    if (!rc && next) rc = gather_start(f, next, false);
    return rc;
}

static int on_post_forward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)t;
    fsdp_unit *u = user;
    fsc_fsdp *f = u->f;
    if (ctx->recompute) return FSC_OK; /* backward comes next: keep them */
    if (u->index == 0) f->order_known = true;
    /* eval: no backward follows, so every unit (the root too) frees now */
    if (!ctx->training || (u->index != 0 && !f->opt.keep_after_forward)) fsdp_release(u);
    fsc_group_progress(f->g);
    return FSC_OK;
}

static int on_pre_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                           const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    fsdp_unit *u = user;
    fsc_fsdp *f = u->f;
    if (u->index == 0)
        f->in_backward = true;
    else if (!f->in_backward)
        return fsc_error(FSC_ERR_INVALID,
                         "FSDP: unit '%s' ran backward outside the root's backward (called a "
                         "submodule directly?): its reduce-scatter would never complete before "
                         "the step; run forward and backward on the root given to fsc_fsdp_new",
                         u->name);
    int rc = fsdp_gather(f, u, false);
    fsdp_unit *next = neighbour(f, u, -1);
    if (!rc && next) rc = gather_start(f, next, false);
    if (!rc && u->full_grad && f->opt.probe) {    /* kept by no_sync, joined after the probe */
        fsdp_buf_put(f, u->own_grad, u->own_cap); /* a failed backward's */
        if (!(u->own_grad = fsdp_buf_get(f, u->gpadded, true, &u->own_cap)))
            return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
        bind_grads(f, u, u->own_grad);
        return FSC_OK;
    }
    if (rc || u->full_grad || !u->gpadded) { /* kept by no_sync: accumulate into it */
        if (!rc) bind_grads(f, u, u->full_grad);
        return rc;
    }
    if ((rc = make_room(f, f->newest_rs))) return rc;
    u->full_grad = fsdp_buf_get(f, u->gpadded, true, &u->grad_cap);
    if (!u->full_grad) return fsc_error_context(FSC_ERR_NOMEM, "FSDP unit '%s': ", u->name);
    bind_grads(f, u, u->full_grad);
    return FSC_OK;
}

static int on_post_backward(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx,
                            const fsc_tensor *t, void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    fsdp_unit *u = user;
    fsc_fsdp *f = u->f;
    int rc = FSC_OK;
    probe_backward(f, u);
    if (!f->no_sync) {
        rc = rs_start(f, u);
        f->newest_rs = u;
    }
    if (u->index != 0) fsdp_release(u);
    fsc_group_progress(f->g);
    for (int i = 0; !rc && i < f->nunits; i++)
        if (&f->units[i] != u) rc = rs_finish(f, &f->units[i], false);
    if (u->index == 0) {
        int end = end_of_backward(f);
        f->newest_rs = NULL;
        f->in_backward = false;
        if (!rc) rc = end;
    }
    return rc;
}

static int on_progress(fsc_module *m, fsc_hook_kind kind, const fsc_ctx *ctx, const fsc_tensor *t,
                       void *user) {
    (void)m, (void)kind, (void)ctx, (void)t;
    fsc_group_progress(((fsc_fsdp *)user)->g);
    return FSC_OK;
}

static const fsc_hook_fn unit_hooks[FSC_HOOK_KIND_COUNT] = {on_pre_forward, on_post_forward,
                                                            on_pre_backward, on_post_backward};

/* ---- construction ------------------------------------------------------------------------- */

static int add_progress_hooks(fsc_fsdp *f, fsc_module *m) {
    f->hooked[f->nhooked++] = m;
    int rc = fsc_module_add_hook(m, FSC_HOOK_POST_FORWARD, on_progress, f);
    if (!rc) rc = fsc_module_add_hook(m, FSC_HOOK_POST_BACKWARD, on_progress, f);
    for (int c = 0; !rc && c < m->nchildren; c++) rc = add_progress_hooks(f, m->children[c]);
    return rc;
}

static int count_modules(const fsc_module *m) {
    int n = 1;
    for (int c = 0; c < m->nchildren; c++) n += count_modules(m->children[c]);
    return n;
}

static int check_options(const fsc_fsdp_options *o) {
    const fsc_dtype ok[] = {FSC_DTYPE_F32, FSC_DTYPE_BF16, FSC_DTYPE_F16};
    bool c = false, r = false;
    for (int i = 0; i < 3; i++) c |= o->compute_dtype == ok[i], r |= o->reduce_dtype == ok[i];
    if (!c)
        return fsc_error(FSC_ERR_INVALID, "FSDP: compute dtype %s: expected F32, BF16 or F16",
                         fsc_dtype_name(o->compute_dtype));
    if (!r)
        return fsc_error(FSC_ERR_INVALID, "FSDP: reduce dtype %s: expected F32, BF16 or F16",
                         fsc_dtype_name(o->reduce_dtype));
    return FSC_OK;
}

static int setup(fsc_fsdp *f, uint64_t seed, fsc_module *const *units, int n,
                 const fsc_optim_config *cfg) {
    int rc = fsc_params_collect(f->root, &f->ps);
    if (rc) return rc;
    for (int e = 0; e < f->ps.count; e++)
        if (f->ps.entries[e].param->data)
            return fsc_error(FSC_ERR_INVALID,
                             "FSDP: parameter %s is bound already; FSDP allocates the shards "
                             "itself (do not call fsc_params_bind on a model to shard)",
                             f->ps.entries[e].name);
    f->nunits = n + 1;
    f->units = calloc((size_t)f->nunits, sizeof *f->units);
    f->unit_of = calloc((size_t)f->ps.count + 1, sizeof *f->unit_of);
    f->order = calloc((size_t)f->nunits, sizeof *f->order);
    int *seen = calloc((size_t)f->nunits, sizeof *seen), entry = 0;
    if (!f->units || !f->unit_of || !f->order || !seen) {
        free(seen);
        return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    }
    rc = fsdp_assign(f, f->root, "", 0, units, n, &entry, seen);
    for (int k = 1; !rc && k < f->nunits; k++)
        if (seen[k] != 1)
            rc = fsc_error(FSC_ERR_INVALID,
                           "FSDP: unit %d (module '%s') is not a submodule of the root", k - 1,
                           units[k - 1]->name);
    free(seen);
    if (!rc) rc = fsdp_lay_out_units(f);
    if (rc) return rc;
    f->data = fsc_mem_alloc(FSC_MEM_PARAMS, (size_t)f->shard_total * sizeof(float));
    f->grad = fsc_mem_alloc(FSC_MEM_GRADS, (size_t)f->grad_total * sizeof(float));
    if (f->shard_total && (!f->data || (f->grad_total && !f->grad)))
        return fsc_error_context(FSC_ERR_NOMEM,
                                 "FSDP: shards of %lld elements: ", (long long)f->shard_total);
    int64_t at = 0, gat = 0;
    for (int k = 0; k < f->nunits; k++) {
        fsdp_unit *u = &f->units[k];
        u->shard_data = f->data + at, u->shard_grad = f->grad ? f->grad + gat : NULL;
        at += u->shard, gat += u->gshard;
        fsdp_init_shard(f, u, seed);
        bind_params(f, u, NULL);
        bind_grads(f, u, NULL);
    }
    if ((rc = fsdp_plan_ranges(f))) return rc;
    int64_t owned = 0;
    for (int i = 0; i < f->nranges; i++) owned += f->ranges[i].n;
    f->stats.units = f->nunits;
    f->stats.shard_elems = f->shard_total;
    f->stats.padding_elems = f->shard_total - owned;
    if (!(f->optim = fsc_optim_new(cfg, f->ranges, f->nranges))) return FSC_ERR_INVALID;
    f->hooked = calloc((size_t)count_modules(f->root), sizeof *f->hooked);
    if (!f->hooked) return fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
    for (int k = 0; k < f->nunits && !rc; k++)
        for (int kind = 0; kind < FSC_HOOK_KIND_COUNT && !rc; kind++)
            rc = fsc_module_add_hook(f->units[k].m, (fsc_hook_kind)kind, unit_hooks[kind],
                                     &f->units[k]);
    return rc ? rc : add_progress_hooks(f, f->root);
}

fsc_fsdp *fsc_fsdp_new(fsc_module *root, fsc_group *g, uint64_t seed, fsc_module *const *units,
                       int n, const fsc_optim_config *cfg, const fsc_fsdp_options *opt) {
    if (!root || !g || !cfg || n < 0 || (n > 0 && !units)) {
        fsc_error(FSC_ERR_INVALID, "FSDP: needs a model, a group, an optimizer configuration "
                                   "and n >= 0 units");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const char *bad = NULL;
        if (!units[i])
            bad = "is NULL";
        else if (units[i] == root)
            bad = "is the root (always a unit)";
        else if (units[i]->params_used_by_parent) /* GPT's tied wte, wpe */
            bad = "is a module whose parameters its parent uses directly: they stay in the "
                  "parent's unit";
        for (int j = 0; !bad && j < i; j++)
            if (units[j] == units[i]) bad = "is listed twice";
        if (bad) {
            fsc_error(FSC_ERR_INVALID, "FSDP: unit %d %s", i, bad);
            return NULL;
        }
    }
    fsc_fsdp *f = calloc(1, sizeof *f);
    if (!f) {
        fsc_error(FSC_ERR_NOMEM, "FSDP: out of memory");
        return NULL;
    }
    f->root = root, f->g = g;
    f->rank = fsc_group_rank(g), f->world = fsc_group_size(g);
    f->opt = opt ? *opt : (fsc_fsdp_options){0};
    int rc = check_options(&f->opt);
    if (!rc) rc = setup(f, seed, units, n, cfg);
    if (rc) {
        fsc_fsdp_free(f);
        return NULL;
    }
    return f;
}

void fsc_fsdp_free(fsc_fsdp *f) {
    if (!f) return;
    for (int k = 0; f->units && k < f->nunits; k++) {
        fsdp_unit *u = &f->units[k];
        if (u->m)
            for (int kind = 0; kind < FSC_HOOK_KIND_COUNT; kind++)
                fsc_module_remove_hook(u->m, (fsc_hook_kind)kind, unit_hooks[kind], u);
        if (!u->rs_req || !fsc_request_wait(&u->rs_req)) { /* never free what MPI may write */
            fsc_mem_free(u->rs_in);
            fsc_mem_free(u->rs_out);
            fsdp_buf_put(f, u->full_grad, u->grad_cap);
            u->rs_in = u->rs_out = NULL;
        }
        fsdp_buf_put(f, u->own_grad, u->own_cap);
        if (u->entries) fsdp_release(u);
        if (u->entries) bind_grads(f, u, NULL);
        free(u->entries);
        free(u->offset);
    }
    for (int i = 0; i < f->nhooked; i++) {
        fsc_module_remove_hook(f->hooked[i], FSC_HOOK_POST_FORWARD, on_progress, f);
        fsc_module_remove_hook(f->hooked[i], FSC_HOOK_POST_BACKWARD, on_progress, f);
    }
    fsdp_buffers_free(f);
    fsc_optim_free(f->optim);
    fsc_partition_free(f->part);
    free(f->ranges);
    fsc_mem_free(f->data);
    fsc_mem_free(f->grad);
    free(f->hooked);
    free(f->order);
    free(f->units);
    free(f->unit_of);
    free(f->ps.entries);
    free(f);
}

/* ---- training ------------------------------------------------------------------------------- */

void fsc_fsdp_set_no_sync(fsc_fsdp *f, bool no_sync) {
    f->no_sync = no_sync;
}

int fsc_fsdp_clip_grad_norm(fsc_fsdp *f, float max_norm, bool inf_norm, float *total) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP clip: f must not be NULL");
    return sharded_clip_grad_norm(f->g, f->ranges, f->nranges, max_norm, inf_norm, total,
                                  "FSDP clip");
}

fsc_optim *fsc_fsdp_optim(fsc_fsdp *f) {
    return f ? f->optim : NULL;
}

int fsc_fsdp_step(fsc_fsdp *f) {
    if (!f) return fsc_error(FSC_ERR_INVALID, "FSDP step: f must not be NULL");
    if (f->no_sync)
        return fsc_error(FSC_ERR_INVALID, "FSDP step under no_sync: the gradient shards are "
                                          "not reduced yet (turn no_sync off for the last "
                                          "micro-batch)");
    return fsc_optim_step(f->optim);
}

void fsc_fsdp_zero_grad(fsc_fsdp *f) {
    if (f->grad) memset(f->grad, 0, (size_t)f->grad_total * sizeof(float));
    for (int k = 0; k < f->nunits; k++) {
        fsdp_unit *u = &f->units[k];
        u->grad_zero = true;
        if (u->full_grad && !u->rs_pending) { /* kept by no_sync */
            bind_grads(f, u, NULL);
            fsdp_buf_put(f, u->full_grad, u->grad_cap);
            u->full_grad = NULL;
        }
        fsdp_buf_put(f, u->own_grad, u->own_cap), u->own_grad = NULL; /* a failed backward's */
    }
}

const fsc_optim_range *fsc_fsdp_ranges(const fsc_fsdp *f, int *n) {
    *n = f->nranges;
    return f->ranges;
}

fsc_fsdp_stats fsc_fsdp_get_stats(const fsc_fsdp *f) {
    return f->stats;
}

int fsc_fsdp_unit_info(const fsc_fsdp *f, int unit, const char **name, int64_t *numel) {
    if (!f || unit < 0 || unit >= f->nunits)
        return fsc_error(FSC_ERR_INVALID, "FSDP: unit %d out of range", unit);
    if (name) *name = f->units[unit].name;
    if (numel) *numel = f->units[unit].padded;
    return FSC_OK;
}
