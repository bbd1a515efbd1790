/* libFuzzer harness: the GPT-2 BPE tokenizer (fsc_bpe_load_files on an
 * encoder.json and a vocab.bpe, then fsc_bpe_encode, fsc_bpe_decode and
 * fsc_bpe_encode_file on arbitrary bytes), which fsc-train's --tokenizer and
 * fsc-sample reach.
 *
 * An input is up to three parts split by the two bytes FF FF (never in a
 * valid JSON or merges file): encoder.json, vocab.bpe, the text to encode.
 * An encoder part that starts with '+' is the tail of an object whose first
 * 256 entries the harness writes (one token per byte, ids 0..255), so most
 * inputs get past the every-byte check to the merges and the encoder.
 *
 * The one idea: a vocabulary that loads must keep the tokenizer's promise,
 * so every load is followed by a round trip: ids inside the vocabulary,
 * decode(encode(text)) == text byte for byte, and the file path gives the
 * same ids.
 */
#include "fuzz_byte_vocab.h"
#include "fuzz_common.h"
#include "fsc/tokenizer.h"

static void round_trip(const fsc_bpe *bpe, const uint8_t *text, size_t n) {
    const int V = fsc_bpe_vocab_size(bpe);
    if (V < 256 || fsc_bpe_eot(bpe) >= V) abort();
    for (int32_t id = 0; id < V; id++) {
        size_t len;
        if (!fsc_bpe_token_bytes(bpe, id, &len) && len) abort();
    }
    int32_t *ids;
    int64_t count;
    if (fsc_bpe_encode(bpe, (const char *)text, n, &ids, &count) != FSC_OK) abort();
    if (count < 0 || (size_t)count > n || (n && count == 0)) abort();
    for (int64_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= V) abort();
    char *back;
    size_t len;
    if (fsc_bpe_decode(bpe, ids, count, &back, &len) != FSC_OK) abort();
    if (len != n || (n && memcmp(back, text, n))) abort(); /* any bytes come back exactly */
    free(back);
    if (n) { /* the file path (fsc-train --tokenizer) encodes the same */
        const char *path = fuzz_path("text.txt");
        fuzz_write(path, text, n);
        fsc_tokens tk;
        if (fsc_bpe_encode_file(bpe, path, &tk) != FSC_OK || tk.count != count || tk.vocab != V)
            abort();
        for (int64_t i = 0; i < count; i++)
            if (fsc_tokens_at(&tk, i) != ids[i]) abort();
        fsc_tokens_free(&tk);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char base[4096];
    static size_t base_len;
    if (!base_len) base_len = fuzz_byte_tokens(base, sizeof base, "{");
    size_t at = 0, enc_n, merges_n, text_n;
    const uint8_t *enc = fuzz_part(data, size, &at, &enc_n);
    const uint8_t *merges = fuzz_part(data, size, &at, &merges_n);
    const uint8_t *text = data + at;
    text_n = size - at;
    char enc_path[256], merges_path[256]; /* fuzz_path's buffer is reused */
    snprintf(enc_path, sizeof enc_path, "%s", fuzz_path("encoder.json"));
    snprintf(merges_path, sizeof merges_path, "%s", fuzz_path("vocab.bpe"));
    if (enc_n && enc[0] == '+') {
        char *whole = malloc(base_len + enc_n);
        if (!whole) abort();
        memcpy(whole, base, base_len);
        memcpy(whole + base_len, enc + 1, enc_n - 1);
        fuzz_write(enc_path, whole, base_len + enc_n - 1);
        free(whole);
    } else {
        fuzz_write(enc_path, enc, enc_n);
    }
    fuzz_write(merges_path, merges, merges_n);
    fsc_bpe *bpe;
    if (fsc_bpe_load_files(enc_path, merges_path, &bpe) != FSC_OK) return 0;
    round_trip(bpe, text, text_n);
    fsc_bpe_free(bpe);
    return 0;
}
