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
 */
#define _POSIX_C_SOURCE 200809L

#include "bench.h"

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
    const char *csv_path;
    const char *plot_path;
    uint64_t seed;
} bench_opts;

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
          "                    fp8, fp8-ue8m0 or fp4: quantized weights, bf16 activations;\n"
          "                    a list (bf16,fp8) runs the bench once per dtype in this run,\n"
          "                    into one table, CSV and plot\n"
          "  --device NAME     cpu (default; cuda is not benchmarked yet)\n"
          "  --max-experts N   use at most N experts (top-k becomes min(k, N))\n"
          "  --threads N       CPU threads (default: one per online core)\n"
          "  --runs N          timed runs per case, at least 10 (default 10),\n"
          "                    after 2 warm-up runs; the median is reported\n"
          "  --csv FILE        also write the results as CSV (ceilings on line 1)\n"
          "  --plot FILE.svg   also write an SVG plot of time against tokens\n"
          "  --seed S          seed of the weights and routings (default 1)\n"
          "  -h, --help        show this text\n"
          "\n"
          "Columns: ms = median time of one forward; GFLOP/s = 6*T*k*H*I/time;\n"
          "GB/s = unique experts hit * bytes per expert / time; err = max |out - eager|\n"
          "on the first timed routing; gemm_frac and bw_frac = GFLOP/s and GB/s over\n"
          "the ceilings.\n"
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
    int64_t v = 0;
    int ok = *s != '\0';
    for (const char *p = s; ok && *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
            ok = 0;
        else
            v = v * 10 + (*p - '0');
    }
    if (!ok || v < 1)
        return usage_error("%s: \"%s\" is not a positive integer", opt, s);
    if (v > max)
        return usage_error("%s: \"%s\" is too large (at most %lld)", opt, s, (long long)max);
    *out = v;
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

static int parse_seed(const char *s, bench_opts *o)
{
    uint64_t v = 0;
    int ok = *s != '\0';
    for (const char *p = s; ok && *p; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - d) / 10)
            ok = 0;
        else
            v = v * 10 + d;
    }
    if (!ok)
        return usage_error("--seed: \"%s\" is not an unsigned 64-bit integer", s);
    o->seed = v;
    return 0;
}

/* The directory that will hold `path` must exist and be writable; path is no directory. */
static int check_output_path(const char *opt, const char *path)
{
    if (*path == '\0')
        return usage_error("%s: \"%s\" is an empty file name", opt, path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return usage_error("%s: \"%s\" is a directory", opt, path);
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK | X_OK) != 0)
        return usage_error("%s: cannot write into the directory \"%s\"", opt, dir);
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
    if (strcmp(name, "--csv") == 0) {
        o->csv_path = v;
        return check_output_path(name, v);
    }
    if (strcmp(name, "--plot") == 0) {
        o->plot_path = v;
        return check_output_path(name, v);
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
                                        "--csv",     "--plot",        "--seed"};
    const char *backends = DEFAULT_BACKENDS;
    default_options(o);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return PARSE_HELP;
        int matched = 0, rc = 0;
        for (size_t k = 0; k < sizeof names / sizeof names[0] && !matched; k++) {
            const char *v;
            if (!match_option(argc, argv, &i, names[k], &v, &rc))
                continue;
            matched = 1;
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
    if (o->csv_path && o->plot_path && strcmp(o->csv_path, o->plot_path) == 0)
        return usage_error("--csv and --plot name the same file \"%s\"", o->csv_path);
    return parse_backends(backends, o);
}

/* ------------------------------------------------------------------ helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
static int fill_normal(void *dst, moex_dtype dtype, size_t n, float scale, uint64_t seed,
                       int threads)
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
        fill_from_pool(tmp, len, pool, scale, stream_seed(seed, c, 0, 0));
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
    snprintf(buf, size, "%s", cpu->name);
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
} case_result;

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
    case_result *results;   /* [ntokens][nbackends] */
    struct bench_state *next; /* the state of the next --dtype of this run, or NULL */
} bench_state;

/* The inputs of every run of one token count. */
typedef struct workload {
    int64_t tokens;
    int count;           /* warm-up + timed runs */
    void *hidden;        /* [count][T][H] dtype */
    int32_t *ids;        /* [count][T][k] */
    void *weights;       /* [count][T][k] dtype */
    double *unique;      /* [count] distinct experts hit */
    void *outs;          /* [nbackends + 1][T][H] dtype; the last is eager's reference */
    float *cmp_a, *cmp_b;/* [T][H] f32, for the error */
    double *times;       /* [nbackends][runs] seconds */
} workload;

/* Everything but the results: the weights, the layer, the context and the flush buffer. */
static void state_release(bench_state *st)
{
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
    memset(w, 0, sizeof *w);
}

