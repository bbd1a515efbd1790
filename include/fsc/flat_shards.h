/* fsc flat shards: FSDP's sharded (local) state dict and its offline consolidation.
 *
 * FSDP packs each unit's parameters into one flat buffer (each parameter at an
 * element offset, gaps allowed), pads it to world * shard elements, and rank r
 * keeps elements [r*shard, (r+1)*shard). A shard file is rank r's slices as
 * they are, plus the layout that says which parameter lives where, so the
 * full weights can be rebuilt later by one process without MPI and without
 * the model code: fsc_flat_consolidate writes exactly the bytes
 * fsc_weights_save would have written for the unsharded model.
 *
 * A shard file is safetensors: tensors "flat.<u>" F32 [shard_u] for every unit
 * u (padding included), metadata "fsc.flat_layout" (the layout as JSON),
 * "fsc.rank", then the caller's metadata pairs in the order given.
 */
#ifndef FSC_FLAT_SHARDS_H
#define FSC_FLAT_SHARDS_H

#include <stdint.h>

#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSC_FLAT_LAYOUT_KEY "fsc.flat_layout" /* metadata key of the layout JSON */
#define FSC_FLAT_RANK_KEY "fsc.rank"          /* metadata key of the rank ("0", "1", ...) */
#define FSC_FLAT_CRC_KEY "fsc.data_crc32"     /* CRC-32 of the shards' bytes in unit order (hex) */

typedef struct fsc_flat_param {
    char name[FSC_NAME_MAX * 2]; /* full dotted name, as in the full state dict */
    int ndim;
    int64_t shape[FSC_MAX_DIMS];
    int unit;       /* index into layout->units */
    int64_t offset; /* element offset of the parameter in its unit's flat buffer */
} fsc_flat_param;

typedef struct fsc_flat_unit {
    char name[FSC_NAME_MAX * 2]; /* the unit's module path ("" for the root, "h.0", ...) */
    int64_t numel;               /* flat elements used (last parameter's end) */
    int64_t shard; /* elements per rank; the padded flat buffer is world * shard >= numel */
} fsc_flat_unit;

typedef struct fsc_flat_layout {
    int world;
    int nunits;
    fsc_flat_unit *units;
    int nparams;
    fsc_flat_param *params; /* in model order: the order of the full state dict */
} fsc_flat_layout;

/* Checks a layout: world >= 1, 0 <= numel <= shard * world for every unit,
 * every parameter (ndim 0..FSC_MAX_DIMS, dims >= 0) inside its unit, the
 * parameters of a unit not overlapping, parameter names unique, non-empty and
 * NUL-terminated. FSC_ERR_INVALID naming the problem. */
FSC_API int fsc_flat_layout_check(const fsc_flat_layout *L);

/* Writes rank's shard file atomically (temporary, fsync, rename; a failed save
 * leaves an existing file untouched). shards[u] holds units[u].shard floats,
 * padding included (may be NULL when that is 0). The n_meta pairs keys[i],
 * values[i] are carried into the consolidated file in this order; the keys
 * FSC_FLAT_LAYOUT_KEY, FSC_FLAT_RANK_KEY and FSC_FLAT_CRC_KEY are reserved.
 * The file records the CRC-32 of its data, which every reader checks. */
FSC_API int fsc_flat_shard_save(const char *path, const fsc_flat_layout *L, int rank,
                                const float *const *shards, int n_meta, const char *const *keys,
                                const char *const *values);

/* Reads rank's shard file into shards[u] (units[u].shard floats each) after
 * checking that the file is a valid shard file, that its layout equals L
 * (world, units, every parameter's name, shape, unit and offset) and that it
 * is rank's. Any mismatch is an error naming it ("x.safetensors: saved with
 * world 4, this run has 2"). Every check is done before the first byte is
 * copied, so on a refusal shards are untouched. */
FSC_API int fsc_flat_shard_load(const char *path, const fsc_flat_layout *L, int rank,
                                float *const *shards);

/* Parses and validates the layout stored in a shard file, and its rank (rank
 * may be NULL). *out owns its arrays: free them with fsc_flat_layout_free. On
 * failure *out is zeroed. */
FSC_API int fsc_flat_layout_read(const char *path, fsc_flat_layout *out, int *rank);
/* Frees the arrays of a layout filled by fsc_flat_layout_read and zeroes it.
 * Accepts NULL. Not for layouts whose arrays the caller allocated itself. */
FSC_API void fsc_flat_layout_free(fsc_flat_layout *L);

/* Offline, no MPI: rebuilds the full state dict at out_path from the n shard
 * files of one save (in any order; each file says its rank). Every parameter,
 * in model order, is read from the rank(s) whose shards cover it and written
 * F32 under its name; the caller's metadata pairs are carried over in order.
 * The output is byte-identical to fsc_weights_save of the unsharded model with
 * the same metadata. Streams through a bounded buffer (at most the largest
 * parameter, capped at 4 MiB); keeps every input file open while it runs.
 * Refuses, naming the problem: a missing or duplicate rank, a file count that
 * is not the world size, files whose layouts or metadata differ, out_path
 * naming one of the inputs, and anything fsc_flat_layout_read refuses
 * (truncated or corrupt files). On any failure out_path is untouched. */
FSC_API int fsc_flat_consolidate(int n, const char *const *paths, const char *out_path);

#ifdef __cplusplus
}
#endif
#endif
