/*
 * test_decoder.c — the decoder building blocks (src/decoder/decoder.h) against
 * float64 references written here.
 *
 *   - linear (f32/f16/bf16 weights, bias or not, T = 1, 3, 9, 17, N over
 *     several 128-column blocks), embedding, RMSNorm (rows and per head),
 *     rope (hand-computed values, transformers' f32 pipeline, MRoPE against a
 *     transcription of apply_interleaved_mrope, text-only MRoPE == rope),
 *     attention with the cache (chunked == whole sequence bit for bit, both
 *     against full causal attention in float64; heads 5 / kv 1 and others),
 *     activations, gated MLP, shared expert, sampling (greedy tie rule,
 *     warper semantics against a float64 transcription, determinism,
 *     frequencies), threads 1 and 2 bitwise equal; the CPU op table's own ops
 *     and linear/activation.h against moex_activate
 *   - a guard region after every output; bad inputs: status, message,
 *     outputs (and the cache) untouched
 * Tolerance: NMSE <= 1e-10 against the float64 reference (inputs decoded exactly).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "decoder/decoder.h"
#include "decoder/ops.h"
#include "linear/activation.h"
#include "moex.h"
#include "reference.h"
#include "testutil.h"

#define NMSE_MAX 1e-10
#define GUARD 16
#define SENTINEL 12345.0f

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* -> [n + GUARD] floats: n of N(0,1) * scale, then the sentinel */
static float *frand(ref_rng *r, int64_t n, double scale) {
    float *p = malloc(sizeof(float) * (size_t)(n + GUARD));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(ref_rng_normal(r) * scale);
    for (int64_t i = n; i < n + GUARD; i++) p[i] = SENTINEL;
    return p;
}

/* -> [n + GUARD] floats, all the sentinel (an output buffer) */
static float *fout(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n + GUARD));
    assert_non_null(p);
    for (int64_t i = 0; i < n + GUARD; i++) p[i] = SENTINEL;
    return p;
}

/* -> [n] weights of dt, N(0,1) * scale (bytes for n + GUARD elements) */
static void *wrand(ref_rng *r, moex_dtype dt, int64_t n, double scale) {
    void *p = calloc((size_t)(n + GUARD), ref_dtype_size(dt));
    assert_non_null(p);
    ref_fill_random(p, dt, n, scale, r);
    return p;
}

/* the GUARD floats after out[n] are still the sentinel */
static int guard_ok(const float *out, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++)
        if (out[i] != SENTINEL) return 0;
    return 1;
}

/* a: [n] floats, b: [n] doubles -> sum (a-b)^2 / sum b^2 */
static double nmse(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

static const char *dtn(moex_dtype dt) { return dt == MOEX_F32 ? "f32" : dt == MOEX_F16 ? "f16" : "bf16"; }

/* st must be want, the message non-empty and containing need1 or need2 */
static void expect_fail(moex_status st, moex_status want, const char *need1, const char *need2, const char *what) {
    const char *msg = moex_last_error();
    if (st != want)
        PROBLEM("%s: status %d (%s), want %d (%s); message \"%s\"", what, st, moex_status_str(st), want,
                moex_status_str(want), msg);
    if (!msg || !*msg) PROBLEM("%s: empty moex_last_error()", what);
    if ((need1 || need2) && !contains(msg, need1) && !contains(msg, need2))
        PROBLEM("%s: message \"%s\" does not name %s", what, msg, needs_text(need1, need2));
}

/* all n floats of p are the sentinel (nothing written) */
static int untouched(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != SENTINEL) return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* float64 references                                                        */
/* ------------------------------------------------------------------------ */

/* x: [T, K] floats, W: [N, K] of dt, bias: [N] of dt or NULL -> y: [T, N] */
static void ref_linear(const float *x, int64_t T, int64_t K, const void *W, moex_dtype dt, int64_t N,
                       const void *bias, double *y) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[t * K + k] * ref_load(W, dt, n * K + k);
            y[t * N + n] = s + (bias ? ref_load(bias, dt, n) : 0.0);
        }
}

/* x: [rows, n], w: [n] of dt -> y: [rows, n] = w * x / sqrt(mean(x^2) + eps) */
static void ref_rmsnorm(const float *x, int64_t rows, int64_t n, const void *w, moex_dtype dt, double eps, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double inv = 1.0 / sqrt(ss / (double)n + (double)(float)eps);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = ref_load(w, dt, i) * ((double)x[r * n + i] * inv);
    }
}

/* double -> the double nearest to it that a float holds */
static double fl(double x) { return (double)(float)x; }

/* transformers' inv_freq in f32, each step rounded: 1.0 / (base ** (arange(0, d, 2).float() / d)) */
static double ref_inv_freq(int64_t i, int64_t d, double theta) {
    double e = fl(fl((double)(2 * i)) / fl((double)d));
    return fl(1.0 / fl(pow(fl(theta), e)));
}

/* the f32 angle (float)pos * inv_freq, as a double */
static double ref_angle(int64_t pos, double inv) { return fl(fl((double)pos) * inv); }

/* x: [T, heads, d] floats, angle: [T, d/2] doubles -> y: [T, heads, d], rotate_half rope in double */
static void ref_rope(const float *x, int64_t T, int64_t heads, int64_t d, const double *angle, double *y) {
    int64_t half = d / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < half; i++) {
                const float *v = x + (t * heads + h) * d;
                double c = cos(angle[t * half + i]), s = sin(angle[t * half + i]);
                y[(t * heads + h) * d + i] = v[i] * c - v[half + i] * s;
                y[(t * heads + h) * d + half + i] = v[half + i] * c + v[i] * s;
            }
}

/* q: [L, heads, d], k, v: [L, kv, d] of one whole sequence -> out: [L, heads*d], causal GQA in double */
static void ref_attention(const float *q, const float *k, const float *v, int64_t L, int64_t heads, int64_t kv,
                          int64_t d, double *out) {
    double *w = malloc(sizeof(double) * (size_t)L);
    assert_non_null(w);
    const int64_t group = heads / kv;
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < heads; h++) {
            const int64_t g = h / group;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= t; j++) {
                double s = 0;
                for (int64_t i = 0; i < d; i++) s += (double)q[(t * heads + h) * d + i] * k[(j * kv + g) * d + i];
                w[j] = s / sqrt((double)d);
                if (w[j] > m) m = w[j];
            }
            for (int64_t j = 0; j <= t; j++) sum += (w[j] = exp(w[j] - m));
            for (int64_t i = 0; i < d; i++) {
                double o = 0;
                for (int64_t j = 0; j <= t; j++) o += w[j] / sum * v[(j * kv + g) * d + i];
                out[(t * heads + h) * d + i] = o;
            }
        }
    free(w);
}

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ------------------------------------------------------------------------ */
/* linear and embedding                                                      */
/* ------------------------------------------------------------------------ */

