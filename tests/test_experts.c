/*
 * test_experts.c — every CPU experts backend against the float64 reference.
 *
 *   - the full small-size product (T x E x k x H x I x dtype x backend), each
 *     size seeing another layout/activation pair, every pair at least once
 *   - every layout x activation x backend at one small size
 *   - about ten larger, odd and aligned sizes
 *   - sentinels, guard regions, T == 0, thread determinism, concurrent
 *     forwards on one layer, row strides, routing weights in f16/bf16
 *   - bad input: status, message, output untouched
 *
 * NMSE bounds (SPEC "Numerical agreement"): f32 1e-10, f16 1e-6, bf16 1e-4,
 * measured on the output as returned (rounded to the activation dtype).
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

#include "moex.h"
#include "layouts.h"
#include "reference.h"
#include "testutil.h"
#include "backend_list.h"

/* ------------------------------------------------------------------------ */
/* tables                                                                    */
/* ------------------------------------------------------------------------ */

/* The backends run: every registered one whose supports() takes the CPU (backend_list.h), found
 * in main(); a case skips those that refuse its layer. */
static const char *CPU_BACKENDS[BACKEND_LIST_MAX];
static int N_BACKENDS;
static const moex_device CPU_DEVICE = {MOEX_DEVICE_CPU, 0};

/* ------------------------------------------------------------------------ */
/* one test case                                                             */
/* ------------------------------------------------------------------------ */

/* Everything that defines one forward comparison. */
typedef struct xcase {
    int64_t T, E, k, H, I;
    moex_dtype dt;          /* weights, hidden and out */
    int layout;             /* index into LAYOUTS */
    moex_activation act;
    moex_dtype id_dt;       /* i32 / i64 */
    moex_dtype w_dt;        /* routing weights */
    double sentinel_prob;   /* chance that an id becomes -1 or E */
    int64_t x_stride;       /* hidden row stride (0: H) */
    int64_t out_stride;     /* out row stride (0: H) */
    float limit;            /* clamped activations */
    uint64_t seed;
} xcase;

/* c, backend -> a one-line description for failure messages */
static const char *describe(const xcase *c, const char *backend) {
    static char buf[320];
    snprintf(buf, sizeof buf,
             "backend=%s T=%lld E=%lld k=%lld H=%lld I=%lld dtype=%s layout=%s act=%s ids=%s "
             "w=%s sentinels=%.2f x_stride=%lld out_stride=%lld limit=%g seed=%llu",
             backend ? backend : "-", (long long)c->T, (long long)c->E, (long long)c->k,
             (long long)c->H, (long long)c->I, dt_name(c->dt), LAYOUTS[c->layout].name,
             ACT_NAMES[c->act], dt_name(c->id_dt), dt_name(c->w_dt), c->sentinel_prob,
             (long long)c->x_stride, (long long)c->out_stride, (double)c->limit,
             (unsigned long long)c->seed);
    return buf;
}

/* A default case: f32, concatenated silu, i32 ids, f32 weights, no sentinels. */
static xcase xcase_make(int64_t T, int64_t E, int64_t k, int64_t H, int64_t I, moex_dtype dt,
                        uint64_t seed) {
    xcase c;
    memset(&c, 0, sizeof c);
    c.T = T; c.E = E; c.k = k; c.H = H; c.I = I;
    c.dt = dt;
    c.layout = 0;
    c.act = MOEX_ACT_SILU;
    c.id_dt = MOEX_I32;
    c.w_dt = MOEX_F32;
    c.limit = 7.0f;
    c.seed = seed;
    return c;
}

/* A case made ready: random layer, inputs and the float64 reference. */
typedef struct xrun {
    xcase c;
    int64_t xs, os;        /* resolved row strides */
    ref_layer L;
    void *hidden;          /* [T, xs] of dt */
    void *ids;             /* [T, k] of id_dt */
    void *weights;         /* [T, k] of w_dt */
    moex_tensor th, tids, tw;
    double *ref;           /* [T, H] */
} xrun;

/* c -> *r: layer, inputs, routing and reference */
static void xrun_setup(xrun *r, const xcase *c) {
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->xs = c->x_stride ? c->x_stride : c->H;
    r->os = c->out_stride ? c->out_stride : c->H;
    const layout *lay = &LAYOUTS[c->layout];
    ref_layer_spec s = {c->E, c->H, c->I, c->k, lay->gated, lay->interleaved, lay->transposed,
                        lay->bias, c->act, 1.702f, c->limit, c->dt};
    ref_layer_build(&r->L, &s, c->seed);

    ref_rng rng;
    ref_rng_seed(&rng, c->seed ^ 0xABCDEFull);
    size_t xbytes = (size_t)(c->T * r->xs) * ref_dtype_size(c->dt);
    r->hidden = calloc(xbytes + 1, 1);
    r->ids = calloc((size_t)(c->T * c->k) * 8 + 1, 1);
    r->weights = calloc((size_t)(c->T * c->k) * 4 + 1, 1);
    r->ref = calloc((size_t)(c->T * c->H) + 1, sizeof(double));
    assert_non_null(r->hidden);
    assert_non_null(r->ref);
    for (int64_t t = 0; t < c->T; t++)
        ref_fill_random((char *)r->hidden + (size_t)(t * r->xs) * ref_dtype_size(c->dt), c->dt,
                        c->H, 1.0, &rng);
    ref_random_routing(&rng, c->T, c->E, c->k, c->id_dt, r->ids, c->w_dt, r->weights,
                       c->sentinel_prob);
    r->th = ref_tensor_2d(r->hidden, c->dt, c->T, c->H, r->xs);
    r->tids = ref_tensor_2d(r->ids, c->id_dt, c->T, c->k, c->k);
    r->tw = ref_tensor_2d(r->weights, c->w_dt, c->T, c->k, c->k);
    ref_experts_forward(&r->L.desc, &r->th, &r->tids, &r->tw, r->ref);
}

static void xrun_teardown(xrun *r) {
    ref_layer_destroy(&r->L);
    free(r->hidden);
    free(r->ids);
    free(r->weights);
    free(r->ref);
}

/* ------------------------------------------------------------------------ */
/* output buffers with a guard region                                        */
/* ------------------------------------------------------------------------ */

#define GUARD_BYTES 64
#define GUARD_BYTE 0xA5
#define BODY_BYTE 0xFF   /* NaN in f32/f16/bf16: rows left unwritten show up */

/* An output [T, H] with row stride os, followed by GUARD_BYTES of GUARD_BYTE.
 * Row gaps (os > H) are also GUARD_BYTE; the rows themselves BODY_BYTE. */
typedef struct outbuf {
    unsigned char *mem;
    size_t body;           /* bytes of [T, os] */
    int64_t T, H, os;
    size_t esize;
    moex_tensor t;
} outbuf;

/* -> *o for [T, H] of dt with row stride os */
static void outbuf_init(outbuf *o, int64_t T, int64_t H, int64_t os, moex_dtype dt) {
    o->T = T; o->H = H; o->os = os;
    o->esize = ref_dtype_size(dt);
    o->body = (size_t)(T * os) * o->esize;
    o->mem = malloc(o->body + GUARD_BYTES);
    assert_non_null(o->mem);
    memset(o->mem, GUARD_BYTE, o->body + GUARD_BYTES);
    for (int64_t t = 0; t < T; t++)
        memset(o->mem + (size_t)(t * os) * o->esize, BODY_BYTE, (size_t)H * o->esize);
    o->t = ref_tensor_2d(o->mem, dt, T, H, os);
}

static void outbuf_free(outbuf *o) {
    free(o->mem);
    o->mem = NULL;
}

