/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resp.c: one Redis connection under a deadline (see volume/resp.h).
 *
 * Design. hiredis does what it is good at: the TCP connect (with a
 * timeout, TCP_NODELAY) and parsing the reply stream (redisReader). The
 * loop that moves bytes is ours, because the volume's contract is a
 * deadline per batch and hiredis's blocking calls only bound each read or
 * write, not the whole: once connected the socket is made non-blocking and
 * one poll() loop writes the batch's commands and reads their replies
 * together until every reply is in or the deadline passes. Reading while
 * still writing keeps a big pipeline from deadlocking on full socket
 * buffers, and lets Redis start on the first command before the last one
 * is sent.
 *
 * Copies. A put's value is sent with sendmsg straight from the caller's
 * buffer (hiredis's command formatter would copy it twice: into the
 * command, then into the output buffer). A get's value is read from the
 * socket into the reader's buffer (with hiredis 0.14, directly: see
 * read_replies) and copied once from there into the caller's, by our
 * reply-object functions: a top-level bulk string for a command with a
 * sink is not allocated at all.
 * Those functions are our own (not hiredis's defaults) for a second
 * reason: hiredis 0.14 aborts the process when an allocation fails, so a
 * hostile "*2147483647" array header would kill the engine; ours refuse
 * arrays above a million elements and return NULL on ENOMEM, which the
 * reader turns into an error (the connection is then dropped).
 *
 * Bounds. A reply cannot grow without limit: once the bytes buffered for
 * the reply being read exceed max_value plus 64 KiB, the command ends
 * KVBM_ETOOLONG and the connection is dropped (its stream is unusable).
 * Any failure mid-batch drops the connection for the same reason; the
 * next batch reconnects, after a backoff if connecting failed.
 */
#include "volume/resp.h"

#include <hiredis/sds.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"

#define READ_CHUNK (256u * 1024u)
#define REPLY_SLACK (64u * 1024u)
#define ARRAY_MAX (1u << 20)
#define BACKOFF_MIN_NS (20u * 1000000u)
#define BACKOFF_MAX_NS (1000u * 1000000u)
#define IOV_BATCH 64
/* Reply bytes a pipeline keeps outstanding: two 2 MiB gets in flight keep
 * the server busy while we read, without making it buffer (and us wait
 * behind) every reply of a big batch at once. */
#define REPLY_WINDOW (4u << 20)

struct kvbm__rconn {
  char host[256];
  uint16_t port;
  char user[256], password[256];
  uint32_t db;
  uint64_t max_value;
  atomic_uint_fast64_t *reconnects;

  redisContext *ctx; /* NULL: not connected */
  redisReader *reader;
  char *rbuf;
  bool ever, failed; /* connected once; an attempt failed since */
  uint64_t next_try_ns, backoff_ns;
};

/* ---- reply objects ---- */

static void reply_free(void *p) {
  redisReply *r = p;
  if (!r) return;
  if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; r->element && i < r->elements; i++) reply_free(r->element[i]);
    free(r->element);
  } else {
    free(r->str);
  }
  free(r);
}

static void *attach(const redisReadTask *t, redisReply *r) {
  if (t->parent) {
    redisReply *parent = t->parent->obj;
    parent->element[t->idx] = r;
  }
  return r;
}

static void *make_string(const redisReadTask *t, char *s, size_t len) {
  redisReply *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->type = t->type;
  r->len = len;
  kvbm__rcmd *cmd = t->privdata;
  if (t->type == REDIS_REPLY_STRING && !t->parent && cmd && cmd->sink && len <= cmd->sink_cap) {
    memcpy(cmd->sink, s, len); /* the one copy of a get's value */
  } else {
    r->str = malloc(len + 1);
    if (!r->str) {
      free(r);
      return NULL;
    }
    memcpy(r->str, s, len);
    r->str[len] = 0;
  }
  return attach(t, r);
}

static void *make_array(const redisReadTask *t, int n) {
  if (n < 0 || (unsigned)n > ARRAY_MAX) return NULL;
  redisReply *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->type = REDIS_REPLY_ARRAY;
  r->elements = (size_t)n;
  if (n > 0 && !(r->element = calloc((size_t)n, sizeof *r->element))) {
    free(r);
    return NULL;
  }
  return attach(t, r);
}

static void *make_integer(const redisReadTask *t, long long v) {
  redisReply *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->type = REDIS_REPLY_INTEGER;
  r->integer = v;
  return attach(t, r);
}

static void *make_nil(const redisReadTask *t) {
  redisReply *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->type = REDIS_REPLY_NIL;
  return attach(t, r);
}

/* Read-only for hiredis (it only calls through it). */
static const redisReplyObjectFunctions kReplyFns = {
    make_string, make_array, make_integer, make_nil, reply_free};

