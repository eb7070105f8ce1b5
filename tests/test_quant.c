#define _POSIX_C_SOURCE 200809L /* alarm */
/* test_quant.c — quantized experts: the e4m3 / e2m1 / ue8m0 codecs over every
 * code, moex_quantize / moex_dequantize (recipe, odd sizes, bad input), and
 * every registered backend that takes the CPU on FP8 (float and UE8M0 scales) and FP4 layers
 * against the float64 reference that applies the same quantization (SPEC
 * bound 1e-4) and against the unquantized layer (the bound of docs/backends.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/quant.h" /* the kernels' reading of e4m3 codes */
#include "reference.h"
#include "testutil.h"
#include "backend_list.h"

/* The backends run: every registered one whose supports() takes the CPU (backend_list.h), found
 * in main(); a case skips those that refuse its layer. */
static const char *CPU_BACKENDS[BACKEND_LIST_MAX];
static int N_BACKENDS;
static const moex_device CPU_DEVICE = {MOEX_DEVICE_CPU, 0};

/* Bounds stated in docs/backends.md: NMSE of a quantized layer against the unquantized one. */
#define NMSE_VS_PLAIN_FP8 1e-2
#define NMSE_VS_PLAIN_FP4 2e-1
#define NMSE_SAME_QUANT 1e-4

/* ---- codecs -------------------------------------------------------------------------------- */

static void test_e4m3_all_codes(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        double want = ref_e4m3_to_double((uint8_t)c);
        float got = moex_e4m3_to_f32((uint8_t)c);
        /* the kernels read a code through its bits (times 2^-120): exact, and NaN codes as +-480 */
        double raw = (double)moex_e4m3_raw((uint8_t)c) * 0x1p120;
        if (raw != (isnan(want) ? (c < 128 ? 480.0 : -480.0) : want)) PROBLEM("e4m3 0x%02x read by the kernels as %g", c, raw);
        if (isnan(want)) {
            if (!isnan(got)) PROBLEM("e4m3 0x%02x: %g, want NaN", c, got);
            if (moex_f32_to_e4m3(got) != 0x7F) PROBLEM("NaN encodes as 0x%02x, want 0x7F", moex_f32_to_e4m3(got));
            continue;
        }
        if ((double)got != want || !!signbit(got) != (c >= 128))
            PROBLEM("e4m3 0x%02x: %.9g, want %.9g", c, got, want);
        if (moex_f32_to_e4m3(got) != c) PROBLEM("e4m3 round trip 0x%02x -> %.9g -> 0x%02x", c, got, moex_f32_to_e4m3(got));
        /* between this code and the next larger magnitude: the midpoint goes to the even code */
        int next = c + 1;
        if ((c & 0x7F) < 0x7E) {
            double up = ref_e4m3_to_double((uint8_t)next), mid = (want + up) / 2;
            int even = (c & 1) == 0 ? c : next;
            if (moex_f32_to_e4m3((float)mid) != even)
                PROBLEM("e4m3 midpoint %.9g after 0x%02x -> 0x%02x, want 0x%02x", mid, c, moex_f32_to_e4m3((float)mid), even);
            double below = want + (up - want) * 0.49, above = want + (up - want) * 0.51;
            if (moex_f32_to_e4m3((float)below) != c || moex_f32_to_e4m3((float)above) != next)
                PROBLEM("e4m3 rounding near 0x%02x", c);
        }
    }
    if (moex_f32_to_e4m3(1e9f) != 0x7E || moex_f32_to_e4m3(-500.0f) != 0xFE || moex_f32_to_e4m3(INFINITY) != 0x7E)
        PROBLEM("e4m3 does not saturate to +-448");
    end_problems();
}

static void test_e2m1_all_codes(void **state) {
    (void)state;
    for (int c = 0; c < 16; c++) {
        double want = ref_e2m1_to_double((uint8_t)c);
        float got = moex_e2m1_to_f32((uint8_t)c);
        if ((double)got != want) PROBLEM("e2m1 %d: %g, want %g", c, got, want);
        if (moex_f32_to_e2m1(got) != c) PROBLEM("e2m1 round trip %d -> %g -> %d", c, got, moex_f32_to_e2m1(got));
    }
    /* every byte of e2m1x2 through moex_dequantize: low nibble first */
    uint8_t q[256];
    for (int i = 0; i < 256; i++) q[i] = (uint8_t)i;
    float out[512], one = 1.0f;
    uint8_t ue_one = 127;
    int64_t qs[2] = {1, 256}, ss[2] = {1, 16}, os[2] = {1, 512};
    moex_tensor tq = ref_tensor(q, MOEX_E2M1X2, 2, qs), ts = ref_tensor(&ue_one, MOEX_UE8M0, 2, ss);
    moex_tensor to = ref_tensor(out, MOEX_F32, 2, os);
    (void)one;
    uint8_t scales[16];
    memset(scales, 127, sizeof scales);
    ts.data = scales;
    assert_int_equal(moex_dequantize(&tq, &ts, 1, 32, &to), MOEX_OK);
    for (int i = 0; i < 256; i++)
        if ((double)out[2 * i] != ref_e2m1_to_double(i & 15) || (double)out[2 * i + 1] != ref_e2m1_to_double(i >> 4))
            PROBLEM("e2m1x2 byte 0x%02x -> %g, %g", i, out[2 * i], out[2 * i + 1]);
    /* ties to even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4; saturation */
    const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, -100.0f};
    const float want[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f, -6.0f};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        if (moex_e2m1_to_f32(moex_f32_to_e2m1(in[i])) != want[i])
            PROBLEM("e2m1(%g) = %g, want %g", in[i], moex_e2m1_to_f32(moex_f32_to_e2m1(in[i])), want[i]);
    end_problems();
}

