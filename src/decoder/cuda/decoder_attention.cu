/* decoder_attention.cu — the device KV cache and causal grouped-query
 * attention over it, for prefill (several sequences of any length in one
 * call) and decode (one new token per sequence); the twin of
 * model/attention.c.
 *
 * A call queues three kernels: append (k, v into the cache), attend (one
 * block per (row, head): a warp per key for the scores, the warps splitting the
 * keys for the weighted sum of values), commit (the new lengths). The sums are
 * taken in another order than attention.c's, so results agree within a few
 * ulps. The sequence descriptors live on the device and every kernel checks
 * them the same way, so a bad one is skipped by all three and reported once,
 * by commit. */
#include "decoder/cuda/decoder_kernels.cuh"

#include <math.h>

/* The cache as kernels see it. */
typedef struct kv_view {
    float *k, *v;         /* [layers, B, KV, S, d]; v NULL for a latent cache (the values are the keys' first dv) */
    int64_t *len;         /* [B]: the lengths of this call's layer */
    int64_t B, S, KV, d;
    size_t layer_off;     /* elements before this layer in k and v */
} kv_view;

/* Start of the rows of (seq, kv head) of the view's layer: [S, d]. */
__device__ __forceinline__ size_t head_rows(const kv_view &c, int64_t seq, int64_t h) {
    return c.layer_off + (size_t)((seq * c.KV + h) * c.S) * (size_t)c.d;
}

/* Sum of the descriptors' tokens, or -1 if one is negative. */
__device__ int64_t tokens_sum(const moex_attn_seq *seqs, int64_t nseq) {
    int64_t sum = 0;
    for (int64_t i = 0; i < nseq; i++) {
        if (seqs[i].tokens < 0) return -1;
        sum += seqs[i].tokens;
    }
    return sum;
}

/* Can descriptor i be honoured? The CPU's checks, against the lengths before this call. */
__device__ int seq_ok(const kv_view &c, const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t i) {
    const moex_attn_seq s = seqs[i];
    if (s.seq < 0 || s.seq >= c.B || s.tokens < 0 || s.past < 0) return 0;
    if (s.past > c.len[s.seq] || s.tokens > c.S - s.past) return 0;
    for (int64_t j = 0; j < nseq; j++)
        if (j != i && seqs[j].seq == s.seq) return 0;
    return tokens_sum(seqs, nseq) == total;
}

/* The descriptor that owns stacked row r, and r's index t within it; -1 if none. */
__device__ int64_t row_owner(const moex_attn_seq *seqs, int64_t nseq, int64_t r, int64_t *t) {
    int64_t first = 0;
    for (int64_t i = 0; i < nseq; i++) {
        const int64_t n = seqs[i].tokens > 0 ? seqs[i].tokens : 0;
        if (r < first + n) {
            *t = r - first;
            return i;
        }
        first += n;
    }
    return -1;
}

/* One block per stacked row (grid-stride): its k and v rows to positions past + t.
 * k, v: [total, KV, d] -> the cache. */
__global__ void kv_append_kernel(kv_view c, const moex_attn_seq *seqs, int64_t nseq, int64_t total, const float *k,
                                 const float *v) {
    __shared__ int64_t s_seq, s_pos;
    for (int64_t r = blockIdx.x; r < total; r += gridDim.x) {
        if (threadIdx.x == 0) {
            int64_t t = 0, i = row_owner(seqs, nseq, r, &t);
            s_seq = -1;
            if (i >= 0 && seq_ok(c, seqs, nseq, total, i)) {
                s_seq = seqs[i].seq;
                s_pos = seqs[i].past + t;
            }
        }
        __syncthreads();
        const int64_t seq = s_seq, pos = s_pos, n = c.KV * c.d;
        if (seq >= 0)
            for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
                const int64_t h = e / c.d, i = e % c.d;
                const size_t dst = head_rows(c, seq, h) + (size_t)(pos * c.d + i);
                c.k[dst] = k[r * n + e];
                if (c.v) c.v[dst] = v[r * n + e];
            }
        __syncthreads();
    }
}

