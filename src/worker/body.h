/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker/body.h (private to src/worker): the strict readers of `kvbm
 * worker`'s request bodies. A codec only: bytes in, values out, every
 * bound checked, and on refusal a message naming the key and what is
 * wrong (the worker answers it as {"error": ..., "status": 400}).
 *
 * Why not the router's JSON reader (router/json.c): that one reads the
 * router's bodies (a numeric request id, block hashes, salts) and is the
 * router area's; the worker's bodies differ (a string request id, a trace
 * line's hash ids and lengths, the fault knobs), and both are small.
 *
 * The rules: one JSON object, whitespace around it, nothing after it;
 * only the keys the route knows (an unknown or repeated key is refused,
 * so a typo never silently means "absent"); integers are plain decimal
 * digits within the key's range (no sign, fraction or exponent); strings
 * are printable ASCII without escapes (a request id is an identifier,
 * not text); arrays at most the configured length.
 */
#ifndef KVSIM_WORKER_BODY_H
#define KVSIM_WORKER_BODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#define KVSIM_WORKER_MAX_ID 128 /* bytes of a request id */

/* POST /generate: {"request_id", "token_ids"} or {"request_id",
 * "hash_ids", "input_length", "output_length"}; "output_length" is also
 * taken with token_ids (0 when absent). */
typedef struct kvsim_gen_body {
  char request_id[KVSIM_WORKER_MAX_ID + 1];
  uint32_t *token_ids; /* malloc'd (NULL: the trace form) */
  size_t num_tokens;
  uint32_t *hash_ids;  /* malloc'd (NULL: the token form) */
  size_t num_hash_ids;
  uint32_t input_length, output_length;
  bool has_input, has_output;
} kvsim_gen_body;

/* Parses a /generate body; arrays longer than max_items, an input_length
 * or output_length above max_tokens, and a trace line whose input_length
 * is beyond 512 tokens per hash id, are refused. KVBM_EFORMAT /
 * KVBM_ERANGE / KVBM_ETOOLONG / KVBM_ENOMEM with err naming what; *out
 * then owns nothing. */
int kvsim_gen_body_parse(const char *buf, size_t len, size_t max_items, uint32_t max_tokens,
                         kvsim_gen_body *out, kvbm_error *err);
void kvsim_gen_body_free(kvsim_gen_body *b);

/* POST /admin/fault: any of {"publish": bool, "g3_delay_ms": 0..600000,
 * "g3_full": bool}; has_* say which were given. */
typedef struct kvsim_fault_body {
  bool publish, g3_full;
  uint32_t g3_delay_ms;
  bool has_publish, has_g3_full, has_g3_delay;
} kvsim_fault_body;

int kvsim_fault_body_parse(const char *buf, size_t len, kvsim_fault_body *out, kvbm_error *err);

#endif
