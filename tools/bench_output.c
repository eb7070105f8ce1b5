/*
 * bench_output.c — the CSV and SVG files of `moex bench`. A regular file (or a new one) is
 * written to a temp file beside it, then renamed over it; a device or FIFO is written in place.
 */
#define _XOPEN_SOURCE 700

#include "bench_output.h"
#include "bench_table.h"
#include "svg_plot.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void bench_host_and_date(char *host, size_t host_size, char *date, size_t date_size)
{
    snprintf(date, date_size, "unknown");
    if (gethostname(host, host_size) != 0)
        snprintf(host, host_size, "unknown");
    host[host_size - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(date, date_size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Run writer on f and close f: 0, or the errno of the first failure (EIO if none was set). */
static int write_and_close(FILE *f, bench_file_writer writer, const void *user, int sync)
{
    int e = 0;
    errno = 0;
    if (writer(f, user) != 0 || ferror(f))
        e = errno ? errno : EIO;
    errno = 0;
    if (!e && fflush(f) != 0)
        e = errno ? errno : EIO;
    if (!e && sync && fsync(fileno(f)) != 0)
        e = errno;
    errno = 0;
    if (fclose(f) != 0 && !e)
        e = errno ? errno : EIO;
    return e;
}

int bench_write_file(const out_file *out, bench_file_writer writer, const void *user)
{
    if (out->in_place) {
        FILE *f = fopen(out->target, "w");
        int e = f ? write_and_close(f, writer, user, 0) : errno;
        if (e) {
            fprintf(stderr, "moex bench: %s: cannot write \"%s\": %s\n", out->opt, out->path,
                    strerror(e));
            return EXIT_RUNTIME;
        }
        return 0;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out->target, (long)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "moex bench: %s: the path \"%s\" is too long\n", out->opt, out->path);
        return EXIT_RUNTIME;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "moex bench: %s: cannot create \"%s\": %s\n", out->opt, tmp,
                strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return EXIT_RUNTIME;
    }
    int e = write_and_close(f, writer, user, 1);
    if (!e && rename(tmp, out->target) != 0)
        e = errno;
    if (e) {
        fprintf(stderr, "moex bench: %s: cannot write \"%s\": %s\n", out->opt, out->path,
                strerror(e));
        unlink(tmp);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* A CSV field of ours never needs quoting except the CPU name, which goes in a # line. */
static void csv_number(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, ",%.6g", v);
    else
        fputs(isnan(v) ? ",nan" : v > 0 ? ",inf" : ",-inf", f);
}
static int write_csv(FILE *f, const void *user)
{
    const bench_state *st = user;
    const bench_opts *o = st->o;
    st->runner->csv_comments(f, st);
    if (o->skew > 0.0f)
        fprintf(f, "# routing skew=%g (--skew: each expert's logits + skew x its popularity)\n", (double)o->skew);
    for (const bench_state *s = st->next; s; s = s->next) /* the later passes' own ceilings and load */
        fprintf(f, "# pass dtype=%s ceiling gemm_gflops=%.2f read_gbps=%.2f other_cpu_share=%.3f\n",
                bench_weight_label(s->o), s->gemm_gflops, s->read_gbps, s->other_share);
    fputs("shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,"
          "max_abs_err,gemm_frac,bw_frac,read_floor_ms,floor_frac,first_ms,workspace_mib\n",
          f);
    int nv = bench_nvariants(st);
    for (const bench_state *s = st; s; s = s->next)
    for (int ti = 0; ti < o->ntokens; ti++) {
        for (int v = 0; v < nv; v++) {
            const case_result *r = &s->results[ti * nv + v];
            fprintf(f, "%s,%s,%s,%s,%lld,%d,%lld,%d", o->shape->name,
                    o->backends[bench_var_backend(st, v)], st->cuda ? "cuda" : "cpu",
                    bench_weight_label(s->o), (long long)st->experts, st->cuda ? 0 : st->threads,
                    (long long)o->tokens[ti], bench_var_graph(st, v));
            csv_number(f, r->ms);
            csv_number(f, r->gflops);
            csv_number(f, r->weight_gbps);
            csv_number(f, r->max_abs_err);
            csv_number(f, r->gemm_frac);
            csv_number(f, r->bw_frac);
            csv_number(f, r->read_floor_ms);
            csv_number(f, r->floor_frac);
            csv_number(f, r->first_ms);
            csv_number(f, r->workspace_mib);
            fputc('\n', f);
        }
    }
    for (const bench_state *s = st; st->cuda && s; s = s->next) /* why a row is empty */
        for (int ti = 0; ti < o->ntokens; ti++)
            for (int v = 0; v < nv; v++)
                if (s->results[ti * nv + v].state != CASE_RAN)
                    fprintf(f, "# empty row: %s %s graph=%d tokens=%lld: %s\n", o->backends[bench_var_backend(st, v)],
                            bench_weight_label(s->o), bench_var_graph(st, v), (long long)o->tokens[ti],
                            bench_case_state_text(s->results[ti * nv + v].state));
    return ferror(f) ? -1 : 0;
}

static int write_svg(FILE *f, const void *user)
{
    const bench_state *st = user;
    const bench_opts *o = st->o;
    int nv = bench_nvariants(st), nt = o->ntokens, ns = 0;
    enum { MAX_SERIES = MAX_DTYPES * 2 * MAX_BACKENDS };
    double x[MAX_TOKEN_COUNTS], y[MAX_SERIES][MAX_TOKEN_COUNTS];
    svg_series series[MAX_SERIES];
    char names[MAX_SERIES][2 * NAME_LEN + 16], labels[MAX_DTYPES * (NAME_LEN + 4)] = "";
    for (int ti = 0; ti < nt; ti++)
        x[ti] = (double)o->tokens[ti];
    for (const bench_state *s = st; s; s = s->next) {
        size_t used = strlen(labels);
        snprintf(labels + used, sizeof labels - used, "%s%s", s == st ? "" : " vs ", bench_weight_label(s->o));
        for (int v = 0; v < nv; v++, ns++) {
            for (int ti = 0; ti < nt; ti++) /* rows that did not run are NaN: skipped by the plot */
                y[ns][ti] = st->cuda && s->results[ti * nv + v].state != CASE_RAN ? NAN : s->results[ti * nv + v].ms;
            snprintf(names[ns], sizeof names[ns], "%s%s%s%s", o->backends[bench_var_backend(st, v)], st->next ? " " : "",
                     st->next ? bench_weight_label(s->o) : "", bench_var_graph(st, v) ? " (CUDA graph)" : "");
            series[ns] = (svg_series){names[ns], nt, x, y[ns]};
        }
    }
    char title[256], subtitle[256];
    if (st->cuda)
        snprintf(title, sizeof title, "%s, %s, %s: time of one experts forward", o->shape->name, labels,
                 st->gpu.name);
    else
        snprintf(title, sizeof title, "%s, %s, %d thread%s: time of one experts forward", o->shape->name, labels,
                 st->threads, st->threads == 1 ? "" : "s");
    snprintf(subtitle, sizeof subtitle,
             "H=%lld I=%lld, %lld of %lld experts, top-%lld; median of %d runs, %s; moex %s",
             (long long)st->hidden, (long long)st->intermediate, (long long)st->experts,
             (long long)o->shape->experts, (long long)st->top_k, o->runs,
             o->warm ? "one routing, warm cache" : "fresh routing each, cache flushed", moex_version());
    svg_plot p = {title, subtitle, "tokens (T)", "time (ms)", ns, series};
    return svg_plot_write(f, &p);
}

int bench_write_outputs(const bench_state *st)
{
    const out_file *files[2] = {&st->o->csv, &st->o->plot};
    bench_file_writer writers[2] = {write_csv, write_svg};
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        if (!files[i]->path)
            continue;
        if (bench_write_file(files[i], writers[i], st) == 0)
            fprintf(stderr, "moex bench: wrote %s\n", files[i]->path);
        else
            rc = EXIT_RUNTIME;
    }
    return rc;
}
