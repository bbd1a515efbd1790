/* Activation checkpointing, in place: the module's ops table is swapped for a
 * copy whose forward drops what the original forward allocated (keeping y and
 * a view of x) and whose backward recomputes it first.
 *
 * The copy lives in a small record together with a pointer to the original
 * table; forward, backward and free find the record from m->ops (container-of),
 * so the module needs no extra field and parents keep calling it through the
 * pointers they already hold. Memory goes back to the arena by mark/release,
 * the kept tensor moving down to the released position. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/checkpoint_wrapper.h"

typedef struct ckpt {
    fsc_module_ops ops;         /* what m->ops points at while wrapped */
    const fsc_module_ops *orig; /* the module's own table */
} ckpt;

/* What a training forward keeps for backward: the input, by reference; or,
 * when the call asked for no checkpointing, the module's own record. */
typedef struct {
    fsc_tensor x;
    void *inner;
    bool plain;
} ckpt_saved;

static ckpt *ckpt_of(const fsc_module *m) {
    return (ckpt *)((char *)(uintptr_t)m->ops - offsetof(ckpt, ops));
}

/* Gives back everything allocated after `mark` except t's data, which moves to
 * the first free position. Release never frees a block (blocks it pops wait on
 * the spare list) and allocation never writes, so t's bytes are intact until
 * the copy; old and new place may overlap, hence memmove. */
static int release_keeping(fsc_arena *a, fsc_arena_mark_t mark, fsc_tensor *t) {
    size_t n = fsc_tensor_nbytes(t);
    fsc_arena_release(a, mark);
    void *p = fsc_arena_alloc(a, n);
    if (!p) return FSC_ERR_NOMEM;
    if (p != t->data) memmove(p, t->data, n);
    t->data = p;
    return FSC_OK;
}

static int ckpt_forward(fsc_module *m, const fsc_ctx *ctx, const fsc_tensor *x, fsc_tensor *y,
                        void **saved) {
    const ckpt *c = ckpt_of(m);
    if (!ctx->training) return c->orig->forward(m, ctx, x, y, saved);
    if (ctx->no_checkpoint) { /* keep everything: backward needs no recompute */
        ckpt_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
        if (!s) return FSC_ERR_NOMEM;
        *s = (ckpt_saved){.x = *x, .plain = true};
        int rc = c->orig->forward(m, ctx, x, y, &s->inner);
        *saved = s;
        return rc;
    }
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    void *inner = NULL; /* dropped: backward rebuilds it */
    int rc = c->orig->forward(m, ctx, x, y, &inner);
    if (rc) {
        fsc_arena_release(ctx->arena, mark);
        return rc;
    }
    if (y->data == x->data) /* an identity keeps x: nothing of its own to move */
        fsc_arena_release(ctx->arena, mark);
    else if ((rc = release_keeping(ctx->arena, mark, y)))
        return fsc_error_context(rc, "checkpointed %s (%s): keeping the output: ", m->name,
                                 c->orig->kind);
    ckpt_saved *s = fsc_arena_alloc(ctx->arena, sizeof *s);
    if (!s) return FSC_ERR_NOMEM;
    *s = (ckpt_saved){.x = *x};
    *saved = s;
    return FSC_OK;
}

static int ckpt_backward(fsc_module *m, const fsc_ctx *ctx, void *saved, const fsc_tensor *dy,
                         fsc_tensor *dx) {
    const ckpt *c = ckpt_of(m);
    if (!ctx->training) return c->orig->backward(m, ctx, saved, dy, dx);
    const ckpt_saved *s = saved;
    if (!s)
        return fsc_error(FSC_ERR_INVALID,
                         "checkpointed %s (%s): backward without the record of a training forward",
                         m->name, c->orig->kind);
    if (s->plain) return c->orig->backward(m, ctx, s->inner, dy, dx);
    /* Same seed/step/sample0, so the recompute draws the same dropout masks;
     * the flag tells wrappers inside (FSDP) this is not a new forward. */
    fsc_ctx re = *ctx;
    re.recompute = true;
    fsc_arena_mark_t mark = fsc_arena_mark(ctx->arena);
    fsc_tensor y;
    void *inner = NULL;
    int rc = c->orig->forward(m, &re, &s->x, &y, &inner);
    if (rc) {
        fsc_arena_release(ctx->arena, mark);
        return fsc_error_context(rc, "checkpointed %s (%s): recomputing forward: ", m->name,
                                 c->orig->kind);
    }
    rc = c->orig->backward(m, ctx, inner, dy, dx);
    if (rc) {
        fsc_arena_release(ctx->arena, mark);
        return rc;
    }
    if (!dx || dx->data == dy->data) /* nothing of the recompute's to keep */
        fsc_arena_release(ctx->arena, mark);
    else if ((rc = release_keeping(ctx->arena, mark, dx)))
        return fsc_error_context(rc, "checkpointed %s (%s): keeping the input gradient: ", m->name,
                                 c->orig->kind);
    return FSC_OK;
}

static void ckpt_free(fsc_module *m) {
    ckpt *c = ckpt_of(m);
    void (*orig_free)(fsc_module *) = c->orig->free;
    /* fsc_module_free's rule for a module without its own free; the original
     * free may free m itself, so m is not touched after either. */
    if (orig_free)
        orig_free(m);
    else
        free(m);
    free(c);
}

int fsc_checkpoint_wrap(fsc_module *m) {
    if (!m) return fsc_error(FSC_ERR_INVALID, "checkpoint wrap: NULL module");
    if (!m->ops || !m->ops->forward)
        return fsc_error(FSC_ERR_INVALID, "checkpoint wrap: module %s has no forward", m->name);
    if (fsc_is_checkpointed(m))
        return fsc_error(FSC_ERR_INVALID, "checkpoint wrap: module %s (%s) is already checkpointed",
                         m->name, ckpt_of(m)->orig->kind);
    ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return fsc_error(FSC_ERR_NOMEM, "checkpoint wrap: out of memory for module %s", m->name);
    c->orig = m->ops;
    c->ops = *m->ops; /* same kind: the module is still what it was */
    c->ops.forward = ckpt_forward;
    if (m->ops->backward) c->ops.backward = ckpt_backward; /* none stays none */
    c->ops.free = ckpt_free;
    m->ops = &c->ops;
    return FSC_OK;
}

bool fsc_is_checkpointed(const fsc_module *m) {
    return m && m->ops && m->ops->forward == ckpt_forward;
}
