/*
 * subscriber.c: reads an engine's ZMQ event stream in sequence order,
 * recovering gaps through its replay socket.
 *
 * State: `expected`, the next sequence number wanted. A live message with
 * that number is decoded straight from the ZMQ frame (no copy). A lower one
 * is a duplicate (already delivered, e.g. by replay) and skipped. A higher
 * one is a gap: the subscriber sends the replay ROUTER [ "", expected ] on a
 * DEALER socket (the ROUTER sees [identity, "", expected], as from vLLM's
 * REQ clients) and reads [ "", seq, payload ] replies until the end marker
 * (seq -1); the replies, then the live message, go to a FIFO of copies that
 * later calls return in order. Whatever replay did not cover is reported as
 * `lost_before` on the next batch delivered. A subscriber created with
 * start_seq >= 0 asks for replay before its first live message (a late
 * joiner); messages that arrive meanwhile are sorted out by the same rules.
 *
 * A reply that does not come within replay_timeout_ms, or a malformed one,
 * abandons that replay: the DEALER is closed and made anew, so late replies
 * to the abandoned request cannot be mistaken for the next one's.
 *
 * Malformed live messages (frame count, sequence frame size, payload size,
 * payload content) are counted by kind and returned as errors: one call,
 * one message; the stream goes on with the next call.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "events/sink.h"
#include "kvbm/events.h"
#include "events/zframes.h"

typedef struct pend {
  uint64_t seq;
  uint8_t *data;
  size_t len;
  bool replayed;
} pend;

struct kvbm_subscriber {
  kvbm_subscriber_config o;
  char *endpoint, *replay_endpoint, *topic;
  void *zctx, *sub, *dealer;
  kvbm_event_decoder *dec;
  bool joined, have_expected;
  uint64_t expected;
  pend *q;          /* FIFO: q[qh..qn) */
  size_t qh, qn, qcap, qbytes;
  zmq_msg_t cur;    /* the live payload last returned */
  bool cur_open;
  uint8_t *cur_buf; /* or the pending copy last returned */
  kvbm_subscriber_stats st;
};

#define MAX_PENDING ((size_t)1 << 20)

kvbm_subscriber_config kvbm_subscriber_config_default(const char *endpoint) {
  return (kvbm_subscriber_config){.endpoint = endpoint, .bind = false, .topic = NULL,
                                   .replay_endpoint = NULL, .start_seq = -1,
                                   .replay_timeout_ms = 1000, .max_payload = (size_t)64 << 20};
}

static char *dup_or_null(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

void kvbm_subscriber_destroy(kvbm_subscriber *s) {
  if (!s) return;
  int zero = 0;
  if (s->cur_open) zmq_msg_close(&s->cur);
  if (s->sub) zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof zero), zmq_close(s->sub);
  if (s->dealer) zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof zero), zmq_close(s->dealer);
  if (s->zctx) zmq_ctx_term(s->zctx);
  for (size_t i = s->qh; i < s->qn; i++) free(s->q[i].data);
  free(s->q);
  free(s->cur_buf);
  kvbm_event_decoder_destroy(s->dec);
  free(s->endpoint);
  free(s->replay_endpoint);
  free(s->topic);
  free(s);
}

int kvbm_subscriber_create(const kvbm_subscriber_config *opts, kvbm_subscriber **out,
                        kvbm_error *err) {
  if (!opts || !out || !opts->endpoint || !*opts->endpoint)
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: no endpoint");
  if (opts->start_seq < -1 || opts->replay_timeout_ms < 0 || opts->max_payload == 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: subscriber: start_seq < -1, negative replay timeout or "
                          "zero max_payload");
  kvbm_subscriber *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "events: subscriber: out of memory");
  s->o = *opts;
  bool oom = false;
  s->endpoint = dup_or_null(opts->endpoint, &oom);
  s->replay_endpoint = dup_or_null(opts->replay_endpoint, &oom);
  s->topic = dup_or_null(opts->topic ? opts->topic : "", &oom);
  int rc;
  if (oom) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "events: subscriber: out of memory");
    goto fail;
  }
  if ((rc = kvbm_event_decoder_create(&s->dec, err))) goto fail;
  s->zctx = zmq_ctx_new();
  s->sub = s->zctx ? zmq_socket(s->zctx, ZMQ_SUB) : NULL;
  if (!s->sub) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: subscriber: zmq: %s", zmq_strerror(errno));
    goto fail;
  }
  int hwm = 1000000;
  zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic));
  if ((opts->bind ? zmq_bind(s->sub, s->endpoint) : zmq_connect(s->sub, s->endpoint)) < 0) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: subscriber: %s %s: %s",
                        opts->bind ? "bind" : "connect", s->endpoint, zmq_strerror(errno));
    goto fail;
  }
  *out = s;
  return KVBM_OK;
