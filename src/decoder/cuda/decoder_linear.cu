/* decoder_linear.cu — nn.Linear on the device over cuBLAS (the twin of
 * model/linear.c's moex_linear): y = x W^T in f32 accumulation, then the bias.
 * f32 weights use the pedantic f32 compute type, so TF32 is never used and
 * an f32 model compares with the CPU to the last few ulps of a sum. */
#include "decoder/cuda/decoder_kernels.cuh"

#include <cublas_v2.h>
#include <limits.h>

/* A cuBLAS status as a moex status with cuBLAS's own words. */
static moex_status blas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return MOEX_OK;
    return moex_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MOEX_ERR_OUT_OF_MEMORY : MOEX_ERR_DEVICE,
                     "%s: cuBLAS status %d (%s): %s", what, (int)s, cublasGetStatusName(s), cublasGetStatusString(s));
}

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
