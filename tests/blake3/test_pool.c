/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool.c: hashing one input in pieces on several threads.
 *
 * The pieces' chaining values and the tree rebuilt above them give the
 * plain hash bit for bit, for every piece size and input length tried
 * (around every piece and power-of-two boundary, and uneven last pieces);
 * the pool does the same with 0, 1 and 3 workers, for jobs submitted from
 * several threads at once, with submit-then-wait overlap; a job with
 * copy_to lands its bytes whole (not a byte past) and hashes them, and one
 * whose destination overlaps its input is refused; bad arguments
 * and stale tickets are refused; a pool destroyed with submissions never
 * waited for frees them. Runs under ThreadSanitizer (label tsan).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blake3/blake3_impl.h"
#include "kvbm/blake3.h"

static uint8_t *input(size_t n, uint32_t seed) {
  uint8_t *b = malloc(n ? n : 1);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    b[i] = (uint8_t)(seed >> 24);
  }
  return b;
}

/* Every piece's value, then the root, against the one-hasher hash. */
static void check_pieces(const uint8_t *in, size_t len, size_t piece, size_t out_len) {
  size_t n = (len + piece - 1) / piece;
  uint8_t(*cvs)[32] = malloc(n * 32);
  assert_non_null(cvs);
  for (size_t i = 0; i < n; i++) assert_int_equal(kvbm__b3_piece_cv(in, len, piece, i, cvs[i]), KVBM_OK);
  uint8_t got[64], want[64];
  assert_int_equal(kvbm__b3_root_from_pieces((const uint8_t(*)[32])cvs, len, piece, got, out_len), KVBM_OK);
  kvbm_blake3_hash(in, len, want, out_len);
  if (memcmp(got, want, out_len) != 0) fail_msg("len %zu piece %zu out %zu: hashes differ", len, piece, out_len);
  free(cvs);
}

static void test_pieces_give_the_plain_hash(void **state) {
  (void)state;
  const size_t max = (4u << 20) + 3 * 1024 + 5;
  uint8_t *in = input(max, 7);
  static const size_t pieces[] = {1024, 2048, 4096, 65536, 256 * 1024, 1 << 20};
  for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
    size_t p = pieces[k];
    /* around 1, 2, 3, 4, 5, 8 pieces, and a few odd lengths */
    static const size_t mult[] = {1, 2, 3, 4, 5, 7, 8, 9};
    for (size_t m = 0; m < sizeof mult / sizeof mult[0]; m++) {
      for (long d = -1025; d <= 1025; d += 1025) {
        long len = (long)(mult[m] * p) + d;
        if (len <= (long)p || (size_t)len > max) continue;
        check_pieces(in, (size_t)len, p, 32);
      }
      for (long d = -1; d <= 1; d++) {
        long len = (long)(mult[m] * p) + d;
        if (len <= (long)p || (size_t)len > max) continue;
        check_pieces(in, (size_t)len, p, 32);
      }
    }
  }
  /* extended output, and the shortest outputs frames use */
  check_pieces(in, 5 * 4096 + 77, 4096, 64);
  check_pieces(in, 5 * 4096 + 77, 4096, 16);
  check_pieces(in, max, 256 * 1024, 64);
  /* the W4 block: 2 MiB in 8 pieces */
  check_pieces(in, 2u << 20, 256 * 1024, 16);
  free(in);
}

static void test_piece_arguments(void **state) {
  (void)state;
  uint8_t in[4096] = {0}, cv[32], cvs[4][32] = {{0}};
  assert_int_equal(kvbm__b3_piece_cv(in, 4096, 1000, 0, cv), KVBM_EINVAL);     /* not a power of two */
  assert_int_equal(kvbm__b3_piece_cv(in, 4096, 512, 0, cv), KVBM_EINVAL);      /* below a chunk */
  assert_int_equal(kvbm__b3_piece_cv(in, 1024, 1024, 0, cv), KVBM_EINVAL);     /* one piece: a plain hash */
  assert_int_equal(kvbm__b3_piece_cv(in, 4096, 1024, 4, cv), KVBM_EINVAL);     /* past the end */
  assert_int_equal(kvbm__b3_root_from_pieces((const uint8_t(*)[32])cvs, 1024, 1024, cv, 32), KVBM_EINVAL);
}

typedef struct sized {
  uint8_t *in;
  size_t len;
  uint8_t want[32], got[32];
} sized;

/* Jobs of many sizes: empty, below, at and above a piece, several MiB. */
static sized *make_jobs(size_t *n, uint32_t seed) {
  static const size_t lens[] = {0,         1,          1023,       1024,      1025,      4096,     65535,
                                65536,     65537,      200000,     262144,    262145,    1 << 20,  (2 << 20) + 1,
                                3 << 20,   (3 << 20) + 999};
  *n = sizeof lens / sizeof lens[0];
  sized *j = calloc(*n, sizeof *j);
  assert_non_null(j);
  for (size_t i = 0; i < *n; i++) {
    j[i].len = lens[i];
    j[i].in = input(lens[i], seed + (uint32_t)i);
    kvbm_blake3_hash(j[i].in, j[i].len, j[i].want, 32);
  }
  return j;
}

