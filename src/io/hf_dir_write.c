/* A Hugging Face model directory's weights cut into shards.
 *
 * Every strategy saves DIR/model.safetensors the one way it knows (the same
 * bytes on every path); this file then cuts that file, when its tensors
 * pass the shard size, into model-0000k-of-0000n.safetensors and
 * model.safetensors.index.json, as save_pretrained lays them out. Tensors
 * keep their order, dtype and bytes; a shard holds whole tensors, closing
 * before the tensor that would take it past the size (a larger tensor gets
 * a shard of its own). Each shard is written atomically and the index last,
 * so a failure leaves model.safetensors in place and readable; only once
 * the index is committed is model.safetensors removed. Before cutting, the
 * file may be rewritten in bf16 (fsc_hf_narrow_bf16: save_pretrained's
 * torch_dtype=bfloat16), rounded to nearest even as torch rounds.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsc/kernels.h"
#include "fsc/weights.h"
#include "io/io_internal.h"

#define COPY_CHUNK ((size_t)4 << 20)

/* Shard k of n's name (1-based, five digits as Hugging Face writes them). */
static void shard_name(char *out, size_t cap, int k, int n) {
    snprintf(out, cap, "model-%05d-of-%05d.safetensors", k, n);
}

/* Copies entries [first, end) of src, with its metadata, into path. */
static int write_shard(fsc_st_file *src, int first, int end, const char *path, void *buf) {
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (!w) return rc;
    for (int i = 0; !rc && i < fsc_st_metadata_count(src); i++) {
        const char *k, *v;
        if (!(rc = fsc_st_metadata_at(src, i, &k, &v))) rc = fsc_st_writer_set_metadata(w, k, v);
    }
    for (int i = first; !rc && i < end; i++) {
        const fsc_st_entry *e = fsc_st_entry_at(src, i);
        rc = fsc_st_writer_declare(w, e->name, e->dtype, e->ndim, e->shape);
    }
    for (int i = first; !rc && i < end; i++) {
        const fsc_st_entry *e = fsc_st_entry_at(src, i);
        for (uint64_t at = 0; !rc && at < e->nbytes; at += COPY_CHUNK) {
            const size_t m = e->nbytes - at < COPY_CHUNK ? (size_t)(e->nbytes - at) : COPY_CHUNK;
            rc = fsc_st_read_bytes(src, e, at, buf, m);
            if (!rc) rc = fsc_st_writer_write(w, e->name, buf, m);
        }
    }
    if (rc) {
        fsc_st_writer_abort(w);
        return rc;
    }
    return fsc_st_writer_close(w);
}

/* The index: {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}. */
static int write_index(const char *dir, fsc_st_file *src, const int *shard_of, int n_shards,
                       uint64_t total) {
    char path[4096], name[64], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = open_memstream(&text, &len);
    if (!f) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {",
            (unsigned long long)total);
    for (int i = 0; i < fsc_st_count(src); i++) {
        shard_name(name, sizeof name, shard_of[i] + 1, n_shards);
        fprintf(f, "%s\n    \"%s\": \"%s\"", i ? "," : "", fsc_st_entry_at(src, i)->name, name);
    }
    fprintf(f, "\n  }\n}\n");
    return fsc_memstream_write_atomic(f, &text, &len, path);
}

