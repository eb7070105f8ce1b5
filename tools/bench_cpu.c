/*
 * bench_cpu.c — the CPU runner of `moex bench` (see bench_run.h): the host's memory checked,
 * the banner, the CPU ceilings (OpenBLAS sgemm, when built with it, and an AVX2 read), one
 * context for every backend, a last-level-cache flush before each forward, wall-clock timing.
 */
#include "bench_fail.h"
#include "bench_host.h"
#include "bench_output.h"
#include "bench_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MOEX_BENCH_HAVE_OPENBLAS
#define MOEX_BENCH_HAVE_OPENBLAS 0
#endif

/* Known figures of the 2-core Zen 3 machine moex is developed on; a ceiling more than 15% below warns. */
static const double REF_SGEMM_GFLOPS_2T = 140.0;
static const double REF_READ_GBPS_1T = 18.0;
static const double REF_READ_GBPS_2T = 28.0;

/* Refuse (exit 2) a run whose weights and inputs would not fit in the memory available. */
static int check_memory(const bench_state *st)
{
    const bench_opts *o = st->o;
    double avail = bench_mem_available_bytes();
    if (avail <= 0.0)
        return 0;
    double budget = 0.85 * avail - (double)st->flush_n * 4.0 - (double)(1u << 30);
    double inputs = bench_workload_bytes(st, o->tokens[o->ntokens - 1]);
    double weights = (double)st->experts * st->bytes_per_expert;
    if (weights + inputs <= budget)
        return 0;
    fprintf(stderr,
            "moex bench: %s with %lld experts needs %.1f GiB of %s weights and %.1f GiB of "
            "inputs at T=%lld, more than the %.1f GiB this machine has available (85%%, less "
            "the ceilings' buffer)",
            o->shape->name, (long long)st->experts, weights / 1073741824.0, bench_weight_label(o),
            inputs / 1073741824.0, (long long)o->tokens[o->ntokens - 1], budget / 1073741824.0);
    long long fit = (long long)floor((budget - inputs) / st->bytes_per_expert);
    if (fit >= 1)
        fprintf(stderr, "; try --max-experts %lld\n", fit < st->experts ? fit : st->experts - 1);
    else
        fprintf(stderr, "; use fewer --tokens or a smaller --dtype\n");
    return EXIT_USAGE;
}

static int cpu_resolve(bench_state *st)
{
    const bench_opts *o = st->o;
    if (bench_check_backends(o, (moex_device){MOEX_DEVICE_CPU, 0}))
        return EXIT_USAGE;
    int rc = bench_resolve_sizes(o, st);
    if (rc)
        return rc;
    size_t llc = bench_largest_cache_bytes();
    size_t flush_bytes = 2 * llc > ((size_t)64 << 20) ? 2 * llc : ((size_t)64 << 20);
    st->flush_n = flush_bytes / sizeof(float);
    return check_memory(st);
}

static void cpu_banner(const bench_state *st)
{
    const bench_opts *o = st->o;
    printf("moex bench %s: %s  H=%lld I=%lld experts=%lld", moex_version(), o->shape->name,
           (long long)st->hidden, (long long)st->intermediate, (long long)st->experts);
    if (st->experts < o->shape->experts)
        printf(" (of %lld)", (long long)o->shape->experts);
    printf(" k=%lld%s  %s\n", (long long)st->top_k, o->shape->gptoss ? " (gpt-oss layout)" : "",
           bench_weight_label(o));
    printf("cpu: %s, %d cores, moex %s kernels; threads=%d  runs=%d (+%d warm-up)  seed=%llu\n",
           st->cpu_model, st->cpu.cpu_cores, st->cpu.cpu_avx2 ? "avx2" : "portable", st->threads,
           o->runs, WARMUP_RUNS, (unsigned long long)o->seed);
    printf("timing: %s\n", o->warm ? "no cache flush; every run repeats one routing (--cache warm)"
                                    : "the last-level cache flushed before every forward; a fresh "
                                      "routing every run");
}

