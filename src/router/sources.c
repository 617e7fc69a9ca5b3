/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sources.c: the router daemon's event subscriptions.
 *
 * ZMQ and NATS: one thread per worker runs the events module's subscriber
 * (kvbm_subscriber: the worker's PUB endpoint, or its NATS subject with the
 * Kvbm-Seq header), which orders batches by the stream's sequence rules,
 * recovers gaps through the worker's ZMQ replay socket when the source
 * names one, keeps within its byte budget (NATS: libnats' queue, its drops
 * counted in `overflow`) and counts what it lost; this file only applies
 * each batch to the index under the writer lock and copies the
 * subscriber's counters for /health.
 *
 * A batch with `reset` (the worker restarted, or its stream re-synced
 * after a jump) makes the index forget every rank of that worker before it
 * is applied (kvbm_index_apply_batch), so a restarted engine is heard at
 * once, from its first batch.
 *
 * JetStream: one thread per worker reads the worker's subject of a stream
 * through a durable consumer (kvbm_js_consumer, named "<durable>-<worker
 * id>"). The stream is the log: a router that restarts, or a replica,
 * reads it again from a position instead of asking the engine. Which
 * position: the one its snapshot recorded (snapshot.c), else the stream's
 * start (an empty index needs the whole log). The consumer is acked up to
 * what the source had read when a snapshot was written, so the server's
 * view of the consumer (its ack floor, pending count) follows the router.
 * The Kvbm-Seq numbers go through the same sequence rules, with confirm 1
 * (a log has no stray numbers: a jump past max_gap is a new stream at
 * once); a gap in the log (the stream's limits dropped messages, or the
 * publisher's writes were refused) is asked for at the replay socket when
 * the source names one.
 *
 * DEGRADED: a worker whose stream lost batches that replay did not give
 * back is known to be incomplete in the index (blocks it stored may be
 * missing; blocks it removed may still be there). It is marked from the
 * first such batch until its engine starts a new stream (reset) or clears
 * its cache (AllBlocksCleared), after which the index is whole again;
 * /health lists it and /route routes it as approximate mode would.
 *
 * Each source may fill at most max_ranks worker slots with dp ranks: a
 * batch of a further rank is refused and counted (ranks_refused), so one
 * worker sending ranks 0..99 cannot lock the others out of the index's 64
 * slots.
 *
 * Every source stamps the time of its last batch; the daemon's
 * housekeeping drops the workers of a source silent for longer than
 * worker_timeout_s (a worker that went away must not attract requests),
 * and they come back with the next batch.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/clock.h"
#include "events/replay.h"
#include "kvbm/metrics.h"
#include "router/daemon_impl.h"

int64_t kvbm__rd_now_ns(void) { return (int64_t)kvbm_clock_ns(); }

#define ADD(c, v) atomic_fetch_add(&(c), (v))

/* ---------------------------------------------------------------- ranks */

/* Writer lock held. Whether the batch's dp rank may have a worker slot:
 * known, or a new one within max_ranks. */
static bool admit_rank(source *s, const kvbm_event_batch *b) {
  uint32_t rank = b->has_dp_rank ? (uint32_t)b->dp_rank : 0;
  for (uint32_t i = 0; i < s->nranks; i++)
    if (s->ranks[i] == rank) return true;
  if (s->nranks >= s->d->cfg.max_ranks) return false;
  s->ranks[s->nranks++] = rank;
  return true;
}

/* ---------------------------------------------------------------- apply */

static bool has_clear(const kvbm_event_batch *b) {
  for (size_t i = 0; i < b->num_events; i++)
    if (b->events[i].type == KVBM_EVENT_CLEARED) return true;
  return false;
}

/* Marks or clears the worker's DEGRADED state by what this batch says. */
static void judge(source *s, const kvbm_event_batch *b) {
  bool was = atomic_load(&s->degraded);
  bool now = (was || b->lost_before) && !b->reset && !has_clear(b);
  if (now == was) return;
  atomic_store(&s->degraded, now);
  if (now)
    kvbm__rd_log(s->d, "worker %" PRIu64 ": DEGRADED: %" PRIu64 " batch(es) before %" PRIu64
                 " lost and not replayed; routed approximately until it restarts or clears "
                 "its cache", s->cfg.worker_id, b->lost_before, b->seq);
  else
    kvbm__rd_log(s->d, "worker %" PRIu64 ": whole again at batch %" PRIu64 " (a new stream or a "
                 "cleared cache)", s->cfg.worker_id, b->seq);
}

/* Counts what became of each event of a batch, for Dynamo's
 * kv_cache_events_applied: the index's own counters, read before and after
 * the batch under the writer lock (only the writer moves them), say how
 * many were applied and whether the batch was skipped as a duplicate. */
static void count_outcomes(kvbm_router_daemon *d, const kvbm_event_batch *b, bool admitted,
                           const kvbm_index_stats *before, const kvbm_index_stats *after) {
  uint64_t applied = after->events - before->events;
  bool dup = after->duplicates != before->duplicates;
  for (size_t i = 0; i < b->num_events; i++) {
    int type = b->events[i].type - KVBM_EVENT_STORED;
    if (type < 0 || type > 2) continue;
    int out = !admitted       ? RD_RANK_REFUSED
              : i < applied   ? RD_OK
              : dup           ? RD_DUPLICATE
              : i == applied  ? RD_ERROR
                              : RD_NOT_APPLIED;
    atomic_fetch_add(&d->applied[type][out], 1);
  }
}

/* The source's counts for one batch. Bumped under wlock, before the
 * index is unlocked: whoever sees the batch in the index (a /route, an
 * overlap) sees it counted too. Returns whether this refusal is the
 * first or a 1024th (to be logged). */
static bool count_batch_locked(source *s, const kvbm_event_batch *b, bool admitted, int rc) {
  ADD(s->n.batches, 1);
  if (b->skipped) ADD(s->n.skipped_events, b->skipped); /* the decoder left them out */
  if (b->reset) ADD(s->n.resets, 1);
  if (rc) ADD(s->n.errors, 1);
  /* log the first refusal and then every 1024th, not every batch */
  return !admitted && ADD(s->n.ranks_refused, 1) % 1024 == 0;
}

/* The index slots of worker_id's ranks (a mask). Writer lock held. */
static uint64_t worker_slots(const kvbm_index *idx, uint64_t worker_id) {
  uint64_t m = 0;
  for (uint32_t slot = 0; slot < KVBM_ROUTER_MAX_WORKERS; slot++) {
    kvbm_worker_key k;
    if (kvbm_index_slot_worker(idx, slot, &k) && k.worker_id == worker_id) m |= 1ull << slot;
  }
  return m;
}

/* The approximate records (approximate mode's, a degraded worker's
 * decisions) of the slots whose blocks the index forgot go with them
 * (kvbm__approx_forget says why). Writer lock held. */
static void forget_records(kvbm_router_daemon *d, uint64_t slots) {
  for (uint32_t slot = 0; slots; slot++, slots >>= 1) {
    if (!(slots & 1)) continue;
    kvbm__approx_forget(d->approx, slot);
    kvbm__approx_forget(d->degraded_ap, slot);
  }
}

/* Which slots a batch made the index forget: a reset every rank the
 * worker had (wiped, read before the batch), a clear or an id gone back
 * (the index's clears and resets moved) the batch's own rank. */
static uint64_t wiped_slots(kvbm_router_daemon *d, const kvbm_event_batch *b, uint64_t wiped,
                            const kvbm_index_stats *before, const kvbm_index_stats *after,
                            uint64_t worker_id) {
  if (after->cleared == before->cleared && after->resets == before->resets) return wiped;
  kvbm_worker_key key = {worker_id, b->has_dp_rank ? (uint32_t)b->dp_rank : 0};
  uint32_t slot;
  if (kvbm_index_worker_slot(d->idx, key, &slot) == KVBM_OK) wiped |= 1ull << slot;
  return wiped;
}

/* js_pos: the JetStream position of the batch (0: not JetStream). */
static void apply_at(source *s, const kvbm_event_batch *b, uint64_t js_pos) {
  kvbm_router_daemon *d = s->d;
  kvbm_error err = {0};
  int rc = KVBM_OK;
  kvbm_index_stats before, after;
  pthread_mutex_lock(&d->wlock);
  if (b->reset) s->nranks = 0; /* the index forgets the worker's ranks */
  bool admitted = admit_rank(s, b);
  uint64_t wiped = admitted && b->reset ? worker_slots(d->idx, s->cfg.worker_id) : 0;
  kvbm_index_stats_get(d->idx, &before);
  if (admitted) rc = kvbm_index_apply_batch(d->idx, s->cfg.worker_id, b, &err);
  if (js_pos) s->js_pos = js_pos, atomic_store(&s->n.js_pos, js_pos);
  judge(s, b);
  kvbm_index_stats_get(d->idx, &after);
  if (admitted) forget_records(d, wiped_slots(d, b, wiped, &before, &after, s->cfg.worker_id));
  count_outcomes(d, b, admitted, &before, &after);
  bool log_refusal = count_batch_locked(s, b, admitted, rc);
  pthread_mutex_unlock(&d->wlock);
  atomic_store(&s->last_ns, kvbm__rd_now_ns());
  if (atomic_exchange(&s->dropped, 0))
    kvbm__rd_log(d, "worker %" PRIu64 ": events again, back in the index", s->cfg.worker_id);
  if (b->reset)
    kvbm__rd_log(d, "worker %" PRIu64 ": a new stream at batch %" PRIu64 " (restarted): its blocks "
           "are forgotten", s->cfg.worker_id, b->seq);
  if (log_refusal)
    kvbm__rd_log(d, "worker %" PRIu64 ": dp rank %d refused: the source already has %u ranks",
           s->cfg.worker_id, (int)b->dp_rank, d->cfg.max_ranks);
  if (rc) kvbm__rd_log(d, "worker %" PRIu64 ": batch %" PRIu64 ": %s", s->cfg.worker_id, b->seq, err.msg);
}

static void apply(source *s, const kvbm_event_batch *b) { apply_at(s, b, 0); }

bool kvbm__rd_worker_degraded(const kvbm_router_daemon *d, uint64_t worker_id) {
  for (size_t i = 0; i < d->nsrc; i++)
    if (d->src[i].cfg.worker_id == worker_id) return atomic_load(&d->src[i].degraded);
  return false;
}

/* ------------------------------------------------------------ ZMQ, NATS */

/* The subscriber's own counters, for /health (the source's thread only). */
static void sync_counts(source *s) {
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s->sub, &st);
  atomic_store(&s->n.lost, st.lost);
  atomic_store(&s->n.replayed, st.replayed);
  atomic_store(&s->n.duplicates, st.duplicates);
  atomic_store(&s->n.jumps, st.jumps);
  atomic_store(&s->n.replay_failures, st.replay_failures);
  atomic_store(&s->n.replay_refused, st.replay_refused);
  atomic_store(&s->n.overflow, st.overflow);
  uint64_t was = atomic_exchange(&s->n.reconnects, st.reconnects);
  if (s->cfg.kind == KVBM_SOURCE_NATS && st.reconnects > was)
    kvbm__rd_log(s->d, "worker %" PRIu64 ": NATS reconnected (batches sent meanwhile show as "
                 "lost)", s->cfg.worker_id);
  atomic_store(&s->n.gaps, st.gaps);
  atomic_store(&s->n.replay_requests, st.replay_requests);
  atomic_store(&s->n.messages, st.messages);
  atomic_store(&s->n.malformed, st.malformed);
}

static void *sub_thread(void *arg) {
  source *s = arg;
  while (!atomic_load(&s->d->stop)) {
    kvbm_event_batch b;
    kvbm_error err = {0};
    int rc = kvbm_subscriber_recv(s->sub, 100, &b, &err);
    sync_counts(s); /* before the batch shows: a reader sees its replay counted with it */
    if (rc == KVBM_OK) apply(s, &b);
    if (rc == KVBM_OK || rc == KVBM_ETIMEDOUT) continue;
    ADD(s->n.errors, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": %s", s->cfg.worker_id, err.msg);
    if (rc == KVBM_EIO) {
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL); /* a failing socket: do not spin */
    }
  }
  return NULL;
}

