/* act_quant.cu — act_quant_e4m3, act_quant_e2m1 and act_quant_gather_e4m3 (see act_quant.cuh): a grid of
 * warps, a chunk of 256 inputs each where the rows allow it, else one row (one token) each.
 * Shapes: x [rows, K] (row stride x_ld), q and f [rows, K], s [rows, ceil(K/bk)]. */
#include "backends/cuda/act_quant.cuh"
#include "gpu/cuda_check.h"

enum { AQ_WARPS = 8 };

/* Row i of the launch is row row_of[i] of x, q, s and f (skipped when -1), or row i when row_of
 * is NULL. */
__device__ __forceinline__ int64_t row_at(const int *row_of, int64_t i) { return row_of ? (int64_t)row_of[i] : i; }

template <typename XT, bool FP4>
__global__ void __launch_bounds__(AQ_WARPS * 32) act_quant_kernel(const XT *x, int64_t x_ld, int64_t rows, int64_t K,
                                                                  int64_t bk, uint8_t *q, float *s, float *f,
                                                                  const int *row_of) {
    pdl_launch_dependents();
    pdl_wait(); /* launched after_prev: x is the previous kernel's output */
    const int lane = threadIdx.x & 31;
    const int64_t nkb = (K + bk - 1) / bk;
    for (int64_t i = blockIdx.x * (int64_t)AQ_WARPS + (threadIdx.x >> 5); i < rows; i += (int64_t)gridDim.x * AQ_WARPS) {
        const int64_t r = row_at(row_of, i);
        if (r < 0) continue;
        quant_row<XT, FP4>(x + r * x_ld, K, bk, q ? q + r * K : NULL, s ? s + r * nkb : NULL, f ? f + r * K : NULL,
                           lane);
    }
}

/* The same rounding with rows cut into chunks of 256 inputs, a warp a chunk (one vector of 8 a
 * lane), so that a few long rows (a decode step's tokens) spread over the GPU: rows of 16-byte
 * aligned x, K a multiple of 8, bk / 8 a power of two up to 32 (a chunk holds whole blocks). */
template <typename XT, bool FP4>
__global__ void __launch_bounds__(AQ_WARPS * 32) act_quant_chunk_kernel(const XT *x, int64_t x_ld, int64_t rows,
                                                                        int64_t K, int64_t bk, uint8_t *q, float *s,
                                                                        float *f, const int *row_of) {
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t nvec = K / 8, chunks = (nvec + 31) / 32, nkb = (K + bk - 1) / bk;
    for (int64_t w = blockIdx.x * (int64_t)AQ_WARPS + (threadIdx.x >> 5); w < rows * chunks;
         w += (int64_t)gridDim.x * AQ_WARPS) {
        const int64_t r = row_at(row_of, w / chunks);
        if (r < 0) continue;
        quant_chunk<XT, FP4>(x + r * x_ld, K, bk, w % chunks, q ? q + r * K : NULL, s ? s + r * nkb : NULL,
                             f ? f + r * K : NULL, lane);
    }
}

/* The chunk kernels' size predicate: quant_chunks_apply's rows and 8-byte aligned q. */
static bool chunks_apply(const void *x, moex_dtype xdt, int64_t x_ld, int64_t K, int64_t bk, const uint8_t *q) {
    return quant_chunks_apply(x, xdt == MOEX_F32 ? 4 : 2, x_ld, K, bk) && ((uintptr_t)q & 7) == 0;
}

/* One launch over rows, chunked where chunks_apply: the two kernels take the same arguments. */
template <typename XT, bool FP4>
static cudaError_t launch_rows(bool chunks, const cudaLaunchConfig_t &cfg, const void *x, int64_t x_ld, int64_t rows,
                               int64_t K, int64_t bk, uint8_t *q, float *s, float *f, const int *row_of) {
    return cudaLaunchKernelEx(&cfg, chunks ? act_quant_chunk_kernel<XT, FP4> : act_quant_kernel<XT, FP4>,
                              (const XT *)x, x_ld, rows, K, bk, q, s, f, row_of);
}

template <bool FP4>
static moex_status act_quant_rows(const void *x, moex_dtype xdt, int64_t x_ld, int64_t rows, int64_t K, int64_t bk,
                                  uint8_t *q, float *s, float *f, const int *row_of, int after_prev, cudaStream_t st) {
    if (rows <= 0) return MOEX_OK;
    const bool chunks = chunks_apply(x, xdt, x_ld, K, bk, q);
    /* chunks: a warp a chunk of 256 inputs; else a warp a row */
    const int64_t warps = chunks ? rows * ((K / 8 + 31) / 32) : rows, blocks = (warps + AQ_WARPS - 1) / AQ_WARPS;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        launch_after(dim3((unsigned)(blocks < 65535 ? blocks : 65535)), dim3(AQ_WARPS * 32), st, after_prev, &attr);
    cudaError_t err;
    if (xdt == MOEX_BF16)
        err = launch_rows<__nv_bfloat16, FP4>(chunks, cfg, x, x_ld, rows, K, bk, q, s, f, row_of);
    else if (xdt == MOEX_F16)
        err = launch_rows<__half, FP4>(chunks, cfg, x, x_ld, rows, K, bk, q, s, f, row_of);
    else
        err = launch_rows<float, FP4>(chunks, cfg, x, x_ld, rows, K, bk, q, s, f, row_of);
    return moex_cuda_status(err, "activation quantization kernel");
}

moex_status act_quant_e4m3(const void *x, moex_dtype xdt, int64_t x_ld, int64_t rows, int64_t K, int64_t bk,
                           uint8_t *q, float *s, float *f, int after_prev, cudaStream_t st) {
    return act_quant_rows<false>(x, xdt, x_ld, rows, K, bk, q, s, f, NULL, after_prev, st);
}

