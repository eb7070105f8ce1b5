/*
 * test_router.c — moex_route against the float64 router reference.
 *
 *   - softmax top-k, sigmoid + bias grouped top-k (DeepSeek-V3), top-k then
 *     softmax (GPT-OSS): ids equal, weights within 1e-6 relative (f32
 *     weights; one rounding of the output dtype more for f16/bf16)
 *   - odd sizes (E=60 k=4; E=256 k=8 8 groups keep 4 with a bias; E=32 k=4)
 *   - ties go to the lower index
 *   - bad input: status, message, outputs untouched
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moex.h"
#include "reference.h"
#include "testutil.h"

static const char *const KIND_NAMES[3] = {"softmax_topk", "sigmoid_grouped_topk", "topk_softmax"};

/* dt -> short name */
static const char *dt_name(moex_dtype dt) {
    static const char *const N[] = {"f32", "f16", "bf16", "e4m3", "e2m1x2", "ue8m0", "i32", "i64"};
    return (unsigned)dt < 8 ? N[dt] : "?";
}

/* ------------------------------------------------------------------------ */
/* one routing case                                                          */
/* ------------------------------------------------------------------------ */

/* A router case: description parameters and the dtypes of its tensors. */
typedef struct rcase {
    moex_router_kind kind;
    int64_t T, E, k;
    int renormalize;
    int64_t n_group, topk_group;
    float scaling;
    int bias;                  /* grouped: a correction bias */
    moex_dtype logit_dt, id_dt, w_dt;
    uint64_t seed;
} rcase;

/* c -> a one-line description for failure messages */
static const char *describe(const rcase *c) {
    static char buf[256];
    snprintf(buf, sizeof buf,
             "%s T=%lld E=%lld k=%lld renorm=%d groups=%lld keep=%lld scaling=%g bias=%d "
             "logits=%s ids=%s weights=%s seed=%llu",
             KIND_NAMES[c->kind], (long long)c->T, (long long)c->E, (long long)c->k, c->renormalize,
             (long long)c->n_group, (long long)c->topk_group, (double)c->scaling, c->bias,
             dt_name(c->logit_dt), dt_name(c->id_dt), dt_name(c->w_dt), (unsigned long long)c->seed);
    return buf;
}

/* row: [E] of dt <- distinct logits in [-4, 4): a random permutation of a
 * grid with spacing 8/E, each jittered by less than half a step */
static void fill_logits_row(ref_rng *r, void *buf, moex_dtype dt, int64_t off, int64_t E) {
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)E);
    assert_non_null(perm);
    for (int64_t e = 0; e < E; e++) perm[e] = e;
    for (int64_t e = E - 1; e > 0; e--) {
        int64_t j = ref_rng_below(r, e + 1), t = perm[e];
        perm[e] = perm[j];
        perm[j] = t;
    }
    double step = 8.0 / (double)E;
    for (int64_t e = 0; e < E; e++)
        ref_store(buf, dt, off + e, -4.0 + ((double)perm[e] + 0.45 * ref_rng_uniform(r)) * step);
    free(perm);
}

/* The buffers of one case. */
typedef struct rbufs {
    void *logits, *ids, *weights;
    float *bias;
    moex_tensor tl, ti, tw, tb;
    moex_router_desc d;
} rbufs;

