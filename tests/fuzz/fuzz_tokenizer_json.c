/* libFuzzer harness: Hugging Face tokenizer.json (fsc_bpe_load_json, then
 * fsc_bpe_encode_with and fsc_bpe_decode on arbitrary bytes), which every
 * tool's --tokenizer FILE reaches.
 *
 * An input is two parts split by the bytes FF FF: the tokenizer.json, and
 * the text to encode. A file part that starts with '+' is the tail of a
 * file whose start the harness writes (a ByteLevel decoder and a BPE model
 * whose vocabulary begins with the 256 single-byte tokens, ids 0..255), so
 * most inputs get past the every-byte check to the merges, the added
 * tokens, the pre-tokenizer's regexes and the post-processor.
 *
 * The one idea: a tokenizer that loads must keep its promise on any text:
 * ids inside the vocabulary, the same ids between the post-processor's
 * BOS/EOS when asked, and a decode of them that succeeds.
 */
#include "fuzz_byte_vocab.h"
#include "fuzz_common.h"
#include "fsc/tokenizer.h"

/* The start of a file: decoder, model type, the 256 byte tokens (no closing braces). */
#define BASE_HEAD                                                                                  \
    "{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {"

static void check(const fsc_bpe *bpe, const uint8_t *text, size_t n) {
    const int V = fsc_bpe_vocab_size(bpe);
    int32_t *ids, *framed;
    int64_t count, nframed;
    int rc = fsc_bpe_encode(bpe, (const char *)text, n, &ids, &count);
    if (rc == FSC_ERR_FORMAT) return; /* a regex of the file that PCRE2 gives up on: said so */
    if (rc != FSC_OK) abort();
    if (count < 0 || (n && count == 0)) abort();
    for (int64_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= V) abort();
    const fsc_bpe_encode_options add = {.add_special_tokens = true};
    if (fsc_bpe_encode_with(bpe, (const char *)text, n, add, &framed, &nframed) != FSC_OK) abort();
    const int32_t bos = fsc_bpe_bos(bpe), eos = fsc_bpe_eos(bpe);
    const int64_t before = bos >= 0 ? 1 : 0, after = eos >= 0 ? 1 : 0;
    if (nframed != count + before + after) abort(); /* the same ids, framed */
    if (count && memcmp(framed + before, ids, (size_t)count * sizeof *ids)) abort();
    if ((bos >= 0 && framed[0] != bos) || (eos >= 0 && framed[nframed - 1] != eos)) abort();
    char *back;
    size_t len;
    if (fsc_bpe_decode(bpe, ids, count, &back, &len) != FSC_OK) abort();
    free(back), free(ids), free(framed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char base[4096];
    static size_t base_len;
    if (!base_len) base_len = fuzz_byte_tokens(base, sizeof base, BASE_HEAD);
    size_t at = 0, file_n;
    const uint8_t *file = fuzz_part(data, size, &at, &file_n);
    const char *path = fuzz_path("tokenizer.json");
    if (file_n && file[0] == '+') {
        char *whole = malloc(base_len + file_n);
        if (!whole) abort();
        memcpy(whole, base, base_len);
        memcpy(whole + base_len, file + 1, file_n - 1);
        fuzz_write(path, whole, base_len + file_n - 1);
        free(whole);
    } else {
        fuzz_write(path, file, file_n);
    }
    fsc_bpe *bpe;
    if (fsc_bpe_load_json(path, &bpe) != FSC_OK) return 0;
    check(bpe, data + at, size - at);
    fsc_bpe_free(bpe);
    return 0;
}
