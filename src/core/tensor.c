/* tensor.c — tensor views: construction and the checks every entry point uses. */
#include "core/internal.h"
#include <stdio.h>

moex_status moex_tensor_init(moex_tensor *t, void *data, moex_dtype dtype, int ndim,
                             const int64_t *shape) {
    if (!t || !shape) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: null argument");
    if (ndim < 1 || ndim > MOEX_MAX_DIMS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: ndim = %d is outside [1, %d]",
                         ndim, MOEX_MAX_DIMS);
    if ((unsigned)dtype >= MOEX_DTYPE_COUNT)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: dtype = %d is not a moex_dtype", (int)dtype);
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: shape[%d] = %lld is negative", i,
                             (long long)shape[i]);
        if (!moex_mul_ok(count, shape[i], &count))
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: element count overflows int64");
    }
    int64_t bytes;
    if (!moex_mul_ok(count, (int64_t)moex_dtype_size(dtype), &bytes))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: byte size overflows int64");
    if (!data && count > 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_tensor_init: data is NULL for %lld elements",
                         (long long)count);
    moex_tensor v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dtype;
    v.ndim = ndim;
    v.device.kind = MOEX_DEVICE_CPU;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        v.shape[i] = shape[i];
        v.strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    *t = v;
    return MOEX_OK;
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
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= t->shape[i];
    if (count > 0 && !t->data) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: data is NULL", what);
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
    int64_t last;
    if (t->shape[0] > 0 && !moex_mul_ok(t->shape[0] - 1, t->strides[0], &last))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: row stride = %lld overflows", what, (long long)t->strides[0]);
    return MOEX_OK;
}
