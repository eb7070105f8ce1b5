/* gemv_mma.cu — the streamed expert kernels on tensor cores (mma.sync m16n8k16),
 * for bf16/f16 weights and inputs; see gemv.cuh. The plain kernels of gemv.cu
 * spend one FMA per weight and row in f32, which costs as much as the read once
 * an expert has four or more rows; here a warp multiplies 16 weight rows by up
 * to 32 input rows per k step on the tensor cores and the kernel stays bound by
 * the weight stream.
 *
 * Shapes: W [N, K] of one expert (rows n_stride apart, k contiguous), x [rows, K]
 * (T, rows x_ld apart), h [P, I] (T), y [P, H] (f32). A warp owns 16 output
 * features n0 .. n0+15 (the mma's M) and an expert's rows in passes of 8*NT (its
 * N, NT tiles of 8); a block of GU_WARPS or DOWN_WARPS warps covers 16 features per
 * warp; grid.y walks the experts. k advances 32 at a time: lane (g = lane/4,
 * t = lane%4) loads 16 bytes of weight rows g and g+8 and of input row g at k0 + 8t. The two mma steps of
 * the chunk take k0+8t+{0..3} and k0+8t+{4..7} as their logical k 2t..2t+1 and
 * 2t+8..2t+9: the same permutation of k on both operands, so the dot products
 * are unchanged and every load is a whole 16-byte piece. */
#include "backends/cuda/gemv.cuh"
#include "gpu/cuda_check.h"

/* warps per block: 4 for gate/up (a block streams 64 features x K; smaller blocks leave a
 * shorter last wave when K is large), 8 for down */
enum { GU_WARPS = 4, DOWN_WARPS = 8, MFEAT = 16, KCHUNK = 32 };

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
__device__ __forceinline__ uint4 ld16_or_zero(const void *p) { return p ? __ldg((const uint4 *)p) : make_uint4(0, 0, 0, 0); }

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

template <typename T>
__global__ void __launch_bounds__(GU_WARPS * 32, 4) gate_up_mma_kernel(layer_view L, gemv_groups G, const T *x,
                                                                     int64_t x_ld, T *h) {
    asm volatile("griddepcontrol.launch_dependents;"); /* the down kernel may start its blocks */
    const int lane = threadIdx.x & 31;
    const int64_t n0 = MFEAT * (blockIdx.x * (int64_t)GU_WARPS + (threadIdx.x >> 5));
    if (n0 >= L.I) return;
    const int g = lane >> 2;
    /* rows past I (I % 16 != 0) read the last row again and are not stored */
    const int64_t nlo = n0 + g < L.I ? n0 + g : L.I - 1, nhi = n0 + g + 8 < L.I ? n0 + g + 8 : L.I - 1;
    for (int64_t grp = blockIdx.y; grp < G.count; grp += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, grp, &lo, &hi);
        if (e < 0) continue;
        const T *wu = (const T *)proj_base(L.up, e, sizeof(T)), *wg = L.gated ? (const T *)proj_base(L.gate, e, sizeof(T)) : wu;
        const T *ulo = wu + nlo * L.up.n_stride, *uhi = wu + nhi * L.up.n_stride;
        const T *glo = wg + nlo * L.gate.n_stride, *ghi = wg + nhi * L.gate.n_stride;
        for (int64_t r0 = lo; r0 < hi; r0 += 32) {
            const int nr = hi - r0 < 32 ? (int)(hi - r0) : 32;
            if (nr <= 8)
                gate_up_pass<T, 1>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
            else if (nr <= 16)
                gate_up_pass<T, 2>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
            else
                gate_up_pass<T, 4>(L, G, x, x_ld, h, e, n0, r0, nr, ulo, uhi, glo, ghi, lane);
        }
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
        for (int j = 0; j < NT; j++) mma_chunk<T>(c[j], wl, wh, ld16_or_zero(hr[j] ? hr[j] + k0 : NULL));
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

template <typename T>
__global__ void __launch_bounds__(DOWN_WARPS * 32, 2) down_mma_kernel(layer_view L, gemv_groups G, const T *h, float *y) {
    const int lane = threadIdx.x & 31;
    const int64_t n0 = MFEAT * (blockIdx.x * (int64_t)DOWN_WARPS + (threadIdx.x >> 5));
    if (n0 >= L.H) return;
    const int g = lane >> 2;
    const int64_t nlo = n0 + g < L.H ? n0 + g : L.H - 1, nhi = n0 + g + 8 < L.H ? n0 + g + 8 : L.H - 1;
    { /* launched as a programmatic dependent of the gate/up kernel: pull the first 512 bytes of
       * this warp's rows of its first expert into L2, then wait for h */
        int64_t lo, hi;
        const int64_t e = blockIdx.y < G.count ? group_rows(G, L.E, blockIdx.y, &lo, &hi) : -1;
        if (e >= 0) {
            const T *w = (const T *)proj_base(L.down, e, sizeof(T));
            const int64_t k = 64 * (lane & 3) < L.I ? 64 * (lane & 3) : 0;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + nlo * L.down.n_stride + k));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + nhi * L.down.n_stride + k));
        }
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    for (int64_t grp = blockIdx.y; grp < G.count; grp += gridDim.y) {
        int64_t lo, hi;
        const int64_t e = group_rows(G, L.E, grp, &lo, &hi);
        if (e < 0) continue;
        const T *w = (const T *)proj_base(L.down, e, sizeof(T));
        const T *wlo = w + nlo * L.down.n_stride, *whi = w + nhi * L.down.n_stride;
        for (int64_t r0 = lo; r0 < hi; r0 += 32) {
            const int nr = hi - r0 < 32 ? (int)(hi - r0) : 32;
            if (nr <= 8)
                down_pass<T, 1>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
            else if (nr <= 16)
                down_pass<T, 2>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
            else
                down_pass<T, 4>(L, h, y, e, n0, r0, nr, wlo, whi, lane);
        }
    }
}

