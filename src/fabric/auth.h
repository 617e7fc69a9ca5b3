/* SPDX-License-Identifier: Apache-2.0 */
/*
 * auth.h (private): proving the shared key over the side channel, before
 * anything else happens on it (the codec is hello.h; this is the sockets).
 *
 * Connecting end: kvbm__auth_connect() runs challenge and proof on one
 * connected socket, blocking until a deadline.
 *
 * Listening end: a gate. It accepts connections and authenticates several
 * at once (non-blocking, poll), so a peer that stays silent or trickles
 * bytes holds one of KVBM__GATE_MAX places for at most its timeout, never
 * the listener: a well-behaved peer arriving meanwhile still gets through.
 * Every connection that fails (closed, silent, garbage, wrong key) is
 * closed, counted and reported to the listener's callback; the gate keeps
 * going. Only a peer that proved the key is returned.
 */
#ifndef KVBM_FABRIC_AUTH_H
#define KVBM_FABRIC_AUTH_H

#include <stdint.h>

#include "fabric/hello.h"
#include "kvbm/status.h"

/* Connections authenticating at once; when a new one arrives with all
 * places taken, the oldest is dropped. */
#define KVBM__GATE_MAX 16
#define KVBM__PEER_NAME 64 /* "ip:port" */

/* Challenge and proof on a connected socket, both ways, before the
 * deadline (kvbm__sc_deadline). On success *hs holds the handshake (the peer
 * authenticated) for the hello. KVBM_EAUTH: the peer does not hold the key;
 * KVBM_EPROTO: it is not a kvbm fabric (message says why); KVBM_ECLOSED,
 * KVBM_ETIMEDOUT, KVBM_EIO. */
int kvbm__auth_connect(int fd, const uint8_t key[KVBM__HELLO_KEY], int64_t deadline_ms, kvbm__hs *hs,
                       kvbm_error *err);

typedef void (*kvbm__gate_refused_fn)(void *user, const char *peer, int status, const char *why);

typedef struct kvbm__gate kvbm__gate;

/* A gate on listening socket lfd (not owned). Each connection gets
 * timeout_ms to authenticate. fn (may be NULL) hears of every refusal. */
int kvbm__gate_create(int lfd, const uint8_t key[KVBM__HELLO_KEY], int timeout_ms, kvbm__gate_refused_fn fn,
                      void *user, kvbm__gate **out, kvbm_error *err);

/* Waits until deadline_ms for a connection whose peer proves the key; *fd
 * (blocking socket, owned by the caller), *hs and peer (KVBM__PEER_NAME
 * bytes) describe it. KVBM_ETIMEDOUT when none did (the message counts the
 * refused ones and gives the last reason); KVBM_EIO when accept fails. */
int kvbm__gate_accept(kvbm__gate *g, int64_t deadline_ms, int *fd, kvbm__hs *hs, char *peer, kvbm_error *err);

/* Records a refusal decided after authentication (a hello or wire-up that
 * failed), so that it is counted and reported like the others. */
void kvbm__gate_refused(kvbm__gate *g, const char *peer, int status, const char *why);

/* Connections refused so far. */
uint64_t kvbm__gate_refused_count(const kvbm__gate *g);

/* Closes every pending connection and frees the gate (NULL: no-op). */
void kvbm__gate_destroy(kvbm__gate *g);

#endif
