/* model_cmds.c — `moex generate`, `moex info` and `moex demo`. */
#include "model_cmds.h"
#include "chat_format.h"
#include "cli.h"
#include "ep_mpi.h"
#include "moex.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef MOEX_DEMO_MODEL
#define MOEX_DEMO_MODEL "tests/fixtures/qwen3_moe"
#endif

enum { MAX_PROMPTS = 64, MAX_PROMPT_LEN = 65536, MAX_EP = 64 };

typedef struct gen_args {
    const char *dir, *experts, *device, *dtype, *quantize;
    int dequantize;
    int32_t *prompts[MAX_PROMPTS];
    int64_t lens[MAX_PROMPTS];
    const char *texts[MAX_PROMPTS]; /* --prompt TEXT (or --prompt-file), tokenized once the options are read */
    int is_file[MAX_PROMPTS];
    int n, n_text, chat;
    moex_tokenizer *tok; /* the checkpoint's tokenizer.json, when there is one */
    moex_generate_options gen;
    int json, threads, no_decode_switch;
    int64_t warmup; /* untimed generations before the reported one */
    int64_t ep;     /* --ep N: ranks of an expert-parallel group in this process (0: none) */
    int ep_mpi;     /* --ep-mpi: this process is one rank of the MPI job's group */
    int gpus[MAX_EP], n_gpus; /* --device cuda[:N[,M ...]]: the GPUs' indices (rank r of --ep on gpus[r % n_gpus]) */
} gen_args;

static const char *usage_cmd = "moex"; /* "moex generate", "moex info" or "moex demo" */
static int fail(const char *what);

static int usage(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "%s: ", usage_cmd);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 2;
}

// A count or id: digits only, at most max.
static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out) {
    char most[32];
    switch (cli_parse_u64(s, max, out)) {
    case CLI_NUM_OK: return 0;
    case CLI_NUM_RANGE:
        snprintf(most, sizeof most, "%llu", (unsigned long long)max);
        fprintf(stderr, "%s: %s: \"%s\" is too large (at most %s)\n", usage_cmd, flag, s, most);
        return 2;
    default: return usage("%s: \"%s\" is not a non-negative integer", flag, s);
    }
}

static int parse_i64(const char *flag, const char *s, int64_t *out) {
    uint64_t v;
    int rc = parse_u64(flag, s, INT64_MAX, &v);
    if (!rc) *out = (int64_t)v;
    return rc;
}

// A finite float.
static int parse_f(const char *flag, const char *s, float *out) {
    switch (cli_parse_float(s, out)) {
    case CLI_NUM_OK: return 0;
    case CLI_NUM_RANGE: return usage("%s: \"%s\" is out of range", flag, s);
    case CLI_NUM_NONFINITE: return usage("%s: \"%s\" is not a finite number", flag, s);
    default: return usage("%s: \"%s\" is not a number", flag, s);
    }
}

// One item of --prompt-ids: a token id, digits only. 0 or an exit code.
static int parse_id(const char *s, const char *p, size_t len, int32_t *out) {
    char item[16];
    uint64_t v;
    if (len == 0) return usage("--prompt-ids: \"%s\" has an empty item%s", s, "");
    if (len < sizeof item) {
        memcpy(item, p, len);
        item[len] = '\0';
        if (cli_parse_u64(item, INT32_MAX, &v) == CLI_NUM_OK) {
            *out = (int32_t)v;
            return 0;
        }
    }
    fprintf(stderr, "%s: --prompt-ids: \"%s\": \"%.*s\" is not a token id (0 to %d)\n", usage_cmd, s,
            (int)(len > 40 ? 40 : len), p, INT32_MAX);
    return 2;
}

// "1,2,3" -> a new prompt.
static int parse_prompt(gen_args *a, const char *s) {
    if (a->n == MAX_PROMPTS) return usage("--prompt-ids: more than %s prompts%s", "64", "");
    if (!*s) return usage("--prompt-ids: \"%s\" is empty%s", s, "");
    int32_t *ids = malloc(sizeof(int32_t) * MAX_PROMPT_LEN);
    if (!ids) return usage("out of memory%s%s", "", "");
    int64_t n = 0;
    int rc = 0;
    for (const char *p = s; !rc;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n == MAX_PROMPT_LEN) rc = usage("--prompt-ids: \"%.40s...\" has more than %s ids", s, "65536");
        else rc = parse_id(s, p, len, &ids[n++]);
        if (!comma) break;
        p = comma + 1;
    }
    if (rc) {
        free(ids);
        return rc;
    }
    a->prompts[a->n] = ids;
    a->lens[a->n++] = n;
    return 0;
}

enum { FOR_GENERATE = 1, FOR_INFO = 2 };

