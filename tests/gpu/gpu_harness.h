/*
 * gpu_harness.h — what the GPU test programs share: soft checks that count and report
 * failures and keep going, and the command line
 *   PROGRAM [--quick] [--device N]      (or MOEX_GPU_TEST_QUICK=1 for --quick)
 * Header-only (one test program per translation unit); nothing here calls the library.
 */
#ifndef MOEX_TEST_GPU_HARNESS_H
#define MOEX_TEST_GPU_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRINT_MAX 40 /* failures printed in full */

static int g_failures; /* checks failed in the whole run */
static int g_checks;   /* checks made */
static int g_quick;    /* --quick */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4), unused)) /* not every program calls it */
#endif
static void fail_at(const char *file, int line, const char *fmt, ...) {
    if (g_failures++ < PRINT_MAX) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "FAIL (%s:%d): ", file, line);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    } else if (g_failures == PRINT_MAX + 1) {
        fprintf(stderr, "(further failures not printed)\n");
    }
}

/* A soft check: count it, report it, keep going. */
#define CHECK(cond, ...)                                       \
    do {                                                       \
        g_checks++;                                            \
        if (!(cond)) fail_at(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Parse argv into *quick and *device (left as they are when not given). 0, or 2 after a
 * usage message naming the bad argument. */
static inline int gpu_test_args(const char *prog, int argc, char **argv, int *quick, int *device) {
    const char *q = getenv("MOEX_GPU_TEST_QUICK");
    *quick = q && *q && strcmp(q, "0") != 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            *quick = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            char *end = NULL;
            long v = strtol(argv[++i], &end, 10);
            if (!end || *end || v < 0 || v > 1023) {
                fprintf(stderr, "%s: --device \"%s\" is not a GPU index\n", prog, argv[i]);
                return 2;
            }
            *device = (int)v;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--device N]\n(\"%s\" not understood)\n", prog, argv[i]);
            return 2;
        }
    }
    return 0;
}

#endif
