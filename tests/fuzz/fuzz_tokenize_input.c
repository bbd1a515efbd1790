/* libFuzzer harness: fsc-tokenize's input reader (tools/tokenize_input.c:
 * tokenize_encode_file and tokenize_encode_list), a text file read whole and
 * encoded into the growing token stream, with one token per byte or with
 * GPT-2's BPE (the committed tiny vocabulary, tests/data/bpe_tiny), with
 * and without the --eot separator.
 *
 * An input's first byte chooses the mode (bit 0: BPE, bit 1: --eot under the
 * BPE, bit 2: the text twice through --val's comma list); the rest is the
 * text. The one idea: whatever the bytes, every id lies in the vocabulary,
 * byte mode gives exactly one token per byte, and the BPE's tokens decode
 * back to the text.
 */
#include "fuzz_common.h"
#include "tokenize_input.h"

static const fsc_bpe *tiny_bpe(void) {
    static fsc_bpe *bpe;
    if (!bpe && fsc_bpe_load(FSC_FUZZ_DATA "/bpe_tiny", &bpe) != FSC_OK) {
        fprintf(stderr, "fuzz_tokenize_input: %s\n", fsc_last_error());
        abort();
    }
    return bpe;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const unsigned mode = data[0];
    const uint8_t *text = data + 1;
    const size_t len = size - 1;
    const fsc_bpe *bpe = mode & 1 ? tiny_bpe() : NULL;
    const bool eot = bpe && (mode & 2);
    const char *path = fuzz_path("in.txt");
    fuzz_write(path, text, len);
    tokenize_stream s = {0};
    double bytes = 0;
    int rc;
    if (mode & 4) {
        char list[600];
        snprintf(list, sizeof list, "%s,%s", path, path);
        rc = tokenize_encode_list(bpe, list, eot, &s, &bytes);
    } else {
        rc = tokenize_encode_file(bpe, path, eot, &s, &bytes);
    }
    if (rc != FSC_OK) abort(); /* a regular file of any bytes encodes */
    const int copies = mode & 4 ? 2 : 1;
    if (bytes != (double)len * copies) abort();
    const int vocab = bpe ? fsc_bpe_vocab_size(bpe) : 256;
    for (int64_t i = 0; i < s.n; i++)
        if (s.ids[i] < 0 || s.ids[i] >= vocab) abort();
    if (!bpe && s.n != (int64_t)len * copies) abort();
    if (bpe) { /* the first copy decodes back to the text (after its separator) */
        int64_t per = s.n / copies, skip = eot ? 1 : 0;
        if (eot && s.ids[0] != tokenize_separator(bpe)) abort();
        if (per - skip == 0) { /* no tokens: only from no text */
            if (len) abort();
        } else {
            char *out = NULL;
            size_t outlen = 0;
            if (fsc_bpe_decode(bpe, s.ids + skip, per - skip, &out, &outlen) != FSC_OK) abort();
            if (outlen != len || memcmp(out, text, len)) abort();
            free(out);
        }
    }
    free(s.ids);
    return 0;
}
