/* load_cuda.c — the device side of a model loaded with device = CUDA: every
 * weight a step needs uploaded once, the device KV cache, the cuBLAS handle and
 * the scratch, and the step state m->run over them with the CUDA op table (see
 * model_cuda.h). */
#include "model/model_internal.h"
#include <stdlib.h>

#if !MOEX_HAVE_CUDA

moex_status model_gpu_state(moex_model *m) {
    (void)m;
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this build of moex has no CUDA support; load the model on the cpu");
}
moex_status model_gpu_experts(moex_model *m, moex_experts_desc *d) {
    (void)m, (void)d;
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this build of moex has no CUDA support; load the model on the cpu");
}
moex_status model_gpu_load(moex_model *m) {
    (void)m;
    return moex_fail(MOEX_ERR_UNSUPPORTED, "this build of moex has no CUDA support; load the model on the cpu");
}
void model_gpu_free(moex_model *m) { (void)m; }

#else

// Record a device allocation, counted in *counter.
static moex_status dev_alloc(model_gpu *g, size_t bytes, size_t *counter, void **out) {
    *out = NULL;
    if (bytes == 0) return MOEX_OK;
    if (g->n_allocs == g->cap_allocs) {
        int cap = g->cap_allocs ? 2 * g->cap_allocs : 256;
        void **a = realloc(g->allocs, (size_t)cap * sizeof *a);
        if (!a) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the device allocation table");
        g->allocs = a;
        g->cap_allocs = cap;
    }
    moex_status st = moex_device_alloc(g->dev, bytes, out);
    if (st) return st;
    g->allocs[g->n_allocs++] = *out;
    *counter += bytes;
    return MOEX_OK;
}

// n values of src (host, sdt) converted to ddt into dst (device).
static moex_status upload_into(model_gpu *g, void *dst, const void *src, moex_dtype sdt, size_t n, moex_dtype ddt) {
    const moex_device host = {MOEX_DEVICE_CPU, 0};
    if (sdt == ddt) return moex_memcpy(dst, g->dev, src, host, n * moex_dtype_size(ddt));
    void *tmp = malloc(n * moex_dtype_size(ddt));
    if (!tmp) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory converting %zu %s values for the GPU", n,
                               moex_dtype_name(sdt));
    moex_status st = moex_convert(src, sdt, tmp, ddt, n);
    if (!st) st = moex_memcpy(dst, g->dev, tmp, host, n * moex_dtype_size(ddt));
    free(tmp);
    return st;
}

// A device copy of n values of src in dtype ddt (weights).
static moex_status upload(model_gpu *g, const void *src, moex_dtype sdt, size_t n, moex_dtype ddt, const void **out) {
    void *d;
    moex_status st = dev_alloc(g, n * moex_dtype_size(ddt), &g->weight_bytes, &d);
    if (!st && n) st = upload_into(g, d, src, sdt, n, ddt);
    if (!st) *out = d;
    return st;
}

// The dtype linear layers and experts compute in: f32 for f32 compute, bf16 for bf16.
static moex_dtype weight_dtype(const moex_model *m) { return m->opt.dtype == MOEX_BF16 ? MOEX_BF16 : MOEX_F32; }

static moex_status upload_linear(moex_model *m, const moex_linear_w *w, moex_linear_w *out) {
    *out = *w;
    if (!w->weight) return MOEX_OK;
    const moex_dtype dt = weight_dtype(m);
    moex_status st = upload(m->gpu, w->weight, w->dtype, (size_t)(w->out_features * w->in_features), dt, &out->weight);
    if (st) return st;
    out->dtype = dt;
    if (w->bias) return upload(m->gpu, w->bias, w->bias_dtype, (size_t)w->out_features, w->bias_dtype, &out->bias);
    return MOEX_OK;
}

static moex_status upload_mlp(moex_model *m, const moex_mlp_w *w, moex_mlp_w *out) {
    *out = *w;
    moex_status st = upload_linear(m, &w->gate, &out->gate);
    if (!st) st = upload_linear(m, &w->up, &out->up);
    if (!st) st = upload_linear(m, &w->down, &out->down);
    return st;
}

// A device copy of the n values of v, in their own dtype (the kernels decode them).
static moex_status upload_vec(moex_model *m, moex_vec_w v, int64_t n, moex_vec_w *out) {
    out->data = NULL;
    out->dtype = v.dtype;
    return v.data ? upload(m->gpu, v.data, v.dtype, (size_t)n, v.dtype, &out->data) : MOEX_OK;
}

