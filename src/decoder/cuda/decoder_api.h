/* decoder_api.h — the C boundary of the decoder's GPU building blocks (the
 * decoder_*.cu files of src/decoder/cuda): the device counterparts of decoder/decoder.h
 * and of the routers of experts/router.c. Internal, not installed; exists only
 * when the library is built with MOEX_HAVE_CUDA. No CUDA types: streams and
 * cuBLAS handles travel as void pointers.
 *
 * Conventions
 *   - Every pointer to data is device memory of the stream's GPU (weights,
 *     activations, ids, positions, sequence descriptors, the KV cache).
 *   - Each call checks its arguments on the host, queues its kernels on
 *     `stream` and returns: no host synchronisation, no allocation, so a
 *     sequence of calls can be captured in a CUDA graph. Only the *_create
 *     calls allocate.
 *   - Values the host cannot check without a synchronisation (token ids,
 *     attention descriptors) are checked on the device: a bad one sets a bit
 *     of the status word `flags` (int32 device memory, may be NULL) and the
 *     row it concerns is skipped or zeroed, as documented per call.
 *   - Activations are f32, row-major, contiguous, as on the CPU. Each kernel
 *     rounds the way its CPU twin in src/decoder does (same operations, same
 *     order where the order is fixed there, no fused multiply-add across
 *     separate ops); the only differences left are the device's expf/erff/tanhf
 *     (within 2 ulp) and reductions in double done in another order.
 *   - n, T, rows == 0: nothing is queued, pointers may be NULL.
 */
#ifndef MOEX_CUDA_DECODER_API_H
#define MOEX_CUDA_DECODER_API_H

#include "core/gpu_runtime.h"
#include "decoder/decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The status-word bits these kernels set are core/gpu_runtime.h's (MOEX_CUDA_FLAG_*). */

typedef struct moex_cuda_blas moex_cuda_blas; /* a cuBLAS handle with its workspace (below) */

/* ---- embedding (decoder_embed_norm.cu) ------------------------------------ */

/** moex_embedding on the device. ids are int64 (as moex_sample_greedy's tokens). */
// table: [V, H] of dtype, ids: [T] -> out: [T, H] f32
moex_status moex_cuda_embedding(const void *table, moex_dtype dtype, int64_t V, int64_t H, const int64_t *ids,
                                int64_t T, float *out, int *flags, void *stream);

/* ---- RMSNorm (decoder_embed_norm.cu) --------------------------------------- */

/** moex_rmsnorm: var = sum(x*x) (double) / n, r = 1/sqrtf(var + eps), y = w * (x * r). y may equal x.
 *  No +1 on the weight: the CPU families (qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe) use w as stored. */
// x: [rows, n] -> y: [rows, n]; weight: [n] of wdtype
moex_status moex_cuda_rmsnorm(const float *x, int64_t rows, int64_t n, const void *weight, moex_dtype wdtype,
                              double eps, float *y, void *stream);

/** moex_rmsnorm_heads (Qwen3's q_norm / k_norm): the same over head_dim for every head of every token. */
// x: [T, heads, head_dim] -> y: same; weight: [head_dim]
moex_status moex_cuda_rmsnorm_heads(const float *x, int64_t T, int64_t heads, int64_t head_dim, const void *weight,
                                    moex_dtype wdtype, double eps, float *y, void *stream);

/* ---- rotary (decoder_rope.cu) ---------------------------------------------- */

/** moex_rope_cos_sin: angle = (float)pos * inv_freq[i], cos/sin in double rounded once.
 *  inv_freq: moex_rope_inv_freq's table, uploaded once. A negative position gives cos = 1, sin = 0. */
// inv_freq: [d/2], positions: [T] -> cos, sin: [T, d/2]
moex_status moex_cuda_rope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t *positions, int64_t T,
                                   float *cos_out, float *sin_out, void *stream);

/** moex_mrope_cos_sin (qwen3_vl_moe's interleaved MRoPE); section on the host. */
// inv_freq: [d/2], pos_t, pos_h, pos_w: [T] -> cos, sin: [T, d/2]
moex_status moex_cuda_mrope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t section[3],
                                    const int64_t *pos_t, const int64_t *pos_h, const int64_t *pos_w, int64_t T,
                                    float *cos_out, float *sin_out, void *stream);

