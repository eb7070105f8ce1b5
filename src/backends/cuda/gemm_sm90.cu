/* gemm_sm90.cu — grouped GEMM for Hopper (sm_90a): TMA loads into 128-byte
 * swizzled shared memory, wgmma from shared memory, f32 accumulators in
 * registers, the experts' epilogue applied straight from the registers.
 *
 * Tile: 128 rows of A (two consumer warpgroups of 64 rows) x 256 columns of
 * B (the gate/up epilogues take 128 gate and 128 up columns), k-blocks of 64;
 * each warpgroup accumulates two halves of 128 columns. Narrow tiles (experts
 * of few rows): 64 rows of A, the two warpgroups taking the tiles in turn, each
 * all 64 rows by both halves (one's epilogue overlaps the other's k-loop).
 * One producer warp issues the copies; a ring of STAGES buffers with a full
 * and an empty mbarrier each. The grid is persistent: block b takes tiles
 * b, b + grid, ...; the tile list (expert, row tile, column tile) is derived
 * on the device from the routing offsets, so nothing waits for the host. The
 * producer searches it; the consumers read each tile from a slot the producer
 * writes beside the stage's barriers (tile_slot).
 *
 *   A [rows, K] row-major; B [E*R, K] row-major (weights as stored: out x in);
 *   C [rows, N] row-major.
 *
 * FP8 (T = uint8_t: e4m3 codes of A and B, C in f32): the same bytes. A k-block is 128 inputs
 * (128 bytes, one scale block), multiplied by 4 wgmmas of k32 into a block accumulator that is
 * then added to the total times row scale x weight scale (the promotion); the scales come from
 * shared memory, staged there per stage by a second producer warp. Tiles of 128 rows x 256 weight
 * rows (gate/up: 128 gate + 128 up), each warpgroup 64 rows by the weight rows in two halves of
 * 128 (one block accumulator, promoted after each half); narrow tiles of 64 rows x 256 weight
 * rows, each warpgroup all of them by half the weight rows. No staged epilogue; no overlapped
 * variant.
 *
 * The pair kernel (gemm_sm90_pair_kernel.cuh, grouped_gemm_run_pair) composes the same pieces
 * into both projections of a row tile in one block, h kept in shared memory (sonicmoe, and
 * grouped_mm reading the hidden states in place).
 */
#include "backends/cuda/gemm_sm90_kernel.cuh"
#include "backends/cuda/gemm_sm90_pair_kernel.cuh"
#include "backends/cuda/gemm_rtc.h"
#include "gpu/jit_load.h"
#include "gpu/cuda_check.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

namespace {

/* ---- host side ----------------------------------------------------------------------- */

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;
pthread_once_t encode_once = PTHREAD_ONCE_INIT;
cudaError_t encode_status = cudaSuccess;

void find_encode(void) {
    cudaDriverEntryPointQueryResult q;
    encode_status = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode_tiled, 12000,
                                                     cudaEnableDefault, &q);
    if (encode_status == cudaSuccess && q != cudaDriverEntryPointSuccess) encode_status = cudaErrorSymbolNotFound;
}

moex_status make_map(CUtensorMap *m, const void *base, int64_t rows, int64_t K, int box_rows, moex_dtype dt,
                     const char *what) {
    const int fp8 = dt == MOEX_E4M3;
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)K * (fp8 ? 1 : 2)};
    cuuint32_t box[2] = {fp8 ? (cuuint32_t)FP8_BK : (cuuint32_t)BK, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    const CUtensorMapDataType type = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : dt == MOEX_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUresult r = encode_tiled(m, type, 2, (void *)base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return moex_fail(MOEX_ERR_DEVICE, "cuTensorMapEncodeTiled for %s ([%lld, %lld], box %d rows) failed: error %d",
                         what, (long long)rows, (long long)K, box_rows, (int)r);
    return MOEX_OK;
}

} // namespace

