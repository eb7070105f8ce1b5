/*
 * test_core.c — version, status and errors, dtypes and conversion, tensor
 * views, devices, contexts, defaults and NULL-safe frees.
 *
 * Expected bit patterns of the conversions were checked against GCC's
 * _Float16 conversions (binary16) and the round-to-nearest-even rule (bf16).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h" /* moex_check_disjoint, against brute force */
#include "moex.h"
#include "reference.h"
#include "testutil.h"

/* ------------------------------------------------------------------------ */
/* version, status, last error                                               */
/* ------------------------------------------------------------------------ */

static void test_version(void **state) {
    (void)state;
    assert_non_null(moex_version());
    assert_string_equal(moex_version(), MOEX_VERSION_STRING);
    assert_int_equal(MOEX_VERSION_NUMBER, MOEX_VERSION_MAJOR * 10000 + MOEX_VERSION_MINOR * 100 + MOEX_VERSION_PATCH);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", MOEX_VERSION_MAJOR, MOEX_VERSION_MINOR, MOEX_VERSION_PATCH);
    assert_string_equal(buf, MOEX_VERSION_STRING);
    end_problems();
}

/* Every status has a non-empty text, all different; unknown values too. */
static void test_status_str(void **state) {
    (void)state;
    assert_int_equal(MOEX_OK, 0);
    const char *s[12];
    for (int i = 0; i <= MOEX_ERR_INTERNAL; i++) {
        s[i] = moex_status_str((moex_status)i);
        assert_non_null(s[i]);
        if (!*s[i]) PROBLEM("moex_status_str(%d) is empty", i);
        for (int j = 0; j < i; j++)
            if (strcmp(s[i], s[j]) == 0) PROBLEM("status %d and %d share the text \"%s\"", i, j, s[i]);
    }
    assert_non_null(moex_status_str((moex_status)99));
    assert_non_null(moex_status_str((moex_status)-1));
    end_problems();
}

/* A failing call on another thread: -> its message, and whether a fresh thread saw "" */
typedef struct thread_msg {
    char before[64];
    char after[256];
} thread_msg;

static void *fail_on_thread(void *arg) {
    thread_msg *m = arg;
    snprintf(m->before, sizeof m->before, "%s", moex_last_error());
    moex_dtype dt;
    (void)moex_dtype_parse("zzz_other_thread", &dt);
    snprintf(m->after, sizeof m->after, "%s", moex_last_error());
    return NULL;
}

/* moex_last_error names the bad value; it is per thread. */
static void test_last_error(void **state) {
    (void)state;
    moex_dtype dt = (moex_dtype)77;
    assert_int_equal(moex_dtype_parse("f33", &dt), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt, 77);                       /* output untouched */
    const char *msg = moex_last_error();
    assert_non_null(msg);
    if (!msg) msg = "";
    if (!contains(msg, "f33")) PROBLEM("message \"%s\" does not name \"f33\"", msg);
    if (!contains(msg, "bf16") || !contains(msg, "f32"))
        PROBLEM("message \"%s\" does not list the dtype names", msg);

    thread_msg m;
    memset(&m, 0, sizeof m);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fail_on_thread, &m), 0);
    pthread_join(th, NULL);
    if (m.before[0]) PROBLEM("a fresh thread sees \"%s\", want \"\"", m.before);
    assert_true(contains(m.after, "zzz_other_thread"));
    if (!contains(moex_last_error(), "f33"))
        PROBLEM("another thread's failure replaced this thread's message: \"%s\"", moex_last_error());
    end_problems();
}

/* moex_backend_fail: records this thread's message and returns the status; its arguments may be the
 * current message itself; a long one is cut at 1023 bytes. */
static void test_backend_fail_message(void **state) {
    (void)state;
    assert_int_equal(moex_backend_fail(MOEX_ERR_IO, "my_backend: disk %d of %s", 3, "7"), MOEX_ERR_IO);
    assert_string_equal(moex_last_error(), "my_backend: disk 3 of 7");
    assert_int_equal(moex_backend_fail(MOEX_ERR_FORMAT, "again (%s)", moex_last_error()), MOEX_ERR_FORMAT);
    assert_string_equal(moex_last_error(), "again (my_backend: disk 3 of 7)");
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(moex_backend_fail(MOEX_ERR_INTERNAL, "%s", big), MOEX_ERR_INTERNAL);
    assert_int_equal(strlen(moex_last_error()), 1023);
    thread_msg m; /* another thread's message is its own */
    memset(&m, 0, sizeof m);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fail_on_thread, &m), 0);
    pthread_join(th, NULL);
    assert_int_equal(strlen(moex_last_error()), 1023);
    end_problems();
}

/* A NULL argument is named in the message, one call at a time. */
static void test_null_arguments_named(void **state) {
    (void)state;
    moex_dtype dt;
    moex_quant_format qf;
    moex_tensor t;
    int64_t shape[1] = {1};
    float f = 0;
    assert_int_equal(moex_dtype_parse(NULL, &dt), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "name is NULL")) PROBLEM("dtype_parse(NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_dtype_parse("f32", NULL), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "out is NULL")) PROBLEM("dtype_parse(, NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_quant_format_parse(NULL, &qf), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "name is NULL")) PROBLEM("quant_format_parse(NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_tensor_init(&t, &f, MOEX_F32, 1, NULL), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "shape is NULL")) PROBLEM("tensor_init(shape NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_tensor_init(NULL, &f, MOEX_F32, 1, shape), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "t is NULL")) PROBLEM("tensor_init(t NULL): \"%s\"", moex_last_error());
    moex_context_options o = moex_context_default_options();
    o.num_threads = 1;
    moex_context *ctx = NULL;
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    void *p;
    size_t n;
    assert_int_equal(moex_context_workspace(ctx, &p, NULL), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "bytes is NULL")) PROBLEM("context_workspace(bytes NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_context_workspace(ctx, NULL, &n), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "ptr is NULL")) PROBLEM("context_workspace(ptr NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_context_get_options(ctx, NULL), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "out is NULL")) PROBLEM("context_get_options(out NULL): \"%s\"", moex_last_error());
    assert_int_equal(moex_context_get_options(NULL, &o), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "ctx is NULL")) PROBLEM("context_get_options(ctx NULL): \"%s\"", moex_last_error());
    moex_context_free(ctx);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------ */