// The device state object, made at the first upload.
moex_status model_gpu_state(moex_model *m) {
    if (m->gpu) return MOEX_OK;
    m->gpu = calloc(1, sizeof *m->gpu);
    if (!m->gpu) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the model's device state");
    m->gpu->dev = m->opt.device;
    return MOEX_OK;
}

static size_t tensor_elems(const moex_tensor *t) {
    size_t n = 1;
    for (int k = 0; k < t->ndim; k++) n *= (size_t)t->shape[k];
    return n;
}

// *t (host) replaced by a device copy in its own dtype.
static moex_status upload_view(model_gpu *g, moex_tensor *t) {
    if (!moex_tensor_present(t)) return MOEX_OK;
    const void *dev;
    moex_status st = upload(g, t->data, t->dtype, tensor_elems(t), t->dtype, &dev);
    if (st) return st;
    int64_t shape[MOEX_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    const moex_dtype dt = t->dtype;
    if ((st = moex_tensor_init(t, (void *)dev, dt, t->ndim, shape))) return st;
    t->device = g->dev;
    return MOEX_OK;
}

/* FP8 and FP4 experts: the codes (FP8 one byte a weight, FP4 two weights a byte) and scale grids
 * copied as they are, stacked when the checkpoint keeps each expert in its own tensors (quantize
 * on load does): gate_up [E, R, H] with its grid [E, R/bn, ceil(H/bk)] (gate rows then up rows:
 * I must be a multiple of block_n), down [E, H, I]; FP4 rows of H/2 and I/2 bytes. */
static moex_status upload_quant_experts(model_gpu *g, moex_experts_desc *d, moex_dtype qdt) {
    moex_status st;
    if (!d->expert_up) {
        if ((st = upload_view(g, &d->gate_up)) || (st = upload_view(g, &d->down)) ||
            (st = upload_view(g, &d->gate_up_scale)) || (st = upload_view(g, &d->down_scale)))
            return st;
    } else {
        const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, gated = d->expert_gate != NULL;
        const int64_t R = gated ? 2 * I : I, bn = d->block_n, bk = d->block_k, q = qdt == MOEX_E2M1X2 ? 2 : 1;
        if (gated && I % bn)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "quantized experts on the GPU: intermediate size %lld is not a "
                             "multiple of the checkpoint's block_n %lld, so the gate and up scale grids do not stack",
                             (long long)I, (long long)bn);
        const moex_dtype sdt = d->expert_scale_dtype;
        const size_t ss = moex_dtype_size(sdt), per = (size_t)(I * H / q);
        const int64_t sk_h = (H + bk - 1) / bk, sk_i = (I + bk - 1) / bk, sn_i = (I + bn - 1) / bn,
                      sn_h = (H + bn - 1) / bn, sn_r = gated ? 2 * sn_i : sn_i;
        char *gu, *dn, *gus, *dns;
        if ((st = dev_alloc(g, (size_t)(E * R * H / q), &g->weight_bytes, (void **)&gu)) ||
            (st = dev_alloc(g, (size_t)E * per, &g->weight_bytes, (void **)&dn)) ||
            (st = dev_alloc(g, (size_t)(E * sn_r * sk_h) * ss, &g->weight_bytes, (void **)&gus)) ||
            (st = dev_alloc(g, (size_t)(E * sn_h * sk_i) * ss, &g->weight_bytes, (void **)&dns)))
            return st;
        const size_t grid_i = (size_t)(sn_i * sk_h) * ss, grid_h = (size_t)(sn_h * sk_i) * ss;
        for (int64_t e = 0; e < E && !st; e++) {
            char *rows = gu + (size_t)(e * R * H / q), *grid = gus + (size_t)(e * sn_r * sk_h) * ss;
            if (gated && (st = upload_into(g, rows, d->expert_gate[e], qdt, per, qdt))) break;
            if (gated && (st = upload_into(g, grid, d->expert_gate_scale[e], sdt, grid_i / ss, sdt))) break;
            if ((st = upload_into(g, rows + (size_t)((R - I) * H / q), d->expert_up[e], qdt, per, qdt)) ||
                (st = upload_into(g, grid + (gated ? grid_i : 0), d->expert_up_scale[e], sdt, grid_i / ss, sdt)) ||
                (st = upload_into(g, dn + (size_t)e * per, d->expert_down[e], qdt, per, qdt)) ||
                (st = upload_into(g, dns + (size_t)e * grid_h, d->expert_down_scale[e], sdt, grid_h / ss, sdt)))
                break;
        }
        const int64_t gs[3] = {E, R, H / q}, ds[3] = {E, H, I / q}, gss[3] = {E, sn_r, sk_h}, dss[3] = {E, sn_h, sk_i};
        if (st || (st = moex_tensor_init(&d->gate_up, gu, qdt, 3, gs)) ||
            (st = moex_tensor_init(&d->down, dn, qdt, 3, ds)) ||
            (st = moex_tensor_init(&d->gate_up_scale, gus, sdt, 3, gss)) ||
            (st = moex_tensor_init(&d->down_scale, dns, sdt, 3, dss)))
            return st;
        d->gate_up.device = d->down.device = d->gate_up_scale.device = d->down_scale.device = g->dev;
        d->gated = (int)gated;
        d->interleaved = 0;
        d->expert_gate = d->expert_up = d->expert_down = NULL;
        d->expert_gate_scale = d->expert_up_scale = d->expert_down_scale = NULL;
    }
    if ((st = upload_view(g, &d->gate_up_bias)) || (st = upload_view(g, &d->down_bias))) return st;
    return MOEX_OK;
}

