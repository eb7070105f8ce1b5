/* memory.c — allocation and copies on either device (moex_device_alloc,
 * moex_device_free, moex_memcpy). The CUDA half is src/gpu/runtime.cu (core/gpu_runtime.h). */
#include "core/internal.h"
#include <stdlib.h>
#if MOEX_HAVE_CUDA
#include "core/gpu_runtime.h"
#endif

static moex_status check_device(moex_device d, const char *what) {
    if (d.kind == MOEX_DEVICE_CPU) {
        if (d.index != 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: cpu device index must be 0, got %d", what, d.index);
        return MOEX_OK;
    }
    if (d.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: device kind %d is not a moex_device_kind", what, (int)d.kind);
#if MOEX_HAVE_CUDA
    if (d.index < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: cuda device index %d is negative", what, d.index);
    return MOEX_OK;
#else
    return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: this build of moex has no CUDA support (cuda:%d)", what, d.index);
#endif
}

moex_status moex_device_alloc(moex_device device, size_t bytes, void **ptr) {
    if (!ptr) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_device_alloc: ptr is NULL");
    moex_status st = check_device(device, "moex_device_alloc");
    if (st) return st;
    if (bytes == 0) {
        *ptr = NULL;
        return MOEX_OK;
    }
    if (device.kind == MOEX_DEVICE_CPU) {
        size_t rounded = (bytes + 63) & ~(size_t)63;
        void *p = rounded < bytes ? NULL : aligned_alloc(64, rounded);
        if (!p) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_device_alloc: %zu bytes of host memory", bytes);
        *ptr = p;
        return MOEX_OK;
    }
#if MOEX_HAVE_CUDA
    return moex_cuda_alloc(device.index, bytes, ptr);
#else
    return MOEX_ERR_UNSUPPORTED;
#endif
}

void moex_device_free(moex_device device, void *ptr) {
    if (!ptr) return;
    if (device.kind == MOEX_DEVICE_CPU) {
        free(ptr);
        return;
    }
#if MOEX_HAVE_CUDA
    if (device.kind == MOEX_DEVICE_CUDA) moex_cuda_free(device.index, ptr);
#endif
}

moex_status moex_memcpy(void *dst, moex_device dst_device, const void *src, moex_device src_device, size_t bytes) {
    moex_status st = check_device(dst_device, "moex_memcpy (destination)");
    if (!st) st = check_device(src_device, "moex_memcpy (source)");
    if (st) return st;
    if (bytes == 0) return MOEX_OK;
    if (!dst || !src) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_memcpy: %s is NULL", dst ? "src" : "dst");
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (bytes > (size_t)PTRDIFF_MAX || bytes > UINTPTR_MAX - d || bytes > UINTPTR_MAX - s) /* no object is that large */
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_memcpy: %zu bytes at %p are more than memory can hold there",
                         bytes, bytes > UINTPTR_MAX - s ? src : dst);
    if (dst_device.kind == MOEX_DEVICE_CPU && src_device.kind == MOEX_DEVICE_CPU) {
        if (d < s + bytes && s < d + bytes)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_memcpy: the %zu-byte ranges at %p and %p overlap", bytes,
                             dst, src);
        memcpy(dst, src, bytes);
        return MOEX_OK;
    }
#if MOEX_HAVE_CUDA
    return moex_cuda_memcpy(dst, dst_device.kind == MOEX_DEVICE_CUDA ? dst_device.index : -1, src,
                            src_device.kind == MOEX_DEVICE_CUDA ? src_device.index : -1, bytes);
#else
    return MOEX_ERR_UNSUPPORTED;
#endif
}
