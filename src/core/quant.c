/* quant.c — the quantized element types: e4m3, e2m1 and ue8m0 codecs, block
 * quantization with transformers' recipe and its inverse, and the dynamic
 * activation quantization the CPU kernels apply (reference version). */
#include "core/quant.h"
#include <stdio.h>
#include <stdlib.h>

/* ---- codecs ------------------------------------------------------------- */

static const float E2M1_VALUES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float moex_e4m3_to_f32(uint8_t code) {
    if ((code & 0x7F) == 0x7F) return NAN;
    return moex_e4m3_raw(code) * MOEX_E4M3_RAW_UNIT; /* exact: a power-of-two change of exponent */
}

uint8_t moex_f32_to_e4m3(float value) {
    if (isnan(value)) return 0x7F;
    const uint8_t sign = signbit(value) ? 0x80 : 0;
    float a = fabsf(value);
    if (a > MOEX_E4M3_MAX) a = MOEX_E4M3_MAX;
    const float r = moex_round_minifloat(a, 3, -6);
    if (r < ldexpf(1.0f, -6)) return sign | (uint8_t)(r * 512.0f); /* subnormal: m * 2^-9 */
    int ex;
    const float f = frexpf(r, &ex); /* r = f * 2^ex, f in [0.5, 1) */
    const int e = ex - 1 + 7, m = (int)((f * 2.0f - 1.0f) * 8.0f);
    return sign | (uint8_t)(e << 3) | (uint8_t)m;
}

float moex_e2m1_to_f32(uint8_t nibble) {
    const float v = E2M1_VALUES[nibble & 7];
    return nibble & 8 ? -v : v;
}

uint8_t moex_f32_to_e2m1(float value) {
    if (isnan(value)) return 0;
    const uint8_t sign = signbit(value) ? 8 : 0;
    float a = fabsf(value);
    if (a > MOEX_E2M1_MAX) a = MOEX_E2M1_MAX;
    const float r = moex_round_minifloat(a, 1, 0);
    uint8_t c = 0;
    while (c < 7 && E2M1_VALUES[c] != r) c++;
    return sign | c;
}

float moex_ue8m0_to_f32(uint8_t code) {
    return code == 255 ? NAN : moex_ue8m0_value(code);
}

uint8_t moex_f32_to_ue8m0(float value) {
    if (!(value > 0.0f)) return 127;
    if (isinf(value)) return 254;
    int ex;
    const float f = frexpf(value, &ex);
    int e = f == 0.5f ? ex - 1 : ex; /* ceil(log2(value)) */
    e += 127;
    return (uint8_t)(e < 0 ? 0 : e > 254 ? 254 : e);
}

/* ---- formats ------------------------------------------------------------ */

static const char *const FORMAT_NAMES[] = {"fp8", "fp8-ue8m0", "fp4"};

moex_status moex_quant_format_parse(const char *name, moex_quant_format *out) {
    if (!name || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_quant_format_parse: %s is NULL", name ? "out" : "name");
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, FORMAT_NAMES[i])) {
            *out = (moex_quant_format)i;
            return MOEX_OK;
        }
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "unknown quantization format \"%s\"; valid: fp8, fp8-ue8m0, fp4", name);
}

const char *moex_quant_format_name(moex_quant_format format) {
    return (unsigned)format < 3 ? FORMAT_NAMES[format] : "invalid";
}

/* ---- block quantization ------------------------------------------------- */

/* The [E, N, K] sizes of a rank-2 or rank-3 float tensor (rank 2: E = 1). */
static moex_status logical_dims(const moex_tensor *t, const char *what, int64_t dims[3]) {
    if (!t) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    if (t->ndim != 2 && t->ndim != 3)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: rank %d, expected [E, N, K] or [N, K]", what, t->ndim);
    dims[0] = t->ndim == 3 ? t->shape[0] : 1;
    dims[1] = t->shape[t->ndim - 2];
    dims[2] = t->shape[t->ndim - 1];
    return MOEX_OK;
}

/* Check the quantized tensor q and the scale grid against plain sizes E, N, K. */
static moex_status check_quant_pair(const moex_tensor *q, const moex_tensor *s, int rank, const int64_t dims[3],
                                    int64_t bn, int64_t bk, const char *qname, const char *sname) {
    if (bn < 1 || bk < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "block_n = %lld, block_k = %lld: both must be >= 1", (long long)bn,
                         (long long)bk);
    if (!q || !s) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is NULL", q ? sname : qname);
    if (q->dtype != MOEX_E4M3 && q->dtype != MOEX_E2M1X2)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s is not e4m3 or e2m1x2", qname, moex_dtype_name(q->dtype));
    const int fp4 = q->dtype == MOEX_E2M1X2;
    if (fp4 && (dims[2] % 2 || bn != 1 || bk != MOEX_FP4_BLOCK))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "FP4 (e2m1x2) needs an even K and block 1 x 32; got K = %lld, block %lld x %lld",
                         (long long)dims[2], (long long)bn, (long long)bk);
    int64_t qs[3] = {dims[0], dims[1], fp4 ? dims[2] / 2 : dims[2]};
    int64_t ss[3] = {dims[0], moex_ceil_div(dims[1], bn), moex_ceil_div(dims[2], bk)};
    moex_status st = moex_check_shape(q, qname, rank, qs + 3 - rank);
    if (!st) st = moex_check_contiguous(q, qname);
    if (!st) st = moex_check_shape(s, sname, rank, ss + 3 - rank);
    if (!st) st = moex_check_contiguous(s, sname);
    if (st) return st;
    if (s->dtype != MOEX_F32 && s->dtype != MOEX_UE8M0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s, expected f32 or ue8m0", sname, moex_dtype_name(s->dtype));
    if (q->device.kind != MOEX_DEVICE_CPU || s->device.kind != MOEX_DEVICE_CPU)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s and %s must be on the CPU", qname, sname);
    return MOEX_OK;
}

