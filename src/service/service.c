/* SPDX-License-Identifier: Apache-2.0 */
/*
 * service.c: the HTTP service layer (service.h has the contract).
 *
 * Why one layer. kvbm had two HTTP servers, the router daemon's and the
 * metrics endpoint's (which also served the advisor's API), each with its
 * own poll loop, write path and fairness rules (issue 23): a guard added
 * to one was missing from the other, and `kvbm worker` would have made a
 * third. Here the transport is written once and a server is a table of
 * routes. The codecs stay in src/common/ (http.c parses heads, admit.c is
 * the admission rule, sendbuf.h the send loop); this file is the sockets.
 *
 * One thread serves every connection with poll(): non-blocking sockets,
 * keep-alive and pipelining (answers in order). The thread is the
 * caller's (kvbm__service_run: the router daemon runs its own loop on the
 * caller's thread) or one of the service's own (kvbm__service_start: the
 * metrics endpoint inside an engine). A wake-up pipe makes stop prompt.
 *
 * One thread serves everyone, so no client may hold it or its memory.
 * These rules are the router daemon's (docs/areas/router.md, issue 24),
 * which the metrics endpoint had in weaker forms:
 *  - Turns. A wake-up gives each connection one turn: at most
 *    TURN_REQUESTS requests answered, none while OUT_SOFT bytes of its
 *    answers wait, and no more request bytes than its credit (each turn
 *    adds TURN_BYTES, a request spends its size, a connection with
 *    nothing complete keeps none: deficit round robin). A connection with
 *    complete requests left keeps them for its next turn (poll then does
 *    not sleep), so a client that pipelines megabytes is served at the
 *    others' pace, not ahead of them.
 *  - Linear input. Consumed requests advance an offset; the unconsumed
 *    tail moves to the front only before a read and only when no complete
 *    request is left, so a byte moves at most once; a head's end is
 *    searched from where the last search stopped.
 *  - Bounded buffers. Input is read only up to the request being
 *    assembled plus READ_AHEAD (never past max_head + the largest route
 *    body), and not while complete requests or answers wait; output stops
 *    growing at OUT_SOFT plus one answer. A client that never reads its
 *    answers holds at most that, and only until io_timeout_s.
 *  - Strict heads and per-route limits. The head parser refuses what is
 *    malformed or too long (400, 414, 431, 501, 505, 417); a body must
 *    have a Content-Length (411) within its route's max_body (413, the
 *    connection then closes: the body is not read); an unknown path gets
 *    404, a method the route does not take 405 with Allow.
 *  - Deadlines both ways. A request must arrive within io_timeout_s of its
 *    first byte (else 408), answers queued must be taken within
 *    io_timeout_s of being queued (else the connection is closed), an idle
 *    keep-alive connection goes io_timeout_s after it became idle.
 *  - Admission (common/admit.c says why): at most max_connections, at
 *    most max_per_peer from one client; a newcomer over a bound takes the
 *    slot of the connection idle longest (its address's own at the
 *    address's bound), 503 only when none is idle. Idle is strict because
 *    of pipelining: no unconsumed input, no head parsed, nothing queued,
 *    no bytes seen waiting.
 *  - Descriptors. At the descriptor limit accept() fails while the
 *    connection stays queued and poll() reports it again at once: a spare
 *    descriptor (a dup of the listening socket) is given up for a moment
 *    to take the connection and answer it 503; when even that fails the
 *    listening socket rests ACCEPT_PAUSE_MS.
 *
 * Handlers answer inline on the loop thread: the router's /route is a
 * lookup of microseconds and the metrics page a render of milliseconds.
 * Answers are counted by status code in atomics, read by any thread
 * (the metrics endpoint's collector renders them).
 *
 * Deferred answers (`kvbm worker`'s /generate is answered when a
 * simulated generation ends, seconds later, on another thread):
 *  - Parking. A handler that calls kvbm__service_defer gets a ticket and
 *    its connection is parked: the request is consumed, nothing more of
 *    the connection is read or answered until the ticket's answer is
 *    queued, so pipelined answers stay in order and the input bound still
 *    holds (the kernel keeps what the client sends meanwhile). At most
 *    max_deferred are parked at once; over it the handler answers now.
 *  - Completion. kvbm__service_complete, on any thread, copies the answer
 *    into a list under a mutex and writes a byte to the wake-up pipe; the
 *    loop takes the list at its next wake-up and queues each answer on
 *    the connection parked under that ticket (found by a walk of the
 *    table: tickets are never reused, connections move when one closes).
 *    The list holds at most one answer per ticket ever given, and the
 *    owner of a ticket answers it once.
 *  - A client that goes. A parked connection is polled for POLLRDHUP
 *    only: the client closing its side (HTTP clients do not half-close
 *    while they wait for an answer) or an error frees the connection and
 *    tells the route's `gone`; its answer, when it comes, is dropped and
 *    counted. A parked connection is never idle for admission.
 *  - Deadline. A parked request unanswered defer_timeout_s after it was
 *    parked gets 504 and the connection closes (`gone` is told).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/admit.h"
#include "common/clock.h"
#include "common/http.h"
#include "common/sendbuf.h"
#include "common/vec.h"
#include "service/service.h"

#define TURN_REQUESTS 8        /* answered per connection per wake-up */
#define TURN_BYTES (64 * 1024) /* request bytes a turn adds to a connection's credit */
#define OUT_SOFT KVBM__SERVICE_OUT_SOFT /* no more answers while this much waits */
#define READ_AHEAD (64 * 1024) /* input read past the request being assembled */
#define ACCEPTS_PER_TURN 64
#define ACCEPT_PAUSE_MS 100
#define DEFAULT_HEAD 8192
#define MAX_HEAD_LIMIT (64 * 1024)

