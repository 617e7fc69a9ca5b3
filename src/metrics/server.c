/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.c: the metrics endpoint, GET /metrics on a thread of its own
 * (see kvbm/metrics.h).
 *
 * It lives inside an engine's process, so it must cost nothing when
 * nobody scrapes and must never let a client hurt the engine. One thread
 * polls the listening socket, a wake-up pipe and at most max_connections
 * connections; everything is non-blocking and every buffer is bounded:
 *   - a request head is at most MAX_HEAD bytes in a fixed buffer per
 *     connection, parsed by the library's strict head parser
 *     (common/http.c, the router's); bodies are refused (413), since a
 *     scrape has none;
 *   - one answer per connection is in flight at a time; requests that
 *     were pipelined behind it wait in the input buffer, and input is not
 *     read while an answer waits, so a client that never reads cannot
 *     make us buffer more than one page for it;
 *   - deadlines both ways: a request must be complete within io_timeout_s
 *     of its first byte, an answer taken within io_timeout_s, and an idle
 *     keep-alive connection goes after io_timeout_s;
 *   - admission: at most max_connections connections, and at most
 *     max_per_peer from one IPv4 address, by the rule the router daemon
 *     uses too (common/admit.c says why): a newcomer that would pass a
 *     bound takes the slot of an idle connection (no request begun, no
 *     answer queued, the one idle longest; its address's own when the
 *     address is at its bound), and is answered 503 only when there is
 *     none (counted apart: "refused" for the table, "refused_peer" for
 *     the address). Sockets opened and left idle must not lock real
 *     clients out for io_timeout_s (64 of them once shut the advisor for
 *     10 s). make_room() below applies it: one pass over the table per
 *     new connection (O(max_connections), 4096 at most, no allocation);
 *     when accept() fails for want of descriptors the listening socket
 *     rests for ACCEPT_PAUSE_MS instead of spinning.
 * A render takes the registry's lock and, through the collectors, each
 * component's lock for the time of a copy of its counters; the page is
 * written to the socket after every lock is released.
 *
 * A daemon with a small GET API of its own (`kvbm advisor`) serves it from
 * this server too (metrics/server.h): its routes answer every path but
 * /metrics on the same thread, under the same limits, so there is one
 * hardened HTTP server to keep rather than two.
 *
 * The server counts what it does (answers by status code, connections,
 * render time) in the registry it serves, through a collector of its own
 * registered at start and removed at stop; those counters are atomics (a
 * render may run on another thread) and the render-time histogram has a
 * mutex of its own.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/admit.h"
#include "common/clock.h"
#include "common/http.h"
#include "common/sendbuf.h"
#include "metrics/internal.h"
#include "metrics/server.h"

#define MAX_HEAD 8192
#define ACCEPT_PAUSE_MS 100
#define MAX_POLL_MS 1000

/* answers counted by code */
static const int codes[] = {200, 400, 404, 405, 408, 413, 414, 417, 431, 500, 501, 503, 505};
#define NCODES (sizeof codes / sizeof codes[0])

typedef struct mconn {
  int fd;
  char in[MAX_HEAD];
  size_t in_len, scanned;
  char *out;
  size_t out_len, out_off;
  int64_t deadline_ns; /* request complete / answer taken / idle by then */
  int64_t idle_ns;     /* when it last became idle (accepted, answer taken) */
  uint32_t peer;       /* the client's IPv4 address, network order */
  bool pending;        /* bytes seen waiting (MSG_PEEK) and not read yet */
  bool close_after;    /* close once the answer is out */
  bool eof;
} mconn;

struct kvbm_metrics_server {
  kvbm_metrics *reg;
  kvbm_metrics_server_config cfg;
  char host[INET_ADDRSTRLEN];
  int lfd, wake[2];
  uint16_t port;
  pthread_t th;
  bool started;
  uint64_t collector_id;
  bool registered;
  _Atomic int stop;
  /* counters (any thread reads them through the collector) */
  _Atomic uint64_t answers[NCODES + 1]; /* the last: other codes */
  _Atomic uint64_t accepted, refused, read_timeouts, write_timeouts, accept_pauses;
  _Atomic uint64_t refused_peer, idle_closed_full, idle_closed_peer;
  _Atomic uint64_t requests, open, answered, bad;
  kvbm__metrics_routes routes;
  char *body; /* the routes' answers (the server thread's) */
  size_t body_cap;
  pthread_mutex_t hmu;
  kvbm_histogram render_s;
  /* the server thread's own */
  mconn *c;
  size_t nc;
  int64_t io_ns, accept_at;
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

static void count_answer(kvbm_metrics_server *s, int code) {
  size_t i = 0;
  while (i < NCODES && codes[i] != code) i++;
  atomic_fetch_add(&s->answers[i], 1);
  atomic_fetch_add(code < 400 ? &s->answered : &s->bad, 1);
}

static void collect(void *user, kvbm_metrics_writer *w) {
  kvbm_metrics_server *s = user;
  kvbm_metrics_family(w, "kvbm_metrics_http_responses_total", KVBM_METRIC_COUNTER,
                      "Answers of the metrics endpoint, by HTTP status code");
  char code[8];
  for (size_t i = 0; i <= NCODES; i++) {
    uint64_t n = atomic_load(&s->answers[i]);
    if (i == NCODES && !n) continue;
    if (i < NCODES) snprintf(code, sizeof code, "%d", codes[i]);
    else snprintf(code, sizeof code, "other");
    kvbm_metrics_value_u64(w, &(kvbm_metric_label){"code", code}, 1, n);
  }
  kvbm_metrics_family(w, "kvbm_metrics_http_connections_total", KVBM_METRIC_COUNTER,
                      "Connections to the metrics endpoint: accepted, or answered 503 and "
                      "closed with no idle connection to close for them (refused: over "
                      "max_connections; refused_peer: over max_per_peer from their address)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "accepted"}, 1, atomic_load(&s->accepted));
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "refused"}, 1, atomic_load(&s->refused));
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"result", "refused_peer"}, 1,
                         atomic_load(&s->refused_peer));
  kvbm_metrics_family(w, "kvbm_metrics_http_idle_closed_total", KVBM_METRIC_COUNTER,
                      "Idle metrics endpoint connections closed to admit a new one (full: the "
                      "table was full; peer: the newcomer's address was at max_per_peer, one "
                      "of its own)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "full"}, 1,
                         atomic_load(&s->idle_closed_full));
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "peer"}, 1,
                         atomic_load(&s->idle_closed_peer));
  kvbm_metrics_counter(w, "kvbm_metrics_http_timeouts_total",
                       "Metrics endpoint connections closed because a request or the taking "
                       "of an answer passed io_timeout_s", NULL, 0,
                       atomic_load(&s->read_timeouts) + atomic_load(&s->write_timeouts));
  kvbm_metrics_counter(w, "kvbm_metrics_http_accept_pauses_total",
                       "Times the metrics endpoint stopped accepting for a moment (no "
                       "descriptors or memory)", NULL, 0, atomic_load(&s->accept_pauses));
  pthread_mutex_lock(&s->hmu);
  kvbm_histogram h = s->render_s;
  pthread_mutex_unlock(&s->hmu);
  kvbm_metrics_family(w, "kvbm_metrics_render_seconds", KVBM_METRIC_HISTOGRAM,
                      "Time to render the metrics page (collectors' snapshots and text), "
                      "per request");
  kvbm_metrics_histogram_value(w, NULL, 0, &h);
}

