/* routing.cu — routing preparation on the GPU (histogram, offsets, slots,
 * gather) and the weighted reduction in token order. No host sync anywhere:
 * sizes the host cannot know stay on the device, and kernels whose work
 * depends on them read them there and return early. */
#include "backends/cuda/routing.cuh"
#include "core/gpu_runtime.h"
#include "gpu/cuda_check.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t routing_bytes(int64_t E, int64_t P) {
    return 4 * align256((size_t)E * 4) + 2 * align256((size_t)(E + 1) * 4) + 3 * align256((size_t)P * 4) +
           align256((size_t)routing_sched_ints(E) * 4);
}

routing_dev routing_carve(void *ws, int64_t E, int64_t P) {
    char *p = (char *)ws;
    routing_dev r;
    r.counts = (int *)p, p += align256((size_t)E * 4);
    r.cursor = (int *)p, p += align256((size_t)E * 4);
    r.offsets = (int *)p, p += align256((size_t)(E + 1) * 4);
    r.mtile_off = (int *)p, p += align256((size_t)(E + 1) * 4);
    r.pair_slot = (int *)p, p += align256((size_t)P * 4);
    r.slot_token = (int *)p, p += align256((size_t)P * 4);
    r.slot_w = (float *)p, p += align256((size_t)P * 4);
    r.hit = (int *)p, p += align256((size_t)E * 4);
    r.ends = (int *)p, p += align256((size_t)E * 4);
    r.sched = (int *)p;
    return r;
}

/* ids [T, k] -> counts[e] += 1 per valid pair. Grid-stride over pairs. */
__global__ void count_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int *counts,
                             int *flags) {
    int64_t P = T * k;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = load_id(ids, ids64, ld, p / k, p % k);
        if (e >= 0 && e < E)
            atomicAdd(&counts[e], 1);
        else if (e != -1 && e != E)
            atomicOr(flags, MOEX_CUDA_FLAG_BAD_ID);
    }
}

/* Tiles of tile_rows rows that c rows take (no overflow for any c >= 0). */
__device__ __forceinline__ int tiles_of(int c, int tile_rows) { return c > 0 ? (c - 1) / tile_rows + 1 : 0; }

/* The scans of routing: thread tid of nt (a multiple of 32, at most 1024) owns experts [lo, hi)
 * (E / nt of them, rounded up); *rows and *tiles come in as its experts' sums of count(e) and of
 * tiles_of(count(e)) and leave as the exclusive prefix of those sums over the threads before it;
 * *total_rows and *total_tiles get the sums over all threads. Each warp scans its 32 sums with
 * shuffles, warp 0 the warps' totals (wsum: 2 x 32 ints of shared memory): two barriers, where
 * a scan across the block's threads through shared memory takes two a step. The whole block
 * calls it. */
__device__ void block_scan(int *wsum, int *rows, int *tiles, int *total_rows, int *total_tiles) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = blockDim.x / 32;
    const int own_r = *rows, own_t = *tiles;
    int r = own_r, t = own_t; /* inclusive within the warp */
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const int r2 = __shfl_up_sync(0xffffffffu, r, o), t2 = __shfl_up_sync(0xffffffffu, t, o);
        if (lane >= o) r += r2, t += t2;
    }
    if (lane == 31) wsum[warp] = r, wsum[32 + warp] = t;
    __syncthreads();
    if (warp == 0) { /* inclusive over the warps */
        int wr = lane < nw ? wsum[lane] : 0, wt = lane < nw ? wsum[32 + lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int r2 = __shfl_up_sync(0xffffffffu, wr, o), t2 = __shfl_up_sync(0xffffffffu, wt, o);
            if (lane >= o) wr += r2, wt += t2;
        }
        __syncwarp();
        wsum[lane] = wr, wsum[32 + lane] = wt;
    }
    __syncthreads();
    *rows = (warp ? wsum[warp - 1] : 0) + r - own_r;
    *tiles = (warp ? wsum[32 + warp - 1] : 0) + t - own_t;
    *total_rows = wsum[nw - 1];
    *total_tiles = wsum[32 + nw - 1];
}

/* The first slot of expert e in a layout: after the rows (packed) or the whole tiles (padded) of
 * the experts before it, or at e * cap (masked). */
__device__ __forceinline__ int slot_base(routing_layout layout, int64_t e, int64_t cap, int rows, int tiles, int tile_rows) {
    return layout == ROUTING_PADDED ? tiles * tile_rows : layout == ROUTING_MASKED ? (int)(e * cap) : rows;
}

