/* loader.c — moex_model_load: config -> family -> weights (in place from the
 * mapping) -> experts layers -> context, KV cache, scratch. */
#include "model/model_internal.h"
#include "experts/dispatch.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const FAMILIES[] = {"qwen2_moe", "qwen3_moe", "mixtral", "qwen3_vl_moe", "olmoe", "glm4_moe", "deepseek_v3", "gpt_oss"};

moex_model_options moex_model_default_options(void) {
    moex_model_options o;
    memset(&o, 0, sizeof o);
    o.device.kind = MOEX_DEVICE_CPU;
    o.dtype = MOEX_F32;
    o.max_batch = 8;
    o.max_seq = 1024;
    o.max_tokens = 4096;
    o.decode_switch = 1;
    return o;
}

/* ---- tensors ------------------------------------------------------------ */

// A bf16 copy of a weight stored in another dtype (owned by the model).
static moex_status convert_copy(moex_model *m, const moex_tensor *view, const void **data, moex_dtype *dtype) {
    size_t n = 1;
    for (int i = 0; i < view->ndim; i++) n *= (size_t)view->shape[i];
    void *copy = model_own(m, n * 2);
    if (!copy) return MOEX_ERR_OUT_OF_MEMORY;
    moex_convert(view->data, view->dtype, copy, MOEX_BF16, n);
    *data = copy;
    *dtype = MOEX_BF16;
    return MOEX_OK;
}

// The checkpoint's float (or e4m3) tensor `name` with the given shape (-1 = any), as stored, or an
// error naming it.
static moex_status get_view(moex_model *m, const char *name, int ndim, const int64_t *shape,
                            const moex_ckpt_tensor **tp, moex_tensor *viewp) {
    const moex_ckpt_tensor *t;
    moex_status st = moex_checkpoint_get(m->ckpt, name, &t);
    if (st) return st;
    moex_tensor view;
    if ((st = moex_ckpt_tensor_view(t, &view))) return st;
    if (!moex_is_float_dtype(view.dtype) && view.dtype != MOEX_E4M3)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s has dtype %s; f32, f16, bf16 (or e4m3 with a weight_scale_inv) expected",
                         name, moex_dtype_name(view.dtype));
    int rank = t->ndim;
    int bad = rank != ndim;
    for (int i = 0; !bad && i < ndim; i++) bad = shape[i] >= 0 && t->shape[i] != shape[i];
    if (bad) {
        char got[96], want[96];
        size_t a = 0, b = 0;
        for (int i = 0; i < rank; i++) a += (size_t)snprintf(got + a, sizeof got - a, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++) b += (size_t)snprintf(want + b, sizeof want - b, i ? ", %lld" : "%lld", (long long)shape[i]);
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s has shape [%s], expected [%s]", name, got, want);
    }
    *tp = t;
    *viewp = view;
    return MOEX_OK;
}

// A view's data in the dtype the model keeps it: bf16 compute takes f32/f16 weights as bf16 copies.
static int needs_bf16_copy(const moex_model *m, moex_dtype dt) {
    return m->opt.dtype != dt && m->opt.dtype == MOEX_BF16;
}

// The float tensor `name` with the given shape (-1 = any), in the dtype the model keeps it (e4m3
// dequantized, bf16 copies for bf16 compute), or an error naming it.
static moex_status get(moex_model *m, const char *name, int ndim, const int64_t *shape, const void **data,
                       moex_dtype *dtype) {
    const moex_ckpt_tensor *t = NULL;
    moex_tensor view;
    memset(&view, 0, sizeof view);
    moex_status st = get_view(m, name, ndim, shape, &t, &view);
    if (st) return st;
    if (view.dtype == MOEX_E4M3) /* a linear layer with no quantized kernel: dequantized here */
        return model_dequantize_tensor(m, t, data, dtype);
    if (needs_bf16_copy(m, view.dtype)) /* bf16 compute: weights in bf16, like the peer */
        return convert_copy(m, &view, data, dtype);
    *data = view.data;
    *dtype = view.dtype;
    return MOEX_OK;
}

// The vector `name` of n values, with its own dtype.
static moex_status get_vec(moex_model *m, const char *name, int64_t n, moex_vec_w *v) {
    int64_t s[1] = {n};
    return get(m, name, 1, s, &v->data, &v->dtype);
}

// The vector `name` of n finite values as f32 in memory the model owns (the router's bias).
static moex_status get_f32_vec(moex_model *m, const char *name, int64_t n, float **out) {
    moex_vec_w v;
    moex_status st = get_vec(m, name, n, &v);
    if (st) return st;
    float *f = model_own(m, (size_t)n * sizeof(float));
    if (!f) return MOEX_ERR_OUT_OF_MEMORY;
    moex_convert(v.data, v.dtype, f, MOEX_F32, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(f[i]))
            return moex_fail(MOEX_ERR_FORMAT, "tensor %s: element %lld is %g, not a finite number", name, (long long)i,
                             (double)f[i]);
    *out = f;
    return MOEX_OK;
}

// nn.Linear weight `base.weight` [out, in] (+ `base.bias` when with_bias).
static moex_status get_linear(moex_model *m, const char *base, int64_t out, int64_t in, int with_bias,
                              moex_linear_w *w) {
    char name[640];
    int64_t s[2] = {out, in};
    memset(w, 0, sizeof *w);
    snprintf(name, sizeof name, "%s.weight", base);
    moex_status st = get(m, name, 2, s, &w->weight, &w->dtype);
    if (st) return st;
    w->out_features = out;
    w->in_features = in;
    if (with_bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        int64_t bs[1] = {out};
        if ((st = get(m, name, 1, bs, &w->bias, &w->bias_dtype))) return st;
    }
    return MOEX_OK;
}

static moex_status get_mlp(moex_model *m, const char *base, int64_t H, int64_t I, moex_mlp_w *mlp) {
    char name[512];
    moex_status st;
    snprintf(name, sizeof name, "%s.gate_proj", base);
    if ((st = get_linear(m, name, I, H, 0, &mlp->gate))) return st;
    snprintf(name, sizeof name, "%s.up_proj", base);
    if ((st = get_linear(m, name, I, H, 0, &mlp->up))) return st;
    snprintf(name, sizeof name, "%s.down_proj", base);
    if ((st = get_linear(m, name, H, I, 0, &mlp->down))) return st;
    mlp->act = MOEX_ACT_SILU;
    return MOEX_OK;
}

/* ---- experts -------------------------------------------------------------- */

// The stored dtype of tensor `name` must be that of tensor `first` (the layer's first
// experts matrix): one layer's experts share one dtype, and each tensor is read in its own.
static moex_status same_dtype(const moex_model *m, const char *name, const char *first) {
    const moex_ckpt_tensor *t = moex_checkpoint_find(m->ckpt, name), *f = moex_checkpoint_find(m->ckpt, first);
    if (!t || !f || t->dtype == f->dtype) return MOEX_OK; /* a missing tensor is reported by name where it is read */
    return moex_fail(MOEX_ERR_FORMAT, "tensor %s has dtype %s, but %s has %s: the experts matrices of a layer must share "
                     "one dtype", name, moex_st_dtype_name(t->dtype), first, moex_st_dtype_name(f->dtype));
}

// An e4m3 weight `name` of shape [E,] N, K kept quantized: its codes in place and its scale grid.
static moex_status get_fp8(moex_model *m, const char *name, int64_t E, int64_t N, int64_t K, moex_tensor *codes,
                           moex_tensor *scale) {
    const moex_ckpt_tensor *t;
    moex_status st = moex_checkpoint_get(m->ckpt, name, &t);
    if (st) return st;
    int64_t want[3] = {E, N, K};
    const int rank = E > 0 ? 3 : 2;
    int bad = t->dtype != MOEX_ST_F8_E4M3 || t->ndim != rank;
    for (int i = 0; !bad && i < rank; i++) bad = t->shape[i] != want[3 - rank + i];
    if (bad)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s: expected F8_E4M3 of shape [%s%lld, %lld] like the other experts, got %s "
                         "of rank %d", name, E > 0 ? "E, " : "", (long long)N, (long long)K, moex_st_dtype_name(t->dtype),
                         t->ndim);
    if ((st = moex_ckpt_tensor_view(t, codes))) return st;
    return model_scale_grid(m, name, E, N, K, scale);
}

