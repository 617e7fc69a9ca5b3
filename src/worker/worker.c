/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.c: `kvbm worker`, the engine simulator (worker.h has the compute
 * model and the contract is in docs/areas/cluster.md).
 *
 * Why it is built this way.
 *  - Real manager, simulated model. The cluster test (W5) asks what a
 *    router, a shared G4 and faults do to hit rates and to the bytes an
 *    engine is handed. Those answers depend on the manager's real
 *    behaviour (hashing, eviction, copies, checksums, G4 frames and their
 *    keyed MAC, G3's warm restart), so all of it runs; what a GPU would
 *    spend computing KV is the only thing replaced, by a sleep.
 *  - Bytes that can be checked. Every block the worker computes is
 *    written with a pattern derived from its sequence hash alone (as W2
 *    does; W2's function is private to src/workload/w2.c, so the worker
 *    has its own), so any worker can check any block it onboards, from
 *    any tier and from another worker's G4 writes. A block whose bytes
 *    differ is counted (wrong_bytes, in blocks) and it and the blocks
 *    after it are recomputed: never served silently.
 *  - Deferred answers. /generate is answered when the simulated request
 *    ends, seconds later: the HTTP handler parses and checks the body,
 *    parks the connection (kvbm__service_defer) and queues a job; one of
 *    `batch` executor threads runs it and answers through
 *    kvbm__service_complete. The queue is bounded (503 beyond it), and so
 *    is the memory the queued jobs' tokens take (503 too).
 *  - Events equal /blocks. One listener per tier (called under the
 *    manager lock) updates that tier's held set and forwards the event to
 *    the tier's pool link, both under the worker's event lock, so the
 *    set and the stream change together. With publishing off
 *    (/admin/fault) events are counted as dropped; when it comes back,
 *    and at every start (after G3's warm restart has indexed its file),
 *    the worker publishes AllBlocksCleared and a BlockStored for every
 *    held block of every tier, under the same lock, so a router that
 *    applies the stream in order ends with exactly /blocks.
 *  - Losses heal. A batch the event plane lost on the way (NATS down: the
 *    sink's errors; the publisher's queue full: dropped) would leave a
 *    router's index wrong for good. The HTTP loop's tick (resync_tick)
 *    watches the publisher's counters; after a loss, at the first tick
 *    without a new one, the worker republishes (clear + stores) as at a
 *    start, and counts it (heals, losses). A nats-server killed and
 *    restarted may also have lost batches it had acknowledged (no error
 *    anywhere: cluster.md's nats_kill finding), so with JetStream events
 *    the worker keeps a connection of its own to the server that only
 *    watches: each reconnection of it leads to the same republish.
 *  - KV room. A request holds G1 blocks from its prefill to its end (the
 *    prompt, then the output). Running more than G1 can hold would make
 *    requests wait for each other's room for ever, so, as vLLM's
 *    scheduler admits a request only with KV room for it, an executor
 *    starts its request only when its G1 need (prompt + output blocks)
 *    fits beside what the running requests reserved, in the order the
 *    requests were taken (no overtaking); one that needs more than G1
 *    has is answered 503. What remains (G1 blocks pinned by copies still
 *    in flight) is waited out by wait_room.
 *  - Bounded memory. create adds up what the configuration allocates (G1
 *    and G2 bytes, the pools' and held sets' tables, the publisher
 *    queues, G3's staging, the job memory share, thread stacks) and
 *    refuses to start past --memory-budget-mb, naming each part; the
 *    resident size is reported in /health and /metrics so a cluster can
 *    check the bound from outside.
 *  - Faults are knobs the cluster drives: publish on/off (above); a slow
 *    G3 (every request that onboards from G3 waits g3_delay_ms more,
 *    really slept, counted in its TTFT); a full G3 (the worker stops
 *    giving G3 new blocks: commits of requests skip G3 by dropping the
 *    G3 copies its commit made, counted). The manager has no runtime
 *    switch for a tier, so "full" is the worker's emulation of a disk
 *    that refuses writes: what G3 already holds is still served.
 */
#include "worker/worker.h"

#include <errno.h>
#include <math.h>
#include <nats/nats.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mix.h"
#include "common/tier.h"
#include "common/vec.h"
#include "kvbm/events.h"
#include "kvbm/metrics.h"
#include "kvbm/storage_events.h"
#include "service/service.h"
#include "worker/body.h"
#include "worker/held.h"
#include "workload/trace.h"

#define NTIERS 3                 /* tiers with KV events and /blocks: G1..G3 */
#define MAX_BATCH 1024
#define THREAD_STACK (1u << 20)
#define FIXED_OVERHEAD (48ull << 20) /* libraries, sockets, the HTTP loop */
#define POOL_META_PER_BLOCK 192ull   /* a pool's and its registry's bytes per block */
#define G3_STAGING (64ull << 20)     /* the disk worker's staging (tiers.md) */
#define PUB_QUEUE_BYTES (16ull << 20)
#define HTTP_BODY_CAP (8ull << 20) /* the largest /generate body ever taken */
#define HTTP_MIN_CONN 16            /* connections the budget must allow */
#define HTTP_CONN_FIXED (256u << 10) /* a connection's head, read-ahead, soft output */

typedef struct job {
  uint64_t ticket;
  char id[KVSIM_WORKER_MAX_ID + 1];
  uint32_t *prompt, *output; /* one allocation: prompt then output */
  size_t n_prompt, n_output;
  size_t bytes;              /* charged to the job memory share */
  int64_t queued_ns;
} job;

typedef struct tier_ev {
  struct kvsim_worker *w;
  int tier;
  kvbm_pool_link link;
} tier_ev;

struct kvsim_worker {
  kvsim_worker_config cfg;
  char host[64], g3_dir[4096];
  kvbm_manager *m;
  kvbm_publisher *pub;
  kvbm_storage_publisher *spub;
  kvbm_metrics *reg;
  kvbm__service *svc;
  uint64_t block_bytes;
  /* events and held sets (the event lock; taken under the manager lock) */
  pthread_mutex_t ev_mu;
  kvsim_held held[NTIERS];
  tier_ev tiers[NTIERS];
  bool publishing;           /* events go out (else counted as dropped) */
  bool starting;             /* create: restored G3 blocks only recorded */
  uint64_t events_dropped, republishes, republished_events, republish_failed;
  uint64_t dropped_seen;     /* the publisher's dropped at the last tick */
  _Atomic uint64_t heals, losses; /* resync rounds; events lost on the way */
  uint64_t sink_errors_seen; /* the publisher's sink_errors at the last tick */
  bool resync_pending;       /* a sink lost batches: republish once it sends again */
  natsConnection *watch;     /* --events nats://: a connection that only watches */
  _Atomic uint64_t nats_reconnects; /* ... its reconnections (libnats' thread) */
  uint64_t reconnects_seen;  /* ... at the last tick */
  /* jobs */
  pthread_mutex_t q_mu;
  pthread_cond_t q_cv;      /* a job queued, or quit */
  pthread_cond_t stop_cv;   /* quit (simulated sleeps wait on it; monotonic) */
  pthread_cond_t room_cv;   /* an admission turn passed, or G1 room released */
  uint64_t admit_next, admit_head; /* admission turns: taken, due */
  uint64_t g1_reserved;     /* G1 blocks the running requests may hold */
  job **q;
  size_t q_head, q_len, q_cap;
  uint64_t job_bytes, job_bytes_max;
  uint32_t max_conn;         /* HTTP connections the budget allows */
  bool quit;
  pthread_t *threads;
  uint32_t nthreads;
  /* fault knobs */
  _Atomic uint32_t g3_delay_ms;
  _Atomic bool g3_full;
  /* counters (atomics, any thread) */
  _Atomic uint64_t requests, ok, failed, refused_busy, bad_bodies, running, gone;
  _Atomic uint64_t prompt_tokens, prefill_tokens, onboarded, wrong_blocks, hit[KVBM_TIER_COUNT];
  _Atomic uint64_t g3_delayed, g3_full_dropped, room_waits;
};

/* ------------------------------------------------------------- config */

kvsim_worker_config kvsim_worker_config_default(void) {
  return (kvsim_worker_config){.host = "127.0.0.1", .g1_blocks = 4096, .g3_blocks = 65536,
                               .g2_policy = KVBM_OFFLOAD_ALL, .g3_policy = KVBM_OFFLOAD_FREQUENCY,
                               .block_size = 16, .block_bytes = 1024, .prefill_tps = 10000,
                               .decode_tps = 50, .batch = 8, .time_scale = 1,
                               .memory_budget_mb = 1024, .max_queue = 1024,
                               .max_tokens = 131072, .request_timeout_s = 600};
}

static int check_config(const kvsim_worker_config *c, kvbm_error *err) {
  if (c->g1_blocks < 1) return kvbm_error_set(err, KVBM_EINVAL, "worker: --g1 must be >= 1");
  if (c->block_size < 1 || c->block_size > 4096)
    return kvbm_error_set(err, KVBM_EINVAL, "worker: --block-size %u (1..4096)", c->block_size);
  if (c->block_bytes < 16 || c->block_bytes % 16 || c->block_bytes > (64u << 20))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "worker: --block-bytes %llu is not a multiple of 16 in 16..64 MiB",
                          (unsigned long long)c->block_bytes);
  if (!(c->prefill_tps > 0) || !(c->decode_tps > 0) || !isfinite(c->prefill_tps) ||
      !isfinite(c->decode_tps))
    return kvbm_error_set(err, KVBM_EINVAL, "worker: --prefill-tps and --decode-tps must be > 0");
  if (c->batch < 1 || c->batch > MAX_BATCH)
    return kvbm_error_set(err, KVBM_EINVAL, "worker: --batch %u (1..%d)", c->batch, MAX_BATCH);
  if (!(c->time_scale > 0) || !isfinite(c->time_scale))
    return kvbm_error_set(err, KVBM_EINVAL, "worker: --time-scale must be > 0");
  if (c->max_queue < 1 || c->max_tokens < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "worker: max_queue and max_tokens must be >= 1");
  if (c->g3_dir && c->g3_blocks < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "worker: --g3 DIR:BLOCKS needs BLOCKS >= 1");
  if (!(c->request_timeout_s > 0) || c->request_timeout_s > 86400)
    return kvbm_error_set(err, KVBM_EINVAL, "worker: request timeout must be in (0, 86400] s");
  return KVBM_OK;
}

/* Whole-request token memory: what one job may take at most. */
static uint64_t job_bytes_of(uint64_t tokens) { return tokens * sizeof(uint32_t) + sizeof(job); }

/* A /generate body: max_tokens numbers of at most 10 digits and a comma,
 * plus the keys (within 8 MiB). */
static uint64_t body_max_of(const kvsim_worker_config *c) {
  uint64_t b = (uint64_t)c->max_tokens * 11 + 4096;
  return b < HTTP_BODY_CAP ? b : HTTP_BODY_CAP;
}

/* What one HTTP connection may hold at most: a body being read, and a
 * /blocks answer (every held hash, up to 21 bytes each) waiting to be
 * taken, plus the transport's fixed share. */
static uint64_t conn_bytes_of(const kvsim_worker_config *c) {
  uint64_t blocks = (uint64_t)c->g1_blocks + c->g2_blocks + (c->g3_dir ? c->g3_blocks : 0);
  return body_max_of(c) + blocks * 21 + 256 + HTTP_CONN_FIXED;
}

uint64_t kvsim_worker_memory_need(const kvsim_worker_config *c, char *parts, size_t cap) {
  uint64_t bb = c->block_bytes;
  uint64_t g1 = (uint64_t)c->g1_blocks * bb, g2 = (uint64_t)c->g2_blocks * bb;
  uint64_t g3 = c->g3_dir ? c->g3_blocks : 0, g4 = c->g4_url ? 100000 : 0;
  uint64_t meta = ((uint64_t)c->g1_blocks + c->g2_blocks + g3 + g4) * POOL_META_PER_BLOCK +
                  kvsim_held_bytes(c->g1_blocks) + kvsim_held_bytes(c->g2_blocks) +
                  kvsim_held_bytes(g3);
  uint64_t staging = c->g3_dir ? G3_STAGING : 0;
  uint64_t pubs = (c->events ? PUB_QUEUE_BYTES : 0) + (c->storage_events ? PUB_QUEUE_BYTES : 0);
  /* every running request holds its tokens, and at least one waiting */
  uint64_t jobs = (uint64_t)(c->batch + 1) * job_bytes_of(c->max_tokens);
  uint64_t stacks = (uint64_t)c->batch * THREAD_STACK;
  uint64_t http = HTTP_MIN_CONN * conn_bytes_of(c);
  uint64_t total = g1 + g2 + meta + staging + pubs + jobs + stacks + http + FIXED_OVERHEAD;
  if (parts && cap)
    snprintf(parts, cap,
             "G1 %.1f MiB, G2 %.1f MiB, tables %.1f MiB, G3 staging %.1f MiB, event queues "
             "%.1f MiB, requests %.1f MiB, stacks %.1f MiB, %d HTTP connections %.1f MiB, "
             "fixed %.1f MiB: %.1f MiB",
             g1 / 1048576.0, g2 / 1048576.0, meta / 1048576.0, staging / 1048576.0,
             pubs / 1048576.0, jobs / 1048576.0, stacks / 1048576.0, HTTP_MIN_CONN,
             http / 1048576.0, FIXED_OVERHEAD / 1048576.0, total / 1048576.0);
  return total;
}

/* ------------------------------------------------------------ bytes */

/* Fills (check false) or checks layer l of the block with hash h: 8 bytes
 * at a time from a counter-mode mix of (hash, layer, offset). */
static bool pattern(uint8_t *p, size_t n, uint64_t h, uint32_t l, bool check) {
  uint64_t key = kvbm__mix64(h ^ ((uint64_t)l << 56) ^ 0x6b76626d776b72ull); /* "kvbmwkr" */
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = kvbm__mix64(key + i);
    if (check) {
      if (memcmp(p + i, &v, 8)) return false;
    } else {
      memcpy(p + i, &v, 8);
    }
  }
  return true;
}

static bool block_bytes_do(kvbm_manager *m, uint32_t id, uint64_t h, bool check) {
  uint32_t layers = (uint32_t)kvbm_manager_layout(m, KVBM_TIER_G1)->config.num_layers;
  for (uint32_t l = 0; l < layers; l++) {
    void *p;
    size_t sz;
    if (kvbm_manager_block_layer(m, KVBM_TIER_G1, id, l, &p, &sz)) return false;
    if (!pattern(p, sz, h, l, check)) return false;
  }
  return true;
}

/* ------------------------------------------------------------ events */

static kvbm_medium medium_of(int tier) {
  return tier == 0 ? KVBM_MEDIUM_GPU : tier == 1 ? KVBM_MEDIUM_CPU : KVBM_MEDIUM_DISK;
}

/* The manager's listener for one tier (under the manager lock). */
static void on_pool_event(void *user, const kvbm_pool_event *ev) {
  tier_ev *t = user;
  kvsim_worker *w = t->w;
  pthread_mutex_lock(&w->ev_mu);
  kvsim_held *h = &w->held[t->tier];
  if (ev->kind == KVBM_POOL_STORED)
    kvsim_held_add(h, ev->seq_hash, ev->has_parent ? &ev->parent_hash : NULL);
  else if (ev->kind == KVBM_POOL_REMOVED)
    kvsim_held_remove(h, ev->seq_hash);
  else if (ev->kind == KVBM_POOL_CLEARED)
    kvsim_held_clear(h);
  if (w->pub && w->publishing && !w->starting)
    kvbm_pool_link_listener(&t->link, ev);
  else if (w->pub && !w->starting)
    w->events_dropped++;
  pthread_mutex_unlock(&w->ev_mu);
}

/* AllBlocksCleared, then a BlockStored for every held block (under the
 * event lock, so no live event interleaves). */
static void republish_locked(kvsim_worker *w) {
  if (!w->pub) return;
  w->republishes++;
  if (kvbm_publisher_publish_cleared(w->pub, NULL, NULL)) w->republish_failed++;
  else w->republished_events++;
  for (int t = 0; t < NTIERS; t++) {
    const kvsim_held *h = &w->held[t];
    for (size_t i = 0; i < h->cap; i++) {
      uint64_t key, parent;
      bool hp;
      if (!kvsim_held_slot(h, i, &key, &parent, &hp)) continue;
      int rc = kvbm_publisher_publish_stored(w->pub, &key, 1, hp ? &parent : NULL, NULL, 0,
                                             w->cfg.block_size, NULL, medium_of(t), NULL, NULL);
      if (rc) w->republish_failed++;
      else w->republished_events++;
    }
  }
}

static void set_publishing(kvsim_worker *w, bool on) {
  pthread_mutex_lock(&w->ev_mu);
  bool resume = on && !w->publishing;
  w->publishing = on;
  if (resume) republish_locked(w);
  pthread_mutex_unlock(&w->ev_mu);
}

/* The service's tick (every 200 ms): a batch a sink failed to send (NATS
 * down, a publish JetStream refused or never acknowledged) is lost to every
 * reader of the stream, which counts it and holds an index that is wrong
 * for good (found by the W5 cluster run: a nats-server restart left the
 * routers with 83 blocks the worker had evicted). So when the publisher's
 * sink_errors grew, the worker republishes (clear + every held block, as
 * when publishing resumes) at the first tick where they stopped growing;
 * if that round fails too, the next quiet tick tries again. */
static void resync_tick(void *user, int64_t now_ns) {
  (void)now_ns;
  kvsim_worker *w = user;
  if (!w->pub) return;
  kvbm_publisher_stats st;
  kvbm_publisher_stats_get(w->pub, &st);
  uint64_t rec = atomic_load(&w->nats_reconnects);
  pthread_mutex_lock(&w->ev_mu);
  if (rec != w->reconnects_seen) { /* the server came back: what it kept is unknown */
    w->reconnects_seen = rec;
    w->resync_pending = true;
  }
  if (st.sink_errors != w->sink_errors_seen || st.dropped != w->dropped_seen) {
    /* a full queue drops events too: as lost to the readers as a sink's */
    atomic_fetch_add(&w->losses,
                     (st.sink_errors - w->sink_errors_seen) + (st.dropped - w->dropped_seen));
    w->sink_errors_seen = st.sink_errors;
    w->dropped_seen = st.dropped;
    w->resync_pending = true;
  } else if (w->resync_pending && w->publishing) {
    w->resync_pending = false;
    republish_locked(w);
    atomic_fetch_add(&w->heals, 1);
  }
  pthread_mutex_unlock(&w->ev_mu);
}

static void on_nats_reconnected(natsConnection *nc, void *closure) {
  (void)nc;
  atomic_fetch_add(&((kvsim_worker *)closure)->nats_reconnects, 1);
}

/* The watching connection (see the essay's "Losses heal"): redials for
 * ever, every 100 ms. Without it (the server refused it) the worker still
 * heals from the sink's errors. */
static void watch_nats(kvsim_worker *w, const char *url) {
  natsOptions *o = NULL;
  if (natsOptions_Create(&o) != NATS_OK) return;
  if (natsOptions_SetURL(o, url) != NATS_OK || natsOptions_SetMaxReconnect(o, -1) != NATS_OK ||
      natsOptions_SetReconnectWait(o, 100) != NATS_OK ||
      natsOptions_SetReconnectedCB(o, on_nats_reconnected, w) != NATS_OK ||
      natsConnection_Connect(&w->watch, o) != NATS_OK)
    w->watch = NULL;
  natsOptions_Destroy(o);
}

/* "tcp://HOST:PORT" or "nats://HOST:PORT/STREAM/SUBJECT": the parts. */
typedef struct ev_url {
  bool nats;
  char url[256], stream[128], subject[128], replay[256];
} ev_url;

static int parse_ev_url(const char *s, const char *flag, ev_url *u, kvbm_error *err) {
  memset(u, 0, sizeof u[0]);
  if (!strncmp(s, "tcp://", 6)) {
    const char *colon = strrchr(s + 6, ':');
    char *end;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || colon == s + 6 || *end || port < 1 || port > 65534 ||
        strlen(s) >= sizeof u->url)
      return kvbm_error_set(err, KVBM_EINVAL, "worker: %s '%.200s': tcp://HOST:PORT expected "
                            "(PORT 1..65534; the replay is on PORT+1)", flag, s);
    snprintf(u->url, sizeof u->url, "%s", s);
    snprintf(u->replay, sizeof u->replay, "%.*s:%lu", (int)(colon - s), s, port + 1);
    return KVBM_OK;
  }
  if (!strncmp(s, "nats://", 7)) {
    const char *a = strchr(s + 7, '/'), *b = a ? strchr(a + 1, '/') : NULL;
    if (!a || !b || a == s + 7 || b == a + 1 || !b[1] || strchr(b + 1, '/') ||
        (size_t)(a - s) >= sizeof u->url || (size_t)(b - a - 1) >= sizeof u->stream ||
        strlen(b + 1) >= sizeof u->subject)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "worker: %s '%.200s': nats://HOST:PORT/STREAM/SUBJECT expected", flag,
                            s);
    u->nats = true;
    snprintf(u->url, sizeof u->url, "%.*s", (int)(a - s), s);
    snprintf(u->stream, sizeof u->stream, "%.*s", (int)(b - a - 1), a + 1);
    snprintf(u->subject, sizeof u->subject, "%s", b + 1);
    return KVBM_OK;
  }
  return kvbm_error_set(err, KVBM_EINVAL,
                        "worker: %s '%.200s': tcp://HOST:PORT or nats://HOST:PORT/STREAM/SUBJECT",
                        flag, s);
}

