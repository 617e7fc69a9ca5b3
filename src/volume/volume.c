/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume.c: the storage interface's core (kvbm/volume.h): registration,
 * the batch queue, the I/O threads, deadlines, completions and counters.
 * The backends (file.c, disk_volume.c, redis.c, cluster.c, or a caller's)
 * only execute batches.
 *
 * Design. A volume is a bounded ring of submitted batches and a few I/O
 * threads, each with its own backend state (its own Redis connection, its
 * own open directory), so a backend never locks against itself. Submission
 * never blocks: a full ring is KVBM_EAGAIN, which is the back-pressure the
 * tier above needs (it drops an offload rather than stall the engine). A
 * batch's deadline starts at submission, not when a thread picks it up, so
 * a caller waiting on a batch waits at most timeout_ms plus the backend's
 * slack even when batches queue up behind a slow store: a batch whose
 * deadline passed while it waited completes with KVBM_ETIMEDOUT without
 * touching the store.
 *
 * The core owns the checks every backend would otherwise repeat: op kinds
 * and buffers (at submit: a bad batch is refused whole, nothing queued),
 * puts above max_value_bytes (KVBM_ETOOLONG, never handed to a backend),
 * statuses outside the contract (become KVBM_EIO, so a vendor's mistake
 * cannot leak a code the tier above does not expect) and a backend's
 * "corrupt" report (KVBM_ECHECKSUM: for a get a miss of its own kind,
 * counted apart; for exists or delete simply absent). Counters are
 * relaxed atomics, updated once per op after the backend ran.
 *
 * A built-in backend with one I/O thread may stream (disk://): its thread
 * hands it the next queued batch while the previous one's transfers are
 * in flight, and reports batches in order as their ops finish.
 *
 * Unregister: the ring is closed to submitters, the threads drain what is
 * queued with KVBM_ECLOSED (callbacks still run on an I/O thread, as the
 * contract says), finish the batch they hold, and exit; then the states are
 * closed. No callback runs after kvbm_volume_unregister returns.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kvbm/blake3.h"
#include "volume/internal.h"

#define THREADS_MAX 64u
#define QUEUE_MAX (1u << 20)
#define BATCH_MAX 65536u
#define TIMEOUT_MAX_MS (3600 * 1000)
#define DISK_KEY_CONTEXT "kvbm 2025-06 disk:// volume slot checksum key v1"

/* A kvbm_volume_keys() call, queued like a batch. */
typedef struct listing {
  kvbm_volume_key_cb fn;          /* one of the two */
  kvbm_volume_tagged_key_cb tfn;
  void *user;
  uint64_t skipped;
  int rc;
  bool done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} listing;

typedef struct batch {
  kvbm_volume_op *ops;
  size_t n;
  kvbm_volume_done_cb done;
  void *user;
  uint64_t deadline_ns;
  listing *list; /* not NULL: a listing, not ops */
} batch;

typedef struct worker {
  struct kvbm_volume *v;
  void *state;
  pthread_t tid;
  bool started;
} worker;

typedef struct counters {
  atomic_uint_fast64_t puts, gets, hits, misses, exists, deletes;
  atomic_uint_fast64_t bytes_put, bytes_got;
  atomic_uint_fast64_t timeouts, io_errors, full, corrupt, rejected;
} counters;

struct kvbm_volume {
  kvbm_volume_config cfg; /* strings below, owned */
  char *full, *url, *name, *ns; /* the URL as given, without userinfo */
  char *mode;
  const kvbm_volume_backend *be;
  const kvbm__volume_stream *stream; /* a built-in that streams, or NULL */
  kvbm__volume_url *parsed;
  kvbm__volume_ctx ctx;
  uint32_t nworkers;
  worker *workers;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  batch *ring;
  uint32_t cap, head, count;
  bool closing;
  atomic_uint_fast64_t queued;
  counters c;
};

kvbm_volume_config kvbm_volume_config_default(const char *url) {
  return (kvbm_volume_config){
      .url = url,
      .key_namespace = "",
      .timeout_ms = 1000,
      .threads = 1,
      .queue_capacity = 256,
      .max_value_bytes = UINT64_C(64) << 20,
  };
}

static int enqueue(kvbm_volume *v, const batch *b);

static const kvbm_volume_backend *builtin(kvbm__volume_kind k) {
  switch (k) {
  case KVBM__VOLUME_FILE: return &kvbm__volume_file_backend;
  case KVBM__VOLUME_DISK: return &kvbm__volume_disk_backend;
  case KVBM__VOLUME_REDIS: return &kvbm__volume_redis_backend;
  case KVBM__VOLUME_CLUSTER: return &kvbm__volume_cluster_backend;
  default: return NULL;
  }
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static void add(atomic_uint_fast64_t *a, uint64_t v) {
  atomic_fetch_add_explicit(a, v, memory_order_relaxed);
}

static bool contract_status(int s) {
  switch (s) {
  case KVBM_OK: case KVBM_ENOTFOUND: case KVBM_ECHECKSUM: case KVBM_ENOSPC: case KVBM_ETIMEDOUT:
  case KVBM_EIO: case KVBM_ETOOLONG: case KVBM_ECLOSED:
    return true;
  default:
    return false;
  }
}

/* One op's status made contractual, then counted. */
static void account(kvbm_volume *v, kvbm_volume_op *op) {
  if (op->status == KVBM__VOLUME_CORRUPT) { /* a get says so; the others: absent */
    add(&v->c.corrupt, 1);
    if (op->kind != KVBM_VOLUME_GET) op->status = KVBM_ENOTFOUND;
  }
  if (!contract_status(op->status)) op->status = KVBM_EIO;
  if (op->kind == KVBM_VOLUME_GET && op->status == KVBM_OK && op->size > op->cap)
    op->status = KVBM_EIO; /* a backend claiming more than it had room for */
  /* size means something for a found value, or a get that had no room. */
  bool sized = op->status == KVBM_OK ? op->kind == KVBM_VOLUME_GET || op->kind == KVBM_VOLUME_EXISTS
                                     : op->kind == KVBM_VOLUME_GET &&
                                           (op->status == KVBM_ENOSPC || op->status == KVBM_ETOOLONG);
  if (!sized) op->size = 0;
  switch (op->kind) {
  case KVBM_VOLUME_PUT:
    add(&v->c.puts, 1);
    if (op->status == KVBM_OK) add(&v->c.bytes_put, op->len);
    if (op->status == KVBM_ENOSPC) add(&v->c.full, 1);
    break;
  case KVBM_VOLUME_GET:
    add(&v->c.gets, 1);
    if (op->status == KVBM_OK) {
      add(&v->c.hits, 1);
      add(&v->c.bytes_got, op->size);
    } else {
      add(&v->c.misses, 1);
    }
    break;
  case KVBM_VOLUME_EXISTS: add(&v->c.exists, 1); break;
  case KVBM_VOLUME_DELETE: add(&v->c.deletes, 1); break;
  }
  if (op->status == KVBM_ETIMEDOUT) add(&v->c.timeouts, 1);
  if (op->status == KVBM_EIO) add(&v->c.io_errors, 1);
}

/* Where a batch's runnable ops go: the backend's synchronous run, or a
 * streaming backend's issue (left: the batch's ops not finished yet). */
typedef struct runner {
  kvbm_volume *v;
  void *state;
  size_t *left; /* NULL: run */
} runner;

static void finished(runner *r, size_t n) {
  if (r->left) *r->left -= n;
}

/* Hands a batch to the backend in runs of consecutive ops; the ops the
 * core refuses itself (closed, past the deadline, a put above
 * max_value_bytes) get their status here. */
static void dispatch(runner *r, batch *b, bool closed) {
  kvbm_volume *v = r->v;
  for (size_t i = 0; i < b->n; i++) {
    b->ops[i].status = KVBM_EIO; /* a backend that forgets an op fails it */
    b->ops[i].size = 0;
  }
  if (closed || kvbm_clock_ns() >= b->deadline_ns) {
    for (size_t i = 0; i < b->n; i++) b->ops[i].status = closed ? KVBM_ECLOSED : KVBM_ETIMEDOUT;
    finished(r, b->n);
    return;
  }
  size_t i = 0;
  while (i < b->n) {
    kvbm_volume_op *op = &b->ops[i];
    if (op->kind == KVBM_VOLUME_PUT && op->len > v->cfg.max_value_bytes) {
      op->status = KVBM_ETOOLONG;
      finished(r, 1);
      i++;
      continue;
    }
    size_t j = i + 1;
    while (j < b->n && !(b->ops[j].kind == KVBM_VOLUME_PUT &&
                         b->ops[j].len > v->cfg.max_value_bytes))
      j++;
    if (kvbm_clock_ns() >= b->deadline_ns) {
      for (size_t k = i; k < j; k++) b->ops[k].status = KVBM_ETIMEDOUT;
      finished(r, j - i);
    } else if (r->left) {
      v->stream->issue(r->state, op, j - i, b->deadline_ns, r->left);
    } else {
      v->be->run(r->state, op, j - i, b->deadline_ns);
    }
    i = j;
  }
}

/* Counts a finished batch and reports it. */
static void finish(kvbm_volume *v, batch *b) {
  for (size_t i = 0; i < b->n; i++) account(v, &b->ops[i]);
  b->done(b->user, b->ops, b->n);
}

/* Runs a batch on one thread's state, then reports it. */
static void execute(kvbm_volume *v, void *state, batch *b, bool closed) {
  runner r = {v, state, NULL};
  dispatch(&r, b, closed);
  finish(v, b);
}

/* A listing of tags handed keys without them: tag 0 each. */
static void untagged(void *user, uint64_t key, size_t size) {
  const listing *l = user;
  l->tfn(l->user, key, size, 0);
}
/* A listing without tags handed keys with them: the tags dropped. */
static void drop_tag(void *user, uint64_t key, size_t size, uint32_t tag) {
  (void)tag;
  const listing *l = user;
  l->fn(l->user, key, size);
}

static int backend_keys(kvbm_volume *v, void *state, listing *l) {
  if (v->be->keys_tagged)
    return l->tfn ? v->be->keys_tagged(state, l->tfn, l->user, &l->skipped)
                  : v->be->keys_tagged(state, drop_tag, l, &l->skipped);
  return l->tfn ? v->be->keys(state, untagged, l, &l->skipped)
                : v->be->keys(state, l->fn, l->user, &l->skipped);
}

static void list_keys(kvbm_volume *v, void *state, listing *l, bool closed) {
  int rc = closed ? KVBM_ECLOSED : backend_keys(v, state, l);
  pthread_mutex_lock(&l->mu);
  l->rc = rc;
  l->done = true;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* Takes the next queued batch (lock held); *closed: unregister began. */
static batch pop(kvbm_volume *v, bool *closed) {
  batch b = v->ring[v->head];
  v->head = (v->head + 1) % v->cap;
  v->count--;
  atomic_store_explicit(&v->queued, v->count, memory_order_relaxed);
  *closed = v->closing;
  return b;
}

/* Batches started on a streaming backend and not yet reported, oldest
 * first. */
#define ACTIVE_MAX 64u
typedef struct active {
  batch b;
  size_t left; /* ops not finished */
} active;

typedef struct actives {
  active a[ACTIVE_MAX];
  uint32_t head, count;
} actives;

/* Reports the oldest batches whose ops are all finished, in order. */
static void flush(kvbm_volume *v, actives *q) {
  while (q->count && q->a[q->head].left == 0) {
    finish(v, &q->a[q->head].b);
    q->head = (q->head + 1) % ACTIVE_MAX;
    q->count--;
  }
}

/* The I/O thread of a streaming backend: it starts the next queued batch
 * as soon as there is one (the backend reaps older transfers to make
 * room), and otherwise waits for the transfers in flight, so the device
 * never idles at the tail of a batch while another is queued. Batches are
 * reported in submission order once each of their ops has finished. */
static void stream_main(worker *w) {
  kvbm_volume *v = w->v;
  actives q = {.head = 0, .count = 0};
  pthread_mutex_lock(&v->mu);
  for (;;) {
    if (v->count && q.count < ACTIVE_MAX) {
      bool closed;
      batch b = pop(v, &closed);
      pthread_mutex_unlock(&v->mu);
      if (b.list) { /* a listing sees every earlier batch done */
        while (v->stream->reap(w->state)) {
        }
        flush(v, &q);
        list_keys(v, w->state, b.list, closed);
      } else {
        active *a = &q.a[(q.head + q.count++) % ACTIVE_MAX];
        a->b = b;
        a->left = b.n;
        runner r = {v, w->state, &a->left};
        dispatch(&r, &a->b, closed);
      }
    } else if (q.count) {
      pthread_mutex_unlock(&v->mu);
      if (!v->stream->reap(w->state)) /* nothing in flight: what is left never started */
        for (uint32_t i = 0; i < q.count; i++) q.a[(q.head + i) % ACTIVE_MAX].left = 0;
    } else if (v->closing) {
      break;
    } else {
      pthread_cond_wait(&v->cv, &v->mu);
      continue;
    }
    flush(v, &q);
    pthread_mutex_lock(&v->mu);
  }
  pthread_mutex_unlock(&v->mu);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  kvbm_volume *v = w->v;
  if (v->stream) {
    stream_main(w);
    return NULL;
  }
  pthread_mutex_lock(&v->mu);
  for (;;) {
    while (!v->count && !v->closing) pthread_cond_wait(&v->cv, &v->mu);
    if (!v->count) break; /* closing and drained */
    bool closed;
    batch b = pop(v, &closed);
    pthread_mutex_unlock(&v->mu);
    if (b.list) list_keys(v, w->state, b.list, closed);
    else execute(v, w->state, &b, closed);
    pthread_mutex_lock(&v->mu);
  }
  pthread_mutex_unlock(&v->mu);
  return NULL;
}

/* Settings: 0 means the default; out of range is refused by name. */
static int check_config(kvbm_volume_config *c, const kvbm_volume_config *in, kvbm_error *err) {
  *c = *in;
  kvbm_volume_config d = kvbm_volume_config_default(NULL);
  if (c->timeout_ms == 0) c->timeout_ms = d.timeout_ms;
  if (c->threads == 0) c->threads = d.threads;
  if (c->queue_capacity == 0) c->queue_capacity = d.queue_capacity;
  if (c->max_value_bytes == 0) c->max_value_bytes = d.max_value_bytes;
  if (c->timeout_ms < 0 || c->timeout_ms > TIMEOUT_MAX_MS)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: timeout_ms %d is not in 1..%d",
                          c->timeout_ms, TIMEOUT_MAX_MS);
  if (c->threads > THREADS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: threads %u is not in 1..%u", c->threads,
                          THREADS_MAX);
  if (c->queue_capacity > QUEUE_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: queue_capacity %u is not in 1..%u",
                          c->queue_capacity, QUEUE_MAX);
  if (c->disk_key && (c->disk_key_len < KVBM__VOLUME_DISK_KEY_MIN ||
                      c->disk_key_len > KVBM__VOLUME_DISK_KEY_MAX))
    return kvbm_error_set(err, KVBM_EINVAL, "volume: disk_key must be %u..%u bytes, not %zu",
                          KVBM__VOLUME_DISK_KEY_MIN, KVBM__VOLUME_DISK_KEY_MAX, c->disk_key_len);
  if (c->disk_label && strlen(c->disk_label) > 255)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: disk_label of %zu bytes (at most 255)",
                          strlen(c->disk_label));
  if (c->max_value_bytes > (UINT64_C(1) << 40))
    return kvbm_error_set(err, KVBM_EINVAL, "volume: max_value_bytes %llu is above 1 TiB",
                          (unsigned long long)c->max_value_bytes);
  return KVBM_OK;
}

/* The backend for the URL's scheme: the caller's, or a built-in. */
static int pick_backend(kvbm_volume *v, kvbm_error *err) {
  const kvbm_volume_backend *be = v->cfg.backend;
  if (be) {
    if (!be->scheme || !be->open || !be->run || !be->close)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: a backend needs scheme, open, run and close");
    if (strcmp(be->scheme, v->parsed->scheme) != 0)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: the backend serves '%s://', the URL is '%s://'",
                            be->scheme, v->parsed->scheme);
  } else {
    be = builtin(v->parsed->kind);
    v->stream = v->parsed->kind == KVBM__VOLUME_DISK ? &kvbm__volume_disk_stream : NULL;
    if (!be)
      return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                            "volume: no backend for '%s://' (built in: disk, file, redis, "
                            "redis+cluster; others need kvbm_volume_config.backend)",
                            v->parsed->scheme);
  }
  v->be = be;
  return KVBM_OK;
}

