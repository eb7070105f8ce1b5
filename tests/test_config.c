/*
 * test_config.c — config.json / generation_config.json: the four families
 * (qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss), key aliases, rope_parameters
 * vs rope_scaling vs rope_theta, eos as an integer or a list, the generation
 * config override, sub-config listing, quantization_config, wrong types,
 * missing keys and cross-checks, each error with its message.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moex.h"
#include "model/config.h"
#include "testutil.h"

/* Parse a NUL-terminated snippet; fail the test if it does not parse. */
static moex_config parse_ok(const char *json) {
    moex_config c;
    moex_status st = moex_config_parse(json, strlen(json), &c);
    if (st != MOEX_OK) fail_msg("parse failed: %s\n%s", moex_last_error(), json);
    return c;
}

/* Parse a snippet expecting MOEX_ERR_FORMAT with need1/need2 in the message and out untouched. */
static void parse_bad(const char *label, const char *json, const char *need1, const char *need2) {
    moex_config c;
    memset(&c, 0x5C, sizeof c);
    moex_config before = c;
    moex_status st = moex_config_parse(json, strlen(json), &c);
    const char *msg = moex_last_error();
    if (!msg) msg = "";
    if (st != MOEX_ERR_FORMAT) {
        PROBLEM("%s: status %d, expected MOEX_ERR_FORMAT (%s)", label, (int)st, msg);
        if (st == MOEX_OK) moex_config_free(&c);
        return;
    }
    if (memcmp(&c, &before, sizeof c) != 0) PROBLEM("%s: output written on error", label);
    if ((need1 && !contains(msg, need1)) || (need2 && !contains(msg, need2)))
        PROBLEM("%s: message lacks %s: %s", label, needs_text(need1, need2), msg);
}

/* ------------------------------------------------------------------------ */
/* families                                                                  */
/* ------------------------------------------------------------------------ */

/* Qwen1.5-MoE style: shared expert, qkv bias by default, norm_topk_prob false, rope_theta on top. */
static void test_qwen2_moe(void **state) {
    (void)state;
    moex_config c = parse_ok(
        "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"model_type\":\"qwen2_moe\","
        "\"vocab_size\":151936,\"hidden_size\":2048,\"intermediate_size\":5632,\"moe_intermediate_size\":1408,"
        "\"shared_expert_intermediate_size\":5632,\"num_hidden_layers\":24,\"num_attention_heads\":16,"
        "\"num_key_value_heads\":16,\"num_experts\":60,\"num_experts_per_tok\":4,\"decoder_sparse_step\":1,"
        "\"mlp_only_layers\":[],\"rms_norm_eps\":1e-06,\"max_position_embeddings\":8192,\"rope_theta\":1000000.0,"
        "\"rope_scaling\":null,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\",\"bos_token_id\":151643,"
        "\"eos_token_id\":151643,\"sliding_window\":null,\"torch_dtype\":\"bfloat16\"}");
    assert_string_equal(c.model_type, "qwen2_moe");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.intermediate_size, 5632);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.shared_expert_intermediate_size, 5632);
    assert_int_equal(c.num_hidden_layers, 24);
    assert_int_equal(c.num_attention_heads, 16);
    assert_int_equal(c.num_key_value_heads, 16);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_experts, 60);
    assert_int_equal(c.num_experts_per_tok, 4);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_int_equal(c.n_mlp_only_layers, 0);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_int_equal(c.max_position_embeddings, 8192);
    assert_true(c.rope.theta == 1e6);
    assert_string_equal(c.rope.type, "default");
    assert_string_equal(c.rope.source, "none");
    assert_true(c.rope.partial_rotary_factor == 1.0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.attention_bias, 1); /* qwen2_moe: q/k/v biases unless told otherwise */
    assert_string_equal(c.hidden_act, "silu");
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 151643);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(c.n_sub_configs, 0);
    assert_int_equal(c.text_from_sub_config, 0);
    assert_int_equal(c.has_quantization_config, 0);
    assert_true(c.routed_scaling_factor == 1.0);
    moex_config_free(&c);

    /* qkv_bias (transformers 5 spelling) turns it off; decoder_sparse_step and mlp_only_layers */
    c = parse_ok("{\"model_type\":\"qwen2_moe\",\"vocab_size\":8,\"hidden_size\":256,\"num_hidden_layers\":4,"
                 "\"num_attention_heads\":32,\"qkv_bias\":false,\"decoder_sparse_step\":2,\"mlp_only_layers\":[0,3]}");
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.decoder_sparse_step, 2);
    assert_int_equal(c.n_mlp_only_layers, 2);
    assert_int_equal(c.mlp_only_layers[0], 0);
    assert_int_equal(c.mlp_only_layers[1], 3);
    /* absent keys take Qwen2MoeConfig's defaults */
    assert_int_equal(c.num_key_value_heads, 16);
    assert_int_equal(c.num_experts, 60);
    assert_int_equal(c.num_experts_per_tok, 4);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.shared_expert_intermediate_size, 5632);
    assert_int_equal(c.intermediate_size, 5632);
    assert_int_equal(c.o_proj_bias, 0);
    assert_int_equal(c.head_dim, 8); /* default = hidden / heads: 256 / 32 */
    moex_config_free(&c);
    moex_config_free(NULL);
}

