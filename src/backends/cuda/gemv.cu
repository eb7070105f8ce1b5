/* gemv.cu — memory-bound expert kernels; see gemv.cuh.
 *
 * Shapes: x [*, H] (any float dtype, row stride x_ld), h [*, I] f32,
 * y [*, H] f32. One warp per output feature n; blocks of 8 warps cover 8
 * consecutive features; grid.y walks the groups. Vector path: 8 weights per
 * 16-byte load along k; scalar path: any strides. */
#include "backends/cuda/gemv.cuh"
#include "gpu/cuda_check.h"
#include <cuda_fp8.h>

enum { WARPS = 8, ROWS = 8, JCHUNK = 8 };

/* ---- element loads ---------------------------------------------------------- */

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float *f) {
    uint4 v = __ldg((const uint4 *)p);
    const __nv_bfloat162 *q = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(q[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void load8(const __half *p, float *f) {
    uint4 v = __ldg((const uint4 *)p);
    const __half2 *q = (const __half2 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(q[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float *f) {
    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

/* 8 e4m3 codes (FP8 weights: the code values; the block scale is applied per 8 by the caller). */
__device__ __forceinline__ void load8(const uint8_t *p, float *f) {
    const uint2 v = __ldg((const uint2 *)p);
    const uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3));
        const float2 t = __half22float2(h);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}

/* The 16 e4m3 codes of a 16-byte piece times x[0 .. 16), decoded pair by pair (no array of
 * them: the kernels below hold four pieces at once). */
__device__ __forceinline__ float dot16_e4m3(uint4 v, const float *x) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3));
        const float2 t = __half22float2(h);
        s += t.x * x[2 * i] + t.y * x[2 * i + 1];
    }
    return s;
}
__device__ __forceinline__ uint4 ldg16(const uint8_t *p) { return __ldg((const uint4 *)p); }

__device__ __forceinline__ int64_t input_row(const gemv_groups &G, int64_t r) {
    return G.pairs ? r / G.k : (int64_t)G.slot_token[r];
}

/* ---- gate/up + activation ------------------------------------------------------ */

/* Rows r0 .. r0+nr (nr <= R) of one group for feature n: h = act(gate . x, up . x). */
template <typename WT, typename XT, int R, bool VEC>
__device__ __forceinline__ void gate_up_rows(const layer_view &L, const gemv_groups &G, const XT *x, int64_t x_ld,
                                             float *h, int64_t e, int64_t n, int64_t r0, int nr, const WT *wu,
                                             const WT *wg, int lane) {
    const int64_t K = L.H;
    const XT *xr[R];
#pragma unroll
    for (int r = 0; r < R; r++) xr[r] = x + input_row(G, r0 + (r < nr ? r : nr - 1)) * x_ld;
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; r++) ag[r] = au[r] = 0.0f;
    if (VEC) {
#pragma unroll 4
        for (int64_t kk = lane * 8; kk < K; kk += 256) {
            float fu[8], fg[8], fx[8];
            load8(wu + kk, fu);
            if (L.gated) load8(wg + kk, fg);
#pragma unroll
            for (int r = 0; r < R; r++) {
                load8(xr[r] + kk, fx);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    au[r] += fu[i] * fx[i];
                    if (L.gated) ag[r] += fg[i] * fx[i];
                }
            }
        }
    } else {
        for (int64_t kk = lane; kk < K; kk += 32) {
            float u = to_f32(wu[kk * L.up.k_stride]);
            float gv = L.gated ? to_f32(wg[kk * L.gate.k_stride]) : 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float xv = to_f32(xr[r][kk]);
                au[r] += u * xv;
                ag[r] += gv * xv;
            }
        }
    }
    store_gate_up_rows<R>(L, h, e, n, r0, nr, ag, au, lane);
}

/* MAXR = 1: one row per group (pairs); else up to ROWS rows a pass, the
 * unrolled width picked from the rows left so that no row is loaded twice. */
