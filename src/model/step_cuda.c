/* step_cuda.c — one forward step of the decoder on the device, the twin of
 * step.c built from the moex_cuda_* decoder calls (src/cuda/decoder_api.h) and
 * moex_experts_forward on the model's CUDA context:
 *   ids -> embed -> L x (attention with the device KV cache, MoE or dense MLP)
 *       -> last rows -> norm -> lm_head -> argmax
 * Every call only queues work on the context's stream; the step's inputs (ids,
 * sequence descriptors) are read from device buffers, so a decode step can be
 * captured once per batch size and replayed. The one synchronisation is the
 * final copy of logits or tokens. */
#include "model/model_internal.h"
#include <stdio.h>
#include <stdlib.h>

#if !MOEX_HAVE_CUDA

moex_status model_gpu_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits, int64_t *tokens,
                           int use_graph) {
    (void)m, (void)seqs, (void)nseq, (void)logits, (void)tokens, (void)use_graph;
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this build of moex has no CUDA support; load the model on the cpu");
}
moex_status model_gpu_reset(moex_model *m, int64_t seq) {
    (void)m, (void)seq;
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this build of moex has no CUDA support");
}

#else

// bf16 compute: round where step.c's round_act does.
static moex_status R(const moex_model *m, float *x, int64_t n) {
    return m->opt.dtype == MOEX_BF16 ? moex_cuda_round_bf16(x, n, m->gpu->stream) : MOEX_OK;
}

static moex_status linear(const moex_model *m, const moex_linear_w *w, const float *x, int64_t T, float *y) {
    return moex_cuda_linear(&m->gpu->blas, w, x, T, y, m->gpu->x16, m->gpu->stream);
}

// x [T, H] += attention(rmsnorm(x)) for layer L (step.c's attention_block).
static moex_status attention_block(moex_model *m, const gpu_layer *ly, int64_t L, int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    model_gpu *g = m->gpu;
    void *s = g->stream;
    const int64_t H = c->hidden_size, d = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    moex_status st = moex_cuda_rmsnorm(g->x, T, H, ly->in_norm.data, ly->in_norm.dtype, c->rms_norm_eps, g->h, s);
    if (!st) st = R(m, g->h, T * H);
    if (!st) st = linear(m, &ly->q, g->h, T, g->q);
    if (!st) st = linear(m, &ly->k, g->h, T, g->k);
    if (!st) st = linear(m, &ly->v, g->h, T, g->v);
    if (!st) st = R(m, g->q, T * nh * d);
    if (!st) st = R(m, g->k, T * nkv * d);
    if (!st) st = R(m, g->v, T * nkv * d);
    if (!st && ly->q_norm.data) {
        st = moex_cuda_rmsnorm_heads(g->q, T, nh, d, ly->q_norm.data, ly->q_norm.dtype, c->rms_norm_eps, g->q, s);
        if (!st)
            st = moex_cuda_rmsnorm_heads(g->k, T, nkv, d, ly->k_norm.data, ly->k_norm.dtype, c->rms_norm_eps, g->k, s);
    }
    if (!st) st = moex_cuda_rope_apply(g->q, T, nh, d, g->cos, g->sin, s);
    if (!st) st = moex_cuda_rope_apply(g->k, T, nkv, d, g->cos, g->sin, s);
    if (!st) st = R(m, g->q, T * nh * d);
    if (!st) st = R(m, g->k, T * nkv * d);
    if (!st) st = moex_cuda_attention(&g->cache, L, g->seqs, nseq, T, nh, g->q, g->k, g->v, g->attn, g->flags, s);
    if (!st) st = R(m, g->attn, T * nh * d);
    if (!st) st = linear(m, &ly->o, g->attn, T, g->tmp);
    if (!st) st = R(m, g->tmp, T * H);
    if (!st) st = moex_cuda_add(g->x, g->tmp, g->x, T * H, s);
    if (!st) st = R(m, g->x, T * H);
    return st;
}

