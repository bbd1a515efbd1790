/* Top-2 routing (GShard's top2gating, without the noise): softmax gates,
 * first and second choices, positions by running counts in token order,
 * capacity drops, combine weights and the load-balancing loss of each row,
 * and the gradient of all of it with respect to the gate logits. The
 * choices, positions and drops are piecewise constant in the logits; the
 * gradient flows through the kept choices' gates and through l_aux's mean
 * gate probabilities, as in FairScale. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "moe_internal.h"

int moe_capacity(float factor, int T, int E) {
    int cap = (int)ceil((double)factor * T / E);
    return cap < 1 ? 1 : cap;
}

static void *take(fsc_arena *a, size_t n, size_t elem, int *rc) {
    void *p = *rc ? NULL : fsc_arena_alloc(a, n * elem);
    if (!p && !*rc) *rc = FSC_ERR_NOMEM;
    return p;
}

/* The best expert of g (E) other than `skip` (-1: none); ties go to the lower. */
static int32_t argmax_except(const float *g, int E, int skip) {
    int32_t best = -1;
    for (int e = 0; e < E; e++)
        if (e != skip && (best < 0 || g[e] > g[best])) best = e;
    return best;
}

int moe_route_forward(moe_route *r, const float *logits, int B, int T, int E, int cap,
                      fsc_arena *a) {
    const int64_t N = (int64_t)B * T;
    int rc = FSC_OK;
    *r = (moe_route){.B = B, .T = T, .E = E, .cap = cap};
    r->gates = take(a, (size_t)(N * E), sizeof(float), &rc);
    r->e1 = take(a, (size_t)N, sizeof(int32_t), &rc);
    r->e2 = take(a, (size_t)N, sizeof(int32_t), &rc);
    r->loc1 = take(a, (size_t)N, sizeof(int32_t), &rc);
    r->loc2 = take(a, (size_t)N, sizeof(int32_t), &rc);
    r->c1 = take(a, (size_t)N, sizeof(float), &rc);
    r->c2 = take(a, (size_t)N, sizeof(float), &rc);
    r->ce = take(a, (size_t)B * E, sizeof(float), &rc);
    int32_t *count = take(a, (size_t)E * 2, sizeof(int32_t), &rc); /* firsts, seconds */
    double *me = take(a, (size_t)E, sizeof(double), &rc);
    if (rc) return rc;
    fsc_softmax_forward(r->gates, logits, (int)N, E);
    for (int b = 0; b < B; b++) {
        int32_t *firsts = count, *seconds = count + E;
        memset(count, 0, sizeof(int32_t) * 2 * (size_t)E);
        for (int e = 0; e < E; e++) me[e] = 0;
        for (int64_t t = (int64_t)b * T; t < (int64_t)(b + 1) * T; t++) {
            const float *g = r->gates + t * E;
            r->e1[t] = argmax_except(g, E, -1);
            r->e2[t] = argmax_except(g, E, r->e1[t]);
            r->loc1[t] = firsts[r->e1[t]]++;
            for (int e = 0; e < E; e++) me[e] += g[e];
        }
        /* second choices queue behind every first choice of the row */
        for (int64_t t = (int64_t)b * T; t < (int64_t)(b + 1) * T; t++)
            r->loc2[t] = firsts[r->e2[t]] + seconds[r->e2[t]]++;
        double aux = 0;
        for (int e = 0; e < E; e++) {
            r->ce[b * E + e] = (float)firsts[e] / (float)T;
            aux += (double)r->ce[b * E + e] * (me[e] / T);
        }
        r->aux_sum += aux; /* E * mean_e(ce * me) = sum_e ce * me */
        for (int64_t t = (int64_t)b * T; t < (int64_t)(b + 1) * T; t++) {
            const float *g = r->gates + t * E;
            if (r->loc1[t] >= cap) r->loc1[t] = -1, r->dropped1++;
            if (r->loc2[t] >= cap) r->loc2[t] = -1, r->dropped2++;
            float w1 = r->loc1[t] >= 0 ? g[r->e1[t]] : 0.f,
                  w2 = r->loc2[t] >= 0 ? g[r->e2[t]] : 0.f;
            float den = fmaxf(w1 + w2, FLT_EPSILON);
            r->c1[t] = w1 / den, r->c2[t] = w2 / den;
        }
    }
    return FSC_OK;
}

void moe_route_backward(float *dlogits, const moe_route *r, const float *dc1, const float *dc2,
                        float aux_scale) {
    const int E = r->E, T = r->T;
    const int64_t N = (int64_t)r->B * T;
    for (int64_t t = 0; t < N; t++) {
        const float *g = r->gates + t * E;
        const float *ce = r->ce + (t / T) * E;
        float *dl = dlogits + t * E; /* dL/dgates first, then through the softmax */
        for (int e = 0; e < E; e++) dl[e] = aux_scale * ce[e] / (float)T;
        float w1 = r->loc1[t] >= 0 ? g[r->e1[t]] : 0.f, w2 = r->loc2[t] >= 0 ? g[r->e2[t]] : 0.f;
        float den = w1 + w2;
        if (den >= FLT_EPSILON) { /* c1 = w1/den, c2 = w2/den */
            float d = (dc1[t] - dc2[t]) / (den * den);
            if (r->loc1[t] >= 0) dl[r->e1[t]] += d * w2;
            if (r->loc2[t] >= 0) dl[r->e2[t]] -= d * w1;
        } else { /* the clamp: c_i = w_i / eps, and both w are 0 when dropped */
            if (r->loc1[t] >= 0) dl[r->e1[t]] += dc1[t] / FLT_EPSILON;
            if (r->loc2[t] >= 0) dl[r->e2[t]] += dc2[t] / FLT_EPSILON;
        }
        double dot = 0;
        for (int e = 0; e < E; e++) dot += (double)g[e] * dl[e];
        for (int e = 0; e < E; e++) dl[e] = g[e] * (dl[e] - (float)dot);
    }
}
