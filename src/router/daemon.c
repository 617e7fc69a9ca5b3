/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.c: the router daemon's HTTP side (see kvbm/router.h).
 *
 * One thread (the caller of kvbm_router_daemon_run) serves every
 * connection with poll(): non-blocking sockets, keep-alive and pipelining
 * (requests are answered in order). The head parser (http.c) and the JSON
 * reader (json.c) are pure codecs; this file is the transport and the
 * handlers. Lookups read the index without a lock; writers (the event
 * sources, approximate-mode records, worker drops) take the daemon's
 * writer lock. Load (active blocks and requests per worker) is the
 * routing thread's own state: a /route adds the request to its worker,
 * /done, request_ttl_s or the cap on active requests takes it away.
 *
 * One thread serves everyone, so no client may hold it or its memory.
 * The transport is the library's HTTP service layer (src/service/, whose
 * essay has the rules and why), run on the caller's thread by
 * kvbm_router_daemon_run; the router gives it its four routes and a tick
 * for its housekeeping, and keeps these guarantees through it:
 *  - Turns: per wake-up a connection gets at most 8 requests answered,
 *    none while 64 KiB of its answers wait, and no more request bytes than
 *    its credit (deficit round robin), so a client pipelining megabytes is
 *    served at the others' pace (tests/router/guards_e2e.py).
 *  - Linear input, bounded buffers (input up to the request being
 *    assembled plus 64 KiB, output up to 64 KiB plus one answer; SNDBUF
 *    per socket), deadlines both ways (io_timeout_s), 408 / write
 *    timeouts.
 *  - Admission by the shared rule (common/admit.c): idle connections make
 *    room, max_per_peer per client address, 503 only when none is idle;
 *    at the descriptor limit a spare descriptor answers 503 (max_connections
 *    is checked against RLIMIT_NOFILE at create).
 *  - Active requests are at most max_active_requests; the oldest goes
 *    first when more arrive. The table (reqtab.c) is a ring: a /route
 *    costs the same with the table full as with it empty (before, a full
 *    table moved every record on each /route: issue 24).
 * Everything refused, cut, timed out or evicted is counted in GET /health.
 *
 * GET /metrics serves the same counters and more in Prometheus' text
 * format, from a registry of the daemon's own (the index's collector, the
 * daemon's, the sources'), rendered on this thread like every other
 * answer: the daemon's counters are this thread's own variables, the
 * index's and the sources' are atomics. Dynamo's names where Dynamo has
 * the metric (dynamo_kvindexer_* for the HTTP side, the
 * dynamo_router_overhead_*_ms histograms of the routing phases), kvbm's
 * otherwise; docs/areas/observability.md lists them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/http.h"
#include "common/vec.h"
#include "kvbm/metrics.h"
#include "router/daemon_impl.h"
#include "router/json.h"
#include "router/reqtab.h"
#include "service/service.h"

#define MAX_HEAD (16 * 1024)
#define SNDBUF (64 * 1024)        /* the kernel's send buffer per connection (it doubles it) */
#define POLL_MS 100               /* housekeeping tick */
#define FD_MARGIN 16              /* descriptors for reconnects, replay sockets, ... */

/* Endpoints and methods, as /metrics counts them. */
enum { EP_ROUTE, EP_DONE, EP_HEALTH, EP_METRICS, EP_INDEX, EP_UNKNOWN, EP_COUNT };
static const char *const ep_name[EP_COUNT] = {"/route", "/done", "/health", "/metrics", "/index",
                                              "unknown"};
enum { METHOD_GET, METHOD_POST, METHOD_OTHER, METHOD_COUNT };
static const char *const method_name[METHOD_COUNT] = {"GET", "POST", "other"};

typedef struct http_state {
  int64_t now;         /* the tick's time (kvbm__rd_now_ns) */
  /* load per slot, valid while owner[slot] is the slot's worker */
  double load_blocks[KVBM_ROUTER_MAX_WORKERS], load_reqs[KVBM_ROUTER_MAX_WORKERS];
  kvbm_worker_key owner[KVBM_ROUTER_MAX_WORKERS];
  bool owned[KVBM_ROUTER_MAX_WORKERS];
  kvbm__reqtab rt; /* active requests (reqtab.c) */
  uint64_t next_id;
  uint64_t rng;
  uint64_t routes, degraded_routes;
  uint64_t errors[2]; /* the handlers' error answers: 4xx, 5xx */
  int64_t t0;
  /* /metrics: answers by endpoint, handler time, the phases of /route */
  int ep;                                   /* the endpoint being answered */
  uint64_t ep_requests[EP_COUNT][METHOD_COUNT];
  uint64_t ep_errors[EP_COUNT][2];          /* 4xx, 5xx: the handlers' own; the
                                               service's (refused before a route)
                                               are in its counters */
  kvbm_histogram ep_seconds[EP_COUNT];
  kvbm_histogram ov_hash_ms, ov_find_ms, ov_sched_ms, ov_total_ms, hit_rate;
} http_state;

