/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink_callback.c: the in-process sink: the batch itself, no bytes.
 *
 * Called on the publisher thread, in order; the batch points into the
 * publisher's drain buffer, valid during the call only. The callback runs
 * with no publisher lock held, so a slow callback slows the thread (and,
 * once the queue fills, the producers) but cannot deadlock them.
 */
#include <stdlib.h>

#include "events/sink.h"


typedef struct csink {
  ev_sink base;
  kvbm_batch_callback fn;
  void *user;
} csink;

static int csink_send(ev_sink *base, const kvbm_event_batch *b, const uint8_t *payload,
                      size_t len) {
  (void)payload;
  (void)len;
  csink *c = (csink *)base;
  c->fn(c->user, b);
  return 0;
}

static void csink_close(ev_sink *base) { free(base); }

int kvbm__sink_callback_create(kvbm_batch_callback fn, void *user, ev_sink **out, kvbm_error *err) {
  if (!fn) return kvbm_error_set(err, KVBM_EINVAL, "events: callback sink: NULL function");
  csink *c = calloc(1, sizeof *c);
  if (!c) return kvbm_error_set(err, KVBM_ENOMEM, "events: callback sink: out of memory");
  c->base = (ev_sink){.send = csink_send, .close = csink_close};
  c->fn = fn;
  c->user = user;
  *out = &c->base;
  return KVBM_OK;
}
