/* gemv_fp4.cu — the FP4 (e2m1) expert kernels: streamed, in integer dot products; see gemv.cuh.
 *
 * Weights: e2m1 codes, two a byte (low nibble first), rows of K/2 bytes (proj_view strides in
 * bytes), a scale (ue8m0 or f32) per row per 32 inputs (quant_view, bn = 1, bk = 32).
 * Inputs: the quantized activations of act_quant_e2m1: per row per 32 inputs a power-of-two
 * scale s and int8 codes 2 e2m1(x / s) (-12 .. 12).
 * Every e2m1 value times 2 is an integer, so a block of 32 inputs is one exact int32 sum of
 * (2w)(2x) (dp4a, four products an instruction); the block adds sum * sw * sx / 4 to the row's
 * f32 total. The weight codes become int8 through byte permutes in registers (dot32, e2m1x4_to_s8x4).
 *
 * Shapes: xq [T, H] int8 and xs [T, H/32] (the inputs, by token), h [P, I] f32 (pairs or slots),
 * hq [P, I] int8 and hs [P, I/32] (h quantized), y [P, H] f32 (slots). A lane reads 16 bytes of
 * a weight row at once: 32 inputs, one scale block.
 *
 *   pairs (batched_mm)   gate/up: a warp per 2 features of one (token, expert) pair, blocks of 8
 *                        warps (16 features), grid.y the pairs; down: a block per 8 features of
 *                        one token, warp j its pair j, the pairs summed in j order
 *   experts (grouped_mm) gate/up: a warp per feature of one expert, its slots' rows up to 8 a
 *                        pass; down: a warp per 4 features, rows up to 2 a pass; the groups
 *                        are the experts with rows (the routing's hit list)
 *   experts on tensor cores (grouped_mm, gemv_mma_experts_fp4): the same groups, integer mma
 *                        (below "grouped_mm on the tensor cores") */
#include "backends/cuda/act_quant.cuh"
#include "backends/cuda/gemv.cuh"
#include "gpu/cuda_check.h"

/* rows a pass: gate/up F4_ROWS, down F4_DOWN_ROWS (its 4 features' sums take the registers) */
enum { F4_WARPS = 8, F4_ROWS = 8, F4_DOWN_ROWS = 2, F4_NF = 4, F4_PAIR_NF = 8 };

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* The magnitudes 2|e2m1| of the codes 0 .. 7: 0, 1, 2, 3, 4, 6, 8, 12, a byte each (a prmt table). */
#define E2M1_LUT_LO 0x03020100u
#define E2M1_LUT_HI 0x0C080604u

/* The four e2m1 codes in the low 16 bits of c (code i in bits 4i .. 4i+3: sign, two exponent
 * bits, one mantissa bit) as four int8 values 2 e2m1, code i in byte i: the magnitude's 3 bits
 * pick from a table of 0, 1, 2, 3, 4, 6, 8, 12 and from its negation, and the sign bit (moved to
 * bit 2 of each selector) picks between the two. */
__device__ __forceinline__ uint32_t e2m1x4_to_s8x4(uint32_t c) {
    const uint32_t m = c & 0x7777u;
    const uint32_t pos = prmt(E2M1_LUT_LO, E2M1_LUT_HI, m), neg = prmt(0xFDFEFF00u, 0xF4F8FAFCu, m);
    return prmt(pos, neg, ((c >> 1) & 0x4444u) | 0x3210u);
}

/* The 32 int8 inputs at x (32 bytes, 16-aligned) as two 16-byte vectors. */
typedef struct in32 {
    uint4 a, b;
} in32;
__device__ __forceinline__ in32 load_in32(const int8_t *x) {
    in32 v = {__ldg((const uint4 *)x), __ldg((const uint4 *)x + 1)};
    return v;
}

/* sum over a 16-byte piece of 32 codes w and 32 int8 inputs x of (2w)(2x): exact. The codes are
 * not converted one by one: prmt with a code as its selector gives the magnitude when the sign
 * bit is clear and 0 when it is set (a set selector bit 3 replicates the table byte's msb, which
 * is 0), so one prmt of the codes gives the positive terms and one of the codes with their sign
 * bits flipped the negative ones; the sum is dp4a(positive) - dp4a(negative). */
