/* layer.c — the experts layer description: defaults and validation. */
#include "experts/experts_internal.h"
#include "core/quant.h"
#include <stdio.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_uint_fast64_t next_layer_id = 1;

static const char *activation_names[MOEX_ACTIVATION_COUNT] = {
    "silu", "gelu", "gelu_tanh", "relu", "gptoss_clamp", "swiglu_limit",
};

const char *moex_activation_name(moex_activation act) {
    if ((unsigned)act >= MOEX_ACTIVATION_COUNT) return "invalid";
    return activation_names[act];
}

moex_status moex_experts_desc_init(moex_experts_desc *desc) {
    if (!desc) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_desc_init: desc is NULL");
    memset(desc, 0, sizeof *desc);
    desc->gated = 1;
    desc->activation = MOEX_ACT_SILU;
    desc->alpha = 1.702f;
    desc->limit = 7.0f;
    desc->block_n = 128;
    desc->block_k = 128;
    desc->activation_scheme = MOEX_ACT_SCHEME_DYNAMIC;
    return MOEX_OK;
}

moex_status moex_experts_desc_share(const moex_experts_desc *desc, int64_t first, int64_t count,
                                    moex_experts_desc *out) {
    if (!desc || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_desc_share: %s is NULL", desc ? "out" : "desc");
    if (first < 0 || count < 1 || first > desc->num_experts - count)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_desc_share: experts [%lld, %lld + %lld) are not a share "
                         "of the %lld experts", (long long)first, (long long)first, (long long)count,
                         (long long)desc->num_experts);
    moex_experts_desc s = *desc;
    moex_tensor *t[6] = {&s.gate_up, &s.down, &s.gate_up_bias, &s.down_bias, &s.gate_up_scale, &s.down_scale};
    for (int i = 0; i < 6; i++) { /* stacked tensors: [E, ...] from expert `first` */
        if (!t[i]->data) continue;
        if (t[i]->ndim < 1 || t[i]->shape[0] != desc->num_experts)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_desc_share: a stacked tensor's first dimension is "
                             "%lld, not the %lld experts", t[i]->ndim < 1 ? 0LL : (long long)t[i]->shape[0],
                             (long long)desc->num_experts);
        t[i]->data = (char *)t[i]->data + (size_t)(first * t[i]->strides[0]) * moex_dtype_size(t[i]->dtype);
        t[i]->shape[0] = count;
    }
    const void *const **a[6] = {&s.expert_gate, &s.expert_up, &s.expert_down, &s.expert_gate_scale,
                                &s.expert_up_scale, &s.expert_down_scale};
    for (int i = 0; i < 6; i++) /* per-expert pointer arrays */
        if (*a[i]) *a[i] += first;
    s.num_experts = count;
    *out = s;
    return MOEX_OK;
}

/* `what` is on another device than the weights (on `want`). */
static moex_status other_device(const moex_tensor *t, const char *what, moex_device want) {
    char got[32], need[32];
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is on %s but gate_up is on %s", what,
                     moex_device_str(t->device, got, sizeof got), moex_device_str(want, need, sizeof need));
}

/* Check one weight or bias tensor: shape, dtype (= dtype of gate_up), device, contiguity. */
static moex_status check_param(const moex_experts_desc *d, const moex_tensor *t, const char *what, int ndim,
                               const int64_t *shape) {
    moex_status st = moex_check_shape(t, what, ndim, shape);
    if (st) return st;
    const int quant_weight = moex_is_quant_dtype(t->dtype) && t->dtype == d->gate_up.dtype;
    if (!moex_is_float_dtype(t->dtype) && !quant_weight)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s is not supported (f32, f16, bf16)", what,
                         moex_dtype_name(t->dtype));
    if (t->dtype != d->gate_up.dtype && !(moex_is_quant_dtype(d->gate_up.dtype) && moex_is_float_dtype(t->dtype)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s differs from gate_up's %s", what,
                         moex_dtype_name(t->dtype), moex_dtype_name(d->gate_up.dtype));
    if (t->device.kind != d->gate_up.device.kind || t->device.index != d->gate_up.device.index)
        return other_device(t, what, d->gate_up.device);
    return moex_check_contiguous(t, what);
}

