/* cpu_backends.h — the CPU implementations of the experts backends, as the dispatch table
 * (src/backends/table.c) points to them. */
#ifndef MOEX_BACKENDS_CPU_BACKENDS_H
#define MOEX_BACKENDS_CPU_BACKENDS_H

#include "backends/impl.h"

extern const moex_impl moex_cpu_eager;      /* eager.c: per expert hit, its tokens' rows */
extern const moex_impl moex_cpu_batched_mm; /* batched_mm.c: per (token, expert) pair */
extern const moex_impl moex_cpu_grouped_mm; /* grouped_mm.c: pairs sorted by expert, grouped GEMMs */

/* The CPU implementations' condition on a layer: quantized experts need dynamic activation scales. */
int moex_cpu_layer_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);

#endif
