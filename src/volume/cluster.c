/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster.c: the redis+cluster://HOST:PORT[,HOST:PORT...] backend, a small
 * Redis Cluster client over hiredis (connections and pipelines: resp.c;
 * slots and replies: cluster_map.c). Keys and commands are redis://'s.
 *
 * Design. Redis Cluster is the distributed engine; this client only
 * follows its protocol. The volume holds one slot map (16384 slots ->
 * node address), read with CLUSTER SLOTS from any node a thread knows
 * (the seeds first) and shared by the I/O threads; each thread keeps its
 * own connection per node and its own copy of the map in those
 * connections' terms (copied when the shared map changes, so a batch
 * never takes a lock per op). A batch is split by node and each node's
 * share goes as one pipeline; then the replies decide, per op:
 *
 *   MOVED slot host:port   the slot lives elsewhere for good: the thread's
 *                          map entry is fixed at once, a full refresh is
 *                          wanted, and the op is retried.
 *   ASK slot host:port     the slot is migrating: this one op is retried
 *                          on that node, preceded by ASKING, and the map is
 *                          left alone.
 *   a failed connection    the node may be down or failing over: a
 *                          refresh is wanted and the op retried once; if
 *                          its slot still points at a dead node it fails
 *                          KVBM_EIO (a miss) until the cluster has
 *                          promoted a replica and a refresh shows it.
 *   CLUSTERDOWN/TRYAGAIN   a miss (KVBM_EIO) now, a refresh wanted.
 *
 * Refreshes are rate-limited and shared. A map is read at most once per
 * cluster_refresh_ms (100 ms by default) for the whole volume, failed
 * reads included: a batch that wants a fresh map sooner, or while another
 * thread is reading one, goes on with the map it has (counted:
 * slot_refreshes_limited) and picks up the new one at its next round or
 * batch; only a thread with no map at all waits for a read in flight,
 * until its own deadline. Without the limit a node that answers MOVED in
 * a loop had every batch read the map up to 7 times (7,128 reads, 8 s of
 * puts, for one request in issue 24), and a 16,384-entry map cost 18 ms
 * to read each time; now it is read and parsed once per interval, in one
 * pass (cluster_map.c) into a compact table of addresses. A wanted
 * refresh that the limit refused is not forgotten: the next batch after
 * the interval reads the map (the "scheduled" refresh).
 *
 * Redirect loops end. Each op remembers the nodes it was sent to without
 * ASKING; a MOVED to one of them (A -> B -> A, or an owner that redirects
 * its own slot) is a loop, and so is a sixth redirection of any kind or
 * an ASK to the node that answered. The op fails KVBM_EIO at once
 * (counted: redirect_loops) and its slot is marked broken in the shared
 * map: every op of that slot, on every thread, fails at once without a
 * round trip until the next map is installed. A MOVED answering an ASKING
 * command is exempt from the visited rule (a migration that was just
 * aborted sends the op back), not from the bound. A loop costs at most
 * three round trips per slot per refresh interval.
 *
 * Deadlines. Every round, every connect and read, and the wait for a read
 * in flight run under the batch's deadline; an op still pending then ends
 * KVBM_ETIMEDOUT (the core counts it in timeouts). A node that is down
 * costs little: its connection backs off (resp.c) and fails at once in
 * between. The map is also wanted when it has no owner for an op's slot
 * (those ops miss at once when the limit refuses the read).
 *
 * Nodes: at most 256 known at once; a thread forgets nodes that own no
 * slot in a newly installed map (seeds are kept, as the way back in).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/vec.h"
#include "volume/cluster.h"
#include "volume/internal.h"
#include "volume/resp.h"

#define NODES_MAX 256u
#define REDIRECTS_MAX 5
#define REFRESH_DEFAULT_MS 100u
#define REFRESH_MAX_MS 3600000u
#define ADDR_HASH 1024u /* open addressing over <= 256 addresses */

/* ---- the shared map ---- */

typedef struct caddr {
  char host[256];
  uint16_t port;
} caddr;

/* A slot map in addresses (no connections): what the threads share. */
typedef struct smap {
  caddr nodes[NODES_MAX];
  uint32_t nnodes;
  uint16_t owner[KVBM__CLUSTER_SLOTS]; /* nodes index + 1; 0: unknown */
} smap;

