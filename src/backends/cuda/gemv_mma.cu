/* gemv_mma.cu — grouped_mm's streamed forward on tensor cores (mma.sync) in one launch, for
 * bf16/f16 weights and inputs (m16n8k16) and for FP8 e4m3 weights with block scales, whose
 * activations the launch quantizes itself (e4m3 x e4m3, m16n8k32); see gemv.cuh. The plain kernels of gemv.cu
 * spend one FMA per weight and row in f32, which costs as much as the read once
 * an expert has four or more rows; here a warp multiplies 16 weight rows by up
 * to 16 input rows per k step on the tensor cores and the kernel stays bound by
 * the weight stream, which cp.async brings into each warp's ring in shared memory
 * together with the input rows (see "the weight stream of one warp").
 *
 * Shapes: W [N, K] of one expert (rows n_stride apart, k contiguous), x [rows, K]
 * (T, rows x_ld apart), h [P, I] (T), y [P, H] (f32). A warp owns 16 output
 * features n0 .. n0+15 (the mma's M) of one expert per work item and the expert's rows
 * in passes of 8*NT (its N, NT tiles of 8); the items and their order are at
 * experts_mma_kernel. k advances a 64-byte chunk at a time (32 bf16 or 64 e4m3 inputs): lane
 * (g = lane/4, t = lane%4) reads 16 bytes of weight rows g and g+8 and of input row g at byte
 * 16t of the chunk from the stage. The two mma steps of the chunk take bytes 16t+{0..3} and
 * 16t+{4..7}, then 16t+{8..11} and 16t+{12..15}, as their logical k bytes 4t..4t+3 and
 * 16+4t..16+4t+3 (the fragment layout is the same in bytes for m16n8k16 bf16 and m16n8k32
 * e4m3): the same permutation of k on both operands, so the dot products are unchanged and
 * every load is a whole 16-byte piece.
 *
 * FP8 (fmt<uint8_t>): codes times codes over each 64-byte chunk, the partial sums multiplied by
 * the weight block scale and the input row's block scale once per bk inputs (bk a multiple of
 * 64); the launch first quantizes the input rows (x -> xq, xs), gate/up write h in f32, and the
 * last gate/up item of an expert quantizes its h rows (-> hq, hs) before its down items start. */
#include "backends/cuda/act_quant.cuh"
#include "backends/cuda/gemv.cuh"
#include "backends/cuda/routing.cuh"
#include "gpu/cuda_check.h"

#include <pthread.h>

enum { MFEAT = 16, CHUNK_BYTES = 64 };

