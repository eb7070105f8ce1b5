/* gemv_mma.cu — grouped_mm's streamed forward on tensor cores (mma.sync m16n8k16) in one
 * launch, for bf16/f16 weights and inputs; see gemv.cuh. The plain kernels of gemv.cu
 * spend one FMA per weight and row in f32, which costs as much as the read once
 * an expert has four or more rows; here a warp multiplies 16 weight rows by up
 * to 32 input rows per k step on the tensor cores and the kernel stays bound by
 * the weight stream.
 *
 * Shapes: W [N, K] of one expert (rows n_stride apart, k contiguous), x [rows, K]
 * (T, rows x_ld apart), h [P, I] (T), y [P, H] (f32). A warp owns 16 output
 * features n0 .. n0+15 (the mma's M) of one expert per work item and the expert's rows
 * in passes of 8*NT (its N, NT tiles of 8); the items and their order are at
 * experts_mma_kernel. k advances 32 at a time: lane (g = lane/4,
 * t = lane%4) loads 16 bytes of weight rows g and g+8 and of input row g at k0 + 8t. The two mma steps of
 * the chunk take k0+8t+{0..3} and k0+8t+{4..7} as their logical k 2t..2t+1 and
 * 2t+8..2t+9: the same permutation of k on both operands, so the dot products
 * are unchanged and every load is a whole 16-byte piece. */
#include "backends/cuda/gemv.cuh"
#include "gpu/cuda_check.h"

#include <pthread.h>
#include <stdlib.h>

/* FUSED_WARPS warps a block (each takes its own items), at least FUSED_MIN_BLOCKS blocks an SM */
enum { FUSED_WARPS = 4, FUSED_MIN_BLOCKS = 4, MFEAT = 16, KCHUNK = 32 };

template <typename T> __device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                              uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                        uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One 32-wide k chunk: weight rows g (lo) and g+8 (hi), input row g (x); see the header. */
template <typename T> __device__ __forceinline__ void mma_chunk(float c[4], uint4 lo, uint4 hi, uint4 x) {
    mma16816<T>(c, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
    mma16816<T>(c, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
}

/* Weights are read once: past L1, and the L2 fetches the 256 bytes around each piece (a row's
 * next chunks), so DRAM sees whole lines although a load instruction covers 64 bytes of a row.
 * Not volatile (nor the mma's asm): the weights do not change during a kernel, and the compiler
 * must stay free to issue the loads of the next chunks before the current chunk's mma. */
__device__ __forceinline__ uint4 ld16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
/* The input rows x (not written by the kernel): the read-only path. */
__device__ __forceinline__ uint4 ld16_or_zero(const void *p) { return p ? __ldg((const uint4 *)p) : make_uint4(0, 0, 0, 0); }
/* Rows of h, written by other warps of the same kernel: a plain (coherent) load, after the
 * acquire of their count. */
__device__ __forceinline__ uint4 ld16_written_or_zero(const void *p) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (p) asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

/* ---- gate/up + activation: h[slot, n] = act(gate_n . x + b, up_n . x + b) ------ */

template <typename T, int NT>
__device__ __forceinline__ void gate_up_pass(const layer_view &L, const gemv_groups &G, const T *x, int64_t x_ld, T *h,
                                             int64_t e, int64_t n0, int64_t r0, int nr, const T *ulo, const T *uhi,
                                             const T *glo, const T *ghi, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const T *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = j * 8 + g < nr ? x + (int64_t)G.slot_token[r0 + j * 8 + g] * x_ld : NULL;
    float cu[NT][4], cg[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) cu[j][i] = cg[j][i] = 0.0f;
    const int64_t K = L.H;
#pragma unroll 2
    for (int64_t k0 = 8 * t; k0 < K; k0 += KCHUNK) {
        const uint4 ul = ld16(ulo + k0), uh = ld16(uhi + k0);
        uint4 gl = ul, gh = uh;
        if (L.gated) gl = ld16(glo + k0), gh = ld16(ghi + k0);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint4 xv = ld16_or_zero(xr[j] ? xr[j] + k0 : NULL);
            mma_chunk<T>(cu[j], ul, uh, xv);
            if (L.gated) mma_chunk<T>(cg[j], gl, gh, xv);
        }
    }
    /* c[0], c[1]: feature n0+g, rows 2t, 2t+1 of the tile; c[2], c[3]: feature n0+g+8 */
#pragma unroll
    for (int f = 0; f < 2; f++) {
        const int64_t n = n0 + g + 8 * f;
        if (n >= L.I) continue;
        const float bu = bias_at(L.up_bias, L.wdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.wdt, e, n) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int r = j * 8 + 2 * t + c;
                if (r < nr) h[(r0 + r) * L.I + n] = from_f32<T>(activate(L, cg[j][2 * f + c] + bg, cu[j][2 * f + c] + bu));
            }
    }
}

