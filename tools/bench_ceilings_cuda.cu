/*
 * bench_ceilings_cuda.cu — the GPU ceilings `moex bench --device cuda`
 * measures in its own process before the cases (docs/backends.md, "Measured", says how moex measures),
 * and the CUDA timing helpers tools/bench_cuda.c (plain C) uses:
 *   - cuBLAS bf16 GEMM 8192^3 (cublasGemmEx, f32 accumulation, bf16 output)
 *     on random data (not zeros: zeros run faster and flatter the ceiling);
 *   - cuBLASLt FP8 e4m3 GEMM 8192^3 (TN layout, as cuBLASLt requires for
 *     FP8; f32 accumulation, bf16 output), random data;
 *   - read bandwidth: a kernel summing 16-byte loads over a 4 GiB buffer.
 * Each: warm-up runs, then the median of CEILING_REPS timed runs, each timed
 * with its own pair of CUDA events. Every CUDA and cuBLAS status is checked;
 * a failure is returned as -1 with a message, never an abort.
 */
#include "bench_ceilings.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GEMM_N = 8192, CEILING_REPS = 11, WARMUP_REPS = 3 };
static const size_t READ_BYTES = (size_t)4 << 30;            /* 4 GiB */
static const size_t FLUSH_BYTES = (size_t)512 << 20;         /* > L2 of any current GPU */
static const size_t LT_WORKSPACE_BYTES = (size_t)64 << 20;

/* ------------------------------------------------------------------ errors */

#define CUDA_TRY(call, what)                                                                  \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            snprintf(err, err_size, "%s: %s (%s)", what, cudaGetErrorString(e_),             \
                     cudaGetErrorName(e_));                                                   \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

#define CUBLAS_TRY(call, what)                                                                \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            snprintf(err, err_size, "%s: cuBLAS status %d (%s)", what, (int)s_,               \
                     cublasGetStatusString(s_));                                              \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

/* ------------------------------------------------------------------ helpers */

static double median(double *t, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

__device__ static inline float hash_uniform(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; /* [-1, 1) */
}

__global__ static void fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(hash_uniform(i, seed));
}

__global__ static void fill_e4m3(__nv_fp8_e4m3 *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __nv_fp8_e4m3(hash_uniform(i, seed) * 4.0f);
}

/* Time `reps` runs of one operation, each between its own events; median ms. The op is a
 * small struct so that the same loop serves the three ceilings. */
typedef struct timed_op {
    int kind; /* 0 bf16 gemm, 1 fp8 gemm, 2 read */
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op_desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    const void *a, *b;
    void *c, *workspace;
    size_t workspace_bytes;
    const uint4 *read_src;
    size_t read_n;
    unsigned int *read_sink;
    int read_blocks;
    cudaStream_t stream;
} timed_op;

/* Sums the 16-byte words of a[0, na) and then b[0, nb) with a grid-stride loop (nb = 0: one range). */
__global__ static void read_sum(const uint4 *__restrict__ a, size_t na, const uint4 *__restrict__ b, size_t nb,
                                unsigned int *sink)
{
    unsigned int acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int part = 0; part < 2; part++) {
        const uint4 *p = part ? b : a;
        size_t n = part ? nb : na;
        size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
        for (; i + 3 * stride < n; i += 4 * stride) { /* four independent loads in flight */
            uint4 v0 = p[i], v1 = p[i + stride], v2 = p[i + 2 * stride], v3 = p[i + 3 * stride];
            acc += (v0.x ^ v0.y ^ v0.z ^ v0.w) + (v1.x ^ v1.y ^ v1.z ^ v1.w) + (v2.x ^ v2.y ^ v2.z ^ v2.w) +
                   (v3.x ^ v3.y ^ v3.z ^ v3.w);
        }
        for (; i < n; i += stride) {
            uint4 v = p[i];
            acc += v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x9E3779B9u) /* practically never: keeps the loads without a store per thread */
        atomicAdd(sink, acc);
}

