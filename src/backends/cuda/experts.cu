/* experts.cu — the CUDA eager, batched_mm and grouped_mm: support checks,
 * workspace sizes, prepare (the layer as kernel views, pointer arrays on the
 * device) and the forwards, which only queue kernels on the context's stream:
 * no host synchronisation and no allocation, so every forward can be captured
 * in a CUDA graph.
 *
 *   batched_mm  gemv gate/up per pair -> gemv down per pair with the weighted
 *               sum fused (2 kernels, no routing preparation); FP8: the inputs of
 *               each projection quantized first (4 kernels)
 *   grouped_mm  routing on the device -> small T: both projections streamed per expert
 *               in one launch (bf16/f16; else gemv per expert, 2 kernels); large T:
 *               gather, tensor-core grouped GEMM (gate/up + activation),
 *               grouped GEMM (down) -> reduction in token order. FP8: small T, the
 *               one-launch streamed forward (it quantizes the activations itself); large T,
 *               x quantized into expert order, the FP8 grouped GEMM (gate/up), h
 *               quantized, the FP8 grouped GEMM (down), the reduction. FP4 (both
 *               backends, gemv_fp4.cu): x quantized to int8 codes, gate/up, h quantized,
 *               down; per pair in batched_mm, per expert in grouped_mm (dp4a kernels
 *               below 2 rows an expert, integer mma.sync from 2), then the reduction
 *   eager       the same pieces, launched once per expert (empty experts
 *               return on the device); float weights only
 *   deepgemm    grouped_mm's GEMM path at every token count, with the GEMMs compiled
 *               for the layer's shape at the first forward that needs them (gemm_jit.h),
 *               the rows in deepgemm's layouts: contiguous (each expert's segment padded
 *               to whole tiles) above deepgemm_masked_max_tokens() tokens, masked (a fixed
 *               capacity of T rows an expert) up to it; bf16 and FP8 weights
 *   sonicmoe    grouped_mm's GEMM path at every token count, fused: routing -> the gate/up
 *               GEMM reading its rows of the hidden states by index (no gathered copy) with the
 *               activation -> the down GEMM applying each row's routing weight -> each token
 *               gathers and sums its k rows in j order; bf16/f16 gated experts
 */
#include "backends/impl.h"
#include "core/gpu_runtime.h"
#include "gpu/cuda_check.h"
#include "backends/cuda/act_quant.cuh"
#include "backends/cuda/gemm_jit.h"
#include "backends/cuda/gemm_sm90.cuh"
#include "backends/deepgemm_layout.h"
#include "backends/cuda/gemv.cuh"
#include "backends/cuda/routing.cuh"

#include <stdio.h>
#include <stdlib.h>

/* The five implementations differ only in how they launch the shared pieces. */
typedef enum cuda_kind { CUDA_EAGER, CUDA_BATCHED_MM, CUDA_GROUPED_MM, CUDA_DEEPGEMM, CUDA_SONICMOE } cuda_kind;

typedef struct cuda_state {
    layer_view L;
    quant_view Q;      /* FP8 and FP4 layers: the weights' scales (Q.on) */
    void *ptrs;        /* device: per-expert pointer arrays (gate | up | down), or NULL */
    int device, num_sms;
    int tc;            /* the tensor-core path can run this layer */
    gemm_epilogue epi; /* its gate/up epilogue */
    int cc;            /* deepgemm: the device's compute capability x 10 (its kernels are compiled for it) */
    int scale_cc;      /* deepgemm: the capability whose scale rule applies (deepgemm_scale_cc) */
    int64_t masked_max;/* deepgemm: deepgemm_masked_max_tokens() when prepared (its workspace was sized for it) */
} cuda_state;

static size_t esize(moex_dtype dt) { return dt == MOEX_F32 ? 4 : 2; }
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* ---- support ---------------------------------------------------------------- */

static quant_view make_quant_view(const moex_experts_desc *d);

/* The grouped GEMM's gate/up epilogue for the layer's layout. */
static gemm_epilogue gate_up_epilogue(const moex_experts_desc *d) {
    return !d->gated ? EPI_UP_ONLY : d->interleaved ? EPI_GATE_UP_INTERLEAVED : EPI_GATE_UP_CONCAT;
}

static int tc_layout(const moex_experts_desc *d, char *why, size_t n) {
    if (moex_weight_dtype(d) == MOEX_E2M1X2) {
        snprintf(why, n, "FP4 weights (the streamed kernels take them)");
        return 0;
    }
    if (d->expert_up) {
        snprintf(why, n, "per-expert weight pointers");
        return 0;
    }
    if (d->transposed) {
        snprintf(why, n, "transposed weights");
        return 0;
    }
    if (d->hidden % 8 || d->intermediate % 8) {
        snprintf(why, n, "hidden and intermediate must be multiples of 8");
        return 0;
    }
    if (!grouped_gemm_usable(d->gate_up.dtype, d->gate_up.data, d->hidden, why, n)) return 0;
    if (!grouped_gemm_usable(d->down.dtype, d->down.data, d->intermediate, why, n)) return 0;
    if (moex_weight_dtype(d) != MOEX_E4M3) return 1;
    const quant_view q = make_quant_view(d);
    return grouped_gemm_fp8_usable(q, gate_up_epilogue(d), q.up.row0, why, n);
}

/* FP8 and FP4 layers (the table's rows give batched_mm and grouped_mm FP8 and FP4): what their
 * kernels take. */
