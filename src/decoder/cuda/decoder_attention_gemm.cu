/* decoder_attention_gemm.cu — attention for a step whose descriptors the host knows (a prefill: not
 * captured in a graph), over cuBLAS. Every head of every query row reads all of its sequence's
 * cached rows, so the products are GEMMs a sequence instead of one pass of a kernel per (row,
 * head), for chunks of Tc query rows that fit the scratch:
 *   latent cache (MLA): scores [Tc * heads, L] = q [Tc * heads, W] . kv [L, W]^T * scale,
 *     the causal softmax of each row in place, out [Tc * heads, dv] = scores . kv [L, 0 .. dv);
 *   grouped-query cache: one batched GEMM over every query head h (kv head g = h / group; the
 *     operands' addresses in pointer tables a small kernel writes, since g is no stride of h),
 *     scores_h [Tc, L] = q_h [Tc, d] . k_g [L, d]^T * d^-0.5, the causal softmax (sliding window,
 *     sink) of every row, out_h [Tc, d] = scores_h . v_g [L, d] (a second batched GEMM).
 * f32, pedantic (no TF32); the latent path in bf16 on the tensor cores where its inputs are bf16
 * values (bf16 compute), the probabilities as three bf16 parts. The same sums as attend_kernel's up
 * to their order; the twins of moex_cuda_attention_latent and moex_cuda_attention. */
#include "decoder/cuda/blas_status.cuh"
#include "decoder/cuda/decoder_kernels.cuh"

#include <cublas_v2.h>
#include <limits.h>
#include <math.h>

#define SOFTMAX_THREADS 128

/* One block per row of scores (grid-stride). head_major 0 (the latent layout, [tokens of the chunk,
 * heads]): row m is token m / heads of the chunk, head m % heads; head_major 1 ([heads, n tokens]):
 * head m / n, token m % n. A row holds the scores of positions k0 .. k0 + L - 1 (column j: position
 * k0 + j). Token t sees positions lo .. first_visible + t - 1, lo the sliding window's first (window
 * 0: none; positions > p - window), as attend_kernel sees them; k0 <= lo for every row. w_j =
 * expf(s_j - max) * (1 / sum) (the sum in double), with the head's sink (sinks: NULL or [heads]) one
 * more logit in the max and the sum; the positions it does not see set to 0. scores: [rows, L] in
 * place, or with split (the bf16 values GEMMs' input, [rows, 3L]): row m's w_j as three bf16 parts
 * whose sum is w_j, hi_j = bf16(w_j) at split[m * 3L + j], mid_j = bf16(w_j - hi_j) at L + j, lo_j =
 * bf16(w_j - hi_j - mid_j) at 2L + j (both differences exact in f32), scores then left as exps. */
__global__ void __launch_bounds__(SOFTMAX_THREADS)
    causal_softmax_kernel(float *scores, int64_t rows, int64_t L, int64_t heads, int head_major, int64_t n,
                          int64_t k0, int64_t first_visible, int64_t window, const float *sinks,
                          __nv_bfloat16 *split) {
    __shared__ float red_f[SOFTMAX_THREADS / 32];
    __shared__ double red_d[SOFTMAX_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t m = blockIdx.x; m < rows; m += gridDim.x) {
        float *row = scores + m * L;
        const int64_t t = head_major ? m % n : m / heads, h = head_major ? m / n : m % heads;
        const int64_t seen = first_visible + t - k0; /* columns lo .. seen - 1 */
        const int64_t lo = (window > 0 && first_visible + t > window ? first_visible + t - window : 0) - k0;
        float mx = -INFINITY;
        for (int64_t j = lo + threadIdx.x; j < seen; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
        mx = warp_max_float(mx);
        if (lane == 0) red_f[warp] = mx;
        __syncthreads();
        mx = -INFINITY;
        for (int w = 0; w < SOFTMAX_THREADS / 32; w++) mx = fmaxf(mx, red_f[w]);
        const float sink = sinks ? sinks[h] : 0.0f;
        if (sinks) mx = sink > mx ? sink : mx;
        double sum = 0.0;
        for (int64_t j = lo + threadIdx.x; j < seen; j += blockDim.x) {
            const float e = expf(row[j] - mx);
            row[j] = e;
            sum += (double)e;
        }
        sum = warp_sum_double(sum);
        if (lane == 0) red_d[warp] = sum;
        __syncthreads();
        sum = 0.0;
        for (int w = 0; w < SOFTMAX_THREADS / 32; w++) sum += red_d[w];
        if (sinks) sum += (double)expf(sink - mx);
        const float inv = 1.0f / (float)sum;
        if (split) {
            __nv_bfloat16 *parts = split + m * 3 * L;
            for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
                const float w = j >= lo && j < seen ? mul_rn(row[j], inv) : 0.0f;
                const __nv_bfloat16 hi = __float2bfloat16_rn(w);
                const float r1 = __fsub_rn(w, __bfloat162float(hi));
                const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
                parts[j] = hi, parts[L + j] = mid;
                parts[2 * L + j] = __float2bfloat16_rn(__fsub_rn(r1, __bfloat162float(mid)));
            }
        } else {
            for (int64_t j = threadIdx.x; j < L; j += blockDim.x)
                row[j] = j >= lo && j < seen ? mul_rn(row[j], inv) : 0.0f;
        }
        __syncthreads(); /* red_f, red_d are rewritten by the next row */
    }
}

