/* tile_feed.cu — a diagnostic, not part of moex: how fast the wide grouped GEMM's stages reach
 * shared memory when the tiles' operands come from L2 as much as from DRAM (large token counts),
 * alone and with the tensor cores' time per stage stood in for by a wait, and whether clusters of
 * two blocks that copy a shared weight tile once and multicast it to both (TMA .multicast::cluster)
 * feed them faster (results: dev/notes/cuda-notes.md).
 *
 * The layer: E experts of N weight rows by K bytes (W [E*N, K], FP8 codes; bf16 moves the same
 * bytes a stage with half the K), each expert with R activation rows (A [E*R, K]). The GEMM's
 * wide tiles: 128 rows of A by 256 weight rows, row tiles fastest, then column tiles, then
 * experts; block b takes tiles b, b + grid, ... (one block an SM, as the GEMM). A stage is one
 * k-block of 128 bytes: A's 128 rows (16 KiB) and the tile's 256 weight rows (32 KiB, in four
 * boxes of 64 rows). Thread 0 issues the copies; thread 32 stands in for the consumers: it waits
 * for each stage, spins `delay` cycles (the wgmmas of the stage: 128 x 256 x 128 multiply-adds
 * take about 1024 cycles at FP8's peak rate, 2048 at bf16's) and frees it. Modes:
 *   solo    every block copies its own stages (the GEMM in moex today)
 *   pair    blocks 2c and 2c + 1 form a cluster and take tiles 2q and 2q + 1, two row tiles of
 *           one expert and column tile: each copies A's rows itself and two of the four weight
 *           boxes for both (multicast), so a stage asks L2 for 32 KiB instead of 48; each block's
 *           empty barrier counts both blocks' consumers (a stage is rewritten in both only when
 *           both have freed it), which arrive on their own and on the other's with release
 *           semantics at cluster scope
 *   pair-cta  the same, the remote arrival with the default semantics (release at CTA scope: a
 *           consumer's reads of the stage are complete before it arrives either way)
 *   solo-8x64  as solo, the same 192 KiB in eight stages of 64-byte k-blocks (24 KiB each, the
 *           stand-in's delay halved): a stage freed sooner, so more of the ring is in flight
 *   solo-3x128  as solo with three stages: the feed with a quarter fewer bytes in flight
 * Timed with events after a 256 MiB write that flushes L2; median of RUNS.
 *
 *   build: the CMake target tile_feed_probe (CUDA builds), or nvcc -O3 -arch=sm_90a tile_feed.cu
 *   run:   tile_feed_probe   (CSV on stdout; a few seconds on an H100 or H200)
 * Output: CSV shape,mode,delay,grid,ms,smem_TBps (bytes landed in shared memory, a multicast box
 * counted once for each block it lands in),l2_TBps (bytes asked of L2, a multicast box once),
 * fp8_tflops (the multiply-adds the stages feed, over the time) */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_common.h"

static const int RUNS = 5, TM = 128, TN = 256, KB = 128, BOX = 64, STAGES = 4;
static const int SMEM = STAGES * (TM + TN) * KB + 1024 + 2 * 8 * 8; /* the largest ring (8 barrier pairs) */

__device__ __forceinline__ uint32_t cta_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* tma_box into dst of both blocks of the cluster, completing on each one's barrier at bar */
__device__ __forceinline__ void copy_box_both(uint32_t dst, const CUtensorMap *map, uint32_t bar, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst), "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar),
                 "h"((uint16_t)3)
                 : "memory");
}

struct feed_args {
    int E, N, R, k_blocks, delay;
};

/* grid: one block an SM (MODE 1 pair, 2 pair-cta: an even number, clusters of two); 64 threads;
 * a ring of NST stages of KBT-byte k-blocks (f.k_blocks of them a tile) */
template <int MODE, int KBT = KB, int NST = STAGES>
__global__ void __launch_bounds__(64, 1)
    tile_feed(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, feed_args f) {
    constexpr bool PAIR = MODE > 0;
    constexpr int A_STAGE = TM * KBT, STAGE = (TM + TN) * KBT;
    extern __shared__ unsigned char raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    const uint32_t full = saddr(smem + NST * STAGE), empty = full + NST * 8;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(full + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(empty + 8 * s), "r"(PAIR ? 2 : 1));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (PAIR)
        cluster_sync_all();
    else
        __syncthreads();
    const int rank = PAIR ? (int)cta_rank() : 0;
    const int mt = f.R / TM, nt = f.N / TN;
    const int64_t tiles = (int64_t)f.E * mt * nt;
    if (threadIdx.x == 0) {
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int m = (int)(t % mt), n = (int)(t / mt % nt), e = (int)(t / mt / nt);
            /* PAIR: the partner's tile is t ^ 1, row tile m ^ 1 of the same expert and column tile
             * (mt even: tiles 2q and 2q + 1 never straddle a column tile) */
            const int a_row = e * f.R + m * TM, w_row = e * f.N + n * TN;
            for (int kb = 0; kb < f.k_blocks; kb++) {
                wait_parity(empty + 8 * stage, phase ^ 1);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full + 8 * stage),
                             "r"(STAGE)
                             : "memory");
                const uint32_t a = saddr(smem + stage * STAGE), w = a + A_STAGE, bar = full + 8 * stage;
                tma_box(a, &map_a, bar, kb * KBT, a_row);
                for (int q = 0; q < TN / BOX; q++) {
                    if (!PAIR)
                        tma_box(w + q * BOX * KBT, &map_w, bar, kb * KBT, w_row + q * BOX);
                    else if ((q & 1) == rank)
                        copy_box_both(w + q * BOX * KBT, &map_w, bar, kb * KBT, w_row + q * BOX);
                }
                if (++stage == NST) stage = 0, phase ^= 1;
            }
        }
    } else if (threadIdx.x == 32) {
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
            for (int kb = 0; kb < f.k_blocks; kb++) {
                wait_parity(full + 8 * stage, phase);
                const long long t0 = clock64();
                while (clock64() - t0 < f.delay) {
                }
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty + 8 * stage) : "memory");
                if (PAIR) {
                    uint32_t peer;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(empty + 8 * stage), "r"(rank ^ 1));
                    if (MODE == 1)
                        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(peer) : "memory");
                    else
                        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(peer) : "memory");
                }
                if (++stage == NST) stage = 0, phase ^= 1;
            }
    }
    /* PAIR: no block leaves while its partner may still copy into it or arrive on its barriers */
    __syncthreads();
    if (PAIR) cluster_sync_all();
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;

