/*
 * bench_ceilings.c — the CPU read-bandwidth ceiling `moex bench` measures in its own process
 * before the cases (docs/backends.md, "Measured", says how moex measures): an AVX2 sum over a 1 GiB f32 buffer, split over
 * the bench's threads with OpenMP. It reports the median of 11 timed repetitions after one
 * warm-up: the same statistic as the backends' times, so that the fractions compare like with
 * like. The GEMM ceiling is tools/bench_ceiling_sgemm.c.
 *
 * This file is compiled with -mavx2: the caller checks for AVX2 first.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_ceilings.h"
#include "bench_host.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    CEILING_REPS = 11,
    READ_ALIGN = 64,
    READ_FLOATS_PER_STEP = 64 /* 8 accumulators x 8 floats = 4 cache lines */
};

/* 1 GiB of f32. */
static const size_t READ_BYTES = (size_t)1 << 30;

/* ------------------------------------------------------------------ read */

/* Sum n floats (n a multiple of READ_FLOATS_PER_STEP, p 32-byte aligned), 8 AVX2 accumulators. */
static float sum_avx2(const float *p, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    __m256 s4 = _mm256_setzero_ps(), s5 = _mm256_setzero_ps();
    __m256 s6 = _mm256_setzero_ps(), s7 = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += READ_FLOATS_PER_STEP) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        s4 = _mm256_add_ps(s4, _mm256_load_ps(p + i + 32));
        s5 = _mm256_add_ps(s5, _mm256_load_ps(p + i + 40));
        s6 = _mm256_add_ps(s6, _mm256_load_ps(p + i + 48));
        s7 = _mm256_add_ps(s7, _mm256_load_ps(p + i + 56));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)),
                             _mm256_add_ps(_mm256_add_ps(s4, s5), _mm256_add_ps(s6, s7)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    float total = 0.0f;
    for (int i = 0; i < 8; i++)
        total += lanes[i];
    return total;
}

/* Thread t of `threads` owns floats [*begin, *end) of n; slices are whole steps. */
static void thread_slice(size_t n, int t, int threads, size_t *begin, size_t *end)
{
    size_t steps = n / READ_FLOATS_PER_STEP;
    size_t per = steps / (size_t)threads, extra = steps % (size_t)threads;
    size_t first = (size_t)t * per + ((size_t)t < extra ? (size_t)t : extra);
    size_t count = per + ((size_t)t < extra ? 1 : 0);
    *begin = first * READ_FLOATS_PER_STEP;
    *end = (first + count) * READ_FLOATS_PER_STEP;
}

/* Touch every page from the thread that will read it (first-touch placement). */
static void touch_buffer(float *buf, size_t n, int threads)
{
#pragma omp parallel num_threads(threads)
    {
        size_t b, e;
        thread_slice(n, omp_get_thread_num(), omp_get_num_threads(), &b, &e);
        for (size_t i = b; i < e; i++)
            buf[i] = 1.0f;
    }
}

/* One parallel pass over buf; returns seconds. The sum goes to *sink. */
static double time_one_read(const float *buf, size_t n, int threads, volatile float *sink)
{
    float total = 0.0f;
    double t0 = bench_now_s();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        size_t b, e;
        thread_slice(n, omp_get_thread_num(), omp_get_num_threads(), &b, &e);
        total += sum_avx2(buf + b, e - b);
    }
    double t = bench_now_s() - t0;
    *sink = total;
    return t;
}

int bench_ceiling_read(int threads, double *gbps, char *err, size_t err_size)
{
    size_t n = READ_BYTES / sizeof(float);
    float *buf = aligned_alloc(READ_ALIGN, READ_BYTES);
    if (!buf) {
        snprintf(err, err_size, "out of memory for the 1 GiB read-bandwidth buffer");
        return -1;
    }
    touch_buffer(buf, n, threads);
    volatile float sink = 0.0f;
    (void)time_one_read(buf, n, threads, &sink); /* warm-up */
    double times[CEILING_REPS];
    for (int r = 0; r < CEILING_REPS; r++) {
        double t = time_one_read(buf, n, threads, &sink);
        times[r] = t;
    }
    double mid = bench_median(times, CEILING_REPS);
    free(buf);
    if (!(sink > 0.0f)) { /* every element is 1.0f */
        snprintf(err, err_size, "the read-bandwidth sum came out wrong (%g)", (double)sink);
        return -1;
    }
    *gbps = (double)READ_BYTES / mid / 1e9;
    return 0;
}
