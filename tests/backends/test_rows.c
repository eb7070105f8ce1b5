/* test_rows.c — a test-only built-in backend: the simplest implementation a row of the
 * dispatch table (src/backends/table.c) can point to. For each token, for each of its k
 * slots, the expert's gate/up projection, the activation and the down projection, in f32,
 * read element by element from the layer description through the weight views of
 * experts/experts_internal.h (every layout: concatenated, interleaved, ungated, transposed,
 * per-expert pointers; f32/f16/bf16, and e4m3/e2m1 codes times their block scales with the
 * activations quantized dynamically as the other CPU backends do). Sequential, so the result
 * does not depend on the thread count. Slow: for tests only.
 *
 * It is compiled only into the test copy of the library (MOEX_TEST_BACKENDS=1, see the tests
 * section of CMakeLists.txt): adding a built-in backend touches this file, its table row and
 * BUILTINS entry, and its line of documentation. */
#include "backends/cpu/common.h" /* moex_cpu_layer_supports: the CPU's condition on quantized layers */
#include "backends/impl.h"
#include <stdint.h>

/* Floats of scratch: x [H], gate_up [R], gate [I], up [I], h [I], acc [H]. */
static int scratch_floats(const moex_experts_desc *d, int64_t *n) {
    int64_t R, a, b;
    if (!moex_mul_ok(d->gated ? 2 : 1, d->intermediate, &R) || !moex_mul_ok(3, d->intermediate, &a) ||
        !moex_mul_ok(2, d->hidden, &b))
        return 0;
    if (R > INT64_MAX - a || R + a > INT64_MAX - b) return 0;
    *n = R + a + b;
    return 1;
}

static size_t workspace_bytes(const moex_experts_desc *d, int64_t max_tokens, int threads) {
    int64_t n;
    if (!scratch_floats(d, &n) || (uint64_t)n > SIZE_MAX / sizeof(float)) return SIZE_MAX;
    return (size_t)n * sizeof(float);
}

/* Element r of expert e's row of a [E, n] bias (f32/f16/bf16), or 0 without one. */
static float bias_at(const moex_tensor *bias, int64_t e, int64_t r) {
    if (!moex_tensor_present(bias)) return 0.0f;
    return moex_load_f32(bias->data, bias->dtype, e * bias->strides[0] + r * bias->strides[1]);
}

/* y[n] = sum_k x[k] * B(k, n) for n < N, B [K, N] */
static void project(const moex_bmat *b, const float *x, int64_t K, int64_t N, float *y) {
    for (int64_t n = 0; n < N; n++) {
        float s = 0.0f;
        for (int64_t c = 0; c < K; c++) s += x[c] * moex_bmat_at(b, c, n);
        y[n] = s;
    }
}

static moex_status forward(const moex_forward_args *a) {
    const moex_experts_desc *d = a->layer;
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, k = d->top_k, T = a->tokens;
    const int64_t R = d->gated ? 2 * I : I;
    const moex_dtype wdt = moex_weight_dtype(d);
    const int quant = moex_is_quant_dtype(wdt);
    const int64_t qblock = wdt == MOEX_E2M1X2 ? MOEX_FP4_BLOCK : d->block_k;
    const int split = d->gated && !d->interleaved; /* gate and up: two views (two matrices per expert) */
    float *x = a->workspace, *gu = x + H, *g = gu + R, *u = g + I, *h = u + I, *acc = h + I;
    const size_t hsz = moex_dtype_size(a->hidden->dtype), osz = moex_dtype_size(a->out->dtype);
    for (int64_t t = 0; t < T; t++) {
        const char *row = (const char *)a->hidden->data + t * a->hidden->strides[0] * (int64_t)hsz;
        for (int64_t c = 0; c < H; c++) x[c] = moex_load_f32(row, a->hidden->dtype, c);
        if (quant) moex_act_quant_row(x, x, H, wdt, qblock);
        memset(acc, 0, sizeof(float) * (size_t)H);
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = moex_id_at(a->ids, t, j);
            if (e < 0 || e >= E) continue; /* -1 and E: sentinels */
            const float w = moex_weight_at(a->weights, t, j);
            /* gate_up in its physical row order, + bias */
            moex_bmat first = moex_gate_up_mat(d, e, 0);
            project(&first, x, H, split ? I : R, gu);
            if (split) {
                moex_bmat second = moex_gate_up_mat(d, e, I);
                project(&second, x, H, I, gu + I);
            }
            for (int64_t r = 0; r < R; r++) gu[r] += bias_at(&d->gate_up_bias, e, r);
            if (d->gated) {
                for (int64_t i = 0; i < I; i++) {
                    g[i] = gu[d->interleaved ? 2 * i : i];
                    u[i] = gu[d->interleaved ? 2 * i + 1 : I + i];
                }
                moex_activation_gated(d, g, u, h, I);
            } else {
                moex_activation_plain(d, gu, h, I);
            }
            if (quant) moex_act_quant_row(h, h, I, wdt, qblock);
            moex_bmat down = moex_down_mat(d, e, 0);
            for (int64_t c = 0; c < H; c++) {
                float s = 0.0f;
                for (int64_t i = 0; i < I; i++) s += h[i] * moex_bmat_at(&down, i, c);
                acc[c] += w * (s + bias_at(&d->down_bias, e, c));
            }
        }
        moex_status st = moex_convert(acc, MOEX_F32, (char *)a->out->data + t * a->out->strides[0] * (int64_t)osz,
                                      a->out->dtype, (size_t)H);
        if (st) return st;
    }
    return MOEX_OK;
}

const moex_impl moex_test_rows = {.supports = moex_cpu_layer_supports, .workspace_bytes = workspace_bytes,
                                  .forward = forward};
