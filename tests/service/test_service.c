/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_service.c: the HTTP service layer (src/service/service.h) over real
 * loopback sockets, with routes of the test's own: GET and POST routes
 * with their own body limits (413 past a route's, 411 without a length),
 * 404 and 405 with Allow, HEAD without a body, pipelined requests
 * answered in order, a slowloris head cut by the deadline from its first
 * byte (408), a client that never reads its answers (bounded output, then
 * closed at the write deadline), an idle keep-alive connection closed,
 * full-table admission (an idle connection makes room; 503 when none is
 * idle), fairness between a pipelining client and a single request, the
 * caller's-thread loop with its tick, and the configuration checks.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "service/service.h"

#define BIG_ANSWER (256 * 1024)

typedef struct fixture {
  kvbm__service *svc;
  uint16_t port;
  _Atomic uint64_t seq;   /* requests the /seq route answered */
  _Atomic uint64_t ticks; /* tick calls */
  char *big;              /* the /big route's answer */
} fixture;

/* GET /seq: the request's number, so that order is checked. */
static void seq_route(void *user, kvbm__service *svc, const kvbm__service_req *q,
                      kvbm__service_answer *a) {
  (void)svc;
  fixture *f = user;
  kvbm__service_buf_printf(a->scratch, "%llu %s", (unsigned long long)atomic_fetch_add(&f->seq, 1),
                           q->head->query);
  a->content_type = "text/plain";
}

/* POST /small, /large: echoes the body's length and first byte. */
static void echo_route(void *user, kvbm__service *svc, const kvbm__service_req *q,
                       kvbm__service_answer *a) {
  (void)svc;
  (void)user;
  kvbm__service_buf_printf(a->scratch, "{\"len\":%zu,\"first\":%d}", q->body_len,
                           q->body_len ? q->body[0] : -1);
  a->status = 201;
  a->headers = "X-Echo: yes\r\n";
}

/* GET /big: a large answer (a client that never reads it). */
static void big_route(void *user, kvbm__service *svc, const kvbm__service_req *q,
                      kvbm__service_answer *a) {
  (void)svc;
  (void)q;
  fixture *f = user;
  a->body = f->big;
  a->body_len = BIG_ANSWER;
}

static void tick(void *user, int64_t now) {
  (void)now;
  atomic_fetch_add(&((fixture *)user)->ticks, 1);
}

static kvbm__service_config config(fixture *f, kvbm__service_route *r, uint32_t max_conn,
                                   double timeout) {
  r[0] = (kvbm__service_route){.path = "/seq", .methods = KVBM__SVC_GET | KVBM__SVC_HEAD,
                               .method_msg = "use GET /seq", .fn = seq_route, .user = f};
  r[1] = (kvbm__service_route){.path = "/small", .methods = KVBM__SVC_POST, .max_body = 16,
                               .fn = echo_route, .user = f};
  r[2] = (kvbm__service_route){.path = "/large", .methods = KVBM__SVC_POST | KVBM__SVC_PUT,
                               .max_body = 4096, .fn = echo_route, .user = f};
  r[3] = (kvbm__service_route){.path = "/big", .methods = KVBM__SVC_GET, .fn = big_route,
                               .user = f};
  return (kvbm__service_config){.name = "svc-test", .host = "127.0.0.1", .port = 0,
                                .max_connections = max_conn, .max_per_peer = 4096, /* the table's bound only */
                                .sndbuf = 64 * 1024,
                                .io_timeout_s = timeout, .json_errors = true,
                                .not_found = "no such path here", .routes = r, .nroutes = 4,
                                .tick = tick, .tick_user = f, .tick_ms = 50};
}

static fixture *start(uint32_t max_conn, double timeout) {
  fixture *f = calloc(1, sizeof *f);
  f->big = malloc(BIG_ANSWER);
  memset(f->big, 'b', BIG_ANSWER);
  kvbm__service_route r[4];
  kvbm__service_config c = config(f, r, max_conn, timeout);
  kvbm_error err = {0};
  assert_int_equal(kvbm__service_create(&c, &f->svc, &err), KVBM_OK);
  assert_int_equal(kvbm__service_start(f->svc, &err), KVBM_OK);
  f->port = kvbm__service_port(f->svc);
  assert_true(f->port != 0);
  return f;
}

static void stop(fixture *f) {
  kvbm__service_stop(f->svc);
  kvbm__service_destroy(f->svc);
  free(f->big);
  free(f);
}

static int dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {.tv_sec = 20};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void send_all(int fd, const char *s, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(fd, s + off, n - off, MSG_NOSIGNAL);
    assert_true(w > 0);
    off += (size_t)w;
  }
}