template <typename T> __device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                              uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                        uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma16832_e4m3(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The operand formats, by storage type T: V inputs per 16-byte piece, QUANT (codes with block
 * scales), WARPS a block (the launch configuration below), HT the dtype of h, and the mma of one 64-byte chunk (weight rows g (lo) and g+8
 * (hi), input row g (x); see the header). */
template <typename T> struct fmt {
    enum { V = 8, QUANT = 0, WARPS = 16 };
    typedef T HT;
    static __device__ __forceinline__ void chunk(float c[4], uint4 lo, uint4 hi, uint4 x) {
        mma16816<T>(c, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
        mma16816<T>(c, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
    }
};
template <> struct fmt<uint8_t> {
    enum { V = 16, QUANT = 1, WARPS = 12 }; /* the scales' registers: 170 a thread */
    typedef float HT;
    static __device__ __forceinline__ void chunk(float c[4], uint4 lo, uint4 hi, uint4 x) {
        mma16832_e4m3(c, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
        mma16832_e4m3(c, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
    }
};

/* ---- loads --------------------------------------------------------------------------- */


__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronously, through L2 only (the weights are read once); the
 * L2 fetches the 256 bytes around them, which the neighbouring lanes ask for anyway. */
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 lds16(const void *p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
    return v;
}

/* ---- the weight stream of one warp ------------------------------------------------------
 *
 * A warp streams MATS matrices of 16 rows (w[m] = row 0, rows ns apart, nvalid[m] of them real:
 * the rest read the last real row again) along k through its ring of STAGES stages in shared
 * memory, each stage 128 bytes of every row (KT inputs): [MATS][16][KT] of T, then the input
 * rows. A stage is copied with cp.async, CPR = 8 lanes a row, so every copy instruction reads 4
 * whole runs of 128 contiguous bytes (the read floor's pattern: long runs, many in flight, no
 * registers held by the loads). Piece c (16 bytes) of row r sits at piece c ^ 4*(r & 1) of its
 * row in shared memory, so that the reads below (rows g and g+1 of 8 lanes, 4 pieces each)
 * touch every bank once. The pieces of a last, partial stage past K are not copied; the reads
 * take zeros for them. */

__device__ __forceinline__ int swz(int r, int c) { return c ^ ((r & 1) << 2); }

/* Input rows of a stage, and the stage's bytes a row. A pass takes up to PASS_ROWS rows: FP8 8
 * (one tile of the mma's N: its block scales take the registers of a second), else XROWS. */
enum { XROWS = 16, STAGE_BYTES = 128 };
#define PASS_ROWS(T) (fmt<T>::QUANT ? 8 : XROWS)

template <typename T> struct geom {
    enum { V = fmt<T>::V, KT = STAGE_BYTES / (int)sizeof(T), CPR = KT / V, RPI = 32 / CPR };
};
/* The input-row copies of one lane for NT tiles of 8 rows. */
#define XCOPIES(T, NT) (8 * (NT) / geom<T>::RPI)

/* The weight rows' part of a stage (issue_stage). */
template <typename T, int MATS>
__device__ __forceinline__ void issue_stage_weights(const T *const (&w)[MATS], int64_t ns, const int (&nvalid)[MATS],
                                                    int64_t k0, int64_t kt, T *buf, int lane) {
    constexpr int KT = geom<T>::KT, V = geom<T>::V, CPR = geom<T>::CPR, RPI = geom<T>::RPI;
    const int c = lane % CPR;
    if (V * c >= kt) return;
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int i = 0; i < 16 / RPI; i++) {
            const int r = i * RPI + lane / CPR, src_r = r < nvalid[m] ? r : nvalid[m] - 1;
            cp16(buf + (m * 16 + r) * KT + V * swz(r, c), w[m] + src_r * ns + k0 + V * c);
        }
}

/* The input rows' part of a stage (issue_stage). */
template <typename T, int MATS, int NT>
__device__ __forceinline__ void issue_stage_inputs(const T *const (&xs)[XCOPIES(T, NT)], int64_t k0, int64_t kt, T *buf,
                                                   int lane) {
    constexpr int KT = geom<T>::KT, V = geom<T>::V, CPR = geom<T>::CPR, RPI = geom<T>::RPI;
    const int c = lane % CPR;
    if (V * c >= kt) return;
    T *X = buf + MATS * 16 * KT;
#pragma unroll
    for (int i = 0; i < XCOPIES(T, NT); i++) {
        const int r = i * RPI + lane / CPR;
        cp16(X + r * KT + V * swz(r, c), xs[i] + k0 + V * c);
    }
}

template <typename T, int MATS, int NT>
__device__ __forceinline__ void issue_stage(const T *const (&w)[MATS], int64_t ns, const int (&nvalid)[MATS],
                                            const T *const (&xs)[XCOPIES(T, NT)], int64_t k0, int64_t kt, T *buf,
                                            int lane) {
    issue_stage_weights<T, MATS>(w, ns, nvalid, k0, kt, buf, lane);
    issue_stage_inputs<T, MATS, NT>(xs, k0, kt, buf, lane);
}

__device__ __forceinline__ int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The input rows this lane copies: row i * RPI + lane / CPR of the tile, for i < XCOPIES
 * (rows past nr copy row nr - 1: their results are not stored). */
template <typename T> __device__ __forceinline__ int copy_row(int i, int nr, int lane) {
    const int r = i * geom<T>::RPI + lane / geom<T>::CPR;
    return r < nr ? r : nr - 1;
}

/* FP8: where this lane's block scales are, as 32-bit offsets (registers are what the kernel is
 * short of). w[m] + wo[m][f]: the scale row of its feature g + 8f of matrix m (quant_view's
 * layout, in elements of Q.sdt, indexed by k block); x + xo[j][q]: the scales of input row
 * 8j + 2t + q of the pass (f32, [k blocks]). */
template <int MATS, int NT> struct lane_scales {
    const void *w[MATS];
    const float *x;
    uint32_t wo[MATS][2], xo[NT][2];
};

/* The scales of k block kb: sw[m][f] * sx[j][q] multiplies the partial sums of that block. */
template <int MATS, int NT> struct block_scales {
    float w[MATS][2], x[NT][2];
};
template <int MATS, int NT>
__device__ __forceinline__ void load_scales(block_scales<MATS, NT> &b, const lane_scales<MATS, NT> &ls, moex_dtype sdt,
                                            uint32_t kb) {
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int f = 0; f < 2; f++) b.w[m][f] = scale_load(sdt, ls.w[m], ls.wo[m][f] + kb);
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int q = 0; q < 2; q++) b.x[j][q] = __ldcg(ls.x + ls.xo[j][q] + kb); /* written in this launch */
}

/* c[m][j] += rows of matrix m . input tile j over all K, with both the weights and the input
 * rows (xs: copy_row's rows) brought by the stages. The k mapping is the header's. FP8: the
 * sums of each bk-input block go through part[] and are scaled into c at the block's end, the
 * next block's scales already loaded. ready (or NULL): the input rows (and their scales) exist
 * once *ready reaches need (written in this launch): the first stages' weights are copied
 * before the wait, the inputs after it. */
template <typename T, int NT, int MATS, int STAGES>
__device__ __forceinline__ void stream_rows(const T *const (&w)[MATS], int64_t ns, const int (&nvalid)[MATS], int64_t K,
                                            const T *const (&xs)[XCOPIES(T, NT)], float (&c)[MATS][NT][4], T *ring,
                                            int lane, const quant_view &q, const lane_scales<MATS, NT> &ls,
                                            const int *ready, int64_t need) {
    constexpr int KT = geom<T>::KT, V = geom<T>::V, STAGE = (MATS * 16 + XROWS) * KT, QUANT = fmt<T>::QUANT;
    const int g = lane >> 2, t = lane & 3;
    const int64_t nst = (K + KT - 1) / KT;
    float part[QUANT ? MATS : 1][QUANT ? NT : 1][4];
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) c[m][j][i] = 0.0f;
    block_scales<MATS, NT> bs;
    uint32_t kb = 0;
    int64_t block_end = q.bk;
    if (QUANT) {
#pragma unroll
        for (int m = 0; m < (QUANT ? MATS : 1); m++)
#pragma unroll
            for (int j = 0; j < (QUANT ? NT : 1); j++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[m][j][i] = 0.0f;
    }
    if (ready) { /* the weights of the first stages, then the inputs once they exist (cp.async groups
                    complete in order: group p holds input stage p, the first one every weight stage too) */
#pragma unroll
        for (int p = 0; p < STAGES - 1; p++)
            if (p < nst) issue_stage_weights<T, MATS>(w, ns, nvalid, p * KT, K - p * KT, ring + p * STAGE, lane);
        while (ld_acquire(ready) < need) __nanosleep(64);
#pragma unroll
        for (int p = 0; p < STAGES - 1; p++) {
            if (p < nst) issue_stage_inputs<T, MATS, NT>(xs, p * KT, K - p * KT, ring + p * STAGE, lane);
            cp_commit();
        }
    } else {
#pragma unroll
        for (int p = 0; p < STAGES - 1; p++) {
            if (p < nst) issue_stage<T, MATS, NT>(w, ns, nvalid, xs, p * KT, K - p * KT, ring + p * STAGE, lane);
            cp_commit();
        }
    }
    if (QUANT) load_scales(bs, ls, q.sdt, 0);
    for (int64_t st = 0; st < nst; st++) {
        const int64_t p = st + STAGES - 1;
        if (p < nst) issue_stage<T, MATS, NT>(w, ns, nvalid, xs, p * KT, K - p * KT, ring + (p % STAGES) * STAGE, lane);
        cp_commit();
        cp_wait<STAGES - 1>();
        __syncwarp();
        const T *buf = ring + (st % STAGES) * STAGE, *X = buf + MATS * 16 * KT;
        const int64_t kt = K - st * KT < KT ? K - st * KT : KT;
#pragma unroll
        for (int s = 0; s < KT / (4 * V); s++) {
            if (4 * V * s >= kt) break;
            const bool in = V * (4 * s + t) < kt; /* this lane's piece lies before K */
            const uint4 zero = make_uint4(0, 0, 0, 0);
            uint4 xv[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) xv[j] = in ? lds16(X + (j * 8 + g) * KT + V * swz(g, 4 * s + t)) : zero;
#pragma unroll
            for (int m = 0; m < MATS; m++) {
                const uint4 lo = in ? lds16(buf + (m * 16 + g) * KT + V * swz(g, 4 * s + t)) : zero;
                const uint4 hi = in ? lds16(buf + (m * 16 + g + 8) * KT + V * swz(g + 8, 4 * s + t)) : zero;
#pragma unroll
                for (int j = 0; j < NT; j++) fmt<T>::chunk(QUANT ? part[QUANT ? m : 0][QUANT ? j : 0] : c[m][j], lo, hi, xv[j]);
            }
            if (QUANT) {
                const int64_t kend = st * KT + 4 * V * (s + 1);
                if (kend >= block_end || kend >= K) { /* the end of block kb */
#pragma unroll
                    for (int m = 0; m < (QUANT ? MATS : 1); m++)
#pragma unroll
                        for (int j = 0; j < (QUANT ? NT : 1); j++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                c[m][j][i] += part[m][j][i] * (bs.w[m][i >> 1] * bs.x[j][i & 1]);
                                part[m][j][i] = 0.0f;
                            }
                    kb++, block_end += q.bk;
                    if (kend < K) load_scales(bs, ls, q.sdt, kb);
                }
            }
        }
        __syncwarp(); /* the buffer is refilled by the next iteration's copies */
    }
}

/* ---- gate/up + activation: h[slot, n] = act(gate_n . x + b, up_n . x + b) ------ */

/* One pass over rows r0 .. r0+nr of expert e for features n0 .. n0+15, over inputs k0 .. k0+kn
 * (the weights w and the rows of x start at input k0). x: T rows x_ld apart (FP8: the codes,
 * x_ld = H, with their scales xsc, H/bk a row; always all inputs). part: NULL, or a split item's
 * part ([P, MATS, I] f32), which takes the raw sums instead of h (mma_io.part). */
template <typename T, int NT, int MATS, int STAGES>
__device__ __forceinline__ void gate_up_pass(const layer_view &L, const quant_view &Q, const gemv_groups &G, const T *x, int64_t x_ld,
                                             const float *xsc, typename fmt<T>::HT *h, int64_t e, int64_t n0,
                                             int64_t r0, int nr, const T *const (&w)[MATS], T *ring, int lane,
                                             int64_t k0, int64_t kn, float *part, const int *ready, int64_t need) {
    const int g = lane >> 2, t = lane & 3;
    const T *xs[XCOPIES(T, NT)];
#pragma unroll
    for (int i = 0; i < XCOPIES(T, NT); i++) xs[i] = x + (int64_t)G.slot_token[r0 + copy_row<T>(i, nr, lane)] * x_ld + k0;
    lane_scales<MATS, NT> ls;
    if (fmt<T>::QUANT) {
        const int64_t nkb = (L.H + Q.bk - 1) / Q.bk;
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            const scale_view &sv = MATS == 2 && m == 0 ? Q.gate : Q.up;
            ls.w[m] = sv.base;
#pragma unroll
            for (int f = 0; f < 2; f++) ls.wo[m][f] = scale_row(Q, sv, e, n0 + g + 8 * f < L.I ? n0 + g + 8 * f : L.I - 1);
        }
        ls.x = xsc;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int r = 8 * j + 2 * t + q < nr ? 8 * j + 2 * t + q : nr - 1;
                ls.xo[j][q] = (uint32_t)(G.slot_token[r0 + r] * nkb);
            }
    }
    float c[MATS][NT][4];
    int nvalid[MATS];
#pragma unroll
    for (int m = 0; m < MATS; m++) nvalid[m] = L.I - n0 < 16 ? (int)(L.I - n0) : 16;
    stream_rows<T, NT, MATS, STAGES>(w, L.up.n_stride, nvalid, kn, xs, c, ring, lane, Q, ls, ready, need);
    /* c[.][j][0], [1]: feature n0+g, rows 2t, 2t+1 of tile j; [2], [3]: feature n0+g+8. Matrix 0 is
     * the gate of a gated layer, the last one the up projection. */
#pragma unroll
    for (int f = 0; f < 2; f++) {
        const int64_t n = n0 + g + 8 * f;
        if (n >= L.I) continue;
        if (part) {
#pragma unroll
            for (int m = 0; m < MATS; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const int r = j * 8 + 2 * t + q;
                        if (r < nr) part[((r0 + r) * MATS + m) * L.I + n] = c[m][j][2 * f + q];
                    }
            continue;
        }
        const float bu = bias_at(L.up_bias, L.bdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.bdt, e, n) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int r = j * 8 + 2 * t + q;
                if (r < nr)
                    h[(r0 + r) * L.I + n] = from_f32<typename fmt<T>::HT>(
                        activate(L, c[0][j][2 * f + q] + bg, c[MATS - 1][j][2 * f + q] + bu));
            }
    }
}

