/* tma_read.cu — a diagnostic, not part of moex: how fast the grouped GEMM's weight load
 * (gemm_sm90_kernel.cuh: one block an SM, each work item a tile of weight rows streamed along k
 * by TMA into a ring of stages) reads expert weights when nothing else runs, against a plain
 * sequential read of the same bytes (results: dev/notes/cuda-notes.md).
 *
 * A region is R weight rows of K bf16 inputs (qwen3-30b-a3b's and deepseek-v3's gate/up and
 * down matrices, all experts back to back). Item t is rows t*N .. +N, read as k-blocks of 64
 * inputs (128 bytes a row), each k-block in N/BOX boxes of BOX rows, one stage a k-block.
 * Thread 0 issues the copies, thread 32 waits for each stage and frees it. Variants:
 *   stages S     the ring's depth (stages of N x 128 bytes)
 *   pair P       the producer waits until P stages are free and issues P k-blocks of the same
 *                rows together, box by box (so that a row's P x 128 bytes are asked for at
 *                about the same time)
 *   prefetch D   the producer also asks L2 for k-block kb + D of the item (TMA prefetch)
 *   cp.async C   no TMA: C threads (128 or 256) copy each stage with cp.async.cg in 16-byte
 *                pieces to the addresses the 128-byte swizzle gives (thread i piece i % 8 of
 *                rows i / 8, i / 8 + C / 8, ...: 8 threads a row's 128 bytes, as the GEMM's
 *                gathered A-load), each arriving on the stage's barrier when its copies land
 *                (cp.async.mbarrier.arrive.noinc); the consumer is the warp after them
 * Every variant reads every byte once. Timed with events after a 256 MiB write that flushes
 * L2; median of RUNS.
 *
 *   build: the CMake target tma_read_probe (CUDA builds), or nvcc -O3 -arch=sm_90a tma_read.cu
 *   run:   tma_read_probe   (CSV on stdout; a few seconds on an H200)
 * Output: CSV region,rows,K,tile_rows,box_rows,stages,pair,prefetch,loader,ms,GBps (loader: tma, or
 * cp.async-C; box_rows, pair and prefetch 0 for cp.async) */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "probe_common.h"

static const int RUNS = 7, KB = 64, MAX_SMEM = 200 * 1024;

struct probe_args {
    int64_t items, k_blocks;
    int tile_rows, box_rows, stages, pair, prefetch;
};

/* smem: stages x tile_rows x 128 bytes, then 2 x stages barriers (full, empty) */
__global__ void __launch_bounds__(64, 1) tma_read(const __grid_constant__ CUtensorMap map, probe_args a) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int stage_bytes = a.tile_rows * 128;
    uint64_t *full = (uint64_t *)(smem + a.stages * stage_bytes), *empty = full + a.stages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < a.stages; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[s])));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* producer */
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < a.items; t += gridDim.x) {
            const int row0 = (int)(t * a.tile_rows);
            for (int64_t kb = 0; kb < a.k_blocks; kb += a.pair) {
                const int n = (int)(a.k_blocks - kb < a.pair ? a.k_blocks - kb : a.pair);
                int s = stage, ph = phase;
                for (int j = 0; j < n; j++) {
                    wait_parity(saddr(&empty[s]), ph ^ 1);
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[s])),
                                 "r"(stage_bytes)
                                 : "memory");
                    if (++s == a.stages) s = 0, ph ^= 1;
                }
                for (int q = 0; q < a.tile_rows / a.box_rows; q++) {
                    s = stage;
                    for (int j = 0; j < n; j++) {
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                                     " [%0], [%1, {%2, %3}], [%4];" ::"r"(saddr(smem + s * stage_bytes + q * a.box_rows * 128)),
                                     "l"((uint64_t)&map), "r"((int)(kb + j) * KB), "r"(row0 + q * a.box_rows),
                                     "r"(saddr(&full[s]))
                                     : "memory");
                        if (++s == a.stages) s = 0;
                    }
                }
                if (a.prefetch)
                    for (int j = 0; j < n; j++)
                        if (kb + j + a.prefetch < a.k_blocks)
                            for (int q = 0; q < a.tile_rows / a.box_rows; q++)
                                asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];"
                                             ::"l"((uint64_t)&map), "r"((int)(kb + j + a.prefetch) * KB),
                                             "r"(row0 + q * a.box_rows)
                                             : "memory");
                for (int j = 0; j < n; j++)
                    if (++stage == a.stages) stage = 0, phase ^= 1;
            }
        }
    } else if (threadIdx.x == 32) { /* consumer: every stage in order, freed as soon as it lands */
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < a.items; t += gridDim.x)
            for (int64_t kb = 0; kb < a.k_blocks; kb++) {
                wait_parity(saddr(&full[stage]), phase);
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[stage])) : "memory");
                if (++stage == a.stages) stage = 0, phase ^= 1;
            }
    }
}

/* The cp.async loader: threads 0 .. C-1 copy (C = blockDim.x - 32), thread C frees the stages.
 * smem: stages x tile_rows x 128 bytes, then 2 x stages barriers (full: C arrivals; empty: 1) */