static void send_str(int fd, const char *s) { send_all(fd, s, strlen(s)); }

/* One answer per call (per fd: a buffer of its own for pipelined bytes). */
typedef struct reader {
  int fd;
  char buf[1 << 19];
  size_t have;
} reader;

static char head[4096], body[1 << 19];

static int read_answer(reader *r, bool head_req) {
  char *end;
  while (!(end = memmem(r->buf, r->have, "\r\n\r\n", 4))) {
    ssize_t n = recv(r->fd, r->buf + r->have, sizeof r->buf - r->have, 0);
    if (n <= 0) return n == 0 ? 0 : -1;
    r->have += (size_t)n;
  }
  size_t hl = (size_t)(end + 4 - r->buf);
  assert_true(hl < sizeof head);
  memcpy(head, r->buf, hl);
  head[hl] = 0;
  if (!strncmp(head, "HTTP/1.1 100 ", 13)) { /* an interim answer: no body */
    memmove(r->buf, r->buf + hl, r->have - hl);
    r->have -= hl;
    return 100;
  }
  const char *cl = strcasestr(head, "Content-Length: ");
  assert_non_null(cl);
  size_t want = head_req ? 0 : strtoul(cl + 16, NULL, 10);
  assert_true(hl + want <= sizeof r->buf && want < sizeof body);
  while (r->have < hl + want) {
    ssize_t n = recv(r->fd, r->buf + r->have, sizeof r->buf - r->have, 0);
    assert_true(n > 0);
    r->have += (size_t)n;
  }
  memcpy(body, r->buf + hl, want);
  body[want] = 0;
  memmove(r->buf, r->buf + hl + want, r->have - hl - want);
  r->have -= hl + want;
  return atoi(head + 9);
}

static reader *reader_new(int fd) {
  reader *r = calloc(1, sizeof *r);
  r->fd = fd;
  return r;
}

