/* ep_forward_cuda.cu — one forward of a rank of an expert-parallel group on a CUDA device (see
 * ep_forward_cuda.h), for ranks in one process, on one GPU or several (peer access between each
 * two: moex_ep_group_bind), and for ranks in processes of one machine (below). R ranks, each
 * with its share of E experts (E/R a rank), P = T k pairs a rank, blocks of cap = max_tokens x top_k rows (the most pairs
 * one rank can send anywhere), N = R cap rows a rank may receive. On the rank's stream:
 *
 *   1. the plan (ep_plan.h: count [R], row_of [P], local [R cap]) and the rows to send,
 *      send [R cap, H] (block q: the rows for rank q, in pair order), gathered from hidden by
 *      row_of; event "rows posted";
 *   2. host all-gather of every rank's post (status, sizes, pair count T k, buffers, event):
 *      every rank decides alike whether the forward goes on (statuses, layer sizes, capacities,
 *      one kind of exchange);
 *   3. from each rank r, after its "rows posted": block me of its local ids (the sentinel E/R
 *      past its count) and its count[me] rows of block me of send (moex_ep_dev_copy_blocks: the
 *      count read on the device), to recv_local and recv at row at[r] = T_0 k + ... + T_(r-1) k
 *      (no rank sends one rank more than its T k rows), so that M = sum_r T_r k rows, not R cap;
 *   4. this rank's backend on its share over those M rows (top_k 1, weight 1; rows past each
 *      rank's count carry the sentinel and are skipped) into y [M, H];
 *   5. its results pushed back: rank r's count[me] rows of y from at[r] into block me of rank
 *      r's send buffer (which holds them as y_back from then on: the rows that were there went to
 *      this rank alone, in step 3); event "results pushed" (recorded whatever failed before it);
 *   (deepgemm_megamoe's large forwards do steps 3 to 5 in pieces on two more streams, with the
 *   counts on the host: see "deepgemm_megamoe" below);
 *   6. host all-gather of the backends' statuses (all fail if one did) and the events;
 *   7. after every rank's "results pushed": out[t] = sum over j of w[t, j] y_back[row_of[t k +
 *      j]] in j order, in f32 (routing_reduce), stored in out's dtype.
 *
 * Order between ranks and forwards: every read of another rank's buffers (its plan and rows in
 * step 3, its count in step 5) and every write into them (step 5) is queued on the reader's or
 * writer's stream before its "results pushed"; each rank waits for all of those (step 7) before
 * its next forward rewrites anything, so no layout (other layers, other sizes) can overlap a
 * transfer still running. A rank records "rows posted" again only after the second all-gather,
 * by which every rank has queued its waits on the first record, and "results pushed" again only
 * after the next forward's first all-gather, by which every rank has queued its step-7 waits.
 *
 * Ranks in processes of their own (a group over the caller's transport, e.g. MPI ranks of one
 * machine): the same steps, with each post carrying the context's workspace as a CUDA IPC memory
 * handle, its buffers as offsets into it, and its two events as IPC event handles (events made
 * with cudaEventInterprocess). Each rank opens every peer's handles at its first forward and
 * keeps them (ep_peers) until the peer's workspace changes; in a forward where some rank's
 * handles changed, the ranks agree on their opens (one more all-gather) before any copy between
 * them. A rank never frees memory it shared while others may hold it open: a replaced workspace
 * is kept until the context is freed, which then waits for every rank to close what it opened
 * (moex_ep_cuda_peers_free). The events are recorded and waited on as above, so the order
 * between ranks and forwards is the same.
 *
 * Workspace (the context's, device; 256-byte pieces): plan | send/y_back [N, H] | recv [N, H]
 * (activation dtype, sized for f32) | recv_local [N] i32 | ones [N] f32 | y [N, H] | the
 * backend's own workspace (for N rows: the most that can come). */
#include "backends/cuda/ep_forward_cuda.h"
#include "backends/cuda/ep_plan.h"
#include "backends/cuda/routing.cuh"
#include "backends/ep_exchange.h"
#include "core/gpu_runtime.h"
#include "experts/ep_group.h"
#include "gpu/cuda_check.h"

#include <stdlib.h>
#include <string.h>

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* A rank's workspace and events as other processes open them. */
typedef struct ep_share {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t ev[2];
} ep_share;

/* What a rank posts in each all-gather. */
typedef struct ep_post {
    int64_t status, capacity; /* capacity: cap, the rows of a block */
    int64_t pairs;            /* T k: the most rows this rank sends any one rank in this forward */
    int64_t overlap;          /* its backend overlaps the exchange (deepgemm_megamoe): the same on every rank */
    int64_t piece_rows;       /* deepgemm_megamoe: its megamoe_piece_rows(); rank 0's decides for all */
    int64_t layer[4];         /* experts, hidden, top_k, activation dtype (moex_ep_same_layer) */
    const int32_t *count, *local;                            /* the plan's [R] and [R cap] */
    const char *send, *y;                                    /* [N, H] each */
    void *event;                                             /* cudaEvent_t: "rows posted", then "results pushed" */
    ep_share share; /* ranks in processes: the buffers above are then offsets into the workspace */
} ep_post;
static_assert(sizeof(ep_post) <= MOEX_EP_CUDA_POST_BYTES, "a post must fit its share of ep_scratch");

