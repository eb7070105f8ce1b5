/*
 * test_cuda_ep.c — expert parallelism's building blocks on the GPU (src/backends/cuda/ep_plan.cu)
 * against the host plan they reproduce (src/backends/ep_exchange.c): for groups of 1 to 8 ranks,
 * T from 0 to past one chunk of pairs (1024), top_k 1 to 8, int32 and int64 ids with a row stride
 * past k, sentinels (-1 and E): each rank's row count, each pair's row (the host row moved into its
 * rank's block of cap rows), each row's local expert and the sentinel past the count; bad ids
 * flagged and their pairs left out; refused arguments launch nothing. Then the copy of blocks
 * whose row counts only the device holds: the rows below each count copied, nothing past them
 * touched, 16-byte and byte paths; and one exchange of two ranks on this GPU (the loopback of the
 * issue), each rank's rows landing in block `source` of the other's receive buffer with their
 * local experts.
 *
 *   test_cuda_ep [--quick] [--device N]     (exit 77: no usable GPU)
 * Exit status: 0 all passed, 1 a check failed, 77 no usable CUDA device (skip).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/ep_plan.h"
#include "backends/ep_exchange.h"
#include "core/gpu_runtime.h"
#include "gpu_harness.h"

#define EXIT_SKIP 77

static int g_gpu;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* One plan: ids [T, k] (row stride ld) with about `sent` sentinels in 100 and `bad` ids outside
 * [-1, E] (a bad id's pair is a sentinel to the host reference), on the device as int64 or int32. */
