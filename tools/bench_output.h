/*
 * bench_output.h — the files `moex bench` writes after its passes (tools/bench_output.c):
 * --csv (the runner's comment lines, then a row per case of every pass) and --plot (SVG).
 */
#ifndef MOEX_TOOLS_BENCH_OUTPUT_H
#define MOEX_TOOLS_BENCH_OUTPUT_H

#include "bench_run.h"

#include <stdio.h>

/**
 * The CSV and the plot that the options ask for, of st and the passes after it (st->next),
 * each written (or not) on its own, through a temp file and a rename. Returns 0, or
 * EXIT_RUNTIME if either failed (after naming the file and the error).
 */
int bench_write_outputs(const bench_state *st);

/** Writes one file's contents (user: what it is made from); 0, or nonzero with errno set or ferror. */
typedef int (*bench_file_writer)(FILE *f, const void *user);

/**
 * Write out's file with writer. A regular file (or a new one) goes through a temp file beside it,
 * then a rename: a failure leaves the old file, if any, as it was and no temp file behind. A
 * device or FIFO is written in place. Returns 0, or EXIT_RUNTIME after naming the file and the
 * error.
 */
int bench_write_file(const out_file *out, bench_file_writer writer, const void *user);

/** The time now (UTC, ISO 8601) and this machine's name, as the CSV's comment lines give them. */
void bench_host_and_date(char *host, size_t host_size, char *date, size_t date_size);

#endif /* MOEX_TOOLS_BENCH_OUTPUT_H */
