/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publisher.c: the batching event publisher.
 *
 * Two queues, by what the sinks take. Wire mode (every sink takes bytes:
 * ZMQ, NATS, JetStream, the usual case): a producer (an engine thread, the
 * pool listener) encodes its event into the buffer of the batch it will
 * leave in (a "chunk": room for the batch head before the events, for the
 * dp_rank after them; a new chunk when the open one holds
 * max_batch_events or another rank). A plain event of one block (the
 * usual K = 1 event) is encoded before the lock, on the producer's stack,
 * and only copied in under it (publish_plain), so that the lock is held
 * for a few dozen instructions, not the encode; any other is encoded in
 * place under it (PLAIN_STACK says why larger ones are).
 * The publisher thread takes the chunks (an array swap under the lock), writes each batch's
 * head and rank in place and hands the buffer to the sinks; the ZMQ sink
 * sends that very buffer (zmq_msg_init_data), holding a reference that
 * ZMQ's I/O thread gives back once the bytes are written, and the chunk
 * returns to a pool. So a batch's bytes are written once, by the encoder
 * (and, for a plain event, copied once from the producer's stack), and
 * read once, by the kernel: no copy into a payload, none into a ZMQ
 * message (issue 22). Struct mode (a callback sink wants the events
 * themselves): the event's scalars go into an array, its hashes, tokens
 * and names into three arenas; the thread swaps this "fill" buffer with
 * its "drain" buffer, cuts the drained events into batches of at most
 * max_batch_events, encodes each batch once if some sink takes bytes and
 * hands it to every sink. Either way, in steady state publishing
 * allocates nothing (the pool and the arenas keep their memory) and a
 * producer holds the lock for a copy of a one-block plain event's bytes,
 * another event's encode, or a few memcpy's.
 *
 * A batch leaves when the fill buffer holds max_batch_events, when its
 * oldest event has waited max_batch_delay_us, on flush, and on shutdown.
 * The bound is on the fill buffer (events and bytes): when it is full, a
 * producer either waits (BLOCK) or drops the event and counts it (DROP).
 * Ids are given at acceptance, so ids on the wire have no holes.
 *
 * The thread sleeps in zmq_poll on an eventfd (producers write it only when
 * the thread is asleep and something it waits for happened: the first
 * event, a full batch, a flush, shutdown) plus the sinks' input sockets
 * (the replay ROUTER), so replay requests are served between batches with
 * no polling loop. The time trigger has a 1 ms granularity (zmq_poll's).
 * A thread that has just sent something sleeps at most max_batch_delay_us
 * ("armed"), so the event that opens the next queue does not wake it: the
 * timer finds it. Under a steady stream that is one wake a batch (the full
 * batch's) instead of two (issue 22: voluntary context switches of
 * bench_events K = 1 -19%); an armed sleep that runs out with nothing
 * queued is the last before an idle publisher sleeps until woken. And
 * while every wake finds a full batch ("streaming"), the thread sleeps
 * at most stream_poll_us() (a quarter of max_batch_delay_us, 50-200 us)
 * and full batches wake nothing: a wake costs the producer an eventfd
 * write and an interprocessor interrupt, the thread's own short timer
 * costs it nothing (K = 1: the producer's CPU -15%, the thread's -59%,
 * our throughput +17%: docs/areas/events.md, Session 16). A full batch
 * then leaves up to that period later than a wake would have sent it;
 * the first wake that finds none ends the streaming.
 *
 * Shutdown refuses new events, lets the thread drain everything accepted,
 * then closes the sinks, which flush their sockets within their linger.
 *
 * Coalescing (config.coalesce, off by default; wire mode only). A pool
 * link publishes one block an event, so at K = 1 the per-event work (the
 * lock, the check, an encode of ~120 bytes, a decode) is per block, and
 * it costs about twice what raw ZMQ spends moving the bytes. With the
 * option a one-block event that continues the open "run" (the last event
 * of the open batch, not yet encoded) is appended to it: its hash and
 * tokens copied into the run's arrays, nothing encoded. The run is
 * encoded, once, as one multi-block event when something else comes
 * (a break in the chain, another medium, group, LoRA or rank, an event
 * with names or extras), when its batch is full or leaves. A store run
 * and a remove run may be open together (q_append_coalesce says why and
 * how one hash's order is kept). What consumers then see is what vLLM
 * sends (one BlockStored of a step's blocks, parent the first one's),
 * which is why it is an option: a consumer that counts events, or
 * matches them one to one with the pool's calls, sees fewer.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "event_codec/internal.h"
#include "events/sink.h"
#include "kvbm/events.h"
#include "common/clock.h"
#include "common/vec.h"

#define MAX_SINKS 8

/* An event's variable-length parts besides hashes and tokens: its names
 * and the msgpack bytes it carries. They are copied into the queue's byte
 * arena and pointed at again when the batch leaves. */
enum { V_MNAME, V_LNAME, V_SALT, V_KIND, V_LOC, V_OWN, V_EKEYS, V_EXTRAS, NVAR };

/* The pointer fields of `ev` for each part. */
static const void **var_field(kvbm_event *ev, int v) {
  switch (v) {
    case V_MNAME: return (const void **)&ev->medium_name;
    case V_LNAME: return (const void **)&ev->lora_name;
    case V_SALT: return (const void **)&ev->cache_salt;
    case V_KIND: return (const void **)&ev->kv_cache_spec_kind;
    case V_LOC: return (const void **)&ev->locality;
    case V_OWN: return (const void **)&ev->ownership;
    case V_EKEYS: return (const void **)&ev->extra_keys;
    default: return (const void **)&ev->extras;
  }
}

/* The bytes of part v (a name with its NUL); 0 when absent. */
static size_t var_len(const kvbm_event *ev, int v) {
  const void *p = *var_field((kvbm_event *)ev, v);
  if (!p) return 0;
  if (v == V_EKEYS) return ev->extra_keys_len;
  if (v == V_EXTRAS) return ev->extras_len;
  return strlen(p) + 1;
}

/* One queued event (struct mode): its scalars, and where its arrays sit
 * in the arenas. */
typedef struct qev {
  kvbm_event ev;           /* its parts' pointers NULL while queued */
  size_t h_off, t_off;     /* into h, t */
  size_t v_off[NVAR];      /* into s, for the parts in `vars` */
  int32_t dp_rank;         /* the batch it leaves in carries this rank */
  uint8_t vars;            /* bit v: part v present (most events: none) */
} qev;

/* Wire mode: one batch being filled, its events' msgpack back to back in
 * one buffer with room for the batch head before them and the dp_rank
 * after them, so that the thread frames it in place and the ZMQ sink
 * sends that very buffer (zmq_msg_init_data): no copy of a batch's bytes
 * between the producer's encode and the kernel. A sent chunk is
 * referenced by the ZMQ messages that hold it and comes back to the pool
 * when the last is done with it (on ZMQ's I/O thread). */
typedef struct wchunk wchunk;
typedef struct wpool wpool;
struct wchunk {
  wpool *pool;
  atomic_uint refs;
  wchunk *next;          /* in the pool's free list */
  uint8_t *data;         /* [KVBM__EVENT_HEAD_MAX][events: len][dp_rank] */
  size_t len, cap;       /* the events' bytes; data's size */
  size_t n, cost;        /* wire events, their share of the byte bound */
  size_t pub;            /* published events it holds (n but for runs):
                          * what max_batch_events and the counts see */
  int32_t dp_rank;       /* every event of a batch has one rank */
};

/* Buffers come back on ZMQ's thread, possibly after the publisher is
 * gone: the pool lives until the publisher and every chunk let go. */
#define POOL_KEEP 32                      /* free chunks kept */
#define POOL_KEEP_BYTES ((size_t)4 << 20) /* larger buffers are not kept */
/* A new chunk's first buffer: a full batch of 256 one-block map events
 * (~30 KiB) fits without growing. From 4 KiB it took three reallocs and
 * their copies, which is what a publisher pays whenever its subscribers
 * lag and more than POOL_KEEP chunks are out (callgrind: up to ~30
 * instructions a K = 1 event). Idle cost: POOL_KEEP of them, 2 MiB. */
#define CHUNK_FIRST_BYTES ((size_t)64 << 10)
struct wpool {
  pthread_mutex_t mu;
  wchunk *free;
  size_t nfree, live; /* live: chunks allocated and not freed */
  bool closed;        /* the publisher is gone: chunks are freed as they return */
};

/* Coalescing: the open run, a multi-block event being gathered, the last
 * event of the open chunk. Its bytes are reserved in that chunk (`bound`,
 * after c->len) and written when it closes. */
#define RUN_KIND_MAX 32
typedef struct run {
  bool open;
  kvbm_event ev;           /* type, medium, parent, size, LoRA, group */
  wchunk *c;               /* the chunk it goes into */
  uint64_t *h;
  size_t nh, caph;
  uint32_t *t;
  size_t nt, capt;
  size_t bound;            /* bytes reserved for it in c */
  char kind[RUN_KIND_MAX]; /* kv_cache_spec_kind, copied */
  uint64_t bloom[16];      /* its hashes, 1024 bits: "surely not in it" */
} run;

/* An event's variable parts, measured once (outside the lock). */
typedef struct vsize {
  size_t len[NVAR];
  size_t total;            /* hashes + tokens + parts: the byte bound's measure */
  uint8_t vars;
} vsize;

typedef struct evq {
  qev *ev;
  size_t n, cap;
  uint64_t *h;
  size_t nh, caph;
  uint32_t *t;
  size_t nt, capt;
  char *s;
  size_t ns, caps;
  wchunk **ch;         /* wire mode: the batches being filled, the last open */
  size_t nch, capch;
  size_t bytes;        /* hashes + tokens + names, the byte bound's measure */
  uint64_t first_ns;   /* when the oldest event arrived (monotonic) */
} evq;

struct kvbm_publisher {
  kvbm_publisher_config o;
  ev_sink *sinks[MAX_SINKS];
  size_t nsinks;
  void *zctx;
  int efd;
  pthread_t thread;
  bool started;

  pthread_mutex_t mu;
  pthread_cond_t room; /* producers waiting for space */
  pthread_cond_t done; /* flushers waiting for sent_events */
  bool closing, waiting;
  bool armed;          /* the thread sleeps at most max_batch_delay_us: an
                        * event that opens a queue need not wake it */
  bool streaming;      /* the thread sleeps at most stream_poll_us(): a full
                        * batch need not wake it either */
  bool lean;           /* publish_plain may take a plain event: started,
                        * not closing, wire mode, no coalescing, a timer */
  _Atomic bool early; /* lean's lasting part (wire mode, no coalescing, a
                        * timer), set by start and never changed after: a
                        * plain event is worth encoding before the lock.
                        * Read without it, so atomic (relaxed: a publish
                        * that races start and reads false only encodes
                        * under the lock, and one before start is refused
                        * under it) */
  size_t room_waiters;
  uint64_t flush_target; /* send at once while sent_events < this */
  evq q[2];
  evq *fill;
  kvbm_publisher_stats st; /* accepted is also the last id given */

  /* Wire mode (every sink takes bytes): events are encoded once, when
   * published, into the batch buffer they leave in, and the thread only
   * frames batches in place. Set at start. */
  bool wire;
  kvbm_event_encoder_config ecfg;
  wpool *pool;
  atomic_size_t chunk_first; /* a fresh chunk's buffer (chunk_room): the
                              * largest batch sent so far, 64 KiB at least */
  run runs[2];         /* coalescing (lock held): [0] stores, [1] removes */
  int first;           /* the one opened first while both are open */
  size_t held;         /* bytes reserved in the open chunk for open runs */

  /* the thread's own */
  kvbm_event_encoder *enc;
  kvbm_event *scratch;
  size_t scratch_cap;
  wchunk **out;        /* wire mode: the batches taken to send */
  size_t nout, capout;
};

/* ------------------------------------------------------------ wire pool */

static void chunk_free(wchunk *c) {
  free(c->data);
  free(c);
}

static void pool_destroy(wpool *pl) {
  pthread_mutex_destroy(&pl->mu);
  free(pl);
}

static wpool *pool_new(void) {
  wpool *pl = calloc(1, sizeof *pl);
  if (pl) pthread_mutex_init(&pl->mu, NULL);
  return pl;
}

/* A chunk for a new batch, from the free list or new; NULL: no memory. */
static wchunk *chunk_get(wpool *pl) {
  pthread_mutex_lock(&pl->mu);
  wchunk *c = pl->free;
  if (c) {
    pl->free = c->next;
    pl->nfree--;
  } else if ((c = calloc(1, sizeof *c))) {
    c->pool = pl;
    pl->live++;
  }
  pthread_mutex_unlock(&pl->mu);
  if (!c) return NULL;
  c->next = NULL;
  c->len = c->n = c->cost = c->pub = 0;
  atomic_store_explicit(&c->refs, 1, memory_order_relaxed); /* the queue's */
  return c;
}

static void chunk_retain(void *owner) {
  atomic_fetch_add_explicit(&((wchunk *)owner)->refs, 1, memory_order_relaxed);
}

/* Gives back one reference (a zmq_free_fn: ZMQ's I/O thread calls it
 * when it has written the message); the last one returns the chunk to
 * its pool, or frees it (the pool full, the buffer large, the publisher
 * gone: then the last chunk frees the pool too). */
static void chunk_release(void *data, void *owner) {
  (void)data;
  wchunk *c = owner;
  if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1) return;
  wpool *pl = c->pool;
  pthread_mutex_lock(&pl->mu);
  bool drop = pl->closed || pl->nfree >= POOL_KEEP || c->cap > POOL_KEEP_BYTES;
  if (drop) {
    pl->live--;
  } else {
    c->next = pl->free;
    pl->free = c;
    pl->nfree++;
  }
  bool last = pl->closed && pl->live == 0;
  pthread_mutex_unlock(&pl->mu);
  if (drop) chunk_free(c);
  if (last) pool_destroy(pl);
}

/* The publisher lets go of its pool: free chunks are freed now, those
 * ZMQ still holds when they come back. */
static void pool_close(wpool *pl) {
  if (!pl) return;
  pthread_mutex_lock(&pl->mu);
  pl->closed = true;
  wchunk *f = pl->free;
  pl->free = NULL;
  pl->live -= pl->nfree;
  pl->nfree = 0;
  bool last = pl->live == 0;
  pthread_mutex_unlock(&pl->mu);
  while (f) {
    wchunk *next = f->next;
    chunk_free(f);
    f = next;
  }
  if (last) pool_destroy(pl);
}

kvbm_publisher_config kvbm_publisher_config_default(void) {
  return (kvbm_publisher_config){.dp_rank = 0,
                                  .max_batch_events = 256,
                                  .max_batch_delay_us = 1000,
                                  .queue_events = 65536,
                                  .queue_bytes = (size_t)64 << 20,
                                  .overflow = KVBM_OVERFLOW_BLOCK,
                                  .form = KVBM_FORM_MAP,
                                  .signed_hashes = false};
}

kvbm_zmq_sink_config kvbm_zmq_sink_config_default(const char *endpoint) {
  return (kvbm_zmq_sink_config){.endpoint = endpoint, .mode = KVBM_ZMQ_AUTO, .topic = NULL,
                                 .replay_endpoint = NULL, .replay_batches = 10000,
                                 .hwm = 100000, .linger_ms = 2000};
}

int kvbm_publisher_create(const kvbm_publisher_config *opts, kvbm_publisher **out,
                       kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: NULL out");
  kvbm_publisher_config o = opts ? *opts : kvbm_publisher_config_default();
  if (o.max_batch_events == 0 || o.max_batch_events > UINT32_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: max_batch_events %zu not in 1..2^32-1",
                          o.max_batch_events);
  if (o.queue_events < o.max_batch_events)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: publisher: queue_events %zu below max_batch_events %zu",
                          o.queue_events, o.max_batch_events);
  if (o.queue_bytes == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: queue_bytes is 0");
  if (o.overflow != KVBM_OVERFLOW_BLOCK && o.overflow != KVBM_OVERFLOW_DROP)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: unknown overflow policy %d",
                          (int)o.overflow);
  if (o.form != KVBM_FORM_POSITIONAL && o.form != KVBM_FORM_MAP)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: unknown form %d", (int)o.form);
  kvbm_publisher *p = calloc(1, sizeof *p);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "events: publisher: out of memory");
  p->o = o;
  p->fill = &p->q[0];
  atomic_init(&p->chunk_first, CHUNK_FIRST_BYTES);
  p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->efd < 0) {
    free(p);
    return kvbm_error_set(err, KVBM_EIO, "events: publisher: eventfd: %s", strerror(errno));
  }
  p->ecfg = (kvbm_event_encoder_config){.form = o.form, .signed_hashes = o.signed_hashes};
  int rc = kvbm_event_encoder_create(&p->ecfg, &p->enc, err);
  if (rc) {
    close(p->efd);
    free(p);
    return rc;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&p->room, &ca);
  pthread_cond_init(&p->done, &ca);
  pthread_condattr_destroy(&ca);
  *out = p;
  return KVBM_OK;
}

