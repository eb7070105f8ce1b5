/* ep_forward.c — one forward of a rank of an expert-parallel group (moex/experts.h, SPEC R11), on
 * host memory: the front end's checks done, five all-to-alls through the group's transport.
 *
 *   1. headers: each rank tells every rank its status, the rows its workspace can receive, its
 *      layer's sizes and how many rows it sends to each rank, so that every rank sees the whole
 *      [R, R] count matrix and makes the same decision: all go on, or all fail (a rank that
 *      refused its arguments, layers that disagree, a rank that would receive too many rows);
 *   2. the local expert index of every row sent (int32), 3. the rows (the activation dtype);
 *      rows from rank s land as the s-th block, in the order s sent them (ep_exchange.h);
 *   then the received rows, in f32, through this rank's backend on its share of the experts with
 *   top_k 1 and weight 1 (a row is one pair);
 *   4. each rank's backend status (all fail if one did); 5. the results (f32), each block back
 *      to its sender, where they land in the order the rows went;
 *   the combine: out[t] = sum over j of w[t, j] * y[pair (t, j)], in j order, in f32 (the CPU
 *   backends' reduction), then out's dtype. out is written only after the last exchange.
 *
 * Workspace (the context's, 64-byte pieces; P = max_tokens x top_k pairs, N = ranks x P rows):
 *   ids32, pair, local, row_of [P] i32 | send [P, H] activation dtype | y_back [P, H] f32 |
 *   acc [H] f32 | recv_local [N] i32 | ones [N] f32 | recv [N, H] activation dtype |
 *   x [N, H] f32 (recv itself for f32 activations) | y [N, H] f32 | then the backend's own
 *   workspace for N rows of top_k 1. */
#include "backends/cuda/ep_forward_cuda.h"
#include "backends/ep_exchange.h"
#include "experts/dispatch.h"
#include "experts/ep_group.h"
#include "linear/kernels.h"

#include <stdio.h>

enum { H_STATUS, H_CAPACITY, H_EXPERTS, H_HIDDEN, H_TOP_K, H_DTYPE, H_COUNTS }; /* header fields (int64) */

typedef struct ep_scratch { /* the context's ep_scratch */
    int64_t *hdr_send;            /* [H_COUNTS + R] */
    int64_t *hdr_recv;            /* [R, H_COUNTS + R] */
    size_t *send_off, *send_bytes, *recv_off, *recv_bytes; /* [R] each */
    int64_t *count, *offset;      /* rows to each rank [R], where they start in send order [R + 1] */
    int64_t *from_count, *from;   /* rows from each rank [R], where they start among the received ones [R + 1] */
} ep_scratch;

static ep_scratch scratch_of(void *base, int R) {
    char *p = base;
    ep_scratch s;
    const size_t hdr = (size_t)(H_COUNTS + R);
    s.hdr_send = (int64_t *)p, p += hdr * sizeof(int64_t);
    s.hdr_recv = (int64_t *)p, p += (size_t)R * hdr * sizeof(int64_t);
    s.send_off = (size_t *)p, p += (size_t)R * sizeof(size_t);
    s.send_bytes = (size_t *)p, p += (size_t)R * sizeof(size_t);
    s.recv_off = (size_t *)p, p += (size_t)R * sizeof(size_t);
    s.recv_bytes = (size_t *)p, p += (size_t)R * sizeof(size_t);
    s.count = (int64_t *)p, p += (size_t)R * sizeof(int64_t);
    s.offset = (int64_t *)p, p += (size_t)(R + 1) * sizeof(int64_t);
    s.from_count = (int64_t *)p, p += (size_t)R * sizeof(int64_t);
    s.from = (int64_t *)p;
    return s;
}

size_t moex_ep_scratch_bytes(int ranks) {
    const size_t R = (size_t)ranks;
    const size_t host = ((size_t)H_COUNTS + R) * (1 + R) * sizeof(int64_t) + 4 * R * sizeof(size_t) +
                        (4 * R + 2) * sizeof(int64_t);
    const size_t posts = MOEX_EP_CUDA_SCRATCH_BYTES(R); /* a CUDA context's all-gathers */
    return host > posts ? host : posts;
}

int64_t moex_ep_max_rows(int ranks, int64_t max_tokens, int64_t top_k) {
    int64_t pairs, rows;
    if (!moex_mul_ok(max_tokens, top_k, &pairs) || !moex_mul_ok(pairs, ranks, &rows) || rows > INT32_MAX) return -1;
    return rows;
}

/* The exchange's pieces of the workspace. */
typedef struct ep_ws {
    int32_t *ids32, *pair, *local, *row_of, *recv_local;
    float *y_back, *acc, *ones, *x, *y;
    char *send, *recv;
    size_t used; /* bytes, or SIZE_MAX: too large */
} ep_ws;

