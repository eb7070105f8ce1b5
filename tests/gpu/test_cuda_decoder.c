/*
 * test_cuda_decoder.c — the decoder's GPU building blocks (src/decoder/cuda/decoder_api.h)
 * against their CPU twins in src/model and src/experts/router.c, on random
 * inputs of deliberately odd sizes. Plain C (no test framework).
 *
 *   - embedding (f32/f16/bf16 tables; a bad id: zero row and the status bit)
 *   - RMSNorm over rows (both kernels: warp and block per row) and per head,
 *     in place and not, f32/f16/bf16 weights
 *   - rope cos/sin, interleaved MRoPE, rope apply (whole heads, partial rotary, DeepSeek's
 *     interleaved pairs); head_dim 40/64/128
 *   - KV cache + attention: heads 5 / kv_heads 1, 8 / 2, 4 / 4 with head_dim
 *     40/64/128; several sequences of different lengths in one prefill call,
 *     then decode steps (one token per sequence, sequences in another order),
 *     a continued prefill mixed with decode, out == q, a bad descriptor (status
 *     bit, nothing written), the chunked path (a context longer than 8192), gpt_oss's sliding
 *     windows and sinks; the prefill GEMM path on each, with the least scratch and with chunks
 *     of several query tokens (a binding window; 160 heads)
 *   - the latent cache and DeepSeek-V3's absorbed attention, kernel and GEMM paths (chunks of
 *     query rows; the GEMMs in f32 and, for bf16 inputs, in bf16), prefill and decode, 600
 *     positions; kv_b's per-head products (f32, bf16)
 *   - strided row copies and the scale
 *   - the three routers with ties and NaN rows: ids exact, weights close
 *   - activations, sigmoid, gated product, shared-expert gate, adds, bias,
 *     bf16 rounding, conversion, last-row gather, row positions
 *   - argmax with ties, NaN, -inf rows, a 151936 vocabulary: exact
 *   - linear over cuBLAS: f32 (no TF32) and bf16/f16 weights, with bias; a
 *     gated MLP and qwen2_moe's shared expert composed from the pieces
 *   - a CUDA graph of linear + positions + rope + attention + argmax, replayed for
 *     several decode steps with new inputs in the same buffers
 *   - the step's two op tables (decoder/ops.h) on the same inputs: the table's
 *     own ops exact (copies, positions, last rows, argmax, adds, bf16 rounding,
 *     conversion), the shared-expert gate and a gated MLP close
 *
 * Bounds: f32 results within rtol 1e-5 of the CPU (most are bit-equal but for
 * the device's expf/erff/tanhf); GEMM-based ones also NMSE <= 1e-10 (SPEC's
 * f32 bound); ids, tokens, lengths and bf16 roundings exact.
 *
 * Usage: test_cuda_decoder [--quick] [--device N]
 *   --quick (or MOEX_GPU_TEST_QUICK=1): a small subset, for memory checkers.
 * Exit status: 0 all passed, 1 a check failed, 77 no usable CUDA device (skip).
 */
#define _POSIX_C_SOURCE 200809L
#ifndef MOEX_HAVE_CUDA
#define MOEX_HAVE_CUDA 1 /* built only with CUDA: decoder/ops.h declares the CUDA op table then */
#endif

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "gpu_harness.h"
#include "moex.h"
#include "core/gpu_runtime.h"
#include "decoder/cuda/decoder_api.h"
#include "decoder/decoder.h"
#include "decoder/ops.h"

/* ------------------------------------------------------------------------ */
/* checks                                                                    */
/* ------------------------------------------------------------------------ */

#define EXIT_SKIP 77

static int g_gpu;             /* device index */
static cudaStream_t g_stream; /* non-blocking: every call of the suite runs on it */
static int *g_flags;          /* the status word */

/* A call that must succeed; on failure report and return from the test function. */
#define MUST(call)                                                                                       \
    do {                                                                                                 \
        moex_status st_ = (call);                                                                        \
        g_checks++;                                                                                      \
        if (st_ != MOEX_OK) {                                                                            \
            fail_at(__FILE__, __LINE__, "%s: %s: %s", #call, moex_status_str(st_), moex_last_error());   \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* random numbers                                                            */
/* ------------------------------------------------------------------------ */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)((double)(rnd_u64() >> 11) * 0x1.0p-53); }

static int64_t rnd_i(int64_t n) { return (int64_t)(rnd_u64() % (uint64_t)n); }

static void fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_f(lo, hi);
}

/* ------------------------------------------------------------------------ */
/* device memory (CUDA runtime, on the suite's stream)                       */
/* ------------------------------------------------------------------------ */

static void *dmalloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fail_at(__FILE__, __LINE__, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    cudaMemsetAsync(p, 0, bytes, g_stream); /* ordered before the uploads on the same stream */
    return p;
}

static void dfree(void *p) {
    if (p) cudaFree(p);
}

static void up(void *d, const void *h, size_t bytes) {
    if (bytes == 0 || !d) return;
    cudaError_t e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, g_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) fail_at(__FILE__, __LINE__, "upload of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

static void *dup_to_dev(const void *h, size_t bytes) {
    void *d = dmalloc(bytes);
    up(d, h, bytes);
    return d;
}

static void down(void *h, const void *d, size_t bytes) {
    if (bytes == 0 || !d) return;
    cudaError_t e = cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, g_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) fail_at(__FILE__, __LINE__, "download of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

/* Wait for the stream and read-and-clear the status word: returns it (or -1 on a CUDA error). */
static int sync_flags(void) {
    int h = 0;
    cudaError_t e = cudaMemcpyAsync(&h, g_flags, sizeof h, cudaMemcpyDeviceToHost, g_stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(g_flags, 0, sizeof h, g_stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) {
        fail_at(__FILE__, __LINE__, "stream: %s", cudaGetErrorString(e));
        return -1;
    }
    return h;
}

/* ------------------------------------------------------------------------ */
/* comparisons                                                               */
/* ------------------------------------------------------------------------ */

/* NaN equals NaN; otherwise |a - b| <= atol + rtol * |b| everywhere. Reports the worst element. */
static int close_f32(const char *what, const float *gpu, const float *cpu, int64_t n, double rtol, double atol) {
    int64_t worst = -1, bad = 0;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double a = gpu[i], b = cpu[i];
        if (isnan(a) || isnan(b)) {
            if (!(isnan(a) && isnan(b))) bad++, worst = worst < 0 ? i : worst;
            continue;
        }
        if (isinf(b) || isinf(a)) {
            if (a != b) bad++, worst = worst < 0 ? i : worst;
            continue;
        }
        const double excess = fabs(a - b) - (atol + rtol * fabs(b));
        if (excess > 0) {
            bad++;
            if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
        }
    }
    g_checks++;
    if (bad) {
        fail_at(__FILE__, __LINE__, "%s: %lld of %lld values off (rtol %g, atol %g); e.g. [%lld] gpu %.9g cpu %.9g",
                what, (long long)bad, (long long)n, rtol, atol, (long long)worst, (double)gpu[worst],
                (double)cpu[worst]);
        return 0;
    }
    return 1;
}

static double nmse(const float *a, const float *b, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? num / den : num;
}

static void check_nmse(const char *what, const float *gpu, const float *cpu, int64_t n, double bound) {
    const double e = nmse(gpu, cpu, n);
    CHECK(e <= bound, "%s: NMSE %.3g > %.3g", what, e, bound);
}

static double max_abs(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return m;
}

/* x -> x rounded to dt and back */
static void round_to(float *x, int64_t n, moex_dtype dt) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == MOEX_BF16) x[i] = moex_bf16_to_f32(moex_f32_to_bf16(x[i]));
        else if (dt == MOEX_F16) x[i] = moex_f16_to_f32(moex_f32_to_f16(x[i]));
    }
}

/* f32 values -> a new host array of dt (caller frees) */
static void *encode(const float *x, int64_t n, moex_dtype dt) {
    const size_t esz = dt == MOEX_F32 ? 4 : 2;
    void *p = malloc(esz * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) moex_store_f32(p, dt, i, x[i]);
    return p;
}

static const moex_dtype FLOATS[3] = {MOEX_F32, MOEX_F16, MOEX_BF16};
static const int64_t TOKENS[3] = {1, 7, 33};
static const int64_t HEAD_DIMS[3] = {40, 64, 128};

/* ------------------------------------------------------------------------ */
/* embedding                                                                 */
/* ------------------------------------------------------------------------ */

static void test_embedding(void) {
    const int64_t V = 997;
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 3; ti++) {
            const int64_t H = ti == 2 ? 129 : 40 + 24 * ti, T = TOKENS[ti];
            float *tab = malloc(sizeof(float) * V * H);
            fill(tab, V * H, -2, 2);
            void *enc = encode(tab, V * H, FLOATS[di]);
            int64_t ids[33] = {0};
            for (int64_t t = 0; t < T; t++) ids[t] = rnd_i(V);
            ids[0] = V - 1;
            float *cpu = malloc(sizeof(float) * T * H), *gpu = malloc(sizeof(float) * T * H);
            const size_t esz = FLOATS[di] == MOEX_F32 ? 4 : 2;
            void *dtab = dup_to_dev(enc, esz * V * H), *dids = dup_to_dev(ids, sizeof ids);
            float *dout = dmalloc(sizeof(float) * T * H);
            if (moex_embedding(enc, FLOATS[di], V, H, ids, T, cpu) == MOEX_OK &&
                moex_cuda_embedding(dtab, FLOATS[di], V, H, dids, T, dout, g_flags, g_stream) == MOEX_OK) {
                CHECK(sync_flags() == 0, "embedding: status word set");
                down(gpu, dout, sizeof(float) * T * H);
                char what[96];
                snprintf(what, sizeof what, "embedding %s V=%lld H=%lld T=%lld", moex_dtype_name(FLOATS[di]),
                         (long long)V, (long long)H, (long long)T);
                close_f32(what, gpu, cpu, T * H, 0, 0);
                if (T > 1) { /* a bad id: its row zeroed, the others as before, the status bit set */
                    ids[1] = V;
                    up(dids, ids, sizeof ids);
                    moex_status st = moex_cuda_embedding(dtab, FLOATS[di], V, H, dids, T, dout, g_flags, g_stream);
                    CHECK(st == MOEX_OK, "embedding with a bad id: %s", moex_last_error());
                    CHECK(sync_flags() == MOEX_CUDA_FLAG_BAD_TOKEN, "embedding: a bad id did not set the status bit");
                    down(gpu, dout, sizeof(float) * T * H);
                    memset(cpu + H, 0, sizeof(float) * H);
                    close_f32("embedding with a bad id", gpu, cpu, T * H, 0, 0);
                }
            } else {
                fail_at(__FILE__, __LINE__, "embedding: %s", moex_last_error());
            }
            free(tab), free(enc), free(cpu), free(gpu);
            dfree(dtab), dfree(dids), dfree(dout);
        }
}

/* ------------------------------------------------------------------------ */
/* RMSNorm                                                                   */
/* ------------------------------------------------------------------------ */

