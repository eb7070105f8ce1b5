/* tokenizer_encode.c — text to ids (moex_tokenizer_encode): added tokens matched first, then
 * per segment of the text between them the normalizers, the pre-tokenizers (pieces as spans
 * of one buffer per step) and BPE on every piece (merges by rank, leftmost first, with a
 * per-call cache of the pieces seen), then the post-processor's template. */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct span {
    size_t off, len;
} span;

typedef struct pieces {
    tk_buf text;
    span *s;
    size_t n, cap;
} pieces;

static int piece_add(pieces *p, size_t off, size_t len) {
    if (!len) return 1;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        span *s = realloc(p->s, cap * sizeof *s);
        if (!s) return 0;
        p->s = s, p->cap = cap;
    }
    p->s[p->n].off = off, p->s[p->n].len = len;
    p->n++;
    return 1;
}

static void pieces_free(pieces *p) {
    free(p->text.p);
    free(p->s);
    memset(p, 0, sizeof *p);
}

/* A per-call cache of BPE results: piece -> its ids (direct-mapped, the strings kept), of
 * 64 to CACHE_SLOTS slots by the text's length. */
enum { CACHE_SLOTS = 1 << 14 };
typedef struct cache_slot {
    uint64_t hash;
    size_t key_off, key_len, ids_off, n_ids; /* key in cache.keys, ids in cache.ids */
    int used;
} cache_slot;
typedef struct bpe_cache {
    cache_slot *slot;
    uint64_t mask;
    tk_buf keys;
    tk_ids ids;
} bpe_cache;

typedef struct enc {
    const moex_tokenizer *t;
    tk_ids *out;
    bpe_cache cache;
    pcre2_match_data *md;
    int first_piece; /* Metaspace "first": the input's first piece not yet seen */
    /* BPE scratch */
    int32_t *sym, *rank, *nxt, *prv;
    uint64_t *heap; /* 3 entries a symbol: the initial pairs and two a merge */
    size_t sym_cap;
} enc;

#define OOM() moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_tokenizer_encode: out of memory")

/* ---- normalizers -------------------------------------------------------------------- */

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return 0;
    return 1;
}

/* Replace every occurrence of a in s[0..n) by b, into out. */
static int replace_all(const char *s, size_t n, const char *a, const char *b, tk_buf *out) {
    const size_t na = strlen(a), nb = strlen(b);
    out->n = 0;
    if (!tk_buf_put(out, "", 0)) return 0;
    for (size_t i = 0; i < n;) {
        if (na && i + na <= n && memcmp(s + i, a, na) == 0) {
            if (!tk_buf_put(out, b, nb)) return 0;
            i += na;
        } else {
            if (!tk_buf_putc(out, s[i])) return 0;
            i++;
        }
    }
    return 1;
}

/* The normalized segment into out. */
static moex_status normalize(const moex_tokenizer *t, const char *s, size_t n, tk_buf *out) {
    tk_buf tmp = {0};
    out->n = 0;
    if (!tk_buf_put(out, s, n)) return OOM();
    for (int i = 0; i < t->n_norm; i++) {
        const tk_norm *m = &t->norm[i];
        if (m->kind == TK_NFC) {
            if (is_ascii(out->p, out->n)) continue; /* ASCII is its own NFC */
            utf8proc_uint8_t *res = NULL;
            const utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)out->p, (utf8proc_ssize_t)out->n, &res,
                                                    UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r == UTF8PROC_ERROR_NOMEM) {
                free(tmp.p);
                return OOM();
            }
            if (r >= 0) { /* invalid UTF-8 stays as it is */
                out->n = 0;
                const int ok = tk_buf_put(out, res, (size_t)r);
                free(res);
                if (!ok) return free(tmp.p), OOM();
            }
        } else if (m->kind == TK_PREPEND) {
            if (!out->n) continue;
            tmp.n = 0;
            if (!tk_buf_put(&tmp, m->a, strlen(m->a)) || !tk_buf_put(&tmp, out->p, out->n)) return free(tmp.p), OOM();
            tk_buf sw = *out;
            *out = tmp, tmp = sw;
        } else {
            if (!replace_all(out->p, out->n, m->a, m->b, &tmp)) return free(tmp.p), OOM();
            tk_buf sw = *out;
            *out = tmp, tmp = sw;
        }
    }
    free(tmp.p);
    return MOEX_OK;
}

/* ---- pre-tokenizers ------------------------------------------------------------------ */

/* The parts of one piece in order, each a match of the pattern (a delimiter; with invert, the
 * parts between matches are) or not. */
typedef struct part {
    size_t off, len;
    int delim;
} part;

