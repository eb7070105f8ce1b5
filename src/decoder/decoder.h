/*
 * decoder.h — the numerical building blocks of a Hugging Face MoE decoder
 * (qwen2_moe, qwen3_moe, mixtral, the text backbone of qwen3_vl_moe), on the
 * CPU in f32, computed the way transformers 5.x computes them in float32.
 * Internal: not installed. The experts layers themselves are moex.h's.
 *
 * Conventions (those of moex.h)
 *   - Every call returns a moex_status; on failure moex_last_error() names the
 *     bad value and nothing has been written (outputs, caches, generators).
 *   - Activations are f32, row-major, contiguous. Weights are borrowed, never
 *     copied: f32, f16 or bf16, decoded exactly to f32.
 *   - `threads`: OpenMP threads for the call; 0 = one per online core. No
 *     result depends on the thread count (bit for bit).
 *   - T (tokens) may be 0: nothing is read or written, pointers may be NULL.
 *   - Rounding: every f32 operation that transformers performs as a separate
 *     tensor op is rounded to f32 here too (no fused multiply-add across
 *     them). Reductions (sums over H, over head_dim, over positions) are done
 *     in a fixed order of our own, so results agree with PyTorch to a few
 *     ulps, not bit for bit. See each function for its exact formula.
 *
 * Files: linear.c (linear, embedding), norm.c (RMSNorm), rope.c (RoPE,
 * interleaved MRoPE), attention.c (KV cache, attention), mlp.c (activations,
 * gated MLP, shared expert), sampling.c (generator, greedy, sampling). The
 * activations' formulas are linear/activation.h's (shared with the GPU). ops.h
 * puts these calls (ops_cpu.c) and their device twins (ops_cuda.c) behind one
 * table, over which model/step.c writes the decoder step once.
 */
#ifndef MOEX_MODEL_DECODER_H
#define MOEX_MODEL_DECODER_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Linear layers and embeddings                                              */
/* ------------------------------------------------------------------------ */

/** A weight vector (a norm's scale) as loaded: data [n] of dtype. The dtype travels
 *  with the data, so that two vectors of one layer can differ. */
typedef struct moex_vec_w {
    const void *data; /**< [n], or NULL when the model has no such weight */
    moex_dtype dtype; /**< f32, f16 or bf16 */
} moex_vec_w;

/** An nn.Linear: weight [N, K] row-major (as stored in the checkpoint), optional bias [N]. */
typedef struct moex_linear_w {
    const void *weight;    /**< [out_features, in_features], dtype; aligned to its element size */
    moex_dtype dtype;      /**< f32, f16 or bf16 */
    int64_t out_features;  /**< N >= 1 */
    int64_t in_features;   /**< K >= 1 */
    const void *bias;      /**< [out_features] of bias_dtype, or NULL for none */
    moex_dtype bias_dtype; /**< f32, f16 or bf16 (ignored without a bias) */
} moex_linear_w;

/**
 * y = x W^T (+ bias), the sum over K in f32 by moex_gemm (the experts' GEMM),
 * the bias added after the sum (as F.linear's addmm rounds it).
 * Work is split over blocks of 128 output columns; T <= 8 streams the weights.
 * y must not overlap x. Allocates T row pointers and one GEMM panel per thread.
 * The lm_head is this call with the lm_head weight [V, H] (or, with
 * tie_word_embeddings, the embedding table): x [T, H] -> logits [T, V].
 */
// x: [T, K] -> y: [T, N]
moex_status moex_linear(const moex_linear_w *w, const float *x, int64_t T, float *y, int threads);

/**
 * DeepSeek-V3's absorbed latent attention, the two per-head products of kv_b (weight
 * [heads * (nope + vd), r], r = kv_lora_rank; per head its nope key rows, then its vd value rows; no bias):
 *   moex_mla_absorb: out[t, h, 0 .. r) = sum_i q[t, h, i] * kv_b[h * (nope + vd) + i, :], i < nope
 *                    (the query folded through the key rows, so that q . k_j = out . latent_j)
 *   moex_mla_values: out[t, h, i] = sum_c kv_b[h * (nope + vd) + nope + i, c] * lat[t, h, c], i < vd
 * Sums in f32 by moex_gemm, as moex_linear.
 */