/* Every option of generate and info: whether it takes a value, and which commands take it. */
static const struct gen_option {
    const char *name;
    int value;
    int commands;
} GEN_OPTIONS[] = {
    {"--prompt-ids", 1, FOR_GENERATE},  {"--max-new-tokens", 1, FOR_GENERATE},
    {"--prompt", 1, FOR_GENERATE},      {"--prompt-file", 1, FOR_GENERATE},
    {"--chat", 0, FOR_GENERATE},
    {"--experts", 1, FOR_GENERATE | FOR_INFO}, {"--device", 1, FOR_GENERATE | FOR_INFO},
    {"--dtype", 1, FOR_GENERATE},       {"--temperature", 1, FOR_GENERATE},
    {"--top-k", 1, FOR_GENERATE},       {"--top-p", 1, FOR_GENERATE},
    {"--seed", 1, FOR_GENERATE},        {"--threads", 1, FOR_GENERATE},
    {"--ignore-eos", 0, FOR_GENERATE},  {"--no-decode-switch", 0, FOR_GENERATE},
    {"--cuda-graph", 0, FOR_GENERATE},  {"--warmup", 1, FOR_GENERATE},
    {"--json", 0, FOR_GENERATE},        {"--logits", 0, FOR_GENERATE},
    {"--quantize", 1, FOR_GENERATE},    {"--dequantize", 0, FOR_GENERATE},
    {"--ep", 1, FOR_GENERATE},          {"--ep-mpi", 0, FOR_GENERATE},
};
enum { NUM_GEN_OPTIONS = sizeof GEN_OPTIONS / sizeof GEN_OPTIONS[0] };

// Apply option f (known, taken by this command) with value v (NULL for a switch).
static int apply_gen_option(gen_args *a, const char *f, const char *v) {
    if (!strcmp(f, "--json")) a->json = 1;
    else if (!strcmp(f, "--logits")) a->gen.want_logits = 1;
    else if (!strcmp(f, "--ignore-eos")) a->gen.ignore_eos = 1;
    else if (!strcmp(f, "--no-decode-switch")) a->no_decode_switch = 1;
    else if (!strcmp(f, "--cuda-graph")) a->gen.cuda_graph = 1;
    else if (!strcmp(f, "--dequantize")) a->dequantize = 1;
    else if (!strcmp(f, "--chat")) a->chat = 1;
    else if (!strcmp(f, "--ep-mpi")) a->ep_mpi = 1;
    else if (!strcmp(f, "--prompt-ids")) return parse_prompt(a, v);
    else if (!strcmp(f, "--prompt") || !strcmp(f, "--prompt-file")) {
        if (a->n == MAX_PROMPTS) return usage("%s: more than %s prompts", f, "64");
        a->texts[a->n] = v, a->is_file[a->n] = f[8] == '-';
        a->prompts[a->n] = NULL, a->lens[a->n++] = 0, a->n_text++;
    }
    else if (!strcmp(f, "--max-new-tokens")) return parse_i64(f, v, &a->gen.max_new_tokens);
    else if (!strcmp(f, "--warmup")) {
        int rc = parse_i64(f, v, &a->warmup);
        if (!rc && a->warmup > 100) rc = usage("--warmup: \"%s\" is more than 100%s", v, "");
        return rc;
    } else if (!strcmp(f, "--ep")) {
        int rc = parse_i64(f, v, &a->ep);
        if (!rc && (a->ep < 1 || a->ep > MAX_EP)) rc = usage("--ep: \"%s\" is not 1 to %s ranks", v, "64");
        return rc;
    } else if (!strcmp(f, "--experts")) a->experts = v;
    else if (!strcmp(f, "--device")) a->device = v;
    else if (!strcmp(f, "--dtype")) a->dtype = v;
    else if (!strcmp(f, "--quantize")) a->quantize = v;
    else if (!strcmp(f, "--temperature")) {
        int rc = parse_f(f, v, &a->gen.temperature);
        if (!rc && a->gen.temperature < 0) rc = usage("%s: \"%s\" is negative (0 = greedy)", f, v);
        return rc;
    } else if (!strcmp(f, "--top-k")) return parse_i64(f, v, &a->gen.top_k);
    else if (!strcmp(f, "--top-p")) {
        int rc = parse_f(f, v, &a->gen.top_p);
        if (!rc && !(a->gen.top_p > 0 && a->gen.top_p <= 1)) rc = usage("%s: \"%s\" is not in (0, 1]", f, v);
        return rc;
    } else if (!strcmp(f, "--seed")) {
        uint64_t s;
        int rc = parse_u64(f, v, UINT64_MAX, &s);
        if (!rc) a->gen.seed = s;
        return rc;
    } else if (!strcmp(f, "--threads")) {
        int64_t t;
        int rc = parse_i64(f, v, &t);
        if (!rc && t > 1024) rc = usage("--threads: \"%s\" is more than 1024%s", v, "");
        if (!rc) a->threads = (int)t;
        return rc;
    }
    return 0;
}

// Options that this command takes but that would have no effect together: refused by name.
static int check_gen_combination(const gen_args *a, const int *given) {
    static const char *const sampling[] = {"--top-k", "--top-p", "--seed"};
    int on_cpu = !strcmp(a->device, "cpu");
    for (int k = 0; k < NUM_GEN_OPTIONS; k++) {
        if (!given[k]) continue;
        const char *f = GEN_OPTIONS[k].name;
        for (size_t s = 0; s < sizeof sampling / sizeof sampling[0]; s++)
            if (!strcmp(f, sampling[s]) && !(a->gen.temperature > 0))
                return usage("%s has no effect without --temperature above 0 (greedy decoding)%s", f, "");
        if (!strcmp(f, "--logits") && !a->json)
            return usage("--logits needs --json (the text report has no logits)%s%s", "", "");
        if (on_cpu && !strcmp(f, "--cuda-graph"))
            return usage("--cuda-graph needs --device cuda%s%s", "", "");
        if (on_cpu && !strcmp(f, "--no-decode-switch"))
            return usage("--no-decode-switch applies to --device cuda only (the decode-step switch is CUDA's)%s%s", "",
                         "");
        if (!strcmp(f, "--dequantize") && a->quantize)
            return usage("--dequantize and --quantize exclude each other%s%s", "", "");
        if ((!strcmp(f, "--ep") || !strcmp(f, "--ep-mpi")) && a->gen.cuda_graph)
            return usage("%s and --cuda-graph exclude each other (an expert-parallel decode step cannot be captured: "
                         "its ranks meet on the host in every MoE layer)%s", f, "");
        if (!strcmp(f, "--ep-mpi") && a->ep)
            return usage("--ep N (ranks in this process) and --ep-mpi (a rank a process) exclude each other%s%s", "", "");
    }
    return 0;
}

