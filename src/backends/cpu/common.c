/* common.c — shared pieces of the CPU backends (see common.h). */
#include "backends/cpu/common.h"
#include <omp.h>

void *moex_ws_take(moex_ws *ws, size_t bytes) {
    if (ws->used > SIZE_MAX - 64 || bytes > SIZE_MAX - 64 - ws->used) { /* saturate: the size is unusable */
        ws->used = SIZE_MAX;
        return NULL;
    }
    size_t at = (ws->used + 63) & ~(size_t)63;
    ws->used = at + bytes;
    return ws->base ? ws->base + at : NULL;
}

void *moex_ws_take_array(moex_ws *ws, int64_t rows, int64_t cols, size_t elem) {
    int64_t n;
    if (!moex_mul_ok(rows, cols, &n) || !moex_mul_ok(n, (int64_t)elem, &n) || (uint64_t)n > SIZE_MAX) {
        ws->used = SIZE_MAX;
        return NULL;
    }
    return moex_ws_take(ws, (size_t)n);
}

moex_thread_scratch *moex_ws_thread_scratch(moex_ws *ws, const moex_experts_desc *d, int threads) {
    moex_thread_scratch *s = moex_ws_take(ws, (size_t)threads * sizeof *s);
    int64_t row = d->hidden > 2 * d->intermediate ? d->hidden : 2 * d->intermediate;
    for (int i = 0; i < threads; i++) {
        moex_thread_scratch v;
        v.pack = moex_ws_take(ws, sizeof(float) * MOEX_KC * 2 * MOEX_NB);
        v.row = moex_ws_take(ws, sizeof(float) * (size_t)row);
        v.h = moex_ws_take(ws, sizeof(float) * (size_t)d->intermediate);
        if (s) s[i] = v;
    }
    return s;
}

moex_rows moex_hidden_rows(moex_ws *ws, const moex_cpu_kernels *kr, const moex_tensor *hidden, int64_t T, int64_t H,
                           int threads) {
    moex_rows r = {NULL, H};
    float *x = moex_ws_take_array(ws, T, H, sizeof(float));
    if (!ws->base) return r;
    if (hidden->dtype == MOEX_F32) {
        r.base = hidden->data;
        r.stride = hidden->strides[0];
        return r;
    }
    const size_t esz = moex_dtype_size(hidden->dtype);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < T; t++)
        kr->to_f32((const char *)hidden->data + t * hidden->strides[0] * (int64_t)esz, hidden->dtype, x + t * H, H);
    r.base = x;
    return r;
}

moex_routing moex_routing_sort(moex_ws *ws, const moex_experts_desc *d, const moex_tensor *ids, int64_t T) {
    const int64_t E = d->num_experts, k = d->top_k;
    int64_t P;
    moex_routing r;
    if (!moex_mul_ok(T, k, &P) || P > INT32_MAX) { /* pair indices are int32 */
        ws->used = SIZE_MAX;
        memset(&r, 0, sizeof r);
        return r;
    }
    r.offsets = moex_ws_take_array(ws, E + 1, 1, sizeof(int64_t));
    int64_t *fill = moex_ws_take_array(ws, E, 1, sizeof(int64_t));
    r.sorted = moex_ws_take_array(ws, P, 1, sizeof(int32_t));
    r.pos = moex_ws_take_array(ws, P, 1, sizeof(int32_t));
    if (!ws->base) return r;
    memset(r.offsets, 0, sizeof(int64_t) * (size_t)(E + 1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = moex_id_at(ids, t, j);
            if (e >= 0 && e < E) r.offsets[e + 1]++;
        }
    for (int64_t e = 0; e < E; e++) r.offsets[e + 1] += r.offsets[e];
    memcpy(fill, r.offsets, sizeof(int64_t) * (size_t)E);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = moex_id_at(ids, t, j), p = t * k + j;
            if (e < 0 || e >= E) {
                r.pos[p] = -1;
                continue;
            }
            r.pos[p] = (int32_t)fill[e];
            r.sorted[fill[e]++] = (int32_t)p;
        }
    return r;
}

void moex_activation_block(const moex_experts_desc *d, const float *gu, int64_t M, int64_t j0, int64_t nb, float *h,
                           int64_t ldh, float *scratch) {
    const int64_t I = d->intermediate, R = d->gated ? 2 * I : I;
    for (int64_t m = 0; m < M; m++) {
        const float *row = gu + m * R;
        float *hm = h + m * ldh;
        if (!d->gated) {
            moex_activation_plain(d, row + j0, hm, nb);
        } else if (d->interleaved) { /* gate = even columns, up = odd */
            float *gate = scratch, *up = scratch + nb;
            for (int64_t j = 0; j < nb; j++) {
                gate[j] = row[2 * (j0 + j)];
                up[j] = row[2 * (j0 + j) + 1];
            }
            moex_activation_gated(d, gate, up, hm, nb);
        } else {
            moex_activation_gated(d, row + j0, row + I + j0, hm, nb);
        }
    }
}

