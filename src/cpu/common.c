/* common.c — shared pieces of the CPU backends (see common.h). */
#include "cpu/common.h"
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

static const char *expert_base(const moex_tensor *w, int64_t e) {
    return (const char *)w->data + e * w->strides[0] * (int64_t)moex_dtype_size(w->dtype);
}

// The fields every view of the layer's weights shares (scale_ld: scale blocks along an input of K).
static moex_bmat layer_mat(const moex_experts_desc *d, int64_t K) {
    moex_bmat b;
    memset(&b, 0, sizeof b);
    b.transposed = d->transposed;
    b.block_n = d->block_n;
    b.block_k = d->block_k;
    if (d->block_k > 0) b.scale_ld = moex_ceil_div(K, d->block_k);
    return b;
}

moex_bmat moex_gate_up_mat(const moex_experts_desc *d, int64_t e, int64_t base) {
    const int64_t I = d->intermediate, H = d->hidden, rows = d->gated ? 2 * I : I;
    moex_bmat b = layer_mat(d, H);
    if (d->expert_up) { /* per-expert: rows [0, I) of a gated layer are gate, the rest up */
        const int gate = d->gated && base < I;
        b.w = gate ? d->expert_gate[e] : d->expert_up[e];
        b.dtype = d->expert_dtype;
        b.ld = d->transposed ? I : H;
        b.base = gate || !d->gated ? base : base - I;
        if (moex_is_quant_dtype(b.dtype)) {
            b.scale = gate ? d->expert_gate_scale[e] : d->expert_up_scale[e];
            b.scale_dtype = d->expert_scale_dtype;
        }
        return b;
    }
    b.w = expert_base(&d->gate_up, e);
    b.dtype = d->gate_up.dtype;
    b.ld = d->transposed ? rows : H;
    b.base = base;
    if (moex_is_quant_dtype(b.dtype)) {
        b.scale = expert_base(&d->gate_up_scale, e);
        b.scale_dtype = d->gate_up_scale.dtype;
    }
    return b;
}

moex_bmat moex_down_mat(const moex_experts_desc *d, int64_t e, int64_t base) {
    moex_bmat b = layer_mat(d, d->intermediate);
    b.w = d->expert_up ? d->expert_down[e] : expert_base(&d->down, e);
    b.dtype = moex_weight_dtype(d);
    b.ld = d->transposed ? d->hidden : d->intermediate;
    b.base = base;
    if (moex_is_quant_dtype(b.dtype)) {
        b.scale = d->expert_up ? d->expert_down_scale[e] : expert_base(&d->down_scale, e);
        b.scale_dtype = d->expert_up ? d->expert_scale_dtype : d->down_scale.dtype;
    }
    return b;
}

// c[m, n] += bias[n]
static void add_bias(int64_t M, int64_t N, float *c, int64_t ldc, const void *bias, moex_dtype bias_dtype) {
    for (int64_t n = 0; n < N; n++) {
        const float bn = moex_load_f32(bias, bias_dtype, n);
        for (int64_t m = 0; m < M; m++) c[m * ldc + n] += bn;
    }
}

// Ask for B(k0 .. k0+kc, 0 .. N) to be brought into the cache, so that packing it
// later does not wait on memory row by row.
static void prefetch_block(const moex_bmat *b, int64_t k0, int64_t kc, int64_t N) {
    const int64_t esz = b->dtype == MOEX_F32 ? 4 : 2;
    const char *w = b->w;
    if (moex_is_quant_dtype(b->dtype)) { /* codes: 1 byte (e4m3) or half a byte (e2m1x2) per element */
        const int64_t per_line = b->dtype == MOEX_E4M3 ? 64 : 128, half = b->dtype == MOEX_E2M1X2;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < kc; k += per_line) __builtin_prefetch(w + (((b->base + n) * b->ld + k0 + k) >> half));
        return;
    }
    if (!b->transposed) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < kc; k += 64 / esz) __builtin_prefetch(w + ((b->base + n) * b->ld + k0 + k) * esz);
    } else {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t n = 0; n < N; n += 64 / esz) __builtin_prefetch(w + ((k0 + k) * b->ld + b->base + n) * esz);
    }
}