static int add_sink(kvbm_publisher *p, ev_sink *s) {
  p->sinks[p->nsinks++] = s;
  return KVBM_OK;
}

static int sink_slot_check(kvbm_publisher *p, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: NULL");
  if (p->started)
    return kvbm_error_set(err, KVBM_ESTATE, "events: publisher: sinks must be added before start");
  if (p->nsinks == MAX_SINKS)
    return kvbm_error_set(err, KVBM_ENOSPC, "events: publisher: at most %d sinks", MAX_SINKS);
  return KVBM_OK;
}

int kvbm_publisher_add_callback(kvbm_publisher *pub, kvbm_batch_callback fn, void *user,
                                kvbm_error *err) {
  int rc = sink_slot_check(pub, err);
  ev_sink *s;
  if (rc || (rc = kvbm__sink_callback_create(fn, user, &s, err))) return rc;
  return add_sink(pub, s);
}

int kvbm_publisher_add_zmq(kvbm_publisher *pub, const kvbm_zmq_sink_config *opts,
                           kvbm_error *err) {
  int rc = sink_slot_check(pub, err);
  if (rc) return rc;
  if (!pub->zctx && !(pub->zctx = zmq_ctx_new()))
    return kvbm_error_set(err, KVBM_EIO, "events: publisher: zmq context: %s", zmq_strerror(errno));
  ev_sink *s;
  if ((rc = kvbm__sink_zmq_create(pub->zctx, opts, &s, err))) return rc;
  return add_sink(pub, s);
}

int kvbm_publisher_add_nats(kvbm_publisher *pub, const char *url, const char *subject,
                            kvbm_error *err) {
  int rc = sink_slot_check(pub, err);
  ev_sink *s;
  if (rc || (rc = kvbm__sink_nats_create(url, subject, &s, err))) return rc;
  return add_sink(pub, s);
}

int kvbm_publisher_add_jetstream(kvbm_publisher *pub, const kvbm_jetstream_config *cfg,
                                 kvbm_error *err) {
  int rc = sink_slot_check(pub, err);
  ev_sink *s;
  if (rc || (rc = kvbm__sink_jetstream_create(cfg, &s, err))) return rc;
  return add_sink(pub, s);
}

int kvbm_publisher_zmq_endpoint(const kvbm_publisher *pub, size_t sink_index, bool replay,
                                char *buf, size_t cap) {
  if (!pub || !buf || cap == 0) return KVBM_EINVAL;
  if (sink_index >= pub->nsinks || !pub->sinks[sink_index]->endpoint) return KVBM_ENOTFOUND;
  const char *ep = pub->sinks[sink_index]->endpoint(pub->sinks[sink_index], replay);
  if (!ep) return KVBM_ENOTFOUND;
  if (strlen(ep) >= cap) return KVBM_ETOOLONG;
  memcpy(buf, ep, strlen(ep) + 1);
  return KVBM_OK;
}

/* ------------------------------------------------------------- producer */

static void wake(kvbm_publisher *p) { /* with p->mu held */
  if (!p->waiting) return;
  p->waiting = false;
  uint64_t one = 1;
  ssize_t w = write(p->efd, &one, sizeof one);
  (void)w; /* a full eventfd counter still wakes the thread */
}

/* Fills z (its len[] only when some part is present). */
static void measure(const kvbm_event *ev, vsize *z) {
  z->total = ev->num_block_hashes * 8 + ev->num_tokens * 4;
  z->vars = 0;
  /* the common event (the pool link's, an engine's plain store) has none */
  if (!((uintptr_t)ev->medium_name | (uintptr_t)ev->lora_name | (uintptr_t)ev->cache_salt |
        (uintptr_t)ev->kv_cache_spec_kind | (uintptr_t)ev->locality |
        (uintptr_t)ev->ownership | (uintptr_t)ev->extra_keys | (uintptr_t)ev->extras))
    return;
  for (int v = 0; v < NVAR; v++) {
    z->len[v] = var_len(ev, v);
    z->total += z->len[v];
    if (z->len[v]) z->vars |= (uint8_t)(1u << v);
  }
}

