/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink_nats.c: batches to a NATS subject (libnats).
 *
 * The message body is the same msgpack payload as the ZMQ third frame, so
 * one decoder serves both transports; the sequence number and topic travel
 * as a NATS header ("Kvbm-Seq"), which NATS has carried since
 * server 2.2. A publish that fails (server gone, the client's buffer full
 * while it reconnects) is counted by the publisher (sink_errors), never
 * retried here: a consumer that needs every batch uses the ZMQ sink's
 * replay. The connection redials for as long as the sink lives (libnats'
 * default gives up after 60 tries, two minutes, and every publish after
 * that would fail); while it is down libnats buffers up to its reconnect
 * buffer (8 MiB) and refuses the rest, which is counted. Batches that were
 * in flight when the server went away are lost without the publisher
 * knowing: the subscriber sees them as a gap in Kvbm-Seq.
 *
 * libnats keeps library-wide state of its own (nats_Open on first use);
 * kvbm never calls nats_Close, which would tear it down for every other
 * user in the process.
 */
#include <inttypes.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events/sink.h"

typedef struct nsink {
  ev_sink base;
  natsConnection *nc;
  char *subject;
} nsink;

static int nsink_send(ev_sink *base, const kvbm_event_batch *b, const uint8_t *payload,
                      size_t len) {
  nsink *n = (nsink *)base;
  if (len > INT32_MAX) return KVBM_ETOOLONG;
  natsMsg *msg = NULL;
  natsStatus s = natsMsg_Create(&msg, n->subject, NULL, (const char *)payload, (int)len);
  char seq[24];
  snprintf(seq, sizeof seq, "%" PRIu64, b->seq);
  if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Kvbm-Seq", seq);
  if (s == NATS_OK) s = natsConnection_PublishMsg(n->nc, msg);
  natsMsg_Destroy(msg);
  return s == NATS_OK ? 0 : KVBM_EIO;
}

static void nsink_close(ev_sink *base) {
  nsink *n = (nsink *)base;
  if (n->nc) {
    natsConnection_FlushTimeout(n->nc, 2000);
    natsConnection_Destroy(n->nc);
  }
  free(n->subject);
  free(n);
}

int kvbm__sink_nats_create(const char *url, const char *subject, ev_sink **out, kvbm_error *err) {
  if (!url || !*url || !subject || !*subject)
    return kvbm_error_set(err, KVBM_EINVAL, "events: nats sink: empty url or subject");
  for (const char *p = subject; *p; p++)
    if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '*' || *p == '>')
      return kvbm_error_set(err, KVBM_EINVAL,
                            "events: nats sink: subject \"%s\" has a space or a wildcard",
                            subject);
  nsink *n = calloc(1, sizeof *n);
  if (!n || !(n->subject = strdup(subject))) {
    free(n);
    return kvbm_error_set(err, KVBM_ENOMEM, "events: nats sink: out of memory");
  }
  n->base = (ev_sink){.wants_bytes = true, .send = nsink_send, .close = nsink_close};
  natsOptions *o = NULL;
  natsStatus s = natsOptions_Create(&o);
  if (s == NATS_OK) s = natsOptions_SetURL(o, url);
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(o, -1);
  if (s == NATS_OK) s = natsConnection_Connect(&n->nc, o);
  natsOptions_Destroy(o);
  if (s != NATS_OK) {
    int rc = kvbm_error_set(err, KVBM_EIO, "events: nats sink: connect %s: %s", url,
                            natsStatus_GetText(s));
    n->nc = NULL;
    nsink_close(&n->base);
    return rc;
  }
  *out = &n->base;
  return KVBM_OK;
}