// q: [T, heads, q_stride] (the first nope of each head read) -> out: [T, heads, out_stride] (the first r written)
moex_status moex_mla_absorb(const moex_linear_w *kv_b, int64_t heads, int64_t nope, int64_t vd, const float *q,
                            int64_t q_stride, int64_t T, float *out, int64_t out_stride, int threads);
// lat: [T, heads, r] -> out: [T, heads, vd]
moex_status moex_mla_values(const moex_linear_w *kv_b, int64_t heads, int64_t nope, int64_t vd, const float *lat,
                            int64_t T, float *out, int threads);

/**
 * nn.Embedding: out[t] = table[ids[t]] decoded to f32. Every id is checked
 * against [0, V) before anything is written.
 */
// table: [V, H] of dtype, ids: [T] -> out: [T, H]
moex_status moex_embedding(const void *table, moex_dtype dtype, int64_t V, int64_t H, const int64_t *ids,
                           int64_t T, float *out);

/* ------------------------------------------------------------------------ */
/* RMSNorm                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * Qwen2Moe/Qwen3Moe/Mixtral RMSNorm in f32, per row of n values:
 *     var = sum(x*x) / n        (x*x rounded to f32, the sum kept in double
 *                                then rounded: PyTorch's sum-then-div mean)
 *     r   = 1 / sqrtf(var + (float)eps)      (torch.rsqrt)
 *     y   = w * (x * r)                      (hidden * rsqrt, then weight * hidden)
 * y may equal x (in place); otherwise they must not overlap.
 */
// x: [rows, n] -> y: [rows, n]; weight: [n] of wdtype (f32/f16/bf16)
moex_status moex_rmsnorm(const float *x, int64_t rows, int64_t n, const void *weight, moex_dtype wdtype, double eps,
                         float *y);

/** Qwen3's q_norm / k_norm: the same RMSNorm over head_dim, for every head of every token. */
// x: [T, heads, head_dim] -> y: [T, heads, head_dim]; weight: [head_dim]
moex_status moex_rmsnorm_heads(const float *x, int64_t T, int64_t heads, int64_t head_dim, const void *weight,
                               moex_dtype wdtype, double eps, float *y);

/* ------------------------------------------------------------------------ */
/* Rotary position embeddings (HF rotate_half convention)                   */
/* ------------------------------------------------------------------------ */

/**
 * The default rope's inverse frequencies, as transformers computes them in f32:
 *     inv_freq[i] = 1.0f / powf((float)theta, (float)(2i) / (float)head_dim)
 * (1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))).
 * powf is evaluated in double and rounded once (correctly rounded but for
 * double-rounding ties; PyTorch's vectorised powf is within 1 ulp of it).
 * head_dim even, >= 2; theta finite, > 0, and != 1.
 */
// -> inv_freq: [head_dim / 2]
moex_status moex_rope_inv_freq(int64_t head_dim, double theta, float *inv_freq);

/** YaRN rope scaling (rope_type "yarn": DeepSeek-V3, GPT-OSS), as transformers' rope_parameters
 *  give it. A value of 0 is an absent key, which takes transformers' default. */
typedef struct moex_yarn_params {
    double factor;                           /* > 0; 0: max_position_embeddings / original_max_position_embeddings */
    double original_max_position_embeddings; /* > 0 */
    double max_position_embeddings;          /* only for an absent factor */
    double beta_fast, beta_slow;             /* 0: 32 and 1 */
    double mscale, mscale_all_dim;           /* both non-zero: the attention factor from both */
    double attention_factor;                 /* > 0 given, 0: derived */
    int truncate;                            /* 1 (transformers' default): floor/ceil the correction range */
} moex_yarn_params;