static int start_kv_events(kvsim_worker *w, kvbm_error *err) {
  ev_url u;
  int rc = parse_ev_url(w->cfg.events, "--events", &u, err);
  if (rc) return rc;
  kvbm_publisher_config pc = kvbm_publisher_config_default();
  pc.overflow = KVBM_OVERFLOW_DROP; /* the listener runs under the manager lock */
  pc.queue_bytes = PUB_QUEUE_BYTES;
  pc.queue_events = 65536 + (size_t)w->cfg.g1_blocks + w->cfg.g2_blocks +
                    (w->cfg.g3_dir ? (size_t)w->cfg.g3_blocks : 0);
  pc.max_batch_delay_us = 2000;
  pc.dp_rank = 0;
  pc.coalesce = w->cfg.events_coalesce; /* every sink here takes bytes */
  rc = kvbm_publisher_create(&pc, &w->pub, err);
  if (rc) return rc;
  if (u.nats) {
    kvbm_jetstream_config jc = kvbm_jetstream_config_default(u.url, u.stream, u.subject);
    /* every worker's subject in one stream: "kv.w3" makes the stream "kv.>" */
    char subjects[160];
    const char *dot = strchr(u.subject, '.');
    if (dot) {
      snprintf(subjects, sizeof subjects, "%.*s.>", (int)(dot - u.subject), u.subject);
      jc.stream_subjects = subjects;
    }
    rc = kvbm_publisher_add_jetstream(w->pub, &jc, err);
    if (!rc) watch_nats(w, u.url);
  } else {
    kvbm_zmq_sink_config zc = kvbm_zmq_sink_config_default(u.url);
    zc.mode = KVBM_ZMQ_BIND;
    zc.replay_endpoint = u.replay;
    zc.replay_batches = 100000;
    zc.linger_ms = 200;
    rc = kvbm_publisher_add_zmq(w->pub, &zc, err);
  }
  if (!rc) rc = kvbm_publisher_start(w->pub, err);
  return rc;
}