/* Answers counted apart; everything else is counted in the last slot. */
static const int codes[] = {100, 200, 201, 202, 204, 400, 404, 405, 408, 411,
                            413, 414, 417, 429, 431, 500, 501, 503, 504, 505};
#define NCODES (sizeof codes / sizeof codes[0])

typedef struct sconn {
  int fd;
  char *in;
  size_t in_off, in_len, in_cap; /* unconsumed input: in[in_off..in_len) */
  size_t scanned;                /* of the head at in_off */
  http_req rq;                   /* that head, once complete */
  bool have_head;
  char *out;
  size_t out_len, out_off, out_cap;
  int64_t deadline_ns;  /* request complete by then (none begun: idle until) */
  int64_t wdeadline_ns; /* the output queued must be taken by then */
  int64_t idle_ns;      /* accepted or output last all taken */
  size_t credit;        /* request bytes it may have answered (turns) */
  uint32_t peer;
  bool closing;         /* close once `out` is written */
  bool eof;             /* the client will send no more */
  bool backlog;         /* its turn ended with work left */
  bool sent_continue;
  bool pending;         /* bytes seen waiting (MSG_PEEK), not read yet */
  bool parked;          /* a deferred request waits for its answer */
  bool park_head;       /* ... a HEAD (no body in the answer) */
  bool park_close;      /* ... the connection closes after it */
  uint64_t ticket;      /* ... its ticket */
  int64_t park_deadline_ns;
  const kvbm__service_route *park_route;
} sconn;

/* An answer from kvbm__service_complete waiting for the loop. */
typedef struct done_answer {
  uint64_t ticket;
  int status;
  bool close;
  char *body;
  size_t len;
} done_answer;

struct kvbm__service {
  kvbm__service_config cfg;
  kvbm__service_route routes[KVBM__SERVICE_MAX_ROUTES];
  char name[32], host[INET_ADDRSTRLEN];
  size_t max_head, max_body; /* max_body: the largest route's */
  int lfd, wake[2], spare_fd;
  uint16_t port;
  pthread_t th;
  bool started;
  _Atomic int stop;
  /* the loop thread's own */
  sconn *c;
  size_t nc, cc;
  struct pollfd *pfd;
  size_t cpfd;
  int64_t now, io_ns, accept_at;
  kvbm__service_buf scratch;
  uint64_t next_ticket;
  int64_t defer_ns;
  uint32_t max_deferred;
  sconn *dispatching;       /* the connection whose handler runs now */
  /* deferred answers handed over by other threads */
  pthread_mutex_t done_mu;
  done_answer *done;
  size_t ndone, cdone;
  _Atomic size_t done_waiting;
  /* counters (any thread) */
  _Atomic uint64_t answers[NCODES + 1];
  _Atomic uint64_t open, accepted, refused, refused_peer, refused_no_fd, idle_closed_full,
      idle_closed_peer, accept_pauses, requests, answered, bad, read_timeouts, write_timeouts,
      idle_timeouts, turns_cut, out_peak, err4, err5, parked, deferred, deferred_answered,
      deferred_gone, deferred_timeouts, deferred_dropped;
};

/* ------------------------------------------------------------- buffers */

bool kvbm__service_buf_append(kvbm__service_buf *b, const void *p, size_t n) {
  if (b->oom) return false;
  if (kvbm__vec_reserve_of(&b->p, &b->cap, b->len + n + 1, 1024, KVBM__VEC_NO_LIMIT)) {
    b->oom = true;
    return false;
  }
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
  b->p[b->len] = 0;
  return true;
}

bool kvbm__service_buf_printf(kvbm__service_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || b->oom ||
      kvbm__vec_reserve_of(&b->p, &b->cap, b->len + (size_t)n + 1, 1024, KVBM__VEC_NO_LIMIT)) {
    b->oom = true;
    return false;
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return true;
}

/* ------------------------------------------------------------ answers */

/* Any answer, by code (a 503 to a newcomer refused at admission too). */
static void count_code(kvbm__service *s, int code) {
  size_t i = 0;
  while (i < NCODES && codes[i] != code) i++;
  atomic_fetch_add(&s->answers[i], 1);
  if (code >= 200) atomic_fetch_add(code < 400 ? &s->answered : &s->bad, 1);
}

/* An answer queued on a connection. */
static void count_answer(kvbm__service *s, int code) {
  if (code >= 400) atomic_fetch_add(code < 500 ? &s->err4 : &s->err5, 1);
  count_code(s, code);
}

/* Appends to the output; the first bytes queued start the write deadline. */
static bool out_append(kvbm__service *s, sconn *c, const char *a, size_t an, const char *b,
                       size_t bn) {
  size_t need = c->out_len + an + bn;
  if (kvbm__vec_reserve_of(&c->out, &c->out_cap, need, 1024, KVBM__VEC_NO_LIMIT)) {
    c->closing = true;
    return false;
  }
  if (c->out_len == c->out_off) c->wdeadline_ns = s->now + s->io_ns;
  memcpy(c->out + c->out_len, a, an);
  if (bn) memcpy(c->out + c->out_len + an, b, bn);
  c->out_len = need;
  uint64_t q = c->out_len - c->out_off;
  if (q > atomic_load(&s->out_peak)) atomic_store(&s->out_peak, q);
  return true;
}

