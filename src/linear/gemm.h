/* gemm.h — the CPU dense product shared by the experts backends and the decoder's linear
 * layers: few rows stream the weights, more rows pack each k-block of B once. */
#ifndef MOEX_LINEAR_GEMM_H
#define MOEX_LINEAR_GEMM_H

#include "linear/kernels.h"

#define MOEX_KC 256        /* k-block of the packed GEMM: a 16-column panel is 16 KiB, in L1 */
#define MOEX_MC 72         /* rows per inner block: MOEX_MC x MOEX_KC floats of A stay in L2 */
#define MOEX_NB 64         /* intermediate (or hidden) columns per work item */
#define MOEX_STREAM_MAX 4  /* rows per streaming-kernel call */
#define MOEX_STREAM_ROWS 8 /* products of up to this many rows stream the weights, 4 rows a pass */

/* c[M, N] = A[M, K] * B[K, N] (+ bias[0 .. N) when bias is not NULL).
 * a: M row pointers; c: row stride ldc. With M <= MOEX_STREAM_ROWS the
 * weights are streamed (any N); otherwise N <= 2*MOEX_NB and each k-block of
 * B is packed once into pack (MOEX_KC * round_up(N, 16) floats) for all M rows. */
void moex_gemm(const moex_cpu_kernels *kr, const float *const *a, int64_t M, const moex_bmat *b, int64_t N, int64_t K,
               float *c, int64_t ldc, float *pack, const void *bias, moex_dtype bias_dtype);

#endif
