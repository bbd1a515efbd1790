/* fsc-train's LoRA files: the adapters as a Hugging Face PEFT directory
 * (--save-adapter: adapter_model.safetensors under PEFT's names and
 * adapter_config.json), and --lora-merge (the saved weights with B A
 * scale folded into each adapted base weight, the adapters left out), and
 * --lora-from (such a directory's adapters into the model, refused by name
 * when its rank, alpha, targets or tensors do not fit).
 *
 * Both start from the weights file every strategy writes by global name
 * (fsc_trainer_save_weights, on rank 0), so they work under any layout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train_common.h"

/* PEFT's name of fsc's tensor name: LlamaForCausalLM's are fsc's under
 * "base_model.model."; GPT2LMHeadModel's blocks sit under "transformer.". */
static void peft_name(const train_options *o, const char *name, char *out, size_t n) {
    snprintf(out, n, "base_model.model.%s%s", o->model.arch == FSC_ARCH_LLAMA ? "" : "transformer.",
             name);
}

static bool is_adapter(const char *name) {
    return strstr(name, ".lora_A.weight") || strstr(name, ".lora_B.weight");
}

/* Reads tensor e (F32) of f into a fresh buffer. */
static float *read_f32(fsc_st_file *f, const fsc_st_entry *e, int *rc) {
    float *buf = malloc(e->nbytes ? e->nbytes : 1);
    if (!buf)
        *rc = fsc_error(FSC_ERR_NOMEM, "out of memory reading %s", e->name);
    else if (e->dtype != FSC_DTYPE_F32)
        *rc = fsc_error(FSC_ERR_DTYPE, "tensor %s is %s, expected F32", e->name,
                        fsc_dtype_name(e->dtype));
    else
        *rc = fsc_st_read_bytes(f, e, 0, buf, e->nbytes);
    if (*rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* adapter_config.json, atomically: a failed write leaves the one there. */
static int write_config(const trainer *t, const char *dir) {
    char path[4096], text[8192];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    const train_options *o = &t->opt;
    size_t n = (size_t)snprintf(
        text, sizeof text,
        "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": %d,\n"
        "  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.9g,\n  \"bias\": \"none\",\n"
        "  \"fan_in_fan_out\": %s,\n  \"base_model_name_or_path\": \"%.2048s\",\n"
        "  \"target_modules\": [",
        o->lora_rank, o->lora_alpha > 0 ? o->lora_alpha : (double)o->lora_rank, o->lora_dropout,
        o->model.arch == FSC_ARCH_LLAMA ? "false" : "true", o->init_from ? o->init_from : "");
    for (int k = 0; k < t->nlora_targets && n < sizeof text; k++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\"%s\"", k ? ", " : "",
                              t->lora_targets[k]);
    if (n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, "]\n}\n");
    if (n >= sizeof text) return fsc_error(FSC_ERR_INVALID, "%s: too long", path);
    return fsc_file_write_atomic(path, text, n);
}

/* Rank 0: the adapters of weights file `from` into dir. */
static int write_adapter(const trainer *t, const char *from, const char *dir) {
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(from, &rc);
    if (!f) return rc;
    char path[4096], name[FSC_NAME_MAX * 3];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    int n = 0;
    for (int i = 0; w && !rc && i < fsc_st_count(f); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(f, i);
        if (!is_adapter(e->name)) continue;
        peft_name(&t->opt, e->name, name, sizeof name);
        rc = fsc_st_writer_declare(w, name, FSC_DTYPE_F32, e->ndim, e->shape);
        n++;
    }
    if (!rc && w && !n) rc = fsc_error(FSC_ERR_INVALID, "the model has no LoRA adapters");
    for (int i = 0; w && !rc && i < fsc_st_count(f); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(f, i);
        if (!is_adapter(e->name)) continue;
        float *buf = read_f32(f, e, &rc);
        peft_name(&t->opt, e->name, name, sizeof name);
        if (buf) rc = fsc_st_writer_write(w, name, buf, e->nbytes);
        free(buf);
    }
    if (w && rc) fsc_st_writer_abort(w);
    if (w && !rc) rc = fsc_st_writer_close(w);
    fsc_st_close(f);
    return rc ? rc : write_config(t, dir);
}

/* Committed only when every rank reported success: rank 0 writes the
 * directory's two files (each atomically), and every rank learns its outcome,
 * naming the rank and the file, before any returns. */
int train_lora_save_adapter(trainer *t, const char *dir) {
    if (!t->opt.lora_rank) return fsc_error(FSC_ERR_INVALID, "needs --lora-rank");
    fsc_group *world = fsc_group_world();
    const bool root = fsc_dist_rank() == 0; /* t->rank is the replica rank, 0 on every stage */
    int rc = root && mkdir(dir, 0777) && errno != EEXIST
                 ? fsc_error(FSC_ERR_IO, "%s: cannot create it (%s)", dir, strerror(errno))
                 : FSC_OK;
    rc = fsc_group_agree(world, rc, "creating the adapter directory");
    if (rc) return rc;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/.fsc-weights.tmp.safetensors", dir);
    rc = fsc_trainer_save_weights(t->tr, t->rank == 0 ? tmp : NULL, 0, NULL, NULL);
    if (!rc && root) rc = write_adapter(t, tmp, dir);
    if (root) unlink(tmp);
    return fsc_group_agree(world, rc, "saving the LoRA adapter");
}

/* W += scale * B A in W's layout: (out, in) for LLaMA's nn.Linear, (in,
 * out) for GPT-2's Conv1D. */
static void fold(float *W, const fsc_st_entry *we, const float *A, const float *B, int r,
                 double scale, bool in_out) {
    const int64_t out = in_out ? we->shape[1] : we->shape[0];
    const int64_t in = in_out ? we->shape[0] : we->shape[1];
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double acc = 0;
            for (int k = 0; k < r; k++) acc += (double)B[o * r + k] * A[k * in + i];
            W[in_out ? i * out + o : o * in + i] += (float)(scale * acc);
        }
}

int train_lora_merge_file(const trainer *t, const char *path) {
    const train_options *o = &t->opt;
    const double scale = (o->lora_alpha > 0 ? o->lora_alpha : o->lora_rank) / o->lora_rank;
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f) return rc;
    char tmp[4096], stem[FSC_NAME_MAX * 3];
    snprintf(tmp, sizeof tmp, "%s.merge.tmp", path);
    fsc_st_writer *w = fsc_st_writer_open(tmp, &rc);
    for (int i = 0; w && !rc && i < fsc_st_metadata_count(f); i++) { /* the model's config */
        const char *k, *v;
        if (!(rc = fsc_st_metadata_at(f, i, &k, &v))) rc = fsc_st_writer_set_metadata(w, k, v);
    }
    for (int i = 0; w && !rc && i < fsc_st_count(f); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(f, i);
        if (!is_adapter(e->name))
            rc = fsc_st_writer_declare(w, e->name, e->dtype, e->ndim, e->shape);
    }
    for (int i = 0; w && !rc && i < fsc_st_count(f); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(f, i);
        if (is_adapter(e->name)) continue;
        float *W = read_f32(f, e, &rc), *A = NULL, *B = NULL;
        size_t len = strlen(e->name);
        if (W && len > 7 && !strcmp(e->name + len - 7, ".weight")) {
            snprintf(stem, sizeof stem, "%.*s.lora_A.weight", (int)(len - 7), e->name);
            const fsc_st_entry *ea = fsc_st_find(f, stem);
            snprintf(stem, sizeof stem, "%.*s.lora_B.weight", (int)(len - 7), e->name);
            const fsc_st_entry *eb = fsc_st_find(f, stem);
            if (ea && eb && (A = read_f32(f, ea, &rc)) && (B = read_f32(f, eb, &rc)))
                fold(W, e, A, B, (int)ea->shape[0], scale, o->model.arch != FSC_ARCH_LLAMA);
        }
        if (W && !rc) rc = fsc_st_writer_write(w, e->name, W, e->nbytes);
        free(W), free(A), free(B);
    }
    if (w && rc) fsc_st_writer_abort(w);
    if (w && !rc) rc = fsc_st_writer_close(w);
    fsc_st_close(f);
    if (!rc && rename(tmp, path))
        rc = fsc_error(FSC_ERR_IO, "%s: cannot replace it (%s)", path, strerror(errno));
    return rc;
}

