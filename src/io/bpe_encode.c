/* Byte-level BPE: text in, ids out.
 *
 * The text is cut into pieces (tokenizer.json: added tokens first, then the
 * pre-tokenizer's steps; GPT-2's files: its hand-written regex), and each
 * piece's bytes start as single-byte tokens that merge, lowest rank first
 * and leftmost among equal ranks, until no adjacent pair has a merge: the
 * order Hugging Face's tokenizers keep with a heap, kept here the same way
 * (a doubly linked list of symbols, a heap of (rank, position)), so a long
 * piece costs n log n, not n^2. A piece seen before in the same call is
 * not merged again: a per-call cache maps its bytes to its ids (per call,
 * so a const tokenizer is safe to share between threads).
 */
#include <stdlib.h>
#include <string.h>

#include "io/bpe_internal.h"

#define CACHE_SLOTS (1u << 15)
#define CACHE_ENTRIES (1u << 14) /* then it starts over */
#define CACHE_KEY_MAX 32         /* longer pieces are rare and not kept */

typedef struct {
    uint32_t hash, key_off, ids_off;
    uint16_t key_len, nids;
} cache_entry;

typedef struct {
    int32_t id, prev, next; /* id -1: merged into its left neighbour */
} symbol;

typedef struct {
    symbol *sym;
    uint64_t *heap;  /* rank << 32 | position of the pair's left symbol */
    size_t cap;      /* of sym and heap (heap holds at most 2 * cap) */
    uint32_t *slots; /* cache: entry + 1, 0 empty */
    cache_entry *ent;
    uint32_t nent;
    char *keys;
    int32_t *ids;
    uint32_t key_used, ids_used;
    char *seg; /* a segment with ByteLevel's prefix space */
    size_t seg_cap;
    bpe_split_ws *split;
} encoder;

static void encoder_free(encoder *e) {
    free(e->sym), free(e->heap), free(e->slots), free(e->ent), free(e->keys), free(e->ids);
    free(e->seg);
    fsc_bpe_split_ws_free(e->split);
}

static int reserve(encoder *e, size_t n) {
    if (n <= e->cap) return FSC_OK;
    size_t cap = e->cap ? e->cap : 256;
    while (cap < n) cap *= 2;
    symbol *s = realloc(e->sym, cap * sizeof *s);
    if (s) e->sym = s;
    uint64_t *h = s ? realloc(e->heap, 2 * cap * sizeof *h) : NULL;
    if (h) e->heap = h;
    if (!s || !h) return fsc_error(FSC_ERR_NOMEM, "BPE: out of memory for a %zu-byte piece", n);
    e->cap = cap;
    return FSC_OK;
}

/* ---- the per-call cache of pieces ----------------------------------------------------------- */

static uint32_t hash_piece(const unsigned char *p, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static const cache_entry *cache_get(const encoder *e, const unsigned char *p, size_t n,
                                    uint32_t h) {
    for (uint32_t s = h & (CACHE_SLOTS - 1);; s = (s + 1) & (CACHE_SLOTS - 1)) {
        if (!e->slots[s]) return NULL;
        const cache_entry *c = &e->ent[e->slots[s] - 1];
        if (c->hash == h && c->key_len == n && !memcmp(e->keys + c->key_off, p, n)) return c;
    }
}

static void cache_put(encoder *e, const unsigned char *p, size_t n, uint32_t h, const int32_t *ids,
                      int64_t k) {
    if (e->nent == CACHE_ENTRIES) { /* full: start over rather than track recency */
        memset(e->slots, 0, CACHE_SLOTS * sizeof *e->slots);
        e->nent = e->key_used = e->ids_used = 0;
    }
    cache_entry *c = &e->ent[e->nent];
    *c = (cache_entry){h, e->key_used, e->ids_used, (uint16_t)n, (uint16_t)k};
    memcpy(e->keys + e->key_used, p, n);
    memcpy(e->ids + e->ids_used, ids, (size_t)k * sizeof *ids);
    e->key_used += (uint32_t)n, e->ids_used += (uint32_t)k;
    uint32_t s = h & (CACHE_SLOTS - 1);
    while (e->slots[s]) s = (s + 1) & (CACHE_SLOTS - 1);
    e->slots[s] = ++e->nent;
}

/* ---- one piece ------------------------------------------------------------------------------ */

static void heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i && heap[(i - 1) / 2] > v) heap[i] = heap[(i - 1) / 2], i = (i - 1) / 2;
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c], i = c;
    }
    heap[i] = v;
    return top;
}