static void test_linear(void **state) {
    (void)state;
    static const moex_dtype dts[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
    static const int64_t KN[][2] = {{40, 40}, {40, 5}, {40, 1}, {37, 300}};
    static const int64_t Ts[] = {1, 3, 9, 17};
    ref_rng r;
    ref_rng_seed(&r, 11);
    int cases = 0;
    for (int di = 0; di < 3; di++)
        for (int s = 0; s < 4; s++)
            for (int ti = 0; ti < 4; ti++)
                for (int bias = 0; bias < 2; bias++) {
                    const moex_dtype dt = dts[di];
                    const int64_t K = KN[s][0], N = KN[s][1], T = Ts[ti];
                    void *W = wrand(&r, dt, N * K, 1.0 / sqrt((double)K));
                    void *b = bias ? wrand(&r, dt, N, 0.5) : NULL;
                    float *x = frand(&r, T * K, 1.0);
                    float *y1 = fout(T * N), *y2 = fout(T * N), *y0 = fout(T * N);
                    double *ref = malloc(sizeof(double) * (size_t)(T * N));
                    moex_linear_w w = {W, dt, N, K, b, dt};
                    char what[128];
                    snprintf(what, sizeof what, "linear %s K=%lld N=%lld T=%lld bias=%d", dtn(dt), (long long)K,
                             (long long)N, (long long)T, bias);
                    moex_status st = moex_linear(&w, x, T, y1, 1);
                    if (st) PROBLEM("%s: %s", what, moex_last_error());
                    assert_int_equal(moex_linear(&w, x, T, y2, 2), MOEX_OK);
                    assert_int_equal(moex_linear(&w, x, T, y0, 0), MOEX_OK);
                    ref_linear(x, T, K, W, dt, N, b, ref);
                    double e = nmse(y1, ref, T * N);
                    if (!(e <= NMSE_MAX)) PROBLEM("%s: nmse %.3g", what, e);
                    if (memcmp(y1, y2, sizeof(float) * (size_t)(T * N)) ||
                        memcmp(y1, y0, sizeof(float) * (size_t)(T * N)))
                        PROBLEM("%s: threads 1, 2 and 0 differ", what);
                    if (!guard_ok(y1, T * N) || !guard_ok(y2, T * N)) PROBLEM("%s: wrote past the output", what);
                    free(W), free(b), free(x), free(y1), free(y2), free(y0), free(ref);
                    cases++;
                }
    assert_int_equal(cases, 96);
    end_problems();
}

/* lm_head: the embedding table [V, H] used as the linear weight */
static void test_lm_head_tied(void **state) {
    (void)state;
    ref_rng r;
    ref_rng_seed(&r, 12);
    const int64_t V = 301, H = 40, T = 3;
    void *E = wrand(&r, MOEX_BF16, V * H, 1.0);
    float *x = frand(&r, T * H, 1.0), *logits = fout(T * V);
    double *ref = malloc(sizeof(double) * (size_t)(T * V));
    moex_linear_w w = {E, MOEX_BF16, V, H, NULL, MOEX_F32};
    assert_int_equal(moex_linear(&w, x, T, logits, 2), MOEX_OK);
    ref_linear(x, T, H, E, MOEX_BF16, V, NULL, ref);
    assert_true(nmse(logits, ref, T * V) <= NMSE_MAX);
    assert_true(guard_ok(logits, T * V));
    free(E), free(x), free(logits), free(ref);
}

static void test_embedding(void **state) {
    (void)state;
    static const moex_dtype dts[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
    ref_rng r;
    ref_rng_seed(&r, 13);
    const int64_t V = 11, H = 40, T = 17;
    for (int di = 0; di < 3; di++) {
        void *E = wrand(&r, dts[di], V * H, 1.0);
        int64_t ids[17];
        for (int t = 0; t < T; t++) ids[t] = t == 0 ? 0 : t == 1 ? V - 1 : ref_rng_below(&r, V);
        float *out = fout(T * H);
        assert_int_equal(moex_embedding(E, dts[di], V, H, ids, T, out), MOEX_OK);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < H; i++)
                if ((double)out[t * H + i] != ref_load(E, dts[di], ids[t] * H + i))
                    PROBLEM("embedding %s: out[%lld, %lld] differs", dtn(dts[di]), (long long)t, (long long)i);
        assert_true(guard_ok(out, T * H));
        /* a bad id: nothing written */
        float *o2 = fout(T * H);
        ids[5] = V;
        expect_fail(moex_embedding(E, dts[di], V, H, ids, T, o2), MOEX_ERR_INVALID_ARGUMENT, "ids[5] = 11", NULL,
                    "embedding bad id");
        ids[5] = -1;
        expect_fail(moex_embedding(E, dts[di], V, H, ids, T, o2), MOEX_ERR_INVALID_ARGUMENT, "ids[5] = -1", NULL,
                    "embedding negative id");
        if (!untouched(o2, T * H + GUARD)) PROBLEM("embedding wrote on failure");
        free(E), free(out), free(o2);
    }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* RMSNorm                                                                   */
/* ------------------------------------------------------------------------ */

static void test_rmsnorm(void **state) {
    (void)state;
    static const moex_dtype dts[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
    static const int64_t Ts[3] = {1, 3, 17};
    ref_rng r;
    ref_rng_seed(&r, 21);
    const int64_t H = 40;
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 3; ti++) {
            const int64_t T = Ts[ti];
            void *w = wrand(&r, dts[di], H, 1.0);
            float *x = frand(&r, T * H, ti == 2 ? 1e-3 : 3.0), *y = fout(T * H);
            double *ref = malloc(sizeof(double) * (size_t)(T * H));
            assert_int_equal(moex_rmsnorm(x, T, H, w, dts[di], 1e-6, y), MOEX_OK);
            ref_rmsnorm(x, T, H, w, dts[di], 1e-6, ref);
            double e = nmse(y, ref, T * H);
            if (!(e <= NMSE_MAX)) PROBLEM("rmsnorm %s T=%lld: nmse %.3g", dtn(dts[di]), (long long)T, e);
            assert_true(guard_ok(y, T * H));
            /* in place gives the same bits */
            assert_int_equal(moex_rmsnorm(x, T, H, w, dts[di], 1e-6, x), MOEX_OK);
            if (memcmp(x, y, sizeof(float) * (size_t)(T * H))) PROBLEM("rmsnorm in place differs");
            free(w), free(x), free(y), free(ref);
        }
    /* by hand: x = [3, 4], w = [1, 0.5], eps = 0: mean 12.5 */
    const float x2[2] = {3, 4}, w2[2] = {1, 0.5f};
    float y2[2];
    assert_int_equal(moex_rmsnorm(x2, 1, 2, w2, MOEX_F32, 0.0, y2), MOEX_OK);
    assert_float_equal(y2[0], 0.848528137423857, 2e-7);
    assert_float_equal(y2[1], 0.565685424949238, 2e-7);
    /* per head (q_norm / k_norm): T=3, heads 5 and 1, head_dim 8 and 16 */
    static const int64_t HD[][2] = {{5, 8}, {5, 16}, {1, 16}};
    for (int c = 0; c < 3; c++) {
        const int64_t T = 3, heads = HD[c][0], d = HD[c][1], n = T * heads * d;
        void *w = wrand(&r, MOEX_BF16, d, 1.0);
        float *x = frand(&r, n, 2.0), *y = fout(n);
        double *ref = malloc(sizeof(double) * (size_t)n);
        assert_int_equal(moex_rmsnorm_heads(x, T, heads, d, w, MOEX_BF16, 1e-6, y), MOEX_OK);
        ref_rmsnorm(x, T * heads, d, w, MOEX_BF16, 1e-6, ref);
        double e = nmse(y, ref, n);
        if (!(e <= NMSE_MAX)) PROBLEM("rmsnorm_heads heads=%lld d=%lld: nmse %.3g", (long long)heads, (long long)d, e);
        assert_true(guard_ok(y, n));
        free(w), free(x), free(y), free(ref);
    }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* rope                                                                      */
/* ------------------------------------------------------------------------ */

static void test_rope_by_hand(void **state) {
    (void)state;
    float inv[4];
    assert_int_equal(moex_rope_inv_freq(8, 10000.0, inv), MOEX_OK);
    /* 10000^(0, 1/4, 1/2, 3/4) = 1, 10, 100, 1000 */
    assert_float_equal(inv[0], 1.0f, 0);
    assert_float_equal(inv[1], 0.1f, 1e-8);
    assert_float_equal(inv[2], 0.01f, 1e-9);
    assert_float_equal(inv[3], 0.001f, 1e-10);

    /* d = 4, theta = 10000: inv_freq = [1, 0.01]; x = [1, 2, 3, 4] at position 1 */
    float inv4[2], c[2], s[2];
    assert_int_equal(moex_rope_inv_freq(4, 10000.0, inv4), MOEX_OK);
    assert_float_equal(inv4[0], 1.0f, 0);
    assert_float_equal(inv4[1], 0.01f, 0);
    const int64_t pos1 = 1;
    assert_int_equal(moex_rope_cos_sin(inv4, 4, &pos1, 1, c, s), MOEX_OK);
    float x[4] = {1, 2, 3, 4};
    assert_int_equal(moex_rope_apply(x, 1, 1, 4, c, s), MOEX_OK);
    /* x1*cos - x3*sin, x2*cos' - x4*sin', x3*cos + x1*sin, x4*cos' + x2*sin' */
    assert_float_equal(x[0], -1.9841106485555495, 3e-7);
    assert_float_equal(x[1], 1.959900667496664, 3e-7);
    assert_float_equal(x[2], 2.4623779024123156, 3e-7);
    assert_float_equal(x[3], 4.019799668334994, 4e-7);

    /* position 0 is the identity, bit for bit */
    const int64_t pos0 = 0;
    float y[4] = {1.5f, -2.25f, 3.125f, 7.0f}, y0[4];
    memcpy(y0, y, sizeof y);
    assert_int_equal(moex_rope_cos_sin(inv4, 4, &pos0, 1, c, s), MOEX_OK);
    assert_int_equal(moex_rope_apply(y, 1, 1, 4, c, s), MOEX_OK);
    assert_memory_equal(y, y0, sizeof y);
}

/* Partial rotary (glm4_moe): heads of 10 with the first 4 rotated, by hand in float64 against
 * cos/sin of inv_freq over 4 values; the other 6 untouched; rotary_dim checked. */
static void test_rope_partial(void **state) {
    (void)state;
    float inv[2], c[2 * 3], s[2 * 3], x[3 * 2 * 10], x0[3 * 2 * 10];
    assert_int_equal(moex_rope_inv_freq(4, 10000.0, inv), MOEX_OK);
    const int64_t pos[3] = {0, 5, 37};
    assert_int_equal(moex_rope_cos_sin(inv, 4, pos, 3, c, s), MOEX_OK);
    for (int i = 0; i < 60; i++) x[i] = x0[i] = (float)((i * 37 % 23) - 11) / 7.0f;
    assert_int_equal(moex_rope_apply_partial(x, 3, 2, 10, 4, c, s), MOEX_OK);
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < 2; h++) {
            const float *a = x0 + (t * 2 + h) * 10, *b = x + (t * 2 + h) * 10;
            for (int i = 0; i < 2; i++) {
                const double cs = c[t * 2 + i], sn = s[t * 2 + i];
                assert_float_equal(b[i], (double)a[i] * cs - (double)a[i + 2] * sn, 1e-6);
                assert_float_equal(b[i + 2], (double)a[i + 2] * cs + (double)a[i] * sn, 1e-6);
            }
            assert_memory_equal(b + 4, a + 4, 6 * sizeof(float));
        }
    expect_fail(moex_rope_apply_partial(x, 3, 2, 10, 12, c, s), MOEX_ERR_INVALID_ARGUMENT, "rotary_dim = 12", NULL,
                "rotary_dim > head_dim");
    expect_fail(moex_rope_apply_partial(x, 3, 2, 10, 3, c, s), MOEX_ERR_INVALID_ARGUMENT, "rotary_dim = 3", NULL,
                "odd rotary_dim");
    end_problems();
}

/* gpt_oss's attention: a window of 3 and a sink logit per head, one sequence of 6 tokens over 2
 * calls (4 + 2), 4 heads on 2 kv heads, against float64 (the sink in the softmax's sum only). */
static void test_attention_sinks_window(void **state) {
    (void)state;
    enum { T = 6, HQ = 4, KV = 2, D = 8, W = 3 };
    float q[T * HQ * D], k[T * KV * D], v[T * KV * D], out[T * HQ * D];
    const float sinks[HQ] = {0.5f, -1.0f, 2.0f, 0.0f};
    for (int i = 0; i < T * HQ * D; i++) q[i] = (float)((i * 13 % 11) - 5) / 7.0f;
    for (int i = 0; i < T * KV * D; i++) k[i] = (float)((i * 7 % 13) - 6) / 9.0f, v[i] = (float)((i * 5 % 17) - 8) / 6.0f;
    moex_kv_cache *cache = NULL;
    assert_int_equal(moex_kv_cache_create(1, 1, 16, KV, D, &cache), MOEX_OK);
    const moex_attn_seq a = {0, 4, 0}, b = {0, 2, 4};
    assert_int_equal(moex_attention_forward_sinks(cache, 0, &a, 1, HQ, q, k, v, out, 1, W, sinks), MOEX_OK);
    assert_int_equal(moex_attention_forward_sinks(cache, 0, &b, 1, HQ, q + 4 * HQ * D, k + 4 * KV * D, v + 4 * KV * D,
                                                  out + 4 * HQ * D, 1, W, sinks), MOEX_OK);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HQ; h++) {
            const int g = h / (HQ / KV), lo = t + 1 > W ? t + 1 - W : 0;
            double sc[T], mx = sinks[h], sum = 0.0, ref[D] = {0};
            for (int j = lo; j <= t; j++) {
                double dot = 0.0;
                for (int i = 0; i < D; i++) dot += (double)q[(t * HQ + h) * D + i] * k[(j * KV + g) * D + i];
                sc[j] = dot / sqrt((double)D);
                if (sc[j] > mx) mx = sc[j];
            }
            sum = exp(sinks[h] - mx);
            for (int j = lo; j <= t; j++) sum += exp(sc[j] - mx);
            for (int j = lo; j <= t; j++)
                for (int i = 0; i < D; i++) ref[i] += exp(sc[j] - mx) / sum * v[(j * KV + g) * D + i];
            for (int i = 0; i < D; i++) assert_float_equal(out[(t * HQ + h) * D + i], ref[i], 2e-6);
        }
    expect_fail(moex_attention_forward_sinks(cache, 0, &a, 1, HQ, q, k, v, out, 1, -1, sinks), MOEX_ERR_INVALID_ARGUMENT,
                "window = -1", NULL, "negative window");
    moex_kv_cache_free(cache);
    end_problems();
}

/* DeepSeek-V3's absorbed latent attention against float64: the latent cache (a prefill of 5 rows, then
 * 2 more), every head over the shared latent rows, the values their first R entries; then kv_b's two
 * per-head products, in f32 and bf16 weights, with odd sizes; a plain cache and a bad value_dim refused. */
static void test_latent_attention(void **state) {
    (void)state;
    enum { T = 7, NH = 3, R = 5, ROPE = 4, W = R + ROPE, NOPE = 6, VD = 7 };
    ref_rng r;
    ref_rng_seed(&r, 77);
    float *q = frand(&r, T * NH * W, 1.0), *kv = frand(&r, T * W, 1.0), *out = fout(T * NH * R);
    moex_kv_cache *cache = NULL, *plain = NULL;
    assert_int_equal(moex_kv_cache_create_latent(2, 2, 16, W, &cache), MOEX_OK);
    assert_int_equal(moex_kv_cache_bytes(cache), (size_t)(2 * 2 * 16 * W) * sizeof(float));
    const float scale = 0.37f;
    const moex_attn_seq a = {1, 5, 0}, b = {1, 2, 5};
    assert_int_equal(moex_attention_forward_latent(cache, 1, &a, 1, NH, q, kv, R, scale, out, 2), MOEX_OK);
    assert_int_equal(moex_attention_forward_latent(cache, 1, &b, 1, NH, q + 5 * NH * W, kv + 5 * W, R, scale,
                                                   out + 5 * NH * R, 1), MOEX_OK);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            double sc[T], mx = -INFINITY, sum = 0.0, ref[R] = {0};
            for (int j = 0; j <= t; j++) {
                double dot = 0.0;
                for (int i = 0; i < W; i++) dot += (double)q[(t * NH + h) * W + i] * kv[j * W + i];
                sc[j] = dot * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j <= t; j++) sum += exp(sc[j] - mx);
            for (int j = 0; j <= t; j++)
                for (int i = 0; i < R; i++) ref[i] += exp(sc[j] - mx) / sum * kv[j * W + i];
            for (int i = 0; i < R; i++) assert_float_equal(out[(t * NH + h) * R + i], ref[i], 2e-6);
        }
    int64_t len = 0;
    assert_int_equal(moex_kv_cache_length(cache, 1, 1, &len), MOEX_OK);
    assert_int_equal(len, 7);
    expect_fail(moex_attention_forward_latent(cache, 1, &b, 1, NH, q, kv, W + 1, scale, out, 1),
                MOEX_ERR_INVALID_ARGUMENT, "value_dim = 10", NULL, "value_dim above the width");
    assert_int_equal(moex_kv_cache_create(1, 2, 8, 1, W, &plain), MOEX_OK);
    expect_fail(moex_attention_forward_latent(plain, 0, &a, 1, NH, q, kv, R, scale, out, 1), MOEX_ERR_INVALID_ARGUMENT,
                "not a latent cache", NULL, "a cache with values");
    expect_fail(moex_attention_forward_batch(cache, 0, &a, 1, NH, q, kv, kv, out, 1), MOEX_ERR_INVALID_ARGUMENT,
                "latent one", NULL, "plain attention on a latent cache");
    moex_kv_cache_free(plain);
    moex_kv_cache_free(cache);

    /* kv_b [NH * (NOPE + VD), R]: absorb q [T, NH, NOPE + ROPE] -> [T, NH, W], values [T, NH, R] -> [T, NH, VD] */
    const int64_t wn = NH * (NOPE + VD) * R;
    for (int bf = 0; bf < 2; bf++) {
        float *w = frand(&r, wn, 0.5);
        uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)wn);
        for (int64_t i = 0; i < wn; i++) w16[i] = moex_f32_to_bf16(w[i]), w[i] = bf ? moex_bf16_to_f32(w16[i]) : w[i];
        const moex_linear_w kvb = {bf ? (const void *)w16 : (const void *)w, bf ? MOEX_BF16 : MOEX_F32, NH * (NOPE + VD),
                                   R, NULL, MOEX_F32};
        float *qq = frand(&r, T * NH * (NOPE + ROPE), 1.0), *ql = fout(T * NH * W), *lat = frand(&r, T * NH * R, 1.0),
              *vo = fout(T * NH * VD);
        for (int64_t i = 0; i < T * NH * W; i++) ql[i] = 99.0f; /* the rope columns are left as they are */
        assert_int_equal(moex_mla_absorb(&kvb, NH, NOPE, VD, qq, NOPE + ROPE, T, ql, W, 2), MOEX_OK);
        assert_int_equal(moex_mla_values(&kvb, NH, NOPE, VD, lat, T, vo, 2), MOEX_OK);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                for (int c = 0; c < R; c++) {
                    double ref = 0.0;
                    for (int i = 0; i < NOPE; i++)
                        ref += (double)qq[(t * NH + h) * (NOPE + ROPE) + i] * w[(h * (NOPE + VD) + i) * R + c];
                    assert_float_equal(ql[(t * NH + h) * W + c], ref, 2e-6);
                }
                for (int c = R; c < W; c++) assert_float_equal(ql[(t * NH + h) * W + c], 99.0f, 0.0);
                for (int i = 0; i < VD; i++) {
                    double ref = 0.0;
                    for (int c = 0; c < R; c++)
                        ref += (double)w[(h * (NOPE + VD) + NOPE + i) * R + c] * lat[(t * NH + h) * R + c];
                    assert_float_equal(vo[(t * NH + h) * VD + i], ref, 2e-6);
                }
            }
        expect_fail(moex_mla_values(&kvb, NH + 1, NOPE, VD, lat, T, vo, 1), MOEX_ERR_INVALID_ARGUMENT,
                    "not 4 heads", NULL, "kv_b of another head count");
        free(w), free(w16), free(qq), free(ql), free(lat), free(vo);
    }
    free(q), free(kv), free(out);
    end_problems();
}