/* One warp item of gate/up: features n0 .. n0+15 of expert e for all its rows, in passes of up
 * to XROWS rows, over inputs k0 .. k0+kn (all of them unless split; part: gate_up_pass's;
 * ready, need: stream_rows'). */
template <typename T, int MATS, int STAGES>
__device__ __forceinline__ void gate_up_item(const layer_view &L, const quant_view &Q, const gemv_groups &G, const T *x, int64_t x_ld,
                                             const float *xsc, typename fmt<T>::HT *h, int64_t e, int64_t n0, T *ring,
                                             int lane, int64_t k0, int64_t kn, float *part, const int *ready,
                                             int64_t need) {
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *wu = (const T *)proj_base(L.up, e, sizeof(T)) + n0 * L.up.n_stride + k0;
    const T *w[MATS];
    w[MATS - 1] = wu;
    if (MATS == 2) w[0] = (const T *)proj_base(L.gate, e, sizeof(T)) + n0 * L.gate.n_stride + k0;
    for (int64_t r0 = lo; r0 < hi; r0 += PASS_ROWS(T)) {
        const int nr = hi - r0 < PASS_ROWS(T) ? (int)(hi - r0) : PASS_ROWS(T);
        if (PASS_ROWS(T) == 8 || nr <= 8)
            gate_up_pass<T, 1, MATS, STAGES>(L, Q, G, x, x_ld, xsc, h, e, n0, r0, nr, w, ring, lane, k0, kn, part, ready,
                                             need);
        else
            gate_up_pass<T, 2, MATS, STAGES>(L, Q, G, x, x_ld, xsc, h, e, n0, r0, nr, w, ring, lane, k0, kn, part, ready,
                                             need);
        ready = NULL; /* the inputs exist from the second pass on */
    }
}

