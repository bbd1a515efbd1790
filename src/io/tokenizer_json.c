/* Hugging Face's tokenizer.json, for byte-level BPE models (GPT-2, LLaMA-3,
 * SmolLM, RoBERTa-style files).
 *
 * Read: "model" (BPE: vocab, merges as "a b" strings or ["a", "b"] pairs,
 * ignore_merges), "added_tokens" (matched in the text before anything
 * else; bpe_added.c), "pre_tokenizer" (tokenizer_json_split.c),
 * "post_processor" (the ids TemplateProcessing, RobertaProcessing or
 * BertProcessing put around a single text when the caller asks for special
 * tokens), "normalizer" (none or NFC; tokenizer_json_normalize.c) and
 * "decoder" (ByteLevel). Anything else a
 * file asks for is refused with the field named, never half-run: a
 * tokenizer that loads encodes as Hugging Face's does. "truncation" and
 * "padding" are batch settings of the Python API and are not read: fsc
 * encodes whole texts.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/bpe_internal.h"

static const cJSON *item(const cJSON *o, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = item(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static bool is_unset(const cJSON *v) { /* absent, null, false, "" or 0: a default */
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !*v->valuestring) ||
           (cJSON_IsNumber(v) && v->valuedouble == 0);
}

/* ---- model ---------------------------------------------------------------------------------- */

typedef struct {
    char **tok; /* per id: raw bytes */
    long *len;  /* -1: no token */
    bool *in_model;
    char *pool;
    size_t pool_used;
    int n;
} vocab_build;

/* Ids past this are refused: the largest vocabularies of today are ~256k,
 * and a lying id must not size the tables (they are dense, by id). */
#define MAX_ID (1 << 24)

/* The largest id of the model's vocabulary and of the added tokens, + 1. */
static int count_ids(const cJSON *vocab, const cJSON *added, const char *path, int *n) {
    double top = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v < MAX_ID && v == (int)v))
            return fsc_error(FSC_ERR_FORMAT,
                             "%s: model.vocab: token \"%.40s\" has id %g (ids are 0..%d)", path,
                             e->string, v, MAX_ID - 1);
        top = v > top ? v : top;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = item(e, "id");
        double v = cJSON_IsNumber(id) ? id->valuedouble : -1;
        if (!(v >= 0 && v < MAX_ID && v == (int)v))
            return fsc_error(FSC_ERR_FORMAT,
                             "%s: added_tokens: an entry without a valid id (0..%d)", path,
                             MAX_ID - 1);
        top = v > top ? v : top;
    }
    *n = (int)top + 1;
    return FSC_OK;
}

static int read_vocab(vocab_build *vb, const cJSON *vocab, const int16_t *cp_to_byte,
                      const char *path) {
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        const int id = (int)e->valuedouble;
        if (vb->len[id] >= 0)
            return fsc_error(FSC_ERR_FORMAT, "%s: model.vocab: id %d is given twice (\"%.40s\")",
                             path, id, e->string);
        long k = fsc_bpe_unmap(e->string, strlen(e->string), cp_to_byte, vb->pool + vb->pool_used);
        if (k < 0)
            return fsc_error(FSC_ERR_FORMAT,
                             "%s: model.vocab: token \"%.40s\" has a character outside the "
                             "ByteLevel alphabet (not a byte-level BPE vocabulary?)",
                             path, e->string);
        vb->tok[id] = vb->pool + vb->pool_used, vb->len[id] = k, vb->in_model[id] = true;
        vb->pool_used += (size_t)k;
    }
    return FSC_OK;
}

