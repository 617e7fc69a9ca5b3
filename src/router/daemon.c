/*
 * daemon.c: the router daemon's HTTP side (see kvbm/router.h).
 *
 * One thread (the caller of kvbm_router_daemon_run) serves every
 * connection with poll(): non-blocking sockets, a buffer per connection
 * bounded by the head and body limits, a deadline per request (slow or
 * stalled clients are answered 408 and closed), a cap on connections
 * (one over it is answered 503 and closed), keep-alive and pipelining
 * (requests are answered in order). The head parser (http.c) and the JSON
 * reader (json.c) are pure codecs; this file is the transport and the
 * handlers. Lookups read the index without a lock; writers (the event
 * sources, approximate-mode records, worker drops) take the daemon's
 * writer lock. Load (active blocks and requests per worker) is the
 * routing thread's own state: a /route adds the request to its worker,
 * /done or request_ttl_s takes it away.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "router/daemon_impl.h"
#include "router/http.h"
#include "router/json.h"

#define MAX_HEAD (16 * 1024)

typedef struct conn {
  int fd;
  char *in;
  size_t in_len, in_cap;
  char *out;
  size_t out_len, out_off, out_cap;
  int64_t deadline_ns; /* the request being read must be complete by then */
  bool closing;        /* close once `out` is written */
  bool sent_continue;
} conn;

typedef struct req_rec {
  uint64_t id;
  int64_t expires_ns;
  uint32_t slot;
  kvbm_worker_key key;
  double blocks;
  bool live;
} req_rec;

typedef struct http_state {
  conn *c;
  size_t nc, cc;
  struct pollfd *pfd;
  size_t cpfd;
  /* load per slot, valid while owner[slot] is the slot's worker */
  double load_blocks[KVBM_ROUTER_MAX_WORKERS], load_reqs[KVBM_ROUTER_MAX_WORKERS];
  kvbm_worker_key owner[KVBM_ROUTER_MAX_WORKERS];
  bool owned[KVBM_ROUTER_MAX_WORKERS];
  req_rec *r; /* in id order (ids only grow) */
  size_t rh, rn, rcap, rlive;
  uint64_t next_id;
  uint64_t rng;
  uint64_t routes, bad, conns;
  int64_t t0;
} http_state;

void kvbm__rd_log(kvbm_router_daemon *d, const char *fmt, ...) {
  if (!d->cfg.log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  d->cfg.log(d->cfg.log_user, line);
}

kvbm_router_daemon_config kvbm_router_daemon_config_default(void) {
  kvbm_router_daemon_config c = {0};
  c.host = "127.0.0.1";
  c.index = kvbm_index_config_default();
  c.choice = kvbm_choice_config_default();
  c.request_ttl_s = 600;
  c.max_body = (size_t)8 << 20;
  c.max_tokens = (size_t)1 << 20;
  c.max_connections = 256;
  c.io_timeout_s = 10;
  c.seed = 1;
  return c;
}

/* ------------------------------------------------------------- load */

static void load_sync(http_state *h, uint32_t slot, const kvbm_worker_key *k) {
  if (!h->owned[slot] || h->owner[slot].worker_id != k->worker_id ||
      h->owner[slot].dp_rank != k->dp_rank) {
    h->owned[slot] = true;
    h->owner[slot] = *k;
    h->load_blocks[slot] = h->load_reqs[slot] = 0;
  }
}

static void load_drop(http_state *h, req_rec *r) {
  if (!r->live) return;
  r->live = false;
  h->rlive--;
  uint32_t s = r->slot;
  if (h->owned[s] && h->owner[s].worker_id == r->key.worker_id &&
      h->owner[s].dp_rank == r->key.dp_rank) {
    h->load_blocks[s] -= r->blocks;
    h->load_reqs[s] -= 1;
    if (h->load_blocks[s] < 0) h->load_blocks[s] = 0;
    if (h->load_reqs[s] < 0) h->load_reqs[s] = 0;
  }
}

static void load_expire(http_state *h, int64_t now) {
  while (h->rh < h->rn && (!h->r[h->rh].live || h->r[h->rh].expires_ns <= now))
    load_drop(h, &h->r[h->rh++]);
  if (h->rh > 1024 && h->rh * 2 > h->rn) { /* compact */
    memmove(h->r, h->r + h->rh, (h->rn - h->rh) * sizeof *h->r);
    h->rn -= h->rh;
    h->rh = 0;
  }
}

static req_rec *load_find(http_state *h, uint64_t id) {
  size_t lo = h->rh, hi = h->rn;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->r[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < h->rn && h->r[lo].id == id && h->r[lo].live ? &h->r[lo] : NULL;
}

/* ------------------------------------------------------------- replies */

static void reply(conn *c, int status, const char *body, size_t len, bool close, const char *extra) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Connection: %s\r\n%s\r\n",
                   status, kvbm__http_reason(status), len, close ? "close" : "keep-alive",
                   extra ? extra : "");
  size_t need = c->out_len + (size_t)n + len;
  if (need > c->out_cap) {
    size_t cap = c->out_cap ? c->out_cap : 1024;
    while (cap < need) cap *= 2;
    char *p = realloc(c->out, cap);
    if (!p) {
      c->closing = true;
      return;
    }
    c->out = p;
    c->out_cap = cap;
  }
  memcpy(c->out + c->out_len, head, (size_t)n);
  memcpy(c->out + c->out_len + n, body, len);
  c->out_len = need;
  if (close) c->closing = true;
}

