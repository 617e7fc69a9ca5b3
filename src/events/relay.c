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
 * A decoded event names its medium as the engine wrote it (medium_name;
 * for the usual "GPU" or "CPU" the static kvbm_medium_name text). The
 * encoder writes exactly that text when medium_name is NULL, so the relay
 * drops such a name before publishing (plain_events): the bytes
 * downstream are the same, and the event is the publisher's plain one,
 * which its fast path and coalescing (kvbm events relay --coalesce) take,
 * while any named event is passed as it is. Only a batch that has such a
 * name is copied (into the relay's own array, reused).
 *
 * The relay renumbers, so downstream cannot see the engine restart in the
 * numbers: a batch the subscriber marks `reset` (a new stream) is preceded
 * by an AllBlocksCleared (of the same dp_rank), which says the same thing
 * in the events.
 */
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "kvbm/events.h"


struct kvbm_relay {
  kvbm_subscriber *sub;
  kvbm_publisher *dst;
  kvbm_relay_stats st;
  kvbm_event *copy; /* plain_events' array */
  size_t cap;
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
  free(r->copy);
  free(r);
}

const kvbm_subscriber *kvbm_relay_subscriber(const kvbm_relay *r) { return r ? r->sub : NULL; }

void kvbm_relay_stats_get(const kvbm_relay *r, kvbm_relay_stats *out) {
  if (r && out) *out = r->st;
}

/* Whether ev's medium_name is the text the encoder writes without it. */
static bool canonical_name(const kvbm_event *ev) {
  if (!ev->medium_name || ev->medium == KVBM_MEDIUM_OTHER) return false;
  const char *c = kvbm_medium_name(ev->medium); /* NULL for NONE: written as nil */
  return c && (ev->medium_name == c || !strcmp(ev->medium_name, c));
}

/* b's events with every canonical medium_name dropped (see the top): b's
 * own array when none has one, else the relay's copy; b's when the copy
 * cannot be had (the same events, only not plain). */
static const kvbm_event *plain_events(kvbm_relay *r, const kvbm_event_batch *b) {
  size_t i = 0;
  while (i < b->num_events && !canonical_name(&b->events[i])) i++;
  if (i == b->num_events ||
      kvbm__vec_reserve_of(&r->copy, &r->cap, b->num_events, 16, KVBM__VEC_NO_LIMIT))
    return b->events;
  memcpy(r->copy, b->events, b->num_events * sizeof *r->copy);
  for (; i < b->num_events; i++)
    if (canonical_name(&r->copy[i])) r->copy[i].medium_name = NULL;
  return r->copy;
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
  kvbm_event_batch pb = b;
  pb.events = plain_events(r, &b);
  rc = kvbm_publisher_publish_batch(r->dst, &pb, &queued, first ? &e2 : err);
  if (!first) first = rc;
  r->st.batches++;
  r->st.events += queued;
  r->st.skipped += b.skipped;
  r->st.refused += b.num_events - queued;
  if (batches) *batches = 1;
  return first;
}