static void free_jobs(sized *j, size_t n) {
  for (size_t i = 0; i < n; i++) free(j[i].in);
  free(j);
}

static void run_pool(unsigned threads, size_t piece) {
  kvbm_blake3_pool *p;
  kvbm_error e;
  assert_int_equal(kvbm_blake3_pool_create(threads, piece, &p, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_threads(p), threads);
  size_t n;
  sized *j = make_jobs(&n, threads * 100 + 1);
  kvbm_blake3_job *jobs = calloc(n, sizeof *jobs);
  assert_non_null(jobs);
  for (size_t i = 0; i < n; i++) jobs[i] = (kvbm_blake3_job){j[i].in, j[i].len, j[i].got, 32};
  /* two submissions outstanding at once, waited for out of order */
  uint64_t t1, t2;
  assert_int_equal(kvbm_blake3_pool_submit(p, jobs, n / 2, &t1, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_submit(p, jobs + n / 2, n - n / 2, &t2, &e), KVBM_OK);
  assert_true(t1 != t2);
  assert_int_equal(kvbm_blake3_pool_wait(p, t2, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_wait(p, t1, &e), KVBM_OK);
  for (size_t i = 0; i < n; i++)
    if (memcmp(j[i].got, j[i].want, 32) != 0) fail_msg("threads %u: job of %zu bytes differs", threads, j[i].len);
  /* a ticket is waited for once */
  assert_int_equal(kvbm_blake3_pool_wait(p, t1, &e), KVBM_ENOTFOUND);
  assert_non_null(strstr(e.msg, "not outstanding"));
  assert_int_equal(kvbm_blake3_pool_wait(p, 999999, &e), KVBM_ENOTFOUND);
  /* one input */
  uint8_t out[16];
  assert_int_equal(kvbm_blake3_pool_hash(p, j[n - 1].in, j[n - 1].len, out, 16, &e), KVBM_OK);
  assert_memory_equal(out, j[n - 1].want, 16);
  free(jobs);
  free_jobs(j, n);
  kvbm_blake3_pool_destroy(p);
}

static void test_pool_matches_plain_hash(void **state) {
  (void)state;
  run_pool(0, 0);
  run_pool(1, 0);
  run_pool(3, 0);
  run_pool(2, 4096);
}

/* copy_to: every job's bytes land at their destination, whole, and the
 * hash is the plain hash of them, for every size and piece count. */
static void copy_pool(unsigned threads, size_t piece) {
  kvbm_blake3_pool *p;
  kvbm_error e;
  assert_int_equal(kvbm_blake3_pool_create(threads, piece, &p, &e), KVBM_OK);
  size_t n;
  sized *j = make_jobs(&n, threads * 100 + 7);
  kvbm_blake3_job *jobs = calloc(n, sizeof *jobs);
  uint8_t **dst = calloc(n, sizeof *dst);
  assert_non_null(jobs);
  assert_non_null(dst);
  for (size_t i = 0; i < n; i++) {
    dst[i] = malloc(j[i].len + 1);
    assert_non_null(dst[i]);
    memset(dst[i], 0xA5, j[i].len + 1);
    jobs[i] = (kvbm_blake3_job){j[i].in, j[i].len, j[i].got, 32};
  }
  uint64_t t;
  assert_int_equal(kvbm_blake3_pool_submit_copy(p, jobs, (void *const *)dst, n, &t, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_wait(p, t, &e), KVBM_OK);
  for (size_t i = 0; i < n; i++) {
    if (memcmp(j[i].got, j[i].want, 32) != 0) fail_msg("threads %u: copied job of %zu bytes: hash differs", threads,
                                                       j[i].len);
    if (j[i].len && memcmp(dst[i], j[i].in, j[i].len) != 0)
      fail_msg("threads %u: job of %zu bytes did not land whole", threads, j[i].len);
    assert_int_equal(dst[i][j[i].len], 0xA5); /* and not one byte past its end */
    free(dst[i]);
  }
  free(dst);
  free(jobs);
  free_jobs(j, n);
  kvbm_blake3_pool_destroy(p);
}

static void test_pool_copies_then_hashes(void **state) {
  (void)state;
  copy_pool(0, 0);
  copy_pool(1, 0);
  copy_pool(3, 0);
  copy_pool(2, 4096);
  /* a destination overlapping its input is refused, before anything moves */
  kvbm_blake3_pool *p;
  kvbm_error e;
  assert_int_equal(kvbm_blake3_pool_create(1, 0, &p, &e), KVBM_OK);
  uint8_t buf[8192] = {0}, out[32];
  uint64_t t;
  kvbm_blake3_job over[] = {{buf, 4096, out, 32}, {buf + 100, 4096, out, 32}, {buf, 4096, out, 32}};
  void *to[] = {buf + 4095, buf, buf};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kvbm_blake3_pool_submit_copy(p, &over[i], &to[i], 1, &t, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "overlaps"));
  }
  void *null_to = NULL;
  assert_int_equal(kvbm_blake3_pool_submit_copy(p, &over[0], &null_to, 1, &t, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_submit_copy(p, &over[0], NULL, 1, &t, &e), KVBM_EINVAL);
  void *edge_to = buf + 4096; /* adjacent is fine */
  assert_int_equal(kvbm_blake3_pool_submit_copy(p, &over[0], &edge_to, 1, &t, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_wait(p, t, &e), KVBM_OK);
  kvbm_blake3_pool_destroy(p);
}

typedef struct submitter {
  kvbm_blake3_pool *p;
  int bad;
  uint32_t seed;
} submitter;

/* Submits, overlaps with its own hashing of something else, waits. */
static void *submit_thread(void *arg) {
  submitter *s = arg;
  size_t n;
  sized *j = make_jobs(&n, s->seed);
  kvbm_blake3_job *jobs = calloc(n, sizeof *jobs);
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < n; i++) {
      memset(j[i].got, 0, 32);
      jobs[i] = (kvbm_blake3_job){j[i].in, j[i].len, j[i].got, 32};
    }
    uint64_t t;
    if (kvbm_blake3_pool_submit(s->p, jobs, n, &t, NULL) != KVBM_OK) s->bad++;
    uint8_t other[32];
    kvbm_blake3_hash(j[n - 1].in, j[n - 1].len, other, 32); /* work of its own meanwhile */
    if (kvbm_blake3_pool_wait(s->p, t, NULL) != KVBM_OK) s->bad++;
    for (size_t i = 0; i < n; i++) s->bad += memcmp(j[i].got, j[i].want, 32) != 0;
  }
  free(jobs);
  free_jobs(j, n);
  return NULL;
}

static void test_pool_from_several_threads(void **state) {
  (void)state;
  kvbm_blake3_pool *p;
  assert_int_equal(kvbm_blake3_pool_create(2, 64 * 1024, &p, NULL), KVBM_OK);
  pthread_t th[3];
  submitter s[3];
  for (int i = 0; i < 3; i++) {
    s[i] = (submitter){p, 0, 1000u * (uint32_t)i};
    assert_int_equal(pthread_create(&th[i], NULL, submit_thread, &s[i]), 0);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(s[i].bad, 0);
  }
  kvbm_blake3_pool_destroy(p);
}

static void test_pool_arguments_and_teardown(void **state) {
  (void)state;
  kvbm_blake3_pool *p;
  kvbm_error e;
  assert_int_equal(kvbm_blake3_pool_create(1, 1000, &p, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "power of two"));
  assert_int_equal(kvbm_blake3_pool_create(1, 512, &p, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_create(KVBM_BLAKE3_POOL_MAX_THREADS + 1, 0, &p, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_create(1, 0, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_create(2, 0, &p, &e), KVBM_OK);
  assert_int_equal(kvbm_blake3_pool_piece_len(p), KVBM_BLAKE3_POOL_PIECE_DEFAULT);
  uint8_t in[8] = {0}, out[64];
  kvbm_blake3_job bad[] = {{in, 8, out, 0}, {in, 8, out, 65}, {NULL, 8, out, 32}, {in, 8, NULL, 32}};
  uint64_t t;
  for (int i = 0; i < 4; i++) assert_int_equal(kvbm_blake3_pool_submit(p, &bad[i], 1, &t, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_submit(p, bad, 0, &t, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_blake3_pool_wait(NULL, 1, &e), KVBM_EINVAL);
  /* submissions never waited for are freed by destroy (ASan watches) */
  uint8_t *big = input(3 << 20, 5);
  kvbm_blake3_job j = {big, 3 << 20, out, 32};
  for (int i = 0; i < 4; i++) assert_int_equal(kvbm_blake3_pool_submit(p, &j, 1, &t, &e), KVBM_OK);
  kvbm_blake3_pool_destroy(p);
  free(big);
  kvbm_blake3_pool_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pieces_give_the_plain_hash),
      cmocka_unit_test(test_piece_arguments),
      cmocka_unit_test(test_pool_matches_plain_hash),
      cmocka_unit_test(test_pool_copies_then_hashes),
      cmocka_unit_test(test_pool_from_several_threads),
      cmocka_unit_test(test_pool_arguments_and_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
