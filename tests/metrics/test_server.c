/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_server.c: the metrics endpoint (kvbm_metrics_server_*) over real
 * loopback sockets: what a scraper gets, what a hostile or slow client
 * gets, the connection limits (idle connections closed first, the
 * per-address bound), and the environment switch.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/metrics.h"
#include "metrics/server.h"

static void collect(void *user, kvbm_metrics_writer *w) {
  /* atomic: a test may change it while the server renders a pipelined request */
  kvbm_metrics_counter(w, "t_hits_total", "hits", NULL, 0,
                       __atomic_load_n((uint64_t *)user, __ATOMIC_RELAXED));
}

typedef struct fixture {
  kvbm_metrics *reg;
  kvbm_metrics_server *srv;
  uint64_t hits;
  uint16_t port;
} fixture;

static fixture *start_peer(uint32_t max_conn, uint32_t max_per_peer, double timeout) {
  fixture *f = calloc(1, sizeof *f);
  f->hits = 42;
  assert_int_equal(kvbm_metrics_create(&f->reg, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(f->reg, collect, &f->hits, NULL, 0, NULL, NULL), KVBM_OK);
  kvbm_metrics_server_config c = kvbm_metrics_server_config_default();
  c.host = "127.0.0.1";
  c.port = 0;
  c.max_connections = max_conn;
  c.max_per_peer = max_per_peer;
  c.io_timeout_s = timeout;
  kvbm_error err = {0};
  assert_int_equal(kvbm_metrics_server_start(f->reg, &c, &f->srv, &err), KVBM_OK);
  f->port = kvbm_metrics_server_port(f->srv);
  assert_true(f->port != 0);
  return f;
}

/* max_per_peer above the table: every test socket comes from 127.0.0.1,
 * and only the table's bound is at play. */
static fixture *start(uint32_t max_conn, double timeout) {
  return start_peer(max_conn, 4096, timeout);
}

static void stop(fixture *f) {
  kvbm_metrics_server_stop(f->srv);
  kvbm_metrics_destroy(f->reg);
  free(f);
}

/* A connection from `from` (any 127.x.y.z is this host's loopback, so
 * each is another client address to the server). */
static int dial_from(uint16_t port, const char *from) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (from) {
    struct sockaddr_in b = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &b.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&b, sizeof b), 0);
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {.tv_sec = 20};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static int dial(uint16_t port) { return dial_from(port, NULL); }

