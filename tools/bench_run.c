/*
 * bench_run.c — one pass of `moex bench`, the same for every device (see bench_run.h):
 *
 *   sizes -> the runner's checks -> banner, ceilings -> the layer built on the host (and, for
 *   a GPU run, uploaded) -> contexts -> per token count: every run's routing and inputs
 *   (uploaded for a GPU run), graph captures, interleaved timed forwards, errors against
 *   eager, the read floor, the rows -> the machine's load.
 *
 * The runner (tools/bench_cpu.c, tools/bench_cuda.c) supplies what a device does its own
 * way: its checks, banner and ceilings, its contexts, the cache flush and the clock.
 */
#include "bench_run.h"
#include "bench_fail.h"
#include "bench_host.h"
#include "bench_random.h"
#include "bench_table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Other processes' share of the CPU during the run above which timings are flagged. */
static const double BUSY_MACHINE_SHARE = 0.10;

static const moex_device HOST = {MOEX_DEVICE_CPU, 0};

/* ------------------------------------------------------------------ state */

int bench_nvariants(const bench_state *st)
{
    return st->o->nbackends * st->ngraph;
}

int bench_var_backend(const bench_state *st, int v)
{
    return v / st->ngraph;
}

int bench_var_graph(const bench_state *st, int v)
{
    return st->graph_first + v % st->ngraph;
}

void bench_state_release(bench_state *st)
{
    if (st->runner && st->runner->release)
        st->runner->release(st);
    for (int b = 0; b <= MAX_BACKENDS; b++) {
        moex_context_free(st->owned[b]);
        st->owned[b] = st->ctx[b] = NULL;
    }
    bench_layer_free(&st->layer);
}

void bench_state_free(bench_state *st)
{
    bench_state_release(st);
    free(st->results);
    memset(st, 0, sizeof *st);
}

int bench_check_backends(const bench_opts *o, moex_device device)
{
    for (int b = 0; b < o->nbackends; b++) {
        char why[256] = "";
        if (moex_backend_supports(o->backends[b], NULL, device, why, sizeof why) == MOEX_OK)
            continue;
        if (device.kind == MOEX_DEVICE_CPU)
            return bench_usage_error("--backends: \"%s\" cannot run on the cpu: %s", o->backends[b],
                                     *why ? why : moex_last_error());
        return bench_usage_error("--backends: \"%s\" cannot run on cuda:%d: %s", o->backends[b], device.index,
                                 *why ? why : moex_last_error());
    }
    return 0;
}

int bench_resolve_sizes(const bench_opts *o, bench_state *st)
{
    moex_status s = moex_device_query(HOST, &st->cpu);
    if (s != MOEX_OK)
        return bench_moex_failed("moex_device_query(cpu)", s);
    bench_read_cpu_model(&st->cpu, st->cpu_model, sizeof st->cpu_model);
    st->threads = o->threads ? o->threads : (st->cpu.cpu_cores > 0 ? st->cpu.cpu_cores : 1);
    st->hidden = o->shape->hidden;
    st->intermediate = o->shape->intermediate;
    st->experts = o->shape->experts;
    if (o->max_experts && o->max_experts < st->experts)
        st->experts = o->max_experts;
    st->top_k = o->shape->top_k < st->experts ? o->shape->top_k : st->experts;
    st->esize = moex_dtype_size(o->dtype);
    double H = (double)st->hidden, I = (double)st->intermediate;
    st->bytes_per_expert = (3.0 * H * I + (o->shape->gptoss ? 2.0 * I + H : 0.0)) * st->esize;
    if (o->quantized) { /* codes and scales; biases stay bf16 */
        const int fp4 = o->qformat == MOEX_QUANT_FP4;
        const double blocks = fp4 ? 3.0 * H * I / 32 : (ceil(2 * I / 128) * ceil(H / 128) + ceil(H / 128) * ceil(I / 128));
        st->bytes_per_expert = 3.0 * H * I * (fp4 ? 0.5 : 1.0) + blocks * (o->qformat == MOEX_QUANT_FP8 ? 4.0 : 1.0) +
                               (o->shape->gptoss ? 2.0 * I + H : 0.0) * st->esize;
    }
    st->flops_per_pair = 6.0 * H * I; /* every named shape is gated */
    st->eager_index = -1;
    for (int b = 0; b < o->nbackends; b++)
        if (strcmp(o->backends[b], "eager") == 0)
            st->eager_index = b;
    st->gemm_gflops = st->read_gbps = st->other_share = NAN;
    return 0;
}

