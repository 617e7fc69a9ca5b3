/* SPDX-License-Identifier: Apache-2.0 */
/*
 * service/service.h (private to src/): the library's one HTTP service
 * layer. Every HTTP server of kvbm (the metrics endpoint, the advisor's
 * GET API on it, and, as the next step, the router daemon and `kvbm
 * worker`) is a table of routes given to this layer; the layer owns the
 * socket side: one poll loop, admission (common/admit.c), the strict head
 * parser (common/http.c), bounded buffers, deadlines both ways, per-route
 * method and body limits, fairness between connections, and answers
 * counted by status code. service.c's essay says why each rule is there.
 *
 * Threads: a service runs on one thread, either the caller's
 * (kvbm__service_run, until kvbm__service_stop) or one of its own
 * (kvbm__service_start). Handlers and the tick run on that thread, one at
 * a time, and answer inline: the answer is queued when the handler
 * returns. Or later (deferred answers): a handler calls
 * kvbm__service_defer, the connection is parked (no more of its requests
 * are read or answered, answers stay in order) and any thread answers it
 * with kvbm__service_complete, which wakes the loop through its pipe.
 * kvbm__service_stop, kvbm__service_port, kvbm__service_complete and
 * kvbm__service_stats_get are safe from any thread.
 *
 * Errors: create validates the configuration and fills *err naming what
 * is wrong (KVBM_EINVAL), or says what failed (KVBM_EIO, KVBM_ENOMEM).
 */
#ifndef KVBM_SERVICE_SERVICE_H
#define KVBM_SERVICE_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/http.h"
#include "kvbm/status.h"

/* Methods a route takes (a mask). HEAD is answered as GET would be,
 * without the body, and only where the route names it. */
#define KVBM__SVC_GET 1u
#define KVBM__SVC_HEAD 2u
#define KVBM__SVC_POST 4u
#define KVBM__SVC_PUT 8u
#define KVBM__SVC_DELETE 16u
#define KVBM__SVC_OTHER 32u /* any other method (a handler that answers 405 itself) */
#define KVBM__SVC_ANY 63u

/* Bounds of a service (checked at create). */
#define KVBM__SERVICE_MAX_CONN (1u << 20)
/* A connection gets no more answers while this much of its output waits. */
#define KVBM__SERVICE_OUT_SOFT (64 * 1024)
#define KVBM__SERVICE_MAX_ROUTES 32

typedef struct kvbm__service kvbm__service;

/* A growing byte buffer, the handlers' scratch for an answer body. */
typedef struct kvbm__service_buf {
  char *p;
  size_t len, cap;
  bool oom; /* an append failed: the service answers 500 instead */
} kvbm__service_buf;

