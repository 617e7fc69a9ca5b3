/* SPDX-License-Identifier: Apache-2.0 */
/*
 * auth.c: the side channel's authentication, on sockets (see auth.h; the
 * message formats and MACs are hello.c's).
 *
 * The connecting end is simple: it talks to one listener, so it sends its
 * challenge, reads exactly 40 bytes, sends its proof, reads exactly 40
 * bytes, each under one deadline, and gives up on the first thing wrong.
 *
 * The listening end must keep serving while strangers knock: a receiver
 * used to end on the first bad handshake, and a single silent connection
 * would have held it for the whole timeout. So the gate is a small poll
 * loop over the listening socket and up to KVBM__GATE_MAX connections in
 * the middle of authenticating, each a two-step state machine (waiting for
 * the peer's challenge, then for its proof) with its own deadline and a
 * 40-byte buffer: nothing is allocated for a peer, a peer cannot make us
 * read more than 80 bytes before it has proved the key, and reads never
 * run ahead of the message expected (recv asks for what is missing only).
 * Our own challenge and proof are 40 bytes on a fresh socket, far below
 * any send buffer, so they are sent without waiting; a send that does not
 * go through at once refuses the peer rather than blocking the gate.
 *
 * Refusals are counted and passed to a callback with the peer's address
 * and the reason, so an operator can see who knocked and why; the status
 * of the last one goes into the timeout message.
 *
 * The same secret also keys the peers' frames (issue 23): the frame MAC
 * key is derived from it under its own context (kvbm_fabric_frame_key),
 * so a block message's sum can be checked as coming from a holder of the
 * secret, not only as undamaged.
 */
#include "fabric/auth.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fabric/sidechan.h"

/* Statuses of a malformed handshake message become KVBM_EPROTO (the peer
 * is not a kvbm fabric), keeping the codec's message. */
static int as_proto(int rc, kvbm_error *err) {
  if (rc == KVBM_EMAGIC || rc == KVBM_EVERSION || rc == KVBM_ETRUNCATED || rc == KVBM_ETOOLONG ||
      rc == KVBM_EFORMAT) {
    if (err) err->code = KVBM_EPROTO;
    return KVBM_EPROTO;
  }
  return rc;
}

/* ---- connecting end ---- */

int kvbm__auth_connect(int fd, const uint8_t key[KVBM__HELLO_KEY], int64_t deadline, kvbm__hs *hs,
                       kvbm_error *err) {
  uint8_t nonce[KVBM__HELLO_NONCE], msg[KVBM__HELLO_AUTH_LEN];
  int rc = kvbm__hello_nonce(nonce, err);
  if (rc) return rc;
  kvbm__hs_init(hs, key, KVBM__ROLE_CONNECT, nonce);
  kvbm__hs_challenge(hs, msg);
  rc = kvbm__sc_send_all(fd, msg, sizeof msg, deadline, err);
  if (!rc) rc = kvbm__sc_recv_all(fd, msg, sizeof msg, deadline, err);
  if (!rc) rc = as_proto(kvbm__hs_take_challenge(hs, msg, sizeof msg, err), err);
  if (!rc) rc = kvbm__hs_proof(hs, msg, err);
  if (!rc) rc = kvbm__sc_send_all(fd, msg, sizeof msg, deadline, err);
  if (!rc) rc = kvbm__sc_recv_all(fd, msg, sizeof msg, deadline, err);
  if (!rc) rc = as_proto(kvbm__hs_check_proof(hs, msg, sizeof msg, err), err);
  if (rc) kvbm__hs_wipe(hs);
  return rc;
}

/* ---- listening end ---- */

enum { WANT_CHALLENGE, WANT_PROOF };

typedef struct cand {
  int fd; /* -1: a free place */
  int stage;
  size_t got;
  int64_t deadline;
  uint64_t arrival;
  uint8_t buf[KVBM__HELLO_AUTH_LEN];
  kvbm__hs hs;
  char peer[KVBM__PEER_NAME];
} cand;

struct kvbm__gate {
  int lfd;
  int timeout_ms;
  uint8_t key[KVBM__HELLO_KEY];
  kvbm__gate_refused_fn fn;
  void *user;
  uint64_t arrivals, refused;
  int last_status;
  char last[KVBM_ERROR_MSG_MAX];
  cand c[KVBM__GATE_MAX];
};