static int quant_supports(cuda_kind kind, const moex_experts_desc *d, char *why, size_t n) {
    const int fp4 = moex_weight_dtype(d) == MOEX_E2M1X2;
    const char *fmt = fp4 ? "FP4" : "FP8";
    if (d->expert_up) {
        snprintf(why, n, "%s experts on the GPU take the stacked layout (gate_up [E, rows, in] with [E, ...] scale "
                 "grids), not per-expert pointers", fmt);
        return 0;
    }
    if (d->transposed) {
        snprintf(why, n, "%s experts on the GPU take [E, out, in] matrices, not transposed ones", fmt);
        return 0;
    }
    if (d->activation_scheme != MOEX_ACT_SCHEME_DYNAMIC) {
        snprintf(why, n, "activation_scheme static: the CUDA backends quantize activations dynamically, per token and "
                 "per block_k inputs");
        return 0;
    }
    if (fp4 && (d->hidden % 32 || d->intermediate % 32)) {
        snprintf(why, n, "FP4 experts on the GPU need hidden and intermediate sizes that are multiples of 32 (whole "
                 "scale blocks in 16-byte rows); got hidden %lld, intermediate %lld", (long long)d->hidden,
                 (long long)d->intermediate);
        return 0;
    }
    if (fp4 && (d->block_n != 1 || d->block_k != 32)) {
        snprintf(why, n, "FP4 experts on the GPU take one scale per row per 32 inputs; got %lld x %lld blocks",
                 (long long)d->block_n, (long long)d->block_k);
        return 0;
    }
    if (d->hidden % 16 || d->intermediate % 16) {
        snprintf(why, n, "FP8 experts on the GPU need hidden and intermediate sizes that are multiples of 16 (16-byte "
                 "rows); got hidden %lld, intermediate %lld", (long long)d->hidden, (long long)d->intermediate);
        return 0;
    }
    const int64_t kmul = fp4 ? 32 : kind == CUDA_DEEPGEMM ? 128 : kind == CUDA_GROUPED_MM ? 64 : 16;
    if (d->block_k % kmul) {
        snprintf(why, n, "FP8 experts on the GPU (%s) need block_k a multiple of %lld; got %lld",
                 kind == CUDA_DEEPGEMM ? "deepgemm" : kind == CUDA_GROUPED_MM ? "grouped_mm" : "batched_mm",
                 (long long)kmul, (long long)d->block_k);
        return 0;
    }
    const moex_tensor *t[4] = {&d->gate_up, &d->down, &d->gate_up_scale, &d->down_scale};
    for (int i = 0; i < 4; i++) {
        if (t[i]->device.kind != MOEX_DEVICE_CUDA) {
            snprintf(why, n, "the %s weights and their scales must be in GPU memory", fmt);
            return 0;
        }
        if (i < 2 && ((uintptr_t)t[i]->data & 15)) {
            snprintf(why, n, "%s weights on the GPU must be 16-byte aligned", fmt);
            return 0;
        }
        if (i >= 2 && t[i]->strides[t[i]->ndim - 1] != 1) {
            snprintf(why, n, "the scale grids must be contiguous along their last dimension");
            return 0;
        }
    }
    return 1;
}

/* A backend that runs the grouped GEMMs at every size (deepgemm, sonicmoe): tc_layout, or a
 * reason naming the backend and grouped_mm. */
static int gemm_only_layer(const char *backend, const moex_experts_desc *d, char *why, size_t n) {
    char what[160];
    if (tc_layout(d, what, sizeof what)) return 1;
    snprintf(why, n, "%s's grouped GEMMs do not take this layer: %s (grouped_mm runs it)", backend, what);
    return 0;
}

/* sonicmoe (R7; the device and the activation are checked by its needs, planned.c): bf16 or f16
 * gated experts the fused GEMMs take. */
static int sonicmoe_supports_layer(const moex_experts_desc *d, char *why, size_t n) {
    const moex_dtype w = moex_weight_dtype(d);
    if (w != MOEX_BF16 && w != MOEX_F16) {
        snprintf(why, n, "sonicmoe runs bf16 and f16 experts; this layer's are %s (grouped_mm runs them)",
                 moex_dtype_name(w));
        return 0;
    }
    if (!d->gated) {
        snprintf(why, n, "sonicmoe runs gated experts only (SwiGLU, GeGLU, ReGLU); this layer is ungated (grouped_mm "
                 "runs it)");
        return 0;
    }
    return gemm_only_layer("sonicmoe", d, why, n);
}

/* The device, where the weights are and, for quantized layers, quant_supports. */
static int cuda_supports(cuda_kind kind, const moex_experts_desc *d, const moex_device_info *dev, char *why, size_t n) {
    if (dev->cc_major != 9) {
        snprintf(why, n, "this build's CUDA kernels are compiled for sm_90a (Hopper: H100, H200); %s has compute "
                 "capability %d.%d", dev->name, dev->cc_major, dev->cc_minor);
        return 0;
    }
    if (d && d->expert_up && d->expert_device.kind != MOEX_DEVICE_CUDA) {
        snprintf(why, n, "the per-expert weight pointers must point to GPU memory (expert_device = cuda)");
        return 0;
    }
    if (d && moex_is_quant_dtype(moex_weight_dtype(d)) && !quant_supports(kind, d, why, n)) return 0;
    if (kind == CUDA_SONICMOE && d) return sonicmoe_supports_layer(d, why, n);
    if (kind != CUDA_DEEPGEMM || !d) return 1;
    /* deepgemm: its grouped GEMMs at every size */
    const moex_dtype w = moex_weight_dtype(d);
    if (w != MOEX_BF16 && w != MOEX_E4M3) {
        snprintf(why, n, "deepgemm runs bf16 and FP8 (e4m3) experts; this layer's are %s (grouped_mm and batched_mm "
                 "run them)", moex_dtype_name(w));
        return 0;
    }
    return gemm_only_layer("deepgemm", d, why, n);
}

/* The compute capability (x 10) whose rule on FP8 scales deepgemm applies: the device's, or
 * $MOEX_DEEPGEMM_ASSUME_CC (e.g. 100) to test the SM100 rule on another GPU; its kernels are
 * compiled for the device all the same. */
static int deepgemm_scale_cc(int device_cc) {
    return (int)moex_env_int("MOEX_DEEPGEMM_ASSUME_CC", 10, 1000, device_cc);
}

/* Forwards of at most this many tokens take the masked layout (deepgemm_layout.h): E x T rows,
 * so the bound keeps its buffers near the contiguous layout's at a few thousand tokens.
 * $MOEX_DEEPGEMM_MASKED_MAX_TOKENS overrides it (0: never masked), read when a layer is prepared:
 * its workspace and its forwards use that value. */
#define DEEPGEMM_MASKED_MAX_TOKENS 128
static int64_t deepgemm_masked_max_tokens(void) {
    return moex_env_int("MOEX_DEEPGEMM_MASKED_MAX_TOKENS", 0, INT32_MAX, DEEPGEMM_MASKED_MAX_TOKENS);
}

/* ---- the layer as kernel views ------------------------------------------------ */

static proj_view proj(const void *base, int64_t expert_stride, int64_t offset, int64_t n_stride, int64_t k_stride) {
    proj_view p = {base, NULL, expert_stride, offset, n_stride, k_stride};
    return p;
}

static bias_view bias(const moex_tensor *t, int64_t offset, int64_t n_stride) {
    bias_view b = {NULL, 0, 0, 0};
    if (!moex_tensor_present(t)) return b;
    b.base = t->data;
    b.expert_stride = t->strides[0];
    b.offset = offset;
    b.n_stride = n_stride;
    return b;
}