/* The end of a split item (the warp of its last part): h of expert e's rows for features n0 ..
 * n0+15 from the ksplit parts' sums ([ksplit][P, mats, I]), added in part order, biased and
 * activated. The parts were written by other warps (before their count): read through L2. */
template <typename HT>
__device__ __forceinline__ void finish_split(const layer_view &L, const gemv_groups &G, const float *part, int ksplit,
                                             int64_t P, HT *h, int64_t e, int64_t n0, int lane) {
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const int mats = L.gated ? 2 : 1;
    for (int64_t i = lane; i < (hi - lo) * MFEAT; i += 32) {
        const int64_t r = lo + i / MFEAT, n = n0 + i % MFEAT;
        if (n >= L.I) continue;
        float gs = 0.0f, us = 0.0f;
        for (int s = 0; s < ksplit; s++) {
            const float *ps = part + ((s * P + r) * mats) * L.I + n;
            gs += __ldcg(ps);
            us += __ldcg(ps + (mats - 1) * L.I);
        }
        const float bu = bias_at(L.up_bias, L.bdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.bdt, e, n) : 0.0f;
        h[r * L.I + n] = from_f32<HT>(activate(L, gs + bg, us + bu));
    }
}

/* ---- down: y[slot, n] = down_n . h[slot] + b (f32) --------------------------------- */

