/*
 * test_cuda_jit.c — run-time compiled kernels on the GPU (src/gpu/jit.c, jit_load.cu): a kernel
 * compiled for the device's architecture, loaded and run against values computed here; the
 * second get from the cache; a cache entry that passes every check of the cache but holds an
 * image for another GPU (sm_80), which the device refuses, rebuilt and replaced; a kernel name
 * that is not in the image; a kernel with 100 KiB of dynamic shared memory; a launch captured
 * in a CUDA graph and replayed. Without a usable device: that a load fails with a status and a
 * message, holding nothing, before the skip.
 *
 *   test_cuda_jit [--quick] [--device N]     (exit 77: no usable GPU)
 * Exit status: 0 all passed, 1 a check failed, 77 no usable CUDA device (skip).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu/jit_load.h"
#include "gpu_harness.h"

#define EXIT_SKIP 77

static int g_gpu;
static char g_dir[256];

/* y = 2 x + 1, and a block-wide round trip through dynamic shared memory */
static const char *SRC =
    "extern \"C\" __global__ void jit_axpb(float *y, const float *x, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = 2.0f * x[i] + 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void jit_smem(int *out, int words) {\n"
    "    extern __shared__ int s[];\n"
    "    for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = i * 3 + (int)blockIdx.x;\n"
    "    __syncthreads();\n"
    "    long long sum = 0;\n"
    "    for (int i = threadIdx.x; i < words; i += blockDim.x) sum += s[words - 1 - i];\n"
    "    atomicAdd((unsigned long long *)out, (unsigned long long)sum);\n"
    "}\n";

static moex_jit_source source(int cc, int arch_specific) {
    moex_jit_source s;
    memset(&s, 0, sizeof s);
    s.name = "test_cuda_jit";
    s.text = SRC;
    s.cc = cc;
    s.arch_specific = arch_specific;
    return s;
}

