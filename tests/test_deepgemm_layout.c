/*
 * test_deepgemm_layout.c — the deepgemm backend's row layouts on the CPU (the reference the
 * GPU's routing is to reproduce, src/backends/deepgemm_layout.c), checked against what each
 * layout promises, pair by pair: random ids over odd sizes with sentinels (-1 and E), a hot
 * expert, strided ids, block sizes 1, 4 and 128, T = 0, the bound met exactly; the masked
 * layout at and over capacity; bad ids and bounds refused with nothing written.
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

#include "backends/deepgemm_layout.h"
#include "testutil.h"

static uint64_t g_rng = 12345;
static uint32_t rnd(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33) % n;
}

/* ids [T, ld] with k used per row: mostly in [0, E), sentinels, one expert hot */
static int32_t *make_ids(int64_t T, int64_t k, int64_t ld, int64_t E, int hot) {
    int32_t *ids = malloc(sizeof *ids * (size_t)(T * ld + 1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ld; j++) {
            uint32_t r = rnd(20);
            ids[t * ld + j] = j >= k ? 999 /* never read */ : r == 0 ? -1 : r == 1 ? (int32_t)E
                              : hot && j == 0 ? 0 : (int32_t)rnd((uint32_t)E);
        }
    return ids;
}

/* The rows of expert e (start, length n) hold its pairs in order, then -1 up to len. */
static void check_segment(const int32_t *ids, int64_t k, int64_t ld, int32_t e, const int32_t *rows, int64_t n,
                          int64_t len, const char *what) {
    for (int64_t i = 0; i < len; i++) {
        if (i < n) {
            const int32_t pr = rows[i];
            if (pr < 0 || ids[(pr / k) * ld + pr % k] != e) PROBLEM("%s: expert %d row %lld holds pair %d", what, e, (long long)i, pr);
            if (i > 0 && pr <= rows[i - 1]) PROBLEM("%s: expert %d rows out of pair order at %lld", what, e, (long long)i);
        } else if (rows[i] != -1) {
            PROBLEM("%s: expert %d padding row %lld holds %d", what, e, (long long)i, rows[i]);
        }
    }
}

static void test_contiguous(void **state) {
    (void)state;
    static const int64_t SIZES[][4] = {{37, 3, 3, 5}, {1, 8, 8, 256}, {300, 4, 6, 16}, {0, 2, 2, 7}, {129, 1, 1, 1}};
    static const int64_t BLOCKS[] = {1, 4, 128};
    for (int s = 0; s < 5; s++)
        for (int b = 0; b < 3; b++) {
            const int64_t T = SIZES[s][0], k = SIZES[s][1], ld = SIZES[s][2], E = SIZES[s][3], bm = BLOCKS[b];
            int32_t *ids = make_ids(T, k, ld, E, s == 2);
            const int64_t bound = deepgemm_contiguous_rows_bound(T * k, E, bm);
            int64_t *seg = malloc(sizeof *seg * (size_t)(E + 1));
            int32_t *count = malloc(sizeof *count * (size_t)E), *rows = malloc(sizeof *rows * (size_t)(bound + 1));
            assert_int_equal(deepgemm_contiguous_layout(ids, T, k, ld, E, bm, bound, seg, count, rows), MOEX_OK);
            char what[64];
            snprintf(what, sizeof what, "T=%lld k=%lld E=%lld block %lld", (long long)T, (long long)k, (long long)E, (long long)bm);
            int64_t pairs = 0;
            if (seg[0] != 0) PROBLEM("%s: seg[0] = %lld", what, (long long)seg[0]);
            for (int64_t e = 0; e < E; e++) {
                int64_t want = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t j = 0; j < k; j++) want += ids[t * ld + j] == e;
                pairs += want;
                if (count[e] != want) PROBLEM("%s: count[%lld] = %d, want %lld", what, (long long)e, count[e], (long long)want);
                const int64_t len = seg[e + 1] - seg[e];
                if (len != (want + bm - 1) / bm * bm) PROBLEM("%s: segment %lld is %lld rows", what, (long long)e, (long long)len);
                check_segment(ids, k, ld, (int32_t)e, rows + seg[e], want, len, what);
            }
            if (seg[E] > bound) PROBLEM("%s: %lld rows past the bound %lld", what, (long long)seg[E], (long long)bound);
            for (int64_t r = seg[E]; r < bound; r++)
                if (rows[r] != -1) PROBLEM("%s: row %lld past the layout holds %d", what, (long long)r, rows[r]);
            int64_t seen = 0;
            for (int64_t r = 0; r < bound; r++) seen += rows[r] >= 0;
            if (seen != pairs) PROBLEM("%s: %lld rows for %lld pairs", what, (long long)seen, (long long)pairs);
            free(ids), free(seg), free(count), free(rows);
        }
    /* the bound met exactly: one pair for each of 5 experts, blocks of 128 */
    int32_t ids[5] = {0, 1, 2, 3, 4}, count[5], rows[640];
    int64_t seg[6];
    assert_int_equal(deepgemm_contiguous_rows_bound(5, 5, 128), 640);
    assert_int_equal(deepgemm_contiguous_layout(ids, 5, 1, 1, 5, 128, 640, seg, count, rows), MOEX_OK);
    if (seg[5] != 640 || rows[128] != 1 || rows[129] != -1) PROBLEM("tight bound: seg[5] = %lld", (long long)seg[5]);
    end_problems();
}