template <typename WT, typename XT, int MAXR, bool VEC>
__global__ void __launch_bounds__(WARPS * 32, MAXR == 1 ? 3 : 2) gate_up_kernel(layer_view L, gemv_groups G, const XT *x, int64_t x_ld,
                                                              float *h) {
    if (MAXR == 1) asm volatile("griddepcontrol.launch_dependents;");
    const int lane = threadIdx.x & 31;
    const int64_t n = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5);
    if (n >= L.I) return;
    for (int64_t g = blockIdx.y; g < G.count; g += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, g, &lo, &hi);
        if (e < 0) continue;
        const WT *wu = (const WT *)proj_base(L.up, e, sizeof(WT)) + n * L.up.n_stride;
        const WT *wg = L.gated ? (const WT *)proj_base(L.gate, e, sizeof(WT)) + n * L.gate.n_stride : wu;
        for (int64_t r0 = lo; r0 < hi; r0 += MAXR) {
            const int nr = hi - r0 < MAXR ? (int)(hi - r0) : MAXR;
            if (MAXR == 1 || nr == 1)
                gate_up_rows<WT, XT, 1, VEC>(L, G, x, x_ld, h, e, n, r0, nr, wu, wg, lane);
            else if (nr == 2)
                gate_up_rows<WT, XT, 2, VEC>(L, G, x, x_ld, h, e, n, r0, nr, wu, wg, lane);
            else if (nr <= 4)
                gate_up_rows<WT, XT, 4, VEC>(L, G, x, x_ld, h, e, n, r0, nr, wu, wg, lane);
            else
                gate_up_rows<WT, XT, ROWS, VEC>(L, G, x, x_ld, h, e, n, r0, nr, wu, wg, lane);
        }
    }
}

/* One step of batched_mm's FP8 gate/up pairs: x's 16 inputs at xk (its quantized values) times the
 * 16 codes of up rows n, n + 1 and gate rows n, n + 1 (u0, u1, g0, g1), each scaled by its block
 * scale (su, sg), added into the four sums. */
template <typename XT>
__device__ __forceinline__ void fp8_pairs_step(const XT *xk, uint4 u0, uint4 u1, uint4 g0, uint4 g1,
                                               const float (&su)[2], const float (&sg)[2], float &au0, float &au1,
                                               float &ag0, float &ag1) {
    float fx[16];
    load8(xk, fx);
    load8(xk + 8, fx + 8);
    au0 += su[0] * dot16_e4m3(u0, fx);
    au1 += su[1] * dot16_e4m3(u1, fx);
    ag0 += sg[0] * dot16_e4m3(g0, fx);
    ag1 += sg[1] * dot16_e4m3(g1, fx);
}

/* batched_mm's first half, vector path: a warp computes features n and n+1 of one pair,
 * four weight rows (gate and up of each) in flight for every load of x; blocks of 8 warps
 * cover 16 features, so one token's 8 pairs of qwen3-30b-a3b fill one wave of the GPU.
 * FP8 weights (WT uint8_t): e4m3 codes with block scales, x the quantized inputs (f32). */