__device__ __forceinline__ int dot32(uint4 w, const in32 &x) {
    const uint32_t c[4] = {w.x, w.y, w.z, w.w}, v[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
    int sp = 0, sn = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t f = c[i] ^ 0x88888888u;
        sp = __dp4a((int)prmt(E2M1_LUT_LO, E2M1_LUT_HI, c[i]), (int)v[2 * i], sp);
        sn = __dp4a((int)prmt(E2M1_LUT_LO, E2M1_LUT_HI, f), (int)v[2 * i], sn);
        sp = __dp4a((int)prmt(E2M1_LUT_LO, E2M1_LUT_HI, c[i] >> 16), (int)v[2 * i + 1], sp);
        sn = __dp4a((int)prmt(E2M1_LUT_LO, E2M1_LUT_HI, f >> 16), (int)v[2 * i + 1], sn);
    }
    return sp - sn;
}
/* 16 bytes of weight codes (32 inputs). */
__device__ __forceinline__ uint4 ldw(const uint8_t *p) { return __ldg((const uint4 *)p); }

/* One 32-input block's contribution: the exact sum times the weight's and the input's scales / 4. */
__device__ __forceinline__ float block_value(int sum, float sw, float sx) { return (float)sum * (sw * sx) * 0.25f; }

/* ---- batched_mm: pairs ------------------------------------------------------------------ */

__global__ void __launch_bounds__(F4_WARPS * 32, 3) fp4_gate_up_pairs_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                           const int8_t *xq, const float *xs, float *h) {
    const int lane = threadIdx.x & 31;
    const int64_t n = 2 * (blockIdx.x * (int64_t)F4_WARPS + (threadIdx.x >> 5));
    if (n >= L.I) return;
    const int two = n + 1 < L.I;
    const int64_t K = L.H, nkb = K / 32;
    for (int64_t p = blockIdx.y; p < G.count; p += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, p, &lo, &hi);
        if (e < 0) continue;
        const uint8_t *wu = (const uint8_t *)proj_base(L.up, e, 1) + n * L.up.n_stride;
        const uint8_t *wg = L.gated ? (const uint8_t *)proj_base(L.gate, e, 1) + n * L.gate.n_stride : wu;
        const int64_t us = two ? L.up.n_stride : 0, gs = two ? L.gate.n_stride : 0;
        const int64_t t = p / G.k;
        const int8_t *xr = xq + t * K;
        const float *xsr = xs + t * nkb;
        uint32_t su[2], sg[2] = {0, 0};
        for (int f = 0; f < 2; f++) {
            su[f] = scale_row(Q, Q.up, e, n + f * two);
            if (L.gated) sg[f] = scale_row(Q, Q.gate, e, n + f * two);
        }
        float au0 = 0, au1 = 0, ag0 = 0, ag1 = 0;
        /* two blocks of 32 inputs a lane a pass: the 8 rows' loads and their scales are issued
         * before any is used, with no branch between them (gate rows are the up rows when ungated,
         * a second block past K the first again: their sums are never used) */
        const int64_t gs2 = L.gated ? gs : us;
        const void *gbase = L.gated ? Q.gate.base : Q.up.base;
        const uint32_t gr[2] = {L.gated ? sg[0] : su[0], L.gated ? sg[1] : su[1]};
#pragma unroll 1
        for (int64_t kk = lane * 32; kk < K; kk += 64 * 32) {
            const bool two_blocks = kk + 32 * 32 < K;
            const int64_t k2 = two_blocks ? kk + 32 * 32 : kk;
            const uint4 a0 = ldw(wu + kk / 2), a1 = ldw(wu + us + kk / 2), a2 = ldw(wg + kk / 2), a3 = ldw(wg + gs2 + kk / 2);
            const uint4 b0 = ldw(wu + k2 / 2), b1 = ldw(wu + us + k2 / 2), b2 = ldw(wg + k2 / 2), b3 = ldw(wg + gs2 + k2 / 2);
            const uint32_t ka = (uint32_t)(kk / 32), kb2 = (uint32_t)(k2 / 32);
            float sa_u[2], sa_g[2], sb_u[2], sb_g[2];
            scale_loads<2>(Q.sdt, Q.up.base, su, ka, sa_u);
            scale_loads<2>(Q.sdt, gbase, gr, ka, sa_g);
            scale_loads<2>(Q.sdt, Q.up.base, su, kb2, sb_u);
            scale_loads<2>(Q.sdt, gbase, gr, kb2, sb_g);
            const in32 x = load_in32(xr + kk), y = load_in32(xr + k2);
            const float sx = __ldg(xsr + ka), sy = __ldg(xsr + kb2);
            au0 += block_value(dot32(a0, x), sa_u[0], sx);
            au1 += block_value(dot32(a1, x), sa_u[1], sx);
            ag0 += block_value(dot32(a2, x), sa_g[0], sx);
            ag1 += block_value(dot32(a3, x), sa_g[1], sx);
            if (two_blocks) {
                au0 += block_value(dot32(b0, y), sb_u[0], sy);
                au1 += block_value(dot32(b1, y), sb_u[1], sy);
                ag0 += block_value(dot32(b2, y), sb_g[0], sy);
                ag1 += block_value(dot32(b3, y), sb_g[1], sy);
            }
        }
        store_gate_up_pair(L, h, p, e, n, two, ag0, ag1, au0, au1, lane);
    }
}