/* ------------------------------------------------------ replay (JetStream) */

/* Decodes and applies one replayed batch of a JetStream source's stream
 * (its number taken by the sequence tracker: the batches it passed over
 * are counted lost). */
static void apply_payload(source *s, uint64_t seq, const void *data, size_t len) {
  uint64_t lost = kvbm_seqno_take(&s->seq, seq);
  ADD(s->n.lost, lost);
  kvbm_event_batch b;
  kvbm_error err = {0};
  if (len > s->d->cfg.max_payload) {
    ADD(s->n.errors, 1);
    ADD(s->n.malformed, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": batch %" PRIu64 " of %zu bytes is over the limit %zu",
           s->cfg.worker_id, seq, len, s->d->cfg.max_payload);
    return;
  }
  if (kvbm_event_decode(s->dec, data, len, seq, &b, &err)) {
    ADD(s->n.errors, 1);
    ADD(s->n.malformed, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": replayed batch: %s", s->cfg.worker_id, err.msg);
    return;
  }
  b.lost_before = lost;
  b.replayed = true;
  ADD(s->n.replayed, 1); /* counted before the batch shows in the index */
  apply(s, &b);
}

static int take_reply(void *user, uint64_t seq, const uint8_t *data, size_t len) {
  apply_payload(user, seq, data, len);
  return 0;
}