static void make_map(CUtensorMap *map, void *base, int64_t rows, int64_t K, int box_rows, int kbt) {
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K};
    cuuint32_t boxd[2] = {(cuuint32_t)kbt, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    if (encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, boxd, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               kbt == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "tensor map failed\n");
        exit(1);
    }
}

int main(void) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(tile_feed<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(tile_feed<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(tile_feed<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(tile_feed<0, 64, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(tile_feed<0, KB, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    /* deepseek-v3 at 16384 tokens (512 rows an expert), 64 of its 256 experts: gate/up and down */
    struct shape {
        const char *name;
        int E, N, K, R;
    } shapes[] = {{"deepseek-v3 gate/up", 64, 4096, 7168, 512}, {"deepseek-v3 down", 64, 7168, 2048, 512}};
    size_t most_w = 0, most_a = 0;
    for (const shape &s : shapes) {
        most_w = std::max(most_w, (size_t)s.E * s.N * s.K);
        most_a = std::max(most_a, (size_t)s.E * s.R * s.K);
    }
    void *w, *a, *flush;
    CK(cudaMalloc(&w, most_w));
    CK(cudaMalloc(&a, most_a));
    CK(cudaMalloc(&flush, 256u << 20));
    CK(cudaMemset(w, 1, most_w));
    CK(cudaMemset(a, 2, most_a));
    /* the clusters of two the device holds at once */
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(2), cfg.blockDim = dim3(64), cfg.dynamicSmemBytes = SMEM, cfg.attrs = &attr, cfg.numAttrs = 1;
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, tile_feed<1>, &cfg));
    fprintf(stderr, "tile_feed: %d SMs, %d clusters of two at once\n", sms, clusters);
    printf("shape,mode,delay,grid,ms,smem_TBps,l2_TBps,fp8_tflops\n");
    for (const shape &s : shapes) {
        CUtensorMap map_a, map_w, map_a64, map_w64;
        make_map(&map_a, a, (int64_t)s.E * s.R, s.K, TM, KB);
        make_map(&map_w, w, (int64_t)s.E * s.N, s.K, BOX, KB);
        make_map(&map_a64, a, (int64_t)s.E * s.R, s.K, TM, 64);
        make_map(&map_w64, w, (int64_t)s.E * s.N, s.K, BOX, 64);
        const feed_args base = {s.E, s.N, s.R, s.K / KB, 0};
        const double stages = (double)s.E * (s.R / TM) * (s.N / TN) * (s.K / KB);
        const int STAGE = (TM + TN) * KB, A_STAGE = TM * KB, B_STAGE = TN * KB; /* a 128-byte k-block */
        static const char *const NAMES[5] = {"solo", "pair", "pair-cta", "solo-8x64", "solo-3x128"};
        for (int delay : {0, 1024, 2048})
            for (int mode = 0; mode < 5; mode++) {
                const bool pair = mode == 1 || mode == 2;
                feed_args f = base;
                f.delay = delay;
                const int grid = pair ? 2 * std::min(sms / 2, clusters > 0 ? clusters : sms / 2) : sms;
                float ms;
                cfg.gridDim = dim3(grid);
                if (mode == 1)
                    ms = probe_median_ms(flush, 1, RUNS, [&] { CK(cudaLaunchKernelEx(&cfg, tile_feed<1>, map_a, map_w, f)); });
                else if (mode == 2)
                    ms = probe_median_ms(flush, 1, RUNS, [&] { CK(cudaLaunchKernelEx(&cfg, tile_feed<2>, map_a, map_w, f)); });
                else if (mode == 3) { /* k-blocks of 64 bytes: twice as many, each with half the delay */
                    f.k_blocks = base.k_blocks * 2, f.delay = delay / 2;
                    ms = probe_median_ms(flush, 1, RUNS, [&] { tile_feed<0, 64, 8><<<grid, 64, SMEM>>>(map_a64, map_w64, f); });
                } else if (mode == 4)
                    ms = probe_median_ms(flush, 1, RUNS, [&] { tile_feed<0, KB, 3><<<grid, 64, SMEM>>>(map_a, map_w, f); });
                else
                    ms = probe_median_ms(flush, 1, RUNS, [&] { tile_feed<0><<<grid, 64, SMEM>>>(map_a, map_w, f); });
                const double landed = stages * STAGE, asked = stages * (pair ? A_STAGE + B_STAGE / 2 : STAGE);
                const double macs = stages * TM * TN * KB;
                printf("%s,%s,%d,%d,%.4f,%.3f,%.3f,%.1f\n", s.name, NAMES[mode], delay, grid, ms,
                       landed / ms / 1e9, asked / ms / 1e9, 2 * macs / ms / 1e9);
            }
    }
    CK(cudaFree(w));
    CK(cudaFree(a));
    CK(cudaFree(flush));
    return 0;
}
