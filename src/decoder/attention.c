/* attention.c — the KV cache and causal grouped-query attention over it (see decoder.h). */
#include "decoder/decoder.h"
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

struct moex_kv_cache {
    int64_t layers, max_batch, max_seq, kv_heads, head_dim;
    float *k, *v;  /* [layers, max_batch, kv_heads, max_seq, head_dim] each; v NULL for a latent cache */
    int64_t *len;  /* [layers, max_batch]: positions filled */
};

/* ---- the cache ---------------------------------------------------------- */

// keys_only: one array (a latent cache), else keys and values.
static moex_status cache_create(int64_t layers, int64_t max_batch, int64_t max_seq, int64_t kv_heads, int64_t head_dim,
                                int keys_only, moex_kv_cache **out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_create: out is NULL");
    const int64_t dims[5] = {layers, max_batch, max_seq, kv_heads, head_dim};
    static const char *const names[5] = {"layers", "max_batch", "max_seq", "kv_heads", "head_dim"};
    int64_t n = 1;
    for (int i = 0; i < 5; i++) {
        if (dims[i] < 1)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_create: %s = %lld must be >= 1", names[i],
                             (long long)dims[i]);
        if (!moex_mul_ok(n, dims[i], &n) || n > (int64_t)(SIZE_MAX / 2 / sizeof(float)) || n > INT64_MAX / 8)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "kv_cache_create: layers %lld x max_batch %lld x max_seq %lld x kv_heads %lld x "
                             "head_dim %lld floats overflows",
                             (long long)layers, (long long)max_batch, (long long)max_seq, (long long)kv_heads,
                             (long long)head_dim);
    }
    moex_kv_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->k = calloc((size_t)n, sizeof(float));
        c->v = c->k && !keys_only ? calloc((size_t)n, sizeof(float)) : NULL;
        c->len = c->k && (keys_only || c->v) ? calloc((size_t)(layers * max_batch), sizeof(int64_t)) : NULL;
    }
    if (!c || !c->len) {
        if (c) {
            free(c->k);
            free(c->v);
        }
        free(c);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "kv_cache_create: no memory for %d x %lld floats (%.1f MiB)",
                         keys_only ? 1 : 2, (long long)n, (keys_only ? 1.0 : 2.0) * (double)n * 4.0 / 1048576.0);
    }
    c->layers = layers;
    c->max_batch = max_batch;
    c->max_seq = max_seq;
    c->kv_heads = kv_heads;
    c->head_dim = head_dim;
    *out = c;
    return MOEX_OK;
}

moex_status moex_kv_cache_create(int64_t layers, int64_t max_batch, int64_t max_seq, int64_t kv_heads,
                                 int64_t head_dim, moex_kv_cache **out) {
    return cache_create(layers, max_batch, max_seq, kv_heads, head_dim, 0, out);
}

moex_status moex_kv_cache_create_latent(int64_t layers, int64_t max_batch, int64_t max_seq, int64_t width,
                                        moex_kv_cache **out) {
    return cache_create(layers, max_batch, max_seq, 1, width, 1, out);
}

void moex_kv_cache_free(moex_kv_cache *cache) {
    if (!cache) return;
    free(cache->k);
    free(cache->v);
    free(cache->len);
    free(cache);
}

moex_status moex_kv_cache_reset(moex_kv_cache *cache, int64_t seq) {
    if (!cache) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_reset: cache is NULL");
    if (seq < -1 || seq >= cache->max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_reset: seq = %lld is outside [0, %lld) (or -1 for all)",
                         (long long)seq, (long long)cache->max_batch);
    for (int64_t l = 0; l < cache->layers; l++)
        for (int64_t s = 0; s < cache->max_batch; s++)
            if (seq == -1 || s == seq) cache->len[l * cache->max_batch + s] = 0;
    return MOEX_OK;
}

// Start of the rows of (layer, seq, kv head) in k or v: [max_seq, head_dim].
static inline size_t head_offset(const moex_kv_cache *c, int64_t layer, int64_t seq, int64_t h) {
    return (size_t)(((layer * c->max_batch + seq) * c->kv_heads + h) * c->max_seq) * (size_t)c->head_dim;
}

