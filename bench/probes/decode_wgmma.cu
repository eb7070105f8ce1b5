/* decode_wgmma.cu — a diagnostic, not part of moex: whether FP8 expert weights, at decode sizes
 * (one to a few token rows an expert), stream through Hopper's FP8 tensor cores at the TMA read
 * rate when the roles of the GEMM's operands are swapped: the weights as wgmma's 64-row A
 * operand and the expert's few token rows as its B operand (N = 8 or 16). grouped_mm's
 * streamed forward runs these sizes on mma.sync, which ptxas lowers for e4m3 to an unpack of
 * every byte and f16 HMMAs, and reaches 0.66-0.73 of the read floor at qwen3-30b-a3b 8 / 64
 * tokens (results: dev/notes/cuda-notes.md).
 *
 * A region: HIT experts of N weight rows by K FP8 codes (W [HIT*N, K], 128 x 128 float block
 * scales ws), each with NT token rows (X [HIT*NT, K], float scales xs per row and 128 inputs).
 * A tile is 128 weight rows of one expert (expert-major, feature blocks fastest, so that
 * neighbouring blocks share the expert's token rows through L2); one block an SM takes tiles
 * b, b + grid, ... A stage is one k-block of 128 codes: the tile's 128 rows in two TMA boxes
 * of 64 (16 KiB) and the expert's NT rows (NT x 128 bytes), both with the 128-byte swizzle;
 * STAGES stages. Warpgroup 0's thread 0 issues the copies; warpgroups 1 and 2 multiply rows
 * 0-63 and 64-127 of the tile: per k-block four wgmma m64nNTk32 e4m3 into a fresh accumulator,
 * then acc += d * ws * xs[token], so that the sums are promoted once per 128-input block as
 * moex's FP8 GEMMs do. Each warp frees the stage once its wgmmas are done. The epilogue writes
 * Y [HIT*NT, N] (f32, token-major: the transpose of the accumulators). The same region in bf16
 * (rows of 2K bytes, a stage 64 inputs): wgmma m64nNTk16 accumulating across k-blocks, no
 * scales (is the bf16 decode stream, 0.86-0.95 of the read floor in the streamed forward, any
 * closer to the read through wgmma?). Modes:
 *   wgmma   as above
 *   feed    the consumers free each stage as it lands and multiply nothing (the feed alone)
 * and, per region and dtype, a sequential read of W's bytes (the ceiling the fractions are taken of).
 * Before the timings, one wgmma run of the first region with NT 8 and 16, FP8 and bf16, is checked
 * against a float64 product on the host (every output written; four experts' outputs within 1e-3
 * of the sum of their terms' magnitudes, else the probe exits 1). The random bytes have bit 6
 * clear: e4m3 codes below 2 and bf16 values below 2, none NaN. Timed with events after a 256 MiB write that
 * flushes L2; median of RUNS.
 *
 *   build: the CMake target decode_wgmma_probe (CUDA builds), or
 *          nvcc -O3 -gencode arch=compute_90a,code=sm_90a decode_wgmma.cu
 *   run:   decode_wgmma_probe   (CSV on stdout; a few seconds on an H100 or H200)
 * Output: CSV region,dtype,hit,N,K (inputs),nt,stages,mode,ms,GBps (W's bytes over the time),of_read
 * (over the sequential read's GB/s) */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "probe_common.h"

static const int RUNS = 7, KB = 128, TILE = 128, BOX = 64, MAX_NT = 16;
static const int A_BYTES = TILE * KB, STAGE_BYTES = A_BYTES + MAX_NT * KB; /* 1024-byte multiples */

struct probe_args {
    int64_t tiles, k_blocks, N; /* tiles = HIT * N / TILE; k-blocks of 128 bytes */
    int nt, stages, mode;       /* mode 0: wgmma FP8, 1: feed, 2: wgmma bf16 */
    const float *ws, *xs;       /* [HIT*N/128, k_blocks], [HIT*NT, k_blocks] */
    float *y;                   /* [HIT*NT, N] */
};

