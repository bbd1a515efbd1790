/* fsc pipe_schedule: pipeline-parallel schedules as data (issue 11).
 *
 * A schedule is a plain table: for each pipeline rank, the ordered list of
 * actions it runs in one training step. Generators write the compute actions
 * of the known schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1); a lowering
 * pass adds the sends and receives; one validator checks every table, whoever
 * wrote it (a generator or a user's CSV file), by simulating all ranks, and
 * reports the activation memory and idle time each rank will see. The
 * executor then interprets the table with point-to-point messages and makes
 * no scheduling decision of its own. No MPI, no tensors here.
 *
 * Layout. p ranks, v model chunks per rank, S = p * v stages, m micro-batches.
 * Stage s is chunk s / p of rank s % p (Megatron's looping placement; for
 * v = 1 stage s is rank s). Stage 0 takes the input, stage S-1 the loss.
 *
 * Actions, and their text form `<stage><OP><micro>` (decimal stage and micro,
 * OP in capitals, no spaces):
 *   F       `2F5`      forward of stage 2 on micro-batch 5
 *   B       `2B5`      backward of stage 2 on micro-batch 5: the input
 *                      gradient only when the schedule splits backward (then
 *                      a W follows), the full backward (input and weight
 *                      gradients) when it does not
 *   W       `2W5`      weight gradient of stage 2, micro-batch 5 (split only)
 *   SEND_F  `2SEND_F5` send stage 2's output activation to stage 3
 *   RECV_F  `3RECV_F5` receive stage 3's input activation from stage 2
 *   SEND_B  `3SEND_B5` send stage 3's input gradient to stage 2
 *   RECV_B  `2RECV_B5` receive stage 2's output gradient from stage 3
 * The stage of a send is the stage that produced the data; the stage of a
 * receive is the stage that consumes it (as in PyTorch's pipelining), so
 * `2SEND_F5` on rank 2 % p pairs with `3RECV_F5` on rank 3 % p. Messages exist
 * only between stages on different ranks: with p = 1 there are none.
 *
 * The executor's contract (what the validator's simulation assumes):
 *  - each rank runs its list in order, one action at a time;
 *  - a SEND is non-blocking: post it (MPI_Isend) and go on; keep its buffer
 *    alive and complete it later, at the latest at the end of the step, but
 *    never wait for it before a later receive of the same rank;
 *  - a RECV must have completed before the rank goes past it. The executor
 *    may post the receive earlier (MPI_Irecv as soon as a buffer is free) and
 *    wait for it here: the result is the same;
 *  - messages are matched by fsc_pipe_action_tag, not by arrival order, so
 *    two messages between the same pair of ranks can never be confused.
 * A schedule that passes fsc_pipe_schedule_validate cannot deadlock under
 * this contract, and every compute action finds its input on its own rank.
 */
#ifndef FSC_PIPE_SCHEDULE_H
#define FSC_PIPE_SCHEDULE_H

#include <stdio.h>

#include "fsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The generated schedules. */
typedef enum {
    FSC_PIPE_GPIPE = 0,   /* fill-drain: all forwards, then all backwards (reverse micro order) */
    FSC_PIPE_1F1B,        /* PipeDream-flush / Megatron non-interleaved */
    FSC_PIPE_INTERLEAVED, /* Megatron's interleaved 1F1B, v >= 2 chunks per rank */
    FSC_PIPE_ZB_H1,       /* zero-bubble H1 (Qi et al. 2023): split backward, W fills bubbles */
    FSC_PIPE_KIND_COUNT
} fsc_pipe_kind;

/* The kinds of action (see the text forms above). */
typedef enum {
    FSC_PIPE_F = 0,
    FSC_PIPE_B,
    FSC_PIPE_W,
    FSC_PIPE_SEND_F,
    FSC_PIPE_RECV_F,
    FSC_PIPE_SEND_B,
    FSC_PIPE_RECV_B,
    FSC_PIPE_OP_COUNT
} fsc_pipe_op;

/* One action: op on stage `stage` for micro-batch `micro`. */
typedef struct {
    fsc_pipe_op op;
    int stage, micro;
} fsc_pipe_action;