int fsc_hf_shard(const char *dir, int64_t max_shard_bytes, int *n_shards) {
    if (!dir || max_shard_bytes < 1)
        return fsc_error(FSC_ERR_INVALID, "fsc_hf_shard: needs a directory and a shard size >= 1");
    char single[4096], path[4096], name[64];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    int rc = FSC_OK;
    fsc_st_file *src = fsc_st_open(single, &rc);
    if (!src) return rc;
    const int n = fsc_st_count(src);
    int *shard_of = malloc(((size_t)n + 1) * sizeof *shard_of), shards = 0;
    void *buf = malloc(COPY_CHUNK);
    uint64_t total = 0, in_shard = 0;
    if (!shard_of || !buf) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; !rc && i < n; i++) { /* whole tensors, closing before the one that passes */
        const uint64_t b = fsc_st_entry_at(src, i)->nbytes;
        if (!shards || (in_shard && in_shard + b > (uint64_t)max_shard_bytes))
            shards++, in_shard = 0;
        shard_of[i] = shards - 1;
        in_shard += b, total += b;
    }
    for (int k = 0, first = 0; !rc && shards > 1 && k < shards; k++) {
        int end = first;
        while (end < n && shard_of[end] == k) end++;
        shard_name(name, sizeof name, k + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = write_shard(src, first, end, path, buf);
        first = end;
    }
    if (!rc && shards > 1) rc = write_index(dir, src, shard_of, shards, total);
    fsc_st_close(src);
    if (!rc && shards > 1 && unlink(single))
        rc = fsc_error(FSC_ERR_IO, "%s: cannot remove it after sharding", single);
    if (!rc && shards > 1) rc = fsc_fsync_dir(dir);
    if (!rc && n_shards) *n_shards = shards > 1 ? shards : 1;
    free(shard_of), free(buf);
    return rc;
}

/* ---- bf16 files ------------------------------------------------------------------------------ */

/* Entry e of src (F32) into w as BF16, a chunk at a time. */
static int narrow_entry(fsc_st_file *src, const fsc_st_entry *e, fsc_st_writer *w, float *buf,
                        uint16_t *half) {
    int rc = FSC_OK;
    const uint64_t chunk = COPY_CHUNK / sizeof(float) * sizeof(float);
    for (uint64_t at = 0; !rc && at < e->nbytes; at += chunk) {
        const size_t m = e->nbytes - at < chunk ? (size_t)(e->nbytes - at) : (size_t)chunk;
        rc = fsc_st_read_bytes(src, e, at, buf, m);
        if (rc) break;
        fsc_narrow_bf16(half, buf, (int64_t)(m / sizeof(float)));
        rc = fsc_st_writer_write(w, e->name, half, m / 2);
    }
    return rc;
}

int fsc_hf_narrow_bf16(const char *dir) {
    if (!dir) return fsc_error(FSC_ERR_INVALID, "fsc_hf_narrow_bf16: dir must not be NULL");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = FSC_OK;
    fsc_st_file *src = fsc_st_open(path, &rc);
    if (!src) return rc;
    float *buf = malloc(COPY_CHUNK);
    uint16_t *half = malloc(COPY_CHUNK / 2);
    /* the writer's temporary is renamed over path at close: src stays readable until then */
    fsc_st_writer *w = buf && half ? fsc_st_writer_open(path, &rc) : NULL;
    if (!buf || !half) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; w && !rc && i < fsc_st_metadata_count(src); i++) {
        const char *k, *v;
        if (!(rc = fsc_st_metadata_at(src, i, &k, &v))) rc = fsc_st_writer_set_metadata(w, k, v);
    }
    for (int i = 0; w && !rc && i < fsc_st_count(src); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(src, i);
        const bool f32 = e->dtype == FSC_DTYPE_F32;
        rc = fsc_st_writer_declare(w, e->name, f32 ? FSC_DTYPE_BF16 : e->dtype, e->ndim, e->shape);
    }
    for (int i = 0; w && !rc && i < fsc_st_count(src); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(src, i);
        if (e->dtype == FSC_DTYPE_F32) {
            rc = narrow_entry(src, e, w, buf, half);
            continue;
        }
        for (uint64_t at = 0; !rc && at < e->nbytes; at += COPY_CHUNK) { /* as it is */
            const size_t m = e->nbytes - at < COPY_CHUNK ? (size_t)(e->nbytes - at) : COPY_CHUNK;
            rc = fsc_st_read_bytes(src, e, at, buf, m);
            if (!rc) rc = fsc_st_writer_write(w, e->name, buf, m);
        }
    }
    if (w && rc) fsc_st_writer_abort(w);
    if (w && !rc) rc = fsc_st_writer_close(w);
    fsc_st_close(src);
    free(buf), free(half);
    return rc;
}
