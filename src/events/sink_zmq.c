/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink_zmq.c: the ZMQ PUB sink in vLLM's wire format, with its replay
 * ROUTER.
 *
 * Every batch goes out as three frames: topic, the sequence number (8 bytes
 * big-endian) and the payload. The payload frame is the publisher's own
 * batch buffer when it offers one (send_owned: zmq_msg_init_data with a
 * reference that ZMQ gives back when it has written the bytes), else a
 * copy (zmq_send). PUB never blocks: a subscriber that falls
 * behind by more than the high-water mark loses messages, which is why the
 * replay socket exists. The sink keeps the last `replay_batches` payloads
 * (copies, in a ring whose slots reuse their buffers) and answers a request
 * [identity, "", start_seq] with every kept batch from start_seq on, then
 * the end marker (sequence -1, empty payload), as vLLM's publisher does:
 * in the shape with the topic (vLLM PR #45177) or, by option, the one
 * before it (events/replay.h writes both).
 *
 * The ROUTER has no send high-water mark (a reply is at most the ring, which
 * is bounded anyway) and is "mandatory", so a reply to a client that went
 * away stops at once instead of being queued for nobody; a send timeout
 * keeps a stalled client from holding up the publisher thread for long.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/vec.h"
#include "events/replay.h"
#include "events/sink.h"
#include "events/zframes.h"

typedef struct slot {
  uint64_t seq;
  uint8_t *data;
  size_t len, cap;
} slot;

typedef struct zsink {
  ev_sink base;
  void *pub, *router;
  char *topic;
  size_t topic_len;
  slot *ring;
  size_t ring_cap, ring_head, ring_n; /* oldest at ring_head */
  int linger_ms;
  bool legacy; /* replay replies without the topic frame */
  char ep[256], rep[256];
} zsink;

static int zsend(zsink *z, const uint8_t *payload, size_t len, uint64_t seq) {
  uint8_t seqb[8];
  ev_put_be64(seqb, seq);
  if (zmq_send(z->pub, z->topic, z->topic_len, ZMQ_SNDMORE) < 0 ||
      zmq_send(z->pub, seqb, 8, ZMQ_SNDMORE) < 0 || zmq_send(z->pub, payload, len, 0) < 0)
    return KVBM_EIO;
  return 0;
}

/* The same, the payload frame handed to ZMQ without a copy: the message
 * holds a reference to the publisher's buffer until ZMQ's I/O thread has
 * written it (or the message is dropped), and gives it back then. */
static int zsend_owned(zsink *z, const ev_payload *pl, uint64_t seq) {
  uint8_t seqb[8];
  ev_put_be64(seqb, seq);
  if (zmq_send(z->pub, z->topic, z->topic_len, ZMQ_SNDMORE) < 0 ||
      zmq_send(z->pub, seqb, 8, ZMQ_SNDMORE) < 0)
    return KVBM_EIO;
  zmq_msg_t m;
  pl->retain(pl->owner);
  if (zmq_msg_init_data(&m, pl->data, pl->len, pl->release, pl->owner) < 0) {
    pl->release(pl->data, pl->owner);
    return KVBM_EIO;
  }
  if (zmq_msg_send(&m, z->pub, 0) < 0) {
    zmq_msg_close(&m); /* gives the reference back */
    return KVBM_EIO;
  }
  return 0;
}

static int keep(zsink *z, uint64_t seq, const uint8_t *payload, size_t len) {
  size_t i;
  if (z->ring_n < z->ring_cap) {
    i = (z->ring_head + z->ring_n) % z->ring_cap;
    z->ring_n++;
  } else { /* full: the oldest slot is reused */
    i = z->ring_head;
    z->ring_head = (z->ring_head + 1) % z->ring_cap;
  }
  slot *s = &z->ring[i];
  /* Exactly len bytes (common/vec.h): a slot per batch kept, doubling
   * would leave up to half of each idle. */
  if (s->cap < len && kvbm__vec_resize_of(&s->data, &s->cap, len, KVBM__VEC_NO_LIMIT)) {
    s->len = 0; /* keep the ring consistent: this slot now holds nothing */
    s->seq = seq;
    return KVBM_ENOMEM;
  }
  if (len) memcpy(s->data, payload, len);
  s->len = len;
  s->seq = seq;
  return 0;
}

static int zsink_send(ev_sink *base, const kvbm_event_batch *b, const uint8_t *payload,
                      size_t len) {
  zsink *z = (zsink *)base;
  int rc = zsend(z, payload, len, b->seq);
  if (z->router) {
    int rc2 = keep(z, b->seq, payload, len);
    if (!rc) rc = rc2;
  }
  return rc;
}

static int zsink_send_owned(ev_sink *base, const kvbm_event_batch *b, const ev_payload *pl) {
  zsink *z = (zsink *)base;
  int rc = zsend_owned(z, pl, b->seq);
  if (z->router) {
    int rc2 = keep(z, b->seq, pl->data, pl->len);
    if (!rc) rc = rc2;
  }
  return rc;
}

static void zsink_service(ev_sink *base, ev_service_counts *counts) {
  zsink *z = (zsink *)base;
  for (;;) {
    zmq_msg_t f[3];
    int n = ev_zframes_recv(z->router, f);
    if (n == 0) return;
    uint64_t start;
    if (!kvbm__replay_request(f, n, &start)) {
      counts->replay_bad++;
    } else {
      counts->replay_requests++;
      bool gone = false;
      for (size_t k = 0; k < z->ring_n && !gone; k++) {
        const slot *s = &z->ring[(z->ring_head + k) % z->ring_cap];
        if (s->seq < start) continue;
        gone = kvbm__replay_reply(z->router, &f[0], z->topic, z->topic_len, z->legacy, s->seq,
                                  s->data ? s->data : (const uint8_t *)"", s->len) < 0;
      }
      if (!gone) kvbm__replay_end(z->router, &f[0], z->legacy);
    }
    for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
  }
}

static const char *zsink_endpoint(const ev_sink *base, bool replay) {
  const zsink *z = (const zsink *)base;
  if (replay) return z->router ? z->rep : NULL;
  return z->ep;
}

static void zsink_close(ev_sink *base) {
  zsink *z = (zsink *)base;
  if (z->pub) {
    zmq_setsockopt(z->pub, ZMQ_LINGER, &z->linger_ms, sizeof z->linger_ms);
    zmq_close(z->pub);
  }
  if (z->router) {
    int zero = 0;
    zmq_setsockopt(z->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(z->router);
  }
  for (size_t i = 0; i < z->ring_cap; i++) free(z->ring[i].data);
  free(z->ring);
  free(z->topic);
  free(z);
}

static bool auto_binds(const char *ep) {
  return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
         !strncmp(ep, "inproc://", 9);
}

int kvbm__sink_zmq_create(void *zctx, const kvbm_zmq_sink_config *o, ev_sink **out,
                    kvbm_error *err) {
  if (!o || !o->endpoint || !*o->endpoint)
    return kvbm_error_set(err, KVBM_EINVAL, "events: zmq sink: no endpoint");
  if (o->hwm < 0 || o->linger_ms < -1)
    return kvbm_error_set(err, KVBM_EINVAL, "events: zmq sink: negative hwm or linger");
  if (o->replay_endpoint && o->replay_batches == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "events: zmq sink: replay buffer of 0 batches");
  zsink *z = calloc(1, sizeof *z);
  if (!z) return kvbm_error_set(err, KVBM_ENOMEM, "events: zmq sink: out of memory");
  z->base = (ev_sink){.wants_bytes = true, .send = zsink_send, .send_owned = zsink_send_owned,
                      .service = zsink_service,
                      .endpoint = zsink_endpoint, .close = zsink_close};
  z->linger_ms = o->linger_ms;
  z->legacy = o->replay_legacy;
  const char *topic = o->topic ? o->topic : "";
  z->topic_len = strlen(topic);
  z->topic = strdup(topic);
  int rc = KVBM_OK;
  if (!z->topic) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "events: zmq sink: out of memory");
    goto fail;
  }
  z->pub = zmq_socket(zctx, ZMQ_PUB);
  if (!z->pub) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: zmq sink: PUB socket: %s", zmq_strerror(errno));
    goto fail;
  }
  zmq_setsockopt(z->pub, ZMQ_SNDHWM, &o->hwm, sizeof o->hwm);
  bool bind = o->mode == KVBM_ZMQ_BIND || (o->mode == KVBM_ZMQ_AUTO && auto_binds(o->endpoint));
  if ((bind ? zmq_bind(z->pub, o->endpoint) : zmq_connect(z->pub, o->endpoint)) < 0) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: zmq sink: %s %s: %s", bind ? "bind" : "connect",
                        o->endpoint, zmq_strerror(errno));
    goto fail;
  }
  size_t sz = sizeof z->ep;
  if (!bind || zmq_getsockopt(z->pub, ZMQ_LAST_ENDPOINT, z->ep, &sz) < 0)
    snprintf(z->ep, sizeof z->ep, "%s", o->endpoint);
  if (o->replay_endpoint) {
    z->ring = calloc(o->replay_batches, sizeof *z->ring);
    z->ring_cap = o->replay_batches;
    z->router = zmq_socket(zctx, ZMQ_ROUTER);
    if (!z->ring || !z->router) {
      rc = kvbm_error_set(err, z->ring ? KVBM_EIO : KVBM_ENOMEM,
                          "events: zmq sink: replay socket or buffer: out of resources");
      goto fail;
    }
    int zero = 0, one = 1, timeout = 1000;
    zmq_setsockopt(z->router, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(z->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(z->router, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    if (zmq_bind(z->router, o->replay_endpoint) < 0) {
      rc = kvbm_error_set(err, KVBM_EIO, "events: zmq sink: bind replay %s: %s",
                          o->replay_endpoint, zmq_strerror(errno));
      goto fail;
    }
    sz = sizeof z->rep;
    if (zmq_getsockopt(z->router, ZMQ_LAST_ENDPOINT, z->rep, &sz) < 0)
      snprintf(z->rep, sizeof z->rep, "%s", o->replay_endpoint);
    z->base.poll_socket = z->router;
  }
  *out = &z->base;
  return KVBM_OK;
fail:
  z->linger_ms = 0;
  zsink_close(&z->base);
  return rc;
}
