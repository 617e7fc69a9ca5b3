/* SPDX-License-Identifier: Apache-2.0 */
/*
 * subscriber.c: reads an engine's event stream in sequence order,
 * recovering gaps through its replay socket, within a byte budget. The
 * stream comes over ZMQ (vLLM's three frames) or over NATS (one subject of
 * kvbm's NATS sink: the payload as the body, the number in the Kvbm-Seq
 * header; nats_in.c). Everything past reading one live message is the
 * same for both: the rules, replay (asked of the engine's ZMQ replay
 * ROUTER either way: a kvbm publisher with a NATS and a ZMQ sink numbers
 * both alike), the FIFO and the budget, the counters.
 *
 * Order. Every live sequence number goes through the stream's sequence
 * rules (seq.c, kvbm_seqno_check): the batch due is decoded straight from
 * the ZMQ frame or NATS message (no copy); a repeat is skipped; a step back is a restarted
 * engine, delivered at once with reset = true; a step forward within
 * max_gap is a gap, for which the replay ROUTER is asked (replay.c: only
 * the missing range, in order, within one deadline and the byte budget)
 * and the replies, then the live batch, go to a FIFO of copies that later
 * calls return in order; a bigger step forward is held aside (copies) and
 * believed only when `confirm` batches in a row continue it. Whatever
 * replay did not cover is reported as `lost_before` on the next batch
 * delivered. A subscriber created with start_seq >= 0 asks for replay
 * before its first live message (a late joiner).
 *
 * Memory. libzmq bounds its queue in messages, not bytes, so the budget
 * is split: the SUB socket may queue max_queue_bytes / 2 / ceiling
 * messages (ZMQ_RCVHWM) of at most `ceiling` bytes a frame
 * (ZMQ_MAXMSGSIZE), and the FIFO plus the held batches keep at most
 * max_queue_bytes / 2.
 *
 * Oversized frames. max_payload is enforced here, not by libzmq: libzmq
 * ends the connection at a frame over ZMQ_MAXMSGSIZE before reading it,
 * and its monitor reports that exactly as it reports a peer that went
 * away (ZMQ_EVENT_DISCONNECTED, no reason: libzmq 4.3's
 * stream_engine_base error()), so a limit left to libzmq showed only as
 * a reconnect. So libzmq's ceiling is twice max_payload (at most the
 * socket's half of the budget) and the queue holds half as many
 * messages, which keeps the byte bound; a payload over max_payload that
 * libzmq lets through is refused here, counted (too_large, as NATS's
 * are) and returned as KVBM_ETOOLONG, and the connection stays up: the
 * next batch comes as usual (its number shows the refused one as a gap).
 * Known limit: a frame over the ceiling is still cut by libzmq, unread,
 * and counts as a reconnect only (see redial).
 *
 * A full SUB queue pushes back on the TCP
 * connection, so a flood is dropped at the publisher (whose PUB never
 * blocks) and seen here as gaps, not stored here. Known limit: libzmq
 * stores a multipart message whole whatever its number of frames, so the
 * bound assumes the three frames of vLLM's wire. Over NATS, libnats' queue
 * is bounded in bytes directly (max_queue_bytes / 2); what it drops is
 * counted in overflow and seen as a gap.
 *
 * Malformed live messages (frame count, sequence frame or Kvbm-Seq header,
 * payload size, payload content) are counted by kind and returned as
 * errors: one call, one message; the stream goes on with the next call.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/vec.h"
#include "events/nats_in.h"
#include "events/replay.h"
#include "events/sink.h"
#include "events/zframes.h"
#include "kvbm/events.h"

typedef struct pend {
  uint64_t seq;
  uint8_t *data;
  size_t len;
  bool replayed, reset;
} pend;

#define MAX_CONFIRM 64

struct kvbm_subscriber {
  kvbm_subscriber_config o;
  char *endpoint, *replay_endpoint, *topic, *subject;
  void *zctx, *sub, *dealer;  /* zctx: NATS too, when it has a replay socket */
  bool nats;        /* the NATS transport (endpoint nats://...) */
  kvbm__nats_in nin;
  uint64_t nats_dropped; /* libnats' drops, part of st.overflow */
  void *monitor;    /* connect mode: the SUB's disconnect events */
  kvbm_event_decoder *dec;
  bool joined;
  kvbm_seqno_tracker seq;
  pend *q;          /* FIFO: q[qh..qn) */
  size_t qh, qn, qcap;
  pend held[MAX_CONFIRM]; /* batches past a jump, not believed yet */
  uint32_t nheld;
  size_t qbytes;    /* bytes in the FIFO and held */
  size_t budget;    /* ... at most */
  zmq_msg_t cur;    /* the live payload last returned (or nin.cur) */
  bool cur_open;
  uint8_t *cur_buf; /* or the pending copy last returned */
  kvbm_subscriber_stats st;
};