/* One block: exclusive prefix sums of counts (slots) and of their tile counts, each expert's
 * first slot and end in the layout; with hit, the list of experts with rows (tile_rows then
 * covers any expert: one tile each). offsets[E]: the slots the layout spans. */
__global__ void scan_kernel(const int *counts, int64_t E, int tile_rows, routing_layout layout, int64_t cap,
                            int *offsets, int *ends, int *mtile_off, int *cursor, int *hit, int *sched) {
    __shared__ int wsum[64];
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int64_t e = tid; e < routing_sched_clear(E, hit != NULL); e += nt) sched[e] = 0;
    const int64_t per = (E + nt - 1) / nt, lo = tid * per, hi = lo + per < E ? lo + per : E;
    int rows = 0, tiles = 0;
    for (int64_t e = lo; e < hi; e++) {
        rows += counts[e];
        tiles += tiles_of(counts[e], tile_rows);
    }
    int total_rows, total_tiles;
    block_scan(wsum, &rows, &tiles, &total_rows, &total_tiles);
    for (int64_t e = lo; e < hi; e++) {
        const int base = slot_base(layout, e, cap, rows, tiles, tile_rows);
        offsets[e] = base;
        ends[e] = base + counts[e];
        mtile_off[e] = tiles;
        cursor[e] = 0;
        if (hit && counts[e]) hit[tiles] = (int)e;
        rows += counts[e];
        tiles += tiles_of(counts[e], tile_rows);
    }
    if (tid == nt - 1) {
        offsets[E] = slot_base(layout, E, cap, total_rows, total_tiles, tile_rows);
        mtile_off[E] = total_tiles;
    }
}

/* Each valid pair takes the next slot of its expert. */
__global__ void scatter_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E,
                               const int *offsets, int *cursor, int *pair_slot, int *slot_token) {
    int64_t P = T * k;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = load_id(ids, ids64, ld, p / k, p % k);
        if (e < 0 || e >= E) {
            pair_slot[p] = -1;
            continue;
        }
        int slot = offsets[e] + atomicAdd(&cursor[e], 1);
        pair_slot[p] = slot;
        if (slot_token) slot_token[slot] = (int)(p / k);
    }
}

/* Block-aggregated versions of count and scatter: each block takes a contiguous chunk of
 * PAIRS_PER_THREAD * blockDim pairs, counts them in shared memory and touches each
 * expert's global counter once (global atomics on few addresses serialise). Shared
 * memory: E ints (count) or 2E ints (scatter). */
enum { PAIRS_PER_THREAD = 8 };

__global__ void count_block_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int *counts,
                                   int *flags) {
    extern __shared__ int hist[];
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    const int64_t P = T * k, p0 = blockIdx.x * (int64_t)blockDim.x * PAIRS_PER_THREAD;
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int64_t p = p0 + i * (int64_t)blockDim.x + threadIdx.x;
        if (p >= P) break;
        const int64_t e = load_id(ids, ids64, ld, p / k, p % k);
        if (e >= 0 && e < E)
            atomicAdd(&hist[e], 1);
        else if (e != -1 && e != E)
            atomicOr(flags, MOEX_CUDA_FLAG_BAD_ID);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        if (hist[e]) atomicAdd(&counts[e], hist[e]);
}

__global__ void scatter_block_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E,
                                     const int *offsets, int *cursor, int *pair_slot, int *slot_token) {
    extern __shared__ int sh[];
    int *hist = sh, *base = sh + E;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    const int64_t P = T * k, p0 = blockIdx.x * (int64_t)blockDim.x * PAIRS_PER_THREAD;
    int rank[PAIRS_PER_THREAD], ex[PAIRS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int64_t p = p0 + i * (int64_t)blockDim.x + threadIdx.x;
        ex[i] = -1;
        if (p >= P) continue;
        const int64_t e = load_id(ids, ids64, ld, p / k, p % k);
        if (e >= 0 && e < E) {
            ex[i] = (int)e;
            rank[i] = atomicAdd(&hist[e], 1);
        }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        if (hist[e]) base[e] = atomicAdd(&cursor[e], hist[e]);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int64_t p = p0 + i * (int64_t)blockDim.x + threadIdx.x;
        if (p >= P) continue;
        if (ex[i] < 0) {
            pair_slot[p] = -1;
            continue;
        }
        const int slot = offsets[ex[i]] + base[ex[i]] + rank[i];
        pair_slot[p] = slot;
        if (slot_token) slot_token[slot] = (int)(p / k);
    }
}

