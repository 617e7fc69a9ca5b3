/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics/server.h (private): the metrics endpoint as a daemon's whole
 * HTTP side. A daemon with a small GET API of its own (`kvbm advisor`)
 * serves it from the same server as its /metrics, with the same strict
 * parsing and limits (kvbm/metrics.h, "server"), instead of a second
 * server: the routes below answer every path but /metrics.
 */
#ifndef KVBM_METRICS_SERVER_H
#define KVBM_METRICS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/http.h"
#include "kvbm/metrics.h"

/* Writes the answer to `req` (a GET or HEAD the parser accepted, path not
 * /metrics) into the growing buffer *body (*len bytes so far; grow it with
 * realloc, *cap its size; a failed realloc may leave it short) and returns
 * the HTTP status. Runs on the server's thread, one request at a time; `s`
 * is the server answering (for kvbm__metrics_server_stats_get). */
typedef int (*kvbm__metrics_route_fn)(void *user, kvbm_metrics_server *s, const http_req *req,
                                      char **body, size_t *len, size_t *cap);

typedef struct kvbm__metrics_routes {
  kvbm__metrics_route_fn fn; /* every path but /metrics (NULL: 404) */
  void *user;
  const char *content_type;  /* of fn's answers ("application/json") */
  bool json_errors;          /* the server's own error answers (4xx, 5xx)
                                as {"error":"...","status":N} */
} kvbm__metrics_routes;

/* The server's counters, as its collector writes them. */
typedef struct kvbm__metrics_server_stats {
  uint64_t connections;            /* open now */
  uint64_t accepted, refused_busy; /* connections; over max_connections, none
                                      idle (503) */
  uint64_t refused_peer;           /* over max_per_peer, none of its idle (503) */
  uint64_t idle_closed_full;       /* idle connections closed for a newcomer:
                                      the table was full (any address's) */
  uint64_t idle_closed_peer;       /* ... its address was at max_per_peer
                                      (its own) */
  uint64_t accept_pauses;
  uint64_t requests;               /* heads parsed */
  uint64_t answered, bad_requests; /* answers < 400, >= 400 (503s included) */
  uint64_t read_timeouts, write_timeouts;
} kvbm__metrics_server_stats;

/* kvbm_metrics_server_start with routes (NULL: /metrics only). */
int kvbm__metrics_server_start_routes(kvbm_metrics *reg, const kvbm_metrics_server_config *cfg,
                                      const kvbm__metrics_routes *routes,
                                      kvbm_metrics_server **out, kvbm_error *err);

/* Any thread. */
void kvbm__metrics_server_stats_get(const kvbm_metrics_server *s, kvbm__metrics_server_stats *out);

#endif
