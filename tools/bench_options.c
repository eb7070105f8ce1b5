/*
 * bench_options.c — the command line of `moex bench`: its help text, every option parsed
 * and checked (a bad value is refused by name, exit 2, before anything is measured), and
 * the --csv/--plot files checked for being writable.
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with realpath */

#include "bench_options.h"
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(BENCH_PATH_MAX >= PATH_MAX, "out_file.target must hold a realpath()");

static const int MAX_THREADS = 4096;
static const char *const DEFAULT_BACKENDS = "eager,batched_mm,grouped_mm";

static const bench_shape SHAPES[] = {
    {"qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 0},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 0},
    {"mixtral-8x7b", 4096, 14336, 8, 2, 0},
    {"deepseek-v3", 7168, 2048, 256, 8, 0},
    {"gpt-oss-20b", 2880, 2880, 32, 4, 1},
};
enum { NUM_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

void bench_print_usage(FILE *f)
{
    fputs("usage: moex bench --shape NAME --tokens T1,T2,... [options]\n"
          "\n"
          "Times the experts layer of a named MoE shape through moex backends, on\n"
          "synthetic weights and a fresh random routing every run, and prints each\n"
          "case also as a fraction of ceilings measured in the same process\n"
          "(OpenBLAS sgemm 2048^3 and an AVX2 read of 1 GiB, on the same threads;\n"
          "a moex built without OpenBLAS leaves gemm_frac empty on the cpu).\n"
          "\n"
          "  --shape NAME      qwen1.5-moe-a2.7b, qwen3-30b-a3b, mixtral-8x7b,\n"
          "                    deepseek-v3 or gpt-oss-20b\n"
          "  --tokens LIST     token counts, e.g. 1,8,512\n"
          "  --backends LIST   backends, run interleaved (default eager,batched_mm,grouped_mm)\n"
          "  --dtype NAME      f32, f16 or bf16: weights and activations (default bf16);\n"
          "                    fp8, fp8-ue8m0 or fp4: quantized weights, bf16 activations;\n"
          "                    a list (bf16,fp8) runs the bench once per dtype in\n"
          "                    this run, into one table, CSV and plot\n"
          "  --device NAME     cpu (default), cuda or cuda:N; on cuda the weights and\n"
          "                    inputs live on the GPU, each forward is timed with CUDA\n"
          "                    events from an idle stream after an L2 flush, and the\n"
          "                    ceilings are cuBLAS bf16 GEMM 8192^3, cuBLASLt FP8 GEMM\n"
          "                    8192^3 and a device read of 4 GiB\n"
          "  --ep N            time each backend as an expert-parallel group of N ranks\n"
          "                    (1 to 64; the experts divided among them, the tokens too),\n"
          "                    a thread each, beside the same layer on one device in the\n"
          "                    same run (deepgemm_megamoe beside grouped_mm); on cuda\n"
          "                    --device cuda:N,M,... puts rank r on the (r mod count)-th\n"
          "                    GPU listed. The wall clock around every rank's forward\n"
          "                    and synchronisation, no cache flush, on both sides; one\n"
          "                    --dtype; not with --graph on/both, --plot, --cache,\n"
          "                    --skew, --reference or --backend-max-tokens\n"
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
          "  --skew S          uneven routing: each token's expert logits get S times a\n"
          "                    popularity drawn once per expert (N(0,1), from the seed),\n"
          "                    so that some experts get many more rows than others, as\n"
          "                    trained routers do; 0 (default) to 8\n"
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
int bench_usage_error(const char *fmt, ...)
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
        return bench_usage_error("%s: \"%s\" is too large (at most %lld)", opt, s, (long long)max);
    if (r != CLI_NUM_OK || v < 1)
        return bench_usage_error("%s: \"%s\" is not a positive integer", opt, s);
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
            return bench_usage_error("%s: \"%s\" has an empty item", opt, s);
        if (len >= NAME_LEN)
            return bench_usage_error("%s: \"%.*s\" is too long", opt, (int)len, p);
        if (n == max_items)
            return bench_usage_error("%s: \"%s\" has more than %d items", opt, s, max_items);
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
            return bench_usage_error("--tokens: %lld appears twice in \"%s\"", (long long)o->tokens[i],
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
            return bench_usage_error("--backends: \"%s\": %s", o->backends[i], moex_last_error());
        for (int j = 0; j < i; j++)
            if (strcmp(o->backends[i], o->backends[j]) == 0)
                return bench_usage_error("--backends: \"%s\" appears twice in \"%s\"", o->backends[i], s);
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
    return bench_usage_error("--shape: unknown shape \"%s\"; the shapes are: %s", s, names);
}

int bench_apply_dtype(const char *s, bench_opts *o)
{
    o->quantized = 0;
    if (strcmp(s, "f32") == 0 || strcmp(s, "f16") == 0 || strcmp(s, "bf16") == 0)
        return moex_dtype_parse(s, &o->dtype) == MOEX_OK
                   ? 0
                   : bench_usage_error("--dtype: \"%s\": %s", s, moex_last_error());
    if (moex_quant_format_parse(s, &o->qformat) == MOEX_OK) {
        o->quantized = 1;
        o->dtype = MOEX_BF16;
        return 0;
    }
    return bench_usage_error("--dtype: \"%s\" is not one of f32, f16, bf16, fp8, fp8-ue8m0, fp4", s);
}

static int parse_dtype(const char *s, bench_opts *o)
{
    int n = 0, rc = split_list("--dtype", s, o->dtypes, MAX_DTYPES, &n);
    for (int i = 0; !rc && i < n; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(o->dtypes[i], o->dtypes[j]) == 0)
                return bench_usage_error("--dtype: \"%s\" appears twice in \"%s\"", o->dtypes[i], s);
    for (int i = n - 1; !rc && i >= 0; i--) /* every name checked; the first one left in force */
        rc = bench_apply_dtype(o->dtypes[i], o);
    if (!rc)
        o->ndtypes = n;
    return rc;
}

const char *bench_weight_label(const bench_opts *o)
{
    return o->quantized ? moex_quant_format_name(o->qformat) : moex_dtype_name(o->dtype);
}

/* "cpu", "cuda", "cuda:N" or (with --ep, checked after the loop) "cuda:N,M,...". Whether CUDA
 * is usable is decided later (exit 1, not 2). */
static int parse_device(const char *s, bench_opts *o)
{
    if (strncmp(s, "cuda:", 5) == 0 && strchr(s, ',')) {
        char one[16];
        o->n_ep_gpus = 0;
        for (const char *p = s + 5;;) {
            const char *end = strchr(p, ',');
            const size_t len = end ? (size_t)(end - p) : strlen(p);
            int64_t idx = 0;
            if (len == 0 || len >= sizeof one)
                return bench_usage_error("--device: \"%s\" has an empty or overlong GPU index", s);
            memcpy(one, p, len);
            one[len] = '\0';
            if (strcmp(one, "0") != 0 && parse_positive("--device", one, 1023, &idx) != 0)
                return EXIT_USAGE;
            if (o->n_ep_gpus == MAX_EP_GPUS)
                return bench_usage_error("--device: \"%s\" lists more than %d GPUs", s, MAX_EP_GPUS);
            o->ep_gpus[o->n_ep_gpus++] = (int)idx;
            if (!end)
                break;
            p = end + 1;
        }
        o->device = (moex_device){MOEX_DEVICE_CUDA, o->ep_gpus[0]};
        return 0;
    }
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
    return bench_usage_error("--device: \"%s\" is not one of cpu, cuda, cuda:N", s);
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
        return bench_usage_error("--graph: \"%s\" is not one of off, on, both", s);
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
        return bench_usage_error("%s: \"%s\" is not one of %s, %s", opt, s, a, b);
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
            return bench_usage_error("--backend-max-tokens: \"%s\" is not NAME=T", items[i]);
        *eq = '\0';
        if (moex_backend_lookup(items[i]) != MOEX_OK)
            return bench_usage_error("--backend-max-tokens: \"%s\": %s", items[i], moex_last_error());
        for (int j = 0; j < i; j++)
            if (strcmp(o->limit_names[j], items[i]) == 0)
                return bench_usage_error("--backend-max-tokens: \"%s\" appears twice", items[i]);
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
        return bench_usage_error("--seed: \"%s\" is too large (at most %llu)", s,
                           (unsigned long long)UINT64_MAX);
    if (r != CLI_NUM_OK)
        return bench_usage_error("--seed: \"%s\" is not an unsigned 64-bit integer", s);
    o->seed = v;
    return 0;
}

static int parse_skew(const char *s, bench_opts *o)
{
    float v = 0.0f;
    if (cli_parse_float(s, &v) != CLI_NUM_OK || !(v >= 0.0f && v <= 8.0f))
        return bench_usage_error("--skew: \"%s\" is not a number from 0 to 8", s);
    o->skew = v;
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
        return bench_usage_error("%s: \"%s\" is an empty file name", opt, path);
    if (len >= sizeof f->target)
        return bench_usage_error("%s: \"%s\" is too long", opt, path);
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return bench_usage_error("%s: \"%s\" is a directory", opt, path);
    if (path[len - 1] == '/')
        return bench_usage_error("%s: \"%s\" names a directory, not a file", opt, path);
    snprintf(f->target, sizeof f->target, "%s", path);
    f->in_place = exists && !S_ISREG(st.st_mode);
    if (f->in_place) {
        if (access(path, W_OK) != 0)
            return bench_usage_error("%s: cannot write to \"%s\": %s", opt, path, strerror(errno));
        return 0;
    }
    struct stat lst;
    if (exists && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) && !realpath(path, f->target))
        return bench_usage_error("%s: cannot resolve \"%s\": %s", opt, path, strerror(errno));
    char dir[PATH_MAX];
    dir_of(f->target, dir, sizeof dir);
    if (access(dir, W_OK | X_OK) != 0)
        return bench_usage_error("%s: cannot write into the directory \"%s\"", opt, dir);
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
        return bench_usage_error("--csv \"%s\" and --plot \"%s\" name the same file", o->csv.path,
                           o->plot.path);
    struct stat out;
    if (fstat(STDOUT_FILENO, &out) != 0 || !S_ISREG(out.st_mode))
        return 0;
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (files[i]->path && stat(files[i]->target, &st) == 0 && st.st_dev == out.st_dev &&
            st.st_ino == out.st_ino)
            return bench_usage_error("%s \"%s\" is the file that stdout writes to", files[i]->opt,
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
        *rc = bench_usage_error("%s needs a value", name);
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
    if (strcmp(name, "--skew") == 0)
        return parse_skew(v, o);
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
    if (strcmp(name, "--ep") == 0) {
        rc = parse_positive(name, v, MAX_EP_RANKS, &n);
        o->ep = rc ? 0 : (int)n;
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
        return bench_usage_error("--runs: %lld is too few; at least %d timed runs are needed",
                           (long long)n, MIN_RUNS);
    o->runs = (int)n;
    return 0;
}

/* --ep and what it excludes (skew, reference, cache: whether those options were given). */
static int check_ep(bench_opts *o, int skew, int reference, int cache)
{
    if (!o->ep) {
        if (o->n_ep_gpus)
            return bench_usage_error("--device cuda:%d,...: a list of GPUs takes the ranks of --ep N", o->ep_gpus[0]);
        return 0;
    }
    const char *excluded = o->graph == GRAPH_ON || o->graph == GRAPH_BOTH ? "--graph on/both (an expert-parallel "
                                                                            "forward is not captured)"
                           : o->plot.path      ? "--plot"
                           : cache             ? "--cache"
                           : skew              ? "--skew"
                           : reference         ? "--reference"
                           : o->backend_max_arg ? "--backend-max-tokens"
                           : o->ndtypes > 1    ? "a list of --dtype (one dtype a run)"
                                               : NULL;
    if (excluded)
        return bench_usage_error("--ep %d does not take %s", o->ep, excluded);
    o->graph = GRAPH_OFF;
    return 0;
}

int bench_parse_args(int argc, char **argv, bench_opts *o)
{
    static const char *const names[] = {"--shape",   "--tokens",      "--backends", "--dtype",
                                        "--device",  "--max-experts", "--threads",  "--runs",
                                        "--csv",     "--plot",        "--seed",
                                        "--graph",   "--backend-max-tokens", "--reference",
                                        "--cache",   "--skew",        "--ep"};
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
                rc = bench_usage_error("%s is given more than once", names[k]);
            if (!rc)
                rc = apply_option(names[k], v, o, &backends);
        }
        if (!matched)
            return bench_usage_error("unknown argument \"%s\"", argv[i]);
        if (rc)
            return rc;
    }
    if (!o->shape)
        return bench_usage_error("--shape is required (qwen1.5-moe-a2.7b, qwen3-30b-a3b, "
                           "mixtral-8x7b, deepseek-v3 or gpt-oss-20b)");
    if (o->ntokens == 0)
        return bench_usage_error("--tokens is required (e.g. --tokens 1,8,512)");
    int rc = check_outputs(o);
    if (rc)
        return rc;
    int skew = 0, reference = 0, cache = 0;
    for (int k = 0; k < NUM_NAMES; k++) {
        skew |= given[k] && !strcmp(names[k], "--skew");
        reference |= given[k] && !strcmp(names[k], "--reference");
        cache |= given[k] && !strcmp(names[k], "--cache");
    }
    if ((rc = check_ep(o, skew, reference, cache)))
        return rc;
    if (o->device.kind == MOEX_DEVICE_CPU && (o->graph == GRAPH_ON || o->graph == GRAPH_BOTH))
        return bench_usage_error("--graph %s: graph capture needs --device cuda",
                           o->graph == GRAPH_ON ? "on" : "both");
    if (o->graph == GRAPH_DEFAULT)
        o->graph = o->device.kind == MOEX_DEVICE_CUDA ? GRAPH_BOTH : GRAPH_OFF;
    if (o->device.kind == MOEX_DEVICE_CPU && o->backend_max_arg)
        return bench_usage_error("--backend-max-tokens applies to --device cuda only");
    rc = parse_backends(backends, o);
    if (!rc && o->backend_max_arg)
        rc = parse_backend_max(o->backend_max_arg, o);
    return rc;
}

int64_t bench_backend_limit(const bench_opts *o, const char *name)
{
    for (int i = 0; i < o->nlimits; i++)
        if (strcmp(o->limit_names[i], name) == 0)
            return o->limit_tokens[i];
    return MAX_TOKENS;
}
