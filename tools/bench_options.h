/*
 * bench_options.h — the options of `moex bench` (tools/bench_options.c): the named shapes,
 * the command line parsed and checked, and the limits every part of the bench shares.
 */
#ifndef MOEX_TOOLS_BENCH_OPTIONS_H
#define MOEX_TOOLS_BENCH_OPTIONS_H

#include "moex.h"

#include <stdint.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, PARSE_HELP = -1 };
enum { WARMUP_RUNS = 2, MIN_RUNS = 10, DEFAULT_RUNS = 10, MAX_RUNS = 100000 };
enum { MAX_TOKEN_COUNTS = 32, MAX_BACKENDS = 16, MAX_DTYPES = 6, NAME_LEN = 64 };
/* The most tokens of one case (--tokens, --backend-max-tokens). */
enum { MAX_TOKENS = 1 << 24 };
enum { GRAPH_DEFAULT = -1, GRAPH_OFF = 0, GRAPH_ON = 1, GRAPH_BOTH = 2 };
/* --ep: the most ranks, and the most GPUs a --device list names. */
enum { MAX_EP_RANKS = 64, MAX_EP_GPUS = 64 };
/* Room for a path as realpath() writes it (PATH_MAX on Linux; checked in bench_options.c). */
enum { BENCH_PATH_MAX = 4096 };

/* A named MoE shape (--shape). */
typedef struct bench_shape {
    const char *name;
    int64_t hidden, intermediate, experts, top_k;
    int gptoss; /* GPT-OSS layout: interleaved, biases, clamped activation; float weights transposed
                   ([E, in, out]) on the CPU, [E, out, in] on a GPU, as its model loader keeps them */
} bench_shape;

/* A file that --csv or --plot asks for. */
typedef struct out_file {
    const char *opt;       /* "--csv" or "--plot" */
    const char *path;      /* as given; NULL: not asked for */
    char target[BENCH_PATH_MAX]; /* the file written: path, or the regular file that a symlink path names */
    int in_place;          /* 1: an existing file that is not a regular one (a device, a FIFO): written
                              directly; 0: written to a temp file beside target, then renamed */
} out_file;

typedef struct bench_opts {
    const bench_shape *shape;
    int64_t tokens[MAX_TOKEN_COUNTS]; /* ascending, distinct */
    int ntokens;
    char backends[MAX_BACKENDS][NAME_LEN];
    int nbackends;
    moex_dtype dtype;           /* activations (and weights unless quantized) */
    int quantized;              /* 1: weights in qformat, activations bf16 */
    moex_quant_format qformat;
    char dtypes[MAX_DTYPES][NAME_LEN]; /* --dtype list: one pass of the whole bench each */
    int ndtypes;
    moex_device device;         /* with a --device list: its first GPU */
    int ep;                     /* --ep N: ranks of an expert-parallel group (tools/bench_ep.c); 0: none */
    int ep_gpus[MAX_EP_GPUS];   /* --device cuda:N,M,...: rank r on ep_gpus[r mod n_ep_gpus] */
    int n_ep_gpus;              /* 0: the list was not given (every rank on `device`) */
    int64_t max_experts; /* 0: all */
    int threads;         /* 0: one per online core */
    int runs;
    out_file csv, plot;
    uint64_t seed;
    float skew;                        /* --skew: routing logits + skew x each expert's popularity */
    int graph;                         /* GRAPH_DEFAULT, GRAPH_OFF, GRAPH_ON or GRAPH_BOTH */
    int reference;                     /* 1: eager runs as the err reference when not timed */
    int warm;                          /* --cache warm: no cache flush, one routing for every run */
    const char *backend_max_arg;       /* --backend-max-tokens, parsed after --backends */
    char limit_names[MAX_BACKENDS][NAME_LEN];
    int64_t limit_tokens[MAX_BACKENDS];
    int nlimits;
} bench_opts;

/** The text of `moex bench --help`. */
void bench_print_usage(FILE *f);

/**
 * Parse and check argv (argv[0] is "bench") into *o: every value, the output files, the
 * device-dependent options. Returns 0, PARSE_HELP for -h/--help, or EXIT_USAGE after
 * printing why (nothing is written then).
 */
int bench_parse_args(int argc, char **argv, bench_opts *o);

/** Put dtype name s (one of --dtype's list) in force in *o. Returns 0 or EXIT_USAGE. */
int bench_apply_dtype(const char *s, bench_opts *o);

/** The weights' dtype as the bench names it: f32, f16, bf16, fp8, fp8-ue8m0 or fp4. */
const char *bench_weight_label(const bench_opts *o);

/** The largest T backend `name` may run (--backend-max-tokens), else MAX_TOKENS. */
int64_t bench_backend_limit(const bench_opts *o, const char *name);

/** "moex bench: " fmt "\n(see `moex bench --help`)" on stderr; returns EXIT_USAGE. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int bench_usage_error(const char *fmt, ...);

#endif /* MOEX_TOOLS_BENCH_OPTIONS_H */