static void reply_error(http_state *h, conn *c, int status, const char *msg, bool close,
                        const char *extra) {
  rj_buf b = {0};
  kvbm__rj_printf(&b, "{\"error\":");
  kvbm__rj_string(&b, msg);
  kvbm__rj_printf(&b, ",\"status\":%d}\n", status);
  h->bad++;
  if (b.oom) reply(c, 500, "{}\n", 3, true, NULL);
  else reply(c, status, b.p, b.len, close, extra);
  kvbm__rj_buf_free(&b);
}

/* ------------------------------------------------------------- handlers */

static void handle_health(kvbm_router_daemon *d, conn *c, bool close) {
  http_state *h = d->http;
  kvbm_index_stats st;
  kvbm_index_stats_get(d->idx, &st);
  rj_buf b = {0};
  kvbm__rj_printf(&b,
            "{\"status\":\"ok\",\"workers\":%u,\"entries\":%" PRIu64 ",\"events\":%" PRIu64
            ",\"gaps\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"unknown_removed\":%" PRIu64
            ",\"orphans\":%" PRIu64 ",\"routes\":%" PRIu64 ",\"active_requests\":%zu"
            ",\"bad_requests\":%" PRIu64 ",\"mode\":\"%s\",\"uptime_s\":%.3f,\"sources\":[",
            st.workers, st.entries, st.events, st.gaps, st.duplicates, st.unknown_removed,
            st.orphans, h->routes, h->rlive, h->bad, d->approx ? "approximate" : "events",
            (double)(kvbm__rd_now_ns() - h->t0) * 1e-9);
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    kvbm__rj_printf(&b,
              "%s{\"worker_id\":%" PRIu64 ",\"kind\":\"%s\",\"batches\":%" PRIu64
              ",\"errors\":%" PRIu64 ",\"lost\":%" PRIu64 ",\"replayed\":%" PRIu64
              ",\"dropped\":%s}",
              i ? "," : "", s->cfg.worker_id, s->cfg.kind == KVBM_SOURCE_ZMQ ? "zmq" : "nats",
              atomic_load(&s->batches), atomic_load(&s->errors), atomic_load(&s->lost),
              atomic_load(&s->replayed), atomic_load(&s->dropped) ? "true" : "false");
  }
  kvbm__rj_printf(&b, "]}\n");
  if (b.oom) reply_error(h, c, 500, "out of memory", true, NULL);
  else reply(c, 200, b.p, b.len, close, NULL);
  kvbm__rj_buf_free(&b);
}

