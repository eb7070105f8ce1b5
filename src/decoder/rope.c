/* rope.c — rotary position embeddings, HF rotate_half convention, and the
 * interleaved MRoPE of qwen3_vl_moe (see decoder.h). */
#include "decoder/decoder.h"
#include <math.h>
#include <string.h>

static moex_status check_head_dim(const char *fn, int64_t head_dim) {
    if (head_dim < 2 || head_dim % 2 != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: head_dim = %lld must be even and >= 2", fn,
                         (long long)head_dim);
    return MOEX_OK;
}

// -> inv_freq: [head_dim / 2]
moex_status moex_rope_inv_freq(int64_t head_dim, double theta, float *inv_freq) {
    moex_status st = check_head_dim("rope_inv_freq", head_dim);
    if (st) return st;
    const float base = (float)theta;
    if (!isfinite(theta) || !(theta > 0.0) || !isfinite(base) || base == 1.0f || !(base > 0.0f))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "rope_inv_freq: theta = %g must be finite, > 0 and not 1",
                         theta);
    if (!inv_freq) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "rope_inv_freq: inv_freq is NULL");
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const float e = (float)(2 * i) / (float)head_dim;       /* arange(0, dim, 2).float() / dim */
        const float p = (float)pow((double)base, (double)e);      /* base ** e, in f32 */
        inv_freq[i] = 1.0f / p;                                   /* 1.0 / (...) */
    }
    return MOEX_OK;
}

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

// The correction dimension of num_rotations rotations (transformers' find_correction_dim).
static double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos) {
    return ((double)dim * log(max_pos / (rotations * 2.0 * 3.14159265358979323846))) / (2.0 * log(base));
}

moex_status moex_rope_inv_freq_yarn(int64_t dim, double theta, const moex_yarn_params *y, float *inv_freq,
                                    double *attention_factor) {
    const char *fn = "rope_inv_freq_yarn";
    if (!y || !inv_freq || !attention_factor)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !y ? "yarn" : !inv_freq ? "inv_freq" : "attention_factor");
    const double omax = y->original_max_position_embeddings;
    if (!(omax > 0.0) || !isfinite(omax))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: original_max_position_embeddings = %g must be > 0", fn, omax);
    double factor = y->factor;
    if (factor == 0.0) factor = y->max_position_embeddings / omax;
    if (!(factor > 0.0) || !isfinite(factor))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: factor = %g must be finite and > 0", fn, factor);
    const double beta_fast = y->beta_fast != 0.0 ? y->beta_fast : 32.0, beta_slow = y->beta_slow != 0.0 ? y->beta_slow : 1.0;
    if (!(beta_fast > 0.0) || !(beta_slow > 0.0) || !isfinite(beta_fast) || !isfinite(beta_slow))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: beta_fast = %g and beta_slow = %g must be finite and > 0", fn,
                         beta_fast, beta_slow);
    if (y->attention_factor < 0.0 || !isfinite(y->attention_factor) || !isfinite(y->mscale) || !isfinite(y->mscale_all_dim))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: attention_factor = %g, mscale = %g, mscale_all_dim = %g: "
                         "finite, attention_factor >= 0", fn, y->attention_factor, y->mscale, y->mscale_all_dim);
    moex_status st = moex_rope_inv_freq(dim, theta, inv_freq); /* the extrapolation: 1 / pos */
    if (st) return st;
    double low = yarn_correction_dim(beta_fast, dim, theta, omax), high = yarn_correction_dim(beta_slow, dim, theta, omax);
    if (y->truncate) low = floor(low), high = ceil(high);
    if (low < 0.0) low = 0.0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
    const float lo = (float)low, span = (float)(high - low), fac = (float)factor;
    for (int64_t i = 0; i < dim / 2; i++) {
        const float extrap = inv_freq[i];
        const float e = (float)(2 * i) / (float)dim;
        const float p = (float)pow((double)(float)theta, (double)e); /* pos_freqs, as moex_rope_inv_freq has it */
        const float interp = 1.0f / (fac * p);
        float ramp = ((float)i - lo) / span;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        const float ef = 1.0f - ramp; /* the extrapolation factor */
        inv_freq[i] = interp * (1.0f - ef) + extrap * ef;
    }
    if (y->attention_factor > 0.0)
        *attention_factor = y->attention_factor;
    else if (y->mscale != 0.0 && y->mscale_all_dim != 0.0)
        *attention_factor = yarn_mscale(factor, y->mscale) / yarn_mscale(factor, y->mscale_all_dim);
    else
        *attention_factor = yarn_mscale(factor, 1.0);
    return MOEX_OK;
}

static moex_status check_tables(const char *fn, const float *inv_freq, int64_t head_dim, int64_t T,
                                const float *c, const float *s) {
    moex_status st = check_head_dim(fn, head_dim);
    if (st) return st;
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld tokens is negative", fn, (long long)T);
    if (!inv_freq) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: inv_freq is NULL", fn);
    int64_t n;
    if (!moex_mul_ok(T, head_dim / 2, &n) || n > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld tokens of head_dim %lld overflows", fn,
                         (long long)T, (long long)head_dim);
    if (T > 0 && (!c || !s))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !c ? "cos" : "sin");
    return MOEX_OK;
}

static moex_status check_positions(const char *fn, const char *what, const int64_t *pos, int64_t T) {
    if (T > 0 && !pos) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    for (int64_t t = 0; t < T; t++)
        if (pos[t] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s[%lld] = %lld is negative", fn, what, (long long)t,
                             (long long)pos[t]);
    return MOEX_OK;
}

