/* SPDX-License-Identifier: Apache-2.0 */
/*
 * applier.c: the manager's side of the storage hints (kvbm_hint_applier,
 * kvbm/advisor.h).
 *
 * The advisor publishes hints in terms of volume ids (the storage events'
 * storage_location); the manager knows tiers. The applier maps one to the
 * other with kvbm_manager_volume_id, at each batch (a volume that opens
 * late is found), and calls kvbm_manager_hint, which only queues a copy.
 * Receiving runs on the applier's own thread, a synchronous libnats
 * subscription polled with a short timeout so that destroy is prompt: the
 * engine's threads never decode, map or wait for anything here. Lost
 * batches (Kvbm-Seq gaps: libnats' pending limit shows up as one) are counted, never
 * replayed: hints are advice and the advisor repeats what still holds.
 * A hint names its KV cache group: one the manager has goes to that
 * group's block (kvbm_manager_hint_group), another is a foreign block.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

#include "kvbm/advisor.h"
#include "kvbm/manager.h"

struct kvbm_hint_applier {
  kvbm_manager *m;
  pthread_mutex_t mu;       /* guards st and dec */
  kvbm_hint_applier_stats st;
  kvbm_hint_decoder *dec;
  natsConnection *nc;
  natsSubscription *sub;
  pthread_t th;
  bool running;
  atomic_bool stop;
  bool have_seq;
  uint64_t next_seq;
};

kvbm_hint_applier_config kvbm_hint_applier_config_default(void) {
  return (kvbm_hint_applier_config){.max_pending_bytes = 16 << 20};
}

/* The tier of this manager whose volume id is (s, n); -1 when none. */
static int tier_of(kvbm_manager *m, const char *s, size_t n) {
  if (!s) return -1;
  for (int t = KVBM_TIER_G2; t < KVBM_TIER_COUNT; t++) {
    const char *id = kvbm_manager_volume_id(m, (kvbm_tier)t);
    if (id && strlen(id) == n && !memcmp(id, s, n)) return t;
  }
  return -1;
}

static void apply_locked(kvbm_hint_applier *ap, const kvbm_hint_batch *b) {
  ap->st.batches++;
  for (size_t i = 0; i < b->num_hints; i++) {
    const kvbm_wire_hint *h = &b->hints[i];
    ap->st.hints++;
    if (h->kind == KVBM_HINT_COMPACT) {
      ap->st.ignored++;
      continue;
    }
    if (h->group >= kvbm_manager_num_groups(ap->m)) { /* a group this model does not
                                                         have: another engine's block */
      ap->st.foreign++;
      continue;
    }
    int from = tier_of(ap->m, h->from, h->from_len);
    int to = h->kind == KVBM_HINT_DROP ? from : tier_of(ap->m, h->to, h->to_len);
    if (from < 0 || to < 0) {
      ap->st.foreign++;
      continue;
    }
    int rc = kvbm_manager_hint_group(ap->m, (kvbm_manager_hint_kind)h->kind, h->sequence_hash,
                                     h->group, (kvbm_tier)from, (kvbm_tier)to);
    if (rc == KVBM_OK) ap->st.applied++;
    else ap->st.not_applied++;
  }
}

void kvbm_hint_applier_apply(kvbm_hint_applier *ap, const kvbm_hint_batch *b) {
  if (!ap || !b || (b->num_hints && !b->hints)) return;
  pthread_mutex_lock(&ap->mu);
  apply_locked(ap, b);
  pthread_mutex_unlock(&ap->mu);
}

static void on_msg(kvbm_hint_applier *ap, natsMsg *msg) {
  const char *v = NULL;
  uint64_t seq = 0;
  bool has_seq = natsMsgHeader_Get(msg, "Kvbm-Seq", &v) == NATS_OK && v && *v;
  if (has_seq) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    has_seq = !errno && !*end;
    seq = x;
  }
  pthread_mutex_lock(&ap->mu);
  if (has_seq) { /* a step back is a restarted advisor: counted from there */
    if (ap->have_seq && seq > ap->next_seq) ap->st.lost += seq - ap->next_seq;
    ap->next_seq = seq + 1;
    ap->have_seq = true;
  }
  kvbm_hint_batch b;
  int len = natsMsg_GetDataLength(msg);
  if (kvbm_hint_decode(ap->dec, natsMsg_GetData(msg), len > 0 ? (size_t)len : 0, seq, &b, NULL))
    ap->st.bad_batches++;
  else
    apply_locked(ap, &b);
  pthread_mutex_unlock(&ap->mu);
}

