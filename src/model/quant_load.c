/* quant_load.c — quantized weights at load: the checkpoint's
 * quantization_config, `*_scale_inv` grids (2-D, or flattened per expert as
 * transformers 5.17 saves them), dequantization of the linear layers that have
 * no quantized kernel, and quantize-on-load of the experts (--quantize). */
#include "model/model_internal.h"
#include <stdio.h>
#include <stdlib.h>

moex_status model_quant_setup(moex_model *m) {
    const moex_config *c = &m->cfg;
    model_quant q = {0, 128, 128, MOEX_ACT_SCHEME_DYNAMIC, 0, 0, 0};
    if (m->opt.dequantize && m->opt.quantize)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "dequantize and quantize = \"%s\" exclude each other", m->opt.quantize);
    if (m->opt.quantize) {
        moex_quant_format f;
        moex_status st = moex_quant_format_parse(m->opt.quantize, &f);
        if (st) return st;
    }
    if (m->opt.dequantize && !c->has_quantization_config)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "dequantize = 1: the checkpoint is not quantized (its config.json "
                         "has no quantization_config)");
    if (c->has_quantization_config && !strcmp(c->quant_method, "mxfp4")) { /* OpenAI's gpt_oss experts */
        if (strcmp(c->model_type, "gpt_oss"))
            return moex_fail(MOEX_ERR_UNSUPPORTED, "config.json: quantization_config.quant_method \"mxfp4\" is read for "
                             "gpt_oss checkpoints only, not %s", c->model_type);
        if (m->opt.quantize)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "quantize = \"%s\": the checkpoint is already quantized (mxfp4)",
                             m->opt.quantize);
        q.mxfp4 = 1;
    } else if (c->has_quantization_config) {
        if (strcmp(c->quant_method, "fp8"))
            return moex_fail(MOEX_ERR_UNSUPPORTED,
                             "config.json: quantization_config.quant_method \"%s\" is not supported (moex reads \"fp8\", and \"mxfp4\" "
                             "for gpt_oss)",
                             c->quant_method);
        if (c->fmt[0] && strcmp(c->fmt, "e4m3"))
            return moex_fail(MOEX_ERR_UNSUPPORTED, "config.json: quantization_config.fmt \"%s\" is not supported (e4m3)",
                             c->fmt);
        if (c->scale_fmt[0] && strcmp(c->scale_fmt, "float") && strcmp(c->scale_fmt, "ue8m0"))
            return moex_fail(MOEX_ERR_UNSUPPORTED,
                             "config.json: quantization_config.scale_fmt \"%s\" is not \"float\" or \"ue8m0\"", c->scale_fmt);
        if (c->activation_scheme[0] && strcmp(c->activation_scheme, "dynamic") && strcmp(c->activation_scheme, "static"))
            return moex_fail(MOEX_ERR_UNSUPPORTED,
                             "config.json: quantization_config.activation_scheme \"%s\" is not \"dynamic\" or \"static\"",
                             c->activation_scheme);
        q.on = 1;
        if (c->has_weight_block_size) q.block_n = c->weight_block_size[0], q.block_k = c->weight_block_size[1];
        if (!strcmp(c->activation_scheme, "static")) q.scheme = MOEX_ACT_SCHEME_STATIC;
        if (m->opt.quantize)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "quantize = \"%s\": the checkpoint is already quantized (fp8)",
                             m->opt.quantize);
    }
    m->quant = q;
    return MOEX_OK;
}

void *model_own(moex_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) {
            moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory");
            return NULL;
        }
        m->owned = p;
        m->cap_owned = cap;
    }
    void *mem = malloc(bytes ? bytes : 1);
    if (!mem) {
        moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for %zu bytes of weights", bytes);
        return NULL;
    }
    m->owned[m->n_owned++] = mem;
    m->owned_bytes += bytes;
    return mem;
}

