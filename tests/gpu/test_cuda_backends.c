/*
 * test_cuda_backends.c — the CUDA experts backends (every registered backend whose
 * supports() takes the GPU: eager, batched_mm, grouped_mm, deepgemm today) against the float64
 * reference of tests/reference.c, through the public API only. Plain C (no test framework), so that it builds wherever
 * the library builds with CUDA.
 *
 *   - sizes of tests/test_experts.c (small product, every layout x activation,
 *     the larger odd/aligned list) plus T in {1, 2, 7, 64, 300}, a tensor-core
 *     sized case (E=64 H=512 I=384 k=6 T=1500) and an aligned one (E=16 H=256
 *     I=128 k=4 T=512), in f32, f16 and bf16
 *   - the streamed kernels on tensor cores (bf16/f16, E=40 H=160 I=96 k=2,
 *     1 to 30 rows per expert)
 *   - FP8 experts (e4m3, f32 or ue8m0 block scales; 128 x 128 and 16 x 64 blocks,
 *     partial ones; E=16 H=336 I=208 k=4, T 1 to 300, every token on one expert)
 *     against the reference with the same quantization (NMSE 1e-4), and in graph replay
 *   - FP4 experts (e2m1, ue8m0 scales per row per 32 inputs; E=16 H=352 I=224 k=4, T 1 to
 *     300, each layout the GPU takes, GPT-OSS's clamp) the same way, batched_mm and grouped_mm
 *     both required to take them; sizes that are not multiples of 32 refused, naming them
 *   - the per-expert pointer layout (arrays of device pointers)
 *   - sentinel ids (-1 and E), all-sentinel tokens (exact zeros), T == 0
 *   - output poisoned with NaN bytes before every forward, guard bytes after it
 *   - bad input: host tensors on a CUDA context, T > max_tokens, bad shapes and
 *     dtypes (rejected on the host, `out` untouched), ids outside [-1, E]
 *     (forward queued, moex_context_synchronize reports them), graph capture on
 *     a CPU context
 *   - graph capture and replay with new routings written into the same buffers,
 *     against the reference and bitwise against an uncaptured forward
 *   - determinism: two forwards, bitwise equal outputs
 *   - deepgemm (bf16 and FP8 layers): beside grouped_mm bit for bit in both of its layouts
 *     (masked, contiguous), narrow and wide tiles, odd sizes, a hot expert, sentinel rows, the
 *     layout predicate's bound moved both ways, SM100's scale rule (through
 *     MOEX_DEEPGEMM_ASSUME_CC); its kernels' disk cache seen from a second run of this program
 *     (entries written, then read, an entry cut short rebuilt): MOEX_CACHE_DIR is a fresh
 *     directory of this run unless set
 *   - sonicmoe's pair kernel (both projections in one block, h in shared memory): E of one and
 *     two waves of the device's SMs, a hot expert (the chained GEMMs after it run instead)
 *
 * NMSE bounds (SPEC "Numerical agreement"): f32 1e-10, f16 1e-6, bf16 1e-4.
 *
 * Usage: test_cuda_backends [--quick] [--device N]
 *   --quick (or MOEX_GPU_TEST_QUICK=1): a small subset, for memory checkers;
 *   MOEX_GPU_TEST_ONLY=fp4,graph_replay: only the tests named.
 * Exit status: 0 all passed, 1 a check failed, 77 no usable CUDA device (skip).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* mkdtemp, truncate */

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu_harness.h"
#include "moex.h"
#include "layouts.h"
#include "reference.h"
#include "backend_list.h"

/* ------------------------------------------------------------------------ */
/* checks                                                                    */
/* ------------------------------------------------------------------------ */

#define EXIT_SKIP 77

static moex_device g_dev = {MOEX_DEVICE_CUDA, 0};
static const moex_device HOST = {MOEX_DEVICE_CPU, 0};

/* A failed setup step: report and return from the current function. */
#define REQUIRE(cond, ret, ...)                           \
    do {                                                  \
        g_checks++;                                       \
        if (!(cond)) {                                    \
            fail_at(__FILE__, __LINE__, __VA_ARGS__);     \
            return ret;                                   \
        }                                                 \
    } while (0)

/* case-insensitive: does hay contain needle? */
static int contains(const char *hay, const char *needle) {
    if (!hay || !needle) return 0;
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && (p[i] | 32) == (needle[i] | 32)) i++;
        if (i == n) return 1;
    }
    return n == 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* tables (as tests/test_experts.c)                                          */
/* ------------------------------------------------------------------------ */

/* The backends run: every registered one whose supports() takes the GPU (backend_list.h), found
 * in main(); a case skips those that refuse its layer. */
static const char *BACKENDS[BACKEND_LIST_MAX];
static int N_BACKENDS;

/* ------------------------------------------------------------------------ */
/* device memory                                                             */
/* ------------------------------------------------------------------------ */

/* bytes on the GPU (NULL for 0 bytes); NULL and a failure on error */
static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) return NULL;
    moex_status st = moex_device_alloc(g_dev, bytes, &p);
    if (st != MOEX_OK || !p) {
        fail_at(__FILE__, __LINE__, "moex_device_alloc(%zu bytes): %s: %s", bytes, moex_status_str(st),
                moex_last_error());
        return NULL;
    }
    return p;
}

static void dev_free(void *p) {
    if (p) moex_device_free(g_dev, p);
}

/* host -> new device copy (NULL stays NULL) */
static void *dev_upload(const void *host, size_t bytes) {
    if (!host || bytes == 0) return NULL;
    void *d = dev_alloc(bytes);
    if (!d) return NULL;
    moex_status st = moex_memcpy(d, g_dev, host, HOST, bytes);
    if (st != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "moex_memcpy host->device (%zu bytes): %s", bytes, moex_last_error());
        dev_free(d);
        return NULL;
    }
    return d;
}

static int to_dev(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 1;
    moex_status st = moex_memcpy(dst, g_dev, src, HOST, bytes);
    if (st != MOEX_OK) fail_at(__FILE__, __LINE__, "moex_memcpy host->device: %s", moex_last_error());
    return st == MOEX_OK;
}

static int to_host(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 1;
    moex_status st = moex_memcpy(dst, HOST, src, g_dev, bytes);
    if (st != MOEX_OK) fail_at(__FILE__, __LINE__, "moex_memcpy device->host: %s", moex_last_error());
    return st == MOEX_OK;
}

static moex_tensor on_dev(moex_tensor t) {
    t.device = g_dev;
    return t;
}

/* ------------------------------------------------------------------------ */
/* one case                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct gcase {
    int64_t T, E, k, H, I;
    moex_dtype dt;
    int layout;
    moex_activation act;
    moex_dtype id_dt, w_dt;
    double sentinel_prob;
    int per_expert;      /* expert_gate/up/down arrays of device pointers */
    int sentinel_rows;   /* token 0 all -1, token 1 all E, token 2 mixed (when T >= 3) */
    int64_t hot_rows;    /* tokens 0 .. hot_rows-1 also route to expert 0 (one expert with many rows) */
    float limit;
    uint64_t seed;
    int fp8;             /* 1: e4m3 experts with f32 scales, 2: ue8m0 scales; block_n x block_k blocks;
                            3: FP4, e2m1 experts with ue8m0 scales, 1 x 32 blocks */
    int64_t block_n, block_k;
} gcase;

static const char *describe(const gcase *c, const char *backend) {
    static char buf[400];
    char q[64] = "";
    if (c->fp8)
        snprintf(q, sizeof q, " %s %lldx%lld", c->fp8 == 3 ? "fp4" : c->fp8 == 2 ? "fp8-ue8m0" : "fp8",
                 (long long)c->block_n, (long long)c->block_k);
    snprintf(buf, sizeof buf,
             "backend=%s T=%lld E=%lld k=%lld H=%lld I=%lld dtype=%s%s layout=%s%s act=%s ids=%s w=%s "
             "sentinels=%.2f%s hot=%lld limit=%g seed=%llu",
             backend ? backend : "-", (long long)c->T, (long long)c->E, (long long)c->k, (long long)c->H,
             (long long)c->I, dt_name(c->dt), q, LAYOUTS[c->layout].name, c->per_expert ? "(per-expert)" : "",
             ACT_NAMES[c->act], dt_name(c->id_dt), dt_name(c->w_dt), c->sentinel_prob,
             c->sentinel_rows ? "+rows" : "", (long long)c->hot_rows, (double)c->limit, (unsigned long long)c->seed);
    return buf;
}

/* The bound of a case: the float dtype's, or for FP8 and FP4 experts 1e-4 against the reference that
 * applies the same quantization (SPEC, docs/backends.md "Accuracy"). */
static double case_bound(const gcase *c) { return c->fp8 ? 1e-4 : nmse_bound(c->dt); }

static gcase gcase_make(int64_t T, int64_t E, int64_t k, int64_t H, int64_t I, moex_dtype dt, uint64_t seed) {
    gcase c;
    memset(&c, 0, sizeof c);
    c.T = T; c.E = E; c.k = k; c.H = H; c.I = I;
    c.dt = dt;
    c.act = MOEX_ACT_SILU;
    c.id_dt = MOEX_I32;
    c.w_dt = MOEX_F32;
    c.limit = 7.0f;
    c.seed = seed;
    return c;
}

/* The layer's weights on the GPU and a description pointing at them. */
typedef struct dev_layer {
    moex_experts_desc desc;
    void *gate_up, *down, *gate_up_bias, *down_bias, *gate_up_scale, *down_scale;
    void **eg, **eu, **ed; /* per-expert: host arrays of device pointers */
    int64_t E;
} dev_layer;

static void dev_layer_free(dev_layer *d) {
    dev_free(d->gate_up);
    dev_free(d->down);
    dev_free(d->gate_up_bias);
    dev_free(d->down_bias);
    dev_free(d->gate_up_scale);
    dev_free(d->down_scale);
    for (int64_t e = 0; e < d->E; e++) {
        if (d->eg) dev_free(d->eg[e]);
        if (d->eu) dev_free(d->eu[e]);
        if (d->ed) dev_free(d->ed[e]);
    }
    free(d->eg);
    free(d->eu);
    free(d->ed);
    memset(d, 0, sizeof *d);
}

/* Rows [r0, r0+rows) of expert e of a stacked [E, R, C] tensor (transposed: [E, C, R]) as a new
 * row-major [rows, C] (transposed: [C, rows]) host matrix. */
static void *copy_rows(const void *stacked, moex_dtype dt, int64_t e, int64_t R, int64_t C, int64_t r0,
                       int64_t rows, int transposed) {
    const size_t es = ref_dtype_size(dt);
    char *out = malloc((size_t)(rows * C) * es + 1);
    if (!out) return NULL;
    const char *src = (const char *)stacked + (size_t)(e * R * C) * es;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) {
            size_t from = transposed ? (size_t)(c * R + r0 + r) : (size_t)((r0 + r) * C + c);
            size_t to = transposed ? (size_t)(c * rows + r) : (size_t)(r * C + c);
            memcpy(out + to * es, src + from * es, es);
        }
    return out;
}

/* One host matrix of a per-expert split, uploaded; 0 on failure. */
static int upload_part(void **slot, const void *stacked, moex_dtype dt, int64_t e, int64_t R, int64_t C,
                       int64_t r0, int64_t rows, int transposed) {
    void *h = copy_rows(stacked, dt, e, R, C, r0, rows, transposed);
    if (!h) return 0;
    *slot = dev_upload(h, (size_t)(rows * C) * ref_dtype_size(dt));
    free(h);
    return *slot != NULL;
}

static size_t view_bytes(const moex_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n * (t->dtype == MOEX_E4M3 || t->dtype == MOEX_E2M1X2 || t->dtype == MOEX_UE8M0 ? 1
                                                                                          : ref_dtype_size(t->dtype));
}

/* A device copy of host tensor *t, and the view of it; 0 on failure. */
static int upload_view(void **slot, moex_tensor *t) {
    *slot = dev_upload(t->data, view_bytes(t));
    if (!*slot) return 0;
    t->data = *slot;
    t->device = g_dev;
    return 1;
}