__global__ void __launch_bounds__(288, 1) cpasync_read(const unsigned char *w, int64_t K_bytes, probe_args a) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int stage_bytes = a.tile_rows * 128, C = blockDim.x - 32, tid = threadIdx.x;
    const uint32_t full = saddr(smem + a.stages * stage_bytes), empty = full + a.stages * 8;
    if (tid == 0) {
        for (int s = 0; s < a.stages; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(full + 8 * s), "r"(C));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(empty + 8 * s));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid < C) {
        const int piece = tid % 8;
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < a.items; t += gridDim.x) {
            const unsigned char *rows = w + t * a.tile_rows * K_bytes;
            for (int64_t kb = 0; kb < a.k_blocks; kb++) {
                wait_parity(empty + 8 * stage, phase ^ 1);
                const uint32_t dst = saddr(smem + stage * stage_bytes);
                for (int r = tid / 8; r < a.tile_rows; r += C / 8)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + r * 128 + ((piece ^ (r % 8)) * 16)),
                                 "l"(rows + r * K_bytes + kb * 128 + piece * 16)
                                 : "memory");
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(full + 8 * stage) : "memory");
                if (++stage == a.stages) stage = 0, phase ^= 1;
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
    } else if (tid == C) {
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < a.items; t += gridDim.x)
            for (int64_t kb = 0; kb < a.k_blocks; kb++) {
                wait_parity(full + 8 * stage, phase);
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty + 8 * stage) : "memory");
                if (++stage == a.stages) stage = 0, phase ^= 1;
            }
    }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;

int main(void) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(tma_read, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_SMEM));
    CK(cudaFuncSetAttribute(cpasync_read, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_SMEM));
    struct region {
        const char *name;
        int64_t rows, K;
    } regions[] = {{"qwen3-30b-a3b gate/up", 128 * 1536, 2048}, {"qwen3-30b-a3b down", 128 * 2048, 768},
                   {"deepseek-v3 gate/up (64 experts)", 64 * 4096, 7168},
                   {"deepseek-v3 down (64 experts)", 64 * 7168, 2048}};
    size_t most = 0;
    for (const region &g : regions) most = std::max(most, (size_t)(g.rows * g.K * 2));
    void *w, *flush;
    CK(cudaMalloc(&w, most));
    CK(cudaMalloc(&flush, 256u << 20));
    CK(cudaMemset(w, 1, most));
    printf("region,rows,K,tile_rows,box_rows,stages,pair,prefetch,loader,ms,GBps\n");
    for (const region &g : regions) {
        const double bytes = (double)g.rows * g.K * 2;
        const float seq = probe_median_ms(flush, 1, RUNS, [&] { seq_read<<<sms * 8, 256>>>((const uint4 *)w, (size_t)(bytes / 16)); });
        printf("%s,%lld,%lld,0,0,0,0,0,sequential,%.4f,%.1f\n", g.name, (long long)g.rows, (long long)g.K, seq, bytes / seq / 1e6);
        const int shapes[][2] = {{256, 64}, {256, 256}, {128, 64}}; /* tile rows, box rows */
        for (const auto &sh : shapes)
            for (int stages : {4, 6})
                for (int pair : {1, 2, 3})
                    for (int prefetch : {0, 4}) {
                        const int N = sh[0], box = sh[1];
                        if (stages * N * 128 + 2 * stages * 8 > MAX_SMEM) continue;
                        CUtensorMap map;
                        cuuint64_t dims[2] = {(cuuint64_t)g.K, (cuuint64_t)g.rows}, strides[1] = {(cuuint64_t)g.K * 2};
                        cuuint32_t boxd[2] = {KB, (cuuint32_t)box}, elem[2] = {1, 1};
                        if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, boxd, elem,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
                            fprintf(stderr, "tensor map failed\n");
                            return 1;
                        }
                        probe_args a = {g.rows / N, g.K / KB, N, box, stages, pair, prefetch};
                        /* at least 120 KiB of shared memory, so that one block runs an SM, as the GEMM's */
                        const int smem = std::max(stages * N * 128 + 2 * stages * 8, 120 * 1024);
                        const float ms = probe_median_ms(flush, 1, RUNS, [&] { tma_read<<<sms, 64, smem>>>(map, a); });
                        printf("%s,%lld,%lld,%d,%d,%d,%d,%d,tma,%.4f,%.1f\n", g.name, (long long)g.rows, (long long)g.K,
                               N, box, stages, pair, prefetch, ms, bytes / ms / 1e6);
                    }
        for (int N : {256, 128})
            for (int stages : {4, 6})
                for (int C : {128, 256}) {
                    if (stages * N * 128 + 2 * stages * 8 > MAX_SMEM) continue;
                    probe_args a = {g.rows / N, g.K / KB, N, 0, stages, 1, 0};
                    const int smem = std::max(stages * N * 128 + 2 * stages * 8, 120 * 1024);
                    const float ms = probe_median_ms(flush, 1, RUNS, [&] {
                        cpasync_read<<<sms, C + 32, smem>>>((const unsigned char *)w, g.K * 2, a);
                    });
                    printf("%s,%lld,%lld,%d,0,%d,0,0,cp.async-%d,%.4f,%.1f\n", g.name, (long long)g.rows, (long long)g.K,
                           N, stages, C, ms, bytes / ms / 1e6);
                }
    }
    CK(cudaFree(w));
    CK(cudaFree(flush));
    return 0;
}
