/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_http_json.c: the daemon's codecs alone: request heads (every refusal
 * with its status, incremental arrival byte by byte) and request bodies
 * (values, limits, malformed JSON of many kinds, and every truncation of a
 * valid body refused without reading past its end).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/http.h"
#include "router/json.h"

static http_result head(const char *s, http_req *r, int *status) {
  const char *why;
  return kvbm__http_parse_head(s, strlen(s), 4096, 1000, NULL, r, status, &why);
}

static void test_http_ok(void **state) {
  (void)state;
  http_req r;
  int st;
  const char *s = "POST /route?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 12\r\n"
                  "Connection: keep-alive, Upgrade\r\n\r\n{\"a\":1}";
  assert_int_equal(head(s, &r, &st), HTTP_HEAD);
  assert_string_equal(r.method, "POST");
  assert_string_equal(r.path, "/route");
  assert_int_equal(r.minor, 1);
  assert_true(r.has_length);
  assert_int_equal(r.content_length, 12);
  assert_true(r.keep_alive);
  assert_int_equal(r.head_len, strlen(s) - 7);
  assert_int_equal(head("GET / HTTP/1.0\r\n\r\n", &r, &st), HTTP_HEAD);
  assert_false(r.keep_alive);
  assert_int_equal(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &r, &st), HTTP_HEAD);
  assert_true(r.keep_alive);
  assert_int_equal(head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", &r, &st), HTTP_HEAD);
  assert_false(r.keep_alive);
  /* byte by byte: NEED_MORE until the last byte, from scratch and resumed */
  size_t n = strlen(s) - 7, scanned = 0;
  for (size_t i = 0; i < n; i++) {
    const char *why;
    assert_int_equal(kvbm__http_parse_head(s, i, 4096, 1000, NULL, &r, &st, &why), HTTP_NEED_MORE);
    assert_int_equal(kvbm__http_parse_head(s, i, 4096, 1000, &scanned, &r, &st, &why), HTTP_NEED_MORE);
    assert_true(scanned <= i);
  }
  const char *why;
  assert_int_equal(kvbm__http_parse_head(s, n, 4096, 1000, &scanned, &r, &st, &why), HTTP_HEAD);
  assert_int_equal(r.head_len, n);
  assert_int_equal(r.content_length, 12);
}

/* A head fed in pieces with `scanned` carried gets the answer it gets whole,
 * at the first piece that decides it, and the resumed scan never starts
 * past a byte it has not seen. */
static void feed(const char *s, size_t step, http_result want, int want_status) {
  size_t len = strlen(s), scanned = 0;
  http_req r;
  int st = 0;
  const char *why;
  http_result res = HTTP_NEED_MORE;
  for (size_t i = step < len ? step : len;; i = i + step < len ? i + step : len) {
    res = kvbm__http_parse_head(s, i, 4096, 1000, &scanned, &r, &st, &why);
    if (res != HTTP_NEED_MORE || i == len) break;
    assert_true(scanned <= i);
  }
  if (res != want || (want == HTTP_BAD && st != want_status))
    fail_msg("fed in steps of %zu (%s): result %d status %d", step, s, res, st);
}

static void test_http_incremental(void **state) {
  (void)state;
  static const struct {
    const char *s;
    http_result res;
    int status;
  } cases[] = {
      {"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", HTTP_HEAD, 0},
      {"GET / HTTP/1.1\nX: y\n\n", HTTP_BAD, 400},
      {"GET / HTTP/1.1\r\nX: y\rZ\r\n\r\n", HTTP_BAD, 400},
      {"GET / HTTP/1.1\r\nX: \x01\r\n\r\n", HTTP_BAD, 400},
      {"GET / HTTP/1.1\r\n\r\r\n", HTTP_BAD, 400},
      {"GET / HTTP/1.1\r\nX: y\r\n\n", HTTP_BAD, 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", HTTP_BAD, 413},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (size_t step = 1; step <= 7; step++) feed(cases[i].s, step, cases[i].res, cases[i].status);
}

static void test_http_bad(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int status;
  } cases[] = {
      {"HELLO\r\n\r\n", 400},
      {"GET / HTTP/1.1\nX: y\n\n", 400},
      {"GET / HTTP/1.1\r\nX: y\rZ\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: \x01\r\n\r\n", 400},
      {"GET / HTTP/1.2\r\n\r\n", 505},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET / HTTP/1.1 \r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"GET x HTTP/1.1\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: y\r\n  folded\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nExpect: something\r\n\r\n", 417},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    http_req r;
    int st = 0;
    const char *why = NULL;
    http_result res = kvbm__http_parse_head(cases[i].s, strlen(cases[i].s), 4096, 1000, NULL, &r, &st, &why);
    if (res != HTTP_BAD || st != cases[i].status)
      fail_msg("case %zu (%s): result %d status %d", i, cases[i].s, res, st);
    assert_non_null(why);
  }
  /* equal duplicates are fine */
  http_req r;
  int st;
  assert_int_equal(head("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", &r, &st),
                   HTTP_HEAD);
  /* size limits */
  char big[600];
  memset(big, 'a', sizeof big);
  memcpy(big, "GET /", 5);
  memcpy(big + sizeof big - 14, " HTTP/1.1\r\n\r\n", 13);
  big[sizeof big - 1] = 0;
  assert_int_equal(head(big, &r, &st), HTTP_BAD);
  assert_int_equal(st, 414);
  const char *why;
  assert_int_equal(kvbm__http_parse_head(big, strlen(big), 100, 1000, NULL, &r, &st, &why), HTTP_BAD);
  assert_int_equal(st, 431);
  char many[4000] = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 70; i++) strcat(many, "X: y\r\n");
  strcat(many, "\r\n");
  assert_int_equal(head(many, &r, &st), HTTP_BAD);
  assert_int_equal(st, 431);
  assert_string_equal(kvbm__http_reason(404), "Not Found");
}