/* c -> *b: random logits (and bias), outputs pre-filled with 0xEE */
static void rbufs_init(rbufs *b, const rcase *c) {
    ref_rng r;
    ref_rng_seed(&r, c->seed);
    memset(b, 0, sizeof b[0]);
    b->logits = calloc((size_t)(c->T * c->E) + 1, 4);
    b->ids = malloc((size_t)(c->T * c->k) * 8 + 8);
    b->weights = malloc((size_t)(c->T * c->k) * 4 + 8);
    b->bias = calloc((size_t)c->E, sizeof(float));
    assert_non_null(b->logits);
    memset(b->ids, 0xEE, (size_t)(c->T * c->k) * 8 + 8);
    memset(b->weights, 0xEE, (size_t)(c->T * c->k) * 4 + 8);
    for (int64_t t = 0; t < c->T; t++) fill_logits_row(&r, b->logits, c->logit_dt, t * c->E, c->E);
    for (int64_t e = 0; e < c->E; e++) b->bias[e] = (float)((ref_rng_uniform(&r) - 0.5) * 0.2);
    b->tl = ref_tensor_2d(b->logits, c->logit_dt, c->T, c->E, c->E);
    b->ti = ref_tensor_2d(b->ids, c->id_dt, c->T, c->k, c->k);
    b->tw = ref_tensor_2d(b->weights, c->w_dt, c->T, c->k, c->k);
    b->tb = ref_tensor(b->bias, MOEX_F32, 1, &c->E);

    moex_router_desc *d = &b->d;
    assert_int_equal(moex_router_desc_init(d), MOEX_OK);
    d->kind = c->kind;
    d->num_experts = c->E;
    d->top_k = c->k;
    d->renormalize = c->renormalize;
    d->n_group = c->n_group ? c->n_group : 1;
    d->topk_group = c->topk_group ? c->topk_group : 1;
    d->scaling = c->scaling != 0.0f ? c->scaling : 1.0f;
    if (c->bias) d->correction_bias = b->tb;
}

static void rbufs_free(rbufs *b) {
    free(b->logits);
    free(b->ids);
    free(b->weights);
    free(b->bias);
}

/* dt -> tolerance relative to the weight, 1e-6 plus half an ulp of dt */
static double weight_tol(moex_dtype dt) {
    return dt == MOEX_F32 ? 1e-6 : dt == MOEX_F16 ? 1e-6 + 0x1p-11 : 1e-6 + 0x1p-8;
}

/* c -> route with moex and with the reference; ids equal, weights close */
static void run_route_case(const rcase *c) {
    rbufs b;
    rbufs_init(&b, c);
    int64_t *rid = calloc((size_t)(c->T * c->k) + 1, sizeof(int64_t));
    double *rw = calloc((size_t)(c->T * c->k) + 1, sizeof(double));
    ref_route(&b.d, &b.tl, rid, rw);

    moex_status st = moex_route(&b.d, &b.tl, &b.ti, &b.tw);
    if (st != MOEX_OK) {
        PROBLEM("moex_route: %s: %s [%s]", moex_status_str(st), moex_last_error(), describe(c));
        goto done;
    }
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t i = t * c->k + j;
            int64_t id = (int64_t)ref_load(b.ids, c->id_dt, i);
            double w = ref_load(b.weights, c->w_dt, i);
            if (id != rid[i]) {
                PROBLEM("ids[%lld,%lld] = %lld, reference %lld (weight %.9g vs %.9g) [%s]",
                         (long long)t, (long long)j, (long long)id, (long long)rid[i], w, rw[i],
                         describe(c));
                goto done;
            }
            if (!(fabs(w - rw[i]) <= weight_tol(c->w_dt) * fabs(rw[i]))) {
                PROBLEM("weights[%lld,%lld] = %.9g, reference %.9g (rel %.3g) [%s]", (long long)t,
                         (long long)j, w, rw[i], fabs(w - rw[i]) / fabs(rw[i]), describe(c));
                goto done;
            }
        }
    /* nothing written past [T, k] */
    size_t isz = ref_dtype_size(c->id_dt), wsz = ref_dtype_size(c->w_dt);
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(((unsigned char *)b.ids)[(size_t)(c->T * c->k) * isz + i], 0xEE);
        assert_int_equal(((unsigned char *)b.weights)[(size_t)(c->T * c->k) * wsz + i], 0xEE);
    }
done:
    free(rid);
    free(rw);
    rbufs_free(&b);
}