/* Interleaved pairs (deepseek_v3): x [2 tokens, 3 heads, 8] by hand in float64, the pairs'
 * results de-interleaved as transformers lays them out; head_dim > 512 refused. */
static void test_rope_interleaved(void **state) {
    (void)state;
    float inv[4], c[2 * 4], s[2 * 4], x[2 * 3 * 8], x0[2 * 3 * 8];
    assert_int_equal(moex_rope_inv_freq(8, 10000.0, inv), MOEX_OK);
    const int64_t pos[2] = {3, 11};
    assert_int_equal(moex_rope_cos_sin(inv, 8, pos, 2, c, s), MOEX_OK);
    for (int i = 0; i < 48; i++) x[i] = x0[i] = (float)((i * 29 % 17) - 8) / 5.0f;
    assert_int_equal(moex_rope_apply_interleaved(x, 2, 3, 8, c, s), MOEX_OK);
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < 3; h++) {
            const float *a = x0 + (t * 3 + h) * 8, *b = x + (t * 3 + h) * 8;
            for (int i = 0; i < 4; i++) {
                const double cs = c[t * 4 + i], sn = s[t * 4 + i], p = a[2 * i], q = a[2 * i + 1];
                assert_float_equal(b[i], p * cs - q * sn, 1e-6);
                assert_float_equal(b[4 + i], q * cs + p * sn, 1e-6);
            }
        }
    static float big[2 * 514];
    expect_fail(moex_rope_apply_interleaved(big, 1, 1, 514, c, s), MOEX_ERR_UNSUPPORTED, "head_dim = 514", NULL,
                "interleaved head_dim > 512");
    end_problems();
}

/* YaRN against the inverse frequencies and attention factors transformers computes
 * (tests/fixtures/rope/yarn.json, make_rope_fixtures.py: DeepSeek-V3's, GPT-OSS's without
 * truncation, mscale != mscale_all_dim, an odd small case): at most 1 ulp apart (PyTorch's
 * vectorised powf is within 1 ulp of the correctly rounded one moex uses), factors to 1e-15. */
static double read_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static void test_rope_yarn(void **state) {
    (void)state;
#ifndef MOEX_FIXTURES
#define MOEX_FIXTURES "tests/fixtures"
#endif
    FILE *f = fopen(MOEX_FIXTURES "/rope/yarn.json", "rb");
    assert_non_null(f);
    static char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    assert_true(cJSON_GetArraySize(cases) >= 4);
    for (const cJSON *c = cases->child; c; c = c->next) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const int64_t dim = (int64_t)read_num(c, "dim");
        moex_yarn_params y = {0};
        y.factor = read_num(c, "factor");
        y.original_max_position_embeddings = read_num(c, "original_max_position_embeddings");
        y.max_position_embeddings = read_num(c, "max_position_embeddings");
        y.beta_fast = read_num(c, "beta_fast");
        y.beta_slow = read_num(c, "beta_slow");
        y.mscale = read_num(c, "mscale");
        y.mscale_all_dim = read_num(c, "mscale_all_dim");
        y.attention_factor = read_num(c, "attention_factor_given");
        y.truncate = cJSON_IsTrue(cJSON_GetObjectItem(c, "truncate"));
        float inv[256];
        double af = -1.0;
        assert_true(dim <= 512);
        if (moex_rope_inv_freq_yarn(dim, read_num(c, "theta"), &y, inv, &af) != MOEX_OK) {
            PROBLEM("%s: %s", name, moex_last_error());
            continue;
        }
        const cJSON *want = cJSON_GetObjectItem(c, "inv_freq");
        int worst = 0;
        for (int64_t i = 0; i < dim / 2; i++) {
            const float w = (float)cJSON_GetArrayItem(want, (int)i)->valuedouble;
            int32_t a, b;
            memcpy(&a, &inv[i], 4);
            memcpy(&b, &w, 4);
            const int ulps = abs(a - b);
            if (ulps > worst) worst = ulps;
        }
        if (worst > 1) PROBLEM("%s: inv_freq up to %d ulp from transformers'", name, worst);
        if (fabs(af - read_num(c, "attention_factor")) > 1e-15)
            PROBLEM("%s: attention factor %.17g, transformers %.17g", name, af, read_num(c, "attention_factor"));
    }
    cJSON_Delete(root);
    moex_yarn_params bad = {0};
    float inv[8];
    double af;
    expect_fail(moex_rope_inv_freq_yarn(16, 10000.0, &bad, inv, &af), MOEX_ERR_INVALID_ARGUMENT,
                "original_max_position_embeddings = 0", NULL, "yarn without original_max_position_embeddings");
    bad.original_max_position_embeddings = 64;
    bad.factor = -2;
    expect_fail(moex_rope_inv_freq_yarn(16, 10000.0, &bad, inv, &af), MOEX_ERR_INVALID_ARGUMENT, "factor = -2", NULL,
                "yarn factor < 0");
    end_problems();
}

/* rope on q [T, 5, d] and k [T, 1, d] against the float64 rotation of transformers' f32 angles;
 * and, for small positions, against the exact-math angles (loosely) */
static void test_rope_reference(void **state) {
    (void)state;
    static const int64_t ds[2] = {8, 16}, Ts[3] = {1, 3, 17};
    static const double thetas[2] = {10000.0, 1000000.0};
    ref_rng r;
    ref_rng_seed(&r, 31);
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 3; ti++)
            for (int th = 0; th < 2; th++) {
                const int64_t d = ds[di], T = Ts[ti], half = d / 2;
                float inv[8];
                assert_int_equal(moex_rope_inv_freq(d, thetas[th], inv), MOEX_OK);
                for (int64_t i = 0; i < half; i++)
                    if ((double)inv[i] != ref_inv_freq(i, d, thetas[th]))
                        PROBLEM("inv_freq[%lld] d=%lld theta=%g: %.9g, want %.9g", (long long)i, (long long)d,
                                thetas[th], (double)inv[i], ref_inv_freq(i, d, thetas[th]));
                int64_t pos[17];
                for (int64_t t = 0; t < T; t++)
                    pos[t] = t == 0 ? 0 : t == 1 ? 100000 : t == 2 ? (1 << 25) + 3 : ref_rng_below(&r, 5000);
                float *c = fout(T * half), *s = fout(T * half);
                assert_int_equal(moex_rope_cos_sin(inv, d, pos, T, c, s), MOEX_OK);
                assert_true(guard_ok(c, T * half) && guard_ok(s, T * half));
                double *ang = malloc(sizeof(double) * (size_t)(T * half));
                for (int64_t t = 0; t < T; t++)
                    for (int64_t i = 0; i < half; i++) ang[t * half + i] = ref_angle(pos[t], inv[i]);
                for (int64_t heads = 1; heads <= 5; heads += 4) {
                    const int64_t n = T * heads * d;
                    float *x = frand(&r, n, 1.0);
                    double *ref = malloc(sizeof(double) * (size_t)n);
                    ref_rope(x, T, heads, d, ang, ref);
                    assert_int_equal(moex_rope_apply(x, T, heads, d, c, s), MOEX_OK);
                    double e = nmse(x, ref, n);
                    if (!(e <= NMSE_MAX))
                        PROBLEM("rope d=%lld T=%lld heads=%lld theta=%g: nmse %.3g", (long long)d, (long long)T,
                                (long long)heads, thetas[th], e);
                    assert_true(guard_ok(x, n));
                    free(x), free(ref);
                }
                /* the exact math (theta^(-2i/d) * pos in double) at positions < 5000: within 1e-4 */
                for (int64_t t = 0; t < T; t++) {
                    if (pos[t] >= 5000) continue;
                    for (int64_t i = 0; i < half; i++) {
                        double a = (double)pos[t] * pow(thetas[th], -2.0 * (double)i / (double)d);
                        if (fabs(cos(a) - c[t * half + i]) > 1e-4 || fabs(sin(a) - s[t * half + i]) > 1e-4)
                            PROBLEM("rope d=%lld pos=%lld i=%lld: far from the exact angle", (long long)d,
                                    (long long)pos[t], (long long)i);
                    }
                }
                free(c), free(s), free(ang);
            }
    end_problems();
}

