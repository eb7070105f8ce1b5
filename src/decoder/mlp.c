/* mlp.c — activations, the dense gated MLP and qwen2_moe's gated shared expert (see decoder.h). */
#include "decoder/decoder.h"
#include "linear/activation.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- activations (linear/activation.h: PyTorch's CPU formulas, f32) ----------- */

moex_status moex_dense_act_check(const char *fn, moex_activation act) {
    if (act == MOEX_ACT_SILU || act == MOEX_ACT_GELU || act == MOEX_ACT_GELU_TANH || act == MOEX_ACT_RELU)
        return MOEX_OK;
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                     "%s: activation %s (%d) is not one of silu, gelu, gelu_tanh, relu (the clamped kinds are for "
                     "experts only)",
                     fn, moex_activation_name(act), (int)act);
}

// x: [n] -> y: [n]
static void activate(moex_activation act, const float *x, float *y, int64_t n) {
    switch (act) {
    case MOEX_ACT_SILU: for (int64_t i = 0; i < n; i++) y[i] = moex_act_silu(x[i]); break;
    case MOEX_ACT_GELU: for (int64_t i = 0; i < n; i++) y[i] = moex_act_gelu(x[i]); break;
    case MOEX_ACT_GELU_TANH: for (int64_t i = 0; i < n; i++) y[i] = moex_act_gelu_tanh(x[i]); break;
    default: for (int64_t i = 0; i < n; i++) y[i] = moex_act_relu(x[i]); break;
    }
}

static moex_status check_elementwise(const char *fn, const float *x, const float *y, int64_t n) {
    if (n < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: n = %lld is negative", fn, (long long)n);
    if (n > 0 && (!x || !y)) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : "y");
    return MOEX_OK;
}

// x: [n] -> y: [n]
moex_status moex_activate(moex_activation act, const float *x, float *y, int64_t n) {
    moex_status st = moex_dense_act_check("activate", act);
    if (!st) st = check_elementwise("activate", x, y, n);
    if (st) return st;
    activate(act, x, y, n);
    return MOEX_OK;
}

// x: [n] -> y: [n]
moex_status moex_sigmoid(const float *x, float *y, int64_t n) {
    moex_status st = check_elementwise("sigmoid", x, y, n);
    if (st) return st;
    for (int64_t i = 0; i < n; i++) y[i] = moex_act_sigmoid(x[i]);
    return MOEX_OK;
}

/* ---- gated MLP -------------------------------------------------------------- */

static moex_status check_mlp(const char *fn, const moex_mlp_w *m) {
    if (!m) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the MLP description is NULL", fn);
    moex_status st = moex_dense_act_check(fn, m->act);
    if (st) return st;
    const int64_t I = m->gate.out_features, H = m->gate.in_features;
    if (m->up.out_features != I || m->up.in_features != H)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: up_proj is [%lld, %lld] but gate_proj is [%lld, %lld]", fn,
                         (long long)m->up.out_features, (long long)m->up.in_features, (long long)I, (long long)H);
    if (m->down.out_features != H || m->down.in_features != I)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: down_proj is [%lld, %lld], expected [%lld, %lld] (H, I)", fn,
                         (long long)m->down.out_features, (long long)m->down.in_features, (long long)H, (long long)I);
    return MOEX_OK;
}

// Run the MLP once the checks passed; 0 or a status (out of memory, or a linear's own check).
// x: [T, H] -> y: [T, H]
static moex_status run_mlp(const moex_mlp_w *m, const float *x, int64_t T, float *y, int threads) {
    const int64_t I = m->gate.out_features;
    int64_t ti;
    if (!moex_mul_ok(T, I, &ti) || ti > INT64_MAX / 8)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gated_mlp: T = %lld tokens of I = %lld overflows", (long long)T,
                         (long long)I);
    float *g = malloc(sizeof(float) * 2 * (size_t)ti);
    if (!g) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "gated_mlp: no memory for 2 x %lld floats", (long long)ti);
    float *u = g + ti;
    moex_status st = moex_linear(&m->gate, x, T, g, threads);
    if (!st) st = moex_linear(&m->up, x, T, u, threads);
    if (!st) {
        activate(m->act, g, g, ti);
        for (int64_t i = 0; i < ti; i++) {
            const float h = g[i] * u[i]; /* act_fn(gate_proj(x)) * up_proj(x) */
            g[i] = h;
        }
        st = moex_linear(&m->down, g, T, y, threads);
    }
    free(g);
    return st;
}