/* Block: F4_PAIR_NF consecutive features of one token; warp w takes pairs j = j0 + w; the pairs'
 * results meet in shared memory and are summed in j order (deterministic). */
__global__ void __launch_bounds__(F4_WARPS * 32, 2) fp4_down_pairs_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                        const int8_t *hq, const float *hs, const void *w,
                                                                        moex_dtype wdt, int64_t w_ld, void *out,
                                                                        moex_dtype odt, int64_t out_ld) {
    __shared__ float part[F4_WARPS][F4_PAIR_NF];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n0 = blockIdx.x * (int64_t)F4_PAIR_NF, K = L.I, nkb = K / 32;
    const int nf = L.H - n0 < F4_PAIR_NF ? (int)(L.H - n0) : F4_PAIR_NF;
    for (int64_t t = blockIdx.y; t < G.T; t += gridDim.y) {
        float acc = 0.0f; /* thread f < nf: feature n0 + f */
        for (int64_t j0 = 0; j0 < G.k; j0 += F4_WARPS) {
            const int64_t j = j0 + warp;
            const int64_t e = j < G.k ? load_id(G.ids, G.ids64, G.ids_ld, t, j) : -1;
            const bool ok = e >= 0 && e < L.E;
            float p[F4_PAIR_NF];
#pragma unroll
            for (int f = 0; f < F4_PAIR_NF; f++) p[f] = 0.0f;
            if (ok) {
                const uint8_t *wd = (const uint8_t *)proj_base(L.down, e, 1) + n0 * L.down.n_stride;
                const int8_t *hr = hq + (t * G.k + j) * K;
                const float *hsr = hs + (t * G.k + j) * nkb;
                uint32_t sd[F4_PAIR_NF];
#pragma unroll
                for (int f = 0; f < F4_PAIR_NF; f++) sd[f] = scale_row(Q, Q.down, e, n0 + (f < nf ? f : 0));
                for (int64_t kk = lane * 32; kk < K; kk += 32 * 32) {
                    const uint32_t kb = (uint32_t)(kk / 32);
                    uint4 wv[F4_PAIR_NF];
#pragma unroll
                    for (int f = 0; f < F4_PAIR_NF; f++) wv[f] = ldw(wd + (f < nf ? f : 0) * L.down.n_stride + kk / 2);
                    float sw[F4_PAIR_NF]; /* all loads issued before any is used (features past nf: unstored) */
                    scale_loads<F4_PAIR_NF>(Q.sdt, Q.down.base, sd, kb, sw);
                    const in32 x = load_in32(hr + kk);
                    const float sx = __ldg(hsr + kb);
#pragma unroll
                    for (int f = 0; f < F4_PAIR_NF; f++) p[f] += block_value(dot32(wv[f], x), sw[f], sx);
                }
#pragma unroll
                for (int f = 0; f < F4_PAIR_NF; f++) p[f] = warp_sum(p[f]);
            }
            float mine = 0.0f; /* lane f < F4_PAIR_NF: feature n0 + f (registers are not indexed by lane) */
#pragma unroll
            for (int f = 0; f < F4_PAIR_NF; f++)
                if (lane == f) mine = p[f];
            if (lane < F4_PAIR_NF)
                part[warp][lane] = ok && lane < nf ? load_elem(w, wdt, t * w_ld + j) *
                                                         (mine + bias_at(L.down_bias, L.bdt, e, n0 + lane))
                                                   : 0.0f;
            __syncthreads();
            if (threadIdx.x < nf)
                for (int q = 0; q < F4_WARPS; q++) acc += part[q][threadIdx.x];
            __syncthreads();
        }
        if (threadIdx.x < nf) store_elem(out, odt, t * out_ld + n0 + threadIdx.x, acc);
    }
}