double bench_workload_bytes(const bench_state *st, int64_t T)
{
    const bench_opts *o = st->o;
    double runs = o->runs + WARMUP_RUNS, th = (double)T * (double)st->hidden;
    double tk = (double)T * (double)st->top_k;
    return runs * (th * st->esize + tk * (4.0 + st->esize)) + (bench_nvariants(st) + 1) * th * st->esize +
           2.0 * th * 4.0 + (double)T * (double)st->experts * 4.0;
}

/* ------------------------------------------------------------------ the layer */

/* The layer on the host, uploaded when the runner runs elsewhere; the moex layer over it. */
static int build_layer(bench_state *st)
{
    const bench_opts *o = st->o;
    /* gpt-oss's float weights in the layout its model runs in on this device: as stored on the
     * CPU, transposed to [E, out, in] at upload on a GPU */
    const int on_gpu = st->runner->upload;
    bench_layer_spec spec = {st->experts, st->hidden, st->intermediate, st->top_k, o->dtype,
                             o->quantized, o->qformat, o->shape->gptoss, !on_gpu, o->seed, st->threads};
    fprintf(stderr, "moex bench: generating %lld experts of random %s weights (%.0f MiB) ...\n",
            (long long)st->experts, bench_weight_label(o), st->experts * st->bytes_per_expert / 1048576.0);
    if (bench_layer_build(&spec, &st->layer))
        return EXIT_RUNTIME;
    if (st->runner->upload) {
        fprintf(stderr, "moex bench: copying the weights to cuda:%d ...\n", o->device.index);
        if (bench_layer_upload(&st->layer, o->device))
            return EXIT_RUNTIME;
    }
    return bench_layer_create(&st->layer) ? EXIT_RUNTIME : 0;
}

/* ------------------------------------------------------------------ inputs */

static void workload_free(workload *w)
{
    free(w->hidden);
    free(w->ids);
    free(w->weights);
    free(w->unique);
    free(w->outs);
    free(w->cmp_a);
    free(w->cmp_b);
    free(w->times);
    for (int b = 0; b < MAX_BACKENDS; b++)
        moex_graph_free(w->graphs[b]);
    if (w->device.kind != MOEX_DEVICE_CPU) {
        moex_device_free(w->device, w->run_hidden);
        moex_device_free(w->device, w->run_ids);
        moex_device_free(w->device, w->run_weights);
        moex_device_free(w->device, w->run_outs);
        moex_device_free(w->device, w->graph_x);
        moex_device_free(w->device, w->graph_ids);
        moex_device_free(w->device, w->graph_w);
    }
    memset(w, 0, sizeof *w);
}

/* Views of T tokens over hidden states x, ids, weights and an output, all on `device`. */
static int tensor_views(const bench_state *st, int64_t T, moex_device device, void *px, void *pi, void *pw,
                        void *po, moex_tensor *x, moex_tensor *ids, moex_tensor *wt, moex_tensor *out)
{
    int64_t th[2] = {T, st->hidden}, tk[2] = {T, st->top_k};
    moex_dtype dt = st->o->dtype;
    moex_status s;
    if ((s = moex_tensor_init(x, px, dt, 2, th)) != MOEX_OK || (s = moex_tensor_init(ids, pi, MOEX_I32, 2, tk)) != MOEX_OK ||
        (s = moex_tensor_init(wt, pw, dt, 2, tk)) != MOEX_OK || (s = moex_tensor_init(out, po, dt, 2, th)) != MOEX_OK)
        return bench_moex_failed("moex_tensor_init", s);
    x->device = ids->device = wt->device = out->device = device;
    return 0;
}

/* Byte offsets of run r's hidden states, ids and weights, and of output slot `slot`. */
static size_t hidden_at(const bench_state *st, const workload *w, int r)
{
    return (size_t)r * (size_t)(w->tokens * st->hidden) * st->esize;
}

static size_t ids_at(const bench_state *st, const workload *w, int r)
{
    return (size_t)r * (size_t)(w->tokens * st->top_k) * 4;
}