static int start_storage_events(kvsim_worker *w, kvbm_error *err) {
  ev_url u;
  int rc = parse_ev_url(w->cfg.storage_events, "--storage-events", &u, err);
  if (rc) return rc;
  kvbm_storage_publisher_config sc = kvbm_storage_publisher_config_default();
  char src[32];
  snprintf(src, sizeof src, "worker-%u", w->cfg.id);
  sc.source = src;
  sc.period_ms = 200;
  rc = kvbm_storage_publisher_create(&sc, &w->spub, err);
  if (rc) return rc;
  if (u.nats) {
    rc = kvbm_storage_publisher_add_nats(w->spub, u.url, u.subject, err);
  } else {
    kvbm_zmq_sink_config zc = kvbm_zmq_sink_config_default(u.url);
    zc.mode = KVBM_ZMQ_BIND;
    zc.replay_endpoint = u.replay;
    zc.linger_ms = 200;
    rc = kvbm_storage_publisher_add_zmq(w->spub, &zc, err);
  }
  if (!rc) rc = kvbm_storage_publisher_start(w->spub, err);
  return rc;
}

/* ------------------------------------------------------------ requests */

static bool worker_quitting(kvsim_worker *w) {
  pthread_mutex_lock(&w->q_mu);
  bool q = w->quit;
  pthread_mutex_unlock(&w->q_mu);
  return q;
}

