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

#include "moex.h"
#include "testutil.h"

#ifndef MOEX_FIXTURES
#define MOEX_FIXTURES "tests/fixtures"
#endif

static const char *const FIXTURES[] = {"qwen2_moe", "qwen2_moe-fused", "qwen3_moe", "qwen3_moe-fused", "mixtral",
                                       "mixtral-fused", "qwen3_vl_moe", "qwen3_vl_moe-per_expert"};
static const char *const BACKENDS[] = {"eager", "batched_mm", "grouped_mm"};

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
    for (size_t f = 0; f < sizeof FIXTURES / sizeof FIXTURES[0]; f++)
        for (size_t b = 0; b < sizeof BACKENDS / sizeof BACKENDS[0]; b++) check_fixture(FIXTURES[f], BACKENDS[b]);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_transformers),
        cmocka_unit_test(test_model_experts_map),
        cmocka_unit_test(test_model_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