static size_t weights_at(const bench_state *st, const workload *w, int r)
{
    return (size_t)r * (size_t)(w->tokens * st->top_k) * st->esize;
}

/* Views where the forwards read run r's inputs (r < 0: the graph inputs) and write slot `slot`. */
static int run_views(const bench_state *st, const workload *w, int r, int slot, moex_tensor *x, moex_tensor *ids,
                     moex_tensor *wt, moex_tensor *out)
{
    void *px = r < 0 ? w->graph_x : (char *)w->run_hidden + hidden_at(st, w, r);
    void *pi = r < 0 ? w->graph_ids : (char *)w->run_ids + ids_at(st, w, r);
    void *pw = r < 0 ? w->graph_w : (char *)w->run_weights + weights_at(st, w, r);
    return tensor_views(st, w->tokens, w->device, px, pi, pw, (char *)w->run_outs + hidden_at(st, w, slot), x, ids,
                        wt, out);
}

/* --skew: each expert's popularity, N(0,1) from its own stream of the seed (the same for every
 * routing, token count and backend), times skew, added to every token's logit of that expert. */
static int skew_logits(const bench_state *st, float *logits, int64_t T)
{
    const int64_t E = st->experts;
    float *pop = NULL;
    if (bench_alloc((void **)&pop, (double)E * 4.0, "routings"))
        return EXIT_RUNTIME;
    bench_fill_normal_f32(pop, (size_t)E, st->o->skew, bench_stream_seed(st->o->seed, 7, 0, 0));
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++)
            logits[t * E + e] += pop[e];
    free(pop);
    return 0;
}

int bench_route(const bench_state *st, int64_t T, int r, int32_t *ids_out, void *weights_out, float *logits)
{
    int64_t E = st->experts, k = st->top_k;
    bench_fill_normal_f32(logits, (size_t)(T * E), 1.0f, bench_stream_seed(st->o->seed, 5, (uint64_t)T, (uint64_t)r));
    if (st->o->skew > 0.0f && skew_logits(st, logits, T))
        return EXIT_RUNTIME;
    moex_router_desc rd;
    moex_status s = moex_router_desc_init(&rd);
    if (s != MOEX_OK)
        return bench_moex_failed("moex_router_desc_init", s);
    rd.kind = MOEX_ROUTER_SOFTMAX_TOPK;
    rd.num_experts = E;
    rd.top_k = k;
    rd.renormalize = 1;
    moex_tensor lt, ids, wt;
    int64_t te[2] = {T, E}, tk[2] = {T, k};
    if ((s = moex_tensor_init(&lt, logits, MOEX_F32, 2, te)) != MOEX_OK ||
        (s = moex_tensor_init(&ids, ids_out, MOEX_I32, 2, tk)) != MOEX_OK ||
        (s = moex_tensor_init(&wt, weights_out, st->o->dtype, 2, tk)) != MOEX_OK)
        return bench_moex_failed("moex_tensor_init", s);
    if ((s = moex_route(&rd, &lt, &ids, &wt)) != MOEX_OK)
        return bench_moex_failed("moex_route", s);
    return 0;
}

/* Routing r of the workload (bench_route) and the experts it hits. */
static int make_routing(const bench_state *st, workload *w, int r, float *logits, char *seen)
{
    int64_t T = w->tokens, E = st->experts, k = st->top_k;
    int32_t *id = w->ids + (size_t)r * T * k;
    int rc = bench_route(st, T, r, id, (char *)w->weights + weights_at(st, w, r), logits);
    if (rc)
        return rc;
    memset(seen, 0, (size_t)E);
    int unique = 0;
    for (int64_t i = 0; i < T * k; i++) {
        if (id[i] >= 0 && id[i] < E && !seen[id[i]]) {
            seen[id[i]] = 1;
            unique++;
        }
    }
    w->unique[r] = unique;
    return 0;
}