static layer_view make_view(const moex_experts_desc *d, const void *const *dev_ptrs) {
    layer_view L;
    memset(&L, 0, sizeof L);
    const int64_t E = d->num_experts, H = d->hidden, I = d->intermediate, R = d->gated ? 2 * I : I;
    L.E = E, L.H = H, L.I = I, L.k = d->top_k;
    L.gated = d->gated, L.act = d->activation, L.alpha = d->alpha, L.limit = d->limit;
    L.wdt = moex_weight_dtype(d);
    /* biases share one dtype (moex_layer_create): the weights' for float layers */
    L.bdt = moex_tensor_present(&d->gate_up_bias) ? d->gate_up_bias.dtype
            : moex_tensor_present(&d->down_bias)  ? d->down_bias.dtype
                                                  : L.wdt;
    const int il = d->gated && d->interleaved, tr = d->transposed;
    if (dev_ptrs) { /* per-expert: gate/up [I, H] (transposed [H, I]), down [H, I] (transposed [I, H]) */
        proj_view in = tr ? proj(NULL, 0, 0, 1, I) : proj(NULL, 0, 0, H, 1);
        L.gate = L.up = in;
        L.gate.ptrs = dev_ptrs, L.up.ptrs = dev_ptrs + E;
        L.down = tr ? proj(NULL, 0, 0, 1, H) : proj(NULL, 0, 0, I, 1);
        L.down.ptrs = dev_ptrs + 2 * E;
        if (!d->gated) L.gate = L.up;
    } else {
        const void *gu = d->gate_up.data;
        /* element (row r of the HF [R, H] matrix, input k): r*H + k, transposed: k*R + r. FP4 (never
         * transposed): in bytes, two inputs a byte, so rows of H/2 and I/2 */
        const int64_t q = L.wdt == MOEX_E2M1X2 ? 2 : 1, Hq = H / q, Iq = I / q;
        const int64_t rs = tr ? 1 : Hq, ks = tr ? R : 1, ES = R * Hq;
        L.gate = proj(gu, ES, 0, il ? 2 * rs : rs, ks);
        L.up = proj(gu, ES, d->gated ? (il ? rs : I * rs) : 0, il ? 2 * rs : rs, ks);
        if (!d->gated) L.gate = L.up;
        L.down = tr ? proj(d->down.data, I * H, 0, 1, H) : proj(d->down.data, Iq * H, 0, Iq, 1);
    }
    L.gate_bias = bias(&d->gate_up_bias, 0, il ? 2 : 1);
    L.up_bias = bias(&d->gate_up_bias, d->gated ? (il ? 1 : I) : 0, il ? 2 : 1);
    if (!d->gated) L.gate_bias = L.up_bias;
    L.down_bias = bias(&d->down_bias, 0, 1);
    return L;
}

/* The scales of an FP8 or FP4 layer (stacked, quant_supports): grids [E, ceil(rows/bn), ceil(in/bk)]. */
static quant_view make_quant_view(const moex_experts_desc *d) {
    quant_view q;
    memset(&q, 0, sizeof q);
    if (!moex_is_quant_dtype(moex_weight_dtype(d))) return q;
    const int il = d->gated && d->interleaved;
    const int64_t *gs = d->gate_up_scale.strides, *ds = d->down_scale.strides, rstep = il ? 2 : 1;
    q.on = 1, q.sdt = d->gate_up_scale.dtype, q.bn = d->block_n, q.bk = d->block_k;
    const scale_view gate = {d->gate_up_scale.data, gs[0], 0, rstep, gs[1]};
    const scale_view up = {d->gate_up_scale.data, gs[0], d->gated ? (il ? 1 : d->intermediate) : 0, rstep, gs[1]};
    const scale_view down = {d->down_scale.data, ds[0], 0, 1, ds[1]};
    q.gate = d->gated ? gate : up, q.up = up, q.down = down;
    return q;
}

static moex_status prepare(cuda_kind kind, moex_context *ctx, const moex_experts_desc *d, void **state) {
    moex_context_options o;
    moex_status st = moex_context_get_options(ctx, &o);
    if (st) return st;
    const int dev = o.device.index;
    st = moex_cuda_use(dev);
    if (st) return st;
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_prepare: out of memory");
    s->device = dev;
    if ((st = moex_cuda_status(cudaDeviceGetAttribute(&s->num_sms, cudaDevAttrMultiProcessorCount, dev),
                               "cudaDeviceGetAttribute"))) {
        free(s);
        return st;
    }
    if (d->expert_up) { /* the E-pointer arrays, uploaded once: gate | up | down */
        const int64_t E = d->num_experts;
        const void **host = (const void **)malloc((size_t)(3 * E) * sizeof(void *));
        if (!host) {
            free(s);
            return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_prepare: out of memory");
        }
        for (int64_t e = 0; e < E; e++) {
            host[e] = d->gated ? d->expert_gate[e] : d->expert_up[e];
            host[E + e] = d->expert_up[e];
            host[2 * E + e] = d->expert_down[e];
        }
        st = moex_cuda_alloc(dev, (size_t)(3 * E) * sizeof(void *), &s->ptrs);
        if (!st) st = moex_cuda_memcpy(s->ptrs, dev, host, -1, (size_t)(3 * E) * sizeof(void *));
        free(host);
        if (st) {
            moex_cuda_free(dev, s->ptrs);
            free(s);
            return st;
        }
    }
    s->L = make_view(d, (const void *const *)s->ptrs);
    s->Q = make_quant_view(d);
    char why[160];
    s->tc = kind != CUDA_BATCHED_MM && tc_layout(d, why, sizeof why);
    if (kind == CUDA_DEEPGEMM) {
        int major = 0, minor = 0;
        st = moex_cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
        if (!st) st = moex_cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                                       "cudaDeviceGetAttribute");
        if (st) {
            moex_cuda_free(dev, s->ptrs);
            free(s);
            return st;
        }
        s->cc = 10 * major + minor;
        s->scale_cc = deepgemm_scale_cc(s->cc);
        s->masked_max = deepgemm_masked_max_tokens();
    }
    s->epi = gate_up_epilogue(d);
    /* gemv_mma_usable's first condition */
    const int mma_dtype = s->L.wdt == MOEX_BF16 || s->L.wdt == MOEX_F16 || s->L.wdt == MOEX_E4M3;
    if ((kind == CUDA_GROUPED_MM && mma_dtype && (st = gemv_mma_init())) || (s->tc && (st = grouped_gemm_init()))) {
        moex_cuda_free(dev, s->ptrs);
        free(s);
        return st;
    }
    *state = s;
    return MOEX_OK;
}

