/*
 * zframes.h: reading one ZMQ multipart message into at most 3 frames, the
 * shape of everything the events module receives (vLLM's topic | seq |
 * payload, and the replay protocol). Private to the events module; both the
 * replay ROUTER (sink_zmq.c) and the subscriber (subscriber.c) use it.
 */
#ifndef KVBM_EVENTS_ZFRAMES_H
#define KVBM_EVENTS_ZFRAMES_H

#include <zmq.h>

/* Takes the message waiting on `sock` without blocking for its first part:
 * frames beyond the third are received and closed. Returns the number of
 * parts (the caller closes f[0 .. min(n, 3))), or 0 when nothing waits. */
static inline int ev_zframes_recv(void *sock, zmq_msg_t f[3]) {
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
    if (n < 3)
      f[n] = m;
    else
      zmq_msg_close(&m);
    n++;
    if (!more) return n;
  }
}

#endif