static moex_status check_plain(const moex_tensor *w, const char *what, int64_t dims[3]) {
    moex_status st = logical_dims(w, what, dims);
    if (st) return st;
    if (!moex_is_float_dtype(w->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype %s is not f32, f16 or bf16", what, moex_dtype_name(w->dtype));
    if (w->device.kind != MOEX_DEVICE_CPU) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s must be on the CPU", what);
    if ((st = moex_check_shape(w, what, w->ndim, w->shape))) return st;
    return moex_check_contiguous(w, what);
}

static void put_scale(void *s, moex_dtype dt, int64_t i, float v) {
    if (dt == MOEX_UE8M0) ((uint8_t *)s)[i] = moex_f32_to_ue8m0(v);
    else ((float *)s)[i] = v;
}

/* The scale_inv of one tile with largest magnitude amax (see moex_quantize). */
static float tile_scale_inv(float amax, moex_quant_format format) {
    if (format == MOEX_QUANT_FP4) return moex_act_block_scale(amax, MOEX_E2M1X2);
    const float scale = amax > 0.0f ? MOEX_E4M3_MAX / amax : 1.0f;
    float inv = 1.0f / scale;
    if (format == MOEX_QUANT_FP8_UE8M0) inv = moex_ue8m0_to_f32(moex_f32_to_ue8m0(inv));
    return inv;
}

// One tile of rows [n0, n1) x columns [k0, k1) of matrix `wm` ([N, K] f32 view via load) into q.
static float quantize_tile(const void *w, moex_dtype wdt, int64_t K, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                           moex_quant_format format, uint8_t *q) {
    float amax = 0.0f;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(moex_load_f32(w, wdt, n * K + k)));
    const float inv = tile_scale_inv(amax, format);
    const float scale = format == MOEX_QUANT_FP8 ? (amax > 0.0f ? MOEX_E4M3_MAX / amax : 1.0f) : 1.0f / inv;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t k = k0; k < k1; k++) {
            const float v = moex_load_f32(w, wdt, n * K + k);
            if (format == MOEX_QUANT_FP4) {
                uint8_t c = moex_f32_to_e2m1(v / inv), *b = q + (n * K + k) / 2;
                *b = k % 2 ? (uint8_t)((*b & 0x0F) | (c << 4)) : (uint8_t)((*b & 0xF0) | c);
            } else {
                q[n * K + k] = moex_f32_to_e4m3(v * scale);
            }
        }
    return inv;
}

moex_status moex_quantize(const moex_tensor *w, moex_quant_format format, int64_t block_n, int64_t block_k,
                          moex_tensor *q, moex_tensor *scale_inv) {
    int64_t dims[3];
    moex_status st = check_plain(w, "w", dims);
    if (st) return st;
    if ((unsigned)format > MOEX_QUANT_FP4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "format = %d is not a moex_quant_format", (int)format);
    if (q && q->dtype != (format == MOEX_QUANT_FP4 ? MOEX_E2M1X2 : MOEX_E4M3))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "q: dtype %s does not hold format %s (e4m3 for fp8, e2m1x2 for fp4)",
                         moex_dtype_name(q->dtype), moex_quant_format_name(format));
    if ((st = check_quant_pair(q, scale_inv, w->ndim, dims, block_n, block_k, "q", "scale_inv"))) return st;
    if (scale_inv->dtype == MOEX_UE8M0 && format == MOEX_QUANT_FP8)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "scale_inv: ue8m0 cannot hold the float scales of format fp8; use f32 or format fp8-ue8m0");
    if ((st = moex_check_disjoint(q, "q", w, "w")) || (st = moex_check_disjoint(scale_inv, "scale_inv", w, "w")) ||
        (st = moex_check_disjoint(scale_inv, "scale_inv", q, "q")))
        return st;
    const int64_t E = dims[0], N = dims[1], K = dims[2];
    if (E == 0 || N == 0 || K == 0) return MOEX_OK; /* no elements (the other sizes may be huge): nothing to do */
    const int64_t sn = moex_ceil_div(N, block_n), sk = moex_ceil_div(K, block_k);
    const size_t wsz = moex_dtype_size(w->dtype);
    const int64_t qrow = format == MOEX_QUANT_FP4 ? K / 2 : K;
    for (int64_t e = 0; e < E; e++) {
        const char *we = (const char *)w->data + (size_t)(e * N * K) * wsz;
        uint8_t *qe = (uint8_t *)q->data + e * N * qrow;
        for (int64_t bi = 0; bi < sn; bi++)
            for (int64_t bj = 0; bj < sk; bj++) {
                const int64_t n0 = bi * block_n, k0 = bj * block_k;
                const int64_t n1 = block_n < N - n0 ? n0 + block_n : N, k1 = block_k < K - k0 ? k0 + block_k : K;
                float inv = quantize_tile(we, w->dtype, K, n0, n1, k0, k1, format, qe);
                put_scale(scale_inv->data, scale_inv->dtype, (e * sn + bi) * sk + bj, inv);
            }
    }
    return MOEX_OK;
}

