/* device_common.cuh — device helpers shared by the experts kernels: the views of a layer
 * that the kernels receive (plain structs passed by value) and the activations. Element loads
 * and stores are linear/device_elements.cuh's. */
#ifndef MOEX_DEVICE_COMMON_CUH
#define MOEX_DEVICE_COMMON_CUH

#include "linear/activation.h"
#include "linear/device_elements.cuh"

/* ---- the layer as kernels see it ------------------------------------------ */

/* One projection of every expert: element (n, k) of expert e (n an output,
 * k an input feature) is at   base_e + n*n_stride + k*k_stride   (elements),
 * base_e = ptrs ? ptrs[e] + offset : base + e*expert_stride + offset. */
typedef struct proj_view {
    const void *base;
    const void *const *ptrs; /* device array of E pointers, or NULL */
    int64_t expert_stride, offset, n_stride, k_stride;
} proj_view;

/* Bias of one projection: element n of expert e at base + e*expert_stride + offset + n*n_stride; base NULL = none. */
typedef struct bias_view {
    const void *base;
    int64_t expert_stride, offset, n_stride;
} bias_view;

/* Block scales of one quantized projection (w = code * scale): the scale of output feature n,
 * input k of expert e is element  e*expert_stride + ((row0 + n*rstep) / bn) * ld + k / bk  of
 * base (row0 + n*rstep: the feature's row in the stored matrix, as proj_view's offset and
 * n_stride say it in elements). */
typedef struct scale_view {
    const void *base;
    int64_t expert_stride, row0, rstep, ld;
} scale_view;

/* The quantization of a layer: on = 0 for float weights. FP8 (e4m3) or FP4 (e2m1, bn = 1, bk =
 * 32) weights with scales of dtype sdt (f32 or ue8m0) per bn x bk block; activations quantized
 * per token per bk inputs. */
typedef struct quant_view {
    int on;
    moex_dtype sdt;
    int64_t bn, bk;
    scale_view gate, up, down;
} quant_view;

typedef struct layer_view {
    int64_t E, H, I, k;
    int gated;
    moex_activation act;
    float alpha, limit;
    moex_dtype wdt, bdt;      /* weights, biases (the weights' dtype unless quantized) */
    proj_view gate, up, down; /* gate unused when ungated */
    bias_view gate_bias, up_bias, down_bias;
} layer_view;

__device__ __forceinline__ const char *proj_base(const proj_view &p, int64_t e, size_t esz) {
    const char *b = p.ptrs ? (const char *)p.ptrs[e] : (const char *)p.base + e * p.expert_stride * (int64_t)esz;
    return b + p.offset * (int64_t)esz;
}

__device__ __forceinline__ float bias_at(const bias_view &b, moex_dtype dt, int64_t e, int64_t n) {
    if (!b.base) return 0.0f;
    return load_elem(b.base, dt, e * b.expert_stride + b.offset + n * b.n_stride);
}

/* 2^(b-127), the value of a ue8m0 scale byte (0: 2^-127, a subnormal; 255 reads as inf). */
__device__ __forceinline__ float ue8m0_value(uint8_t b) { return __uint_as_float(b ? (uint32_t)b << 23 : 0x00400000u); }

/* Where the block scales of output feature n of expert e start (elements of q.sdt from s.base,
 * indexed then by k block; 32 bits: a grid is far smaller than 2^32 entries). */
__device__ __forceinline__ uint32_t scale_row(const quant_view &q, const scale_view &s, int64_t e, int64_t n) {
    return (uint32_t)(e * s.expert_stride + ((s.row0 + n * s.rstep) / q.bn) * s.ld);
}
/* Scale i of a grid; __ldg: scales are never written by a forward. */
__device__ __forceinline__ float scale_load(moex_dtype sdt, const void *base, uint32_t i) {
    return sdt == MOEX_UE8M0 ? ue8m0_value(__ldg((const uint8_t *)base + i)) : __ldg((const float *)base + i);
}
/* Scales row[j] + col of a grid, j < N, the dtype tested once: all N loads are issued before any
 * is used (a test per load puts a branch between them, and each then waits for the one before). */
template <int N>
__device__ __forceinline__ void scale_loads(moex_dtype sdt, const void *base, const uint32_t (&row)[N], uint32_t col,
                                            float (&v)[N]) {
    if (sdt == MOEX_UE8M0) {
        uint8_t b[N];
#pragma unroll
        for (int j = 0; j < N; j++) b[j] = __ldg((const uint8_t *)base + row[j] + col);
#pragma unroll
        for (int j = 0; j < N; j++) v[j] = ue8m0_value(b[j]);
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) v[j] = __ldg((const float *)base + row[j] + col);
    }
}

/* The activation of SPEC "The computation", in f32: act(g) * u (gated) or act(u), with
 * linear/activation.h's formulas (those of the CPU backends, rounded op by op as they are). */
__device__ __forceinline__ float activate(const layer_view &L, float g, float u) {
    const float a = L.gated ? g : u;
    float s;
    switch (L.act) {
    case MOEX_ACT_SILU: s = moex_act_silu(a); break;
    case MOEX_ACT_GELU: s = moex_act_gelu(a); break;
    case MOEX_ACT_GELU_TANH: s = moex_act_gelu_tanh(a); break;
    case MOEX_ACT_RELU: s = moex_act_relu(a); break;
    case MOEX_ACT_GPTOSS_CLAMP: return moex_act_gptoss_clamp(g, u, L.alpha, L.limit);
    case MOEX_ACT_SWIGLU_LIMIT: return moex_act_swiglu_limit(g, u, L.limit);
    default: return 0.0f;
    }
    return L.gated ? moex_rn_mul(s, u) : s;
}

/* Expert id (t, j) from an i32/i64 ids tensor with row stride ld. */
__device__ __forceinline__ int64_t load_id(const void *ids, int is64, int64_t ld, int64_t t, int64_t j) {
    return is64 ? ((const int64_t *)ids)[t * ld + j] : (int64_t)((const int32_t *)ids)[t * ld + j];
}

/* ---- programmatic dependent launches (dependent_launch below) ------------------------ */

/* Lets the stream's next kernel, if it is a programmatic dependent, place its blocks now. */
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
/* Waits until the kernel this one depends on has finished and its writes are visible (at once
 * when this kernel was launched plainly). Nothing of that kernel's output is read before it. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* ---- launches ------------------------------------------------------------------ */

#ifndef __CUDACC_RTC__ /* host code: not in the kernels compiled at run time */
#include <cuda_runtime.h>
/* Launch configuration of a programmatic dependent of the previous kernel on stream s: its
 * blocks may start once that kernel's blocks have run griddepcontrol.launch_dependents or exited
 * (what they may read before then is the kernel's own business: griddepcontrol.wait, or a wait
 * of its own). attr must outlive the launch. */
static inline cudaLaunchConfig_t dependent_launch(dim3 grid, dim3 block, cudaStream_t s, cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.stream = s;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    return cfg;
}
/* dependent_launch's configuration when after_prev, else a plain launch's. */
static inline cudaLaunchConfig_t launch_after(dim3 grid, dim3 block, cudaStream_t s, int after_prev,
                                              cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = dependent_launch(grid, block, s, attr);
    if (!after_prev) cfg.attrs = NULL, cfg.numAttrs = 0;
    return cfg;
}
#endif

#endif
