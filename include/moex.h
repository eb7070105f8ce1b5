/*
 * moex.h — the one public header of libmoex.
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

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/** Version of the header, as numbers and as a string. */
#define MOEX_VERSION_MAJOR 0
#define MOEX_VERSION_MINOR 1
#define MOEX_VERSION_PATCH 0
#define MOEX_VERSION_STRING "0.1.0"
/** MAJOR*10000 + MINOR*100 + PATCH, for compile-time comparisons. */
#define MOEX_VERSION_NUMBER \
    (MOEX_VERSION_MAJOR * 10000 + MOEX_VERSION_MINOR * 100 + MOEX_VERSION_PATCH)

/** Version of the library actually linked, e.g. "0.1.0". Never NULL. */
const char *moex_version(void);

/* ------------------------------------------------------------------------ */
/* Status and errors                                                        */
/* ------------------------------------------------------------------------ */

/** Result of every fallible call. MOEX_OK is 0. */
typedef enum moex_status {
    MOEX_OK = 0,
    MOEX_ERR_INVALID_ARGUMENT = 1, /**< null pointer, bad shape, dtype, stride or value */
    MOEX_ERR_OUT_OF_MEMORY = 2,    /**< an allocation failed; nothing was changed */
    MOEX_ERR_NOT_FOUND = 3,        /**< unknown backend name (the message lists the valid ones) */
    MOEX_ERR_UNSUPPORTED = 4,      /**< the backend cannot run this layer on this device */
    MOEX_ERR_WORKSPACE = 5,        /**< the context's workspace is too small (e.g. T > max_tokens) */
    MOEX_ERR_NOT_PREPARED = 6,     /**< forward before moex_prepare() for that layer and backend */
    MOEX_ERR_DEVICE = 7,           /**< the device (CUDA) reported an error; message has its text */
    MOEX_ERR_IO = 8,               /**< a file could not be read */
    MOEX_ERR_FORMAT = 9,           /**< a file is malformed */
    MOEX_ERR_EXISTS = 10,          /**< a backend of that name is already registered */
    MOEX_ERR_INTERNAL = 11         /**< a bug in moex; please report the message */
} moex_status;

/** Short fixed text for a status, e.g. "invalid argument". Never NULL. */
const char *moex_status_str(moex_status status);

/**
 * Detailed message of the last failed call on this thread, e.g.
 * "ids[17,2] = 300 is outside [0, 64)". Empty string when none.
 * Thread-local: each thread sees its own. Valid until the next failing call
 * on the same thread.
 */
const char *moex_last_error(void);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

/** Element types. Sub-byte and scale types are declared for quantized experts. */
typedef enum moex_dtype {
    MOEX_F32 = 0,    /**< IEEE binary32 */
    MOEX_F16 = 1,    /**< IEEE binary16 */
    MOEX_BF16 = 2,   /**< bfloat16 (upper half of binary32) */
    MOEX_E4M3 = 3,   /**< FP8 e4m3fn: bias 7, no infinities, max 448; 0x7F/0xFF are NaN (quantized experts) */
    MOEX_E2M1X2 = 4, /**< FP4 e2m1, two per byte, low nibble = the first element along K (quantized experts) */
    MOEX_UE8M0 = 5,  /**< unsigned power-of-two scale 2^(b-127); 255 is NaN (block scales) */
    MOEX_I32 = 6,    /**< int32 (expert ids) */
    MOEX_I64 = 7     /**< int64 (expert ids) */
} moex_dtype;

/** Number of dtypes; valid values are 0 .. MOEX_DTYPE_COUNT-1. */
#define MOEX_DTYPE_COUNT 8

/** Bytes per stored element (1 for E2M1X2, which holds two values). 0 for an invalid dtype. */
size_t moex_dtype_size(moex_dtype dtype);

/** Lower-case name ("f32", "bf16", "e4m3", ...); "invalid" for an unknown value. */
const char *moex_dtype_name(moex_dtype dtype);

/**
 * Parse a dtype name as written by moex_dtype_name().
 * Returns MOEX_ERR_INVALID_ARGUMENT (message lists the names) if unknown.
 */
moex_status moex_dtype_parse(const char *name, moex_dtype *out);

/**
 * Convert n elements between f32, f16 and bf16 (round to nearest even; NaN
 * stays NaN). Host memory only; src and dst need not be aligned. src and dst
 * must either be the same pointer (in-place conversion) or not overlap
 * (refused when the dtypes differ; a same-dtype copy is a memmove). An n
 * whose bytes would run past the end of memory is refused.
 */
