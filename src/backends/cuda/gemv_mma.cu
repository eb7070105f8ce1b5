/* gemv_mma.cu — grouped_mm's streamed forward on tensor cores (mma.sync m16n8k16) in one
 * launch, for bf16/f16 weights and inputs; see gemv.cuh. The plain kernels of gemv.cu
 * spend one FMA per weight and row in f32, which costs as much as the read once
 * an expert has four or more rows; here a warp multiplies 16 weight rows by up
 * to 16 input rows per k step on the tensor cores and the kernel stays bound by
 * the weight stream, which cp.async brings into each warp's ring in shared memory
 * together with the input rows (see "the weight stream of one warp").
 *
 * Shapes: W [N, K] of one expert (rows n_stride apart, k contiguous), x [rows, K]
 * (T, rows x_ld apart), h [P, I] (T), y [P, H] (f32). A warp owns 16 output
 * features n0 .. n0+15 (the mma's M) of one expert per work item and the expert's rows
 * in passes of 8*NT (its N, NT tiles of 8); the items and their order are at
 * experts_mma_kernel. k advances 32 at a time: lane (g = lane/4, t = lane%4) reads
 * 16 bytes of weight rows g and g+8 and of input row g at k0 + 8t from the stage. The two mma steps of
 * the chunk take k0+8t+{0..3} and k0+8t+{4..7} as their logical k 2t..2t+1 and
 * 2t+8..2t+9: the same permutation of k on both operands, so the dot products
 * are unchanged and every load is a whole 16-byte piece. */
#include "backends/cuda/gemv.cuh"
#include "gpu/cuda_check.h"

#include <pthread.h>

enum { MFEAT = 16, KCHUNK = 32 };

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

/* ---- loads --------------------------------------------------------------------------- */


__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronously, through L2 only (the weights are read once); the
 * L2 fetches the 256 bytes around them, which the neighbouring lanes ask for anyway. */
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 lds16(const void *p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
    return v;
}

/* ---- the weight stream of one warp ------------------------------------------------------
 *
 * A warp streams MATS matrices of 16 rows (w[m] = row 0, rows ns apart, nvalid of them real:
 * the rest read the last real row again) along k through its ring of STAGES stages in shared
 * memory, each stage KT inputs of every row: [MATS][16][KT] of T. A stage is copied with
 * cp.async, CPR = KT/8 lanes a row, so every copy instruction reads 32/CPR whole runs of
 * 2*KT contiguous bytes (the read floor's pattern: long runs, many in flight, no registers
 * held by the loads). Chunk c (8 inputs) of row r sits at chunk c ^ 4*(r & 1) of its row in
 * shared memory, so that the reads below (rows g and g+1 of 8 lanes, 4 chunks each) touch
 * every bank once. */

template <int KT> __device__ __forceinline__ int swz(int r, int c) { return c ^ ((r & 1) << 2); }

/* Rows of a stage: MATS x 16 weight rows, then XROWS input rows. */
enum { XROWS = 16 };

template <typename T, int MATS, int NT, int KT>
__device__ __forceinline__ void issue_stage(const T *const (&w)[MATS], int64_t ns, int nvalid,
                                            const T *const (&xs)[8 * NT * KT / 256], int64_t k0, int64_t kt, T *buf,
                                            int lane) {
    constexpr int CPR = KT / 8, RPI = 32 / CPR;
    const int c = lane % CPR;
    if (8 * c >= kt) return;
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int i = 0; i < 16 / RPI; i++) {
            const int r = i * RPI + lane / CPR, src_r = r < nvalid ? r : nvalid - 1;
            cp16(buf + (m * 16 + r) * KT + 8 * swz<KT>(r, c), w[m] + src_r * ns + k0 + 8 * c);
        }
    T *X = buf + MATS * 16 * KT;
#pragma unroll
    for (int i = 0; i < 8 * NT / RPI; i++) {
        const int r = i * RPI + lane / CPR;
        cp16(X + r * KT + 8 * swz<KT>(r, c), xs[i] + k0 + 8 * c);
    }
}

/* The input rows this lane copies: row i * RPI + lane / CPR of the tile, for i < 8 NT / RPI
 * (rows past nr copy row nr - 1: their results are not stored). */
