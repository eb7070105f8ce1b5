/* impl.h — one implementation of an experts backend on one device: what a row of the dispatch
 * table (table.c) points to. Implementations live in backends/cpu and backends/cuda; they see
 * the context only through the public getters (moex_context_get_options, moex_context_stream,
 * moex_context_status_word), as a user's backend does. */
#ifndef MOEX_BACKENDS_IMPL_H
#define MOEX_BACKENDS_IMPL_H

#include "experts/experts_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moex_impl {
    /* Further conditions of this implementation for a layer of the row's formats on dev (layer NULL:
     * the device alone). 1, or 0 and a reason in why. NULL: every such layer. */
    int (*supports)(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);
    /* Workspace bytes of one forward of up to max_tokens tokens with `threads` threads (CPU) or on
     * the GPU (threads 0); SIZE_MAX on overflow. NULL: none. */
    size_t (*workspace_bytes)(const moex_experts_desc *layer, int64_t max_tokens, int threads);
    /* Per (layer, context) state, or NULL. NULL: no state. */
    moex_status (*prepare)(moex_context *ctx, const moex_experts_desc *layer, void **state);
    void (*release)(void *state);
    /* args->state is what prepare made. */
    moex_status (*forward)(const moex_forward_args *args);
    /* In a context with an expert-parallel group: 1 when the exchange runs in pieces beside this
     * implementation's compute (backends/cuda/ep_forward_cuda.cu; deepgemm_megamoe), 0 for the
     * plain exchange around one forward. */
    int overlaps_exchange;
} moex_impl;

#ifdef __cplusplus
}
#endif

#endif