static int parse_gen_args(int argc, char **argv, gen_args *a, int command) {
    memset(a, 0, sizeof *a);
    a->gen = moex_generate_default_options();
    a->device = "cpu";
    a->dtype = "f32";
    int given[NUM_GEN_OPTIONS] = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (f[0] != '-') {
            if (a->dir) return usage("unexpected argument \"%s\" (the model directory is \"%s\")", f, a->dir);
            a->dir = f;
            continue;
        }
        int k = 0;
        while (k < NUM_GEN_OPTIONS && strcmp(f, GEN_OPTIONS[k].name)) k++;
        if (k == NUM_GEN_OPTIONS) return usage("unknown option \"%s\"%s", f, "");
        if (!(GEN_OPTIONS[k].commands & command))
            return usage("option \"%s\" is not taken by this command%s", f, "");
        if (given[k]++ && strcmp(f, "--prompt-ids") && strcmp(f, "--prompt") && strcmp(f, "--prompt-file"))
            return usage("%s is given more than once%s", f, "");
        const char *v = NULL;
        if (GEN_OPTIONS[k].value) {
            if (i + 1 == argc || (strcmp(f, "--prompt") && !strncmp(argv[i + 1], "--", 2)))
                return usage("%s needs a value%s", f, "");
            v = argv[++i];
        }
        int rc = apply_gen_option(a, f, v);
        if (rc) return rc;
    }
    if (!a->dir) return usage("a model directory is required%s%s", "", "");
    return check_gen_combination(a, given);
}

static void free_gen_args(gen_args *a) {
    for (int i = 0; i < a->n; i++) free(a->prompts[i]);
    moex_tokenizer_free(a->tok);
}

/* The bytes of a prompt file (at most 16 MiB). */
static char *read_prompt_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: --prompt-file %s: %s\n", usage_cmd, path, strerror(errno));
        return NULL;
    }
    char *b = malloc((1 << 24) + 1);
    size_t n = b ? fread(b, 1, 1 << 24, f) : 0;
    const int big = b && n == (1 << 24) && fgetc(f) != EOF;
    fclose(f);
    if (!b || big) {
        fprintf(stderr, "%s: --prompt-file %s: %s\n", usage_cmd, path, b ? "larger than 16 MiB" : "out of memory");
        free(b);
        return NULL;
    }
    b[n] = 0;
    return b;
}

/* dir's tokenizer.json (its path into path): 1 loaded into *tok, 0 there is none, -1 it does not
 * load (moex_last_error says why). */
