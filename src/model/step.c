/* step.c — one forward step of the decoder over several sequences:
 *   tokens [T] -> embed -> L x (attention with KV cache, MoE or dense MLP) -> norm -> lm_head
 * Only each sequence's last new token gets logits. */
#include "model/model_internal.h"
#include <math.h>
#include <stdlib.h>

// bf16 compute: every activation is rounded to bf16 where the peer stores one.
static void round_act(const moex_model *m, float *x, int64_t n) {
    if (m->opt.dtype != MOEX_BF16) return;
    for (int64_t i = 0; i < n; i++) x[i] = moex_bf16_to_f32(moex_f32_to_bf16(x[i]));
}

// Rotary cos/sin for the step's positions (qwen3_vl_moe: multimodal sections; for
// text the three position ids are equal).
static moex_status rope_tables(moex_model *m, int64_t T) {
    const moex_config *c = &m->cfg;
    if (c->rope.n_mrope_section == 3) {
        int64_t sec[3] = {c->rope.mrope_section[0], c->rope.mrope_section[1], c->rope.mrope_section[2]};
        return moex_mrope_cos_sin(m->inv_freq, c->head_dim, sec, m->positions, m->positions, m->positions, T, m->cos,
                                  m->sin);
    }
    return moex_rope_cos_sin(m->inv_freq, c->head_dim, m->positions, T, m->cos, m->sin);
}

// x [T, H] += attention(rmsnorm(x)) for layer L.
static moex_status attention_block(moex_model *m, const model_layer *ly, int64_t L, const moex_attn_seq *seqs,
                                   int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    const int64_t H = c->hidden_size, d = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int th = m->ctx->options.num_threads;
    moex_status st = moex_rmsnorm(m->x, T, H, ly->in_norm.data, ly->in_norm.dtype, c->rms_norm_eps, m->h);
    round_act(m, m->h, T * H);
    if (st || (st = moex_linear(&ly->q, m->h, T, m->q, th)) || (st = moex_linear(&ly->k, m->h, T, m->k, th)) ||
        (st = moex_linear(&ly->v, m->h, T, m->v, th)))
        return st;
    round_act(m, m->q, T * nh * d);
    round_act(m, m->k, T * nkv * d);
    round_act(m, m->v, T * nkv * d);
    if (ly->q_norm.data) {
        if ((st = moex_rmsnorm_heads(m->q, T, nh, d, ly->q_norm.data, ly->q_norm.dtype, c->rms_norm_eps, m->q)) ||
            (st = moex_rmsnorm_heads(m->k, T, nkv, d, ly->k_norm.data, ly->k_norm.dtype, c->rms_norm_eps, m->k)))
            return st;
    }
    if ((st = moex_rope_apply(m->q, T, nh, d, m->cos, m->sin)) || (st = moex_rope_apply(m->k, T, nkv, d, m->cos, m->sin)))
        return st;
    round_act(m, m->q, T * nh * d);
    round_act(m, m->k, T * nkv * d);
    if ((st = moex_attention_forward_batch(m->cache, L, seqs, nseq, nh, m->q, m->k, m->v, m->attn, th))) return st;
    round_act(m, m->attn, T * nh * d);
    if ((st = moex_linear(&ly->o, m->attn, T, m->tmp, th))) return st;
    round_act(m, m->tmp, T * H);
    for (int64_t i = 0; i < T * H; i++) m->x[i] += m->tmp[i];
    round_act(m, m->x, T * H);
    return MOEX_OK;
}

// mlp [T, H] = experts(h) (+ the shared expert) for an MoE layer.
static moex_status moe_block(moex_model *m, const model_layer *ly, int64_t T) {
    const moex_config *c = &m->cfg;
    const int64_t H = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const int th = m->ctx->options.num_threads;
    moex_status st = moex_linear(&ly->router, m->h, T, m->router_logits, th);
    if (st) return st;
    round_act(m, m->router_logits, T * E);
    const int bf16 = m->opt.dtype == MOEX_BF16;
    moex_tensor logits, ids, w, hidden, out;
    int64_t ls[2] = {T, E}, ks[2] = {T, k}, hs[2] = {T, H};
    moex_tensor_init(&logits, m->router_logits, MOEX_F32, 2, ls);
    moex_tensor_init(&ids, m->route_ids, MOEX_I32, 2, ks);
    moex_tensor_init(&w, m->route_w, MOEX_F32, 2, ks);
    if (bf16) moex_convert(m->h, MOEX_F32, m->h16, MOEX_BF16, (size_t)(T * H));
    moex_tensor_init(&hidden, bf16 ? (void *)m->h16 : (void *)m->h, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs);
    moex_tensor_init(&out, bf16 ? (void *)m->out16 : (void *)m->mlp, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs);
    if ((st = moex_route(&m->router, &logits, &ids, &w))) return st;
    round_act(m, m->route_w, T * k);
    if ((st = moex_experts_forward(m->ctx, ly->experts, m->map.names[m->map_entry], &hidden, &ids, &w, &out))) return st;
    if (bf16) moex_convert(m->out16, MOEX_BF16, m->mlp, MOEX_F32, (size_t)(T * H));
    if (ly->has_shared) {
        if ((st = moex_shared_expert(&ly->shared, &ly->shared_gate, m->h, T, m->tmp, th))) return st;
        round_act(m, m->tmp, T * H);
        for (int64_t i = 0; i < T * H; i++) m->mlp[i] += m->tmp[i];
        round_act(m, m->mlp, T * H);
    }
    return MOEX_OK;
}