template <typename WT, typename XT>
__global__ void __launch_bounds__(WARPS * 32, 3) gate_up_pairs_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                       const XT *x, int64_t x_ld, float *h) {
    constexpr bool QUANT = sizeof(WT) == 1;
    constexpr int VW = QUANT ? 16 : 8; /* inputs a lane loads at once: 16 bytes of weights */
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int64_t n = 2 * (blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5));
    if (n >= L.I) return;
    const int two = n + 1 < L.I;
    const int64_t K = L.H;
    bool waited = !QUANT; /* FP8 (launched after the quantization of x): not yet */
    for (int64_t p = blockIdx.y; p < G.count; p += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, p, &lo, &hi);
        if (e < 0) continue;
        const WT *wu = (const WT *)proj_base(L.up, e, sizeof(WT)) + n * L.up.n_stride;
        const WT *wg = L.gated ? (const WT *)proj_base(L.gate, e, sizeof(WT)) + n * L.gate.n_stride : wu;
        const int64_t us = two ? L.up.n_stride : 0, gs = two ? L.gate.n_stride : 0;
        const XT *xr = x + (p / G.k) * x_ld;
        float au0 = 0, au1 = 0, ag0 = 0, ag1 = 0;
        uint32_t su[2] = {0, 0}, sg[2] = {0, 0}; /* FP8: the scale rows of features n and n + two */
        if (QUANT)
            for (int f = 0; f < 2; f++) {
                su[f] = scale_row(Q, Q.up, e, n + f * two);
                if (L.gated) sg[f] = scale_row(Q, Q.gate, e, n + f * two);
            }
        if (QUANT && !waited) { /* the first two steps' weights into L2 while x is quantized, then wait for x */
            for (int64_t kk = lane * VW; kk < K && kk < 64 * VW; kk += 32 * VW) {
                const uint8_t *bu = (const uint8_t *)(wu + kk), *bg = (const uint8_t *)(wg + kk);
                asm volatile("prefetch.global.L2 [%0];" ::"l"(bu));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(bu + us));
                if (L.gated) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(bg));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(bg + gs));
                }
            }
            pdl_wait();
            waited = true;
        }
        if constexpr (QUANT) {
            /* two steps of 16 codes a row a pass (a row's 16 in one block: bk a multiple of 16, scaled
             * once): the 8 rows' loads and their scales are issued before any is used, with no branch
             * between them (gate rows are the up rows when ungated, a second step past K the first
             * again: their sums are never used) */
            const uint8_t *bu = (const uint8_t *)wu, *bg = (const uint8_t *)wg;
            const int64_t gs2 = L.gated ? gs : us;
            const void *gbase = L.gated ? Q.gate.base : Q.up.base;
            const uint32_t gr[2] = {L.gated ? sg[0] : su[0], L.gated ? sg[1] : su[1]};
#pragma unroll 1
            for (int64_t kk = lane * VW; kk < K; kk += 64 * VW) {
                const bool two_steps = kk + 32 * VW < K;
                const int64_t k2 = two_steps ? kk + 32 * VW : kk;
                const uint4 a0 = ldg16(bu + kk), a1 = ldg16(bu + us + kk), a2 = ldg16(bg + kk), a3 = ldg16(bg + gs2 + kk);
                const uint4 b0 = ldg16(bu + k2), b1 = ldg16(bu + us + k2), b2 = ldg16(bg + k2), b3 = ldg16(bg + gs2 + k2);
                float sa_u[2], sa_g[2], sb_u[2], sb_g[2];
                const uint32_t ka = (uint32_t)kk / (uint32_t)Q.bk, kb2 = (uint32_t)k2 / (uint32_t)Q.bk;
                scale_loads<2>(Q.sdt, Q.up.base, su, ka, sa_u);
                scale_loads<2>(Q.sdt, gbase, gr, ka, sa_g);
                scale_loads<2>(Q.sdt, Q.up.base, su, kb2, sb_u);
                scale_loads<2>(Q.sdt, gbase, gr, kb2, sb_g);
                fp8_pairs_step(xr + kk, a0, a1, a2, a3, sa_u, sa_g, au0, au1, ag0, ag1);
                if (two_steps) fp8_pairs_step(xr + k2, b0, b1, b2, b3, sb_u, sb_g, au0, au1, ag0, ag1);
            }
        } else {
#pragma unroll 1
            for (int64_t kk = lane * VW; kk < K; kk += 32 * VW) {
                float u0[8], u1[8], g0[8], g1[8], fx[8];
                load8(wu + kk, u0);
                load8(wu + us + kk, u1);
                if (L.gated) {
                    load8(wg + kk, g0);
                    load8(wg + gs + kk, g1);
                }
                load8(xr + kk, fx);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    au0 += u0[i] * fx[i];
                    au1 += u1[i] * fx[i];
                    if (L.gated) {
                        ag0 += g0[i] * fx[i];
                        ag1 += g1[i] * fx[i];
                    }
                }
            }
        }
        store_gate_up_pair(L, h, p, e, n, two, ag0, ag1, au0, au1, lane);
    }
}

/* ---- down, batched: fused weighted sum over the token's pairs ------------------- */

/* One step of a down kernel's lane: inputs kk .. kk + VW of NF weight rows of one expert (wd, rows
 * ns apart; rows past nf read row 0 again and are never stored) dotted with the pair's h row hr
 * (f32; FP8: the quantized values, each row's block scale from its scale row sr), added into acc.
 * Every row's loads (and FP8's scales) are issued before any is used, with no branch between them:
 * one would make each wait for the one before. VW: 16 FP8 codes or 8 wider values (16 bytes). */
template <typename WT, int NF>
__device__ __forceinline__ void down_rows_step(const WT *wd, int64_t ns, int nf, int64_t kk, const float *hr,
                                               const quant_view &Q, const uint32_t (&sr)[sizeof(WT) == 1 ? NF : 1],
                                               float (&acc)[NF]) {
    if constexpr (sizeof(WT) == 1) {
        uint4 r[NF];
        float sc[NF], fh[16];
#pragma unroll
        for (int f = 0; f < NF; f++) r[f] = ldg16((const uint8_t *)(wd + (f < nf ? f : 0) * ns + kk));
        scale_loads<NF>(Q.sdt, Q.down.base, sr, (uint32_t)kk / (uint32_t)Q.bk, sc);
        load8(hr + kk, fh);
        load8(hr + kk + 8, fh + 8);
#pragma unroll
        for (int f = 0; f < NF; f++) acc[f] += sc[f] * dot16_e4m3(r[f], fh);
    } else {
        float fw[NF][8], fh[8];
#pragma unroll
        for (int f = 0; f < NF; f++) load8(wd + (f < nf ? f : 0) * ns + kk, fw[f]);
        load8(hr + kk, fh);
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 8; i++) acc[f] += fw[f][i] * fh[i];
    }
}