typedef struct parts {
    part *p;
    size_t n, cap;
} parts;

/* keep_empty: an empty match stays a part (it separates runs for Contiguous, as in tokenizers) */
static int part_add(parts *v, size_t off, size_t len, int delim, int keep_empty) {
    if (!len && !keep_empty) return 1;
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 32;
        part *p = realloc(v->p, cap * sizeof *p);
        if (!p) return 0;
        v->p = p, v->cap = cap;
    }
    v->p[v->n].off = off, v->p[v->n].len = len, v->p[v->n].delim = delim;
    v->n++;
    return 1;
}

/* The pieces of one piece's parts, as tokenizers' SplitDelimiterBehavior says: Removed drops the
 * delimiters, Isolated keeps them as pieces, MergedWithPrevious appends each to the piece before
 * it (a delimiter after a delimiter stands alone), MergedWithNext prepends each to the piece after
 * it (likewise), Contiguous makes one piece of each run of parts alike (delimiters or not). */
static int emit_parts(const parts *v, tk_split_behavior b, pieces *out) {
    for (size_t i = 0; i < v->n; i++) {
        const part *q = &v->p[i];
        size_t off = q->off, len = q->len;
        if (b == TK_REMOVED && q->delim) continue;
        if (b == TK_MERGED_WITH_PREVIOUS && !q->delim && i + 1 < v->n && v->p[i + 1].delim)
            len += v->p[++i].len; /* this piece and the delimiter after it */
        else if (b == TK_MERGED_WITH_NEXT && q->delim && i + 1 < v->n && !v->p[i + 1].delim)
            len += v->p[++i].len; /* the delimiter and the piece after it */
        else if (b == TK_CONTIGUOUS) /* a run of parts alike (delimiters, or not) */
            while (i + 1 < v->n && v->p[i + 1].delim == q->delim) len += v->p[++i].len;
        if (!piece_add(out, off, len)) return 0;
    }
    return 1;
}

/* Split every piece of in at the regex's (or literal's) matches into out, by p->behavior. */
static moex_status split_step(enc *E, const tk_pre *p, const pieces *in, pieces *out) {
    out->n = 0;
    out->text.n = 0;
    if (!tk_buf_put(&out->text, in->text.p, in->text.n)) return OOM();
    const char *base = out->text.p;
    parts v = {0};
    moex_status st = MOEX_OK;
    for (size_t k = 0; !st && k < in->n; k++) {
        const size_t off = in->s[k].off, len = in->s[k].len;
        size_t at = 0, from = 0; /* the end of the last match, and where the next search starts */
        v.n = 0;
        while (from <= len) {
            size_t m0, m1;
            if (p->re) {
                const int rc = pcre2_match(p->re, (PCRE2_SPTR)(base + off), len, from, 0, E->md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[120];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_encode: the pre-tokenizer's regex failed "
                                   "on the text: %s", (const char *)msg);
                    break;
                }
                const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md);
                m0 = ov[0], m1 = ov[1];
            } else {
                const size_t nl = strlen(p->literal);
                const char *hit = from + nl <= len ? memmem(base + off + from, len - from, p->literal, nl) : NULL;
                if (!hit) break;
                m0 = (size_t)(hit - (base + off)), m1 = m0 + nl;
            }
            if (!part_add(&v, off + at, m0 - at, p->invert, 0) || !part_add(&v, off + m0, m1 - m0, !p->invert, 1)) {
                st = OOM();
                break;
            }
            at = from = m1;
            if (m1 == m0) { /* an empty match: the next search starts a character on (it stays in the gap) */
                if (m1 >= len) break;
                int cl;
                tk_utf8_decode((const uint8_t *)base + off + m1, len - m1, &cl);
                from = m1 + (size_t)cl;
            }
        }
        if (!st && at < len && !part_add(&v, off + at, len - at, p->invert, 0)) st = OOM();
        if (!st && !emit_parts(&v, p->behavior, out)) st = OOM();
    }
    free(v.p);
    return st;
}

/* Map every byte of every piece to GPT-2's byte alphabet (a space first with add_prefix_space). */
static moex_status bytelevel_map(const moex_tokenizer *t, const tk_pre *p, const pieces *in, pieces *out) {
    out->n = 0;
    out->text.n = 0;
    if (!tk_buf_put(&out->text, "", 0)) return OOM();
    for (size_t k = 0; k < in->n; k++) {
        const size_t start = out->text.n;
        const uint8_t *s = (const uint8_t *)in->text.p + in->s[k].off;
        if (p->add_prefix_space && s[0] != ' ' && !tk_buf_put(&out->text, t->byte_utf8[' '], t->byte_len[' ']))
            return OOM();
        for (size_t i = 0; i < in->s[k].len; i++)
            if (!tk_buf_put(&out->text, t->byte_utf8[s[i]], t->byte_len[s[i]])) return OOM();
        if (!piece_add(out, start, out->text.n - start)) return OOM();
    }
    return MOEX_OK;
}

