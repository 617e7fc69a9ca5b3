/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis.c: the redis://[user:password@]HOST[:PORT][/DB] backend, one Redis
 * value per block, over hiredis (the connection and the pipeline are in
 * resp.c).
 *
 * Key layout: "<namespace>/<16 hex digits>" (just the digits with the
 * empty namespace), the value's bytes as a plain string. Commands: SET
 * (put), GET (get), STRLEN (exists: Redis has no empty values of ours,
 * puts are >= 1 byte, so 0 means absent), DEL (delete). No TTL: eviction
 * is Redis's own (maxmemory-policy), and an evicted block is a miss.
 *
 * Design. Each I/O thread owns one connection, and a batch is one
 * pipeline on it: every command written back to back, replies read as
 * they come, all under the batch's deadline. A Redis that is down is not
 * an error at register: the connection is made by the first batch, and
 * while it cannot be made every op fails KVBM_EIO at once (after a failed
 * attempt the next waits a backoff, 20 ms doubling to 1 s, so a dead
 * server costs nothing per batch). A connection that breaks is dropped and
 * made again by the next batch, counted in `reconnects`. A batch that
 * finds its reused connection dead before any reply (the server was
 * restarted while we were idle) retries once on a fresh one, so a restart
 * costs no misses once the server is back.
 *
 * Replies that are not ours are misses, never bytes: a key of another type
 * (WRONGTYPE) is reported corrupt; "-OOM" to a SET (maxmemory with the
 * noeviction policy) is KVBM_ENOSPC; a value above max_value_bytes is
 * KVBM_ETOOLONG, refused while it streams in (resp.c).
 */
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "volume/internal.h"
#include "volume/resp.h"

typedef struct rstate {
  kvbm__rconn *conn;
  const char *ns;
  uint64_t max_value;
  kvbm__rcmd *cmds;
  size_t cap;
} rstate;

int kvbm__redis_format_op(kvbm__rcmd *c, const char *ns, const kvbm_volume_op *op,
                          uint64_t max_value) {
  char key[KVBM__VOLUME_KEY_MAX];
  kvbm__volume_key(ns, op->key, key);
  switch (op->kind) {
  case KVBM_VOLUME_PUT: {
    const char *a[2] = {"SET", key};
    return kvbm__rcmd_format(c, 2, a, op->src, op->len);
  }
  case KVBM_VOLUME_GET: {
    const char *a[2] = {"GET", key};
    int rc = kvbm__rcmd_format(c, 2, a, NULL, 0);
    c->sink = op->dst;
    c->sink_cap = op->cap < max_value ? op->cap : (size_t)max_value;
    return rc;
  }
  case KVBM_VOLUME_EXISTS: {
    const char *a[2] = {"STRLEN", key};
    return kvbm__rcmd_format(c, 2, a, NULL, 0);
  }
  case KVBM_VOLUME_DELETE: {
    const char *a[2] = {"DEL", key};
    return kvbm__rcmd_format(c, 2, a, NULL, 0);
  }
  }
  return KVBM_EINVAL;
}

static bool error_is(const redisReply *r, const char *prefix) {
  return r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, prefix, strlen(prefix));
}

void kvbm__redis_op_result(kvbm_volume_op *op, const kvbm__rcmd *c, uint64_t max_value) {
  if (c->result != KVBM_OK) {
    op->status = c->result;
    return;
  }
  const redisReply *r = c->reply;
  if (error_is(r, "WRONGTYPE")) {
    op->status = KVBM__VOLUME_CORRUPT;
    return;
  }
  op->status = KVBM_EIO;
  switch (op->kind) {
  case KVBM_VOLUME_PUT:
    if (r->type == REDIS_REPLY_STATUS) op->status = KVBM_OK;
    else if (error_is(r, "OOM")) op->status = KVBM_ENOSPC;
    break;
  case KVBM_VOLUME_GET:
    if (r->type == REDIS_REPLY_NIL) {
      op->status = KVBM_ENOTFOUND;
    } else if (r->type == REDIS_REPLY_STRING) {
      op->size = r->len;
      if (r->len > max_value) op->status = KVBM_ETOOLONG;
      else op->status = r->str ? KVBM_ENOSPC : KVBM_OK; /* str: it did not fit the sink */
    }
    break;
  case KVBM_VOLUME_EXISTS:
    if (r->type == REDIS_REPLY_INTEGER) {
      op->status = r->integer > 0 ? KVBM_OK : KVBM_ENOTFOUND;
      op->size = r->integer > 0 ? (size_t)r->integer : 0;
    }
    break;
  case KVBM_VOLUME_DELETE:
    if (r->type == REDIS_REPLY_INTEGER) op->status = r->integer > 0 ? KVBM_OK : KVBM_ENOTFOUND;
    break;
  }
}

static int redis_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  (void)cfg;
  kvbm__volume_ctx *ctx = user;
  rstate *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  const kvbm__volume_url *u = ctx->url;
  kvbm__rauth auth = {u->user, u->has_password ? u->password : NULL, u->db};
  s->conn = kvbm__rconn_new(u->hosts[0].host, u->hosts[0].port, &auth, ctx->max_value_bytes,
                            &ctx->reconnects);
  s->ns = ctx->ns;
  s->max_value = ctx->max_value_bytes;
  if (!s->conn) {
    free(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  }
  *state = s; /* not connected yet: a server that is down is not an error */
  return KVBM_OK;
}

static void redis_close(void *state) {
  rstate *s = state;
  if (!s) return;
  kvbm__rconn_free(s->conn);
  free(s->cmds);
  free(s);
}

static bool reserve(rstate *s, size_t n) {
  return kvbm__vec_reserve_of(&s->cmds, &s->cap, n, 16, KVBM__VEC_NO_LIMIT) == KVBM_OK;
}

static void redis_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  rstate *s = state;
  if (!reserve(s, n)) {
    for (size_t i = 0; i < n; i++) ops[i].status = KVBM_EIO;
    return;
  }
  for (size_t i = 0; i < n; i++) kvbm__redis_format_op(&s->cmds[i], s->ns, &ops[i], s->max_value);
  for (int attempt = 0; attempt < 2; attempt++) {
    bool fresh;
    int rc = kvbm__rconn_ensure(s->conn, deadline_ns, &fresh);
    if (rc) {
      for (size_t i = 0; i < n; i++) ops[i].status = rc;
      return;
    }
    rc = kvbm__rconn_exec(s->conn, s->cmds, n, deadline_ns);
    /* A reused connection that was dead from the start: once more, fresh. */
    if (rc == KVBM_EIO && !fresh && s->cmds[0].result != KVBM_OK && attempt == 0) continue;
    break;
  }
  for (size_t i = 0; i < n; i++) {
    kvbm__redis_op_result(&ops[i], &s->cmds[i], s->max_value);
    kvbm__rcmd_reset(&s->cmds[i]);
  }
}

const kvbm_volume_backend kvbm__volume_redis_backend = {
    .scheme = "redis",
    .max_threads = 0,
    .open = redis_open,
    .run = redis_run,
    .close = redis_close,
};