/** moex_rope_apply_partial in place (rotate_half convention, one rounding per op): the first
 *  rotary_dim values of each head (even, 2 .. head_dim; rotary_dim = head_dim: moex_rope_apply). */
// x: [T, heads, head_dim], cos, sin: [T, rotary_dim/2]
moex_status moex_cuda_rope_apply(float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                                 const float *cos_in, const float *sin_in, void *stream);

/** moex_rope_apply_interleaved in place (DeepSeek-V3's rope_interleave); head_dim <= MOEX_ROPE_INTERLEAVED_MAX. */
// x: [T, heads, head_dim], cos, sin: [T, head_dim/2]
moex_status moex_cuda_rope_apply_interleaved(float *x, int64_t T, int64_t heads, int64_t head_dim, const float *cos_in,
                                             const float *sin_in, void *stream);

/* ---- KV cache and attention (decoder_attention.cu) ------------------------- */

/** A device KV cache, laid out as the CPU's: k, v [layers, max_batch, kv_heads, max_seq, head_dim]
 *  f32, and len [layers, max_batch] int64, the positions filled (kept on the device). */
typedef struct moex_cuda_kv_cache {
    int device;
    int64_t layers, max_batch, max_seq, kv_heads, head_dim;
    float *k, *v;
    int64_t *len;
} moex_cuda_kv_cache;

/** Allocate (synchronously) and zero a cache; every length 0. Same limits as moex_kv_cache_create. */
moex_status moex_cuda_kv_cache_create(int device, int64_t layers, int64_t max_batch, int64_t max_seq,
                                      int64_t kv_heads, int64_t head_dim, moex_cuda_kv_cache *out);
/** A latent cache (moex_kv_cache_create_latent's twin): kv_heads 1, head_dim = width, k only (v NULL). */
moex_status moex_cuda_kv_cache_create_latent(int device, int64_t layers, int64_t max_batch, int64_t max_seq,
                                             int64_t width, moex_cuda_kv_cache *out);
/** Free what create allocated and zero *cache. NULL or an empty cache is a no-op. */
void moex_cuda_kv_cache_free(moex_cuda_kv_cache *cache);
/** Queue: forget sequence seq in every layer (length 0), or every sequence for seq == -1. */
moex_status moex_cuda_kv_cache_reset(const moex_cuda_kv_cache *cache, int64_t seq, void *stream);

/**
 * moex_attention_forward_sinks on the device. seqs: nseq descriptors (the
 * CPU's struct) in device memory, so that a captured decode step reads this
 * step's `past` when it is replayed; `total` = sum of their tokens, known to
 * the host (the grid is sized by it).
 *   1. k, v rows are written at positions past .. past + T_i - 1 of (layer, seq);
 *      the sequence's length becomes past + T_i.
 *   2. every (row, head): s_j = dot(q, k_j) * head_dim^-0.5 over positions j > p - window
 *      (window 0: all of 0 .. p), w_j = expf(s_j - max) * (1 / sum_j e_j) (sum in double),
 *      with sinks [heads] (or NULL) one more logit per head in the max and the sum that weighs
 *      no value; out = sum_j w_j v_j (f32, j ascending within each warp).
 * A descriptor with seq outside [0, max_batch), a repeated seq, tokens < 0,
 * past < 0 or above the recorded length, past + tokens > max_seq, or token
 * counts that do not add up to `total`, sets MOEX_CUDA_FLAG_BAD_SEQ and that
 * sequence's rows are neither appended nor written. out may equal q.
 * Shared memory: up to 8192 scores per block; longer contexts recompute
 * their scores in chunks (same results).
 */
// q: [total, heads, d], k, v: [total, kv_heads, d], sinks: [heads] -> out: [total, heads * d]
moex_status moex_cuda_attention(const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                int64_t nseq, int64_t total, int64_t heads, const float *q, const float *k,
                                const float *v, float *out, int64_t window, const float *sinks, int *flags,
                                void *stream);