/* host layer L (desc: L's, or its FP8 form) -> *d on the GPU; 1 on success */
static int dev_layer_make(dev_layer *d, const ref_layer *L, const moex_experts_desc *desc, const gcase *c) {
    const layout *lay = &LAYOUTS[c->layout];
    const size_t es = ref_dtype_size(L->desc.gate_up.dtype);
    const int64_t E = c->E, H = c->H, I = c->I, R = lay->gated ? 2 * I : I;
    memset(d, 0, sizeof *d);
    d->desc = *desc;
    if (c->fp8) /* stacked: codes, scales and the f32 biases */
        return upload_view(&d->gate_up, &d->desc.gate_up) && upload_view(&d->down, &d->desc.down) &&
               upload_view(&d->gate_up_scale, &d->desc.gate_up_scale) &&
               upload_view(&d->down_scale, &d->desc.down_scale) &&
               (!lay->bias || (upload_view(&d->gate_up_bias, &d->desc.gate_up_bias) &&
                               upload_view(&d->down_bias, &d->desc.down_bias)));
    if (lay->bias) {
        d->gate_up_bias = dev_upload(L->gate_up_bias, (size_t)(E * R) * es);
        d->down_bias = dev_upload(L->down_bias, (size_t)(E * H) * es);
        if (!d->gate_up_bias || !d->down_bias) return 0;
        d->desc.gate_up_bias.data = d->gate_up_bias;
        d->desc.gate_up_bias.device = g_dev;
        d->desc.down_bias.data = d->down_bias;
        d->desc.down_bias.device = g_dev;
    }
    if (!c->per_expert) {
        d->gate_up = dev_upload(L->gate_up, (size_t)(E * R * H) * es);
        d->down = dev_upload(L->down, (size_t)(E * H * I) * es);
        if (!d->gate_up || !d->down) return 0;
        d->desc.gate_up.data = d->gate_up;
        d->desc.gate_up.device = g_dev;
        d->desc.down.data = d->down;
        d->desc.down.device = g_dev;
        return 1;
    }
    d->E = E;
    d->eg = calloc((size_t)E, sizeof(void *));
    d->eu = calloc((size_t)E, sizeof(void *));
    d->ed = calloc((size_t)E, sizeof(void *));
    if (!d->eg || !d->eu || !d->ed) return 0;
    for (int64_t e = 0; e < E; e++) {
        if (lay->gated && !upload_part(&d->eg[e], L->gate_up, c->dt, e, R, H, 0, I, lay->transposed)) return 0;
        if (!upload_part(&d->eu[e], L->gate_up, c->dt, e, R, H, lay->gated ? I : 0, I, lay->transposed)) return 0;
        if (!upload_part(&d->ed[e], L->down, c->dt, e, H, I, 0, H, lay->transposed)) return 0;
    }
    d->desc.gate_up = ref_tensor_absent();
    d->desc.down = ref_tensor_absent();
    d->desc.expert_gate = lay->gated ? (const void *const *)d->eg : NULL;
    d->desc.expert_up = (const void *const *)d->eu;
    d->desc.expert_down = (const void *const *)d->ed;
    d->desc.expert_dtype = c->dt;
    d->desc.expert_device = g_dev;
    return 1;
}

/* A case made ready: host layer, inputs and reference; device copies. */
typedef struct grun {
    gcase c;
    ref_layer L;
    moex_experts_desc qdesc;          /* FP8: L quantized (host), the reference's layer */
    void *q[4];                       /* FP8: gate_up codes, scales, down codes, scales (host) */
    dev_layer D;
    void *hidden, *ids, *weights;     /* host */
    void *d_hidden, *d_ids, *d_weights;/* device */
    void *d_out;                       /* device: [T, H] + GUARD */
    size_t out_bytes;
    unsigned char *out_host;           /* [T, H] + GUARD */
    double *ref;                       /* [T, H] */
    moex_tensor th, tids, tw, tout;    /* device views */
} grun;

#define GUARD 256
#define GUARD_BYTE 0xA5
#define POISON_BYTE 0xFF /* NaN in f32, f16 and bf16 */

static void grun_free(grun *r) {
    ref_layer_destroy(&r->L);
    for (int i = 0; i < 4; i++) free(r->q[i]);
    dev_layer_free(&r->D);
    free(r->hidden);
    free(r->ids);
    free(r->weights);
    free(r->ref);
    free(r->out_host);
    dev_free(r->d_hidden);
    dev_free(r->d_ids);
    dev_free(r->d_weights);
    dev_free(r->d_out);
    memset(r, 0, sizeof *r);
}

/* The routing's special rows: token 0 all -1, token 1 all E, token 2 mixed; big weights on them. */
static void apply_sentinel_rows(grun *r) {
    const gcase *c = &r->c;
    for (int64_t t = 0; t < c->T && t < 3; t++)
        for (int64_t j = 0; j < c->k; j++) {
            int64_t id = t == 0 ? -1 : t == 1 ? c->E : ((j & 1) ? c->E : -1);
            ref_store(r->ids, c->id_dt, t * c->k + j, (double)id);
            ref_store(r->weights, c->w_dt, t * c->k + j, 1000.0);
        }
}

/* Tokens 0 .. hot_rows-1 route their first pair to expert 0; a later pair that already chose
 * expert 0 takes the first pair's old expert instead, so a token's experts stay distinct. */
static void apply_hot_expert(grun *r) {
    const gcase *c = &r->c;
    for (int64_t t = 0; t < c->T && t < c->hot_rows; t++) {
        const double first = ref_load(r->ids, c->id_dt, t * c->k);
        for (int64_t j = 1; j < c->k; j++)
            if (ref_load(r->ids, c->id_dt, t * c->k + j) == 0.0) ref_store(r->ids, c->id_dt, t * c->k + j, first);
        ref_store(r->ids, c->id_dt, t * c->k, 0.0);
    }
}

/* w (host, f32 [E, N, K]) quantized with bn x bk blocks into new host buffers: kind 1 e4m3 with
 * f32 scales, 2 e4m3 with ue8m0 scales, 3 e2m1 (two a byte, [E, N, K/2]) with ue8m0 scales. */
static int quantize_host(const moex_tensor *w, int kind, int64_t bn, int64_t bk, void **q, void **sc,
                         moex_tensor *tq, moex_tensor *ts) {
    const int64_t E = w->shape[0], N = w->shape[1], K = w->shape[2];
    const int fp4 = kind == 3;
    int64_t qs[3] = {E, N, fp4 ? K / 2 : K}, ss[3] = {E, (N + bn - 1) / bn, (K + bk - 1) / bk};
    *q = calloc((size_t)(E * N * qs[2]) + 1, 1);
    *sc = calloc((size_t)(ss[0] * ss[1] * ss[2]) + 1, 4);
    if (!*q || !*sc) return 0;
    *tq = ref_tensor(*q, fp4 ? MOEX_E2M1X2 : MOEX_E4M3, 3, qs);
    *ts = ref_tensor(*sc, kind >= 2 ? MOEX_UE8M0 : MOEX_F32, 3, ss);
    moex_status st = moex_quantize(w, fp4 ? MOEX_QUANT_FP4 : kind == 2 ? MOEX_QUANT_FP8_UE8M0 : MOEX_QUANT_FP8, bn, bk,
                                   tq, ts);
    if (st) fail_at(__FILE__, __LINE__, "moex_quantize: %s", moex_last_error());
    return st == MOEX_OK;
}

/* c -> *r; 1 on success (on failure r is freed) */
static int grun_setup(grun *r, const gcase *c) {
    memset(r, 0, sizeof *r);
    r->c = *c;
    const layout *lay = &LAYOUTS[c->layout];
    ref_layer_spec s = {c->E, c->H, c->I, c->k, lay->gated, lay->interleaved, lay->transposed,
                        lay->bias, c->act, 1.702f, c->limit, c->fp8 ? MOEX_F32 : c->dt};
    ref_layer_build(&r->L, &s, c->seed);
    r->qdesc = r->L.desc;
    if (c->fp8) { /* FP8 or FP4 experts quantized from the f32 layer; hidden and out in c->dt */
        moex_experts_desc *q = &r->qdesc;
        if (!quantize_host(&r->L.desc.gate_up, c->fp8, c->block_n, c->block_k, &r->q[0], &r->q[1], &q->gate_up,
                           &q->gate_up_scale) ||
            !quantize_host(&r->L.desc.down, c->fp8, c->block_n, c->block_k, &r->q[2], &r->q[3], &q->down,
                           &q->down_scale)) {
            fail_at(__FILE__, __LINE__, "quantizing the layer failed [%s]", describe(c, NULL));
            grun_free(r);
            return 0;
        }
        q->block_n = c->block_n, q->block_k = c->block_k;
        q->activation_scheme = MOEX_ACT_SCHEME_DYNAMIC;
    }
    const size_t es = ref_dtype_size(c->dt);
    const size_t xb = (size_t)(c->T * c->H) * es, ib = (size_t)(c->T * c->k) * ref_dtype_size(c->id_dt);
    const size_t wb = (size_t)(c->T * c->k) * ref_dtype_size(c->w_dt);
    r->hidden = calloc(xb + 1, 1);
    r->ids = calloc(ib + 1, 1);
    r->weights = calloc(wb + 1, 1);
    r->ref = calloc((size_t)(c->T * c->H) + 1, sizeof(double));
    r->out_bytes = xb;
    r->out_host = malloc(xb + GUARD);
    if (!r->hidden || !r->ids || !r->weights || !r->ref || !r->out_host) {
        fail_at(__FILE__, __LINE__, "out of host memory [%s]", describe(c, NULL));
        grun_free(r);
        return 0;
    }
    ref_rng rng;
    ref_rng_seed(&rng, c->seed ^ 0xABCDEFull);
    ref_fill_random(r->hidden, c->dt, c->T * c->H, 1.0, &rng);
    ref_random_routing(&rng, c->T, c->E, c->k, c->id_dt, r->ids, c->w_dt, r->weights, c->sentinel_prob);
    if (c->hot_rows) apply_hot_expert(r);
    if (c->sentinel_rows) apply_sentinel_rows(r);
    moex_tensor hx = ref_tensor_2d(r->hidden, c->dt, c->T, c->H, c->H);
    moex_tensor hid = ref_tensor_2d(r->ids, c->id_dt, c->T, c->k, c->k);
    moex_tensor hw = ref_tensor_2d(r->weights, c->w_dt, c->T, c->k, c->k);
    ref_experts_forward(&r->qdesc, &hx, &hid, &hw, r->ref);

    if (!dev_layer_make(&r->D, &r->L, &r->qdesc, c)) {
        fail_at(__FILE__, __LINE__, "uploading the layer failed [%s]", describe(c, NULL));
        grun_free(r);
        return 0;
    }
    r->d_hidden = dev_upload(r->hidden, xb);
    r->d_ids = dev_upload(r->ids, ib);
    r->d_weights = dev_upload(r->weights, wb);
    r->d_out = dev_alloc(xb + GUARD);
    if ((xb && (!r->d_hidden || !r->d_ids || !r->d_weights)) || !r->d_out) {
        fail_at(__FILE__, __LINE__, "uploading the inputs failed [%s]", describe(c, NULL));
        grun_free(r);
        return 0;
    }
    r->th = on_dev(ref_tensor_2d(r->d_hidden, c->dt, c->T, c->H, c->H));
    r->tids = on_dev(ref_tensor_2d(r->d_ids, c->id_dt, c->T, c->k, c->k));
    r->tw = on_dev(ref_tensor_2d(r->d_weights, c->w_dt, c->T, c->k, c->k));
    r->tout = on_dev(ref_tensor_2d(r->d_out, c->dt, c->T, c->H, c->H));
    return 1;
}

/* Fill the device output with NaN bytes and the guard after it with GUARD_BYTE. */
static int poison_out(grun *r) {
    memset(r->out_host, POISON_BYTE, r->out_bytes);
    memset(r->out_host + r->out_bytes, GUARD_BYTE, GUARD);
    return to_dev(r->d_out, r->out_host, r->out_bytes + GUARD);
}

static int fetch_out(grun *r) {
    return to_host(r->out_host, r->d_out, r->out_bytes + GUARD);
}

static int guard_ok(const grun *r) {
    for (size_t i = 0; i < GUARD; i++)
        if (r->out_host[r->out_bytes + i] != GUARD_BYTE) return 0;
    return 1;
}

/* 1 if out (host copy) is bytewise still the poison */
static int out_untouched(const grun *r) {
    for (size_t i = 0; i < r->out_bytes; i++)
        if (r->out_host[i] != POISON_BYTE) return 0;
    return guard_ok(r);
}

static moex_context *make_ctx(int64_t max_tokens) {
    moex_context_options o = moex_context_default_options();
    o.device = g_dev;
    o.max_tokens = max_tokens > 0 ? max_tokens : 1;
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&o, &ctx);
    if (st != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "moex_context_create(cuda:%d, max_tokens=%lld): %s: %s", g_dev.index,
                (long long)o.max_tokens, moex_status_str(st), moex_last_error());
        return NULL;
    }
    return ctx;
}