// y [T, H] = down(act(gate(x)) * up(x)) (moex_gated_mlp); uses g->gate and g->up.
static moex_status gated_mlp(moex_model *m, const moex_mlp_w *w, const float *x, int64_t T, float *y) {
    model_gpu *g = m->gpu;
    const int64_t I = w->gate.out_features;
    moex_status st = linear(m, &w->gate, x, T, g->gate);
    if (!st) st = linear(m, &w->up, x, T, g->up);
    if (!st) st = moex_cuda_gated_act(w->act, g->gate, g->up, I, T, I, g->gate, g->stream);
    if (!st) st = linear(m, &w->down, g->gate, T, y);
    return st;
}

// mlp [T, H] = experts(h) (+ the shared expert with its sigmoid gate) (step.c's moe_block).
static moex_status moe_block(moex_model *m, const model_layer *ly, const gpu_layer *gl, int64_t T) {
    const moex_config *c = &m->cfg;
    model_gpu *g = m->gpu;
    void *s = g->stream;
    const int64_t H = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const int bf16 = m->opt.dtype == MOEX_BF16;
    moex_status st = linear(m, &gl->router, g->h, T, g->router_logits);
    if (!st) st = R(m, g->router_logits, T * E);
    if (!st) st = moex_cuda_route(&m->router, NULL, g->router_logits, T, g->route_ids, g->route_w, s);
    if (!st) st = R(m, g->route_w, T * k);
    if (!st && bf16) st = moex_cuda_convert(g->h, MOEX_F32, g->h16, MOEX_BF16, T * H, s);
    if (st) return st;
    moex_tensor ids, w, hidden, out;
    int64_t ks[2] = {T, k}, hs[2] = {T, H};
    if ((st = moex_tensor_init(&ids, g->route_ids, MOEX_I32, 2, ks)) || (st = moex_tensor_init(&w, g->route_w, MOEX_F32, 2, ks)) ||
        (st = moex_tensor_init(&hidden, bf16 ? (void *)g->h16 : (void *)g->h, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)) ||
        (st = moex_tensor_init(&out, bf16 ? (void *)g->out16 : (void *)g->mlp, bf16 ? MOEX_BF16 : MOEX_F32, 2, hs)))
        return st;
    ids.device = w.device = hidden.device = out.device = g->dev;
    if ((st = moex_experts_forward(m->ctx, ly->experts, m->map.names[m->map_entry], &hidden, &ids, &w, &out))) return st;
    if (bf16 && (st = moex_cuda_convert(g->out16, MOEX_BF16, g->mlp, MOEX_F32, T * H, s))) return st;
    if (!ly->has_shared) return MOEX_OK;
    st = gated_mlp(m, &gl->shared, g->h, T, g->tmp);
    if (!st) st = linear(m, &gl->shared_gate, g->h, T, g->gate_logit);
    if (!st) st = moex_cuda_scale_rows_sigmoid(g->gate_logit, g->tmp, T, H, s);
    if (!st) st = R(m, g->tmp, T * H);
    if (!st) st = moex_cuda_add(g->mlp, g->tmp, g->mlp, T * H, s);
    if (!st) st = R(m, g->mlp, T * H);
    return st;
}