static void plan_case(int R, int64_t E, int64_t T, int64_t k, int64_t ld, int ids64, int sent, int bad) {
    char what[160];
    snprintf(what, sizeof what, "R %d, E %lld, T %lld, k %lld, ld %lld, %s ids, %d%% sentinels, %d bad", R,
             (long long)E, (long long)T, (long long)k, (long long)ld, ids64 ? "int64" : "int32", sent, bad);
    const int64_t P = T * k, cap = P > 0 ? P + 3 : 1, per = E / R; /* cap past P: rows no pair reaches */
    int32_t *ids = calloc((size_t)(T * ld + 1), 4), *ref_ids = calloc((size_t)(T * ld + 1), 4);
    int64_t *ids_l = calloc((size_t)(T * ld + 1), 8);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ld; j++) {
            int32_t e = (int32_t)(rnd() % (uint32_t)E);
            if ((int)(rnd() % 100) < sent) e = rnd() % 2 ? -1 : (int32_t)E;
            ids[t * ld + j] = e;
        }
    for (int i = 0; i < bad && P > 0; i++) ids[(int64_t)(rnd() % (uint32_t)T) * ld + rnd() % (uint32_t)k] = i % 2 ? -7 : (int32_t)E + 3;
    for (int64_t i = 0; i < T * ld; i++) {
        ids_l[i] = ids[i];
        ref_ids[i] = ids[i] < -1 || ids[i] > E ? -1 : ids[i]; /* the device treats a bad id as a sentinel */
    }
    int64_t *count = calloc((size_t)R, 8), *offset = calloc((size_t)R + 1, 8);
    int32_t *pair = calloc((size_t)P + 1, 4), *local = calloc((size_t)P + 1, 4), *row_of = calloc((size_t)P + 1, 4);
    CHECK(moex_ep_dispatch_plan(ref_ids, T, k, ld, E, R, count, offset, pair, local, row_of) == MOEX_OK, "%s: host plan: %s",
          what, moex_last_error());

    void *d_ids = NULL, *d_ws = NULL;
    int *d_flags = NULL;
    const size_t bytes = moex_ep_dev_plan_bytes(R, P, cap);
    CHECK(cudaMalloc(&d_ids, (size_t)(T * ld + 1) * 8) == cudaSuccess && cudaMalloc(&d_ws, bytes) == cudaSuccess &&
              cudaMalloc((void **)&d_flags, 4) == cudaSuccess,
          "%s: cudaMalloc", what);
    cudaMemcpy(d_ids, ids64 ? (const void *)ids_l : (const void *)ids, (size_t)(T * ld) * (ids64 ? 8 : 4),
               cudaMemcpyHostToDevice);
    cudaMemset(d_ws, 0x5a, bytes); /* every array is written whole by the launch: no zeroing */
    cudaMemset(d_flags, 0, 4);
    const moex_ep_dev_plan plan = moex_ep_dev_plan_carve(d_ws, R, P, cap);
    CHECK(moex_ep_dev_plan_build(d_ids, ids64, ld, T, k, E, R, cap, &plan, d_flags, NULL) == MOEX_OK, "%s: build: %s",
          what, moex_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
    int32_t *g_count = calloc((size_t)R, 4), *g_row_of = calloc((size_t)P + 1, 4), *g_local = calloc((size_t)(R * cap), 4);
    int flags = 0;
    cudaMemcpy(g_count, plan.count, (size_t)R * 4, cudaMemcpyDeviceToHost);
    if (P) cudaMemcpy(g_row_of, plan.row_of, (size_t)P * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(g_local, plan.local, (size_t)(R * cap) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&flags, d_flags, 4, cudaMemcpyDeviceToHost);
    CHECK(!!(flags & MOEX_CUDA_FLAG_BAD_ID) == (bad > 0 && P > 0), "%s: bad-id flag %d", what, flags);
    int wrong = 0;
    for (int r = 0; r < R; r++) {
        if (g_count[r] != count[r] && wrong++ < 3) fail_at(__FILE__, __LINE__, "%s: count[%d] %d, want %lld", what, r, g_count[r], (long long)count[r]);
        for (int64_t i = 0; i < cap; i++) {
            const int32_t want = i < count[r] ? local[offset[r] + i] : (int32_t)per;
            if (g_local[r * cap + i] != want && wrong++ < 3)
                fail_at(__FILE__, __LINE__, "%s: local[%d cap + %lld] %d, want %d", what, r, (long long)i, g_local[r * cap + i], want);
        }
    }
    for (int64_t p = 0; p < P; p++) {
        int32_t want = -1;
        if (row_of[p] >= 0) {
            const int64_t r = ref_ids[(p / k) * ld + p % k] / per;
            want = (int32_t)(row_of[p] - offset[r] + r * cap);
        }
        if (g_row_of[p] != want && wrong++ < 3)
            fail_at(__FILE__, __LINE__, "%s: row_of[%lld] %d, want %d", what, (long long)p, g_row_of[p], want);
    }
    CHECK(wrong == 0, "%s: %d values wrong", what, wrong);
    cudaFree(d_ids), cudaFree(d_ws), cudaFree(d_flags);
    free(ids), free(ref_ids), free(ids_l), free(count), free(offset), free(pair), free(local), free(row_of);
    free(g_count), free(g_row_of), free(g_local);
}

static void test_plans(void) {
    static const struct { int R; int64_t E, T, k, ld; int ids64, sent, bad; } C[] = {
        {1, 8, 5, 2, 2, 0, 0, 0},      {2, 16, 1, 4, 4, 1, 0, 0},      {2, 16, 0, 4, 4, 0, 0, 0},
        {3, 12, 37, 3, 5, 0, 10, 0},   {4, 128, 300, 8, 8, 1, 5, 0},   {8, 256, 200, 8, 9, 0, 3, 0},
        {2, 6, 700, 2, 2, 1, 20, 0},   {5, 10, 1, 1, 1, 0, 0, 0},      {4, 64, 129, 8, 8, 0, 0, 2},
        {3, 9, 1500, 1, 3, 1, 2, 1},   {8, 64, 2048, 4, 4, 0, 1, 0},
    };
    for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) {
        if (g_quick && i % 2) continue;
        plan_case(C[i].R, C[i].E, C[i].T, C[i].k, C[i].ld, C[i].ids64, C[i].sent, C[i].bad);
    }
    /* refusals: nothing launched, a message naming the values */
    moex_ep_dev_plan none = {0};
    int *d_flags = NULL;
    cudaMalloc((void **)&d_flags, 4);
    CHECK(moex_ep_dev_plan_build(d_flags, 0, 4, 1, 4, 10, 4, 8, &none, d_flags, NULL) == MOEX_ERR_INVALID_ARGUMENT &&
              strstr(moex_last_error(), "10 experts"),
          "E not a multiple of R: %s", moex_last_error());
    CHECK(moex_ep_dev_plan_build(d_flags, 0, 4, 3, 4, 8, 2, 11, &none, d_flags, NULL) == MOEX_ERR_INVALID_ARGUMENT &&
              strstr(moex_last_error(), "11 rows"),
          "cap below T k: %s", moex_last_error());
    CHECK(moex_ep_dev_plan_build(d_flags, 0, 2, 3, 4, 8, 2, 12, &none, d_flags, NULL) == MOEX_ERR_INVALID_ARGUMENT,
          "ld below k: %s", moex_last_error());
    cudaFree(d_flags);
}

/* blocks of up to max_rows rows of row_bytes bytes at strides (bytes) src_stride / dst_stride,
 * offset by `skew` bytes from 16-byte alignment (0: the 16-byte path) */