moex_status grouped_gemm_tensor_map(CUtensorMap *m, const void *base, int64_t rows, int64_t K, int box_rows,
                                    moex_dtype dt, const char *what) {
    return make_map(m, base, rows, K, box_rows, dt, what);
}

int grouped_gemm_usable(moex_dtype dt, const void *b, int64_t K, char *why, size_t n) {
    if (dt == MOEX_E4M3) {
        if (K % 16 || ((uintptr_t)b & 15)) {
            snprintf(why, n, "the FP8 tensor-core path needs 16-byte aligned rows (the input size %lld must be a "
                     "multiple of 16)", (long long)K);
            return 0;
        }
        return 1;
    }
    if (dt != MOEX_BF16 && dt != MOEX_F16) {
        snprintf(why, n, "the tensor-core path takes bf16 or f16 weights, not %s", moex_dtype_name(dt));
        return 0;
    }
    if ((K * 2) % 16 || ((uintptr_t)b & 15)) {
        snprintf(why, n, "the tensor-core path needs 16-byte aligned rows (the input size %lld must be a multiple of 8)",
                 (long long)K);
        return 0;
    }
    return 1;
}

template <typename T, int EPI, bool OVERLAP, bool NARROW = false> static cudaError_t allow_smem(void) {
    cudaError_t err = cudaFuncSetAttribute(grouped_gemm_kernel<T, EPI, OVERLAP, NARROW>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, ring<T, NARROW>::smem_bytes);
    if constexpr (is_fp8<T>() && !NARROW && (EPI == EPI_DOWN || EPI == EPI_GATE_UP_CONCAT)) /* clusters (gemm_plan) */
        if (!err)
            err = cudaFuncSetAttribute(grouped_gemm_kernel<T, EPI, OVERLAP, NARROW, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, ring<T, NARROW>::smem_bytes);
    if constexpr (!is_fp8<T>() && EPI != EPI_DOWN && EPI != EPI_UP_ONLY) /* the gathered A-load's gate/up kernels */
        if (!err)
            err = cudaFuncSetAttribute(grouped_gemm_gather_kernel<T, EPI, OVERLAP, NARROW>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, GATHER_SMEM_BYTES);
    return err;
}

template <typename T> static cudaError_t allow_smem_all(void) {
    cudaError_t err = allow_smem<T, EPI_DOWN, false>();
    if (!err) err = allow_smem<T, EPI_DOWN, true>();
    if (!err) err = allow_smem<T, EPI_DOWN, false, true>();
    if (!err) err = allow_smem<T, EPI_GATE_UP_CONCAT, false>();
    if (!err) err = allow_smem<T, EPI_GATE_UP_CONCAT, true>();
    if (!err) err = allow_smem<T, EPI_GATE_UP_CONCAT, false, true>();
    if (!err) err = allow_smem<T, EPI_GATE_UP_INTERLEAVED, false>();
    if (!err) err = allow_smem<T, EPI_UP_ONLY, false>();
    return err;
}

template <typename T> static cudaError_t allow_pair_smem(void) {
    return cudaFuncSetAttribute(grouped_gemm_pair_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                PAIR_SMEM_BYTES);
}

/* The clusters of two FP8 wide-tile blocks a device holds at once, per device ordinal
 * (grouped_gemm_init): a persistent grid of more would run its last clusters after the others. */
enum { CLUSTER_DEVICES = 64 };
static int cluster_max[CLUSTER_DEVICES];

/* The launch configuration of grid blocks of THREADS in clusters of two; attr must outlive it. */
static cudaLaunchConfig_t cluster_launch(unsigned grid, int smem, cudaStream_t s, cudaLaunchAttribute *attr) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = 2, attr->val.clusterDim.y = 1, attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = (size_t)smem, cfg.stream = s;
    cfg.attrs = attr, cfg.numAttrs = 1;
    return cfg;
}

static cudaError_t query_clusters(int *n) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_launch(2, ring<uint8_t>::smem_bytes, 0, &attr);
    return cudaOccupancyMaxActiveClusters(n, grouped_gemm_kernel<uint8_t, EPI_DOWN, false, false, true>, &cfg);
}

