/* gemm_sm90_kernel.cuh — the device side of the Hopper grouped GEMM (see gemm_sm90.cu for
 * the design): constants, PTX wrappers, the tile list, the producer, the float and FP8
 * consumers with their epilogues, and the kernel. Included by gemm_sm90.cu, which instantiates
 * the kernels and launches them; written so that it also compiles on its own, under NVRTC, for
 * kernels specialised at run time (no host code, no header beyond the device's). */
#ifndef MOEX_GEMM_SM90_KERNEL_CUH
#define MOEX_GEMM_SM90_KERNEL_CUH

#include "backends/cuda/gemm_sm90.cuh"
#ifndef __CUDACC_RTC__
#include <cuda.h>
#else
/* the driver's tensor map (cuda.h): 128 opaque bytes, 64-byte aligned */
typedef struct CUtensorMap_st {
    alignas(64) unsigned long long opaque[16];
} CUtensorMap;
#endif

namespace {

constexpr int BM = GEMM_TILE_ROWS, NARROW_ROWS = GEMM_NARROW_ROWS, BN = 256, BK = 64, STAGES = 4, CONSUMERS = 2;
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
/* the epilogue's staging area, after the stages' barriers: 16 rows x 64 columns (rows padded
 * to 72 elements: conflict-free) for each of the 8 consumer warps */
constexpr int SROW = 72, EPI_OFFSET = STAGES * STAGE_BYTES + 128;
constexpr int EPI_BYTES = 8 * 16 * SROW * 2;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + 128 + EPI_BYTES;
/* the gathered A-load's source rows of the producer's current and previous tile (2 x BM ints),
 * after the staging area, then the block's next tile (one int, padded to 16 bytes) */
constexpr int GATHER_OFFSET = EPI_OFFSET + EPI_BYTES, GATHER_SMEM_BYTES = SMEM_BYTES + 2 * BM * 4 + 16;
static_assert(2 * STAGES * 8 <= 128, "barriers");
/* setmaxnreg: 128 producer + 256 consumer threads share the pool of a block compiled for
 * 168 registers; asking for more than the pool makes setmaxnreg.inc wait forever. The consumers
 * take 232 (their two 64-float accumulators), the producer the rest. */
constexpr int CONSUMER_REGS = 232, PRODUCER_REGS = (384 * 168 - 256 * CONSUMER_REGS) / 128 / 8 * 8;
static_assert(CONSUMER_REGS % 8 == 0 && CONSUMER_REGS >= 168 && CONSUMER_REGS <= 240, "consumer registers");
static_assert(PRODUCER_REGS >= 24 && 128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * 168, "register pool");

struct gemm_params {
    int64_t K, N, rows_per_expert, up_offset, n_tiles, e_begin, e_end;
    /* expert e's rows of A and C: offsets[e] .. ends[e] */
    const int *offsets, *ends, *mtile_off;
    void *c;
    gemm_epilogue epi;
    layer_view L;
    /* FP8: A's row scales [rows, a_sld] (one per bk inputs; a k-block of 128 inputs reads scale
     * kb / kstep, kstep = bk / 128) and the weights' block scales */
    const float *a_scale;
    int64_t a_sld;
    int kstep;
    quant_view Q;
    /* the gathered A-load (GATHER kernels): row r of a tile is row a_index[r] of gather, of
     * stride gather_ld elements */
    const void *gather;
    int64_t gather_ld;
    const int *a_index;
    /* NULL, or the down epilogue's factor of each row (the routing weight of its pair) */
    const float *row_scale;
    /* NULL, or the FP8 narrow gate/up epilogue's h quantized (epilogue_fp8_h_quant): codes
     * [rows, N] and scales [rows, cs_ld] */
    uint8_t *cq;
    float *cs;
    int64_t cs_ld;
    /* chained kernels (grouped_gemm_args): the tile counter, the per-expert counters this GEMM adds
     * to, and those it waits for before loading an expert's rows of A */
    int *tickets, *done;
    const int *wait_done;
    int wait_per_mtile;
    /* the chained GEMMs launched after the pair kernel (grouped_gemm_run_pair): 0, or this kernel
     * does nothing when the row tiles are at most this many (the pair kernel took them) */
    int skip_tiles_at_most;
    /* the pair kernel: the most row tiles it takes (its launch's waves of blocks); with more it does
     * nothing and the chained GEMMs after it run */
    int pair_tiles_max;
};

/* FP8 tiles take BN weight rows as the float ones do (gate/up: 128 features, their gate and up
 * rows), in k-blocks of 128 inputs (one scale block) */
constexpr int FP8_BK = 128;
template <typename T> __host__ __device__ constexpr bool is_fp8() { return sizeof(T) == 1; }
template <typename T> __host__ __device__ constexpr int k_block() { return is_fp8<T>() ? FP8_BK : BK; }

/* The ring of a format. FP8 stages hold the float ones' 48 KiB (wide: A 128 x 128 bytes and
 * B 256 x 128; narrow: A 64 x 128 and B 256 x 128), but the FP8 kernels stage no epilogue; their
 * scales come from a slot a stage (below), not through L1. */
constexpr int FP8_STAGES = 4;
/* FP8: each stage's scales, after the barriers: the tile's 128 row scales of the k-block, then
 * the block scales of its chunks of 64 weight rows (f32; 4 a tile), padded
 * to 16 bytes */
constexpr int FP8_SCALES = 132;
/* FP8 narrow tiles: after the scale slots, the rows' amax of h that the two consumer warpgroups
 * exchange (epilogue_fp8_h_quant): 2 tiles (by parity) x 2 warpgroups x 64 rows, f32 */
constexpr int FP8_AMAX_BYTES = 2 * 2 * 64 * 4;
/* FP8 narrow tiles: after the amax exchange, the ring through which the producer thread hands the
 * scale warp the index of each tile it takes (produce_scales; -1 after the block's last): TILE_RING
 * mbarriers of one arrival, then TILE_RING ints */
constexpr int TILE_RING = 8, TILE_RING_BYTES = TILE_RING * (8 + 4);
template <typename T, bool NARROW = false> struct ring {
    static constexpr int stages = is_fp8<T>() ? FP8_STAGES : STAGES;
    static constexpr int stage_bytes = STAGE_BYTES;
    static constexpr int smem_bytes = is_fp8<T>() ? stages * stage_bytes + 1024 + 128 + stages * FP8_SCALES * 4 +
                                                        (NARROW ? FP8_AMAX_BYTES + TILE_RING_BYTES : 0)
                                                  : SMEM_BYTES;
};
/* The FP8 tile ring's first barrier (its ints follow the TILE_RING barriers), from the stages' full
 * barriers' shared address: past their 128 bytes, the scale slots and the amax exchange. */
__host__ __device__ constexpr uint32_t fp8_tile_ring(uint32_t full, int stages) {
    return full + 128 + stages * FP8_SCALES * 4 + FP8_AMAX_BYTES;
}
static_assert(2 * ring<uint8_t>::stages * 8 <= 128, "FP8 barriers");

/* ---- PTX wrappers ------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init_at(uint32_t addr, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr), "r"(count));
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) { mbar_init_at(smem_addr(bar), count); }

__device__ __forceinline__ void mbar_expect_tx_at(uint32_t addr, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(addr), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) { mbar_expect_tx_at(smem_addr(bar), bytes); }

/* Wait for the phase of parity of the barrier at shared address addr / arrive on it (the FP8
 * k-loop computes the addresses once; the float kernels take the barrier's pointer). */
__device__ __forceinline__ void mbar_wait_at(uint32_t addr, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
}
__device__ __forceinline__ void mbar_arrive_at(uint32_t addr) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) { mbar_arrive_at(smem_addr(bar)); }
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) { mbar_wait_at(smem_addr(bar), parity); }
__device__ __forceinline__ float lds_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void sts_f32(uint32_t addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

/* Copy the box at (col, row) of map into shared address dst; completes on the barrier at bar. */
__device__ __forceinline__ void tma_load_at(uint32_t dst, const CUtensorMap *map, uint32_t bar, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((uint64_t)map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, uint64_t *bar, int col, int row) {
    tma_load_at(smem_addr(dst), map, smem_addr(bar), col, row);
}

/* ---- clusters of two blocks (FP8 wide tiles: grouped_gemm_fp8_cluster_pays) ----------------
 *
 * The blocks 2c and 2c + 1 of the grid form cluster c (rank = blockIdx.x % 2), so the persistent
 * schedule (tiles b, b + grid, ...) gives them tiles 2q and 2q + 1 at every step: with row tiles
 * fastest in the list, mostly two row tiles of the same expert and column tile, which multiply
 * the same weight tile. Those pairs read it from L2 once: each block copies half of its boxes
 * and multicasts them into both blocks' stages. A pair
 * of column tiles of an expert of one row tile shares A's rows the same way (boxes of 64 rows);
 * other pairs copy their own, as without a cluster. So that a stage
 * is written only when both blocks have freed it, each block's empty barrier counts the
 * consumers of both, which arrive on their own and on the other block's. When the tile count is
 * odd, the last pair's second block multiplies its partner's tile again without storing it
 * (rows 0: a shadow), so that both blocks take part in every stage. */
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* Every thread of both blocks that has not exited: its earlier writes (the barriers' init, its
 * last remote arrivals) seen by the other block after the barrier. */
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* Arrive on the barrier at shared address addr of this block and (CLUSTER) on the other's. */
template <bool CLUSTER> __device__ __forceinline__ void release_at(uint32_t addr) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
    if constexpr (CLUSTER) {
        uint32_t peer;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(addr), "r"(cluster_rank() ^ 1u));
        /* released at CTA scope, as a cluster pipeline's consumers do: at cluster scope the arrival
         * compiled to a GPU-wide memory barrier (MEMBAR.ALL.GPU) that waited for the epilogue's
         * global stores, and the stage's reads are complete (their wgmmas waited) either way */
        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(peer) : "memory");
    }
}
/* The box at (col, row) of map into dst of both blocks of the cluster; completes on the barrier at
 * bar's offset in each. */