static void *take(ep_ws *w, char *base, int64_t n, int64_t size) {
    int64_t bytes;
    if (w->used == SIZE_MAX || !moex_mul_ok(n, size, &bytes) || (uint64_t)bytes > SIZE_MAX - 64 - w->used) {
        w->used = SIZE_MAX;
        return NULL;
    }
    void *p = base ? base + w->used : NULL;
    w->used += ((size_t)bytes + 63) & ~(size_t)63;
    return p;
}

/* The pieces for P pairs and N rows of H columns (esz: the activation's bytes) at base (NULL: sizes only). */
static ep_ws carve(char *base, int64_t P, int64_t N, int64_t H, int64_t esz) {
    ep_ws w = {0};
    int64_t PH, NH;
    if (!moex_mul_ok(P, H, &PH) || !moex_mul_ok(N, H, &NH)) {
        w.used = SIZE_MAX;
        return w;
    }
    w.ids32 = take(&w, base, P, 4);
    w.pair = take(&w, base, P, 4);
    w.local = take(&w, base, P, 4);
    w.row_of = take(&w, base, P, 4);
    w.send = take(&w, base, PH, esz);
    w.y_back = take(&w, base, PH, 4);
    w.acc = take(&w, base, H, 4);
    w.recv_local = take(&w, base, N, 4);
    w.ones = take(&w, base, N, 4);
    w.recv = take(&w, base, NH, esz);
    w.x = take(&w, base, NH, 4);
    w.y = take(&w, base, NH, 4);
    return w;
}

size_t moex_ep_exchange_bytes(const moex_experts_desc *share, int64_t max_tokens, int ranks, moex_device_kind where) {
    const int64_t N = moex_ep_max_rows(ranks, max_tokens, share->top_k);
    if (N < 0) return SIZE_MAX;
#if MOEX_HAVE_CUDA
    if (where == MOEX_DEVICE_CUDA) return moex_ep_cuda_exchange_bytes(share, max_tokens, ranks);
#endif
    if (where != MOEX_DEVICE_CPU) return SIZE_MAX;
    return carve(NULL, max_tokens * share->top_k, N, share->hidden, 4).used; /* f32 activations: the most */
}

/* The all-to-all of blocks of `unit` bytes: count_to[r] units from send + at_send[r] units to each
 * rank r, count_from[r] units from each rank into recv + at_recv[r] units. */
static moex_status exchange(moex_ep_group *g, const ep_scratch *s, const void *send, const int64_t *at_send,
                            const int64_t *count_to, void *recv, const int64_t *at_recv, const int64_t *count_from,
                            size_t unit) {
    for (int r = 0; r < g->size; r++) {
        s->send_off[r] = (size_t)at_send[r] * unit;
        s->send_bytes[r] = (size_t)count_to[r] * unit;
        s->recv_off[r] = (size_t)at_recv[r] * unit;
        s->recv_bytes[r] = (size_t)count_from[r] * unit;
    }
    return moex_ep_all_to_all(g, send, s->send_off, s->send_bytes, recv, s->recv_off, s->recv_bytes);
}

/* Every rank sends the same `bytes` from hdr_send to all; rank r's land at hdr_recv + r bytes. */
static moex_status exchange_headers(moex_ep_group *g, const ep_scratch *s, size_t bytes) {
    for (int r = 0; r < g->size; r++) {
        s->send_off[r] = 0;
        s->send_bytes[r] = s->recv_bytes[r] = bytes;
        s->recv_off[r] = (size_t)r * bytes;
    }
    return moex_ep_all_to_all(g, s->hdr_send, s->send_off, s->send_bytes, s->hdr_recv, s->recv_off, s->recv_bytes);
}

/* Every rank's status as the rest see it: each sends `mine` to all. MOEX_OK when all are OK;
 * else this rank's own failure (its message kept) or one naming the first rank that failed. */
static moex_status agree(moex_ep_group *g, const ep_scratch *s, moex_status mine, const char *what) {
    s->hdr_send[0] = mine;
    moex_status st = exchange_headers(g, s, sizeof(int64_t));
    if (st) return st;
    if (mine) return mine;
    for (int r = 0; r < g->size; r++)
        if (s->hdr_recv[r]) return moex_ep_rank_failed(r, g->size, s->hdr_recv[r], what);
    return MOEX_OK;
}

