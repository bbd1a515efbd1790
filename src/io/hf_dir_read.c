/* A Hugging Face model directory read as one safetensors file.
 *
 * DIR/model.safetensors when it is there (what save_pretrained writes for a
 * model that fits one shard); else DIR/model.safetensors.index.json, whose
 * weight_map names the shard holding each tensor. Every shard is opened and
 * validated by the one-file reader, and every tensor the map names must be
 * in the shard it names: a lying index is refused at open, naming the
 * tensor and the shard, so a load never finds out halfway. Tensors a shard
 * holds beyond the map are not part of the model (the map decides, as it
 * does for Hugging Face's loader).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsc/io.h"
#include "io/st_file_internal.h"

#define INDEX_NAME "model.safetensors.index.json"
#define INDEX_MAX ((size_t)256 << 20) /* bytes of index JSON accepted */

static bool exists(const char *path) {
    struct stat sb;
    return !stat(path, &sb);
}

/* A shard's name as the map gives it: a plain file name in the directory. */
static bool plain_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* The shard named `file`, opened once: its slot in f->parts. */
static int shard_of(fsc_st_file *f, const char *dir, const char *file, const char *tensor,
                    int *slot) {
    for (int i = 0; i < f->nparts; i++)
        if (!strcmp(strrchr(f->parts[i]->path, '/') + 1, file)) return *slot = i, FSC_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (!exists(path))
        return fsc_error(FSC_ERR_NOT_FOUND,
                         "%s/" INDEX_NAME ": shard %s (holding %s) is missing from the directory",
                         dir, file, tensor);
    int rc = FSC_OK;
    fsc_st_file *p = fsc_st_open(path, &rc);
    if (!p) return rc;
    if (p->parts) { /* a directory named like a shard */
        fsc_st_close(p);
        return fsc_error(FSC_ERR_FORMAT, "%s: a shard must be a file", path);
    }
    f->parts[f->nparts] = p;
    *slot = f->nparts++;
    return FSC_OK;
}

/* The shards' metadata as the directory's, the first shard's value winning. */
static int merge_metadata(fsc_st_file *f) {
    int total = 0;
    for (int i = 0; i < f->nparts; i++) total += f->parts[i]->nmeta;
    f->meta_key = calloc((size_t)total + 1, sizeof *f->meta_key);
    f->meta_val = calloc((size_t)total + 1, sizeof *f->meta_val);
    if (!f->meta_key || !f->meta_val) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->nparts; i++)
        for (int k = 0; k < f->parts[i]->nmeta; k++) {
            const char *key = f->parts[i]->meta_key[k];
            bool seen = false;
            for (int m = 0; m < f->nmeta && !seen; m++) seen = !strcmp(f->meta_key[m], key);
            if (seen) continue;
            f->meta_key[f->nmeta] = key;
            f->meta_val[f->nmeta++] = f->parts[i]->meta_val[k];
        }
    return FSC_OK;
}

/* An entry with its shard, for ordering. */
typedef struct {
    fsc_st_entry e;
    int part;
} placed;

static int cmp_placed(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->part != y->part) return x->part < y->part ? -1 : 1;
    return x->e.offset < y->e.offset ? -1 : x->e.offset > y->e.offset;
}

/* Entries by shard, then by offset within it (the one-file order). */
static int order_entries(fsc_st_file *f) {
    placed *p = malloc(((size_t)f->n + 1) * sizeof *p);
    if (!p) return fsc_error(FSC_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) p[i] = (placed){f->entries[i], f->part_of[i]};
    qsort(p, (size_t)f->n, sizeof *p, cmp_placed);
    for (int i = 0; i < f->n; i++) f->entries[i] = p[i].e, f->part_of[i] = p[i].part;
    free(p);
    return FSC_OK;
}

static int read_index(fsc_st_file *f, const char *dir, const char *index) {
    char *text = NULL;
    int rc = fsc_file_read_all(index, INDEX_MAX, &text, NULL);
    if (rc) return rc;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(j);
        return fsc_error(FSC_ERR_FORMAT,
                         "%s: not JSON with a \"weight_map\" object (tensor name -> shard file)",
                         index);
    }
    const int n = cJSON_GetArraySize(map);
    f->entries = calloc((size_t)n + 1, sizeof *f->entries);
    f->part_of = calloc((size_t)n + 1, sizeof *f->part_of);
    f->parts = calloc((size_t)n + 1, sizeof *f->parts); /* at most one shard per tensor */
    if (!f->entries || !f->part_of || !f->parts)
        rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", index);
    for (const cJSON *m = map->child; m && !rc; m = m->next) {
        int slot = 0;
        if (!cJSON_IsString(m) || !plain_name(m->valuestring)) {
            rc = fsc_error(FSC_ERR_FORMAT,
                           "%s: weight_map[\"%s\"] must name a shard file in the directory", index,
                           m->string);
            break;
        }
        if ((rc = shard_of(f, dir, m->valuestring, m->string, &slot))) break;
        const fsc_st_entry *e = fsc_st_find(f->parts[slot], m->string);
        if (!e) {
            rc = fsc_error(FSC_ERR_FORMAT, "%s: weight_map puts %s in %s, which has no such tensor",
                           index, m->string, m->valuestring);
            break;
        }
        f->part_of[f->n] = slot;
        f->entries[f->n++] = *e; /* the name stays the shard's */
    }
    cJSON_Delete(j);
    if (!rc && !f->n) rc = fsc_error(FSC_ERR_FORMAT, "%s: weight_map names no tensor", index);
    if (!rc) rc = order_entries(f);
    if (!rc) rc = st_index_names(f); /* the map repeating a name (JSON allows it) */
    return rc ? rc : merge_metadata(f);
}

bool st_is_model_dir(const char *path) {
    struct stat sb;
    char p[4096];
    if (!path || stat(path, &sb) || !S_ISDIR(sb.st_mode)) return false;
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    if (exists(p)) return true;
    snprintf(p, sizeof p, "%s/" INDEX_NAME, path);
    return exists(p);
}

fsc_st_file *st_open_dir(const char *dir, int *status) {
    char single[4096], index[4096];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/" INDEX_NAME, dir);
    int rc = FSC_OK;
    if (exists(single)) return fsc_st_open(single, status); /* save_pretrained's one shard */
    if (!exists(index)) {
        rc = fsc_error(FSC_ERR_NOT_FOUND,
                       "%s: a directory with neither model.safetensors nor " INDEX_NAME
                       " (not a Hugging Face model directory)",
                       dir);
        if (status) *status = rc;
        return NULL;
    }
    fsc_st_file *f = calloc(1, sizeof *f);
    if (f) f->fd = -1, f->path = malloc(strlen(dir) + 1);
    if (!f || !f->path)
        rc = fsc_error(FSC_ERR_NOMEM, "%s: out of memory", dir);
    else
        strcpy(f->path, dir), rc = read_index(f, dir, index);
    if (status) *status = rc;
    if (rc) {
        fsc_st_close(f);
        return NULL;
    }
    return f;
}