static void handle_route(kvbm_router_daemon *d, conn *c, const char *body, size_t len,
                         bool close) {
  http_state *h = d->http;
  rj_request q;
  kvbm_error err = {0};
  int rc = kvbm__rj_parse_request(body, len, d->cfg.max_tokens, &q, &err);
  if (rc) {
    reply_error(h, c, rc == KVBM_ENOMEM ? 500 : rc == KVBM_ETOOLONG && strstr(err.msg, "array")
                                                     ? 413 : 400,
                err.msg, close, NULL);
    return;
  }
  if (q.has_tokens == q.has_hashes) {
    reply_error(h, c, 400, "give exactly one of token_ids and block_hashes", close, NULL);
    kvbm__rj_request_free(&q);
    return;
  }
  const uint64_t *keys = q.hashes;
  size_t n = q.num_hashes;
  uint64_t *owned = NULL;
  if (q.has_tokens) {
    size_t cap = q.num_tokens / d->cfg.index.block_size + 1;
    owned = malloc(cap * sizeof *owned);
    if (!owned) {
      reply_error(h, c, 500, "out of memory", true, NULL);
      kvbm__rj_request_free(&q);
      return;
    }
    n = kvbm_index_hash_tokens(d->idx, q.tokens, q.num_tokens, owned, cap);
    keys = owned;
  }
  int64_t now = kvbm__rd_now_ns();
  load_expire(h, now);
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  uint64_t live;
  kvbm_index_lookup(d->idx, keys, n, ov, &live);
  kvbm_worker_key key[KVBM_ROUTER_MAX_WORKERS];
  double load[KVBM_ROUTER_MAX_WORKERS] = {0};
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    if (!(live >> s & 1)) continue;
    if (!kvbm_index_slot_worker(d->idx, s, &key[s])) { /* dropped meanwhile */
      live &= ~(1ull << s);
      continue;
    }
    load_sync(h, s, &key[s]);
    load[s] = d->cfg.choice.load_kind == KVBM_LOAD_REQUESTS ? h->load_reqs[s] : h->load_blocks[s];
  }
  kvbm_choice ch;
  rc = kvbm_choose(&d->cfg.choice, n, ov, load, live, &h->rng, &ch);
  if (rc) {
    reply_error(h, c, 503, "no workers known yet (no events received)", close, NULL);
    free(owned);
    kvbm__rj_request_free(&q);
    return;
  }
  if (d->approx) {
    pthread_mutex_lock(&d->wlock);
    rc = kvbm_approx_record(d->approx, ch.slot, keys, n, (double)now * 1e-9, &err);
    pthread_mutex_unlock(&d->wlock);
    if (rc) kvbm__rd_log(d, "approximate record: %s", err.msg);
  }
  /* the request's load: its blocks (the prefill it causes and its KV) */
  if (h->rn == h->rcap) {
    size_t nc = h->rcap ? h->rcap * 2 : 1024;
    req_rec *r = realloc(h->r, nc * sizeof *r);
    if (r) h->r = r, h->rcap = nc;
  }
  uint64_t id = ++h->next_id;
  if (h->rn < h->rcap) {
    h->r[h->rn++] = (req_rec){.id = id, .slot = ch.slot, .key = key[ch.slot],
                              .blocks = (double)n,
                              .expires_ns = now + (int64_t)(d->cfg.request_ttl_s * 1e9),
                              .live = true};
    h->load_blocks[ch.slot] += (double)n;
    h->load_reqs[ch.slot] += 1;
    h->rlive++;
  }
  h->routes++;
  rj_buf b = {0};
  kvbm__rj_printf(&b,
            "{\"worker_id\":%" PRIu64 ",\"dp_rank\":%u,\"request_id\":%" PRIu64
            ",\"blocks\":%zu,\"cost\":%.6g,\"ties\":%u,\"workers\":[",
            key[ch.slot].worker_id, key[ch.slot].dp_rank, id, n, ch.cost, ch.ties);
  bool first = true;
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    if (!(live >> s & 1)) continue;
    double score = kvbm_overlap_score(&d->cfg.choice, &ov[s]);
    double cost = d->cfg.choice.prefill_weight * ((double)n - score) +
                  d->cfg.choice.load_weight * load[s];
    kvbm__rj_printf(&b,
              "%s{\"worker_id\":%" PRIu64 ",\"dp_rank\":%u,\"device\":%u,\"host\":%u,"
              "\"disk\":%u,\"remote\":%u,\"score\":%.6g,\"load\":%.6g,\"cost\":%.6g}",
              first ? "" : ",", key[s].worker_id, key[s].dp_rank, ov[s].prefix[0],
              ov[s].prefix[1], ov[s].prefix[2], ov[s].prefix[3], score, load[s], cost);
    first = false;
  }
  kvbm__rj_printf(&b, "]}\n");
  if (b.oom) reply_error(h, c, 500, "out of memory", true, NULL);
  else reply(c, 200, b.p, b.len, close, NULL);
  kvbm__rj_buf_free(&b);
  free(owned);
  kvbm__rj_request_free(&q);
}

