/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage_pub.c: the storage events' publisher (see kvbm/storage_events.h).
 *
 * Design. Producers copy an event into the queue under one mutex: a fixed
 * record plus its volume id and metadata bytes appended to a byte arena
 * (events are appended in order, so the bytes of the events still waiting
 * are always one contiguous tail: taking a batch moves that tail once).
 * One thread takes a batch when it is due (by period, by size, on flush or
 * shutdown), encodes it once outside the lock and hands the payload to
 * every sink: the events module's ZMQ sink (PUB + replay ROUTER, whose
 * requests the thread serves between batches) and NATS sink (Kvbm-Seq
 * header), and the callbacks. The thread wakes at least every 50 ms to
 * serve replay requests; a storage batch is due every few seconds, so
 * nothing busier is needed.
 *
 * The queue is bounded twice: queue_events records and 16 MiB of arena
 * (an event carries at most 256 + 4096 bytes). Full: DROP refuses and
 * counts (a manager calls this under its lock and must never wait), BLOCK
 * waits for the thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/clock.h"
#include "events/sink.h"
#include "events/storage_internal.h"

#define MAX_SINKS 8
#define ARENA_MAX ((size_t)16 << 20)
#define SERVICE_MS 50

typedef struct qev {
  kvbm_storage_event ev; /* pointers unset while queued */
  size_t loc_off, meta_off;
} qev;

typedef struct cbsink {
  kvbm_storage_batch_callback fn;
  void *user;
} cbsink;

struct kvbm_storage_publisher {
  kvbm_storage_publisher_config cfg;
  char *source;
  void *zctx;
  ev_sink *sinks[MAX_SINKS];
  size_t nsinks;
  cbsink cbs[MAX_SINKS];
  size_t ncbs;
  pthread_t th;
  bool started, stop, closed, polls; /* polls: a sink has a socket to serve */
  pthread_mutex_t mu;
  pthread_cond_t cv, done_cv;
  qev *q;
  size_t qn;
  uint8_t *arena;
  size_t an;
  uint64_t oldest_ns, next_id, sent_id, flush_id, seq;
  kvbm_storage_publisher_stats st;
  /* the thread's own */
  qev *tq;
  uint8_t *tarena;
  kvbm_storage_event *tev;
  uint8_t *payload;
  size_t plen, pcap;
};

kvbm_storage_publisher_config kvbm_storage_publisher_config_default(void) {
  return (kvbm_storage_publisher_config){.source = NULL, .period_ms = 10000,
                                         .max_batch_events = 4096, .queue_events = 65536,
                                         .overflow = KVBM_OVERFLOW_DROP};
}

int kvbm_storage_publisher_create(const kvbm_storage_publisher_config *cfg,
                                  kvbm_storage_publisher **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL argument");
  if (!cfg->period_ms || !cfg->max_batch_events || cfg->queue_events < cfg->max_batch_events ||
      cfg->queue_events > (1u << 24) ||
      (cfg->overflow != KVBM_OVERFLOW_DROP && cfg->overflow != KVBM_OVERFLOW_BLOCK))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "storage publisher: period_ms and max_batch_events must be >= 1, "
                          "queue_events in max_batch_events..2^24, overflow DROP or BLOCK");
  if (cfg->source && strlen(cfg->source) > KVBM_STORAGE_MAX_LOCATION)
    return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: source longer than %d bytes",
                          KVBM_STORAGE_MAX_LOCATION);
  kvbm_storage_publisher *p = calloc(1, sizeof *p);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "storage publisher: out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  p->cfg = *cfg;
  p->source = strdup(cfg->source ? cfg->source : "");
  p->q = malloc(cfg->queue_events * sizeof *p->q);
  p->tq = malloc(cfg->max_batch_events * sizeof *p->tq);
  p->tev = malloc(cfg->max_batch_events * sizeof *p->tev);
  p->arena = malloc(ARENA_MAX);
  p->tarena = malloc(ARENA_MAX);
  if (!p->source || !p->q || !p->tq || !p->tev || !p->arena || !p->tarena) {
    kvbm_storage_publisher_destroy(p);
    return kvbm_error_set(err, KVBM_ENOMEM, "storage publisher: out of memory");
  }
  p->next_id = 1;
  *out = p;
  return KVBM_OK;
}

