/* layer.c — the experts layer description: defaults and validation. */
#include "experts/experts_internal.h"
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
    return MOEX_OK;
}

/* Check one weight or bias tensor: shape, dtype (= dtype of gate_up), device, contiguity. */
static moex_status check_param(const moex_experts_desc *d, const moex_tensor *t, const char *what, int ndim,
                               const int64_t *shape) {
    moex_status st = moex_check_shape(t, what, ndim, shape);
    if (st) return st;
    if (!moex_is_float_dtype(t->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s is not supported (f32, f16, bf16)", what,
                         moex_dtype_name(t->dtype));
    if (t->dtype != d->gate_up.dtype)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s differs from gate_up's %s", what,
                         moex_dtype_name(t->dtype), moex_dtype_name(d->gate_up.dtype));
    if (t->device.kind != d->gate_up.device.kind || t->device.index != d->gate_up.device.index)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is on another device than gate_up", what);
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
    int64_t rows = d->gated ? 2 * d->intermediate : d->intermediate, n;
    if (d->intermediate > INT64_MAX / 2 || !moex_mul_ok(d->num_experts, rows, &n) || !moex_mul_ok(n, d->hidden, &n) ||
        !moex_mul_ok(n, 4, &n))
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
    if (!moex_is_float_dtype(d->expert_dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(d->expert_dtype));
    if (d->expert_device.kind != MOEX_DEVICE_CPU && d->expert_device.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert_device kind %d is not a moex_device_kind",
                         (int)d->expert_device.kind);
    for (int64_t e = 0; e < d->num_experts; e++) {
        const char *missing = !d->expert_up[e] ? "expert_up" : !d->expert_down[e] ? "expert_down"
                            : d->gated && !d->expert_gate[e] ? "expert_gate" : NULL;
        if (missing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s[%lld] is NULL", missing, (long long)e);
    }
    return MOEX_OK;
}

static moex_status validate(const moex_experts_desc *d) {
    moex_status st = check_sizes(d);
    if (!st) st = check_activation(d);
    if (st) return st;
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
    if (!moex_is_float_dtype(d->gate_up.dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gate_up: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(d->gate_up.dtype));
    st = check_param(d, &d->gate_up, d->transposed ? "gate_up (transposed)" : "gate_up", 3, d->transposed ? gut : gu);
    if (!st) st = check_param(d, &d->down, d->transposed ? "down (transposed)" : "down", 3, d->transposed ? dnt : dn);
    int64_t gub[2] = {E, R}, dnb[2] = {E, H};
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

void moex_layer_free(moex_layer *layer) { free(layer); }

const moex_experts_desc *moex_layer_desc(const moex_layer *layer) { return layer ? &layer->desc : NULL; }
