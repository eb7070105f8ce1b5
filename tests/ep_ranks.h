/* ep_ranks.h — for tests: the ranks of an expert-parallel group in one process, each rank's
 * forward on a thread of its own (a forward in a group is a collective: a rank waits in the
 * exchange until every rank has reached it). */
#ifndef MOEX_TEST_EP_RANKS_H
#define MOEX_TEST_EP_RANKS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "moex.h"

#define EP_RANKS_MAX 8

/* One rank's forward: its arguments, then its status and message. */
typedef struct ep_rank_job {
    moex_context *ctx;
    moex_layer *layer;
    const char *backend;
    moex_tensor hidden, ids, weights, out;
    moex_status st;
    char msg[1024];
} ep_rank_job;

static void *ep_rank_run(void *arg) {
    ep_rank_job *j = arg;
    j->st = moex_experts_forward(j->ctx, j->layer, j->backend, &j->hidden, &j->ids, &j->weights, &j->out);
    snprintf(j->msg, sizeof j->msg, "%s", j->st ? moex_last_error() : "");
    return NULL;
}

/* Every rank's forward at once (R <= EP_RANKS_MAX); returns when all have. A thread that cannot
 * be started ends the test program (the ranks already started would wait for it forever). */
static inline void ep_run_ranks(ep_rank_job *jobs, int R) {
    pthread_t th[EP_RANKS_MAX];
    for (int r = 0; r < R; r++)
        if (R > EP_RANKS_MAX || pthread_create(&th[r], NULL, ep_rank_run, &jobs[r])) {
            fprintf(stderr, "ep_run_ranks: could not start rank %d of %d\n", r, R);
            abort();
        }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
}

#endif
