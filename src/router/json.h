/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json.h: the router daemon's request bodies (a strict, bounded JSON
 * reader) and a small JSON writer. A codec only: bytes in, values out.
 */
#ifndef KVBM_ROUTER_JSON_H
#define KVBM_ROUTER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#define RJ_MAX_DEPTH 32

/* A routing request: {"token_ids": [u32, ...]} or {"block_hashes": [u64,
 * ...]} (exactly one), optional "request_id" (u64); /done's body is
 * {"request_id": u64}. Optional "cache_salt" and "lora_name" (strings or
 * null; at most 4096 bytes, no NUL) name the request's namespace. Unknown keys are skipped (any JSON value, nested at
 * most RJ_MAX_DEPTH deep). Hashes may be given as negative integers (read
 * as their 64-bit two's complement, as Python's signed hashes print). */
typedef struct rj_request {
  uint32_t *tokens;   /* malloc'd; NULL when absent */
  size_t num_tokens;
  bool has_tokens;
  uint64_t *hashes;   /* malloc'd; NULL when absent */
  size_t num_hashes;
  bool has_hashes;
  uint64_t request_id;
  bool has_request_id;
  char *cache_salt;   /* malloc'd, NUL-terminated, escapes decoded; NULL
                       * when absent or null */
  char *lora_name;    /* the same */
} rj_request;

/* Parses `len` bytes (the whole body: one object, whitespace around it).
 * Arrays longer than max_items are refused (KVBM_ETOOLONG). On error
 * returns KVBM_EFORMAT / KVBM_ETOOLONG / KVBM_ERANGE / KVBM_ENOMEM with err
 * saying what and at which byte; *out then owns nothing. */
int kvbm__rj_parse_request(const char *buf, size_t len, size_t max_items, rj_request *out,
                     kvbm_error *err);
void kvbm__rj_request_free(rj_request *r);

/* Growing output buffer for responses. */
typedef struct rj_buf {
  char *p;
  size_t len, cap;
  bool oom;
} rj_buf;

void kvbm__rj_printf(rj_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s as a JSON string (quoted, escaped). */
void kvbm__rj_string(rj_buf *b, const char *s);
/* Appends `text` verbatim, then v in decimal: kvbm__rj_u64(b, ",\"n\":", 5)
 * gives ,"n":5. For answers made of many counters: no format parsing. */
void kvbm__rj_u64(rj_buf *b, const char *text, uint64_t v);
void kvbm__rj_buf_free(rj_buf *b);

#endif