/* Matrix descriptor of a K-major tile with the 128-byte swizzle (rows of 128 bytes, 8-row groups
 * 1024 bytes apart) at shared address a. */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t a) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

/* d[64 x NT] (+)= A[64 x 32] . B[NT x 32]^T, e4m3, both K-major in shared memory. */
template <int NT> __device__ __forceinline__ void wgmma_nt(float (&d)[NT / 2], uint64_t da, uint64_t db, int acc);
template <> __device__ __forceinline__ void wgmma_nt<8>(float (&d)[4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_nt<16>(float (&d)[8], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(acc));
}
/* The same in bf16 (k16: 32 bytes a row, as e4m3's k32). */
template <int NT> __device__ __forceinline__ void wgmma_bf16(float (&d)[NT / 2], uint64_t da, uint64_t db, int acc);
template <> __device__ __forceinline__ void wgmma_bf16<8>(float (&d)[4], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_bf16<16>(float (&d)[8], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(acc));
}
template <int NT> __device__ __forceinline__ void fence_regs(float (&d)[NT / 2]) {
#pragma unroll
    for (int i = 0; i < NT / 2; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* The consumers of one warpgroup (wg 0 or 1: the tile's rows 64 wg .. 64 wg + 63). */
template <int NT>
__device__ __forceinline__ void consume(const probe_args &a, uint32_t smem, uint32_t full, uint32_t empty, int wg) {
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int64_t tiles_per_expert = a.N / TILE;
    int stage = 0, phase = 0;
    for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
        const int64_t e = t / tiles_per_expert, n0 = (t % tiles_per_expert) * TILE;
        /* d's element 4 j + i: row 16 warp + lane / 4 (+ 8 for i >= 2), token 8 j + 2 (lane % 4) + i % 2 */
        float acc[NT / 2], d[NT / 2];
#pragma unroll
        for (int i = 0; i < NT / 2; i++) acc[i] = d[i] = 0.0f;
        const float *ws_row = a.ws + ((e * a.N + n0) / 128) * a.k_blocks;
        for (int64_t kb = 0; kb < a.k_blocks; kb++) {
            float sc[NT / 4]; /* the k-block's scale of each of the thread's tokens (asked for before the wait) */
            if (a.mode == 2) { /* bf16: into acc across the k-blocks, no scales */
                wait_parity(full + 8 * stage, phase);
                const uint32_t sa = smem + stage * STAGE_BYTES + wg * 64 * KB, sb = smem + stage * STAGE_BYTES + A_BYTES;
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_bf16<NT>(acc, desc_sw128(sa + 32 * kk), desc_sw128(sb + 32 * kk), kb > 0 || kk > 0);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                fence_regs<NT>(acc);
                __syncwarp();
                if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty + 8 * stage) : "memory");
                if (++stage == a.stages) stage = 0, phase ^= 1;
                continue;
            }
            if (a.mode == 0) {
                const float w = __ldg(ws_row + kb);
#pragma unroll
                for (int i = 0; i < NT / 4; i++)
                    sc[i] = w * __ldg(a.xs + (e * a.nt + 8 * (i / 2) + 2 * (lane % 4) + i % 2) * a.k_blocks + kb);
            }
            wait_parity(full + 8 * stage, phase);
            if (a.mode == 0) {
                const uint32_t sa = smem + stage * STAGE_BYTES + wg * 64 * KB, sb = smem + stage * STAGE_BYTES + A_BYTES;
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_nt<NT>(d, desc_sw128(sa + 32 * kk), desc_sw128(sb + 32 * kk), kk);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
                fence_regs<NT>(d);
            }
            __syncwarp();
            if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty + 8 * stage) : "memory");
            if (a.mode == 0)
#pragma unroll
                for (int j = 0; j < NT / 8; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        acc[4 * j + c] += d[4 * j + c] * sc[2 * j + c];
                        acc[4 * j + 2 + c] += d[4 * j + 2 + c] * sc[2 * j + c];
                    }
            if (++stage == a.stages) stage = 0, phase ^= 1;
        }
        if (a.mode != 1) {
            const int64_t row = n0 + wg * 64 + 16 * warp + lane / 4;
#pragma unroll
            for (int j = 0; j < NT / 8; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int64_t tok = e * a.nt + 8 * j + 2 * (lane % 4) + c;
                    a.y[tok * a.N + row] = acc[4 * j + c];
                    a.y[tok * a.N + row + 8] = acc[4 * j + 2 + c];
                }
        }
    }
}

