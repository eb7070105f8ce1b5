/* context.c — execution contexts: device, threads, the workspace, and the
 * (layer, backend) states that moex_prepare() makes. */
#include "experts/dispatch.h"
#include "experts/ep_group.h"
#include <stdlib.h>
#if MOEX_HAVE_CUDA
#include "core/gpu_runtime.h"
#endif

#define MAX_THREADS 1024

moex_context_options moex_context_default_options(void) {
    moex_context_options o;
    memset(&o, 0, sizeof o);
    o.device.kind = MOEX_DEVICE_CPU;
    o.max_tokens = 1024;
    return o;
}

moex_status moex_context_create(const moex_context_options *options, moex_context **out) {
    if (!options || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_create: %s is NULL", options ? "out" : "options");
    moex_context_options o = *options;
    if (o.num_threads < 0 || o.num_threads > MAX_THREADS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "num_threads = %d is outside [0, %d]", o.num_threads, MAX_THREADS);
    if (o.max_tokens < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "max_tokens = %lld, must be >= 1", (long long)o.max_tokens);
    if (o.stream_slot < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "stream_slot = %d, must be >= 0", o.stream_slot);
    moex_device_info info;
    moex_status st = moex_device_query(o.device, &info);
    if (st) return st;
    if (!info.available)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "device %s is not available: %s", info.name, info.reason);
    if (o.ep_group && (st = moex_ep_group_bind(o.ep_group, o.device))) return st;
    if (o.num_threads == 0) o.num_threads = info.cpu_cores > 0 ? info.cpu_cores : moex_cpu_cores();
    moex_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: out of memory");
    ctx->options = o;
    ctx->device_info = info;
    if (o.ep_group && !(ctx->ep_scratch = calloc(1, moex_ep_scratch_bytes(o.ep_group->size)))) {
        free(ctx);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_context_create: out of memory");
    }
#if MOEX_HAVE_CUDA
    if (o.device.kind == MOEX_DEVICE_CUDA) {
        st = moex_cuda_stream(o.device.index, o.stream_slot, &ctx->stream);
        if (!st) st = moex_cuda_flags_alloc(o.device.index, &ctx->device_flags);
        /* ranks in processes (a group over the caller's transport) share their events through CUDA IPC */
        const int processes = o.ep_group && !o.ep_group->hub;
        for (int i = 0; i < 2 && !st && o.ep_group; i++)
            st = moex_cuda_event_create(o.device.index, processes, &ctx->ep_events[i]);
        if (!st && processes) st = moex_ep_cuda_peers_new(o.ep_group->size, &ctx->ep_peers);
        if (st) {
            moex_context_free(ctx);
            return st;
        }
    }
#endif
    *out = ctx;
    return MOEX_OK;
}

static int on_cuda(const moex_context *ctx) { return ctx->options.device.kind == MOEX_DEVICE_CUDA; }

static void workspace_free(moex_context *ctx, void *p) {
    if (on_cuda(ctx))
        moex_device_free(ctx->options.device, p);
    else
        free(p);
}

void moex_context_free(moex_context *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->prepared_count; i++) {
        const moex_backend *b = moex_registry_at(ctx->prepared[i].backend_index);
        if (b->release) b->release(ctx->prepared[i].state, b->user);
        moex_layer_free(ctx->prepared[i].ep_rows);
    }
    free(ctx->prepared);
#if MOEX_HAVE_CUDA /* before what the ranks shared: it may wait for the other ranks (dispatch.h) */
    moex_ep_cuda_pipe_free(ctx->ep_pipe);
    moex_ep_cuda_peers_free(ctx->ep_peers, ctx->options.device.index, ctx->options.ep_group);
#endif
    free(ctx->ep_scratch);
    workspace_free(ctx, ctx->workspace);
    if (ctx->device_flags) moex_device_free(ctx->options.device, ctx->device_flags);
#if MOEX_HAVE_CUDA
    for (int i = 0; i < 2; i++) moex_cuda_event_free(ctx->options.device.index, ctx->ep_events[i]);
#endif
    free(ctx);
}