moex_status grouped_gemm_init(void) {
    pthread_once(&encode_once, find_encode);
    if (encode_status != cudaSuccess) return moex_cuda_status(encode_status, "finding cuTensorMapEncodeTiled");
    cudaError_t err = allow_smem_all<__nv_bfloat16>();
    if (!err) err = allow_smem_all<__half>();
    if (!err) err = allow_smem<uint8_t, EPI_DOWN, false>();
    if (!err) err = allow_smem<uint8_t, EPI_DOWN, false, true>();
    if (!err) err = allow_smem<uint8_t, EPI_GATE_UP_CONCAT, false>();
    if (!err) err = allow_smem<uint8_t, EPI_GATE_UP_CONCAT, false, true>();
    if (!err) err = allow_pair_smem<__nv_bfloat16>();
    if (!err) err = allow_pair_smem<__half>();
    int dev = 0;
    if (!err) err = cudaGetDevice(&dev);
    if (!err && dev >= 0 && dev < CLUSTER_DEVICES) err = query_clusters(&cluster_max[dev]);
    moex_status st = moex_cuda_status(err, "grouped GEMM shared memory size and clusters");
    return st ? st : grouped_gemm_decode_init();
}

/* The grid of a cluster launch: num_sms rounded down to even, at most the clusters the device holds. */
static unsigned cluster_grid(int num_sms) {
    int dev = 0, n = num_sms / 2;
    if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < CLUSTER_DEVICES && cluster_max[dev] > 0 &&
        cluster_max[dev] < n)
        n = cluster_max[dev];
    return (unsigned)(2 * n);
}

/* One kernel of the family: the gathered A-load's (GATHER) or the TMA one's; with p.wait_done
 * (the chained down GEMM) by programmatic dependent launch, so that its blocks may start while
 * the kernel before it (which triggers its dependents as it starts) still runs. */
template <typename T, int EPI, bool OVERLAP, bool NARROW, bool GATHER, bool CLUSTER = false>
static void launch_one(int num_sms, cudaStream_t s, const CUtensorMap &map_a, const CUtensorMap &map_b,
                       const gemm_params &p) {
    void (*kernel)(const CUtensorMap, const CUtensorMap, gemm_params) = grouped_gemm_kernel<T, EPI, OVERLAP, NARROW>;
    int smem = ring<T, NARROW>::smem_bytes;
    if constexpr (GATHER) kernel = grouped_gemm_gather_kernel<T, EPI, OVERLAP, NARROW>, smem = GATHER_SMEM_BYTES;
    if constexpr (CLUSTER) { /* FP8 clusters of two: an even grid (gemm_plan: num_sms >= 2) */
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = cluster_launch(cluster_grid(num_sms), smem, s, &attr);
        (void)cudaLaunchKernelEx(&cfg, grouped_gemm_kernel<T, EPI, OVERLAP, NARROW, true>, map_a, map_b, p);
        return;
    }
    if (!p.wait_done) {
        kernel<<<num_sms, THREADS, smem, s>>>(map_a, map_b, p);
        return;
    }
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = dependent_launch(dim3((unsigned)num_sms), dim3(THREADS), s, &attr);
    cfg.dynamicSmemBytes = (size_t)smem;
    (void)cudaLaunchKernelEx(&cfg, kernel, map_a, map_b, p); /* its error is the launch's: MOEX_CUDA_LAUNCHED */
}

/* The kernel of one (dtype, epilogue, A-load): narrow tiles, the overlapped epilogue or the plain
 * one (only down and concatenated gate/up have the first two; FP8 has no overlapped one). */