static void test_ue8m0_all_codes(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        float got = moex_ue8m0_to_f32((uint8_t)c);
        if (c == 255) {
            if (!isnan(got)) PROBLEM("ue8m0 255: %g, want NaN", got);
            continue;
        }
        if ((double)got != ldexp(1.0, c - 127)) PROBLEM("ue8m0 %d: %g, want 2^%d", c, got, c - 127);
        if (c < 255 && moex_f32_to_ue8m0(got) != c) PROBLEM("ue8m0 round trip %d -> %d", c, moex_f32_to_ue8m0(got));
        if (c >= 1 && c < 254 && moex_f32_to_ue8m0(got * 1.25f) != c + 1) PROBLEM("ue8m0 does not round %g up", got * 1.25);
    }
    if (moex_f32_to_ue8m0(0.0f) != 127 || moex_f32_to_ue8m0(-1.0f) != 127) PROBLEM("ue8m0 of 0 or negative");
    end_problems();
}

/* ---- moex_quantize / moex_dequantize ---------------------------------------------------------- */

static void test_quantize_recipe(void **state) {
    (void)state;
    enum { E = 2, N = 130, K = 200 }; /* tiles of 128 x 128 that do not divide */
    float *w = malloc(sizeof(float) * E * N * K), *back = malloc(sizeof(float) * E * N * K);
    uint8_t *q = malloc(E * N * K);
    float s[E * 2 * 2];
    uint8_t su[E * 2 * 2];
    ref_rng r;
    ref_rng_seed(&r, 7);
    ref_fill_random(w, MOEX_F32, E * N * K, 0.05, &r);
    for (int64_t n = 0; n < 128; n++) /* tile (1, 0, 1) all zero */
        for (int64_t k = 128; k < K; k++) w[(N + n) * K + k] = 0.0f;
    int64_t ws[3] = {E, N, K}, ss[3] = {E, 2, 2};
    moex_tensor tw = ref_tensor(w, MOEX_F32, 3, ws), tq = ref_tensor(q, MOEX_E4M3, 3, ws);
    moex_tensor ts = ref_tensor(s, MOEX_F32, 3, ss), tb = ref_tensor(back, MOEX_F32, 3, ws);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, 128, 128, &tq, &ts), MOEX_OK);
    /* tile (0, 1, 1): rows 128..129, columns 128..199 */
    float amax = 0;
    for (int64_t n = 128; n < N; n++)
        for (int64_t k = 128; k < K; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
    assert_true(s[3] == 1.0f / (448.0f / amax));
    assert_true(s[E * 2 * 2 - 3] == 1.0f); /* the all-zero tile */
    assert_int_equal(moex_dequantize(&tq, &ts, 128, 128, &tb), MOEX_OK);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < E * N * K; i++) err += (back[i] - w[i]) * (double)(back[i] - w[i]), ref += w[i] * (double)w[i];
    if (err / ref > 1e-3) PROBLEM("fp8 round trip NMSE %g", err / ref);
    /* ue8m0: scales rounded up to powers of two, stored as bytes or as f32 */
    moex_tensor tsu = ref_tensor(su, MOEX_UE8M0, 3, ss);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8_UE8M0, 128, 128, &tq, &tsu), MOEX_OK);
    assert_int_equal(su[3], moex_f32_to_ue8m0(1.0f / (448.0f / amax)));
    assert_true(moex_ue8m0_to_f32(su[3]) >= s[3] && moex_ue8m0_to_f32(su[3]) < 2 * s[3]);
    /* float scales do not fit ue8m0 */
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, 128, 128, &tq, &tsu), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "ue8m0"));
    /* a scale grid of the wrong shape names it */
    int64_t bad[3] = {E, 1, 2};
    moex_tensor tbad = ref_tensor(s, MOEX_F32, 3, bad);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, 128, 128, &tq, &tbad), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "scale_inv has shape [2, 1, 2], expected [2, 2, 2]"));
    /* fp4: block 1 x 32 only */
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP4, 128, 128, &tq, &ts), MOEX_ERR_INVALID_ARGUMENT);
    moex_quant_format f;
    assert_int_equal(moex_quant_format_parse("fp9", &f), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "fp8-ue8m0"));
    assert_int_equal(moex_quant_format_parse("fp8-ue8m0", &f), MOEX_OK);
    assert_int_equal(f, MOEX_QUANT_FP8_UE8M0);
    free(w), free(back), free(q);
    end_problems();
}

