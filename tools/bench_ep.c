/*
 * bench_ep.c — `moex bench --ep N` (see bench_ep.h): each backend's experts layer as an
 * expert-parallel group of N ranks, beside the same layer on one device, in the same run.
 *
 * Flow: sizes -> the layer built on the host -> each rank's share of the experts (views of the
 * host layer on the CPU; on a GPU copied to the rank's GPU) and the whole layer on the first
 * device -> per backend, a group of N contexts (moex_ep_local_groups: rank r on its device, its
 * own stream slot) and the one-device context of its twin (deepgemm_megamoe's is grouped_mm) ->
 * on GPUs, the copy rate from rank 0's GPU to each other rank's -> per token count: every run's
 * inputs on the host (the tokens divided among the ranks in order: rank r takes [r T / N,
 * (r + 1) T / N)), copied to each device the ranks use; then per run, backend after backend:
 * the group's forward (each rank's moex_experts_forward and moex_context_synchronize on its
 * thread; the wall clock from releasing the ranks to the last one's return) and the one-device
 * forward (its forward and synchronisation, the same clock) -> a row per (token count, backend):
 * the medians, one-device ms over group ms, and the NMSE of the group's output against the
 * one-device output of the last run.
 *
 * Both sides are timed by the host's clock around queueing and synchronising, without a cache
 * flush (an L2 holds a few MB of weights that are GB at these shapes), so what is compared is
 * the time a caller waits for one forward of the layer.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_ep.h"
#include "bench_fail.h"
#include "bench_host.h"
#include "bench_output.h"
#include "bench_random.h"
#include "bench_run.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const moex_device HOST = {MOEX_DEVICE_CPU, 0};
enum { MAX_DEVS = 16 }; /* distinct devices the ranks use */

/* One rank: its device, share and contexts, and the job its thread runs. */
typedef struct ep_rank {
    struct ep_bench *eb;
    int dev_slot;               /* its device in eb->devs */
    moex_device dev;
    moex_experts_desc share;
    void *copy[LAYER_TENSORS];  /* the share's weights on a GPU (NULL on the CPU) */
    moex_layer *layer;
    moex_ep_group *group[MAX_BACKENDS];
    moex_context *ctx[MAX_BACKENDS];
    int64_t t0, T;              /* its tokens of the current count */
    moex_status st;             /* its last forward's */
    char msg[512];
} ep_rank;

/* A device the ranks (or the one-device side: devs[0]) use, and the current token count's
 * inputs there: every run's [T, H], [T, k] i32 and [T, k], one after the other; the group's and
 * the one-device output [T, H]. */
typedef struct ep_dev {
    moex_device dev;
    void *x, *ids, *w, *out_ep, *out_one;
} ep_dev;

typedef struct ep_row {
    double ep_ms, one_ms, nmse;
} ep_row;

typedef struct ep_bench {
    const bench_opts *o;
    bench_state st; /* sizes, the host's facts, the layer (on the host, or whole on devs[0]) */
    int R, ndevs, cuda;
    ep_rank rank[MAX_EP_RANKS];
    ep_dev devs[MAX_DEVS];
    const char *twin[MAX_BACKENDS];     /* the backend of the one-device side */
    moex_context *one[MAX_BACKENDS];
    double copy_gbps[MAX_EP_RANKS];     /* GPUs: rank 0's GPU to rank r's (NaN: not measured) */
    ep_row *rows;                       /* [ntokens][nbackends] */
    /* the current job: every rank runs backend b on run `run` of T tokens */
    int64_t T;
    int b, run;
    /* the ranks' threads */
    pthread_t th[MAX_EP_RANKS];
    int nthreads, quit, barriers;
    pthread_barrier_t start, end;
} ep_bench;

/* ------------------------------------------------------------------ views */