/* -> a case of kind with defaults: f32 logits and weights, i32 ids */
static rcase rcase_make(moex_router_kind kind, int64_t T, int64_t E, int64_t k, uint64_t seed) {
    rcase c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.T = T; c.E = E; c.k = k;
    c.n_group = 1; c.topk_group = 1;
    c.scaling = 1.0f;
    c.logit_dt = MOEX_F32; c.id_dt = MOEX_I32; c.w_dt = MOEX_F32;
    c.seed = seed;
    return c;
}

/* ------------------------------------------------------------------------ */
/* against the reference                                                     */
/* ------------------------------------------------------------------------ */

/* Softmax top-k: E=60 k=4 (Qwen1.5-MoE), E=8 k=2 (Mixtral), E=128 k=8; dtypes. */
static void test_softmax_topk(void **state) {
    (void)state;
    static const int64_t EK[][2] = {{60, 4}, {8, 2}, {128, 8}, {5, 5}, {1, 1}};
    static const moex_dtype LD[] = {MOEX_F32, MOEX_BF16, MOEX_F16};
    int n = 0;
    for (int s = 0; s < 5; s++)
        for (int renorm = 0; renorm < 2; renorm++)
            for (int l = 0; l < 3; l++, n++) {
                rcase c = rcase_make(MOEX_ROUTER_SOFTMAX_TOPK, 1 + 16 * (n % 3), EK[s][0], EK[s][1], 10u + n);
                c.renormalize = renorm;
                c.logit_dt = LD[l];
                c.id_dt = (n & 1) ? MOEX_I64 : MOEX_I32;
                c.w_dt = LD[(l + n) % 3];
                run_route_case(&c);
            }
    end_problems();
}

/* Sigmoid grouped top-k: DeepSeek-V3's E=256 k=8 in 8 groups keeping 4, with a
 * bias and scaling 2.5; and smaller ones (no grouping, one expert per group). */
static void test_sigmoid_grouped(void **state) {
    (void)state;
    static const struct { int64_t E, k, ng, kg; int bias, renorm; float scaling; } G[] = {
        {256, 8, 8, 4, 1, 1, 2.5f},
        {256, 8, 8, 4, 0, 0, 1.0f},
        {64, 6, 8, 3, 1, 0, 1.0f},
        {60, 4, 1, 1, 1, 1, 1.0f},     /* no grouping */
        {8, 2, 8, 3, 1, 1, 1.5f},      /* one expert per group */
        {16, 4, 4, 4, 0, 1, 1.0f},     /* every group kept */
        {12, 3, 3, 1, 1, 1, 1.0f},     /* one group kept, k within it */
    };
    for (size_t i = 0; i < sizeof G / sizeof G[0]; i++)
        for (int dt = 0; dt < 2; dt++) {
            rcase c = rcase_make(MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 13 + 20 * (int64_t)dt, G[i].E, G[i].k,
                                 100u + i * 2 + (uint64_t)dt);
            c.n_group = G[i].ng;
            c.topk_group = G[i].kg;
            c.bias = G[i].bias;
            c.renormalize = G[i].renorm;
            c.scaling = G[i].scaling;
            c.logit_dt = dt ? MOEX_BF16 : MOEX_F32;
            c.id_dt = dt ? MOEX_I64 : MOEX_I32;
            run_route_case(&c);
        }
    end_problems();
}

/* GPT-OSS: top-k on the logits, softmax over the k. */
static void test_topk_softmax(void **state) {
    (void)state;
    static const int64_t EK[][2] = {{32, 4}, {128, 4}, {7, 3}, {3, 1}};
    for (int s = 0; s < 4; s++)
        for (int dt = 0; dt < 3; dt++) {
            rcase c = rcase_make(MOEX_ROUTER_TOPK_SOFTMAX, 9 + 8 * dt, EK[s][0], EK[s][1], 200u + (uint64_t)(s * 3 + dt));
            c.logit_dt = dt == 0 ? MOEX_F32 : dt == 1 ? MOEX_F16 : MOEX_BF16;
            c.w_dt = dt == 2 ? MOEX_BF16 : MOEX_F32;
            c.id_dt = (dt & 1) ? MOEX_I64 : MOEX_I32;
            c.renormalize = s & 1;              /* irrelevant: the k weights sum to 1 */
            run_route_case(&c);
        }
    end_problems();
}