/* ---------------------------------------------------------- connections */

static void conn_close(kvbm_metrics_server *s, size_t i) {
  close(s->c[i].fd);
  free(s->c[i].out);
  s->c[i] = s->c[--s->nc];
  atomic_store(&s->open, s->nc);
}

/* Queues an answer: the head, and the body unless head_only (a HEAD
 * request: Content-Length still says what GET would send). */
static bool answer(kvbm_metrics_server *s, mconn *c, int code, const char *ctype,
                   const char *extra, char *body, size_t blen, bool head_only, bool close_after) {
  char h[320];
  int hn = snprintf(h, sizeof h,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                    "Connection: %s\r\n%s\r\n",
                    code, kvbm__http_reason(code), ctype, blen, close_after ? "close" : "keep-alive",
                    extra ? extra : "");
  size_t send_body = head_only ? 0 : blen;
  char *out = malloc((size_t)hn + send_body + 1);
  if (!out) return false;
  memcpy(out, h, (size_t)hn);
  if (send_body) memcpy(out + hn, body, send_body);
  free(c->out);
  c->out = out;
  c->out_len = (size_t)hn + send_body;
  c->out_off = 0;
  c->close_after = close_after;
  count_answer(s, code);
  return true;
}

/* An answer of the server's own (an error, mostly): plain text, or the
 * routes' JSON form {"error":"...","status":N}. */