void kvbm__rd_log(kvbm_router_daemon *d, const char *fmt, ...) {
  if (!d->cfg.log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  d->cfg.log(d->cfg.log_user, line);
}

kvbm_router_daemon_config kvbm_router_daemon_config_default(void) {
  kvbm_router_daemon_config c = {0};
  c.host = "127.0.0.1";
  c.index = kvbm_index_config_default();
  c.choice = kvbm_choice_config_default();
  c.request_ttl_s = 600;
  c.max_active_requests = (size_t)1 << 18;
  c.approx_max_blocks = kvbm_approx_config_default().max_blocks_per_worker;
  c.max_body = (size_t)8 << 20;
  c.max_tokens = (size_t)1 << 20;
  c.max_connections = 256;
  c.max_per_peer = 256; /* = max_connections: off unless lowered (router.h) */
  c.io_timeout_s = 10;
  c.seed = 1;
  kvbm_subscriber_config so = kvbm_subscriber_config_default(NULL);
  c.queue_bytes = so.max_queue_bytes;
  c.max_payload = so.max_payload;
  c.replay_timeout_ms = so.replay_timeout_ms;
  c.max_ranks = 8;
  c.durable = "kvbm-router";
  c.snapshot_every_s = 30;
  return c;
}

/* ------------------------------------------------------------- load */

static void load_sync(http_state *h, uint32_t slot, const kvbm_worker_key *k) {
  if (!h->owned[slot] || h->owner[slot].worker_id != k->worker_id ||
      h->owner[slot].dp_rank != k->dp_rank) {
    h->owned[slot] = true;
    h->owner[slot] = *k;
    h->load_blocks[slot] = h->load_reqs[slot] = 0;
  }
}

/* The request table lets a live request go (/done, ttl or the cap): its
 * load goes with it while its slot still holds its worker. */
static void load_drop(void *user, const kvbm__req_rec *r) {
  http_state *h = user;
  uint32_t s = r->slot;
  if (h->owned[s] && h->owner[s].worker_id == r->key.worker_id &&
      h->owner[s].dp_rank == r->key.dp_rank) {
    h->load_blocks[s] -= r->blocks;
    h->load_reqs[s] -= 1;
    if (h->load_blocks[s] < 0) h->load_blocks[s] = 0;
    if (h->load_reqs[s] < 0) h->load_reqs[s] = 0;
  }
}

/* ------------------------------------------------------------- replies */

/* An answer of a handler's: the service copies it out when the handler
 * returns (a->scratch holds the bytes). */
static void reply_ct(kvbm__service_answer *a, int status, const char *ctype, const char *body,
                     size_t len, bool close, const char *extra) {
  a->status = status;
  a->content_type = ctype;
  a->headers = extra;
  a->close = close;
  a->scratch->len = 0;
  kvbm__service_buf_append(a->scratch, body, len); /* oom: the service answers 500 */
}

static void reply(kvbm__service_answer *a, int status, const char *body, size_t len, bool close,
                  const char *extra) {
  reply_ct(a, status, "application/json", body, len, close, extra);
}

static void reply_error(http_state *h, kvbm__service_answer *a, int status, const char *msg,
                        bool close, const char *extra) {
  rj_buf b = {0};
  kvbm__rj_printf(&b, "{\"error\":");
  kvbm__rj_string(&b, msg);
  kvbm__rj_printf(&b, ",\"status\":%d}\n", status);
  if (status >= 400) {
    h->ep_errors[h->ep][status >= 500]++;
    h->errors[status >= 500]++;
  }
  if (b.oom) reply(a, 500, "{}\n", 3, true, NULL);
  else reply(a, status, b.p, b.len, close, extra);
  kvbm__rj_buf_free(&b);
}

/* Error answers in all: the handlers' and the service's own (a head
 * refused, 408, ...: those are counted as endpoint "unknown"). */
static uint64_t bad_requests(const kvbm_router_daemon *d) {
  kvbm__service_stats st;
  kvbm__service_stats_get(d->svc, &st);
  return st.errors_4xx + st.errors_5xx;
}

/* ------------------------------------------------------------- handlers */

/* The limits, and what they refused, cut, timed out or evicted: the
 * "http", "requests" and (approximate mode) "approx" members of /health.
 * Many counters on every /health: appended without a format string. */
typedef struct counter {
  const char *key; /* ,"name": */
  uint64_t v;
} counter;

static void health_object(rj_buf *b, const char *name, const counter *f, size_t n) {
  for (size_t i = 0; i < n; i++) kvbm__rj_u64(b, i ? f[i].key : name, f[i].v);
  kvbm__rj_printf(b, "}");
}

static void health_guards(kvbm_router_daemon *d, rj_buf *b) {
  http_state *h = d->http;
  kvbm__service_stats st;
  kvbm__service_stats_get(d->svc, &st);
  uint64_t in = 0, out = 0;
  kvbm__service_buffered(d->svc, &in, &out);
  const counter http[] = {
      {NULL, st.connections},
      {",\"max_connections\":", d->cfg.max_connections},
      {",\"accepted\":", st.accepted},
      {",\"max_per_peer\":", d->cfg.max_per_peer},
      {",\"refused_busy\":", st.refused_busy},
      {",\"refused_peer\":", st.refused_peer},
      {",\"idle_closed_full\":", st.idle_closed_full},
      {",\"idle_closed_peer\":", st.idle_closed_peer},
      {",\"refused_no_fd\":", st.refused_no_fd},
      {",\"accept_pauses\":", st.accept_pauses},
      {",\"read_timeouts\":", st.read_timeouts},
      {",\"write_timeouts\":", st.write_timeouts},
      {",\"turns_cut\":", st.turns_cut},
      {",\"buffered_in\":", in},
      {",\"buffered_out\":", out},
      {",\"out_peak\":", st.out_peak},
      {",\"out_limit\":", KVBM__SERVICE_OUT_SOFT},
  };
  health_object(b, ",\"http\":{\"connections\":", http, sizeof http / sizeof http[0]);
  const counter req[] = {
      {NULL, h->rt.live},
      {",\"max\":", d->cfg.max_active_requests},
      {",\"expired\":", h->rt.expired},
      {",\"evicted\":", h->rt.evicted},
  };
  health_object(b, ",\"requests\":{\"active\":", req, sizeof req / sizeof req[0]);
  if (!d->approx) return;
  kvbm_approx_stats a;
  pthread_mutex_lock(&d->wlock); /* the sources' threads drop records */
  kvbm_approx_stats_get(d->approx, &a);
  pthread_mutex_unlock(&d->wlock);
  const counter ap[] = {
      {NULL, a.records},
      {",\"blocks\":", a.blocks},
      {",\"max_blocks_per_worker\":", d->cfg.approx_max_blocks},
      {",\"max_worker_blocks\":", a.max_worker_blocks},
      {",\"recorded\":", a.recorded},
      {",\"expired\":", a.expired},
      {",\"evicted_records\":", a.evicted_records},
      {",\"evicted_blocks\":", a.evicted_blocks},
      {",\"truncated_blocks\":", a.truncated_blocks},
  };
  health_object(b, ",\"approx\":{\"records\":", ap, sizeof ap / sizeof ap[0]);
}

/* ------------------------------------------------------------- metrics */

/* The daemon's own metrics (the index's and the sources' are collectors
 * of their own in the same registry). Called on the HTTP thread, by
 * handle_metrics: the http_state fields are this thread's. */
static void collect_daemon(void *user, kvbm_metrics_writer *w) {
  kvbm_router_daemon *d = user;
  http_state *h = d->http;
  kvbm__service_stats st;
  kvbm__service_stats_get(d->svc, &st);
  /* the service's own error answers (a head refused, 408, ...) */
  uint64_t svc_err[2] = {st.errors_4xx - h->errors[0], st.errors_5xx - h->errors[1]};
  kvbm_metrics_gauge(w, "dynamo_kvindexer_models", "Indexes the router serves (one)", NULL, 0, 1);
  kvbm_metrics_family(w, "dynamo_kvindexer_requests_total", KVBM_METRIC_COUNTER,
                      "HTTP requests answered, by endpoint and method");
  for (int e = 0; e < EP_COUNT; e++)
    for (int m = 0; m < METHOD_COUNT; m++) {
      if (!h->ep_requests[e][m] && (e == EP_UNKNOWN || m == METHOD_OTHER)) continue;
      kvbm_metric_label l[2] = {{"endpoint", ep_name[e]}, {"method", method_name[m]}};
      kvbm_metrics_value_u64(w, l, 2, h->ep_requests[e][m]);
    }
  kvbm_metrics_family(w, "dynamo_kvindexer_errors_total", KVBM_METRIC_COUNTER,
                      "HTTP error answers (4xx/5xx), by endpoint (unknown: refused before a "
                      "path was read)");
  for (int e = 0; e < EP_COUNT; e++)
    for (int k = 0; k < 2; k++) {
      kvbm_metric_label l[2] = {{"endpoint", ep_name[e]}, {"status_class", k ? "5xx" : "4xx"}};
      kvbm_metrics_value_u64(w, l, 2, h->ep_errors[e][k] + (e == EP_UNKNOWN ? svc_err[k] : 0));
    }
  kvbm_metrics_family(w, "dynamo_kvindexer_request_duration_seconds", KVBM_METRIC_HISTOGRAM,
                      "HTTP request latency: from a complete request to its answer queued");
  for (int e = 0; e < EP_COUNT; e++) {
    if (e == EP_UNKNOWN && !h->ep_seconds[e].count) continue;
    kvbm_metrics_histogram_value(w, &(kvbm_metric_label){"endpoint", ep_name[e]}, 1,
                                 &h->ep_seconds[e]);
  }
  uint64_t silent = 0;
  for (size_t i = 0; i < d->nsrc; i++) silent += atomic_load(&d->src[i].dropped) != 0;
  kvbm_metrics_family(w, "dynamo_kvindexer_listeners", KVBM_METRIC_GAUGE,
                      "Event sources by status: active, or silent (past worker_timeout_s, "
                      "its workers out of the index)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"status", "active"}, 1, d->nsrc - silent);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"status", "silent"}, 1, silent);
  const struct {
    const char *name, *help;
    const kvbm_histogram *hist;
  } ov[] = {
      {"dynamo_router_overhead_block_hashing_ms", "Time spent computing block hashes in "
       "milliseconds (0 for a query by hashes)", &h->ov_hash_ms},
      {"dynamo_router_overhead_indexer_find_matches_ms", "Time spent in the index lookup in "
       "milliseconds", &h->ov_find_ms},
      {"dynamo_router_overhead_scheduling_ms", "Time spent in worker selection (load, cost) in "
       "milliseconds", &h->ov_sched_ms},
      {"dynamo_router_overhead_total_ms", "Total routing overhead per request in milliseconds "
       "(parse to answer queued)", &h->ov_total_ms},
      {"dynamo_component_router_kv_hit_rate", "Per routed request: the chosen worker's weighted "
       "overlap over the request's blocks", &h->hit_rate},
  };
  for (size_t i = 0; i < sizeof ov / sizeof *ov; i++) {
    kvbm_metrics_family(w, ov[i].name, KVBM_METRIC_HISTOGRAM, ov[i].help);
    kvbm_metrics_histogram_value(w, NULL, 0, ov[i].hist);
  }
  uint64_t in = 0, out = 0;
  kvbm__service_buffered(d->svc, &in, &out);
  const struct {
    const char *name, *help;
    uint64_t v;
  } c[] = {
      {"kvbm_router_routes_total", "Requests routed (POST /route answered 200)", h->routes},
      {"kvbm_router_bad_requests_total", "Requests answered with an error", st.errors_4xx + st.errors_5xx},
      {"kvbm_router_requests_expired_total", "Active requests whose load went after request_ttl_s",
       h->rt.expired},
      {"kvbm_router_requests_evicted_total", "Active requests dropped for max_active_requests",
       h->rt.evicted},
      {"kvbm_router_http_accepted_total", "Connections accepted", st.accepted},
      {"kvbm_router_http_accept_pauses_total", "Times accepting rested (no descriptors)",
       st.accept_pauses},
      {"kvbm_router_http_turns_cut_total", "Connection turns cut short for fairness", st.turns_cut},
      {"kvbm_router_gaps_total", "Jumps in workers' event ids seen by the index", atomic_load(&d->gaps)},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    kvbm_metrics_counter(w, c[i].name, c[i].help, NULL, 0, c[i].v);
  kvbm_metrics_family(w, "kvbm_router_http_refused_total", KVBM_METRIC_COUNTER,
                      "Connections answered 503 and closed, by reason (busy: over "
                      "max_connections with none idle; peer: over max_per_peer from their "
                      "address with none of its own idle; no_fd: out of descriptors)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "busy"}, 1, st.refused_busy);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "peer"}, 1, st.refused_peer);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "no_fd"}, 1, st.refused_no_fd);
  kvbm_metrics_family(w, "kvbm_router_http_idle_closed_total", KVBM_METRIC_COUNTER,
                      "Idle connections closed to admit a new one (full: the table was full; "
                      "peer: the newcomer's address was at max_per_peer, one of its own)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "full"}, 1, st.idle_closed_full);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "peer"}, 1, st.idle_closed_peer);
  kvbm_metrics_family(w, "kvbm_router_http_timeouts_total", KVBM_METRIC_COUNTER,
                      "Connections closed for a deadline: a request not complete in time "
                      "(read) or answers not taken in time (write)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"direction", "read"}, 1, st.read_timeouts);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"direction", "write"}, 1, st.write_timeouts);
  kvbm_metrics_gauge(w, "kvbm_router_active_requests", "Routed requests not reported done yet",
                     NULL, 0, (double)h->rt.live);
  kvbm_metrics_gauge(w, "kvbm_router_http_connections", "Open HTTP connections", NULL, 0,
                     (double)st.connections);
  kvbm_metrics_gauge(w, "kvbm_router_http_buffered_bytes", "Bytes buffered by connections",
                     &(kvbm_metric_label){"direction", "in"}, 1, (double)in);
  kvbm_metrics_gauge(w, "kvbm_router_http_buffered_bytes", NULL,
                     &(kvbm_metric_label){"direction", "out"}, 1, (double)out);
  kvbm_metrics_gauge(w, "kvbm_router_uptime_seconds", "Seconds since the router started", NULL, 0,
                     (double)(kvbm__rd_now_ns() - h->t0) * 1e-9);
  kvbm_metrics_gauge(w, "kvbm_router_approximate", "1 in approximate mode (no events)", NULL, 0,
                     d->approx ? 1 : 0);
  /* the decisions recorded: every route in approximate mode, else the
   * routes to DEGRADED workers (kvbm_router_degraded_routes_total) */
  kvbm_approx *ap = d->approx ? d->approx : d->degraded_ap;
  if (ap) {
    kvbm_approx_stats a;
    pthread_mutex_lock(&d->wlock); /* the sources' threads drop records */
    kvbm_approx_stats_get(ap, &a);
    pthread_mutex_unlock(&d->wlock);
    kvbm_metrics_gauge(w, "kvbm_router_approx_records", "Routing decisions held (approximate "
                       "mode, or routes to DEGRADED workers)", NULL, 0, (double)a.records);
    kvbm_metrics_gauge(w, "kvbm_router_approx_blocks", "Blocks the decisions hold", NULL, 0,
                       (double)a.blocks);
    kvbm_metrics_gauge(w, "kvbm_router_approx_max_worker_blocks", "The most blocks one worker's "
                       "decisions hold (at most the budget)", NULL, 0, (double)a.max_worker_blocks);
    const struct {
      const char *name, *help;
      uint64_t v;
    } ac[] = {
        {"kvbm_router_approx_recorded_total", "Decisions recorded", a.recorded},
        {"kvbm_router_approx_expired_total", "Decisions that reached their ttl", a.expired},
        {"kvbm_router_approx_evicted_total", "Decisions evicted for the budget", a.evicted_records},
        {"kvbm_router_approx_evicted_blocks_total", "Blocks of the decisions evicted",
         a.evicted_blocks},
        {"kvbm_router_approx_truncated_blocks_total", "Blocks past the budget in one decision, "
         "not kept", a.truncated_blocks},
    };
    for (size_t i = 0; i < sizeof ac / sizeof *ac; i++)
      kvbm_metrics_counter(w, ac[i].name, ac[i].help, NULL, 0, ac[i].v);
  }
  kvbm_metrics_counter(w, "kvbm_router_degraded_routes_total", "Requests routed to a DEGRADED "
                       "worker (recorded as approximate mode records them)", NULL, 0,
                       h->degraded_routes);
  /* warm restart: snapshots written (--snapshot), by result */
  kvbm_metrics_family(w, "kvbm_router_snapshots_total", KVBM_METRIC_COUNTER,
                      "Snapshots of the index written (--snapshot), by result: ok, failed");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "ok"}, 1, atomic_load(&d->snapshots));
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "failed"}, 1,
                         atomic_load(&d->snapshot_failures));
  kvbm__rd_sources_metrics(d, w);
}

static void handle_health(kvbm_router_daemon *d, kvbm__service_answer *a, bool close) {
  http_state *h = d->http;
  kvbm_index_stats st;
  kvbm_index_stats_get(d->idx, &st);
  bool degraded = false;
  for (size_t i = 0; i < d->nsrc; i++) degraded |= atomic_load(&d->src[i].degraded);
  rj_buf b = {0};
  kvbm__rj_printf(&b,
            "{\"status\":\"%s\",\"workers\":%u,\"entries\":%" PRIu64 ",\"events\":%" PRIu64
            ",\"gaps\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"unknown_removed\":%" PRIu64
            ",\"orphans\":%" PRIu64 ",\"routes\":%" PRIu64 ",\"active_requests\":%zu"
            ",\"bad_requests\":%" PRIu64 ",\"mode\":\"%s\",\"uptime_s\":%.3f"
            ",\"snapshots\":%" PRIu64 ",\"snapshot_failures\":%" PRIu64
            ",\"degraded_routes\":%" PRIu64 ",\"degraded_workers\":[",
            degraded ? "degraded" : "ok", st.workers, st.entries, st.events, st.gaps,
            st.duplicates, st.unknown_removed, st.orphans, h->routes, h->rt.live, bad_requests(d),
            d->approx ? "approximate" : "events", (double)(kvbm__rd_now_ns() - h->t0) * 1e-9,
            atomic_load(&d->snapshots), atomic_load(&d->snapshot_failures), h->degraded_routes);
  bool first = true;
  for (size_t i = 0; i < d->nsrc; i++)
    if (atomic_load(&d->src[i].degraded)) {
      kvbm__rj_u64(&b, first ? "" : ",", d->src[i].cfg.worker_id);
      first = false;
    }
  kvbm__rj_printf(&b, "],\"sources\":[");
  for (size_t i = 0; i < d->nsrc; i++) kvbm__rd_source_health(d, i, &b);
  kvbm__rj_printf(&b, "]");
  health_guards(d, &b);
  kvbm__rj_printf(&b, "}\n");
  if (b.oom) reply_error(h, a, 500, "out of memory", true, NULL);
  else reply(a, 200, b.p, b.len, close, NULL);
  kvbm__rj_buf_free(&b);
}

/* GET /index?worker=ID[&rank=R]: what the index holds for one worker, in
 * the shape of `kvbm worker`'s GET /blocks ({"worker", "dp_rank",
 * "block_size", "g1".."g4": sorted decimal u64 block hashes}), so that the
 * cluster run can check that the index converged to what each worker holds
 * (docs/areas/cluster.md). Engines' blocks only: approximate-mode and
 * DEGRADED records are withdrawn while it is listed, as for a snapshot. The
 * listing is taken under the writer lock (O(the worker's table), the
 * sources wait that long); the answer is one buffer the service sends
 * whole. 400 for a query that is not exactly worker=U64[&rank=U32], 404
 * for a worker the index does not know. */
typedef struct index_list {
  uint64_t *h[KVBM_TIER_COUNT];
  size_t n[KVBM_TIER_COUNT], cap[KVBM_TIER_COUNT];
} index_list;

static int index_list_add(void *user, uint64_t hash, unsigned tiers, uint32_t group) {
  (void)group;
  index_list *l = user;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    if (!(tiers >> t & 1)) continue;
    if (kvbm__vec_reserve_of(&l->h[t], &l->cap[t], l->n[t] + 1, 256, KVBM__VEC_NO_LIMIT))
      return KVBM_ENOMEM;
    l->h[t][l->n[t]++] = hash;
  }
  return KVBM_OK;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* "worker=U64[&rank=U32]" (either order), nothing else: true when read. */
static bool index_query(const char *q, kvbm_worker_key *k) {
  bool have_w = false, have_r = false;
  k->dp_rank = 0;
  while (*q) {
    const char *eq = strchr(q, '='), *amp = strchr(q, '&');
    if (!amp) amp = q + strlen(q);
    if (!eq || eq > amp || eq + 1 == amp || amp - eq > 21) return false;
    uint64_t v = 0;
    for (const char *c = eq + 1; c < amp; c++) {
      if (*c < '0' || *c > '9' || v > (UINT64_MAX - (uint64_t)(*c - '0')) / 10) return false;
      v = v * 10 + (uint64_t)(*c - '0');
    }
    size_t kl = (size_t)(eq - q);
    if (kl == 6 && !memcmp(q, "worker", 6) && !have_w) {
      k->worker_id = v;
      have_w = true;
    } else if (kl == 4 && !memcmp(q, "rank", 4) && !have_r && v <= UINT32_MAX) {
      k->dp_rank = (uint32_t)v;
      have_r = true;
    } else {
      return false;
    }
    q = *amp ? amp + 1 : amp;
    if (*amp && !*q) return false; /* a trailing '&' */
  }
  return have_w;
}

static void handle_index(kvbm_router_daemon *d, kvbm__service_answer *a, const char *query,
                         bool close) {
  http_state *h = d->http;
  kvbm_worker_key k;
  if (!index_query(query, &k)) {
    reply_error(h, a, 400, "give worker=ID (a decimal u64) and optionally rank=R, nothing else",
                close, NULL);
    return;
  }
  index_list l = {0};
  uint32_t slot = 0;
  pthread_mutex_lock(&d->wlock);
  kvbm__approx_withdraw(d->approx);
  kvbm__approx_withdraw(d->degraded_ap);
  int rc = kvbm_index_worker_slot(d->idx, k, &slot);
  if (!rc) rc = kvbm_index_worker_each(d->idx, slot, index_list_add, &l);
  kvbm__approx_return(d->approx);
  kvbm__approx_return(d->degraded_ap);
  pthread_mutex_unlock(&d->wlock);
  rj_buf b = {0};
  if (rc == KVBM_ENOTFOUND) {
    char msg[96];
    snprintf(msg, sizeof msg, "worker %" PRIu64 " rank %" PRIu32 " is not in the index",
             k.worker_id, k.dp_rank);
    reply_error(h, a, 404, msg, close, NULL);
  } else if (rc) {
    reply_error(h, a, 500, "out of memory", true, NULL);
  } else {
    kvbm__rj_u64(&b, "{\"worker\":", k.worker_id);
    kvbm__rj_u64(&b, ",\"dp_rank\":", k.dp_rank);
    kvbm__rj_u64(&b, ",\"block_size\":", d->cfg.index.block_size);
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      if (l.n[t] > 1) qsort(l.h[t], l.n[t], sizeof *l.h[t], cmp_u64); /* qsort(NULL, 0): UB */
      kvbm__rj_printf(&b, ",\"g%d\":[", t + 1);
      for (size_t i = 0; i < l.n[t]; i++) kvbm__rj_u64(&b, i ? "," : "", l.h[t][i]);
      kvbm__rj_printf(&b, "]");
    }
    kvbm__rj_printf(&b, "}\n");
    if (b.oom) reply_error(h, a, 500, "out of memory", true, NULL);
    else reply(a, 200, b.p, b.len, close, NULL);
  }
  kvbm__rj_buf_free(&b);
  for (int t = 0; t < KVBM_TIER_COUNT; t++) free(l.h[t]);
}

static void handle_route(kvbm_router_daemon *d, kvbm__service_answer *a, const char *body, size_t len,
                         bool close) {
  http_state *h = d->http;
  uint64_t t0 = kvbm_clock_ns();
  rj_request q;
  kvbm_error err = {0};
  int rc = kvbm__rj_parse_request(body, len, d->cfg.max_tokens, &q, &err);
  if (rc) {
    reply_error(h, a, rc == KVBM_ENOMEM ? 500 : rc == KVBM_ETOOLONG && strstr(err.msg, "array")
                                                     ? 413 : 400,
                err.msg, close, NULL);
    return;
  }
  if (q.has_tokens == q.has_hashes) {
    reply_error(h, a, 400, "give exactly one of token_ids and block_hashes", close, NULL);
    kvbm__rj_request_free(&q);
    return;
  }
  /* the tenant's namespace: its keys (hashes given are mixed in place) */
  uint64_t ns = kvbm_index_namespace(q.cache_salt, q.lora_name);
  const uint64_t *keys = q.hashes;
  size_t n = q.num_hashes;
  uint64_t *owned = NULL;
  if (q.has_tokens) {
    size_t cap = q.num_tokens / d->cfg.index.block_size + 1;
    owned = malloc(cap * sizeof *owned);
    if (!owned) {
      reply_error(h, a, 500, "out of memory", true, NULL);
      kvbm__rj_request_free(&q);
      return;
    }
    n = kvbm_index_hash_tokens_ns(d->idx, ns, q.tokens, q.num_tokens, owned, cap);
    keys = owned;
  } else if (ns) {
    kvbm_index_keys(d->idx, ns, q.hashes, n, q.hashes);
  }
  uint64_t t1 = kvbm_clock_ns();
  int64_t now = kvbm__rd_now_ns();
  kvbm__reqtab_expire(&h->rt, now);
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  uint64_t live;
  kvbm_index_lookup(d->idx, keys, n, ov, &live);
  uint64_t t2 = kvbm_clock_ns();
  kvbm_worker_key key[KVBM_ROUTER_MAX_WORKERS];
  double load[KVBM_ROUTER_MAX_WORKERS] = {0};
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    if (!(live >> s & 1)) continue;
    if (!kvbm_index_slot_worker(d->idx, s, &key[s])) { /* dropped meanwhile */
      live &= ~(1ull << s);
      continue;
    }
    load_sync(h, s, &key[s]);
    load[s] = d->cfg.choice.load_kind == KVBM_LOAD_REQUESTS ? h->load_reqs[s] : h->load_blocks[s];
  }
  kvbm_choice ch;
  rc = kvbm_choose(&d->cfg.choice, n, ov, load, live, &h->rng, &ch);
  uint64_t t3 = kvbm_clock_ns();
  if (rc) {
    reply_error(h, a, 503, "no workers known yet (no events received)", close, NULL);
    free(owned);
    kvbm__rj_request_free(&q);
    return;
  }
  /* a degraded worker's index is incomplete: the decision is recorded as
   * approximate mode records every one */
  bool chosen_degraded = kvbm__rd_worker_degraded(d, key[ch.slot].worker_id);
  kvbm_approx *ap = d->approx ? d->approx : chosen_degraded ? d->degraded_ap : NULL;
  if (chosen_degraded) h->degraded_routes++;
  if (ap) {
    pthread_mutex_lock(&d->wlock);
    rc = kvbm_approx_record(ap, ch.slot, keys, n, (double)now * 1e-9, &err);
    pthread_mutex_unlock(&d->wlock);
    if (rc) kvbm__rd_log(d, "approximate record: %s", err.msg);
  }
  /* the request's load: its blocks (the prefill it causes and its KV) */
  uint64_t id = ++h->next_id;
  kvbm__req_rec rec = {.id = id, .slot = ch.slot, .key = key[ch.slot], .blocks = (double)n,
                       .expires_ns = now + (int64_t)(d->cfg.request_ttl_s * 1e9)};
  if (!kvbm__reqtab_add(&h->rt, &rec)) { /* out of memory: routed, but no load kept */
    h->load_blocks[ch.slot] += (double)n;
    h->load_reqs[ch.slot] += 1;
  }
  h->routes++;
  rj_buf b = {0};
  kvbm__rj_printf(&b,
            "{\"worker_id\":%" PRIu64 ",\"dp_rank\":%u,\"request_id\":%" PRIu64
            ",\"blocks\":%zu,\"cost\":%.6g,\"ties\":%u,\"approximate\":%s,\"workers\":[",
            key[ch.slot].worker_id, key[ch.slot].dp_rank, id, n, ch.cost, ch.ties,
            d->approx || chosen_degraded ? "true" : "false");
  bool first = true;
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    if (!(live >> s & 1)) continue;
    double score = kvbm_overlap_score(&d->cfg.choice, &ov[s]);
    double cost = d->cfg.choice.prefill_weight * ((double)n - score) +
                  d->cfg.choice.load_weight * load[s];
    kvbm__rj_printf(&b,
              "%s{\"worker_id\":%" PRIu64 ",\"dp_rank\":%u,\"device\":%u,\"host\":%u,"
              "\"disk\":%u,\"remote\":%u,\"score\":%.6g,\"load\":%.6g,\"cost\":%.6g%s}",
              first ? "" : ",", key[s].worker_id, key[s].dp_rank, ov[s].prefix[0],
              ov[s].prefix[1], ov[s].prefix[2], ov[s].prefix[3], score, load[s], cost,
              kvbm__rd_worker_degraded(d, key[s].worker_id) ? ",\"degraded\":true" : "");
    first = false;
  }
  kvbm__rj_printf(&b, "]}\n");
  if (b.oom) reply_error(h, a, 500, "out of memory", true, NULL);
  else reply(a, 200, b.p, b.len, close, NULL);
  kvbm__rj_buf_free(&b);
  free(owned);
  kvbm__rj_request_free(&q);
  /* the phases, as Dynamo's router times them: hashing the tokens (0 for
   * a query by hashes), the index lookup, the choice (load and cost), and
   * the whole handler (parse to answer queued) */
  uint64_t t4 = kvbm_clock_ns();
  kvbm_histogram_observe(&h->ov_hash_ms, (double)(t1 - t0) * 1e-6);
  kvbm_histogram_observe(&h->ov_find_ms, (double)(t2 - t1) * 1e-6);
  kvbm_histogram_observe(&h->ov_sched_ms, (double)(t3 - t2) * 1e-6);
  kvbm_histogram_observe(&h->ov_total_ms, (double)(t4 - t0) * 1e-6);
  if (n) kvbm_histogram_observe(&h->hit_rate, kvbm_overlap_score(&d->cfg.choice, &ov[ch.slot]) / (double)n);
}

