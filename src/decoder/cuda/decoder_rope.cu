/* decoder_rope.cu — rotary position embeddings on the device: the cos/sin
 * tables of the default rope and of qwen3_vl_moe's interleaved MRoPE, and their
 * application with the rotate_half convention; the twins of model/rope.c. */
#include "decoder/cuda/decoder_kernels.cuh"

/* The angle of one frequency at one position, then cos and sin in double rounded once (rope.c's cos_sin_at). */
__device__ __forceinline__ void cos_sin_at(float inv_freq, int64_t pos, float *c, float *s) {
    const float angle = mul_rn((float)pos, inv_freq);
    double sd, cd;
    sincos((double)angle, &sd, &cd);
    *c = (float)cd;
    *s = (float)sd;
}

/* One thread per (token, frequency). pos_h / pos_w NULL: the default rope (pos_t for every frequency).
 * inv_freq: [half], pos_t, pos_h, pos_w: [T] -> cos, sin: [T, half]. Negative positions give angle 0. */
__global__ void rope_cos_sin_kernel(const float *inv_freq, int64_t half, const int64_t *pos_t, const int64_t *pos_h,
                                    const int64_t *pos_w, int64_t h_end, int64_t w_end, int64_t T, float *cos_out,
                                    float *sin_out) {
    GRID_STRIDE(idx, T * half) {
        const int64_t t = idx / half, i = idx % half;
        int64_t pos = pos_t[t];
        if (pos_h) { /* apply_interleaved_mrope: every third frequency from 1 takes H, from 2 takes W */
            if (i % 3 == 1 && i < h_end) pos = pos_h[t];
            else if (i % 3 == 2 && i < w_end) pos = pos_w[t];
        }
        if (pos < 0) pos = 0;
        cos_sin_at(inv_freq[i], pos, cos_out + idx, sin_out + idx);
    }
}

static moex_status tables_check(const char *fn, const float *inv_freq, int64_t head_dim, int64_t T, const float *c,
                                const float *s) {
    if (head_dim < 2 || head_dim % 2 != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: head_dim = %lld must be even and >= 2", fn,
                         (long long)head_dim);
    if (T < 0 || (T > 0 && head_dim / 2 > INT64_MAX / 4 / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld tokens is negative or overflows", fn, (long long)T);
    if (T > 0 && (!inv_freq || !c || !s))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !inv_freq ? "inv_freq" : !c ? "cos" : "sin");
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_rope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t *positions,
                                              int64_t T, float *cos_out, float *sin_out, void *stream) {
    const char *fn = "cuda rope_cos_sin";
    moex_status st = tables_check(fn, inv_freq, head_dim, T, cos_out, sin_out);
    if (st || T == 0) return st;
    if (!positions) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: positions is NULL", fn);
    const int64_t half = head_dim / 2;
    rope_cos_sin_kernel<<<blocks_for(T * half, 256), 256, 0, (cudaStream_t)stream>>>(
        inv_freq, half, positions, NULL, NULL, 0, 0, T, cos_out, sin_out);
    return MOEX_CUDA_LAUNCHED(fn);
}

extern "C" moex_status moex_cuda_mrope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t section[3],
                                               const int64_t *pos_t, const int64_t *pos_h, const int64_t *pos_w,
                                               int64_t T, float *cos_out, float *sin_out, void *stream) {
    const char *fn = "cuda mrope_cos_sin";
    moex_status st = tables_check(fn, inv_freq, head_dim, T, cos_out, sin_out);
    if (st) return st;
    if (!section) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: mrope_section is NULL", fn);
    const int64_t half = head_dim / 2;
    if (section[0] < 0 || section[1] < 0 || section[2] < 0 || section[0] > half || section[1] > half ||
        section[2] > half || section[0] + section[1] + section[2] != half)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "%s: mrope_section = [%lld, %lld, %lld] must be >= 0 and sum to head_dim / 2 = %lld", fn,
                         (long long)section[0], (long long)section[1], (long long)section[2], (long long)half);
    if (T == 0) return MOEX_OK;
    if (!pos_t || !pos_h || !pos_w)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !pos_t ? "pos_t" : !pos_h ? "pos_h" : "pos_w");
    rope_cos_sin_kernel<<<blocks_for(T * half, 256), 256, 0, (cudaStream_t)stream>>>(
        inv_freq, half, pos_t, pos_h, pos_w, 3 * section[1], 3 * section[2], T, cos_out, sin_out);
    return MOEX_CUDA_LAUNCHED(fn);
}

/* One thread per (token, head, frequency): the pair (i, i + half) of the head's first 2*half values
 * (the rotary part; the rest of the head is left as it is).
 * x: [T, heads, head_dim] in place, cos, sin: [T, half]. */