/* Allocate and fill, on the host, the inputs of every run of T tokens. */
static int make_workload(const bench_state *st, int64_t T, workload *w)
{
    const bench_opts *o = st->o;
    double th = (double)T * st->hidden, tk = (double)T * st->top_k;
    int rc;
    memset(w, 0, sizeof *w);
    w->tokens = T;
    w->count = o->runs + WARMUP_RUNS;
    w->device = HOST;
    float *logits = NULL;
    char *seen = NULL;
    if ((rc = bench_alloc(&w->hidden, w->count * th * st->esize, "hidden states")) ||
        (rc = bench_alloc((void **)&w->ids, w->count * tk * 4.0, "routings")) ||
        (rc = bench_alloc(&w->weights, w->count * tk * st->esize, "routings")) ||
        (rc = bench_alloc((void **)&w->unique, w->count * 8.0, "routings")) ||
        (rc = bench_alloc(&w->outs, (bench_nvariants(st) + 1) * th * st->esize, "outputs")) ||
        (rc = bench_alloc((void **)&w->cmp_a, th * 4.0, "outputs")) ||
        (rc = bench_alloc((void **)&w->cmp_b, th * 4.0, "outputs")) ||
        (rc = bench_alloc((void **)&w->times, (double)bench_nvariants(st) * o->runs * 8.0, "times")) ||
        (rc = bench_alloc((void **)&logits, (double)T * st->experts * 4.0, "logits")) ||
        (rc = bench_alloc((void **)&seen, (double)st->experts, "routings")))
        goto done;
    rc = bench_fill_normal(w->hidden, o->dtype, (size_t)(w->count * th), 1.0f,
                           bench_stream_seed(o->seed, 6, (uint64_t)T, 0), st->threads);
    for (int r = 0; !rc && r < w->count; r++)
        rc = make_routing(st, w, r, logits, seen);
done:
    free(logits);
    free(seen);
    w->run_hidden = w->hidden;
    w->run_ids = w->ids;
    w->run_weights = w->weights;
    w->run_outs = w->outs;
    return rc;
}

/* New memory of `bytes` on o->device, with a copy of src when it is not NULL. */
static int to_device(const bench_state *st, void **dst, const void *src, double bytes, const char *what)
{
    moex_status s = moex_device_alloc(st->o->device, (size_t)bytes, dst);
    if (s != MOEX_OK)
        return bench_moex_failed(what, s);
    if (src && bytes > 0 && (s = moex_memcpy(*dst, st->o->device, src, HOST, (size_t)bytes)) != MOEX_OK)
        return bench_moex_failed(what, s);
    return 0;
}

/* The upload hook of the inputs: every run's inputs copied once; outputs and graph inputs there. */
static int upload_workload(const bench_state *st, workload *w)
{
    double th = (double)w->tokens * st->hidden * st->esize, tk = (double)w->tokens * st->top_k;
    w->device = st->o->device;
    w->run_hidden = w->run_ids = w->run_weights = w->run_outs = NULL;
    int rc;
    if ((rc = to_device(st, &w->run_hidden, w->hidden, w->count * th, "upload of hidden states")) ||
        (rc = to_device(st, &w->run_ids, w->ids, w->count * tk * 4.0, "upload of routings")) ||
        (rc = to_device(st, &w->run_weights, w->weights, w->count * tk * st->esize, "upload of routings")) ||
        (rc = to_device(st, &w->run_outs, NULL, (bench_nvariants(st) + 1) * th, "outputs on the GPU")) ||
        (rc = to_device(st, &w->graph_x, NULL, th, "graph inputs")) ||
        (rc = to_device(st, &w->graph_ids, NULL, tk * 4.0, "graph inputs")) ||
        (rc = to_device(st, &w->graph_w, NULL, tk * st->esize, "graph inputs")))
        return rc;
    return 0;
}

/* ------------------------------------------------------------------ variants */

static const char *variant_name(const bench_state *st, int v, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s", st->o->backends[bench_var_backend(st, v)], bench_var_graph(st, v) ? " (graph)" : "");
    return buf;
}

