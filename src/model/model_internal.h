/* model_internal.h — the loaded model: weights (views into the checkpoint's
 * mapping), experts layers, the backend map, the KV cache and scratch. */
#ifndef MOEX_MODEL_INTERNAL_H
#define MOEX_MODEL_INTERNAL_H

#include "experts/experts_internal.h"
#include "model/config.h"
#include "decoder/decoder.h"
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
    moex_mlp_w shared;               /* qwen2_moe shared expert */
    moex_linear_w shared_gate;       /* [1, H] */
} model_layer;

/* The checkpoint's quantization_config (FP8 only), as the loader uses it. */
typedef struct model_quant {
    int on;                   /* quant_method "fp8" */
    int64_t block_n, block_k; /* weight_block_size, default 128 x 128 */
    int scheme;               /* MOEX_ACT_SCHEME_DYNAMIC or _STATIC (activation_scheme) */
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
    moex_linear_w lm_head;
    model_layer *layers;
    int64_t n_moe;
    moex_router_desc router;
    moex_experts_map map;
    int map_entry;                   /* the map entry the MoE layers follow */
    moex_context *ctx;
    moex_kv_cache *cache;
    float *inv_freq;                 /* [head_dim / 2] */
    /* scratch, sized for max_tokens rows */
    float *x, *h, *q, *k, *v, *attn, *mlp, *tmp, *cos, *sin, *router_logits, *route_w;
    int32_t *route_ids;
    int64_t *positions;
    uint16_t *h16, *out16;           /* bf16 compute: the experts' input and output */
    void **owned;                    /* bf16 copies of weights stored in another dtype */
    int n_owned, cap_owned;
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

moex_status moex_model_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits);

/* The host side of a step, shared by both devices: the sizes against the load options and
 * the token ids against the vocabulary checked, attn[nseq] filled, the new tokens stacked
 * into *tokens (malloc'd, *total of them; the caller frees it). */
moex_status model_step_inputs(const moex_model *m, const model_step_seq *seqs, int64_t nseq, moex_attn_seq *attn,
                              int64_t *total, int64_t **tokens);

#endif