/* smem: stages x STAGE_BYTES (1024-aligned), then 2 x stages barriers (full: 1 arrival and the
 * bytes; empty: the 8 consumer warps) */
template <int NT>
__global__ void __launch_bounds__(384, 1) decode_wgmma(const __grid_constant__ CUtensorMap map_w,
                                                       const __grid_constant__ CUtensorMap map_x, probe_args a) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t smem = (saddr(smem_raw) + 1023) & ~1023u;
    const uint32_t full = smem + a.stages * STAGE_BYTES, empty = full + 8 * a.stages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < a.stages; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(full + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;" ::"r"(empty + 8 * s));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        if (threadIdx.x != 0) return;
        const int64_t tiles_per_expert = a.N / TILE;
        int stage = 0, phase = 0;
        for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
            const int64_t e = t / tiles_per_expert, row0 = e * a.N + (t % tiles_per_expert) * TILE;
            for (int64_t kb = 0; kb < a.k_blocks; kb++) {
                wait_parity(empty + 8 * stage, phase ^ 1);
                const uint32_t bar = full + 8 * stage, dst = smem + stage * STAGE_BYTES;
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                             "r"(A_BYTES + NT * KB)
                             : "memory");
                for (int q = 0; q < TILE / BOX; q++) tma_box(dst + q * BOX * KB, &map_w, bar, (int)(kb * KB), (int)(row0 + q * BOX));
                tma_box(dst + A_BYTES, &map_x, bar, (int)(kb * KB), (int)(e * NT));
                if (++stage == a.stages) stage = 0, phase ^= 1;
            }
        }
        return;
    }
    consume<NT>(a, smem, full, empty, wg - 1);
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;

static CUtensorMap fp8_map(void *base, int64_t rows, int64_t K, int box_rows) {
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K};
    cuuint32_t boxd[2] = {KB, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, boxd, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "tensor map failed (rows %lld, K %lld)\n", (long long)rows, (long long)K);
        exit(1);
    }
    return map;
}