/* Asks the replay socket for batches [from, to) and applies them in order
 * (nothing is queued: each reply goes to the index as it comes). */
static void replay(source *s, uint64_t from, uint64_t to) {
  kvbm__replay_window w;
  kvbm__replay_window_init(&w, from, to, s->d->cfg.replay_timeout_ms, SIZE_MAX,
                           s->d->cfg.max_payload, kvbm_clock_ns());
  kvbm__replay_result r;
  kvbm__replay_fetch(s->zctx, &s->dealer, s->cfg.replay_endpoint, &w, take_reply, s, &r);
  ADD(s->n.replay_refused, r.refused);
  if (r.failed) ADD(s->n.replay_failures, 1);
  kvbm__rd_log(s->d, "worker %" PRIu64 ": gap %" PRIu64 "..%" PRIu64 ", %" PRIu64 " replayed%s%s",
         s->cfg.worker_id, from, to - 1, r.taken, r.failed ? ": " : "", r.failed ? r.why : "");
}

/* ------------------------------------------------------------ JetStream */

/* Acks what the consumer returned so far when a snapshot was written since
 * the last ack (the source's thread, or after it stopped). */
static void js_ack(source *s) {
  uint64_t gen = atomic_load(&s->d->snapshots);
  if (gen == s->acked_gen) return;
  kvbm_error err = {0};
  if (kvbm_js_consumer_ack(s->js, &err)) {
    ADD(s->n.errors, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": %s", s->cfg.worker_id, err.msg);
    return;
  }
  s->acked_gen = gen;
}