/* The shape of a schedule: p = ranks, v = chunks per rank, m = micros.
 * split_backward: B is the input gradient only and each (stage, micro) also
 * has a W; otherwise B is the full backward and a W is an error.
 * forward_only: an evaluation pass; each (stage, micro) has one F and
 * nothing else (a B, W, SEND_B or RECV_B is an error). */
typedef struct {
    int ranks, chunks, micros;
    bool split_backward;
    bool forward_only;
} fsc_pipe_config;

/* Time units of the validator's cost model, per action of one stage (one
 * chunk under interleaving). Zero fields take the defaults: f = 1, w = 1,
 * b = 1 when backward is split and b = 2 when it is not (B then holds the
 * work of B + W). Sends and receives cost 0. */
typedef struct {
    int f, b, w;
} fsc_pipe_costs;

/* What the simulation measured on one rank. */
typedef struct {
    long long busy;      /* time units spent computing */
    long long idle;      /* makespan - busy: all waiting, at the start and the end too */
    long long end;       /* when the rank's last action finishes */
    double bubble;       /* idle / makespan */
    int peak_inflight;   /* most (stage, micro) pairs with F done and B not yet: activations held */
    int peak_inflight_w; /* the same until W (split; = peak_inflight otherwise): W needs them too */
} fsc_pipe_rank_stats;

/* What the simulation measured on the whole pipeline. */
typedef struct {
    long long makespan;        /* when the last rank finishes (time units) */
    double bubble;             /* sum of idle / (ranks x makespan) */
    double theoretical_bubble; /* the kind's formula (fsc_pipe_kind_bubble), -1 if none */
    int peak_inflight;         /* max over ranks */
    int peak_inflight_w;       /* max over ranks */
    int actions;               /* all actions, communication included */
    int messages;              /* send/receive pairs */
} fsc_pipe_stats;

/* An opaque schedule: the config and each rank's action list. */
typedef struct fsc_pipe_schedule fsc_pipe_schedule;

/* Longest text form of an action, with its terminating NUL. */
#define FSC_PIPE_ACTION_TEXT 32

/* "gpipe", "1f1b", "interleaved", "zbh1" (static storage); "?" outside the enum. */
FSC_API const char *fsc_pipe_kind_name(fsc_pipe_kind kind);
/* Parses "gpipe", "1f1b", "interleaved" or "zbh1" (any case) into *out;
 * "zb1" is an alias of "zbh1", the flag's earlier spelling, which configs
 * and checkpoints written with it still hold. FSC_ERR_INVALID naming the
 * accepted names for anything else, and for NULL arguments; *out is
 * untouched then. */
FSC_API int fsc_pipe_kind_parse(const char *name, fsc_pipe_kind *out);
/* The ideal bubble fraction of `kind` at this shape under the default costs
 * (idle / makespan, no communication time): (p-1)/(m+p-1) for GPipe and
 * 1F1B, (p-1)/(v*m+p-1) for interleaved (chunk costs F = 1, B = 2), and for
 * ZB-H1 (F = B = W = 1) (T - 3m)/T with makespan T = 3m + p - 1 when m >= p
 * (the paper's (p-1)(F+B-W) bubble) and T = 2m + 2p - 1 when m < p (the
 * first B reaches rank 0 at 2p - 1). -1 for a bad kind or shape. */
FSC_API double fsc_pipe_kind_bubble(fsc_pipe_kind kind, int ranks, int chunks, int micros);

/* Writes the text form of a ("0F3", "2SEND_B1") into buf (size bytes,
 * FSC_PIPE_ACTION_TEXT always suffices) and returns its length; a negative
 * status (FSC_ERR_INVALID) for a bad op, a negative stage or micro, a NULL
 * buf or a buf too small (then buf holds "" if size > 0). */
FSC_API int fsc_pipe_action_format(fsc_pipe_action a, char *buf, size_t size);
/* Parses one action in text form, the whole string (no spaces), into *out.
 * FSC_ERR_FORMAT quoting the text for anything else (unknown op, missing or
 * over-long numbers: at most 9 digits each); FSC_ERR_INVALID for NULL. */