__device__ __forceinline__ void tma_load_both(void *dst, const CUtensorMap *map, uint64_t *bar, int col, int row) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 ::"r"(smem_addr(dst)), "l"((uint64_t)map), "r"(col), "r"(row), "r"(smem_addr(bar)), "h"((uint16_t)3)
                 : "memory");
}

/* 16 bytes from global src to shared dst, of which the first src_bytes (0 or 16) are read and
 * the rest zero-filled (the rows past a tile's last and the columns past K). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* Arrive on the barrier once the thread's earlier cp.async copies have landed (counted in the
 * barrier's expected arrivals: .noinc). */
__device__ __forceinline__ void cp_async_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
/* cp.async writes shared memory through the generic proxy, wgmma reads it through the async
 * proxy: a thread that has seen the writes land orders the two before its wgmmas. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* Matrix descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart. */
__device__ __forceinline__ uint64_t smem_desc(const void *p) {
    uint64_t a = smem_addr(p);
    return ((a & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* The same in two halves: the low word is (shared address) / 16 | 1 << 16, so moving the tile by
 * b bytes adds b / 16 to it (shared addresses stay below 256 KiB); the high word is constant. */
__device__ __forceinline__ uint32_t smem_desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
constexpr uint32_t SMEM_DESC_HI = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) { return ((uint64_t)SMEM_DESC_HI << 32) | lo; }

#define WGMMA_D_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WGMMA_D_OPS(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* d[64 x 128] (+)= A[64 x 16] . B[128 x 16]^T, both from shared memory. */
__device__ __forceinline__ void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, int accumulate, __nv_bfloat16 *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_D_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D_OPS(d)
                 : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, int accumulate, __half *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WGMMA_D_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D_OPS(d)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* d[64 x 128] (+)= A[64 x 32] . B[128 x 32]^T in e4m3 (both K-major, as FP8 wgmma requires). */
__device__ __forceinline__ void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, int accumulate, uint8_t *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WGMMA_D_REGS ", %64, %65, p, 1, 1;\n}\n"
                 : WGMMA_D_OPS(d)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* After a wait: the accumulators are redefined here (an empty asm), so that ptxas sees no
 * later use depending on an earlier wgmma and injects no wait of its own (C7517). */
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
    asm volatile("" : WGMMA_D_OPS(d)::"memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void store_one(__nv_bfloat16 *p, float a) { *p = __float2bfloat16_rn(a); }
__device__ __forceinline__ void store_one(__half *p, float a) { *p = __float2half_rn(a); }

/* The biases of NV output columns of expert e, column j = n0 + STEP (j / PAIR) + j % PAIR (0 at
 * and past N, or without biases): the dtype tested once and every load issued before any is
 * used (bias_at per value, between the values' arithmetic, waits for each load in turn). */
template <int NV, int STEP, int PAIR>
__device__ __forceinline__ void bias_loads(const bias_view &b, moex_dtype dt, int64_t e, int64_t n0, int64_t N,
                                           float (&v)[NV]) {
    if (!b.base) {
#pragma unroll
        for (int j = 0; j < NV; j++) v[j] = 0.0f;
        return;
    }
    const int64_t first = e * b.expert_stride + b.offset;
    if (dt == MOEX_F32) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t n = n0 + STEP * (j / PAIR) + j % PAIR;
            v[j] = n < N ? __ldg((const float *)b.base + first + n * b.n_stride) : 0.0f;
        }
        return;
    }
    unsigned short x[NV]; /* bf16 or f16 bits */
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t n = n0 + STEP * (j / PAIR) + j % PAIR;
        x[j] = n < N ? __ldg((const unsigned short *)b.base + first + n * b.n_stride) : (unsigned short)0;
    }
#pragma unroll
    for (int j = 0; j < NV; j++)
        v[j] = dt == MOEX_BF16 ? __bfloat162float(__ushort_as_bfloat16(x[j])) : __half2float(__ushort_as_half(x[j]));
}

