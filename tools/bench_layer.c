/*
 * bench_layer.c — the synthetic experts layer of `moex bench`, built once on the host for
 * every device (see bench_layer.h); bench_layer_upload() is the one step a GPU run adds.
 */
#include "bench_layer.h"
#include "bench_fail.h"
#include "bench_quant.h"
#include "bench_random.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 2- or 3-d weight view on the host; E, a, b (b may be 0 for 2-d). */
static int weight_view(moex_tensor *t, void *data, moex_dtype dt, int64_t e, int64_t a, int64_t b)
{
    int64_t shape[3] = {e, a, b};
    moex_status s = moex_tensor_init(t, data, dt, b ? 3 : 2, shape);
    return s == MOEX_OK ? 0 : bench_moex_failed("moex_tensor_init", s);
}

/* n random values of the spec's dtype into a new host buffer host[slot]. */
static int random_tensor(const bench_layer_spec *spec, bench_layer *l, int slot, double n, float scale,
                         uint64_t stream, const char *what)
{
    if (bench_alloc(&l->host[slot], n * moex_dtype_size(spec->dtype), what))
        return 1;
    return bench_fill_normal(l->host[slot], spec->dtype, (size_t)n, scale,
                             bench_stream_seed(spec->seed, stream, 0, 0), spec->threads);
}

/* Quantize host[slot] ([E, N, K]) into host[scale_slot] (scales) and host[slot] (codes). */
static int quantize_tensor(const bench_layer_spec *spec, bench_layer *l, int slot, int scale_slot, int64_t N,
                           int64_t K, moex_tensor *q, moex_tensor *scale)
{
    void *codes = NULL, *scales = NULL;
    int rc = bench_quantize(l->host[slot], spec->dtype, spec->experts, N, K, spec->qformat, spec->threads, &codes,
                            &scales, q, scale);
    free(l->host[slot]);
    l->host[slot] = codes;
    l->host[scale_slot] = scales;
    return rc ? 1 : 0;
}

int bench_layer_build(const bench_layer_spec *spec, bench_layer *l)
{
    int64_t E = spec->experts, H = spec->hidden, I = spec->intermediate;
    moex_dtype dt = spec->dtype;
    int gptoss = spec->gptoss, rc;
    memset(l, 0, sizeof *l);
    l->on = (moex_device){MOEX_DEVICE_CPU, 0};
    float s_h = 1.0f / sqrtf((float)H), s_i = 1.0f / sqrtf((float)I);
    if ((rc = random_tensor(spec, l, LAYER_GATE_UP, (double)E * 2 * I * H, s_h, 1, "gate_up")) ||
        (rc = random_tensor(spec, l, LAYER_DOWN, (double)E * H * I, s_i, 2, "down")) ||
        (gptoss && (rc = random_tensor(spec, l, LAYER_GATE_UP_BIAS, (double)E * 2 * I, s_h, 3, "bias"))) ||
        (gptoss && (rc = random_tensor(spec, l, LAYER_DOWN_BIAS, (double)E * H, s_i, 4, "bias"))))
        return rc;

    moex_experts_desc *d = &l->desc;
    moex_status s = moex_experts_desc_init(d);
    if (s != MOEX_OK)
        return bench_moex_failed("moex_experts_desc_init", s);
    d->num_experts = E;
    d->hidden = H;
    d->intermediate = I;
    d->top_k = spec->top_k;
    d->gated = 1;
    if (spec->quantized) { /* quantized experts are stored [E, out, in] */
        d->interleaved = gptoss;
        if (gptoss) {
            d->activation = MOEX_ACT_GPTOSS_CLAMP;
            if ((rc = weight_view(&d->gate_up_bias, l->host[LAYER_GATE_UP_BIAS], dt, E, 2 * I, 0)) ||
                (rc = weight_view(&d->down_bias, l->host[LAYER_DOWN_BIAS], dt, E, H, 0)))
                return rc;
        }
        if ((rc = quantize_tensor(spec, l, LAYER_GATE_UP, LAYER_GATE_UP_SCALE, 2 * I, H, &d->gate_up,
                                  &d->gate_up_scale)) ||
            (rc = quantize_tensor(spec, l, LAYER_DOWN, LAYER_DOWN_SCALE, H, I, &d->down, &d->down_scale)))
            return rc;
        if (spec->qformat == MOEX_QUANT_FP4) {
            d->block_n = 1;
            d->block_k = 32;
        }
    } else if (gptoss) {
        const int tr = spec->gptoss_transposed;
        d->interleaved = 1;
        d->transposed = tr;
        d->activation = MOEX_ACT_GPTOSS_CLAMP;
        d->alpha = 1.702f;
        d->limit = 7.0f;
        if ((rc = weight_view(&d->gate_up, l->host[LAYER_GATE_UP], dt, E, tr ? H : 2 * I, tr ? 2 * I : H)) ||
            (rc = weight_view(&d->down, l->host[LAYER_DOWN], dt, E, tr ? I : H, tr ? H : I)) ||
            (rc = weight_view(&d->gate_up_bias, l->host[LAYER_GATE_UP_BIAS], dt, E, 2 * I, 0)) ||
            (rc = weight_view(&d->down_bias, l->host[LAYER_DOWN_BIAS], dt, E, H, 0)))
            return rc;
    } else {
        d->interleaved = 0;
        d->transposed = 0;
        d->activation = MOEX_ACT_SILU;
        if ((rc = weight_view(&d->gate_up, l->host[LAYER_GATE_UP], dt, E, 2 * I, H)) ||
            (rc = weight_view(&d->down, l->host[LAYER_DOWN], dt, E, H, I)))
            return rc;
    }
    return 0;
}

