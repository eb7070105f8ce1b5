/* ep_plan.h — expert parallelism's dispatch plan on the GPU (ep_plan.cu): the device form of
 * ep_exchange.h's host plan, in blocks of a fixed capacity so that no size has to come back to
 * the host (the GPU exchange of plain EP and deepgemm_megamoe builds on it).
 *
 * A group of R ranks shares E experts, rank r owning [r E/R, (r+1) E/R). A rank's T tokens give
 * P = T k pairs; pair p = t k + j goes to the owner r of its id e (sentinels -1 and E go nowhere).
 * The send buffer has R blocks of cap rows (cap >= P: the most one rank can be sent), block r
 * holding the rows for rank r in pair order (the host plan's order): row r cap + i. So that:
 *   - row_of[p] is pair p's row of the send buffer (-1 for a sentinel): the host plan's
 *     row_of[p] - offset[r] + r cap; the rows to send are routing_gather's with row_of as the
 *     pair slots, and the combine is routing_reduce's over the rows come back (same layout);
 *   - count[r] is the rows for rank r;
 *   - local[r cap + i] is row i's expert on its owner (e - r E/R), and E/R ("not routed here",
 *     the owner's sentinel) for i >= count[r]: block r of local is what rank r receives as the
 *     ids of block me of its rows, whole (cap ints), so that the owner runs its backend over all
 *     rows it may receive (ep_forward_cuda.cu packs each sender's block at the pair counts
 *     posted before it), the rows past each block's count skipped as sentinels.
 * Every array is written whole by one launch (no zeroing before it), in stream order. */
#ifndef MOEX_EP_PLAN_H
#define MOEX_EP_PLAN_H

#include "core/internal.h"
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moex_ep_dev_plan {
    int32_t *count;  /* [R] */
    int32_t *row_of; /* [P] */
    int32_t *local;  /* [R cap] */
} moex_ep_dev_plan;

/* Device bytes of a plan for R ranks, P pairs and blocks of cap rows (each array 256-byte
 * aligned), and the plan's arrays carved from ws (device memory of that many bytes). */
size_t moex_ep_dev_plan_bytes(int R, int64_t P, int64_t cap);
moex_ep_dev_plan moex_ep_dev_plan_carve(void *ws, int R, int64_t P, int64_t cap);

/* The plan of ids [T, k] (device; int64 when ids64, else int32; row stride ld elements) over R
 * ranks: MOEX_ERR_INVALID_ARGUMENT (nothing launched) when E is not a multiple of R, R < 1,
 * T < 0, k < 1, ld < k or cap < T k; an id outside [-1, E] sets MOEX_CUDA_FLAG_BAD_ID in *flags
 * (device) and its pair counts as a sentinel. One launch of R blocks on s. */
moex_status moex_ep_dev_plan_build(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int R,
                                   int64_t cap, const moex_ep_dev_plan *plan, int *flags, cudaStream_t s);

/* For each of `blocks` blocks b: rows[b] rows (read on the device, at most max_rows) of row_bytes
 * bytes from src + b src_stride to dst + b dst_stride (byte strides; device pointers this GPU can
 * reach: its own memory, or a peer's with peer access on). The exchange of blocks whose sizes
 * only the GPU knows: the rows past rows[b] are not touched. row_bytes and the strides multiples
 * of 16 with 16-byte aligned src and dst, or any (byte copies). One launch on s. */
moex_status moex_ep_dev_copy_blocks(const int32_t *rows, int blocks, int64_t max_rows, const void *src,
                                    int64_t src_stride, void *dst, int64_t dst_stride, int64_t row_bytes,
                                    cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
