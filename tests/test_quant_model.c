/* test_quant_model.c — pre-quantized FP8 checkpoints (tests/fixtures/qwen3_moe-fp8*, written by
 * make_fp8_fixtures.py with transformers' recipe) against what transformers computes on their
 * dequantized weights in f32:
 *   --dequantize:          the same greedy tokens, last-prompt logits within 1e-3;
 *   as FP8 (dynamic activation scales, every CPU backend): last-prompt logits within 0.25;
 * quantize-on-load of a bf16/f32 checkpoint; and bad checkpoints that must fail naming the problem. */
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

#include "core/internal.h" /* moex_read_file */
#include "moex.h"
#include "testutil.h"
#include "backend_list.h"

/* The FP4 experts of gpt_oss-mxfp4 against transformers' dequantized reference: 0.82 measured on every CPU
 * backend (the FP4 path quantizes the experts' activations per 32 too); the bound leaves a little room. */
#define MXFP4_BOUND 1.0
static const char *const FP8_FIXTURES[] = {"qwen3_moe-fp8", "qwen3_moe-fp8-ue8m0", "qwen3_moe-fp8-flat",
                                          "qwen3_moe-fp8-fused-flat", "qwen3_moe-fp8-128", "deepseek_v3-fp8",
                                          "deepseek_v3-fp8-128"};

/* What transformers wrote for a fixture. */
typedef struct expected {
    cJSON *json;
    int n;
    int32_t *prompts[4];
    int64_t lens[4];
} expected;

static void expected_load(const char *fixture, expected *x) {
    char path[512], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s/expected.json", MOEX_FIXTURES, fixture);
    if (moex_read_file(path, 1 << 24, &text, &len, NULL)) fail_msg("%s", moex_last_error());
    x->json = cJSON_Parse(text);
    free(text);
    assert_non_null(x->json);
    const cJSON *prompts = cJSON_GetObjectItem(x->json, "prompts");
    x->n = cJSON_GetArraySize(prompts);
    assert_true(x->n <= 4);
    for (int i = 0; i < x->n; i++) {
        const cJSON *p = cJSON_GetArrayItem(prompts, i);
        x->lens[i] = cJSON_GetArraySize(p);
        x->prompts[i] = malloc(sizeof(int32_t) * (size_t)x->lens[i]);
        for (int j = 0; j < x->lens[i]; j++) x->prompts[i][j] = cJSON_GetArrayItem(p, j)->valueint;
    }
}

static void expected_free(expected *x) {
    for (int i = 0; i < x->n; i++) free(x->prompts[i]);
    cJSON_Delete(x->json);
}

// Generate greedily from the fixture's prompts; NULL (and a PROBLEM) on failure.
static moex_generation *generate(const char *dir, const moex_model_options *mo, const expected *x) {
    moex_model *m = NULL;
    if (moex_model_load(dir, mo, &m)) {
        PROBLEM("%s: load failed: %s", dir, moex_last_error());
        return NULL;
    }
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(x->json, "new_ids"), 0));
    go.ignore_eos = 1;
    go.want_logits = 1;
    moex_generation *g = NULL;
    if (moex_generate(m, x->n, (const int32_t *const *)x->prompts, x->lens, &go, &g))
        PROBLEM("%s: generate failed: %s", dir, moex_last_error());
    moex_model_free(m);
    return g;
}

// Largest |logit - transformers'| over the prompts; *tokens_equal tells whether every greedy token matched.
static double compare(const moex_generation *g, const expected *x, int *tokens_equal) {
    const cJSON *ids = cJSON_GetObjectItem(x->json, "new_ids"), *logits = cJSON_GetObjectItem(x->json, "last_prompt_logits");
    double worst = 0;
    *tokens_equal = 1;
    for (int i = 0; i < x->n; i++) {
        const cJSON *w = cJSON_GetArrayItem(ids, i), *l = cJSON_GetArrayItem(logits, i);
        for (int j = 0; j < cJSON_GetArraySize(w); j++)
            if (j >= g->num_new[i] || g->new_ids[i][j] != cJSON_GetArrayItem(w, j)->valueint) *tokens_equal = 0;
        for (int v = 0; v < cJSON_GetArraySize(l); v++)
            worst = fmax(worst, fabs(g->last_prompt_logits[i][v] - cJSON_GetArrayItem(l, v)->valuedouble));
    }
    return worst;
}

