/* ops_cuda.c — the decoder's op table on a CUDA device (ops.h): the moex_cuda_* calls of
 * decoder/cuda/decoder_api.h on the environment's stream, cuBLAS handle and KV cache. Every op
 * only queues work; copy_in and copy_out are the only ones that wait. Compiled only with
 * MOEX_HAVE_CUDA. */
#include "decoder/ops.h"

#if MOEX_HAVE_CUDA

#include "decoder/cuda/decoder_api.h"

static const moex_device host_dev = {MOEX_DEVICE_CPU, 0};

static moex_status cu_copy_in(const moex_decoder_env *e, void *dst, const void *src, size_t bytes) {
    return bytes ? moex_memcpy(dst, e->device, src, host_dev, bytes) : MOEX_OK;
}

static moex_status cu_copy_out(const moex_decoder_env *e, void *dst, const void *src, size_t bytes) {
    return bytes ? moex_memcpy(dst, host_dev, src, e->device, bytes) : MOEX_OK;
}

static moex_status cu_embedding(const moex_decoder_env *e, const void *table, moex_dtype dtype, int64_t V, int64_t H,
                                const int64_t *ids, int64_t T, float *out) {
    return moex_cuda_embedding(table, dtype, V, H, ids, T, out, e->flags, e->stream);
}

static moex_status cu_positions(const moex_decoder_env *e, const moex_attn_seq *seqs, int64_t nseq, int64_t total,
                                int64_t *positions) {
    return moex_cuda_positions(seqs, nseq, total, positions, e->stream);
}

static moex_status cu_rope_cos_sin(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                   const int64_t *positions, int64_t T, float *cos_out, float *sin_out) {
    return moex_cuda_rope_cos_sin(inv_freq, head_dim, positions, T, cos_out, sin_out, e->stream);
}

static moex_status cu_mrope_cos_sin(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                    const int64_t section[3], const int64_t *pos_t, const int64_t *pos_h,
                                    const int64_t *pos_w, int64_t T, float *cos_out, float *sin_out) {
    return moex_cuda_mrope_cos_sin(inv_freq, head_dim, section, pos_t, pos_h, pos_w, T, cos_out, sin_out, e->stream);
}

static moex_status cu_rmsnorm(const moex_decoder_env *e, const float *x, int64_t rows, int64_t n, const void *weight,
                              moex_dtype wdtype, double eps, float *y) {
    return moex_cuda_rmsnorm(x, rows, n, weight, wdtype, eps, y, e->stream);
}

static moex_status cu_rmsnorm_heads(const moex_decoder_env *e, const float *x, int64_t T, int64_t heads,
                                    int64_t head_dim, const void *weight, moex_dtype wdtype, double eps, float *y) {
    return moex_cuda_rmsnorm_heads(x, T, heads, head_dim, weight, wdtype, eps, y, e->stream);
}

static moex_status cu_rope_apply(const moex_decoder_env *e, float *x, int64_t T, int64_t heads, int64_t head_dim,
                                 int64_t rotary_dim, const float *cos_in, const float *sin_in) {
    return moex_cuda_rope_apply(x, T, heads, head_dim, rotary_dim, cos_in, sin_in, e->stream);
}

static moex_status cu_linear(const moex_decoder_env *e, const moex_linear_w *w, const float *x, int64_t T, float *y) {
    return moex_cuda_linear((const moex_cuda_blas *)e->blas, w, x, T, y, e->x16, e->stream);
}

// A step the host knows (not captured) with a sequence of ATTENTION_GEMM_ROWS new tokens or more (a
// prefill) takes the attention's GEMM path; decode steps the kernel, whose block per (row, head) splits
// the positions.
#define ATTENTION_GEMM_ROWS 16

static int attention_gemm_pays(const moex_decoder_env *e, const moex_attn_seq *host_seqs, int64_t nseq) {
    int gemm = 0;
    for (int64_t i = 0; host_seqs && e->scores && i < nseq; i++) gemm |= host_seqs[i].tokens >= ATTENTION_GEMM_ROWS;
    return gemm;
}

static moex_status cu_attention(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                                const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                                const float *q, const float *k, const float *v, float *out, int64_t window,
                                const float *sinks) {
    if (attention_gemm_pays(e, host_seqs, nseq))
        return moex_cuda_attention_gemm((const moex_cuda_blas *)e->blas, (const moex_cuda_kv_cache *)e->kv, layer, seqs,
                                        host_seqs, nseq, total, heads, q, k, v, out, window, sinks, e->scores,
                                        e->scores_floats, e->flags, e->stream);
    return moex_cuda_attention((const moex_cuda_kv_cache *)e->kv, layer, seqs, nseq, total, heads, q, k, v, out, window,
                               sinks, e->flags, e->stream);
}

static moex_status cu_route(const moex_decoder_env *e, const moex_router_desc *desc, const float *logits, int64_t T,
                            int32_t *ids, float *weights) {
    /* the grouped sigmoid router's correction bias: a device f32 [E] (the layer's, step.c) */
    const float *bias = desc->kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK ? (const float *)desc->correction_bias.data : NULL;
    return moex_cuda_route(desc, bias, logits, T, ids, weights, e->stream);
}

// y [T, H] = down(act(gate(x)) * up(x)) (moex_gated_mlp) in gate, up [T, I]
static moex_status cu_mlp(const moex_decoder_env *e, const moex_mlp_w *w, const float *x, int64_t T, float *y,
                          float *gate, float *up) {
    const int64_t I = w->gate.out_features;
    moex_status st = cu_linear(e, &w->gate, x, T, gate);
    if (!st) st = cu_linear(e, &w->up, x, T, up);
    if (!st) st = moex_cuda_gated_act(w->act, gate, up, I, T, I, gate, e->stream);
    if (!st) st = cu_linear(e, &w->down, gate, T, y);
    return st;
}