/* What a rank in a process of its own keeps of its peers (the context's ep_peers). */
typedef struct ep_peer {
    cudaIpcMemHandle_t mem; /* the handle base was opened from */
    char *base;             /* NULL: not open */
    cudaIpcEventHandle_t evh[2];
    cudaEvent_t ev[2];
    ep_share last; /* rank r's share at the last forward whose opens every rank agreed on */
} ep_peer;
typedef struct ep_peers {
    int ranks;
    int agreed;         /* some forward's opens were agreed on (the same on every rank) */
    const void *own_ws; /* the workspace own.mem was made for (NULL: none shared yet) */
    int own_events;     /* own.ev made */
    ep_share own;
    void **retired;     /* workspaces this rank shared and then replaced, freed with the context */
    int n_retired;
    int64_t *status_all; /* [ranks]: the agreement's all-gather */
    ep_peer peer[];
} ep_peers;

extern "C" moex_status moex_ep_cuda_peers_new(int ranks, void **out) {
    ep_peers *pp = (ep_peers *)calloc(1, sizeof(ep_peers) + (size_t)ranks * sizeof(ep_peer));
    int64_t *st = (int64_t *)calloc((size_t)ranks, sizeof(int64_t));
    if (!pp || !st) {
        free(pp), free(st);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "expert parallelism: out of memory (%d ranks' handles)", ranks);
    }
    pp->ranks = ranks;
    pp->status_all = st;
    *out = pp;
    return MOEX_OK;
}

extern "C" moex_status moex_ep_cuda_peers_retire(void *peers, void *workspace, int *kept) {
    ep_peers *pp = (ep_peers *)peers;
    *kept = 0;
    if (!pp || !workspace || pp->own_ws != workspace) return MOEX_OK; /* never shared: the caller frees it */
    void **grown = (void **)realloc(pp->retired, (size_t)(pp->n_retired + 1) * sizeof(void *));
    if (!grown) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "expert parallelism: out of memory (a replaced workspace)");
    pp->retired = grown;
    pp->retired[pp->n_retired++] = workspace;
    pp->own_ws = NULL;
    *kept = 1;
    return MOEX_OK;
}

extern "C" void moex_ep_cuda_peers_free(void *peers, int device, moex_ep_group *g) {
    ep_peers *pp = (ep_peers *)peers;
    if (!pp) return;
    const int on = moex_cuda_use(device) == MOEX_OK;
    if (on) cudaDeviceSynchronize(); /* nothing queued here still reads or writes a peer's memory */
    for (int r = 0; r < pp->ranks && on; r++) {
        ep_peer *q = &pp->peer[r];
        if (q->base) cudaIpcCloseMemHandle(q->base);
        for (int i = 0; i < 2; i++)
            if (q->ev[i]) cudaEventDestroy(q->ev[i]);
    }
    /* once the ranks have opened each other's memory, none frees what it shared before every rank
     * has closed what it opened: the last collective of the group */
    if (pp->agreed) moex_ep_all_gather(g, &pp->agreed, 1, pp->status_all);
    for (int i = 0; i < pp->n_retired && on; i++) cudaFree(pp->retired[i]);
    free(pp->retired);
    free(pp->status_all);
    free(pp);
}

/* Ranks in processes of their own (a group over the caller's transport) share through CUDA IPC; a
 * group of one shares nothing. */
static int in_processes(const moex_ep_group *g) { return g->hub == NULL && g->size > 1; }

/* A process rank's post: its workspace's and events' handles (made again only when the workspace
 * moved), and its buffers as offsets into the workspace. */
static moex_status share_post(moex_context *ctx, ep_post *post) {
    ep_peers *pp = (ep_peers *)ctx->ep_peers;
    moex_status st = MOEX_OK;
    if (pp->own_ws != ctx->workspace) {
        pp->own_ws = NULL;
        st = moex_cuda_status(cudaIpcGetMemHandle(&pp->own.mem, ctx->workspace), "cudaIpcGetMemHandle (the workspace)");
        if (!st) pp->own_ws = ctx->workspace;
    }
    for (int i = 0; i < 2 && !st && !pp->own_events; i++)
        st = moex_cuda_status(cudaIpcGetEventHandle(&pp->own.ev[i], (cudaEvent_t)ctx->ep_events[i]),
                              "cudaIpcGetEventHandle");
    if (!st) pp->own_events = 1;
    post->share = pp->own;
    const char *base = (const char *)ctx->workspace;
    post->count = (const int32_t *)((const char *)post->count - base);
    post->local = (const int32_t *)((const char *)post->local - base);
    post->send -= (intptr_t)base, post->y -= (intptr_t)base;
    post->event = NULL;
    return st;
}