/* Print "expected" figures and the warning when threads is 1 or 2. */
static void compare_ceilings(bench_state *st)
{
    if (st->threads > 2 || !isfinite(st->gemm_gflops) || !isfinite(st->read_gbps))
        return;
    double gemm_ref = REF_SGEMM_GFLOPS_2T * st->threads / 2.0;
    double read_ref = st->threads == 1 ? REF_READ_GBPS_1T : REF_READ_GBPS_2T;
    printf("reference (the 2-core Zen 3 machine's known figures, %d thread%s): sgemm %.0f GFLOP/s, read %.0f "
           "GB/s; measured %.0f%% and %.0f%% of them\n",
           st->threads, st->threads == 1 ? "" : "s", gemm_ref, read_ref,
           100.0 * st->gemm_gflops / gemm_ref, 100.0 * st->read_gbps / read_ref);
    st->ceilings_low = st->gemm_gflops < CEILING_TOLERANCE * gemm_ref ||
                       st->read_gbps < CEILING_TOLERANCE * read_ref;
    fflush(stdout);
    if (st->ceilings_low) {
        const char *w = "WARNING: a ceiling is more than 15% below the reference figures (a "
                        "busy or slower machine): the fractions below flatter the result.\n";
        printf("%s", w);
        fprintf(stderr, "moex bench: %s", w);
    }
}

/* The sgemm ceiling, or NaN in a moex built without OpenBLAS. */
static int gemm_ceiling(bench_state *st, char *err, size_t err_size)
{
#if MOEX_BENCH_HAVE_OPENBLAS
    return bench_ceiling_gemm(st->threads, &st->gemm_gflops, err, err_size);
#else
    (void)err;
    (void)err_size;
    st->gemm_gflops = NAN;
    return 0;
#endif
}

static int cpu_ceilings(bench_state *st)
{
    char err[256];
    if (!bench_cpu_has_avx2()) {
        fprintf(stderr, "moex bench: warning: this CPU has no AVX2; ceilings not measured, "
                        "fractions left empty\n");
        return 0;
    }
    if (!MOEX_BENCH_HAVE_OPENBLAS)
        fprintf(stderr, "moex bench: warning: this moex was built without OpenBLAS: the sgemm ceiling is not "
                        "measured and gemm_frac is left empty (nan in the CSV)\n");
    fprintf(stderr, "moex bench: measuring ceilings (%sAVX2 read of 1 GiB) on %d thread%s ...\n",
            MOEX_BENCH_HAVE_OPENBLAS ? "sgemm 2048^3, " : "", st->threads, st->threads == 1 ? "" : "s");
    if (gemm_ceiling(st, err, sizeof err) != 0 || bench_ceiling_read(st->threads, &st->read_gbps, err, sizeof err) != 0) {
        fprintf(stderr, "moex bench: ceilings: %s\n", err);
        return EXIT_RUNTIME;
    }
    if (MOEX_BENCH_HAVE_OPENBLAS)
        printf("ceilings: sgemm 2048^3 %.1f GFLOP/s, AVX2 read 1 GiB %.2f GB/s (%d thread%s)\n", st->gemm_gflops,
               st->read_gbps, st->threads, st->threads == 1 ? "" : "s");
    else
        printf("ceilings: sgemm 2048^3 not measured (built without OpenBLAS), AVX2 read 1 GiB %.2f GB/s (%d "
               "thread%s)\n",
               st->read_gbps, st->threads, st->threads == 1 ? "" : "s");
    compare_ceilings(st);
    return 0;
}

/* A buffer twice the last-level cache, read between forwards so weights come from memory. */
static int alloc_flush(bench_state *st)
{
    if (bench_alloc((void **)&st->flush, (double)st->flush_n * sizeof(float), "cache flush"))
        return EXIT_RUNTIME;
    for (size_t i = 0; i < st->flush_n; i++)
        st->flush[i] = (float)(i & 7);
    return 0;
}

