/* gemm.c — the CPU dense product c = A * B (+ bias) that the experts backends and the decoder's
 * linear layers share (see gemm.h). */
#include "linear/gemm.h"

// c[m, n] += bias[n]
static void add_bias(int64_t M, int64_t N, float *c, int64_t ldc, const void *bias, moex_dtype bias_dtype) {
    for (int64_t n = 0; n < N; n++) {
        const float bn = moex_load_f32(bias, bias_dtype, n);
        for (int64_t m = 0; m < M; m++) c[m * ldc + n] += bn;
    }
}

// Ask for B(k0 .. k0+kc, 0 .. N) to be brought into the cache, so that packing it
// later does not wait on memory row by row.
static void prefetch_block(const moex_bmat *b, int64_t k0, int64_t kc, int64_t N) {
    const int64_t esz = b->dtype == MOEX_F32 ? 4 : 2;
    const char *w = b->w;
    if (moex_is_quant_dtype(b->dtype)) { /* codes: 1 byte (e4m3) or half a byte (e2m1x2) per element */
        const int64_t per_line = b->dtype == MOEX_E4M3 ? 64 : 128, half = b->dtype == MOEX_E2M1X2;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < kc; k += per_line) __builtin_prefetch(w + (((b->base + n) * b->ld + k0 + k) >> half));
        return;
    }
    if (!b->transposed) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < kc; k += 64 / esz) __builtin_prefetch(w + ((b->base + n) * b->ld + k0 + k) * esz);
    } else {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t n = 0; n < N; n += 64 / esz) __builtin_prefetch(w + ((k0 + k) * b->ld + b->base + n) * esz);
    }
}

// The packed path: each k-block of B is converted into 16-column panels once for all M rows.
static void gemm_packed(const moex_cpu_kernels *kr, const float *const *a, int64_t M, const moex_bmat *b, int64_t N,
                      int64_t K, float *c, int64_t ldc, float *pack, const void *bias, moex_dtype bias_dtype) {
    const int64_t panels = (N + MOEX_NR - 1) / MOEX_NR;
    for (int64_t k0 = 0; k0 < K; k0 += MOEX_KC) {
        const int64_t kc = K - k0 < MOEX_KC ? K - k0 : MOEX_KC;
        kr->pack(b, k0, kc, 0, N, pack);
        if (k0 + kc < K) prefetch_block(b, k0 + kc, K - k0 - kc < MOEX_KC ? K - k0 - kc : MOEX_KC, N);
        for (int64_t mb = 0; mb < M; mb += MOEX_MC) {
            const int64_t mend = M - mb < MOEX_MC ? M : mb + MOEX_MC;
            for (int64_t p = 0; p < panels; p++) {
                const int nr = (int)(N - p * MOEX_NR < MOEX_NR ? N - p * MOEX_NR : MOEX_NR);
                for (int64_t m0 = mb; m0 < mend; m0 += MOEX_MR) {
                    const int mr = (int)(mend - m0 < MOEX_MR ? mend - m0 : MOEX_MR);
                    const float *rows[MOEX_MR];
                    for (int i = 0; i < MOEX_MR; i++) rows[i] = a[m0 + (i < mr ? i : 0)];
                    kr->micro(kc, rows, k0, pack + p * kc * MOEX_NR, c + m0 * ldc + p * MOEX_NR, ldc, mr, nr, k0 > 0);
                }
            }
        }
    }
    if (bias) add_bias(M, N, c, ldc, bias, bias_dtype);
}

void moex_gemm(const moex_cpu_kernels *kr, const float *const *a, int64_t M, const moex_bmat *b, int64_t N, int64_t K,
               float *c, int64_t ldc, float *pack, const void *bias, moex_dtype bias_dtype) {
    if (M <= 0) return;
    if (M > MOEX_STREAM_ROWS) {
        gemm_packed(kr, a, M, b, N, K, c, ldc, pack, bias, bias_dtype);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += MOEX_STREAM_MAX) /* groups of up to 4 rows; the weights stay in L2 */
        kr->stream(b, a + m0, (int)(M - m0 < MOEX_STREAM_MAX ? M - m0 : MOEX_STREAM_MAX), 0, N, K, c + m0 * ldc, ldc);
    if (bias) add_bias(M, N, c, ldc, bias, bias_dtype);
}

