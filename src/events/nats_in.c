/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats_in.c: the subscriber's NATS transport: one subject of kvbm's NATS
 * sink, read as a pull stream.
 *
 * Why a synchronous subscription: the subscriber is a pull API (recv with
 * a timeout, one thread), and its FIFO, held batches, sequence tracker and
 * replay client are that thread's alone. With libnats' asynchronous
 * delivery every message would arrive on a libnats thread and all of that
 * would need a lock, and the close would have to wait for the last
 * callback. Here libnats' own reader thread only fills the subscription's
 * queue; nothing of ours runs on it, so nothing of ours is shared.
 *
 * Memory: libnats queues what the server sends until recv takes it. The
 * queue is bounded in bytes (natsSubscription_SetPendingLimits); past
 * the bound libnats drops messages and counts them (GetDropped): the
 * subscriber reports them as overflow, and their numbers as a gap.
 *
 * The connection redials for as long as the subscriber lives (libnats'
 * default gives up after 60 tries, and a reader of an engine's stream must
 * outlive an outage); what the engine sent meanwhile is a gap.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "events/nats_in.h"

bool kvbm__nats_in_is_url(const char *url) {
  return url && (!strncmp(url, "nats://", 7) || !strncmp(url, "tls://", 6));
}

int kvbm__nats_in_check_subject(const char *subject, kvbm_error *err) {
  if (!subject || !*subject)
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: a NATS endpoint needs a subject");
  if (strpbrk(subject, " \t\r\n"))
    return kvbm_error_set(err, KVBM_EINVAL, "events: subscriber: subject '%s' has white space",
                          subject);
  /* a token that is exactly '*' or '>' */
  for (const char *t = subject; t; t = strchr(t, '.') ? strchr(t, '.') + 1 : NULL)
    if ((t[0] == '*' || t[0] == '>') && (t[1] == '.' || t[1] == '\0'))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "events: subscriber: subject '%s' has a wildcard: one subscriber "
                            "reads one engine's stream", subject);
  return KVBM_OK;
}

int kvbm__nats_in_open(kvbm__nats_in *in, const char *url, const char *subject,
                       size_t max_bytes, kvbm_error *err) {
  memset(in, 0, sizeof *in);
  natsOptions *o = NULL;
  natsStatus st = natsOptions_Create(&o);
  if (st == NATS_OK) st = natsOptions_SetURL(o, url);
  if (st == NATS_OK) st = natsOptions_SetMaxReconnect(o, -1);
  if (st == NATS_OK) st = natsConnection_Connect(&in->nc, o);
  if (st == NATS_OK) st = natsConnection_SubscribeSync(&in->sub, in->nc, subject);
  if (st == NATS_OK)
    st = natsSubscription_SetPendingLimits(in->sub, -1,
                                           max_bytes > INT_MAX ? INT_MAX : (int)max_bytes);
  /* the server has the subscription when this returns: what is published
   * after the subscriber is made reaches it */
  if (st == NATS_OK) st = natsConnection_FlushTimeout(in->nc, 2000);
  if (st == NATS_OK) st = natsStatistics_Create(&in->stats);
  natsOptions_Destroy(o);
  if (st != NATS_OK)
    return kvbm_error_set(err, KVBM_EIO, "events: subscriber: NATS %s subject %s: %s", url,
                          subject, natsStatus_GetText(st));
  return KVBM_OK;
}

int kvbm__nats_in_next(kvbm__nats_in *in, int wait_ms, kvbm_error *err) {
  for (;;) {
    natsMsg *m = NULL;
    natsStatus st = natsSubscription_NextMsg(&m, in->sub, wait_ms);
    if (st == NATS_OK) {
      in->cur = m;
      return KVBM_OK;
    }
    /* libnats dropped messages for the bound: said once, then the next
     * message comes (the drops show as a gap and in the counts) */
    if (st == NATS_SLOW_CONSUMER) continue;
    if (st == NATS_TIMEOUT)
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "events: subscriber: nothing within %d ms",
                            wait_ms);
    return kvbm_error_set(err, KVBM_EIO, "events: subscriber: NATS: %s", natsStatus_GetText(st));
  }
}

void kvbm__nats_in_release(kvbm__nats_in *in) {
  natsMsg_Destroy(in->cur);
  in->cur = NULL;
}

void kvbm__nats_in_counts(kvbm__nats_in *in, uint64_t *dropped, uint64_t *reconnects) {
  int64_t d = 0;
  if (in->sub && natsSubscription_GetDropped(in->sub, &d) == NATS_OK && d > 0)
    *dropped = (uint64_t)d;
  uint64_t im, ib, om, ob, r;
  if (in->nc && in->stats && natsConnection_GetStats(in->nc, in->stats) == NATS_OK &&
      natsStatistics_GetCounts(in->stats, &im, &ib, &om, &ob, &r) == NATS_OK)
    *reconnects = r;
}

void kvbm__nats_in_close(kvbm__nats_in *in) {
  kvbm__nats_in_release(in);
  if (in->sub) {
    natsSubscription_Unsubscribe(in->sub);
    natsSubscription_Destroy(in->sub);
  }
  natsConnection_Destroy(in->nc);
  natsStatistics_Destroy(in->stats);
  memset(in, 0, sizeof *in);
}

bool kvbm__nats_seq(natsMsg *m, uint64_t *seq) {
  const char *h = NULL;
  /* digits only: strtoull alone would take " 5", "+5" and "-5" */
  if (natsMsgHeader_Get(m, "Kvbm-Seq", &h) != NATS_OK || !h || *h < '0' || *h > '9')
    return false;
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(h, &end, 10);
  if (errno || end == h || *end) return false;
  *seq = x;
  return true;
}