/* Rank r's handles opened in this process (again when they changed: its workspace moved). */
static moex_status open_peer(ep_peer *q, const ep_share *sh, int r, cudaStream_t s) {
    moex_status st = MOEX_OK;
    if (!q->base || memcmp(&q->mem, &sh->mem, sizeof sh->mem)) {
        if (q->base) { /* this rank's earlier copies from the old mapping end first */
            st = moex_cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize");
            cudaIpcCloseMemHandle(q->base);
            q->base = NULL;
        }
        void *b = NULL;
        const cudaError_t e = st ? cudaSuccess : cudaIpcOpenMemHandle(&b, sh->mem, cudaIpcMemLazyEnablePeerAccess);
        if (!st && e != cudaSuccess) {
            cudaGetLastError();
            return moex_fail(MOEX_ERR_DEVICE, "expert parallelism: opening rank %d's workspace through CUDA IPC failed "
                             "(%s): the ranks of a group over a transport of the caller's each need a process of their "
                             "own, on GPUs of one machine that can reach each other (ranks in one process: "
                             "moex_ep_local_groups)", r, cudaGetErrorString(e));
        }
        if (st) return st;
        q->base = (char *)b;
        q->mem = sh->mem;
    }
    for (int i = 0; i < 2; i++) {
        if (q->ev[i] && !memcmp(&q->evh[i], &sh->ev[i], sizeof sh->ev[i])) continue;
        if (q->ev[i]) cudaEventDestroy(q->ev[i]);
        q->ev[i] = NULL;
        if ((st = moex_cuda_status(cudaIpcOpenEventHandle(&q->ev[i], sh->ev[i]), "cudaIpcOpenEventHandle"))) return st;
        q->evh[i] = sh->ev[i];
    }
    return MOEX_OK;
}

/* When some rank's share differs from the last agreed forward's (the same test on every rank: the
 * posts are the same everywhere), every rank's open status, so that all fail before any copy
 * between them when one could not open the others' memory (another machine, say). Otherwise every
 * share was opened before and nothing was opened now. */
static moex_status agree_opens(ep_peers *pp, moex_ep_group *g, const ep_post *all, int R, moex_status opened) {
    int changed = !pp->agreed;
    for (int r = 0; r < R && !changed; r++) changed = memcmp(&pp->peer[r].last, &all[r].share, sizeof(ep_share)) != 0;
    if (!changed) return opened;
    const int64_t mine = opened;
    moex_status st = moex_ep_all_gather(g, &mine, sizeof mine, pp->status_all);
    if (st || opened) return st ? st : opened;
    for (int r = 0; r < R; r++)
        if (pp->status_all[r])
            return moex_ep_rank_failed(r, R, pp->status_all[r],
                                       "could not open the other ranks' buffers through CUDA IPC (ranks in processes "
                                       "must be on GPUs of one machine that reach each other)");
    for (int r = 0; r < R; r++) pp->peer[r].last = all[r].share;
    pp->agreed = 1;
    return MOEX_OK;
}

/* The posts of ranks in processes as pointers of this one: every peer's handles opened, the
 * offsets turned into its mapping's addresses, each post's event its "rows posted". */
static moex_status open_posts(moex_context *ctx, ep_post *all, int R, int me, cudaStream_t s) {
    ep_peers *pp = (ep_peers *)ctx->ep_peers;
    moex_status st = MOEX_OK;
    for (int r = 0; r < R && !st; r++) {
        const char *base = (const char *)ctx->workspace;
        if (r != me) {
            if ((st = open_peer(&pp->peer[r], &all[r].share, r, s))) break;
            base = pp->peer[r].base;
        }
        all[r].count = (const int32_t *)(base + (intptr_t)all[r].count);
        all[r].local = (const int32_t *)(base + (intptr_t)all[r].local);
        all[r].send = base + (intptr_t)all[r].send, all[r].y = base + (intptr_t)all[r].y;
        all[r].event = r == me ? ctx->ep_events[0] : (void *)pp->peer[r].ev[0];
    }
    return st;
}

typedef struct ep_dev_ws {
    moex_ep_dev_plan plan;
    char *send, *recv, *y; /* send doubles as y_back */
    int32_t *recv_local;
    float *ones;
    size_t used; /* bytes, or SIZE_MAX: too large */
} ep_dev_ws;

/* The pieces for R ranks, P pairs, blocks of cap rows of H values of esz bytes, at base (NULL:
 * sizes only). */
static ep_dev_ws carve(char *base, int R, int64_t P, int64_t cap, int64_t H, int64_t esz) {
    ep_dev_ws w;
    memset(&w, 0, sizeof w);
    int64_t N, NH, bytes;
    if (!moex_mul_ok(cap, R, &N) || !moex_mul_ok(N, H, &NH) || !moex_mul_ok(NH, esz, &bytes) ||
        (uint64_t)bytes > SIZE_MAX / 8) {
        w.used = SIZE_MAX;
        return w;
    }
    const size_t rows = align256((size_t)bytes), ints = align256((size_t)N * 4);
    size_t at = align256(moex_ep_dev_plan_bytes(R, P, cap));
    if (base) w.plan = moex_ep_dev_plan_carve(base, R, P, cap);
    char *b = base;
    w.send = b ? b + at : NULL, at += rows;
    w.recv = b ? b + at : NULL, at += rows;
    w.recv_local = b ? (int32_t *)(b + at) : NULL, at += ints;
    w.ones = b ? (float *)(b + at) : NULL, at += ints;
    w.y = b ? b + at : NULL, at += rows;
    w.used = at;
    return w;
}

size_t moex_ep_cuda_exchange_bytes(const moex_experts_desc *share, int64_t max_tokens, int ranks) {
    const int64_t N = moex_ep_max_rows(ranks, max_tokens, share->top_k);
    if (N < 0) return SIZE_MAX;
    return carve(NULL, ranks, max_tokens * share->top_k, max_tokens * share->top_k, share->hidden, 4).used;
}

__global__ void ones_kernel(float *v, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        v[i] = 1.0f;
}

