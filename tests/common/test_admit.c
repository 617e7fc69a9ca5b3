/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_admit.c: the admission rule the HTTP servers share
 * (common/admit.h), on a table of its own: which connection a newcomer
 * may close (the idle one idle longest; its own address's at the
 * per-address bound), when it is refused and for which bound, that the
 * rule reads each connection once, the last look (MSG_PEEK) over real
 * socket pairs, and the client keys of IPv4 and IPv6 addresses.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/admit.h"

/* A server's table, as small as the rule needs. */
typedef struct fconn {
  int fd;
  uint32_t peer;
  bool idle;
  int64_t since;
} fconn;

typedef struct ftable {
  fconn c[32];
  size_t reads; /* get calls */
  size_t busy[32], nbusy;
} ftable;

static void fget(const void *table, size_t i, kvbm__admit_conn *out) {
  ftable *t = (ftable *)table; /* counts its reads: the test's own table */
  t->reads++;
  *out = (kvbm__admit_conn){.fd = t->c[i].fd, .peer = t->c[i].peer, .idle = t->c[i].idle,
                            .idle_ns = t->c[i].since};
}

static void fbusy(void *table, size_t i) {
  ftable *t = table;
  t->c[i].idle = false;
  t->busy[t->nbusy++] = i;
}

static kvbm__admit_table view(ftable *t, size_t n, size_t max_conn, size_t max_per_peer) {
  return (kvbm__admit_table){.table = t, .n = n, .max_conn = max_conn,
                             .max_per_peer = max_per_peer, .get = fget, .busy = fbusy};
}

enum { A = 1, B = 2, C = 3 }; /* client keys */

static void room_while_both_bounds_hold(void **state) {
  (void)state;
  ftable t = {0};
  for (size_t i = 0; i < 3; i++) t.c[i] = (fconn){.peer = A, .idle = true, .since = 10};
  kvbm__admit_table v = view(&t, 3, 4, 4);
  size_t victim = 99;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_ROOM);
  assert_int_equal(victim, 99); /* untouched */
  assert_int_equal(kvbm__admit(&v, B, &victim), KVBM__ADMIT_ROOM);
  assert_int_equal(t.reads, 6); /* one pass each: every connection read once */
}

static void full_table_closes_the_idle_one_idle_longest(void **state) {
  (void)state;
  ftable t = {0};
  t.c[0] = (fconn){.peer = A, .idle = false, .since = 1}; /* oldest, but busy */
  t.c[1] = (fconn){.peer = B, .idle = true, .since = 30};
  t.c[2] = (fconn){.peer = C, .idle = true, .since = 20};
  t.c[3] = (fconn){.peer = A, .idle = true, .since = 40};
  kvbm__admit_table v = view(&t, 4, 4, 8);
  size_t victim = 99;
  assert_int_equal(kvbm__admit(&v, B, &victim), KVBM__ADMIT_CLOSE_FULL);
  assert_int_equal(victim, 2); /* C's, idle since 20: anyone's */
  /* ties: the lower index, so the same table gives the same victim */
  t.c[1].since = 20;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_CLOSE_FULL);
  assert_int_equal(victim, 1);
  /* none idle: refused for the table */
  for (size_t i = 0; i < 4; i++) t.c[i].idle = false;
  assert_int_equal(kvbm__admit(&v, B, &victim), KVBM__ADMIT_REFUSE_FULL);
}

static void peer_bound_closes_only_its_own(void **state) {
  (void)state;
  ftable t = {0};
  t.c[0] = (fconn){.peer = B, .idle = true, .since = 1}; /* idle longest of all */
  t.c[1] = (fconn){.peer = A, .idle = false, .since = 2};
  t.c[2] = (fconn){.peer = A, .idle = true, .since = 50};
  t.c[3] = (fconn){.peer = A, .idle = true, .since = 40};
  kvbm__admit_table v = view(&t, 4, 16, 3); /* the table has room */
  size_t victim = 99;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_CLOSE_PEER);
  assert_int_equal(victim, 3); /* A's own, idle since 40; never B's */
  /* A's all busy: refused for its address, though the table has room and
   * B has an idle connection */
  t.c[2].idle = t.c[3].idle = false;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_REFUSE_PEER);
  /* B is under its bound: room */
  assert_int_equal(kvbm__admit(&v, B, &victim), KVBM__ADMIT_ROOM);
  /* the table full too: C, under its own bound, meets the table's and
   * may close anyone's idle connection (B's, the only one) */
  v.max_conn = 4;
  assert_int_equal(kvbm__admit(&v, C, &victim), KVBM__ADMIT_CLOSE_FULL);
  assert_int_equal(victim, 0);
}

static void bad_tables_refuse(void **state) {
  (void)state;
  ftable t = {0};
  kvbm__admit_table v = view(&t, 0, 4, 0);
  size_t victim = 0;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_REFUSE_FULL);
  v = view(&t, 0, 0, 4);
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_REFUSE_FULL);
  v = view(&t, 0, 4, 4);
  v.get = NULL;
  assert_int_equal(kvbm__admit(&v, A, &victim), KVBM__ADMIT_REFUSE_FULL);
  v = view(&t, 0, 4, 4);
  v.busy = NULL;
  assert_int_equal(kvbm__admit_make_room(&v, A, &victim), KVBM__ADMIT_REFUSE_FULL);
  assert_int_equal(kvbm__admit(NULL, A, &victim), KVBM__ADMIT_REFUSE_FULL);
}