/* Block: pairs_nf<WT>() consecutive features of one token; warp w takes pairs j = j0 + w. The
 * pair results meet in shared memory and are summed in j order (deterministic). FP8 takes 8
 * features a block: each warp reads its pair's h row (f32) once for all of them, so that h's
 * traffic through L2 is a quarter of the weights' bytes, not as much as them. */
template <typename WT> __host__ __device__ constexpr int pairs_nf() { return sizeof(WT) == 1 ? 8 : 4; }

/* Blocks an SM holds: as many as the registers of a lane's pairs_nf rows of weights in flight allow
 * (FP8 8 rows of 16 bytes, f32 4 of 32, bf16/f16 4 of 16) without spilling. */
template <typename WT> __host__ __device__ constexpr int pairs_blocks() { return sizeof(WT) == 1 ? 2 : sizeof(WT) == 4 ? 3 : 4; }

template <typename WT, bool VEC>
__global__ void __launch_bounds__(WARPS * 32, pairs_blocks<WT>())
    down_pairs_kernel(layer_view L, quant_view Q, gemv_groups G, const float *h, const void *w, moex_dtype wdt,
                      int64_t w_ld, void *out, moex_dtype odt, int64_t out_ld) {
    constexpr bool QUANT = sizeof(WT) == 1; /* FP8 codes (vector path only), h the quantized inputs */
    constexpr int VW = QUANT ? 16 : 8, NF = pairs_nf<WT>();
    __shared__ float part[WARPS][NF];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n0 = blockIdx.x * (int64_t)NF, K = L.I;
    const int nf = L.H - n0 < NF ? (int)(L.H - n0) : NF;
    bool waited = false;
    for (int64_t t = blockIdx.y; t < G.T; t += gridDim.y) {
        float acc = 0.0f; /* thread f < nf: feature n0 + f */
        for (int64_t j0 = 0; j0 < G.k; j0 += WARPS) {
            const int64_t j = j0 + warp;
            const int64_t e = j < G.k ? load_id(G.ids, G.ids64, G.ids_ld, t, j) : -1;
            const bool ok = e >= 0 && e < L.E;
            const WT *wd = (const WT *)proj_base(L.down, ok ? e : 0, sizeof(WT)) + n0 * L.down.n_stride;
            if (!waited) { /* pull the first weights into L2, then wait for h (programmatic dependency) */
                if (ok && VEC)
                    for (int f = 0; f < nf; f++)
                        for (int64_t b = lane * 128; b < K * (int64_t)sizeof(WT); b += 32 * 128)
                            asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(wd + f * L.down.n_stride) + b));
                pdl_wait();
                waited = true;
            }
            float p[NF];
#pragma unroll
            for (int f = 0; f < NF; f++) p[f] = 0.0f;
            if (ok) {
                const float *hr = h + (t * G.k + j) * K;
                uint32_t sr[QUANT ? NF : 1]; /* FP8: the features' scale rows */
                if constexpr (QUANT)
#pragma unroll
                    for (int f = 0; f < NF; f++) sr[f] = scale_row(Q, Q.down, e, n0 + (f < nf ? f : 0));
                if (VEC) {
                    /* NF rows' loads in flight a lane (down_rows_step): the loop is not unrolled */
#pragma unroll 1
                    for (int64_t kk = lane * VW; kk < K; kk += 32 * VW)
                        down_rows_step<WT, NF>(wd, L.down.n_stride, nf, kk, hr, Q, sr, p);
                } else if (!QUANT) {
                    for (int64_t kk = lane; kk < K; kk += 32)
                        for (int f = 0; f < nf; f++) p[f] += to_f32(wd[f * L.down.n_stride + kk * L.down.k_stride]) * hr[kk];
                }
#pragma unroll
                for (int f = 0; f < NF; f++) p[f] = warp_sum(p[f]);
            }
            float mine = 0.0f; /* lane f < NF: feature n0 + f (registers are not indexed by lane) */
#pragma unroll
            for (int f = 0; f < NF; f++)
                if (lane == f) mine = p[f];
            if (lane < NF)
                part[warp][lane] =
                    ok && lane < nf ? load_elem(w, wdt, t * w_ld + j) * (mine + bias_at(L.down_bias, L.bdt, e, n0 + lane))
                                    : 0.0f;
            __syncthreads();
            if (threadIdx.x < nf)
                for (int q = 0; q < WARPS; q++) acc += part[q][threadIdx.x];
            __syncthreads();
        }
        if (threadIdx.x < nf) store_elem(out, odt, t * out_ld + n0 + threadIdx.x, acc);
    }
    if (!waited) pdl_wait();
}

