/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_trace.c: the trace reader and the tokens a trace stands for.
 *
 * Good input parses to exactly its fields; each kind of bad input is an
 * error that names the line; and thousands of random mutations of good
 * lines never crash, hang or yield a record that breaks the format's rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "workload/trace.h"

static kvsim_trace *parse_ok(const char *text, size_t limit) {
  kvsim_trace *t = NULL;
  kvbm_error err = {0};
  int rc = kvsim_trace_parse(text, strlen(text), limit, &t, &err);
  if (rc) fail_msg("parse failed: %s", err.msg);
  return t;
}

static void parses_fields_and_skips_unknown(void **state) {
  (void)state;
  const char *text =
      "{\"timestamp\": 27, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [3, 9]}\r\n"
      "\n"
      "  {\"hash_ids\":[],\"output_length\":0,\"x\":{\"y\":[true,false,null,\"s\\\"t\",-1.5e3]},"
      "\"input_length\":0,\"timestamp\":1.25}\n"
      "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 65535, \"hash_ids\": [4194303]}";
  kvsim_trace *t = parse_ok(text, 0);
  assert_int_equal(kvsim_trace_count(t), 3);
  const kvsim_trace_request *r = kvsim_trace_get(t, 0);
  assert_true(r->timestamp_ms == 27.0);
  assert_int_equal(r->input_length, 1000);
  assert_int_equal(r->output_length, 5);
  assert_int_equal(r->num_hash_ids, 2);
  assert_int_equal(r->hash_ids[0], 3);
  assert_int_equal(r->hash_ids[1], 9);
  r = kvsim_trace_get(t, 1);
  assert_true(r->timestamp_ms == 1.25);
  assert_int_equal(r->num_hash_ids, 0);
  r = kvsim_trace_get(t, 2);
  assert_int_equal(r->hash_ids[0], KVSIM_TRACE_MAX_HASH_ID);
  assert_null(kvsim_trace_get(t, 3));

  size_t mi, mo;
  kvsim_trace_max_lengths(t, 99, &mi, &mo);
  assert_int_equal(mi, 1000);
  assert_int_equal(mo, 65535);
  kvsim_trace_max_lengths(t, 2, &mi, &mo);
  assert_int_equal(mi, 1000);
  assert_int_equal(mo, 5);
  kvsim_trace_max_lengths(t, 0, &mi, &mo);
  assert_int_equal(mi, 1);
  assert_int_equal(mo, 1);

  /* Tokens, as WORKLOADS.md defines them. */
  uint32_t tok[1000], out[5];
  kvsim_trace_prompt_tokens(kvsim_trace_get(t, 0), tok);
  for (uint32_t i = 0; i < 1000; i++)
    assert_int_equal(tok[i], (i < 512 ? 3u : 9u) * 512u + i % 512u);
  kvsim_trace_output_tokens(kvsim_trace_get(t, 0), 7, out);
  for (uint32_t m = 0; m < 5; m++) assert_int_equal(out[m], 0x80000000u | 7u << 16 | m);
  kvsim_trace_destroy(t);

  t = parse_ok(text, 2);
  assert_int_equal(kvsim_trace_count(t), 2);
  kvsim_trace_destroy(t);
  t = parse_ok("", 0);
  assert_int_equal(kvsim_trace_count(t), 0);
  kvsim_trace_destroy(t);
}

static void bad_input_names_the_line(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int code;
    const char *msg;
  } cases[] = {
      {"[1,2]", KVBM_EFORMAT, "line 1: not a JSON object"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":1}", KVBM_EFORMAT, "line 1: missing field 'hash_ids'"},
      {"\n{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]} x", KVBM_EFORMAT, "line 2: trailing characters"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1,]}", KVBM_EFORMAT, "line 1: hash_ids: expected a number"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[4194304]}", KVBM_ERANGE, "line 1: hash_ids: 4194304 is larger"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":65536,\"hash_ids\":[1]}", KVBM_ERANGE, "line 1: output_length: 65536 is larger"},
      {"{\"timestamp\":-1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}", KVBM_ERANGE, "line 1: timestamp: -1 is negative"},
      {"{\"timestamp\":0,\"input_length\":1e400,\"output_length\":1,\"hash_ids\":[1]}", KVBM_EFORMAT, "line 1: input_length: '1e400' is not a number"},
      {"{\"timestamp\":0,\"input_length\":\"5\",\"output_length\":1,\"hash_ids\":[1]}", KVBM_EFORMAT, "line 1: input_length: expected a number"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1],\"z\":\"abc}", KVBM_EFORMAT, "line 1: unterminated string"},
      {"{\"timestamp\":0 \"input_length\":1}", KVBM_EFORMAT, "line 1: expected ',' or '}'"},
      {"{\"timestamp\":0,\"input_length\":1025,\"output_length\":1,\"hash_ids\":[1,2]}", KVBM_ERANGE, "line 1: input_length 1025 is beyond 512 * 2 hash_ids"},
      {"{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1],\"t\":tru}", KVBM_EFORMAT, "line 1: value: expected a number"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kvsim_trace *t = (kvsim_trace *)0x1;
    kvbm_error err = {0};
    int rc = kvsim_trace_parse(cases[i].text, strlen(cases[i].text), 0, &t, &err);
    if (rc != cases[i].code || err.code != rc || !strstr(err.msg, cases[i].msg))
      fail_msg("case %zu: rc %d msg '%s', wanted %d '%s'", i, rc, err.msg, cases[i].code, cases[i].msg);
    assert_ptr_equal(t, (kvsim_trace *)0x1);
  }
  /* Nesting beyond the limit, and a NUL byte inside a line. */
  char deep[400];
  size_t n = (size_t)sprintf(deep, "{\"a\":");
  for (int i = 0; i < 100; i++) deep[n++] = '[';
  deep[n] = 0;
  kvsim_trace *t;
  kvbm_error err;
  assert_int_equal(kvsim_trace_parse(deep, n, 0, &t, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "nested too deeply"));
  const char nul[] = "{\"timestamp\":0\0}";
  assert_int_equal(kvsim_trace_parse(nul, sizeof nul - 1, 0, &t, &err), KVBM_EFORMAT);
  assert_non_null(strstr(err.msg, "NUL"));
  assert_int_equal(kvsim_trace_parse(NULL, 5, 0, &t, &err), KVBM_EINVAL);
  assert_int_equal(kvsim_trace_load("/nonexistent/trace", 0, &t, &err), KVBM_EIO);
  assert_non_null(strstr(err.msg, "/nonexistent/trace"));
}

