/*
 * backend_ops.c — every registered experts backend on every device present, against the
 * float64 reference of tests/reference.c (in the spirit of ggml's test-backend-ops).
 *
 * The grid, per device (the CPU always; cuda:0 when moex_device_query says it is usable):
 *   weight format  f32, f16, bf16 (hidden and out of the same dtype); fp8 (e4m3 with block
 *                  scales 8 x 32 or 16 x 64, f32 or ue8m0 scales, each in turn) and fp4 (e2m1 with
 *                  ue8m0 scales per 32), made with moex_quantize from an f32 layer, hidden and out
 *                  f32 or bf16 in turn
 *   layout         concat (gate | up rows), interleaved (gate/up rows alternating), transposed
 *                  ([E, in, out]; float formats only: quantized weights are never transposed),
 *                  per_expert (arrays of E pointers to separately allocated matrices, and for the
 *                  quantized formats to their own scale grids); biases on every other case
 *   activation     silu, gelu, gelu_tanh, relu, gated and ungated (not with interleaved), and the
 *                  gated gptoss_clamp and swiglu_limit with a limit that binds
 *   sizes          hidden 72 / 136, intermediate 40 / 88 (quantized formats: 80 / 208 and 48 / 112,
 *                  multiples of 16 with partial blocks), experts 5 / 9, top_k 1..3, tokens 1, 3, 37,
 *                  a size per case in turn; random sentinel ids (-1 and E), and with 3 or more
 *                  tokens token 0 routed to -1 only and token 1 to E only (their rows must be
 *                  exact zeros)
 * Each case is a layer and inputs made once; every backend of the registry (no list here: a new
 * built-in is picked up by itself) is asked moex_backend_supports() for it: a refusal prints
 *   SKIP backend device format layout act: <reason>
 * and is counted; otherwise prepare, forward (out poisoned with NaN before) and a comparison
 * with the reference, as NMSE on the output as returned: f32 1e-10, f16 1e-6, bf16 1e-4 (SPEC
 * "Numerical agreement"), and 1e-4 for the quantized formats against the reference that applies
 * the same quantization (tests/test_quant.c). A wrong value prints FAIL naming the case.
 * On every device, a case with a multiple of 3 experts also runs through each backend that takes
 * it in an expert-parallel group of 3 ranks in one process (run_case_ep: each rank its share of
 * the experts, ranks 0 and 1 half the tokens each, rank 2 none; on a GPU three contexts share it),
 * against the same reference and bound. A backend that runs only in such a group (deepgemm_megamoe:
 * moex_prepare refuses a context without one, MOEX_ERR_UNSUPPORTED) is a SKIP alone and runs in
 * the group, its exchange cut into pieces of 5 rows ($MOEX_MEGAMOE_PIECE_ROWS, unless set).
 * At the end: passed / skipped / failed per backend x device
 * (and "cpu ep=3", "cuda:0 ep=3"). Exit status 1 if
 * any failed.
 *
 * Usage: backend_ops [-b BACKEND]   (only that backend)
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_ranks.h"
#include "moex.h"
#include "reference.h"

#define MAX_BACKENDS 64
#define MAX_DEVICES 2
#define MAX_T 37

static const moex_device HOST = {MOEX_DEVICE_CPU, 0};

/* ---- the grid --------------------------------------------------------------------------------- */

typedef struct format {
    const char *name;
    moex_dtype dt;          /* weights (float formats) */
    int quant;              /* 0, or 1 with qf below */
    moex_quant_format qf;
} format;

static const format FORMATS[] = {
    {"f32", MOEX_F32, 0, MOEX_QUANT_FP8},
    {"f16", MOEX_F16, 0, MOEX_QUANT_FP8},
    {"bf16", MOEX_BF16, 0, MOEX_QUANT_FP8},
    {"fp8", MOEX_E4M3, 1, MOEX_QUANT_FP8}, /* f32 scales, or ue8m0 (MOEX_QUANT_FP8_UE8M0) in turn */
    {"fp4", MOEX_E2M1X2, 1, MOEX_QUANT_FP4},
};
#define N_FORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