/* Blocks as large as INT64_MAX: one tile per matrix (or per row band), the same codes and scales as blocks
 * that just cover it; the grid sizes must not overflow. FP4 still refuses any block but 1 x 32, by value. */
static void test_quantize_huge_blocks(void **state) {
    (void)state;
    enum { E = 2, N = 7, K = 24 };
    float w[E * N * K], back[E * N * K], back2[E * N * K], s_a[E * 3], s_b[E * 3];
    uint8_t q_a[E * N * K], q_b[E * N * K];
    ref_rng r;
    ref_rng_seed(&r, 17);
    ref_fill_random(w, MOEX_F32, E * N * K, 0.3, &r);
    int64_t ws[3] = {E, N, K}, one[3] = {E, 1, 1}, three[3] = {E, 1, 3};
    moex_tensor tw = ref_tensor(w, MOEX_F32, 3, ws), tqa = ref_tensor(q_a, MOEX_E4M3, 3, ws);
    moex_tensor tqb = ref_tensor(q_b, MOEX_E4M3, 3, ws), tb = ref_tensor(back, MOEX_F32, 3, ws);
    moex_tensor tb2 = ref_tensor(back2, MOEX_F32, 3, ws);
    moex_tensor tsa = ref_tensor(s_a, MOEX_F32, 3, one), tsb = ref_tensor(s_b, MOEX_F32, 3, one);
    static const int64_t HUGE[] = {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 62, 1000};
    for (int h = 0; h < 4; h++) {
        const int64_t B = HUGE[h];
        memset(q_a, 0, sizeof q_a);
        memset(s_a, 0, sizeof s_a);
        moex_status st = moex_quantize(&tw, MOEX_QUANT_FP8, B, B, &tqa, &tsa);
        if (st) {
            PROBLEM("quantize block %lld x %lld: %s", (long long)B, (long long)B, moex_last_error());
            continue;
        }
        assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tqb, &tsb), MOEX_OK);
        if (memcmp(q_a, q_b, sizeof q_a) || memcmp(s_a, s_b, sizeof(float) * E))
            PROBLEM("block %lld: codes or scales differ from block %d x %d", (long long)B, N, K);
        for (int e = 0; e < E; e++) { /* the recipe: scale_inv = 1 / (448 / amax) over the whole matrix */
            float amax = 0;
            for (int i = 0; i < N * K; i++) amax = fmaxf(amax, fabsf(w[e * N * K + i]));
            if (s_a[e] != 1.0f / (448.0f / amax)) PROBLEM("block %lld: scale_inv[%d] = %g, want %g", (long long)B, e, s_a[e],
                                                          1.0f / (448.0f / amax));
        }
        st = moex_dequantize(&tqa, &tsa, B, B, &tb);
        if (st) {
            PROBLEM("dequantize block %lld: %s", (long long)B, moex_last_error());
            continue;
        }
        assert_int_equal(moex_dequantize(&tqb, &tsb, N, K, &tb2), MOEX_OK);
        if (memcmp(back, back2, sizeof back)) PROBLEM("block %lld: dequantized values differ", (long long)B);
        for (int i = 0; i < E * N * K; i++) { /* w = code * scale, exactly as the reference reads it */
            double want = ref_e4m3_to_double(q_a[i]) * (double)s_a[i / (N * K)];
            if ((double)back[i] != (double)(float)want) {
                PROBLEM("block %lld: back[%d] = %g, want %g", (long long)B, i, back[i], want);
                break;
            }
        }
    }
    /* a huge block_n with a small block_k: [E, 1, 3] */
    float s3[E * 3];
    moex_tensor ts3 = ref_tensor(s3, MOEX_F32, 3, three);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, INT64_MAX, 8, &tqa, &ts3), MOEX_OK);
    assert_int_equal(moex_dequantize(&tqa, &ts3, INT64_MAX, 8, &tb), MOEX_OK);
    double err = 0, ref = 0;
    for (int i = 0; i < E * N * K; i++) err += (back[i] - w[i]) * (double)(back[i] - w[i]), ref += w[i] * (double)w[i];
    if (!(err / ref < 1e-3)) PROBLEM("block INT64_MAX x 8: round trip NMSE %g", err / ref);
    /* FP4 refuses the block, naming it; nothing written */
    uint8_t q4[E * N * K / 2], s4[E * N];
    memset(q4, 0x5A, sizeof q4);
    memset(s4, 0x5A, sizeof s4);
    int64_t q4s[3] = {E, N, K / 2}, s4s[3] = {E, N, 1};
    moex_tensor tq4 = ref_tensor(q4, MOEX_E2M1X2, 3, q4s), ts4 = ref_tensor(s4, MOEX_UE8M0, 3, s4s);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP4, INT64_MAX, 32, &tq4, &ts4), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "9223372036854775807")) PROBLEM("fp4 message \"%s\" lacks the block", moex_last_error());
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP4, 1, INT64_MAX, &tq4, &ts4), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "9223372036854775807")) PROBLEM("fp4 message \"%s\" lacks the block", moex_last_error());
    for (size_t i = 0; i < sizeof q4; i++) assert_int_equal(q4[i], 0x5A);
    for (size_t i = 0; i < sizeof s4; i++) assert_int_equal(s4[i], 0x5A);
    end_problems();
}

