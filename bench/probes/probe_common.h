/* probe_common.h — what the probes (diagnostics, not part of moex) share: their error rule (a
 * failed CUDA call prints where and why, and the probe exits 1), their timing (the median of
 * runs, each after a write that flushes L2), the sequential read the fractions are taken of and,
 * for the TMA probes, a shared-memory address, the wait for an mbarrier's phase and a box copy. */
#ifndef MOEX_PROBE_COMMON_H
#define MOEX_PROBE_COMMON_H
#include <cuda.h>
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

/* Box (col, row) of map into this block's shared memory at dst, completing on its mbarrier at bar. */
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap *map, uint32_t bar, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst), "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}

/* A sequential read of n16 16-byte words at p, four loads in flight a thread (launch it with
 * 8 blocks of 256 an SM): the read rate the probes compare their loads with. */
__device__ float seq_read_sink;
__global__ void __launch_bounds__(256) seq_read(const uint4 *p, size_t n16) {
    float s = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++) s += __uint_as_float(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    }
    for (; i < n16; i += stride) s += __uint_as_float(p[i].x ^ p[i].w);
    if (s == 1.2345f) seq_read_sink = s;
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