/* Views of `rows` tokens from row `row` of a device's arrays (out: from row out_row of out). */
static moex_status views(const ep_bench *eb, const ep_dev *d, int64_t row, int64_t rows, void *out_base,
                         int64_t out_row, moex_tensor *x, moex_tensor *ids, moex_tensor *w, moex_tensor *out)
{
    const size_t esz = eb->st.esize;
    const int64_t H = eb->st.hidden, k = eb->st.top_k, th[2] = {rows, H}, tk[2] = {rows, k};
    moex_status s = moex_tensor_init(x, (char *)d->x + (size_t)(row * H) * esz, eb->o->dtype, 2, th);
    if (!s)
        s = moex_tensor_init(ids, (char *)d->ids + (size_t)(row * k) * 4, MOEX_I32, 2, tk);
    if (!s)
        s = moex_tensor_init(w, (char *)d->w + (size_t)(row * k) * esz, eb->o->dtype, 2, tk);
    if (!s)
        s = moex_tensor_init(out, (char *)out_base + (size_t)(out_row * H) * esz, eb->o->dtype, 2, th);
    x->device = ids->device = w->device = out->device = d->dev;
    return s;
}

/* ------------------------------------------------------------------ the ranks' threads */

static void *rank_thread(void *arg)
{
    ep_rank *rk = arg;
    ep_bench *eb = rk->eb;
    for (;;) {
        pthread_barrier_wait(&eb->start);
        if (eb->quit)
            return NULL;
        const ep_dev *d = &eb->devs[rk->dev_slot];
        moex_tensor x, ids, w, out;
        moex_status s = views(eb, d, eb->run * eb->T + rk->t0, rk->T, d->out_ep, rk->t0, &x, &ids, &w, &out);
        if (!s)
            s = moex_experts_forward(rk->ctx[eb->b], rk->layer, eb->o->backends[eb->b], &x, &ids, &w, &out);
        const moex_status sync = moex_context_synchronize(rk->ctx[eb->b]);
        rk->st = s ? s : sync;
        snprintf(rk->msg, sizeof rk->msg, "%s", rk->st ? moex_last_error() : "");
        pthread_barrier_wait(&eb->end);
    }
}

static int start_threads(ep_bench *eb)
{
    if (pthread_barrier_init(&eb->start, NULL, (unsigned)eb->R + 1) ||
        pthread_barrier_init(&eb->end, NULL, (unsigned)eb->R + 1)) {
        fprintf(stderr, "moex bench: could not make the ranks' barriers\n");
        return EXIT_RUNTIME;
    }
    eb->barriers = 1;
    for (int r = 0; r < eb->R; r++) {
        if (pthread_create(&eb->th[r], NULL, rank_thread, &eb->rank[r])) {
            fprintf(stderr, "moex bench: could not start rank %d's thread\n", r);
            return EXIT_RUNTIME;
        }
        eb->nthreads++;
    }
    return 0;
}

/* Every rank's forward of backend b, run `run`: the wall-clock seconds; 0, or an exit code after
 * naming the first rank that failed. */
static int group_forward(ep_bench *eb, int b, int run, double *sec)
{
    eb->b = b, eb->run = run;
    const double t0 = bench_now_s();
    pthread_barrier_wait(&eb->start);
    pthread_barrier_wait(&eb->end);
    *sec = bench_now_s() - t0;
    for (int r = 0; r < eb->R; r++)
        if (eb->rank[r].st) {
            fprintf(stderr, "moex bench: %s, rank %d of %d at T=%lld: %s\n", eb->o->backends[b], r, eb->R,
                    (long long)eb->T, eb->rank[r].msg);
            return EXIT_RUNTIME;
        }
    return 0;
}

static int one_forward(ep_bench *eb, int b, int run, double *sec)
{
    const ep_dev *d = &eb->devs[0];
    moex_tensor x, ids, w, out;
    moex_status s = views(eb, d, run * eb->T, eb->T, d->out_one, 0, &x, &ids, &w, &out);
    const double t0 = bench_now_s();
    if (!s)
        s = moex_experts_forward(eb->one[b], eb->st.layer.layer, eb->twin[b], &x, &ids, &w, &out);
    if (!s)
        s = moex_context_synchronize(eb->one[b]);
    *sec = bench_now_s() - t0;
    if (s) {
        fprintf(stderr, "moex bench: %s on one device at T=%lld: %s\n", eb->twin[b], (long long)eb->T,
                moex_last_error());
        return EXIT_RUNTIME;
    }
    return 0;
}