/* Capture one forward of variant v's backend on the graph inputs; on failure the variant is not run. */
static void capture_graph(const bench_state *st, workload *w, int v)
{
    const bench_opts *o = st->o;
    int b = bench_var_backend(st, v);
    moex_context *ctx = st->ctx[b];
    moex_tensor x, ids, wt, out;
    if (run_views(st, w, -1, v, &x, &ids, &wt, &out)) {
        w->state[v] = CASE_FAILED;
        return;
    }
    moex_status s = moex_graph_begin(ctx);
    moex_status f = MOEX_OK, e = MOEX_OK;
    char msg[512] = "";
    if (s == MOEX_OK) {
        f = moex_experts_forward(ctx, st->layer.layer, o->backends[b], &x, &ids, &wt, &out);
        if (f != MOEX_OK)
            snprintf(msg, sizeof msg, "%s", moex_last_error());
        e = moex_graph_end(ctx, &w->graphs[b]); /* ends (or abandons) the capture */
        if (f == MOEX_OK && e != MOEX_OK)
            snprintf(msg, sizeof msg, "%s", moex_last_error());
    } else {
        snprintf(msg, sizeof msg, "%s", moex_last_error());
    }
    if (s != MOEX_OK || f != MOEX_OK || e != MOEX_OK || !w->graphs[b]) {
        if (!*msg)
            snprintf(msg, sizeof msg, "%s", moex_status_str(s != MOEX_OK ? s : f != MOEX_OK ? f : e));
        fprintf(stderr, "moex bench: %s at T=%lld could not be captured in a CUDA graph: %s\n", o->backends[b],
                (long long)w->tokens, msg);
        moex_graph_free(w->graphs[b]);
        w->graphs[b] = NULL;
        w->state[v] = CASE_NOT_CAPTURED;
        (void)moex_context_synchronize(ctx); /* clear what the failed capture left */
    }
}

static double wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Backend b's first forward at this T (routing 0, into output slot v), synchronised, timed by the
 * wall clock: what a first use costs (deepgemm compiles its kernels for a shape then), apart from
 * the timed runs. A failure marks the backend's variants failed. */
static void first_forward(const bench_state *st, workload *w, int b, int v)
{
    moex_context *ctx = st->ctx[b];
    moex_tensor x, ids, wt, out;
    if (run_views(st, w, 0, v, &x, &ids, &wt, &out))
        return;
    const double t0 = wall_ms();
    moex_status s = moex_experts_forward(ctx, st->layer.layer, st->o->backends[b], &x, &ids, &wt, &out);
    moex_status sync = moex_context_synchronize(ctx);
    w->first_ms[b] = wall_ms() - t0;
    if (s == MOEX_OK && sync == MOEX_OK)
        return;
    fprintf(stderr, "moex bench: %s at T=%lld: the first forward failed: %s\n", st->o->backends[b],
            (long long)w->tokens, moex_last_error());
    w->first_ms[b] = NAN;
    for (int u = 0; u < bench_nvariants(st); u++)
        if (bench_var_backend(st, u) == b)
            w->state[u] = CASE_FAILED;
}

/* Which variants run at this T; each backend's first forward; one forward per backend captured
 * for the graph variants. */
static void plan_variants(const bench_state *st, workload *w)
{
    const bench_opts *o = st->o;
    int nv = bench_nvariants(st);
    for (int b = 0; b < MAX_BACKENDS; b++)
        w->first_ms[b] = NAN;
    for (int v = 0; v < nv; v++) {
        int b = bench_var_backend(st, v);
        if (w->tokens > bench_backend_limit(o, o->backends[b]))
            w->state[v] = CASE_OVER_LIMIT;
        else if (st->prepare_failed[b] || !st->ctx[b])
            w->state[v] = CASE_FAILED;
        else
            w->state[v] = CASE_RAN;
    }
    for (int v = 0; v < nv; v++) {
        int b = bench_var_backend(st, v);
        if (w->state[v] == CASE_RAN && isnan(w->first_ms[b]))
            first_forward(st, w, b, v);
    }
    for (int v = 0; v < nv; v++)
        if (w->state[v] == CASE_RAN && bench_var_graph(st, v))
            capture_graph(st, w, v);
}

/* Copy run r's inputs into the buffers the graphs read. */
static int stage_graph_inputs(const bench_state *st, workload *w, int r)
{
    moex_device d = w->device;
    size_t th = (size_t)(w->tokens * st->hidden) * st->esize, tk = (size_t)(w->tokens * st->top_k);
    moex_status s;
    if ((s = moex_memcpy(w->graph_x, d, (char *)w->run_hidden + hidden_at(st, w, r), d, th)) != MOEX_OK ||
        (s = moex_memcpy(w->graph_ids, d, (char *)w->run_ids + ids_at(st, w, r), d, tk * 4)) != MOEX_OK ||
        (s = moex_memcpy(w->graph_w, d, (char *)w->run_weights + weights_at(st, w, r), d, tk * st->esize)) != MOEX_OK)
        return bench_moex_failed("moex_memcpy (graph inputs)", s);
    return 0;
}

