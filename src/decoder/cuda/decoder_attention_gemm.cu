/* decoder_attention_gemm.cu — the latent cache's attention for a step whose descriptors the host
 * knows (a prefill: not captured in a graph), over cuBLAS. Every head of every query row reads all
 * of its sequence's latent rows, so the products are two GEMMs a sequence instead of one pass of a
 * kernel per (row, head):
 *   scores [Tc * heads, L] = q [Tc * heads, W] . kv [L, W]^T * scale   (f32, pedantic: no TF32)
 *   the causal softmax of each row in place (row (t, h) sees positions 0 .. past + t)
 *   out [Tc * heads, dv]   = scores . kv [L, 0 .. dv)
 * for chunks of Tc query rows that fit the scratch. The same sums as attend_kernel's up to their
 * order; the twin of moex_attention_forward_latent. */
#include "decoder/cuda/blas_status.cuh"
#include "decoder/cuda/decoder_kernels.cuh"

#include <cublas_v2.h>
#include <limits.h>
#include <math.h>

#define SOFTMAX_THREADS 128

/* One block per row of scores (grid-stride): row m = (token c0 + m / heads of the chunk, head m % heads)
 * sees the first `past + c0 + m / heads + 1` of its L positions. w_j = expf(s_j - max) * (1 / sum)
 * (the sum in double), the positions it does not see set to 0. scores: [rows, L] in place. */
__global__ void __launch_bounds__(SOFTMAX_THREADS)
    causal_softmax_kernel(float *scores, int64_t rows, int64_t L, int64_t heads, int64_t first_visible) {
    __shared__ float red_f[SOFTMAX_THREADS / 32];
    __shared__ double red_d[SOFTMAX_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t m = blockIdx.x; m < rows; m += gridDim.x) {
        float *row = scores + m * L;
        const int64_t seen = first_visible + m / heads; /* positions 0 .. seen - 1 */
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
        mx = warp_max_float(mx);
        if (lane == 0) red_f[warp] = mx;
        __syncthreads();
        mx = -INFINITY;
        for (int w = 0; w < SOFTMAX_THREADS / 32; w++) mx = fmaxf(mx, red_f[w]);
        double sum = 0.0;
        for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) {
            const float e = expf(row[j] - mx);
            row[j] = e;
            sum += (double)e;
        }
        sum = warp_sum_double(sum);
        if (lane == 0) red_d[warp] = sum;
        __syncthreads();
        sum = 0.0;
        for (int w = 0; w < SOFTMAX_THREADS / 32; w++) sum += red_d[w];
        const float inv = 1.0f / (float)sum;
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x) row[j] = j < seen ? mul_rn(row[j], inv) : 0.0f;
        __syncthreads(); /* red_f, red_d are rewritten by the next row */
    }
}

extern "C" moex_status moex_cuda_attention_latent_gemm(const moex_cuda_blas *blas, const moex_cuda_kv_cache *cache,
                                                       int64_t layer, const moex_attn_seq *seqs,
                                                       const moex_attn_seq *host_seqs, int64_t nseq, int64_t total,
                                                       int64_t heads, const float *q, const float *kv,
                                                       int64_t value_dim, float scale, float *out, float *scores,
                                                       size_t scores_floats, int *flags, void *stream) {
    const char *fn = "cuda latent attention (GEMM)";
    moex_status st = latent_check(fn, cache, layer, seqs, nseq, total, heads, q, kv, value_dim, scale, out);
    if (st || nseq == 0 || total == 0) return st;
    if (!blas || !blas->handle) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cuBLAS handle", fn);
    if (!host_seqs) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the host copy of the descriptors is NULL", fn);
    const int64_t W = cache->head_dim, S = cache->max_seq, B = cache->max_batch;
    if (!scores || scores_floats < (size_t)(heads * S))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the scores scratch holds %zu floats; one row of every head "
                         "needs heads x max_seq = %lld", fn, scores_floats, (long long)(heads * S));
    int64_t sum = 0;
    for (int64_t i = 0; i < nseq; i++) { /* what the GEMMs read, against the cache's bounds */
        const moex_attn_seq *h = &host_seqs[i];
        if (h->seq < 0 || h->seq >= B || h->past < 0 || h->tokens < 0 || h->tokens > S - h->past)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: descriptor %lld: sequence %lld at %lld + %lld positions "
                             "(max_batch %lld, max_seq %lld)", fn, (long long)i, (long long)h->seq, (long long)h->past,
                             (long long)h->tokens, (long long)B, (long long)S);
        sum += h->tokens;
    }
    if (sum != total)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the descriptors hold %lld tokens, not total = %lld", fn,
                         (long long)sum, (long long)total);
    cudaStream_t s = (cudaStream_t)stream;
    /* the new rows first: every query row then sees its own position in the cache */
    if ((st = latent_append_commit(cache, layer, seqs, nseq, total, kv, flags, s))) return st;
    cublasHandle_t hd = (cublasHandle_t)blas->handle;
    if ((st = blas_status(cublasSetStream(hd, s), "cublasSetStream")) ||
        (st = blas_status(cublasSetWorkspace(hd, blas->workspace, blas->workspace_bytes), "cublasSetWorkspace")))
        return st;
    const float zero = 0.0f, one = 1.0f;
    int64_t row = 0; /* the sequence's first row in q and out */
    for (int64_t i = 0; i < nseq; i++) {
        const moex_attn_seq *h = &host_seqs[i];
        if (h->tokens == 0) continue; /* nothing to attend (and L may be 0) */
        const int64_t L = h->past + h->tokens;
        const float *keys = cache->k + (size_t)((layer * B + h->seq) * S) * (size_t)W; /* [L, W] */
        int64_t tc = (int64_t)(scores_floats / (size_t)(heads * L)); /* query tokens a chunk */
        if (tc < 1) tc = 1;
        for (int64_t c0 = 0; c0 < h->tokens; c0 += tc) {
            const int64_t n = h->tokens - c0 < tc ? h->tokens - c0 : tc, M = n * heads;
            if (M > INT_MAX || L > INT_MAX || W > INT_MAX)
                return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: %lld x %lld scores exceed cuBLAS's int sizes", fn,
                                 (long long)M, (long long)L);
            const float *qc = q + (size_t)((row + c0) * heads) * (size_t)W;
            float *oc = out + (size_t)((row + c0) * heads) * (size_t)value_dim;
            /* column-major: scores^T [L, M] = keys^T^T ([W, L] read transposed) . q^T [W, M] */
            st = blas_status(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, (int)L, (int)M, (int)W, &scale, keys, CUDA_R_32F,
                                          (int)W, qc, CUDA_R_32F, (int)W, &zero, scores, CUDA_R_32F, (int)L,
                                          CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                             "cuda latent attention: scores GEMM");
            if (st) return st;
            const unsigned blocks = (unsigned)(M < 1048576 ? M : 1048576);
            causal_softmax_kernel<<<blocks, SOFTMAX_THREADS, 0, s>>>(scores, M, L, heads, h->past + c0 + 1);
            if ((st = MOEX_CUDA_LAUNCHED("cuda latent attention: softmax kernel"))) return st;
            /* out^T [dv, M] = keys' first dv values ([dv, L], ld W) . scores^T [L, M] */
            st = blas_status(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, (int)value_dim, (int)M, (int)L, &one, keys,
                                          CUDA_R_32F, (int)W, scores, CUDA_R_32F, (int)L, &zero, oc, CUDA_R_32F,
                                          (int)value_dim, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                             "cuda latent attention: values GEMM");
            if (st) return st;
        }
        row += h->tokens;
    }
    return MOEX_OK;
}
