/*
 * test_cuda_model — whole models on the GPU against the same models on the CPU.
 *   test_cuda_model [--quick] [--device N]       (exit 77: no usable GPU)
 *
 * For every plain fixture in tests/fixtures (every family: qwen2_moe, qwen3_moe, mixtral,
 * qwen3_vl_moe, olmoe, glm4_moe, deepseek_v3 with its latent attention, gpt_oss with sinks and
 * sliding windows; and the FP8 / MXFP4 ones loaded with dequantize = 1; then the FP8 and MXFP4
 * checkpoints whose experts run quantized on the GPU, against the CPU's quantized path, FP8 also
 * through deepgemm, which must give grouped_mm's tokens):
 *   - f32 on the CPU and f32 on CUDA (cuBLAS f32, no TF32): the same greedy
 *     tokens for two prompts of different lengths, last-prompt logits within
 *     1e-4 (absolute, plus 1e-4 relative);
 *   - CUDA with the decode step captured in a CUDA graph: the same tokens as
 *     without;
 *   - every CUDA backend the registry lists (eager, batched_mm, grouped_mm): the cpu's
 *     tokens and logits within 1e-4;
 *   - bf16 on CUDA: last-prompt logits within 5e-2 of the CPU's f32 ones, per prompt;
 *     where bf16 on the CPU is itself further than that (a routing near-tie
 *     that bf16 rounding flips), within 5e-2 of the CPU's bf16 ones instead;
 *   - GPU memory reported by moex_model_get_info (weights, KV cache, workspace);
 *   - the decode-step switch (SPEC R3): a decode step made to fail through the
 *     model's test hook leaves the experts map as it was before the call (with
 *     and without the graph), and the next generation gives the same tokens.
 * Then expert parallelism on the GPU: qwen3_moe and deepseek_v3 over a local group of 2 ranks
 * on the one GPU (moex_ep_local_groups, each rank a thread with its share of the experts), rank 0
 * generating both prompts while rank 1 has none (its idle steps keep every exchange whole), then
 * the other way round: the tokens of one model holding every expert, logits within 1e-4; a
 * rank's captured decode step is refused, naming why. qwen3_moe again with its experts on
 * deepgemm_megamoe, its exchange in pieces of 8 rows ($MOEX_MEGAMOE_PIECE_ROWS), against one model
 * on grouped_mm; and deepgemm_megamoe refused at load without a group. With a second GPU, the
 * same with rank r on cuda:r (peer access between the two).
 * Plain C, no framework; links moex_static and reads the model's internal
 * header for the test hook.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "../backend_list.h"
#include "gpu_harness.h"
#include "model/model_internal.h"
#include "moex.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_SKIP 77

static int g_gpu = 0; /* g_quick, g_checks and g_failures: gpu_harness.h */

static void check(int ok, const char *fixture, const char *what) {
    g_checks++;
    if (ok) return;
    g_failures++;
    printf("  FAIL %s: %s\n", fixture, what);
}

static const char *const FIXTURES[] = {
    "qwen3_moe",       "qwen3_moe-fused",   "qwen2_moe",          "qwen2_moe-fused",         "mixtral",
    "mixtral-fused",   "qwen3_vl_moe",      "qwen3_vl_moe-per_expert", "olmoe",             "olmoe-fused",
    "glm4_moe",        "glm4_moe-fused",    "deepseek_v3",        "deepseek_v3-fused",       "deepseek_v3-q_proj",
    "deepseek_v3-q_proj-fused", "deepseek_v3-yarn", "gpt_oss",    "deepseek_v3-fp8 --dequantize",
    "gpt_oss-mxfp4 --dequantize"};

enum { NPROMPT = 2, NEW = 8 };

typedef struct run_out {
    int ok;
    int32_t ids[NPROMPT][NEW];
    int64_t num[NPROMPT];
    float *logits[NPROMPT]; /* [V] each */
    int64_t V;
} run_out;

static void run_free(run_out *r) {
    for (int i = 0; i < NPROMPT; i++) free(r->logits[i]);
    memset(r, 0, sizeof *r);
}

static int g_dequantize;          /* the fixture is loaded with dequantize = 1 */
static moex_ep_group *g_ep_group; /* the fixture is loaded as this rank of an expert-parallel group */
static int g_load_gpu = -1;       /* >= 0: load on this GPU instead of g_gpu */
static const char *g_experts;     /* the experts' backend at load (NULL: the default) */

