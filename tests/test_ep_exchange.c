/*
 * test_ep_exchange.c — expert parallelism's dispatch and combine on the host
 * (src/backends/ep_exchange.c), the reference the GPU's exchange is to reproduce:
 *   - the plan, pair by pair: random ids with sentinels (-1 and E) over odd sizes, group sizes
 *     1 to 8, a strided id matrix, T = 0: every expert pair sent once, to its owner, with its
 *     local index, in pair order within a destination, row_of its inverse, sentinels nowhere;
 *   - refusals with nothing written: E not divisible by the group size, a group of 0, an id
 *     outside [-1, E];
 *   - a group of R ranks in one process (a loopback exchange): each rank's tokens dispatched,
 *     every rank's received rows run through moex's CPU grouped_mm on its share of the experts
 *     (one expert a row, weight 1), the rows sent back and combined; against the float64
 *     reference of each rank's tokens on the whole layer and against grouped_mm's own forward
 *     of them (f32, NMSE <= 1e-10), ranks with no tokens and ranks that receive nothing included.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "backends/ep_exchange.h"
#include "moex.h"
#include "reference.h"
#include "testutil.h"

/* ids [T, ld], k used per row: experts, sentinels -1 and E, 999 past k (never read) */
static int32_t *make_ids(ref_rng *rng, int64_t T, int64_t k, int64_t ld, int64_t E) {
    int32_t *ids = malloc(sizeof *ids * (size_t)(T * ld + 1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ld; j++) {
            const double u = ref_rng_uniform(rng);
            ids[t * ld + j] = j >= k ? 999 : u < 0.1 ? -1 : u < 0.2 ? (int32_t)E : (int32_t)(ref_rng_uniform(rng) * (double)E) % (int32_t)E;
        }
    return ids;
}

static void check_plan(const int32_t *ids, int64_t T, int64_t k, int64_t ld, int64_t E, int R, const char *what) {
    const int64_t P = T * k, per = E / R;
    int64_t *count = malloc(sizeof *count * (size_t)R), *offset = malloc(sizeof *offset * (size_t)(R + 1));
    int32_t *pair = malloc(sizeof *pair * (size_t)(P + 1)), *local = malloc(sizeof *local * (size_t)(P + 1));
    int32_t *row_of = malloc(sizeof *row_of * (size_t)(P + 1));
    moex_status st = moex_ep_dispatch_plan(ids, T, k, ld, E, R, count, offset, pair, local, row_of);
    if (st != MOEX_OK) {
        PROBLEM("%s: plan failed: %s", what, moex_last_error());
    } else {
        int64_t experts = 0;
        for (int64_t p = 0; p < P; p++) {
            const int32_t e = ids[(p / k) * ld + p % k], i = row_of[p];
            if (e < 0 || e >= E) {
                if (i != -1) PROBLEM("%s: sentinel pair %lld has row %d", what, (long long)p, i);
                continue;
            }
            experts++;
            const int r = (int)(e / per);
            if (i < offset[r] || i >= offset[r + 1]) PROBLEM("%s: pair %lld (expert %d) at row %d, not in rank %d's rows", what, (long long)p, e, i, r);
            else if (pair[i] != p || local[i] != e - r * per) PROBLEM("%s: row %d holds pair %d local %d, want %lld local %lld", what, i, pair[i], local[i], (long long)p, (long long)(e - r * per));
        }
        if (offset[0] != 0 || offset[R] != experts) PROBLEM("%s: offsets 0 .. %lld, want %lld rows", what, (long long)offset[R], (long long)experts);
        for (int r = 0; r < R; r++) {
            if (count[r] != offset[r + 1] - offset[r]) PROBLEM("%s: rank %d count %lld, offsets %lld", what, r, (long long)count[r], (long long)(offset[r + 1] - offset[r]));
            for (int64_t i = offset[r] + 1; i < offset[r + 1]; i++)
                if (pair[i] <= pair[i - 1]) PROBLEM("%s: rank %d rows out of pair order at %lld", what, r, (long long)i);
        }
    }
    free(count);
    free(offset);
    free(pair);
    free(local);
    free(row_of);
}

static void test_plan(void **state) {
    (void)state;
    static const int64_t SIZES[][4] = {{37, 3, 3, 24}, {1, 8, 8, 24}, {300, 4, 6, 24}, {0, 2, 2, 24}, {129, 1, 1, 24}};
    static const int RANKS[] = {1, 2, 3, 4, 8, 24};
    ref_rng rng;
    ref_rng_seed(&rng, 424242);
    for (int s = 0; s < 5; s++)
        for (int r = 0; r < 6; r++) {
            const int64_t T = SIZES[s][0], k = SIZES[s][1], ld = SIZES[s][2], E = SIZES[s][3];
            int32_t *ids = make_ids(&rng, T, k, ld, E);
            char what[96];
            snprintf(what, sizeof what, "T=%lld k=%lld ld=%lld E=%lld ranks=%d", (long long)T, (long long)k, (long long)ld,
                     (long long)E, RANKS[r]);
            check_plan(ids, T, k, ld, E, RANKS[r], what);
            free(ids);
        }
    end_problems();
}

static void test_refusals(void **state) {
    (void)state;
    int32_t ids[6] = {0, 3, -1, 9, 10, 2};
    int64_t count[4], offset[5];
    int32_t pair[6], local[6], row_of[6];
    memset(pair, 0x5A, sizeof pair);
    moex_status st = moex_ep_dispatch_plan(ids, 3, 2, 2, 10, 4, count, offset, pair, local, row_of);
    assert_int_equal(st, MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "10 experts") && contains(moex_last_error(), "4 ranks"));
    st = moex_ep_dispatch_plan(ids, 3, 2, 2, 10, 0, count, offset, pair, local, row_of);
    assert_int_equal(st, MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "group size"));
    ids[3] = 11; /* outside [-1, 10] */
    st = moex_ep_dispatch_plan(ids, 3, 2, 2, 10, 5, count, offset, pair, local, row_of);
    assert_int_equal(st, MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "ids[1][1] = 11"));
    for (int i = 0; i < 6; i++) assert_int_equal(pair[i], 0x5A5A5A5A);
    assert_int_equal(moex_ep_check(10, 5), MOEX_OK);
}