void moex_gate_up_block(const moex_cpu_kernels *kr, const moex_experts_desc *d, int64_t e, const float *const *a,
                        int64_t M, int64_t j0, int64_t nb, float *pack, float *gu, float *h, int64_t ldh) {
    const int64_t H = d->hidden, I = d->intermediate, R = d->gated ? 2 * I : I;
    const moex_tensor *bias = &d->gate_up_bias;
    const moex_dtype bdt = bias->dtype;
    if (d->gated && !d->interleaved) { /* gate rows j0.., up rows I + j0.. */
        moex_bmat gate = moex_gate_up_mat(d, e, j0), up = moex_gate_up_mat(d, e, I + j0);
        moex_gemm(kr, a, M, &gate, nb, H, gu + j0, R, pack, moex_bias_at(bias, e, j0), bdt);
        moex_gemm(kr, a, M, &up, nb, H, gu + I + j0, R, pack, moex_bias_at(bias, e, I + j0), bdt);
    } else { /* interleaved: rows 2*j0 .. 2*(j0+nb); ungated: rows j0 .. j0+nb */
        const int64_t w = d->gated ? 2 : 1;
        moex_bmat m = moex_gate_up_mat(d, e, w * j0);
        moex_gemm(kr, a, M, &m, w * nb, H, gu + w * j0, R, pack, moex_bias_at(bias, e, w * j0), bdt);
    }
    moex_activation_block(d, gu, M, j0, nb, h, ldh, pack);
}

void moex_reduce_tokens(const moex_cpu_kernels *kr, const moex_forward_args *args, const int32_t *pos, const float *y,
                        moex_thread_scratch *scratch) {
    const moex_experts_desc *d = args->layer;
    const int64_t T = args->tokens, k = d->top_k, H = d->hidden;
    const moex_tensor *out = args->out;
    const size_t esz = moex_dtype_size(out->dtype);
#pragma omp parallel num_threads(args->num_threads)
    {
        float *acc = scratch[omp_get_thread_num()].row;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            memset(acc, 0, sizeof(float) * (size_t)H);
            for (int64_t j = 0; j < k; j++) {
                int32_t p = pos[t * k + j];
                if (p >= 0) kr->axpy(moex_weight_at(args->weights, t, j), y + (int64_t)p * H, acc, H);
            }
            char *dst = (char *)out->data + t * out->strides[0] * (int64_t)esz;
            if (out->dtype == MOEX_F32) memcpy(dst, acc, sizeof(float) * (size_t)H);
            else moex_convert(acc, MOEX_F32, dst, out->dtype, (size_t)H);
        }
    }
}

int moex_cpu_layer_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    if (layer && moex_is_quant_dtype(moex_weight_dtype(layer)) && layer->activation_scheme != MOEX_ACT_SCHEME_DYNAMIC) {
        snprintf(why, n,
                 "%s experts with activation_scheme \"static\" (one fixed activation scale per tensor) are not supported: "
                 "the CPU backends quantize activations dynamically, per token and per block of channels. Load the "
                 "checkpoint with --dequantize (moex_model_options.dequantize = 1) to run it unquantized",
                 moex_dtype_name(moex_weight_dtype(layer)));
        return 0;
    }
    return 1;
}

int64_t moex_act_quant_block(const moex_experts_desc *d) {
    return moex_weight_dtype(d) == MOEX_E2M1X2 ? MOEX_FP4_BLOCK : d->block_k;
}

moex_rows moex_quantize_rows(const moex_cpu_kernels *kr, const moex_experts_desc *d, moex_rows src, float *out,
                             int64_t n, int64_t cols, int threads) {
    const moex_dtype wdt = moex_weight_dtype(d);
    const int64_t block = moex_act_quant_block(d);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n > 1)
    for (int64_t i = 0; i < n; i++) kr->act_quant(moex_row(&src, i), out + i * cols, cols, wdt, block);
    moex_rows r = {out, cols};
    return r;
}

void moex_dequantize_expert(const moex_experts_desc *d, int64_t e, int64_t r0, int64_t r1, float *gate_up, float *down) {
    const int64_t H = d->hidden, I = d->intermediate, R = d->gated ? 2 * I : I;
    for (int64_t r = r0; r < r1; r++) {
        const int up = r < R;
        const moex_bmat b = up ? moex_gate_up_mat(d, e, r) : moex_down_mat(d, e, r - R);
        moex_dequant_row(b.w, b.dtype, b.scale, b.scale_dtype, b.scale_ld, b.block_n, b.block_k, b.base, up ? H : I,
                         up ? gate_up + r * H : down + (r - R) * I);
    }
}
