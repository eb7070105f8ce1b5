/*
 * bench.h — the `moex bench` command (tools/bench.c). Its parts: the options
 * (bench_options.h), the run written once for every device (bench_run.h) with a
 * runner per device (tools/bench_cpu.c, tools/bench_cuda.c), the synthetic layer
 * (bench_layer.h), the ceilings (bench_ceilings.h), the table, CSV and plot
 * (bench_table.h, bench_output.h, svg_plot.h).
 */
#ifndef MOEX_TOOLS_BENCH_H
#define MOEX_TOOLS_BENCH_H

/**
 * `moex bench ...`: argv[0] is "bench". Returns the process exit code:
 * 0 ok, 1 runtime failure (a moex call, I/O), 2 usage error (nothing written).
 */
int moex_cli_bench(int argc, char **argv);

#endif /* MOEX_TOOLS_BENCH_H */
