/* safetensors.c — stored dtypes and the strict parser of a safetensors file image. */
#include "model/safetensors.h"
#include "core/internal.h"

#include "core/json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Names in messages are clipped to this many bytes. */
#define NAME_FMT "\"%.200s\""

/* ---- stored dtypes ----------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[MOEX_ST_DTYPE_COUNT] = {
    [MOEX_ST_BOOL] = {"BOOL", 1},   [MOEX_ST_U8] = {"U8", 1},
    [MOEX_ST_I8] = {"I8", 1},       [MOEX_ST_F8_E4M3] = {"F8_E4M3", 1},
    [MOEX_ST_F8_E5M2] = {"F8_E5M2", 1}, [MOEX_ST_F8_E8M0] = {"F8_E8M0", 1},
    [MOEX_ST_U16] = {"U16", 2},     [MOEX_ST_I16] = {"I16", 2},
    [MOEX_ST_F16] = {"F16", 2},     [MOEX_ST_BF16] = {"BF16", 2},
    [MOEX_ST_U32] = {"U32", 4},     [MOEX_ST_I32] = {"I32", 4},
    [MOEX_ST_F32] = {"F32", 4},     [MOEX_ST_U64] = {"U64", 8},
    [MOEX_ST_I64] = {"I64", 8},     [MOEX_ST_F64] = {"F64", 8},
};

/* Bytes per element; 0 for an invalid value. */
size_t moex_st_dtype_size(moex_st_dtype dtype) {
    return (unsigned)dtype < MOEX_ST_DTYPE_COUNT ? st_dtypes[dtype].size : 0;
}

/* Header spelling of a dtype, "invalid" if unknown. */
const char *moex_st_dtype_name(moex_st_dtype dtype) {
    return (unsigned)dtype < MOEX_ST_DTYPE_COUNT ? st_dtypes[dtype].name : "invalid";
}

/* Header dtype string -> enum; unknown names are MOEX_ERR_FORMAT listing the known ones. */
moex_status moex_st_dtype_parse(const char *name, moex_st_dtype *out) {
    if (!name || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_st_dtype_parse: null argument");
    for (int i = 0; i < MOEX_ST_DTYPE_COUNT; i++)
        if (strcmp(name, st_dtypes[i].name) == 0) {
            *out = (moex_st_dtype)i;
            return MOEX_OK;
        }
    return moex_fail(MOEX_ERR_FORMAT,
                     "unknown safetensors dtype " NAME_FMT " (known: BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, "
                     "U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64)", name);
}

/* Stored dtype -> moex_dtype where moex has one; MOEX_ERR_UNSUPPORTED otherwise. */
moex_status moex_st_dtype_to_moex(moex_st_dtype dtype, moex_dtype *out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_st_dtype_to_moex: out is NULL");
    moex_dtype d;
    switch (dtype) {
    case MOEX_ST_F32: d = MOEX_F32; break;
    case MOEX_ST_F16: d = MOEX_F16; break;
    case MOEX_ST_BF16: d = MOEX_BF16; break;
    case MOEX_ST_F8_E4M3: d = MOEX_E4M3; break;
    case MOEX_ST_F8_E8M0: d = MOEX_UE8M0; break;
    case MOEX_ST_I32: d = MOEX_I32; break;
    case MOEX_ST_I64: d = MOEX_I64; break;
    default:
        return moex_fail(MOEX_ERR_UNSUPPORTED,
                         "safetensors dtype %s has no moex dtype (moex computes with F32, F16, BF16, F8_E4M3, "
                         "F8_E8M0, I32, I64)", moex_st_dtype_name(dtype));
    }
    *out = d;
    return MOEX_OK;
}

/* ---- small JSON helpers ------------------------------------------------ */

/* "a string", "an array", ... for messages. */
static const char *json_kind(const cJSON *v) {
    if (!v) return "nothing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

/* Why v is not an exact integer in [0, 2^53] (doubles hold those exactly), or NULL if it is. */
static const char *uint_problem(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return "is not a number";
    double d = v->valuedouble;
    if (isnan(d)) return "is not a number";
    if (d < 0) return "is negative";
    if (d != floor(d)) return "is not an integer";
    if (d > 9007199254740992.0) return "is too large";
    return NULL;
}

/* Offset of the first byte of s[0..n) that cannot be in UTF-8 JSON text
 * (malformed UTF-8, or a control character other than tab, LF, CR); n if none. */
static size_t json_text_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1Fu, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0Fu, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07u, min = 0x10000;
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* ---- the parser -------------------------------------------------------- */

/* Free everything f owns and zero it. NULL is a no-op. */
void moex_st_file_free(moex_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < 2 * f->n_metadata; i++) free(f->metadata[i]);
    free(f->metadata);
    memset(f, 0, sizeof *f);
}

/* Metadata value of `key`, NULL if absent. */
const char *moex_st_file_metadata(const moex_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_metadata; i++)
        if (strcmp(f->metadata[2 * i], key) == 0) return f->metadata[2 * i + 1];
    return NULL;
}

