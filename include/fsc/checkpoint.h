/* fsc checkpoint: training checkpoints as directories that are either whole
 * or absent.
 *
 * A checkpoint of step S lives in DIR/step-<S>/ (S zero-padded to six digits:
 * "step-000120"): the files the caller writes (weights, optimizer state, ...)
 * and state.json, which records caller metadata plus each file's size and
 * CRC-32. It is written under a temporary
 * name, every file and the directory are fsync'ed, then it is renamed into
 * place and DIR/latest (a one-line file naming it) is replaced atomically. A
 * crash at any point leaves the previous checkpoint and `latest` intact.
 * Opening verifies sizes and checksums before anything is used.
 */
#ifndef FSC_CHECKPOINT_H
#define FSC_CHECKPOINT_H

#include "fsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsc_ckpt_writer fsc_ckpt_writer;

/* Starts checkpoint `step` in dir (created if missing; its parent must exist).
 * The caller owns *out until fsc_ckpt_commit or fsc_ckpt_abort. dir and out
 * must not be NULL; FSC_ERR_INVALID for step < 0 or an over-long dir,
 * FSC_ERR_IO if the directories cannot be made. */
FSC_API int fsc_ckpt_begin(const char *dir, int64_t step, fsc_ckpt_writer **out);
/* Where to write member file `name` (a plain file name) before commit. The
 * string is w's and the next call overwrites it: use or copy it at once. */
FSC_API const char *fsc_ckpt_member(fsc_ckpt_writer *w, const char *name);
/* Records metadata: value is a JSON value as text ("12", "\"adamw\"", "{...}");
 * a later call with the same key replaces it. FSC_ERR_INVALID if it is not JSON. */
FSC_API int fsc_ckpt_set(fsc_ckpt_writer *w, const char *key, const char *json_value);
/* Checksums every member, writes state.json, makes it durable and current.
 * Frees w whatever the outcome; on failure nothing visible has changed.
 * FSC_ERR_IO if step `step` already exists there (never overwritten). */
FSC_API int fsc_ckpt_commit(fsc_ckpt_writer *w);
/* Discards the partial checkpoint and frees w. Accepts NULL. */
FSC_API void fsc_ckpt_abort(fsc_ckpt_writer *w);

typedef struct fsc_ckpt fsc_ckpt;

/* Opens DIR/latest's checkpoint (or dir itself if it is a step directory) and
 * verifies every member's size and CRC-32; a torn or altered checkpoint is
 * refused with a message naming the file. FSC_ERR_NOT_FOUND when there is no
 * checkpoint, FSC_ERR_FORMAT for a bad state.json. The caller owns *out
 * (fsc_ckpt_close). dir and out must not be NULL. */
FSC_API int fsc_ckpt_open(const char *dir, fsc_ckpt **out);
/* Frees c and every string it returned. Accepts NULL. */
FSC_API void fsc_ckpt_close(fsc_ckpt *c);
FSC_API int64_t fsc_ckpt_step(const fsc_ckpt *c); /* the step it was saved at */
/* Path of member `name` (valid until fsc_ckpt_close), or NULL if there is no such member. */
FSC_API const char *fsc_ckpt_path(const fsc_ckpt *c, const char *name);
/* Metadata value as JSON text (the caller parses it), or NULL if absent; the
 * text stays valid until fsc_ckpt_close. */
FSC_API const char *fsc_ckpt_get(const fsc_ckpt *c, const char *key);

#ifdef __cplusplus
}
#endif
#endif
