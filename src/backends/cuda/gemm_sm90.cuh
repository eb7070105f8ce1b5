/* gemm_sm90.cuh — the Hopper tensor-core grouped GEMM (gemm_sm90.cu):
 * C[rows of expert e] = A[rows of e] . B_e^T for every expert at once, bf16 or
 * f16 in, or FP8 (e4m3 codes with block scales, C in f32), f32 accumulation,
 * with the experts' epilogues fused. */
#ifndef MOEX_GEMM_SM90_CUH
#define MOEX_GEMM_SM90_CUH

#include "backends/cuda/device_common.cuh"
#include "core/internal.h"
#ifndef __CUDACC_RTC__ /* NVRTC (the kernel compiled at run time) sees the types and the size policy only */
#include <cuda_runtime.h>
#endif
#include <stdio.h>

/* Rows of A per tile: the routing's tile size (routing_build's tile_rows); GEMM_NARROW_ROWS
 * with grouped_gemm_args.narrow. */
#define GEMM_TILE_ROWS 128
#define GEMM_NARROW_ROWS 64

typedef enum gemm_epilogue {
    EPI_DOWN = 0,               /* c = acc + down bias */
    EPI_GATE_UP_CONCAT = 1,     /* c = act(gate + b, up + b); gate rows n, up rows up_offset + n */
    EPI_GATE_UP_INTERLEAVED = 2,/* gate rows 2n, up rows 2n+1 */
    EPI_UP_ONLY = 3             /* ungated: c = act(up + b) */
} gemm_epilogue;

typedef struct grouped_gemm_args {
    const void *a;             /* A [a_rows, K], rows of expert e at offsets[e] .. ends[e]; with a_index, the
                                  matrix its rows are gathered from */
    int64_t a_rows;            /* with a_index: the rows of that matrix */
    const int *a_index;        /* NULL, or the gathered A-load (bf16/f16, gate/up epilogues): row r of the
                                  product is row a_index[r] of a, read inside the GEMM (no gathered copy) */
    int64_t a_ld;              /* with a_index: a's row stride in elements (16-byte aligned rows) */
    const float *row_scale;    /* NULL, or (down epilogue, bf16/f16) each output row times row_scale[r]:
                                  the routing weight of the row's pair */
    int64_t pairs;             /* the rows that hold pairs (the padded and masked layouts span more) */
    const void *b;             /* B [E * rows_per_expert, K]: expert e's matrix from row e*rows_per_expert */
    int64_t rows_per_expert, up_offset;
    int64_t K, N;              /* N: outputs per row (H for down, I for gate/up) */
    void *c;                   /* C [a_rows, N], row stride N */
    const int *offsets, *mtile_off;
    const int *ends;           /* [E] each expert's end row: offsets[e] + its rows (routing_dev.ends) */
    int64_t e_begin, e_end;    /* experts computed: [e_begin, e_end) */
    gemm_epilogue epi;
    layer_view L;              /* activation and biases */
    moex_dtype dt;             /* bf16 or f16: A, B and C; e4m3: A and B codes, C f32 */
    int narrow;                /* tiles of GEMM_NARROW_ROWS rows (the routing's tile_rows): for experts of few
                                  rows; down and concatenated gate/up epilogues, A read with TMA */
    const float *a_scales;     /* e4m3: A's scales [a_rows, ceil(K / q.bk)] */
    uint8_t *c_codes;          /* NULL, or (grouped_gemm_fp8_h_quant_fits) C quantized in the epilogue, not
                                  written in f32: e4m3 codes [a_rows, N] here, scales [a_rows, ceil(N / 128)]
                                  into c_scales, with act_quant_e4m3's rounding */
    float *c_scales;
    quant_view q;              /* e4m3: the weights' block scales */
    /* narrow tiles only (grouped_gemm_run_chained sets them; NULL otherwise): */
    int *tickets;              /* NULL (block b takes tiles b, b + grid, ...), or a counter, zero before the launch,
                                  from which each block takes its next tile once it has its first (b): a block whose
                                  tiles went fast takes more */
    int *done;                 /* NULL, or [E] counters: each consumer warp adds 1 to its tile's expert once it has
                                  stored its part of the tile (4 a float narrow tile: its warpgroup's warps; 8 an
                                  FP8 one: both warpgroups') */
    const int *wait_done;      /* NULL, or the earlier GEMM's `done`: A's rows of expert e are loaded only once
                                  wait_done[e] reaches its row tiles x wait_per_mtile (the down GEMM reading h) */
    int64_t wait_per_mtile;
    int64_t skip_tiles_at_most; /* 0, or (grouped_gemm_run_pair) the GEMM does nothing when the routing has at most
                                  this many row tiles */
} grouped_gemm_args;

