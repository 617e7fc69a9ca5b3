/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_cli.h: the metrics endpoint options the long-running kvbm
 * commands share (`kvbm replay`, `kvbm events relay`):
 *   --metrics-port N        serve GET /metrics on port N (0: any free one)
 *   --metrics-host H        the IPv4 address to listen on (0.0.0.0)
 *   --metrics-port-file P   write the bound port there (tests, port 0)
 * and the environment, Dynamo's way (DYN_KVBM_METRICS=true,
 * DYN_KVBM_METRICS_PORT, KVBM_METRICS_HOST), which the options override.
 */
#ifndef KVBM_TOOL_METRICS_CLI_H
#define KVBM_TOOL_METRICS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvbm/metrics.h"

typedef struct metrics_cli {
  kvbm_metrics_server_config cfg; /* cfg.enabled: serve */
  const char *port_file;
} metrics_cli;

/* Defaults and the environment; false after printing what is wrong. */
bool metrics_cli_init(metrics_cli *m, const char *cmd);

/* 1 when argv[*i] was one of the options (taken, *i moved past its
 * value), 0 when it is something else, -1 after a message. */
int metrics_cli_take(const char *cmd, int argc, char **argv, int *i, metrics_cli *m);

/* Says where the endpoint listens (stderr) and writes the port file;
 * false after a message when the file cannot be written. */
bool metrics_cli_announce(const metrics_cli *m, const char *cmd, uint16_t port);

/* The options' usage lines. */
void metrics_cli_usage(FILE *f);

#endif
