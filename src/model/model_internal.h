/* model_internal.h — the loaded model: weights (views into the checkpoint's
 * mapping), experts layers, the backend map, the KV cache, and what a step
 * runs with (model_run: the decoder's op table, the weights and the scratch it
 * reads, on the CPU or on the device). */
#ifndef MOEX_MODEL_INTERNAL_H
#define MOEX_MODEL_INTERNAL_H

#include "experts/experts_internal.h"
#include "model/config.h"
#include "decoder/decoder.h"
#include "decoder/ops.h"
#include "model/experts_map.h"
#include "model/model_cuda.h"
#include "model/safetensors.h"

typedef struct model_layer {
    moex_vec_w in_norm, post_norm;   /* [H] */
    moex_vec_w q_norm, k_norm;       /* [head_dim] (qwen3 families); data NULL otherwise */
    moex_linear_w q, k, v, o;
    int is_moe;
    moex_linear_w router;            /* [E, H] */
    moex_layer *experts;
    const void **expert_ptrs;        /* per-expert layout: gate[E], up[E], down[E] in one block */
    const void **expert_scale_ptrs;  /* quantized per-expert layout: their scale grids, same order */
    moex_mlp_w dense;                /* dense layers */
    int has_shared;
    moex_mlp_w shared;               /* qwen2_moe shared expert; glm4_moe's shared experts (one MLP) */
    moex_linear_w shared_gate;       /* [1, H] (qwen2_moe); weight NULL: the shared output is added as it is */
    float *router_bias;              /* glm4_moe, deepseek_v3: e_score_correction_bias [E] in f32 (owned by the
                                        model), or NULL */
    /* deepseek_v3's latent attention: q = q_b(norm(q_a(x))) (or q above, without q_lora_rank),
     * [c, k_rot] = kv_a(x), [k_nope, v] per head = kv_b(norm(c)); o above */
    moex_linear_w q_a, q_b, kv_a, kv_b;
    moex_vec_w q_a_norm, kv_a_norm;
    int64_t window;                  /* gpt_oss: the sliding window of a sliding layer, else 0 */
    float *sinks;                    /* gpt_oss: self_attn.sinks [heads] in f32 (owned by the model), or NULL */
} model_layer;

/* The weights of one layer that a step reads besides the experts: views of model_layer's on the
 * CPU, their device copies on CUDA (load_cuda.c). */
typedef struct model_layer_w {
    moex_vec_w in_norm, post_norm, q_norm, k_norm;
    moex_linear_w q, k, v, o, router, shared_gate;
    moex_mlp_w dense, shared;
    moex_linear_w q_a, q_b, kv_a, kv_b; /* deepseek_v3 */
    moex_vec_w q_a_norm, kv_a_norm;
    int64_t window;                     /* gpt_oss: a sliding layer's window (0: full attention) */
    const float *sinks;                 /* gpt_oss: [heads] f32, or NULL */
    const float *router_bias;           /* glm4_moe, deepseek_v3: e_score_correction_bias [E] f32, or NULL */
} model_layer_w;

/* What one step (step.c) runs with, all of it in the memory of env's op table: host memory
 * with moex_decoder_ops_cpu, device memory with moex_decoder_ops_cuda. */
typedef struct model_run {
    moex_decoder_env env;         /* the op table, its threads or stream, handle, KV cache */
    const model_layer_w *layers;  /* [num_hidden_layers] */
    const void *embed;            /* [V, H]; also the lm_head's weight when tied */
    moex_dtype embed_dtype;
    moex_vec_w final_norm;
    moex_linear_w lm_head;
    const float *inv_freq;        /* [head_dim / 2] */
    /* scratch, sized for max_tokens rows; last, normed: max_batch rows (on the CPU they are h and
     * tmp); gate, up: the dense MLPs' [T, I] (CUDA only: the CPU's MLP allocates its own);
     * logits [max_batch, V] and argmax [max_batch]: NULL on the CPU, which writes the caller's */
    float *x, *h, *q, *k, *v, *attn, *mlp, *tmp, *gate, *up, *cos, *sin, *router_logits, *route_w, *gate_logit;
    float *last, *normed, *logits;
    int32_t *route_ids;
    int64_t *positions, *tokens, *argmax;
    moex_attn_seq *seqs;          /* [max_batch] the step's sequences */
    const moex_attn_seq *host_seqs; /* during a step that is not captured: their host copy; else NULL */
    uint16_t *h16, *out16;        /* bf16 compute: the experts' input and output */
    float *mla;                   /* deepseek_v3: the latent attention's scratch (model_mla_scratch) */
} model_run;

/* deepseek_v3's latent attention scratch for T rows: its buffers carved from base (NULL: only
 * count), and the floats they take. q [T, heads, nope + rope], a [T, q_lora_rank], kva [T, kv_lora_rank +
 * rope] (the new latent rows), c [T, kv_lora_rank], kr [T, rope], qr [T, heads, rope], ql [T, heads,
 * kv_lora_rank + rope] (the absorbed query), ol [T, heads, kv_lora_rank] (the attended latents). */
typedef struct model_mla_bufs {
    float *q, *a, *kva, *c, *kr, *qr, *ql, *ol;
} model_mla_bufs;
size_t model_mla_scratch(const moex_config *c, int64_t T, float *base, model_mla_bufs *b);

/* The yarn parameters of the config's rope (rope_type "yarn"). */
moex_status model_yarn_params(const moex_config *c, moex_yarn_params *y);