static void handle_done(kvbm_router_daemon *d, conn *c, const char *body, size_t len,
                        bool close) {
  http_state *h = d->http;
  rj_request q;
  kvbm_error err = {0};
  int rc = kvbm__rj_parse_request(body, len, 0, &q, &err);
  if (rc) {
    reply_error(h, c, 400, err.msg, close, NULL);
    return;
  }
  bool bad = !q.has_request_id || q.has_tokens || q.has_hashes;
  uint64_t id = q.request_id;
  kvbm__rj_request_free(&q);
  if (bad) {
    reply_error(h, c, 400, "give request_id (only)", close, NULL);
    return;
  }
  req_rec *r = load_find(h, id);
  if (!r) {
    reply_error(h, c, 404, "no such active request_id", close, NULL);
    return;
  }
  load_drop(h, r);
  static const char ok[] = "{\"ok\":true}\n";
  reply(c, 200, ok, sizeof ok - 1, close, NULL);
}

/* One complete request: head parsed, body (content_length bytes) at body. */
static void dispatch(kvbm_router_daemon *d, conn *c, const http_req *rq, const char *body) {
  http_state *h = d->http;
  bool close = !rq->keep_alive;
  bool post = !strcmp(rq->method, "POST"), get = !strcmp(rq->method, "GET");
  if (!strcmp(rq->path, "/health")) {
    if (get) handle_health(d, c, close);
    else reply_error(h, c, 405, "use GET for /health", close, "Allow: GET\r\n");
  } else if (!strcmp(rq->path, "/route") || !strcmp(rq->path, "/done")) {
    if (!post) {
      reply_error(h, c, 405, "use POST with a JSON body", close, "Allow: POST\r\n");
    } else if (rq->path[1] == 'r') {
      handle_route(d, c, body, rq->content_length, close);
    } else {
      handle_done(d, c, body, rq->content_length, close);
    }
  } else {
    reply_error(h, c, 404, "unknown path (try POST /route, POST /done, GET /health)", close, NULL);
  }
}

/* ------------------------------------------------------------- I/O */

static void conn_close(http_state *h, size_t i) {
  close(h->c[i].fd);
  free(h->c[i].in);
  free(h->c[i].out);
  h->c[i] = h->c[--h->nc];
}

/* Handles the complete requests at the front of c->in. */
static void process(kvbm_router_daemon *d, conn *c) {
  http_state *h = d->http;
  while (!c->closing && c->in_len) {
    http_req rq;
    int status;
    const char *why;
    http_result r = kvbm__http_parse_head(c->in, c->in_len, MAX_HEAD, d->cfg.max_body, &rq, &status, &why);
    if (r == HTTP_NEED_MORE) return;
    if (r == HTTP_BAD) {
      reply_error(h, c, status, why, true, NULL);
      return;
    }
    if (!rq.has_length && strcmp(rq.method, "GET") && strcmp(rq.method, "HEAD") &&
        strcmp(rq.method, "DELETE")) {
      reply_error(h, c, 411, "a request with a body needs Content-Length", true, NULL);
      return;
    }
    size_t total = rq.head_len + rq.content_length;
    if (c->in_len < total) {
      if (rq.expect_continue && !c->sent_continue) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        size_t need = c->out_len + sizeof cont - 1;
        if (need > c->out_cap) {
          char *p = realloc(c->out, need);
          if (!p) {
            c->closing = true;
            return;
          }
          c->out = p;
          c->out_cap = need;
        }
        memcpy(c->out + c->out_len, cont, sizeof cont - 1);
        c->out_len = need;
        c->sent_continue = true;
      }
      return;
    }
    dispatch(d, c, &rq, c->in + rq.head_len);
    memmove(c->in, c->in + total, c->in_len - total);
    c->in_len -= total;
    c->sent_continue = false;
    c->deadline_ns = kvbm__rd_now_ns() + (int64_t)(d->cfg.io_timeout_s * 1e9);
  }
}