/* Random byte edits of good lines: every result is either a parse error
 * with a line number or records that obey the format's rules. */
static void mutations_never_break_the_rules(void **state) {
  (void)state;
  const char *good =
      "{\"timestamp\": 12, \"input_length\": 700, \"output_length\": 30, \"hash_ids\": [5, 6]}\n"
      "{\"timestamp\": 13, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [5], \"k\": [1, {\"a\": \"b\"}]}\n";
  size_t len = strlen(good);
  char buf[512];
  uint64_t x = 88172645463325252ull;
  int ok = 0, bad = 0;
  for (int iter = 0; iter < 20000; iter++) {
    memcpy(buf, good, len);
    size_t n = len;
    int edits = 1 + iter % 4;
    for (int e = 0; e < edits && n > 1; e++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      size_t pos = (size_t)(x % n);
      switch ((x >> 32) % 3) {
        case 0: buf[pos] = (char)(x >> 40); break;                          /* replace */
        case 1: memmove(buf + pos, buf + pos + 1, n - pos - 1); n--; break; /* delete */
        default:                                                             /* truncate */
          n = pos + 1;
      }
    }
    kvsim_trace *t;
    kvbm_error err = {0};
    int rc = kvsim_trace_parse(buf, n, 0, &t, &err);
    if (rc) {
      bad++;
      assert_non_null(strstr(err.msg, "line "));
      continue;
    }
    ok++;
    for (size_t i = 0; i < kvsim_trace_count(t); i++) {
      const kvsim_trace_request *r = kvsim_trace_get(t, i);
      assert_true(r->input_length <= 512u * r->num_hash_ids);
      for (uint32_t k = 0; k < r->num_hash_ids; k++)
        assert_true(r->hash_ids[k] <= KVSIM_TRACE_MAX_HASH_ID);
      assert_true(r->timestamp_ms >= 0);
    }
    kvsim_trace_destroy(t);
  }
  assert_true(ok > 0 && bad > 0);
}


/* A request fits when its prompt and output need at most the pool's
 * blocks; the first one that does not is named; a line above the limit is
 * refused. */
static void fit_and_line_limit(void **state) {
  (void)state;
  kvsim_trace *t = parse_ok(
      "{\"timestamp\": 0, \"input_length\": 60, \"output_length\": 4, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 0, \"input_length\": 61, \"output_length\": 4, \"hash_ids\": [1]}\n",
      0);
  kvbm_error err = {0};
  assert_int_equal(kvsim_trace_check_fit(t, 1, 16, 4, &err), KVBM_OK);   /* 64 tokens, 4 blocks */
  assert_int_equal(kvsim_trace_check_fit(t, 2, 16, 4, &err), KVBM_ENOSPC); /* 65 tokens, 5 blocks */
  assert_non_null(strstr(err.msg, "request 1 (61 prompt + 4 output tokens, 5 blocks)"));
  assert_int_equal(kvsim_trace_check_fit(t, 99, 16, 5, &err), KVBM_OK);
  assert_int_equal(kvsim_trace_check_fit(t, 2, 0, 5, &err), KVBM_EINVAL);
  kvsim_trace_destroy(t);
  size_t n = KVSIM_TRACE_MAX_LINE + 1;
  char *big = malloc(n);
  assert_non_null(big);
  memset(big, ' ', n);
  assert_int_equal(kvsim_trace_parse(big, n, 0, &t, &err), KVBM_ETOOLONG);
  assert_non_null(strstr(err.msg, "line 1: longer than"));
  assert_int_equal(kvsim_trace_parse(big, n - 1, 0, &t, &err), KVBM_OK); /* blank, at the limit */
  assert_int_equal(kvsim_trace_count(t), 0);
  kvsim_trace_destroy(t);
  free(big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(parses_fields_and_skips_unknown),
      cmocka_unit_test(bad_input_names_the_line),
      cmocka_unit_test(mutations_never_break_the_rules),
      cmocka_unit_test(fit_and_line_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
