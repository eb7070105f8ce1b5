/* decoder_embed_norm.cu — the embedding gather and RMSNorm (over rows, and per
 * head for q_norm / k_norm) on the device; the twins of model/linear.c's
 * moex_embedding and model/norm.c. */
#include "decoder/cuda/decoder_kernels.cuh"

#include <math.h>

/* ---- embedding ------------------------------------------------------------ */

/* One block per token row (grid-stride over rows), threads over H.
 * table: [V, H] of dt, ids: [T] -> out: [T, H] f32; a bad id zeroes its row and sets the flag. */
__global__ void embedding_kernel(const void *table, moex_dtype dt, int64_t V, int64_t H, const int64_t *ids, int64_t T,
                                 float *out, int *flags) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t id = ids[t];
        const int ok = id >= 0 && id < V;
        if (!ok && threadIdx.x == 0 && flags) atomicOr(flags, MOEX_CUDA_FLAG_BAD_TOKEN);
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
            out[t * H + i] = ok ? load_elem(table, dt, id * H + i) : 0.0f;
    }
}

extern "C" moex_status moex_cuda_embedding(const void *table, moex_dtype dtype, int64_t V, int64_t H,
                                           const int64_t *ids, int64_t T, float *out, int *flags, void *stream) {
    if (!float_dtype_ok(dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda embedding: table dtype %s (%d) is not f32, f16 or bf16",
                         moex_dtype_name(dtype), (int)dtype);
    if (V < 1 || H < 1 || V > INT64_MAX / H)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda embedding: table shape [%lld, %lld] is empty or overflows",
                         (long long)V, (long long)H);
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda embedding: T = %lld is negative", (long long)T);
    if (T == 0) return MOEX_OK;
    if (!table || !ids || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda embedding: %s is NULL",
                         !table ? "table" : !ids ? "ids" : "out");
    const unsigned grid = (unsigned)(T < 65535 ? T : 65535);
    const int threads = H >= 1024 ? 256 : 128;
    embedding_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>(table, dtype, V, H, ids, T, out, flags);
    return MOEX_CUDA_LAUNCHED("cuda embedding kernel");
}

/* ---- RMSNorm ------------------------------------------------------------------ */

/* The CPU's rms_row once the sum of squares is known:
 * var = (float)sum / (float)n, r = 1 / sqrtf(var + eps), y = w * (x * r). */
__device__ __forceinline__ float rms_factor(double sum, int64_t n, float eps) {
    const float var = div_rn((float)sum, (float)n);
    const float denom = __fsqrt_rn(add_rn(var, eps));
    return div_rn(1.0f, denom);
}

/* One warp per row (small n: head_dim, or few rows). x: [rows, n] -> y: [rows, n]; w: [n]. */
__global__ void rmsnorm_warp_kernel(const float *x, int64_t rows, int64_t n, const void *w, moex_dtype wdt, float eps,
                                    float *y) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x * (int64_t)warps + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * warps) {
        const float *xr = x + r * n;
        double sum = 0.0;
        for (int64_t i = lane; i < n; i += 32) sum += (double)mul_rn(xr[i], xr[i]); /* x*x rounded to f32 */
        sum = warp_sum_double(sum);
        const float rf = rms_factor(sum, n, eps);
        float *yr = y + r * n;
        for (int64_t i = lane; i < n; i += 32) yr[i] = mul_rn(load_elem(w, wdt, i), mul_rn(xr[i], rf));
    }
}

/* One block per row (large n: the hidden size). Same arithmetic; the double sum is reduced over the block. */
__global__ void rmsnorm_block_kernel(const float *x, int64_t rows, int64_t n, const void *w, moex_dtype wdt, float eps,
                                     float *y) {
    __shared__ double part[32];
    __shared__ float factor;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        double sum = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)mul_rn(xr[i], xr[i]);
        sum = warp_sum_double(sum);
        if (lane == 0) part[warp] = sum;
        __syncthreads();
        if (warp == 0) {
            double s = lane < warps ? part[lane] : 0.0;
            s = warp_sum_double(s);
            if (lane == 0) factor = rms_factor(s, n, eps);
        }
        __syncthreads();
        const float rf = factor;
        float *yr = y + r * n;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = mul_rn(load_elem(w, wdt, i), mul_rn(xr[i], rf));
        __syncthreads(); /* part and factor are reused by the next row */
    }
}

static moex_status rmsnorm_launch(const char *fn, const float *x, int64_t rows, int64_t n, const void *weight,
                                  moex_dtype wdt, double eps, float *y, void *stream) {
    if (rows < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld rows is negative", fn, (long long)rows);
    if (n < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: row size %lld must be >= 1", fn, (long long)n);
    if (!float_dtype_ok(wdt))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight dtype %s (%d) is not f32, f16 or bf16", fn,
                         moex_dtype_name(wdt), (int)wdt);
    if (!weight) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight is NULL", fn);
    if (!(eps >= 0.0) || !isfinite(eps))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: eps = %g must be finite and >= 0", fn, eps);
    if (rows > INT64_MAX / n)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld rows of %lld values overflows", fn, (long long)rows,
                         (long long)n);
    if (rows == 0) return MOEX_OK;
    if (!x || !y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : "y");
    if (x != y && (const void *)x < (const void *)(y + rows * n) && (const void *)y < (const void *)(x + rows * n))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: y overlaps x without being equal to it", fn);
    const float e = (float)eps; /* the Python float enters the f32 add as f32 */
    cudaStream_t s = (cudaStream_t)stream;
    if (n >= 1024 && rows < 4096) {
        rmsnorm_block_kernel<<<(unsigned)(rows < 65535 ? rows : 65535), 256, 0, s>>>(x, rows, n, weight, wdt, e, y);
    } else {
        const int warps = 8;
        rmsnorm_warp_kernel<<<blocks_for(rows, warps), warps * 32, 0, s>>>(x, rows, n, weight, wdt, e, y);
    }
    return MOEX_CUDA_LAUNCHED(fn);
}

extern "C" moex_status moex_cuda_rmsnorm(const float *x, int64_t rows, int64_t n, const void *weight,
                                         moex_dtype wdtype, double eps, float *y, void *stream) {
    return rmsnorm_launch("cuda rmsnorm", x, rows, n, weight, wdtype, eps, y, stream);
}

extern "C" moex_status moex_cuda_rmsnorm_heads(const float *x, int64_t T, int64_t heads, int64_t head_dim,
                                               const void *weight, moex_dtype wdtype, double eps, float *y,
                                               void *stream) {
    if (T < 0 || heads < 1 || (T > 0 && heads > INT64_MAX / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "cuda rmsnorm_heads: T = %lld must be >= 0 and heads = %lld >= 1 (without overflow)",
                         (long long)T, (long long)heads);
    return rmsnorm_launch("cuda rmsnorm_heads", x, T * heads, head_dim, weight, wdtype, eps, y, stream);
}
