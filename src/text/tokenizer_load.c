/* tokenizer_load.c — tokenizer.json into a moex_tokenizer (see moex/tokenizer.h): the
 * vocabulary and merges of a BPE model, the normalizers, pre-tokenizers, decoders, the
 * post-processor's template and the added tokens. Every key the file sets is either read or
 * refused by name; nothing is half-loaded (a failure frees everything). */
#include "text/tokenizer_internal.h"
#include "core/json.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TK_FILE_LIMIT ((size_t)1 << 30)
#define TK_MAX_ID ((int64_t)1 << 30)

/* ---- small pieces ---------------------------------------------------------------- */

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

int tk_buf_putc(tk_buf *b, char c) { return tk_buf_put(b, &c, 1); }

int tk_ids_put(tk_ids *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->p, (size_t)cap * sizeof *p);
        if (!p) return 0;
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = id;
    return 1;
}

uint64_t tk_hash(const void *s, size_t n) { /* FNV-1a, then a final mix */
    const uint8_t *p = s;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    h ^= h >> 29;
    return h * 0xbf58476d1ce4e5b9ull;
}

int32_t tk_lookup(const moex_tokenizer *t, const char *s, size_t n) {
    uint32_t i = (uint32_t)tk_hash(s, n) & t->map.mask;
    for (;;) {
        const int32_t id = t->map.slot[i];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
        i = (i + 1) & t->map.mask;
    }
}

static void map_insert(moex_tokenizer *t, int32_t id) {
    uint32_t i = (uint32_t)tk_hash(t->tok[id], t->tok_len[id]) & t->map.mask;
    while (t->map.slot[i] >= 0) i = (i + 1) & t->map.mask;
    t->map.slot[i] = id;
}