/* Qwen3-30B-A3B style: head_dim given, norm_topk_prob true, yarn rope_scaling, eos list. */
static void test_qwen3_moe(void **state) {
    (void)state;
    moex_config c = parse_ok(
        "{\"model_type\":\"qwen3_moe\",\"vocab_size\":151936,\"hidden_size\":2048,\"intermediate_size\":6144,"
        "\"moe_intermediate_size\":768,\"num_hidden_layers\":48,\"num_attention_heads\":32,"
        "\"num_key_value_heads\":4,\"head_dim\":128,\"num_experts\":128,\"num_experts_per_tok\":8,"
        "\"norm_topk_prob\":true,\"attention_bias\":false,\"rope_theta\":1000000.0,"
        "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768},"
        "\"eos_token_id\":[151645,151643],\"max_position_embeddings\":40960}");
    assert_int_equal(c.head_dim, 128); /* not 2048/32 = 64 */
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_string_equal(c.rope.type, "yarn");
    assert_string_equal(c.rope.source, "rope_scaling");
    assert_true(c.rope.theta == 1e6); /* from the top-level rope_theta */
    assert_true(c.rope.factor == 4.0);
    assert_true(c.rope.original_max_position_embeddings == 32768.0);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 151645);
    assert_int_equal(c.eos_token_ids[1], 151643);
    assert_true(c.rms_norm_eps == 1e-6);
    moex_config_free(&c);

    /* without norm_topk_prob a qwen3_moe config does not renormalise (transformers' default) */
    c = parse_ok("{\"model_type\":\"qwen3_moe\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":8}");
    assert_int_equal(c.norm_topk_prob, 0);
    assert_int_equal(c.attention_bias, 0);
    /* Qwen3MoeConfig's defaults for the absent keys */
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_int_equal(c.intermediate_size, 6144);
    assert_int_equal(c.shared_expert_intermediate_size, 0);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.bos_token_id, -1);
    moex_config_free(&c);
}

/* Mixtral: num_local_experts, always renormalised, rms eps default 1e-5. */
static void test_mixtral(void **state) {
    (void)state;
    moex_config c = parse_ok(
        "{\"model_type\":\"mixtral\",\"vocab_size\":32000,\"hidden_size\":4096,\"intermediate_size\":14336,"
        "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"num_local_experts\":8,"
        "\"num_experts_per_tok\":2,\"rope_theta\":1e6,\"head_dim\":null,\"bos_token_id\":1,\"eos_token_id\":2,"
        "\"norm_topk_prob\":false,\"tie_word_embeddings\":false}");
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_int_equal(c.norm_topk_prob, 1); /* Mixtral always renormalises the top-k */
    assert_int_equal(c.head_dim, 128);     /* null head_dim = absent */
    assert_true(c.rms_norm_eps == 1e-5);
    assert_int_equal(c.intermediate_size, 14336);
    assert_int_equal(c.moe_intermediate_size, 0);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    moex_config_free(&c);
}

/* OLMoE: the absent keys take OlmoeConfig's defaults (64 experts, top-8, 2048-wide experts,
 * as many kv heads as heads, rms eps 1e-5, eos 50279, no bos, rope theta 10000); its
 * attention_bias covers o_proj; clip_qkv null is no clamp, a number is kept. */
static void test_olmoe(void **state) {
    (void)state;
    moex_config c = parse_ok("{\"model_type\":\"olmoe\",\"vocab_size\":50304,\"hidden_size\":2048,"
                             "\"num_hidden_layers\":16,\"num_attention_heads\":16,\"clip_qkv\":null}");
    assert_int_equal(c.num_experts, 64);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.intermediate_size, 2048);
    assert_int_equal(c.num_key_value_heads, 16);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 50279);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.has_clip_qkv, 0);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"olmoe\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":2,\"attention_bias\":true,\"clip_qkv\":8}");
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 1);
    assert_int_equal(c.has_clip_qkv, 1);
    assert_true(c.clip_qkv == 8.0);
    moex_config_free(&c);
}

/* GLM-4-MoE: Glm4MoeConfig's defaults (n_routed_experts 128, top-8, 1408-wide experts, one
 * shared expert, one dense layer first, 8 kv heads, norm_topk_prob true, half of each head
 * rotated, groups 1/1, rms eps 1e-5); partial_rotary_factor inside rope_parameters wins. */
static void test_glm4_moe(void **state) {
    (void)state;
    moex_config c = parse_ok("{\"model_type\":\"glm4_moe\",\"vocab_size\":151552,\"hidden_size\":4096,"
                             "\"num_hidden_layers\":46,\"num_attention_heads\":96,\"head_dim\":128}");
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.intermediate_size, 10944);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.first_k_dense_replace, 1);
    assert_int_equal(c.n_group, 1);
    assert_int_equal(c.topk_group, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_int_equal(c.use_qk_norm, 0);
    assert_true(c.rope.partial_rotary_factor == 0.5);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.routed_scaling_factor == 1.0);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"glm4_moe\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"use_qk_norm\":true,\"norm_topk_prob\":false,\"attention_bias\":true,"
                 "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0,\"partial_rotary_factor\":1.0}}");
    assert_int_equal(c.use_qk_norm, 1);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 0); /* glm4_moe's o_proj has no bias */
    assert_true(c.rope.partial_rotary_factor == 1.0);
    moex_config_free(&c);
}