/* ---- down, per expert: y rows in slot order ------------------------------------- */

/* DNF features per warp in the streamed down projection of grouped_mm: four weight rows in
 * flight for each load of h (two reached 60% of the DRAM bandwidth on deepseek-v3). */
enum { DNF = 4 };

/* Features n .. n+nf (nf <= DNF) for rows r0 .. r0+nr (nr <= R). */
template <typename WT, int R, bool VEC>
__device__ __forceinline__ void down_rows(const layer_view &L, const float *h, float *y, int64_t n, int nf, int64_t r0,
                                          int nr, const WT *wd, const float *bias, int lane) {
    const int64_t K = L.I, ns = L.down.n_stride;
    float acc[R][DNF];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int f = 0; f < DNF; f++) acc[r][f] = 0.0f;
    if (VEC) {
#pragma unroll 2
        for (int64_t kk = lane * 8; kk < K; kk += 256) {
            float fw[DNF][8], fh[8];
#pragma unroll
            for (int f = 0; f < DNF; f++)
                if (f < nf) load8(wd + f * ns + kk, fw[f]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                load8(h + (r0 + (r < nr ? r : nr - 1)) * K + kk, fh);
#pragma unroll
                for (int f = 0; f < DNF; f++)
                    if (f < nf)
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[r][f] += fw[f][i] * fh[i];
            }
        }
    } else {
        for (int64_t kk = lane; kk < K; kk += 32) {
            float wv[DNF];
#pragma unroll
            for (int f = 0; f < DNF; f++) wv[f] = f < nf ? to_f32(wd[f * ns + kk * L.down.k_stride]) : 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float hv = h[(r0 + (r < nr ? r : nr - 1)) * K + kk];
#pragma unroll
                for (int f = 0; f < DNF; f++) acc[r][f] += wv[f] * hv;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int f = 0; f < DNF; f++)
            if (f < nf) acc[r][f] = warp_sum(acc[r][f]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr)
#pragma unroll
                for (int f = 0; f < DNF; f++)
                    if (f < nf) y[(r0 + r) * L.H + n + f] = acc[r][f] + bias[f];
}

template <typename WT, bool VEC>
__global__ void __launch_bounds__(WARPS * 32, 2) down_experts_kernel(layer_view L, gemv_groups G, const float *h,
                                                                      float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n = DNF * (blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5));
    if (n >= L.H) return;
    const int nf = L.H - n < DNF ? (int)(L.H - n) : DNF;
    for (int64_t g = blockIdx.y; g < G.count; g += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, g, &lo, &hi);
        if (e < 0) continue;
        const WT *wd = (const WT *)proj_base(L.down, e, sizeof(WT)) + n * L.down.n_stride;
        float bias[DNF];
#pragma unroll
        for (int f = 0; f < DNF; f++) bias[f] = f < nf ? bias_at(L.down_bias, L.bdt, e, n + f) : 0.0f;
        for (int64_t r0 = lo; r0 < hi; r0 += ROWS) {
            const int nr = hi - r0 < ROWS ? (int)(hi - r0) : ROWS;
            if (nr == 1)
                down_rows<WT, 1, VEC>(L, h, y, n, nf, r0, nr, wd, bias, lane);
            else if (nr == 2)
                down_rows<WT, 2, VEC>(L, h, y, n, nf, r0, nr, wd, bias, lane);
            else if (nr <= 4)
                down_rows<WT, 4, VEC>(L, h, y, n, nf, r0, nr, wd, bias, lane);
            else
                down_rows<WT, ROWS, VEC>(L, h, y, n, nf, r0, nr, wd, bias, lane);
        }
    }
}

/* ---- down, per pair into y: batched_mm's long rows ---------------------------------
 *
 * y[p, n .. n+NF) = down_e . h[p] + bias for pair p = blockIdx.y (e its expert), a warp per NF
 * features, blocks of WARPS warps, so that every warp of a block reads the same expert's matrix
 * (down_pairs_kernel's blocks read the token's k experts at once, which streams deepseek-v3's
 * down weights at 0.74 of the read rate where this reaches about 0.9). y[p] is weighted by the
 * pair's routing weight w[t, j] (as down_pairs_kernel weights each pair's part), a sentinel pair's
 * row 0, so the sum over each token's pairs in j order follows in routing_reduce. FP8 (WT
 * uint8_t): e4m3 codes, 16 a lane a step, scaled per block of bk inputs; h the quantized values. */
