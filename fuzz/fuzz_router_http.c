/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_router_http.c: libFuzzer target for the router daemon's codecs: the
 * HTTP/1.1 request-head parser and the JSON body reader.
 * fuzz-modules: common service metrics hash group pool sequence event_codec events router
 * fuzz-libs: z xxhash msgpackc zmq nats
 *
 * Beyond "no crash, no leak, no UB": the head parser never claims a head
 * longer than its input or past its limits, answers NEED_MORE only for
 * input shorter than the limit, and refuses with a 4xx/5xx status and a
 * reason; a parsed head's body length is within max_body; the same bytes
 * fed in pieces with the scan resumed (`scanned`) get the same answer.
 * The JSON reader either accepts (arrays within the item limit, owned
 * memory freed; cache_salt and lora_name decoded, no longer than their raw
 * bytes) or refuses with a message and owns nothing; each input is
 * also read with its last byte cut.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/http.h"
#include "router/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* each input is tried from a heap copy of exactly its size, so ASan
   * catches a read one past the end */
  char *buf = malloc(size ? size : 1);
  if (size) memcpy(buf, data, size);

  http_req r;
  int status = 0;
  const char *why = NULL;
  const size_t max_head = 512, max_body = 4096;
  http_result hr = kvbm__http_parse_head(buf, size, max_head, max_body, NULL, &r, &status, &why);
  /* the same bytes arriving in pieces, the scan resumed: the same answer */
  {
    size_t scanned = 0, step = size % 7 + 1;
    http_req r2;
    int st2 = 0;
    const char *why2 = NULL;
    http_result h2 = HTTP_NEED_MORE;
    for (size_t i = step < size ? step : size;; i = i + step < size ? i + step : size) {
      h2 = kvbm__http_parse_head(buf, i, max_head, max_body, &scanned, &r2, &st2, &why2);
      if (h2 != HTTP_NEED_MORE || i == size) break;
      if (scanned > i) abort();
    }
    if (h2 != hr) abort();
    if (hr == HTTP_BAD && st2 != status) abort();
    if (hr == HTTP_HEAD && (r2.head_len != r.head_len || r2.content_length != r.content_length))
      abort();
  }
  if (hr == HTTP_HEAD) {
    if (r.head_len > size || r.head_len > max_head || r.head_len < 4) abort();
    if (r.content_length > max_body) abort();
    if (strlen(r.path) >= sizeof r.path || r.path[0] != '/') abort();
    if (r.minor != 0 && r.minor != 1) abort();
  } else if (hr == HTTP_BAD) {
    if (status < 400 || status > 505 || !why || !*why) abort();
  } else if (size >= max_head) {
    abort(); /* a head that cannot fit must be refused, not waited for */
  }

  rj_request q;
  kvbm_error err = {0};
  int rc = kvbm__rj_parse_request(buf, size, 64, &q, &err);
  if (rc == KVBM_OK) {
    if (q.num_tokens > 64 || q.num_hashes > 64) abort();
    if (q.has_tokens && !q.tokens) abort();
    if (q.has_hashes && !q.hashes) abort();
    /* decoded strings never grow past their raw bytes */
    if (q.cache_salt && strlen(q.cache_salt) > size) abort();
    if (q.lora_name && strlen(q.lora_name) > size) abort();
    kvbm__rj_request_free(&q);
  } else {
    if (!err.msg[0] || q.tokens || q.hashes || q.cache_salt || q.lora_name) abort();
  }
  if (size) {
    rc = kvbm__rj_parse_request(buf, size - 1, 64, &q, &err);
    if (rc == KVBM_OK) kvbm__rj_request_free(&q);
  }
  free(buf);
  return 0;
}