static void js_sync_counts(source *s) {
  kvbm_js_consumer_stats st;
  kvbm_js_consumer_stats_get(s->js, &st);
  atomic_store(&s->n.messages, st.messages);
  atomic_store(&s->n.js_redelivered, st.redelivered);
  atomic_store(&s->n.js_malformed, st.malformed);
  atomic_store(&s->n.js_acks, st.acks);
  atomic_store(&s->n.js_rebinds, st.rebinds);
}

static void js_take(source *s, const kvbm_event_batch *b0, uint64_t pos, bool reset) {
  kvbm_event_batch b = *b0;
  b.lost_before = kvbm_seqno_take(&s->seq, b.seq);
  b.reset = reset;
  ADD(s->n.lost, b.lost_before);
  apply_at(s, &b, pos);
}

/* Only the position moves (a batch not applied: a duplicate, a stray). */
static void js_passed(source *s, uint64_t pos) {
  if (!pos) return;
  pthread_mutex_lock(&s->d->wlock);
  s->js_pos = pos;
  atomic_store(&s->n.js_pos, pos);
  pthread_mutex_unlock(&s->d->wlock);
}

static void js_batch(source *s, const kvbm_event_batch *b, uint64_t pos) {
  uint64_t due = kvbm_seqno_next(&s->seq);
  uint32_t voided = 0;
  kvbm_seqno_verdict v = kvbm_seqno_check(&s->seq, b->seq, true, &voided);
  ADD(s->n.jumps, voided);
  switch (v) {
    case KVBM_SEQNO_DUPLICATE:
      ADD(s->n.duplicates, 1);
      js_passed(s, pos);
      return;
    case KVBM_SEQNO_HOLD: /* the end marker's number, or a jump not yet believed */
      ADD(s->n.jumps, 1);
      js_passed(s, pos);
      return;
    case KVBM_SEQNO_GAP:
      if (s->cfg.replay_endpoint) replay(s, due, b->seq);
      js_take(s, b, pos, false);
      return;
    case KVBM_SEQNO_RESTART:
    case KVBM_SEQNO_RESYNC:
      js_take(s, b, pos, true);
      return;
    case KVBM_SEQNO_NEXT:
      js_take(s, b, pos, false);
      return;
  }
}