#define FIFO_KEEP 1024 /* entries an empty FIFO may keep allocated */

kvbm_subscriber_config kvbm_subscriber_config_default(const char *endpoint) {
  return (kvbm_subscriber_config){.endpoint = endpoint, .subject = NULL, .bind = false,
                                   .topic = NULL,
                                   .replay_endpoint = NULL, .start_seq = -1,
                                   .replay_timeout_ms = 2000, .max_payload = (size_t)2 << 20,
                                   .max_queue_bytes = (size_t)64 << 20,
                                   .seq = kvbm_seqno_rules_default()};
}

static char *dup_or_null(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

static void drop_held(kvbm_subscriber *s) {
  for (uint32_t i = 0; i < s->nheld; i++) {
    s->qbytes -= s->held[i].len;
    free(s->held[i].data);
  }
  s->nheld = 0;
}

void kvbm_subscriber_destroy(kvbm_subscriber *s) {
  if (!s) return;
  int zero = 0;
  if (s->cur_open) zmq_msg_close(&s->cur);
  if (s->monitor) zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero), zmq_close(s->monitor);
  if (s->sub) zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof zero), zmq_close(s->sub);
  if (s->nats) kvbm__nats_in_close(&s->nin);
  kvbm__replay_close(&s->dealer);
  if (s->zctx) zmq_ctx_term(s->zctx);
  for (size_t i = s->qh; i < s->qn; i++) free(s->q[i].data);
  free(s->q);
  drop_held(s);
  free(s->cur_buf);
  kvbm_event_decoder_destroy(s->dec);
  free(s->endpoint);
  free(s->replay_endpoint);
  free(s->topic);
  free(s->subject);
  free(s);
}

static int check_options(const kvbm_subscriber_config *o, kvbm_error *err) {
  if (!o->endpoint || !*o->endpoint)
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: no endpoint");
  if (o->start_seq < -1 || o->replay_timeout_ms < 0 || o->max_payload == 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: subscriber: start_seq < -1, negative replay timeout or "
                          "zero max_payload");
  if (o->max_payload > INT64_MAX || o->max_queue_bytes / 2 < o->max_payload)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: subscriber: max_queue_bytes (%zu) must be at least twice "
                          "max_payload (%zu)",
                          o->max_queue_bytes, o->max_payload);
  if (o->seq.confirm > MAX_CONFIRM)
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: seq.confirm %u is above %d",
                          o->seq.confirm, MAX_CONFIRM);
  if (!kvbm__nats_in_is_url(o->endpoint)) {
    if (o->subject)
      return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: a subject goes with a "
                            "nats:// endpoint, not %s", o->endpoint);
    return KVBM_OK;
  }
  if (o->bind)
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: bind is for ZMQ endpoints");
  return kvbm__nats_in_check_subject(o->subject, err);
}

/* The SUB socket's share of the budget: max_queue_bytes / 2 in messages
 * of at most `ceiling` bytes, twice max_payload where the share allows,
 * so that frames a little over max_payload reach check_frames and are
 * counted (see the top of the file). check_options made share >=
 * max_payload, so the ceiling is at least max_payload and the queue at
 * least one message. */
