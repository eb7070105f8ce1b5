/*
 * moex/experts.h — for users of the experts layer: describing a layer, contexts
 * and graphs, preparing and running a forward, the routers.
 */
#ifndef MOEX_EXPERTS_H
#define MOEX_EXPERTS_H

#include "moex/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The experts layer                                                        */
/* ------------------------------------------------------------------------ */

/**
 * Quantize w [E, N, K] or [N, K] (f32, f16 or bf16, contiguous, CPU) with
 * transformers' recipe, per tile of block_n rows x block_k columns (the last
 * tiles may be partial):
 *   FP8:   scale = 448 / amax(tile) (f32; an all-zero tile gets scale 1),
 *          q = e4m3(clamp(w * scale, -448, 448)), scale_inv = 1 / scale.
 *   FP8_UE8M0: as FP8, then scale_inv is rounded up to a power of two and
 *          q = e4m3(clamp(w / scale_inv, -448, 448)).
 *   FP4:   block_n must be 1 and block_k 32; scale_inv = 2^(floor(log2(amax)) - 2)
 *          (the OCP MX rule; 1 for an all-zero block), q = e2m1(w / scale_inv)
 *          saturating at +-6.
 * q: [E, N, K] e4m3, or [E, N, K/2] e2m1x2 (K even) for FP4.
 * scale_inv: [E, ceil(N/block_n), ceil(K/block_k)], f32 or ue8m0 (ue8m0 needs a
 * power-of-two format: FP8_UE8M0 or FP4). Each w = q * scale_inv up to rounding.
 * Any block sizes >= 1 (up to INT64_MAX: one tile) for FP8. q and scale_inv
 * must share no memory with w or each other.
 * Checks every shape and dtype first; nothing is written on error.
 */
moex_status moex_quantize(const moex_tensor *w, moex_quant_format format, int64_t block_n, int64_t block_k,
                          moex_tensor *q, moex_tensor *scale_inv);

/**
 * The inverse: out [E, N, K] (f32, f16 or bf16) = q * scale_inv, block-wise,
 * q e4m3 ([E, N, K]) or e2m1x2 ([E, N, K/2]); scale_inv [E, ceil(N/block_n),
 * ceil(K/block_k)] f32 or ue8m0. The product is an f32 multiplication, then
 * converted to out's dtype (exact for ue8m0 scales unless out of range).
 * out must share no memory with q or scale_inv.
 */
moex_status moex_dequantize(const moex_tensor *q, const moex_tensor *scale_inv, int64_t block_n, int64_t block_k,
                            moex_tensor *out);

/** The activation applied between the two projections. */
typedef enum moex_activation {
    MOEX_ACT_SILU = 0,          /**< silu(g) * u (SwiGLU); ungated: silu(u) */
    MOEX_ACT_GELU = 1,          /**< exact (erf) gelu(g) * u (GeGLU); ungated: gelu(u) */
    MOEX_ACT_GELU_TANH = 2,     /**< tanh-approximated gelu(g) * u; ungated: gelu_tanh(u) */
    MOEX_ACT_RELU = 3,          /**< relu(g) * u (ReGLU); ungated: relu(u) */
    MOEX_ACT_GPTOSS_CLAMP = 4,  /**< g=min(g,limit), u=clamp(u,-limit,limit), (u+1)*g*sigmoid(alpha*g); gated only */
    MOEX_ACT_SWIGLU_LIMIT = 5   /**< g=min(g,limit), u=clamp(u,-limit,limit), silu(g)*u; gated only */
} moex_activation;

/** Number of activation kinds. */
#define MOEX_ACTIVATION_COUNT 6

/** Name of an activation ("silu", "gelu", "gelu_tanh", "relu", "gptoss_clamp", "swiglu_limit"). */
const char *moex_activation_name(moex_activation act);

