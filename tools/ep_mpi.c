/* ep_mpi.c — `moex generate --ep-mpi` over MPI (ep_mpi.h): the transport of moex/experts.h as one
 * MPI_Alltoallv of bytes, with every rank agreeing first that the sizes fit MPI's int counts (a
 * transport that fails must fail on every rank), and the gathers of the results to rank 0. */
#include "ep_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if MOEX_HAVE_MPI
#include <mpi.h>

static int g_inited; /* this file called MPI_Init */

/* The transport: rank `me` of MPI_COMM_WORLD. */
static moex_status mpi_all_to_all(void *user, const void *send, const size_t *send_offset, const size_t *send_bytes,
                                  void *recv, const size_t *recv_offset, const size_t *recv_bytes) {
    (void)user;
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int *c = malloc(4 * (size_t)n * sizeof *c);
    int big = c == NULL;
    for (int r = 0; !big && r < n; r++) {
        big = send_bytes[r] > INT_MAX || send_offset[r] > INT_MAX || recv_bytes[r] > INT_MAX || recv_offset[r] > INT_MAX;
        if (!big) c[r] = (int)send_bytes[r], c[n + r] = (int)send_offset[r], c[2 * n + r] = (int)recv_bytes[r],
                  c[3 * n + r] = (int)recv_offset[r];
    }
    /* every rank learns whether one cannot go on, before anyone moves a byte */
    if (MPI_Allreduce(MPI_IN_PLACE, &big, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) big = 1;
    if (big) {
        free(c);
        return moex_backend_fail(MOEX_ERR_WORKSPACE, "--ep-mpi: an exchange of more than 2 GiB to one rank, or a rank out "
                                 "of memory: MPI_Alltoallv counts bytes in int");
    }
    const int rc = MPI_Alltoallv(send, c, c + n, MPI_BYTE, recv, c + 2 * n, c + 3 * n, MPI_BYTE, MPI_COMM_WORLD);
    free(c);
    if (rc != MPI_SUCCESS) return moex_backend_fail(MOEX_ERR_INTERNAL, "--ep-mpi: MPI_Alltoallv failed (error %d)", rc);
    return MOEX_OK;
}

int cli_mpi_group(const char *who, moex_ep_group **group, int *rank, int *size, int *local_size, int *local_rank) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
            fprintf(stderr, "%s: --ep-mpi: MPI_Init failed\n", who);
            return 1;
        }
        g_inited = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm local;
    *local_size = 1, *local_rank = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, local_size);
        MPI_Comm_rank(local, local_rank);
        MPI_Comm_free(&local);
    }
    const moex_ep_transport t = {mpi_all_to_all, NULL, NULL};
    if (moex_ep_group_create(*size, *rank, &t, group)) {
        fprintf(stderr, "%s: --ep-mpi: rank %d of %d: %s\n", who, *rank, *size, moex_last_error());
        return 1;
    }
    return 0;
}

int cli_mpi_any_failed(int failed) {
    int any = failed != 0;
    if (MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) any = 1;
    return any;
}

void cli_mpi_free_gathered(moex_generation *all) {
    free(all->num_new);
    if (all->new_ids) free(all->new_ids[0]);
    free(all->new_ids);
    if (all->last_prompt_logits) free(all->last_prompt_logits[0]);
    free(all->last_prompt_logits);
    memset(all, 0, sizeof *all);
}

/* Gathers one array of `type` a rank ([per[r] elements]) into rank 0's `all` at the ranks'
 * running offsets. MPI_SUCCESS or an MPI error. */
static int gather(const void *mine, int n_mine, MPI_Datatype type, void *all, const int *per, int size, int rank) {
    int *at = rank == 0 ? malloc((size_t)size * sizeof *at) : NULL;
    if (rank == 0 && !at) return MPI_ERR_NO_MEM;
    for (int r = 0, o = 0; rank == 0 && r < size; r++) at[r] = o, o += per[r];
    const int rc = MPI_Gatherv(mine, n_mine, type, all, per, at, type, 0, MPI_COMM_WORLD);
    free(at);
    return rc;
}