/* Block reductions over blockDim.x threads (a multiple of 32); every thread gets the result. */
__device__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max_float(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < warps; w++) m = fmaxf(m, red[w]);
    return m;
}

__device__ double block_sum_double(double v, double *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum_double(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < warps; w++) s += red[w];
    return s;
}

__device__ __forceinline__ float warp_sum_float(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Scores of keys c0 .. c0+n-1 into sc[0 .. n): dot(q, k_j) * scale. One warp per key, its lanes
 * over the features (each key row read once, coalesced), reduced across the warp. */
__device__ __forceinline__ void chunk_scores(const float *qs, const float *keys, int64_t d, float scale, int64_t c0,
                                             int64_t n, float *sc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll 4
    for (int64_t j = warp; j < n; j += warps) { /* unrolled: several rows in flight */
        const float *kj = keys + (c0 + j) * d;
        float part = 0.0f;
        for (int64_t i = lane; i < d; i += 32) part += qs[i] * kj[i];
        part = warp_sum_float(part);
        if (lane == 0) sc[j] = part * scale;
    }
}

/* Features handled per pass of the value sum: 32 lanes x OUT_PER_LANE. */
#define OUT_PER_LANE 4

/* What attend_kernel computes besides the cache and the rows: the softmax scale, the values a
 * head puts out (d, or a latent cache's dv), gpt_oss's sliding window (0: none) and sinks [heads]
 * (NULL: none). */
typedef struct attend_params {
    float scale;
    int64_t dv, window;
    const float *sinks;
    int round_q; /* q rounded to bf16 as it is read (moex_cuda_attention_latent) */
} attend_params;

/* One block per (stacked row, query head): blockIdx.x = row (grid-stride), blockIdx.y = head.
 * ATT_THREADS threads (warps split the keys). Shared: q [d] then scores [chunk] (dynamic); the
 * warps' partial outputs and the reductions (static).
 * Positions lo .. past + t of the sequence's kv head h / group (lo > 0: the window); keys in chunks
 * of `chunk`: when all fit (L - lo <= chunk) the scores are computed once, else they are recomputed
 * per pass. A sink is one more logit in the maximum and the sum that weighs no value.
 * q: [total, heads, d] -> out: [total, heads, dv] (out may be q when dv == d). */
#define ATT_THREADS 128
__global__ void __launch_bounds__(ATT_THREADS)
    attend_kernel(kv_view c, const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t heads, int64_t group,
                  attend_params ap, int64_t chunk, const float *q, float *out) {
    extern __shared__ float smem[];
    __shared__ float red_f[32];
    __shared__ double red_d[32];
    __shared__ float part[ATT_THREADS / 32][32 * OUT_PER_LANE];
    __shared__ int64_t s_seq, s_len;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t d = c.d, dv = ap.dv, h = blockIdx.y;
    const float scale = ap.scale;
    float *qs = smem, *sc = smem + d;
    for (int64_t r = blockIdx.x; r < total; r += gridDim.x) {
        if (threadIdx.x == 0) {
            int64_t t = 0, i = row_owner(seqs, nseq, r, &t);
            s_seq = -1;
            if (i >= 0 && seq_ok(c, seqs, nseq, total, i)) {
                s_seq = seqs[i].seq;
                s_len = seqs[i].past + t + 1;
            }
        }
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) { /* out may be q */
            const float v = q[(r * heads + h) * d + i];
            qs[i] = ap.round_q ? __bfloat162float(__float2bfloat16_rn(v)) : v;
        }
        __syncthreads();
        const int64_t seq = s_seq, L = s_len;
        if (seq < 0) {
            __syncthreads();
            continue;
        }
        const int64_t lo = ap.window > 0 && L > ap.window ? L - ap.window : 0; /* kv > q - window */
        const size_t off = head_rows(c, seq, h / group);
        const float *keys = c.k + off, *vals = c.v ? c.v + off : keys;
        const int resident = L - lo <= chunk;

        // 1. the largest score (NaN scores are passed over, as `if (s > m)` does), and the sink's logit
        float m = -INFINITY;
        for (int64_t c0 = lo; c0 < L; c0 += chunk) {
            const int64_t n = L - c0 < chunk ? L - c0 : chunk;
            chunk_scores(qs, keys, d, scale, c0, n, sc);
            __syncthreads(); /* the scores were written by other warps */
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = sc[j] > m ? sc[j] : m;
            if (!resident) __syncthreads(); /* sc is rewritten by the next chunk */
        }
        m = block_max(m, red_f);
        const float sink = ap.sinks ? ap.sinks[h] : 0.0f;
        if (ap.sinks) m = sink > m ? sink : m;

        // 2. e_j = expf(s_j - m), their sum in double (with the sink's)
        double sum = 0.0;
        for (int64_t c0 = lo; c0 < L; c0 += chunk) {
            const int64_t n = L - c0 < chunk ? L - c0 : chunk;
            if (!resident) {
                chunk_scores(qs, keys, d, scale, c0, n, sc);
                __syncthreads();
            }
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                const float e = expf(sc[j] - m);
                if (resident) sc[j] = e;
                sum += (double)e;
            }
            if (!resident) __syncthreads();
        }
        sum = block_sum_double(sum, red_d);
        if (ap.sinks) sum += (double)expf(sink - m);
        const float inv = 1.0f / (float)sum;

        // 3. out = sum_j (e_j * inv) * v_j: in passes of 32 * OUT_PER_LANE features, warp w sums the
        //    keys j = w (mod warps) (a value row read coalesced by each warp), then the warps' partial
        //    sums are added in warp order
        for (int64_t f0 = 0; f0 < dv; f0 += 32 * OUT_PER_LANE) {
            float o[OUT_PER_LANE];
#pragma unroll
            for (int u = 0; u < OUT_PER_LANE; u++) o[u] = 0.0f;
            for (int64_t c0 = lo; c0 < L; c0 += chunk) {
                const int64_t n = L - c0 < chunk ? L - c0 : chunk;
                if (!resident) {
                    __syncthreads(); /* every warp is done with the previous chunk */
                    chunk_scores(qs, keys, d, scale, c0, n, sc);
                    __syncthreads();
                    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sc[j] = expf(sc[j] - m);
                }
                __syncthreads();
#pragma unroll 4
                for (int64_t j = warp; j < n; j += warps) {
                    const float p = sc[j] * inv;
                    const float *vj = vals + (c0 + j) * d + f0;
#pragma unroll
                    for (int u = 0; u < OUT_PER_LANE; u++) {
                        const int64_t i = lane + 32 * u;
                        if (f0 + i < dv) o[u] += p * vj[i];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < OUT_PER_LANE; u++) part[warp][lane + 32 * u] = o[u];
            __syncthreads();
            for (int64_t i = threadIdx.x; i < 32 * OUT_PER_LANE && f0 + i < dv; i += blockDim.x) {
                float acc = 0.0f;
                for (int w = 0; w < warps; w++) acc += part[w][i];
                out[(r * heads + h) * dv + f0 + i] = acc;
            }
            __syncthreads(); /* part is reused by the next pass */
        }
        __syncthreads(); /* qs, sc and the shared descriptor are reused by the next row */
    }
}

/* One thread per descriptor: the new length, or the flag. */
__global__ void kv_commit_kernel(kv_view c, const moex_attn_seq *seqs, int64_t nseq, int64_t total, int *flags) {
    GRID_STRIDE(i, nseq) {
        /* Only descriptor i reads len[seq_i] when it is valid (a repeated seq invalidates both). */
        if (seq_ok(c, seqs, nseq, total, i)) c.len[seqs[i].seq] = seqs[i].past + seqs[i].tokens;
        else if (flags) atomicOr(flags, MOEX_CUDA_FLAG_BAD_SEQ);
    }
}

/* ---- the cache ------------------------------------------------------------ */

// keys_only: a latent cache (no value array).
static moex_status cache_create(int device, int64_t layers, int64_t max_batch, int64_t max_seq, int64_t kv_heads,
                                int64_t head_dim, int keys_only, moex_cuda_kv_cache *out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda kv_cache_create: out is NULL");
    const int64_t dims[5] = {layers, max_batch, max_seq, kv_heads, head_dim};
    static const char *const names[5] = {"layers", "max_batch", "max_seq", "kv_heads", "head_dim"};
    int64_t n = 1;
    for (int i = 0; i < 5; i++) {
        if (dims[i] < 1)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda kv_cache_create: %s = %lld must be >= 1", names[i],
                             (long long)dims[i]);
        if (n > INT64_MAX / 8 / dims[i])
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda kv_cache_create: the cache's size overflows");
        n *= dims[i];
    }
    moex_cuda_kv_cache c;
    memset(&c, 0, sizeof c);
    c.device = device;
    c.layers = layers, c.max_batch = max_batch, c.max_seq = max_seq, c.kv_heads = kv_heads, c.head_dim = head_dim;
    void *k = NULL, *v = NULL, *len = NULL;
    const size_t bytes = sizeof(float) * (size_t)n, len_bytes = sizeof(int64_t) * (size_t)(layers * max_batch);
    moex_status st = moex_cuda_alloc(device, bytes, &k);
    if (!st && !keys_only) st = moex_cuda_alloc(device, bytes, &v);
    if (!st) st = moex_cuda_alloc(device, len_bytes, &len);
    if (!st) st = moex_cuda_status(cudaMemset(k, 0, bytes), "cuda kv_cache_create: cudaMemset");
    if (!st && v) st = moex_cuda_status(cudaMemset(v, 0, bytes), "cuda kv_cache_create: cudaMemset");
    if (!st) st = moex_cuda_status(cudaMemset(len, 0, len_bytes), "cuda kv_cache_create: cudaMemset");
    /* the zeros are in place before any stream, blocking or not, uses the cache */
    if (!st) st = moex_cuda_status(cudaStreamSynchronize(cudaStreamLegacy), "cuda kv_cache_create: synchronize");
    if (st) {
        if (k) moex_cuda_free(device, k);
        if (v) moex_cuda_free(device, v);
        if (len) moex_cuda_free(device, len);
        return st;
    }
    c.k = (float *)k, c.v = (float *)v, c.len = (int64_t *)len;
    *out = c;
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_kv_cache_create(int device, int64_t layers, int64_t max_batch, int64_t max_seq,
                                                 int64_t kv_heads, int64_t head_dim, moex_cuda_kv_cache *out) {
    return cache_create(device, layers, max_batch, max_seq, kv_heads, head_dim, 0, out);
}

extern "C" moex_status moex_cuda_kv_cache_create_latent(int device, int64_t layers, int64_t max_batch,
                                                        int64_t max_seq, int64_t width, moex_cuda_kv_cache *out) {
    return cache_create(device, layers, max_batch, max_seq, 1, width, 1, out);
}

extern "C" void moex_cuda_kv_cache_free(moex_cuda_kv_cache *cache) {
    if (!cache) return;
    if (cache->k) moex_cuda_free(cache->device, cache->k);
    if (cache->v) moex_cuda_free(cache->device, cache->v);
    if (cache->len) moex_cuda_free(cache->device, cache->len);
    memset(cache, 0, sizeof *cache);
}

/* len: [layers, B]; zero column seq of every layer, or everything for seq == -1. */
__global__ void kv_reset_kernel(int64_t *len, int64_t layers, int64_t B, int64_t seq) {
    GRID_STRIDE(i, layers * B) {
        if (seq < 0 || i % B == seq) len[i] = 0;
    }
}

extern "C" moex_status moex_cuda_kv_cache_reset(const moex_cuda_kv_cache *cache, int64_t seq, void *stream) {
    if (!cache || !cache->len) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda kv_cache_reset: no cache");
    if (seq < -1 || seq >= cache->max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "cuda kv_cache_reset: seq = %lld is outside [0, %lld) (or -1 for all)", (long long)seq,
                         (long long)cache->max_batch);
    const int64_t n = cache->layers * cache->max_batch;
    kv_reset_kernel<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(cache->len, cache->layers,
                                                                           cache->max_batch, seq);
    return MOEX_CUDA_LAUNCHED("cuda kv_cache_reset kernel");
}

/* ---- attention ------------------------------------------------------------ */

static const int64_t MAX_RESIDENT_SCORES = 8192; /* scores a block keeps in shared memory */

// The checks both entry points share: the layer, heads and descriptors' count against the cache.
static moex_status check_call(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                              int64_t nseq, int64_t total, int64_t heads) {
    if (!cache || !cache->k) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: no cache", fn);
    if (layer < 0 || layer >= cache->layers)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: layer = %lld is outside [0, %lld)", fn, (long long)layer,
                         (long long)cache->layers);
    const int64_t KV = cache->kv_heads, d = cache->head_dim, B = cache->max_batch, S = cache->max_seq;
    if (heads < 1 || heads % KV != 0 || heads > 65535)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "%s: heads = %lld is not a positive multiple of kv_heads = %lld (at most 65535)", fn,
                         (long long)heads, (long long)KV);
    if (d > 1024)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: head_dim = %lld; the kernel takes at most 1024", fn, (long long)d);
    if (nseq < 0 || nseq > B)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %lld sequences is outside [0, max_batch = %lld]", fn,
                         (long long)nseq, (long long)B);
    if (total < 0 || total > B * S || total > INT32_MAX)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: total = %lld tokens is outside [0, max_batch x max_seq]", fn,
                         (long long)total);
    if (nseq > 0 && total > 0 && !seqs)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: seqs is NULL (%lld sequences)", fn, (long long)nseq);
    return MOEX_OK;
}

