/* decoder_router.cu — the three routers of experts/router.c on the device:
 * softmax then top-k (Qwen, Mixtral), DeepSeek-V3's sigmoid with correction
 * bias and group-limited top-k, GPT-OSS's top-k then softmax. One warp per
 * token; the sums that router.c does sequentially in f32 are done by lane 0 in
 * the same order, so the weights round as on the CPU (but for expf). */
#include "decoder/cuda/decoder_kernels.cuh"

#include <math.h>

/* Does (va, ia) rank before (vb, ib)? router.c's top_k scans ascending and keeps the first
 * largest, a NaN losing to any number: numbers first, larger first, then the lower index.
 * ib < 0 is "no candidate yet". */
__device__ __forceinline__ int ranks_before(float va, int ia, float vb, int ib) {
    if (ia < 0) return 0;
    if (ib < 0) return 1;
    const int na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

/* The best index of score[lo, hi) among ok[i] != 0 (ok NULL: all) other than `skip`, or -1.
 * Every lane of the warp calls it and gets the answer. */
__device__ int warp_best(const float *score, const unsigned char *ok, int lo, int hi, int skip) {
    const int lane = threadIdx.x & 31;
    float bv = 0.0f;
    int bi = -1;
    for (int i = lo + lane; i < hi; i += 32) {
        if ((ok && !ok[i]) || i == skip) continue;
        if (ranks_before(score[i], i, bv, bi)) bv = score[i], bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    return bi;
}

/* The k best of score[0, n) among ok (cleared as they are taken; all set on entry) into idx[0, k),
 * descending; no candidate left gives 0, as router.c. */
__device__ void warp_top_k(const float *score, unsigned char *ok, int n, int k, int *idx) {
    const int lane = threadIdx.x & 31;
    for (int j = 0; j < k; j++) {
        const int b = warp_best(score, ok, 0, n, -1);
        if (lane == 0) {
            idx[j] = b < 0 ? 0 : b;
            if (b >= 0) ok[b] = 0;
        }
        __syncwarp();
    }
}

typedef struct router_params {
    int kind, E, k, G, topk_group, renormalize;
    float scaling;
    const float *bias; /* [E] or NULL */
} router_params;

/* Shared memory of one warp: s [E], sel [E], gscore [G] floats; idx [k], gidx [G] ints; ok [E] bytes. */
static size_t warp_smem_bytes(int E, int k, int G) {
    size_t b = sizeof(float) * (size_t)(2 * E + G) + sizeof(int) * (size_t)(k + G) + (size_t)E;
    return (b + 15) & ~(size_t)15;
}

/* One warp per token (grid-stride). logits: [T, E] -> ids: [T, k], weights: [T, k]. */
__global__ void route_kernel(router_params p, const float *logits, int64_t T, int32_t *ids, float *weights,
                             size_t warp_bytes) {
    extern __shared__ __align__(16) unsigned char smem_router[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    unsigned char *base = smem_router + (size_t)warp * warp_bytes;
    float *s = (float *)base, *sel = s + p.E, *gscore = sel + p.E;
    int *idx = (int *)(gscore + p.G), *gidx = idx + p.k;
    unsigned char *ok = (unsigned char *)(gidx + p.G);
    const int E = p.E, k = p.k;
    for (int64_t t = blockIdx.x * (int64_t)warps + warp; t < T; t += (int64_t)gridDim.x * warps) {
        for (int e = lane; e < E; e += 32) {
            s[e] = logits[t * E + e];
            ok[e] = 1;
        }
        __syncwarp();
        if (p.kind == MOEX_ROUTER_SOFTMAX_TOPK) {
            float m = -INFINITY;
            for (int e = lane; e < E; e += 32) m = fmaxf(m, s[e]);
            m = warp_max_float(m);
            for (int e = lane; e < E; e += 32) s[e] = expf(sub_rn(s[e], m));
            __syncwarp();
            float sum = 0.0f;
            if (lane == 0)
                for (int e = 0; e < E; e++) sum = add_rn(sum, s[e]); /* f32, ascending, as router.c */
            sum = __shfl_sync(0xffffffffu, sum, 0);
            for (int e = lane; e < E; e += 32) s[e] = div_rn(s[e], sum);
            __syncwarp();
            warp_top_k(s, ok, E, k, idx);
        } else if (p.kind == MOEX_ROUTER_TOPK_SOFTMAX) {
            warp_top_k(s, ok, E, k, idx);
        } else {
            for (int e = lane; e < E; e += 32) {
                const float sg = div_rn(1.0f, add_rn(1.0f, expf(-s[e])));
                s[e] = sg;
                sel[e] = add_rn(sg, p.bias ? p.bias[e] : 0.0f);
            }
            __syncwarp();
            const int per = E / p.G, take = per < 2 ? per : 2;
            for (int g = 0; g < p.G; g++) { /* a group's score: the sum of its two best biased scores */
                const int a = warp_best(sel, NULL, g * per, (g + 1) * per, -1);
                const int b = take > 1 ? warp_best(sel, NULL, g * per, (g + 1) * per, a) : -1;
                if (lane == 0) {
                    float gs = add_rn(0.0f, sel[a < 0 ? g * per : a]);
                    if (take > 1) gs = add_rn(gs, sel[b < 0 ? g * per : b]);
                    gscore[g] = gs;
                }
            }
            __syncwarp();
            /* the topk_group best groups (descending, lower index on ties), then allow their experts */
            for (int q = 0; q < p.topk_group; q++) {
                int best = -1;
                float bv = 0.0f;
                if (lane == 0) {
                    for (int g = 0; g < p.G; g++) {
                        int taken = 0;
                        for (int r = 0; r < q; r++) taken |= gidx[r] == g;
                        if (!taken && ranks_before(gscore[g], g, bv, best)) bv = gscore[g], best = g;
                    }
                    gidx[q] = best < 0 ? 0 : best;
                }
                __syncwarp();
            }
            for (int e = lane; e < E; e += 32) {
                int allowed = 0;
                for (int q = 0; q < p.topk_group; q++) allowed |= gidx[q] == e / per;
                ok[e] = (unsigned char)allowed;
            }
            __syncwarp();
            warp_top_k(sel, ok, E, k, idx);
        }
        /* lane 0: the weights (into sel, free by now), renormalisation and scaling, in router.c's order */
        if (lane == 0) {
            if (p.kind == MOEX_ROUTER_TOPK_SOFTMAX) {
                const float m = s[idx[0]];
                float sum = 0.0f;
                for (int j = 0; j < k; j++) {
                    const float e = expf(sub_rn(s[idx[j]], m));
                    sel[j] = e;
                    sum = add_rn(sum, e);
                }
                for (int j = 0; j < k; j++) sel[j] = div_rn(sel[j], sum);
            } else {
                for (int j = 0; j < k; j++) sel[j] = s[idx[j]];
                if (p.renormalize) {
                    float sum = 0.0f;
                    for (int j = 0; j < k; j++) sum = add_rn(sum, sel[j]);
                    if (p.kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK) sum = add_rn(sum, 1e-20f);
                    for (int j = 0; j < k; j++) sel[j] = div_rn(sel[j], sum);
                }
                if (p.kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK)
                    for (int j = 0; j < k; j++) sel[j] = mul_rn(sel[j], p.scaling);
            }
        }
        __syncwarp();
        for (int j = lane; j < k; j += 32) {
            ids[t * k + j] = idx[j];
            weights[t * k + j] = sel[j];
        }
        __syncwarp(); /* s, sel, idx are rewritten by the next token */
    }
}

extern "C" moex_status moex_cuda_route(const moex_router_desc *r, const float *bias, const float *logits, int64_t T,
                                       int32_t *ids, float *weights, void *stream) {
    const char *fn = "cuda route";
    if (!r) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    if (r->kind < MOEX_ROUTER_SOFTMAX_TOPK || r->kind > MOEX_ROUTER_TOPK_SOFTMAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: router kind = %d is not a moex_router_kind", fn, (int)r->kind);
    if (r->num_experts < 1 || r->num_experts > 4096)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: num_experts = %lld is outside [1, 4096]", fn,
                         (long long)r->num_experts);
    if (r->top_k < 1 || r->top_k > r->num_experts)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: top_k = %lld is outside [1, num_experts = %lld]", fn,
                         (long long)r->top_k, (long long)r->num_experts);
    const int grouped = r->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK;
    if (grouped) {
        if (r->n_group < 1 || r->num_experts % r->n_group)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: n_group = %lld does not divide num_experts = %lld", fn,
                             (long long)r->n_group, (long long)r->num_experts);
        if (r->topk_group < 1 || r->topk_group > r->n_group)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: topk_group = %lld is outside [1, n_group = %lld]", fn,
                             (long long)r->topk_group, (long long)r->n_group);
        if (r->top_k > r->topk_group * (r->num_experts / r->n_group))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: top_k = %lld exceeds the %lld experts in topk_group = %lld groups",
                             fn, (long long)r->top_k, (long long)(r->topk_group * (r->num_experts / r->n_group)),
                             (long long)r->topk_group);
    } else if (bias) {
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: a correction bias is for the grouped sigmoid router only", fn);
    }
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld is negative", fn, (long long)T);
    if (T == 0) return MOEX_OK;
    if (!logits || !ids || !weights)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !logits ? "logits" : !ids ? "ids" : "weights");
    router_params p;
    p.kind = (int)r->kind;
    p.E = (int)r->num_experts;
    p.k = (int)r->top_k;
    p.G = grouped ? (int)r->n_group : 1;
    p.topk_group = grouped ? (int)r->topk_group : 1;
    p.renormalize = r->renormalize != 0;
    p.scaling = r->scaling;
    p.bias = grouped ? bias : NULL;
    /* one warp's arrays must fit in the 48 KB a block has without opt-in: always so for E <= 2048 */
    const size_t wb = warp_smem_bytes(p.E, p.k, p.G);
    if (wb > 48 * 1024)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: num_experts = %d, top_k = %d, n_group = %d need %zu bytes of shared "
                         "memory per token, more than 48 KB", fn, p.E, p.k, p.G, wb);
    int warps = (int)(32768 / wb);
    if (warps > 8) warps = 8;
    if (warps < 1) warps = 1;
    const size_t shmem = wb * (size_t)warps;
    route_kernel<<<blocks_for(T, warps), warps * 32, shmem, (cudaStream_t)stream>>>(p, logits, T, ids, weights, wb);
    return MOEX_CUDA_LAUNCHED("cuda route kernel");
}