/**
 * moex_attention_forward_latent on the device, over a latent cache: kv rows appended as k above,
 * then s_j = dot(q, kv_j) * scale over the width, the same softmax, out = sum_j w_j kv_j[0 ..
 * value_dim). Descriptors are checked and flagged as above. out must not overlap q or kv.
 * round_q: q's values are rounded to bf16 (to nearest even, as moex_cuda_round_bf16) as they are
 * read (a step in bf16 compute leaves that rounding to the attention).
 */
// q: [total, heads, width], kv: [total, width] -> out: [total, heads, value_dim]
moex_status moex_cuda_attention_latent(const moex_cuda_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                       int64_t nseq, int64_t total, int64_t heads, const float *q, const float *kv,
                                       int64_t value_dim, float scale, float *out, int round_q, int *flags,
                                       void *stream);

/**
 * The same for a step whose descriptors the host knows (a prefill, not captured in a graph), over
 * cuBLAS (decoder_attention_gemm.cu): the rows appended and committed as above, then per sequence, in
 * chunks of query rows, scores = q kv^T * scale (f32 GEMM, pedantic), the causal softmax in place,
 * out = scores kv[:, 0 .. value_dim). host_seqs: the host copy of seqs (what the GEMMs' sizes come
 * from; checked against the cache's bounds). bf16_inputs: every cached row is a bf16 value held in
 * f32 (a step in bf16 compute) and q is rounded to bf16 here (as round_q above; the f32 path below
 * rounds q's rows in place, so q is written); the GEMMs then run on the tensor cores in bf16 with f32
 * accumulation (the same products; the probabilities as three bf16 parts that sum to them) for each
 * sequence whose chunk of one query token fits the scratch (about heads x (2.5 L + W / 2) floats a
 * token and 1.5 L x W for the sequence's rows in bf16, three times; L its positions, W the row
 * width), the f32 GEMMs otherwise.
 * scores: device scratch of scores_floats floats, at least heads x max_seq. Same results as
 * moex_cuda_attention_latent up to the order of the sums; a descriptor the device rejects is flagged
 * and appends nothing, but its rows of out are written.
 */
moex_status moex_cuda_attention_latent_gemm(const moex_cuda_blas *blas, const moex_cuda_kv_cache *cache,
                                            int64_t layer, const moex_attn_seq *seqs, const moex_attn_seq *host_seqs,
                                            int64_t nseq, int64_t total, int64_t heads, float *q,
                                            const float *kv, int64_t value_dim, float scale, float *out,
                                            int bf16_inputs, float *scores, size_t scores_floats, int *flags,
                                            void *stream);

/**
 * moex_cuda_attention for a step whose descriptors the host knows (a prefill, not captured in a
 * graph), over cuBLAS (decoder_attention_gemm.cu): the rows appended and committed as there, then per
 * sequence, in chunks of query rows, batched over every query head, scores = q k^T * head_dim^-0.5
 * (f32 GEMM, pedantic), the causal softmax with the sliding window and sinks in place, out = scores v.
 * host_seqs: the host copy of seqs (what the GEMMs' sizes come from; checked against the cache's
 * bounds). scores: device scratch of scores_floats floats, at least
 * moex_cuda_attention_gemm_scratch_floats(heads, max_seq) (the GEMMs' pointer tables, then the scores).
 * Same results as moex_cuda_attention up to the order of the sums; out may equal q.
 * A descriptor the device rejects (past beyond the cached length, a repeated sequence) is flagged
 * and appends nothing, as there, but its rows of out are written (from what the cache holds).
 */
/* The least scores scratch of moex_cuda_attention_gemm, in floats: one row of every head over
 * max_seq positions and the pointer tables (0 for sizes below 1). */
size_t moex_cuda_attention_gemm_scratch_floats(int64_t heads, int64_t max_seq);

moex_status moex_cuda_attention_gemm(const moex_cuda_blas *blas, const moex_cuda_kv_cache *cache, int64_t layer,
                                     const moex_attn_seq *seqs, const moex_attn_seq *host_seqs, int64_t nseq,
                                     int64_t total, int64_t heads, const float *q, const float *k, const float *v,
                                     float *out, int64_t window, const float *sinks, float *scores,
                                     size_t scores_floats, int *flags, void *stream);

