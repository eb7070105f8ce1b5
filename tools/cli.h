/* cli.h — what the CLI's commands share (tools/moex.c): stdout's write errors and strict numbers. */
#ifndef MOEX_TOOLS_CLI_H
#define MOEX_TOOLS_CLI_H

#include <stdint.h>

/*
 * Flush stdout. Returns 0 if it and every write before it succeeded, else the
 * errno of the first failure seen (kept: main reports it once, at exit, as
 * "moex: writing the output: ..." and exits 1). A command that prints as it
 * goes calls this after each piece and stops when it fails; a piece longer
 * than stdout's buffer may fail inside a write, so call it right after such a
 * piece, before anything else can set errno.
 */
int cli_stdout_flush(void);

/* What a number parser found. */
typedef enum cli_num {
    CLI_NUM_OK = 0,
    CLI_NUM_INVALID,   /* not a number of the kind asked for */
    CLI_NUM_RANGE,     /* a number, out of range */
    CLI_NUM_NONFINITE, /* nan or inf */
} cli_num;

/* s: one or more decimal digits and nothing else (no sign, space or '+'); its value <= max. */
cli_num cli_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* s: a number as strtof reads it, with nothing before or after it (no space);
 * nan and inf are CLI_NUM_NONFINITE, overflow and underflow CLI_NUM_RANGE. */
cli_num cli_parse_float(const char *s, float *out);

#endif