// Queue the whole step: reads g->tokens [T] and g->seqs [nseq]; writes g->logits [nseq, V] and g->argmax [nseq].
static moex_status queue_step(moex_model *m, int64_t nseq, int64_t T) {
    const moex_config *c = &m->cfg;
    model_gpu *g = m->gpu;
    void *s = g->stream;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    moex_status st = moex_cuda_embedding(g->embed, g->embed_dtype, V, H, g->tokens, T, g->x, g->flags, s);
    if (!st) st = R(m, g->x, T * H);
    if (!st) st = moex_cuda_positions(g->seqs, nseq, T, g->positions, s);
    if (!st && c->rope.n_mrope_section == 3) {
        int64_t sec[3] = {c->rope.mrope_section[0], c->rope.mrope_section[1], c->rope.mrope_section[2]};
        st = moex_cuda_mrope_cos_sin(g->inv_freq, c->head_dim, sec, g->positions, g->positions, g->positions, T, g->cos,
                                     g->sin, s);
    } else if (!st) {
        st = moex_cuda_rope_cos_sin(g->inv_freq, c->head_dim, g->positions, T, g->cos, g->sin, s);
    }
    for (int64_t L = 0; !st && L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        const gpu_layer *gl = &g->layers[L];
        st = attention_block(m, gl, L, nseq, T);
        if (!st) st = moex_cuda_rmsnorm(g->x, T, H, gl->post_norm.data, gl->post_norm.dtype, c->rms_norm_eps, g->h, s);
        if (!st) st = R(m, g->h, T * H);
        if (!st) st = ly->is_moe ? moe_block(m, ly, gl, T) : gated_mlp(m, &gl->dense, g->h, T, g->mlp);
        if (!st) st = R(m, g->mlp, T * H);
        if (!st) st = moex_cuda_add(g->x, g->mlp, g->x, T * H, s);
        if (!st) st = R(m, g->x, T * H);
    }
    if (!st) st = moex_cuda_gather_last_rows(g->x, H, g->seqs, nseq, g->last, s);
    if (!st) st = moex_cuda_rmsnorm(g->last, nseq, H, g->final_norm.data, g->final_norm.dtype, c->rms_norm_eps, g->normed, s);
    if (!st) st = R(m, g->normed, nseq * H);
    if (!st) st = linear(m, &g->lm_head, g->normed, nseq, g->logits);
    if (!st) st = R(m, g->logits, nseq * V);
    if (!st) st = moex_cuda_argmax(g->logits, nseq, V, g->argmax, s);
    return st;
}

// Replay the graph captured for a decode step of nseq sequences (capture it first when there is none,
// or when the experts backend changed since).
static moex_status graph_step(moex_model *m, int64_t nseq) {
    model_gpu *g = m->gpu;
    gpu_graph *gg = &g->graphs[nseq];
    const char *backend = m->map.names[m->map_entry];
    if (gg->graph && strcmp(gg->backend, backend) != 0) {
        moex_graph_free(gg->graph);
        gg->graph = NULL;
    }
    if (!gg->graph) {
        moex_status st = moex_graph_begin(m->ctx);
        if (st) return st;
        st = queue_step(m, nseq, nseq);
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

moex_status model_gpu_step(moex_model *m, const model_step_seq *seqs, int64_t nseq, float *logits, int64_t *tokens,
                           int use_graph) {
    const moex_config *c = &m->cfg;
    model_gpu *g = m->gpu;
    const moex_device host = {MOEX_DEVICE_CPU, 0};
    if (nseq < 1 || nseq > m->opt.max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%lld sequences in a step; the model was loaded for 1 to max_batch = %lld",
                         (long long)nseq, (long long)m->opt.max_batch);
    int64_t T = 0, *tok = NULL;
    moex_attn_seq attn[nseq];
    moex_status st = model_step_inputs(m, seqs, nseq, attn, &T, &tok);
    if (st) return st;
    // The previous step was synchronised: the buffers are free to be rewritten.
    st = moex_memcpy(g->tokens, g->dev, tok, host, (size_t)T * sizeof *tok);
    free(tok);
    if (!st) st = moex_memcpy(g->seqs, g->dev, attn, host, (size_t)nseq * sizeof *attn);
    if (st) return st;
    st = use_graph && T == nseq ? graph_step(m, nseq) : queue_step(m, nseq, T);
    moex_status sync = moex_context_synchronize(m->ctx); /* also after an error: nothing left in flight */
    if (st || sync) return st ? st : sync;
    if (logits && (st = moex_memcpy(logits, host, g->logits, g->dev, (size_t)(nseq * c->vocab_size) * sizeof(float))))
        return st;
    if (tokens && (st = moex_memcpy(tokens, host, g->argmax, g->dev, (size_t)nseq * sizeof(int64_t)))) return st;
    return MOEX_OK;
}

#endif
