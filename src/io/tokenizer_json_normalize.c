/* tokenizer.json's "normalizer": Unicode NFC (Qwen 2's), through ICU.
 *
 * Hugging Face normalizes the text between the added tokens matched on the
 * raw text, before the normalized added tokens and the pre-tokenizer see it
 * (bpe_encode.c calls fsc_bpe_normalize there). NFC is the only form a
 * byte-level BPE file in use asks for; ICU's normalizer (libicu, Debian's
 * libicu-dev) does the work on UTF-16, so the segment goes through UTF-8 ->
 * UTF-16 -> NFC -> UTF-8. Any other normalizer is refused by name when the
 * file loads: a tokenizer that loads encodes as Hugging Face's does.
 *
 * Text that is not valid UTF-8 is passed through unchanged (ICU refuses it,
 * and the byte-level model encodes any bytes). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "io/bpe_internal.h"

static int refuse(const char *path, const char *type) {
    return fsc_error(FSC_ERR_UNSUPPORTED,
                     "%s: normalizer \"%s\" is not supported (fsc runs NFC, or a Sequence of "
                     "NFC only)",
                     path, type);
}

int fsc_bpe_normalizer_parse(fsc_bpe *t, const void *json, const char *path) {
    const cJSON *norm = json;
    if (!norm || cJSON_IsNull(norm)) return FSC_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(norm, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(type, "NFC")) {
        UErrorCode err = U_ZERO_ERROR;
        if (!unorm2_getNFCInstance(&err) || U_FAILURE(err))
            return fsc_error(FSC_ERR_UNSUPPORTED, "%s: normalizer NFC: ICU has no NFC data (%s)",
                             path, u_errorName(err));
        t->nfc = true;
        return FSC_OK;
    }
    if (strcmp(type, "Sequence")) return refuse(path, type);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers"), *e;
    if (!cJSON_IsArray(list))
        return fsc_error(FSC_ERR_FORMAT, "%s: normalizer Sequence: expected \"normalizers\", an "
                                         "array", path);
    cJSON_ArrayForEach(e, list) {
        int rc = fsc_bpe_normalizer_parse(t, e, path);
        if (rc) return rc;
    }
    return FSC_OK;
}

int fsc_bpe_normalize(const char *s, size_t n, char **out, size_t *out_n) {
    *out = NULL, *out_n = 0;
    if (n > (size_t)INT32_MAX / 4)
        return fsc_error(FSC_ERR_INVALID, "BPE NFC: a text of %zu bytes is too long for ICU", n);
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&err);
    /* UTF-16 never has more units than UTF-8 has bytes; NFC grows it at most 3x */
    const int32_t cap16 = (int32_t)n + 1, capn = 3 * (int32_t)n + 1;
    UChar *u = malloc(sizeof(UChar) * (size_t)(cap16 + capn));
    char *utf8 = malloc(3 * (size_t)capn + 1);
    if (!u || !utf8) {
        free(u), free(utf8);
        return fsc_error(FSC_ERR_NOMEM, "BPE NFC: out of memory for %zu bytes", n);
    }
    int32_t len16 = 0, lenn = 0, len8 = 0;
    u_strFromUTF8(u, cap16, &len16, s, (int32_t)n, &err);
    if (err == U_INVALID_CHAR_FOUND || err == U_ILLEGAL_CHAR_FOUND) { /* not UTF-8: as is */
        memcpy(utf8, s, n);
        *out = utf8, *out_n = n;
        free(u);
        return FSC_OK;
    }
    if (U_SUCCESS(err)) lenn = unorm2_normalize(nfc, u, len16, u + cap16, capn, &err);
    if (U_SUCCESS(err)) u_strToUTF8(utf8, 3 * capn + 1, &len8, u + cap16, lenn, &err);
    free(u);
    if (U_FAILURE(err)) {
        free(utf8);
        return fsc_error(FSC_ERR_INVALID, "BPE NFC of %zu bytes: ICU failed (%s)", n,
                         u_errorName(err));
    }
    *out = utf8, *out_n = (size_t)len8;
    return FSC_OK;
}
