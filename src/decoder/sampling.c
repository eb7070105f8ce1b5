/* sampling.c — the seeded generator, greedy decoding and temperature / top-k /
 * top-p sampling in the order of transformers' warpers (see decoder.h). */
#include "decoder/decoder.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- generator: splitmix64 seeding, xoshiro256** ---------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

moex_status moex_rng_seed(moex_rng *rng, uint64_t seed) {
    if (!rng) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "rng_seed: rng is NULL");
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x); /* never all zero: splitmix64 is a bijection */
    return MOEX_OK;
}

uint64_t moex_rng_next(moex_rng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double moex_rng_uniform(moex_rng *rng) { return (double)(moex_rng_next(rng) >> 11) * 0x1.0p-53; }

moex_sampling moex_sampling_default(void) {
    moex_sampling p = {1.0, 0, 1.0};
    return p;
}

/* ---- greedy ------------------------------------------------------------------ */

// logits: [V] -> index of the first maximum, or -1 - i for the first NaN at i
int64_t moex_argmax_row(const float *x, int64_t V) {
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (x[i] != x[i]) return -1 - i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

// logits: [V] -> *token; a NaN logit is an error (no token is meaningful then), as in moex_sample
moex_status moex_sample_greedy(const float *logits, int64_t V, int64_t *token) {
    if (V < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample_greedy: V = %lld must be >= 1", (long long)V);
    if (!logits || !token)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample_greedy: %s is NULL", !logits ? "logits" : "token");
    const int64_t best = moex_argmax_row(logits, V);
    if (best < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample_greedy: logits[%lld] is NaN", (long long)(-1 - best));
    *token = best;
    return MOEX_OK;
}

/* ---- the sampling distribution ------------------------------------------------ */

static moex_status check_params(const char *fn, const float *logits, int64_t V, const moex_sampling *p) {
    if (V < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: V = %lld must be >= 1", fn, (long long)V);
    if (V > INT64_MAX / 16) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: V = %lld is too large", fn, (long long)V);
    if (!logits) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (!p) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    if (!(p->temperature >= 0.0) || !isfinite(p->temperature))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: temperature = %g must be finite and >= 0 (0 = greedy)", fn,
                         p->temperature);
    if (p->temperature > 0.0 && (float)p->temperature < FLT_MIN)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: temperature = %g is below the smallest normal float", fn,
                         p->temperature);
    if (p->top_k < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: top_k = %lld must be >= 0 (0 = off)", fn, (long long)p->top_k);
    if (!(p->top_p >= 0.0 && p->top_p <= 1.0))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: top_p = %g must be in [0, 1] (1 = off)", fn, p->top_p);
    if (p->temperature == 0.0) return MOEX_OK; /* greedy reads the logits as they are */
    int64_t finite = 0;
    for (int64_t i = 0; i < V; i++) {
        const float x = logits[i];
        if (x != x) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: logits[%lld] is NaN", fn, (long long)i);
        if (x == INFINITY) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: logits[%lld] is +inf", fn, (long long)i);
        if (x != -INFINITY) {
            finite++;
            const float s = x / (float)p->temperature;
            if (!isfinite(s))
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: logits[%lld] / temperature = %g / %g overflows", fn,
                                 (long long)i, (double)x, p->temperature);
        }
    }
    if (finite == 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: all %lld logits are -inf", fn, (long long)V);
    return MOEX_OK;
}

typedef struct scored {
    float s;
    int64_t i;
} scored;

// Descending score, then ascending index.
static int by_score_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

// heap: [n] min-heap; sift the root down
static void sift_down(float *heap, int64_t n, int64_t at) {
    for (;;) {
        int64_t l = 2 * at + 1, r = l + 1, m = at;
        if (l < n && heap[l] < heap[m]) m = l;
        if (r < n && heap[r] < heap[m]) m = r;
        if (m == at) return;
        const float t = heap[at];
        heap[at] = heap[m];
        heap[m] = t;
        at = m;
    }
}

// s: [V] -> the k-th largest value (1 <= k <= V); heap: [k] scratch
static float kth_largest(const float *s, int64_t V, int64_t k, float *heap) {
    for (int64_t i = 0; i < k; i++) heap[i] = s[i];
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    for (int64_t i = k; i < V; i++)
        if (s[i] > heap[0]) {
            heap[0] = s[i];
            sift_down(heap, k, 0);
        }
    return heap[0];
}

// After check_params. logits: [V] -> probs: [V]; s: [V] scratch
static moex_status compute_probs(const float *logits, int64_t V, const moex_sampling *p, float *probs, float *s) {
    const char *fn = "sampling";
    if (p->temperature == 0.0) {
        const int64_t best = moex_argmax_row(logits, V);
        for (int64_t i = 0; i < V; i++) probs[i] = i == best ? 1.0f : 0.0f;
        return MOEX_OK;
    }
    // 1. TemperatureLogitsWarper: scores / temperature
    const float temp = (float)p->temperature;
    for (int64_t i = 0; i < V; i++) s[i] = logits[i] / temp;

    // 2. TopKLogitsWarper: scores < topk(scores, k)[-1] -> -inf (ties at the k-th stay)
    if (p->top_k > 0 && p->top_k < V) {
        float *heap = malloc(sizeof(float) * (size_t)p->top_k);
        if (!heap) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: no memory for top_k = %lld", fn, (long long)p->top_k);
        const float thr = kth_largest(s, V, p->top_k, heap);
        free(heap);
        for (int64_t i = 0; i < V; i++)
            if (s[i] < thr) s[i] = -INFINITY;
    }

    // 3. TopPLogitsWarper: softmax, ascending cumulative sum, drop while <= 1 - top_p, keep the largest
    if (p->top_p < 1.0) {
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++) n += s[i] != -INFINITY;
        scored *c = malloc(sizeof(scored) * (size_t)n);
        if (!c) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: no memory to sort %lld scores", fn, (long long)n);
        n = 0;
        for (int64_t i = 0; i < V; i++)
            if (s[i] != -INFINITY) c[n++] = (scored){s[i], i};
        qsort(c, (size_t)n, sizeof *c, by_score_desc);
        const float m = c[0].s;
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            const float e = expf(c[j].s - m);
            sum += e;
        }
        const float inv = 1.0f / (float)sum;
        const float thr = (float)(1.0 - p->top_p);
        double cum = 0.0;
        for (int64_t j = n - 1; j > 0; j--) { /* ascending; j = 0 (the largest) is always kept */
            const float e = expf(c[j].s - m);
            const float pj = e * inv;
            cum += pj;
            if (!((float)cum <= thr)) break;
            s[c[j].i] = -INFINITY;
        }
        free(c);
    }

    // 4. softmax over what is kept
    float m = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (s[i] > m) m = s[i];
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) {
        const float e = s[i] == -INFINITY ? 0.0f : expf(s[i] - m);
        probs[i] = e;
        sum += e;
    }
    const float inv = 1.0f / (float)sum;
    for (int64_t i = 0; i < V; i++) probs[i] = probs[i] * inv;
    return MOEX_OK;
}

// logits: [V] -> probs: [V]
moex_status moex_sampling_probs(const float *logits, int64_t V, const moex_sampling *params, float *probs) {
    moex_status st = check_params("sampling_probs", logits, V, params);
    if (st) return st;
    if (!probs) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sampling_probs: probs is NULL");
    float *s = malloc(sizeof(float) * 2 * (size_t)V);
    if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "sampling_probs: no memory for %lld scores", (long long)V);
    st = compute_probs(logits, V, params, s + V, s); /* into scratch first: nothing written on failure */
    if (!st) memcpy(probs, s + V, sizeof(float) * (size_t)V);
    free(s);
    return st;
}

// logits: [V] -> *token
moex_status moex_sample(const float *logits, int64_t V, const moex_sampling *params, moex_rng *rng,
                        int64_t *token) {
    moex_status st = check_params("sample", logits, V, params);
    if (st) return st;
    if (!token) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample: token is NULL");
    if (params->temperature == 0.0) {
        *token = moex_argmax_row(logits, V);
        return MOEX_OK;
    }
    if (!rng) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample: rng is NULL");
    float *s = malloc(sizeof(float) * 2 * (size_t)V);
    if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "sample: no memory for %lld scores", (long long)V);
    float *probs = s + V;
    st = compute_probs(logits, V, params, probs, s);
    if (st) {
        free(s);
        return st;
    }
    double total = 0.0;
    for (int64_t i = 0; i < V; i++) total += probs[i];
    const double r = moex_rng_uniform(rng) * total;
    int64_t pick = -1;
    double cum = 0.0;
    for (int64_t i = 0; i < V; i++) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        pick = i;
        if (r < cum) break;
    }
    free(s);
    *token = pick; /* >= 0: the largest kept score has probability > 0 */
    return MOEX_OK;
}
