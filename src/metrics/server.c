/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.c: the metrics endpoint, GET /metrics on a thread of its own
 * (see kvbm/metrics.h).
 *
 * It lives inside an engine's process, so it must cost nothing when
 * nobody scrapes and must never let a client hurt the engine. The socket
 * side is the library's HTTP service layer (src/service/service.c, whose
 * essay gives the rules): one thread polls the listening socket, a
 * wake-up pipe and at most max_connections connections; heads are parsed
 * by the strict parser (at most MAX_HEAD bytes), bodies are refused (413:
 * a scrape has none), buffers are bounded (a client that never reads
 * holds one page and a little more, until io_timeout_s), deadlines run
 * both ways, and admission is the shared rule (common/admit.c: idle
 * connections make room for newcomers, max_per_peer per address). What
 * is left here is what is the endpoint's own: its configuration (and the
 * environment variables of Dynamo's names), the page, and the server's
 * counters rendered as metrics.
 *
 * A render takes the registry's lock and, through the collectors, each
 * component's lock for the time of a copy of its counters; the page is
 * copied to the connection's output after every lock is released.
 *
 * A daemon with a small GET API of its own (`kvbm advisor`) serves it from
 * this server too (metrics/server.h): its routes are one fallback route of
 * the service, answering every path but /metrics on the same thread under
 * the same limits, so there is one hardened HTTP server to keep.
 *
 * The server counts what it does (answers by status code, connections,
 * render time) in the registry it serves, through a collector of its own
 * registered at start and removed at stop; the service's counters are
 * atomics (a render may run on another thread) and the render-time
 * histogram has a mutex of its own.
 *
 * Modules: service depends on common only, metrics on service; the
 * service knows nothing of the registry (its counters are read here), so
 * there is no cycle.
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "metrics/internal.h"
#include "metrics/server.h"
#include "service/service.h"

#define MAX_HEAD 8192

/* answers counted by code in kvbm_metrics_http_responses_total */
static const int codes[] = {200, 400, 404, 405, 408, 413, 414, 417, 431, 500, 501, 503, 505};
#define NCODES (sizeof codes / sizeof codes[0])

struct kvbm_metrics_server {
  kvbm_metrics *reg;
  kvbm_metrics_server_config cfg;
  char host[INET_ADDRSTRLEN];
  kvbm__service *svc;
  uint64_t collector_id;
  bool registered;
  kvbm__metrics_routes routes;
  pthread_mutex_t hmu;
  kvbm_histogram render_s;
};

/* ------------------------------------------------------------- config */

kvbm_metrics_server_config kvbm_metrics_server_config_default(void) {
  return (kvbm_metrics_server_config){.enabled = false,
                                      .host = "0.0.0.0",
                                      .port = 6880,
                                      .max_connections = 16,
                                      .max_per_peer = 8,
                                      .io_timeout_s = 10};
}

static const char *env_get(const char *const *env, const char *name) {
  if (!env) return getenv(name);
  size_t n = strlen(name);
  for (size_t i = 0; env[i]; i++)
    if (!strncmp(env[i], name, n) && env[i][n] == '=') return env[i] + n + 1;
  return NULL;
}

int kvbm_metrics_server_config_env(kvbm_metrics_server_config *cfg, const char *const *env,
                                   kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "metrics: NULL config");
  kvbm_metrics_server_config c = *cfg;
  const char *v = env_get(env, "DYN_KVBM_METRICS");
  if (v) {
    if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
      c.enabled = true;
    else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off") || !*v)
      c.enabled = false;
    else
      return kvbm_error_set(err, KVBM_EINVAL,
                            "DYN_KVBM_METRICS: '%.64s' is not true/1/yes/on or false/0/no/off", v);
  }
  if ((v = env_get(env, "DYN_KVBM_METRICS_PORT"))) {
    unsigned long p = 0;
    size_t i = 0;
    for (; v[i] >= '0' && v[i] <= '9' && i < 6; i++) p = p * 10 + (unsigned long)(v[i] - '0');
    if (!i || v[i] || p > 65535)
      return kvbm_error_set(err, KVBM_EINVAL, "DYN_KVBM_METRICS_PORT: '%.64s' is not a port (0..65535)", v);
    c.port = (uint16_t)p;
  }
  if ((v = env_get(env, "KVBM_METRICS_HOST"))) {
    struct in_addr a;
    if (inet_pton(AF_INET, v, &a) != 1)
      return kvbm_error_set(err, KVBM_EINVAL, "KVBM_METRICS_HOST: '%.64s' is not an IPv4 address", v);
    c.host = v;
  }
  *cfg = c;
  return KVBM_OK;
}