int kvbm__gate_create(int lfd, const uint8_t key[KVBM__HELLO_KEY], int timeout_ms, kvbm__gate_refused_fn fn,
                      void *user, kvbm__gate **out, kvbm_error *err) {
  kvbm__gate *g = calloc(1, sizeof *g);
  if (!g) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: out of memory");
  g->lfd = lfd;
  g->timeout_ms = timeout_ms;
  memcpy(g->key, key, sizeof g->key);
  g->fn = fn;
  g->user = user;
  for (int i = 0; i < KVBM__GATE_MAX; i++) g->c[i].fd = -1;
  *out = g;
  return KVBM_OK;
}

void kvbm__gate_refused(kvbm__gate *g, const char *peer, int status, const char *why) {
  g->refused++;
  g->last_status = status;
  snprintf(g->last, sizeof g->last, "%s", why && *why ? why : kvbm_strerror(status));
  if (g->fn) g->fn(g->user, peer, status, g->last);
}

uint64_t kvbm__gate_refused_count(const kvbm__gate *g) { return g ? g->refused : 0; }

static void drop(cand *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  kvbm__hs_wipe(&c->hs);
}

static void refuse(kvbm__gate *g, cand *c, int status, const char *why) {
  kvbm__gate_refused(g, c->peer, status, why);
  drop(c);
}

static void peer_name(int fd, char *out) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  char ip[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sin_family == AF_INET)
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  snprintf(out, KVBM__PEER_NAME, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
}

/* Sends a 40-byte message at once or not at all (see the top). */
static bool send_now(int fd, const uint8_t *msg) {
  ssize_t n;
  do n = send(fd, msg, KVBM__HELLO_AUTH_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)KVBM__HELLO_AUTH_LEN;
}

/* A place for a newcomer: a free one, else the oldest is dropped. */
static cand *place(kvbm__gate *g) {
  cand *oldest = &g->c[0];
  for (int i = 0; i < KVBM__GATE_MAX; i++) {
    if (g->c[i].fd < 0) return &g->c[i];
    if (g->c[i].arrival < oldest->arrival) oldest = &g->c[i];
  }
  refuse(g, oldest, KVBM_EAGAIN, "fabric: handshake: dropped: too many peers authenticating at once");
  return oldest;
}

/* Takes one connection off the listening socket and sends our challenge. */
static int admit(kvbm__gate *g, kvbm_error *err) {
  int s = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);
  if (s < 0) {
    if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN || errno == EWOULDBLOCK) return KVBM_OK;
    return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: accept: %s", strerror(errno));
  }
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  cand *c = place(g);
  memset(c, 0, sizeof *c);
  c->fd = s;
  c->stage = WANT_CHALLENGE;
  c->arrival = ++g->arrivals;
  c->deadline = kvbm__sc_deadline(g->timeout_ms);
  peer_name(s, c->peer);
  uint8_t nonce[KVBM__HELLO_NONCE], msg[KVBM__HELLO_AUTH_LEN];
  kvbm_error e = {0};
  if (kvbm__hello_nonce(nonce, &e) != KVBM_OK) {
    drop(c);
    return kvbm_error_set(err, e.code, "%s", e.msg);
  }
  kvbm__hs_init(&c->hs, g->key, KVBM__ROLE_ACCEPT, nonce);
  kvbm__hs_challenge(&c->hs, msg);
  if (!send_now(s, msg)) refuse(g, c, KVBM_ECLOSED, "fabric: handshake: cannot send the challenge");
  return KVBM_OK;
}

/* Reads what the connection has; returns true when its peer proved the key. */
static bool advance(kvbm__gate *g, cand *c) {
  ssize_t n;
  do n = recv(c->fd, c->buf + c->got, sizeof c->buf - c->got, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n <= 0) {
    refuse(g, c, KVBM_ECLOSED,
           n == 0 ? "fabric: handshake: the peer closed the connection before proving the key"
                  : "fabric: handshake: the peer reset the connection before proving the key");
    return false;
  }
  c->got += (size_t)n;
  if (c->got < sizeof c->buf) return false;
  c->got = 0;
  kvbm_error e = {0};
  if (c->stage == WANT_CHALLENGE) {
    uint8_t proof[KVBM__HELLO_AUTH_LEN];
    int rc = as_proto(kvbm__hs_take_challenge(&c->hs, c->buf, sizeof c->buf, &e), &e);
    if (!rc) rc = kvbm__hs_proof(&c->hs, proof, &e);
    if (!rc && !send_now(c->fd, proof))
      rc = kvbm_error_set(&e, KVBM_ECLOSED, "fabric: handshake: cannot send the proof");
    if (rc) refuse(g, c, rc, e.msg);
    c->stage = WANT_PROOF;
    return false;
  }
  int rc = as_proto(kvbm__hs_check_proof(&c->hs, c->buf, sizeof c->buf, &e), &e);
  if (rc) {
    refuse(g, c, rc, e.msg);
    return false;
  }
  return true;
}

