/* The balance of a GPT's pipeline (fsc/layout.h): layers per stage, counted
 * in quarters of a block so a stage may end inside one (.5 after its
 * attention half, .75 after its MLP's c_fc and GELU), turned into the parts
 * fsc_gpt_stage_parts_new makes stages of; "auto" times the layers (TP
 * stages over the mesh's TP group, under cp at this rank's positions with
 * the ring) and prints its choice in the same units. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/cp.h"
#include "fsc/pipe_schedule.h"
#include "gpt_layout_internal.h"

/* auto under tp: the TP stages timed over the mesh's TP group (borrowed).
 * With sequence_parallel or recompute_activation, where no cut falls
 * inside an MLP, whole layers are profiled and turned back into parts. */
typedef struct balance_tp {
    const fsc_tp_strategy_options *tp;
    fsc_tp_options opt;
    const fsc_gpt_config *cfg;
    bool whole_layers;
    void (*shape_at)(void *user, int layer, int64_t shape[FSC_MAX_DIMS]);
    void *shape_user;
} balance_tp;

static const char *const where_blocks_split =
    "a block splits at .5, after its attention half, or .75, after its MLP's c_fc and GELU";

/* "5.75,4.25" -> {23, 17}: exactly n positive counts in quarter layers. */
static int parse_quarters(const char *text, int n, int *q) {
    int k = 0;
    for (const char *p = text; *p && k <= n;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || (*end && *end != ',')) break;
        if (!(v >= 0.25 && v <= 1 << 20) || 4 * v != floor(4 * v))
            return fsc_error(FSC_ERR_INVALID,
                             "--balance \"%s\": stage %d's \"%.*s\" is not a positive layer count "
                             "in whole layers or quarters (%s)",
                             text, k, (int)(end - p), p, where_blocks_split);
        if (k < n) q[k] = (int)(4 * v);
        k++;
        p = *end ? end + 1 : end;
    }
    if (k != n || q[n - 1] < 1)
        return fsc_error(FSC_ERR_INVALID,
                         "--balance \"%s\": expected %d positive layer counts separated by commas "
                         "(one per stage; %s)",
                         text, n, where_blocks_split);
    return FSC_OK;
}

int gpt_layout_balance_parts(const char *text, const fsc_gpt_config *cfg, int S,
                             const char *no_mlp_cut, int **out) {
    const int n = fsc_gpt_num_layers(cfg);
    *out = NULL;
    if (!text && n < S)
        return fsc_error(FSC_ERR_INVALID,
                         "--pp: %d layers cannot fill %d stages evenly; give --balance "
                         "(blocks split at .5 and .75, e.g. 1.5,0.5,...)",
                         n, S);
    int *b = calloc((size_t)S, sizeof *b), rc = FSC_OK;
    if (!b) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (text)
        rc = parse_quarters(text, S, b);
    else
        for (int s = 0; s < S; s++) b[s] = 4 * (n / S + (s < n % S));
    text = text ? text : "even";
    int sum = 0, cut = 0, prev = 0;
    for (int s = 0; !rc && s < S; s++) sum += b[s];
    if (!rc && sum != 4 * n)
        rc = fsc_error(FSC_ERR_INVALID,
                       "--balance \"%s\": the stages hold %g layers, the model has %d (the "
                       "embedding, %d blocks, the head)",
                       text, sum / 4.0, n, cfg->layers);
    for (int s = 0; !rc && s < S; s++) {
        cut += b[s];
        int part;
        if (no_mlp_cut && cut % 4 == 3)
            rc = fsc_error(FSC_ERR_INVALID,
                           "--balance \"%s\": stage %d ends after %g layers, inside a block's MLP "
                           "(a .75 cut), which is not there with %s (cut at .5 or between blocks)",
                           text, s, cut / 4.0, no_mlp_cut);
        else if ((rc = fsc_gpt_part_of_cut(cfg, cut, &part)))
            rc = fsc_error_context(rc, "--balance \"%s\", the end of stage %d: ", text, s);
        else
            b[s] = part - prev, prev = part;
    }
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    return FSC_OK;
}

/* A TP stage of layers [first, end) of the pipe (parts, or whole layers
 * turned into parts), over the balance's own TP group. */
static fsc_module *tp_stage(void *user, int first, int end) {
    balance_tp *b = user;
    if (b->whole_layers && (fsc_gpt_part_of_cut(b->cfg, 4 * first, &first) ||
                            fsc_gpt_part_of_cut(b->cfg, 4 * end, &end)))
        return NULL;
    return b->tp->make_stage(b->tp->user, first, end, &b->opt);
}

static void tp_shape(void *user, int layer, int64_t shape[FSC_MAX_DIMS]) {
    const balance_tp *b = user;
    b->shape_at(b->shape_user, layer, shape);
}