/* strdup that returns NULL on failure (strdup is not C11). */
static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Copy the "__metadata__" object m (strings only) into f. */
static moex_status parse_metadata(const cJSON *m, const char *what, moex_st_file *f) {
    if (cJSON_IsNull(m)) return MOEX_OK;
    if (!cJSON_IsObject(m))
        return moex_fail(MOEX_ERR_FORMAT, "%s: __metadata__ is %s, expected an object of strings", what,
                         json_kind(m));
    size_t n = (size_t)cJSON_GetArraySize(m);
    if (n == 0) return MOEX_OK;
    f->metadata = calloc(2 * n, sizeof(char *));
    if (!f->metadata) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for the metadata", what);
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return moex_fail(MOEX_ERR_FORMAT, "%s: __metadata__ " NAME_FMT " is %s, expected a string", what,
                             e->string, json_kind(e));
        char **kv = f->metadata + 2 * f->n_metadata;
        kv[0] = dup_str(e->string);
        kv[1] = dup_str(e->valuestring);
        f->n_metadata++; /* counted before the check so that free() releases a half pair */
        if (!kv[0] || !kv[1]) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for the metadata", what);
    }
    return MOEX_OK;
}

/* Validate one tensor entry e (named e->string) against a data section of
 * data_size bytes starting at data_start; fill *t (name excluded). */