/**
 * Description of one experts layer: E experts, hidden size H, intermediate
 * size I, top_k experts per token. The weights are views, not copies: they
 * must stay alive and unchanged while a layer made from this description
 * exists. Weights must be row-major contiguous.
 *
 * Gated (gated = 1), not transposed (the Hugging Face layout after loading):
 *     gate_up   [E, 2I, H]   concatenated: rows 0..I-1 gate, I..2I-1 up
 *                            interleaved:  gate = even rows, up = odd rows
 *     down      [E, H, I]
 * Transposed (transposed = 1): gate_up [E, H, 2I] (columns as above),
 *     down [E, I, H].
 * Not gated (gated = 0): gate_up holds up_proj [E, I, H] (transposed
 *     [E, H, I]); the activation is applied to up alone.
 * Biases (optional; data == NULL means none): gate_up_bias [E, 2I] (or [E, I]
 *     ungated) in the same row order as gate_up; down_bias [E, H]. Biases are
 *     added right after each projection.
 * All weight tensors and biases share one dtype (f32, f16 or bf16) and the
 * layer's device.
 *
 * Quantized experts: gate_up and down (or the per-expert matrices) of dtype
 * e4m3 (FP8) or e2m1x2 (FP4, [E, rows, in/2] bytes, or GPT-OSS's
 * `*_blocks` form [E, rows, in/32, 16]), not transposed, with block scales
 * `weight_scale_inv` semantics (w = q * scale):
 *     gate_up_scale [E, ceil(R/block_n), ceil(H/block_k)]   (R = 2I gated, else I)
 *     down_scale    [E, ceil(H/block_n), ceil(I/block_k)]
 * of dtype f32 or ue8m0; in the per-expert layout expert_*_scale point to E
 * grids [ceil(rows/block_n), ceil(in/block_k)] of dtype expert_scale_dtype.
 * FP8: any block_n, block_k >= 1 (default 128 x 128), sizes need not be
 * multiples of the block. FP4: block_n = 1, block_k = 32 (GPT-OSS's
 * `*_scales` [E, rows, in/32]) and even input sizes. Activations are quantized
 * dynamically (activation_scheme MOEX_ACT_SCHEME_DYNAMIC): per token and per
 * block_k input channels for FP8, per 32 for FP4 (see docs/backends.md for
 * exactly what is rounded where). Biases stay f32, f16 or bf16.
 *
 * Per-expert weights (checkpoints that store each expert in its own tensors,
 * e.g. `experts.N.gate_proj`): leave gate_up and down absent and set
 * expert_up, expert_down (and expert_gate when gated) to arrays of E pointers
 * to row-major matrices of dtype expert_dtype: gate and up [I, H] (transposed
 * [H, I]), down [H, I] (transposed [I, H]). interleaved must be 0. The arrays
 * and the matrices are borrowed: they must outlive the layer. Biases keep the
 * stacked [E, 2I] / [E, H] form.
 */
typedef struct moex_experts_desc {
    int64_t num_experts;       /**< E >= 1 */
    int64_t hidden;            /**< H >= 1 */
    int64_t intermediate;      /**< I >= 1 */
    int64_t top_k;             /**< k, 1 <= k <= E */
    int gated;                 /**< 1: gate and up; 0: up only */
    int interleaved;           /**< gated only: 1 = gate/up rows interleaved */
    int transposed;            /**< 1: weights stored [E, in, out] */
    moex_activation activation;
    float alpha;               /**< MOEX_ACT_GPTOSS_CLAMP: sigmoid slope (1.702) */
    float limit;               /**< clamped activations: limit (7.0); must be > 0 */
    moex_tensor gate_up;       /**< see above */
    moex_tensor down;          /**< see above */
    moex_tensor gate_up_bias;  /**< optional */
    moex_tensor down_bias;     /**< optional */
    const void *const *expert_gate; /**< per-expert layout: E gate matrices (gated only) */
    const void *const *expert_up;   /**< per-expert layout: E up matrices; NULL = stacked layout */
    const void *const *expert_down; /**< per-expert layout: E down matrices */
    moex_dtype expert_dtype;        /**< per-expert layout: dtype of those matrices */
    moex_device expert_device;      /**< per-expert layout: where they live */
    /* ---- quantized experts (weights of dtype e4m3 or e2m1x2; see above) ---- */
    moex_tensor gate_up_scale;      /**< stacked layout: [E, ceil(R/block_n), ceil(H/block_k)], f32 or ue8m0 */
    moex_tensor down_scale;         /**< stacked layout: [E, ceil(H/block_n), ceil(I/block_k)], f32 or ue8m0 */
    const void *const *expert_gate_scale; /**< per-expert layout: E gate scale grids (gated only) */
    const void *const *expert_up_scale;   /**< per-expert layout: E up scale grids */
    const void *const *expert_down_scale; /**< per-expert layout: E down scale grids */
    moex_dtype expert_scale_dtype;  /**< per-expert layout: f32 or ue8m0 */
    int64_t block_n;                /**< rows per scale block (default 128; FP4: 1) */
    int64_t block_k;                /**< input channels per scale block (default 128; FP4: 32) */
    int activation_scheme;          /**< MOEX_ACT_SCHEME_DYNAMIC (default) or MOEX_ACT_SCHEME_STATIC */
} moex_experts_desc;