static bool answer_text(kvbm_metrics_server *s, mconn *c, int code, const char *msg,
                        const char *extra, bool close_after) {
  char body[320];
  int n;
  if (s->routes.json_errors) {
    char safe[256];
    size_t k = 0;
    for (const char *p = msg ? msg : ""; *p && k + 1 < sizeof safe; p++)
      if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) safe[k++] = *p;
    safe[k] = 0;
    n = snprintf(body, sizeof body, "{\"error\":\"%s\",\"status\":%d}", safe, code);
    return answer(s, c, code, "application/json", extra, body, (size_t)n, false, close_after);
  }
  n = snprintf(body, sizeof body, "%s\n", msg);
  return answer(s, c, code, "text/plain; charset=utf-8", extra, body, (size_t)n, false,
                close_after);
}

/* A path of the routes' (GET or HEAD). */
static bool serve_route(kvbm_metrics_server *s, mconn *c, const http_req *rq, bool head_only,
                        bool close_after) {
  size_t len = 0;
  int code = s->routes.fn(s->routes.user, s, rq, &s->body, &len, &s->body_cap);
  if (code < 100 || code > 599) code = 500;
  return answer(s, c, code, s->routes.content_type ? s->routes.content_type : "application/json",
                NULL, s->body ? s->body : "", s->body ? len : 0, head_only, close_after);
}

static bool serve_page(kvbm_metrics_server *s, mconn *c, bool head_only, bool close_after) {
  char *text = NULL;
  size_t len = 0;
  double t0 = kvbm_clock_seconds();
  int rc = kvbm_metrics_render(s->reg, &text, &len, NULL);
  double dt = kvbm_clock_seconds() - t0;
  pthread_mutex_lock(&s->hmu);
  kvbm_histogram_observe(&s->render_s, dt);
  pthread_mutex_unlock(&s->hmu);
  if (rc) return answer_text(s, c, 500, "out of memory rendering the metrics", NULL, true);
  bool ok = answer(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, len,
                   head_only, close_after);
  kvbm_metrics_text_free(text);
  return ok;
}

/* Answers the first complete request in c->in, if there is one. false
 * when the connection is to go at once. */
static bool handle(kvbm_metrics_server *s, mconn *c, int64_t now) {
  http_req rq;
  int status = 0;
  const char *why = NULL;
  http_result r = kvbm__http_parse_head(c->in, c->in_len, MAX_HEAD, 0, &c->scanned, &rq, &status, &why);
  if (r == HTTP_NEED_MORE) {
    if (c->eof) return false; /* the client stopped sending mid-head */
    return true;
  }
  if (r == HTTP_BAD) return answer_text(s, c, status, why, NULL, true);
  /* one request consumed */
  memmove(c->in, c->in + rq.head_len, c->in_len - rq.head_len);
  c->in_len -= rq.head_len;
  c->scanned = 0;
  c->deadline_ns = now + s->io_ns;
  atomic_fetch_add(&s->requests, 1);
  /* after the client's FIN, requests it pipelined before it are still
   * answered; the last one closes */
  bool close_after = !rq.keep_alive || (c->eof && !c->in_len);
  bool get = !strcmp(rq.method, "GET"), head = !strcmp(rq.method, "HEAD");
  bool metrics = !strcmp(rq.path, "/metrics");
  if (!metrics && !s->routes.fn)
    return answer_text(s, c, 404, "not found: the metrics are at /metrics", NULL, close_after);
  if (!get && !head)
    return answer_text(s, c, 405, metrics ? "use GET /metrics" : "only GET and HEAD are served",
                       "Allow: GET, HEAD\r\n", close_after);
  if (!metrics) return serve_route(s, c, &rq, head, close_after);
  return serve_page(s, c, head, close_after);
}

