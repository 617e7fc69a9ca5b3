/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http.c: request heads, strictly (see http.h).
 *
 * The daemon faces whatever connects to its port, so the parser accepts a
 * small, unambiguous subset of RFC 9112 and refuses the rest with a
 * precise status: CRLF line ends only, no obsolete line folding, token
 * characters in methods and header names, no Transfer-Encoding (the
 * classic request-smuggling lever; our clients always know their body
 * length), one consistent Content-Length, bounded sizes everywhere. It
 * never reads past `len`.
 *
 * Cost. A head may arrive a byte at a time, so the search for its end
 * resumes where the previous call stopped (the caller keeps `*scanned`):
 * every byte is checked once while the head is incomplete, and the head is
 * parsed once when it is complete. Rescanning from the start on every
 * call would make a trickled 16 KiB head cost 16 K x 16 KiB byte checks.
 */
#include "common/http.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

static bool tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static http_result bad(int *status, const char **why, int code, const char *msg) {
  *status = code;
  *why = msg;
  return HTTP_BAD;
}

/* The end of the head (index after CRLF CRLF), 0 if not there yet; -1 on a
 * byte no head may hold. Bytes before `from` were checked by an earlier
 * call on the same (shorter) buffer; the look-behind below reads them. */
static long head_end(const char *buf, size_t len, size_t from) {
  for (size_t i = from; i < len; i++) {
    unsigned char c = (unsigned char)buf[i];
    if (c == '\n') {
      if (i == 0 || buf[i - 1] != '\r') return -1; /* bare LF */
      if (i >= 3 && buf[i - 2] == '\n' && buf[i - 3] == '\r') return (long)i + 1;
    } else if (c == '\r') {
      if (i + 1 < len && buf[i + 1] != '\n') return -1; /* bare CR */
    } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return -1;
    }
  }
  return 0;
}

static bool ieq(const char *a, size_t n, const char *b) {
  return strlen(b) == n && !strncasecmp(a, b, n);
}

/* Whether a comma-separated header value lists `token` (case-insensitive). */
static bool lists(const char *v, size_t n, const char *token) {
  size_t i = 0;
  while (i < n) {
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t b = i;
    while (i < n && v[i] != ',') i++;
    size_t e = i;
    while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e > b && ieq(v + b, e - b, token)) return true;
  }
  return false;
}

static http_result request_line(const char *p, size_t n, http_req *req, int *status,
                                const char **why) {
  size_t i = 0;
  while (i < n && tchar((unsigned char)p[i])) i++;
  if (i == 0 || i >= sizeof req->method || i >= n || p[i] != ' ')
    return bad(status, why, 400, "malformed request line (method)");
  memcpy(req->method, p, i);
  req->method[i] = 0;
  size_t b = ++i;
  while (i < n && p[i] != ' ') i++;
  size_t plen = i - b;
  if (plen == 0 || i >= n) return bad(status, why, 400, "malformed request line (target)");
  if (p[b] != '/') return bad(status, why, 400, "request target must be an absolute path");
  const char *q = memchr(p + b, '?', plen);
  size_t qlen = 0;
  if (q) {
    qlen = plen - (size_t)(q - (p + b)) - 1;
    plen = (size_t)(q - (p + b));
  }
  if (plen >= sizeof req->path || qlen >= sizeof req->query)
    return bad(status, why, 414, "request target too long");
  for (size_t k = 0; k < plen + (q ? qlen + 1 : 0); k++)
    if ((unsigned char)p[b + k] <= 0x20 || (unsigned char)p[b + k] >= 0x7f)
      return bad(status, why, 400, "bad character in the request target");
  memcpy(req->path, p + b, plen);
  req->path[plen] = 0;
  if (q) memcpy(req->query, q + 1, qlen);
  req->query[qlen] = 0;
  i++;
  if (n - i != 8 || memcmp(p + i, "HTTP/", 5) || p[i + 6] != '.')
    return bad(status, why, 400, "malformed request line (version)");
  if (p[i + 5] != '1' || (p[i + 7] != '0' && p[i + 7] != '1'))
    return bad(status, why, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
  req->minor = p[i + 7] - '0';
  return HTTP_HEAD;
}

static http_result header(const char *p, size_t n, size_t max_body, http_req *req,
                          bool *conn_close, bool *conn_keep, int *status, const char **why) {
  size_t i = 0;
  while (i < n && tchar((unsigned char)p[i])) i++;
  if (i == 0 || i >= n || p[i] != ':')
    return bad(status, why, 400, "malformed header line");
  size_t nl = i++;
  while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
  size_t e = n;
  while (e > i && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
  const char *v = p + i;
  size_t vn = e - i;
  if (ieq(p, nl, "content-length")) {
    if (vn == 0 || vn > 19) return bad(status, why, 400, "bad Content-Length");
    uint64_t x = 0;
    for (size_t k = 0; k < vn; k++) {
      if (v[k] < '0' || v[k] > '9') return bad(status, why, 400, "bad Content-Length");
      x = x * 10 + (uint64_t)(v[k] - '0');
    }
    if (req->has_length && req->content_length != x)
      return bad(status, why, 400, "conflicting Content-Length headers");
    if (x > max_body) return bad(status, why, 413, "request body too large");
    req->content_length = (size_t)x;
    req->has_length = true;
  } else if (ieq(p, nl, "transfer-encoding")) {
    return bad(status, why, 501, "Transfer-Encoding is not supported; send Content-Length");
  } else if (ieq(p, nl, "connection")) {
    if (lists(v, vn, "close")) *conn_close = true;
    if (lists(v, vn, "keep-alive")) *conn_keep = true;
  } else if (ieq(p, nl, "expect")) {
    if (!ieq(v, vn, "100-continue")) return bad(status, why, 417, "unsupported Expect");
    req->expect_continue = true;
  }
  return HTTP_HEAD;
}

http_result kvbm__http_parse_head(const char *buf, size_t len, size_t max_head, size_t max_body,
                            size_t *scanned, http_req *req, int *status, const char **why) {
  size_t lim = len < max_head ? len : max_head;
  size_t from = scanned && *scanned < lim ? *scanned : 0;
  long end = head_end(buf, lim, from);
  if (end < 0) return bad(status, why, 400, "bare CR/LF or a control byte in the request head");
  if (end == 0) {
    /* a CR in the last byte is checked again once its successor is here */
    if (scanned) *scanned = lim ? lim - 1 : 0;
    return len >= max_head ? bad(status, why, 431, "request head too large") : HTTP_NEED_MORE;
  }
  memset(req, 0, sizeof *req);
  const char *p = buf, *stop = buf + end - 2; /* the final CRLF */
  const char *eol = memchr(p, '\r', (size_t)(stop - p));
  http_result r = request_line(p, (size_t)(eol - p), req, status, why);
  if (r != HTTP_HEAD) return r;
  bool conn_close = false, conn_keep = false;
  int headers = 0;
  for (p = eol + 2; p < stop; p = eol + 2) {
    eol = memchr(p, '\r', (size_t)(stop - p));
    if (*p == ' ' || *p == '\t') return bad(status, why, 400, "obsolete header line folding");
    if (++headers > HTTP_MAX_HEADERS) return bad(status, why, 431, "too many header fields");
    r = header(p, (size_t)(eol - p), max_body, req, &conn_close, &conn_keep, status, why);
    if (r != HTTP_HEAD) return r;
  }
  req->keep_alive = req->minor == 1 ? !conn_close : (conn_keep && !conn_close);
  req->head_len = (size_t)end;
  return HTTP_HEAD;
}

const char *kvbm__http_reason(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}
