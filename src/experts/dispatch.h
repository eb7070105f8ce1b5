/* dispatch.h — what the experts front end (and the model) ask of the dispatch table. The table
 * itself, the one place that decides which implementation runs for (backend, device, weight
 * format), is src/backends/table.c; the front end sees only these calls. */
#ifndef MOEX_EXPERTS_DISPATCH_H
#define MOEX_EXPERTS_DISPATCH_H

#include "experts/experts_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The weight formats a table row takes, as bits. */
typedef enum moex_weight_format {
    MOEX_FORMAT_FLOAT = 1, /* f32, f16, bf16 */
    MOEX_FORMAT_FP8 = 2,   /* e4m3 with block scales */
    MOEX_FORMAT_FP4 = 4    /* e2m1 (two per byte) with block scales */
} moex_weight_format;

/* The format of a layer's weights (its weight dtype's), or 0 for a dtype no row can take. */
moex_weight_format moex_weight_format_of(const moex_experts_desc *d);
/* "f32/f16/bf16", "fp8 (e4m3)", "fp4 (e2m1)" for one bit; "" otherwise. */
const char *moex_weight_format_name(moex_weight_format f);

/* The built-in backends, in registration order: *count entries. */
const moex_backend *moex_builtin_backends(int *count);

/* The weight formats (bits) that some built-in backend runs on devices of `kind`: what a
 * loader may keep in its stored format there rather than dequantize. */
unsigned moex_dispatch_device_formats(moex_device_kind kind);

/* The backend that runs decode steps (one new token per sequence) for `name` on devices of
 * `kind`: the table's decode_with for that row, or name itself. */
const char *moex_dispatch_decode_backend(const char *name, moex_device_kind kind);

/* ---- expert parallelism: the exchange of a forward in a context with a group (backends/ep_forward.c) ---- */

/* Bytes of host memory a context of a group of `ranks` keeps for the exchange's small messages. */
size_t moex_ep_scratch_bytes(int ranks);

/* The most rows a rank receives in one forward: ranks x max_tokens x top_k, or -1 when that is
 * more than 2^31 - 1. */
int64_t moex_ep_max_rows(int ranks, int64_t max_tokens, int64_t top_k);

/* Workspace bytes of the exchange itself on a device of kind `where` (64-byte multiple on the
 * CPU, 256 on a GPU; the backend's own workspace for moex_ep_max_rows rows comes after it), or
 * SIZE_MAX when too large or no exchange runs there. */
size_t moex_ep_exchange_bytes(const moex_experts_desc *share, int64_t max_tokens, int ranks, moex_device_kind where);

/* A CUDA context of a group over the caller's transport (ranks in processes): its record of the
 * peers' buffers and events opened through CUDA IPC (the context's ep_peers; CUDA builds only,
 * backends/cuda/ep_forward_cuda.cu), made with the context. retire: a workspace being replaced,
 * kept (*kept = 1) when this rank has shared it, since peers may still hold it open. free (before
 * the workspace and the events are freed): closes what this rank opened, then, once the ranks have
 * opened each other's memory, waits for every rank to do the same (a last collective: every rank
 * frees its context), then frees the retired workspaces. */
moex_status moex_ep_cuda_peers_new(int ranks, void **out);
moex_status moex_ep_cuda_peers_retire(void *peers, void *workspace, int *kept);
void moex_ep_cuda_peers_free(void *peers, int device, moex_ep_group *g);

/* A CUDA context's ep_pipe: the streams and events of deepgemm_megamoe's exchange in pieces (CUDA
 * builds only, backends/cuda/ep_forward_cuda.cu), made at its first such forward; freed (NULL:
 * nothing) after what is queued on its streams has run. */
void moex_ep_cuda_pipe_free(void *pipe);

/* Whether backend b, on devices of `kind` for layers like `layer`, overlaps the expert-parallel
 * exchange with its compute (the table row's implementation says so: deepgemm_megamoe). */
int moex_dispatch_overlaps_exchange(const moex_backend *b, moex_device_kind kind, const moex_experts_desc *layer);

/* One forward of this rank (see moex_experts_forward; a CUDA context's goes on in
 * backends/cuda/ep_forward_cuda.h): `checked` is what the front end's checks of this rank's
 * arguments found (MOEX_OK or a failure with its message), p the prepared entry (NULL if none;
 * then checked is a failure; so is it when layer, or any argument but ctx, is NULL). Every rank takes part in the exchange of statuses whatever it
 * found, so that every rank returns. */
moex_status moex_ep_forward(moex_context *ctx, const moex_layer *layer, const moex_backend *b, const moex_prepared *p,
                            const moex_tensor *hidden, const moex_tensor *ids, const moex_tensor *weights,
                            moex_tensor *out, moex_status checked);

#ifdef __cplusplus
}
#endif

#endif