static void *js_thread(void *arg) {
  source *s = arg;
  while (!atomic_load(&s->d->stop)) {
    kvbm_event_batch b;
    kvbm_js_msg m = {0};
    kvbm_error err = {0};
    int rc = kvbm_js_consumer_recv(s->js, 100, &b, &m, &err);
    if (rc == KVBM_OK) js_batch(s, &b, m.stream_seq);
    js_ack(s);
    js_sync_counts(s);
    if (rc == KVBM_OK || rc == KVBM_ETIMEDOUT) continue;
    ADD(s->n.errors, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": %s", s->cfg.worker_id, err.msg);
    if (rc == KVBM_EIO) {
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL); /* the server is away: libnats reconnects */
    } else {
      js_passed(s, m.stream_seq); /* a bad message: its place is taken */
    }
  }
  return NULL;
}

static int start_jetstream(source *s, kvbm_error *err) {
  const kvbm_router_source *c = &s->cfg;
  if (!c->subject || !*c->subject || !c->stream || !*c->stream)
    return kvbm_error_set(err, KVBM_EINVAL, "router: JetStream source of worker %" PRIu64
                          " needs a stream and a subject", c->worker_id);
  int rc = kvbm_event_decoder_create(&s->dec, err); /* for replies of the replay socket */
  if (rc) return rc;
  kvbm_seqno_rules rules = kvbm_seqno_rules_default();
  rules.confirm = 1;
  kvbm_seqno_init(&s->seq, &rules);
  if (c->replay_endpoint && (!(s->zctx = zmq_ctx_new()) ||
                             kvbm__replay_open(s->zctx, &s->dealer, c->replay_endpoint)))
    return kvbm_error_set(err, KVBM_EIO, "router: worker %" PRIu64 ": replay socket %s: %s",
                          c->worker_id, c->replay_endpoint, zmq_strerror(errno));
  char name[256];
  snprintf(name, sizeof name, "%s-%" PRIu64, s->d->cfg.durable, c->worker_id);
  kvbm_js_consumer_config o = kvbm_js_consumer_config_default(c->endpoint, c->stream, name);
  o.filter = c->subject;
  o.max_payload = s->d->cfg.max_payload;
  /* where the index stands: the snapshot's position, else the log's start */
  if (s->resume_after) o.resume_after = s->resume_after;
  else o.from_start = true;
  rc = kvbm_js_consumer_create(&o, &s->js, err);
  if (rc) return rc;
  js_sync_counts(s);
  s->acked_gen = atomic_load(&s->d->snapshots);
  if (pthread_create(&s->th, NULL, js_thread, s))
    return kvbm_error_set(err, KVBM_ENOMEM, "router: cannot start a thread");
  s->started = true;
  kvbm__rd_log(s->d, "worker %" PRIu64 ": JetStream %s subject %s, consumer %s, reading from %s",
               c->worker_id, c->stream, c->subject, name,
               s->resume_after ? "the snapshot's position on" : "the stream's start");
  return KVBM_OK;
}

/* ---------------------------------------------------------------- start */

static int start_one(source *s, kvbm_error *err) {
  const kvbm_router_source *c = &s->cfg;
  atomic_store(&s->last_ns, kvbm__rd_now_ns());
  if (c->kind == KVBM_SOURCE_JETSTREAM) return start_jetstream(s, err);
  if (c->kind == KVBM_SOURCE_NATS && (!c->subject || !*c->subject))
    return kvbm_error_set(err, KVBM_EINVAL, "router: NATS source of worker %" PRIu64 " has no subject",
                          c->worker_id);
  kvbm_subscriber_config o = kvbm_subscriber_config_default(c->endpoint);
  if (c->kind == KVBM_SOURCE_NATS) o.subject = c->subject;
  /* from a snapshot: the batches after it, asked of the replay socket */
  if (s->resume_after && s->resume_after - 1 <= (uint64_t)INT64_MAX)
    o.start_seq = (int64_t)(s->resume_after - 1);
  o.replay_endpoint = c->replay_endpoint;
  o.topic = c->topic;
  o.max_queue_bytes = s->d->cfg.queue_bytes;
  o.max_payload = s->d->cfg.max_payload;
  o.replay_timeout_ms = s->d->cfg.replay_timeout_ms;
  int rc = kvbm_subscriber_create(&o, &s->sub, err);
  if (rc) return rc;
  if (pthread_create(&s->th, NULL, sub_thread, s))
    return kvbm_error_set(err, KVBM_ENOMEM, "router: cannot start a thread");
  s->started = true;
  return KVBM_OK;
}

