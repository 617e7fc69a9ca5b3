/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume/resp.h: one Redis connection driven under a deadline, with
 * pipelined commands (private to src/volume/; used by redis.c and
 * cluster.c).
 *
 * A kvbm__rconn is one TCP connection to one Redis node (hiredis connects
 * and parses replies); kvbm__rconn_exec() writes a batch of commands and
 * reads their replies in one poll loop that never passes the deadline.
 * A bulk-string reply to a command with a `sink` goes straight into the
 * caller's buffer (no intermediate copy) when it fits.
 *
 * Threads: a connection is used by one thread at a time.
 */
#ifndef KVBM_VOLUME_RESP_H
#define KVBM_VOLUME_RESP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "kvbm/status.h"

#define KVBM__RCMD_HEAD 640 /* bytes of a command's RESP before its value */

typedef struct kvbm__rconn kvbm__rconn;

typedef struct kvbm__rauth {
  const char *user;     /* "" or NULL: no ACL user */
  const char *password; /* NULL or "": no AUTH */
  uint32_t db;          /* SELECT when not 0 */
} kvbm__rauth;

/* A connection to host:port (not connected yet). max_value bounds a
 * reply's size; reconnects (may be NULL) counts connections made after
 * the first one or after a failed attempt. NULL on ENOMEM. Strings are
 * copied. */
kvbm__rconn *kvbm__rconn_new(const char *host, uint16_t port, const kvbm__rauth *auth,
                             uint64_t max_value, atomic_uint_fast64_t *reconnects);
void kvbm__rconn_free(kvbm__rconn *c); /* NULL: no-op */
const char *kvbm__rconn_host(const kvbm__rconn *c);
uint16_t kvbm__rconn_port(const kvbm__rconn *c);
bool kvbm__rconn_connected(const kvbm__rconn *c);

/* Connects (AUTH, SELECT) unless connected. After a failed attempt the
 * next one waits a backoff (20 ms doubling to 1 s) and calls in between
 * fail at once. *fresh (may be NULL) says whether this call connected.
 * KVBM_OK, KVBM_EIO (refused, unreachable, AUTH failed, backing off),
 * KVBM_ETIMEDOUT (the deadline passed). */
int kvbm__rconn_ensure(kvbm__rconn *c, uint64_t deadline_ns, bool *fresh);

/* Closes the socket (the next ensure reconnects). */
void kvbm__rconn_drop(kvbm__rconn *c);

typedef struct kvbm__rcmd {
  /* request */
  char head[KVBM__RCMD_HEAD];
  size_t head_len;
  const void *val; /* the last argument's bytes, sent from here (no copy) */
  size_t val_len;
  bool asking;     /* send ASKING first (a cluster's ASK redirection) */
  /* reply */
  void *sink;      /* a top-level bulk string that fits goes here */
  size_t sink_cap;
  redisReply *reply; /* the reply (a sunk string: type STRING, str NULL,
                        len its size); free with kvbm__rcmd_reset */
  int result;        /* KVBM_OK: reply set; else why there is none */
} kvbm__rcmd;

/* Formats a command of argc small arguments plus, when val is not NULL, a
 * last argument val[0 .. val_len). KVBM_EINVAL when the small ones do not
 * fit in head. Clears the reply side. */
int kvbm__rcmd_format(kvbm__rcmd *c, int argc, const char *const *argv, const void *val,
                      size_t val_len);

/* Frees the reply, keeps the request. */
void kvbm__rcmd_reset(kvbm__rcmd *c);

/* Sends cmds[0..n) pipelined on a connected c and reads their replies, in
 * one poll loop bounded by the deadline. Every cmd gets `result`: KVBM_OK
 * with its reply, or, from the first one without a reply on: KVBM_ETIMEDOUT
 * (deadline), KVBM_ETOOLONG (this reply outgrew max_value; the rest EIO),
 * KVBM_EIO (the connection failed or spoke garbage). On any failure the
 * connection is dropped (its stream is out of step). Returns the first
 * failure, or KVBM_OK. */
int kvbm__rconn_exec(kvbm__rconn *c, kvbm__rcmd *cmds, size_t n, uint64_t deadline_ns);

/* The volume's ops as Redis commands (redis.c; cluster.c too). */
struct kvbm_volume_op;
/* SET key val / GET key (sunk into dst) / STRLEN key / DEL key, with the
 * stored key "<ns>/<hex>"; KVBM_EINVAL if it does not fit. */
int kvbm__redis_format_op(kvbm__rcmd *c, const char *ns, const struct kvbm_volume_op *op,
                          uint64_t max_value);
/* Sets op->status (and size) from the command's result and reply. */
void kvbm__redis_op_result(struct kvbm_volume_op *op, const kvbm__rcmd *c, uint64_t max_value);

/* A reply reader with the connection's object functions but no
 * connection: for parsing canned replies (tests, fuzzing). Free with
 * redisReaderFree. Arrays above 1M elements are refused (OOM error). */
redisReader *kvbm__resp_reader(void);
/* Frees a reply made by such a reader (or kvbm__rconn_exec). NULL: no-op. */
void kvbm__resp_reply_free(redisReply *r);

#endif
