/* The member files of the checkpoint the state.json harness reads, written
 * the same way by the harness and by make_seeds: the seed state.json's sizes
 * and CRC-32s then match, so the fuzzer starts from a checkpoint that opens.
 */
#ifndef FSC_FUZZ_MEMBERS_H
#define FSC_FUZZ_MEMBERS_H

#include <stdio.h>

#include "fsc/io.h"

#define FUZZ_STEP 6

/* dir/a.bin (ten bytes) and dir/model.safetensors (one F32 [2] tensor, its
 * step recorded as "fsc.step", a trainer checkpoint's convention). */
static int fuzz_write_members(const char *dir) {
    char path[512];
    if (snprintf(path, sizeof path, "%s/a.bin", dir) >= (int)sizeof path) return FSC_ERR_IO;
    FILE *f = fopen(path, "wb");
    if (!f || fwrite("0123456789", 1, 10, f) != 10 || fclose(f) != 0) return FSC_ERR_IO;
    if (snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        return FSC_ERR_IO;
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (!w) return rc;
    const float x[2] = {1.f, -2.f};
    const int64_t shape[1] = {2};
    char step[16];
    snprintf(step, sizeof step, "%d", FUZZ_STEP);
    rc = fsc_st_writer_set_metadata(w, "fsc.step", step);
    if (!rc) rc = fsc_st_writer_declare(w, "wte.weight", FSC_DTYPE_F32, 1, shape);
    if (!rc) rc = fsc_st_writer_write(w, "wte.weight", x, sizeof x);
    if (rc) {
        fsc_st_writer_abort(w);
        return rc;
    }
    return fsc_st_writer_close(w);
}

#endif