/* causal_softmax_kernel over rows rows of scores, a block a row (grid-stride past 1048576 blocks). */
static moex_status causal_softmax(float *scores, int64_t rows, int64_t L, int64_t heads, int head_major, int64_t n,
                                  int64_t k0, int64_t first_visible, int64_t window, const float *sinks,
                                  __nv_bfloat16 *split, cudaStream_t s, const char *what) {
    const unsigned blocks = (unsigned)(rows < 1048576 ? rows : 1048576);
    causal_softmax_kernel<<<blocks, SOFTMAX_THREADS, 0, s>>>(scores, rows, L, heads, head_major, n, k0, first_visible,
                                                             window, sinks, split);
    return MOEX_CUDA_LAUNCHED(what);
}

/* The host copy of the descriptors against the cache's bounds and total (what the GEMMs read). */
static moex_status host_seqs_check(const char *fn, const moex_cuda_kv_cache *cache, const moex_attn_seq *host_seqs,
                                   int64_t nseq, int64_t total) {
    if (!host_seqs) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the host copy of the descriptors is NULL", fn);
    const int64_t S = cache->max_seq, B = cache->max_batch;
    int64_t sum = 0;
    for (int64_t i = 0; i < nseq; i++) {
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
    return MOEX_OK;
}

/* The grouped-query path's pointer tables at the start of its scratch: five arrays of heads pointers
 * (keys, queries, scores, values, out; the values GEMM's B is the scores'), rounded up to 256 bytes,
 * so that the scores after them stay aligned. */
#define GQA_TABLES 5
static size_t gqa_table_floats(int64_t heads) {
    const size_t bytes = (size_t)GQA_TABLES * (size_t)heads * sizeof(void *);
    return ((bytes + 255) / 256) * 256 / sizeof(float);
}

extern "C" size_t moex_cuda_attention_gemm_scratch_floats(int64_t heads, int64_t max_seq) {
    if (heads < 1 || max_seq < 1) return 0;
    return (size_t)heads * (size_t)max_seq + gqa_table_floats(heads);
}

/* One thread per query head h of a chunk (kv head g = h / group): the operands of head h's scores
 * and values GEMMs. keys, vals: [L, d] of kv head 0 (the next kv head kv_stride floats on);
 * q, out: the chunk's first row (head h at h x d); scores: head h's [n, L] at h x n x L. */
__global__ void gqa_tables_kernel(const float **tab, int64_t heads, int64_t group, const float *keys,
                                  const float *vals, size_t kv_stride, const float *q, float *out, float *scores,
                                  int64_t d, int64_t nL) {
    const int64_t h = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= heads) return;
    const size_t g = (size_t)(h / group);
    tab[h] = keys + g * kv_stride;
    tab[heads + h] = q + (size_t)h * (size_t)d;
    tab[2 * heads + h] = scores + (size_t)h * (size_t)nL;
    tab[3 * heads + h] = vals + g * kv_stride;
    tab[4 * heads + h] = out + (size_t)h * (size_t)d;
}

/* Query tokens a chunk: at most CHUNK_TOKENS, so that the chunks of a long prompt skip the causal
 * upper triangle's positions (a chunk's products cover only the positions its rows see: four chunks
 * of a 512-token prompt do 0.625 of the whole square's), as many as heads x L scores each fit the
 * scratch (L: the most positions a row of the sequence sees), at least one, and within cuBLAS's int
 * sizes (rows x L and heads x rows). */
