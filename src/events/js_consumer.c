/* SPDX-License-Identifier: Apache-2.0 */
/*
 * js_consumer.c: reading kvbm's batches from a JetStream stream with a
 * durable consumer (libnats pull subscription).
 *
 * Why durable: the server keeps the consumer's position (its ack floor)
 * under its name, so a reader that stops and starts again goes on where
 * it stood, and two readers with two names each read the whole stream
 * on their own: router replicas need no coordination of kvbm's.
 *
 * Position. Acks are AckAll: acking the last message returned acks all
 * before it. The caller acks what it no longer needs again (a router: what
 * its last snapshot holds), so that after a crash the messages since then
 * come again. A pull consumer only redelivers an unacked message after
 * ack_wait, and then behind newer ones; so when the consumer is opened and
 * finds messages delivered but not acked, it is re-bound (deleted and added
 * again under the same name) at its ack floor + 1: they come again at once
 * and in stream order. resume_after re-binds it at a given stream position
 * (the one a snapshot recorded), from_start at the stream's start (a reader
 * whose state starts empty). Without a consumer of that name, one is
 * added that reads the stream from its start.
 *
 * Messages carry the batch's sequence number in the "Kvbm-Seq" header, as
 * on plain NATS; one without it, or one whose payload does not decode, is
 * returned as an error, counted, and its place in the stream is still
 * taken (the next ack covers it).
 */
#include <inttypes.h>
#include <nats/nats.h>
#include <stdlib.h>
#include <string.h>

#include "events/nats_in.h"
#include "kvbm/events.h"

struct kvbm_js_consumer {
  kvbm_js_consumer_config o;
  char *stream, *durable, *filter;
  natsConnection *nc;
  jsCtx *js;
  natsSubscription *sub;
  natsMsgList list; /* the last fetch; taken messages are NULL in it */
  int next;         /* the next message of list to return */
  natsMsg *last;    /* the last message returned: what an ack acks up to */
  bool last_acked;
  kvbm_event_decoder *dec;
  kvbm_js_consumer_stats st;
};

kvbm_js_consumer_config kvbm_js_consumer_config_default(const char *url, const char *stream,
                                                        const char *durable) {
  return (kvbm_js_consumer_config){.url = url, .stream = stream, .durable = durable,
                                   .fetch = 256, .ack_wait_ms = 60000,
                                   .max_payload = (size_t)64 << 20};
}

void kvbm_js_consumer_destroy(kvbm_js_consumer *c) {
  if (!c) return;
  natsMsgList_Destroy(&c->list);
  natsMsg_Destroy(c->last);
  if (c->sub) {
    natsSubscription_Unsubscribe(c->sub); /* the durable consumer stays on the server */
    natsSubscription_Destroy(c->sub);
  }
  jsCtx_Destroy(c->js);
  if (c->nc) {
    natsConnection_FlushTimeout(c->nc, 2000);
    natsConnection_Destroy(c->nc);
  }
  kvbm_event_decoder_destroy(c->dec);
  free(c->stream);
  free(c->durable);
  free(c->filter);
  free(c);
}

static int js_fail(kvbm_error *err, const char *what, const kvbm_js_consumer *c, natsStatus s,
                   jsErrCode jerr) {
  return kvbm_error_set(err, KVBM_EIO, "events: jetstream consumer %s on %s: %s: %s (%d)",
                        c->durable, c->stream, what, natsStatus_GetText(s), (int)jerr);
}

/* Adds the durable consumer, reading from stream position `start` (0: the
 * start of the stream). */
static int add_consumer(kvbm_js_consumer *c, uint64_t start, kvbm_error *err) {
  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = c->durable;
  cc.AckPolicy = js_AckAll;
  cc.AckWait = c->o.ack_wait_ms * 1000000;
  cc.MaxAckPending = -1; /* acks come with snapshots: no bound on what waits for one */
  cc.FilterSubject = c->filter;
  if (start > 1) {
    cc.DeliverPolicy = js_DeliverByStartSequence;
    cc.OptStartSeq = start;
  }
  jsConsumerInfo *ci = NULL;
  jsErrCode jerr = 0;
  natsStatus s = js_AddConsumer(&ci, c->js, c->stream, &cc, NULL, &jerr);
  jsConsumerInfo_Destroy(ci);
  if (s != NATS_OK) return js_fail(err, "add", c, s, jerr);
  return KVBM_OK;
}