/* One merge: "a b" or ["a", "b"], each part a token, and their concatenation. */
static int read_merge(fsc_bpe *t, const cJSON *m, int rank, const int16_t *cp_to_byte, char *buf,
                      const char *path) {
    const char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (sp && !strchr(sp + 1, ' ')) a = s, la = (size_t)(sp - s), b = sp + 1, lb = strlen(b);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        a = cJSON_GetArrayItem(m, 0)->valuestring, la = strlen(a);
        b = cJSON_GetArrayItem(m, 1)->valuestring, lb = strlen(b);
    }
    long ka = a ? fsc_bpe_unmap(a, la, cp_to_byte, buf) : -1;
    long kb = ka > 0 ? fsc_bpe_unmap(b, lb, cp_to_byte, buf + ka) : -1;
    int32_t ia = ka > 0 ? fsc_bpe_find(t, buf, (size_t)ka) : -1;
    int32_t ib = kb > 0 ? fsc_bpe_find(t, buf + ka, (size_t)kb) : -1;
    int32_t ab = ia >= 0 && ib >= 0 ? fsc_bpe_find(t, buf, (size_t)(ka + kb)) : -1;
    if (ab < 0) {
        char *shown = cJSON_PrintUnformatted(m);
        int rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: model.merges[%d] %.60s: expected \"a b\" or [\"a\", \"b\"], two "
                           "tokens of model.vocab whose concatenation is one too",
                           path, rank, shown ? shown : "?");
        free(shown);
        return rc;
    }
    fsc_bpe_add_merge(t, ia, ib, ab);
    return FSC_OK;
}

static int read_model(fsc_bpe *t, const cJSON *model, vocab_build *vb, const int16_t *cp_to_byte,
                      const char *path) {
    static const char *const unsupported[] = {"dropout", "continuing_subword_prefix",
                                              "end_of_word_suffix", "byte_fallback"};
    for (int i = 0; i < 4; i++)
        if (!is_unset(item(model, unsupported[i])))
            return fsc_error(FSC_ERR_UNSUPPORTED, "%s: model.%s is set; fsc's BPE does not run it",
                             path, unsupported[i]);
    const cJSON *vocab = item(model, "vocab"), *merges = item(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: model: expected \"vocab\" (an object) and "
                         "\"merges\" (an array)",
                         path);
    t->ignore_merges = cJSON_IsTrue(item(model, "ignore_merges"));
    int rc = read_vocab(vb, vocab, cp_to_byte, path);
    return rc;
}

static int read_merges(fsc_bpe *t, const cJSON *merges, const int16_t *cp_to_byte,
                       const char *path) {
    int rc = fsc_bpe_alloc_merges(t, (size_t)cJSON_GetArraySize(merges), path);
    size_t longest = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        size_t l = cJSON_IsString(m) ? strlen(m->valuestring) : 0;
        for (int i = 0; cJSON_IsArray(m) && i < cJSON_GetArraySize(m); i++) {
            const cJSON *p = cJSON_GetArrayItem(m, i);
            l += cJSON_IsString(p) ? strlen(p->valuestring) : 0;
        }
        longest = l > longest ? l : longest;
    }
    char *buf = rc ? NULL : malloc(longest + 1);
    if (!rc && !buf) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    int rank = 0;
    cJSON_ArrayForEach(m, merges) {
        if (rc) break;
        rc = read_merge(t, m, rank++, cp_to_byte, buf, path);
    }
    free(buf);
    return rc;
}

/* ---- added tokens --------------------------------------------------------------------------- */

static int read_added(fsc_bpe *t, const cJSON *added, vocab_build *vb, const char *path) {
    const int n = cJSON_GetArraySize(added);
    bpe_added_token *tok = calloc((size_t)n + 1, sizeof *tok);
    if (!tok) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    int i = 0, rc = FSC_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const cJSON *content = item(e, "content");
        const int id = (int)item(e, "id")->valuedouble;
        if (!cJSON_IsString(content) || !*content->valuestring) {
            rc = fsc_error(FSC_ERR_FORMAT, "%s: added_tokens[%d]: no \"content\"", path, i);
            break;
        }
        if (cJSON_IsTrue(item(e, "single_word"))) {
            rc = fsc_error(FSC_ERR_UNSUPPORTED,
                           "%s: added_tokens[%d] (\"%.40s\"): single_word is not supported", path,
                           i, content->valuestring);
            break;
        }
        const size_t len = strlen(content->valuestring);
        if (vb->len[id] >= 0 &&
            ((size_t)vb->len[id] != len || memcmp(vb->tok[id], content->valuestring, len))) {
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: added_tokens[%d]: id %d is \"%.40s\" but model.vocab has another "
                           "token there",
                           path, i, id, content->valuestring);
            break;
        }
        vb->tok[id] = content->valuestring, vb->len[id] = (long)len;
        t->kind[id] |= BPE_TOKEN_ADDED | (cJSON_IsTrue(item(e, "special")) ? BPE_TOKEN_SPECIAL : 0);
        tok[i++] = (bpe_added_token){content->valuestring,
                                     len,
                                     id,
                                     cJSON_IsTrue(item(e, "lstrip")),
                                     cJSON_IsTrue(item(e, "rstrip")),
                                     cJSON_IsTrue(item(e, "normalized"))};
    }
    if (!rc) rc = fsc_bpe_added_build(t, tok, i);
    free(tok);
    return rc;
}

