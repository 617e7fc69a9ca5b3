/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json.c: the router's JSON, both ways (see json.h).
 *
 * The reader is a recursive-descent parser over a bounded buffer that
 * knows the one object shape the daemon accepts and skips everything else
 * (RFC 8259 values: objects, arrays, strings with escapes, numbers,
 * literals), with a depth limit so hostile nesting cannot exhaust the
 * stack, a length limit on arrays checked before they are grown, and no
 * read outside [buf, buf+len). Strings are validated (escapes, control
 * characters) but not decoded: keys are compared raw, so an escaped key
 * ("token\u005fids") is simply an unknown key.
 */
#include "router/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

typedef struct rd {
  const char *p, *end, *start;
  kvbm_error *err;
  size_t max_items;
} rd;

static int fail(rd *r, int code, const char *what) {
  return kvbm_error_set(r->err, code, "json: %s at byte %zu", what, (size_t)(r->p - r->start));
}

static void ws(rd *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
    r->p++;
}

static bool lit(rd *r, const char *s) {
  size_t n = strlen(s);
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, s, n)) return false;
  r->p += n;
  return true;
}

/* A string: on success *s, *n are its raw contents (between the quotes). */
static int string(rd *r, const char **s, size_t *n) {
  if (r->p >= r->end || *r->p != '"') return fail(r, KVBM_EFORMAT, "expected a string");
  const char *b = ++r->p;
  while (r->p < r->end && *r->p != '"') {
    unsigned char c = (unsigned char)*r->p;
    if (c < 0x20) return fail(r, KVBM_EFORMAT, "control character in a string");
    if (c == '\\') {
      if (++r->p >= r->end) break;
      char e = *r->p;
      if (e == 'u') {
        for (int i = 1; i <= 4; i++)
          if (r->p + i >= r->end || !strchr("0123456789abcdefABCDEF", r->p[i]) || !r->p[i])
            return fail(r, KVBM_EFORMAT, "bad \\u escape");
        r->p += 4;
      } else if (!strchr("\"\\/bfnrt", e) || !e) {
        return fail(r, KVBM_EFORMAT, "bad escape in a string");
      }
    }
    r->p++;
  }
  if (r->p >= r->end) return fail(r, KVBM_ETRUNCATED, "unterminated string");
  *s = b;
  *n = (size_t)(r->p - b);
  r->p++;
  return KVBM_OK;
}

/* A JSON number, syntax-checked; *is_int says it has no fraction or exponent. */
static int number(rd *r, bool *neg, uint64_t *mag, bool *overflow, bool *is_int) {
  *neg = false;
  *mag = 0;
  *overflow = false;
  *is_int = true;
  if (r->p < r->end && *r->p == '-') *neg = true, r->p++;
  if (r->p >= r->end) return fail(r, KVBM_ETRUNCATED, "input ends inside a number");
  if (*r->p < '0' || *r->p > '9') return fail(r, KVBM_EFORMAT, "bad number");
  if (*r->p == '0' && r->p + 1 < r->end && r->p[1] >= '0' && r->p[1] <= '9')
    return fail(r, KVBM_EFORMAT, "leading zero in a number");
  while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
    unsigned d = (unsigned)(*r->p++ - '0');
    /* mag * 10 + d <= UINT64_MAX, without a division per digit */
    if (*mag > UINT64_MAX / 10 || (*mag == UINT64_MAX / 10 && d > UINT64_MAX % 10)) *overflow = true;
    else *mag = *mag * 10 + d;
  }
  if (r->p < r->end && *r->p == '.') {
    *is_int = false;
    r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, KVBM_EFORMAT, "bad number");
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    *is_int = false;
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, KVBM_EFORMAT, "bad number");
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  }
  return KVBM_OK;
}

static int skip_value(rd *r, int depth);