/* Spaces become the replacement; a replacement first (always, or first: for the input's first
 * piece); split: each piece starts at a replacement. */
static moex_status metaspace_step(enc *E, const tk_pre *p, const pieces *in, pieces *out) {
    const size_t rl = strlen(p->replacement);
    out->n = 0;
    out->text.n = 0;
    if (!tk_buf_put(&out->text, "", 0)) return OOM();
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->text.p + in->s[k].off;
        const size_t len = in->s[k].len, start = out->text.n;
        const int prepend = p->prepend == 2 || (p->prepend == 1 && E->first_piece);
        E->first_piece = 0;
        /* after the spaces are replaced: a piece starting with a space needs no replacement first */
        if (prepend && len && s[0] != ' ' && !(len >= rl && memcmp(s, p->replacement, rl) == 0) &&
            !tk_buf_put(&out->text, p->replacement, rl))
            return OOM();
        for (size_t i = 0; i < len; i++)
            if (!(s[i] == ' ' ? tk_buf_put(&out->text, p->replacement, rl) : tk_buf_putc(&out->text, s[i]))) return OOM();
        if (!p->split) {
            if (!piece_add(out, start, out->text.n - start)) return OOM();
            continue;
        }
        size_t from = start;
        for (size_t i = start + 1; i + rl <= out->text.n; i++)
            if (memcmp(out->text.p + i, p->replacement, rl) == 0) {
                if (!piece_add(out, from, i - from)) return OOM();
                from = i;
            }
        if (!piece_add(out, from, out->text.n - from)) return OOM();
    }
    return MOEX_OK;
}

static moex_status pre_tokenize(enc *E, pieces *a, pieces *b) {
    const moex_tokenizer *t = E->t;
    for (int i = 0; i < t->n_pre; i++) {
        const tk_pre *p = &t->pre[i];
        moex_status st;
        if (p->kind == TK_SPLIT) {
            st = split_step(E, p, a, b);
        } else if (p->kind == TK_METASPACE) {
            st = metaspace_step(E, p, a, b);
        } else { /* ByteLevel: the GPT-2 split first when use_regex */
            if (p->use_regex) {
                const tk_pre iso = {.kind = TK_SPLIT, .re = p->re, .behavior = TK_ISOLATED};
                if ((st = split_step(E, &iso, a, b))) return st;
                pieces sw = *a;
                *a = *b, *b = sw;
            }
            st = bytelevel_map(t, p, a, b);
        }
        if (st) return st;
        pieces sw = *a;
        *a = *b, *b = sw;
    }
    return MOEX_OK;
}

/* ---- BPE -------------------------------------------------------------------------------- */

static int merge_of(const moex_tokenizer *t, int32_t l, int32_t r, int32_t *id) {
    const uint64_t k = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t i = (uint32_t)tk_hash(&k, 8) & t->merge_mask;
    for (;;) {
        const tk_merge *m = &t->merges[i];
        if (m->key == UINT64_MAX) return INT32_MAX;
        if (m->key == k) {
            *id = m->id;
            return m->rank;
        }
        i = (i + 1) & t->merge_mask;
    }
}

static int scratch(enc *E, size_t n) {
    if (n <= E->sym_cap) return 1;
    size_t cap = E->sym_cap ? E->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(E->sym, cap * 4), *b = a ? realloc(E->rank, cap * 4) : NULL;
    if (a) E->sym = a;
    if (b) E->rank = b;
    int32_t *c = b ? realloc(E->nxt, cap * 4) : NULL;
    if (c) E->nxt = c;
    int32_t *d = c ? realloc(E->prv, cap * 4) : NULL;
    if (d) E->prv = d;
    uint64_t *h = d ? realloc(E->heap, 3 * cap * sizeof *h) : NULL;
    if (h) E->heap = h;
    if (!h) return 0;
    E->sym_cap = cap;
    return 1;
}

/* The initial symbols of piece s: one per character (unknown characters as bytes with
 * byte_fallback, else unk_token). */