static void free_volume(kvbm_volume *v) {
  for (uint32_t i = 0; v->workers && i < v->nworkers; i++)
    if (v->workers[i].state) v->be->close(v->workers[i].state);
  free(v->workers);
  free(v->ring);
  free(v->parsed);
  free(v->mode);
  free(v->full);
  free(v->url);
  free(v->name);
  free(v->ns);
  explicit_bzero(v->ctx.disk_key, sizeof v->ctx.disk_key);
  pthread_mutex_destroy(&v->mu);
  pthread_cond_destroy(&v->cv);
  free(v);
}

/* Everything but the threads: settings, strings, backend states. */
static int prepare(kvbm_volume *v, const kvbm_volume_config *cfg, kvbm_error *err) {
  int rc = check_config(&v->cfg, cfg, err);
  if (rc) return rc;
  v->parsed = malloc(sizeof *v->parsed);
  if (!v->parsed) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  if ((rc = kvbm__volume_url_parse(cfg->url, v->parsed, err))) return rc;
  if ((rc = kvbm__volume_ns_check(cfg->key_namespace, err))) return rc;
  if ((rc = pick_backend(v, err))) return rc;
  v->full = dup_str(cfg->url);
  v->url = dup_str(v->parsed->display);
  v->name = dup_str(cfg->name ? cfg->name : v->parsed->display);
  v->ns = dup_str(cfg->key_namespace ? cfg->key_namespace : "");
  v->cap = v->cfg.queue_capacity;
  v->ring = calloc(v->cap, sizeof *v->ring);
  if (v->be->max_threads && v->cfg.threads > v->be->max_threads) v->cfg.threads = v->be->max_threads;
  v->nworkers = v->cfg.threads;
  v->workers = calloc(v->nworkers, sizeof *v->workers);
  if (!v->full || !v->url || !v->name || !v->ns || !v->ring || !v->workers)
    return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  /* The backends see the volume's own copy of the settings. */
  v->cfg.url = v->full;
  v->cfg.name = v->name;
  v->cfg.key_namespace = v->ns;
  v->ctx.url = v->parsed;
  v->ctx.cfg = &v->cfg;
  v->ctx.ns = v->ns;
  v->ctx.max_value_bytes = v->cfg.max_value_bytes;
  if (v->cfg.disk_key) { /* the secret is not kept: only the key derived from it */
    kvbm_blake3_derive_key(DISK_KEY_CONTEXT, v->cfg.disk_key, v->cfg.disk_key_len, v->ctx.disk_key,
                           sizeof v->ctx.disk_key);
    v->ctx.disk_keyed = true;
  }
  v->cfg.disk_key = NULL;
  v->cfg.disk_key_len = 0;
  void *user = v->cfg.backend ? v->cfg.backend_user : &v->ctx;
  for (uint32_t i = 0; i < v->nworkers; i++) {
    kvbm_error e;
    kvbm_error_clear(&e);
    rc = v->be->open(&v->cfg, user, &v->workers[i].state, &e);
    if (rc) {
      v->workers[i].state = NULL;
      if (!e.msg[0]) kvbm_error_set(&e, rc, "volume: %s: the backend's open failed", v->url);
      return kvbm_error_set(err, rc < 0 ? rc : KVBM_EIO, "%s", e.msg);
    }
  }
  v->cfg.disk_label = NULL; /* the caller's, read by open only */
  const char *mode = v->be->describe ? v->be->describe(v->workers[0].state) : NULL;
  if (!(v->mode = dup_str(mode ? mode : "")))
    return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  return KVBM_OK;
}