moex_status model_gpu_experts(moex_model *m, moex_experts_desc *d) {
    moex_status st = model_gpu_state(m);
    if (st) return st;
    model_gpu *g = m->gpu;
    const moex_dtype dt = weight_dtype(m);
    const moex_dtype wdt = d->expert_up ? d->expert_dtype : d->gate_up.dtype;
    if (wdt == MOEX_E4M3 || wdt == MOEX_E2M1X2) return upload_quant_experts(g, d, wdt);
    if (d->expert_up) { /* per-expert matrices: stacked on the device (the layout the tensor-core path reads) */
        if (!moex_is_float_dtype(d->expert_dtype))
            return moex_fail(MOEX_ERR_UNSUPPORTED, "experts of dtype %s run on the cpu only in this version of moex "
                             "(the GPU takes FP8 e4m3 and FP4 e2m1 experts); load with dequantize = 1 (--dequantize)",
                             moex_dtype_name(d->expert_dtype));
        if (d->transposed)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "transposed per-expert matrices are not uploaded to the GPU");
        /* gate_up [E, R, H]: expert e's gate rows then its up rows (R = 2I), or its up rows (R = I);
         * down [E, H, I] */
        const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, R = d->expert_gate ? 2 * I : I;
        const size_t per = (size_t)(I * H), esz = moex_dtype_size(dt);
        char *gu, *dn;
        if ((st = dev_alloc(g, (size_t)(E * R * H) * esz, &g->weight_bytes, (void **)&gu)) ||
            (st = dev_alloc(g, (size_t)E * per * esz, &g->weight_bytes, (void **)&dn)))
            return st;
        for (int64_t e = 0; e < E; e++) {
            char *rows = gu + (size_t)(e * R * H) * esz;
            if (d->expert_gate && (st = upload_into(g, rows, d->expert_gate[e], d->expert_dtype, per, dt))) return st;
            if ((st = upload_into(g, rows + (size_t)(R - I) * (size_t)H * esz, d->expert_up[e], d->expert_dtype, per, dt)))
                return st;
            if ((st = upload_into(g, dn + (size_t)e * per * esz, d->expert_down[e], d->expert_dtype, per, dt))) return st;
        }
        const int64_t gs[3] = {E, R, H}, ds[3] = {E, H, I};
        if ((st = moex_tensor_init(&d->gate_up, gu, dt, 3, gs)) || (st = moex_tensor_init(&d->down, dn, dt, 3, ds)))
            return st;
        d->gate_up.device = d->down.device = g->dev;
        d->gated = d->expert_gate != NULL;
        d->interleaved = 0;
        d->expert_gate = d->expert_up = d->expert_down = NULL;
        return MOEX_OK;
    }
    /* stacked: gate_up [E, R, H], down [E, H, I]; a transposed checkpoint's [E, in, out] tensors
     * (gpt_oss) are transposed here, once, into that layout, which the tensor-core path reads */
    moex_tensor *t[4] = {&d->gate_up, &d->down, &d->gate_up_bias, &d->down_bias};
    for (int i = 0; i < 4; i++) {
        if (!moex_tensor_present(t[i])) continue;
        if (!moex_is_float_dtype(t[i]->dtype))
            return moex_fail(MOEX_ERR_UNSUPPORTED, "experts of dtype %s run on the cpu only in this version of moex "
                             "(the GPU takes FP8 e4m3 and FP4 e2m1 experts); load with dequantize = 1 (--dequantize)",
                             moex_dtype_name(t[i]->dtype));
        const size_t n = tensor_elems(t[i]);
        int64_t shape[MOEX_MAX_DIMS];
        memcpy(shape, t[i]->shape, sizeof shape);
        const void *src = t[i]->data;
        void *flipped = NULL;
        if (i < 2 && d->transposed) { /* [E, in, out] -> [E, out, in] */
            const int64_t E = shape[0], in = shape[1], out = shape[2];
            const size_t esz = moex_dtype_size(t[i]->dtype);
            if (!(flipped = malloc(n * esz)))
                return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory transposing %zu expert weights for the GPU", n);
            for (int64_t e = 0; e < E; e++)
                for (int64_t k = 0; k < in; k++)
                    for (int64_t r = 0; r < out; r++)
                        memcpy((char *)flipped + (size_t)((e * out + r) * in + k) * esz,
                               (const char *)src + (size_t)((e * in + k) * out + r) * esz, esz);
            shape[1] = out, shape[2] = in;
            src = flipped;
        }
        const void *dev;
        st = upload(g, src, t[i]->dtype, n, dt, &dev);
        free(flipped);
        if (st || (st = moex_tensor_init(t[i], (void *)dev, dt, t[i]->ndim, shape))) return st;
        t[i]->device = g->dev;
    }
    d->transposed = 0;
    return MOEX_OK;
}