/** activation_scheme: activations quantized per token at run time (what the CPU backends do). */
#define MOEX_ACT_SCHEME_DYNAMIC 0
/** activation_scheme: one fixed per-tensor activation scale from the checkpoint; no
 *  built-in backend honours it, each one's supports() says so. */
#define MOEX_ACT_SCHEME_STATIC 1

/**
 * Fill *desc with defaults: gated, concatenated, not transposed, silu,
 * alpha 1.702, limit 7, no biases, every tensor absent, block 128 x 128,
 * dynamic activation scales. Sizes are zero and must be set.
 */
moex_status moex_experts_desc_init(moex_experts_desc *desc);

/**
 * The description of experts [first, first + count) of desc (an expert-parallel
 * rank's share: see moex_ep_group): every stacked tensor (weights, biases,
 * scales) starts at expert `first` with `count` experts, every per-expert array
 * at entry `first`; nothing is copied. The share keeps desc's top_k, so count
 * must be at least top_k for moex_layer_create() to take it.
 */
moex_status moex_experts_desc_share(const moex_experts_desc *desc, int64_t first, int64_t count,
                                    moex_experts_desc *out);

/** A validated experts layer (opaque). */
typedef struct moex_layer moex_layer;

/**
 * Validate desc and make a layer from it. Checks sizes, dtypes, shapes,
 * strides, devices and the activation; the message names the first bad value.
 * The layer keeps a copy of the description (the weight views, not the data).
 * Thread-safety: a layer is read-only after creation; forwards on one layer
 * may run concurrently from several threads, each with its own context.
 */
moex_status moex_layer_create(const moex_experts_desc *desc, moex_layer **out);

/** Free a layer. NULL is a no-op. Must not race with a forward on it. */
void moex_layer_free(moex_layer *layer);

/** The description the layer was created from. NULL if layer is NULL. */
const moex_experts_desc *moex_layer_desc(const moex_layer *layer);

/* ------------------------------------------------------------------------ */
/* Context                                                                  */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Expert parallelism                                                       */
/* ------------------------------------------------------------------------ */

/**
 * An expert-parallel group as one rank sees it (opaque; SPEC R11): `size`
 * ranks share each layer's experts, rank r owning the contiguous share
 * [r E/size, (r+1) E/size) of the E = size x (experts per rank) experts. Each
 * rank holds its own tokens. A forward in a context with a group (see
 * moex_context_options.ep_group) sends every (token, expert) pair's row to the
 * expert's owner, runs the owner's share through the chosen backend there, and
 * brings the results back to the token's rank, which adds them in (token, j)
 * order: the same result as one rank holding every expert, up to rounding of
 * each pair's result to the activation dtype.
 */
typedef struct moex_ep_group moex_ep_group;

