/* text_cmds.h — the CLI commands on text: tokenize. */
#ifndef MOEX_TOOLS_TEXT_CMDS_H
#define MOEX_TOOLS_TEXT_CMDS_H

/* argv[0] = "tokenize"; returns the exit code (0 ok, 1 runtime failure, 2 usage error). */
int moex_cli_tokenize(int argc, char **argv);

#endif
