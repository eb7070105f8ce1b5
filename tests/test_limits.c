/* test_limits.c — sizes at the edges and inputs that once broke moex: a workspace
 * whose size overflows, a router given a meaningless n_group, a buffer too small for
 * the backend map, max_new_tokens near INT64_MAX, and a fused transposed checkpoint
 * whose hidden size equals 2 x intermediate (orientation told by down_proj). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moex.h"
#include "reference.h"
#include "testutil.h"
#include "backend_list.h"

static void test_workspace_size_overflow(void **state) {
    (void)state;
    ref_layer_spec s = {2, 8, 8, 1, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer L;
    ref_layer_build(&L, &s, 1);
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&L.desc, &layer), MOEX_OK);
    const moex_device cpu = {MOEX_DEVICE_CPU, 0};
    const backend_list backends = cpu_backends(); /* every registered backend that takes the CPU */
    assert_true(backends.n > 0);
    const int64_t huge[] = {100254043878856259LL, ((int64_t)1 << 31) + 5};
    for (int h = 0; h < 2; h++) {
        moex_context_options o = moex_context_default_options();
        o.max_tokens = huge[h];
        moex_context *ctx = NULL;
        assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
        for (int b = 0; b < backends.n; b++) {
            if (!backend_takes(backends.name[b], layer, cpu)) continue; /* refuses this layer */
            assert_int_equal(moex_prepare(ctx, layer, backends.name[b]), MOEX_ERR_INVALID_ARGUMENT);
            assert_true(contains(moex_last_error(), "max_tokens"));
        }
        assert_int_equal(moex_context_workspace_bytes(ctx), 0);
        moex_context_free(ctx);
    }
    moex_layer_free(layer);
    ref_layer_destroy(&L);
}

static void test_router_ignores_n_group_unless_grouped(void **state) {
    (void)state;
    enum { T = 3, E = 1000 };
    float *logits = malloc(sizeof(float) * T * E);
    ref_rng r;
    ref_rng_seed(&r, 5);
    ref_fill_random(logits, MOEX_F32, T * E, 1.0, &r);
    int64_t ls[2] = {T, E}, ks[2] = {T, 1};
    int32_t ids_a[T], ids_b[T];
    float w_a[T], w_b[T];
    moex_tensor tl, ta, twa, tb, twb;
    moex_tensor_init(&tl, logits, MOEX_F32, 2, ls);
    moex_tensor_init(&ta, ids_a, MOEX_I32, 2, ks);
    moex_tensor_init(&twa, w_a, MOEX_F32, 2, ks);
    moex_tensor_init(&tb, ids_b, MOEX_I32, 2, ks);
    moex_tensor_init(&twb, w_b, MOEX_F32, 2, ks);
    moex_router_desc d;
    moex_router_desc_init(&d);
    d.num_experts = E;
    d.top_k = 1;
    assert_int_equal(moex_route(&d, &tl, &ta, &twa), MOEX_OK);
    d.n_group = -300; /* meaningless for a softmax router: ignored */
    assert_int_equal(moex_route(&d, &tl, &tb, &twb), MOEX_OK);
    assert_memory_equal(ids_a, ids_b, sizeof ids_a);
    assert_memory_equal(w_a, w_b, sizeof w_a);
    d.kind = MOEX_ROUTER_SIGMOID_GROUPED_TOPK; /* ... but an error for the grouped one */
    assert_int_equal(moex_route(&d, &tl, &tb, &twb), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "n_group"));
    free(logits);
}