static int balance_tp_begin(balance_tp *b, const fsc_tp_strategy_options *tp, fsc_group *tp_group,
                            const fsc_gpt_config *cfg, fsc_pipe_options *po) {
    *b = (balance_tp){.tp = tp,
                      .opt = {.group = tp_group,
                              .sequence_parallel = tp->sequence_parallel,
                              .recompute_attention = tp->recompute_attention,
                              .recompute_activation = tp->recompute_activation},
                      .cfg = cfg,
                      .whole_layers = tp->sequence_parallel || tp->recompute_activation,
                      .shape_at = po->act_shape_at,
                      .shape_user = po->stage_user};
    if (!tp_group) return fsc_error(FSC_ERR_INVALID, "--balance auto: no tensor-parallel group");
    if (b->whole_layers) /* no cut inside an MLP there: profile whole layers */
        po->layers = fsc_gpt_num_layers(cfg), po->act_shape_at = NULL;
    else if (po->act_shape_at)
        po->act_shape_at = tp_shape;
    po->make_stage = tp_stage, po->stage_user = b;
    po->tp = b->opt.group, po->seq_len = cfg->seq;
    return FSC_OK;
}

static int balance_tp_end(balance_tp *b, int *balance, int S) {
    b->opt.group = NULL; /* the mesh's */
    int rc = FSC_OK;
    for (int s = 0, cut = 0, prev = 0, part; balance && b->whole_layers && !rc && s < S; s++) {
        cut += balance[s]; /* whole layers -> parts */
        rc = fsc_gpt_part_of_cut(b->cfg, 4 * cut, &part);
        if (!rc) balance[s] = part - prev, prev = part;
    }
    return rc;
}

void gpt_layout_tp_act_shape(void *plan, int part, int64_t shape[FSC_MAX_DIMS]) {
    const fsc_gpt_plan *p = plan;
    shape[2] = fsc_tp_gpt_part_width(&p->cfg, p->layout.tp, part);
}

void gpt_layout_parts_act_shape(void *cfg, int part, int64_t shape[FSC_MAX_DIMS]) {
    shape[2] = fsc_gpt_part_width(cfg, part);
}

static void balance_print(FILE *f, const fsc_gpt_config *cfg, const int *parts, int S,
                          const fsc_pipe_balance_report *rep) {
    double worst = 0, sum = 0;
    for (int s = 0; s < S && s < FSC_PIPE_MAX_STAGES; s++) {
        sum += rep->stage_seconds[s];
        if (rep->stage_seconds[s] > worst) worst = rep->stage_seconds[s];
    }
    fprintf(f, "--balance auto:");
    for (int s = 0, part = 0; s < S; s++) { /* parts back to layers, quarters inside a block */
        const int q0 = fsc_gpt_cut_of_part(cfg, part);
        part += parts[s];
        fprintf(f, "%s%g", s ? "," : " ", (fsc_gpt_cut_of_part(cfg, part) - q0) / 4.0);
    }
    fprintf(f, " layers per stage; predicted per micro-batch:");
    for (int s = 0; s < S && s < FSC_PIPE_MAX_STAGES; s++) /* each stage named, apart */
        fprintf(f, "%s stage %d %.1f ms / %.0f MiB", s ? "," : "", s, 1e3 * rep->stage_seconds[s],
                rep->stage_bytes[s] / 1048576.0);
    fprintf(f, "; slowest stage %.2f x the mean\n", worst / (sum / S));
}

int gpt_layout_balance_auto(fsc_gpt_plan *p, const fsc_optim_config *optim,
                            fsc_strategy_options *so) {
    const fsc_gpt_layout *l = &p->layout;
    const int S = l->pp * so->pipe.chunks;
    fsc_pipe_schedule *sched;
    int rc =
        fsc_pipe_schedule_make(so->pipe.schedule, l->pp, so->pipe.chunks, l->micro_batches, &sched);
    if (rc) return rc;
    fsc_pipe_options po = {.layers = so->pipe.layers,
                           .make_stage = so->pipe.make_stage,
                           .stage_user = so->pipe.stage_user,
                           .act_ndim = so->pipe.act_ndim,
                           .act_shape_at = so->pipe.act_shape_at,
                           .seed = l->seed};
    memcpy(po.act_shape, so->pipe.act_shape, sizeof po.act_shape);
    fsc_pipe_balance_report rep;
    balance_tp tp = {0};
    if (!(p->balance = calloc((size_t)S, sizeof *p->balance)))
        rc = fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (!rc && l->tp > 1)
        rc = balance_tp_begin(&tp, &so->tp, fsc_mesh_group(p->mesh, FSC_MESH_TP), &p->cfg, &po);
    if (!rc && p->cp) /* each layer at this rank's positions, attention round the cp ring */
        po.seq = fsc_cp_seq(p->cp), po.seq_len = p->cfg.seq / l->cp;
    if (!rc) /* every rank of the layout times every layer */
        rc = fsc_pipe_balance_auto(fsc_mesh_parent(p->mesh), &po, sched, p->cfg.vocab,
                                   optim ? fsc_optim_state_count(optim) : 2, p->balance, &rep);
    if (l->tp > 1) {
        int end = balance_tp_end(&tp, rc ? NULL : p->balance, S);
        rc = rc ? rc : end;
    }
    fsc_pipe_schedule_free(sched);
    fsc_cp_reset_stats(p->cp); /* the ring's figures are training's */
    if (rc) return rc;
    so->pipe.balance = p->balance;
    if (fsc_dist_rank() == 0 && l->balance_out)
        balance_print(l->balance_out, &p->cfg, p->balance, S, &rep);
    return FSC_OK;
}