enum { CONCAT, INTERLEAVED, TRANSPOSED, PER_EXPERT, N_LAYOUTS };
static const char *const LAYOUT_NAMES[N_LAYOUTS] = {"concat", "interleaved", "transposed", "per_expert"};

typedef struct act {
    const char *name;
    moex_activation act;
    int gated;
} act;

static const act ACTS[] = {
    {"silu", MOEX_ACT_SILU, 1},           {"gelu", MOEX_ACT_GELU, 1},
    {"gelu_tanh", MOEX_ACT_GELU_TANH, 1}, {"relu", MOEX_ACT_RELU, 1},
    {"ungated-silu", MOEX_ACT_SILU, 0},   {"ungated-gelu", MOEX_ACT_GELU, 0},
    {"ungated-gelu_tanh", MOEX_ACT_GELU_TANH, 0}, {"ungated-relu", MOEX_ACT_RELU, 0},
    {"gptoss_clamp", MOEX_ACT_GPTOSS_CLAMP, 1},   {"swiglu_limit", MOEX_ACT_SWIGLU_LIMIT, 1},
};
#define N_ACTS ((int)(sizeof ACTS / sizeof ACTS[0]))

/* H, I, E, k, T: one per case in turn (T = 37 with the smaller products, for the slow backends) */
static const int64_t SIZES[][5] = {
    {72, 40, 5, 1, 1}, {136, 88, 9, 2, 3}, {72, 40, 9, 3, 37}, {136, 40, 5, 3, 1}, {72, 88, 9, 2, 3}, {136, 40, 5, 2, 37},
};
#define N_SIZES ((int)(sizeof SIZES / sizeof SIZES[0]))
/* The quantized formats' sizes: multiples of 16 (the GPU reads rows of codes in 16-byte pieces),
 * not of 32, 64 or 128, so that every block grid below has a partial last block. */
static const int64_t QSIZES[N_SIZES][5] = {
    {80, 48, 5, 1, 1}, {208, 112, 9, 2, 3}, {80, 48, 9, 3, 37}, {208, 48, 5, 3, 1}, {80, 112, 9, 2, 3}, {208, 48, 5, 2, 37},
};

/* FP8 blocks, in turn: 8 x 32 and 16 x 64 (the GPU's grouped_mm takes block_k multiples of 64).
 * Both block_n divide every intermediate size: the per-expert gate and up grids split cleanly. */
static const int64_t FP8_BLOCKS[2][2] = {{8, 32}, {16, 64}};
#define CLAMP_LIMIT 1.0f /* binds for a good part of the projections (about N(0, 1)) */
#define NMSE_QUANT 1e-4

static double float_bound(moex_dtype dt) { return dt == MOEX_F32 ? 1e-10 : dt == MOEX_F16 ? 1e-6 : 1e-4; }

/* ---- counts ----------------------------------------------------------------------------------- */

typedef struct tally {
    int passed, skipped, failed;
} tally;

static tally g_tally[MAX_BACKENDS][MAX_DEVICES];
static int g_failed_setup; /* a case that could not be built (a bug of this test or the library) */

/* ---- memory on a device ----------------------------------------------------------------------- */

/* Everything placed for one case on one device, freed together. */
typedef struct pool {
    moex_device dev;
    int n, nh;
    void *p[160];
    void *host[8];
    int ok;
} pool;

/* A copy of bytes of host memory src on the pool's device (moex_device_alloc: host memory on the
 * CPU, a separate allocation each time), or NULL and ok = 0. */
static void *place(pool *pl, const void *src, size_t bytes) {
    void *d = NULL;
    if (pl->n >= (int)(sizeof pl->p / sizeof pl->p[0])) {
        pl->ok = 0;
        return NULL;
    }
    if (moex_device_alloc(pl->dev, bytes ? bytes : 1, &d) != MOEX_OK || !d) {
        fprintf(stderr, "moex_device_alloc(%zu bytes): %s\n", bytes, moex_last_error());
        pl->ok = 0;
        return NULL;
    }
    pl->p[pl->n++] = d;
    if (bytes && src && moex_memcpy(d, pl->dev, src, HOST, bytes) != MOEX_OK) {
        fprintf(stderr, "moex_memcpy to the device (%zu bytes): %s\n", bytes, moex_last_error());
        pl->ok = 0;
    }
    return d;
}