moex_status moex_context_get_options(const moex_context *ctx, moex_context_options *out) {
    if (!ctx || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_get_options: %s is NULL", ctx ? "out" : "ctx");
    *out = ctx->options;
    return MOEX_OK;
}

size_t moex_context_workspace_bytes(const moex_context *ctx) { return ctx ? ctx->workspace_bytes : 0; }

moex_status moex_context_workspace(moex_context *ctx, void **ptr, size_t *bytes) {
    if (!ctx || !ptr || !bytes)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_workspace: %s is NULL", !ctx ? "ctx" : !ptr ? "ptr" : "bytes");
    *ptr = ctx->workspace;
    *bytes = ctx->workspace_bytes;
    return MOEX_OK;
}

/* The prepared entry for (layer, backend) in ctx, or NULL. */
moex_prepared *moex_context_find_prepared(moex_context *ctx, uint64_t layer_id, int backend_index) {
    for (int i = 0; i < ctx->prepared_count; i++)
        if (ctx->prepared[i].layer_id == layer_id && ctx->prepared[i].backend_index == backend_index)
            return &ctx->prepared[i];
    return NULL;
}

/* Grow the workspace to at least bytes (contents are not kept). */
static moex_status reserve_workspace(moex_context *ctx, size_t bytes) {
    if (bytes <= ctx->workspace_bytes) return MOEX_OK;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "workspace of %zu bytes is too large", bytes);
    void *p;
    if (on_cuda(ctx)) {
        if (ctx->capturing)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "moex_prepare would grow the workspace during a graph capture: prepare before moex_graph_begin");
        moex_status st = moex_context_synchronize(ctx); /* the old workspace may still be in use */
        if (st) return st;
        if ((st = moex_device_alloc(ctx->options.device, rounded, &p))) return st;
    } else {
        p = aligned_alloc(64, rounded);
        if (!p) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "could not allocate a workspace of %zu bytes", rounded);
        memset(p, 0, rounded); /* touch every page now, not in the first forward */
    }
    int kept = 0; /* a workspace shared with other processes' ranks outlives this call (see dispatch.h) */
#if MOEX_HAVE_CUDA
    moex_status st = on_cuda(ctx) ? moex_ep_cuda_peers_retire(ctx->ep_peers, ctx->workspace, &kept) : MOEX_OK;
    if (st) {
        workspace_free(ctx, p);
        return st;
    }
#endif
    if (!kept) workspace_free(ctx, ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_bytes = rounded;
    return MOEX_OK;
}

moex_status moex_prepare(moex_context *ctx, moex_layer *layer, const char *backend) {
    if (!ctx || !layer || !backend)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_prepare: %s is NULL",
                         !ctx ? "ctx" : !layer ? "layer" : "backend");
    int index;
    const moex_backend *b = moex_registry_find(backend, &index);
    if (!b) return moex_registry_not_found(backend);
    if (moex_context_find_prepared(ctx, layer->id, index)) return MOEX_OK;
    char why[512];
    moex_status st = moex_backend_call_supports(b, &layer->desc, &ctx->device_info, why, sizeof why);
    if (st == MOEX_ERR_UNSUPPORTED)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "experts backend \"%s\" cannot run this layer on %s: %s", backend,
                         ctx->device_info.name, why);
    if (st) return st;
    const moex_device wdev = moex_weight_device(&layer->desc);
    if (wdev.kind != ctx->options.device.kind || (on_cuda(ctx) && wdev.index != ctx->options.device.index)) {
        char where[32];
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "the layer's weights are in %s memory but the context computes on %s",
                         moex_device_str(wdev, where, sizeof where), ctx->device_info.name);
    }
    if (ctx->prepared_count == ctx->prepared_capacity) {
        int cap = ctx->prepared_capacity ? 2 * ctx->prepared_capacity : 16;
        moex_prepared *p = realloc(ctx->prepared, (size_t)cap * sizeof *p);
        if (!p) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_prepare: out of memory");
        ctx->prepared = p;
        ctx->prepared_capacity = cap;
    }
    /* With an expert-parallel group the backend runs on the rows this rank receives, one pair each. */
    moex_layer *rows_layer = NULL;
    const moex_layer *run = layer;
    int64_t tokens = ctx->options.max_tokens;
    size_t exchange = 0;
    if (ctx->options.ep_group) {
        const int ranks = ctx->options.ep_group->size;
        tokens = moex_ep_max_rows(ranks, ctx->options.max_tokens, layer->desc.top_k);
        exchange = tokens < 0 ? SIZE_MAX
                   : moex_ep_exchange_bytes(&layer->desc, ctx->options.max_tokens, ranks, ctx->options.device.kind);
        if (exchange == SIZE_MAX)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "expert parallelism: a rank may receive %d ranks x max_tokens = %lld x top_k = %lld rows, "
                             "more than fit in memory addresses or 2^31 - 1 rows; create the context with a smaller "
                             "max_tokens", ranks, (long long)ctx->options.max_tokens, (long long)layer->desc.top_k);
        if ((st = moex_layer_one_per_row(layer, &rows_layer))) return st;
        run = rows_layer;
    }
    size_t need = b->workspace_bytes ? b->workspace_bytes(&run->desc, tokens, ctx, b->user) : 0;
    if (need == SIZE_MAX || need > SIZE_MAX - exchange) {
        moex_layer_free(rows_layer);
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "backend \"%s\": the workspace for max_tokens = %lld tokens x top_k = %lld does not fit in memory "
                         "addresses (or exceeds 2^31 - 1 token-expert pairs); create the context with a smaller max_tokens",
                         backend, (long long)tokens, (long long)run->desc.top_k);
    }
    void *state = NULL;
    if ((st = reserve_workspace(ctx, exchange + need)) ||
        (b->prepare && (st = moex_backend_call_prepare(b, ctx, &run->desc, &state)))) {
        moex_layer_free(rows_layer);
        return st;
    }
    ctx->prepared[ctx->prepared_count++] = (moex_prepared){layer->id, index, state, rows_layer};
    return MOEX_OK;
}

