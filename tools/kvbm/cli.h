/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli.h: what the kvbm subcommands share.
 *
 * Each subcommand lives in tools/kvbm/cmd_<name>.c and defines
 *   int kvbm_cmd_<name>(int argc, char **argv);   argv[0] is the subcommand
 *   const char kvbm_cmd_<name>_help[];            one line for `kvbm help`
 * CMake finds the files and generates the dispatch table; an underscore in
 * <name> is a dash on the command line (cmd_route_sim.c is `kvbm route-sim`).
 * Exit codes: 0 success, 1 failure at run time, 2 bad usage or bad input.
 */
#ifndef KVBM_CLI_H
#define KVBM_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Parses a whole decimal unsigned integer in [min, max]. On failure prints
 * "kvbm <cmd>: <opt>: ..." to stderr and returns false. */
bool cli_parse_u64(const char *cmd, const char *opt, const char *text,
                   uint64_t min, uint64_t max, uint64_t *out);

/* Parses a finite double in [min, max], same reporting as cli_parse_u64. */
bool cli_parse_double(const char *cmd, const char *opt, const char *text,
                      double min, double max, double *out);

/* For `--opt VALUE` and `--opt=VALUE`: when argv[*i] is `opt`, stores the
 * value, advances *i past it and returns 1; returns 0 when argv[*i] is some
 * other argument, -1 (after a message) when the value is missing. */
int cli_opt_value(const char *cmd, int argc, char **argv, int *i,
                  const char *opt, const char **value);

/* Monotonic clock in seconds. */
double cli_now(void);

#endif
