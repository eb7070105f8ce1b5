/*
 * bench.c — `moex bench`: times the experts layer of a named MoE shape
 * through moex backends on synthetic weights and fresh random routings, and
 * prints each case also as a fraction of ceilings measured in the same
 * process (see shared/BENCHMARKS.md).
 *
 * Flow: parse and validate every argument (exit 2, nothing written) ->
 * resolve the device, threads and memory -> ceilings -> synthetic layer,
 * context, prepare -> per token count: routings, interleaved timed runs,
 * table rows -> CSV and SVG (each written to a temp file, then renamed).
 *
 * --device cuda (built with MOEX_HAVE_CUDA): the same flow with the weights and every run's
 * inputs on the GPU, GPU ceilings (tools/bench_ceilings_cuda.cu), one context per backend,
 * CUDA-event timing after an L2 flush, and each backend also captured in a CUDA graph and
 * replayed (rows graph=1).
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with realpath */

#include "bench.h"
#include "cli.h"

#include <moex.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, PARSE_HELP = -1 };
enum { WARMUP_RUNS = 2, MIN_RUNS = 10, DEFAULT_RUNS = 10, MAX_RUNS = 100000 };
enum { MAX_TOKEN_COUNTS = 32, MAX_BACKENDS = 16, MAX_DTYPES = 6, NAME_LEN = 64, FILL_CHUNK = 4096 };
static const int64_t MAX_TOKENS = (int64_t)1 << 24;
static const int MAX_THREADS = 4096;

/* Figures of this 2-core machine (BENCHMARKS.md); a ceiling more than 15% below warns. */
static const double REF_SGEMM_GFLOPS_2T = 140.0;
static const double REF_READ_GBPS_1T = 18.0;
static const double REF_READ_GBPS_2T = 28.0;
static const double CEILING_TOLERANCE = 0.85;
/* Other processes' share of the CPU during the run above which timings are flagged. */
static const double BUSY_MACHINE_SHARE = 0.10;

static const char *const DEFAULT_BACKENDS = "eager,batched_mm,grouped_mm";

/* ------------------------------------------------------------------ shapes */

typedef struct bench_shape {
    const char *name;
    int64_t hidden, intermediate, experts, top_k;
    int gptoss; /* GPT-OSS layout: transposed, interleaved, biases, clamped activation */
} bench_shape;

static const bench_shape SHAPES[] = {
    {"qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 0},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 0},
    {"mixtral-8x7b", 4096, 14336, 8, 2, 0},
    {"deepseek-v3", 7168, 2048, 256, 8, 0},
    {"gpt-oss-20b", 2880, 2880, 32, 4, 1},
};
enum { NUM_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

/* ------------------------------------------------------------------ options */

/* A file that --csv or --plot asks for. */
typedef struct out_file {
    const char *opt;       /* "--csv" or "--plot" */
    const char *path;      /* as given; NULL: not asked for */
    char target[PATH_MAX]; /* the file written: path, or the regular file that a symlink path names */
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
    moex_device device;
    int64_t max_experts; /* 0: all */
    int threads;         /* 0: one per online core */
    int runs;
    out_file csv, plot;
    uint64_t seed;
    int graph;                         /* GRAPH_DEFAULT, GRAPH_OFF, GRAPH_ON or GRAPH_BOTH */
    int reference;                     /* 1: eager runs as the err reference when not timed */
    int warm;                          /* --cache warm: no cache flush, one routing for every run */
    const char *backend_max_arg;       /* --backend-max-tokens, parsed after --backends */
    char limit_names[MAX_BACKENDS][NAME_LEN];
    int64_t limit_tokens[MAX_BACKENDS];
    int nlimits;
} bench_opts;

enum { GRAPH_DEFAULT = -1, GRAPH_OFF = 0, GRAPH_ON = 1, GRAPH_BOTH = 2 };

static void print_usage(FILE *f)
{
    fputs("usage: moex bench --shape NAME --tokens T1,T2,... [options]\n"
          "\n"
          "Times the experts layer of a named MoE shape through moex backends, on\n"
          "synthetic weights and a fresh random routing every run, and prints each\n"
          "case also as a fraction of ceilings measured in the same process\n"
          "(OpenBLAS sgemm 2048^3 and an AVX2 read of 1 GiB, on the same threads).\n"
          "\n"
          "  --shape NAME      qwen1.5-moe-a2.7b, qwen3-30b-a3b, mixtral-8x7b,\n"
          "                    deepseek-v3 or gpt-oss-20b\n"
          "  --tokens LIST     token counts, e.g. 1,8,512\n"
          "  --backends LIST   backends, run interleaved (default eager,batched_mm,grouped_mm)\n"
          "  --dtype NAME      f32, f16 or bf16: weights and activations (default bf16);\n"
          "                    fp8, fp8-ue8m0 or fp4: quantized weights, bf16 activations\n"
          "                    (cpu); a list (bf16,fp8) runs the bench once per dtype in\n"
          "                    this run, into one table, CSV and plot\n"
          "  --device NAME     cpu (default), cuda or cuda:N; on cuda the weights and\n"
          "                    inputs live on the GPU, each forward is timed with CUDA\n"
          "                    events from an idle stream after an L2 flush, and the\n"
          "                    ceilings are cuBLAS bf16 GEMM 8192^3, cuBLASLt FP8 GEMM\n"
          "                    8192^3 and a device read of 4 GiB\n"
          "  --graph MODE      cuda only: off, on (capture one forward per backend and\n"
          "                    token count in a CUDA graph, replay it) or both (default\n"
          "                    on cuda: one row each, column graph = 0/1)\n"
          "  --backend-max-tokens NAME=T,...\n"
          "                    run backend NAME only at token counts <= T (its rows\n"
          "                    above are left empty), e.g. eager=4096\n"
          "  --max-experts N   use at most N experts (top-k becomes min(k, N))\n"
          "  --threads N       CPU threads (default: one per online core)\n"
          "  --runs N          timed runs per case, at least 10 (default 10),\n"
          "                    after 2 warm-up runs; the median is reported\n"
          "  --csv FILE        also write the results as CSV (ceilings on line 1)\n"
          "  --plot FILE.svg   also write an SVG plot of time against tokens (a file\n"
          "                    other than the CSV's)\n"
          "  --seed S          seed of the weights and routings (default 1)\n"
          "  --cache MODE      flushed (default): the last-level cache (L2 on cuda) is\n"
          "                    flushed before every timed forward and every run has its\n"
          "                    own routing; warm: no flush, and every run repeats the\n"
          "                    first timed run's routing and inputs, so the weights of\n"
          "                    its experts may still be cached (a loop timing one\n"
          "                    forward again and again measures this)\n"
          "  --reference MODE  on (default): when eager is not among the backends, run\n"
          "                    it once per token count as the err column's reference;\n"
          "                    off: do not (err is left empty; for profilers, whose\n"
          "                    launch counts should see only the timed backends)\n"
          "  -h, --help        show this text\n"
          "\n"
          "Columns: ms = median time of one forward; GFLOP/s = 6*T*k*H*I/time;\n"
          "GB/s = unique experts hit * bytes per expert / time; err = max |out - eager|\n"
          "on the first timed routing; gemm_frac and bw_frac = GFLOP/s and GB/s over\n"
          "the ceilings; cuda: read_floor_ms = one kernel reading the weights of the\n"
          "distinct experts hit once (timed like the forward), floor_frac = it over ms.\n"
          "Exit status: 0 ok, 1 runtime failure, 2 usage error.\n",
          f);
}

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("moex bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(see `moex bench --help`)\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* s must be all decimal digits; its value in [1, max]. */
static int parse_positive(const char *opt, const char *s, int64_t max, int64_t *out)
{
    uint64_t v = 0;
    cli_num r = cli_parse_u64(s, (uint64_t)max, &v);
    if (r == CLI_NUM_RANGE)
        return usage_error("%s: \"%s\" is too large (at most %lld)", opt, s, (long long)max);
    if (r != CLI_NUM_OK || v < 1)
        return usage_error("%s: \"%s\" is not a positive integer", opt, s);
    *out = (int64_t)v;
    return 0;
}

/* Split a comma-separated list into items of at most NAME_LEN-1 characters. */
static int split_list(const char *opt, const char *s, char items[][NAME_LEN], int max_items,
                      int *count)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0)
            return usage_error("%s: \"%s\" has an empty item", opt, s);
        if (len >= NAME_LEN)
            return usage_error("%s: \"%.*s\" is too long", opt, (int)len, p);
        if (n == max_items)
            return usage_error("%s: \"%s\" has more than %d items", opt, s, max_items);
        memcpy(items[n], p, len);
        items[n][len] = '\0';
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    *count = n;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int parse_tokens(const char *s, bench_opts *o)
{
    char items[MAX_TOKEN_COUNTS][NAME_LEN];
    int n = 0, rc = split_list("--tokens", s, items, MAX_TOKEN_COUNTS, &n);
    for (int i = 0; !rc && i < n; i++)
        rc = parse_positive("--tokens", items[i], MAX_TOKENS, &o->tokens[i]);
    if (rc)
        return rc;
    qsort(o->tokens, (size_t)n, sizeof o->tokens[0], cmp_i64);
    for (int i = 1; i < n; i++) {
        if (o->tokens[i] == o->tokens[i - 1])
            return usage_error("--tokens: %lld appears twice in \"%s\"", (long long)o->tokens[i],
                               s);
    }
    o->ntokens = n;
    return 0;
}

static int parse_backends(const char *s, bench_opts *o)
{
    int n = 0, rc = split_list("--backends", s, o->backends, MAX_BACKENDS, &n);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        if (moex_backend_lookup(o->backends[i]) != MOEX_OK)
            return usage_error("--backends: \"%s\": %s", o->backends[i], moex_last_error());
        for (int j = 0; j < i; j++)
            if (strcmp(o->backends[i], o->backends[j]) == 0)
                return usage_error("--backends: \"%s\" appears twice in \"%s\"", o->backends[i], s);
    }
    o->nbackends = n;
    return 0;
}

static int parse_shape(const char *s, bench_opts *o)
{
    for (int i = 0; i < NUM_SHAPES; i++) {
        if (strcmp(s, SHAPES[i].name) == 0) {
            o->shape = &SHAPES[i];
            return 0;
        }
    }
    char names[256] = "";
    for (int i = 0; i < NUM_SHAPES; i++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", SHAPES[i].name);
    }
    return usage_error("--shape: unknown shape \"%s\"; the shapes are: %s", s, names);
}

static int apply_dtype(const char *s, bench_opts *o)
{
    o->quantized = 0;
    if (strcmp(s, "f32") == 0 || strcmp(s, "f16") == 0 || strcmp(s, "bf16") == 0)
        return moex_dtype_parse(s, &o->dtype) == MOEX_OK
                   ? 0
                   : usage_error("--dtype: \"%s\": %s", s, moex_last_error());
    if (moex_quant_format_parse(s, &o->qformat) == MOEX_OK) {
        o->quantized = 1;
        o->dtype = MOEX_BF16;
        return 0;
    }
    return usage_error("--dtype: \"%s\" is not one of f32, f16, bf16, fp8, fp8-ue8m0, fp4", s);
}

static int parse_dtype(const char *s, bench_opts *o)
{
    int n = 0, rc = split_list("--dtype", s, o->dtypes, MAX_DTYPES, &n);
    for (int i = 0; !rc && i < n; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(o->dtypes[i], o->dtypes[j]) == 0)
                return usage_error("--dtype: \"%s\" appears twice in \"%s\"", o->dtypes[i], s);
    for (int i = n - 1; !rc && i >= 0; i--) /* every name checked; the first one left in force */
        rc = apply_dtype(o->dtypes[i], o);
    if (!rc)
        o->ndtypes = n;
    return rc;
}

/* The weights' dtype as the bench names it: f32, f16, bf16, fp8, fp8-ue8m0 or fp4. */
static const char *weight_label(const bench_opts *o)
{
    return o->quantized ? moex_quant_format_name(o->qformat) : moex_dtype_name(o->dtype);
}

/* "cpu", "cuda" or "cuda:N". Whether CUDA is usable is decided later (exit 1, not 2). */
static int parse_device(const char *s, bench_opts *o)
{
    if (strcmp(s, "cpu") == 0) {
        o->device = (moex_device){MOEX_DEVICE_CPU, 0};
        return 0;
    }
    if (strcmp(s, "cuda") == 0) {
        o->device = (moex_device){MOEX_DEVICE_CUDA, 0};
        return 0;
    }
    if (strncmp(s, "cuda:", 5) == 0) {
        int64_t idx = 0;
        const char *digits = s + 5;
        if (strcmp(digits, "0") == 0)
            idx = 0;
        else if (parse_positive("--device", digits, 1023, &idx) != 0)
            return EXIT_USAGE;
        o->device = (moex_device){MOEX_DEVICE_CUDA, (int)idx};
        return 0;
    }
    return usage_error("--device: \"%s\" is not one of cpu, cuda, cuda:N", s);
}

static int parse_graph(const char *s, bench_opts *o)
{
    if (strcmp(s, "off") == 0 || strcmp(s, "0") == 0)
        o->graph = GRAPH_OFF;
    else if (strcmp(s, "on") == 0 || strcmp(s, "1") == 0)
        o->graph = GRAPH_ON;
    else if (strcmp(s, "both") == 0)
        o->graph = GRAPH_BOTH;
    else
        return usage_error("--graph: \"%s\" is not one of off, on, both", s);
    return 0;
}

/* An option with two values: *is_b = 0 for a, 1 for b; anything else is refused by name. */
static int parse_either(const char *opt, const char *s, const char *a, const char *b, int *is_b)
{
    if (strcmp(s, a) == 0)
        *is_b = 0;
    else if (strcmp(s, b) == 0)
        *is_b = 1;
    else
        return usage_error("%s: \"%s\" is not one of %s, %s", opt, s, a, b);
    return 0;
}

static int parse_cache(const char *s, bench_opts *o)
{
    return parse_either("--cache", s, "flushed", "warm", &o->warm);
}

static int parse_reference(const char *s, bench_opts *o)
{
    int off = 0, rc = parse_either("--reference", s, "on", "off", &off);
    if (!rc)
        o->reference = !off;
    return rc;
}

/* "eager=4096,batched_mm=512": every NAME registered, every T a positive integer. */
static int parse_backend_max(const char *s, bench_opts *o)
{
    char items[MAX_BACKENDS][NAME_LEN];
    int n = 0, rc = split_list("--backend-max-tokens", s, items, MAX_BACKENDS, &n);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        char *eq = strchr(items[i], '=');
        if (!eq || eq == items[i])
            return usage_error("--backend-max-tokens: \"%s\" is not NAME=T", items[i]);
        *eq = '\0';
        if (moex_backend_lookup(items[i]) != MOEX_OK)
            return usage_error("--backend-max-tokens: \"%s\": %s", items[i], moex_last_error());
        for (int j = 0; j < i; j++)
            if (strcmp(o->limit_names[j], items[i]) == 0)
                return usage_error("--backend-max-tokens: \"%s\" appears twice", items[i]);
        if ((rc = parse_positive("--backend-max-tokens", eq + 1, MAX_TOKENS, &o->limit_tokens[i])))
            return rc;
        memcpy(o->limit_names[i], items[i], strlen(items[i]) + 1); /* < NAME_LEN, as split */
    }
    o->nlimits = n;
    return 0;
}

