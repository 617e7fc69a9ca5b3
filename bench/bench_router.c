/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_router.c: the router's index on workload W3 (../shared/WORKLOADS.md:
 * 8 workers, capacity 16384, block size 16, load model 10 s, the bundled
 * trace by default; --workers N runs it with N workers).
 *
 * First the W3 kv-aware run is made (kvsim_w3_run) with taps that record,
 * in order, every event batch the index applied (as decoded) and every
 * lookup it made. Then that log is replayed, on one thread, into:
 *   - a fresh kvbm index: operations a second (events applied plus
 *     lookups) and the latency of each lookup (p50, p99, max);
 *   - the peer, measured in the same run: a plain single-threaded index of
 *     one open-addressing hash set per worker (no atomics, no seqlocks, a
 *     count per key for duplicated blocks), whose lookup walks each
 *     worker's set to its first miss, as a router without a shared index
 *     would. It does the same work: it reads the same decoded batches
 *     (kvbm_event arrays, as the decoder hands them over), applies the
 *     same stores, removes and clears, makes the same lookups, and its
 *     answer (the best prefix over the workers, summed over the lookups)
 *     is checked against kvbm's.
 * Each batch is staged before it is applied, untimed: written into one
 * reused event array and hash buffer, where a subscriber's decoder leaves
 * a message. The time of a side is the sum of its applies and lookups.
 * Each round replays both, kvbm then peer; --repeat rounds (5). Printed:
 * the median [min..max] over the rounds of each figure and of the ratio
 * kvbm / peer of the round (the machines are shared and noisy).
 *
 * Then, for each R of --readers (1,2,4), R reader threads run the log's
 * lookups in a loop while the main thread applies all the events: the
 * writer's events a second and the readers' lookups a second, in total
 * and per reader (readers take no lock and write no shared memory, so
 * they scale with the cores there are to run them). --readers 0 skips it.
 *
 * --only kvbm|peer replays only that side (for profilers: perf stat,
 * callgrind --toggle-collect=replay_kvbm); --json prints the figures as
 * one JSON object (for bench/compare.sh).
 *
 * Targets (issue 22): kvbm's ops/s at least the peer's, lookup p99 at or
 * below the peer's, at the W3 defaults and with 64 workers.
 *
 * usage: bench_router [TRACE] [--limit N] [--repeat 5] [--workers 8]
 *                     [--readers 1,2,4] [--only kvbm|peer] [--json]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvbm/router.h"
#include "workload/w3.h"

#define now kvbm_bench_now

/* ------------------------------------------------------------ the log */

enum { OP_STORE, OP_REMOVE, OP_CLEAR, OP_LOOKUP, OP_BATCH };