/* DeepSeek-V3: DeepseekV3Config's defaults (MLA 1536/512, 128 + 64 query/key values a head, 128 value
 * values, interleaved rope, 256 experts in 8 groups with 4 kept, top-8, scaling 2.5, 3 dense
 * layers, bos 0, eos 1); head_dim is qk_rope_head_dim whatever the file says; q_lora_rank null
 * is no q compression. */
static void test_deepseek_v3(void **state) {
    (void)state;
    moex_config c = parse_ok("{\"model_type\":\"deepseek_v3\",\"vocab_size\":129280,\"hidden_size\":7168,"
                             "\"num_hidden_layers\":61,\"num_attention_heads\":128,\"head_dim\":56}");
    assert_int_equal(c.q_lora_rank, 1536);
    assert_int_equal(c.kv_lora_rank, 512);
    assert_int_equal(c.qk_nope_head_dim, 128);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(c.v_head_dim, 128);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.rope_interleave, 1);
    assert_int_equal(c.num_experts, 256);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(c.first_k_dense_replace, 3);
    assert_int_equal(c.num_key_value_heads, 128);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_int_equal(c.bos_token_id, 0);
    assert_int_equal(c.eos_token_ids[0], 1);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"deepseek_v3\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":2,"
                 "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"q_lora_rank\":null,\"rope_interleave\":false}");
    assert_int_equal(c.q_lora_rank, 0);
    assert_int_equal(c.rope_interleave, 0);
    moex_config_free(&c);
    parse_bad("deepseek odd rope", "{\"model_type\":\"deepseek_v3\",\"vocab_size\":8,\"hidden_size\":8,"
              "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":2,\"qk_rope_head_dim\":5}", "qk_rope_head_dim = 5", "even");
}

/* GPT-OSS: GptOssConfig's defaults (128 experts, top-4, 8 kv heads, window 128 on the even layers
 * when layer_types is absent, q/k/v/o biases, swiglu 1.702 / 7); layer_types as given. */
static void test_gpt_oss(void **state) {
    (void)state;
    moex_config c = parse_ok("{\"model_type\":\"gpt_oss\",\"vocab_size\":201088,\"hidden_size\":2880,"
                             "\"num_hidden_layers\":4,\"num_attention_heads\":64,\"head_dim\":64}");
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 4);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.sliding_window, 128);
    assert_int_equal(c.n_sliding_layers, 2);
    assert_non_null(c.layer_sliding);
    assert_true(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] && !c.layer_sliding[3]);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 1);
    assert_true(c.swiglu_alpha == 1.702 && c.swiglu_limit == 7.0);
    assert_true(c.rms_norm_eps == 1e-5);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"gpt_oss\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":3,"
                 "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"sliding_window\":16,"
                 "\"layer_types\":[\"full_attention\",\"full_attention\",\"sliding_attention\"]}");
    assert_int_equal(c.sliding_window, 16);
    assert_int_equal(c.n_sliding_layers, 1);
    assert_true(!c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2]);
    moex_config_free(&c);
}

/* qwen3_vl_moe as transformers 5 writes it: text params from text_config,
 * sub-config listing, rope_parameters with mrope, tokens and tying. */
static const char *vl_json =
    "{\"architectures\":[\"Qwen3VLMoeForConditionalGeneration\"],\"model_type\":\"qwen3_vl_moe\","
    "\"image_token_id\":250,\"tie_word_embeddings\":false,"
    "\"text_config\":{\"model_type\":\"qwen3_vl_moe_text\",\"vocab_size\":256,\"hidden_size\":64,"
    "\"intermediate_size\":80,\"moe_intermediate_size\":24,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"head_dim\":16,\"num_local_experts\":8,\"num_experts_per_tok\":2,"
    "\"decoder_sparse_step\":1,\"mlp_only_layers\":[],\"rms_norm_eps\":1e-06,\"bos_token_id\":1,"
    "\"eos_token_id\":2,\"pad_token_id\":null,\"tie_word_embeddings\":true,"
    "\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[4,2,2],\"rope_theta\":5000000.0,"
    "\"rope_type\":\"default\"}},"
    "\"vision_config\":{\"depth\":1,\"hidden_size\":32,\"rope_parameters\":{\"rope_theta\":10000.0,"
    "\"rope_type\":\"axial\"}},"
    "\"quantization_config\":{\"quant_method\":\"fp8\"},\"rope_theta\":7,\"vocab_size\":\"ignored here\"}";