/* ---- grouped_mm: per expert, its slots' rows ---------------------------------------------- */

/* Rows r0 .. r0+nr (nr <= R) of expert e for feature n: h[slot] = act(gate . x, up . x). */
template <int R>
__device__ __forceinline__ void fp4_gate_up_rows(const layer_view &L, const quant_view &Q, const gemv_groups &G,
                                                 const int8_t *xq, const float *xs, float *h, int64_t e, int64_t n,
                                                 int64_t r0, int nr, const uint8_t *wu, const uint8_t *wg, uint32_t su,
                                                 uint32_t sg, int lane) {
    const int64_t K = L.H, nkb = K / 32;
    int64_t row[R];
#pragma unroll
    for (int r = 0; r < R; r++) row[r] = (int64_t)G.slot_token[r0 + (r < nr ? r : nr - 1)];
    float ag[R], au[R];
#pragma unroll
    for (int r = 0; r < R; r++) ag[r] = au[r] = 0.0f;
    for (int64_t kk = lane * 32; kk < K; kk += 32 * 32) {
        const uint32_t kb = (uint32_t)(kk / 32);
        const uint4 u = ldw(wu + kk / 2), g = L.gated ? ldw(wg + kk / 2) : u;
        const float swu = scale_load(Q.sdt, Q.up.base, su + kb), swg = L.gated ? scale_load(Q.sdt, Q.gate.base, sg + kb) : 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const in32 x = load_in32(xq + row[r] * K + kk);
            const float sx = __ldg(xs + row[r] * nkb + kb);
            au[r] += block_value(dot32(u, x), swu, sx);
            if (L.gated) ag[r] += block_value(dot32(g, x), swg, sx);
        }
    }
    store_gate_up_rows<R>(L, h, e, n, r0, nr, ag, au, lane);
}

__global__ void __launch_bounds__(F4_WARPS * 32, 2) fp4_gate_up_experts_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                             const int8_t *xq, const float *xs, float *h) {
    const int lane = threadIdx.x & 31;
    const int64_t n = blockIdx.x * (int64_t)F4_WARPS + (threadIdx.x >> 5);
    if (n >= L.I) return;
    for (int64_t g = blockIdx.y; g < G.count; g += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, g, &lo, &hi);
        if (e < 0) continue;
        const uint8_t *wu = (const uint8_t *)proj_base(L.up, e, 1) + n * L.up.n_stride;
        const uint8_t *wg = L.gated ? (const uint8_t *)proj_base(L.gate, e, 1) + n * L.gate.n_stride : wu;
        const uint32_t su = scale_row(Q, Q.up, e, n), sg = L.gated ? scale_row(Q, Q.gate, e, n) : 0;
        for (int64_t r0 = lo; r0 < hi; r0 += F4_ROWS) {
            const int nr = hi - r0 < F4_ROWS ? (int)(hi - r0) : F4_ROWS;
            if (nr == 1)
                fp4_gate_up_rows<1>(L, Q, G, xq, xs, h, e, n, r0, nr, wu, wg, su, sg, lane);
            else if (nr == 2)
                fp4_gate_up_rows<2>(L, Q, G, xq, xs, h, e, n, r0, nr, wu, wg, su, sg, lane);
            else if (nr <= 4)
                fp4_gate_up_rows<4>(L, Q, G, xq, xs, h, e, n, r0, nr, wu, wg, su, sg, lane);
            else
                fp4_gate_up_rows<F4_ROWS>(L, Q, G, xq, xs, h, e, n, r0, nr, wu, wg, su, sg, lane);
        }
    }
}