typedef struct op {
  uint8_t kind, worker, has_parent;
  uint32_t n;      /* hashes */
  size_t off;      /* into hashes */
  uint64_t parent; /* OP_STORE: the first block's parent, when has_parent */
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
  if (!q) kvbm_bench_die("bench_router", "out of memory");
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
    l->ops[l->nops - 1].parent = e->parent_hash;
    l->ops[l->nops - 1].has_parent = e->has_parent;
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

typedef struct result {
  double seconds;
  double p50, p99, max; /* lookup latency, seconds */
  uint64_t sink;        /* the best prefix over the workers, summed over the lookups */
} result;

static void latency(double *lat, size_t n, result *r) {
  qsort(lat, n, sizeof *lat, kvbm_bench__cmp_double);
  r->p50 = n ? lat[n / 2] : 0;
  r->p99 = n ? lat[(size_t)((double)n * 0.99)] : 0;
  r->max = n ? lat[n - 1] : 0;
}

static uint32_t g_workers = 8, g_capacity = 16384;

static kvbm_index *new_index(void) {
  kvbm_index_config c = kvbm_index_config_default();
  c.expected_blocks = g_capacity;
  kvbm_index *idx;
  if (kvbm_index_create(&c, &idx, NULL)) kvbm_bench_die("bench_router", "index create");
  for (uint32_t w = 0; w < g_workers; w++) {
    kvbm_worker_key k = {w, 0};
    if (kvbm_index_add_worker(idx, k, NULL, NULL)) kvbm_bench_die("bench_router", "add worker");
  }
  return idx;
}

/* The batches as the decoder hands them to the index. A subscriber
 * decodes one message at a time into buffers it reuses: the batch's
 * kvbm_event array and its hashes are in cache when the index reads them.
 * So each batch is staged (stage_batch: its events written into one
 * reused array, its hashes copied into one reused buffer) just before it
 * is applied, outside the timed part, on both sides alike. (Until session
 * 18 every batch of the log was built up front into one array of 17 M
 * events, 3.7 GB at 216 bytes an event: both sides then streamed it from
 * memory, and the figure was this machine's memory bandwidth more than
 * either index: the two sides came out equal within noise however many
 * instructions each spent.) */
static size_t g_nbatches;
static kvbm_event *g_ev;     /* the staged batch's events */
static uint64_t *g_h;        /* the staged batch's hashes */
static kvbm_event_batch g_b; /* the staged batch */

/* Sizes the staging buffers for the log's largest batch. */
static void build_batches(const oplog *l) {
  size_t maxe = 0, maxh = 0;
  for (size_t i = 0; i < l->nops; i++) {
    if (l->ops[i].kind != OP_BATCH) continue;
    g_nbatches++;
    size_t nh = 0;
    for (uint32_t k = 0; k < l->ops[i].n; k++) nh += l->ops[i + 1 + k].n;
    if (l->ops[i].n > maxe) maxe = l->ops[i].n;
    if (nh > maxh) maxh = nh;
  }
  g_ev = malloc((maxe + 1) * sizeof *g_ev);
  g_h = malloc((maxh + 1) * sizeof *g_h);
  if (!g_ev || !g_h) kvbm_bench_die("bench_router", "out of memory");
}

/* Decodes the batch at ops[i] into g_ev and g_h, as a subscriber's
 * decoder would into its buffers; returns the batch. */
static const kvbm_event_batch *stage_batch(const oplog *l, size_t i) {
  const op *b = &l->ops[i];
  uint64_t *h = g_h;
  for (uint32_t k = 0; k < b->n; k++) {
    const op *o = b + 1 + k;
    memcpy(h, l->h + o->off, o->n * sizeof *h);
    g_ev[k] = (kvbm_event){.type = o->kind == OP_STORE    ? KVBM_EVENT_STORED
                                   : o->kind == OP_REMOVE ? KVBM_EVENT_REMOVED
                                                          : KVBM_EVENT_CLEARED,
                           .block_hashes = h, .num_block_hashes = o->n,
                           .parent_hash = o->parent, .has_parent = o->has_parent,
                           .medium = KVBM_MEDIUM_GPU};
    h += o->n;
  }
  g_b = (kvbm_event_batch){.seq = KVBM_INDEX_NO_ID, .events = g_ev, .num_events = b->n};
  return &g_b;
}

/* Applies the batch at ops[i], as the daemon would: staged, then one
 * apply_batch, which alone is timed (added to *busy); returns the index
 * of the op after it. */
static size_t kv_apply(kvbm_index *idx, const oplog *l, size_t i, double *busy) {
  const kvbm_event_batch *b = stage_batch(l, i);
  double a = now();
  kvbm_index_apply_batch(idx, l->ops[i].worker, b, NULL);
  *busy += now() - a;
  return i + 1 + l->ops[i].n;
}

__attribute__((noinline)) static void replay_kvbm(kvbm_index *idx, const oplog *l, double *lat,
                                                  result *r) {
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  size_t nl = 0;
  for (size_t i = 0; i < l->nops;) {
    const op *o = &l->ops[i];
    if (o->kind == OP_BATCH) {
      i = kv_apply(idx, l, i, &r->seconds);
      continue;
    }
    i++;
    if (o->kind == OP_LOOKUP) {
      double a = now();
      kvbm_index_lookup(idx, l->h + o->off, o->n, ov, NULL);
      uint32_t best = 0;
      for (uint32_t w = 0; w < g_workers; w++)
        if (ov[w].prefix[0] > best) best = ov[w].prefix[0];
      lat[nl] = now() - a;
      r->seconds += lat[nl++];
      r->sink += best;
    }
  }
}

static void run_kvbm(const oplog *l, double *lat, result *r) {
  kvbm_index *idx = new_index();
  replay_kvbm(idx, l, lat, r); /* r->seconds: applies and lookups */
  latency(lat, l->lookups, r);
  kvbm_index_destroy(idx);
}

/* ------------------------------------------------------------ the peer */

typedef struct hset {
  uint64_t *k;
  uint32_t *c; /* copies of k[i]; 0: empty */
  size_t cap;
  unsigned shift;
} hset;

static size_t hs_home(const hset *s, uint64_t h) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> s->shift);
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
  s->c[i] = 1; /* sized for the W3 capacity at load <= 1/4: no growth needed */
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
}

