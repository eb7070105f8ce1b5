/* ops_cpu.c — the decoder's op table on the CPU (ops.h): the building blocks of decoder.h and
 * moex_route, in host memory. Each op runs at once. */
#include "decoder/ops.h"
#include <string.h>

static moex_status cpu_copy(const moex_decoder_env *e, void *dst, const void *src, size_t bytes) {
    (void)e;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return MOEX_OK;
}

static moex_status cpu_embedding(const moex_decoder_env *e, const void *table, moex_dtype dtype, int64_t V, int64_t H,
                                 const int64_t *ids, int64_t T, float *out) {
    (void)e;
    return moex_embedding(table, dtype, V, H, ids, T, out);
}

// seqs: [nseq] -> positions: [total]
static moex_status cpu_positions(const moex_decoder_env *e, const moex_attn_seq *seqs, int64_t nseq, int64_t total,
                                 int64_t *positions) {
    (void)e;
    int64_t t = 0;
    for (int64_t s = 0; s < nseq; s++)
        for (int64_t i = 0; i < seqs[s].tokens && t < total; i++) positions[t++] = seqs[s].past + i;
    for (; t < total; t++) positions[t] = 0;
    return MOEX_OK;
}

static moex_status cpu_rope_cos_sin(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                    const int64_t *positions, int64_t T, float *cos_out, float *sin_out) {
    (void)e;
    return moex_rope_cos_sin(inv_freq, head_dim, positions, T, cos_out, sin_out);
}

static moex_status cpu_mrope_cos_sin(const moex_decoder_env *e, const float *inv_freq, int64_t head_dim,
                                     const int64_t section[3], const int64_t *pos_t, const int64_t *pos_h,
                                     const int64_t *pos_w, int64_t T, float *cos_out, float *sin_out) {
    (void)e;
    return moex_mrope_cos_sin(inv_freq, head_dim, section, pos_t, pos_h, pos_w, T, cos_out, sin_out);
}

static moex_status cpu_rmsnorm(const moex_decoder_env *e, const float *x, int64_t rows, int64_t n, const void *weight,
                               moex_dtype wdtype, double eps, float *y) {
    (void)e;
    return moex_rmsnorm(x, rows, n, weight, wdtype, eps, y);
}

static moex_status cpu_rmsnorm_heads(const moex_decoder_env *e, const float *x, int64_t T, int64_t heads,
                                     int64_t head_dim, const void *weight, moex_dtype wdtype, double eps, float *y) {
    (void)e;
    return moex_rmsnorm_heads(x, T, heads, head_dim, weight, wdtype, eps, y);
}

static moex_status cpu_rope_apply(const moex_decoder_env *e, float *x, int64_t T, int64_t heads, int64_t head_dim,
                                  int64_t rotary_dim, const float *cos_in, const float *sin_in) {
    (void)e;
    return moex_rope_apply_partial(x, T, heads, head_dim, rotary_dim, cos_in, sin_in);
}

static moex_status cpu_linear(const moex_decoder_env *e, const moex_linear_w *w, const float *x, int64_t T, float *y) {
    return moex_linear(w, x, T, y, e->threads);
}

static moex_status cpu_attention(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                                 const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                                 const float *q, const float *k, const float *v, float *out, int64_t window,
                                 const float *sinks) {
    (void)host_seqs, (void)total; /* seqs are host memory on the CPU; they give the total */
    return moex_attention_forward_sinks((moex_kv_cache *)e->kv, layer, seqs, nseq, heads, q, k, v, out, e->threads,
                                        window, sinks);
}

// logits: [T, E] -> ids: [T, k], weights: [T, k]
static moex_status cpu_route(const moex_decoder_env *e, const moex_router_desc *desc, const float *logits, int64_t T,
                             int32_t *ids, float *weights) {
    (void)e;
    moex_tensor lt, it, wt;
    const int64_t ls[2] = {T, desc->num_experts}, ks[2] = {T, desc->top_k};
    moex_status st = moex_tensor_init(&lt, (void *)logits, MOEX_F32, 2, ls);
    if (!st) st = moex_tensor_init(&it, ids, MOEX_I32, 2, ks);
    if (!st) st = moex_tensor_init(&wt, weights, MOEX_F32, 2, ks);
    return st ? st : moex_route(desc, &lt, &it, &wt);
}

static moex_status cpu_mlp(const moex_decoder_env *e, const moex_mlp_w *w, const float *x, int64_t T, float *y,
                           float *gate, float *up) {
    (void)gate, (void)up;
    return moex_gated_mlp(w, x, T, y, e->threads);
}

// gate_logit: [T], y: [T, H] in place (moex_shared_expert's last step)
static moex_status cpu_scale_rows_sigmoid(const moex_decoder_env *e, const float *gate_logit, float *y, int64_t T,
                                          int64_t H) {
    (void)e;
    moex_scale_rows_sigmoid(gate_logit, y, T, H);
    return MOEX_OK;
}

static moex_status cpu_add(const moex_decoder_env *e, const float *a, const float *b, float *out, int64_t n) {
    (void)e;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return MOEX_OK;
}

