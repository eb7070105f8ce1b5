/* test_model.c — whole models against transformers: every fixture in
 * tests/fixtures (written by make_fixtures.py with transformers, f32) must give
 * the same greedy tokens and last-prompt logits within 1e-4, with each CPU
 * backend, in both experts layouts; plus the backend map of a loaded model and
 * load errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moex.h"
#include "testutil.h"
#include "backend_list.h"

#ifndef MOEX_FIXTURES
#define MOEX_FIXTURES "tests/fixtures"
#endif

static const char *const FIXTURES[] = {"qwen2_moe", "qwen2_moe-fused", "qwen3_moe", "qwen3_moe-fused", "mixtral",
                                       "mixtral-fused", "qwen3_vl_moe", "qwen3_vl_moe-per_expert", "olmoe",
                                       "olmoe-fused", "glm4_moe", "glm4_moe-fused", "deepseek_v3",
                                       "deepseek_v3-fused", "deepseek_v3-q_proj", "deepseek_v3-q_proj-fused",
                                       "deepseek_v3-yarn", "gpt_oss"};

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

// Load fixture dir with backend, generate greedily from its prompts, compare.
static void check_fixture(const char *name, const char *backend) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *text = read_file(path);
    assert_non_null(text);
    cJSON *exp = cJSON_Parse(text);
    assert_non_null(exp);
    const cJSON *prompts = cJSON_GetObjectItem(exp, "prompts"), *want_ids = cJSON_GetObjectItem(exp, "new_ids"),
                *want_logits = cJSON_GetObjectItem(exp, "last_prompt_logits");
    const int n = cJSON_GetArraySize(prompts);
    int32_t *ids[8];
    int64_t lens[8];
    for (int i = 0; i < n; i++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, i);
        lens[i] = cJSON_GetArraySize(p);
        ids[i] = malloc((size_t)lens[i] * sizeof(int32_t));
        for (int j = 0; j < lens[i]; j++) ids[i][j] = cJSON_GetArrayItem(p, j)->valueint;
    }
    moex_model_options mo = moex_model_default_options();
    mo.experts = backend;
    mo.num_threads = 2;
    mo.max_seq = 64;
    mo.max_tokens = 64;
    moex_model *m = NULL;
    moex_status st = moex_model_load(dir, &mo, &m);
    if (st) {
        PROBLEM("%s: load failed: %s", name, moex_last_error());
    } else {
        moex_generate_options go = moex_generate_default_options();
        go.max_new_tokens = cJSON_GetArraySize(cJSON_GetArrayItem(want_ids, 0));
        go.ignore_eos = 1;
        go.want_logits = 1;
        moex_generation *g = NULL;
        if ((st = moex_generate(m, n, (const int32_t *const *)ids, lens, &go, &g))) {
            PROBLEM("%s %s: generate failed: %s", name, backend, moex_last_error());
        } else {
            for (int i = 0; i < n; i++) {
                const cJSON *w = cJSON_GetArrayItem(want_ids, i), *l = cJSON_GetArrayItem(want_logits, i);
                for (int j = 0; j < cJSON_GetArraySize(w); j++)
                    if (j >= g->num_new[i] || g->new_ids[i][j] != cJSON_GetArrayItem(w, j)->valueint) {
                        PROBLEM("%s %s prompt %d: token %d is %d, transformers %d", name, backend, i, j,
                                j < g->num_new[i] ? g->new_ids[i][j] : -1, cJSON_GetArrayItem(w, j)->valueint);
                        break;
                    }
                double worst = 0;
                for (int v = 0; v < cJSON_GetArraySize(l); v++) {
                    double d = fabs(g->last_prompt_logits[i][v] - cJSON_GetArrayItem(l, v)->valuedouble);
                    if (d > worst) worst = d;
                }
                if (!(worst <= 1e-4)) PROBLEM("%s %s prompt %d: logits differ by %.3g > 1e-4", name, backend, i, worst);
            }
            moex_generation_free(g);
        }
        moex_model_free(m);
    }
    for (int i = 0; i < n; i++) free(ids[i]);
    cJSON_Delete(exp);
    free(text);
}

static void test_fixtures_match_transformers(void **state) {
    (void)state;
    const backend_list backends = cpu_backends(); /* every registered backend that takes the CPU */
    if (backends.n == 0) PROBLEM("no registered backend takes the CPU");
    for (size_t f = 0; f < sizeof FIXTURES / sizeof FIXTURES[0]; f++)
        for (int b = 0; b < backends.n; b++) check_fixture(FIXTURES[f], backends.name[b]);
    end_problems();
}