moex_tensor *bench_desc_view(moex_experts_desc *d, int slot)
{
    moex_tensor *views[LAYER_TENSORS] = {&d->gate_up,      &d->down,          &d->gate_up_bias,
                                         &d->down_bias,    &d->gate_up_scale, &d->down_scale};
    return views[slot];
}

/* The view of desc that slot's buffer backs, or NULL when the layer has none. */
static moex_tensor *slot_view(bench_layer *l, int slot)
{
    moex_tensor *v = bench_desc_view(&l->desc, slot);
    return l->host[slot] && v->data == l->host[slot] ? v : NULL;
}

size_t bench_view_bytes(const moex_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n * moex_dtype_size(t->dtype);
}

int bench_layer_upload(bench_layer *l, moex_device device)
{
    l->on = device; /* where device[] lives, also when a copy below fails */
    for (int slot = 0; slot < LAYER_TENSORS; slot++) {
        moex_tensor *t = slot_view(l, slot);
        if (!t)
            continue;
        size_t bytes = bench_view_bytes(t);
        moex_status s = moex_device_alloc(device, bytes, &l->device[slot]);
        if (s != MOEX_OK) {
            char what[96];
            snprintf(what, sizeof what, "moex_device_alloc (weights, %.0f MiB)", bytes / 1048576.0);
            return bench_moex_failed(what, s);
        }
        s = moex_memcpy(l->device[slot], device, l->host[slot], (moex_device){MOEX_DEVICE_CPU, 0}, bytes);
        if (s != MOEX_OK)
            return bench_moex_failed("moex_memcpy (weights to the GPU)", s);
        t->data = l->device[slot];
        t->device = device;
        free(l->host[slot]);
        l->host[slot] = NULL;
    }
    return 0;
}

int bench_layer_create(bench_layer *l)
{
    moex_status s = moex_layer_create(&l->desc, &l->layer);
    return s == MOEX_OK ? 0 : bench_moex_failed("moex_layer_create", s);
}

const void *bench_layer_weights(const bench_layer *l, int slot)
{
    return l->device[slot] ? l->device[slot] : l->host[slot];
}

void bench_layer_free(bench_layer *l)
{
    moex_layer_free(l->layer);
    for (int slot = 0; slot < LAYER_TENSORS; slot++) {
        free(l->host[slot]);
        if (l->device[slot])
            moex_device_free(l->on, l->device[slot]);
    }
    memset(l, 0, sizeof *l);
}
