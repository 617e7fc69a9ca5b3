/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink_jetstream.c: batches into a NATS JetStream stream (libnats).
 *
 * The plain NATS sink is fire-and-forget: a consumer that is not connected
 * when a batch goes by never sees it. A stream keeps the batches (in files
 * on the server, by default) within its limits, so a router that was
 * stopped, or a second router started later, reads everything from where
 * it stands, without asking any engine to replay. The message is the same
 * msgpack payload with the same "Kvbm-Seq" header as on plain NATS.
 *
 * The stream is added when it does not exist (subjects: the configured
 * pattern, by default the subject itself), with the configured limits;
 * one that exists is used as it is. Publishing is asynchronous (libnats
 * keeps up to max_pending batches in flight and the server acknowledges
 * each): a synchronous publish would cost the publisher thread a round
 * trip per batch. A batch the server refuses, or does not acknowledge, is
 * counted as a failed send when libnats reports it (its callback runs on
 * a libnats thread, hence the atomic counter), and those counts join the
 * publisher's sink_errors at the next send. On close every batch in
 * flight gets linger_ms to be acknowledged.
 */
#include <inttypes.h>
#include <nats/nats.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events/sink.h"

typedef struct jsink {
  ev_sink base;
  natsConnection *nc;
  jsCtx *js;
  char *subject;
  int linger_ms;
  _Atomic uint64_t failed;  /* publishes the server refused (libnats' thread) */
  uint64_t reported;        /* of them, already reported as send errors */
} jsink;

static void on_pub_error(jsCtx *js, jsPubAckErr *pae, void *closure) {
  (void)js;
  (void)pae; /* libnats destroys pae->Msg after the callback */
  jsink *j = closure;
  atomic_fetch_add_explicit(&j->failed, 1, memory_order_relaxed);
}

static int jsink_send(ev_sink *base, const kvbm_event_batch *b, const uint8_t *payload,
                      size_t len) {
  jsink *j = (jsink *)base;
  uint64_t failed = atomic_load_explicit(&j->failed, memory_order_relaxed);
  int rc = KVBM_OK;
  if (failed != j->reported) { /* an earlier batch was refused: one error now */
    j->reported = failed;
    rc = KVBM_EIO;
  }
  if (len > INT32_MAX) return KVBM_ETOOLONG;
  natsMsg *msg = NULL;
  natsStatus s = natsMsg_Create(&msg, j->subject, NULL, (const char *)payload, (int)len);
  char seq[24];
  snprintf(seq, sizeof seq, "%" PRIu64, b->seq);
  if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Kvbm-Seq", seq);
  if (s == NATS_OK) s = js_PublishMsgAsync(j->js, &msg, NULL); /* takes msg on success */
  natsMsg_Destroy(msg);
  return s == NATS_OK ? rc : KVBM_EIO;
}

static void jsink_close(ev_sink *base) {
  jsink *j = (jsink *)base;
  if (j->js) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = j->linger_ms;
    js_PublishAsyncComplete(j->js, &po);
    jsCtx_Destroy(j->js);
  }
  if (j->nc) {
    natsConnection_FlushTimeout(j->nc, j->linger_ms);
    natsConnection_Destroy(j->nc);
  }
  free(j->subject);
  free(j);
}

