/* The built-in corpus: structured byte-level text a small GPT learns quickly.
 *
 * Lines come from a few generators, each mostly predictable once its random
 * choices are made: grammar sentences with subject-verb agreement, additions
 * whose sum follows from the operands, counting runs, phrases repeated after
 * an arrow, and small stories that carry a name and a number across a line.
 * Every random choice adds its information (ln of 1/p) to a running total, so
 * the generator knows an upper bound on the best achievable loss per byte.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fsc/io.h"

typedef struct {
    uint64_t state;
    double nats;
    char *out;
    size_t len, cap;
} gen;

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

static uint64_t next_u64(gen *g) { /* splitmix64 */
    uint64_t z = (g->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); charges ln n. */
static int pick(gen *g, int n) {
    g->nats += log((double)n);
    return (int)(next_u64(g) % (uint64_t)n);
}

/* True with probability num/den; charges the information of the outcome. */
static int chance(gen *g, int num, int den) {
    int hit = (int)(next_u64(g) % (uint64_t)den) < num;
    g->nats -= log((double)(hit ? num : den - num) / den);
    return hit;
}

static void put(gen *g, const char *s) {
    size_t n = strlen(s);
    if (n > g->cap - g->len) n = g->cap - g->len;
    memcpy(g->out + g->len, s, n);
    g->len += n;
}

static void put_int(gen *g, int v) {
    char t[16];
    snprintf(t, sizeof t, "%d", v);
    put(g, t);
}

/* ---- grammar sentences ------------------------------------------------------ */

static const char *const nouns[][2] = {
    {"cat", "cats"},  {"dog", "dogs"},         {"bird", "birds"},   {"child", "children"},
    {"fox", "foxes"}, {"teacher", "teachers"}, {"robot", "robots"}, {"farmer", "farmers"},
};
static const char *const intransitive[][2] = {
    {"sleeps", "sleep"}, {"runs", "run"}, {"sings", "sing"}, {"waits", "wait"}, {"jumps", "jump"},
};
static const char *const transitive[][2] = {
    {"sees", "see"}, {"likes", "like"}, {"chases", "chase"}, {"finds", "find"}, {"helps", "help"},
};
static const char *const adjectives[] = {"red", "small", "happy", "old", "quiet", "green"};
static const char *const places[] = {"in the garden", "near the river", "on the hill", "at home"};
static const char *const det_sg[] = {"the", "a", "every"};
static const char *const det_pl[] = {"the", "some", "two", "many"};

/* A noun phrase; returns its number (0 singular, 1 plural). */
static int noun_phrase(gen *g, int capital) {
    int plural = pick(g, 2);
    const char *det = plural ? det_pl[pick(g, COUNT(det_pl))] : det_sg[pick(g, COUNT(det_sg))];
    char first[16];
    snprintf(first, sizeof first, "%s", det);
    if (capital) first[0] = (char)(first[0] - 'a' + 'A');
    put(g, first);
    put(g, " ");
    if (chance(g, 1, 3)) {
        put(g, adjectives[pick(g, COUNT(adjectives))]);
        put(g, " ");
    }
    put(g, nouns[pick(g, COUNT(nouns))][plural]);
    return plural;
}

static void sentence(gen *g) {
    int plural = noun_phrase(g, 1);
    put(g, " ");
    if (chance(g, 1, 2)) {
        put(g, intransitive[pick(g, COUNT(intransitive))][plural]);
        if (chance(g, 1, 2)) {
            put(g, " ");
            put(g, places[pick(g, COUNT(places))]);
        }
    } else {
        put(g, transitive[pick(g, COUNT(transitive))][plural]);
        put(g, " ");
        noun_phrase(g, 0);
    }
    put(g, ".\n");
}

/* ---- numbers, repetition, stories ---------------------------------------------------- */

static void addition(gen *g) { /* "17+25=42" */
    int a = pick(g, 100), b = pick(g, 100);
    put_int(g, a);
    put(g, "+");
    put_int(g, b);
    put(g, "=");
    put_int(g, a + b);
    put(g, "\n");
}

static void counting(gen *g) { /* "count: 13 14 15 16." */
    int start = pick(g, 96), len = 3 + pick(g, 5);
    put(g, "count:");
    for (int i = 0; i < len; i++) {
        put(g, " ");
        put_int(g, start + i);
    }
    put(g, ".\n");
}

static const char *const syllables[] = {"ka", "lo", "mi", "nu", "pe", "ri", "so", "tu",
                                        "va", "ze", "bo", "di", "fa", "gu", "he", "jo"};

static void repeat(gen *g) { /* "repeat: kalo misu -> kalo misu" */
    char words[4][8];
    int n = 2 + pick(g, 3);
    for (int i = 0; i < n; i++) {
        int a = pick(g, COUNT(syllables)), b = pick(g, COUNT(syllables));
        snprintf(words[i], sizeof words[i], "%s%s", syllables[a], syllables[b]);
    }
    put(g, "repeat:");
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            put(g, " ");
            put(g, words[i]);
        }
        put(g, pass ? "\n" : " ->");
    }
}

static const char *const names[] = {"Ada", "Bob", "Cleo", "Dan", "Eve", "Finn"};
static const char *const fruits[][2] = {{"apple", "apples"}, {"pear", "pears"}, {"plum", "plums"}};

static void fruit_count(gen *g, int n, int kind) {
    put_int(g, n);
    put(g, " ");
    put(g, fruits[kind][n != 1]);
}

static void story(gen *g) { /* "Ada has 5 pears. Ada eats 2. now Ada has 3 pears." */
    const char *name = names[pick(g, COUNT(names))];
    int kind = pick(g, COUNT(fruits)), have = 2 + pick(g, 8), eat = 1 + pick(g, have - 1);
    put(g, name);
    put(g, " has ");
    fruit_count(g, have, kind);
    put(g, ". ");
    put(g, name);
    put(g, " eats ");
    put_int(g, eat);
    put(g, ". now ");
    put(g, name);
    put(g, " has ");
    fruit_count(g, have - eat, kind);
    put(g, ".\n");
}

/* ---- public -------------------------------------------------------------------------- */

int fsc_corpus_generate(uint64_t seed, size_t nbytes, char *out, double *nats_per_byte) {
    if (!out && nbytes) return fsc_error(FSC_ERR_INVALID, "fsc_corpus_generate: out is NULL");
    gen g = {.state = seed ^ 0x5eedc0de5eedc0deull, .out = out, .cap = nbytes};
    static const int weights[] = {40, 15, 10, 20, 15}; /* out of 100 */
    while (g.len < g.cap) {
        int r = (int)(next_u64(&g) % 100), kind = 0;
        while (r >= weights[kind]) r -= weights[kind++];
        g.nats -= log(weights[kind] / 100.0);
        switch (kind) {
        case 0:
            sentence(&g);
            break;
        case 1:
            addition(&g);
            break;
        case 2:
            counting(&g);
            break;
        case 3:
            repeat(&g);
            break;
        default:
            story(&g);
            break;
        }
    }
    if (nats_per_byte) *nats_per_byte = nbytes ? g.nats / (double)nbytes : 0.0;
    return FSC_OK;
}