/* T == 0 is valid and writes nothing. */
static void test_route_t0(void **state) {
    (void)state;
    for (int kind = 0; kind < 3; kind++) {
        rcase c = rcase_make((moex_router_kind)kind, 0, 8, 2, 1);
        rbufs b;
        rbufs_init(&b, &c);
        if (kind == 1) { b.d.n_group = 4; b.d.topk_group = 2; }
        assert_int_equal(moex_route(&b.d, &b.tl, &b.ti, &b.tw), MOEX_OK);
        for (int i = 0; i < 8; i++) {
            assert_int_equal(((unsigned char *)b.ids)[i], 0xEE);
            assert_int_equal(((unsigned char *)b.weights)[i], 0xEE);
        }
        rbufs_free(&b);
    }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* ties                                                                      */
/* ------------------------------------------------------------------------ */

/* Route one f32 row of logits; -> ids [k] (i64) and weights [k] (f32). */
static void route_row(const moex_router_desc *d, const float *row, int64_t *ids, float *w) {
    int64_t shape[2] = {1, d->num_experts}, kshape[2] = {1, d->top_k};
    moex_tensor tl = ref_tensor((void *)row, MOEX_F32, 2, shape);
    moex_tensor ti = ref_tensor(ids, MOEX_I64, 2, kshape);
    moex_tensor tw = ref_tensor(w, MOEX_F32, 2, kshape);
    moex_status st = moex_route(d, &tl, &ti, &tw);
    if (st != MOEX_OK) {
        PROBLEM("moex_route: %s: %s", moex_status_str(st), moex_last_error());
        memset(ids, 0xFF, sizeof(int64_t) * (size_t)d->top_k);
    }
}

/* ids [k] must equal want [k] */
static void expect_ids(const int64_t *ids, const int64_t *want, int64_t k, const char *what) {
    for (int64_t j = 0; j < k; j++)
        if (ids[j] != want[j]) {
            PROBLEM("%s: ids[%lld] = %lld, want %lld", what, (long long)j, (long long)ids[j],
                     (long long)want[j]);
            return;
        }
}

/* Equal scores: the lower expert index first, for every kind. */
static void test_ties_lower_index(void **state) {
    (void)state;
    static const float FLAT[6] = {0, 0, 0, 0, 0, 0};
    static const float SOME[6] = {1, 3, 3, 2, 3, 0};
    moex_router_desc d;
    int64_t ids[6];
    float w[6];
    for (int kind = 0; kind < 3; kind++) {
        assert_int_equal(moex_router_desc_init(&d), MOEX_OK);
        d.kind = (moex_router_kind)kind;
        d.num_experts = 6;
        d.top_k = 3;
        route_row(&d, FLAT, ids, w);
        expect_ids(ids, (const int64_t[]){0, 1, 2}, 3, KIND_NAMES[kind]);
        d.top_k = 4;
        route_row(&d, SOME, ids, w);
        expect_ids(ids, (const int64_t[]){1, 2, 4, 3}, 4, KIND_NAMES[kind]);
        if (kind == MOEX_ROUTER_TOPK_SOFTMAX || kind == MOEX_ROUTER_SOFTMAX_TOPK) {
            /* equal logits get equal weights */
            assert_true(w[0] == w[1] && w[1] == w[2]);
        }
    }
    /* grouped: two groups tie on their score; the lower group is kept */
    assert_int_equal(moex_router_desc_init(&d), MOEX_OK);
    d.kind = MOEX_ROUTER_SIGMOID_GROUPED_TOPK;
    d.num_experts = 8;
    d.top_k = 2;
    d.n_group = 4;
    d.topk_group = 1;
    static const float GT[8] = {0, 0, 1, 2, 0, 0, 2, 1};   /* groups 1 and 3 tie */
    route_row(&d, GT, ids, w);
    expect_ids(ids, (const int64_t[]){3, 2}, 2, "grouped tie between groups 1 and 3");
    d.top_k = 4;
    d.topk_group = 2;
    route_row(&d, GT, ids, w);
    expect_ids(ids, (const int64_t[]){3, 6, 2, 7}, 4, "grouped, groups 1 and 3 kept");
    route_row(&d, (const float[8]){0, 0, 0, 0, 0, 0, 0, 0}, ids, w);
    expect_ids(ids, (const int64_t[]){0, 1, 2, 3}, 4, "grouped, all equal");
    end_problems();
}

/* The reference agrees with itself on the hand-made tie rows (sanity). */
static void test_reference_ties(void **state) {
    (void)state;
    static const float SOME[6] = {1, 3, 3, 2, 3, 0};
    moex_router_desc d;
    assert_int_equal(moex_router_desc_init(&d), MOEX_OK);
    d.num_experts = 6;
    d.top_k = 4;
    int64_t shape[2] = {1, 6};
    moex_tensor tl = ref_tensor((void *)SOME, MOEX_F32, 2, shape);
    int64_t ids[4];
    double w[4];
    ref_route(&d, &tl, ids, w);
    expect_ids(ids, (const int64_t[]){1, 2, 4, 3}, 4, "reference");
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* bad input                                                                 */
/* ------------------------------------------------------------------------ */

/* moex_route(d, l, i, w) must fail with want; message contains need1 or
 * need2; the ids and weights buffers of b are untouched. */
static void expect_route_fails(rbufs *b, const moex_router_desc *d, const moex_tensor *l,
                               moex_tensor *i, moex_tensor *w, moex_status want, const char *need1,
                               const char *need2, const char *what, size_t ids_bytes,
                               size_t w_bytes) {
    unsigned char *ci = malloc(ids_bytes), *cw = malloc(w_bytes);
    memcpy(ci, b->ids, ids_bytes);
    memcpy(cw, b->weights, w_bytes);
    moex_status st = moex_route(d, l, i, w);
    const char *msg = moex_last_error();
    if (st != want)
        PROBLEM("%s: status %d (%s), want %d (%s); message \"%s\"", what, st, moex_status_str(st), want,
                 moex_status_str(want), msg);
    if (!msg || !*msg) PROBLEM("%s: empty moex_last_error()", what);
    if ((need1 || need2) && !contains(msg, need1) && !contains(msg, need2))
        PROBLEM("%s: message \"%s\" does not name %s", what, msg, needs_text(need1, need2));
    if (memcmp(ci, b->ids, ids_bytes) || memcmp(cw, b->weights, w_bytes))
        PROBLEM("%s: outputs written on failure", what);
    free(ci);
    free(cw);
}

static void test_bad_router_desc(void **state) {
    (void)state;
    rcase c = rcase_make(MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 4, 12, 3, 7);
    c.n_group = 4;
    c.topk_group = 2;
    rbufs b;
    rbufs_init(&b, &c);
    size_t ib = 4 * 3 * 8 + 8, wb = 4 * 3 * 4 + 8;
    assert_int_equal(moex_route(&b.d, &b.tl, &b.ti, &b.tw), MOEX_OK);    /* the valid case */
    memset(b.ids, 0xEE, ib);
    memset(b.weights, 0xEE, wb);

    moex_router_desc d = b.d;
    d.top_k = 13;                                   /* k > E */
    moex_tensor ti = ref_tensor_2d(b.ids, MOEX_I32, 4, 13, 13);
    moex_tensor tw = ref_tensor_2d(b.weights, MOEX_F32, 4, 13, 13);
    unsigned char *bigi = calloc(1, 4096), *bigw = calloc(1, 4096);
    ti.data = bigi;
    tw.data = bigw;
    expect_route_fails(&b, &d, &b.tl, &ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "top_k", "13", "k=13 > E=12", ib, wb);
    d = b.d;
    d.top_k = 0;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "top_k", NULL, "k=0", ib, wb);
    d = b.d;
    d.n_group = 5;                                  /* 12 % 5 != 0 */
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "n_group", "5", "n_group 5 of E=12", ib, wb);
    d = b.d;
    d.n_group = 0;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "n_group", NULL, "n_group 0", ib, wb);
    d = b.d;
    d.topk_group = 6;                               /* > n_group = 4 */
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "topk_group", "6", "topk_group 6 > 4", ib, wb);
    d = b.d;
    d.topk_group = 0;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "topk_group", NULL, "topk_group 0", ib, wb);
    d = b.d;
    d.topk_group = 1;                               /* one kept group holds 3 experts: k=4 cannot be met */
    d.top_k = 4;
    ti = ref_tensor_2d(bigi, MOEX_I32, 4, 4, 4);
    tw = ref_tensor_2d(bigw, MOEX_F32, 4, 4, 4);
    expect_route_fails(&b, &d, &b.tl, &ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "top_k", "topk_group",
                       "k=4 > 1 kept group x 3 experts", ib, wb);
    d = b.d;
    d.num_experts = -3;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "-3", "num_experts", "E=-3", ib, wb);
    d = b.d;
    d.kind = (moex_router_kind)7;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "kind", "7", "kind 7", ib, wb);
    d = b.d;
    int64_t e13 = 13;
    d.correction_bias = ref_tensor(bigw, MOEX_F32, 1, &e13);
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "bias", NULL, "bias [13]", ib, wb);
    d.correction_bias = ref_tensor(bigw, MOEX_BF16, 1, &c.E);
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "bias", "bf16", "bias bf16", ib, wb);
    free(bigi);
    free(bigw);
    rbufs_free(&b);
    end_problems();
}

