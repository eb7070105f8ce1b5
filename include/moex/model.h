/*
 * moex/model.h — for checkpoint and generation users: loading a Hugging Face
 * MoE checkpoint, choosing its experts backends, generating tokens.
 */
#ifndef MOEX_MODEL_H
#define MOEX_MODEL_H

#include "moex/experts.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Models: Hugging Face MoE checkpoints                                     */
/* ------------------------------------------------------------------------ */

/** A loaded model (opaque): config, memory-mapped weights, experts layers,
 *  KV cache, workspace. Thread-safety: one thread at a time per model. */
typedef struct moex_model moex_model;

/** Options for moex_model_load(). Start from moex_model_default_options(). */
typedef struct moex_model_options {
    moex_device device;    /**< where it runs (default: CPU) */
    moex_dtype dtype;      /**< compute and activation dtype: MOEX_F32 (default) or MOEX_BF16 */
    const char *experts;   /**< backend name or JSON map (SPEC R4); NULL = "grouped_mm" */
    int num_threads;       /**< CPU threads; 0 = one per core */
    int64_t max_batch;     /**< prompts per generate call (default 8) */
    int64_t max_seq;       /**< prompt + new tokens per sequence (default 1024) */
    int64_t max_tokens;    /**< tokens in one forward step; longer prefills go in pieces (default 4096) */
    int decode_switch;     /**< 1 (default): on CUDA, grouped_mm entries run batched_mm in decode steps */
    int dequantize;        /**< 1: a pre-quantized checkpoint's experts become plain weights at load
                                (f32 with f32 compute, bf16 with bf16 compute); default 0. A checkpoint
                                without quantization_config refuses it (MOEX_ERR_INVALID_ARGUMENT). */
    const char *quantize;  /**< "fp8", "fp8-ue8m0" or "fp4": quantize the experts at load
                                (moex_quantize's recipe); NULL (default) = as stored */
    moex_ep_group *ep_group; /**< NULL (default), or this rank of an expert-parallel group (borrowed;
                                it must outlive the model): the model keeps only the rank's share of
                                each MoE layer's experts (num_experts / group size of them, which must
                                divide evenly and be at least num_experts_per_tok), routes its own
                                tokens over all of them, and every moex_generate() call is a
                                collective of the group (see there). CPU only in this version. */
} moex_model_options;

/** Defaults as documented on each field. */
moex_model_options moex_model_default_options(void);

/**
 * Load the checkpoint in directory dir (config.json, generation_config.json,
 * model.safetensors or a sharded index). Supported model_type values:
 * qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe (text backbone). Weights stored
 * in a dtype the kernels read (f32, f16, bf16) are used in place from the
 * mapping. Fails naming an unknown model_type (with the list) or a missing tensor.
 *
 * Every tensor is checked by name: its shape, its dtype (each weight is read in
 * its own dtype; the experts matrices of one layer must share one) and its size
 * against the file. Every config.json key the family's transformers model reads
 * is honoured as transformers defines it (an absent key takes the default of the
 * family's config class) or refused by name: hidden_act other than silu, a rope
 * type other than default, partial_rotary_factor != 1, and sliding-window
 * attention where the window could bind (max_seq above it) are MOEX_ERR_UNSUPPORTED.
 * config.json and generation_config.json must be regular files. max_tokens must
 * be at least max_batch (a decode step of max_batch sequences).
 *
 * The checkpoint's files stay mapped while the model lives and must not change:
 * moex_generate() checks on the cpu that each is as loaded (size and modification
 * time) and fails with MOEX_ERR_IO naming the file if not; a file written or
 * truncated while a call runs is not detected (truncation faults, SIGBUS). A file
 * replaced by rename is harmless: the model keeps the one it mapped.
 *
 * Pre-quantized FP8 checkpoints (config.json's quantization_config with
 * quant_method "fp8", fmt "e4m3", weight_block_size, scale_fmt "float" or
 * "ue8m0", activation_scheme, modules_to_not_convert) load with no option:
 * e4m3 expert weights are used in place with their `*_scale_inv` tensors (2-D
 * grids, or each expert's grid flattened to 1-D, inferred from the weight
 * shape); other e4m3 linear layers are dequantized at load. A bad scale grid,
 * a block size that does not fit, or a scale dtype other than f32/ue8m0 fails
 * naming the tensor. activation_scheme "static" fails at load, naming it.
 *
 * device = {MOEX_DEVICE_CUDA, n} (a build with CUDA): every weight a step reads
 * is copied to GPU n once (f32 for f32 compute, bf16 for bf16), with a device KV
 * cache and workspace; moex_model_get_info() reports the device memory. A GPU
 * this build or machine cannot use fails with MOEX_ERR_UNSUPPORTED naming why;
 * quantized experts (FP8 checkpoints without dequantize, quantize) are refused
 * on CUDA (docs/models.md).
 */
moex_status moex_model_load(const char *dir, const moex_model_options *options, moex_model **out);

/** Free a model. NULL is a no-op. */
void moex_model_free(moex_model *model);

/** Switch backends at run time without reloading: a name or a JSON map (SPEC R4.2). */
moex_status moex_model_set_experts(moex_model *model, const char *spec);

/** The backends in force as a JSON map with "" and every sub-config (SPEC R4.3). */
moex_status moex_model_get_experts(const moex_model *model, char *buf, size_t size);

