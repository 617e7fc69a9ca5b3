/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_threads.c: hashers on several threads at once, each on its own
 * path and input, give the single-threaded results: the module keeps no
 * shared mutable state (run under ThreadSanitizer, label tsan).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvbm/blake3.h"

#define NTHREADS 8
#define LEN (300 * 1024 + 17)

typedef struct job {
  const uint8_t *input;
  size_t len;
  kvbm_blake3_impl impl;
  uint8_t out[64];
  int rc;
} job;

static void *worker(void *arg) {
  job *j = arg;
  for (int round = 0; round < 20; round++) {
    kvbm_blake3_hasher h;
    kvbm_blake3_hasher_init(&h);
    j->rc |= kvbm_blake3_hasher_set_impl(&h, j->impl, NULL);
    j->rc |= kvbm_blake3_hasher_update(&h, j->input, j->len);
    j->rc |= kvbm_blake3_hasher_finalize(&h, j->out, sizeof j->out);
  }
  return NULL;
}

static void test_parallel_hashers(void **state) {
  (void)state;
  uint8_t *input = malloc(LEN);
  assert_non_null(input);
  for (size_t i = 0; i < LEN; i++) input[i] = (uint8_t)(i * 31 + (i >> 9));
  static const kvbm_blake3_impl impls[] = {
      KVBM_BLAKE3_IMPL_AUTO, KVBM_BLAKE3_IMPL_PORTABLE, KVBM_BLAKE3_IMPL_SSE41,
      KVBM_BLAKE3_IMPL_AVX2, KVBM_BLAKE3_IMPL_AVX512};
  job jobs[NTHREADS];
  pthread_t th[NTHREADS];
  for (int t = 0; t < NTHREADS; t++) {
    kvbm_blake3_impl impl = impls[t % 5];
    if (!kvbm_blake3_impl_available(impl)) impl = KVBM_BLAKE3_IMPL_PORTABLE;
    jobs[t] = (job){input + t, LEN - (size_t)t * 1000, impl, {0}, 0};
    assert_int_equal(pthread_create(&th[t], NULL, worker, &jobs[t]), 0);
  }
  for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < NTHREADS; t++) {
    uint8_t want[64];
    assert_int_equal(jobs[t].rc, 0);
    kvbm_blake3_hash(jobs[t].input, jobs[t].len, want, sizeof want);
    assert_memory_equal(jobs[t].out, want, sizeof want);
  }
  free(input);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parallel_hashers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
