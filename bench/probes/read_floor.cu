// read_floor.cu: a diagnostic, not part of moex. How fast can one token of qwen3-30b-a3b's
// experts (75.5 MB of bf16 weights) be read on this GPU? Kernels that only read (and fold the
// words, so nothing is optimised away), in plain sequential order and in the access patterns of
// batched_mm's two kernels (gemv.cu), timed alone and as CUDA graphs, after an L2 flush and warm.
// `moex bench --device cuda` measures the plain one-kernel read of each case as its read floor;
// this probe adds the pattern variants behind that choice.
//   build: the CMake target read_floor_probe (CUDA builds), or nvcc -O3 -arch=sm_90a read_floor.cu
//   run:   read_floor_probe OUT.csv   (prints a table; about 2 s on an H200)
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include "probe_common.h"

__device__ float sink_f;
__device__ __forceinline__ float fold(uint4 v) { return __uint_as_float(v.x ^ v.y ^ v.z ^ v.w); }

// sequential: bytes [0, n16*16) read with a grid-stride loop, UN loads in flight per thread
template <int UN>
__global__ void __launch_bounds__(256) read_seq(const uint4 *p, size_t n16) {
    float s = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + (UN - 1) * stride < n16; i += UN * stride) {
        uint4 v[UN];
#pragma unroll
        for (int u = 0; u < UN; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < UN; u++) s += fold(v[u]);
    }
    for (; i < n16; i += stride) s += fold(__ldg(p + i));
    if (s == 1.2345f) sink_f = s;
}

// gate/up pattern: grid (48, 8) x 256; warp: features n, n+1 of pair p; rows of 4096 B;
// expert p = [gate 768 rows; up 768 rows]; MODE 0: 8 steps of 4 loads (main), 1: same fully
// unrolled, 2: two contiguous 8 KiB spans read in 16 steps of 2 loads
template <int MODE>
__global__ void __launch_bounds__(256, 3) read_gu(const char *w, int pdl) {
    if (pdl) asm volatile("griddepcontrol.launch_dependents;");
    const int lane = threadIdx.x & 31;
    const int n = 2 * (blockIdx.x * 8 + (threadIdx.x >> 5));
    const char *e = w + (size_t)blockIdx.y * 1536 * 4096;
    const uint4 *g = (const uint4 *)(e + (size_t)n * 4096), *u = (const uint4 *)(e + (size_t)(768 + n) * 4096);
    float s = 0;
    if (MODE == 2) {
        for (int i = lane; i < 512; i += 32) {
            uint4 a = __ldg(g + i), b = __ldg(u + i);
            s += fold(a) + fold(b);
        }
    } else {
#pragma unroll(MODE == 1 ? 8 : 1)
        for (int i = lane; i < 256; i += 32) {
            uint4 a = __ldg(g + i), b = __ldg(g + 256 + i), c = __ldg(u + i), d = __ldg(u + 256 + i);
            s += fold(a) + fold(b) + fold(c) + fold(d);
        }
    }
    if (s == 1.2345f) sink_f = s;
}

// down pattern: grid (512, 1) x 256; warp j = pair; block = features 4b..4b+3: 4 rows of 1536 B
// (6 KiB contiguous) of expert j's [2048, 768]; 3 steps of 4 loads; PDL wait like main
__global__ void __launch_bounds__(256, 4) read_dn(const char *w, int pdl) {
    const int lane = threadIdx.x & 31, j = threadIdx.x >> 5;
    const uint4 *d = (const uint4 *)(w + (size_t)j * 2048 * 1536 + (size_t)blockIdx.x * 4 * 1536);
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    float s = 0;
    for (int i = lane; i < 96; i += 32) {
        uint4 a = __ldg(d + i), b = __ldg(d + 96 + i), c = __ldg(d + 192 + i), e = __ldg(d + 288 + i);
        s += fold(a) + fold(b) + fold(c) + fold(e);
    }
    if (s == 1.2345f) sink_f = s;
}

__global__ void empty_k(int pdl) {
    if (pdl) { asm volatile("griddepcontrol.launch_dependents;"); asm volatile("griddepcontrol.wait;" ::: "memory"); }
}

static int nsm;
static char *W, *WD;   // gate/up weights (8 x 6 MiB... 50.3 MB), down weights (25.2 MB) right after
static void *flushbuf;
static const size_t GU = (size_t)8 * 1536 * 4096, DN = (size_t)8 * 2048 * 1536, FLUSH = (size_t)256 << 20;

static void launch_pdl(void (*k)(const char *, int), dim3 g, dim3 b, const char *w, cudaStream_t s) {
    cudaLaunchConfig_t c = {}; cudaLaunchAttribute a;
    c.gridDim = g, c.blockDim = b, c.stream = s;
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization; a.val.programmaticStreamSerializationAllowed = 1;
    c.attrs = &a, c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k, w, 1));
}
template <int UN> static void seq(size_t off, size_t bytes, int blocks_per_sm, cudaStream_t s) {
    read_seq<UN><<<nsm * blocks_per_sm, 256, 0, s>>>((const uint4 *)(W + off), bytes / 16);
}

