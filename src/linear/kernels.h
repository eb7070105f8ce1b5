/* kernels.h — the CPU compute kernels, chosen once at run time: AVX2/FMA/F16C
 * (kernels_avx2.c) when the CPU has them, else portable C (kernels_portable.c).
 * Both compute the same sums in the same order per output element up to the
 * width of the vector, so results do not depend on the thread count. */
#ifndef MOEX_CPU_KERNELS_H
#define MOEX_CPU_KERNELS_H

#include "core/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Micro-tile of the packed GEMM: MOEX_MR rows x MOEX_NR columns. */
#define MOEX_MR 6
#define MOEX_NR 16

/*
 * A logical weight matrix B [K, N] read in place from expert weights of
 * dtype f32/f16/bf16. Column n of B is physical output row (base + n) of W.
 *   not transposed: W is [rows, K] (K contiguous): B(k, n) = W[(base + n) * ld + k], ld = K
 *   transposed:     W is [K, rows] (rows contiguous): B(k, n) = W[k * ld + base + n], ld = rows
 * Quantized (dtype e4m3 or e2m1x2; never transposed): W [rows, K] holds codes (K bytes a row for
 * e4m3, K/2 for e2m1x2, ld = K counts elements) and
 *   B(k, n) = code(W[r, k]) * scale[(r / block_n) * scale_ld + k / block_k],  r = base + n.
 */
typedef struct moex_bmat {
    const void *w;
    moex_dtype dtype;
    int transposed;
    int64_t ld;
    int64_t base;
    const void *scale;      /* quantized only: the scale grid of W */
    moex_dtype scale_dtype; /* f32 or ue8m0 */
    int64_t scale_ld, block_n, block_k;
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
    /* Dynamic activation quantization of one row for weights of dtype wdt (e4m3, e2m1x2), per block
     * of `block` channels: the contract and rounding of moex_act_quant_row. out may be x. */
    void (*act_quant)(const float *x, float *out, int64_t n, moex_dtype wdt, int64_t block);
} moex_cpu_kernels;

/* The kernels this CPU runs (detected once; thread-safe). */
const moex_cpu_kernels *moex_cpu_kernels_get(void);
/* The portable kernels (reference for the fast ones). */
extern const moex_cpu_kernels moex_cpu_kernels_portable;
/* The AVX2 kernels (call only when moex_cpu_has_avx2()). */
extern const moex_cpu_kernels moex_cpu_kernels_avx2;

/* Code (r, k) of a quantized W as the kernels read it: e4m3 in units of 2^-120 (moex_e4m3_raw), e2m1 as is. */
static inline float moex_bmat_code(const moex_bmat *b, int64_t r, int64_t k) {
    const uint8_t *w = (const uint8_t *)b->w;
    if (b->dtype == MOEX_E4M3) return moex_e4m3_raw(w[r * b->ld + k]);
    const uint8_t c = w[(r * b->ld + k) / 2];
    return moex_e2m1_to_f32(k % 2 ? c >> 4 : c & 0x0F);
}

/* The factor that turns moex_bmat_code(r, k) into B's value: the block scale (times 2^120 for e4m3). */
static inline float moex_bmat_scale(const moex_bmat *b, int64_t r, int64_t k) {
    const float s = moex_scale_at(b->scale, b->scale_dtype, (r / b->block_n) * b->scale_ld + k / b->block_k);
    return b->dtype == MOEX_E4M3 ? s * MOEX_E4M3_RAW_UNIT : s;
}

/* Element B(k, n) as f32 (reference accessor). */
static inline float moex_bmat_at(const moex_bmat *b, int64_t k, int64_t n) {
    int64_t r = b->base + n;
    if (moex_is_quant_dtype(b->dtype)) return moex_bmat_code(b, r, k) * moex_bmat_scale(b, r, k);
    return moex_load_f32(b->w, b->dtype, b->transposed ? k * b->ld + r : r * b->ld + k);
}

/* Quantized B: the portable pack and stream (kernels_portable.c); the AVX2 ones fall back to them for
 * block shapes they do not vectorise. */
void moex_qpack_portable(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp);
void moex_qstream_portable(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K,
                           float *c, int64_t ldc);
/* AVX2 quantized pack, stream and activation quantization (quant_kernels_avx2.c). */
void moex_qpack_avx2(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp);
void moex_qstream_avx2(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                       int64_t ldc);
void moex_act_quant_avx2(const float *x, float *out, int64_t n, moex_dtype wdt, int64_t block);

#ifdef __cplusplus
}
#endif

#endif
