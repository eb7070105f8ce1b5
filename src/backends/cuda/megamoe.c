/* megamoe.c — deepgemm_megamoe on CUDA (SPEC R2, R6): the experts of an expert-parallel group,
 * each rank's compute being grouped_mm's implementation, with the exchange between the ranks
 * (dispatch and combine) cut into pieces that run on the copy engines beside that compute
 * (backends/cuda/ep_forward_cuda.cu: megamoe_in_pieces and megamoe_pieces_of are its size
 * predicates). What this file adds to grouped_mm is the requirement of a group, and the flag that
 * tells the exchange to overlap. It is chosen at load time (model/experts_map.c refuses switching
 * to or from it at run time). */
#include "backends/impl.h"

extern const moex_impl moex_cuda_grouped_mm; /* backends/cuda/experts.cu */

static int megamoe_supports(const moex_experts_desc *layer, const moex_device_info *dev, char *why, size_t n) {
    return moex_cuda_grouped_mm.supports(layer, dev, why, n);
}

static size_t megamoe_workspace(const moex_experts_desc *layer, int64_t max_tokens, int threads) {
    return moex_cuda_grouped_mm.workspace_bytes(layer, max_tokens, threads);
}

static moex_status megamoe_prepare(moex_context *ctx, const moex_experts_desc *layer, void **state) {
    moex_context_options o;
    moex_status st = moex_context_get_options(ctx, &o);
    if (st) return st;
    if (!o.ep_group)
        return moex_fail(MOEX_ERR_UNSUPPORTED,
                         "deepgemm_megamoe runs the experts of an expert-parallel group: this context has none "
                         "(moex_context_options.ep_group; moex generate --ep N or --ep-mpi). Use grouped_mm on one GPU");
    return moex_cuda_grouped_mm.prepare(ctx, layer, state);
}

static void megamoe_release(void *state) { moex_cuda_grouped_mm.release(state); }

static moex_status megamoe_forward(const moex_forward_args *a) { return moex_cuda_grouped_mm.forward(a); }

const moex_impl moex_cuda_megamoe = {.supports = megamoe_supports, .workspace_bytes = megamoe_workspace,
                                     .prepare = megamoe_prepare, .release = megamoe_release,
                                     .forward = megamoe_forward, .overlaps_exchange = 1};
