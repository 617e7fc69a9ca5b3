/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/trace.h: request traces in Mooncake's JSON-lines format, and the
 * tokens they stand for (../shared/WORKLOADS.md, "Turning a trace into
 * tokens").
 *
 * One JSON object per line: {"timestamp": ms, "input_length": L,
 * "output_length": M, "hash_ids": [id, ...]}, one hash id per 512-token
 * block of the prompt. Unknown keys are ignored; blank lines are skipped.
 * Everything else that is not exactly this is rejected with an error naming
 * the line: not JSON, a missing or repeated field, a negative or fractional
 * length, input_length beyond 512 * len(hash_ids), a hash id so large its
 * tokens would not fit in 31 bits.
 */
#ifndef KVSIM_TRACE_H
#define KVSIM_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVSIM_TRACE_BLOCK 512u
/* Largest accepted hash id: its tokens stay below 2^31 (outputs use bit 31). */
#define KVSIM_TRACE_MAX_HASH_ID ((1u << 31) / KVSIM_TRACE_BLOCK - 1)

typedef struct kvsim_trace_request {
  double timestamp_ms;
  uint32_t input_length;
  uint32_t output_length;
  uint32_t num_hash_ids;
  const uint32_t *hash_ids;
} kvsim_trace_request;

typedef struct kvsim_trace kvsim_trace;

/* Longest line accepted (bytes, without the newline): 16 MiB, room for
 * about two million hash ids. */
#define KVSIM_TRACE_MAX_LINE (16u << 20)

/* Parses `len` bytes of JSON lines, keeping at most `limit` requests (0: all).
 * On success *out must be freed with kvsim_trace_destroy(). On bad input
 * returns KVBM_EFORMAT (or KVBM_ERANGE for out-of-range numbers,
 * KVBM_ETOOLONG for a line above KVSIM_TRACE_MAX_LINE) with err->msg
 * "line N: ...". */
int kvsim_trace_parse(const char *buf, size_t len, size_t limit, kvsim_trace **out,
                     kvbm_error *err);

/* Reads a trace file, plain or gzip-compressed, streaming: line by line as
 * it is inflated, and reading stops once `limit` requests are in, so the
 * memory used is the requests kept plus a 1 MiB window and one line (at
 * most KVSIM_TRACE_MAX_LINE), whatever the file's size. Errors: those of
 * kvsim_trace_parse; KVBM_EIO (cannot open or read; a corrupt gzip
 * stream); KVBM_ETRUNCATED (the gzip stream ends without its end marker,
 * e.g. a file cut at a flush point). */
int kvsim_trace_load(const char *path, size_t limit, kvsim_trace **out, kvbm_error *err);

void kvsim_trace_destroy(kvsim_trace *trace); /* NULL is a no-op */

size_t kvsim_trace_count(const kvsim_trace *trace);
/* The i-th request (i < count); valid until the trace is destroyed. */
const kvsim_trace_request *kvsim_trace_get(const kvsim_trace *trace, size_t i);

/* The largest input_length and output_length among the first n requests
 * (n is capped at the count), each at least 1: buffers sized from them are
 * never empty. */
void kvsim_trace_max_lengths(const kvsim_trace *trace, size_t n, size_t *max_input,
                            size_t *max_output);

/* Checks, before anything is sized from them, that each of the first n
 * requests (n capped at the count) fits in a pool of `capacity` blocks of
 * `block_size` tokens: its prompt and output tokens together need
 * ceil((input + output) / block_size) blocks at once. KVBM_ENOSPC naming
 * the first request that cannot fit (a replay would fail there anyway,
 * after allocating buffers for its prompt); KVBM_EINVAL for block_size 0. */
int kvsim_trace_check_fit(const kvsim_trace *trace, size_t n, uint32_t block_size, uint64_t capacity,
                         kvbm_error *err);

/* Writes the request's prompt tokens (input_length of them) to out:
 * token i = hash_ids[i / 512] * 512 + i % 512. */
void kvsim_trace_prompt_tokens(const kvsim_trace_request *req, uint32_t *out);

/* Writes the output tokens of the request on line r (0-based):
 * token m = 0x80000000 | r << 16 | m. */
void kvsim_trace_output_tokens(const kvsim_trace_request *req, size_t r, uint32_t *out);

#ifdef __cplusplus
}
#endif
#endif
