/* Internal view of a pipeline schedule, shared by the table (pipe_schedule.c),
 * the generators and lowering (pipe_schedule_gen.c), the validator
 * (pipe_validate.c) and the text forms (pipe_text.c). A schedule is nothing
 * but the config and one growable action list per rank.
 */
#ifndef FSC_PIPE_SCHEDULE_INTERNAL_H
#define FSC_PIPE_SCHEDULE_INTERNAL_H

#include "fsc/pipe_schedule.h"

struct fsc_pipe_schedule {
    fsc_pipe_config cfg;
    int kind;               /* fsc_pipe_kind, or -1 when a user wrote it */
    int *count, *cap;       /* per rank */
    fsc_pipe_action **acts; /* per rank, count[r] actions in program order */
};

/* FSC_ERR_INVALID naming the bad field, or 0. */
int fsc_pipe_sched_check_config(fsc_pipe_config cfg);
/* An empty schedule of cfg (already checked). */
int fsc_pipe_sched_alloc(fsc_pipe_config cfg, int kind, fsc_pipe_schedule **out);
/* Appends one action to rank r's list. */
int fsc_pipe_sched_push(fsc_pipe_schedule *s, int r, fsc_pipe_op op, int stage, int micro);
/* Whether any rank holds a send or receive. */
bool fsc_pipe_sched_has_comm(const fsc_pipe_schedule *s);

/* The validator, which also times every action: when start is not NULL it
 * receives, per rank r, the start time of each action at start[r][k] (the
 * caller sizes start[r] by count[r]), and cost[r][k] its duration. */
int fsc_pipe_sched_simulate(const fsc_pipe_schedule *s, const fsc_pipe_costs *costs,
                            fsc_pipe_stats *stats, fsc_pipe_rank_stats *per_rank, long long **start,
                            int **cost);

#endif