/* GPT-2's byte alphabet: the printable bytes stand for themselves, the others for 256 + n. */
static int byte_cp(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

/* The byte alphabet's two tables: byte -> its character's UTF-8, code point -> byte. */
static void byte_tables(moex_tokenizer *t) {
    for (int i = 0; i < 324; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        const int cp = byte_cp((uint8_t)b);
        t->cp_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            t->byte_utf8[b][0] = (char)cp, t->byte_len[b] = 1;
        } else {
            t->byte_utf8[b][0] = (char)(0xC0 | (cp >> 6)), t->byte_utf8[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_len[b] = 2;
        }
    }
}

int tk_utf8_len(uint8_t c) { return c < 0x80 ? 1 : c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1; }

int32_t tk_utf8_decode(const uint8_t *s, size_t n, int *len) {
    *len = 1;
    const uint8_t c = s[0];
    if (c < 0x80) return c;
    const int l = tk_utf8_len(c);
    if (l == 1 || (size_t)l > n) return -1;
    int32_t cp = c & (0x7F >> l);
    for (int i = 1; i < l; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    *len = l;
    return cp;
}

/* ---- JSON access with the key path in messages ---------------------------------------- */

typedef struct loader {
    moex_tokenizer *t;
    const char *file;
} loader;

static moex_status bad(const loader *ld, const char *key, const char *what) {
    return moex_fail(MOEX_ERR_FORMAT, "%s: %s: %s", ld->file, key, what);
}
static moex_status unsupported(const loader *ld, const char *key, const char *value) {
    return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: %s = %s is not supported by moex's tokenizer (see docs/models.md)",
                     ld->file, key, value);
}

static const cJSON *field(const cJSON *o, const char *name) { return cJSON_GetObjectItemCaseSensitive(o, name); }
static int is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

static moex_status get_string(const loader *ld, const cJSON *o, const char *name, const char *key, const char **out) {
    const cJSON *v = field(o, name);
    if (!cJSON_IsString(v)) return bad(ld, key, "missing, or not a string");
    *out = v->valuestring;
    return MOEX_OK;
}

static int get_bool(const cJSON *o, const char *name, int dflt) {
    const cJSON *v = field(o, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dup(const char *s) {
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

/* One UTF-8 character into out[8] (a Metaspace replacement or a Strip content). */
static moex_status one_char(const loader *ld, const char *s, const char *key, char out[8]) {
    int len;
    if (!s[0] || tk_utf8_decode((const uint8_t *)s, strlen(s), &len) < 0 || s[len])
        return bad(ld, key, "must be one UTF-8 character");
    memcpy(out, s, (size_t)len);
    out[len] = 0;
    return MOEX_OK;
}

static moex_status compile(const loader *ld, const char *pattern, const char *key, pcre2_code **out) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: %s: PCRE2 rejects the regex at offset %zu: %s", ld->file, key,
                         (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter where JIT is missing */
    *out = re;
    return MOEX_OK;
}

/* A pattern object {"String": s} or {"Regex": r}: the string, or (regex) NULL and *re. */
static moex_status pattern(const loader *ld, const cJSON *o, const char *key, int allow_regex, char **lit, pcre2_code **re) {
    char k[256];
    const cJSON *p = field(o, "pattern");
    const cJSON *s = field(p, "String"), *r = field(p, "Regex");
    snprintf(k, sizeof k, "%s.pattern", key);
    if (cJSON_IsString(s)) {
        if (!(*lit = dup(s->valuestring))) return MOEX_ERR_OUT_OF_MEMORY;
        return MOEX_OK;
    }
    if (!cJSON_IsString(r)) return bad(ld, k, "must be {\"String\": ...} or {\"Regex\": ...}");
    snprintf(k, sizeof k, "%s.pattern.Regex", key);
    if (!allow_regex) return unsupported(ld, k, "(a regex pattern here)");
    return compile(ld, r->valuestring, k, re);
}

/* ---- the steps ------------------------------------------------------------------ */

typedef moex_status (*step_loader)(loader *ld, const cJSON *o, const char *key);


/* A Replace step's string pattern (into *a; an empty one is malformed) and content (*b). */
static moex_status load_replace(const loader *ld, const cJSON *o, const char *key, char **a, char **b) {
    const char *c = NULL;
    pcre2_code *re = NULL;
    char k[256];
    snprintf(k, sizeof k, "%s.content", key);
    moex_status st = get_string(ld, o, "content", k, &c);
    if (!st) st = pattern(ld, o, key, 0, a, &re);
    if (st) return st;
    if (!(*a)[0]) {
        snprintf(k, sizeof k, "%s.pattern.String", key);
        return bad(ld, k, "an empty pattern");
    }
    return (*b = dup(c)) ? MOEX_OK : MOEX_ERR_OUT_OF_MEMORY;
}

/* A Sequence step: fn on every element of o[list] (key.list[i]). */
static moex_status each(loader *ld, const cJSON *o, const char *key, const char *list, step_loader fn);

/* What every step loader does first: nothing for null (*done), o's "type" (key.type) into *type,
 * and a Sequence (of list) through fn (*done). */
static moex_status step_begin(loader *ld, const cJSON *o, const char *key, const char *list, step_loader fn,
                              const char **type, int *done) {
    char k[256];
    *done = is_null(o);
    if (*done) return MOEX_OK;
    snprintf(k, sizeof k, "%s.type", key);
    moex_status st = get_string(ld, o, "type", k, type);
    if (st || strcmp(*type, "Sequence")) return st;
    *done = 1;
    return each(ld, o, key, list, fn);
}

static moex_status each(loader *ld, const cJSON *o, const char *key, const char *list, step_loader fn) {
    char k[256];
    const cJSON *l = field(o, list);
    snprintf(k, sizeof k, "%s.%s", key, list);
    if (!cJSON_IsArray(l)) return bad(ld, k, "missing, or not an array");
    int i = 0;
    for (const cJSON *e = l->child; e; e = e->next, i++) {
        snprintf(k, sizeof k, "%s.%s[%d]", key, list, i);
        moex_status st = fn(ld, e, k);
        if (st) return st;
    }
    return MOEX_OK;
}

static moex_status load_normalizer(loader *ld, const cJSON *o, const char *key) {
    moex_tokenizer *t = ld->t;
    const char *type = NULL;
    char k[256];
    int done;
    moex_status st = step_begin(ld, o, key, "normalizers", load_normalizer, &type, &done);
    if (st || done) return st;
    snprintf(k, sizeof k, "%s.type", key);
    if (t->n_norm == TK_MAX_STEPS) return bad(ld, key, "more normalizers than moex takes (16)");
    tk_norm *n = &t->norm[t->n_norm];
    memset(n, 0, sizeof *n);
    if (!strcmp(type, "NFC")) {
        n->kind = TK_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *s = NULL;
        snprintf(k, sizeof k, "%s.prepend", key);
        if ((st = get_string(ld, o, "prepend", k, &s))) return st;
        n->kind = TK_PREPEND;
        if (!(n->a = dup(s))) return MOEX_ERR_OUT_OF_MEMORY;
    } else if (!strcmp(type, "Replace")) {
        n->kind = TK_REPLACE;
        if ((st = load_replace(ld, o, key, &n->a, &n->b))) return st;
    } else {
        snprintf(k, sizeof k, "%s.type", key);
        return unsupported(ld, k, type);
    }
    t->n_norm++;
    return MOEX_OK;
}

/* Metaspace's prepend_scheme (or the older add_prefix_space): 0 never, 1 first, 2 always. */
static moex_status prepend_scheme(const loader *ld, const cJSON *o, const char *key, int *out) {
    const cJSON *s = field(o, "prepend_scheme");
    if (cJSON_IsString(s)) {
        if (!strcmp(s->valuestring, "always")) *out = 2;
        else if (!strcmp(s->valuestring, "first")) *out = 1;
        else if (!strcmp(s->valuestring, "never")) *out = 0;
        else {
            char k[256];
            snprintf(k, sizeof k, "%s.prepend_scheme", key);
            return unsupported(ld, k, s->valuestring);
        }
        return MOEX_OK;
    }
    *out = get_bool(o, "add_prefix_space", 1) ? 2 : 0;
    return MOEX_OK;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static moex_status load_pre(loader *ld, const cJSON *o, const char *key) {
    moex_tokenizer *t = ld->t;
    const char *type = NULL;
    char k[256];
    int done;
    moex_status st = step_begin(ld, o, key, "pretokenizers", load_pre, &type, &done);
    if (st || done) return st;
    snprintf(k, sizeof k, "%s.type", key);
    if (t->n_pre == TK_MAX_STEPS) return bad(ld, key, "more pre-tokenizers than moex takes (16)");
    tk_pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    if (!strcmp(type, "ByteLevel")) {
        p->kind = TK_BYTELEVEL;
        p->add_prefix_space = get_bool(o, "add_prefix_space", 1);
        p->use_regex = get_bool(o, "use_regex", 1);
        snprintf(k, sizeof k, "%s (the GPT-2 pattern of use_regex)", key);
        if (p->use_regex && (st = compile(ld, GPT2_PATTERN, k, &p->re))) return st;
        t->byte_level = 1;
    } else if (!strcmp(type, "Split")) {
        const char *beh = NULL;
        snprintf(k, sizeof k, "%s.behavior", key);
        if ((st = get_string(ld, o, "behavior", k, &beh))) return st;
        if (!strcmp(beh, "Isolated")) p->behavior = TK_ISOLATED;
        else if (!strcmp(beh, "Removed")) p->behavior = TK_REMOVED;
        else if (!strcmp(beh, "MergedWithPrevious")) p->behavior = TK_MERGED_WITH_PREVIOUS;
        else if (!strcmp(beh, "MergedWithNext")) p->behavior = TK_MERGED_WITH_NEXT;
        else if (!strcmp(beh, "Contiguous")) p->behavior = TK_CONTIGUOUS;
        else return unsupported(ld, k, beh);
        p->invert = get_bool(o, "invert", 0);
        p->kind = TK_SPLIT;
        if ((st = pattern(ld, o, key, 1, &p->literal, &p->re))) return st;
        if (p->literal && !p->literal[0]) {
            snprintf(k, sizeof k, "%s.pattern.String", key);
            return bad(ld, k, "an empty pattern");
        }
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = NULL;
        snprintf(k, sizeof k, "%s.replacement", key);
        if ((st = get_string(ld, o, "replacement", k, &r)) || (st = one_char(ld, r, k, p->replacement))) return st;
        if ((st = prepend_scheme(ld, o, key, &p->prepend))) return st;
        p->kind = TK_METASPACE;
        p->split = get_bool(o, "split", 1);
    } else {
        return unsupported(ld, k, type);
    }
    t->n_pre++;
    return MOEX_OK;
}

static moex_status load_decoder(loader *ld, const cJSON *o, const char *key) {
    moex_tokenizer *t = ld->t;
    const char *type = NULL;
    char k[256];
    int done;
    moex_status st = step_begin(ld, o, key, "decoders", load_decoder, &type, &done);
    if (st || done) return st;
    snprintf(k, sizeof k, "%s.type", key);
    if (t->n_dec == TK_MAX_STEPS) return bad(ld, key, "more decoders than moex takes (16)");
    tk_dec *d = &t->dec[t->n_dec];
    memset(d, 0, sizeof *d);
    if (!strcmp(type, "ByteLevel")) {
        d->kind = TK_D_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d->kind = TK_D_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->kind = TK_D_FUSE;
    } else if (!strcmp(type, "Strip")) {
        const char *c = NULL;
        snprintf(k, sizeof k, "%s.content", key);
        if ((st = get_string(ld, o, "content", k, &c)) || (st = one_char(ld, c, k, d->content))) return st;
        const cJSON *a = field(o, "start"), *b = field(o, "stop");
        snprintf(k, sizeof k, "%s.start / .stop", key);
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0 ||
            a->valuedouble > 1e6 || b->valuedouble > 1e6)
            return bad(ld, k, "must be counts (0 to 10^6)");
        d->kind = TK_D_STRIP;
        d->start = (int)a->valuedouble, d->stop = (int)b->valuedouble;
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = NULL;
        snprintf(k, sizeof k, "%s.replacement", key);
        if ((st = get_string(ld, o, "replacement", k, &r)) || (st = one_char(ld, r, k, d->content))) return st;
        if ((st = prepend_scheme(ld, o, key, &d->prepend))) return st;
        d->kind = TK_D_METASPACE;
    } else if (!strcmp(type, "Replace")) {
        d->kind = TK_D_REPLACE;
        if ((st = load_replace(ld, o, key, &d->a, &d->b))) return st;
    } else {
        return unsupported(ld, k, type);
    }
    t->n_dec++;
    return MOEX_OK;
}

/* TemplateProcessing's single template: [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]
 * with the special tokens' ids in "special_tokens". */
static moex_status load_post(loader *ld, const cJSON *o, const char *key) {
    moex_tokenizer *t = ld->t;
    const char *type = NULL;
    char k[256];
    int done;
    moex_status st = step_begin(ld, o, key, "processors", load_post, &type, &done);
    if (st || done) return st;
    if (!strcmp(type, "ByteLevel")) return MOEX_OK; /* offsets only: the ids are unchanged */
    snprintf(k, sizeof k, "%s.type", key);
    if (strcmp(type, "TemplateProcessing")) return unsupported(ld, k, type);
    if (t->n_tmpl) return unsupported(ld, key, "(a second TemplateProcessing)");
    const cJSON *single = field(o, "single"), *specials = field(o, "special_tokens");
    snprintf(k, sizeof k, "%s.single", key);
    if (!cJSON_IsArray(single)) return bad(ld, k, "missing, or not an array");
    int i = 0, seq = 0;
    for (const cJSON *e = single->child; e; e = e->next, i++) {
        snprintf(k, sizeof k, "%s.single[%d]", key, i);
        const cJSON *sp = field(e, "SpecialToken"), *sq = field(e, "Sequence");
        if (sq) {
            if (t->n_tmpl == 32) return bad(ld, k, "a template longer than moex takes (32)");
            t->tmpl[t->n_tmpl++] = -2, seq++;
            continue;
        }
        const cJSON *name = field(sp, "id");
        if (!cJSON_IsString(name)) return bad(ld, k, "must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
        const cJSON *ids = field(field(specials, name->valuestring), "ids");
        snprintf(k, sizeof k, "%s.special_tokens[\"%s\"].ids", key, name->valuestring);
        if (!cJSON_IsArray(ids)) return bad(ld, k, "missing, or not an array");
        for (const cJSON *v = ids->child; v; v = v->next) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)t->n_tok ||
                v->valuedouble != (double)(int32_t)v->valuedouble)
                return bad(ld, k, "an id outside the vocabulary");
            if (!t->tok[(int32_t)v->valuedouble]) { /* a gap in a sparse vocabulary: no token to emit */
                char what[96];
                snprintf(what, sizeof what, "id %d, which no token of the vocabulary has", (int)v->valuedouble);
                return bad(ld, k, what);
            }
            if (t->n_tmpl == 32) return bad(ld, k, "a template longer than moex takes (32)");
            t->tmpl[t->n_tmpl++] = (int32_t)v->valuedouble;
        }
    }
    if (seq != 1) {
        snprintf(k, sizeof k, "%s.single", key);
        return bad(ld, k, "must hold the sequence exactly once");
    }
    return MOEX_OK;
}

/* ---- the model -------------------------------------------------------------------- */

static moex_status add_token(loader *ld, int64_t id, const char *s, const char *key) {
    moex_tokenizer *t = ld->t;
    if (id < 0 || id >= t->n_tok) return bad(ld, key, "an id outside 0 .. 2^30");
    if (t->tok[id]) {
        if (!strcmp(t->tok[id], s)) return MOEX_OK; /* an added token that is also in the vocabulary */
        char what[160];
        snprintf(what, sizeof what, "id %lld is given to two different tokens", (long long)id);
        return bad(ld, key, what);
    }
    if (tk_lookup(t, s, strlen(s)) >= 0) {
        char what[160];
        snprintf(what, sizeof what, "the token of id %lld has another id already", (long long)id);
        return bad(ld, key, what);
    }
    if (!(t->tok[id] = dup(s))) return MOEX_ERR_OUT_OF_MEMORY;
    t->tok_len[id] = (uint32_t)strlen(s);
    map_insert(t, (int32_t)id);
    return MOEX_OK;
}

static moex_status merge_insert(loader *ld, const char *a, size_t na, const char *b, size_t nb, int32_t rank,
                                const char *key) {
    moex_tokenizer *t = ld->t;
    const int32_t l = tk_lookup(t, a, na), r = tk_lookup(t, b, nb);
    char *joined = malloc(na + nb + 1);
    if (!joined) return MOEX_ERR_OUT_OF_MEMORY;
    memcpy(joined, a, na), memcpy(joined + na, b, nb);
    const int32_t id = tk_lookup(t, joined, na + nb);
    free(joined);
    if (l < 0 || r < 0 || id < 0) return bad(ld, key, "a merge of tokens (or into a token) not in model.vocab");
    const uint64_t k = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t i = (uint32_t)tk_hash(&k, 8) & t->merge_mask;
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == k) return MOEX_OK; /* a repeated merge keeps its first rank */
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i].key = k, t->merges[i].rank = rank, t->merges[i].id = id;
    return MOEX_OK;
}

