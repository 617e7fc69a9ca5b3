/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace.c: the Mooncake JSON-lines trace reader (see workload/trace.h).
 *
 * A small recursive-descent JSON reader that knows one shape: a flat object
 * per line whose four known fields are numbers or an array of numbers, and
 * whose other fields it skips (any JSON value, nested at most 64 deep). It
 * works line by line and never reads past a line's end, so an unterminated
 * string or array on one line is that line's error, not a runaway scan of
 * the file. Files are streamed (below): memory is what is kept, never the
 * file's size, and --limit stops the reading itself.
 *
 * Storage is two growable arrays: the requests, and one pool of hash ids
 * that the requests point into (fixed up once parsing is over, since the
 * pool may move while it grows).
 */
#include "workload/trace.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/vec.h"

struct kvsim_trace {
  kvsim_trace_request *reqs;
  size_t count, cap;
  uint32_t *ids;
  size_t nids, ids_cap;
  size_t *ids_off; /* per request, offset into ids */
};

typedef struct cursor {
  const char *p, *end;
  size_t line;
  kvbm_error *err;
} cursor;

#define MAX_DEPTH 64

static int fail(cursor *c, int code, const char *what) {
  return kvbm_error_set(c->err, code, "line %zu: %s", c->line, what);
}

static void skip_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static bool eat(cursor *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

/* Reads a string; if `key` is non-NULL copies up to keycap-1 bytes of the
 * raw (still escaped) text into it. */
static int read_string(cursor *c, char *key, size_t keycap) {
  skip_ws(c);
  if (c->p >= c->end || *c->p != '"') return fail(c, KVBM_EFORMAT, "expected a string");
  c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != '"') {
    unsigned char ch = (unsigned char)*c->p;
    if (ch < 0x20) return fail(c, KVBM_EFORMAT, "control character in a string");
    if (ch == '\\') {
      if (c->p + 1 >= c->end) break;
      if (key && n + 1 < keycap) key[n++] = *c->p;
      c->p++;
    }
    if (key && n + 1 < keycap) key[n++] = *c->p;
    c->p++;
  }
  if (c->p >= c->end) return fail(c, KVBM_EFORMAT, "unterminated string");
  c->p++;
  if (key) key[n] = '\0';
  return KVBM_OK;
}

/* Reads a JSON number into *out (as a double; exact for integers < 2^53). */
static int read_number(cursor *c, double *out, const char *field) {
  skip_ws(c);
  const char *s = c->p;
  if (s < c->end && *s == '-') s++;
  if (s >= c->end || *s < '0' || *s > '9') {
    kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: %s: expected a number", c->line, field);
    return KVBM_EFORMAT;
  }
  while (s < c->end && ((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E' ||
                        *s == '+' || *s == '-'))
    s++;
  char tmp[64];
  size_t n = (size_t)(s - c->p);
  if (n >= sizeof tmp) {
    kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: %s: number too long", c->line, field);
    return KVBM_EFORMAT;
  }
  memcpy(tmp, c->p, n);
  tmp[n] = '\0';
  char *endp;
  errno = 0;
  double v = strtod(tmp, &endp);
  if (*endp || !isfinite(v)) {
    kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: %s: '%s' is not a number", c->line, field, tmp);
    return KVBM_EFORMAT;
  }
  c->p = s;
  *out = v;
  return KVBM_OK;
}

/* A non-negative integer below `max`. */
static int read_count(cursor *c, const char *field, double max, uint32_t *out) {
  double v;
  int rc = read_number(c, &v, field);
  if (rc) return rc;
  if (v < 0)
    return kvbm_error_set(c->err, KVBM_ERANGE, "line %zu: %s: %.17g is negative", c->line, field, v);
  if (v != floor(v))
    return kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: %s: %.17g is not an integer", c->line, field, v);
  if (v > max)
    return kvbm_error_set(c->err, KVBM_ERANGE, "line %zu: %s: %.17g is larger than %.17g", c->line, field, v, max);
  *out = (uint32_t)v;
  return KVBM_OK;
}

static int skip_value(cursor *c, int depth) {
  if (depth > MAX_DEPTH) return fail(c, KVBM_EFORMAT, "nested too deeply");
  skip_ws(c);
  if (c->p >= c->end) return fail(c, KVBM_EFORMAT, "expected a value");
  char ch = *c->p;
  if (ch == '"') return read_string(c, NULL, 0);
  if (ch == '{' || ch == '[') {
    char close = ch == '{' ? '}' : ']';
    c->p++;
    if (eat(c, close)) return KVBM_OK;
    for (;;) {
      int rc;
      if (ch == '{') {
        if ((rc = read_string(c, NULL, 0))) return rc;
        if (!eat(c, ':')) return fail(c, KVBM_EFORMAT, "expected ':'");
      }
      if ((rc = skip_value(c, depth + 1))) return rc;
      if (eat(c, close)) return KVBM_OK;
      if (!eat(c, ',')) return fail(c, KVBM_EFORMAT, "expected ',' or a closing bracket");
    }
  }
  static const char *const words[] = {"true", "false", "null"};
  for (size_t i = 0; i < 3; i++) {
    size_t n = strlen(words[i]);
    if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, words[i], n)) {
      c->p += n;
      return KVBM_OK;
    }
  }
  double ignored;
  return read_number(c, &ignored, "value");
}