static moex_model_options options(const char *backend) {
    moex_model_options mo = moex_model_default_options();
    mo.experts = backend;
    mo.num_threads = 2;
    mo.max_seq = 64;
    mo.max_tokens = 64;
    return mo;
}

// Every fixture of the list through every CPU backend, loaded quantized or with dequantize: the greedy
// tokens must match (dequantized only) and the last-prompt logits lie within bound of transformers'.
static void check_quant_fixtures(const char *const *fixtures, size_t n, int dequantize, double bound) {
    for (size_t f = 0; f < n; f++) {
        expected x;
        expected_load(fixtures[f], &x);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, fixtures[f]);
        const backend_list backends = cpu_backends(); /* every registered backend that takes the CPU */
        if (backends.n == 0) PROBLEM("no registered backend takes the CPU");
        for (int b = 0; b < backends.n; b++) {
            const char *be = backends.name[b];
            moex_model_options mo = options(be);
            mo.dequantize = dequantize;
            moex_generation *g = generate(dir, &mo, &x);
            if (!g) continue;
            int same;
            double worst = compare(g, &x, &same);
            const char *how = dequantize ? "--dequantize" : "quantized";
            print_message("%s %s, %s: last-prompt logits within %.4g of transformers; greedy tokens %s\n", fixtures[f],
                          how, be, worst, same ? "equal" : "differ");
            if (dequantize && !same) PROBLEM("%s %s %s: greedy tokens differ from transformers", fixtures[f], how, be);
            if (!(worst <= bound)) PROBLEM("%s %s %s: logits differ by %.3g > %g", fixtures[f], how, be, worst, bound);
            moex_generation_free(g);
        }
        expected_free(&x);
    }
    end_problems();
}

static void test_fp8_dequantized_matches_transformers(void **state) {
    (void)state;
    check_quant_fixtures(FP8_FIXTURES, sizeof FP8_FIXTURES / sizeof FP8_FIXTURES[0], 1, 1e-3);
}

static void test_fp8_quantized_close_to_transformers(void **state) {
    (void)state;
    check_quant_fixtures(FP8_FIXTURES, sizeof FP8_FIXTURES / sizeof FP8_FIXTURES[0], 0, 0.25);
}

/* gpt_oss's MXFP4 experts as OpenAI ships them (make_fp8_fixtures.py's gpt_oss-mxfp4): dequantized, the
 * reference's tokens and logits; as FP4 experts, close (their activations are quantized per 32 too); the
 * layer holds e2m1 weights with UE8M0 scales. */
static void test_mxfp4(void **state) {
    (void)state;
    static const char *const fx[] = {"gpt_oss-mxfp4"};
    check_quant_fixtures(fx, 1, 1, 1e-3);
    check_quant_fixtures(fx, 1, 0, MXFP4_BOUND);
    moex_model_options mo = options("grouped_mm");
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/gpt_oss-mxfp4", &mo, &m), MOEX_OK);
    const moex_experts_desc *d = moex_layer_desc(moex_model_experts_layer(m, 0));
    assert_int_equal(d->gate_up.dtype, MOEX_E2M1X2);
    assert_int_equal(d->gate_up_scale.dtype, MOEX_UE8M0);
    assert_int_equal(d->interleaved, 1);
    assert_int_equal(d->activation, MOEX_ACT_GPTOSS_CLAMP);
    moex_model_free(m);
}

/* The experts layer of a loaded checkpoint is quantized (or not) as expected. */
static void test_fp8_layer_and_info(void **state) {
    (void)state;
    moex_model_options mo = options("grouped_mm");
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe-fp8-ue8m0", &mo, &m), MOEX_OK);
    const moex_experts_desc *d = moex_layer_desc(moex_model_experts_layer(m, 0));
    assert_int_equal(d->expert_dtype, MOEX_E4M3);
    assert_int_equal(d->expert_scale_dtype, MOEX_UE8M0);
    assert_int_equal(d->block_n, 32);
    assert_int_equal(d->block_k, 32);
    moex_model_free(m);
    mo.dequantize = 1;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe-fp8", &mo, &m), MOEX_OK);
    d = moex_layer_desc(moex_model_experts_layer(m, 0));
    assert_int_equal(d->expert_dtype, MOEX_F32);
    moex_model_free(m);
}

/* Quantize-on-load of plain fixtures: per-expert and fused layouts, and gpt_oss's fused, transposed
 * and interleaved experts with biases (whose gate/up bias the per-expert layout reads as gate
 * biases then up biases). */
