/* stream_read.cu — a diagnostic, not part of moex: how fast the streamed expert kernels' access
 * patterns can read the weights, with no arithmetic (results: dev/notes/cuda-notes.md).
 *
 * Weights as qwen3-30b-a3b stores them (bf16): E experts of gate/up [2I, H] and down [H, I].
 * A warp item is 16 rows of one expert (gate rows n0..n0+15 and up rows I+n0.. for gate/up,
 * down rows n0..n0+15 for down) streamed along k. Patterns:
 *   lanes L per row: each load instruction of the warp covers 32/L rows x 16*L bytes
 *     (L = 4 is what gemv_mma.cu does: 8 rows x 64 bytes, two loads for 16 rows)
 *   stagger: the warp starts its k loop at a k offset that depends on its item, wrapping
 *     (0: every warp starts at k = 0)
 *   hint: ld.global.nc.L1::no_allocate.L2::256B (1) or plain ld.global.nc (0)
 * plus the read floor's pattern (the whole region read as one contiguous grid-stride range).
 * Every pattern reads every byte of the region once; the loads are xor-summed into a
 * never-taken store. Timed with events after a 256 MiB write that flushes L2; median of RUNS.
 *
 *   build: the CMake target stream_read_probe (CUDA builds), or nvcc -O3 -arch=sm_90a stream_read.cu
 *   run:   stream_read_probe [experts]   (CSV on stdout; a few seconds on an H200)
 * Output: CSV pattern,region,lanes,stagger,hint,warps x blocks an SM (0: all that fit),ms,GBps */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "probe_common.h"

static const int H = 2048, I = 768, RUNS = 15;

template <int HINT> __device__ __forceinline__ uint4 ld16(const void *p) {
    uint4 v;
    if (HINT)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* One warp item per (expert, 16-row group); MATS matrices of 16 rows (gate/up: 2, down: 1),
 * matrix m's rows at base + m * mat_off. K elements a row, row stride K. */
template <int L, int STAGGER, int HINT, int MATS>
__global__ void pattern_kernel(const uint16_t *w, int64_t expert_elems, int64_t mat_off, int groups, int K, int items,
                               unsigned *sink) {
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp >= items) return;
    const int e = warp / groups, grp = warp % groups;
    const int row_in = lane / L, col = (lane % L) * 8; /* elements */
    constexpr int RPI = 32 / L, LOADS = 16 / RPI;  /* rows per instruction, instructions per matrix */
    const int step = L * 8, steps = K / step;
    const int start = STAGGER ? (grp * 7 + e * 3) % steps : 0;
    const uint16_t *base = w + (int64_t)e * expert_elems + (int64_t)grp * 16 * K;
    unsigned acc = 0;
#pragma unroll 2
    for (int s = 0; s < steps; s++) {
        int ks = s + start;
        if (ks >= steps) ks -= steps;
        const int k = ks * step + col;
        uint4 v[MATS][LOADS];
#pragma unroll
        for (int m = 0; m < MATS; m++)
#pragma unroll
            for (int i = 0; i < LOADS; i++) v[m][i] = ld16<HINT>(base + m * mat_off + (int64_t)(row_in + i * RPI) * K + k);
#pragma unroll
        for (int m = 0; m < MATS; m++)
#pragma unroll
            for (int i = 0; i < LOADS; i++) acc += v[m][i].x ^ v[m][i].y ^ v[m][i].z ^ v[m][i].w;
    }
    if (acc == 0x9E3779B9u) atomicAdd(sink, acc);
}

__global__ void floor_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc += (a.x ^ a.y ^ a.z ^ a.w) + (b.x ^ b.y ^ b.z ^ b.w) + (c.x ^ c.y ^ c.z ^ c.w) + (d.x ^ d.y ^ d.z ^ d.w);
    }
    for (; i < n; i += stride) acc += p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
    if (acc == 0x9E3779B9u) atomicAdd(sink, acc);
}

static char *g_flush;

template <typename F> static double timed(F launch) { return probe_median_ms(g_flush, 2, RUNS, launch); }

/* g_bps > 0: shared memory per block that lets only g_bps blocks onto an SM (the real kernels'
 * occupancy is set by their registers: 16 warps an SM) */