/* Appends s to the head being built at p (bounded by end). */
static char *put(char *p, const char *end, const char *s) {
  while (*s && p < end) *p++ = *s++;
  return p;
}

/* Appends v in decimal. */
static char *put_num(char *p, const char *end, size_t v) {
  char digits[24], *d = digits + sizeof digits;
  *--d = 0;
  do *--d = (char)('0' + v % 10);
  while ((v /= 10) && d > digits);
  return put(p, end, d);
}

/* Queues an answer: the head, and the body unless head_only (HEAD:
 * Content-Length still says what GET would send). The head is assembled
 * by hand: snprintf cost as much as the rest of the transport of a small
 * answer (the router's /health, measured when it was the router's). */
static void queue_answer(kvbm__service *s, sconn *c, int code, const char *ctype,
                         const char *extra, const char *body, size_t blen, bool head_only,
                         bool close) {
  char head[512];
  const char *end = head + sizeof head;
  char *p = put(head, end, "HTTP/1.1 ");
  p = put_num(p, end, (size_t)code);
  p = put(p, end, " ");
  p = put(p, end, kvbm__http_reason(code));
  p = put(p, end, "\r\nContent-Type: ");
  p = put(p, end, ctype);
  p = put(p, end, "\r\nContent-Length: ");
  p = put_num(p, end, blen);
  p = put(p, end, close ? "\r\nConnection: close\r\n" : "\r\nConnection: keep-alive\r\n");
  if (extra && strlen(extra) <= 256) p = put(p, end, extra);
  p = put(p, end, "\r\n");
  count_answer(s, code);
  if (out_append(s, c, head, (size_t)(p - head), body, head_only ? 0 : blen) && close)
    c->closing = true;
}

/* The error body, JSON or text, into buf (bounded). */
static size_t error_body(const kvbm__service *s, int code, const char *msg, char *buf, size_t cap) {
  int n;
  if (s->cfg.json_errors) {
    char safe[256];
    size_t k = 0;
    for (const char *p = msg ? msg : ""; *p && k + 1 < sizeof safe; p++)
      if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) safe[k++] = *p;
    safe[k] = 0;
    n = snprintf(buf, cap, "{\"error\":\"%s\",\"status\":%d}%s", safe, code,
                 s->cfg.error_newline ? "\n" : "");
  } else {
    n = snprintf(buf, cap, "%s\n", msg ? msg : "");
  }
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

static void answer_error(kvbm__service *s, sconn *c, int code, const char *msg, const char *extra,
                         bool close) {
  char body[320];
  size_t n = error_body(s, code, msg, body, sizeof body);
  queue_answer(s, c, code,
               s->cfg.json_errors ? "application/json" : "text/plain; charset=utf-8", extra, body,
               n, false, close);
}

/* ------------------------------------------------------------- routes */

static unsigned method_bit(const char *m) {
  if (!strcmp(m, "GET")) return KVBM__SVC_GET;
  if (!strcmp(m, "HEAD")) return KVBM__SVC_HEAD;
  if (!strcmp(m, "POST")) return KVBM__SVC_POST;
  if (!strcmp(m, "PUT")) return KVBM__SVC_PUT;
  if (!strcmp(m, "DELETE")) return KVBM__SVC_DELETE;
  return KVBM__SVC_OTHER;
}

/* The route for (path, method): the first exact path that takes the
 * method, else the first fallback that does. NULL with *allow the union
 * of the methods the path's routes take (0: no route has the path). */
static const kvbm__service_route *route_find(const kvbm__service *s, const char *path,
                                             unsigned bit, unsigned *allow,
                                             const kvbm__service_route **named) {
  *allow = 0;
  *named = NULL;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < s->cfg.nroutes; i++) {
      const kvbm__service_route *r = &s->routes[i];
      if (pass == 0 ? !r->path || strcmp(r->path, path) : r->path != NULL) continue;
      if (r->methods & bit) return r;
      *allow |= r->methods;
      if (!*named) *named = r;
    }
    if (*allow) return NULL; /* the path is known: 405, not a fallback */
  }
  return NULL;
}

static void allow_header(unsigned m, char *buf, size_t cap) {
  static const char *const names[] = {"GET", "HEAD", "POST", "PUT", "DELETE"};
  size_t k = (size_t)snprintf(buf, cap, "Allow:");
  const char *sep = " ";
  for (unsigned i = 0; i < 5; i++)
    if (m & (1u << i)) {
      k += (size_t)snprintf(buf + k, cap - k, "%s%s", sep, names[i]);
      sep = ", ";
    }
  snprintf(buf + k, cap - k, "\r\n");
}

/* One complete request: head parsed, body at `body`. */
static void dispatch(kvbm__service *s, sconn *c, const http_req *rq, const char *body) {
  bool close = !rq->keep_alive || (c->eof && c->in_off + rq->head_len + rq->content_length ==
                                                 c->in_len);
  unsigned bit = method_bit(rq->method), allow;
  const kvbm__service_route *named, *r = route_find(s, rq->path, bit, &allow, &named);
  if (!r && !allow) {
    answer_error(s, c, 404, s->cfg.not_found ? s->cfg.not_found : "not found", NULL, close);
    return;
  }
  if (!r) {
    char hdr[64];
    allow_header(allow, hdr, sizeof hdr);
    answer_error(s, c, 405, named->method_msg ? named->method_msg : "method not allowed", hdr,
                 close);
    return;
  }
  s->scratch.len = 0;
  s->scratch.oom = false;
  kvbm__service_answer a = {.status = 200, .content_type = r->content_type,
                            .scratch = &s->scratch};
  kvbm__service_req q = {.head = rq, .body = body, .body_len = rq->content_length,
                         .peer = c->peer};
  s->dispatching = c;
  r->fn(r->user, s, &q, &a);
  s->dispatching = NULL;
  if (a.ticket) { /* kvbm__service_defer parked the connection */
    c->park_head = bit == KVBM__SVC_HEAD;
    c->park_close = close;
    c->park_route = r;
    return;
  }
  if (!a.body && s->scratch.oom) {
    answer_error(s, c, 500, "out of memory", NULL, true);
    return;
  }
  if (a.status < 100 || a.status > 599) a.status = 500;
  const char *b = a.body ? a.body : s->scratch.p ? s->scratch.p : "";
  size_t bl = a.body ? a.body_len : s->scratch.len;
  queue_answer(s, c, a.status, a.content_type ? a.content_type : "application/json", a.headers, b,
               bl, bit == KVBM__SVC_HEAD, close || a.close);
}

