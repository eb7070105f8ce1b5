/* step.c — one forward step of the decoder over several sequences, written once over the op
 * table of m->run.env (decoder/ops.h): the CPU's building blocks, or the device's, which only
 * queue work on the context's stream:
 *   ids -> embed -> L x (attention with the KV cache, MoE or dense MLP)
 *       -> last rows -> norm -> lm_head (-> argmax)
 * Only each sequence's last new token gets logits. The step's inputs (ids, sequence
 * descriptors) are read from buffers of the table's memory, so that on CUDA a decode step can
 * be captured once per batch size and replayed; the one synchronisation is before the results
 * are copied back. */
#include "model/model_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// bf16 compute: every activation is rounded to bf16 where the peer stores one.
static moex_status R(const moex_model *m, float *x, int64_t n) {
    const moex_decoder_env *e = &m->run.env;
    return m->opt.dtype == MOEX_BF16 ? e->ops->round_bf16(e, x, n) : MOEX_OK;
}

// R for a buffer that only products by w read: left out where they round their input themselves
// (the same values: rounds_input_bf16), which saves a pass over it (DeepSeek-V3's attended latents
// are [T, heads, kv_lora_rank]).
static moex_status R_before(const moex_model *m, const moex_linear_w *w, float *x, int64_t n) {
    const moex_decoder_env *e = &m->run.env;
    return e->ops->rounds_input_bf16(e, w) ? MOEX_OK : R(m, x, n);
}

size_t model_mla_scratch(const moex_config *c, int64_t T, float *base, model_mla_bufs *b) {
    const int64_t nh = c->num_attention_heads, qd = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int64_t kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, lw = kvl + rope;
    const int64_t sizes[8] = {T * nh * qd, T * (c->q_lora_rank > 0 ? c->q_lora_rank : 1), T * lw, T * kvl, T * rope,
                              T * nh * rope, T * nh * lw, T * nh * kvl};
    float **dst[8] = {&b->q, &b->a, &b->kva, &b->c, &b->kr, &b->qr, &b->ql, &b->ol};
    size_t n = 0;
    for (int i = 0; i < 8; i++) {
        if (base) *dst[i] = base + n;
        n += (size_t)sizes[i];
    }
    return n;
}