/* -> 1 if the guard after the buffer and every row gap still hold GUARD_BYTE */
static int outbuf_guard_ok(const outbuf *o) {
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (o->mem[o->body + i] != GUARD_BYTE) return 0;
    for (int64_t t = 0; t < o->T; t++) {
        const unsigned char *gap = o->mem + (size_t)(t * o->os + o->H) * o->esize;
        for (size_t i = 0; i < (size_t)(o->os - o->H) * o->esize; i++)
            if (gap[i] != GUARD_BYTE) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* running backends                                                          */
/* ------------------------------------------------------------------------ */

/* -> a CPU context with num_threads threads and room for max_tokens */
static moex_context *make_ctx(int num_threads, int64_t max_tokens) {
    moex_context_options o = moex_context_default_options();
    o.num_threads = num_threads;
    o.max_tokens = max_tokens > 0 ? max_tokens : 1;
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&o, &ctx);
    if (st != MOEX_OK) fail_msg("moex_context_create: %s: %s", moex_status_str(st), moex_last_error());
    return ctx;
}

/* desc -> a layer, failing the test (with the case) if creation fails */
static moex_layer *make_layer(const moex_experts_desc *d, const xcase *c) {
    moex_layer *layer = NULL;
    moex_status st = moex_layer_create(d, &layer);
    if (st != MOEX_OK)
        fail_msg("moex_layer_create failed: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                 describe(c, NULL));
    return layer;
}

/* prepare backend on (ctx, layer), failing with the case if it does not work */
static void prepare_or_fail(moex_context *ctx, moex_layer *layer, const char *backend,
                            const xcase *c) {
    moex_status st = moex_prepare(ctx, layer, backend);
    if (st != MOEX_OK)
        fail_msg("moex_prepare failed: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                 describe(c, backend));
}

/* prepare backend on (ctx, layer) -> 1 if it worked, else 0: a PROBLEM, or the backend refuses
 * the layer (moex_backend_supports; skipped without one) */
static int prepare_soft(moex_context *ctx, moex_layer *layer, const char *backend, const xcase *c) {
    if (!backend_takes(backend, layer, CPU_DEVICE)) return 0; /* refuses this layer: skipped */
    moex_status st = moex_prepare(ctx, layer, backend);
    if (st == MOEX_OK) return 1;
    PROBLEM("moex_prepare failed: %s: %s [%s]", moex_status_str(st), moex_last_error(),
            describe(c, backend));
    return 0;
}

/* r (prepared ctx/layer) -> out via backend -> 1 if it succeeded and wrote
 * nothing outside out; else 0 and a PROBLEM */
static int forward_checked(xrun *r, moex_context *ctx, const moex_layer *layer,
                           const char *backend, outbuf *o) {
    moex_status st = moex_experts_forward(ctx, layer, backend, &r->th, &r->tids, &r->tw, &o->t);
    if (st != MOEX_OK) {
        PROBLEM("forward failed: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                describe(&r->c, backend));
        return 0;
    }
    if (!outbuf_guard_ok(o)) {
        PROBLEM("forward wrote outside out (guard region or row gap) [%s]", describe(&r->c, backend));
        return 0;
    }
    return 1;
}

/* out of one forward vs the reference: NMSE within the dtype's bound, else a PROBLEM */
static int check_nmse(const xrun *r, const outbuf *o, const char *backend) {
    const xcase *c = &r->c;
    double e = ref_nmse(o->mem, c->dt, c->T, c->H, r->os, r->ref);
    if (e <= nmse_bound(c->dt)) return 1;
    PROBLEM("NMSE %.3g > %.0e [%s]", e, nmse_bound(c->dt), describe(c, backend));
    return 0;
}

/* c -> run every CPU backend in one context and compare each with the reference */
static void run_case_all_backends(const xcase *c) {
    xrun r;
    xrun_setup(&r, c);
    moex_context *ctx = make_ctx(2, c->T);
    moex_layer *layer = make_layer(&r.L.desc, c);
    for (int b = 0; b < N_BACKENDS; b++) {
        outbuf o;
        if (!prepare_soft(ctx, layer, CPU_BACKENDS[b], c)) continue;
        outbuf_init(&o, c->T, c->H, r.os, c->dt);
        if (forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o)) check_nmse(&r, &o, CPU_BACKENDS[b]);
        outbuf_free(&o);
    }
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
}

/* ------------------------------------------------------------------------ */
/* correctness against the reference                                         */
/* ------------------------------------------------------------------------ */

/* T {0,1,3,17} x E {1,4} x k {1,2} x H {8,24} x I {8,24} x dtype x backend;
 * the layout/activation pair rotates so every valid pair is seen with T > 0. */
static void test_full_product(void **state) {
    (void)state;
    static const int64_t Ts[] = {0, 1, 3, 17}, Es[] = {1, 4}, ks[] = {1, 2};
    static const int64_t Hs[] = {8, 24}, Is[] = {8, 24};
    int seen[N_PAIRS] = {0};
    int n = 0;
    for (int it = 0; it < 4; it++)
        for (int ie = 0; ie < 2; ie++)
            for (int ik = 0; ik < 2; ik++) {
                if (ks[ik] > Es[ie]) continue;
                for (int ih = 0; ih < 2; ih++)
                    for (int ii = 0; ii < 2; ii++)
                        for (int id = 0; id < 3; id++, n++) {
                            xcase c = xcase_make(Ts[it], Es[ie], ks[ik], Hs[ih], Is[ii],
                                                 FLOAT_DTYPES[id], 1000u + (uint64_t)n);
                            pair p = pair_at(n % N_PAIRS);
                            c.layout = p.layout;
                            c.act = p.act;
                            c.id_dt = (n & 1) ? MOEX_I64 : MOEX_I32;
                            c.sentinel_prob = (n % 3 == 0) ? 0.2 : 0.0;
                            c.limit = (n & 2) ? 7.0f : 0.8f;   /* 0.8: the clamps do bite */
                            run_case_all_backends(&c);
                            if (c.T > 0) seen[n % N_PAIRS]++;
                        }
            }
    for (int i = 0; i < N_PAIRS; i++)
        if (!seen[i]) fail_msg("pair %d (%s, %s) not covered", i, LAYOUTS[pair_at(i).layout].name,
                               ACT_NAMES[pair_at(i).act]);
    end_problems();
}

/* Every layout x activation x backend x dtype at T=5, E=3, k=2, H=24, I=8. */
static void test_all_layouts_activations(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < N_PAIRS; i++) {
            pair p = pair_at(i);
            xcase c = xcase_make(5, 3, 2, 24, 8, FLOAT_DTYPES[d], 77u + (uint64_t)(i * 3 + d));
            c.layout = p.layout;
            c.act = p.act;
            c.limit = 0.8f;
            c.id_dt = (i & 1) ? MOEX_I64 : MOEX_I32;
            run_case_all_backends(&c);
        }
    end_problems();
}

/* About ten larger cases: T up to 1000, E up to 60, k up to 8, odd and aligned H/I. */
static void test_large_pairwise(void **state) {
    (void)state;
    static const struct { int64_t T, E, k, H, I; moex_dtype dt; int layout; moex_activation act; } L[] = {
        {1000, 60, 8, 128, 95, MOEX_BF16, 0, MOEX_ACT_SILU},
        {333, 16, 4, 257, 128, MOEX_F16, 5, MOEX_ACT_GELU},
        {129, 8, 2, 384, 129, MOEX_F32, 2, MOEX_ACT_GPTOSS_CLAMP},
        {64, 32, 8, 95, 256, MOEX_BF16, 7, MOEX_ACT_SWIGLU_LIMIT},
        {257, 60, 1, 256, 257, MOEX_F32, 9, MOEX_ACT_RELU},
        {400, 4, 4, 129, 384, MOEX_F16, 4, MOEX_ACT_GELU_TANH},
        {17, 60, 6, 384, 256, MOEX_BF16, 10, MOEX_ACT_GELU},
        {1000, 2, 2, 95, 95, MOEX_F32, 1, MOEX_ACT_SWIGLU_LIMIT},
        {200, 33, 3, 128, 384, MOEX_BF16, 3, MOEX_ACT_RELU},
        {1, 60, 8, 257, 129, MOEX_F16, 6, MOEX_ACT_SILU},
        {96, 64, 8, 256, 128, MOEX_BF16, 11, MOEX_ACT_GELU_TANH},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        xcase c = xcase_make(L[i].T, L[i].E, L[i].k, L[i].H, L[i].I, L[i].dt, 5000u + i);
        c.layout = L[i].layout;
        c.act = L[i].act;
        c.limit = 1.5f;
        c.id_dt = (i & 1) ? MOEX_I32 : MOEX_I64;
        c.sentinel_prob = (i % 3 == 1) ? 0.05 : 0.0;
        run_case_all_backends(&c);
    }
    end_problems();
}

/* Routing weights stored as f16 and bf16 (activations f32 and bf16). */
static void test_routing_weight_dtypes(void **state) {
    (void)state;
    static const moex_dtype wdts[] = {MOEX_F16, MOEX_BF16};
    for (int w = 0; w < 2; w++)
        for (int d = 0; d < 3; d++) {
            xcase c = xcase_make(19, 6, 3, 40, 24, FLOAT_DTYPES[d], 900u + (uint64_t)(w * 3 + d));
            c.w_dt = wdts[w];
            c.layout = 1 + 4 * w;
            run_case_all_backends(&c);
        }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* sentinels                                                                 */
/* ------------------------------------------------------------------------ */

/* ids -1 and E contribute nothing, even with a large routing weight; a token
 * whose ids are all sentinels gets exact zeros. */
static void test_sentinels(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int idt = 0; idt < 2; idt++) {
            xcase c = xcase_make(9, 5, 3, 24, 16, FLOAT_DTYPES[d], 300u + (uint64_t)(d * 2 + idt));
            c.id_dt = idt ? MOEX_I64 : MOEX_I32;
            c.layout = 1;   /* with biases: a skipped expert must not add its down bias */
            xrun r;
            xrun_setup(&r, &c);
            /* token 0: all -1; token 1: all E; token 2: mixed -1/E;
             * tokens 3..8: one sentinel each with a weight of 1000 */
            for (int64_t t = 0; t < c.T; t++)
                for (int64_t j = 0; j < c.k; j++) {
                    int64_t id = (int64_t)ref_load(r.ids, c.id_dt, t * c.k + j);
                    if (t == 0) id = -1;
                    else if (t == 1) id = c.E;
                    else if (t == 2) id = (j & 1) ? c.E : -1;
                    else if (j == t % c.k) id = (t & 1) ? -1 : c.E;
                    else continue;
                    ref_store(r.ids, c.id_dt, t * c.k + j, (double)id);
                    ref_store(r.weights, c.w_dt, t * c.k + j, 1000.0);
                }
            ref_experts_forward(&r.L.desc, &r.th, &r.tids, &r.tw, r.ref);
            moex_context *ctx = make_ctx(2, c.T);
            moex_layer *layer = make_layer(&r.L.desc, &c);
            for (int b = 0; b < N_BACKENDS; b++) {
                if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
                outbuf o;
                prepare_or_fail(ctx, layer, CPU_BACKENDS[b], &c);
                outbuf_init(&o, c.T, c.H, r.os, c.dt);
                if (!forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o)) {
                    outbuf_free(&o);
                    continue;
                }
                for (int64_t t = 0; t < 3; t++)
                    for (int64_t h = 0; h < c.H; h++) {
                        double v = ref_load(o.mem, c.dt, t * r.os + h);
                        if (v != 0.0) {
                            PROBLEM("all-sentinel token %lld: out[%lld] = %g, want 0 [%s]",
                                    (long long)t, (long long)h, v, describe(&c, CPU_BACKENDS[b]));
                            break;
                        }
                    }
                check_nmse(&r, &o, CPU_BACKENDS[b]);
                outbuf_free(&o);
            }
            moex_layer_free(layer);
            moex_context_free(ctx);
            xrun_teardown(&r);
        }
    end_problems();
}

/* Every token all sentinels: the whole output is zeros, nothing else written. */
static void test_all_sentinels(void **state) {
    (void)state;
    xcase c = xcase_make(7, 1, 1, 16, 8, MOEX_BF16, 42);
    c.layout = 3;
    xrun r;
    xrun_setup(&r, &c);
    for (int64_t t = 0; t < c.T; t++) ref_store(r.ids, c.id_dt, t, (t & 1) ? 1.0 : -1.0);
    moex_context *ctx = make_ctx(2, c.T);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    for (int b = 0; b < N_BACKENDS; b++) {
        if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
        outbuf o;
        prepare_or_fail(ctx, layer, CPU_BACKENDS[b], &c);
        outbuf_init(&o, c.T, c.H, r.os, c.dt);
        if (forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o))
            for (int64_t i = 0; i < c.T * c.H; i++)
                if (ref_load(o.mem, c.dt, i) != 0.0) {
                    PROBLEM("out[%lld] = %g, want 0 [%s]", (long long)i, ref_load(o.mem, c.dt, i),
                            describe(&c, CPU_BACKENDS[b]));
                    break;
                }
        outbuf_free(&o);
    }
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* T == 0, guards, max_tokens boundary                                       */
/* ------------------------------------------------------------------------ */

/* T == 0 returns MOEX_OK and writes nothing, with real and with NULL data. */
static void test_t0_writes_nothing(void **state) {
    (void)state;
    xcase c = xcase_make(0, 4, 2, 16, 8, MOEX_F32, 7);
    xrun r;
    xrun_setup(&r, &c);
    moex_context *ctx = make_ctx(2, 8);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    for (int b = 0; b < N_BACKENDS; b++) {
        if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
        prepare_or_fail(ctx, layer, CPU_BACKENDS[b], &c);
        unsigned char buf[GUARD_BYTES];
        memset(buf, GUARD_BYTE, sizeof buf);
        moex_tensor out = ref_tensor_2d(buf, c.dt, 0, c.H, c.H);
        moex_status st = moex_experts_forward(ctx, layer, CPU_BACKENDS[b], &r.th, &r.tids, &r.tw, &out);
        if (st != MOEX_OK)
            PROBLEM("T=0 forward: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                     describe(&c, CPU_BACKENDS[b]));
        for (size_t i = 0; i < sizeof buf; i++)
            if (buf[i] != GUARD_BYTE) PROBLEM("T=0 wrote byte %zu [%s]", i, describe(&c, CPU_BACKENDS[b]));

        /* views with data == NULL and zero elements (what moex_tensor_init allows) */
        moex_tensor h0 = r.th, i0 = r.tids, w0 = r.tw, o0 = out;
        h0.data = i0.data = w0.data = o0.data = NULL;
        st = moex_experts_forward(ctx, layer, CPU_BACKENDS[b], &h0, &i0, &w0, &o0);
        if (st != MOEX_OK)
            PROBLEM("T=0 forward with NULL data views: %s: %s [%s]", moex_status_str(st),
                     moex_last_error(), describe(&c, CPU_BACKENDS[b]));
    }
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
    end_problems();
}

/* T == max_tokens works (the boundary is inclusive), for every backend. */
static void test_t_equals_max_tokens(void **state) {
    (void)state;
    xcase c = xcase_make(37, 8, 2, 32, 24, MOEX_BF16, 8);
    xrun r;
    xrun_setup(&r, &c);
    moex_context *ctx = make_ctx(2, 37);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    for (int b = 0; b < N_BACKENDS; b++) {
        if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
        outbuf o;
        prepare_or_fail(ctx, layer, CPU_BACKENDS[b], &c);
        outbuf_init(&o, c.T, c.H, r.os, c.dt);
        forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o);
        check_nmse(&r, &o, CPU_BACKENDS[b]);
        outbuf_free(&o);
    }
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
    end_problems();
}

/* Row strides larger than H for hidden and out; row gaps in out untouched. */
static void test_row_strides(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++) {
        xcase c = xcase_make(23, 6, 2, 40, 24, FLOAT_DTYPES[d], 400u + (uint64_t)d);
        c.x_stride = c.H + 7;
        c.out_stride = c.H + 5;
        c.layout = 2 + d * 2;
        c.sentinel_prob = 0.1;
        run_case_all_backends(&c);
    }
    /* one token: its row strides are never used, whatever they say (as for any dimension of size 1) */
    xcase c = xcase_make(1, 6, 2, 40, 24, MOEX_F32, 410);
    xrun r;
    xrun_setup(&r, &c);
    moex_context *ctx = make_ctx(2, 1);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    r.th.strides[0] = -7;
    r.tids.strides[0] = 0;
    r.tw.strides[0] = INT64_MIN;
    for (int b = 0; b < N_BACKENDS; b++) {
        outbuf o;
        if (!prepare_soft(ctx, layer, CPU_BACKENDS[b], &c)) continue;
        outbuf_init(&o, 1, c.H, c.H, c.dt);
        o.t.strides[0] = INT64_MAX;
        if (forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o)) check_nmse(&r, &o, CPU_BACKENDS[b]);
        outbuf_free(&o);
    }
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* thread determinism and concurrency                                        */
/* ------------------------------------------------------------------------ */

