/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_hash.c: block hash chains.
 *
 * The Dynamo-compatible scheme is checked against python3-xxhash computing
 * Dynamo's formula independently; the native scheme against its definition
 * and for the properties prefix matching relies on. Both schemes are also
 * checked against python3-xxhash at block sizes whose byte lengths fall in
 * each of XXH3's length ranges (0..16, 17..128, 129..240, longer) and on
 * their edges: kvbm calls XXH3's 17..128-byte kernel directly
 * (hash/hash_inline.h), and a block of another length goes through the
 * public call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/hash.h"

#define NTOK 100
#define BS 16

static void make_tokens(uint32_t *t, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t[i] = x;
  }
}

/* Runs python3-xxhash on Dynamo's formula; returns the number of hashes. */
static size_t python_dynamo_chain(const uint32_t *t, size_t n, const char *salt,
                                  uint64_t *out, size_t max) {
  char path[] = "/tmp/kvbm_hash_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  for (size_t i = 0; i < n; i++) fprintf(f, "%u\n", t[i]);
  fclose(f);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c '\n"
           "import struct, sys, xxhash\n"
           "toks = [int(l) for l in open(\"%s\")]\n"
           "salt = sys.argv[1].encode()\n"
           "sh = xxhash.xxh3_64_intdigest(salt, seed=1337) if salt else 0\n"
           "parent = None\n"
           "for k in range(len(toks) // %d):\n"
           "    b = xxhash.xxh3_64_intdigest(struct.pack(\"<%dI\", *toks[k*%d:(k+1)*%d]), seed=sh)\n"
           "    s = b if parent is None else xxhash.xxh3_64_intdigest(struct.pack(\"<QQ\", parent, b), seed=1337)\n"
           "    print(s)\n"
           "    parent = s\n"
           "' '%s'",
           path, BS, BS, BS, BS, salt);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t k = 0;
  unsigned long long v;
  while (k < max && fscanf(p, "%llu", &v) == 1) out[k++] = v;
  assert_int_equal(pclose(p), 0);
  unlink(path);
  return k;
}

static void dynamo_scheme_matches_python_xxhash(void **state) {
  (void)state;
  const char *salts[] = {"", "lora-7", "cache salt \xce\xbb"};
  for (size_t s = 0; s < 3; s++) {
    uint32_t t[NTOK];
    make_tokens(t, NTOK, (uint32_t)s + 1);
    uint64_t want[NTOK / BS], got[NTOK / BS];
    size_t nw = python_dynamo_chain(t, NTOK, salts[s], want, NTOK / BS);
    assert_int_equal(nw, NTOK / BS);
    uint64_t salt_hash = kvbm_hash_salt(salts[s], strlen(salts[s]));
    size_t ng = kvbm_hash_chain(KVBM_HASH_DYNAMO, salt_hash, t, NTOK, BS, got, NTOK / BS);
    assert_int_equal(ng, nw);
    for (size_t k = 0; k < ng; k++) assert_true(got[k] == want[k]);
  }
}

/* Either scheme's chain of blocks of `bs` tokens by python3-xxhash (its
 * own XXH3, not kvbm's); returns the number of hashes. */
static size_t python_chain(const uint32_t *t, size_t n, size_t bs, kvbm_hash_scheme scheme, uint64_t *out,
                           size_t max) {
  char path[] = "/tmp/kvbm_hash_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  for (size_t i = 0; i < n; i++) fprintf(f, "%u\n", t[i]);
  fclose(f);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c '\n"
           "import struct, xxhash\n"
           "toks = [int(l) for l in open(\"%s\")]\n"
           "bs, dynamo, parent = %zu, %d, None\n"
           "for k in range(len(toks) // bs):\n"
           "    data = struct.pack(\"<%%dI\" %% bs, *toks[k*bs:(k+1)*bs])\n"
           "    if dynamo:\n"
           "        b = xxhash.xxh3_64_intdigest(data, seed=0)\n"
           "        s = b if parent is None else xxhash.xxh3_64_intdigest(struct.pack(\"<QQ\", parent, b), seed=1337)\n"
           "    else:\n"
           "        s = xxhash.xxh3_64_intdigest(data, seed=0 if parent is None else parent)\n"
           "    print(s)\n"
           "    parent = s\n"
           "'",
           path, bs, scheme == KVBM_HASH_DYNAMO);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t k = 0;
  unsigned long long v;
  while (k < max && fscanf(p, "%llu", &v) == 1) out[k++] = v;
  assert_int_equal(pclose(p), 0);
  unlink(path);
  return k;
}

