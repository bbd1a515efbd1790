/* JSON numbers that come back bit for bit.
 *
 * cJSON prints a number with 15 significant digits whenever those read back
 * within one DBL_EPSILON of the value (print_number's compare_double), so
 * about one double in six, and integers past 10^15, lose their last bits on
 * a print. Whatever fsc writes and reads back (a checkpoint's metadata:
 * AdaScale's estimates, the loss scale, the step) is therefore turned into
 * raw nodes holding "%.17g" text first, which strtod restores exactly. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#include "io/io_internal.h"

int fsc_json_exact_numbers(cJSON *node) {
    for (cJSON *c = node ? node->child : NULL, *next; c; c = next) {
        next = c->next;
        if (!cJSON_IsNumber(c)) {
            if (!fsc_json_exact_numbers(c)) return 0;
            continue;
        }
        if (!isfinite(c->valuedouble)) continue; /* cJSON writes null, as JSON must */
        char text[32];
        snprintf(text, sizeof text, "%.17g", c->valuedouble);
        cJSON *raw = cJSON_CreateRaw(text);
        if (!raw) return 0;
        raw->string = c->string; /* the key moves over (the replace keeps none) */
        raw->type |= c->type & cJSON_StringIsConst;
        c->string = NULL;
        cJSON_ReplaceItemViaPointer(node, c, raw); /* cannot fail: c is node's child */
    }
    return 1;
}

char *fsc_json_print_exact(const cJSON *value, int formatted) {
    cJSON *copy = cJSON_Duplicate(value, 1);
    cJSON *box = copy ? cJSON_CreateArray() : NULL; /* a number at the top needs a parent */
    char *text = NULL;
    if (box && cJSON_AddItemToArray(box, copy)) {
        copy = NULL;
        if (fsc_json_exact_numbers(box))
            text = formatted ? cJSON_Print(box->child) : cJSON_PrintUnformatted(box->child);
    }
    cJSON_Delete(copy);
    cJSON_Delete(box);
    return text;
}
