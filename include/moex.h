/*
 * moex.h — the public headers of libmoex, all of them. Each audience has its own:
 *   moex/base.h     version, statuses, dtypes, devices, tensors (included by the others)
 *   moex/tokenizer.h  tokenizer.json: text to token ids and back
 *   moex/experts.h  users of the experts layer: layers, contexts, forward, routers
 *   moex/backend.h  backend authors: the backend struct, the registry, the status word
 *   moex/model.h    checkpoint and generation users: models, backends maps, generate
 *
 * libmoex computes the expert layers of Mixture-of-Experts models through
 * interchangeable, runtime-switchable backends ("eager", "batched_mm",
 * "grouped_mm", ...). Every backend computes the same thing:
 *
 *     out[t] = sum_j w[t,j] * down_e( act(gate_e(x[t])) * up_e(x[t]) ),  e = ids[t,j]
 *
 * Conventions
 *   - Every call that can fail returns a moex_status. On failure the output
 *     arguments are left untouched and moex_last_error() holds a message that
 *     names the bad value.
 *   - Create/free pairs: every *_free() accepts NULL and does nothing.
 *   - The library never aborts on user input; out of memory is a status.
 *   - Thread-safety is stated per object below.
 *
 * Typical use (CPU, bf16):
 *
 *     moex_context_options o = moex_context_default_options();
 *     o.max_tokens = 512;
 *     moex_context *ctx;  moex_context_create(&o, &ctx);
 *     moex_layer *layer;  moex_layer_create(&desc, &layer);
 *     moex_prepare(ctx, layer, "grouped_mm");          // sizes workspace, lazy loads
 *     moex_experts_forward(ctx, layer, "grouped_mm", &x, &ids, &w, &out);
 */
#ifndef MOEX_H
#define MOEX_H

#include "moex/base.h"
#include "moex/experts.h"
#include "moex/backend.h"
#include "moex/model.h"
#include "moex/tokenizer.h"

#endif /* MOEX_H */
