/*
 * reference.c — the float64 reference of moex used by the tests.
 * See reference.h. No libmoex function is called from this file.
 */
#include "reference.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* dtype codecs                                                              */
/* ------------------------------------------------------------------------ */

/* bits: binary16 -> exact double */
double ref_f16_to_double(uint16_t bits) {
    int sign = bits >> 15;
    int exp = (bits >> 10) & 0x1F;
    int mant = bits & 0x3FF;
    double v;
    if (exp == 0) {
        v = ldexp((double)mant, -24);            /* zero or subnormal */
    } else if (exp == 31) {
        v = mant ? NAN : INFINITY;
    } else {
        v = ldexp((double)(1024 + mant), exp - 25);
    }
    return sign ? -v : v;
}

/* bits: bfloat16 -> exact double (it is the upper half of a binary32) */
double ref_bf16_to_double(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* x -> x rounded to a binary format with mant_bits stored mantissa bits,
 * minimum normal exponent emin and largest finite value max_finite; round to
 * nearest even, overflow to inf, NaN unchanged. One rounding from double. */
static double round_to_format(double x, int mant_bits, int emin, double max_finite) {
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    double a = fabs(x);
    int e = ilogb(a);
    if (e < emin) e = emin;                      /* subnormal: fixed quantum */
    double q = ldexp(1.0, e - mant_bits);
    double r = rint(a / q) * q;                  /* a / q is exact: q is a power of 2 */
    if (r > max_finite) r = INFINITY;
    return copysign(r, x);
}

/* x (already representable in binary16, or inf/NaN) -> its bits */
static uint16_t encode_f16_exact(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return (uint16_t)(sign | 0x7E00);
    if (isinf(x)) return (uint16_t)(sign | 0x7C00);
    if (a == 0.0) return sign;
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)(a / ldexp(1.0, -24)));
    int e = ilogb(a);
    uint16_t mant = (uint16_t)(a / ldexp(1.0, e - 10) - 1024.0);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | mant);
}

uint16_t ref_float_to_f16(float x) {
    if (isnan(x)) {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        return (uint16_t)(((u >> 16) & 0x8000) | 0x7E00);
    }
    return encode_f16_exact(round_to_format((double)x, 10, -14, 65504.0));
}

uint16_t ref_float_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x0040);     /* quiet, keep sign */
    uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);      /* round to nearest even */
    return (uint16_t)(rounded >> 16);
}

size_t ref_dtype_size(moex_dtype dt) {
    switch (dt) {
    case MOEX_F32: return 4;
    case MOEX_F16: return 2;
    case MOEX_BF16: return 2;
    case MOEX_I32: return 4;
    case MOEX_I64: return 8;
    default: return 0;
    }
}

double ref_round(double x, moex_dtype dt) {
    switch (dt) {
    case MOEX_F32: return (double)(float)x;
    case MOEX_F16: return round_to_format(x, 10, -14, 65504.0);
    case MOEX_BF16: return round_to_format(x, 7, -126, ldexp(255.0, 120));
    default: return x;
    }
}

/* buf: [n] of dt -> element i as a double */
double ref_load(const void *buf, moex_dtype dt, int64_t i) {
    switch (dt) {
    case MOEX_F32: return (double)((const float *)buf)[i];
    case MOEX_F16: return ref_f16_to_double(((const uint16_t *)buf)[i]);
    case MOEX_BF16: return ref_bf16_to_double(((const uint16_t *)buf)[i]);
    case MOEX_I32: return (double)((const int32_t *)buf)[i];
    case MOEX_I64: return (double)((const int64_t *)buf)[i];
    default: assert(!"ref_load: unsupported dtype"); return NAN;
    }
}

