/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/storage_events.h: storage events, the KVBM seed's StoreEvent and
 * RemoveEvent: what a block manager tells a storage provider about the
 * blocks it writes into and removes from its volumes (G2, G3, G4), so that
 * the provider (kvbm advisor, kvbm/advisor.h) can index them per volume
 * without touching the manager. They are not vLLM's KV events
 * (kvbm/events.h): no tokens, one volume per event, bytes not tokens.
 *
 * Fields (docs/areas/storage-events.md has the wire specification):
 *   type              Store or Remove
 *   event_id          1, 2, 3, ... per publisher, dense: a consumer that
 *                     sees a jump lost events
 *   sequence_hash     the block's chained hash (the manager's sequence
 *                     hash, the volume key)
 *   prefix_hash       the request the block was stored for: the sequence
 *                     hash of that request's first block (so all blocks of
 *                     one prompt share it, and two prompts with the same
 *                     first block share it too: a prefix family). 0 when
 *                     unknown (a block restored at a warm restart)
 *   block_size        bytes the block takes in the volume
 *   storage_location  the volume's id (kvbm_volume_name: the name given at
 *                     registration, else its URL without user info)
 *   extra_metadata    a msgpack map of at most 16 entries, string keys,
 *                     scalar values (nil, bool, integer, float, string),
 *                     carried as bytes; kvbm reads the key "tier" ("G2",
 *                     "G3", "G4") and keeps the rest for the consumer
 *
 * Wire: one msgpack message per batch, [ts, [event, ...], source] with
 * event = ["Store" | "Remove", event_id, sequence_hash, prefix_hash,
 * block_size, storage_location, extra_metadata | nil, ...]; transported as
 * KV events are (ZMQ PUB topic | 8-byte big-endian batch sequence |
 * payload, a replay ROUTER; NATS with the Kvbm-Seq header), so the events
 * module's subscriber (raw mode) and sequence rules apply unchanged.
 */
#ifndef KVBM_STORAGE_EVENTS_H
#define KVBM_STORAGE_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/events.h"
#include "kvbm/status.h"
#include "kvbm/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_storage_event_type {
  KVBM_STORAGE_STORE = 1,  /* "Store": the block was written into the volume */
  KVBM_STORAGE_REMOVE = 2, /* "Remove": the block left it (evicted, moved, dropped) */
} kvbm_storage_event_type;

/* "Store", "Remove"; "?" for anything else. */
KVBM_EXTERN const char *kvbm_storage_event_type_name(int type);

#define KVBM_STORAGE_MAX_LOCATION 256  /* bytes of a volume id */
#define KVBM_STORAGE_MAX_METADATA 4096 /* bytes of extra_metadata */
#define KVBM_STORAGE_MAX_META_ENTRIES 16

/* One event. Strings and bytes are borrowed: in a decoded batch they point
 * into the payload (valid while it is); given to a publisher they are
 * copied before publish returns. */
typedef struct kvbm_storage_event {
  kvbm_storage_event_type type;
  uint64_t event_id;               /* assigned by the publisher (0 before) */
  uint64_t sequence_hash;
  uint64_t prefix_hash;
  uint64_t block_size;             /* bytes */
  const char *location;            /* storage_location (not NUL-terminated
                                    * in a decoded batch: use location_len) */
  size_t location_len;
  const uint8_t *extra_metadata;   /* msgpack map bytes, or NULL (nil) */
  size_t extra_metadata_len;
  int tier;                        /* extra_metadata's "tier" as a kvbm_tier,
                                    * or -1 when absent. Publishing: when
                                    * >= 0 and extra_metadata is NULL, the
                                    * publisher writes {"tier": "Gn"} */
} kvbm_storage_event;

typedef struct kvbm_storage_batch {
  uint64_t seq;          /* the transport's batch sequence number */
  double ts;             /* wall clock, seconds since the epoch */
  const char *source;    /* who published it (not NUL-terminated), may be empty */
  size_t source_len;
  const kvbm_storage_event *events;
  size_t num_events;
} kvbm_storage_batch;

/* ----------------------------------------------------------------- codec */

/* Appends the msgpack payload of a batch to *buf (grown with realloc;
 * *buf may be NULL, *cap 0). KVBM_EINVAL names the event and field that
 * cannot be encoded (a type outside the enum, an empty or too long
 * location or one with a NUL or control byte, metadata that is not a
 * valid map of scalars within the bounds above); KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_storage_encode(const kvbm_storage_batch *batch, uint8_t **buf, size_t *len,
                                    size_t *cap, kvbm_error *err);

typedef struct kvbm_storage_decoder kvbm_storage_decoder;

KVBM_EXTERN int kvbm_storage_decoder_create(kvbm_storage_decoder **out, kvbm_error *err);
KVBM_EXTERN void kvbm_storage_decoder_destroy(kvbm_storage_decoder *dec); /* NULL: no-op */

/* Decodes one payload, bounds-checked: every count is checked against the
 * bytes left before anything is sized by it, memory is at most one event
 * record per event (the decoder's array, reused), strings stay in the
 * payload. Refuses, naming the event and field: bad msgpack, a batch that
 * is not [ts, events, source?, ...], an unknown tag, an event with fewer
 * than 7 fields, a hash or size that is not an unsigned integer, a
 * location that is empty, over KVBM_STORAGE_MAX_LOCATION bytes or has a
 * NUL or control byte, metadata that is not nil or a map of at most
 * KVBM_STORAGE_MAX_META_ENTRIES string keys and scalar values (or is
 * longer than KVBM_STORAGE_MAX_METADATA bytes), a "tier" that is not
 * "G1".."G4", and trailing bytes. Fields after the seventh are skipped
 * (room to grow). out->events point into the decoder until its next use;
 * strings into `data`. */