/* Two values as one 32-bit pair of T. */
__device__ __forceinline__ uint32_t pack_pair(float a, float b, __nv_bfloat16 *) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t pack_pair(float a, float b, __half *) {
    __half2 v = __floats2half2_rn(a, b);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void sts4(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t lds4(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ uint4 lds16(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ uint16_t lds2(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
    return v;
}
/* The e4m3 codes of a (low byte) and b, to nearest even, saturated to +-448: the conversion
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) makes on sm_90 (act_quant.cuh). */
__device__ __forceinline__ uint16_t e4m3x2(float a, float b) {
    uint16_t d;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
    return d;
}

/* 16 bytes to global memory straight from registers (a plain store through the generic pointer
 * made the compiler copy each piece to the stack first) */
__device__ __forceinline__ void stg16(void *p, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

/* The accumulators of one half (HALF_N = 128 columns of the weight tile) of a warpgroup's 64
 * rows: thread holds rows lane/4 and lane/4 + 8 of its warp's 16, columns 8i + c0, +1 in
 * dh[4i + 2h], dh[4i + 2h + 1] (h: the row), c0 = 2 (lane % 4). For the concatenated gate/up
 * layout the half holds 64 gate columns (i < 8) and the 64 up columns that go with them. */
constexpr int HALF_N = BN / 2;

/* One k-block of a float tile (BK inputs as k16 steps), issued and committed: acc0 (+)= A . B[0, 128)^T
 * and acc1 (+)= A . B[128, 256)^T, from a (64 rows of A) and b (256 weight rows), both 128-byte
 * swizzled; accumulate 0 starts both sums. */
template <typename T>
__device__ __forceinline__ void wgmma_k_block(float (&acc0)[64], float (&acc1)[64], const unsigned char *a,
                                              const unsigned char *b, int accumulate) {
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < BK / 16; s++) {
        wgmma_128(acc0, smem_desc(a + s * 32), smem_desc(b + s * 32), accumulate || s > 0, (T *)nullptr);
        wgmma_128(acc1, smem_desc(a + s * 32), smem_desc(b + HALF_N * 128 + s * 32), accumulate || s > 0,
                  (T *)nullptr);
    }
    wgmma_commit();
}

/* Staged epilogue, one chunk of 64 output columns of a warp's 16 rows (chunk c of the half;
 * the gate/up half has one): the final values of columns n0 + 8 ii + c0, +1 into the warp's
 * staging area at shared address stage_w (16 rows of SROW elements). FAST: SiLU(gate) * up
 * without biases (gate/up), or the plain sum (down), as straight-line code; otherwise the
 * biases (all loaded first) and the layer's activation, for columns below N only (the biases
 * end there; the rest is never stored).
 * Down values are then multiplied by their row's factor rs[h] (1 without row scales: exact). */
template <typename T, int EPI, bool FAST>
__device__ __forceinline__ void stage_chunk(const float (&dh)[64], int c, uint32_t stage_w, const layer_view &L,
                                            int64_t e, int64_t n0, int64_t N, int lane, const float (&rs)[2]) {
    const int c0 = 2 * (lane % 4);
    /* the slow path's biases of the thread's 16 columns n0 + 8 ii + c0, +1: gate (bg) and up or
     * down (bu), loaded before the values' arithmetic */
    float bg[16], bu[16];
    if (!FAST) {
        if (EPI == EPI_GATE_UP_CONCAT) bias_loads<16, 8, 2>(L.gate_bias, L.bdt, e, n0 + c0, N, bg);
        bias_loads<16, 8, 2>(EPI == EPI_DOWN ? L.down_bias : L.up_bias, L.bdt, e, n0 + c0, N, bu);
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int ii = 0; ii < 8; ii++) {
            const int64_t n = n0 + 8 * ii + c0;
            const int i = EPI == EPI_GATE_UP_CONCAT ? ii : 8 * c + ii;
            float v0 = dh[4 * i + 2 * h], v1 = dh[4 * i + 2 * h + 1];
            if (EPI == EPI_GATE_UP_CONCAT) {
                const float u0 = dh[4 * (i + 8) + 2 * h], u1 = dh[4 * (i + 8) + 2 * h + 1];
                if (FAST) { /* __fdividef: a denominator of inf (v < -88) gives 0, as SiLU does */
                    v0 = __fdividef(v0, 1.0f + __expf(-v0)) * u0;
                    v1 = __fdividef(v1, 1.0f + __expf(-v1)) * u1;
                } else if (n < N) { /* N even: n + 1 < N too */
                    v0 = activate(L, v0 + bg[2 * ii], u0 + bu[2 * ii]);
                    v1 = activate(L, v1 + bg[2 * ii + 1], u1 + bu[2 * ii + 1]);
                }
            } else {
                if (!FAST && n < N) {
                    v0 += bu[2 * ii], v1 += bu[2 * ii + 1];
                    if (EPI == EPI_UP_ONLY) v0 = activate(L, 0.0f, v0), v1 = activate(L, 0.0f, v1);
                }
                v0 *= rs[h], v1 *= rs[h];
            }
            sts4(stage_w + ((lane / 4 + 8 * h) * SROW + 8 * ii + c0) * 2, pack_pair(v0, v1, (T *)nullptr));
        }
}

/* ---- tiles ---------------------------------------------------------------------- */

struct tile {
    int e, a_row, n; /* 32-bit: a row is a tensor map coordinate, which is 32-bit; e < 0: no tile (stop_tile) */
    int rows; /* valid rows of A in this tile */
    int last; /* 1: the block's last tile (set in the slot of its last k-block) */
    int m, mt; /* its row tile and the expert's row tiles (not in the slot: find_tile's) */
};

/* The slot the producer writes after a block's last tile (chained kernels): the warpgroup whose
 * turn comes next in the ping-pong finds it instead of a tile and stops. */
__device__ __forceinline__ tile stop_tile() {
    tile t = {-1, 0, 0, 0, 1, 0, 0};
    return t;
}

/* The tile a block takes after tile t: from the counter (p.tickets: chained kernels), the grid's
 * tiles being the blocks' first, or t + grid. Not past total: the caller stops there. */
__device__ __forceinline__ int64_t next_tile(const gemm_params &p, int64_t t) {
    return p.tickets ? (int64_t)gridDim.x + atomicAdd(p.tickets, 1) : t + gridDim.x;
}

/* Tile t of the list (row tiles of TM rows): experts in order, row tiles fastest within an expert. */
template <int TM> __device__ __forceinline__ tile find_tile(const gemm_params &p, int64_t t) {
    const int *mtile_off = p.mtile_off;
    const int base = mtile_off[p.e_begin], e_end = (int)p.e_end;
    int lo = (int)p.e_begin, hi = e_end - 1; /* last e with (mtile_off[e] - base) * n_tiles <= t */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if ((int64_t)(mtile_off[mid] - base) * p.n_tiles <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    /* skip experts without tiles that share the same start */
    while (lo + 1 < e_end && mtile_off[lo + 1] == mtile_off[lo]) lo++;
    tile r;
    r.e = lo;
    const int64_t local = t - (int64_t)(mtile_off[lo] - base) * p.n_tiles;
    const int64_t mt = mtile_off[lo + 1] - mtile_off[lo];
    int64_t m, n;
    if (local <= INT32_MAX) { /* 32-bit division: the 64-bit one is a long subroutine */
        m = (int64_t)((uint32_t)local % (uint32_t)mt), n = (int64_t)((uint32_t)local / (uint32_t)mt);
    } else {
        m = local % mt, n = local / mt;
    }
    r.n = (int)n;
    r.m = (int)m, r.mt = (int)mt;
    r.a_row = (int)(p.offsets[lo] + m * TM);
    const int64_t left = p.ends[lo] - r.a_row;
    r.rows = (int)(left < TM ? left : TM);
    r.last = 0;
    return r;
}

/* Each stage's tile slot: 16 bytes in the spare half of the 128 bytes after the stages' barriers
 * (2 x stages x 8 bytes). The producer writes the tile of every k-block it issues there before
 * arming the stage's full barrier (an arrive, which releases the write); a consumer that has
 * waited for the stage (an acquire) reads it while it holds the stage. So consumers never search
 * the tile list, a chain of dependent global loads that took 1-2 us a tile under the weight
 * stream (dev/variants/gemm-trace.patch). */
static_assert(2 * STAGES * 8 + 16 * STAGES <= 128 && 2 * FP8_STAGES * 8 + 16 * FP8_STAGES <= 128, "tile slots");
__device__ __forceinline__ uint32_t tile_slot(uint32_t full_addr, int stage) { return full_addr + 64 + stage * 16; }
__device__ __forceinline__ void put_tile(uint32_t slot, const tile &tl) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(slot), "r"((uint32_t)tl.e), "r"((uint32_t)tl.a_row),
                 "r"((uint32_t)tl.n), "r"((uint32_t)tl.rows | (uint32_t)tl.last << 16)
                 : "memory");
}
__device__ __forceinline__ tile get_tile(uint32_t slot) {
    const uint4 v = lds16(slot);
    tile tl;
    tl.e = (int)v.x, tl.a_row = (int)v.y, tl.n = (int)v.z, tl.rows = (int)(v.w & 0xFFFFu), tl.last = (int)(v.w >> 16);
    return tl;
}

/* ---- chained GEMMs (grouped_gemm_run_chained) ---------------------------------------- */

/* The kernels that take part: those of narrow tiles (experts of few rows, where each GEMM's start
 * and last tiles are a large share of its time), float and FP8. They take their tiles from the
 * counter (next_tile), learn their end from the last tile's slot and count each finished tile
 * (signal_tile_done); the others take tiles b, b + grid, ... and know their end from the tile
 * count (measured: the chain's machinery cost the wide tiles 2-4%, dev/notes/cuda-notes.md). */
template <typename T, bool NARROW> __host__ __device__ constexpr bool chained() { return NARROW; }
/* The float narrow kernels' ping-pong: the warpgroup whose turn comes after a block's last tile
 * learns the end from a stop slot (the FP8 warpgroups both take every tile: the last bit does). */
template <typename T, bool NARROW> __host__ __device__ constexpr bool stop_slot() { return NARROW && !is_fp8<T>(); }

/* A consumer warp has stored its part of a tile of expert e: lane 0 adds 1 to done[e] with
 * release semantics (after the warp's barrier, so the other lanes' stores come first). Predicated,
 * not branched: no path around the wgmmas that some warps take (C7518). done NULL: nothing. */
__device__ __forceinline__ void signal_tile_done(int *done, int e, int lane) {
    __syncwarp();
    const uint32_t go = done != nullptr && lane == 0;
    int *at = (int *)((uintptr_t)done + (uintptr_t)(int64_t)e * 4);
    asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %1, 0;\n @q red.release.gpu.global.add.s32 [%0], 1;\n}\n"
                 ::"l"(at), "r"(go)
                 : "memory");
}

/* Wait until every row of expert e that A holds is stored (p.wait_done: the earlier GEMM's
 * counters), then order those generic-proxy stores before this thread's TMA (async-proxy) reads. */
__device__ __forceinline__ void wait_rows_done(const gemm_params &p, int e) {
    const int need = (p.mtile_off[e + 1] - p.mtile_off[e]) * p.wait_per_mtile;
    for (;;) {
        int v;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p.wait_done + e) : "memory");
        if (v >= need) break;
        __nanosleep(128);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

/* The FP8 tile ring (fp8_tile_ring at ring): the producer thread writes the index of the block's
 * j-th tile (or -1 after its last) into entry j % TILE_RING and arrives on the entry's barrier
 * (release); the scale warp waits for that phase (acquire) and reads it. The producer is never a
 * lap ahead: it writes entry j + TILE_RING only after waiting for the stage of tile j + TILE_RING
 * - 1's last k-block to be free, which needs the scale warp's arrival on a k-block at most
 * ring<uint8_t, true>::stages (4) before it, of tile j + 3 or later, so it has read entry j. */
__device__ __forceinline__ void hand_tile(uint32_t ring, int j, int t) {
    const int i = j % TILE_RING;
    sts4(ring + TILE_RING * 8 + i * 4, (uint32_t)t);
    mbar_arrive_at(ring + i * 8);
}
__device__ __forceinline__ int take_tile(uint32_t ring, int j) {
    const int i = j % TILE_RING;
    mbar_wait_at(ring + i * 8, (j / TILE_RING) & 1);
    return (int)lds4(ring + TILE_RING * 8 + i * 4);
}
static_assert(TILE_RING > FP8_STAGES, "the tile ring must be longer than the stages' ring");

/* ---- the epilogue ------------------------------------------------------------------ */

/* The final values of one half (half 0 or 1: weight rows half*128 .. +128 of the tile) of
 * warpgroup wg's 64 rows of tile tl into C: biases, activation (gate/up), conversion. Staged
 * through the warp's area of shared memory and stored as 16-byte row pieces, 8 lanes per row;
 * the interleaved gate/up layout stores its single values directly. A warp whose 16 rows all
 * lie past the expert's last row stores nothing. */
template <typename T, int EPI, bool FAST_ONLY>
__device__ __forceinline__ void epilogue_half(const float (&dh)[64], int half, const tile &tl, const gemm_params &p,
                                              unsigned char *smem, int wg, int tid, int row0) {
    const int warp = tid / 32, lane = tid % 32;
    const int row_base = row0 + warp * 16;
    /* FAST_ONLY (the kernels that overlap an epilogue with wgmmas in flight): no call and no
     * branch that some warps of the warpgroup take and others do not, or ptxas serialises
     * every wgmma of the kernel (C7518); only the stores are predicated */
    if (!FAST_ONLY && row_base >= tl.rows) return;
    const layer_view &L = p.L;
    const bool plain = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base;
    const bool silu = plain && L.act == MOEX_ACT_SILU;
    if (EPI == EPI_GATE_UP_INTERLEAVED) { /* columns 2f (gate) and 2f+1 (up): one value per pair */
        /* the biases of the thread's 16 output columns n_first + 4 i, loaded before the arithmetic */
        const int64_t n_first = tl.n * (BN / 2) + half * (HALF_N / 2) + lane % 4;
        float bg[16], bu[16];
        bias_loads<16, 4, 1>(L.gate_bias, L.bdt, tl.e, n_first, p.N, bg);
        bias_loads<16, 4, 1>(L.up_bias, L.bdt, tl.e, n_first, p.N, bu);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row_base + lane / 4 + 8 * h;
            T *crow = (T *)p.c + (tl.a_row + r) * p.N;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int64_t n = n_first + 4 * i;
                const float g = dh[4 * i + 2 * h], u = dh[4 * i + 2 * h + 1];
                const float v = silu       ? __fdividef(g, 1.0f + __expf(-g)) * u
                                : n < p.N ? activate(L, g + bg[i], u + bu[i])
                                           : 0.0f; /* past the biases' end; never stored */
                if (r < tl.rows && n < p.N) store_one(crow + n, v);
            }
        }
        return;
    }
    const uint32_t stage_w = smem_addr(smem + EPI_OFFSET) + ((wg - 1) * 4 + warp) * (16 * SROW * 2);
    /* the down epilogue's factors of the thread's two rows (rows past the tile's read none) */
    float rs[2] = {1.0f, 1.0f};
    if (EPI == EPI_DOWN)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row_base + lane / 4 + 8 * h;
            rs[h] = p.row_scale && r < tl.rows ? __ldg(p.row_scale + tl.a_row + r) : 1.0f;
        }
    /* output columns of this half: 64 (gate/up: gate and up give one column each) or 128 */
    const int64_t n_half = EPI == EPI_GATE_UP_CONCAT ? tl.n * (BN / 2) + half * (HALF_N / 2) : tl.n * BN + half * HALF_N;
    const bool fast = FAST_ONLY || (EPI == EPI_GATE_UP_CONCAT ? silu : EPI == EPI_DOWN && plain);
    constexpr int CHUNKS = EPI == EPI_GATE_UP_CONCAT ? 1 : 2;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        const int64_t n0 = n_half + 64 * c;
        if (fast)
            stage_chunk<T, EPI, true>(dh, c, stage_w, L, tl.e, n0, p.N, lane, rs);
        else if (!FAST_ONLY)
            stage_chunk<T, EPI, false>(dh, c, stage_w, L, tl.e, n0, p.N, lane, rs);
        __syncwarp();
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int idx = q * 32 + lane, row = idx / 8, piece = idx % 8;
            const int64_t n = n0 + 8 * piece;
            if (row_base + row < tl.rows && n < p.N) {
                const uint32_t src = stage_w + (row * SROW + 8 * piece) * 2;
                T *dst = (T *)p.c + (tl.a_row + row_base + row) * p.N + n;
                if (n + 8 <= p.N)
                    stg16(dst, lds16(src));
                else /* the last columns of a row (N % 8 != 0) */
                    for (int j = 0; j < 8 && n + j < p.N; j++) ((uint16_t *)dst)[j] = lds2(src + 2 * j);
            }
        }
        __syncwarp(); /* the staging area is rewritten by the next chunk */
    }
}

