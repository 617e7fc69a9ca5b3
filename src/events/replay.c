/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay.c: vLLM's replay protocol, both sides (see replay.h).
 *
 * A client asks a replay ROUTER for the batches it missed and reads the
 * replies until the end marker. Everything about a reply is the server's
 * word, and the server may be slow, buggy or hostile, so the reading loop
 * is driven by one set of rules (kvbm__replay_check): the range asked for,
 * strictly increasing numbers, one deadline for the whole replay, a byte
 * budget and a payload limit. A reply that breaks the range or the order is
 * ignored and counted, not obeyed: a server that answers "batch 2^63" must
 * not move the client's stream there. A malformed reply (wrong frame
 * count, a sequence frame that is not 8 bytes) ends the replay: the
 * server does not speak the protocol.
 *
 * After any failure the DEALER is closed and made anew next time, so
 * replies still in flight for the abandoned request cannot be read as
 * answers to the next one.
 */
#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "events/replay.h"
#include "events/sink.h"
#include "events/zframes.h"

void kvbm__replay_window_init(kvbm__replay_window *w, uint64_t from, uint64_t to,
                              int timeout_ms, size_t max_bytes, size_t max_payload,
                              uint64_t now_ns) {
  *w = (kvbm__replay_window){.from = from, .to = to,
                             .deadline_ns = now_ns + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) *
                                                         1000000u,
                             .max_bytes = max_bytes, .max_payload = max_payload};
}

kvbm__replay_verdict kvbm__replay_check(kvbm__replay_window *w, uint64_t seq, size_t len,
                                        uint64_t now_ns) {
  if (seq == UINT64_MAX) return KVBM__REPLAY_END;
  if (now_ns >= w->deadline_ns) return KVBM__REPLAY_LATE;
  if (seq < w->from || seq >= w->to || (w->any && seq <= w->last)) return KVBM__REPLAY_SKIP;
  if (len > w->max_payload) return KVBM__REPLAY_TOO_LARGE;
  if (len > w->max_bytes - w->bytes) return KVBM__REPLAY_FULL;
  w->bytes += len;
  w->last = seq;
  w->any = true;
  return KVBM__REPLAY_TAKE;
}

int kvbm__replay_wait_ms(const kvbm__replay_window *w, uint64_t now_ns) {
  if (now_ns >= w->deadline_ns) return 0;
  uint64_t ms = (w->deadline_ns - now_ns + 999999u) / 1000000u;
  return ms > 1000000000u ? 1000000000 : (int)ms;
}