/* The header decision, the same on every rank: MOEX_OK, or why the forward stops everywhere. */
static moex_status decide(const moex_ep_group *g, const ep_scratch *s, moex_status mine) {
    const int R = g->size, n = H_COUNTS + R;
    const int64_t *h0 = s->hdr_recv;
    if (mine) return mine;
    for (int r = 0; r < R; r++)
        if (s->hdr_recv[r * n + H_STATUS])
            return moex_ep_rank_failed(r, R, s->hdr_recv[r * n + H_STATUS], "refused this forward");
    moex_status st = MOEX_OK; /* H_EXPERTS .. H_DTYPE: the four fields moex_ep_same_layer compares */
    for (int r = 1; r < R && !st; r++) st = moex_ep_same_layer(r, s->hdr_recv + r * n + H_EXPERTS, h0 + H_EXPERTS);
    if (st) return st;
    for (int q = 0; q < R; q++) {
        int64_t rows = 0;
        for (int r = 0; r < R; r++) rows += s->hdr_recv[r * n + H_COUNTS + q];
        if (rows > s->hdr_recv[q * n + H_CAPACITY])
            return moex_fail(MOEX_ERR_WORKSPACE, "expert parallelism: rank %d would receive %lld rows, more than the %lld "
                             "its context's workspace holds (ranks x max_tokens x top_k): give every rank's context the "
                             "same max_tokens", q, (long long)rows, (long long)s->hdr_recv[q * n + H_CAPACITY]);
    }
    return MOEX_OK;
}

/* This rank's header and, when its checks passed, its plan. */
static moex_status plan(moex_context *ctx, const moex_experts_desc *d, const moex_tensor *hidden,
                        const moex_tensor *ids, const ep_scratch *s, const ep_ws *w, moex_status checked) {
    const moex_ep_group *g = ctx->options.ep_group;
    int64_t *h = s->hdr_send;
    memset(h, 0, sizeof(int64_t) * (size_t)(H_COUNTS + g->size));
    moex_status st = checked;
    if (!st) {
        const int64_t T = hidden->shape[0], k = d->top_k;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) w->ids32[t * k + j] = (int32_t)moex_id_at(ids, t, j);
        st = moex_ep_dispatch_plan(w->ids32, T, k, k, d->num_experts * g->size, g->size, s->count, s->offset, w->pair,
                                   w->local, w->row_of);
    }
    h[H_STATUS] = st;
    if (st) return st;
    h[H_CAPACITY] = moex_ep_max_rows(g->size, ctx->options.max_tokens, d->top_k);
    h[H_EXPERTS] = d->num_experts;
    h[H_HIDDEN] = d->hidden;
    h[H_TOP_K] = d->top_k;
    h[H_DTYPE] = hidden->dtype;
    for (int r = 0; r < g->size; r++) h[H_COUNTS + r] = s->count[r];
    return MOEX_OK;
}

/* out[t] = sum_j w[t, j] * y_back[row_of[t k + j]] in j order (f32), then out's dtype. */
static void combine(const moex_experts_desc *d, const ep_ws *w, const moex_tensor *weights, moex_tensor *out, int64_t T) {
    const moex_cpu_kernels *kr = moex_cpu_kernels_get();
    const int64_t H = d->hidden, k = d->top_k;
    const size_t esz = moex_dtype_size(out->dtype);
    for (int64_t t = 0; t < T; t++) {
        memset(w->acc, 0, sizeof(float) * (size_t)H);
        for (int64_t j = 0; j < k; j++) {
            const int32_t i = w->row_of[t * k + j];
            if (i >= 0) kr->axpy(moex_weight_at(weights, t, j), w->y_back + (int64_t)i * H, w->acc, H);
        }
        moex_convert(w->acc, MOEX_F32, (char *)out->data + t * out->strides[0] * (int64_t)esz, out->dtype, (size_t)H);
    }
}

/* A group over the caller's transport, at a context's first forward: every rank's device kind, so
 * that CPU and CUDA ranks, whose exchanges differ, all fail alike instead of sending each other
 * messages of other sizes (a local group's contexts are checked as they join it). Agreed once. */
static moex_status same_kinds(moex_context *ctx, moex_ep_group *g) {
    if (g->hub || ctx->ep_kinds_agreed) return MOEX_OK;
    const int64_t mine = ctx->options.device.kind;
    int64_t *all = ctx->ep_scratch; /* R int64: within moex_ep_scratch_bytes' posts */
    moex_status st = moex_ep_all_gather(g, &mine, sizeof mine, all);
    for (int r = 1; r < g->size && !st; r++)
        if (all[r] != all[0])
            st = moex_fail(MOEX_ERR_UNSUPPORTED, "expert parallelism: rank %d's context is on %s, rank 0's on %s: a "
                           "group's ranks are all on the cpu or all on GPUs", r, all[r] == MOEX_DEVICE_CUDA ? "a GPU" : "the cpu",
                           all[0] == MOEX_DEVICE_CUDA ? "a GPU" : "the cpu");
    if (!st) ctx->ep_kinds_agreed = 1;
    return st;
}

