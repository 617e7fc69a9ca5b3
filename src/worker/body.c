/* SPDX-License-Identifier: Apache-2.0 */
/*
 * body.c: the worker's strict body readers (body.h has the rules and why
 * they are strict). A cursor walks the bytes once; every read checks the
 * end first, so a body cut anywhere is "truncated", never a read past it.
 * Arrays grow through kvbm__vec_reserve up to the caller's item bound, so
 * a hostile Content-Length within the route's limit costs at most that.
 */
#include "worker/body.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

typedef struct cur {
  const char *p, *end, *start;
  kvbm_error *err;
} cur;

static int fail(cur *c, int rc, const char *what) {
  return kvbm_error_set(c->err, rc, "body: %s (at byte %zu)", what, (size_t)(c->p - c->start));
}

static void ws(cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

/* Expects byte ch after whitespace. */
static bool eat(cur *c, char ch) {
  ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

/* A string of printable ASCII without escapes into out (cap with NUL). */
static int str(cur *c, char *out, size_t cap, const char *what) {
  ws(c);
  if (c->p >= c->end || *c->p != '"') return fail(c, KVBM_EFORMAT, what);
  c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != '"') {
    unsigned char ch = (unsigned char)*c->p;
    if (ch < 0x20 || ch > 0x7e || ch == '\\')
      return fail(c, KVBM_EFORMAT, "strings are printable ASCII without escapes");
    if (n + 1 >= cap) return fail(c, KVBM_ERANGE, what); /* 400: the body is not too big */
    out[n++] = (char)ch;
    c->p++;
  }
  if (c->p >= c->end) return fail(c, KVBM_EFORMAT, "truncated string");
  c->p++;
  out[n] = 0;
  return KVBM_OK;
}

/* A plain decimal integer in [0, max]. */
static int read_uint(cur *c, uint64_t max, uint64_t *out, const char *key) {
  ws(c);
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
    char m[96];
    snprintf(m, sizeof m, "%s must be a non-negative integer", key);
    return fail(c, KVBM_EFORMAT, m);
  }
  uint64_t v = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    uint64_t d = (uint64_t)(*c->p - '0');
    if (v > (max - d) / 10) {
      char m[96];
      snprintf(m, sizeof m, "%s above %llu", key, (unsigned long long)max);
      return fail(c, KVBM_ERANGE, m);
    }
    v = v * 10 + d;
    c->p++;
  }
  if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) {
    char m[96];
    snprintf(m, sizeof m, "%s must be an integer", key);
    return fail(c, KVBM_EFORMAT, m);
  }
  *out = v;
  return KVBM_OK;
}

static int boolean(cur *c, bool *out, const char *key) {
  ws(c);
  size_t left = (size_t)(c->end - c->p);
  if (left >= 4 && !memcmp(c->p, "true", 4)) {
    c->p += 4;
    *out = true;
    return KVBM_OK;
  }
  if (left >= 5 && !memcmp(c->p, "false", 5)) {
    c->p += 5;
    *out = false;
    return KVBM_OK;
  }
  char m[64];
  snprintf(m, sizeof m, "%s must be true or false", key);
  return fail(c, KVBM_EFORMAT, m);
}

/* [u32, ...] of at most max items into a malloc'd array. */
static int u32_array(cur *c, size_t max, uint32_t **out, size_t *n, const char *key) {
  if (!eat(c, '[')) {
    char m[64];
    snprintf(m, sizeof m, "%s must be an array", key);
    return fail(c, KVBM_EFORMAT, m);
  }
  size_t cap = 0;
  *n = 0;
  if (eat(c, ']')) return KVBM_OK;
  do {
    if (*n >= max) {
      char m[96];
      snprintf(m, sizeof m, "%s has more than %zu items", key, max);
      return fail(c, KVBM_ETOOLONG, m);
    }
    uint64_t v;
    int rc = read_uint(c, UINT32_MAX, &v, key);
    if (rc) return rc;
    if (kvbm__vec_reserve_of(out, &cap, *n + 1, 256, max))
      return fail(c, KVBM_ENOMEM, "out of memory");
    (*out)[(*n)++] = (uint32_t)v;
  } while (eat(c, ','));
  if (!eat(c, ']')) {
    char m[64];
    snprintf(m, sizeof m, "%s: ',' or ']' expected", key);
    return fail(c, KVBM_EFORMAT, m);
  }
  return KVBM_OK;
}

/* Walks the top object: calls fn for each key with the cursor at its
 * value; a key seen twice is refused. */
typedef int (*key_fn)(cur *c, const char *key, void *user);

static int object(cur *c, key_fn fn, void *user) {
  if (!eat(c, '{')) return fail(c, KVBM_EFORMAT, "a JSON object expected");
  char seen[8][24];
  size_t nseen = 0;
  if (!eat(c, '}')) {
    do {
      char key[24];
      int rc = str(c, key, sizeof key, "a key expected (a short string)");
      if (rc) return rc;
      for (size_t i = 0; i < nseen; i++)
        if (!strcmp(seen[i], key)) {
          char m[64];
          snprintf(m, sizeof m, "key '%s' given twice", key);
          return fail(c, KVBM_EFORMAT, m);
        }
      if (nseen < 8) memcpy(seen[nseen++], key, sizeof key);
      if (!eat(c, ':')) return fail(c, KVBM_EFORMAT, "':' expected");
      rc = fn(c, key, user);
      if (rc) return rc;
    } while (eat(c, ','));
    if (!eat(c, '}')) return fail(c, KVBM_EFORMAT, "',' or '}' expected");
  }
  ws(c);
  if (c->p != c->end) return fail(c, KVBM_EFORMAT, "bytes after the object");
  return KVBM_OK;
}

