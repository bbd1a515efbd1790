/* Staged checkpoint files, for asynchronous saves (internal to fsc: the io
 * floor and the train floor's trainer).
 *
 * The one idea: a save's file output is captured, not written. While a stage
 * captures (on the thread that makes it current), fsc_atomic_open writes
 * into memory and st_parallel_save keeps this rank's pieces, converted to the
 * file's dtype, at their file offsets; everything else of the save (plans,
 * gathers, agreements) runs as in a synchronous save, so the bytes are the
 * same. Later a background thread writes them with plain POSIX calls (no
 * MPI), and the commit checks what landed exactly as a synchronous save does.
 *
 * Staging memory per rank: the bytes that rank writes (its pieces of each
 * MPI-IO file, plus the header on the root; a one-writer file whole on its
 * writer), held from the capture until the files are verified, and kept
 * for the next capture by a recycled stage.
 *
 * Sequence for one checkpoint (every rank):
 *   capture (main thread, collective as the save it captures)
 *   ckpt_stage_write          background: POSIX writes, fsync, close
 *   agree, ckpt_stage_gather  main thread, collective: the runs' CRCs to roots
 *   ckpt_stage_finish         background, roots: sizes and tiling, renames
 */
#ifndef FSC_IO_CKPT_STAGE_H
#define FSC_IO_CKPT_STAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "fsc/checkpoint.h"
#include "io/st_parallel.h"

typedef struct ckpt_stage ckpt_stage;

/* Whether a background writer may run beside MPI: MPI was initialised with
 * at least MPI_THREAD_FUNNELED (the writer makes no MPI call), or not at all. */
bool ckpt_stage_threads_ok(void);
/* An empty stage; NULL (error set) when out of memory. */
ckpt_stage *ckpt_stage_new(void);
/* Removes this rank's temporaries not yet renamed into place and frees s.
 * Accepts NULL. */
void ckpt_stage_free(ckpt_stage *s);
/* As ckpt_stage_free, but s stays, empty, for the next capture, and keeps
 * its byte buffers (up to 16) for it: memory already touched, so the next
 * capture copies without a page fault per page. Between saves s then holds
 * the bytes of the last one. Accepts NULL. */
void ckpt_stage_recycle(ckpt_stage *s);

/* Makes s the calling thread's capture target (NULL: none). */
void ckpt_stage_capture(ckpt_stage *s);
/* The calling thread's capture target, or NULL. */
ckpt_stage *ckpt_stage_current(void);
/* A one-writer file: its bytes (malloc'd; s takes them, also on failure). */
int ckpt_stage_add_file(ckpt_stage *s, const char *path, char *bytes, size_t n);
/* st_parallel_save's capture: same arguments, same collectives' outcome
 * (every rank returns the same status; plan always freed). Root makes the
 * file's temporary beside path now, so that every rank can open it later. */
int ckpt_stage_parallel(fsc_group *g, int root, const char *path, fsc_st_writer *plan,
                        const st_pieces *pieces, int status);
/* Bytes this rank holds in s. */
size_t ckpt_stage_bytes(const ckpt_stage *s);

/* Background (no MPI): writes this rank's bytes; a one-writer file goes to a
 * temporary, fsync, rename; pieces of a parallel file are pwritten into the
 * root's temporary, fsync, close. Every run is then read back and checked
 * against the CRC-32 of the bytes written (a write that reported success
 * but did not land fails here). Errors name world rank `rank` and the file. */
int ckpt_stage_write(ckpt_stage *s, int rank);
/* Main thread, collective in capture order, once every rank's write
 * succeeded: each parallel file's runs (offset, length, CRC-32) to its root. */
int ckpt_stage_gather(ckpt_stage *s);
/* Background, on each parallel file's root: the temporary's size is the
 * plan's and the ranks' runs tile it (each rank read its own runs back in
 * ckpt_stage_write, against the CRC-32 of the bytes written); then it is
 * renamed over its path and the directory fsynced. Each file this rank put in
 * place has its size and CRC-32 recorded in w (when not NULL), so the commit
 * reads none of them again. A rank that is no root has nothing to do. */
int ckpt_stage_finish(ckpt_stage *s, fsc_ckpt_writer *w);

#endif
