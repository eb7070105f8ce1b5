/* tensor.c — tensor views: construction and the checks every entry point uses. */
#include "core/internal.h"
#include <stdio.h>

moex_status moex_tensor_init(moex_tensor *t, void *data, moex_dtype dtype, int ndim,
                             const int64_t *shape) {
    if (!t || !shape) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: %s is NULL", t ? "shape" : "t");
    if (ndim < 1 || ndim > MOEX_MAX_DIMS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: ndim = %d is outside [1, %d]",
                         ndim, MOEX_MAX_DIMS);
    if ((unsigned)dtype >= MOEX_DTYPE_COUNT)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: dtype = %d is not a moex_dtype", (int)dtype);
    moex_tensor v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dtype;
    v.ndim = ndim;
    v.device.kind = MOEX_DEVICE_CPU;
    for (int i = 0; i < ndim; i++) v.shape[i] = shape[i];
    char buf[96];
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: shape[%d] = %lld is negative", i,
                             (long long)shape[i]);
        if (!moex_mul_ok(count, shape[i], &count))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: shape %s: the element count overflows int64",
                             moex_shape_str(&v, buf, sizeof buf));
    }
    int64_t bytes;
    if (!moex_mul_ok(count, (int64_t)moex_dtype_size(dtype), &bytes))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: shape %s of %s: the byte size overflows int64",
                         moex_shape_str(&v, buf, sizeof buf), moex_dtype_name(dtype));
    if (!data && count > 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: data is NULL for %lld elements",
                         (long long)count);
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        v.strides[i] = stride;
        if (i > 0 && !moex_mul_ok(stride, shape[i] > 0 ? shape[i] : 1, &stride)) /* only with a 0 dimension */
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: shape %s: the row-major strides overflow int64",
                             moex_shape_str(&v, buf, sizeof buf));
    }
    *t = v;
    return MOEX_OK;
}

const char *moex_device_str(moex_device d, char *buf, size_t n) {
    if (d.kind == MOEX_DEVICE_CPU) snprintf(buf, n, "cpu");
    else if (d.kind == MOEX_DEVICE_CUDA) snprintf(buf, n, "cuda:%d", d.index);
    else snprintf(buf, n, "device kind %d", (int)d.kind);
    return buf;
}

const char *moex_shape_str(const moex_tensor *t, char *buf, size_t n) {
    size_t len = 0;
    len += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && i < MOEX_MAX_DIMS && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

moex_status moex_check_shape(const moex_tensor *t, const char *what, int ndim, const int64_t *shape) {
    char got[96];
    if ((unsigned)t->dtype >= MOEX_DTYPE_COUNT)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: dtype = %d is not a moex_dtype", what, (int)t->dtype);
    if (t->ndim != ndim) {
        if (t->ndim < 0 || t->ndim > MOEX_MAX_DIMS)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: ndim = %d, expected %d", what, t->ndim, ndim);
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s has shape %s (rank %d), expected rank %d", what,
                         moex_shape_str(t, got, sizeof got), t->ndim, ndim);
    }
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is negative", what, i,
                             (long long)t->shape[i]);
        if (shape[i] >= 0 && t->shape[i] != shape[i]) {
            char want[96];
            size_t len = (size_t)snprintf(want, sizeof want, "[");
            for (int j = 0; j < ndim; j++)
                len += (size_t)snprintf(want + len, sizeof want - len, shape[j] < 0 ? "%s*" : "%s%lld",
                                        j ? ", " : "", (long long)shape[j]);
            snprintf(want + len, sizeof want - len, "]");
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s has shape %s, expected %s (dimension %d is %lld, not %lld)",
                             what, moex_shape_str(t, got, sizeof got), want, i, (long long)t->shape[i],
                             (long long)shape[i]);
        }
    }
    if (t->device.kind != MOEX_DEVICE_CPU && t->device.kind != MOEX_DEVICE_CUDA)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: device kind %d is not a moex_device_kind", what,
                         (int)t->device.kind);
    int64_t count = 1, bytes;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] == 0) return MOEX_OK; /* no elements: data may be anything */
    const size_t esz = moex_dtype_size(t->dtype);
    for (int i = 0; i < ndim; i++)
        if (!moex_mul_ok(count, t->shape[i], &count))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s has shape %s: more elements than int64 can count", what,
                             moex_shape_str(t, got, sizeof got));
    if (!moex_mul_ok(count, (int64_t)esz, &bytes))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s has shape %s of %s: more bytes than int64 can count", what,
                         moex_shape_str(t, got, sizeof got), moex_dtype_name(t->dtype));
    if (!t->data) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: data is NULL", what);
    if ((uintptr_t)t->data % esz)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: data at %p is not aligned to its %zu-byte %s elements", what,
                         t->data, esz, moex_dtype_name(t->dtype));
    return MOEX_OK;
}

moex_status moex_check_contiguous(const moex_tensor *t, const char *what) {
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] > 1 && t->strides[i] != want)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                             "%s: strides[%d] = %lld but row-major contiguous needs %lld (weights must be contiguous)",
                             what, i, (long long)t->strides[i], (long long)want);
        if (!moex_mul_ok(want, t->shape[i] > 0 ? t->shape[i] : 1, &want))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: element count overflows int64", what);
    }
    return MOEX_OK;
}