/* ---- routers (decoder_router.cu) ------------------------------------------- */

/**
 * moex_route on the device: f32 logits [T, E] -> ids [T, k] int32, weights
 * [T, k] f32, for the three kinds, with router.c's arithmetic (sums in f32
 * in its order), its tie-breaking (lower index; a NaN score loses to any
 * number) and its order (descending score). desc gives kind, num_experts,
 * top_k, renormalize, n_group, topk_group, scaling; its correction_bias
 * tensor is ignored: pass the f32 [E] device bias as `bias` (NULL for none,
 * grouped kind only). One warp per token; E up to 4096 when its arrays
 * fit in 48 KB of shared memory (always for E <= 2048), else MOEX_ERR_UNSUPPORTED.
 */
// logits: [T, E] -> ids: [T, k], weights: [T, k]
moex_status moex_cuda_route(const moex_router_desc *desc, const float *bias, const float *logits, int64_t T,
                            int32_t *ids, float *weights, void *stream);

/* ---- element-wise helpers (decoder_elementwise.cu) ------------------------ */

/** moex_activate: silu, gelu, gelu_tanh or relu, PyTorch's formulas in f32. y may equal x. */
// x: [n] -> y: [n]
moex_status moex_cuda_activate(moex_activation act, const float *x, float *y, int64_t n, void *stream);

/** moex_sigmoid: 1 / (1 + expf(-x)). y may equal x. */
// x: [n] -> y: [n]
moex_status moex_cuda_sigmoid(const float *x, float *y, int64_t n, void *stream);

/** The gated MLP's middle: h = act(gate) * up, act rounded to f32 before the product
 *  (as mlp.c). gate and up rows are ld floats apart (ld = I for separate buffers,
 *  2I for a fused [T, 2I] gate_up output with gate first). h may equal gate when ld == I. */
// gate, up: [T, ld] (first I columns used) -> h: [T, I]
moex_status moex_cuda_gated_act(moex_activation act, const float *gate, const float *up, int64_t ld, int64_t T,
                                int64_t I, float *h, void *stream);

/** qwen2_moe's shared expert gate: y[t, :] = sigmoid(gate_logit[t]) * y[t, :]. */
// gate_logit: [T], y: [T, H] (in place)
moex_status moex_cuda_scale_rows_sigmoid(const float *gate_logit, float *y, int64_t T, int64_t H, void *stream);

/** out = a + b (the residual adds); out may equal a or b. */
// a, b: [n] -> out: [n]
moex_status moex_cuda_add(const float *a, const float *b, float *out, int64_t n, void *stream);

/** y[t, :] += bias (bias f32/f16/bf16 [N]), after the sum, as F.linear's addmm. */
// y: [T, N] (in place), bias: [N]
moex_status moex_cuda_add_bias(float *y, int64_t T, int64_t N, const void *bias, moex_dtype bias_dtype,
                               void *stream);

/** bf16 compute: x rounded to bf16 and back (round to nearest even), in place (step.c's round_act). */
// x: [n] (in place)
moex_status moex_cuda_round_bf16(float *x, int64_t n, void *stream);

/** dst = src converted (f32/f16/bf16 to f32/f16/bf16, round to nearest even). */
// src: [n] of sdt -> dst: [n] of ddt
moex_status moex_cuda_convert(const void *src, moex_dtype sdt, void *dst, moex_dtype ddt, int64_t n, void *stream);

/** The last new row of each sequence (the rows that get logits): out[i] = x[first_i + T_i - 1],
 *  first_i = the tokens of the descriptors before i. A sequence with T_i < 1 gets a zero row. */
// x: [sum T_i, H], seqs: [nseq] -> out: [nseq, H]
moex_status moex_cuda_gather_last_rows(const float *x, int64_t H, const moex_attn_seq *seqs, int64_t nseq, float *out,
                                       void *stream);