moex_status moex_convert(const void *src, moex_dtype src_dtype, void *dst,
                         moex_dtype dst_dtype, size_t n);

/* ---- quantized element types: codecs and block quantization ---- */

/** FP8 e4m3fn code -> f32, exact for all 256 codes (0x7F and 0xFF give NaN). */
float moex_e4m3_to_f32(uint8_t code);

/** f32 -> FP8 e4m3fn code: round to nearest even, saturating to +-448; NaN -> 0x7F. */
uint8_t moex_f32_to_e4m3(float value);

/** FP4 e2m1 code (the low 4 bits of nibble; bit 3 is the sign) -> f32:
 *  +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}. */
float moex_e2m1_to_f32(uint8_t nibble);

/** f32 -> FP4 e2m1 code (0..15): round to nearest even, saturating to +-6; NaN -> 0. */
uint8_t moex_f32_to_e2m1(float value);

/** UE8M0 code b -> 2^(b-127) (b = 0 gives the subnormal 2^-127; b = 255 gives NaN). */
float moex_ue8m0_to_f32(uint8_t code);

/** f32 > 0 -> the UE8M0 code of the smallest power of two >= value (rounds up,
 *  as the ue8m0 recipe does), clamped to [0, 254]; 0, negative or NaN -> 127 (1.0). */
uint8_t moex_f32_to_ue8m0(float value);

/** How weights are quantized by moex_quantize() and `--quantize`. */
typedef enum moex_quant_format {
    MOEX_QUANT_FP8 = 0,       /**< e4m3 weights, float32 block scales (block_n x block_k, default 128 x 128) */
    MOEX_QUANT_FP8_UE8M0 = 1, /**< e4m3 weights, power-of-two block scales (rounded up) */
    MOEX_QUANT_FP4 = 2        /**< e2m1 weights two per byte, UE8M0 scales per 32 elements along K (block 1 x 32) */
} moex_quant_format;

/** Parse "fp8", "fp8-ue8m0" or "fp4"; MOEX_ERR_INVALID_ARGUMENT listing them otherwise. */
moex_status moex_quant_format_parse(const char *name, moex_quant_format *out);

/** Name of a quantization format ("fp8", "fp8-ue8m0", "fp4"); "invalid" otherwise. */
const char *moex_quant_format_name(moex_quant_format format);


/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

/** Kind of device a tensor lives on and a context computes on. */
typedef enum moex_device_kind {
    MOEX_DEVICE_CPU = 0,
    MOEX_DEVICE_CUDA = 1
} moex_device_kind;

/** A device: its kind and, for CUDA, the ordinal (0 for CPU). */
typedef struct moex_device {
    moex_device_kind kind;
    int index;
} moex_device;

/** What moex knows about a device; filled by moex_device_query(). */
typedef struct moex_device_info {
    moex_device device;
    int available;        /**< 1 if this build and machine can compute on it */
    int cuda_built;       /**< 1 if this build of moex has CUDA support */
    int cuda_devices;     /**< number of CUDA devices visible (0 without CUDA) */
    int cc_major;         /**< CUDA compute capability (0 for CPU) */
    int cc_minor;
    int cpu_avx2;         /**< CPU: AVX2+FMA+F16C kernels in use */
    int cpu_cores;        /**< CPU: online cores */
    char name[96];        /**< human-readable name */
    char reason[160];     /**< when available == 0: why, in words a user can act on */
} moex_device_info;

/**
 * Describe a device. Always fills *info (available = 0 with a reason when the
 * device cannot be used) and returns MOEX_OK, unless info is NULL or the kind
 * is not a moex_device_kind (MOEX_ERR_INVALID_ARGUMENT).
 * Thread-safe.
 */
moex_status moex_device_query(moex_device device, moex_device_info *info);

/**
 * Allocate bytes of memory on device (CPU: 64-byte aligned host memory; CUDA:
 * device memory through cudaMalloc). bytes == 0 gives *ptr = NULL. Fails with
 * MOEX_ERR_OUT_OF_MEMORY (the message says how much was asked and, on CUDA,
 * how much is free) or MOEX_ERR_UNSUPPORTED (no CUDA in this build or no such
 * GPU); *ptr is untouched on failure. Thread-safe.
 */
