/* Parallel safetensors saves through MPI-IO (internal to fsc: the io floor
 * and the parallel and train floors above it).
 *
 * The one idea: a safetensors header is a pure function of the declarations,
 * so every rank builds the same plan (a writer without a file) and knows
 * every tensor's byte offset without talking. Each rank then writes only the
 * pieces it holds, at those offsets, with collective MPI-IO in rounds of at
 * most 16 MiB of staging; rank `root` adds the header. The bytes are the
 * one-writer file's exactly, and no rank holds more than its pieces plus
 * the staging buffer.
 *
 * Environment: FSC_PARALLEL_IO (1, the default, or 0: the one-writer path
 * everywhere) and FSC_IO_TIMEOUT_S (seconds the MPI-IO part of one save may
 * take, in [1, 604800]; default 600), both rows of the environment table
 * (src/core/env.c) and checked by fsc_env_check.
 */
#ifndef FSC_IO_ST_PARALLEL_H
#define FSC_IO_ST_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsc/dist.h"
#include "fsc/io.h"
#include "fsc/nn.h"

/* ---- plans (safetensors_write.c) ---------------------------------------------
 * A plan is an fsc_st_writer with no file: declare tensors and set metadata
 * with the writer's calls (same checks, same order rules), then read its
 * header and offsets. Free it with fsc_st_writer_abort. */

/* A plan whose messages name path. NULL (error set, *status) for an empty path. */
fsc_st_writer *st_plan_new(const char *path, int *status);
/* The file's first *len bytes (length word and JSON), malloc'd into *bytes;
 * freezes the declarations. The writer's first failure, if it had one. */
int st_plan_header(fsc_st_writer *w, unsigned char **bytes, size_t *len);
int st_plan_count(const fsc_st_writer *w);
int st_plan_find(const fsc_st_writer *w, const char *name); /* index, or -1 */
const char *st_plan_name(const fsc_st_writer *w, int i);
/* Tensor i's dtype, and its bytes [begin, begin + nbytes) of the data buffer. */
void st_plan_tensor(const fsc_st_writer *w, int i, fsc_dtype *dtype, uint64_t *begin,
                    uint64_t *nbytes);
uint64_t st_plan_data_bytes(const fsc_st_writer *w);

enum { ST_PATH_WORDS = 1024 }; /* a path as int32 words: 4096 bytes */

/* A parallel save's first step, on every rank of g (the parallel save's and
 * the async stage's): unless status is set, root creates its temporary file
 * beside path, empty, under a name of its own (O_EXCL); then root's path and
 * temporary reach every rank in names (the path in the first ST_PATH_WORDS
 * words, the temporary in the next; NUL-terminated). *rc gets this rank's
 * status: status, or root's failure to make the temporary. Returns the
 * broadcast's failure, with root's temporary removed and plan aborted (the
 * caller returns it). */
int st_parallel_names(fsc_group *g, int root, const char *path, fsc_st_writer *plan, int status,
                      int32_t names[2 * ST_PATH_WORDS], int *rc);

/* ---- pieces ---------------------------------------------------------------------- */

/* count elements of plan tensor `tensor` from element elem0 on, taken from
 * src (src_dtype; converted when the file's dtype differs: F32 <-> BF16/F16). */
typedef struct st_piece {
    int tensor;
    int64_t elem0, count;
    const void *src; /* borrowed until st_parallel_save returns */
    fsc_dtype src_dtype;
} st_piece;

typedef struct st_pieces {
    st_piece *p;
    int n, cap;
} st_pieces;

/* Appends a piece (count 0: nothing); FSC_ERR_NOMEM. */
int st_pieces_add(st_pieces *ps, int tensor, int64_t elem0, int64_t count, const void *src,
                  fsc_dtype src_dtype);
void st_pieces_free(st_pieces *ps); /* frees the array and zeroes *ps */

/* Elements [*e0, *e1) of plan tensor i that rank `rank` of `world` writes
 * when every rank holds the whole tensor (replicated weights or state): the
 * data bytes are split evenly and an element goes with its first byte, so
 * the ranks' shares tile every tensor exactly. */
void st_plan_tile(const fsc_st_writer *plan, int i, int rank, int world, int64_t *e0, int64_t *e1);

/* ---- the save ------------------------------------------------------------------------ */

/* *on: saves over g go through MPI-IO (g has more than one rank and
 * FSC_PARALLEL_IO is not 0). FSC_ERR_INVALID naming the variable for a value
 * other than 0 or 1. */
int st_parallel_mode(const fsc_group *g, bool *on);

/* Writes plan's file to root's path: collective over g. path is read on the
 * root only (others may pass NULL). plan's declarations and metadata must be
 * alike on every rank, and the ranks' pieces together must cover every data
 * byte exactly once (a gap is refused before anything is written). Rank root
 * creates an unpredictable temporary beside path; every rank writes its
 * pieces into it with MPI_File_write_at_all, then MPI_File_sync and close,
 * all under one deadline of FSC_IO_TIMEOUT_S (past it the process ends, as a
 * blocked MPI call cannot be abandoned: see dist's heartbeat); the root then
 * renames it over path and fsyncs the directory. Every rank returns the same
 * status; a failure on any rank (its message names path, the rank and the
 * MPI error) leaves path untouched and removes the temporary. status is
 * this rank's failure so far (plan may then be NULL): the rank still joins,
 * and every rank returns it. Always frees plan. */
int st_parallel_save(fsc_group *g, int root, const char *path, fsc_st_writer *plan,
                     const st_pieces *pieces, int status);

/* ---- weights (weights.c) ----------------------------------------------------------- */

/* The declarations fsc_weights_save makes: the metadata pairs, then every
 * parameter of ps as F32 under its full name, in entry order (tensor i of
 * the plan is entry i). */
int st_declare_weights(fsc_st_writer *w, const fsc_params *ps, int n_meta, const char *const *keys,
                       const char *const *values);

/* Tests: the staging bytes per round (0: 16 MiB; rounded up to 8). */
void st_parallel_set_chunk(size_t bytes);

#endif
