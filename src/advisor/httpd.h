/*
 * httpd.h (private): the advisor daemon's HTTP side, a GET-only server on
 * the router's head parser (router/http.c) with the router's guards.
 *
 * One thread calls kvbm__httpd_poll in its loop; the handler runs on that
 * thread and writes a JSON body. Every refusal is counted.
 */
#ifndef KVBM_ADVISOR_HTTPD_H
#define KVBM_ADVISOR_HTTPD_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"
#include "common/http.h"

typedef struct kvbm__httpd kvbm__httpd;

typedef struct kvbm__httpd_config {
  const char *listen;        /* HOST:PORT (port 0: any free one) */
  uint32_t max_connections;  /* more are answered 503 (64) */
  uint32_t io_timeout_ms;    /* a request must arrive, and answers be taken, within this (10000) */
} kvbm__httpd_config;

/* Writes the answer to `req` (a GET the parser accepted) into the growing
 * buffer *body (*len bytes so far; grow with realloc, *cap its size) and
 * returns the HTTP status. Runs on the polling thread. */
typedef int (*kvbm__httpd_handler)(void *user, const http_req *req, char **body, size_t *len,
                                   size_t *cap);

typedef struct kvbm__httpd_stats {
  uint64_t connections, accepted, refused_busy, accept_pauses;
  uint64_t requests, answered, bad_requests, read_timeouts, write_timeouts, turns_cut;
  uint64_t out_peak;
} kvbm__httpd_stats;

int kvbm__httpd_create(const kvbm__httpd_config *cfg, kvbm__httpd_handler fn, void *user,
                       kvbm__httpd **out, kvbm_error *err);
int kvbm__httpd_port(const kvbm__httpd *h);
/* One turn: waits up to timeout_ms for activity, then serves it. */
void kvbm__httpd_poll(kvbm__httpd *h, int timeout_ms);
void kvbm__httpd_stats_get(const kvbm__httpd *h, kvbm__httpd_stats *out);
void kvbm__httpd_destroy(kvbm__httpd *h);

#endif
