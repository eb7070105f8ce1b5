/* test_per_expert.c — layers whose experts live in separate matrices (expert_gate /
 * expert_up / expert_down pointer arrays, as checkpoints with `experts.N.gate_proj`
 * store them): every registered backend that takes the CPU (and the layer) against the float64 reference of the same weights
 * stacked, and the layout's bad inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "moex.h"
#include "reference.h"
#include "testutil.h"
#include "backend_list.h"


/* Per-expert copies of a stacked (not interleaved) layer: separate allocations, so that
 * nothing can rely on the experts being adjacent. */
typedef struct split_layer {
    void **gate, **up, **down; /* [E] each */
    int64_t E;
} split_layer;

// Rows [r0, r0 + rows) of expert e of a stacked [E, R, C] (or transposed [E, C, R]) tensor,
// as a new row-major matrix [rows, C] (or [C, rows]).
static void *copy_rows(const void *stacked, moex_dtype dt, int64_t e, int64_t R, int64_t C, int64_t r0, int64_t rows,
                       int transposed) {
    const size_t es = ref_dtype_size(dt);
    char *out = malloc((size_t)(rows * C) * es);
    const char *src = (const char *)stacked + (size_t)(e * R * C) * es;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) {
            size_t from = transposed ? (size_t)(c * R + r0 + r) : (size_t)((r0 + r) * C + c);
            size_t to = transposed ? (size_t)(c * rows + r) : (size_t)(r * C + c);
            memcpy(out + to * es, src + from * es, es);
        }
    return out;
}

static split_layer split(const ref_layer *L, const ref_layer_spec *s) {
    split_layer p = {calloc((size_t)s->E, sizeof(void *)), calloc((size_t)s->E, sizeof(void *)),
                     calloc((size_t)s->E, sizeof(void *)), s->E};
    const int64_t R = s->gated ? 2 * s->I : s->I;
    for (int64_t e = 0; e < s->E; e++) {
        if (s->gated) p.gate[e] = copy_rows(L->gate_up, s->dtype, e, R, s->H, 0, s->I, s->transposed);
        p.up[e] = copy_rows(L->gate_up, s->dtype, e, R, s->H, s->gated ? s->I : 0, s->I, s->transposed);
        p.down[e] = copy_rows(L->down, s->dtype, e, s->H, s->I, 0, s->H, s->transposed);
    }
    return p;
}

static void split_free(split_layer *p) {
    for (int64_t e = 0; e < p->E; e++) {
        free(p->gate[e]);
        free(p->up[e]);
        free(p->down[e]);
    }
    free(p->gate);
    free(p->up);
    free(p->down);
}

static moex_experts_desc per_expert_desc(const ref_layer *L, const ref_layer_spec *s, const split_layer *p) {
    moex_experts_desc d = L->desc;
    d.gate_up = ref_tensor_absent();
    d.down = ref_tensor_absent();
    d.expert_gate = s->gated ? (const void *const *)p->gate : NULL;
    d.expert_up = (const void *const *)p->up;
    d.expert_down = (const void *const *)p->down;
    d.expert_dtype = s->dtype;
    return d;
}