fail:
  kvbm_subscriber_destroy(s);
  return rc;
}

void kvbm_subscriber_stats_get(const kvbm_subscriber *s, kvbm_subscriber_stats *out) {
  if (s && out) *out = s->st;
}

/* -------------------------------------------------------------- pending */

static int push_pending(kvbm_subscriber *s, uint64_t seq, const void *data, size_t len,
                        bool replayed) {
  if (s->qn - s->qh >= MAX_PENDING || s->qbytes + len > 16 * s->o.max_payload)
    return KVBM_ENOSPC;
  if (s->qh > 0 && s->qn == s->qcap) { /* slide down before growing */
    memmove(s->q, s->q + s->qh, (s->qn - s->qh) * sizeof *s->q);
    s->qn -= s->qh;
    s->qh = 0;
  }
  if (s->qn == s->qcap) {
    size_t nc = s->qcap ? s->qcap * 2 : 64;
    pend *nq = realloc(s->q, nc * sizeof *nq);
    if (!nq) return KVBM_ENOMEM;
    s->q = nq;
    s->qcap = nc;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return KVBM_ENOMEM;
  if (len) memcpy(copy, data, len);
  s->q[s->qn++] = (pend){seq, copy, len, replayed};
  s->qbytes += len;
  return 0;
}

/* --------------------------------------------------------------- replay */

static void drop_dealer(kvbm_subscriber *s) {
  if (!s->dealer) return;
  int zero = 0;
  zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(s->dealer);
  s->dealer = NULL;
}

/* Waits up to timeout_ms for one multipart message and receives it into up
 * to 3 frames; returns the frame count (all of them), or -1 on timeout. */
static int recv_frames(void *sock, zmq_msg_t f[3], int timeout_ms) {
  zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
  if (zmq_poll(&it, 1, timeout_ms) <= 0) return -1;
  int n = ev_zframes_recv(sock, f);
  return n ? n : -1;
}

static void close_frames(zmq_msg_t f[3], int n) {
  for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
}

/* Asks for every batch from `start` on and queues the replies. */
static void replay_from(kvbm_subscriber *s, uint64_t start) {
  if (!s->replay_endpoint) return;
  if (!s->dealer) {
    s->dealer = zmq_socket(s->zctx, ZMQ_DEALER);
    if (!s->dealer || zmq_connect(s->dealer, s->replay_endpoint) < 0) {
      drop_dealer(s);
      s->st.replay_failures++;
      return;
    }
  }
  uint8_t b[8];
  ev_put_be64(b, start);
  s->st.replay_requests++;
  if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(s->dealer, b, 8, 0) < 0) {
    drop_dealer(s);
    s->st.replay_failures++;
    return;
  }
  for (;;) {
    zmq_msg_t f[3];
    int n = recv_frames(s->dealer, f, s->o.replay_timeout_ms);
    if (n < 0) { /* timeout */
      drop_dealer(s);
      s->st.replay_failures++;
      return;
    }
    bool ok = n == 3 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[1]) == 8;
    if (!ok) {
      close_frames(f, n);
      drop_dealer(s);
      s->st.replay_failures++;
      return;
    }
    const uint8_t *sb = zmq_msg_data(&f[1]);
    uint64_t seq = ev_get_be64(sb);
    if (seq == UINT64_MAX) { /* end marker: -1 */
      close_frames(f, n);
      return;
    }
    int rc = 0;
    if (seq >= start && zmq_msg_size(&f[2]) <= s->o.max_payload)
      rc = push_pending(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), true);
    close_frames(f, n);
    if (rc) { /* no room: stop here; what is missing shows as lost */
      drop_dealer(s);
      s->st.replay_failures++;
      return;
    }
  }
}