static moex_status cpu_round_bf16(const moex_decoder_env *e, float *x, int64_t n) {
    (void)e;
    for (int64_t i = 0; i < n; i++) x[i] = moex_bf16_to_f32(moex_f32_to_bf16(x[i]));
    return MOEX_OK;
}

static moex_status cpu_convert(const moex_decoder_env *e, const void *src, moex_dtype sdt, void *dst, moex_dtype ddt,
                               int64_t n) {
    (void)e;
    return moex_convert(src, sdt, dst, ddt, (size_t)n);
}

// x: [sum T_i, H], seqs: [nseq] -> out: [nseq, H]
static moex_status cpu_gather_last_rows(const moex_decoder_env *e, const float *x, int64_t H, const moex_attn_seq *seqs,
                                        int64_t nseq, float *out) {
    (void)e;
    for (int64_t s = 0, t = 0; s < nseq; s++) {
        const int64_t n = seqs[s].tokens > 0 ? seqs[s].tokens : 0;
        t += n;
        if (n > 0)
            memmove(out + s * H, x + (t - 1) * H, sizeof(float) * (size_t)H);
        else
            memset(out + s * H, 0, sizeof(float) * (size_t)H);
    }
    return MOEX_OK;
}

// logits: [rows, V] -> tokens: [rows]
static moex_status cpu_argmax(const moex_decoder_env *e, const float *logits, int64_t rows, int64_t V, int64_t *tokens) {
    (void)e;
    for (int64_t r = 0; r < rows; r++) {
        tokens[r] = moex_argmax_row(logits + r * V, V);
    }
    return MOEX_OK;
}

static moex_status cpu_kv_reset(const moex_decoder_env *e, int64_t seq) { return moex_kv_cache_reset((moex_kv_cache *)e->kv, seq); }

static moex_status cpu_copy_rows(const moex_decoder_env *e, float *dst, int64_t dst_ld, const float *src,
                                 int64_t src_ld, int64_t rows, int64_t n) {
    (void)e;
    if (rows < 0 || n < 0 || dst_ld < n || src_ld < 0 || (src_ld && src_ld < n))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "copy_rows: rows = %lld, n = %lld, dst_ld = %lld, src_ld = %lld",
                         (long long)rows, (long long)n, (long long)dst_ld, (long long)src_ld);
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, (size_t)n * sizeof(float));
    return MOEX_OK;
}

static moex_status cpu_latent_attention(const moex_decoder_env *e, int64_t layer, const moex_attn_seq *seqs,
                                        const moex_attn_seq *host_seqs, int64_t nseq, int64_t total, int64_t heads,
                                        float *q, const float *kv, int64_t value_dim, float scale, float *out) {
    (void)host_seqs, (void)total; /* seqs are host memory on the CPU; they give the total */
    return moex_attention_forward_latent((moex_kv_cache *)e->kv, layer, seqs, nseq, heads, q, kv, value_dim, scale, out,
                                         e->threads);
}

static moex_status cpu_mla_absorb(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                  int64_t vd, const float *q, int64_t q_stride, int64_t T, float *out,
                                  int64_t out_stride) {
    return moex_mla_absorb(kv_b, heads, nope, vd, q, q_stride, T, out, out_stride, e->threads);
}

static moex_status cpu_mla_values(const moex_decoder_env *e, const moex_linear_w *kv_b, int64_t heads, int64_t nope,
                                  int64_t vd, const float *lat, int64_t T, float *out) {
    return moex_mla_values(kv_b, heads, nope, vd, lat, T, out, e->threads);
}

/* The CPU's products read their f32 inputs as they are. */
static int cpu_rounds_input_bf16(const moex_decoder_env *e, const moex_linear_w *w) {
    (void)e, (void)w;
    return 0;
}

static int cpu_latent_rounds_q(const moex_decoder_env *e) {
    (void)e;
    return 0;
}

static moex_status cpu_scale(const moex_decoder_env *e, float *x, int64_t n, float s) {
    (void)e;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return MOEX_OK;
}

static moex_status cpu_rope_apply_interleaved(const moex_decoder_env *e, float *x, int64_t T, int64_t heads,
                                              int64_t head_dim, const float *cos_in, const float *sin_in) {
    (void)e;
    return moex_rope_apply_interleaved(x, T, heads, head_dim, cos_in, sin_in);
}

const moex_decoder_ops moex_decoder_ops_cpu = {
    "cpu",
    cpu_copy,
    cpu_copy,
    cpu_embedding,
    cpu_positions,
    cpu_rope_cos_sin,
    cpu_mrope_cos_sin,
    cpu_rmsnorm,
    cpu_rmsnorm_heads,
    cpu_rope_apply,
    cpu_linear,
    cpu_attention,
    cpu_route,
    cpu_mlp,
    cpu_scale_rows_sigmoid,
    cpu_add,
    cpu_round_bf16,
    cpu_convert,
    cpu_gather_last_rows,
    cpu_argmax,
    cpu_kv_reset,
    cpu_copy_rows,
    cpu_scale,
    cpu_rope_apply_interleaved,
    cpu_latent_attention,
    cpu_mla_absorb,
    cpu_mla_values,
    cpu_rounds_input_bf16,
    cpu_latent_rounds_q,
};