static void norm_case(int heads_variant, int64_t rows_or_T, int64_t heads, int64_t n, moex_dtype wdt, int in_place) {
    const int64_t rows = heads_variant ? rows_or_T * heads : rows_or_T, total = rows * n;
    const double eps = 1e-6;
    float *x = malloc(sizeof(float) * total), *cpu = malloc(sizeof(float) * total),
          *gpu = malloc(sizeof(float) * total), *w = malloc(sizeof(float) * n);
    fill(x, total, -3, 3);
    fill(w, n, 0.5f, 1.5f);
    void *wenc = encode(w, n, wdt);
    const size_t esz = wdt == MOEX_F32 ? 4 : 2;
    float *dx = dup_to_dev(x, sizeof(float) * total), *dy = in_place ? dx : dmalloc(sizeof(float) * total);
    void *dw = dup_to_dev(wenc, esz * n);
    moex_status cs, gs;
    if (heads_variant) {
        cs = moex_rmsnorm_heads(x, rows_or_T, heads, n, wenc, wdt, eps, cpu);
        gs = moex_cuda_rmsnorm_heads(dx, rows_or_T, heads, n, dw, wdt, eps, dy, g_stream);
    } else {
        cs = moex_rmsnorm(x, rows, n, wenc, wdt, eps, cpu);
        gs = moex_cuda_rmsnorm(dx, rows, n, dw, wdt, eps, dy, g_stream);
    }
    CHECK(cs == MOEX_OK && gs == MOEX_OK, "rmsnorm: %s", moex_last_error());
    if (cs == MOEX_OK && gs == MOEX_OK) {
        sync_flags();
        down(gpu, dy, sizeof(float) * total);
        char what[128];
        snprintf(what, sizeof what, "rmsnorm%s rows=%lld heads=%lld n=%lld w=%s%s", heads_variant ? "_heads" : "",
                 (long long)rows_or_T, (long long)heads, (long long)n, moex_dtype_name(wdt),
                 in_place ? " in place" : "");
        close_f32(what, gpu, cpu, total, 5e-7, 0);
    }
    free(x), free(cpu), free(gpu), free(w), free(wenc);
    dfree(dx), dfree(in_place ? NULL : dy), dfree(dw);
}

static void test_rmsnorm(void) {
    static const int64_t NS[5] = {40, 64, 128, 2051, 4096};
    for (int ni = 0; ni < 5; ni++)
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < 3; di++) {
                if (g_quick && (di != ti || ni % 2)) continue;
                norm_case(0, TOKENS[ti], 1, NS[ni], FLOATS[di], (ni + di) % 2);
            }
    if (!g_quick) norm_case(0, 5000, 1, 1536, MOEX_BF16, 0); /* many rows of a large n: the warp kernel */
    for (int hi = 0; hi < 3; hi++)
        for (int ti = 0; ti < 3; ti++)
            for (int64_t heads = 1; heads <= 5; heads += 4) norm_case(1, TOKENS[ti], heads, HEAD_DIMS[hi], FLOATS[(hi + ti) % 3], ti == 1);
}

/* ------------------------------------------------------------------------ */
/* rotary                                                                    */
/* ------------------------------------------------------------------------ */

static void test_rope(void) {
    for (int hi = 0; hi < 3; hi++)
        for (int ti = 0; ti < 3; ti++) {
            const int64_t d = HEAD_DIMS[hi], half = d / 2, T = TOKENS[ti], heads = 5;
            float inv[64];
            MUST(moex_rope_inv_freq(d, hi == 2 ? 5000000.0 : 10000.0, inv));
            int64_t pt[33], ph[33], pw[33];
            for (int64_t t = 0; t < T; t++) pt[t] = rnd_i(40000), ph[t] = rnd_i(64), pw[t] = rnd_i(64);
            const int64_t n = T * half;
            float *cc = malloc(sizeof(float) * n), *cs = malloc(sizeof(float) * n), *gc = malloc(sizeof(float) * n),
                  *gs = malloc(sizeof(float) * n);
            float *dinv = dup_to_dev(inv, sizeof(float) * half), *dc = dmalloc(sizeof(float) * n),
                  *ds = dmalloc(sizeof(float) * n);
            int64_t *dpt = dup_to_dev(pt, sizeof pt), *dph = dup_to_dev(ph, sizeof ph), *dpw = dup_to_dev(pw, sizeof pw);
            char what[96];
            // default rope
            if (moex_rope_cos_sin(inv, d, pt, T, cc, cs) == MOEX_OK &&
                moex_cuda_rope_cos_sin(dinv, d, dpt, T, dc, ds, g_stream) == MOEX_OK) {
                sync_flags();
                down(gc, dc, sizeof(float) * n), down(gs, ds, sizeof(float) * n);
                snprintf(what, sizeof what, "rope cos d=%lld T=%lld", (long long)d, (long long)T);
                close_f32(what, gc, cc, n, 0, 1e-7);
                snprintf(what, sizeof what, "rope sin d=%lld T=%lld", (long long)d, (long long)T);
                close_f32(what, gs, cs, n, 0, 1e-7);
            } else {
                fail_at(__FILE__, __LINE__, "rope_cos_sin: %s", moex_last_error());
            }
            // interleaved mrope, sections as qwen3_vl_moe's [24, 20, 20] scaled to head_dim / 2
            const int64_t s1 = half * 20 / 64, sec[3] = {half - 2 * s1, s1, s1};
            if (moex_mrope_cos_sin(inv, d, sec, pt, ph, pw, T, cc, cs) == MOEX_OK &&
                moex_cuda_mrope_cos_sin(dinv, d, sec, dpt, dph, dpw, T, dc, ds, g_stream) == MOEX_OK) {
                sync_flags();
                down(gc, dc, sizeof(float) * n), down(gs, ds, sizeof(float) * n);
                snprintf(what, sizeof what, "mrope cos d=%lld T=%lld sec=[%lld,%lld,%lld]", (long long)d, (long long)T,
                         (long long)sec[0], (long long)sec[1], (long long)sec[2]);
                close_f32(what, gc, cc, n, 0, 1e-7);
                close_f32("mrope sin", gs, cs, n, 0, 1e-7);
            } else {
                fail_at(__FILE__, __LINE__, "mrope_cos_sin: %s", moex_last_error());
            }
            // apply with the CPU's tables on both sides (q of 5 heads)
            const int64_t nx = T * heads * d;
            float *x = malloc(sizeof(float) * nx), *gx = malloc(sizeof(float) * nx);
            fill(x, nx, -2, 2);
            float *dx = dup_to_dev(x, sizeof(float) * nx);
            up(dc, cc, sizeof(float) * n), up(ds, cs, sizeof(float) * n);
            if (moex_rope_apply(x, T, heads, d, cc, cs) == MOEX_OK &&
                moex_cuda_rope_apply(dx, T, heads, d, d, dc, ds, g_stream) == MOEX_OK) {
                sync_flags();
                down(gx, dx, sizeof(float) * nx);
                snprintf(what, sizeof what, "rope_apply d=%lld T=%lld heads=%lld", (long long)d, (long long)T,
                         (long long)heads);
                close_f32(what, gx, x, nx, 0, 0);
            } else {
                fail_at(__FILE__, __LINE__, "rope_apply: %s", moex_last_error());
            }
            // partial rotary (glm4_moe): the first rd values of each head, with the tables of rd (the first
            // rd/2 columns of cc, cs read as [T, rd/2]: a prefix of each row is not a [T, rd/2] table, so
            // both sides get the same repacked one)
            const int64_t rd = (d / 2) & ~(int64_t)1, rh = rd / 2;
            float *pc = malloc(sizeof(float) * T * rh), *ps = malloc(sizeof(float) * T * rh);
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < rh; i++) pc[t * rh + i] = cc[t * half + i], ps[t * rh + i] = cs[t * half + i];
            fill(x, nx, -2, 2);
            up(dx, x, sizeof(float) * nx), up(dc, pc, sizeof(float) * T * rh), up(ds, ps, sizeof(float) * T * rh);
            if (moex_rope_apply_partial(x, T, heads, d, rd, pc, ps) == MOEX_OK &&
                moex_cuda_rope_apply(dx, T, heads, d, rd, dc, ds, g_stream) == MOEX_OK) {
                sync_flags();
                down(gx, dx, sizeof(float) * nx);
                snprintf(what, sizeof what, "rope_apply partial %lld of d=%lld T=%lld", (long long)rd, (long long)d,
                         (long long)T);
                close_f32(what, gx, x, nx, 0, 0);
            } else {
                fail_at(__FILE__, __LINE__, "rope_apply partial: %s", moex_last_error());
            }
            // interleaved pairs (deepseek_v3's rope_interleave)
            fill(x, nx, -2, 2);
            up(dx, x, sizeof(float) * nx), up(dc, cc, sizeof(float) * n), up(ds, cs, sizeof(float) * n);
            if (moex_rope_apply_interleaved(x, T, heads, d, cc, cs) == MOEX_OK &&
                moex_cuda_rope_apply_interleaved(dx, T, heads, d, dc, ds, g_stream) == MOEX_OK) {
                sync_flags();
                down(gx, dx, sizeof(float) * nx);
                snprintf(what, sizeof what, "rope_apply_interleaved d=%lld T=%lld", (long long)d, (long long)T);
                close_f32(what, gx, x, nx, 0, 0);
            } else {
                fail_at(__FILE__, __LINE__, "rope_apply_interleaved: %s", moex_last_error());
            }
            free(pc), free(ps);
            free(cc), free(cs), free(gc), free(gs), free(x), free(gx);
            dfree(dinv), dfree(dc), dfree(ds), dfree(dpt), dfree(dph), dfree(dpw), dfree(dx);
        }
}

/* ------------------------------------------------------------------------ */
/* KV cache and attention                                                    */
/* ------------------------------------------------------------------------ */

/* The same caches on both sides and buffers for one call of up to max_rows rows. */
typedef struct attn_rig {
    int64_t layers, B, S, KV, d, heads, max_rows;
    int64_t window;                            /* gpt_oss's sliding window (0: none) */
    float *sinks, *dsinks;                     /* gpt_oss's sinks [heads] (host, device), or NULL */
    moex_kv_cache *cpu;
    moex_cuda_kv_cache gpu;
    float *q, *k, *v, *out_cpu, *out_gpu;      /* host */
    float *dq, *dk, *dv, *dout;                /* device */
    moex_attn_seq *dseqs;                      /* device descriptors */
    const moex_cuda_blas *blas;                /* non-NULL: the GEMM path (moex_cuda_attention_gemm) */
    float *dscores;                            /* its scores scratch, sf floats */
    size_t sf;
} attn_rig;

static int rig_init(attn_rig *r, int64_t layers, int64_t B, int64_t S, int64_t KV, int64_t d, int64_t heads,
                    int64_t max_rows) {
    memset(r, 0, sizeof *r);
    r->layers = layers, r->B = B, r->S = S, r->KV = KV, r->d = d, r->heads = heads, r->max_rows = max_rows;
    if (moex_kv_cache_create(layers, B, S, KV, d, &r->cpu) != MOEX_OK ||
        moex_cuda_kv_cache_create(g_gpu, layers, B, S, KV, d, &r->gpu) != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "kv cache: %s", moex_last_error());
        return 0;
    }
    const size_t qn = (size_t)(max_rows * heads * d), kn = (size_t)(max_rows * KV * d);
    r->q = malloc(sizeof(float) * qn), r->k = malloc(sizeof(float) * kn), r->v = malloc(sizeof(float) * kn);
    r->out_cpu = malloc(sizeof(float) * qn), r->out_gpu = malloc(sizeof(float) * qn);
    r->dq = dmalloc(sizeof(float) * qn), r->dk = dmalloc(sizeof(float) * kn), r->dv = dmalloc(sizeof(float) * kn);
    r->dout = dmalloc(sizeof(float) * qn);
    r->dseqs = dmalloc(sizeof(moex_attn_seq) * (size_t)B);
    return 1;
}

static void rig_free(attn_rig *r) {
    moex_kv_cache_free(r->cpu);
    moex_cuda_kv_cache_free(&r->gpu);
    free(r->q), free(r->k), free(r->v), free(r->out_cpu), free(r->out_gpu);
    dfree(r->dq), dfree(r->dk), dfree(r->dv), dfree(r->dout), dfree(r->dseqs);
    free(r->sinks), dfree(r->dsinks), dfree(r->dscores);
}