/**
 * The yarn inverse frequencies of transformers' _compute_yarn_parameters in f32, each operation
 * rounded as torch rounds it: pos = base ** (2i / dim) as moex_rope_inv_freq computes it,
 * extrapolation 1 / pos, interpolation 1 / (factor * pos), blended by the linear ramp over the
 * correction range of beta_fast .. beta_slow rotations:
 *     inv[i] = interp * (1 - (1 - ramp)) + extrap * (1 - ramp)
 * and *attention_factor, the factor transformers multiplies cos and sin by (double): the given
 * one, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are set,
 * else get_mscale(factor), get_mscale(s, m) = s <= 1 ? 1 : 0.1 m ln(s) + 1.
 */
// -> inv_freq: [dim / 2]
moex_status moex_rope_inv_freq_yarn(int64_t dim, double theta, const moex_yarn_params *yarn, float *inv_freq,
                                    double *attention_factor);

/**
 * cos/sin tables for positions (one per token, >= 0):
 *     angle = (float)pos * inv_freq[i]  (rounded to f32, as the f32 matmul of
 *                                        transformers' rotary embedding)
 *     cos[t, i] = cosf(angle), sin[t, i] = sinf(angle) (in double, rounded once)
 * Only the first half is stored: transformers' emb = cat(freqs, freqs) repeats it.
 * attention_scaling is 1 for the default rope type (the only one here).
 */
// inv_freq: [d/2], positions: [T] -> cos, sin: [T, d/2]
moex_status moex_rope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t *positions, int64_t T,
                              float *cos_out, float *sin_out);

/**
 * Interleaved MRoPE of qwen3_vl_moe (Qwen3VLMoeTextRotaryEmbedding.apply_interleaved_mrope):
 * frequency i takes its position from
 *     pos_h  if i % 3 == 1 and i < 3 * section[1]
 *     pos_w  if i % 3 == 2 and i < 3 * section[2]
 *     pos_t  otherwise
 * then cos/sin as moex_rope_cos_sin. section = mrope_section [t, h, w], each
 * >= 0, summing to head_dim / 2. With pos_t == pos_h == pos_w (text-only
 * input) the result is bit for bit moex_rope_cos_sin's.
 */
// inv_freq: [d/2], pos_t, pos_h, pos_w: [T] -> cos, sin: [T, d/2]
moex_status moex_mrope_cos_sin(const float *inv_freq, int64_t head_dim, const int64_t section[3],
                               const int64_t *pos_t, const int64_t *pos_h, const int64_t *pos_w, int64_t T,
                               float *cos_out, float *sin_out);

/**
 * Apply rope in place with the rotate_half convention (the two halves of
 * head_dim, not interleaved pairs): for i < d/2, a = x[i], b = x[i + d/2],
 *     x[i]       = a*cos[i] - b*sin[i]
 *     x[i + d/2] = b*cos[i] + a*sin[i]
 * each product rounded to f32 before the sum (q * cos + rotate_half(q) * sin).
 * Use it for q [T, heads, d] and for k [T, kv_heads, d] with the same tables.
 */
// x: [T, heads, head_dim] (in place), cos, sin: [T, head_dim/2]
moex_status moex_rope_apply(float *x, int64_t T, int64_t heads, int64_t head_dim, const float *cos_in,
                            const float *sin_in);
/* Interleaved pairs (deepseek_v3's rope_interleave, transformers' apply_rotary_pos_emb_interleave):
 * for i < d/2, a = x[2i], b = x[2i+1] -> x[i] = a*cos[i] - b*sin[i], x[d/2 + i] = b*cos[i] + a*sin[i]
 * (the rotated pairs de-interleaved, as transformers concatenates them); head_dim <= 512. */
#define MOEX_ROPE_INTERLEAVED_MAX 512
moex_status moex_rope_apply_interleaved(float *x, int64_t T, int64_t heads, int64_t head_dim, const float *cos_in,
                                        const float *sin_in);
/* Partial rotary (glm4_moe's partial_rotary_factor): the same on the first rotary_dim values of
 * each head (even, 2 .. head_dim; its two halves), the rest unchanged; cos, sin: [T, rotary_dim/2]. */