/* Appends a copy of ev, measured as z, to q (lock held). */
static int q_append(evq *q, const kvbm_event *ev, const vsize *z, int32_t dp_rank) {
  /* The arenas grow from 64 elements, doubling; any failure (memory, or
   * a size past the address space) is KVBM_ENOMEM, the queue unchanged. */
  if (kvbm__vec_reserve_of(&q->ev, &q->cap, q->n + 1, 64, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&q->h, &q->caph, q->nh + ev->num_block_hashes + 1, 64,
                           KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&q->t, &q->capt, q->nt + ev->num_tokens + 1, 64, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  qev *x = &q->ev[q->n];
  x->ev = *ev;
  x->dp_rank = dp_rank;
  x->vars = z->vars;
  x->h_off = q->nh;
  x->t_off = q->nt;
  if (ev->num_block_hashes) memcpy(q->h + q->nh, ev->block_hashes, ev->num_block_hashes * 8);
  if (ev->num_tokens) memcpy(q->t + q->nt, ev->token_ids, ev->num_tokens * 4);
  q->nh += ev->num_block_hashes;
  q->nt += ev->num_tokens;
  if (z->vars) {
    size_t sneed = 1;
    for (int v = 0; v < NVAR; v++) sneed += z->len[v];
    if (kvbm__vec_reserve_of(&q->s, &q->caps, q->ns + sneed, 64, KVBM__VEC_NO_LIMIT))
      return KVBM_ENOMEM;
    for (int v = 0; v < NVAR; v++) {
      const void **f = var_field(&x->ev, v);
      if (z->len[v]) {
        memcpy(q->s + q->ns, *f, z->len[v]);
        x->v_off[v] = q->ns;
        q->ns += z->len[v];
      }
      *f = NULL; /* the caller's memory: not to be read once queued */
    }
  }
  q->bytes += z->total;
  q->n++;
  return KVBM_OK;
}

/* Room for `need` bytes in chunk c's buffer. An empty one (a chunk from
 * the pool, or new) that is too small is given at once the size of the
 * largest batch sent so far (chunk_first, set by the thread) rather than
 * doubling from 64 KiB and copying what it holds each time: a K = 16 map
 * batch is ~220 KiB, three reallocs and ~190 KiB of copies per batch
 * whenever the pool is out of grown chunks (subscribers lagging, more
 * than POOL_KEEP batches in ZMQ's hands). Callgrind: K = 16 ~8
 * instructions a block under valgrind, where the pool always runs out. */
static int chunk_room(kvbm_publisher *p, wchunk *c, size_t need) {
  size_t first;
  if (c->len == 0 &&
      (need > c->cap || c->cap < (first = atomic_load_explicit(&p->chunk_first,
                                                               memory_order_relaxed)))) {
    first = atomic_load_explicit(&p->chunk_first, memory_order_relaxed);
    size_t cap = need > first ? need : first;
    uint8_t *d = malloc(cap);
    if (!d) return KVBM_ENOMEM;
    free(c->data);
    c->data = d;
    c->cap = cap;
    return KVBM_OK;
  }
  if (need <= c->cap) return KVBM_OK;
  return kvbm__vec_reserve_of(&c->data, &c->cap, need, CHUNK_FIRST_BYTES, KVBM__VEC_NO_LIMIT);
}

/* Wire mode: the open chunk of q for an event of at most `bound` bytes
 * and rank dp_rank, room for it reserved (lock held): the last one, or a
 * new one when that is full or of another rank. NULL: no memory, q
 * unchanged. */
static wchunk *q_chunk(kvbm_publisher *p, evq *q, size_t bound, int32_t dp_rank) {
  wchunk *c = q->nch ? q->ch[q->nch - 1] : NULL;
  bool fresh = !c || c->pub >= p->o.max_batch_events || c->dp_rank != dp_rank;
  if (fresh) {
    if (kvbm__vec_reserve_of(&q->ch, &q->capch, q->nch + 1, 16, KVBM__VEC_NO_LIMIT) ||
        !(c = chunk_get(p->pool)))
      return NULL;
    c->dp_rank = dp_rank;
  }
  /* room for the head before the events, this event, the rank after */
  if (bound > SIZE_MAX / 4 - c->len ||
      chunk_room(p, c, KVBM__EVENT_HEAD_MAX + c->len + bound + KVBM__MP_SCALAR_MAX)) {
    if (fresh) chunk_release(NULL, c); /* never queued: back to the pool */
    return NULL;
  }
  if (fresh) q->ch[q->nch++] = c;
  return c;
}

/* One publish of `cost` bytes accepted into chunk c of q (lock held):
 * its count of publishes and the queue's totals. `events` is how many
 * events the publish added to the wire (0 when it joined a coalesced
 * run). */
static inline void q_count(evq *q, wchunk *c, size_t cost, unsigned events) {
  c->n += events;
  c->pub++;
  c->cost += cost;
  q->bytes += cost;
  q->n++;
}

/* Wire mode: encodes ev into the open batch of q (lock held). Nothing of
 * the caller's memory is kept: the bytes are the event. */
static int q_append_wire(kvbm_publisher *p, evq *q, const kvbm_event *ev, size_t cost,
                         int32_t dp_rank) {
  wchunk *c = q_chunk(p, q, kvbm__event_wire_bound(ev), dp_rank);
  if (!c) return KVBM_ENOMEM;
  uint8_t *at = c->data + KVBM__EVENT_HEAD_MAX + c->len;
  c->len += (size_t)(kvbm__event_put(at, ev, &p->ecfg) - at);
  q_count(q, c, cost, 1);
  return KVBM_OK;
}

/* q_append_wire for a plain event (plain_ok): its bound from two counts
 * (plain_ok has ruled out every name and extra), the open chunk taken
 * when it has room with three compares (q_chunk only for a new chunk or
 * a larger buffer), and the template encoder. Per K = 1 publish this
 * was ~43 instructions of bound and ~40 of q_chunk (callgrind). */
static int q_append_plain(kvbm_publisher *p, evq *q, const kvbm_event *ev, size_t cost,
                          int32_t dp_rank) {
  size_t bound = kvbm__event_plain_bound(ev->num_block_hashes, ev->num_tokens);
  wchunk *c = q->nch ? q->ch[q->nch - 1] : NULL;
  if (!c || c->pub >= p->o.max_batch_events || c->dp_rank != dp_rank ||
      c->cap < KVBM__EVENT_HEAD_MAX + c->len + bound + KVBM__MP_SCALAR_MAX) {
    if (!(c = q_chunk(p, q, bound, dp_rank))) return KVBM_ENOMEM;
  }
  uint8_t *at = c->data + KVBM__EVENT_HEAD_MAX + c->len;
  c->len += (size_t)(kvbm__event_put_plain(at, ev, &p->ecfg) - at);
  q_count(q, c, cost, 1);
  return KVBM_OK;
}

/* ----------------------------------------------------------- coalescing */

/* Whether ev may start or join a run: one block, a BlockRemoved or a
 * BlockStored of one whole block (or no tokens), with nothing a run does
 * not keep (names, extras, token pairs). */
static bool run_plain(const kvbm_event *ev, bool plain) {
  if (ev->num_block_hashes != 1) return false;
  if (plain) /* plain_ok: no names but the kind, which plain_ok refuses too */
    return ev->type == KVBM_EVENT_REMOVED || ev->num_tokens == ev->block_size || !ev->num_tokens;
  if (ev->medium_name || ev->lora_name || ev->cache_salt || ev->locality || ev->ownership ||
      ev->extra_keys || ev->extras || ev->num_extras)
    return false;
  if (ev->type == KVBM_EVENT_REMOVED) return true;
  return ev->type == KVBM_EVENT_STORED && !ev->token_pairs &&
         (ev->num_tokens == ev->block_size || ev->num_tokens == 0) &&
         (!ev->kv_cache_spec_kind || strlen(ev->kv_cache_spec_kind) < RUN_KIND_MAX);
}

static bool same_kind(const char *a, const char *b) {
  return a == b || (a && b && !strcmp(a, b));
}

/* Whether plain-or-not ev continues open run r: same type, medium, group
 * and rank, room in the batch; a store also chains (its parent is the
 * run's last hash) with the same block size, LoRA, spec and tokens
 * present or not, so that the run is exactly the event vLLM would send
 * for those blocks. */
static bool run_extends(const kvbm_publisher *p, const run *r, const kvbm_event *ev,
                        int32_t dp_rank, bool plain) {
  const kvbm_event *a = &r->ev;
  if (!r->open || ev->type != a->type || ev->medium != a->medium ||
      ev->has_group_idx != a->has_group_idx || (a->has_group_idx && ev->group_idx != a->group_idx) ||
      r->c->dp_rank != dp_rank || r->c->pub >= p->o.max_batch_events || !run_plain(ev, plain))
    return false;
  if (ev->type == KVBM_EVENT_REMOVED) return true;
  return ev->has_parent && ev->parent_hash == r->h[r->nh - 1] && ev->block_size == a->block_size &&
         (ev->num_tokens == 0) == (r->nt == 0) && ev->has_lora_id == a->has_lora_id &&
         (!a->has_lora_id || ev->lora_id == a->lora_id) &&
         ev->has_sliding_window == a->has_sliding_window &&
         (!a->has_sliding_window || ev->sliding_window == a->sliding_window) &&
         same_kind(ev->kv_cache_spec_kind, a->kv_cache_spec_kind);
}

/* Room for one more block of `ntok` tokens in run r's arrays and, with
 * `more` bytes of wire, in chunk c beside what the open runs hold there
 * (so that closing never fails). */
static int run_reserve(kvbm_publisher *p, run *r, wchunk *c, size_t ntok, size_t more) {
  size_t need = c ? KVBM__EVENT_HEAD_MAX + c->len + p->held + more + KVBM__MP_SCALAR_MAX : 0;
  /* the usual case, the room there already: three compares */
  if (r->nh + 1 <= r->caph && r->nt + ntok <= r->capt && (!c || need <= c->cap)) return KVBM_OK;
  if (kvbm__vec_reserve_of(&r->h, &r->caph, r->nh + 1, 64, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&r->t, &r->capt, r->nt + ntok, 1024, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  if (c && kvbm__vec_reserve_of(&c->data, &c->cap, need, CHUNK_FIRST_BYTES, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  return KVBM_OK;
}

/* The bytes one block of ev adds to a run (event_bound's share of a
 * hash and of its tokens). */
static size_t run_more(const kvbm_event *ev) { return 9 + 5 * ev->num_tokens; }

static unsigned bloom_bit(uint64_t h) { return (unsigned)((h * 0x9e3779b97f4a7c15ull) >> 54); }

/* Appends ev's block (room reserved) to run r. */
static void run_put(kvbm_publisher *p, run *r, const kvbm_event *ev) {
  uint64_t h = ev->block_hashes[0];
  unsigned b = bloom_bit(h);
  r->bloom[b >> 6] |= 1ull << (b & 63);
  r->h[r->nh++] = h;
  if (ev->num_tokens) memcpy(r->t + r->nt, ev->token_ids, ev->num_tokens * 4);
  r->nt += ev->num_tokens;
  r->bound += run_more(ev);
  p->held += run_more(ev);
}

/* Whether hash h is in open run r (the filter first, then a scan). */
static bool run_has(const run *r, uint64_t h) {
  unsigned b = bloom_bit(h);
  if (!r->open || !(r->bloom[b >> 6] >> (b & 63) & 1)) return false;
  for (size_t i = 0; i < r->nh; i++)
    if (r->h[i] == h) return true;
  return false;
}

/* Encodes open run r into its chunk, as one event (lock held). */
static void run_close(kvbm_publisher *p, run *r) {
  if (!r->open) return;
  kvbm_event ev = r->ev;
  ev.block_hashes = r->h;
  ev.num_block_hashes = r->nh;
  ev.token_ids = r->nt ? r->t : NULL;
  ev.num_tokens = r->nt;
  uint8_t *at = r->c->data + KVBM__EVENT_HEAD_MAX + r->c->len;
  /* a run holds no names, salt, extras or pairs (run_plain): without a
   * kind and with a medium of its own it is a plain event */
  bool plain = !ev.kv_cache_spec_kind && (unsigned)ev.medium < KVBM_MEDIUM_OTHER;
  r->c->len += (size_t)((plain ? kvbm__event_put_plain(at, &ev, &p->ecfg)
                               : kvbm__event_put(at, &ev, &p->ecfg)) - at);
  p->held -= r->bound;
  r->open = false;
  r->nh = r->nt = 0;
}

/* Closes the open runs in the order they opened (lock held). */
static void runs_close(kvbm_publisher *p) {
  run_close(p, &p->runs[p->first]);
  run_close(p, &p->runs[1 - p->first]);
}

/* Opens run t with plain event ev (lock held): in the other open run's
 * chunk (the caller checked it has room and the rank), else in the open
 * chunk of q. It counts there as one wire event from now on, encoded when
 * it closes, after the other run when that one opened first. */
static int run_start(kvbm_publisher *p, evq *q, const kvbm_event *ev, int t, int32_t dp_rank) {
  run *r = &p->runs[t], *o = &p->runs[1 - t];
  r->nh = r->nt = 0;
  if (run_reserve(p, r, NULL, ev->num_tokens, 0)) return KVBM_ENOMEM;
  r->ev = *ev;
  r->ev.block_hashes = NULL;
  r->ev.token_ids = NULL;
  r->ev.num_block_hashes = r->ev.num_tokens = 0;
  if (ev->kv_cache_spec_kind) {
    memcpy(r->kind, ev->kv_cache_spec_kind, strlen(ev->kv_cache_spec_kind) + 1);
    r->ev.kv_cache_spec_kind = r->kind;
  }
  size_t head = kvbm__event_wire_bound(&r->ev); /* without blocks: run_put adds each */
  wchunk *c;
  if (o->open) {
    c = o->c;
    if (kvbm__vec_reserve_of(&c->data, &c->cap,
                             KVBM__EVENT_HEAD_MAX + c->len + p->held + head + run_more(ev) +
                                 KVBM__MP_SCALAR_MAX, CHUNK_FIRST_BYTES, KVBM__VEC_NO_LIMIT))
      return KVBM_ENOMEM;
  } else if (!(c = q_chunk(p, q, head + run_more(ev), dp_rank))) {
    return KVBM_ENOMEM;
  }
  memset(r->bloom, 0, sizeof r->bloom);
  r->c = c;
  r->bound = head;
  p->held += head;
  run_put(p, r, ev);
  if (!o->open) p->first = t;
  r->open = true;
  c->n++;
  return KVBM_OK;
}

/* Coalescing (lock held; `plain`: plain_ok(ev)). A store and a remove
 * run may be open at once, in one batch: the pool link's stream at
 * capacity alternates evict and register (W1: remove, store, remove,
 * ...), and only consecutive events would never merge there. The runs
 * leave in the order they opened, which reorders the two types, safely
 * for every consumer's final state: only the same hash stored and
 * removed depends on order, and a block that joins the run that leaves
 * first while its hash is in the other (removed, then stored again, or
 * the reverse) closes both first. Anything else that does not join
 * closes both. */
static int q_append_coalesce(kvbm_publisher *p, evq *q, const kvbm_event *ev, size_t cost,
                             int32_t dp_rank, bool plain) {
  int t = ev->type == KVBM_EVENT_STORED ? 0 : ev->type == KVBM_EVENT_REMOVED ? 1 : -1;
  if (t < 0 || !run_plain(ev, plain)) {
    runs_close(p);
    return q_append_wire(p, q, ev, cost, dp_rank);
  }
  run *r = &p->runs[t], *o = &p->runs[1 - t];
  run *any = r->open ? r : o->open ? o : NULL;
  if (any && (any->c->dp_rank != dp_rank || any->c->pub >= p->o.max_batch_events ||
              (r->open && !run_extends(p, r, ev, dp_rank, plain)) ||
              (r->open && o->open && p->first == t && run_has(o, ev->block_hashes[0]))))
    runs_close(p);
  if (r->open) {
    if (run_reserve(p, r, r->c, ev->num_tokens, run_more(ev))) return KVBM_ENOMEM;
    run_put(p, r, ev);
  } else {
    int rc = run_start(p, q, ev, t, dp_rank);
    if (rc) return rc;
  }
  q_count(q, r->c, cost, 0);
  return KVBM_OK;
}

/* Points a queued event's arrays and parts at q's arenas again. */
static void q_event(const evq *q, const qev *x, kvbm_event *e) {
  *e = x->ev;
  e->block_hashes = e->num_block_hashes ? q->h + x->h_off : NULL;
  e->token_ids = e->num_tokens ? q->t + x->t_off : NULL;
  for (int v = 0; x->vars >> v; v++)
    if (x->vars >> v & 1) *var_field(e, v) = q->s + x->v_off[v];
}

/* What of `ev` goes on the wire for its type (a clear carries nothing, a
 * remove no tokens, names or salt), as the codec reads it back. */
static kvbm_event own_fields(const kvbm_event *ev) {
  kvbm_event e = *ev;
  if (e.type == KVBM_EVENT_CLEARED) return (kvbm_event){.type = KVBM_EVENT_CLEARED};
  if (e.type == KVBM_EVENT_REMOVED) {
    e.has_parent = e.has_lora_id = e.token_pairs = e.has_sliding_window = false;
    e.token_ids = NULL;
    e.num_tokens = 0;
    e.block_size = 0;
    e.lora_name = e.cache_salt = e.kv_cache_spec_kind = NULL;
    e.extra_keys = NULL;
    e.extra_keys_len = 0;
  }
  return e;
}

static int check_publish(const kvbm_publisher *p, const kvbm_event *ev, kvbm_error *err) {
  switch (ev->type) {
    case KVBM_EVENT_STORED:
      if (ev->num_block_hashes == 0 || ev->block_size == 0)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "events: publish: BlockStored needs blocks and a block size");
      break;
    case KVBM_EVENT_REMOVED:
      if (ev->num_block_hashes == 0)
        return kvbm_error_set(err, KVBM_EINVAL, "events: publish: BlockRemoved needs blocks");
      break;
    case KVBM_EVENT_CLEARED: return KVBM_OK;
    default:
      return kvbm_error_set(err, KVBM_EINVAL, "events: publish: unknown event type %d",
                            (int)ev->type);
  }
  /* what the encoder would refuse is refused here, where the caller sees
   * it, and never fails a whole batch on the thread */
  kvbm_event_encoder_config ec = {.form = p->o.form, .signed_hashes = p->o.signed_hashes};
  return kvbm_event_check(ev, &ec, err);
}

/* The usual event (the pool link's, an engine's plain store or remove):
 * no names, extras or pairs, a medium of its own, and valid as it is, by
 * the rules of kvbm_event_check and check_publish for such an event. It
 * is then taken without those calls, the measure and the copy that strips
 * a remove (it has nothing to strip that the wire would carry): about a
 * third of a one-block publish (callgrind). Anything else takes the full
 * path, which also names what is wrong. */
static inline __attribute__((always_inline)) bool plain_ok(const kvbm_event *ev) {
  if (((uintptr_t)ev->medium_name | (uintptr_t)ev->lora_name | (uintptr_t)ev->cache_salt |
       (uintptr_t)ev->kv_cache_spec_kind | (uintptr_t)ev->locality | (uintptr_t)ev->ownership |
       (uintptr_t)ev->extra_keys | (uintptr_t)ev->extras | ev->num_extras | ev->extras_len |
       ev->token_pairs) ||
      (unsigned)ev->medium >= KVBM_MEDIUM_OTHER || !ev->num_block_hashes || !ev->block_hashes ||
      (ev->num_block_hashes | ev->num_tokens) > UINT32_MAX)
    return false;
  if (ev->type == KVBM_EVENT_REMOVED) return true;
  return ev->type == KVBM_EVENT_STORED && ev->block_size && (ev->token_ids || !ev->num_tokens);
}

/* A plain event's share of the queue's byte bound: its hashes, and its
 * tokens when it is a store (a remove's go nowhere). measure() counts the
 * same for any other event, whose fields are stripped first. */
static inline size_t plain_cost(const kvbm_event *ev) {
  return ev->num_block_hashes * 8 + (ev->type == KVBM_EVENT_STORED ? ev->num_tokens * 4 : 0);
}

/* What a publish needs before the lock: whether ev0 is plain (then its
 * measure is two counts), else its check (naming what is wrong) and, for
 * a remove or clear, the copy that drops what its type does not carry
 * (into *stripped, *evp pointing at it) and its measure; then the byte
 * bound's check. Inlined: as a call it cost ~30 instructions a publish
 * more (callgrind). */
static inline __attribute__((always_inline)) int
publish_prep(const kvbm_publisher *p, const kvbm_event *ev0, kvbm_event *stripped,
             const kvbm_event **evp, vsize *z, bool *plain, kvbm_error *err) {
  int rc;
  *evp = ev0;
  *plain = plain_ok(ev0);
  if (*plain) {
    z->vars = 0;
    z->total = plain_cost(ev0);
  } else {
    if ((rc = check_publish(p, ev0, err))) return rc;
    /* a store goes as it is; what a remove or clear does not carry is dropped */
    if (ev0->type != KVBM_EVENT_STORED) {
      *stripped = own_fields(ev0);
      *evp = stripped;
    }
    measure(*evp, z);
  }
  if (z->total > p->o.queue_bytes)
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "events: publish: an event of %zu bytes exceeds queue_bytes %zu",
                          z->total, p->o.queue_bytes);
  return KVBM_OK;
}

/* Accepts one prepared event (publish_prep: ev0 as given, evp what goes,
 * z its measure): waits for room or drops, appends, gives its id. The
 * lock is held on entry and on return (pthread_cond_wait lets go of it
 * while waiting for room), so that kvbm_publisher_publish_batch takes it
 * once for many events. */
static int accept_locked(kvbm_publisher *p, const kvbm_event *ev0, const kvbm_event *evp,
                         const vsize *z, bool plain, int32_t dp_rank, uint64_t *event_id,
                         kvbm_error *err) {
  if (!p->started)
    return kvbm_error_set(err, KVBM_ESTATE, "events: publish: publisher not started");
  size_t need = z->total;
  bool counted_block = false;
  for (;;) {
    if (p->closing)
      return kvbm_error_set(err, KVBM_ECLOSED, "events: publish: publisher is shutting down");
    evq *q = p->fill;
    if (q->n < p->o.queue_events && q->bytes + need <= p->o.queue_bytes) break;
    if (p->o.overflow == KVBM_OVERFLOW_DROP) {
      p->st.dropped++;
      return kvbm_error_set(err, KVBM_EAGAIN, "events: publish: queue full, event dropped");
    }
    if (!counted_block) p->st.blocked++;
    counted_block = true;
    p->room_waiters++;
    wake(p);
    pthread_cond_wait(&p->room, &p->mu);
    p->room_waiters--;
  }
  evq *q = p->fill;
  if (q->n == 0) q->first_ns = kvbm_clock_ns();
  uint64_t id = p->st.accepted + 1;
  kvbm_event stripped;
  if (!p->wire && evp == ev0 && ev0->type == KVBM_EVENT_REMOVED) {
    stripped = own_fields(ev0); /* a callback gets what the wire would carry */
    evp = &stripped;
  }
  int rc;
  if (p->wire) {
    rc = p->o.coalesce ? q_append_coalesce(p, q, evp, need, dp_rank, plain)
         : plain       ? q_append_plain(p, q, evp, need, dp_rank)
                       : q_append_wire(p, q, evp, need, dp_rank);
  } else {
    rc = q_append(q, evp, z, dp_rank);
    if (!rc) q->ev[q->n - 1].ev.event_id = id;
  }
  if (rc) return kvbm_error_set(err, rc, "events: publish: out of memory");
  p->st.accepted++;
  if (event_id) *event_id = id;
  if ((q->n == 1 && !p->armed) || (q->n >= p->o.max_batch_events && !p->streaming) ||
      p->o.max_batch_delay_us == 0)
    wake(p);
  return KVBM_OK;
}

static int publish_ranked(kvbm_publisher *p, const kvbm_event *ev0, int32_t dp_rank,
                          uint64_t *event_id, kvbm_error *err) {
  kvbm_event stripped;
  const kvbm_event *evp;
  vsize z;
  bool plain;
  int rc = publish_prep(p, ev0, &stripped, &evp, &z, &plain, err);
  if (rc) return rc;
  pthread_mutex_lock(&p->mu);
  rc = accept_locked(p, ev0, evp, &z, plain, dp_rank, event_id, err);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

/* The usual publish, lean (issue 22): a plain event (plain_ok) into a
 * wire-mode publisher that does not coalesce, whose open batch has room
 * for it and is not the queue's first event. Under the lock: one flag,
 * the two bounds, the open chunk's three compares, the encode, the
 * counts. Anything else (not started, closing, a full queue or batch, a
 * new chunk or a larger buffer, the first event that starts the timer)
 * lets go of the lock and goes publish_ranked's way, which decides
 * again: one more lock for ~1 event in max_batch_events. This left out
 * publish_ranked's dispatch, its room loop, its checks that the lean
 * flag sums up and most of its register saves: ~25 instructions a K = 1
 * publish (callgrind, docs/areas/events.md, Session 11). lean_append is
 * that step with the lock held (false: not taken, nothing changed), also
 * used by kvbm_publisher_publish_batch for each plain event of a group. */

/* The open chunk, when the lean step may append `room` bytes to it for
 * an event of byte cost `need` (lock held); NULL when not. */
static inline __attribute__((always_inline)) wchunk *
lean_chunk(kvbm_publisher *p, size_t need, size_t room, int32_t dp_rank) {
  evq *q = p->fill;
  wchunk *c = q->nch ? q->ch[q->nch - 1] : NULL;
  if (!p->lean || q->n == 0 || q->n >= p->o.queue_events || need > p->o.queue_bytes - q->bytes ||
      !c || c->pub >= p->o.max_batch_events || c->dp_rank != dp_rank ||
      c->cap < KVBM__EVENT_HEAD_MAX + c->len + room + KVBM__MP_SCALAR_MAX)
    return NULL;
  return c;
}

/* The lean step's end, its `len` bytes in c (lock held): counts, the id. */
static inline __attribute__((always_inline)) void
lean_count(kvbm_publisher *p, wchunk *c, size_t len, size_t need, uint64_t *id) {
  evq *q = p->fill;
  c->len += len;
  q_count(q, c, need, 1);
  *id = ++p->st.accepted;
  if (q->n >= p->o.max_batch_events && !p->streaming) wake(p);
}

static inline __attribute__((always_inline)) bool
lean_append(kvbm_publisher *p, const kvbm_event *ev, size_t need, int32_t dp_rank,
            uint64_t *id) {
  size_t bound = kvbm__event_plain_bound(ev->num_block_hashes, ev->num_tokens);
  wchunk *c = lean_chunk(p, need, bound, dp_rank);
  if (!c) return false;
  uint8_t *at = c->data + KVBM__EVENT_HEAD_MAX + c->len;
  lean_count(p, c, (size_t)(kvbm__event_put_plain(at, ev, &p->ecfg) - at), need, id);
  return true;
}

/* The lean step for an event encoded before the lock (`len` bytes at
 * `bytes`): a copy into the open chunk. */
static inline __attribute__((always_inline)) bool
lean_copy(kvbm_publisher *p, const uint8_t *bytes, size_t len, size_t need, int32_t dp_rank,
          uint64_t *id) {
  wchunk *c = lean_chunk(p, need, len, dp_rank);
  if (!c) return false;
  memcpy(c->data + KVBM__EVENT_HEAD_MAX + c->len, bytes, len);
  lean_count(p, c, len, need, id);
  return true;
}

/* A plain event whose bound is at most this is encoded before the lock,
 * on the producer's stack (a one-block store of 16 tokens: 495
 * bytes at most); a larger one is encoded under it, in place. It was 2048
 * (K <= 16) until the lent machine's 16 quiet cores, side by side with the
 * session's start, showed K = 16 slower (ours / raw ZMQ 0.64 [0.58-0.83]
 * -> 0.46 [0.38-0.52], publisher CPU 36 -> 48 ns a block event, 5 rounds):
 * likely because the copy of a large event writes its chunk's lines in one burst under
 * the lock, lines that ZMQ's I/O thread read on another core, where the
 * encode in place spread those requests among its own work. */
#define PLAIN_STACK 512
/* plain_ok bounds both counts by 2^32 - 1, so the bound cannot wrap and
 * pass the test above for a huge event */
_Static_assert(SIZE_MAX / 16 >= UINT32_MAX, "kvbm__event_plain_bound cannot overflow");

/* The usual publish. A one-block event is encoded *before* the lock,
 * into a buffer on this thread's stack, so that the producer holds p->mu only to
 * take the open chunk, copy the bytes in (a K = 1 map event is ~119
 * bytes), count them and give the id: the encode was most of the hold
 * (~160 of ~250 instructions at K = 1), and the publisher thread, which
 * wants the lock twice a batch, waited behind it (the convoy of
 * docs/areas/events.md, Session 11, second pass). Ids are still given
 * under the lock, at the append, so ids still follow the order in which
 * events enter the queue, across threads (events.h). When the lean step
 * does not take the event, publish_ranked decides again and encodes
 * under the lock (about one event in max_batch_events): the early encode
 * is then thrown away. A publisher that never takes the lean step (a
 * callback sink, coalescing) encodes nothing early (p->early). */
static inline __attribute__((always_inline)) int
publish_plain(kvbm_publisher *p, const kvbm_event *ev, uint64_t *event_id, kvbm_error *err) {
  size_t need = plain_cost(ev);
  uint64_t id;
  bool ok;
  if (atomic_load_explicit(&p->early, memory_order_relaxed) &&
      kvbm__event_plain_bound(ev->num_block_hashes, ev->num_tokens) <= PLAIN_STACK) {
    uint8_t buf[PLAIN_STACK];
    size_t len = (size_t)(kvbm__event_put_plain(buf, ev, &p->ecfg) - buf);
    pthread_mutex_lock(&p->mu);
    ok = lean_copy(p, buf, len, need, p->o.dp_rank, &id);
  } else {
    pthread_mutex_lock(&p->mu);
    ok = lean_append(p, ev, need, p->o.dp_rank, &id);
  }
  pthread_mutex_unlock(&p->mu);
  if (!ok) return publish_ranked(p, ev, p->o.dp_rank, event_id, err);
  if (event_id) *event_id = id;
  return KVBM_OK;
}

int kvbm_publisher_publish(kvbm_publisher *p, const kvbm_event *ev, uint64_t *event_id,
                           kvbm_error *err) {
  if (!p || !ev) return kvbm_error_set(err, KVBM_EINVAL, "events: publish: NULL argument");
  if (plain_ok(ev)) return publish_plain(p, ev, event_id, err);
  return publish_ranked(p, ev, p->o.dp_rank, event_id, err);
}

/* kvbm_publisher_publish_batch takes the lock once for up to this many
 * events, prepared (checked, measured) before it; a group's preparation
 * lives on the stack (~9 KiB). */
#define BATCH_GROUP 32

int kvbm_publisher_publish_batch(kvbm_publisher *p, const kvbm_event_batch *b, size_t *queued,
                                 kvbm_error *err) {
  if (queued) *queued = 0;
  if (!p || !b || (b->num_events && !b->events))
    return kvbm_error_set(err, KVBM_EINVAL, "events: publish_batch: NULL argument");
  int32_t rank = b->has_dp_rank ? b->dp_rank : p->o.dp_rank;
  int first = KVBM_OK;
  kvbm_error e2;
  kvbm_event strip[BATCH_GROUP];
  const kvbm_event *evp[BATCH_GROUP];
  vsize z[BATCH_GROUP];
  bool plain[BATCH_GROUP];
  for (size_t i = 0; i < b->num_events;) {
    /* prepare up to a group, stopping at a refused event so that the
     * first refusal reported is the first in the batch's order */
    size_t m = 0, left = b->num_events - i;
    int prc = KVBM_OK;
    while (m < left && m < BATCH_GROUP &&
           !(prc = publish_prep(p, &b->events[i + m], &strip[m], &evp[m], &z[m], &plain[m],
                                first ? &e2 : err)))
      m++;
    if (m) {
      pthread_mutex_lock(&p->mu);
      for (size_t j = 0; j < m; j++) {
        uint64_t id;
        if (plain[j] && lean_append(p, evp[j], z[j].total, rank, &id)) {
          if (queued) (*queued)++;
          continue;
        }
        int rc = accept_locked(p, &b->events[i + j], evp[j], &z[j], plain[j], rank, NULL,
                               first ? &e2 : err);
        if (rc == KVBM_ECLOSED || rc == KVBM_ESTATE) { /* nothing more will go */
          pthread_mutex_unlock(&p->mu);
          return rc;
        }
        if (rc && !first) first = rc;
        if (!rc && queued) (*queued)++;
      }
      pthread_mutex_unlock(&p->mu);
    }
    i += m;
    if (prc) { /* event i was refused before the lock */
      if (!first) first = prc;
      i++;
    }
  }
  return first;
}

int kvbm_publisher_publish_stored(kvbm_publisher *pub, const uint64_t *block_hashes,
                                  size_t num_blocks, const uint64_t *parent_hash,
                                  const uint32_t *token_ids, size_t num_tokens,
                                  uint32_t block_size, const int64_t *lora_id,
                                  kvbm_medium medium, uint64_t *event_id, kvbm_error *err) {
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_hashes = block_hashes,
                   .num_block_hashes = num_blocks, .token_ids = token_ids,
                   .num_tokens = num_tokens, .block_size = block_size, .medium = medium};
  if (parent_hash) ev.parent_hash = *parent_hash, ev.has_parent = true;
  if (lora_id) ev.lora_id = *lora_id, ev.has_lora_id = true;
  if (medium == KVBM_MEDIUM_OTHER)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publish_stored: OTHER needs kvbm_publisher_publish");
  return kvbm_publisher_publish(pub, &ev, event_id, err);
}

int kvbm_publisher_publish_removed(kvbm_publisher *pub, const uint64_t *block_hashes,
                                   size_t num_blocks, kvbm_medium medium, uint64_t *event_id,
                                   kvbm_error *err) {
  kvbm_event ev = {.type = KVBM_EVENT_REMOVED, .block_hashes = block_hashes,
                   .num_block_hashes = num_blocks, .medium = medium};
  if (medium == KVBM_MEDIUM_OTHER)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publish_removed: OTHER needs kvbm_publisher_publish");
  return kvbm_publisher_publish(pub, &ev, event_id, err);
}

int kvbm_publisher_publish_cleared(kvbm_publisher *pub, uint64_t *event_id, kvbm_error *err) {
  kvbm_event ev = {.type = KVBM_EVENT_CLEARED};
  return kvbm_publisher_publish(pub, &ev, event_id, err);
}

/* ---------------------------------------------------------------- stage */

/* A producer's stage (issue 22): its events encoded, outside the lock,
 * into a chunk of its own (a batch buffer from the publisher's pool, as
 * the queue's), and handed to the queue under one lock per hand-over
 * rather than one per event. What a publish pays per event is then the
 * plain check, the encode and a few stores; the lock, the queue's checks
 * and counts and the open chunk's checks are per hand-over. A full stage
 * (or one at least half a batch) goes into the queue as it is, a batch of
 * its own: its bytes are still written once, by the encoder, and read
 * once, by the kernel. A smaller one is copied into the queue's open
 * batch when that has room, so that frequent small hand-overs do not
 * make small messages. A staged event is not yet accepted: it has no id,
 * kvbm_publisher_flush does not see it and the thread's timer does not
 * run for it, so its owner hands it over (kvbm_publisher_stage_flush, or
 * the publish that fills the stage). */
typedef struct stage_ev {
  size_t end;  /* its bytes end here, after the chunk's head room */
  size_t cost; /* the byte bound's measure of it and every one before it */
} stage_ev;

struct kvbm_publisher_stage {
  kvbm_publisher *pub;
  bool direct;           /* struct mode or coalescing: publish at once */
  size_t max_events;     /* hand over when this many are staged */
  wchunk *c;             /* the staged events' msgpack; NULL: none yet */
  stage_ev *ev;
  size_t n, capn;
  size_t cost;           /* the byte bound's measure of the staged events */
};

int kvbm_publisher_stage_create(kvbm_publisher *pub, size_t max_events,
                                kvbm_publisher_stage **out, kvbm_error *err) {
  if (!pub || !out) return kvbm_error_set(err, KVBM_EINVAL, "events: stage: NULL argument");
  pthread_mutex_lock(&pub->mu);
  bool started = pub->started;
  pthread_mutex_unlock(&pub->mu);
  if (!started) return kvbm_error_set(err, KVBM_ESTATE, "events: stage: publisher not started");
  /* a stage is at most one batch: it may go into the queue as one */
  if (max_events == 0 || max_events > pub->o.max_batch_events)
    max_events = pub->o.max_batch_events;
  kvbm_publisher_stage *st = calloc(1, sizeof *st);
  if (!st) return kvbm_error_set(err, KVBM_ENOMEM, "events: stage: out of memory");
  st->pub = pub;
  st->direct = !pub->wire || pub->o.coalesce;
  st->max_events = max_events;
  *out = st;
  return KVBM_OK;
}

/* How many of the staged events from i on fit in q's bounds (lock held):
 * the most whose count and bytes fit. */
static size_t stage_fit(const kvbm_publisher *p, const kvbm_publisher_stage *st, const evq *q,
                        size_t i) {
  if (q->n >= p->o.queue_events) return 0;
  size_t k = st->n - i < p->o.queue_events - q->n ? st->n - i : p->o.queue_events - q->n;
  size_t before = i ? st->ev[i - 1].cost : 0, room = p->o.queue_bytes - q->bytes;
  while (k && st->ev[i + k - 1].cost - before > room) k--;
  return k;
}

/* Accounts k events of `cost` bytes just put into chunk c of q (lock
 * held), and wakes the thread when it has something new to do. */
static void stage_count(kvbm_publisher *p, evq *q, wchunk *c, size_t k, size_t cost) {
  size_t before = q->n;
  if (before == 0) q->first_ns = kvbm_clock_ns();
  c->n += k;
  c->pub += k;
  c->cost += cost;
  q->bytes += cost;
  q->n += k;
  p->st.accepted += k;
  if ((before == 0 && !p->armed) || q->n >= p->o.max_batch_events || p->o.max_batch_delay_us == 0)
    wake(p);
}

/* Copies staged events i..i+k-1 into q's open chunk (lock held), as far
 * as that chunk takes them (max_batch_events, its rank); returns how many
 * moved, 0 when out of memory. */
static size_t stage_copy(kvbm_publisher *p, kvbm_publisher_stage *st, evq *q, size_t i, size_t k) {
  wchunk *c = q->nch ? q->ch[q->nch - 1] : NULL;
  if (!c || c->pub >= p->o.max_batch_events || c->dp_rank != p->o.dp_rank)
    if (!(c = q_chunk(p, q, 0, p->o.dp_rank))) return 0;
  if (k > p->o.max_batch_events - c->pub) k = p->o.max_batch_events - c->pub;
  size_t from = i ? st->ev[i - 1].end : 0, bytes = st->ev[i + k - 1].end - from;
  size_t cost = st->ev[i + k - 1].cost - (i ? st->ev[i - 1].cost : 0);
  if (chunk_room(p, c, KVBM__EVENT_HEAD_MAX + c->len + bytes + KVBM__MP_SCALAR_MAX)) return 0;
  memcpy(c->data + KVBM__EVENT_HEAD_MAX + c->len,
         st->c->data + KVBM__EVENT_HEAD_MAX + from, bytes);
  c->len += bytes;
  stage_count(p, q, c, k, cost);
  return k;
}

/* Whether the whole stage goes into q as a batch of its own (lock held):
 * it fits the bounds, and it is at least half a batch or the open chunk
 * cannot take it. Then it is queued (the chunk and its events), with no
 * copy; false leaves everything as it was. */
static bool stage_put_whole(kvbm_publisher *p, kvbm_publisher_stage *st, evq *q) {
  size_t cost = st->ev[st->n - 1].cost;
  if (q->n + st->n > p->o.queue_events || cost > p->o.queue_bytes - q->bytes) return false;
  wchunk *o = q->nch ? q->ch[q->nch - 1] : NULL;
  if (st->n * 2 < p->o.max_batch_events && o && o->dp_rank == p->o.dp_rank &&
      o->pub + st->n <= p->o.max_batch_events)
    return false; /* small: copied into the open batch */
  if (q->nch == q->capch &&
      kvbm__vec_reserve_of(&q->ch, &q->capch, q->nch + 1, 16, KVBM__VEC_NO_LIMIT))
    return false;
  wchunk *c = st->c;
  q->ch[q->nch++] = c;
  c->n = c->pub = c->cost = 0;
  stage_count(p, q, c, st->n, cost);
  st->c = NULL;
  return true;
}

/* Hands every staged event to the queue under one lock (more only when
 * the queue is full and the policy blocks); the stage is empty after,
 * whatever happened: what did not go is counted in the error. */
static int stage_handover(kvbm_publisher_stage *st, kvbm_error *err) {
  kvbm_publisher *p = st->pub;
  size_t i = 0, n = st->n;
  int rc = KVBM_OK;
  bool counted_block = false;
  pthread_mutex_lock(&p->mu);
  while (i < n) {
    if (p->closing) {
      rc = kvbm_error_set(err, KVBM_ECLOSED,
                          "events: stage: publisher is shutting down, %zu staged events lost", n - i);
      break;
    }
    evq *q = p->fill;
    if (i == 0 && stage_put_whole(p, st, q)) break;
    size_t k = stage_fit(p, st, q, i);
    if (k == 0) {
      if (p->o.overflow == KVBM_OVERFLOW_DROP) {
        p->st.dropped += n - i;
        rc = kvbm_error_set(err, KVBM_EAGAIN, "events: stage: queue full, %zu events dropped",
                            n - i);
        break;
      }
      if (!counted_block) p->st.blocked++;
      counted_block = true;
      p->room_waiters++;
      wake(p);
      pthread_cond_wait(&p->room, &p->mu);
      p->room_waiters--;
      continue;
    }
    size_t moved = stage_copy(p, st, q, i, k);
    if (!moved) {
      rc = kvbm_error_set(err, KVBM_ENOMEM, "events: stage: out of memory, %zu events lost", n - i);
      break;
    }
    i += moved;
  }
  pthread_mutex_unlock(&p->mu);
  st->n = 0;
  st->cost = 0;
  if (st->c) st->c->len = 0; /* kept for the next events */
  return rc;
}

/* Records the event whose bytes end at `end` (after the head room) and
 * whose measure is `cost`; hands the stage over when it is full. */
static inline __attribute__((always_inline)) int stage_note(kvbm_publisher_stage *st, size_t end,
                                                            size_t cost, kvbm_error *err) {
  stage_ev *x = &st->ev[st->n];
  x->end = end;
  x->cost = st->cost += cost;
  if (++st->n < st->max_events) return KVBM_OK;
  return stage_handover(st, err);
}

static int stage_publish_general(kvbm_publisher_stage *st, const kvbm_event *ev, kvbm_error *err);

/* The usual staged event (issue 22, Session 11 second pass): a plain
 * one (plain_ok) into a stage whose buffer has room and whose event list
 * a slot, within the byte bound. Then: the checks, the encode, one store
 * of the length and the note; ~20 instructions a K = 1 event fewer than
 * the general step below (callgrind, docs/areas/events.md), which takes
 * everything else (a first event, a larger buffer, a refusal to name). */
int kvbm_publisher_stage_publish(kvbm_publisher_stage *st, const kvbm_event *ev, kvbm_error *err) {
  wchunk *c;
  if (st && ev && (c = st->c) && st->n < st->capn && plain_ok(ev)) {
    kvbm_publisher *p = st->pub;
    size_t total = plain_cost(ev);
    size_t len = c->len, bound = kvbm__event_plain_bound(ev->num_block_hashes, ev->num_tokens);
    if (total <= p->o.queue_bytes &&
        KVBM__EVENT_HEAD_MAX + len + bound + KVBM__MP_SCALAR_MAX <= c->cap) {
      uint8_t *at = c->data + KVBM__EVENT_HEAD_MAX;
      len = (size_t)(kvbm__event_put_plain(at + len, ev, &p->ecfg) - at);
      c->len = len;
      return stage_note(st, len, total, err);
    }
  }
  return stage_publish_general(st, ev, err);
}

static int stage_publish_general(kvbm_publisher_stage *st, const kvbm_event *ev, kvbm_error *err) {
  if (!st || !ev) return kvbm_error_set(err, KVBM_EINVAL, "events: stage: NULL argument");
  kvbm_publisher *p = st->pub;
  if (st->direct) return publish_ranked(p, ev, p->o.dp_rank, NULL, err);
  kvbm_event stripped;
  const kvbm_event *evp;
  vsize z;
  bool plain;
  int rc = publish_prep(p, ev, &stripped, &evp, &z, &plain, err);
  if (rc) return rc;
  size_t bound = plain ? kvbm__event_plain_bound(evp->num_block_hashes, evp->num_tokens)
                       : kvbm__event_wire_bound(evp);
  wchunk *c = st->c;
  bool fresh = !c;
  if (fresh) {
    if (!(c = st->c = chunk_get(p->pool)))
      return kvbm_error_set(err, KVBM_ENOMEM, "events: stage: out of memory");
    c->dp_rank = p->o.dp_rank;
  }
  size_t need = KVBM__EVENT_HEAD_MAX + c->len + bound + KVBM__MP_SCALAR_MAX;
  if (((fresh || need > c->cap) && (bound > SIZE_MAX / 4 - c->len || chunk_room(p, c, need))) ||
      (st->n == st->capn &&
       kvbm__vec_reserve_of(&st->ev, &st->capn, st->n + 1, 64, KVBM__VEC_NO_LIMIT)))
    return kvbm_error_set(err, KVBM_ENOMEM, "events: stage: out of memory");
  uint8_t *at = c->data + KVBM__EVENT_HEAD_MAX + c->len;
  c->len += (size_t)((plain ? kvbm__event_put_plain(at, evp, &p->ecfg)
                            : kvbm__event_put(at, evp, &p->ecfg)) - at);
  return stage_note(st, c->len, z.total, err);
}

int kvbm_publisher_stage_flush(kvbm_publisher_stage *st, kvbm_error *err) {
  if (!st) return kvbm_error_set(err, KVBM_EINVAL, "events: stage: NULL argument");
  return st->n ? stage_handover(st, err) : KVBM_OK;
}

size_t kvbm_publisher_stage_count(const kvbm_publisher_stage *st) { return st ? st->n : 0; }

void kvbm_publisher_stage_destroy(kvbm_publisher_stage *st) {
  if (!st) return;
  if (st->n) stage_handover(st, NULL);
  if (st->c) chunk_release(NULL, st->c); /* back to the pool */
  free(st->ev);
  free(st);
}

/* --------------------------------------------------------------- thread */

static void q_clear(evq *q) { q->n = q->nh = q->nt = q->ns = q->bytes = 0; }

/* How many events from `off` leave in one batch: up to max_batch_events
 * of one dp_rank (a relay keeps each engine batch's rank). */
static size_t batch_len(const kvbm_publisher *p, const evq *q, size_t off) {
  size_t n = q->n - off < p->o.max_batch_events ? q->n - off : p->o.max_batch_events;
  for (size_t k = 1; k < n; k++)
    if (q->ev[off + k].dp_rank != q->ev[off].dp_rank) return k;
  return n;
}

/* Wire mode (lock held): moves the batches to send from the fill queue
 * to p->out, all of them or (what == 1, a count trigger) all but an open
 * last one that is not full, which keeps waiting for its own trigger.
 * Returns the events moved. The arrays are swapped, not copied; p->out
 * always has room for one, which is where an open batch goes back to. */
static size_t take_wire(kvbm_publisher *p, evq *q, int what) {
  wchunk **arr = p->out;
  size_t cap = p->capout;
  p->out = q->ch;
  p->capout = q->capch;
  p->nout = q->nch;
  q->ch = arr;
  q->capch = cap;
  q->nch = 0;
  size_t n = q->n, cost = q->bytes;
  wchunk *last = p->nout ? p->out[p->nout - 1] : NULL;
  if (what == 1 && last && last->pub < p->o.max_batch_events) {
    p->nout--;
    q->ch[q->nch++] = last;
    n -= last->pub;
    cost -= last->cost;
  }
  q->n -= n;
  q->bytes -= cost;
  /* an open run leaves with its batch, encoded now */
  for (int t = 0; t < 2; t++)
    if (p->runs[t].open && !(q->nch && q->ch[q->nch - 1] == p->runs[t].c)) runs_close(p);
  return n;
}

/* The thread: a batch of `len` bytes was sent; fresh chunks start at
 * least that large (a power of two, at most POOL_KEEP_BYTES, which the
 * pool would not keep anyway). */
static void chunk_grow_hint(kvbm_publisher *p, size_t len) {
  size_t first = atomic_load_explicit(&p->chunk_first, memory_order_relaxed);
  if (len <= first || first >= POOL_KEEP_BYTES) return;
  while (first < len && first < POOL_KEEP_BYTES) first *= 2;
  atomic_store_explicit(&p->chunk_first, first, memory_order_relaxed);
}

/* Wire mode (no lock held): frames each batch taken in place (the head
 * written before its events, the dp_rank after) and hands its buffer to
 * every sink; the ZMQ sink keeps it (no copy) and gives it back when
 * sent. */
static void emit_wire(kvbm_publisher *p, uint64_t *seq, uint64_t *sink_errors) {
  for (size_t i = 0; i < p->nout; i++) {
    wchunk *c = p->out[i];
    kvbm_event_batch b = {.seq = (*seq)++, .ts = kvbm_clock_wall_seconds(), .dp_rank = c->dp_rank,
                          .has_dp_rank = true};
    uint8_t *events = c->data + KVBM__EVENT_HEAD_MAX;
    uint8_t *start = kvbm__event_head_before(events, b.ts, true, c->n);
    uint8_t *end = kvbm__mp_put_int(events + c->len, c->dp_rank);
    chunk_grow_hint(p, (size_t)(end - c->data));
    ev_payload pl = {.data = start, .len = (size_t)(end - start), .retain = chunk_retain,
                     .release = chunk_release, .owner = c};
    for (size_t s = 0; s < p->nsinks; s++) {
      ev_sink *k = p->sinks[s];
      int rc = k->send_owned ? k->send_owned(k, &b, &pl) : k->send(k, &b, pl.data, pl.len);
      if (rc) (*sink_errors)++;
    }
    chunk_release(start, c); /* the queue's reference */
  }
  p->nout = 0;
}

/* Sends the drained events as batches (no lock held). */
static void emit(kvbm_publisher *p, evq *q, uint64_t *seq, uint64_t *sink_errors) {
  if (kvbm__vec_reserve_of(&p->scratch, &p->scratch_cap, q->n, 64, KVBM__VEC_NO_LIMIT)) {
    /* cannot even list them: count each batch lost at every sink */
    for (size_t off = 0; off < q->n; off += batch_len(p, q, off)) {
      *sink_errors += p->nsinks;
      (*seq)++;
    }
    return;
  }
  kvbm_event *evs = p->scratch;
  for (size_t i = 0; i < q->n; i++) {
    q_event(q, &q->ev[i], &evs[i]);
    if (!evs[i].medium_name) evs[i].medium_name = kvbm_medium_name(evs[i].medium);
  }
  bool bytes = false;
  for (size_t s = 0; s < p->nsinks; s++) bytes |= p->sinks[s]->wants_bytes;
  for (size_t off = 0, n; off < q->n; off += n) {
    n = batch_len(p, q, off);
    kvbm_event_batch b = {.seq = (*seq)++, .ts = kvbm_clock_wall_seconds(), .dp_rank = q->ev[off].dp_rank,
                          .has_dp_rank = true, .events = evs + off, .num_events = n};
    const uint8_t *data = NULL;
    size_t len = 0;
    /* every event was checked in this form when it was published */
    bool encoded = !bytes || kvbm__event_encode_checked(p->enc, &b, &data, &len, NULL) == 0;
    for (size_t s = 0; s < p->nsinks; s++) {
      ev_sink *k = p->sinks[s];
      if (k->wants_bytes && !encoded) { (*sink_errors)++; continue; }
      if (k->send(k, &b, data, len)) (*sink_errors)++;
    }
  }
}

/* What is due (lock held): 0 nothing, 1 the full batches only, 2 all. */
static int due(kvbm_publisher *p, uint64_t now) {
  const evq *q = p->fill;
  if (q->n == 0) return 0;
  if (p->closing || p->room_waiters || p->st.sent_events < p->flush_target ||
      p->o.max_batch_delay_us == 0 ||
      (now > q->first_ns && now - q->first_ns >= (uint64_t)p->o.max_batch_delay_us * 1000u))
    return 2;
  return q->n >= p->o.max_batch_events ? 1 : 0;
}

/* Moves the events of `from` past `keep` to the (empty) `to`, so that a
 * count-triggered send takes full batches only and the rest keeps waiting
 * for its own trigger. Lock held. On ENOMEM everything stays in `from`. */
static void move_tail(evq *from, size_t keep, evq *to) {
  for (size_t i = keep; i < from->n; i++) {
    kvbm_event e;
    q_event(from, &from->ev[i], &e);
    vsize z;
    measure(&e, &z);
    if (q_append(to, &e, &z, from->ev[i].dp_rank)) {
      q_clear(to);
      return;
    }
  }
  to->first_ns = from->first_ns;
  from->n = keep; /* the arenas' tails are simply left unused */
}

/* The thread's way into the lock. A producer holds p->mu for each
 * publish (a K = 1 event's copy, a larger one's encode), up to a hundred
 * nanoseconds at a time, and
 * the thread wants it two or three times a batch. pthread_mutex_lock on
 * a held default mutex sleeps in the kernel at once (futex wait), and
 * from then on every unlock by the producer is a futex wake system call
 * until the sleeper, slow to run, wins the lock between two publishes:
 * time callgrind never sees (it runs one thread at a time), more of it
 * the more the threads truly run in parallel. So the thread first tries
 * a bounded number of times, pausing between tries, which covers a hold
 * of one encode. A failed trylock does not mark the lock as waited for,
 * so the producer's unlock makes no futex call, and the producer's lock
 * and unlock stay glibc's default-type fast path (an adaptive mutex did
 * the same spinning for ~11 more instructions a publish in its unlock:
 * docs/areas/events.md, Session 11, second pass). The price: each try
 * takes the lock's cache line from the producer for a moment; under
 * valgrind, where threads take turns, every try fails while the holder
 * is not running, so callgrind counts all of them. */
#define THREAD_LOCK_TRIES 100
static void thread_lock(kvbm_publisher *p) {
  for (int i = 0; i < THREAD_LOCK_TRIES; i++) {
    if (pthread_mutex_trylock(&p->mu) == 0) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  }
  pthread_mutex_lock(&p->mu);
}

/* While full batches keep coming (each wake of the thread found one),
 * it sleeps stream_poll_us() at most and producers do not wake it for a
 * full batch: on a VM a wake is an eventfd write and an interprocessor
 * interrupt that the producer pays (~1.7 us), while the thread's own
 * timer costs the producer nothing. A full batch then leaves at most
 * that much later than a wake would have sent it. The thread then waits
 * on its eventfd alone (ppoll: zmq_poll's timeout is in milliseconds)
 * and serves the sinks' input sockets (replay requests) at every wake,
 * each service a receive that does not wait.
 *
 * The period is a quarter of max_batch_delay_us, the wait the user
 * already accepts for a batch that is not full, between 50 and 200 us
 * (200 at the default delay of 1 ms): each wake costs the thread a timer
 * interrupt and a switch whatever it finds, so the longer the period,
 * the more batches a wake sends (bench_events K = 1, 50 -> 200 us: the
 * thread's CPU 12 -> 8 ns a block event, our throughput +10%;
 * docs/areas/events.md, Session 17). Below a delay of 100 us the thread
 * does not stream. */
#define STREAM_POLL_MIN_US 50
#define STREAM_POLL_MAX_US 200

static uint32_t stream_poll_us(const kvbm_publisher *p) {
  uint32_t us = p->o.max_batch_delay_us / 4;
  return us < STREAM_POLL_MIN_US ? STREAM_POLL_MIN_US : us > STREAM_POLL_MAX_US ? STREAM_POLL_MAX_US : us;
}

/* Serves the sinks' input sockets (items 1..ni-1: replay requests)
 * that poll marked readable, or all of them (`all`: each service is a
 * receive that does not wait). No lock held: a replay answer may be
 * long. Adds what they did to the stats. */
static void serve(kvbm_publisher *p, const zmq_pollitem_t *items, const size_t *sink_of, size_t ni,
                  bool all) {
  ev_service_counts counts = {0};
  for (size_t i = 1; i < ni; i++)
    if (all || (items[i].revents & ZMQ_POLLIN))
      p->sinks[sink_of[i]]->service(p->sinks[sink_of[i]], &counts);
  if (!counts.replay_requests && !counts.replay_bad) return;
  pthread_mutex_lock(&p->mu);
  p->st.replay_requests += counts.replay_requests;
  p->st.replay_bad += counts.replay_bad;
  pthread_mutex_unlock(&p->mu);
}

static void *thread_main(void *arg) {
  kvbm_publisher *p = arg;
  zmq_pollitem_t items[MAX_SINKS + 1];
  size_t sink_of[MAX_SINKS + 1];
  size_t ni = 0;
  items[ni++] = (zmq_pollitem_t){.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN};
  for (size_t s = 0; s < p->nsinks; s++) {
    if (!p->sinks[s]->poll_socket) continue;
    sink_of[ni] = s;
    items[ni++] = (zmq_pollitem_t){.socket = p->sinks[s]->poll_socket, .events = ZMQ_POLLIN};
  }
  uint64_t seq = 0;
  bool busy = false;     /* sent something since it last slept */
  bool full = false;     /* found a full batch since it last slept */
  uint64_t served = 0;   /* when it last looked at the input sockets */
  const uint32_t poll_us = stream_poll_us(p);
  thread_lock(p);
  for (;;) {
    uint64_t now = kvbm_clock_ns();
    if (ni > 1 && now - served >= (uint64_t)poll_us * 1000u) {
      /* every poll_us, whether it slept in ppoll (streaming: the
       * input sockets are not in it) or did not sleep at all (producers
       * filling batches faster than it sends them): replay requests are
       * answered either way */
      pthread_mutex_unlock(&p->mu);
      serve(p, items, sink_of, ni, true);
      thread_lock(p);
      served = now;
      /* again: an event that came meanwhile is newer than the old `now`,
       * which due() would read as a wait of nearly 2^64 ns */
      now = kvbm_clock_ns();
    }
    int what = due(p, now);
    busy |= what != 0;
    full |= what == 1;
    if (what && p->wire) {
      size_t n = take_wire(p, p->fill, what);
      pthread_cond_broadcast(&p->room);
      pthread_mutex_unlock(&p->mu);
      uint64_t errors = 0, seq0 = seq;
      emit_wire(p, &seq, &errors);
      thread_lock(p);
      p->st.sent_events += n;
      p->st.batches += seq - seq0;
      p->st.sink_errors += errors;
      pthread_cond_broadcast(&p->done);
      continue;
    }
    if (what) {
      evq *q = p->fill;
      p->fill = q == &p->q[0] ? &p->q[1] : &p->q[0];
      if (what == 1) move_tail(q, q->n - q->n % p->o.max_batch_events, p->fill);
      pthread_cond_broadcast(&p->room);
      pthread_mutex_unlock(&p->mu);
      uint64_t errors = 0, seq0 = seq;
      emit(p, q, &seq, &errors);
      thread_lock(p);
      p->st.sent_events += q->n;
      p->st.batches += seq - seq0;
      p->st.sink_errors += errors;
      q_clear(q);
      pthread_cond_broadcast(&p->done);
      continue;
    }
    if (p->closing && p->fill->n == 0) break;
    long timeout = -1;
    if (p->fill->n) {
      uint64_t deadline = p->fill->first_ns + (uint64_t)p->o.max_batch_delay_us * 1000u;
      timeout = deadline > now ? (long)((deadline - now + 999999) / 1000000) : 0;
    } else if (busy && p->o.max_batch_delay_us >= 1000) {
      timeout = (long)(p->o.max_batch_delay_us / 1000);
      p->armed = true;
    }
    /* streaming: the last sleep ended with a full batch to send */
    const bool stream = full && p->o.max_batch_delay_us >= 2 * STREAM_POLL_MIN_US;
    p->streaming = stream;
    if (stream) p->armed = true;
    busy = full = false;
    p->waiting = true;
    pthread_mutex_unlock(&p->mu);
    int r;
    if (stream) {
      struct pollfd pf = {.fd = p->efd, .events = POLLIN};
      const struct timespec ts = {0, (long)poll_us * 1000L};
      r = ppoll(&pf, 1, &ts, NULL);
      items[0].revents = r > 0 && (pf.revents & POLLIN) ? ZMQ_POLLIN : 0;
    } else {
      r = zmq_poll(items, (int)ni, timeout);
    }
    if (r > 0 && (items[0].revents & ZMQ_POLLIN)) {
      uint64_t v;
      ssize_t rd = read(p->efd, &v, sizeof v);
      (void)rd;
    }
    if (!stream && r > 0) serve(p, items, sink_of, ni, false); /* streaming: the loop's top */
    thread_lock(p);
    p->waiting = false;
    p->armed = false;
    p->streaming = false;
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int kvbm_publisher_start(kvbm_publisher *pub, kvbm_error *err) {
  if (!pub) return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: NULL");
  pthread_mutex_lock(&pub->mu);
  bool already = pub->started;
  pthread_mutex_unlock(&pub->mu);
  if (already) return kvbm_error_set(err, KVBM_ESTATE, "events: publisher: already started");
  /* wire mode when no sink wants the events themselves (callbacks do) */
  pub->wire = pub->nsinks > 0;
  for (size_t s = 0; s < pub->nsinks; s++) pub->wire &= pub->sinks[s]->wants_bytes;
  atomic_store_explicit(&pub->early, pub->wire && !pub->o.coalesce && pub->o.max_batch_delay_us != 0,
                        memory_order_relaxed);
  if (pub->o.coalesce && !pub->wire)
    return kvbm_error_set(err, KVBM_EINVAL, "events: publisher: coalesce needs every sink to take "
                          "bytes (ZMQ, NATS, JetStream), not a callback, and at least one sink");
  if (pub->wire && !pub->pool &&
      (!(pub->pool = pool_new()) ||
       kvbm__vec_reserve_of(&pub->out, &pub->capout, 16, 16, KVBM__VEC_NO_LIMIT)))
    return kvbm_error_set(err, KVBM_ENOMEM, "events: publisher: out of memory");
  if (pthread_create(&pub->thread, NULL, thread_main, pub))
    return kvbm_error_set(err, KVBM_EIO, "events: publisher: cannot start its thread");
  pthread_mutex_lock(&pub->mu);
  pub->started = true;
  pub->lean = pub->wire && !pub->o.coalesce && pub->o.max_batch_delay_us != 0;
  pthread_mutex_unlock(&pub->mu);
  return KVBM_OK;
}

int kvbm_publisher_flush(kvbm_publisher *p, int timeout_ms, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "events: flush: NULL");
  struct timespec dl = kvbm__deadline_after_ms(CLOCK_MONOTONIC, timeout_ms);
  pthread_mutex_lock(&p->mu);
  if (!p->started) {
    pthread_mutex_unlock(&p->mu);
    return kvbm_error_set(err, KVBM_ESTATE, "events: flush: publisher not started");
  }
  uint64_t target = p->st.accepted;
  if (p->flush_target < target) p->flush_target = target;
  wake(p);
  int rc = KVBM_OK;
  while (p->st.sent_events < target) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&p->done, &p->mu);
    } else if (pthread_cond_timedwait(&p->done, &p->mu, &dl) == ETIMEDOUT &&
               p->st.sent_events < target) {
      rc = kvbm_error_set(err, KVBM_ETIMEDOUT, "events: flush: %llu of %llu events sent in %d ms",
                          (unsigned long long)p->st.sent_events, (unsigned long long)target,
                          timeout_ms);
      break;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

void kvbm_publisher_stats_get(kvbm_publisher *p, kvbm_publisher_stats *out) {
  if (!p || !out) return;
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  pthread_mutex_unlock(&p->mu);
}

void kvbm_publisher_destroy(kvbm_publisher *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->closing = true;
  p->lean = false;
  p->waiting = true; /* force the eventfd write even if the thread is busy */
  wake(p);
  pthread_cond_broadcast(&p->room);
  bool started = p->started;
  pthread_mutex_unlock(&p->mu);
  if (started) pthread_join(p->thread, NULL);
  for (size_t s = 0; s < p->nsinks; s++) p->sinks[s]->close(p->sinks[s]);
  if (p->zctx) zmq_ctx_term(p->zctx);
  for (int i = 0; i < 2; i++) {
    for (size_t c = 0; c < p->q[i].nch; c++) chunk_release(NULL, p->q[i].ch[c]); /* unsent */
    free(p->q[i].ev);
    free(p->q[i].h);
    free(p->q[i].t);
    free(p->q[i].s);
    free(p->q[i].ch);
  }
  free(p->out);
  for (int t = 0; t < 2; t++) {
    free(p->runs[t].h);
    free(p->runs[t].t);
  }
  pool_close(p->pool); /* after zmq_ctx_term: ZMQ gave back what it held */
  free(p->scratch);
  kvbm_event_encoder_destroy(p->enc);
  pthread_cond_destroy(&p->room);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  close(p->efd);
  free(p);
}