template <typename T, int EPI, bool GATHER = false>
static void launch_kernel(bool narrow, bool overlap, bool cluster, int num_sms, cudaStream_t s,
                          const CUtensorMap &map_a, const CUtensorMap &map_b, const gemm_params &p) {
    constexpr bool variants = EPI == EPI_DOWN || EPI == EPI_GATE_UP_CONCAT;
    if constexpr (variants) {
        if (narrow) {
            launch_one<T, EPI, false, true, GATHER>(num_sms, s, map_a, map_b, p);
            return;
        }
    }
    if constexpr (variants && is_fp8<T>()) {
        if (cluster) {
            launch_one<T, EPI, false, false, false, true>(num_sms, s, map_a, map_b, p);
            return;
        }
    }
    if constexpr (variants && !is_fp8<T>()) {
        if (overlap) {
            launch_one<T, EPI, true, false, GATHER>(num_sms, s, map_a, map_b, p);
            return;
        }
    }
    launch_one<T, EPI, false, false, GATHER>(num_sms, s, map_a, map_b, p);
}

template <typename T>
static void launch_epi(gemm_epilogue epi, bool narrow, bool overlap, bool gather, int num_sms, cudaStream_t s,
                       const CUtensorMap &map_a, const CUtensorMap &map_b, const gemm_params &p) {
    if (gather) { /* gated gate/up only (plan_gemm) */
        if (epi == EPI_GATE_UP_CONCAT)
            launch_kernel<T, EPI_GATE_UP_CONCAT, true>(narrow, overlap, false, num_sms, s, map_a, map_b, p);
        else
            launch_kernel<T, EPI_GATE_UP_INTERLEAVED, true>(narrow, overlap, false, num_sms, s, map_a, map_b, p);
        return;
    }
    switch (epi) {
    case EPI_DOWN: launch_kernel<T, EPI_DOWN>(narrow, overlap, false, num_sms, s, map_a, map_b, p); break;
    case EPI_GATE_UP_CONCAT:
        launch_kernel<T, EPI_GATE_UP_CONCAT>(narrow, overlap, false, num_sms, s, map_a, map_b, p);
        break;
    case EPI_GATE_UP_INTERLEAVED:
        launch_kernel<T, EPI_GATE_UP_INTERLEAVED>(narrow, overlap, false, num_sms, s, map_a, map_b, p);
        break;
    case EPI_UP_ONLY: launch_kernel<T, EPI_UP_ONLY>(narrow, overlap, false, num_sms, s, map_a, map_b, p); break;
    }
}

/* What grouped_gemm_run launches for g: the kernel variant, its tensor maps and parameters. */
typedef struct gemm_plan {
    CUtensorMap map_a, map_b; /* map_a unused with the gathered A-load */
    gemm_params p;
    bool fp8, narrow, overlap, gather, cluster;
} gemm_plan;

/* Column tiles of N outputs, tiles of tile_n weight rows (gated gate/up: half of them are features). */
static int64_t column_tiles(gemm_epilogue epi, int64_t N, int tile_n) {
    const int per = epi == EPI_GATE_UP_CONCAT || epi == EPI_GATE_UP_INTERLEAVED ? tile_n / 2 : tile_n;
    return (N + per - 1) / per;
}

