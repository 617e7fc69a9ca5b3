/*
 * daemon_impl.h: what the router daemon's parts share (daemon.c: HTTP and
 * routing; sources.c: event subscriptions).
 */
#ifndef KVBM_ROUTER_DAEMON_IMPL_H
#define KVBM_ROUTER_DAEMON_IMPL_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>

#include "kvbm/router.h"

typedef struct source {
  struct kvbm_router_daemon *d;
  kvbm_router_source cfg; /* strings owned */
  kvbm_subscriber *sub;   /* ZMQ */
  pthread_t th;
  bool started;
  natsConnection *nc;     /* NATS */
  natsSubscription *ns;
  kvbm_event_decoder *dec;
  bool have_expected;     /* NATS: next sequence number wanted */
  uint64_t expected;
  _Atomic int64_t last_ns;  /* monotonic time of the last batch */
  _Atomic int dropped;      /* its workers were dropped for silence */
  _Atomic int nats_done;    /* NATS: the handler will not run again */
  _Atomic uint64_t batches, errors, lost, replayed;
} source;

struct kvbm_router_daemon {
  kvbm_router_daemon_config cfg; /* strings below are ours */
  char *host;
  kvbm_router_source *scfg;
  kvbm_worker_key *workers;
  kvbm_index *idx;
  pthread_mutex_t wlock; /* serializes the index's writers */
  kvbm_approx *approx;
  source *src;
  size_t nsrc;
  int lfd, wake[2];
  uint16_t port;
  _Atomic int stop;
  _Atomic uint64_t gaps;
  struct http_state *http;
};

int64_t kvbm__rd_now_ns(void);
void kvbm__rd_log(struct kvbm_router_daemon *d, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int kvbm__rd_sources_start(struct kvbm_router_daemon *d, kvbm_error *err);
void kvbm__rd_sources_stop(struct kvbm_router_daemon *d);
/* Drops the workers of sources silent for longer than worker_timeout_s. */
void kvbm__rd_sources_tick(struct kvbm_router_daemon *d);

#endif
