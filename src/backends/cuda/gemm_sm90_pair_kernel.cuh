/* gemm_sm90_pair_kernel.cuh — the device side of the pair GEMM (grouped_gemm_run_pair): both
 * projections of a row tile of one expert in one block, the intermediate h kept in shared memory.
 * Built from the grouped GEMM's pieces (gemm_sm90_kernel.cuh: TMA ring, tile list, wgmma, the
 * narrow tiles' ping-pong); included by gemm_sm90.cu, which launches it.
 *
 * A work item is a narrow row tile (NARROW_ROWS = 64 rows of one expert: the routing's tiles):
 *   gate/up: h [64, I] = SiLU(x W_gate^T) * (x W_up^T), x [64, H] the tile's rows of the hidden
 *            states, read by index inside the kernel (sonicmoe's gathered A-load); I / 128 tiles
 *            of 256 weight rows (128 gate + 128 up features, gemm_sm90.cu's boxes), K = H; each
 *            tile's 128 features are two k-blocks of h, written to shared memory in the layout a
 *            TMA copy of them would have (128-byte swizzle), rounded to T
 *   down:    y [64, H] = h W_down^T (times the rows' routing weights with row_scale), H / 256 tiles
 *            of 256 weight rows, K = I, A = h straight from shared memory; y stored from registers
 * The two consumer warpgroups take the block's tiles in turn (the narrow tiles' ping-pong: one's
 * epilogue runs while the other multiplies), so the weight stream does not stop between the two
 * projections and no kernel boundary, h round trip or second start lies between them. Two more
 * named barriers: H_READY (both warpgroups have written their features of h: before either
 * multiplies by it) and H_FREE (both have finished the previous item's down wgmmas: before
 * either overwrites h). Each warpgroup passes each once an item, which needs at least two
 * tiles of each projection (grouped_gemm_pair_pays). Numerically the same as the chained
 * narrow GEMMs: the same wgmmas in the same k order, h rounded to T once. A block whose row
 * tiles would be more than one a block of its launch's waves returns at once (pair_tiles_max):
 * the chained GEMMs launched after it take that routing (grouped_gemm_run_pair). */
#ifndef MOEX_GEMM_SM90_PAIR_KERNEL_CUH
#define MOEX_GEMM_SM90_PAIR_KERNEL_CUH

#include "backends/cuda/gemm_sm90_kernel.cuh"

namespace {

/* Ring stages: A (64 rows x 64 inputs) + B (256 weight rows x 64), 40 KiB; the down tiles' stages
 * use B only. h [64, GEMM_PAIR_MAX_I] after the ring, as k-blocks of 64 features (8 KiB each),
 * then the barriers and tile slots. 3 stages: 4 do not fit beside h of 768 features. */
constexpr int PAIR_STAGES = 3, PAIR_A_BYTES = NARROW_ROWS * BK * 2, PAIR_STAGE_BYTES = PAIR_A_BYTES + B_BYTES;
constexpr int PAIR_H_OFFSET = PAIR_STAGES * PAIR_STAGE_BYTES;
constexpr int PAIR_BAR_OFFSET = PAIR_H_OFFSET + GEMM_PAIR_MAX_I / BK * PAIR_A_BYTES;
constexpr int PAIR_SMEM_BYTES = PAIR_BAR_OFFSET + 128 + 1024; /* + the 1024-byte alignment of the base */
static_assert(PAIR_SMEM_BYTES <= 227 * 1024, "the pair GEMM's shared memory");
static_assert(2 * PAIR_STAGES * 8 + 16 * PAIR_STAGES <= 128 && 2 * PAIR_STAGES * 8 <= 64, "barriers and tile slots");
static_assert(PAIR_STAGE_BYTES % 1024 == 0 && PAIR_H_OFFSET % 1024 == 0, "128-byte swizzled tiles are 1024-aligned");
constexpr int PAIR_H_READY = 4, PAIR_H_FREE = 5; /* named barriers (2 and 3: turn_wait / turn_pass) */

__device__ __forceinline__ void pair_bar_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }

/* The tiles of an item: I / 128 gate/up tiles of H / BK k-blocks, then H / BN down tiles of I / BK. */
struct pair_shape {
    int n_gu, n_dn, kb_gu, kb_dn;
};
__device__ __forceinline__ pair_shape pair_shape_of(const gemm_params &p) {
    pair_shape s;
    s.n_gu = (int)(p.N / (BN / 2)), s.n_dn = (int)(p.K / BN), s.kb_gu = (int)(p.K / BK), s.kb_dn = (int)(p.N / BK);
    return s;
}

/* The producer warpgroup: every k-block of the block's items into the ring (items b, b + grid, ...
 * of the narrow row tiles; gemm_params: K = H, N = I, rows_per_expert and up_offset the gate/up
 * matrix's, n_tiles 1). All 128 threads copy each gate/up stage's A rows straight from the hidden
 * states with cp.async, row r of a tile being row a_index[a_row + r] (produce_gathered's pattern:
 * thread i copies piece i % 8 of rows i / 8 + 16 j to where the 128-byte swizzle puts it; rows
 * past the tile's are zero-filled); thread 0 also issues the weights by TMA. The full barriers
 * expect 129 arrivals: each thread's (its copies landed, or at once on a down stage) and thread
 * 0's with the weights' bytes. */
template <typename T>
__device__ __forceinline__ void produce_pair_gathered(const CUtensorMap &map_gu, const CUtensorMap &map_dn,
                                                      const gemm_params &p, unsigned char *smem, uint64_t *full,
                                                      uint64_t *empty, int64_t total, int tid) {
    const pair_shape sh = pair_shape_of(p);
    constexpr int GU_BOX = BN / 4, PASSES = NARROW_ROWS / 16;
    const int piece = tid % 8, r0 = tid / 8;
    const uint32_t swz = (uint32_t)((piece ^ (r0 % 8)) * 16); /* (r0 + 16 j) % 8 == r0 % 8 */
    const T *src = (const T *)p.gather;
    int stage = 0, phase = 0;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        const tile tl = find_tile<NARROW_ROWS>(p, t);
        const int gu_row = (int)(tl.e * p.rows_per_expert), dn_row = (int)(tl.e * p.K);
        const T *row[PASSES]; /* this thread's source rows (NULL past the tile's last) */
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            const int r = r0 + 16 * j;
            row[j] = r < tl.rows ? src + (int64_t)__ldg(p.a_index + tl.a_row + r) * p.gather_ld + piece * 8 : nullptr;
        }
        for (int n = 0; n < sh.n_gu + sh.n_dn; n++) {
            const bool gu = n < sh.n_gu;
            const int kbs = gu ? sh.kb_gu : sh.kb_dn;
            for (int kb = 0; kb < kbs; kb++) {
                mbar_wait(&empty[stage], phase ^ 1);
                unsigned char *a = smem + stage * PAIR_STAGE_BYTES, *b = a + PAIR_A_BYTES;
                if (tid == 0) {
                    put_tile(tile_slot(smem_addr(full), stage), tl);
                    mbar_expect_tx(&full[stage], B_BYTES);
                    if (gu) {
                        for (int q = 0; q < 4; q++)
                            tma_load(b + q * GU_BOX * 128, &map_gu, &full[stage], kb * BK,
                                     gu_row + (q & 1) * (int)p.up_offset + n * (BN / 2) + (q >> 1) * GU_BOX);
                    } else {
                        tma_load(b, &map_dn, &full[stage], kb * BK, dn_row + (n - sh.n_gu) * BN);
                    }
                }
                if (gu) {
                    const uint32_t dst = smem_addr(a) + (uint32_t)r0 * 128 + swz;
#pragma unroll
                    for (int j = 0; j < PASSES; j++)
                        cp_async16(dst + j * 16 * 128, row[j] ? row[j] + kb * BK : src, row[j] ? 16 : 0);
                    cp_async_arrive(&full[stage]);
                } else {
                    mbar_arrive(&full[stage]);
                }
                if (++stage == PAIR_STAGES) stage = 0, phase ^= 1;
            }
        }
    }
}