static int skip_container(rd *r, int depth, char close, bool object) {
  if (depth >= RJ_MAX_DEPTH) return fail(r, KVBM_ETOOLONG, "nesting too deep");
  r->p++;
  ws(r);
  if (r->p < r->end && *r->p == close) {
    r->p++;
    return KVBM_OK;
  }
  for (;;) {
    int rc;
    if (object) {
      const char *s;
      size_t n;
      if ((rc = string(r, &s, &n))) return rc;
      ws(r);
      if (r->p >= r->end || *r->p != ':') return fail(r, KVBM_EFORMAT, "expected ':'");
      r->p++;
      ws(r);
    }
    if ((rc = skip_value(r, depth + 1))) return rc;
    ws(r);
    if (r->p >= r->end) return fail(r, KVBM_ETRUNCATED, "input ends inside a value");
    if (*r->p == close) {
      r->p++;
      return KVBM_OK;
    }
    if (*r->p != ',') return fail(r, KVBM_EFORMAT, object ? "expected ',' or '}'" : "expected ',' or ']'");
    r->p++;
    ws(r);
  }
}

static int skip_value(rd *r, int depth) {
  if (r->p >= r->end) return fail(r, KVBM_ETRUNCATED, "input ends where a value was expected");
  switch (*r->p) {
    case '{':
      return skip_container(r, depth, '}', true);
    case '[':
      return skip_container(r, depth, ']', false);
    case '"': {
      const char *s;
      size_t n;
      return string(r, &s, &n);
    }
    case 't':
      return lit(r, "true") ? KVBM_OK : fail(r, KVBM_EFORMAT, "bad literal");
    case 'f':
      return lit(r, "false") ? KVBM_OK : fail(r, KVBM_EFORMAT, "bad literal");
    case 'n':
      return lit(r, "null") ? KVBM_OK : fail(r, KVBM_EFORMAT, "bad literal");
    default: {
      bool neg, ovf, isint;
      uint64_t m;
      return number(r, &neg, &m, &ovf, &isint);
    }
  }
}

/* An unsigned integer <= max (with `wrap_negative`, a negative one >=
 * INT64_MIN is taken as its two's complement). */
static int uint_value(rd *r, uint64_t max, bool wrap_negative, uint64_t *out) {
  const char *at = r->p;
  /* the common case first (a /route body is thousands of these): 1 to 19
   * digits without a leading zero cannot overflow; anything else (signs,
   * fractions, exponents, longer numbers) takes the general path */
  if (at < r->end && *at >= '1' && *at <= '9') {
    const char *q = at, *stop = r->end - at > 19 ? at + 19 : r->end;
    uint64_t v = 0;
    while (q < stop && (unsigned char)(*q - '0') < 10) v = v * 10 + (uint64_t)(*q++ - '0');
    if (q == r->end || ((unsigned char)(*q - '0') >= 10 && *q != '.' && *q != 'e' && *q != 'E')) {
      if (v > max) return fail(r, KVBM_ERANGE, "integer out of range");
      r->p = q;
      *out = v;
      return KVBM_OK;
    }
  }
  bool neg, ovf, isint;
  uint64_t m;
  int rc = number(r, &neg, &m, &ovf, &isint);
  if (rc) return rc;
  const char *after = r->p;
  r->p = at; /* report errors at the number's start */
  if (!isint) return fail(r, KVBM_EFORMAT, "expected an integer");
  if (ovf) return fail(r, KVBM_ERANGE, "integer out of range");
  if (neg && m) {
    if (!wrap_negative || m > (uint64_t)1 << 63) return fail(r, KVBM_ERANGE, "negative integer");
    m = (uint64_t)0 - m;
  } else if (m > max) {
    return fail(r, KVBM_ERANGE, "integer out of range");
  }
  r->p = after;
  *out = m;
  return KVBM_OK;
}