template <typename WT> __host__ __device__ constexpr int pair_rows_nf() { return sizeof(WT) == 1 ? 8 : 4; }
template <typename WT> __host__ __device__ constexpr int pair_rows_blocks() { return sizeof(WT) == 1 ? 2 : 4; }

template <typename WT>
__global__ void __launch_bounds__(WARPS * 32, pair_rows_blocks<WT>())
    down_pair_rows_kernel(layer_view L, quant_view Q, gemv_groups G, const float *h, const void *w, moex_dtype wdt,
                          int64_t w_ld, float *y) {
    constexpr bool QUANT = sizeof(WT) == 1;
    constexpr int NF = pair_rows_nf<WT>(), VW = QUANT ? 16 : 8;
    const int lane = threadIdx.x & 31;
    const int64_t n = NF * (blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5)), K = L.I, ns = L.down.n_stride;
    if (n >= L.H) return;
    const int nf = L.H - n < NF ? (int)(L.H - n) : NF;
    for (int64_t p = blockIdx.y; p < G.count; p += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, p, &lo, &hi);
        if (e < 0) { /* a sentinel pair adds nothing (its routing weight is not read) */
            if (lane < nf) y[p * L.H + n + lane] = 0.0f;
            continue;
        }
        const WT *wd = (const WT *)proj_base(L.down, e, sizeof(WT)) + n * ns;
        const float *hr = h + p * K;
        /* the pair's routing weight and the lane's bias: FP8 loads them before the loop, 16-bit and
         * f32 weights after it (each where ptxas then spills nothing) */
        float wp = 0.0f, bias = 0.0f;
        if constexpr (QUANT) {
            wp = load_elem(w, wdt, (p / G.k) * w_ld + p % G.k);
            bias = lane < nf ? bias_at(L.down_bias, L.bdt, e, n + lane) : 0.0f;
        }
        uint32_t sr[QUANT ? NF : 1]; /* FP8: the features' scale rows */
        if constexpr (QUANT)
#pragma unroll
            for (int f = 0; f < NF; f++) sr[f] = scale_row(Q, Q.down, e, n + (f < nf ? f : 0));
        float acc[NF];
#pragma unroll
        for (int f = 0; f < NF; f++) acc[f] = 0.0f;
#pragma unroll 2
        for (int64_t kk = lane * VW; kk < K; kk += 32 * VW) down_rows_step<WT, NF>(wd, ns, nf, kk, hr, Q, sr, acc);
        float mine = 0.0f; /* lane f < NF: feature n + f */
#pragma unroll
        for (int f = 0; f < NF; f++) {
            const float v = warp_sum(acc[f]);
            if (lane == f) mine = v;
        }
        if (lane < nf)
            y[p * L.H + n + lane] = QUANT ? wp * (mine + bias)
                                          : load_elem(w, wdt, (p / G.k) * w_ld + p % G.k) *
                                                (mine + bias_at(L.down_bias, L.bdt, e, n + lane));
    }
}

/* ---- launchers ------------------------------------------------------------------- */