moex_status moex_rope_apply_partial(float *x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                                    const float *cos_in, const float *sin_in);

/* ------------------------------------------------------------------------ */
/* KV cache and attention                                                    */
/* ------------------------------------------------------------------------ */

/**
 * A KV cache (opaque): f32 keys and values for `layers` layers and up to
 * `max_batch` sequences of up to `max_seq` positions each, allocated once at
 * creation (layers * max_batch * kv_heads * max_seq * head_dim * 2 floats,
 * laid out [layer][sequence][kv_head][position][head_dim]).
 * It records, per layer and sequence, how many positions are filled.
 * Thread-safety: one call at a time per cache.
 */
typedef struct moex_kv_cache moex_kv_cache;

/** Create a cache; every length starts at 0. All sizes >= 1; fails on overflow or out of memory. */
moex_status moex_kv_cache_create(int64_t layers, int64_t max_batch, int64_t max_seq, int64_t kv_heads,
                                 int64_t head_dim, moex_kv_cache **out);

/** Free a cache. NULL is a no-op. */
void moex_kv_cache_free(moex_kv_cache *cache);

/** Forget sequence `seq` in every layer (length 0), or every sequence when seq == -1. */
moex_status moex_kv_cache_reset(moex_kv_cache *cache, int64_t seq);

/** A latent cache (deepseek_v3's absorbed attention): one row of `width` floats per position of each
 *  (layer, sequence), the keys; the values are the first value_dim floats of each row
 *  (layers * max_batch * max_seq * width floats). Only moex_attention_forward_latent uses it. */
moex_status moex_kv_cache_create_latent(int64_t layers, int64_t max_batch, int64_t max_seq, int64_t width,
                                        moex_kv_cache **out);

/** Positions filled for (layer, seq) into *length. */
moex_status moex_kv_cache_length(const moex_kv_cache *cache, int64_t layer, int64_t seq, int64_t *length);

/** Bytes of keys and values the cache holds (0 for NULL). */
size_t moex_kv_cache_bytes(const moex_kv_cache *cache);

/**
 * Causal grouped-query attention of one sequence with the cache, as
 * transformers' eager attention in f32:
 *   1. k, v (already rotated) are written at positions past .. past+T-1 of
 *      (layer, seq); the recorded length becomes past + T. past may be below
 *      the recorded length (rewind: later positions are overwritten or
 *      forgotten) but not above it, and past + T must not exceed max_seq.
 *   2. token t (absolute position p = past + t), query head h, kv head
 *      h / (heads / kv_heads) (repeat_kv), over positions j = 0 .. p:
 *        s_j = dot(q, k_j) * (float)head_dim^-0.5      (dot in f32, fixed order)
 *        w_j = expf(s_j - max_j s_j) * (1 / sum_j e_j) (softmax in f32; the sum in double)
 *        out[t, h*d .. h*d+d) = sum_j w_j * v_j         (f32, j ascending)
 * heads must be a multiple of the cache's kv_heads. out may equal q (not
 * otherwise overlap q, k or v). Multithreaded over heads; the result does not
 * depend on the thread count nor on how a sequence is split into calls.
 * Allocates (max_seq + head_dim) floats per thread for the call.
 */
// q: [T, heads, d], k, v: [T, kv_heads, d] -> out: [T, heads * d]
moex_status moex_attention_forward(moex_kv_cache *cache, int64_t layer, int64_t seq, int64_t heads, const float *q,
                                   const float *k, const float *v, int64_t T, int64_t past, float *out, int threads);

/** One sequence of a batched attention call. */
typedef struct moex_attn_seq {
    int64_t seq;    /**< sequence index in the cache, [0, max_batch); distinct within a call */
    int64_t tokens; /**< T_i >= 0 new tokens */
    int64_t past;   /**< positions already in the cache that it attends to */
} moex_attn_seq;

/**
 * moex_attention_forward for several sequences at once (e.g. one decode step
 * of a batch): their tokens are stacked, sequence after sequence, in q, k, v
 * and out; work is shared over (sequence, head) pairs. Same result as one
 * call per sequence. Every sequence is checked before anything is written.
 */