static void *run(void *arg) {
  kvbm_hint_applier *ap = arg;
  while (!atomic_load(&ap->stop)) {
    natsMsg *msg = NULL;
    natsStatus st = natsSubscription_NextMsg(&msg, ap->sub, 100);
    if (st == NATS_OK && msg) {
      on_msg(ap, msg);
      natsMsg_Destroy(msg);
    }
  }
  return NULL;
}

static int subscribe(kvbm_hint_applier *ap, const kvbm_hint_applier_config *c, kvbm_error *err) {
  natsOptions *o = NULL;
  natsStatus st = natsOptions_Create(&o);
  if (st == NATS_OK) st = natsOptions_SetURL(o, c->nats_url);
  if (st == NATS_OK) st = natsOptions_SetMaxReconnect(o, -1);
  if (st == NATS_OK) st = natsConnection_Connect(&ap->nc, o);
  natsOptions_Destroy(o);
  if (st == NATS_OK) st = natsConnection_SubscribeSync(&ap->sub, ap->nc, c->subject);
  if (st == NATS_OK) st = natsSubscription_SetPendingLimits(ap->sub, -1, c->max_pending_bytes);
  if (st == NATS_OK) st = natsConnection_FlushTimeout(ap->nc, 2000);
  if (st != NATS_OK)
    return kvbm_error_set(err, KVBM_EIO, "hint applier: NATS %s subject %s: %s", c->nats_url,
                          c->subject, natsStatus_GetText(st));
  if (pthread_create(&ap->th, NULL, run, ap))
    return kvbm_error_set(err, KVBM_ENOMEM, "hint applier: cannot start its thread");
  ap->running = true;
  return KVBM_OK;
}

int kvbm_hint_applier_create(const kvbm_hint_applier_config *cfg, kvbm_manager *m,
                             kvbm_hint_applier **out, kvbm_error *err) {
  if (!out || !m) return kvbm_error_set(err, KVBM_EINVAL, "hint applier: NULL argument");
  *out = NULL;
  kvbm_hint_applier_config c = cfg ? *cfg : kvbm_hint_applier_config_default();
  if (c.nats_url && (!c.subject || !*c.subject))
    return kvbm_error_set(err, KVBM_EINVAL, "hint applier: a NATS URL needs a subject");
  if (c.max_pending_bytes <= 0)
    return kvbm_error_set(err, KVBM_EINVAL, "hint applier: max_pending_bytes must be > 0");
  kvbm_hint_applier *ap = calloc(1, sizeof *ap);
  if (!ap) return kvbm_error_set(err, KVBM_ENOMEM, "hint applier: out of memory");
  ap->m = m;
  pthread_mutex_init(&ap->mu, NULL);
  int rc = kvbm_hint_decoder_create(&ap->dec, err);
  if (!rc && c.nats_url) rc = subscribe(ap, &c, err);
  if (rc) {
    kvbm_hint_applier_destroy(ap);
    return rc;
  }
  *out = ap;
  return KVBM_OK;
}

void kvbm_hint_applier_stats_get(kvbm_hint_applier *ap, kvbm_hint_applier_stats *out) {
  if (!ap || !out) return;
  pthread_mutex_lock(&ap->mu);
  *out = ap->st;
  pthread_mutex_unlock(&ap->mu);
}

void kvbm_hint_applier_destroy(kvbm_hint_applier *ap) {
  if (!ap) return;
  atomic_store(&ap->stop, true);
  if (ap->running) pthread_join(ap->th, NULL);
  if (ap->sub) natsSubscription_Destroy(ap->sub);
  if (ap->nc) natsConnection_Destroy(ap->nc);
  kvbm_hint_decoder_destroy(ap->dec);
  pthread_mutex_destroy(&ap->mu);
  free(ap);
}