static dim3 grid_of(int64_t features, int64_t groups) {
    return dim3((unsigned)((features + WARPS - 1) / WARPS), (unsigned)(groups < 65535 ? (groups > 0 ? groups : 1) : 65535));
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int proj_vec(const proj_view &p, size_t wsz, int64_t E) {
    if (p.k_stride != 1 || (p.n_stride * (int64_t)wsz) % 16 || (p.offset * (int64_t)wsz) % 16) return 0;
    if (p.ptrs) return 1; /* per-expert matrices: checked by the caller (alignment of each pointer) */
    return aligned16(p.base) && (p.expert_stride * (int64_t)wsz) % 16 == 0;
}

int gemv_vectorizable(const layer_view &L, size_t wsz) {
    return L.H % 8 == 0 && L.I % 8 == 0 && proj_vec(L.up, wsz, L.E) && (!L.gated || proj_vec(L.gate, wsz, L.E)) &&
           proj_vec(L.down, wsz, L.E);
}

template <typename WT, typename XT, int R>
static void launch_gate_up(const layer_view &L, const gemv_groups &G, const void *x, int64_t x_ld, float *h, int vec,
                           cudaStream_t s) {
    dim3 grid = grid_of(L.I, G.count);
    if (R == 1 && vec) /* pairs: two features per warp */
        gate_up_pairs_kernel<WT, XT><<<grid_of((L.I + 1) / 2, G.count), WARPS * 32, 0, s>>>(L, quant_view(), G,
                                                                                           (const XT *)x, x_ld, h);
    else if (vec)
        gate_up_kernel<WT, XT, R, true><<<grid, WARPS * 32, 0, s>>>(L, G, (const XT *)x, x_ld, h);
    else
        gate_up_kernel<WT, XT, R, false><<<grid, WARPS * 32, 0, s>>>(L, G, (const XT *)x, x_ld, h);
}

template <typename WT, int R>
static void gate_up_x(const layer_view &L, const gemv_groups &G, const void *x, moex_dtype xdt, int64_t x_ld, float *h,
                      int vec, cudaStream_t s) {
    if (xdt == MOEX_BF16)
        launch_gate_up<WT, __nv_bfloat16, R>(L, G, x, x_ld, h, vec, s);
    else if (xdt == MOEX_F16)
        launch_gate_up<WT, __half, R>(L, G, x, x_ld, h, vec, s);
    else
        launch_gate_up<WT, float, R>(L, G, x, x_ld, h, vec, s);
}

template <int R>
static void gate_up_w(const layer_view &L, const gemv_groups &G, const void *x, moex_dtype xdt, int64_t x_ld, float *h,
                      int vec, cudaStream_t s) {
    if (L.wdt == MOEX_BF16)
        gate_up_x<__nv_bfloat16, R>(L, G, x, xdt, x_ld, h, vec, s);
    else if (L.wdt == MOEX_F16)
        gate_up_x<__half, R>(L, G, x, xdt, x_ld, h, vec, s);
    else
        gate_up_x<float, R>(L, G, x, xdt, x_ld, h, vec, s);
}

static size_t wsize(moex_dtype dt) { return dt == MOEX_F32 ? 4 : dt == MOEX_E4M3 ? 1 : 2; }

int gemv_quant_usable(const layer_view &L, const quant_view &Q) {
    return L.wdt == MOEX_E4M3 && Q.on && Q.bk % 16 == 0 && L.H % 16 == 0 && L.I % 16 == 0 && gemv_vectorizable(L, 1);
}

moex_status gemv_gate_up(const layer_view &L, const gemv_groups &G, const void *x, moex_dtype xdt, int64_t x_ld,
                         float *h, cudaStream_t s) {
    int vec = gemv_vectorizable(L, wsize(L.wdt)) && aligned16(x) && (x_ld * (int64_t)wsize(xdt)) % 16 == 0;
    if (G.pairs)
        gate_up_w<1>(L, G, x, xdt, x_ld, h, vec, s);
    else
        gate_up_w<ROWS>(L, G, x, xdt, x_ld, h, vec, s); /* up to ROWS rows a pass */
    return MOEX_CUDA_LAUNCHED("gate/up kernel");
}

moex_status gemv_down_pairs(const layer_view &L, const gemv_groups &G, const float *h, const void *w, moex_dtype wdt,
                            int64_t w_ld, void *out, moex_dtype odt, int64_t out_ld, cudaStream_t s) {
    int vec = gemv_vectorizable(L, wsize(L.wdt));
    /* launched as a programmatic dependent of the gate/up kernel: its blocks start early,
     * pull their weights into L2 and wait (griddepcontrol.wait) for h */
    cudaLaunchAttribute attr;
    constexpr int nf = pairs_nf<float>(); /* the same for every float weight type */
    const cudaLaunchConfig_t cfg = dependent_launch(dim3((unsigned)((L.H + nf - 1) / nf), (unsigned)(G.T < 65535 ? G.T : 65535)),
                                                    dim3(WARPS * 32), s, &attr);
    cudaError_t err;
#define DOWN_PAIRS(WT)                                                                                               \
    err = vec ? cudaLaunchKernelEx(&cfg, down_pairs_kernel<WT, true>, L, quant_view(), G, h, w, wdt, w_ld, out, odt,    \
                                   out_ld)                                                                           \
              : cudaLaunchKernelEx(&cfg, down_pairs_kernel<WT, false>, L, quant_view(), G, h, w, wdt, w_ld, out, odt,   \
                                   out_ld)
    if (L.wdt == MOEX_BF16)
        DOWN_PAIRS(__nv_bfloat16);
    else if (L.wdt == MOEX_F16)
        DOWN_PAIRS(__half);
    else
        DOWN_PAIRS(float);
#undef DOWN_PAIRS
    return moex_cuda_status(err, "down kernel (pairs)");
}

moex_status gemv_down_experts(const layer_view &L, const gemv_groups &G, const float *h, float *y, cudaStream_t s) {
    int vec = gemv_vectorizable(L, wsize(L.wdt));
    dim3 grid = grid_of((L.H + DNF - 1) / DNF, G.count); /* DNF features per warp */
#define DOWN_EXPERTS(WT)                                                                                             \
    (vec ? down_experts_kernel<WT, true><<<grid, WARPS * 32, 0, s>>>(L, G, h, y)                                    \
         : down_experts_kernel<WT, false><<<grid, WARPS * 32, 0, s>>>(L, G, h, y))
    if (L.wdt == MOEX_BF16)
        DOWN_EXPERTS(__nv_bfloat16);
    else if (L.wdt == MOEX_F16)
        DOWN_EXPERTS(__half);
    else
        DOWN_EXPERTS(float);
#undef DOWN_EXPERTS
    return MOEX_CUDA_LAUNCHED("down kernel (experts)");
}

moex_status gemv_down_pair_rows(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *h,
                                const void *w, moex_dtype wdt, int64_t w_ld, float *y, cudaStream_t s) {
    const int quant = L.wdt == MOEX_E4M3;
    if (!G.pairs || (quant ? !gemv_quant_usable(L, Q) : !gemv_vectorizable(L, wsize(L.wdt))))
        return moex_fail(MOEX_ERR_INTERNAL, "down kernel (per pair): weights it does not take");
    const int nf = quant ? pair_rows_nf<uint8_t>() : pair_rows_nf<float>();
    const dim3 grid((unsigned)(((L.H + nf - 1) / nf + WARPS - 1) / WARPS), (unsigned)(G.count < 65535 ? G.count : 65535));
    if (quant)
        down_pair_rows_kernel<uint8_t><<<grid, WARPS * 32, 0, s>>>(L, Q, G, h, w, wdt, w_ld, y);
    else if (L.wdt == MOEX_BF16)
        down_pair_rows_kernel<__nv_bfloat16><<<grid, WARPS * 32, 0, s>>>(L, quant_view(), G, h, w, wdt, w_ld, y);
    else if (L.wdt == MOEX_F16)
        down_pair_rows_kernel<__half><<<grid, WARPS * 32, 0, s>>>(L, quant_view(), G, h, w, wdt, w_ld, y);
    else
        down_pair_rows_kernel<float><<<grid, WARPS * 32, 0, s>>>(L, quant_view(), G, h, w, wdt, w_ld, y);
    return MOEX_CUDA_LAUNCHED("down kernel (per pair)");
}

moex_status gemv_gate_up_fp8(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *x, float *h,
                             cudaStream_t s) {
    if (!G.pairs || !gemv_quant_usable(L, Q))
        return moex_fail(MOEX_ERR_INTERNAL, "gate/up kernel: FP8 weights take pairs and vector loads");
    /* a programmatic dependent of the quantization of x: its first weights load as that ends */
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = dependent_launch(grid_of((L.I + 1) / 2, G.count), dim3(WARPS * 32), s, &attr);
    return moex_cuda_status(cudaLaunchKernelEx(&cfg, gate_up_pairs_kernel<uint8_t, float>, L, Q, G, x, L.H, h),
                            "gate/up kernel (fp8)");
}

moex_status gemv_down_pairs_fp8(const layer_view &L, const quant_view &Q, const gemv_groups &G, const float *h,
                                const void *w, moex_dtype wdt, int64_t w_ld, void *out, moex_dtype odt, int64_t out_ld,
                                cudaStream_t s) {
    if (!gemv_quant_usable(L, Q)) return moex_fail(MOEX_ERR_INTERNAL, "down kernel: FP8 weights need vector loads");
    /* a programmatic dependent of the quantization of h (itself one of the gate/up kernel): as
     * for bf16, the blocks pull their first weights into L2 and wait for h */
    cudaLaunchAttribute attr;
    constexpr int nf = pairs_nf<uint8_t>();
    const cudaLaunchConfig_t cfg = dependent_launch(dim3((unsigned)((L.H + nf - 1) / nf), (unsigned)(G.T < 65535 ? G.T : 65535)),
                                                    dim3(WARPS * 32), s, &attr);
    return moex_cuda_status(cudaLaunchKernelEx(&cfg, down_pairs_kernel<uint8_t, true>, L, Q, G, h, w, wdt, w_ld, out, odt,
                                               out_ld),
                            "down kernel (pairs, fp8)");
}