static void test_masked(void **state) {
    (void)state;
    const int64_t T = 41, k = 4, ld = 5, E = 9, cap = T * k; /* these ids repeat within a token */
    int32_t *ids = make_ids(T, k, ld, E, 1), count[9], *rows = malloc(sizeof *rows * (size_t)(E * cap));
    assert_int_equal(deepgemm_masked_layout(ids, T, k, ld, E, cap, count, rows), MOEX_OK);
    for (int64_t e = 0; e < E; e++) {
        int64_t want = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) want += ids[t * ld + j] == e;
        if (count[e] != want) PROBLEM("masked: count[%lld] = %d, want %lld", (long long)e, count[e], (long long)want);
        check_segment(ids, k, ld, (int32_t)e, rows + e * cap, want, cap, "masked");
    }
    /* over capacity: expert 0 (hot) has more than 3 pairs */
    int32_t before[9 * 3];
    memset(before, 0x5a, sizeof before);
    int32_t out[9 * 3], cnt[9];
    memcpy(out, before, sizeof out);
    memset(cnt, 0x5a, sizeof cnt);
    assert_int_equal(deepgemm_masked_layout(ids, T, k, ld, E, 3, cnt, out), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "expert 0") || !contains(moex_last_error(), "capacity of 3"))
        PROBLEM("over capacity: %s", moex_last_error());
    if (memcmp(out, before, sizeof out) != 0 || cnt[0] != 0x5a5a5a5a) PROBLEM("over capacity: outputs written");
    free(ids), free(rows);
    end_problems();
}

static void test_refused(void **state) {
    (void)state;
    int32_t ids[6] = {0, 1, 2, 7, 1, 0}, count[4], rows[512];
    int64_t seg[5];
    memset(rows, 0x33, sizeof rows);
    assert_int_equal(deepgemm_contiguous_layout(ids, 3, 2, 2, 4, 128, 512, seg, count, rows), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "ids[1,1] = 7") || !contains(moex_last_error(), "[-1, 4]"))
        PROBLEM("bad id: %s", moex_last_error());
    if (rows[0] != 0x33333333) PROBLEM("bad id: rows written");
    ids[3] = 3;
    assert_int_equal(deepgemm_contiguous_layout(ids, 3, 2, 2, 4, 128, 256, seg, count, rows), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "512 rows") || !contains(moex_last_error(), "256")) PROBLEM("bound: %s", moex_last_error());
    assert_int_equal(deepgemm_contiguous_layout(ids, 3, 2, 1, 4, 128, 512, seg, count, rows), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(deepgemm_masked_layout(ids, 3, 2, 2, 4, 0, count, rows), MOEX_ERR_INVALID_ARGUMENT);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous),
        cmocka_unit_test(test_masked),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
