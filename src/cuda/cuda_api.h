/* cuda_api.h — the C boundary of the CUDA side of libmoex (the .cu files of src/cuda).
 * No CUDA types: streams and graphs travel as void pointers. Everything here
 * exists only when the library is built with MOEX_HAVE_CUDA. */
#ifndef MOEX_CUDA_API_H
#define MOEX_CUDA_API_H

#include "experts/experts_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime (runtime.cu) ----------------------------------------------- */

moex_status moex_cuda_device_query(int index, moex_device_info *info);
moex_status moex_cuda_alloc(int device, size_t bytes, void **ptr);
void moex_cuda_free(int device, void *ptr);
/* dst_gpu / src_gpu: device index of a GPU side, or -1 for host memory. */
moex_status moex_cuda_memcpy(void *dst, int dst_gpu, const void *src, int src_gpu, size_t bytes);
/* The process-wide non-blocking stream of (device, slot), made at first use. */
moex_status moex_cuda_stream(int device, int slot, void **stream);
/* The context's device-side status word (int32, zeroed), one per context. */
moex_status moex_cuda_flags_alloc(int device, int **flags);
/* Wait for the stream, then read and clear the status word; errors become statuses. */
moex_status moex_cuda_synchronize(int device, void *stream, int *flags);
moex_status moex_cuda_graph_begin(int device, void *stream);
moex_status moex_cuda_graph_end(int device, void *stream, void **exec);
moex_status moex_cuda_graph_launch(int device, void *exec, void *stream);
void moex_cuda_graph_free(void *exec);

/* Bits of the status word. */
#define MOEX_CUDA_FLAG_BAD_ID 1

/* ---- the three backends (backends.cu) ----------------------------------- */

typedef enum moex_cuda_kind { MOEX_CUDA_EAGER = 0, MOEX_CUDA_BATCHED_MM = 1, MOEX_CUDA_GROUPED_MM = 2 } moex_cuda_kind;

int moex_cuda_supports(moex_cuda_kind kind, const moex_experts_desc *d, const moex_device_info *dev, char *why,
                       size_t n);
/* Device workspace bytes (SIZE_MAX on overflow). */
size_t moex_cuda_workspace_bytes(moex_cuda_kind kind, const moex_experts_desc *d, int64_t max_tokens);
moex_status moex_cuda_prepare(moex_cuda_kind kind, moex_context *ctx, const moex_experts_desc *d, void **state);
void moex_cuda_release(moex_cuda_kind kind, void *state);
/* Queue one forward on the context's stream; no host sync, no allocation. */
moex_status moex_cuda_forward(moex_cuda_kind kind, const moex_forward_args *args);

#ifdef __cplusplus
}
#endif

#endif