/* e4m3 code -> value (codes with bit 6 clear only: no NaN, magnitudes below 2). */
static double e4m3_decode(uint8_t c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

/* The bf16 value of the two bytes at b (little-endian). */
static double bf16_host(const uint8_t *b) {
    const uint32_t bits = ((uint32_t)b[0] | (uint32_t)b[1] << 8) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

struct region {
    const char *name;
    int64_t hit, N, K;
};

static int smem_bytes(int stages) { return stages * STAGE_BYTES + 2 * 8 * stages + 1024; }

static void launch(int nt, int stages, int mode, const CUtensorMap &mw, const CUtensorMap &mx, probe_args a,
                   int sms) {
    a.nt = nt, a.stages = stages, a.mode = mode;
    if (nt == 8)
        decode_wgmma<8><<<sms, 384, smem_bytes(stages)>>>(mw, mx, a);
    else
        decode_wgmma<16><<<sms, 384, smem_bytes(stages)>>>(mw, mx, a);
}

int main(void) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int MAX_STAGES = 10;
    CK(cudaFuncSetAttribute(decode_wgmma<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(MAX_STAGES)));
    CK(cudaFuncSetAttribute(decode_wgmma<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(MAX_STAGES)));
    /* qwen3-30b-a3b at 8 tokens hits about 60 of its 128 experts; deepseek-v3 64 of its 256 here
     * (the memory a probe may take), its decode hits more */
    const region regions[] = {{"qwen3-30b-a3b gate/up", 60, 1536, 2048},
                              {"qwen3-30b-a3b down", 60, 2048, 768},
                              {"deepseek-v3 gate/up (64 experts)", 64, 4096, 7168},
                              {"deepseek-v3 down (64 experts)", 64, 7168, 2048}};
    size_t most_w = 0, most_x = 0, most_ws = 0, most_xs = 0, most_y = 0;
    for (const region &g : regions) {
        most_w = std::max(most_w, (size_t)(g.hit * g.N * g.K * 2)); /* bf16's bytes */
        most_x = std::max(most_x, (size_t)(g.hit * MAX_NT * g.K * 2));
        most_ws = std::max(most_ws, (size_t)(g.hit * g.N / 128 * (g.K / KB)));
        most_xs = std::max(most_xs, (size_t)(g.hit * MAX_NT * (g.K / KB)));
        most_y = std::max(most_y, (size_t)(g.hit * MAX_NT * g.N));
    }
    /* random codes with bit 6 clear; scales in [0.5, 1.5) */
    std::vector<uint8_t> hw(most_w), hx(most_x);
    std::vector<float> hws(most_ws), hxs(most_xs);
    uint64_t st = 0x9E3779B97F4A7C15ull;
    auto rnd = [&] { st ^= st << 13, st ^= st >> 7, st ^= st << 17; return st; };
    for (auto &b : hw) b = (uint8_t)(rnd() & 0xBF);
    for (auto &b : hx) b = (uint8_t)(rnd() & 0xBF);
    for (auto &s : hws) s = 0.5f + (float)(rnd() % 1000) / 1000.0f;
    for (auto &s : hxs) s = 0.5f + (float)(rnd() % 1000) / 1000.0f;
    uint8_t *w, *x;
    float *ws, *xs, *y;
    void *flush;
    CK(cudaMalloc(&w, most_w));
    CK(cudaMalloc(&x, most_x));
    CK(cudaMalloc(&ws, most_ws * 4));
    CK(cudaMalloc(&xs, most_xs * 4));
    CK(cudaMalloc(&y, most_y * 4));
    CK(cudaMalloc(&flush, 256u << 20));
    CK(cudaMemcpy(w, hw.data(), most_w, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), most_x, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ws, hws.data(), most_ws * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xs, hxs.data(), most_xs * 4, cudaMemcpyHostToDevice));

    /* the check: region 0, both NT: every output written (y starts as NaN), and four experts'
     * outputs against float64 (the accumulation's error is bounded by the promotion per 128
     * inputs; a wrong layout or descriptor is off by the order of the terms themselves) */
    double e4m3_host[256];
    for (int c = 0; c < 256; c++) e4m3_host[c] = (c & 0x40) ? 0.0 : e4m3_decode((uint8_t)c);
    for (int mode : {0, 2})
    for (int nt : {8, 16}) {
        const region &g = regions[0];
        const bool bf = mode == 2;
        const int64_t kbytes = g.K * (bf ? 2 : 1), kbs = kbytes / KB;
        const CUtensorMap mw = fp8_map(w, g.hit * g.N, kbytes, BOX), mx = fp8_map(x, g.hit * nt, kbytes, nt);
        probe_args a = {g.hit * g.N / TILE, kbs, g.N, nt, 6, mode, ws, xs, y};
        CK(cudaMemset(y, 0xff, (size_t)g.hit * nt * g.N * 4));
        launch(nt, 6, mode, mw, mx, a, sms);
        CK(cudaDeviceSynchronize());
        std::vector<float> hy((size_t)g.hit * nt * g.N);
        CK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
        int64_t bad = 0, unwritten = 0;
        double worst = 0;
        for (float v : hy) unwritten += v != v;
        const int64_t experts[4] = {0, 1, g.hit / 2, g.hit - 1};
        for (int64_t e : experts)
            for (int64_t r = 0; r < nt; r++)
                for (int64_t n = 0; n < g.N; n++) {
                    double sum = 0, mag = 0;
                    const int64_t wr = e * g.N + n, xr = e * nt + r;
                    if (bf) {
                        for (int64_t k = 0; k < g.K; k++) {
                            const double p = bf16_host(&hw[wr * kbytes + 2 * k]) * bf16_host(&hx[xr * kbytes + 2 * k]);
                            sum += p, mag += fabs(p);
                        }
                    } else {
                        for (int64_t kb = 0; kb < kbs; kb++) {
                            double part = 0, pm = 0;
                            for (int64_t k = kb * KB; k < (kb + 1) * KB; k++) {
                                const double p = e4m3_host[hw[wr * g.K + k]] * e4m3_host[hx[xr * g.K + k]];
                                part += p, pm += fabs(p);
                            }
                            const double s = (double)hws[(wr / 128) * kbs + kb] * hxs[xr * kbs + kb];
                            sum += part * s, mag += pm * s;
                        }
                    }
                    const double err = fabs(hy[xr * g.N + n] - sum);
                    worst = std::max(worst, err / (mag + 1e-30));
                    if (!(err <= 1e-3 * mag + 1e-6)) bad++;
                }
        fprintf(stderr, "check %s %s nt %d: %lld of %lld outputs not written; of 4 experts' %lld, %lld off, worst error %.3g of the terms' magnitude\n",
                g.name, bf ? "bf16" : "fp8", nt, (long long)unwritten, (long long)hy.size(), (long long)(4 * nt * g.N), (long long)bad, worst);
        if (bad || unwritten) return 1;
    }

    printf("region,dtype,hit,N,K,nt,stages,mode,ms,GBps,of_read\n");
    for (const region &g : regions)
        for (int bf = 0; bf < 2; bf++) {
            const int64_t kbytes = g.K * (bf ? 2 : 1);
            const double bytes = (double)g.hit * g.N * kbytes;
            const char *dt = bf ? "bf16" : "fp8";
            const float seq = probe_median_ms(flush, 1, RUNS, [&] { seq_read<<<sms * 8, 256>>>((const uint4 *)w, (size_t)(bytes / 16)); });
            const double seq_gbps = bytes / seq / 1e6;
            printf("%s,%s,%lld,%lld,%lld,0,0,sequential,%.4f,%.1f,1.000\n", g.name, dt, (long long)g.hit, (long long)g.N,
                   (long long)g.K, seq, seq_gbps);
            const CUtensorMap mw = fp8_map(w, g.hit * g.N, kbytes, BOX);
            for (int nt : {8, 16}) {
                const CUtensorMap mx = fp8_map(x, g.hit * nt, kbytes, nt);
                for (int stages : {4, 6})
                    for (int mode : {0, 1}) {
                        const int m = mode == 1 ? 1 : bf ? 2 : 0;
                        probe_args a = {g.hit * g.N / TILE, kbytes / KB, g.N, nt, stages, m, ws, xs, y};
                        const float ms = probe_median_ms(flush, 1, RUNS, [&] { launch(nt, stages, m, mw, mx, a, sms); });
                        const double gbps = bytes / ms / 1e6;
                        printf("%s,%s,%lld,%lld,%lld,%d,%d,%s,%.4f,%.1f,%.3f\n", g.name, dt, (long long)g.hit, (long long)g.N,
                               (long long)g.K, nt, stages, m == 1 ? "feed" : "wgmma", ms, gbps, gbps / seq_gbps);
                    }
            }
        }
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(ws));
    CK(cudaFree(xs));
    CK(cudaFree(y));
    CK(cudaFree(flush));
    return 0;
}
