/*
 * test_cuda_ep_forward — expert-parallel forwards of CUDA contexts through the public API: R ranks
 * of one group (moex_ep_local_groups), a thread each, every rank's context on the same GPU (its
 * own stream slot) with its share of a layer's experts (weights uploaded once, shares offset
 * into them), each rank forwarding its own tokens with the group's ids:
 *   - eager, batched_mm, grouped_mm and deepgemm_megamoe (its exchange whole, and cut into
 *     pieces of 4 and 7 rows by $MOEX_MEGAMOE_PIECE_ROWS), f32 (SiLU, odd sizes) and bf16 (interleaved gate/up,
 *     biases, the clamped activation), groups of 1 to 4 ranks, a rank with no tokens, i32 and
 *     i64 ids, sentinels: each rank's out against the float64 reference of the whole layer and
 *     against the same backend's forward of the whole layer in a context of its own (f32 NMSE
 *     <= 1e-10; bf16 <= 1e-4: the rows' results are rounded to bf16 before the combine, one
 *     rounding more than on one GPU), and bitwise the same when run again;
 *   - a rank whose tokens exceed its context's max_tokens: every rank fails, that one with its
 *     own message, the others naming it, and no out written; the group works again after;
 *   - deepgemm_megamoe refused by moex_prepare in a context without a group, and by every rank of
 *     a group whose ranks run it and grouped_mm;
 *   - contexts of different max_tokens refused by every rank; a CPU context refused in a group
 *     whose contexts are on the GPU; a bad id reported by moex_context_synchronize on the rank
 *     that sent it;
 *   - first, before this process touches the GPU: ranks in processes of their own (fork), a group
 *     over a transport of the test's (socket pairs) whose contexts share their buffers through
 *     CUDA IPC: groups of 2 and 3 ranks on the one GPU, grouped_mm, eager and deepgemm_megamoe
 *     (in pieces), each rank against
 *     the float64 reference and its own one-GPU forward, bitwise again, a second layer of another
 *     hidden size prepared in the same contexts (the workspace grows, so every peer opens the new
 *     one) and the first layer again; a rank over its max_tokens failing every rank; and a group of
 *     a GPU rank and a CPU rank failing both at their first forward, naming the devices.
 *   test_cuda_ep_forward [--quick] [--device N]     (exit 77: no usable GPU)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ep_ranks.h"
#include "gpu_harness.h"
#include "moex.h"
#include "reference.h"

#define EXIT_SKIP 77
enum { MAXR = 4 };

static int g_gpu;
static int g_hopper; /* compute capability >= 9.0: deepgemm_megamoe runs (its cases are skipped otherwise) */

static moex_device gpu(void) { return (moex_device){MOEX_DEVICE_CUDA, g_gpu}; }

static void *upload(const void *host, size_t bytes) {
    void *p = NULL;
    if (moex_device_alloc(gpu(), bytes ? bytes : 1, &p) != MOEX_OK) {
        fprintf(stderr, "moex_device_alloc(%zu): %s\n", bytes, moex_last_error());
        exit(1);
    }
    if (bytes && moex_memcpy(p, gpu(), host, (moex_device){MOEX_DEVICE_CPU, 0}, bytes) != MOEX_OK) {
        fprintf(stderr, "moex_memcpy: %s\n", moex_last_error());
        exit(1);
    }
    return p;
}

static void download(void *host, const void *dev, size_t bytes) {
    if (bytes && moex_memcpy(host, (moex_device){MOEX_DEVICE_CPU, 0}, dev, gpu(), bytes) != MOEX_OK) {
        fprintf(stderr, "moex_memcpy: %s\n", moex_last_error());
        exit(1);
    }
}

static size_t tensor_bytes(const moex_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n * moex_dtype_size(t->dtype);
}

/* The layer's description over device copies of its stacked weights (dev[4]: the copies). */
static moex_experts_desc device_desc(const moex_experts_desc *host, void *dev[4]) {
    moex_experts_desc d = *host;
    moex_tensor *views[4] = {&d.gate_up, &d.down, &d.gate_up_bias, &d.down_bias};
    for (int i = 0; i < 4; i++) {
        dev[i] = NULL;
        if (!views[i]->data) continue;
        dev[i] = upload(views[i]->data, tensor_bytes(views[i]));
        views[i]->data = dev[i];
        views[i]->device = gpu();
    }
    return d;
}

/* A rank's tokens: host copies (for the reference) and device ones. */
typedef struct rank_data {
    int64_t T;
    moex_dtype dt, id_dt;
    void *x, *ids, *w;          /* host */
    void *dx, *dids, *dw, *dout; /* device */
} rank_data;

static moex_tensor dev_2d(void *p, moex_dtype dt, int64_t rows, int64_t cols) {
    moex_tensor t = ref_tensor_2d(p, dt, rows, cols, cols);
    t.device = gpu();
    return t;
}