/* Features n .. n+nf (nf <= F4_NF) for slots r0 .. r0+nr (nr <= R): y[slot] = down . h[slot] + b. */
template <int R>
__device__ __forceinline__ void fp4_down_rows(const layer_view &L, const quant_view &Q, const int8_t *hq,
                                              const float *hs, float *y, int64_t e, int64_t n, int nf, int64_t r0,
                                              int nr, const uint8_t *wd, const uint32_t *sd, const float *bias,
                                              int lane) {
    const int64_t K = L.I, nkb = K / 32, ns = L.down.n_stride;
    float acc[R][F4_NF];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int f = 0; f < F4_NF; f++) acc[r][f] = 0.0f;
    for (int64_t kk = lane * 32; kk < K; kk += 32 * 32) {
        const uint32_t kb = (uint32_t)(kk / 32);
        uint4 wv[F4_NF];
        float sw[F4_NF];
#pragma unroll
        for (int f = 0; f < F4_NF; f++) {
            wv[f] = ldw(wd + (f < nf ? f : 0) * ns + kk / 2);
            sw[f] = scale_load(Q.sdt, Q.down.base, sd[f] + kb);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t slot = r0 + (r < nr ? r : nr - 1);
            const float sx = __ldg(hs + slot * nkb + kb);
            const in32 x = load_in32(hq + slot * K + kk);
#pragma unroll
            for (int f = 0; f < F4_NF; f++) acc[r][f] += block_value(dot32(wv[f], x), sw[f], sx);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int f = 0; f < F4_NF; f++) acc[r][f] = warp_sum(acc[r][f]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr)
#pragma unroll
                for (int f = 0; f < F4_NF; f++)
                    if (f < nf) y[(r0 + r) * L.H + n + f] = acc[r][f] + bias[f];
}

__global__ void __launch_bounds__(F4_WARPS * 32, 2) fp4_down_experts_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                          const int8_t *hq, const float *hs, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n = F4_NF * (blockIdx.x * (int64_t)F4_WARPS + (threadIdx.x >> 5));
    if (n >= L.H) return;
    const int nf = L.H - n < F4_NF ? (int)(L.H - n) : F4_NF;
    for (int64_t g = blockIdx.y; g < G.count; g += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, g, &lo, &hi);
        if (e < 0) continue;
        const uint8_t *wd = (const uint8_t *)proj_base(L.down, e, 1) + n * L.down.n_stride;
        float bias[F4_NF];
        uint32_t sd[F4_NF];
#pragma unroll
        for (int f = 0; f < F4_NF; f++) {
            bias[f] = f < nf ? bias_at(L.down_bias, L.bdt, e, n + f) : 0.0f;
            sd[f] = scale_row(Q, Q.down, e, n + (f < nf ? f : 0));
        }
        for (int64_t r0 = lo; r0 < hi; r0 += F4_DOWN_ROWS) {
            const int nr = hi - r0 < F4_DOWN_ROWS ? (int)(hi - r0) : F4_DOWN_ROWS;
            if (nr == 1)
                fp4_down_rows<1>(L, Q, hq, hs, y, e, n, nf, r0, nr, wd, sd, bias, lane);
            else
                fp4_down_rows<F4_DOWN_ROWS>(L, Q, hq, hs, y, e, n, nf, r0, nr, wd, sd, bias, lane);
        }
    }
}

