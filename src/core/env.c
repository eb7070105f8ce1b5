/* env.c — settings read from the environment (see internal.h). */
#include "core/internal.h"

#include <stdlib.h>

int64_t moex_env_int(const char *name, int64_t lo, int64_t hi, int64_t fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end = NULL;
    const long long n = strtoll(v, &end, 10);
    return end && !*end && n >= lo && n <= hi ? (int64_t)n : fallback;
}
