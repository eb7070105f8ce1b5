/* activation.h — the activations, written once for host and device code: the experts
 * (experts/activation.c on the CPU, the `activate` of backends/cuda/device_common.cuh on the
 * GPU) and the decoder's dense MLPs (decoder/mlp.c, decoder/cuda/decoder_elementwise.cu).
 *
 * Every f32 operation is one of the helpers below, rounded once: plain C arithmetic on the
 * host (the library is built as ISO C11, so the compiler contracts nothing into an FMA), the
 * __f*_rn intrinsics on the device (which nvcc never contracts). The two sides therefore round
 * the same way; the only differences left are the device's expf/erff/tanhf (within 2 ulp).
 *
 *   silu          x / (1 + expf(-x))
 *   gelu          (x * 0.5) * (1 + erff(x * M_SQRT1_2))                       (PyTorch's CPU order)
 *   gelu_tanh     (0.5 * x) * (1 + tanhf(beta * (x + kappa * ((x * x) * x))))  beta = sqrt(2/pi),
 *                                                                              kappa = 0.044715
 *   relu          max(x, 0), a NaN stays a NaN (torch.relu)
 *   sigmoid       1 / (1 + expf(-x))
 *   gptoss_clamp  g = min(g, limit), u = clamp(u, -limit, limit): (u + 1) * (g / (1 + expf(-alpha * g)))
 *   swiglu_limit  the same clamps: silu(g) * u
 *
 * Internal, not installed. In .cu files the intrinsics come with the CUDA runtime header nvcc
 * includes by itself. */
#ifndef MOEX_LINEAR_ACTIVATION_H
#define MOEX_LINEAR_ACTIVATION_H

#include "moex.h"
#include <math.h>

#ifdef __CUDACC__
#define MOEX_HD static __host__ __device__ __forceinline__
#else
#define MOEX_HD static inline
#endif

/* ---- f32 operations rounded one by one --------------------------------------- */

MOEX_HD float moex_rn_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

MOEX_HD float moex_rn_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

MOEX_HD float moex_rn_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- the activations ------------------------------------------------------------ */

MOEX_HD float moex_act_silu(float x) { return moex_rn_div(x, moex_rn_add(1.0f, expf(-x))); }

MOEX_HD float moex_act_gelu(float x) {
    const float a = moex_rn_mul(x, (float)0.70710678118654752440 /* M_SQRT1_2 */);
    return moex_rn_mul(moex_rn_mul(x, 0.5f), moex_rn_add(1.0f, erff(a)));
}

MOEX_HD float moex_act_gelu_tanh(float x) {
    const float beta = (float)0.79788456080286535588 /* M_SQRT2 * M_2_SQRTPI * 0.5 */, kappa = 0.044715f;
    const float x3 = moex_rn_mul(moex_rn_mul(x, x), x);
    const float inner = moex_rn_mul(beta, moex_rn_add(x, moex_rn_mul(kappa, x3)));
    return moex_rn_mul(moex_rn_mul(0.5f, x), moex_rn_add(1.0f, tanhf(inner)));
}

MOEX_HD float moex_act_relu(float x) { return x > 0.0f ? x : (x == x ? 0.0f : x); /* NaN stays NaN */ }

MOEX_HD float moex_act_sigmoid(float x) { return moex_rn_div(1.0f, moex_rn_add(1.0f, expf(-x))); }

MOEX_HD float moex_act_gptoss_clamp(float g, float u, float alpha, float limit) {
    const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
    const float glu = moex_rn_div(gc, moex_rn_add(1.0f, expf(moex_rn_mul(-alpha, gc))));
    return moex_rn_mul(moex_rn_add(uc, 1.0f), glu);
}

MOEX_HD float moex_act_swiglu_limit(float g, float u, float limit) {
    const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
    return moex_rn_mul(moex_act_silu(gc), uc);
}

/* act(x) for the four plain kinds (silu, gelu, gelu_tanh, relu); x itself for the clamped
 * kinds, which need a gate (callers reject them before). */
MOEX_HD float moex_act_plain(moex_activation act, float x) {
    switch (act) {
    case MOEX_ACT_SILU: return moex_act_silu(x);
    case MOEX_ACT_GELU: return moex_act_gelu(x);
    case MOEX_ACT_GELU_TANH: return moex_act_gelu_tanh(x);
    case MOEX_ACT_RELU: return moex_act_relu(x);
    default: return x;
    }
}

/* The gated form: act(g) * u, or the clamped kinds' own formulas. */
MOEX_HD float moex_act_gated(moex_activation act, float g, float u, float alpha, float limit) {
    switch (act) {
    case MOEX_ACT_GPTOSS_CLAMP: return moex_act_gptoss_clamp(g, u, alpha, limit);
    case MOEX_ACT_SWIGLU_LIMIT: return moex_act_swiglu_limit(g, u, limit);
    default: return moex_rn_mul(moex_act_plain(act, g), u);
    }
}

#endif