// Fused e4m3 experts: gate_up_proj [E, 2I, H] and down_proj [E, H, I] with their *_scale_inv grids.
static moex_status load_fused_fp8(moex_model *m, const char *moe, moex_experts_desc *d) {
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate;
    char name[256];
    snprintf(name, sizeof name, "%s.experts.gate_up_proj", moe);
    moex_status st = get_fp8(m, name, E, 2 * I, H, &d->gate_up, &d->gate_up_scale);
    if (st) return st;
    snprintf(name, sizeof name, "%s.experts.down_proj", moe);
    return get_fp8(m, name, E, H, I, &d->down, &d->down_scale);
}

// Per-expert e4m3 experts: experts.N.{gate,up,down}.weight with their weight_scale_inv grids.
static moex_status load_per_expert_fp8(moex_model *m, model_layer *ly, const char *moe, const char *const names[3],
                                       moex_experts_desc *d) {
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate;
    const int64_t shapes[3][2] = {{I, H}, {I, H}, {H, I}};
    moex_dtype sdt = MOEX_F32;
    for (int64_t e = 0; e < E; e++)
        for (int i = 0; i < 3; i++) {
            char name[256];
            snprintf(name, sizeof name, "%s.experts.%lld.%s.weight", moe, (long long)e, names[i]);
            moex_tensor codes, scale;
            moex_status st = get_fp8(m, name, 0, shapes[i][0], shapes[i][1], &codes, &scale);
            if (st) return st;
            if (e == 0 && i == 0) sdt = scale.dtype;
            if (scale.dtype != sdt)
                return moex_fail(MOEX_ERR_FORMAT, "tensor %s_scale_inv has dtype %s, the first expert's scales are %s", name,
                                 moex_dtype_name(scale.dtype), moex_dtype_name(sdt));
            ly->expert_ptrs[i * E + e] = codes.data;
            ly->expert_ptrs[(3 + i) * E + e] = scale.data;
        }
    ly->expert_scale_ptrs = ly->expert_ptrs + 3 * E;
    d->expert_gate = ly->expert_ptrs, d->expert_up = ly->expert_ptrs + E, d->expert_down = ly->expert_ptrs + 2 * E;
    d->expert_gate_scale = ly->expert_scale_ptrs, d->expert_up_scale = ly->expert_scale_ptrs + E;
    d->expert_down_scale = ly->expert_scale_ptrs + 2 * E;
    d->expert_dtype = MOEX_E4M3;
    d->expert_scale_dtype = sdt;
    d->expert_device.kind = MOEX_DEVICE_CPU;
    return MOEX_OK;
}

// The experts of layer L: fused 3-D tensors (either orientation) or per-expert 2-D ones.
// Float experts take biases of their own dtype: a checkpoint's bf16 biases beside weights
// dequantized (or stored) in another float dtype are converted once, into memory the model owns
// (quantized weights keep the biases as they are).
static moex_status biases_as_weights(moex_model *m, const char *moe, moex_experts_desc *d) {
    const moex_dtype wdt = d->gate_up.dtype;
    moex_tensor *b[2] = {&d->gate_up_bias, &d->down_bias};
    for (int i = 0; i < 2 && moex_is_float_dtype(wdt); i++) {
        if (!b[i]->data || b[i]->dtype == wdt) continue;
        const size_t n = (size_t)(b[i]->shape[0] * b[i]->shape[1]);
        void *c = model_own(m, n * moex_dtype_size(wdt));
        if (!c) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory converting %s's expert biases", moe);
        const int64_t shape[2] = {b[i]->shape[0], b[i]->shape[1]};
        moex_status st = moex_convert(b[i]->data, b[i]->dtype, c, wdt, n);
        if (!st) st = moex_tensor_init(b[i], c, wdt, 2, shape);
        if (st) return st;
    }
    return MOEX_OK;
}

// gpt_oss's expert biases: gate_up_proj_bias [E, 2I] and down_proj_bias [E, H] into d.
static moex_status load_expert_biases(moex_model *m, const char *moe, moex_experts_desc *d) {
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate;
    const void *gb, *db;
    moex_dtype gbt, dbt;
    int64_t gbs[2] = {E, 2 * I}, dbs[2] = {E, H};
    char name[256];
    snprintf(name, sizeof name, "%s.experts.gate_up_proj_bias", moe);
    moex_status st = get(m, name, 2, gbs, &gb, &gbt);
    if (st) return st;
    snprintf(name, sizeof name, "%s.experts.down_proj_bias", moe);
    if ((st = get(m, name, 2, dbs, &db, &dbt))) return st;
    if ((st = moex_tensor_init(&d->gate_up_bias, (void *)gb, gbt, 2, gbs))) return st;
    return moex_tensor_init(&d->down_bias, (void *)db, dbt, 2, dbs); /* biases_as_weights once the weights are final */
}

// One MXFP4 matrix of gpt_oss (OpenAI's layout): `base_blocks` uint8 [E, rows, in/32, 16] (two e2m1 codes a
// byte, the first in the low nibble) and `base_scales` uint8 [E, rows, in/32] (UE8M0 exponents) -> w as
// e2m1x2 with its scales (dequantize_share dequantizes them for --dequantize).
static moex_status load_mxfp4_matrix(moex_model *m, const char *base, int64_t E, int64_t rows, int64_t in,
                                     moex_tensor *w, moex_tensor *scale) {
    char bname[256], sname[256];
    snprintf(bname, sizeof bname, "%s_blocks", base);
    snprintf(sname, sizeof sname, "%s_scales", base);
    if (in % 32)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s: MXFP4 needs the input size (%lld) to be a multiple of 32", bname,
                         (long long)in);
    const moex_ckpt_tensor *b, *s;
    moex_status st = moex_checkpoint_get(m->ckpt, bname, &b);
    if (!st) st = moex_checkpoint_get(m->ckpt, sname, &s);
    if (st) return st;
    const int64_t bs[4] = {E, rows, in / 32, 16}, ss[3] = {E, rows, in / 32};
    const int bad_b = b->dtype != MOEX_ST_U8 || b->ndim != 4 || memcmp(b->shape, bs, sizeof bs);
    const int bad_s = s->dtype != MOEX_ST_U8 || s->ndim != 3 || memcmp(s->shape, ss, sizeof ss);
    if (bad_b || bad_s)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s: expected U8 [%lld, %lld, %lld%s]", bad_b ? bname : sname,
                         (long long)E, (long long)rows, (long long)(in / 32), bad_b ? ", 16" : "");
    if ((st = moex_tensor_init(scale, (void *)s->data, MOEX_UE8M0, 3, ss))) return st;
    return moex_tensor_init(w, (void *)b->data, MOEX_E2M1X2, 4, bs);
}

// The experts [*e0, *e1) of a layer of E that this model keeps: all, or its expert-parallel rank's
// share (E divides by the group's size: check_ep_share).
static void ep_share_range(const moex_model *m, int64_t E, int64_t *e0, int64_t *e1) {
    *e0 = 0, *e1 = E;
    if (!m->opt.ep_group) return;
    const int64_t per = E / moex_ep_group_size(m->opt.ep_group);
    *e0 = moex_ep_group_rank(m->opt.ep_group) * per, *e1 = *e0 + per;
}

