/* dispatch.h — what the experts front end (and the model) ask of the dispatch table. The table
 * itself, the one place that decides which implementation runs for (backend, device, weight
 * format), is src/backends/table.c; the front end sees only these calls. */
#ifndef MOEX_EXPERTS_DISPATCH_H
#define MOEX_EXPERTS_DISPATCH_H

#include "experts/experts_internal.h"

/* The weight formats a table row takes, as bits. */
typedef enum moex_weight_format {
    MOEX_FORMAT_FLOAT = 1, /* f32, f16, bf16 */
    MOEX_FORMAT_FP8 = 2,   /* e4m3 with block scales */
    MOEX_FORMAT_FP4 = 4    /* e2m1 (two per byte) with block scales */
} moex_weight_format;

/* The format of a layer's weights (its weight dtype's), or 0 for a dtype no row can take. */
moex_weight_format moex_weight_format_of(const moex_experts_desc *d);
/* "f32/f16/bf16", "fp8 (e4m3)", "fp4 (e2m1)" for one bit; "" otherwise. */
const char *moex_weight_format_name(moex_weight_format f);

/* The built-in backends, in registration order: *count entries. */
const moex_backend *moex_builtin_backends(int *count);

/* The weight formats (bits) that some built-in backend runs on devices of `kind`: what a
 * loader may keep in its stored format there rather than dequantize. */
unsigned moex_dispatch_device_formats(moex_device_kind kind);

/* The backend that runs decode steps (one new token per sequence) for `name` on devices of
 * `kind`: the table's decode_with for that row, or name itself. */
const char *moex_dispatch_decode_backend(const char *name, moex_device_kind kind);

#endif