#define ROOM_WAITS_MAX 2500 /* about 5 s of 2 ms waits */

/* G1 has no room for a request: worth trying again? While other requests
 * run, wait 2 ms for one of them to end (as an engine's scheduler waits
 * for KV room); alone, wait once for the queued copies, which hold G1
 * blocks until they are done (kvbm_manager_flush); then no: it does not
 * fit. At most ROOM_WAITS_MAX waits a call site: then the request fails
 * (503), releasing what it holds. */
static bool wait_room(kvsim_worker *w, bool *flushed, int *waits) {
  /* bounded: requests that all wait for each other's room would never end */
  if (worker_quitting(w) || ++*waits > ROOM_WAITS_MAX) return false;
  atomic_fetch_add(&w->room_waits, 1);
  if (atomic_load(&w->running) > 1) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    return true;
  }
  if (*flushed) return false;
  kvbm_manager_flush(w->m);
  *flushed = true;
  return true;
}

/* Sleeps `s` simulated seconds (divided by the time scale); returns early
 * when the worker stops. */
static void sim_sleep(kvsim_worker *w, double s) {
  double real = s / w->cfg.time_scale;
  if (!(real > 0)) return;
  struct timespec dl = kvbm__deadline_after_ns(CLOCK_MONOTONIC, (uint64_t)(real * 1e9));
  pthread_mutex_lock(&w->q_mu);
  while (!w->quit && pthread_cond_timedwait(&w->stop_cv, &w->q_mu, &dl) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&w->q_mu);
}

typedef struct outcome {
  int http;
  const char *error;
  uint64_t hit[KVBM_TIER_COUNT];
  uint64_t prefill_tokens, onboarded, wrong;
  double ttft_ms, e2e_ms;
} outcome;

/* Writes the blocks [from, full) the request computes (and those below
 * `refused_until` whose onboarded bytes were refused). */
static void compute_blocks(kvsim_worker *w, kvbm_mreq *r, size_t from, size_t refused_until) {
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  kvbm_mreq_info info;
  kvbm_mreq_poll(r, &info);
  size_t full = info.num_tokens / w->cfg.block_size;
  for (size_t k = from; k < full && k < nb; k++) {
    if (k >= refused_until && !kvbm_mreq_must_compute(r, k)) continue;
    uint64_t h;
    if (!kvbm_mreq_block_hash(r, k, &h)) block_bytes_do(w->m, ids[k], h, false);
  }
}

static void run_job(kvsim_worker *w, job *j, outcome *o) {
  uint32_t B = w->cfg.block_size;
  double wait_s = (double)((int64_t)kvbm_clock_ns() - j->queued_ns) * 1e-9 * w->cfg.time_scale;
  kvbm_mreq *r = NULL;
  int rc;
  bool flushed = false;
  int waits = 0;
  while ((rc = kvbm_manager_prefill(w->m, 0, 0, j->prompt, j->n_prompt, &r, NULL, NULL)) ==
             KVBM_ENOSPC &&
         wait_room(w, &flushed, &waits)) {
  }
  if (rc) {
    o->http = rc == KVBM_ENOSPC ? 503 : 500;
    o->error = rc == KVBM_ENOSPC ? "G1 has no room for the request now" : kvbm_strerror(rc);
    return;
  }
  uint64_t t0 = kvbm_clock_ns();
  kvbm_mreq_info info;
  rc = kvbm_mreq_wait(r, -1, &info); /* no deadline: only an error ends it early */
  if (rc) { /* copies may still be landing in its blocks: nothing is written */
    kvbm_mreq_destroy(r);
    o->http = 500;
    o->error = kvbm_strerror(rc);
    return;
  }
  size_t settled = info.matched_tokens / B, matched = settled;
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  bool from_g3 = false;
  for (size_t k = 0; k < settled; k++) {
    int src = kvbm_mreq_block_source(r, k);
    if (src == KVBM_TIER_G1) continue;
    from_g3 |= src == KVBM_TIER_G3;
    uint64_t h;
    if (kvbm_mreq_block_hash(r, k, &h) || !block_bytes_do(w->m, ids[k], h, true)) {
      o->wrong++;
      matched = k;
      break;
    }
  }
  uint32_t delay = atomic_load(&w->g3_delay_ms);
  if (from_g3 && delay) {
    atomic_fetch_add(&w->g3_delayed, 1);
    struct timespec ts = kvbm__timespec_of_ns((uint64_t)delay * 1000000u);
    nanosleep(&ts, NULL); /* a slow disk is real time, not simulated */
  }
  double onboard_s = (double)(kvbm_clock_ns() - t0) * 1e-9;
  for (size_t k = 0; k < matched; k++) {
    int src = kvbm_mreq_block_source(r, k);
    o->hit[src] += B;
    if (src != KVBM_TIER_G1) o->onboarded++;
  }
  compute_blocks(w, r, matched, settled);
  o->prefill_tokens = j->n_prompt - matched * B;
  double prefill_s = (double)o->prefill_tokens / w->cfg.prefill_tps;
  sim_sleep(w, prefill_s);
  o->ttft_ms = (wait_s + onboard_s + prefill_s) * 1e3;
  double decode_s = (double)j->n_output / w->cfg.decode_tps;
  sim_sleep(w, decode_s);
  o->e2e_ms = o->ttft_ms + decode_s * 1e3;
  if (j->n_output) {
    kvbm_mreq_poll(r, &info);
    size_t before = info.num_tokens / B;
    flushed = false;
    waits = 0;
    while ((rc = kvbm_mreq_append(r, j->output, j->n_output)) == KVBM_ENOSPC &&
           wait_room(w, &flushed, &waits)) {
    }
    if (!rc) compute_blocks(w, r, before, 0);
  }
  if (!rc) rc = kvbm_mreq_commit(r);
  /* The next request sees this one's G2/G3 copies; its G4 writes go on
   * behind, as an engine's do (a partition from Redis must not stall
   * serving: a full flush waits g4_timeout_ms per batch there). */
  kvbm_manager_flush_local(w->m);
  if (!rc && atomic_load(&w->g3_full)) {
    /* a full disk takes nothing new: what this commit gave G3 is dropped */
    kvbm_mreq_blocks(r, &ids, &nb);
    kvbm_mreq_poll(r, &info);
    for (size_t k = matched; k < info.num_tokens / B && k < nb; k++) {
      uint64_t h;
      if (!kvbm_mreq_block_hash(r, k, &h) &&
          !kvbm_manager_hint(w->m, KVBM_MANAGER_HINT_DROP, h, KVBM_TIER_G3, KVBM_TIER_G3))
        atomic_fetch_add(&w->g3_full_dropped, 1);
    }
  }
  kvbm_mreq_destroy(r);
  if (rc) {
    o->http = rc == KVBM_ENOSPC ? 503 : 500;
    o->error = rc == KVBM_ENOSPC ? "G1 has no room for the output" : kvbm_strerror(rc);
  }
}

