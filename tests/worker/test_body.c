/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_body.c: the worker's strict body readers (src/worker/body.h) and
 * its held-block sets (src/worker/held.h).
 *
 * Bodies: both /generate forms read exactly; each hostile body is refused
 * with the status class the worker maps to its HTTP answer and a message
 * naming the key; every prefix of a valid body (a body cut anywhere) is
 * refused, never read past its end (the ASan build checks that); bounds on
 * items and tokens. Held sets: random stores and removes against a plain
 * model (the backward-shift deletion must keep every key findable), clear,
 * and the slot walk listing exactly the keys held.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/body.h"
#include "worker/held.h"

static int parse(const char *s, kvsim_gen_body *b, kvbm_error *err) {
  return kvsim_gen_body_parse(s, strlen(s), 64, 1000, b, err);
}

static void test_forms(void **state) {
  (void)state;
  kvsim_gen_body b;
  kvbm_error err = {0};
  assert_int_equal(parse(" {\"request_id\" : \"r-1.x\", \"token_ids\": [0, 7,4294967295]}\n", &b,
                         &err),
                   KVBM_OK);
  assert_string_equal(b.request_id, "r-1.x");
  assert_int_equal(b.num_tokens, 3);
  assert_int_equal(b.token_ids[2], 4294967295u);
  assert_null(b.hash_ids);
  assert_int_equal(b.output_length, 0);
  kvsim_gen_body_free(&b);
  assert_int_equal(parse("{\"request_id\":\"t\",\"hash_ids\":[5,6],\"input_length\":600,"
                         "\"output_length\":20}",
                         &b, &err),
                   KVBM_OK);
  assert_null(b.token_ids);
  assert_int_equal(b.num_hash_ids, 2);
  assert_int_equal(b.hash_ids[1], 6);
  assert_int_equal(b.input_length, 600);
  assert_int_equal(b.output_length, 20);
  kvsim_gen_body_free(&b);
  assert_int_equal(parse("{\"request_id\":\"o\",\"token_ids\":[1],\"output_length\":9}", &b, &err),
                   KVBM_OK);
  assert_int_equal(b.output_length, 9);
  kvsim_gen_body_free(&b);
}

