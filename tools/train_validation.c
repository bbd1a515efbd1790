/* fsc-train's validation data and evaluation (train_validation.h). */
#define _POSIX_C_SOURCE 200809L /* strdup, strtok_r, glob */
#include "train_validation.h"

#include <glob.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/tokenizer.h"

static bool is_val_shard(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    return strstr(base, "_val") && n > 4 && !strcmp(base + n - 4, ".bin");
}

/* Appends ",path" (or "path") to a malloc'ed comma list. */
static int list_append(char **list, const char *path) {
    size_t have = *list ? strlen(*list) : 0;
    char *s = realloc(*list, have + strlen(path) + 2);
    if (!s) return fsc_error(FSC_ERR_NOMEM, "out of memory");
    if (have) s[have++] = ',';
    strcpy(s + have, path);
    *list = s;
    return FSC_OK;
}

int validation_find_shards(const train_options *o, validation *v) {
    if (!strpbrk(o->data, "*?[") || !strstr(o->data, ".bin")) return FSC_OK;
    char *spec = strdup(o->data), *train = NULL, *val = NULL, *save = NULL;
    int rc = spec ? FSC_OK : fsc_error(FSC_ERR_NOMEM, "out of memory");
    for (char *item = spec ? strtok_r(spec, ",", &save) : NULL; item && !rc;
         item = strtok_r(NULL, ",", &save)) {
        glob_t g;
        if (!strpbrk(item, "*?[") || glob(item, 0, NULL, &g)) { /* the loader says what is wrong */
            rc = list_append(&train, item);
            continue;
        }
        for (size_t i = 0; i < g.gl_pathc && !rc; i++)
            rc = list_append(is_val_shard(g.gl_pathv[i]) ? &val : &train, g.gl_pathv[i]);
        globfree(&g);
    }
    if (!rc && !train) /* only validation shards were asked for: train on them */
        train = val, val = NULL;
    if (!rc && v->on && !val && train) { /* *_val*.bin in the first shard's directory */
        char first[4096], pattern[4200];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(train, ","), train);
        snprintf(pattern, sizeof pattern, "%s/*_val*.bin", dirname(first));
        glob_t g;
        if (!glob(pattern, 0, NULL, &g)) {
            for (size_t i = 0; i < g.gl_pathc && !rc; i++) rc = list_append(&val, g.gl_pathv[i]);
            globfree(&g);
        }
    }
    free(spec);
    if (rc || !val) {
        free(train), free(val);
        return rc;
    }
    v->train_spec = train, v->val_spec = val;
    return FSC_OK;
}

/* Text or shards into tokens: text through the tokenizer when there is one. */
static int load_tokens(const char *spec, const fsc_bpe *bpe, const char *format, fsc_tokens *out) {
    bool text = bpe && strncmp(spec, "builtin", 7) && !strstr(spec, ".bin");
    if (text) return fsc_bpe_encode_file(bpe, spec, out);
    fsc_data_format f = FSC_DATA_AUTO; /* checked by train_options_check */
    int rc = fsc_data_format_parse(format, &f);
    return rc ? rc : fsc_tokens_load_as(spec, f, out);
}

int validation_load(trainer *t, const fsc_bpe *bpe, validation *v) {
    const train_options *o = &t->opt;
    const char *spec = o->val_data ? o->val_data : v->val_spec;
    int rc;
    if (spec) {
        if ((rc = load_tokens(spec, bpe, o->data_format, &v->tokens)))
            return fsc_error_context(rc, "--val-data %s: ", spec);
        snprintf(v->source, sizeof v->source, "%s", spec);
    } else {
        const int64_t n = (int64_t)((double)t->tokens.count * o->val_fraction);
        if (n < o->model.seq + 1 || t->tokens.count - n < o->model.seq + 1)
            return fsc_error(FSC_ERR_INVALID,
                             "--eval-every: --data has %" PRId64 " tokens; holding out "
                             "--val-fraction %g of them leaves too few for --seq %d on one side "
                             "(give --val-data, or a larger --val-fraction)",
                             t->tokens.count, o->val_fraction, o->model.seq);
        int32_t *tail = malloc((size_t)n * sizeof *tail);
        if (!tail) return fsc_error(FSC_ERR_NOMEM, "out of memory");
        const int64_t first = t->tokens.count - n;
        for (int64_t i = 0; i < n; i++) tail[i] = fsc_tokens_at(&t->tokens, first + i);
        rc = fsc_tokens_from_i32(tail, n, t->tokens.vocab, &v->tokens);
        free(tail);
        if (rc) return rc;
        t->tokens.count = first; /* training stops before the held-out tail */
        snprintf(v->source, sizeof v->source, "the last %g of --data (%" PRId64 " tokens)",
                 o->val_fraction, n);
    }
    if (v->tokens.vocab > o->model.vocab)
        return fsc_error(FSC_ERR_INVALID,
                         "validation data has token ids up to %d but --vocab is %d",
                         v->tokens.vocab - 1, o->model.vocab);
    if (v->tokens.count < o->model.seq + 1)
        return fsc_error(FSC_ERR_INVALID,
                         "validation data has %" PRId64 " tokens, fewer than "
                         "--seq + 1",
                         v->tokens.count);
    return FSC_OK;
}

/* The validation tokens of micro-batch mb (the plan's eval config keeps
 * them where its loss, or the pipeline's ends, read them). */
static int val_tokens(const fsc_micro_batch *mb, void *user, int32_t *x, int32_t *y) {
    const validation *v = user;
    return fsc_tokens_batch(&v->tokens, mb->step, mb->micro, mb->rank, mb->batch, mb->micros,
                            mb->world, v->seq, x, y);
}

int validation_run(trainer *t, validation *v, int64_t step) {
    fsc_trainer_eval_config cfg = {.batches = t->opt.eval_batches};
    v->seq = t->opt.model.seq;
    int rc = fsc_gpt_plan_eval_config(t->plan, val_tokens, v, &cfg);
    if (rc) return rc;
    double t0 = fsc_now();
    rc = fsc_trainer_eval(t->tr, &cfg, &v->loss);
    v->seconds = fsc_now() - t0;
    v->step = step;
    return rc;
}

void validation_free(validation *v) {
    fsc_tokens_free(&v->tokens);
    free(v->train_spec), free(v->val_spec);
    v->train_spec = v->val_spec = NULL;
}
