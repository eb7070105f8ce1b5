/*
 * config.h — a Hugging Face config.json (and generation_config.json), read
 * through cJSON into the parameters moex needs (internal).
 *
 * The text parameters come from "text_config" when the file has one (e.g.
 * qwen3_vl_moe), else from the top level. Unknown keys are ignored; JSON null
 * counts as absent; an absent key takes the default of transformers' config class
 * for the family (qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe's text config, olmoe); a known key of the wrong JSON type, a non-integral or
 * out-of-range integer, or a missing required key (vocab_size, hidden_size,
 * num_hidden_layers, num_attention_heads) is MOEX_ERR_FORMAT with a message
 * naming the key (e.g. "config: text_config.hidden_size = 1.5 is not an
 * integer"). Outputs are untouched on error.
 */
#ifndef MOEX_CONFIG_H
#define MOEX_CONFIG_H

#include "moex.h"
#include <stddef.h>
#include <stdint.h>

#define MOEX_CONFIG_MAX_SUB 16     /* sub-configs listed */
#define MOEX_CONFIG_MAX_EOS 16     /* eos token ids */
#define MOEX_CONFIG_NAME_LEN 64    /* longest name kept, with its NUL */
#define MOEX_CONFIG_MAX_MROPE 8    /* mrope_section entries */

/** Rotary embedding parameters (transformers 5 "rope_parameters", older
 *  "rope_scaling" + "rope_theta"). Absent numbers are 0 unless stated. */
typedef struct moex_rope_config {
    char type[MOEX_CONFIG_NAME_LEN];  /* rope_type (or "type"); "default" when absent */
    double theta;                     /* rope_theta; family default when absent (10000; qwen3_vl_moe 500000) */
    double factor;
    double original_max_position_embeddings;
    double attention_factor;
    double beta_fast, beta_slow;
    double low_freq_factor, high_freq_factor;
    double mscale, mscale_all_dim;    /* yarn (DeepSeek) */
    int truncate;                     /* yarn: 1 when absent */
    double partial_rotary_factor;     /* 1.0 when absent */
    int n_mrope_section;
    int64_t mrope_section[MOEX_CONFIG_MAX_MROPE];
    int mrope_interleaved;
    char source[32];                  /* the object read: "rope_parameters", "rope_scaling" or "none" */
} moex_rope_config;

/** The parsed config. Owns heap memory (lists): release with moex_config_free();
 *  do not copy it by value and free both copies. */
typedef struct moex_config {
    char model_type[MOEX_CONFIG_NAME_LEN];          /* "" when absent */
    /* top-level keys ending in "_config" whose value is an object (text_config,
     * vision_config, ...), in file order; quantization_config and
     * compression_config are not sub-configs */
    int n_sub_configs;
    char sub_configs[MOEX_CONFIG_MAX_SUB][MOEX_CONFIG_NAME_LEN];
    int text_from_sub_config;                       /* 1: text params came from text_config */

    /* text parameters; 0 = absent for the optional sizes */
    int64_t vocab_size, hidden_size, num_hidden_layers, num_attention_heads;   /* required */
    int64_t intermediate_size, moe_intermediate_size, shared_expert_intermediate_size;
    int64_t num_key_value_heads;  /* family default (transformers' config class), else num_attention_heads */
    int64_t head_dim;             /* default hidden_size / num_attention_heads */
    int64_t num_experts;          /* num_experts | num_local_experts | n_routed_experts; family default; 0 = dense */
    int64_t num_experts_per_tok;  /* num_experts_per_tok | experts_per_token; family default */
    int norm_topk_prob;           /* family default: qwen2_moe, qwen3_moe 0; mixtral, qwen3_vl_moe always 1 */
    int64_t decoder_sparse_step;  /* default 1 */
    int n_mlp_only_layers;
    int64_t *mlp_only_layers;     /* each in [0, num_hidden_layers) */
    double rms_norm_eps;          /* default 1e-6 (mixtral 1e-5) */
    int64_t max_position_embeddings;
    int tie_word_embeddings;      /* top level, else text_config, else 0 */
    int attention_bias;           /* biases on q, k, v: qwen2_moe qkv_bias (default 1); qwen3 families
                                     attention_bias (default 0, also on o); mixtral none */
    int o_proj_bias;              /* bias on o_proj too (qwen3 families and olmoe with attention_bias) */
    int use_qk_norm;              /* glm4_moe: q/k RMSNorm per head (default off) */
    /* deepseek_v3's latent attention (MLA); 0 elsewhere. q_lora_rank 0: no q compression */
    int64_t q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim;
    int rope_interleave;          /* the rotary values in interleaved pairs (default on) */
    double swiglu_alpha, swiglu_limit; /* gpt_oss: the clamped swiglu (1.702, 7.0) */
    int has_clip_qkv;             /* olmoe: clip_qkv is a number (null or absent: no clamp) */
    double clip_qkv;
    char hidden_act[MOEX_CONFIG_NAME_LEN];  /* default "silu" */
    moex_rope_config rope;
    /* sliding-window attention as transformers derives it per family (use_sliding_window,
     * sliding_window, max_window_layers, layer_types): the window of the layers that use
     * one (0 when none does, -1 when such a layer has no usable window) */
    int n_sliding_layers;         /* layers with sliding-window attention */
    int64_t first_sliding_layer;  /* the first of them, -1 when none */
    int64_t sliding_window;
    char sliding_source[96];      /* the keys that asked for it, for messages */
    unsigned char *layer_sliding; /* gpt_oss: [num_hidden_layers] 1 for a sliding-window layer (owned), else NULL */

    /* special tokens (generation_config.json overrides); -1 = none */
    int n_eos;
    int64_t eos_token_ids[MOEX_CONFIG_MAX_EOS];
    int64_t bos_token_id, pad_token_id;

    /* router fields of later families (0 / "" when absent) */
    int64_t n_group, topk_group, n_shared_experts, first_k_dense_replace;
    double routed_scaling_factor;  /* 1.0 when absent */
    char scoring_func[MOEX_CONFIG_NAME_LEN];

    /* quantization_config (top level), kept for the quantized-experts work */
    int has_quantization_config;
    char quant_method[MOEX_CONFIG_NAME_LEN];
    int has_weight_block_size;
    int64_t weight_block_size[2];
    char activation_scheme[MOEX_CONFIG_NAME_LEN];
    char fmt[MOEX_CONFIG_NAME_LEN];
    char scale_fmt[MOEX_CONFIG_NAME_LEN];
    int n_modules_to_not_convert;
    char **modules_to_not_convert;
} moex_config;

/*
 * Parse config.json text json[0..len) (need not be NUL-terminated) into *out.
 * On success *out owns heap memory (moex_config_free); on failure it is untouched.
 */
moex_status moex_config_parse(const char *json, size_t len, moex_config *out);

/*
 * Apply generation_config.json text json[0..len) to cfg: its eos_token_id
 * (an integer or a list), bos_token_id and pad_token_id replace cfg's when
 * present and not null. On failure cfg is untouched.
 */
moex_status moex_config_apply_generation(const char *json, size_t len, moex_config *cfg);

/*
 * Read DIR/config.json and, if it exists, DIR/generation_config.json.
 * Messages name the file. MOEX_ERR_IO if config.json cannot be read.
 */
moex_status moex_config_load(const char *dir, moex_config *out);

/* Free the lists cfg owns and zero it. NULL is a no-op. */
void moex_config_free(moex_config *cfg);

/* 1 if the config has a sub-config called `name`. */
int moex_config_has_sub_config(const moex_config *cfg, const char *name);

#endif /* MOEX_CONFIG_H */
