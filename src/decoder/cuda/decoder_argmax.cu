/* decoder_argmax.cu — greedy decoding on the device: the index of each row's
 * largest logit, as model/sampling.c's moex_sample_greedy (torch.argmax): the
 * first maximum. A row with a NaN gets -1 - (the index of its first NaN), which
 * the host turns into the error moex_sample_greedy reports. */
#include "decoder/cuda/decoder_kernels.cuh"

/* Does (va, ia) win over (vb, ib)? NaNs first, then larger values, then the lower index. */
__device__ __forceinline__ int argmax_before(float va, int64_t ia, float vb, int64_t ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return 0;
    const int na = va != va, nb = vb != vb;
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

/* One block per row (grid-stride). logits: [rows, V] -> tokens: [rows]. */
__global__ void argmax_kernel(const float *logits, int64_t rows, int64_t V, int64_t *tokens) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * V;
        float bv = 0.0f;
        int64_t bi = -1;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
            if (argmax_before(x[i], i, bv, bi)) bv = x[i], bi = i;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (argmax_before(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) sv[warp] = bv, si[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < warps; w++)
                if (argmax_before(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
            tokens[r] = bi < 0 ? 0 : bv != bv ? -1 - bi : bi; /* a NaN row: -1 - its first NaN */
        }
        __syncthreads();
    }
}

extern "C" moex_status moex_cuda_argmax(const float *logits, int64_t rows, int64_t V, int64_t *tokens, void *stream) {
    if (V < 1 || rows < 0 || (rows > 0 && V > INT64_MAX / 4 / rows))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda argmax: %lld rows of V = %lld: need V >= 1, rows >= 0",
                         (long long)rows, (long long)V);
    if (rows == 0) return MOEX_OK;
    if (!logits || !tokens)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda argmax: %s is NULL", !logits ? "logits" : "tokens");
    const int threads = V >= 8192 ? 1024 : 256;
    argmax_kernel<<<(unsigned)(rows < 65535 ? rows : 65535), threads, 0, (cudaStream_t)stream>>>(logits, rows, V,
                                                                                                  tokens);
    return MOEX_CUDA_LAUNCHED("cuda argmax kernel");
}