/* ------------------------------------------------------------- I/O */

static void conn_close(kvbm__service *s, size_t i) {
  sconn *c = &s->c[i];
  if (c->parked) { /* its answer will find no one */
    c->parked = false;
    atomic_fetch_sub(&s->parked, 1);
    atomic_fetch_add(&s->deferred_gone, 1);
    if (c->park_route->gone) c->park_route->gone(c->park_route->user, c->ticket);
  }
  close(s->c[i].fd);
  free(s->c[i].in);
  free(s->c[i].out);
  s->c[i] = s->c[--s->nc];
  atomic_store(&s->open, s->nc);
}

/* A head just parsed: the checks that come before its body is read. false
 * when it was refused (the connection closes after the answer). */
static bool head_ok(kvbm__service *s, sconn *c) {
  const http_req *rq = &c->rq;
  unsigned bit = method_bit(rq->method), allow;
  if (!rq->has_length && s->max_body && bit != KVBM__SVC_GET && bit != KVBM__SVC_HEAD &&
      bit != KVBM__SVC_DELETE) {
    answer_error(s, c, 411, "a request with a body needs Content-Length", NULL, true);
    return false;
  }
  const kvbm__service_route *named, *r = route_find(s, rq->path, bit, &allow, &named);
  if (r && rq->content_length > r->max_body) {
    char m[96];
    snprintf(m, sizeof m, "body over %zu bytes for %.40s", r->max_body, rq->path);
    answer_error(s, c, 413, m, NULL, true);
    return false;
  }
  return true;
}

static void send_continue(kvbm__service *s, sconn *c) {
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  if (out_append(s, c, cont, sizeof cont - 1, NULL, 0)) c->sent_continue = true;
}

/* One turn (the essay's "Turns"): answers complete requests at the front
 * of the input within the turn's bounds; c->backlog says whether work
 * was left for the next. */
static void process(kvbm__service *s, sconn *c) {
  int answered = 0;
  bool more = false;
  c->credit += TURN_BYTES;
  while (!c->closing && c->in_off < c->in_len) {
    if (answered == TURN_REQUESTS || c->out_len - c->out_off >= OUT_SOFT) {
      more = true;
      break;
    }
    const char *p = c->in + c->in_off;
    size_t avail = c->in_len - c->in_off;
    if (!c->have_head) {
      int status;
      const char *why;
      http_result r = kvbm__http_parse_head(p, avail, s->max_head, s->max_body, &c->scanned,
                                            &c->rq, &status, &why);
      if (r == HTTP_NEED_MORE) break;
      if (r == HTTP_BAD) {
        answer_error(s, c, status, why, NULL, true);
        break;
      }
      atomic_fetch_add(&s->requests, 1);
      if (!head_ok(s, c)) break;
      c->have_head = true;
    }
    size_t total = c->rq.head_len + c->rq.content_length;
    if (avail < total) {
      if (c->rq.expect_continue && !c->sent_continue) send_continue(s, c);
      break;
    }
    if (total > c->credit) { /* complete, but its turn will come */
      more = true;
      break;
    }
    c->credit -= total;
    dispatch(s, c, &c->rq, p + c->rq.head_len);
    answered++;
    c->in_off += total;
    c->have_head = c->sent_continue = false;
    c->scanned = 0;
    c->deadline_ns = s->now + s->io_ns;
    if (c->parked) { /* the rest waits for its answer (kept in order) */
      more = c->in_off < c->in_len;
      break;
    }
  }
  if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
  c->backlog = more && !c->closing;
  if (c->backlog && !c->parked) atomic_fetch_add(&s->turns_cut, 1);
  else c->credit = 0;
}

/* Reads what the request being assembled still needs plus READ_AHEAD,
 * within one request's limit. Called only when no complete request is
 * left, so the tail moved to the front is one request's and moves once. */