/* ---- size policy: when this kernel family runs --------------------------------------------- */

/* The tensor-core path pays when experts average at least GEMM_MIN_AVG_ROWS rows (P pairs over E
 * experts: P >= 16 E). grouped_mm also takes it from one row per expert on average when the hidden
 * size is at least GEMM_LONG_K: each tile's k-loop is then long enough to stream the weights at
 * about the read rate, which a hidden size of 2048 is not (timings: dev/notes/cuda-notes.md).
 * eager's per-expert launches fill too few SMs for the long-k rule. Below both, the weights are
 * streamed (gemv.cuh). */
#define GEMM_MIN_AVG_ROWS 16
#define GEMM_LONG_K 4096
static inline int grouped_gemm_pays(int64_t P, int64_t E, int64_t H, int per_expert) {
    return P >= GEMM_MIN_AVG_ROWS * E || (!per_expert && H >= GEMM_LONG_K && P >= E);
}
/* The most pairs the streamed path of a layer that could take the tensor cores ever sees. */
static inline int64_t grouped_gemm_streamed_rows_max(int64_t P, int64_t E) {
    return P < GEMM_MIN_AVG_ROWS * E ? P : GEMM_MIN_AVG_ROWS * E;
}

/* FP8 layers take the tensor-core path when experts average at least GEMM_MIN_AVG_ROWS rows, at
 * every hidden size: the streamed FP8 forward (gemv.cuh) wins below it, on both shapes measured
 * (the crossover lies between 8 and 16 rows an expert: dev/notes/cuda-notes.md). */
static inline int grouped_gemm_fp8_pays(int64_t P, int64_t E) { return P >= GEMM_MIN_AVG_ROWS * E; }

/* Tiles of GEMM_NARROW_ROWS (64) rows pay when experts average at most GEMM_NARROW_AVG rows and
 * the gate/up layout is concatenated: a 128-row tile of such experts is mostly empty rows, which
 * the tensor cores multiply all the same (faster on both shapes: dev/notes/cuda-notes.md). */
#define GEMM_NARROW_AVG 32
static inline int grouped_gemm_narrow_pays(int64_t P, int64_t E, gemm_epilogue gate_up_epi) {
    return gate_up_epi == EPI_GATE_UP_CONCAT && P <= GEMM_NARROW_AVG * E;
}

/* FP8 wide tiles (not narrow; the down or concatenated gate/up epilogue) run in clusters of two
 * blocks that copy each box their two tiles share once from L2 and multicast it to both
 * (gemm_sm90_kernel.cuh, "clusters of two blocks") when the experts average more than half and at
 * most one and a half wide row tiles (P pairs over E experts): then many experts have a second,
 * short row tile, whose pair shares the weight tile, and the others' pairs are neighbouring
 * column tiles sharing A's rows. H100, grouped_mm FP8, the time against single blocks' (rows an
 * expert: mean ratio of two rounds, two variants where a range is given; 128 rows: one round):
 * qwen3-30b-a3b 96: 0.996, 128: 0.979, 160: 0.966-0.969, 192: 0.979; deepseek-v3 96: 0.999,
 * 128: 0.955, 160: 0.950-0.967, 192: 0.952. Measured losses on either side: at 48 rows
 * 1.043-1.050, at 256 rows 1.014-1.022, at 512 rows (deepseek-v3 16384 tokens: pairs of
 * full row tiles sharing weights) 1.066, and with every pair made of column tiles sharing A
 * (dev/variants/fp8-clusters-a-pairs.patch) 1.036-1.095 at 128 to 512 rows. */
#define GEMM_FP8_CLUSTER_MIN_AVG 64
static inline int grouped_gemm_fp8_cluster_pays(int narrow, gemm_epilogue epi, int64_t P, int64_t E) {
    return !narrow && (epi == EPI_DOWN || epi == EPI_GATE_UP_CONCAT) && P > GEMM_FP8_CLUSTER_MIN_AVG * E &&
           2 * P <= 3 * GEMM_TILE_ROWS * E;
}

