/*
 * moex/base.h — what every user of libmoex meets: the version, statuses and
 * errors, element types and their codecs, devices and memory, tensor views.
 */
#ifndef MOEX_BASE_H
#define MOEX_BASE_H

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

#ifdef __cplusplus
}
#endif

#endif /* MOEX_BASE_H */