/* ------------------------------------------------------------------ timed runs */

/*
 * One timed forward of variant v on run r into output slot `slot`: (graph inputs staged,)
 * caches flushed (--cache warm: the stream idle instead), the clock started, the forward or
 * graph replay, the clock stopped. A moex failure ends the bench, or, when the runner's rows
 * may fail, marks the variant failed (its rows stay empty) and the bench goes on.
 */
static int forward(bench_state *st, workload *w, int v, int r, int slot, double *sec)
{
    const bench_opts *o = st->o;
    const bench_runner *run = st->runner;
    int b = bench_var_backend(st, v), g = bench_var_graph(st, v), rc;
    moex_context *ctx = st->ctx[b];
    moex_tensor x, ids, wt, out;
    if (g && stage_graph_inputs(st, w, r))
        return EXIT_RUNTIME;
    if (!g && run_views(st, w, r, slot, &x, &ids, &wt, &out))
        return EXIT_RUNTIME;
    if (o->warm) { /* no flush; the stream idle all the same (graph inputs are copied on it) */
        moex_status idle = moex_context_synchronize(ctx);
        if (idle != MOEX_OK)
            return bench_moex_failed("moex_context_synchronize (before the timed forward)", idle);
    } else if ((rc = run->flush(st))) {
        return rc;
    }
    if ((rc = run->timer_start(st)))
        return rc;
    moex_status s = g ? moex_graph_launch(w->graphs[b], ctx)
                      : moex_experts_forward(ctx, st->layer.layer, o->backends[b], &x, &ids, &wt, &out);
    if ((rc = run->timer_stop(st, sec)))
        return rc;
    moex_status sync = moex_context_synchronize(ctx);
    if (s == MOEX_OK && sync == MOEX_OK)
        return 0;
    char name[NAME_LEN + 64];
    if (!run->rows_may_fail) {
        snprintf(name, sizeof name, "forward of %s at T=%lld", o->backends[b], (long long)w->tokens);
        return bench_moex_failed(name, s != MOEX_OK ? s : sync);
    }
    fprintf(stderr, "moex bench: %s at T=%lld failed: %s\n", variant_name(st, v, name, sizeof name),
            (long long)w->tokens, moex_last_error());
    w->state[v] = CASE_FAILED;
    *sec = NAN;
    return 0;
}

/* The routing (and inputs) that run r uses: its own, or under --cache warm the first timed one. */
static int timed_routing(const bench_opts *o, int r)
{
    return o->warm ? WARMUP_RUNS : r;
}

/* Eager on routing WARMUP_RUNS into output slot `slot`, untimed. *ran = 1 if it did. */
static int reference_forward(const bench_state *st, workload *w, int slot, int *ran)
{
    moex_context *ctx = st->ctx[MAX_BACKENDS];
    moex_tensor x, ids, wt, out;
    *ran = 0;
    if (run_views(st, w, WARMUP_RUNS, slot, &x, &ids, &wt, &out))
        return EXIT_RUNTIME;
    moex_status s = moex_experts_forward(ctx, st->layer.layer, "eager", &x, &ids, &wt, &out);
    if (s == MOEX_OK)
        s = moex_context_synchronize(ctx);
    if (s == MOEX_OK) {
        *ran = 1;
        return 0;
    }
    if (!st->runner->rows_may_fail) {
        char what[64];
        snprintf(what, sizeof what, "forward of eager at T=%lld", (long long)w->tokens);
        return bench_moex_failed(what, s);
    }
    fprintf(stderr, "moex bench: eager (reference) at T=%lld failed: %s\n", (long long)w->tokens, moex_last_error());
    return 0;
}