/* One half (64 gate and the 64 up columns with them: features f0 .. f0 + 63) of a gate/up tile's
 * accumulators as h, into its k-block of h at shared address kb_addr: row r's 16-byte piece q at
 * r * 128 + (q ^ r % 8) * 16, where a TMA copy with the 128-byte swizzle puts it (conflict-free:
 * the 8 rows of a store hit 8 different pieces). Rows past the tile's are written too: they are
 * finite or not, and only ever reach rows of y that are not stored. */
template <typename T>
__device__ __forceinline__ void pair_store_h(const float (&dh)[64], uint32_t kb_addr, int warp, int lane) {
    const int c0 = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
        for (int ii = 0; ii < 8; ii++) {
            const float g0 = dh[4 * ii + 2 * h], g1 = dh[4 * ii + 2 * h + 1];
            const float u0 = dh[4 * (ii + 8) + 2 * h], u1 = dh[4 * (ii + 8) + 2 * h + 1];
            const float v0 = __fdividef(g0, 1.0f + __expf(-g0)) * u0, v1 = __fdividef(g1, 1.0f + __expf(-g1)) * u1;
            sts4(kb_addr + (uint32_t)(r * 128 + ((ii ^ (r & 7)) << 4) + c0 * 2), pack_pair(v0, v1, (T *)nullptr));
        }
    }
}

/* 4 bytes to global memory if go (predicated: no branch some lanes take, see epilogue_half). */
__device__ __forceinline__ void stg4_if(void *p, uint32_t v, bool go) {
    asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n @q st.global.b32 [%0], %1;\n}\n" ::"l"(p), "r"(v),
                 "r"((uint32_t)go)
                 : "memory");
}

/* Down tile n's 64 x 256 outputs (d0: columns 0-127, d1: 128-255) of tile tl into y (p.c, row
 * stride H = p.K), times the row's factor with p.row_scale; rows past the tile's are not stored.
 * Each lane holds rows lane/4 and +8 of its warp's 16, columns 8i + c0, +1: stored as 4-byte pairs
 * (the 4 lanes of a row write 16 contiguous bytes). */
template <typename T>
__device__ __forceinline__ void pair_store_y(const float (&d0)[64], const float (&d1)[64], const tile &tl,
                                             const gemm_params &p, int n, int warp, int lane) {
    const int c0 = 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + lane / 4 + 8 * h;
        const bool in = r < tl.rows;
        const float rs = p.row_scale && in ? __ldg(p.row_scale + tl.a_row + r) : 1.0f;
        T *row = (T *)p.c + (int64_t)(tl.a_row + (in ? r : 0)) * p.K + n * BN + c0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            stg4_if(row + 8 * i, pack_pair(d0[4 * i + 2 * h] * rs, d0[4 * i + 2 * h + 1] * rs, (T *)nullptr), in);
            stg4_if(row + HALF_N + 8 * i, pack_pair(d1[4 * i + 2 * h] * rs, d1[4 * i + 2 * h + 1] * rs, (T *)nullptr),
                    in);
        }
    }
}

/* Warpgroup wg (1 or 2) takes the block's tiles g with g % 2 == wg - 1 (g counting every tile of
 * the block's items in order), all 64 rows by both halves of 128 weight rows, and skips the
 * other's stages in the ring; turn_wait / turn_pass order the k-loops as in consume_float's
 * NARROW form. */
