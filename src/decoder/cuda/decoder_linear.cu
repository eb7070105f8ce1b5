/* decoder_linear.cu — nn.Linear on the device over cuBLAS (the twin of
 * model/linear.c's moex_linear): y = x W^T in f32 accumulation, then the bias.
 * f32 weights use the pedantic f32 compute type, so TF32 is never used and
 * an f32 model compares with the CPU to the last few ulps of a sum. */
#include "decoder/cuda/decoder_kernels.cuh"

#include "decoder/cuda/blas_status.cuh"

#include <cublas_v2.h>
#include <limits.h>

extern "C" moex_status moex_cuda_blas_create(int device, size_t workspace_bytes, moex_cuda_blas *out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda blas_create: out is NULL");
    memset(out, 0, sizeof *out);
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    if (workspace_bytes == 0) workspace_bytes = (size_t)32 << 20;
    void *ws = NULL;
    if ((st = moex_cuda_alloc(device, workspace_bytes, &ws))) return st;
    cublasHandle_t h = NULL;
    st = blas_status(cublasCreate(&h), "cublasCreate");
    if (!st) st = blas_status(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (!st) st = blas_status(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    if (st) {
        if (h) cublasDestroy(h);
        moex_cuda_free(device, ws);
        return st;
    }
    out->device = device;
    out->handle = h;
    out->workspace = ws;
    out->workspace_bytes = workspace_bytes;
    return MOEX_OK;
}

extern "C" void moex_cuda_blas_free(moex_cuda_blas *blas) {
    if (!blas) return;
    if (blas->handle && moex_cuda_use(blas->device) == MOEX_OK) cublasDestroy((cublasHandle_t)blas->handle);
    if (blas->workspace) moex_cuda_free(blas->device, blas->workspace);
    memset(blas, 0, sizeof *blas);
}

static cudaDataType_t cuda_type(moex_dtype dt) {
    return dt == MOEX_BF16 ? CUDA_R_16BF : dt == MOEX_F16 ? CUDA_R_16F : CUDA_R_32F;
}

// x: [T, K] -> y: [T, N]
extern "C" moex_status moex_cuda_linear(const moex_cuda_blas *blas, const moex_linear_w *w, const float *x, int64_t T,
                                        float *y, void *x16, void *stream) {
    const char *fn = "cuda linear";
    if (!blas || !blas->handle) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cuBLAS handle", fn);
    if (!w) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the layer description is NULL", fn);
    if (!float_dtype_ok(w->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight dtype %s (%d) is not f32, f16 or bf16", fn,
                         moex_dtype_name(w->dtype), (int)w->dtype);
    const int64_t N = w->out_features, K = w->in_features;
    if (N < 1 || K < 1 || N > INT_MAX || K > INT_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight shape [%lld, %lld] is outside [1, INT32_MAX]", fn,
                         (long long)N, (long long)K);
    if (!w->weight) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: weight is NULL", fn);
    if (w->bias && !float_dtype_ok(w->bias_dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: bias dtype %s (%d) is not f32, f16 or bf16", fn,
                         moex_dtype_name(w->bias_dtype), (int)w->bias_dtype);
    if (T < 0 || T > INT_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld is outside [0, INT32_MAX]", fn, (long long)T);
    if (T == 0) return MOEX_OK;
    if (!x || !y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (T = %lld)", fn, !x ? "x" : "y",
                                   (long long)T);
    const char *xb = (const char *)x, *yb = (const char *)y;
    if (xb < yb + sizeof(float) * (size_t)(T * N) && yb < xb + sizeof(float) * (size_t)(T * K))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: y overlaps x", fn);
    const int wide = w->dtype == MOEX_F32;
    if (!wide && !x16)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s weights need x16, [%lld, %lld] of %s scratch", fn,
                         moex_dtype_name(w->dtype), (long long)T, (long long)K, moex_dtype_name(w->dtype));

    moex_status st;
    const void *a = x;
    if (!wide) { /* the GEMM's inputs share one type: x rounded to the weight's */
        if ((st = moex_cuda_convert(x, MOEX_F32, x16, w->dtype, T * K, stream))) return st;
        a = x16;
    }
    cublasHandle_t h = (cublasHandle_t)blas->handle;
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    if ((st = blas_status(cublasSetStream(h, (cudaStream_t)stream), "cublasSetStream")) ||
        (st = blas_status(cublasSetWorkspace(h, blas->workspace, blas->workspace_bytes), "cublasSetWorkspace")))
        return st;
    // Column-major view: y^T [N, T] = W [N, K] (row-major = col-major [K, N], transposed) * x^T [K, T].
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t t = cuda_type(w->dtype);
    const cublasComputeType_t ct = wide ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    st = blas_status(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &alpha, w->weight, t, (int)K, a,
                                  t, (int)K, &beta, y, CUDA_R_32F, (int)N, ct, CUBLAS_GEMM_DEFAULT),
                     "cuda linear: cublasGemmEx");
    if (st) return st;
    if (w->bias) return moex_cuda_add_bias(y, T, N, w->bias, w->bias_dtype, stream);
    return MOEX_OK;
}

/* ---- DeepSeek-V3's absorbed latent attention: kv_b per head ----------------------- */

// What both products check; *a is x, or x rounded to kv_b's dtype into x16 (n values).
static moex_status mla_prepare(const char *fn, const moex_cuda_blas *blas, const moex_linear_w *kv_b, int64_t heads,
                               int64_t nope, int64_t vd, const float *x, int64_t n, int64_t T, const void *out,
                               void *x16, const void **a, void *stream) {
    if (!blas || !blas->handle) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cuBLAS handle", fn);
    if (!kv_b || !kv_b->weight) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b's weight is NULL", fn);
    if (!float_dtype_ok(kv_b->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b's dtype %s is not f32, f16 or bf16", fn,
                         moex_dtype_name(kv_b->dtype));
    if (kv_b->bias) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b has a bias (DeepSeek-V3's has none)", fn);
    if (heads < 1 || nope < 1 || vd < 1 || heads > INT_MAX / (nope + vd) || kv_b->out_features != heads * (nope + vd) ||
        kv_b->in_features < 1 || kv_b->in_features > INT_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b is [%lld, %lld], which is not %lld heads of %lld key + "
                         "%lld value rows", fn, (long long)kv_b->out_features, (long long)kv_b->in_features,
                         (long long)heads, (long long)nope, (long long)vd);
    if (T < 0 || T > INT_MAX || (T > 0 && n / T > INT_MAX))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld is outside [0, INT32_MAX]", fn, (long long)T);
    if (T == 0) return MOEX_OK;
    if (!x || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "the input" : "out");
    *a = x;
    moex_status st;
    if (kv_b->dtype != MOEX_F32) {
        if (!x16) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s weights need x16 scratch", fn,
                                   moex_dtype_name(kv_b->dtype));
        if ((st = moex_cuda_convert(x, MOEX_F32, x16, kv_b->dtype, n, stream))) return st;
        *a = x16;
    }
    cublasHandle_t h = (cublasHandle_t)blas->handle;
    if ((st = blas_status(cublasSetStream(h, (cudaStream_t)stream), "cublasSetStream")) ||
        (st = blas_status(cublasSetWorkspace(h, blas->workspace, blas->workspace_bytes), "cublasSetWorkspace")))
        return st;
    return MOEX_OK;
}

// Column-major, per head h: out_h [r, T] (ld heads * out_stride) = W_h [r, nope] (kv_b's key rows of
// head h, ld r) * q_h [nope, T] (ld heads * q_stride); the heads strided in all three.
extern "C" moex_status moex_cuda_mla_absorb(const moex_cuda_blas *blas, const moex_linear_w *kv_b, int64_t heads,
                                            int64_t nope, int64_t vd, const float *q, int64_t q_stride, int64_t T,
                                            float *out, int64_t out_stride, void *x16, void *stream) {
    const char *fn = "cuda mla_absorb";
    const void *a = NULL;
    moex_status st = mla_prepare(fn, blas, kv_b, heads, nope, vd, q, T * heads * q_stride, T, out, x16, &a, stream);
    if (st || T == 0) return st;
    const int64_t r = kv_b->in_features;
    if (q_stride < nope || out_stride < r || heads * q_stride > INT_MAX || heads * out_stride > INT_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: q_stride = %lld (needs >= %lld), out_stride = %lld (needs >= "
                         "%lld)", fn, (long long)q_stride, (long long)nope, (long long)out_stride, (long long)r);
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t t = cuda_type(kv_b->dtype);
    const cublasComputeType_t ct = kv_b->dtype == MOEX_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    return blas_status(cublasGemmStridedBatchedEx((cublasHandle_t)blas->handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)r, (int)T,
                                                  (int)nope, &alpha, kv_b->weight, t, (int)r, (long long)((nope + vd) * r),
                                                  a, t, (int)(heads * q_stride), (long long)q_stride, &beta, out,
                                                  CUDA_R_32F, (int)(heads * out_stride), (long long)out_stride,
                                                  (int)heads, ct, CUBLAS_GEMM_DEFAULT),
                       "cuda mla_absorb: cublasGemmStridedBatchedEx");
}

// Column-major, per head h: out_h [vd, T] (ld heads * vd) = W_h^T (W_h: kv_b's value rows of head h
// as [r, vd], ld r) * lat_h [r, T] (ld heads * r).
extern "C" moex_status moex_cuda_mla_values(const moex_cuda_blas *blas, const moex_linear_w *kv_b, int64_t heads,
                                            int64_t nope, int64_t vd, const float *lat, int64_t T, float *out,
                                            void *x16, void *stream) {
    const char *fn = "cuda mla_values";
    const void *a = NULL;
    const int64_t r = kv_b ? kv_b->in_features : 0;
    moex_status st = mla_prepare(fn, blas, kv_b, heads, nope, vd, lat, T * heads * r, T, out, x16, &a, stream);
    if (st || T == 0) return st;
    if (heads * r > INT_MAX || heads * vd > INT_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld heads of %lld latents overflow", fn, (long long)heads,
                         (long long)r);
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t t = cuda_type(kv_b->dtype);
    const size_t esz = float_dtype_size(kv_b->dtype);
    const void *w0 = (const char *)kv_b->weight + (size_t)(nope * r) * esz; /* head 0's first value row */
    const cublasComputeType_t ct = kv_b->dtype == MOEX_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    return blas_status(cublasGemmStridedBatchedEx((cublasHandle_t)blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)vd, (int)T,
                                                  (int)r, &alpha, w0, t, (int)r, (long long)((nope + vd) * r), a, t,
                                                  (int)(heads * r), (long long)r, &beta, out, CUDA_R_32F,
                                                  (int)(heads * vd), (long long)vd, (int)heads, ct, CUBLAS_GEMM_DEFAULT),
                       "cuda mla_values: cublasGemmStridedBatchedEx");
}