moex_status act_quant_slots_e4m3(const int *pair_slot, int64_t P, const void *x, moex_dtype xdt, int64_t x_ld,
                                 int64_t K, int64_t bk, uint8_t *q, float *s, cudaStream_t st) {
    return act_quant_rows<false>(x, xdt, x_ld, P, K, bk, q, s, NULL, pair_slot, 0, st);
}

moex_status act_quant_e2m1(const void *x, moex_dtype xdt, int64_t x_ld, int64_t rows, int64_t K, int8_t *q, float *s,
                           cudaStream_t st) {
    return act_quant_rows<true>(x, xdt, x_ld, rows, K, ACT_E2M1_BLOCK, (uint8_t *)q, s, NULL, NULL, 0, st);
}

/* One warp a token: its row quantized into each of its pairs' slots (the k copies read the
 * row from L1/L2 after the first). Any row; act_quant_gather_chunk_kernel where it applies. */
template <typename XT>
__global__ void __launch_bounds__(AQ_WARPS * 32) act_quant_gather_kernel(const int *pair_slot, int64_t T, int64_t k,
                                                                         const XT *x, int64_t x_ld, int64_t K,
                                                                         int64_t bk, uint8_t *q, float *s) {
    const int lane = threadIdx.x & 31;
    const int64_t nkb = (K + bk - 1) / bk;
    for (int64_t t = blockIdx.x * (int64_t)AQ_WARPS + (threadIdx.x >> 5); t < T; t += (int64_t)gridDim.x * AQ_WARPS)
        for (int64_t j = 0; j < k; j++) {
            const int slot = pair_slot[t * k + j];
            if (slot >= 0) quant_row_e4m3<XT>(x + t * x_ld, K, bk, q + (int64_t)slot * K, s + (int64_t)slot * nkb, NULL, lane);
        }
}

/* The same, a warp a chunk of 256 inputs of a token (one vector of 8 a lane), quantized once and
 * stored into each of the token's pair slots: T x K/256 warps, so that a prefill's tokens
 * spread over the GPU with many loads in flight (one warp a token, k rows each in turn, kept
 * 64 blocks busy at 512 tokens: 57 us where the read takes a few). Rows as
 * act_quant_chunk_kernel takes them. */
template <typename XT>
__global__ void __launch_bounds__(AQ_WARPS * 32) act_quant_gather_chunk_kernel(const int *pair_slot, int64_t T,
                                                                               int64_t k, const XT *x, int64_t x_ld,
                                                                               int64_t K, int64_t bk, uint8_t *q,
                                                                               float *s) {
    const int lane = threadIdx.x & 31, vpb = (int)(bk / 8);
    const int64_t nvec = K / 8, chunks = (nvec + 31) / 32, nkb = (K + bk - 1) / bk;
    for (int64_t w = blockIdx.x * (int64_t)AQ_WARPS + (threadIdx.x >> 5); w < T * chunks;
         w += (int64_t)gridDim.x * AQ_WARPS) {
        const int64_t t = w / chunks, v = (w % chunks) * 32 + lane;
        const bool in = v < nvec;
        float a[8];
#pragma unroll
        for (int i = 0; i < 8; i++) a[i] = 0.0f;
        if (in) load8_cg(x + t * x_ld + 8 * v, a);
        const float sc = vec8_block_scale<false>(a, vpb);
        if (in) {
            const uint2 codes = vec8_codes<false>(a, sc, v, NULL);
            for (int64_t j = 0; j < k; j++) {
                const int slot = pair_slot[t * k + j];
                if (slot < 0) continue;
                *(uint2 *)(q + (int64_t)slot * K + 8 * v) = codes;
                if (lane % vpb == 0) s[(int64_t)slot * nkb + (v >> (__ffs(vpb) - 1))] = sc;
            }
        }
    }
}

template <typename XT>
static void launch_quant_gather(bool chunks, int64_t warps, const int *pair_slot, int64_t T, int64_t k, const XT *x,
                                int64_t x_ld, int64_t K, int64_t bk, uint8_t *q, float *s, cudaStream_t st) {
    const int64_t blocks = (warps + AQ_WARPS - 1) / AQ_WARPS;
    const dim3 grid((unsigned)(blocks < 65535 ? blocks : 65535)), block(AQ_WARPS * 32);
    if (chunks)
        act_quant_gather_chunk_kernel<XT><<<grid, block, 0, st>>>(pair_slot, T, k, x, x_ld, K, bk, q, s);
    else
        act_quant_gather_kernel<XT><<<grid, block, 0, st>>>(pair_slot, T, k, x, x_ld, K, bk, q, s);
}

moex_status act_quant_gather_e4m3(const int *pair_slot, int64_t T, int64_t k, const void *x, moex_dtype xdt,
                                  int64_t x_ld, int64_t K, int64_t bk, uint8_t *q, float *s, cudaStream_t st) {
    if (T <= 0) return MOEX_OK;
    const bool chunks = chunks_apply(x, xdt, x_ld, K, bk, q);
    const int64_t warps = chunks ? T * ((K / 8 + 31) / 32) : T;
    if (xdt == MOEX_BF16)
        launch_quant_gather(chunks, warps, pair_slot, T, k, (const __nv_bfloat16 *)x, x_ld, K, bk, q, s, st);
    else if (xdt == MOEX_F16)
        launch_quant_gather(chunks, warps, pair_slot, T, k, (const __half *)x, x_ld, K, bk, q, s, st);
    else
        launch_quant_gather(chunks, warps, pair_slot, T, k, (const float *)x, x_ld, K, bk, q, s, st);
    return MOEX_CUDA_LAUNCHED("activation quantizing gather kernel");
}