/* Every cached length of both sides agree. */
static void rig_check_lengths(attn_rig *r, const char *when) {
    const int64_t n = r->layers * r->B;
    int64_t *g = malloc(sizeof(int64_t) * (size_t)n);
    down(g, r->gpu.len, sizeof(int64_t) * (size_t)n);
    for (int64_t l = 0; l < r->layers; l++)
        for (int64_t s = 0; s < r->B; s++) {
            int64_t c = -1;
            moex_kv_cache_length(r->cpu, l, s, &c);
            CHECK(g[l * r->B + s] == c, "%s: layer %lld seq %lld: gpu length %lld, cpu %lld", when, (long long)l,
                  (long long)s, (long long)g[l * r->B + s], (long long)c);
        }
    free(g);
}

/* One call on both sides with fresh random q, k, v: out compared, lengths compared. in_place: out = q. */
static void rig_step(attn_rig *r, int64_t layer, const moex_attn_seq *seqs, int64_t nseq, int in_place,
                     const char *when) {
    int64_t total = 0;
    for (int64_t i = 0; i < nseq; i++) total += seqs[i].tokens;
    const int64_t qn = total * r->heads * r->d, kn = total * r->KV * r->d;
    fill(r->q, qn, -1.5f, 1.5f), fill(r->k, kn, -1.5f, 1.5f), fill(r->v, kn, -1, 1);
    up(r->dq, r->q, sizeof(float) * qn), up(r->dk, r->k, sizeof(float) * kn), up(r->dv, r->v, sizeof(float) * kn);
    up(r->dseqs, seqs, sizeof(moex_attn_seq) * (size_t)nseq);
    float *dout = in_place ? r->dq : r->dout;
    moex_status cs = moex_attention_forward_sinks(r->cpu, layer, seqs, nseq, r->heads, r->q, r->k, r->v, r->out_cpu, 2,
                                                  r->window, r->sinks);
    moex_status gs = r->blas ? moex_cuda_attention_gemm(r->blas, &r->gpu, layer, r->dseqs, seqs, nseq, total, r->heads,
                                                        r->dq, r->dk, r->dv, dout, r->window, r->dsinks, r->dscores,
                                                        r->sf, g_flags, g_stream)
                             : moex_cuda_attention(&r->gpu, layer, r->dseqs, nseq, total, r->heads, r->dq, r->dk, r->dv,
                                                   dout, r->window, r->dsinks, g_flags, g_stream);
    g_checks++;
    if (cs != MOEX_OK || gs != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "%s: attention: %s", when, moex_last_error());
        return;
    }
    CHECK(sync_flags() == 0, "%s: status word set", when);
    down(r->out_gpu, dout, sizeof(float) * qn);
    char what[200];
    snprintf(what, sizeof what, "attention%s %s (heads %lld, kv %lld, d %lld, %lld rows%s, window %lld%s)",
             r->blas ? " (GEMM)" : "", when, (long long)r->heads, (long long)r->KV, (long long)r->d, (long long)total,
             in_place ? ", out = q" : "", (long long)r->window, r->sinks ? ", sinks" : "");
    close_f32(what, r->out_gpu, r->out_cpu, qn, 1e-5, 1e-6);
    rig_check_lengths(r, when);
}

// window > 0 and sinks: gpt_oss's sliding window and attention sinks on every call. blas: the GEMM path
// (prefill steps) with the least scores scratch it takes (moex_cuda_attention_gemm_scratch_floats: the
// 33-token prefill in chunks of one query token, the 7-token one whole; a float less is refused before
// anything is appended), on every call but the bad descriptor's (its sizes come from the host's copy,
// which the kernels' device checks do not see).
// scratch_rows > 1: the GEMM path's scratch holds that many rows of every head (chunks of about
// 2 x scratch_rows query tokens at the 33-token prefill, whose later chunks start past a window's
// first position), and the short-scratch check is left out.
static void attention_config(int64_t heads, int64_t KV, int64_t d, int64_t window, int sinks,
                             const moex_cuda_blas *blas, int64_t scratch_rows) {
    attn_rig r;
    if (!rig_init(&r, 2, 4, 64, KV, d, heads, 64)) return;
    r.window = window;
    if (blas) {
        r.blas = blas, r.sf = moex_cuda_attention_gemm_scratch_floats(heads, r.S * (scratch_rows > 1 ? scratch_rows : 1));
        r.dscores = dmalloc(sizeof(float) * r.sf);
    }
    if (blas && scratch_rows <= 1) {
        moex_attn_seq one = {0, 1, 0};
        up(r.dseqs, &one, sizeof one);
        CHECK(moex_cuda_attention_gemm(blas, &r.gpu, 1, r.dseqs, &one, 1, 1, heads, r.dq, r.dk, r.dv, r.dout, window,
                                       NULL, r.dscores, r.sf - 1, g_flags, g_stream) == MOEX_ERR_INVALID_ARGUMENT,
              "attention (GEMM): a scores scratch of %zu floats, one short, was taken", r.sf - 1);
        CHECK(strstr(moex_last_error(), "moex_cuda_attention_gemm_scratch_floats") != NULL,
              "attention (GEMM): the short scratch's message names the size function: %s", moex_last_error());
    }
    if (sinks) {
        r.sinks = malloc(sizeof(float) * (size_t)heads);
        fill(r.sinks, heads, -1.0f, 3.0f);
        r.dsinks = dup_to_dev(r.sinks, sizeof(float) * (size_t)heads);
    }
    // prefill three sequences of different lengths in one call, in layer 1
    moex_attn_seq pre[3] = {{2, 7, 0}, {0, 1, 0}, {3, 33, 0}};
    rig_step(&r, 1, pre, 3, 0, "prefill 7+1+33");
    // decode: one token per sequence, another order, four steps
    const int steps = g_quick ? 2 : 4;
    for (int step = 0; step < steps; step++) {
        moex_attn_seq dec[3] = {{0, 1, 1 + step}, {3, 1, 33 + step}, {2, 1, 7 + step}};
        char when[64];
        snprintf(when, sizeof when, "decode step %d", step);
        rig_step(&r, 1, dec, 3, step == 1, when);
    }
    // a first prefill (sequence 1) next to a decode (2) and a rewind (0 goes back to position 2)
    moex_attn_seq mix[3] = {{1, 5, 0}, {2, 1, 7 + steps}, {0, 3, 2}};
    rig_step(&r, 1, mix, 3, 0, "mixed prefill/decode with a rewind");
    // layer 0 is independent
    moex_attn_seq l0[2] = {{3, 9, 0}, {1, 2, 0}};
    rig_step(&r, 0, l0, 2, 0, "layer 0 prefill");
    if (blas) {
        rig_free(&r);
        return;
    }
    // a bad descriptor: past beyond the cached length -> status bit, nothing appended or written
    int64_t len2 = 0;
    moex_kv_cache_length(r.cpu, 1, 2, &len2);
    moex_attn_seq bad[2] = {{0, 1, 40}, {2, 1, len2}};
    const int64_t qn = 2 * heads * d, kn = 2 * KV * d;
    fill(r.q, qn, -1, 1), fill(r.k, kn, -1, 1), fill(r.v, kn, -1, 1);
    up(r.dq, r.q, sizeof(float) * qn), up(r.dk, r.k, sizeof(float) * kn), up(r.dv, r.v, sizeof(float) * kn);
    up(r.dseqs, bad, sizeof bad);
    float *poison = malloc(sizeof(float) * qn);
    for (int64_t i = 0; i < qn; i++) poison[i] = 12345.0f;
    up(r.dout, poison, sizeof(float) * qn);
    moex_status gs = moex_cuda_attention(&r.gpu, 1, r.dseqs, 2, 2, heads, r.dq, r.dk, r.dv, r.dout, r.window, r.dsinks,
                                         g_flags, g_stream);
    CHECK(gs == MOEX_OK, "attention with a bad descriptor: queued: %s", moex_last_error());
    CHECK(sync_flags() == MOEX_CUDA_FLAG_BAD_SEQ, "attention: a bad descriptor did not set the status bit");
    // the good one (seq 2) ran: compare it with the CPU running it alone
    moex_attn_seq good = bad[1];
    moex_status cs = moex_attention_forward_sinks(r.cpu, 1, &good, 1, heads, r.q + heads * d, r.k + KV * d,
                                                  r.v + KV * d, r.out_cpu, 1, r.window, r.sinks);
    CHECK(cs == MOEX_OK, "cpu attention: %s", moex_last_error());
    down(r.out_gpu, r.dout, sizeof(float) * qn);
    close_f32("attention: the bad sequence's rows untouched", r.out_gpu, poison, heads * d, 0, 0);
    close_f32("attention: the good sequence next to a bad one", r.out_gpu + heads * d, r.out_cpu, heads * d, 1e-5, 1e-6);
    rig_check_lengths(&r, "after a bad descriptor");
    free(poison);
    rig_free(&r);
}

/* A context longer than the 8192 scores a block keeps: the chunked path. */
static void attention_long(void) {
    attn_rig r;
    const int64_t L = 8300;
    if (!rig_init(&r, 1, 2, L + 8, 1, 64, 2, L)) return;
    moex_attn_seq pre[1] = {{1, L, 0}};
    rig_step(&r, 0, pre, 1, 0, "prefill of 8300 tokens (chunked scores)");
    moex_attn_seq dec[1] = {{1, 1, L}};
    rig_step(&r, 0, dec, 1, 0, "decode at position 8300");
    rig_free(&r);
}

static void test_attention(void) {
    static const int64_t CFG[3][3] = {{5, 1, 40}, {8, 2, 64}, {4, 4, 128}};
    moex_cuda_blas blas;
    MUST(moex_cuda_blas_create(g_gpu, 0, &blas));
    for (int gemm = 0; gemm < 2; gemm++) { /* the kernel, then the GEMM path */
        const moex_cuda_blas *b = gemm ? &blas : NULL;
        for (int i = 0; i < 3; i++) attention_config(CFG[i][0], CFG[i][1], CFG[i][2], 0, 0, b, 1);
        attention_config(8, 2, 64, 5, 1, b, 1); /* gpt_oss: a window of 5 positions (binding from the 6th) and sinks */
        attention_config(5, 1, 40, 0, 1, b, 1); /* sinks alone */
        attention_config(4, 4, 128, 1, 0, b, 1); /* a window of one: each row sees itself */
        attention_config(64, 8, 64, 20, 1, b, 1); /* gpt-oss-20b's heads, a binding window and sinks */
    }
    /* the GEMM path with chunks of several query tokens: a binding window (chunks after the first
     * start past position 0, their later rows' windows later still), and 160 heads (the pointer
     * tables' kernel in two blocks) */
    attention_config(8, 2, 64, 5, 1, &blas, 3);
    attention_config(160, 8, 16, 7, 1, &blas, 2);
    moex_cuda_blas_free(&blas);
    if (!g_quick) attention_long();
    // reset: one sequence, then all
    attn_rig r;
    if (!rig_init(&r, 2, 3, 16, 1, 40, 5, 16)) return;
    moex_attn_seq pre[2] = {{0, 4, 0}, {2, 6, 0}};
    rig_step(&r, 0, pre, 2, 0, "before reset");
    MUST(moex_kv_cache_reset(r.cpu, 2));
    MUST(moex_cuda_kv_cache_reset(&r.gpu, 2, g_stream));
    sync_flags();
    rig_check_lengths(&r, "reset of sequence 2");
    MUST(moex_kv_cache_reset(r.cpu, -1));
    MUST(moex_cuda_kv_cache_reset(&r.gpu, -1, g_stream));
    sync_flags();
    rig_check_lengths(&r, "reset of everything");
    rig_free(&r);
}