/* The peer closed the connection (reads 0 bytes, or a reset). */
static bool closed(int fd) {
  char c[4096];
  for (;;) {
    ssize_t n = recv(fd, c, sizeof c, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false; /* the receive timeout */
  }
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

/* ------------------------------------------------------------- tests */

static void test_routes(void **state) {
  (void)state;
  fixture *f = start(8, 10);
  int fd = dial(f->port);
  reader *r = reader_new(fd);
  send_str(fd, "GET /seq?a=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_int_equal(read_answer(r, false), 200);
  assert_string_equal(body, "0 a=1");
  assert_non_null(strstr(head, "Content-Type: text/plain\r\n"));
  assert_non_null(strstr(head, "Connection: keep-alive\r\n"));
  /* HEAD: the GET answer's length, no body */
  send_str(fd, "HEAD /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(r, true), 200);
  assert_non_null(strstr(head, "Content-Length: 2\r\n")); /* "1 " */
  /* a POST within the route's limit: the handler's status, headers, body */
  send_str(fd, "POST /small HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  assert_int_equal(read_answer(r, false), 201);
  assert_string_equal(body, "{\"len\":5,\"first\":104}");
  assert_non_null(strstr(head, "X-Echo: yes\r\n"));
  assert_non_null(strstr(head, "Content-Type: application/json\r\n"));
  /* PUT on a route that takes it */
  send_str(fd, "PUT /large HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  assert_int_equal(read_answer(r, false), 201);
  /* unknown path: 404 with the configured text; the connection stays */
  send_str(fd, "GET /nope HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(r, false), 404);
  assert_string_equal(body, "{\"error\":\"no such path here\",\"status\":404}");
  /* wrong method: 405, Allow lists the route's methods, the route's text */
  send_str(fd, "POST /seq HTTP/1.1\r\nContent-Length: 2\r\n\r\nxy");
  assert_int_equal(read_answer(r, false), 405);
  assert_non_null(strstr(head, "Allow: GET, HEAD\r\n"));
  assert_non_null(strstr(body, "use GET /seq"));
  send_str(fd, "PATCH /large HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  assert_int_equal(read_answer(r, false), 405);
  assert_non_null(strstr(head, "Allow: POST, PUT\r\n"));
  /* still served after the errors (the bodies were read, in step) */
  send_str(fd, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(r, false), 200);
  assert_string_equal(body, "2 ");
  /* HTTP/1.0 without keep-alive: answered, then closed */
  send_str(fd, "GET /seq HTTP/1.0\r\n\r\n");
  assert_int_equal(read_answer(r, false), 200);
  assert_non_null(strstr(head, "Connection: close\r\n"));
  assert_true(closed(fd));
  close(fd);
  free(r);
  /* answers by code */
  assert_int_equal(kvbm__service_answers(f->svc, 200), 4);
  assert_int_equal(kvbm__service_answers(f->svc, 201), 2);
  assert_int_equal(kvbm__service_answers(f->svc, 404), 1);
  assert_int_equal(kvbm__service_answers(f->svc, 405), 2);
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.requests, 9);
  assert_int_equal(st.answered, 6);
  assert_int_equal(st.bad_requests, 3);
  assert_int_equal(st.errors_4xx, 3);
  stop(f);
}

/* Refused heads and bodies: answered, then the connection closes. */
static void expect_refusal(uint16_t port, const char *req, int status) {
  int fd = dial(port);
  reader *r = reader_new(fd);
  send_str(fd, req);
  assert_int_equal(read_answer(r, false), status);
  assert_non_null(strstr(head, "Connection: close"));
  assert_true(closed(fd));
  close(fd);
  free(r);
}

static void test_limits(void **state) {
  (void)state;
  fixture *f = start(8, 10);
  /* over the route's own limit (16), within the largest route's (4096) */
  expect_refusal(f->port, "POST /small HTTP/1.1\r\nContent-Length: 17\r\n\r\n", 413);
  /* over every route's */
  expect_refusal(f->port, "POST /large HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413);
  expect_refusal(f->port, "POST /small HTTP/1.1\r\n\r\n", 411);
  expect_refusal(f->port, "GET /seq HTTP/1.1\nHost: x\n\n", 400);
  expect_refusal(f->port, "GET /seq HTTP/2.0\r\n\r\n", 505);
  expect_refusal(f->port, "POST /large HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501);
  /* a head over max_head (8 KiB by default) */
  char big[10000];
  int n = snprintf(big, sizeof big, "GET /seq HTTP/1.1\r\nX: ");
  memset(big + n, 'a', sizeof big - (size_t)n - 1);
  big[sizeof big - 1] = 0;
  int fd = dial(f->port);
  reader *r = reader_new(fd);
  send(fd, big, strlen(big), MSG_NOSIGNAL);
  assert_int_equal(read_answer(r, false), 431);
  close(fd);
  free(r);
  /* Expect: 100-continue: the interim answer, then the route's */
  fd = dial(f->port);
  r = reader_new(fd);
  send_str(fd, "POST /large HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  assert_int_equal(read_answer(r, false), 100);
  send_str(fd, "abcd");
  assert_int_equal(read_answer(r, false), 201);
  assert_string_equal(body, "{\"len\":4,\"first\":97}");
  close(fd);
  free(r);
  assert_int_equal(kvbm__service_answers(f->svc, 413), 2);
  stop(f);
}

static void test_pipelined(void **state) {
  (void)state;
  fixture *f = start(8, 10);
  int fd = dial(f->port);
  reader *r = reader_new(fd);
  /* 50 requests in one write, a POST with a body among them */
  char req[8192];
  size_t n = 0;
  for (int i = 0; i < 50; i++)
    n += (size_t)snprintf(req + n, sizeof req - n,
                          i == 25 ? "POST /small HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz"
                                  : "GET /seq?i=%d HTTP/1.1\r\n\r\n",
                          i);
  send_all(fd, req, n);
  int seq = 0;
  for (int i = 0; i < 50; i++) {
    int status = read_answer(r, false);
    if (i == 25) {
      assert_int_equal(status, 201);
      assert_string_equal(body, "{\"len\":3,\"first\":120}");
      continue;
    }
    assert_int_equal(status, 200);
    char want[32];
    snprintf(want, sizeof want, "%d i=%d", seq++, i);
    assert_string_equal(body, want); /* in order */
  }
  /* requests pipelined before the client's FIN are answered, then close */
  send_str(fd, "GET /seq HTTP/1.1\r\n\r\nGET /seq HTTP/1.1\r\n\r\n");
  shutdown(fd, SHUT_WR);
  assert_int_equal(read_answer(r, false), 200);
  assert_int_equal(read_answer(r, false), 200);
  /* (with "Connection: close" when the FIN was read with the requests) */
  assert_true(closed(fd));
  close(fd);
  free(r);
  stop(f);
}

/* A head sent a byte at a time never completes: 408 at io_timeout_s from
 * its first byte, however often bytes come. An idle keep-alive connection
 * is closed without an answer. */
static void test_slowloris(void **state) {
  (void)state;
  fixture *f = start(8, 0.3);
  int fd = dial(f->port);
  reader *r = reader_new(fd);
  const char *drip = "GET /seq HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; drip[i] && kvbm_clock_seconds() - t0 < 3; i++) {
    if (send(fd, drip + i, 1, MSG_NOSIGNAL) != 1) break; /* closed */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) > 0) break; /* the answer came */
  }
  assert_int_equal(read_answer(r, false), 408);
  double dt = kvbm_clock_seconds() - t0;
  assert_true(dt >= 0.25 && dt < 2.0);
  assert_true(closed(fd));
  close(fd);
  free(r);
  /* idle keep-alive: one answer, then nothing: closed, no answer */
  fd = dial(f->port);
  r = reader_new(fd);
  send_str(fd, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(r, false), 200);
  assert_true(closed(fd));
  assert_int_equal(r->have, 0);
  close(fd);
  free(r);
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.read_timeouts, 1);
  assert_true(st.idle_timeouts >= 1);
  stop(f);
}

/* A client that pipelines requests for large answers and never reads:
 * the server's output for it stays within OUT_SOFT plus one answer, its
 * input is not read ahead without bound, and at io_timeout_s after the
 * answers were queued the connection goes. Others are served meanwhile. */
static void test_never_reads(void **state) {
  (void)state;
  fixture *f = start(8, 0.5);
  int fd = dial(f->port);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  static char req[64 * 1024];
  size_t n = 0;
  while (n + 32 < sizeof req) n += (size_t)snprintf(req + n, sizeof req - n, "GET /big HTTP/1.1\r\n\r\n");
  /* 2800 requests for 256 KiB each: 700 MiB if the server answered all */
  struct timeval tv = {.tv_sec = 1};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ssize_t w = send(fd, req, n, MSG_NOSIGNAL);
  assert_true(w > 0);
  /* another client is served meanwhile */
  int g = dial(f->port);
  reader *rg = reader_new(g);
  send_str(g, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rg, false), 200);
  close(g);
  free(rg);
  /* the write deadline closes it */
  double t0 = kvbm_clock_seconds();
  kvbm__service_stats st;
  do {
    sleep_ms(50);
    kvbm__service_stats_get(f->svc, &st);
  } while (!st.write_timeouts && kvbm_clock_seconds() - t0 < 5);
  assert_int_equal(st.write_timeouts, 1);
  assert_true(st.out_peak <= KVBM__SERVICE_OUT_SOFT + BIG_ANSWER + 512);
  assert_true(kvbm__service_answers(f->svc, 200) < 40); /* not 2800 */
  close(fd);
  stop(f);
}

/* Full table: an idle connection makes room for a newcomer; with none
 * idle (each has half a request) the newcomer gets 503. */
static void test_admission(void **state) {
  (void)state;
  fixture *f = start(2, 2);
  int a = dial(f->port), b = dial(f->port);
  reader *ra = reader_new(a), *rb = reader_new(b);
  send_str(a, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(ra, false), 200);
  send_str(b, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rb, false), 200);
  /* both idle: a newcomer closes the one idle longest (a) */
  int c = dial(f->port);
  reader *rc = reader_new(c);
  send_str(c, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rc, false), 200);
  assert_true(closed(a));
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.idle_closed_full, 1);
  /* b and c each begin a request: no one is idle, the next gets 503 */
  send_str(b, "GET /se");
  send_str(c, "GET /se");
  sleep_ms(100); /* read by the server */
  int d = dial(f->port);
  reader *rd = reader_new(d);
  assert_int_equal(read_answer(rd, false), 503);
  assert_string_equal(body, "{\"error\":\"too many connections\",\"status\":503}");
  assert_true(closed(d));
  /* b and c still finish their requests */
  send_str(b, "q HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rb, false), 200);
  send_str(c, "q HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rc, false), 200);
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.refused_busy, 1);
  assert_int_equal(kvbm__service_answers(f->svc, 503), 1);
  assert_int_equal(st.errors_5xx, 0); /* the 503 of admission is not a queued answer */
  close(a), close(b), close(c), close(d);
  free(ra), free(rb), free(rc), free(rd);
  stop(f);
}

/* A client pipelining many requests does not go ahead of another: the
 * single request is answered while the pipeline still has requests
 * waiting (its turns are cut, counted). */
static void test_fairness(void **state) {
  (void)state;
  fixture *f = start(8, 10);
  int p = dial(f->port);
  static char req[60 * 1024];
  size_t n = 0;
  int count = 0;
  while (n + 32 < sizeof req) {
    n += (size_t)snprintf(req + n, sizeof req - n, "GET /seq?p HTTP/1.1\r\n\r\n");
    count++;
  }
  send_all(p, req, n);
  int q = dial(f->port);
  reader *rq = reader_new(q);
  send_str(q, "GET /seq?q HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rq, false), 200);
  unsigned long when = strtoul(body, NULL, 10);
  /* the pipeline's answers, all in order */
  reader *rp = reader_new(p);
  for (int i = 0; i < count; i++) assert_int_equal(read_answer(rp, false), 200);
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_true(st.turns_cut > 0);
  assert_true(when < (unsigned long)count / 2); /* not after the whole pipeline */
  close(p), close(q);
  free(rp), free(rq);
  stop(f);
}

/* The loop on the caller's thread (as the router runs it): the tick runs,
 * stop from another thread returns run. */
typedef struct runner {
  kvbm__service *svc;
  int rc;
} runner;

static void *run_main(void *arg) {
  runner *r = arg;
  r->rc = kvbm__service_run(r->svc, NULL);
  return NULL;
}

static void test_caller_thread(void **state) {
  (void)state;
  fixture *f = calloc(1, sizeof *f);
  kvbm__service_route rt[4];
  kvbm__service_config c = config(f, rt, 4, 10);
  assert_int_equal(kvbm__service_create(&c, &f->svc, NULL), KVBM_OK);
  runner r = {.svc = f->svc, .rc = -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, run_main, &r), 0);
  int fd = dial(kvbm__service_port(f->svc));
  reader *rd = reader_new(fd);
  send_str(fd, "GET /seq HTTP/1.1\r\n\r\n");
  assert_int_equal(read_answer(rd, false), 200);
  sleep_ms(200);
  assert_true(atomic_load(&f->ticks) >= 2); /* every tick_ms (50) at least */
  kvbm__service_stop(f->svc);
  pthread_join(th, NULL);
  assert_int_equal(r.rc, KVBM_OK);
  close(fd);
  free(rd);
  kvbm__service_destroy(f->svc);
  free(f);
}

static void test_config(void **state) {
  (void)state;
  fixture f = {0};
  kvbm__service_route r[4];
  kvbm__service *s = NULL;
  kvbm_error err = {0};
  kvbm__service_config c = config(&f, r, 4, 10);
  c.max_connections = 0;
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "svc-test: max_connections 0"));
  c = config(&f, r, 4, 0);
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "io_timeout_s"));
  c = config(&f, r, 4, 10);
  c.nroutes = 0;
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  c = config(&f, r, 4, 10);
  r[1].fn = NULL;
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "/small"));
  c = config(&f, r, 4, 10);
  r[0].path = "seq";
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  c = config(&f, r, 4, 10);
  c.host = "localhost";
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "not an IPv4 address"));
  assert_null(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_routes),      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_pipelined),   cmocka_unit_test(test_slowloris),
      cmocka_unit_test(test_never_reads), cmocka_unit_test(test_admission),
      cmocka_unit_test(test_fairness),    cmocka_unit_test(test_caller_thread),
      cmocka_unit_test(test_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