/* poison, forward, synchronize, fetch: 1 if all worked (failures reported) */
static int run_forward(grun *r, moex_context *ctx, moex_layer *layer, const char *be) {
    if (!poison_out(r)) return 0;
    moex_status st = moex_experts_forward(ctx, layer, be, &r->th, &r->tids, &r->tw, &r->tout);
    if (st != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "forward: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                describe(&r->c, be));
        return 0;
    }
    st = moex_context_synchronize(ctx);
    if (st != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "synchronize after forward: %s: %s [%s]", moex_status_str(st),
                moex_last_error(), describe(&r->c, be));
        return 0;
    }
    if (!fetch_out(r)) return 0;
    if (!guard_ok(r)) {
        fail_at(__FILE__, __LINE__, "forward wrote past the end of out [%s]", describe(&r->c, be));
        return 0;
    }
    return 1;
}

/* The output's special rows: the all-sentinel tokens must be exact zeros. */
static void check_sentinel_rows(const grun *r, const char *be) {
    const gcase *c = &r->c;
    if (!c->sentinel_rows) return;
    for (int64_t t = 0; t < c->T && t < 3; t++)
        for (int64_t h = 0; h < c->H; h++) {
            double v = ref_load(r->out_host, c->dt, t * c->H + h);
            if (v != 0.0) {
                fail_at(__FILE__, __LINE__, "all-sentinel token %lld: out[%lld] = %g, want 0 [%s]", (long long)t,
                        (long long)h, v, describe(c, be));
                break;
            }
        }
}

static void check_nmse(const grun *r, const char *be) {
    const gcase *c = &r->c;
    double e = ref_nmse(r->out_host, c->dt, c->T, c->H, c->H, r->ref);
    CHECK(e <= case_bound(c), "NMSE %.3g > %.0e [%s]", e, case_bound(c), describe(c, be));
}

/* Every backend on one case, one context; determinism checked for `determinism` backends. */
static void run_case(const gcase *c, int determinism) {
    grun r;
    if (!grun_setup(&r, c)) return;
    moex_context *ctx = make_ctx(c->T);
    moex_layer *layer = NULL;
    moex_status st = moex_layer_create(&r.D.desc, &layer);
    CHECK(st == MOEX_OK, "moex_layer_create: %s: %s [%s]", moex_status_str(st), moex_last_error(),
          describe(c, NULL));
    unsigned char *first = determinism ? malloc(r.out_bytes + 1) : NULL;
    for (int b = 0; ctx && layer && b < N_BACKENDS; b++) {
        const char *be = BACKENDS[b];
        if (!backend_takes(be, layer, g_dev)) continue; /* refuses this layer */
        st = moex_prepare(ctx, layer, be);
        if (st != MOEX_OK) {
            fail_at(__FILE__, __LINE__, "prepare: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                    describe(c, be));
            continue;
        }
        if (!run_forward(&r, ctx, layer, be)) continue;
        if (c->T == 0) {
            CHECK(guard_ok(&r), "T=0 wrote something [%s]", describe(c, be));
            continue;
        }
        check_nmse(&r, be);
        check_sentinel_rows(&r, be);
        if (first) {
            memcpy(first, r.out_host, r.out_bytes);
            if (run_forward(&r, ctx, layer, be))
                CHECK(memcmp(first, r.out_host, r.out_bytes) == 0,
                      "two forwards with the same inputs differ bitwise [%s]", describe(c, be));
        }
    }
    free(first);
    moex_layer_free(layer);
    moex_context_free(ctx);
    grun_free(&r);
}

/* ------------------------------------------------------------------------ */
/* correctness                                                               */
/* ------------------------------------------------------------------------ */

/* T {0,1,3,17} x E {1,4} x k {1,2} x H {8,24} x I {8,24} x dtype, the layout/activation pair
 * rotating as in test_experts.c; every fourth case in the per-expert layout. */
static void test_small_product(void) {
    static const int64_t Ts[] = {0, 1, 3, 17}, Es[] = {1, 4}, ks[] = {1, 2}, Hs[] = {8, 24}, Is[] = {8, 24};
    int n = 0;
    for (int it = 0; it < 4; it++)
        for (int ie = 0; ie < 2; ie++)
            for (int ik = 0; ik < 2; ik++) {
                if (ks[ik] > Es[ie]) continue;
                for (int ih = 0; ih < 2; ih++)
                    for (int ii = 0; ii < 2; ii++)
                        for (int id = 0; id < 3; id++, n++) {
                            if (g_quick && n % 7 != 0) continue;
                            gcase c = gcase_make(Ts[it], Es[ie], ks[ik], Hs[ih], Is[ii], FLOAT_DTYPES[id],
                                                 1000u + (uint64_t)n);
                            pair p = pair_at(n % N_PAIRS);
                            c.layout = p.layout;
                            c.act = p.act;
                            c.id_dt = (n & 1) ? MOEX_I64 : MOEX_I32;
                            c.sentinel_prob = (n % 3 == 0) ? 0.2 : 0.0;
                            c.limit = (n & 2) ? 7.0f : 0.8f;
                            c.per_expert = (n % 4 == 3) && !LAYOUTS[c.layout].interleaved;
                            run_case(&c, 0);
                        }
            }
}

/* Every layout x activation x dtype at T=5, E=3, k=2, H=24, I=8; then again in the
 * per-expert layout (not interleaved). */
static void test_layouts_activations(void) {
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < N_PAIRS; i++) {
            if (g_quick && (i % 9 != 0 || d != 2)) continue;
            pair p = pair_at(i);
            gcase c = gcase_make(5, 3, 2, 24, 8, FLOAT_DTYPES[d], 77u + (uint64_t)(i * 3 + d));
            c.layout = p.layout;
            c.act = p.act;
            c.limit = 0.8f;
            c.id_dt = (i & 1) ? MOEX_I64 : MOEX_I32;
            run_case(&c, 0);
            if (!LAYOUTS[c.layout].interleaved && !g_quick) {
                c.per_expert = 1;
                c.seed += 100000u;
                run_case(&c, 0);
            }
        }
}

/* Token counts 1, 2, 7, 64, 300 at an odd size, every dtype, sentinels included. */
static void test_token_counts(void) {
    static const int64_t Ts[] = {1, 2, 7, 64, 300};
    for (int it = 0; it < 5; it++)
        for (int d = 0; d < 3; d++) {
            if (g_quick && it > 2) continue;
            gcase c = gcase_make(Ts[it], 13, 3, 72, 40, FLOAT_DTYPES[d], 2000u + (uint64_t)(it * 3 + d));
            c.sentinel_prob = 0.1;
            c.sentinel_rows = Ts[it] >= 3;
            c.id_dt = (it & 1) ? MOEX_I64 : MOEX_I32;
            c.w_dt = d == 0 ? MOEX_F32 : (it & 1) ? MOEX_BF16 : MOEX_F16;
            c.layout = it % 2;  /* with biases every other: a skipped expert adds no bias */
            run_case(&c, 0);
        }
}

/* The larger list of test_experts.c, the tensor-core case and the aligned case, every dtype. */
static void test_large(void) {
    static const struct {
        int64_t T, E, k, H, I;
        moex_dtype dt;
        int layout;
        moex_activation act;
    } L[] = {
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
        /* narrow tiles, several a block: 256 experts of 24 rows on average, 768 gate/up and 512
         * down tiles for about 132 blocks (the other cases give a block one tile or two) */
        {768, 256, 8, 384, 384, MOEX_BF16, 0, MOEX_ACT_SILU},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        if (g_quick && i != 3 && i != 9) continue;
        gcase c = gcase_make(L[i].T, L[i].E, L[i].k, L[i].H, L[i].I, L[i].dt, 5000u + i);
        c.layout = L[i].layout;
        c.act = L[i].act;
        c.limit = 1.5f;
        c.id_dt = (i & 1) ? MOEX_I32 : MOEX_I64;
        c.sentinel_prob = (i % 3 == 1) ? 0.05 : 0.0;
        run_case(&c, 0);
    }
    /* (also --quick) grouped_mm's bf16/f16 decode GEMMs in their band below the GEMMs
     * (GEMM_DECODE_MIN_AVG_ROWS_F16 to 16 rows an expert on average, hidden size under
     * GEMM_LONG_K): 57 tokens of 40 experts, top 9 (12.8 rows an expert), every token on expert 0
     * (57 rows: four row tiles of 16, the last partial), f16 with sentinels, bf16 with biases;
     * H 272 (a partial k-block) and I 384 */
    for (int d = 1; d < 3; d++) {
        gcase c = gcase_make(57, 40, 9, 272, 384, FLOAT_DTYPES[d], 6320u + (uint64_t)d);
        c.sentinel_prob = d == 1 ? 0.05 : 0.0;
        c.hot_rows = 57;
        c.layout = d == 1 ? 0 : 1;
        run_case(&c, 1);
    }
    if (g_quick) return;
    /* tensor-core sized (odd T, H and I multiples of 128 and not), and aligned */
    for (int d = 0; d < 3; d++) {
        gcase c = gcase_make(1500, 64, 6, 512, 384, FLOAT_DTYPES[d], 6000u + (uint64_t)d);
        c.sentinel_prob = 0.02;
        c.sentinel_rows = 1;
        c.w_dt = FLOAT_DTYPES[d];
        run_case(&c, 1);
        gcase a = gcase_make(512, 16, 4, 256, 128, FLOAT_DTYPES[d], 6100u + (uint64_t)d);
        a.layout = d == 2 ? 1 : 0;
        run_case(&a, 1);
        gcase p = a;  /* aligned, per-expert layout */
        p.per_expert = 1;
        p.seed += 50u;
        run_case(&p, 0);
    }
    /* the GEMM's overlapped epilogue (SiLU, no biases, over 128 rows per expert), with fewer
     * k-blocks than stages (H = 136: 3; I = 72: 2) and several tiles per block */
    for (int d = 1; d < 3; d++) {
        gcase c = gcase_make(2001, 8, 2, 136, 72, FLOAT_DTYPES[d], 6300u + (uint64_t)d);
        c.sentinel_prob = 0.03;
        run_case(&c, 1);
    }
    /* hidden size >= 4096 with 1 to 16 rows per expert: grouped_mm's tensor-core GEMM (the
     * long-k rule of grouped_gemm_pays), a last k-block of 8 columns, partial column tiles */
    for (int d = 1; d < 3; d++) {
        gcase c = gcase_make(19, 24, 2, 4104, 136, FLOAT_DTYPES[d], 6200u + (uint64_t)d);
        c.sentinel_prob = 0.05;
        c.layout = d == 2 ? 5 : 0;
        run_case(&c, 1);
    }
    /* 16 to 32 rows per expert on average: grouped_mm's GEMMs on narrow tiles (64 rows, each
     * warpgroup one half of the weight tile), one expert with a few hundred rows (several row
     * tiles), sentinels, partial column tiles */
    for (int d = 1; d < 3; d++) {
        gcase c = gcase_make(333, 40, 3, 264, 200, FLOAT_DTYPES[d], 6250u + (uint64_t)d);
        c.sentinel_prob = 0.03;
        c.hot_rows = 300;
        run_case(&c, 1);
    }
    /* decode sizes: qwen3-30b-a3b's experts at one token; 3 tokens with sentinels (one token all
     * -1, one all E), biases and interleaved gate/up */
    gcase q = gcase_make(1, 16, 8, 2048, 768, MOEX_BF16, 6300u);
    run_case(&q, 1);
    gcase m = gcase_make(3, 10, 4, 1000, 520, MOEX_F16, 6301u);
    m.sentinel_prob = 0.2;
    m.layout = 5;
    m.act = MOEX_ACT_GPTOSS_CLAMP;
    m.limit = 1.5f;
    m.sentinel_rows = 1;
    run_case(&m, 1);
    /* grouped_mm's bf16/f16 decode GEMMs (grouped_gemm_decode_pays: I a multiple of 128, one
     * token of 128 or 256 experts): a partial k-block of x (H 272: 4 k-blocks of 64 and 16
     * inputs), a partial down tile (272 of 384 features), biases, a sentinel */
    for (int d = 1; d < 3; d++) {
        gcase c = gcase_make(1, d == 1 ? 128 : 256, 8, 272, 256, FLOAT_DTYPES[d], 6310u + (uint64_t)d);
        c.layout = d == 1 ? 1 : 0;
        c.act = d == 1 ? MOEX_ACT_GELU : MOEX_ACT_SILU;
        c.sentinel_prob = d == 1 ? 0.2 : 0.0;
        run_case(&c, 1);
    }
    /* hidden sizes from PAIR_ROWS_MIN_H, up to PAIR_ROWS_MAX_TOKENS tokens: batched_mm's down per
     * pair into y, then the pair reduction: sentinels (one token all -1, one all E), a partial last
     * block of features (H 4104: 1026 warps of 4), f32 and f16 weights, biases and interleaved gate/up */
    gcase lr = gcase_make(3, 12, 8, 4104, 264, MOEX_F32, 6302u);
    lr.sentinel_prob = 0.2;
    lr.sentinel_rows = 1;
    run_case(&lr, 1);
    gcase lh = gcase_make(64, 40, 6, 4096, 136, MOEX_F16, 6303u);
    lh.sentinel_prob = 0.05;
    lh.layout = 5;
    lh.act = MOEX_ACT_GPTOSS_CLAMP;
    lh.limit = 1.5f;
    run_case(&lh, 1);
}