static void copy_case(int blocks, int64_t max_rows, int64_t row_bytes, int64_t src_stride, int64_t dst_stride, int skew) {
    char what[128];
    snprintf(what, sizeof what, "%d blocks of up to %lld rows of %lld bytes, skew %d", blocks, (long long)max_rows,
             (long long)row_bytes, skew);
    const size_t sb = (size_t)(blocks * src_stride) + 64, db = (size_t)(blocks * dst_stride) + 64;
    unsigned char *hs = malloc(sb), *hd = malloc(db), *want = malloc(db);
    int32_t *rows = malloc((size_t)blocks * 4);
    for (size_t i = 0; i < sb; i++) hs[i] = (unsigned char)rnd();
    for (size_t i = 0; i < db; i++) want[i] = 0xc3;
    for (int b = 0; b < blocks; b++) {
        rows[b] = b == 0 ? 0 : b == 1 ? (int32_t)max_rows + 5 : (int32_t)(rnd() % (uint32_t)(max_rows + 1));
        const int64_t n = rows[b] > max_rows ? max_rows : rows[b];
        for (int64_t i = 0; i < n; i++)
            memcpy(want + skew + b * dst_stride + i * row_bytes, hs + skew + b * src_stride + i * row_bytes, (size_t)row_bytes);
    }
    unsigned char *ds = NULL, *dd = NULL;
    int32_t *drows = NULL;
    CHECK(cudaMalloc((void **)&ds, sb) == cudaSuccess && cudaMalloc((void **)&dd, db) == cudaSuccess &&
              cudaMalloc((void **)&drows, (size_t)blocks * 4) == cudaSuccess,
          "%s: cudaMalloc", what);
    cudaMemcpy(ds, hs, sb, cudaMemcpyHostToDevice);
    cudaMemset(dd, 0xc3, db);
    cudaMemcpy(drows, rows, (size_t)blocks * 4, cudaMemcpyHostToDevice);
    CHECK(moex_ep_dev_copy_blocks(drows, blocks, max_rows, ds + skew, src_stride, dd + skew, dst_stride, row_bytes,
                                  NULL) == MOEX_OK,
          "%s: %s", what, moex_last_error());
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
    cudaMemcpy(hd, dd, db, cudaMemcpyDeviceToHost);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < db; i++)
        if (hd[i] != want[i] && !bad++) first = i;
    CHECK(bad == 0, "%s: %zu bytes wrong, the first at %zu", what, bad, first);
    cudaFree(ds), cudaFree(dd), cudaFree(drows);
    free(hs), free(hd), free(want), free(rows);
}

static void test_copies(void) {
    copy_case(4, 37, 7168 * 2, 37 * 7168 * 2, 40 * 7168 * 2, 0);
    copy_case(3, 300, 512, 300 * 512 + 16, 300 * 512, 0);
    copy_case(5, 20, 258, 20 * 258, 21 * 258, 3);
    copy_case(2, 2000, 64, 2000 * 64, 2000 * 64, 0);
    CHECK(moex_ep_dev_copy_blocks(NULL, 2, 4, NULL, 0, NULL, 0, 16, NULL) == MOEX_ERR_INVALID_ARGUMENT,
          "a copy without buffers: %s", moex_last_error());
    CHECK(moex_ep_dev_copy_blocks(NULL, 0, 4, NULL, 0, NULL, 0, 16, NULL) == MOEX_OK, "no blocks: nothing to do");
}

/* Two ranks on this GPU: each plans its own tokens' ids, packs rank r's rows (here their token
 * index as a 16-byte row, so where each lands can be read back) into block r of its send buffer,
 * and the exchange copies block `dest` of each sender's buffers into block `source` of the
 * receiver's, the rows by the sender's device counts and the local experts whole. The receiver
 * then holds, in block s, rank s's rows for it in pair order, each with its local expert. */
