/* ep_plan.cu — expert parallelism's dispatch plan on the GPU and the copy of blocks whose sizes
 * only the GPU knows (see ep_plan.h). */
#include "backends/cuda/device_common.cuh"
#include "backends/cuda/ep_plan.h"
#include "core/gpu_runtime.h"
#include "gpu/cuda_check.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t moex_ep_dev_plan_bytes(int R, int64_t P, int64_t cap) {
    return align256((size_t)R * 4) + align256((size_t)P * 4) + align256((size_t)R * (size_t)cap * 4);
}

moex_ep_dev_plan moex_ep_dev_plan_carve(void *ws, int R, int64_t P, int64_t cap) {
    char *p = (char *)ws;
    moex_ep_dev_plan plan;
    plan.count = (int32_t *)p, p += align256((size_t)R * 4);
    plan.row_of = (int32_t *)p, p += align256((size_t)P * 4);
    plan.local = (int32_t *)p;
    return plan;
}

enum { PLAN_THREADS = 1024 };

/* Block r (one a destination rank) walks the P pairs in chunks of PLAN_THREADS, in order: a pair
 * for rank r takes the next row of block r (the chunk's prefix count by ballots, the warps' totals
 * in shared memory), so the rows keep the pairs' order; block 0 also writes -1 for every sentinel
 * pair and flags the bad ids. Then it fills the rest of its block of local with the sentinel. */
__global__ void __launch_bounds__(PLAN_THREADS)
    ep_plan_kernel(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int64_t per, int64_t cap,
                   moex_ep_dev_plan plan, int *flags) {
    __shared__ int warp_total[PLAN_THREADS / 32];
    __shared__ int chunk_total;
    const int r = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t P = T * k;
    int64_t placed = 0; /* rows of block r so far */
    for (int64_t base = 0; base < P; base += PLAN_THREADS) {
        const int64_t p = base + threadIdx.x;
        int64_t e = -1;
        if (p < P) e = load_id(ids, ids64, ld, p / k, p % k);
        const bool routed = e >= 0 && e < E;
        if (r == 0 && p < P && !routed) {
            plan.row_of[p] = -1;
            if (e != -1 && e != E) atomicOr(flags, MOEX_CUDA_FLAG_BAD_ID);
        }
        const bool mine = routed && e / per == r;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_total[warp] = __popc(ballot);
        __syncthreads();
        if (warp == 0) { /* the warps' exclusive prefix, in place; the chunk's total */
            const int v = warp_total[lane];
            int incl = v;
#pragma unroll
            for (int d = 1; d < 32; d *= 2) {
                const int u = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += u;
            }
            warp_total[lane] = incl - v;
            if (lane == 31) chunk_total = incl;
        }
        __syncthreads();
        if (mine) {
            const int64_t i = placed + warp_total[warp] + __popc(ballot & ((1u << lane) - 1u));
            const int64_t row = (int64_t)r * cap + i;
            plan.row_of[p] = (int32_t)row;
            plan.local[row] = (int32_t)(e - (int64_t)r * per);
        }
        placed += chunk_total;
        __syncthreads(); /* warp_total and chunk_total are rewritten by the next chunk */
    }
    for (int64_t i = placed + threadIdx.x; i < cap; i += PLAN_THREADS) plan.local[(int64_t)r * cap + i] = (int32_t)per;
    if (threadIdx.x == 0) plan.count[r] = (int32_t)placed;
}

moex_status moex_ep_dev_plan_build(const void *ids, int ids64, int64_t ld, int64_t T, int64_t k, int64_t E, int R,
                                   int64_t cap, const moex_ep_dev_plan *plan, int *flags, cudaStream_t s) {
    if (R < 1 || E < 1 || E % R)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: %lld experts do not divide among %d ranks",
                         (long long)E, R);
    if (T < 0 || k < 1 || ld < k || cap < T * k || cap > INT32_MAX / R || !plan || !flags || (T && !ids))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: bad device plan arguments (T %lld, k %lld, "
                         "ld %lld, blocks of %lld rows for %d ranks)", (long long)T, (long long)k, (long long)ld,
                         (long long)cap, R);
    ep_plan_kernel<<<R, PLAN_THREADS, 0, s>>>(ids, ids64, ld, T, k, E, E / R, cap, *plan, flags);
    return MOEX_CUDA_LAUNCHED("expert-parallel plan kernel");
}

/* Block (x, b): rows x, x + gridDim.x, ... of block b below rows[b], 16 bytes a thread a step
 * (VEC) or a byte. */
template <bool VEC>
__global__ void ep_copy_kernel(const int32_t *rows, int64_t max_rows, const char *src, int64_t src_stride, char *dst,
                               int64_t dst_stride, int64_t row_bytes) {
    const int b = blockIdx.y;
    int64_t n = rows[b];
    if (n > max_rows) n = max_rows;
    const char *s = src + (int64_t)b * src_stride;
    char *d = dst + (int64_t)b * dst_stride;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        if (VEC) {
            const uint4 *sr = (const uint4 *)(s + i * row_bytes);
            uint4 *dr = (uint4 *)(d + i * row_bytes);
            for (int64_t c = threadIdx.x; c < row_bytes / 16; c += blockDim.x) dr[c] = sr[c];
        } else {
            for (int64_t c = threadIdx.x; c < row_bytes; c += blockDim.x) d[i * row_bytes + c] = s[i * row_bytes + c];
        }
    }
}

moex_status moex_ep_dev_copy_blocks(const int32_t *rows, int blocks, int64_t max_rows, const void *src,
                                    int64_t src_stride, void *dst, int64_t dst_stride, int64_t row_bytes,
                                    cudaStream_t s) {
    if (blocks < 0 || blocks > 65535 || max_rows < 0 || row_bytes < 0 || (blocks && (!rows || !src || !dst)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: bad block copy (%d blocks of up to %lld rows "
                         "of %lld bytes)", blocks, (long long)max_rows, (long long)row_bytes);
    if (!blocks || !max_rows || !row_bytes) return MOEX_OK;
    const bool vec = row_bytes % 16 == 0 && src_stride % 16 == 0 && dst_stride % 16 == 0 &&
                     ((uintptr_t)src & 15) == 0 && ((uintptr_t)dst & 15) == 0;
    const dim3 grid((unsigned)(max_rows < 1024 ? max_rows : 1024), (unsigned)blocks);
    if (vec)
        ep_copy_kernel<true><<<grid, 256, 0, s>>>(rows, max_rows, (const char *)src, src_stride, (char *)dst,
                                                  dst_stride, row_bytes);
    else
        ep_copy_kernel<false><<<grid, 256, 0, s>>>(rows, max_rows, (const char *)src, src_stride, (char *)dst,
                                                   dst_stride, row_bytes);
    return MOEX_CUDA_LAUNCHED("expert-parallel block copy kernel");
}