/* One decoded batch of worker w, event by event, as kvbm applies it. */
static void peer_batch(hset *s, const kvbm_event_batch *b) {
  for (size_t e = 0; e < b->num_events; e++) {
    const kvbm_event *ev = &b->events[e];
    const uint64_t *h = ev->block_hashes;
    if (ev->type == KVBM_EVENT_STORED) {
      for (size_t k = 0; k < ev->num_block_hashes; k++) hs_add(s, h[k]);
    } else if (ev->type == KVBM_EVENT_REMOVED) {
      for (size_t k = 0; k < ev->num_block_hashes; k++) hs_del(s, h[k]);
    } else {
      memset(s->c, 0, s->cap * sizeof *s->c);
    }
  }
}

__attribute__((noinline)) static void replay_peer(hset *s, const oplog *l, double *lat,
                                                  result *r) {
  size_t nl = 0;
  for (size_t i = 0; i < l->nops;) {
    const op *o = &l->ops[i];
    if (o->kind == OP_BATCH) {
      const kvbm_event_batch *b = stage_batch(l, i);
      double a = now();
      peer_batch(&s[o->worker], b);
      r->seconds += now() - a;
      i += 1 + o->n;
      continue;
    }
    i++;
    if (o->kind == OP_LOOKUP) {
      const uint64_t *h = l->h + o->off;
      double a = now();
      uint32_t best = 0;
      for (uint32_t w = 0; w < g_workers; w++) {
        uint32_t k = 0;
        while (k < o->n && hs_has(&s[w], h[k])) k++;
        if (k > best) best = k;
      }
      lat[nl] = now() - a;
      r->seconds += lat[nl++];
      r->sink += best;
    }
  }
}

