/*
 * test_registry.c — the backend registry, seen from a user's program.
 *
 *   - the six built-ins are listed, first, with summaries; lookups
 *   - a user backend written here (a naive f32 loop for gated concatenated
 *     silu layers) registered from outside the library, prepared, run, and
 *     compared with the float64 reference; its supports() reason surfaces
 *   - names: duplicates (MOEX_ERR_EXISTS), bad characters, lengths, missing
 *     required functions
 *   - the GPU backends on the CPU: unsupported, with a reason
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moex.h"
#include "reference.h"
#include "testutil.h"

static const char *const BUILTINS[6] = {"eager",    "batched_mm",       "grouped_mm",
                                        "deepgemm", "deepgemm_megamoe", "sonicmoe"};

static const moex_device CPU = {MOEX_DEVICE_CPU, 0};

/* ------------------------------------------------------------------------ */
/* the user backend: naive f32, gated, concatenated, silu, no biases         */
/* ------------------------------------------------------------------------ */

#define NAIVE_REASON "test_naive runs f32 gated concatenated silu layers without biases only"
#define STATE_MAGIC 0x5EED5EEDu

/* What the user backend saw; passed as its user pointer. */
typedef struct naive_log {
    int supports, workspace, prepare, release, forward;
    int bad_state, bad_args;             /* something unexpected reached a callback */
    size_t asked_ws;                     /* what workspace_bytes() returned last */
    int64_t last_tokens;
    int last_threads;
    int want_state;                      /* 1: prepare is registered and state must be ours */
} naive_log;

static naive_log LOG_A, LOG_MIN;

/* layer, dev -> 1 if a naive f32 gated concatenated silu CPU layer, else 0 + why */
static int naive_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why,
                          size_t why_size, void *user) {
    naive_log *log = user;
    log->supports++;
    if (!dev || dev->device.kind != MOEX_DEVICE_CPU) {
        if (why && why_size) snprintf(why, why_size, "test_naive runs on the CPU only");
        return 0;
    }
    if (!layer) return 1;                             /* the device alone was asked about */
    if (layer->gate_up.dtype != MOEX_F32 || !layer->gated || layer->interleaved ||
        layer->transposed || layer->activation != MOEX_ACT_SILU || layer->gate_up_bias.data ||
        layer->down_bias.data) {
        if (why && why_size) snprintf(why, why_size, NAIVE_REASON);
        return 0;
    }
    return 1;
}

/* layer -> bytes for one token's intermediate [I] and accumulator [H] */
static size_t naive_workspace(const moex_experts_desc *layer, int64_t max_tokens, const moex_context *ctx,
                              void *user) {
    naive_log *log = user;
    log->workspace++;
    log->asked_ws = (size_t)(layer->intermediate + layer->hidden) * sizeof(float);
    return log->asked_ws;
}

static moex_status naive_prepare(moex_context *ctx, const moex_experts_desc *layer, void **state,
                                 void *user) {
    naive_log *log = user;
    log->prepare++;
    unsigned *s = malloc(sizeof *s);
    if (!s) return MOEX_ERR_OUT_OF_MEMORY;
    *s = STATE_MAGIC;
    *state = s;
    return MOEX_OK;
}

static void naive_release(void *state, void *user) {
    naive_log *log = user;
    log->release++;
    if (!state || *(unsigned *)state != STATE_MAGIC) log->bad_state++;
    free(state);
}

/* x: [H] -> y: [H] = sum over the token's experts (naive f32 loops) */
static void naive_token(const moex_forward_args *a, int64_t t, float *h, float *y) {
    const moex_experts_desc *d = a->layer;
    int64_t H = d->hidden, I = d->intermediate, E = d->num_experts, k = a->ids->shape[1];
    const float *x = (const float *)a->hidden->data + t * a->hidden->strides[0];
    const float *gu = d->gate_up.data, *dn = d->down.data;
    for (int64_t c = 0; c < H; c++) y[c] = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t at = t * a->ids->strides[0] + j * a->ids->strides[1];
        int64_t e = a->ids->dtype == MOEX_I64 ? ((const int64_t *)a->ids->data)[at]
                                               : ((const int32_t *)a->ids->data)[at];
        if (e < 0 || e >= E) continue;
        float w = ((const float *)a->weights->data)[t * a->weights->strides[0] + j * a->weights->strides[1]];
        for (int64_t r = 0; r < I; r++) {
            const float *grow = gu + (e * 2 * I + r) * H, *urow = gu + (e * 2 * I + I + r) * H;
            float g = 0.0f, u = 0.0f;
            for (int64_t c = 0; c < H; c++) {
                g += grow[c] * x[c];
                u += urow[c] * x[c];
            }
            h[r] = g / (1.0f + expf(-g)) * u;
        }
        for (int64_t c = 0; c < H; c++) {
            const float *drow = dn + (e * H + c) * I;
            float v = 0.0f;
            for (int64_t r = 0; r < I; r++) v += drow[r] * h[r];
            y[c] += w * v;
        }
    }
}

