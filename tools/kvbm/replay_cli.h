/* SPDX-License-Identifier: Apache-2.0 */
/* replay_cli.h: what `kvbm replay` shares between W1 (cmd_replay.c) and W2
 * (replay_w2.c): the trace argument, W1's flags and the progress bar. */
#ifndef KVBM_TOOL_REPLAY_CLI_H
#define KVBM_TOOL_REPLAY_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "workload/w1.h"

typedef struct replay_cli {
  const char *trace; /* NULL until given: the bundled trace */
  bool json;
  bool progress;     /* a progress bar (on by default on a terminal) */
} replay_cli;

void replay_cli_init(replay_cli *c);

/* Takes argv[*i] when it is the trace or one of W1's flags (--block-size,
 * --capacity, --limit, --hash, --json, --no-progress), into `o` and `c`.
 * Returns 1 when taken (*i moved past a value), 0 when argv[*i] is
 * something else, -1 after printing what is wrong. */
int replay_cli_take(int argc, char **argv, int *i, kvsim_w1_config *o, replay_cli *c);

/* The usage of `kvbm replay`, W1's flags and W2's (any tier flag selects
 * W2), with the default trace. */
void replay_cli_usage(FILE *f);

/* A kvsim_w1_config progress callback drawing a bar on stderr. */
void replay_cli_progress(void *user, size_t done, size_t total);

#endif