/* x rounded to bf16 values (held in f32), as a step in bf16 compute leaves its activations */
static void round_bf16_host(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = moex_bf16_to_f32(moex_f32_to_bf16(x[i]));
}

/* deepseek_v3's latent attention: the same latent caches on both sides (width w, values its first
 * vd), heads query heads; a prefill of two sequences, decode steps, a continued prefill. bf16: the
 * inputs are bf16 values and the GEMM path is told so (its bf16 tensor-core GEMMs, chunks of about
 * 5 query tokens), against the same f32 reference. */
static void latent_case(const moex_cuda_blas *blas, int64_t heads, int64_t w, int64_t vd, float scale, int bf16) {
    const int64_t B = 3, S = 64, rows = 48;
    moex_kv_cache *cpu = NULL;
    moex_cuda_kv_cache gpu, gemm; /* the kernel path's cache and the GEMM path's */
    memset(&gpu, 0, sizeof gpu);
    memset(&gemm, 0, sizeof gemm);
    if (moex_kv_cache_create_latent(2, B, S, w, &cpu) != MOEX_OK ||
        moex_cuda_kv_cache_create_latent(g_gpu, 2, B, S, w, &gpu) != MOEX_OK ||
        moex_cuda_kv_cache_create_latent(g_gpu, 2, B, S, w, &gemm) != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "latent cache: %s", moex_last_error());
        moex_kv_cache_free(cpu);
        return;
    }
    const size_t qn = (size_t)(rows * heads * w), kn = (size_t)(rows * w), on = (size_t)(rows * heads * vd);
    float *q = malloc(sizeof(float) * qn), *kv = malloc(sizeof(float) * kn), *oc = malloc(sizeof(float) * on),
          *og = malloc(sizeof(float) * on);
    float *dq = dmalloc(sizeof(float) * qn), *dkv = dmalloc(sizeof(float) * kn), *dout = dmalloc(sizeof(float) * on);
    moex_attn_seq *dseqs = dmalloc(sizeof(moex_attn_seq) * (size_t)B);
    /* the GEMM path's scores: f32, 5 query tokens a chunk; bf16 (its keys, parts and queries too), 9 to 29
     * tokens a chunk at these sizes: the 33-token prefill in several chunks either way */
    const size_t sf = bf16 ? (size_t)(heads * (3 * S + w) * 5 + 2 * S * w) : (size_t)(heads * S * 5);
    float *dscores = dmalloc(sizeof(float) * sf);
    const moex_attn_seq calls[5][2] = {{{1, 7, 0}, {0, 33, 0}}, {{0, 1, 33}, {1, 1, 7}}, {{1, 1, 8}, {0, 1, 34}},
                                       {{2, 5, 0}, {1, 3, 9}}, {{2, 0, 0}, {1, 1, 12}}};
    const char *names[5] = {"prefill 7+33", "decode", "decode, other order", "prefill next to a continued one",
                            "an empty descriptor at position 0 next to a decode"};
    for (int c = 0; c < 5; c++) {
        const int64_t total = calls[c][0].tokens + calls[c][1].tokens;
        fill(q, total * heads * w, -1.5f, 1.5f), fill(kv, total * w, -1.5f, 1.5f);
        if (bf16) round_bf16_host(q, total * heads * w), round_bf16_host(kv, total * w);
        up(dq, q, sizeof(float) * (size_t)(total * heads * w)), up(dkv, kv, sizeof(float) * (size_t)(total * w));
        up(dseqs, calls[c], sizeof calls[c]);
        moex_status cs = moex_attention_forward_latent(cpu, 1, calls[c], 2, heads, q, kv, vd, scale, oc, 2);
        moex_status gs = moex_cuda_attention_latent(&gpu, 1, dseqs, 2, total, heads, dq, dkv, vd, scale, dout, 0,
                                                    g_flags, g_stream);
        g_checks++;
        if (cs || gs) {
            fail_at(__FILE__, __LINE__, "latent attention %s: %s", names[c], moex_last_error());
            break;
        }
        CHECK(sync_flags() == 0, "latent attention %s: status word set", names[c]);
        down(og, dout, sizeof(float) * (size_t)(total * heads * vd));
        char what[160];
        snprintf(what, sizeof what, "latent attention %s (heads %lld, width %lld, values %lld)", names[c],
                 (long long)heads, (long long)w, (long long)vd);
        close_f32(what, og, oc, total * heads * vd, 1e-5, 1e-6);
        gs = moex_cuda_attention_latent_gemm(blas, &gemm, 1, dseqs, calls[c], 2, total, heads, dq, dkv, vd, scale, dout,
                                             bf16, dscores, sf, g_flags, g_stream);
        g_checks++;
        if (gs) {
            fail_at(__FILE__, __LINE__, "latent attention (GEMM) %s: %s", names[c], moex_last_error());
            break;
        }
        CHECK(sync_flags() == 0, "latent attention (GEMM) %s: status word set", names[c]);
        down(og, dout, sizeof(float) * (size_t)(total * heads * vd));
        snprintf(what, sizeof what, "latent attention (GEMM%s, chunked) %s (heads %lld, width %lld)",
                 bf16 ? " in bf16" : "", names[c], (long long)heads, (long long)w);
        /* bf16: the values GEMM adds the three parts' products in one tensor-core accumulation of
         * 3 x positions terms, whose rounding reached 1.1e-6 on an output that cancels (|v| <= 1.5) */
        close_f32(what, og, oc, total * heads * vd, 1e-5, bf16 ? 2e-6 : 1e-6);
    }
    CHECK(moex_cuda_attention_latent_gemm(blas, &gemm, 1, dseqs, calls[0], 2, 41, heads, dq, dkv, vd, scale, dout,
                                          bf16, dscores, sf, g_flags, g_stream) == MOEX_ERR_INVALID_ARGUMENT,
          "latent attention (GEMM): descriptors of 40 tokens with total 41 accepted");
    int64_t len[6];
    down(len, gpu.len, sizeof len);
    for (int64_t s = 0; s < B; s++) {
        int64_t cl = -1;
        moex_kv_cache_length(cpu, 1, s, &cl);
        CHECK(len[B + s] == cl, "latent cache: sequence %lld: gpu length %lld, cpu %lld", (long long)s,
              (long long)len[B + s], (long long)cl);
    }
    CHECK(moex_cuda_attention(&gpu, 0, dseqs, 1, 1, heads, dq, dkv, dkv, dout, 0, NULL, g_flags, g_stream) ==
              MOEX_ERR_INVALID_ARGUMENT, "plain attention on a latent cache is refused");
    moex_kv_cache_free(cpu);
    moex_cuda_kv_cache_free(&gpu);
    moex_cuda_kv_cache_free(&gemm);
    free(q), free(kv), free(oc), free(og);
    dfree(dq), dfree(dkv), dfree(dout), dfree(dseqs), dfree(dscores);
}

/* copy_rows (strided both sides, and one row repeated) and scale against plain loops. */
static void test_copy_scale(void) {
    const int64_t rows = 37, n = 13, sld = 21, dld = 17, nd = rows * dld;
    float src[37 * 21], dst[37 * 17], got[37 * 17];
    fill(src, rows * sld, -4, 4);
    fill(dst, nd, -4, 4);
    float *ds = dup_to_dev(src, sizeof src), *dd = dup_to_dev(dst, sizeof dst);
    for (int rep = 0; rep < 2; rep++) { /* rep 1: src_ld 0, the first row to every row */
        const int64_t ld = rep ? 0 : sld;
        MUST(moex_cuda_copy_rows(dd, dld, ds, ld, rows, n, g_stream));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) dst[r * dld + i] = src[r * ld + i];
        sync_flags();
        down(got, dd, sizeof got);
        close_f32(rep ? "copy_rows of one row" : "copy_rows strided", got, dst, nd, 0, 0);
    }
    MUST(moex_cuda_scale(dd, nd, 1.2345f, g_stream));
    for (int64_t i = 0; i < nd; i++) dst[i] *= 1.2345f;
    sync_flags();
    down(got, dd, sizeof got);
    close_f32("scale", got, dst, nd, 0, 0);
    CHECK(moex_cuda_copy_rows(dd, 5, ds, sld, rows, n, g_stream) == MOEX_ERR_INVALID_ARGUMENT,
          "copy_rows with dst_ld < n accepted");
    dfree(ds), dfree(dd);
}

/* A prefill of 600 positions, 16 heads: the kernel path, then the GEMM path in chunks of 7 query tokens
 * (f32), then in bf16 on the same scratch (chunks of 2 tokens; the inputs are bf16 values). */
static void latent_long(const moex_cuda_blas *blas) {
    const int64_t heads = 16, w = 72, vd = 64, L = 600;
    moex_kv_cache *cpu = NULL;
    moex_cuda_kv_cache gpu;
    memset(&gpu, 0, sizeof gpu);
    if (moex_kv_cache_create_latent(1, 1, L + 1, w, &cpu) != MOEX_OK ||
        moex_cuda_kv_cache_create_latent(g_gpu, 1, 1, L + 1, w, &gpu) != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "latent cache: %s", moex_last_error());
        moex_kv_cache_free(cpu);
        return;
    }
    const size_t qn = (size_t)(L * heads * w), kn = (size_t)(L * w), on = (size_t)(L * heads * vd);
    float *q = malloc(sizeof(float) * qn), *kv = malloc(sizeof(float) * kn), *oc = malloc(sizeof(float) * on),
          *og = malloc(sizeof(float) * on);
    fill(q, (int64_t)qn, -1.5f, 1.5f), fill(kv, (int64_t)kn, -1.5f, 1.5f);
    round_bf16_host(q, (int64_t)qn), round_bf16_host(kv, (int64_t)kn);
    float *dq = dup_to_dev(q, sizeof(float) * qn), *dkv = dup_to_dev(kv, sizeof(float) * kn),
          *dout = dmalloc(sizeof(float) * on);
    const moex_attn_seq pre = {0, L, 0};
    moex_attn_seq *dseq = dup_to_dev(&pre, sizeof pre);
    moex_status cs = moex_attention_forward_latent(cpu, 0, &pre, 1, heads, q, kv, vd, 0.2f, oc, 2);
    moex_status gs = moex_cuda_attention_latent(&gpu, 0, dseq, 1, L, heads, dq, dkv, vd, 0.2f, dout, 0, g_flags, g_stream);
    g_checks++;
    if (cs || gs) {
        fail_at(__FILE__, __LINE__, "latent attention of 600 positions: %s", moex_last_error());
    } else {
        CHECK(sync_flags() == 0, "latent attention of 600 positions: status word set");
        down(og, dout, sizeof(float) * on);
        close_f32("latent attention, a prefill of 600 positions", og, oc, (int64_t)on, 1e-5, 1e-6);
    }
    /* the GEMM path on a fresh cache each, 7 query tokens a chunk */
    const size_t sf = (size_t)(heads * (L + 1) * 7);
    float *dscores = dmalloc(sizeof(float) * sf);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        moex_cuda_kv_cache_free(&gpu);
        if (moex_cuda_kv_cache_create_latent(g_gpu, 1, 1, L + 1, w, &gpu) != MOEX_OK ||
            moex_cuda_attention_latent_gemm(blas, &gpu, 0, dseq, &pre, 1, L, heads, dq, dkv, vd, 0.2f, dout, bf16,
                                            dscores, sf, g_flags, g_stream) != MOEX_OK) {
            fail_at(__FILE__, __LINE__, "latent attention (GEMM) of 600 positions: %s", moex_last_error());
            continue;
        }
        g_checks++;
        CHECK(sync_flags() == 0, "latent attention (GEMM) of 600 positions: status word set");
        down(og, dout, sizeof(float) * on);
        close_f32(bf16 ? "latent attention (GEMM in bf16, chunks of 2 tokens), a prefill of 600 positions"
                       : "latent attention (GEMM, chunks of 7 tokens), a prefill of 600 positions",
                  og, oc, (int64_t)on, 1e-5, 1e-6);
    }
    dfree(dscores);
    moex_kv_cache_free(cpu);
    moex_cuda_kv_cache_free(&gpu);
    free(q), free(kv), free(oc), free(og);
    dfree(dq), dfree(dkv), dfree(dout), dfree(dseq);
}

