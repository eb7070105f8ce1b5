/* gemm_sm90_decode.cu — grouped_mm's GEMMs for experts of a few rows (decode batches; where
 * grouped_gemm_decode_pays in gemm_sm90.cuh), FP8 and bf16/f16, with the operands' roles swapped:
 * the weights are wgmma's 64-row A operand and an expert's rows of activations (up to
 * GEMM_DECODE_ROWS of them) its B operand, so that one wgmma m64n16 (k32 FP8, k16 bf16/f16)
 * multiplies 2 KiB of weights and nothing unpacks FP8 codes. The stream is the grouped GEMM's
 * (gemm_sm90_kernel.cuh: TMA into a ring of stages with full and empty mbarriers, the tile list
 * from the routing, each stage's tile in its slot); the consumers and epilogues are this file's.
 * The probe beside it, bench/probes/decode_wgmma.cu, streamed FP8 weights this way at 0.92-0.97
 * of a sequential read on an H100, where the mma.sync streamed forward (gemv_mma.cu) reaches
 * 0.66-0.73 of the read floor.
 *
 * Shapes: A [rows, K] e4m3 codes with scales [rows, K/128] (x or h quantized per 128 inputs) or
 * bf16/f16 (the weights' dtype), the rows of expert e at offsets[e] .. ends[e]; W [E *
 * rows_per_expert, K] e4m3 with 128-input block scales, or bf16/f16. A k-block is 128 bytes of a
 * row: 128 FP8 inputs, 64 bf16/f16 ones. A tile is one group of GEMM_DECODE_ROWS rows of one
 * expert (the routing's tiles of that height) by 128 output features; warpgroup w of the two
 * consumer warpgroups takes features 64 w .. 64 w + 63. A stage is one k-block:
 *   gate/up (EPI_GATE_UP_CONCAT): the gate rows and the up rows of the 128 features (four boxes
 *     of 64 rows: gate w0, up w0, gate w1, up w1) and the group's 16 rows of x;
 *   down (EPI_DOWN): the tile's 128 weight rows (two boxes of 64) and the group's 16 rows of h.
 * Each k-block: four wgmma steps. FP8: into a block accumulator d [64 features x 16 rows] (a
 * second for up), then acc += d * weight scale * row scale (the promotion once per 128 inputs
 * that the wide tiles do); bf16/f16: into acc directly. Epilogues: gate/up h = act(gate + bias,
 * up + bias), FP8 quantized per row per 128 features (the tile's 128 features: act_quant_e4m3's
 * rounding; the amax of each row exchanged between the eight consumer warps through shared
 * memory) into codes [rows, I] and scales [rows, I/128], bf16/f16 rounded into [rows, I]; down
 * y = acc + bias, f32 (FP8) or the weights' dtype [rows, H]. Rows of the group past the
 * expert's last are multiplied (they are other experts' rows, or zeros past the buffer) and never
 * stored.
 *
 * accumulator layout (wgmma m64n16, f32): thread (warp w4 of the warpgroup, lane l) holds d[4 j +
 * 2 h + c] = feature 16 w4 + l / 4 + 8 h, row 8 j + 2 (l % 4) + c of the group (j, h, c in 0..1). */
#include "backends/cuda/gemm_sm90_kernel.cuh"
#include "gpu/cuda_check.h"

#include <cuda_fp8.h>

