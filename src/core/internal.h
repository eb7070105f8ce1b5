/* internal.h — helpers shared inside libmoex (not installed). */
#ifndef MOEX_INTERNAL_H
#define MOEX_INTERNAL_H

#include "moex.h"
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */

/* Record a formatted message as this thread's last error; returns status. */
moex_status moex_fail(moex_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* How many messages this thread has recorded (moex_fail, moex_backend_fail): equal before and
 * after a call means that the call set none. */
uint64_t moex_error_mark(void);

/* ---- dtypes ------------------------------------------------------------ */

static inline float moex_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t moex_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float moex_f16_to_f32(uint16_t h);
uint16_t moex_f32_to_f16(float f);

/* Element i of a float-like array (f32/f16/bf16) as f32. p need not be aligned: the
 * element is read with memcpy (a plain load once compiled). */
static inline float moex_load_f32(const void *p, moex_dtype dt, int64_t i) {
    float f;
    uint16_t h;
    switch (dt) {
    case MOEX_F32: memcpy(&f, (const char *)p + i * 4, 4); return f;
    case MOEX_BF16: memcpy(&h, (const char *)p + i * 2, 2); return moex_bf16_to_f32(h);
    case MOEX_F16: memcpy(&h, (const char *)p + i * 2, 2); return moex_f16_to_f32(h);
    default: return 0.0f;
    }
}

/* Store v as element i of a float-like array; p need not be aligned. */
static inline void moex_store_f32(void *p, moex_dtype dt, int64_t i, float v) {
    uint16_t h;
    switch (dt) {
    case MOEX_F32: memcpy((char *)p + i * 4, &v, 4); break;
    case MOEX_BF16: h = moex_f32_to_bf16(v); memcpy((char *)p + i * 2, &h, 2); break;
    case MOEX_F16: h = moex_f32_to_f16(v); memcpy((char *)p + i * 2, &h, 2); break;
    default: break;
    }
}

static inline int moex_is_float_dtype(moex_dtype dt) {
    return dt == MOEX_F32 || dt == MOEX_F16 || dt == MOEX_BF16;
}

/* ---- tensors ----------------------------------------------------------- */

/* 1 if t is a present view (data or a non-zero rank). */
static inline int moex_tensor_present(const moex_tensor *t) {
    return t->data != NULL || t->ndim != 0;
}

/* Check that `t` (named `what` in messages) has rank ndim and the given
 * shape (a -1 entry accepts any size), and a valid dtype and device. */
moex_status moex_check_shape(const moex_tensor *t, const char *what, int ndim,
                             const int64_t *shape);
/* Check t is row-major contiguous. */
moex_status moex_check_contiguous(const moex_tensor *t, const char *what);
/* Check a 2-D matrix view: inner stride 1, row stride >= cols (rows > 1). */
moex_status moex_check_rows(const moex_tensor *t, const char *what);
/* Fail (MOEX_ERR_INVALID_ARGUMENT, naming both) if views a and b share a byte. Both must have
 * passed moex_check_shape. Exact for 2-D views with inner stride 1 (rows, possibly with gaps
 * between them: rows of one view may sit in the gaps of the other); any other view counts as
 * the whole range from its first to its last byte. Views without elements share nothing. */
moex_status moex_check_disjoint(const moex_tensor *a, const char *a_name, const moex_tensor *b, const char *b_name);
/* Format a device as "cpu", "cuda:1" (or "device kind 7") into buf. */
const char *moex_device_str(moex_device d, char *buf, size_t n);
/* Format a shape as "[2, 3, 4]" into buf. */
const char *moex_shape_str(const moex_tensor *t, char *buf, size_t n);

/* The decimal integer in environment variable `name` when it is one in [lo, hi]; else fallback
 * (unset, empty, not a number, out of range). For the few settings a size predicate lets a
 * caller override. */
int64_t moex_env_int(const char *name, int64_t lo, int64_t hi, int64_t fallback);

/* a * b into *out, 0 on int64 overflow or a negative factor. */
static inline int moex_mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* a + b into *out, 0 on int64 overflow or a negative term. */
static inline int moex_add_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0 || a > INT64_MAX - b) return 0;
    *out = a + b;
    return 1;
}

/* ceil(a / b) for a >= 0 and b >= 1, without the overflow of (a + b - 1) / b when b is large. */
static inline int64_t moex_ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* ---- files ------------------------------------------------------------- */

struct stat;

/* Open path read-only into *fd (close-on-exec; a FIFO does not block the open) and fstat it
 * into *sb. Anything but a regular file is MOEX_ERR_IO, naming the path; *missing (when not
 * NULL) is 1 when it does not exist. */
moex_status moex_open_regular(const char *path, int *fd, struct stat *sb, int *missing);

/* Read the whole file at path (at most limit bytes) into a NUL-terminated malloc'd
 * buffer; *missing (when not NULL) tells a file that does not exist from other errors.
 * Anything but a regular file (a FIFO, a device, a directory) is MOEX_ERR_IO, without waiting on it. */
moex_status moex_read_file(const char *path, size_t limit, char **buf, size_t *len, int *missing);

/* ---- devices ----------------------------------------------------------- */

int moex_cpu_has_avx2(void);
int moex_cpu_cores(void);

#ifdef __cplusplus
}
#endif

#endif