int kvbm_volume_register(const kvbm_volume_config *cfg, kvbm_volume **out, kvbm_error *err) {
  if (out) *out = NULL;
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "volume: NULL argument");
  if (!cfg->url) return kvbm_error_set(err, KVBM_EINVAL, "volume: no URL");
  kvbm_volume *v = calloc(1, sizeof *v);
  if (!v) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  pthread_mutex_init(&v->mu, NULL);
  pthread_cond_init(&v->cv, NULL);
  int rc = prepare(v, cfg, err);
  for (uint32_t i = 0; !rc && i < v->nworkers; i++) {
    v->workers[i].v = v;
    if (pthread_create(&v->workers[i].tid, NULL, worker_main, &v->workers[i]) != 0)
      rc = kvbm_error_set(err, KVBM_ENOMEM, "volume: cannot start an I/O thread");
    else
      v->workers[i].started = true;
  }
  if (rc) {
    kvbm_volume_unregister(v);
    return rc;
  }
  *out = v;
  return KVBM_OK;
}

void kvbm_volume_unregister(kvbm_volume *v) {
  if (!v) return;
  pthread_mutex_lock(&v->mu);
  v->closing = true;
  pthread_cond_broadcast(&v->cv);
  pthread_mutex_unlock(&v->mu);
  for (uint32_t i = 0; v->workers && i < v->nworkers; i++)
    if (v->workers[i].started) pthread_join(v->workers[i].tid, NULL);
  free_volume(v);
}