static void send_all(int fd, const char *s) {
  size_t n = strlen(s);
  assert_int_equal(send(fd, s, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads one answer: head and Content-Length bytes of body (none for
 * HEAD). Returns the status, fills head/body (NUL-terminated). */
static int read_answer(int fd, bool head_req, char *head, size_t hcap, char *body, size_t bcap) {
  static char buf[1 << 16];
  static size_t have = 0;
  static int owner = -1;
  if (owner != fd) have = 0, owner = fd;
  char *end;
  while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
    ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
    if (n <= 0) return n == 0 ? 0 : -1;
    have += (size_t)n;
  }
  size_t hl = (size_t)(end + 4 - buf);
  assert_true(hl < hcap);
  memcpy(head, buf, hl);
  head[hl] = 0;
  const char *cl = strcasestr(head, "Content-Length: ");
  assert_non_null(cl);
  size_t blen = strtoul(cl + 16, NULL, 10), want = head_req ? 0 : blen;
  while (have < hl + want) {
    ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
    assert_true(n > 0);
    have += (size_t)n;
  }
  assert_true(want < bcap);
  memcpy(body, buf + hl, want);
  body[want] = 0;
  memmove(buf, buf + hl + want, have - hl - want);
  have -= hl + want;
  return atoi(head + 9);
}

/* The peer closed the connection (reads 0 bytes) */
static bool closed(int fd) {
  char c;
  return recv(fd, &c, 1, 0) == 0;
}

static char head[4096], body[1 << 16];

static void test_scrape(void **state) {
  (void)state;
  fixture *f = start(4, 10);
  int fd = dial(f->port);
  /* keep-alive, and two requests pipelined in one write */
  send_all(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
               "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(head, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  assert_non_null(strstr(head, "Connection: keep-alive"));
  assert_non_null(strstr(body, "# TYPE t_hits_total counter\nt_hits_total 42\n"));
  __atomic_store_n(&f->hits, 43, __ATOMIC_RELAXED); /* read at a later render */
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  /* the server's own counters are on the page */
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"200\"}"));
  assert_non_null(strstr(body, "kvbm_metrics_render_seconds_count"));
  /* HEAD: the length of the page, no body */
  send_all(fd, "HEAD /metrics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(fd, true, head, sizeof head, body, sizeof body), 200);
  /* other paths and methods */
  send_all(fd, "GET /health HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 404);
  send_all(fd, "DELETE /metrics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 405);
  assert_non_null(strstr(head, "Allow: GET, HEAD\r\n"));
  /* the connection is still good; the page counts what it answered */
  send_all(fd, "GET /metrics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(body, "t_hits_total 43\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"200\"} 3\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"404\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"405\"} 1\n"));
  /* HTTP/1.0 without keep-alive: answered, then closed */
  send_all(fd, "GET /metrics HTTP/1.0\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_true(closed(fd)); /* (with "Connection: close" when the FIN came with the requests) */
  close(fd);
  stop(f);
}

static void expect_refusal(uint16_t port, const char *req, int status) {
  int fd = dial(port);
  send_all(fd, req);
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), status);
  assert_non_null(strstr(head, "Connection: close"));
  assert_true(closed(fd));
  close(fd);
}

static void test_hostile_requests(void **state) {
  (void)state;
  fixture *f = start(4, 10);
  expect_refusal(f->port, "GET /metrics HTTP/1.1\nHost: x\n\n", 400);        /* bare LF */
  expect_refusal(f->port, "GET /metrics HTTP/2.0\r\n\r\n", 505);
  expect_refusal(f->port, "GET metrics HTTP/1.1\r\n\r\n", 400);
  expect_refusal(f->port, "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413);
  expect_refusal(f->port, "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501);
  expect_refusal(f->port, "GET /metrics HTTP/1.1\r\nX: \x01\r\n\r\n", 400);
  /* a head over 8 KiB */
  char big[10000];
  int n = snprintf(big, sizeof big, "GET /metrics HTTP/1.1\r\nX: ");
  memset(big + n, 'a', sizeof big - (size_t)n - 1);
  big[sizeof big - 1] = 0;
  int fd = dial(f->port);
  send(fd, big, strlen(big), MSG_NOSIGNAL);
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 431);
  close(fd);
  /* the server still serves */
  fd = dial(f->port);
  send_all(fd, "GET /metrics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  close(fd);
  stop(f);
}

static void test_limits(void **state) {
  (void)state;
  fixture *f = start(2, 0.3);
  /* two connections held open (each sends half a request); the third is
   * answered 503 */
  int a = dial(f->port), b = dial(f->port);
  send_all(a, "GET /metr");
  send_all(b, "GET /metr");
  /* the server took both (a request to a fresh connection proves the
   * accept loop ran past them) */
  int c = dial(f->port);
  assert_int_equal(read_answer(c, false, head, sizeof head, body, sizeof body), 503);
  close(c);
  /* a and b never finish: 408 after io_timeout_s, then closed */
  assert_int_equal(read_answer(a, false, head, sizeof head, body, sizeof body), 408);
  assert_true(closed(a));
  assert_int_equal(read_answer(b, false, head, sizeof head, body, sizeof body), 408);
  close(a);
  close(b);
  /* an idle keep-alive connection goes too, without an answer */
  int d = dial(f->port);
  assert_true(closed(d));
  close(d);
  int e = dial(f->port);
  send_all(e, "GET /metrics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(e, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(body, "kvbm_metrics_http_connections_total{result=\"refused\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"408\"} 2\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_timeouts_total 3\n"));
  close(e);
  stop(f);
}

static void test_config(void **state) {
  (void)state;
  kvbm_metrics_server_config c = kvbm_metrics_server_config_default();
  assert_false(c.enabled);
  assert_int_equal(c.port, 6880);
  assert_string_equal(c.host, "0.0.0.0");
  assert_int_equal(c.max_connections, 16);
  assert_int_equal(c.max_per_peer, 8);
  kvbm_error err = {0};
  const char *on[] = {"DYN_KVBM_METRICS=true", "DYN_KVBM_METRICS_PORT=7001",
                      "KVBM_METRICS_HOST=127.0.0.1", NULL};
  assert_int_equal(kvbm_metrics_server_config_env(&c, on, &err), KVBM_OK);
  assert_true(c.enabled);
  assert_int_equal(c.port, 7001);
  assert_string_equal(c.host, "127.0.0.1");
  const char *off[] = {"DYN_KVBM_METRICS=0", NULL};
  assert_int_equal(kvbm_metrics_server_config_env(&c, off, &err), KVBM_OK);
  assert_false(c.enabled);
  const char *bad1[] = {"DYN_KVBM_METRICS=maybe", NULL};
  const char *bad2[] = {"DYN_KVBM_METRICS_PORT=65536", NULL};
  const char *bad3[] = {"DYN_KVBM_METRICS_PORT=80x", NULL};
  const char *bad4[] = {"KVBM_METRICS_HOST=localhost", NULL};
  const char *bad5[] = {"DYN_KVBM_METRICS_PORT=", NULL};
  c = kvbm_metrics_server_config_default();
  assert_int_equal(kvbm_metrics_server_config_env(&c, bad1, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "DYN_KVBM_METRICS"));
  assert_int_equal(kvbm_metrics_server_config_env(&c, bad2, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "DYN_KVBM_METRICS_PORT"));
  assert_int_equal(kvbm_metrics_server_config_env(&c, bad3, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_metrics_server_config_env(&c, bad4, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "KVBM_METRICS_HOST"));
  assert_int_equal(kvbm_metrics_server_config_env(&c, bad5, &err), KVBM_EINVAL);
  assert_int_equal(c.port, 6880); /* unchanged on refusal */
  /* bad configs and a port in use */
  kvbm_metrics *r;
  kvbm_metrics_create(&r, NULL);
  kvbm_metrics_server *s = NULL, *s2 = NULL;
  c.host = "not-an-address";
  assert_int_equal(kvbm_metrics_server_start(r, &c, &s, &err), KVBM_EINVAL);
  c = kvbm_metrics_server_config_default();
  c.host = "127.0.0.1";
  c.port = 0;
  c.max_connections = 0;
  assert_int_equal(kvbm_metrics_server_start(r, &c, &s, &err), KVBM_EINVAL);
  c.max_connections = 4;
  c.max_per_peer = 0;
  assert_int_equal(kvbm_metrics_server_start(r, &c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "max_per_peer"));
  c.max_per_peer = 8; /* above max_connections: allowed */
  assert_int_equal(kvbm_metrics_server_start(r, &c, &s, &err), KVBM_OK);
  c.port = kvbm_metrics_server_port(s);
  assert_int_equal(kvbm_metrics_server_start(r, &c, &s2, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, "cannot listen on 127.0.0.1"));
  kvbm_metrics_server_stop(s);
  kvbm_metrics_destroy(r);
}

/* Renders from other threads while the server serves (TSan runs this). */
static void *scraper(void *p) {
  fixture *f = p;
  for (int i = 0; i < 20; i++) {
    int fd = dial(f->port);
    send_all(fd, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    char h[4096], *b = malloc(1 << 16);
    size_t have = 0;
    ssize_t n;
    while ((n = recv(fd, b + have, (1 << 16) - 1 - have, 0)) > 0) have += (size_t)n;
    b[have] = 0;
    (void)h;
    assert_non_null(strstr(b, "200 OK"));
    free(b);
    close(fd);
  }
  return NULL;
}

static void test_concurrent(void **state) {
  (void)state;
  fixture *f = start(8, 10);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, scraper, f);
  for (int i = 0; i < 20; i++) {
    char *t;
    assert_int_equal(kvbm_metrics_render(f->reg, &t, NULL, NULL), KVBM_OK);
    kvbm_metrics_text_free(t);
  }
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  stop(f);
}

/* Requests pipelined and then the client's FIN, all in one go: each is
 * answered, then the connection closes (the server closed after the first
 * when it read the FIN with them). */
static void test_pipelined_then_fin(void **state) {
  (void)state;
  fixture *f = start(4, 10);
  int fd = dial(f->port);
  send_all(fd, "GET /metrics HTTP/1.1\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\n"
               "GET /metrics HTTP/1.1\r\n\r\n");
  shutdown(fd, SHUT_WR);
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(body, "\nt_hits_total 42\n"));
  assert_int_equal(read_answer(fd, true, head, sizeof head, body, sizeof body), 200);
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_true(closed(fd)); /* (with "Connection: close" when the FIN came with the requests) */
  close(fd);
  stop(f);
}

/* Waits (20 s at most) until the server holds n connections: those
 * dialled are accepted, in the order dialled. */
static void wait_open(fixture *f, uint64_t n) {
  kvbm__metrics_server_stats st;
  for (int i = 0; i < 20000; i++) {
    kvbm__metrics_server_stats_get(f->srv, &st);
    if (st.connections == n) return;
    usleep(1000);
  }
  fail_msg("the server holds %llu connections, not %llu", (unsigned long long)st.connections,
           (unsigned long long)n);
}

#define GET_METRICS "GET /metrics HTTP/1.1\r\n\r\n"

static int get(int fd) {
  send_all(fd, GET_METRICS);
  return read_answer(fd, false, head, sizeof head, body, sizeof body);
}

/* Issue 24: sockets opened and left idle filled the table, and every other
 * client was answered 503 until io_timeout_s (60 here: waiting them out is
 * no way to pass). Now a newcomer takes the slot of the connection idle
 * longest, which is not the oldest one. */
static void test_idle_sockets_do_not_lock_out(void **state) {
  (void)state;
  fixture *f = start(16, 60);
  int idle[16];
  for (int i = 0; i < 16; i++) idle[i] = dial(f->port);
  wait_open(f, 16);
  assert_int_equal(get(idle[0]), 200); /* idle[0]: now the most recently idle */
  int fd = dial(f->port);
  assert_int_equal(get(fd), 200);
  assert_non_null(strstr(body, "kvbm_metrics_http_idle_closed_total{reason=\"full\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_connections_total{result=\"refused\"} 0\n"));
  assert_true(closed(idle[1])); /* idle longest: accepted first of those never asked */
  assert_int_equal(get(idle[0]), 200);
  for (int i = 2; i < 16; i++) { /* the others are still open: each is answered */
    assert_int_equal(get(idle[i]), 200);
    close(idle[i]);
  }
  close(idle[0]);
  close(idle[1]);
  close(fd);
  stop(f);
}

/* A connection with a request begun is never closed for a newcomer; with
 * none idle the newcomer is answered 503. */
static void test_idle_closed_first(void **state) {
  (void)state;
  fixture *f = start(4, 60);
  int a = dial(f->port), b = dial(f->port);
  send_all(a, "GET /metr");
  send_all(b, "GET /metr");
  int i1 = dial(f->port), i2 = dial(f->port);
  wait_open(f, 4);
  assert_int_equal(get(i2), 200);
  int n1 = dial(f->port); /* i1 is idle longest */
  assert_int_equal(get(n1), 200);
  assert_true(closed(i1));
  int n2 = dial(f->port); /* then i2 (n1 was answered after it) */
  assert_int_equal(get(n2), 200);
  assert_true(closed(i2));
  send_all(n1, "GET /me");
  send_all(n2, "GET /me");
  int r = dial(f->port); /* none idle now */
  assert_int_equal(read_answer(r, false, head, sizeof head, body, sizeof body), 503);
  assert_string_equal(body, "too many connections");
  assert_true(closed(r));
  close(r);
  /* the connections with a request begun were kept: they are answered */
  send_all(n2, "trics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(n2, false, head, sizeof head, body, sizeof body), 200);
  send_all(a, "ics HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(a, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(body, "kvbm_metrics_http_idle_closed_total{reason=\"full\"} 2\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_idle_closed_total{reason=\"peer\"} 0\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_connections_total{result=\"refused\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_responses_total{code=\"503\"} 1\n"));
  close(a);
  close(b);
  close(i1);
  close(i2);
  close(n1);
  close(n2);
  stop(f);
}

/* max_per_peer: one address cannot hold more; over its bound it is its own
 * idle connection that goes, or, none idle, the newcomer gets a 503, while
 * other addresses are served. Each 127.x.y.z is another client address. */
static void test_per_peer_limit(void **state) {
  (void)state;
  fixture *f = start_peer(8, 2, 60);
  int a = dial_from(f->port, "127.0.0.2"), b = dial_from(f->port, "127.0.0.2");
  send_all(a, "GET /metr");
  send_all(b, "GET /metr");
  int c = dial_from(f->port, "127.0.0.2"); /* .2 at its bound, none idle: 503 */
  assert_int_equal(read_answer(c, false, head, sizeof head, body, sizeof body), 503);
  assert_string_equal(body, "too many connections from your address");
  assert_true(closed(c));
  close(c);
  int d = dial_from(f->port, "127.0.0.3"); /* another address: served */
  assert_int_equal(get(d), 200);
  int e = dial_from(f->port, "127.0.0.4"), g = dial_from(f->port, "127.0.0.4");
  wait_open(f, 5);
  assert_int_equal(get(g), 200);
  int h = dial_from(f->port, "127.0.0.4"); /* .4 at its bound: its idle longest (e) goes */
  assert_int_equal(get(h), 200);
  assert_true(closed(e));
  assert_int_equal(get(g), 200);
  assert_int_equal(get(d), 200); /* the table had room: no other address's closed */
  assert_non_null(strstr(body, "kvbm_metrics_http_connections_total{result=\"refused_peer\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_connections_total{result=\"refused\"} 0\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_idle_closed_total{reason=\"peer\"} 1\n"));
  assert_non_null(strstr(body, "kvbm_metrics_http_idle_closed_total{reason=\"full\"} 0\n"));
  kvbm__metrics_server_stats st;
  kvbm__metrics_server_stats_get(f->srv, &st);
  assert_int_equal(st.refused_peer, 1);
  assert_int_equal(st.idle_closed_peer, 1);
  assert_int_equal(st.refused_busy, 0);
  close(a);
  close(b);
  close(d);
  close(e);
  close(g);
  close(h);
  stop(f);
}

/* A daemon's own GET routes on the same server (metrics/server.h). */
static int route(void *user, kvbm_metrics_server *s, const http_req *req, char **b, size_t *len,
                 size_t *cap) {
  (void)s;
  int *calls = user;
  (*calls)++;
  if (!*b) {
    *b = malloc(256);
    *cap = 256;
  }
  *len = (size_t)snprintf(*b, *cap, "{\"path\":\"%s\",\"query\":\"%s\"}", req->path, req->query);
  return strcmp(req->path, "/missing") ? 200 : 404;
}

static void test_routes(void **state) {
  (void)state;
  fixture *f = calloc(1, sizeof *f);
  f->hits = 42;
  int calls = 0;
  assert_int_equal(kvbm_metrics_create(&f->reg, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(f->reg, collect, &f->hits, NULL, 0, NULL, NULL), KVBM_OK);
  kvbm_metrics_server_config c = kvbm_metrics_server_config_default();
  c.host = "127.0.0.1";
  c.port = 0;
  c.max_connections = 1;
  kvbm__metrics_routes r = {.fn = route, .user = &calls, .content_type = "application/json",
                            .json_errors = true};
  assert_int_equal(kvbm__metrics_server_start_routes(f->reg, &c, &r, &f->srv, NULL), KVBM_OK);
  f->port = kvbm_metrics_server_port(f->srv);
  int fd = dial(f->port);
  send_all(fd, "GET /hints?x=1 HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n"
               "GET /missing HTTP/1.1\r\n\r\nPOST /hints HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(head, "Content-Type: application/json\r\n"));
  assert_string_equal(body, "{\"path\":\"/hints\",\"query\":\"x=1\"}");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 200);
  assert_non_null(strstr(head, "version=0.0.4"));
  assert_non_null(strstr(body, "\nt_hits_total 42\n"));
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 404);
  assert_string_equal(body, "{\"path\":\"/missing\",\"query\":\"\"}");
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 405);
  assert_non_null(strstr(body, "\"status\":405}"));
  assert_int_equal(calls, 2); /* not for /metrics, not for the POST */
  /* max_connections 1 and fd has a request begun (so it is not idle, and
   * not closed for the newcomer): JSON 503 */
  send_all(fd, "GET /hin");
  int busy = dial(f->port);
  assert_int_equal(read_answer(busy, false, head, sizeof head, body, sizeof body), 503);
  assert_string_equal(body, "{\"error\":\"too many connections\",\"status\":503}");
  close(busy);
  send_all(fd, "ts HTTP/1.1\nHost: x\n\n"); /* bare LF: 400, JSON, closed */
  assert_int_equal(read_answer(fd, false, head, sizeof head, body, sizeof body), 400);
  assert_non_null(strstr(body, "\"status\":400}"));
  assert_true(closed(fd));
  close(fd);
  kvbm__metrics_server_stats st;
  kvbm__metrics_server_stats_get(f->srv, &st);
  assert_int_equal(st.requests, 4); /* the bad head is no request */
  assert_int_equal(st.answered, 2);
  assert_int_equal(st.bad_requests, 4); /* 404, 405, 503, 400 */
  assert_int_equal(st.refused_busy, 1);
  assert_int_equal(st.accepted, 1);
  stop(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scrape),
      cmocka_unit_test(test_hostile_requests),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_pipelined_then_fin),
      cmocka_unit_test(test_routes),
      cmocka_unit_test(test_idle_sockets_do_not_lock_out),
      cmocka_unit_test(test_idle_closed_first),
      cmocka_unit_test(test_per_peer_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