// deepseek_v3's latent attention (transformers' DeepseekV3Attention) in the absorbed form: h [T, H]
// -> attn [T, heads * v_head_dim]. The cache keeps each token's latent row [norm(c), rotated k_rot]
// (kv_lora_rank + rope values a layer). kv_b's key rows are folded into the query (ql = [W_UK^T q_nope,
// q_rot]), so that each head attends over the latent rows themselves; the attended latents go
// through kv_b's value rows. The same sums as transformers' expanded keys and values, in another order.
static moex_status mla_attention(moex_model *m, const model_layer_w *ly, int64_t L, int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    const moex_decoder_ops *op = e->ops;
    const int64_t nh = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    const int64_t vd = c->v_head_dim, qd = nope + rope, kvl = c->kv_lora_rank, lw = kvl + rope;
    model_mla_bufs b;
    model_mla_scratch(c, T, r->mla, &b);
    moex_status st;
    if (c->q_lora_rank > 0) {
        st = op->linear(e, &ly->q_a, r->h, T, b.a);
        if (!st) st = op->rmsnorm(e, b.a, T, c->q_lora_rank, ly->q_a_norm.data, ly->q_a_norm.dtype, c->rms_norm_eps, b.a);
        if (!st) st = R(m, b.a, T * c->q_lora_rank);
        if (!st) st = op->linear(e, &ly->q_b, b.a, T, b.q);
    } else {
        st = op->linear(e, &ly->q, r->h, T, b.q);
    }
    /* q's nope part is read by mla_absorb only: rounded there where it rounds its input (then only
     * the rope part is rounded here, after its copy below) */
    const int absorb_rounds = op->rounds_input_bf16(e, &ly->kv_b);
    if (!st && !absorb_rounds) st = R(m, b.q, T * nh * qd);
    if (!st) st = op->linear(e, &ly->kv_a, r->h, T, b.kva);
    if (!st) st = R(m, b.kva, T * lw);
    if (!st) st = op->copy_rows(e, b.c, kvl, b.kva, lw, T, kvl);
    if (!st) st = op->copy_rows(e, b.kr, rope, b.kva + kvl, lw, T, rope);
    if (!st) st = op->rmsnorm(e, b.c, T, kvl, ly->kv_a_norm.data, ly->kv_a_norm.dtype, c->rms_norm_eps, b.c);
    if (!st) st = R(m, b.c, T * kvl);
    /* the rotary parts: q's last rope values of each head, and the one shared k_rot */
    if (!st) st = op->copy_rows(e, b.qr, rope, b.q + nope, qd, T * nh, rope);
    if (!st && absorb_rounds) st = R(m, b.qr, T * nh * rope);
    if (!st && c->rope_interleave) {
        st = op->rope_apply_interleaved(e, b.qr, T, nh, rope, r->cos, r->sin);
        if (!st) st = op->rope_apply_interleaved(e, b.kr, T, 1, rope, r->cos, r->sin);
    } else if (!st) {
        st = op->rope_apply(e, b.qr, T, nh, rope, rope, r->cos, r->sin);
        if (!st) st = op->rope_apply(e, b.kr, T, 1, rope, rope, r->cos, r->sin);
    }
    if (!st) st = R(m, b.qr, T * nh * rope);
    if (!st) st = R(m, b.kr, T * rope);
    /* the new latent rows [norm(c), k_rot] and the absorbed query [W_UK^T q_nope, q_rot] of each head */
    if (!st) st = op->copy_rows(e, b.kva, lw, b.c, kvl, T, kvl);
    if (!st) st = op->copy_rows(e, b.kva + kvl, lw, b.kr, rope, T, rope);
    if (!st) st = op->mla_absorb(e, &ly->kv_b, nh, nope, vd, b.q, qd, T, b.ql, lw);
    if (!st) st = op->copy_rows(e, b.ql + kvl, lw, b.qr, rope, T * nh, rope);
    if (!st && !op->latent_rounds_q(e)) st = R(m, b.ql, T * nh * lw); /* else the attention rounds q */
    /* softmax(q k^T * qk_head_dim^-0.5 * mscale^2) over the latent rows, then kv_b's value rows */
    const float scale = (float)(pow((double)qd, -0.5) * (double)m->q_scale);
    if (!st) st = op->latent_attention(e, L, r->seqs, r->host_seqs, nseq, T, nh, b.ql, b.kva, kvl, scale, b.ol);
    if (!st) st = R_before(m, &ly->kv_b, b.ol, T * nh * kvl);
    if (!st) st = op->mla_values(e, &ly->kv_b, nh, nope, vd, b.ol, T, r->attn);
    return st;
}

// The grouped-query attention of the other families: h [T, H] -> attn [T, heads * head_dim].
static moex_status gqa_attention(moex_model *m, const model_layer_w *ly, int64_t L, int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    const moex_decoder_ops *op = e->ops;
    const int64_t d = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    moex_status st = op->linear(e, &ly->q, r->h, T, r->q);
    if (!st) st = op->linear(e, &ly->k, r->h, T, r->k);
    if (!st) st = op->linear(e, &ly->v, r->h, T, r->v);
    if (!st) st = R(m, r->q, T * nh * d);
    if (!st) st = R(m, r->k, T * nkv * d);
    if (!st) st = R(m, r->v, T * nkv * d);
    if (!st && ly->q_norm.data && m->qk_norm_rows) { /* olmoe: over each token's whole q and k rows */
        st = op->rmsnorm(e, r->q, T, nh * d, ly->q_norm.data, ly->q_norm.dtype, c->rms_norm_eps, r->q);
        if (!st) st = op->rmsnorm(e, r->k, T, nkv * d, ly->k_norm.data, ly->k_norm.dtype, c->rms_norm_eps, r->k);
    } else if (!st && ly->q_norm.data) {
        st = op->rmsnorm_heads(e, r->q, T, nh, d, ly->q_norm.data, ly->q_norm.dtype, c->rms_norm_eps, r->q);
        if (!st) st = op->rmsnorm_heads(e, r->k, T, nkv, d, ly->k_norm.data, ly->k_norm.dtype, c->rms_norm_eps, r->k);
    }
    if (!st) st = op->rope_apply(e, r->q, T, nh, d, m->rotary_dim, r->cos, r->sin);
    if (!st) st = op->rope_apply(e, r->k, T, nkv, d, m->rotary_dim, r->cos, r->sin);
    if (!st) st = R(m, r->q, T * nh * d);
    if (!st) st = R(m, r->k, T * nkv * d);
    if (!st)
        st = op->attention(e, L, r->seqs, r->host_seqs, nseq, T, nh, r->q, r->k, r->v, r->attn, ly->window, ly->sinks);
    return st;
}

