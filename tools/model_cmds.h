/* model_cmds.h — the CLI commands that load a checkpoint: generate, info, demo. */
#ifndef MOEX_TOOLS_MODEL_CMDS_H
#define MOEX_TOOLS_MODEL_CMDS_H

/* Each takes argv[0] = the command name and returns the exit code
 * (0 ok, 1 runtime failure, 2 usage error). */
int moex_cli_generate(int argc, char **argv);
int moex_cli_info(int argc, char **argv);
int moex_cli_demo(int argc, char **argv);

#endif
