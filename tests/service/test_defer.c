/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_defer.c: the service layer's deferred answers (service.h,
 * kvbm__service_defer / kvbm__service_complete) over loopback sockets.
 * A handler parks its request and the test answers it from its own
 * thread: the answer arrives, pipelined requests behind it are answered
 * after it (in order), other connections are served meanwhile, a client
 * that closes while parked frees the request (the route's `gone` is told
 * and the late answer is dropped, counted), an answer that never comes
 * gets 504 at defer_timeout_s, max_deferred bounds the parked requests,
 * and kvbm__service_complete refuses bad arguments.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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

#include "service/service.h"

#define MAX_TICKETS 64

typedef struct fixture {
  kvbm__service *svc;
  uint16_t port;
  pthread_mutex_t mu;
  uint64_t tickets[MAX_TICKETS]; /* parked, in order */
  size_t ntickets;
  _Atomic uint64_t gone, last_gone, refused;
} fixture;

/* POST /later: parked; the test answers it. Over max_deferred: 503 now. */
static void later_route(void *user, kvbm__service *svc, const kvbm__service_req *q,
                        kvbm__service_answer *a) {
  (void)q;
  fixture *f = user;
  uint64_t t = kvbm__service_defer(svc, a);
  if (!t) {
    atomic_fetch_add(&f->refused, 1);
    a->status = 503;
    kvbm__service_buf_printf(a->scratch, "{\"error\":\"busy\"}");
    return;
  }
  assert_int_equal(a->ticket, t);
  pthread_mutex_lock(&f->mu);
  if (f->ntickets < MAX_TICKETS) f->tickets[f->ntickets++] = t;
  pthread_mutex_unlock(&f->mu);
}

static void later_gone(void *user, uint64_t ticket) {
  fixture *f = user;
  atomic_store(&f->last_gone, ticket);
  atomic_fetch_add(&f->gone, 1);
}

/* GET /now: answered inline. */
static void now_route(void *user, kvbm__service *svc, const kvbm__service_req *q,
                      kvbm__service_answer *a) {
  (void)user;
  (void)svc;
  (void)q;
  kvbm__service_buf_printf(a->scratch, "now");
}

static fixture *start(double defer_s, uint32_t max_deferred) {
  fixture *f = calloc(1, sizeof *f);
  pthread_mutex_init(&f->mu, NULL);
  kvbm__service_route r[2] = {
      {.path = "/later", .methods = KVBM__SVC_POST, .max_body = 64, .fn = later_route,
       .user = f, .gone = later_gone},
      {.path = "/now", .methods = KVBM__SVC_GET, .fn = now_route, .user = f},
  };
  kvbm__service_config c = {.name = "defer-test", .host = "127.0.0.1", .max_connections = 64,
                            .max_per_peer = 64, .io_timeout_s = 10, .json_errors = true,
                            .routes = r, .nroutes = 2, .defer_timeout_s = defer_s,
                            .max_deferred = max_deferred, .tick_ms = 20};
  kvbm_error err = {0};
  assert_int_equal(kvbm__service_create(&c, &f->svc, &err), KVBM_OK);
  assert_int_equal(kvbm__service_start(f->svc, &err), KVBM_OK);
  f->port = kvbm__service_port(f->svc);
  return f;
}