typedef struct gen_ctx {
  kvsim_gen_body *b;
  size_t max_items;
  uint32_t max_tokens;
  bool has_id;
} gen_ctx;

static int gen_key(cur *c, const char *key, void *user) {
  gen_ctx *g = user;
  kvsim_gen_body *b = g->b;
  uint64_t v;
  int rc;
  if (!strcmp(key, "request_id")) {
    rc = str(c, b->request_id, sizeof b->request_id, "request_id must be a string of 1..128 bytes");
    g->has_id = !rc;
    return rc;
  }
  if (!strcmp(key, "token_ids"))
    return u32_array(c, g->max_items, &b->token_ids, &b->num_tokens, "token_ids");
  if (!strcmp(key, "hash_ids"))
    return u32_array(c, g->max_items, &b->hash_ids, &b->num_hash_ids, "hash_ids");
  if (!strcmp(key, "input_length") || !strcmp(key, "output_length")) {
    rc = read_uint(c, g->max_tokens, &v, key);
    if (rc) return rc;
    if (key[0] == 'i') {
      b->input_length = (uint32_t)v;
      b->has_input = true;
    } else {
      b->output_length = (uint32_t)v;
      b->has_output = true;
    }
    return KVBM_OK;
  }
  char m[96];
  snprintf(m, sizeof m, "unknown key '%s' (request_id, token_ids | hash_ids, input_length, output_length)", key);
  return fail(c, KVBM_EFORMAT, m);
}

void kvsim_gen_body_free(kvsim_gen_body *b) {
  if (!b) return;
  free(b->token_ids);
  free(b->hash_ids);
  b->token_ids = NULL;
  b->hash_ids = NULL;
}

int kvsim_gen_body_parse(const char *buf, size_t len, size_t max_items, uint32_t max_tokens,
                         kvsim_gen_body *out, kvbm_error *err) {
  memset(out, 0, sizeof *out);
  cur c = {.p = buf, .end = buf + len, .start = buf, .err = err};
  gen_ctx g = {.b = out, .max_items = max_items, .max_tokens = max_tokens};
  int rc = object(&c, gen_key, &g);
  if (!rc && (!g.has_id || !out->request_id[0]))
    rc = kvbm_error_set(err, KVBM_EFORMAT, "body: request_id (a non-empty string) is required");
  if (!rc && !out->token_ids && !out->hash_ids && !out->has_input)
    rc = kvbm_error_set(err, KVBM_EFORMAT, "body: token_ids, or hash_ids with input_length, is required");
  if (!rc && out->token_ids && (out->hash_ids || out->has_input))
    rc = kvbm_error_set(err, KVBM_EFORMAT, "body: token_ids or hash_ids, not both");
  if (!rc && out->token_ids && out->num_tokens == 0)
    rc = kvbm_error_set(err, KVBM_EFORMAT, "body: token_ids is empty");
  if (!rc && out->token_ids && out->num_tokens > max_tokens)
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "body: %zu token_ids (at most %u)", out->num_tokens,
                        max_tokens);
  if (!rc && !out->token_ids) {
    if (!out->hash_ids || !out->has_input || !out->has_output)
      rc = kvbm_error_set(err, KVBM_EFORMAT,
                          "body: a trace line needs hash_ids, input_length and output_length");
    else if (out->input_length == 0)
      rc = kvbm_error_set(err, KVBM_EFORMAT, "body: input_length is 0");
    else if ((uint64_t)out->input_length > 512ull * out->num_hash_ids)
      rc = kvbm_error_set(err, KVBM_ERANGE,
                          "body: input_length %u is beyond 512 * %zu hash_ids", out->input_length,
                          out->num_hash_ids);
  }
  if (!rc && out->token_ids && (uint64_t)out->num_tokens + out->output_length > max_tokens)
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "body: %zu prompt + %u output tokens (at most %u)",
                        out->num_tokens, out->output_length, max_tokens);
  if (!rc && out->hash_ids && (uint64_t)out->input_length + out->output_length > max_tokens)
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "body: %u input + %u output tokens (at most %u)",
                        out->input_length, out->output_length, max_tokens);
  if (rc) kvsim_gen_body_free(out);
  return rc;
}

static int fault_key(cur *c, const char *key, void *user) {
  kvsim_fault_body *f = user;
  if (!strcmp(key, "publish")) {
    f->has_publish = true;
    return boolean(c, &f->publish, key);
  }
  if (!strcmp(key, "g3_full")) {
    f->has_g3_full = true;
    return boolean(c, &f->g3_full, key);
  }
  if (!strcmp(key, "g3_delay_ms")) {
    uint64_t v;
    int rc = read_uint(c, 600000, &v, key);
    f->g3_delay_ms = (uint32_t)v;
    f->has_g3_delay = !rc;
    return rc;
  }
  char m[96];
  snprintf(m, sizeof m, "unknown key '%s' (publish, g3_delay_ms, g3_full)", key);
  return fail(c, KVBM_EFORMAT, m);
}

int kvsim_fault_body_parse(const char *buf, size_t len, kvsim_fault_body *out, kvbm_error *err) {
  memset(out, 0, sizeof *out);
  cur c = {.p = buf, .end = buf + len, .start = buf, .err = err};
  int rc = object(&c, fault_key, out);
  if (!rc && !out->has_publish && !out->has_g3_full && !out->has_g3_delay)
    rc = kvbm_error_set(err, KVBM_EFORMAT, "body: none of publish, g3_delay_ms, g3_full given");
  return rc;
}