/* Few pairs (P <= SMALL_PAIRS, E <= SMALL_E): the whole routing in one block and one launch,
 * where the memset and the three kernels above take four: each pair's rank within its expert
 * from the shared-memory count, the two scans of scan_kernel, then the slots. The same arrays
 * and values (the order of an expert's slots is, as there, whatever the atomics give). A
 * thread's ids are all loaded before its first atomic, so that their loads are in flight
 * together (one memory latency, not one a pair). Shared memory: hist[E], then 64 ints for the
 * scans. */
enum { SMALL_THREADS = 1024, SMALL_PAIRS = SMALL_THREADS * PAIRS_PER_THREAD, SMALL_E = 8192 };

__global__ void __launch_bounds__(SMALL_THREADS)
    routing_small_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int tile_rows,
                         routing_layout layout, int64_t cap, int *counts, int *offsets, int *ends, int *mtile_off,
                         int *pair_slot, int *slot_token, int *hit, int *sched, int *flags) {
    extern __shared__ int sh[];
    int *hist = sh, *wsum = sh + E;
    const int tid = threadIdx.x, nt = blockDim.x;
    /* P <= SMALL_PAIRS: 32-bit pair indices */
    const int P = (int)(T * k), kk = (int)k;
    int64_t id[PAIRS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int p = i * nt + tid;
        id[i] = p < P ? load_id(ids, ids64, ld, p / kk, p % kk) : -1;
    }
    for (int64_t e = tid; e < E; e += nt) hist[e] = 0;
    for (int64_t e = tid; e < routing_sched_clear(E, hit != NULL); e += nt) sched[e] = 0;
    __syncthreads();
    int rank[PAIRS_PER_THREAD], ex[PAIRS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int p = i * nt + tid;
        ex[i] = -1;
        if (p >= P) continue;
        const int64_t e = id[i];
        if (e >= 0 && e < E) {
            ex[i] = (int)e;
            rank[i] = atomicAdd(&hist[e], 1);
        } else if (e != -1 && e != E) {
            atomicOr(flags, MOEX_CUDA_FLAG_BAD_ID);
        }
    }
    __syncthreads();
    const int64_t per = (E + nt - 1) / nt, lo = tid * per, hi = lo + per < E ? lo + per : E;
    int rows = 0, tiles = 0;
    for (int64_t e = lo; e < hi; e++) {
        rows += hist[e];
        tiles += tiles_of(hist[e], tile_rows);
    }
    int total_rows, total_tiles;
    block_scan(wsum, &rows, &tiles, &total_rows, &total_tiles);
    for (int64_t e = lo; e < hi; e++) { /* hist[e] becomes the expert's first slot */
        const int c = hist[e], base = slot_base(layout, e, cap, rows, tiles, tile_rows);
        counts[e] = c;
        offsets[e] = base;
        ends[e] = base + c;
        mtile_off[e] = tiles;
        if (hit && c) hit[tiles] = (int)e;
        hist[e] = base;
        rows += c;
        tiles += tiles_of(c, tile_rows);
    }
    if (tid == nt - 1) {
        offsets[E] = slot_base(layout, E, cap, total_rows, total_tiles, tile_rows);
        mtile_off[E] = total_tiles;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PAIRS_PER_THREAD; i++) {
        const int p = i * nt + tid;
        if (p >= P) continue;
        if (ex[i] < 0) {
            pair_slot[p] = -1;
            continue;
        }
        const int slot = hist[ex[i]] + rank[i];
        pair_slot[p] = slot;
        if (slot_token) slot_token[slot] = p / kk;
    }
}

static int grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