static moex_status naive_forward(const moex_forward_args *a, void *user) {
    naive_log *log = user;
    log->forward++;
    log->last_tokens = a->tokens;
    log->last_threads = a->num_threads;
    if (log->want_state && (!a->state || *(unsigned *)a->state != STATE_MAGIC)) log->bad_state++;
    if (!log->want_state && a->state) log->bad_state++;
    const moex_experts_desc *d = a->layer;
    size_t need = (size_t)(d->intermediate + d->hidden) * sizeof(float);
    if (a->workspace_bytes < need || !a->workspace || a->tokens < 1 ||
        a->weights->dtype != MOEX_F32 || a->hidden->dtype != MOEX_F32) {
        log->bad_args++;
        return MOEX_ERR_INTERNAL;
    }
    void *wp = NULL;
    size_t wb = 0;
    if (moex_context_workspace(a->ctx, &wp, &wb) != MOEX_OK || wp != a->workspace || wb < need)
        log->bad_args++;
    float *h = a->workspace, *y = h + d->intermediate;
    for (int64_t t = 0; t < a->tokens; t++) {
        naive_token(a, t, h, y);
        float *o = (float *)a->out->data + t * a->out->strides[0];
        memcpy(o, y, sizeof(float) * (size_t)d->hidden);
    }
    return MOEX_OK;
}