/* The decision after the first all-gather, the same on every rank. */
static moex_status decide(const moex_ep_group *g, const ep_post *all, moex_status mine) {
    const int R = g->size;
    if (mine) return mine;
    for (int r = 0; r < R; r++)
        if (all[r].status) return moex_ep_rank_failed(r, R, all[r].status, "refused this forward");
    moex_status st = MOEX_OK;
    for (int r = 1; r < R && !st; r++) {
        if ((st = moex_ep_same_layer(r, all[r].layer, all[0].layer))) break;
        if (all[r].capacity != all[0].capacity)
            st = moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                           "expert parallelism: rank %d's blocks hold %lld rows (max_tokens x top_k), rank 0's %lld: "
                           "on a GPU every rank's context needs the same max_tokens", r, (long long)all[r].capacity,
                           (long long)all[0].capacity);
    }
    for (int r = 1; r < R && !st; r++)
        if (all[r].overlap != all[0].overlap)
            st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert parallelism: rank %d's backend %s the exchange with its "
                           "compute (deepgemm_megamoe) and rank 0's %s: every rank runs one backend", r,
                           all[r].overlap ? "overlaps" : "does not overlap", all[0].overlap ? "does" : "does not");
    for (int r = 0; r < R && !st; r++)
        if (all[r].pairs < 0 || all[r].pairs > all[r].capacity)
            st = moex_fail(MOEX_ERR_INTERNAL, "expert parallelism: rank %d posted %lld pairs for blocks of %lld rows", r,
                           (long long)all[r].pairs, (long long)all[r].capacity);
    return st;
}

/* Steps 1 (this rank's plan and rows) when its checks passed; the post either way. */
static moex_status post_rows(moex_context *ctx, const moex_experts_desc *d, const moex_tensor *hidden,
                             const moex_tensor *ids, const ep_dev_ws *w, int64_t cap, cudaStream_t s, ep_post *post) {
    const moex_ep_group *g = ctx->options.ep_group;
    const int64_t T = hidden->shape[0], k = d->top_k;
    moex_status st = moex_ep_dev_plan_build(ids->data, ids->dtype == MOEX_I64, ids->strides[0], T, k,
                                            d->num_experts * g->size, g->size, cap, &w->plan, ctx->device_flags, s);
    if (!st && T > 0) {
        routing_dev r;
        memset(&r, 0, sizeof r);
        r.pair_slot = w->plan.row_of;
        st = routing_gather(r, T, k, hidden->data, hidden->dtype, hidden->strides[0], w->send, hidden->dtype,
                            d->hidden, s);
    }
    if (!st) st = moex_cuda_status(cudaEventRecord((cudaEvent_t)ctx->ep_events[0], s), "cudaEventRecord");
    post->status = st;
    post->capacity = cap;
    post->pairs = T * k;
    post->layer[0] = d->num_experts, post->layer[1] = d->hidden, post->layer[2] = k, post->layer[3] = hidden->dtype;
    post->count = w->plan.count;
    post->local = w->plan.local;
    post->send = w->send;
    post->y = w->y;
    post->event = ctx->ep_events[0];
    return st;
}

/* ---- steps 3 to 5 -------------------------------------------------------------------------
 *
 * The rows rank r sends here land in recv (their local ids in recv_local, their results in y) at
 * row at[r], the sum of what the ranks before it may send here, so that the backend runs over
 * the rows that can come rather than R cap: plain EP packs by the pair counts the ranks posted
 * (rank r sends any one rank at most T_r k rows), deepgemm_megamoe's pieces by the exact counts. */

/* Rows [first, first + rows) of rank r's block for this rank, at recv row at + first. */
typedef struct ep_piece {
    int r;
    int64_t first, rows, at;
} ep_piece;

/* Rank r's local ids of a piece, whole (the sentinel past its device count), and its rows below
 * that count (a kernel: the count is on the device), into recv_local and recv. */
static moex_status pull_piece(const ep_post *all, int me, const ep_dev_ws *w, int64_t cap, int64_t row_bytes,
                              ep_piece c, cudaStream_t s) {
    const ep_post *q = &all[c.r];
    moex_status st = moex_cuda_status(cudaMemcpyAsync(w->recv_local + c.at + c.first, q->local + me * cap + c.first,
                                                      (size_t)c.rows * sizeof(int32_t), cudaMemcpyDefault, s),
                                      "copying a rank's local expert ids");
    if (!st)
        st = moex_ep_dev_copy_blocks(q->count + me, 1, c.rows, q->send + (me * cap + c.first) * row_bytes, 0,
                                     w->recv + (c.at + c.first) * row_bytes, 0, row_bytes, s);
    return st;
}