/* ---- post-processor, normalizer, decoder ------------------------------------------------------
 */

static int push_post(fsc_bpe *t, int32_t id, bool before, const char *path) {
    int32_t *p = realloc(t->post, (size_t)(t->npre + t->npost + 1) * sizeof *p);
    if (!p) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    t->post = p;
    if (before) { /* the ids before the text come first in post */
        memmove(p + t->npre + 1, p + t->npre, (size_t)t->npost * sizeof *p);
        p[t->npre++] = id;
    } else {
        p[t->npre + t->npost++] = id;
    }
    return FSC_OK;
}

/* A token named by the post-processor: its id, which must be a token. */
static int post_id(fsc_bpe *t, const cJSON *v, const char *path, const char *field, int32_t *id) {
    *id = cJSON_IsNumber(v) ? (int32_t)v->valuedouble : -1;
    if (*id < 0 || *id >= t->n || (t->kind[*id] & BPE_TOKEN_UNUSED))
        return fsc_error(FSC_ERR_FORMAT, "%s: %s: not the id of a token", path, field);
    return FSC_OK;
}

static int read_template(fsc_bpe *t, const cJSON *pp, const char *path) {
    const cJSON *single = item(pp, "single"), *specials = item(pp, "special_tokens");
    bool seen_a = false;
    const cJSON *e;
    int rc = cJSON_IsArray(single)
                 ? FSC_OK
                 : fsc_error(FSC_ERR_FORMAT, "%s: post_processor.single: expected an array", path);
    cJSON_ArrayForEach(e, single) {
        if (rc) break;
        const cJSON *seq = item(e, "Sequence"), *sp = item(e, "SpecialToken");
        const cJSON *name = item(seq ? seq : sp, "id");
        if (seq && cJSON_IsString(name) && !strcmp(name->valuestring, "A") && !seen_a) {
            seen_a = true;
            continue;
        }
        const cJSON *ids =
            cJSON_IsString(name) ? item(item(specials, name->valuestring), "ids") : NULL;
        if (!sp || !cJSON_IsArray(ids)) {
            rc =
                fsc_error(FSC_ERR_FORMAT,
                          "%s: post_processor.single: expected one {\"Sequence\": {\"id\": \"A\"}} "
                          "and special tokens listed in post_processor.special_tokens",
                          path);
            break;
        }
        const cJSON *v;
        cJSON_ArrayForEach(v, ids) {
            int32_t id;
            if ((rc = post_id(t, v, path, "post_processor.special_tokens", &id))) break;
            if ((rc = push_post(t, id, !seen_a, path))) break;
        }
    }
    if (!rc && !seen_a)
        rc = fsc_error(FSC_ERR_FORMAT,
                       "%s: post_processor.single: no {\"Sequence\": {\"id\": \"A\"}}", path);
    return rc;
}

static int read_post(fsc_bpe *t, const cJSON *pp, const char *path) {
    if (!pp || cJSON_IsNull(pp)) return FSC_OK;
    const char *ty = type_of(pp);
    ty = ty ? ty : "";
    if (!strcmp(ty, "ByteLevel")) return FSC_OK; /* offsets only */
    if (!strcmp(ty, "TemplateProcessing")) {
        if (t->npre || t->npost)
            return fsc_error(FSC_ERR_UNSUPPORTED, "%s: post_processor: more than one template",
                             path);
        return read_template(t, pp, path);
    }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        const cJSON *cls = item(pp, "cls"), *sep = item(pp, "sep");
        int32_t a, b;
        int rc = post_id(t, cJSON_GetArrayItem(cls, 1), path, "post_processor.cls", &a);
        if (!rc) rc = post_id(t, cJSON_GetArrayItem(sep, 1), path, "post_processor.sep", &b);
        if (!rc) rc = push_post(t, a, true, path);
        return rc ? rc : push_post(t, b, false, path);
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, item(pp, "processors")) {
            int rc = read_post(t, e, path);
            if (rc) return rc;
        }
        return FSC_OK;
    }
    return fsc_error(FSC_ERR_UNSUPPORTED,
                     "%s: post_processor.type \"%s\" is not supported (TemplateProcessing, "
                     "RobertaProcessing, BertProcessing, ByteLevel or a Sequence of them)",
                     path, ty);
}