static void limit_socket(kvbm_subscriber *s) {
  size_t share = s->o.max_queue_bytes / 2, maxp = s->o.max_payload;
  size_t ceiling = share - maxp >= maxp ? 2 * maxp : share;
  size_t msgs = share / ceiling;
  int hwm = msgs > INT_MAX ? INT_MAX : (int)msgs;
  int64_t maxmsg = ceiling > INT64_MAX ? INT64_MAX : (int64_t)ceiling;
  zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
}

/* libzmq ends a connection whose peer breaks the protocol, a frame over
 * ZMQ_MAXMSGSIZE (the ceiling) included, and a connecting socket does not
 * dial again after that (it does after a network error): one huge batch
 * would leave the subscriber deaf to its engine for good. So in connect mode a
 * monitor reports every disconnect, and the subscriber dials again itself
 * (redial). */
static int watch_disconnects(kvbm_subscriber *s) {
  static const char addr[] = "inproc://kvbm-subscriber-monitor"; /* one per context */
  if (zmq_socket_monitor(s->sub, addr, ZMQ_EVENT_DISCONNECTED) < 0) return -1;
  s->monitor = zmq_socket(s->zctx, ZMQ_PAIR);
  if (!s->monitor || zmq_connect(s->monitor, addr) < 0) return -1;
  return 0;
}

/* Reads the monitor's events; a disconnect makes the SUB dial again. */
static void redial(kvbm_subscriber *s) {
  for (;;) {
    zmq_msg_t f[3];
    int n = ev_zframes_recv(s->monitor, f);
    if (n == 0) return;
    for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
    s->st.reconnects++;
    zmq_disconnect(s->sub, s->endpoint);
    zmq_connect(s->sub, s->endpoint);
  }
}

/* NATS: the subscription, and the replay client's socket at once (so that
 * its descriptors exist from the start, as the ZMQ transport's do). */
static int open_nats(kvbm_subscriber *s, kvbm_error *err) {
  s->nats = true;
  if (s->replay_endpoint && (!(s->zctx = zmq_ctx_new()) ||
                             kvbm__replay_open(s->zctx, &s->dealer, s->replay_endpoint)))
    return kvbm_error_set(err, KVBM_EIO, "events: subscriber: replay socket %s: %s",
                          s->replay_endpoint, zmq_strerror(errno));
  return kvbm__nats_in_open(&s->nin, s->endpoint, s->subject, s->o.max_queue_bytes / 2, err);
}

int kvbm_subscriber_create(const kvbm_subscriber_config *opts, kvbm_subscriber **out,
                        kvbm_error *err) {
  if (!opts || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: no options");
  int rc = check_options(opts, err);
  if (rc) return rc;
  kvbm_subscriber *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "events: subscriber: out of memory");
  s->o = *opts;
  s->budget = opts->max_queue_bytes / 2;
  kvbm_seqno_init(&s->seq, &opts->seq);
  bool oom = false;
  s->endpoint = dup_or_null(opts->endpoint, &oom);
  s->replay_endpoint = dup_or_null(opts->replay_endpoint, &oom);
  s->topic = dup_or_null(opts->topic ? opts->topic : "", &oom);
  s->subject = dup_or_null(opts->subject, &oom);
  if (oom) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "events: subscriber: out of memory");
    goto fail;
  }
  if ((rc = kvbm_event_decoder_create(&s->dec, err))) goto fail;
  if (kvbm__nats_in_is_url(s->endpoint)) {
    if ((rc = open_nats(s, err))) goto fail;
    *out = s;
    return KVBM_OK;
  }
  s->zctx = zmq_ctx_new();
  s->sub = s->zctx ? zmq_socket(s->zctx, ZMQ_SUB) : NULL;
  if (!s->sub) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: subscriber: zmq: %s", zmq_strerror(errno));
    goto fail;
  }
  limit_socket(s);
  zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic));
  if ((opts->bind ? zmq_bind(s->sub, s->endpoint) : zmq_connect(s->sub, s->endpoint)) < 0) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: subscriber: %s %s: %s",
                        opts->bind ? "bind" : "connect", s->endpoint, zmq_strerror(errno));
    goto fail;
  }
  if (!opts->bind && watch_disconnects(s)) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: subscriber: socket monitor: %s",
                        zmq_strerror(errno));
    goto fail;
  }
  *out = s;
  return KVBM_OK;
