/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_obs.h: what `kvbm replay` shows while and after it runs, besides
 * its summary: the metrics endpoint (--metrics-port, or Dynamo's
 * DYN_KVBM_METRICS) and the picture (--plot FILE.svg: hit rate and tier
 * occupancy over the replay). W1 (cmd_replay.c) and W2 (replay_w2.c)
 * share it.
 *
 * W1 has no manager: the observer runs its own endpoint and snapshots the
 * pool after every request (the pool has no lock; the replay's thread
 * copies its counters under the observer's mutex). W2 hands the endpoint
 * to the manager (kvbm_manager_config.metrics): the page is the library's
 * own manager collector, plus the replay's counters registered next to it.
 */
#ifndef KVBM_TOOL_REPLAY_OBS_H
#define KVBM_TOOL_REPLAY_OBS_H

#include <stdbool.h>

#include "kvbm/metrics.h"
#include "metrics_cli.h"
#include "workload/w1.h"
#include "workload/w2.h"

typedef struct replay_obs_opts {
  metrics_cli m;                      /* the endpoint (metrics_cli.h) */
  const char *plot;                   /* --plot FILE.svg */
  bool hold;                          /* --hold: keep serving after the summary until
                                         SIGINT or SIGTERM */
  const char *trace;                  /* for the picture's title */
} replay_obs_opts;

/* Defaults, then the environment (DYN_KVBM_METRICS, ...). false after
 * printing what is wrong. */
bool replay_obs_opts_init(replay_obs_opts *o);

/* Takes argv[*i] when it is one of the metrics_cli options, --hold or
 * --plot: 1 taken, 0 not ours, -1 after a message. */
int replay_obs_take(int argc, char **argv, int *i, replay_obs_opts *o);

typedef struct replay_obs replay_obs;

/* The observer of one run; NULL in *out when nothing was asked. W1 starts
 * its endpoint here (errors printed: false). */
bool replay_obs_create(const replay_obs_opts *o, bool w2, replay_obs **out);
void replay_obs_destroy(replay_obs *obs); /* NULL: no-op */

/* W1: installs the per-request hook. */
void replay_obs_w1(replay_obs *obs, kvsim_w1_config *cfg);
/* W1, after the summary: the picture, then --hold. */
void replay_obs_w1_done(replay_obs *obs, const kvsim_w1_result *res);

/* W2: installs the hooks and the manager's endpoint config. `print` writes
 * the summary (called in on_finish, while the manager still serves). */
void replay_obs_w2(replay_obs *obs, kvsim_w2_config *cfg,
                   void (*print)(void *ctx, const kvsim_w2_result *res), void *ctx);

/* false when a hook failed (the message was printed): a port file that
 * could not be written. */
bool replay_obs_ok(const replay_obs *obs);

#endif
