/* blas_status.cuh — a cuBLAS status as a moex status with cuBLAS's own words (the decoder's
 * cuBLAS users: decoder_linear.cu, decoder_attention_gemm.cu). */
#ifndef MOEX_CUDA_BLAS_STATUS_CUH
#define MOEX_CUDA_BLAS_STATUS_CUH

#include "core/internal.h"
#include <cublas_v2.h>

static inline moex_status blas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return MOEX_OK;
    return moex_fail(s == CUBLAS_STATUS_ALLOC_FAILED ? MOEX_ERR_OUT_OF_MEMORY : MOEX_ERR_DEVICE,
                     "%s: cuBLAS status %d (%s): %s", what, (int)s, cublasGetStatusName(s), cublasGetStatusString(s));
}

#endif