/* For each backend: 1, 2 and 3 threads give bitwise identical outputs. */
static void test_thread_determinism(void **state) {
    (void)state;
    static const int threads[] = {1, 2, 3};
    for (int d = 0; d < 3; d++) {
        xcase c = xcase_make(301, 12, 3, 72, 40, FLOAT_DTYPES[d], 600u + (uint64_t)d);
        c.sentinel_prob = 0.1;
        c.layout = d == 1 ? 5 : 0;
        xrun r;
        xrun_setup(&r, &c);
        moex_layer *layer = make_layer(&r.L.desc, &c);
        for (int b = 0; b < N_BACKENDS; b++) {
            if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
            outbuf o[3];
            for (int n = 0; n < 3; n++) {
                moex_context *ctx = make_ctx(threads[n], c.T);
                prepare_or_fail(ctx, layer, CPU_BACKENDS[b], &c);
                outbuf_init(&o[n], c.T, c.H, r.os, c.dt);
                forward_checked(&r, ctx, layer, CPU_BACKENDS[b], &o[n]);
                moex_context_free(ctx);
            }
            check_nmse(&r, &o[0], CPU_BACKENDS[b]);
            for (int n = 1; n < 3; n++)
                if (memcmp(o[0].mem, o[n].mem, o[0].body) != 0)
                    PROBLEM("%d threads and 1 thread differ bitwise [%s]", threads[n],
                             describe(&c, CPU_BACKENDS[b]));
            for (int n = 0; n < 3; n++) outbuf_free(&o[n]);
        }
        moex_layer_free(layer);
        xrun_teardown(&r);
    }
    end_problems();
}

/* One forward of a prepared context, run on its own thread. */
typedef struct worker {
    xrun *r;
    moex_context *ctx;
    const moex_layer *layer;
    const char *backend;
    outbuf o;
    moex_status st;
    int mismatch;
    const unsigned char *expect;
} worker;

/* w -> runs the forward 4 times, comparing each with w->expect */
static void *worker_main(void *arg) {
    worker *w = arg;
    for (int i = 0; i < 4 && w->st == MOEX_OK && !w->mismatch; i++) {
        w->st = moex_experts_forward(w->ctx, w->layer, w->backend, &w->r->th, &w->r->tids,
                                     &w->r->tw, &w->o.t);
        if (w->st == MOEX_OK && memcmp(w->o.mem, w->expect, w->o.body) != 0) w->mismatch = 1;
    }
    return NULL;
}

