/* router.c — router logits [T, E] -> (ids [T, k], weights [T, k]).
 * Softmax top-k (Qwen, Mixtral), sigmoid grouped top-k (DeepSeek-V3), top-k
 * then softmax (GPT-OSS). f32 arithmetic; ties go to the lower expert index. */
#include "experts/experts_internal.h"
#include <math.h>
#include <stdlib.h>

moex_status moex_router_desc_init(moex_router_desc *desc) {
    if (!desc) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_router_desc_init: desc is NULL");
    memset(desc, 0, sizeof *desc);
    desc->kind = MOEX_ROUTER_SOFTMAX_TOPK;
    desc->n_group = 1;
    desc->topk_group = 1;
    desc->scaling = 1.0f;
    return MOEX_OK;
}

// score: [n] -> idx: [k], the k largest in descending order; masked entries
// (allowed[i] == 0, when allowed is not NULL) are never picked.
static void top_k(const float *score, const unsigned char *allowed, int64_t n, int64_t k, int64_t *idx) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++) {
            if (allowed && !allowed[i]) continue;
            int taken = 0;
            for (int64_t q = 0; q < j && !taken; q++) taken = idx[q] == i;
            if (taken) continue;
            if (best < 0 || score[i] > score[best] || (isnan(score[best]) && !isnan(score[i]))) best = i;
        }
        idx[j] = best < 0 ? 0 : best;
    }
}

static moex_status check(const moex_router_desc *r, const moex_tensor *logits, const moex_tensor *ids,
                         const moex_tensor *weights) {
    if (r->kind < MOEX_ROUTER_SOFTMAX_TOPK || r->kind > MOEX_ROUTER_TOPK_SOFTMAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router kind = %d is not a moex_router_kind", (int)r->kind);
    if (r->num_experts < 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router num_experts = %lld, must be >= 1", (long long)r->num_experts);
    if (r->top_k < 1 || r->top_k > r->num_experts)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router top_k = %lld is outside [1, num_experts = %lld]",
                         (long long)r->top_k, (long long)r->num_experts);
    if (r->kind != MOEX_ROUTER_TOPK_SOFTMAX && r->renormalize != 0 && r->renormalize != 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router renormalize = %d, must be 0 or 1", r->renormalize);
    if (r->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK) {
        if (!(r->scaling > 0.0f && isfinite(r->scaling)))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "router scaling = %g, must be a finite value > 0 (the routed scaling factor)",
                             (double)r->scaling);
        if (r->n_group < 1 || r->num_experts % r->n_group)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router n_group = %lld does not divide num_experts = %lld",
                             (long long)r->n_group, (long long)r->num_experts);
        if (r->topk_group < 1 || r->topk_group > r->n_group)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "router topk_group = %lld is outside [1, n_group = %lld]",
                             (long long)r->topk_group, (long long)r->n_group);
        if (r->top_k > r->topk_group * (r->num_experts / r->n_group))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "router top_k = %lld exceeds the %lld experts in topk_group = %lld groups",
                             (long long)r->top_k, (long long)(r->topk_group * (r->num_experts / r->n_group)),
                             (long long)r->topk_group);
        if (moex_tensor_present(&r->correction_bias)) {
            int64_t bs[1] = {r->num_experts};
            moex_status st = moex_check_shape(&r->correction_bias, "correction_bias", 1, bs);
            if (st) return st;
            if (r->correction_bias.dtype != MOEX_F32 || r->correction_bias.strides[0] != 1)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "correction_bias must be contiguous f32, got %s",
                                 moex_dtype_name(r->correction_bias.dtype));
            if (r->correction_bias.device.kind != MOEX_DEVICE_CPU)
                return moex_fail(MOEX_ERR_UNSUPPORTED, "moex_route: correction_bias must be in cpu memory");
            const float *bias = r->correction_bias.data;
            for (int64_t e = 0; e < r->num_experts; e++)
                if (!isfinite(bias[e]))
                    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "correction_bias[%lld] = %g is not finite", (long long)e,
                                     (double)bias[e]);
        }
    }
    int64_t ls[2] = {-1, r->num_experts};
    moex_status st = moex_check_shape(logits, "logits", 2, ls);
    if (st) return st;
    int64_t os[2] = {logits->shape[0], r->top_k};
    if ((st = moex_check_shape(ids, "ids", 2, os)) || (st = moex_check_shape(weights, "weights", 2, os))) return st;
    if (!moex_is_float_dtype(logits->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "logits: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(logits->dtype));
    if (ids->dtype != MOEX_I32 && ids->dtype != MOEX_I64)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "ids: dtype %s is not supported (i32, i64)", moex_dtype_name(ids->dtype));
    if (!moex_is_float_dtype(weights->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "weights: dtype %s is not supported (f32, f16, bf16)",
                         moex_dtype_name(weights->dtype));
    const moex_tensor *ts[3] = {logits, ids, weights};
    const char *names[3] = {"logits", "ids", "weights"};
    for (int i = 0; i < 3; i++) {
        if (ts[i]->device.kind != MOEX_DEVICE_CPU)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "moex_route: %s must be in cpu memory", names[i]);
        if ((st = moex_check_rows(ts[i], names[i]))) return st;
    }
    /* the outputs are written token by token while later logits are still to be read */
    if ((st = moex_check_disjoint(ids, "ids", logits, "logits")) ||
        (st = moex_check_disjoint(weights, "weights", logits, "logits")) ||
        (st = moex_check_disjoint(ids, "ids", weights, "weights")))
        return st;
    return MOEX_OK;
}