/* hin: the down input rows [P, I] (FP8: the codes of h, with their scales hsc, I/bk a row). An
 * item covers DOWN_TILES x 16 features from n0: tile m is features n0 + 16m .. (rows w[m]; a
 * tile past H reads tile 0's rows again and stores nothing). */
enum { DOWN_TILES = 2 };

__device__ __forceinline__ int64_t tile_rows(int64_t N, int64_t n0) { return N - n0 < 16 ? N - n0 : 16; }

template <typename T, int NT, int STAGES>
__device__ __forceinline__ void down_pass(const layer_view &L, const quant_view &Q, const T *hin, const float *hsc,
                                          float *y, int64_t e, int64_t n0, int64_t r0, int nr,
                                          const T *const (&w)[DOWN_TILES], T *ring, int lane, const int *ready,
                                          int64_t need) {
    const int g = lane >> 2, t = lane & 3;
    const T *xs[XCOPIES(T, NT)];
#pragma unroll
    for (int i = 0; i < XCOPIES(T, NT); i++) xs[i] = hin + (r0 + copy_row<T>(i, nr, lane)) * L.I;
    lane_scales<DOWN_TILES, NT> ls;
    if (fmt<T>::QUANT) {
        const int64_t nkb = (L.I + Q.bk - 1) / Q.bk;
#pragma unroll
        for (int m = 0; m < DOWN_TILES; m++) {
            ls.w[m] = Q.down.base;
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const int64_t n = n0 + 16 * m + g + 8 * f;
                ls.wo[m][f] = scale_row(Q, Q.down, e, n < L.H ? n : L.H - 1);
            }
        }
        ls.x = hsc;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 2; q++)
                ls.xo[j][q] = (uint32_t)((r0 + (8 * j + 2 * t + q < nr ? 8 * j + 2 * t + q : nr - 1)) * nkb);
    }
    float c[DOWN_TILES][NT][4];
    int nvalid[DOWN_TILES];
#pragma unroll
    for (int m = 0; m < DOWN_TILES; m++) nvalid[m] = (int)tile_rows(L.H, n0 + 16 * m > L.H - 1 ? n0 : n0 + 16 * m);
    stream_rows<T, NT, DOWN_TILES, STAGES>(w, L.down.n_stride, nvalid, L.I, xs, c, ring, lane, Q, ls, ready, need);
#pragma unroll
    for (int m = 0; m < DOWN_TILES; m++)
#pragma unroll
        for (int f = 0; f < 2; f++) {
            const int64_t n = n0 + 16 * m + g + 8 * f;
            if (n >= L.H) continue;
            const float b = bias_at(L.down_bias, L.bdt, e, n);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int r = j * 8 + 2 * t + q;
                    if (r < nr) y[(r0 + r) * L.H + n] = c[m][j][2 * f + q] + b;
                }
        }
}

/* One warp item of down: features n0 .. n0 + 16 DOWN_TILES - 1 of expert e for all its rows, its
 * h rows once *ready reaches need (stream_rows: the first stages' weights are copied before). */
template <typename T, int STAGES>
__device__ __forceinline__ void down_item(const layer_view &L, const quant_view &Q, const gemv_groups &G, const T *hin,
                                          const float *hsc, float *y, int64_t e, int64_t n0, T *ring, int lane,
                                          const int *ready, int64_t need) {
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *w[DOWN_TILES];
#pragma unroll
    for (int m = 0; m < DOWN_TILES; m++)
        w[m] = (const T *)proj_base(L.down, e, sizeof(T)) + (n0 + 16 * m < L.H ? n0 + 16 * m : n0) * L.down.n_stride;
    for (int64_t r0 = lo; r0 < hi; r0 += PASS_ROWS(T)) {
        const int nr = hi - r0 < PASS_ROWS(T) ? (int)(hi - r0) : PASS_ROWS(T);
        if (PASS_ROWS(T) == 8 || nr <= 8)
            down_pass<T, 1, STAGES>(L, Q, hin, hsc, y, e, n0, r0, nr, w, ring, lane, ready, need);
        else
            down_pass<T, 2, STAGES>(L, Q, hin, hsc, y, e, n0, r0, nr, w, ring, lane, ready, need);
        ready = NULL; /* h exists from the second pass on */
    }
}