/* Writes what the socket takes: -1 failed, 0 more to write, 1 all out. */
static int conn_write(mconn *c) {
  int w = kvbm__send_pending(c->fd, c->out, c->out_len, &c->out_off);
  if (w <= 0) return w;
  free(c->out);
  c->out = NULL;
  c->out_len = c->out_off = 0;
  return 1;
}

/* One connection's turn; false when it is to go. */
static bool conn_turn(kvbm_metrics_server *s, mconn *c, short re, int64_t now) {
  if (re & (POLLERR | POLLNVAL)) return false;
  if (c->out) {
    if (!(re & (POLLOUT | POLLHUP))) goto deadline;
    int w = conn_write(c);
    if (w < 0) return false;
    if (w == 0) goto deadline;
    if (c->close_after) return false;
    c->deadline_ns = now + s->io_ns;
    c->idle_ns = now;
  } else if (re & (POLLIN | POLLHUP)) {
    c->pending = false; /* whatever waited is read now */
    for (;;) {
      if (c->in_len == MAX_HEAD) break; /* the parser answers 431 */
      ssize_t n = recv(c->fd, c->in + c->in_len, MAX_HEAD - c->in_len, 0);
      if (n > 0) {
        if (c->in_len == 0) c->deadline_ns = now + s->io_ns; /* a request begins */
        c->in_len += (size_t)n;
        continue;
      }
      if (n == 0) {
        c->eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
  }
  /* answer what came (one request at a time), at once if the socket takes it */
  while (!c->out && c->in_len) {
    if (!handle(s, c, now)) return false;
    if (!c->out) break; /* the head is not complete */
    int w = conn_write(c);
    if (w < 0) return false;
    if (w == 0) break;
    if (c->close_after) return false;
    c->idle_ns = now;
  }
  if (!c->out && !c->in_len && c->eof) return false;
deadline:
  if (now <= c->deadline_ns) return true;
  if (c->out) { /* an answer not taken */
    atomic_fetch_add(&s->write_timeouts, 1);
    return false;
  }
  atomic_fetch_add(&s->read_timeouts, 1); /* a request late, or an idle connection */
  if (!c->in_len) return false;
  /* a request that did not arrive in time: say so if the socket takes it */
  answer_text(s, c, 408, "request not complete in time", NULL, true);
  conn_write(c);
  return false;
}

/* Answers 503 on a connection that gets no slot, and closes it. The
 * answer is sent without waiting (a fresh socket's buffer takes it). */
static void refuse(kvbm_metrics_server *s, int fd, const char *why) {
  char m[320];
  int n;
  if (s->routes.json_errors)
    n = snprintf(m, sizeof m,
                 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n{\"error\":\"%s\",\"status\":503}",
                 strlen(why) + 25, why);
  else
    n = snprintf(m, sizeof m,
                 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                 strlen(why), why);
  ssize_t w = send(fd, m, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)w;
  close(fd);
  count_answer(s, 503);
}

/* Idle: nothing of a request read (none begun), no answer queued, and no
 * bytes seen waiting unread. A connection just accepted is idle. */
static bool conn_idle(const mconn *c) { return !c->in_len && !c->out && !c->pending; }

/* The table as the admission rule (common/admit.c) reads it. */
static void admit_get(const void *table, size_t i, kvbm__admit_conn *out) {
  const mconn *c = &((const mconn *)table)[i];
  *out = (kvbm__admit_conn){.fd = c->fd, .peer = c->peer, .idle = conn_idle(c),
                            .idle_ns = c->idle_ns};
}

/* A connection the rule picked had a request waiting: not idle until read. */
static void admit_busy(void *table, size_t i) { ((mconn *)table)[i].pending = true; }

/* Makes room for a new connection from `peer` by the shared rule (the
 * essay above, common/admit.c), closing the idle connection it names;
 * false: the newcomer is to be refused (503). Each count is kept here. */
static bool make_room(kvbm_metrics_server *s, uint32_t peer, const char **why) {
  kvbm__admit_table t = {.table = s->c, .n = s->nc, .max_conn = s->cfg.max_connections,
                         .max_per_peer = s->cfg.max_per_peer, .get = admit_get,
                         .busy = admit_busy};
  size_t v = 0;
  kvbm__admit_kind k = kvbm__admit_make_room(&t, peer, &v);
  switch (k) {
  case KVBM__ADMIT_ROOM:
    return true;
  case KVBM__ADMIT_CLOSE_PEER:
  case KVBM__ADMIT_CLOSE_FULL:
    conn_close(s, v);
    atomic_fetch_add(k == KVBM__ADMIT_CLOSE_PEER ? &s->idle_closed_peer : &s->idle_closed_full, 1);
    return true;
  case KVBM__ADMIT_REFUSE_PEER:
    atomic_fetch_add(&s->refused_peer, 1);
    *why = "too many connections from your address";
    return false;
  case KVBM__ADMIT_REFUSE_FULL:
    break;
  }
  atomic_fetch_add(&s->refused, 1);
  *why = "too many connections";
  return false;
}

static void accept_some(kvbm_metrics_server *s, int64_t now) {
  for (int k = 0; k < 64; k++) {
    struct sockaddr_in pa = {0};
    socklen_t pl = sizeof pa;
    int fd = accept4(s->lfd, (struct sockaddr *)&pa, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) { /* EMFILE, ENOBUFS, ...: rest */
        s->accept_at = now + (int64_t)ACCEPT_PAUSE_MS * 1000000;
        atomic_fetch_add(&s->accept_pauses, 1);
      }
      return;
    }
    uint32_t peer = kvbm__admit_peer_key((struct sockaddr *)&pa, pl); /* IPv4: the address */
    const char *why = NULL;
    if (!make_room(s, peer, &why)) {
      refuse(s, fd, why);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    mconn *c = &s->c[s->nc++];
    c->fd = fd;
    c->in_len = c->scanned = 0;
    c->out = NULL;
    c->out_len = c->out_off = 0;
    c->close_after = c->eof = c->pending = false;
    c->deadline_ns = now + s->io_ns;
    c->idle_ns = now;
    c->peer = peer;
    atomic_fetch_add(&s->accepted, 1);
    atomic_store(&s->open, s->nc);
  }
}

static void *server_main(void *arg) {
  kvbm_metrics_server *s = arg;
  size_t np = (size_t)s->cfg.max_connections + 2;
  struct pollfd *pfd = calloc(np, sizeof *pfd);
  if (!pfd) return NULL; /* stop still works: it only joins */
  while (!atomic_load(&s->stop)) {
    int64_t now = (int64_t)kvbm_clock_ns();
    bool resting = now < s->accept_at;
    pfd[0] = (struct pollfd){.fd = resting ? -1 : s->lfd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    int64_t next = now + (int64_t)MAX_POLL_MS * 1000000;
    if (resting && s->accept_at < next) next = s->accept_at;
    for (size_t i = 0; i < s->nc; i++) {
      pfd[i + 2] = (struct pollfd){.fd = s->c[i].fd, .events = s->c[i].out ? POLLOUT : POLLIN};
      if (s->c[i].deadline_ns < next) next = s->c[i].deadline_ns;
    }
    int timeout = next > now ? (int)((next - now) / 1000000) + 1 : 0;
    int n = poll(pfd, s->nc + 2, timeout);
    if (n < 0 && errno != EINTR) break;
    now = (int64_t)kvbm_clock_ns();
    size_t nc = s->nc; /* connections accepted below are polled next round */
    for (size_t i = nc; i-- > 0;)
      if (!conn_turn(s, &s->c[i], n > 0 ? pfd[i + 2].revents : 0, now)) conn_close(s, i);
    if (n > 0 && (pfd[0].revents & POLLIN)) accept_some(s, now);
    if (n > 0 && (pfd[1].revents & POLLIN)) {
      char buf[16];
      ssize_t r = read(s->wake[0], buf, sizeof buf);
      (void)r;
    }
  }
  free(pfd);
  return NULL;
}

/* --------------------------------------------------------------- setup */

static void server_free(kvbm_metrics_server *s) {
  if (s->registered) kvbm_metrics_unregister(s->reg, s->collector_id);
  while (s->nc) conn_close(s, 0);
  free(s->c);
  if (s->lfd >= 0) close(s->lfd);
  for (int i = 0; i < 2; i++)
    if (s->wake[i] >= 0) close(s->wake[i]);
  pthread_mutex_destroy(&s->hmu);
  free(s->body);
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
  const char *host = cfg->host ? cfg->host : "0.0.0.0";
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cfg->port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: host '%.64s' is not an IPv4 address", host);
  if (cfg->max_connections < 1 || cfg->max_connections > 4096)
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: max_connections %u (1..4096)",
                          cfg->max_connections);
  if (cfg->max_per_peer < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: max_per_peer 0 (>= 1)");
  if (!(cfg->io_timeout_s > 0) || cfg->io_timeout_s > 86400)
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: io_timeout_s must be in (0, 86400]");
  kvbm_metrics_server *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
  s->reg = reg;
  s->cfg = *cfg;
  if (routes) s->routes = *routes;
  snprintf(s->host, sizeof s->host, "%s", host);
  s->cfg.host = s->host;
  s->lfd = s->wake[0] = s->wake[1] = -1;
  s->io_ns = (int64_t)(cfg->io_timeout_s * 1e9);
  pthread_mutex_init(&s->hmu, NULL);
  /* render time: 10 us .. ~5 s */
  kvbm_histogram_init_exponential(&s->render_s, 1e-5, 2.5, 15, NULL);
  int rc = KVBM_OK;
  s->c = calloc(cfg->max_connections, sizeof *s->c);
  if (!s->c) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
    goto fail;
  }
  if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC)) {
    rc = kvbm_error_set(err, KVBM_EIO, "metrics: pipe: %s", strerror(errno));
    goto fail;
  }
  s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s->lfd >= 0) setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 64)) {
    rc = kvbm_error_set(err, KVBM_EIO, "metrics: cannot listen on %s:%u: %s", host, cfg->port,
                        strerror(errno));
    goto fail;
  }
  socklen_t al = sizeof a;
  getsockname(s->lfd, (struct sockaddr *)&a, &al);
  s->port = ntohs(a.sin_port);
  if ((rc = kvbm_metrics_register(reg, collect, s, NULL, 0, &s->collector_id, err))) goto fail;
  s->registered = true;
  if (pthread_create(&s->th, NULL, server_main, s)) {
    rc = kvbm_error_set(err, KVBM_EIO, "metrics: cannot start the server thread");
    goto fail;
  }
  s->started = true;
  *out = s;
  return KVBM_OK;
