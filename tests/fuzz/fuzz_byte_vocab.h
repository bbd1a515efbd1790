/* The 256 single-byte tokens of a byte-level BPE vocabulary as JSON, which
 * the GPT-2 BPE and tokenizer.json harnesses put before an input's own
 * entries so that most inputs get past the every-byte check. */
#ifndef FSC_FUZZ_BYTE_VOCAB_H
#define FSC_FUZZ_BYTE_VOCAB_H

#include <stdbool.h>
#include <stdio.h>

/* GPT-2's bytes_to_unicode: printable Latin-1 stands for itself, the other
 * 68 bytes are U+0100.. in byte order. */
static unsigned fuzz_byte_cp(int b) {
    int k = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (c == b) return printable ? (unsigned)c : 256u + (unsigned)k;
        if (!printable) k++;
    }
    return 0;
}

/* head, then "<char>": byte for the 256 bytes, comma-separated (no closing
 * brace); the length written. */
static size_t fuzz_byte_tokens(char *out, size_t cap, const char *head) {
    size_t k = (size_t)snprintf(out, cap, "%s", head);
    for (int b = 0; b < 256; b++) {
        unsigned cp = fuzz_byte_cp(b);
        char ch[8];
        int n = 0;
        if (cp == '"' || cp == '\\') ch[n++] = '\\';
        if (cp < 0x80) {
            ch[n++] = (char)cp;
        } else {
            ch[n++] = (char)(0xC0 | cp >> 6);
            ch[n++] = (char)(0x80 | (cp & 0x3F));
        }
        k += (size_t)snprintf(out + k, cap - k, "%s\"%.*s\": %d", b ? ", " : "", n, ch, b);
    }
    return k;
}

#endif