static void test_hostile(void **state) {
  (void)state;
  static const struct {
    const char *body;
    int rc;
    const char *words;
  } cases[] = {
      {"", KVBM_EFORMAT, "object"},
      {"nul", KVBM_EFORMAT, "object"},
      {"{\"request_id\":\"x\",\"token_ids\":[1]}}", KVBM_EFORMAT, "after the object"},
      {"{\"request_id\":\"x\",\"tokens\":[1]}", KVBM_EFORMAT, "unknown key 'tokens'"},
      {"{\"request_id\":\"x\",\"request_id\":\"y\",\"token_ids\":[1]}", KVBM_EFORMAT, "twice"},
      {"{\"token_ids\":[1]}", KVBM_EFORMAT, "request_id"},
      {"{\"request_id\":7,\"token_ids\":[1]}", KVBM_EFORMAT, "request_id"},
      {"{\"request_id\":\"a\\u0041\",\"token_ids\":[1]}", KVBM_EFORMAT, "escapes"},
      {"{\"request_id\":\"x\",\"token_ids\":[-1]}", KVBM_EFORMAT, "token_ids"},
      {"{\"request_id\":\"x\",\"token_ids\":[1e3]}", KVBM_EFORMAT, "integer"},
      {"{\"request_id\":\"x\",\"token_ids\":[4294967296]}", KVBM_ERANGE, "above"},
      {"{\"request_id\":\"x\",\"token_ids\":[99999999999999999999999]}", KVBM_ERANGE, "above"},
      {"{\"request_id\":\"x\",\"token_ids\":[]}", KVBM_EFORMAT, "required"},
      {"{\"request_id\":\"x\",\"token_ids\":[1,]}", KVBM_EFORMAT, "token_ids"},
      {"{\"request_id\":\"x\",\"token_ids\":{}}", KVBM_EFORMAT, "array"},
      {"{\"request_id\":\"x\",\"hash_ids\":[1],\"input_length\":513,\"output_length\":0}",
       KVBM_ERANGE, "beyond 512"},
      {"{\"request_id\":\"x\",\"hash_ids\":[1],\"input_length\":0,\"output_length\":0}",
       KVBM_EFORMAT, "input_length is 0"},
      {"{\"request_id\":\"x\",\"hash_ids\":[1,2],\"input_length\":600}", KVBM_EFORMAT,
       "output_length"},
      {"{\"request_id\":\"x\",\"hash_ids\":[1,2],\"input_length\":900,\"output_length\":200}",
       KVBM_ETOOLONG, "at most 1000"},
      {"{\"request_id\":\"x\",\"token_ids\":[1],\"output_length\":1001}", KVBM_ERANGE, "above"},
      {"{\"request_id\":\"x\",\"token_ids\":[1],\"input_length\":1}", KVBM_EFORMAT, "not both"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kvsim_gen_body b;
    kvbm_error err = {0};
    int rc = parse(cases[i].body, &b, &err);
    if (rc != cases[i].rc || !strstr(err.msg, cases[i].words))
      fail_msg("case %zu (%s): rc %d, '%s'", i, cases[i].body, rc, err.msg);
    assert_null(b.token_ids);
    assert_null(b.hash_ids);
  }
  /* a request id of 129 bytes; an array of 65 items */
  char big[512];
  snprintf(big, sizeof big, "{\"request_id\":\"%0129d\",\"token_ids\":[1]}", 0);
  kvsim_gen_body b;
  kvbm_error err = {0};
  assert_int_equal(parse(big, &b, &err), KVBM_ERANGE);
  assert_non_null(strstr(err.msg, "request_id"));
  char arr[1024] = "{\"request_id\":\"x\",\"token_ids\":[1";
  for (int i = 0; i < 64; i++) strcat(arr, ",1");
  strcat(arr, "]}");
  assert_int_equal(parse(arr, &b, &err), KVBM_ETOOLONG);
  assert_non_null(strstr(err.msg, "more than 64"));
}

/* Every cut of a valid body is refused (the reader never looks past len:
 * each prefix is copied into a buffer of exactly its size). */
static void test_truncated(void **state) {
  (void)state;
  const char *full = "{\"request_id\":\"abc\",\"hash_ids\":[12,345],\"input_length\":700,"
                     "\"output_length\":3}";
  size_t n = strlen(full);
  for (size_t k = 0; k < n; k++) {
    char *p = malloc(k ? k : 1);
    memcpy(p, full, k);
    kvsim_gen_body b;
    kvbm_error err = {0};
    assert_int_not_equal(kvsim_gen_body_parse(p, k, 64, 1000, &b, &err), KVBM_OK);
    free(p);
  }
}

static void test_fault(void **state) {
  (void)state;
  kvsim_fault_body f;
  kvbm_error err = {0};
  const char *ok = "{\"publish\":false,\"g3_delay_ms\":250,\"g3_full\":true}";
  assert_int_equal(kvsim_fault_body_parse(ok, strlen(ok), &f, &err), KVBM_OK);
  assert_true(f.has_publish && !f.publish && f.has_g3_full && f.g3_full && f.has_g3_delay);
  assert_int_equal(f.g3_delay_ms, 250);
  const char *only = "{\"g3_full\":false}";
  assert_int_equal(kvsim_fault_body_parse(only, strlen(only), &f, &err), KVBM_OK);
  assert_true(!f.has_publish && !f.has_g3_delay && f.has_g3_full && !f.g3_full);
  const char *bad[] = {"{}", "{\"publish\":\"yes\"}", "{\"g3_delay_ms\":600001}",
                       "{\"g3_delay_ms\":-5}", "{\"x\":1}", "{\"publish\":tru}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_not_equal(kvsim_fault_body_parse(bad[i], strlen(bad[i]), &f, &err), KVBM_OK);
}

/* The held set against a plain model under random stores and removes. */
static void test_held(void **state) {
  (void)state;
  enum { MAX = 300, KEYS = 700 };
  kvsim_held h;
  assert_true(kvsim_held_init(&h, MAX));
  static uint8_t in[KEYS];
  static uint64_t par[KEYS];
  memset(in, 0, sizeof in);
  size_t n = 0;
  uint64_t x = 88172645463325252ull;
  for (int step = 0; step < 200000; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t k = (size_t)(x % KEYS);
    /* keys that collide in the low bits and high bits alike */
    uint64_t key = (uint64_t)k << (k % 3 ? 40 : 0) | (k & 7);
    if (x >> 60 < 9 && (in[k] || n < MAX)) {
      uint64_t p = x >> 8;
      assert_true(kvsim_held_add(&h, key, (x & 1) ? &p : NULL));
      if (!in[k]) n++;
      in[k] = (x & 1) ? 2 : 1;
      par[k] = p;
    } else {
      kvsim_held_remove(&h, key);
      if (in[k]) n--;
      in[k] = 0;
    }
    if (step % 997 == 0) {
      assert_int_equal(h.n, n);
      for (size_t j = 0; j < KEYS; j++) {
        uint64_t kj = (uint64_t)j << (j % 3 ? 40 : 0) | (j & 7);
        assert_int_equal(kvsim_held_has(&h, kj), in[j] != 0);
      }
    }
  }
  /* the slot walk lists exactly the keys held, with their parents */
  size_t listed = 0;
  for (size_t i = 0; i < h.cap; i++) {
    uint64_t key, p;
    bool hp;
    if (!kvsim_held_slot(&h, i, &key, &p, &hp)) continue;
    listed++;
    size_t j = (size_t)((key >> 40) ? key >> 40 : key); /* shifted keys, or k itself */
    assert_true(j < KEYS && in[j]);
    assert_int_equal(hp, in[j] == 2);
    if (hp) assert_int_equal(p, par[j]);
  }
  assert_int_equal(listed, n);
  kvsim_held_clear(&h);
  assert_int_equal(h.n, 0);
  for (size_t j = 0; j < KEYS; j++) assert_false(kvsim_held_has(&h, (uint64_t)j));
  kvsim_held_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms),     cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_truncated), cmocka_unit_test(test_fault),
      cmocka_unit_test(test_held),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
