/* planned.c — the needs of the fused GPU backends (see planned.h). */
#include "backends/planned.h"
#include "backends/cuda/gemm_rtc.h"
#include "experts/dispatch.h"
#include "gpu/jit.h"
#include <stdio.h>

/* A CUDA device of compute capability >= 9.0, or a reason. */
static int need_hopper(const char *name, const moex_device_info *dev, char *why, size_t n) {
    if (dev->device.kind != MOEX_DEVICE_CUDA) {
        snprintf(why, n, "%s needs an NVIDIA GPU of compute capability >= 9.0 (Hopper or newer); this device is the CPU. "
                 "Use grouped_mm on the CPU", name);
        return 0;
    }
    if (!dev->available) {
        snprintf(why, n, "%s needs an NVIDIA GPU of compute capability >= 9.0: %s", name, dev->reason);
        return 0;
    }
    if (dev->cc_major < 9) {
        snprintf(why, n, "%s needs compute capability >= 9.0; %s has %d.%d. Use grouped_mm", name, dev->name,
                 dev->cc_major, dev->cc_minor);
        return 0;
    }
    return 1;
}

/* SPEC R5: Hopper or newer; FP4 experts on SM100+ only (Hopper runs them in grouped_mm and
 * batched_mm); dynamic activation scales; NVRTC, which compiles its kernels at first use, and
 * the CUDA toolkit's headers those kernels include. */
int moex_deepgemm_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    if (!need_hopper("deepgemm", dev, why, n)) return 0;
    const moex_weight_format f = layer ? moex_weight_format_of(layer) : MOEX_FORMAT_FLOAT;
    if (f == MOEX_FORMAT_FP4 && dev->cc_major < 10) {
        snprintf(why, n, "deepgemm runs FP4 (e2m1) experts on SM100+ (Blackwell) only; %s has compute capability %d.%d. "
                 "Use grouped_mm or batched_mm, which run FP4 experts on it", dev->name, dev->cc_major, dev->cc_minor);
        return 0;
    }
    if (f == MOEX_FORMAT_FP8 && layer->activation_scheme == MOEX_ACT_SCHEME_STATIC) {
        snprintf(why, n, "deepgemm quantizes activations dynamically, per row and per 128 inputs; this layer's "
                 "activation_scheme is static (one per-tensor scale), which it rejects");
        return 0;
    }
    char w[640];
    if (!moex_jit_nvrtc_available(NULL, NULL, w, sizeof w)) {
        snprintf(why, n, "deepgemm compiles its kernels at their first forward: %s", w);
        return 0;
    }
    char dir[4096];
    if (!moex_gemm_rtc_cuda_include(dir, sizeof dir, w, sizeof w)) {
        snprintf(why, n, "deepgemm compiles its kernels at their first forward: %s. grouped_mm and batched_mm need "
                 "neither", w);
        return 0;
    }
    return 1;
}

/* An NVIDIA GPU of compute capability >= 9.0; the expert-parallel group it needs is the context's,
 * checked when a layer is prepared (backends/cuda/megamoe.c). */
int moex_megamoe_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    (void)layer;
    return need_hopper("deepgemm_megamoe (the experts of an expert-parallel group of GPUs)", dev, why, n);
}

int moex_sonicmoe_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    if (!need_hopper("sonicmoe", dev, why, n)) return 0;
    if (layer && (!layer->gated || layer->activation > MOEX_ACT_RELU)) {
        snprintf(why, n, "sonicmoe runs gated silu, gelu or relu experts only (SwiGLU, GeGLU, ReGLU); this layer is %s %s",
                 layer->gated ? "gated" : "ungated", moex_activation_name(layer->activation));
        return 0;
    }
    return 1;
}