/* An array of unsigned integers into a malloc'd array of elem bytes each. */
static int uint_array(rd *r, uint64_t max, bool wrap, size_t elem, void **out, size_t *n) {
  if (r->p >= r->end || *r->p != '[') return fail(r, KVBM_EFORMAT, "expected an array");
  r->p++;
  size_t cap = 0, len = 0;
  uint8_t *a = NULL;
  ws(r);
  if (r->p < r->end && *r->p == ']') {
    r->p++;
    *out = malloc(elem); /* non-NULL even when empty */
    *n = 0;
    return *out ? KVBM_OK : fail(r, KVBM_ENOMEM, "out of memory");
  }
  for (;;) {
    uint64_t v;
    int rc = uint_value(r, max, wrap, &v);
    if (!rc && len == r->max_items) rc = fail(r, KVBM_ETOOLONG, "array longer than allowed");
    /* len < max_items here: growth stops at max_items, never past it. */
    if (!rc && kvbm__vec_reserve(&a, &cap, len + 1, elem, 256, r->max_items))
      rc = fail(r, KVBM_ENOMEM, "out of memory");
    if (rc) {
      free(a);
      return rc;
    }
    if (elem == 4) ((uint32_t *)a)[len++] = (uint32_t)v;
    else ((uint64_t *)a)[len++] = v;
    ws(r);
    if (r->p < r->end && *r->p == ']') {
      r->p++;
      break;
    }
    if (r->p >= r->end || *r->p != ',') {
      free(a);
      return fail(r, r->p >= r->end ? KVBM_ETRUNCATED : KVBM_EFORMAT, "expected ',' or ']'");
    }
    r->p++;
    ws(r);
  }
  *out = a;
  *n = len;
  return KVBM_OK;
}

static int hexval(char c) {
  return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* A string value or null into a malloc'd, decoded, NUL-terminated copy
 * (NULL for null). Escapes are decoded (\uXXXX to UTF-8, surrogate pairs
 * joined); a NUL, a lone surrogate or more than RJ_MAX_STRING bytes is
 * refused. */
#define RJ_MAX_STRING 4096
static int string_value(rd *r, char **out) {
  *out = NULL;
  if (lit(r, "null")) return KVBM_OK;
  const char *at = r->p, *s;
  size_t n;
  int rc = string(r, &s, &n);
  if (rc) return rc;
  if (n > RJ_MAX_STRING) {
    r->p = at;
    return fail(r, KVBM_ETOOLONG, "string longer than 4096 bytes");
  }
  char *d = malloc(n + 1), *q = d;
  if (!d) return fail(r, KVBM_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\') {
      *q++ = s[i];
      continue;
    }
    char e = s[++i]; /* string() checked every escape */
    if (e != 'u') {
      *q++ = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r'
             : e == 't' ? '\t' : e;
      continue;
    }
    uint32_t cp = 0;
    for (int k = 1; k <= 4; k++) cp = cp << 4 | (uint32_t)hexval(s[i + k]);
    i += 4;
    if (cp >= 0xD800 && cp < 0xDC00 && i + 2 < n && s[i + 1] == '\\' &&
        s[i + 2] == 'u') {
      uint32_t lo = 0;
      for (int k = 3; k <= 6; k++) lo = lo << 4 | (uint32_t)hexval(s[i + k]);
      if (lo >= 0xDC00 && lo < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
      }
    }
    if (cp == 0 || (cp >= 0xD800 && cp < 0xE000)) {
      free(d);
      r->p = at;
      return fail(r, KVBM_EFORMAT, cp ? "lone surrogate in a string" : "NUL in a string");
    }
    /* UTF-8: at most 4 bytes for 6 escaped characters, so q never passes d + n */
    if (cp < 0x80) *q++ = (char)cp;
    else if (cp < 0x800) *q++ = (char)(0xC0 | cp >> 6), *q++ = (char)(0x80 | (cp & 0x3F));
    else if (cp < 0x10000)
      *q++ = (char)(0xE0 | cp >> 12), *q++ = (char)(0x80 | (cp >> 6 & 0x3F)),
      *q++ = (char)(0x80 | (cp & 0x3F));
    else
      *q++ = (char)(0xF0 | cp >> 18), *q++ = (char)(0x80 | (cp >> 12 & 0x3F)),
      *q++ = (char)(0x80 | (cp >> 6 & 0x3F)), *q++ = (char)(0x80 | (cp & 0x3F));
  }
  *q = 0;
  *out = d;
  return KVBM_OK;
}

static bool key_is(const char *s, size_t n, const char *k) {
  return strlen(k) == n && !memcmp(s, k, n);
}

