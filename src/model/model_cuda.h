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
 * runs the CUDA backends. model_gpu_load points the model's step state (m->run)
 * at the device copies, the device scratch and the CUDA op table of
 * decoder/ops.h, so that step.c runs the same step on the device.
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
struct model_layer_w;

/* One captured decode step: a graph per batch size (nseq tokens, one per sequence). */
typedef struct gpu_graph {
    moex_graph *graph;
    char backend[64]; /* the experts backend the capture recorded */
} gpu_graph;

typedef struct model_gpu {
    moex_device dev;
    void *stream; /* the context's stream */
    int *flags;   /* the context's status word */
    struct model_layer_w *layers; /* [L] the device copies (device pointers in host structs); m->run.layers */
#if MOEX_HAVE_CUDA
    moex_cuda_kv_cache cache;
    moex_cuda_blas blas;
#endif
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
 * the cuBLAS handle and the scratch, and point m->run at them with the CUDA op
 * table. m->ctx must be the CUDA context. */
moex_status model_gpu_load(moex_model *m);

/* Free the device side (graphs, handle, cache, every allocation). NULL-safe on a partial load. */
void model_gpu_free(moex_model *m);

#endif
