/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink.h: where the publisher's batches go (private to the events module).
 *
 * A sink is a small vtable. The publisher thread is the only caller of
 * send/service; close runs after that thread has stopped. A sink that
 * wants bytes gets the encoded payload (encoded once per batch for all of
 * them; the ZMQ sink keeps the publisher's buffer instead of copying it,
 * send_owned); the callback sink gets the batch itself.
 */
#ifndef KVBM_EVENTS_SINK_H
#define KVBM_EVENTS_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/msgpack.h"
#include "kvbm/events.h"

typedef struct ev_sink ev_sink;

/* What servicing a sink's input socket did. */
typedef struct ev_service_counts {
  uint64_t replay_requests;
  uint64_t replay_bad;
} ev_service_counts;

/* A payload whose buffer a sink may keep past send (zero copy): it takes
 * a reference with retain(owner) and gives it back with release(data,
 * owner), from any thread (release is a zmq_free_fn). The publisher's
 * batch buffers are returned to its pool when the last one is given back. */
typedef struct ev_payload {
  uint8_t *data;
  size_t len;
  void (*retain)(void *owner);
  void (*release)(void *data, void *owner);
  void *owner;
} ev_payload;

struct ev_sink {
  bool wants_bytes;
  /* Sends one batch; returns 0 or a negative status (counted, not fatal). */
  int (*send)(ev_sink *s, const kvbm_event_batch *b, const uint8_t *payload, size_t len);
  /* Optional, used instead of send when the payload has an owner: the
   * same, with leave to keep the buffer instead of copying it. */
  int (*send_owned)(ev_sink *s, const kvbm_event_batch *b, const ev_payload *pl);
  /* A ZMQ socket with input to serve (the replay ROUTER), or NULL. */
  void *poll_socket;
  /* Serves whatever input is waiting on poll_socket, without blocking. */
  void (*service)(ev_sink *s, ev_service_counts *counts);
  /* The endpoint bound by the sink (replay: the ROUTER's); NULL if none. */
  const char *(*endpoint)(const ev_sink *s, bool replay);
  /* Lets queued output leave (bounded by the sink's linger), then frees. */
  void (*close)(ev_sink *s);
};

int kvbm__sink_callback_create(kvbm_batch_callback fn, void *user, ev_sink **out, kvbm_error *err);
int kvbm__sink_zmq_create(void *zctx, const kvbm_zmq_sink_config *o, ev_sink **out, kvbm_error *err);
int kvbm__sink_nats_create(const char *url, const char *subject, ev_sink **out, kvbm_error *err);
int kvbm__sink_jetstream_create(const kvbm_jetstream_config *c, ev_sink **out, kvbm_error *err);

/* 8-byte big-endian sequence frames (common/msgpack.h's byte order). */
static inline void ev_put_be64(uint8_t *p, uint64_t v) { kvbm__put_be(p, v, 8); }
static inline uint64_t ev_get_be64(const uint8_t *p) { return kvbm__get_be(p, 8); }

#endif