/* The streamed kernels on tensor cores (bf16/f16, H and I multiples of 32, k contiguous,
 * fewer than 16 rows per expert on average): 1 to 30 rows per expert, so every tile
 * count of gemv_mma.cu runs, and one expert with over 70 rows (five passes of up to 16);
 * H = 160 and I = 96 end in part-filled stages of 64 inputs; fused and per-expert matrices,
 * gated, interleaved, ungated. Last, more pairs than the one-launch routing takes (8400 over
 * 600 experts), so that the routing's memset clears the kernel's schedule. */
static void test_streamed_tensor_cores(void) {
    static const int layouts[] = {0, 5, 9};
    for (int d = 1; d < 3; d++)
        for (int l = 0; l < 3; l++) {
            gcase c = gcase_make(l == 1 ? 37 : 300, 40, 2, 160, 96, FLOAT_DTYPES[d], 7000u + (uint64_t)(d * 3 + l));
            c.layout = layouts[l];
            c.act = l == 2 ? MOEX_ACT_GELU : MOEX_ACT_SILU;
            c.sentinel_prob = 0.05;
            c.per_expert = l == 0 && d == 1;
            c.hot_rows = l == 1 ? 0 : 70;
            run_case(&c, 0);
        }
    gcase big = gcase_make(4200, 600, 2, 64, 32, FLOAT_DTYPES[2], 7100u);
    big.act = MOEX_ACT_SILU;
    run_case(&big, 0);
    /* gate/up items split along K (gemv.cuh, MMA_KSPLIT_MAX: few pairs, fewer items than warps):
     * hidden 3104, three parts of 1088, 1088 and 928 inputs (the last ends inside a stage);
     * concatenated, interleaved with biases, ungated with biases, every token on one expert; 64
     * pairs (the most that split) and 68 (none split); each forward twice, bitwise */
    static const struct {
        int64_t T;
        int layout, d, hot;
    } SPLIT[] = {{1, 0, 2, 0}, {3, 5, 1, 0}, {8, 9, 2, 0}, {16, 0, 2, 1}, {17, 4, 2, 0}};
    for (int i = 0; i < (int)(sizeof SPLIT / sizeof SPLIT[0]); i++) {
        if (g_quick && i % 2) continue;
        gcase c = gcase_make(SPLIT[i].T, 16, 4, 3104, 96, FLOAT_DTYPES[SPLIT[i].d], 7200u + (uint64_t)i);
        c.layout = SPLIT[i].layout;
        c.sentinel_prob = 0.05;
        c.hot_rows = SPLIT[i].hot ? SPLIT[i].T : 0;
        run_case(&c, 1);
    }
}

/* A quantized case of E = 16, k = 4: kind (gcase.fp8) with bn x bk blocks, 5% sentinels and the
 * sentinel rows, hot rows on expert 0. */
static gcase quant_case(int64_t T, int64_t H, int64_t I, moex_dtype dt, uint64_t seed, int kind, int64_t bn,
                        int64_t bk, int layout, moex_activation act, int64_t hot) {
    gcase c = gcase_make(T, 16, 4, H, I, dt, seed);
    c.fp8 = kind;
    c.block_n = bn, c.block_k = bk;
    c.layout = layout;
    c.act = act;
    c.limit = act == MOEX_ACT_GPTOSS_CLAMP ? 1.0f : 7.0f;
    c.hot_rows = hot;
    c.sentinel_prob = 0.05;
    c.sentinel_rows = T >= 3;
    return c;
}

/* FP8 experts (e4m3 with f32 or ue8m0 block scales) on every backend that takes them, against
 * the float64 reference that applies the same quantization: DeepSeek's 128 x 128 blocks with H
 * and I not multiples of 128 (partial blocks along both), 16 x 64 blocks, empty experts (T = 1 of
 * E = 16), every token on one expert, sentinel rows, each layout the GPU takes (concat,
 * interleaved, ungated; biases; GPT-OSS's clamped activation), bf16 and f32 hidden states.
 * The eighth to the thirteenth run grouped_mm's FP8 tensor-core GEMMs (I a multiple of 64, experts of 16 rows
 * or more on average; the fourth and fifth, of 32 or fewer, its narrow tiles): partial k-blocks and
 * output tiles, 64-row blocks, block_k 256, biases, an expert of 400 rows (4 row tiles), one of
 * about 95 among experts of about 20 (two narrow tiles), a hidden size of 4160 (h quantized in
 * the wide tiles' epilogue); the last two, hidden sizes of 4160 and 4112 at 5 and 37 tokens,
 * batched_mm's down per pair (gemv_down_pair_rows_pays); the four after them and one token of 128
 * experts grouped_mm's decode GEMMs (grouped_gemm_decode_pays); then narrow tiles, several a block. */
static void test_fp8(void) {
    typedef struct fp8_case {
        int64_t T, bn, bk;
        int layout;
        moex_activation act;
        moex_dtype dt;
        int64_t hot, H, I;
    } fp8_case;
    static const fp8_case CASES[] = {
        {1, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 0, 336, 208},   {5, 128, 128, 1, MOEX_ACT_SILU, MOEX_BF16, 0, 336, 208},
        {64, 128, 128, 4, MOEX_ACT_GELU, MOEX_F32, 0, 336, 208},   {300, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 300, 336, 208},
        {37, 16, 64, 9, MOEX_ACT_RELU, MOEX_BF16, 0, 336, 208},    {19, 128, 128, 5, MOEX_ACT_GPTOSS_CLAMP, MOEX_BF16, 0, 336, 208},
        {130, 128, 128, 0, MOEX_ACT_SILU, MOEX_F32, 40, 336, 208},
        /* the tensor-core GEMMs */
        {300, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 0, 336, 192}, {520, 64, 128, 1, MOEX_ACT_GPTOSS_CLAMP, MOEX_F32, 0, 336, 192},
        {400, 128, 256, 0, MOEX_ACT_SILU, MOEX_BF16, 400, 512, 256}, {70, 128, 128, 1, MOEX_ACT_GELU, MOEX_BF16, 0, 336, 192},
        {100, 64, 128, 0, MOEX_ACT_SILU, MOEX_F32, 70, 336, 192},
        /* a hidden size from GEMM_FP8_H_QUANT_MIN_K (a partial k-block): the wide tiles quantize h in their epilogue */
        {300, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 0, 4160, 192},
        /* hidden sizes from PAIR_ROWS_MIN_H, few tokens: batched_mm's down per pair, then the pair reduction */
        {5, 128, 128, 1, MOEX_ACT_SILU, MOEX_BF16, 0, 4160, 208}, {37, 16, 64, 9, MOEX_ACT_RELU, MOEX_F32, 0, 4112, 208},
        /* grouped_mm's decode GEMMs (I a multiple of 128, experts of 5 to 16 rows on average): a
         * partial k-block of x (H 272) and a partial down tile, 64-row blocks, biases, an expert of
         * 40 rows (three groups of 16) */
        {21, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 0, 272, 256},  {50, 64, 128, 1, MOEX_ACT_GPTOSS_CLAMP, MOEX_BF16, 0, 272, 256},
        {37, 128, 128, 1, MOEX_ACT_GELU, MOEX_F32, 0, 272, 256},   {60, 128, 128, 0, MOEX_ACT_SILU, MOEX_BF16, 40, 272, 256},
    };
    const int n = (int)(sizeof CASES / sizeof CASES[0]);
    for (int i = 0; i < n; i++) {
        if (g_quick && i % 3) continue;
        const fp8_case *f = &CASES[i];
        gcase c = quant_case(f->T, f->H, f->I, f->dt, 8100u + (uint64_t)i, 1 + i % 2, f->bn, f->bk, f->layout, f->act,
                             f->hot);
        run_case(&c, 1);
    }
    /* the decode GEMMs at one token of 128 experts (at most one pair in 16 experts), ue8m0 scales */
    gcase one = quant_case(1, 272, 256, MOEX_BF16, 8150u, 2, 128, 128, 1, MOEX_ACT_SILU, 0);
    one.E = 128, one.k = 8;
    run_case(&one, 1);
    if (g_quick) return;
    /* narrow tiles, several a block (the cases above give a block one tile or two): 256 experts of
     * 24 rows on average, 768 gate/up and 512 down tiles for about 132 blocks, so that both
     * consumer warpgroups take tiles in turn; f32 and ue8m0 scales */
    for (int kind = 1; kind <= 2; kind++) {
        gcase c = quant_case(768, 384, 384, MOEX_BF16, 8200u + (uint64_t)kind, kind, 128, 128, 0, MOEX_ACT_SILU, 0);
        c.E = 256, c.k = 8;
        run_case(&c, 1);
    }
}

/* FP4 experts (e2m1, a ue8m0 scale per row per 32 inputs, activations rounded to e2m1 per 32 as
 * the CPU rounds them) against the float64 reference with the same quantization: H and I
 * multiples of 32 but not of 64 or 128, T of 1 (empty experts), 5, 64, 300 with every token on
 * one expert, sentinels; concat, interleaved (GPT-OSS's layout, with biases and its clamped
 * activation), ungated; bf16 and f32 hidden states. From 64 tokens grouped_mm runs its integer mma
 * kernels (gemv_fp4_mma_pays), below them its per-expert ones. batched_mm and grouped_mm must both
 * take each layer. A layer whose hidden size is not a multiple of 32 is refused by both, naming it. */
static void test_fp4(void) {
    typedef struct fp4_case {
        int64_t T;
        int layout;
        moex_activation act;
        moex_dtype dt;
        int64_t hot;
    } fp4_case;
    static const fp4_case CASES[] = {
        {1, 0, MOEX_ACT_SILU, MOEX_BF16, 0},  {5, 5, MOEX_ACT_GPTOSS_CLAMP, MOEX_BF16, 0},
        {64, 4, MOEX_ACT_GELU, MOEX_F32, 0},  {300, 0, MOEX_ACT_SILU, MOEX_BF16, 300},
        {37, 9, MOEX_ACT_RELU, MOEX_BF16, 0}, {130, 1, MOEX_ACT_SILU, MOEX_F32, 40},
    };
    const int n = (int)(sizeof CASES / sizeof CASES[0]);
    for (int i = 0; i < n; i++) {
        if (g_quick && i % 2) continue;
        const fp4_case *f = &CASES[i];
        gcase c = quant_case(f->T, 352, 224, f->dt, 8300u + (uint64_t)i, 3, 1, 32, f->layout, f->act, f->hot);
        grun r;
        if (i == 0 && grun_setup(&r, &c)) { /* the two backends take FP4 layers */
            moex_layer *layer = NULL;
            CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
            CHECK(layer && backend_takes("batched_mm", layer, g_dev) && backend_takes("grouped_mm", layer, g_dev),
                  "batched_mm and grouped_mm take FP4 experts [%s]", describe(&c, NULL));
            moex_layer_free(layer);
            grun_free(&r);
        }
        run_case(&c, 1);
    }
    gcase odd = gcase_make(3, 8, 2, 336, 224, MOEX_BF16, 8390u); /* 336 = 10.5 x 32 */
    odd.fp8 = 3;
    odd.block_n = 1, odd.block_k = 32;
    grun r;
    if (grun_setup(&r, &odd)) {
        moex_layer *layer = NULL;
        CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
        static const char *const names[2] = {"batched_mm", "grouped_mm"};
        for (int b = 0; layer && b < 2; b++) {
            char why[512] = "";
            const moex_status st = moex_backend_supports(names[b], layer, g_dev, why, sizeof why);
            CHECK(st == MOEX_ERR_UNSUPPORTED && strstr(why, "336") && strstr(why, "32"),
                  "%s refuses FP4 with hidden 336, naming it: %s (%s)", names[b], moex_status_str(st), why);
        }
        moex_layer_free(layer);
        grun_free(&r);
    }
}