static uint32_t pow2_above(uint64_t n) {
    uint32_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

static moex_status load_model(loader *ld, const cJSON *root) {
    moex_tokenizer *t = ld->t;
    const cJSON *m = field(root, "model");
    const char *type = NULL;
    moex_status st = get_string(ld, m, "type", "model.type", &type);
    if (st) return st;
    if (strcmp(type, "BPE")) return unsupported(ld, "model.type", type);
    if (!is_null(field(m, "dropout")) && !(cJSON_IsNumber(field(m, "dropout")) && field(m, "dropout")->valuedouble == 0))
        return unsupported(ld, "model.dropout", "(a dropout)");
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = field(m, affix[i]);
        if (!is_null(v) && !(cJSON_IsString(v) && !v->valuestring[0])) {
            char k[64];
            snprintf(k, sizeof k, "model.%s", affix[i]);
            return unsupported(ld, k, cJSON_IsString(v) ? v->valuestring : "(not a string)");
        }
    }
    t->byte_fallback = get_bool(m, "byte_fallback", 0);
    t->ignore_merges = get_bool(m, "ignore_merges", 0);
    t->fuse_unk = get_bool(m, "fuse_unk", 0);
    const cJSON *vocab = field(m, "vocab"), *merges = field(m, "merges"), *added = field(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return bad(ld, "model.vocab", "missing, or not an object");
    if (!cJSON_IsArray(merges)) return bad(ld, "model.merges", "missing, or not an array");
    if (!is_null(added) && !cJSON_IsArray(added)) return bad(ld, "added_tokens", "not an array");
    /* the ids: the largest sizes the tables */
    int64_t max_id = -1, count = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, count++) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)TK_MAX_ID ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return bad(ld, "model.vocab", "an id that is not an integer in 0 .. 2^30");
        if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, count++) {
        const cJSON *id = field(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (double)TK_MAX_ID ||
            id->valuedouble != (double)(int64_t)id->valuedouble)
            return bad(ld, "added_tokens[].id", "missing, or not an integer in 0 .. 2^30");
        if ((int64_t)id->valuedouble > max_id) max_id = (int64_t)id->valuedouble;
    }
    if (max_id < 0) return bad(ld, "model.vocab", "empty");
    if (max_id >= count + ((int64_t)1 << 20)) { /* the tables are indexed by id: a sparse one would be huge */
        char what[160];
        snprintf(what, sizeof what, "id %lld for %lld tokens: more than 2^20 ids unused", (long long)max_id,
                 (long long)count);
        return bad(ld, "model.vocab / added_tokens", what);
    }
    t->n_tok = max_id + 1;
    t->tok = calloc((size_t)t->n_tok, sizeof *t->tok);
    t->tok_len = calloc((size_t)t->n_tok, sizeof *t->tok_len);
    t->special = calloc((size_t)t->n_tok, 1);
    const uint32_t cap = pow2_above((uint64_t)count);
    t->map.slot = malloc((size_t)cap * sizeof *t->map.slot);
    if (!t->tok || !t->tok_len || !t->special || !t->map.slot) return MOEX_ERR_OUT_OF_MEMORY;
    memset(t->map.slot, 0xFF, (size_t)cap * sizeof *t->map.slot);
    t->map.mask = cap - 1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        char key[96];
        snprintf(key, sizeof key, "model.vocab (id %lld)", (long long)e->valuedouble);
        if ((st = add_token(ld, (int64_t)e->valuedouble, e->string, key))) return st;
    }
    /* added tokens: their ids, contents and flags */
    int n_added = cJSON_GetArraySize(added);
    if (n_added > 0 && !(t->added = calloc((size_t)n_added, sizeof *t->added))) return MOEX_ERR_OUT_OF_MEMORY;
    int i = 0;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, i++) {
        char k[96];
        const char *content = NULL;
        snprintf(k, sizeof k, "added_tokens[%d].content", i);
        if ((st = get_string(ld, e, "content", k, &content))) return st;
        if (!content[0]) return bad(ld, k, "empty");
        if (get_bool(e, "single_word", 0)) {
            snprintf(k, sizeof k, "added_tokens[%d].single_word", i);
            return unsupported(ld, k, "true");
        }
        snprintf(k, sizeof k, "added_tokens[%d]", i);
        const int64_t id = (int64_t)field(e, "id")->valuedouble;
        if ((st = add_token(ld, id, content, k))) return st;
        tk_added *a = &t->added[t->n_added++];
        a->id = (int32_t)id, a->content = t->tok[id], a->len = strlen(content);
        a->special = get_bool(e, "special", 0), a->lstrip = get_bool(e, "lstrip", 0), a->rstrip = get_bool(e, "rstrip", 0);
        t->special[id] = (uint8_t)a->special;
        t->added_first[(uint8_t)content[0]] = 1;
    }
    /* merges */
    const int n_merges = cJSON_GetArraySize(merges);
    const uint32_t mcap = pow2_above((uint64_t)n_merges);
    if (!(t->merges = malloc((size_t)mcap * sizeof *t->merges))) return MOEX_ERR_OUT_OF_MEMORY;
    for (uint32_t j = 0; j < mcap; j++) t->merges[j].key = UINT64_MAX;
    t->merge_mask = mcap - 1;
    i = 0;
    for (const cJSON *e = merges->child; e; e = e->next, i++) {
        char k[64];
        snprintf(k, sizeof k, "model.merges[%d]", i);
        if (cJSON_IsString(e)) { /* "a b" */
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) return bad(ld, k, "must be two tokens split by one space");
            if ((st = merge_insert(ld, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), i, k))) return st;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) { /* ["a", "b"] */
            const char *a = e->child->valuestring, *b = e->child->next->valuestring;
            if ((st = merge_insert(ld, a, strlen(a), b, strlen(b), i, k))) return st;
        } else {
            return bad(ld, k, "must be \"a b\" or [\"a\", \"b\"]");
        }
    }
    /* unk_token and the byte-fallback tokens */
    t->unk_id = -1;
    const cJSON *unk = field(m, "unk_token");
    if (cJSON_IsString(unk)) {
        t->unk_id = tk_lookup(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0) return bad(ld, "model.unk_token", "not in model.vocab");
    } else if (!is_null(unk)) {
        return bad(ld, "model.unk_token", "not a string");
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_tok[b] = t->byte_fallback ? tk_lookup(t, name, 6) : -1;
    }
    return MOEX_OK;
}

