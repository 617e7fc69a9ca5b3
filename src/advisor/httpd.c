/*
 * httpd.c: the advisor daemon's GET-only HTTP server (see httpd.h).
 *
 * The router's rules (docs/areas/router.md, "Hostile clients"), on the
 * router's head parser (kvbm__http_parse_head), for a server that takes no
 * bodies: a request with a body is 413, Transfer-Encoding 501, anything
 * but GET 405, and the head itself is bounded (16 KiB, 431). One thread
 * serves every connection with poll():
 *  - Turns: at most 8 requests per connection per wake-up, and none while
 *    64 KiB of its answers wait; pipelined requests left over keep poll
 *    from sleeping, so one client cannot starve the others.
 *  - Bounded buffers: a connection reads at most one head (16 KiB) ahead,
 *    and not while its answers wait; the kernel's send buffer is 64 KiB.
 *  - Deadlines both ways: a request must be complete within io_timeout of
 *    its first byte (408), an idle connection goes after io_timeout, and
 *    answers must be taken within io_timeout of being queued.
 *  - Connections over max_connections are answered 503; at the
 *    descriptor limit the listening socket rests 100 ms instead of
 *    spinning on accept.
 */
#include "advisor/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"

#define MAX_HEAD (16 * 1024)
#define TURN_REQUESTS 8
#define OUT_SOFT (64 * 1024)
#define SNDBUF (64 * 1024)
#define ACCEPTS_PER_TURN 64
#define ACCEPT_PAUSE_MS 100

typedef struct hconn {
  int fd;
  char *in;
  size_t in_len, scanned;
  char *out;
  size_t out_len, out_off, out_cap;
  uint64_t first_ms, last_ms, out_since_ms;
  bool closing;
} hconn;

struct kvbm__httpd {
  kvbm__httpd_config cfg;
  kvbm__httpd_handler fn;
  void *user;
  int lfd, port;
  hconn **c;
  size_t nc;
  uint64_t pause_until;
  char *body;
  size_t body_cap;
  struct pollfd *pfd;
  kvbm__httpd_stats st;
};

static uint64_t now_ms(void) { return kvbm_clock_ns() / 1000000u; }

int kvbm__httpd_create(const kvbm__httpd_config *cfg, kvbm__httpd_handler fn, void *user,
                       kvbm__httpd **out, kvbm_error *err) {
  if (!cfg || !cfg->listen || !fn || !out) return kvbm_error_set(err, KVBM_EINVAL, "advisor http: NULL argument");
  char host[256];
  const char *colon = strrchr(cfg->listen, ':');
  if (!colon || (size_t)(colon - cfg->listen) >= sizeof host)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor http: --listen '%s' is not HOST:PORT", cfg->listen);
  memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
  host[colon - cfg->listen] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || port < 0 || port > 65535)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor http: port '%s' is not in 0..65535", colon + 1);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor http: '%s' is not an IPv4 address", host);
  kvbm__httpd *h = calloc(1, sizeof *h);
  if (!h) return kvbm_error_set(err, KVBM_ENOMEM, "advisor http: out of memory");
  h->cfg = *cfg;
  if (!h->cfg.max_connections) h->cfg.max_connections = 64;
  if (!h->cfg.io_timeout_ms) h->cfg.io_timeout_ms = 10000;
  h->fn = fn;
  h->user = user;
  h->c = calloc(h->cfg.max_connections, sizeof *h->c);
  h->pfd = calloc(h->cfg.max_connections + 1, sizeof *h->pfd);
  h->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  socklen_t al = sizeof a;
  if (!h->c || !h->pfd || h->lfd < 0 ||
      setsockopt(h->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(h->lfd, (struct sockaddr *)&a, sizeof a) || listen(h->lfd, 128) ||
      getsockname(h->lfd, (struct sockaddr *)&a, &al)) {
    int e = errno;
    kvbm__httpd_destroy(h);
    return kvbm_error_set(err, KVBM_EIO, "advisor http: cannot listen on %s: %s", cfg->listen, strerror(e));
  }
  h->port = ntohs(a.sin_port);
  *out = h;
  return KVBM_OK;
}

int kvbm__httpd_port(const kvbm__httpd *h) { return h ? h->port : -1; }

