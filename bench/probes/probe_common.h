/* probe_common.h — what the probes (diagnostics, not part of moex) share: their error rule (a
 * failed CUDA call prints where and why, and the probe exits 1), their timing (the median of
 * runs, each after a write that flushes L2) and, for the TMA probes, a shared-memory address and
 * the wait for an mbarrier's phase. */
#ifndef MOEX_PROBE_COMMON_H
#define MOEX_PROBE_COMMON_H
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                                     \
    do {                                                                                                          \
        cudaError_t e_ = (x);                                                                                     \
        if (e_ != cudaSuccess) {                                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                   \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

/* The shared-memory address of p (a pointer into shared memory). */
__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Wait until the mbarrier at shared address bar has completed the phase of the given parity. */
__device__ __forceinline__ void wait_parity(uint32_t bar, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}

/* The median time in ms of `runs` launches, after `warmups` untimed ones; before each, the 256 MiB
 * at flush are rewritten (L2 holds none of the launch's inputs), and each is timed with events. */
template <typename F> static float probe_median_ms(void *flush, int warmups, int runs, F launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < warmups + runs; r++) {
        CK(cudaMemsetAsync(flush, r & 0xff, 256u << 20));
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= warmups) t.push_back(ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

#endif
