/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.c: `kvbm advisor` (see advisor/daemon.h, docs/areas/advisor.md).
 *
 * Design. Two threads. The sources' thread reads every source in turns
 * (at most SOURCE_TURN messages each, a short sleep when none had any):
 * a replay of a gap waits for the publisher's ROUTER for up to its
 * deadline, and that wait must not stall the HTTP API. The main thread
 * derives hints on a timer. HTTP is the metrics endpoint's server
 * (metrics/server.h) on a thread of its own: GET /metrics from a registry
 * with the daemon's collector, and the advisor's API (/hints, /volumes,
 * /prefix, /health) as its extra routes, so the advisor has the same
 * hardened server as every other kvbm endpoint and /metrics on its own
 * port, as the router does. The advisor (not thread-safe) and the sources'
 * counters live under one mutex, taken per message applied, per answer and
 * per scrape (for a copy of the counters); decoding and socket reads
 * happen outside it.
 *
 * Every source is the events module's kvbm_subscriber, whatever its
 * transport (a ZMQ PUB endpoint, or a NATS subject with the Kvbm-Seq
 * header): the subscriber keeps the sequence rules, asks the replay
 * ROUTER for a gap when the source names one (else counts it lost), keeps
 * the byte budget (NATS: libnats' queue, its drops counted as overflow)
 * and redials. Storage events come in raw mode (decoded here by
 * kvbm_storage_decode), KV events in normal mode (both of vLLM's forms).
 * So a source here is only "receive a batch, apply it to the advisor",
 * and its counters are the subscriber's, copied for /health and /metrics
 * after each turn. Malformed messages are counted per source and
 * skipped; the advisor itself counts what it refuses.
 *
 * Hints are derived every hint_period_ms (not on GET: deriving marks the
 * hinted blocks, and a GET must not change what the next one says); the
 * last derivation is kept as the JSON of GET /hints and published, as
 * msgpack with its sequence in Kvbm-Seq, on the hints subject.
 */
#include "advisor/daemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/vec.h"
#include "kvbm/events.h"
#include "kvbm/metrics.h"
#include "metrics/server.h"
#include "kvbm/storage_events.h"

#define SOURCE_TURN 64

typedef struct counts {
  uint64_t batches, events, errors, lost, duplicates, resets, jumps, overflow;
} counts;

typedef struct asrc {
  kvbm__asrc_config cfg;
  kvbm_subscriber *sub;
  kvbm_storage_decoder *sdec; /* storage sources: the subscriber gives the raw payload */
  counts n;
  uint64_t replayed, reconnects;
  char last_error[KVBM_ERROR_MSG_MAX];
} asrc;

typedef struct adaemon {
  const kvbm__advisor_daemon_config *cfg;
  pthread_mutex_t mu; /* the advisor and the sources' counters */
  volatile sig_atomic_t *stop;
  kvbm_advisor *a;
  asrc src[KVBM__ADVISOR_MAX_SOURCES];
  size_t ns;
  kvbm_metrics *reg;
  kvbm_metrics_server *http;
  natsConnection *hnc;
  kvbm_hint *hints;
  kvbm_wire_hint *wire;
  char *hints_json;
  size_t hints_len, hints_cap;
  uint64_t derivations, hint_errors, hints_sent;
  uint8_t *payload;
  size_t plen, pcap;
  uint64_t started_ms;
} adaemon;

kvbm__advisor_daemon_config kvbm__advisor_daemon_config_default(void) {
  kvbm__advisor_daemon_config c;
  memset(&c, 0, sizeof c);
  c.advisor = kvbm_advisor_config_default();
  c.listen = "127.0.0.1:8091";
  c.hint_period_ms = 10000;
  c.max_hints = 4096;
  c.max_connections = 64;
  c.io_timeout_ms = 10000;
  c.queue_bytes = (size_t)16 << 20;
  c.max_payload = (size_t)2 << 20;
  return c;
}

static uint64_t now_ms(void) { return kvbm_clock_ns() / 1000000u; }

static const char *kind_name(kvbm__asrc_kind k) {
  static const char *const n[] = {"storage-zmq", "storage-nats", "kv-zmq", "kv-nats"};
  return (unsigned)k < 4 ? n[k] : "?";
}

/* ---- JSON into a growing buffer ---- */

typedef struct jb {
  char **b;
  size_t *len, *cap;
} jb;

static void jp(jb *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jp(jb *j, const char *fmt, ...) {
  for (;;) {
    size_t room = *j->cap - *j->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*j->b ? *j->b + *j->len : NULL, *j->b ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < room && *j->b) {
      *j->len += (size_t)n;
      return;
    }
    /* n bytes and vsnprintf's NUL; out of memory: the text is cut. */
    if (kvbm__vec_reserve_of(j->b, j->cap, *j->len + (size_t)n + 1, 4096, KVBM__VEC_NO_LIMIT))
      return;
  }
}

static void jstr(jb *j, const char *s, size_t n) {
  jp(j, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') jp(j, "\\%c", c);
    else if (c < 0x20 || c == 0x7f) jp(j, "\\u%04x", c);
    else jp(j, "%c", c);
  }
  jp(j, "\"");
}

/* ---- sources ---- */

/* Lock held. */
static void note_error(asrc *s, const kvbm_error *e) {
  s->n.errors++;
  snprintf(s->last_error, sizeof s->last_error, "%s", e->msg);
}

static void note_error_locked(adaemon *d, asrc *s, const kvbm_error *e) {
  pthread_mutex_lock(&d->mu);
  note_error(s, e);
  pthread_mutex_unlock(&d->mu);
}

static bool is_storage(const asrc *s) {
  return s->cfg.kind == KVBM__ASRC_STORAGE_ZMQ || s->cfg.kind == KVBM__ASRC_STORAGE_NATS;
}

static bool is_nats(const asrc *s) {
  return s->cfg.kind == KVBM__ASRC_STORAGE_NATS || s->cfg.kind == KVBM__ASRC_KV_NATS;
}

/* The subscriber's own counts, copied where /health reads them. Called
 * under d->mu with each batch's counts, so a reader never sees a batch
 * applied without the replay or loss that brought it. */
static void copy_stats_locked(asrc *s, const kvbm_subscriber_stats *ss) {
  s->n.lost = ss->lost;
  s->n.duplicates = ss->duplicates;
  s->n.resets = ss->resets;
  s->n.jumps = ss->jumps;
  s->n.overflow = ss->overflow;
  s->replayed = ss->replayed;
  s->reconnects = ss->reconnects;
}

/* One batch from the subscriber; false when there was none (or the
 * transport failed for good: the next turn tries again). A storage
 * payload is decoded outside the lock; applying is under it. */
static bool source_recv(adaemon *d, asrc *s) {
  kvbm_event_batch b;
  const uint8_t *p = NULL;
  size_t len = 0;
  kvbm_error err = {0};
  int rc = kvbm_subscriber_recv_raw(s->sub, 0, &b, &p, &len, &err);
  if (rc == KVBM_ETIMEDOUT) return false;
  if (rc) {
    note_error_locked(d, s, &err); /* counted and skipped by the subscriber too */
    return rc != KVBM_EIO;
  }
  kvbm_subscriber_stats ss;
  kvbm_subscriber_stats_get(s->sub, &ss);
  if (is_storage(s)) {
    kvbm_storage_batch sb;
    if (kvbm_storage_decode(s->sdec, p, len, b.seq, &sb, &err)) {
      note_error_locked(d, s, &err);
      return true;
    }
    pthread_mutex_lock(&d->mu);
    copy_stats_locked(s, &ss);
    s->n.batches++;
    s->n.events += sb.num_events;
    kvbm_advisor_storage(d->a, &sb, now_ms());
    pthread_mutex_unlock(&d->mu);
  } else {
    pthread_mutex_lock(&d->mu);
    copy_stats_locked(s, &ss);
    s->n.batches++;
    s->n.events += b.num_events;
    kvbm_advisor_kv(d->a, &b, now_ms());
    pthread_mutex_unlock(&d->mu);
  }
  return true;
}

static bool source_turn(adaemon *d, asrc *s) {
  bool any = false;
  for (int k = 0; k < SOURCE_TURN && source_recv(d, s); k++) any = true;
  kvbm_subscriber_stats ss; /* reconnects and losses seen with no batch */
  kvbm_subscriber_stats_get(s->sub, &ss);
  pthread_mutex_lock(&d->mu);
  copy_stats_locked(s, &ss);
  pthread_mutex_unlock(&d->mu);
  return any;
}

/* The sources' thread. */
static void *sources_main(void *arg) {
  adaemon *d = arg;
  while (!*d->stop) {
    bool busy = false;
    for (size_t i = 0; i < d->ns; i++) busy |= source_turn(d, &d->src[i]);
    if (!busy) usleep(2000);
  }
  return NULL;
}

/* The hints' connection (publishing only: sources are subscribers). */
static int hints_connect(const char *url, natsConnection **nc, kvbm_error *err) {
  natsOptions *o = NULL;
  natsStatus st = natsOptions_Create(&o);
  if (st == NATS_OK) st = natsOptions_SetURL(o, url);
  if (st == NATS_OK) st = natsOptions_SetMaxReconnect(o, -1); /* a daemon outlives outages */
  if (st == NATS_OK) st = natsConnection_Connect(nc, o);
  natsOptions_Destroy(o);
  if (st != NATS_OK)
    return kvbm_error_set(err, KVBM_EIO, "advisor: NATS %s: %s", url, natsStatus_GetText(st));
  return KVBM_OK;
}

/* A ZMQ endpoint, or a NATS URL and subject: the subscriber tells them
 * apart (and refuses a NATS source without a subject). */
static int source_open(adaemon *d, asrc *s, kvbm_error *err) {
  const kvbm__advisor_daemon_config *c = d->cfg;
  if (is_storage(s)) {
    int rc = kvbm_storage_decoder_create(&s->sdec, err);
    if (rc) return rc;
  }
  if (is_nats(s) && (!s->cfg.subject || !*s->cfg.subject))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: NATS source %s has no subject",
                          s->cfg.name ? s->cfg.name : "");
  kvbm_subscriber_config sc = kvbm_subscriber_config_default(s->cfg.endpoint);
  sc.subject = is_nats(s) ? s->cfg.subject : NULL;
  sc.replay_endpoint = s->cfg.replay;
  sc.raw = is_storage(s);
  sc.max_payload = c->max_payload;
  sc.max_queue_bytes = c->queue_bytes < 2 * c->max_payload ? 2 * c->max_payload : c->queue_bytes;
  return kvbm_subscriber_create(&sc, &s->sub, err);
}

static void source_close(asrc *s) {
  kvbm_subscriber_destroy(s->sub);
  kvbm_storage_decoder_destroy(s->sdec);
}

/* ---- hints ---- */

static void derive(adaemon *d) {
  size_t n = 0;
  kvbm_advisor_hints(d->a, now_ms(), d->hints, d->cfg->max_hints, &n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (kvbm_advisor_hint_wire(d->a, &d->hints[i], &d->wire[k]) == KVBM_OK) k++;
  d->derivations++;
  double wall = kvbm_clock_wall_seconds();
  d->hints_len = 0;
  jb j = {&d->hints_json, &d->hints_len, &d->hints_cap};
  jp(&j, "{\"ts\":%.3f,\"seq\":%" PRIu64 ",\"count\":%zu,\"hints\":[", wall, d->derivations - 1, k);
  char one[1024];
  for (size_t i = 0; i < k; i++) {
    size_t need = kvbm_wire_hint_to_json(&d->wire[i], one, sizeof one);
    if (need >= sizeof one) continue;
    jp(&j, "%s%s", i ? "," : "", one);
  }
  jp(&j, "]}");
  if (!d->hnc) return;
  kvbm_hint_batch hb = {.seq = d->derivations - 1, .ts = wall, .source = "kvbm-advisor",
                        .source_len = 12, .hints = d->wire, .num_hints = k};
  d->plen = 0;
  natsMsg *m = NULL;
  char seq[24];
  snprintf(seq, sizeof seq, "%" PRIu64, hb.seq);
  natsStatus st = NATS_ERR;
  if (kvbm_hints_encode(&hb, &d->payload, &d->plen, &d->pcap, NULL) == KVBM_OK && d->plen <= INT32_MAX) {
    st = natsMsg_Create(&m, d->cfg->hints_subject, NULL, (const char *)d->payload, (int)d->plen);
    if (st == NATS_OK) st = natsMsgHeader_Set(m, "Kvbm-Seq", seq);
    if (st == NATS_OK) st = natsConnection_PublishMsg(d->hnc, m);
    natsMsg_Destroy(m);
  }
  if (st == NATS_OK) d->hints_sent++;
  else d->hint_errors++;
}

/* ---- HTTP handlers ---- */

static int h_volumes(adaemon *d, jb *j) {
  jp(j, "{\"volumes\":[");
  for (size_t i = 0; i < kvbm_advisor_volume_count(d->a); i++) {
    kvbm_advisor_volume_info v;
    kvbm_advisor_volume_get(d->a, i, &v);
    jp(j, "%s{\"name\":", i ? "," : "");
    jstr(j, v.name, strlen(v.name));
    jp(j, ",\"tier\":");
    if (v.tier >= 0) jp(j, "\"%s\"", kvbm_tier_name(v.tier));
    else jp(j, "null");
    jp(j, ",\"live_blocks\":%" PRIu64 ",\"live_bytes\":%" PRIu64 ",\"stores\":%" PRIu64
          ",\"removes\":%" PRIu64 ",\"high_water\":%" PRIu64 ",\"indexed\":%" PRIu64
          ",\"eviction_age_ms\":%.0f}",
       v.live_blocks, v.live_bytes, v.stores, v.removes, v.high_water, v.indexed, v.eviction_age_ms);
  }
  jp(j, "]}");
  return 200;
}

/* One number, decimal or 0x-hex, ending at `stop` or the string's end. */
static bool parse_u64(const char *v, char stop, uint64_t *out, const char **rest) {
  int base = 10;
  if (v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) base = 16, v += 2;
  if (!*v || *v == '-' || *v == '+' || *v == ' ') return false;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, base);
  if (errno || end == v || (*end && *end != stop)) return false;
  *out = x;
  *rest = end;
  return true;
}

/* hash=N[&namespace=N], nothing else (namespace: kvbm_index_namespace of
 * the tenant's cache_salt and LoRA name; 0 or absent: the default). */
static bool parse_hash(const char *q, uint64_t *out, uint64_t *ns) {
  const char *rest;
  *ns = 0;
  if (strncmp(q, "hash=", 5) || !parse_u64(q + 5, '&', out, &rest)) return false;
  if (!*rest) return true;
  if (strncmp(rest, "&namespace=", 11)) return false;
  return parse_u64(rest + 11, '\0', ns, &rest) && !*rest;
}

static int h_prefix(adaemon *d, const char *query, jb *j) {
  uint64_t p, ns;
  if (!parse_hash(query, &p, &ns)) {
    jp(j, "{\"error\":\"the query must be hash=N[&namespace=N] (decimal or 0x-hex, 64 bits)\",\"status\":400}");
    return 400;
  }
  kvbm_advisor_prefix_info info;
  if (kvbm_advisor_prefix_get(d->a, p, ns, now_ms(), &info)) {
    jp(j, "{\"error\":\"prefix not tracked\",\"status\":404}");
    return 404;
  }
  jp(j, "{\"prefix_hash\":%" PRIu64 ",\"namespace\":%" PRIu64 ",\"score\":%.4f,\"idle_ms\":%" PRIu64 ",\"events\":%" PRIu64
        ",\"volumes\":{",
     p, ns, info.score, now_ms() > info.last_ms ? now_ms() - info.last_ms : 0, info.events);
  bool first = true;
  for (size_t i = 0; i < kvbm_advisor_volume_count(d->a); i++) {
    if (!info.blocks[i]) continue;
    kvbm_advisor_volume_info v;
    kvbm_advisor_volume_get(d->a, i, &v);
    jp(j, "%s", first ? "" : ",");
    jstr(j, v.name, strlen(v.name));
    jp(j, ":%u", info.blocks[i]);
    first = false;
  }
  jp(j, "}}");
  return 200;
}

static int h_health(adaemon *d, kvbm_metrics_server *srv, jb *j) {
  kvbm_advisor_stats st;
  kvbm_advisor_stats_get(d->a, &st);
  jp(j, "{\"status\":\"ok\",\"uptime_s\":%.1f,\"advisor\":{\"storage_events\":%" PRIu64
        ",\"kv_events\":%" PRIu64 ",\"kv_other_media\":%" PRIu64 ",\"uses\":%" PRIu64
        ",\"onboard_uses\":%" PRIu64 ",\"refused_volume\":%" PRIu64 ",\"refused_source\":%" PRIu64
        ",\"lost_events\":%" PRIu64 ",\"source_restarts\":%" PRIu64 ",\"unknown_removes\":%" PRIu64
        ",\"forgotten_blocks\":%" PRIu64 ",\"forgotten_held\":%" PRIu64
        ",\"forgotten_prefixes\":%" PRIu64 ",\"entries\":%" PRIu64 ",\"max_blocks\":%zu"
        ",\"prefixes\":%" PRIu64 ",\"memory_bytes\":%" PRIu64 ",\"hints\":{\"promote\":%" PRIu64
        ",\"demote\":%" PRIu64 ",\"drop\":%" PRIu64 ",\"compact\":%" PRIu64 "}},",
     (double)(now_ms() - d->started_ms) / 1000, st.storage_events, st.kv_events, st.kv_other_media,
     st.uses, st.onboard_uses, st.refused_volume, st.refused_source, st.lost_events,
     st.source_restarts, st.unknown_removes, st.forgotten_blocks, st.forgotten_held,
     st.forgotten_prefixes, st.entries, d->cfg->advisor.max_blocks, st.prefixes, st.memory_bytes,
     st.hints[KVBM_HINT_PROMOTE], st.hints[KVBM_HINT_DEMOTE], st.hints[KVBM_HINT_DROP],
     st.hints[KVBM_HINT_COMPACT]);
  jp(j, "\"derivations\":%" PRIu64 ",\"hints_published\":%" PRIu64 ",\"hint_publish_errors\":%" PRIu64
        ",\"sources\":[",
     d->derivations, d->hints_sent, d->hint_errors);
  for (size_t i = 0; i < d->ns; i++) {
    asrc *s = &d->src[i];
    counts n = s->n;
    jp(j, "%s{\"replayed\":%" PRIu64 ",\"reconnects\":%" PRIu64 ",\"name\":", i ? "," : "",
       s->replayed, s->reconnects);
    jstr(j, s->cfg.name ? s->cfg.name : "", s->cfg.name ? strlen(s->cfg.name) : 0);
    jp(j, ",\"kind\":\"%s\",\"batches\":%" PRIu64 ",\"events\":%" PRIu64 ",\"errors\":%" PRIu64
          ",\"lost\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"resets\":%" PRIu64 ",\"jumps\":%" PRIu64
          ",\"overflow\":%" PRIu64 ",\"last_error\":",
       kind_name(s->cfg.kind), n.batches, n.events, n.errors, n.lost, n.duplicates, n.resets,
       n.jumps, n.overflow);
    jstr(j, s->last_error, strlen(s->last_error));
    jp(j, "}");
  }
  kvbm__metrics_server_stats hs;
  kvbm__metrics_server_stats_get(srv, &hs);
  jp(j, "],\"http\":{\"connections\":%" PRIu64 ",\"max_connections\":%u,\"accepted\":%" PRIu64
        ",\"refused_busy\":%" PRIu64 ",\"accept_pauses\":%" PRIu64 ",\"requests\":%" PRIu64
        ",\"answered\":%" PRIu64 ",\"bad_requests\":%" PRIu64 ",\"read_timeouts\":%" PRIu64
        ",\"write_timeouts\":%" PRIu64 "}}",
     hs.connections, d->cfg->max_connections, hs.accepted, hs.refused_busy, hs.accept_pauses,
     hs.requests, hs.answered, hs.bad_requests, hs.read_timeouts, hs.write_timeouts);
  return 200;
}

static int answer(adaemon *d, kvbm_metrics_server *srv, const http_req *req, jb *jj);

/* The server's routes (every path but /metrics), on its thread. */
static int handle(void *user, kvbm_metrics_server *srv, const http_req *req, char **body,
                  size_t *len, size_t *cap) {
  adaemon *d = user;
  jb j = {body, len, cap};
  pthread_mutex_lock(&d->mu);
  int st = answer(d, srv, req, &j);
  pthread_mutex_unlock(&d->mu);
  return st;
}

static int answer(adaemon *d, kvbm_metrics_server *srv, const http_req *req, jb *jj) {
  jb j = *jj;
  if (!strcmp(req->path, "/prefix")) return h_prefix(d, req->query, &j);
  if (req->query[0]) {
    jp(&j, "{\"error\":\"%s takes no query\",\"status\":400}", req->path[1] ? req->path + 1 : "/");
    return 400;
  }
  if (!strcmp(req->path, "/hints")) {
    if (d->hints_json) jp(&j, "%.*s", (int)d->hints_len, d->hints_json);
    else jp(&j, "{\"ts\":null,\"seq\":null,\"count\":0,\"hints\":[]}");
    return 200;
  }
  if (!strcmp(req->path, "/volumes")) return h_volumes(d, &j);
  if (!strcmp(req->path, "/health")) return h_health(d, srv, &j);
  jp(&j, "{\"error\":\"no such path (GET /hints, /volumes, /prefix?hash=N[&namespace=N], /health, /metrics)\",\"status\":404}");
  return 404;
}

/* ---- metrics ---- */

/* A copy of every counter /health shows, taken under the lock. */
typedef struct snap {
  kvbm_advisor_stats st;
  size_t nvol;
  kvbm_advisor_volume_info vol[KVBM_ADVISOR_MAX_VOLUMES];
  counts n[KVBM__ADVISOR_MAX_SOURCES];
  uint64_t replayed[KVBM__ADVISOR_MAX_SOURCES], reconnects[KVBM__ADVISOR_MAX_SOURCES];
  uint64_t derivations, hints_sent, hint_errors;
} snap;

static void metric_per_source(kvbm_metrics_writer *w, const adaemon *d, const char *name,
                              const char *help, const uint64_t *v, size_t stride) {
  kvbm_metrics_family(w, name, KVBM_METRIC_COUNTER, help);
  for (size_t i = 0; i < d->ns; i++) {
    kvbm_metric_label l[2] = {{"source", d->src[i].cfg.name ? d->src[i].cfg.name : ""},
                              {"kind", kind_name(d->src[i].cfg.kind)}};
    kvbm_metrics_value_u64(w, l, 2, v[i * stride]);
  }
}

/* The daemon's collector (the server's own kvbm_metrics_http_* come from
 * the server): the advisor's counters, per volume and per source. The
 * names are in docs/areas/observability.md. On the server's thread. */
static void collect(void *user, kvbm_metrics_writer *w) {
  adaemon *d = user;
  snap *s = malloc(sizeof *s);
  if (!s) return;
  pthread_mutex_lock(&d->mu);
  kvbm_advisor_stats_get(d->a, &s->st);
  s->nvol = kvbm_advisor_volume_count(d->a);
  if (s->nvol > KVBM_ADVISOR_MAX_VOLUMES) s->nvol = KVBM_ADVISOR_MAX_VOLUMES;
  for (size_t i = 0; i < s->nvol; i++) kvbm_advisor_volume_get(d->a, i, &s->vol[i]);
  for (size_t i = 0; i < d->ns; i++) {
    s->n[i] = d->src[i].n;
    s->replayed[i] = d->src[i].replayed;
    s->reconnects[i] = d->src[i].reconnects;
  }
  s->derivations = d->derivations;
  s->hints_sent = d->hints_sent;
  s->hint_errors = d->hint_errors;
  pthread_mutex_unlock(&d->mu);
  const kvbm_advisor_stats *st = &s->st;

  kvbm_metrics_family(w, "kvbm_advisor_events_total", KVBM_METRIC_COUNTER,
                      "Events the advisor applied, by kind (storage: store/remove of a volume; "
                      "kv: the engines' KV events)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"kind", "storage"}, 1, st->storage_events);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"kind", "kv"}, 1, st->kv_events);
  kvbm_metrics_family(w, "kvbm_advisor_refused_total", KVBM_METRIC_COUNTER,
                      "What the advisor refused for its bounds: events of volumes over "
                      "max_volumes (volume), batches of sources over the bound (source)");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "volume"}, 1, st->refused_volume);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "source"}, 1, st->refused_source);
  kvbm_metrics_family(w, "kvbm_advisor_forgotten_total", KVBM_METRIC_COUNTER,
                      "Index entries dropped under the memory bound (max_blocks): blocks, "
                      "blocks a volume still held, prefixes");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"what", "blocks"}, 1, st->forgotten_blocks);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"what", "held"}, 1, st->forgotten_held);
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"what", "prefixes"}, 1, st->forgotten_prefixes);
  kvbm_metrics_family(w, "kvbm_advisor_hints_total", KVBM_METRIC_COUNTER,
                      "Hints derived, by kind");
  for (int k = KVBM_HINT_PROMOTE; k <= KVBM_HINT_COMPACT; k++) {
    char kind[16];
    const char *kn = kvbm_hint_kind_name(k);
    size_t i = 0;
    for (; kn[i] && i + 1 < sizeof kind; i++) kind[i] = (char)(kn[i] | 0x20); /* lower case */
    kind[i] = 0;
    kvbm_metrics_value_u64(w, &(kvbm_metric_label){"kind", kind}, 1, st->hints[k]);
  }
  const struct {
    const char *name, *help;
    uint64_t v;
  } c[] = {
      {"kvbm_advisor_kv_other_media_total", "KV events of media other than GPU (not uses)",
       st->kv_other_media},
      {"kvbm_advisor_uses_total", "Uses seen: stores on GPU", st->uses},
      {"kvbm_advisor_onboard_uses_total", "Uses of blocks a volume held (onboards)",
       st->onboard_uses},
      {"kvbm_advisor_lost_events_total", "Events lost: jumps in a source's event ids",
       st->lost_events},
      {"kvbm_advisor_source_restarts_total", "Times a source's event ids went back",
       st->source_restarts},
      {"kvbm_advisor_unknown_removes_total", "Removes of blocks the index did not know",
       st->unknown_removes},
      {"kvbm_advisor_derivations_total", "Hint derivations (every hint_period_ms)", s->derivations},
      {"kvbm_advisor_hint_batches_published_total", "Derivations published on the hints subject",
       s->hints_sent},
      {"kvbm_advisor_hint_publish_errors_total", "Derivations the hints subject refused",
       s->hint_errors},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    kvbm_metrics_counter(w, c[i].name, c[i].help, NULL, 0, c[i].v);
  kvbm_metrics_gauge(w, "kvbm_advisor_index_entries", "Blocks the index holds (at most "
                     "kvbm_advisor_index_max_entries)", NULL, 0, (double)st->entries);
  kvbm_metrics_gauge(w, "kvbm_advisor_index_max_entries", "The index's bound (max_blocks)", NULL,
                     0, (double)d->cfg->advisor.max_blocks);
  kvbm_metrics_gauge(w, "kvbm_advisor_index_prefixes", "Prefixes the index tracks", NULL, 0,
                     (double)st->prefixes);
  kvbm_metrics_gauge(w, "kvbm_advisor_memory_bytes", "Bytes of the index's tables", NULL, 0,
                     (double)st->memory_bytes);
  kvbm_metrics_gauge(w, "kvbm_advisor_uptime_seconds", "Seconds since the advisor started", NULL,
                     0, (double)(now_ms() - d->started_ms) / 1000);

  /* per volume */
  const struct {
    const char *name, *help;
    kvbm_metric_type type;
    size_t off;
    bool dbl;
  } v[] = {
      {"kvbm_advisor_volume_blocks", "Blocks a volume holds (its stores less its removes)",
       KVBM_METRIC_GAUGE, offsetof(kvbm_advisor_volume_info, live_blocks), false},
      {"kvbm_advisor_volume_bytes", "Bytes of the blocks a volume holds", KVBM_METRIC_GAUGE,
       offsetof(kvbm_advisor_volume_info, live_bytes), false},
      {"kvbm_advisor_volume_indexed_blocks", "Blocks of a volume the index knows (at most "
       "kvbm_advisor_volume_blocks)", KVBM_METRIC_GAUGE, offsetof(kvbm_advisor_volume_info, indexed),
       false},
      {"kvbm_advisor_volume_high_water_blocks", "The most blocks a volume has held",
       KVBM_METRIC_GAUGE, offsetof(kvbm_advisor_volume_info, high_water), false},
      {"kvbm_advisor_volume_stores_total", "Store events of a volume", KVBM_METRIC_COUNTER,
       offsetof(kvbm_advisor_volume_info, stores), false},
      {"kvbm_advisor_volume_removes_total", "Remove events of a volume", KVBM_METRIC_COUNTER,
       offsetof(kvbm_advisor_volume_info, removes), false},
      {"kvbm_advisor_volume_eviction_age_seconds", "Idle time of the blocks a volume removes "
       "(0: none yet)", KVBM_METRIC_GAUGE, offsetof(kvbm_advisor_volume_info, eviction_age_ms), true},
  };
  for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
    kvbm_metrics_family(w, v[k].name, v[k].type, v[k].help);
    for (size_t i = 0; i < s->nvol; i++) {
      const kvbm_advisor_volume_info *vi = &s->vol[i];
      kvbm_metric_label l[2] = {{"volume", vi->name ? vi->name : ""},
                                {"tier", vi->tier >= 0 ? kvbm_tier_name(vi->tier) : "none"}};
      const char *p = (const char *)vi + v[k].off;
      if (v[k].dbl) {
        double x;
        memcpy(&x, p, sizeof x);
        kvbm_metrics_value(w, l, 2, x / 1000);
      } else {
        uint64_t x;
        memcpy(&x, p, sizeof x);
        kvbm_metrics_value_u64(w, l, 2, x);
      }
    }
  }

  /* per source */
  size_t stride = sizeof(counts) / sizeof(uint64_t);
  const struct {
    const char *name, *help;
    size_t off;
  } sc[] = {
      {"kvbm_advisor_source_batches_total", "Batches a source delivered and the advisor applied",
       offsetof(counts, batches)},
      {"kvbm_advisor_source_events_total", "Events in those batches", offsetof(counts, events)},
      {"kvbm_advisor_source_errors_total", "A source's messages refused (malformed, over "
       "max_payload, transport errors)", offsetof(counts, errors)},
      {"kvbm_advisor_source_lost_total", "Batches a source lost (gaps not replayed)",
       offsetof(counts, lost)},
      {"kvbm_advisor_source_duplicates_total", "Batches a source delivered twice (dropped)",
       offsetof(counts, duplicates)},
      {"kvbm_advisor_source_resets_total", "Times a source's sequence restarted",
       offsetof(counts, resets)},
      {"kvbm_advisor_source_jumps_total", "Sequence numbers not believed (stray jumps)",
       offsetof(counts, jumps)},
      {"kvbm_advisor_source_overflow_total", "Messages dropped for the source's byte budget "
       "(queue_bytes)", offsetof(counts, overflow)},
  };
  for (size_t k = 0; k < sizeof sc / sizeof *sc; k++)
    metric_per_source(w, d, sc[k].name, sc[k].help,
                      (const uint64_t *)((const char *)s->n + sc[k].off), stride);
  metric_per_source(w, d, "kvbm_advisor_source_replayed_total",
                    "Batches of a gap a source had replayed by its replay endpoint", s->replayed, 1);
  metric_per_source(w, d, "kvbm_advisor_source_reconnects_total",
                    "Times a source reconnected (ZMQ: redialled the engine; NATS: libnats "
                    "reconnected to the server)", s->reconnects, 1);
  free(s);
}