/* library: the library's kernels (the run-time compiled ones have no cluster variant). */
static moex_status plan_gemm(const grouped_gemm_args *g, gemm_plan *pl, bool with_maps, bool library) {
    memset(pl, 0, sizeof *pl);
    const int fp8 = g->dt == MOEX_E4M3;
    if (fp8 && ((g->epi != EPI_DOWN && g->epi != EPI_GATE_UP_CONCAT) || !g->a_scales || !g->q.on))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: FP8 takes the down and concatenated gate/up epilogues, "
                         "row scales and the weights' scales");
    const bool narrow = g->narrow && (g->epi == EPI_DOWN || g->epi == EPI_GATE_UP_CONCAT);
    if (g->narrow && !narrow)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: narrow tiles need the down or concatenated gate/up epilogue");
    if (!g->offsets || !g->ends || !g->mtile_off)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: the routing's offsets, ends and tile offsets are required");
    const bool gather = g->a_index != NULL;
    if (gather && (fp8 || (g->epi != EPI_GATE_UP_CONCAT && g->epi != EPI_GATE_UP_INTERLEAVED) ||
                   ((uintptr_t)g->a & 15) || (g->a_ld * 2) % 16 || g->K % 8))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: the gathered A-load takes bf16/f16 gated gate/up GEMMs "
                         "over 16-byte aligned rows");
    if (g->c_codes && (!fp8 || !g->c_scales || !grouped_gemm_fp8_h_quant_fits(g->epi, g->q.bk)))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: C is quantized in the epilogue by the FP8 "
                         "gate/up GEMM of block_k 128 only");
    if (g->row_scale && (fp8 || g->epi != EPI_DOWN))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: row scales are the bf16/f16 down epilogue's");
    if (g->skip_tiles_at_most < 0 || g->skip_tiles_at_most > INT32_MAX)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: skip_tiles_at_most out of range");
    if ((g->tickets || g->done || g->wait_done) && !narrow)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: tile counters and chaining are the narrow kernels'");
    if (fp8 && g->done && !g->c_codes)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: a chained FP8 gate/up GEMM quantizes h in its epilogue");
    if (g->wait_done && (gather || g->wait_per_mtile <= 0 || g->wait_per_mtile > INT32_MAX))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: a chained GEMM loads A by TMA and needs its count a tile");
    pl->fp8 = fp8, pl->narrow = narrow, pl->gather = gather;
    /* the overlapped epilogue (float only) takes the common cases only (no biases; SiLU for
     * gate/up) and stages every warp's rows, so it pays for experts of a tile or more on average */
    const layer_view &L = g->L;
    const bool plain = !L.gate_bias.base && !L.up_bias.base && !L.down_bias.base;
    pl->overlap = !fp8 && !narrow && plain &&
                  (g->epi == EPI_DOWN || (g->epi == EPI_GATE_UP_CONCAT && L.act == MOEX_ACT_SILU)) &&
                  g->pairs >= (int64_t)BM * (g->e_end - g->e_begin);
    /* FP8 wide tiles where grouped_gemm_fp8_cluster_pays: clusters of two blocks sharing their boxes */
    pl->cluster = library && fp8 && grouped_gemm_fp8_cluster_pays(narrow, g->epi, g->pairs, g->e_end - g->e_begin);
    /* weight rows a tile (BN): gate/up boxes of 64 (four); down one box of the tile's rows, or
     * with clusters boxes of 64 (each block copies half of them for both) */
    const int tile_n = BN;
    const int b_box = g->epi != EPI_GATE_UP_CONCAT && !pl->cluster ? tile_n : BN / 4;
    if (with_maps) {
        /* A: boxes of the tile's rows, or of 64 (clusters: each block may copy one half for both) */
        moex_status st = gather ? MOEX_OK
                                : make_map(&pl->map_a, g->a, g->a_rows, g->K, narrow || pl->cluster ? NARROW_ROWS : BM,
                                           g->dt, "A");
        if (!st) st = make_map(&pl->map_b, g->b, g->L.E * g->rows_per_expert, g->K, b_box, g->dt, "B");
        if (st) return st;
    }
    gemm_params &p = pl->p;
    p.K = g->K;
    p.N = g->N;
    p.rows_per_expert = g->rows_per_expert;
    p.up_offset = g->up_offset;
    p.n_tiles = column_tiles(g->epi, g->N, tile_n);
    p.e_begin = g->e_begin;
    p.e_end = g->e_end;
    p.offsets = g->offsets;
    p.ends = g->ends;
    p.mtile_off = g->mtile_off;
    p.c = g->c;
    p.epi = g->epi;
    p.L = g->L;
    if (gather) p.gather = g->a, p.gather_ld = g->a_ld, p.a_index = g->a_index;
    p.row_scale = g->row_scale;
    p.tickets = g->tickets, p.done = g->done, p.wait_done = g->wait_done, p.wait_per_mtile = (int)g->wait_per_mtile;
    p.skip_tiles_at_most = (int)g->skip_tiles_at_most;
    if (fp8) {
        p.a_scale = g->a_scales;
        p.a_sld = (g->K + g->q.bk - 1) / g->q.bk;
        p.kstep = (int)(g->q.bk / FP8_BK);
        p.Q = g->q;
        p.cq = g->c_codes, p.cs = g->c_scales, p.cs_ld = (g->N + 127) / 128;
    }
    return MOEX_OK;
}