fail:
  kvbm_subscriber_destroy(s);
  return rc;
}

void kvbm_subscriber_stats_get(const kvbm_subscriber *s, kvbm_subscriber_stats *out) {
  if (!s || !out) return;
  *out = s->st;
  out->queued_bytes = s->qbytes;
}

/* -------------------------------------------------------------- pending */

static void count_bytes(kvbm_subscriber *s, size_t len) {
  s->qbytes += len;
  if (s->qbytes > s->st.peak_bytes) s->st.peak_bytes = s->qbytes;
}

/* A copy of a payload, charged to the budget; NULL when it does not fit
 * (counted: overflow) or memory ran out. */
static uint8_t *copy_in(kvbm_subscriber *s, const void *data, size_t len) {
  if (len > s->budget - s->qbytes) {
    s->st.overflow++;
    return NULL;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return NULL;
  if (len) memcpy(copy, data, len);
  count_bytes(s, len);
  return copy;
}

/* Makes room for one more FIFO entry. */
static int fifo_slot(kvbm_subscriber *s) {
  if (s->qh > 0 && s->qn == s->qcap) { /* slide down before growing */
    memmove(s->q, s->q + s->qh, (s->qn - s->qh) * sizeof *s->q);
    s->qn -= s->qh;
    s->qh = 0;
  }
  if (kvbm__vec_reserve_of(&s->q, &s->qcap, s->qn + 1, 64, KVBM__VEC_NO_LIMIT)) return KVBM_ENOMEM;
  return KVBM_OK;
}

static int push_pending(kvbm_subscriber *s, uint64_t seq, const void *data, size_t len,
                        bool replayed, bool reset) {
  if (fifo_slot(s)) return KVBM_ENOMEM;
  uint8_t *copy = copy_in(s, data, len);
  if (!copy) return KVBM_ENOSPC;
  s->q[s->qn++] = (pend){seq, copy, len, replayed, reset};
  return 0;
}

/* Takes the FIFO's head; false when empty. An empty FIFO that grew large
 * (a long replay) gives its array back. */
static bool pop_pending(kvbm_subscriber *s, pend *p) {
  if (s->qh == s->qn) return false;
  *p = s->q[s->qh++];
  s->qbytes -= p->len;
  if (s->qh == s->qn) {
    s->qh = s->qn = 0;
    if (s->qcap > FIFO_KEEP) {
      free(s->q);
      s->q = NULL;
      s->qcap = 0;
    }
  }
  return true;
}

/* --------------------------------------------------------------- replay */

static int take_reply(void *user, uint64_t seq, const uint8_t *data, size_t len) {
  return push_pending(user, seq, data, len, true, false) ? 1 : 0;
}

/* Asks for batches [from, to) and queues the replies, leaving `reserve`
 * bytes of the budget free (for the live batch that revealed the gap). */
static void replay_range(kvbm_subscriber *s, uint64_t from, uint64_t to, size_t reserve) {
  if (!s->replay_endpoint) return;
  size_t room = s->budget - s->qbytes;
  room = room > reserve ? room - reserve : 0;
  kvbm__replay_window w;
  kvbm__replay_window_init(&w, from, to, s->o.replay_timeout_ms, room, s->o.max_payload,
                           kvbm_clock_ns());
  w.topic = s->topic; /* a reply with a topic must be one we subscribe to */
  kvbm__replay_result r;
  s->st.replay_requests++;
  kvbm__replay_fetch(s->zctx, &s->dealer, s->replay_endpoint, &w, take_reply, s, &r);
  s->st.replay_refused += r.refused;
  s->st.replay_topic += r.with_topic;
  if (r.failed) s->st.replay_failures++;
  if (r.full) s->st.overflow++;
}

/* ----------------------------------------------------------------- recv */

/* The live message last read (ZMQ payload frame or NATS message). */
static void release_live(kvbm_subscriber *s) {
  if (s->cur_open) zmq_msg_close(&s->cur);
  s->cur_open = false;
  if (s->nats) kvbm__nats_in_release(&s->nin);
}

static void release_current(kvbm_subscriber *s) {
  release_live(s);
  free(s->cur_buf);
  s->cur_buf = NULL;
}

static int deliver(kvbm_subscriber *s, uint64_t seq, const uint8_t *data, size_t len,
                   bool replayed, bool reset, kvbm_event_batch *out, const uint8_t **payload,
                   size_t *plen, kvbm_error *err) {
  uint64_t lost = kvbm_seqno_take(&s->seq, seq);
  s->st.lost += lost;
  int rc = KVBM_OK;
  if (s->o.raw) memset(out, 0, sizeof *out), out->seq = seq;
  else rc = kvbm_event_decode(s->dec, data, len, seq, out, err);
  if (rc) {
    s->st.malformed++;
    s->st.bad_payload++;
    return rc;
  }
  out->lost_before = lost;
  out->replayed = replayed;
  out->reset = reset;
  s->st.delivered++;
  s->st.events += out->num_events;
  if (replayed) s->st.replayed++;
  if (payload) *payload = data;
  if (plen) *plen = len;
  return KVBM_OK;
}

static int remaining_ms(uint64_t deadline_ns, int timeout_ms) {
  if (timeout_ms < 0) return -1;
  uint64_t now = kvbm_clock_ns();
  if (now >= deadline_ns) return 0;
  uint64_t ms = (deadline_ns - now) / 1000000u;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Waits until deadline for one live multipart message (serving the
 * monitor meanwhile) and receives it into up to 3 frames; returns the frame
 * count (all of them), or -1 on timeout or a socket error. A message that
 * waits already is taken without a poll: a reader behind its publisher
 * (the case that counts) finds one nearly every call, and zmq_poll with
 * its ZMQ_EVENTS queries cost ~3,000 instructions a message (callgrind,
 * issue 22). The monitor is then read when the queue runs dry, as
 * before: dialling again drops what the queue holds. */
static int recv_live(kvbm_subscriber *s, zmq_msg_t f[3], uint64_t deadline, int timeout_ms) {
  int n = ev_zframes_recv(s->sub, f);
  if (n) return n;
  for (;;) {
    zmq_pollitem_t it[2] = {{.socket = s->sub, .events = ZMQ_POLLIN},
                            {.socket = s->monitor, .events = ZMQ_POLLIN}};
    int wait = remaining_ms(deadline, timeout_ms);
    int r = zmq_poll(it, s->monitor ? 2 : 1, wait);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    if (it[0].revents & ZMQ_POLLIN) {
      int n = ev_zframes_recv(s->sub, f);
      if (n) return n;
    }
    /* only once the queue is read: dialling again drops what it holds */
    if (s->monitor && (it[1].revents & ZMQ_POLLIN)) redial(s);
    if (!wait) return -1;
  }
}

static void close_frames(zmq_msg_t f[3], int n) {
  for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
}

/* A late joiner asks for everything from start_seq on (as far as a gap may
 * reach: beyond that the rules would not believe it anyway). */
static void join(kvbm_subscriber *s) {
  s->joined = true;
  if (s->o.start_seq < 0) return;
  uint64_t from = (uint64_t)s->o.start_seq, span = s->seq.rules.max_gap + 1;
  kvbm_seqno_start(&s->seq, from);
  replay_range(s, from, from > UINT64_MAX - span ? UINT64_MAX : from + span, 0);
}

/* Checks a live message's frames; on success *seq is its number and f[2]
 * the payload (f[0], f[1] closed). Otherwise everything is closed, the
 * message counted, and the error returned. */
static int check_frames(kvbm_subscriber *s, zmq_msg_t f[3], int n, uint64_t *seq,
                        kvbm_error *err) {
  if (n != 3) {
    close_frames(f, n);
    s->st.malformed++;
    s->st.bad_frames++;
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "events: subscriber: message of %d frames, expected 3 (topic, "
                          "sequence, payload)", n);
  }
  s->st.messages++;
  if (zmq_msg_size(&f[1]) != 8) {
    size_t got = zmq_msg_size(&f[1]);
    close_frames(f, n);
    s->st.malformed++;
    s->st.bad_seq++;
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "events: subscriber: sequence frame of %zu bytes, expected 8", got);
  }
  if (zmq_msg_size(&f[2]) > s->o.max_payload) {
    size_t got = zmq_msg_size(&f[2]);
    close_frames(f, n);
    s->st.malformed++;
    s->st.too_large++;
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "events: subscriber: payload of %zu bytes over the limit %zu", got,
                          s->o.max_payload);
  }
  *seq = ev_get_be64(zmq_msg_data(&f[1]));
  zmq_msg_close(&f[0]);
  zmq_msg_close(&f[1]);
  return KVBM_OK;
}