typedef struct cshared {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a read ended (CLOCK_MONOTONIC) */
  uint32_t refs;     /* states open (open and close run on one thread) */
  uint64_t interval_ns;
  /* under mu */
  smap *cur, *next; /* next: the reader's scratch while `reading` */
  kvbm__slot_range *ranges; /* the reader's parse scratch */
  uint64_t gen;             /* maps installed; 0: none yet */
  uint64_t last_ns;         /* when the last read began; 0: never */
  bool reading;
  /* gen, and the current map's broken slots, for reads without mu (set
   * under mu) */
  atomic_uint_fast64_t gen_pub;
  atomic_uint_fast64_t broken[KVBM__CLUSTER_SLOTS / 64];
} cshared;

static void shared_free(cshared *sh) {
  if (!sh) return;
  pthread_mutex_destroy(&sh->mu);
  pthread_cond_destroy(&sh->cv);
  free(sh->cur);
  free(sh->next);
  free(sh->ranges);
  free(sh);
}

static cshared *shared_new(uint32_t refresh_ms) {
  cshared *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&sh->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&sh->mu, NULL);
  sh->interval_ns = (uint64_t)(refresh_ms ? refresh_ms : REFRESH_DEFAULT_MS) * 1000000u;
  sh->cur = calloc(1, sizeof *sh->cur);
  sh->next = calloc(1, sizeof *sh->next);
  sh->ranges = malloc(KVBM__CLUSTER_SLOTS * sizeof *sh->ranges);
  if (!sh->cur || !sh->next || !sh->ranges) {
    shared_free(sh);
    return NULL;
  }
  return sh;
}

static uint32_t addr_hash(const char *host, uint16_t port) {
  uint32_t h = 2166136261u ^ port;
  for (const char *p = host; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  return h;
}

/* Builds m from parsed ranges (disjoint, checked by the parser): one
 * address lookup per range through a small hash (a 16384-entry map costs
 * one pass), and one write per slot. Ranges beyond 256 distinct masters
 * stay unknown. */
static void smap_build(smap *m, const kvbm__slot_range *r, size_t n) {
  uint16_t table[ADDR_HASH] = {0}; /* nodes index + 1 */
  memset(m->owner, 0, sizeof m->owner);
  m->nnodes = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t h = addr_hash(r[i].host, r[i].port) & (ADDR_HASH - 1);
    while (table[h] && (m->nodes[table[h] - 1].port != r[i].port ||
                        strcmp(m->nodes[table[h] - 1].host, r[i].host)))
      h = (h + 1) & (ADDR_HASH - 1);
    if (!table[h]) {
      if (m->nnodes == NODES_MAX) continue;
      m->nodes[m->nnodes].port = r[i].port;
      memcpy(m->nodes[m->nnodes].host, r[i].host, sizeof r[i].host);
      table[h] = (uint16_t)++m->nnodes;
    }
    for (uint32_t slot = r[i].start; slot <= r[i].end; slot++) m->owner[slot] = table[h];
  }
}

/* ---- one thread's state ---- */

typedef struct cnode {
  kvbm__rconn *conn;
  bool seed;
} cnode;

typedef struct pend_op {
  uint16_t slot;
  int16_t target;  /* node of an ASK, -1: the map's */
  bool asking;
  uint8_t tries;   /* rounds after a connection failure */
  uint8_t redirects;
  uint8_t nvisited;
  int16_t visited[REDIRECTS_MAX + 2]; /* nodes sent to without ASKING */
  bool done;
} pend_op;

