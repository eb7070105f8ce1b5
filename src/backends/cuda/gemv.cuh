/* gemv.cuh — the memory-bound expert kernels (gemv.cu; FP4 weights gemv_fp4.cu): each warp
 * computes one output feature for a few rows, streaming its weight rows once. They
 * serve batched_mm (a group per (token, expert) pair), grouped_mm and eager
 * at small token counts (a group per expert), and every layout the tensor-core
 * path does not take (any strides, f32, per-expert pointers; FP4 at every size). */
#ifndef MOEX_GEMV_CUH
#define MOEX_GEMV_CUH

#include "backends/cuda/device_common.cuh"
#include "core/internal.h"
#include <cuda_runtime.h>

/* Which rows a group covers. pairs = 1: group p = pair (t, j) of ids [T, k],
 * expert ids[t, j], input row t, output row p. pairs = 0: group g = expert
 * e_begin + g (or, with hit, expert hit[g] for g < *n_hit: the experts with rows,
 * routing_build with hits), input rows slot_token[s] and output rows s for s in
 * offsets[e] .. offsets[e+1]. */
typedef struct gemv_groups {
    int pairs;
    const void *ids;
    int ids64;
    int64_t ids_ld, T, k;
    const int *offsets, *slot_token;
    const int *hit, *n_hit;
    int64_t e_begin, count;
    int *flags; /* pairs = 1: bad ids (not in [-1, E]) set MOEX_CUDA_FLAG_BAD_ID here */
} gemv_groups;

/* Expert of group g and its rows [*lo, *hi); -1 when the group is empty or a sentinel. */
__device__ __forceinline__ int64_t group_rows(const gemv_groups &G, int64_t E, int64_t g, int64_t *lo, int64_t *hi) {
    if (G.pairs) {
        int64_t e = load_id(G.ids, G.ids64, G.ids_ld, g / G.k, g % G.k);
        *lo = g, *hi = g + 1;
        if (e >= 0 && e < E) return e;
        if (e != -1 && e != E && G.flags && (threadIdx.x & 31) == 0) atomicOr(G.flags, 1 /* MOEX_CUDA_FLAG_BAD_ID */);
        return -1;
    }
    int64_t e = G.e_begin + g;
    if (G.hit) {
        if (g >= *G.n_hit) return -1;
        e = G.hit[g];
    }
    *lo = G.offsets[e], *hi = G.offsets[e + 1];
    return *hi > *lo ? e : -1;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The end of a warp's gate/up sums for feature n of expert e over rows r0 .. r0+nr (nr <= R):
 * reduced over the warp, biased, activated, h[row, n] stored by lane 0. */
template <int R>
__device__ __forceinline__ void store_gate_up_rows(const layer_view &L, float *h, int64_t e, int64_t n, int64_t r0,
                                                   int nr, float (&ag)[R], float (&au)[R], int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        au[r] = warp_sum(au[r]);
        if (L.gated) ag[r] = warp_sum(ag[r]);
    }
    if (lane == 0) {
        const float bu = bias_at(L.up_bias, L.bdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.bdt, e, n) : 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) h[(r0 + r) * L.I + n] = activate(L, ag[r] + bg, au[r] + bu);
    }
}

/* The same for the pairs kernels: features n and (two) n + 1 of pair p. */
__device__ __forceinline__ void store_gate_up_pair(const layer_view &L, float *h, int64_t p, int64_t e, int64_t n,
                                                   int two, float ag0, float ag1, float au0, float au1, int lane) {
    au0 = warp_sum(au0), au1 = warp_sum(au1);
    if (L.gated) ag0 = warp_sum(ag0), ag1 = warp_sum(ag1);
    if (lane != 0) return;
    h[p * L.I + n] = activate(L, ag0 + (L.gated ? bias_at(L.gate_bias, L.bdt, e, n) : 0.0f), au0 + bias_at(L.up_bias, L.bdt, e, n));
    if (two)
        h[p * L.I + n + 1] = activate(L, ag1 + (L.gated ? bias_at(L.gate_bias, L.bdt, e, n + 1) : 0.0f),
                                      au1 + bias_at(L.up_bias, L.bdt, e, n + 1));
}