int kvbm__rd_sources_check_config(const kvbm_router_daemon_config *c, kvbm_error *err) {
  if (c->max_ranks < 1 || c->max_ranks > KVBM_ROUTER_MAX_WORKERS)
    return kvbm_error_set(err, KVBM_EINVAL, "router: max_ranks %u is not in 1..%d", c->max_ranks,
                          KVBM_ROUTER_MAX_WORKERS);
  if (c->max_payload == 0 || c->queue_bytes / 2 < c->max_payload)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router: queue_bytes (%zu) must be at least twice max_payload (%zu)",
                          c->queue_bytes, c->max_payload);
  if (c->replay_timeout_ms < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "router: negative replay timeout");
  for (size_t i = 0; i < c->num_sources; i++)
    if (c->sources[i].kind == KVBM_SOURCE_JETSTREAM &&
        (!c->durable || !*c->durable || strlen(c->durable) > 200 ||
         strpbrk(c->durable, " \t\r\n.*>")))
      return kvbm_error_set(err, KVBM_EINVAL, "router: JetStream sources need a durable name "
                            "(at most 200 bytes; no spaces, dots or wildcards)");
  return KVBM_OK;
}

int kvbm__rd_sources_start(kvbm_router_daemon *d, kvbm_error *err) {
  for (size_t i = 0; i < d->nsrc; i++) {
    d->src[i].d = d;
    d->src[i].cfg = d->scfg[i];
    int rc = start_one(&d->src[i], err);
    if (rc) return rc;
  }
  return KVBM_OK;
}

void kvbm__rd_sources_halt(kvbm_router_daemon *d) {
  atomic_store(&d->stop, 1);
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    if (s->started) pthread_join(s->th, NULL);
    s->started = false;
  }
}

void kvbm__rd_sources_stop(kvbm_router_daemon *d) {
  kvbm__rd_sources_halt(d);
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    if (s->js) js_ack(s); /* the last snapshot's */
    kvbm_js_consumer_destroy(s->js);
    s->js = NULL;
    kvbm__replay_close(&s->dealer);
    if (s->zctx) zmq_ctx_term(s->zctx);
    s->zctx = NULL;
    kvbm_subscriber_destroy(s->sub);
    s->sub = NULL;
    kvbm_event_decoder_destroy(s->dec);
    s->dec = NULL;
  }
}

void kvbm__rd_sources_tick(kvbm_router_daemon *d) {
  if (d->cfg.worker_timeout_s <= 0) return;
  int64_t now = kvbm__rd_now_ns(), limit = (int64_t)(d->cfg.worker_timeout_s * 1e9);
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    if (atomic_load(&s->dropped) || now - atomic_load(&s->last_ns) < limit) continue;
    int dropped = 0;
    pthread_mutex_lock(&d->wlock);
    for (uint32_t slot = 0; slot < KVBM_ROUTER_MAX_WORKERS; slot++) {
      kvbm_worker_key k;
      if (kvbm_index_slot_worker(d->idx, slot, &k) && k.worker_id == s->cfg.worker_id) {
        dropped += kvbm_index_remove_worker(d->idx, k) == KVBM_OK;
        forget_records(d, 1ull << slot); /* their copies went with the worker */
      }
    }
    s->nranks = 0;
    atomic_store(&s->degraded, 0); /* nothing of it is left to be wrong */
    pthread_mutex_unlock(&d->wlock);
    atomic_store(&s->dropped, 1);
    kvbm__rd_log(d, "worker %" PRIu64 ": silent for %.1f s, %d rank(s) dropped", s->cfg.worker_id,
           d->cfg.worker_timeout_s, dropped);
  }
}

/* --------------------------------------------------------------- health */