static cudaError_t op_launch(timed_op *op, char *err, size_t err_size)
{
    const float alpha = 1.0f, beta = 0.0f;
    if (op->kind == 0) {
        cublasStatus_t s = cublasGemmEx(op->blas, CUBLAS_OP_N, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &alpha, op->a,
                                        CUDA_R_16BF, GEMM_N, op->b, CUDA_R_16BF, GEMM_N, &beta, op->c, CUDA_R_16BF,
                                        GEMM_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, err_size, "cublasGemmEx bf16 %dx%dx%d: cuBLAS status %d (%s)", GEMM_N, GEMM_N, GEMM_N,
                     (int)s, cublasGetStatusString(s));
            return cudaErrorUnknown;
        }
        return cudaSuccess;
    }
    if (op->kind == 1) {
        cublasStatus_t s = cublasLtMatmul(op->lt, op->op_desc, &alpha, op->a, op->la, op->b, op->lb, &beta, op->c,
                                          op->lc, op->c, op->lc, &op->algo, op->workspace, op->workspace_bytes,
                                          op->stream);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, err_size, "cublasLtMatmul e4m3 %dx%dx%d: cuBLAS status %d (%s)", GEMM_N, GEMM_N, GEMM_N,
                     (int)s, cublasGetStatusString(s));
            return cudaErrorUnknown;
        }
        return cudaSuccess;
    }
    read_sum<<<op->read_blocks, 256, 0, op->stream>>>(op->read_src, op->read_n, NULL, 0, op->read_sink);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        snprintf(err, err_size, "read kernel launch: %s", cudaGetErrorString(e));
    return e;
}