template <int NT, int KT>
__device__ __forceinline__ int copy_row(int i, int nr, int lane) {
    constexpr int CPR = KT / 8, RPI = 32 / CPR;
    const int r = i * RPI + lane / CPR;
    return r < nr ? r : nr - 1;
}

/* c[m][j] += rows of matrix m . input tile j over all K, with both the weights and the input
 * rows (xs: copy_row's rows) brought by the stages. The k mapping is the header's: lane (g, t)
 * takes inputs k0 + 8t .. k0 + 8t + 7 of each 32-wide chunk of weights and inputs alike. */
template <typename T, int NT, int MATS, int KT, int STAGES>
__device__ __forceinline__ void stream_rows(const T *const (&w)[MATS], int64_t ns, int nvalid, int64_t K,
                                            const T *const (&xs)[8 * NT * KT / 256], float (&c)[MATS][NT][4], T *ring,
                                            int lane) {
    constexpr int STAGE = (MATS * 16 + XROWS) * KT;
    const int g = lane >> 2, t = lane & 3;
    const int64_t nst = (K + KT - 1) / KT;
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) c[m][j][i] = 0.0f;
#pragma unroll
    for (int p = 0; p < STAGES - 1; p++) {
        if (p < nst) issue_stage<T, MATS, NT, KT>(w, ns, nvalid, xs, p * KT, K - p * KT, ring + p * STAGE, lane);
        cp_commit();
    }
    for (int64_t st = 0; st < nst; st++) {
        const int64_t p = st + STAGES - 1;
        if (p < nst) issue_stage<T, MATS, NT, KT>(w, ns, nvalid, xs, p * KT, K - p * KT, ring + (p % STAGES) * STAGE, lane);
        cp_commit();
        cp_wait<STAGES - 1>();
        __syncwarp();
        const T *buf = ring + (st % STAGES) * STAGE, *X = buf + MATS * 16 * KT;
        const int64_t kt = K - st * KT < KT ? K - st * KT : KT;
#pragma unroll
        for (int s = 0; s < KT / 32; s++) {
            if (32 * s >= kt) break;
            uint4 xv[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) xv[j] = lds16(X + (j * 8 + g) * KT + 8 * swz<KT>(g, 4 * s + t));
#pragma unroll
            for (int m = 0; m < MATS; m++) {
                const uint4 lo = lds16(buf + (m * 16 + g) * KT + 8 * swz<KT>(g, 4 * s + t));
                const uint4 hi = lds16(buf + (m * 16 + g + 8) * KT + 8 * swz<KT>(g + 8, 4 * s + t));
#pragma unroll
                for (int j = 0; j < NT; j++) mma_chunk<T>(c[m][j], lo, hi, xv[j]);
            }
        }
        __syncwarp(); /* the buffer is refilled by the next iteration's copies */
    }
}

/* ---- gate/up + activation: h[slot, n] = act(gate_n . x + b, up_n . x + b) ------ */

template <typename T, int NT, int MATS, int KT, int STAGES>
__device__ __forceinline__ void gate_up_pass(const layer_view &L, const gemv_groups &G, const T *x, int64_t x_ld, T *h,
                                             int64_t e, int64_t n0, int64_t r0, int nr, const T *const (&w)[MATS],
                                             T *ring, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const T *xs[8 * NT * KT / 256];
#pragma unroll
    for (int i = 0; i < 8 * NT * KT / 256; i++)
        xs[i] = x + (int64_t)G.slot_token[r0 + copy_row<NT, KT>(i, nr, lane)] * x_ld;
    float c[MATS][NT][4];
    const int nvalid = L.I - n0 < 16 ? (int)(L.I - n0) : 16;
    stream_rows<T, NT, MATS, KT, STAGES>(w, L.up.n_stride, nvalid, L.H, xs, c, ring, lane);
    /* c[.][j][0], [1]: feature n0+g, rows 2t, 2t+1 of tile j; [2], [3]: feature n0+g+8. Matrix 0 is
     * the gate of a gated layer, the last one the up projection. */
#pragma unroll
    for (int f = 0; f < 2; f++) {
        const int64_t n = n0 + g + 8 * f;
        if (n >= L.I) continue;
        const float bu = bias_at(L.up_bias, L.wdt, e, n), bg = L.gated ? bias_at(L.gate_bias, L.wdt, e, n) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int r = j * 8 + 2 * t + q;
                if (r < nr)
                    h[(r0 + r) * L.I + n] =
                        from_f32<T>(activate(L, c[0][j][2 * f + q] + bg, c[MATS - 1][j][2 * f + q] + bu));
            }
    }
}