/* Two threads, each with its own context, forward on one layer at once. */
static void test_concurrent_layer(void **state) {
    (void)state;
    xcase c = xcase_make(64, 8, 2, 48, 32, MOEX_BF16, 700);
    xrun r;
    xrun_setup(&r, &c);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    for (int b = 0; b < N_BACKENDS; b++) {
        if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
        moex_context *ctx0 = make_ctx(1, c.T);
        prepare_or_fail(ctx0, layer, CPU_BACKENDS[b], &c);
        outbuf expect;
        outbuf_init(&expect, c.T, c.H, r.os, c.dt);
        forward_checked(&r, ctx0, layer, CPU_BACKENDS[b], &expect);
        moex_context_free(ctx0);

        worker w[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            memset(&w[i], 0, sizeof w[i]);
            w[i].r = &r;
            w[i].layer = layer;
            w[i].backend = CPU_BACKENDS[b];
            w[i].expect = expect.mem;
            w[i].ctx = make_ctx(1, c.T);
            prepare_or_fail(w[i].ctx, layer, CPU_BACKENDS[b], &c);
            outbuf_init(&w[i].o, c.T, c.H, r.os, c.dt);
        }
        for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            if (w[i].st != MOEX_OK)
                PROBLEM("concurrent forward: %s [%s]", moex_status_str(w[i].st), describe(&c, CPU_BACKENDS[b]));
            if (w[i].mismatch || !outbuf_guard_ok(&w[i].o))
                PROBLEM("concurrent forward differs from a lone one [%s]", describe(&c, CPU_BACKENDS[b]));
            moex_context_free(w[i].ctx);
            outbuf_free(&w[i].o);
        }
        outbuf_free(&expect);
    }
    moex_layer_free(layer);
    xrun_teardown(&r);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* combinations the header allows or forbids only implicitly                 */
/* ------------------------------------------------------------------------ */

/* forward st of (r, backend) was either a clean refusal (INVALID_ARGUMENT or
 * UNSUPPORTED, a message, out untouched) or a success within bound */
static void check_refused_or_right(moex_status st, const xrun *r, const outbuf *o,
                                   const unsigned char *before, const char *backend, double bound,
                                   const char *what) {
    if (st == MOEX_OK) {
        double e = ref_nmse(o->mem, o->t.dtype, r->c.T, r->c.H, r->os, r->ref);
        if (!(e <= bound))
            PROBLEM("%s accepted but NMSE %.3g > %.0e [%s]", what, e, bound, describe(&r->c, backend));
        if (!outbuf_guard_ok(o)) PROBLEM("%s: wrote outside out [%s]", what, describe(&r->c, backend));
        return;
    }
    if (st != MOEX_ERR_INVALID_ARGUMENT && st != MOEX_ERR_UNSUPPORTED)
        PROBLEM("%s: status %s, want OK, invalid argument or unsupported [%s]", what,
                moex_status_str(st), describe(&r->c, backend));
    if (!moex_last_error()[0]) PROBLEM("%s: refused without a message [%s]", what, describe(&r->c, backend));
    if (memcmp(o->mem, before, o->body + GUARD_BYTES) != 0)
        PROBLEM("%s: refused but wrote out [%s]", what, describe(&r->c, backend));
}

/* Activations in another dtype than the weights: refused cleanly, or right. */
static void test_mixed_dtypes(void **state) {
    (void)state;
    for (int wd = 0; wd < 3; wd++)
        for (int ad = 0; ad < 3; ad++) {
            if (wd == ad) continue;
            moex_dtype wdt = FLOAT_DTYPES[wd], adt = FLOAT_DTYPES[ad];
            xcase c = xcase_make(11, 5, 2, 24, 16, wdt, 1200u + (uint64_t)(wd * 3 + ad));
            xrun r;
            xrun_setup(&r, &c);
            /* hidden re-made in the activation dtype; the reference follows it */
            free(r.hidden);
            r.hidden = calloc((size_t)(c.T * c.H), 4);
            ref_rng rng;
            ref_rng_seed(&rng, c.seed);
            ref_fill_random(r.hidden, adt, c.T * c.H, 1.0, &rng);
            r.th = ref_tensor_2d(r.hidden, adt, c.T, c.H, c.H);
            ref_experts_forward(&r.L.desc, &r.th, &r.tids, &r.tw, r.ref);
            double bound = fmax(nmse_bound(wdt), nmse_bound(adt));
            moex_context *ctx = make_ctx(2, c.T);
            moex_layer *layer = make_layer(&r.L.desc, &c);
            for (int b = 0; b < N_BACKENDS; b++) {
                if (!prepare_soft(ctx, layer, CPU_BACKENDS[b], &c)) continue;
                outbuf o;
                outbuf_init(&o, c.T, c.H, c.H, adt);
                unsigned char *before = malloc(o.body + GUARD_BYTES);
                memcpy(before, o.mem, o.body + GUARD_BYTES);
                moex_status st = moex_experts_forward(ctx, layer, CPU_BACKENDS[b], &r.th, &r.tids, &r.tw, &o.t);
                char what[64];
                snprintf(what, sizeof what, "weights %s, activations %s", dt_name(wdt), dt_name(adt));
                check_refused_or_right(st, &r, &o, before, CPU_BACKENDS[b], bound, what);
                free(before);
                outbuf_free(&o);
            }
            moex_layer_free(layer);
            moex_context_free(ctx);
            xrun_teardown(&r);
        }
    end_problems();
}

/* ids and weights views with a row stride > k, or column-strided: refused cleanly, or right. */
static void test_strided_ids_weights(void **state) {
    (void)state;
    xcase c = xcase_make(13, 6, 2, 24, 16, MOEX_F32, 1300);
    c.id_dt = MOEX_I64;
    xrun r;
    xrun_setup(&r, &c);
    for (int mode = 0; mode < 2; mode++) {
        /* mode 0: row stride k+3; mode 1: every other element (strides [2k, 2]) */
        int64_t rs = mode ? 2 * c.k : c.k + 3, cs = mode ? 2 : 1;
        int64_t *ids = calloc((size_t)(c.T * rs), sizeof(int64_t));
        float *w = calloc((size_t)(c.T * rs), sizeof(float));
        for (int64_t t = 0; t < c.T; t++)
            for (int64_t j = 0; j < c.k; j++) {
                ids[t * rs + j * cs] = (int64_t)ref_load(r.ids, c.id_dt, t * c.k + j);
                w[t * rs + j * cs] = (float)ref_load(r.weights, c.w_dt, t * c.k + j);
            }
        for (int64_t i = 0; i < c.T * rs; i++)
            if (mode == 0 ? (i % rs) >= c.k : (i & 1)) ids[i] = 1000000;  /* poison the gaps */
        moex_tensor ti = ref_tensor_2d(ids, MOEX_I64, c.T, c.k, rs), tw = ref_tensor_2d(w, MOEX_F32, c.T, c.k, rs);
        ti.strides[1] = tw.strides[1] = cs;
        moex_context *ctx = make_ctx(2, c.T);
        moex_layer *layer = make_layer(&r.L.desc, &c);
        for (int b = 0; b < N_BACKENDS; b++) {
            if (!prepare_soft(ctx, layer, CPU_BACKENDS[b], &c)) continue;
            outbuf o;
            outbuf_init(&o, c.T, c.H, c.H, c.dt);
            unsigned char *before = malloc(o.body + GUARD_BYTES);
            memcpy(before, o.mem, o.body + GUARD_BYTES);
            moex_status st = moex_experts_forward(ctx, layer, CPU_BACKENDS[b], &r.th, &ti, &tw, &o.t);
            check_refused_or_right(st, &r, &o, before, CPU_BACKENDS[b], 1e-10,
                                   mode ? "ids/weights column stride 2" : "ids/weights row stride k+3");
            free(before);
            outbuf_free(&o);
        }
        moex_layer_free(layer);
        moex_context_free(ctx);
        free(ids);
        free(w);
    }
    xrun_teardown(&r);
    end_problems();
}

/* A layer freed after preparing, and a new one (often at the same address)
 * with other weights: the context must not use the old one's state. */