static void test_qwen3_vl_moe(void **state) {
    (void)state;
    moex_config c = parse_ok(vl_json);
    assert_string_equal(c.model_type, "qwen3_vl_moe");
    assert_int_equal(c.text_from_sub_config, 1);
    assert_int_equal(c.n_sub_configs, 2);
    assert_string_equal(c.sub_configs[0], "text_config");
    assert_string_equal(c.sub_configs[1], "vision_config");
    assert_true(moex_config_has_sub_config(&c, "vision_config"));
    assert_false(moex_config_has_sub_config(&c, "quantization_config"));
    assert_false(moex_config_has_sub_config(&c, "audio_config"));
    assert_int_equal(c.vocab_size, 256);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.moe_intermediate_size, 24);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.norm_topk_prob, 1); /* qwen3_vl_moe always renormalises */
    assert_string_equal(c.rope.source, "rope_parameters");
    assert_true(c.rope.theta == 5e6);      /* the text rope, not the vision one nor the top-level 7 */
    assert_int_equal(c.rope.n_mrope_section, 3);
    assert_int_equal(c.rope.mrope_section[0], 4);
    assert_int_equal(c.rope.mrope_section[2], 2);
    assert_int_equal(c.rope.mrope_interleaved, 1);
    assert_int_equal(c.tie_word_embeddings, 0); /* the top level wins */
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(c.has_quantization_config, 1);
    assert_string_equal(c.quant_method, "fp8");
    moex_config_free(&c);

    /* tie from text_config when the top level is silent; qwen3_vl_moe default theta 500000 */
    c = parse_ok("{\"model_type\":\"qwen3_vl_moe\",\"text_config\":{\"vocab_size\":8,\"hidden_size\":8,"
                 "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                 "\"tie_word_embeddings\":true}}");
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_true(c.rope.theta == 500000.0);
    assert_int_equal(c.n_sub_configs, 1);
    moex_config_free(&c);

    /* the required keys are looked for in text_config and named with its prefix */
    parse_bad("vl missing hidden_size",
              "{\"model_type\":\"qwen3_vl_moe\",\"hidden_size\":64,\"text_config\":{\"vocab_size\":8,"
              "\"num_hidden_layers\":1,\"num_attention_heads\":2}}",
              "text_config.hidden_size", "missing");
    parse_bad("text_config not an object", "{\"text_config\":[1]}", "text_config", "expected an object");
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* aliases, rope, tokens, sub-configs, quantization                          */
/* ------------------------------------------------------------------------ */

#define BASE "\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":2"

/* num_experts / num_local_experts / n_routed_experts, num_experts_per_tok / experts_per_token. */
static void test_aliases(void **state) {
    (void)state;
    moex_config c = parse_ok("{" BASE ",\"num_local_experts\":32,\"experts_per_token\":4}");
    assert_int_equal(c.num_experts, 32);
    assert_int_equal(c.num_experts_per_tok, 4);
    moex_config_free(&c);
    c = parse_ok("{" BASE ",\"n_routed_experts\":256,\"num_experts_per_tok\":8,\"n_group\":8,\"topk_group\":4,"
                 "\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\",\"n_shared_experts\":1,"
                 "\"first_k_dense_replace\":3}");
    assert_int_equal(c.num_experts, 256);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_string_equal(c.scoring_func, "sigmoid");
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.first_k_dense_replace, 3);
    moex_config_free(&c);
    /* the same value under two names is fine; two different values are not */
    c = parse_ok("{" BASE ",\"num_experts\":8,\"num_local_experts\":8}");
    assert_int_equal(c.num_experts, 8);
    moex_config_free(&c);
    parse_bad("aliases disagree", "{" BASE ",\"num_experts\":8,\"num_local_experts\":4}", "num_experts = 8",
              "num_local_experts = 4");
    /* each family's own key: Qwen2MoeAttention reads qkv_bias only (never on o_proj), the Qwen3
     * attentions attention_bias (on o_proj too), Mixtral's has no biases */
    c = parse_ok("{\"model_type\":\"qwen2_moe\"," BASE ",\"attention_bias\":false,\"qkv_bias\":true}");
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 0);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"qwen3_moe\"," BASE ",\"attention_bias\":true,\"qkv_bias\":false}");
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 1);
    moex_config_free(&c);
    c = parse_ok("{\"model_type\":\"mixtral\"," BASE ",\"attention_bias\":true,\"qkv_bias\":true}");
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.o_proj_bias, 0);
    moex_config_free(&c);
    /* a repeated key: the last one counts, as in Python */
    c = parse_ok("{" BASE ",\"num_experts\":4,\"num_experts\":6}");
    assert_int_equal(c.num_experts, 6);
    moex_config_free(&c);
    end_problems();
}