moex_status moex_check_rows(const moex_tensor *t, const char *what) {
    if (t->shape[1] > 1 && t->strides[1] != 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: inner stride = %lld, must be 1", what,
                         (long long)t->strides[1]);
    if (t->shape[0] > 1 && t->strides[0] < t->shape[1])
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: row stride = %lld is smaller than the row length %lld (rows would overlap)",
                         what, (long long)t->strides[0], (long long)t->shape[1]);
    int64_t last; /* the row stride of a single row is never used */
    if (t->shape[0] > 1 && !moex_mul_ok(t->shape[0] - 1, t->strides[0], &last))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: row stride = %lld overflows", what, (long long)t->strides[0]);
    return MOEX_OK;
}

/* The bytes a view covers: `rows` runs of `len` bytes, `stride` bytes apart, from `base`
 * (stride >= len when rows > 1). */
typedef struct span {
    uintptr_t base;
    uint64_t rows, stride, len;
} span;

/* t -> its span: 1; 0 when it has no elements; -1 when its bytes do not fit in the address space. */
static int tensor_span(const moex_tensor *t, span *s) {
    const int64_t esz = (int64_t)moex_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 0;
    int64_t rows = 1, len, stride, extent, below = 0; /* below: bytes before data (negative strides) */
    if (t->ndim == 2 && (t->shape[1] == 1 || t->strides[1] == 1) && (t->shape[0] == 1 || t->strides[0] >= t->shape[1])) {
        rows = t->shape[0]; /* rows of a matrix view, maybe with gaps between them */
        if (!moex_mul_ok(t->shape[1], esz, &len)) return -1;
        stride = len;
        if (rows > 1 && !moex_mul_ok(t->strides[0], esz, &stride)) return -1;
        if (!moex_mul_ok(rows - 1, stride, &extent) || !moex_add_ok(extent, len, &extent)) return -1;
    } else { /* any other view: from its lowest to its highest element */
        int64_t lo = 0, hi = 0, reach, n;
        for (int i = 0; i < t->ndim; i++) {
            const int64_t st = t->strides[i];
            if (st == INT64_MIN || !moex_mul_ok(t->shape[i] - 1, st < 0 ? -st : st, &reach)) return -1;
            if (!(st < 0 ? moex_add_ok(lo, reach, &lo) : moex_add_ok(hi, reach, &hi))) return -1;
        }
        if (!moex_add_ok(lo, hi, &n) || !moex_add_ok(n, 1, &n) || !moex_mul_ok(n, esz, &len) ||
            !moex_mul_ok(lo, esz, &below))
            return -1;
        stride = extent = len;
    }
    const uintptr_t data = (uintptr_t)t->data;
    if ((uint64_t)below > data || (uint64_t)extent > UINTPTR_MAX - (data - (uintptr_t)below)) return -1;
    s->base = data - (uintptr_t)below;
    s->rows = (uint64_t)rows;
    s->stride = (uint64_t)stride;
    s->len = (uint64_t)len;
    return 1;
}

static uint64_t span_extent(const span *s) { return (s->rows - 1) * s->stride + s->len; }

/* 1 if spans x and y share a byte. */
static int spans_overlap(const span *x, const span *y) {
    if (x->base + span_extent(x) <= y->base || y->base + span_extent(y) <= x->base) return 0;
    if (x->rows > 1 && y->rows > 1 && x->stride == y->stride) { /* the same row stride: one offset tells (O(1)) */
        if (x->base < y->base) {
            const span *t = x;
            x = y;
            y = t;
        }
        /* x's row i starts r bytes into the slot of y's row i + q; it reaches at most into the next slot */
        const uint64_t d = x->base - y->base, q = d / y->stride, r = d % y->stride;
        return (q < y->rows && r < y->len) || (q + 1 < y->rows && r + x->len > y->stride);
    }
    /* otherwise each run of the span with fewer runs against the first run of the other that ends after it starts */
    if (x->rows > y->rows) {
        const span *t = x;
        x = y;
        y = t;
    }
    for (uint64_t i = 0; i < x->rows; i++) {
        const uintptr_t lo = x->base + i * x->stride, hi = lo + x->len;
        uint64_t j = 0;
        if (lo >= y->base + y->len) {
            if (y->rows == 1) continue;
            j = (lo - y->base - y->len) / y->stride + 1;
        }
        if (j < y->rows && y->base + j * y->stride < hi) return 1;
    }
    return 0;
}

moex_status moex_check_disjoint(const moex_tensor *a, const char *a_name, const moex_tensor *b, const char *b_name) {
    span sa, sb;
    const int ka = tensor_span(a, &sa), kb = tensor_span(b, &sb);
    if (ka < 0 || kb < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: the bytes of its shape and strides from %p do not fit in the "
                         "address space", ka < 0 ? a_name : b_name, ka < 0 ? a->data : b->data);
    if (!ka || !kb || !spans_overlap(&sa, &sb)) return MOEX_OK;
    char as[96], bs[96];
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                     "%s %s at %p (%llu bytes) and %s %s at %p (%llu bytes) share memory: %s must not overlap %s",
                     a_name, moex_shape_str(a, as, sizeof as), a->data, (unsigned long long)span_extent(&sa), b_name,
                     moex_shape_str(b, bs, sizeof bs), b->data, (unsigned long long)span_extent(&sb), a_name, b_name);
}
