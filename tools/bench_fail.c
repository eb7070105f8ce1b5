/* bench_fail.c — the failure messages `moex bench` prints (see bench_fail.h). */
#include "bench_fail.h"
#include "bench_options.h"
#include "cli.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int bench_moex_failed(const char *what, moex_status s)
{
    const char *msg = moex_last_error();
    fprintf(stderr, "moex bench: %s failed: %s\n", what, (msg && *msg) ? msg : moex_status_str(s));
    return EXIT_RUNTIME;
}

int bench_alloc(void **p, double bytes, const char *what)
{
    *p = NULL;
    if (bytes > 0.0 && (bytes > (double)SIZE_MAX / 2 || !(*p = malloc((size_t)bytes)))) {
        fprintf(stderr, "moex bench: out of memory for %s (%.1f MiB)\n", what, bytes / 1048576.0);
        return EXIT_RUNTIME;
    }
    return 0;
}

int bench_stdout_failed(void)
{
    return cli_stdout_flush() ? EXIT_RUNTIME : 0;
}
