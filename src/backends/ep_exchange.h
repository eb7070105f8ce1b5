/* ep_exchange.h — expert parallelism's dispatch and combine, computed on the host: the reference
 * the GPU's exchange (issue: deepgemm_megamoe, plain EP over NCCL) is to reproduce.
 *
 * A group of R ranks shares E experts: rank r owns experts [r E/R, (r+1) E/R) (E divisible by
 * R). Each rank holds its own tokens. Dispatch: each of a rank's pairs (t, j) whose id e is an
 * expert goes, as one row (token t's hidden state, e's index on its owner), to the owner of e;
 * sentinels (-1 and E) go nowhere. A rank's sends are grouped by destination rank, and within one
 * destination they follow the pairs' order (t, then j), so the receiving rank's rows from source
 * s are the s-th block of its input and each block comes back in the order it went. Combine:
 * each pair's result row comes back to the token's rank, which adds out[t] = sum_j w[t, j] *
 * y[t, j] in j order (deterministic, no atomics; a sentinel pair adds nothing). */
#ifndef MOEX_EP_EXCHANGE_H
#define MOEX_EP_EXCHANGE_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* E experts over a group of `ranks`: MOEX_OK, or MOEX_ERR_INVALID_ARGUMENT naming E and the group
 * size when ranks < 1 or E is not a multiple of it. */
moex_status moex_ep_check(int64_t E, int ranks);

/* One rank's dispatch of ids [T, k] (i32, row stride ld) over `ranks` ranks: count [ranks] rows
 * to each rank, offset [ranks + 1] where each rank's rows start in the send order (offset[ranks]:
 * the rows sent), per row, in send order, pair [P] (t * k + j) and local [P] (the expert's index
 * on its owner, 0 .. E/ranks - 1), and per pair row_of [P] (its row, or -1 for a sentinel);
 * P = T * k. An id outside [-1, E] is MOEX_ERR_INVALID_ARGUMENT naming it and its place, with
 * nothing written. */
moex_status moex_ep_dispatch_plan(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int ranks,
                                  int64_t *count, int64_t *offset, int32_t *pair, int32_t *local, int32_t *row_of);

/* The rows a rank sends: row i of send [rows, H] is token pair[i] / k's hidden state (x [T, H], f32,
 * row stride x_ld). */
void moex_ep_gather_rows(const float *x, int64_t x_ld, int64_t H, int64_t k, const int32_t *pair, int64_t rows,
                         float *send);

/* The combine on the tokens' rank: y [rows, H] holds the results of its rows in send order (as
 * they came back); out [T, H] (f32, row stride out_ld) = sum over j of w[t, j] * y[row_of[t k + j]]
 * in j order, f32 (the plan's row_of; sentinels add nothing); a token with no expert gets zeros. */
void moex_ep_combine(const float *y, int64_t H, const int32_t *row_of, const float *w, int64_t T, int64_t k, float *out,
                     int64_t out_ld);

/* What every rank of a forward returns when rank r of R reported status `code` (nonzero) at a
 * step, `what` saying which ("refused this forward"): MOEX_ERR_INVALID_ARGUMENT naming the rank. */
moex_status moex_ep_rank_failed(int r, int R, int64_t code, const char *what);

/* Rank r's layer, lay = {experts, hidden, top_k, activation dtype}, against rank 0's lay0:
 * MOEX_OK, or MOEX_ERR_INVALID_ARGUMENT naming both (every rank must run the same layer). */
moex_status moex_ep_same_layer(int r, const int64_t *lay, const int64_t *lay0);

#ifdef __cplusplus
}
#endif

#endif
