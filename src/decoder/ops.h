/* ops.h — the operations of a decoder step as one table, so that the step is written once
 * (model/step.c) and runs on the CPU or on a CUDA device:
 *   moex_decoder_ops_cpu   over the CPU building blocks of decoder.h (ops_cpu.c)
 *   moex_decoder_ops_cuda  over the device ones of decoder/cuda/decoder_api.h (ops_cuda.c),
 *                          only in a build with MOEX_HAVE_CUDA
 * Internal, not installed.
 *
 * Every pointer to data an op takes is in the table's memory: host memory for the CPU table,
 * device memory of the environment's GPU for the CUDA one (weights included: moex_linear_w,
 * moex_mlp_w and norm weights hold device pointers there). Only copy_in and copy_out cross:
 * their host side is host memory for both tables. The CUDA ops only queue work on the
 * environment's stream (no synchronisation, no allocation), so that a sequence of them can be
 * captured in a graph; the CPU ops run at once. Each op rounds as its CPU building block does
 * (decoder.h, decoder_api.h): a step gives the same numbers through either table, but for the
 * device's expf/erff/tanhf and reductions in double done in another order.
 */
#ifndef MOEX_DECODER_OPS_H
#define MOEX_DECODER_OPS_H

#include "decoder/decoder.h"

typedef struct moex_decoder_ops moex_decoder_ops;

/* What the ops of one table work with. The fields a table does not use stay zero. */
typedef struct moex_decoder_env {
    const moex_decoder_ops *ops;
    moex_device device; /* where the buffers live (tensors handed to the experts get it) */
    int threads;        /* CPU: OpenMP threads (0 = one per online core) */
    void *kv;           /* the KV cache: moex_kv_cache * (CPU) or moex_cuda_kv_cache * (CUDA) */
    void *stream;       /* CUDA: the stream every op queues on */
    int *flags;         /* CUDA: the status word bad ids and descriptors set (device memory) */
    const void *blas;   /* CUDA: moex_cuda_blas * for the linear layers */
    void *x16;          /* CUDA: [rows, widest input] of bf16, a linear layer's rounded input */
    float *scores;      /* CUDA: the attention's GEMM path scratch (prefills), scores_floats floats */
    size_t scores_floats;
    int bf16_inputs;    /* CUDA: the step rounds every activation to bf16 (bf16 compute), so the latent
                         * attention's GEMM path may multiply its inputs as bf16 */
} moex_decoder_env;