/* One warp item of gate/up: features n0 .. n0+15 of expert e for all its rows, in passes of up
 * to 32 rows. */
template <typename T, int MATS, int KT, int STAGES>
__device__ __forceinline__ void gate_up_item(const layer_view &L, const gemv_groups &G, const T *x, int64_t x_ld, T *h,
                                             int64_t e, int64_t n0, T *ring, int lane) {
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *wu = (const T *)proj_base(L.up, e, sizeof(T)) + n0 * L.up.n_stride;
    const T *w[MATS];
    w[MATS - 1] = wu;
    if (MATS == 2) w[0] = (const T *)proj_base(L.gate, e, sizeof(T)) + n0 * L.gate.n_stride;
    for (int64_t r0 = lo; r0 < hi; r0 += XROWS) {
        const int nr = hi - r0 < XROWS ? (int)(hi - r0) : XROWS;
        if (nr <= 8)
            gate_up_pass<T, 1, MATS, KT, STAGES>(L, G, x, x_ld, h, e, n0, r0, nr, w, ring, lane);
        else
            gate_up_pass<T, 2, MATS, KT, STAGES>(L, G, x, x_ld, h, e, n0, r0, nr, w, ring, lane);
    }
}

/* ---- down: y[slot, n] = down_n . h[slot] + b (f32) --------------------------------- */

template <typename T, int NT, int KT, int STAGES>
__device__ __forceinline__ void down_pass(const layer_view &L, const T *h, float *y, int64_t e, int64_t n0, int64_t r0,
                                          int nr, const T *const (&w)[1], T *ring, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const T *xs[8 * NT * KT / 256];
#pragma unroll
    for (int i = 0; i < 8 * NT * KT / 256; i++) xs[i] = h + (r0 + copy_row<NT, KT>(i, nr, lane)) * L.I;
    float c[1][NT][4];
    const int nvalid = L.H - n0 < 16 ? (int)(L.H - n0) : 16;
    stream_rows<T, NT, 1, KT, STAGES>(w, L.down.n_stride, nvalid, L.I, xs, c, ring, lane);
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
                if (r < nr) y[(r0 + r) * L.H + n] = c[0][j][2 * f + q] + b;
            }
    }
}

/* One warp item of down: features n0 .. n0+15 of expert e for all its rows. */
template <typename T, int KT, int STAGES>
__device__ __forceinline__ void down_item(const layer_view &L, const gemv_groups &G, const T *h, float *y, int64_t e,
                                          int64_t n0, T *ring, int lane) {
    const int64_t lo = G.offsets[e], hi = G.offsets[e + 1];
    const T *const w[1] = {(const T *)proj_base(L.down, e, sizeof(T)) + n0 * L.down.n_stride};
    for (int64_t r0 = lo; r0 < hi; r0 += XROWS) {
        const int nr = hi - r0 < XROWS ? (int)(hi - r0) : XROWS;
        if (nr <= 8)
            down_pass<T, 1, KT, STAGES>(L, h, y, e, n0, r0, nr, w, ring, lane);
        else
            down_pass<T, 2, KT, STAGES>(L, h, y, e, n0, r0, nr, w, ring, lane);
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

/* The configuration: STREAM_KT inputs a stage (128-byte runs of every row), RING bytes of shared
 * memory a warp, STREAM_WARPS warps a block, one block an SM (216 KiB). A stage of gated
 * gate/up holds 2 x 16 weight rows and the input rows, ST2 = 2 of them fit the ring; down and
 * ungated gate/up ST1 = 3. Measured against 8 and 12 warps, 128-input stages and deeper rings
 * (dev/notes/cuda-notes.md, "cp.async"). */
enum { STREAM_KT = 64, STREAM_WARPS = 16, RING = 13824 };

template <typename T>
__global__ void __launch_bounds__(STREAM_WARPS * 32, 1)
    experts_mma_kernel(layer_view L, gemv_groups G, const int *hit, const int *n_hit, int *sched, const T *x,
                       int64_t x_ld, T *h, float *y) {
    constexpr int KT = STREAM_KT, ST2 = RING / ((2 * 16 + XROWS) * KT * (int)sizeof(T)),
                  ST1 = RING / ((16 + XROWS) * KT * (int)sizeof(T));
    static_assert(ST2 >= 2, "two stages at least");
    extern __shared__ __align__(128) unsigned char smem[];
    T *ring = (T *)(smem + (threadIdx.x >> 5) * RING);
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
            const int64_t e = hit[item / fg_gu], n0 = MFEAT * (int64_t)(item % fg_gu);
            if (L.gated)
                gate_up_item<T, 2, KT, ST2>(L, G, x, x_ld, h, e, n0, ring, lane);
            else
                gate_up_item<T, 1, KT, ST1>(L, G, x, x_ld, h, e, n0, ring, lane);
            __threadfence(); /* this lane's h stores before the count (the pattern of a grid reduction) */
            __syncwarp();
            if (lane == 0) atomicAdd(&done[e], 1);
        } else {
            item -= n_gu;
            const int64_t e = hit[item / fg_dn];
            while (ld_acquire(&done[e]) < fg_gu) __nanosleep(128);
            down_item<T, KT, ST1>(L, G, h, y, e, MFEAT * (int64_t)(item % fg_dn), ring, lane);
        }
    }
}