moex_status routing_build(const routing_dev &r, const void *ids, int ids64, int64_t ids_ld, int64_t T, int64_t k,
                          int64_t E, int tile_rows, int hits, routing_layout layout, int64_t cap, int *flags,
                          cudaStream_t s) {
    const int64_t P = T * k;
    int *hit = hits ? r.hit : NULL;
    /* slots past P (padded and masked layouts) have no token entry: those forwards do not read it */
    int *slot_token = layout == ROUTING_PACKED ? r.slot_token : NULL;
    if (hits && layout != ROUTING_PACKED) return moex_fail(MOEX_ERR_INTERNAL, "routing: hits take the packed layout");
    if (hits) tile_rows = INT32_MAX; /* one tile per expert with rows */
    if (P <= SMALL_PAIRS && E <= SMALL_E) { /* (E + 64) ints: at most 33 KiB, no opt-in needed */
        const size_t small_smem = ((size_t)E + 64) * sizeof(int);
        routing_small_kernel<<<1, SMALL_THREADS, small_smem, s>>>(ids, ids64, ids_ld, T, k, E, tile_rows, layout, cap,
                                                                 r.counts, r.offsets, r.ends, r.mtile_off, r.pair_slot,
                                                                 slot_token, hit, r.sched, flags);
        return MOEX_CUDA_LAUNCHED("routing kernel");
    }
    moex_status st = moex_cuda_status(cudaMemsetAsync(r.counts, 0, (size_t)E * sizeof(int), s), "routing: clear");
    if (st) return st;
    const size_t smem = (size_t)E * 2 * sizeof(int);
    const int64_t chunks = (P + 256 * PAIRS_PER_THREAD - 1) / (256 * PAIRS_PER_THREAD);
    const int blocked = smem <= 48 * 1024 && chunks <= 65535;
    if (blocked)
        count_block_kernel<<<(unsigned)chunks, 256, smem / 2, s>>>(ids, ids64, ids_ld, T, k, E, r.counts, flags);
    else
        count_kernel<<<grid_for(P, 256), 256, 0, s>>>(ids, ids64, ids_ld, T, k, E, r.counts, flags);
    scan_kernel<<<1, 1024, 0, s>>>(r.counts, E, tile_rows, layout, cap, r.offsets, r.ends, r.mtile_off, r.cursor, hit,
                                   r.sched);
    if (blocked)
        scatter_block_kernel<<<(unsigned)chunks, 256, smem, s>>>(ids, ids64, ids_ld, T, k, E, r.offsets, r.cursor,
                                                                 r.pair_slot, slot_token);
    else
        scatter_kernel<<<grid_for(P, 256), 256, 0, s>>>(ids, ids64, ids_ld, T, k, E, r.offsets, r.cursor, r.pair_slot,
                                                        slot_token);
    return MOEX_CUDA_LAUNCHED("routing kernels");
}

/* One block per token (grid-stride): its row of hidden is read once and written to the slot of
 * each of its pairs (k copies; sentinel pairs have none). Reading per token rather than per slot
 * reads hidden once instead of k times. */

/* Rows of 16-byte pieces (source and destination of one dtype, 16-byte aligned rows of n16
 * pieces): each thread loads up to GATHER_LOADS pieces, all in flight together, then stores
 * them to every slot of the token. A block a token, where a warp a token left most of the GPU
 * idle at decode sizes (T / 8 blocks). */
enum { GATHER_THREADS = 256, GATHER_LOADS = 4 };
__global__ void __launch_bounds__(GATHER_THREADS)
    gather16_kernel(const int *pair_slot, int64_t T, int64_t k, const uint4 *hidden, int64_t ld16, uint4 *dst,
                    int64_t n16) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int *slots = pair_slot + t * k;
        const uint4 *src = hidden + t * ld16;
        for (int64_t i0 = threadIdx.x; i0 < n16; i0 += GATHER_LOADS * GATHER_THREADS) {
            uint4 v[GATHER_LOADS];
#pragma unroll
            for (int q = 0; q < GATHER_LOADS; q++)
                if (i0 + q * GATHER_THREADS < n16) v[q] = src[i0 + q * GATHER_THREADS];
            for (int64_t j = 0; j < k; j++) {
                const int slot = __ldg(slots + j);
                if (slot < 0) continue;
                uint4 *row = dst + (int64_t)slot * n16;
#pragma unroll
                for (int q = 0; q < GATHER_LOADS; q++)
                    if (i0 + q * GATHER_THREADS < n16) row[i0 + q * GATHER_THREADS] = v[q];
            }
        }
    }
}

/* Any dtypes (converted through f32), one element a thread. */
__global__ void gather_kernel(const int *pair_slot, int64_t T, int64_t k, const void *hidden, moex_dtype hdt,
                              int64_t ld, void *dst, moex_dtype ddt, int64_t H) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const int *slots = pair_slot + t * k;
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
            const float v = load_elem(hidden, hdt, t * ld + i);
            for (int64_t j = 0; j < k; j++)
                if (slots[j] >= 0) store_elem(dst, ddt, slots[j] * H + i, v);
        }
    }
}

