/* mla.c — the two per-head products of DeepSeek-V3's absorbed latent attention (see decoder.h):
 * kv_b's key rows folded into the query, and its value rows applied to the attended latents, over
 * the CPU GEMM that moex_linear uses. */
#include "decoder/decoder.h"
#include "linear/gemm.h"
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* Output columns per work item: moex_gemm's packed path takes at most 2*MOEX_NB. */
#define MLA_NB (2 * MOEX_NB)

static moex_status check_mla(const char *fn, const moex_linear_w *kv_b, int64_t heads, int64_t nope, int64_t vd,
                             int64_t T, int threads) {
    if (!kv_b || !kv_b->weight) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b's weight is NULL", fn);
    if (!moex_is_float_dtype(kv_b->dtype))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b's dtype %s is not f32, f16 or bf16", fn,
                         moex_dtype_name(kv_b->dtype));
    if (kv_b->bias) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b has a bias (DeepSeek-V3's has none)", fn);
    if (heads < 1 || nope < 1 || vd < 1 || kv_b->in_features < 1 || heads > INT32_MAX / (nope + vd) ||
        kv_b->out_features != heads * (nope + vd))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: kv_b is [%lld, %lld], which is not %lld heads of %lld key + "
                         "%lld value rows", fn, (long long)kv_b->out_features, (long long)kv_b->in_features,
                         (long long)heads, (long long)nope, (long long)vd);
    if (T < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: T = %lld is negative", fn, (long long)T);
    if (threads < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: threads = %d is negative", fn, threads);
    return MOEX_OK;
}

// Per head h and block of MLA_NB output columns: c[t, h, n] = sum_k a[t, h, k] * B_h(k, n), k < K, n < N.
// b0: B for head 0; head_step: how far base (not transposed) or w (transposed, in elements) moves a head.
// a: [T, heads, a_ld], c: [T, heads, c_head].
static moex_status per_head(const char *fn, const moex_bmat *b0, int64_t head_step, int64_t heads, int64_t T,
                            const float *a, int64_t a_ld, int64_t K, float *c, int64_t c_head, int64_t N, int threads) {
    const int64_t nb = (N + MLA_NB - 1) / MLA_NB, items = heads * nb;
    int nt = threads > 0 ? threads : moex_cpu_cores();
    if (nt < 1) nt = 1;
    if ((int64_t)nt > items) nt = (int)items;
    const size_t pack_floats = (size_t)MOEX_KC * MLA_NB;
    const float **rows = malloc(sizeof(*rows) * (size_t)(T * nt));
    float *pack = aligned_alloc(64, sizeof(float) * pack_floats * (size_t)nt);
    if (!rows || !pack) {
        free(rows);
        free(pack);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: no memory for row pointers and %d GEMM panels", fn, nt);
    }
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const size_t esz = moex_dtype_size(b0->dtype);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int me = omp_get_thread_num();
        float *pk = pack + pack_floats * (size_t)me;
        const float **rp = rows + (size_t)T * (size_t)me;
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            const int64_t h = it / nb, n0 = (it % nb) * MLA_NB, nc = N - n0 < MLA_NB ? N - n0 : MLA_NB;
            moex_bmat b = *b0;
            if (b.transposed) {
                b.w = (const char *)b0->w + (size_t)(h * head_step) * esz;
                b.base = n0;
            } else {
                b.base = b0->base + h * head_step + n0;
            }
            for (int64_t t = 0; t < T; t++) rp[t] = a + (t * heads + h) * a_ld;
            moex_gemm(kr, (const float *const *)rp, T, &b, nc, K, c + h * c_head + n0, heads * c_head, pk, NULL,
                      MOEX_F32);
        }
    }
    free(rows);
    free(pack);
    return MOEX_OK;
}

moex_status moex_mla_absorb(const moex_linear_w *kv_b, int64_t heads, int64_t nope, int64_t vd, const float *q,
                            int64_t q_stride, int64_t T, float *out, int64_t out_stride, int threads) {
    const char *fn = "mla_absorb";
    moex_status st = check_mla(fn, kv_b, heads, nope, vd, T, threads);
    if (st) return st;
    const int64_t r = kv_b->in_features;
    if (q_stride < nope || out_stride < r)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: q_stride = %lld (needs >= %lld), out_stride = %lld (needs >= "
                         "%lld)", fn, (long long)q_stride, (long long)nope, (long long)out_stride, (long long)r);
    if (T == 0) return MOEX_OK;
    if (!q || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !q ? "q" : "out");
    /* B_h(k, n) = kv_b[h * (nope + vd) + k, n]: the key rows of head h read as [nope, r] */
    const moex_bmat b = {.w = kv_b->weight, .dtype = kv_b->dtype, .transposed = 1, .ld = r, .base = 0};
    return per_head(fn, &b, (nope + vd) * r, heads, T, q, q_stride, nope, out, out_stride, r, threads);
}

moex_status moex_mla_values(const moex_linear_w *kv_b, int64_t heads, int64_t nope, int64_t vd, const float *lat,
                            int64_t T, float *out, int threads) {
    const char *fn = "mla_values";
    moex_status st = check_mla(fn, kv_b, heads, nope, vd, T, threads);
    if (st) return st;
    if (T == 0) return MOEX_OK;
    if (!lat || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !lat ? "lat" : "out");
    const int64_t r = kv_b->in_features;
    /* B_h(k, n) = kv_b[h * (nope + vd) + nope + n, k]: the value rows of head h */
    const moex_bmat b = {.w = kv_b->weight, .dtype = kv_b->dtype, .transposed = 0, .ld = r, .base = nope};
    return per_head(fn, &b, nope + vd, heads, T, lat, r, r, out, vd, vd, threads);
}