static int parse_seed(const char *s, bench_opts *o)
{
    uint64_t v = 0;
    cli_num r = cli_parse_u64(s, UINT64_MAX, &v);
    if (r == CLI_NUM_RANGE)
        return usage_error("--seed: \"%s\" is too large (at most %llu)", s,
                           (unsigned long long)UINT64_MAX);
    if (r != CLI_NUM_OK)
        return usage_error("--seed: \"%s\" is not an unsigned 64-bit integer", s);
    o->seed = v;
    return 0;
}

/* The directory part of path ("." for a bare name). */
static void dir_of(const char *path, char *dir, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, size, ".");
    else if (slash == path)
        snprintf(dir, size, "/");
    else
        snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/*
 * Decide where f->path will be written (f->target, f->in_place) and check that it can be:
 * no directory; an existing device or FIFO writable in place; otherwise the directory
 * that will hold the temp file writable. A symlink to a regular file is followed (the
 * file it names is replaced, the link kept); a dangling one is replaced.
 */
static int resolve_output(out_file *f)
{
    const char *opt = f->opt, *path = f->path;
    size_t len = strlen(path);
    if (len == 0)
        return usage_error("%s: \"%s\" is an empty file name", opt, path);
    if (len >= sizeof f->target)
        return usage_error("%s: \"%s\" is too long", opt, path);
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return usage_error("%s: \"%s\" is a directory", opt, path);
    if (path[len - 1] == '/')
        return usage_error("%s: \"%s\" names a directory, not a file", opt, path);
    snprintf(f->target, sizeof f->target, "%s", path);
    f->in_place = exists && !S_ISREG(st.st_mode);
    if (f->in_place) {
        if (access(path, W_OK) != 0)
            return usage_error("%s: cannot write to \"%s\": %s", opt, path, strerror(errno));
        return 0;
    }
    struct stat lst;
    if (exists && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) && !realpath(path, f->target))
        return usage_error("%s: cannot resolve \"%s\": %s", opt, path, strerror(errno));
    char dir[PATH_MAX];
    dir_of(f->target, dir, sizeof dir);
    if (access(dir, W_OK | X_OK) != 0)
        return usage_error("%s: cannot write into the directory \"%s\"", opt, dir);
    return 0;
}

/* Whether the targets of a and b are one file: the same inode if both exist, else the same
 * name in the same directory (by its real path). */
static int same_file(const out_file *a, const out_file *b)
{
    struct stat sa, sb;
    int ea = stat(a->target, &sa) == 0, eb = stat(b->target, &sb) == 0;
    if (ea || eb)
        return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
    dir_of(a->target, da, sizeof da);
    dir_of(b->target, db, sizeof db);
    const char *na = strrchr(a->target, '/'), *nb = strrchr(b->target, '/');
    na = na ? na + 1 : a->target;
    nb = nb ? nb + 1 : b->target;
    if (strcmp(na, nb) != 0 || !realpath(da, ra) || !realpath(db, rb))
        return 0;
    return strcmp(ra, rb) == 0;
}

/* The output files: each resolved, not both one file, and neither the regular file that
 * stdout writes to (the table would be lost under it). Before anything is timed. */
static int check_outputs(bench_opts *o)
{
    out_file *files[2] = {&o->csv, &o->plot};
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        if (files[i]->path)
            rc = resolve_output(files[i]);
    if (rc)
        return rc;
    if (o->csv.path && o->plot.path && same_file(&o->csv, &o->plot))
        return usage_error("--csv \"%s\" and --plot \"%s\" name the same file", o->csv.path,
                           o->plot.path);
    struct stat out;
    if (fstat(STDOUT_FILENO, &out) != 0 || !S_ISREG(out.st_mode))
        return 0;
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (files[i]->path && stat(files[i]->target, &st) == 0 && st.st_dev == out.st_dev &&
            st.st_ino == out.st_ino)
            return usage_error("%s \"%s\" is the file that stdout writes to", files[i]->opt,
                               files[i]->path);
    }
    return 0;
}

/* "--name value" or "--name=value". Returns 1 and sets *value if argv[*i] is option `name`. */
static int match_option(int argc, char **argv, int *i, const char *name, const char **value,
                        int *rc)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
        return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
    } else if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) {
        *value = argv[++*i];
    } else {
        *rc = usage_error("%s needs a value", name);
        *value = NULL;
    }
    return 1;
}

static void default_options(bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = MOEX_BF16;
    o->device = (moex_device){MOEX_DEVICE_CPU, 0};
    o->runs = DEFAULT_RUNS;
    o->seed = 1;
    o->graph = GRAPH_DEFAULT;
    o->reference = 1;
    o->csv.opt = "--csv";
    o->plot.opt = "--plot";
}

/* Apply one recognised option's value. */
static int apply_option(const char *name, const char *v, bench_opts *o, const char **backends)
{
    int64_t n = 0;
    int rc;
    if (strcmp(name, "--shape") == 0)
        return parse_shape(v, o);
    if (strcmp(name, "--tokens") == 0)
        return parse_tokens(v, o);
    if (strcmp(name, "--backends") == 0) {
        *backends = v; /* checked after the loop, once */
        return 0;
    }
    if (strcmp(name, "--dtype") == 0)
        return parse_dtype(v, o);
    if (strcmp(name, "--device") == 0)
        return parse_device(v, o);
    if (strcmp(name, "--seed") == 0)
        return parse_seed(v, o);
    if (strcmp(name, "--graph") == 0)
        return parse_graph(v, o);
    if (strcmp(name, "--reference") == 0)
        return parse_reference(v, o);
    if (strcmp(name, "--cache") == 0)
        return parse_cache(v, o);
    if (strcmp(name, "--backend-max-tokens") == 0) {
        o->backend_max_arg = v; /* checked after the loop, once */
        return 0;
    }
    if (strcmp(name, "--csv") == 0) {
        o->csv.path = v; /* checked after the loop, with --plot */
        return 0;
    }
    if (strcmp(name, "--plot") == 0) {
        o->plot.path = v;
        return 0;
    }
    if (strcmp(name, "--max-experts") == 0) {
        rc = parse_positive(name, v, INT32_MAX, &n);
        o->max_experts = rc ? 0 : n;
        return rc;
    }
    if (strcmp(name, "--threads") == 0) {
        rc = parse_positive(name, v, MAX_THREADS, &n);
        o->threads = rc ? 0 : (int)n;
        return rc;
    }
    /* --runs */
    rc = parse_positive(name, v, MAX_RUNS, &n);
    if (rc)
        return rc;
    if (n < MIN_RUNS)
        return usage_error("--runs: %lld is too few; at least %d timed runs are needed",
                           (long long)n, MIN_RUNS);
    o->runs = (int)n;
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const char *const names[] = {"--shape",   "--tokens",      "--backends", "--dtype",
                                        "--device",  "--max-experts", "--threads",  "--runs",
                                        "--csv",     "--plot",        "--seed",
                                        "--graph",   "--backend-max-tokens", "--reference",
                                        "--cache"};
    enum { NUM_NAMES = sizeof names / sizeof names[0] };
    int given[NUM_NAMES] = {0};
    const char *backends = DEFAULT_BACKENDS;
    default_options(o);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return PARSE_HELP;
        int matched = 0, rc = 0;
        for (int k = 0; k < NUM_NAMES && !matched; k++) {
            const char *v;
            if (!match_option(argc, argv, &i, names[k], &v, &rc))
                continue;
            matched = 1;
            if (!rc && given[k]++)
                rc = usage_error("%s is given more than once", names[k]);
            if (!rc)
                rc = apply_option(names[k], v, o, &backends);
        }
        if (!matched)
            return usage_error("unknown argument \"%s\"", argv[i]);
        if (rc)
            return rc;
    }
    if (!o->shape)
        return usage_error("--shape is required (qwen1.5-moe-a2.7b, qwen3-30b-a3b, "
                           "mixtral-8x7b, deepseek-v3 or gpt-oss-20b)");
    if (o->ntokens == 0)
        return usage_error("--tokens is required (e.g. --tokens 1,8,512)");
    int rc = check_outputs(o);
    if (rc)
        return rc;
    if (o->device.kind == MOEX_DEVICE_CPU && (o->graph == GRAPH_ON || o->graph == GRAPH_BOTH))
        return usage_error("--graph %s: graph capture needs --device cuda",
                           o->graph == GRAPH_ON ? "on" : "both");
    if (o->graph == GRAPH_DEFAULT)
        o->graph = o->device.kind == MOEX_DEVICE_CUDA ? GRAPH_BOTH : GRAPH_OFF;
    if (o->device.kind == MOEX_DEVICE_CPU && o->backend_max_arg)
        return usage_error("--backend-max-tokens applies to --device cuda only");
    rc = parse_backends(backends, o);
    if (!rc && o->backend_max_arg)
        rc = parse_backend_max(o->backend_max_arg, o);
    return rc;
}

#if MOEX_HAVE_CUDA
/* The largest T backend `name` may run (--backend-max-tokens, cuda only), else MAX_TOKENS. */
static int64_t backend_limit(const bench_opts *o, const char *name)
{
    for (int i = 0; i < o->nlimits; i++)
        if (strcmp(o->limit_names[i], name) == 0)
            return o->limit_tokens[i];
    return MAX_TOKENS;
}
#endif

/* ------------------------------------------------------------------ helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* EXIT_RUNTIME if a write to stdout has failed (main says so at exit): no use going on. */
static int stdout_failed(void)
{
    return cli_stdout_flush() ? EXIT_RUNTIME : 0;
}