void kvbm__resp_reply_free(redisReply *r) { reply_free(r); }

redisReader *kvbm__resp_reader(void) {
  redisReader *r = redisReaderCreateWithFunctions((redisReplyObjectFunctions *)&kReplyFns);
  if (r) r->maxbuf = 0; /* keep the buffer: no regrowth per 2 MiB value */
  return r;
}

/* ---- commands ---- */

static bool append(kvbm__rcmd *c, const void *p, size_t n) {
  if (c->head_len + n > sizeof c->head) return false;
  memcpy(c->head + c->head_len, p, n);
  c->head_len += n;
  return true;
}

static bool append_len(kvbm__rcmd *c, char tag, size_t n) {
  char num[32];
  int k = snprintf(num, sizeof num, "%c%zu\r\n", tag, n);
  return append(c, num, (size_t)k);
}

int kvbm__rcmd_format(kvbm__rcmd *c, int argc, const char *const *argv, const void *val,
                      size_t val_len) {
  c->head_len = 0;
  c->val = val;
  c->val_len = val ? val_len : 0;
  c->reply = NULL;
  c->result = KVBM_EIO;
  c->asking = false;
  c->sink = NULL;
  c->sink_cap = 0;
  bool ok = append_len(c, '*', (size_t)argc + (val ? 1 : 0));
  for (int i = 0; ok && i < argc; i++) {
    size_t n = strlen(argv[i]);
    ok = append_len(c, '$', n) && append(c, argv[i], n) && append(c, "\r\n", 2);
  }
  if (ok && val) ok = append_len(c, '$', val_len);
  return ok ? KVBM_OK : KVBM_EINVAL;
}

void kvbm__rcmd_reset(kvbm__rcmd *c) {
  reply_free(c->reply);
  c->reply = NULL;
  c->result = KVBM_EIO;
}

/* ---- the connection ---- */

kvbm__rconn *kvbm__rconn_new(const char *host, uint16_t port, const kvbm__rauth *auth,
                             uint64_t max_value, atomic_uint_fast64_t *reconnects) {
  kvbm__rconn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  snprintf(c->host, sizeof c->host, "%s", host);
  c->port = port;
  if (auth) {
    snprintf(c->user, sizeof c->user, "%s", auth->user ? auth->user : "");
    snprintf(c->password, sizeof c->password, "%s", auth->password ? auth->password : "");
    c->db = auth->db;
  }
  c->max_value = max_value;
  c->reconnects = reconnects;
  c->backoff_ns = BACKOFF_MIN_NS;
#if HIREDIS_MAJOR != 0
  c->rbuf = malloc(READ_CHUNK); /* read_replies' staging buffer */
  if (!c->rbuf) {
    free(c);
    return NULL;
  }
#endif
  return c;
}

void kvbm__rconn_drop(kvbm__rconn *c) {
  if (!c) return;
  if (c->ctx) redisFree(c->ctx);
  if (c->reader) redisReaderFree(c->reader);
  c->ctx = NULL;
  c->reader = NULL;
}

void kvbm__rconn_free(kvbm__rconn *c) {
  if (!c) return;
  kvbm__rconn_drop(c);
  free(c->rbuf);
  free(c);
}

const char *kvbm__rconn_host(const kvbm__rconn *c) { return c->host; }
uint16_t kvbm__rconn_port(const kvbm__rconn *c) { return c->port; }
bool kvbm__rconn_connected(const kvbm__rconn *c) { return c->ctx != NULL; }

static void connect_failed(kvbm__rconn *c) {
  kvbm__rconn_drop(c);
  c->failed = true;
  c->next_try_ns = kvbm_clock_ns() + c->backoff_ns;
  c->backoff_ns = c->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : c->backoff_ns * 2;
}

/* AUTH and SELECT on a fresh connection. */
static int handshake(kvbm__rconn *c, uint64_t deadline_ns) {
  kvbm__rcmd cmds[2];
  size_t n = 0;
  if (c->password[0]) {
    const char *a[3] = {"AUTH", c->user[0] ? c->user : c->password, c->password};
    if (kvbm__rcmd_format(&cmds[n++], c->user[0] ? 3 : 2, a, NULL, 0)) return KVBM_EIO;
  }
  if (c->db) {
    char db[16];
    snprintf(db, sizeof db, "%u", c->db);
    const char *a[2] = {"SELECT", db};
    if (kvbm__rcmd_format(&cmds[n++], 2, a, NULL, 0)) return KVBM_EIO;
  }
  int rc = n ? kvbm__rconn_exec(c, cmds, n, deadline_ns) : KVBM_OK;
  for (size_t i = 0; i < n; i++) {
    if (!rc && cmds[i].reply->type != REDIS_REPLY_STATUS) rc = KVBM_EIO; /* wrong password, db */
    kvbm__rcmd_reset(&cmds[i]);
  }
  return rc;
}