/* A host array of n pointers, freed with the pool. */
static void **host_array(pool *pl, int64_t n) {
    void **a = calloc((size_t)n, sizeof(void *));
    if (!a || pl->nh >= (int)(sizeof pl->host / sizeof pl->host[0])) {
        free(a);
        pl->ok = 0;
        return NULL;
    }
    pl->host[pl->nh++] = a;
    return a;
}

static void pool_free(pool *pl) {
    for (int i = 0; i < pl->n; i++) moex_device_free(pl->dev, pl->p[i]);
    for (int i = 0; i < pl->nh; i++) free(pl->host[i]);
    pl->n = pl->nh = 0;
}

static size_t tensor_bytes(const moex_tensor *t) {
    if (!t->data) return 0;
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n * moex_dtype_size(t->dtype);
}

/* t (host) -> the same view of a copy on the pool's device */
static moex_tensor place_tensor(pool *pl, moex_tensor t) {
    if (!t.data) return t;
    t.data = place(pl, t.data, tensor_bytes(&t));
    t.device = pl->dev;
    return t;
}

/* ---- one case on the host --------------------------------------------------------------------- */

typedef struct xcase {
    int format, layout, act, size, bias, n;
    int ue8m0;           /* fp8: ue8m0 scales */
    moex_dtype xdt;      /* hidden and out */
    moex_dtype id_dt;
    int64_t H, I, E, k, T;
    ref_layer L;         /* the float layer (f32 for the quantized formats) */
    void *q[4];          /* quantized: gate_up codes, its scales, down codes, its scales */
    moex_experts_desc desc; /* the stacked host description: the reference's */
    void *x, *ids, *w;
    moex_tensor tx, tids, tw;
    double *want;        /* [T, H], rounded to xdt */
    int zero_rows;       /* tokens 0 and 1 route to sentinels only */
    char name[160];      /* "format layout act" */
    char sizes[96];
} xcase;

static void quantize_into(const moex_tensor *w, moex_quant_format f, int64_t bn, int64_t bk, void **q, void **s,
                          moex_tensor *tq, moex_tensor *ts) {
    int64_t E = w->shape[0], N = w->shape[1], K = w->shape[2];
    int fp4 = f == MOEX_QUANT_FP4, ue = f != MOEX_QUANT_FP8;
    int64_t qs[3] = {E, N, fp4 ? K / 2 : K}, ss[3] = {E, (N + bn - 1) / bn, (K + bk - 1) / bk};
    *q = calloc((size_t)(E * N * K), 1);
    *s = calloc((size_t)(ss[0] * ss[1] * ss[2]), 4);
    *tq = ref_tensor(*q, fp4 ? MOEX_E2M1X2 : MOEX_E4M3, 3, qs);
    *ts = ref_tensor(*s, ue ? MOEX_UE8M0 : MOEX_F32, 3, ss);
    if (moex_quantize(w, f, bn, bk, tq, ts) != MOEX_OK) {
        fprintf(stderr, "moex_quantize: %s\n", moex_last_error());
        g_failed_setup++;
    }
}

