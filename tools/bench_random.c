/*
 * bench_random.c — the synthetic weights, hidden states and router logits of `moex bench`:
 * splitmix64 streams, Box-Muller normals, and a pool of exact normals drawn from for speed.
 */
#include "bench_random.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t bench_stream_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = seed;
    uint64_t h = splitmix64(&s);
    s = h ^ a;
    h = splitmix64(&s);
    s = h ^ b;
    h = splitmix64(&s);
    s = h ^ c;
    return splitmix64(&s);
}

void bench_fill_normal_f32(float *x, size_t n, float scale, uint64_t state)
{
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = splitmix64(&state);
        float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777216.0f); /* (0, 1] */
        float u2 = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
        float rad = sqrtf(-2.0f * logf(u1)) * scale;
        x[i] = rad * cosf(6.2831853f * u2);
        if (i + 1 < n)
            x[i + 1] = rad * sinf(6.2831853f * u2);
    }
}

/*
 * Box-Muller costs ~10 ns a value here, minutes for a large layer. Weights and
 * hidden states are instead drawn uniformly, with replacement, from a pool of
 * NORMAL_POOL exact N(0,1) values (one random 16-bit index each): the same
 * distribution, about ten times faster.
 */
enum { NORMAL_POOL_BITS = 16, NORMAL_POOL = 1 << NORMAL_POOL_BITS };

static void fill_from_pool(float *x, size_t n, const float *pool, float scale, uint64_t state)
{
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = splitmix64(&state);
        for (size_t j = 0; j < 4 && i + j < n; j++, r >>= NORMAL_POOL_BITS)
            x[i + j] = pool[r & (NORMAL_POOL - 1)] * scale;
    }
}

int bench_fill_normal(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed, int threads)
{
    size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK, esize = moex_dtype_size(dtype);
    float *pool = malloc(NORMAL_POOL * sizeof(float));
    if (!pool) {
        fprintf(stderr, "moex bench: out of memory for random numbers\n");
        return 1;
    }
    bench_fill_normal_f32(pool, NORMAL_POOL, 1.0f, bench_stream_seed(seed, UINT64_MAX, 0, 0));
    int failed = 0;
    char msg[256] = "";
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t c = 0; c < chunks; c++) {
        float tmp[FILL_CHUNK];
        size_t off = c * FILL_CHUNK, len = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        fill_from_pool(tmp, len, pool, scale, bench_stream_seed(seed, c, 0, 0));
        moex_status s = moex_convert(tmp, MOEX_F32, (char *)dst + off * esize, dtype, len);
        if (s != MOEX_OK) {
#pragma omp critical(bench_fill_error)
            {
                if (!failed)
                    snprintf(msg, sizeof msg, "%s", moex_last_error());
                failed = 1;
            }
        }
    }
    free(pool);
    if (failed)
        fprintf(stderr, "moex bench: moex_convert failed: %s\n", msg);
    return failed ? 1 : 0;
}