typedef struct cstate {
  kvbm__volume_ctx *ctx;
  cshared *sh;
  kvbm__rauth auth;
  cnode nodes[NODES_MAX];
  uint32_t nnodes;
  uint16_t owner[KVBM__CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
  uint64_t gen;                        /* the shared map owner[] copies; 0: none */
  bool stale;                          /* a refresh is wanted */
  char good_host[256];                 /* the node that answered the last read */
  uint16_t good_port;
  /* batch scratch */
  pend_op *pend;
  kvbm__rcmd *cmds;
  size_t *which; /* cmd -> op */
  size_t cap;
} cstate;

static void count(atomic_uint_fast64_t *a, uint64_t n) {
  atomic_fetch_add_explicit(a, n, memory_order_relaxed);
}

static int node_find(const cstate *s, const char *host, uint16_t port) {
  for (uint32_t i = 0; i < s->nnodes; i++)
    if (kvbm__rconn_port(s->nodes[i].conn) == port && !strcmp(kvbm__rconn_host(s->nodes[i].conn), host))
      return (int)i;
  return -1;
}

/* The node for host:port, made if new; -1 when the table is full. */
static int node_get(cstate *s, const char *host, uint16_t port) {
  int i = node_find(s, host, port);
  if (i >= 0 || s->nnodes == NODES_MAX) return i;
  kvbm__rconn *c = kvbm__rconn_new(host, port, &s->auth, s->ctx->max_value_bytes,
                                   &s->ctx->reconnects);
  if (!c) return -1;
  s->nodes[s->nnodes] = (cnode){c, false};
  return (int)s->nnodes++;
}

/* Copies the shared map into the thread's terms (mu held); forgets nodes
 * that own nothing (seeds stay). Node indices may move: the caller resets
 * what refers to them. */
static void adopt(cstate *s) {
  const smap *m = s->sh->cur;
  uint16_t remap[NODES_MAX];
  for (uint32_t i = 0; i < m->nnodes; i++) {
    int k = node_get(s, m->nodes[i].host, m->nodes[i].port);
    remap[i] = (uint16_t)(k + 1);
  }
  for (uint32_t slot = 0; slot < KVBM__CLUSTER_SLOTS; slot++)
    s->owner[slot] = m->owner[slot] ? remap[m->owner[slot] - 1] : 0;
  bool used[NODES_MAX] = {false};
  for (uint32_t slot = 0; slot < KVBM__CLUSTER_SLOTS; slot++)
    if (s->owner[slot]) used[s->owner[slot] - 1] = true;
  uint16_t keep[NODES_MAX];
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->nnodes; i++) {
    if (used[i] || s->nodes[i].seed) {
      keep[i] = (uint16_t)(n + 1);
      s->nodes[n++] = s->nodes[i];
    } else {
      keep[i] = 0;
      kvbm__rconn_free(s->nodes[i].conn);
    }
  }
  s->nnodes = n;
  for (uint32_t slot = 0; slot < KVBM__CLUSTER_SLOTS; slot++)
    if (s->owner[slot]) s->owner[slot] = keep[s->owner[slot] - 1];
  s->gen = s->sh->gen;
}

/* Reads the map (CLUSTER SLOTS) from the first node that answers with a
 * sound one, into sh->next; the caller is the one reader. */
static int read_map(cstate *s, uint64_t deadline_ns) {
  cshared *sh = s->sh;
  int rc = KVBM_EIO;
  int first = node_find(s, s->good_host, s->good_port);
  for (uint32_t t = 0; t < s->nnodes; t++) {
    uint32_t i = ((first < 0 ? 0 : (uint32_t)first) + t) % s->nnodes;
    kvbm__rconn *c = s->nodes[i].conn;
    rc = kvbm__rconn_ensure(c, deadline_ns, NULL);
    if (rc == KVBM_ETIMEDOUT) return rc;
    if (rc) continue;
    kvbm__rcmd cmd;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    kvbm__rcmd_format(&cmd, 2, argv, NULL, 0);
    count(&s->ctx->slot_refreshes, 1);
    rc = kvbm__rconn_exec(c, &cmd, 1, deadline_ns);
    if (rc == KVBM_ETIMEDOUT) {
      kvbm__rcmd_reset(&cmd);
      return rc;
    }
    size_t n = 0;
    int prc = rc ? rc
                 : kvbm__cluster_parse_slots(cmd.reply, kvbm__rconn_host(c), sh->ranges,
                                             KVBM__CLUSTER_SLOTS, &n, NULL);
    kvbm__rcmd_reset(&cmd);
    if (prc == KVBM_EPROTO) count(&s->ctx->slot_maps_refused, 1);
    if (prc == KVBM_OK && n > 0) {
      smap_build(sh->next, sh->ranges, n);
      snprintf(s->good_host, sizeof s->good_host, "%s", kvbm__rconn_host(c));
      s->good_port = kvbm__rconn_port(c);
      return KVBM_OK;
    }
    rc = KVBM_EIO;
  }
  return rc;
}

