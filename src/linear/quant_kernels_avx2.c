/* quant_kernels_avx2.c — AVX2/FMA kernels for quantized weights: they read the
 * e4m3 / e2m1 codes in place (no dequantized copy of the weights).
 *   e4m3: a code becomes f32 without a table: sign-extend to int32, shift left 20,
 *         AND 0x87F00000 gives the value times 2^-120 (subnormals exact; the NaN
 *         codes 0x7F/0xFF read as +-480). The 2^120 is folded into the block scale.
 *   e2m1: 8 magnitudes in one register, vpermps by the low 3 bits, sign from bit 3.
 * Streaming (few rows): codes are multiplied into a per-block accumulator and the
 * block scale is applied once per block and row. Packing (many rows): codes are
 * decoded times their scale into the f32 panels of the unchanged GEMM micro-kernel.
 * Reference: quant_kernels_portable.c. Compiled with -mavx2 -mfma -mf16c. */
#include "linear/kernels.h"
#include "linear/avx2_util.h"

/* ---- decoding ------------------------------------------------------------------------------- */

// 8 e4m3 codes at p -> their values times 2^-120.
static inline __m256 e4m3_raw8(const uint8_t *p) {
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32((int)0x87F00000u)));
}

static inline __m256 e2m1_table(void) { return _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f); }

// 8 nibbles (as int32 lanes 0..15) -> e2m1 values.
static inline __m256 e2m1_decode(__m256i idx, __m256 table) {
    const __m256 mag = _mm256_permutevar8x32_ps(table, idx);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

// The 16 nibbles of bytes b[0..8) in element order (low nibble first) as bytes of the result.
static inline __m128i nibbles_lo(__m128i b) {
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}
static inline __m128i nibbles_hi(__m128i b) {
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm_unpackhi_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

// 8 e2m1 values starting at element k (even) of a row of codes.
static inline __m256 e2m1_8(const uint8_t *row, int64_t k, __m256 table) {
    int32_t word;
    memcpy(&word, row + k / 2, 4);
    return e2m1_decode(_mm256_cvtepu8_epi32(nibbles_lo(_mm_cvtsi32_si128(word))), table);
}

/* ---- packing ---------------------------------------------------------------------------------- */

// The vector path needs 8-element chunks that never straddle a scale block.
static int chunks_fit(const moex_bmat *b, int64_t k0) { return b->block_k % 8 == 0 && k0 % 8 == 0; }

void moex_qpack_avx2(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    if (!chunks_fit(b, k0)) {
        moex_qpack_portable(b, k0, kc, n0, nc, bp);
        return;
    }
    const __m256 table = e2m1_table();
    const int64_t panels = (nc + 15) / 16, k8 = kc & ~(int64_t)7, half = b->dtype == MOEX_E2M1X2;
    const int64_t row_bytes = b->ld >> half, bk = b->block_k;
    const float unit = b->dtype == MOEX_E4M3 ? MOEX_E4M3_RAW_UNIT : 1.0f;
    const size_t ssz = b->scale_dtype == MOEX_UE8M0 ? 1 : 4;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = bp + p * kc * 16;
        for (int hf = 0; hf < 2; hf++) {
            const int64_t j0 = p * 16 + hf * 8, r0 = b->base + n0 + j0;
            const int full = j0 + 8 <= nc;
            if (full) {
                const uint8_t *w[8];
                const char *srow[8];
                for (int i = 0; i < 8; i++) {
                    w[i] = (const uint8_t *)b->w + (r0 + i) * row_bytes;
                    srow[i] = (const char *)b->scale + (size_t)(((r0 + i) / b->block_n) * b->scale_ld) * ssz;
                }
                __m256 vs[8] = {0};
                int64_t kb = -1;
                for (int64_t k = 0; k < k8; k += 8) {
                    if ((k0 + k) / bk != kb) { /* a new scale block: the 8 rows' scales */
                        kb = (k0 + k) / bk;
                        for (int i = 0; i < 8; i++) vs[i] = _mm256_set1_ps(moex_scale_at(srow[i], b->scale_dtype, kb) * unit);
                    }
                    __m256 r[8];
                    for (int i = 0; i < 8; i++)
                        r[i] = _mm256_mul_ps(half ? e2m1_8(w[i], k0 + k, table) : e4m3_raw8(w[i] + k0 + k), vs[i]);
                    transpose8(r);
                    for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (k + i) * 16 + hf * 8, r[i]);
                }
            }
            for (int64_t k = full ? k8 : 0; k < kc; k++)
                for (int i = 0; i < 8; i++)
                    dst[k * 16 + hf * 8 + i] = j0 + i < nc ? moex_bmat_at(b, k0 + k, n0 + j0 + i) : 0.0f;
        }
    }
}