static bool conn_read(kvbm__service *s, sconn *c) {
  size_t limit = s->max_head + s->max_body; /* process() refuses what is bigger */
  size_t want = (c->have_head ? c->rq.head_len + c->rq.content_length : 0) + READ_AHEAD;
  if (want > limit) want = limit;
  c->pending = false;
  if (c->in_off) {
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  while (c->in_len < want) {
    if (c->in_len == c->in_cap &&
        kvbm__vec_reserve_of(&c->in, &c->in_cap, c->in_len + 1, 4096, limit))
      return false;
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n > 0) {
      if (c->in_len == 0) c->deadline_ns = s->now + s->io_ns; /* a request begins */
      c->in_len += (size_t)n;
      continue;
    }
    if (n == 0) {
      c->eof = true;
      return true;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    return false;
  }
  return true;
}

/* -1 failed, 0 more to write, 1 all out (then idle from now if no
 * request is begun: the keep-alive deadline starts). */
static int conn_write(kvbm__service *s, sconn *c) {
  int w = kvbm__send_pending(c->fd, c->out, c->out_len, &c->out_off);
  if (w <= 0) return w;
  c->out_off = c->out_len = 0;
  c->idle_ns = s->now;
  if (c->in_off == c->in_len && !c->have_head) c->deadline_ns = s->now + s->io_ns;
  return 1;
}

/* A parked connection's share: its earlier answers written, the client
 * watched for going, the deferral's deadline; false when it is to go. */
static bool parked_turn(kvbm__service *s, sconn *c, short re) {
  if (re & (POLLERR | POLLNVAL | POLLHUP | POLLRDHUP)) return false; /* conn_close: gone */
  if (c->out_len && (re & POLLOUT) && conn_write(s, c) < 0) return false;
  if (c->out_len && s->now > c->wdeadline_ns) {
    atomic_fetch_add(&s->write_timeouts, 1);
    return false;
  }
  if (s->now <= c->park_deadline_ns) return true;
  atomic_fetch_add(&s->deferred_timeouts, 1);
  c->parked = false;
  atomic_fetch_sub(&s->parked, 1);
  if (c->park_route->gone) c->park_route->gone(c->park_route->user, c->ticket);
  answer_error(s, c, 504, "answer not ready in time", NULL, true);
  return conn_write(s, c) == 0; /* stays only to finish writing the 504 */
}

/* One connection's share of a wake-up; false when it is to go. */
static bool conn_turn(kvbm__service *s, sconn *c, short re) {
  if (c->parked) return parked_turn(s, c, re);
  if (!re && !c->backlog && s->now <= (c->out_len ? c->wdeadline_ns : c->deadline_ns))
    return true; /* nothing happened to it */
  if (re & (POLLERR | POLLNVAL)) return false;
  if (c->out_len) {
    if ((re & (POLLOUT | POLLHUP)) && conn_write(s, c) < 0) return false;
  } else if (!c->backlog && !c->eof && (re & (POLLIN | POLLHUP))) {
    if (!conn_read(s, c)) return false;
  }
  if (!c->out_len && !c->closing) {
    if (c->in_len > c->in_off) process(s, c);
    else c->backlog = false;
    if (c->eof && !c->backlog) c->closing = true;
    if (c->out_len && conn_write(s, c) < 0) return false; /* answer at once */
  }
  if (c->out_len) {
    if (s->now <= c->wdeadline_ns) return true;
    atomic_fetch_add(&s->write_timeouts, 1);
    return false;
  }
  if (c->closing) return false;
  if (s->now <= c->deadline_ns) return true;
  if (c->in_len == c->in_off && !c->have_head) { /* idle keep-alive: no answer */
    atomic_fetch_add(&s->idle_timeouts, 1);
    return false;
  }
  atomic_fetch_add(&s->read_timeouts, 1);
  answer_error(s, c, 408, "request not complete in time", NULL, true);
  return conn_write(s, c) == 0; /* stays only to finish writing the 408 */
}

/* ---------------------------------------------------------- admission */

/* 503 on a connection that gets no slot, sent without waiting (a fresh
 * socket's buffer takes it), then closed. */
static void refuse(kvbm__service *s, int fd, const char *why) {
  char body[320], m[640];
  /* the text without a newline: the 503 is the whole exchange */
  size_t bn = s->cfg.json_errors ? error_body(s, 503, why, body, sizeof body)
                                 : (size_t)snprintf(body, sizeof body, "%s", why);
  int n = snprintf(m, sizeof m,
                   "HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%.*s",
                   s->cfg.json_errors ? "application/json" : "text/plain; charset=utf-8", bn,
                   (int)bn, body);
  ssize_t w = send(fd, m, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)w;
  close(fd);
  count_code(s, 503);
}

static void refuse_no_fd(kvbm__service *s) {
  if (s->spare_fd >= 0) {
    close(s->spare_fd);
    s->spare_fd = -1;
  }
  int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    refuse(s, fd, "out of file descriptors");
    atomic_fetch_add(&s->refused_no_fd, 1);
  }
  s->spare_fd = fcntl(s->lfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0 || s->spare_fd < 0) {
    s->accept_at = s->now + (int64_t)ACCEPT_PAUSE_MS * 1000000;
    atomic_fetch_add(&s->accept_pauses, 1);
  }
}

static bool conn_idle(const sconn *c) {
  return c->in_off == c->in_len && !c->have_head && !c->out_len && !c->closing && !c->pending &&
         !c->parked;
}

static void admit_get(const void *table, size_t i, kvbm__admit_conn *out) {
  const sconn *c = &((const sconn *)table)[i];
  *out = (kvbm__admit_conn){.fd = c->fd, .peer = c->peer, .idle = conn_idle(c),
                            .idle_ns = c->idle_ns};
}

static void admit_busy(void *table, size_t i) { ((sconn *)table)[i].pending = true; }