// append, attend, commit
static moex_status launch(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                          int64_t nseq, int64_t total, int64_t heads, const float *q, const float *k, const float *v,
                          float *out, const attend_params &ap, int *flags, cudaStream_t s) {
    const int64_t KV = cache->kv_heads, d = cache->head_dim, B = cache->max_batch, S = cache->max_seq;
    kv_view c;
    c.k = cache->k, c.v = cache->v, c.len = cache->len + layer * B;
    c.B = B, c.S = S, c.KV = KV, c.d = d;
    c.layer_off = (size_t)layer * (size_t)(B * KV * S * d);
    const unsigned rows = (unsigned)(total < 1048576 ? total : 1048576);
    kv_append_kernel<<<rows, 128, 0, s>>>(c, seqs, nseq, total, k, v);
    moex_status st = MOEX_CUDA_LAUNCHED(fn);
    if (st) return st;
    const int64_t chunk = S < MAX_RESIDENT_SCORES ? S : MAX_RESIDENT_SCORES;
    const size_t shmem = sizeof(float) * (size_t)(d + chunk);
    dim3 grid(rows, (unsigned)heads);
    attend_kernel<<<grid, ATT_THREADS, shmem, s>>>(c, seqs, nseq, total, heads, heads / KV, ap, chunk, q, out);
    if ((st = MOEX_CUDA_LAUNCHED(fn))) return st;
    kv_commit_kernel<<<1, 256, 0, s>>>(c, seqs, nseq, total, flags);
    return MOEX_CUDA_LAUNCHED(fn);
}

