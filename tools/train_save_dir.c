/* --save-dir DIR: a directory Hugging Face's from_pretrained reads, whatever
 * the architecture (issue 28): the weights as model.safetensors (LLaMA: cut
 * into shards past --shard-size, with their index), config.json, and the
 * tokenizer the run used, copied so that the directory is complete on its
 * own (fsc-sample --model DIR needs no --tokenizer either).
 *
 * The tokenizer comes from --tokenizer (a tokenizer.json file, or a
 * directory) or else from --init-from when that is a directory. GPT-2's own
 * encoder.json and vocab.bpe are the same text as HF's vocab.json and
 * merges.txt, so they are copied under HF's names. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_common.h"

/* 64 MiB: LLaMA-3's tokenizer.json is 9 MB */
#define TOKENIZER_MAX_BYTES ((size_t)64 << 20)

static bool is_dir(const char *path) {
    struct stat sb;
    return path && !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

static bool exists(const char *path) {
    struct stat sb;
    return !stat(path, &sb) && S_ISREG(sb.st_mode);
}

static int copy_file(const char *from, const char *dir, const char *name) {
    char to[4200], *data = NULL;
    size_t n = 0;
    snprintf(to, sizeof to, "%s/%s", dir, name);
    int rc = fsc_file_read_all(from, TOKENIZER_MAX_BYTES, &data, &n);
    if (!rc) rc = fsc_file_write_atomic(to, data, n);
    free(data);
    return rc ? fsc_error_context(rc, "copying %s to %s: ", from, to) : FSC_OK;
}

/* The tokenizer's files of src (a directory, or a tokenizer.json) into dir;
 * *copied counts them. */
static int copy_tokenizer(const char *src, const char *dir, int *copied) {
    *copied = 0;
    if (!is_dir(src)) { /* a tokenizer.json by another name is still one */
        int rc = copy_file(src, dir, "tokenizer.json");
        *copied = !rc;
        return rc;
    }
    /* HF's names first; GPT-2's own files stand in for the pair when absent */
    static const char *const files[][2] = {
        {"tokenizer.json", NULL},          {"tokenizer_config.json", NULL},
        {"special_tokens_map.json", NULL}, {"vocab.json", "encoder.json"},
        {"merges.txt", "vocab.bpe"},       {"generation_config.json", NULL}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", src, files[i][0]);
        if (!exists(path) && files[i][1]) snprintf(path, sizeof path, "%s/%s", src, files[i][1]);
        if (!exists(path)) continue;
        int rc = copy_file(path, dir, files[i][0]);
        if (rc) return rc;
        ++*copied;
    }
    return FSC_OK;
}

int train_save_dir(trainer *t, const char *dir) {
    const train_options *o = &t->opt;
    const bool writer = fsc_dist_rank() == 0;
    int rc = FSC_OK;
    if (writer && mkdir(dir, 0777) && errno != EEXIST)
        rc = fsc_error(FSC_ERR_IO, "cannot create %s (%s)", dir, strerror(errno));
    else if (writer && !is_dir(dir))
        rc = fsc_error(FSC_ERR_IO, "%s is not a directory", dir);
    /* every rank takes part in the save: the verdict first, then the save together */
    if ((rc = fsc_group_agree(fsc_group_world(), rc, "creating --save-dir"))) return rc;
    char weights[4200];
    const bool llama = o->model.arch == FSC_ARCH_LLAMA;
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    /* LLaMA: trainer_save writes the directory (shards, config.json) itself */
    if ((rc = trainer_save(t, llama ? dir : weights))) return rc;
    if (!writer) return FSC_OK;
    if (!llama && (rc = train_config_write_hf(o, weights))) return rc;
    const char *src = o->tokenizer ? o->tokenizer : is_dir(o->init_from) ? o->init_from : NULL;
    int copied = 0;
    if (src && (rc = copy_tokenizer(src, dir, &copied))) return rc;
    if (!o->quiet)
        fprintf(stderr, "fsc-train: --save-dir %s: weights, config.json%s%s\n", dir,
                copied                  ? " and the tokenizer from "
                : o->model.vocab <= 256 ? " (byte tokens: no tokenizer)"
                                        : " (no tokenizer: give --tokenizer)",
                copied ? src : "");
    return FSC_OK;
}
