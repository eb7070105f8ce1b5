/* test_ep_model.c — whole models in an expert-parallel group (moex_model_options.ep_group): the
 * fixtures' checkpoints loaded once per rank of a group of ranks in this process (threads), each
 * rank holding its share of every MoE layer's experts and generating its own prompts, must give
 * the tokens and last-prompt logits of one model holding every expert on all the prompts (f32:
 * logits within 1e-5). The ranks' prompts differ in number (one rank may have none) and length,
 * and their max_new_tokens differ, so that ranks run idle steps while others prefill and decode.
 * Then the errors: a group that does not divide the experts, a share smaller than top_k, a GPU that
 * is not there (tests/gpu/test_cuda_model runs a group on one), one rank's bad prompt failing every
 * rank (the others naming it), and no prompts without a group. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moex.h"
#include "testutil.h"

#ifndef MOEX_FIXTURES
#define MOEX_FIXTURES "tests/fixtures"
#endif

enum { MAXR = 4, NPROMPTS = 4, MAX_NEW = 8 };

/* Four prompts of the fixtures' vocabularies (every fixture's is at least 64 ids), of lengths
 * 6, 3, 11 and 1. */
static const int32_t P0[] = {5, 17, 42, 8, 33, 2}, P1[] = {9, 60, 14}, P2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
                     P3[] = {27};
static const int32_t *const PROMPTS[NPROMPTS] = {P0, P1, P2, P3};
static const int64_t LENS[NPROMPTS] = {6, 3, 11, 1};

static int g_dequantize; /* options(): the models load with --dequantize */

static moex_model_options options(const char *backend, moex_dtype dt, moex_ep_group *g) {
    moex_model_options mo = moex_model_default_options();
    mo.dequantize = g_dequantize;
    mo.experts = backend;
    mo.dtype = dt;
    mo.num_threads = 1;
    mo.max_batch = NPROMPTS;
    mo.max_seq = 32;
    mo.max_tokens = 8; /* the 11-token prompt goes in two pieces */
    mo.ep_group = g;
    return mo;
}

/* One rank: its model, prompts (indices into PROMPTS) and max_new_tokens; its result. */
typedef struct rank_job {
    moex_model *m;
    int n, which[NPROMPTS];
    int64_t max_new;
    moex_generation *g;
    moex_status st;
    char msg[512];
} rank_job;

static void *rank_run(void *arg) {
    rank_job *j = arg;
    const int32_t *p[NPROMPTS];
    int64_t lens[NPROMPTS];
    for (int i = 0; i < j->n; i++) p[i] = PROMPTS[j->which[i]], lens[i] = LENS[j->which[i]];
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = j->max_new;
    go.ignore_eos = 1;
    go.want_logits = 1;
    j->st = moex_generate(j->m, j->n, p, lens, &go, &j->g);
    snprintf(j->msg, sizeof j->msg, "%s", j->st ? moex_last_error() : "");
    return NULL;
}

static void run_ranks(rank_job *jobs, int R) {
    pthread_t th[MAXR];
    for (int r = 0; r < R; r++)
        if (pthread_create(&th[r], NULL, rank_run, &jobs[r])) {
            fprintf(stderr, "could not start rank %d\n", r);
            abort(); /* the ranks already started would wait for it forever */
        }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
}

/* The fixture on one model holding every expert: all four prompts, MAX_NEW tokens each. */
static moex_generation *reference(const char *dir, const char *backend, moex_dtype dt) {
    moex_model_options mo = options(backend, dt, NULL);
    moex_model *m = NULL;
    if (moex_model_load(dir, &mo, &m)) fail_msg("%s: load: %s", dir, moex_last_error());
    rank_job j = {m, NPROMPTS, {0, 1, 2, 3}, MAX_NEW, NULL, MOEX_OK, ""};
    rank_run(&j);
    if (j.st) fail_msg("%s %s: generate: %s", dir, backend, j.msg);
    moex_model_free(m);
    return j.g;
}

/* R ranks of fixture `name` with `backend`: rank r gets prompts split[r] (-1 ends a list) and
 * max_new[r] tokens; every prompt's tokens and logits against the reference. */