void moex_dequant_row(const void *q, moex_dtype dt, const void *scale, moex_dtype sdt, int64_t scale_ld,
                      int64_t block_n, int64_t block_k, int64_t r, int64_t K, float *dst) {
    const int64_t srow = (r / block_n) * scale_ld;
    const uint8_t *row = (const uint8_t *)q + (dt == MOEX_E2M1X2 ? r * K / 2 : r * K);
    for (int64_t k0 = 0, k1, kb = 0; k0 < K; k0 = k1, kb++) { /* one scale a block */
        k1 = block_k < K - k0 ? k0 + block_k : K;
        const float s = moex_scale_at(scale, sdt, srow + kb);
        if (dt == MOEX_E2M1X2) {
            for (int64_t k = k0; k < k1; k++) {
                const uint8_t c = k % 2 ? row[k / 2] >> 4 : row[k / 2] & 0x0F;
                dst[k] = (c & 8 ? -E2M1_VALUES[c & 7] : E2M1_VALUES[c & 7]) * s;
            }
        } else { /* as moex_e4m3_to_f32, inline (the exported function is not inlined in a shared build) */
            for (int64_t k = k0; k < k1; k++)
                dst[k] = (row[k] & 0x7F) == 0x7F ? NAN : moex_e4m3_raw(row[k]) * MOEX_E4M3_RAW_UNIT * s;
        }
    }
}

moex_status moex_dequantize(const moex_tensor *q, const moex_tensor *scale_inv, int64_t block_n, int64_t block_k,
                            moex_tensor *out) {
    int64_t dims[3];
    moex_status st = check_plain(out, "out", dims);
    if (!st) st = check_quant_pair(q, scale_inv, out->ndim, dims, block_n, block_k, "q", "scale_inv");
    if (!st) st = moex_check_disjoint(out, "out", q, "q");
    if (!st) st = moex_check_disjoint(out, "out", scale_inv, "scale_inv");
    if (st) return st;
    const int64_t E = dims[0], N = dims[1], K = dims[2], sk = moex_ceil_div(K, block_k);
    if (E == 0 || N == 0 || K == 0) return MOEX_OK; /* no elements: nothing to do */
    const int64_t sn = moex_ceil_div(N, block_n), qrow = q->dtype == MOEX_E2M1X2 ? K / 2 : K;
    const size_t ssz = moex_dtype_size(scale_inv->dtype), osz = moex_dtype_size(out->dtype);
    float *row = malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
    if (!row) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_dequantize: out of memory for a row of %lld", (long long)K);
    for (int64_t e = 0; e < E; e++)
        for (int64_t n = 0; n < N; n++) {
            moex_dequant_row((const uint8_t *)q->data + e * N * qrow, q->dtype,
                             (const char *)scale_inv->data + (size_t)(e * sn * sk) * ssz, scale_inv->dtype, sk, block_n,
                             block_k, n, K, row);
            moex_convert(row, MOEX_F32, (char *)out->data + (size_t)((e * N + n) * K) * osz, out->dtype, (size_t)K);
        }
    free(row);
    return MOEX_OK;
}

/* ---- dynamic activation quantization (reference) ------------------------ */

void moex_act_quant_row(const float *x, float *out, int64_t n, moex_dtype wdt, int64_t block) {
    const float max = wdt == MOEX_E4M3 ? MOEX_E4M3_MAX : MOEX_E2M1_MAX;
    const int mbits = wdt == MOEX_E4M3 ? 3 : 1, emin = wdt == MOEX_E4M3 ? -6 : 0;
    for (int64_t b0 = 0, b1; b0 < n; b0 = b1) {
        b1 = block < n - b0 ? b0 + block : n;
        float amax = 0.0f;
        for (int64_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float s = moex_act_block_scale(amax, wdt);
        for (int64_t i = b0; i < b1; i++) {
            float y = x[i] / s;
            y = y > max ? max : y < -max ? -max : y;
            out[i] = moex_round_minifloat(y, mbits, emin) * s;
        }
    }
}
