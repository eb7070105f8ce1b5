/* eager.c — the reference loop: for each expert that was hit, gather its
 * tokens, project them (gate/up), apply the activation, project down, and
 * add the weighted rows into the output, each step a pass over materialised
 * intermediates. The expert's tokens go in groups of MOEX_STREAM_MAX, spread
 * over the threads; each group streams the expert's weights once (no packing,
 * no tiling). The groups are fixed by the token count alone, so the result does
 * not depend on the thread count.
 *
 *   for e hit:  xe [n_e, H] -> gu [n_e, R] -> he [n_e, I] -> ye [n_e, H];  acc[t] += w * ye
 *
 * Quantized experts (the reference for the other backends): each expert hit is
 * dequantized to f32 first (moex_dequant_row), xe and he are quantized per row
 * as in batched_mm and grouped_mm, and the products run on the f32 copy.
 */
#include "backends/cpu/common.h"
#include <omp.h>

typedef struct eager_ws {
    moex_rows x;
    moex_routing routing;
    float *xe, *gu, *he, *ye;      /* [T*k, H], [T*k, R], [T*k, I], [T*k, H] */
    const float **xrow, **hrow;    /* [T*k] row pointers into xe and he */
    float *acc;                    /* [T, H] */
    float *wgu, *wdn;              /* quantized experts: the expert being run, dequantized: [R, H], [H, I] */
    moex_thread_scratch *scratch;  /* [threads] */
} eager_ws;

static eager_ws carve(moex_ws *ws, const moex_cpu_kernels *kr, const moex_experts_desc *d, const moex_tensor *hidden,
                      const moex_tensor *ids, int64_t T, int threads) {
    const int64_t R = (d->gated ? 2 : 1) * d->intermediate;
    int64_t P;
    eager_ws g;
    memset(&g, 0, sizeof g);
    if (!moex_mul_ok(T, d->top_k, &P) || P > INT32_MAX) { /* pair indices are int32 */
        ws->used = SIZE_MAX;
        return g;
    }
    g.x = moex_hidden_rows(ws, kr, hidden, T, d->hidden, threads);
    g.routing = moex_routing_sort(ws, d, ids, T);
    g.xe = moex_ws_take_array(ws, P, d->hidden, sizeof(float));
    g.gu = moex_ws_take_array(ws, P, R, sizeof(float));
    g.he = moex_ws_take_array(ws, P, d->intermediate, sizeof(float));
    g.ye = moex_ws_take_array(ws, P, d->hidden, sizeof(float));
    g.xrow = moex_ws_take_array(ws, P, 1, sizeof(float *));
    g.hrow = moex_ws_take_array(ws, P, 1, sizeof(float *));
    g.acc = moex_ws_take_array(ws, T, d->hidden, sizeof(float));
    if (moex_layer_quantized(d)) {
        g.wgu = moex_ws_take_array(ws, R, d->hidden, sizeof(float));
        g.wdn = moex_ws_take_array(ws, d->hidden, d->intermediate, sizeof(float));
    }
    g.scratch = moex_ws_thread_scratch(ws, d, threads);
    return g;
}

static size_t workspace_bytes(const moex_experts_desc *d, int64_t max_tokens, int threads) {
    moex_ws ws = {NULL, 0};
    carve(&ws, NULL, d, NULL, NULL, max_tokens, threads);
    return ws.used;
}

// A plain f32 matrix [rows, K] as B, from output row `base`.
static moex_bmat plain(const float *w, int64_t K, int64_t base) {
    moex_bmat b = {.w = w, .dtype = MOEX_F32, .ld = K, .base = base};
    return b;
}