FSC_API int fsc_pipe_action_parse(const char *text, fsc_pipe_action *out);

/* Generates `kind` for ranks x chunks x micros, lowers it (sends and
 * receives) and validates it; the caller owns *out (fsc_pipe_schedule_free).
 * chunks 0 means 1, or 2 for interleaved. FSC_ERR_INVALID, *out untouched, for
 * NULL out, ranks outside [1, 4096], micros outside [1, 2^20], chunks other
 * than 1 except for interleaved (2..64), more than 2^20 stage x micro pairs,
 * and for interleaved with micros not a multiple of ranks (Megatron's order
 * needs whole groups of p micro-batches). split_backward is set for ZB-H1. */
FSC_API int fsc_pipe_schedule_make(fsc_pipe_kind kind, int ranks, int chunks, int micros,
                                   fsc_pipe_schedule **out);
/* The forward-only schedule of an evaluation pass (cfg.forward_only), lowered
 * and validated: rank r runs F of its stages for groups of p micro-batches,
 * chunk by chunk (Megatron's interleaved order; with one chunk, micro-batch
 * by micro-batch), so each rank works on the next micro-batch while later
 * stages take the previous one: makespan v m + p - 1 when p divides m (F =
 * 1). Limits and errors as fsc_pipe_schedule_make (any micros, chunks
 * 1..64; chunks 0 means 1). The caller owns *out. */
FSC_API int fsc_pipe_schedule_make_forward(int ranks, int chunks, int micros,
                                           fsc_pipe_schedule **out);
/* A schedule holding a copy of the caller's lists: counts[r] actions at
 * acts[r] for each rank r < cfg.ranks (acts[r] may be NULL when counts[r] is
 * 0). Nothing is checked beyond the config (limits as in make) and the
 * counts: validate before use. FSC_ERR_INVALID for a bad config, NULL
 * arguments or a negative count; FSC_ERR_NOMEM. The caller owns *out. */
FSC_API int fsc_pipe_schedule_new(fsc_pipe_config cfg, const int *counts,
                                  const fsc_pipe_action *const *acts, fsc_pipe_schedule **out);
/* Adds the communication in place: after each F or B whose result another
 * rank consumes, its SEND; before each F or B that consumes another rank's
 * result, its RECV. FSC_ERR_INVALID (s unchanged) if s already holds a send
 * or receive, or is NULL; FSC_ERR_NOMEM. Does not validate. */
FSC_API int fsc_pipe_schedule_lower(fsc_pipe_schedule *s);
/* Checks s and simulates it; 0 if it is a correct program, otherwise
 * FSC_ERR_INVALID with a message naming the rank, the position (0-based
 * index in the rank's list) and the action in text form:
 *  - an action out of range, on the wrong rank, or a send/receive between
 *    stages on one rank or past either end of the pipeline;
 *  - a W when backward is not split; a B, W or gradient message in a
 *    forward-only schedule; a (stage, micro) without exactly one F, one B
 *    (not forward-only) and (split only) one W; a duplicated action;
 *  - a send without its receive on the consuming rank, or the reverse;
 *  - a dependency that does not come earlier on the rank: F(s,i) needs
 *    F(s-1,i) or its RECV_F, B(s,i) needs F(s,i) and B(s+1,i) or its RECV_B
 *    (not on the last stage), W(s,i) needs B(s,i), a send needs the action
 *    that produces its data;
 *  - a deadlock: ranks run their lists with non-blocking sends and receives
 *    that wait for their send; if none can move, the message names each stuck
 *    rank, its action and what it waits for.
 * costs: NULL or zero fields for the defaults. A correct schedule fills
 * *stats and per_rank[0 .. ranks) when not NULL (left untouched on failure).
 * FSC_ERR_INVALID also for NULL s or negative costs. */
FSC_API int fsc_pipe_schedule_validate(const fsc_pipe_schedule *s, const fsc_pipe_costs *costs,
                                       fsc_pipe_stats *stats, fsc_pipe_rank_stats *per_rank);

