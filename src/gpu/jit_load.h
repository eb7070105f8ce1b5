/* jit_load.h — run-time compiled kernels (jit.h) on the GPU: an image loaded onto the current
 * device, a kernel of it found by name and launched, CUDA-graph capturable like any launch.
 * CUDA builds only (jit_load.cu). */
#ifndef MOEX_GPU_JIT_LOAD_H
#define MOEX_GPU_JIT_LOAD_H

#include "gpu/jit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded kernel: the CUDA library (cudaLibrary_t) that holds it and its handle (cudaKernel_t). */
typedef struct moex_jit_kernel {
    void *library;
    void *kernel;
} moex_jit_kernel;

/* Kernel `entry` (an extern "C" name) of src, on the current device: its image from the cache or
 * compiled (moex_jit_build), then loaded. An image from the cache that does not load there (built
 * for another GPU, or damaged past what the cache's checks see) is compiled again and replaces
 * the entry. info (may be NULL) gets where the image came from (its data NULL: the bytes are not
 * kept; its note says when a cached image was rebuilt). On
 * failure *k is empty and the message names the source and the entry. */
moex_status moex_jit_kernel_get(const moex_jit_source *src, const char *entry, const char *cache_dir,
                                moex_jit_kernel *k, moex_jit_image *info);

/* Load an image (a CUBIN) onto the current device and find entry in it; `what` names it in messages.
 * Allowed while a stream of this thread is being captured into a CUDA graph (loading is not
 * stream work: it runs in the relaxed capture mode), as are moex_jit_kernel_get and
 * moex_jit_kernel_smem. */
moex_status moex_jit_load(const void *image, size_t size, const char *entry, const char *what, moex_jit_kernel *k);

/* Let k use `bytes` of dynamic shared memory (needed above 48 KiB). */
moex_status moex_jit_kernel_smem(const moex_jit_kernel *k, int bytes);

/* Queue k on stream (a cudaStream_t; NULL: the legacy default stream) with its arguments
 * (args[i] points to argument i). */
moex_status moex_jit_launch(const moex_jit_kernel *k, const unsigned grid[3], const unsigned block[3], size_t smem,
                            void *stream, void **args);

/* Unload k's library (no kernel of it may still run); k is emptied. */
void moex_jit_kernel_release(moex_jit_kernel *k);

#ifdef __cplusplus
}
#endif

#endif