#define CHUNK_TOKENS 128
static int64_t chunk_tokens(size_t scores_floats, int64_t heads, int64_t L) {
    int64_t tc = (int64_t)(scores_floats / (size_t)(heads * L));
    if (tc > CHUNK_TOKENS) tc = CHUNK_TOKENS;
    if (tc > INT_MAX / L) tc = INT_MAX / L;
    if (tc > INT_MAX / heads) tc = INT_MAX / heads;
    return tc < 1 ? 1 : tc;
}

/* cuBLAS on stream s with the blas' workspace. */
static moex_status blas_on(const moex_cuda_blas *blas, cudaStream_t s) {
    cublasHandle_t hd = (cublasHandle_t)blas->handle;
    moex_status st = blas_status(cublasSetStream(hd, s), "cublasSetStream");
    return st ? st : blas_status(cublasSetWorkspace(hd, blas->workspace, blas->workspace_bytes), "cublasSetWorkspace");
}

/* The f32 latent path for one sequence's query rows q [tokens, heads, W] -> out [tokens, heads, dv]:
 * chunks of tc query tokens, each GEMM over the positions its rows see, f32 pedantic. keys: the
 * sequence's cached rows [past + tokens, W]. */
static moex_status latent_seq_f32(cublasHandle_t hd, cudaStream_t s, const moex_attn_seq *h, int64_t heads,
                                  const float *keys, int64_t W, const float *q, int64_t dv, float scale, float *out,
                                  float *scores, size_t scores_floats) {
    const float zero = 0.0f, one = 1.0f;
    const int64_t tc = chunk_tokens(scores_floats, heads, h->past + h->tokens); /* query tokens a chunk */
    moex_status st = MOEX_OK;
    for (int64_t c0 = 0; c0 < h->tokens && !st; c0 += tc) {
        /* the chunk's rows see positions 0 .. past + c0 + n - 1 */
        const int64_t n = h->tokens - c0 < tc ? h->tokens - c0 : tc, M = n * heads, L = h->past + c0 + n;
        const float *qc = q + (size_t)(c0 * heads) * (size_t)W;
        float *oc = out + (size_t)(c0 * heads) * (size_t)dv;
        /* column-major: scores^T [L, M] = keys^T^T ([W, L] read transposed) . q^T [W, M] */
        st = blas_status(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, (int)L, (int)M, (int)W, &scale, keys, CUDA_R_32F,
                                      (int)W, qc, CUDA_R_32F, (int)W, &zero, scores, CUDA_R_32F, (int)L,
                                      CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                         "cuda latent attention: scores GEMM");
        if (st) return st;
        if ((st = causal_softmax(scores, M, L, heads, 0, n, 0, h->past + c0 + 1, 0, NULL, NULL, s,
                                 "cuda latent attention: softmax kernel")))
            return st;
        /* out^T [dv, M] = keys' first dv values ([dv, L], ld W) . scores^T [L, M] */
        st = blas_status(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, (int)dv, (int)M, (int)L, &one, keys, CUDA_R_32F,
                                      (int)W, scores, CUDA_R_32F, (int)L, &zero, oc, CUDA_R_32F, (int)dv,
                                      CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                         "cuda latent attention: values GEMM");
    }
    return st;
}

/* floats of a region of n bf16 values, rounded up to 256 bytes */
static size_t bf16_region_floats(size_t n) { return ((n * 2 + 255) / 256) * 256 / sizeof(float); }
static size_t f32_region_floats(size_t n) { return ((n * 4 + 255) / 256) * 256 / sizeof(float); }

/* dst [3n]: src [n] rounded to bf16, three times in a row (the bf16 values GEMM's A: the chunk's
 * rows once per part of the probabilities, K = 3L). */
__global__ void bf16_thrice_kernel(const float *src, int64_t n, __nv_bfloat16 *dst) {
    GRID_STRIDE(i, n) {
        const __nv_bfloat16 b = __float2bfloat16_rn(src[i]);
        dst[i] = b, dst[n + i] = b, dst[2 * n + i] = b;
    }
}