/* out's device rows refilled with the 0x7E bytes no forward writes. */
static void mark_out(const rank_data *rd, int64_t H) {
    const size_t bytes = (size_t)(rd->T * H) * moex_dtype_size(rd->dt);
    void *marks = malloc(bytes + 1);
    memset(marks, 0x7E, bytes + 1);
    if (bytes && moex_memcpy(rd->dout, gpu(), marks, (moex_device){MOEX_DEVICE_CPU, 0}, bytes) != MOEX_OK) {
        fprintf(stderr, "moex_memcpy: %s\n", moex_last_error());
        exit(1);
    }
    free(marks);
}

static void make_rank_data(rank_data *rd, ref_rng *rng, int64_t T, int64_t H, int64_t k, int64_t E, moex_dtype dt,
                           moex_dtype id_dt) {
    const size_t esz = moex_dtype_size(dt), isz = moex_dtype_size(id_dt);
    rd->T = T, rd->dt = dt, rd->id_dt = id_dt;
    rd->x = calloc((size_t)(T * H + 1), esz);
    rd->ids = calloc((size_t)(T * k + 1), isz);
    rd->w = calloc((size_t)(T * k + 1), sizeof(float));
    ref_fill_random(rd->x, dt, T * H, 1.0, rng);
    ref_random_routing(rng, T, E, k, id_dt, rd->ids, MOEX_F32, rd->w, 0.15);
    rd->dx = upload(rd->x, (size_t)(T * H) * esz);
    rd->dids = upload(rd->ids, (size_t)(T * k) * isz);
    rd->dw = upload(rd->w, (size_t)(T * k) * sizeof(float));
    rd->dout = upload(rd->x, (size_t)(T * H) * esz);
    mark_out(rd, H);
}

static void free_rank_data(rank_data *rd) {
    free(rd->x), free(rd->ids), free(rd->w);
    moex_device_free(gpu(), rd->dx), moex_device_free(gpu(), rd->dids), moex_device_free(gpu(), rd->dw);
    moex_device_free(gpu(), rd->dout);
}

static void job_views(ep_rank_job *j, const rank_data *rd, int64_t H, int64_t k) {
    j->hidden = dev_2d(rd->dx, rd->dt, rd->T, H);
    j->ids = dev_2d(rd->dids, rd->id_dt, rd->T, k);
    j->weights = dev_2d(rd->dw, MOEX_F32, rd->T, k);
    j->out = dev_2d(rd->dout, rd->dt, rd->T, H);
}

/* The backend that runs what `backend` runs on one GPU without a group: deepgemm_megamoe's
 * compute is grouped_mm's. */
static const char *one_gpu_twin(const char *backend) {
    return strcmp(backend, "deepgemm_megamoe") ? backend : "grouped_mm";
}

/* The whole layer (device views) on one GPU context of its own: out [T, H] on the host. */
static void *one_gpu(const moex_experts_desc *d, const char *ep_backend, const rank_data *rd) {
    const char *backend = one_gpu_twin(ep_backend);
    const size_t esz = moex_dtype_size(rd->dt), bytes = (size_t)(rd->T * d->hidden) * esz;
    void *out = calloc(bytes + 1, 1);
    if (!rd->T) return out;
    moex_layer *layer = NULL;
    moex_context *ctx = NULL;
    moex_context_options o = moex_context_default_options();
    o.device = gpu();
    o.max_tokens = rd->T;
    void *dout = upload(out, bytes);
    ep_rank_job j;
    memset(&j, 0, sizeof j);
    job_views(&j, rd, d->hidden, d->top_k);
    j.out = dev_2d(dout, rd->dt, rd->T, d->hidden);
    if (moex_layer_create(d, &layer) || moex_context_create(&o, &ctx) || moex_prepare(ctx, layer, backend) ||
        moex_experts_forward(ctx, layer, backend, &j.hidden, &j.ids, &j.weights, &j.out) ||
        moex_context_synchronize(ctx))
        fail_at(__FILE__, __LINE__, "%s on one GPU: %s", backend, moex_last_error());
    download(out, dout, bytes);
    moex_device_free(gpu(), dout);
    moex_context_free(ctx);
    moex_layer_free(layer);
    return out;
}

/* R contexts on the GPU, rank r's over its share of dev (device views), max_tokens mt[r]. */
static void open_ranks(ep_rank_job *jobs, moex_ep_group **g, int R, const moex_experts_desc *dev, const int64_t *mt,
                       const char *backend) {
    const int64_t per = dev->num_experts / R;
    if (moex_ep_local_groups(R, g) != MOEX_OK) {
        fprintf(stderr, "moex_ep_local_groups: %s\n", moex_last_error());
        exit(1);
    }
    for (int r = 0; r < R; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        moex_experts_desc s = ref_layer_share(dev, r * per, per);
        moex_context_options o = moex_context_default_options();
        o.device = gpu();
        o.stream_slot = r;
        o.max_tokens = mt[r];
        o.ep_group = g[r];
        jobs[r].backend = backend;
        if (moex_layer_create(&s, &jobs[r].layer) || moex_context_create(&o, &jobs[r].ctx) ||
            moex_prepare(jobs[r].ctx, jobs[r].layer, backend)) {
            fprintf(stderr, "rank %d of %d (%s): %s\n", r, R, backend, moex_last_error());
            exit(1);
        }
    }
}