/* q or scale_inv sharing memory with w (or out with q), a shape whose element count overflows, and a
 * scale grid not aligned to its f32 elements: refused by name, nothing written. */
static void test_quantize_bad_memory(void **state) {
    (void)state;
    enum { N = 8, K = 32 };
    _Alignas(16) float w[N * K + 64];
    uint8_t q[N * K];
    float s[1 + 4];
    ref_rng r;
    ref_rng_seed(&r, 5);
    ref_fill_random(w, MOEX_F32, N * K + 64, 1.0, &r);
    float wcopy[N * K + 64];
    memcpy(wcopy, w, sizeof w);
    int64_t ws[2] = {N, K}, ss[2] = {1, 1};
    moex_tensor tw = ref_tensor(w, MOEX_F32, 2, ws), tq = ref_tensor(q, MOEX_E4M3, 2, ws), ts = ref_tensor(s, MOEX_F32, 2, ss);
    moex_tensor tq_in_w = ref_tensor((char *)w + 100, MOEX_E4M3, 2, ws);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tq_in_w, &ts), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "q [8, 32]") || !contains(moex_last_error(), "w [8, 32]"))
        PROBLEM("q inside w: \"%s\"", moex_last_error());
    moex_tensor ts_in_w = ref_tensor(w + N * K - 1, MOEX_F32, 2, ss);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tq, &ts_in_w), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "scale_inv [1, 1]")) PROBLEM("scale_inv inside w: \"%s\"", moex_last_error());
    moex_tensor ts_in_q = ref_tensor(q + 4, MOEX_F32, 2, ss);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tq, &ts_in_q), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "scale_inv [1, 1]") || !contains(moex_last_error(), "q [8, 32]"))
        PROBLEM("scale_inv inside q: \"%s\"", moex_last_error());
    assert_memory_equal(w, wcopy, sizeof w);
    /* scale_inv at 2 mod 4 */
    moex_tensor ts_odd = ref_tensor((char *)s + 2, MOEX_F32, 2, ss);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tq, &ts_odd), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "scale_inv: data at") || !contains(moex_last_error(), "aligned"))
        PROBLEM("scale_inv at 2 mod 4: \"%s\"", moex_last_error());
    /* the real thing, then dequantized into memory over its own codes */
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, N, K, &tq, &ts), MOEX_OK);
    uint8_t qcopy[N * K];
    memcpy(qcopy, q, sizeof q);
    moex_tensor tout = ref_tensor(w, MOEX_F32, 2, ws);
    tout.data = (void *)((uintptr_t)q & ~(uintptr_t)3); /* f32 out over the codes */
    assert_int_equal(moex_dequantize(&tq, &ts, N, K, &tout), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "out [8, 32]") || !contains(moex_last_error(), "q [8, 32]"))
        PROBLEM("out over q: \"%s\"", moex_last_error());
    assert_memory_equal(q, qcopy, sizeof q);
    /* w [2^40, 2^40, 2^40]: refused before anything is read */
    moex_tensor th = tw, tqh = tq, tsh = ts; /* views made by hand: their strides are never reached */
    th.ndim = tqh.ndim = tsh.ndim = 3;
    for (int i = 0; i < 3; i++) {
        th.shape[i] = tqh.shape[i] = tsh.shape[i] = (int64_t)1 << 40;
        th.strides[i] = tqh.strides[i] = tsh.strides[i] = 1;
    }
    assert_int_equal(moex_quantize(&th, MOEX_QUANT_FP8, 128, 128, &tqh, &tsh), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "[1099511627776, 1099511627776, 1099511627776]"))
        PROBLEM("w 2^40 x 2^40 x 2^40: \"%s\"", moex_last_error());
    assert_memory_equal(q, qcopy, sizeof q);
    end_problems();
}

/* Tensors without elements but with huge other dimensions ([1, 2^40, 0]): nothing to do, at once
 * (the tile loops once ran over 2^40 empty tiles). The alarm ends the test program if not. */
