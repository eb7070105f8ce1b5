/* tokenizer_decode.c — ids to text (moex_tokenizer_decode) and the incremental decoder of
 * streaming (moex_detok_stream_*): the tokens' strings through the decoders, step by step
 * over a list of strings as tokenizers' decoders work, then joined; invalid UTF-8 becomes
 * U+FFFD at the end. */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* The token strings of one step: spans of one buffer. */
typedef struct strs {
    tk_buf b;
    size_t *off, *len;
    size_t n, cap;
} strs;

static int strs_add(strs *s, const char *p, size_t n) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        size_t *o = realloc(s->off, cap * sizeof *o), *l = o ? realloc(s->len, cap * sizeof *l) : NULL;
        if (o) s->off = o;
        if (!l) return 0;
        s->len = l, s->cap = cap;
    }
    s->off[s->n] = s->b.n, s->len[s->n] = n;
    s->n++;
    return tk_buf_put(&s->b, p, n);
}

static void strs_clear(strs *s) { s->n = 0, s->b.n = 0; }
static void strs_free(strs *s) { free(s->b.p), free(s->off), free(s->len); }

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

int tk_utf8_repair(const char *in, size_t n, tk_buf *out) {
    out->n = 0;
    if (!tk_buf_put(out, "", 0)) return 0;
    for (size_t i = 0; i < n;) {
        int l;
        if (tk_utf8_decode((const uint8_t *)in + i, n - i, &l) < 0) {
            if (!tk_buf_put(out, REPLACEMENT, 3)) return 0;
            i++;
            continue;
        }
        if (!tk_buf_put(out, in + i, (size_t)l)) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* <0xXX> -> the byte, else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const char c = s[i];
        v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1000);
    }
    return v >= 0 ? v : -1;
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l;
        if (tk_utf8_decode((const uint8_t *)s + i, n - i, &l) < 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* One decoder step: in -> out. *used: how much of the step's effect on the sequence's first token
 * earlier windows of a stream used up (0 for a whole decode; updated here): Metaspace drops every
 * replacement character of the first token where the others become spaces (after a Fuse the
 * first token is the whole text, so it drops them all, in every window); Strip's start, after a
 * Fuse, strips at most start contents from the beginning of the whole text (*used: how many went,
 * or start once the text has begun with something else). Before a Fuse, Strip acts on each token
 * alike. */
static int step(const moex_tokenizer *t, const tk_dec *d, const strs *in, strs *out, int *used, int fused) {
    strs_clear(out);
    if (!tk_buf_put(&out->b, "", 0)) return 0;
    if (d->kind == TK_D_FUSE) {
        return strs_add(out, in->b.p, in->b.n); /* the spans are back to back in one buffer */
    }
    if (d->kind == TK_D_BYTEFALLBACK) {
        for (size_t i = 0; i < in->n;) {
            const char *s = in->b.p + in->off[i];
            if (byte_token(s, in->len[i]) < 0) {
                if (!strs_add(out, s, in->len[i])) return 0;
                i++;
                continue;
            }
            char run[256];
            size_t k = 0, j = i;
            for (; j < in->n && k < sizeof run; j++) {
                const int b = byte_token(in->b.p + in->off[j], in->len[j]);
                if (b < 0) break;
                run[k++] = (char)b;
            }
            if (valid_utf8(run, k)) {
                if (!strs_add(out, run, k)) return 0;
            } else {
                for (size_t q = 0; q < k; q++)
                    if (!strs_add(out, REPLACEMENT, 3)) return 0;
            }
            i = j;
        }
        return 1;
    }
    tk_buf tmp = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->off[i];
        size_t n = in->len[i];
        tmp.n = 0;
        if (!tk_buf_put(&tmp, "", 0)) return 0;
        int ok = 1;
        if (d->kind == TK_D_BYTELEVEL) {
            for (size_t q = 0; ok && q < n;) {
                int l;
                const int32_t cp = tk_utf8_decode((const uint8_t *)s + q, n - q, &l);
                const int b = cp >= 0 && cp < 324 ? t->cp_byte[cp] : -1;
                ok = b >= 0 ? tk_buf_putc(&tmp, (char)b) : tk_buf_put(&tmp, s + q, (size_t)l);
                q += (size_t)l;
            }
        } else if (d->kind == TK_D_STRIP) {
            const size_t cl = strlen(d->content);
            const int budget = fused ? d->start - *used : d->start;
            int k = 0;
            for (; k < budget && n >= cl && memcmp(s, d->content, cl) == 0; k++) s += cl, n -= cl;
            if (fused) *used = n ? d->start : *used + k;
            for (int k = 0; k < d->stop && n >= cl && memcmp(s + n - cl, d->content, cl) == 0; k++) n -= cl;
            ok = tk_buf_put(&tmp, s, n);
        } else { /* METASPACE, REPLACE */
            const int drop = d->kind == TK_D_METASPACE && d->prepend && i == 0 && (fused || !*used);
            const char *a = d->kind == TK_D_METASPACE ? d->content : d->a;
            const char *b = drop ? "" : d->kind == TK_D_METASPACE ? " " : d->b;
            const size_t na = strlen(a), nb = strlen(b);
            for (size_t q = 0; ok && q < n;)
                if (q + na <= n && memcmp(s + q, a, na) == 0) {
                    ok = tk_buf_put(&tmp, b, nb);
                    q += na;
                } else {
                    ok = tk_buf_putc(&tmp, s[q++]);
                }
        }
        if (!ok || !strs_add(out, tmp.p, tmp.n)) {
            free(tmp.p);
            return 0;
        }
    }
    if (d->kind == TK_D_METASPACE && !fused && in->n) *used = 1;
    free(tmp.p);
    return 1;
}