/* apply_interleaved_mrope transcribed: freqs [3][T][half] -> freqs_t [T][half] */
static void ref_interleave(const double *freqs, int64_t T, int64_t half, const int64_t sec[3], double *out) {
    memcpy(out, freqs, sizeof(double) * (size_t)(T * half)); /* freqs_t = freqs[0] */
    for (int dim = 1; dim <= 2; dim++) {                    /* for dim, offset in enumerate((1, 2), start=1) */
        const int64_t offset = dim, length = sec[dim] * 3;
        for (int64_t t = 0; t < T; t++)
            for (int64_t idx = offset; idx < length && idx < half; idx += 3) /* slice(offset, length, 3) */
                out[t * half + idx] = freqs[(dim * T + t) * half + idx];
    }
}

static void test_mrope(void **state) {
    (void)state;
    static const int64_t cfg[][4] = {{16, 2, 3, 3}, {32, 6, 5, 5}, {32, 8, 4, 4}, {8, 4, 0, 0}};
    ref_rng r;
    ref_rng_seed(&r, 41);
    for (int ci = 0; ci < 4; ci++) {
        const int64_t d = cfg[ci][0], half = d / 2, sec[3] = {cfg[ci][1], cfg[ci][2], cfg[ci][3]};
        const int64_t T = 17;
        float inv[16];
        assert_int_equal(moex_rope_inv_freq(d, 5000000.0, inv), MOEX_OK);
        /* an image grid after some text: t fixed, h and w running */
        int64_t p3[3][17];
        for (int64_t t = 0; t < T; t++) {
            p3[0][t] = 7 + t / 6;
            p3[1][t] = 7 + (t / 3) % 2 + ref_rng_below(&r, 3);
            p3[2][t] = 7 + t % 3 + 1000 * (t == 16);
        }
        float *c = fout(T * half), *s = fout(T * half);
        assert_int_equal(moex_mrope_cos_sin(inv, d, sec, p3[0], p3[1], p3[2], T, c, s), MOEX_OK);
        assert_true(guard_ok(c, T * half) && guard_ok(s, T * half));
        double *freqs = malloc(sizeof(double) * (size_t)(3 * T * half)), *ft = malloc(sizeof(double) * (size_t)(T * half));
        for (int k = 0; k < 3; k++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < half; i++) freqs[(k * T + t) * half + i] = ref_angle(p3[k][t], inv[i]);
        ref_interleave(freqs, T, half, sec, ft);
        for (int64_t j = 0; j < T * half; j++)
            if (fabs(c[j] - cos(ft[j])) > 1e-7 || fabs(s[j] - sin(ft[j])) > 1e-7)
                PROBLEM("mrope d=%lld section [%lld %lld %lld]: entry %lld differs from the transcription",
                        (long long)d, (long long)sec[0], (long long)sec[1], (long long)sec[2], (long long)j);
        /* applied to q [T, 5, d] */
        const int64_t n = T * 5 * d;
        float *x = frand(&r, n, 1.0);
        double *ref = malloc(sizeof(double) * (size_t)n);
        ref_rope(x, T, 5, d, ft, ref);
        assert_int_equal(moex_rope_apply(x, T, 5, d, c, s), MOEX_OK);
        double e = nmse(x, ref, n);
        if (!(e <= NMSE_MAX)) PROBLEM("mrope apply d=%lld: nmse %.3g", (long long)d, e);
        /* text only: the three positions equal -> plain rope, bit for bit */
        float *c1 = fout(T * half), *s1 = fout(T * half);
        assert_int_equal(moex_mrope_cos_sin(inv, d, sec, p3[2], p3[2], p3[2], T, c, s), MOEX_OK);
        assert_int_equal(moex_rope_cos_sin(inv, d, p3[2], T, c1, s1), MOEX_OK);
        if (memcmp(c, c1, sizeof(float) * (size_t)(T * half)) || memcmp(s, s1, sizeof(float) * (size_t)(T * half)))
            PROBLEM("mrope with equal positions differs from rope (d=%lld)", (long long)d);
        free(c), free(s), free(c1), free(s1), free(freqs), free(ft), free(x), free(ref);
    }
    /* the real layout: head_dim 128, mrope_section [24, 20, 20]: h at 1, 4, .., 58; w at 2, 5, .., 59 */
    {
        float inv[64], c[64], s[64], cc[64], ss[64];
        const int64_t sec[3] = {24, 20, 20}, pt = 3, ph = 50, pw = 900;
        assert_int_equal(moex_rope_inv_freq(128, 5000000.0, inv), MOEX_OK);
        assert_int_equal(moex_mrope_cos_sin(inv, 128, sec, &pt, &ph, &pw, 1, c, s), MOEX_OK);
        int nt = 0, nh = 0, nw = 0;
        for (int i = 0; i < 64; i++) {
            int64_t want = (i % 3 == 1 && i <= 58) ? ph : (i % 3 == 2 && i <= 59) ? pw : pt;
            assert_int_equal(moex_rope_cos_sin(inv + i, 2, &want, 1, cc + i, ss + i), MOEX_OK);
            if (c[i] != cc[i] || s[i] != ss[i]) PROBLEM("mrope [24,20,20]: frequency %d uses the wrong position", i);
            nt += want == pt, nh += want == ph, nw += want == pw;
        }
        assert_int_equal(nt, 24);
        assert_int_equal(nh, 20);
        assert_int_equal(nw, 20);
    }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* attention with the cache                                                  */
/* ------------------------------------------------------------------------ */

/* Two sequences (lengths 21 and 5) fed in chunks, batched; against (a) one call per whole
 * sequence on a fresh cache, bit for bit, and (b) float64 causal attention. */
static void attention_case(int64_t heads, int64_t kv, int64_t d, int threads, ref_rng *r) {
    const int64_t L[2] = {21, 5}, S = 24;
    const int64_t chunks[2][3] = {{17, 3, 1}, {3, 1, 1}};
    float *q[2], *k[2], *v[2], *out_chunked[2], *out_whole[2];
    for (int i = 0; i < 2; i++) {
        q[i] = frand(r, L[i] * heads * d, 1.0);
        k[i] = frand(r, L[i] * kv * d, 1.0);
        v[i] = frand(r, L[i] * kv * d, 1.0);
        out_chunked[i] = fout(L[i] * heads * d);
        out_whole[i] = fout(L[i] * heads * d);
    }
    moex_kv_cache *cache = NULL, *fresh = NULL;
    assert_int_equal(moex_kv_cache_create(2, 3, S, kv, d, &cache), MOEX_OK);
    assert_int_equal(moex_kv_cache_create(2, 3, S, kv, d, &fresh), MOEX_OK);
    assert_int_equal(moex_kv_cache_bytes(cache), (size_t)(2 * 2 * 3 * S * kv * d * 4));

    /* chunked, both sequences in one batched call per step, in cache slots 2 and 0, layer 1 */
    int64_t past[2] = {0, 0};
    const int64_t slot[2] = {2, 0};
    for (int step = 0; step < 3; step++) {
        const int64_t T0 = chunks[0][step], T1 = chunks[1][step], tot = T0 + T1;
        float *qb = malloc(sizeof(float) * (size_t)(tot * heads * d)), *kb = malloc(sizeof(float) * (size_t)(tot * kv * d));
        float *vb = malloc(sizeof(float) * (size_t)(tot * kv * d)), *ob = fout(tot * heads * d);
        const int64_t Ts[2] = {T0, T1};
        int64_t row = 0;
        for (int i = 0; i < 2; i++) {
            memcpy(qb + row * heads * d, q[i] + past[i] * heads * d, sizeof(float) * (size_t)(Ts[i] * heads * d));
            memcpy(kb + row * kv * d, k[i] + past[i] * kv * d, sizeof(float) * (size_t)(Ts[i] * kv * d));
            memcpy(vb + row * kv * d, v[i] + past[i] * kv * d, sizeof(float) * (size_t)(Ts[i] * kv * d));
            row += Ts[i];
        }
        const moex_attn_seq seqs[2] = {{slot[0], T0, past[0]}, {slot[1], T1, past[1]}};
        moex_status st = moex_attention_forward_batch(cache, 1, seqs, 2, heads, qb, kb, vb, ob, threads);
        if (st) PROBLEM("attention batch step %d: %s", step, moex_last_error());
        assert_true(guard_ok(ob, tot * heads * d));
        row = 0;
        for (int i = 0; i < 2; i++) {
            memcpy(out_chunked[i] + past[i] * heads * d, ob + row * heads * d, sizeof(float) * (size_t)(Ts[i] * heads * d));
            row += Ts[i];
            past[i] += Ts[i];
            int64_t len = -1;
            assert_int_equal(moex_kv_cache_length(cache, 1, slot[i], &len), MOEX_OK);
            assert_int_equal(len, past[i]);
        }
        free(qb), free(kb), free(vb), free(ob);
    }
    int64_t len0 = -1;
    assert_int_equal(moex_kv_cache_length(cache, 0, 2, &len0), MOEX_OK);
    assert_int_equal(len0, 0); /* layer 0 untouched */

    /* whole sequences, one call each (the single-sequence API) */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(moex_attention_forward(fresh, 0, i, heads, q[i], k[i], v[i], L[i], 0, out_whole[i], threads),
                         MOEX_OK);
        if (memcmp(out_whole[i], out_chunked[i], sizeof(float) * (size_t)(L[i] * heads * d)))
            PROBLEM("attention heads=%lld kv=%lld d=%lld threads=%d: chunked with the cache differs from the whole "
                    "sequence",
                    (long long)heads, (long long)kv, (long long)d, threads);
        double *ref = malloc(sizeof(double) * (size_t)(L[i] * heads * d));
        ref_attention(q[i], k[i], v[i], L[i], heads, kv, d, ref);
        double e = nmse(out_chunked[i], ref, L[i] * heads * d);
        if (!(e <= NMSE_MAX))
            PROBLEM("attention heads=%lld kv=%lld d=%lld seq %d: nmse %.3g", (long long)heads, (long long)kv,
                    (long long)d, i, e);
        free(ref);
    }

    /* rewind sequence 0 to position 10 and feed token 10 again: the same output, length 11 */
    {
        float *o = fout(heads * d);
        assert_int_equal(moex_attention_forward(cache, 1, slot[0], heads, q[0] + 10 * heads * d, k[0] + 10 * kv * d,
                                                v[0] + 10 * kv * d, 1, 10, o, threads),
                         MOEX_OK);
        if (memcmp(o, out_chunked[0] + 10 * heads * d, sizeof(float) * (size_t)(heads * d)))
            PROBLEM("attention: rewinding to position 10 does not reproduce token 10");
        int64_t len = -1;
        assert_int_equal(moex_kv_cache_length(cache, 1, slot[0], &len), MOEX_OK);
        assert_int_equal(len, 11);
        /* out == q (in place) gives the same bits */
        float *qq = malloc(sizeof(float) * (size_t)(heads * d + GUARD));
        memcpy(qq, q[0] + 10 * heads * d, sizeof(float) * (size_t)(heads * d));
        assert_int_equal(moex_attention_forward(cache, 1, slot[0], heads, qq, k[0] + 10 * kv * d, v[0] + 10 * kv * d, 1,
                                                10, qq, threads),
                         MOEX_OK);
        if (memcmp(qq, o, sizeof(float) * (size_t)(heads * d))) PROBLEM("attention with out == q differs");
        free(o), free(qq);
    }
    assert_int_equal(moex_kv_cache_reset(cache, slot[0]), MOEX_OK);
    assert_int_equal(moex_kv_cache_length(cache, 1, slot[0], &len0), MOEX_OK);
    assert_int_equal(len0, 0);
    moex_kv_cache_free(cache);
    moex_kv_cache_free(fresh);
    for (int i = 0; i < 2; i++) free(q[i]), free(k[i]), free(v[i]), free(out_chunked[i]), free(out_whole[i]);
}