static int add_sink(kvbm_storage_publisher *p, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL publisher");
  if (p->started) return kvbm_error_set(err, KVBM_ESTATE, "storage publisher: sinks go before start");
  if (p->nsinks + p->ncbs >= MAX_SINKS)
    return kvbm_error_set(err, KVBM_ENOSPC, "storage publisher: at most %d sinks", MAX_SINKS);
  return KVBM_OK;
}

int kvbm_storage_publisher_add_zmq(kvbm_storage_publisher *p, const kvbm_zmq_sink_config *zc,
                                   kvbm_error *err) {
  int rc = add_sink(p, err);
  if (rc) return rc;
  if (!p->zctx && !(p->zctx = zmq_ctx_new()))
    return kvbm_error_set(err, KVBM_EIO, "storage publisher: zmq_ctx_new: %s", zmq_strerror(errno));
  rc = kvbm__sink_zmq_create(p->zctx, zc, &p->sinks[p->nsinks], err);
  if (!rc) p->nsinks++;
  return rc;
}

int kvbm_storage_publisher_add_nats(kvbm_storage_publisher *p, const char *url,
                                    const char *subject, kvbm_error *err) {
  int rc = add_sink(p, err);
  if (rc) return rc;
  rc = kvbm__sink_nats_create(url, subject, &p->sinks[p->nsinks], err);
  if (!rc) p->nsinks++;
  return rc;
}

int kvbm_storage_publisher_add_callback(kvbm_storage_publisher *p, kvbm_storage_batch_callback fn,
                                        void *user, kvbm_error *err) {
  int rc = add_sink(p, err);
  if (rc) return rc;
  if (!fn) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL callback");
  p->cbs[p->ncbs++] = (cbsink){fn, user};
  return KVBM_OK;
}

int kvbm_storage_publisher_zmq_endpoint(const kvbm_storage_publisher *p, size_t i, bool replay,
                                        char *buf, size_t cap) {
  if (!p || i >= p->nsinks || !buf || !cap || !p->sinks[i]->endpoint) return KVBM_ENOTFOUND;
  const char *ep = p->sinks[i]->endpoint(p->sinks[i], replay);
  if (!ep || strlen(ep) >= cap) return KVBM_ENOTFOUND;
  strcpy(buf, ep);
  return KVBM_OK;
}

/* ---- the thread ---- */

static void service(kvbm_storage_publisher *p, int wait_ms) {
  zmq_pollitem_t items[MAX_SINKS];
  size_t of[MAX_SINKS], n = 0;
  for (size_t s = 0; s < p->nsinks; s++)
    if (p->sinks[s]->poll_socket) {
      items[n] = (zmq_pollitem_t){.socket = p->sinks[s]->poll_socket, .events = ZMQ_POLLIN};
      of[n++] = s;
    }
  if (!n) return;
  if (zmq_poll(items, (int)n, wait_ms) <= 0) return;
  ev_service_counts c = {0};
  for (size_t i = 0; i < n; i++)
    if (items[i].revents & ZMQ_POLLIN) p->sinks[of[i]]->service(p->sinks[of[i]], &c);
  pthread_mutex_lock(&p->mu);
  p->st.replay_requests += c.replay_requests;
  p->st.replay_bad += c.replay_bad;
  pthread_mutex_unlock(&p->mu);
}

static bool due(const kvbm_storage_publisher *p, uint64_t now) {
  return p->qn && (p->qn >= p->cfg.max_batch_events || p->stop || p->flush_id > p->sent_id ||
                   now >= p->oldest_ns + (uint64_t)p->cfg.period_ms * 1000000u);
}

/* Lock held: moves the first n queued events (and their bytes) to the
 * thread's buffers, the rest to the front. */
