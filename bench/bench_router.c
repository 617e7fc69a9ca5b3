/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_router.c: the router's index on workload W3 (8 workers, capacity
 * 16384, block size 16, load model 10 s, the bundled trace by default).
 *
 * First the W3 kv-aware run is made (kvbm_w3_run) with taps that record,
 * in order, every event batch the index applied and every lookup it made.
 * Then that log is replayed, on one thread, into:
 *   - a fresh kvbm index: operations a second (events applied plus
 *     lookups) and the latency of each lookup (p50, p99, max);
 *   - the peer, measured in the same run: a plain single-threaded index of
 *     one open-addressing hash set per worker (no atomics, no seqlocks),
 *     whose lookup walks each worker's set, as a router without a shared
 *     index would. The ratio kvbm / peer shows what the shared table and
 *     the concurrency protocol cost or save.
 * The replay is repeated --repeat times, interleaved; the best of each is
 * kept (the machines are shared and noisy).
 *
 * Finally, with --threads R (default 1), R reader threads run lookups in
 * a loop while the main thread applies the events: lookups a second per
 * reader next to the writer's events a second, to show reads take no lock.
 *
 * Targets (issue 6, after Dynamo's published figures): >= 10 M ops/s per
 * core, lookup p99 < 10 us.
 *
 * usage: bench_router [TRACE] [--limit N] [--repeat 3] [--threads 1]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvbm/router.h"
#include "workload/w3.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ the log */

enum { OP_STORE, OP_REMOVE, OP_CLEAR, OP_LOOKUP, OP_BATCH };

typedef struct op {
  uint8_t kind, worker;
  uint32_t n;   /* hashes */
  size_t off;   /* into hashes */
} op;

typedef struct oplog {
  op *ops;
  size_t nops, cops;
  uint64_t *h;
  size_t nh, ch;
  uint64_t events, blocks, lookups, lookup_blocks;
} oplog;

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(p, c * elem);
  if (!q) {
    fprintf(stderr, "bench_router: out of memory\n");
    exit(1);
  }
  *cap = c;
  return q;
}

static void log_op(oplog *l, int kind, uint32_t w, const uint64_t *h, size_t n) {
  l->ops = grow(l->ops, &l->cops, l->nops + 1, sizeof *l->ops);
  l->h = grow(l->h, &l->ch, l->nh + n, sizeof *l->h);
  if (n) memcpy(l->h + l->nh, h, n * sizeof *h);
  l->ops[l->nops++] = (op){.kind = (uint8_t)kind, .worker = (uint8_t)w, .n = (uint32_t)n,
                           .off = l->nh};
  l->nh += n;
}

static void tap_batch(void *user, uint32_t worker, const kvbm_event_batch *b) {
  oplog *l = user;
  log_op(l, OP_BATCH, worker, NULL, 0);
  l->ops[l->nops - 1].n = (uint32_t)b->num_events; /* the next n ops are its events */
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_event *e = &b->events[i];
    int kind = e->type == KVBM_EVENT_STORED ? OP_STORE
               : e->type == KVBM_EVENT_REMOVED ? OP_REMOVE : OP_CLEAR;
    log_op(l, kind, worker, e->block_hashes, e->num_block_hashes);
    l->events++;
    l->blocks += e->num_block_hashes;
  }
}

static void tap_lookup(void *user, const uint64_t *keys, size_t n) {
  oplog *l = user;
  log_op(l, OP_LOOKUP, 0, keys, n);
  l->lookups++;
  l->lookup_blocks += n;
}

/* ------------------------------------------------------------ kvbm */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct result {
  double seconds;
  double p50, p99, max; /* lookup latency, seconds */
  uint64_t sink;
} result;

static void latency(double *lat, size_t n, result *r) {
  qsort(lat, n, sizeof *lat, cmp_double);
  r->p50 = n ? lat[n / 2] : 0;
  r->p99 = n ? lat[(size_t)((double)n * 0.99)] : 0;
  r->max = n ? lat[n - 1] : 0;
}