moex_status tk_decode_raw(const moex_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, int *used,
                          tk_buf *out) {
    int none[TK_MAX_STEPS] = {0};
    if (!used) used = none;
    strs a = {0}, b = {0};
    int ok = tk_buf_put(&a.b, "", 0);
    for (int64_t i = 0; ok && i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= t->n_tok || !t->tok[id]) {
            strs_free(&a);
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_decode: ids[%lld] = %d is not a token of %s",
                             (long long)i, (int)id, t->path);
        }
        if (skip_special && t->special[id]) continue;
        ok = strs_add(&a, t->tok[id], t->tok_len[id]);
    }
    for (int k = 0, fused = 0; ok && k < t->n_dec; k++) {
        ok = step(t, &t->dec[k], &a, &b, &used[k], fused);
        fused |= t->dec[k].kind == TK_D_FUSE;
        strs sw = a;
        a = b, b = sw;
    }
    out->n = 0;
    if (ok) ok = tk_buf_put(out, a.b.p, a.b.n);
    strs_free(&a);
    strs_free(&b);
    return ok ? MOEX_OK : moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_tokenizer_decode: out of memory");
}

moex_status moex_tokenizer_decode(const moex_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                                  char **text, size_t *len) {
    if (!t || (!ids && n) || n < 0 || !text || !len)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tokenizer_decode: a NULL argument or a negative count");
    *text = NULL, *len = 0;
    tk_buf raw = {0}, out = {0};
    moex_status st = tk_decode_raw(t, ids, n, skip_special, NULL, &raw);
    if (!st && !tk_utf8_repair(raw.p ? raw.p : "", raw.n, &out)) st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_tokenizer_decode: out of memory");
    free(raw.p);
    if (st) {
        free(out.p);
        return st;
    }
    *text = out.p, *len = out.n;
    return MOEX_OK;
}

/* ---- streaming --------------------------------------------------------------------------
 *
 * The ids not yet given out as text form a window; every push decodes the window (as the
 * continuation of what came before: a decoder's first-token effect only until a window given
 * out has used it)
 * and gives its whole text once it ends on a whole character, not on a U+FFFD (which
 * ByteFallback makes of bytes the next tokens may complete) and not inside a run of byte tokens
 * (which ByteFallback decodes as one: a later byte can turn the whole run into U+FFFDs); the
 * window then starts again after it. Cut there, the decoders give the same text as one decode
 * of all the ids (their only effects across tokens are those of the first token and of byte
 * runs). A Strip decoder's stop after a Fuse acts on the end of the whole text instead: with
 * one (stream_whole), the window is every id so far, each push decodes it all and gives what
 * the decode has beyond the text already given (which it begins with: only the end is
 * stripped), so that tokenizer streams in time quadratic in the length. */