/* ---- --lora-from: an adapter directory into the model ------------------------------------ */

/* adapter_config.json against the flags: r, lora_alpha and target_modules must match. */
static int check_config(const trainer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return fsc_error(FSC_ERR_IO, "%s: %s", path, strerror(errno));
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *j = cJSON_Parse(text);
    int rc = FSC_OK;
    const train_options *o = &t->opt;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"),
                *a = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha"),
                *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules"),
                *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const double alpha = o->lora_alpha > 0 ? o->lora_alpha : o->lora_rank;
    if (!cJSON_IsObject(j))
        rc = fsc_error(FSC_ERR_FORMAT, "%s is not a JSON object", path);
    else if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA"))
        rc = fsc_error(FSC_ERR_FORMAT, "%s: peft_type is not \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble != o->lora_rank)
        rc = fsc_error(FSC_ERR_INVALID, "%s: r is %g, --lora-rank is %d", path,
                       cJSON_IsNumber(r) ? r->valuedouble : -1.0, o->lora_rank);
    else if (!cJSON_IsNumber(a) || a->valuedouble != alpha)
        rc = fsc_error(FSC_ERR_INVALID, "%s: lora_alpha is %g, --lora-alpha is %g", path,
                       cJSON_IsNumber(a) ? a->valuedouble : -1.0, alpha);
    else if (!cJSON_IsArray(tm) || cJSON_GetArraySize(tm) != t->nlora_targets)
        rc = fsc_error(FSC_ERR_INVALID, "%s: target_modules are not --lora-targets' %d modules",
                       path, t->nlora_targets);
    for (int k = 0; !rc && k < t->nlora_targets; k++) {
        bool found = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, tm) found |=
            cJSON_IsString(e) && !strcmp(e->valuestring, t->lora_targets[k]);
        if (!found)
            rc = fsc_error(FSC_ERR_INVALID, "%s: target_modules lack --lora-targets' %s", path,
                           t->lora_targets[k]);
    }
    cJSON_Delete(j);
    return rc;
}

