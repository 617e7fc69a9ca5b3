/*
 * sources.c: the router daemon's event subscriptions.
 *
 * ZMQ: one thread per worker endpoint runs the events module's subscriber
 * (which already orders batches and recovers gaps through the worker's
 * replay socket) and applies each batch to the index under the writer
 * lock. NATS: the events module has no NATS subscriber, so this file holds
 * a small adapter: libnats delivers each message on its own thread, the
 * payload (the same msgpack as the ZMQ third frame) goes through the
 * events decoder, and the Kvbm-Seq header gives the sequence. A jump in it
 * is a gap: when the source names the worker's ZMQ replay socket, the
 * missing batches are asked for there (the same request the ZMQ
 * subscriber makes: [ "", start_seq ] on a DEALER, replies [ "", seq,
 * payload ] up to seq -1) and applied first; what cannot be recovered is
 * counted and reported by the index's gap hook.
 *
 * Every source stamps the time of its last batch; the daemon's
 * housekeeping drops the workers of a source silent for longer than
 * worker_timeout_s (a worker that went away must not attract requests),
 * and they come back with the next batch.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "router/daemon_impl.h"
#include "common/clock.h"


int64_t kvbm__rd_now_ns(void) { return (int64_t)kvbm_clock_ns(); }

static void apply(source *s, const kvbm_event_batch *b) {
  kvbm_router_daemon *d = s->d;
  kvbm_error err = {0};
  pthread_mutex_lock(&d->wlock);
  int rc = kvbm_index_apply_batch(d->idx, s->cfg.worker_id, b, &err);
  pthread_mutex_unlock(&d->wlock);
  atomic_store(&s->last_ns, kvbm__rd_now_ns());
  if (atomic_exchange(&s->dropped, 0))
    kvbm__rd_log(d, "worker %" PRIu64 ": events again, back in the index", s->cfg.worker_id);
  atomic_fetch_add(&s->batches, 1);
  if (b->lost_before) atomic_fetch_add(&s->lost, b->lost_before);
  if (rc) {
    atomic_fetch_add(&s->errors, 1);
    kvbm__rd_log(d, "worker %" PRIu64 ": batch %" PRIu64 ": %s", s->cfg.worker_id, b->seq, err.msg);
  }
}

/* ------------------------------------------------------------------ ZMQ */

static void *zmq_thread(void *arg) {
  source *s = arg;
  while (!atomic_load(&s->d->stop)) {
    kvbm_event_batch b;
    kvbm_error err = {0};
    int rc = kvbm_subscriber_recv(s->sub, 100, &b, &err);
    if (rc == KVBM_ETIMEDOUT) continue;
    if (rc == KVBM_OK) {
      apply(s, &b);
      continue;
    }
    atomic_fetch_add(&s->errors, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": %s", s->cfg.worker_id, err.msg);
    if (rc == KVBM_EIO) {
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL); /* a failing socket: do not spin */
    }
  }
  return NULL;
}

/* ----------------------------------------------------------------- NATS */

/* Asks the replay socket for batches [from, to) and applies them in order.
 * Returns how many came. */
static uint64_t replay(source *s, uint64_t from, uint64_t to) {
  void *ctx = zmq_ctx_new(), *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
  uint64_t got = 0;
  int zero = 0, tmo = 1000;
  kvbm_event_decoder *dec = NULL;
  if (!sock || kvbm_event_decoder_create(&dec, NULL)) goto out;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  if (zmq_connect(sock, s->cfg.replay_endpoint)) goto out;
  uint8_t be[8];
  for (int i = 0; i < 8; i++) be[i] = (uint8_t)(from >> (56 - 8 * i));
  if (zmq_send(sock, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(sock, be, 8, 0) < 0) goto out;
  for (;;) {
    zmq_msg_t f[3];
    int n = 0, more = 1;
    while (more && n < 3) {
      zmq_msg_init(&f[n]);
      if (zmq_msg_recv(&f[n], sock, 0) < 0) {
        zmq_msg_close(&f[n]);
        break;
      }
      more = zmq_msg_more(&f[n]);
      n++;
    }
    bool ok = n == 3 && !more && zmq_msg_size(&f[1]) == 8;
    uint64_t seq = 0;
    if (ok) {
      const uint8_t *q = zmq_msg_data(&f[1]);
      for (int i = 0; i < 8; i++) seq = seq << 8 | q[i];
    }
    bool end = !ok || seq == UINT64_MAX;
    if (!end && seq >= from && seq < to) {
      kvbm_event_batch b;
      if (!kvbm_event_decode(dec, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), seq, &b, NULL)) {
        apply(s, &b);
        got++;
      }
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    if (end) break;
  }
out:
  kvbm_event_decoder_destroy(dec);
  if (sock) zmq_close(sock);
  if (ctx) zmq_ctx_term(ctx);
  return got;
}

/* libnats calls this on the subscription's own thread, one message at a
 * time, so the decoder and `expected` need no lock. */
static void on_nats(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
  (void)nc;
  (void)sub;
  source *s = closure;
  if (atomic_load(&s->d->stop)) {
    natsMsg_Destroy(msg);
    return;
  }
  const char *hv = NULL;
  uint64_t seq = KVBM_INDEX_NO_ID;
  if (natsMsgHeader_Get(msg, "Kvbm-Seq", &hv) == NATS_OK && hv) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(hv, &end, 10);
    if (!errno && end != hv && !*end) seq = x;
  }
  if (seq != KVBM_INDEX_NO_ID) {
    if (s->have_expected && seq < s->expected) { /* already seen (replayed) */
      natsMsg_Destroy(msg);
      return;
    }
    if (s->have_expected && seq > s->expected && s->cfg.replay_endpoint) {
      uint64_t got = replay(s, s->expected, seq);
      atomic_fetch_add(&s->replayed, got);
      kvbm__rd_log(s->d, "worker %" PRIu64 ": gap %" PRIu64 "..%" PRIu64 ", %" PRIu64 " replayed",
             s->cfg.worker_id, s->expected, seq - 1, got);
    }
    s->have_expected = true;
    s->expected = seq + 1;
  }
  kvbm_event_batch b;
  kvbm_error err = {0};
  int len = natsMsg_GetDataLength(msg);
  if (kvbm_event_decode(s->dec, natsMsg_GetData(msg), len > 0 ? (size_t)len : 0,
                        seq == KVBM_INDEX_NO_ID ? 0 : seq, &b, &err)) {
    atomic_fetch_add(&s->errors, 1);
    kvbm__rd_log(s->d, "worker %" PRIu64 ": NATS message: %s", s->cfg.worker_id, err.msg);
  } else {
    if (seq == KVBM_INDEX_NO_ID) b.seq = KVBM_INDEX_NO_ID;
    apply(s, &b);
  }
  natsMsg_Destroy(msg);
}