moex_status moex_ep_forward(moex_context *ctx, const moex_layer *layer, const moex_backend *b, const moex_prepared *p,
                            const moex_tensor *hidden, const moex_tensor *ids, const moex_tensor *weights,
                            moex_tensor *out, moex_status checked) {
    moex_status kinds = same_kinds(ctx, ctx->options.ep_group);
    if (kinds) return kinds;
#if MOEX_HAVE_CUDA
    if (ctx->options.device.kind == MOEX_DEVICE_CUDA)
        return moex_ep_cuda_forward(ctx, layer, b, p, hidden, ids, weights, out, checked);
#endif
    static const moex_experts_desc none; /* layer NULL: checked says so, and only sizes of 0 are read */
    moex_ep_group *g = ctx->options.ep_group;
    const int R = g->size, me = g->rank, n = H_COUNTS + R;
    const moex_experts_desc *d = layer ? &layer->desc : &none;
    const ep_scratch s = scratch_of(ctx->ep_scratch, R);
    const int64_t T = checked ? 0 : hidden->shape[0], H = d->hidden, k = d->top_k;
    const int64_t esz = checked ? 4 : (int64_t)moex_dtype_size(hidden->dtype);
    const int64_t P_max = ctx->options.max_tokens * k;
    const int64_t N_max = checked ? 0 : moex_ep_max_rows(R, ctx->options.max_tokens, k);
    const ep_ws w = carve(checked ? NULL : ctx->workspace, P_max, N_max, H, esz);
    const size_t mine_bytes = checked ? 0 : moex_ep_exchange_bytes(d, ctx->options.max_tokens, R, MOEX_DEVICE_CPU);

    /* 1. headers, and the decision every rank makes alike */
    const moex_status planned = plan(ctx, d, hidden, ids, &s, &w, checked);
    moex_status st = exchange_headers(g, &s, (size_t)n * sizeof(int64_t));
    if (st || (st = decide(g, &s, planned))) return st;

    /* the rows each rank sends here, and where they land */
    int64_t *from_count = s.from_count;
    s.from[0] = 0;
    for (int r = 0; r < R; r++) {
        from_count[r] = s.hdr_recv[r * n + H_COUNTS + me];
        s.from[r + 1] = s.from[r] + from_count[r];
    }
    const int64_t N = s.from[R], sent = s.offset[R];
    for (int64_t i = 0; i < sent; i++) /* 2 and 3: the rows' local experts, then the rows */
        memcpy(w.send + i * H * esz, (const char *)hidden->data + (w.pair[i] / k) * hidden->strides[0] * esz,
               (size_t)(H * esz));
    if ((st = exchange(g, &s, w.local, s.offset, s.count, w.recv_local, s.from, from_count, sizeof(int32_t))) ||
        (st = exchange(g, &s, w.send, s.offset, s.count, w.recv, s.from, from_count, (size_t)(H * esz))))
        return st;

    /* this rank's experts on the rows it received: f32 rows, one pair each, weight 1 */
    moex_status local = MOEX_OK;
    if (N > 0) {
        float *x = hidden->dtype == MOEX_F32 ? (float *)w.recv : w.x;
        if (x != (float *)w.recv) moex_convert(w.recv, hidden->dtype, x, MOEX_F32, (size_t)(N * H));
        for (int64_t i = 0; i < N; i++) w.ones[i] = 1.0f;
        moex_tensor tx = {0}, ti = {0}, tw = {0}, ty = {0};
        const int64_t xs[2] = {N, H}, is[2] = {N, 1};
        if (!(local = moex_tensor_init(&tx, x, MOEX_F32, 2, xs)) &&
            !(local = moex_tensor_init(&ti, w.recv_local, MOEX_I32, 2, is)) &&
            !(local = moex_tensor_init(&tw, w.ones, MOEX_F32, 2, is)) &&
            !(local = moex_tensor_init(&ty, w.y, MOEX_F32, 2, xs))) {
            moex_forward_args a = {
                .ctx = ctx, .layer = &p->ep_rows->desc, .state = p->state, .hidden = &tx, .ids = &ti, .weights = &tw,
                .out = &ty, .tokens = N, .num_threads = ctx->options.num_threads,
                .workspace = (char *)ctx->workspace + mine_bytes, .workspace_bytes = ctx->workspace_bytes - mine_bytes,
            };
            local = moex_backend_call_forward(b, &a);
        }
    }
    /* 4 and 5: every backend's status, then the results back to where their rows came from */
    if ((st = agree(g, &s, local, "in its backend on the rows it received")) ||
        (st = exchange(g, &s, w.y, s.from, from_count, w.y_back, s.offset, s.count, (size_t)H * sizeof(float))))
        return st;
    combine(d, &w, weights, out, T);
    return MOEX_OK;
}
