/* Context parallelism on a layout (fsc/layout.h, fsc/cp.h): the checks of
 * what it runs with, the ring over the mesh's cp group, and the data and
 * loss of a micro-batch under it.
 *
 * The one idea: the strategy sees dp x cp ranks as its data-parallel group
 * (fsc_mesh_dp_cp), which is what the gradients need (summed over every
 * rank that saw other tokens of the step), while the data belong to the
 * replicas: the cp ranks of replica d read replica d's micro-batch, the one
 * a dp-only run would, and each keeps its positions of it. Counting the cp
 * ranks in the world, targets_per_sample is T / cp, so the trainer's
 * normaliser stays the global count of targets. Under a pipeline the same
 * holds stage by stage: each stage's ranks form its own ring (the mesh's cp
 * group), stage 0 reads this rank's positions, the last stage's loss takes
 * the targets at them, and the trainer runs every stage under the split. */
#include <stdlib.h>

#include "fsc/cp.h"
#include "fsc/io.h"
#include "fsc/moe.h"
#include "fsc/tp.h"
#include "gpt_layout_internal.h"

int gpt_layout_cp_setup(fsc_gpt_plan *p) {
    const fsc_gpt_layout *l = &p->layout;
    const int cp = l->cp > 1 ? l->cp : 1, mesh_cp = fsc_mesh_size(p->mesh, FSC_MESH_CP);
    if (cp == 1 && mesh_cp <= 1) return FSC_OK;
    if (mesh_cp != cp)
        return fsc_error(FSC_ERR_INVALID,
                         "context parallelism: the layout asks for cp %d but the mesh has cp %d "
                         "(build it with fsc_mesh_shape.cp)",
                         cp, mesh_cp);
    const char *why = l->sequence_parallel ? "sequence parallelism (--sequence-parallel)"
                      : l->threads > 1     ? "a row of threads"
                      : p->cfg.moe && p->cfg.moe->experts > 0 ? "Mixture-of-Experts layers"
                                                              : NULL;
    if (why)
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "context parallelism (--cp %d) does not run with %s yet; it runs under "
                         "ddp, oss, sdp and fsdp, with or without --tp and --pp",
                         cp, why);
    if (!(p->cp = fsc_cp_new(fsc_mesh_group(p->mesh, FSC_MESH_CP), p->cfg.seq)))
        return fsc_error_context(FSC_ERR_INVALID, "--cp %d: ", cp);
    return FSC_OK;
}

fsc_micro_batch fsc_gpt_plan_data_batch(const fsc_gpt_plan *p, const fsc_micro_batch *mb) {
    fsc_micro_batch d = *mb;
    if (!p->cp) return d;
    const int cp = p->layout.cp;
    d.rank = mb->rank / cp, d.world = mb->world / cp;
    d.sample0 = fsc_batch_first_sample(mb->step, mb->micro, d.rank, mb->batch, mb->micros, d.world);
    return d;
}

int fsc_gpt_plan_train_micro(fsc_gpt_plan *p, fsc_module *m, const fsc_ctx *ctx,
                             const fsc_micro_batch *mb, const int32_t *x, const int32_t *y,
                             float *loss) {
    const int T = p->cfg.seq, tp = p->layout.tp;
    x += (size_t)mb->row0 * T, y += (size_t)mb->row0 * T;
    if (!p->cp)
        return tp > 1 ? fsc_tp_gpt_train_micro(m, ctx, x, y, mb->rows, T, -1, mb->norm, loss)
                      : fsc_gpt_train_micro(m, ctx, x, y, mb->rows, T, -1, mb->norm, loss);
    const int S = T / p->layout.cp;
    int rc = gpt_layout_cp_take(p, x, y, mb->rows);
    if (rc) return rc;
    fsc_ctx c = *ctx;
    c.seq = fsc_cp_seq(p->cp);
    c.sample0 = fsc_gpt_plan_data_batch(p, mb).sample0 + mb->row0; /* the replica's rows */
    return tp > 1 ? fsc_tp_gpt_train_micro(m, &c, p->cx, p->cy, mb->rows, S, -1, mb->norm, loss)
                  : fsc_gpt_train_micro(m, &c, p->cx, p->cy, mb->rows, S, -1, mb->norm, loss);
}

int gpt_layout_cp_take(fsc_gpt_plan *p, const int32_t *x, const int32_t *y, int rows) {
    const int S = p->cfg.seq / p->layout.cp;
    if (!p->cx) { /* the layout's micro-batch is fixed: its rows of positions, once */
        p->cx = malloc(sizeof *p->cx * (size_t)p->layout.batch * S);
        p->cy = malloc(sizeof *p->cy * (size_t)p->layout.batch * S);
        if (!p->cx || !p->cy) return fsc_error(FSC_ERR_NOMEM, "context parallelism: out of memory");
    }
    if (rows > p->layout.batch)
        return fsc_error(FSC_ERR_INVALID, "context parallelism: %d rows, the layout's batch is %d",
                         rows, p->layout.batch);
    if (x) fsc_cp_take(p->cp, x, rows, p->cx);
    if (y) fsc_cp_take(p->cp, y, rows, p->cy);
    return FSC_OK;
}

/* Under a pipeline the trainer runs the stages itself: the cp ranks of a
 * replica share its micro-batch's samples, so dropout keys count replicas. */
static int64_t pipe_sample0(const fsc_micro_batch *mb, void *user) {
    return fsc_gpt_plan_data_batch(user, mb).sample0;
}

void gpt_layout_cp_pipe(fsc_gpt_plan *p, fsc_trainer_config *cfg) {
    if (!p->cp || p->layout.pp < 2) return;
    cfg->pipe_seq = fsc_cp_seq(p->cp);
    cfg->pipe_sample0 = pipe_sample0;
}

int fsc_gpt_plan_targets_per_sample(const fsc_gpt_plan *p) {
    return p->cp ? p->cfg.seq / p->layout.cp : p->cfg.seq;
}

struct fsc_cp *fsc_gpt_plan_cp(const fsc_gpt_plan *p) {
    return p ? p->cp : NULL;
}
