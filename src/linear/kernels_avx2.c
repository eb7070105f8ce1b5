/* kernels_avx2.c — AVX2/FMA/F16C kernels. This file alone is compiled with
 * -mavx2 -mfma -mf16c; it is only called after run-time detection.
 * Reference: kernels_portable.c (same contracts, see kernels.h). */
#include "linear/kernels.h"
#include "linear/avx2_util.h"

// 8 weights of dtype dt at p -> f32 lanes
static inline __m256 load8(const void *p, moex_dtype dt) {
    if (dt == MOEX_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == MOEX_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline const char *elem_ptr(const void *w, moex_dtype dt, int64_t i) {
    return (const char *)w + i * (int64_t)(dt == MOEX_F32 ? 4 : 2);
}


/* ---- packed GEMM micro-kernels: c[MR, 16] (+)= a[MR, kc] * bp[kc, 16], MR = 1..6 ------------- */

// Store rows 0..mr-1 of the register tile r into c (nr <= 16 columns), adding c when accumulating.
static inline void store_tile(__m256 r[][2], int mr, float *c, int64_t ldc, int nr, int accumulate) {
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        if (nr == 16) {
            if (accumulate) {
                r[i][0] = _mm256_add_ps(r[i][0], _mm256_loadu_ps(ci));
                r[i][1] = _mm256_add_ps(r[i][1], _mm256_loadu_ps(ci + 8));
            }
            _mm256_storeu_ps(ci, r[i][0]);
            _mm256_storeu_ps(ci + 8, r[i][1]);
        } else {
            float tile[16];
            _mm256_storeu_ps(tile, r[i][0]);
            _mm256_storeu_ps(tile + 8, r[i][1]);
            for (int j = 0; j < nr; j++) ci[j] = accumulate ? ci[j] + tile[j] : tile[j];
        }
    }
}

// One kernel per row count, so a remainder of fewer than 6 rows costs only its own FMAs.
// Accumulators are named variables (the rows above MR fold away at compile time) so that
// they stay in the 12 registers; the tile goes through an array only after the loop.
#define MICRO_ROW(I, A, C0, C1)                                                                          \
    if (rows > I) {                                                                                      \
        const __m256 x = _mm256_broadcast_ss(A + k);                                                     \
        C0 = _mm256_fmadd_ps(x, b0, C0);                                                                 \
        C1 = _mm256_fmadd_ps(x, b1, C1);                                                                 \
    }
#define MICRO(NAME, MR)                                                                                  \
    static void NAME(int64_t kc, const float *const *a, int64_t k0, const float *bp, float *c, int64_t ldc, \
                     int nr, int accumulate) {                                                           \
        const int rows = MR;                                                                             \
        const float *a0 = a[0] + k0, *a1 = a[MR > 1 ? 1 : 0] + k0, *a2 = a[MR > 2 ? 2 : 0] + k0;        \
        const float *a3 = a[MR > 3 ? 3 : 0] + k0, *a4 = a[MR > 4 ? 4 : 0] + k0, *a5 = a[MR > 5 ? 5 : 0] + k0; \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;         \
        __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                         \
        for (int64_t k = 0; k < kc; k++) {                                                               \
            const __m256 b0 = _mm256_load_ps(bp + k * 16), b1 = _mm256_load_ps(bp + k * 16 + 8);         \
            MICRO_ROW(0, a0, c00, c01) MICRO_ROW(1, a1, c10, c11) MICRO_ROW(2, a2, c20, c21)             \
            MICRO_ROW(3, a3, c30, c31) MICRO_ROW(4, a4, c40, c41) MICRO_ROW(5, a5, c50, c51)             \
        }                                                                                                \
        __m256 r[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};       \
        store_tile(r, MR, c, ldc, nr, accumulate);                                                       \
    }
MICRO(micro_1, 1)
MICRO(micro_2, 2)
MICRO(micro_3, 3)
MICRO(micro_4, 4)
MICRO(micro_5, 5)
MICRO(micro_6, 6)

typedef void (*micro_fn)(int64_t, const float *const *, int64_t, const float *, float *, int64_t, int, int);

static void micro(int64_t kc, const float *const *a, int64_t k0, const float *bp, float *c, int64_t ldc, int mr, int nr,
                  int accumulate) {
    static const micro_fn by_rows[MOEX_MR + 1] = {0, micro_1, micro_2, micro_3, micro_4, micro_5, micro_6};
    by_rows[mr](kc, a, k0, bp, c, ldc, nr, accumulate);
}

/* ---- packing ------------------------------------------------------------------------------ */


// Not transposed: rows of W are columns of B. 8x8 blocks are transposed in registers.
static void pack_rows(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    int64_t panels = (nc + 15) / 16, k8 = kc & ~(int64_t)7;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = bp + p * kc * 16;
        for (int half = 0; half < 2; half++) {
            int64_t j0 = p * 16 + half * 8;
            if (j0 + 8 <= nc) {
                const char *rows[8];
                for (int i = 0; i < 8; i++) rows[i] = elem_ptr(b->w, b->dtype, (b->base + n0 + j0 + i) * b->ld + k0);
                for (int64_t k = 0; k < k8; k += 8) {
                    __m256 r[8];
                    for (int i = 0; i < 8; i++) r[i] = load8(elem_ptr(rows[i], b->dtype, k), b->dtype);
                    transpose8(r);
                    for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (k + i) * 16 + half * 8, r[i]);
                }
                for (int64_t k = k8; k < kc; k++)
                    for (int i = 0; i < 8; i++) dst[k * 16 + half * 8 + i] = moex_bmat_at(b, k0 + k, n0 + j0 + i);
            } else {
                for (int64_t k = 0; k < kc; k++)
                    for (int i = 0; i < 8; i++)
                        dst[k * 16 + half * 8 + i] = j0 + i < nc ? moex_bmat_at(b, k0 + k, n0 + j0 + i) : 0.0f;
            }
        }
    }
}

