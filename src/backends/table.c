/* table.c — the dispatch table: the one place that decides which implementation runs for
 * (backend, device, weight format), and which backend takes the decode steps. A combination
 * without a row is refused by supports() with a reason naming what the backend does run.
 *
 * Which kernels an implementation then launches at a given shape is its own size policy, a
 * named predicate beside each kernel family:
 *   CPU   moex_gemm (linear/gemm.c): rows <= MOEX_STREAM_ROWS stream the weights, more pack them
 *   CUDA  grouped_gemm_pays / grouped_gemm_narrow_pays (backends/cuda/gemm_sm90.cuh): the wgmma
 *         grouped GEMM (FP8 wide tiles in clusters of two: grouped_gemm_fp8_cluster_pays), else gemv_mma_usable (backends/cuda/gemv.cuh): the one-launch mma.sync
 *         streamed forward (gemv_mma.cu), else the plain streamed kernels (backends/cuda/gemv.cu);
 *         FP4 layers gemv_fp4_mma_pays (gemv.cuh): grouped_mm's integer mma kernels, else the dp4a
 *         kernels (backends/cuda/gemv_fp4.cu). batched_mm's down: gemv_down_pair_rows_pays (gemv.cuh):
 *         per pair into y then the pairs' sum, else the down pairs kernel with the sum fused.
 *         deepgemm takes the grouped GEMM at every size, its rows in the masked layout up to
 *         DEEPGEMM_MASKED_MAX_TOKENS tokens, else the contiguous one
 *         (backends/cuda/experts.cu), its kernels compiled per shape (backends/cuda/gemm_jit.h).
 *         sonicmoe takes the grouped GEMM at every size too, with the gathered A-load and the
 *         weighted down epilogue, its tiles by grouped_gemm_narrow_pays as grouped_mm's.
 *         deepgemm_megamoe runs grouped_mm's implementation on each rank of an expert-parallel
 *         group; its exchange goes in pieces beside it where megamoe_in_pieces says so, cut by
 *         megamoe_pieces_of (backends/cuda/ep_forward_cuda.cu), else plain EP's exchange.
 * So "what runs bf16 grouped_mm at 64 tokens on an H200" is the row {grouped_mm, cuda, float}
 * (moex_cuda_grouped_mm, experts.cu) and grouped_gemm_pays(64 * top_k pairs, E, H). */
#include "backends/impl.h"
#include "backends/planned.h"
#include "experts/dispatch.h"
#include <stdio.h>
#include <stdlib.h>

/* The implementations the rows point to, each defined in its own file. */
extern const moex_impl moex_cpu_eager;      /* backends/cpu/eager.c: per expert hit, its tokens' rows */
extern const moex_impl moex_cpu_batched_mm; /* backends/cpu/batched_mm.c: per (token, expert) pair */
extern const moex_impl moex_cpu_grouped_mm; /* backends/cpu/grouped_mm.c: pairs sorted by expert, grouped GEMMs */
#if MOEX_HAVE_CUDA
extern const moex_impl moex_cuda_eager;      /* backends/cuda/experts.cu: the grouped pieces, once per expert */
extern const moex_impl moex_cuda_batched_mm; /* streamed gate/up and down per pair */
extern const moex_impl moex_cuda_grouped_mm; /* routing on the device, then streamed or tensor-core GEMMs */
extern const moex_impl moex_cuda_deepgemm;   /* deepgemm's layouts, GEMMs compiled per shape at first use */
extern const moex_impl moex_cuda_sonicmoe;   /* the fused GEMM path: gathered A-load, weighted down, sum */
extern const moex_impl moex_cuda_megamoe;    /* backends/cuda/megamoe.c: grouped_mm's, the EP exchange beside it */
#define CUDA_IMPL(name) (&moex_cuda_##name)
#else
#define CUDA_IMPL(name) NULL /* the row stands; supports() says this build has no CUDA */
#endif

#if MOEX_TEST_BACKENDS
extern const moex_impl moex_test_rows; /* tests/backends/test_rows.c */
#endif

#define CPU MOEX_DEVICE_CPU
#define CUDA MOEX_DEVICE_CUDA
#define FLOAT MOEX_FORMAT_FLOAT
#define FP8 MOEX_FORMAT_FP8
#define FP4 MOEX_FORMAT_FP4

typedef struct row {
    const char *backend;
    moex_device_kind device;
    unsigned formats; /* moex_weight_format bits */
    const moex_impl *impl; /* NULL: not in this build */
    const char *decode_with; /* the backend of decode steps (one token per sequence), or NULL: this one */
} row;