static moex_status parse_tensor(const cJSON *e, const char *what, uint64_t data_start, uint64_t data_size,
                                moex_st_tensor *t) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " is %s, expected an object", what, name,
                         json_kind(e));
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *k = e->child; k; k = k->next) {
        const cJSON **slot = strcmp(k->string, "dtype") == 0          ? &jd
                             : strcmp(k->string, "shape") == 0        ? &js
                             : strcmp(k->string, "data_offsets") == 0 ? &jo
                                                                      : NULL;
        if (!slot) continue; /* unknown keys are ignored, as the reference reader does */
        if (*slot)
            return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " has \"%s\" twice", what, name, k->string);
        *slot = k;
    }
    if (!jd) return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " has no \"dtype\"", what, name);
    if (!js) return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " has no \"shape\"", what, name);
    if (!jo) return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " has no \"data_offsets\"", what, name);

    /* dtype */
    if (!cJSON_IsString(jd))
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": dtype is %s, expected a string", what, name,
                         json_kind(jd));
    if (moex_st_dtype_parse(jd->valuestring, &t->dtype) != MOEX_OK)
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": unknown dtype \"%.40s\" (known: BOOL, U8, I8, F8_E4M3, F8_E5M2, "
                         "F8_E8M0, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64)",
                         what, name, jd->valuestring);

    /* shape */
    if (!cJSON_IsArray(js))
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape is %s, expected an array", what, name,
                         json_kind(js));
    int ndim = cJSON_GetArraySize(js);
    if (ndim > MOEX_ST_MAX_DIMS)
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape has %d dimensions, at most %d", what, name,
                         ndim, MOEX_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t count = 1;
    int overflow = 0, i = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        const char *why = uint_problem(d);
        if (why) {
            if (cJSON_IsNumber(d))
                return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape[%d] = %.17g %s", what, name, i,
                                 d->valuedouble, why);
            return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape[%d] is %s, expected an integer",
                             what, name, i, json_kind(d));
        }
        uint64_t dim = (uint64_t)d->valuedouble;
        t->shape[i] = (int64_t)dim;
        if (dim != 0 && count > UINT64_MAX / dim) overflow = 1; /* unless a 0 dim follows (below) */
        else count *= dim;
    }
    /* a zero dimension makes the count 0 whatever overflowed before it */
    for (int k = 0; k < ndim; k++)
        if (t->shape[k] == 0) overflow = 0, count = 0;
    size_t esize = moex_st_dtype_size(t->dtype);
    if (overflow || count > UINT64_MAX / esize)
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": shape x %zu-byte %s overflows 64 bits", what,
                         name, esize, moex_st_dtype_name(t->dtype));
    uint64_t want = count * esize;

    /* data_offsets */
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": data_offsets is %s, expected [begin, end]", what,
                         name, cJSON_IsArray(jo) ? "an array whose length is not 2" : json_kind(jo));
    uint64_t off[2];
    const cJSON *o = jo->child;
    for (int k = 0; k < 2; k++, o = o->next) {
        const char *why = uint_problem(o);
        if (why) {
            if (cJSON_IsNumber(o))
                return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": data_offsets[%d] = %.17g %s", what, name,
                                 k, o->valuedouble, why);
            return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": data_offsets[%d] is %s, expected an integer",
                             what, name, k, json_kind(o));
        }
        off[k] = (uint64_t)o->valuedouble;
    }
    if (off[0] > off[1])
        return moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] has begin > end", what,
                         name, (unsigned long long)off[0], (unsigned long long)off[1]);
    if (off[1] > data_size)
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": data_offsets [%llu, %llu] end past the end of the file "
                         "(data section is %llu bytes; truncated file?)",
                         what, name, (unsigned long long)off[0], (unsigned long long)off[1],
                         (unsigned long long)data_size);
    if (off[1] - off[0] != want) {
        char sh[8 * 24 + 4];
        size_t len = 0;
        sh[len++] = '[';
        for (int k = 0; k < ndim; k++)
            len += (size_t)snprintf(sh + len, sizeof sh - len, k ? ", %lld" : "%lld", (long long)t->shape[k]);
        snprintf(sh + len, sizeof sh - len, "]");
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": shape %s x %zu bytes (%s) = %llu bytes, but data_offsets "
                         "[%llu, %llu] hold %llu",
                         what, name, sh, esize, moex_st_dtype_name(t->dtype), (unsigned long long)want,
                         (unsigned long long)off[0], (unsigned long long)off[1],
                         (unsigned long long)(off[1] - off[0]));
    }
    t->offset = data_start + off[0];
    t->nbytes = want;
    return MOEX_OK;
}

/* qsort comparators over arrays of tensor pointers. */
static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const moex_st_tensor *const *)a)->name, (*(const moex_st_tensor *const *)b)->name);
}
static int cmp_offset(const void *a, const void *b) {
    const moex_st_tensor *x = *(const moex_st_tensor *const *)a, *y = *(const moex_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* No name twice and no two non-empty byte ranges overlapping. */
static moex_status check_unique_disjoint(moex_st_file *f, const char *what) {
    if (f->n_tensors < 2) return MOEX_OK;
    const moex_st_tensor **p = malloc(f->n_tensors * sizeof *p);
    if (!p) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory checking %zu tensors", what, f->n_tensors);
    moex_status st = MOEX_OK;
    for (size_t i = 0; i < f->n_tensors; i++) p[i] = &f->tensors[i];
    qsort(p, f->n_tensors, sizeof *p, cmp_name);
    for (size_t i = 1; i < f->n_tensors && st == MOEX_OK; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0)
            st = moex_fail(MOEX_ERR_FORMAT, "%s: tensor " NAME_FMT " appears twice in the header", what, p[i]->name);
    size_t n = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes) p[n++] = &f->tensors[i];
    qsort(p, n, sizeof *p, cmp_offset);
    for (size_t i = 1; i < n && st == MOEX_OK; i++) {
        const moex_st_tensor *a = p[i - 1], *b = p[i];
        if (a->offset + a->nbytes > b->offset)
            st = moex_fail(MOEX_ERR_FORMAT,
                           "%s: tensors " NAME_FMT " (data_offsets [%llu, %llu]) and " NAME_FMT
                           " (data_offsets [%llu, %llu]) overlap",
                           what, a->name, (unsigned long long)(a->offset - f->data_start),
                           (unsigned long long)(a->offset - f->data_start + a->nbytes), b->name,
                           (unsigned long long)(b->offset - f->data_start),
                           (unsigned long long)(b->offset - f->data_start + b->nbytes));
    }
    free(p);
    return st;
}

/* Walk the parsed header object root and fill f. */
static moex_status parse_header(const cJSON *root, const char *what, uint64_t data_size, moex_st_file *f) {
    size_t n = 0;
    const cJSON *meta = NULL;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (meta) return moex_fail(MOEX_ERR_FORMAT, "%s: __metadata__ appears twice in the header", what);
            meta = e;
        } else {
            n++;
        }
    }
    if (meta) {
        moex_status st = parse_metadata(meta, what, f);
        if (st != MOEX_OK) return st;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", what, n);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e == meta) continue;
        moex_st_tensor *t = &f->tensors[f->n_tensors];
        moex_status st = parse_tensor(e, what, f->data_start, data_size, t);
        if (st != MOEX_OK) return st;
        t->name = dup_str(e->string);
        if (!t->name) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for tensor names", what);
        f->n_tensors++;
    }
    return check_unique_disjoint(f, what);
}