// A contiguous tensor (a rank's share of stacked experts) replaced by its bf16 copy.
static moex_status share_to_bf16(moex_model *m, moex_tensor *t) {
    const void *data;
    moex_dtype dt;
    moex_status st = convert_copy(m, t, &data, &dt);
    if (st) return st;
    int64_t shape[MOEX_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    return moex_tensor_init(t, (void *)data, dt, t->ndim, shape);
}

// Fused quantized experts dequantized (--dequantize) once the model's share is taken: every expert,
// or an expert-parallel rank's own.
enum { DEQ_E4M3 = 1, DEQ_MXFP4 = 2 };

// The experts w (e4m3 [E', N, K] with its block scales, or GPT-OSS's MXFP4 codes [E', rows, in/32, 16]
// with their UE8M0 scales a 32) dequantized to the compute dtype into memory the model owns; scale
// cleared.
static moex_status dequantize_share(moex_model *m, moex_tensor *w, moex_tensor *scale, int kind) {
    const moex_dtype odt = m->opt.dtype == MOEX_BF16 ? MOEX_BF16 : MOEX_F32;
    const int64_t shape[3] = {w->shape[0], w->shape[1], kind == DEQ_MXFP4 ? w->shape[2] * 32 : w->shape[2]};
    moex_tensor q = *w, out;
    moex_status st;
    if (kind == DEQ_MXFP4) { /* the codes as [E', rows, in/2] bytes, two a byte */
        const int64_t qs[3] = {shape[0], shape[1], shape[2] / 2};
        if ((st = moex_tensor_init(&q, w->data, MOEX_E2M1X2, 3, qs))) return st;
    }
    const size_t bytes = (size_t)(shape[0] * shape[1] * shape[2]) * moex_dtype_size(odt);
    void *mem = model_own(m, bytes);
    if (!mem) return MOEX_ERR_OUT_OF_MEMORY;
    if ((st = moex_tensor_init(&out, mem, odt, 3, shape))) return st;
    const int64_t bn = kind == DEQ_MXFP4 ? 1 : m->quant.block_n, bk = kind == DEQ_MXFP4 ? 32 : m->quant.block_k;
    if ((st = moex_dequantize(&q, scale, bn, bk, &out))) return st;
    if (kind == DEQ_E4M3) m->quant.dequantized++, m->quant.dequantized_bytes += bytes;
    *w = out;
    memset(scale, 0, sizeof *scale);
    return MOEX_OK;
}

static moex_status load_experts(moex_model *m, model_layer *ly, const char *moe, int64_t H, int64_t I) {
    const int64_t E = m->cfg.num_experts;
    moex_experts_desc d;
    moex_experts_desc_init(&d);
    d.num_experts = E;
    d.hidden = H;
    d.intermediate = I;
    d.top_k = m->cfg.num_experts_per_tok;
    char name[256];
    snprintf(name, sizeof name, "%s.experts.gate_up_proj", moe);
    const moex_ckpt_tensor *fused = moex_checkpoint_find(m->ckpt, name);
    moex_status st;
    int share_copy = 0; /* fused float experts taken as stored, copied to bf16 below once shared */
    int deq = 0;        /* DEQ_*: fused quantized experts taken as stored, dequantized below once shared */
    const int keep_quant = m->quant.on && !m->opt.dequantize; /* e4m3 experts run quantized */
    d.block_n = m->quant.block_n;
    d.block_k = m->quant.block_k;
    d.activation_scheme = m->quant.scheme;
    const int gpt_oss = !strcmp(m->cfg.model_type, "gpt_oss");
    if (gpt_oss) { /* gate and up interleaved, the clamped swiglu, biases (below) */
        d.interleaved = 1;
        d.activation = MOEX_ACT_GPTOSS_CLAMP;
        d.alpha = (float)m->cfg.swiglu_alpha;
        d.limit = (float)m->cfg.swiglu_limit;
    }
    if (gpt_oss && m->quant.mxfp4) { /* gate/up rows interleaved, not transposed */
        char base[256];
        snprintf(base, sizeof base, "%s.experts.gate_up_proj", moe);
        if (m->opt.dequantize) deq = DEQ_MXFP4; /* below, once the share is taken */
        if ((st = load_mxfp4_matrix(m, base, E, 2 * I, H, &d.gate_up, &d.gate_up_scale))) return st;
        snprintf(base, sizeof base, "%s.experts.down_proj", moe);
        if ((st = load_mxfp4_matrix(m, base, E, H, I, &d.down, &d.down_scale))) return st;
        if (!m->opt.dequantize) d.block_n = 1, d.block_k = 32;
        if ((st = load_expert_biases(m, moe, &d))) return st;
    } else if (fused && keep_quant && fused->dtype == MOEX_ST_F8_E4M3) {
        if ((st = load_fused_fp8(m, moe, &d))) return st;
    } else if (fused) {
        // [E, 2I, H] or transposed [E, H, 2I]; when H == 2I the down tensor ([E, H, I] or [E, I, H]) tells
        snprintf(name, sizeof name, "%s.experts.down_proj", moe);
        const moex_ckpt_tensor *down = moex_checkpoint_find(m->ckpt, name);
        int transposed = fused->ndim == 3 && fused->shape[1] == H && fused->shape[2] == 2 * I;
        if (H == 2 * I && down && down->ndim == 3) transposed = down->shape[1] == I && down->shape[2] == H && H != I;
        int64_t gs[3] = {E, transposed ? H : 2 * I, transposed ? 2 * I : H};
        int64_t ds[3] = {E, transposed ? I : H, transposed ? H : I};
        char gname[256];
        snprintf(gname, sizeof gname, "%s.experts.gate_up_proj", moe);
        snprintf(name, sizeof name, "%s.experts.down_proj", moe);
        const moex_ckpt_tensor *gt = NULL, *dt_ = NULL;
        moex_tensor gv, dv;
        memset(&gv, 0, sizeof gv), memset(&dv, 0, sizeof dv);
        if ((st = get_view(m, gname, 3, gs, &gt, &gv)) || (st = same_dtype(m, name, gname)) ||
            (st = get_view(m, name, 3, ds, &dt_, &dv)))
            return st;
        /* taken as stored; below, once the share is taken (every expert, or a rank's own), e4m3
         * (--dequantize) dequantized and float weights copied to the compute dtype as needed */
        share_copy = gv.dtype != MOEX_E4M3 && needs_bf16_copy(m, gv.dtype);
        if (gv.dtype == MOEX_E4M3) {
            deq = DEQ_E4M3;
            if ((st = model_scale_grid(m, gname, E, gs[1], gs[2], &d.gate_up_scale)) ||
                (st = model_scale_grid(m, name, E, ds[1], ds[2], &d.down_scale)))
                return st;
        }
        d.transposed = transposed;
        moex_tensor_init(&d.gate_up, gv.data, gv.dtype, 3, gs);
        moex_tensor_init(&d.down, dv.data, dv.dtype, 3, ds);
        if (gpt_oss && (st = load_expert_biases(m, moe, &d))) return st;
    } else if (gpt_oss) {
        snprintf(name, sizeof name, "%s.experts.gate_up_proj", moe);
        return moex_fail(MOEX_ERR_NOT_FOUND, "gpt_oss: no tensor %s (moex reads gpt_oss's fused experts, or its MXFP4 "
                         "*_blocks / *_scales with quantization_config.quant_method \"mxfp4\")", name);
    } else {
        int mixtral = strcmp(m->cfg.model_type, "mixtral") == 0;
        const char *gate_name = mixtral ? "w1" : "gate_proj", *up_name = mixtral ? "w3" : "up_proj",
                   *down_name = mixtral ? "w2" : "down_proj";
        ly->expert_ptrs = calloc((size_t)(6 * E), sizeof(void *)); /* weights, then scales when quantized */
        if (!ly->expert_ptrs) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the expert table");
        snprintf(name, sizeof name, "%s.experts.0.%s.weight", moe, gate_name);
        const moex_ckpt_tensor *first_gate = moex_checkpoint_find(m->ckpt, name);
        const char *names[3] = {gate_name, up_name, down_name};
        if (keep_quant && first_gate && first_gate->dtype == MOEX_ST_F8_E4M3) {
            if ((st = load_per_expert_fp8(m, ly, moe, names, &d))) return st;
        } else {
            const int64_t shapes[3][2] = {{I, H}, {I, H}, {H, I}};
            char first[256] = "";
            moex_dtype dt = MOEX_F32;
            int64_t own0, own1; /* the experts this model keeps (an expert-parallel rank's share) */
            ep_share_range(m, E, &own0, &own1);
            for (int64_t e = 0; e < E; e++)
                for (int i = 0; i < 3; i++) { /* every matrix: its shape (get) and the one dtype of the layer */
                    snprintf(name, sizeof name, "%s.experts.%lld.%s.weight", moe, (long long)e, names[i]);
                    if (first[0] && (st = same_dtype(m, name, first))) return st;
                    if (e >= own0 && e < own1) { /* converted or dequantized as kept */
                        if ((st = get(m, name, 2, shapes[i], &ly->expert_ptrs[i * E + e], &dt))) return st;
                    } else { /* another rank's: checked, as stored (the share below drops it) */
                        const moex_ckpt_tensor *t = NULL;
                        moex_tensor v;
                        memset(&v, 0, sizeof v);
                        if ((st = get_view(m, name, 2, shapes[i], &t, &v))) return st;
                        ly->expert_ptrs[i * E + e] = v.data;
                    }
                    if (!first[0]) snprintf(first, sizeof first, "%s", name);
                }
            d.expert_gate = ly->expert_ptrs;
            d.expert_up = ly->expert_ptrs + E;
            d.expert_down = ly->expert_ptrs + 2 * E;
            d.expert_dtype = dt;
            d.expert_device.kind = MOEX_DEVICE_CPU;
        }
    }
    if (m->opt.ep_group) { /* an expert-parallel rank keeps its share (load: E divides by the group's size) */
        int64_t own0, own1;
        ep_share_range(m, E, &own0, &own1);
        if ((st = moex_experts_desc_share(&d, own0, own1 - own0, &d))) return st;
    }
    if (share_copy && ((st = share_to_bf16(m, &d.gate_up)) || (st = share_to_bf16(m, &d.down)))) return st;
    if (deq) {
        if ((st = dequantize_share(m, &d.gate_up, &d.gate_up_scale, deq)) ||
            (st = dequantize_share(m, &d.down, &d.down_scale, deq)))
            return st;
        d.block_n = m->quant.block_n, d.block_k = m->quant.block_k;
    }
    if ((st = biases_as_weights(m, moe, &d))) return st;
    if (m->opt.quantize && (st = model_quantize_experts(m, ly, &d))) return st;
    if (m->opt.device.kind == MOEX_DEVICE_CUDA && (st = model_gpu_experts(m, &d))) return st; /* device tensors */
    return moex_layer_create(&d, &ly->experts);
}

/* ---- layers --------------------------------------------------------------- */

static int is_moe_layer(const moex_config *c, int64_t L) {
    if (c->num_experts <= 0) return 0;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == L) return 0;
    int64_t step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (L + 1) % step == 0;
}