/**
 * How a group's ranks exchange bytes: one collective, called by every rank of
 * the group in the same order. Rank `me` sends send_bytes[r] bytes starting at
 * send + send_offset[r] to each rank r (itself included) and receives
 * recv_bytes[r] bytes from rank r at recv + recv_offset[r]; the sizes agree
 * (what r sends to me is what I receive from r). Returns MOEX_OK, or a status
 * with a message (moex_backend_fail()); a transport that fails on one rank must
 * fail on all of them (a dropped peer, say), or they will wait for it. An MPI
 * program implements it with MPI_Alltoallv (MPI_BYTE).
 */
typedef struct moex_ep_transport {
    moex_status (*all_to_all)(void *user, const void *send, const size_t *send_offset, const size_t *send_bytes,
                              void *recv, const size_t *recv_offset, const size_t *recv_bytes);
    void (*release)(void *user); /**< optional: called by moex_ep_group_free() */
    void *user;                  /**< passed back to both */
} moex_ep_transport;

/** The largest group moex_ep_group_create() and moex_ep_local_groups() make. */
#define MOEX_EP_MAX_RANKS 1024

/**
 * Rank `rank` of a group of `size` ranks (1 <= size <= MOEX_EP_MAX_RANKS,
 * 0 <= rank < size) over a transport of the caller's (copied; its user data
 * must outlive the group).
 */
moex_status moex_ep_group_create(int size, int rank, const moex_ep_transport *transport, moex_ep_group **out);

/**
 * `size` ranks of one group in this process (ranks[r] is rank r), exchanging
 * through host memory: each rank's forwards must be called from a thread of
 * its own, as collectives are (a rank waits in the exchange until every rank
 * has reached it). CPU contexts, or CUDA contexts (each on a stream slot of
 * its own; on one GPU or several, with peer access enabled between each two
 * as their contexts are made), whose ranks exchange rows through device
 * memory (see moex_experts_forward). Free each with moex_ep_group_free().
 */
moex_status moex_ep_local_groups(int size, moex_ep_group **ranks);

/** Free a group handle (after every context using it). NULL is a no-op. */
void moex_ep_group_free(moex_ep_group *group);

/** The group's size and this handle's rank (each 0 for NULL). */
int moex_ep_group_size(const moex_ep_group *group);
int moex_ep_group_rank(const moex_ep_group *group);

/** Options for moex_context_create(). Start from moex_context_default_options(). */
typedef struct moex_context_options {
    moex_device device;   /**< where forwards run (default: CPU) */
    int num_threads;      /**< CPU threads; 0 = one per online core (default 0) */
    int64_t max_tokens;   /**< largest T any forward will get (default 1024) */
    int stream_slot;      /**< CUDA: contexts with the same slot on the same GPU share one
                               non-blocking stream, created at first use (default 0) */
    moex_ep_group *ep_group; /**< NULL (default): every layer's experts are all here. Otherwise
                               this rank of an expert-parallel group (borrowed; it must outlive
                               the context): each layer prepared in the context holds this
                               rank's share of the experts (num_experts = experts per rank),
                               and forwards take the group's expert ids (see
                               moex_experts_forward). CPU contexts with any group; CUDA
                               contexts with one of moex_ep_local_groups(), or with a group
                               over the caller's transport whose ranks are each in a process
                               of their own on GPUs of one machine (their buffers and events
                               shared through CUDA IPC; the transport carries only a few
                               hundred bytes a rank twice a forward; once the ranks have
                               forwarded together, moex_context_free is a collective of the
                               group: every rank frees its context). Give every rank's
                               context the same max_tokens: a rank sent more rows than its
                               workspace holds fails the forward on every rank (on a GPU,
                               different max_tokens fail every forward). */
} moex_context_options;

/** Defaults: CPU, all cores, max_tokens 1024, stream slot 0, no expert-parallel group. */
moex_context_options moex_context_default_options(void);

/**
 * An execution context (opaque): device, threads, and a workspace that
 * moex_prepare() sizes for max_tokens. A forward never allocates: everything
 * it needs beyond the weights lives in this workspace.
 * Thread-safety: one thread at a time per context.
 */