/* Parses CSV text: one line per rank, in rank order, each a comma-separated
 * list of actions in text form. Spaces around a cell, empty cells (idle slots
 * of a grid written by PyTorch), blank lines, lines starting with '#' and
 * '\r' are ignored. If no line holds a send or receive, the result is
 * lowered. Not validated. FSC_ERR_FORMAT naming the line, the column
 * (1-based) and the token for a bad token or a stage or micro out of range,
 * naming the line for a missing or extra line; FSC_ERR_INVALID for a bad
 * config or NULL arguments. The caller owns *out. */
FSC_API int fsc_pipe_schedule_parse(const char *text, fsc_pipe_config cfg, fsc_pipe_schedule **out);
/* Reads the CSV file at path (as fsc_pipe_schedule_parse), lowers it if it
 * has no communication, and validates it with the default costs: how a user
 * brings their own schedule. Errors as parse and validate, prefixed with the
 * path; FSC_ERR_IO if the file cannot be read or exceeds 64 MiB. */
FSC_API int fsc_pipe_schedule_read_csv(const char *path, fsc_pipe_config cfg,
                                       fsc_pipe_schedule **out);
/* Writes s as CSV (one line per rank, actions in text form, no spaces),
 * atomically: a failure leaves an existing file as it was. FSC_ERR_INVALID
 * for NULL arguments, FSC_ERR_IO naming the path. */
FSC_API int fsc_pipe_schedule_write_csv(const fsc_pipe_schedule *s, const char *path);

/* Prints the simulated timeline as a grid: one row per rank, one column per
 * time unit of the default cost model; a cell shows the compute action that
 * starts there, '~' where it continues (a B of cost 2) and '.' where the rank
 * is idle. Sends and receives take no time and are left out (see the list
 * form). Validates first: returns its status, printing nothing on failure;
 * FSC_ERR_INVALID for NULL arguments, FSC_ERR_IO if writing fails. */
FSC_API int fsc_pipe_schedule_print(const fsc_pipe_schedule *s, FILE *f);
/* Prints every rank's full list, communication included, one line per rank
 * ("rank 1: 1RECV_F0 1F0 ..."). No validation; FSC_ERR_INVALID for NULL
 * arguments, FSC_ERR_IO if writing fails. */
FSC_API int fsc_pipe_schedule_print_list(const fsc_pipe_schedule *s, FILE *f);

/* The config of s into *out; FSC_ERR_INVALID for NULL arguments. */
FSC_API int fsc_pipe_schedule_config(const fsc_pipe_schedule *s, fsc_pipe_config *out);
/* Rank `rank`'s actions: *acts points into s (valid until s is changed or
 * freed), *n is their count. FSC_ERR_INVALID for a rank outside [0, ranks)
 * or NULL arguments. */
FSC_API int fsc_pipe_schedule_actions(const fsc_pipe_schedule *s, int rank,
                                      const fsc_pipe_action **acts, int *n);
/* The rank that runs `stage` (stage % ranks); -1 for NULL s or a stage
 * outside [0, ranks * chunks). */
FSC_API int fsc_pipe_stage_rank(const fsc_pipe_schedule *s, int stage);
/* The other side of a send or receive: the rank it sends to or receives
 * from. -1 for a compute action, NULL s, or an action with no peer (out of
 * range, past either end of the pipeline). */
FSC_API int fsc_pipe_action_peer(const fsc_pipe_schedule *s, fsc_pipe_action a);
/* The message tag of a send or receive, equal on both sides of one message
 * and distinct for every message of the step: 2 * (micro * S + producer
 * stage) + (0 for activations, 1 for gradients), below 2 * S * m (at most
 * 2^21; MPI guarantees tags up to 32767 only, enough while S * m <= 16383). -1 as
 * fsc_pipe_action_peer. */
FSC_API int fsc_pipe_action_tag(const fsc_pipe_schedule *s, fsc_pipe_action a);
/* Frees s. Accepts NULL. */
FSC_API void fsc_pipe_schedule_free(fsc_pipe_schedule *s);

#ifdef __cplusplus
}
#endif
#endif
