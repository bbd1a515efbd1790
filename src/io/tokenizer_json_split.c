/* tokenizer.json's pre-tokenizer: regex splits through PCRE2.
 *
 * A pre-tokenizer is a list of steps, each cutting every piece of the step
 * before into smaller ones: Split (a regex or a literal string, with
 * Hugging Face's five behaviours for what a match becomes), ByteLevel
 * (GPT-2's regex when use_regex, and the prefix space), Digits. The regexes
 * are Oniguruma's in the file and run here under PCRE2 in UTF mode with
 * Unicode properties (\p{L}, \s, caseless (?i:) by Unicode rules), JIT
 * compiled where the platform has it. Text that is valid UTF-8 (checked
 * once per segment) runs without PCRE2's own check on every call; other
 * text runs a second compile with PCRE2_MATCH_INVALID_UTF, where no pattern
 * matches a stray byte, so it falls into the pieces between matches and
 * still encodes byte by byte.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/bpe_internal.h"

/* ByteLevel's use_regex: GPT-2's pre-tokenizer. */
#define GPT2_REGEX                                                                                 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef enum { ISOLATED, REMOVED, MERGED_PREVIOUS, MERGED_NEXT, CONTIGUOUS } behavior;

struct bpe_split {
    pcre2_code *re;     /* for valid UTF-8, matched without PCRE2's check (done once here) */
    pcre2_code *re_any; /* PCRE2_MATCH_INVALID_UTF: for text that is not UTF-8 (3x slower) */
    behavior how;
    bool invert; /* the pieces are what the regex does not match */
};

typedef struct {
    size_t start, end;
    bool match;
} segment;

struct bpe_split_ws {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *jit;
    bpe_range *a, *b; /* the pieces before and after a step */
    size_t cap_a, cap_b;
    segment *seg;
    size_t cap_seg;
};

/* ---- reading the steps ---------------------------------------------------------------------- */

static int compile(const char *pattern, size_t len, uint32_t opts, const char *path,
                   const char *field, pcre2_code **re) {
    int err;
    PCRE2_SIZE at;
    /* PCRE2_LITERAL takes no UCP (nothing in a literal depends on it) */
    const uint32_t ucp = opts & PCRE2_LITERAL ? 0 : PCRE2_UCP;
    *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | ucp | opts, &err, &at, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return fsc_error(FSC_ERR_FORMAT, "%s: %s: PCRE2 refuses the regex at offset %zu: %s", path,
                         field, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* where JIT is missing, the interpreter runs */
    return FSC_OK;
}

static int add_step(fsc_bpe *t, const char *pattern, size_t len, bool literal, behavior how,
                    bool invert, const char *path, const char *field) {
    const uint32_t lit = literal ? PCRE2_LITERAL : 0;
    pcre2_code *re = NULL, *re_any = NULL;
    int rc = compile(pattern, len, lit, path, field, &re);
    if (!rc) rc = compile(pattern, len, lit | PCRE2_MATCH_INVALID_UTF, path, field, &re_any);
    bpe_split *s = rc ? NULL : realloc(t->split, (size_t)(t->nsplit + 1) * sizeof *s);
    if (!rc && !s) rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", path);
    if (rc) {
        pcre2_code_free(re), pcre2_code_free(re_any);
        return rc;
    }
    t->split = s;
    s[t->nsplit++] = (bpe_split){re, re_any, how, invert};
    return FSC_OK;
}

static bool flag(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int parse_split(fsc_bpe *t, const cJSON *o, const char *path, const char *field) {
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *how = cJSON_GetObjectItemCaseSensitive(o, "behavior");
    const cJSON *p = cJSON_IsString(re) ? re : lit;
    if (!cJSON_IsString(p))
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", path,
                         field);
    int b = -1;
    for (int i = 0; i < 5 && cJSON_IsString(how); i++)
        if (!strcmp(how->valuestring, names[i])) b = i;
    if (b < 0)
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: %s.behavior: expected Isolated, Removed, MergedWithPrevious, "
                         "MergedWithNext or Contiguous",
                         path, field);
    return add_step(t, p->valuestring, strlen(p->valuestring), p == lit, (behavior)b,
                    flag(o, "invert", false), path, field);
}

