/* libFuzzer harness: fsc-train's two JSON configuration readers, which live
 * in tools/train_config.c and are compiled into this harness from there
 * (with the flag table of tools/train_options.c), not moved into libfsc:
 * they are the tool's flags, not the library's.
 *
 *   --config FILE.json   train_config_load: {"flag": value, ...}
 *   --init-from W        train_config_init_from: the model flags from a
 *                        Hugging Face config.json beside weights file W
 *
 * An input is two parts split by the two bytes FF FF: the --config file,
 * then the config.json beside a small GPT-shaped weights file (wte.weight
 * only, no fsc metadata, so the reader goes to config.json).
 *
 * The one idea: a --config that loads and passes fsc-train's checks is what
 * a checkpoint stores as its flags, so it must survive the trips they make:
 * train_config_json read back by train_config_load, and stored in a real
 * checkpoint then taken by --resume (train_config_resume), give the same
 * JSON text.
 */
#include "fuzz_common.h"
#include "fsc/checkpoint.h"
#include "fsc/io.h"
#include "train_common.h"

/* A checkpoint of the next step in the scratch directory whose "config" is
 * json and whose global batch is that of o on one rank, as fsc-train saves. */
static const char *checkpoint_with(const train_options *o, const char *json) {
    static int64_t step;
    static char dir[256];
    snprintf(dir, sizeof dir, "%s", fuzz_path("ck"));
    fsc_ckpt_writer *w;
    char batch[32];
    snprintf(batch, sizeof batch, "%lld", (long long)o->batch * o->grad_accum);
    if (fsc_ckpt_begin(dir, ++step, &w)) abort();
    fuzz_write(fsc_ckpt_member(w, "a.bin"), "x", 1);
    if (fsc_ckpt_set(w, "config", json) || fsc_ckpt_set(w, "global_batch", batch) ||
        fsc_ckpt_keep_last(w, 1) || fsc_ckpt_commit(w)) {
        fprintf(stderr, "saving a checkpoint of %s: %s\n", json, fsc_last_error());
        abort();
    }
    return dir;
}

/* --config: load; when fsc-train would accept it, the stored flags read back the same. */
static void config_file(const uint8_t *text, size_t n) {
    const char *path = fuzz_path("config.json.in");
    fuzz_write(path, text, n);
    train_options o;
    train_options_default(&o);
    if (train_config_load(&o, path) != FSC_OK || train_options_check(&o) != FSC_OK) return;
    char *json = train_config_json(&o);
    if (!json) abort();
    fuzz_write(path, json, strlen(json));
    train_options again;
    train_options_default(&again);
    if (train_config_load(&again, path) != FSC_OK) {
        fprintf(stderr, "stored flags do not load back: %s\n%s\n", fsc_last_error(), json);
        abort();
    }
    char *json2 = train_config_json(&again);
    if (!json2 || strcmp(json, json2)) {
        fprintf(stderr, "stored flags change on reload:\n%s\n%s\n", json, json2);
        abort();
    }
    train_options resumed; /* --resume with no flags given takes them all */
    train_options_default(&resumed);
    resumed.resume = checkpoint_with(&o, json);
    if (train_config_resume(&resumed, false) != FSC_OK) {
        fprintf(stderr, "--resume refuses its own flags: %s\n%s\n", fsc_last_error(), json);
        abort();
    }
    char *json3 = train_config_json(&resumed);
    if (!json3 || strcmp(json, json3)) {
        fprintf(stderr, "--resume changes the stored flags:\n%s\n%s\n", json, json3);
        abort();
    }
    free(json), free(json2), free(json3);
}

/* --init-from: the dims from config.json beside the weights, each positive or left alone. */
static void hf_config(const char *weights, const uint8_t *text, size_t n) {
    fuzz_write(fuzz_path("config.json"), text, n);
    train_options o, d;
    train_options_default(&o);
    train_options_default(&d);
    o.init_from = weights;
    if (train_config_init_from(&o, false) != FSC_OK) return;
    const int got[] = {o.model.vocab, o.model.seq, o.model.layers, o.model.d_model, o.model.heads};
    const int def[] = {d.model.vocab, d.model.seq, d.model.layers, d.model.d_model, d.model.heads};
    for (int i = 0; i < 5; i++)
        if (got[i] <= 0 && got[i] != def[i]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char weights[256];
    if (!weights[0]) { /* wte (V=8, C=4): a GPT's shapes, no heads */
        snprintf(weights, sizeof weights, "%s", fuzz_path("w.safetensors"));
        static float w[32];
        const char *names[1] = {"wte.weight"};
        const fsc_tensor t = fsc_tensor_2d(w, FSC_DTYPE_F32, 8, 4);
        if (fsc_st_save(weights, 1, names, &t, NULL)) abort();
    }
    size_t at = 0, n1;
    const uint8_t *flags = fuzz_part(data, size, &at, &n1);
    config_file(flags, n1);
    hf_config(weights, data + at, size - at);
    train_config_free();
    return 0;
}