// One token. s: [E] scratch (scores), sel: [E] scratch (selection scores),
// allowed: [E] scratch, gscore: [n_group] scratch -> idx [k], w [k]
static void route_token(const moex_router_desc *r, const float *bias, float *s, float *sel, unsigned char *allowed,
                        float *gscore, int64_t *gidx, int64_t *idx, float *w) {
    const int64_t E = r->num_experts, k = r->top_k;
    if (r->kind == MOEX_ROUTER_SOFTMAX_TOPK) {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; e++) m = fmaxf(m, s[e]);
        for (int64_t e = 0; e < E; e++) sum += (s[e] = expf(s[e] - m));
        for (int64_t e = 0; e < E; e++) s[e] /= sum;
        top_k(s, NULL, E, k, idx);
        for (int64_t j = 0; j < k; j++) w[j] = s[idx[j]];
    } else if (r->kind == MOEX_ROUTER_TOPK_SOFTMAX) {
        top_k(s, NULL, E, k, idx);
        float m = s[idx[0]], sum = 0.0f;
        for (int64_t j = 0; j < k; j++) sum += (w[j] = expf(s[idx[j]] - m));
        for (int64_t j = 0; j < k; j++) w[j] /= sum;
        return; /* already sums to one */
    } else {
        const int64_t G = r->n_group, per = E / G;
        for (int64_t e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-s[e]));
            sel[e] = s[e] + (bias ? bias[e] : 0.0f);
        }
        for (int64_t g = 0; g < G; g++) { /* group score: sum of its two best biased scores */
            int64_t two[2];
            int64_t take = per < 2 ? per : 2;
            top_k(sel + g * per, NULL, per, take, two);
            gscore[g] = 0.0f;
            for (int64_t q = 0; q < take; q++) gscore[g] += sel[g * per + two[q]];
        }
        top_k(gscore, NULL, G, r->topk_group, gidx);
        memset(allowed, 0, (size_t)E);
        for (int64_t q = 0; q < r->topk_group; q++) memset(allowed + gidx[q] * per, 1, (size_t)per);
        top_k(sel, allowed, E, k, idx);
        for (int64_t j = 0; j < k; j++) w[j] = s[idx[j]];
    }
    if (r->renormalize) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++) sum += w[j];
        if (r->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK) sum += 1e-20f;
        for (int64_t j = 0; j < k; j++) w[j] /= sum;
    }
    if (r->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK)
        for (int64_t j = 0; j < k; j++) w[j] *= r->scaling;
}

moex_status moex_route(const moex_router_desc *desc, const moex_tensor *logits, moex_tensor *ids, moex_tensor *weights) {
    const char *null_name = !desc ? "desc" : !logits ? "logits" : !ids ? "ids" : !weights ? "weights" : NULL;
    if (null_name) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_route: %s is NULL", null_name);
    moex_status st = check(desc, logits, ids, weights);
    if (st) return st;
    const int64_t T = logits->shape[0], E = desc->num_experts, k = desc->top_k;
    const int64_t G = desc->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK ? desc->n_group : 1; /* n_group: grouped only */
    if (T == 0) return MOEX_OK;
    /* scratch: s, sel [E] f32, gscore [G] f32, w [k] f32, idx [k], gidx [G] i64, allowed [E] bytes; G, k <= E */
    int64_t bytes, per_gk, per_g;
    if (!moex_mul_ok(E, 2 * sizeof(float) + 1, &bytes) || !moex_mul_ok(G + k, sizeof(float) + sizeof(int64_t), &per_gk) ||
        !moex_mul_ok(G, sizeof(int64_t), &per_g) || !moex_add_ok(bytes, per_gk, &bytes) ||
        !moex_add_ok(bytes, per_g, &bytes) || (uint64_t)bytes > SIZE_MAX - 64)
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_route: the scratch for num_experts = %lld does not fit in memory",
                         (long long)E);
    char *scratch = malloc((size_t)bytes + 64);
    if (!scratch)
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_route: out of memory for %lld bytes of scratch", (long long)bytes + 64);
    float *s = (float *)scratch, *sel = s + E, *gscore = sel + E, *w = gscore + G;
    int64_t *idx = (int64_t *)(((uintptr_t)(w + k) + 7) & ~(uintptr_t)7), *gidx = idx + k;
    unsigned char *allowed = (unsigned char *)(gidx + G);
    const float *bias = moex_tensor_present(&desc->correction_bias) ? desc->correction_bias.data : NULL;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) s[e] = moex_load_f32(logits->data, logits->dtype, t * logits->strides[0] + e);
        route_token(desc, bias, s, sel, allowed, gscore, gidx, idx, w);
        for (int64_t j = 0; j < k; j++) {
            int64_t off = t * ids->strides[0] + j;
            if (ids->dtype == MOEX_I32) ((int32_t *)ids->data)[off] = (int32_t)idx[j];
            else ((int64_t *)ids->data)[off] = idx[j];
            moex_store_f32(weights->data, weights->dtype, t * weights->strides[0] + j, w[j]);
        }
    }
    free(scratch);
    return MOEX_OK;
}