/* ---- FP8: the activations, quantized inside the launch ---------------------------------- */

/* The quantization items of each input row: chunks of 256 inputs (quant_chunk: one load a lane;
 * the gate/up items wait for all of them) where the rows allow it, else 1 (the row). */
__device__ __forceinline__ int64_t x_chunks(const layer_view &L, const quant_view &Q, const mma_io &io) {
    const bool vec = quant_chunks_apply(io.x, io.xdt == MOEX_F32 ? 4 : 2, io.x_ld, L.H, Q.bk);
    return vec ? (L.H / 8 + 31) / 32 : 1;
}

/* Item i of x's quantization (chunk i % chunks of row i / chunks, or the row) -> xq, xs, with
 * act_quant_e4m3's rounding. */
template <typename XT>
__device__ __forceinline__ void quant_x_item(const layer_view &L, const quant_view &Q, const mma_io &io, int64_t i,
                                             int64_t chunks, int lane) {
    const int64_t t = i / chunks, nkb = (L.H + Q.bk - 1) / Q.bk;
    const XT *x = (const XT *)io.x + t * io.x_ld;
    uint8_t *q = io.xq + t * L.H;
    float *s = io.xs + t * nkb;
    if (chunks == 1)
        quant_row_e4m3(x, L.H, Q.bk, q, s, (float *)NULL, lane);
    else
        quant_chunk<XT, false>(x, L.H, Q.bk, i % chunks, q, s, (float *)NULL, lane);
}

__device__ __forceinline__ void quant_x(const layer_view &L, const quant_view &Q, const mma_io &io, int64_t i,
                                        int64_t chunks, int lane) {
    if (io.xdt == MOEX_BF16)
        quant_x_item<__nv_bfloat16>(L, Q, io, i, chunks, lane);
    else if (io.xdt == MOEX_F16)
        quant_x_item<__half>(L, Q, io, i, chunks, lane);
    else
        quant_x_item<float>(L, Q, io, i, chunks, lane);
}

/* The h rows of expert e (f32, written by every gate/up item of e) -> hq, hs. */
__device__ __forceinline__ void quant_h_rows(const layer_view &L, const quant_view &Q, const gemv_groups &G,
                                             const mma_io &io, int64_t e, int lane) {
    const int64_t nkb = (L.I + Q.bk - 1) / Q.bk;
    for (int64_t r = G.offsets[e]; r < G.offsets[e + 1]; r++)
        quant_row_e4m3((const float *)io.h + r * L.I, L.I, Q.bk, io.hq + r * L.I, io.hs + r * nkb, (float *)NULL, lane);
}

/* ---- the forward in one launch ----------------------------------------------------------
 *
 * Work items, handed out in order by one counter (sched): FP8 first quantizes the T input rows
 * (x_chunks items a row), then gate/up items (hit expert j, 16 features f) for j = 0 .. n_hit-1, f = 0 ..
 * ceil(I/16)-1 (split along K into ksplit parts, consecutive items, when there are fewer of
 * them than warps: split_parts; the last part of an item to finish makes its h and counts it),
 * then down items (j, 32 features of H: DOWN_TILES tiles of 16) in the same order. A warp takes the next
 * item when it finishes one, so every SM keeps streaming weights until the last item, with no
 * kernel boundary between the projections. A gate/up item (FP8) copies its first stages'
 * weights, then waits until xdone counts the quantization items; a down item of expert e also
 * copies its first stages' weights, then waits until done[e] (sched[e]) counts all ceil(I/16)
 * gate/up items of e (FP8: and one more, which the warp of the last of them adds once it has
 * quantized e's h rows), so that a waiting warp keeps weights in flight (down items do wait: at
 * qwen3-30b-a3b FP8 8 tokens about 45 polls an item, 7% of the warps' time, where the gate/up
 * items' wait for x is over before they look; copying before the wait took 0.970-0.982 of the
 * time there, bench/results/2026-12-07_cuda-h100_bf16-fp8_down-weights-before-wait-ab.csv).
 * Every item waited for was handed out before the waiting one, to a warp that is running and
 * waits only for earlier items, so every wait ends. */

/* The parts of each gate/up item (1: not split): when splitting is allowed and there are fewer
 * groups (items of 16 features) than warps, the fewest parts, each of at least MMA_SPLIT_MIN_K
 * inputs, that keep 7 of 8 warps busy (the parts in whole waves of the warps: one token of
 * deepseek-v3 on 2112 warps, 1024 groups: 2 parts), else the count that keeps the most busy. */