static void test_quantize_empty_huge(void **state) {
    (void)state;
    static float dummy[4];
    uint8_t qd[4] = {0x5A, 0x5A, 0x5A, 0x5A};
    moex_tensor tw, tq, ts, to;
    memset(&tw, 0, sizeof tw);
    tw.data = dummy;
    tw.dtype = MOEX_F32;
    tw.ndim = 3;
    tw.shape[0] = 1, tw.shape[1] = (int64_t)1 << 40, tw.shape[2] = 0;
    tw.strides[0] = (int64_t)1 << 40, tw.strides[1] = tw.strides[2] = 1; /* row-major, 0 counted as 1 */
    tq = tw;
    tq.data = qd;
    tq.dtype = MOEX_E4M3;
    ts = tw; /* grid [1, 2^40, 0] for block 1 x 1 */
    to = tw;
    alarm(60);
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, 1, 1, &tq, &ts), MOEX_OK);
    assert_int_equal(moex_dequantize(&tq, &ts, 1, 1, &to), MOEX_OK);
    tw.shape[1] = 0, tw.shape[2] = (int64_t)1 << 40; /* [1, 0, 2^40] */
    tw.strides[1] = (int64_t)1 << 40;
    tq = tw, tq.data = qd, tq.dtype = MOEX_E4M3;
    ts = tw, to = tw;
    assert_int_equal(moex_quantize(&tw, MOEX_QUANT_FP8, 1, 1, &tq, &ts), MOEX_OK);
    assert_int_equal(moex_dequantize(&tq, &ts, 1, 1, &to), MOEX_OK);
    alarm(0);
    for (int i = 0; i < 4; i++) assert_int_equal(qd[i], 0x5A);
}

/* ---- layers --------------------------------------------------------------------------------- */

typedef struct qlayer {
    ref_layer plain;            /* the f32 layer it was quantized from */
    moex_experts_desc desc;     /* the quantized description */
    void *gu, *dn, *gus, *dns;  /* codes and scales */
} qlayer;

static void quantize_into(const moex_tensor *w, moex_quant_format f, int64_t bn, int64_t bk, void **q, void **s,
                          moex_tensor *tq, moex_tensor *ts) {
    int64_t E = w->shape[0], N = w->shape[1], K = w->shape[2];
    int fp4 = f == MOEX_QUANT_FP4, ue = f != MOEX_QUANT_FP8;
    int64_t qs[3] = {E, N, fp4 ? K / 2 : K}, ss[3] = {E, (N + bn - 1) / bn, (K + bk - 1) / bk};
    *q = calloc((size_t)(E * N * K), 1);
    *s = calloc((size_t)(ss[0] * ss[1] * ss[2]), 4);
    *tq = ref_tensor(*q, fp4 ? MOEX_E2M1X2 : MOEX_E4M3, 3, qs);
    *ts = ref_tensor(*s, ue ? MOEX_UE8M0 : MOEX_F32, 3, ss);
    moex_status st = moex_quantize(w, f, bn, bk, tq, ts);
    if (st) fail_msg("moex_quantize: %s", moex_last_error());
}

static void qlayer_build(qlayer *L, const ref_layer_spec *spec, moex_quant_format f, int64_t bn, int64_t bk,
                         uint64_t seed) {
    ref_layer_build(&L->plain, spec, seed);
    L->desc = L->plain.desc;
    if (f == MOEX_QUANT_FP4) bn = 1, bk = 32;
    quantize_into(&L->plain.desc.gate_up, f, bn, bk, &L->gu, &L->gus, &L->desc.gate_up, &L->desc.gate_up_scale);
    quantize_into(&L->plain.desc.down, f, bn, bk, &L->dn, &L->dns, &L->desc.down, &L->desc.down_scale);
    L->desc.block_n = bn;
    L->desc.block_k = bk;
    L->desc.activation_scheme = MOEX_ACT_SCHEME_DYNAMIC;
}

static void qlayer_destroy(qlayer *L) {
    ref_layer_destroy(&L->plain);
    free(L->gu), free(L->dn), free(L->gus), free(L->dns);
}

typedef struct qcase {
    int64_t E, H, I, k, T;
    moex_quant_format f;
    int64_t bn, bk;
    moex_dtype act;     /* hidden / out dtype */
    moex_activation activation;
    int interleaved, bias;
} qcase;

