/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_admission.c: who gets a connection slot on the router daemon
 * (issue 24), in-process over loopback sockets: a table full of idle
 * connections does not lock a newcomer out (the one idle longest goes),
 * a connection whose answers were taken but whose next pipelined request
 * is half read is not idle (so a table of those refuses the newcomer
 * with 503), and max_per_peer is checked at create. guards_e2e.py plays
 * the same through `kvbm router` (and the per-address bound with several
 * loopback addresses).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/router.h"

#define SLOTS 4
#define WAIT_S 20 /* generous: a receive that would wait longer has failed */

typedef struct run {
  kvbm_router_daemon *d;
  pthread_t th;
  uint16_t port;
} run;

static void *serve(void *arg) {
  run *r = arg;
  kvbm_error err = {0};
  assert_int_equal(kvbm_router_daemon_run(r->d, &err), KVBM_OK);
  return NULL;
}

static void start(run *r) {
  kvbm_router_daemon_config c = kvbm_router_daemon_config_default();
  kvbm_worker_key w = {.worker_id = 1};
  c.port = 0;
  c.workers = &w;
  c.num_workers = 1;
  c.max_connections = SLOTS;
  c.io_timeout_s = 60; /* before, the newcomer was refused for all of it */
  c.snapshot_every_s = 0;
  kvbm_error err = {0};
  if (kvbm_router_daemon_create(&c, &r->d, &err)) fail_msg("%s", err.msg);
  r->port = kvbm_router_daemon_port(r->d);
  assert_int_equal(pthread_create(&r->th, NULL, serve, r), 0);
}

static void stop(run *r) {
  kvbm_router_daemon_stop(r->d);
  pthread_join(r->th, NULL);
  kvbm_router_daemon_destroy(r->d);
}

static int dial(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct timeval tv = {.tv_sec = WAIT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void send_all(int fd, const char *s) {
  size_t n = strlen(s);
  assert_int_equal(send(fd, s, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* One answer (Content-Length framed): its status; its body in body. */
static int answer(int fd, char *body, size_t cap) {
  char buf[16384];
  size_t len = 0;
  char *end = NULL;
  while (!(end = memmem(buf, len, "\r\n\r\n", 4))) {
    ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
    if (n <= 0) fail_msg("no answer (%zd)", n);
    len += (size_t)n;
  }
  buf[len] = 0;
  int status = atoi(buf + 9);
  char *cl = strstr(buf, "Content-Length: ");
  assert_non_null(cl);
  size_t blen = strtoul(cl + 16, NULL, 10), head = (size_t)(end + 4 - buf);
  while (len < head + blen) {
    ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
    if (n <= 0) fail_msg("answer cut short");
    len += (size_t)n;
  }
  assert_int_equal(len, head + blen); /* nothing more was asked for */
  size_t k = blen < cap - 1 ? blen : cap - 1;
  memcpy(body, buf + head, k);
  body[k] = 0;
  return status;
}

/* Waits (WAIT_S at most) for the daemon to close fd. */
static bool closed_by_daemon(int fd) {
  char b;
  return recv(fd, &b, 1, 0) == 0;
}

static void idle_table_admits_a_newcomer(void **state) {
  (void)state;
  run r;
  start(&r);
  int fd[SLOTS];
  char body[8192];
  /* SLOTS - 1 opened and left idle, the last answered once and kept
   * alive: accepted in order, so every one is in the table after that
   * answer */
  for (int i = 0; i < SLOTS; i++) fd[i] = dial(r.port);
  send_all(fd[SLOTS - 1], "GET /health HTTP/1.1\r\n\r\n");
  assert_int_equal(answer(fd[SLOTS - 1], body, sizeof body), 200);
  int n = dial(r.port);
  send_all(n, "POST /route HTTP/1.1\r\nContent-Length: 22\r\n\r\n{\"block_hashes\":[1,2]}");
  assert_int_equal(answer(n, body, sizeof body), 200); /* before: 503 */
  assert_non_null(strstr(body, "\"worker_id\":1"));
  send_all(n, "GET /health HTTP/1.1\r\n\r\n");
  assert_int_equal(answer(n, body, sizeof body), 200);
  assert_non_null(strstr(body, "\"idle_closed_full\":1,"));
  assert_non_null(strstr(body, "\"refused_busy\":0,"));
  assert_non_null(strstr(body, "\"max_per_peer\":256,")); /* the default */
  assert_true(closed_by_daemon(fd[0])); /* idle longest: the first */
  for (int i = 0; i < SLOTS; i++) close(fd[i]);
  close(n);
  stop(&r);
}

static void pipelined_half_request_is_not_idle(void **state) {
  (void)state;
  run r;
  start(&r);
  int fd[SLOTS];
  char body[8192];
  /* each: a request answered and taken, the next one half sent behind it
   * (in the same write). No answer waits, but a request has begun. */
  for (int i = 0; i < SLOTS; i++) {
    fd[i] = dial(r.port);
    send_all(fd[i], "GET /health HTTP/1.1\r\n\r\nGET /hea");
    assert_int_equal(answer(fd[i], body, sizeof body), 200);
  }
  int n = dial(r.port);
  send_all(n, "GET /health HTTP/1.1\r\n\r\n");
  assert_int_equal(answer(n, body, sizeof body), 503);
  assert_non_null(strstr(body, "too many connections"));
  close(n);
  /* the half requests were kept: finished now, they are answered */
  for (int i = 0; i < SLOTS; i++) {
    send_all(fd[i], "lth HTTP/1.1\r\n\r\n");
    assert_int_equal(answer(fd[i], body, sizeof body), 200);
    assert_non_null(strstr(body, "\"refused_busy\":1,"));
    assert_non_null(strstr(body, "\"idle_closed_full\":0,"));
    close(fd[i]);
  }
  stop(&r);
}

static void max_per_peer_is_checked(void **state) {
  (void)state;
  kvbm_router_daemon_config c = kvbm_router_daemon_config_default();
  assert_int_equal(c.max_per_peer, 256);
  kvbm_worker_key w = {.worker_id = 1};
  c.port = 0;
  c.workers = &w;
  c.num_workers = 1;
  c.max_per_peer = 0;
  kvbm_router_daemon *d = NULL;
  kvbm_error err = {0};
  assert_int_equal(kvbm_router_daemon_create(&c, &d, &err), KVBM_EINVAL);
  assert_null(d);
  assert_non_null(strstr(err.msg, "max_per_peer"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(idle_table_admits_a_newcomer),
      cmocka_unit_test(pipelined_half_request_is_not_idle),
      cmocka_unit_test(max_per_peer_is_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
