/* gpu_runtime.h — the CUDA runtime under libmoex (implemented by src/gpu/runtime.cu): device queries, memory,
 * copies, the per-slot streams, the status word and graphs, as C calls. No CUDA types:
 * streams and graphs travel as void pointers. Everything here exists only when the
 * library is built with MOEX_HAVE_CUDA. */
#ifndef MOEX_CORE_GPU_RUNTIME_H
#define MOEX_CORE_GPU_RUNTIME_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* An event that orders one stream's work after another's (timing off), and its release. */
moex_status moex_cuda_event_create(int device, int interprocess, void **event); /* interprocess: shareable by CUDA IPC */
void moex_cuda_event_free(int device, void *event);
/* Kernels on device a may read and write device b's memory and b's a's (both directions enabled,
 * once per process and pair; a == b: nothing to do), or an error naming both devices. */
moex_status moex_cuda_peer_access(int a, int b);

/* Bits of the status word, one per kind of value the host could not check without a sync. */
#define MOEX_CUDA_FLAG_BAD_ID MOEX_CUDA_STATUS_BAD_ID /* an expert id not in [-1, E] (moex.h): its pair is skipped */
#define MOEX_CUDA_FLAG_BAD_TOKEN 2 /* an embedding id outside [0, V) (decoder): that row is zeros */
#define MOEX_CUDA_FLAG_BAD_SEQ 4   /* an attention descriptor the cache cannot take (decoder): skipped */

#ifdef __cplusplus
}
#endif

#endif