/* libnats calls this once the closed subscription's handler has returned
 * for the last time: only then may the source's memory go. */
static void on_nats_complete(void *closure) {
  source *s = closure;
  atomic_store(&s->nats_done, 1);
}

/* ---------------------------------------------------------------- start */

static int start_one(source *s, kvbm_error *err) {
  const kvbm_router_source *c = &s->cfg;
  atomic_store(&s->last_ns, kvbm__rd_now_ns());
  if (c->kind == KVBM_SOURCE_ZMQ) {
    kvbm_subscriber_config o = kvbm_subscriber_config_default(c->endpoint);
    o.replay_endpoint = c->replay_endpoint;
    o.topic = c->topic;
    int rc = kvbm_subscriber_create(&o, &s->sub, err);
    if (rc) return rc;
    if (pthread_create(&s->th, NULL, zmq_thread, s))
      return kvbm_error_set(err, KVBM_ENOMEM, "router: cannot start a thread");
    s->started = true;
    return KVBM_OK;
  }
  if (!c->subject || !*c->subject)
    return kvbm_error_set(err, KVBM_EINVAL, "router: NATS source of worker %" PRIu64 " has no subject",
                          c->worker_id);
  int rc = kvbm_event_decoder_create(&s->dec, err);
  if (rc) return rc;
  natsStatus st = natsConnection_ConnectTo(&s->nc, c->endpoint);
  if (st == NATS_OK) st = natsConnection_Subscribe(&s->ns, s->nc, c->subject, on_nats, s);
  if (st == NATS_OK) st = natsSubscription_SetOnCompleteCB(s->ns, on_nats_complete, s);
  if (st == NATS_OK) st = natsConnection_FlushTimeout(s->nc, 2000);
  if (st != NATS_OK)
    return kvbm_error_set(err, KVBM_EIO, "router: NATS %s subject %s: %s", c->endpoint,
                          c->subject, natsStatus_GetText(st));
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

void kvbm__rd_sources_stop(kvbm_router_daemon *d) {
  atomic_store(&d->stop, 1);
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    if (s->started) pthread_join(s->th, NULL);
    s->started = false;
    if (s->ns) {
      /* the handler may be running on libnats' thread: wait until libnats
       * says it is done with it (bounded, in case the library misbehaves) */
      if (natsSubscription_Unsubscribe(s->ns) == NATS_OK)
        for (int i = 0; i < 500 && !atomic_load(&s->nats_done); i++) {
          struct timespec ts = {0, 10 * 1000 * 1000};
          nanosleep(&ts, NULL);
        }
      natsSubscription_Destroy(s->ns);
    }
    if (s->nc) natsConnection_Destroy(s->nc);
    s->ns = NULL;
    s->nc = NULL;
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
      if (kvbm_index_slot_worker(d->idx, slot, &k) && k.worker_id == s->cfg.worker_id)
        dropped += kvbm_index_remove_worker(d->idx, k) == KVBM_OK;
    }
    pthread_mutex_unlock(&d->wlock);
    atomic_store(&s->dropped, 1);
    kvbm__rd_log(d, "worker %" PRIu64 ": silent for %.1f s, %d rank(s) dropped", s->cfg.worker_id,
           d->cfg.worker_timeout_s, dropped);
  }
}