/* Block sizes (tokens) whose byte lengths (4 a token) fall in each of
 * XXH3's ranges and on their edges: 4, 12, 16 | 20, 32, 64, 124, 128 |
 * 132, 200, 240 | 244, 400. */
static const size_t XXH3_RANGE_BS[] = {1, 3, 4, 5, 8, 16, 31, 32, 33, 50, 60, 61, 100};

static void chains_match_python_xxhash_at_every_length_range(void **state) {
  (void)state;
  enum { N = 400 };
  uint32_t t[N];
  make_tokens(t, N, 11);
  for (int scheme = 0; scheme < 2; scheme++) {
    for (size_t i = 0; i < sizeof XXH3_RANGE_BS / sizeof *XXH3_RANGE_BS; i++) {
      const size_t bs = XXH3_RANGE_BS[i];
      uint64_t want[N], got[N];
      const size_t nw = python_chain(t, N, bs, (kvbm_hash_scheme)scheme, want, N);
      assert_int_equal(nw, N / bs);
      assert_int_equal(kvbm_hash_chain((kvbm_hash_scheme)scheme, 0, t, N, bs, got, N), nw);
      for (size_t k = 0; k < nw; k++) {
        if (got[k] != want[k]) fail_msg("scheme %d, block size %zu, block %zu: %llx, python %llx", scheme, bs, k,
                                        (unsigned long long)got[k], (unsigned long long)want[k]);
        const uint64_t next = kvbm_hash_next((kvbm_hash_scheme)scheme, 0, k ? want[k - 1] : 0, k > 0, t + k * bs, bs);
        assert_true(next == want[k]);
      }
    }
  }
}

static void chain_is_a_prefix_function(void **state) {
  (void)state;
  for (int scheme = 0; scheme < 2; scheme++) {
    uint32_t a[NTOK], b[NTOK];
    make_tokens(a, NTOK, 9);
    memcpy(b, a, sizeof a);
    b[40] ^= 1; /* differs in block 2 */
    uint64_t ha[6], hb[6];
    assert_int_equal(kvbm_hash_chain(scheme, 0, a, NTOK, BS, ha, 6), 6);
    assert_int_equal(kvbm_hash_chain(scheme, 0, b, NTOK, BS, hb, 6), 6);
    assert_true(ha[0] == hb[0] && ha[1] == hb[1]);
    for (int k = 2; k < 6; k++) assert_true(ha[k] != hb[k]); /* chained: all later differ */
    /* a salt changes every block */
    uint64_t hs[6];
    kvbm_hash_chain(scheme, kvbm_hash_salt("x", 1), a, NTOK, BS, hs, 6);
    for (int k = 0; k < 6; k++) assert_true(hs[k] != ha[k]);
    /* equal blocks at different positions hash differently */
    uint32_t rep[4 * BS];
    for (int i = 0; i < 4 * BS; i++) rep[i] = (uint32_t)(i % BS);
    uint64_t hr[4];
    kvbm_hash_chain(scheme, 0, rep, 4 * BS, BS, hr, 4);
    assert_true(hr[0] != hr[1] && hr[1] != hr[2] && hr[2] != hr[3]);
    /* next() agrees with chain() */
    uint64_t p = 0;
    for (int k = 0; k < 6; k++) {
      p = kvbm_hash_next(scheme, 0, p, k > 0, a + k * BS, BS);
      assert_true(p == ha[k]);
    }
  }
}

static void chain_limits(void **state) {
  (void)state;
  uint32_t t[NTOK];
  uint64_t h[8];
  make_tokens(t, NTOK, 3);
  assert_int_equal(kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, NTOK, 0, h, 8), 0);
  assert_int_equal(kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, 15, BS, h, 8), 0);
  assert_int_equal(kvbm_hash_chain(KVBM_HASH_NATIVE, 0, t, NTOK, BS, h, 2), 2);
  assert_int_equal(kvbm_hash_chain(KVBM_HASH_NATIVE, 0, NULL, NTOK, BS, h, 2), 0);
  assert_true(kvbm_hash_salt(NULL, 0) == 0 && kvbm_hash_salt("", 0) == 0);
  kvbm_hash_scheme s;
  assert_true(kvbm_hash_scheme_parse("dynamo", &s) && s == KVBM_HASH_DYNAMO);
  assert_true(kvbm_hash_scheme_parse("native", &s) && s == KVBM_HASH_NATIVE);
  assert_false(kvbm_hash_scheme_parse("Dynamo", &s));
  assert_false(kvbm_hash_scheme_parse(NULL, &s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dynamo_scheme_matches_python_xxhash),
      cmocka_unit_test(chains_match_python_xxhash_at_every_length_range),
      cmocka_unit_test(chain_is_a_prefix_function),
      cmocka_unit_test(chain_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