/* FP8 layers take the tensor-core path (both projections) when gated with concatenated gate/up
 * rows, a k-block of 128 inputs lies in one scale block (bk a multiple of 128) and each chunk of
 * 64 weight rows a tile multiplies lies in one (bn a multiple of 64, up rows starting at a
 * multiple of 64); otherwise they take the streamed forward at every size. */
static inline int grouped_gemm_fp8_usable(const quant_view &q, gemm_epilogue gate_up_epi, int64_t up_row0, char *why,
                                          size_t n) {
    if (gate_up_epi != EPI_GATE_UP_CONCAT) {
        snprintf(why, n, "the FP8 tensor-core path takes gated experts with concatenated gate/up rows");
        return 0;
    }
    if (q.bk % 128 || q.bn % 64 || up_row0 % 64) {
        snprintf(why, n, "the FP8 tensor-core path needs block_k a multiple of 128 and block_n and the intermediate "
                 "size multiples of 64 (block %lldx%lld, up rows from %lld)", (long long)q.bn, (long long)q.bk,
                 (long long)up_row0);
        return 0;
    }
    return 1;
}

/* The FP8 gate/up GEMM can quantize h for the down GEMM in its epilogue (grouped_gemm_args.c_codes):
 * a tile's 256 weight rows are 128 features, one scale block of h when block_k is 128. */
static inline int grouped_gemm_fp8_h_quant_fits(gemm_epilogue gate_up_epi, int64_t bk) {
    return gate_up_epi == EPI_GATE_UP_CONCAT && bk == 128;
}

/* Where it does, by measurement: narrow tiles always (their GEMMs are then chained), wide tiles in
 * the kernels compiled for the shape (deepgemm), and the library's wide tiles from a gate/up k-loop
 * of GEMM_FP8_H_QUANT_MIN_K inputs. Otherwise h is written in f32 and quantized by its own kernel
 * (act_quant.cuh). Measured on an H100 (dev/notes/cuda-notes.md, 2026-12-06, the epilogue with its
 * biases loaded first): grouped_mm's wide tiles with the quantizing epilogue took 0.868 / 0.987 of
 * the time at deepseek-v3 4096 / 16384 tokens (K = 7168) and 1.069 / 1.057 at qwen3-30b-a3b
 * (K = 2048). The epilogue runs outside the k-loop, so its extra work weighs less beside a long
 * one. */
#define GEMM_FP8_H_QUANT_MIN_K 4096
static inline int grouped_gemm_fp8_h_in_epilogue(int narrow, int compiled, gemm_epilogue gate_up_epi, int64_t bk,
                                                 int64_t K) {
    return (narrow || compiled || K >= GEMM_FP8_H_QUANT_MIN_K) && grouped_gemm_fp8_h_quant_fits(gate_up_epi, bk);
}

/* grouped_mm's decode GEMMs (gemm_sm90_decode.cu: the weights as wgmma's A operand, each
 * expert's rows in groups of GEMM_DECODE_ROWS as its B operand; the routing's tiles of that many
 * rows) take FP8 layers whose experts average fewer rows than grouped_gemm_fp8_pays asks and at
 * least GEMM_DECODE_MIN_AVG_ROWS, bf16/f16 layers below grouped_gemm_pays from
 * GEMM_DECODE_MIN_AVG_ROWS_F16 rows, and FP8 and bf16/f16 layers whose pairs are at most one in 16
 * experts (one token's), where the layer is gated with concatenated gate/up rows, the
 * intermediate size a multiple of 128 and the hidden size of 16, and FP8's block_k is 128 (h
 * quantized per tile in the gate/up epilogue) and block_n a multiple of 64. Elsewhere below the
 * GEMMs the streamed forward (gemv_mma.cu) runs. On an H100 against it, graph on
 * (bench/results/2026-12-07_cuda-h100_fp8_decode-gemm-ab.csv, ..._fp8_decode-gemm-band-ab.csv,
 * ..._bf16_decode-gemm-ab.csv): FP8 one token 0.79-0.83 of its time, 8 tokens (0.25-0.5 rows an
 * expert) 1.08-1.09, 2-4 rows 1.004-1.023, 6 rows 0.906, 8 and 12 rows 0.54-0.79; bf16 one
 * token 0.933-0.991, 8 tokens 1.028-1.036, 4 rows 1.017; bf16 at qwen3-30b-a3b
 * (bench/results/2026-12-07_cuda-h100_bf16_decode-band-ab.csv) 5 / 6 / 8 rows 1.019-1.020, 10 rows
 * 0.995, 12 / 14 / 15.6 rows 0.934 / 0.850 / 0.763 (deepseek-v3's hidden size takes the GEMMs
 * from one row). */