/* ------------------------------------------------------------------ setup */

/* The devices of the ranks (rank r on the (r mod n)-th GPU of --device's list, or on --device),
 * devs[0] being rank 0's, which the one-device side uses too. */
static int place_ranks(ep_bench *eb)
{
    const bench_opts *o = eb->o;
    for (int r = 0; r < eb->R; r++) {
        ep_rank *rk = &eb->rank[r];
        rk->eb = eb;
        rk->dev = o->n_ep_gpus ? (moex_device){MOEX_DEVICE_CUDA, o->ep_gpus[r % o->n_ep_gpus]} : o->device;
        int slot = 0;
        while (slot < eb->ndevs && (eb->devs[slot].dev.kind != rk->dev.kind || eb->devs[slot].dev.index != rk->dev.index))
            slot++;
        if (slot == eb->ndevs) {
            if (eb->ndevs == MAX_DEVS) {
                fprintf(stderr, "moex bench: --ep: the ranks would use more than %d devices\n", MAX_DEVS);
                return EXIT_USAGE;
            }
            moex_device_info info;
            moex_status s = moex_device_query(rk->dev, &info);
            if (s)
                return bench_moex_failed("moex_device_query", s);
            if (!info.available) {
                fprintf(stderr, "moex bench: --ep: rank %d's device %s is not available: %s\n", r, info.name,
                        info.reason);
                return EXIT_RUNTIME;
            }
            eb->devs[eb->ndevs++].dev = rk->dev;
        }
        rk->dev_slot = slot;
    }
    return 0;
}

/* Each rank's share of the host layer: views on the CPU, copies on its GPU. */
static int make_shares(ep_bench *eb)
{
    const int64_t per = eb->st.experts / eb->R;
    for (int r = 0; r < eb->R; r++) {
        ep_rank *rk = &eb->rank[r];
        moex_status s = moex_experts_desc_share(&eb->st.layer.desc, r * per, per, &rk->share);
        if (s)
            return bench_moex_failed("moex_experts_desc_share", s);
        if (rk->dev.kind == MOEX_DEVICE_CUDA) {
            for (int i = 0; i < LAYER_TENSORS; i++) {
                moex_tensor *v = bench_desc_view(&rk->share, i);
                if (!v->data)
                    continue;
                const size_t bytes = bench_view_bytes(v);
                if ((s = moex_device_alloc(rk->dev, bytes, &rk->copy[i])) ||
                    (s = moex_memcpy(rk->copy[i], rk->dev, v->data, HOST, bytes)))
                    return bench_moex_failed("copying a rank's share of the weights to its GPU", s);
                v->data = rk->copy[i];
                v->device = rk->dev;
            }
        }
        if ((s = moex_layer_create(&rk->share, &rk->layer)))
            return bench_moex_failed("moex_layer_create (a rank's share)", s);
    }
    return 0;
}