/* max |out[slot] - out[ref]| over T x H (host copies), NaN if either has a NaN. */
static int max_abs_diff(const bench_state *st, workload *w, int slot, int ref, double *err)
{
    size_t n = (size_t)(w->tokens * st->hidden);
    moex_status s;
    if ((s = moex_convert((char *)w->outs + hidden_at(st, w, slot), st->o->dtype, w->cmp_a, MOEX_F32, n)) != MOEX_OK ||
        (s = moex_convert((char *)w->outs + hidden_at(st, w, ref), st->o->dtype, w->cmp_b, MOEX_F32, n)) != MOEX_OK)
        return bench_moex_failed("moex_convert", s);
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)w->cmp_a[i] - (double)w->cmp_b[i]);
        if (isnan(d)) {
            m = NAN;
            break;
        }
        m = d > m ? d : m;
    }
    *err = m;
    return 0;
}

/* Errors of every variant against eager on routing WARMUP_RUNS (eager timed, or run once here). */
static int case_errors(const bench_state *st, workload *w, case_result *row)
{
    const bench_opts *o = st->o;
    int nv = bench_nvariants(st), ref = -1, rc;
    size_t ts = (size_t)(w->tokens * st->hidden) * st->esize;
    for (int v = 0; v < nv && ref < 0; v++) /* eager, graph off if it ran */
        if (bench_var_backend(st, v) == st->eager_index && w->state[v] == CASE_RAN)
            ref = v;
    if (ref < 0 && st->eager_index < 0 && st->ctx[MAX_BACKENDS] && w->tokens <= bench_backend_limit(o, "eager")) {
        int ran = 0; /* eager is not timed: run it once, into the spare slot */
        if ((rc = reference_forward(st, w, nv, &ran)))
            return rc;
        if (ran)
            ref = nv;
    }
    for (int v = 0; w->run_outs != w->outs && v <= nv; v++) { /* the outputs to the host */
        if ((v < nv && w->state[v] != CASE_RAN) || (v == nv && ref != nv))
            continue;
        moex_status s = moex_memcpy((char *)w->outs + (size_t)v * ts, HOST, (char *)w->run_outs + (size_t)v * ts,
                                    w->device, ts);
        if (s != MOEX_OK)
            return bench_moex_failed("moex_memcpy (outputs to the host)", s);
    }
    for (int v = 0; v < nv; v++) {
        row[v].max_abs_err = NAN;
        if (ref >= 0 && w->state[v] == CASE_RAN && max_abs_diff(st, w, v, ref, &row[v].max_abs_err))
            return EXIT_RUNTIME;
    }
    return 0;
}

/*
 * Interleaved runs: run r times every variant on routing r, the first one rotating with r so
 * that no backend always follows another's use of the same experts. The caches are flushed
 * before every forward (--cache warm: not flushed, and every run takes the routing of run
 * WARMUP_RUNS). Errors are taken on the first timed run.
 */
static int time_cases(bench_state *st, int ti, workload *w)
{
    const bench_opts *o = st->o;
    int nv = bench_nvariants(st);
    char name[NAME_LEN + 16];
    for (int r = 0; r < w->count; r++) {
        for (int j = 0; j < nv; j++) {
            int v = (r + j) % nv;
            double sec;
            if (w->state[v] != CASE_RAN)
                continue;
            if (r == 0)
                fprintf(stderr, "[%d/%d] %s T=%lld %s ...\n", ti * nv + v + 1, o->ntokens * nv, o->shape->name,
                        (long long)o->tokens[ti], variant_name(st, v, name, sizeof name));
            if (forward(st, w, v, timed_routing(o, r), v, &sec))
                return EXIT_RUNTIME;
            if (r >= WARMUP_RUNS && w->state[v] == CASE_RAN)
                w->times[v * o->runs + (r - WARMUP_RUNS)] = sec;
        }
        if (r == WARMUP_RUNS && case_errors(st, w, &st->results[ti * nv]))
            return EXIT_RUNTIME;
    }
    return 0;
}

double bench_mean_unique(const bench_opts *o, const workload *w)
{
    double unique = 0.0;
    for (int r = WARMUP_RUNS; r < w->count; r++)
        unique += w->unique[timed_routing(o, r)];
    return unique / o->runs;
}