static void test_loopback_exchange(void) {
    enum { R = 2, E = 8, T = 50, K = 4 };
    const int64_t P = T * K, cap = P, per = E / R;
    int32_t ids[R][T * K];
    for (int s = 0; s < R; s++)
        for (int i = 0; i < T * K; i++) ids[s][i] = (int32_t)(rnd() % (E + 1)) - (rnd() % 9 == 0); /* some -1 and E */
    void *d_ids[R], *d_ws[R];
    int32_t *d_send[R], *d_recv[R], *d_recv_local[R];
    int *d_flags = NULL;
    moex_ep_dev_plan plan[R];
    cudaMalloc((void **)&d_flags, 4);
    cudaMemset(d_flags, 0, 4);
    for (int s = 0; s < R; s++) {
        cudaMalloc(&d_ids[s], sizeof ids[s]);
        cudaMemcpy(d_ids[s], ids[s], sizeof ids[s], cudaMemcpyHostToDevice);
        cudaMalloc(&d_ws[s], moex_ep_dev_plan_bytes(R, P, cap));
        cudaMalloc((void **)&d_send[s], (size_t)(R * cap) * 16);
        cudaMalloc((void **)&d_recv[s], (size_t)(R * cap) * 16);
        cudaMalloc((void **)&d_recv_local[s], (size_t)(R * cap) * 4);
        cudaMemset(d_recv[s], 0xff, (size_t)(R * cap) * 16);
        plan[s] = moex_ep_dev_plan_carve(d_ws[s], R, P, cap);
        CHECK(moex_ep_dev_plan_build(d_ids[s], 0, K, T, K, E, R, cap, &plan[s], d_flags, NULL) == MOEX_OK, "plan %d: %s",
              s, moex_last_error());
    }
    /* pack: the row of pair p holds (token, j, source, 0); done here on the host from the plan */
    int32_t row_of[R][T * K];
    for (int s = 0; s < R; s++) {
        cudaMemcpy(row_of[s], plan[s].row_of, sizeof row_of[s], cudaMemcpyDeviceToHost);
        int32_t *rows = calloc((size_t)(R * cap) * 4, 4);
        for (int p = 0; p < P; p++)
            if (row_of[s][p] >= 0) {
                int32_t *q = rows + (int64_t)row_of[s][p] * 4;
                q[0] = p / K, q[1] = p % K, q[2] = s, q[3] = 0;
            }
        cudaMemcpy(d_send[s], rows, (size_t)(R * cap) * 16, cudaMemcpyHostToDevice);
        free(rows);
    }
    /* the exchange: for each receiver q and source s, the rows block q of s's send buffer holds */
    for (int q = 0; q < R; q++)
        for (int s = 0; s < R; s++) {
            CHECK(moex_ep_dev_copy_blocks(plan[s].count + q, 1, cap, d_send[s] + (int64_t)q * cap * 4, 0,
                                          d_recv[q] + (int64_t)s * cap * 4, 0, 16, NULL) == MOEX_OK,
                  "copy %d -> %d: %s", s, q, moex_last_error());
            cudaMemcpyAsync(d_recv_local[q] + (int64_t)s * cap, plan[s].local + (int64_t)q * cap, (size_t)cap * 4,
                            cudaMemcpyDeviceToDevice, NULL);
        }
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "loopback: %s", cudaGetErrorString(cudaGetLastError()));
    for (int q = 0; q < R; q++) {
        int32_t *got = malloc((size_t)(R * cap) * 16), *got_local = malloc((size_t)(R * cap) * 4);
        cudaMemcpy(got, d_recv[q], (size_t)(R * cap) * 16, cudaMemcpyDeviceToHost);
        cudaMemcpy(got_local, d_recv_local[q], (size_t)(R * cap) * 4, cudaMemcpyDeviceToHost);
        int wrong = 0;
        for (int s = 0; s < R; s++) {
            int64_t i = 0;
            for (int p = 0; p < P; p++) { /* rank s's pairs for q, in order */
                const int32_t e = ids[s][p];
                if (e < 0 || e >= E || e / per != q) continue;
                const int32_t *row = got + ((int64_t)s * cap + i) * 4;
                if ((row[0] != p / K || row[1] != p % K || row[2] != s || got_local[s * cap + i] != e - q * per) && wrong++ < 3)
                    fail_at(__FILE__, __LINE__, "loopback: rank %d's row %lld from %d holds (%d, %d, %d) expert %d, want "
                            "(%d, %d, %d) expert %d", q, (long long)i, s, row[0], row[1], row[2], got_local[s * cap + i],
                            p / K, p % K, s, (int)(e - q * per));
                i++;
            }
            for (; i < cap; i++) /* past the count: untouched rows, sentinel experts */
                if ((got[((int64_t)s * cap + i) * 4] != -1 || got_local[s * cap + i] != per) && wrong++ < 3)
                    fail_at(__FILE__, __LINE__, "loopback: rank %d's row %lld from %d past the count was written", q,
                            (long long)i, s);
        }
        CHECK(wrong == 0, "loopback: rank %d: %d rows wrong", q, wrong);
        free(got), free(got_local);
    }
    for (int s = 0; s < R; s++) cudaFree(d_ids[s]), cudaFree(d_ws[s]), cudaFree(d_send[s]), cudaFree(d_recv[s]), cudaFree(d_recv_local[s]);
    cudaFree(d_flags);
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_ep", argc, argv, &g_quick, &g_gpu)) return 2;
    moex_device dev = {MOEX_DEVICE_CUDA, g_gpu};
    moex_device_info info;
    if (moex_device_query(dev, &info) != MOEX_OK || !info.available) {
        printf("SKIP: cuda:%d is not usable: %s\n", g_gpu, info.reason);
        return EXIT_SKIP;
    }
    cudaSetDevice(g_gpu);
    test_plans();
    test_copies();
    test_loopback_exchange();
    printf("test_cuda_ep: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