/* ---- launcher ----------------------------------------------------------------------- */

int gemv_mma_usable(const layer_view &L, moex_dtype xdt, const void *x, int64_t x_ld) {
    if (L.wdt != MOEX_BF16 && L.wdt != MOEX_F16) return 0;
    if (xdt != L.wdt || ((uintptr_t)x & 15) || (x_ld * 2) % 16) return 0;
    return L.H % KCHUNK == 0 && L.I % KCHUNK == 0 && gemv_vectorizable(L, 2);
}


static const int STREAM_SMEM = RING * STREAM_WARPS;
static int g_blocks[2]; /* blocks an SM holds, bf16 and f16 (gemv_mma_init): 1, or 0 if none fits */
static cudaError_t g_init_err;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

template <typename T> static cudaError_t allow_smem(int *blocks) {
    cudaError_t err = cudaFuncSetAttribute(experts_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, STREAM_SMEM);
    if (!err) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, experts_mma_kernel<T>, STREAM_WARPS * 32,
                                                                 STREAM_SMEM);
    return err;
}

static void init_blocks(void) {
    g_init_err = allow_smem<__nv_bfloat16>(&g_blocks[0]);
    if (!g_init_err) g_init_err = allow_smem<__half>(&g_blocks[1]);
}

moex_status gemv_mma_init(void) {
    pthread_once(&g_init_once, init_blocks);
    return moex_cuda_status(g_init_err, "streamed experts kernel: shared memory size");
}

moex_status gemv_mma_experts(const layer_view &L, const gemv_groups &G, const int *hit, const int *n_hit, int *sched,
                             const void *x, int64_t x_ld, void *h, float *y, int num_sms, cudaStream_t s) {
    const int d = L.wdt == MOEX_BF16 ? 0 : 1;
    if (g_blocks[d] < 1)
        return moex_fail(MOEX_ERR_INTERNAL, "streamed experts kernel: %d bytes of shared memory per block do not fit an SM "
                         "(or gemv_mma_init was not called)", STREAM_SMEM);
    const dim3 grid((unsigned)(num_sms * g_blocks[d])), block(STREAM_WARPS * 32);
    if (d == 0)
        experts_mma_kernel<__nv_bfloat16><<<grid, block, STREAM_SMEM, s>>>(L, G, hit, n_hit, sched,
                                                                          (const __nv_bfloat16 *)x, x_ld,
                                                                          (__nv_bfloat16 *)h, y);
    else
        experts_mma_kernel<__half><<<grid, block, STREAM_SMEM, s>>>(L, G, hit, n_hit, sched, (const __half *)x, x_ld,
                                                                   (__half *)h, y);
    return MOEX_CUDA_LAUNCHED("streamed experts kernel (tensor cores)");
}
