/* decoder_kernels.cuh — what the decoder_*.cu files share: f32 operations that
 * round once each (the intrinsics nvcc never contracts into an FMA, so that a
 * kernel rounds where its CPU twin does), warp reductions, launch sizes. */
#ifndef MOEX_CUDA_DECODER_KERNELS_CUH
#define MOEX_CUDA_DECODER_KERNELS_CUH

#include "core/gpu_runtime.h"
#include "gpu/cuda_check.h"
#include "decoder/cuda/decoder_api.h"
#include "linear/device_elements.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

/* ---- f32 operations rounded one by one ------------------------------------- */

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }

/* ---- warp reductions (all 32 lanes take part) ------------------------------ */

__device__ __forceinline__ double warp_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max_float(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- launch sizes ------------------------------------------------------------ */

/* Blocks of `threads` for n items, at least 1, at most 65535 * 16 (kernels stride over the rest). */
static inline unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 1048560) b = 1048560;
    return (unsigned)b;
}

/* Grid-stride loop over [0, n). */
#define GRID_STRIDE(i, n)                                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- host-side checks ------------------------------------------------------- */

static inline int float_dtype_ok(moex_dtype dt) { return dt == MOEX_F32 || dt == MOEX_F16 || dt == MOEX_BF16; }

static inline size_t float_dtype_size(moex_dtype dt) { return dt == MOEX_F32 ? 4 : 2; }

/* ---- the caches' attention, shared by decoder_attention.cu and decoder_attention_gemm.cu --- */

/* moex_cuda_attention's argument checks (nseq or total 0: MOEX_OK after the sizes). */
moex_status attention_check(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                            int64_t nseq, int64_t total, int64_t heads, const float *q, const float *k, const float *v,
                            const float *out, int64_t window);

/* moex_cuda_attention_latent's argument checks (nseq or total 0: MOEX_OK after the sizes). */
moex_status latent_check(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                         int64_t nseq, int64_t total, int64_t heads, const float *q, const float *kv,
                         int64_t value_dim, float scale, const float *out);
/* The rows k, v [total, kv_heads, head_dim] (a latent cache: k = kv [total, width], v NULL) appended
 * at past .. of each valid descriptor and the lengths committed (a bad descriptor: flagged, nothing
 * appended), without attending. */
moex_status kv_append_commit(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer,
                             const moex_attn_seq *seqs, int64_t nseq, int64_t total, const float *k, const float *v,
                             int *flags, cudaStream_t s);

#endif