void kvbm__rd_source_health(const kvbm_router_daemon *d, size_t i, rj_buf *b) {
  const source *s = &d->src[i];
  const source_counts *n = &s->n;
#define N(f) atomic_load(&((source_counts *)n)->f)
  kvbm__rj_printf(b,
            "%s{\"worker_id\":%" PRIu64 ",\"kind\":\"%s\",\"batches\":%" PRIu64
            ",\"errors\":%" PRIu64 ",\"lost\":%" PRIu64 ",\"replayed\":%" PRIu64
            ",\"duplicates\":%" PRIu64 ",\"resets\":%" PRIu64 ",\"jumps\":%" PRIu64
            ",\"replay_failures\":%" PRIu64 ",\"replay_refused\":%" PRIu64
            ",\"overflow\":%" PRIu64 ",\"reconnects\":%" PRIu64 ",\"ranks_refused\":%" PRIu64
            ",\"skipped_events\":%" PRIu64 ",\"dropped\":%s,\"degraded\":%s",
            i ? "," : "", s->cfg.worker_id,
            s->cfg.kind == KVBM_SOURCE_ZMQ ? "zmq" : s->cfg.kind == KVBM_SOURCE_NATS ? "nats"
                                                                         : "jetstream",
            N(batches), N(errors), N(lost), N(replayed), N(duplicates), N(resets), N(jumps),
            N(replay_failures), N(replay_refused), N(overflow), N(reconnects), N(ranks_refused),
            N(skipped_events), atomic_load(&((source *)s)->dropped) ? "true" : "false",
            atomic_load(&((source *)s)->degraded) ? "true" : "false");
  if (s->cfg.kind == KVBM_SOURCE_JETSTREAM)
    kvbm__rj_printf(b, ",\"stream\":{\"position\":%" PRIu64 ",\"redelivered\":%" PRIu64
                    ",\"malformed\":%" PRIu64 ",\"acks\":%" PRIu64 ",\"rebinds\":%" PRIu64 "}",
                    N(js_pos), N(js_redelivered), N(js_malformed), N(js_acks), N(js_rebinds));
  kvbm__rj_printf(b, "}");
#undef N
}

/* -------------------------------------------------------------- metrics */

