/* gemm_jit.h — the grouped GEMM's kernels compiled at run time (gemm_rtc.h), held once per
 * process, device and specialisation: the first request of one compiles it (or reads it from the
 * disk cache, gpu/jit.h) and loads it; every later request, from any layer or context, gets the
 * loaded kernel. Kernels stay loaded until the process ends, as the library's own do. Requests
 * may come from several threads and while a stream is being captured. Plain C; CUDA builds. */
#ifndef MOEX_GEMM_JIT_H
#define MOEX_GEMM_JIT_H

#include "backends/cuda/gemm_rtc.h"
#include "gpu/jit_load.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel of spec for the current device (compute capability cc x 10, e.g. 90), with its
 * dynamic shared memory allowed (smem_bytes). cache_dir: moex_jit_build's. *k is a copy of the
 * held kernel's handles (never released by the caller). */
moex_status gemm_jit_kernel(int device, int cc, const gemm_rtc_spec *spec, int smem_bytes, const char *cache_dir,
                            moex_jit_kernel *k);

#ifdef __cplusplus
}
#endif

#endif