static size_t take(kvbm_storage_publisher *p) {
  size_t n = p->qn < p->cfg.max_batch_events ? p->qn : p->cfg.max_batch_events;
  size_t cut = n < p->qn ? p->q[n].loc_off : p->an;
  memcpy(p->tq, p->q, n * sizeof *p->q);
  memcpy(p->tarena, p->arena, cut);
  memmove(p->q, p->q + n, (p->qn - n) * sizeof *p->q);
  memmove(p->arena, p->arena + cut, p->an - cut);
  p->qn -= n;
  p->an -= cut;
  for (size_t i = 0; i < p->qn; i++) p->q[i].loc_off -= cut, p->q[i].meta_off -= cut;
  p->oldest_ns = kvbm_clock_ns(); /* the rest is at most this old: close enough */
  return n;
}

static void send_batch(kvbm_storage_publisher *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    kvbm_storage_event *e = &p->tev[i];
    *e = p->tq[i].ev;
    e->location = (const char *)p->tarena + p->tq[i].loc_off;
    e->extra_metadata = e->extra_metadata_len ? p->tarena + p->tq[i].meta_off : NULL;
  }
  kvbm_storage_batch b = {.seq = p->seq, .source = p->source, .source_len = strlen(p->source),
                          .events = p->tev, .num_events = n};
  b.ts = kvbm_clock_wall_seconds();
  p->plen = 0;
  uint64_t errors = 0;
  if (kvbm_storage_encode(&b, &p->payload, &p->plen, &p->pcap, NULL) == KVBM_OK) {
    kvbm_event_batch kb = {.seq = p->seq};
    for (size_t s = 0; s < p->nsinks; s++)
      if (p->sinks[s]->send(p->sinks[s], &kb, p->payload, p->plen)) errors++;
    for (size_t c = 0; c < p->ncbs; c++) p->cbs[c].fn(p->cbs[c].user, &b, p->payload, p->plen);
  } else {
    errors += p->nsinks + p->ncbs; /* out of memory: the batch is lost everywhere */
  }
  pthread_mutex_lock(&p->mu);
  p->seq++;
  p->st.batches++;
  p->st.sink_errors += errors;
  if (n) p->sent_id = p->tq[n - 1].ev.event_id;
  pthread_cond_broadcast(&p->done_cv);
  pthread_mutex_unlock(&p->mu);
}

static void *thread_main(void *arg) {
  kvbm_storage_publisher *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    uint64_t now = kvbm_clock_ns();
    if (!due(p, now)) {
      bool done = p->stop && !p->qn;
      if (!done && !p->polls) { /* nothing to serve: sleep until due */
        uint64_t until = p->qn ? p->oldest_ns + (uint64_t)p->cfg.period_ms * 1000000u
                               : now + (uint64_t)SERVICE_MS * 1000000u * 20;
        struct timespec ts = kvbm__deadline_after_ns(CLOCK_MONOTONIC, until > now ? until - now : 0);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
      }
      pthread_mutex_unlock(&p->mu);
      if (done) break;
      service(p, SERVICE_MS); /* sleeps in zmq_poll, serving replay */
      continue;
    }
    size_t n = take(p);
    pthread_cond_broadcast(&p->done_cv); /* room for blocked producers */
    pthread_mutex_unlock(&p->mu);
    send_batch(p, n);
    service(p, 0);
  }
  return NULL;
}