static void close_ranks(ep_rank_job *jobs, moex_ep_group **g, int R) {
    for (int r = 0; r < R; r++) {
        moex_context_free(jobs[r].ctx);
        moex_layer_free(jobs[r].layer);
        moex_ep_group_free(g[r]);
    }
}

/* Every rank's forward, then its context synchronised (also after a refusal, so that nothing it
 * queued is still running when out is read): statuses into jobs[r].st / msg. */
static void run_and_sync(ep_rank_job *jobs, int R) {
    ep_run_ranks(jobs, R);
    for (int r = 0; r < R; r++) {
        const moex_status st = moex_context_synchronize(jobs[r].ctx);
        if (!jobs[r].st && st) {
            jobs[r].st = st;
            snprintf(jobs[r].msg, sizeof jobs[r].msg, "%s", moex_last_error());
        }
    }
}

/* A rank's out (host, `got`) against the float64 reference of the whole layer L and against
 * backend's forward of the whole layer (dev) on one GPU: f32 NMSE <= 1e-10, else <= 1e-4 (the
 * rows' results are rounded to the activation dtype before the combine). */
static void check_rank_out(const ref_layer *L, const moex_experts_desc *dev, const char *backend, const rank_data *rd,
                           const void *got, const char *what, int r) {
    const moex_experts_desc *full = &L->desc;
    const int64_t T = rd->T, H = full->hidden, k = full->top_k;
    const moex_dtype dt = rd->dt;
    const double bound = dt == MOEX_F32 ? 1e-10 : 1e-4;
    double *ref = calloc((size_t)(T * H + 1), sizeof(double)), *one_d = calloc((size_t)(T * H + 1), sizeof(double));
    const moex_tensor hx = ref_tensor_2d(rd->x, dt, T, H, H), hi = ref_tensor_2d(rd->ids, rd->id_dt, T, k, k),
                      hw = ref_tensor_2d(rd->w, MOEX_F32, T, k, k);
    if (T) ref_experts_forward(full, &hx, &hi, &hw, ref);
    ref_round_all(ref, T * H, dt);
    void *one = one_gpu(dev, backend, rd);
    for (int64_t i = 0; i < T * H; i++) one_d[i] = ref_load(one, dt, i);
    const double e_ref = ref_nmse(got, dt, T, H, H, ref), e_one = ref_nmse(got, dt, T, H, H, one_d);
    CHECK(e_ref <= bound, "%s rank %d: NMSE against the float64 reference %.3g > %.0e", what, r, e_ref, bound);
    CHECK(e_one <= bound, "%s rank %d: NMSE against one GPU's %s %.3g > %.0e", what, r, one_gpu_twin(backend), e_one,
          bound);
    free(ref), free(one), free(one_d);
}

static void check_group(const ref_layer *L, const moex_experts_desc *dev, int R, const char *backend, moex_dtype id_dt,
                        const int64_t *tokens, uint64_t seed, const char *what) {
    const moex_experts_desc *full = &L->desc;
    const int64_t E = full->num_experts, H = full->hidden, k = full->top_k;
    const moex_dtype dt = full->gate_up.dtype;
    ref_rng rng;
    ref_rng_seed(&rng, seed);
    ep_rank_job jobs[MAXR];
    moex_ep_group *g[MAXR];
    rank_data rd[MAXR];
    int64_t mt[MAXR], max_t = 1;
    for (int r = 0; r < R; r++) max_t = tokens[r] > max_t ? tokens[r] : max_t;
    for (int r = 0; r < R; r++) mt[r] = max_t;
    open_ranks(jobs, g, R, dev, mt, backend);
    for (int r = 0; r < R; r++) {
        make_rank_data(&rd[r], &rng, tokens[r], H, k, E, dt, id_dt);
        job_views(&jobs[r], &rd[r], H, k);
    }
    run_and_sync(jobs, R);
    void *first[MAXR];
    for (int r = 0; r < R; r++) {
        const int64_t T = rd[r].T;
        const size_t bytes = (size_t)(T * H) * moex_dtype_size(dt);
        first[r] = calloc(bytes + 1, 1);
        CHECK(!jobs[r].st, "%s rank %d: %s", what, r, jobs[r].msg);
        if (jobs[r].st) continue;
        download(first[r], rd[r].dout, bytes);
        check_rank_out(L, dev, backend, &rd[r], first[r], what, r);
    }
    for (int r = 0; r < R; r++) mark_out(&rd[r], H); /* again, over fresh marks: bitwise the same */
    run_and_sync(jobs, R);
    for (int r = 0; r < R; r++) {
        const size_t bytes = (size_t)(rd[r].T * H) * moex_dtype_size(dt);
        void *again = calloc(bytes + 1, 1);
        if (!jobs[r].st) download(again, rd[r].dout, bytes);
        CHECK(!jobs[r].st && !memcmp(first[r], again, bytes), "%s rank %d: the second run differs (%s)", what, r,
              jobs[r].msg);
        free(again), free(first[r]);
        free_rank_data(&rd[r]);
    }
    close_ranks(jobs, g, R);
}