/* The answer of a finished request (the contract's keys). */
static void answer_job(kvsim_worker *w, const job *j, const outcome *o) {
  kvbm__service_buf b = {0};
  kvbm__service_buf_printf(&b, "{\"request_id\":\"%s\",\"worker\":%u,\"status\":\"%s\",", j->id,
                           w->cfg.id, o->http == 200 ? "ok" : "error");
  if (o->http != 200) kvbm__service_buf_printf(&b, "\"error\":\"%s\",", o->error);
  uint64_t hit = 0;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) hit += o->hit[t];
  kvbm__service_buf_printf(
      &b,
      "\"prompt_tokens\":%zu,\"hit_tokens\":{\"g1\":%llu,\"g2\":%llu,\"g3\":%llu,\"g4\":%llu},"
      "\"prefill_tokens\":%llu,\"onboarded_blocks\":%llu,\"ttft_ms\":%.3f,\"e2e_ms\":%.3f,"
      "\"wrong_bytes\":%llu}\n",
      j->n_prompt, (unsigned long long)o->hit[0], (unsigned long long)o->hit[1],
      (unsigned long long)o->hit[2], (unsigned long long)o->hit[3],
      (unsigned long long)o->prefill_tokens, (unsigned long long)o->onboarded, o->ttft_ms,
      o->e2e_ms, (unsigned long long)o->wrong);
  if (!b.oom) kvbm__service_complete(w->svc, j->ticket, o->http, b.p, b.len, false);
  else kvbm__service_complete(w->svc, j->ticket, 500, "{\"error\":\"out of memory\"}", 25, true);
  free(b.p);
  atomic_fetch_add(o->http == 200 ? &w->ok : &w->failed, 1);
  atomic_fetch_add(&w->prompt_tokens, j->n_prompt);
  atomic_fetch_add(&w->prefill_tokens, o->prefill_tokens);
  atomic_fetch_add(&w->onboarded, o->onboarded);
  atomic_fetch_add(&w->wrong_blocks, o->wrong);
  for (int t = 0; t < KVBM_TIER_COUNT; t++) atomic_fetch_add(&w->hit[t], o->hit[t]);
}

static void job_free(kvsim_worker *w, job *j) {
  pthread_mutex_lock(&w->q_mu);
  w->job_bytes -= j->bytes;
  pthread_mutex_unlock(&w->q_mu);
  free(j->prompt);
  free(j);
}

/* G1 blocks a request may hold at once: its prompt and output, and the
 * partial block. */
static uint64_t g1_need(const kvsim_worker *w, const job *j) {
  return (j->n_prompt + j->n_output) / w->cfg.block_size + 1;
}

/* Admission (the essay's "KV room"): in the order the executors took
 * the jobs, a request starts only when its G1 need fits beside what the
 * running ones reserved. false: it never fits (or the worker stops). */
static bool admit(kvsim_worker *w, uint64_t turn, uint64_t need) {
  pthread_mutex_lock(&w->q_mu);
  while (!w->quit && (turn != w->admit_head || w->g1_reserved + need > w->cfg.g1_blocks) &&
         !(turn == w->admit_head && need > w->cfg.g1_blocks))
    pthread_cond_wait(&w->room_cv, &w->q_mu);
  bool ok = !w->quit && need <= w->cfg.g1_blocks;
  if (ok) w->g1_reserved += need;
  if (turn == w->admit_head) w->admit_head++; /* the next job's turn, fitting or not */
  pthread_cond_broadcast(&w->room_cv);
  pthread_mutex_unlock(&w->q_mu);
  return ok;
}

static void release(kvsim_worker *w, uint64_t need) {
  pthread_mutex_lock(&w->q_mu);
  w->g1_reserved -= need;
  pthread_cond_broadcast(&w->room_cv);
  pthread_mutex_unlock(&w->q_mu);
}

static void *executor(void *arg) {
  kvsim_worker *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->q_mu);
    while (!w->quit && !w->q_len) pthread_cond_wait(&w->q_cv, &w->q_mu);
    if (w->quit) {
      pthread_mutex_unlock(&w->q_mu);
      return NULL;
    }
    job *j = w->q[w->q_head];
    w->q_head = (w->q_head + 1) % w->q_cap;
    w->q_len--;
    uint64_t turn = w->admit_next++;
    pthread_mutex_unlock(&w->q_mu);
    outcome o = {.http = 200};
    uint64_t need = g1_need(w, j);
    if (admit(w, turn, need)) {
      atomic_fetch_add(&w->running, 1);
      run_job(w, j, &o);
      atomic_fetch_sub(&w->running, 1);
      release(w, need);
    } else if (o.http == 200) {
      o.http = 503;
      o.error = "the request needs more G1 blocks than the worker has";
    }
    answer_job(w, j, &o);
    job_free(w, j);
  }
}

/* --------------------------------------------------------------- HTTP */

static void answer_error(kvbm__service_answer *a, int status, const char *msg) {
  a->status = status;
  kvbm__service_buf_printf(a->scratch, "{\"error\":\"");
  for (const char *p = msg; *p; p++) /* a JSON string: messages are ASCII */
    if (*p == '"' || *p == '\\') kvbm__service_buf_printf(a->scratch, "\\%c", *p);
    else if ((unsigned char)*p >= 0x20) kvbm__service_buf_append(a->scratch, p, 1);
  kvbm__service_buf_printf(a->scratch, "\",\"status\":%d}\n", status);
}

