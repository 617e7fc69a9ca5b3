/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/metrics.h: the library's counters in Prometheus' text exposition
 * format (version 0.0.4), and an optional HTTP endpoint that serves them.
 *
 * A registry (kvbm_metrics) holds collectors. A collector is a function a
 * component registers with a pointer of its own; when the page is rendered
 * the registry calls every collector in registration order, and each takes
 * a snapshot of its counters (a lock held for a copy, never longer) and
 * writes it through a writer as families (a metric name, its type and
 * help) and samples (labels and a value). The registry knows no component:
 * a new counter is a new line in some collector, and the renderer is the
 * same. The library's components provide collectors next to their stats
 * getters (kvbm_manager_metrics_collect in kvbm/manager.h, ...); an engine
 * may register its own the same way.
 *
 * The page follows the format strictly, whatever the collectors write:
 *   - every family once, with "# HELP" and "# TYPE" before its samples,
 *     even when several collectors write samples of it (two managers, two
 *     subscribers) or one family is announced twice;
 *   - names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 *     [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"; a histogram's
 *     samples carry no "le" of their own; label values and help texts are
 *     escaped (backslash, double quote, newline) and any byte sequence that
 *     is not UTF-8 becomes U+FFFD;
 *   - a series (family and label set, labels sorted by name) appears once;
 *   - counters are finite and >= 0; histograms are cumulative with a
 *     "+Inf" bucket equal to _count.
 * A sample that breaks a rule is left out and counted in the registry's
 * own counter kvbm_metrics_errors_total (a bad collector costs its sample,
 * never the page), and the first such problem of the last render is kept
 * for kvbm_metrics_last_error().
 *
 * Threads. Every function on a registry may be called from any thread.
 * Renders are serialized; collectors run on the rendering thread, one at a
 * time. kvbm_metrics_unregister waits for a render in progress, so a
 * collector is never called after it returns: unregister before freeing
 * what the collector reads. A collector must not call back into its
 * registry (register, unregister, render: they would wait for themselves).
 *
 * Naming. The library's metric names are listed, with their types and
 * labels, in docs/areas/observability.md. Dynamo's names are used where
 * Dynamo has the metric (kvbm_offload_blocks_d2h, kvbm_matched_tokens,
 * dynamo_kvindexer_*, ...), so existing dashboards work; the rest follow
 * Prometheus' conventions (counters end in _total, units in the name).
 */
#ifndef KVBM_METRICS_H
#define KVBM_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_metric_type {
  KVBM_METRIC_COUNTER = 1,   /* only goes up (restarts from 0 with the process) */
  KVBM_METRIC_GAUGE = 2,     /* goes up and down */
  KVBM_METRIC_HISTOGRAM = 3, /* observations in buckets, with sum and count */
} kvbm_metric_type;

/* "counter", "gauge", "histogram"; "?" for anything else. Static. */
KVBM_EXTERN const char *kvbm_metric_type_name(kvbm_metric_type t);

/* One label of a sample. Both strings are read during the call only. */
typedef struct kvbm_metric_label {
  const char *name;
  const char *value;
} kvbm_metric_label;

/* Labels of one sample, the collector's constant labels included. */
#define KVBM_METRICS_MAX_LABELS 16
/* Longest metric or label name, and longest label value, in bytes. */
#define KVBM_METRICS_MAX_NAME 200
#define KVBM_METRICS_MAX_VALUE 1024

/* ------------------------------------------------------------ histogram */

/* Bucket bounds a histogram may have (the "+Inf" bucket is extra). */
#define KVBM_HISTOGRAM_MAX_BOUNDS 30

/* A histogram is a plain value: no allocation, no lock. Its owner
 * serializes observe and the snapshots it takes for a collector (with the
 * lock it guards its other counters with, or by doing both on one thread).
 * 0.5 KiB each. */
typedef struct kvbm_histogram {
  uint32_t num_bounds;                                /* 1..KVBM_HISTOGRAM_MAX_BOUNDS */
  double bounds[KVBM_HISTOGRAM_MAX_BOUNDS];           /* upper bounds, increasing */
  uint64_t buckets[KVBM_HISTOGRAM_MAX_BOUNDS + 1];    /* observations v with
                                                         bounds[i-1] < v <= bounds[i];
                                                         the last: v > every bound */
  uint64_t count;                                     /* observations */
  double sum;                                         /* their sum */
} kvbm_histogram;

