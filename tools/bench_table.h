/*
 * bench_table.h — the table `moex bench` prints on stdout as it measures (tools/bench_table.c).
 */
#ifndef MOEX_TOOLS_BENCH_TABLE_H
#define MOEX_TOOLS_BENCH_TABLE_H

#include "bench_run.h"

#include <stdint.h>

/** The column heads (cuda: with graph and floor_frac). */
void bench_print_table_header(const bench_state *st);

/** Variant v's row at T tokens, or why it did not run. */
void bench_print_row(const bench_state *st, int64_t T, int v, const case_result *r);

/** Why a row is empty, in words (r->state != CASE_RAN). */
const char *bench_case_state_text(int state);

#endif /* MOEX_TOOLS_BENCH_TABLE_H */