/* ---- streaming: c[m, n] = sum_k a[m][k] * B(k, n), M <= 4 rows -------------------------------- */

// The common case of one row (decode steps) on e4m3 weights with blocks and K multiples of 8:
// four weight rows a pass, named accumulators, 64 codes (one cache line a row) per inner step
// with the next four rows prefetched, the block scales applied once per block and row.
static void qstream_e4m3_1x4(const moex_bmat *b, const float *x, int64_t n, int64_t K, float *c) {
    const int64_t r0 = b->base + n, ld = b->ld, bk = b->block_k;
    const uint8_t *w0 = (const uint8_t *)b->w + r0 * ld, *w1 = w0 + ld, *w2 = w1 + ld, *w3 = w2 + ld;
    const char *ahead = (const char *)w0 + 4 * ld;
    const int ue8m0 = b->scale_dtype == MOEX_UE8M0;
    const size_t ssz = ue8m0 ? 1 : 4;
    const char *srow[4];
    for (int j = 0; j < 4; j++) srow[j] = (const char *)b->scale + (size_t)(((r0 + j) / b->block_n) * b->scale_ld) * ssz;
    __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    int64_t kb = 0;
    for (int64_t k0 = 0; k0 < K; k0 += bk, kb++) {
        const int64_t k1 = k0 + bk < K ? k0 + bk : K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = k0;
#define QSTEP(K_)                                                                                      \
    {                                                                                                  \
        const __m256 xv = _mm256_loadu_ps(x + (K_));                                                   \
        a0 = _mm256_fmadd_ps(xv, e4m3_raw8(w0 + (K_)), a0);                                            \
        a1 = _mm256_fmadd_ps(xv, e4m3_raw8(w1 + (K_)), a1);                                            \
        a2 = _mm256_fmadd_ps(xv, e4m3_raw8(w2 + (K_)), a2);                                            \
        a3 = _mm256_fmadd_ps(xv, e4m3_raw8(w3 + (K_)), a3);                                            \
    }
        for (; k + 64 <= k1; k += 64) {
            _mm_prefetch(ahead + k, _MM_HINT_T0);
            _mm_prefetch(ahead + ld + k, _MM_HINT_T0);
            _mm_prefetch(ahead + 2 * ld + k, _MM_HINT_T0);
            _mm_prefetch(ahead + 3 * ld + k, _MM_HINT_T0);
            QSTEP(k) QSTEP(k + 8) QSTEP(k + 16) QSTEP(k + 24) QSTEP(k + 32) QSTEP(k + 40) QSTEP(k + 48) QSTEP(k + 56)
        }
        for (; k < k1; k += 8) QSTEP(k)
#undef QSTEP
        float s[4];
        for (int j = 0; j < 4; j++) s[j] = (ue8m0 ? moex_ue8m0_value(((const uint8_t *)srow[j])[kb]) : ((const float *)srow[j])[kb]) * MOEX_E4M3_RAW_UNIT;
        t0 = _mm256_fmadd_ps(a0, _mm256_set1_ps(s[0]), t0);
        t1 = _mm256_fmadd_ps(a1, _mm256_set1_ps(s[1]), t1);
        t2 = _mm256_fmadd_ps(a2, _mm256_set1_ps(s[2]), t2);
        t3 = _mm256_fmadd_ps(a3, _mm256_set1_ps(s[3]), t3);
    }
    c[0] = hsum(t0), c[1] = hsum(t1), c[2] = hsum(t2), c[3] = hsum(t3);
}

