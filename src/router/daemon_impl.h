/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon_impl.h: what the router daemon's parts share (daemon.c: HTTP and
 * routing; sources.c: event subscriptions).
 */
#ifndef KVBM_ROUTER_DAEMON_IMPL_H
#define KVBM_ROUTER_DAEMON_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "kvbm/router.h"
#include "router/json.h"

/* What became of an event (kvbm_router_daemon.applied): applied; skipped
 * as already applied (its batch's id); the one the index refused; after a
 * refused one in its batch, not applied; its dp rank refused. */
enum { RD_OK, RD_DUPLICATE, RD_ERROR, RD_NOT_APPLIED, RD_RANK_REFUSED, RD_OUTCOMES };

/* What /health and /metrics show of a source. Written by the source's
 * thread (ZMQ, NATS: copied from its subscriber's counters after each
 * receive; JetStream: counted there), read by the HTTP thread. */
typedef struct source_counts {
  _Atomic uint64_t batches, errors, lost, replayed, duplicates, resets, jumps, replay_failures,
      replay_refused, overflow, reconnects, ranks_refused, gaps, replay_requests, messages,
      malformed, skipped_events;
  _Atomic uint64_t js_pos, js_redelivered, js_malformed, js_acks, js_rebinds; /* JetStream */
} source_counts;

typedef struct source {
  struct kvbm_router_daemon *d;
  kvbm_router_source cfg; /* strings owned */
  kvbm_subscriber *sub;   /* ZMQ, NATS */
  pthread_t th;
  bool started;
  kvbm_event_decoder *dec;  /* JetStream: for replies of the replay socket */
  kvbm_seqno_tracker seq;   /* JetStream: the stream's order */
  void *zctx, *dealer;      /* JetStream: the replay client */
  uint32_t ranks[KVBM_ROUTER_MAX_WORKERS]; /* dp ranks admitted (writer lock) */
  uint32_t nranks;
  _Atomic int64_t last_ns;  /* monotonic time of the last batch */
  _Atomic int dropped;      /* its workers were dropped for silence */
  kvbm_js_consumer *js;     /* JetStream */
  uint64_t js_pos;          /* JetStream: the stream position of the last
                             * batch applied (writer lock) */
  uint64_t resume_after;    /* from a snapshot: JetStream position, or (ZMQ)
                             * the next batch due + 1 (0: none) */
  uint64_t acked_gen;       /* JetStream: d->snapshots at the last ack */
  _Atomic int degraded;     /* batches lost that replay did not give back,
                             * since the worker's last new stream or clear */
  source_counts n;
} source;

struct kvbm_router_daemon {
  kvbm_router_daemon_config cfg; /* strings below are ours */
  char *host, *durable, *snapshot_path;
  kvbm_router_source *scfg;
  kvbm_worker_key *workers;
  kvbm_index *idx;
  pthread_mutex_t wlock; /* serializes the index's writers */
  kvbm_approx *approx;
  source *src;
  size_t nsrc;
  struct kvbm__service *svc; /* the HTTP side (src/service) */
  uint16_t port;
  _Atomic int stop;
  _Atomic uint64_t gaps;
  /* events by type (stored, removed, cleared) and outcome (see
   * kvbm__rd_sources_metrics): Dynamo's kv_cache_events_applied */
  _Atomic uint64_t applied[3][RD_OUTCOMES];
  struct http_state *http;
  /* warm restart (snapshot.c) */
  pthread_t snap_th;
  bool snap_started;
  pthread_mutex_t snap_mu;   /* the snapshot thread's sleep, and one write at a time */
  pthread_cond_t snap_cv;
  bool snap_stop;
  _Atomic uint64_t snapshots, snapshot_failures;
  kvbm_approx *degraded_ap;  /* decisions for degraded workers (approximate) */
  bool snap_armed;           /* create succeeded: stopping writes a last snapshot */
  struct kvbm_metrics *metrics; /* GET /metrics (rendered on the HTTP thread) */
};

int64_t kvbm__rd_now_ns(void);
void kvbm__rd_log(struct kvbm_router_daemon *d, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int kvbm__rd_sources_start(struct kvbm_router_daemon *d, kvbm_error *err);
/* Stops the sources' threads (the index no longer changes); then stop
 * frees them (after the last snapshot, whose position JetStream sources
 * ack). stop halts first when halt was not called. */
void kvbm__rd_sources_halt(struct kvbm_router_daemon *d);
void kvbm__rd_sources_stop(struct kvbm_router_daemon *d);
/* Drops the workers of sources silent for longer than worker_timeout_s. */
void kvbm__rd_sources_tick(struct kvbm_router_daemon *d);
/* Checks the source settings of a daemon config. */
int kvbm__rd_sources_check_config(const kvbm_router_daemon_config *c, kvbm_error *err);
/* Appends source i's /health object. */
void kvbm__rd_source_health(const struct kvbm_router_daemon *d, size_t i, rj_buf *b);
/* Whether worker_id's source is degraded (any thread). */
bool kvbm__rd_worker_degraded(const struct kvbm_router_daemon *d, uint64_t worker_id);

/* approx.c: the records' blocks out of the index and back (writer lock). */
void kvbm__approx_withdraw(kvbm_approx *a);
void kvbm__approx_return(kvbm_approx *a);
/* Drops slot s's records, the index untouched: it forgot the slot's blocks
 * (a clear, a restart, a dropped worker) and their copies with them. */
void kvbm__approx_forget(kvbm_approx *a, uint32_t slot);

/* snapshot.c: loads cfg.snapshot_path (when it exists) into the index and
 * the sources' resume positions, before the sources start. */
int kvbm__rd_snapshot_load(struct kvbm_router_daemon *d, kvbm_error *err);
/* Writes the snapshot now (any thread but a source's). */
int kvbm__rd_snapshot_save(struct kvbm_router_daemon *d, kvbm_error *err);
/* The thread that writes it every snapshot_every_s; stop writes a last one. */
int kvbm__rd_snapshot_start(struct kvbm_router_daemon *d, kvbm_error *err);
void kvbm__rd_snapshot_stop(struct kvbm_router_daemon *d);
/* Writes every source's counters as metrics, labelled by worker_id. */
struct kvbm_metrics_writer;
void kvbm__rd_sources_metrics(const struct kvbm_router_daemon *d, struct kvbm_metrics_writer *w);

#endif