static void release(void *state) {
    cuda_state *s = (cuda_state *)state;
    if (!s) return;
    if (s->ptrs) moex_cuda_free(s->device, s->ptrs);
    free(s);
}

/* ---- workspace ------------------------------------------------------------------ */

/* Bytes of the streamed path for P pairs: h [P, I] and y [P, H] in f32. */
static size_t gemv_bytes(const moex_experts_desc *d, int64_t P, int with_y) {
    return align256((size_t)P * d->intermediate * 4) + (with_y ? align256((size_t)P * d->hidden * 4) : 0);
}

/* The rows of batched_mm's y [rows, H] f32 for the down per pair of long rows
 * (gemv_down_pair_rows_pays), which runs up to PAIR_ROWS_MAX_TOKENS tokens: 0 for layers that
 * never take it. */
static int64_t pair_rows_y_rows(const moex_experts_desc *d, int64_t T) {
    const int64_t t = T < PAIR_ROWS_MAX_TOKENS ? T : PAIR_ROWS_MAX_TOKENS;
    return gemv_down_pair_rows_pays(d->hidden, 1) ? t * d->top_k : 0;
}

/* Bytes of sonicmoe's fused path: h [P, I] and y [P, H] in the weights' dtype (each slot's
 * routing weight is the routing's slot_w). */
static size_t sonic_bytes(const moex_experts_desc *d, int64_t P) {
    const size_t es = esize(moex_weight_dtype(d));
    return align256((size_t)P * d->intermediate * es) + align256((size_t)P * d->hidden * es);
}

/* Bytes of the tensor-core path: the gathered activations A [P, H] before sonic_bytes' h and y. */
static size_t tc_bytes(const moex_experts_desc *d, int64_t P) {
    return align256((size_t)P * d->hidden * esize(moex_weight_dtype(d))) + sonic_bytes(d, P);
}

/* Quantized carves of a forward of T tokens (P pairs): FP8 batched_mm xf [T, H] f32 (the quantized
 * inputs), h [P, I] f32, y [pair_rows_y_rows, H] f32; FP8 grouped_mm xq [P, H] codes, xs
 * [P, ceil(H/bk)] (the streamed forward uses T rows of them, by token; the GEMM P, in expert
 * order), h [P, I] f32, hq [P, I],
 * hs [P, ceil(I/bk)], y [P, H] f32, after the routing arrays; FP4 xq [T, H] int8 codes, xs
 * [T, H/32], h [P, I] f32, hq [P, I] codes, hs [P, I/32], and for grouped_mm y [P, H] f32. */
typedef struct quant_ws {
    float *xf, *h, *xs, *hs, *y;
    uint8_t *xq, *hq;
    size_t bytes;
} quant_ws;

static quant_ws quant_carve(cuda_kind kind, const moex_experts_desc *d, int64_t T, int64_t P, char *base) {
    quant_ws w;
    memset(&w, 0, sizeof w);
    const int64_t H = d->hidden, I = d->intermediate, bk = d->block_k;
    size_t at = 0;
#define CARVE(field, type, count) (w.field = (type *)(base ? base + at : NULL), at += align256((size_t)(count) * sizeof(type)))
    if (moex_weight_dtype(d) == MOEX_E2M1X2) {
        CARVE(xq, uint8_t, T * H);
        CARVE(xs, float, T * (H / 32));
        CARVE(h, float, P * I);
        CARVE(hq, uint8_t, P * I);
        CARVE(hs, float, P * (I / 32));
        if (kind != CUDA_BATCHED_MM) CARVE(y, float, P * H);
    } else if (kind == CUDA_BATCHED_MM) {
        CARVE(xf, float, T * H);
        CARVE(h, float, P * I);
        if (pair_rows_y_rows(d, T)) CARVE(y, float, pair_rows_y_rows(d, T) * H);
    } else {
        CARVE(xq, uint8_t, P * H);
        CARVE(xs, float, P * ((H + bk - 1) / bk));
        CARVE(h, float, P * I);
        CARVE(hq, uint8_t, P * I);
        CARVE(hs, float, P * ((I + bk - 1) / bk));
        CARVE(y, float, P * H);
    }
#undef CARVE
    w.bytes = at;
    return w;
}

/* deepgemm's rows (the slots its layout spans) in a forward of T tokens with tiles of tile_rows:
 * E x T masked, deepgemm_contiguous_rows_bound otherwise; -1 past what int slots hold. */
static int64_t deepgemm_rows(const moex_experts_desc *d, int64_t T, int masked, int tile_rows) {
    int64_t rows;
    if (masked) {
        if (!moex_mul_ok(d->num_experts, T, &rows)) return -1;
    } else {
        rows = deepgemm_contiguous_rows_bound(T * d->top_k, d->num_experts, tile_rows);
    }
    return rows > INT32_MAX ? -1 : rows;
}

/* Its buffers for that many rows: the gathered activations, h and y (FP8: quant_carve's). */
static size_t deepgemm_buffer_bytes(const moex_experts_desc *d, int64_t T, int64_t rows) {
    return moex_is_quant_dtype(moex_weight_dtype(d)) ? quant_carve(CUDA_GROUPED_MM, d, T, rows, NULL).bytes
                                                     : tc_bytes(d, rows);
}