namespace {

constexpr int DROWS = GEMM_DECODE_ROWS, DKB = 128 /* bytes of a row a k-block */, DBOX = 64, DTHREADS = 384;
static_assert(DROWS == 16, "the consumers hold a group of 16 rows (m64n16)");

template <int EPI> struct decode_ring {
    static constexpr int w_rows = EPI == EPI_DOWN ? 128 : 256; /* weight rows a stage */
    static constexpr int stage_bytes = w_rows * DKB + DROWS * DKB; /* multiples of 1024 */
    static constexpr int stages = EPI == EPI_DOWN ? 4 : 3;         /* the tile slots hold 4 */
    /* after the stages: 128 bytes of barriers and tile slots, then (gate/up) the rows' amax of the
     * eight consumer warps, two tiles by parity: 2 x 8 x 16 floats */
    static constexpr int bars = stages * stage_bytes, amax = bars + 128;
    static constexpr int smem_bytes = amax + 2 * 8 * DROWS * 4 + 1024; /* + alignment to 1024 */
};
static_assert(2 * 4 * 8 + 16 * 4 <= 128, "barriers and tile slots");

/* d[64 x 16] (+)= A[64 x k] . B[16 x k]^T, both K-major in shared memory, 32 bytes of each row:
 * e4m3 k32, bf16 or f16 k16. */
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int accumulate, uint8_t *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int accumulate, __nv_bfloat16 *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int accumulate, __half *) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void fence_d(float (&d)[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* The four steps of a k-block: weights at sa, rows at sb (128-byte swizzled rows); accumulate: the
 * first step adds to d. */
template <typename T>
__device__ __forceinline__ void wgmma_k_block16(float (&d)[8], uint32_t sa, uint32_t sb, int accumulate) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wgmma_n16(d, desc_of(smem_desc_lo(sa + 32 * kk)), desc_of(smem_desc_lo(sb + 32 * kk)), accumulate || kk > 0,
                  (T *)nullptr);
}

/* Thread 0 of warpgroup 0: every k-block of the block's tiles (b, b + grid, ...). */
template <int EPI, typename T>
__device__ __forceinline__ void decode_produce(const CUtensorMap &map_w, const CUtensorMap &map_a, const gemm_params &p,
                                               uint32_t smem, uint32_t full, uint32_t empty, int64_t total,
                                               int k_blocks) {
    typedef decode_ring<EPI> R;
    int stage = 0, phase = 0;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        const tile tl = find_tile<DROWS>(p, t);
        const int64_t w_row = tl.e * p.rows_per_expert + (int64_t)tl.n * 128;
        for (int kb = 0; kb < k_blocks; kb++) {
            mbar_wait_at(empty + 8 * stage, phase ^ 1);
            const uint32_t bar = full + 8 * stage, dst = smem + stage * R::stage_bytes;
            put_tile(tile_slot(full, stage), tl);
            mbar_expect_tx_at(bar, R::stage_bytes);
            for (int q = 0; q < R::w_rows / DBOX; q++) {
                /* gate/up: box q is (warpgroup q / 2, gate or up by q % 2); down: rows 64 q */
                const int64_t row = EPI == EPI_DOWN ? w_row + DBOX * q : w_row + (q & 1) * p.up_offset + DBOX * (q >> 1);
                tma_load_at(dst + q * DBOX * DKB, &map_w, bar, kb * k_block<T>(), (int)row);
            }
            tma_load_at(dst + R::w_rows * DKB, &map_a, bar, kb * k_block<T>(), tl.a_row);
            if (++stage == R::stages) stage = 0, phase ^= 1;
        }
    }
}

/* The scales of k-block kb for a consumer thread: its weight chunk's (gate and up, or down) times
 * each of its four rows' (row 8 j + 2 (lane % 4) + c at index 2 j + c; rows past the tile's read
 * its last row's). */
template <int EPI>
__device__ __forceinline__ void decode_scales(const gemm_params &p, const tile &tl, int wg, int lane, int kb,
                                              float (&sg)[4], float (&su)[4]) {
    const quant_view &Q = p.Q;
    /* the chunk's first feature (a chunk past the last feature, of a partial down tile, reads the
     * last feature's scale: its sums are never stored) */
    const int64_t f = (int64_t)tl.n * 128 + 64 * wg < p.N ? (int64_t)tl.n * 128 + 64 * wg : p.N - 1;
    const uint32_t col = (uint32_t)(kb / p.kstep);
    float wg_s, wu_s = 0.0f;
    if (EPI == EPI_DOWN) {
        wg_s = scale_load(Q.sdt, Q.down.base, scale_row(Q, Q.down, tl.e, f) + col);
    } else {
        wg_s = scale_load(Q.sdt, Q.gate.base, scale_row(Q, Q.gate, tl.e, f) + col);
        wu_s = scale_load(Q.sdt, Q.up.base, scale_row(Q, Q.up, tl.e, f) + col);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = 8 * (i / 2) + 2 * (lane % 4) + i % 2;
        const float rs = __ldg(p.a_scale + (int64_t)(tl.a_row + (r < tl.rows ? r : tl.rows - 1)) * p.a_sld + kb / p.kstep);
        sg[i] = wg_s * rs;
        su[i] = wu_s * rs;
    }
}

/* Gate/up epilogue: h of the thread's 2 features x 4 rows, then each row's amax over the tile's
 * 128 features (warp shuffles over the 8 lanes of a row, then the 8 warps' maxima through
 * shared memory at amax_at, a buffer per tile parity), codes and scales. */