static int http_start(adaemon *d, kvbm_error *err) {
  const kvbm__advisor_daemon_config *cfg = d->cfg;
  char host[INET_ADDRSTRLEN];
  const char *colon = cfg->listen ? strrchr(cfg->listen, ':') : NULL;
  if (!colon || (size_t)(colon - cfg->listen) >= sizeof host)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor http: --listen '%s' is not HOST:PORT",
                          cfg->listen ? cfg->listen : "");
  memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
  host[colon - cfg->listen] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || port < 0 || port > 65535)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor http: port '%s' is not in 0..65535", colon + 1);
  kvbm_metrics_server_config mc = kvbm_metrics_server_config_default();
  mc.host = host; /* copied by the server */
  mc.port = (uint16_t)port;
  mc.max_connections = cfg->max_connections;
  mc.io_timeout_s = (double)cfg->io_timeout_ms / 1000;
  kvbm__metrics_routes routes = {.fn = handle, .user = d, .content_type = "application/json",
                                 .json_errors = true};
  int rc = kvbm_metrics_create(&d->reg, err);
  if (!rc) rc = kvbm_metrics_register(d->reg, collect, d, NULL, 0, NULL, err);
  if (!rc) rc = kvbm__metrics_server_start_routes(d->reg, &mc, &routes, &d->http, err);
  return rc;
}