// Run every CPU backend on the case; check against both references and across thread counts.
static void run_qcase(const qcase *c) {
    ref_layer_spec spec = {c->E, c->H, c->I, c->k, 1, c->interleaved, 0, c->bias, c->activation, 1.702f, 7.0f, MOEX_F32};
    qlayer L;
    qlayer_build(&L, &spec, c->f, c->bn, c->bk, 1000 + (uint64_t)c->T);
    moex_layer *layer = NULL;
    if (moex_layer_create(&L.desc, &layer)) fail_msg("moex_layer_create: %s", moex_last_error());
    ref_rng r;
    ref_rng_seed(&r, 99 + (uint64_t)c->T);
    void *x = calloc((size_t)(c->T * c->H), 4), *out = calloc((size_t)(c->T * c->H), 4);
    int32_t *ids = calloc((size_t)(c->T * c->k), 4);
    float *w = calloc((size_t)(c->T * c->k), 4);
    ref_fill_random(x, c->act, c->T * c->H, 1.0, &r);
    ref_random_routing(&r, c->T, c->E, c->k, MOEX_I32, ids, MOEX_F32, w, 0.05);
    int64_t xs[2] = {c->T, c->H}, is[2] = {c->T, c->k};
    moex_tensor tx = ref_tensor(x, c->act, 2, xs), tout = ref_tensor(out, c->act, 2, xs);
    moex_tensor tids = ref_tensor(ids, MOEX_I32, 2, is), tw = ref_tensor(w, MOEX_F32, 2, is);
    double *want = calloc((size_t)(c->T * c->H), sizeof(double)), *plain = calloc((size_t)(c->T * c->H), sizeof(double));
    ref_experts_forward(&L.desc, &tx, &tids, &tw, want);
    ref_experts_forward(&L.plain.desc, &tx, &tids, &tw, plain);
    ref_round_all(want, c->T * c->H, c->act);
    const double vs_plain = c->f == MOEX_QUANT_FP4 ? NMSE_VS_PLAIN_FP4 : NMSE_VS_PLAIN_FP8;
    void *first[BACKEND_LIST_MAX]; /* each backend's output with 1 thread */
    for (int b = 0; b < N_BACKENDS; b++) first[b] = malloc((size_t)(c->T * c->H) * 4);
    for (int threads = 1; threads <= 3; threads += 2) {
        moex_context_options o = moex_context_default_options();
        o.num_threads = threads;
        o.max_tokens = c->T;
        moex_context *ctx;
        assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
        for (int b = 0; b < N_BACKENDS; b++) {
            const char *be = CPU_BACKENDS[b];
            if (!backend_takes(be, layer, CPU_DEVICE)) continue; /* refuses this layer */
            moex_status st = moex_prepare(ctx, layer, be);
            if (!st) st = moex_experts_forward(ctx, layer, be, &tx, &tids, &tw, &tout);
            if (st) {
                PROBLEM("%s %s T=%lld: %s", be, moex_quant_format_name(c->f), (long long)c->T, moex_last_error());
                continue;
            }
            double e = ref_nmse(out, c->act, c->T, c->H, c->H, want), ep = ref_nmse(out, c->act, c->T, c->H, c->H, plain);
            if (e > NMSE_SAME_QUANT)
                PROBLEM("%s %s T=%lld H=%lld I=%lld block %lldx%lld: NMSE %.3g vs the same quantization", be,
                        moex_quant_format_name(c->f), (long long)c->T, (long long)c->H, (long long)c->I,
                        (long long)c->bn, (long long)c->bk, e);
            if (ep > vs_plain)
                PROBLEM("%s %s T=%lld: NMSE %.3g vs the unquantized layer > %g", be, moex_quant_format_name(c->f),
                        (long long)c->T, ep, vs_plain);
            if (threads == 1) memcpy(first[b], out, (size_t)(c->T * c->H) * 4);
            if (threads == 3 && memcmp(first[b], out, (size_t)(c->T * c->H) * 4))
                PROBLEM("%s %s T=%lld: 1 and 3 threads differ", be, moex_quant_format_name(c->f), (long long)c->T);
        }
        moex_context_free(ctx);
    }
    for (int b = 0; b < N_BACKENDS; b++) free(first[b]);
    free(x), free(out), free(ids), free(w), free(want), free(plain);
    moex_layer_free(layer);
    qlayer_destroy(&L);
}

static void test_fp8_layers(void **state) {
    (void)state;
    const int64_t tokens[] = {1, 3, 9, 40};
    for (int i = 0; i < 4; i++) {
        qcase c = {6, 200, 136, 2, tokens[i], MOEX_QUANT_FP8, 128, 128, MOEX_F32, MOEX_ACT_SILU, 0, 0};
        run_qcase(&c);
        c.f = MOEX_QUANT_FP8_UE8M0;
        c.act = MOEX_BF16;
        run_qcase(&c);
    }
    /* odd sizes and blocks that are not multiples of 8 (the vector paths step aside) */
    qcase odd = {5, 77, 45, 3, 20, MOEX_QUANT_FP8, 16, 12, MOEX_F32, MOEX_ACT_SILU, 0, 1};
    run_qcase(&odd);
    odd.T = 2;
    odd.interleaved = 1;
    run_qcase(&odd);
    qcase small_block = {4, 96, 64, 2, 12, MOEX_QUANT_FP8, 32, 64, MOEX_F32, MOEX_ACT_GELU, 0, 0};
    run_qcase(&small_block);
    end_problems();
}

static void test_fp4_layers(void **state) {
    (void)state;
    const int64_t tokens[] = {1, 4, 11, 33};
    for (int i = 0; i < 4; i++) {
        qcase c = {5, 192, 96, 2, tokens[i], MOEX_QUANT_FP4, 1, 32, MOEX_BF16, MOEX_ACT_SILU, 0, 0};
        run_qcase(&c);
    }
    /* GPT-OSS's shape of things: interleaved gate/up, biases, clamped activation, K not a multiple of 32 */
    qcase g = {4, 90, 46, 2, 13, MOEX_QUANT_FP4, 1, 32, MOEX_F32, MOEX_ACT_GPTOSS_CLAMP, 1, 1};
    run_qcase(&g);
    end_problems();
}

/* GPT-OSS's MXFP4 layout: `*_blocks [E, N, K/32, 16]` with `*_scales [E, N, K/32]` is the same bytes
 * as [E, N, K/2]; the layer takes either view and computes the same. */