static moex_status forward(const moex_forward_args *args) {
    const moex_experts_desc *d = args->layer;
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, k = d->top_k, T = args->tokens;
    const int64_t R = d->gated ? 2 * I : I;
    moex_ws ws = {args->workspace, 0};
    eager_ws g = carve(&ws, kr, d, args->hidden, args->ids, T, args->num_threads);
    const int quant = moex_layer_quantized(d);
    const moex_dtype wdt = moex_weight_dtype(d);
    const int64_t qblock = moex_act_quant_block(d);
    const int64_t *off = g.routing.offsets;
    memset(g.acc, 0, sizeof(float) * (size_t)(T * H));
    for (int64_t i = 0; i < off[E]; i++) {
        g.xrow[i] = g.xe + i * H;
        g.hrow[i] = g.he + i * I;
    }
#pragma omp parallel num_threads(args->num_threads)
    {
        moex_thread_scratch *s = &g.scratch[omp_get_thread_num()];
        for (int64_t e = 0; e < E; e++) {
            const int64_t n = off[e + 1] - off[e];
            const int32_t *pairs = g.routing.sorted + off[e];
            if (n == 0) continue;
            if (quant) { // the reference path for quantized experts: this expert dequantized to f32
#pragma omp for schedule(static)
                for (int64_t r0 = 0; r0 < R + H; r0 += MOEX_NB)
                    moex_dequantize_expert(d, e, r0, r0 + MOEX_NB < R + H ? r0 + MOEX_NB : R + H, g.wgu, g.wdn);
            }
            // groups of up to MOEX_STREAM_MAX tokens: gather, gate/up, activation, down
#pragma omp for schedule(static)
            for (int64_t i0 = 0; i0 < n; i0 += MOEX_STREAM_MAX) {
                const int64_t m = n - i0 < MOEX_STREAM_MAX ? n - i0 : MOEX_STREAM_MAX;
                for (int64_t i = i0; i < i0 + m; i++) {
                    memcpy(g.xe + i * H, moex_row(&g.x, pairs[i] / k), sizeof(float) * (size_t)H);
                    if (quant) kr->act_quant(g.xe + i * H, g.xe + i * H, H, wdt, qblock);
                }
                // gate/up: one product, or gate and up apart when they are separate matrices
                const int64_t parts = d->gated && !d->interleaved ? 2 : 1;
                for (int64_t part = 0; part < parts; part++) {
                    moex_bmat gate_up = quant ? plain(g.wgu, H, part * I) : moex_gate_up_mat(d, e, part * I);
                    moex_gemm(kr, g.xrow + i0, m, &gate_up, R / parts, H, g.gu + i0 * R + part * I, R, s->pack,
                              moex_bias_at(&d->gate_up_bias, e, part * I), d->gate_up_bias.dtype);
                }
                moex_bmat down = quant ? plain(g.wdn, I, 0) : moex_down_mat(d, e, 0);
                for (int64_t i = i0; i < i0 + m; i++) {
                    moex_activation_block(d, g.gu + i * R, 1, 0, I, g.he + i * I, I, s->row);
                    if (quant) kr->act_quant(g.he + i * I, g.he + i * I, I, wdt, qblock);
                }
                moex_gemm(kr, g.hrow + i0, m, &down, H, I, g.ye + i0 * H, H, s->pack, moex_bias_at(&d->down_bias, e, 0),
                          d->down_bias.dtype);
            }
            // acc[t] += w[t, j] * ye[i], split by columns so that a repeated token never races
#pragma omp for schedule(static)
            for (int64_t c0 = 0; c0 < H; c0 += MOEX_NB) {
                const int64_t nc = H - c0 < MOEX_NB ? H - c0 : MOEX_NB;
                for (int64_t i = 0; i < n; i++) {
                    const int64_t t = pairs[i] / k, j = pairs[i] % k;
                    kr->axpy(moex_weight_at(args->weights, t, j), g.ye + i * H + c0, g.acc + t * H + c0, nc);
                }
            }
        }
        // out = acc, in the activation dtype
        const moex_tensor *out = args->out;
        const size_t esz = moex_dtype_size(out->dtype);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            (void)moex_convert(g.acc + t * H, MOEX_F32, (char *)out->data + t * out->strides[0] * (int64_t)esz, out->dtype,
                         (size_t)H);
    }
    return MOEX_OK;
}

const moex_impl moex_cpu_eager = {.supports = moex_cpu_layer_supports, .workspace_bytes = workspace_bytes, .forward = forward};