/* grouped_mm on the CPU: out [T, H] (f32) of x [T, H] with ids and weights [T, k] */
static void forward(const moex_experts_desc *d, const float *x, const int32_t *ids, const float *w, int64_t T, int64_t k,
                    float *out) {
    moex_layer *layer = NULL;
    moex_context *ctx = NULL;
    moex_context_options o = moex_context_default_options();
    o.max_tokens = T;
    assert_int_equal(moex_layer_create(d, &layer), MOEX_OK);
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_int_equal(moex_prepare(ctx, layer, "grouped_mm"), MOEX_OK);
    moex_tensor tx = ref_tensor_2d((void *)x, MOEX_F32, T, d->hidden, d->hidden);
    moex_tensor ti = ref_tensor_2d((void *)ids, MOEX_I32, T, k, k), tw = ref_tensor_2d((void *)w, MOEX_F32, T, k, k);
    moex_tensor to = ref_tensor_2d(out, MOEX_F32, T, d->hidden, d->hidden);
    moex_status st = moex_experts_forward(ctx, layer, "grouped_mm", &tx, &ti, &tw, &to);
    if (st != MOEX_OK) fail_msg("grouped_mm: %s", moex_last_error());
    moex_context_free(ctx);
    moex_layer_free(layer);
}

static void test_loopback_group(void **state) {
    (void)state;
    enum { E = 12, H = 40, I = 24, K = 3, MAXR = 4 };
    static const int64_t TOKENS[MAXR] = {7, 0, 13, 5};
    ref_layer L;
    const ref_layer_spec spec = {E, H, I, K, 1, 0, 0, 1, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer_build(&L, &spec, 77);
    for (int R = 1; R <= MAXR; R++) {
        if (E % R) continue;
        const int64_t per = E / R;
        ref_rng rng;
        ref_rng_seed(&rng, 1000u + (uint64_t)R);
        float *x[MAXR], *w[MAXR], *y[MAXR];
        int32_t *ids[MAXR], *pair[MAXR], *local[MAXR], *row_of[MAXR];
        int64_t count[MAXR][MAXR], offset[MAXR][MAXR + 1];
        for (int s = 0; s < R; s++) { /* rank s's tokens and its plan */
            const int64_t T = TOKENS[s], P = T * K;
            x[s] = calloc((size_t)(T * H + 1), sizeof(float));
            w[s] = calloc((size_t)(P + 1), sizeof(float));
            ids[s] = calloc((size_t)(P + 1), sizeof(int32_t));
            pair[s] = calloc((size_t)(P + 1), sizeof(int32_t));
            local[s] = calloc((size_t)(P + 1), sizeof(int32_t));
            row_of[s] = calloc((size_t)(P + 1), sizeof(int32_t));
            y[s] = calloc((size_t)(P * H + 1), sizeof(float));
            ref_fill_random(x[s], MOEX_F32, T * H, 1.0, &rng);
            ref_random_routing(&rng, T, E, K, MOEX_I32, ids[s], MOEX_F32, w[s], 0.1);
            assert_int_equal(moex_ep_dispatch_plan(ids[s], T, K, K, E, R, count[s], offset[s], pair[s], local[s], row_of[s]),
                             MOEX_OK);
        }
        for (int d = 0; d < R; d++) { /* rank d: every source's rows for it, in source order */
            int64_t n = 0;
            for (int s = 0; s < R; s++) n += count[s][d];
            if (!n) continue;
            float *in = calloc((size_t)(n * H), sizeof(float)), *res = calloc((size_t)(n * H), sizeof(float));
            float *ones = calloc((size_t)n, sizeof(float));
            int32_t *lid = calloc((size_t)n, sizeof(int32_t));
            int64_t at = 0;
            for (int s = 0; s < R; s++) {
                const int64_t o = offset[s][d], c = count[s][d];
                moex_ep_gather_rows(x[s], H, H, K, pair[s] + o, c, in + at * H);
                memcpy(lid + at, local[s] + o, (size_t)c * sizeof *lid);
                at += c;
            }
            for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
            moex_experts_desc share = ref_layer_share(&L.desc, d * per, per);
            share.top_k = 1; /* one expert a row: a received row is one pair */
            forward(&share, in, lid, ones, n, 1, res);
            at = 0;
            for (int s = 0; s < R; s++) { /* each block back to its source, where its rows went from */
                memcpy(y[s] + offset[s][d] * H, res + at * H, (size_t)(count[s][d] * H) * sizeof(float));
                at += count[s][d];
            }
            free(in);
            free(res);
            free(ones);
            free(lid);
        }
        for (int s = 0; s < R; s++) { /* the combine on each rank, against the whole layer */
            const int64_t T = TOKENS[s];
            float *out = calloc((size_t)(T * H + 1), sizeof(float)), *one = calloc((size_t)(T * H + 1), sizeof(float));
            double *ref = calloc((size_t)(T * H + 1), sizeof(double));
            moex_ep_combine(y[s], H, row_of[s], w[s], T, K, out, H);
            if (T) {
                moex_tensor tx = ref_tensor_2d(x[s], MOEX_F32, T, H, H), ti = ref_tensor_2d(ids[s], MOEX_I32, T, K, K);
                moex_tensor tw = ref_tensor_2d(w[s], MOEX_F32, T, K, K);
                ref_experts_forward(&L.desc, &tx, &ti, &tw, ref);
                forward(&L.desc, x[s], ids[s], w[s], T, K, one);
                double *mine = calloc((size_t)(T * H), sizeof(double));
                for (int64_t i = 0; i < T * H; i++) mine[i] = one[i];
                const double e_ref = ref_nmse(out, MOEX_F32, T, H, H, ref), e_one = ref_nmse(out, MOEX_F32, T, H, H, mine);
                if (!(e_ref <= 1e-10)) PROBLEM("R=%d rank %d: NMSE against the float64 reference %.3g", R, s, e_ref);
                if (!(e_one <= 1e-10)) PROBLEM("R=%d rank %d: NMSE against one rank's grouped_mm %.3g", R, s, e_one);
                free(mine);
            }
            free(out);
            free(one);
            free(ref);
            free(x[s]);
            free(w[s]);
            free(ids[s]);
            free(pair[s]);
            free(local[s]);
            free(row_of[s]);
            free(y[s]);
        }
    }
    ref_layer_destroy(&L);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_loopback_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