// Transposed: a row of W holds 16 consecutive columns of B: a plain converted copy.
static void pack_cols(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    int64_t panels = (nc + 15) / 16;
    for (int64_t p = 0; p < panels; p++) {
        float *dst = bp + p * kc * 16;
        int64_t j0 = p * 16;
        if (j0 + 16 <= nc) {
            for (int64_t k = 0; k < kc; k++) {
                const char *src = elem_ptr(b->w, b->dtype, (k0 + k) * b->ld + b->base + n0 + j0);
                _mm256_store_ps(dst + k * 16, load8(src, b->dtype));
                _mm256_store_ps(dst + k * 16 + 8, load8(elem_ptr(src, b->dtype, 8), b->dtype));
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int j = 0; j < 16; j++) dst[k * 16 + j] = j0 + j < nc ? moex_bmat_at(b, k0 + k, n0 + j0 + j) : 0.0f;
        }
    }
}

static void pack(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    if (moex_is_quant_dtype(b->dtype)) moex_qpack_avx2(b, k0, kc, n0, nc, bp);
    else if (b->transposed) pack_cols(b, k0, kc, n0, nc, bp);
    else pack_rows(b, k0, kc, n0, nc, bp);
}

/* ---- streaming kernels for few rows --------------------------------------------------------- */

// Not transposed, M rows x NC columns at a time: each column is a dot product over K.
// While it reads its NC weight rows it prefetches the NC rows after them (a prefetch
// never faults, so running past the matrix is harmless), so the next group starts
// warm instead of waiting for the hardware prefetcher at every 4 KiB row.
#define STREAM_ROWS(NAME, M, NC)                                                                             \
    static void NAME(const moex_bmat *b, const float *const *a, int64_t n, int64_t K, float *c, int64_t ldc) { \
        const int64_t esz = b->dtype == MOEX_F32 ? 4 : 2;                                                  \
        const char *w[NC];                                                                                   \
        for (int j = 0; j < NC; j++) w[j] = elem_ptr(b->w, b->dtype, (b->base + n + j) * b->ld);             \
        const int64_t ahead = NC * b->ld * esz;                                 \
        __m256 acc[M][NC];                                                                                   \
        for (int m = 0; m < M; m++)                                                                          \
            for (int j = 0; j < NC; j++) acc[m][j] = _mm256_setzero_ps();                                    \
        const int64_t k8 = K & ~(int64_t)7;                                                                  \
        for (int64_t k = 0; k < k8; k += 8) {                                                                \
            if ((k * esz & 63) == 0)                                                                         \
                for (int j = 0; j < NC; j++) _mm_prefetch((const char *)((uintptr_t)w[j] + (uintptr_t)(ahead + k * esz)), _MM_HINT_T0);             \
            __m256 bw[NC];                                                                                   \
            for (int j = 0; j < NC; j++) bw[j] = load8(elem_ptr(w[j], b->dtype, k), b->dtype);               \
            for (int m = 0; m < M; m++) {                                                                    \
                __m256 x = _mm256_loadu_ps(a[m] + k);                                                        \
                for (int j = 0; j < NC; j++) acc[m][j] = _mm256_fmadd_ps(x, bw[j], acc[m][j]);               \
            }                                                                                                \
        }                                                                                                    \
        for (int m = 0; m < M; m++)                                                                          \
            for (int j = 0; j < NC; j++) {                                                                   \
                float s = hsum(acc[m][j]);                                                                   \
                for (int64_t k = k8; k < K; k++) s += a[m][k] * moex_load_f32(w[j], b->dtype, k);            \
                c[m * ldc + j] = s;                                                                          \
            }                                                                                                \
    }