static moex_status upload_layers(moex_model *m) {
    model_gpu *g = m->gpu;
    const moex_config *c = &m->cfg;
    g->layers = calloc((size_t)c->num_hidden_layers, sizeof *g->layers);
    if (!g->layers) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the device layer table");
    for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        model_layer_w *gl = &g->layers[L];
        moex_status st = upload_vec(m, ly->in_norm, c->hidden_size, &gl->in_norm);
        if (!st) st = upload_vec(m, ly->post_norm, c->hidden_size, &gl->post_norm);
        const int64_t qn = m->qk_norm_rows ? c->num_attention_heads * c->head_dim : c->head_dim,
                      kn = m->qk_norm_rows ? c->num_key_value_heads * c->head_dim : c->head_dim;
        if (!st) st = upload_vec(m, ly->q_norm, qn, &gl->q_norm);
        if (!st) st = upload_vec(m, ly->k_norm, kn, &gl->k_norm);
        if (!st) st = upload_linear(m, &ly->q, &gl->q);
        if (!st) st = upload_linear(m, &ly->k, &gl->k);
        if (!st) st = upload_linear(m, &ly->v, &gl->v);
        if (!st) st = upload_linear(m, &ly->o, &gl->o);
        if (!st) st = upload_linear(m, &ly->q_a, &gl->q_a); /* deepseek_v3's latent attention */
        if (!st) st = upload_linear(m, &ly->q_b, &gl->q_b);
        if (!st) st = upload_linear(m, &ly->kv_a, &gl->kv_a);
        if (!st) st = upload_linear(m, &ly->kv_b, &gl->kv_b);
        if (!st) st = upload_vec(m, ly->q_a_norm, c->q_lora_rank, &gl->q_a_norm);
        if (!st) st = upload_vec(m, ly->kv_a_norm, c->kv_lora_rank, &gl->kv_a_norm);
        gl->window = ly->window; /* gpt_oss */
        if (!st && ly->sinks)
            st = upload(m->gpu, ly->sinks, MOEX_F32, (size_t)c->num_attention_heads, MOEX_F32, (const void **)&gl->sinks);
        if (!st && ly->is_moe) st = upload_linear(m, &ly->router, &gl->router);
        if (!st && ly->router_bias) /* glm4_moe, deepseek_v3: e_score_correction_bias */
            st = upload(m->gpu, ly->router_bias, MOEX_F32, (size_t)c->num_experts, MOEX_F32,
                        (const void **)&gl->router_bias);
        if (!st && !ly->is_moe) st = upload_mlp(m, &ly->dense, &gl->dense);
        if (!st && ly->has_shared) st = upload_mlp(m, &ly->shared, &gl->shared);
        if (!st && ly->has_shared) st = upload_linear(m, &ly->shared_gate, &gl->shared_gate);
        if (st) return st;
    }
    return MOEX_OK;
}

