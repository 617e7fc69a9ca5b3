/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events/nats_in.h: the subscriber's NATS transport (nats_in.c): one
 * subject of kvbm's NATS sink read as a pull stream, and the Kvbm-Seq
 * header both NATS readers (this and the JetStream consumer) parse.
 * Private to src/events.
 */
#ifndef KVBM_EVENTS_NATS_IN_H
#define KVBM_EVENTS_NATS_IN_H

#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

typedef struct kvbm__nats_in {
  natsConnection *nc;
  natsSubscription *sub;
  natsStatistics *stats; /* for the reconnect count */
  natsMsg *cur;          /* the message last returned, until released */
} kvbm__nats_in;

/* Whether `url` names a NATS server (nats://, tls://; a list of them). */
bool kvbm__nats_in_is_url(const char *url);

/* Checks a subject one reader may follow: non-empty, no spaces, no
 * wildcard token (one engine's stream: a wildcard mixes streams whose
 * numbers are unrelated). 0, or KVBM_EINVAL with err set. */
int kvbm__nats_in_check_subject(const char *subject, kvbm_error *err);

/* Connects to `url` (reconnecting for as long as it lives), subscribes to
 * `subject` with libnats' queue bounded to max_bytes (what it drops beyond
 * shows as gaps and in kvbm__nats_in_counts), and waits until the server
 * has the subscription. KVBM_EIO when the server does not answer. On
 * failure *in is left for kvbm__nats_in_close. */
int kvbm__nats_in_open(kvbm__nats_in *in, const char *url, const char *subject,
                       size_t max_bytes, kvbm_error *err);

/* Waits up to wait_ms (> 0; 0: no wait) for the next message and makes it
 * in->cur (the previous one must be released). KVBM_OK, KVBM_ETIMEDOUT,
 * KVBM_EIO (the connection is closed for good). */
int kvbm__nats_in_next(kvbm__nats_in *in, int wait_ms, kvbm_error *err);

/* Frees in->cur. */
void kvbm__nats_in_release(kvbm__nats_in *in);

/* What libnats counted: messages it dropped for the queue's bound, and
 * reconnections. */
void kvbm__nats_in_counts(kvbm__nats_in *in, uint64_t *dropped, uint64_t *reconnects);

void kvbm__nats_in_close(kvbm__nats_in *in);

/* A message's Kvbm-Seq header: false when absent or not a decimal
 * number below 2^64. */
bool kvbm__nats_seq(natsMsg *m, uint64_t *seq);

#endif