static void test_matches_one_gpu(void) {
    static const char *const BACKENDS[] = {"eager", "batched_mm", "grouped_mm", "deepgemm_megamoe",
                                           "deepgemm_megamoe", "deepgemm_megamoe"};
    static const char *const PIECES[] = {NULL, NULL, NULL, NULL, "4", "7"}; /* $MOEX_MEGAMOE_PIECE_ROWS */
    static const int64_t TOKENS[MAXR] = {7, 0, 13, 5};
    /* E H I k gated interleaved transposed bias act alpha limit dtype */
    const ref_layer_spec specs[] = {
        {12, 40, 24, 3, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32},
        {12, 64, 48, 3, 1, 1, 0, 1, MOEX_ACT_GPTOSS_CLAMP, 1.702f, 7.0f, MOEX_BF16},
    };
    for (int sp = 0; sp < 2; sp++) {
        ref_layer L;
        ref_layer_build(&L, &specs[sp], 191 + (uint64_t)sp);
        void *dev[4];
        const moex_experts_desc d = device_desc(&L.desc, dev);
        for (int R = 1; R <= MAXR; R++)
            for (int b = 0; b < 6; b++) {
                if (g_quick && R == 3) continue;
                if (!strcmp(BACKENDS[b], "deepgemm_megamoe") && !g_hopper) continue;
                char what[128];
                const moex_dtype id_dt = (R + b) % 2 ? MOEX_I64 : MOEX_I32;
                snprintf(what, sizeof what, "%s%s%s R=%d %s %s ids", BACKENDS[b], PIECES[b] ? " in pieces of " : "",
                         PIECES[b] ? PIECES[b] : "", R, moex_dtype_name(specs[sp].dtype), moex_dtype_name(id_dt));
                if (PIECES[b])
                    setenv("MOEX_MEGAMOE_PIECE_ROWS", PIECES[b], 1);
                else
                    unsetenv("MOEX_MEGAMOE_PIECE_ROWS");
                check_group(&L, &d, R, BACKENDS[b], id_dt, TOKENS, 700u + (uint64_t)(R * 7 + b), what);
            }
        unsetenv("MOEX_MEGAMOE_PIECE_ROWS");
        for (int i = 0; i < 4; i++) moex_device_free(gpu(), dev[i]);
        ref_layer_destroy(&L);
    }
}

