/* cuda_backends.h — the CUDA implementations of the experts backends (experts.cu), as the
 * dispatch table (src/backends/table.c) points to them. */
#ifndef MOEX_BACKENDS_CUDA_BACKENDS_H
#define MOEX_BACKENDS_CUDA_BACKENDS_H

#include "backends/impl.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const moex_impl moex_cuda_eager;      /* the grouped pieces launched once per expert */
extern const moex_impl moex_cuda_batched_mm; /* streamed gate/up and down per (token, expert) pair */
extern const moex_impl moex_cuda_grouped_mm; /* routing on the device, then streamed or tensor-core GEMMs */

#ifdef __cplusplus
}
#endif

#endif
