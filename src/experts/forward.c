/* forward.c — moex_experts_forward: every check, then the backend. Nothing is
 * written before all checks pass. */
#include "experts/dispatch.h"

static moex_status check_activations(const moex_context *ctx, const moex_experts_desc *d, const moex_tensor *hidden,
                                     const moex_tensor *out) {
    int64_t hs[2] = {-1, d->hidden};
    moex_status st = moex_check_shape(hidden, "hidden", 2, hs);
    if (st) return st;
    int64_t os[2] = {hidden->shape[0], d->hidden};
    if ((st = moex_check_shape(out, "out", 2, os))) return st;
    if (!moex_is_float_dtype(hidden->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "hidden: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(hidden->dtype));
    if (out->dtype != hidden->dtype)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "out: dtype %s differs from hidden's %s", moex_dtype_name(out->dtype),
                         moex_dtype_name(hidden->dtype));
    if ((st = moex_check_rows(hidden, "hidden"))) return st;
    return moex_check_rows(out, "out");
}

static moex_status check_routing(const moex_experts_desc *d, const moex_tensor *ids, const moex_tensor *weights,
                                 int64_t T) {
    int64_t rs[2] = {T, d->top_k};
    moex_status st = moex_check_shape(ids, "ids", 2, rs);
    if (st) return st;
    if ((st = moex_check_shape(weights, "weights", 2, rs))) return st;
    if (ids->dtype != MOEX_I32 && ids->dtype != MOEX_I64)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "ids: dtype %s is not supported (i32, i64)", moex_dtype_name(ids->dtype));
    if (!moex_is_float_dtype(weights->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "weights: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(weights->dtype));
    if ((st = moex_check_rows(ids, "ids"))) return st;
    return moex_check_rows(weights, "weights");
}

/* Every id must be in [0, E) or a sentinel (-1 or E); E: the group's experts with expert
 * parallelism. Host tensors only. */
static moex_status check_ids(const moex_tensor *ids, int64_t T, int64_t k, int64_t E) {
    if (ids->device.kind != MOEX_DEVICE_CPU) return MOEX_OK; /* device ids are checked by the device code */
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = moex_id_at(ids, t, j);
            if (e < -1 || e > E)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                                 "ids[%lld,%lld] = %lld is outside [0, %lld) and is not a sentinel (-1 or %lld)",
                                 (long long)t, (long long)j, (long long)e, (long long)E, (long long)E);
        }
    return MOEX_OK;
}

static moex_status check_devices(const moex_context *ctx, const moex_tensor *const *ts, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (ts[i]->device.kind != ctx->options.device.kind ||
            (ctx->options.device.kind == MOEX_DEVICE_CUDA && ts[i]->device.index != ctx->options.device.index)) {
            char where[32];
            moex_device_str(ts[i]->device, where, sizeof where);
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s is in %s memory but the context computes on %s", names[i],
                             where, ctx->device_info.name);
        }
    return MOEX_OK;
}

/* Every check of one forward's arguments, in order; *p: the prepared entry when found. */
static moex_status check_forward(moex_context *ctx, const moex_layer *layer, const char *backend, int index,
                                 const moex_tensor *hidden, const moex_tensor *ids, const moex_tensor *weights,
                                 const moex_tensor *out, moex_prepared **p) {
    const moex_experts_desc *d = &layer->desc;
    moex_status st = check_activations(ctx, d, hidden, out);
    if (st) return st;
    int64_t T = hidden->shape[0];
    if ((st = check_routing(d, ids, weights, T))) return st;
    const moex_tensor *ts[4] = {hidden, ids, weights, out};
    const char *names[4] = {"hidden", "ids", "weights", "out"};
    if ((st = check_devices(ctx, ts, names, 4))) return st;
    if (T > ctx->options.max_tokens)
        return moex_fail(MOEX_ERR_WORKSPACE, "T = %lld tokens exceeds the context's max_tokens = %lld",
                         (long long)T, (long long)ctx->options.max_tokens);
    for (int i = 0; i < 3; i++) /* all on one device now: out must share no byte with an input */
        if ((st = moex_check_disjoint(out, "out", ts[i], names[i]))) return st;
    if (!(*p = moex_context_find_prepared(ctx, layer->id, index)))
        return moex_fail(MOEX_ERR_NOT_PREPARED,
                         "the layer is not prepared for backend \"%s\" in this context: call moex_prepare first", backend);
    const int64_t E = d->num_experts * (ctx->options.ep_group ? moex_ep_group_size(ctx->options.ep_group) : 1);
    return check_ids(ids, T, d->top_k, E);
}

moex_status moex_experts_forward(moex_context *ctx, const moex_layer *layer, const char *backend,
                                 const moex_tensor *hidden, const moex_tensor *ids, const moex_tensor *weights,
                                 moex_tensor *out) {
    const char *null_name = !ctx ? "ctx" : !layer ? "layer" : !backend ? "backend" : !hidden ? "hidden"
                          : !ids ? "ids" : !weights ? "weights" : !out ? "out" : NULL;
    if (null_name && (!ctx || !ctx->options.ep_group))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_forward: %s is NULL", null_name);
    int index = -1;
    const moex_backend *b = backend ? moex_registry_find(backend, &index) : NULL;
    moex_prepared *p = NULL;
    moex_status st = null_name ? moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_forward: %s is NULL", null_name)
                   : !b        ? moex_registry_not_found(backend)
                               : check_forward(ctx, layer, backend, index, hidden, ids, weights, out, &p);
    /* a rank of an expert-parallel group takes part in the exchange whatever its checks found */
    if (ctx->options.ep_group) return moex_ep_forward(ctx, layer, b, st ? NULL : p, hidden, ids, weights, out, st);
    if (st) return st;
    const int64_t T = hidden->shape[0];
    if (T == 0) return MOEX_OK;
    moex_forward_args args = {
        .ctx = ctx, .layer = &layer->desc, .state = p->state, .hidden = hidden, .ids = ids, .weights = weights,
        .out = out, .tokens = T, .num_threads = ctx->options.device.kind == MOEX_DEVICE_CUDA ? 0 : ctx->options.num_threads,
        .workspace = ctx->workspace, .workspace_bytes = ctx->workspace_bytes,
    };
    return moex_backend_call_forward(b, &args);
}