/* A failed moex call: print its message; the caller exits 1. */
static int moex_failed(const char *what, moex_status s)
{
    const char *msg = moex_last_error();
    fprintf(stderr, "moex bench: %s failed: %s\n", what, (msg && *msg) ? msg : moex_status_str(s));
    return EXIT_RUNTIME;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A seed for one independent stream of random numbers. */
static uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = seed;
    uint64_t h = splitmix64(&s);
    s = h ^ a;
    h = splitmix64(&s);
    s = h ^ b;
    h = splitmix64(&s);
    s = h ^ c;
    return splitmix64(&s);
}

/* n standard normal floats times scale, by Box-Muller. */
static void fill_normal_f32(float *x, size_t n, float scale, uint64_t state)
{
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = splitmix64(&state);
        float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777216.0f); /* (0, 1] */
        float u2 = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
        float rad = sqrtf(-2.0f * logf(u1)) * scale;
        x[i] = rad * cosf(6.2831853f * u2);
        if (i + 1 < n)
            x[i + 1] = rad * sinf(6.2831853f * u2);
    }
}

/*
 * Box-Muller costs ~10 ns a value here, minutes for a large layer. Weights and
 * hidden states are instead drawn uniformly, with replacement, from a pool of
 * NORMAL_POOL exact N(0,1) values (one random 16-bit index each): the same
 * distribution, about ten times faster.
 */
enum { NORMAL_POOL_BITS = 16, NORMAL_POOL = 1 << NORMAL_POOL_BITS };

static void fill_from_pool(float *x, size_t n, const float *pool, float scale, uint64_t state)
{
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = splitmix64(&state);
        for (size_t j = 0; j < 4 && i + j < n; j++, r >>= NORMAL_POOL_BITS)
            x[i + j] = pool[r & (NORMAL_POOL - 1)] * scale;
    }
}

/*
 * n values ~ N(0,1) times scale, stored as dtype in dst. Chunked and parallel
 * over `threads`; each chunk has its own stream, so the values do not depend
 * on the thread count.
 */
static int fill_normal_range(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed,
                             size_t first_chunk, int threads);

static int fill_normal(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed,
                       int threads)
{
    return fill_normal_range(dst, dtype, n, scale, seed, 0, threads);
}

/*
 * The same values as elements [first_chunk * FILL_CHUNK, ... + n) of a fill_normal() of a
 * longer array: lets a large array be made and uploaded in pieces.
 */
static int fill_normal_range(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed,
                             size_t first_chunk, int threads)
{
    size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK, esize = moex_dtype_size(dtype);
    float *pool = malloc(NORMAL_POOL * sizeof(float));
    if (!pool) {
        fprintf(stderr, "moex bench: out of memory for random numbers\n");
        return EXIT_RUNTIME;
    }
    fill_normal_f32(pool, NORMAL_POOL, 1.0f, stream_seed(seed, UINT64_MAX, 0, 0));
    int failed = 0;
    char msg[256] = "";
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t c = 0; c < chunks; c++) {
        float tmp[FILL_CHUNK];
        size_t off = c * FILL_CHUNK, len = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        fill_from_pool(tmp, len, pool, scale, stream_seed(seed, first_chunk + c, 0, 0));
        moex_status s = moex_convert(tmp, MOEX_F32, (char *)dst + off * esize, dtype, len);
        if (s != MOEX_OK) {
#pragma omp critical(bench_fill_error)
            {
                if (!failed)
                    snprintf(msg, sizeof msg, "%s", moex_last_error());
                failed = 1;
            }
        }
    }
    free(pool);
    if (failed)
        fprintf(stderr, "moex bench: moex_convert failed: %s\n", msg);
    return failed ? EXIT_RUNTIME : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Bytes of memory available now (MemAvailable), or 0 if unknown. */
static double mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024.0;
}

/* The CPU's model name from /proc/cpuinfo, else moex's name for the device; quotes removed. */
static void read_cpu_model(const moex_device_info *cpu, char *buf, size_t size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    size_t n = strnlen(cpu->name, sizeof cpu->name); /* a bounded copy: buf and cpu may share a struct */
    if (n >= size)
        n = size - 1;
    memmove(buf, cpu->name, n);
    buf[n] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon += 1 + strspn(colon + 1, " \t");
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(buf, size, "%s", colon);
            break;
        }
    }
    if (f)
        fclose(f);
    for (char *p = buf; *p; p++)
        if (*p == '"' || *p == ',')
            *p = ' ';
}

/* Size in bytes of the largest CPU cache (sysfs), or 0 if unknown. */
static size_t largest_cache_bytes(void)
{
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            size_t b = v * (unit == 'K' ? 1024ul : unit == 'M' ? 1048576ul : 1ul);
            best = b > best ? b : best;
        }
        fclose(f);
    }
    return best;
}

/* CPU time of the whole machine (/proc/stat) and of this process, in seconds. */
typedef struct cpu_sample {
    double busy, total, self;
    int ok;
} cpu_sample;

static cpu_sample sample_cpu(void)
{
    cpu_sample c = {0.0, 0.0, 0.0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    long hz = sysconf(_SC_CLK_TCK);
    struct rusage ru;
    if (f && hz > 0 &&
        fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6], &v[7]) == 8 &&
        getrusage(RUSAGE_SELF, &ru) == 0) {
        /* user nice system idle iowait irq softirq steal: steal counts as busy (another guest) */
        double idle = (double)(v[3] + v[4]);
        double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        c.busy = busy / hz;
        c.total = (busy + idle) / hz;
        c.self = (double)ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec +
                 (double)ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec;
        c.ok = 1;
    }
    if (f)
        fclose(f);
    return c;
}

/* Share of the CPU time between a and b used by others (processes, hypervisor); NaN: unknown. */
static double other_cpu_share(cpu_sample a, cpu_sample b)
{
    double total = b.total - a.total;
    if (!a.ok || !b.ok || total <= 0.0)
        return NAN;
    double other = (b.busy - a.busy) - (b.self - a.self);
    return other > 0.0 ? other / total : 0.0;
}

/* ------------------------------------------------------------------ the run */

typedef struct case_result {
    double ms, gflops, weight_gbps, max_abs_err, gemm_frac, bw_frac;
    double read_floor_ms, floor_frac; /* cuda: the token count's read floor, and it over ms; else NaN */
    int state; /* CASE_RAN, or why not (cuda only) */
} case_result;

enum { CASE_RAN = 0, CASE_OVER_LIMIT = 1, CASE_FAILED = 2, CASE_NOT_CAPTURED = 3 };

/* Everything one bench owns; freed by state_free(). */
typedef struct bench_state {
    const bench_opts *o;
    moex_device_info cpu;
    char cpu_model[96];
    int threads;
    int64_t experts, top_k, hidden, intermediate;
    size_t esize;           /* bytes per element of o->dtype */
    double bytes_per_expert;
    double flops_per_pair;  /* per (token, expert) pair */
    double gemm_gflops, read_gbps; /* NAN when not measured */
    int ceilings_low;
    double other_share;     /* other processes' share of the CPU during the run (NaN: unknown) */
    void *gate_up, *down, *gate_up_bias, *down_bias;
    void *gate_up_codes, *down_codes, *gate_up_scales, *down_scales; /* quantized weights */
    moex_layer *layer;
    moex_context *ctx;
    int eager_index;        /* position of "eager" in o->backends, or -1 */
    float *flush;           /* a buffer larger than the last-level cache */
    size_t flush_n;
    case_result *results;   /* [ntokens][nvariants]; a variant is (backend, graph) */
    int ngraph;             /* graph settings per backend: 1 (cpu, --graph on/off) or 2 */
    int graph_first;        /* the graph setting of variant 0 (0 or 1) */
    struct bench_state *next; /* the state of the next --dtype of this run, or NULL */
    /* cuda */
    int cuda;               /* 1 on --device cuda */
    moex_device_info gpu;
    double gpu_bf16_tflops, gpu_fp8_tflops, gpu_read_gbps; /* NAN when not measured */
    void *d_gate_up, *d_down, *d_gate_up_bias, *d_down_bias;
    moex_context *bctx[MAX_BACKENDS + 1]; /* one per backend (sized by its token limit); last: eager reference */
    int prepare_failed[MAX_BACKENDS];
#if MOEX_HAVE_CUDA
    bench_cuda_timer *timer;
#endif
} bench_state;

/* Variants: (backend, graph) pairs, graph varying fastest. On the CPU, one per backend. */
static int nvariants(const bench_state *st)
{
    return st->o->nbackends * st->ngraph;
}

static int var_backend(const bench_state *st, int v)
{
    return v / st->ngraph;
}

static int var_graph(const bench_state *st, int v)
{
    return st->graph_first + v % st->ngraph;
}

/* The inputs of every run of one token count. */
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
    /* cuda: device copies, graph inputs, graphs, per-variant state */
    moex_device device;
    void *d_hidden, *d_ids, *d_weights; /* as hidden, ids, weights */
    void *d_outs;                        /* as outs */
    void *d_gx, *d_gids, *d_gw;          /* one run's inputs: what the graphs read */
    moex_graph *graphs[MAX_BACKENDS];
    int state[2 * MAX_BACKENDS];         /* CASE_* per variant */
} workload;

/* Everything but the results: the weights, the layer, the context and the flush buffer. */
static void state_release(bench_state *st)
{
#if MOEX_HAVE_CUDA
    bench_cuda_timer_free(st->timer);
    st->timer = NULL;
#endif
    for (int b = 0; b <= MAX_BACKENDS; b++) {
        moex_context_free(st->bctx[b]);
        st->bctx[b] = NULL;
    }
    if (st->o) {
        moex_device_free(st->o->device, st->d_gate_up);
        moex_device_free(st->o->device, st->d_down);
        moex_device_free(st->o->device, st->d_gate_up_bias);
        moex_device_free(st->o->device, st->d_down_bias);
    }
    st->d_gate_up = st->d_down = st->d_gate_up_bias = st->d_down_bias = NULL;
    moex_context_free(st->ctx);
    moex_layer_free(st->layer);
    free(st->gate_up);
    free(st->down);
    free(st->gate_up_bias);
    free(st->down_bias);
    free(st->gate_up_codes);
    free(st->down_codes);
    free(st->gate_up_scales);
    free(st->down_scales);
    free(st->flush);
    st->ctx = NULL;
    st->layer = NULL;
    st->gate_up = st->down = st->gate_up_bias = st->down_bias = NULL;
    st->gate_up_codes = st->down_codes = st->gate_up_scales = st->down_scales = NULL;
    st->flush = NULL;
}

static void state_free(bench_state *st)
{
    state_release(st);
    free(st->results);
    memset(st, 0, sizeof *st);
}

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
    if (w->device.kind == MOEX_DEVICE_CUDA) {
        moex_device_free(w->device, w->d_hidden);
        moex_device_free(w->device, w->d_ids);
        moex_device_free(w->device, w->d_weights);
        moex_device_free(w->device, w->d_outs);
        moex_device_free(w->device, w->d_gx);
        moex_device_free(w->device, w->d_gids);
        moex_device_free(w->device, w->d_gw);
    }
    memset(w, 0, sizeof *w);
}

/* Bytes one token count needs beyond the weights (inputs of every run, outputs, scratch). */
static double workload_bytes(const bench_state *st, int64_t T)
{
    const bench_opts *o = st->o;
    double runs = o->runs + WARMUP_RUNS, th = (double)T * (double)st->hidden;
    double tk = (double)T * (double)st->top_k;
    return runs * (th * st->esize + tk * (4.0 + st->esize)) + (nvariants(st) + 1) * th * st->esize +
           2.0 * th * 4.0 + (double)T * (double)st->experts * 4.0;
}

/* Refuse (exit 2) a run whose weights and inputs would not fit in the memory available. */
static int check_memory(const bench_state *st)
{
    const bench_opts *o = st->o;
    double avail = mem_available_bytes();
    if (avail <= 0.0)
        return 0;
    double budget = 0.85 * avail - (double)st->flush_n * 4.0 - (double)(1u << 30);
    double inputs = workload_bytes(st, o->tokens[o->ntokens - 1]);
    double weights = (double)st->experts * st->bytes_per_expert;
    if (weights + inputs <= budget)
        return 0;
    fprintf(stderr,
            "moex bench: %s with %lld experts needs %.1f GiB of %s weights and %.1f GiB of "
            "inputs at T=%lld, more than the %.1f GiB this machine has available (85%%, less "
            "the ceilings' buffer)",
            o->shape->name, (long long)st->experts, weights / 1073741824.0,
            weight_label(o), inputs / 1073741824.0,
            (long long)o->tokens[o->ntokens - 1], budget / 1073741824.0);
    long long fit = (long long)floor((budget - inputs) / st->bytes_per_expert);
    if (fit >= 1)
        fprintf(stderr, "; try --max-experts %lld\n", fit < st->experts ? fit : st->experts - 1);
    else
        fprintf(stderr, "; use fewer --tokens or a smaller --dtype\n");
    return EXIT_USAGE;
}