/* Bytes one token count needs beyond the weights (inputs of every run, outputs, scratch). */
static double workload_bytes(const bench_state *st, int64_t T)
{
    const bench_opts *o = st->o;
    double runs = o->runs + WARMUP_RUNS, th = (double)T * (double)st->hidden;
    double tk = (double)T * (double)st->top_k;
    return runs * (th * st->esize + tk * (4.0 + st->esize)) + (o->nbackends + 1) * th * st->esize +
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
static int resolve(const bench_opts *o, bench_state *st)
{
    st->o = o;
    if (o->device.kind == MOEX_DEVICE_CUDA) {
        moex_device_info cuda;
        moex_status s = moex_device_query(o->device, &cuda);
        if (s != MOEX_OK)
            return moex_failed("moex_device_query(cuda)", s);
        if (!cuda.available) {
            fprintf(stderr, "moex bench: --device cuda:%d is not available: %s\n", o->device.index,
                    cuda.reason);
            return EXIT_RUNTIME;
        }
        fprintf(stderr, "moex bench: --device cuda: %s is available, but moex bench times only "
                        "the CPU so far (not supported yet by this build)\n",
                cuda.name);
        return EXIT_USAGE;
    }
    if (check_backends_on_cpu(o))
        return EXIT_USAGE;
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
    size_t llc = largest_cache_bytes();
    size_t flush_bytes = 2 * llc > ((size_t)64 << 20) ? 2 * llc : ((size_t)64 << 20);
    st->flush_n = flush_bytes / sizeof(float);
    st->gemm_gflops = st->read_gbps = st->other_share = NAN;
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
        if (b == o->nbackends && st->eager_index >= 0)
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
        (rc = alloc_bytes(&w->outs, (o->nbackends + 1) * th * st->esize, "outputs")) ||
        (rc = alloc_bytes((void **)&w->cmp_a, th * 4.0, "outputs")) ||
        (rc = alloc_bytes((void **)&w->cmp_b, th * 4.0, "outputs")) ||
        (rc = alloc_bytes((void **)&w->times, (double)o->nbackends * o->runs * 8.0, "times")) ||
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
    volatile float sink = flush_caches(st);
    (void)sink;
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

/*
 * Interleaved runs: run r times every backend on routing r, the first one
 * rotating with r so that no backend always follows another's use of the
 * same experts. The last-level cache is flushed before every forward.
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
            if (forward(st, w, o->backends[b], r, b, &sec))
                return EXIT_RUNTIME;
            if (r >= WARMUP_RUNS)
                w->times[b * o->runs + (r - WARMUP_RUNS)] = sec;
        }
        if (r == WARMUP_RUNS && case_errors(st, w, &st->results[ti * nb]))
            return EXIT_RUNTIME;
    }
    return 0;
}

static void finish_row(const bench_state *st, const workload *w, int b, case_result *row)
{
    const bench_opts *o = st->o;
    double unique = 0.0;
    for (int r = WARMUP_RUNS; r < w->count; r++)
        unique += w->unique[r];
    unique /= o->runs;
    double sec = median(&w->times[b * o->runs], o->runs);
    row->ms = 1e3 * sec;
    row->gflops = (double)w->tokens * st->top_k * st->flops_per_pair / sec / 1e9;
    row->weight_gbps = unique * st->bytes_per_expert / sec / 1e9;
    row->gemm_frac = row->gflops / st->gemm_gflops; /* NaN without ceilings */
    row->bw_frac = row->weight_gbps / st->read_gbps;
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

static void print_table_header(const bench_opts *o)
{
    table_widths tw = widths(o);
    printf("\n%-*s  %-*s  %6s  %10s  %9s  %8s  %9s  %9s  %7s\n", tw.shape, "shape", tw.backend,
           "backend", "T", "ms", "GFLOP/s", "GB/s", "err", "gemm_frac", "bw_frac");
    fflush(stdout);
}

static void print_fraction(double v)
{
    if (isfinite(v))
        printf("  %9.3f", v);
    else
        printf("  %9s", "-");
}

static void print_row(const bench_opts *o, int64_t T, int b, const case_result *r)
{
    table_widths tw = widths(o);
    printf("%-*s  %-*s  %6lld  %10.3f  %9.2f  %8.2f  %9.2e", tw.shape, o->shape->name, tw.backend,
           o->backends[b], (long long)T, r->ms, r->gflops, r->weight_gbps, r->max_abs_err);
    print_fraction(r->gemm_frac);
    if (isfinite(r->bw_frac))
        printf("  %7.3f\n", r->bw_frac);
    else
        printf("  %7s\n", "-");
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
        print_row(o, o->tokens[ti], b, &st->results[ti * o->nbackends + b]);
    }
    workload_free(&w);
    return rc;
}

/* ------------------------------------------------------------------ files */

typedef int (*file_writer)(FILE *f, const bench_state *st);

/* Write through a temp file next to path, then rename: a failure leaves nothing behind. */
static int write_atomically(const char *path, file_writer writer, const bench_state *st)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "moex bench: the path \"%s\" is too long\n", path);
        return EXIT_RUNTIME;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "moex bench: cannot create \"%s\": %s\n", tmp, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return EXIT_RUNTIME;
    }
    int bad = writer(f, st) != 0 || fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int saved = errno;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, "moex bench: cannot write \"%s\": %s\n", path,
                strerror(bad ? saved : errno));
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

