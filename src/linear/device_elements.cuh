/* device_elements.cuh — element loads and stores by dtype in device code, shared by the experts
 * kernels (src/backends/cuda) and the decoder kernels (src/decoder/cuda). */
#ifndef MOEX_LINEAR_DEVICE_ELEMENTS_CUH
#define MOEX_LINEAR_DEVICE_ELEMENTS_CUH

#include "moex.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* ---- elements ------------------------------------------------------------ */

__device__ __forceinline__ float load_elem(const void *p, moex_dtype dt, int64_t i) {
    if (dt == MOEX_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == MOEX_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void store_elem(void *p, moex_dtype dt, int64_t i, float v) {
    if (dt == MOEX_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == MOEX_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((float *)p)[i] = v;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

#endif