/* h[row, n] (f32, [*, I]) = act(gate . x + bias, up . x + bias) for every row of every group. */
moex_status gemv_gate_up(const layer_view &L, const gemv_groups &G, const void *x, moex_dtype xdt, int64_t x_ld,
                         float *h, cudaStream_t s);
/* batched_mm's FP8 gate/up (pairs; x: the quantized inputs, f32 [T, H]) and down. */
moex_status gemv_gate_up_fp8(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *x, float *h,
                             cudaStream_t s);
moex_status gemv_down_pairs_fp8(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *h,
                                const void *w, moex_dtype wdt, int64_t w_ld, void *out, moex_dtype odt, int64_t out_ld,
                                cudaStream_t s);

/* FP4 weights (gemv_fp4.cu): e2m1 codes, a scale per row per 32 inputs (Q: bn 1, bk 32), H and I
 * multiples of 32, vector-loadable matrices (proj_view strides in bytes, two codes a byte). The
 * inputs are act_quant_e2m1's int8 codes and scales: xq [T, H], xs [T, H/32] by token (gate/up,
 * pairs or per expert), hq [P, I], hs [P, I/32] by pair or slot (down). */
int gemv_fp4_usable(const layer_view &L, const quant_view &Q);
moex_status gemv_gate_up_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *xq,
                             const float *xs, float *h, cudaStream_t s);
/* batched_mm's FP4 down with the weighted sum (as gemv_down_pairs). */
moex_status gemv_down_pairs_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *hq,
                                const float *hs, const void *w, moex_dtype wdt, int64_t w_ld, void *out,
                                moex_dtype odt, int64_t out_ld, cudaStream_t s);
/* grouped_mm's FP4 experts on the tensor cores (integer mma, per expert its slots' rows): gate/up
 * into h [P, I], h quantized into hq, hs, down into y [P, H] f32 in slot order; G as for the
 * per-expert kernels. */
/* 1 if grouped_mm's FP4 layer of P pairs over E experts takes the tensor-core kernels: from 2 rows
 * an expert on average (below that a warp's 8-row mma tiles are mostly empty and the per-expert
 * kernels' 16-byte loads stream the weights better). */
static inline int gemv_fp4_mma_pays(int64_t P, int64_t E) { return P >= 2 * E; }
moex_status gemv_mma_experts_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *xq,
                                 const float *xs, float *h, int8_t *hq, float *hs, float *y, int64_t P, cudaStream_t s);
/* grouped_mm's FP4 down per expert: y [P, H] f32 in slot order (as gemv_down_experts). */
moex_status gemv_down_experts_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *hq,
                                  const float *hs, float *y, cudaStream_t s);

/* batched_mm's second half: out[t, n] = sum_j w[t, j] * (down_e . h[t*k+j] + bias), j in order. */
moex_status gemv_down_pairs(const layer_view &L, const gemv_groups &G, const float *h, const void *w, moex_dtype wdt,
                            int64_t w_ld, void *out, moex_dtype odt, int64_t out_ld, cudaStream_t s);

/* y[slot, n] (f32, [*, H]) = down_e . h[slot] + bias for the experts of G (pairs = 0). */
moex_status gemv_down_experts(const layer_view &L, const gemv_groups &G, const float *h, float *y, cudaStream_t s);

/* batched_mm's down for long rows (gemv_down_pair_rows_pays): y [P, H] f32 in pair order, each
 * row times its pair's routing weight w[t, j] (a sentinel pair's row 0), a block reading one
 * pair's expert; routing_reduce with no pair_slot and no weights then sums each token's pairs
 * in j order. bf16/f16/f32 with vector loads, FP8 as gemv_quant_usable (h the quantized values).
 * Below PAIR_ROWS_MIN_H hidden features the down pairs kernel's single launch is faster
 * (measured: dev/notes/cuda-notes.md, "2026-12-07, third session": qwen3-30b-a3b, H 2048, 1.16
 * of its time at one token; deepseek-v3, H 7168, 0.94); above PAIR_ROWS_MAX_TOKENS tokens the
 * down pairs kernel runs too, so that y's workspace stays small (batched_mm's weight traffic
 * grows with the pairs: grouped_mm is the backend for such T). */