/* ---- launchers ------------------------------------------------------------------- */

static dim3 mma_grid(int64_t features, int64_t groups, int warps) {
    const int64_t per_block = (int64_t)MFEAT * warps;
    return dim3((unsigned)((features + per_block - 1) / per_block),
                (unsigned)(groups < 65535 ? (groups > 0 ? groups : 1) : 65535));
}

int gemv_mma_usable(const layer_view &L, moex_dtype xdt, const void *x, int64_t x_ld) {
    if (L.wdt != MOEX_BF16 && L.wdt != MOEX_F16) return 0;
    if (xdt != L.wdt || ((uintptr_t)x & 15) || (x_ld * 2) % 16) return 0;
    return L.H % KCHUNK == 0 && L.I % KCHUNK == 0 && gemv_vectorizable(L, 2);
}

moex_status gemv_mma_gate_up(const layer_view &L, const gemv_groups &G, const void *x, int64_t x_ld, void *h,
                             cudaStream_t s) {
    const dim3 grid = mma_grid(L.I, G.count, GU_WARPS);
    if (L.wdt == MOEX_BF16)
        gate_up_mma_kernel<__nv_bfloat16><<<grid, GU_WARPS * 32, 0, s>>>(L, G, (const __nv_bfloat16 *)x, x_ld,
                                                                       (__nv_bfloat16 *)h);
    else
        gate_up_mma_kernel<__half><<<grid, GU_WARPS * 32, 0, s>>>(L, G, (const __half *)x, x_ld, (__half *)h);
    return MOEX_CUDA_LAUNCHED("gate/up kernel (tensor cores)");
}

moex_status gemv_mma_down(const layer_view &L, const gemv_groups &G, const void *h, float *y, cudaStream_t s) {
    /* a programmatic dependent of the gate/up kernel: its blocks fill the SMs that the gate/up
     * kernel's last wave leaves idle and wait there (griddepcontrol.wait) for h */
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = dependent_launch(mma_grid(L.H, G.count, DOWN_WARPS), dim3(DOWN_WARPS * 32), s, &attr);
    const cudaError_t err =
        L.wdt == MOEX_BF16
            ? cudaLaunchKernelEx(&cfg, down_mma_kernel<__nv_bfloat16>, L, G, (const __nv_bfloat16 *)h, y)
            : cudaLaunchKernelEx(&cfg, down_mma_kernel<__half>, L, G, (const __half *)h, y);
    return moex_cuda_status(err, "down kernel (tensor cores)");
}
