/*
 * bench_quant.h — quantized weights for `moex bench --dtype fp8|fp8-ue8m0|fp4` (tools/bench_quant.c).
 */
#ifndef MOEX_TOOLS_BENCH_QUANT_H
#define MOEX_TOOLS_BENCH_QUANT_H

#include "moex.h"

#include <stdint.h>

/**
 * w [E, N, K] of dtype dt -> newly allocated codes and scales (free both, also on failure)
 * in `format` (FP8: 128 x 128 blocks, FP4: 1 x 32), and the views q and scale over them.
 * Parallel over experts. Returns 0, or 1 after printing why.
 */
int bench_quantize(const void *w, moex_dtype dt, int64_t E, int64_t N, int64_t K, moex_quant_format format,
                   int threads, void **codes, void **scales, moex_tensor *q, moex_tensor *scale);

#endif /* MOEX_TOOLS_BENCH_QUANT_H */