moex_status routing_gather(const routing_dev &r, int64_t T, int64_t k, const void *hidden, moex_dtype hdt, int64_t ld,
                           void *dst, moex_dtype dst_dt, int64_t H, cudaStream_t s) {
    const size_t esz = hdt == MOEX_F32 ? 4 : 2;
    const int vec = hdt == dst_dt && (H * esz) % 16 == 0 && (ld * esz) % 16 == 0 && ((uintptr_t)hidden % 16) == 0 &&
                    ((uintptr_t)dst % 16) == 0;
    const int blocks = (int)(T < 65535 ? (T < 1 ? 1 : T) : 65535);
    if (vec)
        gather16_kernel<<<blocks, GATHER_THREADS, 0, s>>>(r.pair_slot, T, k, (const uint4 *)hidden,
                                                          ld * (int64_t)esz / 16, (uint4 *)dst, H * (int64_t)esz / 16);
    else
        gather_kernel<<<blocks, 256, 0, s>>>(r.pair_slot, T, k, hidden, hdt, ld, dst, dst_dt, H);
    return MOEX_CUDA_LAUNCHED("gather kernel");
}

__global__ void slot_weights_kernel(const int *pair_slot, const void *w, moex_dtype wdt, int64_t w_ld, int64_t T,
                                    int64_t k, float *slot_w) {
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < T * k; p += (int64_t)gridDim.x * blockDim.x) {
        const int slot = pair_slot[p];
        if (slot >= 0) slot_w[slot] = load_elem(w, wdt, (p / k) * w_ld + p % k);
    }
}

moex_status routing_slot_weights(const int *pair_slot, const void *w, moex_dtype wdt, int64_t w_ld, int64_t T,
                                 int64_t k, float *slot_w, cudaStream_t s) {
    if (T * k == 0) return MOEX_OK;
    slot_weights_kernel<<<grid_for(T * k, 256), 256, 0, s>>>(pair_slot, w, wdt, w_ld, T, k, slot_w);
    return MOEX_CUDA_LAUNCHED("slot weights kernel");
}

/* The slot of pair p: pair_slot[p], or p itself when y is in pair order (pair_slot NULL). */
__device__ __forceinline__ int slot_of(const int *pair_slot, int64_t p) { return pair_slot ? __ldg(pair_slot + p) : (int)p; }

/* One block per token (grid-stride); each thread sums 8 consecutive columns of 16-bit y with
 * 16-byte loads (H % 8 == 0), in slot order j. Per group of 8 slots the slots and weights are
 * loaded first, then the y pieces, all independent (a sentinel slot loads nothing and is not
 * added), then added in order: two memory latencies a group instead of two a slot. */
template <typename YT, typename OT>
__global__ void reduce8_kernel(const int *pair_slot, const YT *y, int64_t H, const void *w, moex_dtype wdt, int64_t w_ld,
                               int64_t T, int64_t k, OT *out, int64_t out_ld) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        for (int64_t n = threadIdx.x * 8; n < H; n += blockDim.x * 8) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int64_t j0 = 0; j0 < k; j0 += 8) {
                int slot[8];
                float wj[8];
                uint4 v[8];
#pragma unroll
                for (int g = 0; g < 8; g++) {
                    const int64_t j = j0 + g;
                    slot[g] = j < k ? slot_of(pair_slot, t * k + j) : -1;
                    wj[g] = j < k && w ? load_elem(w, wdt, t * w_ld + j) : 1.0f;
                }
#pragma unroll
                for (int g = 0; g < 8; g++)
                    if (slot[g] >= 0) v[g] = *(const uint4 *)(y + (int64_t)slot[g] * H + n);
#pragma unroll
                for (int g = 0; g < 8; g++) {
                    if (slot[g] < 0) continue;
                    const YT *q = (const YT *)&v[g];
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[i] += wj[g] * to_f32(q[i]);
                }
            }
            OT r[8];
#pragma unroll
            for (int i = 0; i < 8; i++) r[i] = from_f32<OT>(acc[i]);
            if (sizeof(OT) == 2)
                *(uint4 *)(out + t * out_ld + n) = *(const uint4 *)r;
            else
                for (int i = 0; i < 8; i++) out[t * out_ld + n + i] = r[i];
        }
    }
}