static void test_model_experts_map(void **state) {
    (void)state;
    moex_model_options mo = moex_model_default_options();
    mo.experts = "{\"text_config\": \"eager\", \"\": \"batched_mm\"}";
    mo.max_seq = 32;
    mo.max_tokens = 32;
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_vl_moe", &mo, &m), MOEX_OK);
    char buf[256];
    assert_int_equal(moex_model_get_experts(m, buf, sizeof buf), MOEX_OK);
    assert_string_equal(buf, "{\"\": \"batched_mm\", \"text_config\": \"eager\", \"vision_config\": \"batched_mm\"}");
    assert_int_equal(moex_model_set_experts(m, "grouped_mm"), MOEX_OK);
    assert_int_equal(moex_model_get_experts(m, buf, sizeof buf), MOEX_OK);
    assert_string_equal(buf, "{\"\": \"grouped_mm\", \"text_config\": \"grouped_mm\", \"vision_config\": \"grouped_mm\"}");
    assert_int_equal(moex_model_set_experts(m, "{\"audio_config\": \"eager\"}"), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "text_config"));
    assert_int_equal(moex_model_set_experts(m, "deepgemm"), MOEX_ERR_UNSUPPORTED);
    assert_int_equal(moex_model_get_experts(m, buf, sizeof buf), MOEX_OK); /* unchanged after a failure */
    assert_string_equal(buf, "{\"\": \"grouped_mm\", \"text_config\": \"grouped_mm\", \"vision_config\": \"grouped_mm\"}");
    moex_model_free(m);
}

/* moex_model_info.features names what each family runs, read from the checkpoint. */
static void test_model_features(void **state) {
    (void)state;
    static const struct { const char *fixture, *want[3]; } cases[] = {
        {"olmoe", {"q/k norm over the whole rows", "router softmax top-2", "head_dim 16"}},
        {"qwen3_moe", {"q/k norm per head", "renormalised", "theta 1e+06"}},
        {"qwen2_moe", {"q/k/v biases", "gated shared expert", "1 dense layer(s)"}},
        {"qwen3_vl_moe", {"mrope sections 4/2/2", "q/k norm per head", "2 kv heads"}},
        {"deepseek_v3", {"attention: MLA, 4 heads, q_lora_rank 32, kv_lora_rank 16, q/k 16 + 8 rope, v 16, interleaved",
                         "router sigmoid top-2 in 1 of 2 groups, correction bias, scaling 2.5", "1 dense layer(s)"}},
        {"deepseek_v3-q_proj", {"attention: MLA, 4 heads, kv_lora_rank 16", "rotate-half rope", "; shared experts"}},
        {"gpt_oss", {"sinks", "sliding window 4 on 2 of 3 layers", "router top-2 then softmax"}},
        {"glm4_moe", {"8 of 16 values rotated", "router sigmoid top-2 in 1 of 2 groups, correction bias, "
                      "scaling 2.5, renormalised", "; shared experts; 1 dense layer(s)"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, cases[i].fixture);
        moex_model_options mo = moex_model_default_options();
        mo.max_seq = 16;
        mo.max_tokens = 16;
        moex_model *m = NULL;
        assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
        moex_model_info in;
        assert_int_equal(moex_model_get_info(m, &in), MOEX_OK);
        /* the cache: the latents of deepseek_v3 ((16 + 8) x 3 layers), k and v elsewhere (2 x 2 x 16 x 3) */
        const size_t per_token = strncmp(cases[i].fixture, "deepseek_v3", 11) ? 2 * 2 * 16 * 3 * 4 : (16 + 8) * 3 * 4;
        if (in.kv_cache_bytes_per_token != per_token)
            PROBLEM("%s: %zu cache bytes per token, want %zu", cases[i].fixture, in.kv_cache_bytes_per_token, per_token);
        for (int j = 0; j < 3; j++)
            if (!contains(in.features, cases[i].want[j]))
                PROBLEM("%s: features \"%s\" lack \"%s\"", cases[i].fixture, in.features, cases[i].want[j]);
        moex_model_free(m);
    }
    end_problems();
}

static void test_model_load_errors(void **state) {
    (void)state;
    moex_model *m = NULL;
    assert_int_not_equal(moex_model_load("/nonexistent/dir", NULL, &m), MOEX_OK);
    assert_null(m);
    moex_model_options mo = moex_model_default_options();
    mo.experts = "no_such_backend";
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", &mo, &m), MOEX_ERR_NOT_FOUND);
    assert_true(contains(moex_last_error(), "grouped_mm"));
    assert_null(m);
}


/* A temporary copy of a fixture whose config.json (and generation_config.json)
 * are replaced; the weights are linked, not copied. Returns the directory. */
static const char *variant(const char *fixture, const char *config_sed, const char *gen_config) {
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/moex_test_model_%d", (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && ln -s %s/%s/model.safetensors %s/ && sed '%s' %s/%s/config.json > %s/config.json",
             dir, dir, MOEX_FIXTURES, fixture, dir, config_sed, MOEX_FIXTURES, fixture, dir);
    assert_int_equal(system(cmd), 0);
    if (gen_config) {
        snprintf(cmd, sizeof cmd, "%s/generation_config.json", dir);
        FILE *f = fopen(cmd, "w");
        assert_non_null(f);
        fputs(gen_config, f);
        fclose(f);
    }
    return dir;
}

