/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admit.h: who gets a connection slot, for the library's HTTP servers
 * (the metrics endpoint with the advisor's API, and the router daemon,
 * all on the HTTP service layer, src/service/service.c, which calls it):
 * the admission rule written once (admit.c says why it is this rule).
 * Private to src/.
 *
 * The rule does not know either server's connection struct: it reads a
 * server's table only through `get`, which describes connection i in a
 * kvbm__admit_conn, and tells the server through `busy` when a connection
 * it thought idle turned out to have a request waiting.
 *
 * Contract of every call here:
 *   - reads: the table, through get (i in [0, n) only), nothing else of
 *     the server's; kvbm__admit_make_room also peeks (recv MSG_PEEK |
 *     MSG_DONTWAIT, one byte) at the sockets of the connections it picks,
 *     never reading, writing or closing them;
 *   - writes: *victim; make_room calls busy (the server's own change);
 *   - allocates nothing, keeps no state between calls, takes no lock (the
 *     server's thread calls it, on its own table);
 *   - cost: kvbm__admit is one pass over the table, n calls of get, O(n);
 *     kvbm__admit_make_room at most KVBM__ADMIT_TRIES passes and peeks.
 */
#ifndef KVBM_COMMON_ADMIT_H
#define KVBM_COMMON_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Victims found busy at the last look before make_room gives up (503):
 * each costs a pass over the table and a peek, so a newcomer's cost stays
 * bounded however many idle-looking connections have requests waiting. */
#define KVBM__ADMIT_TRIES 8

/* What the rule needs to know of one open connection. */
typedef struct kvbm__admit_conn {
  int fd;          /* its socket: peeked at by make_room, nothing else */
  uint32_t peer;   /* its client's key (kvbm__admit_peer_key) */
  bool idle;       /* the server's word: no request begun (no unconsumed
                      input, nothing parsed), nothing queued to send, no
                      bytes known to be waiting unread */
  int64_t idle_ns; /* since when it is idle (accepted, or its last answer
                      taken); any clock, only compared */
} kvbm__admit_conn;

/* A server's connection table, as the rule sees it. */
typedef struct kvbm__admit_table {
  void *table;         /* the server's own, opaque here */
  size_t n;            /* connections open: 0 .. n-1 */
  size_t max_conn;     /* at most this many open (>= 1) */
  size_t max_per_peer; /* at most this many from one client key (>= 1;
                          at or above max_conn: no bound of its own) */
  /* Describes connection i (0 <= i < n) in *out. */
  void (*get)(const void *table, size_t i, kvbm__admit_conn *out);
  /* make_room only: connection i looked idle but has bytes waiting; from
   * now on get must say it is not idle (until the server reads them). */
  void (*busy)(void *table, size_t i);
} kvbm__admit_table;

typedef enum kvbm__admit_kind {
  KVBM__ADMIT_ROOM,         /* a free slot: take it */
  KVBM__ADMIT_CLOSE_PEER,   /* the client is at max_per_peer: close *victim,
                               its own idle connection idle longest */
  KVBM__ADMIT_CLOSE_FULL,   /* the table is full: close *victim, the idle
                               connection idle longest, anyone's */
  KVBM__ADMIT_REFUSE_PEER,  /* the client is at max_per_peer and none of its
                               connections is idle: answer 503, close */
  KVBM__ADMIT_REFUSE_FULL,  /* the table is full, none idle: 503, close */
} kvbm__admit_kind;

/* The rule for a new connection from `peer`, over t->table[0..n): one
 * pass, no I/O. *victim is set for the two CLOSE answers only. A table
 * without get, or with a bound of 0, refuses (REFUSE_FULL). */
kvbm__admit_kind kvbm__admit(const kvbm__admit_table *t, uint32_t peer, size_t *victim);

/* The rule with the last look the servers need before closing anything:
 * a victim that has bytes waiting (a request came since the server's
 * poll) is handed to t->busy and the rule asked again, at most
 * KVBM__ADMIT_TRIES times; past that the newcomer is refused (REFUSE_PEER
 * when the client's bound was what it met, else REFUSE_FULL). For the
 * CLOSE answers the caller closes *victim (nothing is closed here) and
 * counts it; for the REFUSE answers it refuses the newcomer. t->busy is
 * required. */
kvbm__admit_kind kvbm__admit_make_room(const kvbm__admit_table *t, uint32_t peer, size_t *victim);

/* Whether the connection on fd is still idle at the last moment: no byte
 * waiting to be read. A peer that closed, or a dead socket, counts as
 * idle (closing it loses nothing). One recv(MSG_PEEK | MSG_DONTWAIT). */
bool kvbm__admit_still_idle(int fd);

/* The client key of a peer address (accept()'s): an IPv4 address as it
 * is (network order); an IPv4-mapped IPv6 address as that IPv4 address;
 * another IPv6 address as a hash of its /64 prefix (one host usually
 * holds a whole /64, so its addresses are one client). 0 for NULL or an
 * address that is neither (a Unix socket: every such client is one). */
uint32_t kvbm__admit_peer_key(const struct sockaddr *sa, socklen_t len);

#endif