/** Facts about a loaded model, for `moex info`. */
typedef struct moex_model_info {
    char model_type[64];
    int num_sub_configs;       /**< every top-level "*_config" object of config.json (at most 16) */
    char sub_configs[16][64];
    int64_t num_layers, num_moe_layers;
    int64_t hidden, vocab, num_experts, top_k, moe_intermediate, shared_intermediate;
    moex_dtype weight_dtype;   /**< dtype of the experts' weights */
    int per_expert_layout;     /**< 1: experts.N.* tensors; 0: fused 3-D tensors */
    int transposed;            /**< fused tensors stored [E, in, out] */
    /* A model loaded on CUDA: device memory it holds, by use (0 on the cpu). Each byte is counted once
     * (a tied lm_head shares the embedding's upload). */
    size_t gpu_weight_bytes;    /**< every weight a step reads, experts included, in the compute dtype */
    size_t gpu_kv_cache_bytes;  /**< the KV cache: 2 * layers * max_batch * kv_heads * max_seq * head_dim f32;
                                     deepseek_v3's latent one layers * max_batch * max_seq *
                                     (kv_lora_rank + qk_rope_head_dim) f32 */
    size_t gpu_workspace_bytes; /**< activations scratch, the cuBLAS workspace and the experts context's workspace */
    /** The family's features as loaded, one line: attention (heads, kv heads, head_dim, q/k norm per head or
     *  over whole rows, biases), rope, router, shared expert, dense layers, e.g. "attention: 4 heads, 2 kv heads,
     *  head_dim 16, q/k norm over the whole rows; rope default (theta 10000); router softmax top-2". */
    char features[384];
    /** Bytes the cache keeps per token (over every layer): 2 x kv_heads x head_dim x layers f32 (k and v),
     *  deepseek_v3's latent (kv_lora_rank + qk_rope_head_dim) x layers f32. */
    size_t kv_cache_bytes_per_token;
    /** The format each part runs in, one line, e.g. "experts e4m3 with f32 block scales 128 x 128, run
     *  quantized (activations quantized per token per 128); 24 e4m3 linear layers dequantized at load to
     *  bf16 (12.0 MiB); other weights bf16". */
    char formats[256];
    /** Weights the model holds in host memory of its own: copies converted to the compute dtype,
     *  dequantized or quantized at load (the other weights are views of the checkpoint's mapping,
     *  read from it as used). An expert-parallel rank copies its share of the experts only. */
    size_t host_weight_copy_bytes;
} moex_model_info;

moex_status moex_model_get_info(const moex_model *model, moex_model_info *info);

/** The experts layer of MoE layer i (0-based over the MoE layers), for supports queries. */
const moex_layer *moex_model_experts_layer(const moex_model *model, int64_t i);

/** Options for moex_generate(). */
typedef struct moex_generate_options {
    int64_t max_new_tokens;  /**< >= 0 */
    float temperature;       /**< 0 = greedy (default) */
    int64_t top_k;           /**< sampling: keep the k best; 0 = off */
    float top_p;             /**< sampling: nucleus mass; 1 = off */
    uint64_t seed;           /**< sampling seed */
    int ignore_eos;          /**< 1: do not stop at the checkpoint's end-of-sequence ids */
    int want_logits;         /**< 1: return each prompt's last-position logits (f32) */
    int cuda_graph;          /**< 1: a model on CUDA captures its decode step in a CUDA graph once per
                                  batch size (and experts backend) and replays it for every later decode
                                  step of that size; each step's ids and positions are written into the
                                  same device buffers first. Same tokens as 0. Default 0; 1 on a model
                                  loaded on the cpu fails (MOEX_ERR_INVALID_ARGUMENT) */
    /** Called with each new token as soon as it is chosen, prompt by prompt in step order, from
     *  the thread that called moex_generate (streaming); NULL: none. */
    void (*on_token)(void *user, int prompt, int32_t id);
    void *user;              /**< passed to on_token */
} moex_generate_options;

/** Defaults: 16 new tokens, greedy, top_p 1, seed 0. */
moex_generate_options moex_generate_default_options(void);

/** What moex_generate() returns; free with moex_generation_free(). */
typedef struct moex_generation {
    int n;                       /**< prompts */
    int64_t *num_new;            /**< [n] tokens generated per prompt */
    int32_t **new_ids;           /**< [n][num_new[i]] */
    int64_t vocab;
    float **last_prompt_logits;  /**< [n][vocab] when asked, else NULL */
    double prefill_seconds, decode_seconds;
    int64_t prefill_tokens, decode_tokens;
} moex_generation;

/**
 * Generate from n prompts in one batch: prefill the prompts together, in steps
 * of at most max_tokens tokens (a longer prompt goes in pieces), then decode
 * one token per unfinished prompt per step. The decode-step switch of
 * SPEC R3 applies to the decode steps (CUDA only) and the backends in force
 * are restored when it returns, also on error. On the cpu it first checks that
 * the checkpoint's files are unchanged since load (moex_model_load()). A NaN
 * logit where a token is chosen fails (MOEX_ERR_INVALID_ARGUMENT, naming its index).
 *
 * A model of an expert-parallel group (moex_model_options.ep_group): every rank
 * calls moex_generate() at once (from its own thread or process), each with its
 * own prompts (n may be 0 there: the rank still takes part) and options, and the
 * same experts backends in force. The ranks run their steps together: before
 * each step they agree whether any rank has work left, and a rank with none runs
 * only its MoE layers' experts for no tokens, so that each layer's exchange has
 * every rank in it; the call returns on every rank once every rank is done. A
 * rank that fails (bad arguments, a NaN logit, a refused forward) makes every
 * rank fail at the next agreement, the others with a message naming it. The
 * tokens are those of one model holding every expert, up to the rounding of
 * each pair's result.
 */
moex_status moex_generate(moex_model *model, int n, const int32_t *const *prompts, const int64_t *prompt_lens,
                          const moex_generate_options *options, moex_generation **out);

/** Free a generation. NULL is a no-op. */
void moex_generation_free(moex_generation *g);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_MODEL_H */