/* The backend over `rows` rows at x (their local experts at ids, weight 1 each) into y. */
static moex_status run_rows(moex_context *ctx, const moex_backend *b, const moex_prepared *p, const ep_dev_ws *w,
                            const void *x, const int32_t *ids, void *y, int64_t rows, int64_t H, moex_dtype dt,
                            size_t exchange) {
    moex_tensor tx, ti, tw, ty;
    const int64_t xs[2] = {rows, H}, is[2] = {rows, 1};
    moex_status st = moex_tensor_init(&tx, (void *)x, dt, 2, xs);
    if (!st) st = moex_tensor_init(&ti, (void *)ids, MOEX_I32, 2, is);
    if (!st) st = moex_tensor_init(&tw, w->ones, MOEX_F32, 2, is);
    if (!st) st = moex_tensor_init(&ty, y, dt, 2, xs);
    for (int i = 0; i < 4 && !st; i++) {
        moex_tensor *t = i == 0 ? &tx : i == 1 ? &ti : i == 2 ? &tw : &ty;
        t->device = ctx->options.device;
    }
    if (!st) {
        moex_forward_args a;
        memset(&a, 0, sizeof a);
        a.ctx = ctx, a.layer = &p->ep_rows->desc, a.state = p->state, a.hidden = &tx, a.ids = &ti, a.weights = &tw;
        a.out = &ty, a.tokens = rows, a.num_threads = 0;
        a.workspace = (char *)ctx->workspace + exchange, a.workspace_bytes = ctx->workspace_bytes - exchange;
        st = moex_backend_call_forward(b, &a);
    }
    return st;
}

/* w->ones[0, n) = 1: the rows' routing weights. */
static moex_status fill_ones(const ep_dev_ws *w, int64_t n, cudaStream_t s) {
    if (n <= 0) return MOEX_OK;
    ones_kernel<<<(unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024), 256, 0, s>>>(w->ones, n);
    return MOEX_CUDA_LAUNCHED("filling the rows' weights");
}

/* Plain EP, all on the rank's stream: from each rank r, after its "rows posted", its rows for this
 * rank (block me of its local ids and send buffer) at at[r]; the backend over them all; the
 * results back into block me of each rank's send buffer. */
static moex_status exchange_whole(moex_context *ctx, const moex_backend *b, const moex_prepared *p, const ep_post *all,
                                  int R, int me, const ep_dev_ws *w, int64_t cap, int64_t row_bytes, int64_t H,
                                  moex_dtype dt, size_t exchange, cudaStream_t s) {
    moex_status st = MOEX_OK;
    int64_t M = 0;
    for (int r = 0; r < R && !st; M += all[r].pairs, r++) {
        if (!all[r].pairs) continue;
        const ep_piece c = {r, 0, all[r].pairs, M};
        st = moex_cuda_status(cudaStreamWaitEvent(s, (cudaEvent_t)all[r].event, 0), "cudaStreamWaitEvent");
        if (!st) st = pull_piece(all, me, w, cap, row_bytes, c, s);
    }
    if (!st) st = fill_ones(w, M, s);
    if (!st && M) st = run_rows(ctx, b, p, w, w->recv, w->recv_local, w->y, M, H, dt, exchange);
    int64_t at = 0;
    for (int r = 0; r < R && !st; at += all[r].pairs, r++)
        if (all[r].pairs)
            st = moex_ep_dev_copy_blocks(all[r].count + me, 1, all[r].pairs, w->y + at * row_bytes, 0,
                                         (char *)all[r].send + me * cap * row_bytes, 0, row_bytes, s);
    return st;
}

/* ---- deepgemm_megamoe: the exchange in pieces beside the backend ---------------------------------
 *
 * Each rank learns its plan's counts on the host (one wait for its stream a forward) and the ranks
 * all-gather them, so every transfer has its exact size and goes to the copy engines (NVLink
 * between GPUs), which run beside the backend's persistent kernels where copies made by kernels
 * would wait for free SMs. The rows from each rank are cut into pieces; this rank's own rows come
 * first, in place in its send buffer, so its tensor cores start at once; then rank me + 1's,
 * me + 2's, ... (each rank pulls from a different one at a time):
 *
 *   pull stream:    [ids + rows of piece 1] [piece 2] [piece 3] ...      "pulled" each
 *   rank's stream:  [backend on piece 0] [piece 1] [piece 2] ...         each after its "pulled"
 *   push stream:    [results of piece 0] [piece 1] ...                   each after its "computed"
 *
 * The rank's stream then waits for both side streams before "results pushed", so the order
 * between ranks and forwards is plain EP's. */

/* Rows of one piece: a sender's rows for this rank are cut into pieces of about this many rows
 * (a block below twice this is one piece, and at most MEGAMOE_MAX_PIECES a block): enough rows
 * that a piece's GEMMs still fill the GPU (each piece reads its experts' weights again), enough
 * pieces that the transfers of one hide under the GEMMs of another. Forwards where every rank's
 * blocks are below this (decode sizes) take plain EP's exchange: their transfers are small, and
 * one backend call reads the weights once. A starting point, not measured on several GPUs yet.
 * $MOEX_MEGAMOE_PIECE_ROWS overrides it (the tests cut small forwards into pieces with it). */
#define MEGAMOE_PIECE_ROWS 8192
#define MEGAMOE_MAX_PIECES 4

static int64_t megamoe_piece_rows(void) {
    return moex_env_int("MOEX_MEGAMOE_PIECE_ROWS", 1, INT32_MAX, MEGAMOE_PIECE_ROWS);
}

/* Whether a forward whose ranks posted these pair counts runs in pieces: some rank may send one
 * rank at least a piece's rows, rank 0's piece (the same decision on every rank, whatever its own
 * environment says: the posts are the same everywhere). */
static int megamoe_in_pieces(const ep_post *all, int R) {
    for (int r = 0; r < R; r++)
        if (all[r].pairs >= all[0].piece_rows) return 1;
    return 0;
}