moex_status model_step_inputs(const moex_model *m, const model_step_seq *seqs, int64_t nseq, moex_attn_seq *attn,
                              int64_t *total, int64_t **tokens) {
    const moex_config *c = &m->cfg;
    int64_t T = 0;
    *total = 0;
    *tokens = NULL;
    for (int64_t s = 0; s < nseq; s++) {
        if (seqs[s].past + seqs[s].n_new > m->opt.max_seq)
            return moex_fail(MOEX_ERR_WORKSPACE, "sequence %lld would hold %lld tokens; the model was loaded with max_seq = %lld",
                             (long long)s, (long long)(seqs[s].past + seqs[s].n_new), (long long)m->opt.max_seq);
        if (T + seqs[s].n_new > m->opt.max_tokens)
            return moex_fail(MOEX_ERR_WORKSPACE, "this step has more than max_tokens = %lld tokens",
                             (long long)m->opt.max_tokens);
        for (int64_t i = 0; i < seqs[s].n_new; i++) {
            int64_t tok = seqs[s].tokens[i];
            if (tok < 0 || tok >= c->vocab_size)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "token %lld of prompt %lld is %lld, outside [0, %lld)",
                                 (long long)i, (long long)s, (long long)tok, (long long)c->vocab_size);
        }
        attn[s] = (moex_attn_seq){seqs[s].seq, seqs[s].n_new, seqs[s].past};
        T += seqs[s].n_new;
    }
    int64_t *tok = malloc((size_t)(T > 0 ? T : 1) * sizeof *tok);
    if (!tok) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t s = 0, t = 0; s < nseq; s++)
        for (int64_t i = 0; i < seqs[s].n_new; i++) tok[t++] = seqs[s].tokens[i];
    *total = T;
    *tokens = tok;
    return MOEX_OK;
}

moex_status moex_model_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits) {
    const moex_config *c = &m->cfg;
    const int64_t H = c->hidden_size;
    const int th = m->ctx->options.num_threads;
    int64_t T = 0, *tok = NULL;
    moex_attn_seq attn[nseq > 0 ? nseq : 1];
    moex_status st = model_step_inputs(m, seqs, nseq, attn, &T, &tok);
    if (st) return st;
    for (int64_t s = 0, t = 0; s < nseq; s++)
        for (int64_t i = 0; i < seqs[s].n_new; i++) m->positions[t++] = seqs[s].past + i;
    st = moex_embedding(m->embed, m->embed_dtype, c->vocab_size, H, tok, T, m->x);
    free(tok);
    round_act(m, m->x, T * H);
    if (st || (st = rope_tables(m, T))) return st;
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        if ((st = attention_block(m, ly, L, attn, nseq, T))) return st;
        if ((st = moex_rmsnorm(m->x, T, H, ly->post_norm.data, ly->post_norm.dtype, c->rms_norm_eps, m->h))) return st;
        round_act(m, m->h, T * H);
        st = ly->is_moe ? moe_block(m, ly, T) : moex_gated_mlp(&ly->dense, m->h, T, m->mlp, th);
        if (st) return st;
        round_act(m, m->mlp, T * H);
        for (int64_t i = 0; i < T * H; i++) m->x[i] += m->mlp[i];
        round_act(m, m->x, T * H);
    }
    // the last new token of each sequence -> final norm -> logits
    for (int64_t s = 0, t = 0; s < nseq; s++) {
        t += seqs[s].n_new;
        memcpy(m->h + s * H, m->x + (t - 1) * H, sizeof(float) * (size_t)H);
    }
    if ((st = moex_rmsnorm(m->h, nseq, H, m->final_norm.data, m->final_norm.dtype, c->rms_norm_eps, m->tmp))) return st;
    round_act(m, m->tmp, nseq * H);
    if ((st = moex_linear(&m->lm_head, m->tmp, nseq, logits, th))) return st;
    round_act(m, logits, nseq * c->vocab_size);
    return MOEX_OK;
}