/* The shared rule; false (counted): refuse the newcomer with *why. */
static bool make_room(kvbm__service *s, uint32_t peer, const char **why) {
  kvbm__admit_table t = {.table = s->c, .n = s->nc, .max_conn = s->cfg.max_connections,
                         .max_per_peer = s->cfg.max_per_peer, .get = admit_get,
                         .busy = admit_busy};
  size_t v = 0;
  kvbm__admit_kind k = kvbm__admit_make_room(&t, peer, &v);
  switch (k) {
  case KVBM__ADMIT_ROOM:
    return true;
  case KVBM__ADMIT_CLOSE_PEER:
  case KVBM__ADMIT_CLOSE_FULL:
    conn_close(s, v);
    atomic_fetch_add(k == KVBM__ADMIT_CLOSE_PEER ? &s->idle_closed_peer : &s->idle_closed_full, 1);
    return true;
  case KVBM__ADMIT_REFUSE_PEER:
    atomic_fetch_add(&s->refused_peer, 1);
    *why = "too many connections from your address";
    return false;
  case KVBM__ADMIT_REFUSE_FULL:
    break;
  }
  atomic_fetch_add(&s->refused, 1);
  *why = "too many connections";
  return false;
}

static void accept_some(kvbm__service *s) {
  for (int k = 0; k < ACCEPTS_PER_TURN && s->now >= s->accept_at; k++) {
    struct sockaddr_storage pa;
    socklen_t pl = sizeof pa;
    int fd = accept4(s->lfd, (struct sockaddr *)&pa, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        refuse_no_fd(s);
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) { /* ENOBUFS, ENOMEM: rest */
        s->accept_at = s->now + (int64_t)ACCEPT_PAUSE_MS * 1000000;
        atomic_fetch_add(&s->accept_pauses, 1);
      }
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (s->cfg.sndbuf > 0)
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->cfg.sndbuf, sizeof s->cfg.sndbuf);
    uint32_t peer = kvbm__admit_peer_key((struct sockaddr *)&pa, pl);
    const char *why = NULL;
    if (!make_room(s, peer, &why)) {
      refuse(s, fd, why);
      continue;
    }
    if (kvbm__vec_reserve_of(&s->c, &s->cc, s->nc + 1, 16, KVBM__VEC_NO_LIMIT)) {
      refuse(s, fd, "out of memory");
      atomic_fetch_add(&s->refused, 1);
      continue;
    }
    s->c[s->nc++] = (sconn){.fd = fd, .deadline_ns = s->now + s->io_ns, .peer = peer,
                            .idle_ns = s->now};
    atomic_fetch_add(&s->accepted, 1);
    atomic_store(&s->open, s->nc);
  }
}

/* ------------------------------------------------------ deferred answers */

uint64_t kvbm__service_defer(kvbm__service *s, kvbm__service_answer *ans) {
  sconn *c = s ? s->dispatching : NULL;
  if (!c || !ans || c->parked || atomic_load(&s->parked) >= s->max_deferred) return 0;
  c->parked = true;
  c->ticket = ++s->next_ticket;
  c->park_deadline_ns = s->now + s->defer_ns;
  atomic_fetch_add(&s->parked, 1);
  atomic_fetch_add(&s->deferred, 1);
  ans->ticket = c->ticket;
  return c->ticket;
}

int kvbm__service_complete(kvbm__service *s, uint64_t ticket, int status, const char *body,
                           size_t len, bool close) {
  if (!s || !ticket || status < 100 || status > 599 || (len && !body)) return KVBM_EINVAL;
  done_answer d = {.ticket = ticket, .status = status, .close = close, .len = len,
                   .body = malloc(len ? len : 1)};
  if (!d.body) return KVBM_ENOMEM;
  if (len) memcpy(d.body, body, len);
  pthread_mutex_lock(&s->done_mu);
  int rc = kvbm__vec_reserve_of(&s->done, &s->cdone, s->ndone + 1, 16, KVBM__VEC_NO_LIMIT);
  if (!rc) {
    s->done[s->ndone++] = d;
    atomic_store(&s->done_waiting, s->ndone);
  }
  pthread_mutex_unlock(&s->done_mu);
  if (rc) {
    free(d.body);
    return KVBM_ENOMEM;
  }
  ssize_t w = write(s->wake[1], "d", 1); /* EAGAIN: the pipe is full, the loop wakes anyway */
  (void)w;
  return KVBM_OK;
}

/* Queues one completed answer on its parked connection, if it is still there. */
static void deliver(kvbm__service *s, done_answer *d) {
  sconn *c = NULL;
  for (size_t i = 0; i < s->nc && !c; i++)
    if (s->c[i].parked && s->c[i].ticket == d->ticket) c = &s->c[i];
  if (!c) {
    atomic_fetch_add(&s->deferred_dropped, 1);
    return;
  }
  c->parked = false;
  atomic_fetch_sub(&s->parked, 1);
  atomic_fetch_add(&s->deferred_answered, 1);
  const char *ct = c->park_route->content_type ? c->park_route->content_type : "application/json";
  queue_answer(s, c, d->status, ct, NULL, d->body, d->len, c->park_head,
               c->park_close || d->close);
  c->deadline_ns = s->now + s->io_ns;
  if (c->in_off < c->in_len) c->backlog = true; /* pipelined requests: their turn */
}

/* The loop's side: takes the answers other threads completed. */
static void take_done(kvbm__service *s) {
  pthread_mutex_lock(&s->done_mu);
  done_answer *list = s->done;
  size_t n = s->ndone;
  s->done = NULL;
  s->ndone = s->cdone = 0;
  atomic_store(&s->done_waiting, 0);
  pthread_mutex_unlock(&s->done_mu);
  for (size_t i = 0; i < n; i++) {
    deliver(s, &list[i]);
    free(list[i].body);
  }
  free(list);
}

/* ---------------------------------------------------------------- loop */