moex_status grouped_gemm_run(const grouped_gemm_args *g, int num_sms, cudaStream_t s) {
    gemm_plan pl;
    moex_status st = plan_gemm(g, &pl, true, num_sms >= 2);
    if (st) return st;
    if (pl.fp8) {
        if (g->epi == EPI_DOWN)
            launch_kernel<uint8_t, EPI_DOWN>(pl.narrow, false, pl.cluster, num_sms, s, pl.map_a, pl.map_b, pl.p);
        else
            launch_kernel<uint8_t, EPI_GATE_UP_CONCAT>(pl.narrow, false, pl.cluster, num_sms, s, pl.map_a, pl.map_b,
                                                       pl.p);
        return MOEX_CUDA_LAUNCHED("FP8 grouped GEMM kernel");
    }
    if (g->dt == MOEX_BF16)
        launch_epi<__nv_bfloat16>(g->epi, pl.narrow, pl.overlap, pl.gather, num_sms, s, pl.map_a, pl.map_b, pl.p);
    else
        launch_epi<__half>(g->epi, pl.narrow, pl.overlap, pl.gather, num_sms, s, pl.map_a, pl.map_b, pl.p);
    return MOEX_CUDA_LAUNCHED("grouped GEMM kernel");
}

moex_status grouped_gemm_run_chained(const grouped_gemm_args *up, const grouped_gemm_args *down, int *counters,
                                     int num_sms, cudaStream_t s) {
    if (down->epi != EPI_DOWN || up->epi != EPI_GATE_UP_CONCAT || !up->narrow || !down->narrow || up->L.E != down->L.E ||
        up->dt != down->dt || (up->dt == MOEX_E4M3 && !up->c_codes))
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: chaining takes a gate/up GEMM of narrow tiles (FP8: h "
                         "quantized in its epilogue) and its down GEMM");
    const int64_t E = up->L.E;
    grouped_gemm_args u = *up, d = *down;
    u.tickets = counters + E, u.done = counters;
    d.tickets = counters + E + 1, d.wait_done = counters;
    /* the gate/up GEMM's column tiles x the warps that store a part of each: one warpgroup a float
     * narrow tile (ping-pong), both an FP8 one (each half its weight rows) */
    d.wait_per_mtile = column_tiles(up->epi, up->N, BN) * (up->dt == MOEX_E4M3 ? 8 : 4);
    moex_status st = grouped_gemm_run(&u, num_sms, s);
    return st ? st : grouped_gemm_run(&d, num_sms, s);
}

