/* batched_mm.c — one pass over all T*k (token, expert) pairs; each pair reads
 * its own expert's weights independently (no grouping by expert): the
 * formulation of a batched GEMM over duplicated expert weights, without
 * copying them. Memory traffic grows with T*k, so it loses at large T on the
 * CPU, as the spec says.
 *
 *   pair p = (t, j): x[t] [H] -> gate/up [2I] -> h [I] -> y[p] [H];  out[t] = sum_j w[t,j] y[p]
 *
 * Quantized experts: x is quantized per token once, h per pair before down; the
 * kernels read the weights' codes in place.
 */
#include "backends/cpu/common.h"
#include <omp.h>

typedef struct batched_ws {
    moex_rows x;
    int32_t *pos;                  /* [T*k]: p, or -1 for a sentinel */
    float *y;                      /* [T*k, H] */
    moex_thread_scratch *scratch;  /* [threads] */
} batched_ws;

static batched_ws carve(moex_ws *ws, const moex_cpu_kernels *kr, const moex_experts_desc *d, const moex_tensor *hidden,
                        int64_t T, int threads) {
    batched_ws b;
    memset(&b, 0, sizeof b);
    int64_t P;
    if (!moex_mul_ok(T, d->top_k, &P) || P > INT32_MAX) { /* pair indices are int32 */
        ws->used = SIZE_MAX;
        return b;
    }
    b.x = moex_hidden_rows(ws, kr, hidden, T, d->hidden, threads);
    if (moex_layer_quantized(d)) { /* the activations quantized per token */
        float *xq = moex_ws_take_array(ws, T, d->hidden, sizeof(float));
        if (ws->base) b.x = moex_quantize_rows(kr, d, b.x, xq, T, d->hidden, threads);
    }
    b.pos = moex_ws_take_array(ws, T, d->top_k, sizeof(int32_t));
    b.y = moex_ws_take_array(ws, P, d->hidden, sizeof(float));
    b.scratch = moex_ws_thread_scratch(ws, d, threads);
    return b;
}

static size_t workspace_bytes(const moex_experts_desc *d, int64_t max_tokens, int threads) {
    moex_ws ws = {NULL, 0};
    carve(&ws, NULL, d, NULL, max_tokens, threads);
    return ws.used;
}

static moex_status forward(const moex_forward_args *args) {
    const moex_experts_desc *d = args->layer;
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, k = d->top_k, P = args->tokens * k;
    moex_ws ws = {args->workspace, 0};
    batched_ws b = carve(&ws, kr, d, args->hidden, args->tokens, args->num_threads);
    const int quant = moex_layer_quantized(d);
    const moex_dtype d_wdt = moex_weight_dtype(d);
    const int64_t qblock = moex_act_quant_block(d);
#pragma omp parallel num_threads(args->num_threads)
    {
        moex_thread_scratch *s = &b.scratch[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < P; p++) {
            int64_t e = moex_id_at(args->ids, p / k, p % k);
            b.pos[p] = e >= 0 && e < E ? (int32_t)p : -1;
            if (b.pos[p] < 0) continue;
            const float *x = moex_row(&b.x, p / k);
            for (int64_t j0 = 0; j0 < I; j0 += MOEX_NB) {
                const int64_t nb = I - j0 < MOEX_NB ? I - j0 : MOEX_NB;
                moex_gate_up_block(kr, d, e, &x, 1, j0, nb, s->pack, s->row, s->h + j0, I);
            }
            if (quant) kr->act_quant(s->h, s->h, I, d_wdt, qblock);
            moex_bmat down = moex_down_mat(d, e, 0);
            const float *hrow = s->h;
            moex_gemm(kr, &hrow, 1, &down, H, I, b.y + p * H, H, s->pack, moex_bias_at(&d->down_bias, e, 0),
                      d->down_bias.dtype);
        }
    }
    moex_reduce_tokens(kr, args, b.pos, b.y, b.scratch);
    return MOEX_OK;
}

const moex_impl moex_cpu_batched_mm = {.supports = moex_cpu_layer_supports, .workspace_bytes = workspace_bytes, .forward = forward};