/* The bf16 latent path's query tokens a chunk for a sequence of Ls positions (0: the scratch holds
 * less than one token's): the rows a chunk sees in bf16, three times ([3 Ls, W] at most), then per
 * chunk of tc tokens (M = tc x heads rows) the scores [M, Ls] in f32, their three bf16 parts
 * [M, 3 Ls] and the queries in bf16 [M, W], each region 256-byte aligned; at most CHUNK_TOKENS,
 * within cuBLAS's int sizes. */
static int64_t latent16_chunk_tokens(size_t scores_floats, int64_t heads, int64_t Ls, int64_t W) {
    const size_t kv16 = bf16_region_floats((size_t)(3 * Ls * W));
    /* a token's: heads rows of Ls f32 scores, 3 Ls bf16 parts and W bf16 queries, with alignment */
    const size_t per = ((size_t)heads * ((size_t)Ls * 5 + (size_t)W) + 1) / 2 + 3 * 64;
    if (scores_floats < kv16 + per) return 0;
    int64_t tc = (int64_t)((scores_floats - kv16) / per);
    if (tc > CHUNK_TOKENS) tc = CHUNK_TOKENS;
    if (tc > INT_MAX / (3 * Ls)) tc = INT_MAX / (3 * Ls);
    if (tc > INT_MAX / heads) tc = INT_MAX / heads;
    return tc;
}

/* The bf16 latent path for one sequence (the query rows and the cached rows are bf16 values held
 * in f32, as a step in bf16 compute leaves them): the same products on the tensor cores (bf16 x bf16
 * is exact in f32), f32 accumulation; the probabilities, which are not bf16 values, go into the
 * values GEMM as three bf16 parts (their sum is each f32 weight) along K = 3L, against the chunk's
 * rows repeated three times: one GEMM that writes its f32 output once. tc: latent16_chunk_tokens'
 * (> 0). */
