/*
 * bench_run.h — one pass of `moex bench` (one --dtype), written once for every device
 * (tools/bench_run.c): the layer built on the host (uploaded for a GPU run), the inputs of
 * every run, interleaved timed forwards, errors against eager, the rows. What differs by
 * device is a bench_runner: tools/bench_cpu.c and tools/bench_cuda.c (CUDA builds only).
 */
#ifndef MOEX_TOOLS_BENCH_RUN_H
#define MOEX_TOOLS_BENCH_RUN_H

#include "bench_ceilings.h"
#include "bench_layer.h"
#include "bench_options.h"
#include "moex.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Figures are more than this fraction below the reference ones: a warning. */
#define CEILING_TOLERANCE 0.85

typedef struct case_result {
    double ms, gflops, weight_gbps, max_abs_err, gemm_frac, bw_frac;
    double read_floor_ms, floor_frac; /* cuda: the token count's read floor, and it over ms; else NaN */
    double first_ms; /* wall time of the backend's first forward at this token count, synchronised: with
                        whatever it first loads or compiles (deepgemm's kernels), outside the timed runs */
    double workspace_mib; /* the backend's context workspace (sized for the run's largest token count), MiB */
    int state; /* CASE_RAN, or why not (cuda only) */
} case_result;

enum { CASE_RAN = 0, CASE_OVER_LIMIT = 1, CASE_FAILED = 2, CASE_NOT_CAPTURED = 3 };

typedef struct bench_runner bench_runner;

/* Everything one pass owns; freed by bench_state_release() and bench_state_free(). */
typedef struct bench_state {
    const bench_opts *o;
    const bench_runner *runner;
    int cuda;               /* 1 on --device cuda */
    moex_device_info cpu;
    char cpu_model[96];
    int threads;
    int64_t experts, top_k, hidden, intermediate;
    size_t esize;           /* bytes per element of o->dtype */
    double bytes_per_expert;
    double flops_per_pair;  /* per (token, expert) pair */
    double gemm_gflops, read_gbps; /* what gemm_frac and bw_frac divide by; NAN when not measured */
    int ceilings_low;
    double other_share;     /* other processes' share of the CPU during the run (NaN: unknown) */
    bench_layer layer;
    int eager_index;        /* position of "eager" in o->backends, or -1 */
    /* contexts: ctx[b] runs backend b, ctx[MAX_BACKENDS] the eager reference (NULL: none);
       owned[] are the ones to free (the CPU shares one among all) */
    moex_context *ctx[MAX_BACKENDS + 1];
    moex_context *owned[MAX_BACKENDS + 1];
    int prepare_failed[MAX_BACKENDS];
    case_result *results;   /* [ntokens][nvariants]; a variant is (backend, graph) */
    int ngraph;             /* graph settings per backend: 1 (cpu, --graph on/off) or 2 */
    int graph_first;        /* the graph setting of variant 0 (0 or 1) */
    struct bench_state *next; /* the state of the next --dtype of this run, or NULL */
    /* cpu */
    float *flush;           /* a buffer larger than the last-level cache */
    size_t flush_n;
    double t0;              /* the wall-clock start of the forward being timed */
    /* cuda */
    moex_device_info gpu;
    double gpu_bf16_tflops, gpu_fp8_tflops, gpu_read_gbps; /* NAN when not measured */
    bench_cuda_timer *timer;
} bench_state;

/* The inputs of every run of one token count, on the host and where the forwards read them. */
typedef struct workload {
    int64_t tokens;
    int count;           /* warm-up + timed runs */
    void *hidden;        /* [count][T][H] dtype */
    int32_t *ids;        /* [count][T][k] */
    void *weights;       /* [count][T][k] dtype */
    double *unique;      /* [count] distinct experts hit */
    void *outs;          /* [nvariants + 1][T][H] dtype; the last is eager's reference */
    float *cmp_a, *cmp_b;/* [T][H] f32, for the error */
    double *times;       /* [nvariants][runs] seconds */
    /* what the forwards read and write: the host buffers above, or (cuda) their device copies */
    moex_device device;
    void *run_hidden, *run_ids, *run_weights, *run_outs;
    void *graph_x, *graph_ids, *graph_w; /* one run's inputs: what the graphs read (device only) */
    moex_graph *graphs[MAX_BACKENDS];
    int state[2 * MAX_BACKENDS];         /* CASE_* per variant */
    double first_ms[MAX_BACKENDS];       /* case_result.first_ms per backend (NaN: not run) */
} workload;

/* What one device does its own way. Each int function returns 0, or an exit code after printing why. */
struct bench_runner {
    /* after the sizes: refuse backends the device cannot run, check memory, set variants */
    int (*resolve)(bench_state *st);
    void (*banner)(const bench_state *st);
    int (*ceilings)(bench_state *st);
    /* 1: the layer and every run's inputs are copied to o->device (the upload hook) */
    int upload;
    /* fill st->ctx[] (and owned[]), prepared for st->layer.layer; after it the flush buffer etc. */
    int (*contexts)(bench_state *st);
    /* before a timed forward: evict the caches (not under --cache warm) */
    int (*flush)(bench_state *st);
    int (*timer_start)(bench_state *st);
    int (*timer_stop)(bench_state *st, double *sec);
    /* a failed forward leaves its rows empty (1) or ends the bench (0) */
    int rows_may_fail;
    /* the read floor of the token count in ms (NULL: none, NaN) */
    int (*read_floor)(const bench_state *st, const workload *w, double *ms);
    /* the CSV's comment lines before the passes' ones: the ceilings first */
    void (*csv_comments)(FILE *f, const bench_state *st);
    /* free what resolve, ceilings and contexts made beyond the shared parts (may be NULL) */
    void (*release)(bench_state *st);
};

extern const bench_runner bench_cpu_runner;
#if MOEX_HAVE_CUDA
extern const bench_runner bench_cuda_runner;
#endif

/* Variants: (backend, graph) pairs, graph varying fastest. On the CPU, one per backend. */
int bench_nvariants(const bench_state *st);
int bench_var_backend(const bench_state *st, int v);
int bench_var_graph(const bench_state *st, int v);

/** Sizes of the layer (after --max-experts), host threads and CPU, bytes and FLOPs per expert. */
int bench_resolve_sizes(const bench_opts *o, bench_state *st);

/** Every backend must be able to run on the device (else exit 2, naming it). */
int bench_check_backends(const bench_opts *o, moex_device device);

/** Bytes one token count needs beyond the weights (inputs of every run, outputs, scratch). */
double bench_workload_bytes(const bench_state *st, int64_t T);

/**
 * Routing r of T tokens: random logits from the seed (+ --skew's popularity; logits: T x experts
 * floats of scratch) -> softmax top-k, renormalised -> ids [T, k] and weights [T, k] (o->dtype),
 * on the host. Returns 0, or EXIT_RUNTIME after printing why.
 */
int bench_route(const bench_state *st, int64_t T, int r, int32_t *ids, void *weights, float *logits);

/** Distinct experts hit, averaged over the timed runs. */
double bench_mean_unique(const bench_opts *o, const workload *w);

/** One pass: banner, ceilings, layer, contexts, every token count's rows, the machine's load. */
int bench_run(bench_state *st);

/** Everything but the results: layer, contexts, the runner's buffers. */
void bench_state_release(bench_state *st);
void bench_state_free(bench_state *st);

#endif /* MOEX_TOOLS_BENCH_RUN_H */