static void xcase_build(xcase *c, int format_i, int layout, int act_i, int n) {
    memset(c, 0, sizeof *c);
    const format *f = &FORMATS[format_i];
    const act *a = &ACTS[act_i];
    c->format = format_i, c->layout = layout, c->act = act_i, c->n = n;
    /* the size in turn; the other choices vary with the round of sizes too, so that every size meets both */
    const int round = n / N_SIZES;
    c->size = n % N_SIZES;
    c->bias = (n + round) % 2;
    c->ue8m0 = f->quant && f->qf == MOEX_QUANT_FP8 && (n / 3) % 2;
    c->xdt = f->quant ? ((n + round) % 3 == 0 ? MOEX_BF16 : MOEX_F32) : f->dt;
    c->id_dt = round % 2 ? MOEX_I64 : MOEX_I32;
    const int64_t *sz = f->quant ? QSIZES[c->size] : SIZES[c->size];
    c->H = sz[0], c->I = sz[1], c->E = sz[2], c->k = sz[3], c->T = sz[4];
    const int64_t *fp8_block = FP8_BLOCKS[(n / 2) % 2];
    snprintf(c->name, sizeof c->name, "%s %s%s %s", f->quant && c->ue8m0 ? "fp8-ue8m0" : f->name,
             LAYOUT_NAMES[layout], c->bias ? "+bias" : "", a->name);
    snprintf(c->sizes, sizeof c->sizes, "T=%lld E=%lld k=%lld H=%lld I=%lld x=%s ids=%s", (long long)c->T,
             (long long)c->E, (long long)c->k, (long long)c->H, (long long)c->I, moex_dtype_name(c->xdt),
             moex_dtype_name(c->id_dt));

    const uint64_t seed = 0xB0A5 + (uint64_t)n * 7919 + (uint64_t)format_i;
    ref_layer_spec s = {c->E, c->H, c->I, c->k, a->gated, layout == INTERLEAVED, layout == TRANSPOSED, c->bias,
                        a->act, 1.702f, a->act >= MOEX_ACT_GPTOSS_CLAMP ? CLAMP_LIMIT : 7.0f,
                        f->quant ? MOEX_F32 : f->dt};
    ref_layer_build(&c->L, &s, seed);
    c->desc = c->L.desc;
    if (f->quant) {
        moex_quant_format qf = c->ue8m0 ? MOEX_QUANT_FP8_UE8M0 : f->qf;
        int64_t bn = qf == MOEX_QUANT_FP4 ? 1 : fp8_block[0], bk = qf == MOEX_QUANT_FP4 ? 32 : fp8_block[1];
        quantize_into(&c->L.desc.gate_up, qf, bn, bk, &c->q[0], &c->q[1], &c->desc.gate_up, &c->desc.gate_up_scale);
        quantize_into(&c->L.desc.down, qf, bn, bk, &c->q[2], &c->q[3], &c->desc.down, &c->desc.down_scale);
        c->desc.block_n = bn;
        c->desc.block_k = bk;
        c->desc.activation_scheme = MOEX_ACT_SCHEME_DYNAMIC;
    }

    /* inputs and the reference */
    ref_rng r;
    ref_rng_seed(&r, seed ^ 0x5EEDull);
    const int64_t T = c->T, H = c->H, k = c->k;
    c->x = calloc((size_t)(T * H), 4);
    c->ids = calloc((size_t)(T * k), 8);
    c->w = calloc((size_t)(T * k), 4);
    c->want = calloc((size_t)(T * H), sizeof(double));
    ref_fill_random(c->x, c->xdt, T * H, 1.0, &r);
    ref_random_routing(&r, T, c->E, k, c->id_dt, c->ids, MOEX_F32, c->w, 0.1);
    c->zero_rows = T >= 3;
    if (c->zero_rows)
        for (int64_t j = 0; j < k; j++) {
            ref_store(c->ids, c->id_dt, j, -1.0);
            ref_store(c->ids, c->id_dt, k + j, (double)c->E);
        }
    int64_t xs[2] = {T, H}, is[2] = {T, k};
    c->tx = ref_tensor(c->x, c->xdt, 2, xs);
    c->tids = ref_tensor(c->ids, c->id_dt, 2, is);
    c->tw = ref_tensor(c->w, MOEX_F32, 2, is);
    ref_experts_forward(&c->desc, &c->tx, &c->tids, &c->tw, c->want);
    ref_round_all(c->want, T * H, c->xdt);
}

static void xcase_free(xcase *c) {
    ref_layer_destroy(&c->L);
    for (int i = 0; i < 4; i++) free(c->q[i]);
    free(c->x), free(c->ids), free(c->w), free(c->want);
}

/* ---- the case's layer on a device ------------------------------------------------------------- */

/* The description of c's layer with every weight copied to pl's device; per_expert: E separate
 * matrices (and scale grids) per projection. */
