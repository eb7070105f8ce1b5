/* ep_group.h — an expert-parallel group's handle, for the front end and the exchange
 * (src/backends/ep_forward.c). The group's public calls are moex/experts.h's. */
#ifndef MOEX_EXPERTS_EP_GROUP_H
#define MOEX_EXPERTS_EP_GROUP_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ep_hub; /* ep_group.c: the ranks of moex_ep_local_groups() */

struct moex_ep_group {
    int size, rank;
    moex_ep_transport transport;
    struct ep_hub *hub; /* local groups only (their transport's user is the group itself) */
    size_t gather[];    /* 3 x size: an all-gather's offsets and sizes (this handle's own) */
};

/* The device of a context joining the group: a local group's contexts are all on the CPU or all on
 * GPUs (MOEX_ERR_UNSUPPORTED naming both otherwise); a GPU new to the group gets peer access with
 * each GPU it has (both ways: a rank's kernels read and write the others' buffers), or an error
 * naming the two. Other groups: MOEX_OK. */
moex_status moex_ep_group_bind(moex_ep_group *g, moex_device device);

/* The group's all-to-all, its result checked: a failure always has a message, and a value that is
 * not a moex_status becomes MOEX_ERR_INTERNAL. */
moex_status moex_ep_all_to_all(moex_ep_group *g, const void *send, const size_t *send_offset, const size_t *send_bytes,
                               void *recv, const size_t *recv_offset, const size_t *recv_bytes);

/* Every rank's `bytes` bytes at `mine`, into all[r * bytes] for each rank r (itself included):
 * one all-to-all. Collective, as the forwards are. */
moex_status moex_ep_all_gather(moex_ep_group *g, const void *mine, size_t bytes, void *all);

#ifdef __cplusplus
}
#endif

#endif
