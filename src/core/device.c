/* device.c — what the CPU can do (run-time feature detection) and device queries. */
#include "core/internal.h"
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
/* XCR0: the register states the operating system saves and restores (xgetbv, ecx = 0; written as
 * bytes so that no -mxsave is needed). Only call it when CPUID says OSXSAVE. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* AVX2, FMA and F16C in the CPU, and the YMM registers enabled by the OS (CPUID leaves 1 and 7,
 * XGETBV): what __builtin_cpu_supports tells, in a form every x86 compiler takes. */
static int detect_avx2_fma_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned leaf1 = bit_FMA | bit_F16C | bit_AVX | bit_OSXSAVE; /* ECX of leaf 1 */
    if ((c & leaf1) != leaf1) return 0;
    if ((read_xcr0() & 0x6) != 0x6) return 0; /* XMM (bit 1) and YMM (bit 2) state saved by the OS */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & bit_AVX2) != 0; /* EBX of leaf 7, subleaf 0 */
}
#endif

int moex_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    static atomic_int known = -1; /* CPUID is slow under a hypervisor: ask once */
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        v = detect_avx2_fma_f16c();
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v;
#else
    return 0;
#endif
}

int moex_cpu_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#if MOEX_HAVE_CUDA
#include "core/gpu_runtime.h" /* moex_cuda_device_query, implemented by src/gpu/runtime.cu */
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