/* ---- load and free ------------------------------------------------------------------ */

void moex_tokenizer_free(moex_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; t->tok && i < t->n_tok; i++) free(t->tok[i]);
    free(t->tok), free(t->tok_len), free(t->special), free(t->map.slot), free(t->merges), free(t->added);
    /* every slot, not only the n_* counted ones: a step that failed half-way (a pattern read, then
     * refused) holds what it allocated in the next slot, which the tokenizer's calloc zeroed */
    for (int i = 0; i < TK_MAX_STEPS; i++) {
        free(t->norm[i].a), free(t->norm[i].b);
        pcre2_code_free(t->pre[i].re);
        free(t->pre[i].literal);
        free(t->dec[i].a), free(t->dec[i].b);
    }
    free(t);
}

moex_status moex_tokenizer_load(const char *path, moex_tokenizer **out) {
    if (!path || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_load: %s is NULL", path ? "out" : "path");
    *out = NULL;
    char file[600];
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moex_fail(MOEX_ERR_IO, "%s: no such file or directory (a tokenizer.json, or a directory holding one)",
                         path);
    if (S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    char *text;
    size_t len;
    int missing;
    moex_status st = moex_read_file(file, TK_FILE_LIMIT, &text, &len, &missing);
    if (st) return st;
    const char *end;
    int oom;
    cJSON *root = moex_json_parse(text, len, &end, &oom);
    if (!root) {
        st = oom ? moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory parsing it", file)
                 : moex_fail(MOEX_ERR_FORMAT, "%s: not valid JSON (at byte %zu)", file, (size_t)(end - text));
        free(text);
        return st;
    }
    moex_tokenizer *t = calloc(1, sizeof *t);
    loader ld = {t, file};
    if (!t) st = MOEX_ERR_OUT_OF_MEMORY;
    else if (!cJSON_IsObject(root)) st = bad(&ld, "(the top level)", "not an object");
    if (!st) {
        snprintf(t->path, sizeof t->path, "%s", file);
        byte_tables(t);
        st = load_model(&ld, root);
    }
    if (!st) st = load_normalizer(&ld, field(root, "normalizer"), "normalizer");
    if (!st) st = load_pre(&ld, field(root, "pre_tokenizer"), "pre_tokenizer");
    if (!st) st = load_decoder(&ld, field(root, "decoder"), "decoder");
    for (int i = 0, fused = 0; !st && i < t->n_dec; i++) { /* the stream's one effect on a text's end */
        t->stream_whole |= fused && t->dec[i].kind == TK_D_STRIP && t->dec[i].stop > 0;
        fused |= t->dec[i].kind == TK_D_FUSE;
    }
    if (!st) st = load_post(&ld, field(root, "post_processor"), "post_processor");
    cJSON_Delete(root);
    free(text);
    /* the JSON tree of a large vocabulary leaves hundreds of thousands of small free chunks:
     * consolidate them here, not in the first encode's first allocation (25 ms for 150k tokens) */
    malloc_trim(0);
    if (st == MOEX_ERR_OUT_OF_MEMORY) st = moex_fail(st, "%s: out of memory loading it", file);
    if (st) {
        moex_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MOEX_OK;
}

int64_t moex_tokenizer_vocab_size(const moex_tokenizer *t) { return t ? t->n_tok : 0; }

const char *moex_tokenizer_token(const moex_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_tok ? t->tok[id] : NULL;
}

int moex_tokenizer_is_special(const moex_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_tok && t->special[id];
}

void moex_tokenizer_buffer_free(void *p) { free(p); }