__device__ __forceinline__ void decode_epilogue_gate_up(const gemm_params &p, const tile &tl, int wg, int warp,
                                                        int lane, const float (&ag)[8], const float (&au)[8],
                                                        uint32_t amax_at) {
    const layer_view &L = p.L;
    const int64_t f0 = (int64_t)tl.n * 128 + 64 * wg + 16 * warp + lane / 4;
    float bg[2], bu[2];
#pragma unroll
    for (int h = 0; h < 2; h++) bg[h] = bias_at(L.gate_bias, L.bdt, tl.e, f0 + 8 * h), bu[h] = bias_at(L.up_bias, L.bdt, tl.e, f0 + 8 * h);
    float v[8], m[4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float a = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = 4 * j + 2 * h + c;
                v[i] = activate(L, ag[i] + bg[h], au[i] + bu[h]);
                a = fmaxf(a, fabsf(v[i]));
            }
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16));
            m[2 * j + c] = a;
        }
    const int w8 = 4 * wg + warp, r0 = 2 * (lane % 4);
    if (lane < 4)
#pragma unroll
        for (int i = 0; i < 4; i++) sts_f32(amax_at + (w8 * DROWS + 8 * (i / 2) + r0 + i % 2) * 4, m[i]);
    asm volatile("bar.sync 1, 256;" ::: "memory"); /* the eight consumer warps */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = 0.0f;
        for (int w = 0; w < 8; w++) a = fmaxf(a, lds_f32(amax_at + (w * DROWS + 8 * (i / 2) + r0 + i % 2) * 4));
        m[i] = a > 0.0f ? a / 448.0f : 1.0f; /* act_quant_e4m3's scale */
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = 8 * (i / 2) + r0 + i % 2;
        if (r >= tl.rows) continue;
        const int64_t row = tl.a_row + r;
        const int j = i / 2, c = i % 2;
#pragma unroll
        for (int h = 0; h < 2; h++)
            p.cq[row * p.N + f0 + 8 * h] =
                (uint8_t)__nv_cvt_float_to_fp8(v[4 * j + 2 * h + c] / m[i], __NV_SATFINITE, __NV_E4M3);
        if (wg == 0 && warp == 0 && lane < 4) p.cs[row * p.cs_ld + tl.n] = m[i];
    }
}

/* bf16/f16 gate/up epilogue: h = act(gate + bias, up + bias) of the thread's 2 features x 4 rows,
 * rounded to T (SiLU without biases: the wide tiles' fast form, stage_chunk's). */
template <typename T>
__device__ __forceinline__ void decode_epilogue_gate_up16(const gemm_params &p, const tile &tl, int wg, int warp,
                                                          int lane, const float (&ag)[8], const float (&au)[8]) {
    const layer_view &L = p.L;
    const bool silu = !L.gate_bias.base && !L.up_bias.base && L.act == MOEX_ACT_SILU;
    const int64_t f0 = (int64_t)tl.n * 128 + 64 * wg + 16 * warp + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t f = f0 + 8 * h;
        const float bg = silu ? 0.0f : bias_at(L.gate_bias, L.bdt, tl.e, f), bu = silu ? 0.0f : bias_at(L.up_bias, L.bdt, tl.e, f);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 8 * (i / 2) + 2 * (lane % 4) + i % 2;
            const float g = ag[4 * (i / 2) + 2 * h + i % 2], u = au[4 * (i / 2) + 2 * h + i % 2];
            const float v = silu ? __fdividef(g, 1.0f + __expf(-g)) * u : activate(L, g + bg, u + bu);
            if (r < tl.rows) store_one((T *)p.c + (int64_t)(tl.a_row + r) * p.N + f, v);
        }
    }
}

/* Down epilogue: y = acc + bias of the thread's 2 features x 4 rows, f32 (FP8) or T. */
template <typename T>
__device__ __forceinline__ void decode_epilogue_down(const gemm_params &p, const tile &tl, int wg, int warp, int lane,
                                                     const float (&acc)[8]) {
    const layer_view &L = p.L;
    const int64_t f0 = (int64_t)tl.n * 128 + 64 * wg + 16 * warp + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t f = f0 + 8 * h;
        if (f >= p.N) continue;
        const float b = bias_at(L.down_bias, L.bdt, tl.e, f);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 8 * (i / 2) + 2 * (lane % 4) + i % 2;
            if (r >= tl.rows) continue;
            const int64_t at = (int64_t)(tl.a_row + r) * p.N + f;
            const float v = acc[4 * (i / 2) + 2 * h + i % 2] + b;
            if constexpr (is_fp8<T>())
                ((float *)p.c)[at] = v;
            else
                store_one((T *)p.c + at, v);
        }
    }
}