/* The grouped router's scaling must be a finite factor > 0 (NaN, infinities, negative and zero
 * are refused by name and value, nothing written); a softmax router ignores it, as it ignores
 * n_group. renormalize is 0 or 1; the correction bias is finite and in cpu memory. */
static void test_bad_router_values(void **state) {
    (void)state;
    rcase c = rcase_make(MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 4, 12, 3, 9);
    c.n_group = 4;
    c.topk_group = 2;
    c.bias = 1;
    c.renormalize = 1;
    rbufs b;
    rbufs_init(&b, &c);
    size_t ib = 4 * 3 * 8 + 8, wb = 4 * 3 * 4 + 8;
    static const struct { float v; const char *text; } BAD[] = {
        {NAN, "scaling = nan"}, {INFINITY, "scaling = inf"}, {-INFINITY, "scaling = -inf"},
        {-2.5f, "scaling = -2.5"}, {0.0f, "scaling = 0"}, {-0.0f, "scaling = -0"}};
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        moex_router_desc d = b.d;
        d.scaling = BAD[i].v;
        expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, BAD[i].text, NULL, BAD[i].text, ib, wb);
        d.kind = MOEX_ROUTER_SOFTMAX_TOPK; /* ignored there */
        if (moex_route(&d, &b.tl, &b.ti, &b.tw) != MOEX_OK) PROBLEM("softmax with %s: %s", BAD[i].text, moex_last_error());
        memset(b.ids, 0xEE, ib);
        memset(b.weights, 0xEE, wb);
    }
    /* a valid factor scales the weights: against the reference */
    c.scaling = 2.5f;
    rbufs_free(&b);
    run_route_case(&c);
    rbufs_init(&b, &c);
    moex_router_desc d = b.d;
    d.renormalize = 2;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "renormalize = 2", NULL, "renormalize 2", ib, wb);
    d.renormalize = -1;
    d.kind = MOEX_ROUTER_SOFTMAX_TOPK;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "renormalize = -1", NULL, "renormalize -1", ib, wb);
    d = b.d;
    b.bias[5] = NAN;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "correction_bias[5] = nan", NULL, "bias NaN", ib, wb);
    b.bias[5] = -INFINITY;
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "correction_bias[5] = -inf", NULL, "bias -inf", ib, wb);
    b.bias[5] = 0.0f;
    d.correction_bias.device.kind = MOEX_DEVICE_CUDA; /* never read on the host */
    d.correction_bias.data = (void *)(uintptr_t)0x10; /* a device address: reading it would crash */
    expect_route_fails(&b, &d, &b.tl, &b.ti, &b.tw, MOEX_ERR_UNSUPPORTED, "correction_bias", NULL, "bias on cuda", ib, wb);
    rbufs_free(&b);
    end_problems();
}

