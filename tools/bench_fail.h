/*
 * bench_fail.h — how the parts of `moex bench` report a failure (tools/bench_fail.c): a failed
 * moex call with its message, memory that could not be had, a failed write to stdout.
 */
#ifndef MOEX_TOOLS_BENCH_FAIL_H
#define MOEX_TOOLS_BENCH_FAIL_H

#include "moex.h"

/** A failed moex call: print "moex bench: WHAT failed: <its message>"; returns EXIT_RUNTIME (1). */
int bench_moex_failed(const char *what, moex_status s);

/**
 * *p = malloc(bytes) (NULL for 0 bytes). Returns 0, or EXIT_RUNTIME (1) after printing
 * "out of memory for WHAT".
 */
int bench_alloc(void **p, double bytes, const char *what);

/** EXIT_RUNTIME (1) if a write to stdout has failed (main says so at exit): no use going on; else 0. */
int bench_stdout_failed(void);

#endif /* MOEX_TOOLS_BENCH_FAIL_H */