/* Every token all sentinels: exact zeros everywhere. */
static void test_all_sentinels(void) {
    for (int d = 0; d < 3; d++) {
        gcase c = gcase_make(7, 1, 1, 16, 8, FLOAT_DTYPES[d], 42u + (uint64_t)d);
        c.layout = 3;
        grun r;
        if (!grun_setup(&r, &c)) continue;
        for (int64_t t = 0; t < c.T; t++) ref_store(r.ids, c.id_dt, t, (t & 1) ? 1.0 : -1.0);
        if (!to_dev(r.d_ids, r.ids, (size_t)(c.T * c.k) * ref_dtype_size(c.id_dt))) {
            grun_free(&r);
            continue;
        }
        moex_context *ctx = make_ctx(c.T);
        moex_layer *layer = NULL;
        CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
        for (int b = 0; ctx && layer && b < N_BACKENDS; b++) {
            if (!backend_takes(BACKENDS[b], layer, g_dev)) continue; /* refuses this layer */
            if (moex_prepare(ctx, layer, BACKENDS[b]) != MOEX_OK) {
                fail_at(__FILE__, __LINE__, "prepare %s: %s", BACKENDS[b], moex_last_error());
                continue;
            }
            if (!run_forward(&r, ctx, layer, BACKENDS[b])) continue;
            for (int64_t i = 0; i < c.T * c.H; i++)
                if (ref_load(r.out_host, c.dt, i) != 0.0) {
                    fail_at(__FILE__, __LINE__, "out[%lld] = %g, want 0 (all sentinels) [%s]", (long long)i,
                            ref_load(r.out_host, c.dt, i), describe(&c, BACKENDS[b]));
                    break;
                }
        }
        moex_layer_free(layer);
        moex_context_free(ctx);
        grun_free(&r);
    }
}

/* ------------------------------------------------------------------------ */
/* bad input                                                                 */
/* ------------------------------------------------------------------------ */

/* A forward that must fail on the host: status `want` (0: any failure), message naming `need`,
 * and out untouched (checked after a synchronize, so that nothing queued could write it). */
static void expect_rejected(grun *r, moex_context *ctx, moex_layer *layer, const char *be, const moex_tensor *x,
                            const moex_tensor *ids, const moex_tensor *w, moex_tensor *out, moex_status want,
                            const char *need, const char *what) {
    if (!poison_out(r)) return;
    moex_status st = moex_experts_forward(ctx, layer, be, x, ids, w, out);
    const char *msg = moex_last_error();
    if (st == MOEX_OK)
        fail_at(__FILE__, __LINE__, "%s [%s]: forward returned OK, want an error", what, be);
    else if (want != MOEX_OK && st != want)
        fail_at(__FILE__, __LINE__, "%s [%s]: status %s, want %s (%s)", what, be, moex_status_str(st),
                moex_status_str(want), msg);
    if (st != MOEX_OK && need && !contains(msg, need))
        fail_at(__FILE__, __LINE__, "%s [%s]: message \"%s\" does not name \"%s\"", what, be, msg, need);
    g_checks++;
    moex_status s2 = moex_context_synchronize(ctx);
    CHECK(s2 == MOEX_OK, "%s [%s]: synchronize after a rejected call: %s (%s)", what, be, moex_status_str(s2),
          moex_last_error());
    if (fetch_out(r)) CHECK(out_untouched(r), "%s [%s]: out was written by a rejected call", what, be);
}

static void test_bad_inputs(void) {
    gcase c = gcase_make(6, 8, 2, 32, 16, MOEX_F32, 31337);
    grun r;
    if (!grun_setup(&r, &c)) return;
    moex_context *ctx = make_ctx(c.T);
    moex_layer *layer = NULL;
    moex_status st = moex_layer_create(&r.D.desc, &layer);
    CHECK(st == MOEX_OK, "layer: %s", moex_last_error());
    if (!ctx || !layer) goto done;
    /* host-side scratch big enough for any bad view below */
    size_t big_bytes = (size_t)((c.T + 2) * (c.H + 2)) * 8;
    void *host_big = calloc(big_bytes, 1);
    void *dev_big = dev_alloc(big_bytes);
    if (!host_big || !dev_big) {
        free(host_big);
        dev_free(dev_big);
        goto done;
    }
    int64_t T = c.T, H = c.H, k = c.k;
    for (int b = 0; b < N_BACKENDS; b++) {
        const char *be = BACKENDS[b];
        if (!backend_takes(be, layer, g_dev)) continue; /* refuses this layer */
        if (moex_prepare(ctx, layer, be) != MOEX_OK) {
            fail_at(__FILE__, __LINE__, "prepare %s: %s", be, moex_last_error());
            continue;
        }
        /* host tensors on a CUDA context: each input in turn */
        moex_tensor hx = ref_tensor_2d(r.hidden, c.dt, T, H, H);
        expect_rejected(&r, ctx, layer, be, &hx, &r.tids, &r.tw, &r.tout, MOEX_OK, "hidden", "host hidden");
        moex_tensor hid = ref_tensor_2d(r.ids, c.id_dt, T, k, k);
        expect_rejected(&r, ctx, layer, be, &r.th, &hid, &r.tw, &r.tout, MOEX_OK, "ids", "host ids");
        moex_tensor hw = ref_tensor_2d(r.weights, c.w_dt, T, k, k);
        expect_rejected(&r, ctx, layer, be, &r.th, &r.tids, &hw, &r.tout, MOEX_OK, "weights", "host weights");
        moex_tensor ho = ref_tensor_2d(host_big, c.dt, T, H, H);
        expect_rejected(&r, ctx, layer, be, &r.th, &r.tids, &r.tw, &ho, MOEX_OK, "out", "host out");
        /* shapes and dtypes */
        moex_tensor t = on_dev(ref_tensor_2d(dev_big, c.dt, T, H + 1, H + 1));
        expect_rejected(&r, ctx, layer, be, &t, &r.tids, &r.tw, &r.tout, MOEX_ERR_INVALID_ARGUMENT, "hidden",
                        "hidden [T, H+1]");
        t = on_dev(ref_tensor_2d(r.d_out, c.dt, T + 1, H, H));
        expect_rejected(&r, ctx, layer, be, &r.th, &r.tids, &r.tw, &t, MOEX_ERR_INVALID_ARGUMENT, "out",
                        "out [T+1, H]");
        t = on_dev(ref_tensor_2d(r.d_out, MOEX_BF16, T, H, H));
        expect_rejected(&r, ctx, layer, be, &r.th, &r.tids, &r.tw, &t, MOEX_ERR_INVALID_ARGUMENT, "out",
                        "out bf16, hidden f32");
        t = on_dev(ref_tensor_2d(dev_big, MOEX_F32, T, k, k));
        expect_rejected(&r, ctx, layer, be, &r.th, &t, &r.tw, &r.tout, MOEX_ERR_INVALID_ARGUMENT, "ids",
                        "ids f32");
        t = on_dev(ref_tensor_2d(dev_big, MOEX_I32, T, k, k));
        expect_rejected(&r, ctx, layer, be, &r.th, &r.tids, &t, &r.tout, MOEX_ERR_INVALID_ARGUMENT, "weights",
                        "weights i32");
        t = on_dev(ref_tensor_2d(dev_big, MOEX_I32, T, k + 1, k + 1));
        expect_rejected(&r, ctx, layer, be, &r.th, &t, &r.tw, &r.tout, MOEX_ERR_INVALID_ARGUMENT, "ids",
                        "ids [T, k+1]");
        /* a device index that is not the context's */
        t = r.th;
        t.device.index = g_dev.index + 1;
        expect_rejected(&r, ctx, layer, be, &t, &r.tids, &r.tw, &r.tout, MOEX_OK, "hidden",
                        "hidden on another GPU");
    }
    /* T > max_tokens */
    {
        gcase c2 = gcase_make(37, 8, 2, 32, 16, MOEX_F32, 99);
        grun r2;
        if (grun_setup(&r2, &c2)) {
            moex_context *small = make_ctx(36);
            moex_layer *l2 = NULL;
            CHECK(moex_layer_create(&r2.D.desc, &l2) == MOEX_OK, "layer: %s", moex_last_error());
            for (int b = 0; small && l2 && b < N_BACKENDS; b++) {
                if (!backend_takes(BACKENDS[b], l2, g_dev)) continue; /* refuses this layer */
                if (moex_prepare(small, l2, BACKENDS[b]) != MOEX_OK) {
                    fail_at(__FILE__, __LINE__, "prepare %s: %s", BACKENDS[b], moex_last_error());
                    continue;
                }
                expect_rejected(&r2, small, l2, BACKENDS[b], &r2.th, &r2.tids, &r2.tw, &r2.tout,
                                MOEX_ERR_WORKSPACE, "37", "T=37 > max_tokens=36");
            }
            moex_layer_free(l2);
            moex_context_free(small);
            grun_free(&r2);
        }
    }
    /* ids outside [-1, E] on the device: queued, reported by synchronize; the context keeps working */
    {
        static const int64_t BAD[] = {-2, 9, 300, -1000000};
        const size_t ib = (size_t)(T * k) * ref_dtype_size(c.id_dt);
        for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
            for (int b = 0; b < N_BACKENDS; b++) {
                const char *be = BACKENDS[b];
                if (!backend_takes(be, layer, g_dev)) continue; /* refuses this layer (not prepared above) */
                unsigned char *ids = malloc(ib);
                if (!ids) continue;
                memcpy(ids, r.ids, ib);
                ref_store(ids, c.id_dt, 2 * k + 1, (double)BAD[i]);
                if (!to_dev(r.d_ids, ids, ib)) {
                    free(ids);
                    continue;
                }
                free(ids);
                st = moex_experts_forward(ctx, layer, be, &r.th, &r.tids, &r.tw, &r.tout);
                CHECK(st == MOEX_OK, "id %lld [%s]: forward returned %s (%s), want OK (checked on the device)",
                      (long long)BAD[i], be, moex_status_str(st), moex_last_error());
                st = moex_context_synchronize(ctx);
                CHECK(st == MOEX_ERR_INVALID_ARGUMENT, "id %lld [%s]: synchronize returned %s (%s), want %s",
                      (long long)BAD[i], be, moex_status_str(st), moex_last_error(),
                      moex_status_str(MOEX_ERR_INVALID_ARGUMENT));
                st = moex_context_synchronize(ctx);
                CHECK(st == MOEX_OK, "id %lld [%s]: a second synchronize returned %s (%s): the error must be "
                      "reported once", (long long)BAD[i], be, moex_status_str(st), moex_last_error());
                /* restore and check that the context still computes correctly */
                if (!to_dev(r.d_ids, r.ids, ib)) continue;
                if (run_forward(&r, ctx, layer, be)) check_nmse(&r, be);
            }
    }
    /* a layer whose weights are on the host, prepared in a CUDA context */
    {
        moex_layer *hl = NULL;
        if (moex_layer_create(&r.L.desc, &hl) == MOEX_OK) {
            moex_context *c2 = make_ctx(c.T);
            for (int b = 0; c2 && b < N_BACKENDS; b++) {
                if (!backend_takes(BACKENDS[b], hl, g_dev)) continue; /* refuses the layer's dtype, wherever it is */
                st = moex_prepare(c2, hl, BACKENDS[b]);
                if (st == MOEX_OK) {
                    st = moex_experts_forward(c2, hl, BACKENDS[b], &r.th, &r.tids, &r.tw, &r.tout);
                    CHECK(st != MOEX_OK, "host-weight layer on a CUDA context [%s]: forward accepted", BACKENDS[b]);
                } else {
                    CHECK(contains(moex_last_error(), "cpu") || contains(moex_last_error(), "host") ||
                          contains(moex_last_error(), "device"),
                          "host-weight layer on a CUDA context [%s]: message \"%s\" names no device",
                          BACKENDS[b], moex_last_error());
                }
            }
            moex_context_free(c2);
            moex_layer_free(hl);
        }
    }
    free(host_big);
    dev_free(dev_big);
done:
    moex_layer_free(layer);
    moex_context_free(ctx);
    grun_free(&r);
}

