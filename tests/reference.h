/*
 * reference.h — an independent float64 reference of moex for the tests.
 *
 * Nothing here uses moex internals, and reference.c calls no libmoex function:
 * it only shares the public types of moex.h (tensor views, layer and router
 * descriptions). f16/bf16 are decoded and encoded by our own code.
 *
 * Contents
 *   - dtype codecs (exact decode to double, round-to-nearest-even encode)
 *   - a deterministic xorshift random generator and random fills
 *   - tensor helpers (build a row-major view without calling the library)
 *   - random layers and random routing
 *   - the experts forward in float64 (SPEC "The computation")
 *   - the three routers in float64
 *   - NMSE
 */
#ifndef MOEX_TEST_REFERENCE_H
#define MOEX_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "moex.h"

/* ------------------------------------------------------------------------ */
/* dtype codecs                                                              */
/* ------------------------------------------------------------------------ */

/* bits: one binary16 value -> its exact value as a double */
double ref_f16_to_double(uint16_t bits);
/* bits: one bfloat16 value -> its exact value as a double */
double ref_bf16_to_double(uint16_t bits);
/* x: a float -> binary16 bits, round to nearest even, NaN stays NaN */
uint16_t ref_float_to_f16(float x);
/* x: a float -> bfloat16 bits, round to nearest even, NaN stays NaN */
uint16_t ref_float_to_bf16(float x);

/* Bytes of one element of dt (f32/f16/bf16/i32/i64 only; 0 otherwise). */
size_t ref_dtype_size(moex_dtype dt);

/* buf: [n] of dt -> element i as a double (f32/f16/bf16/i32/i64) */
double ref_load(const void *buf, moex_dtype dt, int64_t i);
/* buf: [n] of dt; element i = x, rounded to dt (round to nearest even) */
void ref_store(void *buf, moex_dtype dt, int64_t i, double x);
/* x: a double -> the double that dt would store for it (f32/f16/bf16) */
double ref_round(double x, moex_dtype dt);

/* ------------------------------------------------------------------------ */
/* random numbers                                                            */
/* ------------------------------------------------------------------------ */

/* xorshift64* state; never zero. */
typedef struct ref_rng {
    uint64_t s;
} ref_rng;

/* Seed the generator (any seed, 0 included). */
void ref_rng_seed(ref_rng *r, uint64_t seed);
/* -> 64 random bits */
uint64_t ref_rng_next(ref_rng *r);
/* -> uniform in [0, 1) */
double ref_rng_uniform(ref_rng *r);
/* -> integer uniform in [0, n), n >= 1 */
int64_t ref_rng_below(ref_rng *r, int64_t n);
/* -> standard normal N(0, 1) */
double ref_rng_normal(ref_rng *r);

/* buf: [n] of dt (f32/f16/bf16) <- N(0,1) * scale, rounded to dt.
 * Use scale = 1/sqrt(fan_in) for weights. */
void ref_fill_random(void *buf, moex_dtype dt, int64_t n, double scale, ref_rng *r);

/* ------------------------------------------------------------------------ */
/* tensor views (built by hand, not with moex_tensor_init)                   */
/* ------------------------------------------------------------------------ */

/* -> a row-major contiguous CPU view of data: [shape[0], ..., shape[ndim-1]] */
moex_tensor ref_tensor(void *data, moex_dtype dt, int ndim, const int64_t *shape);
/* -> 2-d CPU view [rows, cols] with row stride row_stride (>= cols), inner stride 1 */
moex_tensor ref_tensor_2d(void *data, moex_dtype dt, int64_t rows, int64_t cols,
                          int64_t row_stride);
/* -> the "absent" view (data NULL, ndim 0) used for missing biases */
moex_tensor ref_tensor_absent(void);
/* t: any view; index[ndim] -> element as a double, through the strides */
double ref_tensor_get(const moex_tensor *t, const int64_t *index);

/* ------------------------------------------------------------------------ */
/* random experts layers                                                     */
/* ------------------------------------------------------------------------ */

/* What a random layer looks like. */
typedef struct ref_layer_spec {
    int64_t E, H, I, k;
    int gated;          /* 1: gate and up; 0: up only */
    int interleaved;    /* gated only */
    int transposed;
    int bias;           /* 1: gate_up_bias and down_bias present */
    moex_activation act;
    float alpha, limit;
    moex_dtype dtype;   /* every weight and bias */
} ref_layer_spec;