/* Variant v's row from its times (its error is already there); NaN when it did not run. */
static void finish_row(const bench_state *st, const workload *w, int v, double floor_ms, case_result *row)
{
    const bench_opts *o = st->o;
    row->state = w->state[v];
    row->first_ms = w->first_ms[bench_var_backend(st, v)];
    const moex_context *ctx = st->ctx[bench_var_backend(st, v)];
    row->workspace_mib = ctx ? (double)moex_context_workspace_bytes(ctx) / (1024.0 * 1024.0) : NAN;
    if (w->state[v] != CASE_RAN) {
        row->ms = row->gflops = row->weight_gbps = row->max_abs_err = NAN;
        row->gemm_frac = row->bw_frac = row->read_floor_ms = row->floor_frac = NAN;
        return;
    }
    double sec = bench_median(&w->times[v * o->runs], o->runs);
    row->ms = 1e3 * sec;
    row->gflops = (double)w->tokens * st->top_k * st->flops_per_pair / sec / 1e9;
    row->weight_gbps = bench_mean_unique(o, w) * st->bytes_per_expert / sec / 1e9;
    row->gemm_frac = row->gflops / st->gemm_gflops; /* NaN without ceilings */
    row->bw_frac = row->weight_gbps / st->read_gbps;
    row->read_floor_ms = floor_ms;
    row->floor_frac = floor_ms / row->ms;
}

/* Everything for one token count: inputs, timed runs, the read floor, rows. */
static int run_tokens(bench_state *st, int ti)
{
    const bench_opts *o = st->o;
    int nv = bench_nvariants(st);
    workload w;
    double floor_ms = NAN;
    int rc = make_workload(st, o->tokens[ti], &w);
    if (!rc && st->runner->upload)
        rc = upload_workload(st, &w);
    if (!rc) {
        plan_variants(st, &w);
        rc = time_cases(st, ti, &w);
    }
    if (!rc && st->runner->read_floor)
        rc = st->runner->read_floor(st, &w, &floor_ms);
    for (int v = 0; !rc && v < nv; v++) {
        case_result *row = &st->results[ti * nv + v];
        finish_row(st, &w, v, floor_ms, row);
        bench_print_row(st, o->tokens[ti], v, row);
        rc = bench_stdout_failed();
    }
    workload_free(&w);
    return rc;
}

/* ------------------------------------------------------------------ the pass */

/* After the table: how much of the CPU other processes took while we measured. */
static void report_machine_load(bench_state *st, cpu_sample start)
{
    st->other_share = bench_other_cpu_share(start, bench_sample_cpu());
    if (!isfinite(st->other_share))
        return;
    printf("\nother processes used %.0f%% of the machine's CPU time during this run\n", 100.0 * st->other_share);
    fflush(stdout);
    if (st->other_share > BUSY_MACHINE_SHARE) {
        const char *w = "WARNING: the machine was busy with other work: timings and ceilings "
                        "are unreliable; compare only rows of this run, or rerun on a quiet "
                        "machine.\n";
        printf("%s", w);
        fprintf(stderr, "moex bench: %s", w);
    }
}

int bench_run(bench_state *st)
{
    const bench_opts *o = st->o;
    const bench_runner *run = st->runner;
    int rc, n = o->ntokens * bench_nvariants(st);
    cpu_sample start = bench_sample_cpu();
    run->banner(st);
    if (o->skew > 0.0f)
        printf("routing: uneven, --skew %g (each expert's logits + %g x its popularity)\n", (double)o->skew,
               (double)o->skew);
    if ((rc = bench_stdout_failed()) || (rc = run->ceilings(st)) || (rc = bench_stdout_failed()) ||
        (rc = build_layer(st)) || (rc = run->contexts(st)))
        return rc;
    if (bench_alloc((void **)&st->results, (double)n * sizeof(case_result), "results"))
        return EXIT_RUNTIME;
    for (int i = 0; i < n; i++)
        st->results[i] = (case_result){.ms = NAN, .gflops = NAN, .weight_gbps = NAN, .max_abs_err = NAN,
                                       .gemm_frac = NAN, .bw_frac = NAN, .read_floor_ms = NAN, .floor_frac = NAN,
                                       .first_ms = NAN, .workspace_mib = NAN, .state = CASE_RAN};
    bench_print_table_header(st);
    for (int ti = 0; ti < o->ntokens && !rc; ti++)
        rc = run_tokens(st, ti);
    if (rc)
        return rc;
    report_machine_load(st, start);
    return bench_stdout_failed(); /* the outputs are written once every --dtype pass has run */
}