static const row TABLE[] = {
    /* backend      device  weight formats     implementation          decode steps with */
    {"eager",       CPU,    FLOAT | FP8 | FP4, &moex_cpu_eager,        NULL},
    {"batched_mm",  CPU,    FLOAT | FP8 | FP4, &moex_cpu_batched_mm,   NULL},
    {"grouped_mm",  CPU,    FLOAT | FP8 | FP4, &moex_cpu_grouped_mm,   NULL},
    {"eager",       CUDA,   FLOAT,             CUDA_IMPL(eager),       NULL},
    {"batched_mm",  CUDA,   FLOAT | FP8 | FP4, CUDA_IMPL(batched_mm),  NULL},
    {"grouped_mm",  CUDA,   FLOAT | FP8 | FP4, CUDA_IMPL(grouped_mm),  "batched_mm"},
    {"deepgemm",    CUDA,   FLOAT | FP8,       CUDA_IMPL(deepgemm),    NULL},
    {"sonicmoe",    CUDA,   FLOAT,             CUDA_IMPL(sonicmoe),    NULL},
    {"deepgemm_megamoe", CUDA, FLOAT | FP8 | FP4, CUDA_IMPL(megamoe), NULL},
#if MOEX_TEST_BACKENDS /* the test copy of the library only (tests/backends/test_rows.c) */
    {"test_rows",   CPU,    FLOAT | FP8 | FP4, &moex_test_rows,        NULL},
#endif
};
#define N_ROWS ((int)(sizeof TABLE / sizeof TABLE[0]))

/* The built-in backends: a name, a summary and, for those whose rows are still to come, what
 * they need of a device (checked before the table). */
typedef struct builtin {
    const char *name, *summary;
    int (*needs)(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n);
} builtin;

static const builtin BUILTINS[] = {
    {"eager", "reference loop over the experts that were hit, projecting their tokens", NULL},
    {"batched_mm", "every (token, expert) pair reads its expert's weights: one batched pass (small inputs on GPU)", NULL},
    {"grouped_mm", "sort pairs by expert, one grouped GEMM over all experts per projection (large inputs)", NULL},
    {"deepgemm", "grouped GEMMs compiled per shape at first use, contiguous and masked layouts (Hopper; bf16, FP8)",
     moex_deepgemm_needs},
    {"deepgemm_megamoe", "expert parallelism whose dispatch and combine run in pieces on the copy engines beside "
                         "grouped_mm's GEMMs (a group of Hopper GPUs; chosen at load time)", moex_megamoe_needs},
    {"sonicmoe", "fused grouped GEMMs: rows gathered inside gate/up, routing weights in down, a gather-and-sum "
                 "combine (Hopper; bf16/f16 gated)", moex_sonicmoe_needs},
#if MOEX_TEST_BACKENDS
    {"test_rows", "test only: token by token, slot by slot, f32 straight from the layer description", NULL},
#endif
};
#define N_BUILTINS ((int)(sizeof BUILTINS / sizeof BUILTINS[0]))

moex_weight_format moex_weight_format_of(const moex_experts_desc *d) {
    switch (moex_weight_dtype(d)) {
    case MOEX_F32: case MOEX_F16: case MOEX_BF16: return MOEX_FORMAT_FLOAT;
    case MOEX_E4M3: return MOEX_FORMAT_FP8;
    case MOEX_E2M1X2: return MOEX_FORMAT_FP4;
    default: return (moex_weight_format)0;
    }
}

const char *moex_weight_format_name(moex_weight_format f) {
    switch (f) {
    case MOEX_FORMAT_FLOAT: return "f32/f16/bf16";
    case MOEX_FORMAT_FP8: return "fp8 (e4m3)";
    case MOEX_FORMAT_FP4: return "fp4 (e2m1)";
    }
    return "";
}

/* The row of (backend, device kind, format); format 0: any row of (backend, device kind). */
static const row *find_row(const char *backend, moex_device_kind kind, unsigned format) {
    for (int i = 0; i < N_ROWS; i++)
        if (TABLE[i].device == kind && strcmp(TABLE[i].backend, backend) == 0 && (!format || (TABLE[i].formats & format)))
            return &TABLE[i];
    return NULL;
}

static const char *kind_name(moex_device_kind k) { return k == MOEX_DEVICE_CUDA ? "a CUDA device" : "the CPU"; }

/* Why (backend, dev, format) has no row, into why. */
static void no_row(const char *backend, const moex_device_info *dev, unsigned format, char *why, size_t n) {
    const moex_device_kind kind = dev->device.kind;
    if (!find_row(backend, CPU, 0) && !find_row(backend, CUDA, 0)) {
        snprintf(why, n, "%s is not implemented in moex %s yet; use grouped_mm or batched_mm", backend, MOEX_VERSION_STRING);
        return;
    }
    if (!find_row(backend, kind, 0)) {
        snprintf(why, n, "%s has no implementation for %s", backend, kind_name(kind));
        return;
    }
    /* a row for the device, not for this format: list the formats it takes */
    char took[96] = "";
    size_t len = 0;
    for (unsigned f = 1; f <= FP4; f <<= 1) {
        const row *r = find_row(backend, kind, f);
        if (r && len < sizeof took)
            len += (size_t)snprintf(took + len, sizeof took - len, "%s%s", len ? ", " : "",
                                    moex_weight_format_name((moex_weight_format)f));
    }
    snprintf(why, n, "%s on %s takes %s weights, not %s", backend, kind_name(kind), took,
             format ? moex_weight_format_name((moex_weight_format)format) : "this dtype");
}