/* One warp item of gate/up: features n0 .. n0+15 of expert e for all its rows, in passes of up
 * to 32 rows. Rows past I (I % 16 != 0) read the last row again and are not stored. */
template <typename T, int MAXNT>
__device__ __forceinline__ void gate_up_item(const layer_view &L, const gemv_groups &G, const T *x, int64_t x_ld, T *h,
                                             int64_t e, int64_t n0, int lane) {
    const int g = lane >> 2;
    const int64_t nlo = n0 + g < L.I ? n0 + g : L.I - 1, nhi = n0 + g + 8 < L.I ? n0 + g + 8 : L.I - 1;
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *wu = (const T *)proj_base(L.up, e, sizeof(T)), *wg = L.gated ? (const T *)proj_base(L.gate, e, sizeof(T)) : wu;
    const T *ulo = wu + nlo * L.up.n_stride, *uhi = wu + nhi * L.up.n_stride;
    const T *glo = wg + nlo * L.gate.n_stride, *ghi = wg + nhi * L.gate.n_stride;
    for (int64_t r0 = lo; r0 < hi; r0 += 8 * MAXNT) {
        const int nr = hi - r0 < 8 * MAXNT ? (int)(hi - r0) : 8 * MAXNT;
        if (MAXNT == 1 || nr <= 8)
            gate_up_pass<T, 1>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
        else if (MAXNT == 2 || nr <= 16)
            gate_up_pass<T, 2>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
        else
            gate_up_pass<T, 4>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
    }
}

/* ---- down: y[slot, n] = down_n . h[slot] + b (f32) --------------------------------- */

template <typename T, int NT>
__device__ __forceinline__ void down_pass(const layer_view &L, const T *h, float *y, int64_t e, int64_t n0, int64_t r0,
                                          int nr, const T *wlo, const T *whi, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int64_t K = L.I;
    const T *hr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) hr[j] = j * 8 + g < nr ? h + (r0 + j * 8 + g) * K : NULL;
    float c[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[j][i] = 0.0f;
#pragma unroll(NT == 4 ? 2 : 4)
    for (int64_t k0 = 8 * t; k0 < K; k0 += KCHUNK) {
        const uint4 wl = ld16(wlo + k0), wh = ld16(whi + k0);
#pragma unroll
        for (int j = 0; j < NT; j++) mma_chunk<T>(c[j], wl, wh, ld16_written_or_zero(hr[j] ? hr[j] + k0 : NULL));
    }
#pragma unroll
    for (int f = 0; f < 2; f++) {
        const int64_t n = n0 + g + 8 * f;
        if (n >= L.H) continue;
        const float b = bias_at(L.down_bias, L.wdt, e, n);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int r = j * 8 + 2 * t + q;
                if (r < nr) y[(r0 + r) * L.H + n] = c[j][2 * f + q] + b;
            }
    }
}

/* One warp item of down: features n0 .. n0+15 of expert e for all its rows. */
template <typename T, int MAXNT>
__device__ __forceinline__ void down_item(const layer_view &L, const gemv_groups &G, const T *h, float *y, int64_t e,
                                          int64_t n0, int lane) {
    const int g = lane >> 2;
    const int64_t nlo = n0 + g < L.H ? n0 + g : L.H - 1, nhi = n0 + g + 8 < L.H ? n0 + g + 8 : L.H - 1;
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *w = (const T *)proj_base(L.down, e, sizeof(T));
    const T *wlo = w + nlo * L.down.n_stride, *whi = w + nhi * L.down.n_stride;
    for (int64_t r0 = lo; r0 < hi; r0 += 8 * MAXNT) {
        const int nr = hi - r0 < 8 * MAXNT ? (int)(hi - r0) : 8 * MAXNT;
        if (MAXNT == 1 || nr <= 8)
            down_pass<T, 1>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
        else if (MAXNT == 2 || nr <= 16)
            down_pass<T, 2>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
        else
            down_pass<T, 4>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
    }
}

/* ---- the forward in one launch ----------------------------------------------------------
 *
 * Work items, handed out in order by one counter (sched): first gate/up items (hit expert j,
 * 16 features f) for j = 0 .. n_hit-1, f = 0 .. ceil(I/16)-1, then down items (j, 16 features
 * of H) in the same order. A warp takes the next item when it finishes one, so every SM keeps
 * streaming weights until the last item, with no kernel boundary between the projections.
 * A down item of expert e waits until done[e] (sched[e]) counts all ceil(I/16) gate/up items of
 * e: those were handed out before any down item, to warps that are running and never wait, so
 * the wait ends (and in practice is over: the first down items are the first experts'). */