/* Finds or makes the durable consumer at the right position (see the top). */
static int bind(kvbm_js_consumer *c, kvbm_error *err) {
  jsConsumerInfo *ci = NULL;
  jsErrCode jerr = 0;
  natsStatus s = js_GetConsumerInfo(&ci, c->js, c->stream, c->durable, NULL, &jerr);
  if (s != NATS_OK && s != NATS_NOT_FOUND && jerr != JSConsumerNotFoundErr)
    return js_fail(err, "info", c, s, jerr);
  bool exists = s == NATS_OK;
  uint64_t start = 0;
  if (c->o.resume_after) {
    start = c->o.resume_after + 1;
  } else if (c->o.from_start) {
    start = 1;
  } else if (exists && ci->NumAckPending > 0) {
    /* delivered, never acked: again, now, in order. A consumer added at a
     * start position reports a floor of 0 until its first ack: its floor
     * is then the position before its start. */
    uint64_t floor = ci->AckFloor.Stream;
    if (ci->Config && ci->Config->DeliverPolicy == js_DeliverByStartSequence &&
        ci->Config->OptStartSeq > floor + 1)
      floor = ci->Config->OptStartSeq - 1;
    start = floor + 1;
  } else if (exists) {
    jsConsumerInfo_Destroy(ci);
    return KVBM_OK; /* it stands where it stopped */
  }
  jsConsumerInfo_Destroy(ci);
  if (exists) {
    jerr = 0;
    s = js_DeleteConsumer(c->js, c->stream, c->durable, NULL, &jerr);
    if (s != NATS_OK && jerr != JSConsumerNotFoundErr) return js_fail(err, "re-bind", c, s, jerr);
    c->st.rebinds++;
  }
  return add_consumer(c, start, err);
}

int kvbm_js_consumer_create(const kvbm_js_consumer_config *o, kvbm_js_consumer **out,
                            kvbm_error *err) {
  if (!o || !out || !o->url || !o->stream || !*o->stream || !o->durable || !*o->durable)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: jetstream consumer: url, stream and durable are required");
  if (strpbrk(o->durable, " \t\r\n.*>") || strpbrk(o->stream, " \t\r\n.*>"))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: jetstream consumer: stream \"%s\" or name \"%s\" has a space, "
                          "a dot or a wildcard", o->stream, o->durable);
  if (o->fetch < 0 || o->ack_wait_ms < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "events: jetstream consumer: negative fetch or ack_wait");
  kvbm_js_consumer *c = calloc(1, sizeof *c);
  if (!c) return kvbm_error_set(err, KVBM_ENOMEM, "events: jetstream consumer: out of memory");
  c->o = *o;
  if (!c->o.fetch) c->o.fetch = 256;
  if (!c->o.ack_wait_ms) c->o.ack_wait_ms = 60000;
  if (!c->o.max_payload) c->o.max_payload = (size_t)64 << 20;
  c->stream = strdup(o->stream);
  c->durable = strdup(o->durable);
  c->filter = o->filter ? strdup(o->filter) : NULL;
  int rc = kvbm_event_decoder_create(&c->dec, err);
  if (!rc && (!c->stream || !c->durable || (o->filter && !c->filter)))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "events: jetstream consumer: out of memory");
  natsStatus s = NATS_OK;
  if (!rc && (s = natsConnection_ConnectTo(&c->nc, o->url)) != NATS_OK) {
    c->nc = NULL;
    rc = kvbm_error_set(err, KVBM_EIO, "events: jetstream consumer: connect %s: %s", o->url,
                        natsStatus_GetText(s));
  }
  if (!rc && (s = natsConnection_JetStream(&c->js, c->nc, NULL)) != NATS_OK)
    rc = js_fail(err, "context", c, s, 0);
  if (!rc) rc = bind(c, err);
  if (!rc) {
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = c->stream;
    so.Consumer = c->durable;
    jsErrCode jerr = 0;
    s = js_PullSubscribe(&c->sub, c->js, c->filter, c->durable, NULL, &so, &jerr);
    if (s != NATS_OK) rc = js_fail(err, "subscribe", c, s, jerr);
  }
  if (rc) {
    kvbm_js_consumer_destroy(c);
    return rc;
  }
  *out = c;
  return KVBM_OK;
}

