/* An out-of-tree program built against an installed fsc (tests/consumer/run.sh).
 *
 *   consumer CKPT_DIR
 *
 * It sees only what `cmake --install` put under the prefix, and it reaches
 * every library libfsc needs, so a link that lacks one fails: MPI (a world of
 * one), OpenMP and libm (kernels, initialisation), cJSON and zlib (a
 * checkpoint written, checksummed, verified and read back). The version must
 * be the one the build was configured with, and a Linear layer built, bound
 * and run through the public API must compute y = x W^T + b. Exit status 0
 * only if everything holds; every failure says what it was.
 */
#include <stdio.h>
#include <string.h>

#include <fsc/fsc.h>
#include <fsc/nn.h>

#ifndef FSC_EXPECTED_VERSION
#error "build with -DFSC_EXPECTED_VERSION=\"x.y.z\""
#endif

#define STR_(x) #x
#define STR(x) STR_(x)

static int fail(const char *what) {
    fprintf(stderr, "consumer: %s (%s)\n", what, fsc_last_error());
    return 1;
}

/* 0 if y (N) is within 1e-5 of want; no libm: only fsc's flags are linked. */
static int check_close(const char *what, const float *y, const float *want, int n) {
    for (int i = 0; i < n; i++) {
        float d = y[i] - want[i];
        if (d > 1e-5f || d < -1e-5f) {
            fprintf(stderr, "consumer: %s[%d] = %g, want %g\n", what, i, y[i], want[i]);
            return 1;
        }
    }
    return 0;
}

static int check_version(void) {
    const char *v = fsc_version();
    if (strcmp(v, FSC_EXPECTED_VERSION)) {
        fprintf(stderr, "consumer: fsc_version() is \"%s\", want \"%s\"\n", v,
                FSC_EXPECTED_VERSION);
        return 1;
    }
    const char *parts =
        STR(FSC_VERSION_MAJOR) "." STR(FSC_VERSION_MINOR) "." STR(FSC_VERSION_PATCH);
    if (strcmp(FSC_VERSION_STRING, v) || strcmp(parts, v)) {
        fprintf(stderr, "consumer: headers say %s (%s), library says %s\n", FSC_VERSION_STRING,
                parts, v);
        return 1;
    }
    return 0;
}

/* x (1,3) through Linear(3 -> 2), weight (out,in): y = x W^T + b. */
static int linear_forward(fsc_module *lin) {
    float xs[3] = {1, 2, 3};
    const float want[2] = {-1.75f, 2};
    fsc_tensor x = fsc_tensor_2d(xs, FSC_DTYPE_F32, 1, 3), y;
    fsc_arena *arena = fsc_arena_new(FSC_MEM_ACTIV, 1 << 12);
    fsc_ctx ctx = {.arena = arena};
    void *saved = NULL;
    int rc = arena ? fsc_module_forward(lin, &ctx, &x, &y, &saved) : FSC_ERR_NOMEM;
    if (rc)
        rc = fail("forward failed");
    else if (y.ndim != 2 || y.shape[0] != 1 || y.shape[1] != 2)
        rc = fail("forward: wrong output shape");
    else
        rc = check_close("y", y.data, want, 2);
    fsc_arena_free(arena);
    return rc;
}

/* Copies every parameter of ps into out (at most max floats); returns the count or -1. */
static int gather(const fsc_params *ps, float *out, int max) {
    int n = 0;
    for (int i = 0; i < ps->count; i++) {
        const fsc_param *p = ps->entries[i].param;
        if (n + p->numel > max) return -1;
        memcpy(out + n, p->data, (size_t)p->numel * sizeof *out);
        n += (int)p->numel;
    }
    return n;
}

/* The parameters through a checkpoint in dir and back into ps (zeroed first). */
static int checkpoint_round_trip(const char *dir, fsc_params *ps) {
    float before[16], after[16];
    int n = gather(ps, before, 16);
    if (n < 0) return fail("more parameters than expected");
    fsc_ckpt_writer *w = NULL;
    if (fsc_ckpt_begin(dir, 1, &w) ||
        fsc_weights_save(fsc_ckpt_member(w, "model.safetensors"), ps, 0, NULL, NULL) ||
        fsc_ckpt_set(w, "note", "\"consumer\"")) {
        fsc_ckpt_abort(w);
        return fail("checkpoint write failed");
    }
    if (fsc_ckpt_commit(w)) return fail("checkpoint commit failed");
    for (int i = 0; i < ps->count; i++)
        memset(ps->entries[i].param->data, 0, (size_t)ps->entries[i].param->numel * sizeof(float));
    fsc_ckpt *c = NULL;
    int rc = fsc_ckpt_open(dir, &c) ? fail("checkpoint open failed")
             : fsc_weights_load(fsc_ckpt_path(c, "model.safetensors"), ps, NULL)
                 ? fail("weights load failed")
                 : check_close("reloaded parameter", after, before, gather(ps, after, 16));
    fsc_ckpt_close(c);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: consumer CKPT_DIR\n");
        return 2;
    }
    if (check_version()) return 1;
    if (fsc_dist_init(&argc, &argv, NULL)) return fail("fsc_dist_init failed");
    int rc = fsc_dist_size() == 1 ? 0 : fail("not a world of one");
    fsc_module *lin = fsc_linear_new("fc", 3, 2, true, FSC_WEIGHT_OUT_IN, 0.02f);
    fsc_params params = {0};
    if (!rc && (!lin || fsc_params_bind(lin, 1, false, &params))) rc = fail("Linear set-up failed");
    if (!rc && params.count == 2) {
        const float w[6] = {1, 0, -1, 0.5f, 0.5f, 0.5f}, b[2] = {0.25f, -1};
        memcpy(params.entries[0].param->data, w, sizeof w);
        memcpy(params.entries[1].param->data, b, sizeof b);
    } else if (!rc) {
        rc = fail("Linear does not have 2 parameters");
    }
    if (!rc) rc = checkpoint_round_trip(argv[1], &params);
    if (!rc) rc = linear_forward(lin);
    fsc_params_free(&params);
    fsc_module_free(lin);
    if (fsc_dist_finalize()) rc = fail("fsc_dist_finalize failed");
    if (!rc)
        printf("consumer: fsc %s: world of one, checkpoint, Linear forward ok\n", fsc_version());
    return rc;
}