static void test_bad_router_tensors(void **state) {
    (void)state;
    rcase c = rcase_make(MOEX_ROUTER_SOFTMAX_TOPK, 4, 12, 3, 8);
    rbufs b;
    rbufs_init(&b, &c);
    size_t ib = 4 * 3 * 8 + 8, wb = 4 * 3 * 4 + 8;
    unsigned char *big = calloc(1, 4096);
    moex_tensor t;

    expect_route_fails(&b, NULL, &b.tl, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "desc", NULL, "NULL desc", ib, wb);
    expect_route_fails(&b, &b.d, NULL, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "logits", NULL, "NULL logits", ib, wb);
    expect_route_fails(&b, &b.d, &b.tl, NULL, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "ids", NULL, "NULL ids", ib, wb);
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, NULL, MOEX_ERR_INVALID_ARGUMENT, "weights", NULL, "NULL weights", ib, wb);
    t = ref_tensor_2d(big, MOEX_F32, 4, 13, 13);
    expect_route_fails(&b, &b.d, &t, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "logits", "13", "logits [T, E+1]", ib, wb);
    t = ref_tensor_2d(big, MOEX_I64, 4, 12, 12);
    expect_route_fails(&b, &b.d, &t, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "logits", "i64", "logits i64", ib, wb);
    t = b.tl;
    t.strides[1] = 2;
    t.data = big;
    expect_route_fails(&b, &b.d, &t, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "logits", "stride", "logits inner stride 2", ib, wb);
    t = ref_tensor_2d(b.ids, MOEX_I32, 4, 4, 4);
    expect_route_fails(&b, &b.d, &b.tl, &t, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "ids", NULL, "ids [T, k+1]", ib, wb);
    t = ref_tensor_2d(b.ids, MOEX_I32, 3, 3, 3);
    expect_route_fails(&b, &b.d, &b.tl, &t, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "ids", NULL, "ids [T-1, k]", ib, wb);
    t = ref_tensor_2d(b.ids, MOEX_F32, 4, 3, 3);
    expect_route_fails(&b, &b.d, &b.tl, &t, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "ids", "f32", "ids f32", ib, wb);
    t = ref_tensor_2d(b.weights, MOEX_F32, 5, 3, 3);
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, &t, MOEX_ERR_INVALID_ARGUMENT, "weights", NULL, "weights [T+1, k]", ib, wb);
    t = ref_tensor_2d(b.weights, MOEX_I32, 4, 3, 3);
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, &t, MOEX_ERR_INVALID_ARGUMENT, "weights", "i32", "weights i32", ib, wb);
    t = b.tl;
    t.data = NULL;
    expect_route_fails(&b, &b.d, &t, &b.ti, &b.tw, MOEX_ERR_INVALID_ARGUMENT, "logits", NULL, "logits data NULL", ib, wb);
    free(big);
    rbufs_free(&b);
    end_problems();
}