moex_status moex_kv_cache_length(const moex_kv_cache *cache, int64_t layer, int64_t seq, int64_t *length) {
    if (!cache) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_length: cache is NULL");
    if (!length) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_length: length is NULL");
    if (layer < 0 || layer >= cache->layers)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_length: layer = %lld is outside [0, %lld)",
                         (long long)layer, (long long)cache->layers);
    if (seq < 0 || seq >= cache->max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "kv_cache_length: seq = %lld is outside [0, %lld)",
                         (long long)seq, (long long)cache->max_batch);
    *length = cache->len[layer * cache->max_batch + seq];
    return MOEX_OK;
}

size_t moex_kv_cache_bytes(const moex_kv_cache *cache) {
    if (!cache) return 0;
    return (cache->v ? 2 : 1) * sizeof(float) *
           (size_t)(cache->layers * cache->max_batch * cache->kv_heads * cache->max_seq * cache->head_dim);
}

/* ---- attention ---------------------------------------------------------- */

// a, b: [n] -> dot product in f32, eight partial sums in a fixed order (vectorisable, deterministic)
static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            const float p = a[i + l] * b[i + l];
            acc[l] += p;
        }
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) {
        const float p = a[i] * b[i];
        s += p;
    }
    return s;
}

// One query row against positions lo .. L-1 of one kv head (lo > 0: a sliding window).
// q: [d], keys: [L, d], vals: [L, vstride] (the first dv values of each row) -> o: [dv]; scores: [L]
// scratch. sink (gpt_oss): one more logit in the softmax's maximum and sum that weighs no value, or NULL.
static void attend_row(const float *q, const float *keys, const float *vals, int64_t lo, int64_t L, int64_t d,
                       int64_t dv, int64_t vstride, float scale, const float *sink, float *scores, float *o) {
    float m = sink ? *sink : -INFINITY;
    for (int64_t j = lo; j < L; j++) {
        const float s = dot(q, keys + j * d, d) * scale; /* matmul(q, k^T) * scaling */
        scores[j] = s;
        if (s > m) m = s;
    }
    double sum = sink ? (double)expf(*sink - m) : 0.0;
    for (int64_t j = lo; j < L; j++) {
        const float e = expf(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    const float inv = 1.0f / (float)sum;
    for (int64_t i = 0; i < dv; i++) o[i] = 0.0f;
    for (int64_t j = lo; j < L; j++) {
        const float w = scores[j] * inv; /* softmax weights, then matmul(weights, v) */
        const float *vj = vals + j * vstride;
        for (int64_t i = 0; i < dv; i++) {
            const float p = w * vj[i];
            o[i] += p;
        }
    }
}

static int ranges_overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *ab = a, *bb = b;
    return ab < bb + bn && bb < ab + an;
}

// The descriptors against the cache's layer (before anything is written): *total = their tokens.
static moex_status check_seqs(const char *fn, const moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                              int64_t nseq, int64_t heads, int threads, int64_t *total) {
    if (!cache) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: cache is NULL", fn);
    if (layer < 0 || layer >= cache->layers)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: layer = %lld is outside [0, %lld)", fn, (long long)layer,
                         (long long)cache->layers);
    const int64_t KV = cache->kv_heads, S = cache->max_seq, B = cache->max_batch;
    if (heads < 1 || heads % KV != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: heads = %lld is not a positive multiple of kv_heads = %lld",
                         fn, (long long)heads, (long long)KV);
    if (threads < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: threads = %d is negative", fn, threads);
    if (nseq < 0 || nseq > B)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld sequences is outside [0, max_batch = %lld]", fn,
                         (long long)nseq, (long long)B);
    if (nseq > 0 && !seqs) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: seqs is NULL (%lld sequences)", fn,
                                            (long long)nseq);
    int64_t sum = 0;
    for (int64_t i = 0; i < nseq; i++) {
        const moex_attn_seq *s = &seqs[i];
        if (s->seq < 0 || s->seq >= B)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: seqs[%lld].seq = %lld is outside [0, max_batch = %lld)",
                             fn, (long long)i, (long long)s->seq, (long long)B);
        for (int64_t j = 0; j < i; j++)
            if (seqs[j].seq == s->seq)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: sequence %lld appears twice (seqs[%lld] and seqs[%lld])",
                                 fn, (long long)s->seq, (long long)j, (long long)i);
        if (s->tokens < 0 || s->past < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: sequence %lld: tokens = %lld and past = %lld must be >= 0",
                             fn, (long long)s->seq, (long long)s->tokens, (long long)s->past);
        const int64_t have = cache->len[layer * B + s->seq];
        if (s->past > have)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "%s: sequence %lld: past = %lld but layer %lld of the cache holds only %lld positions "
                             "for it",
                             fn, (long long)s->seq, (long long)s->past, (long long)layer, (long long)have);
        if (s->tokens > S - s->past)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "%s: sequence %lld would hold past %lld + %lld new tokens = %lld positions, more than the "
                             "cache's max_seq = %lld",
                             fn, (long long)s->seq, (long long)s->past, (long long)s->tokens,
                             (long long)(s->past + s->tokens), (long long)S);
        sum += s->tokens; /* <= nseq * max_seq: no overflow beyond the cache's own size */
    }
    *total = sum;
    return MOEX_OK;
}

