/* device.c — what the CPU can do (run-time feature detection) and device queries. */
#include "core/internal.h"
#include <stdio.h>
#include <unistd.h>

int moex_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int moex_cpu_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#if MOEX_HAVE_CUDA
/* Provided by src/cuda/ when the library is built with CUDA. */
moex_status moex_cuda_device_query(int index, moex_device_info *info);
#endif

moex_status moex_device_query(moex_device device, moex_device_info *info) {
    if (!info) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_device_query: info is NULL");
    if (device.kind != MOEX_DEVICE_CPU && device.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_device_query: device kind %d is not a moex_device_kind",
                         (int)device.kind);
    moex_device_info d;
    memset(&d, 0, sizeof d);
    d.device = device;
    d.cuda_built = MOEX_HAVE_CUDA;
    if (device.kind == MOEX_DEVICE_CPU) {
        d.available = device.index == 0;
        d.cpu_avx2 = moex_cpu_has_avx2();
        d.cpu_cores = moex_cpu_cores();
        snprintf(d.name, sizeof d.name, "cpu (%d cores, %s kernels)", d.cpu_cores, d.cpu_avx2 ? "avx2" : "portable");
        if (!d.available) snprintf(d.reason, sizeof d.reason, "cpu device index must be 0, got %d", device.index);
        *info = d;
        return MOEX_OK;
    }
#if MOEX_HAVE_CUDA
    moex_status st = moex_cuda_device_query(device.index, &d);
    if (st != MOEX_OK) return st;
#else
    snprintf(d.name, sizeof d.name, "cuda:%d", device.index);
    snprintf(d.reason, sizeof d.reason,
             "this build of moex has no CUDA support (nvcc was not found when it was built); rebuild with the CUDA toolkit");
#endif
    *info = d;
    return MOEX_OK;
}