typedef struct moex_context moex_context;

/** Create a context. Fails on a bad option or an unavailable device. */
moex_status moex_context_create(const moex_context_options *options, moex_context **out);

/** Free a context and every backend state prepared in it. NULL is a no-op. */
void moex_context_free(moex_context *ctx);

/** The options the context was created with (num_threads resolved). */
moex_status moex_context_get_options(const moex_context *ctx, moex_context_options *out);

/** Bytes of workspace currently held by the context. */
size_t moex_context_workspace_bytes(const moex_context *ctx);

/**
 * Get the context's workspace, for a user backend's forward: *ptr and *bytes.
 * The region is only valid during that forward.
 */
moex_status moex_context_workspace(moex_context *ctx, void **ptr, size_t *bytes);

/**
 * Wait until every forward queued in ctx has finished. On the CPU forwards
 * are synchronous and this returns MOEX_OK at once. On CUDA a forward only
 * queues work on the context's stream; this call waits for it and reports
 * what the device found since the last call: MOEX_ERR_INVALID_ARGUMENT if an
 * id was outside [-1, E] (those pairs were treated as sentinels, so the
 * output of that forward is not meaningful), MOEX_ERR_DEVICE with CUDA's
 * message on a device fault.
 */
moex_status moex_context_synchronize(moex_context *ctx);

/**
 * The context's CUDA stream (a cudaStream_t) as a void pointer, to order the
 * caller's own CUDA work with moex's. Fails with MOEX_ERR_UNSUPPORTED on a CPU
 * context.
 */
moex_status moex_context_stream(moex_context *ctx, void **stream);


/** A captured sequence of forwards (a CUDA graph), replayable (opaque). */
typedef struct moex_graph moex_graph;

/**
 * Start capturing the context's stream into a CUDA graph (SPEC R8): the
 * forwards called until moex_graph_end() are recorded, not run. The layers
 * used must be prepared first. While capturing, only forwards of the
 * CUDA backends and the caller's own capturable work may touch the stream.
 * Fails with MOEX_ERR_UNSUPPORTED on a CPU context.
 */
moex_status moex_graph_begin(moex_context *ctx);

/**
 * Stop capturing and make the graph. On failure (a non-capturable call during
 * the capture, for example) the capture is abandoned and *out is untouched.
 */
moex_status moex_graph_end(moex_context *ctx, moex_graph **out);

/**
 * Replay a graph on the context's stream (asynchronously, like a forward).
 * It reads the tensors that were passed to the captured forwards at replay
 * time, so new hidden states, ids and weights written there are used:
 * routing may change from replay to replay. ctx must be the capturing one.
 */
moex_status moex_graph_launch(moex_graph *graph, moex_context *ctx);

/** Free a graph. NULL is a no-op. */
void moex_graph_free(moex_graph *graph);

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/**
 * Prepare `layer` for `backend` in `ctx`: checks support, grows the
 * workspace to what max_tokens needs, runs the backend's prepare (weight
 * re-layout, lazy kernel loading). Idempotent. Call it before the first
 * forward with that backend; switching backends later needs no reload, only
 * a prepare of the new one. Not thread-safe with forwards on the same ctx.
 */
moex_status moex_prepare(moex_context *ctx, moex_layer *layer, const char *backend);