/* Brings the thread's map up to date. want: a refresh is wanted; it is
 * read here if nobody read one within the interval and none is in flight
 * (*limited set otherwise, counted once per batch). A newer shared map is
 * adopted either way. True when the thread's map changed (node indices
 * may have moved). KVBM_ETIMEDOUT in *rc when the deadline passed waiting
 * for another thread's read (only a thread with no map waits). */
static bool sync_map(cstate *s, bool want, bool *limited, uint64_t deadline_ns, int *rc) {
  cshared *sh = s->sh;
  *rc = KVBM_OK;
  pthread_mutex_lock(&sh->mu);
  if (want) {
    bool waited = false;
    while (sh->reading && sh->gen == 0) { /* no map anywhere yet: its result is all there is */
      struct timespec ts = kvbm__timespec_of_ns(deadline_ns);
      waited = true;
      if (pthread_cond_timedwait(&sh->cv, &sh->mu, &ts) && kvbm_clock_ns() >= deadline_ns) {
        *rc = KVBM_ETIMEDOUT;
        break;
      }
    }
    uint64_t now = kvbm_clock_ns();
    if (*rc == KVBM_OK && !waited && !sh->reading &&
        (sh->last_ns == 0 || now - sh->last_ns >= sh->interval_ns)) {
      sh->reading = true;
      sh->last_ns = now;
      pthread_mutex_unlock(&sh->mu);
      int r = read_map(s, deadline_ns); /* I/O without the lock */
      pthread_mutex_lock(&sh->mu);
      if (r == KVBM_OK) {
        smap *t = sh->cur;
        sh->cur = sh->next;
        sh->next = t;
        sh->gen++;
        for (size_t i = 0; i < KVBM__CLUSTER_SLOTS / 64; i++)
          atomic_store_explicit(&sh->broken[i], 0, memory_order_relaxed);
        atomic_store_explicit(&sh->gen_pub, sh->gen, memory_order_release);
      }
      sh->reading = false;
      pthread_cond_broadcast(&sh->cv);
      s->stale = r != KVBM_OK; /* a failed read is tried again, after the interval */
      if (r == KVBM_ETIMEDOUT) *rc = r;
    } else if (!waited) {
      *limited = true;
      count(&s->ctx->slot_refreshes_limited, 1);
    }
  }
  bool changed = s->gen != sh->gen;
  if (changed) adopt(s);
  pthread_mutex_unlock(&sh->mu);
  return changed;
}

static bool slot_broken(const cstate *s, uint16_t slot) {
  return atomic_load_explicit(&s->sh->broken[slot >> 6], memory_order_relaxed) >> (slot & 63) & 1;
}

/* Marks a slot of the map the thread has as broken in the shared one,
 * unless a newer map was installed since (it may be sound). */
static void mark_broken(cstate *s, uint16_t slot) {
  cshared *sh = s->sh;
  pthread_mutex_lock(&sh->mu);
  if (s->gen == sh->gen)
    atomic_fetch_or_explicit(&sh->broken[slot >> 6], UINT64_C(1) << (slot & 63),
                             memory_order_relaxed);
  pthread_mutex_unlock(&sh->mu);
}

/* An op whose redirections go in circles: a miss now, its slot refused
 * until the next map, and a refresh wanted. */
static void loop_found(cstate *s, kvbm_volume_op *op, pend_op *p) {
  op->status = KVBM_EIO;
  p->done = true;
  count(&s->ctx->redirect_loops, 1);
  mark_broken(s, p->slot);
  s->stale = true;
}

static bool visited(const pend_op *p, int node) {
  for (uint8_t i = 0; i < p->nvisited; i++)
    if (p->visited[i] == node) return true;
  return false;
}

/* The three per-op arrays share one capacity: each grows from a copy of
 * it (the rule gives all three the same new one); s->cap moves only when
 * all three hold n. */