/* One context (threads, max_tokens = the largest T) for every backend, and eager; the flush buffer. */
static int cpu_contexts(bench_state *st)
{
    const bench_opts *o = st->o;
    moex_context_options co = moex_context_default_options();
    co.device = (moex_device){MOEX_DEVICE_CPU, 0};
    co.num_threads = st->threads;
    co.max_tokens = o->tokens[o->ntokens - 1];
    moex_context *ctx = NULL;
    moex_status s = moex_context_create(&co, &ctx);
    if (s != MOEX_OK)
        return bench_moex_failed("moex_context_create", s);
    st->owned[0] = ctx;
    for (int b = 0; b <= o->nbackends; b++) {
        const char *name = b < o->nbackends ? o->backends[b] : "eager";
        if (b == o->nbackends && (st->eager_index >= 0 || !o->reference))
            break;
        s = moex_prepare(ctx, st->layer.layer, name);
        if (s != MOEX_OK) {
            char what[NAME_LEN + 32];
            snprintf(what, sizeof what, "moex_prepare(%s)", name);
            return bench_moex_failed(what, s);
        }
        st->ctx[b < o->nbackends ? b : MAX_BACKENDS] = ctx;
    }
    fprintf(stderr, "moex bench: context workspace %.1f MiB\n", moex_context_workspace_bytes(ctx) / 1048576.0);
    return alloc_flush(st);
}

/* Read one float per 64-byte line of the flush buffer; the sum is kept so that the reads are. */
static int cpu_flush(bench_state *st)
{
    float total = 0.0f;
    const float *p = st->flush;
    long n = (long)st->flush_n;
#pragma omp parallel for schedule(static) reduction(+ : total) num_threads(st->threads)
    for (long i = 0; i < n; i += 16)
        total += p[i];
    volatile float sink = total;
    (void)sink;
    return 0;
}

static int cpu_timer_start(bench_state *st)
{
    st->t0 = bench_now_s();
    return 0;
}

static int cpu_timer_stop(bench_state *st, double *sec)
{
    *sec = bench_now_s() - st->t0;
    return 0;
}

static void cpu_csv_comments(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    char host[256], date[32];
    bench_host_and_date(host, sizeof host, date, sizeof date);
    fprintf(f, "# ceiling gemm_gflops=%.2f read_gbps=%.2f\n", st->gemm_gflops, st->read_gbps);
    fprintf(f, "# machine=%s date=%s moex=%s experts=%lld\n", host, date, moex_version(), (long long)st->experts);
    fprintf(f, "# cpu=\"%s\" avx2=%d shape=%s hidden=%lld intermediate=%lld num_experts=%lld "
               "top_k=%lld runs=%d warmup=%d seed=%llu ceilings_low=%d other_cpu_share=%.3f "
               "cache=%s\n",
            st->cpu_model, st->cpu.cpu_avx2, o->shape->name, (long long)st->hidden,
            (long long)st->intermediate, (long long)o->shape->experts, (long long)st->top_k,
            o->runs, WARMUP_RUNS, (unsigned long long)o->seed, st->ceilings_low, st->other_share,
            o->warm ? "warm_one_routing" : "flushed");
}

static void cpu_release(bench_state *st)
{
    free(st->flush);
    st->flush = NULL;
}

const bench_runner bench_cpu_runner = {
    .resolve = cpu_resolve,
    .banner = cpu_banner,
    .ceilings = cpu_ceilings,
    .upload = 0,
    .contexts = cpu_contexts,
    .flush = cpu_flush,
    .timer_start = cpu_timer_start,
    .timer_stop = cpu_timer_stop,
    .rows_may_fail = 0,
    .read_floor = NULL,
    .csv_comments = cpu_csv_comments,
    .release = cpu_release,
};