/* Run jit_axpb over n inputs (optionally inside a graph) and check every output. */
static void check_axpb(const moex_jit_kernel *k, int n, int graph, const char *what) {
    float *hx = malloc(sizeof(float) * n), *hy = malloc(sizeof(float) * n), *x = NULL, *y = NULL;
    for (int i = 0; i < n; i++) hx[i] = (float)(i % 97) * 0.25f - 7.0f;
    CHECK(cudaMalloc((void **)&x, sizeof(float) * n) == cudaSuccess && cudaMalloc((void **)&y, sizeof(float) * n) == cudaSuccess,
          "%s: cudaMalloc", what);
    void *args[] = {&y, &x, &n};
    const unsigned grid[3] = {(unsigned)(n + 127) / 128, 1, 1}, block[3] = {128, 1, 1};
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    /* on s itself: a non-blocking stream is not ordered after the legacy stream's copies and sets
     * (with those, a busy GPU once ran the kernel before y's zeroing) */
    cudaMemcpyAsync(x, hx, sizeof(float) * n, cudaMemcpyHostToDevice, s);
    cudaMemsetAsync(y, 0, sizeof(float) * n, s);
    if (graph) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "%s: begin capture", what);
        CHECK(moex_jit_launch(k, grid, block, 0, s, args) == MOEX_OK, "%s: launch in capture: %s", what, moex_last_error());
        CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess,
              "%s: capture", what);
        for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(ge, s) == cudaSuccess, "%s: replay %d", what, r);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    } else {
        CHECK(moex_jit_launch(k, grid, block, 0, s, args) == MOEX_OK, "%s: launch: %s", what, moex_last_error());
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
    cudaMemcpy(hy, y, sizeof(float) * n, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += hy[i] != 2.0f * hx[i] + 1.0f;
    CHECK(bad == 0, "%s: %d of %d outputs wrong (y[0] = %g, want %g)", what, bad, n, hy[0], 2.0f * hx[0] + 1.0f);
    cudaStreamDestroy(s);
    cudaFree(x), cudaFree(y), free(hx), free(hy);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_jit", argc, argv, &g_quick, &g_gpu)) return 2;
    moex_device dev = {MOEX_DEVICE_CUDA, g_gpu};
    moex_device_info info;
    if (moex_device_query(dev, &info) != MOEX_OK || !info.available) {
        /* without a device the load must fail cleanly (a status and a message, nothing held) */
        char why[512];
        if (moex_jit_nvrtc_available(NULL, NULL, why, sizeof why)) {
            moex_jit_source s = source(90, 1);
            moex_jit_kernel k = {(void *)1, (void *)1};
            moex_jit_image got;
            const moex_status st = moex_jit_kernel_get(&s, "jit_axpb", "", &k, &got);
            if (st == MOEX_OK || k.library || k.kernel || !strstr(moex_last_error(), "test_cuda_jit")) {
                fprintf(stderr, "FAIL: a load without a device: status %d, \"%s\"\n", (int)st, moex_last_error());
                return 1;
            }
            printf("without a device, the load failed as it should: %s\n", moex_last_error());
        }
        printf("SKIP: cuda:%d is not usable: %s\n", g_gpu, info.reason);
        return EXIT_SKIP;
    }
    if (cudaSetDevice(g_gpu) != cudaSuccess) return 1;
    printf("test_cuda_jit: moex %s on %s\n", moex_version(), info.name);
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/moex-cuda-jit-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    const int cc = info.cc_major * 10 + info.cc_minor;
    moex_jit_source src = source(cc, info.cc_major == 9);
    moex_jit_kernel k, k2;
    moex_jit_image got;

    /* compiled, loaded, run; then from the cache */
    CHECK(moex_jit_kernel_get(&src, "jit_axpb", g_dir, &k, &got) == MOEX_OK, "first get: %s", moex_last_error());
    CHECK(!got.from_cache && got.path[0] && got.size > 0 && !got.data, "first get: from_cache %d, path \"%s\"",
          got.from_cache, got.path);
    printf("compiled %s in %.1f ms (%zu bytes)\n", got.path, got.compile_ms, got.size);
    check_axpb(&k, 1000, 0, "compiled");
    CHECK(moex_jit_kernel_get(&src, "jit_axpb", g_dir, &k2, &got) == MOEX_OK, "second get: %s", moex_last_error());
    CHECK(got.from_cache, "second get: not from the cache (%s)", got.note);
    check_axpb(&k2, 4099, 1, "cached, in a graph");
    moex_jit_kernel_release(&k2);
    CHECK(!k2.library && !k2.kernel, "release left handles");

    /* an entry that passes the cache's checks but holds an sm_80 image: refused by the device, rebuilt */
    moex_jit_source old = source(80, 0);
    moex_jit_image img80, own;
    CHECK(moex_jit_build(&old, "", &img80) == MOEX_OK, "sm_80 image: %s", moex_last_error());
    FILE *f = fopen(got.path, "rb");
    unsigned char head[32 + 4096];
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    uint32_t key_len = 0;
    memcpy(&key_len, head + 8, 4);
    CHECK(n > 32 && key_len < 4096 && 32 + key_len <= n, "reading the entry %s", got.path);
    if (n > 32 && key_len < 4096 && 32 + key_len <= n) {
        uint64_t size = img80.size, h = moex_fnv64(MOEX_FNV64_START, img80.data, img80.size);
        memcpy(head + 16, &size, 8), memcpy(head + 24, &h, 8);
        f = fopen(got.path, "wb");
        fwrite(head, 1, 32 + key_len, f), fwrite(img80.data, 1, img80.size, f), fclose(f);
        CHECK(moex_jit_build(&src, g_dir, &own) == MOEX_OK && own.from_cache, "the forged entry should pass the cache's checks");
        moex_jit_image_free(&own);
        CHECK(moex_jit_kernel_get(&src, "jit_axpb", g_dir, &k2, &got) == MOEX_OK, "get over an sm_80 entry: %s",
              moex_last_error());
        CHECK(!got.from_cache && strstr(got.note, "rebuilt"), "sm_80 entry: from_cache %d, note \"%s\"", got.from_cache,
              got.note);
        check_axpb(&k2, 257, 0, "rebuilt");
        moex_jit_kernel_release(&k2);
        CHECK(moex_jit_kernel_get(&src, "jit_axpb", g_dir, &k2, &got) == MOEX_OK && got.from_cache,
              "after the rebuild: not from the cache (%s)", got.note);
        moex_jit_kernel_release(&k2);
    }
    moex_jit_image_free(&img80);

    /* a name the image does not have */
    CHECK(moex_jit_kernel_get(&src, "no_such_kernel", g_dir, &k2, NULL) != MOEX_OK && strstr(moex_last_error(), "no_such_kernel") &&
              strstr(moex_last_error(), "test_cuda_jit") && !k2.library,
          "missing kernel: %s", moex_last_error());

    /* 100 KiB of dynamic shared memory */
    CHECK(moex_jit_kernel_get(&src, "jit_smem", g_dir, &k2, NULL) == MOEX_OK, "jit_smem: %s", moex_last_error());
    const int words = 25600, blocks = 3;
    CHECK(moex_jit_kernel_smem(&k2, words * 4) == MOEX_OK, "smem attribute: %s", moex_last_error());
    unsigned long long *out = NULL, got_sum = 0;
    cudaMalloc((void **)&out, 8);
    cudaMemset(out, 0, 8);
    void *args[] = {&out, (void *)&words};
    const unsigned grid[3] = {blocks, 1, 1}, block[3] = {256, 1, 1};
    CHECK(moex_jit_launch(&k2, grid, block, (size_t)words * 4, NULL, args) == MOEX_OK, "smem launch: %s", moex_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "smem: %s", cudaGetErrorString(cudaGetLastError()));
    cudaMemcpy(&got_sum, out, 8, cudaMemcpyDeviceToHost);
    unsigned long long want = 0;
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < words; i++) want += (unsigned long long)(i * 3 + b);
    CHECK(got_sum == want, "smem: sum %llu, want %llu", got_sum, want);
    cudaFree(out);
    moex_jit_kernel_release(&k2);
    moex_jit_kernel_release(&k);
    nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    printf("test_cuda_jit: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
