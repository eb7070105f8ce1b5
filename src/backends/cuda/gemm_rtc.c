/* gemm_rtc.c — the NVRTC source of a specialised grouped GEMM kernel (see gemm_rtc.h). */
#include "backends/cuda/gemm_rtc.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* the embedded headers (the build generates them: cmake/embed_sources.cmake) */
extern const char *const moex_gemm_rtc_headers_names[], *const moex_gemm_rtc_headers_texts[];
extern const int moex_gemm_rtc_headers_count;

static int has_bf16_header(const char *dir) {
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%.4000s/cuda_bf16.h", dir);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int moex_gemm_rtc_cuda_include(char *dir, size_t n, char *why, size_t wn) {
    const char *forced = getenv("MOEX_CUDA_INCLUDE_DIR");
    if (forced && *forced) {
        if (has_bf16_header(forced) && (size_t)snprintf(dir, n, "%s", forced) < n) return 1;
        snprintf(why, wn, "MOEX_CUDA_INCLUDE_DIR=%s holds no cuda_bf16.h (the CUDA toolkit's headers, which the "
                 "kernels compiled at run time include)", forced);
        return 0;
    }
    const char *home = getenv("CUDA_HOME"), *path = getenv("CUDA_PATH");
    char cand[4][4100];
    int m = 0;
    if (home && *home) snprintf(cand[m++], sizeof cand[0], "%s/include", home);
    if (path && *path) snprintf(cand[m++], sizeof cand[0], "%s/include", path);
#ifdef MOEX_CUDA_INCLUDE_BUILT
    snprintf(cand[m++], sizeof cand[0], "%s", MOEX_CUDA_INCLUDE_BUILT);
#endif
    snprintf(cand[m++], sizeof cand[0], "/usr/local/cuda/include");
    for (int i = 0; i < m; i++)
        if (has_bf16_header(cand[i]) && (size_t)snprintf(dir, n, "%s", cand[i]) < n) return 1;
    int w = snprintf(why, wn, "the CUDA toolkit's headers (cuda_bf16.h), which the kernels compiled at run time "
                     "include, are in none of");
    for (int i = 0; i < m && w > 0 && (size_t)w < wn; i++) w += snprintf(why + w, wn - (size_t)w, " %s", cand[i]);
    if (w > 0 && (size_t)w < wn) snprintf(why + w, wn - (size_t)w, ": set CUDA_HOME or MOEX_CUDA_INCLUDE_DIR");
    return 0;
}

moex_status moex_gemm_rtc_source(const gemm_rtc_spec *s, int cc, char *text, size_t text_n, const char **options,
                                 char *inc, size_t inc_n, moex_jit_source *src) {
    static const char *const TYPES[] = {"__nv_bfloat16", "__half", "uint8_t"};
    static const char *const NAMES[] = {"bf16", "f16", "e4m3"};
    if (!s || !text || !options || !inc || !src) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: a NULL argument");
    if ((int)s->format < 0 || (int)s->format > 2)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: format %d is not bf16 (0), f16 (1) or e4m3 (2)", (int)s->format);
    if (s->epilogue < 0 || s->epilogue > 3)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: epilogue %d is not 0-3", s->epilogue);
    const int variants = s->epilogue == 0 || s->epilogue == 1; /* down and concatenated gate/up */
    if ((s->overlap || s->narrow) && !variants)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: the %s variant takes the down and concatenated gate/up "
                         "epilogues, not epilogue %d", s->narrow ? "narrow" : "overlapped", s->epilogue);
    if (s->overlap && s->narrow)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: a kernel is overlapped or narrow, not both");
    if (s->format == GEMM_RTC_E4M3 && (!variants || s->overlap))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: the FP8 kernels take the down and concatenated gate/up "
                         "epilogues without overlap (epilogue %d%s)", s->epilogue, s->overlap ? ", overlapped" : "");
    if (s->K < 1 || s->K > 2147483647LL)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: K = %lld is outside 1 .. 2^31 - 1", s->K);
    char why[600];
    if (!moex_gemm_rtc_cuda_include(inc + 2, inc_n > 2 ? inc_n - 2 : 0, why, sizeof why))
        return moex_fail(MOEX_ERR_UNSUPPORTED, "gemm_rtc: %s", why);
    inc[0] = '-', inc[1] = 'I';
    const int w = snprintf(text, text_n,
                           "#include \"backends/cuda/gemm_sm90_kernel.cuh\"\n"
                           "/* %s, epilogue %d%s%s, K = %lld */\n"
                           "extern \"C\" __global__ void __launch_bounds__(THREADS, 1)\n"
                           "    " GEMM_RTC_ENTRY "(const __grid_constant__ CUtensorMap map_a,\n"
                           "                      const __grid_constant__ CUtensorMap map_b, gemm_params p) {\n"
                           "    grouped_gemm_body<%s, %d, %s, %s, %lldll>(map_a, map_b, p);\n"
                           "}\n",
                           NAMES[s->format], s->epilogue, s->overlap ? ", overlapped" : "", s->narrow ? ", narrow" : "", s->K,
                           TYPES[s->format], s->epilogue, s->overlap ? "true" : "false", s->narrow ? "true" : "false", s->K);
    if (w < 0 || (size_t)w >= text_n) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "gemm_rtc: text buffer too small");
    /* -default-device: the unannotated functions of the shared headers are device functions here */
    options[0] = "-std=c++17";
    options[1] = "-default-device";
    options[2] = inc;
    memset(src, 0, sizeof *src);
    src->name = "grouped_gemm";
    src->text = text;
    src->options = options;
    src->n_options = 3;
    src->cc = cc;
    src->arch_specific = cc == 90;
    src->header_names = moex_gemm_rtc_headers_names;
    src->header_texts = moex_gemm_rtc_headers_texts;
    src->n_headers = moex_gemm_rtc_headers_count;
    return MOEX_OK;
}