static moex_status check_sizes(const moex_experts_desc *d) {
    if (d->num_experts < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "num_experts = %lld, must be >= 1", (long long)d->num_experts);
    if (d->hidden < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "hidden = %lld, must be >= 1", (long long)d->hidden);
    if (d->intermediate < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "intermediate = %lld, must be >= 1", (long long)d->intermediate);
    if (d->top_k < 1 || d->top_k > d->num_experts)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "top_k = %lld is outside [1, num_experts = %lld]",
                         (long long)d->top_k, (long long)d->num_experts);
    if (d->gated && d->intermediate > INT64_MAX / 2)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "intermediate = %lld: the 2 x intermediate gate and up rows of a gated layer overflow int64",
                         (long long)d->intermediate);
    int64_t rows = d->gated ? 2 * d->intermediate : d->intermediate, n;
    if (!moex_mul_ok(d->num_experts, rows, &n) || !moex_mul_ok(n, d->hidden, &n) || !moex_mul_ok(n, 4, &n))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "num_experts = %lld x intermediate = %lld x hidden = %lld overflows a 64-bit byte count",
                         (long long)d->num_experts, (long long)d->intermediate, (long long)d->hidden);
    return MOEX_OK;
}

static moex_status check_activation(const moex_experts_desc *d) {
    if ((unsigned)d->activation >= MOEX_ACTIVATION_COUNT)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "activation = %d is not a moex_activation", (int)d->activation);
    if (d->gated != 0 && d->gated != 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gated = %d, must be 0 or 1", d->gated);
    if (d->interleaved != 0 && d->interleaved != 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "interleaved = %d, must be 0 or 1", d->interleaved);
    if (d->transposed != 0 && d->transposed != 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "transposed = %d, must be 0 or 1", d->transposed);
    if (!d->gated && d->interleaved)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "interleaved = 1 needs a gated layer (gated = 0)");
    int clamped = d->activation == MOEX_ACT_GPTOSS_CLAMP || d->activation == MOEX_ACT_SWIGLU_LIMIT;
    if (clamped && !d->gated)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "activation %s needs a gated layer (gated = 0)",
                         moex_activation_name(d->activation));
    if (clamped && !(d->limit > 0.0f && isfinite(d->limit)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "limit = %g, must be a finite value > 0 for %s", (double)d->limit,
                         moex_activation_name(d->activation));
    if (d->activation == MOEX_ACT_GPTOSS_CLAMP && !isfinite(d->alpha))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "alpha = %g is not finite", (double)d->alpha);
    return MOEX_OK;
}

// The per-expert layout: pointer arrays instead of stacked gate_up / down.
static moex_status check_per_expert(const moex_experts_desc *d) {
    if (moex_tensor_present(&d->gate_up) || moex_tensor_present(&d->down))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "expert_up is set (per-expert layout) but gate_up or down is present too: use one layout");
    if (!d->expert_down) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_up is set but expert_down is NULL");
    if (d->gated && !d->expert_gate)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gated layer in the per-expert layout needs expert_gate");
    if (!d->gated && d->expert_gate)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_gate is set but the layer is not gated (gated = 0)");
    if (d->interleaved)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "interleaved = 1 has no meaning in the per-expert layout");
    if (!moex_is_float_dtype(d->expert_dtype) && !moex_is_quant_dtype(d->expert_dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_dtype %s is not supported (f32, f16, bf16, e4m3, e2m1x2)",
                         moex_dtype_name(d->expert_dtype));
    if (d->expert_device.kind != MOEX_DEVICE_CPU && d->expert_device.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_device kind %d is not a moex_device_kind",
                         (int)d->expert_device.kind);
    const size_t esz = moex_dtype_size(d->expert_dtype);
    for (int64_t e = 0; e < d->num_experts; e++) {
        const char *missing = !d->expert_up[e] ? "expert_up" : !d->expert_down[e] ? "expert_down"
                            : d->gated && !d->expert_gate[e] ? "expert_gate" : NULL;
        if (missing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s[%lld] is NULL", missing, (long long)e);
        const void *p = (uintptr_t)d->expert_up[e] % esz ? d->expert_up[e] : (uintptr_t)d->expert_down[e] % esz
                      ? d->expert_down[e] : d->gated && (uintptr_t)d->expert_gate[e] % esz ? d->expert_gate[e] : NULL;
        if (p)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s[%lld] at %p is not aligned to its %zu-byte %s elements",
                             p == d->expert_up[e] ? "expert_up" : p == d->expert_down[e] ? "expert_down" : "expert_gate",
                             (long long)e, p, esz, moex_dtype_name(d->expert_dtype));
    }
    return MOEX_OK;
}


/* ---- quantized experts ---------------------------------------------------- */

static moex_status check_scale_dtype(moex_dtype dt, const char *what) {
    if (dt == MOEX_F32 || dt == MOEX_UE8M0) return MOEX_OK;
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s is not a scale dtype (f32 or ue8m0)", what,
                     moex_dtype_name(dt));
}