#define GEMM_DECODE_ROWS 16
#define GEMM_DECODE_MIN_AVG_ROWS 5
#define GEMM_DECODE_MIN_AVG_ROWS_F16 11
static inline int grouped_gemm_decode_usable(const layer_view &L, const quant_view &q, gemm_epilogue gate_up_epi) {
    const int fp8 = q.on && L.wdt == MOEX_E4M3 && q.bk == 128 && q.bn % 64 == 0;
    const int f16 = !q.on && (L.wdt == MOEX_BF16 || L.wdt == MOEX_F16);
    return (fp8 || f16) && L.gated && gate_up_epi == EPI_GATE_UP_CONCAT && L.I % 128 == 0 && L.H % 16 == 0;
}
static inline int grouped_gemm_decode_pays(const layer_view &L, const quant_view &q, gemm_epilogue gate_up_epi,
                                           int64_t P, int64_t E) {
    const int one_token = 16 * P <= E;
    const int fp8_band = q.on && !grouped_gemm_fp8_pays(P, E) && P >= GEMM_DECODE_MIN_AVG_ROWS * E;
    const int f16_band = !q.on && !grouped_gemm_pays(P, E, L.H, 0) && P >= GEMM_DECODE_MIN_AVG_ROWS_F16 * E;
    return (one_token || fp8_band || f16_band) && grouped_gemm_decode_usable(L, q, gate_up_epi);
}

/* Both projections of a narrow row tile in one block, h in shared memory (grouped_gemm_run_pair):
 * for bf16/f16 SiLU experts with concatenated gate/up rows and no biases, narrow tiles (experts of
 * at most GEMM_NARROW_AVG rows on average), an intermediate size that fits in shared memory beside
 * the ring (at most GEMM_PAIR_MAX_I, a multiple of 128, at least two gate/up tiles) and a hidden
 * size of at least two down tiles of 256. Each block streams whole experts' weights, so the items
 * (about one an expert at these sizes) must fill the SMs' waves: E at least 0.9 of whole waves, and
 * pairs at least E. Which runs is then decided on the GPU, from the routing: the pair kernel when
 * the row tiles are at most the waves' blocks, else the chained GEMMs launched after it (an expert
 * of more than 64 rows adds a tile, and a block's second tile would cost a whole expert's stream).
 * Only with A gathered by index: sonicmoe, and grouped_mm when the hidden states are in the
 * weights' dtype (read in place, no gathered copy). Measured on an H100 (dev/notes/cuda-notes.md,
 * 2026-12-06): at qwen3-30b-a3b 64, 256 and 512 tokens sonicmoe took 0.978-0.980 of the chained
 * GEMMs' time; at 8 tokens (pairs E / 2) 1.036; grouped_mm in place 0.975 and 0.970 at 256 and 512
 * tokens (with the chained GEMMs as the pair kernel's programmatic dependents, which cost sonicmoe
 * 0.4-1.1%); grouped_mm reading its gathered copy by TMA 1.009 and 1.028, 1.020 and 1.040 with the
 * dependents (dev/variants/pair-kernel-tma-a.patch). */
#define GEMM_PAIR_MAX_I 768
static inline int64_t grouped_gemm_pair_waves(int64_t E, int num_sms) { return num_sms > 0 ? (E + num_sms - 1) / num_sms : 0; }
static inline int grouped_gemm_pair_pays(int narrow, int gathered, gemm_epilogue gate_up_epi, const layer_view &L,
                                         int64_t P, int num_sms) {
    const int plain = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base;
    const int64_t waves = grouped_gemm_pair_waves(L.E, num_sms);
    return narrow && gathered && gate_up_epi == EPI_GATE_UP_CONCAT && plain && L.act == MOEX_ACT_SILU &&
           (L.wdt == MOEX_BF16 || L.wdt == MOEX_F16) && L.I % 128 == 0 && L.I >= 256 && L.I <= GEMM_PAIR_MAX_I &&
           L.H % 256 == 0 && L.H >= 512 && waves > 0 && 10 * L.E >= 9 * waves * num_sms && P >= L.E;
}