/* Parse and validate a whole file image; see safetensors.h. */
moex_status moex_safetensors_parse(const uint8_t *buf, size_t size, const char *what, moex_st_file *out) {
    if (!what) what = "safetensors file";
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_safetensors_parse(%s): out is NULL", what);
    if (!buf && size) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_safetensors_parse(%s): buf is NULL", what);
    if (size < 8)
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: file is %zu bytes, too short for the 8-byte header length (truncated file?)", what,
                         size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen == 0) return moex_fail(MOEX_ERR_FORMAT, "%s: header length is 0", what);
    if (hlen > MOEX_ST_MAX_HEADER)
        return moex_fail(MOEX_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes (100 MiB)", what,
                         (unsigned long long)hlen, (unsigned long long)MOEX_ST_MAX_HEADER);
    if (hlen > size - 8)
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: header length %llu runs past the end of the file (%zu bytes; truncated file?)", what,
                         (unsigned long long)hlen, size);
    const uint8_t *h = buf + 8;
    size_t bad = json_text_check(h, (size_t)hlen);
    if (bad < hlen)
        return moex_fail(MOEX_ERR_FORMAT,
                         "%s: header is not valid JSON text: byte %zu (0x%02x) is not valid UTF-8 or is a control "
                         "character", what, bad, h[bad]);
    /* cJSON is given a NUL-terminated copy: cJSON 1.7.15 without Debian's fix for
     * CVE-2023-53154 reads one byte past the given length after a trailing comma,
     * which in a mapping could be past the end of the file. */
    char *text = malloc((size_t)hlen + 1);
    if (!text) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for a %llu-byte header", what,
                                (unsigned long long)hlen);
    memcpy(text, h, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL;
    int oom = 0;
    cJSON *root = moex_json_parse(text, (size_t)hlen, &end, &oom);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        free(text);
        if (oom) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory parsing the %llu-byte header", what,
                                  (unsigned long long)hlen);
        return moex_fail(MOEX_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %llu)", what, at,
                         (unsigned long long)hlen);
    }
    moex_status st = MOEX_OK;
    for (const char *p = end; p < text + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = moex_fail(MOEX_ERR_FORMAT, "%s: unexpected bytes after the JSON header, at byte %zu of %llu", what,
                           (size_t)(p - text), (unsigned long long)hlen);
            break;
        }
    free(text);
    if (st == MOEX_OK && !cJSON_IsObject(root))
        st = moex_fail(MOEX_ERR_FORMAT, "%s: header is %s, expected a JSON object", what, json_kind(root));
    moex_st_file f;
    memset(&f, 0, sizeof f);
    f.header_len = hlen;
    f.data_start = 8 + hlen;
    if (st == MOEX_OK) st = parse_header(root, what, (uint64_t)size - f.data_start, &f);
    cJSON_Delete(root);
    if (st != MOEX_OK) {
        moex_st_file_free(&f);
        return st;
    }
    *out = f;
    return MOEX_OK;
}
