/* quant.h — quantized element types inside libmoex: the arithmetic the
 * compute kernels share (public codecs are in moex.h, src/core/quant.c). */
#ifndef MOEX_QUANT_H
#define MOEX_QUANT_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif
#include <math.h>

/* Largest finite magnitudes. */
#define MOEX_E4M3_MAX 448.0f
#define MOEX_E2M1_MAX 6.0f
/* Activation block for FP4 (MX): 32 channels. */
#define MOEX_FP4_BLOCK 32

static inline int moex_is_quant_dtype(moex_dtype dt) { return dt == MOEX_E4M3 || dt == MOEX_E2M1X2; }

static inline float moex_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t moex_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* e4m3 code as the kernels read it, times 2^-120: the code's sign, exponent and
 * mantissa moved into f32's fields ((int8)c << 20 & 0x87F00000). Exact for every
 * finite code, subnormals included; the NaN codes 0x7F/0xFF read as +-480 * 2^-120. */
static inline float moex_e4m3_raw(uint8_t c) {
    return moex_bits_to_f32(((uint32_t)(int32_t)(int8_t)c << 20) & 0x87F00000u);
}
/* 2^120, the factor that turns moex_e4m3_raw into the value. */
#define MOEX_E4M3_RAW_UNIT 1.329227995784916e36f

/* 2^(b-127), inline (moex_ue8m0_to_f32 without its NaN case: b = 255 reads as 2^128 = inf). */
static inline float moex_ue8m0_value(uint8_t b) {
    return moex_bits_to_f32(b ? (uint32_t)b << 23 : 0x00400000u); /* 2^-127 is subnormal */
}

/* A block scale: element i of a f32 or ue8m0 scale array. */
static inline float moex_scale_at(const void *s, moex_dtype dt, int64_t i) {
    return dt == MOEX_UE8M0 ? moex_ue8m0_value(((const uint8_t *)s)[i]) : ((const float *)s)[i];
}

/* Round y (already within +-max) to the grid of a float with `mbits` mantissa
 * bits whose smallest normal is 2^emin: nearest, ties to even. */
static inline float moex_round_minifloat(float y, int mbits, int emin) {
    const float min_normal = moex_bits_to_f32((uint32_t)(emin + 127) << 23);
    if (fabsf(y) < min_normal) { /* subnormal grid: quantum 2^(emin - mbits) */
        const float q = moex_bits_to_f32((uint32_t)(mbits - emin + 127) << 23);
        return nearbyintf(y * q) / q;
    }
    uint32_t u = moex_f32_to_bits(y), drop = 23u - (uint32_t)mbits;
    u += ((1u << (drop - 1)) - 1u) + ((u >> drop) & 1u);
    return moex_bits_to_f32(u & ~((1u << drop) - 1u));
}

/* The scale of one activation block with largest magnitude amax:
 *   FP8: amax / 448 in f32 (1 when amax is 0);  FP4: 2^(floor(log2 amax) - 2) (1 when 0). */
static inline float moex_act_block_scale(float amax, moex_dtype wdt) {
    if (!(amax > 0.0f)) return 1.0f;
    if (wdt == MOEX_E4M3) return amax / MOEX_E4M3_MAX;
    int32_t e = (int32_t)(moex_f32_to_bits(amax) >> 23) - 2; /* biased exponent of amax, minus emax(e2m1) */
    return moex_bits_to_f32((uint32_t)(e < 1 ? 1 : e) << 23);
}

/* Dynamic activation quantization of one row (portable reference of the
 * kernels' act_quant): per block of `block` channels, s = moex_act_block_scale,
 * out[i] = round(clamp(x[i] / s, +-max)) * s, all in f32. out may be x. */
void moex_act_quant_row(const float *x, float *out, int64_t n, moex_dtype wdt, int64_t block);

/* Dequantize row r (0-based, physical) of a quantized matrix [rows, K] into dst[K] (f32):
 * q e4m3 (K bytes a row) or e2m1x2 (K/2), scale grid with scale_ld entries a row. */
void moex_dequant_row(const void *q, moex_dtype dt, const void *scale, moex_dtype sdt, int64_t scale_ld,
                      int64_t block_n, int64_t block_k, int64_t r, int64_t K, float *dst);

#ifdef __cplusplus
}
#endif

#endif
