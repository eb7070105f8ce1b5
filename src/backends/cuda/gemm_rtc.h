/* gemm_rtc.h — the grouped GEMM's kernels compiled at run time (for the deepgemm backend): the
 * NVRTC source of one kernel of gemm_sm90_kernel.cuh specialised for a format, an epilogue, a
 * tile variant and the input size K, with the library's device headers embedded at build time
 * (cmake/embed_sources.cmake) and the CUDA toolkit's headers (cuda_bf16.h, cuda_fp16.h) found at
 * run time. Plain C: it compiles into every build; running the kernels needs a GPU. */
#ifndef MOEX_GEMM_RTC_H
#define MOEX_GEMM_RTC_H

#include "gpu/jit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gemm_rtc_format { GEMM_RTC_BF16 = 0, GEMM_RTC_F16 = 1, GEMM_RTC_E4M3 = 2 } gemm_rtc_format;

/* One kernel: the template arguments of grouped_gemm_body. */
typedef struct gemm_rtc_spec {
    gemm_rtc_format format;
    int epilogue;   /* gemm_epilogue: 0 down, 1 gate/up concatenated, 2 interleaved, 3 up only */
    int overlap;    /* the overlapped epilogue (bf16/f16, down or concatenated gate/up) */
    int narrow;     /* tiles of 64 rows (down or concatenated gate/up) */
    long long K;    /* the input size compiled in (1 .. 2^31), the k-loop's trip count a constant */
} gemm_rtc_spec;

/* The kernel's entry point in every image. */
#define GEMM_RTC_ENTRY "moex_grouped_gemm"

/* The CUDA toolkit's include directory (the one holding cuda_bf16.h): $MOEX_CUDA_INCLUDE_DIR if
 * set (and only it), else $CUDA_HOME/include, $CUDA_PATH/include, the toolkit this library was
 * built with, /usr/local/cuda/include. 0 and a reason naming where it looked if none has it. */
int moex_gemm_rtc_cuda_include(char *dir, size_t n, char *why, size_t wn);

/* Fill *src (and the caller's buffers: text of text_n bytes, options of 8 pointers, inc of
 * inc_n bytes for the include option) with spec's kernel for compute capability cc; a spec the
 * kernel family does not have is MOEX_ERR_INVALID_ARGUMENT naming it. */
moex_status moex_gemm_rtc_source(const gemm_rtc_spec *spec, int cc, char *text, size_t text_n, const char **options,
                                 char *inc, size_t inc_n, moex_jit_source *src);

#ifdef __cplusplus
}
#endif

#endif