void kvbm__replay_close(void **dealer) {
  if (!*dealer) return;
  int zero = 0;
  zmq_setsockopt(*dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(*dealer);
  *dealer = NULL;
}

static void fail(void **dealer, kvbm__replay_result *res, const char *why) {
  kvbm__replay_close(dealer);
  res->failed = true;
  res->why = why;
}

int kvbm__replay_open(void *zctx, void **dealer, const char *endpoint) {
  if (*dealer) return 0;
  *dealer = zmq_socket(zctx, ZMQ_DEALER);
  if (!*dealer) return -1;
  int zero = 0;
  zmq_setsockopt(*dealer, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_connect(*dealer, endpoint) < 0) {
    kvbm__replay_close(dealer);
    return -1;
  }
  return 0;
}

static int send_request(void **dealer, void *zctx, const char *endpoint, uint64_t from) {
  if (kvbm__replay_open(zctx, dealer, endpoint)) return -1;
  uint8_t b[8];
  ev_put_be64(b, from);
  if (zmq_send(*dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(*dealer, b, 8, ZMQ_DONTWAIT) < 0)
    return -1;
  return 0;
}

/* Waits for one reply within the window's time; returns its frame count
 * (f[0..min(n,4)) to close), 0 when the time ran out, -1 on a socket error. */
static int next_reply(void *dealer, const kvbm__replay_window *w, zmq_msg_t f[4]) {
  for (;;) {
    int wait = kvbm__replay_wait_ms(w, kvbm_clock_ns());
    zmq_pollitem_t it = {.socket = dealer, .events = ZMQ_POLLIN};
    int r = zmq_poll(&it, 1, wait);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    int n = ev_zframes_recv_n(dealer, f, 4);
    if (n > 0) return n;
    if (!wait) return 0;
  }
}

/* A reply's parts: [ "", seq, payload ] or [ "", topic, seq, payload ]. */
typedef struct reply_parts {
  zmq_msg_t *topic, *seq, *payload; /* topic NULL in the old shape */
} reply_parts;

static bool parse_reply(zmq_msg_t *f, int n, reply_parts *p) {
  if (n < 3 || n > 4 || zmq_msg_size(&f[0]) != 0) return false;
  *p = (reply_parts){n == 4 ? &f[1] : NULL, &f[n - 2], &f[n - 1]};
  return zmq_msg_size(p->seq) == 8;
}

/* Whether a reply's topic is inside the subscription (prefix w->topic). */
static bool topic_ok(const kvbm__replay_window *w, zmq_msg_t *topic) {
  if (!topic || !w->topic || !*w->topic) return true;
  size_t pl = strlen(w->topic);
  return zmq_msg_size(topic) >= pl && !memcmp(zmq_msg_data(topic), w->topic, pl);
}

void kvbm__replay_fetch(void *zctx, void **dealer, const char *endpoint,
                        kvbm__replay_window *w, kvbm__replay_take_fn take, void *user,
                        kvbm__replay_result *res) {
  *res = (kvbm__replay_result){0};
  if (send_request(dealer, zctx, endpoint, w->from)) {
    fail(dealer, res, "cannot send the request");
    return;
  }
  for (;;) {
    zmq_msg_t f[4];
    int n = next_reply(*dealer, w, f);
    if (n <= 0) {
      fail(dealer, res, n ? "socket error" : "deadline passed");
      return;
    }
    reply_parts rp;
    if (!parse_reply(f, n, &rp)) {
      for (int i = 0; i < n && i < 4; i++) zmq_msg_close(&f[i]);
      fail(dealer, res, "malformed reply");
      return;
    }
    uint64_t seq = ev_get_be64(zmq_msg_data(rp.seq));
    size_t len = zmq_msg_size(rp.payload);
    res->with_topic += rp.topic && seq != UINT64_MAX;
    /* a batch of another topic is not ours (the end marker's is empty) */
    kvbm__replay_verdict v = seq != UINT64_MAX && !topic_ok(w, rp.topic)
                                 ? KVBM__REPLAY_SKIP
                                 : kvbm__replay_check(w, seq, len, kvbm_clock_ns());
    int stop = 0;
    if (v == KVBM__REPLAY_TAKE) {
      stop = take(user, seq, zmq_msg_data(rp.payload), len);
      if (!stop) res->taken++;
    } else if (v == KVBM__REPLAY_SKIP || v == KVBM__REPLAY_TOO_LARGE) {
      res->refused++;
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    if (v == KVBM__REPLAY_END) return;
    if (v == KVBM__REPLAY_LATE) {
      fail(dealer, res, "deadline passed");
      return;
    }
    if (v == KVBM__REPLAY_FULL || stop) {
      res->full = true;
      fail(dealer, res, "no room (byte budget)");
      return;
    }
  }
}

/* ------------------------------------------------------------- server */

bool kvbm__replay_request(zmq_msg_t *f, int n, uint64_t *start) {
  if (n != 3 || zmq_msg_size(&f[1]) != 0 || zmq_msg_size(&f[2]) != 8) return false;
  *start = ev_get_be64(zmq_msg_data(&f[2]));
  return true;
}

int kvbm__replay_reply(void *router, zmq_msg_t *id, const char *topic, size_t topic_len,
                       bool legacy, uint64_t seq, const void *data, size_t len) {
  uint8_t seqb[8];
  ev_put_be64(seqb, seq);
  if (zmq_send(router, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE) < 0 ||
      zmq_send(router, "", 0, ZMQ_SNDMORE) < 0 ||
      (!legacy && zmq_send(router, topic ? topic : "", topic_len, ZMQ_SNDMORE) < 0) ||
      zmq_send(router, seqb, 8, ZMQ_SNDMORE) < 0 || zmq_send(router, data, len, 0) < 0)
    return -1;
  return 0;
}

int kvbm__replay_end(void *router, zmq_msg_t *id, bool legacy) {
  /* vLLM's marker: an empty topic (new shape), -1, an empty payload */
  return kvbm__replay_reply(router, id, "", 0, legacy, UINT64_MAX, "", 0);
}
