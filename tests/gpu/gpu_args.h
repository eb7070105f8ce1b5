/*
 * gpu_args.h — the command line shared by the GPU test programs:
 *   PROGRAM [--quick] [--device N]      (or MOEX_GPU_TEST_QUICK=1 for --quick)
 * Header-only; nothing here calls the library.
 */
#ifndef MOEX_TEST_GPU_ARGS_H
#define MOEX_TEST_GPU_ARGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