static size_t workspace_bytes(cuda_kind kind, const moex_experts_desc *d, int64_t max_tokens) {
    int64_t P;
    if (!moex_mul_ok(max_tokens, d->top_k, &P) || P > INT32_MAX) return SIZE_MAX;
    if (kind == CUDA_DEEPGEMM) { /* the larger of the two layouts' rows, each at its largest T */
        const int64_t mt = deepgemm_masked_max_tokens(), tm = max_tokens < mt ? max_tokens : mt;
        const int64_t contiguous = deepgemm_rows(d, max_tokens, 0, GEMM_TILE_ROWS), masked = deepgemm_rows(d, tm, 1, 0);
        if (contiguous < 0 || masked < 0) return SIZE_MAX;
        return align256(routing_bytes(d->num_experts, P)) +
               deepgemm_buffer_bytes(d, max_tokens, contiguous > masked ? contiguous : masked);
    }
    if (kind == CUDA_SONICMOE) /* no gathered copy: h [P, I] and y [P, H] */
        return align256(routing_bytes(d->num_experts, P)) + sonic_bytes(d, P);
    /* every product below stays far inside size_t once P < 2^31 and the layer's sizes validated */
    if (moex_is_quant_dtype(moex_weight_dtype(d)))
        return (kind == CUDA_BATCHED_MM ? 0 : align256(routing_bytes(d->num_experts, P))) +
               quant_carve(kind, d, max_tokens, P, NULL).bytes;
    if (kind == CUDA_BATCHED_MM) /* h, then y for the long rows' down per pair */
        return gemv_bytes(d, P, 0) + align256((size_t)pair_rows_y_rows(d, max_tokens) * d->hidden * 4);
    char why[160];
    const int tc = tc_layout(d, why, sizeof why);
    /* the streamed path runs only below the tensor-core crossover, so its buffers stop there */
    const int64_t small = tc ? grouped_gemm_streamed_rows_max(P, d->num_experts) : P;
    /* the streamed forward on tensor cores: its split items' partial sums after h and y */
    const int split = moex_weight_dtype(d) == MOEX_BF16 || moex_weight_dtype(d) == MOEX_F16;
    size_t path = gemv_bytes(d, small, 1) + (split ? align256(mma_split_bytes(small, d->intermediate, d->gated)) : 0);
    if (tc && tc_bytes(d, P) > path) path = tc_bytes(d, P);
    return align256(routing_bytes(d->num_experts, P)) + path;
}

/* ---- forwards ---------------------------------------------------------------------- */

typedef struct fwd {
    const moex_forward_args *a;
    const cuda_state *s;
    cudaStream_t stream;
    int64_t T, k, E, P;
    gemv_groups G;
} fwd;

static moex_status fwd_begin(const moex_forward_args *a, fwd *out) {
    fwd f;
    memset(&f, 0, sizeof f);
    void *stream;
    moex_status st = moex_context_stream(a->ctx, &stream);
    if (!st) st = moex_context_status_word(a->ctx, &f.G.flags);
    if (st) return st;
    f.a = a;
    f.s = (const cuda_state *)a->state;
    f.stream = (cudaStream_t)stream;
    f.T = a->tokens, f.k = a->layer->top_k, f.E = a->layer->num_experts, f.P = f.T * f.k;
    f.G.ids = a->ids->data;
    f.G.ids64 = a->ids->dtype == MOEX_I64;
    f.G.ids_ld = a->ids->strides[0];
    f.G.T = f.T, f.G.k = f.k;
    *out = f;
    return MOEX_OK;
}

/* batched_mm's down per pair of long rows (gemv_down_pair_rows_pays) into y, each row weighted,
 * then the sum over each token's pairs in j order (routing_reduce, y in pair order). */
static moex_status pair_rows_down(fwd *f, const float *h, float *y) {
    const moex_forward_args *a = f->a;
    moex_status st = gemv_down_pair_rows(f->s->L, f->s->Q, f->G, h, a->weights->data, a->weights->dtype,
                                         a->weights->strides[0], y, f->stream);
    if (st) return st;
    return routing_reduce(NULL, y, MOEX_F32, f->s->L.H, NULL, MOEX_F32, 0, f->T, f->k, a->out->data, a->out->dtype,
                          a->out->strides[0], f->stream);
}

/* batched_mm, FP8: x quantized (f32 code * scale), gate/up per pair, h quantized in place, down;
 * each kernel after the first a programmatic dependent of the one before (its blocks start as
 * that one ends: at one token the four launches' gaps are a large part of the time). */
static moex_status batched_fp8_forward(fwd *f) {
    const moex_forward_args *a = f->a;
    const layer_view &L = f->s->L;
    const quant_view &Q = f->s->Q;
    const quant_ws w = quant_carve(CUDA_BATCHED_MM, a->layer, f->T, f->P, (char *)a->workspace);
    moex_status st = act_quant_e4m3(a->hidden->data, a->hidden->dtype, a->hidden->strides[0], f->T, L.H, Q.bk, NULL,
                                    NULL, w.xf, 0, f->stream);
    if (!st) st = gemv_gate_up_fp8(L, Q, f->G, w.xf, w.h, f->stream);
    if (!st) st = act_quant_e4m3(w.h, MOEX_F32, L.I, f->P, L.I, Q.bk, NULL, NULL, w.h, 1, f->stream);
    if (st) return st;
    if (gemv_down_pair_rows_pays(L.H, f->T)) return pair_rows_down(f, w.h, w.y);
    return gemv_down_pairs_fp8(L, Q, f->G, w.h, a->weights->data, a->weights->dtype, a->weights->strides[0],
                               a->out->data, a->out->dtype, a->out->strides[0], f->stream);
}

/* FP4, both backends: x quantized by token (int8 codes and block scales), gate/up (per pair, or
 * per expert on its slots' rows), h quantized (all P rows: slots past the last pair are scratch),
 * down (per pair with the weighted sum; or per expert into y in slot order, then the reduction
 * in token order). r: grouped_mm's routing, NULL for batched_mm. */
static moex_status fp4_forward(fwd *f, const routing_dev *r, char *ws) {
    const moex_forward_args *a = f->a;
    const layer_view &L = f->s->L;
    const quant_view &Q = f->s->Q;
    const quant_ws w = quant_carve(r ? CUDA_GROUPED_MM : CUDA_BATCHED_MM, a->layer, f->T, f->P, ws);
    int8_t *xq = (int8_t *)w.xq, *hq = (int8_t *)w.hq;
    if (r) { /* a group per expert with rows: at most P of them */
        f->G.pairs = 0;
        f->G.offsets = r->offsets, f->G.slot_token = r->slot_token;
        f->G.hit = r->hit, f->G.n_hit = r->mtile_off + f->E;
        f->G.e_begin = 0, f->G.count = f->E < f->P ? f->E : f->P;
    }
    moex_status st = act_quant_e2m1(a->hidden->data, a->hidden->dtype, a->hidden->strides[0], f->T, L.H, xq, w.xs,
                                    f->stream);
    if (st) return st;
    if (r && gemv_fp4_mma_pays(f->P, f->E)) {
        st = gemv_mma_experts_fp4(L, Q, f->G, xq, w.xs, w.h, hq, w.hs, w.y, f->P, f->stream);
    } else {
        st = gemv_gate_up_fp4(L, Q, f->G, xq, w.xs, w.h, f->stream);
        if (!st) st = act_quant_e2m1(w.h, MOEX_F32, L.I, f->P, L.I, hq, w.hs, f->stream);
        if (st) return st;
        if (!r)
            return gemv_down_pairs_fp4(L, Q, f->G, hq, w.hs, a->weights->data, a->weights->dtype, a->weights->strides[0],
                                       a->out->data, a->out->dtype, a->out->strides[0], f->stream);
        st = gemv_down_experts_fp4(L, Q, f->G, hq, w.hs, w.y, f->stream);
    }
    if (st) return st;
    return routing_reduce(r->pair_slot, w.y, MOEX_F32, L.H, a->weights->data, a->weights->dtype, a->weights->strides[0],
                          f->T, f->k, a->out->data, a->out->dtype, a->out->strides[0], f->stream);
}

