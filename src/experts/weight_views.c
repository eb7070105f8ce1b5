/* weight_views.c — one expert's projections of a layer as moex_bmat views (linear/kernels.h):
 * the gate/up and down matrices in any layout, quantized or not. Used by the CPU backends and by
 * the loader's dequantization. */
#include "experts/experts_internal.h"

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