__device__ __forceinline__ int split_parts(bool allowed, int64_t groups, int64_t warps, int64_t K) {
    if (!allowed || groups <= 0 || groups > ROUTING_SCHED_SPLIT || groups >= warps) return 1;
    const int64_t most = K / MMA_SPLIT_MIN_K < MMA_KSPLIT_MAX ? K / MMA_SPLIT_MIN_K : MMA_KSPLIT_MAX;
    int best = 1;
    double best_busy = 0.0;
    for (int p = 1; p <= most; p++) {
        const int64_t items = groups * p, waves = (items + warps - 1) / warps;
        const double busy = (double)items / (double)(waves * warps);
        if (busy > best_busy + 1e-9) best = p, best_busy = busy;
        if (busy >= 0.875) return p;
    }
    return best;
}

/* The configuration: stages of 128 bytes a row, fmt<T>::WARPS warps a block sharing
 * STREAM_SMEM bytes of shared memory (a ring each), one block an SM (216 KiB). bf16/f16: 16
 * warps, a stage of gated gate/up or of down (2 x 16 weight rows) and the input rows, ST2 = 2
 * of them fit the ring; ungated gate/up ST1 = 3; measured against 8 and 12 warps, 256-byte
 * stages and deeper rings (dev/notes/cuda-notes.md, "cp.async"). FP8: 12 warps, ST2 = 3, ST1 = 4. */
enum { STREAM_SMEM = 221184 };
template <typename T> struct launch_geom {
    enum { WARPS = fmt<T>::WARPS, RING = STREAM_SMEM / WARPS / 128 * 128 };
};

/* sched: done[E], then at the next even index the 64-bit item counter, then xdone (E + 4 ints
 * at most, zeroed by routing_build). */
template <typename T>
__global__ void __launch_bounds__(fmt<T>::WARPS * 32, 1)
    experts_mma_kernel(layer_view L, gemv_groups G, const int *hit, const int *n_hit, int *sched, mma_io io) {
    constexpr int QUANT = fmt<T>::QUANT, RING = launch_geom<T>::RING, ST2 = RING / ((2 * 16 + XROWS) * STAGE_BYTES),
                  ST1 = RING / ((16 + XROWS) * STAGE_BYTES);
    static_assert(ST2 >= 2, "two stages at least");
    typedef typename fmt<T>::HT HT;
    extern __shared__ __align__(128) unsigned char smem[];
    T *ring = (T *)(smem + (threadIdx.x >> 5) * RING);
    const int lane = threadIdx.x & 31;
    const int64_t fg_gu = (L.I + MFEAT - 1) / MFEAT, fg_dn = (L.H + DOWN_TILES * MFEAT - 1) / (DOWN_TILES * MFEAT);
    const int64_t xch = QUANT ? x_chunks(L, io.q, io) : 1, n_x = QUANT ? G.T * xch : 0;
    const int64_t hits = *n_hit, groups = hits * fg_gu, P = G.T * G.k;
    /* split gate/up items (gemv.cuh): parts of kchunk inputs (whole 128-byte stages) */
    const int ksplit = QUANT ? 1 : split_parts(io.part != NULL, groups, (int64_t)gridDim.x * (blockDim.x >> 5), L.H);
    const int64_t kchunk = ksplit > 1 ? ((L.H + ksplit - 1) / ksplit + geom<T>::KT - 1) / geom<T>::KT * geom<T>::KT : L.H;
    const int64_t n_gu = n_x + groups * ksplit, total = n_gu + hits * fg_dn;
    int *done = sched;
    const int64_t ctr = (L.E + 1) & ~(int64_t)1;
    unsigned long long *next = (unsigned long long *)(sched + ctr);
    int *xdone = sched + ctr + 2;
    int *split_done = sched + L.E + 4; /* routing_sched_ints: a count a split item */
    /* gate/up reads x (bf16/f16) or its codes; down reads h or its codes */
    const T *xin = QUANT ? (const T *)io.xq : (const T *)io.x;
    const int64_t xin_ld = QUANT ? L.H : io.x_ld;
    const T *hin = QUANT ? (const T *)io.hq : (const T *)io.h;
    for (;;) {
        unsigned long long item = 0;
        if (lane == 0) item = atomicAdd(next, 1ull);
        item = __shfl_sync(0xffffffffu, item, 0);
        if (item >= (unsigned long long)total) return;
        if (QUANT && item < (unsigned long long)n_x) {
            quant_x(L, io.q, io, (int64_t)item, xch, lane);
            __threadfence();
            __syncwarp();
            if (lane == 0) atomicAdd(xdone, 1);
        } else if (item < (unsigned long long)n_gu) {
            item -= n_x;
            /* item group (hit expert, 16 features), then its part along K */
            const int64_t grp = (int64_t)item / ksplit, part_i = (int64_t)item % ksplit;
            const int64_t e = hit[grp / fg_gu], n0 = MFEAT * (grp % fg_gu);
            const int64_t k0 = part_i * kchunk, kn = L.H - k0 < kchunk ? L.H - k0 : kchunk;
            float *part = ksplit > 1 ? io.part + part_i * P * (L.gated ? 2 : 1) * L.I : NULL;
            /* FP8: the first stages' weights are copied while x is quantized (stream_rows' wait) */
            const int *ready = QUANT ? xdone : NULL;
            if (L.gated)
                gate_up_item<T, 2, ST2>(L, io.q, G, xin, xin_ld, io.xs, (HT *)io.h, e, n0, ring, lane, k0, kn, part,
                                        ready, n_x);
            else
                gate_up_item<T, 1, ST1>(L, io.q, G, xin, xin_ld, io.xs, (HT *)io.h, e, n0, ring, lane, k0, kn, part,
                                        ready, n_x);
            __threadfence(); /* this lane's h (or part) stores before the count (a grid reduction's pattern) */
            __syncwarp();
            if (ksplit > 1) { /* the last part to finish makes h */
                int parts_before = 0;
                if (lane == 0) parts_before = atomicAdd(&split_done[grp], 1);
                parts_before = __shfl_sync(0xffffffffu, parts_before, 0);
                if (parts_before != ksplit - 1) continue;
                __threadfence();
                finish_split(L, G, io.part, ksplit, P, (HT *)io.h, e, n0, lane);
                __threadfence();
                __syncwarp();
            }
            int before = 0;
            if (lane == 0) before = atomicAdd(&done[e], 1);
            before = __shfl_sync(0xffffffffu, before, 0);
            if (QUANT && before == fg_gu - 1) { /* the last gate/up item of e: its h rows are complete */
                __threadfence();
                quant_h_rows(L, io.q, G, io, e, lane);
                __threadfence();
                __syncwarp();
                if (lane == 0) atomicAdd(&done[e], 1);
            }
        } else {
            item -= n_gu;
            const int64_t e = hit[item / fg_dn];
            down_item<T, ST2>(L, io.q, G, hin, io.hs, io.y, e, DOWN_TILES * MFEAT * (int64_t)(item % fg_dn), ring, lane,
                              &done[e], fg_gu + QUANT);
        }
    }
}