static moex_status check_io(const char *fn, const moex_mlp_w *m, const float *x, int64_t T, const float *y,
                            int threads) {
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld tokens is negative", fn, (long long)T);
    if (threads < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: threads = %d is negative", fn, threads);
    if (T == 0) return MOEX_OK;
    if (!x || !y) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL (T = %lld)", fn, !x ? "x" : "y",
                                   (long long)T);
    const int64_t H = m->gate.in_features;
    int64_t th;
    if (!moex_mul_ok(T, H, &th) || th > INT64_MAX / 4)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld tokens of H = %lld overflows", fn, (long long)T,
                         (long long)H);
    const char *xb = (const char *)x, *yb = (const char *)y;
    const size_t nb = sizeof(float) * (size_t)th;
    if (xb < yb + nb && yb < xb + nb) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: y overlaps x", fn);
    return MOEX_OK;
}

// Validate every linear up front, so that a bad down_proj fails before anything is written.
static moex_status check_linears(const moex_mlp_w *m) {
    moex_status st = moex_linear(&m->gate, NULL, 0, NULL, 0);
    if (!st) st = moex_linear(&m->up, NULL, 0, NULL, 0);
    if (!st) st = moex_linear(&m->down, NULL, 0, NULL, 0);
    return st;
}

// x: [T, H] -> y: [T, H]
moex_status moex_gated_mlp(const moex_mlp_w *mlp, const float *x, int64_t T, float *y, int threads) {
    moex_status st = check_mlp("gated_mlp", mlp);
    if (!st) st = check_linears(mlp);
    if (!st) st = check_io("gated_mlp", mlp, x, T, y, threads);
    if (st || T == 0) return st;
    return run_mlp(mlp, x, T, y, threads);
}

// x: [T, H], gate: weight [1, H] -> y: [T, H]
void moex_scale_rows_sigmoid(const float *gate_logit, float *y, int64_t T, int64_t H) {
    for (int64_t t = 0; t < T; t++) {
        const float sg = moex_act_sigmoid(gate_logit[t]); /* F.sigmoid(gate) * shared_expert_output */
        float *yt = y + t * H;
        for (int64_t i = 0; i < H; i++) {
            const float p = sg * yt[i];
            yt[i] = p;
        }
    }
}

moex_status moex_shared_expert(const moex_mlp_w *mlp, const moex_linear_w *gate, const float *x, int64_t T, float *y,
                               int threads) {
    const char *fn = "shared_expert";
    moex_status st = check_mlp(fn, mlp);
    if (!st) st = check_linears(mlp);
    if (!st) st = moex_linear(gate, NULL, 0, NULL, 0);
    if (st) return st;
    if (gate->out_features != 1 || gate->in_features != mlp->gate.in_features)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: shared_expert_gate is [%lld, %lld], expected [1, %lld]", fn,
                         (long long)gate->out_features, (long long)gate->in_features,
                         (long long)mlp->gate.in_features);
    st = check_io(fn, mlp, x, T, y, threads);
    if (st || T == 0) return st;
    const int64_t H = mlp->gate.in_features;
    float *s = malloc(sizeof(float) * (size_t)T);
    if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: no memory for %lld floats", fn, (long long)T);
    st = moex_linear(gate, x, T, s, threads); /* shared_expert_gate(x): [T, 1] */
    if (!st) st = run_mlp(mlp, x, T, y, threads);
    if (!st) moex_scale_rows_sigmoid(s, y, T, H);
    free(s);
    return st;
}