static const char *device_name(moex_device d, char *buf, size_t n)
{
    if (d.kind == MOEX_DEVICE_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

static const char *twin_of(const char *backend)
{
    return strcmp(backend, "deepgemm_megamoe") ? backend : "grouped_mm";
}

/* Per backend: the group's contexts, prepared for their shares, and the one-device context. */
static int make_contexts(ep_bench *eb)
{
    const bench_opts *o = eb->o;
    const int64_t tmax = o->tokens[o->ntokens - 1], share_max = (tmax + eb->R - 1) / eb->R;
    for (int b = 0; b < o->nbackends; b++) {
        moex_ep_group *g[MAX_EP_RANKS];
        moex_status s = moex_ep_local_groups(eb->R, g);
        if (s)
            return bench_moex_failed("moex_ep_local_groups", s);
        for (int r = 0; r < eb->R; r++) {
            ep_rank *rk = &eb->rank[r];
            rk->group[b] = g[r];
            moex_context_options co = moex_context_default_options();
            co.device = rk->dev;
            co.max_tokens = share_max;
            co.stream_slot = r;
            co.num_threads = eb->cuda ? 0 : (eb->st.threads / eb->R > 0 ? eb->st.threads / eb->R : 1);
            co.ep_group = g[r];
            if ((s = moex_context_create(&co, &rk->ctx[b])) || (s = moex_prepare(rk->ctx[b], rk->layer, o->backends[b]))) {
                fprintf(stderr, "moex bench: %s, rank %d of %d: %s\n", o->backends[b], r, eb->R, moex_last_error());
                return EXIT_RUNTIME;
            }
        }
        eb->twin[b] = twin_of(o->backends[b]);
        moex_context_options co = moex_context_default_options();
        co.device = eb->devs[0].dev;
        co.max_tokens = tmax;
        co.stream_slot = eb->R % MAX_EP_RANKS; /* a slot of its own unless the ranks take all (timed apart anyway) */
        co.num_threads = eb->cuda ? 0 : eb->st.threads;
        if ((s = moex_context_create(&co, &eb->one[b])) || (s = moex_prepare(eb->one[b], eb->st.layer.layer, eb->twin[b]))) {
            fprintf(stderr, "moex bench: %s on one device: %s\n", eb->twin[b], moex_last_error());
            return EXIT_RUNTIME;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ a token count */

static void free_inputs(ep_bench *eb)
{
    for (int d = 0; d < eb->ndevs; d++) {
        ep_dev *v = &eb->devs[d];
        void *p[5] = {v->x, v->ids, v->w, v->out_ep, v->out_one};
        for (int i = 0; i < 5; i++) {
            if (v->dev.kind == MOEX_DEVICE_CUDA)
                moex_device_free(v->dev, p[i]);
            else if (d == 0 || i >= 3) /* a CPU's inputs are the host arrays, freed once (device 0) */
                free(p[i]);
        }
        v->x = v->ids = v->w = v->out_ep = v->out_one = NULL;
    }
}

/* Every run's inputs of T tokens on the host, then on each device; the ranks' token ranges. */
static int make_inputs(ep_bench *eb, int64_t T, int count)
{
    const bench_state *st = &eb->st;
    const size_t esz = st->esize, xb = (size_t)(count * T * st->hidden) * esz, ib = (size_t)(count * T * st->top_k) * 4,
                 wb = (size_t)(count * T * st->top_k) * esz, ob = (size_t)(T * st->hidden) * esz + 16;
    void *x = NULL, *w = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int rc = bench_alloc(&x, (double)xb + 16, "hidden states");
    if (!rc)
        rc = bench_alloc((void **)&ids, (double)ib + 16, "routings");
    if (!rc)
        rc = bench_alloc(&w, (double)wb + 16, "routings");
    if (!rc)
        rc = bench_alloc((void **)&logits, (double)T * (double)st->experts * 4.0 + 16, "logits");
    if (!rc)
        rc = bench_fill_normal(x, eb->o->dtype, (size_t)(count * T * st->hidden), 1.0f,
                               bench_stream_seed(eb->o->seed, 6, (uint64_t)T, 0), st->threads);
    for (int r = 0; !rc && r < count; r++)
        rc = bench_route(st, T, r, ids + (size_t)(r * T * st->top_k), (char *)w + (size_t)(r * T * st->top_k) * esz,
                         logits);
    free(logits);
    for (int d = 0; !rc && d < eb->ndevs; d++) {
        ep_dev *v = &eb->devs[d];
        if (v->dev.kind == MOEX_DEVICE_CPU) {
            v->x = x, v->ids = ids, v->w = w;
            if ((rc = bench_alloc(&v->out_ep, (double)ob, "outputs")) || (rc = bench_alloc(&v->out_one, (double)ob, "outputs")))
                break;
            continue;
        }
        void **dst[5] = {&v->x, &v->ids, &v->w, &v->out_ep, &v->out_one};
        const void *src[5] = {x, ids, w, NULL, NULL};
        const size_t bytes[5] = {xb + 16, ib + 16, wb + 16, ob, ob};
        for (int i = 0; i < 5 && !rc; i++) {
            moex_status s = moex_device_alloc(v->dev, bytes[i], dst[i]);
            if (!s && src[i])
                s = moex_memcpy(*dst[i], v->dev, src[i], HOST, bytes[i]);
            if (s)
                rc = bench_moex_failed("the inputs on a GPU", s);
        }
    }
    if (rc || eb->devs[0].dev.kind != MOEX_DEVICE_CPU) { /* the host arrays are the CPU's inputs */
        free(x), free(ids), free(w);
        if (rc && eb->devs[0].dev.kind == MOEX_DEVICE_CPU)
            eb->devs[0].x = eb->devs[0].ids = eb->devs[0].w = NULL;
    }
    for (int r = 0; r < eb->R; r++) {
        eb->rank[r].t0 = T * r / eb->R;
        eb->rank[r].T = T * (r + 1) / eb->R - eb->rank[r].t0;
    }
    eb->T = T;
    return rc;
}

/* NMSE of the group's output against the one-device output (both of the last run). */
static int compare_outputs(ep_bench *eb, double *nmse)
{
    const int64_t n = eb->T * eb->st.hidden;
    const size_t esz = eb->st.esize;
    void *a = NULL, *b = NULL;
    float *fa = NULL, *fb = NULL;
    int rc = bench_alloc(&a, (double)n * esz + 16, "outputs");
    if (!rc)
        rc = bench_alloc(&b, (double)n * esz + 16, "outputs");
    if (!rc)
        rc = bench_alloc((void **)&fa, (double)n * 4 + 16, "outputs");
    if (!rc)
        rc = bench_alloc((void **)&fb, (double)n * 4 + 16, "outputs");
    for (int r = 0; !rc && r < eb->R; r++) { /* each rank's rows from its device */
        const ep_rank *rk = &eb->rank[r];
        const size_t at = (size_t)(rk->t0 * eb->st.hidden) * esz, bytes = (size_t)(rk->T * eb->st.hidden) * esz;
        moex_status s = bytes ? moex_memcpy((char *)a + at, HOST, (char *)eb->devs[rk->dev_slot].out_ep + at, rk->dev, bytes)
                              : MOEX_OK;
        if (s)
            rc = bench_moex_failed("copying the group's output back", s);
    }
    moex_status s = MOEX_OK;
    if (!rc && (s = moex_memcpy(b, HOST, eb->devs[0].out_one, eb->devs[0].dev, (size_t)n * esz)))
        rc = bench_moex_failed("copying the one-device output back", s);
    if (!rc && ((s = moex_convert(a, eb->o->dtype, fa, MOEX_F32, (size_t)n)) ||
                (s = moex_convert(b, eb->o->dtype, fb, MOEX_F32, (size_t)n))))
        rc = bench_moex_failed("moex_convert", s);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; !rc && i < n; i++) {
        const double d = (double)fa[i] - (double)fb[i];
        num += d * d;
        den += (double)fb[i] * (double)fb[i];
    }
    *nmse = rc ? NAN : den > 0.0 ? num / den : num;
    free(a), free(b), free(fa), free(fb);
    return rc;
}

/* Every run of token count ti, interleaved (the group then one device, backend after backend),
 * into eb->rows. */
static int run_count(ep_bench *eb, int ti)
{
    const bench_opts *o = eb->o;
    const int count = o->runs + WARMUP_RUNS, nb = o->nbackends;
    int rc = make_inputs(eb, o->tokens[ti], count);
    double *t = NULL;
    if (!rc)
        rc = bench_alloc((void **)&t, 2.0 * nb * o->runs * 8.0, "times");
    fprintf(stderr, "moex bench: --ep %d, T=%lld ...\n", eb->R, (long long)o->tokens[ti]);
    for (int run = 0; !rc && run < count; run++)
        for (int b = 0; b < nb && !rc; b++) {
            double g = 0.0, one = 0.0;
            rc = group_forward(eb, b, run, &g);
            if (!rc)
                rc = one_forward(eb, b, run, &one);
            if (!rc && run >= WARMUP_RUNS) {
                t[(2 * b) * o->runs + run - WARMUP_RUNS] = g;
                t[(2 * b + 1) * o->runs + run - WARMUP_RUNS] = one;
            }
            if (!rc && run == count - 1) {
                ep_row *row = &eb->rows[ti * nb + b];
                row->ep_ms = 1e3 * bench_median(t + (2 * b) * o->runs, o->runs);
                row->one_ms = 1e3 * bench_median(t + (2 * b + 1) * o->runs, o->runs);
                rc = compare_outputs(eb, &row->nmse);
            }
        }
    free(t);
    free_inputs(eb);
    return rc;
}

/* ------------------------------------------------------------------ output */

static void print_row(const ep_bench *eb, int ti, int b)
{
    const ep_row *row = &eb->rows[ti * eb->o->nbackends + b];
    printf("%-16s %7lld %5d %11.4f %-12s %11.4f %8.3f %10.3g\n", eb->o->backends[b], (long long)eb->o->tokens[ti], eb->R,
           row->ep_ms, eb->twin[b], row->one_ms, row->one_ms / row->ep_ms, row->nmse);
    fflush(stdout);
}

static void csv_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, ",%.6g", v);
    else
        fputs(",nan", f);
}

static int write_csv(FILE *f, const void *user)
{
    const ep_bench *eb = user;
    const bench_opts *o = eb->o;
    char host[256], date[32];
    bench_host_and_date(host, sizeof host, date, sizeof date);
    fprintf(f, "# machine=%s date=%s moex=%s shape=%s experts=%lld top_k=%lld runs=%d warmup=%d seed=%llu "
               "timing=wall_clock_forward_and_synchronize_no_cache_flush\n",
            host, date, moex_version(), o->shape->name, (long long)eb->st.experts, (long long)eb->st.top_k, o->runs,
            WARMUP_RUNS, (unsigned long long)o->seed);
    fprintf(f, "# ranks=%d devices=", eb->R);
    for (int r = 0; r < eb->R; r++) {
        char name[32];
        fprintf(f, "%s%s", r ? ";" : "", device_name(eb->rank[r].dev, name, sizeof name));
    }
    fputc('\n', f);
    for (int r = 1; r < eb->R && eb->cuda; r++)
        fprintf(f, "# copy_gbps rank0->rank%d=%.1f\n", r, eb->copy_gbps[r]);
    fputs("shape,backend,dtype,tokens,ranks,ep_ms,one_device_backend,one_device_ms,speedup,nmse\n", f);
    for (int ti = 0; ti < o->ntokens; ti++)
        for (int b = 0; b < o->nbackends; b++) {
            const ep_row *row = &eb->rows[ti * o->nbackends + b];
            fprintf(f, "%s,%s,%s,%lld,%d", o->shape->name, o->backends[b], bench_weight_label(o),
                    (long long)o->tokens[ti], eb->R);
            csv_num(f, row->ep_ms);
            fprintf(f, ",%s", eb->twin[b]);
            csv_num(f, row->one_ms);
            csv_num(f, row->one_ms / row->ep_ms);
            csv_num(f, row->nmse);
            fputc('\n', f);
        }
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------------ the pass */

static void release(ep_bench *eb)
{
    if (eb->barriers && eb->nthreads < eb->R) /* some rank's thread never started: the others wait at the */
        return;                                 /* start for ever, holding what they use; the command ends */
    if (eb->barriers) {
        eb->quit = 1;
        pthread_barrier_wait(&eb->start);
        for (int r = 0; r < eb->nthreads; r++)
            pthread_join(eb->th[r], NULL);
        pthread_barrier_destroy(&eb->start);
        pthread_barrier_destroy(&eb->end);
    }
    free_inputs(eb);
    for (int b = 0; b < MAX_BACKENDS; b++) {
        for (int r = 0; r < eb->R; r++) /* the ranks' contexts first: freeing one may wait for its group */
            moex_context_free(eb->rank[r].ctx[b]);
        for (int r = 0; r < eb->R; r++)
            moex_ep_group_free(eb->rank[r].group[b]);
        moex_context_free(eb->one[b]);
    }
    for (int r = 0; r < eb->R; r++) {
        moex_layer_free(eb->rank[r].layer);
        for (int i = 0; i < LAYER_TENSORS; i++)
            if (eb->rank[r].copy[i])
                moex_device_free(eb->rank[r].dev, eb->rank[r].copy[i]);
    }
    bench_state_free(&eb->st);
    free(eb->rows);
}

/* The layer on the host, its shares, then (GPUs) the whole of it on devs[0]. */
static int make_layers(ep_bench *eb)
{
    const bench_opts *o = eb->o;
    bench_state *st = &eb->st;
    bench_layer_spec spec = {st->experts, st->hidden, st->intermediate, st->top_k, o->dtype, o->quantized,
                             o->qformat, o->shape->gptoss, !eb->cuda, o->seed, st->threads};
    fprintf(stderr, "moex bench: generating %lld experts of random %s weights (%.0f MiB) ...\n",
            (long long)st->experts, bench_weight_label(o), st->experts * st->bytes_per_expert / 1048576.0);
    if (bench_layer_build(&spec, &st->layer))
        return EXIT_RUNTIME;
    int rc = make_shares(eb);
    if (!rc && eb->cuda)
        rc = bench_layer_upload(&st->layer, eb->devs[0].dev) ? EXIT_RUNTIME : 0;
    if (!rc)
        rc = bench_layer_create(&st->layer) ? EXIT_RUNTIME : 0;
    return rc;
}

static int check_sizes(const ep_bench *eb)
{
    const int64_t E = eb->st.experts, k = eb->st.top_k;
    if (E % eb->R)
        return bench_usage_error("--ep %d: %s's %lld experts do not divide among %d ranks", eb->R,
                                 eb->o->shape->name, (long long)E, eb->R);
    if (E / eb->R < k)
        return bench_usage_error("--ep %d: a rank's %lld experts are fewer than top_k = %lld", eb->R,
                                 (long long)(E / eb->R), (long long)k);
    return 0;
}

/* GPUs: each one's free memory against what the run puts there (the ranks' shares, the whole layer
 * on devs[0], every run's inputs of the largest token count and two outputs), with 512 MiB to
 * spare for the contexts' workspaces; a clear refusal before anything is made. */
static int check_gpu_memory(const ep_bench *eb)
{
#if MOEX_HAVE_CUDA
    const bench_opts *o = eb->o;
    const bench_state *st = &eb->st;
    const double T = (double)o->tokens[o->ntokens - 1], count = o->runs + WARMUP_RUNS;
    const double inputs = count * T * ((double)st->hidden * st->esize + (double)st->top_k * (4.0 + st->esize)) +
                          2.0 * T * st->hidden * st->esize;
    for (int d = 0; d < eb->ndevs && eb->cuda; d++) {
        double need = inputs + (d == 0 ? st->experts * st->bytes_per_expert : 0.0) + (double)(512u << 20);
        for (int r = 0; r < eb->R; r++)
            if (eb->rank[r].dev_slot == d)
                need += st->experts / eb->R * st->bytes_per_expert;
        double free_b = 0.0, total_b = 0.0;
        char err[256];
        if (bench_cuda_memory(eb->devs[d].dev.index, &free_b, &total_b, err, sizeof err)) {
            fprintf(stderr, "moex bench: %s\n", err);
            return EXIT_RUNTIME;
        }
        if (need > 0.9 * free_b)
            return bench_usage_error("--ep %d: cuda:%d would hold %.1f GiB (its ranks' shares%s and the inputs at "
                                     "T=%.0f), more than 90%% of its %.1f GiB free; use --max-experts, fewer --tokens "
                                     "or --runs, or more GPUs in --device",
                                     eb->R, eb->devs[d].dev.index, need / 1073741824.0,
                                     d == 0 ? ", the whole layer" : "", T, free_b / 1073741824.0);
    }
#else
    (void)eb;
#endif
    return 0;
}

int bench_ep_run(const bench_opts *o)
{
    ep_bench *eb = calloc(1, sizeof *eb);
    if (!eb) {
        fprintf(stderr, "moex bench: out of memory\n");
        return EXIT_RUNTIME;
    }
    eb->o = o;
    eb->st.o = o;
    eb->R = o->ep;
    eb->cuda = o->device.kind == MOEX_DEVICE_CUDA;
    for (int r = 0; r < MAX_EP_RANKS; r++)
        eb->copy_gbps[r] = NAN;
    int rc = bench_check_backends(o, o->device);
    if (!rc)
        rc = bench_resolve_sizes(o, &eb->st);
    if (!rc)
        rc = check_sizes(eb);
    if (!rc)
        rc = place_ranks(eb);
    if (!rc)
        rc = check_gpu_memory(eb);
    if (!rc)
        rc = bench_alloc((void **)&eb->rows, (double)o->ntokens * o->nbackends * sizeof(ep_row), "results");
    if (!rc)
        rc = make_layers(eb);
    if (!rc)
        rc = make_contexts(eb);
#if MOEX_HAVE_CUDA
    char err[512];
    for (int r = 1; !rc && eb->cuda && r < eb->R; r++) /* peer access is on: the contexts enabled it */
        if (bench_cuda_copy_gbps(eb->rank[0].dev.index, eb->rank[r].dev.index, (size_t)256 << 20, &eb->copy_gbps[r], err,
                                 sizeof err))
            fprintf(stderr, "moex bench: warning: the copy rate to rank %d's GPU was not measured: %s\n", r, err);
#endif
    if (!rc)
        rc = start_threads(eb);
    if (!rc) {
        printf("moex bench %s --ep %d: %s  H=%lld I=%lld experts=%lld k=%lld  %s; ranks on", moex_version(), eb->R,
               o->shape->name, (long long)eb->st.hidden, (long long)eb->st.intermediate, (long long)eb->st.experts,
               (long long)eb->st.top_k, bench_weight_label(o));
        for (int r = 0; r < eb->R; r++) {
            char name[32];
            printf(" %s", device_name(eb->rank[r].dev, name, sizeof name));
        }
        printf("; runs=%d (+%d warm-up)\n", o->runs, WARMUP_RUNS);
        printf("timing: the wall clock around every rank's forward and synchronisation (one device: the same), "
               "no cache flush; tokens divided among the ranks in order\n");
        for (int r = 1; r < eb->R && eb->cuda; r++)
            printf("copy rate %s -> rank %d's GPU: %.1f GB/s\n", "rank 0's GPU", r, eb->copy_gbps[r]);
        printf("%-16s %7s %5s %11s %-12s %11s %8s %10s\n", "backend", "tokens", "ranks", "ep_ms", "one_device",
               "one_ms", "speedup", "nmse");
    }
    for (int ti = 0; !rc && ti < o->ntokens; ti++) {
        rc = run_count(eb, ti);
        for (int b = 0; !rc && b < o->nbackends; b++)
            print_row(eb, ti, b);
    }
    if (!rc && o->csv.path) {
        rc = bench_write_file(&o->csv, write_csv, eb);
        if (!rc)
            fprintf(stderr, "moex bench: wrote %s\n", o->csv.path);
    }
    release(eb);
    free(eb);
    return rc;
}
