/* jit_load.cu — run-time compiled kernels loaded and launched (see jit_load.h), through the
 * runtime's library API: a cudaKernel_t is passed wherever the runtime takes a kernel. */
#include "gpu/cuda_check.h"
#include "gpu/jit_load.h"

#include <cuda_runtime.h>
#include <stdio.h>

static moex_status load(const void *image, size_t size, const char *entry, const char *what, moex_jit_kernel *k);

extern "C" moex_status moex_jit_load(const void *image, size_t size, const char *entry, const char *what,
                                     moex_jit_kernel *k) {
    if (!k || !image || !size || !entry) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: load of %s: no image or entry", what);
    k->library = k->kernel = NULL;
    /* a forward may load its kernels while its stream is being captured into a graph: loading is
     * not stream work, and the relaxed mode lets this thread do it without ending the capture */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    moex_status st = load(image, size, entry, what, k);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return st;
}

static moex_status load(const void *image, size_t size, const char *entry, const char *what, moex_jit_kernel *k) {
    cudaLibrary_t lib = NULL;
    cudaError_t err = cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (err != cudaSuccess) {
        char m[160];
        snprintf(m, sizeof m, "jit: loading the %zu-byte image of %s onto the device", size, what);
        return moex_cuda_status(err, m);
    }
    cudaKernel_t kern = NULL;
    err = cudaLibraryGetKernel(&kern, lib, entry);
    if (err != cudaSuccess) {
        cudaLibraryUnload(lib);
        cudaGetLastError();
        return moex_fail(MOEX_ERR_DEVICE, "jit: the image of %s has no kernel \"%s\" (%s)", what, entry,
                         cudaGetErrorString(err));
    }
    /* loading is lazy: the attributes make the device load the kernel now, so that an image it
     * cannot run fails here rather than at the first launch */
    cudaFuncAttributes attr;
    err = cudaFuncGetAttributes(&attr, (const void *)kern);
    if (err != cudaSuccess) {
        cudaLibraryUnload(lib);
        char m[200];
        snprintf(m, sizeof m, "jit: kernel \"%s\" of %s on the device", entry, what);
        return moex_cuda_status(err, m);
    }
    k->library = (void *)lib;
    k->kernel = (void *)kern;
    return MOEX_OK;
}

extern "C" moex_status moex_jit_kernel_get(const moex_jit_source *src, const char *entry, const char *cache_dir,
                                           moex_jit_kernel *k, moex_jit_image *info) {
    if (!k) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: kernel_get: k is NULL");
    k->library = k->kernel = NULL;
    moex_jit_image img;
    moex_status st = moex_jit_build(src, cache_dir, &img);
    if (st) return st;
    st = moex_jit_load(img.data, img.size, entry, src->name, k);
    if (st && img.from_cache) { /* a cached image the device refuses: never trusted, built again */
        char first[200];
        snprintf(first, sizeof first, "%s", moex_last_error());
        moex_jit_image_free(&img);
        if ((st = moex_jit_rebuild(src, cache_dir, &img))) return st;
        st = moex_jit_load(img.data, img.size, entry, src->name, k);
        if (!img.note[0]) snprintf(img.note, sizeof img.note, "cached image did not load (%.200s): rebuilt", first);
    }
    if (info) { /* where the image came from; the bytes and the log are not kept */
        *info = img;
        info->data = NULL;
        info->log = NULL;
    }
    moex_jit_image_free(&img);
    return st;
}

extern "C" moex_status moex_jit_kernel_smem(const moex_jit_kernel *k, int bytes) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaFuncSetAttribute((const void *)k->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return moex_cuda_status(err, "jit: dynamic shared memory of a kernel");
}

extern "C" moex_status moex_jit_launch(const moex_jit_kernel *k, const unsigned grid[3], const unsigned block[3],
                                       size_t smem, void *stream, void **args) {
    cudaError_t err = cudaLaunchKernel((const void *)k->kernel, dim3(grid[0], grid[1], grid[2]),
                                       dim3(block[0], block[1], block[2]), args, smem, (cudaStream_t)stream);
    return moex_cuda_status(err, "jit: kernel launch");
}

extern "C" void moex_jit_kernel_release(moex_jit_kernel *k) {
    if (!k) return;
    if (k->library) cudaLibraryUnload((cudaLibrary_t)k->library);
    k->library = k->kernel = NULL;
}
