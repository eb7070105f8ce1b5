/*
 * test_gemm_rtc.c — the grouped GEMM's kernels compiled at run time (src/backends/cuda/gemm_rtc.c):
 * the kernel family's source (gemm_sm90_kernel.cuh, the same mainloop the library's grouped_mm
 * runs) with the embedded headers compiles under NVRTC for sm_90a in each format (bf16, f16,
 * FP8), epilogue and tile variant, with K compiled in, into an image that holds the entry point,
 * with no wgmma serialised and no wait injected by ptxas (as scripts/check_wgmma.sh checks the
 * library's);
 * specs the family does not have are refused naming them; the CUDA headers' directory setting.
 * Needs NVRTC and the CUDA toolkit's headers, not a GPU (running the kernels is the GPU tests').
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/gemm_rtc.h"
#include "testutil.h"

static int ready(void) {
    char why[600], dir[4096];
    if (!moex_jit_nvrtc_available(NULL, NULL, why, sizeof why) ||
        !moex_gemm_rtc_cuda_include(dir, sizeof dir, why, sizeof why)) {
        print_message("not here: %s\n", why);
        return 0;
    }
    return 1;
}

/* 1 if the image holds the bytes of s (its symbol table names the entry point). */
static int image_has(const moex_jit_image *img, const char *s) {
    const size_t n = strlen(s);
    for (size_t i = 0; i + n <= img->size; i++)
        if (memcmp((const char *)img->data + i, s, n) == 0) return 1;
    return 0;
}

static void test_kernels_compile(void **state) {
    (void)state;
    if (!ready()) skip();
    static const gemm_rtc_spec SPECS[] = {
        {GEMM_RTC_BF16, 1, 1, 0, 2048}, /* gate/up, overlapped epilogue (qwen3-30b-a3b's hidden size) */
        {GEMM_RTC_BF16, 0, 0, 1, 768},  /* down, narrow tiles */
        {GEMM_RTC_F16, 2, 0, 0, 336},   /* interleaved gate/up, a K not a multiple of the k-block */
        {GEMM_RTC_E4M3, 1, 0, 0, 7168}, /* FP8 gate/up (deepseek-v3's hidden size) */
        {GEMM_RTC_E4M3, 0, 0, 1, 2048}, /* FP8 down, narrow tiles */
    };
    for (int i = 0; i < (int)(sizeof SPECS / sizeof SPECS[0]); i++) {
        char text[2048], inc[4200];
        const char *opts[8];
        moex_jit_source src;
        assert_int_equal(moex_gemm_rtc_source(&SPECS[i], 90, text, sizeof text, opts, inc, sizeof inc, &src), MOEX_OK);
        char k[40];
        snprintf(k, sizeof k, "%lldll", SPECS[i].K);
        if (!strstr(text, k) || !strstr(text, GEMM_RTC_ENTRY)) PROBLEM("spec %d: source without K or the entry:\n%s", i, text);
        opts[src.n_options++] = "--ptxas-options=-v"; /* the log says whether ptxas serialised a wgmma */
        moex_jit_image img;
        moex_status st = moex_jit_build(&src, "", &img);
        if (st != MOEX_OK) {
            PROBLEM("spec %d did not compile: %s", i, moex_last_error());
            continue;
        }
        const unsigned char *p = (const unsigned char *)img.data;
        if (img.size < 64 || p[0] != 0x7f || p[18] != 190) PROBLEM("spec %d: not a CUDA image", i);
        if (!image_has(&img, GEMM_RTC_ENTRY)) PROBLEM("spec %d: the image has no %s", i, GEMM_RTC_ENTRY);
        /* as scripts/check_wgmma.sh checks the library's kernels: no wgmma serialised (C7518), no
         * wait injected (C7517) */
        if (!img.log || !strstr(img.log, GEMM_RTC_ENTRY)) PROBLEM("spec %d: no ptxas log", i);
        else if (strstr(img.log, "C7518") || strstr(img.log, "C7517")) PROBLEM("spec %d: ptxas says:\n%s", i, img.log);
        print_message("spec %d: %zu bytes in %.0f ms\n", i, img.size, img.compile_ms);
        moex_jit_image_free(&img);
    }
    end_problems();
}

static void test_bad_specs(void **state) {
    (void)state;
    char text[2048], inc[4200];
    const char *opts[8];
    moex_jit_source src;
    static const struct {
        gemm_rtc_spec s;
        const char *says;
    } BAD[] = {
        {{(gemm_rtc_format)7, 0, 0, 0, 64}, "format 7"},
        {{GEMM_RTC_BF16, 4, 0, 0, 64}, "epilogue 4"},
        {{GEMM_RTC_BF16, 2, 0, 1, 64}, "narrow"},
        {{GEMM_RTC_BF16, 3, 1, 0, 64}, "overlapped"},
        {{GEMM_RTC_BF16, 1, 1, 1, 64}, "not both"},
        {{GEMM_RTC_E4M3, 2, 0, 0, 64}, "FP8"},
        {{GEMM_RTC_E4M3, 1, 1, 0, 64}, "FP8"},
        {{GEMM_RTC_BF16, 0, 0, 0, 0}, "K = 0"},
    };
    for (int i = 0; i < (int)(sizeof BAD / sizeof BAD[0]); i++) {
        moex_status st = moex_gemm_rtc_source(&BAD[i].s, 90, text, sizeof text, opts, inc, sizeof inc, &src);
        if (st != MOEX_ERR_INVALID_ARGUMENT || !contains(moex_last_error(), BAD[i].says))
            PROBLEM("bad spec %d: %s, \"%s\"", i, moex_status_str(st), moex_last_error());
    }
    gemm_rtc_spec ok = {GEMM_RTC_BF16, 0, 0, 0, 64};
    if (moex_gemm_rtc_source(&ok, 90, text, 16, opts, inc, sizeof inc, &src) == MOEX_OK) PROBLEM("a 16-byte text buffer");
    end_problems();
}

static void test_cuda_include_dir(void **state) {
    (void)state;
    char dir[4096], why[600], *saved = getenv("MOEX_CUDA_INCLUDE_DIR");
    saved = saved ? strdup(saved) : NULL;
    setenv("MOEX_CUDA_INCLUDE_DIR", "/nonexistent/cuda/include", 1);
    if (moex_gemm_rtc_cuda_include(dir, sizeof dir, why, sizeof why) || !contains(why, "/nonexistent/cuda/include") ||
        !contains(why, "cuda_bf16.h"))
        PROBLEM("a setting without the headers: \"%s\"", why);
    char text[2048], inc[4200];
    const char *opts[8];
    moex_jit_source src;
    gemm_rtc_spec ok = {GEMM_RTC_BF16, 0, 0, 0, 64};
    if (moex_gemm_rtc_source(&ok, 90, text, sizeof text, opts, inc, sizeof inc, &src) != MOEX_ERR_UNSUPPORTED ||
        !contains(moex_last_error(), "MOEX_CUDA_INCLUDE_DIR"))
        PROBLEM("source without the headers: \"%s\"", moex_last_error());
    if (saved) setenv("MOEX_CUDA_INCLUDE_DIR", saved, 1);
    else unsetenv("MOEX_CUDA_INCLUDE_DIR");
    free(saved);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_compile),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_cuda_include_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
