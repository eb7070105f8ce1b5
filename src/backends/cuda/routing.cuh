/* routing.cuh — routing preparation and the final reduction on the GPU
 * (routing.cu): pairs sorted by expert without a host synchronisation. */
#ifndef MOEX_ROUTING_CUH
#define MOEX_ROUTING_CUH

#include "backends/cuda/device_common.cuh"
#include "core/internal.h"
#include <cuda_runtime.h>

/* Device arrays of one routing (all int32; P = T*k pairs). */
typedef struct routing_dev {
    int *counts;     /* [E]   pairs per expert */
    int *cursor;     /* [E]   scatter cursors */
    int *offsets;    /* [E+1] first slot of each expert; offsets[E]: the slots the layout spans
                               (packed: the valid pairs) */
    int *ends;       /* [E]   end of each expert's slots: offsets[e] + counts[e] */
    int *mtile_off;  /* [E+1] prefix of ceil(counts/tile_rows) */
    int *pair_slot;  /* [P]   slot of pair p = t*k+j, or -1 for a sentinel */
    int *slot_token; /* [P]   token of each slot */
    float *slot_w;   /* [P]   routing_slot_weights: each slot's routing weight (sonicmoe) */
    int *hit;        /* [E]   routing_build with hits: the experts with rows, in expert order */
    int *sched;      /* [routing_sched_ints(E)] counters routing_build zeroes (routing_sched_clear):
                               the one-launch streamed forward's (gemv.cuh's gemv_mma_experts) with
                               hits, the chained grouped GEMMs' (E + 2: gemm_sm90.cuh) without */
} routing_dev;

/* The streamed forward's schedule: done[E], its item counter and xdone (4 ints), then the
 * counters of its gate/up items split along K (at most ROUTING_SCHED_SPLIT: gemv.cuh). */
#define ROUTING_SCHED_SPLIT 4096
__host__ __device__ static inline int64_t routing_sched_ints(int64_t E) { return E + 4 + ROUTING_SCHED_SPLIT; }
/* The ints routing_build zeroes: all of them with hits, E + 4 without (at least the
 * E + 2 counters of grouped_gemm_run_chained). */
__host__ __device__ static inline int64_t routing_sched_clear(int64_t E, int hits) {
    return hits ? routing_sched_ints(E) : E + 4;
}

/* Where each expert's slots (rows of the gathered activations) begin:
 *   PACKED  right after the previous expert's (grouped_mm): P slots in all;
 *   PADDED  at a multiple of tile_rows, each expert's segment padded to whole tiles (deepgemm's
 *           contiguous layout): at most deepgemm_contiguous_rows_bound(P, E, tile_rows) slots;
 *   MASKED  at e * cap, a fixed capacity an expert (deepgemm's masked layout): E * cap slots;
 *           cap at least the most pairs an expert can get (T, with top_k distinct experts). */
typedef enum routing_layout { ROUTING_PACKED = 0, ROUTING_PADDED = 1, ROUTING_MASKED = 2 } routing_layout;

/* Bytes the arrays need, for E experts and P pairs (each array 256-byte aligned). */
size_t routing_bytes(int64_t E, int64_t P);
/* Carve the arrays from ws (device memory of routing_bytes()). */
routing_dev routing_carve(void *ws, int64_t E, int64_t P);

/* counts, offsets, ends, mtile_off (tiles of tile_rows rows), pair_slot and (packed layout only)
 * slot_token, the slots placed by layout (cap: the masked layout's capacity an expert).
 * Bad ids (outside [-1, E]) set MOEX_CUDA_FLAG_BAD_ID in *flags and count as sentinels.
 * hits = 1 (for gemv_mma_experts): tiles are whole experts, so mtile_off[e] is the number of
 * experts before e that have rows and mtile_off[E] the number of them, and hit[] lists them.
 * sched's first routing_sched_clear(E, hits) ints are zeroed. */
moex_status routing_build(const routing_dev &r, const void *ids, int ids64, int64_t ids_ld, int64_t T, int64_t k,
                          int64_t E, int tile_rows, int hits, routing_layout layout, int64_t cap, int *flags,
                          cudaStream_t s);

/* dst[pair_slot[t*k+j]] = hidden[t] for every non-sentinel pair, converted to dst_dt
 * (each row of hidden read once). */
moex_status routing_gather(const routing_dev &r, int64_t T, int64_t k, const void *hidden, moex_dtype hdt, int64_t ld,
                           void *dst, moex_dtype dst_dt, int64_t H, cudaStream_t s);

/* slot_w[pair_slot[t*k+j]] = w[t,j] (f32) for every non-sentinel pair: each slot's routing weight,
 * for an epilogue that applies it (sonicmoe's down GEMM). */
moex_status routing_slot_weights(const int *pair_slot, const void *w, moex_dtype wdt, int64_t w_ld, int64_t T,
                                 int64_t k, float *slot_w, cudaStream_t s);

/* out[t] = sum_j w[t,j] * y[pair_slot[t*k+j]] in j order (f32), stored in out's dtype; w NULL:
 * the plain sum (y already weighted); pair_slot NULL: y in pair order (row t*k+j), every pair
 * added. */
moex_status routing_reduce(const int *pair_slot, const void *y, moex_dtype ydt, int64_t H, const void *w,
                           moex_dtype wdt, int64_t w_ld, int64_t T, int64_t k, void *out, moex_dtype odt,
                           int64_t out_ld, cudaStream_t s);

#endif