/* Appends; false (and b->oom set) when memory ran out. */
bool kvbm__service_buf_append(kvbm__service_buf *b, const void *p, size_t n);
bool kvbm__service_buf_printf(kvbm__service_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* One complete request, valid for the handler's call only. */
typedef struct kvbm__service_req {
  const http_req *head; /* method, path, query, version, keep-alive */
  const char *body;     /* head->content_length bytes (within the route's
                           max_body); not NUL-terminated */
  size_t body_len;
  uint32_t peer;        /* the client's key (kvbm__admit_peer_key) */
} kvbm__service_req;

/* What the handler answers: it sets what differs from the defaults. */
typedef struct kvbm__service_answer {
  int status;               /* 200; outside 100..599: answered 500 */
  const char *content_type; /* the route's (NULL there: application/json) */
  const char *headers;      /* extra lines "Name: value\r\n", or NULL;
                               at most 256 bytes; must live until return */
  const char *body;         /* NULL: the scratch buffer's bytes */
  size_t body_len;          /* with body */
  kvbm__service_buf *scratch; /* the service's, emptied before each call */
  bool close;               /* close the connection after this answer */
  uint64_t ticket;          /* set by kvbm__service_defer (0: answered now) */
} kvbm__service_answer;

/* Answers one request. Runs on the service's thread; may not call
 * kvbm__service_run or _destroy. The service copies the answer out. */
typedef void (*kvbm__service_fn)(void *user, kvbm__service *svc, const kvbm__service_req *req,
                                 kvbm__service_answer *ans);

typedef struct kvbm__service_route {
  const char *path;         /* exact path (no query); NULL: a fallback for
                               every path no other route names */
  unsigned methods;         /* KVBM__SVC_* mask; others get 405 + Allow */
  size_t max_body;          /* bytes; a longer Content-Length gets 413 */
  const char *content_type; /* of its answers (NULL: application/json) */
  const char *method_msg;   /* the 405 text (NULL: "method not allowed") */
  kvbm__service_fn fn;
  void *user;
  /* Optional, for a route whose handler defers: called on the service's
   * thread when a parked request's connection goes before its answer
   * (the client closed, defer_timeout_s passed: 504 sent, the service
   * destroyed). The ticket's answer, if it still comes, is dropped. */
  void (*gone)(void *user, uint64_t ticket);
} kvbm__service_route;

typedef struct kvbm__service_config {
  const char *name;          /* in error messages ("metrics") */
  const char *host;          /* IPv4 address to listen on (NULL: 0.0.0.0) */
  uint16_t port;             /* 0: any (kvbm__service_port says which) */
  uint32_t max_connections;  /* 1..KVBM__SERVICE_MAX_CONN */
  uint32_t max_per_peer;     /* >= 1 */
  double io_timeout_s;       /* (0, 86400]: a request complete within it of
                                its first byte, answers taken within it of
                                being queued, an idle connection kept so long */
  size_t max_head;           /* 0: 8 KiB; at most 64 KiB */
  int sndbuf;                /* SO_SNDBUF per connection (0: the kernel's) */
  bool json_errors;          /* its own answers (4xx, 5xx) as
                                {"error":"...","status":N}, else text */
  bool error_newline;        /* JSON error bodies end with "\n" */
  const char *not_found;     /* the 404 text (NULL: "not found") */
  const kvbm__service_route *routes; /* copied at create */
  size_t nroutes;            /* 1..KVBM__SERVICE_MAX_ROUTES */
  /* Called on the service's thread after every wake-up, at least every
   * tick_ms (0: 1000): housekeeping of the service's owner (NULL: none). */
  void (*tick)(void *user, int64_t now_ns);
  void *tick_user;
  int tick_ms;
  /* Deferred answers: at most max_deferred parked at once (0:
   * max_connections; kvbm__service_defer refuses more), each answered
   * within defer_timeout_s of its request (0: io_timeout_s; at most
   * 86400) or the client gets 504 and the connection closes. */
  uint32_t max_deferred;
  double defer_timeout_s;
} kvbm__service_config;

/* What the service did, counted since create (any thread; atomics). */
typedef struct kvbm__service_stats {
  uint64_t connections;            /* open now */
  uint64_t accepted, refused_busy; /* refused: table full, none idle (503) */
  uint64_t refused_peer;           /* over max_per_peer, none of its idle (503) */
  uint64_t refused_no_fd;          /* at the descriptor limit (503 via a spare) */
  uint64_t idle_closed_full, idle_closed_peer; /* idle ones closed for newcomers */
  uint64_t accept_pauses;          /* the listening socket rested */
  uint64_t requests;               /* heads parsed */
  uint64_t answered, bad_requests; /* answers < 400, >= 400 (503s included) */
  uint64_t errors_4xx, errors_5xx; /* error answers queued on connections
                                      (the 503s of admission not included) */
  uint64_t read_timeouts, write_timeouts; /* a request late (408), an
                                            answer not taken */
  uint64_t idle_timeouts;          /* idle keep-alive connections closed */
  uint64_t turns_cut;              /* turns ended with work left (fairness) */
  uint64_t out_peak;               /* most output one connection had queued */
  uint64_t deferred_now;           /* parked requests waiting for an answer */
  uint64_t deferred;               /* requests parked, since create */
  uint64_t deferred_answered;      /* ... answered through kvbm__service_complete */
  uint64_t deferred_gone;          /* ... whose client went first */
  uint64_t deferred_timeouts;      /* ... answered 504 at defer_timeout_s */
  uint64_t deferred_dropped;       /* completions for no parked request
                                      (gone, timed out, unknown ticket) */
} kvbm__service_stats;

/* Binds and listens (nothing is served until run or start). */
int kvbm__service_create(const kvbm__service_config *cfg, kvbm__service **out, kvbm_error *err);

/* Serves on the caller's thread until kvbm__service_stop. KVBM_EIO when
 * poll fails, KVBM_ENOMEM when the poll set cannot grow. */
int kvbm__service_run(kvbm__service *s, kvbm_error *err);

/* Serves on a thread of its own; kvbm__service_stop joins it. */
int kvbm__service_start(kvbm__service *s, kvbm_error *err);

/* Any thread: the loop returns at its next wake-up (at once: the wake-up
 * pipe); joins the service's own thread if start made one. */
void kvbm__service_stop(kvbm__service *s);

/* Closes every connection and the socket; after stop (or before run). */
void kvbm__service_destroy(kvbm__service *s);

uint16_t kvbm__service_port(const kvbm__service *s);

/* In a handler only: this request is answered later. Parks the
 * connection and returns the request's ticket (never 0; also in
 * ans->ticket), or 0 when max_deferred requests are parked already (the
 * handler then answers now, e.g. 503). What the handler set in *ans is
 * ignored once it deferred. Cost: O(1). */
uint64_t kvbm__service_defer(kvbm__service *s, kvbm__service_answer *ans);

/* Any thread: the answer of a deferred request (status, the route's
 * content type, body copied; close: close the connection after it).
 * KVBM_OK when queued for the loop (which drops it, counted in
 * deferred_dropped, if the client went meanwhile), KVBM_EINVAL for
 * ticket 0 or a status outside 100..599, KVBM_ENOMEM. Each ticket is
 * answered once; the loop finds its connection in O(connections). */
int kvbm__service_complete(kvbm__service *s, uint64_t ticket, int status, const char *body,
                           size_t len, bool close);

/* Bytes the open connections hold, read (unconsumed) and to send. The
 * service's thread only (a handler, the tick): it walks the table. */
void kvbm__service_buffered(const kvbm__service *s, uint64_t *in, uint64_t *out);
void kvbm__service_stats_get(const kvbm__service *s, kvbm__service_stats *out);

/* Answers sent with status `code` (any code; those the service does not
 * count apart are all in code 0, "other"). */
uint64_t kvbm__service_answers(const kvbm__service *s, int code);

#endif
