/* checkpoint.c — open a checkpoint (one safetensors file or shards with
 * model.safetensors.index.json), memory-map it read-only, index its tensors by name. */
#include "model/safetensors.h"
#include "core/internal.h"

#include "core/json.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_FMT "\"%.200s\""
/* Largest index file read (model.safetensors.index.json). */
#define MAX_INDEX_BYTES ((size_t)256 << 20)

typedef struct shard {
    char *path;
    const uint8_t *map; /* MAP_FAILED-free: NULL when not mapped */
    size_t size;
    int fd;             /* kept open: moex_checkpoint_verify fstats the file that is mapped */
    struct stat at_open; /* that file as it was when mapped */
    moex_st_file file;
} shard;

struct moex_checkpoint {
    int n_shards;
    shard *shards;
    size_t n;
    moex_ckpt_tensor *tensors; /* sorted by name */
};

/* ---- files ------------------------------------------------------------- */

/* dir + "/" + name, malloc'd; NULL when out of memory. */
static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* 1 if path exists (following links) and is a regular file. */
static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Map path read-only into s->map / s->size, keeping its descriptor and its stat. Files
 * shorter than 8 bytes are rejected here (a zero-length file cannot be mapped). */
static moex_status map_file(const char *path, shard *s) {
    int fd;
    struct stat sb;
    moex_status st = moex_open_regular(path, &fd, &sb, NULL);
    if (st) return st;
    if (sb.st_size < 8) {
        close(fd);
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: file is %lld bytes, too short for the 8-byte header length (truncated file?)", path,
                         (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return moex_fail(MOEX_ERR_IO, "%s: %lld bytes do not fit the address space", path, (long long)sb.st_size);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (m == MAP_FAILED) {
        close(fd);
        return moex_fail(MOEX_ERR_IO, "%s: cannot map %lld bytes: %s", path, (long long)sb.st_size, strerror(e));
    }
    s->map = m;
    s->size = (size_t)sb.st_size;
    s->fd = fd;
    s->at_open = sb;
    return MOEX_OK;
}


/* ---- the checkpoint object --------------------------------------------- */

/* Unmap and free everything; NULL is a no-op. */
void moex_checkpoint_close(moex_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_shards; i++) {
        shard *s = &c->shards[i];
        if (s->map) munmap((void *)s->map, s->size);
        if (s->fd >= 0) close(s->fd);
        moex_st_file_free(&s->file);
        free(s->path);
    }
    free(c->shards);
    free(c->tensors);
    free(c);
}

/* Append a shard for `path` (taken over: freed on failure too) and map + validate it. */
static moex_status add_shard(moex_checkpoint *c, char *path) {
    shard *s = &c->shards[c->n_shards++];
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = -1;
    moex_status st = map_file(path, s);
    if (st != MOEX_OK) return st;
    return moex_safetensors_parse(s->map, s->size, path, &s->file);
}

/* Compare two checkpoint tensors by name (qsort). */
static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const moex_ckpt_tensor *)a)->name, ((const moex_ckpt_tensor *)b)->name);
}

/* Build the name-sorted table over every shard; a name in two shards is an error. */
static moex_status build_table(moex_checkpoint *c) {
    size_t n = 0;
    for (int i = 0; i < c->n_shards; i++) n += c->shards[i].file.n_tensors;
    c->tensors = calloc(n ? n : 1, sizeof *c->tensors);
    if (!c->tensors) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "checkpoint: out of memory for %zu tensors", n);
    for (int i = 0; i < c->n_shards; i++) {
        const shard *s = &c->shards[i];
        for (size_t k = 0; k < s->file.n_tensors; k++) {
            const moex_st_tensor *f = &s->file.tensors[k];
            moex_ckpt_tensor *t = &c->tensors[c->n++];
            t->name = f->name;
            t->dtype = f->dtype;
            t->ndim = f->ndim;
            memcpy(t->shape, f->shape, sizeof t->shape);
            t->data = s->map + f->offset;
            t->nbytes = f->nbytes;
            t->shard = i;
        }
    }
    qsort(c->tensors, c->n, sizeof *c->tensors, cmp_tensor);
    for (size_t i = 1; i < c->n; i++)
        if (strcmp(c->tensors[i - 1].name, c->tensors[i].name) == 0)
            return moex_fail(MOEX_ERR_FORMAT, "tensor " NAME_FMT " is in two shards: %s and %s", c->tensors[i].name,
                             c->shards[c->tensors[i - 1].shard].path, c->shards[c->tensors[i].shard].path);
    return MOEX_OK;
}

