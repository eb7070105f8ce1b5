/* activation.c — the activations between the two projections, in f32. */
#include "experts/experts_internal.h"
#include <math.h>

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
static inline float relu(float x) { return x > 0.0f ? x : 0.0f; }

static inline float plain(moex_activation a, float x) {
    switch (a) {
    case MOEX_ACT_SILU: return silu(x);
    case MOEX_ACT_GELU: return gelu(x);
    case MOEX_ACT_GELU_TANH: return gelu_tanh(x);
    case MOEX_ACT_RELU: return relu(x);
    default: return x; /* clamped kinds are gated-only: rejected at layer creation */
    }
}

// g, u: [n] -> h: [n]
void moex_activation_gated(const moex_experts_desc *d, const float *g, const float *u, float *h, int64_t n) {
    const float limit = d->limit, alpha = d->alpha;
    switch (d->activation) {
    case MOEX_ACT_GPTOSS_CLAMP:
        for (int64_t i = 0; i < n; i++) {
            float gi = fminf(g[i], limit), ui = fminf(fmaxf(u[i], -limit), limit);
            h[i] = (ui + 1.0f) * (gi / (1.0f + expf(-alpha * gi)));
        }
        break;
    case MOEX_ACT_SWIGLU_LIMIT:
        for (int64_t i = 0; i < n; i++) {
            float gi = fminf(g[i], limit), ui = fminf(fmaxf(u[i], -limit), limit);
            h[i] = silu(gi) * ui;
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) h[i] = plain(d->activation, g[i]) * u[i];
        break;
    }
}

// u: [n] -> h: [n]
void moex_activation_plain(const moex_experts_desc *d, const float *u, float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = plain(d->activation, u[i]);
}