/* Graph capture on a CPU context: unsupported; a CPU context's stream: unsupported. */
static void test_cpu_context_graph(void) {
    moex_context_options o = moex_context_default_options();
    o.num_threads = 1;
    moex_context *ctx = NULL;
    if (moex_context_create(&o, &ctx) != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "CPU context: %s", moex_last_error());
        return;
    }
    moex_status st = moex_graph_begin(ctx);
    CHECK(st == MOEX_ERR_UNSUPPORTED, "moex_graph_begin on a CPU context: %s, want unsupported", moex_status_str(st));
    void *stream = NULL;
    st = moex_context_stream(ctx, &stream);
    CHECK(st == MOEX_ERR_UNSUPPORTED, "moex_context_stream on a CPU context: %s, want unsupported",
          moex_status_str(st));
    CHECK(moex_context_synchronize(ctx) == MOEX_OK, "synchronize on a CPU context: %s", moex_last_error());
    moex_graph *g = NULL;
    st = moex_graph_end(ctx, &g);
    CHECK(st != MOEX_OK && g == NULL, "moex_graph_end on a CPU context: %s", moex_status_str(st));
    moex_context_free(ctx);
    /* on a CUDA context: end without begin fails and leaves *out alone */
    moex_context *cctx = make_ctx(4);
    if (cctx) {
        g = NULL;
        st = moex_graph_end(cctx, &g);
        CHECK(st != MOEX_OK && g == NULL, "moex_graph_end without begin: %s", moex_status_str(st));
        CHECK(moex_context_stream(cctx, &stream) == MOEX_OK && stream != NULL, "moex_context_stream: %s",
              moex_last_error());
        moex_context_free(cctx);
    }
}

/* ------------------------------------------------------------------------ */
/* graph capture and replay                                                  */
/* ------------------------------------------------------------------------ */

/* New random hidden states, ids and weights for r (host), the reference, and upload them. */
static int new_inputs(grun *r, uint64_t seed) {
    const gcase *c = &r->c;
    ref_rng rng;
    ref_rng_seed(&rng, seed);
    ref_fill_random(r->hidden, c->dt, c->T * c->H, 1.0, &rng);
    ref_random_routing(&rng, c->T, c->E, c->k, c->id_dt, r->ids, c->w_dt, r->weights, 0.05);
    moex_tensor hx = ref_tensor_2d(r->hidden, c->dt, c->T, c->H, c->H);
    moex_tensor hid = ref_tensor_2d(r->ids, c->id_dt, c->T, c->k, c->k);
    moex_tensor hw = ref_tensor_2d(r->weights, c->w_dt, c->T, c->k, c->k);
    ref_experts_forward(&r->qdesc, &hx, &hid, &hw, r->ref);
    return to_dev(r->d_hidden, r->hidden, (size_t)(c->T * c->H) * ref_dtype_size(c->dt)) &&
           to_dev(r->d_ids, r->ids, (size_t)(c->T * c->k) * ref_dtype_size(c->id_dt)) &&
           to_dev(r->d_weights, r->weights, (size_t)(c->T * c->k) * ref_dtype_size(c->w_dt));
}

static void test_graph_replay(void) {
    /* bf16 experts at three sizes, then FP8 experts (f32 and ue8m0 scales, 128 x 128 blocks):
     * the streamed forward at 7 tokens, the tensor-core GEMMs' narrow tiles at 160 (20 rows an
     * expert); then FP4 experts (1 x 32 blocks) at 9 tokens (the per-expert kernels) and 40 (grouped_mm's
     * integer mma kernels); last FP8 at 48 tokens (6 rows an expert: grouped_mm's decode GEMMs) */
    static const int64_t Ts[] = {1, 7, 64, 7, 160, 9, 40, 48};
    for (int b = 0; b < N_BACKENDS; b++)
        for (int it = 0; it < 8; it++) {
            if (g_quick && it != 1 && it != 3 && it != 5 && it != 6 && it != 7) continue;
            const char *be = BACKENDS[b];
            const int fp4 = it == 5 || it == 6;
            gcase c = gcase_make(Ts[it], 32, 4, 256, 128, MOEX_BF16, 7000u + (uint64_t)(it == 7 ? 900 + b : b * 7 + it));
            c.w_dt = MOEX_BF16;
            c.fp8 = it < 3 ? 0 : fp4 ? 3 : it == 7 ? 1 : it - 2;
            c.block_n = fp4 ? 1 : 128, c.block_k = fp4 ? 32 : 128;
            grun r;
            if (!grun_setup(&r, &c)) continue;
            moex_context *ctx = make_ctx(c.T);
            moex_layer *layer = NULL;
            CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
            unsigned char *graph_out = malloc(r.out_bytes + 1);
            moex_graph *g = NULL;
            moex_status st = MOEX_OK;
            if (layer && !backend_takes(be, layer, g_dev)) goto next; /* refuses this layer */
            if (!ctx || !layer || !graph_out || moex_prepare(ctx, layer, be) != MOEX_OK) {
                fail_at(__FILE__, __LINE__, "graph setup [%s]: %s", describe(&c, be), moex_last_error());
                goto next;
            }
            if (!poison_out(&r)) goto next;
            st = moex_graph_begin(ctx);
            if (st != MOEX_OK) {
                fail_at(__FILE__, __LINE__, "moex_graph_begin: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                        describe(&c, be));
                goto next;
            }
            st = moex_experts_forward(ctx, layer, be, &r.th, &r.tids, &r.tw, &r.tout);
            CHECK(st == MOEX_OK, "forward while capturing: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                  describe(&c, be));
            moex_status st_end = moex_graph_end(ctx, &g);
            if (st != MOEX_OK || st_end != MOEX_OK || !g) {
                fail_at(__FILE__, __LINE__, "moex_graph_end: %s: %s [%s] (backend not capturable?)",
                        moex_status_str(st_end), moex_last_error(), describe(&c, be));
                goto next;
            }
            /* the capture must not have run the forward */
            CHECK(moex_context_synchronize(ctx) == MOEX_OK, "synchronize after capture: %s", moex_last_error());
            if (fetch_out(&r))
                CHECK(out_untouched(&r), "capturing ran the forward (out written) [%s]", describe(&c, be));
            for (int rep = 0; rep < 3; rep++) {
                if (!new_inputs(&r, 9000u + (uint64_t)(rep * 31 + it * 7 + b))) break;
                if (!poison_out(&r)) break;
                st = moex_graph_launch(g, ctx);
                CHECK(st == MOEX_OK, "moex_graph_launch: %s: %s [%s]", moex_status_str(st), moex_last_error(),
                      describe(&c, be));
                st = moex_context_synchronize(ctx);
                CHECK(st == MOEX_OK, "synchronize after replay: %s: %s [%s]", moex_status_str(st),
                      moex_last_error(), describe(&c, be));
                if (!fetch_out(&r)) break;
                CHECK(guard_ok(&r), "replay wrote past out [%s]", describe(&c, be));
                double e = ref_nmse(r.out_host, c.dt, c.T, c.H, c.H, r.ref);
                CHECK(e <= case_bound(&c), "replay %d: NMSE %.3g > %.0e (stale routing?) [%s]", rep, e,
                      case_bound(&c), describe(&c, be));
                memcpy(graph_out, r.out_host, r.out_bytes);
                if (!run_forward(&r, ctx, layer, be)) break;
                CHECK(memcmp(graph_out, r.out_host, r.out_bytes) == 0,
                      "replay %d differs bitwise from an uncaptured forward [%s]", rep, describe(&c, be));
            }
        next:
            moex_graph_free(g);
            free(graph_out);
            moex_layer_free(layer);
            moex_context_free(ctx);
            grun_free(&r);
        }
}

/* Two contexts sharing one layer and stream slot, interleaved: each gets its own correct answer. */
static void test_two_contexts(void) {
    gcase c = gcase_make(33, 16, 4, 128, 64, MOEX_BF16, 4242);
    grun r;
    if (!grun_setup(&r, &c)) return;
    moex_layer *layer = NULL;
    moex_context *a = make_ctx(c.T), *b2 = make_ctx(c.T);
    CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
    if (a && b2 && layer && moex_prepare(a, layer, "grouped_mm") == MOEX_OK &&
        moex_prepare(b2, layer, "batched_mm") == MOEX_OK) {
        if (run_forward(&r, a, layer, "grouped_mm")) check_nmse(&r, "grouped_mm (context a)");
        if (run_forward(&r, b2, layer, "batched_mm")) check_nmse(&r, "batched_mm (context b)");
    } else {
        fail_at(__FILE__, __LINE__, "two contexts: setup failed: %s", moex_last_error());
    }
    moex_context_free(a);
    moex_context_free(b2);
    moex_layer_free(layer);
    grun_free(&r);
}


/* ------------------------------------------------------------------------ */
/* deepgemm                                                                  */
/* ------------------------------------------------------------------------ */

static char g_program[512]; /* argv[0]: test_deepgemm_cache runs it again */

static int backend_listed_in(const char *name) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (strcmp(BACKENDS[i], name) == 0) return 1;
    return 0;
}

/* deepgemm beside grouped_mm on one case, one context: both against the reference, and bitwise
 * equal where both run the grouped GEMM (experts of 16 rows or more on average: grouped_mm's
 * tensor-core path), deepgemm's rows placed in its layout, grouped_mm's packed, the arithmetic
 * the same. */
static void deepgemm_case(const gcase *c, int bitwise) {
    grun r;
    if (!grun_setup(&r, c)) return;
    moex_context *ctx = make_ctx(c->T);
    moex_layer *layer = NULL;
    unsigned char *dg = malloc(r.out_bytes + 1);
    CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s [%s]", moex_last_error(), describe(c, NULL));
    if (ctx && layer && dg) {
        char why[512];
        moex_status st = moex_backend_supports("deepgemm", layer, g_dev, why, sizeof why);
        CHECK(st == MOEX_OK, "deepgemm refuses: %s [%s]", why, describe(c, "deepgemm"));
        if (st == MOEX_OK && moex_prepare(ctx, layer, "deepgemm") == MOEX_OK &&
            moex_prepare(ctx, layer, "grouped_mm") == MOEX_OK && run_forward(&r, ctx, layer, "deepgemm")) {
            check_nmse(&r, "deepgemm");
            check_sentinel_rows(&r, "deepgemm");
            memcpy(dg, r.out_host, r.out_bytes);
            if (bitwise && run_forward(&r, ctx, layer, "grouped_mm"))
                CHECK(memcmp(dg, r.out_host, r.out_bytes) == 0, "deepgemm and grouped_mm differ bitwise [%s]",
                      describe(c, "deepgemm"));
        } else if (st == MOEX_OK) {
            fail_at(__FILE__, __LINE__, "deepgemm: %s [%s]", moex_last_error(), describe(c, "deepgemm"));
        }
    }
    free(dg);
    moex_layer_free(layer);
    moex_context_free(ctx);
    grun_free(&r);
}

/* sonicmoe's pair kernel (both projections of a narrow row tile in one block, h in shared memory,
 * the rows gathered by index: grouped_gemm_pair_pays): SiLU, concatenated gate/up without biases,
 * about 20 rows an expert, E one whole wave of the device's SMs (a block one row tile) or two
 * (several a block; with H = 512 and I = 640 an item has 5 gate/up and 2 down tiles, so the
 * warpgroups' turns swap from one item to the next), sentinels, I = 768 (the largest h that fits).
 * A hot expert of several row tiles: with E a whole wave its extra tiles exceed the blocks, so the
 * chained GEMMs launched after the pair kernel run instead (the choice made on the GPU); with E 8
 * short of two waves the pair kernel takes them. Every backend against the float64 reference and
 * twice bitwise; bf16 also grouped_mm (the chained GEMMs) against deepgemm bit for bit. */
static void test_pair(void) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g_dev.index) != cudaSuccess || sms <= 0) {
        fail_at(__FILE__, __LINE__, "cudaDeviceGetAttribute(multiprocessor count) of cuda:%d failed", g_dev.index);
        return;
    }
    /* E = waves x SMs - short */
    static const struct { int64_t waves, short_, k, H, I; moex_dtype dt; int64_t hot; double sent; int rows; } C[] = {
        {1, 0, 8, 512, 256, MOEX_BF16, 0, 0.0, 1},   {1, 0, 8, 512, 768, MOEX_BF16, 200, 0.0, 0},
        {2, 0, 8, 512, 640, MOEX_BF16, 0, 0.03, 1},  {1, 0, 6, 768, 384, MOEX_F16, 300, 0.0, 0},
        {2, 0, 4, 1024, 256, MOEX_F16, 0, 0.05, 1},  {2, 8, 8, 512, 384, MOEX_BF16, 200, 0.0, 0},
    };
    for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) {
        if (g_quick && i != 2) continue;
        const int64_t E = C[i].waves * sms - C[i].short_, T = 20 * E / C[i].k;
        gcase c = gcase_make(T, E, C[i].k, C[i].H, C[i].I, C[i].dt, 13500u + (uint64_t)i);
        c.w_dt = C[i].dt;
        c.hot_rows = C[i].hot, c.sentinel_prob = C[i].sent, c.sentinel_rows = C[i].rows;
        run_case(&c, 1);
        if (C[i].dt == MOEX_BF16) deepgemm_case(&c, 1);
    }
}