// The yarn parameters of cfg's rope (rope_type "yarn").
moex_status model_yarn_params(const moex_config *c, moex_yarn_params *y) {
    memset(y, 0, sizeof *y);
    y->factor = c->rope.factor;
    y->original_max_position_embeddings = c->rope.original_max_position_embeddings;
    y->max_position_embeddings = (double)c->max_position_embeddings;
    y->beta_fast = c->rope.beta_fast;
    y->beta_slow = c->rope.beta_slow;
    y->mscale = c->rope.mscale;
    y->mscale_all_dim = c->rope.mscale_all_dim;
    y->attention_factor = c->rope.attention_factor;
    y->truncate = c->rope.truncate;
    return MOEX_OK;
}

// deepseek_v3's latent attention of the layer at base (DeepseekV3Attention's tensors).
static moex_status load_mla(moex_model *m, const char *base, model_layer *ly) {
    const moex_config *c = &m->cfg;
    const int64_t H = c->hidden_size, nh = c->num_attention_heads, qd = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int64_t kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, qlr = c->q_lora_rank;
    char name[320];
    moex_status st;
    if (qlr > 0) {
        snprintf(name, sizeof name, "%s.self_attn.q_a_proj", base);
        if ((st = get_linear(m, name, qlr, H, c->attention_bias, &ly->q_a))) return st;
        snprintf(name, sizeof name, "%s.self_attn.q_a_layernorm.weight", base);
        if ((st = get_vec(m, name, qlr, &ly->q_a_norm))) return st;
        snprintf(name, sizeof name, "%s.self_attn.q_b_proj", base);
        if ((st = get_linear(m, name, nh * qd, qlr, 0, &ly->q_b))) return st;
    } else {
        snprintf(name, sizeof name, "%s.self_attn.q_proj", base);
        if ((st = get_linear(m, name, nh * qd, H, 0, &ly->q))) return st;
    }
    snprintf(name, sizeof name, "%s.self_attn.kv_a_proj_with_mqa", base);
    if ((st = get_linear(m, name, kvl + rope, H, c->attention_bias, &ly->kv_a))) return st;
    snprintf(name, sizeof name, "%s.self_attn.kv_a_layernorm.weight", base);
    if ((st = get_vec(m, name, kvl, &ly->kv_a_norm))) return st;
    snprintf(name, sizeof name, "%s.self_attn.kv_b_proj", base);
    if ((st = get_linear(m, name, nh * (c->qk_nope_head_dim + c->v_head_dim), kvl, 0, &ly->kv_b))) return st;
    snprintf(name, sizeof name, "%s.self_attn.o_proj", base);
    return get_linear(m, name, H, nh * c->v_head_dim, c->o_proj_bias, &ly->o);
}

static moex_status load_layer(moex_model *m, int64_t L, model_layer *ly) {
    const moex_config *c = &m->cfg;
    const int64_t H = c->hidden_size, d = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qwen3 = !strcmp(c->model_type, "qwen3_moe") || !strcmp(c->model_type, "qwen3_vl_moe");
    const int mixtral = !strcmp(c->model_type, "mixtral"), olmoe = !strcmp(c->model_type, "olmoe");
    const int glm4 = !strcmp(c->model_type, "glm4_moe"), mla = c->kv_lora_rank > 0;
    const int gpt_oss = !strcmp(c->model_type, "gpt_oss");
    const int sigmoid_moe = glm4 || mla; /* grouped sigmoid router with a bias, ungated shared experts */
    char base[160], name[320];
    snprintf(base, sizeof base, "%slayers.%lld", m->prefix, (long long)L);
    moex_status st;
    snprintf(name, sizeof name, "%s.input_layernorm.weight", base);
    if ((st = get_vec(m, name, H, &ly->in_norm))) return st;
    snprintf(name, sizeof name, "%s.post_attention_layernorm.weight", base);
    if ((st = get_vec(m, name, H, &ly->post_norm))) return st;
    if (mla) {
        if ((st = load_mla(m, base, ly))) return st;
    } else {
        const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        moex_linear_w *w[4] = {&ly->q, &ly->k, &ly->v, &ly->o};
        const int64_t outs[4] = {nh * d, nkv * d, nkv * d, H}, ins[4] = {H, H, H, nh * d};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "%s.self_attn.%s", base, proj[i]);
            if ((st = get_linear(m, name, outs[i], ins[i], i < 3 ? c->attention_bias : c->o_proj_bias, w[i]))) return st;
        }
    }
    if (gpt_oss) { /* the sinks of its heads; a sliding layer's window */
        snprintf(name, sizeof name, "%s.self_attn.sinks", base);
        if ((st = get_f32_vec(m, name, nh, &ly->sinks))) return st;
        ly->window = c->layer_sliding && c->layer_sliding[L] ? c->sliding_window : 0;
    }
    if (qwen3 || olmoe || (glm4 && c->use_qk_norm)) { /* per head, or over the whole q and k rows (olmoe) */
        snprintf(name, sizeof name, "%s.self_attn.q_norm.weight", base);
        if ((st = get_vec(m, name, olmoe ? nh * d : d, &ly->q_norm))) return st;
        snprintf(name, sizeof name, "%s.self_attn.k_norm.weight", base);
        if ((st = get_vec(m, name, olmoe ? nkv * d : d, &ly->k_norm))) return st;
    }
    char moe[200];
    snprintf(moe, sizeof moe, "%s.%s", base, mixtral ? "block_sparse_moe" : "mlp");
    /* mixtral and olmoe: every layer; glm4_moe and deepseek_v3: from first_k_dense_replace on */
    ly->is_moe = sigmoid_moe ? L >= c->first_k_dense_replace : mixtral || olmoe || gpt_oss || is_moe_layer(c, L);
    if (!ly->is_moe) return get_mlp(m, moe, H, c->intermediate_size, &ly->dense);
    snprintf(name, sizeof name, "%s.%s", moe, gpt_oss ? "router" : "gate"); /* gpt_oss's router has a bias */
    if ((st = get_linear(m, name, c->num_experts, H, gpt_oss, &ly->router))) return st;
    if (sigmoid_moe) { /* the router's correction bias (selection only) and the shared experts, added ungated */
        snprintf(name, sizeof name, "%s.gate.e_score_correction_bias", moe);
        if ((st = get_f32_vec(m, name, c->num_experts, &ly->router_bias))) return st;
        if (c->shared_expert_intermediate_size > 0) {
            ly->has_shared = 1;
            snprintf(name, sizeof name, "%s.shared_experts", moe);
            if ((st = get_mlp(m, name, H, c->shared_expert_intermediate_size, &ly->shared))) return st;
        }
    }
    int64_t I = c->moe_intermediate_size > 0 ? c->moe_intermediate_size : c->intermediate_size;
    if ((st = load_experts(m, ly, moe, H, I))) return st;
    if (!strcmp(c->model_type, "qwen2_moe") && c->shared_expert_intermediate_size > 0) {
        ly->has_shared = 1;
        snprintf(name, sizeof name, "%s.shared_expert", moe);
        if ((st = get_mlp(m, name, H, c->shared_expert_intermediate_size, &ly->shared))) return st;
        snprintf(name, sizeof name, "%s.shared_expert_gate", moe);
        if ((st = get_linear(m, name, 1, H, 0, &ly->shared_gate))) return st;
    }
    m->n_moe++;
    return MOEX_OK;
}

