/*
 * bench_random.h — the synthetic numbers of `moex bench` (tools/bench_random.c): independent
 * streams from one seed, and N(0,1) values in any dtype that do not depend on the thread count.
 */
#ifndef MOEX_TOOLS_BENCH_RANDOM_H
#define MOEX_TOOLS_BENCH_RANDOM_H

#include "moex.h"

#include <stddef.h>
#include <stdint.h>

/* Values are made in chunks of this many, each chunk from its own stream. */
enum { FILL_CHUNK = 4096 };

/** A seed for one independent stream of random numbers. */
uint64_t bench_stream_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);

/** n standard normal floats times scale, by Box-Muller, from stream `state`. */
void bench_fill_normal_f32(float *x, size_t n, float scale, uint64_t state);

/**
 * n values ~ N(0,1) times scale, stored as dtype in dst. Chunked and parallel over
 * `threads`; each chunk has its own stream, so the values do not depend on the thread
 * count. Returns 0, or EXIT_RUNTIME (1) after printing why.
 */
int bench_fill_normal(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed, int threads);

#endif /* MOEX_TOOLS_BENCH_RANDOM_H */