static int push_id(kvsim_trace *t, uint32_t id) {
  if (kvbm__vec_reserve_of(&t->ids, &t->ids_cap, t->nids + 1, 4096, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  t->ids[t->nids++] = id;
  return KVBM_OK;
}

static int read_hash_ids(cursor *c, kvsim_trace *t, uint32_t *count) {
  if (!eat(c, '[')) return fail(c, KVBM_EFORMAT, "hash_ids: expected an array");
  *count = 0;
  if (eat(c, ']')) return KVBM_OK;
  for (;;) {
    uint32_t id;
    int rc = read_count(c, "hash_ids", KVSIM_TRACE_MAX_HASH_ID, &id);
    if (rc) return rc;
    if ((rc = push_id(t, id))) return fail(c, rc, "out of memory");
    if (++*count == UINT32_MAX) return fail(c, KVBM_ERANGE, "hash_ids: too many");
    if (eat(c, ']')) return KVBM_OK;
    if (!eat(c, ',')) return fail(c, KVBM_EFORMAT, "hash_ids: expected ',' or ']'");
  }
}

enum { HAVE_TS = 1, HAVE_IN = 2, HAVE_OUT = 4, HAVE_IDS = 8 };

static int read_record(cursor *c, kvsim_trace *t, kvsim_trace_request *r) {
  unsigned have = 0;
  int rc;
  if (!eat(c, '{')) return fail(c, KVBM_EFORMAT, "not a JSON object");
  if (!eat(c, '}')) {
    for (;;) {
      char key[32];
      if ((rc = read_string(c, key, sizeof key))) return rc;
      if (!eat(c, ':')) return fail(c, KVBM_EFORMAT, "expected ':' after a key");
      unsigned bit = !strcmp(key, "timestamp")       ? HAVE_TS
                     : !strcmp(key, "input_length")  ? HAVE_IN
                     : !strcmp(key, "output_length") ? HAVE_OUT
                     : !strcmp(key, "hash_ids")      ? HAVE_IDS
                                                     : 0;
      if (bit & have) {
        return kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: field '%s' appears twice", c->line, key);
      }
      have |= bit;
      if (bit == HAVE_TS) {
        rc = read_number(c, &r->timestamp_ms, "timestamp");
        if (!rc && r->timestamp_ms < 0)
          rc = kvbm_error_set(c->err, KVBM_ERANGE, "line %zu: timestamp: %.17g is negative", c->line, r->timestamp_ms);
      } else if (bit == HAVE_IN) {
        rc = read_count(c, "input_length", (double)UINT32_MAX / 2, &r->input_length);
      } else if (bit == HAVE_OUT) {
        rc = read_count(c, "output_length", 65535, &r->output_length);
      } else if (bit == HAVE_IDS) {
        rc = read_hash_ids(c, t, &r->num_hash_ids);
      } else {
        rc = skip_value(c, 1);
      }
      if (rc) return rc;
      if (eat(c, '}')) break;
      if (!eat(c, ',')) return fail(c, KVBM_EFORMAT, "expected ',' or '}'");
    }
  }
  skip_ws(c);
  if (c->p != c->end) return fail(c, KVBM_EFORMAT, "trailing characters after the object");
  static const char *const names[] = {"timestamp", "input_length", "output_length", "hash_ids"};
  for (unsigned i = 0; i < 4; i++)
    if (!(have & (1u << i)))
      return kvbm_error_set(c->err, KVBM_EFORMAT, "line %zu: missing field '%s'", c->line, names[i]);
  if ((uint64_t)r->input_length > (uint64_t)KVSIM_TRACE_BLOCK * r->num_hash_ids)
    return kvbm_error_set(c->err, KVBM_ERANGE,
                          "line %zu: input_length %u is beyond 512 * %u hash_ids", c->line,
                          r->input_length, r->num_hash_ids);
  return KVBM_OK;
}

static int push_request(kvsim_trace *t, const kvsim_trace_request *r, size_t off) {
  /* The requests and their offsets share one capacity: each grows from a
   * copy of it (to the same new one); t->cap moves when both hold it. */
  size_t cr = t->cap, co = t->cap;
  if (kvbm__vec_reserve_of(&t->reqs, &cr, t->count + 1, 1024, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&t->ids_off, &co, t->count + 1, 1024, KVBM__VEC_NO_LIMIT))
    return KVBM_ENOMEM;
  t->cap = cr;
  t->reqs[t->count] = *r;
  t->ids_off[t->count++] = off;
  return KVBM_OK;
}

/* One line [p, eol): a request, a blank line, or an error naming it. */
static int take_line(kvsim_trace *t, cursor *c, const char *p, const char *eol) {
  c->line++;
  if ((size_t)(eol - p) > KVSIM_TRACE_MAX_LINE)
    return kvbm_error_set(c->err, KVBM_ETOOLONG, "line %zu: longer than %u bytes", c->line, KVSIM_TRACE_MAX_LINE);
  c->p = p;
  c->end = eol;
  skip_ws(c);
  if (c->p == c->end) return KVBM_OK;
  if (memchr(p, '\0', (size_t)(eol - p))) return fail(c, KVBM_EFORMAT, "NUL byte in the line");
  kvsim_trace_request r;
  memset(&r, 0, sizeof r);
  size_t off = t->nids;
  int rc = read_record(c, t, &r);
  if (rc) return rc;
  if ((rc = push_request(t, &r, off))) return fail(c, rc, "out of memory");
  return KVBM_OK;
}

/* Points every request at its hash ids (the pool no longer moves). A
 * trace whose requests have no hash ids at all has no pool (ids NULL):
 * those requests get NULL, never NULL + 0. */
static void finish(kvsim_trace *t) {
  for (size_t i = 0; i < t->count; i++)
    t->reqs[i].hash_ids = t->ids ? t->ids + t->ids_off[i] : NULL;
}

int kvsim_trace_parse(const char *buf, size_t len, size_t limit, kvsim_trace **out,
                     kvbm_error *err) {
  if ((!buf && len) || !out) return kvbm_error_set(err, KVBM_EINVAL, "trace: NULL argument");
  kvsim_trace *t = calloc(1, sizeof *t);
  if (!t) return kvbm_error_set(err, KVBM_ENOMEM, "trace: out of memory");
  cursor c = {.err = err, .line = 0};
  const char *p = buf, *end = buf + len;
  int rc = KVBM_OK;
  while (!rc && p < end && (!limit || t->count < limit)) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *eol = nl ? nl : end;
    rc = take_line(t, &c, p, eol);
    p = nl ? nl + 1 : end;
  }
  if (rc) {
    kvsim_trace_destroy(t);
    return rc;
  }
  finish(t);
  *out = t;
  return KVBM_OK;
}

/* ---- Streaming from a file ----
 *
 * The file is inflated (or read, if plain) in windows of READ_WINDOW bytes
 * and cut into lines as it comes; a line is parsed straight from the window
 * when it lies inside one, and otherwise gathered in a line buffer that
 * may grow to KVSIM_TRACE_MAX_LINE bytes and no further. Reading stops as
 * soon as `limit` requests are in, so a trace of any size (or a gzip bomb)
 * costs the window, one line and the requests kept. At the end of the
 * input zlib must have seen the gzip stream's end: a file cut short, even
 * at a flush point where everything before it inflates cleanly, is an
 * error and not a shorter trace. */
#define READ_WINDOW (1u << 20)

typedef struct reader {
  kvsim_trace *t;
  cursor c;
  char *line; /* a line spanning windows */
  size_t len, cap;
} reader;

/* Appends [p, q) to the pending line, within the line limit. */
static int gather(reader *r, const char *p, const char *q) {
  size_t n = (size_t)(q - p);
  if (r->len + n > KVSIM_TRACE_MAX_LINE)
    return kvbm_error_set(r->c.err, KVBM_ETOOLONG, "line %zu: longer than %u bytes", r->c.line + 1,
                          KVSIM_TRACE_MAX_LINE);
  /* Growth (doubling from 4 KiB) stops at the line limit checked above. */
  if (kvbm__vec_reserve_of(&r->line, &r->cap, r->len + n, 4096, KVSIM_TRACE_MAX_LINE))
    return kvbm_error_set(r->c.err, KVBM_ENOMEM, "line %zu: out of memory", r->c.line + 1);
  memcpy(r->line + r->len, p, n);
  r->len += n;
  return KVBM_OK;
}

/* Takes the lines of one window; stops at the limit (*done). */
static int feed(reader *r, const char *p, const char *end, size_t limit, bool *done) {
  while (p < end) {
    if (limit && r->t->count >= limit) {
      *done = true;
      return KVBM_OK;
    }
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return gather(r, p, end);
    int rc;
    if (r->len) { /* the end of a line begun in an earlier window */
      rc = gather(r, p, nl);
      if (!rc) rc = take_line(r->t, &r->c, r->line, r->line + r->len);
      r->len = 0;
    } else {
      rc = take_line(r->t, &r->c, p, nl);
    }
    if (rc) return rc;
    p = nl + 1;
  }
  *done = limit && r->t->count >= limit;
  return KVBM_OK;
}

static int read_all(gzFile f, const char *path, size_t limit, reader *r, char *win, kvbm_error *err) {
  for (;;) {
    int n = gzread(f, win, READ_WINDOW);
    if (n < 0) {
      int zerr;
      const char *msg = gzerror(f, &zerr);
      return kvbm_error_set(err, KVBM_EIO, "trace: reading %s: %s", path, msg);
    }
    if (n == 0) break;
    bool done = false;
    int rc = feed(r, win, win + n, limit, &done);
    if (rc || done) return rc;
  }
  int zerr = Z_OK;
  gzerror(f, &zerr);
  if (zerr == Z_BUF_ERROR) /* input ended inside a gzip stream */
    return kvbm_error_set(err, KVBM_ETRUNCATED,
                          "trace: %s is truncated: its gzip stream ends without its end marker (line %zu)", path,
                          r->c.line + 1);
  if (r->len && (!limit || r->t->count < limit)) /* a last line without a newline */
    return take_line(r->t, &r->c, r->line, r->line + r->len);
  return KVBM_OK;
}

int kvsim_trace_load(const char *path, size_t limit, kvsim_trace **out, kvbm_error *err) {
  if (!path || !out) return kvbm_error_set(err, KVBM_EINVAL, "trace: NULL argument");
  gzFile f = gzopen(path, "rb");
  if (!f) return kvbm_error_set(err, KVBM_EIO, "trace: cannot open %s: %s", path, strerror(errno));
  reader r = {.c = {.err = err, .line = 0}};
  char *win = malloc(READ_WINDOW);
  r.t = calloc(1, sizeof *r.t);
  int rc = win && r.t ? read_all(f, path, limit, &r, win, err)
                      : kvbm_error_set(err, KVBM_ENOMEM, "trace: out of memory reading %s", path);
  gzclose(f);
  free(win);
  free(r.line);
  if (rc) {
    kvsim_trace_destroy(r.t);
    return rc;
  }
  finish(r.t);
  *out = r.t;
  return KVBM_OK;
}

void kvsim_trace_destroy(kvsim_trace *t) {
  if (!t) return;
  free(t->reqs);
  free(t->ids);
  free(t->ids_off);
  free(t);
}

size_t kvsim_trace_count(const kvsim_trace *t) { return t->count; }

const kvsim_trace_request *kvsim_trace_get(const kvsim_trace *t, size_t i) {
  return i < t->count ? &t->reqs[i] : NULL;
}

void kvsim_trace_max_lengths(const kvsim_trace *t, size_t n, size_t *max_input,
                            size_t *max_output) {
  size_t in = 1, out = 1;
  if (n > t->count) n = t->count;
  for (size_t i = 0; i < n; i++) {
    if (t->reqs[i].input_length > in) in = t->reqs[i].input_length;
    if (t->reqs[i].output_length > out) out = t->reqs[i].output_length;
  }
  *max_input = in;
  *max_output = out;
}

int kvsim_trace_check_fit(const kvsim_trace *t, size_t n, uint32_t block_size, uint64_t capacity,
                         kvbm_error *err) {
  if (!t || block_size == 0) return kvbm_error_set(err, KVBM_EINVAL, "trace: NULL trace or block size 0");
  if (n > t->count) n = t->count;
  for (size_t i = 0; i < n; i++) {
    const kvsim_trace_request *r = &t->reqs[i];
    uint64_t tokens = (uint64_t)r->input_length + r->output_length;
    uint64_t blocks = (tokens + block_size - 1) / block_size;
    if (blocks > capacity)
      return kvbm_error_set(err, KVBM_ENOSPC,
                            "replay: request %zu (%u prompt + %u output tokens, %llu blocks) does not fit in the "
                            "pool of %llu blocks",
                            i, r->input_length, r->output_length, (unsigned long long)blocks,
                            (unsigned long long)capacity);
  }
  return KVBM_OK;
}

void kvsim_trace_prompt_tokens(const kvsim_trace_request *req, uint32_t *out) {
  uint32_t n = req->input_length;
  for (uint32_t b = 0, i = 0; i < n; b++) {
    uint32_t base = req->hash_ids[b] * KVSIM_TRACE_BLOCK;
    uint32_t stop = n - i < KVSIM_TRACE_BLOCK ? n - i : KVSIM_TRACE_BLOCK;
    for (uint32_t j = 0; j < stop; j++) out[i + j] = base + j;
    i += stop;
  }
}

void kvsim_trace_output_tokens(const kvsim_trace_request *req, size_t r, uint32_t *out) {
  for (uint32_t m = 0; m < req->output_length; m++)
    out[m] = 0x80000000u | (uint32_t)(r << 16) | m;
}
