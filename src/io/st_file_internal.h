/* The safetensors reader's handle, shared by the one-file reader
 * (safetensors_read.c) and the Hugging Face directory reader (hf_dir_read.c).
 *
 * A handle is either one file (fd >= 0, parts NULL) or a directory's
 * shards seen as one file (fd -1): then the entries are copies of the
 * shards' own (names owned by the shards), part_of[i] says which shard
 * holds entry i, and reads go to that shard's descriptor.
 */
#ifndef FSC_ST_FILE_INTERNAL_H
#define FSC_ST_FILE_INTERNAL_H

#include "fsc/io.h"

struct fsc_st_file {
    int fd;
    char *path;
    uint64_t data_start, data_size;
    int n;
    fsc_st_entry *entries;        /* sorted by offset (a directory: by shard, then offset) */
    const fsc_st_entry **by_name; /* sorted by name, for lookup */
    int nmeta;
    const char **meta_key, **meta_val; /* point into strings (a directory: the shards') */
    char **strings;                    /* every string we own, freed at close */
    int nstrings;
    fsc_st_file **parts; /* a directory's shards, closed with it; NULL for one file */
    int nparts;
    int *part_of; /* per entry: its shard in parts */
};

/* Whether path is a directory holding model.safetensors or
 * model.safetensors.index.json (any other directory is refused as before:
 * not a regular file). */
bool st_is_model_dir(const char *path);
/* Opens a Hugging Face model directory (hf_dir_read.c): its
 * model.safetensors, else model.safetensors.index.json and the shards it
 * names, as one handle. Errors as fsc_st_open, naming the file at fault. */
fsc_st_file *st_open_dir(const char *dir, int *status);
/* Sorts by_name (allocated for f->n entries) and refuses a duplicate name. */
int st_index_names(fsc_st_file *f);

#endif
