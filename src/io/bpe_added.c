/* tokenizer.json's added tokens ("<|begin_of_text|>", "<|endoftext|>"),
 * found in the text before any pre-tokenizing, as Hugging Face does.
 *
 * Two byte tries, as Hugging Face keeps two passes: the tokens matched on
 * the raw text ("normalized": false, every special token of today's files)
 * and, in the text between those, the others. A match is leftmost, then
 * longest; "lstrip" / "rstrip" take the Unicode white space beside it too.
 * A trie node keeps its children as a sibling list: the tries are small
 * (LLaMA-3: 256 tokens) and a first-byte table rejects most positions.
 */
#include <stdlib.h>
#include <string.h>

#include "io/bpe_internal.h"

typedef struct {
    int32_t child, sibling, id; /* id -1: no token ends here */
    unsigned char byte;
    bool lstrip, rstrip;
} trie_node;

struct bpe_trie {
    trie_node *node; /* node 0: the root */
    int32_t n, cap;
    bool first[256]; /* a token starts with this byte */
};

static int32_t child(const struct bpe_trie *tr, int32_t at, unsigned char b) {
    for (int32_t c = tr->node[at].child; c >= 0; c = tr->node[c].sibling)
        if (tr->node[c].byte == b) return c;
    return -1;
}

static int32_t add_child(struct bpe_trie *tr, int32_t at, unsigned char b) {
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? 2 * tr->cap : 64;
        trie_node *p = realloc(tr->node, (size_t)cap * sizeof *p);
        if (!p) return -1;
        tr->node = p, tr->cap = cap;
    }
    int32_t c = tr->n++;
    tr->node[c] = (trie_node){-1, tr->node[at].child, -1, b, false, false};
    tr->node[at].child = c;
    return c;
}

int fsc_bpe_added_build(fsc_bpe *t, const bpe_added_token *tok, int n) {
    for (int i = 0; i < n; i++) {
        const int pass = tok[i].normalized ? 1 : 0;
        struct bpe_trie *tr = t->added[pass];
        if (!tr) {
            tr = t->added[pass] = calloc(1, sizeof *tr);
            trie_node *root = tr ? malloc(64 * sizeof *root) : NULL;
            if (!root) return fsc_error(FSC_ERR_NOMEM, "added tokens: out of memory");
            root[0] = (trie_node){-1, -1, -1, 0, false, false};
            tr->node = root, tr->n = 1, tr->cap = 64;
        }
        int32_t at = 0;
        for (size_t j = 0; j < tok[i].len && at >= 0; j++) {
            const unsigned char b = (unsigned char)tok[i].content[j];
            int32_t c = child(tr, at, b);
            at = c >= 0 ? c : add_child(tr, at, b);
        }
        if (at < 0) return fsc_error(FSC_ERR_NOMEM, "added tokens: out of memory");
        tr->first[(unsigned char)tok[i].content[0]] = true;
        tr->node[at].id = tok[i].id; /* a repeated content: the last one wins, as a map would */
        tr->node[at].lstrip = tok[i].lstrip, tr->node[at].rstrip = tok[i].rstrip;
    }
    return FSC_OK;
}

void fsc_bpe_added_free(fsc_bpe *t) {
    for (int p = 0; p < 2; p++) {
        if (t->added[p]) free(t->added[p]->node);
        free(t->added[p]);
        t->added[p] = NULL;
    }
}

/* The start of the UTF-8 character that ends at end (> from). */
static size_t char_before(const unsigned char *s, size_t from, size_t end) {
    size_t i = end - 1;
    while (i > from && end - i < 4 && (s[i] & 0xC0) == 0x80) i--;
    return i;
}

bool fsc_bpe_added_next(const fsc_bpe *t, int pass, const unsigned char *s, size_t n, size_t from,
                        size_t *start, size_t *end, int32_t *id) {
    const struct bpe_trie *tr = t->added[pass];
    if (!tr) return false;
    for (size_t i = from; i < n; i++) {
        if (!tr->first[s[i]]) continue;
        int32_t at = 0, best = -1;
        size_t best_end = i;
        for (size_t j = i; j < n && (at = child(tr, at, s[j])) >= 0; j++)
            if (tr->node[at].id >= 0) best = at, best_end = j + 1;
        if (best < 0) continue;
        size_t a = i, b = best_end;
        while (tr->node[best].lstrip && a > from) {
            size_t c = char_before(s, from, a);
            int len;
            if (!fsc_bpe_is_space(fsc_bpe_utf8_next(s + c, n - c, &len)) || c + (size_t)len != a)
                break;
            a = c;
        }
        while (tr->node[best].rstrip && b < n) {
            int len;
            if (!fsc_bpe_is_space(fsc_bpe_utf8_next(s + b, n - b, &len))) break;
            b += (size_t)len;
        }
        *start = a, *end = b, *id = tr->node[best].id;
        return true;
    }
    return false;
}