/* Reads what is there; false when the connection is to go. */
static bool conn_read(kvbm_router_daemon *d, conn *c) {
  size_t limit = MAX_HEAD + d->cfg.max_body;
  for (;;) {
    if (c->in_len == c->in_cap) {
      if (c->in_cap >= limit) break; /* process() will refuse what is too big */
      size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
      if (cap > limit) cap = limit;
      char *p = realloc(c->in, cap);
      if (!p) return false;
      c->in = p;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n > 0) {
      if (c->in_len == 0) c->deadline_ns = kvbm__rd_now_ns() + (int64_t)(d->cfg.io_timeout_s * 1e9);
      c->in_len += (size_t)n;
      continue;
    }
    if (n == 0) { /* the peer is done sending: answer what came, then close */
      process(d, c);
      c->closing = true;
      return c->out_len > 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  process(d, c);
  return true;
}

static bool conn_write(conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  c->out_off = c->out_len = 0;
  return !c->closing;
}

static void accept_all(kvbm_router_daemon *d) {
  http_state *h = d->http;
  for (;;) {
    int fd = accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (h->nc >= d->cfg.max_connections) {
      static const char busy[] =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Content-Length: 45\r\nConnection: close\r\n\r\n{\"error\":\"too many connections\",\"status\":503}";
      ssize_t w = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL);
      (void)w;
      close(fd);
      continue;
    }
    if (h->nc == h->cc) {
      size_t cc = h->cc ? h->cc * 2 : 16;
      conn *nc = realloc(h->c, cc * sizeof *nc);
      if (!nc) {
        close(fd);
        return;
      }
      h->c = nc;
      h->cc = cc;
    }
    h->c[h->nc++] = (conn){.fd = fd,
                           .deadline_ns = kvbm__rd_now_ns() + (int64_t)(d->cfg.io_timeout_s * 1e9)};
    h->conns++;
  }
}

int kvbm_router_daemon_run(kvbm_router_daemon *d, kvbm_error *err) {
  http_state *h = d->http;
  int rc = KVBM_OK;
  while (!atomic_load(&d->stop)) {
    size_t n = h->nc + 2;
    if (n > h->cpfd) {
      struct pollfd *p = realloc(h->pfd, n * sizeof *p);
      if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "router: out of memory");
      h->pfd = p;
      h->cpfd = n;
    }
    h->pfd[0] = (struct pollfd){.fd = d->lfd, .events = POLLIN};
    h->pfd[1] = (struct pollfd){.fd = d->wake[0], .events = POLLIN};
    for (size_t i = 0; i < h->nc; i++)
      h->pfd[i + 2] = (struct pollfd){.fd = h->c[i].fd,
                                      .events = (short)(h->c[i].out_len ? POLLOUT : POLLIN)};
    int np = poll(h->pfd, n, 100);
    if (np < 0 && errno != EINTR) {
      rc = kvbm_error_set(err, KVBM_EIO, "router: poll: %s", strerror(errno));
      break;
    }
    int64_t now = kvbm__rd_now_ns();
    /* connections, back to front so removal keeps indices valid */
    for (size_t i = h->nc; i-- > 0;) {
      conn *c = &h->c[i];
      short re = h->pfd[i + 2].revents;
      bool keep = true;
      if (re & (POLLERR | POLLNVAL)) keep = false;
      else if (c->out_len && (re & (POLLOUT | POLLHUP))) keep = conn_write(c);
      else if (!c->out_len && (re & (POLLIN | POLLHUP))) keep = conn_read(d, c);
      if (keep && c->out_len && !(re & POLLOUT)) keep = conn_write(c); /* answer at once */
      if (keep && !c->out_len && c->closing) keep = false;
      if (keep && !c->out_len && now > c->deadline_ns) {
        if (c->in_len) reply_error(h, c, 408, "request not complete in time", true, NULL);
        else keep = false; /* idle keep-alive connection */
        if (keep) keep = conn_write(c) && c->out_len;
      }
      if (!keep) conn_close(h, i);
    }
    if (h->pfd[0].revents & POLLIN) accept_all(d);
    if (h->pfd[1].revents & POLLIN) {
      char buf[64];
      ssize_t r = read(d->wake[0], buf, sizeof buf);
      (void)r;
    }
    load_expire(h, now);
    kvbm__rd_sources_tick(d);
    if (d->approx) {
      pthread_mutex_lock(&d->wlock);
      kvbm_approx_expire(d->approx, (double)now * 1e-9);
      pthread_mutex_unlock(&d->wlock);
    }
  }
  return rc;
}

void kvbm_router_daemon_stop(kvbm_router_daemon *d) {
  atomic_store(&d->stop, 1);
  ssize_t w = write(d->wake[1], "x", 1);
  (void)w;
}

uint16_t kvbm_router_daemon_port(const kvbm_router_daemon *d) { return d->port; }

/* ------------------------------------------------------------- setup */

static int check_config(const kvbm_router_daemon_config *c, kvbm_error *err) {
  int rc = kvbm_choice_config_check(&c->choice, err);
  if (rc) return rc;
  if (!c->host || !*c->host) return kvbm_error_set(err, KVBM_EINVAL, "router: no host to listen on");
  if (c->num_sources && !c->sources)
    return kvbm_error_set(err, KVBM_EINVAL, "router: sources missing");
  if (c->num_workers && !c->workers)
    return kvbm_error_set(err, KVBM_EINVAL, "router: workers missing");
  if (c->num_workers > KVBM_ROUTER_MAX_WORKERS)
    return kvbm_error_set(err, KVBM_EINVAL, "router: more than %d workers", KVBM_ROUTER_MAX_WORKERS);
  if (!isfinite(c->approx_ttl_s) || c->approx_ttl_s < 0 || !isfinite(c->worker_timeout_s) ||
      c->worker_timeout_s < 0 || !isfinite(c->request_ttl_s) || c->request_ttl_s <= 0 ||
      !isfinite(c->io_timeout_s) || c->io_timeout_s <= 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router: approx ttl, worker timeout (>= 0), request ttl and io timeout "
                          "(> 0) must be finite");
  if (c->max_body < 64 || c->max_connections < 1 || c->max_tokens < 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router: max_body >= 64, max_connections and "
                                            "max_tokens >= 1");
  for (size_t i = 0; i < c->num_sources; i++) {
    const kvbm_router_source *s = &c->sources[i];
    if (!s->endpoint || !*s->endpoint)
      return kvbm_error_set(err, KVBM_EINVAL, "router: source %zu has no endpoint", i);
    if (s->kind != KVBM_SOURCE_ZMQ && s->kind != KVBM_SOURCE_NATS)
      return kvbm_error_set(err, KVBM_EINVAL, "router: source %zu has an unknown kind", i);
  }
  return KVBM_OK;
}

static char *dup_str(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

static int listen_on(kvbm_router_daemon *d, kvbm_error *err) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(d->cfg.port)};
  if (inet_pton(AF_INET, d->host, &a.sin_addr) != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "router: '%s' is not an IPv4 address", d->host);
  d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (d->lfd >= 0) setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (d->lfd < 0 || bind(d->lfd, (struct sockaddr *)&a, sizeof a) || listen(d->lfd, 128))
    return kvbm_error_set(err, KVBM_EIO, "router: listen on %s:%u: %s", d->host, d->cfg.port,
                          strerror(errno));
  socklen_t al = sizeof a;
  getsockname(d->lfd, (struct sockaddr *)&a, &al);
  d->port = ntohs(a.sin_port);
  return KVBM_OK;
}