// x [T, H] += o_proj(attention(rmsnorm(x))) for layer L.
static moex_status attention_block(moex_model *m, const model_layer_w *ly, int64_t L, int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    const moex_decoder_ops *op = e->ops;
    const int64_t H = c->hidden_size, nh = c->num_attention_heads;
    const int64_t width = nh * (c->kv_lora_rank ? c->v_head_dim : c->head_dim); /* o_proj's input */
    moex_status st = op->rmsnorm(e, r->x, T, H, ly->in_norm.data, ly->in_norm.dtype, c->rms_norm_eps, r->h);
    if (!st) st = R(m, r->h, T * H);
    if (!st) st = c->kv_lora_rank ? mla_attention(m, ly, L, nseq, T) : gqa_attention(m, ly, L, nseq, T);
    if (!st) st = R_before(m, &ly->o, r->attn, T * width);
    if (!st) st = op->linear(e, &ly->o, r->attn, T, r->tmp);
    if (!st) st = R(m, r->tmp, T * H);
    if (!st) st = op->add(e, r->x, r->tmp, r->x, T * H);
    if (!st) st = R(m, r->x, T * H);
    return st;
}

// mlp [T, H] = experts(h) (+ the shared expert with its sigmoid gate) for an MoE layer.
static moex_status moe_block(moex_model *m, const model_layer *ly, const model_layer_w *lw, int64_t T) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    const moex_decoder_ops *op = e->ops;
    const int64_t H = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const int bf16 = m->opt.dtype == MOEX_BF16;
    moex_status st = op->linear(e, &lw->router, r->h, T, r->router_logits);
    if (!st) st = R(m, r->router_logits, T * E);
    moex_router_desc router = m->router; /* with the layer's correction bias (glm4_moe, deepseek_v3) */
    if (lw->router_bias) {
        int64_t bs[1] = {E};
        if (!st) st = moex_tensor_init(&router.correction_bias, (void *)lw->router_bias, MOEX_F32, 1, bs);
        router.correction_bias.device = e->device;
    }
    if (!st) st = op->route(e, &router, r->router_logits, T, r->route_ids, r->route_w);
    if (!st) st = R(m, r->route_w, T * k);
    if (!st && bf16) st = op->convert(e, r->h, MOEX_F32, r->h16, MOEX_BF16, T * H);
    if (st) return st;
    /* the experts: the public call, on tensors of the table's memory */
    moex_tensor ids, w, hidden, out;
    int64_t ks[2] = {T, k}, hs[2] = {T, H};
    if ((st = moex_tensor_init(&ids, r->route_ids, MOEX_I32, 2, ks)) ||
        (st = moex_tensor_init(&w, r->route_w, MOEX_F32, 2, ks)) ||
        (st = moex_tensor_init(&hidden, bf16 ? (void *)r->h16 : (void *)r->h, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)) ||
        (st = moex_tensor_init(&out, bf16 ? (void *)r->out16 : (void *)r->mlp, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)))
        return st;
    ids.device = w.device = hidden.device = out.device = e->device;
    if ((st = moex_experts_forward(m->ctx, ly->experts, m->map.names[m->map_entry], &hidden, &ids, &w, &out))) return st;
    if (bf16 && (st = op->convert(e, r->out16, MOEX_BF16, r->mlp, MOEX_F32, T * H))) return st;
    if (!ly->has_shared) return MOEX_OK;
    st = op->mlp(e, &lw->shared, r->h, T, r->tmp, r->gate, r->up);
    if (lw->shared_gate.weight) { /* qwen2_moe's sigmoid gate; glm4_moe's shared experts have none */
        if (!st) st = op->linear(e, &lw->shared_gate, r->h, T, r->gate_logit);
        if (!st) st = op->scale_rows_sigmoid(e, r->gate_logit, r->tmp, T, H);
    }
    if (!st) st = R(m, r->tmp, T * H);
    if (!st) st = op->add(e, r->mlp, r->tmp, r->mlp, T * H);
    if (!st) st = R(m, r->mlp, T * H);
    return st;
}