static void remove_variant(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_unknown_family_and_missing_tensor(void **state) {
    (void)state;
    moex_model *m = NULL;
    const char *dir = variant("qwen3_moe", "s/\"model_type\": \"qwen3_moe\"/\"model_type\": \"llama4\"/", NULL);
    assert_int_equal(moex_model_load(dir, NULL, &m), MOEX_ERR_UNSUPPORTED);
    assert_true(contains(moex_last_error(), "llama4"));
    assert_true(contains(moex_last_error(), "qwen2_moe"));
    assert_true(contains(moex_last_error(), "mixtral"));
    assert_null(m);
    remove_variant(dir);
    dir = variant("qwen3_moe", "s/\"num_hidden_layers\": 3/\"num_hidden_layers\": 4/", NULL);
    assert_int_equal(moex_model_load(dir, NULL, &m), MOEX_ERR_NOT_FOUND);
    assert_true(contains(moex_last_error(), "model.layers.3."));
    assert_null(m);
    remove_variant(dir);
}

// Greedy tokens of the qwen3_moe fixture's first prompt with the given options.
static moex_generation *generate_first(const char *dir, const moex_generate_options *go) {
    static const int32_t prompt[] = {3, 17, 42, 7, 99, 5};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {6};
    moex_model *m = NULL;
    moex_model_options mo = moex_model_default_options();
    mo.max_seq = 64;
    assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 1, p, len, go, &g), MOEX_OK);
    moex_model_free(m);
    return g;
}

static void test_eos_and_sampling(void **state) {
    (void)state;
    /* transformers' greedy continuation starts 80 16 42: with 42 as end-of-sequence, generation stops there */
    const char *dir = variant("qwen3_moe", "s/x/x/", "{\"eos_token_id\": [99, 42]}");
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 8;
    moex_generation *g = generate_first(dir, &go);
    assert_int_equal(g->num_new[0], 3);
    assert_int_equal(g->new_ids[0][2], 42);
    moex_generation_free(g);
    go.ignore_eos = 1;
    g = generate_first(dir, &go);
    assert_int_equal(g->num_new[0], 8);
    moex_generation_free(g);
    remove_variant(dir);
    /* sampling: the same seed gives the same tokens; top_k = 1 is greedy */
    go.temperature = 0.8f;
    go.top_p = 0.9f;
    go.seed = 1234;
    moex_generation *a = generate_first(MOEX_FIXTURES "/qwen3_moe", &go), *b = generate_first(MOEX_FIXTURES "/qwen3_moe", &go);
    assert_memory_equal(a->new_ids[0], b->new_ids[0], sizeof(int32_t) * 8);
    moex_generation_free(a);
    moex_generation_free(b);
    go.top_k = 1;
    a = generate_first(MOEX_FIXTURES "/qwen3_moe", &go);
    const int32_t greedy[8] = {80, 16, 42, 59, 43, 30, 30, 30};
    assert_memory_equal(a->new_ids[0], greedy, sizeof greedy);
    moex_generation_free(a);
}

/* bf16 compute: activations rounded to bf16 where transformers keeps bf16 tensors, weights
 * converted to bf16 at load. Against the f32 logits of transformers: within 5e-2 and the same
 * greedy tokens. (The qwen3_vl_moe fixture is left out: one of its router choices lies within
 * bf16 rounding of a tie, so its bf16 run picks another expert there, as a bf16 peer may.) */
