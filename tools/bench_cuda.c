/*
 * bench_cuda.c — the CUDA runner of `moex bench --device cuda` (see bench_run.h; compiled in
 * CUDA builds only): the host's and the GPU's memory checked, the banner, the GPU ceilings
 * (tools/bench_ceilings_cuda.cu), one context per backend sized by its token limit, an L2
 * flush before each forward, CUDA-event timing, the read floor of each token count. The
 * layer and every run's inputs are built on the host and uploaded (bench_run.c).
 */
#include "bench_fail.h"
#include "bench_host.h"
#include "bench_output.h"
#include "bench_run.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Known figures of the H200 (its measured GEMM and read rates); a ceiling 15% below warns. */
static const double REF_H200_BF16_TFLOPS = 789.0;
static const double REF_H200_FP8_TFLOPS = 1531.0;
static const double REF_H200_READ_GBPS = 4250.0;

static int cuda_tool_failed(const char *err)
{
    fprintf(stderr, "moex bench: %s\n", err);
    return EXIT_RUNTIME;
}

/* Sizes, variants; the memory of the host (the layer is built there) and of the GPU. */
static int cuda_resolve(bench_state *st)
{
    const bench_opts *o = st->o;
    char err[256];
    if (bench_check_backends(o, o->device))
        return EXIT_USAGE;
    int rc = bench_resolve_sizes(o, st);
    if (rc)
        return rc;
    st->ngraph = o->graph == GRAPH_BOTH ? 2 : 1;
    st->graph_first = o->graph == GRAPH_ON ? 1 : 0;

    /* host: the weights while they are made and uploaded; later the inputs of every run of the largest T */
    int64_t Tmax = o->tokens[o->ntokens - 1];
    double weights = st->experts * st->bytes_per_expert, inputs = bench_workload_bytes(st, Tmax);
    double avail = bench_mem_available_bytes();
    if (avail > 0.0 && weights > 0.85 * avail) {
        fprintf(stderr, "moex bench: %s with %lld experts needs %.1f GiB of host memory for its weights "
                        "(made there, then copied to cuda:%d), more than 85%% of the %.1f GiB available; "
                        "use --max-experts\n",
                o->shape->name, (long long)st->experts, weights / 1073741824.0, o->device.index,
                avail / 1073741824.0);
        return EXIT_USAGE;
    }
    if (avail > 0.0 && inputs > 0.85 * avail) {
        fprintf(stderr, "moex bench: the inputs at T=%lld need %.1f GiB of host memory, more than "
                        "85%% of the %.1f GiB available; use fewer --tokens or --runs\n",
                (long long)Tmax, inputs / 1073741824.0, avail / 1073741824.0);
        return EXIT_USAGE;
    }
    /* GPU: weights, every run's inputs, outputs, graph inputs, the L2 flush buffer */
    double free_b = 0.0, total_b = 0.0;
    if (bench_cuda_memory(o->device.index, &free_b, &total_b, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    double th = (double)Tmax * st->hidden * st->esize, tk = (double)Tmax * st->top_k;
    double runs = o->runs + WARMUP_RUNS;
    double gpu_need = weights + runs * (th + tk * (4.0 + st->esize)) + (bench_nvariants(st) + 2) * th +
                      tk * (4.0 + st->esize) + (double)(512u << 20);
    if (gpu_need > 0.9 * free_b) {
        fprintf(stderr, "moex bench: %s with %lld experts needs %.1f GiB on cuda:%d (weights and "
                        "the inputs of every run at T=%lld), more than 90%% of the %.1f GiB free; "
                        "use --max-experts, fewer --tokens or --runs\n",
                o->shape->name, (long long)st->experts, gpu_need / 1073741824.0, o->device.index,
                (long long)Tmax, free_b / 1073741824.0);
        return EXIT_USAGE;
    }
    return 0;
}

static void cuda_banner(const bench_state *st)
{
    const bench_opts *o = st->o;
    printf("moex bench %s: %s  H=%lld I=%lld experts=%lld", moex_version(), o->shape->name,
           (long long)st->hidden, (long long)st->intermediate, (long long)st->experts);
    if (st->experts < o->shape->experts)
        printf(" (of %lld)", (long long)o->shape->experts);
    printf(" k=%lld%s  %s\n", (long long)st->top_k, o->shape->gptoss ? " (gpt-oss layout)" : "",
           moex_dtype_name(o->dtype));
    printf("gpu: cuda:%d %s (compute capability %d.%d); host %s; runs=%d (+%d warm-up)  "
           "seed=%llu  graph=%s\n",
           o->device.index, st->gpu.name, st->gpu.cc_major, st->gpu.cc_minor, st->cpu_model,
           o->runs, WARMUP_RUNS, (unsigned long long)o->seed,
           o->graph == GRAPH_BOTH ? "off and on" : o->graph == GRAPH_ON ? "on" : "off");
    printf("timing: CUDA events around each forward (or graph replay) queued on an idle stream %s\n",
           o->warm ? "without an L2 flush; every run repeats one routing (--cache warm)"
                   : "after an L2 flush; a fresh routing every run");
    for (int i = 0; i < o->nlimits; i++)
        printf("limit: %s only at T <= %lld\n", o->limit_names[i], (long long)o->limit_tokens[i]);
}

static int cuda_ceilings(bench_state *st)
{
    char err[512];
    int dev = st->o->device.index;
    fprintf(stderr, "moex bench: measuring GPU ceilings (cuBLAS bf16 GEMM 8192^3, cuBLASLt FP8 "
                    "e4m3 GEMM 8192^3, read of 4 GiB) ...\n");
    if (bench_cuda_ceiling_gemm_bf16(dev, &st->gpu_bf16_tflops, err, sizeof err) != 0 ||
        bench_cuda_ceiling_read(dev, &st->gpu_read_gbps, err, sizeof err) != 0) {
        fprintf(stderr, "moex bench: ceilings: %s\n", err);
        return EXIT_RUNTIME;
    }
    if (bench_cuda_ceiling_gemm_fp8(dev, &st->gpu_fp8_tflops, err, sizeof err) != 0) {
        fprintf(stderr, "moex bench: warning: the FP8 ceiling was not measured: %s\n", err);
        st->gpu_fp8_tflops = NAN;
    }
    /* gemm_frac of FP8 experts: over the FP8 GEMM */
    st->gemm_gflops = 1e3 * (st->o->quantized ? st->gpu_fp8_tflops : st->gpu_bf16_tflops);
    st->read_gbps = st->gpu_read_gbps;
    printf("ceilings: cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s, cuBLASLt FP8 e4m3 GEMM 8192^3 %.1f "
           "TFLOP/s, device read of 4 GiB %.1f GB/s\n",
           st->gpu_bf16_tflops, st->gpu_fp8_tflops, st->gpu_read_gbps);
    if (strstr(st->gpu.name, "H200")) {
        printf("reference (the H200's known figures): bf16 GEMM %.0f TFLOP/s, FP8 GEMM %.0f TFLOP/s, "
               "read %.0f GB/s; measured %.0f%%, %.0f%% and %.0f%% of them\n",
               REF_H200_BF16_TFLOPS, REF_H200_FP8_TFLOPS, REF_H200_READ_GBPS,
               100.0 * st->gpu_bf16_tflops / REF_H200_BF16_TFLOPS,
               100.0 * st->gpu_fp8_tflops / REF_H200_FP8_TFLOPS,
               100.0 * st->gpu_read_gbps / REF_H200_READ_GBPS);
        st->ceilings_low = st->gpu_bf16_tflops < CEILING_TOLERANCE * REF_H200_BF16_TFLOPS ||
                           st->gpu_read_gbps < CEILING_TOLERANCE * REF_H200_READ_GBPS ||
                           (isfinite(st->gpu_fp8_tflops) &&
                            st->gpu_fp8_tflops < CEILING_TOLERANCE * REF_H200_FP8_TFLOPS);
        if (st->ceilings_low) {
            const char *w = "WARNING: a GPU ceiling is more than 15% below the reference figures "
                            "(a busy or throttled GPU): the fractions below flatter the result.\n";
            printf("%s", w);
            fprintf(stderr, "moex bench: %s", w);
        }
    }
    fflush(stdout);
    return 0;
}

/* The largest of --tokens that backend `name` runs at, or 0 if none. */
static int64_t largest_tokens_for(const bench_opts *o, const char *name)
{
    int64_t lim = bench_backend_limit(o, name), best = 0;
    for (int ti = 0; ti < o->ntokens; ti++)
        if (o->tokens[ti] <= lim)
            best = o->tokens[ti];
    return best;
}

/* One CUDA context per backend, sized for the largest T it runs (all on one stream); the
 * eager reference context when eager is not timed; the event timer on their stream. */
static int cuda_contexts(bench_state *st)
{
    const bench_opts *o = st->o;
    char err[512];
    void *stream = NULL;
    for (int b = 0; b <= o->nbackends; b++) {
        const char *name = b < o->nbackends ? o->backends[b] : "eager";
        if (b == o->nbackends && (st->eager_index >= 0 || !o->reference))
            break;
        int64_t tmax = largest_tokens_for(o, name);
        if (tmax == 0)
            continue;
        moex_context_options co = moex_context_default_options();
        co.device = o->device;
        co.max_tokens = tmax;
        moex_context *ctx = NULL;
        moex_status s = moex_context_create(&co, &ctx);
        if (s != MOEX_OK)
            return bench_moex_failed("moex_context_create(cuda)", s);
        s = moex_prepare(ctx, st->layer.layer, name);
        if (s != MOEX_OK) {
            /* e.g. a workspace too large for this GPU at that T: its rows say "failed" */
            fprintf(stderr, "moex bench: warning: moex_prepare(%s) for T <= %lld failed: %s; its "
                            "rows are left empty (--backend-max-tokens %s=N may help)\n",
                    name, (long long)tmax, moex_last_error(), name);
            moex_context_free(ctx);
            if (b < o->nbackends)
                st->prepare_failed[b] = 1;
            continue;
        }
        fprintf(stderr, "moex bench: %s: context for T <= %lld, workspace %.1f MiB\n", name,
                (long long)tmax, moex_context_workspace_bytes(ctx) / 1048576.0);
        st->owned[b] = ctx;
        st->ctx[b < o->nbackends ? b : MAX_BACKENDS] = ctx;
        if (!stream && (s = moex_context_stream(ctx, &stream)) != MOEX_OK)
            return bench_moex_failed("moex_context_stream", s);
    }
    if (!stream) {
        fprintf(stderr, "moex bench: no backend could be prepared on cuda:%d\n", o->device.index);
        return EXIT_RUNTIME;
    }
    if (bench_cuda_timer_create(o->device.index, stream, &st->timer, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    return 0;
}

static int cuda_flush(bench_state *st)
{
    char err[512];
    return bench_cuda_flush_l2(st->timer, err, sizeof err) != 0 ? cuda_tool_failed(err) : 0;
}

static int cuda_timer_start(bench_state *st)
{
    char err[512];
    return bench_cuda_timer_start(st->timer, err, sizeof err) != 0 ? cuda_tool_failed(err) : 0;
}

static int cuda_timer_stop(bench_state *st, double *sec)
{
    char err[512];
    double ms = NAN;
    if (bench_cuda_timer_stop(st->timer, &ms, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    *sec = 1e-3 * ms;
    return 0;
}

/*
 * The read floor of one token count: one kernel reading, once, as many bytes as the forward
 * must (the gate/up and down weights of the mean number of distinct experts hit, taken from
 * the weights themselves), timed like the runs (after an L2 flush, or warm). At small token
 * counts it is well below the 4 GiB read ceiling's rate: the launch and the ramp of one short
 * kernel are part of it, as they are of every forward.
 */
static int cuda_read_floor(const bench_state *st, const workload *w, double *ms)
{
    double unique = bench_mean_unique(st->o, w);
    /* bytes of a weight as stored: quantized codes (their scales add under 0.1%: left out) */
    const double wsz = st->o->quantized ? (st->o->qformat == MOEX_QUANT_FP4 ? 0.5 : 1.0) : (double)st->esize;
    double gu = unique * 2.0 * st->intermediate * st->hidden * wsz, dn = unique * st->hidden * st->intermediate * wsz;
    size_t gu_bytes = (size_t)gu & ~(size_t)15, dn_bytes = (size_t)dn & ~(size_t)15;
    char err[512];
    if (bench_cuda_read_floor(st->timer, bench_layer_weights(&st->layer, LAYER_GATE_UP), gu_bytes,
                              bench_layer_weights(&st->layer, LAYER_DOWN), dn_bytes, !st->o->warm, ms, err,
                              sizeof err))
        return cuda_tool_failed(err);
    return 0;
}

/* The GPU run's comment lines: its ceilings first (line 1), then machine and case. */
static void cuda_csv_comments(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    char host[256], date[32], gpu[96];
    bench_host_and_date(host, sizeof host, date, sizeof date);
    snprintf(gpu, sizeof gpu, "%s", st->gpu.name);
    for (char *p = gpu; *p; p++)
        if (*p == '"' || *p == ',')
            *p = ' ';
    fprintf(f, "# ceiling gemm_bf16_tflops=%.2f gemm_fp8_tflops=%.2f read_gbps=%.2f "
               "(gemm_frac = GFLOP/s over the bf16 GEMM, FP8 experts over the FP8 GEMM, bw_frac = GB/s over the read, floor_frac = "
               "read_floor_ms over ms)\n",
            st->gpu_bf16_tflops, st->gpu_fp8_tflops, st->gpu_read_gbps);
    fprintf(f, "# machine=%s date=%s moex=%s experts=%lld\n", host, date, moex_version(),
            (long long)st->experts);
    fprintf(f, "# gpu=\"%s\" device=cuda:%d cc=%d.%d host_cpu=\"%s\" shape=%s hidden=%lld "
               "intermediate=%lld num_experts=%lld top_k=%lld runs=%d warmup=%d seed=%llu "
               "ceilings_low=%d other_cpu_share=%.3f timing=%s\n",
            gpu, o->device.index, st->gpu.cc_major, st->gpu.cc_minor, st->cpu_model, o->shape->name,
            (long long)st->hidden, (long long)st->intermediate, (long long)o->shape->experts,
            (long long)st->top_k, o->runs, WARMUP_RUNS, (unsigned long long)o->seed,
            st->ceilings_low, st->other_share,
            o->warm ? "cuda_events_warm_l2_one_routing" : "cuda_events_after_l2_flush");
    for (int i = 0; i < o->nlimits; i++)
        fprintf(f, "# limit %s tokens<=%lld (rows above it: ms=nan)\n", o->limit_names[i],
                (long long)o->limit_tokens[i]);
}

static void cuda_release(bench_state *st)
{
    bench_cuda_timer_free(st->timer);
    st->timer = NULL;
}

const bench_runner bench_cuda_runner = {
    .resolve = cuda_resolve,
    .banner = cuda_banner,
    .ceilings = cuda_ceilings,
    .upload = 1,
    .contexts = cuda_contexts,
    .flush = cuda_flush,
    .timer_start = cuda_timer_start,
    .timer_stop = cuda_timer_stop,
    .rows_may_fail = 1,
    .read_floor = cuda_read_floor,
    .csv_comments = cuda_csv_comments,
    .release = cuda_release,
};