/* buf: [n] of dt; element i <- x rounded to dt */
void ref_store(void *buf, moex_dtype dt, int64_t i, double x) {
    switch (dt) {
    case MOEX_F32: ((float *)buf)[i] = (float)x; break;
    case MOEX_F16: ((uint16_t *)buf)[i] = encode_f16_exact(ref_round(x, MOEX_F16)); break;
    case MOEX_BF16: {
        float f = (float)ref_round(x, MOEX_BF16);  /* exact: bf16 values are floats */
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        ((uint16_t *)buf)[i] = isnan(f) ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)(u >> 16);
        break;
    }
    case MOEX_I32: ((int32_t *)buf)[i] = (int32_t)x; break;
    case MOEX_I64: ((int64_t *)buf)[i] = (int64_t)x; break;
    default: assert(!"ref_store: unsupported dtype");
    }
}

/* ------------------------------------------------------------------------ */
/* random numbers                                                            */
/* ------------------------------------------------------------------------ */

void ref_rng_seed(ref_rng *r, uint64_t seed) {
    /* splitmix64 of the seed, so that nearby seeds give unrelated streams */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545F4914F6CDD1Dull;
}

uint64_t ref_rng_next(ref_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

double ref_rng_uniform(ref_rng *r) {
    return (double)(ref_rng_next(r) >> 11) * 0x1p-53;
}

int64_t ref_rng_below(ref_rng *r, int64_t n) {
    return (int64_t)(ref_rng_next(r) % (uint64_t)n);
}

double ref_rng_normal(ref_rng *r) {
    double u1 = ((double)(ref_rng_next(r) >> 11) + 1.0) * 0x1p-53;   /* (0, 1] */
    double u2 = ref_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* buf: [n] of dt <- N(0,1) * scale */
void ref_fill_random(void *buf, moex_dtype dt, int64_t n, double scale, ref_rng *r) {
    for (int64_t i = 0; i < n; i++) ref_store(buf, dt, i, ref_rng_normal(r) * scale);
}

/* ------------------------------------------------------------------------ */
/* tensor views                                                              */
/* ------------------------------------------------------------------------ */

moex_tensor ref_tensor(void *data, moex_dtype dt, int ndim, const int64_t *shape) {
    moex_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        if (i) stride *= shape[i]; /* no stride past the outermost one (a hostile shape may overflow it) */
    }
    t.device.kind = MOEX_DEVICE_CPU;
    t.device.index = 0;
    return t;
}

moex_tensor ref_tensor_2d(void *data, moex_dtype dt, int64_t rows, int64_t cols,
                          int64_t row_stride) {
    int64_t shape[2] = {rows, cols};
    moex_tensor t = ref_tensor(data, dt, 2, shape);
    t.strides[0] = row_stride;
    return t;
}

moex_tensor ref_tensor_absent(void) {
    moex_tensor t;
    memset(&t, 0, sizeof t);
    t.data = NULL;
    t.ndim = 0;
    t.dtype = MOEX_F32;
    t.device.kind = MOEX_DEVICE_CPU;
    return t;
}

double ref_tensor_get(const moex_tensor *t, const int64_t *index) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += index[i] * t->strides[i];
    return ref_load(t->data, t->dtype, off);
}

/* ------------------------------------------------------------------------ */
/* random layers                                                             */
/* ------------------------------------------------------------------------ */

/* n elements of dt -> a zeroed heap buffer (at least 1 byte) */
static void *alloc_elems(int64_t n, moex_dtype dt) {
    size_t bytes = (size_t)n * ref_dtype_size(dt);
    void *p = calloc(bytes ? bytes : 1, 1);
    assert(p != NULL);
    return p;
}