// q: [sum T_i, heads, d], k, v: [sum T_i, kv_heads, d] -> out: [sum T_i, heads * d]
moex_status moex_attention_forward_batch(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                         int64_t nseq, int64_t heads, const float *q, const float *k, const float *v,
                                         float *out, int threads);

/**
 * The same with gpt_oss's two additions: window > 0 limits token t (position p) to the last window
 * positions (j > p - window, transformers' sliding window), and sinks [heads] (or NULL) adds one
 * logit per head to each row's softmax (in its maximum and its sum) that weighs no value, as
 * transformers' eager attention with s_aux drops the sink column after the softmax.
 */
moex_status moex_attention_forward_sinks(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs, int64_t nseq,
                                         int64_t heads, const float *q, const float *k, const float *v, float *out,
                                         int threads, int64_t window, const float *sinks);

/**
 * Multi-head attention over a latent cache (moex_kv_cache_create_latent), DeepSeek-V3's absorbed form:
 *   1. kv rows [total, width] are written at positions past .. past + T_i - 1 of (layer, seq);
 *   2. every (row, head): s_j = dot(q, kv_j) * scale over the width, the softmax as
 *      moex_attention_forward's, out = sum_j w_j kv_j[0 .. value_dim).
 * Every head reads the one latent row of each position. out must not overlap q or kv.
 */
/** The latent attention's own arguments (both devices' entry points): the cache a latent one
 *  (latent != 0), 1 <= value_dim <= width, scale a positive number; fn names the caller. */
moex_status moex_latent_args_check(const char *fn, int latent, int64_t width, int64_t value_dim, float scale);

// q: [sum T_i, heads, width], kv: [sum T_i, width] -> out: [sum T_i, heads, value_dim]
moex_status moex_attention_forward_latent(moex_kv_cache *cache, int64_t layer, const moex_attn_seq *seqs,
                                          int64_t nseq, int64_t heads, const float *q, const float *kv,
                                          int64_t value_dim, float scale, float *out, int threads);

/* ------------------------------------------------------------------------ */
/* Activations and dense MLPs                                                */
/* ------------------------------------------------------------------------ */

/**
 * y = act(x) element-wise in f32, PyTorch's CPU formulas:
 *   silu      x / (1 + expf(-x))
 *   gelu      x * 0.5 * (1 + erff(x * M_SQRT1_2))
 *   gelu_tanh 0.5 * x * (1 + tanhf(sqrt(2/pi) * (x + 0.044715 * x^3)))
 *   relu      max(x, 0)
 * act: MOEX_ACT_SILU, _GELU, _GELU_TANH or _RELU (the clamped kinds are for
 * experts only). y may equal x.
 */
// x: [n] -> y: [n]
moex_status moex_activate(moex_activation act, const float *x, float *y, int64_t n);

/** MOEX_OK when act is one of the four kinds moex_activate takes; else MOEX_ERR_INVALID_ARGUMENT
 *  naming fn and the activation. The device twin (decoder/cuda) checks with it too. */
moex_status moex_dense_act_check(const char *fn, moex_activation act);

/** y = 1 / (1 + expf(-x)) in f32 (torch.sigmoid). y may equal x. */
// x: [n] -> y: [n]
moex_status moex_sigmoid(const float *x, float *y, int64_t n);

/** A dense gated MLP (Qwen2MoeMLP, Qwen3MoeMLP, a shared expert): down(act(gate(x)) * up(x)). */
typedef struct moex_mlp_w {
    moex_linear_w gate;  /**< [I, H] */
    moex_linear_w up;    /**< [I, H] */
    moex_linear_w down;  /**< [H, I] */
    moex_activation act; /**< MOEX_ACT_SILU for these families */
} moex_mlp_w;

/**
 * y = down(act(gate(x)) * up(x)); h = act(g) * u rounded to f32.
 * Allocates 2 * T * I floats for the call. y must not overlap x.
 */