static bool reserve(cstate *s, size_t n) {
  size_t cp = s->cap, cc = s->cap, cw = s->cap;
  if (kvbm__vec_reserve_of(&s->pend, &cp, n, 16, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&s->cmds, &cc, n, 16, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&s->which, &cw, n, 16, KVBM__VEC_NO_LIMIT))
    return false;
  s->cap = cp;
  return true;
}

static bool error_is(const redisReply *r, const char *prefix) {
  return r && r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, prefix, strlen(prefix));
}

/* What one reply means for its op: done, or another round. */
static void settle_op(cstate *s, kvbm_volume_op *op, pend_op *p, kvbm__rcmd *cmd, int node) {
  bool was_asking = p->asking;
  if (cmd->result == KVBM_EIO) { /* the connection failed: refresh, retry once */
    s->stale = true;
    if (p->tries++ == 0) {
      p->target = -1;
      p->asking = false;
      return;
    }
  }
  const redisReply *r = cmd->result == KVBM_OK ? cmd->reply : NULL;
  kvbm__redirect rd;
  if (r && r->type == REDIS_REPLY_ERROR &&
      kvbm__cluster_parse_redirect(r->str, r->len, kvbm__rconn_host(s->nodes[node].conn), &rd)) {
    int k = ++p->redirects <= REDIRECTS_MAX ? node_get(s, rd.host, rd.port) : -1;
    if (p->redirects > REDIRECTS_MAX || (!rd.ask && !was_asking && visited(p, k)) ||
        (rd.ask && k == node)) {
      loop_found(s, op, p);
      return;
    }
    if (k < 0) { /* no room for another node */
      op->status = KVBM_EIO;
      p->done = true;
      return;
    }
    if (!rd.ask) {
      /* MOVED: the map was wrong about this slot (the op's, whatever slot
       * the reply names: a hostile node must not rewrite others) */
      s->owner[p->slot] = (uint16_t)(k + 1);
      s->stale = true;
      p->target = -1;
      p->asking = false;
    } else {
      p->target = (int16_t)k;
      p->asking = true;
    }
    return;
  }
  if (error_is(r, "CLUSTERDOWN") || error_is(r, "TRYAGAIN")) s->stale = true;
  kvbm__redis_op_result(op, cmd, s->ctx->max_value_bytes);
  p->done = true;
}

/* One round: every pending op to its node, one pipeline per node. */
static void round_trip(cstate *s, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  for (uint32_t node = 0; node < s->nnodes; node++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
      pend_op *p = &s->pend[i];
      if (p->done) continue;
      int t = p->target >= 0 ? p->target : (int)s->owner[p->slot] - 1;
      if (t != (int)node) continue;
      if (!p->asking && !visited(p, t) && p->nvisited < REDIRECTS_MAX + 2)
        p->visited[p->nvisited++] = (int16_t)t;
      kvbm__redis_format_op(&s->cmds[m], s->ctx->ns, &ops[i], s->ctx->max_value_bytes);
      s->cmds[m].asking = p->asking;
      s->which[m++] = i;
    }
    if (!m) continue;
    kvbm__rconn *c = s->nodes[node].conn;
    int rc = kvbm__rconn_ensure(c, deadline_ns, NULL);
    if (rc == KVBM_OK) rc = kvbm__rconn_exec(c, s->cmds, m, deadline_ns);
    else
      for (size_t j = 0; j < m; j++) s->cmds[j].result = rc, s->cmds[j].reply = NULL;
    for (size_t j = 0; j < m; j++) {
      size_t i = s->which[j];
      if (s->cmds[j].result == KVBM_ETIMEDOUT || s->cmds[j].result == KVBM_ETOOLONG) {
        ops[i].status = s->cmds[j].result;
        s->pend[i].done = true;
      } else {
        settle_op(s, &ops[i], &s->pend[i], &s->cmds[j], (int)node);
      }
      kvbm__rcmd_reset(&s->cmds[j]);
    }
  }
}