static kvbm_index *new_index(void) {
  kvbm_index_config c = kvbm_index_config_default();
  c.expected_blocks = 16384;
  kvbm_index *idx;
  if (kvbm_index_create(&c, &idx, NULL)) exit(1);
  for (uint32_t w = 0; w < 8; w++) {
    kvbm_worker_key k = {w, 0};
    kvbm_index_add_worker(idx, k, NULL, NULL);
  }
  return idx;
}

/* The batches as the decoder hands them to the index, built once before
 * any timing (kvbm_event arrays pointing into the log's hashes). */
static kvbm_event *g_ev;
static kvbm_event_batch *g_batches;
static size_t g_nbatches;

static void build_batches(const oplog *l) {
  size_t nb = 0, ne = 0;
  for (size_t i = 0; i < l->nops; i++) {
    if (l->ops[i].kind == OP_BATCH) nb++;
    else if (l->ops[i].kind != OP_LOOKUP) ne++;
  }
  g_ev = malloc((ne + 1) * sizeof *g_ev);
  g_batches = malloc((nb + 1) * sizeof *g_batches);
  if (!g_ev || !g_batches) exit(1);
  size_t e = 0;
  for (size_t i = 0; i < l->nops; i++) {
    const op *b = &l->ops[i];
    if (b->kind != OP_BATCH) continue;
    g_batches[g_nbatches++] = (kvbm_event_batch){.seq = KVBM_INDEX_NO_ID, .events = g_ev + e,
                                                 .num_events = b->n};
    for (uint32_t k = 0; k < b->n; k++) {
      const op *o = &l->ops[i + 1 + k];
      g_ev[e++] = (kvbm_event){.type = o->kind == OP_STORE    ? KVBM_EVENT_STORED
                                       : o->kind == OP_REMOVE ? KVBM_EVENT_REMOVED
                                                              : KVBM_EVENT_CLEARED,
                               .block_hashes = l->h + o->off, .num_block_hashes = o->n,
                               .medium = KVBM_MEDIUM_GPU};
    }
  }
}

/* Applies the batch at ops[i] (the bi-th), as the daemon would: one
 * apply_batch; returns the index of the op after it. */
static size_t kv_apply(kvbm_index *idx, const oplog *l, size_t i, size_t *bi) {
  kvbm_index_apply_batch(idx, l->ops[i].worker, &g_batches[(*bi)++], NULL);
  return i + 1 + l->ops[i].n;
}

static void run_kvbm(const oplog *l, double *lat, result *r) {
  kvbm_index *idx = new_index();
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  size_t nl = 0, bi = 0;
  double t0 = now();
  for (size_t i = 0; i < l->nops;) {
    const op *o = &l->ops[i];
    if (o->kind == OP_BATCH) {
      i = kv_apply(idx, l, i, &bi);
      continue;
    }
    i++;
    if (o->kind == OP_LOOKUP) {
      double a = now();
      kvbm_index_lookup(idx, l->h + o->off, o->n, ov, NULL);
      lat[nl++] = now() - a;
      uint32_t best = 0;
      for (int w = 0; w < 8; w++)
        if (ov[w].prefix[0] > best) best = ov[w].prefix[0];
      r->sink += best;
    }
  }
  r->seconds = now() - t0;
  latency(lat, nl, r);
  kvbm_index_destroy(idx);
}

/* ------------------------------------------------------------ the peer */

typedef struct hset {
  uint64_t *k;
  uint32_t *c;
  size_t cap, n;
} hset;

static size_t hs_home(const hset *s, uint64_t h) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 17) & (s->cap - 1);
}

static bool hs_has(const hset *s, uint64_t h) {
  for (size_t i = hs_home(s, h);; i = (i + 1) & (s->cap - 1)) {
    if (!s->c[i]) return false;
    if (s->k[i] == h) return true;
  }
}

static void hs_add(hset *s, uint64_t h) {
  size_t i = hs_home(s, h);
  for (; s->c[i]; i = (i + 1) & (s->cap - 1))
    if (s->k[i] == h) {
      s->c[i]++;
      return;
    }
  s->k[i] = h;
  s->c[i] = 1;
  s->n++; /* sized for the W3 capacity at load <= 1/4: no growth needed */
}