void kvbm__rd_sources_metrics(const kvbm_router_daemon *d, kvbm_metrics_writer *w) {
  static const struct {
    const char *name, *help;
    size_t off;
  } f[] = {
#define F(name, help, field) {name, help, offsetof(source_counts, field)}
      F("kvbm_router_source_messages_total", "Messages the worker's stream delivered (live)",
        messages),
      F("kvbm_router_source_batches_total", "Batches applied to the index", batches),
      F("kvbm_router_source_errors_total", "Batches or messages that failed (decode, apply, socket)",
        errors),
      F("kvbm_router_source_malformed_total", "Messages skipped as malformed", malformed),
      F("kvbm_router_source_gaps_total", "Jumps in the worker's sequence numbers", gaps),
      F("kvbm_router_source_replay_requests_total", "Replays asked of the worker's replay socket",
        replay_requests),
      F("kvbm_router_source_replayed_batches_total", "Batches recovered by replay", replayed),
      F("kvbm_router_source_lost_batches_total", "Batches neither received nor replayed", lost),
      F("kvbm_router_source_replay_failures_total", "Replays that timed out or failed",
        replay_failures),
      F("kvbm_router_source_replay_refused_total", "Replay replies outside the asked range",
        replay_refused),
      F("kvbm_router_source_duplicates_total", "Batches skipped as already applied", duplicates),
      F("kvbm_router_source_resets_total", "New streams: the worker restarted", resets),
      F("kvbm_router_source_jumps_total", "Batches far ahead, held and dropped", jumps),
      F("kvbm_router_source_overflow_total", "Batches dropped for the byte budget", overflow),
      F("kvbm_router_source_reconnects_total", "Connections to the worker dialled again",
        reconnects),
      F("kvbm_router_source_ranks_refused_total", "Batches of dp ranks over max_ranks, refused",
        ranks_refused),
      F("kvbm_router_source_skipped_events_total", "Events the decoder left out of the worker's "
        "batches (an unknown tag, a field of the wrong type or missing); the rest applied",
        skipped_events),
  };
  /* JetStream sources only: what their durable consumer did */
  static const struct {
    const char *name, *help;
    size_t off;
  } js[] = {
      F("kvbm_router_source_stream_redelivered_total", "JetStream: messages the server had "
        "delivered before (not acked when the router stopped)", js_redelivered),
      F("kvbm_router_source_stream_malformed_total", "JetStream: messages refused (header, size, "
        "payload)", js_malformed),
      F("kvbm_router_source_stream_acks_total", "JetStream: acks sent (one per snapshot)", js_acks),
      F("kvbm_router_source_stream_rebinds_total", "JetStream: times the durable consumer was "
        "re-bound at a snapshot's position", js_rebinds),
#undef F
  };
  static const char *const type_name[3] = {"stored", "removed", "cleared"};
  static const char *const out_name[RD_OUTCOMES] = {"ok", "duplicate", "error", "not_applied",
                                                    "rank_refused"};
  kvbm_metrics_family(w, "dynamo_component_kv_cache_events_applied", KVBM_METRIC_COUNTER,
                      "KV events by type and what became of them: ok (applied), duplicate "
                      "(skipped by id), error (the index refused it), not_applied (after a "
                      "refused one in its batch), rank_refused (over max_ranks)");
  for (int t = 0; t < 3; t++)
    for (int o = 0; o < RD_OUTCOMES; o++) {
      kvbm_metric_label tl[2] = {{"event_type", type_name[t]}, {"status", out_name[o]}};
      kvbm_metrics_value_u64(w, tl, 2, atomic_load(&((kvbm_router_daemon *)d)->applied[t][o]));
    }
  char id[24];
  kvbm_metric_label l = {"worker_id", id};
  for (size_t k = 0; k < sizeof f / sizeof *f; k++) {
    kvbm_metrics_family(w, f[k].name, KVBM_METRIC_COUNTER, f[k].help);
    for (size_t i = 0; i < d->nsrc; i++) {
      snprintf(id, sizeof id, "%" PRIu64, d->src[i].cfg.worker_id);
      _Atomic uint64_t *v = (_Atomic uint64_t *)((char *)&d->src[i].n + f[k].off);
      kvbm_metrics_value_u64(w, &l, 1, atomic_load(v));
    }
  }
  bool any_js = false;
  for (size_t i = 0; i < d->nsrc; i++) any_js |= d->src[i].cfg.kind == KVBM_SOURCE_JETSTREAM;
  for (size_t k = 0; any_js && k < sizeof js / sizeof *js; k++) {
    kvbm_metrics_family(w, js[k].name, KVBM_METRIC_COUNTER, js[k].help);
    for (size_t i = 0; i < d->nsrc; i++) {
      if (d->src[i].cfg.kind != KVBM_SOURCE_JETSTREAM) continue;
      snprintf(id, sizeof id, "%" PRIu64, d->src[i].cfg.worker_id);
      _Atomic uint64_t *v = (_Atomic uint64_t *)((char *)&d->src[i].n + js[k].off);
      kvbm_metrics_value_u64(w, &l, 1, atomic_load(v));
    }
  }
  if (any_js) {
    kvbm_metrics_family(w, "kvbm_router_source_stream_position", KVBM_METRIC_GAUGE,
                        "JetStream: the stream sequence of the last message applied");
    for (size_t i = 0; i < d->nsrc; i++) {
      if (d->src[i].cfg.kind != KVBM_SOURCE_JETSTREAM) continue;
      snprintf(id, sizeof id, "%" PRIu64, d->src[i].cfg.worker_id);
      kvbm_metrics_value_u64(w, &l, 1, atomic_load(&((source *)&d->src[i])->n.js_pos));
    }
  }
  /* DEGRADED: batches were lost and not replayed; routed approximately
   * until the worker's stream restarts or its cache is cleared */
  kvbm_metrics_family(w, "kvbm_router_source_degraded", KVBM_METRIC_GAUGE,
                      "1 while the worker is DEGRADED: batches lost and not replayed, its part "
                      "of the index incomplete, until a new stream or AllBlocksCleared");
  uint64_t ndeg = 0;
  for (size_t i = 0; i < d->nsrc; i++) {
    snprintf(id, sizeof id, "%" PRIu64, d->src[i].cfg.worker_id);
    bool deg = atomic_load(&((source *)&d->src[i])->degraded);
    ndeg += deg;
    kvbm_metrics_value(w, &l, 1, deg ? 1 : 0);
  }
  kvbm_metrics_gauge(w, "kvbm_router_degraded_workers", "Workers DEGRADED now", NULL, 0,
                     (double)ndeg);
  kvbm_metrics_family(w, "kvbm_router_source_silent", KVBM_METRIC_GAUGE,
                      "1 while the worker's stream is silent past worker_timeout_s and its "
                      "blocks are out of the index");
  for (size_t i = 0; i < d->nsrc; i++) {
    snprintf(id, sizeof id, "%" PRIu64, d->src[i].cfg.worker_id);
    kvbm_metrics_value(w, &l, 1, atomic_load(&((source *)&d->src[i])->dropped) ? 1 : 0);
  }
}
