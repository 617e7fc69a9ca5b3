/* SPDX-License-Identifier: Apache-2.0 */
/* replay_w2.h: `kvbm replay` with tier flags runs W2 (tools/kvbm/replay_w2.c). */
#ifndef KVBM_TOOL_REPLAY_W2_H
#define KVBM_TOOL_REPLAY_W2_H

#include <stdbool.h>

/* Whether argv asks for W2 (any of the tier flags). */
bool replay_w2_wanted(int argc, char **argv);

/* The whole `kvbm replay` command for W2; exit code as the CLI's. */
int replay_w2_main(int argc, char **argv);

#endif