static int check_ops(const kvbm_volume_op *ops, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const kvbm_volume_op *op = &ops[i];
    switch (op->kind) {
    case KVBM_VOLUME_PUT:
      if (!op->src || op->len == 0 || op->tag > 255) return KVBM_EINVAL;
      break;
    case KVBM_VOLUME_GET:
      if (!op->dst && op->cap) return KVBM_EINVAL;
      break;
    case KVBM_VOLUME_EXISTS:
    case KVBM_VOLUME_DELETE:
      break;
    default:
      return KVBM_EINVAL;
    }
  }
  return KVBM_OK;
}

int kvbm_volume_submit(kvbm_volume *v, kvbm_volume_op *ops, size_t n, kvbm_volume_done_cb done,
                       void *user) {
  if (!v || !ops || !done || n == 0 || n > BATCH_MAX) return KVBM_EINVAL;
  if (check_ops(ops, n)) return KVBM_EINVAL;
  batch b = {ops, n, done, user, kvbm_clock_ns() + (uint64_t)v->cfg.timeout_ms * 1000000u, NULL};
  return enqueue(v, &b);
}

static int keys(kvbm_volume *v, kvbm_volume_key_cb fn, kvbm_volume_tagged_key_cb tfn, void *user,
                uint64_t *skipped, kvbm_error *err) {
  if (skipped) *skipped = 0;
  if (!v || (!fn && !tfn)) return kvbm_error_set(err, KVBM_EINVAL, "volume: NULL argument");
  if (!v->be->keys && !v->be->keys_tagged)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "volume: %s cannot list its keys", v->url);
  listing l = {.fn = fn, .tfn = tfn, .user = user};
  pthread_mutex_init(&l.mu, NULL);
  pthread_cond_init(&l.cv, NULL);
  batch b = {.list = &l};
  int rc = enqueue(v, &b);
  if (rc == KVBM_OK) {
    pthread_mutex_lock(&l.mu);
    while (!l.done) pthread_cond_wait(&l.cv, &l.mu);
    pthread_mutex_unlock(&l.mu);
    rc = l.rc;
    if (skipped) *skipped = l.skipped;
  }
  pthread_mutex_destroy(&l.mu);
  pthread_cond_destroy(&l.cv);
  if (rc) kvbm_error_set(err, rc, "volume: %s: cannot list the keys: %s", v->url, kvbm_strerror(rc));
  return rc;
}

