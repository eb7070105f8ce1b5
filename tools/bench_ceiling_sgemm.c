/*
 * bench_ceiling_sgemm.c — the CPU GEMM ceiling `moex bench` measures in its own process
 * before the cases (docs/backends.md, "Measured", says how moex measures): OpenBLAS cblas_sgemm 2048x2048x2048 on the
 * bench's threads, the median of 11 timed repetitions after one warm-up. Compiled only when
 * OpenBLAS is found (CMakeLists.txt); without it the CPU bench leaves gemm_frac empty.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_ceilings.h"
#include "bench_host.h"

#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GEMM_N = 2048, CEILING_REPS = 11, GEMM_ALIGN = 64 };

static void fill_pattern(float *a, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        a[i] = (float)(s >> 8) * (1.0f / 8388608.0f) - 1.0f; /* [-1, 1) */
    }
}

static double time_one_sgemm(const float *a, const float *b, float *c)
{
    double t0 = bench_now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GEMM_N, GEMM_N, GEMM_N, 1.0f, a,
                GEMM_N, b, GEMM_N, 0.0f, c, GEMM_N);
    return bench_now_s() - t0;
}

int bench_ceiling_gemm(int threads, double *gflops, char *err, size_t err_size)
{
    size_t n = (size_t)GEMM_N * GEMM_N;
    float *a = aligned_alloc(GEMM_ALIGN, n * sizeof(float));
    float *b = aligned_alloc(GEMM_ALIGN, n * sizeof(float));
    float *c = aligned_alloc(GEMM_ALIGN, n * sizeof(float));
    if (!a || !b || !c) {
        snprintf(err, err_size, "out of memory for the %dx%d sgemm ceiling", GEMM_N, GEMM_N);
        free(a);
        free(b);
        free(c);
        return -1;
    }
    fill_pattern(a, n, 1);
    fill_pattern(b, n, 2);
    memset(c, 0, n * sizeof(float));

    openblas_set_num_threads(threads);
    (void)time_one_sgemm(a, b, c); /* warm-up: thread pool, page faults */
    double times[CEILING_REPS];
    for (int r = 0; r < CEILING_REPS; r++) {
        double t = time_one_sgemm(a, b, c);
        times[r] = t;
    }
    double mid = bench_median(times, CEILING_REPS);
    free(a);
    free(b);
    free(c);
    *gflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / mid / 1e9;
    return 0;
}