/* Refuses every connection past its deadline; returns the earliest
 * deadline of those left (or `limit`). */
static int64_t expire(kvbm__gate *g, int64_t now, int64_t limit) {
  for (int i = 0; i < KVBM__GATE_MAX; i++) {
    cand *c = &g->c[i];
    if (c->fd < 0) continue;
    if (now >= c->deadline) {
      char why[128];
      snprintf(why, sizeof why, "fabric: handshake: the peer did not prove the key within %d ms", g->timeout_ms);
      refuse(g, c, KVBM_ETIMEDOUT, why);
    } else if (c->deadline < limit) {
      limit = c->deadline;
    }
  }
  return limit;
}

int kvbm__gate_accept(kvbm__gate *g, int64_t deadline, int *fd, kvbm__hs *hs, char *peer, kvbm_error *err) {
  for (;;) {
    int64_t now = kvbm__sc_now_ms();
    int64_t wake = expire(g, now, deadline);
    if (now >= deadline) {
      if (g->refused)
        return kvbm_error_set(err, KVBM_ETIMEDOUT,
                              "fabric: no peer proved the key in time (%llu refused; last: %s: %s)",
                              (unsigned long long)g->refused, kvbm_status_name(g->last_status), g->last);
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: side channel: timed out waiting to accept a peer");
    }
    struct pollfd p[KVBM__GATE_MAX + 1];
    int who[KVBM__GATE_MAX + 1], np = 0;
    p[np] = (struct pollfd){.fd = g->lfd, .events = POLLIN};
    who[np++] = -1;
    for (int i = 0; i < KVBM__GATE_MAX; i++)
      if (g->c[i].fd >= 0) {
        p[np] = (struct pollfd){.fd = g->c[i].fd, .events = POLLIN};
        who[np++] = i;
      }
    int64_t left = wake == INT64_MAX ? -1 : wake - now;
    int r = poll(p, (nfds_t)np, left < 0 ? -1 : left > 1000000 ? 1000000 : (int)left);
    if (r < 0 && errno != EINTR)
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: poll: %s", strerror(errno));
    for (int k = 1; r > 0 && k < np; k++) {
      cand *c = &g->c[who[k]];
      if (!p[k].revents || c->fd != p[k].fd) continue;
      if (advance(g, c)) {
        *fd = c->fd;
        *hs = c->hs;
        snprintf(peer, KVBM__PEER_NAME, "%s", c->peer);
        c->fd = -1; /* handed over */
        kvbm__hs_wipe(&c->hs);
        return KVBM_OK;
      }
    }
    if (r > 0 && p[0].revents) {
      int rc = admit(g, err);
      if (rc) return rc;
    }
  }
}

void kvbm__gate_destroy(kvbm__gate *g) {
  if (!g) return;
  for (int i = 0; i < KVBM__GATE_MAX; i++) drop(&g->c[i]);
  explicit_bzero(g->key, sizeof g->key);
  free(g);
}

/* ---- the frame MAC key (issue 23) ---- */

/* Not the side channel's context: a key for one use only. */
#define FRAME_KDF "kvbm 2026-11 fabric frame MAC v1"

int kvbm_fabric_frame_key(const void *secret, size_t len, uint8_t out[32], kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: NULL key output");
  if (!secret || len < KVBM_FABRIC_SECRET_MIN || len > KVBM_FABRIC_SECRET_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: the shared secret must be %u..%u bytes, not %zu",
                          KVBM_FABRIC_SECRET_MIN, KVBM_FABRIC_SECRET_MAX, secret ? len : 0);
  return kvbm_blake3_derive_key(FRAME_KDF, secret, len, out, 32);
}
