/* deepgemm_layout.h — the two layouts of the deepgemm backend's rows (SPEC R2, DeepGEMM's
 * M-grouped layouts), computed on the CPU: the reference the GPU's routing must reproduce.
 *
 * Pairs (t, j) with an id e in [0, E) are the rows; ids -1 and E are sentinels and are not rows.
 * Within an expert, rows follow the pairs' order (t, then j), so that the weighted reduction
 * adds each token's pairs in order.
 *
 * Contiguous (prefill): every expert's rows one after the other, each expert's segment padded to
 * a multiple of block_m rows; padding rows hold -1. seg[e] .. seg[e + 1] is expert e's padded
 * segment; its first count[e] rows are its pairs. The padded total is at most
 * contiguous_rows_bound(P, E, block_m), which the GPU allocates, so no count comes back to the
 * host.
 *
 * Masked (decode): every expert has `capacity` rows, expert e's at e * capacity; its first
 * count[e] hold its pairs, the rest -1. With capacity T (a token picks an expert at most once
 * among distinct ids) nothing overflows, and every shape is fixed: a forward in a CUDA graph. */
#ifndef MOEX_DEEPGEMM_LAYOUT_H
#define MOEX_DEEPGEMM_LAYOUT_H

#include "core/internal.h"

/* The most rows the contiguous layout of P pairs over E experts can take. */
static inline int64_t deepgemm_contiguous_rows_bound(int64_t P, int64_t E, int64_t block_m) {
    return (P + E * (block_m - 1)) / block_m * block_m;
}

/* ids [T, k] (i32, row stride ld) into the contiguous layout: seg [E + 1], count [E], row_pair
 * [rows_bound] (the pair t * k + j of each row, or -1). MOEX_ERR_INVALID_ARGUMENT naming an id
 * outside [-1, E], or a bound smaller than the layout, with nothing written. */
moex_status deepgemm_contiguous_layout(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E,
                                       int64_t block_m, int64_t rows_bound, int64_t *seg, int32_t *count,
                                       int32_t *row_pair);

/* ids into the masked layout: count [E], row_pair [E * capacity]. MOEX_ERR_INVALID_ARGUMENT
 * naming a bad id, or the expert whose pairs exceed capacity, with nothing written. */
moex_status deepgemm_masked_layout(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int64_t capacity,
                                   int32_t *count, int32_t *row_pair);

#endif