static int parse(const char *s, rj_request *q) {
  kvbm_error err;
  return kvbm__rj_parse_request(s, strlen(s), 8, q, &err);
}

static void test_json_ok(void **state) {
  (void)state;
  rj_request q;
  assert_int_equal(parse(" {\"token_ids\" : [0, 4294967295 ,7], \"request_id\":9,"
                         "\"other\": {\"a\": [true, false, null, -1.5e3, \"x\\\"\\u00e9\"]}} \n",
                         &q),
                   KVBM_OK);
  assert_true(q.has_tokens && q.has_request_id && !q.has_hashes);
  assert_int_equal(q.num_tokens, 3);
  assert_int_equal(q.tokens[1], 4294967295u);
  assert_int_equal(q.request_id, 9);
  kvbm__rj_request_free(&q);
  assert_int_equal(parse("{\"block_hashes\":[18446744073709551615,-1,-9223372036854775808,0]}", &q),
                   KVBM_OK);
  assert_int_equal(q.num_hashes, 4);
  assert_true(q.hashes[0] == UINT64_MAX && q.hashes[1] == UINT64_MAX);
  assert_true(q.hashes[2] == 0x8000000000000000ull && q.hashes[3] == 0);
  kvbm__rj_request_free(&q);
  /* 19 digits (the fast path's longest), then 20 (the general path's) */
  assert_int_equal(parse("{\"block_hashes\":[9999999999999999999,10000000000000000000,1]}", &q),
                   KVBM_OK);
  assert_true(q.hashes[0] == 9999999999999999999ull && q.hashes[1] == 10000000000000000000ull);
  assert_true(q.hashes[2] == 1);
  kvbm__rj_request_free(&q);
  assert_int_equal(parse("{\"token_ids\":[]}", &q), KVBM_OK);
  assert_true(q.has_tokens);
  assert_int_equal(q.num_tokens, 0);
  kvbm__rj_request_free(&q);
  assert_int_equal(parse("{}", &q), KVBM_OK);
  assert_false(q.has_tokens || q.has_hashes || q.has_request_id);
  assert_null(q.cache_salt);
  /* a tenant's namespace: strings decoded (escapes, UTF-8 from \\u, a
   * surrogate pair), null is absent */
  assert_int_equal(parse("{\"cache_salt\":\"a\\\"b\\\\c\\n\\u0041\\u00e9\\u20ac\\ud83d\\ude00/\\/\","
                         "\"lora_name\":null,\"token_ids\":[1]}", &q),
                   KVBM_OK);
  assert_string_equal(q.cache_salt, "a\"b\\c\nA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80//");
  assert_null(q.lora_name);
  kvbm__rj_request_free(&q);
  assert_int_equal(parse("{\"lora_name\":\"\"}", &q), KVBM_OK);
  assert_string_equal(q.lora_name, "");
  kvbm__rj_request_free(&q);
}