typedef void (*body_fn)(cudaStream_t);
static void b_seq_gu(cudaStream_t s) { seq<4>(0, GU, 8, s); }
static void b_seq_gu_u1(cudaStream_t s) { seq<1>(0, GU, 8, s); }
static void b_seq_gu_3(cudaStream_t s) { seq<4>(0, GU, 3, s); }
static void b_seq_dn(cudaStream_t s) { seq<4>(GU, DN, 8, s); }
static void b_seq_all(cudaStream_t s) { seq<4>(0, GU + DN, 8, s); }
static void b_seq_two(cudaStream_t s) { seq<4>(0, GU, 8, s); seq<4>(GU, DN, 8, s); }
static void b_gu0(cudaStream_t s) { read_gu<0><<<dim3(48, 8), 256, 0, s>>>(W, 0); }
static void b_gu1(cudaStream_t s) { read_gu<1><<<dim3(48, 8), 256, 0, s>>>(W, 0); }
static void b_gu2(cudaStream_t s) { read_gu<2><<<dim3(48, 8), 256, 0, s>>>(W, 0); }
static void b_dn(cudaStream_t s) { read_dn<<<512, 256, 0, s>>>(WD, 0); }
static void b_pair(cudaStream_t s) { read_gu<0><<<dim3(48, 8), 256, 0, s>>>(W, 1); launch_pdl(read_dn, dim3(512), dim3(256), WD, s); }
static void b_pair_nopdl(cudaStream_t s) { read_gu<0><<<dim3(48, 8), 256, 0, s>>>(W, 0); read_dn<<<512, 256, 0, s>>>(WD, 0); }
static void b_empty2(cudaStream_t s) { empty_k<<<1, 32, 0, s>>>(1); cudaLaunchConfig_t c = {}; cudaLaunchAttribute a;
    c.gridDim = 1, c.blockDim = 32, c.stream = s; a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1; c.attrs = &a, c.numAttrs = 1; CK(cudaLaunchKernelEx(&c, empty_k, 1)); }

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *csv = argc > 1 ? argv[1] : "read_floor.csv";
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&W, GU + DN)); WD = W + GU;
    CK(cudaMemset(W, 1, GU + DN));
    CK(cudaMalloc(&flushbuf, FLUSH));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    struct V { const char *name; body_fn f; double bytes; } vs[] = {
        {"seq_50MB_8blk_un4", b_seq_gu, (double)GU}, {"seq_50MB_8blk_un1", b_seq_gu_u1, (double)GU},
        {"seq_50MB_3blk_un4", b_seq_gu_3, (double)GU}, {"seq_25MB_8blk_un4", b_seq_dn, (double)DN},
        {"seq_75MB_one_kernel", b_seq_all, (double)(GU + DN)}, {"seq_50MB_then_25MB", b_seq_two, (double)(GU + DN)},
        {"gu_pattern_main", b_gu0, (double)GU}, {"gu_pattern_unrolled", b_gu1, (double)GU},
        {"gu_pattern_contiguous", b_gu2, (double)GU}, {"dn_pattern_main", b_dn, (double)DN},
        {"gu_then_dn_pdl", b_pair, (double)(GU + DN)}, {"gu_then_dn_no_pdl", b_pair_nopdl, (double)(GU + DN)},
        {"two_empty_kernels_pdl", b_empty2, 0}};
    FILE *fo = fopen(csv, "w");
    fprintf(fo, "variant,graph,cache,bytes,median_us,min_us,tb_per_s\n");
    const int R = 41;
    for (int round = 0; round < 2; round++)
    for (const V &v : vs) for (int graph = 0; graph < 2; graph++) for (int warm = 0; warm < 2; warm++) {
        cudaGraphExec_t ge = nullptr;
        if (graph) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)); v.f(s); CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0)); CK(cudaGraphDestroy(g));
        }
        float t[R];
        int nt = 0;
        for (int r = 0; r < R + 3; r++) {
            if (!warm) CK(cudaMemsetAsync(flushbuf, r & 0xff, FLUSH, s));
            CK(cudaEventRecord(e0, s));
            if (graph) CK(cudaGraphLaunch(ge, s)); else v.f(s);
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 3) t[nt++] = ms * 1000.0f;
        }
        CK(cudaGetLastError());
        if (ge) CK(cudaGraphExecDestroy(ge));
        qsort(t, R, sizeof t[0], cmp_float);
        double med = t[R / 2];
        fprintf(fo, "%s,%d,%s,%.0f,%.2f,%.2f,%.3f\n", v.name, graph, warm ? "warm" : "flushed", v.bytes, med, t[0], v.bytes ? v.bytes / med / 1e6 : 0.0);
        printf("%-24s graph=%d %-7s %8.2f us  (min %.2f)  %.3f TB/s\n", v.name, graph, warm ? "warm" : "flushed", med, t[0], v.bytes ? v.bytes / med / 1e6 : 0.0);
    }
    fclose(fo);
    return 0;
}