// A few rows (prefill of short prompts, a few tokens per expert) on e4m3 weights: M rows x NC weight
// rows, the per-block sums in registers and the running totals in memory (touched once a block).
#define QSTREAM_E4M3(NAME, M, NC)                                                                            \
    static void NAME(const moex_bmat *b, const float *const *a, int64_t n, int64_t K, float *c, int64_t ldc) { \
        const int64_t r0 = b->base + n, ld = b->ld, bk = b->block_k;                                         \
        const uint8_t *w0 = (const uint8_t *)b->w + r0 * ld;                                                 \
        const int ue8m0 = b->scale_dtype == MOEX_UE8M0;                                                      \
        const size_t ssz = ue8m0 ? 1 : 4;                                                                    \
        const char *srow[NC];                                                                                \
        for (int j = 0; j < NC; j++) srow[j] = (const char *)b->scale + (size_t)(((r0 + j) / b->block_n) * b->scale_ld) * ssz; \
        float tot[M][NC][8];                                                                                 \
        memset(tot, 0, sizeof tot);                                                                          \
        int64_t kb = 0;                                                                                      \
        for (int64_t k0 = 0; k0 < K; k0 += bk, kb++) {                                                       \
            const int64_t k1 = k0 + bk < K ? k0 + bk : K;                                                    \
            __m256 acc[M][NC];                                                                               \
            for (int m = 0; m < M; m++)                                                                      \
                for (int j = 0; j < NC; j++) acc[m][j] = _mm256_setzero_ps();                                \
            for (int64_t k = k0; k < k1; k += 8) {                                                           \
                if ((k & 63) == 0)                                                                           \
                    for (int j = 0; j < NC; j++) _mm_prefetch((const char *)w0 + (NC + j) * ld + k, _MM_HINT_T0); \
                __m256 bw[NC];                                                                               \
                for (int j = 0; j < NC; j++) bw[j] = e4m3_raw8(w0 + j * ld + k);                             \
                for (int m = 0; m < M; m++) {                                                                \
                    const __m256 x = _mm256_loadu_ps(a[m] + k);                                              \
                    for (int j = 0; j < NC; j++) acc[m][j] = _mm256_fmadd_ps(x, bw[j], acc[m][j]);           \
                }                                                                                            \
            }                                                                                                \
            for (int j = 0; j < NC; j++) {                                                                   \
                const __m256 vs = _mm256_set1_ps(moex_scale_at(srow[j], b->scale_dtype, kb) * MOEX_E4M3_RAW_UNIT); \
                for (int m = 0; m < M; m++)                                                                  \
                    _mm256_storeu_ps(tot[m][j], _mm256_fmadd_ps(acc[m][j], vs, _mm256_loadu_ps(tot[m][j]))); \
            }                                                                                                \
        }                                                                                                    \
        for (int m = 0; m < M; m++)                                                                          \
            for (int j = 0; j < NC; j++) c[m * ldc + j] = hsum(_mm256_loadu_ps(tot[m][j]));                  \
    }
QSTREAM_E4M3(qstream_e4m3_1x1, 1, 1)
QSTREAM_E4M3(qstream_e4m3_2x4, 2, 4)
QSTREAM_E4M3(qstream_e4m3_3x2, 3, 2)
QSTREAM_E4M3(qstream_e4m3_4x2, 4, 2)
QSTREAM_E4M3(qstream_e4m3_2x1, 2, 1)
QSTREAM_E4M3(qstream_e4m3_3x1, 3, 1)
QSTREAM_E4M3(qstream_e4m3_4x1, 4, 1)

// The same for e2m1 weights (blocks of 32, K a multiple of 32): a byte shuffle turns each nibble into
// the e4m3 code of the same value, which then decodes as above; 16 bytes hold a row's block.
static inline void e2m1_block_as_e4m3(const uint8_t *p, __m256 v[4]) {
    const __m128i lut = _mm_setr_epi8(0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C, (char)0x80, (char)0xB0,
                                      (char)0xB8, (char)0xBC, (char)0xC0, (char)0xC4, (char)0xC8, (char)0xCC);
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m128i c0 = _mm_shuffle_epi8(lut, nibbles_lo(b)), c1 = _mm_shuffle_epi8(lut, nibbles_hi(b));
    const __m256i m = _mm256_set1_epi32((int)0x87F00000u);
    v[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(c0), 20), m));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c0, c0)), 20), m));
    v[2] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(c1), 20), m));
    v[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c1, c1)), 20), m));
}