moex_status moex_device_alloc(moex_device device, size_t bytes, void **ptr);

/** Free memory from moex_device_alloc() on the same device. NULL is a no-op. */
void moex_device_free(moex_device device, void *ptr);

/**
 * Copy bytes from src (on src_device) to dst (on dst_device): host to host,
 * host to GPU, GPU to host or GPU to GPU. Returns when the copy is complete
 * (it waits for nothing else). The ranges must not overlap (refused for host
 * ranges), nor run past the end of memory (refused). Thread-safe.
 */
moex_status moex_memcpy(void *dst, moex_device dst_device, const void *src, moex_device src_device, size_t bytes);

/* ------------------------------------------------------------------------ */
/* Tensor views                                                             */
/* ------------------------------------------------------------------------ */

/** Maximum rank of a tensor view. */
#define MOEX_MAX_DIMS 4

/**
 * A non-owning view of an n-d array. Strides are in elements (for E2M1X2: in
 * bytes, i.e. pairs). Row-major contiguous means strides[ndim-1] == 1 and
 * strides[i] == strides[i+1] * shape[i+1]. A view with data == NULL and
 * ndim == 0 is "absent" (used for optional biases). data must be aligned to
 * the element size (moex_dtype_size); the calls that take views refuse one
 * that is not, and one whose element count or byte size overflows int64.
 */
typedef struct moex_tensor {
    void *data;
    moex_dtype dtype;
    int ndim;
    int64_t shape[MOEX_MAX_DIMS];
    int64_t strides[MOEX_MAX_DIMS];
    moex_device device;
} moex_tensor;

/**
 * Fill *t as a row-major contiguous view of data on the CPU (for GPU memory,
 * set t->device afterwards, e.g. {MOEX_DEVICE_CUDA, 0}).
 * Fails (MOEX_ERR_INVALID_ARGUMENT) on ndim outside [1, MOEX_MAX_DIMS],
 * a negative dimension, an invalid dtype, or a byte size or row-major
 * stride that overflows int64 (e.g. [0, 2^40, 2^40]).
 * data may be NULL only when the element count is 0.
 */
moex_status moex_tensor_init(moex_tensor *t, void *data, moex_dtype dtype,
                             int ndim, const int64_t *shape);

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

/** Options for moex_context_create(). Start from moex_context_default_options(). */
typedef struct moex_context_options {
    moex_device device;   /**< where forwards run (default: CPU) */
    int num_threads;      /**< CPU threads; 0 = one per online core (default 0) */
    int64_t max_tokens;   /**< largest T any forward will get (default 1024) */
    int stream_slot;      /**< CUDA: contexts with the same slot on the same GPU share one
                               non-blocking stream, created at first use (default 0) */
} moex_context_options;

/** Defaults: CPU, all cores, max_tokens 1024, stream slot 0. */
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

/** MOEX_CUDA_STATUS_BAD_ID: the status-word bit of an expert id outside [-1, E]. */
#define MOEX_CUDA_STATUS_BAD_ID 1

/**
 * The context's status word: an int32 in GPU memory that kernels set bits of
 * (atomicOr) for values the host could not check without a synchronisation,
 * such as MOEX_CUDA_STATUS_BAD_ID. moex_context_synchronize() reads, reports
 * and clears it. For backends: the same word the built-in ones use. Fails with
 * MOEX_ERR_UNSUPPORTED on a CPU context.
 */
moex_status moex_context_status_word(moex_context *ctx, int **word);

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
/* Backends and the registry                                                */
/* ------------------------------------------------------------------------ */

/** Everything a backend's forward receives; inputs already validated. */
typedef struct moex_forward_args {
    moex_context *ctx;
    const moex_experts_desc *layer;  /**< validated description */
    void *state;                     /**< what the backend's prepare returned (or NULL) */
    const moex_tensor *hidden;       /**< [T, H], dtype f32/f16/bf16, inner stride 1 */
    const moex_tensor *ids;          /**< [T, k], i32 or i64; -1 and E are sentinels */
    const moex_tensor *weights;      /**< [T, k], f32/f16/bf16 */
    moex_tensor *out;                /**< [T, H], same dtype as hidden, inner stride 1 */
    int64_t tokens;                  /**< T (>= 1; T == 0 never reaches a backend) */
    int num_threads;                 /**< the context's thread count (0 on a CUDA context) */
    void *workspace;                 /**< the context's workspace */
    size_t workspace_bytes;          /**< its size, at least what workspace_bytes() asked */
} moex_forward_args;