static void conn_close(kvbm__httpd *h, size_t i) {
  hconn *c = h->c[i];
  close(c->fd);
  free(c->in);
  free(c->out);
  free(c);
  h->c[i] = h->c[--h->nc];
  h->st.connections = h->nc;
}

static bool out_append(hconn *c, const char *p, size_t n) {
  if (c->out_len + n > c->out_cap) {
    size_t nc = c->out_cap ? c->out_cap : 4096;
    while (nc < c->out_len + n) nc *= 2;
    char *o = realloc(c->out, nc);
    if (!o) return false;
    c->out = o;
    c->out_cap = nc;
  }
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
  return true;
}

static void respond(kvbm__httpd *h, hconn *c, int status, const char *body, size_t len, bool keep) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "Connection: %s\r\n\r\n",
                   status, kvbm__http_reason(status), len, keep ? "keep-alive" : "close");
  if (!out_append(c, head, (size_t)n) || !out_append(c, body, len)) c->closing = true;
  if (!c->out_since_ms) c->out_since_ms = now_ms();
  size_t pending = c->out_len - c->out_off;
  if (pending > h->st.out_peak) h->st.out_peak = pending;
  if (!keep) c->closing = true;
}

static void respond_error(kvbm__httpd *h, hconn *c, int status, const char *why) {
  char body[320];
  char safe[200];
  size_t k = 0;
  for (const char *p = why ? why : ""; *p && k + 1 < sizeof safe; p++)
    if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) safe[k++] = *p;
  safe[k] = 0;
  int n = snprintf(body, sizeof body, "{\"error\":\"%s\",\"status\":%d}", safe, status);
  h->st.bad_requests++;
  respond(h, c, status, body, (size_t)n, false);
}

/* Answers up to TURN_REQUESTS complete requests of one connection. */
static void serve(kvbm__httpd *h, hconn *c, uint64_t now) {
  for (int turn = 0; turn < TURN_REQUESTS && !c->closing; turn++) {
    if (c->out_len - c->out_off >= OUT_SOFT) {
      h->st.turns_cut++;
      return;
    }
    http_req req;
    int status;
    const char *why;
    http_result r = kvbm__http_parse_head(c->in, c->in_len, MAX_HEAD, 0, &c->scanned, &req, &status, &why);
    if (r == HTTP_NEED_MORE) {
      if (c->in_len && !c->first_ms) c->first_ms = now;
      return;
    }
    if (r == HTTP_BAD) {
      respond_error(h, c, status, why);
      return;
    }
    h->st.requests++;
    memmove(c->in, c->in + req.head_len, c->in_len - req.head_len);
    c->in_len -= req.head_len;
    c->scanned = 0;
    c->first_ms = c->in_len ? now : 0;
    if (strcmp(req.method, "GET")) {
      respond_error(h, c, 405, "only GET is served");
      return;
    }
    size_t len = 0;
    int st = h->fn(h->user, &req, &h->body, &len, &h->body_cap);
    if (st >= 400) h->st.bad_requests++;
    else h->st.answered++;
    respond(h, c, st, h->body ? h->body : "", len, req.keep_alive);
  }
  if (c->in_len && kvbm__http_parse_head(c->in, c->in_len, MAX_HEAD, 0, NULL, &(http_req){0},
                                         &(int){0}, &(const char *){NULL}) != HTTP_NEED_MORE)
    h->st.turns_cut++;
}

static bool conn_write(kvbm__httpd *h, hconn *c) {
  while (c->out_off < c->out_len) {
    ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (w <= 0) return false;
    c->out_off += (size_t)w;
    c->out_since_ms = now_ms(); /* progress: the client is reading */
  }
  c->out_len = c->out_off = 0;
  c->out_since_ms = 0;
  (void)h;
  return !c->closing;
}

static void accept_some(kvbm__httpd *h, uint64_t now) {
  for (int k = 0; k < ACCEPTS_PER_TURN; k++) {
    int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        h->pause_until = now + ACCEPT_PAUSE_MS;
        h->st.accept_pauses++;
      }
      return;
    }
    if (h->nc >= h->cfg.max_connections) {
      static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                 "Content-Length: 44\r\nConnection: close\r\n\r\n"
                                 "{\"error\":\"too many connections\",\"status\":503}";
      ssize_t w = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)w;
      close(fd);
      h->st.refused_busy++;
      continue;
    }
    hconn *c = calloc(1, sizeof *c);
    if (c) c->in = malloc(MAX_HEAD);
    if (!c || !c->in) {
      if (c) free(c);
      close(fd);
      h->st.refused_busy++;
      continue;
    }
    int one = 1, sb = SNDBUF;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
    c->fd = fd;
    c->last_ms = now;
    h->c[h->nc++] = c;
    h->st.accepted++;
    h->st.connections = h->nc;
  }
}