#define PAIR_ROWS_MIN_H 4096
#define PAIR_ROWS_MAX_TOKENS 64
static inline int gemv_down_pair_rows_pays(int64_t H, int64_t T) { return H >= PAIR_ROWS_MIN_H && T <= PAIR_ROWS_MAX_TOKENS; }
moex_status gemv_down_pair_rows(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *h,
                                const void *w, moex_dtype wdt, int64_t w_ld, float *y, cudaStream_t s);

/* 1 if every matrix of L can be read with 16-byte vector loads along k. */
int gemv_vectorizable(const layer_view &L, size_t wsz);
/* 1 if batched_mm's kernels take L's FP8 weights: e4m3 with scales, bk a multiple of 16, H and I
 * multiples of 16, vector-loadable matrices. Their inputs are then the quantized activations,
 * f32 code * scale (act_quant.cuh): gemv_gate_up with pairs, gemv_down_pairs. */
int gemv_quant_usable(const layer_view &L, const quant_view &Q);

/* The inputs of one launch: x [T, x_ld] (dtype xdt; bf16/f16: the weights' dtype), h [P, I]
 * (the weights' dtype; FP8: f32) and y [P, H] f32. FP8 also: xq [T, H] and xs [T, ceil(H/bk)],
 * the quantized x; hq [P, I] and hs [P, ceil(I/bk)], the quantized h. */
typedef struct mma_io {
    const void *x;
    moex_dtype xdt;
    int64_t x_ld;
    void *h;
    float *y;
    uint8_t *xq, *hq;
    float *xs, *hs;
    quant_view q; /* FP8: the weights' scales */
    float *part;  /* NULL, or split gate/up items' partial sums (bf16/f16, at most MMA_SPLIT_PAIRS pairs):
                     [MMA_KSPLIT_MAX, P, gated ? 2 : 1, I] f32 (mma_split_bytes) */
} mma_io;

/* Gate/up items split along K: when the hit experts' gate/up items (16 features each) are fewer
 * than the launch's warps (one token of deepseek-v3: 8 x 128 items for 2112 warps), each item is
 * cut into up to MMA_KSPLIT_MAX parts of at least MMA_SPLIT_MIN_K inputs, as many as keep most
 * warps streaming weights (gemv_mma.cu's split_parts); the part that finishes last adds the parts' sums in part order (the
 * same result whatever the timing) and applies the activation. Only forwards of at most
 * MMA_SPLIT_PAIRS pairs (io.part), bf16/f16 weights; at most ROUTING_SCHED_SPLIT items split
 * (routing.cuh: their counters follow the schedule in sched, which routing_build zeroes). */
#define MMA_KSPLIT_MAX 4
#define MMA_SPLIT_MIN_K 1024
#define MMA_SPLIT_PAIRS 64
/* Bytes of io.part for forwards of up to P pairs (those of at most MMA_SPLIT_PAIRS split). */
static inline size_t mma_split_bytes(int64_t P, int64_t I, int gated) {
    const int64_t rows = P < MMA_SPLIT_PAIRS ? P : MMA_SPLIT_PAIRS;
    return (size_t)MMA_KSPLIT_MAX * (size_t)rows * (gated ? 2 : 1) * (size_t)I * 4;
}

/* grouped_mm's streamed forward on tensor cores in one launch (gemv_mma.cu), for the layers
 * where gemv_mma_usable: bf16 or f16 weights, x in the same dtype with 16-byte aligned rows,
 * H and I multiples of 32, vector-loadable matrices; or FP8 weights with bk a multiple of 64,
 * H and I multiples of 16, vector-loadable matrices, x of any float dtype. G.pairs = 0, over
 * all E experts; hit, n_hit (= mtile_off + E) and sched are those of routing_build with
 * hits = 1, sched zeroed there for each launch (routing_sched_ints of them). h is rounded to bf16/f16 as the tensor-core
 * GEMM rounds it; a persistent grid of num_sms x (the blocks an SM holds). */
int gemv_mma_usable(const layer_view &L, const quant_view &Q, moex_dtype xdt, const void *x, int64_t x_ld);
/* Once per process, outside capture (prepare): the kernel's shared memory size and grid. */
moex_status gemv_mma_init(void);
moex_status gemv_mma_experts(const layer_view &L, const gemv_groups &G, const int *hit, const int *n_hit, int *sched,
                             const mma_io &io, int num_sms, cudaStream_t s);

#endif