// The whole step: reads run.tokens [T] and run.seqs [nseq]; writes logits [nseq, V] and, when
// argmax is not NULL, the greedy tokens argmax [nseq].
static moex_status queue_step(moex_model *m, int64_t nseq, int64_t T, float *logits, int64_t *argmax) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    const moex_decoder_ops *op = e->ops;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    moex_status st = op->embedding(e, r->embed, r->embed_dtype, V, H, r->tokens, T, r->x);
    if (!st) st = R(m, r->x, T * H);
    if (!st) st = op->positions(e, r->seqs, nseq, T, r->positions);
    // rotary cos/sin for the step's positions (qwen3_vl_moe: multimodal sections; for text the
    // three position ids are equal)
    if (!st && c->rope.n_mrope_section == 3) {
        int64_t sec[3] = {c->rope.mrope_section[0], c->rope.mrope_section[1], c->rope.mrope_section[2]};
        st = op->mrope_cos_sin(e, r->inv_freq, c->head_dim, sec, r->positions, r->positions, r->positions, T, r->cos,
                               r->sin);
    } else if (!st) {
        st = op->rope_cos_sin(e, r->inv_freq, m->rotary_dim, r->positions, T, r->cos, r->sin);
        if (!st && m->cos_scale != 1.0f) st = op->scale(e, r->cos, T * (m->rotary_dim / 2), m->cos_scale);
        if (!st && m->cos_scale != 1.0f) st = op->scale(e, r->sin, T * (m->rotary_dim / 2), m->cos_scale);
    }
    for (int64_t L = 0; !st && L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        const model_layer_w *lw = &r->layers[L];
        st = attention_block(m, lw, L, nseq, T);
        if (!st) st = op->rmsnorm(e, r->x, T, H, lw->post_norm.data, lw->post_norm.dtype, c->rms_norm_eps, r->h);
        if (!st) st = R(m, r->h, T * H);
        if (!st) st = ly->is_moe ? moe_block(m, ly, lw, T) : op->mlp(e, &lw->dense, r->h, T, r->mlp, r->gate, r->up);
        if (!st) st = R(m, r->mlp, T * H);
        if (!st) st = op->add(e, r->x, r->mlp, r->x, T * H);
        if (!st) st = R(m, r->x, T * H);
    }
    // the last new token of each sequence -> final norm -> logits
    if (!st) st = op->gather_last_rows(e, r->x, H, r->seqs, nseq, r->last);
    if (!st) st = op->rmsnorm(e, r->last, nseq, H, r->final_norm.data, r->final_norm.dtype, c->rms_norm_eps, r->normed);
    if (!st) st = R(m, r->normed, nseq * H);
    if (!st) st = op->linear(e, &r->lm_head, r->normed, nseq, logits);
    if (!st) st = R(m, logits, nseq * V);
    if (!st && argmax) st = op->argmax(e, logits, nseq, V, argmax);
    return st;
}

// CUDA: replay the graph captured for a decode step of nseq sequences (capture it first when
// there is none, or when the experts backend changed since). Graphs exist only on the device.
static moex_status graph_step(moex_model *m, int64_t nseq, float *logits, int64_t *argmax) {
    model_gpu *g = m->gpu;
    if (!g || !g->graphs)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "a graph-captured step needs a model loaded on cuda");
    gpu_graph *gg = &g->graphs[nseq];
    const char *backend = m->map.names[m->map_entry];
    if (gg->graph && strcmp(gg->backend, backend) != 0) {
        moex_graph_free(gg->graph);
        gg->graph = NULL;
    }
    if (!gg->graph) {
        moex_status st = moex_graph_begin(m->ctx);
        if (st) return st;
        st = queue_step(m, nseq, nseq, logits, argmax);
        moex_graph *graph = NULL;
        moex_status end = moex_graph_end(m->ctx, &graph); /* always ends the capture, also after an error */
        if (st || end) {
            moex_graph_free(graph);
            return st ? st : end;
        }
        gg->graph = graph;
        snprintf(gg->backend, sizeof gg->backend, "%s", backend);
    }
    return moex_graph_launch(gg->graph, m->ctx);
}