/* Warm-up, then the median ms of CEILING_REPS runs. Returns 0 or -1 (message in err). */
static int time_op(timed_op *op, double *ms_out, char *err, size_t err_size)
{
    cudaEvent_t ev[2] = {NULL, NULL};
    double times[CEILING_REPS];
    float ms = 0.0f;
    CUDA_TRY(cudaEventCreate(&ev[0]), "cudaEventCreate");
    CUDA_TRY(cudaEventCreate(&ev[1]), "cudaEventCreate");
    for (int r = 0; r < WARMUP_REPS; r++)
        if (op_launch(op, err, err_size) != cudaSuccess)
            goto fail;
    CUDA_TRY(cudaStreamSynchronize(op->stream), "warm-up");
    for (int r = 0; r < CEILING_REPS; r++) {
        CUDA_TRY(cudaEventRecord(ev[0], op->stream), "cudaEventRecord");
        if (op_launch(op, err, err_size) != cudaSuccess)
            goto fail;
        CUDA_TRY(cudaEventRecord(ev[1], op->stream), "cudaEventRecord");
        CUDA_TRY(cudaEventSynchronize(ev[1]), "timed run");
        CUDA_TRY(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
        times[r] = ms;
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    *ms_out = median(times, CEILING_REPS);
    return 0;
fail:
    if (ev[0])
        cudaEventDestroy(ev[0]);
    if (ev[1])
        cudaEventDestroy(ev[1]);
    return -1;
}

static int fill_launch_dims(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return blocks > 65536 ? 65536 : (int)(blocks ? blocks : 1);
}

/* ------------------------------------------------------------------ bf16 GEMM */

extern "C" int bench_cuda_ceiling_gemm_bf16(int device, double *tflops, char *err, size_t err_size)
{
    timed_op op;
    memset(&op, 0, sizeof op);
    void *a = NULL, *b = NULL, *c = NULL;
    size_t n = (size_t)GEMM_N * GEMM_N;
    double ms = 0.0;
    int rc = -1;
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    CUDA_TRY(cudaStreamCreateWithFlags(&op.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaMalloc(&a, n * 2), "cudaMalloc (bf16 GEMM A, 128 MiB)");
    CUDA_TRY(cudaMalloc(&b, n * 2), "cudaMalloc (bf16 GEMM B, 128 MiB)");
    CUDA_TRY(cudaMalloc(&c, n * 2), "cudaMalloc (bf16 GEMM C, 128 MiB)");
    fill_bf16<<<fill_launch_dims(n), 256, 0, op.stream>>>((__nv_bfloat16 *)a, n, 1u);
    fill_bf16<<<fill_launch_dims(n), 256, 0, op.stream>>>((__nv_bfloat16 *)b, n, 2u);
    CUDA_TRY(cudaGetLastError(), "fill kernel launch");
    CUBLAS_TRY(cublasCreate(&op.blas), "cublasCreate");
    CUBLAS_TRY(cublasSetStream(op.blas, op.stream), "cublasSetStream");
    op.kind = 0;
    op.a = a;
    op.b = b;
    op.c = c;
    if (time_op(&op, &ms, err, err_size) != 0)
        goto fail;
    *tflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / (ms * 1e-3) / 1e12;
    rc = 0;
fail:
    if (op.blas)
        cublasDestroy(op.blas);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (op.stream)
        cudaStreamDestroy(op.stream);
    return rc;
}

/* ------------------------------------------------------------------ FP8 GEMM */

extern "C" int bench_cuda_ceiling_gemm_fp8(int device, double *tflops, char *err, size_t err_size)
{
    timed_op op;
    memset(&op, 0, sizeof op);
    void *a = NULL, *b = NULL, *c = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    size_t n = (size_t)GEMM_N * GEMM_N;
    double ms = 0.0;
    int rc = -1;
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    memset(&heur, 0, sizeof heur);
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    CUDA_TRY(cudaStreamCreateWithFlags(&op.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaMalloc(&a, n), "cudaMalloc (FP8 GEMM A, 64 MiB)");
    CUDA_TRY(cudaMalloc(&b, n), "cudaMalloc (FP8 GEMM B, 64 MiB)");
    CUDA_TRY(cudaMalloc(&c, n * 2), "cudaMalloc (FP8 GEMM D, bf16, 128 MiB)");
    CUDA_TRY(cudaMalloc(&op.workspace, LT_WORKSPACE_BYTES), "cudaMalloc (cuBLASLt workspace)");
    op.workspace_bytes = LT_WORKSPACE_BYTES;
    fill_e4m3<<<fill_launch_dims(n), 256, 0, op.stream>>>((__nv_fp8_e4m3 *)a, n, 3u);
    fill_e4m3<<<fill_launch_dims(n), 256, 0, op.stream>>>((__nv_fp8_e4m3 *)b, n, 4u);
    CUDA_TRY(cudaGetLastError(), "fill kernel launch");
    CUBLAS_TRY(cublasLtCreate(&op.lt), "cublasLtCreate");
    CUBLAS_TRY(cublasLtMatmulDescCreate(&op.op_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op.op_desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
               "cublasLtMatmulDescSetAttribute(TRANSA)");
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op.op_desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
               "cublasLtMatmulDescSetAttribute(TRANSB)");
    /* TN, column-major: A stored [k, m] (lda = k), B [k, n] (ldb = k), D [m, n] bf16 */
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&op.la, CUDA_R_8F_E4M3, GEMM_N, GEMM_N, GEMM_N), "layout A (e4m3)");
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&op.lb, CUDA_R_8F_E4M3, GEMM_N, GEMM_N, GEMM_N), "layout B (e4m3)");
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&op.lc, CUDA_R_16BF, GEMM_N, GEMM_N, GEMM_N), "layout D (bf16)");
    CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &op.workspace_bytes, sizeof op.workspace_bytes),
               "cublasLtMatmulPreferenceSetAttribute(workspace)");
    CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(op.lt, op.op_desc, op.la, op.lb, op.lc, op.lc, pref, 1, &heur, &found),
               "cublasLtMatmulAlgoGetHeuristic (e4m3 TN, bf16 output)");
    if (found < 1) {
        snprintf(err, err_size, "cuBLASLt found no FP8 e4m3 algorithm for %dx%dx%d TN with bf16 output "
                 "(FP8 needs compute capability 8.9 or newer)", GEMM_N, GEMM_N, GEMM_N);
        goto fail;
    }
    op.algo = heur.algo;
    op.kind = 1;
    op.a = a;
    op.b = b;
    op.c = c;
    if (time_op(&op, &ms, err, err_size) != 0)
        goto fail;
    *tflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / (ms * 1e-3) / 1e12;
    rc = 0;