static int parse_step(fsc_bpe *t, const cJSON *o, const char *path, const char *field) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "Split")) return parse_split(t, o, path, field);
    if (!strcmp(ty, "Digits")) {
        const char *re = flag(o, "individual_digits", false) ? "\\p{N}" : "\\p{N}+";
        return add_step(t, re, strlen(re), false, ISOLATED, false, path, field);
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (flag(o, "add_prefix_space", true)) {
            if (t->nsplit) /* a space before every piece of an earlier split: no file does that */
                return fsc_error(FSC_ERR_UNSUPPORTED,
                                 "%s: %s.add_prefix_space: true after another split step is not "
                                 "supported (only as the first step)",
                                 path, field);
            t->prefix_space = true;
        }
        if (!flag(o, "use_regex", true)) return FSC_OK;
        return add_step(t, GPT2_REGEX, strlen(GPT2_REGEX), false, ISOLATED, false, path, field);
    }
    return fsc_error(FSC_ERR_UNSUPPORTED,
                     "%s: %s.type \"%s\" is not supported: fsc reads byte-level BPE tokenizers "
                     "(Split, ByteLevel, Digits, or a Sequence of them)",
                     path, field, ty);
}

int fsc_bpe_split_parse(fsc_bpe *t, const void *json, const char *path) {
    const cJSON *pre = json;
    if (!pre || cJSON_IsNull(pre)) return FSC_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "Sequence"))
        return parse_step(t, pre, path, "pre_tokenizer");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (!cJSON_IsArray(steps))
        return fsc_error(FSC_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers: expected an array",
                         path);
    int i = 0, rc = FSC_OK;
    const cJSON *s;
    cJSON_ArrayForEach(s, steps) {
        char field[64];
        snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%d]", i++);
        if ((rc = parse_step(t, s, path, field))) break;
    }
    return rc;
}

void fsc_bpe_split_free(fsc_bpe *t) {
    for (int i = 0; i < t->nsplit; i++)
        pcre2_code_free(t->split[i].re), pcre2_code_free(t->split[i].re_any);
    free(t->split);
    t->split = NULL, t->nsplit = 0;
}

/* ---- running them --------------------------------------------------------------------------- */

bpe_split_ws *fsc_bpe_split_ws_new(const fsc_bpe *t) {
    bpe_split_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->md = pcre2_match_data_create(1, NULL); /* the whole match is all a split needs */
    ws->mc = pcre2_match_context_create(NULL);
    ws->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (ws->mc && ws->jit) pcre2_jit_stack_assign(ws->mc, NULL, ws->jit);
    if (!ws->md || !ws->mc) {
        fsc_bpe_split_ws_free(ws);
        return NULL;
    }
    (void)t;
    return ws;
}

void fsc_bpe_split_ws_free(bpe_split_ws *ws) {
    if (!ws) return;
    pcre2_match_data_free(ws->md);
    pcre2_match_context_free(ws->mc);
    pcre2_jit_stack_free(ws->jit);
    free(ws->a), free(ws->b), free(ws->seg);
    free(ws);
}

/* p (*cap elements of size bytes) reallocated to hold need, doubling from
 * 64, and *cap set; p itself, *cap kept, when it already holds need or
 * realloc fails (the caller checks *cap). It returns the pointer, since
 * taking the caller's T ** as a void ** would be a pun. */
static void *grow(void *p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(p, c * size);
    if (!q) return p;
    *cap = c;
    return q;
}