// The host side of a step: the sizes against the load options and the token ids against the
// vocabulary checked, attn[nseq] filled, the new tokens stacked into tok [*total].
static moex_status step_inputs(const moex_model *m, const model_step_seq *seqs, int64_t nseq, moex_attn_seq *attn,
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

moex_status model_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits, int64_t *tokens,
                       int use_graph) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const moex_decoder_env *e = &r->env;
    if (nseq < 1 || nseq > m->opt.max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%lld sequences in a step; the model was loaded for 1 to max_batch = %lld",
                         (long long)nseq, (long long)m->opt.max_batch);
    if (!logits) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "a step needs a logits buffer");
    int64_t T = 0, *tok = NULL;
    moex_attn_seq attn[nseq];
    moex_status st = step_inputs(m, seqs, nseq, attn, &T, &tok);
    if (st) return st;
    // The previous step was synchronised: the buffers are free to be rewritten.
    st = e->ops->copy_in(e, r->tokens, tok, (size_t)T * sizeof *tok);
    free(tok);
    if (!st) st = e->ops->copy_in(e, r->seqs, attn, (size_t)nseq * sizeof *attn);
    if (st) return st;
    // where the table computes the results: its own buffers, or (the CPU's) the caller's
    float *lg = r->logits ? r->logits : logits;
    int64_t *am = r->argmax ? r->argmax : tokens;
    const int graph = use_graph && T == nseq;
    r->host_seqs = graph ? NULL : attn; /* a captured step reads only device memory */
    st = graph ? graph_step(m, nseq, lg, am) : queue_step(m, nseq, T, lg, am);
    r->host_seqs = NULL;
    moex_status sync = moex_context_synchronize(m->ctx); /* also after an error: nothing left in flight */
    if (st || sync) return st ? st : sync;
    if (!tokens && lg != logits &&
        (st = e->ops->copy_out(e, logits, lg, (size_t)(nseq * c->vocab_size) * sizeof(float))))
        return st;
    if (tokens && am != tokens && (st = e->ops->copy_out(e, tokens, am, (size_t)nseq * sizeof(int64_t)))) return st;
    return MOEX_OK;
}

moex_status model_step_idle(moex_model *m) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    const int bf16 = m->opt.dtype == MOEX_BF16;
    int64_t ks[2] = {0, c->num_experts_per_tok}, hs[2] = {0, c->hidden_size};
    moex_tensor ids, w, hidden, out;
    moex_status st;
    if ((st = moex_tensor_init(&ids, r->route_ids, MOEX_I32, 2, ks)) ||
        (st = moex_tensor_init(&w, r->route_w, MOEX_F32, 2, ks)) ||
        (st = moex_tensor_init(&hidden, bf16 ? (void *)r->h16 : (void *)r->h, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)) ||
        (st = moex_tensor_init(&out, bf16 ? (void *)r->out16 : (void *)r->mlp, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)))
        return st;
    ids.device = w.device = hidden.device = out.device = r->env.device; /* no rows: only the device is read */
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        if (ly->is_moe &&
            (st = moex_experts_forward(m->ctx, ly->experts, m->map.names[m->map_entry], &hidden, &ids, &w, &out)))
            return st;
    }
    return moex_context_synchronize(m->ctx);
}

moex_status model_kv_reset(moex_model *m, int64_t seq) { return m->run.env.ops->kv_reset(&m->run.env, seq); }

moex_status model_run_cpu(moex_model *m) {
    const moex_config *c = &m->cfg;
    model_run *r = &m->run;
    m->host_layers = calloc((size_t)c->num_hidden_layers, sizeof *m->host_layers);
    if (!m->host_layers) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the layer table");
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        m->host_layers[L] = (model_layer_w){ly->in_norm, ly->post_norm, ly->q_norm,     ly->k_norm,
                                            ly->q,       ly->k,         ly->v,          ly->o,
                                            ly->router,  ly->shared_gate, ly->dense,    ly->shared,
                                            ly->q_a,     ly->q_b,         ly->kv_a,     ly->kv_b,
                                            ly->q_a_norm, ly->kv_a_norm, ly->window, ly->sinks,
                                            ly->router_bias};
    }
    r->env.ops = &moex_decoder_ops_cpu;
    r->env.device = (moex_device){MOEX_DEVICE_CPU, 0};
    r->env.threads = m->ctx->options.num_threads;
    r->env.kv = m->cache;
    r->layers = m->host_layers;
    r->embed = m->embed;
    r->embed_dtype = m->embed_dtype;
    r->final_norm = m->final_norm;
    r->lm_head = m->lm_head;
    r->inv_freq = m->inv_freq;
    return MOEX_OK;
}