static int check_rest(fsc_bpe *t, const cJSON *root, const char *path) {
    const cJSON *dec = item(root, "decoder");
    int rc = fsc_bpe_normalizer_parse(t, item(root, "normalizer"), path);
    if (rc) return rc;
    const char *ty = type_of(dec);
    if (!ty || strcmp(ty, "ByteLevel"))
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: decoder \"%s\" is not supported (ByteLevel only: fsc decodes "
                         "byte-level BPE)",
                         path, ty ? ty : "none");
    return FSC_OK;
}

/* ---- the file ------------------------------------------------------------------------------- */

static int load(fsc_bpe *t, const cJSON *root, const char *path) {
    const cJSON *model = item(root, "model"), *added = item(root, "added_tokens");
    if (!cJSON_IsObject(model))
        return fsc_error(FSC_ERR_FORMAT, "%s: no \"model\" object (not a tokenizer.json?)", path);
    if (added && !cJSON_IsArray(added))
        return fsc_error(FSC_ERR_FORMAT, "%s: added_tokens: expected an array", path);
    const char *ty = type_of(model);
    if (ty && strcmp(ty, "BPE"))
        return fsc_error(FSC_ERR_UNSUPPORTED,
                         "%s: model.type \"%s\" is not supported: fsc reads byte-level BPE "
                         "tokenizers (model.type \"BPE\")",
                         path, ty);
    int rc = check_rest(t, root, path);
    int n = 0;
    if (!rc && !cJSON_IsObject(item(model, "vocab")))
        rc = fsc_error(FSC_ERR_FORMAT, "%s: model.vocab: expected an object", path);
    if (!rc) rc = count_ids(item(model, "vocab"), added, path, &n);
    size_t pool = 0;
    const cJSON *e;
    if (!rc) cJSON_ArrayForEach(e, item(model, "vocab")) pool += strlen(e->string);
    vocab_build vb = {calloc((size_t)n + 1, sizeof(char *)),
                      calloc((size_t)n + 1, sizeof(long)),
                      calloc((size_t)n + 1, sizeof(bool)),
                      malloc(pool + 1),
                      0,
                      n};
    t->kind = calloc((size_t)n + 1, 1);
    if (!rc && (!vb.tok || !vb.len || !vb.in_model || !vb.pool || !t->kind))
        rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory for %d tokens", path, n);
    for (int i = 0; !rc && i < n; i++) vb.len[i] = -1;
    int16_t cp_to_byte[324];
    fsc_bpe_alphabet(cp_to_byte);
    if (!rc) rc = read_model(t, model, &vb, cp_to_byte, path);
    if (!rc && added) rc = read_added(t, added, &vb, path);
    for (int i = 0; !rc && i < n; i++) t->kind[i] |= vb.len[i] < 0 ? BPE_TOKEN_UNUSED : 0;
    if (!rc) rc = fsc_bpe_set_vocab(t, n, vb.tok, vb.len, vb.in_model, path);
    if (!rc) rc = fsc_bpe_find_bytes(t, path);
    if (!rc) rc = read_merges(t, item(model, "merges"), cp_to_byte, path);
    if (!rc) rc = fsc_bpe_split_parse(t, item(root, "pre_tokenizer"), path);
    if (!rc) rc = read_post(t, item(root, "post_processor"), path);
    if (!rc) t->eot = fsc_bpe_token_id(t, "<|endoftext|>", 13);
    free(vb.tok), free(vb.len), free(vb.in_model), free(vb.pool);
    return rc;
}

int fsc_bpe_load_json_file(const char *path, fsc_bpe **out) {
    cJSON *root;
    int rc = fsc_bpe_read_json_object(path, "(a tokenizer.json is one)", &root);
    if (rc) return rc;
    fsc_bpe *t = calloc(1, sizeof *t);
    if (!t) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    if (t) t->json = true, t->eot = -1;
    if (!rc) rc = load(t, root, path);
    cJSON_Delete(root);
    if (rc) {
        fsc_bpe_free(t);
        return rc;
    }
    *out = t;
    return FSC_OK;
}