int kvbm_volume_keys(kvbm_volume *v, kvbm_volume_key_cb fn, void *user, uint64_t *skipped,
                     kvbm_error *err) {
  return keys(v, fn, NULL, user, skipped, err);
}

int kvbm_volume_keys_tagged(kvbm_volume *v, kvbm_volume_tagged_key_cb fn, void *user,
                            uint64_t *skipped, kvbm_error *err) {
  return keys(v, NULL, fn, user, skipped, err);
}

const char *kvbm_volume_mode(const kvbm_volume *v) { return v ? v->mode : ""; }

/* Queues a batch or a listing. */
static int enqueue(kvbm_volume *v, const batch *b) {
  pthread_mutex_lock(&v->mu);
  int rc = KVBM_OK;
  if (v->closing) {
    rc = KVBM_ECLOSED;
  } else if (v->count == v->cap) {
    rc = KVBM_EAGAIN;
    add(&v->c.rejected, 1);
  } else {
    v->ring[(v->head + v->count) % v->cap] = *b;
    v->count++;
    atomic_store_explicit(&v->queued, v->count, memory_order_relaxed);
    pthread_cond_signal(&v->cv);
  }
  pthread_mutex_unlock(&v->mu);
  return rc;
}

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
} waiter;

static void wake(void *user, kvbm_volume_op *ops, size_t n) {
  (void)ops;
  (void)n;
  waiter *w = user;
  pthread_mutex_lock(&w->mu);
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int kvbm_volume_run(kvbm_volume *v, kvbm_volume_op *ops, size_t n, kvbm_error *err) {
  waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int rc = kvbm_volume_submit(v, ops, n, wake, &w);
  if (rc == KVBM_OK) {
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
  } else if (rc == KVBM_EAGAIN) {
    kvbm_error_set(err, rc, "volume: %s: the queue is full", v->url);
  } else if (rc == KVBM_ECLOSED) {
    kvbm_error_set(err, rc, "volume: %s is being unregistered", v->url);
  } else {
    kvbm_error_set(err, rc,
                   "volume: bad batch (NULL volume or ops, n not in 1..%u, a bad kind, a put "
                   "without bytes or a get without room)",
                   BATCH_MAX);
  }
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return rc;
}

static int run_one(kvbm_volume *v, kvbm_volume_op *op, size_t *size) {
  int rc = kvbm_volume_run(v, op, 1, NULL);
  if (rc == KVBM_OK) rc = op->status;
  if (size) *size = op->size;
  return rc;
}

int kvbm_volume_put(kvbm_volume *v, uint64_t key, const void *src, size_t len) {
  kvbm_volume_op op = {.kind = KVBM_VOLUME_PUT, .key = key, .src = src, .len = len};
  return run_one(v, &op, NULL);
}

int kvbm_volume_get(kvbm_volume *v, uint64_t key, void *dst, size_t cap, size_t *size) {
  kvbm_volume_op op = {.kind = KVBM_VOLUME_GET, .key = key, .dst = dst, .cap = cap};
  if (size) *size = 0;
  return run_one(v, &op, size);
}

int kvbm_volume_exists(kvbm_volume *v, uint64_t key, size_t *size) {
  kvbm_volume_op op = {.kind = KVBM_VOLUME_EXISTS, .key = key};
  if (size) *size = 0;
  return run_one(v, &op, size);
}

int kvbm_volume_delete(kvbm_volume *v, uint64_t key) {
  kvbm_volume_op op = {.kind = KVBM_VOLUME_DELETE, .key = key};
  return run_one(v, &op, NULL);
}

const char *kvbm_volume_name(const kvbm_volume *v) { return v ? v->name : ""; }
const char *kvbm_volume_url(const kvbm_volume *v) { return v ? v->url : ""; }

static uint64_t get(const atomic_uint_fast64_t *a) {
  return atomic_load_explicit(a, memory_order_relaxed);
}

void kvbm_volume_stats_get(const kvbm_volume *v, kvbm_volume_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!v) return;
  out->puts = get(&v->c.puts);
  out->gets = get(&v->c.gets);
  out->hits = get(&v->c.hits);
  out->misses = get(&v->c.misses);
  out->exists = get(&v->c.exists);
  out->deletes = get(&v->c.deletes);
  out->bytes_put = get(&v->c.bytes_put);
  out->bytes_got = get(&v->c.bytes_got);
  out->timeouts = get(&v->c.timeouts);
  out->io_errors = get(&v->c.io_errors);
  out->full = get(&v->c.full);
  out->corrupt = get(&v->c.corrupt);
  out->rejected = get(&v->c.rejected);
  out->reconnects = get(&v->ctx.reconnects);
  out->queued = get(&v->queued);
  out->slot_refreshes = get(&v->ctx.slot_refreshes);
  out->slot_refreshes_limited = get(&v->ctx.slot_refreshes_limited);
  out->redirect_loops = get(&v->ctx.redirect_loops);
  out->slot_maps_refused = get(&v->ctx.slot_maps_refused);
}