static void test_fp4_gptoss_block_layout(void **state) {
    (void)state;
    ref_layer_spec spec = {4, 128, 64, 2, 1, 1, 0, 1, MOEX_ACT_GPTOSS_CLAMP, 1.702f, 7.0f, MOEX_F32};
    qlayer L;
    qlayer_build(&L, &spec, MOEX_QUANT_FP4, 1, 32, 11);
    moex_experts_desc blocks = L.desc;
    int64_t gs[4] = {4, 128, 4, 16}, ds[4] = {4, 128, 2, 16};
    blocks.gate_up = ref_tensor(L.gu, MOEX_E2M1X2, 4, gs);
    blocks.down = ref_tensor(L.dn, MOEX_E2M1X2, 4, ds);
    moex_layer *a = NULL, *b = NULL;
    assert_int_equal(moex_layer_create(&L.desc, &a), MOEX_OK);
    if (moex_layer_create(&blocks, &b)) fail_msg("the [E, N, K/32, 16] view: %s", moex_last_error());
    enum { T = 6 };
    float x[T * 128], out_a[T * 128], out_b[T * 128], w[T * 2];
    int32_t ids[T * 2];
    ref_rng r;
    ref_rng_seed(&r, 3);
    ref_fill_random(x, MOEX_F32, T * 128, 1.0, &r);
    ref_random_routing(&r, T, 4, 2, MOEX_I32, ids, MOEX_F32, w, 0.0);
    int64_t xs[2] = {T, 128}, is[2] = {T, 2};
    moex_tensor tx = ref_tensor(x, MOEX_F32, 2, xs), ta = ref_tensor(out_a, MOEX_F32, 2, xs);
    moex_tensor tb = ref_tensor(out_b, MOEX_F32, 2, xs), ti = ref_tensor(ids, MOEX_I32, 2, is), tw = ref_tensor(w, MOEX_F32, 2, is);
    moex_context_options o = moex_context_default_options();
    o.max_tokens = T;
    moex_context *ctx;
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_int_equal(moex_prepare(ctx, a, "grouped_mm"), MOEX_OK);
    assert_int_equal(moex_prepare(ctx, b, "grouped_mm"), MOEX_OK);
    assert_int_equal(moex_experts_forward(ctx, a, "grouped_mm", &tx, &ti, &tw, &ta), MOEX_OK);
    assert_int_equal(moex_experts_forward(ctx, b, "grouped_mm", &tx, &ti, &tw, &tb), MOEX_OK);
    assert_memory_equal(out_a, out_b, sizeof out_a);
    moex_context_free(ctx);
    moex_layer_free(a);
    moex_layer_free(b);
    qlayer_destroy(&L);
}

/* ---- bad layers --------------------------------------------------------------------------- */

static void expect_layer_error(const moex_experts_desc *d, const char *needle) {
    moex_layer *layer = NULL;
    moex_status st = moex_layer_create(d, &layer);
    if (st == MOEX_OK) {
        PROBLEM("layer accepted, expected an error with \"%s\"", needle);
        moex_layer_free(layer);
    } else if (!contains(moex_last_error(), needle)) {
        PROBLEM("message \"%s\" lacks \"%s\"", moex_last_error(), needle);
    }
}

static void test_bad_quantized_layers(void **state) {
    (void)state;
    ref_layer_spec spec = {4, 160, 96, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    qlayer L;
    qlayer_build(&L, &spec, MOEX_QUANT_FP8, 128, 128, 5);
    moex_experts_desc d = L.desc;
    d.gate_up_scale.shape[1] = 1;
    expect_layer_error(&d, "gate_up_scale has shape [4, 1, 2], expected [4, 2, 2]");
    d = L.desc;
    d.block_k = 64; /* the grids no longer fit the declared block */
    expect_layer_error(&d, "gate_up_scale has shape [4, 2, 2], expected [4, 2, 3]");
    d = L.desc;
    d.down_scale.dtype = MOEX_BF16;
    expect_layer_error(&d, "down_scale: dtype bf16 is not a scale dtype");
    d = L.desc;
    d.down_scale = ref_tensor_absent();
    expect_layer_error(&d, "down_scale is absent");
    d = L.desc;
    d.block_n = 0;
    expect_layer_error(&d, "block_n = 0");
    d = L.desc;
    d.activation_scheme = 7;
    expect_layer_error(&d, "activation_scheme = 7");
    d = L.plain.desc;
    d.gate_up_scale = L.desc.gate_up_scale;
    expect_layer_error(&d, "gate_up_scale is set but the weights are f32");
    /* static activation scales: a valid layer that the CPU backends refuse, saying why */
    d = L.desc;
    d.activation_scheme = MOEX_ACT_SCHEME_STATIC;
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_OK);
    moex_device cpu = {MOEX_DEVICE_CPU, 0};
    char why[512];
    for (int b = 0; b < N_BACKENDS; b++) {
        if (moex_backend_supports(CPU_BACKENDS[b], layer, cpu, why, sizeof why) != MOEX_ERR_UNSUPPORTED)
            PROBLEM("%s accepts a static activation scheme", CPU_BACKENDS[b]);
        else if (!contains(why, "static") || !contains(why, "dequantize"))
            PROBLEM("%s: reason \"%s\" does not say static / dequantize", CPU_BACKENDS[b], why);
    }
    moex_layer_free(layer);
    qlayer_destroy(&L);
    /* FP4 needs block 1 x 32 */
    qlayer_build(&L, &spec, MOEX_QUANT_FP4, 1, 32, 6);
    d = L.desc;
    d.block_k = 16;
    expect_layer_error(&d, "block_n = 1 and block_k = 32");
    qlayer_destroy(&L);
    end_problems();
}