__global__ void rope_apply_kernel(float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t half,
                                  const float *cos_in, const float *sin_in) {
    GRID_STRIDE(idx, T * heads * half) {
        const int64_t i = idx % half, th = idx / half, t = th / heads;
        float *v = x + th * head_dim;
        const float c = cos_in[t * half + i], s = sin_in[t * half + i];
        const float a = v[i], b = v[half + i];
        /* q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-x2, x1); one rounding per op */
        const float ac = mul_rn(a, c), bs = mul_rn(b, s), bc = mul_rn(b, c), as = mul_rn(a, s);
        v[i] = sub_rn(ac, bs);
        v[half + i] = add_rn(bc, as);
    }
}

/* A warp per (token, head): the pairs (2i, 2i + 1) rotated into (i, half + i), as transformers lays
 * out DeepSeek-V3's interleaved rope. x: [T, heads, 2*half] in place, cos, sin: [T, half]. Lane l
 * reads the pairs l, l + 32, ... (coalesced), the warp's barrier orders every read of the row
 * before any write, then each lane writes its outputs: the same arithmetic per value as one
 * thread a row (which took 95 us for DeepSeek-V3's 512-token prefill, its row in local memory). */
constexpr int ROPE_IL_PER_LANE = MOEX_ROPE_INTERLEAVED_MAX / 64; /* pairs a lane holds, at most */
__global__ void rope_apply_interleaved_kernel(float *x, int64_t T, int64_t heads, int64_t half, const float *cos_in,
                                              const float *sin_in) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t th = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; th < T * heads; th += warps) {
        const int64_t t = th / heads;
        float *v = x + th * 2 * half;
        float lo[ROPE_IL_PER_LANE], hi[ROPE_IL_PER_LANE];
#pragma unroll
        for (int j = 0; j < ROPE_IL_PER_LANE; j++) {
            const int64_t i = lane + 32 * j;
            if (i < half) {
                const float c = cos_in[t * half + i], s = sin_in[t * half + i];
                const float a = v[2 * i], b = v[2 * i + 1];
                const float ac = mul_rn(a, c), bs = mul_rn(b, s), bc = mul_rn(b, c), as = mul_rn(a, s);
                lo[j] = sub_rn(ac, bs);
                hi[j] = add_rn(bc, as);
            }
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < ROPE_IL_PER_LANE; j++) {
            const int64_t i = lane + 32 * j;
            if (i < half) v[i] = lo[j], v[half + i] = hi[j];
        }
        __syncwarp(); /* the next row's reads come after these writes (distinct rows: for clarity) */
    }
}

static moex_status apply_check(const char *fn, float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                               const float *cos_in, const float *sin_in) {
    if (head_dim < 2 || head_dim % 2 != 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: head_dim = %lld must be even and >= 2", fn,
                         (long long)head_dim);
    if (rotary_dim < 2 || rotary_dim % 2 || rotary_dim > head_dim)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: rotary_dim = %lld must be even, >= 2 and at most head_dim = %lld",
                         fn, (long long)rotary_dim, (long long)head_dim);
    if (T < 0 || heads < 1 || (T > 0 && heads > INT64_MAX / 4 / head_dim / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld must be >= 0 and heads = %lld >= 1 (no overflow)",
                         fn, (long long)T, (long long)heads);
    if (T > 0 && (!x || !cos_in || !sin_in))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : !cos_in ? "cos" : "sin");
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_rope_apply(float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                                            const float *cos_in, const float *sin_in, void *stream) {
    const char *fn = "cuda rope_apply";
    moex_status st = apply_check(fn, x, T, heads, head_dim, rotary_dim, cos_in, sin_in);
    if (st || T == 0) return st;
    const int64_t half = rotary_dim / 2;
    rope_apply_kernel<<<blocks_for(T * heads * half, 256), 256, 0, (cudaStream_t)stream>>>(x, T, heads, head_dim, half,
                                                                                            cos_in, sin_in);
    return MOEX_CUDA_LAUNCHED(fn);
}

extern "C" moex_status moex_cuda_rope_apply_interleaved(float *x, int64_t T, int64_t heads, int64_t head_dim,
                                                        const float *cos_in, const float *sin_in, void *stream) {
    const char *fn = "cuda rope_apply_interleaved";
    moex_status st = apply_check(fn, x, T, heads, head_dim, head_dim, cos_in, sin_in);
    if (st) return st;
    if (head_dim > MOEX_ROPE_INTERLEAVED_MAX)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: head_dim = %lld is more than %d", fn, (long long)head_dim,
                         MOEX_ROPE_INTERLEAVED_MAX);
    if (T == 0) return MOEX_OK;
    /* a warp a row, 4 a block */
    rope_apply_interleaved_kernel<<<blocks_for(T * heads, 4), 128, 0, (cudaStream_t)stream>>>(x, T, heads, head_dim / 2,
                                                                                               cos_in, sin_in);
    return MOEX_CUDA_LAUNCHED(fn);
}