static void check_group(const char *name, const char *backend, moex_dtype dt, int R, const int split[][NPROMPTS + 1],
                        const int64_t *max_new, double logit_bound) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    moex_generation *ref = reference(dir, backend, dt);
    moex_ep_group *g[MAXR];
    assert_int_equal(moex_ep_local_groups(R, g), MOEX_OK);
    rank_job jobs[MAXR];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < R; r++) {
        moex_model_options mo = options(backend, dt, g[r]);
        if (moex_model_load(dir, &mo, &jobs[r].m)) fail_msg("%s rank %d: load: %s", name, r, moex_last_error());
        for (int i = 0; split[r][i] >= 0; i++) jobs[r].which[jobs[r].n++] = split[r][i];
        jobs[r].max_new = max_new[r];
    }
    run_ranks(jobs, R);
    for (int r = 0; r < R; r++) {
        if (jobs[r].st) fail_msg("%s %s rank %d of %d: generate: %s", name, backend, r, R, jobs[r].msg);
        assert_int_equal(jobs[r].g->n, jobs[r].n);
        for (int i = 0; i < jobs[r].n; i++) {
            const int p = jobs[r].which[i];
            assert_int_equal(jobs[r].g->num_new[i], max_new[r]);
            for (int64_t t = 0; t < max_new[r]; t++)
                if (jobs[r].g->new_ids[i][t] != ref->new_ids[p][t])
                    fail_msg("%s %s rank %d of %d, prompt %d: token %lld is %d, one model's %d", name, backend, r, R, p,
                             (long long)t, jobs[r].g->new_ids[i][t], ref->new_ids[p][t]);
            double worst = 0;
            for (int64_t v = 0; v < ref->vocab; v++) {
                const double d = fabs((double)jobs[r].g->last_prompt_logits[i][v] - ref->last_prompt_logits[p][v]);
                worst = d > worst ? d : worst;
            }
            if (!(worst <= logit_bound))
                fail_msg("%s %s rank %d of %d, prompt %d: logits differ by %.3g > %.1g", name, backend, r, R, p, worst,
                         logit_bound);
        }
        moex_generation_free(jobs[r].g);
        moex_model_free(jobs[r].m);
    }
    for (int r = 0; r < R; r++) moex_ep_group_free(g[r]);
    moex_generation_free(ref);
}

/* qwen3_moe, two ranks: three prompts against one (the 11-token one in two prefill pieces). */
static void test_qwen3_two_ranks(void **state) {
    (void)state;
    static const int split[2][NPROMPTS + 1] = {{0, 1, 3, -1}, {2, -1}};
    static const int64_t max_new[2] = {MAX_NEW, 3};
    check_group("qwen3_moe", "grouped_mm", MOEX_F32, 2, split, max_new, 1e-5);
    check_group("qwen3_moe-fused", "batched_mm", MOEX_F32, 2, split, max_new, 1e-5);
}

/* deepseek_v3 (latent attention, a dense first layer, shared experts, grouped sigmoid routing),
 * four ranks of two experts, one without prompts. */
static void test_deepseek_four_ranks(void **state) {
    (void)state;
    static const int split[4][NPROMPTS + 1] = {{0, -1}, {1, 3, -1}, {-1}, {2, -1}};
    static const int64_t max_new[4] = {2, MAX_NEW, 5, 1};
    check_group("deepseek_v3", "grouped_mm", MOEX_F32, 4, split, max_new, 1e-5);
}

/* gpt_oss (biases, interleaved gate/up, the clamped activation) through eager; qwen2_moe (a
 * shared expert with its gate) in bf16 compute; the FP8 per-expert checkpoint run quantized. */
static void test_other_families(void **state) {
    (void)state;
    static const int split[2][NPROMPTS + 1] = {{3, -1}, {0, 1, 2, -1}};
    static const int64_t max_new[2] = {MAX_NEW, 4};
    check_group("gpt_oss", "eager", MOEX_F32, 2, split, max_new, 1e-5);
    check_group("qwen2_moe", "grouped_mm", MOEX_BF16, 2, split, max_new, 1e-5);
    check_group("qwen3_moe-fp8", "grouped_mm", MOEX_F32, 2, split, max_new, 1e-5);
}