static void test_deepgemm(void) {
    if (!backend_listed_in("deepgemm")) {
        fail_at(__FILE__, __LINE__, "deepgemm does not take cuda:%d", g_dev.index);
        return;
    }
    /* T, E, k, H, I, format (0 bf16, 1 FP8 f32 scales, 2 FP8 ue8m0), hot rows, sentinel rows, bitwise:
     * masked (T <= 128) and contiguous layouts, narrow (<= 32 rows an expert) and wide tiles, sizes
     * that are not multiples of the tiles, an expert with most rows, empty experts (E > pairs) */
    static const struct { int64_t T, E, k, H, I; int fmt, hot, sent, bitwise; } C[] = {
        {70, 16, 4, 256, 128, 0, 0, 1, 1},  {130, 16, 4, 256, 128, 0, 0, 0, 1}, {512, 16, 4, 256, 128, 0, 300, 1, 1},
        {300, 12, 3, 264, 136, 0, 0, 1, 1}, {1, 16, 4, 256, 128, 0, 0, 0, 0},   {5, 64, 2, 264, 136, 0, 0, 1, 0},
        {70, 16, 4, 512, 256, 1, 0, 1, 1},  {300, 16, 4, 512, 256, 1, 200, 0, 1}, {200, 16, 4, 512, 256, 2, 0, 1, 1},
        {257, 10, 3, 400, 192, 1, 0, 1, 1}, {3, 16, 4, 400, 192, 2, 0, 1, 0},   {129, 40, 2, 512, 256, 1, 0, 0, 1},
    };
    for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) {
        if (g_quick && i % 3) continue;
        gcase c = gcase_make(C[i].T, C[i].E, C[i].k, C[i].H, C[i].I, MOEX_BF16, 13000u + (uint64_t)i);
        c.w_dt = MOEX_BF16;
        c.fp8 = C[i].fmt, c.block_n = 128, c.block_k = 128;
        c.hot_rows = C[i].hot, c.sentinel_rows = C[i].sent;
        deepgemm_case(&c, C[i].bitwise && C[i].T * C[i].k >= 16 * C[i].E);
    }
    /* the contiguous layout at a masked size, and masked at a contiguous one: the predicate's
     * bound moved (the workspace is sized when a layer is prepared) */
    static const char *const BOUND[] = {"0", "512"};
    for (int b = 0; b < 2; b++) {
        setenv("MOEX_DEEPGEMM_MASKED_MAX_TOKENS", BOUND[b], 1);
        gcase c = gcase_make(b ? 300 : 70, 16, 4, 512, 256, MOEX_BF16, 13100u + (uint64_t)b);
        c.w_dt = MOEX_BF16, c.fp8 = 1, c.block_n = 128, c.block_k = 128, c.sentinel_rows = 1;
        deepgemm_case(&c, 1);
        unsetenv("MOEX_DEEPGEMM_MASKED_MAX_TOKENS");
    }
    /* SM100's rule (tested here through MOEX_DEEPGEMM_ASSUME_CC): float32 expert scales refused at
     * the forward, naming UE8M0 and the backends that take them, out untouched; UE8M0 runs */
    setenv("MOEX_DEEPGEMM_ASSUME_CC", "100", 1);
    for (int fmt = 1; fmt <= 2; fmt++) {
        gcase c = gcase_make(40, 16, 4, 512, 256, MOEX_BF16, 13200u + (uint64_t)fmt);
        c.w_dt = MOEX_BF16, c.fp8 = fmt, c.block_n = 128, c.block_k = 128;
        grun r;
        if (!grun_setup(&r, &c)) continue;
        moex_context *ctx = make_ctx(c.T);
        moex_layer *layer = NULL;
        CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
        if (ctx && layer && moex_prepare(ctx, layer, "deepgemm") == MOEX_OK && poison_out(&r)) {
            moex_status st = moex_experts_forward(ctx, layer, "deepgemm", &r.th, &r.tids, &r.tw, &r.tout);
            if (fmt == 1) {
                CHECK(st == MOEX_ERR_UNSUPPORTED && contains(moex_last_error(), "UE8M0") &&
                          contains(moex_last_error(), "grouped_mm") && contains(moex_last_error(), "SM100"),
                      "SM100 with f32 scales: %s: %s", moex_status_str(st), moex_last_error());
                CHECK(moex_context_synchronize(ctx) == MOEX_OK && fetch_out(&r) && out_untouched(&r),
                      "the refused forward wrote out");
            } else {
                CHECK(st == MOEX_OK, "SM100 with UE8M0 scales: %s: %s", moex_status_str(st), moex_last_error());
                if (st == MOEX_OK && moex_context_synchronize(ctx) == MOEX_OK && fetch_out(&r)) check_nmse(&r, "deepgemm");
            }
        } else {
            fail_at(__FILE__, __LINE__, "SM100 rule setup: %s", moex_last_error());
        }
        moex_layer_free(layer);
        moex_context_free(ctx);
        grun_free(&r);
    }
    unsetenv("MOEX_DEEPGEMM_ASSUME_CC");
}

/* The kernels' disk cache, seen from a second process running this program (the process holds
 * its loaded kernels, so only a new one reads the cache): after one deepgemm forward here (a
 * shape no other test uses, so its kernels are compiled now: misses, entries written), the
 * child's same forward reads them (hits: no entry replaced); an entry cut short is replaced by
 * a rebuilt one. MOEX_CACHE_DIR is this run's own directory (main). */
typedef struct cache_file {
    char name[256];
    ino_t ino;
    off_t size;
} cache_file;

static int list_cache(const char *dir, cache_file *f, int max) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (strncmp(e->d_name, "grouped_gemm", 12) != 0) continue;
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) != 0) continue;
        snprintf(f[n].name, sizeof f[n].name, "%s", e->d_name);
        f[n].ino = sb.st_ino, f[n].size = sb.st_size;
        n++;
    }
    closedir(d);
    return n;
}

static gcase cache_case(void) {
    gcase c = gcase_make(200, 8, 2, 200, 72, MOEX_BF16, 13300u);
    c.w_dt = MOEX_BF16;
    return c;
}

static void test_deepgemm_cache_child(void) {
    gcase c = cache_case();
    deepgemm_case(&c, 1);
}

static void test_deepgemm_cache(void) {
    const char *dir = getenv("MOEX_CACHE_DIR");
    char jit[600];
    REQUIRE(dir && *dir, , "MOEX_CACHE_DIR is not set");
    snprintf(jit, sizeof jit, "%s/jit", dir);
    gcase c = cache_case();
    static cache_file old[64], before[64], after[64];
    const int n0 = list_cache(jit, old, 64);
    deepgemm_case(&c, 1);
    const int n1 = list_cache(jit, before, 64);
    CHECK(n1 >= n0 + 2, "a new shape's forward wrote %d cache entries (want its gate/up and down kernels)", n1 - n0);
    /* cut one of the new entries short: the child must rebuild and replace it, and read the others */
    int cut_at = -1;
    for (int i = 0; i < n1 && cut_at < 0; i++) {
        int seen = 0;
        for (int j = 0; j < n0; j++) seen |= strcmp(before[i].name, old[j].name) == 0;
        if (!seen) cut_at = i;
    }
    if (cut_at < 0) return;
    char cut[1024];
    snprintf(cut, sizeof cut, "%s/%s", jit, before[cut_at].name);
    CHECK(truncate(cut, before[cut_at].size / 2) == 0, "truncate %s", cut);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "MOEX_GPU_TEST_ONLY=deepgemm_cache_child '%s' --device %d > /dev/null 2>&1", g_program,
             g_dev.index);
    const int rc = system(cmd);
    CHECK(rc == 0, "the child run (%s) failed: %d", cmd, rc);
    const int n2 = list_cache(jit, after, 64);
    CHECK(n2 == n1, "the child changed the number of cache entries: %d -> %d", n1, n2);
    for (int i = 0; i < n1; i++)
        for (int j = 0; j < n2; j++) {
            if (strcmp(before[i].name, after[j].name) != 0) continue;
            if (i == cut_at)
                CHECK(after[j].size == before[i].size && after[j].ino != before[i].ino,
                      "the entry cut short was not rebuilt (size %lld, was %lld)", (long long)after[j].size,
                      (long long)before[i].size);
            else
                CHECK(after[j].ino == before[i].ino && after[j].size == before[i].size,
                      "a valid entry %s was replaced, not read", before[i].name);
        }
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct test_entry {
    const char *name;
    void (*fn)(void);
    int only_if_named; /* run only when MOEX_GPU_TEST_ONLY names it */
} test_entry;

/* 1 if name is one of the comma-separated names of list. */
/* ------------------------------------------------------------------------ */
/* sonicmoe                                                                  */
/* ------------------------------------------------------------------------ */

/* One case through sonicmoe against the float64 reference, twice (bitwise the same); ld_pad > 0:
 * the hidden rows H + ld_pad elements apart (the gathered A-load's row stride). */
static void sonic_case(const gcase *c, int64_t ld_pad) {
    grun r;
    if (!grun_setup(&r, c)) return;
    moex_context *ctx = make_ctx(c->T);
    moex_layer *layer = NULL;
    void *padded = NULL;
    unsigned char *first = malloc(r.out_bytes + 1);
    CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s [%s]", moex_last_error(), describe(c, NULL));
    if (ctx && layer && first) {
        char why[512];
        moex_status st = moex_backend_supports("sonicmoe", layer, g_dev, why, sizeof why);
        CHECK(st == MOEX_OK, "sonicmoe refuses: %s [%s]", why, describe(c, "sonicmoe"));
        if (st == MOEX_OK && ld_pad > 0 && c->T > 0) {
            const size_t es = ref_dtype_size(c->dt), ld = (size_t)(c->H + ld_pad);
            unsigned char *host = calloc((size_t)c->T * ld * es, 1);
            for (int64_t t = 0; host && t < c->T; t++)
                memcpy(host + (size_t)t * ld * es, (const unsigned char *)r.hidden + (size_t)(t * c->H) * es,
                       (size_t)c->H * es);
            padded = host ? dev_upload(host, (size_t)c->T * ld * es) : NULL;
            free(host);
            CHECK(padded != NULL, "uploading the strided hidden states failed [%s]", describe(c, "sonicmoe"));
            if (padded) r.th = on_dev(ref_tensor_2d(padded, c->dt, c->T, c->H, (int64_t)ld));
        }
        if (st == MOEX_OK && moex_prepare(ctx, layer, "sonicmoe") != MOEX_OK) {
            fail_at(__FILE__, __LINE__, "prepare sonicmoe: %s [%s]", moex_last_error(), describe(c, "sonicmoe"));
        } else if (st == MOEX_OK && (ld_pad == 0 || padded) && run_forward(&r, ctx, layer, "sonicmoe")) {
            if (c->T == 0) {
                CHECK(guard_ok(&r), "T=0 wrote something [%s]", describe(c, "sonicmoe"));
            } else {
                check_nmse(&r, "sonicmoe");
                check_sentinel_rows(&r, "sonicmoe");
                memcpy(first, r.out_host, r.out_bytes);
                if (run_forward(&r, ctx, layer, "sonicmoe"))
                    CHECK(memcmp(first, r.out_host, r.out_bytes) == 0,
                          "two sonicmoe forwards with the same inputs differ bitwise [%s]", describe(c, "sonicmoe"));
            }
        }
    }
    dev_free(padded);
    free(first);
    moex_layer_free(layer);
    moex_context_free(ctx);
    grun_free(&r);
}