static void test_attention(void **state) {
    (void)state;
    static const int64_t cfg[][3] = {{5, 1, 8}, {5, 1, 16}, {4, 2, 16}, {3, 3, 8}, {6, 2, 12}};
    for (int c = 0; c < 5; c++)
        for (int threads = 1; threads <= 2; threads++) {
            ref_rng r;
            ref_rng_seed(&r, 51 + (uint64_t)c); /* the same data for both thread counts */
            attention_case(cfg[c][0], cfg[c][1], cfg[c][2], threads, &r);
        }
    /* threads 1 and 2 bitwise equal on one batched call */
    ref_rng r;
    ref_rng_seed(&r, 59);
    const int64_t heads = 5, kv = 1, d = 16, T = 17;
    float *q = frand(&r, T * heads * d, 1.0), *k = frand(&r, T * kv * d, 1.0), *v = frand(&r, T * kv * d, 1.0);
    float *o1 = fout(T * heads * d), *o2 = fout(T * heads * d);
    moex_kv_cache *c1, *c2;
    assert_int_equal(moex_kv_cache_create(1, 1, 17, kv, d, &c1), MOEX_OK);
    assert_int_equal(moex_kv_cache_create(1, 1, 17, kv, d, &c2), MOEX_OK);
    assert_int_equal(moex_attention_forward(c1, 0, 0, heads, q, k, v, T, 0, o1, 1), MOEX_OK);
    assert_int_equal(moex_attention_forward(c2, 0, 0, heads, q, k, v, T, 0, o2, 2), MOEX_OK);
    assert_memory_equal(o1, o2, sizeof(float) * (size_t)(T * heads * d));
    moex_kv_cache_free(c1), moex_kv_cache_free(c2);
    free(q), free(k), free(v), free(o1), free(o2);
    end_problems();
}

static void test_attention_errors(void **state) {
    (void)state;
    ref_rng r;
    ref_rng_seed(&r, 61);
    const int64_t heads = 4, kv = 2, d = 8, S = 8;
    float *q = frand(&r, 4 * heads * d, 1.0), *k = frand(&r, 4 * kv * d, 1.0), *v = frand(&r, 4 * kv * d, 1.0);
    float *out = fout(4 * heads * d);
    moex_kv_cache *c = NULL;
    assert_int_equal(moex_kv_cache_create(2, 2, S, kv, d, &c), MOEX_OK);
    float *o = fout(heads * d * 3);
    assert_int_equal(moex_attention_forward(c, 0, 1, heads, q, k, v, 3, 0, o, 1), MOEX_OK);
    assert_int_equal(moex_attention_forward(c, 0, 1, heads, q, k, v, 3, 3, o, 1), MOEX_OK); /* length 6 */

    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, 3, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "max_seq",
                NULL, "cache overflow");
    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, 1, 7, out, 1), MOEX_ERR_INVALID_ARGUMENT, "holds only",
                NULL, "past beyond the cache");
    expect_fail(moex_attention_forward(c, 0, 0, heads, q, k, v, 1, 1, out, 1), MOEX_ERR_INVALID_ARGUMENT, "past = 1",
                NULL, "past on an empty sequence");
    expect_fail(moex_attention_forward(c, 0, 1, 3, q, k, v, 1, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "multiple",
                NULL, "heads not a multiple of kv_heads");
    expect_fail(moex_attention_forward(c, 2, 1, heads, q, k, v, 1, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "layer = 2",
                NULL, "layer out of range");
    expect_fail(moex_attention_forward(c, 0, 2, heads, q, k, v, 1, 0, out, 1), MOEX_ERR_INVALID_ARGUMENT, "seq", NULL,
                "seq out of range");
    expect_fail(moex_attention_forward(c, 0, 1, heads, NULL, k, v, 1, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "q is NULL",
                NULL, "q NULL");
    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, 1, 6, NULL, 1), MOEX_ERR_INVALID_ARGUMENT, "out",
                NULL, "out NULL");
    expect_fail(moex_attention_forward(NULL, 0, 1, heads, q, k, v, 1, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "cache",
                NULL, "cache NULL");
    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, -1, 6, out, 1), MOEX_ERR_INVALID_ARGUMENT, "tokens",
                NULL, "negative T");
    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, 1, 6, out, -2), MOEX_ERR_INVALID_ARGUMENT, "threads",
                NULL, "negative threads");
    expect_fail(moex_attention_forward(c, 0, 1, heads, q, k, v, 1, 6, (float *)k, 1), MOEX_ERR_INVALID_ARGUMENT,
                "overlaps", NULL, "out overlapping k");
    const moex_attn_seq dup[2] = {{1, 1, 6}, {1, 1, 6}};
    expect_fail(moex_attention_forward_batch(c, 0, dup, 2, heads, q, k, v, out, 1), MOEX_ERR_INVALID_ARGUMENT, "twice",
                NULL, "a sequence twice");
    /* the second sequence is bad: the first is not written either */
    const moex_attn_seq mixed[2] = {{0, 1, 0}, {1, 3, 6}};
    expect_fail(moex_attention_forward_batch(c, 0, mixed, 2, heads, q, k, v, out, 1), MOEX_ERR_INVALID_ARGUMENT,
                "max_seq", NULL, "one bad sequence of two");
    if (!untouched(out, 4 * heads * d + GUARD)) PROBLEM("attention wrote its output on failure");
    int64_t len = -1;
    assert_int_equal(moex_kv_cache_length(c, 0, 1, &len), MOEX_OK);
    assert_int_equal(len, 6);
    assert_int_equal(moex_kv_cache_length(c, 0, 0, &len), MOEX_OK);
    assert_int_equal(len, 0);
    /* T = 0 is a no-op */
    assert_int_equal(moex_attention_forward(c, 0, 1, heads, NULL, NULL, NULL, 0, 6, NULL, 1), MOEX_OK);

    /* the cache itself */
    moex_kv_cache *bad = (moex_kv_cache *)&r;
    expect_fail(moex_kv_cache_create(0, 1, 1, 1, 1, &bad), MOEX_ERR_INVALID_ARGUMENT, "layers = 0", NULL,
                "cache with 0 layers");
    expect_fail(moex_kv_cache_create(1, 1, 1, 1, -4, &bad), MOEX_ERR_INVALID_ARGUMENT, "head_dim = -4", NULL,
                "cache with a negative head_dim");
    expect_fail(moex_kv_cache_create(1 << 20, 1 << 20, 1 << 20, 8, 128, &bad), MOEX_ERR_INVALID_ARGUMENT, "overflows",
                NULL, "cache too large");
    assert_ptr_equal(bad, (moex_kv_cache *)&r);
    expect_fail(moex_kv_cache_create(1, 1, 1, 1, 1, NULL), MOEX_ERR_INVALID_ARGUMENT, "out", NULL, "cache out NULL");
    expect_fail(moex_kv_cache_reset(c, 2), MOEX_ERR_INVALID_ARGUMENT, "seq = 2", NULL, "reset bad seq");
    expect_fail(moex_kv_cache_length(c, 0, 5, &len), MOEX_ERR_INVALID_ARGUMENT, "seq = 5", NULL, "length bad seq");
    assert_int_equal(moex_kv_cache_reset(c, -1), MOEX_OK);
    assert_int_equal(moex_kv_cache_length(c, 0, 1, &len), MOEX_OK);
    assert_int_equal(len, 0);
    moex_kv_cache_free(NULL);
    moex_kv_cache_free(c);
    free(q), free(k), free(v), free(out), free(o);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* activations and MLPs                                                      */
/* ------------------------------------------------------------------------ */

static void test_activations(void **state) {
    (void)state;
    float x[64], y[64 + GUARD];
    for (int i = 0; i < 64; i++) x[i] = (float)((i - 32) * 0.37);
    x[0] = -100.0f, x[63] = 100.0f, x[1] = 0.0f, x[2] = -1e-20f;
    static const moex_activation acts[4] = {MOEX_ACT_SILU, MOEX_ACT_GELU, MOEX_ACT_GELU_TANH, MOEX_ACT_RELU};
    for (int a = 0; a < 4; a++) {
        for (int i = 0; i < 64 + GUARD; i++) y[i] = SENTINEL;
        assert_int_equal(moex_activate(acts[a], x, y, 64), MOEX_OK);
        assert_true(guard_ok(y, 64));
        for (int i = 0; i < 64; i++) {
            double xi = x[i], want = 0;
            switch (acts[a]) {
            case MOEX_ACT_SILU: want = ref_silu(xi); break;
            case MOEX_ACT_GELU: want = 0.5 * xi * (1.0 + erf(xi / sqrt(2.0))); break;
            case MOEX_ACT_GELU_TANH:
                want = 0.5 * xi * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (xi + 0.044715 * xi * xi * xi)));
                break;
            default: want = xi > 0 ? xi : 0; break;
            }
            /* the gelus compute 1 + erf (or tanh) in f32 as PyTorch does: for x < 0 that sum cancels,
             * so their error is a few ulps of |x|, not of the result */
            const double tol = 1e-30 + 2e-6 * fabs(want) + (acts[a] == MOEX_ACT_SILU ? 0.0 : 2e-7 * fabs(xi));
            if (fabs(y[i] - want) > tol)
                PROBLEM("%s(%g) = %.9g, want %.9g", moex_activation_name(acts[a]), xi, (double)y[i], want);
        }
    }
    for (int i = 0; i < 64 + GUARD; i++) y[i] = SENTINEL;
    assert_int_equal(moex_sigmoid(x, y, 64), MOEX_OK);
    for (int i = 0; i < 64; i++)
        if (fabs(y[i] - ref_sigmoid(x[i])) > 1e-30 + 2e-6 * ref_sigmoid(x[i]))
            PROBLEM("sigmoid(%g) = %.9g, want %.9g", (double)x[i], (double)y[i], ref_sigmoid(x[i]));
    assert_true(guard_ok(y, 64));
    /* in place */
    float z[3] = {-1, 0, 2};
    assert_int_equal(moex_activate(MOEX_ACT_SILU, z, z, 3), MOEX_OK);
    assert_float_equal(z[2], ref_silu(2.0), 1e-6);
    expect_fail(moex_activate(MOEX_ACT_GPTOSS_CLAMP, x, y, 4), MOEX_ERR_INVALID_ARGUMENT, "gptoss_clamp", NULL,
                "a clamped activation");
    expect_fail(moex_activate((moex_activation)99, x, y, 4), MOEX_ERR_INVALID_ARGUMENT, "99", NULL, "activation 99");
    expect_fail(moex_sigmoid(NULL, y, 4), MOEX_ERR_INVALID_ARGUMENT, "x is NULL", NULL, "sigmoid x NULL");
    expect_fail(moex_sigmoid(x, y, -1), MOEX_ERR_INVALID_ARGUMENT, "n = -1", NULL, "sigmoid n < 0");
    end_problems();
}