/* ------------------------------------------------------------ counters */

static void collect(void *user, kvbm_metrics_writer *w) {
  kvbm_metrics_server *s = user;
  kvbm__service_stats st;
  kvbm__service_stats_get(s->svc, &st);
  kvbm_metrics_family(w, "kvbm_metrics_http_responses_total", KVBM_METRIC_COUNTER,
                      "Answers of the metrics endpoint, by HTTP status code");
  char code[8];
  uint64_t named = 0;
  for (size_t i = 0; i < NCODES; i++) {
    uint64_t n = kvbm__service_answers(s->svc, codes[i]);
    named += n;
    snprintf(code, sizeof code, "%d", codes[i]);
    kvbm_metrics_value_u64(w, &(kvbm_metric_label){"code", code}, 1, n);
  }
  /* every other code (100 Continue is not an answer) */
  uint64_t all = st.answered + st.bad_requests;
  if (all > named) kvbm_metrics_value_u64(w, &(kvbm_metric_label){"code", "other"}, 1, all - named);
  kvbm_metrics_family(w, "kvbm_metrics_http_connections_total", KVBM_METRIC_COUNTER,
                      "Connections to the metrics endpoint: accepted, or answered 503 and "
                      "closed with no idle connection to close for them (refused: over "
                      "max_connections; refused_peer: over max_per_peer from their address)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "accepted"}, 1, st.accepted);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "refused"}, 1,
                         st.refused_busy + st.refused_no_fd);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "refused_peer"}, 1, st.refused_peer);
  kvbm_metrics_family(w, "kvbm_metrics_http_idle_closed_total", KVBM_METRIC_COUNTER,
                      "Idle metrics endpoint connections closed to admit a new one (full: the "
                      "table was full; peer: the newcomer's address was at max_per_peer, one "
                      "of its own)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "full"}, 1, st.idle_closed_full);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "peer"}, 1, st.idle_closed_peer);
  kvbm_metrics_counter(w, "kvbm_metrics_http_timeouts_total",
                       "Metrics endpoint connections closed because a request or the taking "
                       "of an answer passed io_timeout_s", NULL, 0,
                       st.read_timeouts + st.idle_timeouts + st.write_timeouts);
  kvbm_metrics_counter(w, "kvbm_metrics_http_accept_pauses_total",
                       "Times the metrics endpoint stopped accepting for a moment (no "
                       "descriptors or memory)", NULL, 0, st.accept_pauses);
  pthread_mutex_lock(&s->hmu);
  kvbm_histogram h = s->render_s;
  pthread_mutex_unlock(&s->hmu);
  kvbm_metrics_family(w, "kvbm_metrics_render_seconds", KVBM_METRIC_HISTOGRAM,
                      "Time to render the metrics page (collectors' snapshots and text), "
                      "per request");
  kvbm_metrics_histogram_value(w, NULL, 0, &h);
}

/* -------------------------------------------------------------- routes */

/* GET /metrics: the page, rendered into the scratch buffer's place. */
static void serve_page(void *user, kvbm__service *svc, const kvbm__service_req *req,
                       kvbm__service_answer *a) {
  (void)svc;
  (void)req;
  kvbm_metrics_server *s = user;
  char *text = NULL;
  size_t len = 0;
  double t0 = kvbm_clock_seconds();
  int rc = kvbm_metrics_render(s->reg, &text, &len, NULL);
  double dt = kvbm_clock_seconds() - t0;
  pthread_mutex_lock(&s->hmu);
  kvbm_histogram_observe(&s->render_s, dt);
  pthread_mutex_unlock(&s->hmu);
  if (rc || !kvbm__service_buf_append(a->scratch, text, len)) {
    a->scratch->len = 0;
    a->scratch->oom = false;
    a->status = 500;
    a->content_type = "text/plain; charset=utf-8";
    a->close = true;
    kvbm__service_buf_printf(a->scratch, "out of memory rendering the metrics\n");
  }
  kvbm_metrics_text_free(text);
}

/* Every other path: the daemon's routes (metrics/server.h). */
static void serve_route(void *user, kvbm__service *svc, const kvbm__service_req *req,
                        kvbm__service_answer *a) {
  (void)svc;
  kvbm_metrics_server *s = user;
  kvbm__service_buf *b = a->scratch;
  size_t len = 0;
  a->status = s->routes.fn(s->routes.user, s, req->head, &b->p, &len, &b->cap);
  b->len = b->p ? len : 0;
}

