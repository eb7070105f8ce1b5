/*
 * bench_ceilings.h — the ceilings `moex bench` measures in its own process before the cases:
 * on the CPU (tools/bench_ceilings.c, tools/bench_ceiling_sgemm.c) and on the GPU, with the
 * CUDA-event timer and L2 flush of the GPU runs (tools/bench_ceilings_cuda.cu; CUDA builds only).
 */
#ifndef MOEX_TOOLS_BENCH_CEILINGS_H
#define MOEX_TOOLS_BENCH_CEILINGS_H

#include <stddef.h>

/* ------------------------------------------------------------------------ */
/* CPU ceilings                                                             */
/* ------------------------------------------------------------------------ */

/* Each returns 0, or -1 with a message in err (err_size bytes). */

/**
 * OpenBLAS cblas_sgemm 2048x2048x2048 on `threads` threads: median of 11 after a warm-up,
 * GFLOP/s (tools/bench_ceiling_sgemm.c). Only in a moex built with OpenBLAS: the build
 * defines MOEX_BENCH_HAVE_OPENBLAS=1 then, else 0 and this function is not there.
 */
int bench_ceiling_gemm(int threads, double *gflops, char *err, size_t err_size);

/**
 * AVX2 sum over 1 GiB of f32 on `threads` OpenMP threads: median of 11 after a warm-up, GB/s
 * (tools/bench_ceilings.c, compiled with -mavx2: call it only after checking at run time that
 * the CPU has AVX2).
 */
int bench_ceiling_read(int threads, double *gbps, char *err, size_t err_size);

/* ------------------------------------------------------------------------ */
/* GPU ceilings and timing (tools/bench_ceilings_cuda.cu; CUDA builds only) */
/* ------------------------------------------------------------------------ */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Each returns 0, or -1 with a message in err (err_size bytes); device is the
 * CUDA ordinal. Warm-up, then the median of 11 runs timed with CUDA events.
 */

/** cuBLAS bf16 GEMM 8192^3 (cublasGemmEx, f32 accumulation, random data): TFLOP/s. */
int bench_cuda_ceiling_gemm_bf16(int device, double *tflops, char *err, size_t err_size);

/** cuBLASLt FP8 e4m3 GEMM 8192^3 (TN, f32 accumulation, bf16 output, random data): TFLOP/s. */
int bench_cuda_ceiling_gemm_fp8(int device, double *tflops, char *err, size_t err_size);

/** A kernel summing 16-byte loads over a 4 GiB buffer: GB/s read. */
int bench_cuda_ceiling_read(int device, double *gbps, char *err, size_t err_size);

/** CUDA events on a borrowed stream (a moex context's), and a 512 MiB L2-flush buffer. */
typedef struct bench_cuda_timer bench_cuda_timer;

/** stream: a cudaStream_t as from moex_context_stream(). */
int bench_cuda_timer_create(int device, void *stream, bench_cuda_timer **out, char *err, size_t err_size);
void bench_cuda_timer_free(bench_cuda_timer *t);
/** Overwrite the flush buffer on the stream (evicting L2) and wait for it. */
int bench_cuda_flush_l2(bench_cuda_timer *t, char *err, size_t err_size);
/** Record the start event on the stream. */
int bench_cuda_timer_start(bench_cuda_timer *t, char *err, size_t err_size);
/** Record the stop event, wait for it, and give the milliseconds since the start event. */
int bench_cuda_timer_stop(bench_cuda_timer *t, double *ms, char *err, size_t err_size);
/**
 * The read floor of one case: one launch of the read kernel over a[0, a_bytes) and then
 * b[0, b_bytes) (multiples of 16), on the timer's stream, L2 flushed before each run when
 * flush is 1. Warm-up, then the median ms of 11 runs.
 */
int bench_cuda_read_floor(bench_cuda_timer *t, const void *a, size_t a_bytes, const void *b, size_t b_bytes,
                          int flush, double *ms, char *err, size_t err_size);
/**
 * One copy of `bytes` from GPU src to GPU dst (cudaMemcpyPeerAsync on a stream of dst; src == dst:
 * a copy within one GPU, read and write): two warm-up copies, then the median of 11, in GB/s (the
 * bytes over the time). What an expert-parallel exchange between the two can move.
 */
int bench_cuda_copy_gbps(int src, int dst, size_t bytes, double *gbps, char *err, size_t err_size);
/** Free and total device memory in bytes (cudaMemGetInfo). */
int bench_cuda_memory(int device, double *free_bytes, double *total_bytes, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_TOOLS_BENCH_CEILINGS_H */