// What attend() runs: queries of width d (the cache's head_dim) against the cache's keys, dv values
// each (the cache's values, or for a latent cache the first dv values of each key row).
typedef struct attend_args {
    int64_t dv, window;
    float scale;
    const float *sinks;
} attend_args;

// The new rows appended, then every (sequence, head) pair attended by one thread.
// q: [total, heads, d], k, v: [total, kv_heads, d] (v NULL for a latent cache) -> out: [total, heads, dv]
static moex_status attend(const char *fn, moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs, int64_t nseq,
                          int64_t total, int64_t heads, const float *q, const float *k, const float *v, float *out,
                          int threads, const attend_args *a) {
    const int64_t KV = cache->kv_heads, d = cache->head_dim, S = cache->max_seq, B = cache->max_batch, dv = a->dv;
    const int latent = cache->v == NULL;
    // Work items are (sequence, head) pairs, each computed start to end by one thread.
    const int64_t items = nseq * heads;
    int nt = threads > 0 ? threads : moex_cpu_cores();
    if (nt < 1) nt = 1;
    if ((int64_t)nt > items) nt = (int)items;
    const size_t per_thread = (size_t)(S + d);
    float *scratch = malloc(sizeof(float) * per_thread * (size_t)nt);
    int64_t *first = malloc(sizeof(int64_t) * (size_t)nseq); /* first row of each sequence in q, k, v */
    if (!scratch || !first) {
        free(scratch);
        free(first);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: no memory for %d x %zu floats of scratch", fn, nt, per_thread);
    }
    (void)total;
    int64_t row = 0;
    for (int64_t i = 0; i < nseq; i++) {
        first[i] = row;
        row += seqs[i].tokens;
    }

    // 1. append k and v at positions past .. past + T - 1
    for (int64_t i = 0; i < nseq; i++) {
        const moex_attn_seq *s = &seqs[i];
        for (int64_t t = 0; t < s->tokens; t++)
            for (int64_t h = 0; h < KV; h++) {
                const size_t src = (size_t)(((first[i] + t) * KV + h) * d);
                const size_t dst = head_offset(cache, layer, s->seq, h) + (size_t)((s->past + t) * d);
                memcpy(cache->k + dst, k + src, sizeof(float) * (size_t)d);
                if (!latent) memcpy(cache->v + dst, v + src, sizeof(float) * (size_t)d);
            }
        cache->len[layer * B + s->seq] = s->past + s->tokens;
    }

    // 2. attend: token t of a sequence sees positions 0 .. past + t (the last `window` of them)
    const int64_t group = heads / KV, window = a->window;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *scores = scratch + per_thread * (size_t)omp_get_thread_num();
        float *qrow = scores + S;
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            const int64_t i = it / heads, h = it % heads;
            const moex_attn_seq *s = &seqs[i];
            const size_t off = head_offset(cache, layer, s->seq, h / group);
            const float *keys = cache->k + off, *vals = latent ? keys : cache->v + off;
            for (int64_t t = 0; t < s->tokens; t++) {
                const int64_t r = first[i] + t, p = s->past + t;
                const int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0; /* kv > q - window */
                memcpy(qrow, q + (r * heads + h) * d, sizeof(float) * (size_t)d); /* out may be q */
                attend_row(qrow, keys, vals, lo, p + 1, d, dv, d, a->scale, a->sinks ? a->sinks + h : NULL, scores,
                           out + (r * heads + h) * dv);
            }
        }
    }
    free(scratch);
    free(first);
    return MOEX_OK;
}

// q: [sum T_i, heads, d], k, v: [sum T_i, kv_heads, d] -> out: [sum T_i, heads * d]
moex_status moex_attention_forward_batch(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                         int64_t nseq, int64_t heads, const float *q, const float *k, const float *v,
                                         float *out, int threads) {
    return moex_attention_forward_sinks(cache, layer, seqs, nseq, heads, q, k, v, out, threads, 0, NULL);
}