/* ---------------------------------------------------------------- streams and graphs */

struct moex_graph {
    void *exec;
    moex_context *ctx;
};

static moex_status need_cuda(const moex_context *ctx, const char *what) {
    if (!ctx) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", what);
    if (!on_cuda(ctx))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s needs a CUDA context; this one computes on %s", what,
                         ctx->device_info.name);
    return MOEX_OK;
}

moex_status moex_context_synchronize(moex_context *ctx) {
    if (!ctx) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_synchronize: ctx is NULL");
    if (!on_cuda(ctx)) return MOEX_OK;
    if (ctx->capturing)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_synchronize during a graph capture: end it first");
#if MOEX_HAVE_CUDA
    return moex_cuda_synchronize(ctx->options.device.index, ctx->stream, ctx->device_flags);
#else
    return MOEX_OK;
#endif
}

moex_status moex_context_stream(moex_context *ctx, void **stream) {
    moex_status st = need_cuda(ctx, "moex_context_stream");
    if (st) return st;
    if (!stream) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_stream: stream is NULL");
    *stream = ctx->stream;
    return MOEX_OK;
}

moex_status moex_context_status_word(moex_context *ctx, int **word) {
    moex_status st = need_cuda(ctx, "moex_context_status_word");
    if (st) return st;
    if (!word) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_context_status_word: word is NULL");
    *word = ctx->device_flags;
    return MOEX_OK;
}

moex_status moex_graph_begin(moex_context *ctx) {
    moex_status st = need_cuda(ctx, "moex_graph_begin");
    if (st) return st;
    if (ctx->capturing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_begin: this context is already capturing");
#if MOEX_HAVE_CUDA
    if ((st = moex_cuda_graph_begin(ctx->options.device.index, ctx->stream))) return st;
#endif
    ctx->capturing = 1;
    return MOEX_OK;
}

moex_status moex_graph_end(moex_context *ctx, moex_graph **out) {
    moex_status st = need_cuda(ctx, "moex_graph_end");
    if (st) return st;
    if (!ctx->capturing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_end: no capture in progress");
    ctx->capturing = 0;
    void *exec = NULL;
#if MOEX_HAVE_CUDA
    st = moex_cuda_graph_end(ctx->options.device.index, ctx->stream, &exec);
    if (st) return st;
#endif
    if (!out) {
#if MOEX_HAVE_CUDA
        moex_cuda_graph_free(exec);
#endif
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_end: out is NULL (the capture was dropped)");
    }
    moex_graph *g = calloc(1, sizeof *g);
    if (!g) {
#if MOEX_HAVE_CUDA
        moex_cuda_graph_free(exec);
#endif
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_graph_end: out of memory");
    }
    g->exec = exec;
    g->ctx = ctx;
    *out = g;
    return MOEX_OK;
}

moex_status moex_graph_launch(moex_graph *graph, moex_context *ctx) {
    if (!graph) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_launch: graph is NULL");
    moex_status st = need_cuda(ctx, "moex_graph_launch");
    if (st) return st;
    if (graph->ctx != ctx)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_launch: the graph was captured in another context");
    if (ctx->capturing) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_graph_launch during a capture");
#if MOEX_HAVE_CUDA
    return moex_cuda_graph_launch(ctx->options.device.index, graph->exec, ctx->stream);
#else
    return MOEX_OK;
#endif
}

void moex_graph_free(moex_graph *graph) {
    if (!graph) return;
#if MOEX_HAVE_CUDA
    moex_cuda_graph_free(graph->exec);
#endif
    free(graph);
}