static moex_model *load(const char *dir, moex_device_kind kind, moex_dtype dt) {
    moex_model_options mo = moex_model_default_options();
    mo.dequantize = g_dequantize;
    mo.device.kind = kind;
    mo.device.index = kind == MOEX_DEVICE_CUDA ? (g_load_gpu >= 0 ? g_load_gpu : g_gpu) : 0;
    mo.dtype = dt;
    mo.max_batch = NPROMPT;
    mo.max_seq = 64;
    mo.max_tokens = 64;
    mo.ep_group = g_ep_group;
    if (g_experts) mo.experts = g_experts;
    moex_model *m = NULL;
    if (moex_model_load(dir, &mo, &m) != MOEX_OK) {
        printf("  loading %s on %s (%s): %s\n", dir, kind == MOEX_DEVICE_CUDA ? "cuda" : "cpu", moex_dtype_name(dt),
               moex_last_error());
        return NULL;
    }
    return m;
}

// Two prompts (20 and 3 tokens: the first prefill takes the attention's GEMM path on CUDA, from 16) of ids
// below V; greedy, NEW tokens each, ignoring end-of-sequence ids.
static run_out generate(moex_model *m, int graph) {
    run_out r;
    memset(&r, 0, sizeof r);
    moex_model_info info;
    if (moex_model_get_info(m, &info) != MOEX_OK) return r;
    int32_t p0[20], p1[3];
    for (int i = 0; i < 20; i++) p0[i] = (int32_t)((3 + 11 * i) % info.vocab);
    for (int i = 0; i < 3; i++) p1[i] = (int32_t)((5 + 7 * i) % info.vocab);
    const int32_t *prompts[NPROMPT] = {p0, p1};
    const int64_t lens[NPROMPT] = {20, 3};
    moex_generate_options o = moex_generate_default_options();
    o.max_new_tokens = NEW;
    o.ignore_eos = 1;
    o.want_logits = 1;
    o.cuda_graph = graph;
    moex_generation *g = NULL;
    if (moex_generate(m, NPROMPT, prompts, lens, &o, &g) != MOEX_OK) {
        printf("  generate: %s\n", moex_last_error());
        return r;
    }
    r.V = g->vocab;
    for (int i = 0; i < NPROMPT; i++) {
        r.num[i] = g->num_new[i];
        memcpy(r.ids[i], g->new_ids[i], (size_t)g->num_new[i] * sizeof(int32_t));
        r.logits[i] = malloc((size_t)r.V * sizeof(float));
        if (r.logits[i]) memcpy(r.logits[i], g->last_prompt_logits[i], (size_t)r.V * sizeof(float));
    }
    moex_generation_free(g);
    r.ok = r.logits[0] && r.logits[1];
    return r;
}

static int same_tokens(const run_out *a, const run_out *b) {
    for (int i = 0; i < NPROMPT; i++)
        if (a->num[i] != b->num[i] || memcmp(a->ids[i], b->ids[i], (size_t)a->num[i] * sizeof(int32_t))) return 0;
    return 1;
}