/**
 * One experts forward:
 *     hidden [T, H], ids [T, k] (i32/i64), weights [T, k] -> out [T, H]
 * hidden and out: f32, f16 or bf16 (the same), inner stride 1, row stride
 * >= H. weights: f32, f16 or bf16. ids == -1 or == E contribute nothing (a
 * token whose ids are all sentinels gets zeros); any other id outside [0, E)
 * is an error. T == 0 is valid and writes nothing. T must not exceed the
 * context's max_tokens. out must not share a byte with hidden, ids or
 * weights (MOEX_ERR_INVALID_ARGUMENT naming both; rows of one view in the
 * gaps between the rows of another are fine, e.g. hidden and out side by
 * side in one [T, 2H] buffer). Every check happens before anything is written.
 * Never allocates. The result does not depend on the thread count.
 *
 * On a CUDA context every tensor must be in that GPU's memory (set the
 * view's device after moex_tensor_init()). The call checks shapes, dtypes
 * and devices, queues the work on the context's stream and returns; `out`
 * is complete once moex_context_synchronize() returns (or later work on the
 * stream runs). ids are checked on the device (see moex_context_synchronize).
 * Such forwards can be captured in a graph (moex_graph_begin()).
 *
 * In a context with an expert-parallel group of R ranks, `layer` is this
 * rank's share (E/R experts), ids are the group's (in [0, E), sentinels -1 and
 * E, with E = R x layer's experts), and every rank of the group must make the
 * same sequence of forwards (T may differ, T == 0 included), each with a
 * layer of the same sizes and backend: a forward is a collective. A rank whose
 * forward fails its checks still takes part, so that every rank returns: it
 * returns its own error and the others MOEX_ERR_INVALID_ARGUMENT naming the
 * rank that refused; nothing is written on any rank. The workspace holds the
 * rows this rank receives (at most R x max_tokens x top_k) and what the backend
 * needs for them. On CUDA contexts such a forward is queued on the context's
 * stream like any other (its ranks meet on the host twice, not waiting for the
 * GPU), but cannot be captured in a graph.
 */
moex_status moex_experts_forward(moex_context *ctx, const moex_layer *layer,
                                 const char *backend, const moex_tensor *hidden,
                                 const moex_tensor *ids, const moex_tensor *weights,
                                 moex_tensor *out);

/* ------------------------------------------------------------------------ */
/* Routers                                                                  */
/* ------------------------------------------------------------------------ */

/** How router logits become (ids, weights). */
typedef enum moex_router_kind {
    /** softmax over E in f32, top-k, optional renormalisation (Qwen, Mixtral) */
    MOEX_ROUTER_SOFTMAX_TOPK = 0,
    /** sigmoid scores, + correction bias for selection only, group-limited
     *  top-k, optional renormalisation, times scaling (DeepSeek-V3) */
    MOEX_ROUTER_SIGMOID_GROUPED_TOPK = 1,
    /** top-k on the logits, then softmax over the k chosen (GPT-OSS) */
    MOEX_ROUTER_TOPK_SOFTMAX = 2
} moex_router_kind;

/** Router parameters. Start from moex_router_desc_init(). */
typedef struct moex_router_desc {
    moex_router_kind kind;
    int64_t num_experts;          /**< E */
    int64_t top_k;                /**< k, 1 <= k <= E */
    int renormalize;              /**< 1: divide the k weights by their sum; 0 or 1 */
    int64_t n_group;              /**< grouped: number of groups (divides E); 1 = no grouping */
    int64_t topk_group;           /**< grouped: groups kept, 1 <= topk_group <= n_group */
    float scaling;                /**< grouped: routed scaling factor (1.0), finite and > 0 */
    moex_tensor correction_bias;  /**< grouped: optional f32 [E] of finite values in cpu memory,
                                       added for selection only */
} moex_router_desc;

/** Defaults: softmax top-k, no renormalisation, 1 group, scaling 1, no bias. */
moex_status moex_router_desc_init(moex_router_desc *desc);

/**
 * Route: logits [T, E] (f32/f16/bf16, CPU) -> ids [T, k] (i32/i64),
 * weights [T, k] (f32/f16/bf16). Computation in f32. Ties are broken
 * towards the lower expert index; the k picks are ordered by descending
 * score (as torch.topk). Grouped: a group's score is the sum of its two
 * highest biased scores (one if the group has a single expert). ids and
 * weights must share no memory with logits or each other.
 */
moex_status moex_route(const moex_router_desc *desc, const moex_tensor *logits,
                       moex_tensor *ids, moex_tensor *weights);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_EXPERTS_H */