KVBM_EXTERN int kvbm_storage_decode(kvbm_storage_decoder *dec, const void *data, size_t len,
                                    uint64_t seq, kvbm_storage_batch *out, kvbm_error *err);

/* One event as a JSON object (no newline), NUL-terminated in buf; returns
 * the length it needs, like snprintf. Metadata is written as a JSON object. */
KVBM_EXTERN size_t kvbm_storage_event_to_json(const kvbm_storage_event *ev, char *buf, size_t cap);

/* ------------------------------------------------------------- publisher */

/* A publisher of storage events: events are queued by publish (any
 * thread, never blocking by default), batched on the publisher's own
 * thread and sent to every sink: by period (a batch leaves when its oldest
 * event has waited period_ms; the seed's "every ~10 s") or by size (when
 * it holds max_batch_events), on flush and on destroy. Each batch carries
 * the next sequence number (0, 1, 2, ... per publisher) on the transport:
 * ZMQ sinks are the events module's (PUB + replay ROUTER), NATS sinks add
 * the Kvbm-Seq header, so kvbm_subscriber (raw) and the sequence rules
 * detect and recover gaps as for KV events. Event ids are given when an
 * event is accepted, so the ids that reach sinks are dense. */
typedef struct kvbm_storage_publisher kvbm_storage_publisher;

typedef struct kvbm_storage_publisher_config {
  const char *source;        /* written into every batch (copied); NULL: "" */
  uint32_t period_ms;        /* oldest event's wait before its batch leaves (10000; >= 1) */
  size_t max_batch_events;   /* a batch leaves when it holds this many (4096; >= 1) */
  size_t queue_events;       /* events waiting at most (65536; >= max_batch_events) */
  kvbm_overflow overflow;    /* DROP (default): publish returns KVBM_EAGAIN and
                              * counts it, so a manager never waits under its
                              * lock; BLOCK: publish waits for room */
} kvbm_storage_publisher_config;

KVBM_EXTERN kvbm_storage_publisher_config kvbm_storage_publisher_config_default(void);

/* Receives every batch (decoded form and its payload) on the publisher's
 * thread, valid during the call only; must not call back into it. */
typedef void (*kvbm_storage_batch_callback)(void *user, const kvbm_storage_batch *b,
                                            const uint8_t *payload, size_t len);

/* Creates a publisher with no sinks and no thread. KVBM_EINVAL for
 * inconsistent settings. Free with kvbm_storage_publisher_destroy. */
KVBM_EXTERN int kvbm_storage_publisher_create(const kvbm_storage_publisher_config *cfg,
                                              kvbm_storage_publisher **out, kvbm_error *err);

/* Sinks, before start (KVBM_ESTATE after); at most 8. Same contracts as
 * the KV publisher's kvbm_publisher_add_zmq / _add_nats. */
KVBM_EXTERN int kvbm_storage_publisher_add_zmq(kvbm_storage_publisher *pub,
                                               const kvbm_zmq_sink_config *zc, kvbm_error *err);
KVBM_EXTERN int kvbm_storage_publisher_add_nats(kvbm_storage_publisher *pub, const char *url,
                                                const char *subject, kvbm_error *err);
KVBM_EXTERN int kvbm_storage_publisher_add_callback(kvbm_storage_publisher *pub,
                                                    kvbm_storage_batch_callback fn, void *user,
                                                    kvbm_error *err);
/* The endpoint a ZMQ sink bound (its PUB, or its replay ROUTER), e.g. the
 * port picked for "tcp://127.0.0.1:*". KVBM_ENOTFOUND when there is none. */
KVBM_EXTERN int kvbm_storage_publisher_zmq_endpoint(const kvbm_storage_publisher *pub,
                                                    size_t sink_index, bool replay, char *buf,
                                                    size_t cap);

/* Starts the thread. */
KVBM_EXTERN int kvbm_storage_publisher_start(kvbm_storage_publisher *pub, kvbm_error *err);

/* Queues one event (copied; event_id and, when absent, the tier metadata
 * filled in). *event_id (may be NULL) gets its id. KVBM_EINVAL names a
 * field the wire cannot carry (kvbm_storage_encode's rules); KVBM_EAGAIN
 * when the queue is full under DROP (counted); KVBM_ECLOSED after destroy
 * began; KVBM_ESTATE before start. Cost: a copy of the event under one
 * mutex. */
KVBM_EXTERN int kvbm_storage_publish(kvbm_storage_publisher *pub, const kvbm_storage_event *ev,
                                     uint64_t *event_id, kvbm_error *err);

/* Sends what is queued now, without waiting for the period, and waits up
 * to timeout_ms (< 0: forever) until it has left. KVBM_ETIMEDOUT. */
KVBM_EXTERN int kvbm_storage_publisher_flush(kvbm_storage_publisher *pub, int timeout_ms,
                                             kvbm_error *err);

typedef struct kvbm_storage_publisher_stats {
  uint64_t published;      /* events accepted (the last id given) */
  uint64_t dropped;        /* refused for a full queue */
  uint64_t batches;        /* batches sent */
  uint64_t sink_errors;    /* sends a sink refused (batches lost on it) */
  uint64_t queued;         /* events waiting now */
  uint64_t replay_requests, replay_bad;
} kvbm_storage_publisher_stats;

KVBM_EXTERN void kvbm_storage_publisher_stats_get(kvbm_storage_publisher *pub,
                                                  kvbm_storage_publisher_stats *out);

/* Refuses new events, sends every accepted one, lets the sinks linger,
 * joins the thread and frees. NULL is a no-op. */
KVBM_EXTERN void kvbm_storage_publisher_destroy(kvbm_storage_publisher *pub);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_STORAGE_EVENTS_H */