/* A job from a checked body (tokens made as W1/W2 make them). */
static job *job_make(const kvsim_gen_body *b) {
  job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  snprintf(j->id, sizeof j->id, "%s", b->request_id);
  j->n_prompt = b->token_ids ? b->num_tokens : b->input_length;
  j->n_output = b->output_length;
  j->prompt = malloc((j->n_prompt + j->n_output + 1) * sizeof *j->prompt);
  if (!j->prompt) {
    free(j);
    return NULL;
  }
  j->output = j->prompt + j->n_prompt;
  kvsim_trace_request q = {.input_length = b->input_length, .output_length = b->output_length,
                           .num_hash_ids = (uint32_t)b->num_hash_ids, .hash_ids = b->hash_ids};
  if (b->token_ids) memcpy(j->prompt, b->token_ids, j->n_prompt * sizeof *j->prompt);
  else kvsim_trace_prompt_tokens(&q, j->prompt);
  /* output tokens unique to the request: W1's form, its line number
   * replaced by a hash of the request id (16 bits, as W1's) */
  uint64_t hid = 1469598103934665603ull;
  for (const char *p = j->id; *p; p++) hid = (hid ^ (unsigned char)*p) * 1099511628211ull;
  kvsim_trace_output_tokens(&q, (size_t)(hid & 0x7fff), j->output);
  j->bytes = job_bytes_of(j->n_prompt + j->n_output);
  return j;
}

static void route_generate(void *user, kvbm__service *svc, const kvbm__service_req *q,
                           kvbm__service_answer *a) {
  kvsim_worker *w = user;
  atomic_fetch_add(&w->requests, 1);
  kvsim_gen_body b;
  kvbm_error err = {0};
  int rc = kvsim_gen_body_parse(q->body, q->body_len, w->cfg.max_tokens, w->cfg.max_tokens, &b,
                                &err);
  if (rc) {
    atomic_fetch_add(&w->bad_bodies, 1);
    answer_error(a, rc == KVBM_ENOMEM ? 500 : rc == KVBM_ETOOLONG ? 413 : 400, err.msg);
    return;
  }
  job *j = job_make(&b);
  kvsim_gen_body_free(&b);
  if (!j) {
    answer_error(a, 500, "out of memory");
    return;
  }
  /* room in the queue and in the job memory share: only this thread adds */
  pthread_mutex_lock(&w->q_mu);
  bool room = w->q_len < w->q_cap && w->job_bytes + j->bytes <= w->job_bytes_max;
  pthread_mutex_unlock(&w->q_mu);
  uint64_t ticket = room ? kvbm__service_defer(svc, a) : 0;
  if (!ticket) {
    atomic_fetch_add(&w->refused_busy, 1);
    free(j->prompt);
    free(j);
    answer_error(a, 503, room ? "too many requests waiting for answers"
                              : "the worker's queue is full");
    return;
  }
  j->ticket = ticket;
  j->queued_ns = (int64_t)kvbm_clock_ns();
  pthread_mutex_lock(&w->q_mu);
  w->q[(w->q_head + w->q_len) % w->q_cap] = j;
  w->q_len++;
  w->job_bytes += j->bytes;
  pthread_cond_signal(&w->q_cv);
  pthread_mutex_unlock(&w->q_mu);
}