__device__ __forceinline__ int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <typename T, int MINB, int MAXNT>
__global__ void __launch_bounds__(FUSED_WARPS * 32, MINB)
    experts_mma_kernel(layer_view L, gemv_groups G, const int *hit, const int *n_hit, int *sched, const T *x,
                       int64_t x_ld, T *h, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t fg_gu = (L.I + MFEAT - 1) / MFEAT, fg_dn = (L.H + MFEAT - 1) / MFEAT;
    const int64_t hits = *n_hit, n_gu = hits * fg_gu, total = n_gu + hits * fg_dn;
    int *done = sched;
    unsigned long long *next = (unsigned long long *)(sched + ((L.E + 1) & ~(int64_t)1));
    for (;;) {
        unsigned long long item = 0;
        if (lane == 0) item = atomicAdd(next, 1ull);
        item = __shfl_sync(0xffffffffu, item, 0);
        if (item >= (unsigned long long)total) return;
        if (item < (unsigned long long)n_gu) {
            const int64_t e = hit[item / fg_gu];
            gate_up_item<T, MAXNT>(L, G, x, x_ld, h, e, MFEAT * (int64_t)(item % fg_gu), lane);
            __threadfence(); /* this lane's h stores before the count (the pattern of a grid reduction) */
            __syncwarp();
            if (lane == 0) atomicAdd(&done[e], 1);
        } else {
            item -= n_gu;
            const int64_t e = hit[item / fg_dn];
            while (ld_acquire(&done[e]) < fg_gu) __nanosleep(128);
            down_item<T, MAXNT>(L, G, h, y, e, MFEAT * (int64_t)(item % fg_dn), lane);
        }
    }
}

/* ---- launcher ----------------------------------------------------------------------- */

int gemv_mma_usable(const layer_view &L, moex_dtype xdt, const void *x, int64_t x_ld) {
    if (L.wdt != MOEX_BF16 && L.wdt != MOEX_F16) return 0;
    if (xdt != L.wdt || ((uintptr_t)x & 15) || (x_ld * 2) % 16) return 0;
    return L.H % KCHUNK == 0 && L.I % KCHUNK == 0 && gemv_vectorizable(L, 2);
}

#define OCC_VARIANT(MINB, MAXNT) \
    {(const void *)experts_mma_kernel<__nv_bfloat16, MINB, MAXNT>, (const void *)experts_mma_kernel<__half, MINB, MAXNT>}
enum { NVAR = 11 };
static const void *g_kernels[NVAR][2] = {OCC_VARIANT(4, 4), OCC_VARIANT(5, 4), OCC_VARIANT(6, 4), OCC_VARIANT(8, 4),
                                        OCC_VARIANT(6, 2), OCC_VARIANT(8, 2), OCC_VARIANT(8, 1), OCC_VARIANT(5, 2), OCC_VARIANT(4, 4), OCC_VARIANT(4, 4), OCC_VARIANT(4, 4)};
/* variants 8, 9, 10: shared memory padding that leaves 3, 2 or 1 blocks an SM */
static const int g_pad[NVAR] = {0, 0, 0, 0, 0, 0, 0, 0, 3, 2, 1};
static int smem_of(int v) { return g_pad[v] ? (200 << 10) / g_pad[v] : 0; }
static int g_blocks[NVAR][2], g_v;
static pthread_once_t g_blocks_once = PTHREAD_ONCE_INIT;
static void find_blocks(void) {
    const char *v = getenv("MOEX_DEV_OCC");
    if (v && atoi(v) >= 0 && atoi(v) < NVAR) g_v = atoi(v);
    for (int i = 0; i < NVAR; i++)
        for (int d = 0; d < 2; d++) {
            int b = 0;
            if ((smem_of(i) && cudaFuncSetAttribute(g_kernels[i][d], cudaFuncAttributeMaxDynamicSharedMemorySize, smem_of(i)) != cudaSuccess) ||
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, g_kernels[i][d], FUSED_WARPS * 32, smem_of(i)) != cudaSuccess)
                (void)cudaGetLastError();
            g_blocks[i][d] = b < 1 ? 4 : b;
        }
}

void gemv_mma_init(void) { pthread_once(&g_blocks_once, find_blocks); }

moex_status gemv_mma_experts(const layer_view &L, const gemv_groups &G, const int *hit, const int *n_hit, int *sched,
                             const void *x, int64_t x_ld, void *h, float *y, int num_sms, cudaStream_t s) {
    const int d = L.wdt == MOEX_BF16 ? 0 : 1;
    void *args[] = {(void *)&L, (void *)&G, (void *)&hit, (void *)&n_hit, (void *)&sched, (void *)&x, (void *)&x_ld,
                    (void *)&h, (void *)&y};
    return moex_cuda_status(cudaLaunchKernel(g_kernels[g_v][d], dim3(num_sms * g_blocks[g_v][d]), dim3(FUSED_WARPS * 32),
                                             args, (size_t)smem_of(g_v), s),
                            "streamed experts kernel (tensor cores)");
}