static moex_status symbols(enc *E, const char *s, size_t n, size_t *count) {
    const moex_tokenizer *t = E->t;
    size_t m = 0;
    if (!scratch(E, n + 1)) return OOM();
    for (size_t i = 0; i < n;) {
        int cl;
        tk_utf8_decode((const uint8_t *)s + i, n - i, &cl);
        int32_t id = tk_lookup(t, s + i, (size_t)cl);
        if (id >= 0) {
            E->sym[m++] = id;
        } else if (t->byte_fallback && t->byte_tok[(uint8_t)s[i]] >= 0) {
            for (int j = 0; j < cl; j++) {
                const int32_t b = t->byte_tok[(uint8_t)s[i + j]];
                E->sym[m++] = b >= 0 ? b : t->unk_id;
            }
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && m && E->sym[m - 1] == t->unk_id)) E->sym[m++] = t->unk_id;
        } else {
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_encode: the text has a character (at byte %zu of "
                             "a piece) that is not in %s's vocabulary, and the model has no unk_token", i, t->path);
        }
        i += (size_t)cl;
    }
    for (size_t i = 0; i < m; i++) {
        if (E->sym[i] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_encode: a byte with no <0xXX> token and no unk_token");
        E->nxt[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
        E->prv[i] = (int32_t)i - 1;
    }
    *count = m;
    return MOEX_OK;
}

/* The merge of the pair at i into i, and the new ranks of the pairs around it. */
static void merge_at(const moex_tokenizer *t, int32_t *sym, int32_t *rank, int32_t *nxt, int32_t *prv, int32_t at) {
    int32_t tmp;
    const int32_t r = nxt[at];
    merge_of(t, sym[at], sym[r], &sym[at]);
    nxt[at] = nxt[r];
    if (nxt[r] >= 0) prv[nxt[r]] = at;
    rank[r] = INT32_MAX; /* gone */
    rank[at] = nxt[at] >= 0 ? merge_of(t, sym[at], sym[nxt[at]], &tmp) : INT32_MAX;
    if (prv[at] >= 0) rank[prv[at]] = merge_of(t, sym[prv[at]], sym[at], &tmp);
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    const uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = v;
    return top;
}

/* Merge the symbols by rank, the lowest first and among equals the leftmost: a scan for each
 * merge for short pieces; for long ones (a run of letters or spaces can be megabytes) a heap of
 * (rank, position), an entry valid while rank[position] still holds its rank (a rank names one
 * pair, so an equal rank at the same place is the same merge). */
static void merge_all(enc *E, size_t m) {
    const moex_tokenizer *t = E->t;
    int32_t *sym = E->sym, *rank = E->rank, *nxt = E->nxt, *prv = E->prv, tmp;
    if (!m) return;
    for (size_t i = 0; i < m; i++) rank[i] = nxt[i] >= 0 ? merge_of(t, sym[i], sym[nxt[i]], &tmp) : INT32_MAX;
    if (m <= 48 || !E->heap) {
        for (;;) {
            int32_t best = INT32_MAX, at = -1;
            for (int32_t i = 0; i >= 0; i = nxt[i])
                if (rank[i] < best) best = rank[i], at = i;
            if (at < 0) return;
            merge_at(t, sym, rank, nxt, prv, at);
        }
    }
    uint64_t *h = E->heap;
    size_t n = 0;
    for (size_t i = 0; i < m; i++)
        if (rank[i] != INT32_MAX) heap_push(h, &n, ((uint64_t)(uint32_t)rank[i] << 32) | i);
    while (n) {
        const uint64_t top = heap_pop(h, &n);
        const int32_t at = (int32_t)(top & 0xFFFFFFFFu), rk = (int32_t)(top >> 32);
        if (rank[at] != rk) continue; /* stale */
        merge_at(t, sym, rank, nxt, prv, at);
        if (rank[at] != INT32_MAX) heap_push(h, &n, ((uint64_t)(uint32_t)rank[at] << 32) | (uint32_t)at);
        if (prv[at] >= 0 && rank[prv[at]] != INT32_MAX)
            heap_push(h, &n, ((uint64_t)(uint32_t)rank[prv[at]] << 32) | (uint32_t)prv[at]);
    }
}

static moex_status bpe_piece(enc *E, const char *s, size_t n) {
    const moex_tokenizer *t = E->t;
    if (t->ignore_merges) {
        const int32_t id = tk_lookup(t, s, n);
        if (id >= 0) return tk_ids_put(E->out, id) ? MOEX_OK : OOM();
    }
    bpe_cache *c = &E->cache;
    const uint64_t h = tk_hash(s, n);
    cache_slot *slot = &c->slot[h & c->mask];
    if (slot->used && slot->hash == h && slot->key_len == n && memcmp(c->keys.p + slot->key_off, s, n) == 0) {
        for (size_t i = 0; i < slot->n_ids; i++)
            if (!tk_ids_put(E->out, c->ids.p[slot->ids_off + i])) return OOM();
        return MOEX_OK;
    }
    size_t m = 0;
    moex_status st = symbols(E, s, n, &m);
    if (st) return st;
    merge_all(E, m);
    const int64_t first = E->out->n;
    for (int32_t i = m ? 0 : -1; i >= 0; i = E->nxt[i])
        if (!tk_ids_put(E->out, E->sym[i])) return OOM();
    if (n <= 256) { /* remember it */
        slot->used = 1, slot->hash = h, slot->key_off = c->keys.n, slot->key_len = n;
        slot->ids_off = (size_t)c->ids.n, slot->n_ids = (size_t)(E->out->n - first);
        if (!tk_buf_put(&c->keys, s, n)) return OOM();
        for (int64_t i = first; i < E->out->n; i++)
            if (!tk_ids_put(&c->ids, E->out->p[i])) return OOM();
    }
    return MOEX_OK;
}

/* ---- the whole text ---------------------------------------------------------------------- */

static moex_status encode_segment(enc *E, const char *s, size_t n) {
    if (!n) return MOEX_OK;
    pieces a = {0}, b = {0};
    moex_status st = normalize(E->t, s, n, &a.text);
    if (!st && !piece_add(&a, 0, a.text.n)) st = OOM();
    if (!st) st = pre_tokenize(E, &a, &b);
    for (size_t k = 0; !st && k < a.n; k++) st = bpe_piece(E, a.text.p + a.s[k].off, a.s[k].len);
    pieces_free(&a);
    pieces_free(&b);
    return st;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The longest added token at text + i, or NULL. */
static const tk_added *added_at(const moex_tokenizer *t, const char *text, size_t len, size_t i) {
    const tk_added *best = NULL;
    for (int k = 0; k < t->n_added; k++) {
        const tk_added *a = &t->added[k];
        if (a->content[0] == text[i] && a->len <= len - i && (!best || a->len > best->len) &&
            memcmp(text + i, a->content, a->len) == 0)
            best = a;
    }
    return best;
}

static moex_status encode_text(enc *E, const char *text, size_t len) {
    const moex_tokenizer *t = E->t;
    size_t seg = 0, i = 0;
    moex_status st;
    while (i < len) {
        const tk_added *a = t->added_first[(uint8_t)text[i]] ? added_at(t, text, len, i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        size_t end = i;
        if (a->lstrip)
            while (end > seg && is_space(text[end - 1])) end--;
        if ((st = encode_segment(E, text + seg, end - seg))) return st;
        if (!tk_ids_put(E->out, a->id)) return OOM();
        i += a->len;
        if (a->rstrip)
            while (i < len && is_space(text[i])) i++;
        seg = i;
    }
    return encode_segment(E, text + seg, len - seg);
}

moex_status moex_tokenizer_encode(const moex_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, int64_t *n) {
    if (!t || (!text && len) || !ids || !n)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_encode: a NULL argument");
    *ids = NULL, *n = 0;
    tk_ids out = {0}, body = {0};
    enc E;
    memset(&E, 0, sizeof E);
    E.t = t, E.out = &body, E.first_piece = 1;
    size_t slots = 64;
    while (slots < CACHE_SLOTS && slots < len / 8) slots *= 2;
    E.cache.slot = calloc(slots, sizeof *E.cache.slot);
    E.cache.mask = slots - 1;
    E.md = pcre2_match_data_create(8, NULL);
    moex_status st = E.cache.slot && E.md ? encode_text(&E, text ? text : "", len) : OOM();
    if (!st && add_special && t->n_tmpl) { /* the template around the sequence */
        for (int k = 0; !st && k < t->n_tmpl; k++) {
            if (t->tmpl[k] != -2) {
                if (!tk_ids_put(&out, t->tmpl[k])) st = OOM();
                continue;
            }
            for (int64_t j = 0; !st && j < body.n; j++)
                if (!tk_ids_put(&out, body.p[j])) st = OOM();
        }
        free(body.p);
        body = out;
    }
    free(E.cache.slot), free(E.cache.keys.p), free(E.cache.ids.p);
    free(E.sym), free(E.rank), free(E.nxt), free(E.prv), free(E.heap);
    pcre2_match_data_free(E.md);
    if (st) {
        free(body.p);
        return st;
    }
    if (!body.p && !(body.p = malloc(sizeof(int32_t)))) return OOM(); /* an empty text: a valid, empty buffer */
    *ids = body.p, *n = body.n;
    return MOEX_OK;
}
