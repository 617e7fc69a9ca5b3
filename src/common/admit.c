/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admit.c: the admission rule of the library's HTTP servers (admit.h has
 * the contract). The metrics endpoint (which also serves the advisor's
 * API) and the router daemon both call it, so a client meets one rule
 * whichever kvbm server it talks to, and the rule is tested once
 * (tests/common/test_admit.c).
 *
 * Why a rule at all. A server holds at most max_conn connections, each
 * until io_timeout_s of idleness. Refusing a newcomer whenever the table
 * is full lets anyone who opens max_conn sockets and sends nothing lock
 * every real client out for io_timeout_s, again and again (issue 24: 64
 * such sockets shut the advisor for 10 s, 16 the metrics endpoint, 256
 * the router). So:
 *   - A newcomer that would pass a bound takes the slot of an *idle*
 *     connection, the one idle longest. Idle means no request begun and
 *     no answer queued: closing it loses no work, which HTTP/1.1 allows
 *     at any time (a client retries its next request on a new
 *     connection). Idle longest, because that is the connection least
 *     likely to be used again, and because a flood of new idle sockets
 *     then closes its own oldest, not the clients that were there first
 *     and are between requests.
 *   - At most max_per_peer connections from one client address. When the
 *     newcomer's address is at its bound, the victim is one of that
 *     address's *own* idle connections, never another's: one address only
 *     ever competes with itself. A client that leaks keep-alive
 *     connections keeps being served; one that floods from one address
 *     closes only its own sockets.
 *   - A connection with a request begun (a slowloris, a slow upload) is
 *     never closed for a newcomer: it may be real work, and the
 *     per-address bound already stops one address from holding the table
 *     that way until io_timeout_s. Only when there is no idle connection
 *     to close is the newcomer answered 503, and the two refusals are told
 *     apart (the table's bound, the address's).
 *   - The server's idea of idle dates from its last poll. Before closing,
 *     make_room looks once more (MSG_PEEK): a victim with bytes waiting is
 *     handed back to the server as busy and the rule asked again, a few
 *     times at most, so a newcomer's cost stays bounded.
 * The cost is one pass over the table per new connection (O(max_conn),
 * no allocation), cheap
 * next to the accept() and the socket setup it follows; a map of counts
 * per address would make it O(1) but would need memory sized by the
 * clients, which is what a hostile client controls.
 *
 * The rule reads the table through the server's `get` rather than a
 * struct of its own, so neither server's connection record changes shape
 * for it and each defines idle from its own state (the router pipelines:
 * unconsumed input, a parsed head, output queued all mean busy).
 */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "common/admit.h"

kvbm__admit_kind kvbm__admit(const kvbm__admit_table *t, uint32_t peer, size_t *victim) {
  if (!t || !t->get || !t->max_conn || !t->max_per_peer) return KVBM__ADMIT_REFUSE_FULL;
  size_t mine = 0, old_mine = SIZE_MAX, old_any = SIZE_MAX;
  int64_t mine_ns = 0, any_ns = 0;
  for (size_t i = 0; i < t->n; i++) {
    kvbm__admit_conn c = {.fd = -1};
    t->get(t->table, i, &c);
    /* ties go to the lower index: the same victim for the same table */
    if (c.idle && (old_any == SIZE_MAX || c.idle_ns < any_ns)) old_any = i, any_ns = c.idle_ns;
    if (c.peer != peer) continue;
    mine++;
    if (c.idle && (old_mine == SIZE_MAX || c.idle_ns < mine_ns)) old_mine = i, mine_ns = c.idle_ns;
  }
  if (mine >= t->max_per_peer) {
    if (old_mine == SIZE_MAX) return KVBM__ADMIT_REFUSE_PEER;
    if (victim) *victim = old_mine;
    return KVBM__ADMIT_CLOSE_PEER;
  }
  if (t->n < t->max_conn) return KVBM__ADMIT_ROOM;
  if (old_any == SIZE_MAX) return KVBM__ADMIT_REFUSE_FULL;
  if (victim) *victim = old_any;
  return KVBM__ADMIT_CLOSE_FULL;
}

bool kvbm__admit_still_idle(int fd) {
  char b;
  ssize_t n;
  do n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  /* n > 0: a request came since the poll. 0: the peer closed; < 0 with
   * EAGAIN: nothing waiting; another error: a dead socket. All but the
   * first may go. */
  return n <= 0;
}

kvbm__admit_kind kvbm__admit_make_room(const kvbm__admit_table *t, uint32_t peer, size_t *victim) {
  if (!t || !t->busy) return KVBM__ADMIT_REFUSE_FULL;
  kvbm__admit_kind k = KVBM__ADMIT_REFUSE_FULL;
  for (int tries = 0; tries < KVBM__ADMIT_TRIES; tries++) {
    size_t v = 0;
    k = kvbm__admit(t, peer, &v);
    if (k != KVBM__ADMIT_CLOSE_PEER && k != KVBM__ADMIT_CLOSE_FULL) return k;
    kvbm__admit_conn c = {.fd = -1};
    t->get(t->table, v, &c);
    if (kvbm__admit_still_idle(c.fd)) {
      if (victim) *victim = v;
      return k;
    }
    t->busy(t->table, v); /* not idle after all: ask again without it */
  }
  /* every victim tried was busy: refused, for the bound it met */
  return k == KVBM__ADMIT_CLOSE_PEER ? KVBM__ADMIT_REFUSE_PEER : KVBM__ADMIT_REFUSE_FULL;
}

/* FNV-1a over 8 bytes, folded to 32 bits. */
static uint32_t hash64(const unsigned char *p) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 8; i++) h = (h ^ p[i]) * 1099511628211ull;
  return (uint32_t)(h ^ h >> 32);
}

uint32_t kvbm__admit_peer_key(const struct sockaddr *sa, socklen_t len) {
  if (!sa) return 0;
  if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, sa, sizeof a);
    return a.sin_addr.s_addr;
  }
  if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, sa, sizeof a);
    const unsigned char *b = a.sin6_addr.s6_addr;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(b, mapped, sizeof mapped)) {
      uint32_t v4;
      memcpy(&v4, b + 12, 4); /* network order, as for AF_INET */
      return v4;
    }
    return hash64(b); /* the /64 prefix */
  }
  return 0;
}