/** The absolute position of every stacked row, from the device descriptors (step.c's
 *  positions: past + t), so that a captured step needs only its descriptors written.
 *  Rows past the descriptors' tokens get 0. */
// seqs: [nseq] -> positions: [total] int64
moex_status moex_cuda_positions(const moex_attn_seq *seqs, int64_t nseq, int64_t total, int64_t *positions,
                                void *stream);

/** Rows of floats between two strided buffers: dst[r*dst_ld + i] = src[r*src_ld + i], r < rows,
 *  i < n (src_ld 0: one row repeated). No overlap. */
// src: [rows, src_ld] -> dst: [rows, dst_ld]
moex_status moex_cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows, int64_t n,
                                void *stream);

/** x[i] *= s, rounded once (gpt_oss's yarn attention factor on cos and sin). */
// x: [n] (in place)
moex_status moex_cuda_scale(float *x, int64_t n, float s, void *stream);

/* ---- greedy (decoder_argmax.cu) -------------------------------------------- */

/** moex_sample_greedy per row: the first maximum; a row with a NaN gets -1 - (its first NaN's index). */
// logits: [rows, V] -> tokens: [rows] int64
moex_status moex_cuda_argmax(const float *logits, int64_t rows, int64_t V, int64_t *tokens, void *stream);

/* ---- linear layers over cuBLAS (decoder_linear.cu) ------------------------- */

/** A cuBLAS handle for one device with its own workspace (graph capture needs one that is
 *  not allocated during capture). Math mode CUBLAS_DEFAULT_MATH: no TF32. */
typedef struct moex_cuda_blas {
    int device;
    void *handle;    /* cublasHandle_t */
    void *workspace; /* device memory */
    size_t workspace_bytes;
} moex_cuda_blas;

/** Create the handle and its workspace (0 bytes: 32 MiB, what cuBLAS advises for Hopper). */
moex_status moex_cuda_blas_create(int device, size_t workspace_bytes, moex_cuda_blas *out);
void moex_cuda_blas_free(moex_cuda_blas *blas);

/**
 * moex_linear on the device: y = x W^T (+ bias), W [N, K] row-major as stored,
 * the sum over K in f32 by cuBLAS (cublasGemmEx), the bias added after the sum.
 *   - f32 weights: CUBLAS_COMPUTE_32F_PEDANTIC (plain f32 FMA, never TF32).
 *   - f16/bf16 weights: x is first rounded to the weight's dtype into x16
 *     ([T, K] of w->dtype, caller's device memory), then f16/bf16 tensor cores
 *     with f32 accumulation (CUBLAS_COMPUTE_32F). The rounding is exact when x
 *     already holds bf16 values (bf16 compute rounds every activation); for
 *     f32 compute upload f32 weights.
 * w's pointers are device pointers. y must not overlap x. T, N, K <= INT32_MAX.
 */
// x: [T, K] -> y: [T, N]
moex_status moex_cuda_linear(const moex_cuda_blas *blas, const moex_linear_w *w, const float *x, int64_t T, float *y,
                             void *x16, void *stream);

/**
 * moex_mla_absorb and moex_mla_values on the device: one strided batched cuBLAS GEMM over the heads
 * (cublasGemmStridedBatchedEx), the sums in f32 as moex_cuda_linear's (f32 kv_b: pedantic f32; bf16
 * or f16 kv_b: the input rounded to its dtype into x16, [T, heads * q_stride] or [T, heads *
 * kv_lora_rank] of kv_b's dtype, then tensor cores with f32 accumulation).
 */
// q: [T, heads, q_stride] -> out: [T, heads, out_stride] (the first kv_lora_rank of each head)
moex_status moex_cuda_mla_absorb(const moex_cuda_blas *blas, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                 int64_t vd, const float *q, int64_t q_stride, int64_t T, float *out,
                                 int64_t out_stride, void *x16, void *stream);
// lat: [T, heads, kv_lora_rank] -> out: [T, heads, vd]
moex_status moex_cuda_mla_values(const moex_cuda_blas *blas, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                 int64_t vd, const float *lat, int64_t T, float *out, void *x16, void *stream);

#ifdef __cplusplus
}
#endif

#endif
