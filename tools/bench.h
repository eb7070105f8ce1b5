/*
 * bench.h — the `moex bench` command (tools/bench.c), its ceilings
 * (tools/bench_ceilings.c) and its SVG plot (tools/svg_plot.c).
 */
#ifndef MOEX_TOOLS_BENCH_H
#define MOEX_TOOLS_BENCH_H

#include "moex.h"
#include <stddef.h>
#include <stdio.h>

/**
 * `moex bench ...`: argv[0] is "bench". Returns the process exit code:
 * 0 ok, 1 runtime failure (a moex call, I/O), 2 usage error (nothing written).
 */
int moex_cli_bench(int argc, char **argv);

/* ------------------------------------------------------------------------ */
/* Ceilings (tools/bench_ceilings.c, compiled with -mavx2)                   */
/* ------------------------------------------------------------------------ */

/*
 * Both functions use AVX2 instructions anywhere in their code: call them only
 * after checking at run time that the CPU has AVX2.
 * Each returns 0, or -1 with a message in err (err_size bytes).
 */

/** OpenBLAS cblas_sgemm 2048x2048x2048 on `threads` threads: median of 11 after a warm-up, GFLOP/s. */
int bench_ceiling_gemm(int threads, double *gflops, char *err, size_t err_size);

/** AVX2 sum over 1 GiB of f32 on `threads` OpenMP threads: median of 11 after a warm-up, GB/s. */
int bench_ceiling_read(int threads, double *gbps, char *err, size_t err_size);

/* ------------------------------------------------------------------------ */
/* Quantized weights (tools/bench_quant.c)                                  */
/* ------------------------------------------------------------------------ */

/**
 * w [E, N, K] of dtype dt -> newly allocated codes and scales (free both, also on failure)
 * in `format` (FP8: 128 x 128 blocks, FP4: 1 x 32), and the views q and scale over them.
 * Parallel over experts. Returns 0, or 1 after printing why.
 */
int bench_quantize(const void *w, moex_dtype dt, int64_t E, int64_t N, int64_t K, moex_quant_format format,
                   int threads, void **codes, void **scales, moex_tensor *q, moex_tensor *scale);

/* ------------------------------------------------------------------------ */
/* SVG plot (tools/svg_plot.c)                                              */
/* ------------------------------------------------------------------------ */

/** One line of a plot: n points (x[i], y[i]); points with x or y <= 0 or not finite are skipped. */
typedef struct svg_series {
    const char *name;
    int n;
    const double *x;
    const double *y;
} svg_series;

/** A log-log line plot. All strings are plain text (escaped when written); subtitle may be NULL. */
typedef struct svg_plot {
    const char *title;
    const char *subtitle;
    const char *x_label;
    const char *y_label;
    int nseries;
    const svg_series *series;
} svg_plot;

/**
 * Write `plot` as a self-contained SVG document to f: log-log axes with
 * decade ticks and labels, one polyline with markers per series, a legend.
 * Returns 0, or -1 if writing failed (ferror).
 */
int svg_plot_write(FILE *f, const svg_plot *plot);

#endif /* MOEX_TOOLS_BENCH_H */
