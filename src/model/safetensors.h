/*
 * safetensors.h — strict reader of safetensors files and checkpoints (internal).
 *
 * A safetensors file is
 *     [u64 little-endian N] [N bytes of JSON header] [data section]
 * where the header maps tensor names to {"dtype", "shape", "data_offsets":
 * [begin, end]} (offsets relative to the data section) plus an optional
 * "__metadata__" object of strings.
 *
 * moex_safetensors_parse() validates a whole file image held in memory (it is
 * the fuzz target); moex_checkpoint_open() memory-maps one file
 * (DIR/model.safetensors) or the shards named by
 * DIR/model.safetensors.index.json, validates each, and gives every tensor as
 * a pointer into the read-only mapping: weights are used in place, never
 * copied.
 *
 * Every failure returns a status and records a message (moex_last_error())
 * naming the file, the tensor and the bad value; outputs are untouched.
 */
#ifndef MOEX_SAFETENSORS_H
#define MOEX_SAFETENSORS_H

#include "moex.h"
#include <stddef.h>
#include <stdint.h>

/** Highest tensor rank accepted in a file. */
#define MOEX_ST_MAX_DIMS 8
/** Largest accepted JSON header, in bytes (100 MiB). */
#define MOEX_ST_MAX_HEADER ((uint64_t)100 << 20)

/** Element types a safetensors file may store (the header's "dtype" strings). */
typedef enum moex_st_dtype {
    MOEX_ST_BOOL = 0, /* "BOOL"    1 byte */
    MOEX_ST_U8,       /* "U8"      1 */
    MOEX_ST_I8,       /* "I8"      1 */
    MOEX_ST_F8_E4M3,  /* "F8_E4M3" 1 (FP8 e4m3fn) */
    MOEX_ST_F8_E5M2,  /* "F8_E5M2" 1 */
    MOEX_ST_F8_E8M0,  /* "F8_E8M0" 1 (UE8M0 power-of-two scales) */
    MOEX_ST_U16,      /* "U16"     2 */
    MOEX_ST_I16,      /* "I16"     2 */
    MOEX_ST_F16,      /* "F16"     2 */
    MOEX_ST_BF16,     /* "BF16"    2 */
    MOEX_ST_U32,      /* "U32"     4 */
    MOEX_ST_I32,      /* "I32"     4 */
    MOEX_ST_F32,      /* "F32"     4 */
    MOEX_ST_U64,      /* "U64"     8 */
    MOEX_ST_I64,      /* "I64"     8 */
    MOEX_ST_F64,      /* "F64"     8 */
    MOEX_ST_DTYPE_COUNT
} moex_st_dtype;

/* Bytes per element of a stored dtype; 0 for an invalid value. */
size_t moex_st_dtype_size(moex_st_dtype dtype);

/* The header spelling ("BF16", "F8_E4M3", ...); "invalid" for an unknown value. */
const char *moex_st_dtype_name(moex_st_dtype dtype);

/* Parse a header dtype string (exact, case-sensitive). MOEX_ERR_FORMAT with
 * the list of known names if unknown. */
moex_status moex_st_dtype_parse(const char *name, moex_st_dtype *out);

/* The moex_dtype of a stored dtype: F32, F16, BF16, F8_E4M3 -> E4M3,
 * F8_E8M0 -> UE8M0, I32, I64. MOEX_ERR_UNSUPPORTED (naming it) for the others. */
moex_status moex_st_dtype_to_moex(moex_st_dtype dtype, moex_dtype *out);

/** One tensor of a parsed file. */
typedef struct moex_st_tensor {
    char *name;                       /* owned by the moex_st_file */
    moex_st_dtype dtype;
    int ndim;                         /* 0 (scalar) .. MOEX_ST_MAX_DIMS */
    int64_t shape[MOEX_ST_MAX_DIMS];  /* entries past ndim are 0 */
    uint64_t offset;                  /* from the start of the file (data section start + begin) */
    uint64_t nbytes;                  /* end - begin */
} moex_st_tensor;

/** A parsed, validated file: its tensors in header order and its metadata. */
typedef struct moex_st_file {
    uint64_t header_len;      /* N */
    uint64_t data_start;      /* 8 + N */
    size_t n_tensors;
    moex_st_tensor *tensors;  /* header order */
    size_t n_metadata;
    char **metadata;          /* key0, value0, key1, value1, ... (2 * n_metadata strings) */
} moex_st_file;

/*
 * Parse and strictly validate the whole file image buf[0..size) (`what`, e.g.
 * the path, names it in messages). Checks: 8-byte length N with
 * 0 < N <= MOEX_ST_MAX_HEADER and N <= size - 8; the header is UTF-8 JSON (a
 * single object, only whitespace after it); "__metadata__" an object of
 * strings; every tensor an object with a known dtype, a shape of at most
 * MOEX_ST_MAX_DIMS non-negative integers and data_offsets [begin, end] of
 * integers, begin <= end, end within the data section, prod(shape) x dtype
 * size == end - begin without overflow; no two tensors' byte ranges overlap;
 * no name twice. Gaps between tensors and bytes after the last one are
 * allowed. Offsets are 64-bit. On success *out owns its memory (free it with
 * moex_st_file_free); on failure *out is untouched.
 * Errors: MOEX_ERR_FORMAT, MOEX_ERR_OUT_OF_MEMORY, MOEX_ERR_INVALID_ARGUMENT.
 */