int kvbm__rconn_ensure(kvbm__rconn *c, uint64_t deadline_ns, bool *fresh) {
  if (fresh) *fresh = false;
  if (c->ctx) return KVBM_OK;
  uint64_t now = kvbm_clock_ns();
  if (now < c->next_try_ns) return KVBM_EIO; /* backing off: fail fast */
  if (now >= deadline_ns) return KVBM_ETIMEDOUT;
  uint64_t left = deadline_ns - now;
  struct timeval tv = {(time_t)(left / 1000000000u), (suseconds_t)(left % 1000000000u / 1000u)};
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  c->ctx = redisConnectWithTimeout(c->host, c->port, tv);
  c->reader = kvbm__resp_reader();
  if (!c->ctx || c->ctx->err || !c->reader) {
    bool late = kvbm_clock_ns() >= deadline_ns;
    connect_failed(c);
    return late ? KVBM_ETIMEDOUT : KVBM_EIO;
  }
  int fl = fcntl(c->ctx->fd, F_GETFL);
  if (fl < 0 || fcntl(c->ctx->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    connect_failed(c);
    return KVBM_EIO;
  }
  int rc = handshake(c, deadline_ns);
  if (rc) {
    connect_failed(c);
    return rc;
  }
  if ((c->ever || c->failed) && c->reconnects)
    atomic_fetch_add_explicit(c->reconnects, 1, memory_order_relaxed);
  c->ever = true;
  c->failed = false;
  c->backoff_ns = BACKOFF_MIN_NS;
  c->next_try_ns = 0;
  if (fresh) *fresh = true;
  return KVBM_OK;
}

/* ---- the pipeline ---- */

static const char kAsking[] = "*1\r\n$6\r\nASKING\r\n";

/* Where the writer is: command, piece (0 ASKING, 1 head, 2 value, 3 CRLF)
 * and offset in it. */
typedef struct cursor {
  size_t cmd;
  int piece;
  size_t off;
} cursor;

static size_t piece(const kvbm__rcmd *c, int p, const void **base) {
  switch (p) {
  case 0: *base = kAsking; return c->asking ? sizeof kAsking - 1 : 0;
  case 1: *base = c->head; return c->head_len;
  case 2: *base = c->val; return c->val ? c->val_len : 0;
  default: *base = "\r\n"; return c->val ? 2 : 0;
  }
}

/* Moves the cursor past empty pieces; false at the end. */
static bool settle(const kvbm__rcmd *cmds, size_t n, cursor *k) {
  while (k->cmd < n) {
    const void *b;
    if (k->off < piece(&cmds[k->cmd], k->piece, &b)) return true;
    k->off = 0;
    if (++k->piece == 4) {
      k->piece = 0;
      k->cmd++;
    }
  }
  return false;
}

/* One send of what is left; KVBM_OK (also when the socket is full) or
 * KVBM_EIO. */
static int write_some(int fd, const kvbm__rcmd *cmds, size_t n, cursor *k) {
  struct iovec iov[IOV_BATCH];
  int cnt = 0;
  cursor w = *k;
  while (cnt < IOV_BATCH && settle(cmds, n, &w)) {
    const void *b;
    size_t len = piece(&cmds[w.cmd], w.piece, &b);
    iov[cnt++] = (struct iovec){(char *)b + w.off, len - w.off};
    w.off = len;
  }
  if (!cnt) return KVBM_OK;
  /* sendmsg, not writev: MSG_NOSIGNAL, so a server that hung up is an
   * error here and not a SIGPIPE that kills the engine. */
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
  ssize_t wr = sendmsg(fd, &mh, MSG_NOSIGNAL);
  if (wr < 0) return errno == EAGAIN || errno == EINTR ? KVBM_OK : KVBM_EIO;
  size_t left = (size_t)wr;
  while (left && settle(cmds, n, k)) {
    const void *b;
    size_t room = piece(&cmds[k->cmd], k->piece, &b) - k->off;
    size_t step = left < room ? left : room;
    k->off += step;
    left -= step;
  }
  return KVBM_OK;
}

/* Reads what the socket has into the reply reader. With hiredis 0.14 the
 * bytes go straight into the reader's buffer (an sds whose length the
 * reader mirrors in r->len, which redisReaderFeed would copy them into):
 * a 2 MiB value is then copied once on its way from the socket to the
 * caller. Other versions go through redisReaderFeed. -1 with errno, 0 at
 * EOF, or the byte count. */
static ssize_t read_replies(kvbm__rconn *c, int fd) {
#if HIREDIS_MAJOR == 0
  redisReader *r = c->reader;
  sds b = sdsMakeRoomFor(r->buf, READ_CHUNK);
  if (!b) {
    errno = ENOMEM;
    return -1;
  }
  r->buf = b;
  ssize_t got = read(fd, r->buf + r->len, READ_CHUNK);
  if (got > 0) {
    sdsIncrLen(r->buf, (int)got);
    r->len = sdslen(r->buf);
  }
  return got;
#else
  ssize_t got = read(fd, c->rbuf, READ_CHUNK);
  if (got > 0 && redisReaderFeed(c->reader, c->rbuf, (size_t)got) != REDIS_OK) {
    errno = ENOMEM;
    return -1;
  }
  return got;
#endif
}

/* Reply bytes a command may bring back: its sink's room (a get), else
 * little. */
static uint64_t expected(const kvbm__rcmd *c) { return c->sink ? c->sink_cap : 0; }

/* Ends the batch at reply index ri with `why` (the rest: EIO for a
 * reply that was too long, the same status otherwise). */
static int fail_from(kvbm__rconn *c, kvbm__rcmd *cmds, size_t n, size_t ri, int why) {
  for (size_t i = ri; i < n; i++) cmds[i].result = i == ri || why != KVBM_ETOOLONG ? why : KVBM_EIO;
  kvbm__rconn_drop(c);
  return why;
}

int kvbm__rconn_exec(kvbm__rconn *c, kvbm__rcmd *cmds, size_t n, uint64_t deadline_ns) {
  for (size_t i = 0; i < n; i++) {
    cmds[i].reply = NULL;
    cmds[i].result = KVBM_EIO;
  }
  if (!c->ctx) return fail_from(c, cmds, n, 0, KVBM_EIO);
  int fd = c->ctx->fd;
  cursor k = {0, 0, 0};
  size_t ri = 0;
  bool asked = false; /* the current command's ASKING reply is in */
  /* The window: cmds[ri, wend) may be on the wire, their expected replies
   * (a get's room) adding up to REPLY_WINDOW at most, one at least. */
  size_t wend = 0;
  uint64_t wsum = 0;
  while (wend < n && (wend == 0 || wsum + expected(&cmds[wend]) <= REPLY_WINDOW))
    wsum += expected(&cmds[wend++]);
  bool writing = settle(cmds, wend, &k);
  uint64_t fed = 0; /* bytes that belong to the reply being read, or later ones */
  while (ri < n) {
    uint64_t now = kvbm_clock_ns();
    if (now >= deadline_ns) return fail_from(c, cmds, n, ri, KVBM_ETIMEDOUT);
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    struct pollfd p = {fd, (short)(POLLIN | (writing ? POLLOUT : 0)), 0};
    int pr = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
    if (pr < 0 && errno != EINTR) return fail_from(c, cmds, n, ri, KVBM_EIO);
    if (pr <= 0) continue;
    if (writing && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
      if (write_some(fd, cmds, wend, &k)) return fail_from(c, cmds, n, ri, KVBM_EIO);
      writing = settle(cmds, wend, &k);
    }
    if (!(p.revents & (POLLIN | POLLERR | POLLHUP))) continue;
    ssize_t got = read_replies(c, fd);
    if (got == 0) return fail_from(c, cmds, n, ri, KVBM_EIO); /* closed by the server */
    if (got < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail_from(c, cmds, n, ri, KVBM_EIO);
    }
    fed += (uint64_t)got;
    while (ri < n) {
      bool skip = cmds[ri].asking && !asked; /* ASKING's own +OK */
      c->reader->privdata = skip ? NULL : &cmds[ri]; /* (hiredis's macro casts to int) */
      void *r = NULL;
      if (redisReaderGetReply(c->reader, &r) != REDIS_OK) /* garbage on the wire */
        return fail_from(c, cmds, n, ri, KVBM_EIO);
      if (!r) break;
      if (skip) {
        reply_free(r);
        asked = true;
        fed = c->reader->len - c->reader->pos;
        continue;
      }
      cmds[ri].reply = r;
      cmds[ri].result = KVBM_OK;
      wsum -= expected(&cmds[ri]);
      ri++;
      asked = false;
      fed = c->reader->len - c->reader->pos;
    }
    while (wend < n && (wend == ri || wsum + expected(&cmds[wend]) <= REPLY_WINDOW))
      wsum += expected(&cmds[wend++]);
    writing = settle(cmds, wend, &k);
    /* Counting bytes, not the reader's buffer, also bounds a reply of many
     * small parts (parsed into objects as they come). */
    if (ri < n && fed > c->max_value + REPLY_SLACK)
      return fail_from(c, cmds, n, ri, KVBM_ETOOLONG);
  }
  return KVBM_OK;
}