// A one-layer qwen3_moe checkpoint with fused experts, H = 2I, in dir; transposed or not, same numbers.
static void write_fused_checkpoint(const char *dir, int transposed) {
    enum { V = 32, H = 16, I = 8, E = 4, D = 8, HEADS = 2, KV = 1 };
    struct {
        const char *name;
        int ndim;
        int64_t shape[3];
    } t[] = {
        {"model.embed_tokens.weight", 2, {V, H}},       {"model.norm.weight", 1, {H}},
        {"lm_head.weight", 2, {V, H}},                  {"model.layers.0.input_layernorm.weight", 1, {H}},
        {"model.layers.0.post_attention_layernorm.weight", 1, {H}},
        {"model.layers.0.self_attn.q_proj.weight", 2, {HEADS * D, H}},
        {"model.layers.0.self_attn.k_proj.weight", 2, {KV * D, H}},
        {"model.layers.0.self_attn.v_proj.weight", 2, {KV * D, H}},
        {"model.layers.0.self_attn.o_proj.weight", 2, {H, HEADS * D}},
        {"model.layers.0.self_attn.q_norm.weight", 1, {D}}, {"model.layers.0.self_attn.k_norm.weight", 1, {D}},
        {"model.layers.0.mlp.gate.weight", 2, {E, H}},
        {"model.layers.0.mlp.experts.gate_up_proj", 3, {E, 2 * I, H}},
        {"model.layers.0.mlp.experts.down_proj", 3, {E, H, I}},
    };
    const int n = (int)(sizeof t / sizeof t[0]);
    char header[4096], path[512];
    size_t len = (size_t)snprintf(header, sizeof header, "{");
    int64_t off = 0, counts[32];
    for (int i = 0; i < n; i++) {
        int64_t c = 1;
        int64_t shape[3] = {t[i].shape[0], t[i].shape[1], t[i].shape[2]};
        if (transposed && t[i].ndim == 3) { /* [E, a, b] stored as [E, b, a] */
            shape[1] = t[i].shape[2];
            shape[2] = t[i].shape[1];
        }
        for (int k = 0; k < t[i].ndim; k++) c *= shape[k];
        counts[i] = c;
        len += (size_t)snprintf(header + len, sizeof header - len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "",
                                t[i].name);
        for (int k = 0; k < t[i].ndim; k++)
            len += (size_t)snprintf(header + len, sizeof header - len, k ? ",%lld" : "%lld", (long long)shape[k]);
        len += (size_t)snprintf(header + len, sizeof header - len, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                                (long long)(off + 4 * c));
        off += 4 * c;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8) header[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, len, f);
    ref_rng r;
    ref_rng_seed(&r, 77); /* the same values in both files, in the logical [E, a, b] order */
    for (int i = 0; i < n; i++) {
        float *v = malloc(sizeof(float) * (size_t)counts[i]), *o = malloc(sizeof(float) * (size_t)counts[i]);
        for (int64_t j = 0; j < counts[i]; j++) v[j] = (float)(0.3 * ref_rng_normal(&r)) + (t[i].ndim == 1 ? 1.0f : 0.0f);
        memcpy(o, v, sizeof(float) * (size_t)counts[i]);
        if (transposed && t[i].ndim == 3)
            for (int64_t e = 0; e < t[i].shape[0]; e++)
                for (int64_t a = 0; a < t[i].shape[1]; a++)
                    for (int64_t b = 0; b < t[i].shape[2]; b++)
                        o[(e * t[i].shape[2] + b) * t[i].shape[1] + a] = v[(e * t[i].shape[1] + a) * t[i].shape[2] + b];
        fwrite(o, sizeof(float), (size_t)counts[i], f);
        free(v);
        free(o);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": %d, \"hidden_size\": %d, \"moe_intermediate_size\": %d,"
               " \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": %d,"
               " \"num_key_value_heads\": %d, \"head_dim\": %d, \"num_experts\": %d, \"num_experts_per_tok\": 2,"
               " \"norm_topk_prob\": true, \"tie_word_embeddings\": false, \"rope_theta\": 10000.0}\n",
            V, H, I, HEADS, KV, D, E);
    fclose(f);
}

static void logits_of(const char *dir, float *out, int *transposed) {
    moex_model_options mo = moex_model_default_options();
    mo.max_seq = 16;
    mo.max_tokens = 16;
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
    moex_model_info in;
    assert_int_equal(moex_model_get_info(m, &in), MOEX_OK);
    *transposed = in.transposed;
    static const int32_t prompt[] = {1, 5, 9, 30};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {4};
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 1;
    go.want_logits = 1;
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_OK);
    memcpy(out, g->last_prompt_logits[0], sizeof(float) * 32);
    moex_generation_free(g);
    /* max_new_tokens near INT64_MAX is refused, naming max_seq, without overflow */
    go.max_new_tokens = INT64_MAX;
    assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_ERR_WORKSPACE);
    assert_true(contains(moex_last_error(), "max_seq"));
    /* a buffer too small for the backend map: an error, the buffer untouched */
    char small[8];
    memset(small, 'x', sizeof small);
    assert_int_equal(moex_model_get_experts(m, small, sizeof small), MOEX_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof small; i++) assert_int_equal(small[i], 'x');
    moex_model_free(m);
}

/* A model on a GPU this build or machine cannot use: a clear refusal, nothing made.
 * (With a usable GPU the model loads; tests/gpu/test_cuda_model covers that.) */
static void test_model_on_cuda_refused(void **state) {
    (void)state;
    moex_model_options mo = moex_model_default_options();
    mo.device.kind = MOEX_DEVICE_CUDA;
    moex_device_info info;
    assert_int_equal(moex_device_query(mo.device, &info), MOEX_OK);
    if (info.available) skip();
    moex_model *m = (moex_model *)&mo;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", &mo, &m), MOEX_ERR_UNSUPPORTED);
    assert_ptr_equal(m, (moex_model *)&mo);
    assert_non_null(strstr(moex_last_error(), "cpu"));
}

/* Graph-captured decode is for models on CUDA: on the cpu the option is refused by name. */
static void test_cuda_graph_on_cpu_refused(void **state) {
    (void)state;
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", NULL, &m), MOEX_OK);
    const int32_t prompt[] = {1, 2, 3};
    const int32_t *prompts[1] = {prompt};
    const int64_t lens[1] = {3};
    moex_generate_options o = moex_generate_default_options();
    o.cuda_graph = 1;
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 1, prompts, lens, &o, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_null(g);
    assert_non_null(strstr(moex_last_error(), "cuda_graph"));
    moex_model_free(m);
}

static void test_fused_transposed_with_h_equal_2i(void **state) {
    (void)state;
    char plain[] = "/tmp/moex_limits_a_XXXXXX", trans[] = "/tmp/moex_limits_b_XXXXXX";
    assert_non_null(mkdtemp(plain));
    assert_non_null(mkdtemp(trans));
    write_fused_checkpoint(plain, 0);
    write_fused_checkpoint(trans, 1);
    float a[32], b[32];
    int ta, tb;
    logits_of(plain, a, &ta);
    logits_of(trans, b, &tb);
    assert_int_equal(ta, 0);
    assert_int_equal(tb, 1);
    for (int i = 0; i < 32; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", plain, trans);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workspace_size_overflow),
        cmocka_unit_test(test_router_ignores_n_group_unless_grouped),
        cmocka_unit_test(test_fused_transposed_with_h_equal_2i),
        cmocka_unit_test(test_model_on_cuda_refused),
        cmocka_unit_test(test_cuda_graph_on_cpu_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