/* ---- grouped_mm on the tensor cores: mma.sync m16n8k32 s8 x s8 -> s32 ---------------------
 *
 * A warp takes 16 output features (the mma's M: rows g and g+8 of each of its MATS weight
 * tiles, g = lane / 4) of one expert and its slots' rows in passes of 8 NT (the mma's N: token
 * row g of each tile of 8). Per 32-input block (one scale block) the mma's k runs over a
 * permutation that lets each lane read whole words: lane t = lane % 4 holds physical inputs
 * 8t .. 8t+7 of the block, the first four as k = 4t .. 4t+3 and the last four as k = 16+4t ..
 * 16+4t+3, on both operands (the weights: one 32-bit word of 8 codes a row; the inputs: 8
 * int8 codes). Each block's int32 sums are scaled (weight row scale x input row scale / 4)
 * into the f32 totals right after its mma, so every block's sum is exact. */
enum { F4_MMA_WARPS = 4 };

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* What one pass reads: MATS weight tiles (rows g and g+8 of tile m at w[m][0], w[m][1], bytes;
 * their scale rows sw[m][.] in Q's grid sv[m]), NT input tiles (row g of tile j at x[j], its
 * codes; the scales of the C columns 2t, 2t+1 of tile j at xs[j][.]). */
template <int MATS, int NT> struct mma_pass {
    const uint8_t *w[MATS][2];
    uint32_t sw[MATS][2];
    const void *sbase[MATS];
    const int8_t *x[NT];
    const float *xs[NT][2];
};

/* acc[m][j][.] = the pass's rows of tile m times input tile j over K inputs (f32 totals). */
template <int MATS, int NT>
__device__ __forceinline__ void mma_stream(const mma_pass<MATS, NT> &p, moex_dtype sdt, int64_t K, int t,
                                           float (&acc)[MATS][NT][4]) {
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0.0f;
    const int64_t nkb = K / 32;
#pragma unroll 2
    for (int64_t kb = 0; kb < nkb; kb++) {
        uint2 xv[NT];
        float sx[NT][2];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            xv[j] = __ldg((const uint2 *)(p.x[j] + kb * 32 + 8 * t));
            sx[j][0] = __ldg(p.xs[j][0] + kb), sx[j][1] = __ldg(p.xs[j][1] + kb);
        }
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            const uint32_t lo = __ldg((const uint32_t *)(p.w[m][0] + kb * 16 + 4 * t));
            const uint32_t hi = __ldg((const uint32_t *)(p.w[m][1] + kb * 16 + 4 * t));
            const uint32_t a0 = e2m1x4_to_s8x4(lo), a2 = e2m1x4_to_s8x4(lo >> 16), a1 = e2m1x4_to_s8x4(hi),
                           a3 = e2m1x4_to_s8x4(hi >> 16);
            const float s0 = 0.25f * scale_load(sdt, p.sbase[m], p.sw[m][0] + (uint32_t)kb),
                        s1 = 0.25f * scale_load(sdt, p.sbase[m], p.sw[m][1] + (uint32_t)kb);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, a0, a1, a2, a3, xv[j].x, xv[j].y);
                acc[m][j][0] += (float)c[0] * (s0 * sx[j][0]);
                acc[m][j][1] += (float)c[1] * (s0 * sx[j][1]);
                acc[m][j][2] += (float)c[2] * (s1 * sx[j][0]);
                acc[m][j][3] += (float)c[3] * (s1 * sx[j][1]);
            }
        }
    }
}

/* gate/up (DOWN = 0): MATS = 2 (gate, up) or 1 (ungated), features of I, inputs the tokens' x
 * codes (slot_token), h[slot] f32; down (DOWN = 1): MATS = 2 tiles of 16 features of H, inputs
 * the slots' h codes, y[slot] f32. */