/* The stream: used when it exists, added otherwise. */
static int ensure_stream(jsink *j, const kvbm_jetstream_config *c, kvbm_error *err) {
  jsStreamInfo *si = NULL;
  jsErrCode jerr = 0;
  natsStatus s = js_GetStreamInfo(&si, j->js, c->stream, NULL, &jerr);
  if (s == NATS_OK) {
    jsStreamInfo_Destroy(si);
    return KVBM_OK;
  }
  if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
    return kvbm_error_set(err, KVBM_EIO, "events: jetstream %s: stream %s: %s (%d)", c->url,
                          c->stream, natsStatus_GetText(s), (int)jerr);
  if (!c->create)
    return kvbm_error_set(err, KVBM_ENOTFOUND, "events: jetstream %s: no stream %s", c->url,
                          c->stream);
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  const char *subjects[1] = {c->stream_subjects ? c->stream_subjects : c->subject};
  sc.Name = c->stream;
  sc.Subjects = subjects;
  sc.SubjectsLen = 1;
  sc.Storage = c->memory ? js_MemoryStorage : js_FileStorage;
  if (c->max_msgs) sc.MaxMsgs = (int64_t)c->max_msgs;
  if (c->max_bytes) sc.MaxBytes = (int64_t)c->max_bytes;
  if (c->max_age_s) sc.MaxAge = (int64_t)c->max_age_s * 1000000000;
  jerr = 0;
  s = js_AddStream(&si, j->js, &sc, NULL, &jerr);
  jsStreamInfo_Destroy(si);
  if (s != NATS_OK && jerr != JSStreamNameExistErr) /* a racing creator is fine */
    return kvbm_error_set(err, KVBM_EIO, "events: jetstream %s: add stream %s (%s): %s (%d)",
                          c->url, c->stream, subjects[0], natsStatus_GetText(s), (int)jerr);
  return KVBM_OK;
}

static bool bad_subject(const char *s, bool wild) {
  if (!s || !*s) return true;
  for (; *s; s++)
    if (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n' || (!wild && (*s == '*' || *s == '>')))
      return true;
  return false;
}

kvbm_jetstream_config kvbm_jetstream_config_default(const char *url, const char *stream,
                                                    const char *subject) {
  return (kvbm_jetstream_config){.url = url, .stream = stream, .subject = subject,
                                 .create = true, .max_pending = 4096, .linger_ms = 2000};
}

int kvbm__sink_jetstream_create(const kvbm_jetstream_config *c, ev_sink **out, kvbm_error *err) {
  if (!c || !c->url || !*c->url || !c->stream || !*c->stream)
    return kvbm_error_set(err, KVBM_EINVAL, "events: jetstream sink: empty url or stream");
  if (bad_subject(c->subject, false) || (c->stream_subjects && bad_subject(c->stream_subjects, true)))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: jetstream sink: subject \"%s\" (stream subjects \"%s\") is "
                          "empty or has a space, or a wildcard in the subject",
                          c->subject ? c->subject : "", c->stream_subjects ? c->stream_subjects : "");
  if (strpbrk(c->stream, " \t\r\n.*>"))
    return kvbm_error_set(err, KVBM_EINVAL, "events: jetstream sink: stream name \"%s\"", c->stream);
  jsink *j = calloc(1, sizeof *j);
  if (!j || !(j->subject = strdup(c->subject))) {
    free(j);
    return kvbm_error_set(err, KVBM_ENOMEM, "events: jetstream sink: out of memory");
  }
  j->base = (ev_sink){.wants_bytes = true, .send = jsink_send, .close = jsink_close};
  j->linger_ms = c->linger_ms > 0 ? c->linger_ms : 2000;
  natsStatus s = natsConnection_ConnectTo(&j->nc, c->url);
  int rc = KVBM_OK;
  if (s != NATS_OK) {
    rc = kvbm_error_set(err, KVBM_EIO, "events: jetstream sink: connect %s: %s", c->url,
                        natsStatus_GetText(s));
    j->nc = NULL;
  } else {
    jsOptions o;
    jsOptions_Init(&o);
    o.PublishAsync.MaxPending = c->max_pending > 0 ? c->max_pending : 4096;
    o.PublishAsync.ErrHandler = on_pub_error;
    o.PublishAsync.ErrHandlerClosure = j;
    s = natsConnection_JetStream(&j->js, j->nc, &o);
    if (s != NATS_OK)
      rc = kvbm_error_set(err, KVBM_EIO, "events: jetstream sink: %s", natsStatus_GetText(s));
    else
      rc = ensure_stream(j, c, err);
  }
  if (rc) {
    jsink_close(&j->base);
    return rc;
  }
  *out = &j->base;
  return KVBM_OK;
}