static void cluster_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  cstate *s = state;
  if (!reserve(s, n)) {
    for (size_t i = 0; i < n; i++) ops[i].status = KVBM_EIO;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char key[KVBM__VOLUME_KEY_MAX];
    size_t kl = kvbm__volume_key(s->ctx->ns, ops[i].key, key);
    s->pend[i] = (pend_op){.slot = kvbm__cluster_keyslot(key, kl), .target = -1};
  }
  bool limited = false; /* the rate limit refused this batch a refresh */
  for (int round = 0; round <= REDIRECTS_MAX + 1; round++) {
    if (kvbm_clock_ns() >= deadline_ns) break;
    bool unknown = false;
    for (size_t i = 0; i < n && !unknown; i++)
      unknown = !s->pend[i].done && s->pend[i].target < 0 && !s->owner[s->pend[i].slot] &&
                !slot_broken(s, s->pend[i].slot);
    bool want = (s->stale || unknown) && !limited;
    if (want || atomic_load_explicit(&s->sh->gen_pub, memory_order_acquire) != s->gen) {
      int rc;
      if (sync_map(s, want, &limited, deadline_ns, &rc))
        /* node indices may have moved: ASK targets go back to the map (the
         * old owner answers ASK again if the slot is still migrating), and
         * a new map is new evidence, so the loop check starts again */
        for (size_t i = 0; i < n; i++)
          s->pend[i].target = -1, s->pend[i].asking = false, s->pend[i].nvisited = 0;
      if (rc == KVBM_ETIMEDOUT) break;
    }
    /* ops whose slot loops or that nobody serves: a miss now, no round
     * trip (a refresh is wanted: the next batch past the interval reads
     * the map) */
    for (size_t i = 0; i < n; i++) {
      pend_op *p = &s->pend[i];
      if (p->done || p->target >= 0) continue;
      if (slot_broken(s, p->slot)) {
        ops[i].status = KVBM_EIO;
        p->done = true;
        count(&s->ctx->redirect_loops, 1);
        s->stale = true;
      } else if (!s->owner[p->slot]) {
        ops[i].status = KVBM_EIO;
        p->done = true;
        s->stale = true;
      }
    }
    round_trip(s, ops, n, deadline_ns);
    bool left = false;
    for (size_t i = 0; i < n && !left; i++) left = !s->pend[i].done;
    if (!left) return;
  }
  bool late = kvbm_clock_ns() >= deadline_ns;
  for (size_t i = 0; i < n; i++)
    if (!s->pend[i].done) ops[i].status = late ? KVBM_ETIMEDOUT : KVBM_EIO;
}

static void cluster_close(void *state) {
  cstate *s = state;
  if (!s) return;
  for (uint32_t i = 0; i < s->nnodes; i++) kvbm__rconn_free(s->nodes[i].conn);
  if (s->sh && --s->sh->refs == 0) {
    shared_free(s->sh);
    s->ctx->cluster = NULL;
  }
  free(s->pend);
  free(s->cmds);
  free(s->which);
  free(s);
}

static int cluster_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  kvbm__volume_ctx *ctx = user;
  const kvbm__volume_url *u = ctx->url;
  if (cfg->cluster_refresh_ms > REFRESH_MAX_MS)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: cluster_refresh_ms %u is not in 1..%u (0: %u)",
                          cfg->cluster_refresh_ms, REFRESH_MAX_MS, REFRESH_DEFAULT_MS);
  cstate *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  s->ctx = ctx;
  s->auth = (kvbm__rauth){u->user, u->has_password ? u->password : NULL, 0};
  /* the I/O threads' states are opened one after another on the
   * registering thread: the first makes what they share */
  if (!ctx->cluster) ctx->cluster = shared_new(cfg->cluster_refresh_ms);
  s->sh = ctx->cluster;
  bool ok = s->sh != NULL;
  if (ok) s->sh->refs++;
  for (uint32_t i = 0; ok && i < u->nhosts; i++) {
    if (node_find(s, u->hosts[i].host, u->hosts[i].port) >= 0) continue; /* a repeated seed */
    int k = node_get(s, u->hosts[i].host, u->hosts[i].port);
    ok = k >= 0;
    if (ok) s->nodes[k].seed = true;
  }
  if (!ok) {
    cluster_close(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  }
  s->stale = true; /* the map is read by the first batch: a cluster that is down is no error */
  *state = s;
  return KVBM_OK;
}

const kvbm_volume_backend kvbm__volume_cluster_backend = {
    .scheme = "redis+cluster",
    .max_threads = 0,
    .open = cluster_open,
    .run = cluster_run,
    .close = cluster_close,
};
