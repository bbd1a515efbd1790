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
#include "fsc/gpt.h"
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

/* ---- Hugging Face model directories ----------------------------------------
 * DIR/config.json and DIR's weights: DIR/model.safetensors, or shards
 * DIR/model-0000k-of-0000n.safetensors with DIR/model.safetensors.index.json
 * (its weight_map names each tensor's shard). fsc_st_open, and so
 * fsc_weights_load and every strategy's load, takes DIR itself and reads the
 * shards as one file (model.safetensors first when both are there). */

/* Shards of this many bytes at most, by default (a tensor larger than a
 * shard gets one of its own). */
#define FSC_HF_SHARD_BYTES ((int64_t)2000000000)

/* A config.json's text into *cfg (changed only on success): model_type
 * "llama", "mixtral" (its MoE layers: fsc_hf_config_parse_moe) or "qwen2"
 * (LlamaConfig's / Qwen2Config's fields: hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, rope_theta, rope_scaling null or "llama3",
 * rms_norm_eps, tie_word_embeddings, vocab_size, max_position_embeddings
 * into seq, attention_bias; Qwen 2 always has q/k/v biases; fsc's own
 * metadata, whose shape carries GPT-2's names, reads too), or "gpt2"
 * (n_embd, n_layer, n_head, n_positions, vocab_size). `what` names the
 * file in messages. FSC_ERR_FORMAT naming the field for one missing or
 * impossible (heads not dividing hidden_size, ...); FSC_ERR_UNSUPPORTED
 * naming it for another model_type or a field fsc cannot honour
 * (hidden_act other than silu, mlp_bias, a sliding window, head_dim other
 * than hidden_size / heads, another rope_scaling type). */
FSC_API int fsc_hf_config_parse(const char *json, const char *what, fsc_gpt_config *cfg);
/* The MoE layers of a config.json's text into *moe (changed only on
 * success): all zeros unless model_type is "mixtral"; then experts from
 * num_local_experts, SwiGLU experts, every from decoder_sparse_step (1),
 * hidden from moe_intermediate_size (0: the dense width), capacity_factor
 * from moe_capacity_factor (absent: experts, dropless), aux_coef from
 * router_aux_loss_coef when output_router_logits is true (else 0). The
 * caller points cfg->moe at it. FSC_ERR_FORMAT or FSC_ERR_UNSUPPORTED
 * naming the field (num_experts_per_tok other than 2, router_jitter_noise
 * other than 0, ...). */
FSC_API int fsc_hf_config_parse_moe(const char *json, const char *what,
                                    struct fsc_moe_options *moe);
/* fsc_hf_config_parse of DIR/config.json (FSC_ERR_IO naming it if unreadable). */
FSC_API int fsc_hf_config_read(const char *dir, fsc_gpt_config *cfg);
/* Writes DIR/config.json (atomically) for a LLaMA-family cfg, LlamaConfig's
 * fields with torch_dtype as given (NULL: "float32", what fsc saves); with
 * cfg->moe experts, MixtralConfig's (fsc_hf_config_parse_moe's fields).
 * FSC_ERR_INVALID for a NULL argument or a GPT-2 cfg. */
FSC_API int fsc_hf_config_write(const char *dir, const fsc_gpt_config *cfg,
                                const char *torch_dtype);
/* Cuts DIR/model.safetensors into shards of at most max_shard_bytes of
 * tensor data (whole tensors, in file order, metadata copied to each) plus
 * model.safetensors.index.json, then removes model.safetensors; a file
 * that fits one shard stays as it is. *n_shards (may be NULL) gets the
 * count (1: left whole). On failure model.safetensors is still there.
 * FSC_ERR_INVALID for a NULL dir or max_shard_bytes < 1; else the reader's
 * and writer's errors. */
FSC_API int fsc_hf_shard(const char *dir, int64_t max_shard_bytes, int *n_shards);
/* Rewrites DIR/model.safetensors (atomically, metadata kept) with every F32
 * tensor rounded to BF16 to nearest even, as torch's .to(torch.bfloat16)
 * rounds; tensors of other dtypes are copied as they are. Call before
 * fsc_hf_shard, and write config.json with torch_dtype "bfloat16".
 * FSC_ERR_INVALID for a NULL dir; else the reader's and writer's errors
 * (the file unchanged). */
FSC_API int fsc_hf_narrow_bf16(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