STREAM_ROWS(stream_rows_1x4, 1, 4)
STREAM_ROWS(stream_rows_2x4, 2, 4)
STREAM_ROWS(stream_rows_3x2, 3, 2)
STREAM_ROWS(stream_rows_4x2, 4, 2)
STREAM_ROWS(stream_rows_1x1, 1, 1)
STREAM_ROWS(stream_rows_2x1, 2, 1)
STREAM_ROWS(stream_rows_3x1, 3, 1)
STREAM_ROWS(stream_rows_4x1, 4, 1)

typedef void (*stream_rows_fn)(const moex_bmat *, const float *const *, int64_t, int64_t, float *, int64_t);

static void stream_rows(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                        int64_t ldc) {
    static const stream_rows_fn wide[5] = {0, stream_rows_1x4, stream_rows_2x4, stream_rows_3x2, stream_rows_4x2};
    static const stream_rows_fn one[5] = {0, stream_rows_1x1, stream_rows_2x1, stream_rows_3x1, stream_rows_4x1};
    const int step = M <= 2 ? 4 : 2;
    int64_t n = 0;
    for (; n + step <= nc; n += step) wide[M](b, a, n0 + n, K, c + n, ldc);
    for (; n < nc; n++) one[M](b, a, n0 + n, K, c + n, ldc);
}

// Transposed: for each k, a row of W gives 32 (or 8) consecutive columns; M <= 4 rows broadcast.
static void stream_cols(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                        int64_t ldc) {
    int64_t n = 0;
    for (; n + 16 <= nc; n += 16) {
        __m256 acc[4][2];
        for (int m = 0; m < 4; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
        const char *col = elem_ptr(b->w, b->dtype, b->base + n0 + n);
        for (int64_t k = 0; k < K; k++) {
            const char *row = elem_ptr(col, b->dtype, k * b->ld);
            __m256 w0 = load8(row, b->dtype), w1 = load8(elem_ptr(row, b->dtype, 8), b->dtype);
            for (int m = 0; m < M; m++) {
                __m256 x = _mm256_broadcast_ss(a[m] + k);
                acc[m][0] = _mm256_fmadd_ps(x, w0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(x, w1, acc[m][1]);
            }
        }
        for (int m = 0; m < M; m++) {
            _mm256_storeu_ps(c + m * ldc + n, acc[m][0]);
            _mm256_storeu_ps(c + m * ldc + n + 8, acc[m][1]);
        }
    }
    for (; n < nc; n++)
        for (int m = 0; m < M; m++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += a[m][k] * moex_bmat_at(b, k, n0 + n);
            c[m * ldc + n] = s;
        }
}

static void stream(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                   int64_t ldc) {
    if (moex_is_quant_dtype(b->dtype)) moex_qstream_avx2(b, a, M, n0, nc, K, c, ldc);
    else if (b->transposed) stream_cols(b, a, M, n0, nc, K, c, ldc);
    else stream_rows(b, a, M, n0, nc, K, c, ldc);
}

/* ---- element-wise ----------------------------------------------------------------------------- */

static void to_f32(const void *src, moex_dtype dtype, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(elem_ptr(src, dtype, i), dtype));
    for (; i < n; i++) dst[i] = moex_load_f32(src, dtype, i);
}

static void axpy(float w, const float *src, float *dst, int64_t n) {
    __m256 vw = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(src + i), _mm256_loadu_ps(dst + i)));
    for (; i < n; i++) dst[i] += w * src[i];
}

const moex_cpu_kernels moex_cpu_kernels_avx2 = {"avx2", micro, pack, stream, to_f32, axpy, moex_act_quant_avx2};
