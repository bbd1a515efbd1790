/* libFuzzer harness: the flat-shard metadata (fsc_flat_layout_read: the
 * layout JSON FSDP's shard files carry, and the safetensors around it).
 *
 * The one idea: two ways in, chosen by the first byte. An input starting
 * with '{' is the layout JSON itself, wrapped here in a well-formed shard
 * file (so every mutation reaches the layout parser and
 * fsc_flat_layout_check instead of dying in the container); any other input
 * is a whole shard file, container included.
 */
#include "fuzz_common.h"
#include "fsc/flat_shards.h"
#include "fsc/io.h"

/* Writes a shard file whose layout metadata is text (NUL-terminated). */
static int wrap(const char *path, const char *text) {
    int rc = FSC_OK;
    fsc_st_writer *w = fsc_st_writer_open(path, &rc);
    if (!w) return rc;
    const float x[4] = {0};
    const int64_t shape[1] = {4};
    rc = fsc_st_writer_set_metadata(w, FSC_FLAT_LAYOUT_KEY, text);
    if (!rc) rc = fsc_st_writer_set_metadata(w, FSC_FLAT_RANK_KEY, "0");
    if (!rc) rc = fsc_st_writer_declare(w, "flat.0", FSC_DTYPE_F32, 1, shape);
    if (!rc) rc = fsc_st_writer_write(w, "flat.0", x, sizeof x);
    if (rc) {
        fsc_st_writer_abort(w);
        return rc;
    }
    return fsc_st_writer_close(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_path("shard.safetensors");
    if (size > 0 && data[0] == '{') {
        char *text = malloc(size + 1);
        if (!text) return 0;
        memcpy(text, data, size);
        text[size] = '\0';
        int rc = wrap(path, text);
        free(text);
        if (rc) return 0; /* e.g. not valid UTF-8 for the container: nothing to read */
    } else {
        fuzz_write(path, data, size);
    }
    fsc_flat_layout L;
    int rank = -1;
    if (fsc_flat_layout_read(path, &L, &rank) != FSC_OK) return 0;
    if (fsc_flat_layout_check(&L) != FSC_OK || rank < 0 || rank >= L.world) abort();
    fsc_flat_layout_free(&L);
    return 0;
}