static void handle_done(kvbm_router_daemon *d, kvbm__service_answer *a, const char *body, size_t len,
                        bool close) {
  http_state *h = d->http;
  rj_request q;
  kvbm_error err = {0};
  int rc = kvbm__rj_parse_request(body, len, 0, &q, &err);
  if (rc) {
    reply_error(h, a, 400, err.msg, close, NULL);
    return;
  }
  bool bad = !q.has_request_id || q.has_tokens || q.has_hashes;
  uint64_t id = q.request_id;
  kvbm__rj_request_free(&q);
  if (bad) {
    reply_error(h, a, 400, "give request_id (only)", close, NULL);
    return;
  }
  if (!kvbm__reqtab_done(&h->rt, id)) {
    reply_error(h, a, 404, "no such active request_id", close, NULL);
    return;
  }
  static const char ok[] = "{\"ok\":true}\n";
  reply(a, 200, ok, sizeof ok - 1, close, NULL);
}

static void handle_metrics(kvbm_router_daemon *d, kvbm__service_answer *a, bool close) {
  char *text = NULL;
  size_t len = 0;
  if (kvbm_metrics_render(d->metrics, &text, &len, NULL)) {
    reply_error(d->http, a, 500, "out of memory", true, NULL);
    return;
  }
  reply_ct(a, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, close, NULL);
  kvbm_metrics_text_free(text);
}