/**
 * A backend: a name and a few functions. Register your own with
 * moex_register_backend(); the built-ins are registered at start.
 * A forward must not write `out` unless it succeeds, must not allocate, and
 * must not depend on the thread count for its result.
 *
 * Failures: a function that fails returns a moex_status other than MOEX_OK
 * and says why with moex_backend_fail(). moex checks what comes back:
 *   - a failure with no message of the function's own is reported as
 *     `backend "NAME": prepare failed with status N and no message (...)`
 *     (never with an older, unrelated moex_last_error());
 *   - a value that is not a moex_status (say 12345 or -7) becomes
 *     MOEX_ERR_INTERNAL with `backend "NAME" returned 12345, which is not a
 *     moex_status (...)`;
 *   - supports() must return 1 or 0; anything else is MOEX_ERR_INTERNAL too.
 */
typedef struct moex_backend {
    const char *name;        /**< unique, [a-z0-9_], at most 63 characters */
    const char *summary;     /**< one line for listings (may be NULL) */
    /** Can this backend run `layer` on the device `dev`? Return 1, or 0 and
     *  write a reason a user can act on into why (why_size bytes, at least 1;
     *  or record it with moex_backend_fail()). layer is NULL when only the
     *  device is asked about. Required. */
    int (*supports)(const moex_experts_desc *layer, const moex_device_info *dev,
                    char *why, size_t why_size, void *user);
    /** Workspace bytes one forward of up to max_tokens tokens needs in ctx. Optional (0).
     *  The device and thread count are moex_context_get_options(ctx)'s; on a CUDA
     *  context the workspace is GPU memory. SIZE_MAX means "too large":
     *  moex_prepare fails naming max_tokens. */
    size_t (*workspace_bytes)(const moex_experts_desc *layer, int64_t max_tokens,
                              const moex_context *ctx, void *user);
    /** Per layer and context: re-layout, lazy loading. Optional. Returns
     *  MOEX_OK, or a failure with a message from moex_backend_fail() (and
     *  nothing kept: release is not called for a failed prepare). */
    moex_status (*prepare)(moex_context *ctx, const moex_experts_desc *layer,
                           void **state, void *user);
    /** Release what prepare made. Optional. Cannot fail. */
    void (*release)(void *state, void *user);
    /** Compute out from hidden, ids and weights. Required. Returns MOEX_OK, or
     *  a failure with a message from moex_backend_fail() and out untouched. */
    moex_status (*forward)(const moex_forward_args *args, void *user);
    void *user;              /**< passed back to every function */
} moex_backend;

/**
 * For a backend's functions: record a printf-style message as this thread's
 * moex_last_error() (at most 1023 bytes are kept) and return status, so that
 * a failure is one line:
 *     return moex_backend_fail(MOEX_ERR_UNSUPPORTED,
 *                              "my_backend: hidden = %lld is not a multiple of 64", h);
 * Name the bad value, as moex's own messages do. The arguments may include
 * moex_last_error() itself. Usable from any thread; each thread has its own message.
 */