void ref_layer_build(ref_layer *L, const ref_layer_spec *s, uint64_t seed) {
    ref_rng r;
    ref_rng_seed(&r, seed);
    memset(L, 0, sizeof *L);
    int64_t E = s->E, H = s->H, I = s->I;
    int64_t R = s->gated ? 2 * I : I;            /* rows of gate_up per expert */

    L->gate_up = alloc_elems(E * R * H, s->dtype);
    L->down = alloc_elems(E * H * I, s->dtype);
    ref_fill_random(L->gate_up, s->dtype, E * R * H, 1.0 / sqrt((double)H), &r);
    ref_fill_random(L->down, s->dtype, E * H * I, 1.0 / sqrt((double)I), &r);

    moex_experts_desc *d = &L->desc;
    d->num_experts = E;
    d->hidden = H;
    d->intermediate = I;
    d->top_k = s->k;
    d->gated = s->gated;
    d->interleaved = s->gated ? s->interleaved : 0;
    d->transposed = s->transposed;
    d->activation = s->act;
    d->alpha = s->alpha;
    d->limit = s->limit;

    int64_t gu_shape[3] = {E, s->transposed ? H : R, s->transposed ? R : H};
    int64_t dn_shape[3] = {E, s->transposed ? I : H, s->transposed ? H : I};
    d->gate_up = ref_tensor(L->gate_up, s->dtype, 3, gu_shape);
    d->down = ref_tensor(L->down, s->dtype, 3, dn_shape);
    d->gate_up_bias = ref_tensor_absent();
    d->down_bias = ref_tensor_absent();
    if (s->bias) {
        int64_t gb_shape[2] = {E, R};
        int64_t db_shape[2] = {E, H};
        L->gate_up_bias = alloc_elems(E * R, s->dtype);
        L->down_bias = alloc_elems(E * H, s->dtype);
        ref_fill_random(L->gate_up_bias, s->dtype, E * R, 0.2, &r);
        ref_fill_random(L->down_bias, s->dtype, E * H, 0.2, &r);
        d->gate_up_bias = ref_tensor(L->gate_up_bias, s->dtype, 2, gb_shape);
        d->down_bias = ref_tensor(L->down_bias, s->dtype, 2, db_shape);
    }
}

void ref_layer_destroy(ref_layer *L) {
    free(L->gate_up);
    free(L->down);
    free(L->gate_up_bias);
    free(L->down_bias);
    memset(L, 0, sizeof *L);
}

/* ------------------------------------------------------------------------ */
/* random routing                                                            */
/* ------------------------------------------------------------------------ */

void ref_random_routing(ref_rng *r, int64_t T, int64_t E, int64_t k, moex_dtype id_dt,
                        void *ids, moex_dtype w_dt, void *weights, double sentinel_prob) {
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)(E > 0 ? E : 1));
    double *raw = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1));
    assert(perm && raw);
    int toggle = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) perm[e] = e;
        double sum = 0;
        for (int64_t j = 0; j < k; j++) {            /* partial Fisher-Yates */
            int64_t pick = j + ref_rng_below(r, E - j);
            int64_t tmp = perm[j];
            perm[j] = perm[pick];
            perm[pick] = tmp;
            raw[j] = 0.1 + ref_rng_uniform(r);
            sum += raw[j];
        }
        for (int64_t j = 0; j < k; j++) {
            int64_t id = perm[j];
            if (sentinel_prob > 0 && ref_rng_uniform(r) < sentinel_prob) {
                id = toggle ? E : -1;
                toggle = !toggle;
            }
            ref_store(ids, id_dt, t * k + j, (double)id);
            ref_store(weights, w_dt, t * k + j, raw[j] / sum);
        }
    }
    free(perm);
    free(raw);
}

/* ------------------------------------------------------------------------ */
/* activations                                                               */
/* ------------------------------------------------------------------------ */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

double ref_act_plain(moex_activation act, double x) {
    switch (act) {
    case MOEX_ACT_SILU: return x / (1.0 + exp(-x));
    case MOEX_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MOEX_ACT_GELU_TANH: {
        const double c = sqrt(2.0 / 3.14159265358979323846);
        return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
    }
    case MOEX_ACT_RELU: return x > 0 ? x : 0.0;
    default: assert(!"ref_act_plain: gated-only activation"); return NAN;
    }
}

double ref_act_gated(moex_activation act, double g, double u, double alpha, double limit) {
    switch (act) {
    case MOEX_ACT_GPTOSS_CLAMP:
        g = fmin(g, limit);
        u = fmax(fmin(u, limit), -limit);
        return (u + 1.0) * g * sigmoid(alpha * g);
    case MOEX_ACT_SWIGLU_LIMIT:
        g = fmin(g, limit);
        u = fmax(fmin(u, limit), -limit);
        return ref_act_plain(MOEX_ACT_SILU, g) * u;
    default:
        return ref_act_plain(act, g) * u;
    }
}

