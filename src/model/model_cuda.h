/* model_cuda.h — a model whose decoder runs on a CUDA device (SPEC R8, issue
 * "the whole model on the H200"). Internal.
 *
 * When moex_model_options.device is CUDA the loader reads the checkpoint as on
 * the CPU (views into the mapping, bf16 copies for bf16 compute), then
 * load_cuda.c uploads once every weight a step needs, in the dtype the step
 * computes with: f32 for f32 compute (bf16/f16 checkpoints widened, which is
 * exact, so cuBLAS runs the CPU's f32 arithmetic), bf16 for bf16 compute. Norm
 * weights keep their stored dtype (the kernels decode them). A tied lm_head
 * shares the embedding's upload. The experts layers are created with device
 * tensors and the model's context is a CUDA context, so moex_experts_forward
 * runs the CUDA backends. step_cuda.c is the device twin of step.c.
 *
 * Everything in this file's implementation is compiled only with
 * MOEX_HAVE_CUDA; without it model_gpu_load fails with MOEX_ERR_UNSUPPORTED.
 */
#ifndef MOEX_MODEL_CUDA_H
#define MOEX_MODEL_CUDA_H

#include "decoder/decoder.h"

#if MOEX_HAVE_CUDA
#include "decoder/cuda/decoder_api.h"
#endif

typedef struct moex_model moex_model;
struct model_step_seq;

/* The device copies of one layer's weights (device pointers in host structs). */
typedef struct gpu_layer {
    moex_vec_w in_norm, post_norm, q_norm, k_norm;
    moex_linear_w q, k, v, o, router, shared_gate;
    moex_mlp_w dense, shared;
} gpu_layer;

/* One captured decode step: a graph per batch size (nseq tokens, one per sequence). */
typedef struct gpu_graph {
    moex_graph *graph;
    char backend[64]; /* the experts backend the capture recorded */
} gpu_graph;

typedef struct model_gpu {
    moex_device dev;
    void *stream; /* the context's stream */
    int *flags;   /* the context's status word */
    gpu_layer *layers;
    const void *embed; /* [V, H]; also the lm_head's weight when tied */
    moex_dtype embed_dtype;
    moex_vec_w final_norm;
    moex_linear_w lm_head;
    float *inv_freq;
#if MOEX_HAVE_CUDA
    moex_cuda_kv_cache cache;
    moex_cuda_blas blas;
#endif
    /* scratch, sized for max_tokens rows (last, normed, logits: max_batch rows) */
    float *x, *h, *q, *k, *v, *attn, *mlp, *tmp, *gate, *up, *cos, *sin, *router_logits, *route_w, *gate_logit;
    float *last, *normed, *logits;
    int32_t *route_ids;
    int64_t *positions, *tokens, *argmax;
    moex_attn_seq *seqs;
    uint16_t *h16, *out16; /* bf16 compute: the experts' input and output */
    void *x16;             /* bf16 weights: the linear layers' rounded input */
    /* every device allocation, freed with the model */
    void **allocs;
    int n_allocs, cap_allocs;
    /* bytes on the device, by use (moex_model_info) */
    size_t weight_bytes, kv_bytes, scratch_bytes;
    gpu_graph *graphs; /* [max_batch + 1], indexed by batch size */
} model_gpu;

/* Make m->gpu (empty) at the start of a CUDA load. */
moex_status model_gpu_state(moex_model *m);

/* Upload the experts weights of desc d (host views, as the CPU loader made
 * them) and point d at the device copies, before moex_layer_create: fused
 * tensors as they are; per-expert matrices stacked into gate_up [E, 2I, H]
 * (gate rows, then up rows) and down [E, H, I], so that the tensor-core
 * path of grouped_mm can read them. */
moex_status model_gpu_experts(moex_model *m, moex_experts_desc *d);

/* After every layer is loaded: upload the other weights, create the KV cache,
 * the cuBLAS handle and the scratch. m->ctx must be the CUDA context. */
moex_status model_gpu_load(moex_model *m);

/* Free the device side (graphs, handle, cache, every allocation). NULL-safe on a partial load. */
void model_gpu_free(moex_model *m);

/* Queue: forget sequence seq (or every one for -1) in the device KV cache. */
moex_status model_gpu_reset(moex_model *m, int64_t seq);

/* One forward step on the device (the twin of moex_model_step): the step's
 * token ids and descriptors are written to device memory, the step is queued
 * (or, with use_graph and one new token per sequence, replayed from the graph
 * captured for this batch size, capturing it the first time), then the stream
 * is synchronised once and the results copied back: logits [nseq, V] when
 * logits != NULL, the greedy tokens [nseq] when tokens != NULL. */
moex_status model_gpu_step(moex_model *m, const struct model_step_seq *seqs, int64_t nseq, float *logits,
                           int64_t *tokens, int use_graph);

#endif