template <int MATS, int NT, int DOWN>
__device__ __forceinline__ void fp4_mma_pass(const layer_view &L, const quant_view &Q, const gemv_groups &G,
                                             const int8_t *in, const float *ins, float *out, int64_t e, int64_t n0,
                                             int64_t r0, int nr, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int64_t N = DOWN ? L.H : L.I, K = DOWN ? L.I : L.H, nkb = K / 32;
    mma_pass<MATS, NT> p;
#pragma unroll
    for (int m = 0; m < MATS; m++) {
        const proj_view &pv = DOWN ? L.down : (MATS == 2 && m == 0 ? L.gate : L.up);
        const scale_view &sv = DOWN ? Q.down : (MATS == 2 && m == 0 ? Q.gate : Q.up);
        const int64_t tile0 = DOWN ? n0 + 16 * m : n0;
        p.sbase[m] = sv.base;
#pragma unroll
        for (int f = 0; f < 2; f++) {
            int64_t n = tile0 + g + 8 * f;
            n = n < N ? n : N - 1; /* rows past N read the last row; not stored */
            p.w[m][f] = (const uint8_t *)proj_base(pv, e, 1) + n * pv.n_stride;
            p.sw[m][f] = scale_row(Q, sv, e, n);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = 8 * j + g < nr ? 8 * j + g : nr - 1;
        const int64_t row = DOWN ? r0 + r : (int64_t)G.slot_token[r0 + r];
        p.x[j] = in + row * K;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int c = 8 * j + 2 * t + q < nr ? 8 * j + 2 * t + q : nr - 1;
            const int64_t crow = DOWN ? r0 + c : (int64_t)G.slot_token[r0 + c];
            p.xs[j][q] = ins + crow * nkb;
        }
    }
    float acc[MATS][NT][4];
    mma_stream<MATS, NT>(p, Q.sdt, K, t, acc);
    if constexpr (DOWN) {
#pragma unroll
        for (int m = 0; m < MATS; m++)
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const int64_t n = n0 + 16 * m + g + 8 * f;
                if (n >= N) continue;
                const float b = bias_at(L.down_bias, L.bdt, e, n);
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const int r = 8 * j + 2 * t + q;
                        if (r < nr) out[(r0 + r) * L.H + n] = acc[m][j][2 * f + q] + b;
                    }
            }
    } else {
#pragma unroll
        for (int f = 0; f < 2; f++) {
            const int64_t n = n0 + g + 8 * f;
            if (n >= N) continue;
            const float bu = bias_at(L.up_bias, L.bdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.bdt, e, n) : 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int r = 8 * j + 2 * t + q;
                    if (r < nr)
                        out[(r0 + r) * L.I + n] = activate(L, acc[0][j][2 * f + q] + bg, acc[MATS - 1][j][2 * f + q] + bu);
                }
        }
    }
}

/* A warp per 16 (gate/up) or 32 (down) features of each expert with rows; blocks of F4_MMA_WARPS warps. */
template <int MATS, int DOWN>
__global__ void __launch_bounds__(F4_MMA_WARPS * 32) fp4_mma_kernel(layer_view L, quant_view Q, gemv_groups G,
                                                                   const int8_t *in, const float *ins, float *out) {
    const int lane = threadIdx.x & 31;
    const int64_t n0 = (DOWN ? 32 : 16) * (blockIdx.x * (int64_t)F4_MMA_WARPS + (threadIdx.x >> 5));
    if (n0 >= (DOWN ? L.H : L.I)) return;
    for (int64_t gi = blockIdx.y; gi < G.count; gi += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, gi, &lo, &hi);
        if (e < 0) continue;
        for (int64_t r0 = lo; r0 < hi; r0 += 16) {
            const int nr = hi - r0 < 16 ? (int)(hi - r0) : 16;
            if (nr <= 8)
                fp4_mma_pass<MATS, 1, DOWN>(L, Q, G, in, ins, out, e, n0, r0, nr, lane);
            else
                fp4_mma_pass<MATS, 2, DOWN>(L, Q, G, in, ins, out, e, n0, r0, nr, lane);
        }
    }
}

/* ---- launchers ------------------------------------------------------------------------- */

static dim3 f4_grid(int64_t blocks_x, int64_t groups) {
    return dim3((unsigned)blocks_x, (unsigned)(groups < 65535 ? (groups > 0 ? groups : 1) : 65535));
}

