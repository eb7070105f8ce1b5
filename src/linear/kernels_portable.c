/* kernels_portable.c — portable C kernels (any CPU) and the run-time choice. */
#include "linear/kernels.h"
#include <pthread.h>
#include <stdlib.h>

static void micro(int64_t kc, const float *const *a, int64_t k0, const float *bp, float *c, int64_t ldc, int mr, int nr,
                  int accumulate) {
    float acc[MOEX_MR][MOEX_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < MOEX_MR; i++) {
            float ai = a[i][k0 + k];
            for (int j = 0; j < MOEX_NR; j++) acc[i][j] += ai * bp[k * MOEX_NR + j];
        }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

static void pack(const moex_bmat *b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float *bp) {
    if (moex_is_quant_dtype(b->dtype)) {
        moex_qpack_portable(b, k0, kc, n0, nc, bp);
        return;
    }
    int64_t panels = (nc + MOEX_NR - 1) / MOEX_NR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t k = 0; k < kc; k++)
            for (int j = 0; j < MOEX_NR; j++) {
                int64_t n = p * MOEX_NR + j;
                bp[(p * kc + k) * MOEX_NR + j] = n < nc ? moex_bmat_at(b, k0 + k, n0 + n) : 0.0f;
            }
}

static void stream(const moex_bmat *b, const float *const *a, int M, int64_t n0, int64_t nc, int64_t K, float *c,
                   int64_t ldc) {
    if (moex_is_quant_dtype(b->dtype)) {
        moex_qstream_portable(b, a, M, n0, nc, K, c, ldc);
        return;
    }
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < nc; n++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += a[m][k] * moex_bmat_at(b, k, n0 + n);
            c[m * ldc + n] = s;
        }
}

static void to_f32(const void *src, moex_dtype dtype, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = moex_load_f32(src, dtype, i);
}

static void axpy(float w, const float *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += w * src[i];
}

const moex_cpu_kernels moex_cpu_kernels_portable = {"portable", micro, pack, stream, to_f32, axpy, moex_act_quant_row};

static const moex_cpu_kernels *chosen;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

/* MOEX_CPU_KERNELS=portable forces the portable kernels (for testing them). */
static void choose(void) {
    const char *force = getenv("MOEX_CPU_KERNELS");
    int portable = force && strcmp(force, "portable") == 0;
    chosen = moex_cpu_has_avx2() && !portable ? &moex_cpu_kernels_avx2 : &moex_cpu_kernels_portable;
}

const moex_cpu_kernels *moex_cpu_kernels_get(void) {
    pthread_once(&choose_once, choose);
    return chosen;
}