static moex_status batched_forward(fwd *f) {
    const moex_forward_args *a = f->a;
    f->G.pairs = 1;
    f->G.count = f->P;
    if (f->s->L.wdt == MOEX_E2M1X2) return fp4_forward(f, NULL, (char *)a->workspace);
    if (f->s->Q.on) return batched_fp8_forward(f);
    float *h = (float *)a->workspace;
    moex_status st = gemv_gate_up(f->s->L, f->G, a->hidden->data, a->hidden->dtype, a->hidden->strides[0], h, f->stream);
    if (st) return st;
    if (gemv_down_pair_rows_pays(f->s->L.H, f->T) && gemv_vectorizable(f->s->L, esize(f->s->L.wdt)))
        return pair_rows_down(f, h, (float *)((char *)a->workspace + align256((size_t)f->P * f->s->L.I * 4)));
    return gemv_down_pairs(f->s->L, f->G, h, a->weights->data, a->weights->dtype, a->weights->strides[0], a->out->data,
                           a->out->dtype, a->out->strides[0], f->stream);
}

/* One grouped GEMM: the library's kernel (grouped_mm, eager), deepgemm's compiled for the shape
 * at its first use (gemm_jit.h), or grouped_mm's decode GEMM (decode: grouped_gemm_decode_pays). */
static moex_status run_gemm(const cuda_state *s, const grouped_gemm_args *g, int compiled, int decode,
                            cudaStream_t stream) {
    if (decode) return grouped_gemm_decode_run(g, s->num_sms, stream);
    if (!compiled) return grouped_gemm_run(g, s->num_sms, stream);
    gemm_rtc_spec spec;
    moex_jit_kernel k;
    moex_status st = grouped_gemm_spec(g, &spec);
    if (!st) st = gemm_jit_kernel(s->device, s->cc, &spec, grouped_gemm_smem_bytes(&spec), NULL, &k);
    if (!st) st = grouped_gemm_run_kernel(g, &k, s->num_sms, stream);
    return st;
}

/* The grouped GEMM path, after the routing (tiles of GEMM_TILE_ROWS, or GEMM_NARROW_ROWS when
 * narrow), over buffers of `rows` rows (the span of the routing's layout: P packed): bf16/f16,
 * the hidden rows gathered in expert order (converted to the weights' dtype), the gate/up GEMM
 * with the activation, the down GEMM (per_expert: both once per expert, eager), the reduction;
 * FP8, x quantized into its pairs' rows, the gate/up GEMM (h in f32, then quantized on its pairs'
 * rows; narrow tiles, deepgemm's compiled wide ones and long k-loops: quantized in its epilogue,
 * grouped_gemm_fp8_h_in_epilogue), the down GEMM (y in f32), the reduction (FP8
 * layers run once for all experts, eager too). compiled and decode: run_gemm's (decode: the
 * routing's tiles of GEMM_DECODE_ROWS, not narrow; FP8 h quantized in the gate/up epilogue).
 * fused (sonicmoe; bf16/f16,
 * packed routing, hidden in the weights' dtype): no gather, the gate/up GEMM reads its rows of
 * the hidden states by slot_token; the down GEMM multiplies each row by its pair's routing
 * weight, so the reduction sums (sonic_bytes' buffers). Narrow tiles with the library's kernels
 * and one launch each (not eager's bf16/f16 per-expert ones): the two GEMMs chained
 * (grouped_gemm_run_chained, its counters in the routing's sched), or for sonicmoe in one kernel
 * (grouped_gemm_run_pair) where grouped_gemm_pair_pays. */
