/* builtin_backends.c — the registry entries of eager, batched_mm and
 * grouped_mm. Each entry runs the CPU implementation (src/cpu/) on a CPU
 * context and the CUDA one (src/cuda/) on a CUDA context; the choice is made
 * from the device in every call, so one name serves both. */
#include "cpu/common.h"
#include <stdio.h>
#if MOEX_HAVE_CUDA
#include "cuda/cuda_api.h"
#endif

/* On a CUDA device: the CUDA backend's answer, or why this build has none. */
static int cuda_supports(int kind, const moex_experts_desc *d, const moex_device_info *dev, char *why, size_t n) {
    if (!dev->available) {
        snprintf(why, n, "%s", dev->reason);
        return 0;
    }
#if MOEX_HAVE_CUDA
    return moex_cuda_supports((moex_cuda_kind)kind, d, dev, why, n);
#else
    snprintf(why, n, "this build of moex has no CUDA support; rebuild with the CUDA toolkit");
    return 0;
#endif
}

#if MOEX_HAVE_CUDA
#define ON_CUDA(ctx) ((ctx)->options.device.kind == MOEX_DEVICE_CUDA)
#define CUDA_WORKSPACE(kind, d, T) moex_cuda_workspace_bytes(kind, d, T)
#define CUDA_PREPARE(kind, ctx, d, s) moex_cuda_prepare(kind, ctx, d, s)
#define CUDA_RELEASE(kind, s) moex_cuda_release(kind, s)
#define CUDA_FORWARD(kind, a) moex_cuda_forward(kind, a)
#else
#define ON_CUDA(ctx) 0
#define CUDA_WORKSPACE(kind, d, T) 0
#define CUDA_PREPARE(kind, ctx, d, s) MOEX_OK
#define CUDA_RELEASE(kind, s) (void)0
#define CUDA_FORWARD(kind, a) MOEX_ERR_UNSUPPORTED
#endif

/* The workspace_bytes() hook has no context; user carries nothing, so the
 * device is told by the threads argument: CUDA contexts pass threads = 0. */
#define DEFINE_BUILTIN(NAME, KIND, SUMMARY)                                                                         \
    static int NAME##_supports(const moex_experts_desc *d, const moex_device_info *dev, char *why, size_t n,        \
                               void *user) {                                                                        \
        if (dev->device.kind == MOEX_DEVICE_CUDA) return cuda_supports(KIND, d, dev, why, n);                       \
        return moex_cpu_supports(d, dev, why, n, user);                                                             \
    }                                                                                                               \
    static size_t NAME##_workspace(const moex_experts_desc *d, int64_t max_tokens, int threads, void *user) {       \
        if (threads == 0) return CUDA_WORKSPACE(KIND, d, max_tokens);                                               \
        return moex_cpu_##NAME##_workspace(d, max_tokens, threads, user);                                           \
    }                                                                                                               \
    static moex_status NAME##_prepare(moex_context *ctx, const moex_experts_desc *d, void **state, void *user) {    \
        if (ON_CUDA(ctx)) return CUDA_PREPARE(KIND, ctx, d, state);                                                 \
        return MOEX_OK;                                                                                             \
    }                                                                                                               \
    static void NAME##_release(void *state, void *user) {                                                           \
        if (state) CUDA_RELEASE(KIND, state);                                                                       \
    }                                                                                                               \
    static moex_status NAME##_forward(const moex_forward_args *a, void *user) {                                     \
        if (ON_CUDA(a->ctx)) return CUDA_FORWARD(KIND, a);                                                          \
        return moex_cpu_##NAME##_forward(a, user);                                                                  \
    }                                                                                                               \
    const moex_backend moex_backend_##NAME = {.name = #NAME,                                                        \
                                              .summary = SUMMARY,                                                   \
                                              .supports = NAME##_supports,                                          \
                                              .workspace_bytes = NAME##_workspace,                                  \
                                              .prepare = NAME##_prepare,                                            \
                                              .release = NAME##_release,                                            \
                                              .forward = NAME##_forward};

DEFINE_BUILTIN(eager, 0, "reference loop over the experts that were hit, projecting their tokens")
DEFINE_BUILTIN(batched_mm, 1,
               "every (token, expert) pair reads its expert's weights: one batched pass (small inputs on GPU)")
DEFINE_BUILTIN(grouped_mm, 2, "sort pairs by expert, one grouped GEMM over all experts per projection (large inputs)")