/* The distinct shard names of an index in order of first appearance, found through an
 * open-addressing hash table of their indices (linear in the number of entries). */
typedef struct name_set {
    const char **names; /* [n], in order of first appearance */
    int n;
    int *slots;         /* [cap]: -1 or an index into names */
    size_t cap;         /* a power of two >= 2 x the entries */
} name_set;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Index of name in the set, adding it when new. */
static int name_set_add(name_set *ns, const char *name) {
    size_t i = (size_t)hash_str(name) & (ns->cap - 1);
    while (ns->slots[i] >= 0) {
        if (strcmp(ns->names[ns->slots[i]], name) == 0) return ns->slots[i];
        i = (i + 1) & (ns->cap - 1);
    }
    ns->names[ns->n] = name;
    ns->slots[i] = ns->n;
    return ns->n++;
}

/* 1 if a shard file name from an index is a plain file name inside the directory. */
static int plain_file_name(const char *s) {
    return *s && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* The sharded case: parse the index at ipath, check every shard exists, map
 * them all, and check that each listed tensor is in the shard the index names. */
static moex_status open_sharded(moex_checkpoint *c, const char *dir, const char *ipath) {
    char *text = NULL;
    size_t len = 0;
    moex_status st = moex_read_file(ipath, MAX_INDEX_BYTES, &text, &len, NULL);
    if (st != MOEX_OK) return st;
    const char *end = NULL;
    int oom = 0;
    cJSON *root = moex_json_parse(text, len, &end, &oom);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        free(text);
        if (oom) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory parsing the index", ipath);
        return moex_fail(MOEX_ERR_FORMAT, "%s: not valid JSON (error near byte %zu)", ipath, at);
    }
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    name_set ns = {NULL, 0, NULL, 0};
    if (!cJSON_IsObject(root)) st = moex_fail(MOEX_ERR_FORMAT, "%s: not a JSON object", ipath);
    else if (!wm) st = moex_fail(MOEX_ERR_FORMAT, "%s: has no \"weight_map\"", ipath);
    else if (!cJSON_IsObject(wm)) st = moex_fail(MOEX_ERR_FORMAT, "%s: \"weight_map\" is not an object", ipath);
    size_t n_entries = 0;
    for (const cJSON *e = st == MOEX_OK ? wm->child : NULL; e; e = e->next) n_entries++;
    if (st == MOEX_OK && n_entries > INT32_MAX / 4)
        st = moex_fail(MOEX_ERR_FORMAT, "%s: \"weight_map\" has %zu entries, more than moex reads", ipath, n_entries);
    ns.cap = 2;
    while (ns.cap < 2 * n_entries) ns.cap *= 2;
    if (st == MOEX_OK && (!(ns.names = malloc((n_entries ? n_entries : 1) * sizeof *ns.names)) ||
                          !(ns.slots = malloc(ns.cap * sizeof *ns.slots))))
        st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", ipath);
    if (ns.slots) memset(ns.slots, 0xff, ns.cap * sizeof *ns.slots); /* every slot -1 */
    const char **names = ns.names;
    for (const cJSON *e = st == MOEX_OK ? wm->child : NULL; e && st == MOEX_OK; e = e->next) {
        if (!cJSON_IsString(e)) {
            st = moex_fail(MOEX_ERR_FORMAT, "%s: weight_map[" NAME_FMT "] is not a string (a shard file name)",
                           ipath, e->string);
            break;
        }
        if (!plain_file_name(e->valuestring)) {
            st = moex_fail(MOEX_ERR_FORMAT, "%s: weight_map[" NAME_FMT "] = " NAME_FMT
                           " is not a file name in the checkpoint directory", ipath, e->string, e->valuestring);
            break;
        }
        name_set_add(&ns, e->valuestring);
    }
    const int n_names = ns.n;
    if (st == MOEX_OK && n_names == 0) st = moex_fail(MOEX_ERR_FORMAT, "%s: \"weight_map\" is empty", ipath);
    /* every shard must exist before any is mapped */
    for (int k = 0; k < n_names && st == MOEX_OK; k++) {
        char *p = path_join(dir, names[k]);
        if (!p) st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", ipath);
        else if (!is_file(p)) {
            const cJSON *e = wm->child;
            while (e && strcmp(e->valuestring, names[k]) != 0) e = e->next;
            st = moex_fail(MOEX_ERR_IO, "missing shard %s (named by %s for tensor " NAME_FMT "): %s", p, ipath,
                           e ? e->string : "?", access(p, F_OK) == 0 ? "not a regular file" : strerror(errno));
        }
        free(p);
    }
    if (st == MOEX_OK && !(c->shards = calloc((size_t)n_names, sizeof *c->shards)))
        st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", ipath);
    for (int k = 0; k < n_names && st == MOEX_OK; k++) {
        char *p = path_join(dir, names[k]);
        st = p ? add_shard(c, p) : moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", ipath);
    }
    if (st == MOEX_OK) st = build_table(c);
    /* each listed tensor must be in the shard the index names */
    for (const cJSON *e = st == MOEX_OK ? wm->child : NULL; e && st == MOEX_OK; e = e->next) {
        const moex_ckpt_tensor *t = moex_checkpoint_find(c, e->string);
        if (!t)
            st = moex_fail(MOEX_ERR_FORMAT, "%s lists tensor " NAME_FMT " in %s, but that shard does not contain it",
                           ipath, e->string, e->valuestring);
        else if (strcmp(names[t->shard], e->valuestring) != 0) /* shard k was opened from names[k] */
            st = moex_fail(MOEX_ERR_FORMAT, "%s lists tensor " NAME_FMT " in %s, but it is in %s", ipath, e->string,
                           e->valuestring, c->shards[t->shard].path);
    }
    free(ns.names);
    free(ns.slots);
    cJSON_Delete(root);
    free(text);
    return st;
}