static void test_layer_recreated_in_context(void **state) {
    (void)state;
    xcase c1 = xcase_make(21, 6, 2, 32, 24, MOEX_BF16, 1400), c2 = c1;
    c2.seed = 1401;                         /* same shapes and routing, other weights */
    xrun r1, r2;
    xrun_setup(&r1, &c1);
    xrun_setup(&r2, &c2);
    moex_context *ctx = make_ctx(2, 32);
    for (int b = 0; b < N_BACKENDS; b++) {
        const char *be = CPU_BACKENDS[b];
        moex_layer *l1 = make_layer(&r1.L.desc, &c1);
        uintptr_t old_address = (uintptr_t)l1;
        outbuf o;
        if (!prepare_soft(ctx, l1, be, &c1)) {
            moex_layer_free(l1);
            continue;
        }
        outbuf_init(&o, c1.T, c1.H, c1.H, c1.dt);
        if (forward_checked(&r1, ctx, l1, be, &o)) check_nmse(&r1, &o, be);
        outbuf_free(&o);
        moex_layer_free(l1);

        moex_layer *l2 = make_layer(&r2.L.desc, &c2);
        /* without a prepare: not prepared, or (if the library tracks it) right */
        outbuf_init(&o, c2.T, c2.H, c2.H, c2.dt);
        moex_status st = moex_experts_forward(ctx, l2, be, &r2.th, &r2.tids, &r2.tw, &o.t);
        if (st == MOEX_OK) {
            if (!check_nmse(&r2, &o, be))
                PROBLEM("^ forward of a new, unprepared layer (%s the old one's address) used stale state",
                        (uintptr_t)l2 == old_address ? "at" : "not at");
        } else if (st != MOEX_ERR_NOT_PREPARED) {
            PROBLEM("new unprepared layer: status %s, want not prepared [%s]", moex_status_str(st), describe(&c2, be));
        }
        outbuf_free(&o);
        /* after a prepare: right */
        if (prepare_soft(ctx, l2, be, &c2)) {
            outbuf_init(&o, c2.T, c2.H, c2.H, c2.dt);
            if (forward_checked(&r2, ctx, l2, be, &o) && !check_nmse(&r2, &o, be))
                PROBLEM("^ prepared new layer (%s the old one's address) computed with stale state",
                        (uintptr_t)l2 == old_address ? "at" : "not at");
            outbuf_free(&o);
        }
        moex_layer_free(l2);
    }
    moex_context_free(ctx);
    xrun_teardown(&r1);
    xrun_teardown(&r2);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* bad input to moex_experts_forward                                         */
/* ------------------------------------------------------------------------ */

/* A valid small f32 case with E = 64, prepared for every CPU backend, whose
 * buffers are big enough for any of the malformed views made from it. */
typedef struct bad_fixture {
    xcase c;
    xrun r;
    moex_context *ctx;
    moex_layer *layer;
    unsigned char *out_mem;      /* pre-filled with a pattern */
    unsigned char *out_copy;     /* the same pattern, to compare */
    size_t out_bytes;
    void *big;                   /* a large zeroed scratch for bigger views */
    moex_tensor out;             /* the valid out view */
} bad_fixture;

/* -> *f: T=4, E=64, k=2, H=16, I=8, f32 */
static void bad_fixture_init(bad_fixture *f) {
    memset(f, 0, sizeof *f);
    f->c = xcase_make(4, 64, 2, 16, 8, MOEX_F32, 99);
    xrun_setup(&f->r, &f->c);
    f->ctx = make_ctx(2, 16);
    f->layer = make_layer(&f->r.L.desc, &f->c);
    for (int b = 0; b < N_BACKENDS; b++) prepare_or_fail(f->ctx, f->layer, CPU_BACKENDS[b], &f->c);
    f->out_bytes = 4096;
    f->out_mem = malloc(f->out_bytes);
    f->out_copy = malloc(f->out_bytes);
    for (size_t i = 0; i < f->out_bytes; i++) f->out_mem[i] = (unsigned char)(i * 31 + 7);
    memcpy(f->out_copy, f->out_mem, f->out_bytes);
    f->big = calloc(1, 1 << 16);
    f->out = ref_tensor_2d(f->out_mem, MOEX_F32, f->c.T, f->c.H, f->c.H);
}

static void bad_fixture_free(bad_fixture *f) {
    moex_layer_free(f->layer);
    moex_context_free(f->ctx);
    xrun_teardown(&f->r);
    free(f->out_mem);
    free(f->out_copy);
    free(f->big);
}

/* Forward with the given views must fail with want; the message must
 * contain need1 or need2 (either may be NULL; case-insensitive); the output
 * buffer must be byte-for-byte unchanged. what names the case. */
static void expect_forward_fails(bad_fixture *f, moex_context *ctx, const moex_layer *layer,
                                 const char *backend, const moex_tensor *hidden,
                                 const moex_tensor *ids, const moex_tensor *weights,
                                 moex_tensor *out, moex_status want, const char *need1,
                                 const char *need2, const char *what) {
    moex_status st = moex_experts_forward(ctx, layer, backend, hidden, ids, weights, out);
    const char *msg = moex_last_error();
    if (st != want)
        PROBLEM("%s [backend %s]: status %d (%s), want %d (%s); message: \"%s\"", what,
                 backend ? backend : "NULL", st, moex_status_str(st), want,
                 moex_status_str(want), msg);
    if (!msg || !*msg) PROBLEM("%s [backend %s]: empty moex_last_error()", what, backend);
    if ((need1 || need2) && !contains(msg, need1) && !contains(msg, need2))
        PROBLEM("%s [backend %s]: message \"%s\" does not name %s", what, backend, msg,
                needs_text(need1, need2));
    if (memcmp(f->out_mem, f->out_copy, f->out_bytes) != 0)
        PROBLEM("%s [backend %s]: output written on failure", what, backend);
}

/* Null arguments, one at a time. */
static void test_bad_forward_nulls(void **state) {
    (void)state;
    bad_fixture f;
    bad_fixture_init(&f);
    xrun *r = &f.r;
    for (int b = 0; b < N_BACKENDS; b++) {
        const char *be = CPU_BACKENDS[b];
        expect_forward_fails(&f, NULL, f.layer, be, &r->th, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "ctx", "context", "null ctx");
        expect_forward_fails(&f, f.ctx, NULL, be, &r->th, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "layer", NULL, "null layer");
        expect_forward_fails(&f, f.ctx, f.layer, be, NULL, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "hidden", NULL, "null hidden");
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, NULL, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "ids", NULL, "null ids");
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, NULL, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "weights", NULL, "null weights");
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, NULL,
                             MOEX_ERR_INVALID_ARGUMENT, "out", NULL, "null out");
        /* a view whose data is NULL while it has elements */
        moex_tensor h = r->th;
        h.data = NULL;
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "hidden", NULL, "hidden.data NULL");
    }
    /* a NULL backend name */
    moex_status st = moex_experts_forward(f.ctx, f.layer, NULL, &r->th, &r->tids, &r->tw, &f.out);
    assert_int_not_equal(st, MOEX_OK);
    assert_memory_equal(f.out_mem, f.out_copy, f.out_bytes);
    bad_fixture_free(&f);
    end_problems();
}

/* Shapes and dtypes that do not fit the layer or each other. */
static void test_bad_forward_shapes_dtypes(void **state) {
    (void)state;
    bad_fixture f;
    bad_fixture_init(&f);
    xrun *r = &f.r;
    int64_t T = f.c.T, H = f.c.H, k = f.c.k;
    for (int b = 0; b < N_BACKENDS; b++) {
        const char *be = CPU_BACKENDS[b];
        moex_tensor h = ref_tensor_2d(f.big, MOEX_F32, T, H + 1, H + 1);        /* H = 17 */
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "hidden", "17", "hidden [T, H+1]");
        moex_tensor o = ref_tensor_2d(f.out_mem, MOEX_F32, T, H + 2, H + 2);     /* 18 */
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, &o,
                             MOEX_ERR_INVALID_ARGUMENT, "out", "18", "out [T, H+2]");
        o = ref_tensor_2d(f.out_mem, MOEX_F32, T + 1, H, H);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, &o,
                             MOEX_ERR_INVALID_ARGUMENT, "out", NULL, "out [T+1, H]");
        moex_tensor ids = ref_tensor_2d(f.big, MOEX_I32, T, k + 1, k + 1);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &ids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "ids", NULL, "ids [T, k+1]");
        moex_tensor w = ref_tensor_2d(f.big, MOEX_F32, T + 1, k, k);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &w, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "weights", NULL, "weights [T+1, k]");
        o = ref_tensor_2d(f.out_mem, MOEX_BF16, T, H, H);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, &o,
                             MOEX_ERR_INVALID_ARGUMENT, "out", "dtype", "out bf16, hidden f32");
        w = ref_tensor_2d(f.big, MOEX_I32, T, k, k);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &w, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "weights", "i32", "weights i32");
        ids = ref_tensor_2d(f.big, MOEX_F32, T, k, k);
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &ids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "ids", "f32", "ids f32");
        h = r->th;
        h.strides[1] = 2;
        h.data = f.big;
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "hidden", "stride", "hidden inner stride 2");
        o = f.out;
        o.strides[1] = 2;
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, &o,
                             MOEX_ERR_INVALID_ARGUMENT, "out", "stride", "out inner stride 2");
        o = f.out;
        o.strides[0] = H - 1;
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &r->tw, &o,
                             MOEX_ERR_INVALID_ARGUMENT, "out", "stride", "out row stride H-1");
        h = ref_tensor(f.big, MOEX_F32, 1, &H);
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_INVALID_ARGUMENT, "hidden", NULL, "hidden 1-d");
    }
    bad_fixture_free(&f);
    end_problems();
}

/* Expert ids outside [0, E) other than the sentinels -1 and E. */
static void test_bad_forward_ids(void **state) {
    (void)state;
    static const struct { int64_t id; const char *text; } BAD[] = {
        {300, "300"}, {-2, "-2"}, {65, "65"}, {-1000000, "-1000000"}};
    bad_fixture f;
    bad_fixture_init(&f);
    xrun *r = &f.r;
    for (int idt = 0; idt < 2; idt++) {
        moex_dtype dt = idt ? MOEX_I64 : MOEX_I32;
        int64_t shape[2] = {f.c.T, f.c.k};
        void *buf = calloc((size_t)(f.c.T * f.c.k), 8);
        for (int64_t i = 0; i < f.c.T * f.c.k; i++) ref_store(buf, dt, i, (double)(i % 64));
        moex_tensor ids = ref_tensor(buf, dt, 2, shape);
        for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
            for (int b = 0; b < N_BACKENDS; b++) {
                ref_store(buf, dt, 5, (double)BAD[i].id);           /* ids[2,1] */
                char what[64];
                snprintf(what, sizeof what, "ids[2,1] = %lld (%s)", (long long)BAD[i].id, dt_name(dt));
                expect_forward_fails(&f, f.ctx, f.layer, CPU_BACKENDS[b], &r->th, &ids, &r->tw,
                                     &f.out, MOEX_ERR_INVALID_ARGUMENT, BAD[i].text, NULL, what);
                ref_store(buf, dt, 5, 1.0);
            }
        free(buf);
    }
    bad_fixture_free(&f);
    end_problems();
}

/* Sizes whose element or byte counts overflow int64, data that is not aligned to its elements, and
 * a tensor on a device the context does not compute on: refused by name and value, nothing written. */
