/* libFuzzer harness: the safetensors reader (fsc_st_open and every accessor).
 *
 * The one idea: whatever fsc_st_open accepts must be safe to use in full, so
 * each accepted file is walked as a loader would: every entry, every
 * metadata pair, every entry's bytes read back (entries are validated to lie
 * inside the file, so the reads are bounded by the input's size).
 */
#include "fuzz_common.h"
#include "fsc/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("in.safetensors");
    fuzz_write(path, data, size);
    int rc = FSC_OK;
    fsc_st_file *f = fsc_st_open(path, &rc);
    if (!f) return 0;
    for (int i = 0; i < fsc_st_metadata_count(f); i++) {
        const char *key, *value;
        if (fsc_st_metadata_at(f, i, &key, &value) == FSC_OK && fsc_st_metadata(f, key) == NULL)
            abort(); /* a listed key must be found */
    }
    for (int i = 0; i < fsc_st_count(f); i++) {
        const fsc_st_entry *e = fsc_st_entry_at(f, i);
        if (!e || fsc_st_find(f, e->name) != e) abort();
        if (e->nbytes > size) abort(); /* validated to lie inside the file */
        void *buf = malloc(e->nbytes ? e->nbytes : 1);
        if (!buf) return 0;
        (void)fsc_st_read_bytes(f, e, 0, buf, e->nbytes);
        if (e->dtype == FSC_DTYPE_F32 || e->dtype == FSC_DTYPE_BF16 || e->dtype == FSC_DTYPE_F16) {
            /* read as F32 (converting halves) into a tensor of the entry's shape */
            size_t numel =
                (size_t)e->nbytes / fsc_dtype_size(e->dtype); /* validated: the shape's */
            float *out = malloc((numel ? numel : 1) * sizeof(float));
            if (out) {
                fsc_tensor t = {.data = out, .dtype = FSC_DTYPE_F32, .ndim = e->ndim};
                memcpy(t.shape, e->shape, sizeof t.shape);
                (void)fsc_st_read(f, e->name, &t);
                free(out);
            }
        }
        free(buf);
    }
    fsc_st_close(f);
    return 0;
}