static void generate_gone(void *user, uint64_t ticket) {
  (void)ticket; /* the request runs on; its answer is dropped */
  atomic_fetch_add(&((kvsim_worker *)user)->gone, 1);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void route_blocks(void *user, kvbm__service *svc, const kvbm__service_req *q,
                         kvbm__service_answer *a) {
  (void)svc;
  (void)q;
  kvsim_worker *w = user;
  uint64_t *keys[NTIERS] = {0};
  size_t n[NTIERS] = {0};
  bool oom = false;
  pthread_mutex_lock(&w->ev_mu);
  for (int t = 0; t < NTIERS; t++) {
    const kvsim_held *h = &w->held[t];
    keys[t] = malloc((h->n + 1) * sizeof(uint64_t));
    if (!keys[t]) {
      oom = true;
      continue;
    }
    for (size_t i = 0; i < h->cap; i++) {
      uint64_t k, p;
      bool hp;
      if (kvsim_held_slot(h, i, &k, &p, &hp)) keys[t][n[t]++] = k;
    }
  }
  pthread_mutex_unlock(&w->ev_mu);
  if (oom) {
    answer_error(a, 500, "out of memory");
  } else {
    kvbm__service_buf_printf(a->scratch, "{\"worker\":%u,\"block_size\":%u", w->cfg.id,
                             w->cfg.block_size);
    for (int t = 0; t < NTIERS; t++) {
      qsort(keys[t], n[t], sizeof(uint64_t), cmp_u64);
      kvbm__service_buf_printf(a->scratch, ",\"g%d\":[", t + 1);
      for (size_t i = 0; i < n[t]; i++)
        kvbm__service_buf_printf(a->scratch, i ? ",%llu" : "%llu", (unsigned long long)keys[t][i]);
      kvbm__service_buf_printf(a->scratch, "]");
    }
    kvbm__service_buf_printf(a->scratch, "}\n");
  }
  for (int t = 0; t < NTIERS; t++) free(keys[t]);
}

/* Resident set size in bytes (/proc/self/statm), 0 when unknown. */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, res = 0;
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
  fclose(f);
  return res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void route_health(void *user, kvbm__service *svc, const kvbm__service_req *q,
                         kvbm__service_answer *a) {
  (void)svc;
  (void)q;
  kvsim_worker *w = user;
  pthread_mutex_lock(&w->ev_mu);
  uint64_t dropped = w->events_dropped, rep = w->republishes;
  bool pub = w->publishing;
  size_t held[NTIERS] = {w->held[0].n, w->held[1].n, w->held[2].n};
  pthread_mutex_unlock(&w->ev_mu);
  pthread_mutex_lock(&w->q_mu);
  size_t queued = w->q_len;
  pthread_mutex_unlock(&w->q_mu);
  kvbm__service_buf_printf(
      a->scratch,
      "{\"status\":\"ok\",\"worker\":%u,\"publishing\":%s,\"events_dropped\":%llu,"
      "\"republishes\":%llu,\"requests\":%llu,\"running\":%llu,\"queued\":%zu,"
      "\"wrong_bytes\":%llu,\"blocks\":{\"g1\":%zu,\"g2\":%zu,\"g3\":%zu},"
      "\"g3_delay_ms\":%u,\"g3_full\":%s,\"rss_bytes\":%llu,\"memory_budget_bytes\":%llu,"
      "\"g3_mode\":\"%s\",\"losses\":%llu,\"heals\":%llu,\"max_connections\":%u,"
      "\"nats_reconnects\":%llu}\n",
      w->cfg.id, pub ? "true" : "false", (unsigned long long)dropped, (unsigned long long)rep,
      (unsigned long long)atomic_load(&w->requests), (unsigned long long)atomic_load(&w->running),
      queued, (unsigned long long)atomic_load(&w->wrong_blocks), held[0], held[1], held[2],
      atomic_load(&w->g3_delay_ms), atomic_load(&w->g3_full) ? "true" : "false",
      (unsigned long long)rss_bytes(), (unsigned long long)(w->cfg.memory_budget_mb << 20),
      w->cfg.g3_dir ? kvbm_manager_g3_mode(w->m) : "",
      (unsigned long long)atomic_load(&w->losses), (unsigned long long)atomic_load(&w->heals),
      w->max_conn, (unsigned long long)atomic_load(&w->nats_reconnects));
}

static void route_fault(void *user, kvbm__service *svc, const kvbm__service_req *q,
                        kvbm__service_answer *a) {
  (void)svc;
  kvsim_worker *w = user;
  kvsim_fault_body f;
  kvbm_error err = {0};
  if (kvsim_fault_body_parse(q->body, q->body_len, &f, &err)) {
    atomic_fetch_add(&w->bad_bodies, 1);
    answer_error(a, 400, err.msg);
    return;
  }
  if (f.has_g3_delay) atomic_store(&w->g3_delay_ms, f.g3_delay_ms);
  if (f.has_g3_full) atomic_store(&w->g3_full, f.g3_full);
  if (f.has_publish) set_publishing(w, f.publish);
  pthread_mutex_lock(&w->ev_mu);
  bool pub = w->publishing;
  pthread_mutex_unlock(&w->ev_mu);
  kvbm__service_buf_printf(a->scratch,
                           "{\"worker\":%u,\"publish\":%s,\"g3_delay_ms\":%u,\"g3_full\":%s}\n",
                           w->cfg.id, pub ? "true" : "false", atomic_load(&w->g3_delay_ms),
                           atomic_load(&w->g3_full) ? "true" : "false");
}

/* The worker's own counters on the /metrics page. */
static void collect(void *user, kvbm_metrics_writer *mw) {
  kvsim_worker *w = user;
  pthread_mutex_lock(&w->ev_mu);
  uint64_t dropped = w->events_dropped, rep = w->republishes, repev = w->republished_events,
           repf = w->republish_failed;
  pthread_mutex_unlock(&w->ev_mu);
  struct {
    const char *name, *help;
    uint64_t v;
  } c[] = {
      {"kvbm_worker_requests_total", "generate requests received", atomic_load(&w->requests)},
      {"kvbm_worker_requests_ok_total", "requests answered ok", atomic_load(&w->ok)},
      {"kvbm_worker_requests_failed_total", "requests answered with an error",
       atomic_load(&w->failed)},
      {"kvbm_worker_requests_refused_total", "requests refused: queue or memory full (503)",
       atomic_load(&w->refused_busy)},
      {"kvbm_worker_bad_bodies_total", "bodies refused (4xx)", atomic_load(&w->bad_bodies)},
      {"kvbm_worker_clients_gone_total", "clients that left before their answer",
       atomic_load(&w->gone)},
      {"kvbm_worker_prompt_tokens_total", "prompt tokens", atomic_load(&w->prompt_tokens)},
      {"kvbm_worker_prefill_tokens_total", "prompt tokens computed",
       atomic_load(&w->prefill_tokens)},
      {"kvbm_worker_onboarded_blocks_total", "blocks onboarded into G1",
       atomic_load(&w->onboarded)},
      {"kvbm_worker_wrong_bytes_total", "onboarded blocks whose bytes differed",
       atomic_load(&w->wrong_blocks)},
      {"kvbm_worker_events_dropped_total", "KV events not published (publishing off)", dropped},
      {"kvbm_worker_republishes_total", "clear + re-store rounds published", rep},
      {"kvbm_worker_republished_events_total", "events of those rounds", repev},
      {"kvbm_worker_republish_failed_total", "events of those rounds the publisher refused",
       repf},
      {"kvbm_worker_room_waits_total",
       "prefills that waited for G1 room held by running requests (2 ms each)",
       atomic_load(&w->room_waits)},
      {"kvbm_worker_event_losses_total",
       "losses on the event plane: batches a sink failed to send plus events a full publisher queue dropped",
       atomic_load(&w->losses)},
      {"kvbm_worker_heals_total", "clear + re-store rounds after such losses",
       atomic_load(&w->heals)},
      {"kvbm_worker_g3_delayed_total", "requests slowed by the g3_delay_ms fault",
       atomic_load(&w->g3_delayed)},
      {"kvbm_worker_g3_full_dropped_total", "G3 blocks dropped by the g3_full fault",
       atomic_load(&w->g3_full_dropped)},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    kvbm_metrics_counter(mw, c[i].name, c[i].help, NULL, 0, c[i].v);
  kvbm_metrics_family(mw, "kvbm_worker_hit_tokens_total", KVBM_METRIC_COUNTER,
                      "prompt tokens served from a tier");
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    kvbm_metric_label l = {"tier", kvbm__tier_key(t)};
    kvbm_metrics_value_u64(mw, &l, 1, atomic_load(&w->hit[t]));
  }
  kvbm_metrics_gauge(mw, "kvbm_worker_running", "requests running", NULL, 0,
                     (double)atomic_load(&w->running));
  kvbm_metrics_gauge(mw, "kvbm_worker_resident_bytes", "resident set size", NULL, 0,
                     (double)rss_bytes());
  kvbm_metrics_gauge(mw, "kvbm_worker_memory_budget_bytes", "--memory-budget-mb", NULL, 0,
                     (double)(w->cfg.memory_budget_mb << 20));
}

static void route_metrics(void *user, kvbm__service *svc, const kvbm__service_req *q,
                          kvbm__service_answer *a) {
  (void)svc;
  (void)q;
  kvsim_worker *w = user;
  char *text;
  size_t len;
  if (kvbm_metrics_render(w->reg, &text, &len, NULL)) {
    a->status = 500;
    kvbm__service_buf_printf(a->scratch, "out of memory\n");
    return;
  }
  kvbm__service_buf_append(a->scratch, text, len);
  kvbm_metrics_text_free(text);
}

/* ------------------------------------------------------------- set up */

static int make_manager(kvsim_worker *w, kvbm_error *err) {
  const kvsim_worker_config *c = &w->cfg;
  kvbm_manager_config mc = kvbm_manager_config_default();
  mc.block_size = c->block_size;
  mc.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 1,
                                   .page_size = 1, .inner_dim = c->block_bytes / 2,
                                   .dtype_size = 1, .alignment = 16};
  mc.g1_blocks = c->g1_blocks;
  mc.g2_blocks = c->g2_blocks;
  mc.g2_policy = c->g2_policy;
  mc.g3_policy = c->g3_policy;
  if (c->g3_dir) {
    mc.g3_blocks = c->g3_blocks;
    mc.g3_dir = w->g3_dir;
    mc.g3_persist = true;
  }
  mc.g4_url = c->g4_url;
  mc.g4_key_file = c->g4_key_file;
  mc.g4_lookup_timeout_ms = 200;
  uint64_t qcap = 2 * ((uint64_t)c->max_tokens / c->block_size + 2) * (c->batch > 4 ? 4 : c->batch);
  mc.queue_capacity = qcap > (1u << 20) ? (1u << 20) : (uint32_t)qcap;
  mc.storage_events = w->spub;
  for (int t = 0; t < NTIERS; t++) {
    mc.listener[t] = on_pool_event;
    mc.listener_user[t] = &w->tiers[t];
  }
  return kvbm_manager_create(&mc, &w->m, err);
}

static int make_service(kvsim_worker *w, kvbm_error *err) {
  kvbm__service_route r[] = {
      {.path = "/generate", .methods = KVBM__SVC_POST, .max_body = body_max_of(&w->cfg),
       .method_msg = "use POST /generate", .fn = route_generate, .user = w,
       .gone = generate_gone},
      {.path = "/blocks", .methods = KVBM__SVC_GET | KVBM__SVC_HEAD, .fn = route_blocks,
       .user = w},
      {.path = "/health", .methods = KVBM__SVC_GET | KVBM__SVC_HEAD, .fn = route_health,
       .user = w},
      {.path = "/metrics", .methods = KVBM__SVC_GET | KVBM__SVC_HEAD,
       .content_type = "text/plain; version=0.0.4; charset=utf-8", .fn = route_metrics,
       .user = w},
      {.path = "/admin/fault", .methods = KVBM__SVC_POST, .max_body = 4096,
       .method_msg = "use POST /admin/fault", .fn = route_fault, .user = w},
  };
  kvbm__service_config sc = {.name = "worker", .host = w->host, .port = w->cfg.port,
                             .max_connections = w->max_conn, .max_per_peer = w->max_conn,
                             .io_timeout_s = 30,
                             .json_errors = true, .error_newline = true,
                             .routes = r, .nroutes = sizeof r / sizeof r[0],
                             .max_deferred = w->cfg.max_queue + w->cfg.batch,
                             .tick = resync_tick, .tick_user = w, .tick_ms = 200,
                             .defer_timeout_s = w->cfg.request_timeout_s};
  return kvbm__service_create(&sc, &w->svc, err);
}