/* ---- the registry entry of a built-in: every call goes through the table ---------------------- */

/* The implementation of what a state says, and the state it made. */
typedef struct dispatched {
    const moex_impl *impl;
    void *state;
} dispatched;

static int builtin_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n,
                            void *user) {
    const builtin *b = user;
    if (b->needs && !b->needs(layer, dev, why, n)) return 0;
    if (!dev->available) {
        snprintf(why, n, "%s", dev->reason);
        return 0;
    }
    const unsigned format = layer ? (unsigned)moex_weight_format_of(layer) : 0;
    const row *r = layer && !format ? NULL : find_row(b->name, dev->device.kind, format);
    if (!r) {
        no_row(b->name, dev, format, why, n);
        return 0;
    }
    if (!r->impl) {
        snprintf(why, n, "this build of moex has no CUDA support; rebuild with the CUDA toolkit");
        return 0;
    }
    return r->impl->supports ? r->impl->supports(layer, dev, why, n) : 1;
}

/* The row for a context's device and a layer (supports() has accepted them). */
static const row *row_for(const builtin *b, const moex_context *ctx, const moex_experts_desc *layer,
                          moex_context_options *o) {
    if (moex_context_get_options(ctx, o)) return NULL;
    return find_row(b->name, o->device.kind, (unsigned)moex_weight_format_of(layer));
}

static size_t builtin_workspace(const moex_experts_desc *layer, int64_t max_tokens, const moex_context *ctx,
                                void *user) {
    moex_context_options o;
    const row *r = row_for(user, ctx, layer, &o);
    if (!r || !r->impl || !r->impl->workspace_bytes) return 0;
    return r->impl->workspace_bytes(layer, max_tokens, o.device.kind == CUDA ? 0 : o.num_threads);
}

static moex_status builtin_prepare(moex_context *ctx, const moex_experts_desc *layer, void **state, void *user) {
    const builtin *b = user;
    moex_context_options o;
    const row *r = row_for(b, ctx, layer, &o);
    if (!r || !r->impl) return moex_fail(MOEX_ERR_INTERNAL, "%s: no dispatch row for this context and layer", b->name);
    dispatched *d = calloc(1, sizeof *d);
    if (!d) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_prepare: out of memory");
    d->impl = r->impl;
    moex_status st = r->impl->prepare ? r->impl->prepare(ctx, layer, &d->state) : MOEX_OK;
    if (st) {
        free(d);
        return st;
    }
    *state = d;
    return MOEX_OK;
}

static void builtin_release(void *state, void *user) {
    dispatched *d = state;
    if (!d) return;
    if (d->impl->release && d->state) d->impl->release(d->state);
    free(d);
}

static moex_status builtin_forward(const moex_forward_args *args, void *user) {
    const dispatched *d = args->state;
    if (!d) return moex_fail(MOEX_ERR_INTERNAL, "%s: forward without a prepared state", ((const builtin *)user)->name);
    moex_forward_args a = *args;
    a.state = d->state;
    return d->impl->forward(&a);
}

const moex_backend *moex_builtin_backends(int *count) {
    static moex_backend list[N_BUILTINS];
    static int made; /* called once, under the registry's pthread_once */
    if (!made) {
        for (int i = 0; i < N_BUILTINS; i++) {
            moex_backend b = {.name = BUILTINS[i].name,
                              .summary = BUILTINS[i].summary,
                              .supports = builtin_supports,
                              .workspace_bytes = builtin_workspace,
                              .prepare = builtin_prepare,
                              .release = builtin_release,
                              .forward = builtin_forward,
                              .user = (void *)&BUILTINS[i]};
            list[i] = b;
        }
        made = 1;
    }
    *count = N_BUILTINS;
    return list;
}

unsigned moex_dispatch_device_formats(moex_device_kind kind) {
    unsigned f = 0;
    for (int i = 0; i < N_ROWS; i++)
        if (TABLE[i].device == kind && TABLE[i].impl) f |= TABLE[i].formats;
    return f;
}

int moex_dispatch_overlaps_exchange(const moex_backend *b, moex_device_kind kind, const moex_experts_desc *layer) {
    if (!b || b->supports != builtin_supports || !layer) return 0;
    const row *r = find_row(((const builtin *)b->user)->name, kind, (unsigned)moex_weight_format_of(layer));
    return r && r->impl && r->impl->overlaps_exchange;
}

const char *moex_dispatch_decode_backend(const char *name, moex_device_kind kind) {
    const row *r = find_row(name, kind, 0);
    return r && r->decode_with ? r->decode_with : name;
}
