/* planned.c — the needs of the fused GPU backends (see planned.h). */
#include "backends/planned.h"
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

int moex_deepgemm_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    return need_hopper("deepgemm", dev, why, n);
}

int moex_megamoe_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    if (!need_hopper("deepgemm_megamoe (several GPUs in an expert-parallel group, EP size > 1)", dev, why, n)) return 0;
    if (dev->cuda_devices < 2) {
        snprintf(why, n, "deepgemm_megamoe needs several GPUs in an expert-parallel group (EP size > 1); %d visible",
                 dev->cuda_devices);
        return 0;
    }
    return 1;
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
