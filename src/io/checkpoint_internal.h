/* Internal to the checkpoint files of the io floor: names, the directory
 * scan, stale temporaries, pruning and the state.json self-checksum.
 *
 * Names in a checkpoint directory DIR:
 *   step-<S>                       a committed checkpoint (S: 6+ digits)
 *   latest                         one line naming the current step-<S>
 *   .step-<S>.tmp-<pid>-<host>-<r> a checkpoint being written (r: random)
 *   .step-<S>.del-<pid>-<host>-<r> an old checkpoint being pruned
 *   .latest.tmp-<pid>-<host>-<r>   a new `latest` before its rename
 *   step-<S>.aside-<r>             a step directory set aside by a writer
 * A hidden temporary whose writer (pid on this host) is gone is stale.
 */
#ifndef FSC_IO_CHECKPOINT_INTERNAL_H
#define FSC_IO_CHECKPOINT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fsc/checkpoint.h"

#define CKPT_DIR_LEN 1024 /* longest checkpoint directory accepted */
#define CKPT_PATH_LEN 4096
#define CKPT_SUM_KEY "state_crc32"       /* state.json's own checksum, its last member */
#define CKPT_STATE_MAX (1 << 20)         /* state.json larger than this is refused */
#define CKPT_MAX_STEP 9007199254740992.0 /* 2^53: steps a JSON number holds exactly */

/* name is exactly "step-<digits>" (at most 16 digits); *step its number. */
bool ckpt_step_name(const char *name, int64_t *step);
/* "<pid>-<host>-" of this process, for temporary names. */
void ckpt_writer_tag(char *out, size_t cap);
/* Reads DIR/latest: FSC_ERR_NOT_FOUND if absent, FSC_ERR_FORMAT if it does not
 * name a step directory; name gets "step-<S>". */
int ckpt_read_latest(const char *dir, char *name, size_t cap, int64_t *step);
/* The step numbers of DIR's step-<S> directories (not links), newest first;
 * *steps is malloc'd (NULL when none). */
int ckpt_list_steps(const char *dir, int64_t **steps, int *n);
/* Removes the hidden temporaries of writers that are gone (never following a
 * link), logging each; best effort, returns how many were removed. */
int ckpt_clean_stale(const char *dir);
/* Keeps the keep_last newest step directories up to and including `newest`
 * and the keep_best of them with the lowest number under metadata key
 * `key` (older ones renamed to a hidden name, then removed); never touches
 * one newer than `newest`. keep_last <= 0 and keep_best <= 0 keep
 * everything; keep_last <= 0 alone keeps `newest` and the best. */
int ckpt_prune(const char *dir, int64_t newest, int keep_last, int keep_best, const char *key);
/* The number under metadata key `key` in DIR/step-<S>/state.json:
 * FSC_ERR_NOT_FOUND when absent or not a number. Reads state.json only (the
 * members are not verified: the number only decides what pruning keeps). */
int ckpt_meta_number(const char *dir, int64_t step, const char *key, double *out);
/* Renames from to to unless to exists (FSC_ERR_IO naming both). */
int ckpt_rename_noreplace(const char *from, const char *to);
/* CRC-32 and size of a regular file (never a link), streamed. */
int ckpt_file_crc(const char *path, uint32_t *crc, int64_t *size);

/* The size and CRC-32 of member file `path` of w (its full path, as
 * fsc_ckpt_member gives it), known from the bytes written and read back by
 * their writers: the commit records them instead of re-reading the file.
 * Ignored (the commit reads the file) for a path outside w or out of memory. */
void ckpt_writer_known(fsc_ckpt_writer *w, const char *path, int64_t size, uint32_t crc);

#endif