/* ---- the producer ---------------------------------------------------------------- */

/* Thread 0 of warpgroup 0 issues the TMA copies of every k-block of the block's tiles into the
 * ring. Per stage: the tile's A rows (k_block<T>() inputs, 128 bytes a row), then the weight
 * rows: gate/up concatenated as [gate 0-63, up 0-63 | gate 64-127, up 64-127] of the tile,
 * otherwise BN consecutive rows.
 * chained<T, NARROW>() kernels: the block's next tile is asked for (next_tile) as a tile starts
 * and needed only at its last k-block, whose slot says whether it was the block's last; after
 * it, the float ring gets the stop slot; with p.wait_done, an expert's A rows are waited for
 * before its first copy. FP8 narrow tiles: each tile is handed to the scale warp (hand_tile). */
template <typename T, int EPI, bool NARROW, bool CLUSTER = false>
__device__ __forceinline__ void produce(const CUtensorMap &map_a, const CUtensorMap &map_b, const gemm_params &p,
                                        unsigned char *smem, uint64_t *full, uint64_t *empty, int64_t total,
                                        int k_blocks) {
    constexpr bool FP8 = is_fp8<T>();
    constexpr int KB = k_block<T>(), TILE_N = BN, B_LOAD = TILE_N * 128;
    /* boxes of GU_BOX weight rows, GU_BOXES a stage: gate/up [gate, up] pairs of the tile's
     * features; down (CLUSTER) consecutive rows, otherwise one box of the tile's rows */
    constexpr int GU_BOX = BN / 4, GU_BOXES = TILE_N / GU_BOX;
    constexpr bool CHAINED = chained<T, NARROW>(), HAND = FP8 && NARROW;
    const uint32_t tile_ring = HAND ? fp8_tile_ring(smem_addr(full), ring<T, NARROW>::stages) : 0;
    const int rank = CLUSTER ? (int)cluster_rank() : 0;
    int stage = 0, phase = 0, waited = -1, j = 0;
    for (int64_t t = blockIdx.x; t - rank < total;) {
        const int64_t next = CHAINED ? next_tile(p, t) : t + gridDim.x;
        tile tl = find_tile<NARROW ? NARROW_ROWS : BM>(p, t < total ? t : t - 1);
        /* CLUSTER: the pair's tiles multiply the same weight tile (the same expert and column
         * tile; the shadow is its partner's), so each block copies half its boxes for both; or,
         * experts of one row tile, the same rows of A by two column tiles: each copies half of them */
        const bool both = CLUSTER && (rank == 0 ? t + 1 >= total || tl.m + 1 < tl.mt : t >= total || tl.m >= 1);
        const bool both_a = CLUSTER && !both && tl.mt == 1 &&
                            (rank == 0 ? t + 1 < total && tl.n + 1 < p.n_tiles : tl.n >= 1);
        if (t >= total) tl.rows = 0; /* the shadow: nothing stored */
        if (CHAINED && p.wait_done && tl.e != waited) {
            wait_rows_done(p, tl.e);
            waited = tl.e;
        }
        /* the scale warp's tile, after the wait: its reads of A's row scales are ordered after the
         * rows' stores through this thread's acquire and the ring's release and acquire */
        if constexpr (HAND) hand_tile(tile_ring, j++, (int)t);
        const int64_t b_row = tl.e * p.rows_per_expert;
        for (int kb = 0; kb < k_blocks; kb++) {
            mbar_wait(&empty[stage], phase ^ 1);
            unsigned char *a = smem + stage * ring<T, NARROW>::stage_bytes, *b = a + A_BYTES;
            if (CHAINED && kb == k_blocks - 1) tl.last = next >= total;
            put_tile(tile_slot(smem_addr(full), stage), tl);
            mbar_expect_tx(&full[stage], (NARROW ? NARROW_ROWS * 128 : A_BYTES) + B_LOAD);
            if constexpr (CLUSTER) { /* A in boxes of 64 rows */
                for (int h = 0; h < 2; h++) {
                    if (!both_a)
                        tma_load(a + h * 64 * 128, &map_a, &full[stage], kb * KB, (int)tl.a_row + 64 * h);
                    else if (h == rank)
                        tma_load_both(a + h * 64 * 128, &map_a, &full[stage], kb * KB, (int)tl.a_row + 64 * h);
                }
            } else {
                tma_load(a, &map_a, &full[stage], kb * KB, (int)tl.a_row);
            }
            if (EPI == EPI_GATE_UP_CONCAT || CLUSTER) {
                for (int q = 0; q < GU_BOXES; q++) {
                    const int row = EPI == EPI_GATE_UP_CONCAT
                                        ? (int)(b_row + (q & 1) * p.up_offset + tl.n * (TILE_N / 2) + (q >> 1) * GU_BOX)
                                        : (int)(b_row + tl.n * TILE_N + q * GU_BOX);
                    if (!both)
                        tma_load(b + q * GU_BOX * 128, &map_b, &full[stage], kb * KB, row);
                    else if ((q & 1) == rank)
                        tma_load_both(b + q * GU_BOX * 128, &map_b, &full[stage], kb * KB, row);
                }
            } else {
                tma_load(b, &map_b, &full[stage], kb * KB, (int)(b_row + tl.n * TILE_N));
            }
            if (++stage == ring<T, NARROW>::stages) stage = 0, phase ^= 1;
        }
        t = next;
    }
    if constexpr (HAND) hand_tile(tile_ring, j, -1);
    if constexpr (stop_slot<T, NARROW>()) {
        mbar_wait(&empty[stage], phase ^ 1);
        put_tile(tile_slot(smem_addr(full), stage), stop_tile());
        mbar_arrive(&full[stage]);
    }
}

/* The gathered A-load (bf16/f16): all 128 threads of the producer warpgroup copy each stage's A
 * rows straight from the source matrix, row r of a tile being row a_index[a_row + r] of it, with
 * cp.async in 16-byte pieces to the addresses the 128-byte swizzle gives (piece q of row r at
 * r * 128 + (q ^ r % 8) * 16, where a TMA copy would put it); thread 0 also issues the weight
 * rows by TMA. Thread i copies piece i % 8 of rows i / 8 + 16 j, so 8 threads read a row's 128
 * contiguous bytes. Rows past the tile's and columns past K are zero-filled. Each thread's
 * copies arrive on the stage's full barrier when they land (cp.async.mbarrier.arrive: nobody
 * waits on a copy; the barrier expects the 128 arrivals and thread 0's for the weights' bytes);
 * the consumers order those generic-proxy writes before their wgmmas' async-proxy reads
 * (wait_full). A tile's source rows are read once into shared memory (two buffers, the tiles
 * alternating, with one barrier of the warpgroup a tile: a buffer is rewritten only after every
 * thread has passed the barrier of the tile that followed its last use). Measured against two
 * other arrangements (dev/notes/sonicmoe-notes.md): one warp a stage, each waiting for its
 * copies, and two copying warps with a relay thread; fewer copying threads were slower. NARROW
 * (chained<T, NARROW>()): thread 0 asks for the block's next tile (next_tile) and passes it to
 * the others through shared memory at the tile's end; after the last, the stop slot (produce's). */
