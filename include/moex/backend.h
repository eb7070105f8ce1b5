/*
 * moex/backend.h — for backend authors: what a forward receives, the backend
 * struct, registering one, the registry, and what a backend reaches of a context (its
 * workspace and stream are moex/experts.h's getters; the status word is here).
 */
#ifndef MOEX_BACKEND_H
#define MOEX_BACKEND_H

#include "moex/experts.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Backends and the registry                                                */
/* ------------------------------------------------------------------------ */

/** Everything a backend's forward receives; inputs already validated. */
typedef struct moex_forward_args {
    moex_context *ctx;
    const moex_experts_desc *layer;  /**< validated description */
    void *state;                     /**< what the backend's prepare returned (or NULL) */
    const moex_tensor *hidden;       /**< [T, H], dtype f32/f16/bf16, inner stride 1 */
    const moex_tensor *ids;          /**< [T, k], i32 or i64; -1 and E are sentinels */
    const moex_tensor *weights;      /**< [T, k], f32/f16/bf16 */
    moex_tensor *out;                /**< [T, H], same dtype as hidden, inner stride 1 */
    int64_t tokens;                  /**< T (>= 1; T == 0 never reaches a backend) */
    int num_threads;                 /**< the context's thread count (0 on a CUDA context) */
    void *workspace;                 /**< the context's workspace */
    size_t workspace_bytes;          /**< its size, at least what workspace_bytes() asked */
} moex_forward_args;

/**
 * A backend: a name and a few functions. Register your own with
 * moex_register_backend(); the built-ins are registered at start.
 * A forward must not write `out` unless it succeeds, must not allocate, and
 * must not depend on the thread count for its result.
 *
 * Failures: a function that fails returns a moex_status other than MOEX_OK
 * and says why with moex_backend_fail(). moex checks what comes back:
 *   - a failure with no message of the function's own is reported as
 *     `backend "NAME": prepare failed with status N and no message (...)`
 *     (never with an older, unrelated moex_last_error());
 *   - a value that is not a moex_status (say 12345 or -7) becomes
 *     MOEX_ERR_INTERNAL with `backend "NAME" returned 12345, which is not a
 *     moex_status (...)`;
 *   - supports() must return 1 or 0; anything else is MOEX_ERR_INTERNAL too.
 */
typedef struct moex_backend {
    const char *name;        /**< unique, [a-z0-9_], at most 63 characters */
    const char *summary;     /**< one line for listings (may be NULL) */
    /** Can this backend run `layer` on the device `dev`? Return 1, or 0 and
     *  write a reason a user can act on into why (why_size bytes, at least 1;
     *  or record it with moex_backend_fail()). layer is NULL when only the
     *  device is asked about. Required. */
    int (*supports)(const moex_experts_desc *layer, const moex_device_info *dev,
                    char *why, size_t why_size, void *user);
    /** Workspace bytes one forward of up to max_tokens tokens needs in ctx. Optional (0).
     *  The device and thread count are moex_context_get_options(ctx)'s; on a CUDA
     *  context the workspace is GPU memory. SIZE_MAX means "too large":
     *  moex_prepare fails naming max_tokens. */
    size_t (*workspace_bytes)(const moex_experts_desc *layer, int64_t max_tokens,
                              const moex_context *ctx, void *user);
    /** Per layer and context: re-layout, lazy loading. Optional. Returns
     *  MOEX_OK, or a failure with a message from moex_backend_fail() (and
     *  nothing kept: release is not called for a failed prepare). */
    moex_status (*prepare)(moex_context *ctx, const moex_experts_desc *layer,
                           void **state, void *user);
    /** Release what prepare made. Optional. Cannot fail. */
    void (*release)(void *state, void *user);
    /** Compute out from hidden, ids and weights. Required. Returns MOEX_OK, or
     *  a failure with a message from moex_backend_fail() and out untouched. */
    moex_status (*forward)(const moex_forward_args *args, void *user);
    void *user;              /**< passed back to every function */
} moex_backend;

/**
 * For a backend's functions: record a printf-style message as this thread's
 * moex_last_error() (at most 1023 bytes are kept) and return status, so that
 * a failure is one line:
 *     return moex_backend_fail(MOEX_ERR_UNSUPPORTED,
 *                              "my_backend: hidden = %lld is not a multiple of 64", h);
 * Name the bad value, as moex's own messages do. The arguments may include
 * moex_last_error() itself. Usable from any thread; each thread has its own message.
 */
moex_status moex_backend_fail(moex_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/**
 * Register a backend. The struct and its name are copied. Fails with
 * MOEX_ERR_EXISTS if the name is taken, MOEX_ERR_INVALID_ARGUMENT on a bad
 * name or a missing required function. Thread-safe.
 */
moex_status moex_register_backend(const moex_backend *backend);

/** Number of registered backends (built-ins first). Thread-safe. */
int moex_backend_count(void);

/** Name of the i-th registered backend, or NULL if i is out of range. Thread-safe. */
const char *moex_backend_name(int i);

/** One-line summary of a backend, or NULL if unknown. Thread-safe. */
const char *moex_backend_summary(const char *name);

/**
 * Look a name up: MOEX_OK if registered, else MOEX_ERR_NOT_FOUND with a
 * message listing the valid names. Thread-safe.
 */
moex_status moex_backend_lookup(const char *name);

/**
 * Can backend `name` run `layer` on `device`? MOEX_OK if yes; otherwise
 * MOEX_ERR_UNSUPPORTED (or MOEX_ERR_NOT_FOUND) and a reason in why (if
 * why is not NULL) and in moex_last_error(). layer may be NULL to ask about
 * the device alone. Thread-safe.
 */
moex_status moex_backend_supports(const char *name, const moex_layer *layer,
                                  moex_device device, char *why, size_t why_size);

/** MOEX_CUDA_STATUS_BAD_ID: the status-word bit of an expert id outside [-1, E]. */
#define MOEX_CUDA_STATUS_BAD_ID 1

/**
 * The context's status word: an int32 in GPU memory that kernels set bits of
 * (atomicOr) for values the host could not check without a synchronisation,
 * such as MOEX_CUDA_STATUS_BAD_ID. moex_context_synchronize() reads, reports
 * and clears it. For backends: the same word the built-in ones use. Fails with
 * MOEX_ERR_UNSUPPORTED on a CPU context.
 */
moex_status moex_context_status_word(moex_context *ctx, int **word);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_BACKEND_H */