/* Milliseconds from then to now; 0 when then is later (stamps taken
 * after the turn's clock reading). */
static uint64_t since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

/* A connection's deadlines; false when it must go. */
static bool deadlines(kvbm__httpd *h, hconn *c, uint64_t now) {
  uint64_t t = h->cfg.io_timeout_ms;
  if (c->out_len > c->out_off && since(now, c->out_since_ms) > t) {
    h->st.write_timeouts++;
    return false;
  }
  if (c->first_ms && since(now, c->first_ms) > t && !c->closing) {
    h->st.read_timeouts++;
    respond_error(h, c, 408, "request not complete in time");
    return true;
  }
  if (!c->first_ms && c->out_len == c->out_off && since(now, c->last_ms) > t) return false;
  return true;
}

void kvbm__httpd_poll(kvbm__httpd *h, int timeout_ms) {
  if (!h) return;
  uint64_t now = now_ms();
  size_t np = 0;
  bool pending = false;
  bool listening = now >= h->pause_until;
  h->pfd[np++] = (struct pollfd){.fd = listening ? h->lfd : -1, .events = POLLIN};
  for (size_t i = 0; i < h->nc; i++) {
    hconn *c = h->c[i];
    short ev = 0;
    bool waiting_out = c->out_len > c->out_off;
    if (!c->closing && c->in_len < MAX_HEAD && (c->out_len - c->out_off) < OUT_SOFT) ev |= POLLIN;
    if (waiting_out) ev |= POLLOUT;
    if (c->in_len && !c->closing && (c->out_len - c->out_off) < OUT_SOFT &&
        kvbm__http_parse_head(c->in, c->in_len, MAX_HEAD, 0, NULL, &(http_req){0}, &(int){0},
                              &(const char *){NULL}) != HTTP_NEED_MORE)
      pending = true; /* a complete request left from the last turn */
    h->pfd[np++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  int wait = pending ? 0 : timeout_ms;
  if (!listening && (int64_t)(h->pause_until - now) < wait) wait = (int)(h->pause_until - now);
  int r = poll(h->pfd, np, wait);
  if (r < 0 && errno != EINTR) return;
  now = now_ms();
  size_t polled = h->nc; /* h->c[i] is h->pfd[i + 1] for these */
  if (listening && (h->pfd[0].revents & POLLIN)) accept_some(h, now);
  for (size_t i = 0; i < polled; i++) {
    hconn *c = h->c[i];
    short re = h->pfd[i + 1].revents;
    bool ok = true;
    if (re & POLLIN) {
      ssize_t n = recv(c->fd, c->in + c->in_len, MAX_HEAD - c->in_len, 0);
      if (n > 0) {
        c->in_len += (size_t)n;
        c->last_ms = now;
        if (!c->first_ms) c->first_ms = now;
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ok = false;
      }
    } else if (re & (POLLERR | POLLHUP | POLLNVAL)) {
      ok = false;
    }
    if (ok) serve(h, c, now);
    if (ok) ok = deadlines(h, c, now);
    if (ok && c->out_len > c->out_off) ok = conn_write(h, c);
    else if (ok && c->closing) ok = false;
    if (!ok) {
      close(c->fd);
      free(c->in);
      free(c->out);
      free(c);
      h->c[i] = NULL;
    }
  }
  size_t j = 0;
  for (size_t i = 0; i < h->nc; i++)
    if (h->c[i]) h->c[j++] = h->c[i];
  h->nc = j;
  h->st.connections = h->nc;
}

void kvbm__httpd_stats_get(const kvbm__httpd *h, kvbm__httpd_stats *out) {
  if (h && out) *out = h->st;
}

void kvbm__httpd_destroy(kvbm__httpd *h) {
  if (!h) return;
  while (h->nc) conn_close(h, h->nc - 1);
  if (h->lfd >= 0) close(h->lfd);
  free(h->c);
  free(h->pfd);
  free(h->body);
  free(h);
}