static moex_status gemm_path(fwd *f, const routing_dev &r, char *ws, int64_t rows, int narrow, int per_expert,
                             int compiled, int fused, int decode) {
    const moex_forward_args *a = f->a;
    const moex_experts_desc *d = a->layer;
    const cuda_state *s = f->s;
    const layer_view &L = s->L;
    grouped_gemm_args up;
    memset(&up, 0, sizeof up);
    up.a_rows = rows, up.pairs = f->P;
    up.offsets = r.offsets, up.ends = r.ends, up.mtile_off = r.mtile_off;
    up.e_begin = 0, up.e_end = f->E;
    up.L = L, up.narrow = narrow, up.epi = s->epi;
    up.b = d->gate_up.data, up.rows_per_expert = d->gated ? 2 * L.I : L.I, up.up_offset = L.I;
    up.K = L.H, up.N = L.I;
    grouped_gemm_args down = up;
    down.b = d->down.data, down.rows_per_expert = L.H, down.up_offset = 0;
    down.K = L.I, down.N = L.H, down.epi = EPI_DOWN;
    const void *y;
    moex_dtype ydt;
    moex_status st = MOEX_OK;
    if (s->Q.on) {
        const quant_view &Q = s->Q;
        const quant_ws w = quant_carve(CUDA_GROUPED_MM, d, f->T, rows, ws);
        up.dt = down.dt = MOEX_E4M3, up.q = down.q = Q;
        up.a = w.xq, up.a_scales = w.xs, up.c = w.h;
        down.a = w.hq, down.a_scales = w.hs, down.c = w.y;
        /* h quantized by the gate/up GEMM's epilogue, or written in f32 and quantized after it */
        const bool h_in_epilogue = decode || grouped_gemm_fp8_h_in_epilogue(narrow, compiled, s->epi, Q.bk, L.H);
        if (h_in_epilogue) up.c_codes = w.hq, up.c_scales = w.hs;
        if ((st = act_quant_gather_e4m3(r.pair_slot, f->T, f->k, a->hidden->data, a->hidden->dtype,
                                        a->hidden->strides[0], L.H, Q.bk, w.xq, w.xs, f->stream)))
            return st;
        if (!compiled && narrow && h_in_epilogue) { /* narrow tiles: the two GEMMs chained, as bf16's below */
            if ((st = grouped_gemm_run_chained(&up, &down, r.sched, s->num_sms, f->stream))) return st;
        } else if ((st = run_gemm(s, &up, compiled, decode, f->stream)) ||
                   (!h_in_epilogue && (st = act_quant_slots_e4m3(r.pair_slot, f->P, w.h, MOEX_F32, L.I, L.I, Q.bk,
                                                                 w.hq, w.hs, f->stream))) ||
                   (st = run_gemm(s, &down, compiled, decode, f->stream))) {
            return st;
        }
        y = w.y, ydt = MOEX_F32;
    } else {
        const size_t es = esize(L.wdt);
        char *xa = ws, *hb = fused ? ws : ws + align256((size_t)rows * L.H * es);
        char *yb = hb + align256((size_t)rows * L.I * es);
        up.dt = down.dt = L.wdt;
        up.a = xa, up.c = hb;
        down.a = hb, down.c = yb;
        /* both projections in one launch where h fits in shared memory, A gathered by index: sonicmoe,
         * and grouped_mm where the hidden states can be read where they are (the weights' dtype,
         * 16-byte aligned rows; no gathered copy, the same values: bit for bit its chained GEMMs'),
         * its y not weighted (the reduction applies the routing weights as before) */
        const moex_tensor *x = a->hidden;
        const int pair = !compiled && !per_expert && narrow &&
                         grouped_gemm_pair_pays(narrow, 1, s->epi, L, f->P, s->num_sms);
        const int in_place = pair && !fused && x->dtype == L.wdt && ((uintptr_t)x->data & 15) == 0 &&
                             (x->strides[0] * 2) % 16 == 0;
        if (fused || in_place) up.a = x->data, up.a_rows = f->T, up.a_ld = x->strides[0], up.a_index = r.slot_token;
        if (fused) {
            down.row_scale = r.slot_w;
            st = routing_slot_weights(r.pair_slot, a->weights->data, a->weights->dtype, a->weights->strides[0], f->T,
                                      f->k, r.slot_w, f->stream);
        } else if (!in_place) {
            st = routing_gather(r, f->T, f->k, a->hidden->data, a->hidden->dtype, a->hidden->strides[0], xa, L.wdt, L.H,
                                f->stream);
        }
        if (st) return st;
        if (!compiled && !per_expert && narrow) {
            if (pair && (fused || in_place))
                st = grouped_gemm_run_pair(&up, &down, r.sched, s->num_sms, f->stream);
            else
                st = grouped_gemm_run_chained(&up, &down, r.sched, s->num_sms, f->stream);
            if (st) return st;
        }
        for (int64_t e = 0; (compiled || per_expert || !narrow) && e < (per_expert ? f->E : 1); e++) {
            up.e_begin = down.e_begin = per_expert ? e : 0;
            up.e_end = down.e_end = per_expert ? e + 1 : f->E;
            if ((st = run_gemm(s, &up, compiled, decode, f->stream)) ||
                (st = run_gemm(s, &down, compiled, decode, f->stream)))
                return st;
        }
        y = yb, ydt = L.wdt;
    }
    return routing_reduce(r.pair_slot, y, ydt, L.H, fused ? NULL : a->weights->data, a->weights->dtype,
                          a->weights->strides[0], f->T, f->k, a->out->data, a->out->dtype, a->out->strides[0], f->stream);
}

/* Routing, then the per-expert pieces for experts [e_begin, e_end) in `launches` launches
 * (1 for grouped_mm, one per expert for eager), then the reduction. */
static moex_status experts_forward(fwd *f, int per_expert) {
    const moex_forward_args *a = f->a;
    const cuda_state *s = f->s;
    const layer_view &L = s->L;
    char *ws = (char *)a->workspace;
    routing_dev r = routing_carve(ws, f->E, f->P);
    ws += align256(routing_bytes(f->E, f->P));
    const int tc = s->tc && (s->Q.on ? grouped_gemm_fp8_pays(f->P, f->E) : grouped_gemm_pays(f->P, f->E, L.H, per_expert));
    /* experts of fewer rows: the decode GEMMs, one launch each for all experts */
    const int decode = s->tc && !per_expert && grouped_gemm_decode_pays(L, s->Q, s->epi, f->P, f->E);
    /* narrow tiles for experts of few rows: the routing counts tiles of their size */
    const int narrow = tc && grouped_gemm_narrow_pays(f->P, f->E, s->epi);
    /* eager launches one expert at a time: too few blocks for the tensor-core kernels' 16-row warps */
    const int mma = !tc && !decode && !per_expert && gemv_mma_usable(L, s->Q, a->hidden->dtype, a->hidden->data, a->hidden->strides[0]);
    /* the streamed forwards on tensor cores and FP4's kernels walk the list of experts with rows */
    const int hits = mma || L.wdt == MOEX_E2M1X2;
    moex_status st = routing_build(r, f->G.ids, f->G.ids64, f->G.ids_ld, f->T, f->k, f->E,
                                   decode ? GEMM_DECODE_ROWS : narrow ? GEMM_NARROW_ROWS : GEMM_TILE_ROWS, hits,
                                   ROUTING_PACKED, 0, f->G.flags, f->stream);
    if (st) return st;
    const int launches = per_expert ? (int)f->E : 1;
    if (L.wdt == MOEX_E2M1X2) return fp4_forward(f, &r, ws);
    if (tc || decode) return gemm_path(f, r, ws, f->P, narrow, per_expert, 0, 0, decode);
    float *h = (float *)ws, *y = (float *)(ws + align256((size_t)f->P * L.I * 4));
    f->G.pairs = 0;
    f->G.offsets = r.offsets, f->G.slot_token = r.slot_token;
    f->G.count = per_expert ? 1 : f->E;
    mma_io io;
    memset(&io, 0, sizeof io);
    io.x = a->hidden->data, io.xdt = a->hidden->dtype, io.x_ld = a->hidden->strides[0];
    io.h = h, io.y = y;
    /* bf16/f16, few pairs: room for split gate/up items' partial sums (workspace_bytes) */
    if (mma && !s->Q.on && f->P <= MMA_SPLIT_PAIRS) io.part = (float *)((char *)y + align256((size_t)f->P * L.H * 4));
    if (s->Q.on) { /* FP8: the quantized activations' buffers too */
        io.q = s->Q;
        const quant_ws w = quant_carve(CUDA_GROUPED_MM, a->layer, f->T, f->P, ws);
        io.h = w.h, io.y = y = w.y, io.xq = w.xq, io.xs = w.xs, io.hq = w.hq, io.hs = w.hs;
    }
    if (mma)
        st = gemv_mma_experts(L, f->G, r.hit, r.mtile_off + f->E, r.sched, io, s->num_sms, f->stream);
    else if (s->Q.on)
        st = moex_fail(MOEX_ERR_INTERNAL, "grouped_mm: an FP8 layer its streamed kernel does not take");
    for (int i = 0; !mma && !st && i < launches; i++) {
        f->G.e_begin = per_expert ? i : 0;
        st = gemv_gate_up(L, f->G, a->hidden->data, a->hidden->dtype, a->hidden->strides[0], h, f->stream);
        if (!st) st = gemv_down_experts(L, f->G, h, y, f->stream);
    }
    if (st) return st;
    return routing_reduce(r.pair_slot, y, MOEX_F32, L.H, a->weights->data, a->weights->dtype, a->weights->strides[0],
                          f->T, f->k, a->out->data, a->out->dtype, a->out->strides[0], f->stream);
}

