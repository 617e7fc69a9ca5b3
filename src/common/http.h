/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http.h: an HTTP/1.1 request-head parser for the library's HTTP servers
 * (the HTTP service layer, src/service/, that the router daemon and the
 * metrics endpoint run on). A codec
 * only: it reads bytes and knows nothing of sockets.
 */
#ifndef KVBM_COMMON_HTTP_H
#define KVBM_COMMON_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#define HTTP_MAX_PATH 256
#define HTTP_MAX_HEADERS 64

typedef struct http_req {
  char method[16];
  char path[HTTP_MAX_PATH]; /* without the query string */
  char query[HTTP_MAX_PATH];/* after '?', without it ("" when none) */
  int minor;                /* HTTP/1.<minor>: 0 or 1 */
  size_t content_length;
  bool has_length;
  bool keep_alive;          /* after this request */
  bool expect_continue;
  size_t head_len;          /* bytes of the head, final CRLF CRLF included */
} http_req;

typedef enum http_result {
  HTTP_NEED_MORE = 0, /* the head is not complete yet (and within limits) */
  HTTP_HEAD = 1,      /* *req is filled */
  HTTP_BAD = -1,      /* *status and *why say what to answer */
} http_result;

/* Parses the request head at buf[0..len). `scanned` (in/out; NULL to scan
 * from the start every time) makes repeated calls on a growing buffer
 * linear: set it to 0 for a new head and pass it back unchanged with the
 * same bytes and more; bytes it covers are not scanned again. Refuses (HTTP_BAD): a head over
 * max_head bytes (431), a malformed request line or header, bare LF or NUL
 * or other control bytes (400), a path or a query too long (414), a version other
 * than HTTP/1.0 or 1.1 (505), Transfer-Encoding (501: bodies must have a
 * Content-Length), a Content-Length that is not a decimal number, is
 * given twice with different values, or exceeds max_body (413). */
http_result kvbm__http_parse_head(const char *buf, size_t len, size_t max_head, size_t max_body,
                            size_t *scanned, http_req *req, int *status, const char **why);

/* The reason phrase of a status code we send. */
const char *kvbm__http_reason(int status);

#endif