moex_status moex_safetensors_parse(const uint8_t *buf, size_t size, const char *what,
                                   moex_st_file *out);

/* Free what moex_safetensors_parse() allocated and zero *f. NULL is a no-op. */
void moex_st_file_free(moex_st_file *f);

/* Value of metadata `key`, or NULL if absent. */
const char *moex_st_file_metadata(const moex_st_file *f, const char *key);

/* ---------------------------------------------------------------------- */
/* Checkpoints: one file or shards, memory-mapped                           */
/* ---------------------------------------------------------------------- */

/** A tensor of an open checkpoint. */
typedef struct moex_ckpt_tensor {
    const char *name;
    moex_st_dtype dtype;
    int ndim;
    int64_t shape[MOEX_ST_MAX_DIMS];
    const void *data;   /* inside the read-only mapping of its shard; valid until close.
                           Aligned only as well as the file placed it (see moex_ckpt_tensor_view). */
    uint64_t nbytes;
    int shard;          /* index into the checkpoint's shards */
} moex_ckpt_tensor;

/** An open checkpoint (opaque). Read-only after open: safe to share between threads. */
typedef struct moex_checkpoint moex_checkpoint;

/*
 * Open the checkpoint in directory `dir`: DIR/model.safetensors if it exists,
 * else DIR/model.safetensors.index.json (its "weight_map" maps each tensor
 * name to a shard file in DIR; every shard must exist and hold the tensors
 * the index assigns to it). `dir` may also name a .safetensors file itself.
 * Each file is mapped read-only (MAP_PRIVATE) and validated with
 * moex_safetensors_parse(); a name found in two shards is an error.
 * Errors: MOEX_ERR_IO (missing or unreadable file, named; anything but a regular
 * file), MOEX_ERR_FORMAT, MOEX_ERR_OUT_OF_MEMORY, MOEX_ERR_INVALID_ARGUMENT (NULL argument).
 * The files must not change while they are open: see moex_checkpoint_verify.
 */
moex_status moex_checkpoint_open(const char *dir, moex_checkpoint **out);

/*
 * Are the mapped files as they were when mapped? Each one (the open file itself, not
 * whatever its path names now: a file replaced by rename leaves the mapping intact) must
 * have its size and modification time of then. A file that shrank would
 * fault (SIGBUS) where the mapping passes its end, and one written in place would change
 * the weights, so moex_generate calls this before it reads any weight and fails with
 * MOEX_ERR_IO naming the file. A change during a call in flight is not detected.
 */
moex_status moex_checkpoint_verify(const moex_checkpoint *c);

/* Unmap and free. NULL is a no-op. Every pointer obtained from c dies with it. */
void moex_checkpoint_close(moex_checkpoint *c);

/* Number of tensors over all shards (0 for NULL). */
size_t moex_checkpoint_count(const moex_checkpoint *c);

/* The i-th tensor in name order (strcmp), or NULL if i is out of range. */
const moex_ckpt_tensor *moex_checkpoint_at(const moex_checkpoint *c, size_t i);

/* The tensor called `name` (binary search), or NULL if absent. Records no error. */
const moex_ckpt_tensor *moex_checkpoint_find(const moex_checkpoint *c, const char *name);

/* As moex_checkpoint_find, but a missing name is MOEX_ERR_NOT_FOUND with a
 * message naming it and the checkpoint. */
moex_status moex_checkpoint_get(const moex_checkpoint *c, const char *name,
                                const moex_ckpt_tensor **out);

/* Number of files mapped (1 for a single file). */
int moex_checkpoint_shard_count(const moex_checkpoint *c);

/* Path of shard i as opened, or NULL if out of range. */
const char *moex_checkpoint_shard_path(const moex_checkpoint *c, int i);

/* The parsed header of shard i (metadata, offsets), or NULL if out of range. */
const moex_st_file *moex_checkpoint_shard_file(const moex_checkpoint *c, int i);

/*
 * A moex_tensor view of t in place (no copy): fails with MOEX_ERR_UNSUPPORTED
 * if its dtype has no moex_dtype or its rank exceeds MOEX_MAX_DIMS, and if
 * the data is not aligned to its element size (then the caller must copy).
 * A rank-0 tensor becomes shape [1]. The memory is read-only: never write
 * through view->data.
 */
moex_status moex_ckpt_tensor_view(const moex_ckpt_tensor *t, moex_tensor *view);

#endif /* MOEX_SAFETENSORS_H */