/* Fills the poll set; returns the timeout (0 while a turn left work). */
static int poll_prepare(kvbm__service *s) {
  int tick = s->cfg.tick_ms > 0 ? s->cfg.tick_ms : 1000;
  int64_t next = s->now + (int64_t)tick * 1000000;
  bool resting = s->now < s->accept_at;
  if (resting && s->accept_at < next) next = s->accept_at;
  s->pfd[0] = (struct pollfd){.fd = resting ? -1 : s->lfd, .events = POLLIN};
  s->pfd[1] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
  bool now = false;
  for (size_t i = 0; i < s->nc; i++) {
    sconn *c = &s->c[i];
    short ev = c->out_len ? POLLOUT : c->backlog ? 0 : POLLIN;
    if (c->backlog && !c->out_len && !c->parked) now = true;
    int64_t d = c->out_len ? c->wdeadline_ns : c->deadline_ns;
    if (c->parked) { /* watched for going only: its input waits in the kernel */
      ev = (short)((c->out_len ? POLLOUT : 0) | POLLRDHUP);
      d = c->out_len && c->wdeadline_ns < c->park_deadline_ns ? c->wdeadline_ns
                                                                : c->park_deadline_ns;
    }
    if (d < next) next = d;
    s->pfd[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  if (now || next <= s->now) return 0;
  return (int)((next - s->now) / 1000000) + 1;
}

int kvbm__service_run(kvbm__service *s, kvbm_error *err) {
  while (!atomic_load(&s->stop)) {
    size_t n = s->nc + 2;
    if (kvbm__vec_reserve_of(&s->pfd, &s->cpfd, n, 16, KVBM__VEC_NO_LIMIT))
      return kvbm_error_set(err, KVBM_ENOMEM, "%s: out of memory", s->name);
    s->now = (int64_t)kvbm_clock_ns();
    int np = poll(s->pfd, n, poll_prepare(s));
    if (np < 0 && errno != EINTR)
      return kvbm_error_set(err, KVBM_EIO, "%s: poll: %s", s->name, strerror(errno));
    s->now = (int64_t)kvbm_clock_ns();
    for (size_t i = s->nc; i-- > 0;) /* back to front: removal keeps indices */
      if (!conn_turn(s, &s->c[i], np > 0 ? s->pfd[i + 2].revents : 0)) conn_close(s, i);
    if (np > 0 && (s->pfd[0].revents & POLLIN)) accept_some(s);
    if (np > 0 && (s->pfd[1].revents & POLLIN)) {
      char buf[64];
      ssize_t r = read(s->wake[0], buf, sizeof buf);
      (void)r;
    }
    if (atomic_load(&s->done_waiting)) take_done(s);
    if (s->cfg.tick) s->cfg.tick(s->cfg.tick_user, s->now);
  }
  return KVBM_OK;
}

static void *service_main(void *arg) {
  kvbm__service *s = arg;
  kvbm__service_run(s, NULL); /* fails only out of memory or poll: stop still joins */
  return NULL;
}

int kvbm__service_start(kvbm__service *s, kvbm_error *err) {
  if (!s || s->started) return kvbm_error_set(err, KVBM_EINVAL, "service: NULL or started");
  if (pthread_create(&s->th, NULL, service_main, s))
    return kvbm_error_set(err, KVBM_EIO, "%s: cannot start the server thread", s->name);
  s->started = true;
  return KVBM_OK;
}

void kvbm__service_stop(kvbm__service *s) {
  if (!s) return;
  atomic_store(&s->stop, 1);
  ssize_t w = write(s->wake[1], "x", 1);
  (void)w;
  if (s->started) {
    pthread_join(s->th, NULL);
    s->started = false;
  }
}

/* --------------------------------------------------------------- setup */

static int check_config(const kvbm__service_config *c, const char *name, kvbm_error *err) {
  if (c->max_connections < 1 || c->max_connections > KVBM__SERVICE_MAX_CONN)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: max_connections %u (1..%u)", name,
                          c->max_connections, KVBM__SERVICE_MAX_CONN);
  if (c->max_per_peer < 1) return kvbm_error_set(err, KVBM_EINVAL, "%s: max_per_peer 0 (>= 1)", name);
  if (!(c->io_timeout_s > 0) || c->io_timeout_s > 86400)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: io_timeout_s must be in (0, 86400]", name);
  if (c->max_head > MAX_HEAD_LIMIT)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: max_head %zu (at most %d)", name, c->max_head,
                          MAX_HEAD_LIMIT);
  if (c->defer_timeout_s < 0 || c->defer_timeout_s > 86400)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: defer_timeout_s must be in [0, 86400]", name);
  if (!c->routes || c->nroutes < 1 || c->nroutes > KVBM__SERVICE_MAX_ROUTES)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: %zu routes (1..%d)", name, c->nroutes,
                          KVBM__SERVICE_MAX_ROUTES);
  for (size_t i = 0; i < c->nroutes; i++) {
    const kvbm__service_route *r = &c->routes[i];
    if (!r->fn || !r->methods || (r->methods & ~KVBM__SVC_ANY))
      return kvbm_error_set(err, KVBM_EINVAL, "%s: route %zu (%.64s) has no handler or methods",
                            name, i, r->path ? r->path : "*");
    if (r->path && (r->path[0] != '/' || strlen(r->path) >= HTTP_MAX_PATH))
      return kvbm_error_set(err, KVBM_EINVAL, "%s: route %zu: path '%.64s' must start with /",
                            name, i, r->path);
    if (r->max_body > SIZE_MAX / 4) /* max_head + max_body must not overflow */
      return kvbm_error_set(err, KVBM_EINVAL, "%s: route %zu: max_body %zu too large", name, i,
                            r->max_body);
  }
  return KVBM_OK;
}

