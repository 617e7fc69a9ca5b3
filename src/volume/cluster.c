/*
 * cluster.c: the redis+cluster://HOST:PORT[,HOST:PORT...] backend, a small
 * Redis Cluster client over hiredis (connections and pipelines: resp.c;
 * slots and replies: cluster_map.c). Keys and commands are redis://'s.
 *
 * Design. Redis Cluster is the distributed engine; this client only
 * follows its protocol. Each I/O thread holds a slot map (16384 slots ->
 * node) read with CLUSTER SLOTS from any node it knows (the seeds first),
 * and one connection per node. A batch is split by node and each node's
 * share goes as one pipeline; then the replies decide, per op:
 *
 *   MOVED slot host:port   the slot lives elsewhere for good: the map
 *                          entry is fixed at once, a full refresh is due
 *                          before the next round, and the op is retried.
 *   ASK slot host:port     the slot is migrating: this one op is retried
 *                          on that node, preceded by ASKING, and the map is
 *                          left alone.
 *   a failed connection    the node may be down or failing over: the map
 *                          is refreshed and the op retried once; if its
 *                          slot still points at a dead node it fails
 *                          KVBM_EIO (a miss) until the cluster has
 *                          promoted a replica and a refresh shows it.
 *   CLUSTERDOWN/TRYAGAIN   a miss (KVBM_EIO) now, a refresh next time.
 *
 * Rounds are bounded (5 redirections per op) and every round runs under
 * the batch's deadline, so a cluster in flux costs misses, never a stall.
 * A node that is down costs little: its connection backs off (resp.c) and
 * fails at once in between. The map is also refreshed when it has no
 * owner for a slot, and lazily after MOVED (Redis's own advice: one MOVED
 * usually means many slots moved).
 *
 * Nodes: at most 256 known at once; a refresh forgets nodes that own no
 * slot (seeds are kept, as the way back in).
 */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "volume/cluster.h"
#include "volume/internal.h"
#include "volume/resp.h"

#define NODES_MAX 256u
#define REDIRECTS_MAX 5

typedef struct cnode {
  kvbm__rconn *conn;
  bool seed;
} cnode;

typedef struct pend_op {
  uint16_t slot;
  int16_t target;  /* node of a redirection, -1: the map's */
  bool asking;
  uint8_t tries;   /* rounds after a connection failure */
  uint8_t redirects;
  bool done;
} pend_op;

typedef struct cstate {
  kvbm__volume_ctx *ctx;
  kvbm__rauth auth;
  cnode nodes[NODES_MAX];
  uint32_t nnodes;
  uint16_t owner[KVBM__CLUSTER_SLOTS]; /* node index + 1; 0: unknown */
  bool stale;                          /* refresh before the next round */
  uint32_t last_good;                  /* the node that answered the last refresh */
  kvbm__slot_range *ranges;            /* refresh scratch */
  /* batch scratch */
  pend_op *pend;
  kvbm__rcmd *cmds;
  size_t *which; /* cmd -> op */
  size_t cap;
} cstate;

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

/* Installs a parsed map; forgets nodes that own nothing (seeds stay). */
static void install(cstate *s, const kvbm__slot_range *r, size_t n) {
  memset(s->owner, 0, sizeof s->owner);
  for (size_t i = 0; i < n; i++) {
    int k = node_get(s, r[i].host, r[i].port);
    if (k < 0) continue;
    for (uint32_t slot = r[i].start; slot <= r[i].end; slot++) s->owner[slot] = (uint16_t)(k + 1);
  }
  bool used[NODES_MAX] = {false};
  for (uint32_t slot = 0; slot < KVBM__CLUSTER_SLOTS; slot++)
    if (s->owner[slot]) used[s->owner[slot] - 1] = true;
  /* compact, keeping indices of kept nodes consistent in owner[] */
  uint16_t remap[NODES_MAX];
  uint32_t m = 0;
  for (uint32_t i = 0; i < s->nnodes; i++) {
    if (used[i] || s->nodes[i].seed) {
      remap[i] = (uint16_t)(m + 1);
      s->nodes[m++] = s->nodes[i];
    } else {
      remap[i] = 0;
      kvbm__rconn_free(s->nodes[i].conn);
    }
  }
  s->nnodes = m;
  for (uint32_t slot = 0; slot < KVBM__CLUSTER_SLOTS; slot++)
    if (s->owner[slot]) s->owner[slot] = remap[s->owner[slot] - 1];
  if (s->last_good >= s->nnodes) s->last_good = 0;
}