fail:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (op.la)
        cublasLtMatrixLayoutDestroy(op.la);
    if (op.lb)
        cublasLtMatrixLayoutDestroy(op.lb);
    if (op.lc)
        cublasLtMatrixLayoutDestroy(op.lc);
    if (op.op_desc)
        cublasLtMatmulDescDestroy(op.op_desc);
    if (op.lt)
        cublasLtDestroy(op.lt);
    cudaFree(op.workspace);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (op.stream)
        cudaStreamDestroy(op.stream);
    return rc;
}

/* ------------------------------------------------------------------ read */

extern "C" int bench_cuda_ceiling_read(int device, double *gbps, char *err, size_t err_size)
{
    timed_op op;
    memset(&op, 0, sizeof op);
    void *buf = NULL;
    unsigned int *sink = NULL;
    int sms = 0;
    double ms = 0.0;
    int rc = -1;
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    CUDA_TRY(cudaStreamCreateWithFlags(&op.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaMalloc(&buf, READ_BYTES), "cudaMalloc (read-bandwidth buffer, 4 GiB)");
    CUDA_TRY(cudaMalloc((void **)&sink, sizeof *sink), "cudaMalloc");
    CUDA_TRY(cudaMemsetAsync(buf, 1, READ_BYTES, op.stream), "cudaMemset (read buffer)");
    CUDA_TRY(cudaMemsetAsync(sink, 0, sizeof *sink, op.stream), "cudaMemset");
    op.kind = 2;
    op.read_src = (const uint4 *)buf;
    op.read_n = READ_BYTES / sizeof(uint4);
    op.read_sink = sink;
    op.read_blocks = (sms > 0 ? sms : 132) * 8;
    if (time_op(&op, &ms, err, err_size) != 0)
        goto fail;
    *gbps = (double)READ_BYTES / (ms * 1e-3) / 1e9;
    rc = 0;
fail:
    cudaFree(buf);
    cudaFree(sink);
    if (op.stream)
        cudaStreamDestroy(op.stream);
    return rc;
}

/* ------------------------------------------------------------------ timing helpers */

struct bench_cuda_timer {
    cudaStream_t stream; /* borrowed: the moex context's */
    cudaEvent_t start, stop;
    void *flush;         /* FLUSH_BYTES, written between timed runs to evict L2 */
    unsigned int *sink;  /* the read floor's never-taken store */
    int device, sms;
};

extern "C" int bench_cuda_timer_create(int device, void *stream, bench_cuda_timer **out, char *err,
                                       size_t err_size)
{
    bench_cuda_timer *t = (bench_cuda_timer *)calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_size, "out of memory for a CUDA timer");
        return -1;
    }
    t->stream = (cudaStream_t)stream;
    t->device = device;
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    CUDA_TRY(cudaEventCreate(&t->start), "cudaEventCreate");
    CUDA_TRY(cudaEventCreate(&t->stop), "cudaEventCreate");
    CUDA_TRY(cudaMalloc(&t->flush, FLUSH_BYTES), "cudaMalloc (L2 flush buffer, 512 MiB)");
    CUDA_TRY(cudaMalloc((void **)&t->sink, sizeof *t->sink), "cudaMalloc");
    CUDA_TRY(cudaMemset(t->sink, 0, sizeof *t->sink), "cudaMemset");
    CUDA_TRY(cudaDeviceGetAttribute(&t->sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    *out = t;
    return 0;
fail:
    bench_cuda_timer_free(t);
    return -1;
}

extern "C" void bench_cuda_timer_free(bench_cuda_timer *t)
{
    if (!t)
        return;
    if (t->start)
        cudaEventDestroy(t->start);
    if (t->stop)
        cudaEventDestroy(t->stop);
    cudaFree(t->flush);
    cudaFree(t->sink);
    free(t);
}

extern "C" int bench_cuda_flush_l2(bench_cuda_timer *t, char *err, size_t err_size)
{
    static unsigned char value = 0;
    value++;
    CUDA_TRY(cudaMemsetAsync(t->flush, value, FLUSH_BYTES, t->stream), "cudaMemsetAsync (L2 flush)");
    CUDA_TRY(cudaStreamSynchronize(t->stream), "cudaStreamSynchronize (after the L2 flush)");
    return 0;
fail:
    return -1;
}

extern "C" int bench_cuda_timer_start(bench_cuda_timer *t, char *err, size_t err_size)
{
    CUDA_TRY(cudaEventRecord(t->start, t->stream), "cudaEventRecord (start)");
    return 0;
fail:
    return -1;
}

extern "C" int bench_cuda_timer_stop(bench_cuda_timer *t, double *ms, char *err, size_t err_size)
{
    float f = 0.0f;
    CUDA_TRY(cudaEventRecord(t->stop, t->stream), "cudaEventRecord (stop)");
    CUDA_TRY(cudaEventSynchronize(t->stop), "cudaEventSynchronize (the timed forward)");
    CUDA_TRY(cudaEventElapsedTime(&f, t->start, t->stop), "cudaEventElapsedTime");
    *ms = f;
    return 0;
fail:
    return -1;
}

extern "C" int bench_cuda_read_floor(bench_cuda_timer *t, const void *a, size_t a_bytes, const void *b,
                                     size_t b_bytes, int flush, double *ms_out, char *err, size_t err_size)
{
    double times[CEILING_REPS];
    for (int r = -1; r < CEILING_REPS; r++) { /* r = -1: warm-up */
        double ms = 0.0;
        if ((flush && bench_cuda_flush_l2(t, err, err_size)) || bench_cuda_timer_start(t, err, err_size))
            return -1;
        read_sum<<<(t->sms > 0 ? t->sms : 132) * 8, 256, 0, t->stream>>>((const uint4 *)a, a_bytes / sizeof(uint4),
                                                                       (const uint4 *)b, b_bytes / sizeof(uint4),
                                                                       t->sink);
        CUDA_TRY(cudaGetLastError(), "read-floor kernel launch");
        if (bench_cuda_timer_stop(t, &ms, err, err_size))
            return -1;
        if (r >= 0)
            times[r] = ms;
    }
    *ms_out = median(times, CEILING_REPS);
    return 0;
fail:
    return -1;
}

extern "C" int bench_cuda_memory(int device, double *free_bytes, double *total_bytes, char *err, size_t err_size)
{
    size_t f = 0, tot = 0;
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    CUDA_TRY(cudaMemGetInfo(&f, &tot), "cudaMemGetInfo");
    *free_bytes = (double)f;
    *total_bytes = (double)tot;
    return 0;
fail:
    return -1;
}

extern "C" int bench_cuda_copy_gbps(int src, int dst, size_t bytes, double *gbps, char *err, size_t err_size)
{
    void *a = NULL, *b = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double t[11];
    int rc = -1;
    CUDA_TRY(cudaSetDevice(src), "cudaSetDevice");
    CUDA_TRY(cudaMalloc(&a, bytes), "cudaMalloc (copy source)");
    CUDA_TRY(cudaMemset(a, 1, bytes), "cudaMemset (copy source)");
    CUDA_TRY(cudaSetDevice(dst), "cudaSetDevice");
    CUDA_TRY(cudaMalloc(&b, bytes), "cudaMalloc (copy destination)");
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaEventCreate(&e0), "cudaEventCreate");
    CUDA_TRY(cudaEventCreate(&e1), "cudaEventCreate");
    for (int i = -2; i < 11; i++) { /* two warm-up copies, then 11 timed */
        float ms = 0.0f;
        CUDA_TRY(cudaEventRecord(e0, s), "cudaEventRecord");
        CUDA_TRY(cudaMemcpyPeerAsync(b, dst, a, src, bytes, s), "cudaMemcpyPeerAsync");
        CUDA_TRY(cudaEventRecord(e1, s), "cudaEventRecord");
        CUDA_TRY(cudaEventSynchronize(e1), "cudaEventSynchronize");
        CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        if (i >= 0)
            t[i] = ms;
    }
    *gbps = (double)bytes / (median(t, 11) * 1e-3) / 1e9;
    rc = 0;
fail:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    cudaFree(b);
    cudaSetDevice(src);
    cudaFree(a);
    return rc;
}
