/*
 * test_ep_forward.c — expert-parallel forwards through the public API (SPEC R11): R ranks of one
 * group (moex_ep_local_groups), a thread each, every rank's context holding its share of a
 * layer's experts, each rank forwarding its own tokens with the group's ids:
 *   - every CPU backend, f32 and bf16 (with biases and interleaved gate/up), groups of 1 to 4
 *     ranks, ranks with no tokens, strided hidden and out, i64 ids, sentinels: each rank's out
 *     against the float64 reference of the whole layer (f32 NMSE <= 1e-10, bf16 <= 1e-4), against
 *     the same backend's forward of the whole layer on one rank (the same bounds), and bitwise
 *     the same when run again;
 *   - a rank that refuses its arguments (a bad id, no prepare, a layer of other sizes, too many
 *     rows for a rank's workspace): every rank returns, the refusing one with its own message,
 *     the others naming it, nothing written anywhere; the group works again after;
 *   - groups made by hand: bad sizes, ranks and transports refused; a transport of the caller's
 *     carries a one-rank group; its failures reported (without a message of its own, or with a
 *     value that is not a moex_status).
 * Groups of CUDA contexts: tests/gpu/test_cuda_ep.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_ranks.h"
#include "moex.h"
#include "reference.h"
#include "testutil.h"

enum { MAXR = 4, ROW_PAD = 3 };

/* A rank's tokens: hidden [T, H] (row stride H + pad), ids [T, k], weights [T, k], out like hidden. */
typedef struct rank_data {
    int64_t T, ld;
    void *x, *ids, *w, *out;
    moex_dtype dt, id_dt;
} rank_data;

static void make_rank_data(rank_data *rd, ref_rng *rng, int64_t T, const moex_experts_desc *d, int64_t E, moex_dtype dt,
                           moex_dtype id_dt, int64_t pad) {
    const int64_t H = d->hidden, k = d->top_k;
    rd->T = T;
    rd->ld = H + pad;
    rd->dt = dt;
    rd->id_dt = id_dt;
    const size_t esz = moex_dtype_size(dt);
    rd->x = calloc((size_t)(T * rd->ld + 1), esz);
    rd->out = malloc((size_t)(T * rd->ld + 1) * esz);
    memset(rd->out, 0x7E, (size_t)(T * rd->ld + 1) * esz);
    rd->ids = calloc((size_t)(T * k + 1), moex_dtype_size(id_dt));
    rd->w = calloc((size_t)(T * k + 1), sizeof(float));
    for (int64_t t = 0; t < T; t++) ref_fill_random((char *)rd->x + (size_t)(t * rd->ld) * esz, dt, H, 1.0, rng);
    ref_random_routing(rng, T, E, k, id_dt, rd->ids, MOEX_F32, rd->w, 0.15);
}

static void free_rank_data(rank_data *rd) {
    free(rd->x);
    free(rd->out);
    free(rd->ids);
    free(rd->w);
}

static void views(const rank_data *rd, int64_t H, int64_t k, moex_tensor *x, moex_tensor *ids, moex_tensor *w,
                  moex_tensor *out) {
    *x = ref_tensor_2d(rd->x, rd->dt, rd->T, H, rd->ld);
    *out = ref_tensor_2d(rd->out, rd->dt, rd->T, H, rd->ld);
    *ids = ref_tensor_2d(rd->ids, rd->id_dt, rd->T, k, k);
    *w = ref_tensor_2d(rd->w, MOEX_F32, rd->T, k, k);
}

/* The whole layer on one rank (no group): out [T, H] contiguous, of rd's dtype. */
static void *one_rank(const moex_experts_desc *d, const char *backend, const rank_data *rd) {
    const size_t esz = moex_dtype_size(rd->dt);
    void *out = calloc((size_t)(rd->T * d->hidden + 1), esz);
    if (!rd->T) return out;
    moex_layer *layer = NULL;
    moex_context *ctx = NULL;
    moex_context_options o = moex_context_default_options();
    o.max_tokens = rd->T;
    o.num_threads = 1;
    assert_int_equal(moex_layer_create(d, &layer), MOEX_OK);
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_int_equal(moex_prepare(ctx, layer, backend), MOEX_OK);
    moex_tensor x, ids, w, dummy;
    views(rd, d->hidden, d->top_k, &x, &ids, &w, &dummy);
    moex_tensor to = ref_tensor_2d(out, rd->dt, rd->T, d->hidden, d->hidden);
    if (moex_experts_forward(ctx, layer, backend, &x, &ids, &w, &to)) fail_msg("%s one rank: %s", backend, moex_last_error());
    moex_context_free(ctx);
    moex_layer_free(layer);
    return out;
}