/* ----------------------------------------------------------------- recv */

static void release_current(kvbm_subscriber *s) {
  if (s->cur_open) zmq_msg_close(&s->cur);
  s->cur_open = false;
  free(s->cur_buf);
  s->cur_buf = NULL;
}

static int deliver(kvbm_subscriber *s, uint64_t seq, const uint8_t *data, size_t len,
                   bool replayed, kvbm_event_batch *out, const uint8_t **payload,
                   size_t *plen, kvbm_error *err) {
  uint64_t lost = seq > s->expected ? seq - s->expected : 0;
  s->st.lost += lost;
  s->expected = seq + 1;
  int rc = kvbm_event_decode(s->dec, data, len, seq, out, err);
  if (rc) {
    s->st.malformed++;
    s->st.bad_payload++;
    return rc;
  }
  out->lost_before = lost;
  out->replayed = replayed;
  s->st.delivered++;
  s->st.events += out->num_events;
  if (replayed) s->st.replayed++;
  if (payload) *payload = data;
  if (plen) *plen = len;
  return KVBM_OK;
}

static int remaining_ms(const struct timespec *dl, int timeout_ms) {
  if (timeout_ms < 0) return -1;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long ms = (dl->tv_sec - now.tv_sec) * 1000 + (dl->tv_nsec - now.tv_nsec) / 1000000;
  return ms > 0 ? (int)ms : 0;
}

int kvbm_subscriber_recv_raw(kvbm_subscriber *s, int timeout_ms, kvbm_event_batch *out,
                             const uint8_t **payload, size_t *payload_len, kvbm_error *err) {
  if (!s || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: NULL argument");
  release_current(s);
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ms > 0) {
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
  }
  if (!s->joined) {
    s->joined = true;
    if (s->o.start_seq >= 0) {
      s->expected = (uint64_t)s->o.start_seq;
      s->have_expected = true;
      replay_from(s, s->expected);
    }
  }
  for (;;) {
    while (s->qh < s->qn) { /* replayed and held batches first, in order */
      pend p = s->q[s->qh++];
      s->qbytes -= p.len;
      if (s->qh == s->qn) s->qh = s->qn = 0;
      if (s->have_expected && p.seq < s->expected) {
        s->st.duplicates += !p.replayed;
        free(p.data);
        continue;
      }
      s->have_expected = true;
      s->cur_buf = p.data;
      return deliver(s, p.seq, p.data, p.len, p.replayed, out, payload, payload_len, err);
    }
    zmq_msg_t f[3];
    int n = recv_frames(s->sub, f, remaining_ms(&dl, timeout_ms));
    if (n < 0) {
      if (errno == ETERM || errno == ENOTSOCK)
        return kvbm_error_set(err, KVBM_EIO, "events: subscriber: socket closed");
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "events: subscriber: nothing within %d ms",
                            timeout_ms);
    }
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
    uint64_t seq = ev_get_be64(zmq_msg_data(&f[1]));
    zmq_msg_close(&f[0]);
    zmq_msg_close(&f[1]);
    if (!s->have_expected) {
      s->expected = seq;
      s->have_expected = true;
    }
    if (seq < s->expected) {
      s->st.duplicates++;
      zmq_msg_close(&f[2]);
      continue;
    }
    if (seq > s->expected && s->replay_endpoint) {
      s->st.gaps++;
      replay_from(s, s->expected);
      int rc = push_pending(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), false);
      zmq_msg_close(&f[2]);
      if (rc) { /* cannot hold it: count it lost with the rest */
        s->st.replay_failures++;
      }
      continue;
    }
    if (seq > s->expected) s->st.gaps++;
    s->cur = f[2];
    s->cur_open = true;
    return deliver(s, seq, zmq_msg_data(&s->cur), zmq_msg_size(&s->cur), false, out, payload,
                   payload_len, err);
  }
}

int kvbm_subscriber_recv(kvbm_subscriber *sub, int timeout_ms, kvbm_event_batch *out,
                         kvbm_error *err) {
  return kvbm_subscriber_recv_raw(sub, timeout_ms, out, NULL, NULL, err);
}
