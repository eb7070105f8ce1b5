/* planned.h — what the GPU backends built on run-time compiled or fused kernels (deepgemm,
 * deepgemm_megamoe, sonicmoe) need of a device and a layer (planned.c), checked before the
 * dispatch table's rows. deepgemm has its row (backends/cuda/experts.cu); the others' come with
 * their kernels, and until then the table states these needs and that this version has no
 * implementation. */
#ifndef MOEX_BACKENDS_PLANNED_H
#define MOEX_BACKENDS_PLANNED_H

#include "experts/experts_internal.h"

/* 1, or 0 with a reason: each backend's conditions on the device and the layer (layer may be NULL). */
int moex_deepgemm_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);
int moex_megamoe_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);
int moex_sonicmoe_needs(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);

#endif