/* Rank 0: the model's weights `from` with the adapter's tensors in place of
 * its adapters, into `to`. Every adapter of the model must be in the
 * directory, in its shape, and nothing else. */
static int combine(const trainer *t, const char *from, const char *dir, const char *to) {
    char path[4096], name[FSC_NAME_MAX * 3];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = check_config(t, dir);
    fsc_st_file *m = rc ? NULL : fsc_st_open(from, &rc);
    fsc_st_file *a = rc ? NULL : fsc_st_open(path, &rc);
    fsc_st_writer *w = rc ? NULL : fsc_st_writer_open(to, &rc);
    int used = 0;
    for (int i = 0; w && !rc && i < fsc_st_count(m); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(m, i), *ae = NULL;
        if (is_adapter(e->name)) {
            peft_name(&t->opt, e->name, name, sizeof name);
            if (!(ae = fsc_st_find(a, name)))
                rc = fsc_error(FSC_ERR_NOT_FOUND, "%s: no tensor %s", path, name);
            else if (ae->ndim != e->ndim || ae->shape[0] != e->shape[0] ||
                     ae->shape[1] != e->shape[1])
                rc = fsc_error(FSC_ERR_SHAPE, "%s: %s is [%lld, %lld], the model's is [%lld, %lld]",
                               path, name, (long long)ae->shape[0], (long long)ae->shape[1],
                               (long long)e->shape[0], (long long)e->shape[1]);
            used++;
        }
        if (!rc) rc = fsc_st_writer_declare(w, e->name, FSC_DTYPE_F32, e->ndim, e->shape);
    }
    if (!rc && w && used != fsc_st_count(a))
        rc = fsc_error(FSC_ERR_INVALID, "%s holds %d tensors, the model has %d adapters", path,
                       fsc_st_count(a), used);
    for (int i = 0; w && !rc && i < fsc_st_count(m); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(m, i);
        const fsc_st_entry *src = e;
        fsc_st_file *in = m;
        if (is_adapter(e->name)) {
            peft_name(&t->opt, e->name, name, sizeof name);
            src = fsc_st_find(a, name), in = a;
        }
        float *buf = read_f32(in, src, &rc);
        if (buf) rc = fsc_st_writer_write(w, e->name, buf, e->nbytes);
        free(buf);
    }
    if (w && rc) fsc_st_writer_abort(w);
    if (w && !rc) rc = fsc_st_writer_close(w);
    fsc_st_close(m);
    fsc_st_close(a);
    return rc;
}