/* ---- the model ------------------------------------------------------------ */

static moex_status check_family(const moex_config *c) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (!strcmp(c->model_type, FAMILIES[i])) return MOEX_OK;
    return moex_fail(MOEX_ERR_UNSUPPORTED,
                     "model_type \"%s\" is not supported; supported: qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss",
                     c->model_type);
}

// The separator between dir and a file name in messages: "/" unless dir ends with one.
static const char *dir_sep(const char *dir) { return dir[0] && dir[strlen(dir) - 1] != '/' ? "/" : ""; }

// Every config key the loader reads is honoured as transformers defines it for the family, or
// refused here by name. (Keys the family's transformers model does not read, such as DeepSeek's
// router fields in a qwen3_moe config, are ignored as transformers ignores them.)
static moex_status check_config(moex_model *m, const char *dir) {
    moex_config *c = &m->cfg;
    const char *pfx = c->text_from_sub_config ? "text_config." : "";
    const char *sep = dir_sep(dir);
    if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish"))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %shidden_act = \"%s\" is not supported: moex runs the "
                         "silu experts and MLPs of %s", dir, sep, pfx, c->hidden_act, c->model_type);
    const int gpt_oss = !strcmp(c->model_type, "gpt_oss");
    const int yarn = !strcmp(c->rope.type, "yarn") && (!strcmp(c->model_type, "deepseek_v3") || gpt_oss);
    if (strcmp(c->rope.type, "default") && !yarn)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %s%s has rope type \"%s\"; moex implements the default "
                         "rope (and deepseek_v3's and gpt_oss's yarn)", dir, sep, pfx, c->rope.source, c->rope.type);
    m->q_scale = m->cos_scale = 1.0f;
    if (yarn) { /* the inverse frequencies at alloc_scratch; here their attention factor and the softmax scale */
        moex_yarn_params y;
        float probe[MOEX_ROPE_INTERLEAVED_MAX / 2];
        double af;
        if (model_yarn_params(c, &y) || c->head_dim > MOEX_ROPE_INTERLEAVED_MAX ||
            moex_rope_inv_freq_yarn(c->head_dim, c->rope.theta, &y, probe, &af))
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %s%s: yarn rope: %s", dir, sep, pfx, c->rope.source,
                             moex_last_error());
        if (gpt_oss) m->cos_scale = (float)af; /* cos and sin times the attention factor */
        if (af != 1.0 && !gpt_oss)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %s%s gives yarn an attention factor of %g (mscale "
                             "%g, mscale_all_dim %g); moex runs yarn with a factor of 1 only (mscale = mscale_all_dim)",
                             dir, sep, pfx, c->rope.source, af, c->rope.mscale, c->rope.mscale_all_dim);
        if (c->rope.mscale_all_dim != 0.0) {
            const double f = y.factor != 0.0 ? y.factor : y.max_position_embeddings / y.original_max_position_embeddings;
            const double ms = f <= 1.0 ? 1.0 : 0.1 * c->rope.mscale_all_dim * log(f) + 1.0;
            m->q_scale = (float)(ms * ms);
        }
    }
    const int glm4 = !strcmp(c->model_type, "glm4_moe");
    if (c->rope.partial_rotary_factor != 1.0 && !glm4)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %spartial_rotary_factor = %g is not supported (moex "
                         "rotates whole heads: 1.0)", dir, sep, pfx, c->rope.partial_rotary_factor);
    m->rotary_dim = (int64_t)((double)c->head_dim * c->rope.partial_rotary_factor); /* python's int(): truncation */
    if (m->rotary_dim < 2 || m->rotary_dim % 2 || m->rotary_dim > c->head_dim)
        return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %spartial_rotary_factor = %g of head_dim = %lld rotates %lld "
                         "values; an even number from 2 to head_dim is needed", dir, sep, pfx,
                         c->rope.partial_rotary_factor, (long long)c->head_dim, (long long)m->rotary_dim);
    const int deepseek = !strcmp(c->model_type, "deepseek_v3");
    if (deepseek) {
        if (c->num_key_value_heads != c->num_attention_heads)
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %snum_key_value_heads = %lld; deepseek_v3's latent "
                             "attention expands a key and a value for each of the %lld heads", dir, sep, pfx,
                             (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
        if (c->v_head_dim > c->qk_nope_head_dim + c->qk_rope_head_dim)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %sv_head_dim = %lld is more than qk_nope_head_dim + "
                             "qk_rope_head_dim = %lld, which moex's latent attention needs", dir, sep, pfx,
                             (long long)c->v_head_dim, (long long)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    }
    if (glm4 || deepseek) {
        const int64_t E = c->num_experts, G = c->n_group;
        if (E < 1 || G < 1 || E % G || c->topk_group < 1 || c->topk_group > G ||
            c->num_experts_per_tok > c->topk_group * (E / G))
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %sn_group = %lld, topk_group = %lld, n_routed_experts = "
                             "%lld, num_experts_per_tok = %lld: n_group must divide the experts, topk_group be 1 .. "
                             "n_group, and the kept groups hold at least num_experts_per_tok experts", dir, sep, pfx,
                             (long long)G, (long long)c->topk_group, (long long)E, (long long)c->num_experts_per_tok);
        if (c->first_k_dense_replace < c->num_hidden_layers && c->moe_intermediate_size < 1)
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %smoe_intermediate_size = %lld", dir, sep, pfx,
                             (long long)c->moe_intermediate_size);
        c->shared_expert_intermediate_size = c->moe_intermediate_size * c->n_shared_experts; /* one MLP */
    }
    if (strcmp(c->model_type, "qwen3_vl_moe")) {
        c->rope.n_mrope_section = 0; /* only qwen3_vl_moe's rotary embedding reads mrope_section */
    } else if (c->rope.n_mrope_section) {
        const int64_t *ms = c->rope.mrope_section;
        if (c->rope.n_mrope_section != 3 || ms[0] + ms[1] + ms[2] != c->head_dim / 2)
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %s%s.mrope_section has %d entries summing to %lld; it "
                             "needs 3 (t, h, w) summing to head_dim / 2 = %lld", dir, sep, pfx, c->rope.source,
                             c->rope.n_mrope_section, (long long)(ms[0] + (c->rope.n_mrope_section > 1 ? ms[1] : 0) +
                                                              (c->rope.n_mrope_section > 2 ? ms[2] : 0)),
                             (long long)(c->head_dim / 2));
    }
    if (c->n_sliding_layers && (c->sliding_window < 1 || (!gpt_oss && m->opt.max_seq > c->sliding_window))) {
        if (c->sliding_window < 1)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %s gives layer %lld sliding-window attention with "
                             "no usable sliding_window", dir, sep, c->sliding_source, (long long)c->first_sliding_layer);
        return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %s gives %d layer(s) (the first: %lld) sliding-window "
                         "attention over the last %lld positions; moex has no sliding-window attention, so it runs "
                         "these only where the window never binds: max_seq = %lld must be <= %lld", dir, sep,
                         c->sliding_source, c->n_sliding_layers, (long long)c->first_sliding_layer,
                         (long long)c->sliding_window, (long long)m->opt.max_seq, (long long)c->sliding_window);
    }
    if (!strcmp(c->model_type, "olmoe")) {
        if (c->has_clip_qkv)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "%s%sconfig.json: %sclip_qkv = %g is not supported (moex runs olmoe "
                             "without the clamp of q, k and v: clip_qkv null)", dir, sep, pfx, c->clip_qkv);
        if (c->num_attention_heads * c->head_dim != c->hidden_size)
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %shead_dim = %lld with %lld heads gives q rows of %lld, "
                             "but olmoe's q_norm spans hidden_size = %lld", dir, sep, pfx, (long long)c->head_dim,
                             (long long)c->num_attention_heads, (long long)(c->num_attention_heads * c->head_dim),
                             (long long)c->hidden_size);
        if (c->num_experts < 1)
            return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %snum_experts = %lld; every olmoe layer is a mixture "
                             "of experts", dir, sep, pfx, (long long)c->num_experts);
        m->qk_norm_rows = 1;
    }
    if (c->num_experts > 0 && c->num_experts_per_tok < 1)
        return moex_fail(MOEX_ERR_FORMAT, "%s%sconfig.json: %snum_experts_per_tok = %lld; a model with %lld experts "
                         "routes each token to at least one", dir, sep, pfx, (long long)c->num_experts_per_tok,
                         (long long)c->num_experts);
    return MOEX_OK;
}

