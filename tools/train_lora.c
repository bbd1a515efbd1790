/* fsc-train's LoRA files: the adapters as a Hugging Face PEFT directory
 * (--save-adapter: adapter_model.safetensors under PEFT's names and
 * adapter_config.json), and --lora-merge (the saved weights with B A
 * scale folded into each adapted base weight, the adapters left out).
 *
 * Both start from the weights file every strategy writes by global name
 * (fsc_trainer_save_weights, on rank 0), so they work under any layout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static int write_config(const trainer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return fsc_error(FSC_ERR_IO, "%s: %s", path, strerror(errno));
    const train_options *o = &t->opt;
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": %d,\n",
            o->lora_rank);
    fprintf(f, "  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.9g,\n  \"bias\": \"none\",\n",
            o->lora_alpha > 0 ? o->lora_alpha : (double)o->lora_rank, o->lora_dropout);
    fprintf(f, "  \"fan_in_fan_out\": %s,\n", o->model.arch == FSC_ARCH_LLAMA ? "false" : "true");
    fprintf(f, "  \"base_model_name_or_path\": \"%s\",\n  \"target_modules\": [",
            o->init_from ? o->init_from : "");
    for (int k = 0; k < t->nlora_targets; k++)
        fprintf(f, "%s\"%s\"", k ? ", " : "", t->lora_targets[k]);
    fprintf(f, "]\n}\n");
    return fclose(f) ? fsc_error(FSC_ERR_IO, "%s: %s", path, strerror(errno)) : FSC_OK;
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

int train_lora_save_adapter(trainer *t, const char *dir) {
    if (!t->opt.lora_rank) return fsc_error(FSC_ERR_INVALID, "needs --lora-rank");
    if (t->rank == 0 && mkdir(dir, 0777) && errno != EEXIST)
        return fsc_error(FSC_ERR_IO, "%s: cannot create it (%s)", dir, strerror(errno));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/.fsc-weights.tmp.safetensors", dir);
    int rc = fsc_trainer_save_weights(t->tr, t->rank == 0 ? tmp : NULL, 0, NULL, NULL);
    if (!rc && t->rank == 0) rc = write_adapter(t, tmp, dir);
    if (t->rank == 0) unlink(tmp);
    return rc;
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