/* deepgemm: routing into the masked layout (T <= deepgemm_masked_max_tokens()) or the padded
 * contiguous one, then grouped_mm's GEMM path with the GEMMs compiled for the shape. */
static moex_status deepgemm_forward(fwd *f) {
    const moex_forward_args *a = f->a;
    const moex_experts_desc *d = a->layer;
    const cuda_state *s = f->s;
    if (s->Q.on && s->scale_cc >= 100 && s->Q.sdt != MOEX_UE8M0)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "deepgemm on SM100+ (compute capability %d.%d) takes power-of-two UE8M0 "
                         "expert scales; this layer's are %s (a checkpoint's scale_fmt \"float\"): grouped_mm and "
                         "batched_mm run float32 scales", s->scale_cc / 10, s->scale_cc % 10, moex_dtype_name(s->Q.sdt));
    const size_t routing = align256(routing_bytes(f->E, f->P));
    routing_dev r = routing_carve(a->workspace, f->E, f->P);
    const int narrow = grouped_gemm_narrow_pays(f->P, f->E, s->epi), tile = narrow ? GEMM_NARROW_ROWS : GEMM_TILE_ROWS;
    /* the bound read when the layer was prepared, the one its workspace was sized for */
    const int masked = f->T <= s->masked_max;
    const int64_t rows = deepgemm_rows(d, f->T, masked, tile);
    if (rows < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "deepgemm: %lld tokens take more rows than int slots hold",
                                   (long long)f->T);
    moex_status st = routing_build(r, f->G.ids, f->G.ids64, f->G.ids_ld, f->T, f->k, f->E, tile, 0,
                                   masked ? ROUTING_MASKED : ROUTING_PADDED, f->T, f->G.flags, f->stream);
    if (st) return st;
    return gemm_path(f, r, (char *)a->workspace + routing, rows, narrow, 0, 1, 0, 0);
}

/* sonicmoe: packed routing (tiles by grouped_gemm_narrow_pays, as grouped_mm's), then the fused
 * GEMM path at every token count. Its gate/up GEMM reads the hidden states where they are, so
 * they must be in the weights' dtype with 16-byte aligned rows. */
static moex_status sonicmoe_forward(fwd *f) {
    const moex_forward_args *a = f->a;
    const cuda_state *s = f->s;
    const moex_tensor *x = a->hidden;
    if (x->dtype != s->L.wdt)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "sonicmoe reads the hidden states inside its gate/up GEMM, so they must "
                         "be %s like the experts' weights; got %s (grouped_mm converts them)",
                         moex_dtype_name(s->L.wdt), moex_dtype_name(x->dtype));
    if (((uintptr_t)x->data & 15) || (x->strides[0] * 2) % 16)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "sonicmoe reads the hidden states in 16-byte pieces: their rows must "
                         "start 16-byte aligned (row stride %lld elements; grouped_mm takes any)",
                         (long long)x->strides[0]);
    char *ws = (char *)a->workspace;
    routing_dev r = routing_carve(ws, f->E, f->P);
    const int narrow = grouped_gemm_narrow_pays(f->P, f->E, s->epi);
    moex_status st = routing_build(r, f->G.ids, f->G.ids64, f->G.ids_ld, f->T, f->k, f->E,
                                   narrow ? GEMM_NARROW_ROWS : GEMM_TILE_ROWS, 0, ROUTING_PACKED, 0, f->G.flags,
                                   f->stream);
    if (st) return st;
    return gemm_path(f, r, ws + align256(routing_bytes(f->E, f->P)), f->P, narrow, 0, 0, 1, 0);
}

static moex_status forward(cuda_kind kind, const moex_forward_args *a) {
    const cuda_state *s = (const cuda_state *)a->state;
    if (!s) return moex_fail(MOEX_ERR_INTERNAL, "CUDA forward without a prepared state");
    moex_status st = moex_cuda_use(s->device);
    if (st) return st;
    fwd f;
    if ((st = fwd_begin(a, &f))) return st;
    if (kind == CUDA_BATCHED_MM) return batched_forward(&f);
    if (kind == CUDA_DEEPGEMM) return deepgemm_forward(&f);
    if (kind == CUDA_SONICMOE) return sonicmoe_forward(&f);
    return experts_forward(&f, kind == CUDA_EAGER);
}

/* ---- the five implementations ------------------------------------------------------ */

#define CUDA_IMPL(NAME, KIND)                                                                                      \
    static int NAME##_supports(const moex_experts_desc *d, const moex_device_info *dev, char *why, size_t n) {       \
        return cuda_supports(KIND, d, dev, why, n);                                                                \
    }                                                                                                              \
    static size_t NAME##_workspace(const moex_experts_desc *d, int64_t max_tokens, int threads) {                  \
        return workspace_bytes(KIND, d, max_tokens);                                                               \
    }                                                                                                              \
    static moex_status NAME##_prepare(moex_context *ctx, const moex_experts_desc *d, void **state) {               \
        return prepare(KIND, ctx, d, state);                                                                       \
    }                                                                                                              \
    static moex_status NAME##_forward(const moex_forward_args *a) { return forward(KIND, a); }                     \
    extern "C" const moex_impl moex_cuda_##NAME = {NAME##_supports, NAME##_workspace, NAME##_prepare, release,       \
                                                   NAME##_forward, 0};

CUDA_IMPL(eager, CUDA_EAGER)
CUDA_IMPL(batched_mm, CUDA_BATCHED_MM)
CUDA_IMPL(grouped_mm, CUDA_GROUPED_MM)
CUDA_IMPL(deepgemm, CUDA_DEEPGEMM)
CUDA_IMPL(sonicmoe, CUDA_SONICMOE)