/* Refusals in a group of two over one f32 layer's halves. */
static void test_refusals(void) {
    const ref_layer_spec spec = {8, 32, 16, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer L;
    ref_layer_build(&L, &spec, 77);
    void *dev[4];
    const moex_experts_desc d = device_desc(&L.desc, dev);
    const int64_t H = 32, k = 2;
    ref_rng rng;
    ref_rng_seed(&rng, 5);
    ep_rank_job jobs[2];
    moex_ep_group *g[2];
    rank_data rd[2];

    /* rank 1's tokens exceed its max_tokens: both fail, nothing written */
    const int64_t mt[2] = {6, 6}, T[2] = {5, 9};
    open_ranks(jobs, g, 2, &d, mt, "grouped_mm");
    for (int r = 0; r < 2; r++) {
        make_rank_data(&rd[r], &rng, T[r], H, k, 8, MOEX_F32, MOEX_I32);
        job_views(&jobs[r], &rd[r], H, k);
    }
    /* a CPU context cannot join a group whose contexts are on the GPU */
    moex_context_options co = moex_context_default_options();
    co.ep_group = g[0];
    moex_context *cpu_ctx = NULL;
    CHECK(moex_context_create(&co, &cpu_ctx) == MOEX_ERR_UNSUPPORTED && !cpu_ctx &&
              strstr(moex_last_error(), "all on the cpu or all on GPUs"),
          "a CPU context in a GPU group: %s", moex_last_error());
    run_and_sync(jobs, 2);
    CHECK(jobs[1].st == MOEX_ERR_WORKSPACE && strstr(jobs[1].msg, "max_tokens"), "too many tokens: rank 1 got %d (%s)",
          (int)jobs[1].st, jobs[1].msg);
    CHECK(jobs[0].st && strstr(jobs[0].msg, "rank 1 of 2"), "too many tokens: rank 0 got %d (%s)", (int)jobs[0].st,
          jobs[0].msg);
    for (int r = 0; r < 2; r++) {
        const size_t bytes = (size_t)(T[r] * H) * 4;
        unsigned char *got = malloc(bytes);
        download(got, rd[r].dout, bytes);
        size_t written = 0;
        for (size_t i = 0; i < bytes; i++) written += got[i] != 0x7E;
        CHECK(written == 0, "too many tokens: rank %d's out has %zu bytes written", r, written);
        free(got);
    }
    /* the group works again: rank 1 with its first 6 tokens */
    jobs[1].hidden.shape[0] = jobs[1].ids.shape[0] = jobs[1].weights.shape[0] = jobs[1].out.shape[0] = 6;
    run_and_sync(jobs, 2);
    CHECK(!jobs[0].st && !jobs[1].st, "after a refusal: %s / %s", jobs[0].msg, jobs[1].msg);

    /* a bad id on rank 0: its synchronize reports it */
    int32_t bad = 8 * 2 + 5;
    moex_memcpy(rd[0].dids, gpu(), &bad, (moex_device){MOEX_DEVICE_CPU, 0}, sizeof bad);
    run_and_sync(jobs, 2);
    CHECK(jobs[0].st == MOEX_ERR_INVALID_ARGUMENT && strstr(jobs[0].msg, "outside"), "bad id: rank 0 got %d (%s)",
          (int)jobs[0].st, jobs[0].msg);
    CHECK(!jobs[1].st, "bad id on rank 0: rank 1 got %s", jobs[1].msg);
    close_ranks(jobs, g, 2);
    const int32_t good = 3;
    moex_memcpy(rd[0].dids, gpu(), &good, (moex_device){MOEX_DEVICE_CPU, 0}, sizeof good);

    /* deepgemm_megamoe needs a group; ranks of one group run one kind of exchange */
    if (!g_hopper) goto after_megamoe;
    moex_context_options lone = moex_context_default_options();
    lone.device = gpu();
    moex_context *lone_ctx = NULL;
    moex_layer *whole = NULL;
    CHECK(moex_context_create(&lone, &lone_ctx) == MOEX_OK && moex_layer_create(&d, &whole) == MOEX_OK, "%s",
          moex_last_error());
    CHECK(moex_prepare(lone_ctx, whole, "deepgemm_megamoe") == MOEX_ERR_UNSUPPORTED &&
              strstr(moex_last_error(), "this context has none") && strstr(moex_last_error(), "grouped_mm"),
          "deepgemm_megamoe without a group: %s", moex_last_error());
    moex_context_free(lone_ctx);
    moex_layer_free(whole);
    setenv("MOEX_MEGAMOE_PIECE_ROWS", "4", 1);
    open_ranks(jobs, g, 2, &d, mt, "grouped_mm");
    CHECK(moex_prepare(jobs[1].ctx, jobs[1].layer, "deepgemm_megamoe") == MOEX_OK, "%s", moex_last_error());
    jobs[1].backend = "deepgemm_megamoe";
    for (int r = 0; r < 2; r++) job_views(&jobs[r], &rd[r], H, k);
    jobs[1].hidden.shape[0] = jobs[1].ids.shape[0] = jobs[1].weights.shape[0] = jobs[1].out.shape[0] = 6;
    run_and_sync(jobs, 2);
    for (int r = 0; r < 2; r++)
        CHECK(jobs[r].st == MOEX_ERR_INVALID_ARGUMENT && strstr(jobs[r].msg, "one backend"),
              "grouped_mm beside deepgemm_megamoe: rank %d got %d (%s)", r, (int)jobs[r].st, jobs[r].msg);
    jobs[1].backend = "grouped_mm"; /* and the group works again */
    run_and_sync(jobs, 2);
    CHECK(!jobs[0].st && !jobs[1].st, "after mixed backends: %s / %s", jobs[0].msg, jobs[1].msg);
    close_ranks(jobs, g, 2);
    unsetenv("MOEX_MEGAMOE_PIECE_ROWS");
after_megamoe:;

    /* contexts of different max_tokens: every rank refuses */
    const int64_t mt2[2] = {6, 7};
    open_ranks(jobs, g, 2, &d, mt2, "eager");
    for (int r = 0; r < 2; r++) job_views(&jobs[r], &rd[r], H, k);
    jobs[1].hidden.shape[0] = jobs[1].ids.shape[0] = jobs[1].weights.shape[0] = jobs[1].out.shape[0] = 6;
    run_and_sync(jobs, 2);
    for (int r = 0; r < 2; r++)
        CHECK(jobs[r].st == MOEX_ERR_INVALID_ARGUMENT && strstr(jobs[r].msg, "same max_tokens"),
              "different max_tokens: rank %d got %d (%s)", r, (int)jobs[r].st, jobs[r].msg);
    close_ranks(jobs, g, 2);
    for (int r = 0; r < 2; r++) free_rank_data(&rd[r]);
    for (int i = 0; i < 4; i++) moex_device_free(gpu(), dev[i]);
    ref_layer_destroy(&L);
}

/* ---- ranks in processes ------------------------------------------------------------------- */

/* The test's transport: rank me's socket to each rank q (fd[q]; fd[me] unused). Each rank writes
 * its block for rank me+s and then reads the block of rank me-s, s = 1 .. R-1: enough for the
 * few hundred bytes a CUDA rank's all-gathers move (a socket buffer holds far more). */
typedef struct sock_transport {
    int R, me, fd[MAXR];
} sock_transport;

static int io_all(int fd, void *p, size_t n, int writing) {
    char *c = p;
    while (n) {
        const ssize_t got = writing ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
        if (got <= 0) return -1;
        c += got, n -= (size_t)got;
    }
    return 0;
}

static moex_status sock_all_to_all(void *user, const void *send, const size_t *send_offset, const size_t *send_bytes,
                                   void *recv, const size_t *recv_offset, const size_t *recv_bytes) {
    const sock_transport *t = user;
    memcpy((char *)recv + recv_offset[t->me], (const char *)send + send_offset[t->me], send_bytes[t->me]);
    for (int s = 1; s < t->R; s++) {
        const int to = (t->me + s) % t->R, from = (t->me + t->R - s) % t->R;
        if (io_all(t->fd[to], (char *)send + send_offset[to], send_bytes[to], 1) ||
            io_all(t->fd[from], (char *)recv + recv_offset[from], recv_bytes[from], 0))
            return moex_backend_fail(MOEX_ERR_IO, "the test's socket to rank %d or %d failed", to, from);
    }
    return MOEX_OK;
}

/* One rank's forward of rd (its views in j) and the checks of its out against the float64
 * reference of L and against the same backend on one GPU; out kept in *first (host). */
static void process_rank_check(const ref_layer *L, const moex_experts_desc *dev, ep_rank_job *j, const rank_data *rd,
                               const char *what, int me) {
    const int64_t H = L->desc.hidden;
    const size_t bytes = (size_t)(rd->T * H) * moex_dtype_size(rd->dt);
    void *first = calloc(bytes + 1, 1), *again = calloc(bytes + 1, 1);
    for (int run = 0; run < 2; run++) {
        mark_out(rd, H);
        j->st = moex_experts_forward(j->ctx, j->layer, j->backend, &j->hidden, &j->ids, &j->weights, &j->out);
        if (!j->st) j->st = moex_context_synchronize(j->ctx);
        CHECK(!j->st, "%s rank %d, run %d: %s", what, me, run, moex_last_error());
        if (j->st) break;
        download(run ? again : first, rd->dout, bytes);
    }
    if (!j->st) {
        CHECK(!memcmp(first, again, bytes), "%s rank %d: the second run differs", what, me);
        check_rank_out(L, dev, j->backend, rd, first, what, me);
    }
    free(first), free(again);
}

/* Rank me of R in a process of its own: the whole run of test_processes' one rank. Exit status 0,
 * 1 (a check failed) or EXIT_SKIP. */
static int process_rank(int R, int me, sock_transport *t, const char *backend) {
    moex_device_info info;
    if (moex_device_query(gpu(), &info) != MOEX_OK || !info.available) return EXIT_SKIP;
    if (!strcmp(backend, "deepgemm_megamoe") && info.cc_major < 9) return EXIT_SKIP; /* every rank alike */
    const moex_ep_transport tr = {sock_all_to_all, NULL, t};
    moex_ep_group *g = NULL;
    if (moex_ep_group_create(R, me, &tr, &g)) {
        fprintf(stderr, "rank %d: moex_ep_group_create: %s\n", me, moex_last_error());
        return 1;
    }
    /* E H I k gated interleaved transposed bias act alpha limit dtype: two layers, the second
     * with a larger hidden size, so that preparing it grows the workspace */
    const ref_layer_spec specs[2] = {
        {12, 40, 24, 3, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32},
        {12, 200, 72, 2, 1, 1, 0, 1, MOEX_ACT_GPTOSS_CLAMP, 1.702f, 7.0f, MOEX_BF16},
    };
    static const int64_t TOKENS[MAXR] = {9, 4, 0, 6};
    ref_layer L[2];
    void *dev[2][4];
    moex_experts_desc d[2];
    ep_rank_job j[2];
    moex_context *ctx = NULL;
    moex_context_options o = moex_context_default_options();
    o.device = gpu();
    o.max_tokens = 10;
    o.ep_group = g;
    if (moex_context_create(&o, &ctx)) {
        fprintf(stderr, "rank %d: moex_context_create: %s\n", me, moex_last_error());
        return 1;
    }
    ref_rng rng;
    ref_rng_seed(&rng, 900u + (uint64_t)(me * 31 + R));
    rank_data rd[2];
    char what[96];
    for (int l = 0; l < 2; l++) {
        ref_layer_build(&L[l], &specs[l], 60 + (uint64_t)l); /* the same layer on every rank */
        d[l] = device_desc(&L[l].desc, dev[l]);
        const int64_t per = d[l].num_experts / R;
        moex_experts_desc share = ref_layer_share(&d[l], me * per, per);
        memset(&j[l], 0, sizeof j[l]);
        j[l].ctx = ctx, j[l].backend = backend;
        if (moex_layer_create(&share, &j[l].layer) || moex_prepare(ctx, j[l].layer, backend)) {
            fprintf(stderr, "rank %d: layer %d: %s\n", me, l, moex_last_error());
            return 1;
        }
        make_rank_data(&rd[l], &rng, TOKENS[me] + l, specs[l].H, specs[l].k, specs[l].E, specs[l].dtype,
                       l ? MOEX_I64 : MOEX_I32);
        job_views(&j[l], &rd[l], specs[l].H, specs[l].k);
        /* the first layer once before the second is prepared: every peer opens the first workspace */
        if (l == 0) {
            snprintf(what, sizeof what, "processes R=%d %s, layer 1", R, backend);
            process_rank_check(&L[0], &d[0], &j[0], &rd[0], what, me);
        }
    }
    snprintf(what, sizeof what, "processes R=%d %s, layer 2", R, backend);
    process_rank_check(&L[1], &d[1], &j[1], &rd[1], what, me);
    snprintf(what, sizeof what, "processes R=%d %s, layer 1 again", R, backend);
    process_rank_check(&L[0], &d[0], &j[0], &rd[0], what, me);
    /* rank R-1 over its max_tokens: every rank fails, the others naming it, out not written */
    ep_rank_job big = j[0];
    moex_tensor x = big.hidden, ids = big.ids, w = big.weights, out = big.out;
    void *huge[4] = {NULL, NULL, NULL, NULL};
    if (me == R - 1) {
        const int64_t T = 11, H = specs[0].H, k = specs[0].k;
        moex_device_alloc(gpu(), (size_t)(T * H) * 4, &huge[0]), moex_device_alloc(gpu(), (size_t)(T * k) * 4, &huge[1]);
        moex_device_alloc(gpu(), (size_t)(T * k) * 4, &huge[2]), moex_device_alloc(gpu(), (size_t)(T * H) * 4, &huge[3]);
        x = dev_2d(huge[0], MOEX_F32, T, H), ids = dev_2d(huge[1], MOEX_I32, T, k);
        w = dev_2d(huge[2], MOEX_F32, T, k), out = dev_2d(huge[3], MOEX_F32, T, H);
    }
    mark_out(&rd[0], specs[0].H);
    const moex_status st = moex_experts_forward(ctx, big.layer, backend, &x, &ids, &w, &out);
    const char *msg = moex_last_error();
    if (me == R - 1)
        CHECK(st == MOEX_ERR_WORKSPACE, "processes: rank %d over max_tokens got %d (%s)", me, (int)st, msg);
    else
        CHECK(st && strstr(msg, "rank"), "processes: rank %d, another over max_tokens: got %d (%s)", me, (int)st, msg);
    moex_context_synchronize(ctx);
    if (me != R - 1) {
        const size_t bytes = (size_t)(rd[0].T * specs[0].H) * 4;
        unsigned char *got = malloc(bytes + 1);
        download(got, rd[0].dout, bytes);
        size_t written = 0;
        for (size_t i = 0; i < bytes; i++) written += got[i] != 0x7E;
        CHECK(written == 0, "processes: a refused forward wrote %zu bytes of rank %d's out", written, me);
        free(got);
    }
    for (int i = 0; i < 4; i++) moex_device_free(gpu(), huge[i]);
    moex_context_free(ctx);
    for (int l = 0; l < 2; l++) {
        moex_layer_free(j[l].layer);
        free_rank_data(&rd[l]);
        for (int i = 0; i < 4; i++) moex_device_free(gpu(), dev[l][i]);
        ref_layer_destroy(&L[l]);
    }
    moex_ep_group_free(g);
    return g_failures ? 1 : 0;
}

/* Rank me of 2 in a process of its own, rank 0's context on the GPU and rank 1's on the CPU: the
 * first forward fails on both, naming the two devices, instead of their exchanges of other sizes
 * meeting. */
static int process_rank_mixed(int me, sock_transport *t) {
    moex_device_info info;
    if (moex_device_query(gpu(), &info) != MOEX_OK || !info.available) return EXIT_SKIP;
    const moex_ep_transport tr = {sock_all_to_all, NULL, t};
    moex_ep_group *g = NULL;
    const ref_layer_spec spec = {4, 24, 16, 2, 1, 0, 0, 0, MOEX_ACT_SILU, 1.702f, 7.0f, MOEX_F32};
    ref_layer L;
    ref_layer_build(&L, &spec, 61);
    void *dev[4] = {NULL, NULL, NULL, NULL};
    const moex_experts_desc d = me == 0 ? device_desc(&L.desc, dev) : L.desc;
    moex_experts_desc share = ref_layer_share(&d, me * 2, 2);
    moex_context_options o = moex_context_default_options();
    if (me == 0) o.device = gpu();
    o.max_tokens = 4;
    moex_layer *layer = NULL;
    moex_context *ctx = NULL;
    if (moex_ep_group_create(2, me, &tr, &g) || (o.ep_group = g, moex_context_create(&o, &ctx)) ||
        moex_layer_create(&share, &layer) || moex_prepare(ctx, layer, "eager")) {
        fprintf(stderr, "mixed, rank %d: %s\n", me, moex_last_error());
        return 1;
    }
    ref_rng rng;
    ref_rng_seed(&rng, 62u + (uint64_t)me);
    rank_data rd;
    make_rank_data(&rd, &rng, 3, 24, 2, 4, MOEX_F32, MOEX_I32);
    ep_rank_job j;
    memset(&j, 0, sizeof j);
    if (me == 0) {
        job_views(&j, &rd, 24, 2);
    } else {
        j.hidden = ref_tensor_2d(rd.x, MOEX_F32, 3, 24, 24), j.ids = ref_tensor_2d(rd.ids, MOEX_I32, 3, 2, 2);
        j.weights = ref_tensor_2d(rd.w, MOEX_F32, 3, 2, 2), j.out = ref_tensor_2d(rd.x, MOEX_F32, 3, 24, 24);
    }
    const moex_status st = moex_experts_forward(ctx, layer, "eager", &j.hidden, &j.ids, &j.weights, &j.out);
    CHECK(st == MOEX_ERR_UNSUPPORTED && strstr(moex_last_error(), "all on the cpu or all on GPUs"),
          "mixed devices, rank %d: got %d (%s)", me, (int)st, moex_last_error());
    moex_context_free(ctx);
    moex_layer_free(layer);
    free_rank_data(&rd);
    for (int i = 0; i < 4; i++) moex_device_free(gpu(), dev[i]);
    ref_layer_destroy(&L);
    moex_ep_group_free(g);
    return g_failures ? 1 : 0;
}

/* Groups of 2 and 3 ranks, a process each (forked before this process uses the GPU), connected by
 * socket pairs. Returns 1 when every rank skipped (no usable GPU). */
static int test_processes(void) {
    static const char *const BACKENDS[4] = {"grouped_mm", "eager", NULL, "deepgemm_megamoe"};
    int skipped = 0, runs = 0;
    for (int run = 0; run < 4; run++) { /* 2 ranks, 3 ranks, 2 ranks on a GPU and the CPU, 3 ranks */
        const int R = run == 1 || run == 3 ? 3 : 2;
        int fds[MAXR][MAXR];
        for (int a = 0; a < R; a++)
            for (int b = a + 1; b < R; b++) {
                int sv[2];
                if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
                    perror("socketpair");
                    exit(1);
                }
                fds[a][b] = sv[0], fds[b][a] = sv[1];
            }
        pid_t pid[MAXR];
        for (int r = 0; r < R; r++) {
            fflush(NULL);
            if ((pid[r] = fork()) < 0) {
                perror("fork");
                exit(1);
            }
            if (pid[r] == 0) {
                g_checks = g_failures = 0; /* this rank's own (the parent's checks so far are the parent's) */
                alarm(150);                /* a rank left waiting for a dead one ends the test */
                if (run == 3) setenv("MOEX_MEGAMOE_PIECE_ROWS", "3", 1); /* its exchange in pieces */
                sock_transport t = {R, r, {-1, -1, -1, -1}};
                for (int q = 0; q < R; q++)
                    for (int p2 = 0; p2 < R; p2++)
                        if (p2 != q && q != r) close(fds[q][p2]);
                for (int q = 0; q < R; q++)
                    if (q != r) t.fd[q] = fds[r][q];
                const int rc = run == 2 ? process_rank_mixed(r, &t) : process_rank(R, r, &t, BACKENDS[run]);
                if (rc != EXIT_SKIP)
                        printf("test_cuda_ep_forward (processes, rank %d of %d): %d checks, %d failed\n", r, R, g_checks,
                           g_failures);
                fflush(stdout);
                _exit(rc);
            }
        }
        for (int a = 0; a < R; a++)
            for (int b = 0; b < R; b++)
                if (a != b) close(fds[a][b]);
        for (int r = 0; r < R; r++) {
            int status = 0;
            waitpid(pid[r], &status, 0);
            const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            runs++;
            if (rc == EXIT_SKIP) {
                skipped++;
                continue;
            }
            CHECK(rc == 0, "processes: rank %d of %d exited with %d", r, R, rc);
        }
    }
    return skipped == runs;
}

int main(int argc, char **argv) {
    if (gpu_test_args("test_cuda_ep_forward", argc, argv, &g_quick, &g_gpu)) return 2;
    if (test_processes()) {
        printf("SKIP: cuda:%d is not usable (ranks in processes)\n", g_gpu);
        return EXIT_SKIP;
    }
    moex_device_info info;
    if (moex_device_query(gpu(), &info) != MOEX_OK || !info.available) {
        printf("SKIP: cuda:%d is not usable: %s\n", g_gpu, info.reason);
        return EXIT_SKIP;
    }
    g_hopper = info.cc_major >= 9;
    test_matches_one_gpu();
    test_refusals();
    printf("test_cuda_ep_forward: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