static void hs_del(hset *s, uint64_t h) {
  size_t mask = s->cap - 1, i = hs_home(s, h);
  for (;; i = (i + 1) & mask) {
    if (!s->c[i]) return;
    if (s->k[i] == h) break;
  }
  if (--s->c[i]) return;
  for (size_t j = i;;) {
    j = (j + 1) & mask;
    if (!s->c[j]) break;
    size_t k = hs_home(s, s->k[j]);
    if (((j - k) & mask) >= ((j - i) & mask)) {
      s->k[i] = s->k[j];
      s->c[i] = s->c[j];
      i = j;
    }
  }
  s->c[i] = 0;
  s->n--;
}

static void run_peer(const oplog *l, double *lat, result *r) {
  hset s[8];
  for (int w = 0; w < 8; w++) {
    s[w].cap = 65536;
    s[w].n = 0;
    s[w].k = calloc(s[w].cap, sizeof *s[w].k);
    s[w].c = calloc(s[w].cap, sizeof *s[w].c);
  }
  size_t nl = 0;
  double t0 = now();
  for (size_t i = 0; i < l->nops; i++) {
    const op *o = &l->ops[i];
    const uint64_t *h = l->h + o->off;
    if (o->kind == OP_LOOKUP) {
      double a = now();
      uint32_t best = 0;
      for (int w = 0; w < 8; w++) {
        uint32_t k = 0;
        while (k < o->n && hs_has(&s[w], h[k])) k++;
        if (k > best) best = k;
      }
      lat[nl++] = now() - a;
      r->sink += best;
    } else if (o->kind == OP_STORE) {
      for (uint32_t k = 0; k < o->n; k++) hs_add(&s[o->worker], h[k]);
    } else if (o->kind == OP_REMOVE) {
      for (uint32_t k = 0; k < o->n; k++) hs_del(&s[o->worker], h[k]);
    } else if (o->kind == OP_CLEAR) {
      memset(s[o->worker].c, 0, s[o->worker].cap * sizeof *s[o->worker].c);
      s[o->worker].n = 0;
    }
  }
  r->seconds = now() - t0;
  latency(lat, nl, r);
  for (int w = 0; w < 8; w++) {
    free(s[w].k);
    free(s[w].c);
  }
}

/* ------------------------------------------------------------ threads */

typedef struct rd {
  const oplog *l;
  kvbm_index *idx;
  const size_t *lookups; /* op indices of the lookups */
  size_t nlookups;
  _Atomic int *stop;
  uint64_t done, sink;
  pthread_t th;
} rd;

static void *reader(void *arg) {
  rd *r = arg;
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  for (size_t i = 0; !atomic_load_explicit(r->stop, memory_order_relaxed); i++) {
    const op *o = &r->l->ops[r->lookups[i % r->nlookups]];
    kvbm_index_lookup(r->idx, r->l->h + o->off, o->n, ov, NULL);
    r->sink += ov[0].prefix[0];
    r->done++;
  }
  return NULL;
}

static void run_threads(const oplog *l, int nr) {
  size_t *lk = malloc(l->lookups * sizeof *lk), n = 0;
  for (size_t i = 0; i < l->nops; i++)
    if (l->ops[i].kind == OP_LOOKUP) lk[n++] = i;
  kvbm_index *idx = new_index();
  _Atomic int stop = 0;
  rd *r = calloc((size_t)nr, sizeof *r);
  for (int i = 0; i < nr; i++) {
    r[i] = (rd){.l = l, .idx = idx, .lookups = lk, .nlookups = n, .stop = &stop};
    pthread_create(&r[i].th, NULL, reader, &r[i]);
  }
  double t0 = now();
  size_t bi = 0;
  for (size_t i = 0; i < l->nops;)
    if (l->ops[i].kind == OP_BATCH) i = kv_apply(idx, l, i, &bi);
    else i++;
  double s = now() - t0;
  atomic_store(&stop, 1);
  uint64_t total = 0;
  for (int i = 0; i < nr; i++) {
    pthread_join(r[i].th, NULL);
    total += r[i].done;
  }
  printf("  concurrent: 1 writer applied %llu events in %.3f s (%.2f M events/s) while %d "
         "reader(s) made %.2f M lookups/s each (%.1f M blocks/s walked per reader)\n",
         (unsigned long long)l->events, s, (double)l->events / s / 1e6, nr,
         (double)total / nr / s / 1e6,
         (double)total / nr / s / 1e6 * ((double)l->lookup_blocks / (double)l->lookups));
  free(r);
  free(lk);
  kvbm_index_destroy(idx);
}

