/* quant_kernels_portable.c — portable kernels for quantized weights (e4m3,
 * e2m1x2 with block scales): the reference for quant_kernels_avx2.c. The
 * weights are read as codes in place; nothing is dequantized ahead. */
#include "linear/kernels.h"

// Pack B(k0 .. k0+kc, n0 .. n0+nc) as f32 panels of 16 columns (contract of moex_cpu_kernels.pack).
void moex_qpack_portable(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    const int64_t panels = (nc + MOEX_NR - 1) / MOEX_NR;
    for (int64_t p = 0; p < panels; p++)
        for (int j = 0; j < MOEX_NR; j++) {
            const int64_t n = p * MOEX_NR + j, r = b->base + n0 + n;
            for (int64_t k = 0; k < kc; k++)
                bp[(p * kc + k) * MOEX_NR + j] = n < nc ? moex_bmat_code(b, r, k0 + k) * moex_bmat_scale(b, r, k0 + k) : 0.0f;
        }
}

// c[m, n] = sum over the k-blocks of (sum_k a[m][k] * code(r, k)) * scale(r, block): the codes are summed
// within a block, then the block's scale multiplies once (as the AVX2 kernel does).
void moex_qstream_portable(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K,
                           float *c, int64_t ldc) {
    for (int64_t n = 0; n < nc; n++) {
        const int64_t r = b->base + n0 + n;
        for (int m = 0; m < M; m++) {
            float total = 0.0f;
            for (int64_t k0 = 0; k0 < K; k0 += b->block_k) {
                const int64_t k1 = k0 + b->block_k < K ? k0 + b->block_k : K;
                float blk = 0.0f;
                for (int64_t k = k0; k < k1; k++) blk += a[m][k] * moex_bmat_code(b, r, k);
                total += blk * moex_bmat_scale(b, r, k0);
            }
            c[m * ldc + n] = total;
        }
    }
}