template <typename T>
__device__ __forceinline__ void consume_pair(const gemm_params &p, unsigned char *smem, uint64_t *full,
                                             uint64_t *empty, int64_t total, int wg, int tid) {
    const pair_shape sh = pair_shape_of(p);
    const int lane = tid % 32, warp = tid / 32;
    const uint32_t h_base = smem_addr(smem + PAIR_H_OFFSET);
    int stage = 0, phase = 0;
    int64_t g = 0;
    float acc0[64], acc1[64];
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        bool h_free = false, h_ready = false;
        for (int n = 0; n < sh.n_gu + sh.n_dn; n++, g++) {
            const bool gu = n < sh.n_gu;
            const int kbs = gu ? sh.kb_gu : sh.kb_dn;
            if ((int)(g & 1) != wg - 1) {
                ring_skip(stage, phase, kbs, PAIR_STAGES);
                continue;
            }
            if (!gu && !h_ready) { /* this warpgroup's first down tile of the item: all of h is written */
                pair_bar_sync(PAIR_H_READY);
                h_ready = true;
            }
            if (g > 0) turn_wait(wg == 2 ? 2 : 3);
            tile tl = {};
            for (int kb = 0; kb < kbs; kb++) {
                wait_full<true>(&full[stage], phase); /* and the cp.async rows' proxy fence */
                if (kb == kbs - 1) tl = get_tile(tile_slot(smem_addr(full), stage));
                const unsigned char *st = smem + stage * PAIR_STAGE_BYTES;
                wgmma_k_block<T>(acc0, acc1, gu ? st : smem + PAIR_H_OFFSET + kb * PAIR_A_BYTES, st + PAIR_A_BYTES,
                                 kb > 0);
                /* each stage is freed as soon as its wgmmas are done: with 3 stages, holding one
                 * in flight while waiting for the next would leave the producer one stage ahead
                 * (the stream, not the tensor cores, sets the pace here) */
                wgmma_wait<0>();
                if (tid == 0) mbar_arrive(&empty[stage]);
                if (++stage == PAIR_STAGES) stage = 0, phase ^= 1;
            }
            fence_acc(acc0);
            fence_acc(acc1);
            turn_pass(wg == 1 ? 2 : 3);
            if (gu) {
                if (!h_free) { /* the first write of h this item: the previous item's down wgmmas are done */
                    pair_bar_sync(PAIR_H_FREE);
                    h_free = true;
                }
                pair_store_h<T>(acc0, h_base + (uint32_t)(2 * n) * PAIR_A_BYTES, warp, lane);
                pair_store_h<T>(acc1, h_base + (uint32_t)(2 * n + 1) * PAIR_A_BYTES, warp, lane);
                fence_proxy_async(); /* these generic-proxy writes, before the down wgmmas' reads */
            } else {
                pair_store_y<T>(acc0, acc1, tl, p, n - sh.n_gu, warp, lane);
            }
        }
    }
    /* the last tile's turn_pass, taken by the other warpgroup: no named barrier is left half-arrived */
    if (g > 0 && (int)((g - 1) & 1) != wg - 1) turn_wait(wg == 2 ? 2 : 3);
}

/* One producer warpgroup (produce_pair_gathered) and two consumer warpgroups, a persistent grid
 * over the narrow row tiles of experts [e_begin, e_end). map_gu: the gate/up weights [E * 2I, H],
 * boxes of 64 rows; map_dn: the down weights [E * H, I], boxes of 256. */
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_gemm_pair_kernel(const __grid_constant__ CUtensorMap map_gu, const __grid_constant__ CUtensorMap map_dn,
                             gemm_params p) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(smem + PAIR_BAR_OFFSET), *empty = full + PAIR_STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < PAIR_STAGES; s++) {
            mbar_init(&full[s], 129);
            mbar_init(&empty[s], 1); /* one warpgroup a tile */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int64_t total = (int64_t)(p.mtile_off[p.e_end] - p.mtile_off[p.e_begin]);
    /* more row tiles than the waves it was launched for (experts of more than 64 rows): a block's
     * extra tile would cost a whole expert's stream; the chained GEMMs launched after it take them */
    if ((int64_t)blockIdx.x >= total || total > (int64_t)p.pair_tiles_max) return;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
        produce_pair_gathered<T>(map_gu, map_dn, p, smem, full, empty, total, tid);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    consume_pair<T>(p, smem, full, empty, total, wg, tid);
}

} // namespace

#endif
