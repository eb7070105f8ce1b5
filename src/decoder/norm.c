/* norm.c — RMSNorm as transformers computes it in float32 (see decoder.h). */
#include "decoder/decoder.h"
#include <math.h>
#include <stdint.h>

// x: [n], weight: [n] -> y: [n] (y may equal x)
static void rms_row(const float *x, int64_t n, const void *weight, moex_dtype wdt, float eps, float *y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float sq = x[i] * x[i]; /* hidden.pow(2), rounded to f32 */
        sum += sq;
    }
    const float var = (float)sum / (float)n; /* mean = sum, then div_ by n */
    const float denom = sqrtf(var + eps);
    const float r = 1.0f / denom; /* torch.rsqrt: 1 / sqrt */
    for (int64_t i = 0; i < n; i++) {
        const float h = x[i] * r; /* hidden * rsqrt(variance + eps) */
        y[i] = moex_load_f32(weight, wdt, i) * h; /* weight * hidden */
    }
}

static moex_status check_norm(const char *fn, const float *x, int64_t rows, int64_t n, const void *weight,
                              moex_dtype wdt, double eps, const float *y) {
    if (rows < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld rows is negative", fn, (long long)rows);
    if (n < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: row size %lld must be >= 1", fn, (long long)n);
    if (!moex_is_float_dtype(wdt))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight dtype %s (%d) is not f32, f16 or bf16", fn,
                         moex_dtype_name(wdt), (int)wdt);
    if (!weight) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight is NULL", fn);
    if ((uintptr_t)weight % moex_dtype_size(wdt) != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight (%s) at %p is not aligned to %zu bytes", fn,
                         moex_dtype_name(wdt), weight, moex_dtype_size(wdt));
    if (!(eps >= 0.0) || !isfinite(eps))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: eps = %g must be finite and >= 0", fn, eps);
    int64_t total;
    if (!moex_mul_ok(rows, n, &total) || total > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld rows of %lld values overflows", fn, (long long)rows,
                         (long long)n);
    if (rows == 0) return MOEX_OK;
    if (!x) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
    if (!y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: y is NULL", fn);
    if (x != y) {
        const char *xb = (const char *)x, *xe = (const char *)(x + total);
        const char *yb = (const char *)y, *ye = (const char *)(y + total);
        if (xb < ye && yb < xe)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: y overlaps x without being equal to it", fn);
    }
    return MOEX_OK;
}

// x: [rows, n] -> y: [rows, n]; weight: [n]
moex_status moex_rmsnorm(const float *x, int64_t rows, int64_t n, const void *weight, moex_dtype wdtype, double eps,
                         float *y) {
    moex_status st = check_norm("rmsnorm", x, rows, n, weight, wdtype, eps, y);
    if (st) return st;
    const float e = (float)eps; /* variance + eps: the Python float enters the f32 add as f32 */
    for (int64_t r = 0; r < rows; r++) rms_row(x + r * n, n, weight, wdtype, e, y + r * n);
    return MOEX_OK;
}

// x: [T, heads, head_dim] -> y: [T, heads, head_dim]; weight: [head_dim]
moex_status moex_rmsnorm_heads(const float *x, int64_t T, int64_t heads, int64_t head_dim, const void *weight,
                               moex_dtype wdtype, double eps, float *y) {
    if (T < 0 || heads < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "rmsnorm_heads: T = %lld must be >= 0 and heads = %lld >= 1",
                         (long long)T, (long long)heads);
    int64_t rows;
    if (!moex_mul_ok(T, heads, &rows))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "rmsnorm_heads: T = %lld times heads = %lld overflows",
                         (long long)T, (long long)heads);
    moex_status st = check_norm("rmsnorm_heads", x, rows, head_dim, weight, wdtype, eps, y);
    if (st) return st;
    const float e = (float)eps;
    for (int64_t r = 0; r < rows; r++) rms_row(x + r * head_dim, head_dim, weight, wdtype, e, y + r * head_dim);
    return MOEX_OK;
}