static void qstream_e2m1_1x4(const moex_bmat *b, const float *x, int64_t n, int64_t K, float *c) {
    const int64_t r0 = b->base + n, row_bytes = b->ld / 2;
    const uint8_t *w = (const uint8_t *)b->w + r0 * row_bytes;
    const int ue8m0 = b->scale_dtype == MOEX_UE8M0;
    const size_t ssz = ue8m0 ? 1 : 4;
    const char *srow[4];
    for (int j = 0; j < 4; j++) srow[j] = (const char *)b->scale + (size_t)(((r0 + j) / b->block_n) * b->scale_ld) * ssz;
    __m256 tot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t k = 0, kb = 0; k < K; k += 32, kb++) {
        if ((k & 127) == 0)
            for (int j = 0; j < 4; j++) _mm_prefetch((const char *)w + (4 + j) * row_bytes + k / 2, _MM_HINT_T0);
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        const __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        for (int j = 0; j < 4; j++) {
            __m256 v[4];
            e2m1_block_as_e4m3(w + j * row_bytes + k / 2, v);
            __m256 acc = _mm256_mul_ps(x0, v[0]);
            acc = _mm256_fmadd_ps(x1, v[1], acc);
            acc = _mm256_fmadd_ps(x2, v[2], acc);
            acc = _mm256_fmadd_ps(x3, v[3], acc);
            const float sc = (ue8m0 ? moex_ue8m0_value(((const uint8_t *)srow[j])[kb]) : ((const float *)srow[j])[kb]) *
                             MOEX_E4M3_RAW_UNIT;
            tot[j] = _mm256_fmadd_ps(acc, _mm256_set1_ps(sc), tot[j]);
        }
    }
    for (int j = 0; j < 4; j++) c[j] = hsum(tot[j]);
}

// A few rows on e2m1 weights: M rows x NC weight rows, a block of 32 decoded once for all M rows.
#define QSTREAM_E2M1(NAME, M, NC)                                                                            \
    static void NAME(const moex_bmat *b, const float *const *a, int64_t n, int64_t K, float *c, int64_t ldc) { \
        const int64_t r0 = b->base + n, row_bytes = b->ld / 2;                                               \
        const uint8_t *w0 = (const uint8_t *)b->w + r0 * row_bytes;                                          \
        const size_t ssz = b->scale_dtype == MOEX_UE8M0 ? 1 : 4;                                             \
        const char *srow[NC];                                                                                \
        for (int j = 0; j < NC; j++) srow[j] = (const char *)b->scale + (size_t)(((r0 + j) / b->block_n) * b->scale_ld) * ssz; \
        __m256 tot[M][NC];                                                                                   \
        for (int m = 0; m < M; m++)                                                                          \
            for (int j = 0; j < NC; j++) tot[m][j] = _mm256_setzero_ps();                                    \
        for (int64_t k = 0, kb = 0; k < K; k += 32, kb++) {                                                  \
            if ((k & 127) == 0)                                                                              \
                for (int j = 0; j < NC; j++) _mm_prefetch((const char *)w0 + (NC + j) * row_bytes + k / 2, _MM_HINT_T0); \
            __m256 v[NC][4], vs[NC];                                                                         \
            for (int j = 0; j < NC; j++) {                                                                   \
                e2m1_block_as_e4m3(w0 + j * row_bytes + k / 2, v[j]);                                       \
                vs[j] = _mm256_set1_ps(moex_scale_at(srow[j], b->scale_dtype, kb) * MOEX_E4M3_RAW_UNIT);      \
            }                                                                                                \
            for (int m = 0; m < M; m++) {                                                                    \
                const float *x = a[m] + k;                                                                   \
                for (int j = 0; j < NC; j++) {                                                               \
                    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(x), v[j][0]);                                 \
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), v[j][1], acc);                             \
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), v[j][2], acc);                            \
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), v[j][3], acc);                            \
                    tot[m][j] = _mm256_fmadd_ps(acc, vs[j], tot[m][j]);                                      \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int m = 0; m < M; m++)                                                                          \
            for (int j = 0; j < NC; j++) c[m * ldc + j] = hsum(tot[m][j]);                                   \
    }
QSTREAM_E2M1(qstream_e2m1_1x1, 1, 1)
QSTREAM_E2M1(qstream_e2m1_2x2, 2, 2)
QSTREAM_E2M1(qstream_e2m1_3x2, 3, 2)
QSTREAM_E2M1(qstream_e2m1_4x2, 4, 2)
QSTREAM_E2M1(qstream_e2m1_2x1, 2, 1)
QSTREAM_E2M1(qstream_e2m1_3x1, 3, 1)
QSTREAM_E2M1(qstream_e2m1_4x1, 4, 1)

typedef void (*qstream_fn)(const moex_bmat *, const float *const *, int64_t, int64_t, float *, int64_t);