static void csv_comments(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
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
               "top_k=%lld runs=%d warmup=%d seed=%llu ceilings_low=%d other_cpu_share=%.3f\n",
            st->cpu_model, st->cpu.cpu_avx2, o->shape->name, (long long)st->hidden,
            (long long)st->intermediate, (long long)o->shape->experts, (long long)st->top_k,
            o->runs, WARMUP_RUNS, (unsigned long long)o->seed, st->ceilings_low, st->other_share);
}

static int write_csv(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    csv_comments(f, st);
    for (const bench_state *s = st->next; s; s = s->next) /* the later passes' own ceilings and load */
        fprintf(f, "# pass dtype=%s ceiling gemm_gflops=%.2f read_gbps=%.2f other_cpu_share=%.3f\n",
                weight_label(s->o), s->gemm_gflops, s->read_gbps, s->other_share);
    fputs("shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,"
          "max_abs_err,gemm_frac,bw_frac\n",
          f);
    for (const bench_state *s = st; s; s = s->next)
    for (int ti = 0; ti < o->ntokens; ti++) {
        for (int b = 0; b < o->nbackends; b++) {
            const case_result *r = &s->results[ti * o->nbackends + b];
            fprintf(f, "%s,%s,cpu,%s,%lld,%d,%lld,0", o->shape->name, o->backends[b],
                    weight_label(s->o), (long long)st->experts, st->threads,
                    (long long)o->tokens[ti]);
            csv_number(f, r->ms);
            csv_number(f, r->gflops);
            csv_number(f, r->weight_gbps);
            csv_number(f, r->max_abs_err);
            csv_number(f, r->gemm_frac);
            csv_number(f, r->bw_frac);
            fputc('\n', f);
        }
    }
    return ferror(f) ? -1 : 0;
}

static int write_svg(FILE *f, const bench_state *st)
{
    const bench_opts *o = st->o;
    int nb = o->nbackends, nt = o->ntokens, ns = 0;
    double x[MAX_TOKEN_COUNTS], y[MAX_DTYPES * MAX_BACKENDS][MAX_TOKEN_COUNTS];
    svg_series series[MAX_DTYPES * MAX_BACKENDS];
    char names[MAX_DTYPES * MAX_BACKENDS][2 * NAME_LEN], labels[MAX_DTYPES * (NAME_LEN + 4)] = "";
    for (int ti = 0; ti < nt; ti++)
        x[ti] = (double)o->tokens[ti];
    for (const bench_state *s = st; s; s = s->next) {
        size_t used = strlen(labels);
        snprintf(labels + used, sizeof labels - used, "%s%s", s == st ? "" : " vs ", weight_label(s->o));
        for (int b = 0; b < nb; b++, ns++) {
            for (int ti = 0; ti < nt; ti++)
                y[ns][ti] = s->results[ti * nb + b].ms;
            snprintf(names[ns], sizeof names[ns], st->next ? "%s %s" : "%s", o->backends[b], weight_label(s->o));
            series[ns] = (svg_series){names[ns], nt, x, y[ns]};
        }
    }
    char title[256], subtitle[256];
    snprintf(title, sizeof title, "%s, %s, %d thread%s: time of one experts forward",
             o->shape->name, labels, st->threads, st->threads == 1 ? "" : "s");
    snprintf(subtitle, sizeof subtitle,
             "H=%lld I=%lld, %lld of %lld experts, top-%lld; median of %d runs, fresh routing "
             "each; moex %s",
             (long long)st->hidden, (long long)st->intermediate, (long long)st->experts,
             (long long)o->shape->experts, (long long)st->top_k, o->runs, moex_version());
    svg_plot p = {title, subtitle, "tokens (T)", "time (ms)", ns, series};
    return svg_plot_write(f, &p);
}

static int write_outputs(const bench_state *st)
{
    int rc = 0;
    if (st->o->csv_path && (rc = write_atomically(st->o->csv_path, write_csv, st)) == 0)
        fprintf(stderr, "moex bench: wrote %s\n", st->o->csv_path);
    if (!rc && st->o->plot_path && (rc = write_atomically(st->o->plot_path, write_svg, st)) == 0)
        fprintf(stderr, "moex bench: wrote %s\n", st->o->plot_path);
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

static int run_bench(bench_state *st)
{
    const bench_opts *o = st->o;
    int rc;
    cpu_sample start = sample_cpu();
    print_banner(st);
    fflush(stdout);
    if ((rc = measure_ceilings(st)) || (rc = build_layer(st)) || (rc = build_context(st)) ||
        (rc = alloc_flush(st)))
        return rc;
    if (alloc_bytes((void **)&st->results,
                    (double)o->ntokens * o->nbackends * sizeof(case_result), "results"))
        return EXIT_RUNTIME;
    print_table_header(o);
    for (int ti = 0; ti < o->ntokens && !rc; ti++)
        rc = run_tokens(st, ti);
    if (rc)
        return rc;
    report_machine_load(st, start);
    return 0;
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
