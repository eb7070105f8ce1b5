/* gpu_backends.c — the names of the fused GPU backends (deepgemm,
 * deepgemm_megamoe, sonicmoe). Their kernels are not in this version of moex:
 * each `supports` states what the backend needs, and on a device that meets
 * it, that this build does not have it yet. forward is never reached. */
#include "experts/experts_internal.h"
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

static int not_in_this_version(const char *name, char *why, size_t n) {
    snprintf(why, n, "%s is not implemented in moex %s yet; use grouped_mm or batched_mm", name, MOEX_VERSION_STRING);
    return 0;
}

static int deepgemm_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n,
                             void *user) {
    if (!need_hopper("deepgemm", dev, why, n)) return 0;
    return not_in_this_version("deepgemm", why, n);
}

static int megamoe_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n,
                            void *user) {
    if (!need_hopper("deepgemm_megamoe (several GPUs in an expert-parallel group, EP size > 1)", dev, why, n)) return 0;
    if (dev->cuda_devices < 2) {
        snprintf(why, n, "deepgemm_megamoe needs several GPUs in an expert-parallel group (EP size > 1); %d visible",
                 dev->cuda_devices);
        return 0;
    }
    return not_in_this_version("deepgemm_megamoe", why, n);
}

static int sonicmoe_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n,
                             void *user) {
    if (!need_hopper("sonicmoe", dev, why, n)) return 0;
    if (layer && (!layer->gated || layer->activation > MOEX_ACT_RELU)) {
        snprintf(why, n, "sonicmoe runs gated silu, gelu or relu experts only (SwiGLU, GeGLU, ReGLU); this layer is %s %s",
                 layer->gated ? "gated" : "ungated", moex_activation_name(layer->activation));
        return 0;
    }
    return not_in_this_version("sonicmoe", why, n);
}

static moex_status unreachable_forward(const moex_forward_args *args, void *user) {
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this backend has no forward in this build");
}

const moex_backend moex_backend_deepgemm = {
    .name = "deepgemm", .summary = "TMA-aligned grouped GEMM for Hopper (SM90+); bf16 and FP8 experts",
    .supports = deepgemm_supports, .forward = unreachable_forward};
const moex_backend moex_backend_deepgemm_megamoe = {
    .name = "deepgemm_megamoe",
    .summary = "one fused expert-parallel kernel: dispatch, gate/up, SwiGLU, down, combine (several GPUs)",
    .supports = megamoe_supports, .forward = unreachable_forward};
const moex_backend moex_backend_sonicmoe = {
    .name = "sonicmoe", .summary = "fused bf16 routed forward in grouped-GEMM kernels (SM90+, gated activations)",
    .supports = sonicmoe_supports, .forward = unreachable_forward};