/* q left in f32 and rounded to bf16 by the attention itself (a step in bf16 compute leaves it so):
 * the kernel path (round_q), the bf16 GEMM path and the f32 GEMM path (a scratch too small for the
 * bf16 one: q rounded in place) against the CPU on the rounded q. 40 positions, 4 heads. */
static void latent_rounds_q(const moex_cuda_blas *blas) {
    const int64_t heads = 4, w = 72, vd = 64, L = 40;
    const size_t qn = (size_t)(L * heads * w), kn = (size_t)(L * w), on = (size_t)(L * heads * vd);
    float *q = malloc(sizeof(float) * qn), *qr = malloc(sizeof(float) * qn), *kv = malloc(sizeof(float) * kn);
    float *oc = malloc(sizeof(float) * on), *og = malloc(sizeof(float) * on);
    fill(q, (int64_t)qn, -1.5f, 1.5f), fill(kv, (int64_t)kn, -1.5f, 1.5f);
    round_bf16_host(kv, (int64_t)kn); /* the cached rows are bf16 values, q is not */
    memcpy(qr, q, sizeof(float) * qn);
    round_bf16_host(qr, (int64_t)qn);
    moex_kv_cache *cpu = NULL;
    const moex_attn_seq pre = {0, L, 0};
    if (moex_kv_cache_create_latent(1, 1, L + 1, w, &cpu) != MOEX_OK ||
        moex_attention_forward_latent(cpu, 0, &pre, 1, heads, qr, kv, vd, 0.2f, oc, 2) != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "latent attention on the CPU: %s", moex_last_error());
        moex_kv_cache_free(cpu);
        free(q), free(qr), free(kv), free(oc), free(og);
        return;
    }
    moex_kv_cache_free(cpu);
    float *dq = dmalloc(sizeof(float) * qn), *dkv = dup_to_dev(kv, sizeof(float) * kn), *dout = dmalloc(sizeof(float) * on);
    moex_attn_seq *dseq = dup_to_dev(&pre, sizeof pre);
    /* bf16 path: the rows three times in bf16 and a chunk of 8 tokens; f32 path: 3 tokens a chunk */
    const size_t big = (size_t)(3 * (L + 1) * w + heads * (5 * (L + 1) + w) * 8), small = (size_t)(heads * (L + 1) * 3);
    float *dscores = dmalloc(sizeof(float) * big);
    const char *names[3] = {"kernel, round_q", "GEMM in bf16", "GEMM in f32 (the scratch too small for bf16)"};
    for (int path = 0; path < 3; path++) {
        moex_cuda_kv_cache gpu;
        memset(&gpu, 0, sizeof gpu);
        up(dq, q, sizeof(float) * qn);
        moex_status gs = moex_cuda_kv_cache_create_latent(g_gpu, 1, 1, L + 1, w, &gpu);
        if (!gs)
            gs = path == 0 ? moex_cuda_attention_latent(&gpu, 0, dseq, 1, L, heads, dq, dkv, vd, 0.2f, dout, 1, g_flags,
                                                        g_stream)
                           : moex_cuda_attention_latent_gemm(blas, &gpu, 0, dseq, &pre, 1, L, heads, dq, dkv, vd, 0.2f,
                                                             dout, 1, dscores, path == 1 ? big : small, g_flags,
                                                             g_stream);
        g_checks++;
        char what[160];
        snprintf(what, sizeof what, "latent attention of unrounded q, %s", names[path]);
        if (gs) {
            fail_at(__FILE__, __LINE__, "%s: %s", what, moex_last_error());
        } else {
            CHECK(sync_flags() == 0, "%s: status word set", what);
            down(og, dout, sizeof(float) * on);
            close_f32(what, og, oc, (int64_t)on, 1e-5, 2e-6);
            if (path == 2) { /* the f32 path rounds q where it lies */
                float *qg = malloc(sizeof(float) * qn);
                down(qg, dq, sizeof(float) * qn);
                close_f32("latent attention's f32 GEMM path: q rounded in place", qg, qr, (int64_t)qn, 0, 0);
                free(qg);
            }
        }
        moex_cuda_kv_cache_free(&gpu);
    }
    free(q), free(qr), free(kv), free(oc), free(og);
    dfree(dq), dfree(dkv), dfree(dout), dfree(dseq), dfree(dscores);
}

static void test_latent_attention(void) {
    moex_cuda_blas blas;
    MUST(moex_cuda_blas_create(g_gpu, 0, &blas));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        latent_case(&blas, 4, 24, 16, 0.25f, bf16);   /* the fixtures' sizes: kv_lora_rank 16 + rope 8 */
        latent_case(&blas, 3, 200, 160, 0.07f, bf16); /* more than one pass of output features */
        latent_case(&blas, 64, 576, 512, 0.05f, bf16); /* DeepSeek-V3's width and values */
    }
    latent_rounds_q(&blas);
    if (!g_quick) latent_long(&blas);
    moex_cuda_blas_free(&blas);
}

/* The absorbed attention's per-head products of kv_b ([heads * (nope + vd), r]) against the CPU's,
 * f32 and bf16 weights (the input rounded to bf16 on both sides first: the device's bf16 GEMM reads
 * it so). */
static void mla_case(const moex_cuda_blas *blas, int64_t T, int64_t heads, int64_t nope, int64_t vd, int64_t r,
                     moex_dtype dt) {
    const int64_t rope = 8, qs = nope + rope, os = r + rope, wn = heads * (nope + vd) * r;
    float *w = malloc(sizeof(float) * (size_t)wn);
    fill(w, wn, -0.3f, 0.3f);
    round_to(w, wn, dt);
    void *wh = encode(w, wn, dt);
    void *dw = dup_to_dev(wh, (size_t)wn * (dt == MOEX_F32 ? 4 : 2));
    const moex_linear_w hw = {wh, dt, heads * (nope + vd), r, NULL, MOEX_F32}, gw = {dw, dt, heads * (nope + vd), r, NULL, MOEX_F32};
    const int64_t nq = T * heads * qs, no = T * heads * os, nl = T * heads * r, nv = T * heads * vd;
    float *q = malloc(sizeof(float) * nq), *oc = calloc((size_t)no, sizeof(float)), *og = malloc(sizeof(float) * no);
    float *lat = malloc(sizeof(float) * nl), *vc = malloc(sizeof(float) * nv), *vg = malloc(sizeof(float) * nv);
    fill(q, nq, -1, 1), fill(lat, nl, -1, 1);
    if (dt != MOEX_F32) round_to(q, nq, dt), round_to(lat, nl, dt);
    float *dq = dup_to_dev(q, sizeof(float) * nq), *do_ = dup_to_dev(oc, sizeof(float) * no);
    float *dl = dup_to_dev(lat, sizeof(float) * nl), *dv = dmalloc(sizeof(float) * nv);
    void *x16 = dmalloc(2 * (size_t)(nq > nl ? nq : nl));
    char what[160];
    if (moex_mla_absorb(&hw, heads, nope, vd, q, qs, T, oc, os, 2) == MOEX_OK &&
        moex_cuda_mla_absorb(blas, &gw, heads, nope, vd, dq, qs, T, do_, os, x16, g_stream) == MOEX_OK) {
        sync_flags();
        down(og, do_, sizeof(float) * no);
        snprintf(what, sizeof what, "mla_absorb T=%lld heads=%lld nope=%lld r=%lld %s", (long long)T, (long long)heads,
                 (long long)nope, (long long)r, moex_dtype_name(dt));
        close_f32(what, og, oc, no, 1e-5, 1e-5); /* the rope columns stay as they were (zero) on both */
    } else {
        fail_at(__FILE__, __LINE__, "mla_absorb: %s", moex_last_error());
    }
    if (moex_mla_values(&hw, heads, nope, vd, lat, T, vc, 2) == MOEX_OK &&
        moex_cuda_mla_values(blas, &gw, heads, nope, vd, dl, T, dv, x16, g_stream) == MOEX_OK) {
        sync_flags();
        down(vg, dv, sizeof(float) * nv);
        snprintf(what, sizeof what, "mla_values T=%lld heads=%lld vd=%lld r=%lld %s", (long long)T, (long long)heads,
                 (long long)vd, (long long)r, moex_dtype_name(dt));
        close_f32(what, vg, vc, nv, 1e-5, 1e-5);
    } else {
        fail_at(__FILE__, __LINE__, "mla_values: %s", moex_last_error());
    }
    free(w), free(wh), free(q), free(oc), free(og), free(lat), free(vc), free(vg);
    dfree(dw), dfree(dq), dfree(do_), dfree(dl), dfree(dv), dfree(x16);
}

/* ------------------------------------------------------------------------ */
/* routers                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct router_case {
    moex_router_kind kind;
    int64_t E, k, G, topk_group;
    int renorm, bias;
    float scaling;
} router_case;

static void router_run(const router_case *rc, int64_t T) {
    moex_router_desc desc;
    moex_router_desc_init(&desc);
    desc.kind = rc->kind, desc.num_experts = rc->E, desc.top_k = rc->k, desc.renormalize = rc->renorm;
    desc.n_group = rc->G, desc.topk_group = rc->topk_group, desc.scaling = rc->scaling;
    const int64_t E = rc->E, k = rc->k;
    float *logits = malloc(sizeof(float) * T * E), *bias = malloc(sizeof(float) * E);
    for (int64_t i = 0; i < T * E; i++) /* a coarse grid: ties are common */
        logits[i] = (i % 3 == 0) ? (float)(rnd_i(9) - 4) * 0.5f : rnd_f(-4, 4);
    if (T >= 3) logits[2 * E + E / 2] = NAN; /* a NaN in token 2 */
    if (T >= 5) for (int64_t e = 0; e < E; e++) logits[4 * E + e] = 0.25f; /* token 4: all tied */
    for (int64_t e = 0; e < E; e++) bias[e] = (float)(rnd_i(5)) * 0.125f;
    if (rc->bias) {
        int64_t bs[1] = {E};
        moex_tensor_init(&desc.correction_bias, bias, MOEX_F32, 1, bs);
    }
    int32_t *ids_c = malloc(sizeof(int32_t) * T * k), *ids_g = malloc(sizeof(int32_t) * T * k);
    float *w_c = malloc(sizeof(float) * T * k), *w_g = malloc(sizeof(float) * T * k);
    moex_tensor tl, ti, tw;
    int64_t ls[2] = {T, E}, ks[2] = {T, k};
    moex_tensor_init(&tl, logits, MOEX_F32, 2, ls);
    moex_tensor_init(&ti, ids_c, MOEX_I32, 2, ks);
    moex_tensor_init(&tw, w_c, MOEX_F32, 2, ks);
    float *dl = dup_to_dev(logits, sizeof(float) * T * E), *db = rc->bias ? dup_to_dev(bias, sizeof(float) * E) : NULL;
    int32_t *di = dmalloc(sizeof(int32_t) * T * k);
    float *dw = dmalloc(sizeof(float) * T * k);
    moex_status cs = moex_route(&desc, &tl, &ti, &tw);
    moex_status gs = moex_cuda_route(&desc, db, dl, T, di, dw, g_stream);
    g_checks++;
    if (cs != MOEX_OK || gs != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "route kind %d E=%lld: %s", (int)rc->kind, (long long)E, moex_last_error());
    } else {
        sync_flags();
        down(ids_g, di, sizeof(int32_t) * T * k);
        down(w_g, dw, sizeof(float) * T * k);
        char what[160];
        snprintf(what, sizeof what, "route kind %d E=%lld k=%lld G=%lld/%lld renorm=%d bias=%d T=%lld", (int)rc->kind,
                 (long long)E, (long long)k, (long long)rc->G, (long long)rc->topk_group, rc->renorm, rc->bias,
                 (long long)T);
        int64_t bad = -1;
        for (int64_t i = 0; i < T * k && bad < 0; i++)
            if (ids_g[i] != ids_c[i]) bad = i;
        CHECK(bad < 0, "%s: ids differ at [%lld, %lld]: gpu %d cpu %d", what, (long long)(bad / k),
              (long long)(bad % k), bad >= 0 ? ids_g[bad] : 0, bad >= 0 ? ids_c[bad] : 0);
        close_f32(what, w_g, w_c, T * k, 2e-6, 1e-7);
    }
    free(logits), free(bias), free(ids_c), free(ids_g), free(w_c), free(w_g);
    dfree(dl), dfree(db), dfree(di), dfree(dw);
}