/* The next fetched message, fetching when none is left. */
static int next_msg(kvbm_js_consumer *c, int timeout_ms, natsMsg **m, kvbm_error *err) {
  while (c->next >= c->list.Count) {
    natsMsgList_Destroy(&c->list);
    memset(&c->list, 0, sizeof c->list);
    c->next = 0;
    jsErrCode jerr = 0;
    natsStatus s = natsSubscription_Fetch(&c->list, c->sub, c->o.fetch,
                                          timeout_ms < 0 ? INT32_MAX : timeout_ms, &jerr);
    if (s == NATS_TIMEOUT || (s == NATS_OK && c->list.Count == 0))
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "events: jetstream consumer: nothing");
    if (s != NATS_OK) return js_fail(err, "fetch", c, s, jerr);
  }
  *m = c->list.Msgs[c->next];
  c->list.Msgs[c->next++] = NULL; /* ours now */
  return KVBM_OK;
}

int kvbm_js_consumer_recv(kvbm_js_consumer *c, int timeout_ms, kvbm_event_batch *out,
                          kvbm_js_msg *info, kvbm_error *err) {
  if (!c || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: jetstream consumer: NULL");
  natsMsg *m = NULL;
  int rc = next_msg(c, timeout_ms, &m, err);
  if (rc) return rc;
  natsMsg_Destroy(c->last);
  c->last = m;
  c->last_acked = false;
  c->st.messages++;
  jsMsgMetaData *meta = NULL;
  uint64_t sseq = 0;
  bool redelivered = false;
  if (natsMsg_GetMetaData(&meta, m) == NATS_OK) {
    sseq = meta->Sequence.Stream;
    redelivered = meta->NumDelivered > 1;
    jsMsgMetaData_Destroy(meta);
  }
  c->st.redelivered += redelivered;
  if (info) *info = (kvbm_js_msg){sseq, natsMsg_GetSubject(m), redelivered};
  uint64_t seq = 0;
  if (!kvbm__nats_seq(m, &seq)) {
    c->st.malformed++;
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "events: jetstream consumer: message %" PRIu64 " (%s) has no valid "
                          "Kvbm-Seq header", sseq, natsMsg_GetSubject(m));
  }
  int len = natsMsg_GetDataLength(m);
  if (len < 0 || (size_t)len > c->o.max_payload) {
    c->st.malformed++;
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "events: jetstream consumer: message %" PRIu64 ": %d bytes, limit %zu",
                          sseq, len, c->o.max_payload);
  }
  rc = kvbm_event_decode(c->dec, natsMsg_GetData(m), (size_t)len, seq, out, err);
  if (rc) {
    c->st.malformed++;
    return rc;
  }
  c->st.delivered++;
  c->st.events += out->num_events;
  return KVBM_OK;
}

int kvbm_js_consumer_ack(kvbm_js_consumer *c, kvbm_error *err) {
  if (!c) return kvbm_error_set(err, KVBM_EINVAL, "events: jetstream consumer: NULL");
  if (!c->last || c->last_acked) return KVBM_OK;
  jsErrCode jerr = 0;
  natsStatus s = natsMsg_AckSync(c->last, NULL, &jerr);
  if (s != NATS_OK) return js_fail(err, "ack", c, s, jerr);
  c->last_acked = true;
  c->st.acks++;
  return KVBM_OK;
}

void kvbm_js_consumer_stats_get(const kvbm_js_consumer *c, kvbm_js_consumer_stats *out) {
  if (c && out) *out = c->st;
}