/* ------------------------------------------------------------------------ */
/* the experts forward                                                       */
/* ------------------------------------------------------------------------ */

/* The layer's weights decoded to doubles in one canonical layout:
 * gate [E, I, H] (gated only), up [E, I, H], down [E, H, I],
 * gate_b [E, I], up_b [E, I], down_b [E, H] (zeros when absent). */
typedef struct canon {
    double *gate, *up, *down, *gate_b, *up_b, *down_b;
} canon;

/* d: gate_up per layout -> the row of gate_up holding gate (which=0) or up
 * (which=1) output channel r */
static int64_t gate_up_row(const moex_experts_desc *d, int which, int64_t r) {
    if (!d->gated) return r;
    if (d->interleaved) return 2 * r + which;
    return which * d->intermediate + r;
}

/* ---- quantized experts: decoding and the dynamic activation quantization ---- */

double ref_e4m3_to_double(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + m, e - 10);
    return c & 0x80 ? -v : v;
}

double ref_e2m1_to_double(uint8_t nibble) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return nibble & 8 ? -mag[nibble & 7] : mag[nibble & 7];
}

static int is_quant(moex_dtype dt) { return dt == MOEX_E4M3 || dt == MOEX_E2M1X2; }

/* Element (row, c) of expert e of a stacked quantized weight w [E, rows, K] (codes) with its
 * block scales s [E, ceil(rows/bn), ceil(K/bk)]: code * scale, exactly. */
static double quant_at(const moex_experts_desc *d, const moex_tensor *w, const moex_tensor *s, int64_t rows,
                       int64_t K, int64_t e, int64_t row, int64_t c) {
    const uint8_t *q = w->data;
    double v;
    if (w->dtype == MOEX_E4M3) {
        v = ref_e4m3_to_double(q[(e * rows + row) * K + c]);
    } else {
        uint8_t b = q[((e * rows + row) * K + c) / 2];
        v = ref_e2m1_to_double(c % 2 ? b >> 4 : b & 15);
    }
    int64_t sr = (rows + d->block_n - 1) / d->block_n, sk = (K + d->block_k - 1) / d->block_k;
    int64_t si = (e * sr + row / d->block_n) * sk + c / d->block_k;
    double scale = s->dtype == MOEX_UE8M0 ? ldexp(1.0, ((const uint8_t *)s->data)[si] - 127)
                                          : (double)((const float *)s->data)[si];
    return v * scale;
}

void ref_act_quant(double *x, int64_t n, moex_dtype wdt, int64_t block) {
    const int fp8 = wdt == MOEX_E4M3;
    const double max = fp8 ? 448.0 : 6.0;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        double amax = 0;
        for (int64_t i = b0; i < b1; i++) amax = fmax(amax, fabs(x[i]));
        double s = 1.0;
        if (amax > 0 && fp8) s = (double)(float)(amax / 448.0); /* the scale is an f32 */
        if (amax > 0 && !fp8) s = ldexp(1.0, ilogb(amax) - 2);  /* 2^(floor(log2 amax) - emax(e2m1)) */
        for (int64_t i = b0; i < b1; i++) {
            double y = (double)(float)(x[i] / s); /* the quotient is an f32 */
            y = fmin(fmax(y, -max), max);
            x[i] = round_to_format(y, fp8 ? 3 : 1, fp8 ? -6 : 0, max) * s;
        }
    }
}

/* gate_up[e] for output channel row and input channel c, per transposition */
static double gate_up_at(const moex_experts_desc *d, int64_t e, int64_t row, int64_t c) {
    if (is_quant(d->gate_up.dtype))
        return quant_at(d, &d->gate_up, &d->gate_up_scale, d->gated ? 2 * d->intermediate : d->intermediate,
                        d->hidden, e, row, c);
    int64_t idx[3] = {e, d->transposed ? c : row, d->transposed ? row : c};
    return ref_tensor_get(&d->gate_up, idx);
}

