/* ep_group.c — expert-parallel groups (moex/experts.h): a rank's handle on a transport, and the
 * built-in transport of moex_ep_local_groups(), where the ranks are threads of one process and
 * an all-to-all is two barriers around each rank copying what it receives straight out of the
 * senders' buffers. */
#include "experts/ep_group.h"
#if MOEX_HAVE_CUDA
#include "core/gpu_runtime.h" /* moex_cuda_peer_access */
#endif

#include <pthread.h>
#include <stdlib.h>

/* The most distinct GPUs one local group's contexts may be on. */
#define EP_HUB_GPUS 64

/* What the ranks of one process share: the barrier, and each rank's posted send. */
typedef struct ep_post {
    const char *send;
    const size_t *offset, *bytes;
} ep_post;

typedef struct ep_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived, handles; /* handles: groups not yet freed */
    unsigned long generation;
    int mismatch; /* set in an exchange where a receiver's sizes disagreed with its sender's */
    int bound;           /* a context has joined: every context's device is of `device`'s kind */
    moex_device device;  /* the first context's */
    int gpus, gpu[EP_HUB_GPUS]; /* the CUDA devices of its contexts so far, peer access enabled between each two */
    ep_post post[];
} ep_hub;

moex_status moex_ep_group_create(int size, int rank, const moex_ep_transport *transport, moex_ep_group **out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_group_create: out is NULL");
    if (size < 1 || size > MOEX_EP_MAX_RANKS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert-parallel group size %d is outside [1, %d]", size,
                         MOEX_EP_MAX_RANKS);
    if (rank < 0 || rank >= size)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert-parallel rank %d is outside [0, %d) (the group's size)", rank,
                         size);
    if (!transport || !transport->all_to_all)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_group_create: the transport %s",
                         transport ? "has no all_to_all function" : "is NULL");
    moex_ep_group *g = calloc(1, sizeof *g + 3 * (size_t)size * sizeof g->gather[0]);
    if (!g) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_ep_group_create: out of memory");
    g->size = size;
    g->rank = rank;
    g->transport = *transport;
    *out = g;
    return MOEX_OK;
}

/* Every rank of the hub arrives before any leaves. Called with mu held. */
static void hub_barrier(ep_hub *h) {
    const unsigned long gen = h->generation;
    if (++h->arrived == h->size) {
        h->arrived = 0;
        h->generation++;
        pthread_cond_broadcast(&h->cv);
        return;
    }
    while (h->generation == gen) pthread_cond_wait(&h->cv, &h->mu);
}

static moex_status local_all_to_all(void *user, const void *send, const size_t *send_offset, const size_t *send_bytes,
                                    void *recv, const size_t *recv_offset, const size_t *recv_bytes) {
    moex_ep_group *g = user;
    ep_hub *h = g->hub;
    const int me = g->rank;
    pthread_mutex_lock(&h->mu);
    h->post[me] = (ep_post){send, send_offset, send_bytes};
    hub_barrier(h); /* every send posted */
    pthread_mutex_unlock(&h->mu);
    int bad = 0;
    for (int r = 0; r < h->size; r++) {
        const ep_post *p = &h->post[r];
        if (p->bytes[me] != recv_bytes[r]) {
            bad = 1;
            continue;
        }
        if (recv_bytes[r]) memcpy((char *)recv + recv_offset[r], p->send + p->offset[me], recv_bytes[r]);
    }
    pthread_mutex_lock(&h->mu);
    if (bad) h->mismatch = 1;
    hub_barrier(h); /* every copy made: the senders may reuse their buffers */
    const int mismatch = h->mismatch;
    hub_barrier(h); /* every rank has read the flag */
    if (me == 0) h->mismatch = 0;
    pthread_mutex_unlock(&h->mu);
    if (mismatch)
        return moex_fail(MOEX_ERR_INTERNAL, "expert parallelism: an all-to-all's sizes disagreed between two ranks");
    return MOEX_OK;
}

moex_status moex_ep_local_groups(int size, moex_ep_group **ranks) {
    if (!ranks) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_ep_local_groups: ranks is NULL");
    if (size < 1 || size > MOEX_EP_MAX_RANKS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "expert-parallel group size %d is outside [1, %d]", size,
                         MOEX_EP_MAX_RANKS);
    ep_hub *h = calloc(1, sizeof *h + (size_t)size * sizeof h->post[0]);
    if (!h) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_ep_local_groups: out of memory");
    if (pthread_mutex_init(&h->mu, NULL)) {
        free(h);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_ep_local_groups: could not make a mutex");
    }
    if (pthread_cond_init(&h->cv, NULL)) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_ep_local_groups: could not make a condition variable");
    }
    h->size = size;
    moex_ep_group *made[MOEX_EP_MAX_RANKS];
    for (int r = 0; r < size; r++) {
        made[r] = calloc(1, sizeof *made[r] + 3 * (size_t)size * sizeof made[r]->gather[0]);
        if (!made[r]) {
            for (int i = 0; i < r; i++) free(made[i]);
            pthread_cond_destroy(&h->cv);
            pthread_mutex_destroy(&h->mu);
            free(h);
            return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_ep_local_groups: out of memory");
        }
        *made[r] = (moex_ep_group){.size = size, .rank = r, .hub = h,
                                   .transport = {.all_to_all = local_all_to_all, .user = made[r]}};
    }
    h->handles = size;
    for (int r = 0; r < size; r++) ranks[r] = made[r];
    return MOEX_OK;
}