/* rope_parameters vs rope_scaling vs rope_theta, as transformers 5 resolves them. */
static void test_rope(void **state) {
    (void)state;
    /* transformers 5: rope_parameters holds the theta */
    moex_config c = parse_ok("{" BASE ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6}}");
    assert_true(c.rope.theta == 1e6);
    assert_string_equal(c.rope.source, "rope_parameters");
    moex_config_free(&c);
    /* rope_parameters without a theta: the top-level rope_theta */
    c = parse_ok("{" BASE ",\"rope_theta\":20000,\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2}}");
    assert_true(c.rope.theta == 20000.0);
    assert_string_equal(c.rope.type, "linear");
    assert_true(c.rope.factor == 2.0);
    moex_config_free(&c);
    /* a non-empty rope_scaling wins over rope_parameters (transformers 5's conversion) */
    c = parse_ok("{" BASE ",\"rope_theta\":5e5,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                 "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
                 "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1.0}}");
    assert_string_equal(c.rope.source, "rope_scaling");
    assert_string_equal(c.rope.type, "llama3");
    assert_true(c.rope.theta == 5e5);
    assert_true(c.rope.factor == 8.0);
    assert_true(c.rope.low_freq_factor == 1.0);
    assert_true(c.rope.high_freq_factor == 4.0);
    moex_config_free(&c);
    /* an empty or null rope_scaling falls through to rope_parameters */
    c = parse_ok("{" BASE ",\"rope_scaling\":{},\"rope_parameters\":{\"rope_theta\":3e6}}");
    assert_true(c.rope.theta == 3e6);
    assert_string_equal(c.rope.type, "default");
    moex_config_free(&c);
    c = parse_ok("{" BASE ",\"rope_scaling\":null,\"rope_theta\":1234}");
    assert_true(c.rope.theta == 1234.0);
    assert_string_equal(c.rope.source, "none");
    moex_config_free(&c);
    /* yarn with its betas; "type" is the old spelling of rope_type */
    c = parse_ok("{" BASE ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"beta_fast\":32,\"beta_slow\":1,"
                 "\"attention_factor\":0.5,\"original_max_position_embeddings\":4096}}");
    assert_string_equal(c.rope.type, "yarn");
    assert_true(c.rope.beta_fast == 32.0);
    assert_true(c.rope.beta_slow == 1.0);
    assert_true(c.rope.attention_factor == 0.5);
    assert_true(c.rope.theta == 10000.0);
    moex_config_free(&c);
    /* per-layer-type rope_parameters: the full-attention entry */
    c = parse_ok("{" BASE ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\",\"rope_theta\":1e6},"
                 "\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":1e4}}}");
    assert_true(c.rope.theta == 1e6);
    moex_config_free(&c);
    /* partial rotary factor on the top level or in the rope object */
    c = parse_ok("{" BASE ",\"partial_rotary_factor\":0.5}");
    assert_true(c.rope.partial_rotary_factor == 0.5);
    moex_config_free(&c);

    parse_bad("rope_parameters an array", "{" BASE ",\"rope_parameters\":[]}", "rope_parameters",
              "expected an object");
    parse_bad("rope_theta a string", "{" BASE ",\"rope_parameters\":{\"rope_theta\":\"1e6\"}}",
              "rope_parameters.rope_theta", "a string");
    parse_bad("rope_theta zero", "{" BASE ",\"rope_theta\":0}", "rope_theta", "positive");
    parse_bad("mrope_section a number", "{" BASE ",\"rope_parameters\":{\"mrope_section\":4}}", "mrope_section",
              "list");
    parse_bad("mrope_section fraction", "{" BASE ",\"rope_parameters\":{\"mrope_section\":[1,2.5]}}",
              "mrope_section[1] = 2.5", "not an integer");
    parse_bad("mrope_interleaved a number", "{" BASE ",\"rope_parameters\":{\"mrope_interleaved\":1}}",
              "mrope_interleaved", "true or false");
    parse_bad("rope factor a string", "{" BASE ",\"rope_scaling\":{\"factor\":\"2\"}}", "rope_scaling.factor",
              "a string");
    end_problems();
}