// One-row calls take the 1x4 kernels; 2-4 rows the M x NC ones; the rows past a multiple of the
// step the M x 1 ones. Blocks or sizes the vector paths do not fit go to the portable kernel.
void moex_qstream_avx2(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                       int64_t ldc) {
    static const qstream_fn e4m3_wide[5] = {0, 0, qstream_e4m3_2x4, qstream_e4m3_3x2, qstream_e4m3_4x2};
    static const qstream_fn e4m3_one[5] = {0, qstream_e4m3_1x1, qstream_e4m3_2x1, qstream_e4m3_3x1, qstream_e4m3_4x1};
    static const qstream_fn e2m1_wide[5] = {0, 0, qstream_e2m1_2x2, qstream_e2m1_3x2, qstream_e2m1_4x2};
    static const qstream_fn e2m1_one[5] = {0, qstream_e2m1_1x1, qstream_e2m1_2x1, qstream_e2m1_3x1, qstream_e2m1_4x1};
    static const int e4m3_step[5] = {0, 4, 4, 2, 2}, e2m1_step[5] = {0, 4, 2, 2, 2};
    const int fp8 = b->dtype == MOEX_E4M3;
    if (fp8 ? b->block_k % 8 || K % 8 : b->block_k != 32 || K % 32) {
        moex_qstream_portable(b, a, M, n0, nc, K, c, ldc);
        return;
    }
    const int step = fp8 ? e4m3_step[M] : e2m1_step[M];
    int64_t n = 0;
    for (; n + step <= nc; n += step) {
        if (M == 1 && fp8) qstream_e4m3_1x4(b, a[0], n0 + n, K, c + n);
        else if (M == 1) qstream_e2m1_1x4(b, a[0], n0 + n, K, c + n);
        else (fp8 ? e4m3_wide : e2m1_wide)[M](b, a, n0 + n, K, c + n, ldc);
    }
    for (; n < nc; n++) (fp8 ? e4m3_one : e2m1_one)[M](b, a, n0 + n, K, c + n, ldc);
}

/* ---- dynamic activation quantization (contract: moex_act_quant_row) --------------------------- */

void moex_act_quant_avx2(const float *x, float *out, int64_t n, moex_dtype wdt, int64_t block) {
    const int fp8 = wdt == MOEX_E4M3;
    const float max = fp8 ? MOEX_E4M3_MAX : MOEX_E2M1_MAX;
    const int mbits = fp8 ? 3 : 1, emin = fp8 ? -6 : 0, drop = 23 - mbits;
    const __m256 vmax = _mm256_set1_ps(max), vmin = _mm256_set1_ps(-max), absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 min_normal = _mm256_set1_ps(ldexpf(1.0f, emin)), sub_q = _mm256_set1_ps(ldexpf(1.0f, mbits - emin));
    const __m256 sub_unit = _mm256_set1_ps(ldexpf(1.0f, emin - mbits));
    const __m256i half = _mm256_set1_epi32((1 << (drop - 1)) - 1), one = _mm256_set1_epi32(1);
    const __m256i keep = _mm256_set1_epi32((int)~((1u << drop) - 1u));
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t b1 = b0 + block < n ? b0 + block : n, v1 = b0 + ((b1 - b0) & ~(int64_t)7);
        __m256 vamax = _mm256_setzero_ps();
        for (int64_t i = b0; i < v1; i += 8) vamax = _mm256_max_ps(vamax, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
        float lanes[8], amax = 0.0f;
        _mm256_storeu_ps(lanes, vamax);
        for (int i = 0; i < 8; i++) amax = fmaxf(amax, lanes[i]);
        for (int64_t i = v1; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float s = moex_act_block_scale(amax, wdt);
        const __m256 vs = _mm256_set1_ps(s);
        for (int64_t i = b0; i < v1; i += 8) {
            __m256 y = _mm256_div_ps(_mm256_loadu_ps(x + i), vs);
            y = _mm256_max_ps(_mm256_min_ps(y, vmax), vmin);
            const __m256i u = _mm256_castps_si256(y);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, drop), one);
            const __m256 normal = _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half), odd), keep));
            const __m256 sub = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(y, sub_q), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), sub_unit);
            const __m256 is_sub = _mm256_cmp_ps(_mm256_and_ps(y, absmask), min_normal, _CMP_LT_OQ);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_blendv_ps(normal, sub, is_sub), vs));
        }
        for (int64_t i = v1; i < b1; i++) {
            float y = x[i] / s;
            y = y > max ? max : y < -max ? -max : y;
            out[i] = moex_round_minifloat(y, mbits, emin) * s;
        }
    }
}