/* Reads the slot map from the first node that answers. */
static int refresh(cstate *s, uint64_t deadline_ns) {
  int rc = KVBM_EIO;
  for (uint32_t t = 0; t < s->nnodes; t++) {
    uint32_t i = (s->last_good + t) % s->nnodes;
    kvbm__rconn *c = s->nodes[i].conn;
    rc = kvbm__rconn_ensure(c, deadline_ns, NULL);
    if (rc == KVBM_ETIMEDOUT) return rc;
    if (rc) continue;
    kvbm__rcmd cmd;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    kvbm__rcmd_format(&cmd, 2, argv, NULL, 0);
    rc = kvbm__rconn_exec(c, &cmd, 1, deadline_ns);
    if (rc == KVBM_ETIMEDOUT) return rc;
    size_t n = 0;
    char host[256];
    snprintf(host, sizeof host, "%s", kvbm__rconn_host(c));
    uint16_t port = kvbm__rconn_port(c);
    if (!rc && kvbm__cluster_parse_slots(cmd.reply, host, s->ranges, KVBM__CLUSTER_SLOTS, &n,
                                         NULL) == KVBM_OK && n > 0) {
      kvbm__rcmd_reset(&cmd);
      install(s, s->ranges, n); /* may free c: a node that owns nothing */
      int k = node_find(s, host, port);
      s->last_good = k >= 0 ? (uint32_t)k : 0;
      s->stale = false;
      return KVBM_OK;
    }
    kvbm__rcmd_reset(&cmd);
    rc = KVBM_EIO;
  }
  return rc;
}

static bool reserve(cstate *s, size_t n) {
  if (n <= s->cap) return true;
  pend_op *p = realloc(s->pend, n * sizeof *p);
  if (p) s->pend = p;
  kvbm__rcmd *c = realloc(s->cmds, n * sizeof *c);
  if (c) s->cmds = c;
  size_t *w = realloc(s->which, n * sizeof *w);
  if (w) s->which = w;
  if (!p || !c || !w) return false;
  s->cap = n;
  return true;
}

static bool error_is(const redisReply *r, const char *prefix) {
  return r && r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, prefix, strlen(prefix));
}

/* What one reply means for its op: done, or another round. */
static void settle_op(cstate *s, kvbm_volume_op *op, pend_op *p, kvbm__rcmd *cmd, int node) {
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
    if (++p->redirects <= REDIRECTS_MAX) {
      int k = node_get(s, rd.host, rd.port);
      if (k >= 0) {
        if (!rd.ask) {
          s->owner[rd.slot] = (uint16_t)(k + 1); /* MOVED: the map was wrong */
          s->stale = true;
          p->target = -1;
          p->asking = false;
        } else {
          p->target = (int16_t)k;
          p->asking = true;
        }
        return;
      }
    }
    op->status = KVBM_EIO; /* too many redirections */
    p->done = true;
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
  for (int round = 0; round <= REDIRECTS_MAX + 1; round++) {
    if (kvbm_clock_ns() >= deadline_ns) break;
    bool unknown = false;
    for (size_t i = 0; i < n && !unknown; i++)
      unknown = !s->pend[i].done && s->pend[i].target < 0 && !s->owner[s->pend[i].slot];
    if (s->stale || unknown) {
      int rc = refresh(s, deadline_ns);
      if (rc == KVBM_ETIMEDOUT) break;
      /* node indices may have moved: ASK targets go back to the map (the
       * old owner answers ASK again if the slot is still migrating) */
      for (size_t i = 0; i < n; i++) s->pend[i].target = -1, s->pend[i].asking = false;
    }
    /* ops whose slot nobody serves: a miss now */
    for (size_t i = 0; i < n; i++)
      if (!s->pend[i].done && s->pend[i].target < 0 && !s->owner[s->pend[i].slot]) {
        ops[i].status = KVBM_EIO;
        s->pend[i].done = true;
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
  free(s->ranges);
  free(s->pend);
  free(s->cmds);
  free(s->which);
  free(s);
}

static int cluster_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  (void)cfg;
  kvbm__volume_ctx *ctx = user;
  const kvbm__volume_url *u = ctx->url;
  cstate *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  s->ctx = ctx;
  s->auth = (kvbm__rauth){u->user, u->has_password ? u->password : NULL, 0};
  s->ranges = malloc(KVBM__CLUSTER_SLOTS * sizeof *s->ranges);
  bool ok = s->ranges != NULL;
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