/* The pieces of n rows: one below two pieces' rows, else n / piece up to MEGAMOE_MAX_PIECES. */
static int64_t megamoe_pieces_of(int64_t n) {
    const int64_t m = n / megamoe_piece_rows();
    return m < 1 ? 1 : m > MEGAMOE_MAX_PIECES ? MEGAMOE_MAX_PIECES : m;
}

/* A context's side streams, events and host counts (the context's ep_pipe), made at its first
 * forward in pieces. */
typedef struct ep_pipe {
    int ranks, device;
    cudaStream_t pull, push;
    cudaEvent_t begin, pulls_done, pushes_done;
    cudaEvent_t *pulled, *computed; /* [ranks x MEGAMOE_MAX_PIECES] */
} ep_pipe;

extern "C" void moex_ep_cuda_pipe_free(void *pipe) {
    ep_pipe *pp = (ep_pipe *)pipe;
    if (!pp) return;
    if (moex_cuda_use(pp->device) == MOEX_OK) { /* (else the device is gone, and its streams with it) */
        for (int i = 0; i < 2; i++) { /* what is queued on them ends first */
            cudaStream_t q = i ? pp->push : pp->pull;
            if (q) cudaStreamSynchronize(q), cudaStreamDestroy(q);
        }
        cudaEvent_t single[3] = {pp->begin, pp->pulls_done, pp->pushes_done};
        for (int i = 0; i < 3; i++)
            if (single[i]) cudaEventDestroy(single[i]);
        for (int i = 0; i < pp->ranks * MEGAMOE_MAX_PIECES; i++) {
            if (pp->pulled && pp->pulled[i]) cudaEventDestroy(pp->pulled[i]);
            if (pp->computed && pp->computed[i]) cudaEventDestroy(pp->computed[i]);
        }
    }
    free(pp->pulled), free(pp->computed);
    free(pp);
}