static void test_quantize_on_load(void **state) {
    (void)state;
    const char *formats[] = {"fp8", "fp8-ue8m0", "fp4"};
    const double bound[] = {0.25, 0.25, 1.5};
    const char *fixtures[] = {"qwen3_moe", "qwen3_moe-fused", "mixtral-fused", "gpt_oss"};
    for (int fx = 0; fx < 4; fx++) {
        expected x;
        expected_load(fixtures[fx], &x);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", MOEX_FIXTURES, fixtures[fx]);
        for (int f = 0; f < 3; f++) {
            moex_model_options mo = options("grouped_mm");
            mo.quantize = formats[f];
            moex_generation *g = generate(dir, &mo, &x);
            if (!g) continue;
            int same;
            double worst = compare(g, &x, &same);
            print_message("%s --quantize %s: last-prompt logits within %.4f of the unquantized model\n", fixtures[fx],
                          formats[f], worst);
            if (!(worst <= bound[f])) PROBLEM("%s --quantize %s: logits differ by %.3g > %g", fixtures[fx], formats[f], worst, bound[f]);
            moex_generation_free(g);
        }
        expected_free(&x);
    }
    moex_model_options mo = options("grouped_mm");
    mo.quantize = "fp6";
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", &mo, &m), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "fp6"));
    mo.quantize = "fp8";
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe-fp8", &mo, &m), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "already quantized"));
    end_problems();
}

/* A copy of the qwen3_moe-fp8 fixture with config.json edited by a sed script (weights linked). */
static const char *variant(const char *config_sed) {
    static char dir[256];
    char cmd[2048];
    snprintf(dir, sizeof dir, "/tmp/moex_test_quant_model_%d", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && ln -s %s/qwen3_moe-fp8/model.safetensors %s/ && "
             "sed '%s' %s/qwen3_moe-fp8/config.json > %s/config.json",
             dir, dir, MOEX_FIXTURES, dir, config_sed, MOEX_FIXTURES, dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static void expect_load_error(const char *dir, moex_status want, const char *needle1, const char *needle2) {
    moex_model_options mo = options("grouped_mm");
    moex_model *m = NULL;
    moex_status st = moex_model_load(dir, &mo, &m);
    if (st != want) PROBLEM("%s: status %s, want %s (%s)", dir, moex_status_str(st), moex_status_str(want), moex_last_error());
    else if (!contains(moex_last_error(), needle1) || !contains(moex_last_error(), needle2))
        PROBLEM("%s: message \"%s\" lacks %s", dir, moex_last_error(), needs_text(needle1, needle2));
    if (m) moex_model_free(m);
}

static void test_bad_fp8_checkpoints(void **state) {
    (void)state;
    expect_load_error(MOEX_FIXTURES "/qwen3_moe-fp8-bad-grid", MOEX_ERR_FORMAT,
                      "experts.3.up_proj.weight_scale_inv has shape [1, 3], expected [2, 3]", "weight_block_size");
    expect_load_error(MOEX_FIXTURES "/qwen3_moe-fp8-bad-dtype", MOEX_ERR_FORMAT,
                      "experts.3.up_proj.weight_scale_inv has dtype BF16", "F32 or F8_E8M0");
    /* a block size that does not divide the weights as the stored grids say */
    const char *dir = variant("/weight_block_size/,/]/{s/32,\\s*$/48,/;s/^\\(\\s*\\)32$/\\148/}");
    expect_load_error(dir, MOEX_ERR_FORMAT, "in blocks of 48 x 48", "weight_scale_inv has shape");
    dir = variant("s/\"activation_scheme\": \"dynamic\"/\"activation_scheme\": \"static\"/");
    expect_load_error(dir, MOEX_ERR_UNSUPPORTED, "static", "dequantize");
    moex_model_options mo = options("grouped_mm");
    mo.dequantize = 1; /* static activation scales do not matter once dequantized */
    moex_model *m = NULL;
    if (moex_model_load(dir, &mo, &m) != MOEX_OK) PROBLEM("static + dequantize: %s", moex_last_error());
    moex_model_free(m);
    dir = variant("s/\"quant_method\": \"fp8\"/\"quant_method\": \"awq\"/");
    expect_load_error(dir, MOEX_ERR_UNSUPPORTED, "quant_method \"awq\"", "fp8");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_dequantized_matches_transformers),
        cmocka_unit_test(test_fp8_quantized_close_to_transformers),
        cmocka_unit_test(test_fp8_layer_and_info),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_quantize_on_load),
        cmocka_unit_test(test_bad_fp8_checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