int gemv_fp4_usable(const layer_view &L, const quant_view &Q) {
    return L.wdt == MOEX_E2M1X2 && Q.on && Q.bn == 1 && Q.bk == 32 && L.H % 32 == 0 && L.I % 32 == 0 &&
           gemv_vectorizable(L, 1);
}

moex_status gemv_gate_up_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *xq,
                             const float *xs, float *h, cudaStream_t s) {
    if (!gemv_fp4_usable(L, Q)) return moex_fail(MOEX_ERR_INTERNAL, "gate/up kernel: FP4 weights it does not take");
    if (G.pairs)
        fp4_gate_up_pairs_kernel<<<f4_grid(((L.I + 1) / 2 + F4_WARPS - 1) / F4_WARPS, G.count), F4_WARPS * 32, 0, s>>>(
            L, Q, G, xq, xs, h);
    else
        fp4_gate_up_experts_kernel<<<f4_grid((L.I + F4_WARPS - 1) / F4_WARPS, G.count), F4_WARPS * 32, 0, s>>>(
            L, Q, G, xq, xs, h);
    return MOEX_CUDA_LAUNCHED("gate/up kernel (fp4)");
}

moex_status gemv_down_pairs_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *hq,
                                const float *hs, const void *w, moex_dtype wdt, int64_t w_ld, void *out,
                                moex_dtype odt, int64_t out_ld, cudaStream_t s) {
    if (!gemv_fp4_usable(L, Q)) return moex_fail(MOEX_ERR_INTERNAL, "down kernel: FP4 weights it does not take");
    fp4_down_pairs_kernel<<<f4_grid((L.H + F4_PAIR_NF - 1) / F4_PAIR_NF, G.T), F4_WARPS * 32, 0, s>>>(L, Q, G, hq, hs, w, wdt,
                                                                                          w_ld, out, odt, out_ld);
    return MOEX_CUDA_LAUNCHED("down kernel (pairs, fp4)");
}

moex_status gemv_down_experts_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *hq,
                                  const float *hs, float *y, cudaStream_t s) {
    if (!gemv_fp4_usable(L, Q)) return moex_fail(MOEX_ERR_INTERNAL, "down kernel: FP4 weights it does not take");
    const int64_t warps = (L.H + F4_NF - 1) / F4_NF;
    fp4_down_experts_kernel<<<f4_grid((warps + F4_WARPS - 1) / F4_WARPS, G.count), F4_WARPS * 32, 0, s>>>(L, Q, G, hq,
                                                                                                        hs, y);
    return MOEX_CUDA_LAUNCHED("down kernel (experts, fp4)");
}

moex_status gemv_mma_experts_fp4(const layer_view &L, const quant_view &Q, const gemv_groups &G, const int8_t *xq,
                                 const float *xs, float *h, int8_t *hq, float *hs, float *y, int64_t P, cudaStream_t s) {
    if (!gemv_fp4_usable(L, Q) || G.pairs) return moex_fail(MOEX_ERR_INTERNAL, "FP4 mma kernels: a layer they do not take");
    const dim3 block(F4_MMA_WARPS * 32);
    const int64_t gu_warps = (L.I + 15) / 16, dn_warps = (L.H + 31) / 32;
    const dim3 gu_grid = f4_grid((gu_warps + F4_MMA_WARPS - 1) / F4_MMA_WARPS, G.count),
               dn_grid = f4_grid((dn_warps + F4_MMA_WARPS - 1) / F4_MMA_WARPS, G.count);
    if (L.gated)
        fp4_mma_kernel<2, 0><<<gu_grid, block, 0, s>>>(L, Q, G, xq, xs, h);
    else
        fp4_mma_kernel<1, 0><<<gu_grid, block, 0, s>>>(L, Q, G, xq, xs, h);
    moex_status st = MOEX_CUDA_LAUNCHED("gate/up kernel (fp4, mma)");
    if (!st) st = act_quant_e2m1(h, MOEX_F32, L.I, P, L.I, hq, hs, s);
    if (st) return st;
    fp4_mma_kernel<2, 1><<<dn_grid, block, 0, s>>>(L, Q, G, hq, hs, y);
    return MOEX_CUDA_LAUNCHED("down kernel (fp4, mma)");
}