static void run_case(const ref_layer_spec *s, int64_t T, uint64_t seed) {
    ref_layer L;
    ref_layer_build(&L, s, seed);
    split_layer p = split(&L, s);
    moex_experts_desc d = per_expert_desc(&L, s, &p);
    moex_layer *layer = NULL;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_OK);

    ref_rng r;
    ref_rng_seed(&r, seed + 7);
    void *x = calloc((size_t)(T * s->H), 4), *out = calloc((size_t)(T * s->H), 4);
    int32_t *ids = calloc((size_t)(T * s->k), 4);
    float *w = calloc((size_t)(T * s->k), 4);
    double *want = calloc((size_t)(T * s->H), sizeof(double));
    ref_fill_random(x, s->dtype, T * s->H, 1.0, &r);
    ref_random_routing(&r, T, s->E, s->k, MOEX_I32, ids, MOEX_F32, w, 0.05);
    moex_tensor tx = ref_tensor_2d(x, s->dtype, T, s->H, s->H), tout = ref_tensor_2d(out, s->dtype, T, s->H, s->H);
    moex_tensor tid = ref_tensor_2d(ids, MOEX_I32, T, s->k, s->k), tw = ref_tensor_2d(w, MOEX_F32, T, s->k, s->k);
    ref_experts_forward(&L.desc, &tx, &tid, &tw, want); /* the stacked description: an independent path */

    moex_context_options o = moex_context_default_options();
    o.max_tokens = T;
    o.num_threads = 2;
    moex_context *ctx = NULL;
    assert_int_equal(moex_context_create(&o, &ctx), MOEX_OK);
    const double bound = s->dtype == MOEX_F32 ? 1e-10 : s->dtype == MOEX_F16 ? 1e-6 : 1e-4;
    const moex_device cpu = {MOEX_DEVICE_CPU, 0};
    const backend_list backends = cpu_backends(); /* every registered backend that takes the CPU */
    if (backends.n == 0) PROBLEM("no registered backend takes the CPU");
    for (int b = 0; b < backends.n; b++) {
        const char *be = backends.name[b];
        if (!backend_takes(be, layer, cpu)) continue; /* refuses this layer */
        memset(out, 0, (size_t)(T * s->H) * 4);
        if (moex_prepare(ctx, layer, be) != MOEX_OK ||
            moex_experts_forward(ctx, layer, be, &tx, &tid, &tw, &tout) != MOEX_OK) {
            PROBLEM("%s: %s", be, moex_last_error());
            continue;
        }
        double nmse = ref_nmse(out, s->dtype, T, s->H, s->H, want);
        if (!(nmse <= bound))
            PROBLEM("%s %s gated=%d transposed=%d bias=%d T=%lld E=%lld H=%lld I=%lld: NMSE %.3g > %.0e", be,
                    moex_dtype_name(s->dtype), s->gated, s->transposed, s->bias, (long long)T, (long long)s->E,
                    (long long)s->H, (long long)s->I, nmse, bound);
    }
    moex_context_free(ctx);
    moex_layer_free(layer);
    free(x), free(out), free(ids), free(w), free(want);
    split_free(&p);
    ref_layer_destroy(&L);
}

static void test_per_expert_matches_reference(void **state) {
    (void)state;
    const moex_dtype dtypes[] = {MOEX_F32, MOEX_BF16};
    const int64_t sizes[][5] = {{17, 5, 2, 24, 8}, {40, 8, 3, 129, 33}, {3, 4, 2, 8, 24}}; /* T, E, k, H, I */
    uint64_t seed = 1;
    for (size_t di = 0; di < 2; di++)
        for (size_t si = 0; si < 3; si++)
            for (int gated = 0; gated <= 1; gated++)
                for (int transposed = 0; transposed <= 1; transposed++)
                    for (int bias = 0; bias <= 1; bias++) {
                        ref_layer_spec s = {sizes[si][1], sizes[si][3], sizes[si][4], sizes[si][2], gated, 0,
                                            transposed, bias, gated ? MOEX_ACT_SILU : MOEX_ACT_GELU, 1.702f, 7.0f,
                                            dtypes[di]};
                        run_case(&s, sizes[si][0], seed++);
                    }
    end_problems();
}

static void test_per_expert_bad_input(void **state) {
    (void)state;
    ref_layer_spec s = {4, 8, 8, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer L;
    ref_layer_build(&L, &s, 3);
    split_layer p = split(&L, &s);
    moex_layer *layer = NULL;

    moex_experts_desc d = per_expert_desc(&L, &s, &p);
    d.gate_up = L.desc.gate_up; /* both layouts */
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "one layout"));

    d = per_expert_desc(&L, &s, &p);
    d.expert_gate = NULL; /* gated without gates */
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "expert_gate"));

    void *saved = p.down[2];
    p.down[2] = NULL;
    d = per_expert_desc(&L, &s, &p);
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "expert_down[2]"));
    p.down[2] = saved;

    d = per_expert_desc(&L, &s, &p);
    d.interleaved = 1;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "interleaved"));

    d = per_expert_desc(&L, &s, &p);
    d.expert_dtype = MOEX_I32;
    assert_int_equal(moex_layer_create(&d, &layer), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "i32"));
    assert_null(layer);

    split_free(&p);
    ref_layer_destroy(&L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_expert_matches_reference),
        cmocka_unit_test(test_per_expert_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