/* --------------------------------------------------------------- setup */

static void server_free(kvbm_metrics_server *s) {
  kvbm__service_stop(s->svc); /* first: the routes use the registry */
  if (s->registered) kvbm_metrics_unregister(s->reg, s->collector_id);
  kvbm__service_destroy(s->svc);
  pthread_mutex_destroy(&s->hmu);
  free(s);
}

int kvbm_metrics_server_start(kvbm_metrics *reg, const kvbm_metrics_server_config *cfg,
                              kvbm_metrics_server **out, kvbm_error *err) {
  return kvbm__metrics_server_start_routes(reg, cfg, NULL, out, err);
}

int kvbm__metrics_server_start_routes(kvbm_metrics *reg, const kvbm_metrics_server_config *cfg,
                                      const kvbm__metrics_routes *routes,
                                      kvbm_metrics_server **out, kvbm_error *err) {
  if (!reg || !cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "metrics: NULL argument");
  if (cfg->max_connections < 1 || cfg->max_connections > 4096) /* the endpoint's own bound */
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: max_connections %u (1..4096)",
                          cfg->max_connections);
  kvbm_metrics_server *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
  s->reg = reg;
  s->cfg = *cfg;
  if (routes) s->routes = *routes;
  snprintf(s->host, sizeof s->host, "%s", cfg->host ? cfg->host : "0.0.0.0");
  s->cfg.host = s->host;
  pthread_mutex_init(&s->hmu, NULL);
  /* render time: 10 us .. ~5 s */
  kvbm_histogram_init_exponential(&s->render_s, 1e-5, 2.5, 15, NULL);
  kvbm__service_route r[2] = {
      {.path = "/metrics", .methods = KVBM__SVC_GET | KVBM__SVC_HEAD,
       .content_type = "text/plain; version=0.0.4; charset=utf-8",
       .method_msg = "use GET /metrics", .fn = serve_page, .user = s},
      {.path = NULL, .methods = KVBM__SVC_GET | KVBM__SVC_HEAD,
       .content_type = s->routes.content_type ? s->routes.content_type : "application/json",
       .method_msg = "only GET and HEAD are served", .fn = serve_route, .user = s},
  };
  kvbm__service_config sc = {.name = "metrics", .host = cfg->host ? cfg->host : "0.0.0.0",
                             .port = cfg->port, .max_connections = cfg->max_connections,
                             .max_per_peer = cfg->max_per_peer,
                             .io_timeout_s = cfg->io_timeout_s, .max_head = MAX_HEAD,
                             .json_errors = s->routes.json_errors,
                             .not_found = "not found: the metrics are at /metrics",
                             .routes = r, .nroutes = s->routes.fn ? 2 : 1};
  int rc = kvbm__service_create(&sc, &s->svc, err);
  if (rc) goto fail;
  if ((rc = kvbm_metrics_register(reg, collect, s, NULL, 0, &s->collector_id, err))) goto fail;
  s->registered = true;
  if ((rc = kvbm__service_start(s->svc, err))) goto fail;
  *out = s;
  return KVBM_OK;
fail:
  server_free(s);
  return rc;
}

uint16_t kvbm_metrics_server_port(const kvbm_metrics_server *s) {
  return s ? kvbm__service_port(s->svc) : 0;
}

void kvbm__metrics_server_stats_get(const kvbm_metrics_server *s, kvbm__metrics_server_stats *out) {
  if (!s || !out) return;
  kvbm__service_stats st;
  kvbm__service_stats_get(s->svc, &st);
  *out = (kvbm__metrics_server_stats){
      .connections = st.connections,
      .accepted = st.accepted,
      .refused_busy = st.refused_busy + st.refused_no_fd,
      .refused_peer = st.refused_peer,
      .idle_closed_full = st.idle_closed_full,
      .idle_closed_peer = st.idle_closed_peer,
      .accept_pauses = st.accept_pauses,
      .requests = st.requests,
      .answered = st.answered,
      .bad_requests = st.bad_requests,
      .read_timeouts = st.read_timeouts + st.idle_timeouts, /* as it always counted */
      .write_timeouts = st.write_timeouts,
  };
}

void kvbm_metrics_server_stop(kvbm_metrics_server *s) {
  if (!s) return;
  server_free(s);
}
