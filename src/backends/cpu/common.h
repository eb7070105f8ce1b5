/* common.h — pieces the three CPU backends share: workspace carving, the
 * f32 view of the hidden states, routing sorted by expert, the packed GEMM
 * driver, the gate/up epilogue and the weighted reduction in token order. */
#ifndef MOEX_CPU_COMMON_H
#define MOEX_CPU_COMMON_H

#include "backends/impl.h"
#include "linear/gemm.h"
#include <stdio.h>


/* Bump allocator over the workspace. With base == NULL it only counts, so
 * workspace_bytes() and forward() carve the same layout. */
typedef struct moex_ws {
    char *base;
    size_t used;
} moex_ws;

void *moex_ws_take(moex_ws *ws, size_t bytes);
/* rows x cols elements of elem bytes. On any overflow the size saturates to SIZE_MAX
 * (and workspace_bytes() then makes moex_prepare fail). */
void *moex_ws_take_array(moex_ws *ws, int64_t rows, int64_t cols, size_t elem);

/* Per-thread scratch for the GEMM driver and the epilogues. */
typedef struct moex_thread_scratch {
    float *pack; /* MOEX_KC x 2*MOEX_NB */
    float *row;  /* max(H, 2I) floats */
    float *h;    /* I floats */
} moex_thread_scratch;

/* Carve scratch for `threads` threads (array of them). */
moex_thread_scratch *moex_ws_thread_scratch(moex_ws *ws, const moex_experts_desc *d, int threads);

/* hidden as f32 rows: points into hidden when it is f32, else into a
 * converted copy in the workspace. */
typedef struct moex_rows {
    const float *base;
    int64_t stride;
} moex_rows;

static inline const float *moex_row(const moex_rows *r, int64_t t) { return r->base + t * r->stride; }

/* Carve (and, with a real workspace, fill in parallel) the f32 view of hidden [T, H]. */
moex_rows moex_hidden_rows(moex_ws *ws, const moex_cpu_kernels *kr, const moex_tensor *hidden, int64_t T,
                           int64_t H, int threads);

/* The (token, slot) pairs sorted by expert (stable: pair order within an expert).
 * pair p = t*k + j. offsets[e] .. offsets[e+1] index `sorted`; pos[p] is p's
 * place in `sorted`, or -1 for a sentinel. */
typedef struct moex_routing {
    int64_t *offsets; /* [E+1] */
    int32_t *sorted;  /* [T*k] */
    int32_t *pos;     /* [T*k] */
} moex_routing;

moex_routing moex_routing_sort(moex_ws *ws, const moex_experts_desc *d, const moex_tensor *ids, int64_t T);

/* First projection of expert e for intermediate columns j0 .. j0+nb, M rows:
 *   gu[M, R] (row stride R = gated ? 2I : I, columns in gate_up's row order) gets the
 *   raw projections (+ bias) for this block; h[M, nb] (row stride ldh) = act(gate) * up. */
void moex_gate_up_block(const moex_cpu_kernels *kr, const moex_experts_desc *d, int64_t e, const float *const *a,
                        int64_t M, int64_t j0, int64_t nb, float *pack, float *gu, float *h, int64_t ldh);

/* h[M, nb] = act(gate) * up from raw projections gu[M, R] (row stride R) for
 * intermediate columns j0 .. j0+nb (concatenated, interleaved or ungated). */
void moex_activation_block(const moex_experts_desc *d, const float *gu, int64_t M, int64_t j0, int64_t nb, float *h,
                           int64_t ldh, float *scratch);

/* out[t] = sum_j w[t,j] * y[pos[t*k+j]] in slot order j, f32 sum, stored in
 * out's dtype. y: [*, H] f32. Parallel over tokens. */
void moex_reduce_tokens(const moex_cpu_kernels *kr, const moex_forward_args *args, const int32_t *pos,
                        const float *y, moex_thread_scratch *scratch);

/* Element `offset` of expert e's bias row (gate_up_bias or down_bias), or NULL without a bias. */
static inline const void *moex_bias_at(const moex_tensor *bias, int64_t e, int64_t offset) {
    if (!moex_tensor_present(bias)) return NULL;
    return (const char *)bias->data + (e * bias->strides[0] + offset) * (int64_t)moex_dtype_size(bias->dtype);
}

/* ---- quantized experts ---- */

static inline int moex_layer_quantized(const moex_experts_desc *d) { return moex_is_quant_dtype(moex_weight_dtype(d)); }

/* Channels per activation scale: block_k for e4m3 weights, 32 for e2m1. */
int64_t moex_act_quant_block(const moex_experts_desc *d);

/* Dynamic activation quantization of n rows of `cols` channels from src into out [n, cols]
 * (parallel over rows; call outside a parallel region). Returns out as rows. */
moex_rows moex_quantize_rows(const moex_cpu_kernels *kr, const moex_experts_desc *d, moex_rows src, float *out,
                             int64_t n, int64_t cols, int threads);

/* Eager's reference path: rows r0 .. r1 of expert e dequantized to f32, counting the R = (gated ? 2I : I)
 * gate_up rows first (into gate_up [R, H], physical row order) and then the H down rows (into down [H, I]). */
void moex_dequantize_expert(const moex_experts_desc *d, int64_t e, int64_t r0, int64_t r1, float *gate_up, float *down);

/* The CPU implementations' condition on a layer (their moex_impl.supports): quantized experts
 * need dynamic activation scales. */
int moex_cpu_layer_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);

#endif