moex_status grouped_gemm_run_pair(const grouped_gemm_args *up, const grouped_gemm_args *down, int *counters,
                                  int num_sms, cudaStream_t s) {
    const layer_view &L = up->L;
    const int gathered = up->a_index != NULL;
    if (!grouped_gemm_pair_pays(up->narrow && down->narrow, gathered, up->epi, L, up->pairs, num_sms) ||
        down->epi != EPI_DOWN || up->dt != L.wdt || down->dt != L.wdt || up->K != L.H || up->N != L.I ||
        down->K != L.I || down->N != L.H || up->rows_per_expert != 2 * L.I || up->up_offset != L.I ||
        down->rows_per_expert != L.H || ((uintptr_t)up->a & 15) || (up->a_ld * 2) % 16)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: the pair kernel takes the gate/up and down GEMMs of a "
                         "layer grouped_gemm_pair_pays accepts, A gathered by index over 16-byte aligned rows");
    if (!up->offsets || !up->ends || !up->mtile_off)
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: the routing's offsets, ends and tile offsets are required");
    CUtensorMap map_gu, map_dn;
    moex_status st = make_map(&map_gu, up->b, L.E * 2 * L.I, L.H, BN / 4, L.wdt, "gate/up weights");
    if (!st) st = make_map(&map_dn, down->b, L.E * L.H, L.I, BN, L.wdt, "down weights");
    if (st) return st;
    gemm_params p;
    memset(&p, 0, sizeof p);
    p.K = L.H, p.N = L.I;
    p.rows_per_expert = 2 * L.I, p.up_offset = L.I, p.n_tiles = 1;
    p.e_begin = up->e_begin, p.e_end = up->e_end;
    p.offsets = up->offsets, p.ends = up->ends, p.mtile_off = up->mtile_off;
    p.c = down->c, p.row_scale = down->row_scale;
    p.epi = EPI_GATE_UP_CONCAT, p.L = L;
    p.gather = up->a, p.gather_ld = up->a_ld, p.a_index = up->a_index;
    const int64_t fits = grouped_gemm_pair_waves(L.E, num_sms) * num_sms;
    p.pair_tiles_max = (int)fits;
    if (L.wdt == MOEX_BF16)
        grouped_gemm_pair_kernel<__nv_bfloat16><<<num_sms, THREADS, PAIR_SMEM_BYTES, s>>>(map_gu, map_dn, p);
    else
        grouped_gemm_pair_kernel<__half><<<num_sms, THREADS, PAIR_SMEM_BYTES, s>>>(map_gu, map_dn, p);
    if ((st = MOEX_CUDA_LAUNCHED("pair GEMM kernel"))) return st;
    grouped_gemm_args u = *up, d = *down; /* the chained GEMMs, for routings of more row tiles */
    u.skip_tiles_at_most = d.skip_tiles_at_most = fits;
    return grouped_gemm_run_chained(&u, &d, counters, num_sms, s);
}

moex_status grouped_gemm_spec(const grouped_gemm_args *g, gemm_rtc_spec *spec) {
    gemm_plan pl;
    moex_status st = plan_gemm(g, &pl, false, false);
    if (st) return st;
    if (pl.gather) /* gemm_rtc.c compiles the TMA A-load only */
        return moex_fail(MOEX_ERR_INTERNAL, "grouped GEMM: no run-time compiled kernel with the gathered A-load");
    memset(spec, 0, sizeof *spec);
    spec->format = pl.fp8 ? GEMM_RTC_E4M3 : g->dt == MOEX_BF16 ? GEMM_RTC_BF16 : GEMM_RTC_F16;
    spec->epilogue = (int)g->epi;
    spec->overlap = pl.overlap;
    spec->narrow = pl.narrow;
    spec->K = g->K;
    return MOEX_OK;
}

/* The dynamic shared memory of a kernel of the family: the float ring (bf16 and f16 alike), or the
 * FP8 one of wide or narrow tiles. */
static int smem_of(bool fp8, bool narrow) {
    if (!fp8) return ring<__nv_bfloat16>::smem_bytes;
    return narrow ? ring<uint8_t, true>::smem_bytes : ring<uint8_t>::smem_bytes;
}

moex_status grouped_gemm_run_kernel(const grouped_gemm_args *g, const moex_jit_kernel *kernel, int num_sms,
                                   cudaStream_t s) {
    gemm_plan pl;
    moex_status st = plan_gemm(g, &pl, true, false);
    if (st) return st;
    const int smem = smem_of(pl.fp8, pl.narrow);
    void *args[3] = {&pl.map_a, &pl.map_b, &pl.p};
    const unsigned grid[3] = {(unsigned)num_sms, 1, 1}, block[3] = {THREADS, 1, 1};
    return moex_jit_launch(kernel, grid, block, (size_t)smem, s, args);
}

int grouped_gemm_smem_bytes(const gemm_rtc_spec *spec) { return smem_of(spec->format == GEMM_RTC_E4M3, spec->narrow); }