static void test_routers(void) {
    static const router_case CASES[] = {
        {MOEX_ROUTER_SOFTMAX_TOPK, 60, 4, 1, 1, 0, 0, 1.0f},
        {MOEX_ROUTER_SOFTMAX_TOPK, 60, 4, 1, 1, 1, 0, 1.0f},
        {MOEX_ROUTER_SOFTMAX_TOPK, 128, 8, 1, 1, 1, 0, 1.0f},
        {MOEX_ROUTER_SOFTMAX_TOPK, 8, 2, 1, 1, 0, 0, 1.0f},
        {MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 256, 8, 8, 4, 1, 1, 2.5f},
        {MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 64, 6, 4, 2, 0, 0, 1.0f},
        {MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 16, 3, 16, 4, 1, 1, 1.5f},
        {MOEX_ROUTER_SIGMOID_GROUPED_TOPK, 72, 5, 1, 1, 1, 1, 1.0f},
        {MOEX_ROUTER_TOPK_SOFTMAX, 32, 4, 1, 1, 0, 0, 1.0f},
        {MOEX_ROUTER_TOPK_SOFTMAX, 128, 4, 1, 1, 0, 0, 1.0f},
        {MOEX_ROUTER_TOPK_SOFTMAX, 5, 5, 1, 1, 0, 0, 1.0f},
    };
    const int n = (int)(sizeof CASES / sizeof CASES[0]);
    for (int i = 0; i < n; i++)
        for (int ti = 0; ti < 3; ti++) {
            if (g_quick && ti != 2) continue;
            router_run(&CASES[i], TOKENS[ti]);
        }
    if (!g_quick) router_run(&CASES[4], 1000);
}

/* ------------------------------------------------------------------------ */
/* element-wise helpers                                                      */
/* ------------------------------------------------------------------------ */