static moex_status latent_seq_bf16(cublasHandle_t hd, cudaStream_t s, const moex_attn_seq *h, int64_t heads,
                                   const float *keys, int64_t W, const float *q, int64_t dv, float scale, float *out,
                                   float *scratch, int64_t tc) {
    const float zero = 0.0f, one = 1.0f;
    const int64_t Ls = h->past + h->tokens;
    __nv_bfloat16 *kv3 = (__nv_bfloat16 *)scratch; /* [3 L, W]: the chunk's rows, three times */
    float *scores = scratch + bf16_region_floats((size_t)(3 * Ls * W));
    const size_t M_max = (size_t)(tc * heads);
    __nv_bfloat16 *split = (__nv_bfloat16 *)(scores + f32_region_floats(M_max * (size_t)Ls));
    __nv_bfloat16 *q16 = split + bf16_region_floats(M_max * 3 * (size_t)Ls) * 2;
    moex_status st = MOEX_OK;
    for (int64_t c0 = 0; c0 < h->tokens && !st; c0 += tc) {
        /* the chunk's rows see positions 0 .. past + c0 + n - 1 */
        const int64_t n = h->tokens - c0 < tc ? h->tokens - c0 : tc, M = n * heads, L = h->past + c0 + n;
        float *oc = out + (size_t)(c0 * heads) * (size_t)dv;
        bf16_thrice_kernel<<<blocks_for(L * W, 256), 256, 0, s>>>(keys, L * W, kv3);
        if ((st = MOEX_CUDA_LAUNCHED("cuda latent attention: bf16 rows kernel"))) return st;
        if ((st = moex_cuda_convert(q + (size_t)(c0 * heads) * (size_t)W, MOEX_F32, q16, MOEX_BF16, M * W, s)))
            return st;
        /* column-major: scores^T [L, M] = kv3's first L rows^T ([W, L] read transposed) . q16^T [W, M] */
        st = blas_status(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, (int)L, (int)M, (int)W, &scale, kv3, CUDA_R_16BF,
                                      (int)W, q16, CUDA_R_16BF, (int)W, &zero, scores, CUDA_R_32F, (int)L,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cuda latent attention: bf16 scores GEMM");
        if (st) return st;
        if ((st = causal_softmax(scores, M, L, heads, 0, n, 0, h->past + c0 + 1, 0, NULL, split, s,
                                 "cuda latent attention: softmax kernel")))
            return st;
        /* out^T [dv, M] = kv3's first dv values ([dv, 3L], ld W) . [hi, mid, lo]^T [3L, M] (ld 3L) */
        st = blas_status(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, (int)dv, (int)M, (int)(3 * L), &one, kv3,
                                      CUDA_R_16BF, (int)W, split, CUDA_R_16BF, (int)(3 * L), &zero, oc, CUDA_R_32F,
                                      (int)dv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cuda latent attention: bf16 values GEMM");
    }
    return st;
}

extern "C" moex_status moex_cuda_attention_latent_gemm(const moex_cuda_blas *blas, const moex_cuda_kv_cache *cache,
                                                       int64_t layer, const moex_attn_seq *seqs,
                                                       const moex_attn_seq *host_seqs, int64_t nseq, int64_t total,
                                                       int64_t heads, float *q, const float *kv,
                                                       int64_t value_dim, float scale, float *out, int bf16_inputs,
                                                       float *scores, size_t scores_floats, int *flags, void *stream) {
    const char *fn = "cuda latent attention (GEMM)";
    moex_status st = latent_check(fn, cache, layer, seqs, nseq, total, heads, q, kv, value_dim, scale, out);
    if (st || nseq == 0 || total == 0) return st;
    if (!blas || !blas->handle) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cuBLAS handle", fn);
    const int64_t W = cache->head_dim, S = cache->max_seq, B = cache->max_batch;
    if (!scores || scores_floats < (size_t)(heads * S))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the scores scratch holds %zu floats; one row of every head "
                         "needs heads x max_seq = %lld", fn, scores_floats, (long long)(heads * S));
    if ((st = host_seqs_check(fn, cache, host_seqs, nseq, total))) return st;
    cudaStream_t s = (cudaStream_t)stream;
    /* the new rows first: every query row then sees its own position in the cache */
    if ((st = kv_append_commit("cuda latent attention: append kernel", cache, layer, seqs, nseq, total, kv, NULL, flags,
                               s)) ||
        (st = blas_on(blas, s)))
        return st;
    cublasHandle_t hd = (cublasHandle_t)blas->handle;
    int64_t row = 0; /* the sequence's first row in q and out */
    for (int64_t i = 0; i < nseq && !st; i++) {
        const moex_attn_seq *h = &host_seqs[i];
        if (h->tokens == 0) continue; /* nothing to attend */
        const float *keys = cache->k + (size_t)((layer * B + h->seq) * S) * (size_t)W; /* [past + tokens, W] */
        float *qs = q + (size_t)(row * heads) * (size_t)W;
        float *os = out + (size_t)(row * heads) * (size_t)value_dim;
        /* the bf16 path where the scratch holds a token's chunk of it (it converts q to bf16), else
         * the f32 one (bf16_inputs: q's rows rounded first, in place) */
        const int64_t tc16 = bf16_inputs ? latent16_chunk_tokens(scores_floats, heads, h->past + h->tokens, W) : 0;
        if (tc16 == 0 && bf16_inputs) st = moex_cuda_round_bf16(qs, h->tokens * heads * W, s);
        if (!st)
            st = tc16 > 0 ? latent_seq_bf16(hd, s, h, heads, keys, W, qs, value_dim, scale, os, scores, tc16)
                          : latent_seq_f32(hd, s, h, heads, keys, W, qs, value_dim, scale, os, scores, scores_floats);
        row += h->tokens;
    }
    return st;
}

extern "C" moex_status moex_cuda_attention_gemm(const moex_cuda_blas *blas, const moex_cuda_kv_cache *cache,
                                                int64_t layer, const moex_attn_seq *seqs,
                                                const moex_attn_seq *host_seqs, int64_t nseq, int64_t total,
                                                int64_t heads, const float *q, const float *k, const float *v,
                                                float *out, int64_t window, const float *sinks, float *scores,
                                                size_t scores_floats, int *flags, void *stream) {
    const char *fn = "cuda attention (GEMM)";
    moex_status st = attention_check(fn, cache, layer, seqs, nseq, total, heads, q, k, v, out, window);
    if (st || nseq == 0 || total == 0) return st;
    if (!blas || !blas->handle) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cuBLAS handle", fn);
    const int64_t KV = cache->kv_heads, d = cache->head_dim, S = cache->max_seq, B = cache->max_batch;
    const int64_t group = heads / KV;
    const size_t need = moex_cuda_attention_gemm_scratch_floats(heads, S), tables = gqa_table_floats(heads);
    if (!scores || scores_floats < need)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the scores scratch holds %zu floats; one row of every head "
                         "and the pointer tables need %zu (moex_cuda_attention_gemm_scratch_floats)", fn,
                         scores_floats, need);
    if ((st = host_seqs_check(fn, cache, host_seqs, nseq, total))) return st;
    cudaStream_t s = (cudaStream_t)stream;
    /* the new rows first: every query row then sees its own position in the cache */
    if ((st = kv_append_commit("cuda attention (GEMM): append kernel", cache, layer, seqs, nseq, total, k, v, flags,
                               s)) ||
        (st = blas_on(blas, s)))
        return st;
    cublasHandle_t hd = (cublasHandle_t)blas->handle;
    const float scale = (float)pow((double)d, -0.5), zero = 0.0f, one = 1.0f; /* head_dim ** -0.5 */
    const size_t layer_off = (size_t)layer * (size_t)(B * KV * S * d);
    const float **tab = (const float **)scores;
    float *sc = scores + tables; /* the scores after the tables */
    const size_t sc_floats = scores_floats - tables;
    int64_t row = 0; /* the sequence's first row in q and out */
    for (int64_t i = 0; i < nseq; i++) {
        const moex_attn_seq *h = &host_seqs[i];
        if (h->tokens == 0) continue; /* nothing to attend */
        /* query tokens a chunk, sized by the most positions a chunk's rows see: a window keeps them
         * under window + CHUNK_TOKENS (a chunk's L <= window + n - 1), however long the sequence */
        const int64_t Ls = h->past + h->tokens;
        const int64_t most = window > 0 && window + CHUNK_TOKENS < Ls ? window + CHUNK_TOKENS : Ls;
        const int64_t tc = chunk_tokens(sc_floats, heads, most);
        for (int64_t c0 = 0; c0 < h->tokens; c0 += tc) {
            /* the chunk's rows see positions k0 .. past + c0 + n - 1: from its first row's window start */
            const int64_t n = h->tokens - c0 < tc ? h->tokens - c0 : tc, last = h->past + c0 + n;
            const int64_t k0 = window > 0 && h->past + c0 + 1 > window ? h->past + c0 + 1 - window : 0, L = last - k0;
            const size_t kv_off = layer_off + (size_t)((h->seq * KV) * S + k0) * (size_t)d; /* kv head 0's [L, d] */
            /* head h: scores at h x n x L, [n, L] row-major; q and out rows of the chunk, ld heads x d */
            gqa_tables_kernel<<<(unsigned)((heads + 127) / 128), 128, 0, s>>>(
                tab, heads, group, cache->k + kv_off, cache->v + kv_off, (size_t)(S * d),
                q + (size_t)((row + c0) * heads) * (size_t)d, out + (size_t)((row + c0) * heads) * (size_t)d, sc, d,
                n * L);
            if ((st = MOEX_CUDA_LAUNCHED("cuda attention: pointer tables kernel"))) return st;
            /* column-major, per head: scores_h^T [L, n] = keys_g^T ([d, L] read transposed) . q_h^T [d, n] */
            st = blas_status(cublasGemmBatchedEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, (int)L, (int)n, (int)d, &scale,
                                                 (const void *const *)tab, CUDA_R_32F, (int)d,
                                                 (const void *const *)(tab + heads), CUDA_R_32F, (int)(heads * d),
                                                 &zero, (void *const *)(tab + 2 * heads), CUDA_R_32F, (int)L,
                                                 (int)heads, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                             "cuda attention: scores GEMM");
            if (st) return st;
            if ((st = causal_softmax(sc, heads * n, L, heads, 1, n, k0, h->past + c0 + 1, window, sinks, NULL, s,
                                     "cuda attention: softmax kernel")))
                return st;
            /* out_h^T [d, n] (ld heads x d) = values_g^T ([d, L]) . scores_h^T [L, n]; every query row of
             * the chunk was read above, so out may be q */
            st = blas_status(cublasGemmBatchedEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, (int)d, (int)n, (int)L, &one,
                                                 (const void *const *)(tab + 3 * heads), CUDA_R_32F, (int)d,
                                                 (const void *const *)(tab + 2 * heads), CUDA_R_32F, (int)L, &zero,
                                                 (void *const *)(tab + 4 * heads), CUDA_R_32F, (int)(heads * d),
                                                 (int)heads, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                             "cuda attention: values GEMM");
            if (st) return st;
        }
        row += h->tokens;
    }
    return MOEX_OK;
}