/* Every backend must be able to run on the CPU (a GPU-only one is a bad --backends value). */
static int check_backends_on_cpu(const bench_opts *o)
{
    for (int b = 0; b < o->nbackends; b++) {
        char why[256] = "";
        if (moex_backend_supports(o->backends[b], NULL, (moex_device){MOEX_DEVICE_CPU, 0}, why,
                                  sizeof why) != MOEX_OK)
            return usage_error("--backends: \"%s\" cannot run on the cpu: %s", o->backends[b],
                               *why ? why : moex_last_error());
    }
    return 0;
}

/* Device, threads, reduced experts, memory. Returns 0, 1 (device unavailable) or 2. */
#if MOEX_HAVE_CUDA
static int resolve_cuda(const bench_opts *o, bench_state *st);
#endif

/* What both devices resolve the same way: the host CPU, threads, the layer's sizes (after
 * --max-experts), the bytes and FLOPs per expert, the eager reference's position. */
static int resolve_sizes(const bench_opts *o, bench_state *st)
{
    moex_status s = moex_device_query((moex_device){MOEX_DEVICE_CPU, 0}, &st->cpu);
    if (s != MOEX_OK)
        return moex_failed("moex_device_query(cpu)", s);
    read_cpu_model(&st->cpu, st->cpu_model, sizeof st->cpu_model);
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

static int resolve(const bench_opts *o, bench_state *st)
{
    st->o = o;
    st->ngraph = 1;
    st->graph_first = 0;
    st->gpu_bf16_tflops = st->gpu_fp8_tflops = st->gpu_read_gbps = NAN;
    if (o->device.kind == MOEX_DEVICE_CUDA) {
        moex_status s = moex_device_query(o->device, &st->gpu);
        if (s != MOEX_OK)
            return moex_failed("moex_device_query(cuda)", s);
        if (!st->gpu.available) {
            fprintf(stderr, "moex bench: --device cuda:%d is not available: %s\n", o->device.index,
                    st->gpu.reason);
            return EXIT_RUNTIME;
        }
#if MOEX_HAVE_CUDA
        return resolve_cuda(o, st);
#else
        fprintf(stderr, "moex bench: --device cuda: %s is available, but this moex command was "
                        "built without its CUDA benchmark code; rebuild with CUDA\n",
                st->gpu.name);
        return EXIT_RUNTIME;
#endif
    }
    if (check_backends_on_cpu(o))
        return EXIT_USAGE;
    int rc = resolve_sizes(o, st);
    if (rc)
        return rc;
    size_t llc = largest_cache_bytes();
    size_t flush_bytes = 2 * llc > ((size_t)64 << 20) ? 2 * llc : ((size_t)64 << 20);
    st->flush_n = flush_bytes / sizeof(float);
    return check_memory(st);
}

static void print_banner(const bench_state *st)
{
    const bench_opts *o = st->o;
    printf("moex bench %s: %s  H=%lld I=%lld experts=%lld", moex_version(), o->shape->name,
           (long long)st->hidden, (long long)st->intermediate, (long long)st->experts);
    if (st->experts < o->shape->experts)
        printf(" (of %lld)", (long long)o->shape->experts);
    printf(" k=%lld%s  %s\n", (long long)st->top_k, o->shape->gptoss ? " (gpt-oss layout)" : "",
           weight_label(o));
    printf("cpu: %s, %d cores, moex %s kernels; threads=%d  runs=%d (+%d warm-up)  seed=%llu\n",
           st->cpu_model, st->cpu.cpu_cores, st->cpu.cpu_avx2 ? "avx2" : "portable", st->threads,
           o->runs, WARMUP_RUNS, (unsigned long long)o->seed);
    printf("timing: %s\n", o->warm ? "no cache flush; every run repeats one routing (--cache warm)"
                                    : "the last-level cache flushed before every forward; a fresh "
                                      "routing every run");
}

static int cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Print "expected" figures and the warning when threads is 1 or 2. */
static void compare_ceilings(bench_state *st)
{
    if (st->threads > 2 || !isfinite(st->gemm_gflops) || !isfinite(st->read_gbps))
        return;
    double gemm_ref = REF_SGEMM_GFLOPS_2T * st->threads / 2.0;
    double read_ref = st->threads == 1 ? REF_READ_GBPS_1T : REF_READ_GBPS_2T;
    printf("reference (BENCHMARKS.md, this machine, %d thread%s): sgemm %.0f GFLOP/s, read %.0f "
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

static int measure_ceilings(bench_state *st)
{
    char err[256];
    if (!cpu_has_avx2()) {
        fprintf(stderr, "moex bench: warning: this CPU has no AVX2; ceilings not measured, "
                        "fractions left empty\n");
        return 0;
    }
    fprintf(stderr, "moex bench: measuring ceilings (sgemm 2048^3, AVX2 read of 1 GiB) on %d "
                    "thread%s ...\n",
            st->threads, st->threads == 1 ? "" : "s");
    if (bench_ceiling_gemm(st->threads, &st->gemm_gflops, err, sizeof err) != 0 ||
        bench_ceiling_read(st->threads, &st->read_gbps, err, sizeof err) != 0) {
        fprintf(stderr, "moex bench: ceilings: %s\n", err);
        return EXIT_RUNTIME;
    }
    printf("ceilings: sgemm 2048^3 %.1f GFLOP/s, AVX2 read 1 GiB %.2f GB/s (%d thread%s)\n",
           st->gemm_gflops, st->read_gbps, st->threads, st->threads == 1 ? "" : "s");
    compare_ceilings(st);
    return 0;
}

static int alloc_bytes(void **p, double bytes, const char *what)
{
    *p = NULL;
    if (bytes > 0.0 && (bytes > (double)SIZE_MAX / 2 || !(*p = malloc((size_t)bytes)))) {
        fprintf(stderr, "moex bench: out of memory for %s (%.1f MiB)\n", what, bytes / 1048576.0);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* A 2- or 3-d weight view; E, a, b (b may be 0 for 2-d). */
static int weight_view(moex_tensor *t, void *data, moex_dtype dt, int64_t e, int64_t a, int64_t b)
{
    int64_t shape[3] = {e, a, b};
    moex_status s = moex_tensor_init(t, data, dt, b ? 3 : 2, shape);
    return s == MOEX_OK ? 0 : moex_failed("moex_tensor_init", s);
}

/* Random weights ~ N(0,1)/sqrt(fan_in) (biases too), the description and the layer. */
static int build_layer(bench_state *st)
{
    const bench_opts *o = st->o;
    int64_t E = st->experts, H = st->hidden, I = st->intermediate;
    double n_gu = (double)E * 2 * I * H, n_dn = (double)E * H * I;
    int gptoss = o->shape->gptoss, rc;
    fprintf(stderr, "moex bench: generating %lld experts of random %s weights (%.0f MiB) ...\n",
            (long long)E, weight_label(o),
            E * st->bytes_per_expert / 1048576.0);
    if ((rc = alloc_bytes(&st->gate_up, n_gu * st->esize, "gate_up")) ||
        (rc = alloc_bytes(&st->down, n_dn * st->esize, "down")) ||
        (gptoss && (rc = alloc_bytes(&st->gate_up_bias, (double)E * 2 * I * st->esize, "bias"))) ||
        (gptoss && (rc = alloc_bytes(&st->down_bias, (double)E * H * st->esize, "bias"))))
        return rc;
    float s_h = 1.0f / sqrtf((float)H), s_i = 1.0f / sqrtf((float)I);
    uint64_t sd = o->seed;
    if ((rc = fill_normal(st->gate_up, o->dtype, (size_t)n_gu, s_h, stream_seed(sd, 1, 0, 0),
                          st->threads)) ||
        (rc = fill_normal(st->down, o->dtype, (size_t)n_dn, s_i, stream_seed(sd, 2, 0, 0),
                          st->threads)) ||
        (gptoss && (rc = fill_normal(st->gate_up_bias, o->dtype, (size_t)(E * 2 * I), s_h,
                                     stream_seed(sd, 3, 0, 0), st->threads))) ||
        (gptoss && (rc = fill_normal(st->down_bias, o->dtype, (size_t)(E * H), s_i,
                                     stream_seed(sd, 4, 0, 0), st->threads))))
        return rc;

    moex_experts_desc d;
    moex_status s = moex_experts_desc_init(&d);
    if (s != MOEX_OK)
        return moex_failed("moex_experts_desc_init", s);
    d.num_experts = E;
    d.hidden = H;
    d.intermediate = I;
    d.top_k = st->top_k;
    d.gated = 1;
    if (o->quantized) { /* quantized experts are stored [E, out, in] */
        d.interleaved = gptoss;
        if (gptoss) {
            d.activation = MOEX_ACT_GPTOSS_CLAMP;
            if ((rc = weight_view(&d.gate_up_bias, st->gate_up_bias, o->dtype, E, 2 * I, 0)) ||
                (rc = weight_view(&d.down_bias, st->down_bias, o->dtype, E, H, 0)))
                return rc;
        }
        if ((rc = bench_quantize(st->gate_up, o->dtype, E, 2 * I, H, o->qformat, st->threads, &st->gate_up_codes,
                                 &st->gate_up_scales, &d.gate_up, &d.gate_up_scale)) ||
            (rc = bench_quantize(st->down, o->dtype, E, H, I, o->qformat, st->threads, &st->down_codes,
                                 &st->down_scales, &d.down, &d.down_scale)))
            return EXIT_RUNTIME;
        free(st->gate_up);
        free(st->down);
        st->gate_up = st->down = NULL;
        if (o->qformat == MOEX_QUANT_FP4) {
            d.block_n = 1;
            d.block_k = 32;
        }
    } else if (gptoss) {
        d.interleaved = 1;
        d.transposed = 1;
        d.activation = MOEX_ACT_GPTOSS_CLAMP;
        d.alpha = 1.702f;
        d.limit = 7.0f;
        if ((rc = weight_view(&d.gate_up, st->gate_up, o->dtype, E, H, 2 * I)) ||
            (rc = weight_view(&d.down, st->down, o->dtype, E, I, H)) ||
            (rc = weight_view(&d.gate_up_bias, st->gate_up_bias, o->dtype, E, 2 * I, 0)) ||
            (rc = weight_view(&d.down_bias, st->down_bias, o->dtype, E, H, 0)))
            return rc;
    } else {
        d.interleaved = 0;
        d.transposed = 0;
        d.activation = MOEX_ACT_SILU;
        if ((rc = weight_view(&d.gate_up, st->gate_up, o->dtype, E, 2 * I, H)) ||
            (rc = weight_view(&d.down, st->down, o->dtype, E, H, I)))
            return rc;
    }
    s = moex_layer_create(&d, &st->layer);
    return s == MOEX_OK ? 0 : moex_failed("moex_layer_create", s);
}

/* One context (threads, max_tokens = the largest T); prepare every backend, and eager. */
static int build_context(bench_state *st)
{
    const bench_opts *o = st->o;
    moex_context_options co = moex_context_default_options();
    co.device = (moex_device){MOEX_DEVICE_CPU, 0};
    co.num_threads = st->threads;
    co.max_tokens = o->tokens[o->ntokens - 1];
    moex_status s = moex_context_create(&co, &st->ctx);
    if (s != MOEX_OK)
        return moex_failed("moex_context_create", s);
    for (int b = 0; b <= o->nbackends; b++) {
        const char *name = b < o->nbackends ? o->backends[b] : "eager";
        if (b == o->nbackends && (st->eager_index >= 0 || !o->reference))
            break;
        s = moex_prepare(st->ctx, st->layer, name);
        if (s != MOEX_OK) {
            char what[NAME_LEN + 32];
            snprintf(what, sizeof what, "moex_prepare(%s)", name);
            return moex_failed(what, s);
        }
    }
    fprintf(stderr, "moex bench: context workspace %.1f MiB\n",
            moex_context_workspace_bytes(st->ctx) / 1048576.0);
    return 0;
}

/* A buffer twice the last-level cache, read between forwards so weights come from memory. */
static int alloc_flush(bench_state *st)
{
    if (alloc_bytes((void **)&st->flush, (double)st->flush_n * sizeof(float), "cache flush"))
        return EXIT_RUNTIME;
    for (size_t i = 0; i < st->flush_n; i++)
        st->flush[i] = (float)(i & 7);
    return 0;
}

/* Returns the sum read, so that the reads are kept. */
static float flush_caches(const bench_state *st)
{
    float total = 0.0f;
    const float *p = st->flush;
    long n = (long)st->flush_n;
#pragma omp parallel for schedule(static) reduction(+ : total) num_threads(st->threads)
    for (long i = 0; i < n; i += 16) /* one read per 64-byte line */
        total += p[i];
    return total;
}

/* Tensor views over run r's inputs and over an output buffer. */
static int views(const bench_state *st, const workload *w, int r, int out_slot, moex_tensor *x,
                 moex_tensor *ids, moex_tensor *wt, moex_tensor *out)
{
    int64_t T = w->tokens, H = st->hidden, k = st->top_k;
    int64_t th[2] = {T, H}, tk[2] = {T, k};
    moex_dtype dt = st->o->dtype;
    size_t ts = (size_t)(T * H) * st->esize;
    moex_status s;
    if ((s = moex_tensor_init(x, (char *)w->hidden + (size_t)r * ts, dt, 2, th)) != MOEX_OK ||
        (s = moex_tensor_init(ids, w->ids + (size_t)r * T * k, MOEX_I32, 2, tk)) != MOEX_OK ||
        (s = moex_tensor_init(wt, (char *)w->weights + (size_t)(r * T * k) * st->esize, dt, 2,
                              tk)) != MOEX_OK ||
        (s = moex_tensor_init(out, (char *)w->outs + (size_t)out_slot * ts, dt, 2, th)) !=
            MOEX_OK)
        return moex_failed("moex_tensor_init", s);
    return 0;
}

/* Routing r: random logits -> softmax top-k (renormalised) -> ids, weights; experts hit. */
static int make_routing(const bench_state *st, workload *w, int r, float *logits, char *seen)
{
    int64_t T = w->tokens, E = st->experts, k = st->top_k;
    fill_normal_f32(logits, (size_t)(T * E), 1.0f, stream_seed(st->o->seed, 5, (uint64_t)T,
                                                                  (uint64_t)r));
    moex_router_desc rd;
    moex_status s = moex_router_desc_init(&rd);
    if (s != MOEX_OK)
        return moex_failed("moex_router_desc_init", s);
    rd.kind = MOEX_ROUTER_SOFTMAX_TOPK;
    rd.num_experts = E;
    rd.top_k = k;
    rd.renormalize = 1;
    moex_tensor lt, x, ids, wt, out;
    int64_t te[2] = {T, E};
    if ((s = moex_tensor_init(&lt, logits, MOEX_F32, 2, te)) != MOEX_OK)
        return moex_failed("moex_tensor_init", s);
    if (views(st, w, r, 0, &x, &ids, &wt, &out))
        return EXIT_RUNTIME;
    if ((s = moex_route(&rd, &lt, &ids, &wt)) != MOEX_OK)
        return moex_failed("moex_route", s);
    memset(seen, 0, (size_t)E);
    int unique = 0;
    const int32_t *id = w->ids + (size_t)r * T * k;
    for (int64_t i = 0; i < T * k; i++) {
        if (id[i] >= 0 && id[i] < E && !seen[id[i]]) {
            seen[id[i]] = 1;
            unique++;
        }
    }
    w->unique[r] = unique;
    return 0;
}

/* Allocate and fill the inputs of every run of T tokens. */
static int make_workload(const bench_state *st, int64_t T, workload *w)
{
    const bench_opts *o = st->o;
    double th = (double)T * st->hidden, tk = (double)T * st->top_k;
    int rc;
    memset(w, 0, sizeof *w);
    w->tokens = T;
    w->count = o->runs + WARMUP_RUNS;
    float *logits = NULL;
    char *seen = NULL;
    if ((rc = alloc_bytes(&w->hidden, w->count * th * st->esize, "hidden states")) ||
        (rc = alloc_bytes((void **)&w->ids, w->count * tk * 4.0, "routings")) ||
        (rc = alloc_bytes(&w->weights, w->count * tk * st->esize, "routings")) ||
        (rc = alloc_bytes((void **)&w->unique, w->count * 8.0, "routings")) ||
        (rc = alloc_bytes(&w->outs, (nvariants(st) + 1) * th * st->esize, "outputs")) ||
        (rc = alloc_bytes((void **)&w->cmp_a, th * 4.0, "outputs")) ||
        (rc = alloc_bytes((void **)&w->cmp_b, th * 4.0, "outputs")) ||
        (rc = alloc_bytes((void **)&w->times, (double)nvariants(st) * o->runs * 8.0, "times")) ||
        (rc = alloc_bytes((void **)&logits, (double)T * st->experts * 4.0, "logits")) ||
        (rc = alloc_bytes((void **)&seen, (double)st->experts, "routings")))
        goto done;
    rc = fill_normal(w->hidden, o->dtype, (size_t)(w->count * th), 1.0f,
                     stream_seed(o->seed, 6, (uint64_t)T, 0), st->threads);
    for (int r = 0; !rc && r < w->count; r++)
        rc = make_routing(st, w, r, logits, seen);
done:
    free(logits);
    free(seen);
    return rc;
}

/* One forward of backend `name` on run r's inputs into output slot `slot`; seconds in *sec. */
static int forward(const bench_state *st, workload *w, const char *name, int r, int slot,
                   double *sec)
{
    moex_tensor x, ids, wt, out;
    if (views(st, w, r, slot, &x, &ids, &wt, &out))
        return EXIT_RUNTIME;
    if (!st->o->warm) {
        volatile float sink = flush_caches(st);
        (void)sink;
    }
    double t0 = now_s();
    moex_status s = moex_experts_forward(st->ctx, st->layer, name, &x, &ids, &wt, &out);
    *sec = now_s() - t0;
    if (s != MOEX_OK) {
        char what[NAME_LEN + 64];
        snprintf(what, sizeof what, "forward of %s at T=%lld", name, (long long)w->tokens);
        return moex_failed(what, s);
    }
    return 0;
}

/* max |out[slot] - out[ref]| over T x H, NaN if either has a NaN. */
static int max_abs_diff(const bench_state *st, workload *w, int slot, int ref, double *err)
{
    size_t n = (size_t)(w->tokens * st->hidden), ts = n * st->esize;
    moex_status s;
    if ((s = moex_convert((char *)w->outs + (size_t)slot * ts, st->o->dtype, w->cmp_a, MOEX_F32,
                          n)) != MOEX_OK ||
        (s = moex_convert((char *)w->outs + (size_t)ref * ts, st->o->dtype, w->cmp_b, MOEX_F32,
                          n)) != MOEX_OK)
        return moex_failed("moex_convert", s);
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

/* Errors of every backend against eager, on the first timed routing (run WARMUP_RUNS). */
static int case_errors(const bench_state *st, workload *w, case_result *row)
{
    int nb = st->o->nbackends, ref = st->eager_index;
    if (ref < 0 && !st->o->reference) {
        for (int b = 0; b < nb; b++)
            row[b].max_abs_err = NAN;
        return 0;
    }
    if (ref < 0) { /* eager is not timed: run it once, into the spare slot */
        double unused;
        ref = nb;
        if (forward(st, w, "eager", WARMUP_RUNS, ref, &unused))
            return EXIT_RUNTIME;
    }
    for (int b = 0; b < nb; b++)
        if (max_abs_diff(st, w, b, ref, &row[b].max_abs_err))
            return EXIT_RUNTIME;
    return 0;
}

static void progress(const bench_state *st, int ti, int b)
{
    const bench_opts *o = st->o;
    fprintf(stderr, "[%d/%d] %s T=%lld %s ...\n", ti * o->nbackends + b + 1,
            o->ntokens * o->nbackends, o->shape->name, (long long)o->tokens[ti], o->backends[b]);
}

/* The routing (and inputs) that run r uses: its own, or under --cache warm the first timed one. */
static int timed_routing(const bench_opts *o, int r)
{
    return o->warm ? WARMUP_RUNS : r;
}

/*
 * Interleaved runs: run r times every backend on routing r, the first one
 * rotating with r so that no backend always follows another's use of the
 * same experts. The last-level cache is flushed before every forward
 * (--cache warm: not flushed, and every run takes the routing of run WARMUP_RUNS).
 */
static int time_cases(const bench_state *st, int ti, workload *w)
{
    const bench_opts *o = st->o;
    int nb = o->nbackends;
    for (int r = 0; r < w->count; r++) {
        for (int j = 0; j < nb; j++) {
            int b = (r + j) % nb;
            double sec;
            if (r == 0)
                progress(st, ti, b);
            if (forward(st, w, o->backends[b], timed_routing(o, r), b, &sec))
                return EXIT_RUNTIME;
            if (r >= WARMUP_RUNS)
                w->times[b * o->runs + (r - WARMUP_RUNS)] = sec;
        }
        if (r == WARMUP_RUNS && case_errors(st, w, &st->results[ti * nb]))
            return EXIT_RUNTIME;
    }
    return 0;
}

/* Distinct experts hit, averaged over the timed runs. */
static double mean_unique(const bench_opts *o, const workload *w)
{
    double unique = 0.0;
    for (int r = WARMUP_RUNS; r < w->count; r++)
        unique += w->unique[timed_routing(o, r)];
    return unique / o->runs;
}

static void finish_row(const bench_state *st, const workload *w, int b, case_result *row)
{
    const bench_opts *o = st->o;
    double unique = mean_unique(o, w);
    double sec = median(&w->times[b * o->runs], o->runs);
    row->ms = 1e3 * sec;
    row->gflops = (double)w->tokens * st->top_k * st->flops_per_pair / sec / 1e9;
    row->weight_gbps = unique * st->bytes_per_expert / sec / 1e9;
    row->gemm_frac = row->gflops / st->gemm_gflops; /* NaN without ceilings */
    row->bw_frac = row->weight_gbps / st->read_gbps;
    row->read_floor_ms = row->floor_frac = NAN;
}

/* ------------------------------------------------------------------ table */

typedef struct table_widths {
    int shape, backend;
} table_widths;

static table_widths widths(const bench_opts *o)
{
    table_widths tw = {5, 7};
    int n = (int)strlen(o->shape->name);
    tw.shape = n > tw.shape ? n : tw.shape;
    for (int b = 0; b < o->nbackends; b++) {
        n = (int)strlen(o->backends[b]);
        tw.backend = n > tw.backend ? n : tw.backend;
    }
    return tw;
}

static void print_table_header(const bench_state *st)
{
    const bench_opts *o = st->o;
    table_widths tw = widths(o);
    if (st->cuda)
        printf("\n%-*s  %-*s  %5s  %6s  %10s  %9s  %8s  %9s  %9s  %7s  %10s\n", tw.shape, "shape",
               tw.backend, "backend", "graph", "T", "ms", "GFLOP/s", "GB/s", "err", "gemm_frac",
               "bw_frac", "floor_frac");
    else
        printf("\n%-*s  %-*s  %6s  %10s  %9s  %8s  %9s  %9s  %7s\n", tw.shape, "shape", tw.backend,
               "backend", "T", "ms", "GFLOP/s", "GB/s", "err", "gemm_frac", "bw_frac");
    fflush(stdout);
}

/* One column of a row: v in `width` characters, or "-" when not finite. */
static void print_fraction(double v, int width)
{
    if (isfinite(v))
        printf("  %*.3f", width, v);
    else
        printf("  %*s", width, "-");
}

static const char *case_state_text(int state)
{
    return state == CASE_OVER_LIMIT     ? "skipped (--backend-max-tokens)"
           : state == CASE_NOT_CAPTURED ? "not captured (see the message above)"
                                        : "failed (see the message above)";
}

static void print_row(const bench_state *st, int64_t T, int v, const case_result *r)
{
    const bench_opts *o = st->o;
    table_widths tw = widths(o);
    int b = var_backend(st, v);
    if (st->cuda) {
        printf("%-*s  %-*s  %5d  %6lld", tw.shape, o->shape->name, tw.backend, o->backends[b],
               var_graph(st, v), (long long)T);
        if (r->state != CASE_RAN) {
            printf("  %s\n", case_state_text(r->state));
            fflush(stdout);
            return;
        }
        printf("  %10.3f  %9.2f  %8.2f  %9.2e", r->ms, r->gflops, r->weight_gbps, r->max_abs_err);
    } else {
        printf("%-*s  %-*s  %6lld  %10.3f  %9.2f  %8.2f  %9.2e", tw.shape, o->shape->name,
               tw.backend, o->backends[b], (long long)T, r->ms, r->gflops, r->weight_gbps,
               r->max_abs_err);
    }
    print_fraction(r->gemm_frac, 9);
    print_fraction(r->bw_frac, 7);
    if (st->cuda)
        print_fraction(r->floor_frac, 10);
    printf("\n");
    fflush(stdout);
}

/* Everything for one token count: inputs, timed runs, rows. */
static int run_tokens(bench_state *st, int ti)
{
    const bench_opts *o = st->o;
    workload w;
    int rc = make_workload(st, o->tokens[ti], &w);
    if (!rc)
        rc = time_cases(st, ti, &w);
    for (int b = 0; !rc && b < o->nbackends; b++) {
        finish_row(st, &w, b, &st->results[ti * o->nbackends + b]);
        print_row(st, o->tokens[ti], b, &st->results[ti * o->nbackends + b]);
        rc = stdout_failed();
    }
    workload_free(&w);
    return rc;
}

/* ------------------------------------------------------------------ files */

typedef int (*file_writer)(FILE *f, const bench_state *st);

/* Run writer on f and close f: 0, or the errno of the first failure (EIO if none was set). */
static int write_and_close(FILE *f, file_writer writer, const bench_state *st, int sync)
{
    int e = 0;
    errno = 0;
    if (writer(f, st) != 0 || ferror(f))
        e = errno ? errno : EIO;
    errno = 0;
    if (!e && fflush(f) != 0)
        e = errno ? errno : EIO;
    if (!e && sync && fsync(fileno(f)) != 0)
        e = errno;
    errno = 0;
    if (fclose(f) != 0 && !e)
        e = errno ? errno : EIO;
    return e;
}

/*
 * Write out's file. A regular file (or a new one) goes through a temp file beside it, then a
 * rename: a failure leaves the old file, if any, as it was and no temp file behind. A device
 * or FIFO is written in place. Returns 0, or EXIT_RUNTIME after naming the file and the error.
 */
static int write_output(const out_file *out, file_writer writer, const bench_state *st)
{
    if (out->in_place) {
        FILE *f = fopen(out->target, "w");
        int e = f ? write_and_close(f, writer, st, 0) : errno;
        if (e) {
            fprintf(stderr, "moex bench: %s: cannot write \"%s\": %s\n", out->opt, out->path,
                    strerror(e));
            return EXIT_RUNTIME;
        }
        return 0;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out->target, (long)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "moex bench: %s: the path \"%s\" is too long\n", out->opt, out->path);
        return EXIT_RUNTIME;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "moex bench: %s: cannot create \"%s\": %s\n", out->opt, tmp,
                strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return EXIT_RUNTIME;
    }
    int e = write_and_close(f, writer, st, 1);
    if (!e && rename(tmp, out->target) != 0)
        e = errno;
    if (e) {
        fprintf(stderr, "moex bench: %s: cannot write \"%s\": %s\n", out->opt, out->path,
                strerror(e));
        unlink(tmp);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* A CSV field of ours never needs quoting except the CPU name, which goes in a # line. */
static void csv_number(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, ",%.6g", v);
    else
        fputs(isnan(v) ? ",nan" : v > 0 ? ",inf" : ",-inf", f);
}

static void csv_comments_cuda(FILE *f, const bench_state *st);

static void csv_comments(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    if (st->cuda) {
        csv_comments_cuda(f, st);
        return;
    }
    char host[256] = "unknown", date[32] = "unknown";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(f, "# ceiling gemm_gflops=%.2f read_gbps=%.2f\n", st->gemm_gflops, st->read_gbps);
    fprintf(f, "# machine=%s date=%s moex=%s experts=%lld\n", host, date, moex_version(),
            (long long)st->experts);
    fprintf(f, "# cpu=\"%s\" avx2=%d shape=%s hidden=%lld intermediate=%lld num_experts=%lld "
               "top_k=%lld runs=%d warmup=%d seed=%llu ceilings_low=%d other_cpu_share=%.3f "
               "cache=%s\n",
            st->cpu_model, st->cpu.cpu_avx2, o->shape->name, (long long)st->hidden,
            (long long)st->intermediate, (long long)o->shape->experts, (long long)st->top_k,
            o->runs, WARMUP_RUNS, (unsigned long long)o->seed, st->ceilings_low, st->other_share,
            o->warm ? "warm_one_routing" : "flushed");
}

/* The GPU run's comment lines: its ceilings first (line 1), then machine and case. */
static void csv_comments_cuda(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    char host[256] = "unknown", date[32] = "unknown", gpu[96];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(gpu, sizeof gpu, "%s", st->gpu.name);
    for (char *p = gpu; *p; p++)
        if (*p == '"' || *p == ',')
            *p = ' ';
    fprintf(f, "# ceiling gemm_bf16_tflops=%.2f gemm_fp8_tflops=%.2f read_gbps=%.2f "
               "(gemm_frac = GFLOP/s over the bf16 GEMM, bw_frac = GB/s over the read, floor_frac = "
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

static int write_csv(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    csv_comments(f, st);
    for (const bench_state *s = st->next; s; s = s->next) /* the later passes' own ceilings and load */
        fprintf(f, "# pass dtype=%s ceiling gemm_gflops=%.2f read_gbps=%.2f other_cpu_share=%.3f\n",
                weight_label(s->o), s->gemm_gflops, s->read_gbps, s->other_share);
    fputs("shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,"
          "max_abs_err,gemm_frac,bw_frac,read_floor_ms,floor_frac\n",
          f);
    int nv = nvariants(st);
    for (const bench_state *s = st; s; s = s->next)
    for (int ti = 0; ti < o->ntokens; ti++) {
        for (int v = 0; v < nv; v++) {
            const case_result *r = &s->results[ti * nv + v];
            fprintf(f, "%s,%s,%s,%s,%lld,%d,%lld,%d", o->shape->name,
                    o->backends[var_backend(st, v)], st->cuda ? "cuda" : "cpu",
                    weight_label(s->o), (long long)st->experts, st->cuda ? 0 : st->threads,
                    (long long)o->tokens[ti], var_graph(st, v));
            csv_number(f, r->ms);
            csv_number(f, r->gflops);
            csv_number(f, r->weight_gbps);
            csv_number(f, r->max_abs_err);
            csv_number(f, r->gemm_frac);
            csv_number(f, r->bw_frac);
            csv_number(f, r->read_floor_ms);
            csv_number(f, r->floor_frac);
            fputc('\n', f);
        }
    }
    for (const bench_state *s = st; st->cuda && s; s = s->next) /* why a row is empty */
        for (int ti = 0; ti < o->ntokens; ti++)
            for (int v = 0; v < nv; v++)
                if (s->results[ti * nv + v].state != CASE_RAN)
                    fprintf(f, "# empty row: %s %s graph=%d tokens=%lld: %s\n", o->backends[var_backend(st, v)],
                            weight_label(s->o), var_graph(st, v), (long long)o->tokens[ti],
                            case_state_text(s->results[ti * nv + v].state));
    return ferror(f) ? -1 : 0;
}

static int write_svg(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    int nv = nvariants(st), nt = o->ntokens, ns = 0;
    enum { MAX_SERIES = MAX_DTYPES * 2 * MAX_BACKENDS };
    double x[MAX_TOKEN_COUNTS], y[MAX_SERIES][MAX_TOKEN_COUNTS];
    svg_series series[MAX_SERIES];
    char names[MAX_SERIES][2 * NAME_LEN + 16], labels[MAX_DTYPES * (NAME_LEN + 4)] = "";
    for (int ti = 0; ti < nt; ti++)
        x[ti] = (double)o->tokens[ti];
    for (const bench_state *s = st; s; s = s->next) {
        size_t used = strlen(labels);
        snprintf(labels + used, sizeof labels - used, "%s%s", s == st ? "" : " vs ", weight_label(s->o));
        for (int v = 0; v < nv; v++, ns++) {
            for (int ti = 0; ti < nt; ti++) /* rows that did not run are NaN: skipped by the plot */
                y[ns][ti] = st->cuda && s->results[ti * nv + v].state != CASE_RAN ? NAN : s->results[ti * nv + v].ms;
            snprintf(names[ns], sizeof names[ns], "%s%s%s%s", o->backends[var_backend(st, v)], st->next ? " " : "",
                     st->next ? weight_label(s->o) : "", var_graph(st, v) ? " (CUDA graph)" : "");
            series[ns] = (svg_series){names[ns], nt, x, y[ns]};
        }
    }
    char title[256], subtitle[256];
    if (st->cuda)
        snprintf(title, sizeof title, "%s, %s, %s: time of one experts forward", o->shape->name, labels,
                 st->gpu.name);
    else
        snprintf(title, sizeof title, "%s, %s, %d thread%s: time of one experts forward", o->shape->name, labels,
                 st->threads, st->threads == 1 ? "" : "s");
    snprintf(subtitle, sizeof subtitle,
             "H=%lld I=%lld, %lld of %lld experts, top-%lld; median of %d runs, %s; moex %s",
             (long long)st->hidden, (long long)st->intermediate, (long long)st->experts,
             (long long)o->shape->experts, (long long)st->top_k, o->runs,
             o->warm ? "one routing, warm cache" : "fresh routing each, cache flushed", moex_version());
    svg_plot p = {title, subtitle, "tokens (T)", "time (ms)", ns, series};
    return svg_plot_write(f, &p);
}

/* The CSV and the plot, each written (or not) on its own; EXIT_RUNTIME if either failed. */
static int write_outputs(const bench_state *st)
{
    const out_file *files[2] = {&st->o->csv, &st->o->plot};
    file_writer writers[2] = {write_csv, write_svg};
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        if (!files[i]->path)
            continue;
        if (write_output(files[i], writers[i], st) == 0)
            fprintf(stderr, "moex bench: wrote %s\n", files[i]->path);
        else
            rc = EXIT_RUNTIME;
    }
    return rc;
}

/* ------------------------------------------------------------------ entry */

/* After the table: how much of the CPU other processes took while we measured. */
static void report_machine_load(bench_state *st, cpu_sample start)
{
    st->other_share = other_cpu_share(start, sample_cpu());
    if (!isfinite(st->other_share))
        return;
    printf("\nother processes used %.0f%% of the machine's CPU time during this run\n",
           100.0 * st->other_share);
    fflush(stdout);
    if (st->other_share > BUSY_MACHINE_SHARE) {
        const char *w = "WARNING: the machine was busy with other work: timings and ceilings "
                        "are unreliable; compare only rows of this run, or rerun on a quiet "
                        "machine.\n";
        printf("%s", w);
        fprintf(stderr, "moex bench: %s", w);
    }
}

#if MOEX_HAVE_CUDA
/* ------------------------------------------------------------------ cuda */

/* Figures of the H200 (BENCHMARKS.md, "Limits on the H200"); a ceiling 15% below warns. */
static const double REF_H200_BF16_TFLOPS = 789.0;
static const double REF_H200_FP8_TFLOPS = 1531.0;
static const double REF_H200_READ_GBPS = 4250.0;
/* Elements generated on the host and uploaded at a time (a multiple of FILL_CHUNK). */
static const size_t UPLOAD_CHUNK = (size_t)1 << 24;

static int cuda_tool_failed(const char *err)
{
    fprintf(stderr, "moex bench: %s\n", err);
    return EXIT_RUNTIME;
}

/* Every backend must be able to run on the GPU. */
static int check_backends_on_cuda(const bench_opts *o)
{
    for (int b = 0; b < o->nbackends; b++) {
        char why[256] = "";
        if (moex_backend_supports(o->backends[b], NULL, o->device, why, sizeof why) != MOEX_OK)
            return usage_error("--backends: \"%s\" cannot run on cuda:%d: %s", o->backends[b],
                               o->device.index, *why ? why : moex_last_error());
    }
    return 0;
}

/* Sizes, variants, host threads; the memory of the host and of the GPU. */
static int resolve_cuda(const bench_opts *o, bench_state *st)
{
    char err[256];
    if (check_backends_on_cuda(o))
        return EXIT_USAGE;
    int rc = resolve_sizes(o, st);
    if (rc)
        return rc;
    st->cuda = 1;
    st->ngraph = o->graph == GRAPH_BOTH ? 2 : 1;
    st->graph_first = o->graph == GRAPH_ON ? 1 : 0;

    /* host: the inputs of every run of the largest T, one upload chunk */
    int64_t Tmax = o->tokens[o->ntokens - 1];
    double host_need = workload_bytes(st, Tmax) + (double)UPLOAD_CHUNK * (4.0 + st->esize);
    double avail = mem_available_bytes();
    if (avail > 0.0 && host_need > 0.85 * avail) {
        fprintf(stderr, "moex bench: the inputs at T=%lld need %.1f GiB of host memory, more than "
                        "85%% of the %.1f GiB available; use fewer --tokens or --runs\n",
                (long long)Tmax, host_need / 1073741824.0, avail / 1073741824.0);
        return EXIT_USAGE;
    }
    /* GPU: weights, every run's inputs, outputs, graph inputs, the L2 flush buffer */
    double free_b = 0.0, total_b = 0.0;
    if (bench_cuda_memory(o->device.index, &free_b, &total_b, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    double th = (double)Tmax * st->hidden * st->esize, tk = (double)Tmax * st->top_k;
    double runs = o->runs + WARMUP_RUNS;
    double gpu_need = st->experts * st->bytes_per_expert + runs * (th + tk * (4.0 + st->esize)) +
                      (nvariants(st) + 2) * th + tk * (4.0 + st->esize) + (double)(512u << 20);
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

static void print_banner_cuda(const bench_state *st)
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

static int measure_ceilings_cuda(bench_state *st)
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
    st->gemm_gflops = 1e3 * st->gpu_bf16_tflops;
    st->read_gbps = st->gpu_read_gbps;
    printf("ceilings: cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s, cuBLASLt FP8 e4m3 GEMM 8192^3 %.1f "
           "TFLOP/s, device read of 4 GiB %.1f GB/s\n",
           st->gpu_bf16_tflops, st->gpu_fp8_tflops, st->gpu_read_gbps);
    if (strstr(st->gpu.name, "H200")) {
        printf("reference (BENCHMARKS.md, H200): bf16 GEMM %.0f TFLOP/s, FP8 GEMM %.0f TFLOP/s, "
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

/* n random elements (as fill_normal would make them) into new device memory, in pieces. */
static int upload_normal(const bench_state *st, void **dptr, double n, float scale, uint64_t seed,
                         const char *what)
{
    const bench_opts *o = st->o;
    size_t count = (size_t)n, bytes = count * st->esize;
    moex_status s = moex_device_alloc(o->device, bytes, dptr);
    if (s != MOEX_OK) {
        char w[96];
        snprintf(w, sizeof w, "moex_device_alloc (%s, %.0f MiB)", what, bytes / 1048576.0);
        return moex_failed(w, s);
    }
    void *host = NULL;
    int rc = alloc_bytes(&host, (double)UPLOAD_CHUNK * st->esize, what);
    for (size_t off = 0; !rc && off < count; off += UPLOAD_CHUNK) {
        size_t len = count - off < UPLOAD_CHUNK ? count - off : UPLOAD_CHUNK;
        rc = fill_normal_range(host, o->dtype, len, scale, seed, off / FILL_CHUNK, st->threads);
        if (!rc && (s = moex_memcpy((char *)*dptr + off * st->esize, o->device, host,
                                    (moex_device){MOEX_DEVICE_CPU, 0}, len * st->esize)) != MOEX_OK)
            rc = moex_failed("moex_memcpy (weights to the GPU)", s);
    }
    free(host);
    return rc;
}

/* A device weight view. */
static int weight_view_cuda(const bench_state *st, moex_tensor *t, void *data, int64_t e, int64_t a,
                            int64_t b)
{
    int rc = weight_view(t, data, st->o->dtype, e, a, b);
    t->device = st->o->device;
    return rc;
}

/* The same random weights as the CPU path, made in pieces and uploaded; the layer. */
static int build_layer_cuda(bench_state *st)
{
    const bench_opts *o = st->o;
    int64_t E = st->experts, H = st->hidden, I = st->intermediate;
    double n_gu = (double)E * 2 * I * H, n_dn = (double)E * H * I;
    int gptoss = o->shape->gptoss, rc;
    float s_h = 1.0f / sqrtf((float)H), s_i = 1.0f / sqrtf((float)I);
    uint64_t sd = o->seed;
    fprintf(stderr, "moex bench: generating %lld experts of random %s weights (%.0f MiB) on "
                    "cuda:%d ...\n",
            (long long)E, moex_dtype_name(o->dtype), E * st->bytes_per_expert / 1048576.0,
            o->device.index);
    if ((rc = upload_normal(st, &st->d_gate_up, n_gu, s_h, stream_seed(sd, 1, 0, 0), "gate_up")) ||
        (rc = upload_normal(st, &st->d_down, n_dn, s_i, stream_seed(sd, 2, 0, 0), "down")) ||
        (gptoss && (rc = upload_normal(st, &st->d_gate_up_bias, (double)E * 2 * I, s_h,
                                       stream_seed(sd, 3, 0, 0), "bias"))) ||
        (gptoss && (rc = upload_normal(st, &st->d_down_bias, (double)E * H, s_i,
                                       stream_seed(sd, 4, 0, 0), "bias"))))
        return rc;
    moex_experts_desc d;
    moex_status s = moex_experts_desc_init(&d);
    if (s != MOEX_OK)
        return moex_failed("moex_experts_desc_init", s);
    d.num_experts = E;
    d.hidden = H;
    d.intermediate = I;
    d.top_k = st->top_k;
    d.gated = 1;
    if (gptoss) {
        d.interleaved = 1;
        d.transposed = 1;
        d.activation = MOEX_ACT_GPTOSS_CLAMP;
        d.alpha = 1.702f;
        d.limit = 7.0f;
        if ((rc = weight_view_cuda(st, &d.gate_up, st->d_gate_up, E, H, 2 * I)) ||
            (rc = weight_view_cuda(st, &d.down, st->d_down, E, I, H)) ||
            (rc = weight_view_cuda(st, &d.gate_up_bias, st->d_gate_up_bias, E, 2 * I, 0)) ||
            (rc = weight_view_cuda(st, &d.down_bias, st->d_down_bias, E, H, 0)))
            return rc;
    } else {
        d.activation = MOEX_ACT_SILU;
        if ((rc = weight_view_cuda(st, &d.gate_up, st->d_gate_up, E, 2 * I, H)) ||
            (rc = weight_view_cuda(st, &d.down, st->d_down, E, H, I)))
            return rc;
    }
    s = moex_layer_create(&d, &st->layer);
    return s == MOEX_OK ? 0 : moex_failed("moex_layer_create", s);
}

/* The largest of --tokens that backend `name` runs at, or 0 if none. */
static int64_t largest_tokens_for(const bench_opts *o, const char *name)
{
    int64_t lim = backend_limit(o, name), best = 0;
    for (int ti = 0; ti < o->ntokens; ti++)
        if (o->tokens[ti] <= lim)
            best = o->tokens[ti];
    return best;
}

/* One CUDA context per backend, sized for the largest T it runs (all on one stream); the
 * eager reference context when eager is not timed; the event timer on their stream. */
static int build_contexts_cuda(bench_state *st)
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
            return moex_failed("moex_context_create(cuda)", s);
        s = moex_prepare(ctx, st->layer, name);
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
        st->bctx[b < o->nbackends ? b : MAX_BACKENDS] = ctx;
        if (!stream && (s = moex_context_stream(ctx, &stream)) != MOEX_OK)
            return moex_failed("moex_context_stream", s);
    }
    if (!stream) {
        fprintf(stderr, "moex bench: no backend could be prepared on cuda:%d\n", o->device.index);
        return EXIT_RUNTIME;
    }
    if (bench_cuda_timer_create(o->device.index, stream, &st->timer, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    return 0;
}

/* Device views over run r's inputs (r < 0: the graph inputs) and output slot `slot`. */
static int views_cuda(const bench_state *st, const workload *w, int r, int slot, moex_tensor *x,
                      moex_tensor *ids, moex_tensor *wt, moex_tensor *out)
{
    int64_t T = w->tokens, H = st->hidden, k = st->top_k;
    int64_t th[2] = {T, H}, tk[2] = {T, k};
    moex_dtype dt = st->o->dtype;
    size_t ts = (size_t)(T * H) * st->esize, ks = (size_t)(T * k);
    void *px = r < 0 ? w->d_gx : (char *)w->d_hidden + (size_t)r * ts;
    void *pi = r < 0 ? w->d_gids : (char *)w->d_ids + (size_t)r * ks * 4;
    void *pw = r < 0 ? w->d_gw : (char *)w->d_weights + (size_t)r * ks * st->esize;
    moex_status s;
    if ((s = moex_tensor_init(x, px, dt, 2, th)) != MOEX_OK ||
        (s = moex_tensor_init(ids, pi, MOEX_I32, 2, tk)) != MOEX_OK ||
        (s = moex_tensor_init(wt, pw, dt, 2, tk)) != MOEX_OK ||
        (s = moex_tensor_init(out, (char *)w->d_outs + (size_t)slot * ts, dt, 2, th)) != MOEX_OK)
        return moex_failed("moex_tensor_init", s);
    x->device = ids->device = wt->device = out->device = st->o->device;
    return 0;
}

static int to_device(const bench_state *st, void **dst, const void *src, double bytes,
                     const char *what)
{
    moex_status s = moex_device_alloc(st->o->device, (size_t)bytes, dst);
    if (s != MOEX_OK)
        return moex_failed(what, s);
    if (src && bytes > 0 &&
        (s = moex_memcpy(*dst, st->o->device, src, (moex_device){MOEX_DEVICE_CPU, 0},
                         (size_t)bytes)) != MOEX_OK)
        return moex_failed(what, s);
    return 0;
}

/* The host workload, then every run's inputs uploaded once; outputs and graph inputs. */
static int make_workload_cuda(const bench_state *st, int64_t T, workload *w)
{
    int rc = make_workload(st, T, w);
    w->device = st->o->device;
    if (rc)
        return rc;
    double th = (double)T * st->hidden * st->esize, tk = (double)T * st->top_k;
    if ((rc = to_device(st, &w->d_hidden, w->hidden, w->count * th, "upload of hidden states")) ||
        (rc = to_device(st, &w->d_ids, w->ids, w->count * tk * 4.0, "upload of routings")) ||
        (rc = to_device(st, &w->d_weights, w->weights, w->count * tk * st->esize,
                        "upload of routings")) ||
        (rc = to_device(st, &w->d_outs, NULL, (nvariants(st) + 1) * th, "outputs on the GPU")) ||
        (rc = to_device(st, &w->d_gx, NULL, th, "graph inputs")) ||
        (rc = to_device(st, &w->d_gids, NULL, tk * 4.0, "graph inputs")) ||
        (rc = to_device(st, &w->d_gw, NULL, tk * st->esize, "graph inputs")))
        return rc;
    return 0;
}

static const char *variant_name(const bench_state *st, int v, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s", st->o->backends[var_backend(st, v)],
             var_graph(st, v) ? " (graph)" : "");
    return buf;
}

/* Which variants run at this T; capture one forward per backend for the graph variants. */
static void plan_variants_cuda(const bench_state *st, workload *w)
{
    const bench_opts *o = st->o;
    int nv = nvariants(st);
    for (int v = 0; v < nv; v++) {
        int b = var_backend(st, v);
        if (w->tokens > backend_limit(o, o->backends[b]))
            w->state[v] = CASE_OVER_LIMIT;
        else if (st->prepare_failed[b] || !st->bctx[b])
            w->state[v] = CASE_FAILED;
        else
            w->state[v] = CASE_RAN;
    }
    for (int v = 0; v < nv; v++) {
        if (w->state[v] != CASE_RAN || !var_graph(st, v))
            continue;
        int b = var_backend(st, v);
        moex_context *ctx = st->bctx[b];
        moex_tensor x, ids, wt, out;
        if (views_cuda(st, w, -1, v, &x, &ids, &wt, &out)) {
            w->state[v] = CASE_FAILED;
            continue;
        }
        moex_status s = moex_graph_begin(ctx);
        moex_status f = MOEX_OK, e = MOEX_OK;
        char msg[512] = "";
        if (s == MOEX_OK) {
            f = moex_experts_forward(ctx, st->layer, o->backends[b], &x, &ids, &wt, &out);
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
                snprintf(msg, sizeof msg, "%s",
                         moex_status_str(s != MOEX_OK ? s : f != MOEX_OK ? f : e));
            fprintf(stderr, "moex bench: %s at T=%lld could not be captured in a CUDA graph: %s\n",
                    o->backends[b], (long long)w->tokens, msg);
            moex_graph_free(w->graphs[b]);
            w->graphs[b] = NULL;
            w->state[v] = CASE_NOT_CAPTURED;
            (void)moex_context_synchronize(ctx); /* clear what the failed capture left */
        }
    }
}

/* Copy run r's inputs into the buffers the graphs read. */
static int stage_graph_inputs(const bench_state *st, workload *w, int r)
{
    moex_device d = st->o->device;
    size_t th = (size_t)(w->tokens * st->hidden) * st->esize, tk = (size_t)(w->tokens * st->top_k);
    moex_status s;
    if ((s = moex_memcpy(w->d_gx, d, (char *)w->d_hidden + (size_t)r * th, d, th)) != MOEX_OK ||
        (s = moex_memcpy(w->d_gids, d, (char *)w->d_ids + (size_t)r * tk * 4, d, tk * 4)) !=
            MOEX_OK ||
        (s = moex_memcpy(w->d_gw, d, (char *)w->d_weights + (size_t)r * tk * st->esize, d,
                         tk * st->esize)) != MOEX_OK)
        return moex_failed("moex_memcpy (graph inputs)", s);
    return 0;
}

/*
 * One timed forward of variant v on run r: (graph inputs staged,) L2 flushed and the stream
 * idle, start event, forward or graph replay, stop event. A moex failure marks the variant
 * failed (its rows stay empty) and the bench goes on; a CUDA timing failure ends it.
 */
static int forward_cuda(const bench_state *st, workload *w, int v, int r, int slot, double *sec)
{
    const bench_opts *o = st->o;
    char err[512], name[NAME_LEN + 16];
    int b = var_backend(st, v), g = var_graph(st, v);
    moex_context *ctx = st->bctx[b < o->nbackends ? b : MAX_BACKENDS];
    const char *backend = b < o->nbackends ? o->backends[b] : "eager";
    moex_tensor x, ids, wt, out;
    if (g && stage_graph_inputs(st, w, r))
        return EXIT_RUNTIME;
    if (!g && views_cuda(st, w, r, slot, &x, &ids, &wt, &out))
        return EXIT_RUNTIME;
    if (o->warm) { /* no flush; the stream idle all the same (graph inputs are copied on it) */
        moex_status idle = moex_context_synchronize(ctx);
        if (idle != MOEX_OK)
            return moex_failed("moex_context_synchronize (before the timed forward)", idle);
    } else if (bench_cuda_flush_l2(st->timer, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    if (bench_cuda_timer_start(st->timer, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    moex_status s = g ? moex_graph_launch(w->graphs[b], ctx)
                      : moex_experts_forward(ctx, st->layer, backend, &x, &ids, &wt, &out);
    double ms = NAN;
    if (bench_cuda_timer_stop(st->timer, &ms, err, sizeof err) != 0)
        return cuda_tool_failed(err);
    moex_status sync = moex_context_synchronize(ctx);
    if (s != MOEX_OK || sync != MOEX_OK) {
        fprintf(stderr, "moex bench: %s at T=%lld failed: %s\n",
                b < o->nbackends ? variant_name(st, v, name, sizeof name) : "eager (reference)",
                (long long)w->tokens, moex_last_error());
        if (v >= 0)
            w->state[v] = CASE_FAILED;
        *sec = NAN;
        return 0;
    }
    *sec = 1e-3 * ms;
    return 0;
}

/* Errors of every variant against eager on routing WARMUP_RUNS (outputs still on the GPU). */
static int case_errors_cuda(const bench_state *st, workload *w, case_result *row)
{
    const bench_opts *o = st->o;
    int nv = nvariants(st), ref = -1;
    size_t ts = (size_t)(w->tokens * st->hidden) * st->esize;
    for (int v = 0; v < nv && ref < 0; v++) /* eager, graph off if it ran */
        if (var_backend(st, v) == st->eager_index && w->state[v] == CASE_RAN)
            ref = v;
    if (ref < 0 && st->eager_index < 0 && st->bctx[MAX_BACKENDS] &&
        w->tokens <= backend_limit(o, "eager")) {
        /* eager is not timed: run it once on the reference context, into the spare slot */
        moex_tensor x, ids, wt, out;
        if (views_cuda(st, w, WARMUP_RUNS, nv, &x, &ids, &wt, &out))
            return EXIT_RUNTIME;
        moex_context *ctx = st->bctx[MAX_BACKENDS];
        moex_status s = moex_experts_forward(ctx, st->layer, "eager", &x, &ids, &wt, &out);
        if (s == MOEX_OK)
            s = moex_context_synchronize(ctx);
        if (s == MOEX_OK)
            ref = nv;
        else
            fprintf(stderr, "moex bench: eager (reference) at T=%lld failed: %s\n",
                    (long long)w->tokens, moex_last_error());
    }
    for (int v = 0; v <= nv; v++) {
        if ((v < nv && w->state[v] != CASE_RAN) || (v == nv && ref != nv))
            continue;
        moex_status s = moex_memcpy((char *)w->outs + (size_t)v * ts,
                                    (moex_device){MOEX_DEVICE_CPU, 0},
                                    (char *)w->d_outs + (size_t)v * ts, o->device, ts);
        if (s != MOEX_OK)
            return moex_failed("moex_memcpy (outputs to the host)", s);
    }
    for (int v = 0; v < nv; v++) {
        row[v].max_abs_err = NAN;
        if (ref >= 0 && w->state[v] == CASE_RAN && max_abs_diff(st, w, v, ref, &row[v].max_abs_err))
            return EXIT_RUNTIME;
    }
    return 0;
}

/* Interleaved as on the CPU: run r times every variant on routing r, the first rotating. */
static int time_cases_cuda(const bench_state *st, int ti, workload *w)
{
    const bench_opts *o = st->o;
    int nv = nvariants(st);
    char name[NAME_LEN + 16];
    for (int r = 0; r < w->count; r++) {
        for (int j = 0; j < nv; j++) {
            int v = (r + j) % nv;
            double sec;
            if (w->state[v] != CASE_RAN)
                continue;
            if (r == 0)
                fprintf(stderr, "[%d/%d] %s T=%lld %s ...\n", ti * nv + v + 1, o->ntokens * nv,
                        o->shape->name, (long long)o->tokens[ti],
                        variant_name(st, v, name, sizeof name));
            if (forward_cuda(st, w, v, timed_routing(o, r), v, &sec))
                return EXIT_RUNTIME;
            if (r >= WARMUP_RUNS && w->state[v] == CASE_RAN)
                w->times[v * o->runs + (r - WARMUP_RUNS)] = sec;
        }
        if (r == WARMUP_RUNS && case_errors_cuda(st, w, &st->results[ti * nv]))
            return EXIT_RUNTIME;
    }
    return 0;
}

/*
 * The read floor of one token count: one kernel reading, once, as many bytes as the forward
 * must (the gate/up and down weights of the mean number of distinct experts hit, taken from
 * the weights themselves), timed like the runs (after an L2 flush, or warm). At small token
 * counts it is well below the 4 GiB read ceiling's rate: the launch and the ramp of one short
 * kernel are part of it, as they are of every forward.
 */
static int read_floor_cuda(const bench_state *st, const workload *w, double *ms)
{
    double unique = mean_unique(st->o, w);
    double gu = unique * 2.0 * st->intermediate * st->hidden, dn = unique * st->hidden * st->intermediate;
    size_t gu_bytes = ((size_t)gu * st->esize) & ~(size_t)15, dn_bytes = ((size_t)dn * st->esize) & ~(size_t)15;
    char err[512];
    if (bench_cuda_read_floor(st->timer, st->d_gate_up, gu_bytes, st->d_down, dn_bytes, !st->o->warm, ms, err,
                              sizeof err))
        return cuda_tool_failed(err);
    return 0;
}

static int run_tokens_cuda(bench_state *st, int ti)
{
    const bench_opts *o = st->o;
    int nv = nvariants(st);
    workload w;
    memset(&w, 0, sizeof w);
    int rc = make_workload_cuda(st, o->tokens[ti], &w);
    double floor_ms = NAN;
    if (!rc) {
        plan_variants_cuda(st, &w);
        rc = time_cases_cuda(st, ti, &w);
    }
    if (!rc)
        rc = read_floor_cuda(st, &w, &floor_ms);
    for (int v = 0; !rc && v < nv; v++) {
        case_result *row = &st->results[ti * nv + v];
        double err = row->max_abs_err;
        if (w.state[v] == CASE_RAN) {
            finish_row(st, &w, v, row);
            row->max_abs_err = err;
            row->read_floor_ms = floor_ms;
            row->floor_frac = floor_ms / row->ms;
        } else {
            row->ms = row->gflops = row->weight_gbps = row->max_abs_err = NAN;
            row->gemm_frac = row->bw_frac = row->read_floor_ms = row->floor_frac = NAN;
        }
        row->state = w.state[v];
        print_row(st, o->tokens[ti], v, row);
        rc = stdout_failed();
    }
    workload_free(&w);
    return rc;
}

static void report_machine_load(bench_state *st, cpu_sample start);

static int run_bench_cuda(bench_state *st)
{
    const bench_opts *o = st->o;
    int rc;
    cpu_sample start = sample_cpu();
    print_banner_cuda(st);
    if ((rc = stdout_failed()) || (rc = measure_ceilings_cuda(st)) || (rc = stdout_failed()) ||
        (rc = build_layer_cuda(st)) || (rc = build_contexts_cuda(st)))
        return rc;
    if (alloc_bytes((void **)&st->results,
                    (double)o->ntokens * nvariants(st) * sizeof(case_result), "results"))
        return EXIT_RUNTIME;
    for (int i = 0; i < o->ntokens * nvariants(st); i++)
        st->results[i].max_abs_err = NAN;
    print_table_header(st);
    for (int ti = 0; ti < o->ntokens && !rc; ti++)
        rc = run_tokens_cuda(st, ti);
    if (rc)
        return rc;
    report_machine_load(st, start);
    return stdout_failed(); /* the outputs are written once every --dtype pass has run */
}
#endif /* MOEX_HAVE_CUDA */

static int run_bench(bench_state *st)
{
    const bench_opts *o = st->o;
    int rc;
#if MOEX_HAVE_CUDA
    if (st->cuda)
        return run_bench_cuda(st);
#endif
    cpu_sample start = sample_cpu();
    print_banner(st);
    if ((rc = stdout_failed()) || (rc = measure_ceilings(st)) || (rc = stdout_failed()) ||
        (rc = build_layer(st)) || (rc = build_context(st)) || (rc = alloc_flush(st)))
        return rc;
    if (alloc_bytes((void **)&st->results,
                    (double)o->ntokens * o->nbackends * sizeof(case_result), "results"))
        return EXIT_RUNTIME;
    print_table_header(st);
    for (int ti = 0; ti < o->ntokens && !rc; ti++)
        rc = run_tokens(st, ti);
    if (rc)
        return rc;
    report_machine_load(st, start);
    return stdout_failed();
}

int moex_cli_bench(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == PARSE_HELP) {
        print_usage(stdout);
        return EXIT_OK;
    }
    if (rc)
        return EXIT_USAGE;
    /* one pass per --dtype, each with its own weights (released before the next is built) */
    bench_opts opts[MAX_DTYPES];
    bench_state st[MAX_DTYPES];
    memset(st, 0, sizeof st);
    int n = o.ndtypes > 0 ? o.ndtypes : 1;
    for (int d = 0; d < n && !rc; d++) {
        opts[d] = o;
        if (o.ndtypes > 0)
            apply_dtype(o.dtypes[d], &opts[d]);
        rc = resolve(&opts[d], &st[d]);
        if (!rc)
            rc = run_bench(&st[d]);
        state_release(&st[d]);
        if (d > 0)
            st[d - 1].next = &st[d];
    }
    if (!rc)
        rc = write_outputs(&st[0]);
    for (int d = 0; d < n; d++)
        state_free(&st[d]);
    return rc;
}