// Before the layer table is allocated: a checkpoint of num_hidden_layers layers holds its last one,
// and at least that many tensors.
static moex_status check_layer_count(const moex_model *m, const char *dir) {
    const int64_t L = m->cfg.num_hidden_layers;
    char name[160];
    snprintf(name, sizeof name, "%slayers.%lld.input_layernorm.weight", m->prefix, (long long)(L - 1));
    if ((uint64_t)L <= moex_checkpoint_count(m->ckpt) && moex_checkpoint_find(m->ckpt, name)) return MOEX_OK;
    return moex_fail(MOEX_ERR_NOT_FOUND, "%s%sconfig.json: %snum_hidden_layers = %lld, but the checkpoint has no tensor %s",
                     dir, dir_sep(dir), m->cfg.text_from_sub_config ? "text_config." : "",
                     (long long)L, name);
}

// An expert-parallel rank's share of each MoE layer: num_experts / the group's size experts, at
// least num_experts_per_tok of them (a layer's top_k is at most its experts).
static moex_status check_ep_share(const moex_config *c, const moex_ep_group *g, const char *dir) {
    const int R = moex_ep_group_size(g);
    const char *sep = dir_sep(dir), *pfx = c->text_from_sub_config ? "text_config." : "";
    if (c->num_experts <= 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s%sconfig.json: %s has no experts to share over an expert-parallel "
                         "group of %d ranks", dir, sep, c->model_type, R);
    if (c->num_experts % R)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s%sconfig.json: %snum_experts = %lld does not divide over an "
                         "expert-parallel group of %d ranks", dir, sep, pfx, (long long)c->num_experts, R);
    if (c->num_experts / R < c->num_experts_per_tok)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s%sconfig.json: %snum_experts = %lld over %d ranks leaves %lld "
                         "experts a rank, fewer than num_experts_per_tok = %lld", dir, sep, pfx,
                         (long long)c->num_experts, R, (long long)(c->num_experts / R), (long long)c->num_experts_per_tok);
    return MOEX_OK;
}

static moex_status check_options(const moex_model_options *o) {
    if (o->device.kind != MOEX_DEVICE_CPU && o->device.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "device kind %d is not a moex_device_kind", (int)o->device.kind);
    if (o->device.kind == MOEX_DEVICE_CUDA && !MOEX_HAVE_CUDA)
        return moex_fail(MOEX_ERR_UNSUPPORTED,
                         "device cuda:%d: this build of moex has no CUDA support; load the model on the cpu, or build "
                         "moex with nvcc",
                         o->device.index);
    if (o->device.kind == MOEX_DEVICE_CUDA) {
        moex_device_info info;
        moex_status st = moex_device_query(o->device, &info);
        if (st) return st;
        if (!info.available)
            return moex_fail(MOEX_ERR_UNSUPPORTED, "device cuda:%d is not available (%s); load the model on the cpu",
                             o->device.index, info.reason);
    }
    moex_quant_format qf;
    if (o->quantize && moex_quant_format_parse(o->quantize, &qf) == MOEX_OK &&
        !(moex_dispatch_device_formats(o->device.kind) & (qf == MOEX_QUANT_FP4 ? MOEX_FORMAT_FP4 : MOEX_FORMAT_FP8)))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "quantize = \"%s\": no experts backend runs %s experts on %s in this "
                         "version of moex", o->quantize, qf == MOEX_QUANT_FP4 ? "FP4" : "FP8",
                         o->device.kind == MOEX_DEVICE_CUDA ? "cuda" : "the cpu");
    if (o->dtype != MOEX_F32 && o->dtype != MOEX_BF16)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "compute dtype %s is not supported (f32, bf16)", moex_dtype_name(o->dtype));
    if (o->max_batch < 1 || o->max_batch > 4096 || o->max_seq < 1 || o->max_seq > ((int64_t)1 << 24) ||
        o->max_tokens < 1 || o->max_tokens > ((int64_t)1 << 24))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "max_batch = %lld, max_seq = %lld, max_tokens = %lld: need 1..4096, 1..2^24 and 1..2^24",
                         (long long)o->max_batch, (long long)o->max_seq, (long long)o->max_tokens);
    if (o->max_tokens < o->max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "max_tokens = %lld is less than max_batch = %lld: a decode step of "
                         "max_batch sequences feeds max_batch tokens", (long long)o->max_tokens, (long long)o->max_batch);
    return MOEX_OK;
}

// m->inv_freq [rotary_dim / 2]: the default rope's, or yarn's blend.
static moex_status rope_table(moex_model *m) {
    const moex_config *c = &m->cfg;
    if (!strcmp(c->rope.type, "yarn")) {
        moex_yarn_params y;
        double af;
        model_yarn_params(c, &y);
        return moex_rope_inv_freq_yarn(m->rotary_dim, c->rope.theta, &y, m->inv_freq, &af);
    }
    return moex_rope_inv_freq(m->rotary_dim, c->rope.theta, m->inv_freq);
}