/* A batch past a jump: a copy kept aside (when the budget allows; one that
 * does not fit is simply missing when the jump is confirmed, and counted
 * lost then). */
static void hold(kvbm_subscriber *s, uint64_t seq, const uint8_t *data, size_t len) {
  if (s->nheld >= MAX_CONFIRM) return;
  uint8_t *copy = copy_in(s, data, len);
  if (copy) s->held[s->nheld++] = (pend){seq, copy, len, false, false};
}

/* The held batches and the live one continue one another: a new stream
 * from the first of them. They go to the FIFO, the first marked reset. */
static void resync(kvbm_subscriber *s, uint64_t seq, const uint8_t *data, size_t len) {
  s->st.resets++;
  bool first = true;
  for (uint32_t i = 0; i < s->nheld; i++) { /* moved, already charged */
    pend *h = &s->held[i];
    if (fifo_slot(s)) {
      s->qbytes -= h->len;
      free(h->data);
      continue;
    }
    s->q[s->qn++] = (pend){h->seq, h->data, h->len, false, first};
    first = false;
  }
  s->nheld = 0;
  /* no room (counted: overflow): it is missing, and the next batch's gap says so */
  push_pending(s, seq, data, len, false, first);
}

/* One live message, read by its transport and checked: its number and
 * payload (valid until release_live). */