static int create(const kvsim_worker_config *cfg, kvsim_worker **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "worker: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  char parts[512];
  uint64_t need = kvsim_worker_memory_need(cfg, parts, sizeof parts);
  uint64_t budget = cfg->memory_budget_mb << 20;
  if (need > budget)
    return kvbm_error_set(err, KVBM_ENOSPC,
                          "worker: the tiers do not fit --memory-budget-mb %llu: %s",
                          (unsigned long long)cfg->memory_budget_mb, parts);
  kvsim_worker *w = calloc(1, sizeof *w);
  if (!w) return kvbm_error_set(err, KVBM_ENOMEM, "worker: out of memory");
  w->cfg = *cfg;
  snprintf(w->host, sizeof w->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
  w->cfg.host = w->host;
  if (cfg->g3_dir) {
    if (strlen(cfg->g3_dir) >= sizeof w->g3_dir) {
      free(w);
      return kvbm_error_set(err, KVBM_EINVAL, "worker: --g3 directory name too long");
    }
    snprintf(w->g3_dir, sizeof w->g3_dir, "%s", cfg->g3_dir);
    w->cfg.g3_dir = w->g3_dir;
  }
  w->cfg.events = w->cfg.storage_events = NULL; /* pointers of the caller: used at create only */
  pthread_mutex_init(&w->ev_mu, NULL);
  pthread_mutex_init(&w->q_mu, NULL);
  pthread_cond_init(&w->q_cv, NULL);
  pthread_cond_init(&w->room_cv, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->stop_cv, &ca);
  pthread_condattr_destroy(&ca);
  w->publishing = true;
  w->starting = true;
  /* what the budget leaves goes half to queued requests' tokens (beyond
   * the batch's own, counted in need), half to more HTTP connections */
  uint64_t left = budget - need, more = left / 2 / conn_bytes_of(cfg);
  w->job_bytes_max = left / 2 + (uint64_t)(cfg->batch + 1) * job_bytes_of(cfg->max_tokens);
  w->max_conn = (uint32_t)(HTTP_MIN_CONN + (more < 4096 - HTTP_MIN_CONN ? more : 4096 - HTTP_MIN_CONN));
  w->q_cap = cfg->max_queue;
  w->q = calloc(w->q_cap, sizeof *w->q);
  size_t tier_blocks[NTIERS] = {cfg->g1_blocks, cfg->g2_blocks,
                                cfg->g3_dir ? (size_t)cfg->g3_blocks : 0};
  bool ok = w->q != NULL;
  for (int t = 0; t < NTIERS && ok; t++) {
    w->tiers[t] = (tier_ev){.w = w, .tier = t};
    ok = kvsim_held_init(&w->held[t], tier_blocks[t]);
  }
  if (!ok) {
    kvsim_worker_destroy(w);
    return kvbm_error_set(err, KVBM_ENOMEM, "worker: out of memory");
  }
  if (cfg->events) {
    w->cfg.events = cfg->events;
    rc = start_kv_events(w, err);
  }
  if (!rc && cfg->storage_events) {
    w->cfg.storage_events = cfg->storage_events;
    rc = start_storage_events(w, err);
  }
  /* links before the manager: its warm restart reports G3's blocks */
  for (int t = 0; t < NTIERS && !rc && w->pub; t++)
    w->tiers[t].link = (kvbm_pool_link){.pub = w->pub, .medium = medium_of(t),
                                        .block_size = cfg->block_size};
  if (!rc) rc = make_manager(w, err);
  if (!rc) rc = kvbm_metrics_create(&w->reg, err);
  if (!rc) {
    char id[16];
    snprintf(id, sizeof id, "%u", cfg->id);
    kvbm_metric_label l = {"worker", id};
    rc = kvbm_metrics_register(w->reg, kvbm_manager_metrics_collect, w->m, &l, 1, NULL, err);
    if (!rc && w->pub)
      rc = kvbm_metrics_register(w->reg, kvbm_publisher_metrics_collect, w->pub, &l, 1, NULL,
                                 err);
    if (!rc) rc = kvbm_metrics_register(w->reg, collect, w, &l, 1, NULL, err);
  }
  if (!rc) rc = make_service(w, err);
  if (!rc) {
    /* started: a clear and everything held (G3's warm restart) */
    pthread_mutex_lock(&w->ev_mu);
    w->starting = false;
    republish_locked(w);
    pthread_mutex_unlock(&w->ev_mu);
    w->threads = calloc(cfg->batch, sizeof *w->threads);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, THREAD_STACK);
    for (uint32_t i = 0; w->threads && i < cfg->batch; i++) {
      if (pthread_create(&w->threads[i], &at, executor, w)) break;
      w->nthreads++;
    }
    pthread_attr_destroy(&at);
    if (w->nthreads < cfg->batch)
      rc = kvbm_error_set(err, KVBM_EIO, "worker: could start %u of %u executor threads",
                          w->nthreads, cfg->batch);
  }
  if (rc) {
    kvsim_worker_destroy(w);
    return rc;
  }
  *out = w;
  return KVBM_OK;
}

/* Every thread the worker starts (executors, the manager's copy workers,
 * the publishers', libnats') is created with the asynchronous signals
 * blocked, so SIGINT/SIGTERM reach the thread that runs the HTTP loop
 * (kvsim_worker_run's caller): its poll returns EINTR at once and no
 * handler runs on a 1 MiB executor stack. */
int kvsim_worker_create(const kvsim_worker_config *cfg, kvsim_worker **out, kvbm_error *err) {
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = create(cfg, out, err);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int kvsim_worker_run(kvsim_worker *w, kvbm_error *err) {
  if (!w) return kvbm_error_set(err, KVBM_EINVAL, "worker: NULL");
  return kvbm__service_run(w->svc, err);
}

void kvsim_worker_stop(kvsim_worker *w) {
  if (w && w->svc) kvbm__service_stop(w->svc);
}

uint16_t kvsim_worker_port(const kvsim_worker *w) { return w ? kvbm__service_port(w->svc) : 0; }

void kvsim_worker_destroy(kvsim_worker *w) {
  if (!w) return;
  pthread_mutex_lock(&w->q_mu);
  w->quit = true;
  pthread_cond_broadcast(&w->q_cv);
  pthread_cond_broadcast(&w->stop_cv);
  pthread_cond_broadcast(&w->room_cv);
  pthread_mutex_unlock(&w->q_mu);
  for (uint32_t i = 0; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
  free(w->threads);
  while (w->q_len) { /* never started: their clients get nothing more */
    job *j = w->q[w->q_head];
    w->q_head = (w->q_head + 1) % w->q_cap;
    w->q_len--;
    free(j->prompt);
    free(j);
  }
  kvbm__service_destroy(w->svc);
  if (w->watch) natsConnection_Destroy(w->watch); /* libnats' own state stays (sink_nats.c) */
  kvbm_metrics_destroy(w->reg);
  kvbm_manager_destroy(w->m); /* its last events still reach the links */
  kvbm_publisher_destroy(w->pub);
  kvbm_storage_publisher_destroy(w->spub);
  for (int t = 0; t < NTIERS; t++) kvsim_held_free(&w->held[t]);
  free(w->q);
  pthread_cond_destroy(&w->q_cv);
  pthread_cond_destroy(&w->stop_cv);
  pthread_cond_destroy(&w->room_cv);
  pthread_mutex_destroy(&w->q_mu);
  pthread_mutex_destroy(&w->ev_mu);
  free(w);
}