// The embedding in the linear layers' dtype (exact for f32), shared with a tied lm_head.
static moex_status upload_embed_head(moex_model *m) {
    model_gpu *g = m->gpu;
    model_run *r = &m->run;
    const moex_config *c = &m->cfg;
    const moex_dtype dt = weight_dtype(m);
    moex_status st = upload(g, m->embed, m->embed_dtype, (size_t)(c->vocab_size * c->hidden_size), dt, &r->embed);
    if (st) return st;
    r->embed_dtype = dt;
    if ((st = upload_vec(m, m->final_norm, c->hidden_size, &r->final_norm))) return st;
    if (c->tie_word_embeddings) {
        r->lm_head = (moex_linear_w){r->embed, dt, c->vocab_size, c->hidden_size, NULL, MOEX_F32};
        return MOEX_OK;
    }
    return upload_linear(m, &m->lm_head, &r->lm_head);
}

static moex_status alloc_scratch(moex_model *m) {
    model_gpu *g = m->gpu;
    model_run *r = &m->run;
    const moex_config *c = &m->cfg;
    const size_t T = (size_t)m->opt.max_tokens, B = (size_t)m->opt.max_batch, H = (size_t)c->hidden_size;
    const size_t d = (size_t)c->head_dim, nh = (size_t)c->num_attention_heads;
    const size_t vd = c->kv_lora_rank && (size_t)c->v_head_dim > d ? (size_t)c->v_head_dim : d;
    const size_t qd = nh * vd; /* q and the attention's output (deepseek_v3: its q is in run.mla) */
    const size_t kvd = (size_t)c->num_key_value_heads * d;
    size_t inter = 1; /* the dense MLPs' and the shared expert's widths */
    if ((size_t)c->intermediate_size > inter) inter = (size_t)c->intermediate_size;
    if ((size_t)c->shared_expert_intermediate_size > inter) inter = (size_t)c->shared_expert_intermediate_size;
    size_t widest_in = H > qd ? H : qd; /* the widest input of a linear layer */
    if (inter > widest_in) widest_in = inter;
    if (c->kv_lora_rank) { /* and of the latent attention's per-head products: q, the attended latents */
        const size_t mq = nh * (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim), ml = nh * (size_t)c->kv_lora_rank;
        if (mq > widest_in) widest_in = mq;
        if (ml > widest_in) widest_in = ml;
        if ((size_t)c->q_lora_rank > widest_in) widest_in = (size_t)c->q_lora_rank;
    }
    const size_t E = (size_t)(c->num_experts > 0 ? c->num_experts : 1);
    const size_t K = (size_t)(c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
    float *inv_freq = NULL;
    float **f[] = {&r->x, &r->h, &r->mlp, &r->tmp, &r->attn, &r->q, &r->k, &r->v, &r->gate, &r->up, &r->cos, &r->sin,
                   &r->router_logits, &r->route_w, &r->gate_logit, &r->last, &r->normed, &r->logits, &inv_freq};
    const size_t n[] = {T * H, T * H, T * H, T * H, T * qd, T * qd, T * kvd, T * kvd, T * inter, T * inter,
                        T * (d / 2), T * (d / 2), T * E, T * K, T, B * H, B * H, B * (size_t)c->vocab_size, d / 2};
    moex_status st = MOEX_OK;
    for (size_t i = 0; !st && i < sizeof n / sizeof n[0]; i++)
        st = dev_alloc(g, n[i] * sizeof(float), &g->scratch_bytes, (void **)f[i]);
    if (!st) st = dev_alloc(g, T * K * sizeof(int32_t), &g->scratch_bytes, (void **)&r->route_ids);
    if (!st) st = dev_alloc(g, T * sizeof(int64_t), &g->scratch_bytes, (void **)&r->positions);
    if (!st) st = dev_alloc(g, T * sizeof(int64_t), &g->scratch_bytes, (void **)&r->tokens);
    if (!st) st = dev_alloc(g, B * sizeof(int64_t), &g->scratch_bytes, (void **)&r->argmax);
    if (!st) st = dev_alloc(g, B * sizeof(moex_attn_seq), &g->scratch_bytes, (void **)&r->seqs);
    if (!st && m->opt.dtype == MOEX_BF16) {
        st = dev_alloc(g, T * H * 2, &g->scratch_bytes, (void **)&r->h16);
        if (!st) st = dev_alloc(g, T * H * 2, &g->scratch_bytes, (void **)&r->out16);
        if (!st) st = dev_alloc(g, T * widest_in * 2, &g->scratch_bytes, &r->env.x16);
    }
    if (!st && c->kv_lora_rank) {
        model_mla_bufs unused;
        st = dev_alloc(g, model_mla_scratch(c, (int64_t)T, NULL, &unused) * sizeof(float), &g->scratch_bytes,
                       (void **)&r->mla);
    }
    if (!st) {
        /* the attention's scores for prefills (the GEMM paths): all of them, or 64 Mi floats (256 MiB) of
         * query rows at a time, and at least one row of every head (with the grouped-query path's
         * pointer tables) */
        const size_t S = (size_t)m->opt.max_seq, row = moex_cuda_attention_gemm_scratch_floats((int64_t)nh, (int64_t)S);
        const size_t all = T * nh * S + (row - nh * S), cap = (size_t)1 << 26;
        r->env.scores_floats = all < cap ? all : cap > row ? cap : row;
        r->env.bf16_inputs = m->opt.dtype == MOEX_BF16; /* R() rounds what the attention reads */
        st = dev_alloc(g, r->env.scores_floats * sizeof(float), &g->scratch_bytes, (void **)&r->env.scores);
    }
    if (!st) st = upload_into(g, inv_freq, m->inv_freq, MOEX_F32, (size_t)m->rotary_dim / 2, MOEX_F32);
    r->inv_freq = inv_freq;
    return st;
}

moex_status model_gpu_load(moex_model *m) {
    moex_status st = model_gpu_state(m);
    if (st) return st;
    model_gpu *g = m->gpu;
    const moex_config *c = &m->cfg;
    if ((st = moex_context_stream(m->ctx, &g->stream))) return st;
    g->flags = m->ctx->device_flags;
    g->graphs = calloc((size_t)m->opt.max_batch + 1, sizeof *g->graphs);
    if (!g->graphs) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the graph table");
    if ((st = upload_embed_head(m)) || (st = upload_layers(m))) return st;
    const size_t rows = (size_t)c->num_hidden_layers * (size_t)m->opt.max_batch * (size_t)m->opt.max_seq;
    if (c->kv_lora_rank) { /* deepseek_v3: the latent cache, kv_lora_rank + rope values a token and layer */
        const int64_t lw = c->kv_lora_rank + c->qk_rope_head_dim;
        if ((st = moex_cuda_kv_cache_create_latent(g->dev.index, c->num_hidden_layers, m->opt.max_batch,
                                                   m->opt.max_seq, lw, &g->cache)))
            return st;
        g->kv_bytes = sizeof(float) * rows * (size_t)lw;
    } else {
        if ((st = moex_cuda_kv_cache_create(g->dev.index, c->num_hidden_layers, m->opt.max_batch, m->opt.max_seq,
                                            c->num_key_value_heads, c->head_dim, &g->cache)))
            return st;
        g->kv_bytes = 2 * sizeof(float) * rows * (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    }
    if ((st = moex_cuda_blas_create(g->dev.index, 0, &g->blas))) return st;
    g->scratch_bytes += g->blas.workspace_bytes;
    /* the step: the CUDA op table on the context's stream, the device weights and scratch */
    model_run *r = &m->run;
    r->env.ops = &moex_decoder_ops_cuda;
    r->env.device = g->dev;
    r->env.kv = &g->cache;
    r->env.stream = g->stream;
    r->env.flags = g->flags;
    r->env.blas = &g->blas;
    r->layers = g->layers;
    return alloc_scratch(m);
}

void model_gpu_free(moex_model *m) {
    model_gpu *g = m ? m->gpu : NULL;
    if (!g) return;
    for (int64_t b = 0; g->graphs && b <= m->opt.max_batch; b++) moex_graph_free(g->graphs[b].graph);
    free(g->graphs);
    moex_cuda_blas_free(&g->blas);
    moex_cuda_kv_cache_free(&g->cache);
    for (int i = 0; i < g->n_allocs; i++) moex_device_free(g->dev, g->allocs[i]);
    free(g->allocs);
    free(g->layers);
    free(g);
    m->gpu = NULL;
}

#endif