/* Every request the service has read whole (head, and a body within
 * max_body): the router's routes take every method and answer 405 and
 * 404 themselves, so that /metrics counts each endpoint's requests and
 * errors as before. Runs on the service's thread (the caller of run). */
static void dispatch(void *user, kvbm__service *svc, const kvbm__service_req *q,
                     kvbm__service_answer *a) {
  (void)svc;
  kvbm_router_daemon *d = user;
  http_state *h = d->http;
  const http_req *rq = q->head;
  const char *body = q->body;
  bool close = !rq->keep_alive;
  bool post = !strcmp(rq->method, "POST"), get = !strcmp(rq->method, "GET");
  h->ep = !strcmp(rq->path, "/route")     ? EP_ROUTE
          : !strcmp(rq->path, "/done")    ? EP_DONE
          : !strcmp(rq->path, "/health")  ? EP_HEALTH
          : !strcmp(rq->path, "/metrics") ? EP_METRICS
          : !strcmp(rq->path, "/index")   ? EP_INDEX
                                          : EP_UNKNOWN;
  h->ep_requests[h->ep][get ? METHOD_GET : post ? METHOD_POST : METHOD_OTHER]++;
  uint64_t t0 = kvbm_clock_ns();
  if (!strcmp(rq->path, "/health")) {
    if (get) handle_health(d, a, close);
    else reply_error(h, a, 405, "use GET for /health", close, "Allow: GET\r\n");
  } else if (!strcmp(rq->path, "/metrics")) {
    if (get) handle_metrics(d, a, close);
    else reply_error(h, a, 405, "use GET for /metrics", close, "Allow: GET\r\n");
  } else if (!strcmp(rq->path, "/index")) {
    if (get) handle_index(d, a, rq->query, close);
    else reply_error(h, a, 405, "use GET for /index", close, "Allow: GET\r\n");
  } else if (!strcmp(rq->path, "/route") || !strcmp(rq->path, "/done")) {
    if (!post) {
      reply_error(h, a, 405, "use POST with a JSON body", close, "Allow: POST\r\n");
    } else if (rq->path[1] == 'r') {
      handle_route(d, a, body, rq->content_length, close);
    } else {
      handle_done(d, a, body, rq->content_length, close);
    }
  } else {
    reply_error(h, a, 404, "unknown path (try POST /route, POST /done, GET /health, GET /metrics, "
                "GET /index?worker=ID)",
                close, NULL);
  }
  kvbm_histogram_observe(&h->ep_seconds[h->ep], (double)(kvbm_clock_ns() - t0) * 1e-9);
  h->ep = EP_UNKNOWN;
}