/* Rank 0: `from` (the model's weights) with every tensor that is not an
 * adapter taken from the base file instead, into `to`: a base model has no
 * adapters, which keep their initialisation (B = 0: the base's function). */
static int combine_base(const trainer *t, const char *from, const char *base, const char *to) {
    (void)t;
    int rc = FSC_OK;
    fsc_st_file *m = fsc_st_open(from, &rc);
    fsc_st_file *b = rc ? NULL : fsc_st_open(base, &rc);
    fsc_st_writer *w = rc ? NULL : fsc_st_writer_open(to, &rc);
    for (int i = 0; w && !rc && i < fsc_st_count(m); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(m, i);
        rc = fsc_st_writer_declare(w, e->name, FSC_DTYPE_F32, e->ndim, e->shape);
    }
    for (int i = 0; w && !rc && i < fsc_st_count(m); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(m, i), *src = e;
        fsc_st_file *in = m;
        if (!is_adapter(e->name)) {
            in = b;
            if (!(src = fsc_st_find(b, e->name))) {
                rc = fsc_error(FSC_ERR_NOT_FOUND, "%s: no tensor %s", base, e->name);
                break;
            }
            if (src->nbytes != e->nbytes || src->ndim != e->ndim) {
                rc = fsc_error(FSC_ERR_SHAPE, "%s: %s has another shape than the model's", base,
                               e->name);
                break;
            }
        }
        float *buf = read_f32(in, src, &rc);
        if (buf) rc = fsc_st_writer_write(w, e->name, buf, e->nbytes);
        free(buf);
    }
    if (w && rc) fsc_st_writer_abort(w);
    if (w && !rc) rc = fsc_st_writer_close(w);
    fsc_st_close(m);
    fsc_st_close(b);
    return rc;
}

/* Saves the model's weights, has rank 0 make a file from them (make), and
 * loads that file on every rank; beside `near`. */
static int load_made(trainer *t, const char *near, const char *src,
                     int (*make)(const trainer *, const char *, const char *, const char *)) {
    if (!t->opt.lora_rank) return fsc_error(FSC_ERR_INVALID, "needs --lora-rank");
    char from[4200], to[4200]; /* near is a path (< 4096) */
    snprintf(from, sizeof from, "%.4095s.fsc-model.tmp", near);
    snprintf(to, sizeof to, "%.4095s.fsc-combined.tmp", near);
    int rc = fsc_trainer_save_weights(t->tr, t->rank == 0 ? from : NULL, 0, NULL, NULL);
    if (!rc && fsc_dist_rank() == 0) rc = make(t, from, src, to);
    /* every rank learns whether rank 0 made the file (and rank 0's message)
     * before any reads it */
    rc = fsc_group_agree(fsc_group_world(), rc, "combining the weights");
    if (!rc) rc = fsc_strategy_load_weights(t->s, to, NULL);
    int crc = fsc_group_barrier(fsc_group_world());
    if (fsc_dist_rank() == 0) unlink(from), unlink(to);
    return rc ? rc : crc;
}

static int make_adapter(const trainer *t, const char *from, const char *dir, const char *to) {
    return combine(t, from, dir, to);
}

int train_lora_load_adapter(trainer *t, const char *dir) {
    return load_made(t, dir, dir, make_adapter);
}

int train_lora_init_from(trainer *t, const char *base) {
    char file[4096];
    struct stat st;
    if (!stat(base, &st) && S_ISDIR(st.st_mode)) { /* a Hugging Face directory's one file */
        snprintf(file, sizeof file, "%s/model.safetensors", base);
        base = file;
    }
    return load_made(t, base, base, combine_base);
}
