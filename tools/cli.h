/* cli.h — what the CLI's commands share (tools/moex.c): stdout's write errors. */
#ifndef MOEX_TOOLS_CLI_H
#define MOEX_TOOLS_CLI_H

/*
 * Flush stdout. Returns 0 if it and every write before it succeeded, else the
 * errno of the first failure seen (kept: main reports it once, at exit, as
 * "moex: writing the output: ..." and exits 1). A command that prints as it
 * goes calls this after each piece and stops when it fails.
 */
int cli_stdout_flush(void);

#endif
