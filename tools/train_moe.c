/* fsc-train and fsc-bench with --moe-experts: the flags' checks, the MoE
 * options the GPT is built with (experts spread over the layout's dp group
 * under ddp, all in this process otherwise), and the routing report. */
#include "train_common.h"

int train_moe_check(const train_options *o) {
    if (!o->moe_experts) return FSC_OK;
    /* the ranges are train_options.c's; what they cannot say: */
    if (o->moe_experts == 1)
        return fsc_error(FSC_ERR_INVALID, "--moe-experts 1: expected 0 (dense) or at least 2");
    if (!(o->moe_capacity > 0))
        return fsc_error(FSC_ERR_INVALID, "--moe-capacity %g must be > 0", o->moe_capacity);
    if (o->moe_every > o->model.layers)
        return fsc_error(FSC_ERR_INVALID, "--moe-every %d is more than --layers %d: no MoE block",
                         o->moe_every, o->model.layers);
    if (o->pp > 1 || o->tp > 1)
        return fsc_error(FSC_ERR_INVALID,
                         "--moe-experts does not run with --%s yet (experts compose with "
                         "--strategy ddp only)",
                         o->pp > 1 ? "pp" : "tp");
    /* experts are spread over a row that all-reduces (ddp), or all here */
    if (!fsc_strategy_all_reduces(o->strategy) && !fsc_strategy_is_single(o->strategy))
        return fsc_error(FSC_ERR_INVALID,
                         "--moe-experts runs under --strategy ddp (experts spread over the "
                         "ranks) or single, not %s",
                         o->strategy);
    return FSC_OK;
}

int train_moe_setup(trainer *t) {
    train_options *o = &t->opt;
    if (!o->moe_experts) return FSC_OK;
    t->moe = (fsc_moe_options){.experts = o->moe_experts,
                               .every = o->moe_every,
                               .capacity_factor = (float)o->moe_capacity,
                               .aux_coef = (float)o->moe_aux_coef,
                               .hidden = o->moe_hidden};
    /* experts spread over the layout's data-parallel ranks (no --pp, --tp here) */
    fsc_group *dp = fsc_mesh_group(t->mesh, FSC_MESH_DP);
    const int world = dp ? fsc_group_size(dp) : 1;
    if (fsc_strategy_all_reduces(o->strategy) && world > 1) {
        if (o->moe_experts % world)
            return fsc_error(FSC_ERR_INVALID,
                             "--moe-experts %d must be a multiple of the %d ranks (each holds "
                             "the same number of experts)",
                             o->moe_experts, world);
        int rc = fsc_moe_ep_exchange(dp, &t->moe.ep);
        if (rc) return rc;
    }
    o->model.moe = &t->moe;
    return FSC_OK;
}

void train_moe_report(const trainer *t, double seconds, FILE *f) {
    const train_options *o = &t->opt;
    if (!o->moe_experts) return;
    fsc_moe_stats st = fsc_moe_get_stats(t->model);
    fprintf(f,
            "moe        %d experts every %d blocks (capacity %g, over %d rank%s): %.1f%% of "
            "first and %.1f%% of second choices dropped, mean l_aux %.4f; all-to-all %.1f%% "
            "of step time (rank 0)\n",
            o->moe_experts, o->moe_every, o->moe_capacity,
            t->moe.ep.ranks > 1 ? t->moe.ep.ranks : 1, t->moe.ep.ranks > 1 ? "s" : "",
            st.tokens ? 100.0 * (double)st.dropped1 / (double)st.tokens : 0,
            st.tokens ? 100.0 * (double)st.dropped2 / (double)st.tokens : 0,
            st.rows ? st.aux_sum / (double)st.rows : 0,
            seconds > 0 ? 100 * st.exchange_s / seconds : 0);
}