/* Outputs that share memory with the logits or with each other, a logits shape whose element
 * count overflows, and outputs not aligned to their elements: refused, naming them, nothing written. */
static void test_bad_router_memory(void **state) {
    (void)state;
    rcase c = rcase_make(MOEX_ROUTER_SOFTMAX_TOPK, 4, 12, 3, 10);
    rbufs b;
    rbufs_init(&b, &c);
    size_t ib = 4 * 3 * 8 + 8, wb = 4 * 3 * 4 + 8;
    /* ids written into the logits of the later tokens */
    float *logits = b.logits;
    unsigned char *lcopy = malloc(4 * 12 * 4);
    memcpy(lcopy, logits, 4 * 12 * 4);
    moex_tensor ti = ref_tensor_2d(logits + 12, MOEX_I32, 4, 3, 3);
    moex_status st = moex_route(&b.d, &b.tl, &ti, &b.tw);
    if (st != MOEX_ERR_INVALID_ARGUMENT || !contains(moex_last_error(), "ids [4, 3]") ||
        !contains(moex_last_error(), "logits [4, 12]"))
        PROBLEM("ids inside logits: %s \"%s\"", moex_status_str(st), moex_last_error());
    if (memcmp(lcopy, logits, 4 * 12 * 4)) PROBLEM("ids inside logits: the logits were written");
    moex_tensor tw = ref_tensor_2d(logits + 36, MOEX_F32, 4, 3, 3); /* the weights over the last logits */
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "weights [4, 3]", NULL,
                       "weights inside logits", ib, wb);
    tw = ref_tensor_2d((char *)b.ids + 8, MOEX_F32, 4, 3, 3); /* weights over the ids */
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "ids [4, 3]", NULL,
                       "weights inside ids", ib, wb);
    if (!contains(moex_last_error(), "weights [4, 3]")) PROBLEM("weights inside ids: \"%s\"", moex_last_error());
    if (memcmp(lcopy, logits, 4 * 12 * 4)) PROBLEM("the logits were written");
    /* a logits shape of 2^62 x 12 */
    moex_tensor tl = ref_tensor_2d(logits, MOEX_F32, (int64_t)1 << 62, 12, 12);
    ti = ref_tensor_2d(b.ids, MOEX_I32, (int64_t)1 << 62, 3, 3);
    tw = ref_tensor_2d(b.weights, MOEX_F32, (int64_t)1 << 62, 3, 3);
    expect_route_fails(&b, &b.d, &tl, &ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "logits has shape [4611686018427387904, 12]",
                       NULL, "logits 2^62 x 12", ib, wb);
    /* weights (f32) at an address 2 mod 4 */
    tw = ref_tensor_2d((char *)b.weights + 2, MOEX_F32, 4, 3, 3);
    expect_route_fails(&b, &b.d, &b.tl, &b.ti, &tw, MOEX_ERR_INVALID_ARGUMENT, "weights: data at", NULL,
                       "weights at 2 mod 4", ib, wb);
    if (!contains(moex_last_error(), "aligned")) PROBLEM("weights at 2 mod 4: \"%s\"", moex_last_error());
    free(lcopy);
    rbufs_free(&b);
    end_problems();
}