void kvbm__service_destroy(kvbm__service *s) {
  if (!s) return;
  kvbm__service_stop(s);
  while (s->nc) conn_close(s, 0);
  for (size_t i = 0; i < s->ndone; i++) free(s->done[i].body);
  free(s->done);
  pthread_mutex_destroy(&s->done_mu);
  free(s->c);
  free(s->pfd);
  free(s->scratch.p);
  if (s->lfd >= 0) close(s->lfd);
  if (s->spare_fd >= 0) close(s->spare_fd);
  for (int i = 0; i < 2; i++)
    if (s->wake[i] >= 0) close(s->wake[i]);
  free(s);
}

int kvbm__service_create(const kvbm__service_config *cfg, kvbm__service **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "service: NULL argument");
  const char *name = cfg->name ? cfg->name : "service";
  int rc = check_config(cfg, name, err);
  if (rc) return rc;
  const char *host = cfg->host ? cfg->host : "0.0.0.0";
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cfg->port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return kvbm_error_set(err, KVBM_EINVAL, "%s: host '%.64s' is not an IPv4 address", name, host);
  kvbm__service *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "%s: out of memory", name);
  s->cfg = *cfg;
  snprintf(s->name, sizeof s->name, "%s", name);
  snprintf(s->host, sizeof s->host, "%s", host);
  s->cfg.name = s->name;
  s->cfg.host = s->host;
  s->cfg.not_found = cfg->not_found; /* the caller's: must live as long */
  memcpy(s->routes, cfg->routes, cfg->nroutes * sizeof *s->routes);
  s->cfg.routes = s->routes;
  for (size_t i = 0; i < cfg->nroutes; i++)
    if (s->routes[i].max_body > s->max_body) s->max_body = s->routes[i].max_body;
  s->max_head = cfg->max_head ? cfg->max_head : DEFAULT_HEAD;
  s->io_ns = (int64_t)(cfg->io_timeout_s * 1e9);
  s->defer_ns = cfg->defer_timeout_s > 0 ? (int64_t)(cfg->defer_timeout_s * 1e9) : s->io_ns;
  s->max_deferred = cfg->max_deferred ? cfg->max_deferred : cfg->max_connections;
  pthread_mutex_init(&s->done_mu, NULL);
  s->lfd = s->wake[0] = s->wake[1] = s->spare_fd = -1;
  if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC)) {
    rc = kvbm_error_set(err, KVBM_EIO, "%s: pipe: %s", name, strerror(errno));
    goto fail;
  }
  s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s->lfd >= 0) setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 128)) {
    rc = kvbm_error_set(err, KVBM_EIO, "%s: cannot listen on %s:%u: %s", name, host, cfg->port,
                        strerror(errno));
    goto fail;
  }
  socklen_t al = sizeof a;
  getsockname(s->lfd, (struct sockaddr *)&a, &al);
  s->port = ntohs(a.sin_port);
  s->spare_fd = fcntl(s->lfd, F_DUPFD_CLOEXEC, 0);
  *out = s;
  return KVBM_OK;
fail:
  kvbm__service_destroy(s);
  return rc;
}

uint16_t kvbm__service_port(const kvbm__service *s) { return s ? s->port : 0; }

void kvbm__service_buffered(const kvbm__service *s, uint64_t *in, uint64_t *out) {
  uint64_t i = 0, o = 0;
  for (size_t k = 0; s && k < s->nc; k++) {
    i += s->c[k].in_len - s->c[k].in_off;
    o += s->c[k].out_len - s->c[k].out_off;
  }
  if (in) *in = i;
  if (out) *out = o;
}

uint64_t kvbm__service_answers(const kvbm__service *s, int code) {
  if (!s) return 0;
  kvbm__service *m = (kvbm__service *)s; /* atomics: loads only */
  size_t i = 0;
  while (i < NCODES && codes[i] != code) i++;
  return atomic_load(&m->answers[i]);
}

void kvbm__service_stats_get(const kvbm__service *s, kvbm__service_stats *out) {
  if (!s || !out) return;
  kvbm__service *m = (kvbm__service *)s; /* atomics: loads only */
  *out = (kvbm__service_stats){
      .connections = atomic_load(&m->open),
      .accepted = atomic_load(&m->accepted),
      .refused_busy = atomic_load(&m->refused),
      .refused_peer = atomic_load(&m->refused_peer),
      .refused_no_fd = atomic_load(&m->refused_no_fd),
      .idle_closed_full = atomic_load(&m->idle_closed_full),
      .idle_closed_peer = atomic_load(&m->idle_closed_peer),
      .accept_pauses = atomic_load(&m->accept_pauses),
      .requests = atomic_load(&m->requests),
      .answered = atomic_load(&m->answered),
      .bad_requests = atomic_load(&m->bad),
      .read_timeouts = atomic_load(&m->read_timeouts),
      .write_timeouts = atomic_load(&m->write_timeouts),
      .idle_timeouts = atomic_load(&m->idle_timeouts),
      .errors_4xx = atomic_load(&m->err4),
      .errors_5xx = atomic_load(&m->err5),
      .turns_cut = atomic_load(&m->turns_cut),
      .out_peak = atomic_load(&m->out_peak),
      .deferred_now = atomic_load(&m->parked),
      .deferred = atomic_load(&m->deferred),
      .deferred_answered = atomic_load(&m->deferred_answered),
      .deferred_gone = atomic_load(&m->deferred_gone),
      .deferred_timeouts = atomic_load(&m->deferred_timeouts),
      .deferred_dropped = atomic_load(&m->deferred_dropped),
  };
}