/* ---- launcher ----------------------------------------------------------------------- */

int gemv_mma_usable(const layer_view &L, const quant_view &Q, moex_dtype xdt, const void *x, int64_t x_ld) {
    if (L.wdt == MOEX_E4M3) /* any float x: the launch quantizes it */
        return Q.on && Q.bk % CHUNK_BYTES == 0 && L.H % 16 == 0 && L.I % 16 == 0 && gemv_vectorizable(L, 1);
    if (L.wdt != MOEX_BF16 && L.wdt != MOEX_F16) return 0;
    if (xdt != L.wdt || ((uintptr_t)x & 15) || (x_ld * 2) % 16) return 0;
    return L.H % (CHUNK_BYTES / 2) == 0 && L.I % (CHUNK_BYTES / 2) == 0 && gemv_vectorizable(L, 2);
}

static int g_blocks[3]; /* blocks an SM holds, bf16, f16 and e4m3 (gemv_mma_init): 1, or 0 if none fits */
static cudaError_t g_init_err;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

template <typename T> static cudaError_t allow_smem(int *blocks) {
    cudaError_t err = cudaFuncSetAttribute(experts_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, STREAM_SMEM);
    if (!err) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, experts_mma_kernel<T>, fmt<T>::WARPS * 32,
                                                                 STREAM_SMEM);
    return err;
}

static void init_blocks(void) {
    g_init_err = allow_smem<__nv_bfloat16>(&g_blocks[0]);
    if (!g_init_err) g_init_err = allow_smem<__half>(&g_blocks[1]);
    if (!g_init_err) g_init_err = allow_smem<uint8_t>(&g_blocks[2]);
}

moex_status gemv_mma_init(void) {
    pthread_once(&g_init_once, init_blocks);
    return moex_cuda_status(g_init_err, "streamed experts kernel: shared memory size");
}

moex_status gemv_mma_experts(const layer_view &L, const gemv_groups &G, const int *hit, const int *n_hit, int *sched,
                             const mma_io &io, int num_sms, cudaStream_t s) {
    const int d = L.wdt == MOEX_BF16 ? 0 : L.wdt == MOEX_F16 ? 1 : 2;
    if (g_blocks[d] < 1)
        return moex_fail(MOEX_ERR_INTERNAL, "streamed experts kernel: %d bytes of shared memory per block do not fit an SM "
                         "(or gemv_mma_init was not called)", STREAM_SMEM);
    const dim3 grid((unsigned)(num_sms * g_blocks[d]));
    if (d == 0)
        experts_mma_kernel<__nv_bfloat16><<<grid, fmt<__nv_bfloat16>::WARPS * 32, STREAM_SMEM, s>>>(L, G, hit, n_hit, sched, io);
    else if (d == 1)
        experts_mma_kernel<__half><<<grid, fmt<__half>::WARPS * 32, STREAM_SMEM, s>>>(L, G, hit, n_hit, sched, io);
    else
        experts_mma_kernel<uint8_t><<<grid, fmt<uint8_t>::WARPS * 32, STREAM_SMEM, s>>>(L, G, hit, n_hit, sched, io);
    return MOEX_CUDA_LAUNCHED("streamed experts kernel (tensor cores)");
}
