/* libFuzzer harness: the token readers (src/io/shard.c, src/io/tokens.c):
 * fsc_tokens_load on an llm.c shard, ".bin" (version 1, uint16 tokens, and
 * version 7, uint32), and on a byte file; fsc_tokens_load_as with
 * FSC_DATA_NANOGPT (headerless uint16). fsc-train's --data and
 * --data-format reach them all.
 *
 * The one idea: a shard's header sizes everything after it, so it is the
 * part to attack; the same input is also loaded as a byte file (any file
 * that is not a shard) and as nanoGPT's raw uint16 file, and whatever loads
 * is read back to its end.
 */
#include "fuzz_common.h"
#include "fsc/io.h"

static void load(const char *path, fsc_data_format format) {
    fsc_tokens tk;
    if (fsc_tokens_load_as(path, format, &tk) != FSC_OK) return;
    int64_t sum = 0;
    for (int64_t i = 0; i < tk.count; i++) sum += fsc_tokens_at(&tk, i);
    if (sum < 0 || tk.vocab < 1 || tk.vocab > INT32_MAX) abort(); /* v7 shards: uint32 ids */
    (void)fsc_tokens_num_windows(&tk, 8);
    fsc_tokens_free(&tk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *shard = fuzz_path("in.bin");
    fuzz_write(shard, data, size);
    load(shard, FSC_DATA_AUTO);
    load(shard, FSC_DATA_NANOGPT);
    const char *bytes = fuzz_path("in.txt");
    fuzz_write(bytes, data, size);
    load(bytes, FSC_DATA_AUTO);
    return 0;
}