static const char *shape_text(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++) len += (size_t)snprintf(buf + len, n - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

moex_status model_scale_grid(moex_model *m, const char *name, int64_t E, int64_t N, int64_t K, moex_tensor *view) {
    const int64_t bn = m->quant.block_n, bk = m->quant.block_k, sn = (N + bn - 1) / bn, sk = (K + bk - 1) / bk;
    char sname[600], got[96], want[48], want_flat[48];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    const moex_ckpt_tensor *t;
    moex_status st = moex_checkpoint_get(m->ckpt, sname, &t);
    if (st) return st;
    if (t->dtype != MOEX_ST_F32 && t->dtype != MOEX_ST_F8_E8M0)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s has dtype %s; a weight_scale_inv must be F32 or F8_E8M0 (ue8m0)",
                         sname, moex_st_dtype_name(t->dtype));
    const int fused = E > 0;
    int64_t grid[3] = {E, sn, sk}, flat[2] = {E, sn * sk};
    const int64_t *g = fused ? grid : grid + 1, *f = fused ? flat : flat + 1;
    const int rank = fused ? 3 : 2;
    int ok_grid = t->ndim == rank, ok_flat = t->ndim == rank - 1;
    for (int i = 0; i < rank && ok_grid; i++) ok_grid = t->shape[i] == g[i];
    for (int i = 0; i < rank - 1 && ok_flat; i++) ok_flat = t->shape[i] == f[i];
    if (!ok_grid && !ok_flat)
        return moex_fail(MOEX_ERR_FORMAT,
                         "tensor %s has shape %s, expected %s (or flattened %s): its weight %s is %lld x %lld in blocks "
                         "of %lld x %lld (quantization_config.weight_block_size)",
                         sname, shape_text(t->shape, t->ndim, got, sizeof got), shape_text(g, rank, want, sizeof want),
                         shape_text(f, rank - 1, want_flat, sizeof want_flat), name, (long long)N, (long long)K,
                         (long long)bn, (long long)bk);
    moex_tensor v;
    if ((st = moex_ckpt_tensor_view(t, &v))) return st;
    return moex_tensor_init(view, v.data, v.dtype, rank, g);
}

moex_status model_dequantize_tensor(moex_model *m, const moex_ckpt_tensor *t, const void **data, moex_dtype *dtype) {
    if (!m->quant.on)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s is F8_E4M3 but config.json has no quantization_config", t->name);
    if (t->ndim != 2 && t->ndim != 3)
        return moex_fail(MOEX_ERR_FORMAT, "tensor %s: an F8_E4M3 weight must be 2-D or 3-D (rank %d)", t->name, t->ndim);
    const int64_t E = t->ndim == 3 ? t->shape[0] : 0, N = t->shape[t->ndim - 2], K = t->shape[t->ndim - 1];
    moex_tensor scale, q, out;
    moex_status st = model_scale_grid(m, t->name, E, N, K, &scale);
    if (!st) st = moex_ckpt_tensor_view(t, &q);
    if (st) return st;
    const moex_dtype odt = m->opt.dtype == MOEX_BF16 ? MOEX_BF16 : MOEX_F32;
    void *mem = model_own(m, (size_t)((E ? E : 1) * N * K) * moex_dtype_size(odt));
    if (!mem) return MOEX_ERR_OUT_OF_MEMORY;
    if ((st = moex_tensor_init(&out, mem, odt, t->ndim, t->shape))) return st;
    if ((st = moex_dequantize(&q, &scale, m->quant.block_n, m->quant.block_k, &out))) return st;
    m->quant.dequantized++;
    m->quant.dequantized_bytes += (size_t)((E ? E : 1) * N * K) * moex_dtype_size(odt);
    *data = mem;
    *dtype = odt;
    return MOEX_OK;
}

/* ---- quantize on load ------------------------------------------------------ */

// Matrix [N, K] of rows row0, row0 + step, ... of B-view b (B(k, n)) into w (f32, row-major).
static void gather(const moex_bmat *b, int64_t row0, int64_t step, int64_t N, int64_t K, float *w) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) w[n * K + k] = moex_bmat_at(b, k, row0 + n * step);
}

/* The per-expert layout has no interleaved rows: an interleaved layer's gate/up bias [E, 2I]
 * (gate j at 2j, up j at 2j+1) copied into memory the model owns as gate biases then up biases. */
static moex_status concat_gate_up_bias(moex_model *m, moex_tensor *b, int64_t E, int64_t I) {
    const size_t es = moex_dtype_size(b->dtype);
    char *out = model_own(m, (size_t)(E * 2 * I) * es);
    if (!out) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory for %lld experts' biases", (long long)E);
    const char *src = (const char *)b->data;
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < 2 * I; j++) {
            const int64_t to = e * 2 * I + (j % 2) * I + j / 2;
            memcpy(out + (size_t)to * es, src + (size_t)(e * b->strides[0] + j * b->strides[1]) * es, es);
        }
    const int64_t shape[2] = {E, 2 * I};
    return moex_tensor_init(b, out, b->dtype, 2, shape);
}

