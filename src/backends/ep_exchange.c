/* ep_exchange.c — expert parallelism's dispatch and combine on the host (see ep_exchange.h). */
#include "backends/ep_exchange.h"

#include <string.h>

moex_status moex_ep_check(int64_t E, int ranks) {
    if (ranks < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: the group size must be at least 1, not %d", ranks);
    if (E < 1 || E % ranks)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: %lld experts do not divide among %d ranks (each "
                         "rank owns E / ranks of them)", (long long)E, ranks);
    return MOEX_OK;
}

moex_status moex_ep_dispatch_plan(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int ranks,
                                  int64_t *count, int64_t *offset, int32_t *pair, int32_t *local, int32_t *row_of) {
    moex_status st = moex_ep_check(E, ranks);
    if (st) return st;
    if (T < 0 || k < 1 || ld < k || (T && (!ids || !pair || !local || !row_of)) || !count || !offset)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_dispatch_plan: bad arguments (T %lld, k %lld, ld %lld)",
                         (long long)T, (long long)k, (long long)ld);
    if (T * k > INT32_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_dispatch_plan: %lld pairs do not fit int32 pair indices",
                         (long long)(T * k));
    for (int64_t t = 0; t < T; t++) /* every id checked before anything is written */
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * ld + j];
            if (e < -1 || e > E)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_dispatch_plan: ids[%lld][%lld] = %d is outside [-1, %lld]",
                                 (long long)t, (long long)j, e, (long long)E);
        }
    const int64_t per = E / ranks;
    for (int r = 0; r < ranks; r++) count[r] = 0;
    for (int64_t p = 0; p < T * k; p++) {
        const int32_t e = ids[(p / k) * ld + p % k];
        if (e >= 0 && e < E) count[e / per]++;
    }
    offset[0] = 0;
    for (int r = 0; r < ranks; r++) offset[r + 1] = offset[r] + count[r];
    /* a second pass places each pair after the ones before it with the same destination */
    for (int r = 0; r < ranks; r++) count[r] = 0;
    for (int64_t p = 0; p < T * k; p++) {
        const int32_t e = ids[(p / k) * ld + p % k];
        row_of[p] = -1;
        if (e < 0 || e >= E) continue;
        const int r = (int)(e / per);
        const int64_t at = offset[r] + count[r]++;
        pair[at] = (int32_t)p;
        local[at] = (int32_t)(e - r * per);
        row_of[p] = (int32_t)at;
    }
    return MOEX_OK;
}

void moex_ep_gather_rows(const float *x, int64_t x_ld, int64_t H, int64_t k, const int32_t *pair, int64_t rows,
                         float *send) {
    for (int64_t i = 0; i < rows; i++) memcpy(send + i * H, x + (pair[i] / k) * x_ld, (size_t)H * sizeof *x);
}

void moex_ep_combine(const float *y, int64_t H, const int32_t *row_of, const float *w, int64_t T, int64_t k, float *out,
                     int64_t out_ld) {
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * out_ld;
        memset(o, 0, (size_t)H * sizeof *o);
        for (int64_t j = 0; j < k; j++) {
            const int32_t i = row_of[t * k + j];
            if (i < 0) continue;
            const float wt = w[t * k + j], *yi = y + (int64_t)i * H;
            for (int64_t h = 0; h < H; h++) o[h] += wt * yi[h];
        }
    }
}

moex_status moex_ep_rank_failed(int r, int R, int64_t code, const char *what) {
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: rank %d of %d %s (%s); nothing was written", r, R,
                     what, moex_status_str((moex_status)code));
}

moex_status moex_ep_same_layer(int r, const int64_t *lay, const int64_t *lay0) {
    if (!memcmp(lay, lay0, 4 * sizeof *lay)) return MOEX_OK;
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                     "expert parallelism: rank %d's forward has %lld experts, hidden %lld, top_k %lld and %s "
                     "activations, rank 0's %lld, %lld, %lld and %s: every rank must run the same layer",
                     r, (long long)lay[0], (long long)lay[1], (long long)lay[2], moex_dtype_name((moex_dtype)lay[3]),
                     (long long)lay0[0], (long long)lay0[1], (long long)lay0[2], moex_dtype_name((moex_dtype)lay0[3]));
}