static void stop(fixture *f) {
  kvbm__service_stop(f->svc);
  kvbm__service_destroy(f->svc);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

static int dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void send_str(int fd, const char *s) {
  size_t n = strlen(s), off = 0;
  while (off < n) {
    ssize_t w = send(fd, s + off, n - off, MSG_NOSIGNAL);
    assert_true(w > 0);
    off += (size_t)w;
  }
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

/* Reads one answer (head and Content-Length body); returns its status, 0
 * on EOF, -1 on a timeout. The body goes to out (NUL-terminated). */
typedef struct reader {
  int fd;
  char buf[8192];
  size_t have;
} reader;

static int read_answer(reader *r, char *out, size_t cap) {
  char *end;
  while (!(end = memmem(r->buf, r->have, "\r\n\r\n", 4))) {
    ssize_t n = recv(r->fd, r->buf + r->have, sizeof r->buf - r->have, 0);
    if (n <= 0) return n == 0 ? 0 : -1;
    r->have += (size_t)n;
  }
  size_t hl = (size_t)(end + 4 - r->buf);
  r->buf[hl - 1] = 0;
  const char *cl = strcasestr(r->buf, "Content-Length: ");
  assert_non_null(cl);
  size_t want = strtoul(cl + 16, NULL, 10);
  int status = atoi(r->buf + 9);
  assert_true(hl + want <= sizeof r->buf && want < cap);
  while (r->have < hl + want) {
    ssize_t n = recv(r->fd, r->buf + r->have, sizeof r->buf - r->have, 0);
    assert_true(n > 0);
    r->have += (size_t)n;
  }
  memcpy(out, r->buf + hl, want);
  out[want] = 0;
  memmove(r->buf, r->buf + hl + want, r->have - hl - want);
  r->have -= hl + want;
  return status;
}

/* Waits (bounded) until the fixture holds n parked tickets. */
static uint64_t wait_ticket(fixture *f, size_t n) {
  for (int i = 0; i < 500; i++) {
    pthread_mutex_lock(&f->mu);
    uint64_t t = f->ntickets >= n ? f->tickets[n - 1] : 0;
    pthread_mutex_unlock(&f->mu);
    if (t) return t;
    sleep_ms(10);
  }
  fail_msg("no request parked");
  return 0;
}

static const char later_req[] =
    "POST /later HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";

/* Answered from another thread; the request pipelined behind it comes
 * after it; another connection is served while it is parked. */
static void test_answer_in_order(void **state) {
  (void)state;
  fixture *f = start(0, 0);
  int fd = dial(f->port);
  reader *r = calloc(1, sizeof *r);
  r->fd = fd;
  char out[512];
  send_str(fd, later_req);
  send_str(fd, "GET /now HTTP/1.1\r\nHost: x\r\n\r\n");
  uint64_t t = wait_ticket(f, 1);
  /* nothing is answered while parked, the pipelined GET included */
  struct timeval tv = {.tv_usec = 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  assert_int_equal(read_answer(r, out, sizeof out), -1);
  tv.tv_sec = 10;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  /* another client is served meanwhile */
  reader *r2 = calloc(1, sizeof *r2);
  r2->fd = dial(f->port);
  send_str(r2->fd, "GET /now HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_int_equal(read_answer(r2, out, sizeof out), 200);
  assert_string_equal(out, "now");
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.deferred_now, 1);
  /* the answer, then the pipelined one */
  assert_int_equal(kvbm__service_complete(f->svc, t, 202, "{\"done\":1}", 10, false), KVBM_OK);
  assert_int_equal(read_answer(r, out, sizeof out), 202);
  assert_string_equal(out, "{\"done\":1}");
  assert_int_equal(read_answer(r, out, sizeof out), 200);
  assert_string_equal(out, "now");
  /* the connection stays usable: a second deferral on it */
  send_str(fd, later_req);
  uint64_t t2 = wait_ticket(f, 2);
  assert_true(t2 != t);
  assert_int_equal(kvbm__service_complete(f->svc, t2, 200, "x", 1, false), KVBM_OK);
  assert_int_equal(read_answer(r, out, sizeof out), 200);
  assert_string_equal(out, "x");
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.deferred, 2);
  assert_int_equal(st.deferred_answered, 2);
  assert_int_equal(st.deferred_now, 0);
  assert_int_equal(st.deferred_dropped, 0);
  assert_int_equal(atomic_load(&f->gone), 0);
  close(fd);
  close(r2->fd);
  free(r);
  free(r2);
  stop(f);
}

/* A client that closes while parked: freed, `gone` told, its late answer
 * dropped and counted. */
static void test_client_goes(void **state) {
  (void)state;
  fixture *f = start(0, 0);
  int fd = dial(f->port);
  send_str(fd, later_req);
  uint64_t t = wait_ticket(f, 1);
  close(fd);
  for (int i = 0; i < 500 && !atomic_load(&f->gone); i++) sleep_ms(10);
  assert_int_equal(atomic_load(&f->gone), 1);
  assert_int_equal(atomic_load(&f->last_gone), t);
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.deferred_gone, 1);
  assert_int_equal(st.deferred_now, 0);
  assert_int_equal(st.connections, 0);
  assert_int_equal(kvbm__service_complete(f->svc, t, 200, "late", 4, false), KVBM_OK);
  for (int i = 0; i < 500; i++) {
    kvbm__service_stats_get(f->svc, &st);
    if (st.deferred_dropped) break;
    sleep_ms(10);
  }
  assert_int_equal(st.deferred_dropped, 1);
  assert_int_equal(st.deferred_answered, 0);
  stop(f);
}

/* No answer within defer_timeout_s: 504, the connection closes. */
static void test_deadline(void **state) {
  (void)state;
  fixture *f = start(0.3, 0);
  int fd = dial(f->port);
  reader *r = calloc(1, sizeof *r);
  r->fd = fd;
  char out[512];
  send_str(fd, later_req);
  uint64_t t = wait_ticket(f, 1);
  assert_int_equal(read_answer(r, out, sizeof out), 504);
  assert_non_null(strstr(out, "\"status\":504"));
  assert_int_equal(read_answer(r, out, sizeof out), 0); /* closed */
  assert_int_equal(atomic_load(&f->gone), 1);
  assert_int_equal(atomic_load(&f->last_gone), t);
  kvbm__service_stats st;
  kvbm__service_stats_get(f->svc, &st);
  assert_int_equal(st.deferred_timeouts, 1);
  assert_int_equal(kvbm__service_answers(f->svc, 504), 1);
  close(fd);
  free(r);
  stop(f);
}

/* max_deferred parked at once; the next one is answered now (503). */
static void test_bound(void **state) {
  (void)state;
  fixture *f = start(0, 2);
  int fds[3];
  for (int i = 0; i < 2; i++) {
    fds[i] = dial(f->port);
    send_str(fds[i], later_req);
    wait_ticket(f, (size_t)i + 1);
  }
  reader *r = calloc(1, sizeof *r);
  r->fd = fds[2] = dial(f->port);
  char out[512];
  send_str(fds[2], later_req);
  assert_int_equal(read_answer(r, out, sizeof out), 503);
  assert_int_equal(atomic_load(&f->refused), 1);
  /* one answered: room for the next */
  assert_int_equal(kvbm__service_complete(f->svc, f->tickets[0], 200, "a", 1, false), KVBM_OK);
  reader *r0 = calloc(1, sizeof *r0);
  r0->fd = fds[0];
  assert_int_equal(read_answer(r0, out, sizeof out), 200);
  send_str(fds[2], later_req);
  wait_ticket(f, 3);
  for (int i = 0; i < 3; i++) close(fds[i]);
  free(r);
  free(r0);
  stop(f);
}

static void test_bad_calls(void **state) {
  (void)state;
  fixture *f = start(0, 0);
  assert_int_equal(kvbm__service_complete(f->svc, 0, 200, "x", 1, false), KVBM_EINVAL);
  assert_int_equal(kvbm__service_complete(f->svc, 5, 99, "x", 1, false), KVBM_EINVAL);
  assert_int_equal(kvbm__service_complete(f->svc, 5, 600, "x", 1, false), KVBM_EINVAL);
  assert_int_equal(kvbm__service_complete(f->svc, 5, 200, NULL, 3, false), KVBM_EINVAL);
  assert_int_equal(kvbm__service_complete(NULL, 5, 200, "x", 1, false), KVBM_EINVAL);
  /* outside a handler: no deferral */
  kvbm__service_answer a = {0};
  assert_int_equal(kvbm__service_defer(f->svc, &a), 0);
  /* an unknown ticket is dropped, counted */
  assert_int_equal(kvbm__service_complete(f->svc, 12345, 200, "x", 1, false), KVBM_OK);
  kvbm__service_stats st;
  for (int i = 0; i < 500; i++) {
    kvbm__service_stats_get(f->svc, &st);
    if (st.deferred_dropped) break;
    sleep_ms(10);
  }
  assert_int_equal(st.deferred_dropped, 1);
  stop(f);
  /* a bad deadline is refused at create */
  kvbm__service_route rt = {.path = "/now", .methods = KVBM__SVC_GET, .fn = now_route};
  kvbm__service_config c = {.name = "bad", .host = "127.0.0.1", .max_connections = 4,
                            .max_per_peer = 4, .io_timeout_s = 1, .routes = &rt, .nroutes = 1,
                            .defer_timeout_s = -1};
  kvbm__service *s = NULL;
  kvbm_error err = {0};
  assert_int_equal(kvbm__service_create(&c, &s, &err), KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "defer_timeout_s"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_answer_in_order), cmocka_unit_test(test_client_goes),
      cmocka_unit_test(test_deadline),        cmocka_unit_test(test_bound),
      cmocka_unit_test(test_bad_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