static int g_bps;
static size_t smem_for(const void *fn) {
    if (!g_bps) return 0;
    const size_t bytes = (200u << 10) / g_bps;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return bytes;
}

template <int L, int ST, int HI>
static void run_gu(const uint16_t *gu, int E, int wpb, unsigned *sink) {
    const int groups = I / 16, items = E * groups;
    const size_t sm = smem_for((const void *)pattern_kernel<L, ST, HI, 2>);
    const double ms = timed([&] {
        pattern_kernel<L, ST, HI, 2><<<(items + wpb - 1) / wpb, 32 * wpb, sm>>>(gu, 2LL * I * H, (int64_t)I * H, groups,
                                                                              H, items, sink);
    });
    printf("rows,gate_up,%d,%d,%d,%dx%d,%.4f,%.1f\n", L, ST, HI, wpb, g_bps, ms, 2.0 * E * I * H * 2 / ms / 1e6);
}

template <int L, int ST, int HI>
static void run_dn(const uint16_t *dn, int E, int wpb, unsigned *sink) {
    const int groups = H / 16, items = E * groups;
    const size_t sm = smem_for((const void *)pattern_kernel<L, ST, HI, 1>);
    const double ms = timed([&] {
        pattern_kernel<L, ST, HI, 1><<<(items + wpb - 1) / wpb, 32 * wpb, sm>>>(dn, (int64_t)H * I, 0, groups, I, items,
                                                                              sink);
    });
    printf("rows,down,%d,%d,%d,%dx%d,%.4f,%.1f\n", L, ST, HI, wpb, g_bps, ms, 1.0 * E * I * H * 2 / ms / 1e6);
}

int main(int argc, char **argv) {
    const int E = argc > 1 ? atoi(argv[1]) : 128;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint16_t *gu, *dn;
    unsigned *sink;
    const size_t gu_bytes = (size_t)E * 2 * I * H * 2, dn_bytes = (size_t)E * H * I * 2;
    CK(cudaMalloc(&gu, gu_bytes));
    CK(cudaMalloc(&dn, dn_bytes));
    CK(cudaMalloc(&g_flush, 256u << 20));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(gu, 1, gu_bytes));
    CK(cudaMemset(dn, 2, dn_bytes));
    printf("pattern,region,lanes,stagger,hint,occupancy,ms,GBps\n");
    {
        const double ms = timed([&] { floor_kernel<<<sms * 8, 256>>>((const uint4 *)gu, gu_bytes / 16, sink); });
        printf("floor,gate_up,0,0,0,8,%.4f,%.1f\n", ms, gu_bytes / ms / 1e6);
        const double md = timed([&] { floor_kernel<<<sms * 8, 256>>>((const uint4 *)dn, dn_bytes / 16, sink); });
        printf("floor,down,0,0,0,8,%.4f,%.1f\n", md, dn_bytes / md / 1e6);
    }
    const int configs[][2] = {{4, 0}, {8, 0}, {4, 4}, {8, 2}}; /* warps a block, blocks an SM (0: as many as fit) */
    for (const auto &c : configs) {
        const int wpb = c[0];
        g_bps = c[1];
        run_gu<4, 0, 1>(gu, E, wpb, sink);
        run_gu<4, 1, 1>(gu, E, wpb, sink);
        run_gu<4, 0, 0>(gu, E, wpb, sink);
        run_gu<8, 0, 1>(gu, E, wpb, sink);
        run_gu<8, 1, 1>(gu, E, wpb, sink);
        run_gu<32, 0, 0>(gu, E, wpb, sink);
        run_gu<32, 1, 0>(gu, E, wpb, sink);
        run_dn<4, 0, 1>(dn, E, wpb, sink);
        run_dn<4, 1, 1>(dn, E, wpb, sink);
        run_dn<8, 0, 1>(dn, E, wpb, sink);
        run_dn<8, 1, 1>(dn, E, wpb, sink);
        run_dn<32, 0, 0>(dn, E, wpb, sink);
        run_dn<32, 1, 0>(dn, E, wpb, sink);
    }
    return 0;
}