// A stacked scale grid [E, ceil(rows/block_n), ceil(in/block_k)].
static moex_status check_scale_grid(const moex_experts_desc *d, const moex_tensor *t, const char *what, int64_t rows,
                                    int64_t in) {
    if (!moex_tensor_present(t))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is absent: %s weights need their block scales", what,
                         moex_dtype_name(d->gate_up.dtype));
    int64_t shape[3] = {d->num_experts, moex_ceil_div(rows, d->block_n), moex_ceil_div(in, d->block_k)};
    moex_status st = moex_check_shape(t, what, 3, shape);
    if (!st) st = check_scale_dtype(t->dtype, what);
    if (!st) st = moex_check_contiguous(t, what);
    if (!st && (t->device.kind != d->gate_up.device.kind || t->device.index != d->gate_up.device.index))
        st = other_device(t, what, d->gate_up.device);
    return st;
}

// A stacked quantized weight: e4m3 [E, rows, in]; e2m1x2 [E, rows, in/2] or GPT-OSS's [E, rows, in/32, 16].
static moex_status check_quant_weight(const moex_experts_desc *d, const moex_tensor *t, const char *what, int64_t rows,
                                      int64_t in) {
    if (t->dtype == MOEX_E2M1X2 && t->ndim == 4) {
        int64_t blocks[4] = {d->num_experts, rows, in / 32, 16};
        if (in % 32)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the [E, rows, in/32, 16] block form needs in = %lld to be a "
                             "multiple of 32", what, (long long)in);
        return check_param(d, t, what, 4, blocks);
    }
    int64_t shape[3] = {d->num_experts, rows, t->dtype == MOEX_E2M1X2 ? in / 2 : in};
    return check_param(d, t, what, 3, shape);
}

static moex_status check_quantized(const moex_experts_desc *d) {
    const moex_dtype dt = moex_weight_dtype(d);
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, R = d->gated ? 2 * I : I;
    if (d->transposed)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "transposed = 1 with %s weights: quantized experts are stored "
                         "[E, out, in] (transposed = 0)", moex_dtype_name(dt));
    if (d->block_n < 1 || d->block_k < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "block_n = %lld, block_k = %lld: both must be >= 1",
                         (long long)d->block_n, (long long)d->block_k);
    if (dt == MOEX_E2M1X2 && (d->block_n != 1 || d->block_k != MOEX_FP4_BLOCK))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "e2m1x2 weights need block_n = 1 and block_k = 32 (one ue8m0 scale "
                         "per 32 elements along the input); got %lld x %lld", (long long)d->block_n, (long long)d->block_k);
    if (dt == MOEX_E2M1X2 && (H % 2 || I % 2))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "e2m1x2 weights pack two values a byte: hidden = %lld and "
                         "intermediate = %lld must be even", (long long)H, (long long)I);
    if (d->expert_up) {
        const char *missing = !d->expert_up_scale ? "expert_up_scale" : !d->expert_down_scale ? "expert_down_scale"
                            : d->gated && !d->expert_gate_scale ? "expert_gate_scale" : NULL;
        if (missing)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is NULL: %s weights need their block scales", missing,
                             moex_dtype_name(dt));
        moex_status st = check_scale_dtype(d->expert_scale_dtype, "expert_scale_dtype");
        if (st) return st;
        for (int64_t e = 0; e < E; e++) {
            missing = !d->expert_up_scale[e] ? "expert_up_scale" : !d->expert_down_scale[e] ? "expert_down_scale"
                    : d->gated && !d->expert_gate_scale[e] ? "expert_gate_scale" : NULL;
            if (missing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s[%lld] is NULL", missing, (long long)e);
            const size_t esz = moex_dtype_size(d->expert_scale_dtype);
            const char *odd = (uintptr_t)d->expert_up_scale[e] % esz ? "expert_up_scale"
                            : (uintptr_t)d->expert_down_scale[e] % esz ? "expert_down_scale"
                            : d->gated && (uintptr_t)d->expert_gate_scale[e] % esz ? "expert_gate_scale" : NULL;
            if (odd)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s[%lld] is not aligned to its %zu-byte %s elements", odd,
                                 (long long)e, esz, moex_dtype_name(d->expert_scale_dtype));
        }
        return MOEX_OK;
    }
    moex_status st = check_quant_weight(d, &d->gate_up, "gate_up", R, H);
    if (!st) st = check_quant_weight(d, &d->down, "down", H, I);
    if (!st) st = check_scale_grid(d, &d->gate_up_scale, "gate_up_scale", R, H);
    if (!st) st = check_scale_grid(d, &d->down_scale, "down_scale", H, I);
    return st;
}