/* Queues the pair whose left symbol is at pos, if it has a merge. */
static void queue_pair(const fsc_bpe *t, encoder *e, size_t *nheap, int32_t pos) {
    const symbol *s = e->sym;
    if (pos < 0 || s[pos].next < 0) return;
    const bpe_pair *p = fsc_bpe_pair(t, s[pos].id, s[s[pos].next].id);
    if (p) heap_push(e->heap, nheap, (uint64_t)(uint32_t)p->rank << 32 | (uint32_t)pos);
}

/* BPE of the n bytes at p into out (room for n ids); returns the count. */
static int64_t merge_piece(const fsc_bpe *t, encoder *e, const unsigned char *p, size_t n,
                           int32_t *out) {
    if (n == 1) return out[0] = t->byte_id[p[0]], 1;
    if (t->ignore_merges) { /* a piece that is a token is that token (LLaMA-3) */
        int32_t id = fsc_bpe_find(t, (const char *)p, n);
        if (id >= 0) return out[0] = id, 1;
    }
    const uint32_t h = n <= CACHE_KEY_MAX && e->slots ? hash_piece(p, n) : 0;
    const cache_entry *c = n <= CACHE_KEY_MAX && e->slots ? cache_get(e, p, n, h) : NULL;
    if (c) {
        memcpy(out, e->ids + c->ids_off, c->nids * sizeof *out);
        return c->nids;
    }
    symbol *s = e->sym;
    for (size_t i = 0; i < n; i++)
        s[i] = (symbol){t->byte_id[p[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    size_t nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) queue_pair(t, e, &nheap, (int32_t)i);
    while (nheap) {
        uint64_t top = heap_pop(e->heap, &nheap);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32), next = s[pos].next;
        if (s[pos].id < 0 || next < 0) continue; /* stale: merged since it was queued */
        const bpe_pair *pr = fsc_bpe_pair(t, s[pos].id, s[next].id);
        if (!pr || pr->rank != rank) continue;
        s[pos].id = pr->merged;
        s[next].id = -1;
        s[pos].next = s[next].next;
        if (s[pos].next >= 0) s[s[pos].next].prev = pos;
        queue_pair(t, e, &nheap, s[pos].prev);
        queue_pair(t, e, &nheap, pos);
    }
    int64_t k = 0;
    for (int32_t i = 0; i >= 0; i = s[i].next) out[k++] = s[i].id;
    if (n <= CACHE_KEY_MAX && e->slots) cache_put(e, p, n, h, out, k);
    return k;
}

/* ---- the text ------------------------------------------------------------------------------- */

/* Text between added tokens: the pre-tokenizer's pieces, each merged. */
static int encode_segment(const fsc_bpe *t, encoder *e, const unsigned char *s, size_t n,
                          int32_t *out, int64_t *k) {
    if (!n) return FSC_OK;
    if (t->prefix_space && s[0] != ' ') { /* ByteLevel's add_prefix_space */
        if (n + 1 > e->seg_cap) {
            char *b = realloc(e->seg, n + 1);
            if (!b) return fsc_error(FSC_ERR_NOMEM, "BPE: out of memory for %zu bytes", n);
            e->seg = b, e->seg_cap = n + 1;
        }
        e->seg[0] = ' ';
        memcpy(e->seg + 1, s, n);
        s = (const unsigned char *)e->seg, n++;
    }
    int rc = reserve(e, n);
    if (rc) return rc;
    if (!t->nsplit) {
        *k += merge_piece(t, e, s, n, out + *k);
        return FSC_OK;
    }
    const bpe_range *piece;
    size_t count;
    rc = fsc_bpe_split_run(t, e->split, (const char *)s, n, &piece, &count);
    for (size_t i = 0; !rc && i < count; i++)
        *k += merge_piece(t, e, s + piece[i].start, piece[i].end - piece[i].start, out + *k);
    return rc;
}

static int encode_added(const fsc_bpe *t, encoder *e, int pass, const unsigned char *s, size_t n,
                        int32_t *out, int64_t *k);

/* Added tokens of pass, and of the passes after it in the text between them. */
static int added_pass(const fsc_bpe *t, encoder *e, int pass, const unsigned char *s, size_t n,
                      int32_t *out, int64_t *k) {
    size_t pos = 0, start, end;
    int32_t id;
    int rc = FSC_OK;
    while (!rc && t->added[pass] && fsc_bpe_added_next(t, pass, s, n, pos, &start, &end, &id)) {
        rc = encode_added(t, e, pass + 1, s + pos, start - pos, out, k);
        out[(*k)++] = id;
        pos = end;
    }
    return rc ? rc : encode_added(t, e, pass + 1, s + pos, n - pos, out, k);
}

/* Pass 0 matches added tokens on the raw text; the normalizer (NFC) sees
 * what lies between them, before pass 1 and the pre-tokenizer. */
static int encode_added(const fsc_bpe *t, encoder *e, int pass, const unsigned char *s, size_t n,
                        int32_t *out, int64_t *k) {
    if (pass == 2) return encode_segment(t, e, s, n, out, k);
    if (pass == 0 || !t->nfc || !n) return added_pass(t, e, pass, s, n, out, k);
    char *norm;
    size_t m;
    int rc = fsc_bpe_normalize((const char *)s, n, &norm, &m);
    if (!rc) rc = added_pass(t, e, pass, (const unsigned char *)norm, m, out, k);
    free(norm);
    return rc;
}

static int encode_gpt2(const fsc_bpe *t, encoder *e, const unsigned char *s, size_t n, int32_t *out,
                       int64_t *k) {
    for (size_t i = 0; i < n;) {
        size_t end = fsc_bpe_gpt2_piece_end(s, n, i);
        int rc = reserve(e, end - i);
        if (rc) return rc;
        *k += merge_piece(t, e, s + i, end - i, out + *k);
        i = end;
    }
    return FSC_OK;
}

int fsc_bpe_encode_with(const fsc_bpe *t, const char *text, size_t n, fsc_bpe_encode_options opts,
                        int32_t **ids, int64_t *count) {
    if (!t || (!text && n) || !ids || !count)
        return fsc_error(FSC_ERR_INVALID, "fsc_bpe_encode: NULL argument");
    *ids = NULL, *count = 0;
    const int extra = opts.add_special_tokens ? t->npre + t->npost : 0;
    if (!n && !extra) return FSC_OK;
    /* never more ids than bytes, plus a prefix space per segment (segments
     * are separated by added tokens of one byte or more) */
    const size_t m = t->nfc ? 3 * n : n; /* NFC grows UTF-8 at most 3x */
    const size_t cap = m + (t->prefix_space ? m + 1 : 0) + (size_t)extra;
    encoder e = {0};
    int32_t *out = malloc(cap * sizeof *out);
    if (n > 4096) { /* a cache pays back its set-up on long texts only */
        e.slots = calloc(CACHE_SLOTS, sizeof *e.slots);
        e.ent = malloc(CACHE_ENTRIES * sizeof *e.ent);
        e.keys = malloc(CACHE_ENTRIES * CACHE_KEY_MAX);
        e.ids = malloc(CACHE_ENTRIES * CACHE_KEY_MAX * sizeof *e.ids);
        if (!e.slots || !e.ent || !e.keys || !e.ids) free(e.slots), e.slots = NULL;
    }
    if (t->nsplit) e.split = fsc_bpe_split_ws_new(t);
    int rc = out && (!t->nsplit || e.split)
                 ? FSC_OK
                 : fsc_error(FSC_ERR_NOMEM, "BPE: out of memory encoding %zu bytes", n);
    int64_t k = 0;
    if (!rc && opts.add_special_tokens)
        for (int i = 0; i < t->npre; i++) out[k++] = t->post[i];
    const unsigned char *s = (const unsigned char *)text;
    if (!rc)
        rc = t->json ? encode_added(t, &e, 0, s, n, out, &k) : encode_gpt2(t, &e, s, n, out, &k);
    if (!rc && opts.add_special_tokens)
        for (int i = 0; i < t->npost; i++) out[k++] = t->post[t->npre + i];
    encoder_free(&e);
    if (rc) {
        free(out);
        return rc;
    }
    *ids = out, *count = k;
    return FSC_OK;
}

int fsc_bpe_encode(const fsc_bpe *t, const char *text, size_t n, int32_t **ids, int64_t *count) {
    return fsc_bpe_encode_with(t, text, n, (fsc_bpe_encode_options){0}, ids, count);
}