// x: [T, H] -> y: [T, H]
moex_status moex_gated_mlp(const moex_mlp_w *mlp, const float *x, int64_t T, float *y, int threads);

/** The shared expert's gate applied in place: y[t, :] = sigmoid(gate_logit[t]) * y[t, :]. */
// gate_logit: [T], y: [T, H]
void moex_scale_rows_sigmoid(const float *gate_logit, float *y, int64_t T, int64_t H);

/**
 * qwen2_moe's shared expert: y = sigmoid(x . gate_w) * mlp(x), the scalar
 * gate per token (shared_expert_gate, an nn.Linear(H, 1, bias=False)). The
 * caller adds y to the routed experts' output. y must not overlap x.
 */
// x: [T, H], gate: weight [1, H] -> y: [T, H]
moex_status moex_shared_expert(const moex_mlp_w *mlp, const moex_linear_w *gate, const float *x, int64_t T, float *y,
                               int threads);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                  */
/* ------------------------------------------------------------------------ */

/** xoshiro256** generator, seeded through splitmix64. Same seed -> same stream. */
typedef struct moex_rng {
    uint64_t s[4];
} moex_rng;

/** Seed *rng (any seed, 0 included). */
moex_status moex_rng_seed(moex_rng *rng, uint64_t seed);
/** Next 64 random bits. rng must not be NULL. */
uint64_t moex_rng_next(moex_rng *rng);
/** Uniform double in [0, 1) (53 bits). rng must not be NULL. */
double moex_rng_uniform(moex_rng *rng);

/** Sampling parameters; start from moex_sampling_default(). */
typedef struct moex_sampling {
    double temperature; /**< > 0 samples (1 = unchanged); 0 = greedy (top_k, top_p ignored) */
    int64_t top_k;      /**< keep the top_k largest scores (ties at the k-th kept); 0 = off */
    double top_p;       /**< nucleus mass in [0, 1]; 1 = off */
} moex_sampling;

/** temperature 1, top_k 0, top_p 1: sampling from the softmax of the logits. */
moex_sampling moex_sampling_default(void);

/**
 * Greedy: the index of the largest logit; ties go to the lower index (torch.argmax
 * returns the first maximum). A NaN logit is MOEX_ERR_INVALID_ARGUMENT naming its
 * index, as in moex_sample: no token means anything then.
 */
// logits: [V] -> *token
moex_status moex_sample_greedy(const float *logits, int64_t V, int64_t *token);

// logits: [V] -> the index of the first maximum, or -1 - i for the first NaN at i (no checks: the
// greedy sampler's and the CPU decoder table's argmax)
int64_t moex_argmax_row(const float *x, int64_t V);

/**
 * The distribution a sample is drawn from, in the order of transformers'
 * warpers (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper), f32:
 *   1. s = logits / (float)temperature
 *   2. top_k (0 < top_k < V): drop every s below the top_k-th largest (ties kept)
 *   3. top_p (< 1): p = softmax(s) over what is left; walking the scores in
 *      ascending order (ties: higher index first), drop while the running sum
 *      of p (kept in double, compared as f32) is <= (float)(1 - top_p); the
 *      largest is always kept. Equivalently: keep the smallest prefix of the
 *      descending probabilities whose sum reaches top_p.
 *   4. probs = softmax(s) over what is kept (0 elsewhere).
 * temperature 0 gives the greedy one-hot. Logits may be -inf (masked) but not
 * NaN or +inf, and not all -inf; s must stay finite where logits are.
 */
// logits: [V] -> probs: [V]
moex_status moex_sampling_probs(const float *logits, int64_t V, const moex_sampling *params, float *probs);

/**
 * Draw a token: probs from moex_sampling_probs, then one uniform u from rng
 * and the first token (in index order) whose running sum of probs exceeds
 * u * sum(probs). Greedy (temperature 0) does not advance rng. Allocates
 * O(V) scratch for the call.
 */
// logits: [V] -> *token
moex_status moex_sample(const float *logits, int64_t V, const moex_sampling *params, moex_rng *rng,
                        int64_t *token);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_MODEL_DECODER_H */