static void test_bf16_compute(void **state) {
    (void)state;
    /* not glm4_moe and deepseek_v3: their fixtures' router gaps (1.9e-3, 5.5e-5) lie below bf16's resolution and
     * their bf16 logits move 0.50 and 0.058 from the f32 ones (measured; the greedy tokens stay equal) */
    const char *fixtures[] = {"qwen2_moe", "qwen3_moe-fused", "mixtral", "olmoe", "gpt_oss"};
    static const int32_t prompt[] = {3, 17, 42, 7, 99, 5};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {6};
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, fixtures[f]);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        char *text = read_file(path);
        cJSON *exp = cJSON_Parse(text);
        const cJSON *want_ids = cJSON_GetArrayItem(cJSON_GetObjectItem(exp, "new_ids"), 0);
        const cJSON *want_logits = cJSON_GetArrayItem(cJSON_GetObjectItem(exp, "last_prompt_logits"), 0);
        moex_model_options mo = moex_model_default_options();
        mo.dtype = MOEX_BF16;
        mo.max_seq = 64;
        moex_model *m = NULL;
        assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
        moex_generate_options go = moex_generate_default_options();
        go.max_new_tokens = 8;
        go.ignore_eos = 1;
        go.want_logits = 1;
        moex_generation *g = NULL;
        assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_OK);
        double worst = 0;
        for (int v = 0; v < cJSON_GetArraySize(want_logits); v++) {
            double d = fabs(g->last_prompt_logits[0][v] - cJSON_GetArrayItem(want_logits, v)->valuedouble);
            worst = d > worst ? d : worst;
        }
        if (!(worst <= 5e-2)) PROBLEM("%s bf16: logits differ from f32 by %.3g > 5e-2", fixtures[f], worst);
        for (int j = 0; j < 8; j++)
            if (g->new_ids[0][j] != cJSON_GetArrayItem(want_ids, j)->valueint) {
                PROBLEM("%s bf16: token %d differs", fixtures[f], j);
                break;
            }
        moex_generation_free(g);
        moex_model_free(m);
        cJSON_Delete(exp);
        free(text);
    }
    end_problems();
}

/* Prompts longer than one step's max_tokens are prefilled in pieces (4 tokens a step for prompts
 * of 6 and 3 tokens, two sequences at once): same tokens and logits as transformers (qwen3_moe;
 * deepseek_v3, whose chunks after the first expand the latents cached by the one before). */
static void check_chunked_prefill(const char *fixture) {
    char path[600], dir[600];
    snprintf(path, sizeof path, "%s/%s/expected.json", MOEX_FIXTURES, fixture);
    snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, fixture);
    char *text = read_file(path);
    cJSON *exp = cJSON_Parse(text);
    static const int32_t p0[] = {3, 17, 42, 7, 99, 5}, p1[] = {11, 200, 64};
    const int32_t *p[2] = {p0, p1};
    int64_t lens[2] = {6, 3};
    moex_model_options mo = moex_model_default_options();
    mo.max_seq = 32;
    mo.max_tokens = 4;
    mo.max_batch = 2;
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 8;
    go.ignore_eos = 1;
    go.want_logits = 1;
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 2, p, lens, &go, &g), MOEX_OK);
    for (int i = 0; i < 2; i++) {
        const cJSON *w = cJSON_GetArrayItem(cJSON_GetObjectItem(exp, "new_ids"), i);
        const cJSON *l = cJSON_GetArrayItem(cJSON_GetObjectItem(exp, "last_prompt_logits"), i);
        for (int j = 0; j < 8; j++) assert_int_equal(g->new_ids[i][j], cJSON_GetArrayItem(w, j)->valueint);
        for (int v = 0; v < cJSON_GetArraySize(l); v++)
            assert_true(fabs(g->last_prompt_logits[i][v] - cJSON_GetArrayItem(l, v)->valuedouble) <= 1e-4);
    }
    moex_generation_free(g);
    moex_model_free(m);
    cJSON_Delete(exp);
    free(text);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    check_chunked_prefill("qwen3_moe");
    check_chunked_prefill("deepseek_v3");
    check_chunked_prefill("deepseek_v3-yarn");
    check_chunked_prefill("gpt_oss"); /* prompts longer than the window of 4, in chunks */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_transformers),
        cmocka_unit_test(test_model_experts_map),
        cmocka_unit_test(test_model_features),
        cmocka_unit_test(test_model_load_errors),
        cmocka_unit_test(test_unknown_family_and_missing_tensor),
        cmocka_unit_test(test_eos_and_sampling),
        cmocka_unit_test(test_bf16_compute),
        cmocka_unit_test(test_chunked_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