typedef struct live {
  uint64_t seq;
  const uint8_t *data;
  size_t len;
} live;

static int zmq_live(kvbm_subscriber *s, uint64_t deadline, int timeout_ms, live *m,
                    kvbm_error *err) {
  zmq_msg_t f[3];
  int n = recv_live(s, f, deadline, timeout_ms);
  if (n < 0) {
    if (errno == ETERM || errno == ENOTSOCK)
      return kvbm_error_set(err, KVBM_EIO, "events: subscriber: socket closed");
    return kvbm_error_set(err, KVBM_ETIMEDOUT, "events: subscriber: nothing within %d ms",
                          timeout_ms);
  }
  int rc = check_frames(s, f, n, &m->seq, err);
  if (rc) return rc;
  s->cur = f[2];
  s->cur_open = true;
  m->data = zmq_msg_data(&s->cur);
  m->len = zmq_msg_size(&s->cur);
  return KVBM_OK;
}

/* libnats' own counts: its drops are overflow, its reconnections ours. */
static void nats_counts(kvbm_subscriber *s) {
  uint64_t dropped = s->nats_dropped, reconnects = s->st.reconnects;
  kvbm__nats_in_counts(&s->nin, &dropped, &reconnects);
  if (dropped > s->nats_dropped) s->st.overflow += dropped - s->nats_dropped;
  s->nats_dropped = dropped;
  s->st.reconnects = reconnects;
}

