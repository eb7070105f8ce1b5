/* deepgemm_layout.c — the deepgemm backend's row layouts on the CPU (see deepgemm_layout.h). */
#include "backends/deepgemm_layout.h"

#include <stdlib.h>

/* count[e] for every expert after checking every id; MOEX_ERR_INVALID_ARGUMENT naming a bad one. */
static moex_status count_pairs(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int32_t *count) {
    for (int64_t e = 0; e < E; e++) count[e] = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * ld + j];
            if (e < -1 || e > E)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "ids[%lld,%lld] = %d is outside [-1, %lld]", (long long)t,
                                 (long long)j, (int)e, (long long)E);
            if (e >= 0 && e < E) count[e]++;
        }
    return MOEX_OK;
}

moex_status deepgemm_contiguous_layout(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E,
                                       int64_t block_m, int64_t rows_bound, int64_t *seg, int32_t *count,
                                       int32_t *row_pair) {
    if (T < 0 || k < 1 || ld < k || E < 1 || block_m < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "contiguous layout: T = %lld, k = %lld, ld = %lld, E = %lld, "
                         "block_m = %lld", (long long)T, (long long)k, (long long)ld, (long long)E, (long long)block_m);
    int32_t *c = (int32_t *)malloc(sizeof *c * (size_t)E);
    if (!c) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "contiguous layout: counts of %lld experts", (long long)E);
    moex_status st = count_pairs(ids, T, k, ld, E, c);
    int64_t rows = 0;
    for (int64_t e = 0; !st && e < E; e++) rows += (c[e] + block_m - 1) / block_m * block_m;
    if (!st && rows > rows_bound)
        st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "contiguous layout: %lld rows do not fit the bound of %lld",
                       (long long)rows, (long long)rows_bound);
    if (st) {
        free(c);
        return st;
    }
    seg[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        seg[e + 1] = seg[e] + (c[e] + block_m - 1) / block_m * block_m;
        count[e] = c[e];
        c[e] = 0; /* now: rows placed so far */
    }
    for (int64_t r = 0; r < rows_bound; r++) row_pair[r] = -1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * ld + j];
            if (e >= 0 && e < E) row_pair[seg[e] + c[e]++] = (int32_t)(t * k + j);
        }
    free(c);
    return MOEX_OK;
}

moex_status deepgemm_masked_layout(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int64_t capacity,
                                   int32_t *count, int32_t *row_pair) {
    if (T < 0 || k < 1 || ld < k || E < 1 || capacity < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "masked layout: T = %lld, k = %lld, ld = %lld, E = %lld, capacity = %lld",
                         (long long)T, (long long)k, (long long)ld, (long long)E, (long long)capacity);
    int32_t *c = (int32_t *)malloc(sizeof *c * (size_t)E);
    if (!c) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "masked layout: counts of %lld experts", (long long)E);
    moex_status st = count_pairs(ids, T, k, ld, E, c);
    for (int64_t e = 0; !st && e < E; e++)
        if (c[e] > capacity)
            st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "masked layout: expert %lld has %d pairs, more than its capacity of %lld",
                           (long long)e, (int)c[e], (long long)capacity);
    if (st) {
        free(c);
        return st;
    }
    for (int64_t e = 0; e < E; e++) count[e] = c[e], c[e] = 0;
    for (int64_t r = 0; r < E * capacity; r++) row_pair[r] = -1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[t * ld + j];
            if (e >= 0 && e < E) row_pair[e * capacity + c[e]++] = (int32_t)(t * k + j);
        }
    free(c);
    return MOEX_OK;
}