/* ------------------------------------------------------------- loop */

/* After every wake-up of the service, at least every POLL_MS: requests
 * past request_ttl_s, the sources' housekeeping, approximate records past
 * their ttl; and a stop the sources asked for (they set d->stop). */
static void tick(void *user, int64_t now_ns) {
  (void)now_ns; /* the router's clock is kvbm__rd_now_ns */
  kvbm_router_daemon *d = user;
  http_state *h = d->http;
  h->now = kvbm__rd_now_ns();
  kvbm__reqtab_expire(&h->rt, h->now);
  kvbm__rd_sources_tick(d);
  kvbm_approx *ap = d->approx ? d->approx : d->degraded_ap;
  if (ap) { /* a source's thread drops records too (kvbm__approx_forget): all under wlock */
    pthread_mutex_lock(&d->wlock);
    if (kvbm_approx_pending(ap)) kvbm_approx_expire(ap, (double)h->now * 1e-9);
    pthread_mutex_unlock(&d->wlock);
  }
  if (atomic_load(&d->stop)) kvbm__service_stop(d->svc);
}

int kvbm_router_daemon_run(kvbm_router_daemon *d, kvbm_error *err) {
  if (atomic_load(&d->stop)) return KVBM_OK;
  kvbm_error e = {0};
  int rc = kvbm__service_run(d->svc, &e);
  if (rc) /* the service's message, named as the router's */
    return kvbm_error_set(err, rc, "router: %s", strncmp(e.msg, "router: ", 8) ? e.msg : e.msg + 8);
  return KVBM_OK;
}