/* Zeroes *h and sets its bounds: n (1..KVBM_HISTOGRAM_MAX_BOUNDS) finite,
 * strictly increasing values. KVBM_EINVAL naming the problem otherwise (*h
 * is then left empty: observations all land in the "+Inf" bucket). */
KVBM_EXTERN int kvbm_histogram_init(kvbm_histogram *h, const double *bounds, size_t n,
                                    kvbm_error *err);

/* Bounds first, first * factor, first * factor^2, ... (n of them): first
 * > 0, factor > 1. KVBM_EINVAL otherwise. */
KVBM_EXTERN int kvbm_histogram_init_exponential(kvbm_histogram *h, double first, double factor,
                                                size_t n, kvbm_error *err);

/* Counts one observation (O(log bounds)). NaN is ignored (it would make
 * the sum NaN for good); infinities count in the outer buckets and the
 * sum. */
KVBM_EXTERN void kvbm_histogram_observe(kvbm_histogram *h, double v);

/* ------------------------------------------------------------- registry */

typedef struct kvbm_metrics kvbm_metrics;
typedef struct kvbm_metrics_writer kvbm_metrics_writer;

/* Writes one component's samples (see the writer functions below); `user`
 * is what was registered with it. Called on the rendering thread. */
typedef void (*kvbm_metrics_collect_fn)(void *user, kvbm_metrics_writer *w);

/* Creates an empty registry. Free with kvbm_metrics_destroy(). */
KVBM_EXTERN int kvbm_metrics_create(kvbm_metrics **out, kvbm_error *err);

/* Frees the registry. Collectors still registered are forgotten (never
 * called again); a server must be stopped first. NULL: no-op. */
KVBM_EXTERN void kvbm_metrics_destroy(kvbm_metrics *reg);

/* Adds a collector. `labels` (may be NULL when num_labels is 0) are
 * constant labels added to every sample it writes, e.g. {"worker", "3"}
 * to tell two managers of one process apart; they are copied. *id (may be
 * NULL) receives the handle for kvbm_metrics_unregister. KVBM_EINVAL for
 * a NULL function or a bad label (name, length, more than
 * KVBM_METRICS_MAX_LABELS, a name given twice). */
KVBM_EXTERN int kvbm_metrics_register(kvbm_metrics *reg, kvbm_metrics_collect_fn fn, void *user,
                                      const kvbm_metric_label *labels, size_t num_labels,
                                      uint64_t *id, kvbm_error *err);

/* Removes a collector, waiting for a render in progress to end first.
 * KVBM_ENOTFOUND for an unknown id. */
KVBM_EXTERN int kvbm_metrics_unregister(kvbm_metrics *reg, uint64_t id);

/* Renders the page: calls every collector, then adds the registry's own
 * counter. *text (NUL-terminated, *len bytes without the NUL) is the
 * caller's: free it with kvbm_metrics_text_free(). KVBM_ENOMEM when memory
 * ran out (nothing returned). Cost: the collectors' snapshots, and time
 * and memory linear in the page's size. */
KVBM_EXTERN int kvbm_metrics_render(kvbm_metrics *reg, char **text, size_t *len, kvbm_error *err);
KVBM_EXTERN void kvbm_metrics_text_free(char *text);

/* Why the last render left a sample out (the first such reason, naming
 * the family), "" when it left none out. Copied into buf (cap bytes, NUL
 * terminated, cut if need be). */
KVBM_EXTERN void kvbm_metrics_last_error(kvbm_metrics *reg, char *buf, size_t cap);

/* --------------------------------------------------------------- writer */

/* For collectors, during the call only. Each returns KVBM_OK, or
 * KVBM_EINVAL when the family or sample was refused (it is then counted in
 * kvbm_metrics_errors_total; collectors may ignore the status).
 *
 * kvbm_metrics_family() announces the family the next samples belong to.
 * Announcing one that an earlier collector (or this one) announced
 * continues it; the type must be the same (else the family's samples from
 * here on are refused), the help text of the first announcement is kept.
 * `help` may be NULL. */
KVBM_EXTERN int kvbm_metrics_family(kvbm_metrics_writer *w, const char *name,
                                    kvbm_metric_type type, const char *help);

/* A sample of the current counter or gauge family. */
KVBM_EXTERN int kvbm_metrics_value(kvbm_metrics_writer *w, const kvbm_metric_label *labels,
                                   size_t num_labels, double value);