moex_status moex_backend_fail(moex_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/**
 * Register a backend. The struct and its name are copied. Fails with
 * MOEX_ERR_EXISTS if the name is taken, MOEX_ERR_INVALID_ARGUMENT on a bad
 * name or a missing required function. Thread-safe.
 */
moex_status moex_register_backend(const moex_backend *backend);

/** Number of registered backends (built-ins first). Thread-safe. */
int moex_backend_count(void);

/** Name of the i-th registered backend, or NULL if i is out of range. Thread-safe. */
const char *moex_backend_name(int i);

/** One-line summary of a backend, or NULL if unknown. Thread-safe. */
const char *moex_backend_summary(const char *name);

/**
 * Look a name up: MOEX_OK if registered, else MOEX_ERR_NOT_FOUND with a
 * message listing the valid names. Thread-safe.
 */
moex_status moex_backend_lookup(const char *name);

/**
 * Can backend `name` run `layer` on `device`? MOEX_OK if yes; otherwise
 * MOEX_ERR_UNSUPPORTED (or MOEX_ERR_NOT_FOUND) and a reason in why (if
 * why is not NULL) and in moex_last_error(). layer may be NULL to ask about
 * the device alone. Thread-safe.
 */
moex_status moex_backend_supports(const char *name, const moex_layer *layer,
                                  moex_device device, char *why, size_t why_size);

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

/* ------------------------------------------------------------------------ */
/* Models: Hugging Face MoE checkpoints                                     */
/* ------------------------------------------------------------------------ */

/** A loaded model (opaque): config, memory-mapped weights, experts layers,
 *  KV cache, workspace. Thread-safety: one thread at a time per model. */
typedef struct moex_model moex_model;

/** Options for moex_model_load(). Start from moex_model_default_options(). */
typedef struct moex_model_options {
    moex_device device;    /**< where it runs (default: CPU) */
    moex_dtype dtype;      /**< compute and activation dtype: MOEX_F32 (default) or MOEX_BF16 */
    const char *experts;   /**< backend name or JSON map (SPEC R4); NULL = "grouped_mm" */
    int num_threads;       /**< CPU threads; 0 = one per core */
    int64_t max_batch;     /**< prompts per generate call (default 8) */
    int64_t max_seq;       /**< prompt + new tokens per sequence (default 1024) */
    int64_t max_tokens;    /**< tokens in one forward step; longer prefills go in pieces (default 4096) */
    int decode_switch;     /**< 1 (default): on CUDA, grouped_mm entries run batched_mm in decode steps */
    int dequantize;        /**< 1: a pre-quantized checkpoint's experts become plain weights at load
                                (f32 with f32 compute, bf16 with bf16 compute); default 0. A checkpoint
                                without quantization_config refuses it (MOEX_ERR_INVALID_ARGUMENT). */
    const char *quantize;  /**< "fp8", "fp8-ue8m0" or "fp4": quantize the experts at load
                                (moex_quantize's recipe); NULL (default) = as stored */
} moex_model_options;

/** Defaults as documented on each field. */
moex_model_options moex_model_default_options(void);

/**
 * Load the checkpoint in directory dir (config.json, generation_config.json,
 * model.safetensors or a sharded index). Supported model_type values:
 * qwen2_moe, qwen3_moe, mixtral, qwen3_vl_moe (text backbone). Weights stored
 * in a dtype the kernels read (f32, f16, bf16) are used in place from the
 * mapping. Fails naming an unknown model_type (with the list) or a missing tensor.
 *
 * Every tensor is checked by name: its shape, its dtype (each weight is read in
 * its own dtype; the experts matrices of one layer must share one) and its size
 * against the file. Every config.json key the family's transformers model reads
 * is honoured as transformers defines it (an absent key takes the default of the
 * family's config class) or refused by name: hidden_act other than silu, a rope
 * type other than default, partial_rotary_factor != 1, and sliding-window
 * attention where the window could bind (max_seq above it) are MOEX_ERR_UNSUPPORTED.
 * config.json and generation_config.json must be regular files. max_tokens must
 * be at least max_batch (a decode step of max_batch sequences).
 *
 * The checkpoint's files stay mapped while the model lives and must not change:
 * moex_generate() checks on the cpu that each is as loaded (size and modification
 * time) and fails with MOEX_ERR_IO naming the file if not; a file written or
 * truncated while a call runs is not detected (truncation faults, SIGBUS). A file
 * replaced by rename is harmless: the model keeps the one it mapped.
 *
 * Pre-quantized FP8 checkpoints (config.json's quantization_config with
 * quant_method "fp8", fmt "e4m3", weight_block_size, scale_fmt "float" or
 * "ue8m0", activation_scheme, modules_to_not_convert) load with no option:
 * e4m3 expert weights are used in place with their `*_scale_inv` tensors (2-D
 * grids, or each expert's grid flattened to 1-D, inferred from the weight
 * shape); other e4m3 linear layers are dequantized at load. A bad scale grid,
 * a block size that does not fit, or a scale dtype other than f32/ue8m0 fails
 * naming the tensor. activation_scheme "static" fails at load, naming it.
 *
 * device = {MOEX_DEVICE_CUDA, n} (a build with CUDA): every weight a step reads
 * is copied to GPU n once (f32 for f32 compute, bf16 for bf16), with a device KV
 * cache and workspace; moex_model_get_info() reports the device memory. A GPU
 * this build or machine cannot use fails with MOEX_ERR_UNSUPPORTED naming why;
 * quantized experts (FP8 checkpoints without dequantize, quantize) are refused
 * on CUDA (docs/models.md).
 */
moex_status moex_model_load(const char *dir, const moex_model_options *options, moex_model **out);

/** Free a model. NULL is a no-op. */
void moex_model_free(moex_model *model);

/** Switch backends at run time without reloading: a name or a JSON map (SPEC R4.2). */
moex_status moex_model_set_experts(moex_model *model, const char *spec);

/** The backends in force as a JSON map with "" and every sub-config (SPEC R4.3). */
moex_status moex_model_get_experts(const moex_model *model, char *buf, size_t size);

/** Facts about a loaded model, for `moex info`. */
typedef struct moex_model_info {
    char model_type[64];
    int num_sub_configs;       /**< every top-level "*_config" object of config.json (at most 16) */
    char sub_configs[16][64];
    int64_t num_layers, num_moe_layers;
    int64_t hidden, vocab, num_experts, top_k, moe_intermediate, shared_intermediate;
    moex_dtype weight_dtype;   /**< dtype of the experts' weights */
    int per_expert_layout;     /**< 1: experts.N.* tensors; 0: fused 3-D tensors */
    int transposed;            /**< fused tensors stored [E, in, out] */
    /* A model loaded on CUDA: device memory it holds, by use (0 on the cpu). Each byte is counted once
     * (a tied lm_head shares the embedding's upload). */
    size_t gpu_weight_bytes;    /**< every weight a step reads, experts included, in the compute dtype */
    size_t gpu_kv_cache_bytes;  /**< the KV cache: 2 * layers * max_batch * kv_heads * max_seq * head_dim f32 */
    size_t gpu_workspace_bytes; /**< activations scratch, the cuBLAS workspace and the experts context's workspace */
} moex_model_info;

moex_status moex_model_get_info(const moex_model *model, moex_model_info *info);

/** The experts layer of MoE layer i (0-based over the MoE layers), for supports queries. */
const moex_layer *moex_model_experts_layer(const moex_model *model, int64_t i);

/** Options for moex_generate(). */
typedef struct moex_generate_options {
    int64_t max_new_tokens;  /**< >= 0 */
    float temperature;       /**< 0 = greedy (default) */
    int64_t top_k;           /**< sampling: keep the k best; 0 = off */
    float top_p;             /**< sampling: nucleus mass; 1 = off */
    uint64_t seed;           /**< sampling seed */
    int ignore_eos;          /**< 1: do not stop at the checkpoint's end-of-sequence ids */
    int want_logits;         /**< 1: return each prompt's last-position logits (f32) */
    int cuda_graph;          /**< 1: a model on CUDA captures its decode step in a CUDA graph once per
                                  batch size (and experts backend) and replays it for every later decode
                                  step of that size; each step's ids and positions are written into the
                                  same device buffers first. Same tokens as 0. Default 0; 1 on a model
                                  loaded on the cpu fails (MOEX_ERR_INVALID_ARGUMENT) */
} moex_generate_options;

/** Defaults: 16 new tokens, greedy, top_p 1, seed 0. */
moex_generate_options moex_generate_default_options(void);

/** What moex_generate() returns; free with moex_generation_free(). */
typedef struct moex_generation {
    int n;                       /**< prompts */
    int64_t *num_new;            /**< [n] tokens generated per prompt */
    int32_t **new_ids;           /**< [n][num_new[i]] */
    int64_t vocab;
    float **last_prompt_logits;  /**< [n][vocab] when asked, else NULL */
    double prefill_seconds, decode_seconds;
    int64_t prefill_tokens, decode_tokens;
} moex_generation;

/**
 * Generate from n prompts in one batch: prefill the prompts together, in steps
 * of at most max_tokens tokens (a longer prompt goes in pieces), then decode
 * one token per unfinished prompt per step. The decode-step switch of
 * SPEC R3 applies to the decode steps (CUDA only) and the backends in force
 * are restored when it returns, also on error. On the cpu it first checks that
 * the checkpoint's files are unchanged since load (moex_model_load()). A NaN
 * logit where a token is chosen fails (MOEX_ERR_INVALID_ARGUMENT, naming its index).
 */
moex_status moex_generate(moex_model *model, int n, const int32_t *const *prompts, const int64_t *prompt_lens,
                          const moex_generate_options *options, moex_generation **out);

/** Free a generation. NULL is a no-op. */
void moex_generation_free(moex_generation *g);

#ifdef __cplusplus
}
#endif

#endif /* MOEX_H */