#ifndef __CUDACC_RTC__
/* 1 if the tensor-core path can take a layer with these matrices (strides,
 * alignment, dtype); otherwise 0 and a reason. */
int grouped_gemm_usable(moex_dtype dt, const void *b, int64_t K, char *why, size_t n);

/* Once per process and device, before capture: kernel attributes. */
moex_status grouped_gemm_init(void);

/* Queue the GEMM on s with a persistent grid of num_sms blocks. */
moex_status grouped_gemm_run(const grouped_gemm_args *g, int num_sms, cudaStream_t s);

/* The decode GEMMs (grouped_gemm_decode_pays; gemm_sm90_decode.cu): g a gate/up GEMM (FP8: with
 * c_codes and c_scales, h quantized in its epilogue) or down GEMM, the routing's tiles of
 * GEMM_DECODE_ROWS rows; a persistent grid of num_sms blocks. grouped_gemm_decode_init: once per
 * process and device (grouped_gemm_init calls it). */
moex_status grouped_gemm_decode_init(void);
moex_status grouped_gemm_decode_run(const grouped_gemm_args *g, int num_sms, cudaStream_t s);

/* The tensor map of a row-major [rows, K] matrix of dt (bf16, f16 or e4m3) read in boxes of
 * box_rows rows by one k-block, with the 128-byte swizzle the kernels' stages use (after
 * grouped_gemm_init, which finds the driver's encoder, as every GEMM here). */
moex_status grouped_gemm_tensor_map(struct CUtensorMap_st *m, const void *base, int64_t rows, int64_t K, int box_rows,
                                    moex_dtype dt, const char *what);

/* The gate/up GEMM then the down GEMM of one forward (concatenated gate/up, narrow tiles:
 * grouped_gemm_narrow_pays; FP8 with h quantized in the gate/up epilogue; both of the library's
 * kernels, the same routing tiles), chained: the
 * down GEMM is launched to start on each SM the gate/up GEMM
 * leaves (programmatic dependent launch) and loads an expert's rows of h once the gate/up GEMM's
 * consumers have stored them all (per-expert counters), and both GEMMs hand their tiles out from
 * a counter, so that the blocks that start early take more. Without it each GEMM's last tiles
 * leave SMs idle and the down GEMM's first copies wait for the whole gate/up GEMM.
 * counters: E + 2 ints, zero (routing_build clears them): done[E], then the two GEMMs' tickets. */
moex_status grouped_gemm_run_chained(const grouped_gemm_args *up, const grouped_gemm_args *down, int *counters,
                                     int num_sms, cudaStream_t s);

/* The gate/up GEMM and the down GEMM of one forward in one launch (grouped_gemm_pair_pays; the
 * same arguments as grouped_gemm_run_chained takes: narrow tiles, A gathered by a_index, y times
 * row_scale as sonicmoe asks, or not as grouped_mm does): each block computes a row tile of an
 * expert's h into shared memory, then its rows of y from there, when the routing's row tiles fill at most the launch's waves;
 * otherwise the chained GEMMs launched after it run (each kernel reads the tile count, and the
 * ones not needed return at once). counters: grouped_gemm_run_chained's. */
moex_status grouped_gemm_run_pair(const grouped_gemm_args *up, const grouped_gemm_args *down, int *counters,
                                  int num_sms, cudaStream_t s);

/* The kernel of the family grouped_gemm_run launches for g, as the template arguments of a
 * specialisation compiled at run time (gemm_rtc.h; K compiled in). */
struct gemm_rtc_spec;
moex_status grouped_gemm_spec(const grouped_gemm_args *g, struct gemm_rtc_spec *spec);

/* The same GEMM, run by `kernel` (grouped_gemm_spec's kernel for g, compiled at run time and
 * loaded: gpu/jit_load.h) instead of the library's. */
struct moex_jit_kernel;
moex_status grouped_gemm_run_kernel(const grouped_gemm_args *g, const struct moex_jit_kernel *kernel, int num_sms,
                                   cudaStream_t s);

/* The dynamic shared memory a kernel of spec takes (moex_jit_kernel_smem before its first launch). */
int grouped_gemm_smem_bytes(const struct gemm_rtc_spec *spec);
#endif

#endif