moex_status moex_attention_forward_sinks(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs, int64_t nseq,
                                         int64_t heads, const float *q, const float *k, const float *v, float *out,
                                         int threads, int64_t window, const float *sinks) {
    const char *fn = "attention";
    if (window < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: window = %lld is negative", fn, (long long)window);
    int64_t total = 0;
    moex_status st = check_seqs(fn, cache, layer, seqs, nseq, heads, threads, &total);
    if (st) return st;
    if (!cache->v)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the cache is a latent one (moex_attention_forward_latent)", fn);
    if (total == 0) return MOEX_OK;
    if (!q || !k || !v || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (%lld tokens)", fn,
                         !q ? "q" : !k ? "k" : !v ? "v" : "out", (long long)total);
    const int64_t KV = cache->kv_heads, d = cache->head_dim;
    int64_t hd, qn, kn;
    if (!moex_mul_ok(heads, d, &hd) || !moex_mul_ok(total, hd, &qn) || qn > INT64_MAX / 4 ||
        !moex_mul_ok(total, KV * d, &kn))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld tokens of %lld heads x %lld overflows", fn,
                         (long long)total, (long long)heads, (long long)d);
    const size_t qb = sizeof(float) * (size_t)qn, kb = sizeof(float) * (size_t)kn;
    if (ranges_overlap(out, qb, k, kb) || ranges_overlap(out, qb, v, kb) || (out != q && ranges_overlap(out, qb, q, qb)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: out overlaps %s", fn,
                         ranges_overlap(out, qb, k, kb) ? "k" : ranges_overlap(out, qb, v, kb) ? "v" : "q (other than being q)");
    const attend_args a = {d, window, (float)pow((double)d, -0.5) /* head_dim ** -0.5 */, sinks};
    return attend(fn, cache, layer, seqs, nseq, total, heads, q, k, v, out, threads, &a);
}

moex_status moex_latent_args_check(const char *fn, int latent, int64_t width, int64_t value_dim, float scale) {
    if (!latent) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the cache keeps values (not a latent cache)", fn);
    if (value_dim < 1 || value_dim > width)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: value_dim = %lld is outside [1, width = %lld]", fn,
                         (long long)value_dim, (long long)width);
    if (!(scale > 0.0f) || !isfinite(scale))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: scale = %g must be a positive number", fn, (double)scale);
    return MOEX_OK;
}

moex_status moex_attention_forward_latent(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                          int64_t nseq, int64_t heads, const float *q, const float *kv,
                                          int64_t value_dim, float scale, float *out, int threads) {
    const char *fn = "latent attention";
    int64_t total = 0;
    moex_status st = check_seqs(fn, cache, layer, seqs, nseq, heads, threads, &total);
    if (st) return st;
    if ((st = moex_latent_args_check(fn, cache->v == NULL, cache->head_dim, value_dim, scale))) return st;
    const int64_t w = cache->head_dim;
    if (total == 0) return MOEX_OK;
    if (!q || !kv || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (%lld tokens)", fn, !q ? "q" : !kv ? "kv" : "out",
                         (long long)total);
    int64_t qn, on;
    if (!moex_mul_ok(total, heads * w, &qn) || qn > INT64_MAX / 4 || !moex_mul_ok(total, heads * value_dim, &on))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld tokens of %lld heads x %lld overflows", fn,
                         (long long)total, (long long)heads, (long long)w);
    const size_t qb = sizeof(float) * (size_t)qn, kb = sizeof(float) * (size_t)(total * w), ob = sizeof(float) * (size_t)on;
    if (ranges_overlap(out, ob, q, qb) || ranges_overlap(out, ob, kv, kb))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: out overlaps %s", fn, ranges_overlap(out, ob, q, qb) ? "q" : "kv");
    const attend_args a = {value_dim, 0, scale, NULL};
    return attend(fn, cache, layer, seqs, nseq, total, heads, q, kv, NULL, out, threads, &a);
}

// q: [T, heads, d], k, v: [T, kv_heads, d] -> out: [T, heads * d]
moex_status moex_attention_forward(moex_kv_cache *cache, int64_t layer, int64_t seq, int64_t heads, const float *q,
                                   const float *k, const float *v, int64_t T, int64_t past, float *out, int threads) {
    const moex_attn_seq s = {seq, T, past};
    return moex_attention_forward_batch(cache, layer, &s, 1, heads, q, k, v, out, threads);
}
