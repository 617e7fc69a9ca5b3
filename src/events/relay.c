/* SPDX-License-Identifier: Apache-2.0 */
/*
 * relay.c: an engine's ZMQ events, re-published through a kvbm publisher.
 *
 * As Dynamo's KvEventPublisher does with zmq_endpoint: the subscriber side
 * keeps the engine's order and recovers its gaps by replay; each batch's
 * events then go through kvbm_publisher_publish_batch, so they get the
 * publisher's ids, batching and sinks (NATS, our own ZMQ endpoint with
 * replay) while keeping the engine's dp_rank. Re-encoding instead of
 * forwarding the bytes costs a little and buys one wire form downstream
 * whatever the engine spoke (positional or map, int or bytes hashes), and
 * validation of everything that passes. Nothing is lost on the way: the
 * decoded event keeps what kvbm does not use (extra_keys, the salt, the
 * group's kind and window, locality, ownership, token pairs, unnamed
 * fields as their msgpack bytes) and the encoder writes it back.
 *
 * The relay renumbers, so downstream cannot see the engine restart in the
 * numbers: a batch the subscriber marks `reset` (a new stream) is preceded
 * by an AllBlocksCleared (of the same dp_rank), which says the same thing
 * in the events.
 */
#include <stdlib.h>

#include "kvbm/events.h"


struct kvbm_relay {
  kvbm_subscriber *sub;
  kvbm_publisher *dst;
  kvbm_relay_stats st;
};

int kvbm_relay_create(const kvbm_subscriber_config *src, kvbm_publisher *dst, kvbm_relay **out,
                   kvbm_error *err) {
  if (!src || !dst || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: relay: NULL argument");
  kvbm_relay *r = calloc(1, sizeof *r);
  if (!r) return kvbm_error_set(err, KVBM_ENOMEM, "events: relay: out of memory");
  int rc = kvbm_subscriber_create(src, &r->sub, err);
  if (rc) {
    free(r);
    return rc;
  }
  r->dst = dst;
  *out = r;
  return KVBM_OK;
}

void kvbm_relay_destroy(kvbm_relay *r) {
  if (!r) return;
  kvbm_subscriber_destroy(r->sub);
  free(r);
}

const kvbm_subscriber *kvbm_relay_subscriber(const kvbm_relay *r) { return r ? r->sub : NULL; }

void kvbm_relay_stats_get(const kvbm_relay *r, kvbm_relay_stats *out) {
  if (r && out) *out = r->st;
}

int kvbm_relay_poll(kvbm_relay *r, int timeout_ms, size_t *batches, kvbm_error *err) {
  if (batches) *batches = 0;
  if (!r) return kvbm_error_set(err, KVBM_EINVAL, "events: relay: NULL");
  kvbm_event_batch b;
  int rc = kvbm_subscriber_recv(r->sub, timeout_ms, &b, err);
  if (rc) return rc;
  /* An event the publisher refuses (say a BlockStored without blocks from
   * a sloppy engine) is skipped; the rest of the batch still goes, and the
   * first refusal is what the call reports. */
  int first = KVBM_OK;
  if (b.reset) {
    kvbm_event clear = {.type = KVBM_EVENT_CLEARED};
    kvbm_event_batch cb = {.dp_rank = b.dp_rank, .has_dp_rank = b.has_dp_rank, .events = &clear,
                           .num_events = 1};
    first = kvbm_publisher_publish_batch(r->dst, &cb, NULL, err);
  }
  size_t queued = 0;
  kvbm_error e2;
  rc = kvbm_publisher_publish_batch(r->dst, &b, &queued, first ? &e2 : err);
  if (!first) first = rc;
  r->st.batches++;
  r->st.events += queued;
  r->st.skipped += b.skipped;
  r->st.refused += b.num_events - queued;
  if (batches) *batches = 1;
  return first;
}