/* A rank copies (in bf16 compute) or dequantizes (--dequantize) its share of the experts only:
 * each of 2 ranks holds half the experts' copies fewer than one model (the other weights are
 * copied alike), for per-expert and fused f32 experts in bf16 (GPT-OSS's with their biases) and
 * for per-expert and fused e4m3 and GPT-OSS's MXFP4 experts dequantized; the shares of the fused and quantized ones generate
 * one model's tokens. */
static void test_rank_copies_its_share(void **state) {
    (void)state;
    static const struct {
        const char *name;
        moex_dtype dt;
        int dequantize, biases; /* biases: the checkpoint's bf16 expert biases copied to f32 too */
    } CASES[] = {{"qwen3_moe", MOEX_BF16, 0, 0},
                 {"qwen3_moe-fused", MOEX_BF16, 0, 0},
                 {"qwen3_moe-fp8", MOEX_F32, 1, 0},
                 {"qwen3_moe-fp8-fused-flat", MOEX_BF16, 1, 0},
                 {"gpt_oss-mxfp4", MOEX_F32, 1, 1},
                 {"gpt_oss", MOEX_BF16, 0, 0}}; /* f32 biases: copied whole, before the share */
    static const int split[2][NPROMPTS + 1] = {{2, 3, -1}, {0, 1, -1}};
    static const int64_t max_new[2] = {3, MAX_NEW};
    for (int f = 0; f < (int)(sizeof CASES / sizeof CASES[0]); f++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, CASES[f].name);
        g_dequantize = CASES[f].dequantize;
        moex_model_options mo = options("grouped_mm", CASES[f].dt, NULL);
        moex_model *m = NULL;
        if (moex_model_load(dir, &mo, &m)) fail_msg("%s: load: %s", CASES[f].name, moex_last_error());
        moex_model_info one;
        assert_int_equal(moex_model_get_info(m, &one), MOEX_OK);
        moex_model_free(m);
        const size_t H = (size_t)one.hidden, I = (size_t)one.moe_intermediate;
        const size_t experts = (size_t)one.num_moe_layers * (size_t)one.num_experts *
                               (3 * H * I + (CASES[f].biases ? 2 * I + H : 0)) * (CASES[f].dt == MOEX_BF16 ? 2 : 4);
        assert_true(one.host_weight_copy_bytes >= experts); /* the experts' copies among them */
        moex_ep_group *g[2];
        assert_int_equal(moex_ep_local_groups(2, g), MOEX_OK);
        for (int r = 0; r < 2; r++) {
            mo = options("grouped_mm", CASES[f].dt, g[r]);
            if (moex_model_load(dir, &mo, &m)) fail_msg("%s rank %d: load: %s", CASES[f].name, r, moex_last_error());
            moex_model_info info;
            assert_int_equal(moex_model_get_info(m, &info), MOEX_OK);
            if (info.host_weight_copy_bytes != one.host_weight_copy_bytes - experts / 2)
                fail_msg("%s rank %d of 2: %zu bytes of weight copies, one model's %zu less half its experts' %zu",
                         CASES[f].name, r, info.host_weight_copy_bytes, one.host_weight_copy_bytes, experts);
            moex_model_free(m);
        }
        for (int r = 0; r < 2; r++) moex_ep_group_free(g[r]);
        if (f > 0) check_group(CASES[f].name, "grouped_mm", CASES[f].dt, 2, split, max_new, 1e-5);
        g_dequantize = 0;
    }
}