static moex_status pipe_get(moex_context *ctx, int R, ep_pipe **out) {
    if (ctx->ep_pipe) {
        *out = (ep_pipe *)ctx->ep_pipe;
        return MOEX_OK;
    }
    const size_t n = (size_t)R * MEGAMOE_MAX_PIECES;
    ep_pipe *pp = (ep_pipe *)calloc(1, sizeof *pp);
    if (pp) {
        pp->ranks = R, pp->device = ctx->options.device.index;
        pp->pulled = (cudaEvent_t *)calloc(n, sizeof(cudaEvent_t));
        pp->computed = (cudaEvent_t *)calloc(n, sizeof(cudaEvent_t));
    }
    if (!pp || !pp->pulled || !pp->computed) {
        moex_ep_cuda_pipe_free(pp);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "deepgemm_megamoe: out of memory (%d ranks' pieces)", R);
    }
    moex_status st = MOEX_OK;
    for (int i = 0; i < 2 && !st; i++)
        st = moex_cuda_status(cudaStreamCreateWithFlags(i ? &pp->push : &pp->pull, cudaStreamNonBlocking),
                              "cudaStreamCreate (deepgemm_megamoe's copies)");
    cudaEvent_t *single[3] = {&pp->begin, &pp->pulls_done, &pp->pushes_done};
    for (int i = 0; i < 3 && !st; i++)
        st = moex_cuda_status(cudaEventCreateWithFlags(single[i], cudaEventDisableTiming), "cudaEventCreate");
    for (size_t i = 0; i < n && !st; i++) {
        st = moex_cuda_status(cudaEventCreateWithFlags(&pp->pulled[i], cudaEventDisableTiming), "cudaEventCreate");
        if (!st)
            st = moex_cuda_status(cudaEventCreateWithFlags(&pp->computed[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    if (st) {
        moex_ep_cuda_pipe_free(pp);
        return st;
    }
    ctx->ep_pipe = pp;
    *out = pp;
    return MOEX_OK;
}

/* The context's ep_scratch past the posts (MOEX_EP_CUDA_SCRATCH_BYTES): the counts' all-gather. */
typedef struct ep_counts {
    int64_t *mine; /* [R + 1]: this rank's status, then the rows it sends each rank */
    int64_t *all;  /* [R, R + 1]: every rank's */
    int32_t *plan; /* [R]: this rank's plan counts as they came from the device */
} ep_counts;

static ep_counts counts_of(moex_context *ctx, int R) {
    char *at = (char *)ctx->ep_scratch + (size_t)R * MOEX_EP_CUDA_POST_BYTES;
    ep_counts c;
    c.mine = (int64_t *)at, at += (size_t)(R + 1) * sizeof(int64_t);
    c.all = (int64_t *)at, at += (size_t)R * (R + 1) * sizeof(int64_t);
    c.plan = (int32_t *)at;
    return c;
}

/* This rank's plan counts on the host (once its stream has run the plan: a wait for it),
 * all-gathered with its status into c->all. Every rank takes part whatever it found, and all fail
 * alike when one failed. */
static moex_status gather_counts(moex_context *ctx, const ep_counts *c, const ep_dev_ws *w, int R, moex_status mine,
                                 cudaStream_t s) {
    if (!mine)
        mine = moex_cuda_status(cudaMemcpyAsync(c->plan, w->plan.count, (size_t)R * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, s),
                                "copying the plan's counts to the host");
    if (!mine) mine = moex_cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize (the plan's counts)");
    c->mine[0] = mine;
    for (int r = 0; r < R; r++) c->mine[1 + r] = mine ? 0 : c->plan[r];
    moex_status st = moex_ep_all_gather(ctx->options.ep_group, c->mine, (size_t)(R + 1) * sizeof(int64_t), c->all);
    if (st || mine) return st ? st : mine;
    for (int r = 0; r < R; r++)
        if (c->all[(int64_t)r * (R + 1)])
            return moex_ep_rank_failed(r, R, c->all[(int64_t)r * (R + 1)], "could not read its plan's counts");
    return MOEX_OK;
}

/* Queue everything a piece needs: its pull (another rank's rows), its backend call, its push. */
static moex_status queue_piece(moex_context *ctx, const moex_backend *b, const moex_prepared *p, const ep_post *all,
                               int me, const ep_dev_ws *w, ep_pipe *pp, int i, ep_piece c, int64_t cap,
                               int64_t row_bytes, int64_t H, moex_dtype dt, size_t exchange, cudaStream_t s) {
    const size_t from = (size_t)((me * cap + c.first) * row_bytes), here = (size_t)((c.at + c.first) * row_bytes);
    const char *x = w->send + from;                      /* this rank's own rows: in place */
    const int32_t *ids = w->plan.local + me * cap + c.first;
    moex_status st = MOEX_OK;
    if (c.r != me) {
        st = moex_cuda_status(cudaMemcpyAsync(w->recv_local + c.at + c.first, all[c.r].local + me * cap + c.first,
                                              (size_t)c.rows * sizeof(int32_t), cudaMemcpyDefault, pp->pull),
                              "copying a rank's local expert ids");
        if (!st)
            st = moex_cuda_status(cudaMemcpyAsync(w->recv + here, all[c.r].send + from, (size_t)(c.rows * row_bytes),
                                                  cudaMemcpyDefault, pp->pull),
                                  "copying a rank's rows");
        if (!st) st = moex_cuda_status(cudaEventRecord(pp->pulled[i], pp->pull), "cudaEventRecord");
        if (!st) st = moex_cuda_status(cudaStreamWaitEvent(s, pp->pulled[i], 0), "cudaStreamWaitEvent");
        x = w->recv + here, ids = w->recv_local + c.at + c.first;
    }
    if (!st) st = run_rows(ctx, b, p, w, x, ids, w->y + here, c.rows, H, dt, exchange);
    if (!st) st = moex_cuda_status(cudaEventRecord(pp->computed[i], s), "cudaEventRecord");
    if (!st) st = moex_cuda_status(cudaStreamWaitEvent(pp->push, pp->computed[i], 0), "cudaStreamWaitEvent");
    if (!st)
        st = moex_cuda_status(cudaMemcpyAsync((char *)all[c.r].send + from, w->y + here, (size_t)(c.rows * row_bytes),
                                              cudaMemcpyDefault, pp->push),
                              "copying results back to their rank");
    return st;
}

/* deepgemm_megamoe's steps 3 to 5 (counts gathered): the pieces queued on the three streams; then
 * the rank's stream waits for both side streams, whatever was queued. */
static moex_status exchange_in_pieces(moex_context *ctx, const moex_backend *b, const moex_prepared *p,
                                      const ep_post *all, int R, int me, const ep_dev_ws *w, ep_pipe *pp,
                                      const ep_counts *counts, int64_t cap, int64_t row_bytes, int64_t H, moex_dtype dt,
                                      size_t exchange, cudaStream_t s) {
    const int64_t *n_from = counts->all + 1 + me; /* n_from[r (R + 1)]: rows rank r sends here */
    int64_t M = 0;
    for (int r = 0; r < R; r++) M += n_from[(int64_t)r * (R + 1)];
    moex_status st = moex_cuda_status(cudaEventRecord(pp->begin, s), "cudaEventRecord");
    for (int i = 0; i < 2 && !st; i++) /* recv and y: the last forward's backend and pushes are done with them */
        st = moex_cuda_status(cudaStreamWaitEvent(i ? pp->push : pp->pull, pp->begin, 0), "cudaStreamWaitEvent");
    if (!st) st = fill_ones(w, M, s);
    int piece = 0;
    for (int j = 0; j < R && !st; j++) {
        const int r = (me + j) % R;
        int64_t at = 0;
        for (int q = 0; q < r; q++) at += n_from[(int64_t)q * (R + 1)];
        const int64_t n = n_from[(int64_t)r * (R + 1)], m = n ? megamoe_pieces_of(n) : 0;
        if (r != me && n) /* its rows are posted before they are pulled (a slower rank holds up only its own) */
            st = moex_cuda_status(cudaStreamWaitEvent(pp->pull, (cudaEvent_t)all[r].event, 0), "cudaStreamWaitEvent");
        for (int64_t i = 0; i < m && !st; i++) {
            const int64_t first = n * i / m;
            const ep_piece c = {r, first, n * (i + 1) / m - first, at};
            if (c.rows) st = queue_piece(ctx, b, p, all, me, w, pp, piece++, c, cap, row_bytes, H, dt, exchange, s);
        }
    }
    const moex_status ended[4] = {
        moex_cuda_status(cudaEventRecord(pp->pulls_done, pp->pull), "cudaEventRecord"),
        moex_cuda_status(cudaEventRecord(pp->pushes_done, pp->push), "cudaEventRecord"),
        moex_cuda_status(cudaStreamWaitEvent(s, pp->pulls_done, 0), "cudaStreamWaitEvent"),
        moex_cuda_status(cudaStreamWaitEvent(s, pp->pushes_done, 0), "cudaStreamWaitEvent")};
    for (int i = 0; i < 4 && !st; i++) st = ended[i];
    return st;
}

extern "C" moex_status moex_ep_cuda_forward(moex_context *ctx, const moex_layer *layer, const moex_backend *b,
                                            const moex_prepared *p, const moex_tensor *hidden, const moex_tensor *ids,
                                            const moex_tensor *weights, moex_tensor *out, moex_status checked) {
    static const moex_experts_desc none = {}; /* layer NULL: checked says so, and only sizes of 0 are read */
    moex_ep_group *g = ctx->options.ep_group;
    const int R = g->size, me = g->rank;
    const moex_experts_desc *d = layer ? &layer->desc : &none;
    ep_post *all = (ep_post *)ctx->ep_scratch, mine;
    memset(&mine, 0, sizeof mine);
    const int64_t k = d->top_k, H = d->hidden, cap = ctx->options.max_tokens * k;
    if (!checked && ctx->capturing)
        checked = moex_fail(MOEX_ERR_UNSUPPORTED, "expert parallelism on a GPU: a forward cannot be captured in a "
                            "graph (its ranks meet on the host twice a forward)");
    if (!checked) checked = moex_cuda_use(ctx->options.device.index);
    const cudaStream_t s = (cudaStream_t)ctx->stream;
    const int64_t esz = checked ? 4 : (int64_t)moex_dtype_size(hidden->dtype), row_bytes = H * esz;
    const size_t exchange = moex_ep_cuda_exchange_bytes(d, ctx->options.max_tokens, R);
    const ep_dev_ws w = carve(checked ? NULL : (char *)ctx->workspace, R, cap, cap, H, esz);

    /* 1 and 2: this rank's rows, the posts, and the decision every rank makes alike */
    moex_status st = checked;
    mine.status = checked;
    mine.overlap = !checked && moex_dispatch_overlaps_exchange(b, MOEX_DEVICE_CUDA, d);
    mine.piece_rows = megamoe_piece_rows();
    if (!st) st = post_rows(ctx, d, hidden, ids, &w, cap, s, &mine);
    if (in_processes(g) && !st) mine.status = st = share_post(ctx, &mine);
    moex_status gathered = moex_ep_all_gather(g, &mine, sizeof mine, all);
    if (gathered || (gathered = decide(g, all, st))) return gathered;

    /* 3, 4 and 5: the rows for this rank, its backend on them, the results back to their ranks */
    if (in_processes(g) &&
        (st = agree_opens((ep_peers *)ctx->ep_peers, g, all, R, open_posts(ctx, all, R, me, s))))
        return st;
    moex_status local;
    if (all[0].overlap && megamoe_in_pieces(all, R)) {
        ep_pipe *pp = NULL;
        const ep_counts counts = counts_of(ctx, R);
        /* the pipe is made on every rank before the counts' all-gather, which reports a failure to all */
        local = gather_counts(ctx, &counts, &w, R, pipe_get(ctx, R, &pp), s);
        if (local) return local; /* every rank failed alike, before any copy between them */
        local = exchange_in_pieces(ctx, b, p, all, R, me, &w, pp, &counts, cap, row_bytes, H, hidden->dtype, exchange,
                                   s);
    } else {
        local = exchange_whole(ctx, b, p, all, R, me, &w, cap, row_bytes, H, hidden->dtype, exchange, s);
    }
    /* "results pushed", recorded even after a failure: the copies queued before it read and write
     * other ranks' memory, and they wait for this event before reusing it */
    const moex_status recorded =
        moex_cuda_status(cudaEventRecord((cudaEvent_t)ctx->ep_events[1], s), "cudaEventRecord");
    if (!local) local = recorded;

    /* 6 and 7: the statuses and events; every rank's results here, the combine */
    memset(&mine, 0, sizeof mine);
    mine.status = local;
    mine.event = ctx->ep_events[1];
    if ((st = moex_ep_all_gather(g, &mine, sizeof mine, all))) return st;
    if (in_processes(g)) /* the peers' "results pushed" as this process opened them (NULL: never opened) */
        for (int r = 0; r < R; r++)
            all[r].event = r == me ? ctx->ep_events[1] : (void *)((ep_peers *)ctx->ep_peers)->peer[r].ev[1];
    /* the waits whatever the statuses: the ranks that went on have written into this rank's send
     * buffer, and the next forward must not rewrite it before they are done */
    moex_status waited = MOEX_OK;
    for (int r = 0; r < R; r++)
        if (!waited && all[r].event)
            waited = moex_cuda_status(cudaStreamWaitEvent(s, (cudaEvent_t)all[r].event, 0), "cudaStreamWaitEvent");
    if (local) return local;
    for (int r = 0; r < R; r++)
        if (all[r].status) return moex_ep_rank_failed(r, R, all[r].status, "failed in its backend on the rows it received");
    if (waited) return waited;
    const int64_t T = hidden->shape[0];
    if (T == 0) return MOEX_OK;
    return routing_reduce(w.plan.row_of, w.send, hidden->dtype, H, weights->data, weights->dtype, weights->strides[0],
                          T, k, out->data, out->dtype, out->strides[0], s);
}