static int nats_live(kvbm_subscriber *s, uint64_t deadline, int timeout_ms, live *m,
                     kvbm_error *err) {
  int rc;
  for (;;) { /* < 0 waits forever: in slices, since libnats takes a finite wait */
    int wait = remaining_ms(deadline, timeout_ms);
    rc = kvbm__nats_in_next(&s->nin, wait < 0 ? 1000 : wait, err);
    nats_counts(s);
    if (rc != KVBM_ETIMEDOUT || wait >= 0) break;
  }
  if (rc) return rc;
  natsMsg *msg = s->nin.cur;
  s->st.messages++;
  if (!kvbm__nats_seq(msg, &m->seq)) {
    s->st.malformed++;
    s->st.bad_seq++;
    return kvbm_error_set(err, KVBM_EFORMAT, "events: subscriber: NATS message on %s without "
                          "a valid Kvbm-Seq header", natsMsg_GetSubject(msg));
  }
  int len = natsMsg_GetDataLength(msg);
  m->len = len > 0 ? (size_t)len : 0;
  if (m->len > s->o.max_payload) {
    s->st.malformed++;
    s->st.too_large++;
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "events: subscriber: payload of %zu bytes over the limit %zu", m->len,
                          s->o.max_payload);
  }
  m->data = (const uint8_t *)natsMsg_GetData(msg);
  return KVBM_OK;
}

int kvbm_subscriber_recv_raw(kvbm_subscriber *s, int timeout_ms, kvbm_event_batch *out,
                             const uint8_t **payload, size_t *payload_len, kvbm_error *err) {
  if (!s || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: NULL argument");
  release_current(s);
  uint64_t deadline = kvbm_clock_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
  if (!s->joined) join(s);
  for (;;) {
    pend p;
    while (pop_pending(s, &p)) { /* replayed and held batches first, in order */
      if (!p.reset && p.seq < kvbm_seqno_next(&s->seq)) {
        s->st.duplicates += !p.replayed;
        free(p.data);
        continue;
      }
      s->cur_buf = p.data;
      return deliver(s, p.seq, p.data, p.len, p.replayed, p.reset, out, payload, payload_len,
                     err);
    }
    live m;
    int rc = s->nats ? nats_live(s, deadline, timeout_ms, &m, err)
                     : zmq_live(s, deadline, timeout_ms, &m, err);
    if (rc) return rc; /* a bad message stays current until the next call */
    uint64_t due = kvbm_seqno_next(&s->seq);
    uint32_t voided;
    kvbm_seqno_verdict v = kvbm_seqno_check(&s->seq, m.seq, true, &voided);
    if (voided) { /* a stray number, not the stream */
      s->st.jumps += voided;
      drop_held(s);
    }
    switch (v) {
      case KVBM_SEQNO_DUPLICATE:
        s->st.duplicates++;
        release_live(s);
        continue;
      case KVBM_SEQNO_HOLD:
        hold(s, m.seq, m.data, m.len);
        release_live(s);
        continue;
      case KVBM_SEQNO_RESYNC:
        resync(s, m.seq, m.data, m.len);
        release_live(s);
        continue;
      case KVBM_SEQNO_GAP:
        s->st.gaps++;
        if (!s->replay_endpoint) break; /* delivered below, the hole counted lost */
        replay_range(s, due, m.seq, m.len);
        /* room was kept for it; should it still not fit (counted: overflow),
         * it is lost with the rest of the gap */
        push_pending(s, m.seq, m.data, m.len, false, false);
        release_live(s);
        continue;
      case KVBM_SEQNO_RESTART:
        s->st.resets++;
        break;
      case KVBM_SEQNO_NEXT:
        break;
    }
    return deliver(s, m.seq, m.data, m.len, false, v == KVBM_SEQNO_RESTART, out, payload,
                   payload_len, err);
  }
}

int kvbm_subscriber_recv(kvbm_subscriber *sub, int timeout_ms, kvbm_event_batch *out,
                         kvbm_error *err) {
  return kvbm_subscriber_recv_raw(sub, timeout_ms, out, NULL, NULL, err);
}
