/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_worker_body.c: libFuzzer target for `kvbm worker`'s body readers
 * (src/worker/body.h).
 * fuzz-modules: common worker/body.c
 *
 * Beyond "no crash, no leak, no UB": an accepted /generate body obeys
 * the rules the worker relies on (a request id of 1..128 printable bytes,
 * exactly one form, bounds on items and tokens, a trace line's
 * input_length within 512 per hash id), and a refusal says why with the
 * reader's prefix. The same bytes go through the /admin/fault reader.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvsim_gen_body b;
  kvbm_error err = {0};
  const size_t max_items = 256;
  const uint32_t max_tokens = 4096;
  if (kvsim_gen_body_parse((const char *)data, size, max_items, max_tokens, &b, &err)) {
    if (strncmp(err.msg, "body: ", 6) || b.token_ids || b.hash_ids) abort();
  } else {
    size_t idlen = strlen(b.request_id);
    if (idlen < 1 || idlen > KVSIM_WORKER_MAX_ID) abort();
    for (size_t i = 0; i < idlen; i++)
      if (b.request_id[i] < 0x20 || b.request_id[i] > 0x7e || b.request_id[i] == '\\') abort();
    if (!b.token_ids == !b.hash_ids) abort();
    if (b.token_ids && (!b.num_tokens || b.num_tokens + b.output_length > max_tokens)) abort();
    if (b.hash_ids && (!b.input_length || b.input_length > 512ull * b.num_hash_ids ||
                       b.input_length + b.output_length > max_tokens ||
                       b.num_hash_ids > max_items))
      abort();
    kvsim_gen_body_free(&b);
  }
  kvsim_fault_body f;
  if (kvsim_fault_body_parse((const char *)data, size, &f, &err) == KVBM_OK) {
    if (!f.has_publish && !f.has_g3_full && !f.has_g3_delay) abort();
    if (f.g3_delay_ms > 600000) abort();
  }
  return 0;
}