/* down[e] for output channel c and input channel r, per transposition */
static double down_at(const moex_experts_desc *d, int64_t e, int64_t c, int64_t r) {
    if (is_quant(d->down.dtype)) return quant_at(d, &d->down, &d->down_scale, d->hidden, d->intermediate, e, c, r);
    int64_t idx[3] = {e, d->transposed ? r : c, d->transposed ? c : r};
    return ref_tensor_get(&d->down, idx);
}

/* d -> *c (allocated; free with canon_free) */
static void canon_build(const moex_experts_desc *d, canon *c) {
    int64_t E = d->num_experts, H = d->hidden, I = d->intermediate;
    c->gate = calloc((size_t)(E * I * H), sizeof(double));
    c->up = calloc((size_t)(E * I * H), sizeof(double));
    c->down = calloc((size_t)(E * H * I), sizeof(double));
    c->gate_b = calloc((size_t)(E * I), sizeof(double));
    c->up_b = calloc((size_t)(E * I), sizeof(double));
    c->down_b = calloc((size_t)(E * H), sizeof(double));
    assert(c->gate && c->up && c->down && c->gate_b && c->up_b && c->down_b);
    int has_bias_gu = d->gate_up_bias.data != NULL;
    int has_bias_dn = d->down_bias.data != NULL;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t r = 0; r < I; r++) {
            int64_t rg = gate_up_row(d, 0, r), ru = gate_up_row(d, 1, r);
            for (int64_t h = 0; h < H; h++) {
                if (d->gated) c->gate[(e * I + r) * H + h] = gate_up_at(d, e, rg, h);
                c->up[(e * I + r) * H + h] = gate_up_at(d, e, d->gated ? ru : r, h);
            }
            if (has_bias_gu) {
                int64_t ig[2] = {e, rg}, iu[2] = {e, d->gated ? ru : r};
                if (d->gated) c->gate_b[e * I + r] = ref_tensor_get(&d->gate_up_bias, ig);
                c->up_b[e * I + r] = ref_tensor_get(&d->gate_up_bias, iu);
            }
        }
        for (int64_t h = 0; h < H; h++) {
            for (int64_t r = 0; r < I; r++) c->down[(e * H + h) * I + r] = down_at(d, e, h, r);
            if (has_bias_dn) {
                int64_t ib[2] = {e, h};
                c->down_b[e * H + h] = ref_tensor_get(&d->down_bias, ib);
            }
        }
    }
}

static void canon_free(canon *c) {
    free(c->gate);
    free(c->up);
    free(c->down);
    free(c->gate_b);
    free(c->up_b);
    free(c->down_b);
}

/* a: [n], b: [n] -> sum a*b */
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* x: [H] -> y: [H] += w * expert_e(x), per the layer's activation */
static void expert_accumulate(const moex_experts_desc *d, const canon *c, int64_t e,
                              const double *x, double w, double *hbuf, double *y) {
    int64_t H = d->hidden, I = d->intermediate;
    const int quant = is_quant(d->gate_up.dtype);
    const int64_t qblock = d->gate_up.dtype == MOEX_E2M1X2 ? 32 : d->block_k;
    for (int64_t r = 0; r < I; r++) {
        double u = dot(&c->up[(e * I + r) * H], x, H) + c->up_b[e * I + r];
        if (d->gated) {
            double g = dot(&c->gate[(e * I + r) * H], x, H) + c->gate_b[e * I + r];
            hbuf[r] = ref_act_gated(d->activation, g, u, (double)d->alpha, (double)d->limit);
        } else {
            hbuf[r] = ref_act_plain(d->activation, u);
        }
    }
    if (quant) ref_act_quant(hbuf, I, d->gate_up.dtype, qblock);
    for (int64_t h = 0; h < H; h++) {
        double v = dot(&c->down[(e * H + h) * I], hbuf, I) + c->down_b[e * H + h];
        y[h] += w * v;
    }
}

