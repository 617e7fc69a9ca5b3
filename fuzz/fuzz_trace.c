/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_trace.c: libFuzzer target for the Mooncake trace reader.
 * fuzz-modules: common service metrics hash group pool sequence workload/trace.c workload/w1.c
 * fuzz-libs: z xxhash
 *
 * Beyond "no crash, no leak, no UB": an accepted trace obeys the format's
 * rules, its tokens can be made, and a W1 replay of it through a small pool
 * either runs or fails with a message (never a crash).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "workload/w1.h"
#include "workload/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvsim_trace *t;
  kvbm_error err = {0};
  if (kvsim_trace_parse((const char *)data, size, 64, &t, &err) != KVBM_OK) {
    if (strncmp(err.msg, "line ", 5) != 0) abort();
    return 0;
  }
  for (size_t i = 0; i < kvsim_trace_count(t); i++) {
    const kvsim_trace_request *r = kvsim_trace_get(t, i);
    if (r->input_length > 512u * r->num_hash_ids || r->timestamp_ms < 0) abort();
    if (r->input_length <= 4096) {
      uint32_t *tok = malloc((r->input_length + 1) * sizeof *tok);
      kvsim_trace_prompt_tokens(r, tok);
      for (uint32_t k = 0; k < r->input_length; k++)
        if (tok[k] >> 31) abort(); /* prompt tokens stay below bit 31 */
      free(tok);
    }
  }
  kvsim_w1_config o = kvsim_w1_config_default();
  o.capacity = 64;
  o.block_size = 4;
  kvsim_w1_result res;
  if (kvsim_w1_run(t, &o, &res, &err) == KVBM_OK) {
    if (res.hit_tokens > res.prompt_tokens) abort();
  } else if (!err.msg[0]) {
    abort();
  }
  kvsim_trace_destroy(t);
  return 0;
}
