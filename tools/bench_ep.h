/*
 * bench_ep.h — `moex bench --ep N` (tools/bench_ep.c): every backend's experts layer as an
 * expert-parallel group of N ranks (threads of this process, on the CPU or on the GPUs of
 * --device's list), timed beside the same layer on one device in the same run.
 */
#ifndef MOEX_TOOLS_BENCH_EP_H
#define MOEX_TOOLS_BENCH_EP_H

#include "bench_options.h"

/** The whole --ep run of o (parsed and checked): the table, and the CSV when asked.
 *  Returns 0, EXIT_RUNTIME or EXIT_USAGE after printing why. */
int bench_ep_run(const bench_opts *o);

#endif /* MOEX_TOOLS_BENCH_EP_H */