static moex_experts_desc place_layer(pool *pl, const xcase *c) {
    moex_experts_desc d = c->desc;
    d.gate_up_bias = place_tensor(pl, c->desc.gate_up_bias);
    d.down_bias = place_tensor(pl, c->desc.down_bias);
    if (c->layout != PER_EXPERT) {
        d.gate_up = place_tensor(pl, c->desc.gate_up);
        d.down = place_tensor(pl, c->desc.down);
        d.gate_up_scale = place_tensor(pl, c->desc.gate_up_scale);
        d.down_scale = place_tensor(pl, c->desc.down_scale);
        return d;
    }
    const int64_t E = c->E, I = c->I, gated = c->desc.gated, R = gated ? 2 * I : I;
    const moex_tensor *gu = &c->desc.gate_up, *dn = &c->desc.down;
    const size_t gu_e = tensor_bytes(gu) / (size_t)E, dn_e = tensor_bytes(dn) / (size_t)E, row = gu_e / (size_t)R;
    void **g = gated ? host_array(pl, E) : NULL, **u = host_array(pl, E), **dw = host_array(pl, E);
    const int quant = FORMATS[c->format].quant;
    void **gs = quant && gated ? host_array(pl, E) : NULL, **us = quant ? host_array(pl, E) : NULL;
    void **ds = quant ? host_array(pl, E) : NULL;
    if (!pl->ok) return d;
    for (int64_t e = 0; e < E; e++) {
        const char *base = (const char *)gu->data + (size_t)e * gu_e;
        if (gated) g[e] = place(pl, base, (size_t)I * row);
        u[e] = place(pl, base + (gated ? (size_t)I * row : 0), (size_t)I * row);
        dw[e] = place(pl, (const char *)dn->data + (size_t)e * dn_e, dn_e);
        if (quant) { /* the grids: [ceil(R/bn), sk] per expert, gate rows first (I is a multiple of bn) */
            const moex_tensor *s = &c->desc.gate_up_scale, *sd = &c->desc.down_scale;
            const size_t s_e = tensor_bytes(s) / (size_t)E, s_row = s_e / (size_t)s->shape[1];
            const size_t gate_rows = (size_t)(I / c->desc.block_n), sd_e = tensor_bytes(sd) / (size_t)E;
            const char *sbase = (const char *)s->data + (size_t)e * s_e;
            if (gated) gs[e] = place(pl, sbase, gate_rows * s_row);
            us[e] = gated ? place(pl, sbase + gate_rows * s_row, s_e - gate_rows * s_row) : place(pl, sbase, s_e);
            ds[e] = place(pl, (const char *)sd->data + (size_t)e * sd_e, sd_e);
        }
    }
    d.gate_up = ref_tensor_absent();
    d.down = ref_tensor_absent();
    d.gate_up_scale = ref_tensor_absent();
    d.down_scale = ref_tensor_absent();
    d.expert_gate = (const void *const *)g;
    d.expert_up = (const void *const *)u;
    d.expert_down = (const void *const *)dw;
    d.expert_dtype = gu->dtype;
    d.expert_device = pl->dev;
    if (quant) {
        d.expert_gate_scale = (const void *const *)gs;
        d.expert_up_scale = (const void *const *)us;
        d.expert_down_scale = (const void *const *)ds;
        d.expert_scale_dtype = c->desc.gate_up_scale.dtype;
    }
    return d;
}

/* ---- running ---------------------------------------------------------------------------------- */

/* Expert parallelism: layers with a multiple of EP_RANKS experts also run in a group of EP_RANKS
 * ranks in one process on the same device (on a GPU, EP_RANKS contexts sharing it), rank r
 * holding experts [r E/3, (r+1) E/3) (weights, scales and biases of its share), rank 0 the first
 * half of the tokens, rank 1 the rest, rank 2 none. */
#define EP_RANKS 3
static tally g_tally_ep[MAX_BACKENDS][MAX_DEVICES];

/* Rows [t0, t0 + n) of a view (host or device memory alike: only its pointer moves). */
static moex_tensor rows_of(moex_tensor t, int64_t t0, int64_t n) {
    t.data = (char *)t.data + (size_t)(t0 * t.strides[0]) * moex_dtype_size(t.dtype);
    t.shape[0] = n;
    return t;
}

typedef struct device_run {
    moex_device dev;
    char name[16];
    moex_context *ctx;
} device_run;

