/* fsc checkpoint: training checkpoints as directories that are either whole
 * or absent.
 *
 * A checkpoint of step S lives in DIR/step-<S>/ (S zero-padded to six digits:
 * "step-000120"): the files the caller writes (weights, optimizer state, ...)
 * and state.json, which records caller metadata, each file's size and
 * CRC-32, and its own CRC-32 (its last member, "state_crc32"). It is written
 * under a hidden temporary name with an unpredictable part, every file and
 * the directory are fsync'ed, then it is renamed into place, DIR is fsync'ed,
 * and DIR/latest (a one-line file naming it) is replaced atomically and DIR
 * fsync'ed again. A crash at any point leaves a directory from which
 * fsc_ckpt_open finds the newest complete checkpoint: the previous one, or
 * the new one when it was renamed into place before `latest` moved. The next
 * writer removes temporaries whose writer (a pid on this host) is gone.
 * Opening verifies sizes and checksums before anything is used; a state.json
 * without its own checksum (written before it existed) still opens.
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
/* What a save will need of dir, checked now (a run calls it at start-up, not
 * 29 steps in): dir exists or can be made, and a temporary can be created
 * in it and removed. FSC_ERR_IO naming dir and why otherwise. */
FSC_API int fsc_ckpt_check_dir(const char *dir);
/* Where to write member file `name` (a plain file name) before commit. The
 * string is w's and the next call overwrites it: use or copy it at once. */
FSC_API const char *fsc_ckpt_member(fsc_ckpt_writer *w, const char *name);
/* Records metadata: value is a JSON value as text ("12", "\"adamw\"", "{...}");
 * a later call with the same key replaces it. FSC_ERR_INVALID if it is not JSON. */
FSC_API int fsc_ckpt_set(fsc_ckpt_writer *w, const char *key, const char *json_value);
/* After the commit, keep only the n newest step directories up to this one
 * (older ones are removed, never following links); 0, the default, keeps all.
 * FSC_ERR_INVALID for n < 0. */
FSC_API int fsc_ckpt_keep_last(fsc_ckpt_writer *w, int n);
/* Checksums every member, writes state.json, makes it durable and current,
 * then prunes (fsc_ckpt_keep_last). Frees w whatever the outcome; on failure
 * before the rename nothing visible has changed. FSC_ERR_IO if step `step` is
 * the one DIR/latest names (never overwritten); a step-<S> directory that
 * `latest` does not name is moved aside to step-<S>.aside-<random>, with a
 * warning, and the new one written. */
FSC_API int fsc_ckpt_commit(fsc_ckpt_writer *w);
/* Discards the partial checkpoint and frees w. Accepts NULL. */
FSC_API void fsc_ckpt_abort(fsc_ckpt_writer *w);
/* Removes stale temporaries of dead writers in dir and keeps only the
 * keep_last newest step directories up to the one DIR/latest names (0 keeps
 * all). FSC_OK when dir holds no checkpoint; FSC_ERR_INVALID for a NULL dir
 * or keep_last < 0; FSC_ERR_FORMAT for an unreadable `latest`. */
FSC_API int fsc_ckpt_prune(const char *dir, int keep_last);
/* fsc_ckpt_prune that also keeps the keep_best step directories with the
 * lowest number under metadata key `key` (fsc_ckpt_set; e.g. "val_loss",
 * Lightning's ModelCheckpoint(monitor=..., save_top_k=keep_best)). The one
 * DIR/latest names is always kept; so are the keep_last newest when
 * keep_last > 0 (0 with keep_best > 0: only the newest and the best). A step
 * directory whose state.json lacks the key, or cannot be read, is never
 * among the best. keep_last = keep_best = 0 keeps everything. */
FSC_API int fsc_ckpt_prune_best(const char *dir, int keep_last, int keep_best, const char *key);

typedef struct fsc_ckpt fsc_ckpt;

/* Opens the newest complete checkpoint of dir (or dir itself if it is a step
 * directory) and verifies state.json (its own checksum, numbers in range, no
 * trailing bytes, step equal to the directory's) and every member's size and
 * CRC-32; a torn or altered checkpoint is refused with a message naming the
 * file. The newest is DIR/latest's, unless a step directory newer than it
 * verifies (a save cut short before `latest` moved): that one is adopted
 * with a warning, and newer ones that do not verify are skipped with one.
 * Special files (FIFOs, devices) and symbolic links are refused, never read.
 * FSC_ERR_NOT_FOUND when there is no checkpoint, FSC_ERR_FORMAT for a bad
 * state.json or `latest`. The caller owns *out (fsc_ckpt_close). dir and out
 * must not be NULL. */
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