// Scales on a layer whose weights are not quantized are a mistake worth naming.
static moex_status check_unquantized(const moex_experts_desc *d) {
    const char *set = moex_tensor_present(&d->gate_up_scale) ? "gate_up_scale"
                    : moex_tensor_present(&d->down_scale)    ? "down_scale"
                    : d->expert_gate_scale || d->expert_up_scale || d->expert_down_scale ? "expert_*_scale" : NULL;
    if (set)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is set but the weights are %s, not quantized (e4m3, e2m1x2)",
                         set, moex_dtype_name(moex_weight_dtype(d)));
    return MOEX_OK;
}

static moex_status validate(const moex_experts_desc *d) {
    moex_status st = check_sizes(d);
    if (!st) st = check_activation(d);
    if (st) return st;
    if (d->activation_scheme != MOEX_ACT_SCHEME_DYNAMIC && d->activation_scheme != MOEX_ACT_SCHEME_STATIC)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "activation_scheme = %d, must be MOEX_ACT_SCHEME_DYNAMIC (0) or "
                         "MOEX_ACT_SCHEME_STATIC (1)", d->activation_scheme);
    const int quant = moex_is_quant_dtype(d->expert_up ? d->expert_dtype : d->gate_up.dtype);
    if ((st = quant ? check_quantized(d) : check_unquantized(d))) return st;
    int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, R = d->gated ? 2 * I : I;
    if (d->expert_up) {
        if ((st = check_per_expert(d))) return st;
        moex_experts_desc stacked = *d; /* biases are checked against the weights' dtype and device */
        stacked.gate_up.dtype = d->expert_dtype;
        stacked.gate_up.device = d->expert_device;
        int64_t gub[2] = {E, R}, dnb[2] = {E, H};
        if (moex_tensor_present(&d->gate_up_bias) &&
            (st = check_param(&stacked, &d->gate_up_bias, "gate_up_bias", 2, gub)))
            return st;
        if (moex_tensor_present(&d->down_bias) && (st = check_param(&stacked, &d->down_bias, "down_bias", 2, dnb)))
            return st;
        return MOEX_OK;
    }
    if (d->expert_gate || d->expert_down)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_gate or expert_down is set but expert_up is NULL");
    int64_t gu[3] = {E, R, H}, gut[3] = {E, H, R}, dn[3] = {E, H, I}, dnt[3] = {E, I, H};
    int64_t gub[2] = {E, R}, dnb[2] = {E, H};
    if (quant) { /* weights and scales checked above; biases stay float */
        if (moex_tensor_present(&d->gate_up_bias) && (st = check_param(d, &d->gate_up_bias, "gate_up_bias", 2, gub)))
            return st;
        if (moex_tensor_present(&d->down_bias) && (st = check_param(d, &d->down_bias, "down_bias", 2, dnb))) return st;
        return MOEX_OK;
    }
    if (!moex_is_float_dtype(d->gate_up.dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gate_up: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(d->gate_up.dtype));
    st = check_param(d, &d->gate_up, d->transposed ? "gate_up (transposed)" : "gate_up", 3, d->transposed ? gut : gu);
    if (!st) st = check_param(d, &d->down, d->transposed ? "down (transposed)" : "down", 3, d->transposed ? dnt : dn);
    if (!st && moex_tensor_present(&d->gate_up_bias)) st = check_param(d, &d->gate_up_bias, "gate_up_bias", 2, gub);
    if (!st && moex_tensor_present(&d->down_bias)) st = check_param(d, &d->down_bias, "down_bias", 2, dnb);
    return st;
}

moex_status moex_layer_create(const moex_experts_desc *desc, moex_layer **out) {
    if (!desc || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_layer_create: %s is NULL", desc ? "out" : "desc");
    moex_status st = validate(desc);
    if (st) return st;
    moex_layer *layer = calloc(1, sizeof *layer);
    if (!layer) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_layer_create: out of memory");
    layer->desc = *desc;
    layer->id = atomic_fetch_add(&next_layer_id, 1);
    *out = layer;
    return MOEX_OK;
}

moex_status moex_layer_one_per_row(const moex_layer *layer, moex_layer **out) {
    moex_layer *l = calloc(1, sizeof *l);
    if (!l) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_prepare: out of memory");
    l->desc = layer->desc;
    l->desc.top_k = 1;
    l->id = atomic_fetch_add(&next_layer_id, 1);
    *out = l;
    return MOEX_OK;
}

void moex_layer_free(moex_layer *layer) { free(layer); }

const moex_experts_desc *moex_layer_desc(const moex_layer *layer) { return layer ? &layer->desc : NULL; }