/* FP8 blocks larger than any size, up to INT64_MAX: one scale per expert matrix, the same numbers as
 * blocks that just cover the matrices. The grid sizes ceil(rows / block) must not overflow on the way. */
static void test_fp8_huge_blocks(void **state) {
    (void)state;
    enum { E = 4, H = 48, I = 40, K = 2, T = 5 };
    ref_layer_spec spec = {E, H, I, K, 1, 0, 0, 1, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    qlayer L;
    qlayer_build(&L, &spec, MOEX_QUANT_FP8, 4096, 4096, 21); /* grids [E, 1, 1] */
    assert_int_equal(L.desc.gate_up_scale.shape[1], 1);
    assert_int_equal(L.desc.down_scale.shape[2], 1);
    float x[T * H], out[T * H], w[T * K];
    int32_t ids[T * K];
    ref_rng r;
    ref_rng_seed(&r, 8);
    ref_fill_random(x, MOEX_F32, T * H, 1.0, &r);
    ref_random_routing(&r, T, E, K, MOEX_I32, ids, MOEX_F32, w, 0.0);
    int64_t xs[2] = {T, H}, is[2] = {T, K};
    moex_tensor tx = ref_tensor(x, MOEX_F32, 2, xs), tout = ref_tensor(out, MOEX_F32, 2, xs);
    moex_tensor tids = ref_tensor(ids, MOEX_I32, 2, is), tw = ref_tensor(w, MOEX_F32, 2, is);
    double want[T * H];
    ref_experts_forward(&L.desc, &tx, &tids, &tw, want); /* block 4096 covers every size: the same layer */
    static const int64_t HUGE[][2] = {{INT64_MAX, INT64_MAX}, {INT64_MAX - 1, (int64_t)1 << 62}, {4096, INT64_MAX}};
    moex_context_options o = moex_context_default_options();
    o.max_tokens = T;
    for (int h = 0; h < 3; h++) {
        moex_experts_desc d = L.desc;
        d.block_n = HUGE[h][0];
        d.block_k = HUGE[h][1];
        moex_layer *layer = NULL;
        if (moex_layer_create(&d, &layer) != MOEX_OK) {
            PROBLEM("block %lld x %lld: %s", (long long)d.block_n, (long long)d.block_k, moex_last_error());
            continue;
        }
        moex_context *ctx;
        assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
        for (int b = 0; b < N_BACKENDS; b++) {
            if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
            memset(out, 0xFF, sizeof out);
            moex_status st = moex_prepare(ctx, layer, CPU_BACKENDS[b]);
            if (!st) st = moex_experts_forward(ctx, layer, CPU_BACKENDS[b], &tx, &tids, &tw, &tout);
            if (st) {
                PROBLEM("%s block %lld x %lld: %s", CPU_BACKENDS[b], (long long)d.block_n, (long long)d.block_k,
                        moex_last_error());
                continue;
            }
            double e = ref_nmse(out, MOEX_F32, T, H, H, want);
            if (!(e <= NMSE_SAME_QUANT))
                PROBLEM("%s block %lld x %lld: NMSE %.3g", CPU_BACKENDS[b], (long long)d.block_n, (long long)d.block_k, e);
        }
        moex_context_free(ctx);
        moex_layer_free(layer);
        /* a grid that does not fit the block is still refused, naming both shapes */
        d.gate_up_scale.shape[1] = 2;
        expect_layer_error(&d, "gate_up_scale has shape [4, 2, 1], expected [4, 1, 1]");
    }
    qlayer_destroy(&L);
    end_problems();
}

int main(void) {
    const backend_list cpu = cpu_backends();
    for (int i = 0; i < cpu.n; i++) CPU_BACKENDS[i] = cpu.name[i];
    N_BACKENDS = cpu.n;
    if (N_BACKENDS == 0) {
        fprintf(stderr, "test_quant: no registered backend takes the CPU\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_all_codes),
        cmocka_unit_test(test_e2m1_all_codes),
        cmocka_unit_test(test_ue8m0_all_codes),
        cmocka_unit_test(test_quantize_recipe),
        cmocka_unit_test(test_quantize_huge_blocks),
        cmocka_unit_test(test_quantize_bad_memory),
        cmocka_unit_test(test_quantize_empty_huge),
        cmocka_unit_test(test_fp8_layers),
        cmocka_unit_test(test_fp4_layers),
        cmocka_unit_test(test_fp4_gptoss_block_layout),
        cmocka_unit_test(test_bad_quantized_layers),
        cmocka_unit_test(test_fp8_huge_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
