/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zframes.h: reading one ZMQ multipart message into a few frames, the
 * shape of everything the events module receives (vLLM's topic | seq |
 * payload, and the replay protocol: at most 4 after the identity). Private to the events module; both the
 * replay ROUTER (sink_zmq.c) and the subscriber (subscriber.c) use it.
 */
#ifndef KVBM_EVENTS_ZFRAMES_H
#define KVBM_EVENTS_ZFRAMES_H

#include <zmq.h>

/* Takes the message waiting on `sock` without blocking for its first part
 * into f[0 .. max): frames beyond those are received and closed. Returns
 * the number of parts (the caller closes f[0 .. min(n, max))), or 0 when
 * nothing waits. */
static inline int ev_zframes_recv_n(void *sock, zmq_msg_t *f, int max) {
  int n = 0;
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    /* Parts of a message arrive together, so only the first may be absent. */
    if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&m);
      return n;
    }
    int more = zmq_msg_more(&m);
    if (n < max)
      f[n] = m;
    else
      zmq_msg_close(&m);
    n++;
    if (!more) return n;
  }
}

/* The same into at most 3 frames. */
static inline int ev_zframes_recv(void *sock, zmq_msg_t f[3]) { return ev_zframes_recv_n(sock, f, 3); }

#endif