int kvbm__rj_parse_request(const char *buf, size_t len, size_t max_items, rj_request *out,
                     kvbm_error *err) {
  memset(out, 0, sizeof *out);
  rd r = {.p = buf, .end = buf + len, .start = buf, .err = err, .max_items = max_items};
  int rc = KVBM_OK;
  ws(&r);
  if (r.p >= r.end || *r.p != '{') return fail(&r, KVBM_EFORMAT, "expected a JSON object");
  r.p++;
  ws(&r);
  if (r.p < r.end && *r.p == '}') {
    r.p++;
  } else {
    for (;;) {
      const char *k;
      size_t kn;
      if ((rc = string(&r, &k, &kn))) break;
      ws(&r);
      if (r.p >= r.end || *r.p != ':') {
        rc = fail(&r, r.p >= r.end ? KVBM_ETRUNCATED : KVBM_EFORMAT, "expected ':'");
        break;
      }
      r.p++;
      ws(&r);
      if (key_is(k, kn, "token_ids")) {
        if (out->has_tokens) rc = fail(&r, KVBM_EFORMAT, "token_ids given twice");
        else rc = uint_array(&r, UINT32_MAX, false, 4, (void **)&out->tokens, &out->num_tokens);
        out->has_tokens = !rc;
      } else if (key_is(k, kn, "block_hashes")) {
        if (out->has_hashes) rc = fail(&r, KVBM_EFORMAT, "block_hashes given twice");
        else rc = uint_array(&r, UINT64_MAX, true, 8, (void **)&out->hashes, &out->num_hashes);
        out->has_hashes = !rc;
      } else if (key_is(k, kn, "request_id")) {
        if (out->has_request_id) rc = fail(&r, KVBM_EFORMAT, "request_id given twice");
        else rc = uint_value(&r, UINT64_MAX, false, &out->request_id);
        out->has_request_id = !rc;
      } else if (key_is(k, kn, "cache_salt") || key_is(k, kn, "lora_name")) {
        char **f = k[0] == 'c' ? &out->cache_salt : &out->lora_name;
        if (*f) rc = fail(&r, KVBM_EFORMAT, "cache_salt or lora_name given twice");
        else rc = string_value(&r, f);
      } else {
        rc = skip_value(&r, 1);
      }
      if (rc) break;
      ws(&r);
      if (r.p < r.end && *r.p == '}') {
        r.p++;
        break;
      }
      if (r.p >= r.end || *r.p != ',') {
        rc = fail(&r, r.p >= r.end ? KVBM_ETRUNCATED : KVBM_EFORMAT, "expected ',' or '}'");
        break;
      }
      r.p++;
      ws(&r);
    }
  }
  if (!rc) {
    ws(&r);
    if (r.p != r.end) rc = fail(&r, KVBM_ETOOLONG, "bytes after the object");
  }
  if (rc) kvbm__rj_request_free(out);
  return rc;
}

void kvbm__rj_request_free(rj_request *q) {
  free(q->tokens);
  free(q->hashes);
  free(q->cache_salt);
  free(q->lora_name);
  memset(q, 0, sizeof *q);
}

void kvbm__rj_printf(rj_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    /* n bytes and the NUL; a /route or /health answer: one allocation. */
    if (kvbm__vec_reserve_of(&b->p, &b->cap, b->len + (size_t)n + 1, 4096, KVBM__VEC_NO_LIMIT)) {
      b->oom = true;
      return;
    }
  }
}

static bool reserve(rj_buf *b, size_t n) {
  if (b->oom) return false;
  /* n bytes and room for a NUL after them. */
  if (kvbm__vec_reserve_of(&b->p, &b->cap, b->len + n + 1, 4096, KVBM__VEC_NO_LIMIT)) {
    b->oom = true;
    return false;
  }
  return true;
}

void kvbm__rj_u64(rj_buf *b, const char *text, uint64_t v) {
  size_t tn = strlen(text);
  if (!reserve(b, tn + 21)) return;
  memcpy(b->p + b->len, text, tn);
  b->len += tn;
  char digits[20];
  int k = 0;
  do digits[k++] = (char)('0' + v % 10);
  while ((v /= 10));
  while (k) b->p[b->len++] = digits[--k];
  b->p[b->len] = 0;
}

void kvbm__rj_string(rj_buf *b, const char *s) {
  kvbm__rj_printf(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') kvbm__rj_printf(b, "\\%c", c);
    else if (c < 0x20) kvbm__rj_printf(b, "\\u%04x", c);
    else kvbm__rj_printf(b, "%c", c);
  }
  kvbm__rj_printf(b, "\"");
}

void kvbm__rj_buf_free(rj_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}