/* A random layer: its description (views) and the buffers it points into. */
typedef struct ref_layer {
    moex_experts_desc desc;
    void *gate_up;  /* [E, 2I, H] / [E, H, 2I] (gated) or [E, I, H] / [E, H, I] */
    void *down;     /* [E, H, I] / [E, I, H] */
    void *gate_up_bias;  /* [E, 2I] or [E, I], or NULL */
    void *down_bias;     /* [E, H], or NULL */
} ref_layer;

/* s -> *L with random weights: gate_up ~ N(0,1)/sqrt(H), down ~ N(0,1)/sqrt(I),
 * biases ~ N(0,1) * 0.2. The description is filled by hand (every field). */
void ref_layer_build(ref_layer *L, const ref_layer_spec *s, uint64_t seed);
/* Free the buffers of *L (the description becomes invalid). */
void ref_layer_destroy(ref_layer *L);
/* The experts [e0, e0 + n) of layer d as a layer of their own (the library's moex_experts_desc_share:
 * its stacked views offset to expert e0, or its per-expert arrays; num_experts n, the rest as d); a
 * zeroed description, which no layer takes, when that refuses. */
moex_experts_desc ref_layer_share(const moex_experts_desc *d, int64_t e0, int64_t n);

/* ------------------------------------------------------------------------ */
/* random routing                                                            */
/* ------------------------------------------------------------------------ */

/* ids: [T, k] of id_dt (i32/i64), weights: [T, k] of w_dt (f32/f16/bf16).
 * Each token gets k distinct experts in [0, E) and positive weights summing
 * to about 1. With probability sentinel_prob each id is then replaced by -1
 * or E (alternately), which must contribute nothing. */
void ref_random_routing(ref_rng *r, int64_t T, int64_t E, int64_t k, moex_dtype id_dt,
                        void *ids, moex_dtype w_dt, void *weights, double sentinel_prob);

/* ------------------------------------------------------------------------ */
/* the float64 references                                                    */
/* ------------------------------------------------------------------------ */

/* hidden [T, H] (any row stride), ids [T, k] (i32/i64), weights [T, k]
 *   -> out [T, H] contiguous doubles, per SPEC "The computation".
 * Every input is read from its stored dtype and decoded exactly. Ids -1 and E
 * are skipped; other out-of-range ids are skipped too (the library must
 * reject them before this matters). */
void ref_experts_forward(const moex_experts_desc *d, const moex_tensor *hidden,
                         const moex_tensor *ids, const moex_tensor *weights, double *out);

/* Quantized experts (stacked layout, e4m3 or e2m1x2 weights with f32/ue8m0 block scales) are
 * read as code * scale, exactly; x and h are quantized per token as the library documents
 * (ref_act_quant) before each projection. */
/* one e4m3 code -> its exact value (NaN for 0x7F/0xFF) */
double ref_e4m3_to_double(uint8_t code);
/* one e2m1 nibble -> its exact value */
double ref_e2m1_to_double(uint8_t nibble);
/* x: [n] in place -> per block of `block`: s = f32(amax / 448) (e4m3) or 2^(floor(log2 amax) - 2)
 * (e2m1), x = round(clamp(f32(x / s), +-max)) * s, round to nearest even on the format's grid */
void ref_act_quant(double *x, int64_t n, moex_dtype wdt, int64_t block);
/* x -> act(x) for the ungated kinds (silu, gelu, gelu_tanh, relu) */
double ref_act_plain(moex_activation act, double x);
/* (g, u) -> the gated activation h, alpha/limit used by the clamped kinds */
double ref_act_gated(moex_activation act, double g, double u, double alpha, double limit);

/* logits [T, E] (f32/f16/bf16) -> ids [T, k], weights [T, k] (doubles), per
 * d->kind; ties go to the lower index; picks ordered by descending selection
 * score (the biased score for the grouped router). */
void ref_route(const moex_router_desc *d, const moex_tensor *logits, int64_t *ids,
               double *weights);

/* a: [rows, cols] of dt with row stride a_stride (elements); b: [rows, cols]
 * contiguous doubles -> sum (a - b)^2 / sum b^2; 0 when both are all zero,
 * +inf when only b is. */
double ref_nmse(const void *a, moex_dtype dt, int64_t rows, int64_t cols, int64_t a_stride,
                const double *b);

/* Round every element of b [n] to dt in place (what an output of dt can hold). */
void ref_round_all(double *b, int64_t n, moex_dtype dt);

#endif /* MOEX_TEST_REFERENCE_H */