static void run_peer(const oplog *l, double *lat, result *r) {
  hset *s = calloc(g_workers, sizeof *s);
  if (!s) kvbm_bench_die("bench_router", "out of memory");
  for (uint32_t w = 0; w < g_workers; w++) {
    unsigned bits = 6;
    while (((size_t)1 << bits) < (size_t)g_capacity * 4) bits++;
    s[w].cap = (size_t)1 << bits;
    s[w].shift = 64 - bits;
    s[w].k = calloc(s[w].cap, sizeof *s[w].k);
    s[w].c = calloc(s[w].cap, sizeof *s[w].c);
    if (!s[w].k || !s[w].c) kvbm_bench_die("bench_router", "out of memory");
  }
  replay_peer(s, l, lat, r); /* r->seconds: applies and lookups */
  latency(lat, l->lookups, r);
  for (uint32_t w = 0; w < g_workers; w++) {
    free(s[w].k);
    free(s[w].c);
  }
  free(s);
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

typedef struct conc {
  double events_s, lookups_s, per_reader_s; /* a second */
} conc;

/* R readers looking up in a loop while the main thread applies every event. */
static conc run_threads(const oplog *l, int nr) {
  size_t *lk = malloc((l->lookups + 1) * sizeof *lk), n = 0;
  rd *r = calloc((size_t)nr, sizeof *r);
  if (!lk || !r) kvbm_bench_die("bench_router", "out of memory");
  for (size_t i = 0; i < l->nops; i++)
    if (l->ops[i].kind == OP_LOOKUP) lk[n++] = i;
  kvbm_index *idx = new_index();
  _Atomic int stop = 0;
  for (int i = 0; i < nr; i++) {
    r[i] = (rd){.l = l, .idx = idx, .lookups = lk, .nlookups = n, .stop = &stop};
    if (pthread_create(&r[i].th, NULL, reader, &r[i]))
      kvbm_bench_die("bench_router", "pthread_create");
  }
  /* The writer's rate counts its applies only (not the staging); the
   * readers' counts their whole run. */
  double t0 = now(), busy = 0;
  for (size_t i = 0; i < l->nops;)
    if (l->ops[i].kind == OP_BATCH) i = kv_apply(idx, l, i, &busy);
    else i++;
  double s = now() - t0;
  atomic_store(&stop, 1);
  uint64_t total = 0;
  for (int i = 0; i < nr; i++) {
    pthread_join(r[i].th, NULL);
    total += r[i].done;
  }
  free(r);
  free(lk);
  kvbm_index_destroy(idx);
  return (conc){(double)l->events / busy, (double)total / s, (double)total / nr / s};
}

/* ------------------------------------------------------------ main */

#define MAXR 16

static kvbm_bench_spread spread(const double *v, int n) { return kvbm_bench_spread_of(v, n); }

static void jfig(const char *name, kvbm_bench_spread s, double scale, bool last) {
  printf("\"%s\": {\"median\": %.6g, \"min\": %.6g, \"max\": %.6g}%s", name, s.median * scale,
         s.min * scale, s.max * scale, last ? "" : ", ");
}

static void tfig(const char *name, kvbm_bench_spread s, double scale, const char *unit) {
  printf("%s %.2f%s [%.2f..%.2f]", name, s.median * scale, unit, s.min * scale, s.max * scale);
}

static void tend(void) { printf("\n"); }

static int usage(void) {
  fprintf(stderr, "usage: bench_router [TRACE] [--limit N] [--repeat 5] [--workers 8] "
                  "[--readers 1,2,4] [--only kvbm|peer] [--json]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *path = KVBM_DEFAULT_TRACE, *only = NULL;
  int repeat = 5, readers[MAXR], nreaders = 3;
  bool json = false;
  readers[0] = 1, readers[1] = 2, readers[2] = 4;
  size_t limit = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = (size_t)atoll(argv[++i]);
    else if (!strcmp(argv[i], "--workers") && i + 1 < argc) g_workers = (uint32_t)atoi(argv[++i]);
    else if ((!strcmp(argv[i], "--readers") || !strcmp(argv[i], "--threads")) && i + 1 < argc) {
      nreaders = 0;
      for (char *p = argv[++i], *e; *p && nreaders < MAXR; p = *e ? e + 1 : e) {
        long v = strtol(p, &e, 10);
        if (e == p || v < 0 || v > 256 || (*e && *e != ',')) return usage();
        if (v) readers[nreaders++] = (int)v;
      }
    } else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = true;
    else if (argv[i][0] != '-') path = argv[i];
    else return usage();
  }
  if (only && strcmp(only, "kvbm") && strcmp(only, "peer")) return usage();
  if (g_workers < 1 || g_workers > KVBM_ROUTER_MAX_WORKERS) {
    fprintf(stderr, "bench_router: --workers must be 1..%d\n", KVBM_ROUTER_MAX_WORKERS);
    return 2;
  }
  if (repeat < 1) repeat = 1;
  kvbm_error err = {0};
  kvsim_trace *t;
  if (kvsim_trace_load(path, limit, &t, &err)) kvbm_bench_die("bench_router", "%s", err.msg);
  static oplog l;
  kvsim_w3_config o = kvsim_w3_config_default();
  o.workers = g_workers;
  g_capacity = o.capacity;
  o.tap_batch = tap_batch;
  o.tap_lookup = tap_lookup;
  o.tap_user = &l;
  kvsim_w3_result w3;
  double t0 = now();
  if (kvsim_w3_run(t, &o, &w3, &err)) kvbm_bench_die("bench_router", "%s", err.msg);
  double sim_s = now() - t0;
  kvsim_trace_destroy(t);
  build_batches(&l);
  double *lat = malloc((l.lookups + 1) * sizeof *lat);
  double *ks = calloc((size_t)repeat * 8, sizeof *ks);
  if (!lat || !ks) kvbm_bench_die("bench_router", "out of memory");
  /* per round: kvbm s, p50, p99, max; peer s, p50, p99; ratio of times */
  double *kt = ks, *k50 = ks + repeat, *k99 = ks + 2 * repeat, *kmax = ks + 3 * repeat,
         *pt = ks + 4 * repeat, *p50 = ks + 5 * repeat, *p99 = ks + 6 * repeat,
         *ratio = ks + 7 * repeat;
  uint64_t ksink = 0, psink = 0;
  double ops = (double)(l.events + l.lookups);
  for (int i = 0; i < repeat; i++) {
    result k = {0}, p = {0};
    if (!only || !strcmp(only, "kvbm")) run_kvbm(&l, lat, &k);
    if (!only || !strcmp(only, "peer")) run_peer(&l, lat, &p);
    kt[i] = ops / k.seconds, k50[i] = k.p50, k99[i] = k.p99, kmax[i] = k.max;
    pt[i] = ops / p.seconds, p50[i] = p.p50, p99[i] = p.p99;
    ratio[i] = p.seconds / k.seconds; /* kvbm's throughput over the peer's */
    ksink = k.sink, psink = p.sink;
  }
  if (only) { /* one side's throughput, for profilers and quick looks */
    kvbm_bench_spread so = spread(strcmp(only, "kvbm") ? pt : kt, repeat);
    printf("%s: %.2f M ops/s [%.2f..%.2f] over %d rounds\n", only, so.median * 1e-6,
           so.min * 1e-6, so.max * 1e-6, repeat);
    return 0;
  }
  if (ksink != psink)
    kvbm_bench_die("bench_router", "the answers differ: kvbm's best prefixes sum to %llu, the "
                   "peer's to %llu", (unsigned long long)ksink, (unsigned long long)psink);
  conc c[MAXR];
  for (int i = 0; i < nreaders; i++) c[i] = run_threads(&l, readers[i]);
  kvbm_bench_spread sk = spread(kt, repeat), sp = spread(pt, repeat), sr = spread(ratio, repeat),
                    sk50 = spread(k50, repeat), sk99 = spread(k99, repeat),
                    skmax = spread(kmax, repeat), sp50 = spread(p50, repeat),
                    sp99 = spread(p99, repeat);
  double r99[64];
  for (int i = 0; i < repeat && i < 64; i++) r99[i] = k99[i] / p99[i];
  kvbm_bench_spread sr99 = spread(r99, repeat < 64 ? repeat : 64);
  if (json) {
    printf("{\"workers\": %u, \"events\": %llu, \"lookups\": %llu, \"rounds\": %d, ", g_workers,
           (unsigned long long)l.events, (unsigned long long)l.lookups, repeat);
    printf("\"kvbm\": {");
    jfig("mops", sk, 1e-6, false);
    jfig("p50_us", sk50, 1e6, false);
    jfig("p99_us", sk99, 1e6, false);
    jfig("max_us", skmax, 1e6, true);
    printf("}, \"peer\": {");
    jfig("mops", sp, 1e-6, false);
    jfig("p50_us", sp50, 1e6, false);
    jfig("p99_us", sp99, 1e6, true);
    printf("}, ");
    jfig("ratio_ops", sr, 1, false);
    jfig("ratio_p99", sr99, 1, false);
    printf("\"readers\": {");
    for (int i = 0; i < nreaders; i++)
      printf("\"%d\": {\"writer_mevents\": %.6g, \"mlookups\": %.6g, \"mlookups_per_reader\": "
             "%.6g}%s", readers[i], c[i].events_s * 1e-6, c[i].lookups_s * 1e-6,
             c[i].per_reader_s * 1e-6, i + 1 < nreaders ? ", " : "");
    printf("}}\n");
  } else {
    printf("W3 router index, %s: %u workers x %u blocks, block size %u, active %g ms\n", path,
           o.workers, o.capacity, o.block_size, o.active_ms);
    printf("  log: %llu events (%llu blocks) in %zu batches, %llu lookups (%.0f blocks each on "
           "average); simulation %.1f s, index mismatches %llu\n",
           (unsigned long long)l.events, (unsigned long long)l.blocks, g_nbatches,
           (unsigned long long)l.lookups, (double)l.lookup_blocks / (double)l.lookups, sim_s,
           (unsigned long long)w3.index_mismatches);
    printf("  median [min..max] of %d rounds, one thread:\n  kvbm index: ", repeat);
    tfig("", sk, 1e-6, " M ops/s");
    tfig("; lookup p50", sk50, 1e6, " us");
    tfig(", p99", sk99, 1e6, " us");
    tfig(", max", skmax, 1e6, " us");
    tend();
    printf("  peer (a hash set per worker, single-threaded): ");
    tfig("", sp, 1e-6, " M ops/s");
    tfig("; lookup p50", sp50, 1e6, " us");
    tfig(", p99", sp99, 1e6, " us");
    tend();
    printf("  ratio kvbm / peer: ");
    tfig("ops/s", sr, 1, "");
    tfig(", lookup p99", sr99, 1, "");
    tend();
    printf("  targets: ops/s >= the peer's: %s; p99 <= the peer's: %s (medians)\n",
           sr.median >= 1 ? "met" : "NOT met", sr99.median <= 1 ? "met" : "NOT met");
    for (int i = 0; i < nreaders; i++)
      printf("  concurrent: 1 writer at %.2f M events/s while %d reader(s) made %.2f M "
             "lookups/s (%.2f M each)\n",
             c[i].events_s * 1e-6, readers[i], c[i].lookups_s * 1e-6, c[i].per_reader_s * 1e-6);
  }
  free(ks);
  free(lat);
  free(l.ops);
  free(l.h);
  free(g_ev);
  free(g_h);
  return 0;
}