int kvbm_storage_publisher_start(kvbm_storage_publisher *p, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL publisher");
  if (p->started) return kvbm_error_set(err, KVBM_ESTATE, "storage publisher: started already");
  /* The condition variable waits on the monotonic clock. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_destroy(&p->cv);
  pthread_cond_init(&p->cv, &ca);
  pthread_condattr_destroy(&ca);
  for (size_t i = 0; i < p->nsinks; i++) p->polls |= p->sinks[i]->poll_socket != NULL;
  if (pthread_create(&p->th, NULL, thread_main, p))
    return kvbm_error_set(err, KVBM_ENOMEM, "storage publisher: cannot start its thread");
  p->started = true;
  return KVBM_OK;
}

int kvbm_storage_publish(kvbm_storage_publisher *p, const kvbm_storage_event *ev,
                         uint64_t *event_id, kvbm_error *err) {
  if (!p || !ev) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL argument");
  int rc = kvbm__storage_check(ev, 0, err);
  if (rc) return rc;
  size_t bytes = ev->location_len + (ev->extra_metadata ? ev->extra_metadata_len : 0);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->closed) rc = kvbm_error_set(err, KVBM_ECLOSED, "storage publisher: closed");
    else if (!p->started) rc = kvbm_error_set(err, KVBM_ESTATE, "storage publisher: not started");
    if (rc) break;
    bool full = p->qn >= p->cfg.queue_events || p->an + bytes > ARENA_MAX;
    if (!full) break;
    if (p->cfg.overflow == KVBM_OVERFLOW_DROP) {
      p->st.dropped++;
      rc = kvbm_error_set(err, KVBM_EAGAIN, "storage publisher: queue full, event dropped");
      break;
    }
    pthread_cond_wait(&p->done_cv, &p->mu);
  }
  if (!rc) {
    qev *q = &p->q[p->qn++];
    q->ev = *ev;
    q->ev.event_id = p->next_id++;
    q->loc_off = p->an;
    memcpy(p->arena + p->an, ev->location, ev->location_len);
    p->an += ev->location_len;
    q->meta_off = p->an;
    q->ev.extra_metadata_len = ev->extra_metadata ? ev->extra_metadata_len : 0;
    if (ev->extra_metadata) memcpy(p->arena + p->an, ev->extra_metadata, ev->extra_metadata_len);
    p->an += q->ev.extra_metadata_len;
    q->ev.location = NULL;
    q->ev.extra_metadata = NULL;
    if (p->qn == 1) p->oldest_ns = kvbm_clock_ns();
    p->st.published++;
    if (event_id) *event_id = q->ev.event_id;
    if (p->qn >= p->cfg.max_batch_events) pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

int kvbm_storage_publisher_flush(kvbm_storage_publisher *p, int timeout_ms, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "storage publisher: NULL publisher");
  if (!p->started) return kvbm_error_set(err, KVBM_ESTATE, "storage publisher: not started");
  struct timespec dl = kvbm__deadline_after_ms(CLOCK_REALTIME, timeout_ms);
  int rc = KVBM_OK;
  pthread_mutex_lock(&p->mu);
  uint64_t want = p->next_id - 1;
  if (want > p->flush_id) p->flush_id = want;
  pthread_cond_signal(&p->cv);
  while (p->sent_id < want && !rc) {
    if (timeout_ms < 0) pthread_cond_wait(&p->done_cv, &p->mu);
    else if (timeout_ms == 0 || pthread_cond_timedwait(&p->done_cv, &p->mu, &dl) == ETIMEDOUT)
      rc = p->sent_id < want ? kvbm_error_set(err, KVBM_ETIMEDOUT, "storage publisher: flush timed out")
                             : KVBM_OK;
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

void kvbm_storage_publisher_stats_get(kvbm_storage_publisher *p, kvbm_storage_publisher_stats *out) {
  if (!p || !out) return;
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  out->queued = p->qn;
  pthread_mutex_unlock(&p->mu);
}

void kvbm_storage_publisher_destroy(kvbm_storage_publisher *p) {
  if (!p) return;
  if (p->started) {
    pthread_mutex_lock(&p->mu);
    p->closed = p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
  }
  for (size_t s = 0; s < p->nsinks; s++) p->sinks[s]->close(p->sinks[s]);
  if (p->zctx) zmq_ctx_term(p->zctx);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  pthread_cond_destroy(&p->done_cv);
  free(p->source);
  free(p->q);
  free(p->tq);
  free(p->tev);
  free(p->arena);
  free(p->tarena);
  free(p->payload);
  free(p);
}