int main(int argc, char **argv) {
  const char *path = KVBM_DEFAULT_TRACE;
  int repeat = 3, threads = 1;
  size_t limit = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = (size_t)atoll(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (argv[i][0] != '-') path = argv[i];
    else {
      fprintf(stderr, "usage: bench_router [TRACE] [--limit N] [--repeat 3] [--threads 1]\n");
      return 2;
    }
  }
  if (repeat < 1) repeat = 1;
  kvbm_error err = {0};
  kvbm_trace *t;
  if (kvbm_trace_load(path, limit, &t, &err)) {
    fprintf(stderr, "bench_router: %s\n", err.msg);
    return 1;
  }
  static oplog l;
  kvbm_w3_config o = kvbm_w3_config_default();
  o.tap_batch = tap_batch;
  o.tap_lookup = tap_lookup;
  o.tap_user = &l;
  kvbm_w3_result w3;
  double t0 = now();
  if (kvbm_w3_run(t, &o, &w3, &err)) {
    fprintf(stderr, "bench_router: %s\n", err.msg);
    return 1;
  }
  double sim_s = now() - t0;
  kvbm_trace_destroy(t);
  printf("W3 router index, %s: %u workers x %u blocks, block size %u, active %g ms\n", path,
         o.workers, o.capacity, o.block_size, o.active_ms);
  printf("  log: %llu events (%llu blocks), %llu lookups (%.0f blocks each on average); "
         "simulation %.1f s, index mismatches %llu\n",
         (unsigned long long)l.events, (unsigned long long)l.blocks,
         (unsigned long long)l.lookups, (double)l.lookup_blocks / (double)l.lookups, sim_s,
         (unsigned long long)w3.index_mismatches);
  build_batches(&l);
  double *lat = malloc((l.lookups + 1) * sizeof *lat);
  result best_k = {.seconds = 1e30}, best_p = {.seconds = 1e30};
  for (int i = 0; i < repeat; i++) {
    result k = {0}, p = {0};
    run_kvbm(&l, lat, &k);
    run_peer(&l, lat, &p);
    if (k.seconds < best_k.seconds) best_k = k;
    if (p.seconds < best_p.seconds) best_p = p;
  }
  double ops = (double)(l.events + l.lookups);
  printf("  kvbm index:   %.3f s, %.2f M ops/s (events + lookups), %.2f M blocks/s; "
         "lookup p50 %.2f us, p99 %.2f us, max %.2f us\n",
         best_k.seconds, ops / best_k.seconds / 1e6,
         (double)(l.blocks + l.lookup_blocks) / best_k.seconds / 1e6, best_k.p50 * 1e6,
         best_k.p99 * 1e6, best_k.max * 1e6);
  printf("  peer (a hash set per worker, single-threaded): %.3f s, %.2f M ops/s; lookup p50 "
         "%.2f us, p99 %.2f us\n",
         best_p.seconds, ops / best_p.seconds / 1e6, best_p.p50 * 1e6, best_p.p99 * 1e6);
  printf("  ratio kvbm / peer: time %.2f, lookup p99 %.2f\n", best_k.seconds / best_p.seconds,
         best_k.p99 / best_p.p99);
  printf("  targets: >= 10 M ops/s per core: %s; p99 < 10 us: %s\n",
         ops / best_k.seconds >= 10e6 ? "met" : "NOT met",
         best_k.p99 < 10e-6 ? "met" : "NOT met");
  if (best_k.sink != best_p.sink)
    printf("  note: lookup checksums differ (kvbm %llu, peer %llu)\n",
           (unsigned long long)best_k.sink, (unsigned long long)best_p.sink);
  if (threads > 0) run_threads(&l, threads);
  free(lat);
  free(l.ops);
  free(l.h);
  free(g_ev);
  free(g_batches);
  return 0;
}
