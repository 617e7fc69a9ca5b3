/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/events.h: the KV event plane: a batching publisher (ZMQ PUB with a
 * replay ROUTER, NATS, JetStream), a subscriber (ZMQ or NATS: ordering,
 * gaps, replay), a JetStream consumer, a relay, and the glue from a block
 * pool. The events themselves and their wire codec
 * are in kvbm/event_codec.h (included).
 *
 * The transport is vLLM's (vllm/distributed/kv_events.py):
 *
 *   ZMQ PUB, one message per batch, three frames:
 *     topic | sequence number (8 bytes, big-endian) | msgpack payload
 *   Replay: a ROUTER socket; a request [identity, "", start_seq (8 bytes
 *     big-endian)] is answered with [identity, "", topic, seq, payload] for
 *     every buffered batch with seq >= start_seq, then [identity, "", "",
 *     -1, ""] (vLLM since PR #45177; before it, and SGLang: without the
 *     topic frame). kvbm's subscriber reads both shapes; kvbm's sink writes
 *     the new one, the old by option.
 *
 *   NATS: one message per batch on a subject, the msgpack payload as its
 *     body and the sequence number as a header "Kvbm-Seq: <decimal>"
 *     (kvbm's NATS and JetStream sinks). No replay on NATS itself: a
 *     subscriber asks the engine's ZMQ replay ROUTER, which numbers the
 *     batches alike when one publisher has both sinks.
 */
#ifndef KVBM_EVENTS_H
#define KVBM_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/event_codec.h"
#include "kvbm/group.h"
#include "kvbm/pool.h"
#include "kvbm/status.h"
#include "kvbm/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------- sequence rules */

/* A stream's batch numbers (vLLM's sequence frame, kvbm's Kvbm-Seq header)
 * are not trusted blindly: an engine that restarts begins again at 0, and
 * one message with a huge number must not make every later batch look
 * old. A tracker classifies each number it is shown:
 *
 *   NEXT       the batch due: take it.
 *   GAP        ahead by at most max_gap: [kvbm_seqno_next(), seq) are
 *              missing; replay them if you can, then take this one.
 *   DUPLICATE  already taken (or given up as lost): skip it.
 *   RESTART    the stream went back: a new stream starts with this batch
 *              (forget what the source sent before; take it).
 *   HOLD       ahead by more than max_gap: not a new high-water mark. Keep
 *              the batch aside (or drop it); if `confirm` batches in a row
 *              continue it, the last of them is RESYNC.
 *   RESYNC     the held batches and this one continue one another: a new
 *              stream starts at the first held one (forget the old; take
 *              the held ones, then this one).
 *
 * A HOLD followed by anything else makes the held batches void: the call
 * stores their number in *discard and the caller drops them (they were a
 * stray number, not the stream).
 *
 * `live` says whether the numbers come from the live stream only (a PUB
 * socket or a NATS subject, which never go back by themselves: any step
 * back is a restart) or from a mix where repeats are normal (a live stream
 * and its replays fed to one consumer: only a step back of more than
 * max_gap is a restart; nearer ones are told by a batch's `reset` flag).
 *
 * The tracker is a plain value (no allocation, no locks): one per stream,
 * used by one thread at a time. */
typedef struct kvbm_seqno_rules {
  uint64_t max_gap;  /* a jump ahead of at most this many batches is a gap
                      * (default 100000) */
  uint32_t confirm;  /* batches in a row past a bigger jump that make it a
                      * new stream (default 3; 1 = at once) */
} kvbm_seqno_rules;

KVBM_EXTERN kvbm_seqno_rules kvbm_seqno_rules_default(void);

typedef enum kvbm_seqno_verdict {
  KVBM_SEQNO_NEXT = 0,
  KVBM_SEQNO_GAP = 1,
  KVBM_SEQNO_DUPLICATE = 2,
  KVBM_SEQNO_RESTART = 3,
  KVBM_SEQNO_HOLD = 4,
  KVBM_SEQNO_RESYNC = 5,
} kvbm_seqno_verdict;

/* The tracker's state; read it through the functions below. */
typedef struct kvbm_seqno_tracker {
  kvbm_seqno_rules rules;
  bool started, have_live;
  uint64_t next;      /* the batch due */
  uint64_t floor;     /* where the current stream began (for us) */
  uint64_t live_last; /* the last live number that belonged to the stream */
  uint32_t held;      /* HOLD batches kept aside */
  uint64_t held_first, held_next;
} kvbm_seqno_tracker;

/* A tracker that has seen nothing (rules NULL: the defaults). A zero
 * max_gap or confirm is taken as the default. */
KVBM_EXTERN void kvbm_seqno_init(kvbm_seqno_tracker *t, const kvbm_seqno_rules *rules);

/* Starts the stream at `first` before any number is seen (a late joiner
 * that asks for replay from there). */
KVBM_EXTERN void kvbm_seqno_start(kvbm_seqno_tracker *t, uint64_t first);

/* Classifies `seq` (see above) and moves the tracker; *discard (not NULL)
 * receives how many held batches became void. Take NEXT, GAP, RESTART and
 * RESYNC batches with kvbm_seqno_take, in order. */
KVBM_EXTERN kvbm_seqno_verdict kvbm_seqno_check(kvbm_seqno_tracker *t, uint64_t seq, bool live,
                                uint32_t *discard);

/* Records that batch `seq` was taken (delivered, applied); returns how many
 * batches before it were never taken (lost). */
KVBM_EXTERN uint64_t kvbm_seqno_take(kvbm_seqno_tracker *t, uint64_t seq);

/* The batch due next (the start of a GAP's missing range); 0 before any. */
KVBM_EXTERN uint64_t kvbm_seqno_next(const kvbm_seqno_tracker *t);

/* A verdict's name ("next", "gap", ...). */
KVBM_EXTERN const char *kvbm_seqno_verdict_name(kvbm_seqno_verdict v);

/* ------------------------------------------------------------- publisher */

typedef struct kvbm_publisher kvbm_publisher;

typedef enum kvbm_overflow {
  KVBM_OVERFLOW_BLOCK = 0,  /* publish waits for room in the queue */
  KVBM_OVERFLOW_DROP = 1,   /* publish drops the event, counts it and
                             * returns KVBM_EAGAIN */
} kvbm_overflow;

typedef struct kvbm_publisher_config {
  int32_t dp_rank;              /* stamped on every batch (but those of
                                 * kvbm_publisher_publish_batch) */
  size_t max_batch_events;      /* a batch is sent when it holds this many
                                 * events (>= 1; default 256); while full
                                 * batches keep coming, within a quarter
                                 * of max_batch_delay_us of filling, 50
                                 * to 200 us (the thread polls instead of
                                 * being woken for each) */
  uint32_t max_batch_delay_us;  /* ... or when its oldest event has waited
                                 * this long (0: at once; default 1000) */
  size_t queue_events;          /* bound of the queue in events (default
                                 * 65536, >= max_batch_events) */
  size_t queue_bytes;           /* bound in bytes of hashes + tokens +
                                 * names (default 64 MiB) */
  kvbm_overflow overflow;       /* what publish does when the queue is full */
  kvbm_event_form form;         /* wire form for the byte sinks (map) */
  bool signed_hashes;           /* hashes as int64 (kvbm_event_encoder_config) */
  bool coalesce;                /* off by default: what consumers see is
                                 * each event as published. On: one-block
                                 * BlockStored events that continue each
                                 * other (the next one's parent is the last
                                 * one's hash, full blocks, the same medium,
                                 * LoRA, group and block size, no names or
                                 * extras) leave as one multi-block
                                 * BlockStored, as vLLM sends a step's
                                 * blocks; one-block BlockRemoved events
                                 * of one medium and group as one
                                 * BlockRemoved. A store run and a remove
                                 * run may be open at once (a pool at
                                 * capacity alternates evict and register)
                                 * and leave in the order they opened:
                                 * stores and removes of different hashes
                                 * may be reordered within a batch, never
                                 * one hash's. Never across a batch, a
                                 * dp_rank or another event; ids are
                                 * still one per publish and
                                 * max_batch_events counts publishes. Only
                                 * with byte sinks (ZMQ, NATS, JetStream):
                                 * start refuses it beside a callback sink
                                 * (KVBM_EINVAL). Cost and trade-off:
                                 * docs/areas/events.md, Coalescing. */
} kvbm_publisher_config;

/* The defaults above; dp_rank 0, block on overflow, map form, unsigned
 * hashes. */
KVBM_EXTERN kvbm_publisher_config kvbm_publisher_config_default(void);

/* Receives every batch, in order, on the publisher's thread. The batch and
 * everything it points to are valid during the call only. Must not call
 * back into the publisher. */
typedef void (*kvbm_batch_callback)(void *user, const kvbm_event_batch *batch);

typedef enum kvbm_zmq_mode {
  KVBM_ZMQ_AUTO = 0,   /* vLLM's rule: bind when the endpoint has '*' or
                        * '::' or is ipc:// or inproc://, connect otherwise */
  KVBM_ZMQ_BIND = 1,
  KVBM_ZMQ_CONNECT = 2,
} kvbm_zmq_mode;

typedef struct kvbm_zmq_sink_config {
  const char *endpoint;          /* PUB endpoint (required) */
  kvbm_zmq_mode mode;
  const char *topic;             /* first frame; NULL = "" */
  const char *replay_endpoint;   /* ROUTER endpoint (bound), NULL = none */
  size_t replay_batches;         /* batches kept for replay (default 10000) */
  int hwm;                       /* PUB send high-water mark (default 100000) */
  int linger_ms;                 /* on shutdown, how long queued messages
                                  * may take to leave (default 2000) */
  bool replay_legacy;            /* replay replies [id, "", seq, payload] and
                                  * [id, "", -1, ""] as before vLLM PR
                                  * #45177 (false: with the topic, [id, "",
                                  * topic, seq, payload], end [id, "", "",
                                  * -1, ""], as vLLM today) */
} kvbm_zmq_sink_config;

KVBM_EXTERN kvbm_zmq_sink_config kvbm_zmq_sink_config_default(const char *endpoint);

/* Creates a publisher with no sinks and no thread yet. Free with
 * kvbm_publisher_destroy. KVBM_EINVAL for inconsistent options. */
KVBM_EXTERN int kvbm_publisher_create(const kvbm_publisher_config *opts, kvbm_publisher **out,
                       kvbm_error *err);

/* Sinks: add before kvbm_publisher_start (KVBM_ESTATE after). The
 * publisher owns what they create. */
KVBM_EXTERN int kvbm_publisher_add_callback(kvbm_publisher *pub, kvbm_batch_callback fn,
                                void *user, kvbm_error *err);
/* Binds/connects the PUB socket (and binds the ROUTER) now, so an address
 * error shows here. KVBM_EIO with zmq's message on failure. */
KVBM_EXTERN int kvbm_publisher_add_zmq(kvbm_publisher *pub, const kvbm_zmq_sink_config *opts,
                           kvbm_error *err);
/* Connects to the NATS server at `url` now and publishes every payload on
 * `subject`, with a header "Kvbm-Seq" (the decimal sequence number). The
 * payload is the same msgpack as the ZMQ third frame. */
KVBM_EXTERN int kvbm_publisher_add_nats(kvbm_publisher *pub, const char *url,
                            const char *subject, kvbm_error *err);

/* JetStream: the batches go into a stream, which keeps them (on the
 * server's disk by default) within its limits, so that readers that were
 * away, or start later, read them all (kvbm_js_consumer below): a router
 * restarts or runs replicas without asking any engine to replay. */
typedef struct kvbm_jetstream_config {
  const char *url;             /* nats://host:port (required) */
  const char *stream;          /* the stream's name (required; no dots,
                                * spaces or wildcards) */
  const char *subject;         /* where this publisher's batches go
                                * (required; no wildcard), e.g. kv.w7 */
  const char *stream_subjects; /* the subjects of a stream this sink adds,
                                * e.g. kv.> for every worker's (NULL:
                                * subject) */
  bool create;                 /* add the stream when missing (true) */
  bool memory;                 /* an added stream lives in memory, not on
                                * disk (false) */
  uint64_t max_msgs, max_bytes, max_age_s; /* an added stream's limits
                                * (0: none); the oldest batches go first */
  int max_pending;             /* publishes awaiting the server's ack (4096) */
  int linger_ms;               /* on shutdown, how long they may take (2000) */
} kvbm_jetstream_config;

KVBM_EXTERN kvbm_jetstream_config kvbm_jetstream_config_default(const char *url,
                                                                const char *stream,
                                                                const char *subject);

/* Connects now, finds the stream (or adds it: `create`), and publishes
 * every payload on `subject` with the "Kvbm-Seq" header, asynchronously:
 * a batch the server refuses or never acknowledges is counted in
 * sink_errors. KVBM_EINVAL (names), KVBM_EIO (server, JetStream off),
 * KVBM_ENOTFOUND (no stream, create false). */
KVBM_EXTERN int kvbm_publisher_add_jetstream(kvbm_publisher *pub,
                                             const kvbm_jetstream_config *cfg, kvbm_error *err);

/* The endpoint a ZMQ sink actually bound (e.g. the port picked for a
 * wildcard port, "tcp://127.0.0.1:*"); `sink_index` is the sink's position
 * among all sinks in the order they were added (callbacks and NATS count
 * too); `replay` selects the ROUTER. Copies the NUL-terminated text into
 * buf. KVBM_ENOTFOUND when that sink has no such socket, KVBM_ETOOLONG
 * when cap is too small. */
KVBM_EXTERN int kvbm_publisher_zmq_endpoint(const kvbm_publisher *pub, size_t sink_index,
                                bool replay, char *buf, size_t cap);

/* Starts the publisher thread. */
KVBM_EXTERN int kvbm_publisher_start(kvbm_publisher *pub, kvbm_error *err);

/* Queues one event (copying its arrays, names and carried bytes; what its
 * type does not carry is dropped) and, when event_id is not NULL, stores
 * the id it was given. Ids are given on acceptance, so dropped events use
 * none. Thread-safe. Returns KVBM_ESTATE before start, KVBM_ECLOSED once
 * shutdown began, KVBM_EAGAIN when dropped (overflow DROP), KVBM_EINVAL
 * for a bad event (a STORED without blocks or block size, a REMOVED
 * without blocks, anything kvbm_event_check refuses in the publisher's
 * form), KVBM_ETOOLONG for an event larger than queue_bytes. */
KVBM_EXTERN int kvbm_publisher_publish(kvbm_publisher *pub, const kvbm_event *ev,
                           uint64_t *event_id, kvbm_error *err);

/* Queues the events of a batch that comes from elsewhere (an engine's, in
 * a relay) as kvbm_publisher_publish does each, keeping the batch's
 * dp_rank: its events leave in batches of that rank (the publisher's own
 * when the batch has none). An event the publisher refuses is skipped and
 * the others queued; the first refusal's status is returned (err says
 * which), KVBM_OK when every event went; *queued (may be NULL) counts the
 * queued ones. KVBM_ECLOSED / KVBM_ESTATE stop at once. Thread-safe.
 * Cost: the events are checked before the lock, which is taken once for
 * up to 32 of them; those get consecutive ids (unless the queue was full
 * and a BLOCK publisher waited for room). */
KVBM_EXTERN int kvbm_publisher_publish_batch(kvbm_publisher *pub, const kvbm_event_batch *batch,
                                             size_t *queued, kvbm_error *err);

/* Dynamo KvEventPublisher-style helpers over kvbm_publisher_publish.
 * parent_hash and lora_id may be NULL (absent). */
KVBM_EXTERN int kvbm_publisher_publish_stored(kvbm_publisher *pub, const uint64_t *block_hashes,
                                  size_t num_blocks, const uint64_t *parent_hash,
                                  const uint32_t *token_ids, size_t num_tokens,
                                  uint32_t block_size, const int64_t *lora_id,
                                  kvbm_medium medium, uint64_t *event_id,
                                  kvbm_error *err);
KVBM_EXTERN int kvbm_publisher_publish_removed(kvbm_publisher *pub, const uint64_t *block_hashes,
                                   size_t num_blocks, kvbm_medium medium,
                                   uint64_t *event_id, kvbm_error *err);
KVBM_EXTERN int kvbm_publisher_publish_cleared(kvbm_publisher *pub, uint64_t *event_id,
                                   kvbm_error *err);

/* A producer's stage: one thread's events encoded into a buffer of its
 * own and handed to the publisher's queue under one lock for many events,
 * rather than one lock (and the queue's checks) per kvbm_publisher_publish
 * (issue 22; the cost: docs/areas/events.md, Session 11). For a thread
 * that publishes many events in a row: an engine's step, a pool's run of
 * registrations.
 *
 * Contract. A staged event is checked and encoded when staged (the same
 * refusals as kvbm_publisher_publish, returned by that call) but is not
 * yet accepted: it has no id, counts nowhere, kvbm_publisher_flush does
 * not see it and no timer sends it. It is accepted when the stage is
 * handed over: by kvbm_publisher_stage_flush, by the publish that fills
 * the stage (max_events), or by kvbm_publisher_stage_destroy. A hand-over
 * gives the stage's events the next ids in the order they were staged,
 * one after the other (no other thread's event between them unless the
 * queue was full and the hand-over waited for room, overflow BLOCK), so
 * ids on the wire still have no holes and follow acceptance. Under
 * overflow DROP the events that find no room are dropped and counted
 * (`dropped`) and the hand-over returns KVBM_EAGAIN; once shutdown began
 * it returns KVBM_ECLOSED and the staged events are lost. The stage is
 * empty after every hand-over, whatever it returned (err says how many
 * did not go). Where the publisher does not encode on publish (a
 * callback sink) or coalesces, a stage publishes each event at once, as
 * kvbm_publisher_publish does.
 *
 * Threads: one thread at a time per stage; any number of stages per
 * publisher. Create after kvbm_publisher_start (KVBM_ESTATE before);
 * destroy before kvbm_publisher_destroy. max_events: 0 = the publisher's
 * max_batch_events; above queue_events is KVBM_EINVAL. Cost: a staged
 * event allocates nothing in steady state (the buffer keeps its size). */
typedef struct kvbm_publisher_stage kvbm_publisher_stage;
KVBM_EXTERN int kvbm_publisher_stage_create(kvbm_publisher *pub, size_t max_events,
                                            kvbm_publisher_stage **out, kvbm_error *err);
/* Stages one event (copying what the wire carries of it, as msgpack):
 * KVBM_EINVAL / KVBM_ETOOLONG as kvbm_publisher_publish, KVBM_ENOMEM;
 * when it fills the stage, the hand-over's status. */
KVBM_EXTERN int kvbm_publisher_stage_publish(kvbm_publisher_stage *st, const kvbm_event *ev,
                                             kvbm_error *err);
/* Hands the staged events over (see above); KVBM_OK with none staged. */
KVBM_EXTERN int kvbm_publisher_stage_flush(kvbm_publisher_stage *st, kvbm_error *err);
/* Events staged and not yet handed over (0 for NULL). */
KVBM_EXTERN size_t kvbm_publisher_stage_count(const kvbm_publisher_stage *st);
/* Hands over what is staged (its status lost) and frees. NULL: no-op. */
KVBM_EXTERN void kvbm_publisher_stage_destroy(kvbm_publisher_stage *st);

/* Sends everything accepted before the call without waiting for the batch
 * to fill, and waits until the sinks have it (timeout_ms < 0: no limit).
 * Staged events are not accepted: hand them over first.
 * KVBM_ETIMEDOUT when time ran out. */
KVBM_EXTERN int kvbm_publisher_flush(kvbm_publisher *pub, int timeout_ms, kvbm_error *err);

typedef struct kvbm_publisher_stats {
  uint64_t accepted;        /* events queued (ids 0..accepted-1) */
  uint64_t dropped;         /* events refused by overflow DROP */
  uint64_t sent_events;     /* events handed to the sinks */
  uint64_t batches;         /* batches sent (next sequence number) */
  uint64_t sink_errors;     /* sends a sink failed (e.g. NATS down) */
  uint64_t replay_requests; /* replay requests answered */
  uint64_t replay_bad;      /* malformed replay requests ignored */
  uint64_t blocked;         /* publish calls that had to wait for room */
} kvbm_publisher_stats;
KVBM_EXTERN void kvbm_publisher_stats_get(kvbm_publisher *pub, kvbm_publisher_stats *out);

/* Shuts down: refuses new events, sends every accepted one, lets the
 * sockets drain (ZMQ linger, NATS flush), joins the thread and frees.
 * NULL is a no-op. */
KVBM_EXTERN void kvbm_publisher_destroy(kvbm_publisher *pub);

/* ------------------------------------------------------------ subscriber */

/* One engine's stream, read in order by one thread. The transport follows
 * the endpoint: tcp://, ipc://, ... is the engine's ZMQ PUB; nats://HOST:
 * PORT (or tls://, or a comma-separated list of servers) is a NATS server,
 * and `subject` the engine's subject. Both go through the same sequence
 * rules, replay, byte budget and counters; only where a live message comes
 * from differs. Not thread-safe: one thread per subscriber (libnats' own
 * thread only fills its queue; nothing of the subscriber runs on it). */
typedef struct kvbm_subscriber kvbm_subscriber;

typedef struct kvbm_subscriber_config {
  const char *endpoint;         /* the engine's PUB endpoint, or a NATS
                                 * server's URL (required) */
  const char *subject;          /* NATS: the engine's subject (required
                                 * there, refused with ZMQ; no wildcard:
                                 * one subscriber reads one stream) */
  bool bind;                    /* bind instead of connect (for engines
                                 * whose PUB connects; ZMQ only) */
  const char *topic;            /* ZMQ: subscription prefix; NULL = "" (all).
                                 * Both: a replay reply with a topic must
                                 * start with it */
  const char *replay_endpoint;  /* the engine's ROUTER; NULL = no recovery */
  int64_t start_seq;            /* -1: start at the first batch received;
                                 * >= 0: the first batch wanted (a late
                                 * joiner asks the replay socket at once) */
  int replay_timeout_ms;        /* a whole replay (request to end marker)
                                 * must be over within this; what came by
                                 * then is used, the rest counted lost
                                 * (default 2000) */
  size_t max_payload;           /* larger messages are refused (2 MiB):
                                 * counted (too_large) and returned as
                                 * KVBM_ETOOLONG, the connection kept. ZMQ:
                                 * a frame over twice this (at most
                                 * max_queue_bytes / 2) is cut by libzmq
                                 * unread and shows as a reconnect only */
  size_t max_queue_bytes;       /* the byte budget: the socket queues at most
                                 * max_queue_bytes / 2 / max_payload messages
                                 * (>= 1; NATS: libnats' queue at most
                                 * max_queue_bytes / 2 bytes) and the
                                 * subscriber keeps at most max_queue_bytes
                                 * / 2 bytes of replayed or held batches;
                                 * more is dropped and counted in overflow
                                 * (default 64 MiB; >= 2 * max_payload) */
  kvbm_seqno_rules seq;           /* see kvbm_seqno_check (zeros: defaults) */
  bool raw;                     /* payloads are not KV events: delivered
                                 * undecoded (recv_raw gives them; the batch
                                 * carries seq, lost_before, replayed, reset
                                 * and no events), for other messages on the
                                 * same transport (storage events) */
} kvbm_subscriber_config;

KVBM_EXTERN kvbm_subscriber_config kvbm_subscriber_config_default(const char *endpoint);

/* Opens the socket (ZMQ: connect or bind; the replay DEALER on first use)
 * or the NATS connection and subscription (and the replay DEALER at once).
 * A NATS subscriber's subscription is on the server when this returns, and
 * its connection redials for as long as it lives. KVBM_EINVAL for bad
 * options (err names which), KVBM_EIO when the endpoint is refused or the
 * NATS server does not answer, KVBM_ENOMEM. The config's strings are
 * copied. */
KVBM_EXTERN int kvbm_subscriber_create(const kvbm_subscriber_config *opts, kvbm_subscriber **out,
                        kvbm_error *err);
KVBM_EXTERN void kvbm_subscriber_destroy(kvbm_subscriber *sub); /* NULL is a no-op */

/* Returns the next batch in sequence order. When a live batch's sequence
 * number jumps ahead (by at most seq.max_gap), the subscriber asks the
 * replay socket for the missing ones and returns them first (replayed =
 * true); only replies inside the missing range, in increasing order, are
 * taken, and what replay cannot give within replay_timeout_ms is reported
 * in lost_before. Duplicates are skipped. A live number that goes back
 * starts a new stream (the engine restarted): that batch has reset = true.
 * A number further ahead than seq.max_gap is held aside, not believed,
 * until seq.confirm batches in a row continue it (then they come with
 * reset = true on the first); a stray one is dropped and counted (jumps).
 * The batch stays valid until the next call or free.
 * Returns KVBM_OK, KVBM_ETIMEDOUT (nothing within timeout_ms; < 0 waits
 * forever), or, for a malformed message (wrong frame count, a sequence
 * frame not 8 bytes, a NATS message without a decimal Kvbm-Seq header, a
 * payload that does not decode, one over max_payload), its error with err
 * saying what was wrong: the message is counted and skipped, and the next
 * call goes on. KVBM_EIO when the socket fails (NATS: the connection is
 * closed for good). Cost: a batch in order is decoded from the transport's
 * buffer, no copy; a gap's replay blocks this call up to
 * replay_timeout_ms. */
KVBM_EXTERN int kvbm_subscriber_recv(kvbm_subscriber *sub, int timeout_ms, kvbm_event_batch *out,
                         kvbm_error *err);

/* Like recv, and also gives the raw payload (valid as long as the batch). */
KVBM_EXTERN int kvbm_subscriber_recv_raw(kvbm_subscriber *sub, int timeout_ms,
                             kvbm_event_batch *out, const uint8_t **payload,
                             size_t *payload_len, kvbm_error *err);

typedef struct kvbm_subscriber_stats {
  uint64_t messages;        /* live messages received */
  uint64_t delivered;       /* batches returned */
  uint64_t events;          /* events in them */
  uint64_t duplicates;      /* batches skipped as already seen */
  uint64_t gaps;            /* jumps in the sequence seen */
  uint64_t replay_requests; /* requests sent to the replay socket */
  uint64_t replayed;        /* batches recovered by replay */
  uint64_t lost;            /* batches neither received nor replayed */
  uint64_t replay_failures; /* replay timeouts or malformed replies */
  uint64_t replay_topic;    /* replies in vLLM's shape with the topic
                             * (the others: the shape before it) */
  uint64_t malformed;       /* messages skipped, of all kinds below */
  uint64_t bad_frames;      /* wrong number of frames */
  uint64_t bad_seq;         /* sequence frame not 8 bytes (NATS: Kvbm-Seq
                             * header missing or not a number) */
  uint64_t bad_payload;     /* payload did not decode */
  uint64_t too_large;       /* payload over max_payload, refused */
  uint64_t resets;          /* new streams: restarts and re-syncs */
  uint64_t jumps;           /* batches held past a jump and dropped */
  uint64_t replay_refused;  /* replay replies outside the asked range or
                             * out of order, ignored */
  uint64_t overflow;        /* batches dropped for the byte budget
                             * (NATS: libnats' drops included) */
  uint64_t reconnects;      /* connections ended (the engine went away, or
                             * sent a frame over twice max_payload, which
                             * libzmq cuts unread) and dialled
                             * again (connect mode; NATS: libnats'
                             * reconnections to the server) */
  uint64_t queued_bytes;    /* bytes of batches held now */
  uint64_t peak_bytes;      /* the most ever held */
} kvbm_subscriber_stats;
KVBM_EXTERN void kvbm_subscriber_stats_get(const kvbm_subscriber *sub, kvbm_subscriber_stats *out);

/* ---------------------------------------------------- JetStream consumer */

/* Reads kvbm's batches from a JetStream stream through a durable consumer:
 * the server keeps its position under its name, so a reader that stops
 * goes on where it stood when it starts again, and readers with other
 * names each read the whole stream. Acks are cumulative (AckAll): ack what
 * you will not need again (a router: what its last snapshot holds); at
 * open, messages delivered but never acked come again, at once and in
 * order. Not thread-safe: one thread per consumer. */
typedef struct kvbm_js_consumer kvbm_js_consumer;

typedef struct kvbm_js_consumer_config {
  const char *url;          /* nats://host:port (required) */
  const char *stream;       /* the stream (required) */
  const char *durable;      /* the consumer's name (required) */
  const char *filter;       /* subjects to read (NULL: the whole stream) */
  uint64_t resume_after;    /* 0: where the consumer stands (the stream's
                             * start for a new one); N: from stream
                             * position N + 1 (what a snapshot recorded) */
  bool from_start;          /* (resume_after 0) from the stream's first
                             * message, wherever the consumer stood (a
                             * reader whose state starts empty) */
  int fetch;                /* messages asked per pull (256) */
  int64_t ack_wait_ms;      /* unacked this long: delivered again (60000) */
  size_t max_payload;       /* larger messages are refused (64 MiB) */
} kvbm_js_consumer_config;

KVBM_EXTERN kvbm_js_consumer_config kvbm_js_consumer_config_default(const char *url,
                                                                    const char *stream,
                                                                    const char *durable);

/* Connects, finds or adds the consumer and puts it where it should read
 * (see above). KVBM_EINVAL, KVBM_EIO (server, stream missing). */
KVBM_EXTERN int kvbm_js_consumer_create(const kvbm_js_consumer_config *cfg,
                                        kvbm_js_consumer **out, kvbm_error *err);
/* Leaves the consumer on the server (unacked messages stay unacked). */
KVBM_EXTERN void kvbm_js_consumer_destroy(kvbm_js_consumer *c); /* NULL is a no-op */

typedef struct kvbm_js_msg {
  uint64_t stream_seq;      /* the message's position in the stream */
  const char *subject;      /* valid until the next recv or free */
  bool redelivered;         /* the server delivered it before */
} kvbm_js_msg;

/* The next batch in stream order, its seq from the Kvbm-Seq header; *msg
 * (may be NULL) says where it sat. KVBM_ETIMEDOUT when nothing came within
 * timeout_ms (< 0: wait); a message without a valid Kvbm-Seq, over
 * max_payload or that does not decode is an error (err says which; *msg
 * is filled), counted, and the next call goes on; KVBM_EIO. The batch
 * stays valid until the next call or free. */
KVBM_EXTERN int kvbm_js_consumer_recv(kvbm_js_consumer *c, int timeout_ms,
                                      kvbm_event_batch *out, kvbm_js_msg *msg,
                                      kvbm_error *err);

/* Acks every message returned so far (synchronously: the server has it
 * when this returns). KVBM_EIO. */
KVBM_EXTERN int kvbm_js_consumer_ack(kvbm_js_consumer *c, kvbm_error *err);

typedef struct kvbm_js_consumer_stats {
  uint64_t messages;        /* messages taken from the stream */
  uint64_t delivered;       /* batches returned */
  uint64_t events;          /* events in them */
  uint64_t redelivered;     /* messages the server had delivered before */
  uint64_t malformed;       /* messages refused (header, size, payload) */
  uint64_t acks;            /* acks sent */
  uint64_t rebinds;         /* times the consumer was re-bound at open */
} kvbm_js_consumer_stats;
KVBM_EXTERN void kvbm_js_consumer_stats_get(const kvbm_js_consumer *c,
                                            kvbm_js_consumer_stats *out);

/* ----------------------------------------------------------------- relay */

/* Reads an engine's ZMQ events (vLLM, SGLang, another kvbm) and queues
 * them, in order, on a publisher of yours (its own sinks: NATS, ZMQ, ...),
 * as Dynamo's publisher does with zmq_endpoint. The events get the
 * publisher's ids and batches, and keep the engine's dp_rank and every
 * field they came with (see kvbm_event: what kvbm does not use is carried
 * through; write the map form, the default, to keep all of it). An engine
 * restart (a batch with `reset`) goes out as an AllBlocksCleared before
 * that batch's events, since the relay's own numbers do not go back. */
typedef struct kvbm_relay kvbm_relay;

/* `dst` is borrowed: it must be started and outlive the relay. */
KVBM_EXTERN int kvbm_relay_create(const kvbm_subscriber_config *src, kvbm_publisher *dst,
                   kvbm_relay **out, kvbm_error *err);
KVBM_EXTERN void kvbm_relay_destroy(kvbm_relay *relay); /* NULL is a no-op */

/* Waits up to timeout_ms for one batch and forwards it; *batches (may be
 * NULL) is 1 when one went through. A malformed input message is counted
 * and skipped: the call returns its error (err says what), and the relay
 * goes on at the next call. KVBM_ETIMEDOUT when nothing came. */
KVBM_EXTERN int kvbm_relay_poll(kvbm_relay *relay, int timeout_ms, size_t *batches,
                    kvbm_error *err);

/* The relay's subscriber, for its statistics. */
KVBM_EXTERN const kvbm_subscriber *kvbm_relay_subscriber(const kvbm_relay *relay);

typedef struct kvbm_relay_stats {
  uint64_t batches;  /* engine batches relayed */
  uint64_t events;   /* events queued on the publisher */
  uint64_t skipped;  /* events the decoder left out (unknown tag, a field
                      * of the wrong type: kvbm_event_batch.skipped) */
  uint64_t refused;  /* decoded events the publisher refused */
} kvbm_relay_stats;
/* Counters of the relay's own thread; call from it. */
KVBM_EXTERN void kvbm_relay_stats_get(const kvbm_relay *relay, kvbm_relay_stats *out);

/* ------------------------------------------------------------- pool link */

/* Glue from a block pool's listener to a publisher: every STORED becomes a
 * BlockStored of one block (hash, parent, the block's tokens, the pool's
 * block size), every REMOVED a BlockRemoved, CLEARED an AllBlocksCleared,
 * all with this link's medium, in the pool's order. The caller owns the
 * link (it must outlive its use by the pool).
 *
 * Groups (vLLM's KV cache groups, kvbm/group.h): in a pool of several
 * groups (kvbm_pool_num_groups > 1), or once kvbm_pool_link_set_groups gave
 * the link a list, every BlockStored and BlockRemoved carries the pool
 * event's group as group_idx, as vLLM's do; a BlockStored also carries the
 * group's kv_cache_spec_kind (kvbm_group_kind_name) and, for a sliding
 * window, kv_cache_spec_sliding_window = W (vLLM sends a window for
 * SlidingWindowSpec only, none for chunked local or Mamba). A BlockRemoved
 * carries no kind (vLLM: "remove events only need group_idx + hash"). A
 * pool event whose group has no spec in the list carries group_idx alone.
 * A pool of one group with no list publishes no group at all: the bytes
 * are those of kvbm before groups. */
typedef struct kvbm_pool_link {
  kvbm_publisher *pub;
  kvbm_medium medium;
  uint32_t block_size;
  uint64_t forwarded;       /* events the publisher took */
  uint64_t failed;          /* events it refused (dropped, closed, ...) */
  int last_status;          /* the last refusal's status */
  uint32_t pool_groups;     /* kvbm_pool_num_groups at attach */
  bool with_groups;         /* events carry group_idx (see above) */
  uint32_t num_groups;      /* specs in groups[] (0: none given) */
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
} kvbm_pool_link;

/* Fills the link and installs it as the pool's listener. */
KVBM_EXTERN int kvbm_pool_link_attach(kvbm_pool_link *link, kvbm_pool *pool, kvbm_publisher *pub,
                          kvbm_medium medium, kvbm_error *err);

/* Gives the link its groups' specs (copied), index i describing the pool's
 * group i; from then on every event carries group_idx, and BlockStored
 * the spec (see above). n == 0 forgets them (a pool of one group goes back
 * to no group at all). Call before the pool emits events the link must
 * describe, on the pool's thread. KVBM_EINVAL, with a message naming the
 * group, for a NULL link, groups NULL with n > 0, more than
 * KVBM_GROUPS_MAX specs, an unknown kind, a sliding window or chunk of 0
 * or above KVBM_GROUP_MAX_TOKENS, or tokens on a full or Mamba group; the
 * link is unchanged then. */
KVBM_EXTERN int kvbm_pool_link_set_groups(kvbm_pool_link *link, const kvbm_group_spec *groups,
                                          size_t n, kvbm_error *err);

/* The listener itself (user = a kvbm_pool_link*), for pools set up by hand. */
KVBM_EXTERN void kvbm_pool_link_listener(void *user, const kvbm_pool_event *ev);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_EVENTS_H */
