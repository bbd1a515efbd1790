/* fsc weights: a module tree's parameters to and from safetensors, by name.
 *
 * Names are the full dotted parameter names (for GPT the Hugging Face GPT-2
 * names), so files interoperate with PyTorch (docs/architecture.md, decision 9). Writes
 * are atomic (temporary file, fsync, rename); a failed save leaves an
 * existing file untouched.
 */
#ifndef FSC_WEIGHTS_H
#define FSC_WEIGHTS_H

#include "fsc/dist.h"
#include "fsc/io.h"
#include "fsc/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes every parameter of ps as F32 under its full name, with n_meta string
 * metadata pairs keys[i], values[i] (n_meta may be 0). Errors as the
 * safetensors writer's (fsc/io.h); an existing file survives any failure. */
FSC_API int fsc_weights_save(const char *path, const fsc_params *ps, int n_meta,
                             const char *const *keys, const char *const *values);
/* fsc_weights_save of parameters every rank of g holds alike (replicated),
 * collective over g; path is read on rank root of g only (others may pass
 * NULL). With more than one rank and FSC_PARALLEL_IO not 0, every rank
 * writes an even share of the file's bytes through MPI-IO (the same bytes,
 * under the FSC_IO_TIMEOUT_S deadline); otherwise root writes it alone.
 * Every rank returns the same status; a failure anywhere leaves path
 * untouched. FSC_ERR_INVALID for a NULL g or ps, root outside g, n_meta < 0,
 * or an invalid FSC_PARALLEL_IO / FSC_IO_TIMEOUT_S. */
FSC_API int fsc_weights_save_group(fsc_group *g, int root, const char *path, const fsc_params *ps,
                                   int n_meta, const char *const *keys,
                                   const char *const *values);
/* Reads every parameter of ps from path (F32, BF16 or F16 in the file; converted).
 * A missing tensor or a shape mismatch is an error naming the tensor; nothing
 * is changed in ps unless every tensor is present and well-shaped. Names may
 * carry Hugging Face's "transformer." prefix. Tensors the model does not have
 * are ignored, except that their count is returned in *n_unused (may be NULL);
 * so are tensors of dtypes fsc does not read (BOOL, U8, ...: see fsc_st_open).
 * A "wpe.weight" with more rows (positions) than the parameter gives its
 * first rows: a model of a shorter context loads a longer one's file. */
FSC_API int fsc_weights_load(const char *path, fsc_params *ps, int *n_unused);
/* The file's tensor for parameter `name`, with or without Hugging Face's
 * "transformer." prefix (owned by f); NULL if neither is there, or f is NULL. */
FSC_API const fsc_st_entry *fsc_weights_find(const fsc_st_file *f, const char *name);

#ifdef __cplusplus
}
#endif
#endif