int kvbm_router_daemon_create(const kvbm_router_daemon_config *cfg, kvbm_router_daemon **out,
                           kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "router: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  kvbm_router_daemon *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "router: out of memory");
  d->lfd = d->wake[0] = d->wake[1] = -1;
  d->cfg = *cfg;
  bool oom = false;
  d->host = dup_str(cfg->host, &oom);
  d->http = calloc(1, sizeof *d->http);
  d->scfg = calloc(cfg->num_sources + 1, sizeof *d->scfg);
  d->src = calloc(cfg->num_sources + 1, sizeof *d->src);
  d->workers = calloc(cfg->num_workers + 1, sizeof *d->workers);
  oom |= !d->http || !d->scfg || !d->src || !d->workers;
  for (size_t i = 0; !oom && i < cfg->num_sources; i++) {
    d->scfg[i] = cfg->sources[i];
    d->scfg[i].endpoint = dup_str(cfg->sources[i].endpoint, &oom);
    d->scfg[i].replay_endpoint = dup_str(cfg->sources[i].replay_endpoint, &oom);
    d->scfg[i].subject = dup_str(cfg->sources[i].subject, &oom);
    d->scfg[i].topic = dup_str(cfg->sources[i].topic, &oom);
  }
  d->nsrc = cfg->num_sources;
  if (!oom && cfg->num_workers) memcpy(d->workers, cfg->workers, cfg->num_workers * sizeof *d->workers);
  d->cfg.host = d->host;
  d->cfg.sources = d->scfg;
  d->cfg.workers = d->workers;
  pthread_mutex_init(&d->wlock, NULL);
  if (oom) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "router: out of memory");
    goto fail;
  }
  d->http->rng = cfg->seed ? cfg->seed : 1;
  d->http->t0 = kvbm__rd_now_ns();
  if ((rc = kvbm_index_create(&cfg->index, &d->idx, err))) goto fail;
  for (size_t i = 0; i < cfg->num_workers; i++)
    if ((rc = kvbm_index_add_worker(d->idx, cfg->workers[i], NULL, err))) goto fail;
  if (cfg->approx_ttl_s > 0 && (rc = kvbm_approx_create(d->idx, cfg->approx_ttl_s, &d->approx, err)))
    goto fail;
  if (pipe2(d->wake, O_NONBLOCK | O_CLOEXEC)) {
    rc = kvbm_error_set(err, KVBM_EIO, "router: pipe: %s", strerror(errno));
    goto fail;
  }
  if ((rc = listen_on(d, err))) goto fail;
  if ((rc = kvbm__rd_sources_start(d, err))) goto fail;
  *out = d;
  return KVBM_OK;
fail:
  kvbm_router_daemon_destroy(d);
  return rc;
}

void kvbm_router_daemon_destroy(kvbm_router_daemon *d) {
  if (!d) return;
  if (d->src) kvbm__rd_sources_stop(d);
  if (d->http) {
    while (d->http->nc) conn_close(d->http, 0);
    free(d->http->c);
    free(d->http->pfd);
    free(d->http->r);
    free(d->http);
  }
  if (d->lfd >= 0) close(d->lfd);
  for (int i = 0; i < 2; i++)
    if (d->wake[i] >= 0) close(d->wake[i]);
  kvbm_approx_destroy(d->approx);
  kvbm_index_destroy(d->idx);
  for (size_t i = 0; d->scfg && i < d->nsrc; i++) {
    free((char *)d->scfg[i].endpoint);
    free((char *)d->scfg[i].replay_endpoint);
    free((char *)d->scfg[i].subject);
    free((char *)d->scfg[i].topic);
  }
  free(d->scfg);
  free(d->src);
  free(d->workers);
  free(d->host);
  pthread_mutex_destroy(&d->wlock);
  free(d);
}
