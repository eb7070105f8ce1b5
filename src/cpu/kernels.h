/* kernels.h — the CPU compute kernels, chosen once at run time: AVX2/FMA/F16C
 * (kernels_avx2.c) when the CPU has them, else portable C (kernels_portable.c).
 * Both compute the same sums in the same order per output element up to the
 * width of the vector, so results do not depend on the thread count. */
#ifndef MOEX_CPU_KERNELS_H
#define MOEX_CPU_KERNELS_H

#include "core/internal.h"

/* Micro-tile of the packed GEMM: MOEX_MR rows x MOEX_NR columns. */
#define MOEX_MR 6
#define MOEX_NR 16

/*
 * A logical weight matrix B [K, N] read in place from expert weights of
 * dtype f32/f16/bf16. Column n of B is physical output row (base + n) of W.
 *   not transposed: W is [rows, K] (K contiguous): B(k, n) = W[(base + n) * ld + k], ld = K
 *   transposed:     W is [K, rows] (rows contiguous): B(k, n) = W[k * ld + base + n], ld = rows
 */
typedef struct moex_bmat {
    const void *w;
    moex_dtype dtype;
    int transposed;
    int64_t ld;
    int64_t base;
} moex_bmat;

typedef struct moex_cpu_kernels {
    const char *name;
    /* c[mr, nr] (+)= sum_{k<kc} a[i][k0+k] * bp[k*16 + j]; a: MOEX_MR row pointers (rows >= mr are
     * valid pointers but ignored); accumulate = 0 overwrites c. ldc in floats. */
    void (*micro)(int64_t kc, const float *const *a, int64_t k0, const float *bp, float *c, int64_t ldc, int mr,
                  int nr, int accumulate);
    /* Pack B(k0 .. k0+kc, n0 .. n0+nc) as f32 panels of 16 columns:
     * bp[(p*kc + k)*16 + j] = B(k0+k, n0 + p*16 + j), zero past nc. */
    void (*pack)(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp);
    /* Streaming product for few rows: c[m*ldc + n] = sum_{k<K} a[m][k] * B(k, n0+n), m < M <= 4,
     * n < nc. Reads the weights once for all M rows. */
    void (*stream)(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                   int64_t ldc);
    /* dst[i] = (float)src[i], i < n, src of dtype f32/f16/bf16. */
    void (*to_f32)(const void *src, moex_dtype dtype, float *dst, int64_t n);
    /* dst[i] += w * src[i] (f32), i < n. */
    void (*axpy)(float w, const float *src, float *dst, int64_t n);
} moex_cpu_kernels;

/* The kernels this CPU runs (detected once; thread-safe). */
const moex_cpu_kernels *moex_cpu_kernels_get(void);
/* The portable kernels (reference for the fast ones). */
extern const moex_cpu_kernels moex_cpu_kernels_portable;
/* The AVX2 kernels (call only when moex_cpu_has_avx2()). */
extern const moex_cpu_kernels moex_cpu_kernels_avx2;

/* Element B(k, n) as f32 (reference accessor). */
static inline float moex_bmat_at(const moex_bmat *b, int64_t k, int64_t n) {
    int64_t r = b->base + n;
    return moex_load_f32(b->w, b->dtype, b->transposed ? k * b->ld + r : r * b->ld + k);
}

#endif
