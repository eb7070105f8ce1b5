/* grouped_mm.c — sort the T*k (token, expert) pairs by expert, then one
 * grouped pass over all experts for gate/up with the activation fused, one
 * for down, and a weighted reduction back in token order.
 *
 *   hidden [T,H] --sort--> gu [T*k, R], h [T*k, I] (rows sorted by expert) --> y [T*k, H] --> out [T,H]
 *
 * Work items are (expert, block of MOEX_NB output columns) over all experts
 * that have rows, at once, handed out dynamically; each packs its block of weights once for
 * all of the expert's rows. Every output element is computed by one thread in
 * a fixed order, so the result does not depend on the thread count.
 * Quantized experts: x is quantized per token before gate/up and h per row before
 * down; the kernels read the weights' codes in place (decoded into the packed
 * panels, or streamed). */
#include "backends/cpu/common.h"
#include <omp.h>

typedef struct grouped_ws {
    moex_rows x;
    moex_routing routing;
    const float **xrow;            /* [T*k]: hidden row of each sorted pair */
    const float **hrow;            /* [T*k]: h row of each sorted pair */
    float *gu;                     /* [T*k, R] raw gate/up */
    float *h;                      /* [T*k, I] */
    float *y;                      /* [T*k, H] */
    int64_t *hit;                  /* [E]: the experts with rows, in expert order */
    moex_thread_scratch *scratch;  /* [threads] */
} grouped_ws;

static grouped_ws carve(moex_ws *ws, const moex_cpu_kernels *kr, const moex_experts_desc *d, const moex_tensor *hidden,
                        const moex_tensor *ids, int64_t T, int threads) {
    const int64_t R = (d->gated ? 2 : 1) * d->intermediate;
    int64_t P;
    grouped_ws g;
    memset(&g, 0, sizeof g);
    if (!moex_mul_ok(T, d->top_k, &P) || P > INT32_MAX) { /* pair indices are int32 */
        ws->used = SIZE_MAX;
        return g;
    }
    g.x = moex_hidden_rows(ws, kr, hidden, T, d->hidden, threads);
    if (moex_layer_quantized(d)) { /* the activations quantized per token */
        float *xq = moex_ws_take_array(ws, T, d->hidden, sizeof(float));
        if (ws->base) g.x = moex_quantize_rows(kr, d, g.x, xq, T, d->hidden, threads);
    }
    g.routing = moex_routing_sort(ws, d, ids, T);
    g.xrow = moex_ws_take_array(ws, P, 1, sizeof(float *));
    g.hrow = moex_ws_take_array(ws, P, 1, sizeof(float *));
    g.gu = moex_ws_take_array(ws, P, R, sizeof(float));
    g.h = moex_ws_take_array(ws, P, d->intermediate, sizeof(float));
    g.y = moex_ws_take_array(ws, P, d->hidden, sizeof(float));
    g.hit = moex_ws_take_array(ws, d->num_experts, 1, sizeof(int64_t));
    g.scratch = moex_ws_thread_scratch(ws, d, threads);
    return g;
}

static size_t workspace_bytes(const moex_experts_desc *d, int64_t max_tokens, int threads) {
    moex_ws ws = {NULL, 0};
    carve(&ws, NULL, d, NULL, NULL, max_tokens, threads);
    return ws.used;
}

static moex_status forward(const moex_forward_args *args) {
    const moex_experts_desc *d = args->layer;
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, k = d->top_k;
    const int64_t R = d->gated ? 2 * I : I;
    moex_ws ws = {args->workspace, 0};
    grouped_ws g = carve(&ws, kr, d, args->hidden, args->ids, args->tokens, args->num_threads);
    const int quant = moex_layer_quantized(d);
    const moex_dtype wdt = moex_weight_dtype(d);
    const int64_t qblock = moex_act_quant_block(d);
    const int64_t *off = g.routing.offsets;
    const int64_t jblocks = (I + MOEX_NB - 1) / MOEX_NB, hblocks = (H + MOEX_NB - 1) / MOEX_NB;
    for (int64_t r = 0; r < off[E]; r++) {
        g.xrow[r] = moex_row(&g.x, g.routing.sorted[r] / k);
        g.hrow[r] = g.h + r * I;
    }
    int64_t nhit = 0; /* work items only for the experts that have rows */
    for (int64_t e = 0; e < E; e++)
        if (off[e + 1] > off[e]) g.hit[nhit++] = e;
#pragma omp parallel num_threads(args->num_threads)
    {
        moex_thread_scratch *s = &g.scratch[omp_get_thread_num()];
        // gate/up + activation: item (e, jb) -> h[rows of e, jb*NB ..]
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nhit * jblocks; item++) {
            const int64_t e = g.hit[item / jblocks], j0 = (item % jblocks) * MOEX_NB, n = off[e + 1] - off[e];
            const int64_t nb = I - j0 < MOEX_NB ? I - j0 : MOEX_NB;
            moex_gate_up_block(kr, d, e, g.xrow + off[e], n, j0, nb, s->pack, g.gu + off[e] * R, g.h + off[e] * I + j0, I);
        }
        if (quant) { // quantized experts: h quantized per row, once it is whole
#pragma omp for schedule(static)
            for (int64_t r = 0; r < off[E]; r++) kr->act_quant(g.h + r * I, g.h + r * I, I, wdt, qblock);
        }
        // down: item (e, hb) -> y[rows of e, hb*NB ..]
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nhit * hblocks; item++) {
            const int64_t e = g.hit[item / hblocks], h0 = (item % hblocks) * MOEX_NB, n = off[e + 1] - off[e];
            const int64_t nh = H - h0 < MOEX_NB ? H - h0 : MOEX_NB;
            moex_bmat down = moex_down_mat(d, e, h0);
            moex_gemm(kr, g.hrow + off[e], n, &down, nh, I, g.y + off[e] * H + h0, H, s->pack,
                      moex_bias_at(&d->down_bias, e, h0), d->down_bias.dtype);
        }
    }
    moex_reduce_tokens(kr, args, g.routing.pos, g.y, g.scratch);
    return MOEX_OK;
}

const moex_impl moex_cpu_grouped_mm = {.supports = moex_cpu_layer_supports, .workspace_bytes = workspace_bytes, .forward = forward};