void ref_experts_forward(const moex_experts_desc *d, const moex_tensor *hidden,
                         const moex_tensor *ids, const moex_tensor *weights, double *out) {
    int64_t T = hidden->shape[0], H = d->hidden, I = d->intermediate;
    int64_t E = d->num_experts, k = ids->shape[1];
    if (T == 0) return;
    canon c;
    canon_build(d, &c);
    /* tokens in parallel, each token's sums in one order: the same numbers on any thread count */
#pragma omp parallel
    {
        double *x = malloc(sizeof(double) * (size_t)H);
        double *hbuf = malloc(sizeof(double) * (size_t)I);
        assert(x && hbuf);
#pragma omp for schedule(dynamic, 4)
        for (int64_t t = 0; t < T; t++) {
            double *y = &out[t * H];
            for (int64_t h = 0; h < H; h++) {
                int64_t ix[2] = {t, h};
                x[h] = ref_tensor_get(hidden, ix);
                y[h] = 0.0;
            }
            if (is_quant(d->gate_up.dtype))
                ref_act_quant(x, H, d->gate_up.dtype, d->gate_up.dtype == MOEX_E2M1X2 ? 32 : d->block_k);
            for (int64_t j = 0; j < k; j++) {
                int64_t ij[2] = {t, j};
                int64_t e = (int64_t)ref_tensor_get(ids, ij);
                if (e < 0 || e >= E) continue; /* -1 and E: not routed here */
                expert_accumulate(d, &c, e, x, ref_tensor_get(weights, ij), hbuf, y);
            }
        }
        free(x);
        free(hbuf);
    }
    canon_free(&c);
}

/* ------------------------------------------------------------------------ */
/* routers                                                                   */
/* ------------------------------------------------------------------------ */

/* score: [n], allowed: [n] (NULL = all) -> idx: [k] the k largest allowed,
 * descending, ties to the lower index */
static void topk_desc(const double *score, const unsigned char *allowed, int64_t n, int64_t k,
                      int64_t *idx) {
    unsigned char *taken = calloc((size_t)(n > 0 ? n : 1), 1);
    assert(taken);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++) {
            if (taken[i] || (allowed && !allowed[i])) continue;
            if (best < 0 || score[i] > score[best]) best = i;   /* strict: lower index wins ties */
        }
        idx[j] = best;
        if (best >= 0) taken[best] = 1;
    }
    free(taken);
}

/* row: [E] logits -> ids [k], w [k]: softmax over E, top-k, optional renorm */
static void route_softmax_topk(const moex_router_desc *d, const double *row, int64_t *ids,
                               double *w) {
    int64_t E = d->num_experts, k = d->top_k;
    double *p = malloc(sizeof(double) * (size_t)E);
    assert(p);
    double mx = row[0], sum = 0;
    for (int64_t e = 1; e < E; e++) mx = fmax(mx, row[e]);
    for (int64_t e = 0; e < E; e++) sum += (p[e] = exp(row[e] - mx));
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    topk_desc(p, NULL, E, k, ids);
    double ksum = 0;
    for (int64_t j = 0; j < k; j++) ksum += (w[j] = p[ids[j]]);
    if (d->renormalize)
        for (int64_t j = 0; j < k; j++) w[j] /= ksum;
    free(p);
}