/* The checkpoint's quantization_config (FP8 only), as the loader uses it. */
typedef struct model_quant {
    int on;                   /* quant_method "fp8" */
    int64_t block_n, block_k; /* weight_block_size, default 128 x 128 */
    int scheme;               /* MOEX_ACT_SCHEME_DYNAMIC or _STATIC (activation_scheme) */
    int mxfp4;                /* quant_method "mxfp4" (gpt_oss): experts as *_blocks / *_scales */
    int64_t dequantized;      /* e4m3 tensors dequantized at load (the linear layers), and their bytes */
    size_t dequantized_bytes;
} model_quant;

struct moex_model {
    moex_model_options opt;
    model_quant quant;
    moex_config cfg;
    moex_checkpoint *ckpt;
    char prefix[64];                 /* "model." or "model.language_model." */
    const void *embed;               /* [V, H] */
    moex_dtype embed_dtype;
    moex_vec_w final_norm;           /* [H] */
    int64_t rotary_dim;              /* the rotated values of each head: head_dim * partial_rotary_factor
                                        (glm4_moe), else head_dim */
    float cos_scale;                 /* gpt_oss with yarn: the attention factor cos and sin are multiplied by; else 1 */
    float q_scale;                   /* deepseek_v3 with yarn: mscale(factor, mscale_all_dim)^2, transformers'
                                        softmax scale over qk_head_dim^-0.5; else 1 */
    int qk_norm_rows;                /* olmoe: q_norm / k_norm span the whole q / k row (nh*d, nkv*d),
                                        not each head (the qwen3 families) */
    moex_linear_w lm_head;
    model_layer *layers;
    int64_t n_moe;
    moex_router_desc router;
    moex_experts_map map;
    int map_entry;                   /* the map entry the MoE layers follow */
    moex_context *ctx;
    moex_kv_cache *cache;            /* the CPU's KV cache (CUDA: model_gpu's) */
    float *inv_freq;                 /* [head_dim / 2] (host) */
    model_run run;                   /* what a step runs with (the CPU's scratch is malloc'd, freed with the model) */
    model_layer_w *host_layers;      /* the CPU's run.layers */
    void **owned;                    /* bf16 copies of weights stored in another dtype */
    int n_owned, cap_owned;
    size_t owned_bytes; /* what model_own gave out (moex_model_info.host_weight_copy_bytes) */
    model_gpu *gpu;                  /* device = CUDA: the device side (model_cuda.h); NULL on the cpu */
    int64_t inject_decode_error;     /* tests only: > 0 makes decode step n of the next generation fail */
};

/* One forward step over several sequences. seqs[i] has tokens[i][0 .. n_new)
 * at positions past .. past + n_new; logits [nseq, V] of each sequence's last
 * new token. Uses the backend map in force. */
typedef struct model_step_seq {
    int64_t seq, past, n_new;
    const int32_t *tokens;
} model_step_seq;

/* ---- quantized checkpoints (quant_load.c) ---- */

/* Check config.json's quantization_config and the quantize/dequantize options; fill m->quant. */
moex_status model_quant_setup(moex_model *m);

/* bytes of memory owned by the model (freed with it), or NULL after recording an error. */
void *model_own(moex_model *m, size_t bytes);

/* The block scale grid of e4m3 weight `name` (logical [.., N, K], E experts when fused or 0): the tensor
 * name + "_scale_inv", 2-D [ceil(N/bn), ceil(K/bk)] (3-D with E in front when fused) or each grid
 * flattened to 1-D. F32 or F8_E8M0. *view is a [E,] sn, sk view over it. */
moex_status model_scale_grid(moex_model *m, const char *name, int64_t E, int64_t N, int64_t K, moex_tensor *view);

/* e4m3 tensor t (its name, logical shape [E,] N, K) dequantized into model-owned memory in the compute
 * dtype (f32, or bf16 for bf16 compute). */
moex_status model_dequantize_tensor(moex_model *m, const moex_ckpt_tensor *t, const void **data, moex_dtype *dtype);

/* --quantize: turn the plain experts of d into quantized per-expert matrices owned by the model. */
moex_status model_quantize_experts(moex_model *m, model_layer *ly, moex_experts_desc *d);

/* ---- the step (step.c), written once over m->run.env's op table ---- */

/* One forward step over nseq (1 .. max_batch) sequences. The step's token ids and
 * descriptors are copied into the table's memory, the step runs (on CUDA it is queued, or,
 * with use_graph and one new token per sequence, replayed from the graph captured for this
 * batch size, capturing it the first time; use_graph needs a model on CUDA), the context is
 * synchronised once and the results land in host memory:
 *   logits [nseq, V] (required): each sequence's last new token's logits; when tokens is
 *          given too, the CPU computes them there but the device does not copy them back;
 *   tokens [nseq] or NULL: the greedy tokens, -1 - i for a row whose first NaN logit is i. */
moex_status model_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits, int64_t *tokens,
                       int use_graph);

/* An expert-parallel rank's step without tokens: each MoE layer's experts forward for T = 0, in
 * layer order, so that the layer's exchange has this rank in it (moex_generate's collective). */
moex_status model_step_idle(moex_model *m);

/* Forget sequence seq (every one for -1) in the KV cache the step uses. */
moex_status model_kv_reset(moex_model *m, int64_t seq);

/* On the CPU, after the load: m->run over the host weights, m->cache and the scratch loader.c
 * allocated (CUDA: model_gpu_load fills m->run). */
moex_status model_run_cpu(moex_model *m);

#endif