static void load_fails(const char *name, int R, moex_device dev, moex_status want, const char *a, const char *b) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    moex_ep_group *g[8];
    assert_int_equal(moex_ep_local_groups(R, g), MOEX_OK);
    moex_model_options mo = options("grouped_mm", MOEX_F32, g[R - 1]);
    mo.device = dev;
    moex_model *m = (moex_model *)&mo; /* must stay untouched */
    assert_int_equal(moex_model_load(dir, &mo, &m), want);
    assert_ptr_equal(m, (moex_model *)&mo);
    if (!contains(moex_last_error(), a) || !contains(moex_last_error(), b))
        fail_msg("%s over %d ranks: \"%s\" lacks \"%s\" or \"%s\"", name, R, moex_last_error(), a, b);
    for (int r = 0; r < R; r++) moex_ep_group_free(g[r]);
}

static void test_load_errors(void **state) {
    (void)state;
    const moex_device cpu = {MOEX_DEVICE_CPU, 0}, cuda = {MOEX_DEVICE_CUDA, 0};
    load_fails("mixtral", 3, cpu, MOEX_ERR_INVALID_ARGUMENT, "num_experts = 4", "3 ranks");
    load_fails("qwen3_moe", 8, cpu, MOEX_ERR_INVALID_ARGUMENT, "leaves 1 experts a rank", "num_experts_per_tok = 2");
    moex_device_info info;
    if (moex_device_query(cuda, &info) == MOEX_OK && !info.available)
        load_fails("qwen3_moe", 2, cuda, MOEX_ERR_UNSUPPORTED, "cuda:0", "cuda:0");
}

/* Rank 1's prompt has a token outside the vocabulary: rank 1 fails with that, rank 0 (whose
 * prompts are fine) with a message naming rank 1; the group works again afterwards. A model
 * without a group still refuses no prompts. */
static void test_one_rank_fails(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_moe", MOEX_FIXTURES);
    moex_ep_group *g[2];
    assert_int_equal(moex_ep_local_groups(2, g), MOEX_OK);
    rank_job jobs[2];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < 2; r++) {
        moex_model_options mo = options("grouped_mm", MOEX_F32, g[r]);
        assert_int_equal(moex_model_load(dir, &mo, &jobs[r].m), MOEX_OK);
        jobs[r].max_new = 2;
    }
    static const int32_t bad[] = {3, 1 << 30};
    static const int32_t *const bad_prompt[1] = {bad};
    static const int64_t bad_len[1] = {2};
    /* rank 1 through the call itself, on its own thread (it must reach the agreement) */
    jobs[0].n = 1, jobs[0].which[0] = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, rank_run, &jobs[0]), 0);
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 2;
    moex_generation *out = NULL;
    const moex_status st1 = moex_generate(jobs[1].m, 1, bad_prompt, bad_len, &go, &out);
    char msg1[512];
    snprintf(msg1, sizeof msg1, "%s", moex_last_error());
    pthread_join(th, NULL);
    assert_int_equal(st1, MOEX_ERR_INVALID_ARGUMENT);
    assert_null(out);
    if (!contains(msg1, "token 1 of prompt 0 is 1073741824")) fail_msg("rank 1: %s", msg1);
    assert_int_equal(jobs[0].st, MOEX_ERR_INVALID_ARGUMENT);
    assert_null(jobs[0].g);
    if (!contains(jobs[0].msg, "rank 1 of 2 failed")) fail_msg("rank 0: %s", jobs[0].msg);
    /* both again, fine this time */
    jobs[1].n = 1, jobs[1].which[0] = 1;
    run_ranks(jobs, 2);
    for (int r = 0; r < 2; r++) {
        if (jobs[r].st) fail_msg("rank %d after the failure: %s", r, jobs[r].msg);
        assert_int_equal(jobs[r].g->num_new[0], 2);
        moex_generation_free(jobs[r].g);
        moex_model_free(jobs[r].m);
    }
    for (int r = 0; r < 2; r++) moex_ep_group_free(g[r]);
    moex_model_options mo = options("grouped_mm", MOEX_F32, NULL);
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
    assert_int_equal(moex_generate(m, 0, NULL, NULL, &go, &out), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "0 prompts"));
    moex_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_two_ranks),  cmocka_unit_test(test_deepseek_four_ranks),
        cmocka_unit_test(test_other_families),   cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_one_rank_fails),   cmocka_unit_test(test_rank_copies_its_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