// The angle of one frequency at one position, then its cos and sin, as transformers in f32.
static inline void cos_sin_at(float inv_freq, int64_t pos, float *c, float *s) {
    const float angle = (float)pos * inv_freq; /* position_ids.float(), an f32 product */
    *c = (float)cos((double)angle);
    *s = (float)sin((double)angle);
}

// inv_freq: [d/2], positions: [T] -> cos, sin: [T, d/2]
moex_status moex_rope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t *positions, int64_t T,
                              float *cos_out, float *sin_out) {
    moex_status st = check_tables("rope_cos_sin", inv_freq, head_dim, T, cos_out, sin_out);
    if (!st) st = check_positions("rope_cos_sin", "positions", positions, T);
    if (st) return st;
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++)
            cos_sin_at(inv_freq[i], positions[t], cos_out + t * half + i, sin_out + t * half + i);
    return MOEX_OK;
}

// inv_freq: [d/2], pos_t, pos_h, pos_w: [T] -> cos, sin: [T, d/2]
moex_status moex_mrope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t section[3],
                               const int64_t *pos_t, const int64_t *pos_h, const int64_t *pos_w, int64_t T,
                               float *cos_out, float *sin_out) {
    const char *fn = "mrope_cos_sin";
    moex_status st = check_tables(fn, inv_freq, head_dim, T, cos_out, sin_out);
    if (st) return st;
    if (!section) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: mrope_section is NULL", fn);
    const int64_t half = head_dim / 2;
    if (section[0] < 0 || section[1] < 0 || section[2] < 0 || section[0] > half || section[1] > half ||
        section[2] > half || section[0] + section[1] + section[2] != half)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "%s: mrope_section = [%lld, %lld, %lld] must be >= 0 and sum to head_dim / 2 = %lld", fn,
                         (long long)section[0], (long long)section[1], (long long)section[2], (long long)half);
    if (!st) st = check_positions(fn, "pos_t", pos_t, T);
    if (!st) st = check_positions(fn, "pos_h", pos_h, T);
    if (!st) st = check_positions(fn, "pos_w", pos_w, T);
    if (st) return st;
    // apply_interleaved_mrope: freqs_t[..., slice(1, 3*section[1], 3)] = freqs_h[...], then
    // freqs_t[..., slice(2, 3*section[2], 3)] = freqs_w[...]; everything else stays T.
    const int64_t h_end = 3 * section[1], w_end = 3 * section[2];
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            int64_t pos = pos_t[t];
            if (i % 3 == 1 && i < h_end) pos = pos_h[t];
            else if (i % 3 == 2 && i < w_end) pos = pos_w[t];
            cos_sin_at(inv_freq[i], pos, cos_out + t * half + i, sin_out + t * half + i);
        }
    return MOEX_OK;
}

// x: [T, heads, head_dim] (in place), cos, sin: [T, head_dim/2]
moex_status moex_rope_apply_partial(float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                                    const float *cos_in, const float *sin_in) {
    const char *fn = "rope_apply";
    moex_status st = check_head_dim(fn, head_dim);
    if (st) return st;
    if (rotary_dim < 2 || rotary_dim % 2 || rotary_dim > head_dim)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: rotary_dim = %lld must be even, >= 2 and at most head_dim = %lld",
                         fn, (long long)rotary_dim, (long long)head_dim);
    if (T < 0 || heads < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld must be >= 0 and heads = %lld >= 1", fn,
                         (long long)T, (long long)heads);
    int64_t rows, n;
    if (!moex_mul_ok(T, heads, &rows) || !moex_mul_ok(rows, head_dim, &n) || n > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: [%lld, %lld, %lld] overflows", fn, (long long)T,
                         (long long)heads, (long long)head_dim);
    if (T == 0) return MOEX_OK;
    if (!x) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
    if (!cos_in || !sin_in) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !cos_in ? "cos" : "sin");
    const int64_t half = rotary_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_in + t * half, *s = sin_in + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[half + i];
                // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-x2, x1); one rounding per op
                const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
                v[i] = ac - bs;
                v[half + i] = bc + as;
            }
        }
    }
    return MOEX_OK;
}

moex_status moex_rope_apply(float *x, int64_t T, int64_t heads, int64_t head_dim, const float *cos_in,
                            const float *sin_in) {
    return moex_rope_apply_partial(x, T, heads, head_dim, head_dim, cos_in, sin_in);
}

moex_status moex_rope_apply_interleaved(float *x, int64_t T, int64_t heads, int64_t head_dim, const float *cos_in,
                                        const float *sin_in) {
    const char *fn = "rope_apply_interleaved";
    moex_status st = check_head_dim(fn, head_dim);
    if (st) return st;
    if (head_dim > MOEX_ROPE_INTERLEAVED_MAX)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: head_dim = %lld is more than %d", fn, (long long)head_dim,
                         MOEX_ROPE_INTERLEAVED_MAX);
    int64_t rows, n;
    if (T < 0 || heads < 1 || !moex_mul_ok(T, heads, &rows) || !moex_mul_ok(rows, head_dim, &n) || n > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld, heads = %lld, head_dim = %lld", fn, (long long)T,
                         (long long)heads, (long long)head_dim);
    if (T == 0) return MOEX_OK;
    if (!x || !cos_in || !sin_in)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : !cos_in ? "cos" : "sin");
    const int64_t half = head_dim / 2;
    float out[MOEX_ROPE_INTERLEAVED_MAX];
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_in + t * half, *s = sin_in + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) { /* pair (2i, 2i+1) -> (i, half + i), as transformers lays it out */
                const float a = v[2 * i], b = v[2 * i + 1];
                const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
                out[i] = ac - bs;
                out[half + i] = bc + as;
            }
            memcpy(v, out, (size_t)head_dim * sizeof(float));
        }
    }
    return MOEX_OK;
}
