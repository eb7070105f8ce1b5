/* gemm_sm90.cuh — the Hopper tensor-core grouped GEMM (gemm_sm90.cu):
 * C[rows of expert e] = A[rows of e] . B_e^T for every expert at once, bf16 or
 * f16 in, f32 accumulation, with the experts' epilogues fused. */
#ifndef MOEX_GEMM_SM90_CUH
#define MOEX_GEMM_SM90_CUH

#include "cuda/device_common.cuh"
#include "core/internal.h"
#include <cuda_runtime.h>

/* Rows of A per tile: the routing's tile size (routing_build's tile_rows); GEMM_NARROW_ROWS
 * with grouped_gemm_args.narrow. */
#define GEMM_TILE_ROWS 128
#define GEMM_NARROW_ROWS 64

/* Build-time switches (bench/cuda-notes.md has the timings of each):
 *   GEMM_DIRECT_A 1 (an experiment, off: slower on deepseek-v3): the gate/up GEMM copies
 *     hidden rows by index into the swizzled stage (cp.async by the 128 producer threads)
 *     instead of reading a gathered copy with TMA;
 *   GEMM_CONSUMER_REGS: registers per consumer thread (232, or 200 as the direct copy needs);
 *     the producer gets the rest of the block's pool, (384*168 - 256*consumer) / 128. */
#ifndef GEMM_DIRECT_A
#define GEMM_DIRECT_A 0
#endif
#ifndef GEMM_CONSUMER_REGS
#define GEMM_CONSUMER_REGS (GEMM_DIRECT_A ? 200 : 232)
#endif

typedef enum gemm_epilogue {
    EPI_DOWN = 0,               /* c = acc + down bias */
    EPI_GATE_UP_CONCAT = 1,     /* c = act(gate + b, up + b); gate rows n, up rows up_offset + n */
    EPI_GATE_UP_INTERLEAVED = 2,/* gate rows 2n, up rows 2n+1 */
    EPI_UP_ONLY = 3             /* ungated: c = act(up + b) */
} gemm_epilogue;

typedef struct grouped_gemm_args {
    const void *a;             /* A [a_rows, K], rows of expert e at offsets[e] .. offsets[e+1] */
    int64_t a_rows;
    const int *a_rows_of;      /* NULL, or (GEMM_DIRECT_A) row s of A is a[a_rows_of[s] * a_ld ...] */
    int64_t a_ld;
    const void *b;             /* B [E * rows_per_expert, K]: expert e's matrix from row e*rows_per_expert */
    int64_t rows_per_expert, up_offset;
    int64_t K, N;              /* N: outputs per row (H for down, I for gate/up) */
    void *c;                   /* C [a_rows, N], row stride N */
    const int *offsets, *mtile_off;
    int64_t e_begin, e_end;    /* experts computed: [e_begin, e_end) */
    gemm_epilogue epi;
    layer_view L;              /* activation and biases */
    moex_dtype dt;             /* bf16 or f16: A, B and C */
    int narrow;                /* tiles of GEMM_NARROW_ROWS rows (the routing's tile_rows): for experts of few
                                  rows; down and concatenated gate/up epilogues, A read with TMA */
} grouped_gemm_args;

/* 1 if the tensor-core path can take a layer with these matrices (strides,
 * alignment, dtype); otherwise 0 and a reason. */
int grouped_gemm_usable(moex_dtype dt, const void *b, int64_t K, char *why, size_t n);

/* Once per process and device, before capture: kernel attributes. */
moex_status grouped_gemm_init(void);

/* Queue the GEMM on s with a persistent grid of num_sms blocks. */
moex_status grouped_gemm_run(const grouped_gemm_args *g, int num_sms, cudaStream_t s);

#endif