template <typename T, int EPI, bool NARROW>
__device__ __forceinline__ void produce_gathered(const CUtensorMap &map_b, const gemm_params &p, unsigned char *smem,
                                                 uint64_t *full, uint64_t *empty, int64_t total, int k_blocks,
                                                 int64_t K, int tid) {
    static_assert(!is_fp8<T>(), "the gathered A-load takes 16-bit A");
    constexpr int ROWS = NARROW ? NARROW_ROWS : BM, PASSES = ROWS / 16, TILE_N = BN;
    constexpr int GU_BOX = BN / 4, GU_BOXES = TILE_N / GU_BOX;
    const int piece = tid % 8, r0 = tid / 8;
    const uint32_t swz = (uint32_t)((piece ^ (r0 % 8)) * 16); /* (r0 + 16 j) % 8 == r0 % 8 */
    const T *src = (const T *)p.gather;
    int stage = 0, phase = 0, buf = 0;
    const uint32_t next_at = smem_addr(smem + GATHER_OFFSET) + 2 * (BM * 4);
    for (int64_t t = blockIdx.x; t < total; buf ^= 1) {
        const int64_t next = !NARROW ? t + gridDim.x : tid == 0 ? next_tile(p, t) : 0;
        tile tl = find_tile<ROWS>(p, t);
        const int64_t b_row = tl.e * p.rows_per_expert;
        /* the source row of each of the tile's rows, -1 past its last */
        const uint32_t rows = smem_addr(smem + GATHER_OFFSET) + buf * (BM * 4);
        if (tid < ROWS) sts4(rows + tid * 4, (uint32_t)(tid < tl.rows ? __ldg(p.a_index + tl.a_row + tid) : -1));
        asm volatile("bar.sync 1, 128;" ::: "memory");
        for (int kb = 0; kb < k_blocks; kb++) {
            mbar_wait(&empty[stage], phase ^ 1);
            unsigned char *a = smem + stage * ring<T, NARROW>::stage_bytes, *b = a + A_BYTES;
            if (tid == 0) {
                if (NARROW && kb == k_blocks - 1) tl.last = next >= total;
                put_tile(tile_slot(smem_addr(full), stage), tl);
                mbar_expect_tx(&full[stage], TILE_N * 128);
                if (EPI == EPI_GATE_UP_CONCAT) {
                    for (int q = 0; q < GU_BOXES; q++)
                        tma_load(b + q * GU_BOX * 128, &map_b, &full[stage], kb * BK,
                                 (int)(b_row + (q & 1) * p.up_offset + tl.n * (TILE_N / 2) + (q >> 1) * GU_BOX));
                } else {
                    tma_load(b, &map_b, &full[stage], kb * BK, (int)(b_row + tl.n * TILE_N));
                }
            }
            const int64_t col = (int64_t)kb * BK + piece * 8;
            const uint32_t dst = smem_addr(a) + (uint32_t)r0 * 128 + swz;
#pragma unroll
            for (int j = 0; j < PASSES; j++) {
                const int row = (int)lds4(rows + (r0 + 16 * j) * 4);
                const bool in = row >= 0 && col < K;
                cp_async16(dst + j * 16 * 128, in ? src + (int64_t)row * p.gather_ld + col : src, in ? 16 : 0);
            }
            cp_async_arrive(&full[stage]);
            if (++stage == ring<T, NARROW>::stages) stage = 0, phase ^= 1;
        }
        if constexpr (NARROW) {
            /* every thread has read next_at since thread 0 last wrote it: they did before the
             * rows' barrier of this tile */
            if (tid == 0) sts4(next_at, (uint32_t)next);
            asm volatile("bar.sync 1, 128;" ::: "memory");
            t = (int64_t)(int)lds4(next_at);
        } else {
            t = next;
        }
    }
    if constexpr (NARROW) { /* the stop slot: the barrier's 129 arrivals (thread 0 twice) */
        mbar_wait(&empty[stage], phase ^ 1);
        if (tid == 0) {
            put_tile(tile_slot(smem_addr(full), stage), stop_tile());
            mbar_arrive(&full[stage]);
        }
        mbar_arrive(&full[stage]);
    }
}

/* A stage's bytes have landed: wait on its barrier; GATHER (the cp.async A-load) then orders
 * those generic-proxy writes before the wgmmas' async-proxy reads. */
template <bool GATHER> __device__ __forceinline__ void wait_full(uint64_t *bar, int phase) {
    mbar_wait(bar, phase);
    if (GATHER) fence_proxy_async();
}

/* ---- the float consumers ------------------------------------------------------------ */

/* Named barriers 2 and 3 (1: the gathered A-load's producer warpgroup) order the NARROW
 * warpgroups' k-loops: the warpgroup of a block's next tile starts its k-loop once the current
 * tile's has waited for all its stages. A warpgroup thus waits only for a stage's next fill, the
 * one its parity names (the other's tiles lie between its own in the ring). */
__device__ __forceinline__ void turn_wait(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void turn_pass(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

/* Move a consumer's place in the ring (stage, and the phase it waits for) n k-blocks on: the
 * phase flips at each wrap. */
__device__ __forceinline__ void ring_skip(int &stage, int &phase, int n, int stages) {
    stage += n;
    phase ^= (stage / stages) & 1;
    stage %= stages;
}

/* Warpgroup wg computes rows (wg-1)*64 .. +64 of each tile, as two halves of 128 weight rows
 * with their own accumulators. OVERLAP (down and SiLU gate/up without biases, experts of a
 * tile or more): the second half's epilogue of a tile waits until the next tile's first
 * k-blocks are issued for the first half, so that it runs while the tensor cores multiply (the
 * stages of those k-blocks are kept until the second half has read them too). NARROW (experts
 * of few rows; not with OVERLAP): tiles of NARROW_ROWS rows, which the two warpgroups take in
 * turn (ping-pong: warpgroup 1 the block's first, third, ... tile, warpgroup 2 the others), each
 * multiplying all of a tile's rows by both halves of its weight tile and skipping the other's
 * stages in the ring. One warpgroup's epilogue then runs while the other multiplies the next
 * tile, so the weight stream does not pause at each tile's end (short tiles: K = 768 is 12
 * k-blocks), and no warpgroup multiplies a block of empty rows. */
template <typename T, int EPI, bool OVERLAP, bool NARROW, bool GATHER>
__device__ __forceinline__ void consume_float(const gemm_params &p, unsigned char *smem, uint64_t *full,
                                              uint64_t *empty, int64_t total, int k_blocks, int wg, int tid) {
    int stage = 0, phase = 0;
    float acc0[64], acc1[64];
    tile done = {}; /* the previous tile: its second half waits for its epilogue */
    bool pending = false;
    const int row0 = NARROW ? 0 : (wg - 1) * 64;
    const int lane = tid % 32;
    if (NARROW && wg == 2) ring_skip(stage, phase, k_blocks, STAGES);
    /* NARROW (chained<T, NARROW>()): every other tile of the block (it has one:
     * grouped_gemm_body), all its rows, until a slot says it was the block's last or the stop
     * slot comes; otherwise tiles b, b + grid, ... below total, 64 of their rows each */
    for (int64_t t = NARROW ? 0 : blockIdx.x; NARROW || t < total; t += NARROW ? 1 : gridDim.x) {
        if (NARROW && !(wg == 1 && t == 0)) {
            /* the block's previous tile has finished its k-loop; then this warpgroup's next
             * stage holds its next tile or the stop slot */
            turn_wait(wg == 2 ? 2 : 3);
            wait_full<GATHER>(&full[stage], phase);
            if (get_tile(tile_slot(smem_addr(full), stage)).e < 0) break;
        }
        const unsigned char *a_base = smem + row0 * 128, *b_base = smem + A_BYTES;
        int prev = -1; /* the stage to release once the next group of wgmmas is issued */
        int kb = 0;
        /* the tile (needed by the epilogue only), read from the last k-block's slot before that
         * k-block's wgmmas are issued: their completion, which thread 0 waits for before it
         * releases the stage, then implies every warp of the warpgroup has read it */
        tile tl = {};
        if (OVERLAP && pending) {
            /* the first k-blocks for the first half, then the previous tile's second half out,
             * then the same k-blocks for the second half */
            const int lead = k_blocks < STAGES ? k_blocks : STAGES;
            int s0 = stage, ph0 = phase;
            for (int j = 0; j < lead; j++) {
                wait_full<GATHER>(&full[stage], phase);
                if (j == k_blocks - 1) tl = get_tile(tile_slot(smem_addr(full), stage));
                const unsigned char *a = a_base + stage * STAGE_BYTES, *b = b_base + stage * STAGE_BYTES;
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < BK / 16; s++)
                    wgmma_128(acc0, smem_desc(a + s * 32), smem_desc(b + s * 32), j > 0 || s > 0, (T *)nullptr);
                wgmma_commit();
                if (++stage == STAGES) stage = 0, phase ^= 1;
            }
            /* only the lead groups are in flight (at most STAGES): a no-op that tells ptxas the
             * previous tile's wgmmas are complete, so that it injects no wait of its own */
            wgmma_wait<STAGES>();
            epilogue_half<T, EPI, OVERLAP>(acc1, 1, done, p, smem, wg, tid, row0);
            stage = s0, phase = ph0;
            for (int j = 0; j < lead; j++) {
                const unsigned char *a = a_base + stage * STAGE_BYTES, *b = b_base + stage * STAGE_BYTES + HALF_N * 128;
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < BK / 16; s++)
                    wgmma_128(acc1, smem_desc(a + s * 32), smem_desc(b + s * 32), j > 0 || s > 0, (T *)nullptr);
                wgmma_commit();
                wgmma_wait<1>();
                if (prev >= 0 && tid == 0) mbar_arrive(&empty[prev]);
                prev = stage;
                if (++stage == STAGES) stage = 0, phase ^= 1;
            }
            kb = lead;
            pending = false;
        }
        /* one group of wgmmas stays in flight: the stage of k-block kb-1 is released once kb's are issued */
        for (; kb < k_blocks; kb++) {
            wait_full<GATHER>(&full[stage], phase);
            if (kb == k_blocks - 1) tl = get_tile(tile_slot(smem_addr(full), stage));
            wgmma_k_block<T>(acc0, acc1, a_base + stage * STAGE_BYTES, b_base + stage * STAGE_BYTES, kb > 0);
            wgmma_wait<1>();
            if (prev >= 0 && tid == 0) mbar_arrive(&empty[prev]);
            prev = stage;
            if (++stage == STAGES) stage = 0, phase ^= 1;
        }
        if (NARROW) turn_pass(wg == 1 ? 2 : 3); /* the block's next tile (or the stop slot) may be taken */
        wgmma_wait<0>();
        fence_acc(acc0);
        fence_acc(acc1);
        if (tid == 0) mbar_arrive(&empty[prev]);
        if (NARROW) ring_skip(stage, phase, k_blocks, STAGES); /* the other warpgroup's next tile */
        epilogue_half<T, EPI, OVERLAP>(acc0, 0, tl, p, smem, wg, tid, row0);
        if (OVERLAP) {
            done = tl;
            pending = true;
        } else {
            epilogue_half<T, EPI, OVERLAP>(acc1, 1, tl, p, smem, wg, tid, row0);
            if (NARROW) signal_tile_done(p.done, tl.e, lane);
        }
        if (NARROW && tl.last) break;
    }
    if (OVERLAP && pending) epilogue_half<T, EPI, OVERLAP>(acc1, 1, done, p, smem, wg, tid, row0);
}