fail:
  server_free(s);
  return rc;
}

uint16_t kvbm_metrics_server_port(const kvbm_metrics_server *s) { return s ? s->port : 0; }

void kvbm__metrics_server_stats_get(const kvbm_metrics_server *s, kvbm__metrics_server_stats *out) {
  if (!s || !out) return;
  kvbm_metrics_server *m = (kvbm_metrics_server *)s; /* atomics: loads only */
  memset(out, 0, sizeof *out);
  out->connections = atomic_load(&m->open);
  out->accepted = atomic_load(&m->accepted);
  out->refused_busy = atomic_load(&m->refused);
  out->refused_peer = atomic_load(&m->refused_peer);
  out->idle_closed_full = atomic_load(&m->idle_closed_full);
  out->idle_closed_peer = atomic_load(&m->idle_closed_peer);
  out->accept_pauses = atomic_load(&m->accept_pauses);
  out->requests = atomic_load(&m->requests);
  out->read_timeouts = atomic_load(&m->read_timeouts);
  out->write_timeouts = atomic_load(&m->write_timeouts);
  out->answered = atomic_load(&m->answered);
  out->bad_requests = atomic_load(&m->bad);
}

void kvbm_metrics_server_stop(kvbm_metrics_server *s) {
  if (!s) return;
  atomic_store(&s->stop, 1);
  ssize_t w = write(s->wake[1], "x", 1);
  (void)w;
  if (s->started) pthread_join(s->th, NULL);
  server_free(s);
}