/* R ranks, one backend, one layer: every rank's out checked (see the file's comment). */
static void check_group(const ref_layer *L, int R, const char *backend, moex_dtype id_dt, const int64_t *tokens,
                        uint64_t seed, const char *what) {
    const moex_experts_desc *full = &L->desc;
    const int64_t E = full->num_experts, per = E / R, H = full->hidden, k = full->top_k;
    const moex_dtype dt = full->gate_up.dtype;
    const double bound = dt == MOEX_F32 ? 1e-10 : 1e-4;
    moex_ep_group *g[MAXR];
    assert_int_equal(moex_ep_local_groups(R, g), MOEX_OK);
    assert_int_equal(moex_ep_group_size(g[R - 1]), R);
    assert_int_equal(moex_ep_group_rank(g[R - 1]), R - 1);
    ref_rng rng;
    ref_rng_seed(&rng, seed);
    ep_rank_job jobs[MAXR];
    rank_data rd[MAXR];
    memset(jobs, 0, sizeof jobs);
    int64_t max_t = 1;
    for (int r = 0; r < R; r++) max_t = tokens[r] > max_t ? tokens[r] : max_t;
    for (int r = 0; r < R; r++) {
        moex_experts_desc s = ref_layer_share(full, r * per, per);
        assert_int_equal(moex_layer_create(&s, &jobs[r].layer), MOEX_OK);
        moex_context_options o = moex_context_default_options();
        o.max_tokens = max_t;
        o.num_threads = 1;
        o.ep_group = g[r];
        assert_int_equal(moex_context_create(&o, &jobs[r].ctx), MOEX_OK);
        if (moex_prepare(jobs[r].ctx, jobs[r].layer, backend)) fail_msg("%s: prepare: %s", what, moex_last_error());
        make_rank_data(&rd[r], &rng, tokens[r], full, E, dt == MOEX_F32 ? MOEX_F32 : MOEX_BF16, id_dt, r % 2 ? ROW_PAD : 0);
        jobs[r].backend = backend;
        views(&rd[r], H, k, &jobs[r].hidden, &jobs[r].ids, &jobs[r].weights, &jobs[r].out);
    }
    ep_run_ranks(jobs, R);
    for (int r = 0; r < R; r++) {
        if (jobs[r].st) {
            PROBLEM("%s rank %d: %s", what, r, jobs[r].msg);
            continue;
        }
        const int64_t T = rd[r].T;
        const size_t esz = moex_dtype_size(rd[r].dt);
        double *ref = calloc((size_t)(T * H + 1), sizeof(double));
        if (T) ref_experts_forward(full, &jobs[r].hidden, &jobs[r].ids, &jobs[r].weights, ref);
        ref_round_all(ref, T * H, rd[r].dt);
        void *one = one_rank(full, backend, &rd[r]);
        double *one_d = calloc((size_t)(T * H + 1), sizeof(double));
        for (int64_t i = 0; i < T * H; i++) one_d[i] = ref_load(one, rd[r].dt, i);
        const double e_ref = ref_nmse(rd[r].out, rd[r].dt, T, H, rd[r].ld, ref);
        const double e_one = ref_nmse(rd[r].out, rd[r].dt, T, H, rd[r].ld, one_d);
        if (!(e_ref <= bound)) PROBLEM("%s rank %d: NMSE against the float64 reference %.3g > %.0e", what, r, e_ref, bound);
        if (!(e_one <= bound)) PROBLEM("%s rank %d: NMSE against one rank's %s %.3g > %.0e", what, r, backend, e_one, bound);
        for (int64_t t = 0; t < T; t++) /* the gaps between out's rows are not written */
            for (int64_t c = H; c < rd[r].ld; c++)
                if (((unsigned char *)rd[r].out)[(size_t)(t * rd[r].ld + c) * esz] != 0x7E)
                    PROBLEM("%s rank %d: out[%lld] written past its %lld columns", what, r, (long long)t, (long long)H);
        free(ref);
        free(one);
        free(one_d);
    }
    /* again: bitwise the same */
    void *first[MAXR];
    for (int r = 0; r < R; r++) {
        const size_t bytes = (size_t)(rd[r].T * rd[r].ld) * moex_dtype_size(rd[r].dt);
        first[r] = malloc(bytes + 1);
        memcpy(first[r], rd[r].out, bytes);
    }
    ep_run_ranks(jobs, R);
    for (int r = 0; r < R; r++) {
        const size_t bytes = (size_t)(rd[r].T * rd[r].ld) * moex_dtype_size(rd[r].dt);
        if (jobs[r].st || memcmp(first[r], rd[r].out, bytes))
            PROBLEM("%s rank %d: the second run differs (%s)", what, r, jobs[r].msg);
        free(first[r]);
        moex_context_free(jobs[r].ctx);
        moex_layer_free(jobs[r].layer);
        moex_ep_group_free(g[r]);
        free_rank_data(&rd[r]);
    }
}

