/* dtype.c — element types: sizes, names, and f32/f16/bf16 conversion. */
#include "core/internal.h"

static const struct {
    const char *name;
    size_t size;
} dtype_table[MOEX_DTYPE_COUNT] = {
    [MOEX_F32] = {"f32", 4},   [MOEX_F16] = {"f16", 2},     [MOEX_BF16] = {"bf16", 2},
    [MOEX_E4M3] = {"e4m3", 1}, [MOEX_E2M1X2] = {"e2m1x2", 1}, [MOEX_UE8M0] = {"ue8m0", 1},
    [MOEX_I32] = {"i32", 4},   [MOEX_I64] = {"i64", 8},
};

size_t moex_dtype_size(moex_dtype dtype) {
    if ((unsigned)dtype >= MOEX_DTYPE_COUNT) return 0;
    return dtype_table[dtype].size;
}

const char *moex_dtype_name(moex_dtype dtype) {
    if ((unsigned)dtype >= MOEX_DTYPE_COUNT) return "invalid";
    return dtype_table[dtype].name;
}

moex_status moex_dtype_parse(const char *name, moex_dtype *out) {
    if (!name || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_dtype_parse: %s is NULL", name ? "out" : "name");
    for (int i = 0; i < MOEX_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (moex_dtype)i;
            return MOEX_OK;
        }
    }
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                     "unknown dtype \"%s\"; valid: f32, f16, bf16, e4m3, e2m1x2, ue8m0, i32, i64", name);
}

/* IEEE binary16 -> binary32, exact (subnormals, inf, NaN included). */
float moex_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even, overflow to inf, NaN kept. */
uint16_t moex_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf */
    if (a < 0x38800000u) { /* result is subnormal or zero */
        if (a < 0x33000000u) return sign; /* < half the smallest subnormal */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14 .. 24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

moex_status moex_convert(const void *src, moex_dtype src_dtype, void *dst, moex_dtype dst_dtype,
                         size_t n) {
    if (!moex_is_float_dtype(src_dtype) || !moex_is_float_dtype(dst_dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "moex_convert: %s -> %s is not supported (f32, f16, bf16 only)",
                         moex_dtype_name(src_dtype), moex_dtype_name(dst_dtype));
    if (n == 0) return MOEX_OK;
    if (!src || !dst) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_convert: %s is NULL", src ? "dst" : "src");
    const size_t ss = moex_dtype_size(src_dtype), ds = moex_dtype_size(dst_dtype);
    const uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
    /* no object is larger than PTRDIFF_MAX bytes, nor ends past the end of memory */
    const int src_bad = n > (size_t)PTRDIFF_MAX / ss || n > (UINTPTR_MAX - s0) / ss;
    if (src_bad || n > (size_t)PTRDIFF_MAX / ds || n > (UINTPTR_MAX - d0) / ds)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "moex_convert: n = %zu elements of %s at %p are more bytes than memory can hold there", n,
                         moex_dtype_name(src_bad ? src_dtype : dst_dtype), src_bad ? src : (const void *)dst);
    if (src_dtype == dst_dtype) {
        if (src != dst) memmove(dst, src, n * ss);
        return MOEX_OK;
    }
    if (src != dst && s0 < d0 + n * ds && d0 < s0 + n * ss)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "moex_convert: src (%p, %zu bytes of %s) and dst (%p, %zu bytes of %s) overlap: convert in place "
                         "(src == dst) or between separate buffers", src, n * ss, moex_dtype_name(src_dtype), dst, n * ds,
                         moex_dtype_name(dst_dtype));
    if (moex_dtype_size(dst_dtype) > moex_dtype_size(src_dtype)) { /* widening: backwards, so src == dst works */
        for (size_t i = n; i-- > 0;) moex_store_f32(dst, dst_dtype, (int64_t)i, moex_load_f32(src, src_dtype, (int64_t)i));
    } else {
        for (size_t i = 0; i < n; i++) moex_store_f32(dst, dst_dtype, (int64_t)i, moex_load_f32(src, src_dtype, (int64_t)i));
    }
    return MOEX_OK;
}
