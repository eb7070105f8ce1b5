/* linear.c — nn.Linear over the experts' CPU GEMM, and the embedding lookup (see decoder.h). */
#include "decoder/decoder.h"
#include "linear/gemm.h"
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* Output columns per work item: moex_gemm's packed path takes at most 2*MOEX_NB. */
#define LINEAR_NB (2 * MOEX_NB)

/* ---- checks -------------------------------------------------------------- */

static moex_status check_weight_ptr(const void *p, moex_dtype dt, const char *what) {
    if (!p) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    size_t esz = moex_dtype_size(dt);
    if ((uintptr_t)p % esz != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s (%s) at %p is not aligned to %zu bytes", what,
                         moex_dtype_name(dt), p, esz);
    return MOEX_OK;
}

/* Check a linear layer description: dtypes, sizes, pointers and their alignment. */
static moex_status check_linear(const moex_linear_w *w) {
    if (!w) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: the layer description is NULL");
    if (!moex_is_float_dtype(w->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: weight dtype %s (%d) is not f32, f16 or bf16",
                         moex_dtype_name(w->dtype), (int)w->dtype);
    if (w->out_features < 1 || w->in_features < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "linear: weight shape [%lld, %lld] (out_features, in_features) must be at least [1, 1]",
                         (long long)w->out_features, (long long)w->in_features);
    int64_t n;
    if (!moex_mul_ok(w->out_features, w->in_features, &n) || n > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: weight shape [%lld, %lld] overflows",
                         (long long)w->out_features, (long long)w->in_features);
    moex_status st = check_weight_ptr(w->weight, w->dtype, "linear: weight");
    if (st) return st;
    if (w->bias) {
        if (!moex_is_float_dtype(w->bias_dtype))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: bias dtype %s (%d) is not f32, f16 or bf16",
                             moex_dtype_name(w->bias_dtype), (int)w->bias_dtype);
        st = check_weight_ptr(w->bias, w->bias_dtype, "linear: bias");
        if (st) return st;
    }
    return MOEX_OK;
}

/* ---- linear ------------------------------------------------------------- */

// x: [T, K] -> y: [T, N]
moex_status moex_linear(const moex_linear_w *w, const float *x, int64_t T, float *y, int threads) {
    moex_status st = check_linear(w);
    if (st) return st;
    const int64_t N = w->out_features, K = w->in_features;
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: T = %lld tokens is negative", (long long)T);
    if (threads < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: threads = %d is negative", threads);
    if (T == 0) return MOEX_OK;
    if (!x) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: x is NULL (T = %lld)", (long long)T);
    if (!y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: y is NULL (T = %lld)", (long long)T);
    int64_t tk, tn;
    if (!moex_mul_ok(T, K, &tk) || !moex_mul_ok(T, N, &tn) || tk > INT64_MAX / 4 || tn > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: T = %lld tokens of [%lld -> %lld] overflows",
                         (long long)T, (long long)K, (long long)N);
    const char *xb = (const char *)x, *xe = (const char *)(x + tk), *yb = (const char *)y,
               *ye = (const char *)(y + tn);
    if (xb < ye && yb < xe) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "linear: y overlaps x");

    const int64_t blocks = (N + LINEAR_NB - 1) / LINEAR_NB;
    int nt = threads > 0 ? threads : moex_cpu_cores();
    if (nt < 1) nt = 1;
    if ((int64_t)nt > blocks) nt = (int)blocks;
    const size_t pack_floats = (size_t)MOEX_KC * LINEAR_NB;
    const float **rows = malloc(sizeof(*rows) * (size_t)T);
    float *pack = aligned_alloc(64, sizeof(float) * pack_floats * (size_t)nt);
    if (!rows || !pack) {
        free(rows);
        free(pack);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "linear: no memory for %lld row pointers and %d GEMM panels",
                         (long long)T, nt);
    }
    for (int64_t t = 0; t < T; t++) rows[t] = x + t * K;

    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const size_t besz = w->bias ? moex_dtype_size(w->bias_dtype) : 0;
    // Each block of columns is computed the same whichever thread takes it: the result
    // does not depend on the thread count.
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *pk = pack + pack_floats * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t n0 = b * LINEAR_NB, nb = N - n0 < LINEAR_NB ? N - n0 : LINEAR_NB;
            moex_bmat m = {.w = w->weight, .dtype = w->dtype, .ld = K, .base = n0};
            const void *bias = w->bias ? (const char *)w->bias + (size_t)n0 * besz : NULL;
            moex_gemm(kr, (const float *const *)rows, T, &m, nb, K, y + n0, N, pk, bias, w->bias_dtype);
        }
    }
    free(rows);
    free(pack);
    return MOEX_OK;
}

/* ---- embedding ---------------------------------------------------------- */

// table: [V, H] of dtype, ids: [T] -> out: [T, H]
moex_status moex_embedding(const void *table, moex_dtype dtype, int64_t V, int64_t H, const int64_t *ids,
                           int64_t T, float *out) {
    if (!moex_is_float_dtype(dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: table dtype %s (%d) is not f32, f16 or bf16",
                         moex_dtype_name(dtype), (int)dtype);
    if (V < 1 || H < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: table shape [%lld, %lld] must be at least [1, 1]",
                         (long long)V, (long long)H);
    int64_t vh, th;
    if (!moex_mul_ok(V, H, &vh) || vh > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: table shape [%lld, %lld] overflows", (long long)V,
                         (long long)H);
    moex_status st = check_weight_ptr(table, dtype, "embedding: table");
    if (st) return st;
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: T = %lld tokens is negative", (long long)T);
    if (T == 0) return MOEX_OK;
    if (!moex_mul_ok(T, H, &th) || th > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: T = %lld tokens of %lld values overflows",
                         (long long)T, (long long)H);
    if (!ids) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: ids is NULL (T = %lld)", (long long)T);
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: out is NULL (T = %lld)", (long long)T);
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "embedding: ids[%lld] = %lld is outside [0, %lld)",
                             (long long)t, (long long)ids[t], (long long)V);
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const size_t esz = moex_dtype_size(dtype);
    for (int64_t t = 0; t < T; t++)
        kr->to_f32((const char *)table + (size_t)(ids[t] * H) * esz, dtype, out + t * H, H);
    return MOEX_OK;
}