static void test_bad_forward_hostile(void **state) {
    (void)state;
    bad_fixture f;
    bad_fixture_init(&f);
    xrun *r = &f.r;
    const int64_t H = f.c.H, k = f.c.k;
    for (int b = 0; b < N_BACKENDS; b++) {
        const char *be = CPU_BACKENDS[b];
        static const struct { int64_t T; moex_status want; const char *need; } HUGE[] = {
            {(int64_t)1 << 62, MOEX_ERR_INVALID_ARGUMENT, "[4611686018427387904, 16]"}, /* T*H overflows */
            {(int64_t)1 << 58, MOEX_ERR_INVALID_ARGUMENT, "[288230376151711744, 16]"},  /* T*H*4 bytes overflow */
            {(int64_t)1 << 40, MOEX_ERR_WORKSPACE, "1099511627776"},                     /* fits, but > max_tokens */
        };
        for (int i = 0; i < 3; i++) {
            const int64_t T = HUGE[i].T;
            moex_tensor h = ref_tensor_2d(f.big, MOEX_F32, T, H, H), o = ref_tensor_2d(f.out_mem, MOEX_F32, T, H, H);
            moex_tensor ids = ref_tensor_2d(f.big, MOEX_I32, T, k, k), w = ref_tensor_2d(f.big, MOEX_F32, T, k, k);
            char what[64];
            snprintf(what, sizeof what, "T = %lld", (long long)T);
            expect_forward_fails(&f, f.ctx, f.layer, be, &h, &ids, &w, &o, HUGE[i].want, HUGE[i].need, NULL, what);
        }
        /* ids (i32) at an address 2 mod 4; hidden (f32) likewise */
        unsigned char *odd = (unsigned char *)f.big + 1024 + 2;
        memcpy(odd, r->ids, (size_t)(f.c.T * k) * 4);
        moex_tensor ids = r->tids;
        ids.data = odd;
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &ids, &r->tw, &f.out, MOEX_ERR_INVALID_ARGUMENT,
                             "ids: data at", "aligned", "ids at 2 mod 4");
        if (!contains(moex_last_error(), "aligned")) PROBLEM("ids at 2 mod 4: \"%s\"", moex_last_error());
        memcpy(odd, r->hidden, (size_t)(f.c.T * H) * 4);
        moex_tensor h = r->th;
        h.data = odd;
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out, MOEX_ERR_INVALID_ARGUMENT,
                             "hidden: data at", NULL, "hidden at 2 mod 4");
        moex_tensor w = r->tw;
        w.data = odd + 1; /* 3 mod 4 */
        expect_forward_fails(&f, f.ctx, f.layer, be, &r->th, &r->tids, &w, &f.out, MOEX_ERR_INVALID_ARGUMENT,
                             "weights: data at", NULL, "weights at 3 mod 4");
        /* a view that says it is on GPU 3, given to a cpu context */
        h = r->th;
        h.device.kind = MOEX_DEVICE_CUDA;
        h.device.index = 3;
        expect_forward_fails(&f, f.ctx, f.layer, be, &h, &r->tids, &r->tw, &f.out, MOEX_ERR_INVALID_ARGUMENT,
                             "hidden is in cuda:3 memory", NULL, "hidden on cuda:3");
    }
    bad_fixture_free(&f);
    end_problems();
}

