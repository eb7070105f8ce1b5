/*
 * clang14_cpu_supports.h — force-included (clang -include) into
 * src/core/device.c for the fuzz build only: clang 14's
 * __builtin_cpu_supports() does not know the feature "f16c", which
 * device.c asks for (gcc does). This maps the builtin to a function that
 * answers "f16c" from cpuid and passes the other names to the builtin.
 */
#ifndef MOEX_FUZZ_CLANG14_CPU_SUPPORTS_H
#define MOEX_FUZZ_CLANG14_CPU_SUPPORTS_H
#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#include <string.h>

static inline int moex_fuzz_cpu_supports(const char *feature) {
    unsigned a, b, c, d;
    if (strcmp(feature, "f16c") == 0) return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    if (strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
    if (strcmp(feature, "fma") == 0) return __builtin_cpu_supports("fma");
    return 0;
}
#define __builtin_cpu_supports(feature) moex_fuzz_cpu_supports(feature)
#endif
#endif