/* moex_router_desc_init: the documented defaults. */
static void test_router_desc_defaults(void **state) {
    (void)state;
    moex_router_desc d;
    memset(&d, 0x6B, sizeof d);
    assert_int_equal(moex_router_desc_init(&d), MOEX_OK);
    assert_int_equal(d.kind, MOEX_ROUTER_SOFTMAX_TOPK);
    assert_int_equal(d.renormalize, 0);
    assert_int_equal(d.n_group, 1);
    assert_int_equal(d.topk_group, 1);
    assert_true(d.scaling == 1.0f);
    assert_null(d.correction_bias.data);
    assert_int_equal(d.correction_bias.ndim, 0);
    assert_int_equal(moex_router_desc_init(NULL), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_desc_defaults),
        cmocka_unit_test(test_reference_ties),
        cmocka_unit_test(test_softmax_topk),
        cmocka_unit_test(test_sigmoid_grouped),
        cmocka_unit_test(test_topk_softmax),
        cmocka_unit_test(test_route_t0),
        cmocka_unit_test(test_ties_lower_index),
        cmocka_unit_test(test_bad_router_desc),
        cmocka_unit_test(test_bad_router_tensors),
        cmocka_unit_test(test_bad_router_values),
        cmocka_unit_test(test_bad_router_memory),
    };
    return cmocka_run_group_tests_name("router", tests, NULL, NULL);
}