// Largest |a - b| - rtol * |b| over prompt i's logits (<= atol passes).
static double prompt_excess(const run_out *a, const run_out *ref, int i, double rtol) {
    double worst = 0;
    for (int64_t v = 0; v < ref->V; v++) {
        double d = fabs((double)a->logits[i][v] - (double)ref->logits[i][v]) - rtol * fabs((double)ref->logits[i][v]);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    return worst;
}

// The same over both prompts.
static double logits_excess(const run_out *a, const run_out *ref, double rtol) {
    double worst = 0;
    for (int i = 0; i < NPROMPT; i++) {
        double d = prompt_excess(a, ref, i, rtol);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

// bf16 on cuda against f32 on the cpu, within 5e-2 per prompt. Where bf16 on the cpu is itself
// further than that from f32 (a router score within bf16's rounding of a tie picks another expert:
// the fixture's property, not the device's), cuda's bf16 must instead be within 5e-2 of the cpu's.
static void check_bf16(const char *name, const run_out *b, const run_out *ref, const run_out *cpu_bf) {
    char what[300];
    for (int i = 0; i < NPROMPT; i++) {
        double ex = prompt_excess(b, ref, i, 0), cpu_ex = cpu_bf->ok ? prompt_excess(cpu_bf, ref, i, 0) : 0;
        if (ex <= 5e-2 || !(cpu_ex > 5e-2)) {
            snprintf(what, sizeof what, "prompt %d: bf16 last-prompt logits within 5e-2 of the cpu's f32 ones (largest diff %.3g)",
                     i, ex);
            check(ex <= 5e-2, name, what);
            continue;
        }
        double to_cpu = prompt_excess(b, cpu_bf, i, 0);
        printf("  note %s prompt %d: bf16 is %.3g from f32 on the cpu too (a near-tie in routing); cuda bf16 is %.3g from cpu bf16\n",
               name, i, cpu_ex, to_cpu);
        snprintf(what, sizeof what, "prompt %d: bf16 logits within 5e-2 of the cpu's bf16 ones (largest diff %.3g)", i, to_cpu);
        check(to_cpu <= 5e-2, name, what);
    }
}

// The decode switch restores the map when a decode step fails (the test hook fails decode step 2).
static void check_restore(const char *name, moex_model *m, const run_out *ref, int graph) {
    char before[512], after[512], what[1200];
    moex_model_get_experts(m, before, sizeof before);
    m->inject_decode_error = 2;
    run_out r = generate(m, graph);
    moex_model_get_experts(m, after, sizeof after);
    snprintf(what, sizeof what, "an injected decode failure%s is reported", graph ? " (graph)" : "");
    check(!r.ok, name, what);
    snprintf(what, sizeof what, "experts map after the failure%s: %s, before: %s", graph ? " (graph)" : "", after, before);
    check(strcmp(before, after) == 0, name, what);
    run_free(&r);
    r = generate(m, graph);
    snprintf(what, sizeof what, "the generation after the failure%s gives the same tokens", graph ? " (graph)" : "");
    check(r.ok && same_tokens(&r, ref), name, what);
    run_free(&r);
}

// name: a fixture, or "FIXTURE --dequantize".
static void test_fixture(const char *entry) {
    char dir[512], what[200], name[128];
    snprintf(name, sizeof name, "%s", entry);
    char *flag = strstr(name, " --dequantize");
    g_dequantize = flag != NULL;
    if (flag) *flag = '\0';
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    moex_model *cpu = load(dir, MOEX_DEVICE_CPU, MOEX_F32);
    moex_model *gpu = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
    check(cpu && gpu, name, "loads on the cpu and on cuda (f32)");
    if (!cpu || !gpu) {
        moex_model_free(cpu);
        moex_model_free(gpu);
        return;
    }
    moex_model_info info;
    moex_model_get_info(gpu, &info);
    check(info.gpu_weight_bytes > 0 && info.gpu_kv_cache_bytes > 0 && info.gpu_workspace_bytes > 0, name,
          "moex_model_get_info reports GPU memory for weights, KV cache and workspace");
    run_out ref = generate(cpu, 0), dev = generate(gpu, 0), dev_graph = {0};
    check(ref.ok && dev.ok, name, "generates on the cpu and on cuda");
    if (ref.ok && dev.ok) {
        check(same_tokens(&dev, &ref), name, "f32 greedy tokens on cuda equal the cpu's");
        double ex = logits_excess(&dev, &ref, 1e-4);
        snprintf(what, sizeof what, "f32 last-prompt logits within 1e-4 + 1e-4 |x| of the cpu's (excess %.3g)", ex);
        check(ex <= 1e-4, name, what);
        dev_graph = generate(gpu, 1);
        check(dev_graph.ok && same_tokens(&dev_graph, &dev), name, "graph-captured decode gives the same tokens");
        dev_graph = (run_free(&dev_graph), generate(gpu, 1)); /* replays the graphs captured above */
        check(dev_graph.ok && same_tokens(&dev_graph, &dev), name, "replayed graphs give the same tokens");
        check_restore(name, gpu, &dev, 0);
        if (!g_quick) check_restore(name, gpu, &dev, 1);
        /* every CUDA backend the registry lists: the cpu's tokens, logits within 1e-4 */
        char before[512];
        moex_model_get_experts(gpu, before, sizeof before);
        const backend_list bl = backends_on((moex_device){MOEX_DEVICE_CUDA, g_gpu});
        for (int b = 0; b < bl.n && !g_quick; b++) {
            if (moex_model_set_experts(gpu, bl.name[b]) != MOEX_OK) { /* a backend refusing this family's layers */
                printf("  %s: backend %s: %s\n", name, bl.name[b], moex_last_error());
                continue;
            }
            run_out rb = generate(gpu, 0);
            snprintf(what, sizeof what, "backend %s: the cpu's greedy tokens", bl.name[b]);
            check(rb.ok && same_tokens(&rb, &ref), name, what);
            const double bx = rb.ok ? logits_excess(&rb, &ref, 1e-4) : 1.0;
            snprintf(what, sizeof what, "backend %s: logits within 1e-4 + 1e-4 |x| of the cpu's (excess %.3g)", bl.name[b], bx);
            check(bx <= 1e-4, name, what);
            run_free(&rb);
        }
        check(moex_model_set_experts(gpu, before) == MOEX_OK, name, "the experts map restored");
    }
    moex_model_free(gpu);
    if (ref.ok && !g_quick) {
        moex_model *bf = load(dir, MOEX_DEVICE_CUDA, MOEX_BF16);
        check(bf != NULL, name, "loads on cuda in bf16");
        moex_model *cpu_bf = load(dir, MOEX_DEVICE_CPU, MOEX_BF16);
        run_out b = bf ? generate(bf, 0) : (run_out){0}, cb = cpu_bf ? generate(cpu_bf, 0) : (run_out){0};
        check(b.ok && cb.ok, name, "generates in bf16 on cuda and on the cpu");
        if (b.ok) check_bf16(name, &b, &ref, &cb);
        run_free(&b);
        run_free(&cb);
        moex_model_free(bf);
        moex_model_free(cpu_bf);
    }
    run_free(&ref);
    run_free(&dev);
    run_free(&dev_graph);
    moex_model_free(cpu);
}

/* Quantized checkpoints on cuda (f32 compute): the experts run as FP8 (e4m3 tensor cores) or FP4
 * (e2m1 codes read by the streamed kernels) on the GPU, activations quantized there, and give the
 * cpu's quantized greedy tokens; graph-captured decode too. fmt names the format in the checks.
 * A checkpoint whose sizes the GPU's kernels do not take is refused at load, naming them. */
static void test_quant_fixture(const char *name, const char *fmt) {
    char dir[512], what[200];
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    moex_model *cpu = load(dir, MOEX_DEVICE_CPU, MOEX_F32);
    moex_model *gpu = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
    snprintf(what, sizeof what, "the %s checkpoint loads on the cpu and on cuda (f32 compute)", fmt);
    check(cpu && gpu, name, what);
    if (cpu && gpu) {
        run_out ref = generate(cpu, 0), dev = generate(gpu, 0), graph = generate(gpu, 1);
        check(ref.ok && dev.ok && graph.ok, name, "generates on the cpu and on cuda");
        if (ref.ok && dev.ok) {
            snprintf(what, sizeof what, "%s greedy tokens on cuda equal the cpu's %s tokens", fmt, fmt);
            check(same_tokens(&dev, &ref), name, what);
            double ex = logits_excess(&dev, &ref, 1e-2);
            snprintf(what, sizeof what, "%s last-prompt logits within 1e-2 + 1e-2 |x| of the cpu's (excess %.3g)", fmt,
                     ex);
            check(ex <= 1e-2, name, what);
        }
        snprintf(what, sizeof what, "graph-captured %s decode gives the same tokens", fmt);
        if (dev.ok && graph.ok) check(same_tokens(&graph, &dev), name, what);
        if (strcmp(fmt, "FP8") == 0 && dev.ok) { /* deepgemm's GEMMs (every step, no decode switch): grouped_mm's tokens */
            check(moex_model_set_experts(gpu, "deepgemm") == MOEX_OK, name, "deepgemm takes the FP8 experts");
            run_out dg = generate(gpu, 0), dgg = generate(gpu, 1);
            check(dg.ok && same_tokens(&dg, &dev), name, "deepgemm's greedy tokens equal grouped_mm's");
            check(dgg.ok && same_tokens(&dgg, &dev), name, "deepgemm's graph-captured decode gives the same tokens");
            run_free(&dg);
            run_free(&dgg);
        }
        run_free(&ref);
        run_free(&dev);
        run_free(&graph);
    }
    moex_model_free(cpu);
    moex_model_free(gpu);
}

/* One rank of a group: both prompts (generate's), or none (idle steps until the other is done). */
typedef struct ep_rank_job {
    moex_model *m;
    int prompts;
    run_out out;
    moex_status st;
} ep_rank_job;

static void *ep_rank_run(void *arg) {
    ep_rank_job *j = arg;
    if (j->prompts) {
        j->out = generate(j->m, 0);
        j->st = j->out.ok ? MOEX_OK : MOEX_ERR_INTERNAL;
        return NULL;
    }
    moex_generate_options o = moex_generate_default_options();
    o.max_new_tokens = NEW;
    moex_generation *g = NULL;
    j->st = moex_generate(j->m, 0, NULL, NULL, &o, &g);
    if (j->st) printf("  generate (no prompts): %s\n", moex_last_error());
    moex_generation_free(g);
    return NULL;
}

/* gpus: 1, every rank on g_gpu; 2, rank r on cuda:r. The ranks' experts on `experts` (NULL: the
 * default), one model's on the default. */
static void test_expert_parallel(const char *name, int gpus, const char *experts) {
    char dir[512], what[200];
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    g_dequantize = 0;
    g_ep_group = NULL;
    moex_model *one = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
    run_out ref = one ? generate(one, 0) : (run_out){0};
    moex_model_free(one);
    check(ref.ok, name, "one model holding every expert generates on cuda");
    moex_ep_group *g[2] = {NULL, NULL};
    check(moex_ep_local_groups(2, g) == MOEX_OK, name, "a local group of 2 ranks");
    ep_rank_job jobs[2];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < 2 && g[0]; r++) {
        g_ep_group = g[r];
        g_load_gpu = gpus == 2 ? r : -1;
        g_experts = experts;
        jobs[r].m = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
        snprintf(what, sizeof what, "rank %d of 2 loads on cuda%s with its share of the experts%s%s", r,
                 gpus == 2 ? (r ? ":1" : ":0") : "", experts ? " on " : "", experts ? experts : "");
        check(jobs[r].m != NULL, name, what);
    }
    g_ep_group = NULL;
    g_load_gpu = -1;
    g_experts = NULL;
    for (int busy = 0; busy < 2 && ref.ok && jobs[0].m && jobs[1].m; busy++) {
        pthread_t th[2];
        int started = 0;
        for (int r = 0; r < 2; r++) {
            jobs[r].prompts = r == busy;
            if (pthread_create(&th[r], NULL, ep_rank_run, &jobs[r])) break;
            started++;
        }
        if (started < 2) { /* the started rank waits for the other in its first exchange */
            printf("  could not start a rank's thread\n");
            exit(1);
        }
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        snprintf(what, sizeof what, "rank %d with both prompts and rank %d with none generate", busy, 1 - busy);
        check(!jobs[0].st && !jobs[1].st, name, what);
        const run_out *o = &jobs[busy].out;
        snprintf(what, sizeof what, "rank %d's tokens are one model's", busy);
        check(o->ok && same_tokens(o, &ref), name, what);
        const double ex = o->ok ? logits_excess(o, &ref, 0) : INFINITY;
        snprintf(what, sizeof what, "rank %d's last-prompt logits within 1e-4 of one model's (largest diff %.3g)", busy, ex);
        check(ex <= 1e-4, name, what);
        run_free(&jobs[busy].out);
    }
    for (int r = 0; r < 2; r++) moex_model_free(jobs[r].m);
    for (int r = 0; r < 2; r++) moex_ep_group_free(g[r]);
    if (experts) {
        run_free(&ref);
        return;
    }
    /* a group of one: a captured decode step is refused before any exchange */
    moex_ep_group *solo = NULL;
    if (moex_ep_local_groups(1, &solo) == MOEX_OK) {
        g_ep_group = solo;
        moex_model *m = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
        g_ep_group = NULL;
        run_out r = m ? generate(m, 1) : (run_out){0};
        check(m && !r.ok && strstr(moex_last_error(), "cannot be captured"), name,
              "a rank's captured decode step is refused, naming why");
        run_free(&r);
        moex_model_free(m);
        moex_ep_group_free(solo);
    }
    run_free(&ref);
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_model", argc, argv, &g_quick, &g_gpu)) return 2;
    moex_device dev = {MOEX_DEVICE_CUDA, g_gpu};
    moex_device_info info;
    if (moex_device_query(dev, &info) != MOEX_OK) {
        fprintf(stderr, "test_cuda_model: moex_device_query(cuda:%d): %s\n", g_gpu, moex_last_error());
        return 1;
    }
    if (!info.available) {
        printf("SKIP: cuda:%d is not usable: %s\n", g_gpu, info.reason);
        return EXIT_SKIP;
    }
    printf("test_cuda_model: moex %s on %s (compute capability %d.%d)%s\n", moex_version(), info.name, info.cc_major,
           info.cc_minor, g_quick ? ", quick subset" : "");
    fflush(stdout);
    const int n = (int)(sizeof FIXTURES / sizeof FIXTURES[0]);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int before = g_failures, checks = g_checks;
        test_fixture(FIXTURES[i]);
        int f = g_failures - before;
        printf("[%s] %-24s %3d checks, %d failed\n", f ? "FAIL" : " OK ", FIXTURES[i], g_checks - checks, f);
        fflush(stdout);
        failed += f != 0;
    }
    {
        int before = g_failures, checks = g_checks;
        g_dequantize = 0;
        test_quant_fixture("qwen3_moe-fp8-128", "FP8");
        test_quant_fixture("deepseek_v3-fp8-128", "FP8"); /* FP8 experts and latent attention on the GPU */
        test_quant_fixture("gpt_oss-mxfp4", "FP4");       /* MXFP4 experts (interleaved, biases, clamp) */
        /* qwen3_moe-fp8: hidden 80, intermediate 40, 32 x 32 blocks; deepseek_v3-fp8: intermediate 24: not what
         * the GPU's FP8 kernels take. Each refused, naming it. */
        static const char *const refused[2][2] = {{"qwen3_moe-fp8", "40"}, {"deepseek_v3-fp8", "24"}};
        for (int i = 0; i < 2; i++) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, refused[i][0]);
            moex_model_options mo = moex_model_default_options();
            mo.device.kind = MOEX_DEVICE_CUDA;
            mo.device.index = g_gpu;
            moex_model *m = NULL;
            const moex_status st = moex_model_load(dir, &mo, &m);
            printf("  %s on cuda: %s\n", refused[i][0], st ? moex_last_error() : "loaded");
            check(st == MOEX_ERR_UNSUPPORTED && !m && strstr(moex_last_error(), refused[i][1]), refused[i][0],
                  "refused on cuda, naming what its quantized experts need");
            if (m) moex_model_free(m);
        }
        const int f = g_failures - before;
        printf("[%s] %-24s %3d checks, %d failed\n", f ? "FAIL" : " OK ", "fp8/fp4 checkpoints", g_checks - checks, f);
        failed += f != 0;
    }
    {
        int before = g_failures, checks = g_checks;
        test_expert_parallel("qwen3_moe", 1, NULL);
        test_expert_parallel("deepseek_v3", 1, NULL);
        setenv("MOEX_MEGAMOE_PIECE_ROWS", "8", 1); /* the 20-token prefill's exchange in pieces */
        test_expert_parallel("qwen3_moe", 1, "deepgemm_megamoe");
        {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/qwen3_moe", MOEX_FIXTURES);
            g_experts = "deepgemm_megamoe";
            moex_model *m = load(dir, MOEX_DEVICE_CUDA, MOEX_F32);
            g_experts = NULL;
            check(!m && strstr(moex_last_error(), "expert-parallel group"), "qwen3_moe",
                  "deepgemm_megamoe without a group is refused at load, naming the group");
            moex_model_free(m);
        }
        moex_device_info second;
        if (moex_device_query((moex_device){MOEX_DEVICE_CUDA, 1}, &second) == MOEX_OK && second.available) {
            test_expert_parallel("qwen3_moe", 2, "deepgemm_megamoe");
            unsetenv("MOEX_MEGAMOE_PIECE_ROWS");
            test_expert_parallel("qwen3_moe", 2, NULL);
            test_expert_parallel("deepseek_v3", 2, NULL);
        } else {
            printf("  (one GPU: the ranks on two GPUs are not run)\n");
        }
        unsetenv("MOEX_MEGAMOE_PIECE_ROWS");
        const int f = g_failures - before;
        printf("[%s] %-24s %3d checks, %d failed\n", f ? "FAIL" : " OK ", "expert parallelism", g_checks - checks, f);
        failed += f != 0;
    }
    printf("test_cuda_model: %d of %d tests passed, %d checks, %d failed\n", n + 2 - failed, n + 2, g_checks, g_failures);
    return g_failures ? 1 : 0;
}
