/*
 * bench_host.c — the machine as `moex bench` sees it: clock, memory, CPU name, caches,
 * AVX2, and the CPU time that other processes take while it measures.
 */
#define _XOPEN_SOURCE 700

#include "bench_host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

double bench_mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024.0;
}

void bench_read_cpu_model(const moex_device_info *cpu, char *buf, size_t size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    size_t n = strnlen(cpu->name, sizeof cpu->name); /* a bounded copy: buf and cpu may share a struct */
    if (n >= size)
        n = size - 1;
    memmove(buf, cpu->name, n);
    buf[n] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon += 1 + strspn(colon + 1, " \t");
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(buf, size, "%s", colon);
            break;
        }
    }
    if (f)
        fclose(f);
    for (char *p = buf; *p; p++)
        if (*p == '"' || *p == ',')
            *p = ' ';
}

size_t bench_largest_cache_bytes(void)
{
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            size_t b = v * (unit == 'K' ? 1024ul : unit == 'M' ? 1048576ul : 1ul);
            best = b > best ? b : best;
        }
        fclose(f);
    }
    return best;
}

cpu_sample bench_sample_cpu(void)
{
    cpu_sample c = {0.0, 0.0, 0.0, 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    long hz = sysconf(_SC_CLK_TCK);
    struct rusage ru;
    if (f && hz > 0 &&
        fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6], &v[7]) == 8 &&
        getrusage(RUSAGE_SELF, &ru) == 0) {
        /* user nice system idle iowait irq softirq steal: steal counts as busy (another guest) */
        double idle = (double)(v[3] + v[4]);
        double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        c.busy = busy / hz;
        c.total = (busy + idle) / hz;
        c.self = (double)ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec +
                 (double)ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec;
        c.ok = 1;
    }
    if (f)
        fclose(f);
    return c;
}

double bench_other_cpu_share(cpu_sample a, cpu_sample b)
{
    double total = b.total - a.total;
    if (!a.ok || !b.ok || total <= 0.0)
        return NAN;
    double other = (b.busy - a.busy) - (b.self - a.self);
    return other > 0.0 ? other / total : 0.0;
}