static moex_status alloc_scratch(moex_model *m) {
    const moex_config *c = &m->cfg;
    if (m->gpu) { /* the step runs on the device: only the rotary table, uploaded by model_gpu_load */
        const size_t half = (size_t)c->head_dim / 2 + 1;
        if (!(m->inv_freq = malloc(half * sizeof(float)))) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for scratch");
        return rope_table(m);
    }
    const size_t T = (size_t)m->opt.max_tokens, H = (size_t)c->hidden_size, d = (size_t)c->head_dim;
    /* the attention's output (q, k, v of the latent attention are in run.mla) */
    const size_t qd = (size_t)c->num_attention_heads * (c->kv_lora_rank && (size_t)c->v_head_dim > d ? (size_t)c->v_head_dim : d);
    const size_t kvd = (size_t)c->num_key_value_heads * d;
    size_t wide = H;
    if ((size_t)c->intermediate_size > wide) wide = (size_t)c->intermediate_size;
    if ((size_t)c->shared_expert_intermediate_size > wide) wide = (size_t)c->shared_expert_intermediate_size;
    if (qd > wide) wide = qd;
    const size_t B = (size_t)m->opt.max_batch, K = (size_t)(c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
    model_run *r = &m->run;
    float **f[] = {&r->x, &r->h, &r->mlp, &r->tmp, &r->attn, &r->q, &r->k, &r->v, &r->cos, &r->sin, &r->router_logits,
                   &r->route_w, &r->gate_logit};
    const size_t n[] = {T * H, T * H, T * H, T * wide, T * qd, T * qd, T * kvd, T * kvd, T * d / 2 + 1, T * d / 2 + 1,
                        T * (size_t)(c->num_experts > 0 ? c->num_experts : 1), T * K, T};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
        if (!(*f[i] = malloc(n[i] * sizeof(float)))) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    if (m->opt.dtype == MOEX_BF16) {
        r->h16 = malloc(T * H * sizeof(uint16_t));
        r->out16 = malloc(T * H * sizeof(uint16_t));
        if (!r->h16 || !r->out16) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    r->last = r->h, r->normed = r->tmp; /* max_tokens >= max_batch rows */
    if (c->kv_lora_rank) {
        model_mla_bufs unused;
        r->mla = malloc(model_mla_scratch(c, (int64_t)T, NULL, &unused) * sizeof(float));
        if (!r->mla) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for the latent attention's scratch");
    }
    r->route_ids = malloc(T * K * sizeof(int32_t));
    r->positions = malloc(T * sizeof(int64_t));
    r->tokens = malloc(T * sizeof(int64_t));
    r->seqs = malloc(B * sizeof(moex_attn_seq));
    m->inv_freq = malloc((d / 2 + 1) * sizeof(float));
    if (!r->route_ids || !r->positions || !r->tokens || !r->seqs || !m->inv_freq)
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    return rope_table(m);
}

// Prepare every MoE layer for the backend its map entry names, and for the one
// the decode-step switch would put in its place.
static moex_status prepare_experts(moex_model *m) {
    moex_experts_map decode;
    moex_experts_map_for_decode(&m->map, m->opt.device.kind, m->opt.decode_switch, &decode);
    const char *backends[2] = {m->map.names[m->map_entry], decode.names[m->map_entry]};
    for (int64_t L = 0; L < m->cfg.num_hidden_layers; L++) {
        if (!m->layers[L].is_moe) continue;
        for (int b = 0; b < 2; b++) {
            moex_status st = moex_prepare(m->ctx, m->layers[L].experts, backends[b]);
            if (st) return st;
        }
    }
    return MOEX_OK;
}

static moex_status load(moex_model *m, const char *dir) {
    moex_status st = moex_config_load(dir, &m->cfg);
    if (st || (st = check_family(&m->cfg)) || (st = check_config(m, dir)) || (st = model_quant_setup(m))) return st;
    if (m->quant.mxfp4 && !m->opt.dequantize && !(moex_dispatch_device_formats(m->opt.device.kind) & MOEX_FORMAT_FP4))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "this checkpoint's experts are MXFP4: no experts backend runs FP4 experts "
                         "on %s in this version of moex; load it with dequantize = 1 (--dequantize)",
                         m->opt.device.kind == MOEX_DEVICE_CUDA ? "cuda" : "the cpu");
    if (m->quant.on && !m->opt.dequantize && !(moex_dispatch_device_formats(m->opt.device.kind) & MOEX_FORMAT_FP8))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "this checkpoint's experts are FP8: no experts backend runs FP8 experts on "
                         "%s in this version of moex; load it with dequantize = 1 (--dequantize)",
                         m->opt.device.kind == MOEX_DEVICE_CUDA ? "cuda" : "the cpu");
    if (m->opt.device.kind == MOEX_DEVICE_CUDA && (st = model_gpu_state(m))) return st;
    moex_config *c = &m->cfg;
    snprintf(m->prefix, sizeof m->prefix, "%s", c->text_from_sub_config ? "model.language_model." : "model.");
    if ((st = moex_checkpoint_open(dir, &m->ckpt))) return st;
    const char *subs[MOEX_CONFIG_MAX_SUB];
    for (int i = 0; i < c->n_sub_configs; i++) subs[i] = c->sub_configs[i];
    if ((st = moex_experts_map_init(&m->map, subs, c->n_sub_configs))) return st;
    if (m->opt.experts && (st = moex_experts_map_apply(&m->map, m->opt.experts, 1))) return st;
    m->map_entry = 0;
    for (int i = 1; i < m->map.n; i++)
        if (c->text_from_sub_config && !strcmp(m->map.keys[i], "text_config")) m->map_entry = i;
    int64_t vh[2] = {c->vocab_size, c->hidden_size};
    char name[160];
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->prefix);
    if ((st = get(m, name, 2, vh, &m->embed, &m->embed_dtype))) return st;
    snprintf(name, sizeof name, "%snorm.weight", m->prefix);
    if ((st = get_vec(m, name, c->hidden_size, &m->final_norm))) return st;
    if (c->tie_word_embeddings) {
        m->lm_head = (moex_linear_w){m->embed, m->embed_dtype, c->vocab_size, c->hidden_size, NULL, MOEX_F32};
    } else if ((st = get_linear(m, "lm_head", c->vocab_size, c->hidden_size, 0, &m->lm_head))) {
        return st;
    }
    if ((st = check_layer_count(m, dir))) return st;
    if (m->opt.ep_group && (st = check_ep_share(c, m->opt.ep_group, dir))) return st;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for %lld layers", (long long)c->num_hidden_layers);
    for (int64_t L = 0; L < c->num_hidden_layers; L++)
        if ((st = load_layer(m, L, &m->layers[L]))) return st;
    moex_router_desc_init(&m->router);
    m->router.num_experts = c->num_experts;
    m->router.top_k = c->num_experts_per_tok;
    m->router.renormalize = c->norm_topk_prob;
    if (!strcmp(c->model_type, "gpt_oss")) m->router.kind = MOEX_ROUTER_TOPK_SOFTMAX; /* softmax over the k picks */
    if (!strcmp(c->model_type, "glm4_moe") || c->kv_lora_rank > 0) { /* sigmoid scores, group-limited choice, scaled
                                                                         (the bias per layer) */
        m->router.kind = MOEX_ROUTER_SIGMOID_GROUPED_TOPK;
        m->router.n_group = c->n_group;
        m->router.topk_group = c->topk_group;
        m->router.scaling = (float)c->routed_scaling_factor;
    }
    moex_context_options co = moex_context_default_options();
    co.device = m->opt.device;
    co.num_threads = m->opt.num_threads;
    co.max_tokens = m->opt.max_tokens;
    co.ep_group = m->opt.ep_group;
    if ((st = moex_context_create(&co, &m->ctx))) return st;
    if ((st = prepare_experts(m))) return st;
    if (m->gpu) /* device KV cache, handle and scratch instead of the host ones */
        return (st = alloc_scratch(m)) ? st : model_gpu_load(m);
    /* deepseek_v3: the latent cache, kv_lora_rank + rope values a token and layer */
    if ((st = c->kv_lora_rank ? moex_kv_cache_create_latent(c->num_hidden_layers, m->opt.max_batch, m->opt.max_seq,
                                                            c->kv_lora_rank + c->qk_rope_head_dim, &m->cache)
                              : moex_kv_cache_create(c->num_hidden_layers, m->opt.max_batch, m->opt.max_seq,
                                                     c->num_key_value_heads, c->head_dim, &m->cache)))
        return st;
    return (st = alloc_scratch(m)) ? st : model_run_cpu(m);
}