static int dir_tokenizer(const char *dir, moex_tokenizer **tok, char *path, size_t n) {
    *tok = NULL;
    snprintf(path, n, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    return moex_tokenizer_load(path, tok) == MOEX_OK ? 1 : -1;
}

/* The checkpoint's tokenizer (when it has one; text prompts need it), then every text prompt
 * (wrapped in the family's chat format with --chat) as ids. 0, or an exit code. */
static int tokenize_prompts(gen_args *a) {
    char path[1024];
    const int got = dir_tokenizer(a->dir, &a->tok, path, sizeof path);
    if (got == 0 && a->n_text) {
        fprintf(stderr, "%s: --prompt needs %s (or give --prompt-ids)\n", usage_cmd, path);
        return 1;
    }
    if (got < 0) { /* ids in, ids out need no tokenizer: the text is only a convenience */
        if (a->n_text) return fail("loading the tokenizer");
        return 0;
    }
    char family[128] = "";
    if (a->chat && !a->n_text) return usage("--chat needs a text prompt (--prompt or --prompt-file)%s%s", "", "");
    if (a->chat && chat_model_type(a->dir, family, sizeof family)) return 1;
    for (int i = 0; i < a->n; i++) {
        if (!a->texts[i]) continue;
        char *file = a->is_file[i] ? read_prompt_file(a->texts[i]) : NULL;
        if (a->is_file[i] && !file) return 1;
        const char *text = file ? file : a->texts[i], *why = NULL;
        char *wrapped = a->chat ? chat_wrap(family, text, &why) : NULL;
        if (a->chat && !wrapped) {
            free(file);
            fprintf(stderr, "%s: --chat: %s: %s\n", usage_cmd, family, why);
            return 2;
        }
        const char *in = wrapped ? wrapped : text;
        int64_t n = 0;
        const moex_status st = moex_tokenizer_encode(a->tok, in, strlen(in), 1, &a->prompts[i], &n);
        free(wrapped);
        free(file);
        if (st) return fail("tokenizing the prompt");
        if (n == 0) return usage("prompt %s is empty once tokenized%s", a->is_file[i] ? a->texts[i] : "(--prompt)", "");
        if (n > MAX_PROMPT_LEN) return usage("a prompt has more than %s tokens%s", "65536", "");
        a->lens[i] = n;
    }
    return 0;
}

/* Streaming: the text of prompt 0's new tokens printed as they come. */
typedef struct text_stream {
    moex_detok_stream *s;
    int failed;
} text_stream;

static void stream_token(void *user, int prompt, int32_t id) {
    text_stream *ts = user;
    const char *p;
    size_t len;
    if (prompt != 0 || ts->failed) return;
    if (moex_detok_stream_push(ts->s, id, &p, &len) != MOEX_OK) {
        ts->failed = 1;
        return;
    }
    fwrite(p, 1, len, stdout);
    if (cli_stdout_flush()) ts->failed = 1;
}

// --device: cpu, cuda (GPU 0), cuda:N, or for --ep ranks a list cuda:N,M,... (rank r on the
// (r mod count)-th); a->gpus and a->n_gpus (0 for cpu). 0 or an exit code.
static int parse_devices(gen_args *a) {
    a->n_gpus = 0;
    if (!strcmp(a->device, "cpu")) return 0;
    if (!strcmp(a->device, "cuda")) {
        a->gpus[a->n_gpus++] = 0;
        return 0;
    }
    if (strncmp(a->device, "cuda:", 5) || !a->device[5])
        return usage("--device: \"%s\" is not cpu, cuda, cuda:N or cuda:N,M,...%s", a->device, "");
    char one[16];
    for (const char *p = a->device + 5;;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        uint64_t v;
        if (len == 0 || len >= sizeof one) return usage("--device: \"%s\" has an empty or overlong GPU index%s", a->device, "");
        memcpy(one, p, len);
        one[len] = '\0';
        if (cli_parse_u64(one, 1023, &v) != CLI_NUM_OK)
            return usage("--device: \"%s\" is not a GPU index 0 to 1023 (in \"%s\")", one, a->device);
        if (a->n_gpus == MAX_EP) return usage("--device: \"%s\" lists more than %s GPUs", a->device, "64");
        a->gpus[a->n_gpus++] = (int)v;
        if (!end) break;
        p = end + 1;
    }
    if (a->n_gpus > 1 && !a->ep && !a->ep_mpi)
        return usage("--device %s: several GPUs take the ranks of --ep N or --ep-mpi (one model runs on one GPU)%s",
                     a->device, "");
    return 0;
}

// Model options from the common flags; 0 or an exit code.
static int model_options(gen_args *a, moex_model_options *mo) {
    *mo = moex_model_default_options();
    mo->experts = a->experts;
    mo->num_threads = a->threads;
    mo->decode_switch = !a->no_decode_switch;
    mo->dequantize = a->dequantize;
    mo->quantize = a->quantize;
    moex_quant_format qf;
    if (a->quantize && moex_quant_format_parse(a->quantize, &qf))
        return usage("--quantize: \"%s\" is not fp8, fp8-ue8m0 or fp4%s", a->quantize, "");
    int rc = parse_devices(a);
    if (rc) return rc;
    if (a->n_gpus) mo->device = (moex_device){MOEX_DEVICE_CUDA, a->gpus[0]};
    if (moex_dtype_parse(a->dtype, &mo->dtype) || (mo->dtype != MOEX_F32 && mo->dtype != MOEX_BF16))
        return usage("--dtype: \"%s\" is not f32 or bf16%s", a->dtype, "");
    int64_t longest = 1, total = 0;
    for (int i = 0; i < a->n; i++) {
        longest = a->lens[i] > longest ? a->lens[i] : longest;
        total += a->lens[i];
    }
    if (a->gen.max_new_tokens > ((int64_t)1 << 24) - longest)
        return usage("--max-new-tokens: too many (prompt + new tokens must stay under 2^24)%s%s", "", "");
    mo->max_batch = a->n > 0 ? a->n : 1;
    mo->max_seq = longest + a->gen.max_new_tokens;
    mo->max_tokens = total > mo->max_batch ? total : mo->max_batch;
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", usage_cmd, what, moex_last_error());
    return 1;
}

// Device memory of a model on CUDA, each byte counted once.
static void print_gpu_memory(const moex_model_info *in) {
    printf("gpu memory:  weights %.1f MiB, kv cache %.1f MiB (%lld bytes), workspace %.1f MiB (total %.1f MiB)\n",
           (double)in->gpu_weight_bytes / 1048576.0, (double)in->gpu_kv_cache_bytes / 1048576.0,
           (long long)in->gpu_kv_cache_bytes, (double)in->gpu_workspace_bytes / 1048576.0,
           (double)(in->gpu_weight_bytes + in->gpu_kv_cache_bytes + in->gpu_workspace_bytes) / 1048576.0);
}

// The experts map in force; 0, or 1 after saying why.
static int experts_map(const moex_model *m, char *map, size_t size) {
    return moex_model_get_experts(m, map, size) == MOEX_OK ? 0 : fail("reading the experts map");
}

/* The text of prompt i's new tokens (special tokens left out), or NULL. */
static char *new_text(const moex_tokenizer *tok, const moex_generation *g, int i) {
    char *text = NULL;
    size_t len;
    if (tok && moex_tokenizer_decode(tok, g->new_ids[i], g->num_new[i], 1, &text, &len) != MOEX_OK) text = NULL;
    return text;
}

static int print_json(const moex_model *m, const moex_generation *g, const moex_tokenizer *tok) {
    char map[4096];
    if (experts_map(m, map, sizeof map)) return 1;
    cJSON *root = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(root, "new_ids");
    cJSON *texts = tok ? cJSON_AddArrayToObject(root, "text") : NULL;
    for (int i = 0; i < g->n; i++) {
        cJSON *row = cJSON_CreateArray();
        for (int64_t j = 0; j < g->num_new[i]; j++) cJSON_AddItemToArray(row, cJSON_CreateNumber(g->new_ids[i][j]));
        cJSON_AddItemToArray(ids, row);
        char *t = new_text(tok, g, i);
        if (texts) cJSON_AddItemToArray(texts, t ? cJSON_CreateString(t) : cJSON_CreateNull());
        moex_tokenizer_buffer_free(t);
    }
    cJSON *parsed = cJSON_Parse(map);
    int ok = parsed != NULL;
    cJSON_AddItemToObject(root, "experts_implementation", parsed);
    if (g->last_prompt_logits) {
        cJSON *lg = cJSON_AddArrayToObject(root, "last_prompt_logits");
        for (int i = 0; i < g->n; i++) {
            cJSON *row = cJSON_CreateArray();
            for (int64_t v = 0; v < g->vocab; v++)
                cJSON_AddItemToArray(row, cJSON_CreateNumber((double)g->last_prompt_logits[i][v]));
            cJSON_AddItemToArray(lg, row);
        }
    }
    moex_model_info in;
    if (moex_model_get_info(m, &in) == MOEX_OK && in.gpu_weight_bytes) {
        cJSON *mem = cJSON_AddObjectToObject(root, "gpu_memory_bytes");
        cJSON_AddNumberToObject(mem, "weights", (double)in.gpu_weight_bytes);
        cJSON_AddNumberToObject(mem, "kv_cache", (double)in.gpu_kv_cache_bytes);
        cJSON_AddNumberToObject(mem, "workspace", (double)in.gpu_workspace_bytes);
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) {
        fprintf(stderr, "%s: %s\n", usage_cmd, ok ? "out of memory for the JSON output" : "the experts map is not JSON");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

/* The report to out (stdout; stderr when the text was streamed to stdout). */
static int print_report(const moex_model *m, const moex_generation *g, const moex_tokenizer *tok, FILE *out) {
    char map[4096];
    if (experts_map(m, map, sizeof map)) return 1;
    fprintf(out, "experts: %s\n", map);
    for (int i = 0; i < g->n; i++) {
        fprintf(out, "prompt %d -> %lld new tokens:", i, (long long)g->num_new[i]);
        for (int64_t j = 0; j < g->num_new[i]; j++) fprintf(out, " %d", g->new_ids[i][j]);
        fprintf(out, "\n");
        char *t = out == stdout ? new_text(tok, g, i) : NULL;
        if (t) fprintf(out, "prompt %d text: %s\n", i, t);
        moex_tokenizer_buffer_free(t);
    }
    moex_model_info in;
    if (out == stdout && moex_model_get_info(m, &in) == MOEX_OK && in.gpu_weight_bytes) print_gpu_memory(&in);
    fprintf(out, "prefill: %lld tokens in %.2f ms (%.1f tokens/s)\n", (long long)g->prefill_tokens,
            1e3 * g->prefill_seconds, g->prefill_seconds > 0 ? (double)g->prefill_tokens / g->prefill_seconds : 0.0);
    fprintf(out, "decode:  %lld tokens in %.2f ms (%.1f tokens/s)\n", (long long)g->decode_tokens,
            1e3 * g->decode_seconds, g->decode_seconds > 0 ? (double)g->decode_tokens / g->decode_seconds : 0.0);
    return 0;
}

/* The ranks' results as one generation (`all`, in prompt order), printed as the report or JSON,
 * the report with a line naming the ranks (`where` they run) and the experts a rank holds. */
static int print_ep(const gen_args *a, const moex_model *m, const moex_generation *all, int R, const char *where) {
    int rc = a->json ? print_json(m, all, a->tok) : print_report(m, all, a->tok, stdout);
    const moex_layer *first = moex_model_experts_layer(m, 0);
    if (!rc && !a->json && first)
        printf("expert parallelism: %d ranks %s, %lld experts a rank\n", R, where,
               (long long)moex_layer_desc(first)->num_experts);
    return rc;
}

/* Rank r's block of n prompts over R ranks: [r n / R, (r + 1) n / R). */
static void prompt_block(int r, int R, int n, int *first, int *count) {
    *first = (int)((int64_t)r * n / R);
    *count = (int)((int64_t)(r + 1) * n / R) - *first;
}

/* CPU threads of one of `ranks` ranks on this machine: --threads (default one per core) divided
 * among them, at least one. */
static int rank_threads(const gen_args *a, int ranks) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const long t = (a->threads ? a->threads : (cores > 0 ? cores : 1)) / ranks;
    return t > 0 ? (int)t : 1;
}

/* --ep N: one rank of the group, on a thread of its own (moex_generate is a collective). */
typedef struct ep_rank {
    moex_model *m;
    const gen_args *a;
    int first, n; /* its prompts: a->prompts[first .. first + n) */
    moex_generation *g;
    moex_status st;
    char msg[1024];
} ep_rank;

static void *ep_rank_generate(void *arg) {
    ep_rank *r = arg;
    const gen_args *a = r->a;
    moex_generation *g = NULL;
    r->st = MOEX_OK;
    for (int64_t w = 0; w <= a->warmup && !r->st; w++) { /* warm-ups (each a collective too), then the run */
        moex_generation_free(g);
        g = NULL;
        r->st = moex_generate(r->m, r->n, (const int32_t *const *)a->prompts + r->first, a->lens + r->first, &a->gen, &g);
    }
    if (r->st) snprintf(r->msg, sizeof r->msg, "%s", moex_last_error());
    r->g = r->st ? NULL : g;
    if (r->st) moex_generation_free(g);
    return NULL;
}

/* `moex generate --ep N`: N ranks of one group in this process, each loading the model with its
 * share of the experts and generating a contiguous block of the prompts (rank r prompts
 * [r n / N, (r + 1) n / N): a rank may have none); the report is the prompts' in order, with the
 * longest rank's times and every rank's tokens. */
static int generate_ep(gen_args *a, const moex_model_options *mo) {
    const int R = (int)a->ep;
    moex_ep_group *groups[MAX_EP] = {0};
    ep_rank ranks[MAX_EP];
    memset(ranks, 0, sizeof ranks);
    int rc = moex_ep_local_groups(R, groups) ? fail("making the expert-parallel group") : 0;
    for (int r = 0; !rc && r < R; r++) {
        moex_model_options o = *mo;
        o.ep_group = groups[r];
        o.num_threads = rank_threads(a, R);
        if (a->n_gpus) o.device.index = a->gpus[r % a->n_gpus];
        ranks[r].a = a;
        prompt_block(r, R, a->n, &ranks[r].first, &ranks[r].n);
        if (moex_model_load(a->dir, &o, &ranks[r].m)) {
            fprintf(stderr, "%s: loading the model for rank %d of %d: %s\n", usage_cmd, r, R, moex_last_error());
            rc = 1;
        }
    }
    if (!rc) fprintf(stderr, "moex: generating %lld tokens for %d prompt(s) over %d expert-parallel ranks\n",
                     (long long)a->gen.max_new_tokens, a->n, R);
    pthread_t th[MAX_EP];
    int started = 0;
    for (; !rc && started < R; started++)
        if (pthread_create(&th[started], NULL, ep_rank_generate, &ranks[started])) {
            fprintf(stderr, "%s: could not start the thread of rank %d\n", usage_cmd, started);
            exit(1); /* the ranks already started would wait for it in their first exchange */
        }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    for (int r = 0; !rc && r < R; r++)
        if (ranks[r].st) {
            fprintf(stderr, "%s: generating (rank %d of %d): %s\n", usage_cmd, r, R, ranks[r].msg);
            rc = 1;
        }
    if (!rc) { /* the ranks' results as one generation, in prompt order */
        moex_generation all;
        memset(&all, 0, sizeof all);
        all.vocab = ranks[0].g->vocab;
        int64_t num_new[MAX_PROMPTS];
        int32_t *new_ids[MAX_PROMPTS];
        float *logits[MAX_PROMPTS];
        all.n = a->n, all.num_new = num_new, all.new_ids = new_ids;
        all.last_prompt_logits = a->gen.want_logits ? logits : NULL;
        for (int r = 0; r < R; r++) {
            const moex_generation *g = ranks[r].g;
            for (int i = 0; i < ranks[r].n; i++) {
                num_new[ranks[r].first + i] = g->num_new[i];
                new_ids[ranks[r].first + i] = g->new_ids[i];
                if (a->gen.want_logits) logits[ranks[r].first + i] = g->last_prompt_logits[i];
            }
            all.prefill_tokens += g->prefill_tokens, all.decode_tokens += g->decode_tokens;
            if (g->prefill_seconds > all.prefill_seconds) all.prefill_seconds = g->prefill_seconds;
            if (g->decode_seconds > all.decode_seconds) all.decode_seconds = g->decode_seconds;
        }
        rc = print_ep(a, ranks[0].m, &all, R, "in this process");
    }
    for (int r = 0; r < R; r++) {
        moex_generation_free(ranks[r].g);
        moex_model_free(ranks[r].m);
    }
    for (int r = 0; r < R; r++) moex_ep_group_free(groups[r]);
    return rc;
}

/* `moex generate --ep-mpi` under an MPI launcher: this process is rank r of the job's R, loads
 * the model with its share of the experts and generates its block of the prompts (as --ep's rank
 * r would); the results are gathered to rank 0, which prints them. Every rank exits 0 or 1 alike. */
static int generate_ep_mpi(gen_args *a, const moex_model_options *mo) {
    moex_ep_group *group = NULL;
    int rank = 0, R = 1, local = 1, local_rank = 0;
    if (cli_mpi_group(usage_cmd, &group, &rank, &R, &local, &local_rank)) {
        cli_mpi_end();
        return 1;
    }
    moex_model_options o = *mo;
    o.ep_group = group;
    o.num_threads = rank_threads(a, local);
    if (a->n_gpus) o.device.index = a->gpus[local_rank % a->n_gpus]; /* this machine's ranks over the GPUs listed */
    if (cli_mpi_any_failed(a->n_gpus && local != R)) { /* every rank sees the job's size and its machine's */
        if (rank == 0)
            fprintf(stderr, "%s: --ep-mpi --device %s: the job's %d ranks are not all on one machine: GPU ranks in "
                    "processes share memory through CUDA IPC, within one machine only\n", usage_cmd, a->device, R);
        moex_ep_group_free(group);
        cli_mpi_end();
        return 1;
    }
    ep_rank me;
    memset(&me, 0, sizeof me);
    me.a = a;
    prompt_block(rank, R, a->n, &me.first, &me.n);
    int failed = moex_model_load(a->dir, &o, &me.m) != MOEX_OK;
    if (failed) fprintf(stderr, "%s: loading the model for rank %d of %d: %s\n", usage_cmd, rank, R, moex_last_error());
    int rc = cli_mpi_any_failed(failed);
    if (!rc) {
        if (rank == 0)
            fprintf(stderr, "moex: generating %lld tokens for %d prompt(s) over %d expert-parallel ranks (MPI)\n",
                    (long long)a->gen.max_new_tokens, a->n, R);
        ep_rank_generate(&me);
        if (me.st) fprintf(stderr, "%s: generating (rank %d of %d): %s\n", usage_cmd, rank, R, me.msg);
        rc = cli_mpi_any_failed(me.st != MOEX_OK);
    }
    int *counts = rc ? NULL : malloc((size_t)R * sizeof *counts);
    if (!rc && cli_mpi_any_failed(!counts)) {
        fprintf(stderr, "%s: --ep-mpi: out of memory\n", usage_cmd);
        rc = 1;
    }
    if (!rc) {
        for (int r = 0, first; r < R; r++) prompt_block(r, R, a->n, &first, &counts[r]);
        moex_generation all;
        rc = cli_mpi_gather(usage_cmd, me.g, a->n, counts, me.g->vocab, a->gen.want_logits, &all);
        if (!rc && rank == 0) {
            rc = print_ep(a, me.m, &all, R, "(MPI processes)");
            cli_mpi_free_gathered(&all);
        }
        rc = cli_mpi_any_failed(rc); /* rank 0's printing too */
    }
    free(counts);
    moex_generation_free(me.g);
    moex_model_free(me.m);
    moex_ep_group_free(group);
    cli_mpi_end();
    return rc;
}

int moex_cli_generate(int argc, char **argv) {
    usage_cmd = "moex generate";
    gen_args a;
    int rc = parse_gen_args(argc, argv, &a, FOR_GENERATE);
    if (!rc && a.n == 0) rc = usage("at least one --prompt, --prompt-file or --prompt-ids is required%s%s", "", "");
    if (!rc) rc = tokenize_prompts(&a);
    moex_model_options mo;
    if (!rc) rc = model_options(&a, &mo);
    if (!rc && (a.ep || a.ep_mpi)) {
        rc = a.ep ? generate_ep(&a, &mo) : generate_ep_mpi(&a, &mo);
        free_gen_args(&a);
        return rc;
    }
    moex_model *m = NULL;
    moex_generation *g = NULL;
    if (!rc && moex_model_load(a.dir, &mo, &m)) rc = fail("loading the model");
    if (!rc) fprintf(stderr, "moex: generating %lld tokens for %d prompt(s)\n", (long long)a.gen.max_new_tokens, a.n);
    /* warm-up runs: the same generation, untimed (kernels loaded, graphs captured, caches warm) */
    for (int64_t w = 0; !rc && w < a.warmup; w++) {
        if (moex_generate(m, a.n, (const int32_t *const *)a.prompts, a.lens, &a.gen, &g)) rc = fail("generating (warm-up)");
        moex_generation_free(g);
        g = NULL;
    }
    /* one text prompt without --json: its new text streamed to stdout, the report to stderr */
    text_stream ts = {NULL, 0};
    const int streaming = !rc && a.tok && a.n_text == 1 && a.n == 1 && !a.json;
    if (streaming && moex_detok_stream_new(a.tok, 1, &ts.s) == MOEX_OK) {
        a.gen.on_token = stream_token;
        a.gen.user = &ts;
    }
    if (!rc && moex_generate(m, a.n, (const int32_t *const *)a.prompts, a.lens, &a.gen, &g)) rc = fail("generating");
    if (!rc && ts.s) {
        const char *p;
        size_t len;
        if (moex_detok_stream_finish(ts.s, &p, &len) == MOEX_OK) fwrite(p, 1, len, stdout);
        printf("\n");
        if (cli_stdout_flush()) rc = 1;
    }
    const int streamed = ts.s != NULL;
    moex_detok_stream_free(ts.s);
    if (!rc) rc = a.json ? print_json(m, g, a.tok) : print_report(m, g, a.tok, streamed ? stderr : stdout);
    moex_generation_free(g);
    moex_model_free(m);
    free_gen_args(&a);
    return rc;
}

static void print_info(const moex_model *m, const moex_model_info *in, const gen_args *a, moex_device device,
                       const char *map) {
    printf("family:      %s\n", in->model_type);
    printf("sub-configs:");
    for (int i = 0; i < in->num_sub_configs; i++) printf(" %s", in->sub_configs[i]);
    printf("%s\n", in->num_sub_configs ? "" : " (none)");
    printf("layers:      %lld (%lld MoE)\n", (long long)in->num_layers, (long long)in->num_moe_layers);
    printf("features:    %s\n", in->features);
    printf("kv cache:    %zu bytes per token\n", in->kv_cache_bytes_per_token);
    printf("experts:     %lld, top-%lld, hidden %lld, intermediate %lld, %s, %s%s\n", (long long)in->num_experts,
           (long long)in->top_k, (long long)in->hidden, (long long)in->moe_intermediate, moex_dtype_name(in->weight_dtype),
           in->per_expert_layout ? "per-expert tensors" : "fused tensors", in->transposed ? " (transposed)" : "");
    if (in->shared_intermediate) printf("shared expert intermediate: %lld\n", (long long)in->shared_intermediate);
    if (in->formats[0]) printf("formats:     %s\n", in->formats);
    char tok_path[1024];
    moex_tokenizer *tok = NULL;
    const int got = dir_tokenizer(a->dir, &tok, tok_path, sizeof tok_path);
    if (got > 0) printf("tokenizer:   %lld tokens (tokenizer.json)\n", (long long)moex_tokenizer_vocab_size(tok));
    else if (got == 0) printf("tokenizer:   none (no tokenizer.json: --prompt-ids only)\n");
    else printf("tokenizer:   not usable: %s\n", moex_last_error());
    moex_tokenizer_free(tok);
    if (device.kind == MOEX_DEVICE_CUDA) print_gpu_memory(in);
    printf("experts map: %s\n", map);
    printf("backends on %s:\n", a->device);
    for (int i = 0; i < moex_backend_count(); i++) {
        char why[512];
        const char *name = moex_backend_name(i);
        if (moex_backend_supports(name, moex_model_experts_layer(m, 0), device, why, sizeof why) == MOEX_OK)
            printf("  %-18s yes\n", name);
        else
            printf("  %-18s no: %s\n", name, why);
    }
}

int moex_cli_info(int argc, char **argv) {
    usage_cmd = "moex info";
    gen_args a;
    int rc = parse_gen_args(argc, argv, &a, FOR_INFO);
    moex_model_options mo;
    if (!rc) rc = model_options(&a, &mo);
    moex_model *m = NULL;
    if (!rc && moex_model_load(a.dir, &mo, &m)) rc = fail("loading the model");
    moex_model_info in;
    char map[4096];
    if (!rc && moex_model_get_info(m, &in) != MOEX_OK) rc = fail("reading the model's facts");
    if (!rc) rc = experts_map(m, map, sizeof map);
    if (!rc) print_info(m, &in, &a, mo.device, map);
    moex_model_free(m);
    free_gen_args(&a);
    return rc;
}

int moex_cli_demo(int argc, char **argv) {
    usage_cmd = "moex demo";
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') return usage("option \"%s\" is not taken by this command (it takes [MODEL_DIR])%s", argv[i], "");
        if (i > 1) return usage("unexpected argument \"%s\" (the model directory is \"%s\")", argv[i], argv[1]);
    }
    const char *dir = argc > 1 ? argv[1] : MOEX_DEMO_MODEL;
    static const int32_t p0[] = {3, 17, 42, 7, 99, 5}, p1[] = {11, 200, 64};
    const int32_t *prompts[2] = {p0, p1};
    int64_t lens[2] = {6, 3};
    moex_model_options mo = moex_model_default_options();
    mo.max_batch = 2;
    mo.max_seq = 64;
    mo.max_tokens = 64;
    moex_model *m = NULL;
    int rc = 0;
    if (moex_model_load(dir, &mo, &m)) return fail("loading the demo model");
    moex_model_info in;
    if (moex_model_get_info(m, &in) != MOEX_OK) {
        rc = fail("reading the demo model's facts");
        moex_model_free(m);
        return rc;
    }
    printf("demo model %s: %s, %lld layers, %lld experts (top-%lld), hidden %lld\n", dir, in.model_type,
           (long long)in.num_layers, (long long)in.num_experts, (long long)in.top_k, (long long)in.hidden);
    if (cli_stdout_flush()) rc = 1; /* said at exit */
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 24;
    go.ignore_eos = 1;
    moex_generation *first = NULL, *warm = NULL;
    int agree = 1;
    if (!rc && moex_generate(m, 2, prompts, lens, &go, &warm)) rc = fail("warm-up"); /* first touch of weights and caches */
    moex_generation_free(warm);
    moex_device cpu = {MOEX_DEVICE_CPU, 0};
    for (int i = 0; i < moex_backend_count() && !rc; i++) {
        const char *name = moex_backend_name(i);
        char why[512];
        if (moex_backend_supports(name, moex_model_experts_layer(m, 0), cpu, why, sizeof why) != MOEX_OK) {
            printf("%-18s skipped: %s\n", name, why);
            if (cli_stdout_flush()) rc = 1; /* said at exit */
            continue;
        }
        moex_generation *g = NULL;
        if (moex_model_set_experts(m, name) || moex_generate(m, 2, prompts, lens, &go, &g)) {
            rc = fail(name);
            break;
        }
        int same = 1;
        for (int p = 0; first && p < 2; p++)
            same &= g->num_new[p] == first->num_new[p] &&
                    !memcmp(g->new_ids[p], first->new_ids[p], sizeof(int32_t) * (size_t)g->num_new[p]);
        agree &= same;
        printf("%-18s prefill %8.1f tokens/s  decode %8.1f tokens/s  tokens:", name,
               (double)g->prefill_tokens / g->prefill_seconds, (double)g->decode_tokens / g->decode_seconds);
        for (int64_t j = 0; j < 8 && j < g->num_new[0]; j++) printf(" %d", g->new_ids[0][j]);
        printf(" ...%s\n", first ? (same ? "  (same as the first backend)" : "  (DIFFERENT)") : "");
        if (!first) first = g;
        else moex_generation_free(g);
        if (cli_stdout_flush()) rc = 1; /* said at exit: no use running the other backends */
    }
    if (!rc) printf("%s\n", agree ? "all backends generated the same tokens" : "the backends DISAGREE");
    moex_generation_free(first);
    moex_model_free(m);
    return rc ? rc : (agree ? 0 : 1);
}
