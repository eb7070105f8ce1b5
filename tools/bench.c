/*
 * bench.c — `moex bench`: times the experts layer of a named MoE shape
 * through moex backends on synthetic weights and fresh random routings, and
 * prints each case also as a fraction of ceilings measured in the same
 * process (docs/backends.md, "Measured", says how moex measures).
 *
 * Flow: parse and validate every argument (tools/bench_options.c; exit 2, nothing
 * written) -> per --dtype, one pass (tools/bench_run.c) with the device's runner
 * (tools/bench_cpu.c, tools/bench_cuda.c): resolve the device, threads and memory ->
 * ceilings -> synthetic layer, contexts, prepare -> per token count: routings,
 * interleaved timed runs, table rows -> CSV and SVG (tools/bench_output.c; each
 * written to a temp file, then renamed).
 *
 * --ep N: the layer as an expert-parallel group of N ranks beside one device (tools/bench_ep.c).
 *
 * --device cuda (built with MOEX_HAVE_CUDA): the same flow with the weights and every run's
 * inputs made on the host and copied to the GPU, GPU ceilings (tools/bench_ceilings_cuda.cu),
 * one context per backend, CUDA-event timing after an L2 flush, and each backend also
 * captured in a CUDA graph and replayed (rows graph=1).
 */
#include "bench.h"
#include "cli.h"
#include "bench_ep.h"
#include "bench_fail.h"
#include "bench_options.h"
#include "bench_output.h"
#include "bench_run.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The device's runner for st->o (0), or an exit code after printing why there is none. */
static int pick_runner(bench_state *st)
{
    const bench_opts *o = st->o;
    if (o->device.kind == MOEX_DEVICE_CPU) {
        st->runner = &bench_cpu_runner;
        return 0;
    }
    moex_status s = moex_device_query(o->device, &st->gpu);
    if (s != MOEX_OK)
        return bench_moex_failed("moex_device_query(cuda)", s);
    if (!st->gpu.available) {
        fprintf(stderr, "moex bench: --device cuda:%d is not available: %s\n", o->device.index, st->gpu.reason);
        return EXIT_RUNTIME;
    }
#if MOEX_HAVE_CUDA
    st->runner = &bench_cuda_runner;
    st->cuda = 1;
    return 0;
#else
    fprintf(stderr, "moex bench: --device cuda: %s is available, but this moex command was "
                    "built without its CUDA benchmark code; rebuild with CUDA\n",
            st->gpu.name);
    return EXIT_RUNTIME;
#endif
}

/* One pass of options o into st: its runner, sizes and checks, then the measurements. */
static int run_pass(const bench_opts *o, bench_state *st)
{
    st->o = o;
    st->ngraph = 1;
    st->graph_first = 0;
    st->gpu_bf16_tflops = st->gpu_fp8_tflops = st->gpu_read_gbps = NAN;
    int rc = pick_runner(st);
    if (!rc)
        rc = st->runner->resolve(st);
    if (!rc)
        rc = bench_run(st);
    return rc;
}

int moex_cli_bench(int argc, char **argv)
{
    bench_opts o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc == PARSE_HELP) {
        bench_print_usage(stdout); /* longer than stdout's buffer: its failure's errno is kept at once */
        return cli_stdout_flush() ? EXIT_RUNTIME : EXIT_OK;
    }
    if (rc)
        return EXIT_USAGE;
    if (o.ep)
        return bench_ep_run(&o);
    /* one pass per --dtype, each with its own weights (released before the next is built) */
    bench_opts opts[MAX_DTYPES];
    bench_state st[MAX_DTYPES];
    memset(st, 0, sizeof st);
    int n = o.ndtypes > 0 ? o.ndtypes : 1;
    for (int d = 0; d < n && !rc; d++) {
        opts[d] = o;
        if (o.ndtypes > 0)
            bench_apply_dtype(o.dtypes[d], &opts[d]);
        rc = run_pass(&opts[d], &st[d]);
        bench_state_release(&st[d]);
        if (d > 0)
            st[d - 1].next = &st[d];
    }
    if (!rc)
        rc = bench_write_outputs(&st[0]);
    for (int d = 0; d < n; d++)
        bench_state_free(&st[d]);
    return rc;
}