/* The layer d of case c, placed on dv's device with the inputs tx, tids, tw and room for the
 * output (out_dev, T x H of the hidden dtype), through backend be in a group of EP_RANKS ranks;
 * poison and back: run_case's host buffers of the output's size (NaN, and the copy read back). */
static void run_case_ep(const xcase *c, const moex_experts_desc *d, const moex_tensor *tx, const moex_tensor *tids,
                        const moex_tensor *tw, int b, const char *be, const device_run *dv, int di, void *out_dev,
                        const unsigned char *poison, unsigned char *back) {
    const int64_t per = c->E / EP_RANKS, T = c->T, H = c->H, half = T / 2;
    const int64_t t0[EP_RANKS] = {0, half, T}, n[EP_RANKS] = {half, T - half, 0};
    const size_t out_bytes = (size_t)(T * H) * moex_dtype_size(c->xdt);
    tally *ty = &g_tally_ep[b][di];
    moex_tensor tout = rows_of(*tx, 0, T);
    tout.data = out_dev;
    tout.device = dv->dev;
    moex_ep_group *g[EP_RANKS] = {NULL};
    ep_rank_job r[EP_RANKS];
    memset(r, 0, sizeof r);
    moex_status st = moex_memcpy(out_dev, dv->dev, poison, HOST, out_bytes);
    if (!st) st = moex_ep_local_groups(EP_RANKS, g);
    char why[512] = "";
    for (int i = 0; i < EP_RANKS && !st; i++) {
        moex_experts_desc s = ref_layer_share(d, i * per, per);
        moex_context_options o = moex_context_default_options();
        o.device = dv->dev;
        o.max_tokens = MAX_T;
        o.num_threads = 1;
        o.ep_group = g[i];
        if (!(st = moex_layer_create(&s, &r[i].layer)) && !(st = moex_backend_supports(be, r[i].layer, dv->dev, why, sizeof why)) &&
            !(st = moex_context_create(&o, &r[i].ctx)))
            st = moex_prepare(r[i].ctx, r[i].layer, be);
        r[i].backend = be;
        r[i].hidden = rows_of(*tx, t0[i], n[i]);
        r[i].ids = rows_of(*tids, t0[i], n[i]);
        r[i].weights = rows_of(*tw, t0[i], n[i]);
        r[i].out = rows_of(tout, t0[i], n[i]);
    }
    if (st == MOEX_ERR_UNSUPPORTED) goto done; /* counted as a skip by the one-rank run */
    if (st) {
        printf("FAIL %s %s ep=%d %s %s: setup: %s\n", be, dv->name, EP_RANKS, c->name, c->sizes, moex_last_error());
        ty->failed++;
        goto done;
    }
    ep_run_ranks(r, EP_RANKS);
    for (int i = 0; i < EP_RANKS; i++) {
        if (!r[i].st) r[i].st = moex_context_synchronize(r[i].ctx);
        if (r[i].st) {
            printf("FAIL %s %s ep=%d %s %s: rank %d: %s\n", be, dv->name, EP_RANKS, c->name, c->sizes, i,
                   r[i].msg[0] ? r[i].msg : moex_last_error());
            ty->failed++;
            goto done;
        }
    }
    if ((st = moex_memcpy(back, HOST, tout.data, dv->dev, out_bytes))) {
        printf("FAIL %s %s ep=%d %s %s: copying out back: %s\n", be, dv->name, EP_RANKS, c->name, c->sizes,
               moex_last_error());
        ty->failed++;
        goto done;
    }
    const double bound = FORMATS[c->format].quant ? NMSE_QUANT : float_bound(c->xdt);
    const double e = ref_nmse(back, c->xdt, T, H, H, c->want);
    if (e <= bound) {
        ty->passed++;
    } else {
        printf("FAIL %s %s ep=%d %s %s: NMSE %.3g > %.0e\n", be, dv->name, EP_RANKS, c->name, c->sizes, e, bound);
        ty->failed++;
    }
done:
    for (int i = 0; i < EP_RANKS; i++) {
        moex_context_free(r[i].ctx);
        moex_layer_free(r[i].layer);
        moex_ep_group_free(g[i]);
    }
}