/* Consumer warpgroup wg (0 or 1): every k-block of the block's tiles, in the producer's order. */
template <int EPI, typename T>
__device__ __forceinline__ void decode_consume(const gemm_params &p, uint32_t smem, uint32_t full, uint32_t empty,
                                               int64_t total, int k_blocks, int wg) {
    typedef decode_ring<EPI> R;
    constexpr bool GU = EPI != EPI_DOWN, FP8 = is_fp8<T>();
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    int stage = 0, phase = 0, parity = 0;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x, parity ^= 1) {
        /* FP8: ag/au the promoted sums, dg/du a k-block's; bf16/f16: the wgmmas add to ag/au */
        float ag[8], au[8], dg[8], du[8], sg[4], su[4];
#pragma unroll
        for (int i = 0; i < 8; i++) ag[i] = au[i] = dg[i] = du[i] = 0.0f;
        tile tl;
        for (int kb = 0; kb < k_blocks; kb++) {
            mbar_wait_at(full + 8 * stage, phase);
            if (kb == 0) {
                tl = get_tile(tile_slot(full, stage));
                if (FP8) decode_scales<EPI>(p, tl, wg, lane, 0, sg, su);
            }
            const uint32_t base = smem + stage * R::stage_bytes, rows = base + R::w_rows * DKB;
            const uint32_t w_at = base + (GU ? 2 * wg : wg) * DBOX * DKB;
            wgmma_fence();
            if (FP8) {
                wgmma_k_block16<T>(dg, w_at, rows, 0);
                if (GU) wgmma_k_block16<T>(du, w_at + DBOX * DKB, rows, 0);
            } else {
                wgmma_k_block16<T>(ag, w_at, rows, kb > 0);
                if (GU) wgmma_k_block16<T>(au, w_at + DBOX * DKB, rows, kb > 0);
            }
            wgmma_commit();
            float ng[4], nu[4]; /* FP8: the next k-block's scales, asked for while the wgmmas run */
            if (FP8 && kb + 1 < k_blocks) decode_scales<EPI>(p, tl, wg, lane, kb + 1, ng, nu);
            wgmma_wait<0>();
            if (FP8) {
                fence_d(dg);
                if (GU) fence_d(du);
            } else {
                fence_d(ag);
                if (GU) fence_d(au);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive_at(empty + 8 * stage);
            if (FP8) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int s = 2 * (i / 4) + i % 2; /* row 8 (i / 4) + 2 (lane % 4) + i % 2 */
                    ag[i] += dg[i] * sg[s];
                    if (GU) au[i] += du[i] * su[s];
                }
                if (kb + 1 < k_blocks)
#pragma unroll
                    for (int i = 0; i < 4; i++) sg[i] = ng[i], su[i] = nu[i];
            }
            if (++stage == R::stages) stage = 0, phase ^= 1;
        }
        if constexpr (!GU)
            decode_epilogue_down<T>(p, tl, wg, warp, lane, ag);
        else if constexpr (FP8)
            decode_epilogue_gate_up(p, tl, wg, warp, lane, ag, au, smem + R::amax + parity * 8 * DROWS * 4);
        else
            decode_epilogue_gate_up16<T>(p, tl, wg, warp, lane, ag, au);
    }
}

/* The kernel: warpgroup 0's thread 0 produces, warpgroups 1 and 2 consume. */
template <int EPI, typename T>
__global__ void __launch_bounds__(DTHREADS, 1) grouped_gemm_decode_kernel(const __grid_constant__ CUtensorMap map_w,
                                                                         const __grid_constant__ CUtensorMap map_a,
                                                                         const gemm_params p) {
    typedef decode_ring<EPI> R;
    extern __shared__ __align__(1024) unsigned char decode_smem[];
    const uint32_t smem = (smem_addr(decode_smem) + 1023) & ~1023u;
    const uint32_t full = smem + R::bars, empty = full + 8 * R::stages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < R::stages; s++) {
            mbar_init_at(full + 8 * s, 1);
            mbar_init_at(empty + 8 * s, 8); /* the eight consumer warps */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int64_t total = (int64_t)(p.mtile_off[p.e_end] - p.mtile_off[p.e_begin]) * p.n_tiles;
    const int k_blocks = (int)((p.K + k_block<T>() - 1) / k_block<T>());
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        if (threadIdx.x == 0) decode_produce<EPI, T>(map_w, map_a, p, smem, full, empty, total, k_blocks);
        return;
    }
    decode_consume<EPI, T>(p, smem, full, empty, total, k_blocks, wg - 1);
}

