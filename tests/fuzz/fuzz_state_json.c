/* libFuzzer harness: the checkpoint reader's state.json (fsc_ckpt_open on a
 * step directory whose member files exist, then the accessors a resume uses).
 *
 * The one idea: state.json is the one file a user edits by hand, and every
 * number in it sizes or names something; the harness keeps real members
 * beside it (fuzz_members.h) so inputs that pass the JSON checks go on to
 * the size, CRC and member-metadata checks. "step": 61e300 (undefined
 * behaviour once, found by fuzzing) is a regression seed of the corpus.
 */
#include <sys/stat.h>

#include "fuzz_common.h"
#include "fuzz_members.h"
#include "fsc/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    const char *dir = fuzz_path("ck");
    static char ck[256];
    if (!ready) {
        snprintf(ck, sizeof ck, "%s", dir);
        if ((mkdir(ck, 0700) != 0 && access(ck, W_OK) != 0) || fuzz_write_members(ck) != FSC_OK)
            abort();
        ready = 1;
    }
    char state[300];
    snprintf(state, sizeof state, "%s/state.json", ck);
    fuzz_write(state, data, size);
    fsc_ckpt *c = NULL;
    if (fsc_ckpt_open(ck, &c) != FSC_OK) return 0;
    if (fsc_ckpt_step(c) < 0) abort();
    (void)fsc_ckpt_path(c, "model.safetensors");
    (void)fsc_ckpt_path(c, "state.json");
    (void)fsc_ckpt_get(c, "optimizer");
    (void)fsc_ckpt_get(c, "lr");
    fsc_ckpt_close(c);
    return 0;
}