/* x: [T, H] -> y: [T, H], the gated MLP in double (silu) */
static void ref_mlp(const float *x, int64_t T, int64_t H, int64_t I, const moex_mlp_w *m, double *y) {
    double *g = malloc(sizeof(double) * (size_t)(T * I)), *u = malloc(sizeof(double) * (size_t)(T * I));
    ref_linear(x, T, H, m->gate.weight, m->gate.dtype, I, NULL, g);
    ref_linear(x, T, H, m->up.weight, m->up.dtype, I, NULL, u);
    for (int64_t i = 0; i < T * I; i++) g[i] = ref_silu(g[i]) * u[i];
    /* down in double over the double h */
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < H; n++) {
            double s = 0;
            for (int64_t i = 0; i < I; i++) s += g[t * I + i] * ref_load(m->down.weight, m->down.dtype, n * I + i);
            y[t * H + n] = s;
        }
    free(g), free(u);
}

static void test_mlp(void **state) {
    (void)state;
    static const moex_dtype dts[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
    static const int64_t Ts[3] = {1, 3, 17};
    ref_rng r;
    ref_rng_seed(&r, 71);
    const int64_t H = 40, I = 24;
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 3; ti++) {
            const moex_dtype dt = dts[di];
            const int64_t T = Ts[ti];
            void *wg = wrand(&r, dt, I * H, 1.0 / sqrt((double)H)), *wu = wrand(&r, dt, I * H, 1.0 / sqrt((double)H));
            void *wd = wrand(&r, dt, H * I, 1.0 / sqrt((double)I)), *ws = wrand(&r, dt, H, 1.0 / sqrt((double)H));
            moex_mlp_w m = {{wg, dt, I, H, NULL, dt}, {wu, dt, I, H, NULL, dt}, {wd, dt, H, I, NULL, dt}, MOEX_ACT_SILU};
            moex_linear_w gate = {ws, dt, 1, H, NULL, dt};
            float *x = frand(&r, T * H, 1.0), *y1 = fout(T * H), *y2 = fout(T * H), *s1 = fout(T * H), *s2 = fout(T * H);
            double *ref = malloc(sizeof(double) * (size_t)(T * H)), *sref = malloc(sizeof(double) * (size_t)(T * H));
            assert_int_equal(moex_gated_mlp(&m, x, T, y1, 1), MOEX_OK);
            assert_int_equal(moex_gated_mlp(&m, x, T, y2, 2), MOEX_OK);
            assert_int_equal(moex_shared_expert(&m, &gate, x, T, s1, 1), MOEX_OK);
            assert_int_equal(moex_shared_expert(&m, &gate, x, T, s2, 2), MOEX_OK);
            ref_mlp(x, T, H, I, &m, ref);
            for (int64_t t = 0; t < T; t++) {
                double z = 0;
                for (int64_t i = 0; i < H; i++) z += (double)x[t * H + i] * ref_load(ws, dt, i);
                for (int64_t i = 0; i < H; i++) sref[t * H + i] = ref_sigmoid(z) * ref[t * H + i];
            }
            double e = nmse(y1, ref, T * H), es = nmse(s1, sref, T * H);
            if (!(e <= NMSE_MAX)) PROBLEM("gated_mlp %s T=%lld: nmse %.3g", dtn(dt), (long long)T, e);
            if (!(es <= NMSE_MAX)) PROBLEM("shared_expert %s T=%lld: nmse %.3g", dtn(dt), (long long)T, es);
            if (memcmp(y1, y2, sizeof(float) * (size_t)(T * H)) || memcmp(s1, s2, sizeof(float) * (size_t)(T * H)))
                PROBLEM("mlp %s T=%lld: threads 1 and 2 differ", dtn(dt), (long long)T);
            if (!guard_ok(y1, T * H) || !guard_ok(s1, T * H)) PROBLEM("mlp wrote past its output");

            /* bad shapes: nothing written */
            float *yb = fout(T * H);
            moex_mlp_w bad = m;
            bad.down.in_features = I + 1;
            expect_fail(moex_gated_mlp(&bad, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "down_proj", NULL,
                        "mlp down shape");
            bad = m;
            bad.up.out_features = I - 1;
            expect_fail(moex_gated_mlp(&bad, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "up_proj", NULL, "mlp up shape");
            bad = m;
            bad.down.weight = NULL;
            expect_fail(moex_gated_mlp(&bad, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "weight is NULL", NULL,
                        "mlp down NULL");
            bad = m;
            bad.act = MOEX_ACT_SWIGLU_LIMIT;
            expect_fail(moex_gated_mlp(&bad, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "swiglu_limit", NULL,
                        "mlp activation");
            moex_linear_w g2 = gate;
            g2.out_features = 2;
            expect_fail(moex_shared_expert(&m, &g2, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "shared_expert_gate",
                        NULL, "shared gate shape");
            expect_fail(moex_gated_mlp(&m, x, T, (float *)x, 1), MOEX_ERR_INVALID_ARGUMENT, "overlaps", NULL,
                        "mlp y == x");
            expect_fail(moex_gated_mlp(NULL, x, T, yb, 1), MOEX_ERR_INVALID_ARGUMENT, "NULL", NULL, "mlp NULL");
            if (!untouched(yb, T * H + GUARD)) PROBLEM("mlp wrote on failure");
            free(yb);
            free(wg), free(wu), free(wd), free(ws), free(x), free(y1), free(y2), free(s1), free(s2), free(ref), free(sref);
        }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* bad inputs of linear, norm, rope                                          */
/* ------------------------------------------------------------------------ */

static void test_bad_inputs(void **state) {
    (void)state;
    ref_rng r;
    ref_rng_seed(&r, 81);
    const int64_t K = 40, N = 5, T = 3;
    uint16_t *W = wrand(&r, MOEX_BF16, N * K + 1, 0.1);
    float *x = frand(&r, T * K, 1.0), *y = fout(T * N);
    moex_linear_w w = {W, MOEX_BF16, N, K, NULL, MOEX_F32}, b;
    b = w, b.dtype = MOEX_E4M3;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "e4m3", NULL, "linear fp8 weight");
    b = w, b.out_features = 0;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "[0, 40]", NULL, "linear N = 0");
    b = w, b.weight = (const char *)W + 1;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "aligned", NULL, "linear misaligned weight");
    b = w, b.weight = NULL;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "weight is NULL", NULL, "linear NULL weight");
    b = w, b.bias = W, b.bias_dtype = MOEX_I32;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "bias dtype", NULL, "linear bias dtype");
    b = w, b.in_features = INT64_MAX / 2;
    expect_fail(moex_linear(&b, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "overflows", NULL, "linear overflow");
    expect_fail(moex_linear(NULL, x, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "NULL", NULL, "linear NULL w");
    expect_fail(moex_linear(&w, NULL, T, y, 1), MOEX_ERR_INVALID_ARGUMENT, "x is NULL", NULL, "linear NULL x");
    expect_fail(moex_linear(&w, x, T, NULL, 1), MOEX_ERR_INVALID_ARGUMENT, "y is NULL", NULL, "linear NULL y");
    expect_fail(moex_linear(&w, x, -1, y, 1), MOEX_ERR_INVALID_ARGUMENT, "T = -1", NULL, "linear T < 0");
    expect_fail(moex_linear(&w, x, T, y, -1), MOEX_ERR_INVALID_ARGUMENT, "threads = -1", NULL, "linear threads < 0");
    expect_fail(moex_linear(&w, x, T, x + 1, 1), MOEX_ERR_INVALID_ARGUMENT, "overlaps", NULL, "linear y overlaps x");
    assert_int_equal(moex_linear(&w, NULL, 0, NULL, 1), MOEX_OK); /* T = 0 */
    if (!untouched(y, T * N + GUARD)) PROBLEM("linear wrote on failure");

    expect_fail(moex_embedding(W, MOEX_BF16, 0, K, NULL, 0, NULL), MOEX_ERR_INVALID_ARGUMENT, "[0, 40]", NULL,
                "embedding V = 0");
    expect_fail(moex_embedding(W, MOEX_I64, N, K, NULL, 0, NULL), MOEX_ERR_INVALID_ARGUMENT, "i64", NULL,
                "embedding dtype");
    const int64_t id = 1;
    expect_fail(moex_embedding(W, MOEX_BF16, N, K, &id, 1, NULL), MOEX_ERR_INVALID_ARGUMENT, "out is NULL", NULL,
                "embedding out NULL");

    float *z = fout(T * K);
    expect_fail(moex_rmsnorm(x, T, K, NULL, MOEX_F32, 1e-6, z), MOEX_ERR_INVALID_ARGUMENT, "weight is NULL", NULL,
                "rmsnorm NULL weight");
    expect_fail(moex_rmsnorm(x, T, 0, W, MOEX_BF16, 1e-6, z), MOEX_ERR_INVALID_ARGUMENT, "row size 0", NULL,
                "rmsnorm n = 0");
    expect_fail(moex_rmsnorm(x, T, K, W, MOEX_BF16, -1.0, z), MOEX_ERR_INVALID_ARGUMENT, "eps = -1", NULL,
                "rmsnorm eps < 0");
    expect_fail(moex_rmsnorm(x, T, K, W, MOEX_BF16, NAN, z), MOEX_ERR_INVALID_ARGUMENT, "eps", NULL, "rmsnorm eps NaN");
    expect_fail(moex_rmsnorm(x, T, K, W, MOEX_BF16, 1e-6, x + 1), MOEX_ERR_INVALID_ARGUMENT, "overlaps", NULL,
                "rmsnorm partial overlap");
    expect_fail(moex_rmsnorm(x, T, K, W, MOEX_BF16, 1e-6, NULL), MOEX_ERR_INVALID_ARGUMENT, "y is NULL", NULL,
                "rmsnorm y NULL");
    expect_fail(moex_rmsnorm_heads(x, T, 0, 8, W, MOEX_BF16, 1e-6, z), MOEX_ERR_INVALID_ARGUMENT, "heads = 0", NULL,
                "rmsnorm_heads heads = 0");
    if (!untouched(z, T * K + GUARD)) PROBLEM("rmsnorm wrote on failure");

    float inv[8] = {0}, c[8], s[8];
    expect_fail(moex_rope_inv_freq(7, 10000.0, inv), MOEX_ERR_INVALID_ARGUMENT, "head_dim = 7", NULL, "rope odd d");
    expect_fail(moex_rope_inv_freq(8, 0.0, inv), MOEX_ERR_INVALID_ARGUMENT, "theta = 0", NULL, "rope theta 0");
    expect_fail(moex_rope_inv_freq(8, INFINITY, inv), MOEX_ERR_INVALID_ARGUMENT, "theta", NULL, "rope theta inf");
    expect_fail(moex_rope_inv_freq(8, 10000.0, NULL), MOEX_ERR_INVALID_ARGUMENT, "inv_freq is NULL", NULL,
                "rope inv NULL");
    assert_int_equal(moex_rope_inv_freq(8, 10000.0, inv), MOEX_OK);
    const int64_t pos[2] = {3, -1};
    expect_fail(moex_rope_cos_sin(inv, 8, pos, 2, c, s), MOEX_ERR_INVALID_ARGUMENT, "positions[1] = -1", NULL,
                "rope negative position");
    expect_fail(moex_rope_cos_sin(inv, 8, NULL, 1, c, s), MOEX_ERR_INVALID_ARGUMENT, "positions is NULL", NULL,
                "rope positions NULL");
    expect_fail(moex_rope_cos_sin(inv, 8, pos, 1, c, NULL), MOEX_ERR_INVALID_ARGUMENT, "sin is NULL", NULL,
                "rope sin NULL");
    const int64_t sec_bad[3] = {2, 1, 0}, sec_neg[3] = {5, -1, 0};
    expect_fail(moex_mrope_cos_sin(inv, 8, sec_bad, pos, pos, pos, 1, c, s), MOEX_ERR_INVALID_ARGUMENT,
                "[2, 1, 0]", NULL, "mrope section sum");
    expect_fail(moex_mrope_cos_sin(inv, 8, sec_neg, pos, pos, pos, 1, c, s), MOEX_ERR_INVALID_ARGUMENT,
                "[5, -1, 0]", NULL, "mrope negative section");
    expect_fail(moex_mrope_cos_sin(inv, 8, NULL, pos, pos, pos, 1, c, s), MOEX_ERR_INVALID_ARGUMENT, "mrope_section",
                NULL, "mrope section NULL");
    const int64_t sec[3] = {2, 1, 1};
    expect_fail(moex_mrope_cos_sin(inv, 8, sec, pos, pos, pos + 1, 1, c, s), MOEX_ERR_INVALID_ARGUMENT,
                "pos_w[0] = -1", NULL, "mrope negative w position");
    expect_fail(moex_rope_apply(x, T, 1, 8, NULL, s), MOEX_ERR_INVALID_ARGUMENT, "cos is NULL", NULL, "rope cos NULL");
    expect_fail(moex_rope_apply(x, T, 1, 0, c, s), MOEX_ERR_INVALID_ARGUMENT, "head_dim = 0", NULL, "rope d = 0");
    free(W), free(x), free(y), free(z);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* sampling                                                                  */
/* ------------------------------------------------------------------------ */

static void test_greedy(void **state) {
    (void)state;
    int64_t tok = -7;
    const float a[4] = {1, 3, 3, 2};
    assert_int_equal(moex_sample_greedy(a, 4, &tok), MOEX_OK);
    assert_int_equal(tok, 1); /* the first of two maxima */
    const float b[3] = {-INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(moex_sample_greedy(b, 3, &tok), MOEX_OK);
    assert_int_equal(tok, 0);
    /* a NaN logit: no token is meaningful, an error names it and *token is left alone */
    const float c[4] = {1, 5, NAN, 9}, all_nan[2] = {NAN, NAN};
    tok = -7;
    expect_fail(moex_sample_greedy(c, 4, &tok), MOEX_ERR_INVALID_ARGUMENT, "logits[2] is NaN", NULL, "greedy NaN");
    expect_fail(moex_sample_greedy(all_nan, 2, &tok), MOEX_ERR_INVALID_ARGUMENT, "logits[0] is NaN", NULL,
                "greedy all NaN");
    assert_int_equal(tok, -7);
    const float d[5] = {-1, 0.5f, 7, 7, 7};
    assert_int_equal(moex_sample_greedy(d, 5, &tok), MOEX_OK);
    assert_int_equal(tok, 2);
    /* temperature 0 = greedy, and the generator does not move */
    moex_rng g, g0;
    moex_rng_seed(&g, 5);
    g0 = g;
    moex_sampling p = moex_sampling_default();
    p.temperature = 0;
    assert_int_equal(moex_sample(d, 5, &p, &g, &tok), MOEX_OK);
    assert_int_equal(tok, 2);
    assert_memory_equal(&g, &g0, sizeof g);
    tok = -7;
    expect_fail(moex_sample_greedy(a, 0, &tok), MOEX_ERR_INVALID_ARGUMENT, "V = 0", NULL, "greedy V = 0");
    expect_fail(moex_sample_greedy(NULL, 4, &tok), MOEX_ERR_INVALID_ARGUMENT, "logits is NULL", NULL, "greedy NULL");
    assert_int_equal(tok, -7);
    end_problems();
}

static void test_rng(void **state) {
    (void)state;
    moex_rng a, b, c;
    assert_int_equal(moex_rng_seed(&a, 0), MOEX_OK);
    /* splitmix64 from 0: the published first output */
    assert_true(a.s[0] == 0xe220a8397b1dcdafull);
    moex_rng_seed(&a, 42), moex_rng_seed(&b, 42), moex_rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = moex_rng_next(&a), y = moex_rng_next(&b), z = moex_rng_next(&c);
        assert_true(x == y);
        same_c += x == z;
    }
    assert_true(same_c == 0);
    double lo = 1, hi = 0, mean = 0;
    for (int i = 0; i < 10000; i++) {
        double u = moex_rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
        lo = u < lo ? u : lo, hi = u > hi ? u : hi, mean += u / 10000;
    }
    assert_true(lo < 0.001 && hi > 0.999 && fabs(mean - 0.5) < 0.01);
    expect_fail(moex_rng_seed(NULL, 1), MOEX_ERR_INVALID_ARGUMENT, "rng is NULL", NULL, "seed NULL");
    end_problems();
}

/* The warpers transcribed in double: logits [V] -> probs [V] (temperature > 0). Returns the kept count. */
static int64_t ref_warp(const float *logits, int64_t V, double temp, int64_t top_k, double top_p, double *probs) {
    double *s = malloc(sizeof(double) * (size_t)V);
    int64_t *ord = malloc(sizeof(int64_t) * (size_t)V);
    for (int64_t i = 0; i < V; i++) s[i] = (double)(logits[i] / (float)temp), ord[i] = i;
    /* order: descending score, then ascending index (insertion sort: V is small) */
    for (int64_t i = 1; i < V; i++)
        for (int64_t j = i; j > 0 && (s[ord[j]] > s[ord[j - 1]] || (s[ord[j]] == s[ord[j - 1]] && ord[j] < ord[j - 1])); j--) {
            int64_t t = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = t;
        }
    if (top_k > 0 && top_k < V) {
        double thr = s[ord[top_k - 1]];
        for (int64_t i = 0; i < V; i++)
            if (s[i] < thr) s[i] = -INFINITY;
    }
    if (top_p < 1.0) {
        double m = s[ord[0]], sum = 0, cum = 0;
        for (int64_t i = 0; i < V; i++) sum += s[i] == -INFINITY ? 0 : exp(s[i] - m);
        for (int64_t j = V - 1; j > 0; j--) { /* ascending */
            int64_t i = ord[j];
            cum += s[i] == -INFINITY ? 0 : exp(s[i] - m) / sum;
            if (cum <= 1.0 - top_p) s[i] = -INFINITY;
            else break;
        }
    }
    double m = s[ord[0]], sum = 0;
    int64_t kept = 0;
    for (int64_t i = 0; i < V; i++) sum += s[i] == -INFINITY ? 0 : exp(s[i] - m);
    for (int64_t i = 0; i < V; i++) {
        probs[i] = s[i] == -INFINITY ? 0 : exp(s[i] - m) / sum;
        kept += s[i] != -INFINITY;
    }
    free(s), free(ord);
    return kept;
}

static void test_sampling_probs(void **state) {
    (void)state;
    /* by hand: top_k 3 keeps the tie at the third value */
    {
        const float l[6] = {2.0f, 1.0f, 0.5f, 0.5f, -1.0f, -INFINITY};
        float p[6 + GUARD];
        for (int i = 0; i < 6 + GUARD; i++) p[i] = SENTINEL;
        moex_sampling sp = {0.7, 3, 1.0};
        assert_int_equal(moex_sampling_probs(l, 6, &sp, p), MOEX_OK);
        assert_true(guard_ok(p, 6));
        double z = 0, e[4];
        for (int i = 0; i < 4; i++) z += e[i] = exp((double)(l[i] / 0.7f));
        for (int i = 0; i < 4; i++) assert_float_equal(p[i], e[i] / z, 1e-6);
        assert_true(p[4] == 0.0f && p[5] == 0.0f);
    }
    /* by hand: top_p on probabilities 0.5, 0.3, 0.2 */
    {
        const float l[3] = {logf(0.2f), logf(0.5f), logf(0.3f)};
        float p[3];
        moex_sampling sp = {1.0, 0, 0.75};
        assert_int_equal(moex_sampling_probs(l, 3, &sp, p), MOEX_OK); /* 0.5 + 0.3 >= 0.75 */
        assert_true(p[0] == 0.0f);
        assert_float_equal(p[1], 0.625, 1e-6);
        assert_float_equal(p[2], 0.375, 1e-6);
        sp.top_p = 0.85; /* needs all three */
        assert_int_equal(moex_sampling_probs(l, 3, &sp, p), MOEX_OK);
        assert_float_equal(p[0], 0.2, 1e-6);
        sp.top_p = 0.45; /* the largest alone */
        assert_int_equal(moex_sampling_probs(l, 3, &sp, p), MOEX_OK);
        assert_true(p[0] == 0.0f && p[1] == 1.0f && p[2] == 0.0f);
        sp.top_p = 0.0; /* always at least one token */
        assert_int_equal(moex_sampling_probs(l, 3, &sp, p), MOEX_OK);
        assert_true(p[1] == 1.0f);
    }
    /* exact boundaries (the probabilities are binary fractions): a running sum equal to
     * 1 - top_p is dropped (cumulative_probs <= 1 - top_p); among equal scores the lower index stays */
    {
        const float eq[4] = {0, 0, 0, 0};
        float p[4];
        moex_sampling sp = {1.0, 0, 0.5};
        assert_int_equal(moex_sampling_probs(eq, 2, &sp, p), MOEX_OK);
        assert_true(p[0] == 1.0f && p[1] == 0.0f);
        assert_int_equal(moex_sampling_probs(eq, 4, &sp, p), MOEX_OK);
        assert_true(p[0] == 0.5f && p[1] == 0.5f && p[2] == 0.0f && p[3] == 0.0f);
        sp.top_p = 0.25;
        assert_int_equal(moex_sampling_probs(eq, 4, &sp, p), MOEX_OK);
        assert_true(p[0] == 1.0f && p[1] == 0.0f && p[2] == 0.0f && p[3] == 0.0f);
        sp.top_p = 0.75; /* 1 - 0.75 = 0.25: only the first quarter goes */
        assert_int_equal(moex_sampling_probs(eq, 4, &sp, p), MOEX_OK);
        assert_true(p[3] == 0.0f && p[2] != 0.0f);
    }
    /* against the transcription: random logits, many settings */
    ref_rng r;
    ref_rng_seed(&r, 91);
    static const double temps[3] = {1.0, 0.7, 1.6};
    static const int64_t ks[4] = {0, 1, 5, 60};
    static const double ps[4] = {1.0, 0.9, 0.5, 0.05};
    const int64_t V = 50;
    float l[50], p[50];
    double ref[50];
    int cases = 0;
    for (int rep = 0; rep < 4; rep++) {
        for (int i = 0; i < V; i++) l[i] = (float)(2.5 * ref_rng_normal(&r));
        if (rep == 3) l[7] = l[9] = l[11], l[3] = -INFINITY; /* ties and a masked token */
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 4; c++) {
                    moex_sampling sp = {temps[a], ks[b], ps[c]};
                    assert_int_equal(moex_sampling_probs(l, V, &sp, p), MOEX_OK);
                    ref_warp(l, V, temps[a], ks[b], ps[c], ref);
                    double tot = 0;
                    for (int i = 0; i < V; i++) {
                        tot += p[i];
                        if ((p[i] == 0) != (ref[i] == 0) || fabs(p[i] - ref[i]) > 1e-6 + 1e-5 * ref[i])
                            PROBLEM("probs rep %d T=%g k=%lld p=%g: token %d: %.9g, want %.9g", rep, temps[a],
                                    (long long)ks[b], ps[c], i, (double)p[i], ref[i]);
                    }
                    if (fabs(tot - 1) > 1e-5) PROBLEM("probs sum to %.9g", tot);
                    cases++;
                }
    }
    assert_int_equal(cases, 192);
    end_problems();
}

static void test_sample(void **state) {
    (void)state;
    ref_rng r;
    ref_rng_seed(&r, 101);
    const int64_t V = 50;
    float l[50];
    for (int i = 0; i < V; i++) l[i] = (float)(2.0 * ref_rng_normal(&r));
    moex_sampling sp = {0.8, 20, 0.9};
    /* same seed -> same tokens; another seed -> another stream */
    int64_t a[200], b[200], c[200];
    moex_rng ga, gb, gc;
    moex_rng_seed(&ga, 7), moex_rng_seed(&gb, 7), moex_rng_seed(&gc, 8);
    int diff = 0;
    float probs[50];
    assert_int_equal(moex_sampling_probs(l, V, &sp, probs), MOEX_OK);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(moex_sample(l, V, &sp, &ga, &a[i]), MOEX_OK);
        assert_int_equal(moex_sample(l, V, &sp, &gb, &b[i]), MOEX_OK);
        assert_int_equal(moex_sample(l, V, &sp, &gc, &c[i]), MOEX_OK);
        assert_true(a[i] == b[i]);
        assert_true(a[i] >= 0 && a[i] < V && probs[a[i]] > 0);
        diff += a[i] != c[i];
    }
    assert_true(diff > 20);
    /* top_k 1 is the argmax whatever the seed */
    moex_sampling k1 = {1.3, 1, 1.0};
    int64_t best, t;
    assert_int_equal(moex_sample_greedy(l, V, &best), MOEX_OK);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(moex_sample(l, V, &k1, &gc, &t), MOEX_OK);
        assert_int_equal(t, best);
    }
    /* frequencies: probabilities 0.1, 0.2, 0.3, 0.4 */
    const float f[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    moex_sampling plain = moex_sampling_default();
    int count[4] = {0};
    moex_rng g;
    moex_rng_seed(&g, 2024);
    const int draws = 40000;
    for (int i = 0; i < draws; i++) {
        assert_int_equal(moex_sample(f, 4, &plain, &g, &t), MOEX_OK);
        count[t]++;
    }
    for (int i = 0; i < 4; i++)
        if (fabs((double)count[i] / draws - 0.1 * (i + 1)) > 0.015)
            PROBLEM("token %d drawn %d times in %d, want about %.0f", i, count[i], draws, 0.1 * (i + 1) * draws);
    /* top_p 0.65 keeps 0.4 and 0.3 only: 4/7 and 3/7 */
    moex_sampling nucleus = {1.0, 0, 0.65};
    memset(count, 0, sizeof count);
    for (int i = 0; i < draws; i++) {
        assert_int_equal(moex_sample(f, 4, &nucleus, &g, &t), MOEX_OK);
        count[t]++;
    }
    if (count[0] || count[1]) PROBLEM("top_p 0.65 drew removed tokens (%d, %d)", count[0], count[1]);
    if (fabs((double)count[3] / draws - 4.0 / 7.0) > 0.015) PROBLEM("top_p 0.65: token 3 drawn %d times", count[3]);

    /* bad input: status, message, token and generator untouched */
    moex_rng g0 = g;
    t = -9;
    moex_sampling bad = sp;
    bad.temperature = -1;
    expect_fail(moex_sample(l, V, &bad, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "temperature = -1", NULL, "temperature < 0");
    bad.temperature = NAN;
    expect_fail(moex_sample(l, V, &bad, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "temperature", NULL, "temperature NaN");
    bad = sp, bad.top_k = -3;
    expect_fail(moex_sample(l, V, &bad, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "top_k = -3", NULL, "top_k < 0");
    bad = sp, bad.top_p = 1.5;
    expect_fail(moex_sample(l, V, &bad, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "top_p = 1.5", NULL, "top_p > 1");
    bad = sp, bad.top_p = NAN;
    expect_fail(moex_sample(l, V, &bad, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "top_p", NULL, "top_p NaN");
    float ln[4] = {0, NAN, 1, 2};
    expect_fail(moex_sample(ln, 4, &sp, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "logits[1] is NaN", NULL, "NaN logit");
    ln[1] = INFINITY;
    expect_fail(moex_sample(ln, 4, &sp, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "logits[1] is +inf", NULL, "+inf logit");
    const float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    expect_fail(moex_sample(all_masked, 3, &sp, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "-inf", NULL, "all -inf");
    moex_sampling tiny = {1e-30, 0, 1.0};
    const float big[2] = {3e38f, 0};
    expect_fail(moex_sample(big, 2, &tiny, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "overflows", NULL,
                "logit / temperature overflows");
    expect_fail(moex_sample(l, V, &sp, NULL, &t), MOEX_ERR_INVALID_ARGUMENT, "rng is NULL", NULL, "rng NULL");
    expect_fail(moex_sample(l, V, NULL, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "params is NULL", NULL, "params NULL");
    expect_fail(moex_sample(l, V, &sp, &g, NULL), MOEX_ERR_INVALID_ARGUMENT, "token is NULL", NULL, "token NULL");
    expect_fail(moex_sample(l, 0, &sp, &g, &t), MOEX_ERR_INVALID_ARGUMENT, "V = 0", NULL, "V = 0");
    float pr[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    ln[1] = NAN;
    expect_fail(moex_sampling_probs(ln, 4, &sp, pr), MOEX_ERR_INVALID_ARGUMENT, "NaN", NULL, "probs NaN logit");
    expect_fail(moex_sampling_probs(l, 4, &sp, NULL), MOEX_ERR_INVALID_ARGUMENT, "probs is NULL", NULL, "probs NULL");
    assert_true(pr[0] == SENTINEL && pr[3] == SENTINEL);
    assert_int_equal(t, -9);
    assert_memory_equal(&g, &g0, sizeof g);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* the step's op table on the CPU (decoder/ops.h) and the shared activations */
/* ------------------------------------------------------------------------ */

/* The ops that are the table's own (not a decoder.h call): positions, the last rows, argmax
 * (a NaN row marked -1 - index, as on the device), the residual add, bf16 rounding, the shared
 * expert's gate; and linear/activation.h's functions equal to moex_activate's bit for bit. */
static void test_ops_cpu(void **state) {
    (void)state;
    const moex_decoder_env e = {&moex_decoder_ops_cpu, {MOEX_DEVICE_CPU, 0}, 1, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    const moex_decoder_ops *op = e.ops;
    const moex_attn_seq seqs[3] = {{0, 2, 5}, {2, 0, 3}, {1, 3, 0}};
    int64_t pos[7];
    assert_int_equal(op->positions(&e, seqs, 3, 7, pos), MOEX_OK);
    const int64_t want_pos[7] = {5, 6, 0, 1, 2, 0, 0};
    assert_memory_equal(pos, want_pos, sizeof pos);
    float x[5 * 2], last[3 * 2];
    for (int i = 0; i < 10; i++) x[i] = (float)i;
    assert_int_equal(op->gather_last_rows(&e, x, 2, seqs, 3, last), MOEX_OK);
    const float want_last[6] = {2, 3, 0, 0, 8, 9};
    assert_memory_equal(last, want_last, sizeof last);
    const float lg[3 * 4] = {1, 3, 3, 2, -INFINITY, -1, -2, -1, 0, 1, NAN, 5};
    int64_t tok[3];
    assert_int_equal(op->argmax(&e, lg, 3, 4, tok), MOEX_OK);
    assert_true(tok[0] == 1 && tok[1] == 1 && tok[2] == -3);
    float a[3] = {1.0f, 1e-8f, -2.5f}, b[3] = {2.0f, 1.0f, 0.5f};
    assert_int_equal(op->add(&e, a, b, a, 3), MOEX_OK);
    assert_true(a[0] == 3.0f && a[1] == 1.0f + 1e-8f && a[2] == -2.0f);
    float r[2] = {1.00390625f /* 1 + 2^-8: a bf16 tie, to even */, 1.01171875f};
    assert_int_equal(op->round_bf16(&e, r, 2), MOEX_OK);
    assert_true(r[0] == 1.0f && r[1] == 1.015625f);
    const float gl[2] = {0.0f, -1.5f};
    float y[2 * 3] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(op->scale_rows_sigmoid(&e, gl, y, 2, 3), MOEX_OK);
    volatile float v15 = 1.5f, v7 = 7.0f, va = -1.702f; /* computed at run time, as in the library */
    const float s1 = 1.0f / (1.0f + expf(v15));
    assert_true(y[0] == 0.5f && y[2] == 1.5f && y[3] == s1 * 4.0f && y[5] == s1 * 6.0f);
    /* the header's functions are what moex_activate computes */
    static const moex_activation acts[4] = {MOEX_ACT_SILU, MOEX_ACT_GELU, MOEX_ACT_GELU_TANH, MOEX_ACT_RELU};
    float in[9] = {-30.0f, -3.7f, -0.5f, -1e-20f, 0.0f, 0.3f, 2.0f, 11.0f, NAN}, out[9];
    for (int k = 0; k < 4; k++) {
        assert_int_equal(moex_activate(acts[k], in, out, 9), MOEX_OK);
        for (int i = 0; i < 9; i++) {
            const float h = moex_act_plain(acts[k], in[i]);
            if (memcmp(&h, &out[i], sizeof h) != 0)
                PROBLEM("%s(%g): header %.9g, moex_activate %.9g", moex_activation_name(acts[k]), (double)in[i],
                        (double)h, (double)out[i]);
        }
    }
    assert_true(isnan(moex_act_relu(NAN)) && moex_act_relu(-0.0f) == 0.0f && !signbit(moex_act_relu(-0.0f)));
    /* the clamped kinds: min(g, limit), clamp(u, +-limit) */
    volatile float v9 = 9.0f, vm9 = -9.0f, alpha = 1.702f;
    assert_true(moex_act_swiglu_limit(v9, vm9, v7) == moex_act_silu(v7) * -7.0f);
    assert_true(moex_act_gptoss_clamp(v9, v9, alpha, v7) == 8.0f * (7.0f / (1.0f + expf(va * v7))));
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_lm_head_tied),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_by_hand),
        cmocka_unit_test(test_rope_reference),
        cmocka_unit_test(test_rope_partial),
        cmocka_unit_test(test_rope_yarn),
        cmocka_unit_test(test_rope_interleaved),
        cmocka_unit_test(test_attention_sinks_window),
        cmocka_unit_test(test_latent_attention),
        cmocka_unit_test(test_mrope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_errors),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_sampling_probs),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_ops_cpu),
    };
    return cmocka_run_group_tests_name("decoder", tests, NULL, NULL);
}