// The rows appended and the lengths committed, without attending (the GEMM paths' first step).
moex_status kv_append_commit(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer,
                             const moex_attn_seq *seqs, int64_t nseq, int64_t total, const float *k, const float *v,
                             int *flags, cudaStream_t s) {
    const int64_t B = cache->max_batch;
    kv_view c;
    c.k = cache->k, c.v = cache->v, c.len = cache->len + layer * B;
    c.B = B, c.S = cache->max_seq, c.KV = cache->v ? cache->kv_heads : 1, c.d = cache->head_dim;
    c.layer_off = (size_t)layer * (size_t)(B * c.KV * c.S * c.d);
    const unsigned rows = (unsigned)(total < 1048576 ? total : 1048576);
    kv_append_kernel<<<rows, 128, 0, s>>>(c, seqs, nseq, total, k, v);
    moex_status st = MOEX_CUDA_LAUNCHED(fn);
    if (st) return st;
    kv_commit_kernel<<<1, 256, 0, s>>>(c, seqs, nseq, total, flags);
    return MOEX_CUDA_LAUNCHED(fn);
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const char *ab = (const char *)a, *bb = (const char *)b;
    return ab < bb + bn && bb < ab + an;
}

moex_status attention_check(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                            int64_t nseq, int64_t total, int64_t heads, const float *q, const float *k, const float *v,
                            const float *out, int64_t window) {
    moex_status st = check_call(fn, cache, layer, seqs, nseq, total, heads);
    if (st) return st;
    if (!cache->v) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the cache is a latent one", fn);
    if (window < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: window = %lld is negative", fn, (long long)window);
    if (nseq == 0 || total == 0) return MOEX_OK; /* as the CPU: no token, nothing written */
    if (!q || !k || !v || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (%lld tokens)", fn,
                         !q ? "q" : !k ? "k" : !v ? "v" : "out", (long long)total);
    const int64_t KV = cache->kv_heads, d = cache->head_dim;
    const size_t qb = sizeof(float) * (size_t)(total * heads * d), kb = sizeof(float) * (size_t)(total * KV * d);
    if (overlaps(out, qb, k, kb) || overlaps(out, qb, v, kb) || (out != q && overlaps(out, qb, q, qb)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: out overlaps k, v or q (other than being q)", fn);
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_attention(const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                           int64_t nseq, int64_t total, int64_t heads, const float *q, const float *k,
                                           const float *v, float *out, int64_t window, const float *sinks, int *flags,
                                           void *stream) {
    const char *fn = "cuda attention";
    moex_status st = attention_check(fn, cache, layer, seqs, nseq, total, heads, q, k, v, out, window);
    if (st || nseq == 0 || total == 0) return st; /* as the CPU: no token, nothing written */
    const int64_t d = cache->head_dim;
    attend_params ap;
    ap.scale = (float)pow((double)d, -0.5); /* head_dim ** -0.5 */
    ap.dv = d, ap.window = window, ap.sinks = sinks, ap.round_q = 0;
    return launch(fn, cache, layer, seqs, nseq, total, heads, q, k, v, out, ap, flags, (cudaStream_t)stream);
}

moex_status latent_check(const char *fn, const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                         int64_t nseq, int64_t total, int64_t heads, const float *q, const float *kv,
                         int64_t value_dim, float scale, const float *out) {
    moex_status st = check_call(fn, cache, layer, seqs, nseq, total, heads);
    if (st || (st = moex_latent_args_check(fn, cache->v == NULL, cache->head_dim, value_dim, scale))) return st;
    const int64_t w = cache->head_dim;
    if (nseq == 0 || total == 0) return MOEX_OK;
    if (!q || !kv || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (%lld tokens)", fn, !q ? "q" : !kv ? "kv" : "out",
                         (long long)total);
    const size_t qb = sizeof(float) * (size_t)(total * heads * w), kb = sizeof(float) * (size_t)(total * w),
                 ob = sizeof(float) * (size_t)(total * heads * value_dim);
    if (overlaps(out, ob, q, qb) || overlaps(out, ob, kv, kb))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: out overlaps %s", fn, overlaps(out, ob, q, qb) ? "q" : "kv");
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_attention_latent(const moex_cuda_kv_cache *cache, int64_t layer,
                                                  const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t heads,
                                                  const float *q, const float *kv, int64_t value_dim, float scale,
                                                  float *out, int round_q, int *flags, void *stream) {
    const char *fn = "cuda latent attention";
    moex_status st = latent_check(fn, cache, layer, seqs, nseq, total, heads, q, kv, value_dim, scale, out);
    if (st || nseq == 0 || total == 0) return st;
    attend_params ap;
    ap.scale = scale, ap.dv = value_dim, ap.window = 0, ap.sinks = NULL, ap.round_q = round_q;
    return launch(fn, cache, layer, seqs, nseq, total, heads, q, kv, NULL, out, ap, flags, (cudaStream_t)stream);
}