static void test_matches_one_rank(void **state) {
    (void)state;
    static const char *const BACKENDS[] = {"eager", "batched_mm", "grouped_mm"};
    static const int64_t TOKENS[MAXR] = {7, 0, 13, 5};
    /* E H I k gated interleaved transposed bias act alpha limit dtype */
    const ref_layer_spec specs[] = {
        {12, 37, 24, 3, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32},
        {12, 40, 19, 3, 1, 1, 0, 1, MOEX_ACT_GPTOSS_CLAMP, 1.702f, 7.0f, MOEX_BF16},
    };
    for (int sp = 0; sp < 2; sp++) {
        ref_layer L;
        ref_layer_build(&L, &specs[sp], 91 + (uint64_t)sp);
        for (int R = 1; R <= MAXR; R++)
            for (int b = 0; b < 3; b++) {
                char what[96];
                const moex_dtype id_dt = (R + b) % 2 ? MOEX_I64 : MOEX_I32;
                snprintf(what, sizeof what, "%s R=%d %s %s ids", BACKENDS[b], R, moex_dtype_name(specs[sp].dtype),
                         moex_dtype_name(id_dt));
                check_group(&L, R, BACKENDS[b], id_dt, TOKENS, 500u + (uint64_t)(R * 7 + b), what);
            }
        ref_layer_destroy(&L);
    }
    end_problems();
}

/* A group of two over one layer's halves, for the refusals: contexts of max_tokens mt[r]. */
typedef struct pair_group {
    moex_ep_group *g[2];
    ep_rank_job jobs[2];
    rank_data rd[2];
} pair_group;

static void pair_open(pair_group *pg, const ref_layer *L, const int64_t *mt, const int64_t *T, const int *prepare) {
    memset(pg, 0, sizeof *pg);
    assert_int_equal(moex_ep_local_groups(2, pg->g), MOEX_OK);
    ref_rng rng;
    ref_rng_seed(&rng, 4242);
    const int64_t per = L->desc.num_experts / 2;
    for (int r = 0; r < 2; r++) {
        moex_experts_desc s = ref_layer_share(&L->desc, r * per, per);
        assert_int_equal(moex_layer_create(&s, &pg->jobs[r].layer), MOEX_OK);
        moex_context_options o = moex_context_default_options();
        o.max_tokens = mt[r];
        o.num_threads = 1;
        o.ep_group = pg->g[r];
        assert_int_equal(moex_context_create(&o, &pg->jobs[r].ctx), MOEX_OK);
        if (prepare[r]) assert_int_equal(moex_prepare(pg->jobs[r].ctx, pg->jobs[r].layer, "grouped_mm"), MOEX_OK);
        make_rank_data(&pg->rd[r], &rng, T[r], &L->desc, L->desc.num_experts, MOEX_F32, MOEX_I32, 0);
        pg->jobs[r].backend = "grouped_mm";
        views(&pg->rd[r], L->desc.hidden, L->desc.top_k, &pg->jobs[r].hidden, &pg->jobs[r].ids, &pg->jobs[r].weights,
              &pg->jobs[r].out);
    }
}