moex_status model_quantize_experts(moex_model *m, model_layer *ly, moex_experts_desc *d) {
    moex_quant_format f;
    moex_status st = moex_quant_format_parse(m->opt.quantize, &f);
    if (st) return st;
    const int fp4 = f == MOEX_QUANT_FP4;
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, bn = fp4 ? 1 : 128, bk = fp4 ? 32 : 128;
    if (fp4 && (H % 2 || I % 2))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "quantize = fp4 needs an even hidden size and intermediate size (%lld, %lld)",
                         (long long)H, (long long)I);
    const moex_dtype qdt = fp4 ? MOEX_E2M1X2 : MOEX_E4M3, sdt = f == MOEX_QUANT_FP8 ? MOEX_F32 : MOEX_UE8M0;
    // matrices: gate and up [I, H], down [H, I]; each quantized on its own grid
    const int64_t shapes[3][2] = {{I, H}, {I, H}, {H, I}};
    size_t qbytes[3], sbytes[3], qtotal = 0, stotal = 0;
    for (int i = 0; i < 3; i++) {
        qbytes[i] = (size_t)(shapes[i][0] * shapes[i][1]) / (fp4 ? 2 : 1);
        sbytes[i] = (size_t)(((shapes[i][0] + bn - 1) / bn) * ((shapes[i][1] + bk - 1) / bk)) * moex_dtype_size(sdt);
        qtotal += qbytes[i], stotal += sbytes[i];
    }
    char *codes = model_own(m, qtotal * (size_t)E), *scales = model_own(m, stotal * (size_t)E);
    float *tmp = malloc(sizeof(float) * (size_t)(H * I));
    const void **ptrs = calloc((size_t)(6 * E), sizeof(void *));
    if (!codes || !scales || !tmp || !ptrs) {
        free(tmp), free(ptrs);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory quantizing %lld experts", (long long)E);
    }
    for (int64_t e = 0; e < E && !st; e++) {
        /* gate rows, up rows, down; interleaved gate/up rows (gate j at 2j, up j at 2j+1) taken apart */
        const int il = d->gated && d->interleaved;
        const moex_bmat src[3] = {moex_gate_up_mat(d, e, 0), il ? moex_gate_up_mat(d, e, 0) : moex_gate_up_mat(d, e, I),
                                  moex_down_mat(d, e, 0)};
        const int64_t row0[3] = {0, il ? 1 : 0, 0}, step[3] = {il ? 2 : 1, il ? 2 : 1, 1};
        char *qe = codes + qtotal * (size_t)e, *se = scales + stotal * (size_t)e;
        for (int i = 0; i < 3 && !st; i++) {
            const int64_t N = shapes[i][0], K = shapes[i][1];
            int64_t ws[2] = {N, K}, qs[2] = {N, fp4 ? K / 2 : K}, ss[2] = {(N + bn - 1) / bn, (K + bk - 1) / bk};
            moex_tensor tw, tq, ts;
            gather(&src[i], row0[i], step[i], N, K, tmp);
            st = moex_tensor_init(&tw, tmp, MOEX_F32, 2, ws);
            if (!st) st = moex_tensor_init(&tq, qe, qdt, 2, qs);
            if (!st) st = moex_tensor_init(&ts, se, sdt, 2, ss);
            if (!st) st = moex_quantize(&tw, f, bn, bk, &tq, &ts);
            ptrs[i * E + e] = qe;
            ptrs[(3 + i) * E + e] = se;
            qe += qbytes[i], se += sbytes[i];
        }
    }
    free(tmp);
    if (st) {
        free(ptrs);
        return st;
    }
    if (d->interleaved && moex_tensor_present(&d->gate_up_bias) &&
        (st = concat_gate_up_bias(m, &d->gate_up_bias, E, I))) {
        free(ptrs);
        return st;
    }
    d->interleaved = 0;
    free(ly->expert_ptrs);
    ly->expert_ptrs = ptrs;
    ly->expert_scale_ptrs = ptrs + 3 * E;
    memset(&d->gate_up, 0, sizeof d->gate_up);
    memset(&d->down, 0, sizeof d->down);
    d->transposed = 0;
    d->expert_gate = ptrs, d->expert_up = ptrs + E, d->expert_down = ptrs + 2 * E;
    d->expert_dtype = qdt;
    d->expert_device.kind = MOEX_DEVICE_CPU;
    d->expert_gate_scale = ptrs + 3 * E, d->expert_up_scale = ptrs + 4 * E, d->expert_down_scale = ptrs + 5 * E;
    d->expert_scale_dtype = sdt;
    d->block_n = bn, d->block_k = bk;
    return MOEX_OK;
}