static void test_dtype_size_name_parse(void **state) {
    (void)state;
    static const size_t SIZE[MOEX_DTYPE_COUNT] = {4, 2, 2, 1, 1, 1, 4, 8};
    for (int i = 0; i < MOEX_DTYPE_COUNT; i++) {
        assert_int_equal(moex_dtype_size((moex_dtype)i), SIZE[i]);
        const char *name = moex_dtype_name((moex_dtype)i);
        assert_non_null(name);
        assert_true(*name);
        for (const char *p = name; *p; p++)
            if (isupper((unsigned char)*p)) PROBLEM("dtype name \"%s\" is not lower-case", name);
        assert_string_not_equal(name, "invalid");
        moex_dtype back = (moex_dtype)-1;
        if (moex_dtype_parse(name, &back) != MOEX_OK) PROBLEM("parse(\"%s\"): %s", name, moex_last_error());
        assert_int_equal(back, i);
        for (int j = 0; j < i; j++) assert_string_not_equal(name, moex_dtype_name((moex_dtype)j));
    }
    assert_string_equal(moex_dtype_name(MOEX_F32), "f32");
    assert_string_equal(moex_dtype_name(MOEX_F16), "f16");
    assert_string_equal(moex_dtype_name(MOEX_BF16), "bf16");
    assert_string_equal(moex_dtype_name(MOEX_E4M3), "e4m3");
    assert_int_equal(moex_dtype_size((moex_dtype)MOEX_DTYPE_COUNT), 0);
    assert_int_equal(moex_dtype_size((moex_dtype)-1), 0);
    assert_string_equal(moex_dtype_name((moex_dtype)MOEX_DTYPE_COUNT), "invalid");
    assert_string_equal(moex_dtype_name((moex_dtype)-1), "invalid");

    moex_dtype dt = MOEX_I64;
    assert_int_equal(moex_dtype_parse("invalid", &dt), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_dtype_parse("", &dt), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_dtype_parse("f32 ", &dt), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(dt, MOEX_I64);
    assert_int_equal(moex_dtype_parse(NULL, &dt), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_dtype_parse("f32", NULL), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* conversions                                                               */
/* ------------------------------------------------------------------------ */

/* One expected conversion of bits. NaN expectations are checked as "is a NaN". */
typedef struct conv32 {
    uint32_t in;
    uint16_t out;
} conv32;
typedef struct conv16 {
    uint16_t in;
    uint32_t out;
} conv16;
typedef struct conv1616 {
    uint16_t in, out;
} conv1616;

static const conv32 F32_TO_BF16[] = {
    {0x3F800000, 0x3F80}, /* 1 */
    {0x3F808000, 0x3F80}, /* tie, even below */
    {0x3F818000, 0x3F82}, /* tie, even above */
    {0x3F808001, 0x3F81}, /* just above half */
    {0x3F807FFF, 0x3F80}, /* just below half */
    {0xBF818000, 0xBF82}, /* negative tie */
    {0x7F800000, 0x7F80}, /* +inf */
    {0xFF800000, 0xFF80}, /* -inf */
    {0x7F7FFFFF, 0x7F80}, /* FLT_MAX rounds to inf */
    {0x7F7F7FFF, 0x7F7F}, /* largest that rounds down */
    {0x00000001, 0x0000}, /* smallest subnormal -> 0 */
    {0x00010000, 0x0001}, /* bf16 subnormal kept */
    {0x00018000, 0x0002}, /* subnormal tie, even above */
    {0x00008000, 0x0000}, /* subnormal tie, even below */
    {0x00008001, 0x0001},
    {0x80000000, 0x8000}, /* -0 */
    {0x007FFFFF, 0x0080}, /* largest subnormal -> smallest normal */
    {0x40490FDB, 0x4049}, /* pi */
};
static const uint32_t F32_NANS[] = {0x7FC00000, 0x7F800001, 0x7F80FFFF, 0xFFFFFFFF, 0xFFC00001};

static const conv32 F32_TO_F16[] = {
    {0x3F800000, 0x3C00}, {0xC0000000, 0xC000},
    {0x477FE000, 0x7BFF}, /* 65504, the largest */
    {0x477FEFFF, 0x7BFF}, /* just below 65520 */
    {0x477FF000, 0x7C00}, /* 65520: tie -> inf */
    {0x47800000, 0x7C00}, {0x49742400, 0x7C00}, {0xC9742400, 0xFC00}, /* +-1e6 */
    {0x3F801000, 0x3C00}, /* 1 + 2^-11: tie, even below */
    {0x3F803000, 0x3C02}, /* 1 + 3*2^-11: tie, even above */
    {0x3F801001, 0x3C01},
    {0x38800000, 0x0400}, /* 2^-14, smallest normal */
    {0x387FC000, 0x03FF}, /* largest subnormal */
    {0x387FE000, 0x0400}, /* tie between them -> even (normal) */
    {0x33800000, 0x0001}, /* 2^-24, smallest subnormal */
    {0x33000000, 0x0000}, /* 2^-25: tie -> 0 */
    {0x33000001, 0x0001},
    {0x33400000, 0x0001}, /* 0.75 * 2^-24 */
    {0x33C00000, 0x0002}, /* 1.5 * 2^-24: tie -> 2 */
    {0x2EDBE6FF, 0x0000}, {0xAEDBE6FF, 0x8000}, /* +-1e-10 */
    {0x00000001, 0x0000}, {0x7F800000, 0x7C00}, {0xFF800000, 0xFC00}, {0x80000000, 0x8000},
};

static const conv16 F16_TO_F32[] = {
    {0x0001, 0x33800000}, {0x03FF, 0x387FC000}, {0x0400, 0x38800000}, {0x7BFF, 0x477FE000},
    {0x7C00, 0x7F800000}, {0xFC00, 0xFF800000}, {0x8000, 0x80000000}, {0x3C00, 0x3F800000},
    {0xC000, 0xC0000000}, {0x3555, 0x3EAAA000}, {0x8001, 0xB3800000},
};
static const uint16_t F16_NANS[] = {0x7E00, 0x7C01, 0xFFFF, 0x7DFF};

static const conv16 BF16_TO_F32[] = {
    {0x0001, 0x00010000}, {0x7F80, 0x7F800000}, {0xFF7F, 0xFF7F0000},
    {0x8001, 0x80010000}, {0x3F80, 0x3F800000}, {0x0000, 0x00000000},
};
static const uint16_t BF16_NANS[] = {0x7FC0, 0x7F81, 0xFFFF};

static const conv1616 F16_TO_BF16[] = {
    {0x3C01, 0x3F80}, /* 1 + 2^-10 */
    {0x3C04, 0x3F80}, /* 1 + 2^-8: tie, even below */
    {0x3C0C, 0x3F82}, /* 1 + 3*2^-8: tie, even above */
    {0x7BFF, 0x4780}, /* 65504 -> 65536 */
    {0x0001, 0x3380}, /* 2^-24, exact */
    {0x7C00, 0x7F80}, {0x8000, 0x8000},
};
static const conv1616 BF16_TO_F16[] = {
    {0x3F81, 0x3C08}, /* 1 + 2^-7, exact */
    {0x4780, 0x7C00}, /* 65536 -> inf */
    {0x3380, 0x0001}, /* 2^-24 */
    {0x0001, 0x0000}, /* far below the f16 range */
    {0x3301, 0x0001}, /* just above 2^-25 */
    {0xFF80, 0xFC00},
};

/* bits -> is it a NaN of that width? */
static int is_nan32(uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu); }
static int is_nan_f16(uint16_t u) { return (u & 0x7C00) == 0x7C00 && (u & 0x3FF); }
static int is_nan_bf16(uint16_t u) { return (u & 0x7F80) == 0x7F80 && (u & 0x7F); }

/* src: [n] of sd -> dst: [n] of dd, via moex_convert; all at once and one by one */
static void convert_both_ways(const void *src, moex_dtype sd, void *dst_all, void *dst_one,
                              moex_dtype dd, size_t n) {
    moex_status st = moex_convert(src, sd, dst_all, dd, n);
    if (st != MOEX_OK) PROBLEM("moex_convert: %s: %s", moex_status_str(st), moex_last_error());
    size_t ss = moex_dtype_size(sd), ds = moex_dtype_size(dd);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(moex_convert((const char *)src + i * ss, sd, (char *)dst_one + i * ds, dd, 1), MOEX_OK);
}

static void test_convert_f32_bf16(void **state) {
    (void)state;
    enum { N = sizeof F32_TO_BF16 / sizeof F32_TO_BF16[0], M = sizeof F32_NANS / 4 };
    uint32_t in[N + M];
    uint16_t all[N + M], one[N + M];
    for (int i = 0; i < N; i++) in[i] = F32_TO_BF16[i].in;
    for (int i = 0; i < M; i++) in[N + i] = F32_NANS[i];
    convert_both_ways(in, MOEX_F32, all, one, MOEX_BF16, N + M);
    for (int i = 0; i < N; i++) {
        if (all[i] != F32_TO_BF16[i].out)
            PROBLEM("f32 %08x -> bf16 %04x, want %04x", in[i], all[i], F32_TO_BF16[i].out);
        if (one[i] != F32_TO_BF16[i].out)
            PROBLEM("f32 %08x -> bf16 %04x (n=1), want %04x", in[i], one[i], F32_TO_BF16[i].out);
    }
    for (int i = N; i < N + M; i++)
        if (!is_nan_bf16(all[i]) || !is_nan_bf16(one[i]))
            PROBLEM("f32 NaN %08x -> bf16 %04x / %04x (n=1), not a NaN", in[i], all[i], one[i]);

    enum { K = sizeof BF16_TO_F32 / sizeof BF16_TO_F32[0], L = sizeof BF16_NANS / 2 };
    uint16_t hin[K + L];
    uint32_t fall[K + L], fone[K + L];
    for (int i = 0; i < K; i++) hin[i] = BF16_TO_F32[i].in;
    for (int i = 0; i < L; i++) hin[K + i] = BF16_NANS[i];
    convert_both_ways(hin, MOEX_BF16, fall, fone, MOEX_F32, K + L);
    for (int i = 0; i < K; i++)
        if (fall[i] != BF16_TO_F32[i].out || fone[i] != BF16_TO_F32[i].out)
            PROBLEM("bf16 %04x -> f32 %08x / %08x, want %08x", hin[i], fall[i], fone[i], BF16_TO_F32[i].out);
    for (int i = K; i < K + L; i++)
        if (!is_nan32(fall[i]) || !is_nan32(fone[i])) PROBLEM("bf16 NaN %04x -> f32 %08x, not a NaN", hin[i], fall[i]);
    end_problems();
}

static void test_convert_f32_f16(void **state) {
    (void)state;
    enum { N = sizeof F32_TO_F16 / sizeof F32_TO_F16[0], M = sizeof F32_NANS / 4 };
    uint32_t in[N + M];
    uint16_t all[N + M], one[N + M];
    for (int i = 0; i < N; i++) in[i] = F32_TO_F16[i].in;
    for (int i = 0; i < M; i++) in[N + i] = F32_NANS[i];
    convert_both_ways(in, MOEX_F32, all, one, MOEX_F16, N + M);
    for (int i = 0; i < N; i++) {
        if (all[i] != F32_TO_F16[i].out)
            PROBLEM("f32 %08x -> f16 %04x, want %04x", in[i], all[i], F32_TO_F16[i].out);
        if (one[i] != F32_TO_F16[i].out)
            PROBLEM("f32 %08x -> f16 %04x (n=1), want %04x", in[i], one[i], F32_TO_F16[i].out);
    }
    for (int i = N; i < N + M; i++)
        if (!is_nan_f16(all[i]) || !is_nan_f16(one[i]))
            PROBLEM("f32 NaN %08x -> f16 %04x / %04x (n=1), not a NaN", in[i], all[i], one[i]);

    enum { K = sizeof F16_TO_F32 / sizeof F16_TO_F32[0], L = sizeof F16_NANS / 2 };
    uint16_t hin[K + L];
    uint32_t fall[K + L], fone[K + L];
    for (int i = 0; i < K; i++) hin[i] = F16_TO_F32[i].in;
    for (int i = 0; i < L; i++) hin[K + i] = F16_NANS[i];
    convert_both_ways(hin, MOEX_F16, fall, fone, MOEX_F32, K + L);
    for (int i = 0; i < K; i++)
        if (fall[i] != F16_TO_F32[i].out || fone[i] != F16_TO_F32[i].out)
            PROBLEM("f16 %04x -> f32 %08x / %08x, want %08x", hin[i], fall[i], fone[i], F16_TO_F32[i].out);
    for (int i = K; i < K + L; i++)
        if (!is_nan32(fall[i]) || !is_nan32(fone[i])) PROBLEM("f16 NaN %04x -> f32 %08x, not a NaN", hin[i], fall[i]);
    end_problems();
}

/* f16 <-> bf16 directly, one rounding. */
static void test_convert_f16_bf16(void **state) {
    (void)state;
    enum { N = sizeof F16_TO_BF16 / sizeof F16_TO_BF16[0], M = sizeof BF16_TO_F16 / sizeof BF16_TO_F16[0] };
    uint16_t in[N], all[N], one[N];
    for (int i = 0; i < N; i++) in[i] = F16_TO_BF16[i].in;
    convert_both_ways(in, MOEX_F16, all, one, MOEX_BF16, N);
    for (int i = 0; i < N; i++)
        if (all[i] != F16_TO_BF16[i].out || one[i] != F16_TO_BF16[i].out)
            PROBLEM("f16 %04x -> bf16 %04x / %04x, want %04x", in[i], all[i], one[i], F16_TO_BF16[i].out);
    uint16_t bin[M], ball[M], bone[M];
    for (int i = 0; i < M; i++) bin[i] = BF16_TO_F16[i].in;
    convert_both_ways(bin, MOEX_BF16, ball, bone, MOEX_F16, M);
    for (int i = 0; i < M; i++)
        if (ball[i] != BF16_TO_F16[i].out || bone[i] != BF16_TO_F16[i].out)
            PROBLEM("bf16 %04x -> f16 %04x / %04x, want %04x", bin[i], ball[i], bone[i], BF16_TO_F16[i].out);
    uint16_t nan16 = 0x7E00, nanb = 0x7FC0, o16 = 0, ob = 0;
    assert_int_equal(moex_convert(&nan16, MOEX_F16, &ob, MOEX_BF16, 1), MOEX_OK);
    assert_true(is_nan_bf16(ob));
    assert_int_equal(moex_convert(&nanb, MOEX_BF16, &o16, MOEX_F16, 1), MOEX_OK);
    assert_true(is_nan_f16(o16));
    end_problems();
}

/* Many random values, against the reference codec (vector paths and tails). */
static void test_convert_random_bulk(void **state) {
    (void)state;
    enum { N = 4099 };
    uint32_t *in = malloc(N * 4);
    uint16_t *b = malloc(N * 2), *h = malloc(N * 2);
    ref_rng r;
    ref_rng_seed(&r, 2024);
    for (int i = 0; i < N; i++) {
        float f = (float)(ref_rng_normal(&r) * pow(2.0, (double)ref_rng_below(&r, 60) - 40));
        memcpy(&in[i], &f, 4);
        if (i % 7 == 0) in[i] = (uint32_t)ref_rng_next(&r);      /* any bits at all */
    }
    assert_int_equal(moex_convert(in, MOEX_F32, b, MOEX_BF16, N), MOEX_OK);
    assert_int_equal(moex_convert(in, MOEX_F32, h, MOEX_F16, N), MOEX_OK);
    for (int i = 0; i < N; i++) {
        float f;
        memcpy(&f, &in[i], 4);
        uint16_t wb = ref_float_to_bf16(f), wh = ref_float_to_f16(f);
        if (isnan(f)) {
            if (!is_nan_bf16(b[i]) || !is_nan_f16(h[i])) PROBLEM("NaN %08x not kept (i=%d)", in[i], i);
            continue;
        }
        if (b[i] != wb) PROBLEM("f32 %08x -> bf16 %04x, want %04x (i=%d)", in[i], b[i], wb, i);
        if (h[i] != wh) PROBLEM("f32 %08x -> f16 %04x, want %04x (i=%d)", in[i], h[i], wh, i);
    }
    free(in);
    free(b);
    free(h);
    end_problems();
}

/* In place (src == dst), same dtype copies, n == 0, bad dtypes and pointers. */
static void test_convert_edges(void **state) {
    (void)state;
    float f[5] = {1.0f, -2.5f, 3.25f, 0.0f, 65504.0f};
    float g[5];
    assert_int_equal(moex_convert(f, MOEX_F32, g, MOEX_F32, 5), MOEX_OK);
    assert_memory_equal(f, g, sizeof f);
    assert_int_equal(moex_convert(f, MOEX_F32, f, MOEX_F32, 5), MOEX_OK);
    assert_memory_equal(f, g, sizeof f);

    /* in place (src == dst is allowed): narrowing, then widening back; exact for these values */
    static const moex_dtype HALF[2] = {MOEX_BF16, MOEX_F16};
    for (int k = 0; k < 2; k++) {
        uint32_t buf[9];
        uint16_t want[9];
        float vals[9] = {1, 2, 3, -4, 0.5f, 0.25f, 1024, -0.125f, 7};
        for (int i = 0; i < 9; i++) want[i] = k ? ref_float_to_f16(vals[i]) : ref_float_to_bf16(vals[i]);
        memcpy(buf, vals, sizeof vals);
        assert_int_equal(moex_convert(buf, MOEX_F32, buf, HALF[k], 9), MOEX_OK);
        if (memcmp(buf, want, sizeof want) != 0)
            PROBLEM("in-place f32 -> %s (src == dst) gave wrong values", moex_dtype_name(HALF[k]));
        memcpy(buf, want, sizeof want);
        assert_int_equal(moex_convert(buf, HALF[k], buf, MOEX_F32, 9), MOEX_OK);
        if (memcmp(buf, vals, sizeof vals) != 0) {
            float got[9];
            memcpy(got, buf, sizeof got);
            PROBLEM("in-place %s -> f32 (src == dst) gave %g %g %g ... %g, want 1 2 3 ... 7",
                    moex_dtype_name(HALF[k]), got[0], got[1], got[2], got[8]);
        }
    }

    uint16_t out[4] = {0xAAAA, 0xAAAA, 0xAAAA, 0xAAAA};
    assert_int_equal(moex_convert(f, MOEX_F32, out, MOEX_BF16, 0), MOEX_OK);
    assert_int_equal(out[0], 0xAAAA);
    assert_int_equal(moex_convert(f, MOEX_F32, out, MOEX_I32, 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(*moex_last_error());
    assert_int_equal(moex_convert(f, MOEX_E4M3, out, MOEX_F32, 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_convert(f, (moex_dtype)42, out, MOEX_F32, 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_convert(NULL, MOEX_F32, out, MOEX_BF16, 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_convert(f, MOEX_F32, NULL, MOEX_BF16, 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(out[0], 0xAAAA);
    end_problems();
}

/* Source and destination at any byte offset (a 2-byte-aligned f32 buffer included): the same values as
 * aligned buffers, computed by the reference codecs; not a byte written outside the destination. */
static void test_convert_unaligned(void **state) {
    (void)state;
    enum { N = 37, PAD = 8 };
    static const moex_dtype DT[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
    _Alignas(16) unsigned char src_mem[N * 4 + 2 * PAD], dst_mem[N * 4 + 2 * PAD], want[N * 4], vals[N * 4];
    ref_rng r;
    ref_rng_seed(&r, 41);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            const size_t sa = ref_dtype_size(DT[a]), sb = ref_dtype_size(DT[b]);
            ref_fill_random(vals, DT[a], N, 100.0, &r);
            for (int i = 0; i < N; i++) ref_store(want, DT[b], i, ref_load(vals, DT[a], i));
            for (int so = 0; so < 4; so++)
                for (int dof = 0; dof < 4; dof++) {
                    memset(src_mem, 0x11, sizeof src_mem);
                    memset(dst_mem, 0x77, sizeof dst_mem);
                    memcpy(src_mem + PAD + so, vals, N * sa);
                    moex_status st = moex_convert(src_mem + PAD + so, DT[a], dst_mem + PAD + dof, DT[b], N);
                    if (st != MOEX_OK) {
                        PROBLEM("%s at +%d -> %s at +%d: %s", moex_dtype_name(DT[a]), so, moex_dtype_name(DT[b]), dof,
                                moex_last_error());
                        continue;
                    }
                    if (memcmp(dst_mem + PAD + dof, want, N * sb))
                        PROBLEM("%s at +%d -> %s at +%d: wrong values", moex_dtype_name(DT[a]), so, moex_dtype_name(DT[b]), dof);
                    for (size_t i = 0; i < sizeof dst_mem; i++)
                        if ((i < PAD + (size_t)dof || i >= PAD + dof + N * sb) && dst_mem[i] != 0x77) {
                            PROBLEM("%s -> %s at +%d: byte %zu outside the destination written", moex_dtype_name(DT[a]),
                                    moex_dtype_name(DT[b]), dof, i);
                            break;
                        }
                }
            /* in place at an address 2 mod 4 (src == dst) */
            if (a == b) continue;
            memset(dst_mem, 0x77, sizeof dst_mem);
            memcpy(dst_mem + PAD + 2, vals, N * sa);
            assert_int_equal(moex_convert(dst_mem + PAD + 2, DT[a], dst_mem + PAD + 2, DT[b], N), MOEX_OK);
            if (memcmp(dst_mem + PAD + 2, want, N * sb))
                PROBLEM("in place %s -> %s at +2: wrong values", moex_dtype_name(DT[a]), moex_dtype_name(DT[b]));
        }
    end_problems();
}

/* A count whose bytes do not fit in memory, and buffers that partly overlap (not the same pointer):
 * refused, naming the count or the overlap, nothing written. Overlapping same-dtype copies move. */
static void test_convert_hostile(void **state) {
    (void)state;
    _Alignas(16) unsigned char buf[64], copy[64];
    for (int i = 0; i < 64; i++) buf[i] = (unsigned char)(i * 7 + 1);
    memcpy(copy, buf, sizeof buf);
    const size_t huge = SIZE_MAX / 4 + 2; /* times 4 bytes wraps to 4 */
    char want[64];
    snprintf(want, sizeof want, "%zu", huge);
    assert_int_equal(moex_convert(buf, MOEX_F32, buf + 32, MOEX_F32, huge), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), want)) PROBLEM("n = %zu: message \"%s\" lacks it", huge, moex_last_error());
    assert_int_equal(moex_convert(buf, MOEX_F32, buf + 32, MOEX_BF16, SIZE_MAX), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_convert(buf, MOEX_BF16, buf + 32, MOEX_F32, SIZE_MAX / 2), MOEX_ERR_INVALID_ARGUMENT);
    /* 2^62 bf16 = 2^63 bytes: no wrap, but more than any object can hold (PTRDIFF_MAX) */
    assert_int_equal(moex_convert(buf, MOEX_BF16, buf + 32, MOEX_BF16, (size_t)1 << 62), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "4611686018427387904")) PROBLEM("n = 2^62: \"%s\"", moex_last_error());
    /* narrowing into the same buffer 4 bytes on: the output would overwrite inputs not read yet */
    assert_int_equal(moex_convert(buf, MOEX_F32, buf + 4, MOEX_BF16, 8), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "overlap")) PROBLEM("narrowing overlap: message \"%s\"", moex_last_error());
    /* widening from 4 bytes on into the start */
    assert_int_equal(moex_convert(buf + 4, MOEX_BF16, buf, MOEX_F32, 8), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "overlap")) PROBLEM("widening overlap: message \"%s\"", moex_last_error());
    assert_memory_equal(buf, copy, sizeof buf);
    /* just touching is not overlapping: 8 f32 -> 8 bf16 right after them */
    assert_int_equal(moex_convert(buf, MOEX_F32, buf + 32, MOEX_BF16, 8), MOEX_OK);
    for (int i = 0; i < 8; i++) {
        float f;
        uint16_t h;
        memcpy(&f, copy + 4 * i, 4);
        memcpy(&h, buf + 32 + 2 * i, 2);
        if (!isnan(f) && h != ref_float_to_bf16(f)) PROBLEM("touching: element %d is %04x, want %04x", i, h, ref_float_to_bf16(f));
    }
    /* same dtype, overlapping: a memmove */
    memcpy(buf, copy, sizeof buf);
    assert_int_equal(moex_convert(buf, MOEX_F16, buf + 2, MOEX_F16, 10), MOEX_OK);
    assert_memory_equal(buf + 2, copy, 20);
    end_problems();
}

/* moex_memcpy: a size that runs past the end of the address space is refused by value, without
 * computing the out-of-range pointer; overlapping host ranges are refused too. */
static void test_memcpy_hostile(void **state) {
    (void)state;
    const moex_device cpu = {MOEX_DEVICE_CPU, 0};
    unsigned char a[32], b[32];
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    assert_int_equal(moex_memcpy(b, cpu, a, cpu, SIZE_MAX), MOEX_ERR_INVALID_ARGUMENT);
    char want[32];
    snprintf(want, sizeof want, "%zu", (size_t)SIZE_MAX);
    if (!contains(moex_last_error(), want)) PROBLEM("SIZE_MAX bytes: message \"%s\" lacks the size", moex_last_error());
    assert_int_equal(moex_memcpy(b, cpu, a, cpu, SIZE_MAX - 16), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_memcpy(b, cpu, a, cpu, (size_t)1 << 63), MOEX_ERR_INVALID_ARGUMENT); /* > PTRDIFF_MAX */
    for (int i = 0; i < 32; i++) assert_int_equal(b[i], 2);
    assert_int_equal(moex_memcpy(a + 8, cpu, a, cpu, 16), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "overlap")) PROBLEM("overlap: message \"%s\"", moex_last_error());
    assert_int_equal(moex_memcpy(b, cpu, a, cpu, sizeof a), MOEX_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(moex_memcpy(a + 16, cpu, a, cpu, 16), MOEX_OK); /* adjacent */
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* tensor views                                                              */
/* ------------------------------------------------------------------------ */

/* moex_tensor_init must fail with INVALID_ARGUMENT and leave *t as it was */
static void expect_tensor_init_fails(void *data, moex_dtype dt, int ndim, const int64_t *shape,
                                     const char *what) {
    moex_tensor t, copy;
    memset(&t, 0x3C, sizeof t);
    memcpy(&copy, &t, sizeof t);
    moex_status st = moex_tensor_init(&t, data, dt, ndim, shape);
    if (st != MOEX_ERR_INVALID_ARGUMENT)
        PROBLEM("tensor_init %s: %s, want invalid argument", what, moex_status_str(st));
    if (!*moex_last_error()) PROBLEM("tensor_init %s: empty message", what);
    if (memcmp(&t, &copy, sizeof t) != 0) PROBLEM("tensor_init %s: *t written on failure", what);
}

static void test_tensor_init(void **state) {
    (void)state;
    float data[24];
    moex_tensor t;
    int64_t s3[3] = {2, 3, 4};
    assert_int_equal(moex_tensor_init(&t, data, MOEX_F32, 3, s3), MOEX_OK);
    assert_ptr_equal(t.data, data);
    assert_int_equal(t.dtype, MOEX_F32);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.shape[0], 2);
    assert_int_equal(t.shape[2], 4);
    assert_int_equal(t.strides[0], 12);
    assert_int_equal(t.strides[1], 4);
    assert_int_equal(t.strides[2], 1);
    assert_int_equal(t.device.kind, MOEX_DEVICE_CPU);
    int64_t s4[4] = {1, 2, 3, 4};
    assert_int_equal(moex_tensor_init(&t, data, MOEX_BF16, 4, s4), MOEX_OK);
    assert_int_equal(t.strides[0], 24);
    int64_t s0[2] = {0, 5};
    assert_int_equal(moex_tensor_init(&t, NULL, MOEX_F32, 2, s0), MOEX_OK);  /* empty: NULL ok */

    int64_t s5[5] = {1, 1, 1, 1, 1};
    expect_tensor_init_fails(data, MOEX_F32, 0, s3, "ndim 0");
    expect_tensor_init_fails(data, MOEX_F32, 5, s5, "ndim 5");
    expect_tensor_init_fails(data, MOEX_F32, -1, s3, "ndim -1");
    int64_t neg[2] = {3, -2};
    expect_tensor_init_fails(data, MOEX_F32, 2, neg, "dim -2");
    if (!contains(moex_last_error(), "-2")) PROBLEM("dim -2: message \"%s\" lacks -2", moex_last_error());
    expect_tensor_init_fails(data, (moex_dtype)42, 2, s3, "dtype 42");
    int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 30};
    expect_tensor_init_fails(data, MOEX_F32, 2, huge, "2^70 elements");
    int64_t huge2[2] = {INT64_MAX, 2};
    expect_tensor_init_fails(data, MOEX_F32, 2, huge2, "INT64_MAX x 2");
    int64_t bytes_only[1] = {(int64_t)1 << 62};        /* count fits, bytes do not */
    expect_tensor_init_fails(data, MOEX_F32, 1, bytes_only, "2^62 f32 (bytes overflow)");
    int64_t empty_huge[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40}; /* no elements, but the strides overflow */
    expect_tensor_init_fails(data, MOEX_F32, 3, empty_huge, "0 x 2^40 x 2^40 (strides overflow)");
    if (!contains(moex_last_error(), "[0, 1099511627776, 1099511627776]"))
        PROBLEM("0 x 2^40 x 2^40: message \"%s\" does not give the shape", moex_last_error());
    int64_t empty_ok[3] = {0, (int64_t)1 << 30, (int64_t)1 << 30}; /* strides 2^60 and 2^30: fine */
    assert_int_equal(moex_tensor_init(&t, NULL, MOEX_F32, 3, empty_ok), MOEX_OK);
    assert_int_equal(t.strides[0], (int64_t)1 << 60);
    expect_tensor_init_fails(NULL, MOEX_F32, 3, s3, "NULL data, 24 elements");
    expect_tensor_init_fails(data, MOEX_F32, 2, NULL, "NULL shape");
    assert_int_equal(moex_tensor_init(NULL, data, MOEX_F32, 3, s3), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

/* moex_check_disjoint against brute force: random matrix views (rows with gaps, equal or different row
 * strides, 1/2/4-byte elements, one row or many) and 3-d contiguous ones in one arena; it must report a
 * shared byte exactly when one exists. */
static void test_disjoint_exact(void **state) {
    (void)state;
    enum { ARENA = 512 };
    static const moex_dtype DT[3] = {MOEX_E4M3, MOEX_BF16, MOEX_F32};
    _Alignas(64) static unsigned char arena[ARENA];
    ref_rng r;
    ref_rng_seed(&r, 2024);
    int shared = 0, apart = 0;
    for (int it = 0; it < 20000; it++) {
        moex_tensor v[2];
        unsigned char mark[2][ARENA];
        for (int n = 0; n < 2; n++) {
            const moex_dtype dt = DT[ref_rng_below(&r, 3)];
            const int64_t esz = (int64_t)ref_dtype_size(dt) ? (int64_t)ref_dtype_size(dt) : 1;
            memset(&v[n], 0, sizeof v[n]);
            v[n].dtype = dt;
            memset(mark[n], 0, ARENA);
            if (ref_rng_below(&r, 5) == 0) { /* 3-d contiguous */
                v[n].ndim = 3;
                for (int i = 0; i < 3; i++) v[n].shape[i] = 1 + ref_rng_below(&r, 3);
                v[n].strides[2] = 1, v[n].strides[1] = v[n].shape[2], v[n].strides[0] = v[n].shape[1] * v[n].shape[2];
            } else {
                v[n].ndim = 2;
                v[n].shape[0] = 1 + ref_rng_below(&r, 6);
                v[n].shape[1] = 1 + ref_rng_below(&r, 5);
                v[n].strides[1] = 1;
                v[n].strides[0] = n == 1 && ref_rng_below(&r, 2) ? v[0].strides[0] * (int64_t)ref_dtype_size(v[0].dtype) / esz
                                                                   : v[n].shape[1] + ref_rng_below(&r, 7);
                if (v[n].strides[0] < v[n].shape[1]) v[n].strides[0] = v[n].shape[1];
            }
            int64_t extent = 0; /* elements from the first to past the last */
            if (v[n].ndim == 3) extent = v[n].shape[0] * v[n].shape[1] * v[n].shape[2];
            else extent = (v[n].shape[0] - 1) * v[n].strides[0] + v[n].shape[1];
            const int64_t room = (ARENA - extent * esz) / esz;
            const int64_t at = ref_rng_below(&r, room > 0 ? room : 1) * esz;
            v[n].data = arena + at;
            if (v[n].ndim == 3) {
                memset(mark[n] + at, 1, (size_t)(extent * esz));
            } else {
                for (int64_t i = 0; i < v[n].shape[0]; i++)
                    memset(mark[n] + at + i * v[n].strides[0] * esz, 1, (size_t)(v[n].shape[1] * esz));
            }
        }
        int want = 0;
        for (int i = 0; i < ARENA; i++) want |= mark[0][i] && mark[1][i];
        const moex_status st = moex_check_disjoint(&v[0], "a", &v[1], "b");
        if ((st != MOEX_OK) != want) {
            PROBLEM("case %d: a %s rows %lld x %lld stride %lld at +%td, b %s rows %lld x %lld stride %lld at +%td: "
                    "%s, brute force says %s", it, moex_dtype_name(v[0].dtype), (long long)v[0].shape[0],
                    (long long)v[0].shape[1], (long long)v[0].strides[0], (unsigned char *)v[0].data - arena,
                    moex_dtype_name(v[1].dtype), (long long)v[1].shape[0], (long long)v[1].shape[1],
                    (long long)v[1].strides[0], (unsigned char *)v[1].data - arena, st ? "shared" : "apart",
                    want ? "shared" : "apart");
            if (g_problems > 10) break;
        }
        shared += want;
        apart += !want;
    }
    if (shared < 1000 || apart < 1000) PROBLEM("weak sample: %d shared, %d apart", shared, apart);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* devices and contexts                                                      */
/* ------------------------------------------------------------------------ */

static void test_device_query_cpu(void **state) {
    (void)state;
    moex_device_info info;
    memset(&info, 0x55, sizeof info);
    moex_device cpu = {MOEX_DEVICE_CPU, 0};
    assert_int_equal(moex_device_query(cpu, &info), MOEX_OK);
    assert_int_equal(info.available, 1);
    assert_int_equal(info.device.kind, MOEX_DEVICE_CPU);
    assert_true(info.cpu_cores >= 1);
    assert_true(info.cpu_avx2 == 0 || info.cpu_avx2 == 1);
    assert_true(info.cuda_built == 0 || info.cuda_built == 1);
    assert_int_equal(info.cc_major, 0);
    assert_non_null(memchr(info.name, '\0', sizeof info.name));
    assert_true(info.name[0] != '\0');
    assert_non_null(memchr(info.reason, '\0', sizeof info.reason));

    assert_int_equal(moex_device_query(cpu, NULL), MOEX_ERR_INVALID_ARGUMENT);
    moex_device bad = {(moex_device_kind)42, 0};
    assert_int_equal(moex_device_query(bad, &info), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

/* cpu_avx2 (the AVX2 + FMA + F16C kernels) agrees with what the kernel of the OS lists in
 * /proc/cpuinfo (it clears avx2 where the OS does not save the YMM registers), and with GCC's
 * __builtin_cpu_supports where the test is built by GCC. */
static void test_cpu_feature_detection(void **state) {
    (void)state;
    moex_device_info info;
    moex_device cpu = {MOEX_DEVICE_CPU, 0};
    assert_int_equal(moex_device_query(cpu, &info), MOEX_OK);
#if defined(__x86_64__) || defined(__i386__)
#if defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    int gcc = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (info.cpu_avx2 != gcc) PROBLEM("cpu_avx2 = %d, __builtin_cpu_supports says %d", info.cpu_avx2, gcc);
#endif
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) skip();
    static char line[1 << 16];
    int found = 0, avx2 = 0, fma = 0, f16c = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        found = 1;
        for (char *tok = strtok(strchr(line, ':'), ": \t\n"); tok; tok = strtok(NULL, " \t\n")) {
            avx2 |= !strcmp(tok, "avx2");
            fma |= !strcmp(tok, "fma");
            f16c |= !strcmp(tok, "f16c");
        }
    }
    fclose(f);
    if (!found) skip();
    if (info.cpu_avx2 != (avx2 && fma && f16c))
        PROBLEM("cpu_avx2 = %d, but /proc/cpuinfo lists avx2 %d, fma %d, f16c %d", info.cpu_avx2, avx2, fma, f16c);
    assert_true(contains(info.name, info.cpu_avx2 ? "avx2 kernels" : "portable kernels"));
#else
    assert_int_equal(info.cpu_avx2, 0);
#endif
    end_problems();
}

/* The library's CPU sources (core, experts, cpu, model) compile with clang as well as with GCC (clang 14 knows no
 * __builtin_cpu_supports("f16c"), for one): syntax and semantic checks with clang-14 or clang, when
 * one is installed. */
static void test_sources_compile_with_clang(void **state) {
    (void)state;
    const char *cc = NULL;
    if (system("command -v clang-14 >/dev/null 2>&1") == 0) cc = "clang-14";
    else if (system("command -v clang >/dev/null 2>&1") == 0) cc = "clang";
    if (!cc) skip();
    char root[1024], cmd[16384];
    snprintf(root, sizeof root, "%s", MOEX_FIXTURES);
    char *end = strstr(root, "/tests/fixtures");
    assert_non_null(end);
    *end = 0;
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -D_GNU_SOURCE -DMOEX_HAVE_CUDA=0 -fsyntax-only -fopenmp -mavx2 -mfma -mf16c -Wall -Wextra "
             "-Wno-unused-parameter -I'%s/include' -I'%s/src' '%s'/src/core/*.c '%s'/src/linear/*.c '%s'/src/experts/*.c "
             "'%s'/src/backends/*.c '%s'/src/backends/cpu/*.c '%s'/src/decoder/*.c '%s'/src/model/*.c",
             cc, root, root, root, root, root, root, root, root, root);
    int rc = system(cmd);
    if (rc != 0) fail_msg("%s could not compile the sources (exit %d): %s", cc, rc, cmd);
}

/* CUDA: either usable (with a compute capability) or not, with a reason. */
static void test_device_query_cuda(void **state) {
    (void)state;
    static const int INDEX[3] = {0, 99, -1};
    for (int i = 0; i < 3; i++) {
        moex_device_info info;
        memset(&info, 0x55, sizeof info);
        moex_device dev = {MOEX_DEVICE_CUDA, INDEX[i]};
        assert_int_equal(moex_device_query(dev, &info), MOEX_OK);
        assert_int_equal(info.device.kind, MOEX_DEVICE_CUDA);
        assert_non_null(memchr(info.reason, '\0', sizeof info.reason));
        assert_non_null(memchr(info.name, '\0', sizeof info.name));
        if (!info.cuda_built) assert_int_equal(info.cuda_devices, 0);
        if (info.available) {
            assert_true(info.cuda_built);
            assert_true(info.cuda_devices > INDEX[i]);
            assert_true(info.cc_major >= 1);
        } else {
            assert_int_equal(info.available, 0);
            if (!info.reason[0]) PROBLEM("CUDA %d unavailable without a reason", INDEX[i]);
        }
        if (INDEX[i] != 0) assert_int_equal(info.available, 0);
    }
    end_problems();
}

static void test_context_defaults_and_create(void **state) {
    (void)state;
    moex_context_options o = moex_context_default_options();
    assert_int_equal(o.device.kind, MOEX_DEVICE_CPU);
    assert_int_equal(o.device.index, 0);
    assert_int_equal(o.num_threads, 0);
    assert_int_equal(o.max_tokens, 1024);
    assert_int_equal(o.stream_slot, 0);

    moex_context *ctx = NULL;
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_non_null(ctx);
    moex_context_options got;
    assert_int_equal(moex_context_get_options(ctx, &got), MOEX_OK);
    assert_true(got.num_threads >= 1);                /* resolved */
    assert_int_equal(got.max_tokens, 1024);
    assert_int_equal(got.device.kind, MOEX_DEVICE_CPU);
    void *p = NULL;
    size_t bytes = 12345;
    assert_int_equal(moex_context_workspace(ctx, &p, &bytes), MOEX_OK);
    assert_int_equal(bytes, moex_context_workspace_bytes(ctx));
    moex_context_free(ctx);

    o.num_threads = 3;
    o.max_tokens = 7;
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_int_equal(moex_context_get_options(ctx, &got), MOEX_OK);
    assert_int_equal(got.num_threads, 3);
    assert_int_equal(got.max_tokens, 7);
    assert_int_equal(moex_context_get_options(ctx, NULL), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_context_get_options(NULL, &got), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_context_workspace(NULL, &p, &bytes), MOEX_ERR_INVALID_ARGUMENT);
    moex_context_free(ctx);
    end_problems();
}

/* create must fail with a status != OK, a message containing need (if any), *out untouched */
static void expect_context_fails(const moex_context_options *o, const char *need, const char *what) {
    int dummy;
    moex_context *ctx = (moex_context *)&dummy;
    moex_status st = moex_context_create(o, &ctx);
    if (st == MOEX_OK) {
        moex_context_free(ctx);
        PROBLEM("context %s: created, want a failure", what);
        return;
    }
    if (ctx != (moex_context *)&dummy) PROBLEM("context %s: *out written on failure", what);
    const char *msg = moex_last_error();
    if (!msg[0]) PROBLEM("context %s: empty message", what);
    if (need && !contains(msg, need)) PROBLEM("context %s: message \"%s\" lacks \"%s\"", what, msg, need);
}

static void test_context_bad_options(void **state) {
    (void)state;
    moex_context_options o = moex_context_default_options();
    o.max_tokens = -1;
    expect_context_fails(&o, "max_tokens", "max_tokens -1");
    o = moex_context_default_options();
    o.num_threads = -2;
    expect_context_fails(&o, "num_threads", "num_threads -2");
    o = moex_context_default_options();
    o.device.kind = (moex_device_kind)9;
    expect_context_fails(&o, NULL, "device kind 9");
    o = moex_context_default_options();
    assert_int_equal(moex_context_create(&o, NULL), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

/* A CUDA context where CUDA is not usable fails with a message saying why. */
static void test_context_cuda_unavailable(void **state) {
    (void)state;
    moex_device dev = {MOEX_DEVICE_CUDA, 0};
    moex_device_info info;
    assert_int_equal(moex_device_query(dev, &info), MOEX_OK);
    if (info.available) {
        print_message("CUDA device 0 is usable here (%s); checking an absent ordinal instead\n", info.name);
        dev.index = 99;
    }
    moex_context_options o = moex_context_default_options();
    o.device = dev;
    int dummy;
    moex_context *ctx = (moex_context *)&dummy;
    moex_status st = moex_context_create(&o, &ctx);
    if (st == MOEX_OK) {
        moex_context_free(ctx);
        PROBLEM("a CUDA context on an unusable device was created");
        end_problems();
    }
    assert_ptr_equal(ctx, (moex_context *)&dummy);
    const char *msg = moex_last_error();
    if (!contains(msg, "cuda") && !contains(msg, "gpu"))
        PROBLEM("CUDA context failure: message \"%s\" mentions neither CUDA nor GPU", msg);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* defaults, names, NULL-safe frees                                          */
/* ------------------------------------------------------------------------ */

static void test_desc_defaults(void **state) {
    (void)state;
    moex_experts_desc d;
    memset(&d, 0x6B, sizeof d);
    assert_int_equal(moex_experts_desc_init(&d), MOEX_OK);
    assert_int_equal(d.num_experts, 0);
    assert_int_equal(d.hidden, 0);
    assert_int_equal(d.intermediate, 0);
    assert_int_equal(d.top_k, 0);
    assert_int_equal(d.gated, 1);
    assert_int_equal(d.interleaved, 0);
    assert_int_equal(d.transposed, 0);
    assert_int_equal(d.activation, MOEX_ACT_SILU);
    assert_true(d.alpha == 1.702f);
    assert_true(d.limit == 7.0f);
    const moex_tensor *ts[4] = {&d.gate_up, &d.down, &d.gate_up_bias, &d.down_bias};
    for (int i = 0; i < 4; i++) {
        assert_null(ts[i]->data);
        assert_int_equal(ts[i]->ndim, 0);
    }
    assert_int_equal(moex_experts_desc_init(NULL), MOEX_ERR_INVALID_ARGUMENT);
    /* the defaults alone (sizes zero) are not a layer */
    int dummy;
    moex_layer *layer = (moex_layer *)&dummy;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(layer, (moex_layer *)&dummy);
    end_problems();
}

static void test_activation_names(void **state) {
    (void)state;
    static const char *const N[MOEX_ACTIVATION_COUNT] = {"silu", "gelu", "gelu_tanh", "relu",
                                                         "gptoss_clamp", "swiglu_limit"};
    for (int i = 0; i < MOEX_ACTIVATION_COUNT; i++)
        assert_string_equal(moex_activation_name((moex_activation)i), N[i]);
    assert_non_null(moex_activation_name((moex_activation)42));
    end_problems();
}

static void test_free_null(void **state) {
    (void)state;
    moex_layer_free(NULL);
    moex_context_free(NULL);
    assert_null(moex_layer_desc(NULL));
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_str),
        cmocka_unit_test(test_last_error),
        cmocka_unit_test(test_backend_fail_message),
        cmocka_unit_test(test_null_arguments_named),
        cmocka_unit_test(test_dtype_size_name_parse),
        cmocka_unit_test(test_convert_f32_bf16),
        cmocka_unit_test(test_convert_f32_f16),
        cmocka_unit_test(test_convert_f16_bf16),
        cmocka_unit_test(test_convert_random_bulk),
        cmocka_unit_test(test_convert_edges),
        cmocka_unit_test(test_convert_unaligned),
        cmocka_unit_test(test_convert_hostile),
        cmocka_unit_test(test_memcpy_hostile),
        cmocka_unit_test(test_tensor_init),
        cmocka_unit_test(test_disjoint_exact),
        cmocka_unit_test(test_device_query_cpu),
        cmocka_unit_test(test_cpu_feature_detection),
        cmocka_unit_test(test_sources_compile_with_clang),
        cmocka_unit_test(test_device_query_cuda),
        cmocka_unit_test(test_context_defaults_and_create),
        cmocka_unit_test(test_context_bad_options),
        cmocka_unit_test(test_context_cuda_unavailable),
        cmocka_unit_test(test_desc_defaults),
        cmocka_unit_test(test_activation_names),
        cmocka_unit_test(test_free_null),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