/* eos as an integer or a list; generation_config.json overrides. */
static void test_tokens_and_generation(void **state) {
    (void)state;
    moex_config c = parse_ok("{" BASE ",\"eos_token_id\":7,\"bos_token_id\":1,\"pad_token_id\":0}");
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.pad_token_id, 0);

    const char *gen = "{\"eos_token_id\":[5,6,7],\"bos_token_id\":3,\"pad_token_id\":null,\"do_sample\":true,"
                      "\"temperature\":0.7}";
    assert_int_equal(moex_config_apply_generation(gen, strlen(gen), &c), MOEX_OK);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_token_ids[2], 7);
    assert_int_equal(c.bos_token_id, 3);
    assert_int_equal(c.pad_token_id, 0); /* null leaves it */
    const char *gen2 = "{\"eos_token_id\":9}";
    assert_int_equal(moex_config_apply_generation(gen2, strlen(gen2), &c), MOEX_OK);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 9);

    /* errors leave cfg untouched */
    moex_config before = c;
    static const struct { const char *json, *need1, *need2; } bad[] = {
        {"{\"eos_token_id\":\"2\"}", "generation_config.json: eos_token_id", "integer or a list"},
        {"{\"eos_token_id\":[1,\"x\"]}", "eos_token_id[1]", "a string"},
        {"{\"eos_token_id\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "eos_token_id", "17 ids"},
        {"{\"eos_token_id\":[-1]}", "eos_token_id[0] = -1", "outside"},
        {"{\"eos_token_id\":[1],\"bos_token_id\":1.5}", "bos_token_id = 1.5", "not an integer"},
        {"{\"pad_token_id\":true}", "pad_token_id", "a boolean"},
        {"[1]", "generation_config.json", "expected a JSON object"},
        {"{\"eos_token_id\":", "generation_config.json", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moex_status st = moex_config_apply_generation(bad[i].json, strlen(bad[i].json), &c);
        if (st != MOEX_ERR_FORMAT) PROBLEM("%s: status %d", bad[i].json, (int)st);
        else if (!contains(moex_last_error(), bad[i].need1) || !contains(moex_last_error(), bad[i].need2))
            PROBLEM("%s: message lacks %s: %s", bad[i].json, needs_text(bad[i].need1, bad[i].need2),
                    moex_last_error());
        if (memcmp(&c, &before, sizeof c) != 0) PROBLEM("%s: cfg changed on error", bad[i].json);
    }
    assert_int_equal(moex_config_apply_generation("{}", 2, NULL), MOEX_ERR_INVALID_ARGUMENT);
    moex_config_free(&c);
    parse_bad("eos list in config too long", "{" BASE ",\"eos_token_id\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
              "eos_token_id", "at most 16");
    end_problems();
}

/* Sub-configs: every top-level "*_config" object except quantization/compression. */
static void test_sub_configs(void **state) {
    (void)state;
    moex_config c = parse_ok("{" BASE ",\"audio_config\":{},\"vision_config\":{\"x\":1},\"text_config\":{" BASE
                             "},\"quantization_config\":{},\"compression_config\":{},\"generation_config\":5,"
                             "\"_config\":{},\"rope_config\":null,\"vision_config\":{}}");
    assert_int_equal(c.n_sub_configs, 3);
    assert_string_equal(c.sub_configs[0], "audio_config");
    assert_string_equal(c.sub_configs[1], "vision_config");
    assert_string_equal(c.sub_configs[2], "text_config");
    moex_config_free(&c);
    char big[4096];
    size_t n = (size_t)snprintf(big, sizeof big, "{" BASE);
    for (int i = 0; i < 17; i++) n += (size_t)snprintf(big + n, sizeof big - n, ",\"s%d_config\":{}", i);
    snprintf(big + n, sizeof big - n, "}");
    parse_bad("17 sub-configs", big, "more than 16 sub-configs", "s16_config");
    end_problems();
}

/* quantization_config of a DeepSeek-style FP8 checkpoint and its wrong types. */
static void test_quantization(void **state) {
    (void)state;
    moex_config c = parse_ok("{" BASE ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
                             "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128],"
                             "\"scale_fmt\":\"ue8m0\",\"modules_to_not_convert\":[\"lm_head\","
                             "\"model.layers.0.mlp.gate\"]}}");
    assert_int_equal(c.has_quantization_config, 1);
    assert_string_equal(c.quant_method, "fp8");
    assert_string_equal(c.fmt, "e4m3");
    assert_string_equal(c.activation_scheme, "dynamic");
    assert_string_equal(c.scale_fmt, "ue8m0");
    assert_int_equal(c.has_weight_block_size, 1);
    assert_int_equal(c.weight_block_size[0], 128);
    assert_int_equal(c.weight_block_size[1], 128);
    assert_int_equal(c.n_modules_to_not_convert, 2);
    assert_string_equal(c.modules_to_not_convert[1], "model.layers.0.mlp.gate");
    moex_config_free(&c);
    c = parse_ok("{" BASE ",\"quantization_config\":{\"quant_method\":\"fp8\",\"modules_to_not_convert\":null}}");
    assert_int_equal(c.n_modules_to_not_convert, 0);
    assert_int_equal(c.has_weight_block_size, 0);
    moex_config_free(&c);
    /* many modules (Qwen3 FP8 configs list every gate) */
    char *big = malloc(200000);
    assert_non_null(big);
    size_t n = (size_t)sprintf(big, "{" BASE ",\"quantization_config\":{\"modules_to_not_convert\":[");
    for (int i = 0; i < 3000; i++) n += (size_t)sprintf(big + n, "%s\"model.layers.%d.mlp.gate\"", i ? "," : "", i);
    sprintf(big + n, "]}}");
    c = parse_ok(big);
    assert_int_equal(c.n_modules_to_not_convert, 3000);
    assert_string_equal(c.modules_to_not_convert[2999], "model.layers.2999.mlp.gate");
    moex_config_free(&c);
    free(big);

    parse_bad("quantization_config a string", "{" BASE ",\"quantization_config\":\"fp8\"}", "quantization_config",
              "expected an object");
    parse_bad("block size of one", "{" BASE ",\"quantization_config\":{\"weight_block_size\":[128]}}",
              "quantization_config.weight_block_size", "two integers");
    parse_bad("block size zero", "{" BASE ",\"quantization_config\":{\"weight_block_size\":[128,0]}}",
              "weight_block_size[1] = 0", "outside");
    parse_bad("module not a string", "{" BASE ",\"quantization_config\":{\"modules_to_not_convert\":[\"a\",2]}}",
              "modules_to_not_convert[1]", "a number");
    parse_bad("modules an object", "{" BASE ",\"quantization_config\":{\"modules_to_not_convert\":{}}}",
              "modules_to_not_convert", "an object");
    parse_bad("quant_method a number", "{" BASE ",\"quantization_config\":{\"quant_method\":8}}",
              "quantization_config.quant_method", "a string");
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Required keys missing, wrong types, bad integers, cross-checks, bad JSON. */
static void test_bad_configs(void **state) {
    (void)state;
    static const char *required[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"};
    for (int i = 0; i < 4; i++) {
        char json[256];
        size_t n = (size_t)snprintf(json, sizeof json, "{");
        for (int k = 0; k < 4; k++)
            if (k != i) n += (size_t)snprintf(json + n, sizeof json - n, "%s\"%s\":8", n > 1 ? "," : "", required[k]);
        snprintf(json + n, sizeof json - n, "}");
        char need[64];
        snprintf(need, sizeof need, "required key %s is missing", required[i]);
        parse_bad(required[i], json, need, NULL);
    }
    static const struct { const char *label, *json, *need1, *need2; } cases[] = {
        {"hidden_size a string", "{\"vocab_size\":8,\"hidden_size\":\"64\",\"num_hidden_layers\":1,"
                                 "\"num_attention_heads\":2}", "hidden_size is a string", "integer"},
        {"hidden_size fraction", "{\"vocab_size\":8,\"hidden_size\":64.5,\"num_hidden_layers\":1,"
                                 "\"num_attention_heads\":2}", "hidden_size = 64.5", "not an integer"},
        {"hidden_size zero", "{\"vocab_size\":8,\"hidden_size\":0,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "hidden_size = 0", "outside [1, 2147483647]"},
        {"vocab_size negative", "{\"vocab_size\":-8,\"hidden_size\":8,\"num_hidden_layers\":1,"
                                "\"num_attention_heads\":2}", "vocab_size = -8", "outside"},
        {"layers huge", "{\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1e300,\"num_attention_heads\":2}",
         "num_hidden_layers", "outside"},
        {"layers too big for int32", "{\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":2147483648,"
                                     "\"num_attention_heads\":2}", "num_hidden_layers = 2147483648", "outside"},
        /* a gpt_oss config sized its per-layer window flags by this before the checkpoint was read */
        {"layers past the cap", "{\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":716655368,"
                                "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"model_type\":\"gpt_oss\"}",
         "num_hidden_layers = 716655368", "outside [1, 65536]"},
        {"heads a bool", "{\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":true}",
         "num_attention_heads is a boolean", NULL},
        {"norm_topk_prob a number", "{" BASE ",\"norm_topk_prob\":1}", "norm_topk_prob is a number",
         "true or false"},
        {"tie a string", "{" BASE ",\"tie_word_embeddings\":\"false\"}", "tie_word_embeddings", "true or false"},
        {"model_type a number", "{" BASE ",\"model_type\":3}", "model_type is a number", "a string"},
        {"model_type too long",
         "{" BASE ",\"model_type\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
         "model_type", "at most 63"},
        {"hidden_act a list", "{" BASE ",\"hidden_act\":[\"silu\"]}", "hidden_act is an array", NULL},
        {"rms_norm_eps a string", "{" BASE ",\"rms_norm_eps\":\"1e-6\"}", "rms_norm_eps", "a number"},
        {"rms_norm_eps negative", "{" BASE ",\"rms_norm_eps\":-1e-6}", "rms_norm_eps", "positive"},
        {"mlp_only_layers a string", "{" BASE ",\"mlp_only_layers\":\"0\"}", "mlp_only_layers", "list"},
        {"mlp_only_layers out of range", "{" BASE ",\"mlp_only_layers\":[0,2]}", "mlp_only_layers[1] = 2",
         "outside [0, 1]"},
        {"decoder_sparse_step zero", "{" BASE ",\"decoder_sparse_step\":0}", "decoder_sparse_step = 0", "outside"},
        {"kv heads do not divide", "{\"vocab_size\":8,\"hidden_size\":96,\"num_hidden_layers\":1,"
                                   "\"num_attention_heads\":6,\"num_key_value_heads\":4}",
         "num_key_value_heads = 4", "num_attention_heads = 6"},
        {"kv heads zero", "{" BASE ",\"num_key_value_heads\":0}", "num_key_value_heads = 0", "outside"},
        {"head_dim undetermined", "{\"vocab_size\":8,\"hidden_size\":10,\"num_hidden_layers\":1,"
                                  "\"num_attention_heads\":3}", "hidden_size = 10", "num_attention_heads = 3"},
        {"top-k over experts", "{" BASE ",\"num_experts\":4,\"num_experts_per_tok\":5}",
         "num_experts_per_tok = 5", "4 experts"},
        {"num_experts a string", "{" BASE ",\"num_local_experts\":\"8\"}", "num_local_experts is a string", NULL},
        {"routed_scaling_factor a string", "{" BASE ",\"routed_scaling_factor\":\"2\"}", "routed_scaling_factor",
         "a string"},
        {"scoring_func a number", "{" BASE ",\"scoring_func\":1}", "scoring_func", "a string"},
        {"not JSON", "{\"vocab_size\":8,", "not valid JSON", NULL},
        {"empty", "", "not valid JSON", NULL},
        {"an array", "[{" BASE "}]", "expected a JSON object", NULL},
        {"a number", "42", "expected a JSON object", NULL},
        {"trailing text", "{" BASE "} x", "after the JSON value", NULL},
        {"NaN", "{" BASE ",\"rms_norm_eps\":NaN}", "not valid JSON", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        parse_bad(cases[i].label, cases[i].json, cases[i].need1, cases[i].need2);

    /* input ending right after a comma, in a buffer of exactly that size (cJSON 1.7.15
     * without the fix for CVE-2023-53154 reads past it; found by fuzz_config) */
    char *exact = malloc(8);
    assert_non_null(exact);
    memcpy(exact, "{\"ve\":8,", 8);
    moex_config c;
    assert_int_equal(moex_config_parse(exact, 8, &c), MOEX_ERR_FORMAT);
    free(exact);
    /* the text length is honoured: a valid object followed by bytes outside len */
    const char *two = "{" BASE "}garbage";
    assert_int_equal(moex_config_parse(two, strlen("{" BASE "}"), &c), MOEX_OK);
    moex_config_free(&c);
    /* a NUL-terminated length is accepted too */
    assert_int_equal(moex_config_parse(two, strlen("{" BASE "}") + 0, &c), MOEX_OK);
    moex_config_free(&c);
    assert_int_equal(moex_config_parse(NULL, 0, &c), MOEX_ERR_FORMAT);
    assert_int_equal(moex_config_parse(NULL, 5, &c), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_config_parse("{}", 2, NULL), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* loading from a directory                                                  */
/* ------------------------------------------------------------------------ */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Write text to dir/name. */
static void put(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* config.json alone, with generation_config.json, missing, and broken files named with their path. */
static void test_load(void **state) {
    (void)state;
    char dir[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/moex_cfg_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    moex_config c;
    memset(&c, 0x33, sizeof c);
    moex_config before = c;
    assert_int_equal(moex_config_load(dir, &c), MOEX_ERR_IO);
    assert_memory_equal(&c, &before, sizeof c);
    if (!contains(moex_last_error(), dir) || !contains(moex_last_error(), "config.json"))
        PROBLEM("message: %s", moex_last_error());

    put(dir, "config.json", "{\"model_type\":\"qwen3_moe\"," BASE ",\"eos_token_id\":2,\"bos_token_id\":1}");
    assert_int_equal(moex_config_load(dir, &c), MOEX_OK); /* no generation_config.json: fine */
    assert_int_equal(c.eos_token_ids[0], 2);
    moex_config_free(&c);

    put(dir, "generation_config.json", "{\"eos_token_id\":[2,5],\"bos_token_id\":0}");
    assert_int_equal(moex_config_load(dir, &c), MOEX_OK);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[1], 5);
    assert_int_equal(c.bos_token_id, 0);
    moex_config_free(&c);

    put(dir, "generation_config.json", "{\"eos_token_id\":\"x\"}");
    memset(&c, 0x33, sizeof c);
    assert_int_equal(moex_config_load(dir, &c), MOEX_ERR_FORMAT);
    assert_memory_equal(&c, &before, sizeof c);
    if (!contains(moex_last_error(), dir) || !contains(moex_last_error(), "/generation_config.json: eos_token_id"))
        PROBLEM("message: %s", moex_last_error());

    put(dir, "config.json", "{\"hidden_size\":8}");
    assert_int_equal(moex_config_load(dir, &c), MOEX_ERR_FORMAT);
    if (!contains(moex_last_error(), dir) || !contains(moex_last_error(), "/config.json: required key"))
        PROBLEM("message: %s", moex_last_error());
    assert_int_equal(moex_config_load(NULL, &c), MOEX_ERR_INVALID_ARGUMENT);
    nftw(dir, rm_entry, 4, FTW_DEPTH | FTW_PHYS);
    end_problems();
}

/* The configs transformers wrote for the reference checkpoints (tests/fixtures). */
static void test_fixture_configs(void **state) {
    (void)state;
    const char *root = MOEX_FIXTURES; /* defined by the build for every test program */
    static const struct { const char *fam; int64_t experts; int norm; int sub; } fx[] = {
        {"qwen2_moe", 8, 0, 0}, {"qwen3_moe", 8, 1, 0}, {"mixtral", 4, 1, 0}, {"qwen3_vl_moe", 8, 1, 2},
        {"olmoe", 8, 0, 0}, {"glm4_moe", 8, 1, 0}, {"deepseek_v3", 8, 1, 0}, {"gpt_oss", 8, 0, 0}};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s", root, fx[i].fam);
        struct stat sb;
        if (stat(dir, &sb) != 0) { /* the fixtures are committed: a missing one is a failure */
            PROBLEM("%s: missing", dir);
            continue;
        }
        moex_config c;
        if (moex_config_load(dir, &c) != MOEX_OK) {
            PROBLEM("%s: %s", dir, moex_last_error());
            continue;
        }
        if (strcmp(c.model_type, fx[i].fam) != 0) PROBLEM("%s: model_type %s", dir, c.model_type);
        if (c.num_experts != fx[i].experts) PROBLEM("%s: num_experts %lld", dir, (long long)c.num_experts);
        if (c.norm_topk_prob != fx[i].norm) PROBLEM("%s: norm_topk_prob %d", dir, c.norm_topk_prob);
        if (c.n_sub_configs != fx[i].sub) PROBLEM("%s: %d sub-configs", dir, c.n_sub_configs);
        const int64_t head_dim = strcmp(fx[i].fam, "deepseek_v3") ? 16 : 8; /* deepseek_v3: the rope's */
        if (c.hidden_size != 64 || c.vocab_size != 256 || c.num_hidden_layers != 3 || c.head_dim != head_dim)
            PROBLEM("%s: sizes %lld %lld %lld %lld", dir, (long long)c.hidden_size, (long long)c.vocab_size,
                    (long long)c.num_hidden_layers, (long long)c.head_dim);
        moex_config_free(&c);
    }
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_moe),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_olmoe),
        cmocka_unit_test(test_glm4_moe),
        cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_qwen3_vl_moe),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_tokens_and_generation),
        cmocka_unit_test(test_sub_configs),
        cmocka_unit_test(test_quantization),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_fixture_configs),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