static void test_elementwise(void) {
    const int64_t T = 7, I = 129, H = 40, n = T * I;
    float *x = malloc(sizeof(float) * n * 2), *cpu = malloc(sizeof(float) * n * 2), *gpu = malloc(sizeof(float) * n * 2);
    fill(x, 2 * n, -9, 9);
    x[3] = NAN, x[4] = INFINITY, x[5] = -INFINITY, x[6] = 0.0f, x[7] = -0.0f;
    float *dx = dup_to_dev(x, sizeof(float) * n * 2), *dy = dmalloc(sizeof(float) * n * 2);
    static const moex_activation ACTS[4] = {MOEX_ACT_SILU, MOEX_ACT_GELU, MOEX_ACT_GELU_TANH, MOEX_ACT_RELU};
    char what[96];
    for (int a = 0; a < 4; a++) {
        MUST(moex_activate(ACTS[a], x, cpu, n));
        MUST(moex_cuda_activate(ACTS[a], dx, dy, n, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * n);
        snprintf(what, sizeof what, "activate %s", moex_activation_name(ACTS[a]));
        close_f32(what, gpu, cpu, n, 2e-6, 1e-6); /* 1 + erff / tanhf cancel: absolute bound */
        // gated: act(gate) * up with gate and up the two halves of a fused [T, 2I] row
        for (int64_t t = 0; t < T; t++) {
            float g[129];
            moex_activate(ACTS[a], x + t * 2 * I, g, I);
            for (int64_t i = 0; i < I; i++) cpu[t * I + i] = g[i] * x[t * 2 * I + I + i];
        }
        MUST(moex_cuda_gated_act(ACTS[a], dx, dx + I, 2 * I, T, I, dy, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * n);
        snprintf(what, sizeof what, "gated_act %s (fused gate_up rows)", moex_activation_name(ACTS[a]));
        close_f32(what, gpu, cpu, n, 4e-6, 1e-5);
    }
    MUST(moex_sigmoid(x, cpu, n));
    MUST(moex_cuda_sigmoid(dx, dy, n, g_stream));
    sync_flags();
    down(gpu, dy, sizeof(float) * n);
    close_f32("sigmoid", gpu, cpu, n, 2e-6, 1e-37);
    // shared expert gate: y[t] *= sigmoid(s[t])
    {
        float s[7], sg[7];
        fill(s, T, -4, 4);
        moex_sigmoid(s, sg, T);
        float *ds = dup_to_dev(s, sizeof s);
        up(dy, x + 8, sizeof(float) * T * H);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < H; i++) cpu[t * H + i] = sg[t] * x[8 + t * H + i];
        MUST(moex_cuda_scale_rows_sigmoid(ds, dy, T, H, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * T * H);
        close_f32("scale_rows_sigmoid", gpu, cpu, T * H, 2e-6, 1e-37);
        dfree(ds);
    }
    // add (in place on a), add_bias (bf16 bias), round_bf16, convert
    {
        const int64_t m = n - 8;
        for (int64_t i = 0; i < m; i++) cpu[i] = x[8 + i] + x[n + i];
        up(dy, x + 8, sizeof(float) * m);
        MUST(moex_cuda_add(dy, dx + n, dy, m, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * m);
        close_f32("add", gpu, cpu, m, 0, 0);
        float b[129];
        fill(b, I, -1, 1);
        void *benc = encode(b, I, MOEX_BF16);
        void *db = dup_to_dev(benc, 2 * I);
        up(dy, x + 8, sizeof(float) * T * I);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < I; i++) cpu[t * I + i] = x[8 + t * I + i] + moex_load_f32(benc, MOEX_BF16, i);
        MUST(moex_cuda_add_bias(dy, T, I, db, MOEX_BF16, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * T * I);
        close_f32("add_bias (bf16 bias)", gpu, cpu, T * I, 0, 0);
        up(dy, x + 8, sizeof(float) * m);
        for (int64_t i = 0; i < m; i++) cpu[i] = moex_bf16_to_f32(moex_f32_to_bf16(x[8 + i]));
        MUST(moex_cuda_round_bf16(dy, m, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * m);
        close_f32("round_bf16", gpu, cpu, m, 0, 0);
        for (int di = 1; di < 3; di++) { /* f32 -> f16/bf16 -> f32 */
            MUST(moex_cuda_convert(dx + 8, MOEX_F32, dy, FLOATS[di], m, g_stream));
            MUST(moex_cuda_convert(dy, FLOATS[di], dy + m, MOEX_F32, m, g_stream));
            sync_flags();
            down(gpu, dy + m, sizeof(float) * m);
            memcpy(cpu, x + 8, sizeof(float) * m);
            round_to(cpu, m, FLOATS[di]);
            snprintf(what, sizeof what, "convert f32 -> %s -> f32", moex_dtype_name(FLOATS[di]));
            close_f32(what, gpu, cpu, m, 0, 0);
        }
        free(benc);
        dfree(db);
    }
    // last row of each sequence
    {
        moex_attn_seq seqs[4] = {{1, 3, 0}, {0, 1, 5}, {3, 0, 2}, {2, 3, 1}};
        moex_attn_seq *dseqs = dup_to_dev(seqs, sizeof seqs);
        const int64_t rows_last[4] = {2, 3, -1, 6};
        for (int64_t i = 0; i < 4; i++)
            for (int64_t c = 0; c < H; c++) cpu[i * H + c] = rows_last[i] < 0 ? 0.0f : x[rows_last[i] * H + c];
        MUST(moex_cuda_gather_last_rows(dx, H, dseqs, 4, dy, g_stream));
        sync_flags();
        down(gpu, dy, sizeof(float) * 4 * H);
        close_f32("gather_last_rows", gpu, cpu, 4 * H, 0, 0);
        // positions of the 7 rows (and 0 for a row no descriptor covers)
        const int64_t want[8] = {0, 1, 2, 5, 1, 2, 3, 0};
        int64_t got[8];
        int64_t *dpos = dmalloc(sizeof got);
        MUST(moex_cuda_positions(dseqs, 4, 8, dpos, g_stream));
        sync_flags();
        down(got, dpos, sizeof got);
        for (int i = 0; i < 8; i++)
            CHECK(got[i] == want[i], "positions[%d] = %lld, expected %lld", i, (long long)got[i], (long long)want[i]);
        dfree(dpos);
        dfree(dseqs);
    }
    free(x), free(cpu), free(gpu);
    dfree(dx), dfree(dy);
}

/* ------------------------------------------------------------------------ */
/* argmax                                                                    */
/* ------------------------------------------------------------------------ */

static void test_argmax(void) {
    static const int64_t VS[4] = {1, 7, 32000, 151936};
    for (int vi = 0; vi < 4; vi++) {
        const int64_t V = VS[vi], rows = 6;
        float *x = malloc(sizeof(float) * rows * V);
        fill(x, rows * V, -20, 20);
        if (V > 2) {
            x[0 * V + V / 3] = 50.0f, x[0 * V + 2 * V / 3] = 50.0f;                 /* row 0: a tie */
            x[1 * V + V - 1] = 60.0f;                                              /* row 1: the last */
            x[2 * V + V / 2] = NAN, x[2 * V + V - 1] = NAN, x[2 * V + 1] = 99.0f; /* row 2: the first NaN */
            for (int64_t i = 0; i < V; i++) x[3 * V + i] = -INFINITY;             /* row 3: all -inf */
            for (int64_t i = 0; i < V; i++) x[4 * V + i] = (i % 2) ? 0.0f : -0.0f; /* row 4: signed zeros */
        }
        int64_t cpu[6], gpu[6];
        for (int64_t r = 0; r < rows; r++) /* a row with a NaN: the device says -1 - (its first NaN) */
            if (moex_sample_greedy(x + r * V, V, &cpu[r]) != MOEX_OK) cpu[r] = r == 2 ? -1 - V / 2 : INT64_MIN;
        float *dx = dup_to_dev(x, sizeof(float) * rows * V);
        int64_t *dt = dmalloc(sizeof gpu);
        MUST(moex_cuda_argmax(dx, rows, V, dt, g_stream));
        sync_flags();
        down(gpu, dt, sizeof gpu);
        for (int64_t r = 0; r < rows; r++)
            CHECK(gpu[r] == cpu[r], "argmax V=%lld row %lld: gpu %lld, cpu %lld", (long long)V, (long long)r,
                  (long long)gpu[r], (long long)cpu[r]);
        free(x);
        dfree(dx), dfree(dt);
    }
}

/* ------------------------------------------------------------------------ */
/* linear layers, and the MLPs composed from the pieces                      */
/* ------------------------------------------------------------------------ */

/* A linear layer on both sides: host weight (of dt) and its device copy. */
typedef struct lin_pair {
    moex_linear_w cpu, gpu;
    void *hw, *hb;
} lin_pair;

static void lin_make(lin_pair *p, int64_t N, int64_t K, moex_dtype dt, int with_bias, moex_dtype bdt) {
    memset(p, 0, sizeof *p);
    float *w = malloc(sizeof(float) * N * K);
    fill(w, N * K, -1.0f / sqrtf((float)K) * 1.7f, 1.7f / sqrtf((float)K));
    p->hw = encode(w, N * K, dt);
    free(w);
    p->cpu.weight = p->hw, p->cpu.dtype = dt, p->cpu.out_features = N, p->cpu.in_features = K;
    if (with_bias) {
        float b[4096];
        fill(b, N, -0.5f, 0.5f);
        p->hb = encode(b, N, bdt);
        p->cpu.bias = p->hb, p->cpu.bias_dtype = bdt;
    }
    p->gpu = p->cpu;
    const size_t esz = dt == MOEX_F32 ? 4 : 2, besz = bdt == MOEX_F32 ? 4 : 2;
    p->gpu.weight = dup_to_dev(p->hw, esz * N * K);
    p->gpu.bias = with_bias ? dup_to_dev(p->hb, besz * N) : NULL;
}

static void lin_free(lin_pair *p) {
    free(p->hw), free(p->hb);
    dfree((void *)p->gpu.weight), dfree((void *)p->gpu.bias);
}

static void linear_case(const moex_cuda_blas *blas, int64_t T, int64_t N, int64_t K, moex_dtype dt, int with_bias,
                        moex_dtype bdt) {
    lin_pair p;
    lin_make(&p, N, K, dt, with_bias, bdt);
    float *x = malloc(sizeof(float) * T * K), *cpu = malloc(sizeof(float) * T * N), *gpu = malloc(sizeof(float) * T * N);
    fill(x, T * K, -2, 2);
    round_to(x, T * K, dt); /* 16-bit weights: inputs that the GEMM's rounding leaves as they are */
    float *dx = dup_to_dev(x, sizeof(float) * T * K), *dy = dmalloc(sizeof(float) * T * N);
    void *x16 = dmalloc(2 * (size_t)(T * K));
    moex_status cs = moex_linear(&p.cpu, x, T, cpu, 2);
    moex_status gs = moex_cuda_linear(blas, &p.gpu, dx, T, dy, dt == MOEX_F32 ? NULL : x16, g_stream);
    g_checks++;
    if (cs != MOEX_OK || gs != MOEX_OK) {
        fail_at(__FILE__, __LINE__, "linear: %s", moex_last_error());
    } else {
        sync_flags();
        down(gpu, dy, sizeof(float) * T * N);
        char what[128];
        snprintf(what, sizeof what, "linear %s T=%lld N=%lld K=%lld bias=%s", moex_dtype_name(dt), (long long)T,
                 (long long)N, (long long)K, with_bias ? moex_dtype_name(bdt) : "none");
        close_f32(what, gpu, cpu, T * N, 1e-5, 1e-5 * max_abs(cpu, T * N));
        check_nmse(what, gpu, cpu, T * N, 1e-10);
    }
    free(x), free(cpu), free(gpu);
    dfree(dx), dfree(dy), dfree(x16);
    lin_free(&p);
}

/* moex_gated_mlp and moex_shared_expert against linear + gated_act + linear (+ gate, sigmoid scale) on the GPU. */
static void mlp_case(const moex_cuda_blas *blas, int64_t T, int64_t H, int64_t I, int shared) {
    lin_pair g, u, d, sg;
    lin_make(&g, I, H, MOEX_F32, 0, MOEX_F32), lin_make(&u, I, H, MOEX_F32, 0, MOEX_F32);
    lin_make(&d, H, I, MOEX_F32, 0, MOEX_F32), lin_make(&sg, 1, H, MOEX_F32, 0, MOEX_F32);
    moex_mlp_w m = {g.cpu, u.cpu, d.cpu, MOEX_ACT_SILU};
    float *x = malloc(sizeof(float) * T * H), *cpu = malloc(sizeof(float) * T * H), *gpu = malloc(sizeof(float) * T * H);
    fill(x, T * H, -2, 2);
    float *dx = dup_to_dev(x, sizeof(float) * T * H), *dg = dmalloc(sizeof(float) * T * I),
          *du = dmalloc(sizeof(float) * T * I), *dy = dmalloc(sizeof(float) * T * H), *ds = dmalloc(sizeof(float) * T);
    moex_status cs = shared ? moex_shared_expert(&m, &sg.cpu, x, T, cpu, 2) : moex_gated_mlp(&m, x, T, cpu, 2);
    MUST(cs);
    MUST(moex_cuda_linear(blas, &g.gpu, dx, T, dg, NULL, g_stream));
    MUST(moex_cuda_linear(blas, &u.gpu, dx, T, du, NULL, g_stream));
    MUST(moex_cuda_gated_act(MOEX_ACT_SILU, dg, du, I, T, I, dg, g_stream));
    MUST(moex_cuda_linear(blas, &d.gpu, dg, T, dy, NULL, g_stream));
    if (shared) {
        MUST(moex_cuda_linear(blas, &sg.gpu, dx, T, ds, NULL, g_stream));
        MUST(moex_cuda_scale_rows_sigmoid(ds, dy, T, H, g_stream));
    }
    sync_flags();
    down(gpu, dy, sizeof(float) * T * H);
    char what[96];
    snprintf(what, sizeof what, "%s T=%lld H=%lld I=%lld", shared ? "shared expert" : "gated mlp", (long long)T,
             (long long)H, (long long)I);
    close_f32(what, gpu, cpu, T * H, 1e-4, 1e-5 * max_abs(cpu, T * H));
    check_nmse(what, gpu, cpu, T * H, 1e-10);
    free(x), free(cpu), free(gpu);
    dfree(dx), dfree(dg), dfree(du), dfree(dy), dfree(ds);
    lin_free(&g), lin_free(&u), lin_free(&d), lin_free(&sg);
}

static void test_linear(void) {
    moex_cuda_blas blas;
    MUST(moex_cuda_blas_create(g_gpu, 0, &blas));
    static const int64_t NK[4][2] = {{40, 129}, {300, 64}, {1000, 2048}, {1, 40}};
    for (int i = 0; i < 4; i++)
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < 3; di++) {
                if (g_quick && (ti != di || i == 2)) continue;
                linear_case(&blas, TOKENS[ti], NK[i][0], NK[i][1], FLOATS[di], (i + ti) % 2, FLOATS[(di + 1) % 3]);
            }
    for (int ti = 0; ti < 3; ti++) {
        mlp_case(&blas, TOKENS[ti], 64, 129, 0);
        mlp_case(&blas, TOKENS[ti], 40, 96, 1);
    }
    for (int ti = 0; ti < 3; ti++) { /* deepseek_v3's absorbed attention: the fixtures' sizes and odd ones */
        mla_case(&blas, TOKENS[ti], 4, 16, 16, 16, MOEX_F32);
        mla_case(&blas, TOKENS[ti], 3, 24, 40, 72, ti == 1 ? MOEX_BF16 : MOEX_F32);
    }
    // refused: 16-bit weights without scratch
    lin_pair p;
    lin_make(&p, 8, 8, MOEX_BF16, 0, MOEX_F32);
    float *d = dmalloc(sizeof(float) * 64);
    CHECK(moex_cuda_linear(&blas, &p.gpu, d, 1, d + 32, NULL, g_stream) == MOEX_ERR_INVALID_ARGUMENT,
          "linear: bf16 weights without x16 accepted");
    dfree(d);
    lin_free(&p);
    moex_cuda_blas_free(&blas);
}

/* ------------------------------------------------------------------------ */
/* a captured decode step                                                    */
/* ------------------------------------------------------------------------ */

/* q = linear(x), positions from the descriptors, rope on q and k, attention, logits = linear(attn),
 * tokens = argmax: captured once,
 * replayed for several decode steps whose inputs and descriptors are written into the same buffers. */
static void test_graph_decode(void) {
    const int64_t nseq = 3, heads = 5, KV = 1, d = 64, Hd = heads * d, Hin = 48, V = 77, S = 32;
    moex_cuda_blas blas;
    MUST(moex_cuda_blas_create(g_gpu, 0, &blas));
    attn_rig r;
    if (!rig_init(&r, 1, nseq, S, KV, d, heads, 16)) return;
    lin_pair wq, wo;
    lin_make(&wq, Hd, Hin, MOEX_F32, 1, MOEX_F32);
    lin_make(&wo, V, Hd, MOEX_F32, 0, MOEX_F32);
    float inv[32];
    MUST(moex_rope_inv_freq(d, 1000000.0, inv));
    float *dinv = dup_to_dev(inv, sizeof inv), *dx = dmalloc(sizeof(float) * nseq * Hin),
          *dc = dmalloc(sizeof(float) * nseq * d / 2), *ds = dmalloc(sizeof(float) * nseq * d / 2),
          *dlog = dmalloc(sizeof(float) * nseq * V);
    int64_t *dpos = dmalloc(sizeof(int64_t) * nseq), *dtok = dmalloc(sizeof(int64_t) * nseq);
    // prefill both sides (uncaptured) so that decode has a context
    moex_attn_seq pre[3] = {{0, 4, 0}, {1, 9, 0}, {2, 2, 0}};
    rig_step(&r, 0, pre, 3, 0, "graph: prefill");
    int64_t past[3] = {4, 9, 2};
    void *exec = NULL;
    for (int step = 0; step < 4; step++) {
        // host inputs of this step
        float x[3 * 48], kk[3 * 64], vv[3 * 64];
        fill(x, nseq * Hin, -1, 1), fill(kk, nseq * d, -1, 1), fill(vv, nseq * d, -1, 1);
        moex_attn_seq seqs[3];
        int64_t pos[3];
        for (int i = 0; i < 3; i++) seqs[i] = (moex_attn_seq){i, 1, past[i]}, pos[i] = past[i];
        up(dx, x, sizeof x), up(r.dk, kk, sizeof kk), up(r.dv, vv, sizeof vv);
        up(r.dseqs, seqs, sizeof seqs); /* the positions follow from the descriptors, on the device */
        if (!exec) {
            MUST(moex_cuda_graph_begin(g_gpu, g_stream));
            moex_status st = moex_cuda_linear(&blas, &wq.gpu, dx, nseq, r.dq, NULL, g_stream);
            if (!st) st = moex_cuda_positions(r.dseqs, nseq, nseq, dpos, g_stream);
            if (!st) st = moex_cuda_rope_cos_sin(dinv, d, dpos, nseq, dc, ds, g_stream);
            if (!st) st = moex_cuda_rope_apply(r.dq, nseq, heads, d, d, dc, ds, g_stream);
            if (!st) st = moex_cuda_rope_apply(r.dk, nseq, KV, d, d, dc, ds, g_stream);
            if (!st) st = moex_cuda_attention(&r.gpu, 0, r.dseqs, nseq, nseq, heads, r.dq, r.dk, r.dv, r.dout, 0, NULL,
                                              g_flags, g_stream);
            if (!st) st = moex_cuda_linear(&blas, &wo.gpu, r.dout, nseq, dlog, NULL, g_stream);
            if (!st) st = moex_cuda_argmax(dlog, nseq, V, dtok, g_stream);
            void *e = NULL;
            moex_status st2 = moex_cuda_graph_end(g_gpu, g_stream, &e);
            if (st || st2) {
                fail_at(__FILE__, __LINE__, "graph capture: %s", moex_last_error());
                moex_cuda_graph_free(e);
                break;
            }
            exec = e;
        }
        MUST(moex_cuda_graph_launch(g_gpu, exec, g_stream));
        CHECK(sync_flags() == 0, "graph step %d: status word set", step);
        // the CPU side
        float q[3 * 320], cosv[3 * 32], sinv[3 * 32], att[3 * 320], logits[3 * 77];
        MUST(moex_linear(&wq.cpu, x, nseq, q, 1));
        MUST(moex_rope_cos_sin(inv, d, pos, nseq, cosv, sinv));
        MUST(moex_rope_apply(q, nseq, heads, d, cosv, sinv));
        MUST(moex_rope_apply(kk, nseq, KV, d, cosv, sinv));
        MUST(moex_attention_forward_batch(r.cpu, 0, seqs, nseq, heads, q, kk, vv, att, 1));
        MUST(moex_linear(&wo.cpu, att, nseq, logits, 1));
        float glog[3 * 77];
        int64_t gtok[3];
        down(glog, dlog, sizeof glog), down(gtok, dtok, sizeof gtok);
        char what[64];
        snprintf(what, sizeof what, "graph decode step %d: logits", step);
        close_f32(what, glog, logits, nseq * V, 1e-4, 1e-5 * max_abs(logits, nseq * V));
        for (int i = 0; i < 3; i++) {
            int64_t t = -1;
            moex_sample_greedy(glog + i * V, V, &t); /* the device's argmax of the device's logits */
            CHECK(gtok[i] == t, "graph decode step %d seq %d: token %lld, argmax of its logits %lld", step, i,
                  (long long)gtok[i], (long long)t);
        }
        rig_check_lengths(&r, what);
        for (int i = 0; i < 3; i++) past[i]++;
    }
    moex_cuda_graph_free(exec);
    dfree(dinv), dfree(dx), dfree(dc), dfree(ds), dfree(dlog), dfree(dpos), dfree(dtok);
    lin_free(&wq), lin_free(&wo);
    rig_free(&r);
    moex_cuda_blas_free(&blas);
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct test_entry {
    const char *name;
    void (*fn)(void);
} test_entry;

/* ------------------------------------------------------------------------ */
/* the step's op tables: CPU and CUDA on the same inputs                    */
/* ------------------------------------------------------------------------ */

static void test_op_tables(void) {
    moex_cuda_blas blas;
    MUST(moex_cuda_blas_create(g_gpu, 0, &blas));
    const moex_decoder_env ce = {&moex_decoder_ops_cpu, {MOEX_DEVICE_CPU, 0}, 2, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    const moex_decoder_env ge = {&moex_decoder_ops_cuda, {MOEX_DEVICE_CUDA, g_gpu}, 0, NULL, g_stream, g_flags, &blas,
                                 NULL, NULL, 0, 0};
    const moex_decoder_ops *c = ce.ops, *g = ge.ops;
    enum { NSEQ = 3, T = 9, H = 40, I = 72, V = 301 };
    const moex_attn_seq seqs[NSEQ] = {{0, 4, 3}, {2, 0, 5}, {1, 5, 0}};
    moex_attn_seq *dseqs = dmalloc(sizeof seqs);
    MUST(g->copy_in(&ge, dseqs, seqs, sizeof seqs));
    // positions and the last rows: exact
    int64_t cpos[T], gpos[T], *dpos = dmalloc(sizeof gpos);
    MUST(c->positions(&ce, seqs, NSEQ, T, cpos));
    MUST(g->positions(&ge, dseqs, NSEQ, T, dpos));
    sync_flags();
    MUST(g->copy_out(&ge, gpos, dpos, sizeof gpos));
    CHECK(memcmp(cpos, gpos, sizeof cpos) == 0, "op tables: positions differ");
    float x[T * H], cl[NSEQ * H], gl[NSEQ * H];
    fill(x, T * H, -3, 3);
    float *dx = dup_to_dev(x, sizeof x), *dl = dmalloc(sizeof gl);
    MUST(c->gather_last_rows(&ce, x, H, seqs, NSEQ, cl));
    MUST(g->gather_last_rows(&ge, dx, H, dseqs, NSEQ, dl));
    sync_flags();
    MUST(g->copy_out(&ge, gl, dl, sizeof gl));
    CHECK(memcmp(cl, gl, sizeof cl) == 0, "op tables: last rows differ");
    // argmax with a tie, a NaN and a -inf row: exact
    static float lg[NSEQ * V];
    fill(lg, NSEQ * V, -5, 5);
    lg[7] = lg[100] = 9.0f, lg[V + 30] = NAN;
    for (int i = 0; i < V; i++) lg[2 * V + i] = -INFINITY;
    float *dlg = dup_to_dev(lg, sizeof lg);
    int64_t ct[NSEQ], gt[NSEQ], *dt = dmalloc(sizeof gt);
    MUST(c->argmax(&ce, lg, NSEQ, V, ct));
    MUST(g->argmax(&ge, dlg, NSEQ, V, dt));
    sync_flags();
    MUST(g->copy_out(&ge, gt, dt, sizeof gt));
    CHECK(memcmp(ct, gt, sizeof ct) == 0 && ct[0] == 7 && ct[1] == -31 && ct[2] == 0,
          "op tables: argmax cpu %lld %lld %lld, gpu %lld %lld %lld", (long long)ct[0], (long long)ct[1],
          (long long)ct[2], (long long)gt[0], (long long)gt[1], (long long)gt[2]);
    // the residual add, bf16 rounding, conversion: exact
    float y[T * H], cy[T * H], gy[T * H];
    fill(y, T * H, -3, 3);
    float *dy = dup_to_dev(y, sizeof y);
    MUST(c->add(&ce, x, y, cy, T * H));
    MUST(g->add(&ge, dx, dy, dy, T * H));
    MUST(c->round_bf16(&ce, cy, T * H));
    MUST(g->round_bf16(&ge, dy, T * H));
    uint16_t c16[T * H], g16[T * H], *d16 = dmalloc(sizeof g16);
    MUST(c->convert(&ce, x, MOEX_F32, c16, MOEX_BF16, T * H));
    MUST(g->convert(&ge, dx, MOEX_F32, d16, MOEX_BF16, T * H));
    sync_flags();
    MUST(g->copy_out(&ge, gy, dy, sizeof gy));
    MUST(g->copy_out(&ge, g16, d16, sizeof g16));
    CHECK(memcmp(cy, gy, sizeof cy) == 0, "op tables: add + bf16 rounding differ");
    CHECK(memcmp(c16, g16, sizeof c16) == 0, "op tables: conversion to bf16 differs");
    // the shared expert's gate (the device's expf) and a gated MLP (cuBLAS): close
    float sgl[T], cs[T * H], gs[T * H];
    fill(sgl, T, -6, 6);
    memcpy(cs, x, sizeof cs);
    float *dsg = dup_to_dev(sgl, sizeof sgl), *dsc = dup_to_dev(x, sizeof x);
    MUST(c->scale_rows_sigmoid(&ce, sgl, cs, T, H));
    MUST(g->scale_rows_sigmoid(&ge, dsg, dsc, T, H));
    sync_flags();
    MUST(g->copy_out(&ge, gs, dsc, sizeof gs));
    close_f32("op tables: shared-expert gate", gs, cs, T * H, 2e-6, 1e-7);
    lin_pair wg, wu, wd;
    lin_make(&wg, I, H, MOEX_F32, 0, MOEX_F32), lin_make(&wu, I, H, MOEX_F32, 0, MOEX_F32);
    lin_make(&wd, H, I, MOEX_F32, 0, MOEX_F32);
    const moex_mlp_w cm = {wg.cpu, wu.cpu, wd.cpu, MOEX_ACT_SILU}, gm = {wg.gpu, wu.gpu, wd.gpu, MOEX_ACT_SILU};
    float cmo[T * H], gmo[T * H];
    float *dgate = dmalloc(sizeof(float) * T * I), *dup_ = dmalloc(sizeof(float) * T * I), *dmo = dmalloc(sizeof gmo);
    MUST(c->mlp(&ce, &cm, x, T, cmo, NULL, NULL));
    MUST(g->mlp(&ge, &gm, dx, T, dmo, dgate, dup_));
    sync_flags();
    MUST(g->copy_out(&ge, gmo, dmo, sizeof gmo));
    close_f32("op tables: gated mlp", gmo, cmo, T * H, 1e-4, 1e-5 * max_abs(cmo, T * H));
    check_nmse("op tables: gated mlp", gmo, cmo, T * H, 1e-10);
    lin_free(&wg), lin_free(&wu), lin_free(&wd);
    dfree(dseqs), dfree(dpos), dfree(dx), dfree(dl), dfree(dlg), dfree(dt), dfree(dy), dfree(d16);
    dfree(dsg), dfree(dsc), dfree(dgate), dfree(dup_), dfree(dmo);
    moex_cuda_blas_free(&blas);
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_decoder", argc, argv, &g_quick, &g_gpu)) return 2;
    moex_device dev = {MOEX_DEVICE_CUDA, g_gpu};
    moex_device_info info;
    if (moex_device_query(dev, &info) != MOEX_OK) {
        fprintf(stderr, "test_cuda_decoder: moex_device_query(cuda:%d): %s\n", g_gpu, moex_last_error());
        return 1;
    }
    if (!info.available) {
        printf("SKIP: cuda:%d is not usable: %s\n", g_gpu, info.reason);
        return EXIT_SKIP;
    }
    if (cudaSetDevice(g_gpu) != cudaSuccess || cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&g_flags, sizeof(int)) != cudaSuccess || cudaMemset(g_flags, 0, sizeof(int)) != cudaSuccess ||
        cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess) { /* the zero in place before g_stream's kernels */
        fprintf(stderr, "test_cuda_decoder: setting up cuda:%d: %s\n", g_gpu, cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    printf("test_cuda_decoder: moex %s on %s (compute capability %d.%d)%s\n", moex_version(), info.name, info.cc_major,
           info.cc_minor, g_quick ? ", quick subset" : "");
    fflush(stdout);
    static const test_entry TESTS[] = {
        {"embedding", test_embedding}, {"rmsnorm", test_rmsnorm},         {"rope", test_rope},
        {"attention", test_attention}, {"latent attention", test_latent_attention},
        {"copy_rows and scale", test_copy_scale}, {"routers", test_routers},         {"elementwise", test_elementwise},
        {"argmax", test_argmax},       {"linear", test_linear},           {"graph_decode", test_graph_decode},
        {"op_tables", test_op_tables},
    };
    int failed_tests = 0, n = (int)(sizeof TESTS / sizeof TESTS[0]);
    for (int i = 0; i < n; i++) {
        int before = g_failures, checks = g_checks;
        double t0 = now_s();
        TESTS[i].fn();
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) fail_at(__FILE__, __LINE__, "%s: CUDA error after the test: %s", TESTS[i].name, cudaGetErrorString(e));
        int f = g_failures - before;
        printf("[%s] %-14s %6d checks, %d failed  (%.1f s)\n", f ? "FAIL" : " OK ", TESTS[i].name, g_checks - checks, f,
               now_s() - t0);
        fflush(stdout);
        failed_tests += f != 0;
    }
    cudaFree(g_flags);
    cudaStreamDestroy(g_stream);
    printf("test_cuda_decoder: %d of %d tests passed, %d checks, %d failed\n", n - failed_tests, n, g_checks,
           g_failures);
    return g_failures ? 1 : 0;
}
