/*
 * bench_host.h — what `moex bench` reads about the machine it runs on (tools/bench_host.c):
 * a clock, free memory, the CPU's name, caches and features, and how busy others keep it.
 */
#ifndef MOEX_TOOLS_BENCH_HOST_H
#define MOEX_TOOLS_BENCH_HOST_H

#include "moex.h"

#include <stddef.h>

/** Seconds of CLOCK_MONOTONIC. */
double bench_now_s(void);

/** Median of n values (sorts them). */
double bench_median(double *v, int n);

/** Bytes of memory available now (MemAvailable), or 0 if unknown. */
double bench_mem_available_bytes(void);

/** The CPU's model name from /proc/cpuinfo, else moex's name for the device; quotes and commas removed. */
void bench_read_cpu_model(const moex_device_info *cpu, char *buf, size_t size);

/** Size in bytes of the largest CPU cache (sysfs), or 0 if unknown. */
size_t bench_largest_cache_bytes(void);

/** 1 if the CPU has AVX2 (checked at run time). */
int bench_cpu_has_avx2(void);

/** CPU time of the whole machine (/proc/stat) and of this process, in seconds. */
typedef struct cpu_sample {
    double busy, total, self;
    int ok;
} cpu_sample;

cpu_sample bench_sample_cpu(void);

/** Share of the CPU time between a and b used by others (processes, hypervisor); NaN: unknown. */
double bench_other_cpu_share(cpu_sample a, cpu_sample b);

#endif /* MOEX_TOOLS_BENCH_HOST_H */
