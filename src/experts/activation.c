/* activation.c — the activations between the two projections, in f32 (the formulas are
 * linear/activation.h's, shared with the GPU kernels). */
#include "experts/experts_internal.h"
#include "linear/activation.h"

// g, u: [n] -> h: [n]
void moex_activation_gated(const moex_experts_desc *d, const float *g, const float *u, float *h, int64_t n) {
    const float limit = d->limit, alpha = d->alpha;
    switch (d->activation) {
    case MOEX_ACT_GPTOSS_CLAMP:
        for (int64_t i = 0; i < n; i++) h[i] = moex_act_gptoss_clamp(g[i], u[i], alpha, limit);
        break;
    case MOEX_ACT_SWIGLU_LIMIT:
        for (int64_t i = 0; i < n; i++) h[i] = moex_act_swiglu_limit(g[i], u[i], limit);
        break;
    default:
        for (int64_t i = 0; i < n; i++) h[i] = moex_rn_mul(moex_act_plain(d->activation, g[i]), u[i]);
        break;
    }
}

// u: [n] -> h: [n]
void moex_activation_plain(const moex_experts_desc *d, const float *u, float *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = moex_act_plain(d->activation, u[i]);
}