/* The matches of step in s[0..n) and the gaps between them, in order. */
static int find_segments(const bpe_split *step, bool utf8, bpe_split_ws *ws, const char *s,
                         size_t n, size_t *nseg) {
    size_t k = 0, prev = 0, from = 0;
    while (from < n) {
        int r =
            utf8 ? pcre2_match(step->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, ws->md, ws->mc)
                 : pcre2_match(step->re_any, (PCRE2_SPTR)s, n, from, 0, ws->md, ws->mc);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return fsc_error(FSC_ERR_FORMAT, /* a file's regex that backtracks without end */
                             "pre-tokenizer: PCRE2 gave up on the file's regex: %s",
                             (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ws->md);
        if (ov[1] == ov[0]) { /* an empty match splits nothing: step over a character */
            from = ov[0] + 1;
            while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        ws->seg = grow(ws->seg, &ws->cap_seg, k + 2, sizeof *ws->seg);
        if (ws->cap_seg < k + 2) return fsc_error(FSC_ERR_NOMEM, "pre-tokenizer: out of memory");
        if (ov[0] > prev) ws->seg[k++] = (segment){prev, ov[0], step->invert};
        ws->seg[k++] = (segment){ov[0], ov[1], !step->invert};
        prev = from = ov[1];
    }
    ws->seg = grow(ws->seg, &ws->cap_seg, k + 1, sizeof *ws->seg);
    if (ws->cap_seg < k + 1) return fsc_error(FSC_ERR_NOMEM, "pre-tokenizer: out of memory");
    if (prev < n) ws->seg[k++] = (segment){prev, n, step->invert};
    *nseg = k;
    return FSC_OK;
}

/* Folds the segments into pieces as Hugging Face's behaviour says. */
static size_t fold(behavior how, segment *seg, size_t k) {
    size_t m = 0;
    bool prev_match = false;
    if (how == MERGED_NEXT) { /* a match joins the piece after it: fold right to left */
        for (size_t i = k; i-- > 0;) {
            if (seg[i].match && !prev_match && m)
                seg[k - m].start = seg[i].start;
            else
                seg[k - ++m] = seg[i];
            prev_match = seg[i].match;
        }
        memmove(seg, seg + k - m, m * sizeof *seg);
        return m;
    }
    for (size_t i = 0; i < k; i++) {
        const bool join = how == MERGED_PREVIOUS ? seg[i].match && !prev_match
                          : how == CONTIGUOUS    ? i > 0 && seg[i].match == prev_match
                                                 : false;
        prev_match = seg[i].match;
        if (how == REMOVED && seg[i].match) continue;
        if (join && m)
            seg[m - 1].end = seg[i].end;
        else
            seg[m++] = seg[i];
    }
    return m;
}

/* Whether s[0..n) is valid UTF-8 (shortest forms, no surrogates). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int len;
        if (fsc_bpe_utf8_next(s + i, n - i, &len) < 0) return false;
        i += (size_t)len;
    }
    return true;
}

int fsc_bpe_split_run(const fsc_bpe *t, bpe_split_ws *ws, const char *s, size_t n,
                      const bpe_range **pieces, size_t *count) {
    const bool utf8 = valid_utf8((const unsigned char *)s, n);
    ws->a = grow(ws->a, &ws->cap_a, 1, sizeof *ws->a);
    if (ws->cap_a < 1) return fsc_error(FSC_ERR_NOMEM, "pre-tokenizer: out of memory");
    ws->a[0] = (bpe_range){0, n};
    size_t na = 1;
    for (int st = 0; st < t->nsplit; st++) {
        size_t nb = 0;
        for (size_t i = 0; i < na; i++) {
            const size_t base = ws->a[i].start, k_n = ws->a[i].end - base;
            size_t k;
            int rc = find_segments(&t->split[st], utf8, ws, s + base, k_n, &k);
            if (rc) return rc;
            k = fold(t->split[st].how, ws->seg, k);
            ws->b = grow(ws->b, &ws->cap_b, nb + k, sizeof *ws->b);
            if (ws->cap_b < nb + k) return fsc_error(FSC_ERR_NOMEM, "pre-tokenizer: out of memory");
            for (size_t j = 0; j < k; j++)
                ws->b[nb++] = (bpe_range){base + ws->seg[j].start, base + ws->seg[j].end};
        }
        bpe_range *tmp = ws->a;
        size_t cap = ws->cap_a;
        ws->a = ws->b, ws->cap_a = ws->cap_b;
        ws->b = tmp, ws->cap_b = cap;
        na = nb;
    }
    *pieces = ws->a, *count = na;
    return FSC_OK;
}