template <int EPI, typename T> cudaError_t decode_allow_smem(void) {
    return cudaFuncSetAttribute(grouped_gemm_decode_kernel<EPI, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                decode_ring<EPI>::smem_bytes);
}

template <int EPI, typename T>
void decode_launch(const CUtensorMap &map_w, const CUtensorMap &map_a, const gemm_params &p, int num_sms,
                   cudaStream_t s) {
    grouped_gemm_decode_kernel<EPI, T><<<num_sms, DTHREADS, decode_ring<EPI>::smem_bytes, s>>>(map_w, map_a, p);
}

template <typename T> void decode_launch_epi(const CUtensorMap &map_w, const CUtensorMap &map_a, const gemm_params &p,
                                             int num_sms, cudaStream_t s) {
    if (p.epi == EPI_DOWN)
        decode_launch<EPI_DOWN, T>(map_w, map_a, p, num_sms, s);
    else
        decode_launch<EPI_GATE_UP_CONCAT, T>(map_w, map_a, p, num_sms, s);
}

template <typename T> cudaError_t decode_allow_smem_both(void) {
    cudaError_t err = decode_allow_smem<EPI_GATE_UP_CONCAT, T>();
    return err ? err : decode_allow_smem<EPI_DOWN, T>();
}

} // namespace

moex_status grouped_gemm_decode_init(void) {
    cudaError_t err = decode_allow_smem_both<uint8_t>();
    if (!err) err = decode_allow_smem_both<__nv_bfloat16>();
    if (!err) err = decode_allow_smem_both<__half>();
    return moex_cuda_status(err, "decode GEMM shared memory size");
}

moex_status grouped_gemm_decode_run(const grouped_gemm_args *g, int num_sms, cudaStream_t s) {
    const bool gu = g->epi == EPI_GATE_UP_CONCAT, fp8 = g->dt == MOEX_E4M3;
    const bool fp8_ok = g->a_scales && g->q.on && g->q.bk == 128 && g->q.bn % 64 == 0 && (!gu || (g->c_codes && g->c_scales));
    const bool f16_ok = !g->a_scales && !g->q.on && g->c;
    if ((fp8 ? !fp8_ok : (g->dt != MOEX_BF16 && g->dt != MOEX_F16) || !f16_ok) || (!gu && g->epi != EPI_DOWN) ||
        !g->offsets || !g->ends || !g->mtile_off || g->a_index || g->row_scale || g->tickets || g->done ||
        g->wait_done || (gu && g->N % 128) || (!gu && fp8 && !g->c) || g->up_offset % 64)
        return moex_fail(MOEX_ERR_INTERNAL, "decode GEMM: FP8 (block_k 128, h quantized in the gate/up epilogue) or "
                         "bf16/f16 gate/up GEMMs of I a multiple of 128, or down GEMMs, the routing's tiles of %d rows",
                         GEMM_DECODE_ROWS);
    CUtensorMap map_w, map_a;
    moex_status st = grouped_gemm_tensor_map(&map_w, g->b, g->L.E * g->rows_per_expert, g->K, DBOX, g->dt, "weights");
    if (!st) st = grouped_gemm_tensor_map(&map_a, g->a, g->a_rows, g->K, DROWS, g->dt, "activations");
    if (st) return st;
    gemm_params p;
    memset(&p, 0, sizeof p);
    p.K = g->K, p.N = g->N;
    p.rows_per_expert = g->rows_per_expert, p.up_offset = g->up_offset;
    p.n_tiles = (g->N + 127) / 128;
    p.e_begin = g->e_begin, p.e_end = g->e_end;
    p.offsets = g->offsets, p.ends = g->ends, p.mtile_off = g->mtile_off;
    p.c = g->c, p.epi = g->epi, p.L = g->L;
    if (fp8) {
        p.a_scale = g->a_scales, p.a_sld = (g->K + g->q.bk - 1) / g->q.bk, p.kstep = (int)(g->q.bk / DKB);
        p.Q = g->q;
        p.cq = g->c_codes, p.cs = g->c_scales, p.cs_ld = (g->N + 127) / 128;
    }
    if (fp8)
        decode_launch_epi<uint8_t>(map_w, map_a, p, num_sms, s);
    else if (g->dt == MOEX_BF16)
        decode_launch_epi<__nv_bfloat16>(map_w, map_a, p, num_sms, s);
    else
        decode_launch_epi<__half>(map_w, map_a, p, num_sms, s);
    return MOEX_CUDA_LAUNCHED("decode GEMM kernel");
}
