/* cuda_check.h — CUDA errors as moex statuses, for the .cu files only. */
#ifndef MOEX_CUDA_CHECK_H
#define MOEX_CUDA_CHECK_H

#include "core/internal.h"
#include <cuda_runtime.h>

extern "C" {
/* MOEX_OK for cudaSuccess; otherwise records "what: CUDA error N (name): text". */
moex_status moex_cuda_status(cudaError_t err, const char *what);
/* cudaSetDevice(device), failing with a message when it does not exist. */
moex_status moex_cuda_use(int device);
}

/* The launch error of the kernel just queued, as a status. */
#define MOEX_CUDA_LAUNCHED(what) moex_cuda_status(cudaGetLastError(), what)

#endif