/* Both ranks returned `st[r]` with messages containing want[r]; no out written. */
static void pair_expect(pair_group *pg, const moex_status *st, const char *const *want, const char *what) {
    ep_run_ranks(pg->jobs, 2);
    for (int r = 0; r < 2; r++) {
        if (pg->jobs[r].st != st[r] || !contains(pg->jobs[r].msg, want[r]))
            PROBLEM("%s rank %d: status %d (%s), want %d with \"%s\"", what, r, pg->jobs[r].st, pg->jobs[r].msg, st[r],
                    want[r]);
        const size_t bytes = (size_t)(pg->rd[r].T * pg->rd[r].ld) * sizeof(float);
        for (size_t i = 0; i < bytes; i++)
            if (((unsigned char *)pg->rd[r].out)[i] != 0x7E) {
                PROBLEM("%s rank %d: out written at byte %zu", what, r, i);
                break;
            }
    }
}

static void pair_close(pair_group *pg) {
    for (int r = 0; r < 2; r++) {
        moex_context_free(pg->jobs[r].ctx);
        moex_layer_free(pg->jobs[r].layer);
        moex_ep_group_free(pg->g[r]);
        free_rank_data(&pg->rd[r]);
    }
}

static void test_refusals_reach_every_rank(void **state) {
    (void)state;
    ref_layer L, other;
    const ref_layer_spec spec = {8, 24, 16, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    const ref_layer_spec spec2 = {8, 32, 16, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer_build(&L, &spec, 5);
    ref_layer_build(&other, &spec2, 6);
    const int both[2] = {1, 1};
    pair_group pg;
    { /* a bad id on rank 1 */
        const int64_t mt[2] = {6, 6}, T[2] = {5, 6};
        pair_open(&pg, &L, mt, T, both);
        ((int32_t *)pg.rd[1].ids)[3] = 9; /* the group's E is 8: 9 is neither an expert nor a sentinel */
        const moex_status st[2] = {MOEX_ERR_INVALID_ARGUMENT, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"rank 1 of 2 refused", "= 9 is outside [0, 8)"};
        pair_expect(&pg, st, want, "bad id");
        ((int32_t *)pg.rd[1].ids)[3] = 8; /* a sentinel: the group goes on */
        ep_run_ranks(pg.jobs, 2);
        for (int r = 0; r < 2; r++)
            if (pg.jobs[r].st) PROBLEM("after the refusal, rank %d: %s", r, pg.jobs[r].msg);
        pair_close(&pg);
    }
    { /* rank 0 not prepared */
        const int64_t mt[2] = {6, 6}, T[2] = {5, 6};
        const int only1[2] = {0, 1};
        pair_open(&pg, &L, mt, T, only1);
        const moex_status st[2] = {MOEX_ERR_NOT_PREPARED, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"not prepared", "rank 0 of 2 refused"};
        pair_expect(&pg, st, want, "no prepare");
        pair_close(&pg);
    }
    { /* T over rank 0's max_tokens */
        const int64_t mt[2] = {4, 6}, T[2] = {5, 6};
        pair_open(&pg, &L, mt, T, both);
        const moex_status st[2] = {MOEX_ERR_WORKSPACE, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"exceeds the context's max_tokens", "rank 0 of 2 refused"};
        pair_expect(&pg, st, want, "T > max_tokens");
        pair_close(&pg);
    }
    { /* rank 1 sends all its rows to rank 0, whose context was made for fewer */
        const int64_t mt[2] = {2, 16}, T[2] = {1, 16};
        pair_open(&pg, &L, mt, T, both);
        for (int64_t i = 0; i < 16 * 2; i++) ((int32_t *)pg.rd[1].ids)[i] = (int32_t)(i % 4); /* rank 0's experts */
        const moex_status st[2] = {MOEX_ERR_WORKSPACE, MOEX_ERR_WORKSPACE};
        const char *const want[2] = {"rank 0 would receive", "rank 0 would receive"};
        pair_expect(&pg, st, want, "too many rows");
        pair_close(&pg);
    }
    { /* rank 1's layer has another hidden size */
        const int64_t mt[2] = {6, 6}, T[2] = {3, 0};
        pair_open(&pg, &L, mt, T, both);
        moex_context_free(pg.jobs[1].ctx);
        moex_layer_free(pg.jobs[1].layer);
        moex_experts_desc s = ref_layer_share(&other.desc, 4, 4);
        assert_int_equal(moex_layer_create(&s, &pg.jobs[1].layer), MOEX_OK);
        moex_context_options o = moex_context_default_options();
        o.max_tokens = 6;
        o.num_threads = 1;
        o.ep_group = pg.g[1];
        assert_int_equal(moex_context_create(&o, &pg.jobs[1].ctx), MOEX_OK);
        assert_int_equal(moex_prepare(pg.jobs[1].ctx, pg.jobs[1].layer, "grouped_mm"), MOEX_OK);
        int64_t hs[2] = {0, 32};
        moex_tensor_init(&pg.jobs[1].hidden, pg.rd[1].x, MOEX_F32, 2, hs);
        moex_tensor_init(&pg.jobs[1].out, pg.rd[1].out, MOEX_F32, 2, hs);
        const moex_status st[2] = {MOEX_ERR_INVALID_ARGUMENT, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"hidden 32", "every rank must run the same layer"};
        pair_expect(&pg, st, want, "layers differ");
        pair_close(&pg);
    }
    { /* a NULL layer on rank 0: it still takes part, so rank 1 returns too */
        const int64_t mt[2] = {6, 6}, T[2] = {2, 2};
        pair_open(&pg, &L, mt, T, both);
        moex_layer *kept = pg.jobs[0].layer;
        pg.jobs[0].layer = NULL;
        const moex_status st[2] = {MOEX_ERR_INVALID_ARGUMENT, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"layer is NULL", "rank 0 of 2 refused"};
        pair_expect(&pg, st, want, "NULL layer");
        pg.jobs[0].layer = kept;
        pair_close(&pg);
    }
    { /* an unknown backend name on rank 0 */
        const int64_t mt[2] = {6, 6}, T[2] = {2, 2};
        pair_open(&pg, &L, mt, T, both);
        pg.jobs[0].backend = "no_such";
        const moex_status st[2] = {MOEX_ERR_NOT_FOUND, MOEX_ERR_INVALID_ARGUMENT};
        const char *const want[2] = {"unknown experts backend", "rank 0 of 2 refused"};
        pair_expect(&pg, st, want, "unknown backend");
        pair_close(&pg);
    }
    { /* every rank with no tokens: nothing to do, and no error */
        const int64_t mt[2] = {3, 3}, T[2] = {0, 0};
        pair_open(&pg, &L, mt, T, both);
        ep_run_ranks(pg.jobs, 2);
        for (int r = 0; r < 2; r++)
            if (pg.jobs[r].st) PROBLEM("T = 0 everywhere, rank %d: %s", r, pg.jobs[r].msg);
        pair_close(&pg);
    }
    ref_layer_destroy(&L);
    ref_layer_destroy(&other);
    end_problems();
}

/* A transport of the caller's for a group of one: a copy; `mode` 1 fails without a message,
 * 2 returns a value that is not a moex_status. */
static int released;
static moex_status copy_all_to_all(void *user, const void *send, const size_t *send_offset, const size_t *send_bytes,
                                   void *recv, const size_t *recv_offset, const size_t *recv_bytes) {
    const int mode = *(const int *)user;
    if (mode == 1) return MOEX_ERR_DEVICE;
    if (mode == 2) return (moex_status)12345;
    if (send_bytes[0] != recv_bytes[0]) return moex_backend_fail(MOEX_ERR_INTERNAL, "sizes differ");
    memcpy((char *)recv + recv_offset[0], (const char *)send + send_offset[0], send_bytes[0]);
    return MOEX_OK;
}
static void count_release(void *user) {
    (void)user;
    released++;
}

/* moex_experts_desc_share: the share's views (stacked weights and biases from expert e0, strides
 * kept), and its refusals with the description untouched. */
static void test_desc_share(void **state) {
    (void)state;
    const ref_layer_spec spec = {6, 24, 16, 2, 1, 0, 0, 1, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_BF16};
    ref_layer L;
    ref_layer_build(&L, &spec, 7);
    const moex_experts_desc *d = &L.desc;
    moex_experts_desc s;
    assert_int_equal(moex_experts_desc_share(d, 4, 2, &s), MOEX_OK);
    assert_int_equal(s.num_experts, 2);
    assert_int_equal(s.top_k, 2);
    assert_ptr_equal(s.gate_up.data, (char *)d->gate_up.data + 4 * 2 * 16 * 24 * 2);
    assert_ptr_equal(s.down.data, (char *)d->down.data + 4 * 24 * 16 * 2);
    assert_ptr_equal(s.gate_up_bias.data, (char *)d->gate_up_bias.data + 4 * 2 * 16 * 2);
    assert_int_equal(s.gate_up.shape[0], 2);
    assert_int_equal(s.gate_up.strides[0], d->gate_up.strides[0]);
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&s, &layer), MOEX_OK);
    moex_layer_free(layer);
    memset(&s, 0x5a, sizeof s);
    moex_experts_desc before = s;
    const int64_t bad[][2] = {{-1, 2}, {0, 0}, {5, 2}, {0, 7}, {6, 1}};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(moex_experts_desc_share(d, bad[i][0], bad[i][1], &s), MOEX_ERR_INVALID_ARGUMENT);
        assert_true(contains(moex_last_error(), "are not a share of the 6 experts"));
        assert_memory_equal(&s, &before, sizeof s);
    }
    assert_int_equal(moex_experts_desc_share(NULL, 0, 1, &s), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_experts_desc_share(d, 0, 1, NULL), MOEX_ERR_INVALID_ARGUMENT);
    ref_layer_destroy(&L);
}

