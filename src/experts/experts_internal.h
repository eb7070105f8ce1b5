/* experts_internal.h — layer, context and registry internals shared by the
 * experts front end (src/experts) and the backends (src/backends). */
#ifndef MOEX_EXPERTS_INTERNAL_H
#define MOEX_EXPERTS_INTERNAL_H

#include "core/internal.h"
#include "linear/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moex_layer {
    moex_experts_desc desc;
    uint64_t id; /* unique for the life of the process: keys prepared states */
};

/* One (layer, backend) pair prepared in a context. */
typedef struct moex_prepared {
    uint64_t layer_id;
    int backend_index;
    void *state;
    moex_layer *ep_rows; /* contexts with an expert-parallel group: the layer with top_k 1 that the
                            backend was prepared for (a received row is one pair); else NULL */
} moex_prepared;

struct moex_context {
    moex_context_options options; /* num_threads resolved */
    moex_device_info device_info;
    void *workspace;              /* 64-byte aligned */
    size_t workspace_bytes;
    moex_prepared *prepared;
    int prepared_count, prepared_capacity;
    /* CUDA contexts: workspace is device memory; the stream of the context's
     * slot; a device int32 where kernels report bad ids; capture in progress. */
    void *stream;
    int *device_flags;
    int capturing;
    void *ep_scratch; /* contexts with an expert-parallel group: moex_ep_scratch_bytes of host memory */
    void *ep_events[2]; /* CUDA contexts with a group: this rank's "rows posted" and "results posted" events */
    void *ep_peers;     /* CUDA contexts with a group over the caller's transport: its peers' opened IPC handles */
    void *ep_pipe;      /* CUDA contexts with a group: deepgemm_megamoe's side streams and events (or NULL) */
    int ep_kinds_agreed; /* a group over the caller's transport: every rank's device kind found the same */
};

/* A copy of layer with top_k 1 and an id of its own: what an expert-parallel rank's backend
 * runs on the rows it receives. */
moex_status moex_layer_one_per_row(const moex_layer *layer, moex_layer **out);

/* The prepared entry for (layer, backend) in ctx, or NULL. */
moex_prepared *moex_context_find_prepared(moex_context *ctx, uint64_t layer_id, int backend_index);

/* ---- registry ---------------------------------------------------------- */

/* The backend registered under name and its index, or NULL (no error set). */
const moex_backend *moex_registry_find(const char *name, int *index);
/* The backend at index (must be valid). */
const moex_backend *moex_registry_at(int index);
/* Fail with MOEX_ERR_NOT_FOUND, listing the valid names. */
moex_status moex_registry_not_found(const char *name);

/* A backend's functions, called through these checks (src/experts/registry.c): a failure
 * without a message of its own gets one naming the backend, and a value that is not a
 * moex_status (for supports: not 0 or 1) becomes MOEX_ERR_INTERNAL saying so. */
/* MOEX_OK if b supports layer on dev; MOEX_ERR_UNSUPPORTED with the reason in why (never
 * empty; why_size >= 1) and no message set, for the caller to word; MOEX_ERR_INTERNAL with
 * its message (and in why) when supports returned something other than 0 or 1. */
moex_status moex_backend_call_supports(const moex_backend *b, const moex_experts_desc *layer,
                                       const moex_device_info *dev, char *why, size_t why_size);
moex_status moex_backend_call_prepare(const moex_backend *b, moex_context *ctx, const moex_experts_desc *layer,
                                      void **state);
moex_status moex_backend_call_forward(const moex_backend *b, const moex_forward_args *args);

/* ---- weight views (weight_views.c) ----------------------------------- */

/* Weight matrices of expert e as logical B [K, N] starting at output row `base`.
 * A product must not cross row I of a gated gate_up (gate | up): in the
 * per-expert layout those are two matrices. */
moex_bmat moex_gate_up_mat(const moex_experts_desc *d, int64_t e, int64_t base);
moex_bmat moex_down_mat(const moex_experts_desc *d, int64_t e, int64_t base);

/* ---- activation -------------------------------------------------------- */

/* h[i] = act(g[i]) * u[i] (gated) for the layer's activation; n elements. */
void moex_activation_gated(const moex_experts_desc *d, const float *g, const float *u, float *h, int64_t n);
/* h[i] = act(u[i]) (ungated). */
void moex_activation_plain(const moex_experts_desc *d, const float *u, float *h, int64_t n);

/* dtype and device of the layer's weights, in either layout. */
static inline moex_dtype moex_weight_dtype(const moex_experts_desc *d) {
    return d->expert_up ? d->expert_dtype : d->gate_up.dtype;
}
static inline moex_device moex_weight_device(const moex_experts_desc *d) {
    return d->expert_up ? d->expert_device : d->gate_up.device;
}

/* Expert id as int64 from an i32/i64 ids tensor element (t, j). */
static inline int64_t moex_id_at(const moex_tensor *ids, int64_t t, int64_t j) {
    int64_t off = t * ids->strides[0] + j * ids->strides[1];
    return ids->dtype == MOEX_I32 ? (int64_t)((const int32_t *)ids->data)[off] : ((const int64_t *)ids->data)[off];
}

/* Routing weight (t, j) as f32. */
static inline float moex_weight_at(const moex_tensor *w, int64_t t, int64_t j) {
    return moex_load_f32(w->data, w->dtype, t * w->strides[0] + j * w->strides[1]);
}

#ifdef __cplusplus
}
#endif

#endif