/* -> the full user backend (every function), user = log */
static moex_backend naive_backend(const char *name, naive_log *log) {
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.summary = "naive f32 loops written in test_registry.c";
    b.supports = naive_supports;
    b.workspace_bytes = naive_workspace;
    b.prepare = naive_prepare;
    b.release = naive_release;
    b.forward = naive_forward;
    b.user = log;
    log->want_state = 1;
    return b;
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* -> a CPU context with num_threads threads and room for max_tokens */
static moex_context *make_ctx(int num_threads, int64_t max_tokens) {
    moex_context_options o = moex_context_default_options();
    o.num_threads = num_threads;
    o.max_tokens = max_tokens;
    moex_context *ctx = NULL;
    moex_status st = moex_context_create(&o, &ctx);
    if (st != MOEX_OK) fail_msg("moex_context_create: %s: %s", moex_status_str(st), moex_last_error());
    return ctx;
}

/* A random case: layer, hidden [T, H], ids [T, k], weights [T, k], reference [T, H]. */
typedef struct rcase {
    ref_layer L;
    moex_layer *layer;
    int64_t T;
    float *hidden, *weights, *out;
    int32_t *ids;
    double *ref;
    moex_tensor th, tids, tw, tout;
} rcase;

/* -> *c: T tokens through a random f32 layer of the given layout */
static void rcase_init(rcase *c, int64_t T, int64_t E, int64_t k, int64_t H, int64_t I,
                       moex_dtype dt, int interleaved, int bias, uint64_t seed) {
    memset(c, 0, sizeof *c);
    ref_layer_spec s = {E, H, I, k, 1, interleaved, 0, bias, MOEX_ACT_SILU, 1.702f, 7.0f, dt};
    ref_layer_build(&c->L, &s, seed);
    assert_int_equal(moex_layer_create(&c->L.desc, &c->layer), MOEX_OK);
    ref_rng r;
    ref_rng_seed(&r, seed + 1);
    c->T = T;
    c->hidden = calloc((size_t)(T * H) + 1, 4);
    c->out = calloc((size_t)(T * H) + 1, 4);
    c->ids = calloc((size_t)(T * k) + 1, 4);
    c->weights = calloc((size_t)(T * k) + 1, 4);
    c->ref = calloc((size_t)(T * H) + 1, sizeof(double));
    ref_fill_random(c->hidden, dt, T * H, 1.0, &r);
    ref_random_routing(&r, T, E, k, MOEX_I32, c->ids, MOEX_F32, c->weights, 0.1);
    c->th = ref_tensor_2d(c->hidden, dt, T, H, H);
    c->tids = ref_tensor_2d(c->ids, MOEX_I32, T, k, k);
    c->tw = ref_tensor_2d(c->weights, MOEX_F32, T, k, k);
    c->tout = ref_tensor_2d(c->out, dt, T, H, H);
    ref_experts_forward(&c->L.desc, &c->th, &c->tids, &c->tw, c->ref);
}

static void rcase_free(rcase *c) {
    moex_layer_free(c->layer);
    ref_layer_destroy(&c->L);
    free(c->hidden);
    free(c->out);
    free(c->ids);
    free(c->weights);
    free(c->ref);
}

/* -> index of name in the registry, or -1 */
static int registry_index(const char *name) {
    int n = moex_backend_count();
    for (int i = 0; i < n; i++) {
        const char *s = moex_backend_name(i);
        if (s && strcmp(s, name) == 0) return i;
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* the built-ins                                                             */
/* ------------------------------------------------------------------------ */

/* The six built-ins come first (before any backend registered here), each once, with a summary.
 * A build may add test-only built-ins (tests/backends, e.g. test_rows in the test copy of the
 * library this program links): they are listed among the built-ins too, and allowed. */
static void test_builtins_listed(void **state) {
    (void)state;
    int n = moex_backend_count(); /* the first test: nothing registered yet, every entry is a built-in */
    assert_true(n >= 6);
    for (int b = 0; b < 6; b++) {
        int at = registry_index(BUILTINS[b]);
        if (at < 0 || at >= n) PROBLEM("built-in %s at index %d, want one of 0..%d", BUILTINS[b], at, n - 1);
        for (int c = 0; c < b; c++)
            if (registry_index(BUILTINS[c]) > at) PROBLEM("built-in %s listed after %s", BUILTINS[c], BUILTINS[b]);
        const char *sum = moex_backend_summary(BUILTINS[b]);
        if (!sum || !*sum) PROBLEM("built-in %s has no summary", BUILTINS[b]);
        assert_int_equal(moex_backend_lookup(BUILTINS[b]), MOEX_OK);
    }
    for (int i = 0; i < n; i++) assert_non_null(moex_backend_name(i));
    assert_null(moex_backend_name(-1));
    assert_null(moex_backend_name(n));
    assert_null(moex_backend_summary("no_such_backend"));
    assert_null(moex_backend_summary(NULL));
    end_problems();
}

/* An unknown name: NOT_FOUND, and the message lists every valid name. */
static void test_lookup_unknown(void **state) {
    (void)state;
    assert_int_equal(moex_backend_lookup("grouped"), MOEX_ERR_NOT_FOUND);
    const char *msg = moex_last_error();
    for (int b = 0; b < 6; b++)
        if (!contains(msg, BUILTINS[b])) PROBLEM("lookup message \"%s\" lacks %s", msg, BUILTINS[b]);
    if (!contains(msg, "grouped")) PROBLEM("lookup message \"%s\" does not name the bad name", msg);
    assert_int_not_equal(moex_backend_lookup(NULL), MOEX_OK);
    assert_int_equal(moex_backend_lookup("Eager"), MOEX_ERR_NOT_FOUND);   /* names are exact */
    end_problems();
}

/* deepgemm, deepgemm_megamoe and sonicmoe on the CPU: UNSUPPORTED with a reason. */
static void test_gpu_backends_on_cpu(void **state) {
    (void)state;
    static const char *const GPU[3] = {"deepgemm", "deepgemm_megamoe", "sonicmoe"};
    rcase c;
    rcase_init(&c, 1, 4, 2, 16, 8, MOEX_BF16, 0, 0, 3);
    for (int g = 0; g < 3; g++)
        for (int with_layer = 0; with_layer < 2; with_layer++) {
            char why[256];
            memset(why, 0, sizeof why);
            moex_status st = moex_backend_supports(GPU[g], with_layer ? c.layer : NULL, CPU, why, sizeof why);
            if (st != MOEX_ERR_UNSUPPORTED)
                PROBLEM("supports(%s, CPU): %s, want unsupported", GPU[g], moex_status_str(st));
            if (!contains(why, "compute capability"))
                PROBLEM("supports(%s, CPU): reason \"%s\" does not mention compute capability", GPU[g], why);
            if (!contains(moex_last_error(), "compute capability"))
                PROBLEM("supports(%s, CPU): last error \"%s\" lacks the reason", GPU[g], moex_last_error());
            if (g == 1 && !contains(why, "expert-parallel") && !contains(why, "expert parallel") &&
                !contains(why, "GPUs"))
                PROBLEM("supports(deepgemm_megamoe, CPU): reason \"%s\" says nothing of several "
                         "GPUs / expert-parallel", why);
            /* why == NULL is allowed */
            assert_int_equal(moex_backend_supports(GPU[g], NULL, CPU, NULL, 0), MOEX_ERR_UNSUPPORTED);
        }
    rcase_free(&c);
    end_problems();
}

/* The CPU backends support the CPU; a small why buffer is not overrun. */
static void test_supports_cpu_and_small_buffer(void **state) {
    (void)state;
    rcase c;
    rcase_init(&c, 1, 4, 2, 16, 8, MOEX_F32, 0, 0, 4);
    for (int b = 0; b < 3; b++) {
        assert_int_equal(moex_backend_supports(BUILTINS[b], NULL, CPU, NULL, 0), MOEX_OK);
        assert_int_equal(moex_backend_supports(BUILTINS[b], c.layer, CPU, NULL, 0), MOEX_OK);
    }
    char why[16];
    memset(why, 0x5A, sizeof why);
    assert_int_equal(moex_backend_supports("deepgemm", NULL, CPU, why, 8), MOEX_ERR_UNSUPPORTED);
    assert_true(memchr(why, '\0', 8) != NULL);          /* terminated within 8 bytes */
    for (int i = 8; i < 16; i++) assert_int_equal((unsigned char)why[i], 0x5A);

    char why2[128] = "";
    assert_int_equal(moex_backend_supports("nope_backend", NULL, CPU, why2, sizeof why2),
                     MOEX_ERR_NOT_FOUND);
    if (!contains(moex_last_error(), "grouped_mm"))
        PROBLEM("supports(unknown): message \"%s\" does not list names", moex_last_error());
    rcase_free(&c);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* a user backend                                                            */
/* ------------------------------------------------------------------------ */

/* Register the naive backend, run it through prepare + forward, compare with
 * the reference; the registry copied the struct and the name. */
static void test_user_backend_runs(void **state) {
    (void)state;
    char name[32];
    strcpy(name, "test_naive");
    int before = moex_backend_count();
    moex_backend b = naive_backend(name, &LOG_A);
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    memset(&b, 0, sizeof b);                  /* the struct was copied */
    strcpy(name, "overwritten");              /* and so was the name */
    assert_int_equal(moex_backend_count(), before + 1);
    assert_int_equal(registry_index("test_naive"), before);   /* after the built-ins */
    assert_int_equal(moex_backend_lookup("test_naive"), MOEX_OK);
    assert_string_equal(moex_backend_summary("test_naive"), "naive f32 loops written in test_registry.c");

    rcase c;
    rcase_init(&c, 29, 6, 3, 40, 24, MOEX_F32, 0, 0, 5);
    assert_int_equal(moex_backend_supports("test_naive", c.layer, CPU, NULL, 0), MOEX_OK);
    moex_context *ctx = make_ctx(2, 64);
    moex_status st = moex_prepare(ctx, c.layer, "test_naive");
    if (st != MOEX_OK) PROBLEM("prepare test_naive: %s: %s", moex_status_str(st), moex_last_error());
    assert_int_equal(moex_prepare(ctx, c.layer, "test_naive"), MOEX_OK);       /* idempotent */
    assert_true(LOG_A.prepare >= 1);
    assert_true(moex_context_workspace_bytes(ctx) >= LOG_A.asked_ws);

    st = moex_experts_forward(ctx, c.layer, "test_naive", &c.th, &c.tids, &c.tw, &c.tout);
    if (st != MOEX_OK) PROBLEM("forward test_naive: %s: %s", moex_status_str(st), moex_last_error());
    assert_int_equal(LOG_A.forward, 1);
    assert_int_equal(LOG_A.bad_state, 0);
    assert_int_equal(LOG_A.bad_args, 0);
    assert_int_equal(LOG_A.last_tokens, 29);
    assert_int_equal(LOG_A.last_threads, 2);
    double e = ref_nmse(c.out, MOEX_F32, c.T, 40, 40, c.ref);
    if (!(e <= 1e-10)) PROBLEM("test_naive NMSE %.3g > 1e-10", e);

    /* T == 0 never reaches a backend */
    moex_tensor h0 = c.th, i0 = c.tids, w0 = c.tw, o0 = c.tout;
    h0.shape[0] = i0.shape[0] = w0.shape[0] = o0.shape[0] = 0;
    assert_int_equal(moex_experts_forward(ctx, c.layer, "test_naive", &h0, &i0, &w0, &o0), MOEX_OK);
    assert_int_equal(LOG_A.forward, 1);

    /* a built-in in the same context still works after the user backend */
    assert_int_equal(moex_prepare(ctx, c.layer, "grouped_mm"), MOEX_OK);
    memset(c.out, 0, sizeof(float) * (size_t)(c.T * 40));
    assert_int_equal(moex_experts_forward(ctx, c.layer, "grouped_mm", &c.th, &c.tids, &c.tw, &c.tout), MOEX_OK);
    assert_true(ref_nmse(c.out, MOEX_F32, c.T, 40, 40, c.ref) <= 1e-10);

    moex_context_free(ctx);
    /* every state prepare made was released with the context */
    assert_int_equal(LOG_A.release, LOG_A.prepare);
    assert_int_equal(LOG_A.bad_state, 0);
    rcase_free(&c);
    end_problems();
}

/* A layer the user backend refuses: prepare returns UNSUPPORTED with its reason. */
static void test_user_backend_refuses(void **state) {
    (void)state;
    moex_backend b = naive_backend("test_naive_refuse", &LOG_A);
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    static const struct { moex_dtype dt; int interleaved, bias; } BAD[] = {
        {MOEX_BF16, 0, 0}, {MOEX_F32, 1, 0}, {MOEX_F32, 0, 1}};
    for (size_t i = 0; i < 3; i++) {
        rcase c;
        rcase_init(&c, 3, 4, 2, 16, 8, BAD[i].dt, BAD[i].interleaved, BAD[i].bias, 6 + i);
        moex_context *ctx = make_ctx(1, 8);
        int prepared = LOG_A.prepare;
        moex_status st = moex_prepare(ctx, c.layer, "test_naive_refuse");
        if (st != MOEX_ERR_UNSUPPORTED)
            PROBLEM("case %zu: prepare: %s, want unsupported", i, moex_status_str(st));
        if (!contains(moex_last_error(), NAIVE_REASON))
            PROBLEM("case %zu: prepare message \"%s\" lacks the backend's reason", i, moex_last_error());
        assert_int_equal(LOG_A.prepare, prepared);        /* refused before preparing */

        char why[256] = "";
        assert_int_equal(moex_backend_supports("test_naive_refuse", c.layer, CPU, why, sizeof why),
                         MOEX_ERR_UNSUPPORTED);
        assert_true(contains(why, NAIVE_REASON));

        int forwards = LOG_A.forward;
        memset(c.out, 0x7B, (size_t)(c.T * 16) * 4);
        st = moex_experts_forward(ctx, c.layer, "test_naive_refuse", &c.th, &c.tids, &c.tw, &c.tout);
        if (st != MOEX_ERR_NOT_PREPARED && st != MOEX_ERR_UNSUPPORTED)
            PROBLEM("case %zu: forward after refused prepare: %s", i, moex_status_str(st));
        assert_int_equal(LOG_A.forward, forwards);
        for (size_t j = 0; j < (size_t)(c.T * 16) * 4; j++)
            assert_int_equal(((unsigned char *)c.out)[j], 0x7B);
        moex_context_free(ctx);
        rcase_free(&c);
    }
    assert_int_equal(LOG_A.release, LOG_A.prepare);
    end_problems();
}

/* Only supports() and forward(): the optional functions may be NULL. */
static void test_minimal_backend(void **state) {
    (void)state;
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = "test_minimal";
    b.supports = naive_supports;
    b.forward = naive_forward;
    b.workspace_bytes = naive_workspace;   /* the forward needs a little workspace */
    b.user = &LOG_MIN;
    LOG_MIN.want_state = 0;
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    assert_int_equal(moex_backend_lookup("test_minimal"), MOEX_OK);

    rcase c;
    rcase_init(&c, 5, 3, 2, 8, 8, MOEX_F32, 0, 0, 9);
    moex_context *ctx = make_ctx(1, 5);
    assert_int_equal(moex_prepare(ctx, c.layer, "test_minimal"), MOEX_OK);
    assert_int_equal(moex_experts_forward(ctx, c.layer, "test_minimal", &c.th, &c.tids, &c.tw, &c.tout), MOEX_OK);
    assert_int_equal(LOG_MIN.bad_state, 0);
    assert_int_equal(LOG_MIN.bad_args, 0);
    assert_true(ref_nmse(c.out, MOEX_F32, c.T, 8, 8, c.ref) <= 1e-10);
    moex_context_free(ctx);
    rcase_free(&c);

    /* no summary: listed with NULL or some text, but found */
    assert_true(registry_index("test_minimal") >= 6);
    end_problems();
}

/* A forward that fails: its status comes back from moex_experts_forward. */
static moex_status failing_forward(const moex_forward_args *a, void *user) {
    return MOEX_ERR_INTERNAL;
}

static int always_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why,
                           size_t why_size, void *user) {
    return 1;
}

static void test_failing_backend_status(void **state) {
    (void)state;
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = "test_failing";
    b.supports = always_supports;
    b.forward = failing_forward;
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    rcase c;
    rcase_init(&c, 2, 3, 1, 8, 8, MOEX_F32, 0, 0, 10);
    moex_context *ctx = make_ctx(1, 4);
    assert_int_equal(moex_prepare(ctx, c.layer, "test_failing"), MOEX_OK);
    assert_int_equal(moex_experts_forward(ctx, c.layer, "test_failing", &c.th, &c.tids, &c.tw, &c.tout),
                     MOEX_ERR_INTERNAL);
    /* it said nothing: the message says so, naming the backend and the status */
    if (!contains(moex_last_error(), "backend \"test_failing\": forward failed with status 11 and no message"))
        PROBLEM("forward failed silently: message \"%s\"", moex_last_error());
    moex_context_free(ctx);
    rcase_free(&c);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* what a user backend's functions return                                    */
/* ------------------------------------------------------------------------ */

/* How the "misbehaving" backend answers, set by each case. */
typedef struct misbehave {
    int supports_ret;            /* what supports returns */
    const char *supports_why;    /* written into why (NULL: nothing) */
    const char *supports_fail;   /* NULL, or a message through moex_backend_fail */
    int prepare_ret, forward_ret;
    const char *prepare_fail, *forward_fail;
    int prepares, forwards;
} misbehave;

static int mb_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n, void *user) {
    misbehave *m = user;
    if (m->supports_why) snprintf(why, n, "%s", m->supports_why);
    if (m->supports_fail) moex_backend_fail(MOEX_ERR_UNSUPPORTED, "%s (layer %s)", m->supports_fail, layer ? "given" : "absent");
    return m->supports_ret;
}

static moex_status mb_prepare(moex_context *ctx, const moex_experts_desc *layer, void **state, void *user) {
    misbehave *m = user;
    m->prepares++;
    if (m->prepare_fail) return moex_backend_fail((moex_status)m->prepare_ret, "%s: hidden = %lld", m->prepare_fail,
                                                  (long long)layer->hidden);
    return (moex_status)m->prepare_ret;
}

static moex_status mb_forward(const moex_forward_args *a, void *user) {
    misbehave *m = user;
    m->forwards++;
    if (m->forward_fail) return moex_backend_fail((moex_status)m->forward_ret, "%s", m->forward_fail);
    return (moex_status)m->forward_ret;
}

/* Leave an unrelated message behind, as an earlier failing call would. */
static void stale_message(void) {
    moex_dtype dt;
    assert_int_equal(moex_dtype_parse("stale_unrelated_dtype", &dt), MOEX_ERR_INVALID_ARGUMENT);
}

/* expect status want from prepare (forward == 0) or forward (1) of backend name, a message with needle, no stale
 * text, out untouched */
static void expect_call(rcase *c, const char *name, int forward, moex_status want, const char *needle, const char *what) {
    moex_context *ctx = make_ctx(1, 4);
    moex_status st = MOEX_OK;
    if (forward) {
        st = moex_prepare(ctx, c->layer, name);
        if (st) PROBLEM("%s: prepare failed: %s", what, moex_last_error());
    }
    memset(c->out, 0x7B, sizeof(float) * (size_t)(c->T * 8));
    stale_message();
    st = forward ? moex_experts_forward(ctx, c->layer, name, &c->th, &c->tids, &c->tw, &c->tout)
                 : moex_prepare(ctx, c->layer, name);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", moex_last_error());
    if (st != want) PROBLEM("%s: %s (%d), want %s; message \"%s\"", what, moex_status_str(st), (int)st, moex_status_str(want), msg);
    if (!contains(msg, needle)) PROBLEM("%s: message \"%s\" lacks \"%s\"", what, msg, needle);
    if (contains(msg, "stale_unrelated")) PROBLEM("%s: the stale message \"%s\" was reported", what, msg);
    for (size_t j = 0; j < sizeof(float) * (size_t)(c->T * 8); j++)
        if (((unsigned char *)c->out)[j] != 0x7B) {
            PROBLEM("%s: out written", what);
            break;
        }
    /* a failed prepare keeps nothing: the forward is not prepared */
    if (!forward && st != MOEX_OK &&
        moex_experts_forward(ctx, c->layer, name, &c->th, &c->tids, &c->tw, &c->tout) != MOEX_ERR_NOT_PREPARED)
        PROBLEM("%s: a forward after the failed prepare is not MOEX_ERR_NOT_PREPARED", what);
    moex_context_free(ctx);
}

/* Register backend `name` whose functions do what *M says (zeroed here). */
static void register_misbehaving(const char *name, misbehave *M) {
    memset(M, 0, sizeof *M);
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.supports = mb_supports;
    b.prepare = mb_prepare;
    b.forward = mb_forward;
    b.user = M;
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
}

/* prepare and forward: no message -> one naming the backend; a value that is not a moex_status -> INTERNAL;
 * a message set through moex_backend_fail -> that message, with the status returned. */
static void test_backend_failures_reported(void **state) {
    (void)state;
    static misbehave M;
    register_misbehaving("test_misbehaving", &M);
    rcase c;
    rcase_init(&c, 3, 4, 2, 16, 8, MOEX_F32, 0, 0, 12);
    M.supports_ret = 1;

    M.prepare_ret = MOEX_ERR_INVALID_ARGUMENT;
    expect_call(&c, "test_misbehaving", 0, MOEX_ERR_INVALID_ARGUMENT,
                "backend \"test_misbehaving\": prepare failed with status 1 and no message", "silent prepare");
    M.prepare_ret = 12345;
    expect_call(&c, "test_misbehaving", 0, MOEX_ERR_INTERNAL,
                "backend \"test_misbehaving\" returned 12345, which is not a moex_status", "prepare returns 12345");
    M.prepare_ret = -7;
    expect_call(&c, "test_misbehaving", 0, MOEX_ERR_INTERNAL,
                "backend \"test_misbehaving\" returned -7, which is not a moex_status", "prepare returns -7");
    M.prepare_ret = MOEX_ERR_OUT_OF_MEMORY;
    M.prepare_fail = "test_misbehaving: no room for the packed weights";
    expect_call(&c, "test_misbehaving", 0, MOEX_ERR_OUT_OF_MEMORY, "no room for the packed weights: hidden = 16",
                "prepare with its message");
    M.prepare_ret = 99; /* a message and a bad value: both are told */
    expect_call(&c, "test_misbehaving", 0, MOEX_ERR_INTERNAL,
                "returned 99, which is not a moex_status (from prepare; its message: test_misbehaving: no room",
                "prepare returns 99 with a message");
    M.prepare_fail = NULL;
    M.prepare_ret = MOEX_OK;

    M.forward_ret = MOEX_ERR_DEVICE;
    expect_call(&c, "test_misbehaving", 1, MOEX_ERR_DEVICE,
                "backend \"test_misbehaving\": forward failed with status 7 and no message", "silent forward");
    M.forward_ret = 12345;
    expect_call(&c, "test_misbehaving", 1, MOEX_ERR_INTERNAL,
                "backend \"test_misbehaving\" returned 12345, which is not a moex_status", "forward returns 12345");
    M.forward_ret = -7;
    expect_call(&c, "test_misbehaving", 1, MOEX_ERR_INTERNAL,
                "backend \"test_misbehaving\" returned -7, which is not a moex_status", "forward returns -7");
    M.forward_ret = MOEX_ERR_UNSUPPORTED;
    M.forward_fail = "test_misbehaving: T = 3 is odd";
    expect_call(&c, "test_misbehaving", 1, MOEX_ERR_UNSUPPORTED, "test_misbehaving: T = 3 is odd", "forward with its message");
    M.forward_fail = NULL;

    /* and a well-behaved run still works, leaving an earlier message alone */
    M.forward_ret = MOEX_OK;
    moex_context *ctx = make_ctx(1, 4);
    assert_int_equal(moex_prepare(ctx, c.layer, "test_misbehaving"), MOEX_OK);
    stale_message();
    assert_int_equal(moex_experts_forward(ctx, c.layer, "test_misbehaving", &c.th, &c.tids, &c.tw, &c.tout), MOEX_OK);
    assert_true(contains(moex_last_error(), "stale_unrelated_dtype"));
    moex_context_free(ctx);
    rcase_free(&c);
    end_problems();
}

/* supports: 0 with no reason, 0 with a reason through moex_backend_fail, and values other than 0 and 1. */
static void test_backend_supports_answers(void **state) {
    (void)state;
    static misbehave M;
    register_misbehaving("test_supports_answers", &M);
    rcase c;
    rcase_init(&c, 3, 4, 2, 16, 8, MOEX_F32, 0, 0, 13);
    static const struct { int ret; const char *fail; moex_status want; const char *needle; } CASES[] = {
        {0, NULL, MOEX_ERR_UNSUPPORTED, "backend \"test_supports_answers\" gave no reason"},
        {0, "test_supports_answers needs a GPU", MOEX_ERR_UNSUPPORTED, "test_supports_answers needs a GPU (layer given)"},
        {2, NULL, MOEX_ERR_INTERNAL, "backend \"test_supports_answers\": supports returned 2, which is neither 1"},
        {-1, NULL, MOEX_ERR_INTERNAL, "supports returned -1, which is neither 1"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        M.supports_ret = CASES[i].ret;
        M.supports_fail = CASES[i].fail;
        int prepares = M.prepares;
        moex_context *ctx = make_ctx(1, 4);
        stale_message();
        moex_status st = moex_prepare(ctx, c.layer, "test_supports_answers");
        if (st != CASES[i].want || !contains(moex_last_error(), CASES[i].needle))
            PROBLEM("case %zu: prepare: %s \"%s\", want %s with \"%s\"", i, moex_status_str(st), moex_last_error(),
                    moex_status_str(CASES[i].want), CASES[i].needle);
        if (M.prepares != prepares) PROBLEM("case %zu: prepared although not supported", i);
        char why[256];
        memset(why, 'x', sizeof why);
        stale_message();
        st = moex_backend_supports("test_supports_answers", c.layer, CPU, why, sizeof why);
        if (st != CASES[i].want || !contains(moex_last_error(), CASES[i].needle) || !contains(why, CASES[i].needle))
            PROBLEM("case %zu: supports: %s \"%s\" (why \"%.200s\"), want %s with \"%s\"", i, moex_status_str(st),
                    moex_last_error(), memchr(why, 0, sizeof why) ? why : "(unterminated)", moex_status_str(CASES[i].want),
                    CASES[i].needle);
        moex_context_free(ctx);
    }
    /* a reason written without its terminating NUL is cut, not overrun */
    M.supports_ret = 0;
    M.supports_fail = NULL;
    static char long_reason[600];
    memset(long_reason, 'r', sizeof long_reason - 1);
    M.supports_why = long_reason;
    char why[64];
    assert_int_equal(moex_backend_supports("test_supports_answers", c.layer, CPU, why, sizeof why), MOEX_ERR_UNSUPPORTED);
    assert_non_null(memchr(why, 0, sizeof why));
    assert_true(strlen(moex_last_error()) < 1024);
    rcase_free(&c);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* names and required functions                                              */
/* ------------------------------------------------------------------------ */

/* The same name twice, or a built-in's name: MOEX_ERR_EXISTS naming it. */
static void test_register_twice(void **state) {
    (void)state;
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = "test_twice";
    b.supports = always_supports;
    b.forward = failing_forward;
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    int n = moex_backend_count();
    assert_int_equal(moex_register_backend(&b), MOEX_ERR_EXISTS);
    if (!contains(moex_last_error(), "test_twice"))
        PROBLEM("register twice: message \"%s\" does not name it", moex_last_error());
    for (int i = 0; i < 6; i++) {
        b.name = BUILTINS[i];
        assert_int_equal(moex_register_backend(&b), MOEX_ERR_EXISTS);
    }
    assert_int_equal(moex_backend_count(), n);
    end_problems();
}

/* Names outside [a-z0-9_]{1,63}, and missing supports/forward: INVALID_ARGUMENT. */
static void test_register_bad(void **state) {
    (void)state;
    static const char *const BAD[] = {"", "Upper", "has-dash", "has space", "dot.name",
                                      "caf\xc3\xa9", "tab\t", "slash/name"};
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.supports = always_supports;
    b.forward = failing_forward;
    int n = moex_backend_count();
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        b.name = BAD[i];
        moex_status st = moex_register_backend(&b);
        if (st != MOEX_ERR_INVALID_ARGUMENT)
            PROBLEM("register \"%s\": %s, want invalid argument", BAD[i], moex_status_str(st));
        if (!*moex_last_error()) PROBLEM("register \"%s\": empty message", BAD[i]);
    }
    b.name = NULL;
    assert_int_equal(moex_register_backend(&b), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_register_backend(NULL), MOEX_ERR_INVALID_ARGUMENT);

    char name[80];
    memset(name, 'a', 64);
    name[64] = '\0';                                     /* 64 characters: too long */
    b.name = name;
    assert_int_equal(moex_register_backend(&b), MOEX_ERR_INVALID_ARGUMENT);
    name[63] = '\0';                                     /* 63: the longest allowed */
    name[0] = 'z';
    name[62] = '9';
    assert_int_equal(moex_register_backend(&b), MOEX_OK);
    assert_int_equal(moex_backend_lookup(name), MOEX_OK);
    n++;

    b.name = "test_no_supports";
    b.supports = NULL;
    assert_int_equal(moex_register_backend(&b), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "supports"))
        PROBLEM("missing supports: message \"%s\" does not say so", moex_last_error());
    b.supports = always_supports;
    b.name = "test_no_forward";
    b.forward = NULL;
    assert_int_equal(moex_register_backend(&b), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "forward"))
        PROBLEM("missing forward: message \"%s\" does not say so", moex_last_error());
    assert_int_equal(moex_backend_count(), n);
    assert_int_equal(moex_backend_lookup("test_no_forward"), MOEX_ERR_NOT_FOUND);
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins_listed),
        cmocka_unit_test(test_lookup_unknown),
        cmocka_unit_test(test_gpu_backends_on_cpu),
        cmocka_unit_test(test_supports_cpu_and_small_buffer),
        cmocka_unit_test(test_user_backend_runs),
        cmocka_unit_test(test_user_backend_refuses),
        cmocka_unit_test(test_minimal_backend),
        cmocka_unit_test(test_failing_backend_status),
        cmocka_unit_test(test_backend_failures_reported),
        cmocka_unit_test(test_backend_supports_answers),
        cmocka_unit_test(test_register_twice),
        cmocka_unit_test(test_register_bad),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}