/* ---- the FP8 consumers --------------------------------------------------------------- */

/* An FP8 gate/up output from its gate and up totals: SiLU(g) * u straight (silu: no biases), else
 * the layer's activation of the totals plus their biases bg, bu (fp8_gate_up_biases). */
__device__ __forceinline__ float fp8_gate_up_value(const layer_view &L, bool silu, float g, float u, float bg, float bu) {
    return silu ? __fdividef(g, 1.0f + __expf(-g)) * u : activate(L, g + bg, u + bu);
}

/* The gate and up biases of 8 feature groups of a thread's columns, n0 + 8 ii + {0, 1} (n0: the
 * groups' first column of the thread), all loaded before any value is computed (bias_loads: zeros
 * without biases and at and past N). */
__device__ __forceinline__ void fp8_gate_up_biases(const layer_view &L, int64_t e, int64_t n0, int64_t N,
                                                   float (&bg)[16], float (&bu)[16]) {
    bias_loads<16, 8, 2>(L.gate_bias, L.bdt, e, n0, N, bg);
    bias_loads<16, 8, 2>(L.up_bias, L.bdt, e, n0, N, bu);
}

/* The FP8 epilogue: the thread's two rows (lane/4 and +8 of its warp's 16) of the warpgroup's
 * rows of tile tl, from the promoted totals, straight to C in f32 (pairs of columns, 8 bytes;
 * the 4 lanes of a row write 32 contiguous bytes). acc is one or two halves of 64 values (an
 * m64n128 accumulator each: column 8i + c0 (+1) of the half at 4i (+1), its second row's at
 * 4i + 2 (+3)); a half of gate/up holds 64 gate columns then their 64 up columns, so feature
 * group i (8 features) has its gate values at fp8_gate_at(i) and its up values 32 later. Wide
 * tiles: the warpgroup's 64 of 128 rows by the tile's 256 weight rows (two halves: 128
 * features, or 256 down outputs); NARROW: all 64 rows by half wg-1 of its 256 (one half).
 * Column groups are taken 8 at a time, their biases loaded first (none without biases). */
__host__ __device__ constexpr int fp8_gate_at(int i) { return 64 * (i / 8) + 4 * (i % 8); }
template <int EPI, bool NARROW, int ACC>
__device__ __forceinline__ void epilogue_fp8(const float (&acc)[ACC], const tile &tl, const gemm_params &p, int wg,
                                             int tid) {
    constexpr int TILE_N = BN;
    const int warp = tid / 32, lane = tid % 32, c0 = 2 * (lane % 4);
    const int row_base = (NARROW ? 0 : (wg - 1) * 64) + warp * 16;
    if (row_base >= tl.rows) return;
    const layer_view &L = p.L;
    const bool plain = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base;
    const bool silu = plain && L.act == MOEX_ACT_SILU;
    constexpr int COLS = EPI == EPI_DOWN ? ACC / 4 : ACC / 8; /* column groups of 8 out */
    const int64_t n_tile = EPI == EPI_DOWN ? tl.n * TILE_N + (NARROW ? (wg - 1) * 128 : 0)
                                           : tl.n * (TILE_N / 2) + (NARROW ? (wg - 1) * 64 : 0);
#pragma unroll
    for (int c = 0; c < COLS / 8; c++) {
        const int64_t n0 = n_tile + 64 * c + c0;
        float bg[16], bu[16];
        if (EPI == EPI_DOWN)
            bias_loads<16, 8, 2>(L.down_bias, L.bdt, tl.e, n0, p.N, bu);
        else
            fp8_gate_up_biases(L, tl.e, n0, p.N, bg, bu);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row_base + lane / 4 + 8 * h;
            if (r >= tl.rows) continue;
            float *crow = (float *)p.c + (tl.a_row + r) * p.N;
#pragma unroll
            for (int ii = 0; ii < 8; ii++) {
                const int i = 8 * c + ii;
                const int64_t n = n0 + 8 * ii;
                if (n >= p.N) continue;
                const int at = EPI == EPI_DOWN ? 4 * i : fp8_gate_at(i);
                float v0 = acc[at + 2 * h], v1 = acc[at + 2 * h + 1];
                if (EPI == EPI_DOWN) {
                    v0 += bu[2 * ii], v1 += bu[2 * ii + 1]; /* zeros without biases: exact */
                } else {
                    const float u0 = acc[at + 32 + 2 * h], u1 = acc[at + 32 + 2 * h + 1];
                    v0 = fp8_gate_up_value(L, silu, v0, u0, bg[2 * ii], bu[2 * ii]);
                    v1 = fp8_gate_up_value(L, silu, v1, u1, bg[2 * ii + 1], bu[2 * ii + 1]);
                }
                *(float2 *)(crow + n) = make_float2(v0, v1); /* N even: n and n + 1 are both in the row */
            }
        }
    }
}

/* The FP8 narrow gate/up epilogue with p.cq: h quantized here for the down GEMM instead of written
 * in f32 (grouped_gemm_fp8_h_quant_fits). A row's 128 features of the tile are one scale block:
 * warpgroup 1 holds the first 64 (acc's gate columns 8i + c0, +1 with their up columns in
 * acc[4(i+8) ..]), warpgroup 2 the others. Each thread takes the amax of its two rows' values
 * (columns below N), the 4 lanes of a row reduce it, and the two warpgroups' amax of each row meet
 * in shared memory (xa: 64 rows a warpgroup, two buffers by the tile's parity, so that a
 * warpgroup a tile ahead never overwrites what the other still reads) across named barrier 4 of
 * the 256 consumer threads, which every thread reaches. Then act_quant_e4m3's rounding: scale
 * amax / 448 (1 for 0), codes e4m3(v / scale) saturated, 2 bytes a column pair; warpgroup 1
 * stores each row's scale. Rows past the tile's store nothing. */