/* row: [E] logits -> ids [k], w [k]: DeepSeek-V3 sigmoid + bias, grouped top-k */
static void route_sigmoid_grouped(const moex_router_desc *d, const double *row, int64_t *ids,
                                  double *w) {
    int64_t E = d->num_experts, k = d->top_k, G = d->n_group, per = E / G;
    double *s = malloc(sizeof(double) * (size_t)E);
    double *b = malloc(sizeof(double) * (size_t)E);
    double *gscore = malloc(sizeof(double) * (size_t)G);
    int64_t *gkeep = malloc(sizeof(int64_t) * (size_t)d->topk_group);
    unsigned char *allowed = calloc((size_t)E, 1);
    assert(s && b && gscore && gkeep && allowed);
    for (int64_t e = 0; e < E; e++) {
        s[e] = sigmoid(row[e]);
        int64_t ie[1] = {e};
        b[e] = s[e] + (d->correction_bias.data ? ref_tensor_get(&d->correction_bias, ie) : 0.0);
    }
    for (int64_t g = 0; g < G; g++) {                    /* sum of the top two biased scores */
        int64_t top2[2];
        int64_t n2 = per >= 2 ? 2 : 1;
        topk_desc(&b[g * per], NULL, per, n2, top2);
        gscore[g] = b[g * per + top2[0]] + (n2 == 2 ? b[g * per + top2[1]] : 0.0);
    }
    topk_desc(gscore, NULL, G, d->topk_group, gkeep);
    for (int64_t i = 0; i < d->topk_group; i++)
        memset(&allowed[gkeep[i] * per], 1, (size_t)per);
    topk_desc(b, allowed, E, k, ids);
    double ksum = 0;
    for (int64_t j = 0; j < k; j++) ksum += (w[j] = s[ids[j]]);
    for (int64_t j = 0; j < k; j++) {
        if (d->renormalize) w[j] /= ksum;
        w[j] *= (double)d->scaling;
    }
    free(s);
    free(b);
    free(gscore);
    free(gkeep);
    free(allowed);
}

/* row: [E] logits -> ids [k], w [k]: top-k on logits, softmax over the k (GPT-OSS) */
static void route_topk_softmax(const moex_router_desc *d, const double *row, int64_t *ids,
                               double *w) {
    int64_t E = d->num_experts, k = d->top_k;
    topk_desc(row, NULL, E, k, ids);
    double mx = row[ids[0]], sum = 0;
    for (int64_t j = 0; j < k; j++) sum += (w[j] = exp(row[ids[j]] - mx));
    for (int64_t j = 0; j < k; j++) w[j] /= sum;
}

void ref_route(const moex_router_desc *d, const moex_tensor *logits, int64_t *ids,
               double *weights) {
    int64_t T = logits->shape[0], E = d->num_experts, k = d->top_k;
    double *row = malloc(sizeof(double) * (size_t)(E > 0 ? E : 1));
    assert(row);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) {
            int64_t ix[2] = {t, e};
            row[e] = ref_tensor_get(logits, ix);
        }
        int64_t *id = &ids[t * k];
        double *w = &weights[t * k];
        switch (d->kind) {
        case MOEX_ROUTER_SOFTMAX_TOPK: route_softmax_topk(d, row, id, w); break;
        case MOEX_ROUTER_SIGMOID_GROUPED_TOPK: route_sigmoid_grouped(d, row, id, w); break;
        case MOEX_ROUTER_TOPK_SOFTMAX: route_topk_softmax(d, row, id, w); break;
        default: assert(!"ref_route: unknown router kind");
        }
    }
    free(row);
}

/* ------------------------------------------------------------------------ */
/* error norms                                                               */
/* ------------------------------------------------------------------------ */

double ref_nmse(const void *a, moex_dtype dt, int64_t rows, int64_t cols, int64_t a_stride,
                const double *b) {
    double num = 0, den = 0, asq = 0;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            double av = ref_load(a, dt, i * a_stride + j), bv = b[i * cols + j];
            num += (av - bv) * (av - bv);
            den += bv * bv;
            asq += av * av;
        }
    }
    if (isnan(num)) return INFINITY;
    if (den == 0.0) return asq == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

void ref_round_all(double *b, int64_t n, moex_dtype dt) {
    for (int64_t i = 0; i < n; i++) b[i] = ref_round(b[i], dt);
}

moex_experts_desc ref_layer_share(const moex_experts_desc *d, int64_t e0, int64_t n) {
    moex_experts_desc s;
    if (moex_experts_desc_share(d, e0, n, &s) != MOEX_OK) memset(&s, 0, sizeof s); /* a test's bad share: no layer */
    return s;
}
