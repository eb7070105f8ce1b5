/* act_quant.cuh — dynamic activation quantization on the GPU, per row per block, with the CPU's
 * rounding (src/core/quant.h, moex_act_quant_row; docs/backends.md "What is rounded where"):
 *   FP8 experts, blocks of bk:  amax of the block, s = amax / 448 (1 for an all-zero block),
 *     code = e4m3(clamp(x / s, +-448)) to nearest, ties to even;
 *   FP4 experts, blocks of 32:  s = 2^(floor(log2 amax) - 2) (1 for an all-zero block), the value
 *     e2m1(clamp(x / s, +-6)) to nearest, ties to even, kept as the int8 code 2 e2m1 (-12 .. 12);
 * the projection reads code * s (FP4: code * s / 2).
 *
 * quant_row is the warp-level piece (the streamed experts kernel calls it inside its launch);
 * act_quant_e4m3 / act_quant_e2m1 launch it over rows (batched_mm's quantized paths, the
 * grouped GEMM's h), act_quant_gather_e4m3 over tokens into their pairs' rows in expert order. */
#ifndef MOEX_ACT_QUANT_CUH
#define MOEX_ACT_QUANT_CUH

#include "backends/cuda/device_common.cuh"
#include "core/internal.h"
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#define ACT_E4M3_MAX 448.0f
#define ACT_E2M1_MAX 6.0f
#define ACT_E2M1_BLOCK 32

/* The scale of an FP4 activation block with largest magnitude amax: 2^(e - 127), e the biased
 * exponent of amax minus e2m1's largest exponent (2), at least 1; 1 when amax is 0. */
__device__ __forceinline__ float e2m1_block_scale(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    const int e = (int)(__float_as_uint(amax) >> 23) - 2;
    return __uint_as_float((uint32_t)(e < 1 ? 1 : e) << 23);
}
/* y clamped to +-6, then to the nearest e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to even. */
__device__ __forceinline__ float e2m1_round(float y) {
    y = y > ACT_E2M1_MAX ? ACT_E2M1_MAX : y < -ACT_E2M1_MAX ? -ACT_E2M1_MAX : y;
    const float a = fabsf(y);
    float r;
    if (a < 1.0f) { /* subnormal grid: steps of 0.5 */
        r = rintf(a * 2.0f) * 0.5f;
    } else { /* one mantissa bit: drop 22 bits, to nearest even */
        uint32_t u = __float_as_uint(a);
        u += ((1u << 21) - 1u) + ((u >> 22) & 1u);
        r = __uint_as_float(u & ~((1u << 22) - 1u));
    }
    return copysignf(r, y);
}

/* Loads through L2 (__ldcg): a row may have been written by another block of the same launch. */
__device__ __forceinline__ float load_cg(const float *p) { return __ldcg(p); }
__device__ __forceinline__ float load_cg(const __nv_bfloat16 *p) { return __bfloat162float(__ldcg(p)); }
__device__ __forceinline__ float load_cg(const __half *p) { return __half2float(__ldcg(p)); }