struct moex_decoder_ops {
    const char *name; /* "cpu", "cuda" */
    /* bytes from host memory src into the table's memory dst, and back (the caller
     * synchronises the context before copy_out reads what queued ops wrote) */
    moex_status (*copy_in)(const moex_decoder_env *e, void *dst, const void *src, size_t bytes);
    moex_status (*copy_out)(const moex_decoder_env *e, void *dst, const void *src, size_t bytes);
    /* moex_embedding: table [V, H] of dtype, ids [T] -> out [T, H] */
    moex_status (*embedding)(const moex_decoder_env *e, const void *table, moex_dtype dtype, int64_t V, int64_t H,
                             const int64_t *ids, int64_t T, float *out);
    /* the absolute position of every stacked row: positions[first_i + t] = past_i + t, seqs [nseq] */
    moex_status (*positions)(const moex_decoder_env *e, const moex_attn_seq *seqs, int64_t nseq, int64_t total,
                             int64_t *positions);
    /* moex_rope_cos_sin and moex_mrope_cos_sin: -> cos, sin [T, head_dim / 2] */
    moex_status (*rope_cos_sin)(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                const int64_t *positions, int64_t T, float *cos_out, float *sin_out);
    moex_status (*mrope_cos_sin)(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                 const int64_t section[3], const int64_t *pos_t, const int64_t *pos_h,
                                 const int64_t *pos_w, int64_t T, float *cos_out, float *sin_out);
    /* moex_rmsnorm: x [rows, n] -> y (may equal x) */
    moex_status (*rmsnorm)(const moex_decoder_env *e, const float *x, int64_t rows, int64_t n, const void *weight,
                           moex_dtype wdtype, double eps, float *y);
    /* moex_rmsnorm_heads (q_norm, k_norm): x [T, heads, head_dim] -> y */
    moex_status (*rmsnorm_heads)(const moex_decoder_env *e, const float *x, int64_t T, int64_t heads,
                                 int64_t head_dim, const void *weight, moex_dtype wdtype, double eps, float *y);
    /* moex_rope_apply_partial in place: x [T, heads, head_dim], the first rotary_dim of each head */
    moex_status (*rope_apply)(const moex_decoder_env *e, float *x, int64_t T, int64_t heads, int64_t head_dim,
                              int64_t rotary_dim, const float *cos_in, const float *sin_in);
    /* moex_linear (q, k, v, o, router, shared-expert gate, lm_head): x [T, K] -> y [T, N] */
    moex_status (*linear)(const moex_decoder_env *e, const moex_linear_w *w, const float *x, int64_t T, float *y);
    /* moex_attention_forward_sinks with the environment's KV cache; total = the seqs' tokens; window 0
     * and sinks NULL: plain causal attention. host_seqs as for latent_attention (the CUDA table's
     * GEMM path for prefills) */
    moex_status (*attention)(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                             const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                             const float *q, const float *k, const float *v, float *out, int64_t window,
                             const float *sinks);
    /* moex_route: f32 logits [T, E] -> ids [T, top_k] int32, weights [T, top_k] f32 */
    moex_status (*route)(const moex_decoder_env *e, const moex_router_desc *desc, const float *logits, int64_t T,
                         int32_t *ids, float *weights);
    /* moex_gated_mlp (a dense layer, the shared expert): x [T, H] -> y [T, H]; gate, up:
     * [T, I] scratch the CUDA table computes in (the CPU one allocates its own) */
    moex_status (*mlp)(const moex_decoder_env *e, const moex_mlp_w *w, const float *x, int64_t T, float *y,
                       float *gate, float *up);
    /* the shared expert's gate: y[t, :] = sigmoid(gate_logit[t]) * y[t, :] */
    moex_status (*scale_rows_sigmoid)(const moex_decoder_env *e, const float *gate_logit, float *y, int64_t T,
                                      int64_t H);
    /* the residual adds: out = a + b (out may equal a or b) */
    moex_status (*add)(const moex_decoder_env *e, const float *a, const float *b, float *out, int64_t n);
    /* bf16 compute: x rounded to bf16 and back, in place */
    moex_status (*round_bf16)(const moex_decoder_env *e, float *x, int64_t n);
    /* dtype conversion (f32, f16, bf16) */
    moex_status (*convert)(const moex_decoder_env *e, const void *src, moex_dtype sdt, void *dst, moex_dtype ddt,
                           int64_t n);
    /* out[i] = x[last row of sequence i] (rows stacked sequence after sequence), or zeros when it has none */
    moex_status (*gather_last_rows)(const moex_decoder_env *e, const float *x, int64_t H, const moex_attn_seq *seqs,
                                    int64_t nseq, float *out);
    /* greedy: per row the first maximum; a row with a NaN gets -1 - (its first NaN's index) */
    moex_status (*argmax)(const moex_decoder_env *e, const float *logits, int64_t rows, int64_t V, int64_t *tokens);
    /* forget sequence seq (every one for -1) in the KV cache */
    moex_status (*kv_reset)(const moex_decoder_env *e, int64_t seq);
    /* rows of floats between two strided buffers of the table's memory: dst[r*dst_ld + i] =
     * src[r*src_ld + i] for r < rows, i < n (src_ld 0: one row repeated); no overlap */
    moex_status (*copy_rows)(const moex_decoder_env *e, float *dst, int64_t dst_ld, const float *src, int64_t src_ld,
                             int64_t rows, int64_t n);
    /* x[i] *= s in f32 (gpt_oss's yarn attention factor on cos and sin) */
    moex_status (*scale)(const moex_decoder_env *e, float *x, int64_t n, float s);
    /* moex_rope_apply_interleaved in place (deepseek_v3's rope_interleave): x [T, heads, head_dim] */
    moex_status (*rope_apply_interleaved)(const moex_decoder_env *e, float *x, int64_t T, int64_t heads,
                                          int64_t head_dim, const float *cos_in, const float *sin_in);
    /* moex_attention_forward_latent with the environment's latent cache (deepseek_v3): kv [total, width]
     * appended, q [total, heads, width] -> out [total, heads, value_dim]. host_seqs: the descriptors in
     * host memory when the host knows them (a step not captured in a graph), else NULL; the CUDA table
     * takes its GEMM path with them for prefills. Where latent_rounds_q says so, q is rounded to bf16
     * by the op (possibly in place: q is the step's scratch) */
    moex_status (*latent_attention)(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                                    const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                                    float *q, const float *kv, int64_t value_dim, float scale, float *out);
    /* moex_mla_absorb: q [T, heads, q_stride] -> out [T, heads, out_stride] (the first kv_lora_rank) */
    moex_status (*mla_absorb)(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                              int64_t vd, const float *q, int64_t q_stride, int64_t T, float *out, int64_t out_stride);
    /* moex_mla_values: lat [T, heads, kv_lora_rank] -> out [T, heads, vd] */
    moex_status (*mla_values)(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                              int64_t vd, const float *lat, int64_t T, float *out);
    /* 1 when the table's products by w (linear, mla_absorb, mla_values) round their input to bf16
     * themselves, exactly as round_bf16 does (the CUDA table converts it to w's bf16): a step in bf16
     * compute may then leave out its own rounding of a buffer only those products read */
    int (*rounds_input_bf16)(const moex_decoder_env *e, const moex_linear_w *w);
    /* 1 when latent_attention rounds q to bf16 itself, as round_bf16 does (the CUDA table in bf16
     * compute: its kernel as it reads q, its GEMM paths by their conversion or in place), so the
     * step leaves out its own rounding of the absorbed queries */
    int (*latent_rounds_q)(const moex_decoder_env *e);
};

extern const moex_decoder_ops moex_decoder_ops_cpu;
#if MOEX_HAVE_CUDA
extern const moex_decoder_ops moex_decoder_ops_cuda;
#endif

#endif
