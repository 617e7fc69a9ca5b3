/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events/replay.h: vLLM's replay protocol, written once: the client side
 * and the rules for what a client takes from a replay server (the ZMQ
 * subscriber and the router's sources use it), and the server side's
 * frames (the ZMQ sink's replay ROUTER). Private to src/.
 *
 * Protocol: a DEALER sends [ "", start_seq (8 bytes big-endian) ]; the
 * server's ROUTER answers, for every batch it keeps from start_seq on,
 *   [ "", topic, seq, payload ]   (vLLM since PR #45177: the live
 *                                  message's topic, so a consumer knows
 *                                  whose batch it is), then
 *   [ "", "", -1, "" ];
 * or, before that PR (vLLM, SGLang), [ "", seq, payload ] then
 * [ "", -1, "" ]. Clients read both; kvbm's server writes the new shape,
 * the old one by option.
 *
 * Rules (kvbm__replay_check, one function so that they travel together):
 *   - only replies inside the range asked for, [from, to), are taken, in
 *     strictly increasing order: a server cannot move the stream anywhere
 *     the client did not ask, nor repeat itself;
 *   - the whole replay ends at a deadline (not a wait per reply): a server
 *     that trickles replies cannot keep the client from its live stream;
 *   - what is taken is bounded in bytes (the client's budget) and each
 *     payload by max_payload: a flood of replies is cut, not stored.
 */
#ifndef KVBM_EVENTS_REPLAY_H
#define KVBM_EVENTS_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

typedef struct kvbm__replay_window {
  uint64_t from, to;      /* replies taken: from <= seq < to */
  uint64_t last;          /* the last reply taken, when any */
  bool any;
  uint64_t deadline_ns;   /* monotonic: the replay is over by then */
  size_t bytes;           /* payload bytes taken so far */
  size_t max_bytes;       /* ... at most */
  size_t max_payload;     /* one payload at most */
  const char *topic;      /* replies in the new shape must have a topic
                           * that starts with this (the live subscription's
                           * prefix); NULL or "": any */
} kvbm__replay_window;

typedef enum kvbm__replay_verdict {
  KVBM__REPLAY_TAKE = 0,  /* take it */
  KVBM__REPLAY_SKIP,      /* outside the range, or not after the last one */
  KVBM__REPLAY_TOO_LARGE, /* over max_payload */
  KVBM__REPLAY_FULL,      /* would pass max_bytes: stop taking */
  KVBM__REPLAY_END,       /* the end marker (-1) */
  KVBM__REPLAY_LATE,      /* the deadline passed: stop */
} kvbm__replay_verdict;

/* A window for batches [from, to), over timeout_ms after now_ns. */
void kvbm__replay_window_init(kvbm__replay_window *w, uint64_t from, uint64_t to,
                              int timeout_ms, size_t max_bytes, size_t max_payload,
                              uint64_t now_ns);

/* Judges one reply (sequence number, payload length) at time now_ns; a
 * TAKE counts its bytes and moves `last`. */
kvbm__replay_verdict kvbm__replay_check(kvbm__replay_window *w, uint64_t seq, size_t len,
                                        uint64_t now_ns);

/* Milliseconds left to wait for the next reply (0: over). */
int kvbm__replay_wait_ms(const kvbm__replay_window *w, uint64_t now_ns);

/* What one replay did. */
typedef struct kvbm__replay_result {
  uint64_t taken;         /* replies handed to `take` */
  uint64_t refused;       /* replies skipped by the rules (range, order,
                           * size, a topic outside the subscription) */
  uint64_t with_topic;    /* replies in the new shape (with a topic) */
  bool failed;            /* no end marker: deadline, bad reply, full, or a
                           * socket error (the DEALER was dropped) */
  bool full;              /* stopped because the byte budget was spent */
  const char *why;        /* when failed: a static phrase */
} kvbm__replay_result;

/* Receives one taken reply; the payload is valid during the call. Returns
 * 0, or nonzero to stop (counted as failed, why = "no room"). */
typedef int (*kvbm__replay_take_fn)(void *user, uint64_t seq, const uint8_t *data, size_t len);

/* Asks the replay ROUTER at `endpoint` for window w's range and hands every
 * reply the rules take to `take`, in order, until the end marker or the
 * deadline. *dealer is the caller's DEALER socket on zctx (made when NULL;
 * closed and set to NULL after a failure, so that late replies to an
 * abandoned request are never read as the next one's). Does not block past
 * the window's deadline. */
void kvbm__replay_fetch(void *zctx, void **dealer, const char *endpoint,
                        kvbm__replay_window *w, kvbm__replay_take_fn take, void *user,
                        kvbm__replay_result *res);

/* Makes *dealer (when NULL) and connects it to the replay ROUTER at
 * `endpoint` ahead of the first fetch (so that its descriptors exist from
 * the start); 0, or -1 with *dealer NULL. kvbm__replay_fetch does the same
 * when it finds no DEALER. */
int kvbm__replay_open(void *zctx, void **dealer, const char *endpoint);

/* Closes a DEALER made by kvbm__replay_fetch (NULL is a no-op). */
void kvbm__replay_close(void **dealer);

/* --- the server side (a ROUTER) --- */

/* Whether frames f[0 .. n) read from a ROUTER are a request [identity, "",
 * start_seq]; *start the sequence number asked from. */
bool kvbm__replay_request(zmq_msg_t *f, int n, uint64_t *start);

/* Sends one batch to the client `id` (the request's first frame): the new
 * shape with `topic`, or (legacy) the old one. -1 when the send fails (the
 * client went away, or stalls past the socket's send timeout). */
int kvbm__replay_reply(void *router, zmq_msg_t *id, const char *topic, size_t topic_len,
                       bool legacy, uint64_t seq, const void *data, size_t len);

/* Sends the end marker in the same shape. */
int kvbm__replay_end(void *router, zmq_msg_t *id, bool legacy);

#endif