/* Open DIR (or a .safetensors file); see safetensors.h. */
moex_status moex_checkpoint_open(const char *dir, moex_checkpoint **out) {
    if (!dir || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_checkpoint_open: %s is NULL", dir ? "out" : "dir");
    moex_checkpoint *c = calloc(1, sizeof *c);
    if (!c) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_checkpoint_open: out of memory");
    moex_status st;
    char *single = is_file(dir) ? path_join("", dir) : path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    if (!single || !index) {
        st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_checkpoint_open: out of memory");
    } else if (is_file(single)) {
        c->shards = calloc(1, sizeof *c->shards);
        if (!c->shards) st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_checkpoint_open: out of memory");
        else {
            st = add_shard(c, single);
            single = NULL;
            if (st == MOEX_OK) st = build_table(c);
        }
    } else if (is_file(index)) {
        st = open_sharded(c, dir, index);
    } else {
        struct stat sb;
        if (stat(dir, &sb) != 0)
            st = moex_fail(MOEX_ERR_IO, "checkpoint directory %s: %s", dir, strerror(errno));
        else
            st = moex_fail(MOEX_ERR_IO, "%s: no model.safetensors and no model.safetensors.index.json", dir);
    }
    free(single);
    free(index);
    if (st != MOEX_OK) {
        moex_checkpoint_close(c);
        return st;
    }
    *out = c;
    return MOEX_OK;
}

/* ---- lookups ----------------------------------------------------------- */

/* Number of tensors (0 for NULL). */
size_t moex_checkpoint_count(const moex_checkpoint *c) { return c ? c->n : 0; }

/* i-th tensor in name order, NULL if out of range. */
const moex_ckpt_tensor *moex_checkpoint_at(const moex_checkpoint *c, size_t i) {
    return c && i < c->n ? &c->tensors[i] : NULL;
}

/* Binary search by name; NULL if absent (no error recorded). */
const moex_ckpt_tensor *moex_checkpoint_find(const moex_checkpoint *c, const char *name) {
    if (!c || !name) return NULL;
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(name, c->tensors[mid].name);
        if (r == 0) return &c->tensors[mid];
        if (r < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* find, with MOEX_ERR_NOT_FOUND naming the tensor when absent. */
moex_status moex_checkpoint_get(const moex_checkpoint *c, const char *name, const moex_ckpt_tensor **out) {
    if (!c || !name || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_checkpoint_get: null argument");
    const moex_ckpt_tensor *t = moex_checkpoint_find(c, name);
    if (!t)
        return moex_fail(MOEX_ERR_NOT_FOUND, "checkpoint %s%s: no tensor " NAME_FMT,
                         c->n_shards ? c->shards[0].path : "", c->n_shards > 1 ? " (and its other shards)" : "",
                         name);
    *out = t;
    return MOEX_OK;
}

/* Each mapped file as it was when mapped; see safetensors.h. */
moex_status moex_checkpoint_verify(const moex_checkpoint *c) {
    if (!c) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_checkpoint_verify: checkpoint is NULL");
    for (int i = 0; i < c->n_shards; i++) {
        const shard *s = &c->shards[i];
        struct stat now;
        if (fstat(s->fd, &now) != 0)
            return moex_fail(MOEX_ERR_IO, "%s: cannot stat the open checkpoint file: %s", s->path, strerror(errno));
        const struct stat *then = &s->at_open;
        if (now.st_size != then->st_size)
            return moex_fail(MOEX_ERR_IO, "checkpoint file %s changed after the model was loaded: %lld bytes then, %lld "
                             "now; reload the model", s->path, (long long)then->st_size, (long long)now.st_size);
        /* the modification time: a write moves it; a chmod, or the file unlinked or replaced by rename
         * (which leaves the mapped bytes alone), moves only the change time */
        if (now.st_mtim.tv_sec != then->st_mtim.tv_sec || now.st_mtim.tv_nsec != then->st_mtim.tv_nsec)
            return moex_fail(MOEX_ERR_IO, "checkpoint file %s was written to after the model was loaded (its modification "
                             "time moved); reload the model", s->path);
    }
    return MOEX_OK;
}

/* Number of mapped files. */
int moex_checkpoint_shard_count(const moex_checkpoint *c) { return c ? c->n_shards : 0; }

/* Path of shard i, NULL if out of range. */
const char *moex_checkpoint_shard_path(const moex_checkpoint *c, int i) {
    return c && i >= 0 && i < c->n_shards ? c->shards[i].path : NULL;
}

/* Parsed header of shard i, NULL if out of range. */
const moex_st_file *moex_checkpoint_shard_file(const moex_checkpoint *c, int i) {
    return c && i >= 0 && i < c->n_shards ? &c->shards[i].file : NULL;
}

/* In-place moex_tensor view of a checkpoint tensor; see safetensors.h. */
moex_status moex_ckpt_tensor_view(const moex_ckpt_tensor *t, moex_tensor *view) {
    if (!t || !view) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ckpt_tensor_view: null argument");
    moex_dtype dt;
    if (moex_st_dtype_to_moex(t->dtype, &dt) != MOEX_OK)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "tensor " NAME_FMT ": safetensors dtype %s has no moex dtype", t->name,
                         moex_st_dtype_name(t->dtype));
    if (t->ndim > MOEX_MAX_DIMS)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "tensor " NAME_FMT ": rank %d exceeds the %d of a moex_tensor", t->name,
                         t->ndim, MOEX_MAX_DIMS);
    size_t es = moex_dtype_size(dt);
    if (t->nbytes && (uintptr_t)t->data % es != 0)
        return moex_fail(MOEX_ERR_UNSUPPORTED,
                         "tensor " NAME_FMT ": its data is not aligned to its %zu-byte elements in the file; copy it",
                         t->name, es);
    int64_t one = 1;
    const int64_t *shape = t->ndim ? t->shape : &one;
    return moex_tensor_init(view, (void *)(uintptr_t)t->data, dt, t->ndim ? t->ndim : 1, shape);
}