/* Any dtypes and sizes: one element per thread. */
__global__ void reduce_kernel(const int *pair_slot, const void *y, moex_dtype ydt, int64_t H, const void *w,
                              moex_dtype wdt, int64_t w_ld, int64_t T, int64_t k, void *out, moex_dtype odt,
                              int64_t out_ld) {
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        for (int64_t n = threadIdx.x; n < H; n += blockDim.x) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++) {
                int slot = slot_of(pair_slot, t * k + j);
                if (slot < 0) continue;
                acc += (w ? load_elem(w, wdt, t * w_ld + j) : 1.0f) * load_elem(y, ydt, (int64_t)slot * H + n);
            }
            store_elem(out, odt, t * out_ld + n, acc);
        }
    }
}

/* f32 y (the streamed path), H % 4 == 0: thread (t, 4 columns) over a grid of T x (H / 1024)
 * blocks, so that few tokens still fill the GPU. Per group of 8 slots the slots, weights and y
 * rows are loaded first, all independent (a sentinel slot reads row 0 and is not added), then
 * added in slot order j: the sums of reduce_kernel, without its chain of dependent loads. */
__global__ void reduce4_f32_kernel(const int *pair_slot, const float *y, int64_t H, const void *w, moex_dtype wdt,
                                   int64_t w_ld, int64_t T, int64_t k, void *out, moex_dtype odt, int64_t out_ld) {
    const int64_t n = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (n >= H) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t j0 = 0; j0 < k; j0 += 8) {
            int slot[8];
            float wj[8];
            float4 v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                slot[i] = j0 + i < k ? slot_of(pair_slot, t * k + j0 + i) : -1;
                wj[i] = j0 + i >= k ? 0.0f : w ? load_elem(w, wdt, t * w_ld + j0 + i) : 1.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = *(const float4 *)(y + (int64_t)(slot[i] < 0 ? 0 : slot[i]) * H + n);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (slot[i] < 0) continue;
                acc[0] += wj[i] * v[i].x;
                acc[1] += wj[i] * v[i].y;
                acc[2] += wj[i] * v[i].z;
                acc[3] += wj[i] * v[i].w;
            }
        }
#pragma unroll
        for (int c = 0; c < 4; c++) store_elem(out, odt, t * out_ld + n + c, acc[c]);
    }
}

moex_status routing_reduce(const int *pair_slot, const void *y, moex_dtype ydt, int64_t H, const void *w,
                           moex_dtype wdt, int64_t w_ld, int64_t T, int64_t k, void *out, moex_dtype odt,
                           int64_t out_ld, cudaStream_t s) {
    int blocks = (int)(T < 65535 ? T : 65535);
    const size_t osz = odt == MOEX_F32 ? 4 : 2;
    const int vec = ydt != MOEX_F32 && ydt == odt && H % 8 == 0 && (out_ld * osz) % 16 == 0 && ((uintptr_t)out & 15) == 0;
    if (vec && ydt == MOEX_BF16) {
        reduce8_kernel<__nv_bfloat16, __nv_bfloat16><<<blocks, 256, 0, s>>>(pair_slot, (const __nv_bfloat16 *)y, H, w, wdt,
                                                                           w_ld, T, k, (__nv_bfloat16 *)out, out_ld);
        return MOEX_CUDA_LAUNCHED("reduce kernel");
    }
    if (vec && ydt == MOEX_F16) {
        reduce8_kernel<__half, __half><<<blocks, 256, 0, s>>>(pair_slot, (const __half *)y, H, w, wdt, w_ld, T, k,
                                                           (__half *)out, out_ld);
        return MOEX_CUDA_LAUNCHED("reduce kernel");
    }
    if (ydt == MOEX_F32 && H % 4 == 0 && ((uintptr_t)y & 15) == 0) {
        const dim3 grid((unsigned)((H / 4 + 255) / 256), (unsigned)blocks);
        reduce4_f32_kernel<<<grid, 256, 0, s>>>(pair_slot, (const float *)y, H, w, wdt, w_ld, T, k, out, odt, out_ld);
        return MOEX_CUDA_LAUNCHED("reduce kernel");
    }
    reduce_kernel<<<blocks, H >= 512 ? 512 : 256, 0, s>>>(pair_slot, y, ydt, H, w, wdt, w_ld, T, k, out, odt, out_ld);
    return MOEX_CUDA_LAUNCHED("reduce kernel");
}
