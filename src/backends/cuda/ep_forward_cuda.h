/* ep_forward_cuda.h — one forward of a rank of an expert-parallel group on a CUDA device
 * (ep_forward_cuda.cu): backends/ep_forward.c's steps with device buffers, for ranks that share
 * one process (moex_ep_local_groups, each rank's context on its own stream slot), on one GPU or
 * several (peer access between each two, enabled by moex_ep_group_bind), and for ranks in
 * processes of one machine (a group over the caller's transport: buffers and events shared
 * through CUDA IPC). Plain EP has no host synchronisation of the data: the counts stay on the
 * device, and the ranks' streams are ordered by events that two host all-gathers a forward
 * publish; deepgemm_megamoe's large forwards bring the plan's counts to the host (one wait) and
 * all-gather them too. Ranks on several machines (NCCL) are the next step.
 *
 * Plain C (no CUDA types): backends/ep_forward.c calls it for CUDA contexts. */
#ifndef MOEX_BACKENDS_CUDA_EP_FORWARD_CUDA_H
#define MOEX_BACKENDS_CUDA_EP_FORWARD_CUDA_H

#include "experts/dispatch.h"
#include "experts/experts_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host bytes each rank posts in one all-gather, and the context's ep_scratch for R ranks: R posts,
 * then deepgemm_megamoe's counts (R + 1 and R (R + 1) int64, R int32). */
#define MOEX_EP_CUDA_POST_BYTES 320
#define MOEX_EP_CUDA_SCRATCH_BYTES(R) \
    ((size_t)(R) * MOEX_EP_CUDA_POST_BYTES + ((size_t)(R) + 2) * ((size_t)(R) + 1) * 8 + (size_t)(R) * 4)

/* Device workspace bytes of the exchange (the backend's own for moex_ep_max_rows rows comes
 * after it), or SIZE_MAX when too large: the plan, and three buffers of ranks x max_tokens x
 * top_k rows of the hidden size (rows sent, whose space the results coming back reuse; rows
 * received; this rank's results), sized for f32 activations. */
size_t moex_ep_cuda_exchange_bytes(const moex_experts_desc *share, int64_t max_tokens, int ranks);

/* moex_ep_forward for a CUDA context (same arguments; see experts/dispatch.h). Queued on the
 * context's stream; bad ids are reported by moex_context_synchronize, as a one-GPU forward's are.
 * A backend that overlaps the exchange with its compute (deepgemm_megamoe) runs large forwards in
 * pieces on two more streams of the context's (ep_pipe, made at the first such forward, freed by
 * moex_ep_cuda_pipe_free, experts/dispatch.h). */
moex_status moex_ep_cuda_forward(moex_context *ctx, const moex_layer *layer, const moex_backend *b,
                                 const moex_prepared *p, const moex_tensor *hidden, const moex_tensor *ids,
                                 const moex_tensor *weights, moex_tensor *out, moex_status checked);

#ifdef __cplusplus
}
#endif

#endif