/* c on device dv through every backend (or only `only`). */
static void run_case(const xcase *c, device_run *dv, int di, const char *only) {
    pool pl;
    memset(&pl, 0, sizeof pl);
    pl.dev = dv->dev;
    pl.ok = 1;
    moex_experts_desc d = place_layer(&pl, c);
    const int64_t T = c->T, H = c->H;
    const size_t out_bytes = (size_t)(T * H) * moex_dtype_size(c->xdt);
    unsigned char *poison = malloc(out_bytes), *back = malloc(out_bytes);
    memset(poison, 0xFF, out_bytes); /* NaN in every float dtype */
    moex_tensor tx = place_tensor(&pl, c->tx), tids = place_tensor(&pl, c->tids), tw = place_tensor(&pl, c->tw);
    moex_tensor tout = c->tx;
    tout.data = place(&pl, NULL, out_bytes);
    tout.device = dv->dev;
    void *ep_out = c->E % EP_RANKS == 0 ? place(&pl, NULL, out_bytes) : NULL; /* the groups' output */
    moex_layer *layer = NULL;
    if (!pl.ok || moex_layer_create(&d, &layer) != MOEX_OK) {
        printf("FAIL setup %s %s %s: %s\n", dv->name, c->name, c->sizes, pl.ok ? moex_last_error() : "placing the layer");
        g_failed_setup++;
        goto done;
    }
    const int nb = moex_backend_count();
    for (int b = 0; b < nb && b < MAX_BACKENDS; b++) {
        const char *be = moex_backend_name(b);
        if (only && strcmp(only, be) != 0) continue;
        tally *ty = &g_tally[b][di];
        char why[512] = "";
        moex_status st = moex_backend_supports(be, layer, dv->dev, why, sizeof why);
        if (st == MOEX_ERR_UNSUPPORTED) {
            printf("SKIP %s %s %s: %s\n", be, dv->name, c->name, why);
            ty->skipped++;
            continue;
        }
        if (st != MOEX_OK) {
            printf("FAIL %s %s %s %s: supports: %s: %s\n", be, dv->name, c->name, c->sizes, moex_status_str(st),
                   moex_last_error());
            ty->failed++;
            continue;
        }
        st = moex_memcpy(tout.data, dv->dev, poison, HOST, out_bytes);
        if (!st && (st = moex_prepare(dv->ctx, layer, be)) == MOEX_ERR_UNSUPPORTED &&
            strstr(moex_last_error(), "expert-parallel group: this context has none")) { /* a group's backend */
            printf("SKIP %s %s %s: %s\n", be, dv->name, c->name, moex_last_error());
            ty->skipped++;
            if (ep_out) run_case_ep(c, &d, &tx, &tids, &tw, b, be, dv, di, ep_out, poison, back);
            continue;
        }
        if (!st) st = moex_experts_forward(dv->ctx, layer, be, &tx, &tids, &tw, &tout);
        if (!st) st = moex_context_synchronize(dv->ctx);
        if (!st) st = moex_memcpy(back, HOST, tout.data, dv->dev, out_bytes);
        if (st) {
            printf("FAIL %s %s %s %s: %s: %s\n", be, dv->name, c->name, c->sizes, moex_status_str(st), moex_last_error());
            ty->failed++;
            continue;
        }
        const double bound = FORMATS[c->format].quant ? NMSE_QUANT : float_bound(c->xdt);
        const double e = ref_nmse(back, c->xdt, T, H, H, c->want);
        int ok = e <= bound;
        if (!ok)
            printf("FAIL %s %s %s %s: NMSE %.3g > %.0e\n", be, dv->name, c->name, c->sizes, e, bound);
        for (int64_t t = 0; ok && c->zero_rows && t < 2; t++)
            for (int64_t h = 0; h < H; h++)
                if (ref_load(back, c->xdt, t * H + h) != 0.0) {
                    printf("FAIL %s %s %s %s: token %lld routed to %s only: out[%lld, %lld] = %g, want 0\n", be,
                           dv->name, c->name, c->sizes, (long long)t, t ? "E" : "-1", (long long)t, (long long)h,
                           ref_load(back, c->xdt, t * H + h));
                    ok = 0;
                    break;
                }
        if (ok) ty->passed++;
        else ty->failed++;
        if (ep_out) run_case_ep(c, &d, &tx, &tids, &tw, b, be, dv, di, ep_out, poison, back);
    }
done:
    moex_layer_free(layer);
    pool_free(&pl);
    free(poison);
    free(back);
}