/* Backend names, preparation, workspace. */
static void test_bad_forward_backend_and_context(void **state) {
    (void)state;
    bad_fixture f;
    bad_fixture_init(&f);
    xrun *r = &f.r;

    /* unknown name: NOT_FOUND, message lists valid names */
    expect_forward_fails(&f, f.ctx, f.layer, "nope_backend", &r->th, &r->tids, &r->tw, &f.out,
                         MOEX_ERR_NOT_FOUND, "grouped_mm", NULL, "unknown backend (forward)");
    assert_true(contains(moex_last_error(), "eager"));
    moex_status st = moex_prepare(f.ctx, f.layer, "nope_backend");
    assert_int_equal(st, MOEX_ERR_NOT_FOUND);
    if (!contains(moex_last_error(), "grouped_mm") || !contains(moex_last_error(), "eager"))
        PROBLEM("prepare with unknown backend: message does not list names: \"%s\"", moex_last_error());

    /* deepgemm on the CPU */
    st = moex_prepare(f.ctx, f.layer, "deepgemm");
    if (st != MOEX_ERR_UNSUPPORTED)
        PROBLEM("prepare deepgemm on CPU: %s, want unsupported (%s)", moex_status_str(st), moex_last_error());
    if (!contains(moex_last_error(), "compute capability") && !contains(moex_last_error(), "GPU"))
        PROBLEM("prepare deepgemm on CPU: message \"%s\" mentions neither compute capability nor GPU",
                 moex_last_error());
    st = moex_experts_forward(f.ctx, f.layer, "deepgemm", &r->th, &r->tids, &r->tw, &f.out);
    if (st != MOEX_ERR_UNSUPPORTED && st != MOEX_ERR_NOT_PREPARED)
        PROBLEM("forward deepgemm on CPU: %s (%s), want unsupported or not prepared",
                 moex_status_str(st), moex_last_error());
    assert_memory_equal(f.out_mem, f.out_copy, f.out_bytes);

    /* T > max_tokens: a context sized for 36 tokens, 37 given */
    {
        xcase c = xcase_make(37, 64, 2, 16, 8, MOEX_F32, 5);
        xrun big;
        xrun_setup(&big, &c);
        moex_context *small = make_ctx(2, 36);
        moex_layer *layer = make_layer(&big.L.desc, &c);
        for (int b = 0; b < N_BACKENDS; b++) {
            if (!backend_takes(CPU_BACKENDS[b], layer, CPU_DEVICE)) continue; /* refuses this layer */
            prepare_or_fail(small, layer, CPU_BACKENDS[b], &c);
            moex_tensor o = ref_tensor_2d(f.out_mem, MOEX_F32, 37, 16, 16);  /* 37*16*4 < 4096 */
            expect_forward_fails(&f, small, layer, CPU_BACKENDS[b], &big.th, &big.tids, &big.tw, &o,
                                 MOEX_ERR_WORKSPACE, "37", NULL, "T=37 > max_tokens=36");
        }
        moex_layer_free(layer);
        moex_context_free(small);
        xrun_teardown(&big);
    }

    /* forward before moex_prepare, in a fresh context */
    moex_context *fresh = make_ctx(2, 16);
    for (int b = 0; b < N_BACKENDS; b++)
        expect_forward_fails(&f, fresh, f.layer, CPU_BACKENDS[b], &r->th, &r->tids, &r->tw, &f.out,
                             MOEX_ERR_NOT_PREPARED, "prepare", NULL, "forward before prepare");
    /* prepared for one backend only: the others are still not prepared */
    prepare_or_fail(fresh, f.layer, "eager", &f.c);
    expect_forward_fails(&f, fresh, f.layer, "grouped_mm", &r->th, &r->tids, &r->tw, &f.out,
                         MOEX_ERR_NOT_PREPARED, "prepare", NULL, "grouped_mm after preparing eager");
    /* prepare is idempotent */
    assert_int_equal(moex_prepare(fresh, f.layer, "eager"), MOEX_OK);
    assert_int_equal(moex_prepare(fresh, f.layer, "eager"), MOEX_OK);
    moex_context_free(fresh);

    /* prepare with null arguments */
    assert_int_equal(moex_prepare(NULL, f.layer, "eager"), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_prepare(f.ctx, NULL, "eager"), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_not_equal(moex_prepare(f.ctx, f.layer, NULL), MOEX_OK);
    bad_fixture_free(&f);
    end_problems();
}

/* A layer whose weights are on another device than the context's: refused by moex_prepare, naming
 * the device (kind and index). */
static void test_prepare_weights_elsewhere(void **state) {
    (void)state;
    ref_layer_spec s = {4, 16, 8, 2, 1, 0, 0, 1, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer L;
    ref_layer_build(&L, &s, 31);
    moex_experts_desc d = L.desc;
    const moex_device gpu1 = {MOEX_DEVICE_CUDA, 1};
    d.gate_up.device = d.down.device = d.gate_up_bias.device = d.down_bias.device = gpu1;
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_OK);
    moex_context *ctx = make_ctx(1, 4);
    for (int b = 0; b < N_BACKENDS; b++) {
        moex_status st = moex_prepare(ctx, layer, CPU_BACKENDS[b]);
        if (st != MOEX_ERR_INVALID_ARGUMENT || !contains(moex_last_error(), "weights are in cuda:1 memory"))
            PROBLEM("%s: prepare of weights on cuda:1 in a cpu context: %s \"%s\"", CPU_BACKENDS[b],
                    moex_status_str(st), moex_last_error());
    }
    assert_int_equal(moex_context_workspace_bytes(ctx), 0);
    moex_context_free(ctx);
    moex_layer_free(layer);
    ref_layer_destroy(&L);
    end_problems();
}

/* A layer prepared in one context is not prepared in another. */
static void test_prepare_is_per_context(void **state) {
    (void)state;
    bad_fixture f;
    bad_fixture_init(&f);
    xcase c = xcase_make(4, 64, 2, 16, 8, MOEX_F32, 99);
    xrun *r = &f.r;
    moex_context *other = make_ctx(2, 16);
    moex_layer *layer2 = make_layer(&r->L.desc, &c);
    /* other layer, same description: prepared in f.ctx? No: only f.layer is. */
    expect_forward_fails(&f, f.ctx, layer2, "grouped_mm", &r->th, &r->tids, &r->tw, &f.out,
                         MOEX_ERR_NOT_PREPARED, "prepare", NULL, "second layer not prepared");
    expect_forward_fails(&f, other, f.layer, "grouped_mm", &r->th, &r->tids, &r->tw, &f.out,
                         MOEX_ERR_NOT_PREPARED, "prepare", NULL, "other context not prepared");
    moex_layer_free(layer2);
    moex_context_free(other);
    bad_fixture_free(&f);
    end_problems();
}

/* out sharing memory with hidden, ids or weights is refused before anything is written, naming
 * both tensors, by every backend the registry lists that runs the layer on the CPU. Rows of one view
 * in the gaps between rows of another share no byte and are accepted (and computed right). */
static void test_forward_aliasing(void **state) {
    (void)state;
    xcase c = xcase_make(6, 8, 2, 16, 8, MOEX_F32, 123);
    xrun r;
    xrun_setup(&r, &c);
    const int64_t T = c.T, H = c.H, k = c.k, OS = 2 * H; /* out rows 2H apart: a gap of H after each */
    moex_context *ctx = make_ctx(2, T);
    moex_layer *layer = make_layer(&r.L.desc, &c);
    const size_t arena_bytes = (size_t)(T * OS + 64) * 4;
    float *arena = aligned_alloc(64, arena_bytes);
    unsigned char *copy = malloc(arena_bytes);
    assert_non_null(arena);
    const moex_device cpu = {MOEX_DEVICE_CPU, 0};
    int tried = 0;
    for (int i = 0; i < moex_backend_count(); i++) {
        const char *be = moex_backend_name(i);
        if (moex_backend_supports(be, layer, cpu, NULL, 0) != MOEX_OK) continue;
        prepare_or_fail(ctx, layer, be, &c);
        tried++;
        /* where hidden, ids and weights start (in floats from the arena; -1: their own buffers) and
         * hidden's row stride; out is always at 0 with row stride 2H */
        static const struct { const char *what, *input; int64_t hidden_at, hidden_stride, ids_at, w_at; } CASES[] = {
            {"ids inside out's row 2", "ids [6, 2]", -1, 0, 2 * 32 + 4, -1},
            {"weights inside out's row 0", "weights [6, 2]", -1, 0, -1, 3},
            {"ids' first element on out's last", "ids [6, 2]", -1, 0, 5 * 32 + 15, -1},
            {"hidden half a row into out", "hidden [6, 16]", 8, 32, -1, -1},
            {"hidden is out", "hidden [6, 16]", 0, 32, -1, -1},
            {"hidden contiguous over out's rows", "hidden [6, 16]", 32, 16, -1, -1},
            {NULL, NULL, 16, 32, -1, -1},       /* hidden in out's gaps: fine */
            {NULL, NULL, -1, 0, 16, 32 + 16},   /* ids in row 0's gap, weights in row 1's: fine */
            {NULL, NULL, -1, 0, 5 * 32 + 16, 5 * 32 + 28}, /* right after out's last element: fine */
        };
        for (size_t n = 0; n < sizeof CASES / sizeof CASES[0]; n++) {
            memset(arena, 0xA5, arena_bytes);
            moex_tensor out = ref_tensor_2d(arena, MOEX_F32, T, H, OS), h = r.th, ids = r.tids, w = r.tw;
            if (CASES[n].ids_at >= 0) { /* the inputs' bytes first, then out's rows over them where they overlap */
                memcpy(arena + CASES[n].ids_at, r.ids, (size_t)(T * k) * 4);
                ids = ref_tensor_2d(arena + CASES[n].ids_at, MOEX_I32, T, k, k);
            }
            if (CASES[n].w_at >= 0) {
                memcpy(arena + CASES[n].w_at, r.weights, (size_t)(T * k) * 4);
                w = ref_tensor_2d(arena + CASES[n].w_at, MOEX_F32, T, k, k);
            }
            if (CASES[n].hidden_at >= 0) {
                for (int64_t t = 0; t < T; t++)
                    memcpy(arena + CASES[n].hidden_at + t * CASES[n].hidden_stride, (float *)r.hidden + t * H,
                           (size_t)H * 4);
                h = ref_tensor_2d(arena + CASES[n].hidden_at, MOEX_F32, T, H, CASES[n].hidden_stride);
            }
            memcpy(copy, arena, arena_bytes);
            moex_status st = moex_experts_forward(ctx, layer, be, &h, &ids, &w, &out);
            const char *msg = moex_last_error();
            if (CASES[n].what) {
                if (st != MOEX_ERR_INVALID_ARGUMENT)
                    PROBLEM("%s [%s]: %s, want invalid argument", CASES[n].what, be, moex_status_str(st));
                else if (!contains(msg, "out [6, 16]") || !contains(msg, CASES[n].input))
                    PROBLEM("%s [%s]: message \"%s\" does not name out and %s", CASES[n].what, be, msg, CASES[n].input);
                if (memcmp(arena, copy, arena_bytes)) PROBLEM("%s [%s]: memory written on failure", CASES[n].what, be);
                continue;
            }
            if (st != MOEX_OK) {
                PROBLEM("case %zu [%s]: %s: %s", n, be, moex_status_str(st), msg);
                continue;
            }
            double e = ref_nmse(arena, MOEX_F32, T, H, OS, r.ref);
            if (!(e <= nmse_bound(MOEX_F32))) PROBLEM("case %zu [%s]: NMSE %.3g", n, be, e);
            for (int64_t t = 0; t < T; t++) /* the gaps of out keep what was there: hidden, ids, weights */
                if (memcmp(arena + t * OS + H, copy + (size_t)(t * OS + H) * 4, (size_t)H * 4))
                    PROBLEM("case %zu [%s]: the gap after out's row %lld was written", n, be, (long long)t);
            if (memcmp(arena + T * OS, copy + (size_t)(T * OS) * 4, 64 * 4))
                PROBLEM("case %zu [%s]: the bytes after out were written", n, be);
        }
    }
    if (tried < 3) PROBLEM("only %d backends run this layer on the CPU, want at least 3", tried);
    free(arena);
    free(copy);
    moex_layer_free(layer);
    moex_context_free(ctx);
    xrun_teardown(&r);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* bad layer descriptions                                                    */
/* ------------------------------------------------------------------------ */

/* desc must be rejected with want; message contains need1 or need2; *out untouched */
static void expect_layer_fails(const moex_experts_desc *d, moex_status want, const char *need1,
                               const char *need2, const char *what) {
    int dummy;
    moex_layer *layer = (moex_layer *)&dummy;
    moex_status st = moex_layer_create(d, &layer);
    const char *msg = moex_last_error();
    if (st != want)
        PROBLEM("layer %s: status %d (%s), want %d (%s); message \"%s\"", what, st,
                 moex_status_str(st), want, moex_status_str(want), msg);
    if (layer != (moex_layer *)&dummy) PROBLEM("layer %s: *out written on failure", what);
    if (!msg || !*msg) PROBLEM("layer %s: empty moex_last_error()", what);
    if ((need1 || need2) && !contains(msg, need1) && !contains(msg, need2))
        PROBLEM("layer %s: message \"%s\" does not name %s", what, msg, needs_text(need1, need2));
}

/* -> a valid small random layer (E=4, H=16, I=8, k=2) of the given layout */
static void small_layer(ref_layer *L, int gated, int transposed, int bias, moex_activation act) {
    ref_layer_spec s = {4, 16, 8, 2, gated, 0, transposed, bias, act, 1.702f, 7.0f, MOEX_F32};
    ref_layer_build(L, &s, 11);
}

/* Sizes: k > E, k < 1, negative and zero sizes, overflowing products. */
static void test_bad_layer_sizes(void **state) {
    (void)state;
    ref_layer L;
    small_layer(&L, 1, 0, 0, MOEX_ACT_SILU);
    moex_experts_desc d = L.desc;

    d.top_k = 9;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "top_k", "9", "k=9 > E=4");
    d.top_k = 0;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "top_k", NULL, "k=0");
    d = L.desc;
    d.hidden = -1;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "-1", "hidden", "H=-1");
    d = L.desc;
    d.num_experts = 0;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "num_experts", "experts", "E=0");
    d = L.desc;
    d.intermediate = -5;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "-5", "intermediate", "I=-5");

    /* E * 2I * H overflows int64: E = 2^40, I = 2^21, H = 2^21 (views made by hand) */
    static float dummy[16];
    d = L.desc;
    int64_t E = (int64_t)1 << 40, I = (int64_t)1 << 21, H = (int64_t)1 << 21;
    d.num_experts = E;
    d.hidden = H;
    d.intermediate = I;
    d.gate_up.data = dummy;
    d.gate_up.shape[0] = E; d.gate_up.shape[1] = 2 * I; d.gate_up.shape[2] = H;
    d.gate_up.strides[0] = 2 * I * H; d.gate_up.strides[1] = H; d.gate_up.strides[2] = 1;
    d.down.data = dummy;
    d.down.shape[0] = E; d.down.shape[1] = H; d.down.shape[2] = I;
    d.down.strides[0] = H * I; d.down.strides[1] = I; d.down.strides[2] = 1;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "overflow", "large", "E*2I*H overflow");

    /* 2I itself overflows int64 in a gated layer (it was computed before the guard) */
    d = L.desc;
    d.intermediate = ((int64_t)1 << 62) + 3;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "intermediate = 4611686018427387907", NULL, "gated I = 2^62 + 3");
    d.intermediate = INT64_MAX;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "intermediate = 9223372036854775807", NULL, "gated I = INT64_MAX");
    d.gated = 0;
    d.num_experts = 2; /* ungated: I = INT64_MAX has no doubling, but E x I x H overflows */
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "intermediate = 9223372036854775807", NULL, "ungated I = INT64_MAX");
    d = L.desc;
    d.hidden = INT64_MAX;
    d.num_experts = INT64_MAX;
    d.top_k = 1;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "hidden = 9223372036854775807", NULL, "E = H = INT64_MAX");

    expect_layer_fails(NULL, MOEX_ERR_INVALID_ARGUMENT, NULL, NULL, "NULL desc");
    assert_int_equal(moex_layer_create(&L.desc, NULL), MOEX_ERR_INVALID_ARGUMENT);
    ref_layer_destroy(&L);
    end_problems();
}

