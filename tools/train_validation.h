/* fsc-train --eval-every: the held-out data (--val-data, llm.c's *_val
 * shards beside the training ones, or the tail of --data) and its mean loss
 * after a step (train_validation.c). */
#ifndef FSC_TOOLS_TRAIN_VALIDATION_H
#define FSC_TOOLS_TRAIN_VALIDATION_H

#include "train_common.h"

/* The held-out tokens and the latest validation loss. */
typedef struct {
    bool on;           /* --eval-every > 0 */
    fsc_tokens tokens; /* held-out stream */
    char *train_spec;  /* --data without its llm.c validation shards (NULL: unchanged) */
    char *val_spec;    /* the validation shards found (NULL: none) */
    char source[200];  /* what the held-out data is, for messages */
    double loss;       /* latest (NAN before the first) */
    int64_t step;      /* after which step */
    double seconds;    /* the latest evaluation's wall time */
    int seq;           /* tokens per sequence, for its batches */
} validation;

/* llm.c writes *_train*.bin and *_val*.bin shards side by side: a --data
 * glob keeps the training ones (v->train_spec, unless it matched validation
 * shards only), and the validation ones, or those in the training shards'
 * directories, become the default held-out data (v->val_spec). */
int validation_find_shards(const train_options *o, validation *v);
/* The held-out stream: --val-data, the validation shards, or the tail of
 * the training stream (which training then no longer sees). */
int validation_load(trainer *t, const fsc_bpe *bpe, validation *v);
/* The mean loss over --eval-batches global batches, after step `step`. */
int validation_run(trainer *t, validation *v, int64_t step);
/* Frees what the functions above allocated. */
void validation_free(validation *v);

#endif
