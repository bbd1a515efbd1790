/* Deferred weight gradients: a zero-bubble pipeline splits each backward
 * into the input gradient (B), which the previous stage waits for, and the
 * weight gradients (W), which can fill the pipeline's bubbles. Modules whose
 * weight gradients are GEMMs record their arguments here during B; W runs
 * them. The list and its records live in the micro-batch's arena. */
#include "fsc/kernels.h"
#include "fsc/nn.h"

typedef struct record {
    struct record *next;
    float *dweight, *dbias;
    const float *dout, *inp, *weight;
    int N, C, OC, layout;
    fsc_gemm_prec prec;
} record;

struct fsc_deferred {
    fsc_arena *arena;
    record *head, *tail;
};

fsc_deferred *fsc_deferred_new(fsc_arena *a) {
    fsc_deferred *d = a ? fsc_arena_alloc(a, sizeof *d) : NULL;
    if (!d) {
        fsc_error(FSC_ERR_NOMEM, "deferred weight gradients: out of memory");
        return NULL;
    }
    *d = (fsc_deferred){.arena = a};
    return d;
}

int fsc_deferred_matmul_prec(fsc_deferred *d, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC,
                             int layout, fsc_gemm_prec prec) {
    record *r = fsc_arena_alloc(d->arena, sizeof *r);
    if (!r) return fsc_error(FSC_ERR_NOMEM, "deferred weight gradients: out of memory");
    *r = (record){.dweight = dweight,
                  .dbias = dbias,
                  .dout = dout,
                  .inp = inp,
                  .weight = weight,
                  .N = N,
                  .C = C,
                  .OC = OC,
                  .layout = layout,
                  .prec = prec};
    if (d->tail)
        d->tail->next = r;
    else
        d->head = r;
    d->tail = r;
    return FSC_OK;
}

int fsc_deferred_matmul(fsc_deferred *d, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC, int layout) {
    return fsc_deferred_matmul_prec(d, dweight, dbias, dout, inp, weight, N, C, OC, layout,
                                    FSC_GEMM_F32);
}

void fsc_deferred_run(fsc_deferred *d) {
    if (!d) return;
    for (const record *r = d->head; r; r = r->next)
        fsc_matmul_backward_prec(NULL, r->dweight, r->dbias, r->dout, r->inp, r->weight, r->N, r->C,
                                 r->OC, (fsc_weight_layout)r->layout, r->prec);
    d->head = d->tail = NULL;
}