__device__ __forceinline__ float e4m3_value(uint8_t c) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3)));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* 8 inputs from 16-byte aligned p (two loads for f32), through L2. */
__device__ __forceinline__ void load8_cg(const __nv_bfloat16 *p, float (&v)[8]) {
    const uint4 u = __ldcg((const uint4 *)p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        v[2 * i] = t.x, v[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void load8_cg(const __half *p, float (&v)[8]) {
    const uint4 u = __ldcg((const uint4 *)p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __half22float2(*(const __half2 *)&w[i]);
        v[2 * i] = t.x, v[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void load8_cg(const float *p, float (&v)[8]) {
    const float4 a = __ldcg((const float4 *)p), b = __ldcg((const float4 *)p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* The block scale of a lane's 8 inputs: their amax reduced over the vpb lanes of the block (vpb
 * = bk / 8, a power of two <= 32, so blocks never straddle 32 vectors; every lane of the warp
 * calls it, lanes past the row with zeros). */
template <bool FP4> __device__ __forceinline__ float vec8_block_scale(const float (&v)[8], int vpb) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(v[i]));
    for (int o = 1; o < vpb; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    return FP4 ? e2m1_block_scale(a) : a > 0.0f ? a / ACT_E4M3_MAX : 1.0f;
}

/* The 8 codes of vector vi (scale sc) in the row's byte order (input i: byte i % 4 of word
 * i / 4); FP4: the int8 codes 2 e2m1. f (if not NULL) gets the values the projection reads. */
template <bool FP4>
__device__ __forceinline__ uint2 vec8_codes(const float (&v)[8], float sc, int64_t vi, float *f) {
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint8_t c;
        if (FP4) {
            const float r = e2m1_round(v[i] / sc);
            c = (uint8_t)(int8_t)__float2int_rn(2.0f * r);
            if (f) f[8 * vi + i] = r * sc;
        } else {
            c = (uint8_t)__nv_cvt_float_to_fp8(v[i] / sc, __NV_SATFINITE, __NV_E4M3);
            if (f) f[8 * vi + i] = e4m3_value(c) * sc;
        }
        packed[i / 4] |= (uint32_t)c << (8 * (i % 4));
    }
    return make_uint2(packed[0], packed[1]);
}

/* Vectors of 8 inputs, one a lane: vector v of the row quantized (vec8_block_scale, vec8_codes).
 * in = 0: past the row (contributes nothing, stores nothing). */
template <bool FP4>
__device__ __forceinline__ void quant_vec8(const float (&v)[8], bool in, int vpb, int64_t vi, uint8_t *q, float *s,
                                           float *f, int lane) {
    const float sc = vec8_block_scale<FP4>(v, vpb);
    if (!in) return;
    const uint2 codes = vec8_codes<FP4>(v, sc, vi, f);
    if (q) *(uint2 *)(q + 8 * vi) = codes;
    if (s && lane % vpb == 0) s[vi >> (__ffs(vpb) - 1)] = sc; /* vpb a power of two: no 64-bit division */
}

/* One row x[0 .. K) by one warp: codes q[k] (or NULL), block scales s[k / bk] (or NULL) and the
 * values the projection reads, f[k] = code * s (f32, or NULL; f may be x when XT is float).
 * Rows of 16-byte aligned x and 8-byte aligned q, K a multiple of 8 and bk / 8 a power of two
 * up to 32 go 8 inputs a lane, two vectors in flight; any other row one input a lane.
 * FP4: bk = 32, q the int8 codes 2 e2m1. */
template <typename XT, bool FP4>
__device__ __forceinline__ void quant_row(const XT *x, int64_t K, int64_t bk, uint8_t *q, float *s, float *f,
                                          int lane) {
    const int64_t vpb = bk / 8;
    if (K % 8 == 0 && bk % 8 == 0 && vpb <= 32 && (vpb & (vpb - 1)) == 0 && ((uintptr_t)x & 15) == 0 &&
        ((uintptr_t)q & 7) == 0) {
        const int64_t nvec = K / 8;
        for (int64_t v0 = 0; v0 < nvec; v0 += 64) {
            const int64_t va = v0 + lane, vb = v0 + 32 + lane;
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) a[i] = b[i] = 0.0f;
            if (va < nvec) load8_cg(x + 8 * va, a);
            if (vb < nvec) load8_cg(x + 8 * vb, b);
            quant_vec8<FP4>(a, va < nvec, (int)vpb, va, q, s, f, lane);
            if (v0 + 32 < nvec) quant_vec8<FP4>(b, vb < nvec, (int)vpb, vb, q, s, f, lane);
        }
        return;
    }
    for (int64_t k0 = 0, kb = 0; k0 < K; k0 += bk, kb++) {
        const int64_t k1 = k0 + bk < K ? k0 + bk : K;
        float amax = 0.0f;
        for (int64_t k = k0 + lane; k < k1; k += 32) amax = fmaxf(amax, fabsf(load_cg(x + k)));
        amax = warp_max(amax);
        if (FP4) {
            const float sc = e2m1_block_scale(amax);
            for (int64_t k = k0 + lane; k < k1; k += 32) {
                const float r = e2m1_round(load_cg(x + k) / sc);
                if (q) q[k] = (uint8_t)(int8_t)__float2int_rn(2.0f * r);
                if (f) f[k] = r * sc;
            }
            if (s && lane == 0) s[kb] = sc;
            continue;
        }
        const float sc = amax > 0.0f ? amax / ACT_E4M3_MAX : 1.0f;
        for (int64_t k = k0 + lane; k < k1; k += 32) {
            const uint8_t c = (uint8_t)__nv_cvt_float_to_fp8(load_cg(x + k) / sc, __NV_SATFINITE, __NV_E4M3);
            if (q) q[k] = c;
            if (f) f[k] = e4m3_value(c) * sc;
        }
        if (s && lane == 0) s[kb] = sc;
    }
}

/* Rows that quantize in chunks of 256 inputs, a vector of 8 a lane (quant_chunk): 16-byte aligned
 * x with rows x_ld elements of es bytes apart, K a multiple of 8, bk / 8 a power of two up to 32
 * (a chunk of 32 vectors holds whole blocks). */
__host__ __device__ inline bool quant_chunks_apply(const void *x, int64_t es, int64_t x_ld, int64_t K, int64_t bk) {
    const int64_t vpb = bk / 8;
    return K % 8 == 0 && bk % 8 == 0 && vpb >= 1 && vpb <= 32 && (vpb & (vpb - 1)) == 0 && ((uintptr_t)x & 15) == 0 &&
           (x_ld * es) % 16 == 0;
}

/* Chunk c of one row x[0 .. K) (quant_chunks_apply's rows): lane l quantizes vector 32 c + l
 * into q, s and f as quant_row does (lanes past the row store nothing). */
template <typename XT, bool FP4>
__device__ __forceinline__ void quant_chunk(const XT *x, int64_t K, int64_t bk, int64_t c, uint8_t *q, float *s,
                                            float *f, int lane) {
    const int64_t v = c * 32 + lane;
    const bool in = v < K / 8;
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; i++) a[i] = 0.0f;
    if (in) load8_cg(x + 8 * v, a);
    quant_vec8<FP4>(a, in, (int)(bk / 8), v, q, s, f, lane);
}

template <typename XT>
__device__ __forceinline__ void quant_row_e4m3(const XT *x, int64_t K, int64_t bk, uint8_t *q, float *s, float *f,
                                               int lane) {
    quant_row<XT, false>(x, K, bk, q, s, f, lane);
}

/* rows rows of x (dtype xdt, row stride x_ld elements, K inputs) quantized per bk: codes into
 * q [rows, K] (or NULL), scales into s [rows, ceil(K/bk)] (or NULL), code * scale into f
 * [rows, K] f32 (or NULL; f may be x when x is f32 with x_ld = K). One warp a row (or a chunk).
 * after_prev: launched as a programmatic dependent of the stream's previous kernel
 * (dependent_launch), whose output x may be: the blocks start as that kernel ends and wait for
 * it (griddepcontrol.wait) before reading; the kernels let their own dependents start at once. */
moex_status act_quant_e4m3(const void *x, moex_dtype xdt, int64_t x_ld, int64_t rows, int64_t K, int64_t bk,
                           uint8_t *q, float *s, float *f, int after_prev, cudaStream_t st);

/* act_quant_e4m3 (codes and scales only) of the rows pair_slot[p] of x, p < P, a sentinel's -1
 * skipped: the padded and masked layouts, whose other rows hold nothing. */
moex_status act_quant_slots_e4m3(const int *pair_slot, int64_t P, const void *x, moex_dtype xdt, int64_t x_ld,
                                 int64_t K, int64_t bk, uint8_t *q, float *s, cudaStream_t st);

/* FP4's rounding of rows rows of x (K inputs, blocks of 32): int8 codes 2 e2m1 into q [rows, K],
 * the blocks' scales into s [rows, K/32]. One warp a row (or a chunk); a plain launch. */
moex_status act_quant_e2m1(const void *x, moex_dtype xdt, int64_t x_ld, int64_t rows, int64_t K, int8_t *q, float *s,
                           cudaStream_t st);

/* The same rounding, gathered in expert order (the FP8 grouped GEMM's A): token t's row of x
 * quantized into row pair_slot[t*k+j] of q [P, K] and s [P, ceil(K/bk)] for every pair that is
 * not a sentinel (slot -1). */
moex_status act_quant_gather_e4m3(const int *pair_slot, int64_t T, int64_t k, const void *x, moex_dtype xdt,
                                  int64_t x_ld, int64_t K, int64_t bk, uint8_t *q, float *s, cudaStream_t st);

#endif
