/* ep_mpi.h — `moex generate --ep-mpi`: the expert-parallel group of an MPI job (one rank a
 * process, MPI_COMM_WORLD) over an MPI_Alltoallv transport, the agreement of the ranks on a
 * failure, and the ranks' results gathered to rank 0. A build without MPI has the same calls;
 * cli_mpi_group() then says how to get it. */
#ifndef MOEX_CLI_EP_MPI_H
#define MOEX_CLI_EP_MPI_H

#include "moex.h"

/* MPI initialised (once), this process's rank, the job's size, the ranks on this machine and this
 * process's place among them, and the group's handle over MPI (free it with moex_ep_group_free
 * before cli_mpi_end). 0, or 1 after printing why to stderr with prefix `who`. */
int cli_mpi_group(const char *who, moex_ep_group **group, int *rank, int *size, int *local_size, int *local_rank);

/* Collective: 1 if any rank passes failed != 0, else 0 (every rank gets the same answer). */
int cli_mpi_any_failed(int failed);

/* Collective: the ranks' generations gathered into rank 0's `all` (total prompts; rank r's are the
 * counts[r] after those of the ranks before it, from its `mine`): new ids, counts, logits when
 * want_logits, tokens summed and seconds the slowest rank's. On rank 0 free it with
 * cli_mpi_free_gathered. 0, or 1 after printing why. */
int cli_mpi_gather(const char *who, const moex_generation *mine, int total, const int *counts, int64_t vocab,
                   int want_logits, moex_generation *all);
void cli_mpi_free_gathered(moex_generation *all);

/* MPI finalised (after the group's handle is freed). */
void cli_mpi_end(void);

#endif