/* n idle connections over socket pairs: the server's end in the table,
 * the client's in peers[]. */
static void pairs(ftable *t, int *peers, size_t n, uint32_t key) {
  for (size_t i = 0; i < n; i++) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    t->c[i] = (fconn){.fd = sv[0], .peer = key, .idle = true, .since = (int64_t)i};
    peers[i] = sv[1];
  }
}

static void unpair(ftable *t, int *peers, size_t n) {
  for (size_t i = 0; i < n; i++) {
    close(t->c[i].fd);
    if (peers[i] >= 0) close(peers[i]);
  }
}

static void last_look_passes_over_requests_that_came(void **state) {
  (void)state;
  ftable t = {0};
  int peers[4];
  pairs(&t, peers, 4, A);
  /* the two idle longest have a request waiting since the server's poll */
  assert_int_equal(write(peers[0], "G", 1), 1);
  assert_int_equal(write(peers[1], "G", 1), 1);
  /* a peer that left counts as idle: closing it loses nothing */
  close(peers[2]);
  peers[2] = -1;
  kvbm__admit_table v = view(&t, 4, 4, 8);
  size_t victim = 99;
  assert_int_equal(kvbm__admit_make_room(&v, B, &victim), KVBM__ADMIT_CLOSE_FULL);
  assert_int_equal(victim, 2);
  assert_int_equal(t.nbusy, 2); /* both handed back as busy, in age order */
  assert_int_equal(t.busy[0], 0);
  assert_int_equal(t.busy[1], 1);
  /* the peek read nothing: the request is still there for the server */
  char b;
  assert_int_equal(recv(t.c[0].fd, &b, 1, MSG_DONTWAIT), 1);
  assert_true(kvbm__admit_still_idle(t.c[3].fd));
  unpair(&t, peers, 4);
}

static void tries_are_bounded_and_refuse_for_the_bound_met(void **state) {
  (void)state;
  ftable t = {0};
  int peers[12];
  pairs(&t, peers, 12, A);
  for (size_t i = 0; i < 12; i++) assert_int_equal(write(peers[i], "G", 1), 1);
  kvbm__admit_table v = view(&t, 12, 12, 64);
  size_t victim = 99;
  /* every one looks idle, every one has a request waiting: after
   * KVBM__ADMIT_TRIES looks, the newcomer is refused for the table */
  assert_int_equal(kvbm__admit_make_room(&v, B, &victim), KVBM__ADMIT_REFUSE_FULL);
  assert_int_equal(t.nbusy, KVBM__ADMIT_TRIES);
  /* the same at the address's bound: refused for the address */
  for (size_t i = 0; i < 12; i++) t.c[i].idle = true;
  t.nbusy = 0;
  v.max_conn = 64;
  v.max_per_peer = 12;
  assert_int_equal(kvbm__admit_make_room(&v, A, &victim), KVBM__ADMIT_REFUSE_PEER);
  assert_int_equal(t.nbusy, KVBM__ADMIT_TRIES);
  /* no bound met: room, nothing peeked */
  t.nbusy = 0;
  assert_int_equal(kvbm__admit_make_room(&v, B, &victim), KVBM__ADMIT_ROOM);
  assert_int_equal(t.nbusy, 0);
  unpair(&t, peers, 12);
}

static void peer_keys(void **state) {
  (void)state;
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(1234)};
  inet_pton(AF_INET, "10.1.2.3", &a4.sin_addr);
  uint32_t k4 = kvbm__admit_peer_key((struct sockaddr *)&a4, sizeof a4);
  assert_int_equal(k4, a4.sin_addr.s_addr); /* the address, whatever the port */
  /* the same host over an IPv4-mapped IPv6 address: the same client */
  struct sockaddr_in6 m = {.sin6_family = AF_INET6, .sin6_port = htons(99)};
  inet_pton(AF_INET6, "::ffff:10.1.2.3", &m.sin6_addr);
  assert_int_equal(kvbm__admit_peer_key((struct sockaddr *)&m, sizeof m), k4);
  /* IPv6: one /64 is one client; another /64 another */
  struct sockaddr_in6 x = {.sin6_family = AF_INET6}, y = x, z = x;
  inet_pton(AF_INET6, "2001:db8:1:2::1", &x.sin6_addr);
  inet_pton(AF_INET6, "2001:db8:1:2:ffff:1:2:3", &y.sin6_addr);
  inet_pton(AF_INET6, "2001:db8:1:3::1", &z.sin6_addr);
  uint32_t kx = kvbm__admit_peer_key((struct sockaddr *)&x, sizeof x);
  assert_int_equal(kvbm__admit_peer_key((struct sockaddr *)&y, sizeof y), kx);
  assert_int_not_equal(kvbm__admit_peer_key((struct sockaddr *)&z, sizeof z), kx);
  /* a short length or no address: key 0, nothing read past it */
  assert_int_equal(kvbm__admit_peer_key((struct sockaddr *)&a4, 4), 0);
  assert_int_equal(kvbm__admit_peer_key(NULL, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(room_while_both_bounds_hold),
      cmocka_unit_test(full_table_closes_the_idle_one_idle_longest),
      cmocka_unit_test(peer_bound_closes_only_its_own),
      cmocka_unit_test(bad_tables_refuse),
      cmocka_unit_test(last_look_passes_over_requests_that_came),
      cmocka_unit_test(tries_are_bounded_and_refuse_for_the_bound_met),
      cmocka_unit_test(peer_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