/* Tensors: shapes, strides, dtypes, biases. */
static void test_bad_layer_tensors(void **state) {
    (void)state;
    ref_layer L;
    small_layer(&L, 1, 0, 1, MOEX_ACT_SILU);
    moex_experts_desc d = L.desc;

    /* gate_up viewed as [E, 2I, H] with column-major inner strides */
    d.gate_up.strides[1] = 1;
    d.gate_up.strides[2] = 2 * d.intermediate;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gate_up", "contiguous", "gate_up strides");
    d = L.desc;
    d.down.strides[0] += 4;       /* padded experts */
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down", "contiguous", "down padded stride");
    d = L.desc;
    d.gate_up.shape[1] = 2 * d.intermediate + 1;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gate_up", NULL, "gate_up [E, 2I+1, H]");
    d = L.desc;
    d.down.shape[2] = d.hidden;   /* [E, H, H] instead of [E, H, I] */
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down", NULL, "down [E, H, H]");
    d = L.desc;
    d.down.dtype = MOEX_BF16;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down", "dtype", "down bf16, gate_up f32");
    d = L.desc;
    d.gate_up.dtype = MOEX_I32;
    d.down.dtype = MOEX_I32;
    d.gate_up_bias.dtype = MOEX_I32;
    d.down_bias.dtype = MOEX_I32;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "i32", "dtype", "weights i32");
    d = L.desc;
    d.gate_up_bias.shape[1] = d.intermediate;  /* [E, I] in a gated layer */
    d.gate_up_bias.strides[0] = d.intermediate;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gate_up_bias", "bias", "gate_up_bias [E, I]");
    d = L.desc;
    d.down_bias.shape[1] = d.hidden + 1;
    d.down_bias.strides[0] = d.hidden + 1;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down_bias", "bias", "down_bias [E, H+1]");
    d = L.desc;
    d.gate_up.data = NULL;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gate_up", NULL, "gate_up data NULL");
    d = L.desc;
    d.down.device.kind = MOEX_DEVICE_CUDA;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down is on cuda:0 but gate_up is on cpu", NULL, "down on cuda:0");
    d = L.desc;
    d.down_bias.device.kind = MOEX_DEVICE_CUDA;
    d.down_bias.device.index = 2;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down_bias is on cuda:2 but gate_up is on cpu", NULL,
                       "down_bias on cuda:2");
    d = L.desc;
    d.down.data = (char *)d.down.data + 2; /* f32 at 2 mod 4 */
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "down: data at", "aligned", "down at 2 mod 4");
    ref_layer_destroy(&L);

    /* the per-expert layout: every matrix pointer aligned to its elements */
    small_layer(&L, 1, 0, 0, MOEX_ACT_SILU);
    const void *gate[4], *up[4], *down[4];
    const int64_t E = 4, H = 16, I = 8;
    for (int64_t e = 0; e < E; e++) {
        gate[e] = (const float *)L.gate_up + e * 2 * I * H;
        up[e] = (const float *)L.gate_up + e * 2 * I * H + I * H;
        down[e] = (const float *)L.down + e * H * I;
    }
    d = L.desc;
    d.gate_up = ref_tensor_absent();
    d.down = ref_tensor_absent();
    d.expert_gate = gate;
    d.expert_up = up;
    d.expert_down = down;
    d.expert_dtype = MOEX_F32;
    d.expert_device.kind = MOEX_DEVICE_CPU;
    moex_layer *layer = NULL;
    if (moex_layer_create(&d, &layer) != MOEX_OK) PROBLEM("per-expert layer: %s", moex_last_error());
    moex_layer_free(layer);
    up[2] = (const char *)up[2] + 2;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "expert_up[2]", NULL, "expert_up[2] at 2 mod 4");
    if (!contains(moex_last_error(), "aligned")) PROBLEM("expert_up[2]: message \"%s\"", moex_last_error());
    ref_layer_destroy(&L);
    end_problems();
}

/* Activations: clamped kinds are gated only; limit > 0; unknown values. */
static void test_bad_layer_activation(void **state) {
    (void)state;
    ref_layer L;
    small_layer(&L, 0, 0, 0, MOEX_ACT_SILU);
    moex_experts_desc d = L.desc;
    d.activation = MOEX_ACT_GPTOSS_CLAMP;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gated", "gptoss_clamp", "ungated gptoss_clamp");
    d.activation = MOEX_ACT_SWIGLU_LIMIT;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "gated", "swiglu_limit", "ungated swiglu_limit");
    for (int a = 0; a < 4; a++) {                   /* the plain ones are fine ungated */
        moex_layer *layer = NULL;
        d.activation = (moex_activation)a;
        assert_int_equal(moex_layer_create(&d, &layer), MOEX_OK);
        moex_layer_free(layer);
    }
    ref_layer_destroy(&L);

    small_layer(&L, 1, 0, 0, MOEX_ACT_GPTOSS_CLAMP);
    d = L.desc;
    d.limit = 0.0f;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "limit", NULL, "gptoss_clamp limit 0");
    d.activation = MOEX_ACT_SWIGLU_LIMIT;
    d.limit = -1.0f;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "limit", NULL, "swiglu_limit limit -1");
    d = L.desc;
    d.activation = (moex_activation)42;
    expect_layer_fails(&d, MOEX_ERR_INVALID_ARGUMENT, "activation", "42", "activation 42");
    ref_layer_destroy(&L);
    end_problems();
}

/* The layer keeps a copy of the description: changing ours later is harmless. */
static void test_layer_keeps_desc_copy(void **state) {
    (void)state;
    ref_layer L;
    small_layer(&L, 1, 1, 1, MOEX_ACT_GELU);
    moex_experts_desc d = L.desc;
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_OK);
    memset(&d, 0, sizeof d);
    const moex_experts_desc *kept = moex_layer_desc(layer);
    assert_non_null(kept);
    assert_int_equal(kept->num_experts, 4);
    assert_int_equal(kept->hidden, 16);
    assert_int_equal(kept->intermediate, 8);
    assert_int_equal(kept->top_k, 2);
    assert_int_equal(kept->transposed, 1);
    assert_int_equal(kept->activation, MOEX_ACT_GELU);
    assert_ptr_equal(kept->gate_up.data, L.gate_up);
    assert_ptr_equal(kept->down_bias.data, L.down_bias);
    moex_layer_free(layer);
    ref_layer_destroy(&L);
    end_problems();
}

int main(void) {
    const backend_list cpu = cpu_backends();
    for (int i = 0; i < cpu.n; i++) CPU_BACKENDS[i] = cpu.name[i];
    N_BACKENDS = cpu.n;
    if (N_BACKENDS == 0) {
        fprintf(stderr, "test_experts: no registered backend takes the CPU\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_product),
        cmocka_unit_test(test_all_layouts_activations),
        cmocka_unit_test(test_large_pairwise),
        cmocka_unit_test(test_routing_weight_dtypes),
        cmocka_unit_test(test_sentinels),
        cmocka_unit_test(test_all_sentinels),
        cmocka_unit_test(test_t0_writes_nothing),
        cmocka_unit_test(test_t_equals_max_tokens),
        cmocka_unit_test(test_row_strides),
        cmocka_unit_test(test_thread_determinism),
        cmocka_unit_test(test_concurrent_layer),
        cmocka_unit_test(test_mixed_dtypes),
        cmocka_unit_test(test_strided_ids_weights),
        cmocka_unit_test(test_layer_recreated_in_context),
        cmocka_unit_test(test_bad_forward_nulls),
        cmocka_unit_test(test_bad_forward_shapes_dtypes),
        cmocka_unit_test(test_bad_forward_ids),
        cmocka_unit_test(test_bad_forward_hostile),
        cmocka_unit_test(test_bad_forward_backend_and_context),
        cmocka_unit_test(test_prepare_is_per_context),
        cmocka_unit_test(test_prepare_weights_elsewhere),
        cmocka_unit_test(test_forward_aliasing),
        cmocka_unit_test(test_bad_layer_sizes),
        cmocka_unit_test(test_bad_layer_tensors),
        cmocka_unit_test(test_bad_layer_activation),
        cmocka_unit_test(test_layer_keeps_desc_copy),
    };
    return cmocka_run_group_tests_name("experts", tests, NULL, NULL);
}