/* The same for an integer (written exactly, even above 2^53). */
KVBM_EXTERN int kvbm_metrics_value_u64(kvbm_metrics_writer *w, const kvbm_metric_label *labels,
                                       size_t num_labels, uint64_t value);
/* A sample of the current histogram family: its _bucket series (cumulative,
 * one per bound and "+Inf"), _sum and _count. */
KVBM_EXTERN int kvbm_metrics_histogram_value(kvbm_metrics_writer *w,
                                             const kvbm_metric_label *labels, size_t num_labels,
                                             const kvbm_histogram *h);

/* Shorthands: a family announced and one sample of it. */
KVBM_EXTERN int kvbm_metrics_counter(kvbm_metrics_writer *w, const char *name, const char *help,
                                     const kvbm_metric_label *labels, size_t num_labels,
                                     uint64_t value);
KVBM_EXTERN int kvbm_metrics_gauge(kvbm_metrics_writer *w, const char *name, const char *help,
                                   const kvbm_metric_label *labels, size_t num_labels,
                                   double value);

/* ------------------------------------------- the components' collectors */

/* Each component's counters as metrics, for kvbm_metrics_register (the
 * *_collect functions: `user` is the component) or for a collector of
 * yours (the *_write functions, which write a snapshot you took). The
 * families each writes are listed in docs/areas/observability.md. They
 * are declared here, in one place, and defined in their components'
 * modules.
 *
 * A collect function takes its component's lock (if it has one) for the
 * time of a copy of its counters, and writes after releasing it. The
 * component must outlive its registration: unregister before destroying
 * it. Components driven by one thread without a lock of their own (a
 * pool, a subscriber, a relay, a JetStream consumer) have only a write function: take the snapshot
 * where you drive them and hand it over. */
struct kvbm_pool_stats;
struct kvbm_subscriber_stats;
struct kvbm_relay_stats;
struct kvbm_js_consumer_stats;
typedef struct kvbm_manager kvbm_manager;
typedef struct kvbm_publisher kvbm_publisher;
typedef struct kvbm_volume kvbm_volume;
typedef struct kvbm_index kvbm_index;

/* The tiered manager (kvbm/manager.h), user = kvbm_manager *: Dynamo's
 * kvbm_* names (offload/onboard blocks per direction, matched tokens, hit
 * rates) and kvbm's own (requested and hit tokens per tier, bytes, skipped
 * copies by cause, verify failures, occupancy, copy-time histograms). */
KVBM_EXTERN void kvbm_manager_metrics_collect(void *manager, kvbm_metrics_writer *w);

/* A publisher (kvbm/events.h), user = kvbm_publisher *: events accepted,
 * published, dropped; batches; sink errors; replay requests. */
KVBM_EXTERN void kvbm_publisher_metrics_collect(void *publisher, kvbm_metrics_writer *w);

/* A subscriber's counters (kvbm_subscriber_stats_get): batches, events,
 * gaps, replays, lost and malformed messages, the bytes it holds. */
KVBM_EXTERN void kvbm_subscriber_metrics_write(kvbm_metrics_writer *w,
                                               const struct kvbm_subscriber_stats *s,
                                               const kvbm_metric_label *labels, size_t num_labels);

/* A relay's counters (kvbm_relay_stats_get): engine batches relayed,
 * events queued on its publisher, events its decoder skipped (an unknown
 * tag, a field of the wrong type: kvbm_event_batch.skipped) and decoded
 * events its publisher refused. Its subscriber's are
 * kvbm_subscriber_metrics_write's (kvbm_relay_subscriber). */
KVBM_EXTERN void kvbm_relay_metrics_write(kvbm_metrics_writer *w, const struct kvbm_relay_stats *s,
                                          const kvbm_metric_label *labels, size_t num_labels);

/* A JetStream consumer's counters (kvbm_js_consumer_stats_get): messages
 * taken, batches and events returned, messages redelivered and refused,
 * acks, re-binds. */
KVBM_EXTERN void kvbm_js_consumer_metrics_write(kvbm_metrics_writer *w,
                                                const struct kvbm_js_consumer_stats *s,
                                                const kvbm_metric_label *labels,
                                                size_t num_labels);

/* A fabric end (kvbm/fabric.h), user = kvbm_fabric *: operations and
 * bytes by kind (push, pull, write, read) and transport failures. Its
 * counters are atomics: any thread, no lock (see kvbm_fabric_stats_get).
 * Unregister before kvbm_fabric_destroy. */