static void test_json_bad(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int rc;
  } cases[] = {
      {"", KVBM_EFORMAT},
      {"[]", KVBM_EFORMAT},
      {"{", KVBM_EFORMAT},
      {"{\"token_ids\":[1,2", KVBM_ETRUNCATED},
      {"{\"token_ids\":[1,]}", KVBM_EFORMAT},
      {"{\"token_ids\":[1.0]}", KVBM_EFORMAT},
      {"{\"token_ids\":[1e2]}", KVBM_EFORMAT},
      {"{\"token_ids\":[12E2]}", KVBM_EFORMAT},
      {"{\"token_ids\":[99.5]}", KVBM_EFORMAT},
      {"{\"token_ids\":[9999999999]}", KVBM_ERANGE},
      {"{\"block_hashes\":[99999999999999999999]}", KVBM_ERANGE},
      {"{\"token_ids\":[12x]}", KVBM_EFORMAT},
      {"{\"token_ids\":[-1]}", KVBM_ERANGE},
      {"{\"token_ids\":[4294967296]}", KVBM_ERANGE},
      {"{\"block_hashes\":[18446744073709551616]}", KVBM_ERANGE},
      {"{\"block_hashes\":[-9223372036854775809]}", KVBM_ERANGE},
      {"{\"token_ids\":[01]}", KVBM_EFORMAT},
      {"{\"token_ids\":[1,2,3,4,5,6,7,8,9]}", KVBM_ETOOLONG},
      {"{\"token_ids\":[1],\"token_ids\":[1]}", KVBM_EFORMAT},
      {"{\"request_id\":1,\"request_id\":2}", KVBM_EFORMAT},
      {"{\"request_id\":\"1\"}", KVBM_EFORMAT},
      {"{\"a\":tru}", KVBM_EFORMAT},
      {"{\"a\":\"\\x\"}", KVBM_EFORMAT},
      {"{\"a\":\"\\u12g4\"}", KVBM_EFORMAT},
      {"{\"a\":\"\t\"}", KVBM_EFORMAT},
      {"{\"a\" 1}", KVBM_EFORMAT},
      {"{a:1}", KVBM_EFORMAT},
      {"{\"a\":1 \"b\":2}", KVBM_EFORMAT},
      {"{} {}", KVBM_ETOOLONG},
      {"{\"a\":-}", KVBM_EFORMAT},
      {"{\"a\":1.}", KVBM_EFORMAT},
      {"{\"a\":1e}", KVBM_EFORMAT},
      {"{\"cache_salt\":1}", KVBM_EFORMAT},
      {"{\"cache_salt\":[\"a\"]}", KVBM_EFORMAT},
      {"{\"lora_name\":\"a\",\"lora_name\":\"b\"}", KVBM_EFORMAT},
      {"{\"cache_salt\":\"\\u0000\"}", KVBM_EFORMAT},
      {"{\"cache_salt\":\"\\ud800\"}", KVBM_EFORMAT},
      {"{\"cache_salt\":\"\\ude00x\"}", KVBM_EFORMAT},
      {"{\"cache_salt\":\"\\ud800\\u0041\"}", KVBM_EFORMAT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rj_request q;
    kvbm_error err = {0};
    int rc = kvbm__rj_parse_request(cases[i].s, strlen(cases[i].s), 8, &q, &err);
    if (rc != cases[i].rc) fail_msg("case %zu (%s): %d, expected %d (%s)", i, cases[i].s, rc,
                                    cases[i].rc, err.msg);
    assert_true(strlen(err.msg) > 0);
    assert_null(q.tokens);
    assert_null(q.hashes);
    assert_null(q.cache_salt);
    assert_null(q.lora_name);
  }
  /* a string over 4096 bytes */
  char *longs = malloc(4200);
  strcpy(longs, "{\"cache_salt\":\"");
  memset(longs + strlen(longs), 'x', 4097);
  strcpy(longs + 15 + 4097, "\"}");
  rj_request q0;
  assert_int_equal(parse(longs, &q0), KVBM_ETOOLONG);
  free(longs);
  /* nesting: 31 levels inside the top object are fine, 40 are not */
  char deep[200] = "{\"a\":";
  for (int i = 0; i < 40; i++) strcat(deep, "[");
  for (int i = 0; i < 40; i++) strcat(deep, "]");
  strcat(deep, "}");
  rj_request q;
  assert_int_equal(parse(deep, &q), KVBM_ETOOLONG);
  /* every truncation of a valid body is refused (each from its own heap
   * copy, so ASan would see a read past the end) */
  const char *ok = "{\"token_ids\":[1,22,333],\"x\":{\"y\":[\"z\\u0041\",null]},\"request_id\":5}";
  for (size_t n = 0; n < strlen(ok); n++) {
    char *c = malloc(n ? n : 1);
    memcpy(c, ok, n);
    kvbm_error err;
    assert_int_not_equal(kvbm__rj_parse_request(c, n, 8, &q, &err), KVBM_OK);
    free(c);
  }
}

static void test_json_writer(void **state) {
  (void)state;
  rj_buf b = {0};
  kvbm__rj_printf(&b, "{\"e\":");
  kvbm__rj_string(&b, "a\"b\\c\n\x01");
  kvbm__rj_printf(&b, ",\"n\":%d}", 5);
  for (int i = 0; i < 200; i++) kvbm__rj_printf(&b, "%s", "0123456789"); /* growth */
  assert_false(b.oom);
  assert_memory_equal(b.p, "{\"e\":\"a\\\"b\\\\c\\u000a\\u0001\",\"n\":5}", 33);
  assert_int_equal(b.len, 33 + 2000);
  kvbm__rj_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_http_ok),   cmocka_unit_test(test_http_bad),
      cmocka_unit_test(test_http_incremental),
      cmocka_unit_test(test_json_ok),   cmocka_unit_test(test_json_bad),
      cmocka_unit_test(test_json_writer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
