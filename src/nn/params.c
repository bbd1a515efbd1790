/* Flat parameter storage (docs/architecture.md, decision 2). Parameters of a module tree
 * are laid out in declaration order in one buffer, each starting on a 16-float
 * (64-byte) boundary; gradients mirror the layout in a second buffer. Wrappers
 * (DDP buckets, ZeRO partitions, FSDP shards) work on ranges of these buffers
 * and re-home storage with fsc_params_rebind. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/nn.h"

#define PARAM_ALIGN 16 /* floats */

/* dst = "a.b", or whichever of a, b is non-empty; fails if it does not fit. */
static int join_name(char *dst, size_t size, const char *a, const char *b) {
    int n = a[0] && b[0] ? snprintf(dst, size, "%s.%s", a, b) : snprintf(dst, size, "%s%s", a, b);
    if (n < 0 || (size_t)n >= size)
        return fsc_error(FSC_ERR_INVALID, "parameter name %s.%s is longer than %zu characters", a,
                         b, size - 1);
    return FSC_OK;
}

static int collect(fsc_module *m, const char *prefix, fsc_params *ps, int *cap) {
    char path[FSC_NAME_MAX * 2];
    int rc = join_name(path, sizeof path, prefix, m->name);
    if (rc) return rc;
    for (int i = 0; i < m->nparams; i++) {
        if (ps->count == *cap) {
            int ncap = *cap ? *cap * 2 : 64;
            void *p = realloc(ps->entries, (size_t)ncap * sizeof *ps->entries);
            if (!p) return fsc_error(FSC_ERR_NOMEM, "out of memory listing parameters");
            ps->entries = p;
            *cap = ncap;
        }
        fsc_param_entry *e = &ps->entries[ps->count++];
        if ((rc = join_name(e->name, sizeof e->name, path, m->params[i].name))) return rc;
        e->param = &m->params[i];
        e->offset = ps->numel;
        ps->numel += (m->params[i].numel + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
    }
    for (int c = 0; c < m->nchildren; c++) {
        rc = collect(m->children[c], path, ps, cap);
        if (rc) return rc;
    }
    return FSC_OK;
}

int fsc_params_collect(fsc_module *root, fsc_params *out) {
    memset(out, 0, sizeof *out);
    int cap = 0;
    /* The root's own name is not part of parameter names ("wte.weight", not "gpt.wte.weight"). */
    char saved[FSC_NAME_MAX];
    memcpy(saved, root->name, sizeof saved);
    root->name[0] = '\0';
    int rc = collect(root, "", out, &cap);
    memcpy(root->name, saved, sizeof saved);
    if (rc) {
        free(out->entries);
        memset(out, 0, sizeof *out);
        return rc;
    }
    for (int i = 0; i < out->count; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(out->entries[i].name, out->entries[j].name) == 0) {
                int dup = fsc_error(FSC_ERR_INVALID, "two parameters are both named %s",
                                    out->entries[i].name);
                free(out->entries);
                memset(out, 0, sizeof *out);
                return dup;
            }
    return FSC_OK;
}

void fsc_params_rebind(fsc_params *ps, float *data, float *grad) {
    for (int i = 0; i < ps->count; i++) {
        fsc_param_entry *e = &ps->entries[i];
        if (data) e->param->data = data + e->offset;
        if (grad) e->param->grad = grad + e->offset;
    }
}

void fsc_params_uniform_fill(float *out, int64_t n, int64_t first, uint64_t key, float bound) {
    for (int64_t i = 0; i < n; i++) {
        const uint64_t j = (uint64_t)(first + i);
        const fsc_philox_out r = fsc_philox4x32(key, 0, j / 4);
        out[i] = (2.f * fsc_rng_uniform(r.v[j % 4]) - 1.f) * bound;
    }
}

void fsc_params_init_values(fsc_params *ps, uint64_t seed) {
    for (int i = 0; i < ps->count; i++) {
        fsc_param *p = ps->entries[i].param;
        switch (p->init) {
        case FSC_INIT_ZEROS:
            memset(p->data, 0, (size_t)p->numel * sizeof(float));
            break;
        case FSC_INIT_ONES:
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = 1.f;
            break;
        case FSC_INIT_NORMAL:
            fsc_rng_normal_fill(p->data, p->numel, 0, fsc_rng_key(seed, ps->entries[i].name), 0.f,
                                p->init_std);
            break;
        case FSC_INIT_UNIFORM:
            fsc_params_uniform_fill(p->data, p->numel, 0, fsc_rng_key(seed, ps->entries[i].name),
                                    p->init_std);
            break;
        }
    }
}

int fsc_params_bind(fsc_module *root, uint64_t seed, bool with_grads, fsc_params *out) {
    int rc = fsc_params_collect(root, out);
    if (rc) return rc;
    size_t bytes = (size_t)out->numel * sizeof(float);
    out->data = fsc_mem_alloc(FSC_MEM_PARAMS, bytes);
    if (with_grads) out->grad = fsc_mem_alloc(FSC_MEM_GRADS, bytes);
    if (!out->data || (with_grads && !out->grad)) {
        fsc_params_free(out);
        return FSC_ERR_NOMEM;
    }
    fsc_params_rebind(out, out->data, out->grad);
    fsc_params_init_values(out, seed);
    /* A frozen tensor's gradient is never written (its layers skip it), so
     * its stretch goes back to the allocator and reads as zero: the layout
     * stays the one every wrapper's offset arithmetic expects. */
    for (int i = 0; with_grads && i < out->count; i++) {
        const fsc_param_entry *e = &out->entries[i];
        if (e->param->frozen && e->param->numel > 0 &&
            (rc = fsc_mem_discard(out->grad, (size_t)e->offset * sizeof(float),
                                  (size_t)e->param->numel * sizeof(float)))) {
            fsc_params_free(out);
            return rc;
        }
    }
    return FSC_OK;
}

void fsc_params_zero_grad(fsc_params *ps) {
    if (!ps->grad) return;
    bool any_frozen = false;
    for (int i = 0; i < ps->count; i++) any_frozen |= ps->entries[i].param->frozen;
    if (!any_frozen) {
        memset(ps->grad, 0, (size_t)ps->numel * sizeof(float));
        return;
    }
    for (int i = 0; i < ps->count; i++) /* never touch a discarded (frozen) stretch */
        if (!ps->entries[i].param->frozen)
            memset(ps->grad + ps->entries[i].offset, 0,
                   (size_t)ps->entries[i].param->numel * sizeof(float));
}

int fsc_module_freeze(fsc_module *root, const char *const *patterns, int n, bool require_match,
                      int *frozen_out) {
    if (frozen_out) *frozen_out = 0;
    if (!root || n < 0 || (n > 0 && !patterns))
        return fsc_error(FSC_ERR_INVALID, "freeze: needs a model and n >= 0 patterns");
    for (int k = 0; k < n; k++)
        if (!patterns[k] || !patterns[k][0])
            return fsc_error(FSC_ERR_INVALID, "freeze: pattern %d is empty", k);
    fsc_params ps;
    int rc = fsc_params_collect(root, &ps);
    if (rc) return rc;
    for (int k = 0; k < n && !rc; k++) {
        int hits = 0;
        for (int i = 0; i < ps.count; i++)
            if (fnmatch(patterns[k], ps.entries[i].name, 0) == 0) {
                ps.entries[i].param->frozen = true;
                hits++;
            }
        if (!hits && require_match)
            rc = fsc_error(FSC_ERR_INVALID,
                           "pattern '%s' matches no parameter name (names look like '%s')",
                           patterns[k], ps.count ? ps.entries[ps.count - 1].name : "(none)");
    }
    int frozen = 0;
    for (int i = 0; i < ps.count; i++) frozen += ps.entries[i].param->frozen;
    if (frozen_out) *frozen_out = frozen;
    fsc_params_free(&ps);
    return rc;
}

int fsc_module_param_group(fsc_module *root, const char *pattern, double lr_scale,
                           double weight_decay, bool require_match, int *matched) {
    if (matched) *matched = 0;
    if (!root || !pattern || !pattern[0])
        return fsc_error(FSC_ERR_INVALID, "param group: needs a model and a pattern");
    if (!(lr_scale > 0) || isinf(lr_scale))
        return fsc_error(FSC_ERR_INVALID, "param group '%s': lr scale %g must be finite and > 0",
                         pattern, lr_scale);
    fsc_params ps;
    int rc = fsc_params_collect(root, &ps);
    if (rc) return rc;
    int hits = 0, took = 0;
    for (int i = 0; i < ps.count; i++) {
        fsc_param *p = ps.entries[i].param;
        if (fnmatch(pattern, ps.entries[i].name, 0)) continue;
        hits++;
        if (p->grouped) continue; /* the first group that matches wins */
        p->grouped = true, took++;
        p->lr_scale = lr_scale;
        p->wd_set = weight_decay >= 0, p->wd = weight_decay >= 0 ? weight_decay : 0;
    }
    if (!hits && require_match)
        rc = fsc_error(FSC_ERR_INVALID, "param group pattern '%s' matches no parameter name",
                       pattern);
    fsc_params_free(&ps);
    if (matched) *matched = took;
    return rc;
}

int64_t fsc_params_trainable_numel(const fsc_params *ps) {
    int64_t n = 0;
    for (int i = 0; ps && i < ps->count; i++)
        if (!ps->entries[i].param->frozen) n += ps->entries[i].param->numel;
    return n;
}

fsc_param_entry *fsc_params_find(fsc_params *ps, const char *name) {
    for (int i = 0; i < ps->count; i++)
        if (strcmp(ps->entries[i].name, name) == 0) return &ps->entries[i];
    return NULL;
}

void fsc_params_free(fsc_params *ps) {
    if (!ps) return;
    fsc_mem_free(ps->data);
    fsc_mem_free(ps->grad);
    free(ps->entries);
    memset(ps, 0, sizeof *ps);
}