struct moex_detok_stream {
    const moex_tokenizer *t;
    int skip_special;
    tk_ids ids;     /* the window */
    int used[TK_MAX_STEPS]; /* what the windows given out used of the decoders' first-token effects (step) */
    int byte_runs;  /* a ByteFallback decoder */
    tk_buf raw, text;
    size_t given;   /* stream_whole: the bytes of the decode given out so far */
};

moex_status moex_detok_stream_new(const moex_tokenizer *t, int skip_special, moex_detok_stream **out) {
    if (!t || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_detok_stream_new: a NULL argument");
    moex_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_detok_stream_new: out of memory");
    s->t = t, s->skip_special = skip_special;
    for (int i = 0; i < t->n_dec; i++) s->byte_runs |= t->dec[i].kind == TK_D_BYTEFALLBACK;
    *out = s;
    return MOEX_OK;
}

/* 1 if buf ends inside a character (a lead byte whose continuation bytes have not come). */
static int ends_inside(const char *p, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        const uint8_t c = (uint8_t)p[n - back];
        if ((c & 0xC0) == 0x80) continue;             /* a continuation byte: look further back */
        const int l = tk_utf8_len(c);
        return l > 1 && (size_t)l > back;              /* the lead of a longer sequence */
    }
    return 0;
}

/* The window's text, when whole (or at the end, whatever there is). */
static moex_status give(moex_detok_stream *s, int final, const char **text, size_t *len) {
    *text = "", *len = 0;
    if (!s->ids.n) return MOEX_OK;
    if (!final && s->byte_runs) { /* a run of <0xXX> tokens is decoded as a whole: wait for its end */
        const int32_t last = s->ids.p[s->ids.n - 1];
        if (byte_token(s->t->tok[last], s->t->tok_len[last]) >= 0) return MOEX_OK;
    }
    int used[TK_MAX_STEPS];
    memcpy(used, s->used, sizeof used); /* kept only if the window is given out */
    moex_status st = tk_decode_raw(s->t, s->ids.p, s->ids.n, s->skip_special, used, &s->raw);
    if (st) return st;
    if (!final && (ends_inside(s->raw.p, s->raw.n) ||
                   (s->raw.n >= 3 && memcmp(s->raw.p + s->raw.n - 3, REPLACEMENT, 3) == 0)))
        return MOEX_OK; /* nothing whole yet */
    if (!tk_utf8_repair(s->raw.p, s->raw.n, &s->text)) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "streamed decode: out of memory");
    if (s->t->stream_whole) { /* all ids decoded as one: give the new end */
        if (s->text.n < s->given) return MOEX_OK; /* an end the strip shortened: nothing new yet */
        *text = s->text.p + s->given, *len = s->text.n - s->given;
        s->given = s->text.n;
        return MOEX_OK;
    }
    memcpy(s->used, used, sizeof used); /* a window of skipped special tokens alone uses nothing */
    s->ids.n = 0;
    *text = s->text.p, *len = s->text.n;
    return MOEX_OK;
}

moex_status moex_detok_stream_push(moex_detok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_detok_stream_push: a NULL argument");
    *text = "", *len = 0;
    if (id < 0 || id >= s->t->n_tok || !s->t->tok[id]) /* the bad id is not kept */
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_detok_stream_push: %d is not a token of %s", (int)id, s->t->path);
    if (!tk_ids_put(&s->ids, id)) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_detok_stream_push: out of memory");
    return give(s, 0, text, len);
}

moex_status moex_detok_stream_finish(moex_detok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_detok_stream_finish: a NULL argument");
    return give(s, 1, text, len);
}

void moex_detok_stream_free(moex_detok_stream *s) {
    if (!s) return;
    free(s->ids.p), free(s->raw.p), free(s->text.p);
    free(s);
}
