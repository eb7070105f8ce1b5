/*
 * layouts.h — the test tables shared by the CPU and GPU experts tests: the weight
 * layouts, the valid (layout, activation) pairs, the float dtypes, and the NMSE bounds
 * of SPEC "Numerical agreement". Header-only (static definitions); nothing here calls
 * the library.
 */
#ifndef MOEX_TEST_LAYOUTS_H
#define MOEX_TEST_LAYOUTS_H

#include "moex.h"

/* One weight layout of the experts. */
typedef struct layout {
    int gated, interleaved, transposed, bias;
    const char *name;
} layout;

static const layout LAYOUTS[] = {
    {1, 0, 0, 0, "concat"},           {1, 0, 0, 1, "concat+bias"},
    {1, 0, 1, 0, "concat.T"},         {1, 0, 1, 1, "concat.T+bias"},
    {1, 1, 0, 0, "interleaved"},      {1, 1, 0, 1, "interleaved+bias"},
    {1, 1, 1, 0, "interleaved.T"},    {1, 1, 1, 1, "interleaved.T+bias"},
    {0, 0, 0, 0, "ungated"},          {0, 0, 0, 1, "ungated+bias"},
    {0, 0, 1, 0, "ungated.T"},        {0, 0, 1, 1, "ungated.T+bias"},
};
#define N_LAYOUTS ((int)(sizeof LAYOUTS / sizeof LAYOUTS[0]))

static const char *const ACT_NAMES[MOEX_ACTIVATION_COUNT] = {
    "silu", "gelu", "gelu_tanh", "relu", "gptoss_clamp", "swiglu_limit"};

static const moex_dtype FLOAT_DTYPES[] = {MOEX_F32, MOEX_F16, MOEX_BF16};

/* A valid (layout, activation) pair: gated layouts x 6, ungated x 4 = 64. */
typedef struct pair {
    int layout;
    moex_activation act;
} pair;
#define N_PAIRS 64

/* i in [0, N_PAIRS) -> the i-th valid pair, activations varying fastest */
static inline pair pair_at(int i) {
    pair p = {0, MOEX_ACT_SILU};
    int n = 0;
    for (int l = 0; l < N_LAYOUTS; l++) {
        int nact = LAYOUTS[l].gated ? 6 : 4;
        for (int a = 0; a < nact; a++, n++) {
            if (n == i) {
                p.layout = l;
                p.act = (moex_activation)a;
                return p;
            }
        }
    }
    return p;
}

/* dt -> short name, independent of the library */
static inline const char *dt_name(moex_dtype dt) {
    switch (dt) {
    case MOEX_F32: return "f32";
    case MOEX_F16: return "f16";
    case MOEX_BF16: return "bf16";
    case MOEX_I32: return "i32";
    case MOEX_I64: return "i64";
    default: return "?";
    }
}

/* dt -> the NMSE bound of SPEC "Numerical agreement" */
static inline double nmse_bound(moex_dtype dt) {
    return dt == MOEX_F32 ? 1e-10 : dt == MOEX_F16 ? 1e-6 : 1e-4;
}

#endif