// The packed path: each k-block of B is converted into 16-column panels once for all M rows.
static void gemm_packed(const moex_cpu_kernels *kr, const float *const *a, int64_t M, const moex_bmat *b, int64_t N,
                      int64_t K, float *c, int64_t ldc, float *pack, const void *bias, moex_dtype bias_dtype) {
    const int64_t panels = (N + MOEX_NR - 1) / MOEX_NR;
    for (int64_t k0 = 0; k0 < K; k0 += MOEX_KC) {
        const int64_t kc = K - k0 < MOEX_KC ? K - k0 : MOEX_KC;
        kr->pack(b, k0, kc, 0, N, pack);
        if (k0 + kc < K) prefetch_block(b, k0 + kc, K - k0 - kc < MOEX_KC ? K - k0 - kc : MOEX_KC, N);
        for (int64_t mb = 0; mb < M; mb += MOEX_MC) {
            const int64_t mend = M - mb < MOEX_MC ? M : mb + MOEX_MC;
            for (int64_t p = 0; p < panels; p++) {
                const int nr = (int)(N - p * MOEX_NR < MOEX_NR ? N - p * MOEX_NR : MOEX_NR);
                for (int64_t m0 = mb; m0 < mend; m0 += MOEX_MR) {
                    const int mr = (int)(mend - m0 < MOEX_MR ? mend - m0 : MOEX_MR);
                    const float *rows[MOEX_MR];
                    for (int i = 0; i < MOEX_MR; i++) rows[i] = a[m0 + (i < mr ? i : 0)];
                    kr->micro(kc, rows, k0, pack + p * kc * MOEX_NR, c + m0 * ldc + p * MOEX_NR, ldc, mr, nr, k0 > 0);
                }
            }
        }
    }
    if (bias) add_bias(M, N, c, ldc, bias, bias_dtype);
}

void moex_gemm(const moex_cpu_kernels *kr, const float *const *a, int64_t M, const moex_bmat *b, int64_t N, int64_t K,
               float *c, int64_t ldc, float *pack, const void *bias, moex_dtype bias_dtype) {
    if (M <= 0) return;
    if (M > MOEX_STREAM_ROWS) {
        gemm_packed(kr, a, M, b, N, K, c, ldc, pack, bias, bias_dtype);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MOEX_STREAM_MAX) /* groups of up to 4 rows; the weights stay in L2 */
        kr->stream(b, a + m0, (int)(M - m0 < MOEX_STREAM_MAX ? M - m0 : MOEX_STREAM_MAX), 0, N, K, c + m0 * ldc, ldc);
    if (bias) add_bias(M, N, c, ldc, bias, bias_dtype);
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

int moex_cpu_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n, void *user) {
    if (dev->device.kind == MOEX_DEVICE_CPU && !dev->available) {
        snprintf(why, n, "%s", dev->reason);
        return 0;
    }
    if (dev->device.kind == MOEX_DEVICE_CPU && layer && moex_is_quant_dtype(moex_weight_dtype(layer)) &&
        layer->activation_scheme != MOEX_ACT_SCHEME_DYNAMIC) {
        snprintf(why, n,
                 "%s experts with activation_scheme \"static\" (one fixed activation scale per tensor) are not supported: "
                 "the CPU backends quantize activations dynamically, per token and per block of channels. Load the "
                 "checkpoint with --dequantize (moex_model_options.dequantize = 1) to run it unquantized",
                 moex_dtype_name(moex_weight_dtype(layer)));
        return 0;
    }
    if (dev->device.kind == MOEX_DEVICE_CPU) return 1;
    snprintf(why, n, "the CUDA version of this backend is not in this build of moex; use the cpu device");
    return 0;
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