KVBM_EXTERN void kvbm_fabric_metrics_collect(void *fabric, kvbm_metrics_writer *w);

/* A pool's counters (kvbm_pool_stats_get): occupancy by state, blocks
 * allocated, evicted, deduplicated and matched. */
KVBM_EXTERN void kvbm_pool_metrics_write(kvbm_metrics_writer *w, const struct kvbm_pool_stats *s,
                                         const kvbm_metric_label *labels, size_t num_labels);

/* A volume (kvbm/volume.h), user = kvbm_volume *: operations, hits and
 * misses, bytes, timeouts and errors, queue; labelled with its name. */
KVBM_EXTERN void kvbm_volume_metrics_collect(void *volume, kvbm_metrics_writer *w);

/* A router index (kvbm/router.h), user = kvbm_index *: Dynamo's
 * dynamo_kvindexer_workers, the index's own counters and its size per
 * worker and tier (kvbm_index_worker_blocks). Its counters are read without the writer's lock (see
 * kvbm_index_stats_get). */
KVBM_EXTERN void kvbm_index_metrics_collect(void *index, kvbm_metrics_writer *w);

/* --------------------------------------------------------------- server */

/* The HTTP endpoint: one thread of its own serving GET /metrics (HEAD
 * too) from a registry, with HTTP/1.1 keep-alive. It takes no lock but the
 * registry's (and, through the collectors, each component's for its
 * snapshot). Requests are parsed by the library's strict HTTP head parser
 * (the router's); a bad head gets its 4xx and the connection is closed, a
 * request with a body 413, another path 404, another method 405. Bounded:
 * at most max_connections at once and max_per_peer from one client address;
 * a new connection that would pass either bound takes the slot of an idle
 * connection (no request begun, no answer queued: the one idle longest, of
 * its own address when it is its address's bound) and is answered 503 only
 * when none is idle; a request head of at most 8 KiB, io_timeout_s for a
 * request to arrive and for its answer to be taken. Its own counters
 * (kvbm_metrics_http_*) are in the registry it serves while it runs. */
typedef struct kvbm_metrics_server_config {
  bool enabled;             /* for the callers that start a server by config
                               (kvbm_manager_config.metrics, kvbm replay):
                               start one (false). kvbm_metrics_server_start
                               itself does not read it. */
  const char *host;         /* IPv4 address to listen on: "0.0.0.0" (every
                               interface, as Dynamo does); copied */
  uint16_t port;            /* 6880 (Dynamo's default); 0: any free port */
  uint32_t max_connections; /* 1..4096 (16) */
  uint32_t max_per_peer;    /* connections from one IPv4 address, >= 1 (8);
                               loopback is an address like any other; above
                               max_connections: max_connections */
  double io_timeout_s;      /* > 0 (10) */
} kvbm_metrics_server_config;

KVBM_EXTERN kvbm_metrics_server_config kvbm_metrics_server_config_default(void);

/* Applies the environment, Dynamo's names first:
 *   DYN_KVBM_METRICS       true/1/yes/on or false/0/no/off: enabled
 *   DYN_KVBM_METRICS_PORT  0..65535: port
 *   KVBM_METRICS_HOST      IPv4 address: host (pointed to, not copied)
 * `env` is an environ-style NULL-terminated "NAME=value" array, or NULL
 * for the process environment. A malformed value: KVBM_EINVAL naming the
 * variable, *cfg unchanged. */
KVBM_EXTERN int kvbm_metrics_server_config_env(kvbm_metrics_server_config *cfg,
                                               const char *const *env, kvbm_error *err);

typedef struct kvbm_metrics_server kvbm_metrics_server;

/* Listens (bind errors show here: KVBM_EIO naming the address and the
 * reason) and starts the thread. `reg` is borrowed: it must outlive the
 * server. KVBM_EINVAL for a bad config. Stop with kvbm_metrics_server_stop. */
KVBM_EXTERN int kvbm_metrics_server_start(kvbm_metrics *reg, const kvbm_metrics_server_config *cfg,
                                          kvbm_metrics_server **out, kvbm_error *err);

/* The port it listens on (the one picked when the config said 0). */
KVBM_EXTERN uint16_t kvbm_metrics_server_port(const kvbm_metrics_server *s);

/* Stops the thread (a render in progress finishes first), closes every
 * connection and frees. NULL: no-op. */
KVBM_EXTERN void kvbm_metrics_server_stop(kvbm_metrics_server *s);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_METRICS_H */