static void test_groups_by_hand(void **state) {
    (void)state;
    moex_ep_group *g = NULL, *gs[2];
    int mode = 0;
    const moex_ep_transport t = {copy_all_to_all, count_release, &mode}, none = {NULL, NULL, NULL};
    assert_int_equal(moex_ep_group_create(0, 0, &t, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "size 0"));
    assert_int_equal(moex_ep_group_create(MOEX_EP_MAX_RANKS + 1, 0, &t, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_ep_group_create(2, 2, &t, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "rank 2"));
    assert_int_equal(moex_ep_group_create(2, -1, &t, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_ep_group_create(1, 0, &none, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "all_to_all"));
    assert_int_equal(moex_ep_group_create(1, 0, NULL, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_ep_local_groups(0, gs), MOEX_ERR_INVALID_ARGUMENT);
    assert_null(g);
    assert_int_equal(moex_ep_group_size(NULL), 0);

    /* a group of one over the caller's transport: the whole layer here */
    ref_layer L;
    const ref_layer_spec spec = {6, 20, 12, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer_build(&L, &spec, 8);
    assert_int_equal(moex_ep_group_create(1, 0, &t, &g), MOEX_OK);
    moex_layer *layer = NULL;
    moex_context *ctx = NULL;
    moex_context_options o = moex_context_default_options();
    o.max_tokens = 9;
    o.num_threads = 1;
    o.ep_group = g;
    assert_int_equal(moex_layer_create(&L.desc, &layer), MOEX_OK);
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    assert_int_equal(moex_prepare(ctx, layer, "batched_mm"), MOEX_OK);
    ref_rng rng;
    ref_rng_seed(&rng, 3);
    rank_data rd;
    make_rank_data(&rd, &rng, 9, &L.desc, 6, MOEX_F32, MOEX_I32, 0);
    moex_tensor x, ids, w, out;
    views(&rd, 20, 2, &x, &ids, &w, &out);
    assert_int_equal(moex_experts_forward(ctx, layer, "batched_mm", &x, &ids, &w, &out), MOEX_OK);
    double ref[9 * 20];
    ref_experts_forward(&L.desc, &x, &ids, &w, ref);
    assert_true(ref_nmse(rd.out, MOEX_F32, 9, 20, 20, ref) <= 1e-10);
    mode = 1;
    assert_int_equal(moex_experts_forward(ctx, layer, "batched_mm", &x, &ids, &w, &out), MOEX_ERR_DEVICE);
    assert_true(contains(moex_last_error(), "no message"));
    mode = 2;
    assert_int_equal(moex_experts_forward(ctx, layer, "batched_mm", &x, &ids, &w, &out), MOEX_ERR_INTERNAL);
    assert_true(contains(moex_last_error(), "12345"));
    moex_context_free(ctx);
    moex_ep_group_free(g);
    assert_int_equal(released, 1);

    moex_layer_free(layer);
    free_rank_data(&rd);
    ref_layer_destroy(&L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_one_rank),
        cmocka_unit_test(test_refusals_reach_every_rank),
        cmocka_unit_test(test_groups_by_hand),
        cmocka_unit_test(test_desc_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
