/* decoder_elementwise.cu — element-wise pieces of a decoder step on the
 * device: the dense activations and sigmoid of model/mlp.c, the gated
 * product, the shared expert's sigmoid gate, residual adds, bias adds,
 * bf16 rounding (step.c's round_act), dtype conversion, the gather of
 * each sequence's last row and the positions of a step's rows. Each one thread per element, grid-stride. */
#include "decoder/cuda/decoder_kernels.cuh"
#include "linear/activation.h"

/* ---- activations: linear/activation.h's, shared with mlp.c (one rounding per op) ---- */

/* The four plain kinds (moex_dense_act_check refuses the others before a launch). */
__device__ __forceinline__ float dense_act(moex_activation act, float x) { return moex_act_plain(act, x); }

static moex_status check_n(const char *fn, int64_t n, const void *a, const void *b) {
    if (n < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: n = %lld is negative", fn, (long long)n);
    if (n > 0 && (!a || !b)) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: an array is NULL", fn);
    return MOEX_OK;
}

#define LAUNCH_1D(n) <<<blocks_for((n), 256), 256, 0, (cudaStream_t)stream>>>

// x: [n] -> y: [n]
__global__ void activate_kernel(moex_activation act, const float *x, float *y, int64_t n) {
    GRID_STRIDE(i, n) y[i] = dense_act(act, x[i]);
}

extern "C" moex_status moex_cuda_activate(moex_activation act, const float *x, float *y, int64_t n, void *stream) {
    moex_status st = moex_dense_act_check("cuda activate", act);
    if (!st) st = check_n("cuda activate", n, x, y);
    if (st || n == 0) return st;
    activate_kernel LAUNCH_1D(n)(act, x, y, n);
    return MOEX_CUDA_LAUNCHED("cuda activate kernel");
}

// x: [n] -> y: [n]
__global__ void sigmoid_kernel(const float *x, float *y, int64_t n) {
    GRID_STRIDE(i, n) y[i] = moex_act_sigmoid(x[i]);
}

extern "C" moex_status moex_cuda_sigmoid(const float *x, float *y, int64_t n, void *stream) {
    moex_status st = check_n("cuda sigmoid", n, x, y);
    if (st || n == 0) return st;
    sigmoid_kernel LAUNCH_1D(n)(x, y, n);
    return MOEX_CUDA_LAUNCHED("cuda sigmoid kernel");
}

/* ---- the gated MLP's middle and the shared expert's gate -------------------- */

// gate, up: [T, ld] -> h: [T, I]
__global__ void gated_act_kernel(moex_activation act, const float *gate, const float *up, int64_t ld, int64_t T,
                                 int64_t I, float *h) {
    GRID_STRIDE(idx, T * I) {
        const int64_t t = idx / I, i = idx % I;
        const float a = dense_act(act, gate[t * ld + i]); /* act_fn(gate_proj(x)), rounded */
        h[idx] = mul_rn(a, up[t * ld + i]);               /* ... * up_proj(x) */
    }
}

extern "C" moex_status moex_cuda_gated_act(moex_activation act, const float *gate, const float *up, int64_t ld,
                                           int64_t T, int64_t I, float *h, void *stream) {
    const char *fn = "cuda gated_act";
    moex_status st = moex_dense_act_check(fn, act);
    if (st) return st;
    if (T < 0 || I < 1 || ld < I || (T > 0 && ld > INT64_MAX / 4 / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld, I = %lld, ld = %lld: need T >= 0, 1 <= I <= ld", fn,
                         (long long)T, (long long)I, (long long)ld);
    if (T == 0) return MOEX_OK;
    if (!gate || !up || !h) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: an array is NULL", fn);
    if ((h == gate || h == up) && ld != I)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: h may be gate or up only when ld == I", fn);
    gated_act_kernel LAUNCH_1D(T * I)(act, gate, up, ld, T, I, h);
    return MOEX_CUDA_LAUNCHED("cuda gated_act kernel");
}

// gate_logit: [T], y: [T, H] in place
__global__ void scale_rows_sigmoid_kernel(const float *gate_logit, float *y, int64_t T, int64_t H) {
    GRID_STRIDE(idx, T * H) y[idx] = mul_rn(moex_act_sigmoid(gate_logit[idx / H]), y[idx]);
}

extern "C" moex_status moex_cuda_scale_rows_sigmoid(const float *gate_logit, float *y, int64_t T, int64_t H,
                                                    void *stream) {
    const char *fn = "cuda scale_rows_sigmoid";
    if (T < 0 || H < 1 || (T > 0 && H > INT64_MAX / 4 / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld, H = %lld", fn, (long long)T, (long long)H);
    if (T == 0) return MOEX_OK;
    if (!gate_logit || !y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: an array is NULL", fn);
    scale_rows_sigmoid_kernel LAUNCH_1D(T * H)(gate_logit, y, T, H);
    return MOEX_CUDA_LAUNCHED("cuda scale_rows_sigmoid kernel");
}

/* ---- adds ---------------------------------------------------------------------- */

// a, b: [n] -> out: [n]
__global__ void add_kernel(const float *a, const float *b, float *out, int64_t n) {
    GRID_STRIDE(i, n) out[i] = add_rn(a[i], b[i]);
}

extern "C" moex_status moex_cuda_add(const float *a, const float *b, float *out, int64_t n, void *stream) {
    moex_status st = check_n("cuda add", n, a, b);
    if (!st && n > 0 && !out) st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda add: out is NULL");
    if (st || n == 0) return st;
    add_kernel LAUNCH_1D(n)(a, b, out, n);
    return MOEX_CUDA_LAUNCHED("cuda add kernel");
}

// y: [T, N] in place, bias: [N]
__global__ void add_bias_kernel(float *y, int64_t T, int64_t N, const void *bias, moex_dtype bdt) {
    GRID_STRIDE(idx, T * N) y[idx] = add_rn(y[idx], load_elem(bias, bdt, idx % N));
}

extern "C" moex_status moex_cuda_add_bias(float *y, int64_t T, int64_t N, const void *bias, moex_dtype bias_dtype,
                                          void *stream) {
    const char *fn = "cuda add_bias";
    if (!float_dtype_ok(bias_dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: bias dtype %s is not f32, f16 or bf16", fn,
                         moex_dtype_name(bias_dtype));
    if (T < 0 || N < 1 || (T > 0 && N > INT64_MAX / 4 / T))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld, N = %lld", fn, (long long)T, (long long)N);
    if (T == 0) return MOEX_OK;
    if (!y || !bias) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !y ? "y" : "bias");
    add_bias_kernel LAUNCH_1D(T * N)(y, T, N, bias, bias_dtype);
    return MOEX_CUDA_LAUNCHED("cuda add_bias kernel");
}

/* ---- dtypes ---------------------------------------------------------------------- */

/* x rounded to bf16 and back; a NaN stays a NaN (core/internal.h's moex_f32_to_bf16 keeps it quiet). */
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// x: [n] in place
__global__ void round_bf16_kernel(float *x, int64_t n) {
    GRID_STRIDE(i, n) x[i] = round_bf16(x[i]);
}

extern "C" moex_status moex_cuda_round_bf16(float *x, int64_t n, void *stream) {
    moex_status st = check_n("cuda round_bf16", n, x, x);
    if (st || n == 0) return st;
    round_bf16_kernel LAUNCH_1D(n)(x, n);
    return MOEX_CUDA_LAUNCHED("cuda round_bf16 kernel");
}

// src: [n] of sdt -> dst: [n] of ddt
__global__ void convert_kernel(const void *src, moex_dtype sdt, void *dst, moex_dtype ddt, int64_t n) {
    GRID_STRIDE(i, n) store_elem(dst, ddt, i, load_elem(src, sdt, i));
}

extern "C" moex_status moex_cuda_convert(const void *src, moex_dtype sdt, void *dst, moex_dtype ddt, int64_t n,
                                         void *stream) {
    const char *fn = "cuda convert";
    if (!float_dtype_ok(sdt) || !float_dtype_ok(ddt))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s -> %s: only f32, f16 and bf16", fn, moex_dtype_name(sdt),
                         moex_dtype_name(ddt));
    moex_status st = check_n(fn, n, src, dst);
    if (st || n == 0) return st;
    convert_kernel LAUNCH_1D(n)(src, sdt, dst, ddt, n);
    return MOEX_CUDA_LAUNCHED("cuda convert kernel");
}

/* ---- the rows that get logits ------------------------------------------------------ */

/* One block per sequence: out[i] = x[last row of sequence i], or zeros when it has no token. */
__global__ void gather_last_rows_kernel(const float *x, int64_t H, const moex_attn_seq *seqs, int64_t nseq,
                                        float *out) {
    for (int64_t i = blockIdx.x; i < nseq; i += gridDim.x) {
        int64_t first = 0;
        for (int64_t j = 0; j < i; j++) first += seqs[j].tokens > 0 ? seqs[j].tokens : 0;
        const int64_t n = seqs[i].tokens;
        for (int64_t c = threadIdx.x; c < H; c += blockDim.x)
            out[i * H + c] = n > 0 ? x[(first + n - 1) * H + c] : 0.0f;
    }
}

extern "C" moex_status moex_cuda_gather_last_rows(const float *x, int64_t H, const moex_attn_seq *seqs, int64_t nseq,
                                                  float *out, void *stream) {
    const char *fn = "cuda gather_last_rows";
    if (H < 1 || nseq < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: H = %lld, nseq = %lld", fn, (long long)H, (long long)nseq);
    if (nseq == 0) return MOEX_OK;
    if (!x || !seqs || !out)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : !seqs ? "seqs" : "out");
    gather_last_rows_kernel<<<(unsigned)(nseq < 65535 ? nseq : 65535), 256, 0, (cudaStream_t)stream>>>(x, H, seqs,
                                                                                                       nseq, out);
    return MOEX_CUDA_LAUNCHED("cuda gather_last_rows kernel");
}

/* One block per sequence: positions[first_i + t] = past_i + t. Rows no descriptor covers: 0.
 * seqs: [nseq] -> positions: [total] */
__global__ void positions_kernel(const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t *positions) {
    for (int64_t i = blockIdx.x; i < nseq; i += gridDim.x) {
        int64_t first = 0, all = 0;
        for (int64_t j = 0; j < nseq; j++) {
            const int64_t n = seqs[j].tokens > 0 ? seqs[j].tokens : 0;
            if (j < i) first += n;
            all += n;
        }
        const int64_t n = seqs[i].tokens;
        for (int64_t t = threadIdx.x; t < n && first + t < total; t += blockDim.x)
            positions[first + t] = seqs[i].past + t;
        if (i == 0)
            for (int64_t r = all + threadIdx.x; r < total; r += blockDim.x) positions[r] = 0;
    }
}

extern "C" moex_status moex_cuda_positions(const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t *positions,
                                           void *stream) {
    const char *fn = "cuda positions";
    if (nseq < 0 || total < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: nseq = %lld, total = %lld", fn, (long long)nseq,
                         (long long)total);
    if (nseq == 0 || total == 0) return MOEX_OK;
    if (!seqs || !positions)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !seqs ? "seqs" : "positions");
    positions_kernel<<<(unsigned)(nseq < 65535 ? nseq : 65535), 128, 0, (cudaStream_t)stream>>>(seqs, nseq, total,
                                                                                               positions);
    return MOEX_CUDA_LAUNCHED("cuda positions kernel");
}

/* ---- strided copies and scaling ------------------------------------------------- */

// src: rows of src_ld floats (0: one row repeated) -> dst: rows of dst_ld floats, n of each
__global__ void copy_rows_kernel(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows,
                                 int64_t n) {
    GRID_STRIDE(idx, rows * n) {
        const int64_t r = idx / n, i = idx % n;
        dst[r * dst_ld + i] = src[r * src_ld + i];
    }
}

extern "C" moex_status moex_cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows,
                                           int64_t n, void *stream) {
    const char *fn = "cuda copy_rows";
    if (rows < 0 || n < 0 || dst_ld < n || src_ld < 0 || (src_ld && src_ld < n) ||
        (rows > 0 && n > 0 && rows > INT64_MAX / 4 / (dst_ld > n ? dst_ld : n)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: rows = %lld, n = %lld, dst_ld = %lld, src_ld = %lld", fn,
                         (long long)rows, (long long)n, (long long)dst_ld, (long long)src_ld);
    if (rows == 0 || n == 0) return MOEX_OK;
    if (!dst || !src) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !dst ? "dst" : "src");
    copy_rows_kernel LAUNCH_1D(rows * n)(dst, dst_ld, src, src_ld, rows, n);
    return MOEX_CUDA_LAUNCHED(fn);
}

// x: [n] (in place)
__global__ void scale_kernel(float *x, int64_t n, float s) {
    GRID_STRIDE(i, n) x[i] = mul_rn(x[i], s);
}

extern "C" moex_status moex_cuda_scale(float *x, int64_t n, float s, void *stream) {
    moex_status st = check_n("cuda scale", n, x, x);
    if (st || n == 0) return st;
    scale_kernel LAUNCH_1D(n)(x, n, s);
    return MOEX_CUDA_LAUNCHED("cuda scale kernel");
}