void kvbm_router_daemon_stop(kvbm_router_daemon *d) {
  atomic_store(&d->stop, 1);
  kvbm__service_stop(d->svc);
}

uint16_t kvbm_router_daemon_port(const kvbm_router_daemon *d) { return d->port; }

/* ------------------------------------------------------------- setup */

/* Whether s[0..n) is a port one can connect to: 1..65535 in decimal. */
static bool port_ok(const char *s, size_t n) {
  if (n == 0 || n > 5) return false;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  return v >= 1 && v <= 65535;
}

/* The port of "[scheme://][user[:pass]@]host[:port][/...]" (a NATS URL, a
 * ZMQ tcp:// endpoint, "[::1]" hosts too): true when none is given and
 * none is required, or it is port_ok. ZMQ does not check (tcp://h:99999
 * connects nowhere, silently), so it is checked here. */
static bool url_port_ok(const char *u, size_t n, bool required) {
  const char *p = memmem(u, n, "://", 3);
  if (p) n -= (size_t)(p + 3 - u), u = p + 3;
  const char *slash = memchr(u, '/', n);
  if (slash) n = (size_t)(slash - u);
  for (const char *at; (at = memchr(u, '@', n));) n -= (size_t)(at + 1 - u), u = at + 1;
  for (const char *semi; (semi = memchr(u, ';', n));) /* ZMQ: source;destination */
    n -= (size_t)(semi + 1 - u), u = semi + 1;
  const char *colon = NULL;
  for (size_t i = 0; i < n; i++)
    if (u[i] == ':') colon = u + i;
    else if (u[i] == ']') colon = NULL; /* inside an IPv6 literal */
  if (!colon) return !required;
  return port_ok(colon + 1, n - (size_t)(colon + 1 - u));
}