__device__ __forceinline__ void epilogue_fp8_h_quant(const float (&acc)[64], const tile &tl, const gemm_params &p,
                                                     int wg, int tid, uint32_t xa) {
    const int warp = tid / 32, lane = tid % 32, c0 = 2 * (lane % 4);
    const layer_view &L = p.L;
    const bool silu = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base && L.act == MOEX_ACT_SILU;
    const int64_t n_tile = (int64_t)tl.n * (BN / 2) + (wg - 1) * 64;
    float v[2][16], amax[2] = {0.0f, 0.0f}, bg[16], bu[16];
    fp8_gate_up_biases(L, tl.e, n_tile + c0, p.N, bg, bu);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int64_t n = n_tile + 8 * i + c0;
            const float g0 = acc[4 * i + 2 * h], g1 = acc[4 * i + 2 * h + 1];
            const float u0 = acc[4 * (i + 8) + 2 * h], u1 = acc[4 * (i + 8) + 2 * h + 1];
            const bool in = n < p.N; /* N even: n + 1 < N too */
            v[h][2 * i] = in ? fp8_gate_up_value(L, silu, g0, u0, bg[2 * i], bu[2 * i]) : 0.0f;
            v[h][2 * i + 1] = in ? fp8_gate_up_value(L, silu, g1, u1, bg[2 * i + 1], bu[2 * i + 1]) : 0.0f;
            amax[h] = fmaxf(amax[h], fmaxf(fabsf(v[h][2 * i]), fabsf(v[h][2 * i + 1])));
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        if (lane % 4 == 0) sts_f32(xa + ((wg - 1) * 64 + warp * 16 + lane / 4 + 8 * h) * 4, amax[h]);
    }
    asm volatile("bar.sync 4, 256;" ::: "memory");
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + lane / 4 + 8 * h;
        const float a = fmaxf(amax[h], lds_f32(xa + ((2 - wg) * 64 + r) * 4));
        const float sc = a > 0.0f ? a / 448.0f : 1.0f;
        if (r >= tl.rows) continue;
        uint8_t *crow = p.cq + (int64_t)(tl.a_row + r) * p.N;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int64_t n = n_tile + 8 * i + c0;
            if (n >= p.N) continue;
            *(uint16_t *)(crow + n) = e4m3x2(v[h][2 * i] / sc, v[h][2 * i + 1] / sc);
        }
        if (wg == 1 && lane % 4 == 0) p.cs[(int64_t)(tl.a_row + r) * p.cs_ld + tl.n] = sc;
    }
}

/* The same for a wide tile, whose warpgroup holds all 128 features of its 64 rows (two halves:
 * fp8_gate_at): a row's amax meets across the 4 lanes of the row alone, and each thread writes
 * its own rows' codes; the activated values replace the gate values in acc. */
__device__ __forceinline__ void epilogue_fp8_h_quant_wide(float (&acc)[128], const tile &tl, const gemm_params &p,
                                                          int wg, int tid) {
    const int warp = tid / 32, lane = tid % 32, c0 = 2 * (lane % 4);
    const layer_view &L = p.L;
    const bool silu = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base && L.act == MOEX_ACT_SILU;
    const int64_t n_tile = (int64_t)tl.n * (BN / 2);
    float amax[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 2; c++) { /* feature groups 8c .. 8c + 7, their biases first */
        float bg[16], bu[16];
        fp8_gate_up_biases(L, tl.e, n_tile + 64 * c + c0, p.N, bg, bu);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int ii = 0; ii < 8; ii++) {
                const int i = 8 * c + ii, at = fp8_gate_at(i) + 2 * h;
                const int64_t n = n_tile + 8 * i + c0;
                const bool in = n < p.N; /* N even: n + 1 < N too */
                acc[at] = in ? fp8_gate_up_value(L, silu, acc[at], acc[at + 32], bg[2 * ii], bu[2 * ii]) : 0.0f;
                acc[at + 1] = in ? fp8_gate_up_value(L, silu, acc[at + 1], acc[at + 33], bg[2 * ii + 1], bu[2 * ii + 1])
                                 : 0.0f;
                amax[h] = fmaxf(amax[h], fmaxf(fabsf(acc[at]), fabsf(acc[at + 1])));
            }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        const int r = (wg - 1) * 64 + warp * 16 + lane / 4 + 8 * h;
        const float sc = amax[h] > 0.0f ? amax[h] / 448.0f : 1.0f;
        if (r >= tl.rows) continue;
        uint8_t *crow = p.cq + (int64_t)(tl.a_row + r) * p.N;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int at = fp8_gate_at(i) + 2 * h;
            const int64_t n = n_tile + 8 * i + c0;
            if (n >= p.N) continue;
            *(uint16_t *)(crow + n) = e4m3x2(acc[at] / sc, acc[at + 1] / sc);
        }
        if (lane % 4 == 0) p.cs[(int64_t)(tl.a_row + r) * p.cs_ld + tl.n] = sc;
    }
}

/* The weight scale row of chunk j of an FP8 tile (64 weight rows each, BN / 64 of them):
 * gate (j even) or up rows of features (j / 2) * 64 .. +64 of the tile, or down rows j * 64 ..
 * +64; a chunk past N takes the tile's first (its columns are never stored). */
template <int EPI, bool NARROW>
__device__ __forceinline__ uint32_t fp8_weight_scale_row(const gemm_params &p, const tile &tl, int j) {
    constexpr int TILE_N = BN;
    const quant_view &Q = p.Q;
    const int64_t n0 = EPI == EPI_DOWN ? tl.n * TILE_N : tl.n * (TILE_N / 2);
    int64_t n = n0 + (EPI == EPI_DOWN ? j : j / 2) * 64;
    if (n >= p.N) n = n0;
    return scale_row(Q, EPI == EPI_DOWN ? Q.down : j % 2 ? Q.up : Q.gate, tl.e, n);
}

/* Warp 1 of the producer warpgroup: the scales of every k-block of the block's tiles into the
 * stage's scale slot (FP8_SCALES floats), in step with the copies: lane l the row scales of rows
 * 4l .. 4l+3 of the tile (0 past its rows), lane j < CHUNKS the block scale of chunk j of the
 * weight rows as f32. Each lane arrives on the stage's full barrier after its
 * stores, so the consumers read them with the tile's bytes, from shared memory. Wide tiles:
 * tiles b, b + grid, ... as the producer; NARROW: the producer's, from the tile ring (hand_tile),
 * which with p.wait_done (the chained down GEMM) hands a tile over once its rows are stored; narrow
 * tiles read the row scales through L2 (with p.wait_done they are written during the kernel: not
 * through the read-only path). */
template <int EPI, bool NARROW, bool CLUSTER = false>
__device__ __forceinline__ void produce_scales(const gemm_params &p, uint32_t scales, uint32_t full, uint32_t empty,
                                               int64_t total, int k_blocks, int lane) {
    typedef ring<uint8_t, NARROW> R;
    constexpr int CHUNKS = BN / 64;
    const quant_view &Q = p.Q;
    const void *wbase = EPI == EPI_DOWN ? Q.down.base : lane % 2 ? Q.up.base : Q.gate.base;
    const uint32_t tile_ring = fp8_tile_ring(full, R::stages);
    const int rank = CLUSTER ? (int)cluster_rank() : 0;
    int stage = 0, phase = 0;
    for (int64_t j = 0, t = blockIdx.x;; j++, t += gridDim.x) {
        if (NARROW) t = take_tile(tile_ring, (int)j);
        if (NARROW ? t < 0 : t - rank >= total) break;
        tile tl = find_tile<NARROW ? NARROW_ROWS : BM>(p, t < total ? t : t - 1);
        if (t >= total) tl.rows = 0; /* CLUSTER's shadow (produce) */
        const uint32_t wrow = lane < CHUNKS ? fp8_weight_scale_row<EPI, NARROW>(p, tl, lane) : 0;
        const float *sa = p.a_scale + (tl.a_row + 4 * lane) * p.a_sld;
        int sk = 0, sub = 0;
        for (int kb = 0; kb < k_blocks; kb++) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[i] = 4 * lane + i >= tl.rows ? 0.0f : NARROW ? __ldcg(sa + i * p.a_sld + sk) : __ldg(sa + i * p.a_sld + sk);
            const float w = lane < CHUNKS ? scale_load(Q.sdt, wbase, wrow + sk) : 0.0f;
            mbar_wait_at(empty + 8 * stage, phase ^ 1);
            const uint32_t slot = scales + stage * (FP8_SCALES * 4);
#pragma unroll
            for (int i = 0; i < 4; i++) sts_f32(slot + (4 * lane + i) * 4, v[i]);
            if (lane < CHUNKS) sts_f32(slot + (128 + lane) * 4, w);
            mbar_arrive_at(full + 8 * stage);
            if (++stage == R::stages) stage = 0, phase ^= 1;
            if (++sub == p.kstep) sub = 0, sk++;
        }
    }
}

/* FP8 tiles, one k-block at a time: for each half of 128 weight rows the warpgroup takes, 4
 * wgmmas m64n128k32 into blk, waited for, then added into that half of acc times the scales: each
 * thread's two rows have their row scales (A's, scale kb / kstep of the row), and each chunk of
 * 64 weight rows (gate or up rows of 64 features, or 64 down rows) its block scale (bn a
 * multiple of 64 with 64-aligned chunk starts, so a chunk is one block: grouped_gemm_fp8_usable),
 * all read from the stage's scale slot (produce_scales); the stage is released after the last
 * half's wgmmas. While one warpgroup promotes, the other's wgmmas run. The loop is kept short (the
 * consumers issue its instructions between their wgmmas): barrier addresses and matrix
 * descriptors computed once, stepped by constant offsets. Wide tiles: warpgroup wg rows
 * (wg-1)*64 .. +64 by the tile's 256 weight rows, two halves (chunks 2h, 2h+1 of half h; 128
 * total registers and 64 of blk, where an m64n256 block would need 256). NARROW (tiles of
 * NARROW_ROWS rows): both all 64 rows, warpgroup wg by half wg-1 of the tile's 256 weight rows
 * (chunks 2(wg-1), +1). In a half, columns i < 8 are its first chunk's. */
