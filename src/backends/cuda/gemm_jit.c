/* gemm_jit.c — the process's run-time compiled grouped GEMM kernels (see gemm_jit.h): a list
 * under one lock. The lock is held through a compile, so two threads asking for the same new
 * kernel compile it once. */
#include "backends/cuda/gemm_jit.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct held {
    int device, cc;
    gemm_rtc_spec spec;
    moex_jit_kernel kernel;
} held;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static held *list;
static int n_held, cap_held;

static int same(const held *h, int device, int cc, const gemm_rtc_spec *s) {
    return h->device == device && h->cc == cc && h->spec.format == s->format && h->spec.epilogue == s->epilogue &&
           h->spec.overlap == s->overlap && h->spec.narrow == s->narrow && h->spec.K == s->K;
}

/* Compile (or read) and load spec's kernel into *h. */
static moex_status make(int device, int cc, const gemm_rtc_spec *spec, int smem_bytes, const char *cache_dir,
                        held *h) {
    char text[1024], inc[4200];
    const char *options[8];
    moex_jit_source src;
    moex_status st = moex_gemm_rtc_source(spec, cc, text, sizeof text, options, inc, sizeof inc, &src);
    if (st) return st;
    st = moex_jit_kernel_get(&src, GEMM_RTC_ENTRY, cache_dir, &h->kernel, NULL);
    if (st) return st;
    if ((st = moex_jit_kernel_smem(&h->kernel, smem_bytes))) {
        moex_jit_kernel_release(&h->kernel);
        return st;
    }
    h->device = device, h->cc = cc, h->spec = *spec;
    return MOEX_OK;
}

moex_status gemm_jit_kernel(int device, int cc, const gemm_rtc_spec *spec, int smem_bytes, const char *cache_dir,
                            moex_jit_kernel *k) {
    if (!spec || !k) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_jit: NULL spec or kernel");
    memset(k, 0, sizeof *k);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_held; i++)
        if (same(&list[i], device, cc, spec)) {
            *k = list[i].kernel;
            pthread_mutex_unlock(&lock);
            return MOEX_OK;
        }
    moex_status st = MOEX_OK;
    if (n_held == cap_held) {
        const int cap = cap_held ? 2 * cap_held : 32;
        held *bigger = (held *)realloc(list, (size_t)cap * sizeof *list);
        if (!bigger) st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "gemm_jit: out of memory");
        else list = bigger, cap_held = cap;
    }
    held h;
    memset(&h, 0, sizeof h);
    if (!st) st = make(device, cc, spec, smem_bytes, cache_dir, &h);
    if (!st) {
        list[n_held++] = h;
        *k = h.kernel;
    }
    pthread_mutex_unlock(&lock);
    return st;
}
