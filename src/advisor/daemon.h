/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.h (private): `kvbm advisor`, the storage advisor as a process
 * (docs/areas/advisor.md): storage events and KV events in over ZMQ and
 * NATS, the index and hints of kvbm/advisor.h, hints out on a NATS subject
 * and over HTTP (GET /hints, /volumes, /prefix?hash=N, /health, and its
 * counters in Prometheus' format at /metrics).
 *
 * Three threads: the sources' (each source gives at most a few dozen
 * messages a turn), the HTTP server's (the metrics endpoint's server with
 * the advisor's routes, metrics/server.h), and the caller's, which derives
 * hints every hint_period_ms. Memory is bounded by the advisor's own
 * bounds, each source's byte budget (queue_bytes: its kvbm_subscriber's,
 * over ZMQ or NATS alike) and the HTTP limits.
 */
#ifndef KVBM_ADVISOR_DAEMON_H
#define KVBM_ADVISOR_DAEMON_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/advisor.h"

#define KVBM__ADVISOR_MAX_SOURCES 64

typedef enum kvbm__asrc_kind {
  KVBM__ASRC_STORAGE_ZMQ = 0,
  KVBM__ASRC_STORAGE_NATS,
  KVBM__ASRC_KV_ZMQ,
  KVBM__ASRC_KV_NATS,
} kvbm__asrc_kind;

typedef struct kvbm__asrc_config {
  kvbm__asrc_kind kind;
  const char *name;      /* shown in /health */
  const char *endpoint;  /* ZMQ PUB endpoint, or NATS URL */
  const char *replay;    /* the engine's replay ROUTER, for either transport
                          * (NULL: none; a gap is counted lost) */
  const char *subject;   /* NATS subject (NATS kinds only) */
} kvbm__asrc_config;

typedef struct kvbm__advisor_daemon_config {
  kvbm_advisor_config advisor;
  const char *listen;                /* HOST:PORT */
  const char *port_file;             /* the port, written once listening */
  kvbm__asrc_config sources[KVBM__ADVISOR_MAX_SOURCES];
  size_t nsources;
  const char *volume_names[KVBM_ADVISOR_MAX_VOLUMES];
  kvbm_tier volume_tiers[KVBM_ADVISOR_MAX_VOLUMES];
  size_t nvolumes;
  const char *hints_url, *hints_subject; /* NATS (NULL: not published) */
  uint32_t hint_period_ms;           /* 10000 */
  size_t max_hints;                  /* per derivation (4096) */
  uint32_t max_connections;          /* 64 */
  uint32_t io_timeout_ms;            /* 10000 */
  size_t queue_bytes;                /* per source (16 MiB) */
  size_t max_payload;                /* per message (2 MiB) */
} kvbm__advisor_daemon_config;

kvbm__advisor_daemon_config kvbm__advisor_daemon_config_default(void);

/* Runs until *stop becomes non-zero. KVBM_EINVAL/KVBM_EIO when it cannot
 * start (a source, the listening socket, the port file, the hints
 * connection), with err saying which; KVBM_OK after a stop. */
int kvbm__advisor_daemon_run(const kvbm__advisor_daemon_config *cfg, volatile sig_atomic_t *stop,
                             kvbm_error *err);

#endif