/* A layer sonicmoe must refuse (supports, with a reason naming `need`). */
static void sonic_refuses(const gcase *c, const char *need, const char *what) {
    grun r;
    if (!grun_setup(&r, c)) return;
    moex_layer *layer = NULL;
    CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s [%s]", moex_last_error(), describe(c, NULL));
    if (layer) {
        char why[512] = "";
        moex_status st = moex_backend_supports("sonicmoe", layer, g_dev, why, sizeof why);
        CHECK(st == MOEX_ERR_UNSUPPORTED, "%s: sonicmoe's supports returned %s, want UNSUPPORTED [%s]", what,
              moex_status_str(st), describe(c, "sonicmoe"));
        CHECK(contains(why, need) && contains(why, "sonicmoe"), "%s: reason \"%s\" does not name \"%s\"", what, why,
              need);
    }
    moex_layer_free(layer);
    grun_free(&r);
}

/* The workspace of a context of max_tokens whose only prepared layer is `layer` through be. */
static size_t workspace_of(moex_layer *layer, const char *be, int64_t max_tokens) {
    moex_context *ctx = make_ctx(max_tokens);
    size_t bytes = 0;
    if (ctx && moex_prepare(ctx, layer, be) == MOEX_OK)
        bytes = moex_context_workspace_bytes(ctx);
    else
        fail_at(__FILE__, __LINE__, "prepare %s: %s", be, moex_last_error());
    moex_context_free(ctx);
    return bytes;
}

/* sonicmoe: the gate/up GEMM reading its rows of the hidden states by index (narrow, wide and
 * overlapped tiles, concatenated and interleaved gate/up, biases, every gated activation it
 * takes, a last k-block of 8 inputs, partial column tiles, a hot expert, empty experts,
 * sentinels, strided hidden rows), the down GEMM applying the routing weights, the sum; the
 * workspace without the gathered copy; what it refuses, at supports and at the forward. */
static void test_sonicmoe(void) {
    if (!backend_listed_in("sonicmoe")) {
        fail_at(__FILE__, __LINE__, "sonicmoe does not take cuda:%d", g_dev.index);
        return;
    }
    static const struct {
        int64_t T, E, k, H, I;
        moex_dtype dt;
        int layout;
        moex_activation act;
        int64_t hot;
        int sent;
        double sent_prob;
        int64_t ld_pad;
    } C[] = {
        {333, 40, 3, 264, 200, MOEX_BF16, 0, MOEX_ACT_SILU, 300, 1, 0.03, 0},   /* narrow tiles, hot expert */
        {333, 40, 3, 264, 200, MOEX_F16, 1, MOEX_ACT_GELU, 0, 1, 0.0, 8},        /* narrow, biases, strided */
        {1500, 64, 6, 512, 384, MOEX_BF16, 0, MOEX_ACT_SILU, 0, 1, 0.02, 0},     /* overlapped epilogue */
        {2001, 8, 2, 136, 72, MOEX_F16, 0, MOEX_ACT_SILU, 0, 0, 0.03, 0},        /* overlapped, K tail */
        {1000, 60, 8, 128, 96, MOEX_BF16, 1, MOEX_ACT_RELU, 0, 1, 0.05, 0},      /* wide, biases, ReGLU */
        {400, 4, 4, 128, 384, MOEX_BF16, 4, MOEX_ACT_GELU_TANH, 0, 0, 0.0, 0},   /* interleaved */
        {200, 33, 3, 128, 384, MOEX_F16, 5, MOEX_ACT_RELU, 0, 1, 0.05, 16},      /* interleaved+bias, strided */
        {1, 60, 8, 256, 128, MOEX_BF16, 0, MOEX_ACT_SILU, 0, 0, 0.0, 0},         /* one token: 52 empty experts */
        {5, 64, 2, 264, 136, MOEX_F16, 1, MOEX_ACT_GELU, 0, 1, 0.0, 0},          /* sentinel rows, empties */
        {96, 64, 8, 256, 128, MOEX_BF16, 0, MOEX_ACT_SILU, 90, 0, 0.0, 0},       /* hot expert, few rows */
        {0, 16, 4, 256, 128, MOEX_BF16, 0, MOEX_ACT_SILU, 0, 0, 0.0, 0},         /* no tokens */
        {768, 256, 8, 384, 384, MOEX_BF16, 0, MOEX_ACT_SILU, 0, 0, 0.0, 0},      /* narrow, several tiles a block */
    };
    for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) {
        if (g_quick && i % 3 != 0) continue;
        gcase c = gcase_make(C[i].T, C[i].E, C[i].k, C[i].H, C[i].I, C[i].dt, 8100u + (uint64_t)i);
        c.layout = C[i].layout;
        c.act = C[i].act;
        c.hot_rows = C[i].hot;
        c.sentinel_rows = C[i].sent;
        c.sentinel_prob = C[i].sent_prob;
        c.w_dt = (i & 1) ? MOEX_F32 : MOEX_BF16;
        c.id_dt = (i & 2) ? MOEX_I64 : MOEX_I32;
        sonic_case(&c, C[i].ld_pad);
    }
    /* the workspace: grouped_mm's less the gathered copy [T k, H] */
    {
        gcase c = gcase_make(1500, 64, 6, 512, 384, MOEX_BF16, 8200u);
        grun r;
        if (grun_setup(&r, &c)) {
            moex_layer *layer = NULL;
            CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
            if (layer) {
                const size_t grouped = workspace_of(layer, "grouped_mm", c.T), sonic = workspace_of(layer, "sonicmoe", c.T);
                const size_t copy = (size_t)(c.T * c.k * c.H) * 2;
                CHECK(sonic > 0 && grouped >= sonic + copy,
                      "workspace: sonicmoe %zu bytes, grouped_mm %zu: want at least the gathered copy (%zu) less",
                      sonic, grouped, copy);
            }
            moex_layer_free(layer);
            grun_free(&r);
        }
    }
    /* refused by supports, naming why and what runs it */
    {
        gcase c = gcase_make(8, 8, 2, 64, 32, MOEX_F32, 8300u);
        sonic_refuses(&c, "grouped_mm", "f32 experts");
        c.dt = MOEX_BF16;
        c.layout = 8;
        sonic_refuses(&c, "gated", "ungated experts");
        c.layout = 0;
        c.act = MOEX_ACT_GPTOSS_CLAMP;
        sonic_refuses(&c, "SwiGLU", "gpt-oss's clamped activation");
        c.act = MOEX_ACT_SILU;
        c.layout = 2;
        sonic_refuses(&c, "transposed", "transposed weights");
        c.layout = 0;
        c.per_expert = 1;
        sonic_refuses(&c, "per-expert", "per-expert weight pointers");
        c.per_expert = 0;
        c.H = 60;
        sonic_refuses(&c, "multiples of 8", "hidden 60");
    }
    /* refused at the forward: hidden states in another dtype, or rows not 16-byte aligned; out untouched */
    {
        gcase c = gcase_make(6, 8, 2, 64, 32, MOEX_BF16, 8400u);
        grun r;
        if (!grun_setup(&r, &c)) return;
        moex_context *ctx = make_ctx(c.T);
        moex_layer *layer = NULL;
        CHECK(moex_layer_create(&r.D.desc, &layer) == MOEX_OK, "layer: %s", moex_last_error());
        void *dev_big = dev_alloc((size_t)(c.T * (c.H + 4)) * 4);
        if (ctx && layer && dev_big && moex_prepare(ctx, layer, "sonicmoe") == MOEX_OK) {
            moex_tensor t = on_dev(ref_tensor_2d(dev_big, MOEX_F16, c.T, c.H, c.H));
            moex_tensor o16 = on_dev(ref_tensor_2d(r.d_out, MOEX_F16, c.T, c.H, c.H)); /* out takes hidden's dtype */
            expect_rejected(&r, ctx, layer, "sonicmoe", &t, &r.tids, &r.tw, &o16, MOEX_ERR_UNSUPPORTED,
                            "grouped_mm", "f16 hidden states, bf16 experts");
            t = on_dev(ref_tensor_2d(dev_big, MOEX_BF16, c.T, c.H, c.H + 4));
            expect_rejected(&r, ctx, layer, "sonicmoe", &t, &r.tids, &r.tw, &r.tout, MOEX_ERR_UNSUPPORTED,
                            "16-byte", "hidden rows 68 elements apart");
            t = on_dev(ref_tensor_2d((char *)dev_big + 2, MOEX_BF16, c.T, c.H, c.H));
            expect_rejected(&r, ctx, layer, "sonicmoe", &t, &r.tids, &r.tw, &r.tout, MOEX_ERR_UNSUPPORTED,
                            "16-byte", "hidden states 2 bytes off alignment");
            if (run_forward(&r, ctx, layer, "sonicmoe")) check_nmse(&r, "sonicmoe"); /* still computes */
        } else {
            fail_at(__FILE__, __LINE__, "sonicmoe setup: %s", moex_last_error());
        }
        dev_free(dev_big);
        moex_layer_free(layer);
        moex_context_free(ctx);
        grun_free(&r);
    }
}

static int name_listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_backends", argc, argv, &g_quick, &g_dev.index)) return 2;
    snprintf(g_program, sizeof g_program, "%s", argv[0]);
    /* deepgemm's kernels go to a disk cache of this run's own (test_deepgemm_cache), unless the
     * caller chose one */
    char cache_tmpl[] = "/tmp/moex-test-cache-XXXXXX";
    if (!getenv("MOEX_CACHE_DIR") && mkdtemp(cache_tmpl)) setenv("MOEX_CACHE_DIR", cache_tmpl, 1);
    moex_device_info info;
    moex_status st = moex_device_query(g_dev, &info);
    if (st != MOEX_OK) {
        fprintf(stderr, "test_cuda_backends: moex_device_query(cuda:%d): %s\n", g_dev.index, moex_last_error());
        return 1;
    }
    if (!info.available) {
        printf("SKIP: cuda:%d is not usable: %s\n", g_dev.index, info.reason);
        return EXIT_SKIP;
    }
    printf("test_cuda_backends: moex %s on %s (compute capability %d.%d, %d GPU(s))%s\n", moex_version(),
           info.name, info.cc_major, info.cc_minor, info.cuda_devices, g_quick ? ", quick subset" : "");
    fflush(stdout);
    const backend_list gpu = backends_on(g_dev);
    for (int i = 0; i < gpu.n; i++) BACKENDS[i] = gpu.name[i];
    N_BACKENDS = gpu.n;
    printf("test_cuda_backends: backends taking cuda:%d:", g_dev.index);
    for (int i = 0; i < N_BACKENDS; i++) printf(" %s", BACKENDS[i]);
    printf("\n");
    CHECK(N_BACKENDS > 0, "no registered backend takes cuda:%d", g_dev.index);
    static const test_entry TESTS[] = {
        {"cpu_context_graph", test_cpu_context_graph, 0},
        {"small_product", test_small_product, 0},
        {"layouts_activations", test_layouts_activations, 0},
        {"token_counts", test_token_counts, 0},
        {"all_sentinels", test_all_sentinels, 0},
        {"bad_inputs", test_bad_inputs, 0},
        {"graph_replay", test_graph_replay, 0},
        {"two_contexts", test_two_contexts, 0},
        {"large", test_large, 0},
        {"streamed_tensor_cores", test_streamed_tensor_cores, 0},
        {"fp8", test_fp8, 0},
        {"fp4", test_fp4, 0},
        {"deepgemm", test_deepgemm, 0},
        {"deepgemm_cache", test_deepgemm_cache, 0},
        {"deepgemm_cache_child", test_deepgemm_cache_child, 1},
        {"sonicmoe", test_sonicmoe, 0},
        {"pair", test_pair, 0},
    };
    /* MOEX_GPU_TEST_ONLY=fp4,graph_replay: run only the tests named (a comma-separated list) */
    const char *only = getenv("MOEX_GPU_TEST_ONLY");
    int failed_tests = 0, n = (int)(sizeof TESTS / sizeof TESTS[0]), ran = 0;
    for (int i = 0; i < n; i++) {
        const int named = only && *only && name_listed(only, TESTS[i].name);
        if ((only && *only && !named) || (TESTS[i].only_if_named && !named)) continue;
        ran++;
        int before = g_failures, checks = g_checks;
        double t0 = now_s();
        TESTS[i].fn();
        int f = g_failures - before;
        printf("[%s] %-22s %6d checks, %d failed  (%.1f s)\n", f ? "FAIL" : " OK ", TESTS[i].name,
               g_checks - checks, f, now_s() - t0);
        fflush(stdout);
        failed_tests += f != 0;
    }
    printf("test_cuda_backends: %d of %d tests passed, %d checks, %d failed\n", ran - failed_tests, ran, g_checks,
           g_failures);
    return g_failures ? 1 : 0;
}