int cli_mpi_gather(const char *who, const moex_generation *mine, int total, const int *counts, int64_t vocab,
                   int want_logits, moex_generation *all) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    memset(all, 0, sizeof *all);
    const int n = counts[rank];
    int64_t ids_mine = 0;
    for (int i = 0; i < n; i++) ids_mine += mine->num_new[i];
    int ok = ids_mine <= INT_MAX && (int64_t)n * vocab <= INT_MAX;
    int32_t *flat = malloc((size_t)(ids_mine > 0 ? ids_mine : 1) * sizeof *flat);
    float *lg = want_logits ? malloc((size_t)(n > 0 ? (int64_t)n * vocab : 1) * sizeof *lg) : NULL;
    ok = ok && flat && (!want_logits || lg);
    for (int i = 0, o = 0; ok && i < n; o += (int)mine->num_new[i], i++) {
        memcpy(flat + o, mine->new_ids[i], (size_t)mine->num_new[i] * sizeof *flat);
        if (want_logits) memcpy(lg + (int64_t)i * vocab, mine->last_prompt_logits[i], (size_t)vocab * sizeof *lg);
    }
    if (cli_mpi_any_failed(!ok)) {
        free(flat), free(lg);
        fprintf(stderr, "%s: --ep-mpi: a rank's results do not fit one MPI message (or memory)\n", who);
        return 1;
    }
    /* the counts to rank 0, which sizes the ids and logits it receives from them (the receive
     * counts of a gather are the root's alone) */
    int *per = rank == 0 ? malloc(2 * (size_t)size * sizeof *per) : NULL;
    int64_t *num_new = rank == 0 ? calloc((size_t)(total > 0 ? total : 1), sizeof *num_new) : NULL;
    int fail = rank == 0 && (!per || !num_new);
    for (int r = 0; !fail && rank == 0 && r < size; r++) per[r] = counts[r];
    fail = cli_mpi_any_failed(fail);
    if (!fail) fail = gather(mine->num_new, n, MPI_INT64_T, num_new, per, size, rank) != MPI_SUCCESS;
    int64_t ids_total = 0;
    for (int r = 0, p = 0; !fail && rank == 0 && r < size; r++) {
        int64_t s = 0;
        for (int i = 0; i < counts[r]; i++, p++) s += num_new[p];
        per[r] = (int)s, per[size + r] = (int)(counts[r] * vocab);
        ids_total += s;
    }
    int32_t *ids = !fail && rank == 0 ? malloc((size_t)(ids_total > 0 ? ids_total : 1) * sizeof *ids) : NULL;
    float *logits = !fail && rank == 0 && want_logits ? malloc((size_t)((int64_t)total * vocab) * sizeof *logits) : NULL;
    fail = fail || (rank == 0 && (!ids || (want_logits && !logits)));
    fail = cli_mpi_any_failed(fail);
    if (!fail) fail = gather(flat, (int)ids_mine, MPI_INT32_T, ids, per, size, rank) != MPI_SUCCESS;
    if (!fail && want_logits)
        fail = gather(lg, (int)(n * vocab), MPI_FLOAT, logits, per ? per + size : NULL, size, rank) != MPI_SUCCESS;
    double secs[2] = {mine->prefill_seconds, mine->decode_seconds}, most[2] = {0, 0};
    int64_t toks[2] = {mine->prefill_tokens, mine->decode_tokens}, sum[2] = {0, 0};
    if (!fail) fail = MPI_Reduce(secs, most, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    if (!fail) fail = MPI_Reduce(toks, sum, 2, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
    free(flat), free(lg), free(per);
    if (fail || rank != 0) {
        free(num_new), free(ids), free(logits);
        if (fail) fprintf(stderr, "%s: --ep-mpi: gathering the results to rank 0 failed\n", who);
        return fail;
    }
    all->n = total, all->vocab = vocab, all->num_new = num_new;
    all->new_ids = calloc((size_t)(total > 0 ? total : 1), sizeof *all->new_ids);
    all->last_prompt_logits = want_logits ? calloc((size_t)(total > 0 ? total : 1), sizeof(float *)) : NULL;
    if (!all->new_ids || (want_logits && !all->last_prompt_logits)) {
        free(ids), free(logits), free(all->new_ids), free(all->last_prompt_logits), free(num_new);
        memset(all, 0, sizeof *all);
        fprintf(stderr, "%s: --ep-mpi: out of memory\n", who);
        return 1;
    }
    for (int i = 0, o = 0; i < total; o += (int)num_new[i], i++) {
        all->new_ids[i] = ids + o;
        if (want_logits) all->last_prompt_logits[i] = logits + (int64_t)i * vocab;
    }
    if (total == 0) free(ids), free(logits);
    all->prefill_seconds = most[0], all->decode_seconds = most[1];
    all->prefill_tokens = sum[0], all->decode_tokens = sum[1];
    return 0;
}

void cli_mpi_end(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_inited && !fin) MPI_Finalize();
}

#else /* no MPI in this build */

int cli_mpi_group(const char *who, moex_ep_group **group, int *rank, int *size, int *local_size, int *local_rank) {
    (void)group, (void)rank, (void)size, (void)local_size, (void)local_rank;
    fprintf(stderr, "%s: --ep-mpi: this build of moex has no MPI; install an MPI (Debian: libopenmpi-dev) and rebuild, "
            "or run the ranks in one process with --ep N\n", who);
    return 1;
}
int cli_mpi_any_failed(int failed) { return failed != 0; }
int cli_mpi_gather(const char *who, const moex_generation *mine, int total, const int *counts, int64_t vocab,
                   int want_logits, moex_generation *all) {
    (void)who, (void)mine, (void)total, (void)counts, (void)vocab, (void)want_logits;
    memset(all, 0, sizeof *all);
    return 1;
}
void cli_mpi_free_gathered(moex_generation *all) { (void)all; }
void cli_mpi_end(void) {}

#endif
