/* bench_quant.c — quantized weights for `moex bench --dtype fp8|fp8-ue8m0|fp4`:
 * the synthetic bf16 weights quantized with moex_quantize, expert by expert
 * in parallel. */
#include "bench_quant.h"
#include <stdio.h>
#include <stdlib.h>

int bench_quantize(const void *w, moex_dtype dt, int64_t E, int64_t N, int64_t K, moex_quant_format format,
                   int threads, void **codes, void **scales, moex_tensor *q, moex_tensor *scale) {
    const int fp4 = format == MOEX_QUANT_FP4;
    const int64_t bn = fp4 ? 1 : 128, bk = fp4 ? 32 : 128;
    const int64_t qk = fp4 ? K / 2 : K, sn = (N + bn - 1) / bn, sk = (K + bk - 1) / bk;
    const moex_dtype sdt = format == MOEX_QUANT_FP8 ? MOEX_F32 : MOEX_UE8M0;
    const size_t ssz = moex_dtype_size(sdt), wsz = moex_dtype_size(dt);
    *codes = malloc((size_t)(E * N * qk));
    *scales = malloc((size_t)(E * sn * sk) * ssz);
    if (!*codes || !*scales) {
        fprintf(stderr, "moex bench: out of memory for the quantized weights\n");
        return 1;
    }
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(| : failed)
    for (int64_t e = 0; e < E; e++) {
        int64_t ws[2] = {N, K}, qs[2] = {N, qk}, ss[2] = {sn, sk};
        moex_tensor tw, tq, ts;
        moex_status st = moex_tensor_init(&tw, (char *)w + (size_t)(e * N * K) * wsz, dt, 2, ws);
        if (!st) st = moex_tensor_init(&tq, (char *)*codes + e * N * qk, fp4 ? MOEX_E2M1X2 : MOEX_E4M3, 2, qs);
        if (!st) st = moex_tensor_init(&ts, (char *)*scales + (size_t)(e * sn * sk) * ssz, sdt, 2, ss);
        if (!st) st = moex_quantize(&tw, format, bn, bk, &tq, &ts);
        if (st) failed = 1;
    }
    int64_t qs[3] = {E, N, qk}, ss[3] = {E, sn, sk};
    if (failed || moex_tensor_init(q, *codes, fp4 ? MOEX_E2M1X2 : MOEX_E4M3, 3, qs) ||
        moex_tensor_init(scale, *scales, sdt, 3, ss)) {
        fprintf(stderr, "moex bench: quantizing the weights failed: %s\n", moex_last_error());
        return 1;
    }
    return 0;
}
