/*
 * bench_layer.h — the synthetic experts layer of `moex bench` (tools/bench_layer.c): its
 * random weights and description built once on the host, whatever the device; for a GPU
 * run the upload hook copies them to device memory before the moex_layer is made.
 */
#ifndef MOEX_TOOLS_BENCH_LAYER_H
#define MOEX_TOOLS_BENCH_LAYER_H

#include "moex.h"

#include <stdint.h>

/* What the layer is made of. */
typedef struct bench_layer_spec {
    int64_t experts, hidden, intermediate, top_k;
    moex_dtype dtype;          /* of the weights (and biases) before any quantization */
    int quantized;             /* 1: weights quantized to qformat; biases stay in dtype */
    moex_quant_format qformat;
    int gptoss;                /* GPT-OSS layout: interleaved, biases, clamped activation */
    int gptoss_transposed;     /* float GPT-OSS weights [E, in, out] as checkpoints store them (the CPU, whose
                                  model loader keeps them so); 0: [E, out, in], as it uploads them to a GPU */
    uint64_t seed;
    int threads;               /* host threads that make the weights */
} bench_layer_spec;

/* The weight tensors of a layer, as slots of bench_layer's buffers. */
enum { LAYER_GATE_UP, LAYER_DOWN, LAYER_GATE_UP_BIAS, LAYER_DOWN_BIAS, LAYER_GATE_UP_SCALE,
       LAYER_DOWN_SCALE, LAYER_TENSORS };

typedef struct bench_layer {
    moex_experts_desc desc;      /* its weight views are over host[] or, once uploaded, device[] */
    void *host[LAYER_TENSORS];   /* owned host buffers (NULL once uploaded, or unused) */
    void *device[LAYER_TENSORS]; /* owned device copies (NULL on the CPU) */
    moex_device on;              /* where desc's weights are */
    moex_layer *layer;           /* made by bench_layer_create() */
} bench_layer;

/**
 * Random weights ~ N(0,1)/sqrt(fan_in) (biases too), quantized when spec asks, and the
 * description over them, all on the host. Returns 0, or 1 after printing why.
 */
int bench_layer_build(const bench_layer_spec *spec, bench_layer *l);

/**
 * The device-upload hook: copy every weight tensor of l to new memory on `device`, point
 * desc at the copies and free the host buffers. Returns 0, or 1 after printing why.
 */
int bench_layer_upload(bench_layer *l, moex_device device);

/** The view of desc that tensor `slot` (LAYER_GATE_UP, ...) is. */
moex_tensor *bench_desc_view(moex_experts_desc *d, int slot);

/** Bytes of a dense view: the product of its shape times its dtype's size. */
size_t bench_view_bytes(const moex_tensor *t);

/** The moex layer over desc (host or device weights). Returns 0, or 1 after printing why. */
int bench_layer_create(bench_layer *l);

/** The weights of tensor `slot` where desc has them (device or host), or NULL. */
const void *bench_layer_weights(const bench_layer *l, int slot);

/** Free everything l owns (host, device, the layer); l is zeroed. */
void bench_layer_free(bench_layer *l);

#endif /* MOEX_TOOLS_BENCH_LAYER_H */