void moex_ep_group_free(moex_ep_group *group) {
    if (!group) return;
    ep_hub *h = group->hub;
    if (h) {
        pthread_mutex_lock(&h->mu);
        const int last = --h->handles == 0;
        pthread_mutex_unlock(&h->mu);
        if (last) {
            pthread_cond_destroy(&h->cv);
            pthread_mutex_destroy(&h->mu);
            free(h);
        }
    } else if (group->transport.release) {
        group->transport.release(group->transport.user);
    }
    free(group);
}

int moex_ep_group_size(const moex_ep_group *group) { return group ? group->size : 0; }
int moex_ep_group_rank(const moex_ep_group *group) { return group ? group->rank : 0; }

moex_status moex_ep_all_to_all(moex_ep_group *g, const void *send, const size_t *send_offset, const size_t *send_bytes,
                               void *recv, const size_t *recv_offset, const size_t *recv_bytes) {
    const uint64_t mark = moex_error_mark();
    const int v = (int)g->transport.all_to_all(g->transport.user, send, send_offset, send_bytes, recv, recv_offset,
                                               recv_bytes);
    if (v == MOEX_OK) return MOEX_OK;
    if (v < 0 || v > MOEX_ERR_INTERNAL)
        return moex_fail(MOEX_ERR_INTERNAL, "expert parallelism: the transport returned %d, which is not a moex_status", v);
    if (moex_error_mark() == mark)
        return moex_fail((moex_status)v, "expert parallelism: the transport's all-to-all failed with status %d (%s) and "
                         "no message", v, moex_status_str((moex_status)v));
    return (moex_status)v;
}

moex_status moex_ep_all_gather(moex_ep_group *g, const void *mine, size_t bytes, void *all) {
    const int n = g->size;
    size_t *zero = g->gather, *each = zero + n, *at = zero + 2 * n; /* nothing allocated: a rank that
                                                                     could not would miss the barrier */
    for (int r = 0; r < n; r++) zero[r] = 0, each[r] = bytes, at[r] = (size_t)r * bytes;
    return moex_ep_all_to_all(g, mine, zero, each, all, at, each);
}

/* A CUDA device joining h (under h->mu): peer access with each device it has, then it is one. */
static moex_status hub_add_gpu(ep_hub *h, int device) {
    for (int i = 0; i < h->gpus; i++)
        if (h->gpu[i] == device) return MOEX_OK;
    if (h->gpus == EP_HUB_GPUS)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "expert parallelism: a context on cuda:%d would be the local group's "
                         "GPU number %d; a group's contexts may be on at most %d GPUs", device, EP_HUB_GPUS + 1,
                         EP_HUB_GPUS);
#if MOEX_HAVE_CUDA
    for (int i = 0; i < h->gpus; i++) {
        moex_status st = moex_cuda_peer_access(h->gpu[i], device);
        if (st) return st;
    }
#endif
    h->gpu[h->gpus++] = device;
    return MOEX_OK;
}

moex_status moex_ep_group_bind(moex_ep_group *g, moex_device device) {
    ep_hub *h = g->hub;
    if (!h) return MOEX_OK;
    pthread_mutex_lock(&h->mu);
    const int first = !h->bound;
    if (first) h->bound = 1, h->device = device;
    const moex_device had = h->device;
    moex_status st = MOEX_OK;
    if (had.kind != device.kind) {
        char a[32], b[32];
        st = moex_fail(MOEX_ERR_UNSUPPORTED, "expert parallelism: a context on %s joins a group of moex_ep_local_groups "
                       "whose contexts are on %s: a local group's ranks are all on the cpu or all on GPUs",
                       moex_device_str(device, a, sizeof a), moex_device_str(had, b, sizeof b));
    } else if (device.kind == MOEX_DEVICE_CUDA) {
        st = hub_add_gpu(h, device.index);
    }
    if (st && first) h->bound = 0; /* the group is as it was */
    pthread_mutex_unlock(&h->mu);
    return st;
}
