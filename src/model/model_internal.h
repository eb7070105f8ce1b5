/* model_internal.h — the loaded model: weights (views into the checkpoint's
 * mapping), experts layers, the backend map, the KV cache and scratch. */
#ifndef MOEX_MODEL_INTERNAL_H
#define MOEX_MODEL_INTERNAL_H

#include "experts/experts_internal.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/experts_map.h"
#include "model/safetensors.h"

typedef struct model_layer {
    const void *in_norm, *post_norm; /* [H] */
    const void *q_norm, *k_norm;     /* [head_dim] (qwen3 families) or NULL */
    moex_dtype norm_dtype, q_norm_dtype, k_norm_dtype;
    moex_linear_w q, k, v, o;
    int is_moe;
    moex_linear_w router;            /* [E, H] */
    moex_layer *experts;
    const void **expert_ptrs;        /* per-expert layout: gate[E], up[E], down[E] in one block */
    moex_mlp_w dense;                /* dense layers */
    int has_shared;
    moex_mlp_w shared;               /* qwen2_moe shared expert */
    moex_linear_w shared_gate;       /* [1, H] */
} model_layer;

struct moex_model {
    moex_model_options opt;
    moex_config cfg;
    moex_checkpoint *ckpt;
    char prefix[64];                 /* "model." or "model.language_model." */
    const void *embed;               /* [V, H] */
    moex_dtype embed_dtype;
    const void *final_norm;
    moex_dtype final_norm_dtype;
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
};

/* One forward step over several sequences. seqs[i] has tokens[i][0 .. n_new)
 * at positions past .. past + n_new; logits [nseq, V] of each sequence's last
 * new token. Uses the backend map in force. */
typedef struct model_step_seq {
    int64_t seq, past, n_new;
    const int32_t *tokens;
} model_step_seq;

moex_status moex_model_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits);

#endif
