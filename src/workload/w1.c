/* SPDX-License-Identifier: Apache-2.0 */
/*
 * w1.c: workload W1 through the sequence API (see workload/w1.h).
 *
 * The loop is what an engine does per request (prefill, decode, free), with
 * tokens made from the trace on the fly into two reused buffers; the only
 * allocations in the loop are the sequence handle and its block table.
 */
#include "workload/w1.h"

#include <stdlib.h>
#include <time.h>

#include "kvbm/sequence.h"
#include "common/clock.h"

kvsim_w1_config kvsim_w1_config_default(void) {
  kvsim_w1_config o = {0};
  o.block_size = 16;
  o.capacity = 16384;
  o.scheme = KVBM_HASH_NATIVE;
  return o;
}

static int run_request(kvbm_pool *pool, const kvsim_trace_request *r, size_t idx,
                       uint32_t *prompt, uint32_t *output, kvsim_w1_result *res,
                       kvbm_error *err) {
  kvbm_seq *seq;
  int rc = kvbm_seq_create(pool, 0, 0, &seq);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  size_t matched = 0;
  kvsim_trace_prompt_tokens(r, prompt);
  if (r->input_length) rc = kvbm_seq_prefill(seq, prompt, r->input_length, &matched);
  if (!rc) {
    kvsim_trace_output_tokens(r, idx, output);
    rc = kvbm_seq_append(seq, output, r->output_length);
  }
  kvbm_seq_destroy(seq);
  if (rc == KVBM_ENOSPC)
    return kvbm_error_set(err, rc, "replay: request %zu (%u prompt + %u output tokens) does not fit in the pool",
                          idx, r->input_length, r->output_length);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  res->prompt_tokens += r->input_length;
  res->hit_tokens += matched;
  return KVBM_OK;
}

int kvsim_w1_run(const kvsim_trace *trace, const kvsim_w1_config *opts,
                   kvsim_w1_result *out, kvbm_error *err) {
  if (!trace || !opts || !out) return kvbm_error_set(err, KVBM_EINVAL, "replay: NULL argument");
  size_t n = kvsim_trace_count(trace);
  if (opts->limit && opts->limit < n) n = opts->limit;
  /* A request that cannot fit is refused before its prompt buffer is
   * allocated (a 2^31-token prompt would take 8 GiB first). */
  int rc = kvsim_trace_check_fit(trace, n, opts->block_size, opts->capacity, err);
  if (rc) return rc;
  kvbm_pool_config pc = kvbm_pool_config_default(opts->capacity, opts->block_size);
  pc.scheme = opts->scheme;
  pc.keep_tokens = false; /* events carry the caller's tokens; nobody reads them back */
  pc.listener = opts->listener;
  pc.listener_user = opts->listener_user;
  kvbm_pool *pool;
  rc = kvbm_pool_create(&pc, &pool, err);
  if (rc) return rc;

  size_t max_in, max_out;
  kvsim_trace_max_lengths(trace, n, &max_in, &max_out);
  uint32_t *prompt = malloc(max_in * sizeof *prompt);
  uint32_t *output = malloc(max_out * sizeof *output);
  kvsim_w1_result res = {0};
  if (!prompt || !output) rc = kvbm_error_set(err, KVBM_ENOMEM, "replay: out of memory");

  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < n && !rc; i++) {
    rc = run_request(pool, kvsim_trace_get(trace, i), i, prompt, output, &res, err);
    res.requests += !rc;
    if (opts->on_request && !rc) opts->on_request(opts->request_user, i + 1, n, &res, pool);
    if (opts->progress && (i % 256 == 255)) opts->progress(opts->progress_user, i + 1, n);
  }
  res.seconds = kvbm_clock_seconds() - t0;
  if (!rc) {
    if (opts->progress) opts->progress(opts->progress_user, n, n);
    kvbm_pool_stats st;
    kvbm_pool_stats_get(pool, &st);
    res.blocks_allocated = st.allocated;
    if (opts->on_finish) opts->on_finish(opts->finish_user, pool);
    *out = res;
  }
  free(prompt);
  free(output);
  kvbm_pool_destroy(pool);
  return rc;
}
