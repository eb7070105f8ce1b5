/* bench_table.c — the table of `moex bench` on stdout, one row per case as it is measured. */
#include "bench_table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct table_widths {
    int shape, backend;
} table_widths;

static table_widths widths(const bench_opts *o)
{
    table_widths tw = {5, 7};
    int n = (int)strlen(o->shape->name);
    tw.shape = n > tw.shape ? n : tw.shape;
    for (int b = 0; b < o->nbackends; b++) {
        n = (int)strlen(o->backends[b]);
        tw.backend = n > tw.backend ? n : tw.backend;
    }
    return tw;
}

void bench_print_table_header(const bench_state *st)
{
    const bench_opts *o = st->o;
    table_widths tw = widths(o);
    if (st->cuda)
        printf("\n%-*s  %-*s  %5s  %6s  %10s  %9s  %8s  %9s  %9s  %7s  %10s\n", tw.shape, "shape",
               tw.backend, "backend", "graph", "T", "ms", "GFLOP/s", "GB/s", "err", "gemm_frac",
               "bw_frac", "floor_frac");
    else
        printf("\n%-*s  %-*s  %6s  %10s  %9s  %8s  %9s  %9s  %7s\n", tw.shape, "shape", tw.backend,
               "backend", "T", "ms", "GFLOP/s", "GB/s", "err", "gemm_frac", "bw_frac");
    fflush(stdout);
}

/* One column of a row: v in `width` characters, or "-" when not finite. */
static void print_fraction(double v, int width)
{
    if (isfinite(v))
        printf("  %*.3f", width, v);
    else
        printf("  %*s", width, "-");
}

const char *bench_case_state_text(int state)
{
    return state == CASE_OVER_LIMIT     ? "skipped (--backend-max-tokens)"
           : state == CASE_NOT_CAPTURED ? "not captured (see the message above)"
                                        : "failed (see the message above)";
}

void bench_print_row(const bench_state *st, int64_t T, int v, const case_result *r)
{
    const bench_opts *o = st->o;
    table_widths tw = widths(o);
    int b = bench_var_backend(st, v);
    if (st->cuda) {
        printf("%-*s  %-*s  %5d  %6lld", tw.shape, o->shape->name, tw.backend, o->backends[b],
               bench_var_graph(st, v), (long long)T);
        if (r->state != CASE_RAN) {
            printf("  %s\n", bench_case_state_text(r->state));
            fflush(stdout);
            return;
        }
        printf("  %10.3f  %9.2f  %8.2f  %9.2e", r->ms, r->gflops, r->weight_gbps, r->max_abs_err);
    } else {
        printf("%-*s  %-*s  %6lld  %10.3f  %9.2f  %8.2f  %9.2e", tw.shape, o->shape->name,
               tw.backend, o->backends[b], (long long)T, r->ms, r->gflops, r->weight_gbps,
               r->max_abs_err);
    }
    print_fraction(r->gemm_frac, 9);
    print_fraction(r->bw_frac, 7);
    if (st->cuda)
        print_fraction(r->floor_frac, 10);
    printf("\n");
    fflush(stdout);
}