static bool zmq_endpoint_ok(const char *ep) {
  return strncmp(ep, "tcp://", 6) || url_port_ok(ep, strlen(ep), true);
}

/* A NATS URL, or several separated by commas. */
static bool nats_url_ok(const char *url) {
  for (const char *p = url;;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    if (!url_port_ok(p, n, false)) return false;
    if (!comma) return true;
    p = comma + 1;
  }
}

static int check_sources(const kvbm_router_daemon_config *c, kvbm_error *err) {
  for (size_t i = 0; i < c->num_sources; i++) {
    const kvbm_router_source *s = &c->sources[i];
    if (!s->endpoint || !*s->endpoint)
      return kvbm_error_set(err, KVBM_EINVAL, "router: source %zu has no endpoint", i);
    if (s->kind != KVBM_SOURCE_ZMQ && s->kind != KVBM_SOURCE_NATS &&
        s->kind != KVBM_SOURCE_JETSTREAM)
      return kvbm_error_set(err, KVBM_EINVAL, "router: source %zu has an unknown kind", i);
    if (s->kind == KVBM_SOURCE_JETSTREAM &&
        (!s->stream || !*s->stream || strpbrk(s->stream, " \t\r\n.*>") || !s->subject ||
         !*s->subject))
      return kvbm_error_set(err, KVBM_EINVAL, "router: worker %" PRIu64 ": a JetStream source "
                            "needs a stream (no spaces, dots or wildcards) and a subject",
                            s->worker_id);
    if (s->kind == KVBM_SOURCE_ZMQ ? !zmq_endpoint_ok(s->endpoint) : !nats_url_ok(s->endpoint))
      return kvbm_error_set(err, KVBM_EINVAL, "router: worker %" PRIu64 ": '%s' has no valid port "
                            "(1..65535)", s->worker_id, s->endpoint);
    if (s->replay_endpoint && !zmq_endpoint_ok(s->replay_endpoint))
      return kvbm_error_set(err, KVBM_EINVAL, "router: worker %" PRIu64 ": replay endpoint '%s' has "
                            "no valid port (1..65535)", s->worker_id, s->replay_endpoint);
    /* one stream per worker id: the index orders a worker's batches by
     * their sequence, which two publishers would interleave */
    for (size_t j = 0; j < i; j++)
      if (c->sources[j].worker_id == s->worker_id)
        return kvbm_error_set(err, KVBM_EINVAL, "router: worker id %" PRIu64 " is given to two "
                              "sources (%s and %s); each source is one worker", s->worker_id,
                              c->sources[j].endpoint, s->endpoint);
  }
  return KVBM_OK;
}

static int check_config(const kvbm_router_daemon_config *c, kvbm_error *err) {
  int rc = kvbm_choice_config_check(&c->choice, err);
  if (rc) return rc;
  if (!c->host || !*c->host) return kvbm_error_set(err, KVBM_EINVAL, "router: no host to listen on");
  if (c->num_sources && !c->sources)
    return kvbm_error_set(err, KVBM_EINVAL, "router: sources missing");
  if (c->num_workers && !c->workers)
    return kvbm_error_set(err, KVBM_EINVAL, "router: workers missing");
  if (c->num_workers > KVBM_ROUTER_MAX_WORKERS)
    return kvbm_error_set(err, KVBM_EINVAL, "router: more than %d workers", KVBM_ROUTER_MAX_WORKERS);
  if (!isfinite(c->approx_ttl_s) || c->approx_ttl_s < 0 || !isfinite(c->worker_timeout_s) ||
      c->worker_timeout_s < 0 || !isfinite(c->request_ttl_s) || c->request_ttl_s <= 0 ||
      !isfinite(c->io_timeout_s) || c->io_timeout_s <= 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router: approx ttl, worker timeout (>= 0), request ttl and io timeout "
                          "(> 0) must be finite");
  if (c->max_per_peer < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router: max_per_peer 0 (>= 1: connections from "
                                            "one client address)");
  if (c->max_body < 64 || c->max_connections < 1 || c->max_tokens < 1 ||
      c->max_active_requests < 1 || c->approx_max_blocks < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router: max_body >= 64; max_connections, "
                                            "max_tokens, max_active_requests and "
                                            "approx_max_blocks >= 1");
  if (!isfinite(c->snapshot_every_s) || c->snapshot_every_s < 0 || c->snapshot_every_s > 1e6 ||
      (c->snapshot_path && !*c->snapshot_path))
    return kvbm_error_set(err, KVBM_EINVAL, "router: snapshot_every_s must be in 0..1e6 and "
                                            "snapshot_path, when given, not empty");
  if ((rc = kvbm__rd_sources_check_config(c, err))) return rc;
  return check_sources(c, err);
}

/* Descriptors open now (/proc/self/fd, else a probe up to `limit`). */
static size_t open_fds(size_t limit) {
  size_t n = 0;
  DIR *dir = opendir("/proc/self/fd");
  if (dir) {
    for (struct dirent *e; (e = readdir(dir));)
      if (e->d_name[0] != '.') n++;
    closedir(dir);
    return n ? n - 1 : 0; /* the directory's own */
  }
  for (size_t fd = 0; fd < limit && fd < 65536; fd++)
    if (fcntl((int)fd, F_GETFD) >= 0) n++;
  return n;
}

/* max_connections must fit the descriptor limit beside what is open (the
 * listening socket, its spare, the sources' sockets) and a margin for
 * what the sources open later: else the router would run out mid-flight. */
static int check_fd_limit(const kvbm_router_daemon *d, kvbm_error *err) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY) return KVBM_OK;
  size_t open = open_fds((size_t)rl.rlim_cur);
  size_t margin = FD_MARGIN + 4 * d->nsrc;
  if (open + margin + d->cfg.max_connections <= (size_t)rl.rlim_cur) return KVBM_OK;
  return kvbm_error_set(err, KVBM_EINVAL,
                        "router: max_connections %zu does not fit the descriptor limit "
                        "(RLIMIT_NOFILE %llu, %zu open, %zu kept in reserve): raise the "
                        "limit (ulimit -n) or lower max_connections to at most %lld",
                        d->cfg.max_connections, (unsigned long long)rl.rlim_cur, open, margin,
                        (long long)rl.rlim_cur - (long long)(open + margin));
}