/* ---- run ---- */

static int write_port_file(const char *path, int port, kvbm_error *err) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: --port-file path too long");
  FILE *f = fopen(tmp, "w");
  if (!f) return kvbm_error_set(err, KVBM_EIO, "advisor: cannot write %s: %s", tmp, strerror(errno));
  fprintf(f, "%d\n", port);
  if (fclose(f) || rename(tmp, path))
    return kvbm_error_set(err, KVBM_EIO, "advisor: cannot write %s: %s", path, strerror(errno));
  return KVBM_OK;
}

static void teardown(adaemon *d) {
  kvbm_metrics_server_stop(d->http); /* first: its routes and collector read the advisor */
  kvbm_metrics_destroy(d->reg);
  for (size_t i = 0; i < d->ns; i++) source_close(&d->src[i]);
  if (d->hnc) {
    natsConnection_FlushTimeout(d->hnc, 1000);
    natsConnection_Destroy(d->hnc);
  }
  kvbm_advisor_destroy(d->a);
  free(d->hints);
  free(d->wire);
  free(d->hints_json);
  free(d->payload);
}

int kvbm__advisor_daemon_run(const kvbm__advisor_daemon_config *cfg, volatile sig_atomic_t *stop,
                             kvbm_error *err) {
  if (!cfg || !stop) return kvbm_error_set(err, KVBM_EINVAL, "advisor: NULL argument");
  if (cfg->nsources > KVBM__ADVISOR_MAX_SOURCES || !cfg->hint_period_ms || !cfg->max_hints ||
      cfg->max_hints > (1u << 20))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: bad settings (sources, hint period, max hints)");
  adaemon *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "advisor: out of memory");
  d->cfg = cfg;
  d->stop = stop;
  pthread_mutex_init(&d->mu, NULL);
  d->started_ms = now_ms();
  int rc = kvbm_advisor_create(&cfg->advisor, &d->a, err);
  for (size_t i = 0; !rc && i < cfg->nvolumes; i++)
    rc = kvbm_advisor_volume_tier(d->a, cfg->volume_names[i], cfg->volume_tiers[i], err);
  if (!rc) {
    d->hints = malloc(cfg->max_hints * sizeof *d->hints);
    d->wire = malloc(cfg->max_hints * sizeof *d->wire);
    if (!d->hints || !d->wire) rc = kvbm_error_set(err, KVBM_ENOMEM, "advisor: out of memory");
  }
  for (size_t i = 0; !rc && i < cfg->nsources; i++) {
    d->src[i].cfg = cfg->sources[i];
    d->ns = i + 1;
    rc = source_open(d, &d->src[i], err);
  }
  if (!rc && cfg->hints_url) {
    if (!cfg->hints_subject || !*cfg->hints_subject)
      rc = kvbm_error_set(err, KVBM_EINVAL, "advisor: hints need a NATS subject");
    else
      rc = hints_connect(cfg->hints_url, &d->hnc, err);
  }
  if (!rc) rc = http_start(d, err);
  if (!rc && cfg->port_file) rc = write_port_file(cfg->port_file, kvbm_metrics_server_port(d->http), err);
  pthread_t th;
  bool started = false;
  if (!rc) {
    if (pthread_create(&th, NULL, sources_main, d))
      rc = kvbm_error_set(err, KVBM_ENOMEM, "advisor: cannot start the sources' thread");
    else
      started = true;
  }
  uint64_t next_hints = now_ms() + cfg->hint_period_ms;
  while (!rc && !*stop) {
    uint64_t now = now_ms();
    if (now >= next_hints) {
      pthread_mutex_lock(&d->mu);
      derive(d);
      pthread_mutex_unlock(&d->mu);
      next_hints = now + cfg->hint_period_ms;
    }
    usleep(10000); /* the timer's resolution; HTTP and the sources have threads of their own */
  }
  if (started) {
    *stop = 1; /* (an error above: the thread stops too) */
    pthread_join(th, NULL);
  }
  teardown(d);
  pthread_mutex_destroy(&d->mu);
  free(d);
  return rc;
}