template <int EPI, bool NARROW, bool CLUSTER = false>
__device__ __forceinline__ void consume_fp8(const gemm_params &p, uint32_t sbase, uint32_t full, uint32_t empty,
                                            uint32_t scales, int64_t total, int k_blocks, int wg, int tid) {
    const int rank = CLUSTER ? (int)cluster_rank() : 0; /* CLUSTER: the last pair's shadow too (produce) */
    typedef ring<uint8_t, NARROW> R;
    constexpr int HALVES = NARROW ? 1 : 2, ACC = 64 * HALVES, SPLIT = 8;
    constexpr uint32_t HALF_STEP = 128 * 128 / 16; /* a half's weight rows in descriptor units */
    const int warp = tid / 32, lane = tid % 32;
    const int r0 = (NARROW ? 0 : (wg - 1) * 64) + warp * 16 + lane / 4; /* the thread's rows r0, r0 + 8 */
    const int a_off = NARROW ? 0 : (wg - 1) * (64 * 128), b_off = NARROW ? (wg - 1) * (128 * 128) : 0;
    const uint32_t a_lo = smem_desc_lo(sbase + a_off), b_lo = smem_desc_lo(sbase + A_BYTES + b_off);
    /* the scale slot's words this thread reads: its rows, then the chunks' block scales (half h:
     * s_w + 8h and + 4) */
    const uint32_t s_r0 = scales + r0 * 4, s_r1 = s_r0 + 32;
    const uint32_t s_w = scales + (128 + (NARROW ? 2 * (wg - 1) : 0)) * 4;
    int stage = 0, phase = 0, parity = 0;
    float acc[ACC], blk[64];
    tile tl = {};
    /* NARROW: the amax exchange of epilogue_fp8_h_quant, after the scale slots */
    const uint32_t xa = scales + R::stages * (FP8_SCALES * 4);
    /* wide tiles: b, b + grid, ... below total (CLUSTER: the last pair's shadow too);
     * NARROW (chained<uint8_t, NARROW>()): the producer's, until the last k-block's slot says the
     * tile was the block's last */
    for (int64_t t = blockIdx.x; NARROW || t - rank < total; t += gridDim.x, parity ^= 1) {
#pragma unroll
        for (int i = 0; i < ACC; i++) acc[i] = 0.0f;
        for (int kb = 0; kb < k_blocks; kb++) {
            mbar_wait_at(full + 8 * stage, phase);
            const uint32_t so = stage * (FP8_SCALES * 4), step = stage * (R::stage_bytes / 16);
            const float ra0 = lds_f32(s_r0 + so), ra1 = lds_f32(s_r1 + so);
            if (kb == k_blocks - 1) tl = get_tile(tile_slot(full, stage)); /* for the epilogue, while held */
#pragma unroll
            for (int h = 0; h < HALVES; h++) {
                const float wa = lds_f32(s_w + 8 * h + so), wb = lds_f32(s_w + 8 * h + 4 + so);
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < FP8_BK / 32; s++)
                    wgmma_128(blk, desc_of(a_lo + step + 2 * s), desc_of(b_lo + h * HALF_STEP + step + 2 * s), s > 0,
                              (uint8_t *)nullptr);
                wgmma_commit();
                wgmma_wait<0>();
                fence_acc(blk);
                if (h == HALVES - 1) {
                    if (tid == 0) release_at<CLUSTER>(empty + 8 * stage);
                    if (++stage == R::stages) stage = 0, phase ^= 1;
                }
                const float s00 = ra0 * wa, s01 = ra0 * wb, s10 = ra1 * wa, s11 = ra1 * wb;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const float sh0 = i < SPLIT ? s00 : s01, sh1 = i < SPLIT ? s10 : s11;
                    float *a = acc + 64 * h + 4 * i;
                    a[0] = fmaf(blk[4 * i], sh0, a[0]);
                    a[1] = fmaf(blk[4 * i + 1], sh0, a[1]);
                    a[2] = fmaf(blk[4 * i + 2], sh1, a[2]);
                    a[3] = fmaf(blk[4 * i + 3], sh1, a[3]);
                }
            }
        }
        bool quantized = false;
        if constexpr (EPI == EPI_GATE_UP_CONCAT)
            if (p.cq) {
                if constexpr (NARROW)
                    epilogue_fp8_h_quant(acc, tl, p, wg, tid, xa + parity * (FP8_AMAX_BYTES / 2));
                else
                    epilogue_fp8_h_quant_wide(acc, tl, p, wg, tid);
                quantized = true;
            }
        if (!quantized) epilogue_fp8<EPI, NARROW>(acc, tl, p, wg, tid);
        if (NARROW) { /* both warpgroups store a part of every tile: 8 warps count it */
            signal_tile_done(p.done, tl.e, lane);
            if (tl.last) break;
        }
    }
}

/* ---- the kernel ------------------------------------------------------------------- */

/* One producer warpgroup (setmaxnreg'd down; one thread issues the copies, or with GATHER all
 * 128 copy A's rows: produce_gathered) and CONSUMERS warpgroups: the float consumers, or the FP8 ones for
 * T = uint8_t. This is the body of every kernel of the family: the __global__ templates below
 * (built with the library) and the kernels compiled at run time (gemm_rtc.c), which may fix the
 * input size: SHAPE_K, when not 0, is K (p.K is then not read), so that the k-loop's trip count
 * is a constant. GATHER: A's rows gathered by index inside the GEMM (produce_gathered). CLUSTER
 * (FP8 wide tiles, TMA A-load): launched in clusters of two blocks that share boxes
 * (cluster_rank); the empty barriers count both blocks' consumers, and no block leaves while the
 * other may still write into its shared memory or arrive on its barriers. */
template <typename T, int EPI, bool OVERLAP, bool NARROW, long long SHAPE_K = 0, bool GATHER = false,
          bool CLUSTER = false>
__device__ __forceinline__ void grouped_gemm_body(const CUtensorMap &map_a, const CUtensorMap &map_b,
                                                  const gemm_params &p) {
    static_assert(!CLUSTER || (is_fp8<T>() && !NARROW && !GATHER), "clusters: FP8 wide tiles with the TMA A-load");
    /* a GEMM launched after this one with programmatic dependent launch (the chained down GEMM)
     * may take each SM this kernel leaves; it waits for its inputs itself (wait_rows_done) */
    if constexpr (chained<T, NARROW>()) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (p.skip_tiles_at_most && p.mtile_off[p.e_end] - p.mtile_off[p.e_begin] <= p.skip_tiles_at_most) return;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    typedef ring<T, NARROW> R;
    uint64_t *full = (uint64_t *)(smem + R::stages * R::stage_bytes), *empty = full + R::stages;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        /* FP8: the copies' arrival and one a lane of the scale warp (produce_scales); GATHER: the
         * weights' and one a producer thread */
        for (int s = 0; s < R::stages; s++) {
            mbar_init(&full[s], is_fp8<T>() ? 33 : GATHER ? 129 : 1);
            /* float NARROW: one warpgroup a tile; CLUSTER: both blocks' consumers */
            mbar_init(&empty[s], is_fp8<T>() || !NARROW ? CONSUMERS * (CLUSTER ? 2 : 1) : 1);
        }
        if constexpr (is_fp8<T>() && NARROW) /* the tile ring: the producer's arrival an entry */
            for (int i = 0; i < TILE_RING; i++) mbar_init_at(fp8_tile_ring(smem_addr(full), R::stages) + i * 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CLUSTER)
        cluster_sync(); /* the other block's barriers are ready before this one's copies or arrivals */
    else
        __syncthreads();
    const int64_t total = (int64_t)(p.mtile_off[p.e_end] - p.mtile_off[p.e_begin]) * p.n_tiles;
    /* every role below expects a first tile (CLUSTER: the pair's first; both blocks alike) */
    if ((int64_t)blockIdx.x - (CLUSTER ? (int64_t)cluster_rank() : 0) >= total) return;
    const int64_t K = SHAPE_K ? (int64_t)SHAPE_K : p.K;
    const int k_blocks = (int)((K + k_block<T>() - 1) / k_block<T>());
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
        if constexpr (GATHER) {
            produce_gathered<T, EPI, NARROW>(map_b, p, smem, full, empty, total, k_blocks, K, tid);
            return;
        }
        if (tid == 0) produce<T, EPI, NARROW, CLUSTER>(map_a, map_b, p, smem, full, empty, total, k_blocks);
        if constexpr (is_fp8<T>())
            if (tid / 32 == 1)
                produce_scales<EPI, NARROW, CLUSTER>(p, smem_addr(full) + 128, smem_addr(full), smem_addr(empty),
                                                     total, k_blocks, tid % 32);
        /* CLUSTER: the producer's threads leave; the consumers below wait for both blocks' */
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    if constexpr (is_fp8<T>())
        consume_fp8<EPI, NARROW, CLUSTER>(p, smem_addr(smem), smem_addr(full), smem_addr(empty),
                                          smem_addr(full) + 128, total, k_blocks, wg, tid);
    else
        consume_float<T, EPI, OVERLAP, NARROW, GATHER>(p, smem, full, empty, total, k_blocks, wg, tid);
    /* every stage both blocks fill is consumed in each (the pairs' k-blocks are the same), so once
     * both blocks' consumers are here, nothing writes to or arrives in either */
    if constexpr (CLUSTER) cluster_sync();
}

template <typename T, int EPI, bool OVERLAP, bool NARROW, bool CLUSTER = false>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                        gemm_params p) {
    grouped_gemm_body<T, EPI, OVERLAP, NARROW, 0, false, CLUSTER>(map_a, map_b, p);
}

/* The same with the gathered A-load (sonicmoe's gate/up GEMM): map_a is not read. */
template <typename T, int EPI, bool OVERLAP, bool NARROW>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_gemm_gather_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                               gemm_params p) {
    grouped_gemm_body<T, EPI, OVERLAP, NARROW, 0, true>(map_a, map_b, p);
}

} // namespace

#endif