static char *dup_str(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

/* The HTTP side: the service layer with the router's routes (each takes
 * every method: dispatch answers 405 and 404 itself), listening now so
 * that kvbm_router_daemon_port answers before run. */
static int listen_on(kvbm_router_daemon *d, kvbm_error *err) {
  struct in_addr ia;
  if (inet_pton(AF_INET, d->host, &ia) != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router: '%s' is not an IPv4 address", d->host);
  kvbm__service_route r[5];
  static const char *const paths[] = {"/route", "/done", "/health", "/metrics", NULL};
  for (size_t i = 0; i < 5; i++)
    r[i] = (kvbm__service_route){.path = paths[i], .methods = KVBM__SVC_ANY,
                                 .max_body = d->cfg.max_body, .fn = dispatch, .user = d};
  kvbm__service_config sc = {.name = "router", .host = d->host, .port = d->cfg.port,
                             .max_connections = d->cfg.max_connections > KVBM__SERVICE_MAX_CONN
                                                    ? KVBM__SERVICE_MAX_CONN
                                                    : (uint32_t)d->cfg.max_connections,
                             .max_per_peer = d->cfg.max_per_peer > UINT32_MAX
                                                 ? UINT32_MAX
                                                 : (uint32_t)d->cfg.max_per_peer,
                             .io_timeout_s = d->cfg.io_timeout_s > 86400 ? 86400
                                                                          : d->cfg.io_timeout_s,
                             .max_head = MAX_HEAD, .sndbuf = SNDBUF, .json_errors = true,
                             .error_newline = true, .routes = r, .nroutes = 5, .tick = tick,
                             .tick_user = d, .tick_ms = POLL_MS};
  int rc = kvbm__service_create(&sc, &d->svc, err);
  if (rc) return rc;
  d->port = kvbm__service_port(d->svc);
  return KVBM_OK;
}

int kvbm_router_daemon_create(const kvbm_router_daemon_config *cfg, kvbm_router_daemon **out,
                           kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "router: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  kvbm_router_daemon *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "router: out of memory");
  d->cfg = *cfg;
  bool oom = false;
  d->host = dup_str(cfg->host, &oom);
  d->http = calloc(1, sizeof *d->http);
  d->scfg = calloc(cfg->num_sources + 1, sizeof *d->scfg);
  d->src = calloc(cfg->num_sources + 1, sizeof *d->src);
  d->workers = calloc(cfg->num_workers + 1, sizeof *d->workers);
  oom |= !d->http || !d->scfg || !d->src || !d->workers;
  for (size_t i = 0; !oom && i < cfg->num_sources; i++) {
    d->scfg[i] = cfg->sources[i];
    d->scfg[i].endpoint = dup_str(cfg->sources[i].endpoint, &oom);
    d->scfg[i].replay_endpoint = dup_str(cfg->sources[i].replay_endpoint, &oom);
    d->scfg[i].subject = dup_str(cfg->sources[i].subject, &oom);
    d->scfg[i].topic = dup_str(cfg->sources[i].topic, &oom);
    d->scfg[i].stream = dup_str(cfg->sources[i].stream, &oom);
  }
  d->cfg.durable = d->durable = dup_str(cfg->durable, &oom);
  d->cfg.snapshot_path = d->snapshot_path = dup_str(cfg->snapshot_path, &oom);
  d->nsrc = cfg->num_sources;
  if (!oom && cfg->num_workers) memcpy(d->workers, cfg->workers, cfg->num_workers * sizeof *d->workers);
  d->cfg.host = d->host;
  d->cfg.sources = d->scfg;
  d->cfg.workers = d->workers;
  pthread_mutex_init(&d->wlock, NULL);
  pthread_mutex_init(&d->snap_mu, NULL);
  pthread_cond_init(&d->snap_cv, NULL);
  if (oom) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "router: out of memory");
    goto fail;
  }
  if ((rc = kvbm__reqtab_init(&d->http->rt, cfg->max_active_requests, load_drop, d->http, err)))
    goto fail;
  d->http->rng = cfg->seed ? cfg->seed : 1;
  d->http->t0 = kvbm__rd_now_ns();
  d->http->ep = EP_UNKNOWN;
  /* latency 0.1 ms .. ~1.7 s; routing phases 0.1 us .. ~0.8 s (Dynamo's
   * overhead buckets, longer); hit rate in tenths */
  for (int e = 0; e < EP_COUNT; e++)
    kvbm_histogram_init_exponential(&d->http->ep_seconds[e], 1e-4, 2, 15, NULL);
  kvbm_histogram *ov[] = {&d->http->ov_hash_ms, &d->http->ov_find_ms, &d->http->ov_sched_ms,
                          &d->http->ov_total_ms};
  for (size_t i = 0; i < sizeof ov / sizeof *ov; i++)
    kvbm_histogram_init_exponential(ov[i], 1e-4, 2, 24, NULL);
  kvbm_histogram_init(&d->http->hit_rate,
                      (double[]){0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}, 11, NULL);
  if ((rc = kvbm_index_create(&cfg->index, &d->idx, err))) goto fail;
  if ((rc = kvbm_metrics_create(&d->metrics, err)) ||
      (rc = kvbm_metrics_register(d->metrics, kvbm_index_metrics_collect, d->idx, NULL, 0, NULL, err)) ||
      (rc = kvbm_metrics_register(d->metrics, collect_daemon, d, NULL, 0, NULL, err)))
    goto fail;
  for (size_t i = 0; i < cfg->num_workers; i++)
    if ((rc = kvbm_index_add_worker(d->idx, cfg->workers[i], NULL, err))) goto fail;
  if (cfg->approx_ttl_s > 0) {
    kvbm_approx_config ac = {.ttl_s = cfg->approx_ttl_s,
                             .max_blocks_per_worker = cfg->approx_max_blocks};
    if ((rc = kvbm_approx_create(d->idx, &ac, &d->approx, err))) goto fail;
  } else {
    /* routing to a degraded worker is recorded as approximate mode does */
    kvbm_approx_config ac = kvbm_approx_config_default();
    ac.max_blocks_per_worker = cfg->approx_max_blocks;
    if ((rc = kvbm_approx_create(d->idx, &ac, &d->degraded_ap, err))) goto fail;
  }
  if ((rc = listen_on(d, err))) goto fail;
  for (size_t i = 0; i < d->nsrc; i++) d->src[i].d = d, d->src[i].cfg = d->scfg[i];
  if ((rc = kvbm__rd_snapshot_load(d, err))) goto fail;
  if ((rc = kvbm__rd_sources_start(d, err))) goto fail;
  if ((rc = check_fd_limit(d, err))) goto fail;
  if ((rc = kvbm__rd_snapshot_start(d, err))) goto fail;
  d->snap_armed = true;
  *out = d;
  return KVBM_OK;
fail:
  kvbm_router_daemon_destroy(d);
  return rc;
}

void kvbm_router_daemon_destroy(kvbm_router_daemon *d) {
  if (!d) return;
  if (d->src) kvbm__rd_sources_halt(d); /* the index stops changing */
  kvbm__rd_snapshot_stop(d);             /* the last snapshot */
  if (d->src) kvbm__rd_sources_stop(d);  /* JetStream sources ack it */
  if (d->http) {
    kvbm__reqtab_free(&d->http->rt);
    free(d->http);
  }
  kvbm__service_destroy(d->svc);
  kvbm_metrics_destroy(d->metrics);
  kvbm_approx_destroy(d->approx);
  kvbm_approx_destroy(d->degraded_ap);
  kvbm_index_destroy(d->idx);
  for (size_t i = 0; d->scfg && i < d->nsrc; i++) {
    free((char *)d->scfg[i].endpoint);
    free((char *)d->scfg[i].replay_endpoint);
    free((char *)d->scfg[i].subject);
    free((char *)d->scfg[i].topic);
    free((char *)d->scfg[i].stream);
  }
  free(d->durable);
  free(d->snapshot_path);
  free(d->scfg);
  free(d->src);
  free(d->workers);
  free(d->host);
  pthread_mutex_destroy(&d->wlock);
  pthread_mutex_destroy(&d->snap_mu);
  pthread_cond_destroy(&d->snap_cv);
  free(d);
}