static moex_status cu_scale_rows_sigmoid(const moex_decoder_env *e, const float *gate_logit, float *y, int64_t T,
                                         int64_t H) {
    return moex_cuda_scale_rows_sigmoid(gate_logit, y, T, H, e->stream);
}

static moex_status cu_add(const moex_decoder_env *e, const float *a, const float *b, float *out, int64_t n) {
    return moex_cuda_add(a, b, out, n, e->stream);
}

static moex_status cu_round_bf16(const moex_decoder_env *e, float *x, int64_t n) {
    return moex_cuda_round_bf16(x, n, e->stream);
}

static moex_status cu_convert(const moex_decoder_env *e, const void *src, moex_dtype sdt, void *dst, moex_dtype ddt,
                              int64_t n) {
    return moex_cuda_convert(src, sdt, dst, ddt, n, e->stream);
}

static moex_status cu_gather_last_rows(const moex_decoder_env *e, const float *x, int64_t H, const moex_attn_seq *seqs,
                                       int64_t nseq, float *out) {
    return moex_cuda_gather_last_rows(x, H, seqs, nseq, out, e->stream);
}

static moex_status cu_argmax(const moex_decoder_env *e, const float *logits, int64_t rows, int64_t V, int64_t *tokens) {
    return moex_cuda_argmax(logits, rows, V, tokens, e->stream);
}

static moex_status cu_kv_reset(const moex_decoder_env *e, int64_t seq) {
    return moex_cuda_kv_cache_reset((const moex_cuda_kv_cache *)e->kv, seq, e->stream);
}

static moex_status cu_copy_rows(const moex_decoder_env *e, float *dst, int64_t dst_ld, const float *src, int64_t src_ld,
                                int64_t rows, int64_t n) {
    return moex_cuda_copy_rows(dst, dst_ld, src, src_ld, rows, n, e->stream);
}

static moex_status cu_scale(const moex_decoder_env *e, float *x, int64_t n, float s) {
    return moex_cuda_scale(x, n, s, e->stream);
}

static moex_status cu_rope_apply_interleaved(const moex_decoder_env *e, float *x, int64_t T, int64_t heads,
                                             int64_t head_dim, const float *cos_in, const float *sin_in) {
    return moex_cuda_rope_apply_interleaved(x, T, heads, head_dim, cos_in, sin_in, e->stream);
}

static moex_status cu_latent_attention(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                                       const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                                       float *q, const float *kv, int64_t value_dim, float scale, float *out) {
    if (attention_gemm_pays(e, host_seqs, nseq))
        return moex_cuda_attention_latent_gemm((const moex_cuda_blas *)e->blas, (const moex_cuda_kv_cache *)e->kv,
                                               layer, seqs, host_seqs, nseq, total, heads, q, kv, value_dim, scale,
                                               out, e->bf16_inputs, e->scores, e->scores_floats, e->flags, e->stream);
    return moex_cuda_attention_latent((const moex_cuda_kv_cache *)e->kv, layer, seqs, nseq, total, heads, q, kv,
                                      value_dim, scale, out, e->bf16_inputs, e->flags, e->stream);
}

static moex_status cu_mla_absorb(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                 int64_t vd, const float *q, int64_t q_stride, int64_t T, float *out,
                                 int64_t out_stride) {
    return moex_cuda_mla_absorb((const moex_cuda_blas *)e->blas, kv_b, heads, nope, vd, q, q_stride, T, out, out_stride,
                                e->x16, e->stream);
}

static moex_status cu_mla_values(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                 int64_t vd, const float *lat, int64_t T, float *out) {
    return moex_cuda_mla_values((const moex_cuda_blas *)e->blas, kv_b, heads, nope, vd, lat, T, out, e->x16, e->stream);
}

/* bf16 weights: the products convert their f32 input to bf16 first (round to nearest even, as
 * round_bf16), so a bf16 value is what they multiply either way. */
/* bf16 compute: both latent paths round q (moex_cuda_attention_latent's round_q, the GEMM's
 * bf16_inputs). */
static int cu_latent_rounds_q(const moex_decoder_env *e) { return e->bf16_inputs; }

static int cu_rounds_input_bf16(const moex_decoder_env *e, const moex_linear_w *w) {
    (void)e;
    return w && w->dtype == MOEX_BF16;
}

const moex_decoder_ops moex_decoder_ops_cuda = {
    "cuda",
    cu_copy_in,
    cu_copy_out,
    cu_embedding,
    cu_positions,
    cu_rope_cos_sin,
    cu_mrope_cos_sin,
    cu_rmsnorm,
    cu_rmsnorm_heads,
    cu_rope_apply,
    cu_linear,
    cu_attention,
    cu_route,
    cu_mlp,
    cu_scale_rows_sigmoid,
    cu_add,
    cu_round_bf16,
    cu_convert,
    cu_gather_last_rows,
    cu_argmax,
    cu_kv_reset,
    cu_copy_rows,
    cu_scale,
    cu_rope_apply_interleaved,
    cu_latent_attention,
    cu_mla_absorb,
    cu_mla_values,
    cu_rounds_input_bf16,
    cu_latent_rounds_q,
};

#else
typedef int moex_decoder_ops_cuda_unused; /* ISO C: a translation unit is not empty */
#endif