int main(int argc, char **argv) {
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-b") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [-b BACKEND]\n(\"%s\" not understood)\n", argv[0], argv[i]);
            return 2;
        }
    }
    setenv("MOEX_MEGAMOE_PIECE_ROWS", "5", 0);
    if (only && moex_backend_lookup(only) != MOEX_OK) {
        fprintf(stderr, "backend_ops: %s\n", moex_last_error());
        return 2;
    }
    /* the devices present */
    device_run devs[MAX_DEVICES];
    int nd = 0;
    const moex_device kinds[MAX_DEVICES] = {{MOEX_DEVICE_CPU, 0}, {MOEX_DEVICE_CUDA, 0}};
    for (int i = 0; i < MAX_DEVICES; i++) {
        moex_device_info info;
        if (moex_device_query(kinds[i], &info) != MOEX_OK || !info.available) {
            printf("backend_ops: %s not used: %s\n", i ? "cuda:0" : "cpu", info.reason);
            continue;
        }
        moex_context_options o = moex_context_default_options();
        o.device = kinds[i];
        o.max_tokens = MAX_T;
        if (kinds[i].kind == MOEX_DEVICE_CPU) o.num_threads = 2;
        device_run *dv = &devs[nd];
        dv->dev = kinds[i];
        snprintf(dv->name, sizeof dv->name, "%s", i ? "cuda:0" : "cpu");
        if (moex_context_create(&o, &dv->ctx) != MOEX_OK) {
            printf("FAIL %s: moex_context_create: %s\n", dv->name, moex_last_error());
            g_failed_setup++;
            continue;
        }
        nd++;
    }
    /* the cases: every (format, layout, activation) that makes a layer, a size each in turn */
    int n = 0, cases = 0;
    for (int f = 0; f < N_FORMATS; f++)
        for (int l = 0; l < N_LAYOUTS; l++)
            for (int a = 0; a < N_ACTS; a++) {
                if (l == INTERLEAVED && !ACTS[a].gated) continue;      /* interleaving is of gate and up */
                if (l == TRANSPOSED && FORMATS[f].quant) continue;     /* quantized weights: [E, out, in] only */
                xcase c;
                xcase_build(&c, f, l, a, n++);
                for (int d = 0; d < nd; d++) run_case(&c, &devs[d], d, only);
                xcase_free(&c);
                cases++;
            }
    /* totals */
    int passed = 0, skipped = 0, failed = g_failed_setup;
    printf("\nbackend_ops: %d cases, each on every backend and device\n", cases);
    printf("%-18s %-8s %7s %8s %7s\n", "backend", "device", "passed", "skipped", "failed");
    const int nb = moex_backend_count();
    for (int b = 0; b < nb && b < MAX_BACKENDS; b++)
        for (int d = 0; d < nd; d++) {
            const tally *t = &g_tally[b][d];
            if (only && strcmp(only, moex_backend_name(b)) != 0) continue;
            printf("%-18s %-8s %7d %8d %7d\n", moex_backend_name(b), devs[d].name, t->passed, t->skipped, t->failed);
            passed += t->passed, skipped += t->skipped, failed += t->failed;
            t = &g_tally_ep[b][d];
            if (!(t->passed + t->failed)) continue;
            char ep_name[32];
            snprintf(ep_name, sizeof ep_name, "%s ep=%d", devs[d].name, EP_RANKS);
            printf("%-18s %-8s %7d %8s %7d\n", moex_backend_name(b), ep_name, t->passed, "", t->failed);
            passed += t->passed, failed += t->failed;
        }
    printf("backend_ops: %d passed, %d skipped, %d failed\n", passed, skipped, failed);
    for (int d = 0; d < nd; d++) moex_context_free(devs[d].ctx);
    return failed ? 1 : 0;
}