moex_status moex_model_load(const char *dir, const moex_model_options *options, moex_model **out) {
    if (!dir || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_model_load: %s is NULL", dir ? "out" : "dir");
    moex_model *m = calloc(1, sizeof *m);
    if (!m) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_model_load: out of memory");
    m->opt = options ? *options : moex_model_default_options();
    moex_status st = check_options(&m->opt);
    if (!st) st = load(m, dir);
    if (st) {
        moex_model_free(m);
        return st;
    }
    *out = m;
    return MOEX_OK;
}

void moex_model_free(moex_model *m) {
    if (!m) return;
    if (m->gpu && m->ctx) moex_context_synchronize(m->ctx); /* nothing in flight on what is freed below */
    const int host_run = m->opt.device.kind != MOEX_DEVICE_CUDA; /* m->run's scratch is host memory */
    model_gpu_free(m);
    for (int64_t L = 0; m->layers && L < m->cfg.num_hidden_layers; L++) {
        moex_layer_free(m->layers[L].experts);
        free(m->layers[L].expert_ptrs);
    }
    free(m->layers);
    moex_context_free(m->ctx);
    moex_kv_cache_free(m->cache);
    free(m->inv_freq);
    if (host_run) { /* the CPU's scratch (on CUDA it is device memory, freed above) */
        model_run *r = &m->run;
        float *f[] = {r->x, r->h, r->mlp, r->tmp, r->attn, r->q, r->k, r->v, r->cos, r->sin, r->router_logits,
                      r->route_w, r->gate_logit};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
        free(r->route_ids);
        free(r->positions);
        free(r->tokens);
        free(r->seqs);
        free(r->h16);
        free(r->out16);
        free(r->mla);
    }
    free(m->host_layers);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    moex_checkpoint_close(m->ckpt);
    moex_config_free(&m->cfg);
    free(m);
}

moex_status moex_model_set_experts(moex_model *m, const char *spec) {
    if (!m || !spec) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_model_set_experts: null argument");
    moex_experts_map saved = m->map;
    moex_status st = moex_experts_map_apply(&m->map, spec, 0);
    if (!st && (st = prepare_experts(m))) m->map = saved; /* e.g. a backend that cannot run here */
    return st;
}

moex_status moex_model_get_experts(const moex_model *m, char *buf, size_t size) {
    if (!m) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_model_get_experts: model is NULL");
    return moex_experts_map_to_json(&m->map, buf, size);
}

const moex_layer *moex_model_experts_layer(const moex_model *m, int64_t i) {
    if (!m) return NULL;
    for (int64_t L = 0; L < m->cfg.num_hidden_layers; L++)
        if (m->layers[L].is_moe && i-- == 0) return m->layers[L].experts;
    return NULL;
}

// Append printf-style text to out[0 .. size) at *n, truncating at the end.
static void append(char *out, size_t size, size_t *n, const char *fmt, ...) {
    if (*n >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out + *n, size - *n, fmt, ap);
    va_end(ap);
    if (r > 0) *n += (size_t)r;
}

// moex_model_info.features: what the loaded family runs, in one line.
static void describe_features(const moex_model *m, char *out, size_t size) {
    const moex_config *c = &m->cfg;
    const model_layer *l0 = c->num_hidden_layers > 0 ? &m->layers[0] : NULL;
    size_t n = 0;
    out[0] = '\0';
    if (c->kv_lora_rank) {
        append(out, size, &n, "attention: MLA, %lld heads, ", (long long)c->num_attention_heads);
        if (c->q_lora_rank) append(out, size, &n, "q_lora_rank %lld, ", (long long)c->q_lora_rank);
        append(out, size, &n, "kv_lora_rank %lld, q/k %lld + %lld rope, v %lld, %s rope, latent cache",
               (long long)c->kv_lora_rank, (long long)c->qk_nope_head_dim, (long long)c->qk_rope_head_dim,
               (long long)c->v_head_dim, c->rope_interleave ? "interleaved" : "rotate-half");
    } else {
        append(out, size, &n, "attention: %lld heads, %lld kv heads, head_dim %lld", (long long)c->num_attention_heads,
               (long long)c->num_key_value_heads, (long long)c->head_dim);
    }
    if (l0 && l0->q_norm.data) append(out, size, &n, m->qk_norm_rows ? ", q/k norm over the whole rows" : ", q/k norm per head");
    if (c->attention_bias) append(out, size, &n, c->o_proj_bias ? ", q/k/v/o biases" : ", q/k/v biases");
    if (l0 && l0->sinks) append(out, size, &n, ", sinks");
    if (c->layer_sliding && c->n_sliding_layers)
        append(out, size, &n, ", sliding window %lld on %d of %lld layers", (long long)c->sliding_window,
               c->n_sliding_layers, (long long)c->num_hidden_layers);
    append(out, size, &n, "; rope %s (theta %g", c->rope.type, c->rope.theta);
    if (m->rotary_dim != c->head_dim) append(out, size, &n, ", %lld of %lld values rotated", (long long)m->rotary_dim,
                                             (long long)c->head_dim);
    if (m->cos_scale != 1.0f) append(out, size, &n, ", cos/sin x %g", (double)m->cos_scale);
    if (c->rope.n_mrope_section)
        append(out, size, &n, ", mrope sections %lld/%lld/%lld", (long long)c->rope.mrope_section[0],
               (long long)c->rope.mrope_section[1], (long long)c->rope.mrope_section[2]);
    if (m->router.kind == MOEX_ROUTER_SIGMOID_GROUPED_TOPK)
        append(out, size, &n, "); router sigmoid top-%lld in %lld of %lld groups, correction bias, scaling %g%s",
               (long long)c->num_experts_per_tok, (long long)m->router.topk_group, (long long)m->router.n_group,
               (double)m->router.scaling, c->norm_topk_prob ? ", renormalised" : "");
    else if (m->router.kind == MOEX_ROUTER_TOPK_SOFTMAX)
        append(out, size, &n, "); router top-%lld then softmax, with a bias", (long long)c->num_experts_per_tok);
    else
        append(out, size, &n, "); router softmax top-%lld%s", (long long)c->num_experts_per_tok,
               c->norm_topk_prob ? " renormalised" : "");
    if (!strcmp(c->model_type, "gpt_oss"))
        append(out, size, &n, "; experts with biases, gate/up interleaved, clamped swiglu (alpha %g, limit %g)",
               c->swiglu_alpha, c->swiglu_limit);
    int gated = 0, ungated = 0;
    for (int64_t L = 0; L < c->num_hidden_layers; L++)
        if (m->layers[L].has_shared) *(m->layers[L].shared_gate.weight ? &gated : &ungated) = 1;
    if (gated) append(out, size, &n, "; gated shared expert");
    if (ungated) append(out, size, &n, "; shared experts");
    if (c->num_hidden_layers > m->n_moe)
        append(out, size, &n, "; %lld dense layer(s)", (long long)(c->num_hidden_layers - m->n_moe));
}

/* The format each part runs in (moex_model_info.formats). */
static void describe_formats(const moex_model *m, const moex_experts_desc *d, char *out, size_t size) {
    size_t n = 0;
    const moex_dtype wdt = moex_weight_dtype(d), cdt = m->opt.dtype == MOEX_BF16 ? MOEX_BF16 : MOEX_F32;
    const moex_dtype sdt = d->expert_up ? d->expert_scale_dtype : d->gate_up_scale.dtype;
    if (wdt == MOEX_E4M3)
        append(out, size, &n, "experts e4m3 with %s block scales %lld x %lld, run quantized (activations quantized per "
               "token per %lld)", moex_dtype_name(sdt), (long long)d->block_n, (long long)d->block_k,
               (long long)d->block_k);
    else if (wdt == MOEX_E2M1X2)
        append(out, size, &n, "experts e2m1 (FP4) with %s scales per %lld inputs, run quantized (activations "
               "quantized per token per 32)", moex_dtype_name(sdt), (long long)d->block_k);
    else
        append(out, size, &n, "experts %s", moex_dtype_name(wdt));
    if (m->quant.dequantized)
        append(out, size, &n, "; %lld e4m3 linear layers dequantized at load to %s (%.1f MiB)",
               (long long)m->quant.dequantized, moex_dtype_name(cdt), (double)m->quant.dequantized_bytes / 1048576.0);
    append(out, size, &n, "; other weights %s", moex_dtype_name(cdt));
}

moex_status moex_model_get_info(const moex_model *m, moex_model_info *info) {
    if (!m || !info) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_model_get_info: null argument");
    moex_model_info v;
    memset(&v, 0, sizeof v);
    const moex_config *c = &m->cfg;
    snprintf(v.model_type, sizeof v.model_type, "%s", c->model_type);
    _Static_assert(sizeof v.sub_configs / sizeof v.sub_configs[0] == MOEX_CONFIG_MAX_SUB, "every sub-config fits");
    _Static_assert(sizeof v.sub_configs[0] == MOEX_CONFIG_NAME_LEN, "every sub-config name fits");
    v.num_sub_configs = c->n_sub_configs;
    for (int i = 0; i < v.num_sub_configs; i++) snprintf(v.sub_configs[i], sizeof v.sub_configs[i], "%s", c->sub_configs[i]);
    v.num_layers = c->num_hidden_layers;
    v.num_moe_layers = m->n_moe;
    v.hidden = c->hidden_size;
    v.vocab = c->vocab_size;
    v.num_experts = c->num_experts;
    v.top_k = c->num_experts_per_tok;
    v.moe_intermediate = c->moe_intermediate_size > 0 ? c->moe_intermediate_size : c->intermediate_size;
    v.shared_intermediate = c->shared_expert_intermediate_size;
    if (m->gpu) {
        v.gpu_weight_bytes = m->gpu->weight_bytes;
        v.gpu_kv_cache_bytes = m->gpu->kv_bytes;
        v.gpu_workspace_bytes = m->gpu->scratch_bytes + moex_context_workspace_bytes(m->ctx);
    }
    describe_features(m, v.features, sizeof v.features);
    v.host_weight_copy_bytes = m->owned_bytes;
    v.kv_cache_bytes_per_token = (size_t)c->num_hidden_layers * sizeof(float) *
                                 (c->kv_lora_rank ? (size_t)(c->kv_lora_rank + c->qk_rope_head_dim)
                                                  : 2 * (size_t)c->num_key_value_heads * (size_t)c->head_dim);
    const moex_layer *first = moex_model_experts_layer(m, 0);
    if (first) {
        const moex_experts_desc *d = moex_layer_desc(first);
        v.weight_dtype = moex_weight_dtype(d);
        v.per_expert_layout = d->expert_up != NULL;
        v.transposed = d->transposed;
        describe_formats(m, d, v.formats, sizeof v.formats);
    }
    *info = v;
    return MOEX_OK;
}
