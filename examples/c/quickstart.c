/* SPDX-License-Identifier: Apache-2.0 */
/*
 * quickstart.c: the README's C example, whole. An engine keeps a pool of KV
 * blocks; two requests with the same prompt share its full blocks.
 *
 *   cc quickstart.c $(pkg-config --cflags --libs kvbm) -o quickstart
 *
 * Prints the version of the library it runs against and what the second
 * request found cached, and exits 0 when that is every full block but the
 * last token's (vLLM's rule: the last prompt token is always computed).
 */
#include <stdint.h>
#include <stdio.h>

#include <kvbm/sequence.h>

#define BLOCK 16
#define PROMPT 100

static int run_request(kvbm_pool *pool, const uint32_t *prompt, size_t *cached) {
  kvbm_seq *seq;
  int rc = kvbm_seq_create(pool, 0 /* salt hash */, 0 /* priority */, &seq);
  if (rc) return rc;
  rc = kvbm_seq_prefill(seq, prompt, PROMPT, cached); /* KVBM_ENOSPC: nothing changed */
  uint32_t next_token = 7;
  if (!rc) rc = kvbm_seq_append(seq, &next_token, 1); /* decode */
  const uint32_t *block_table;
  size_t nblocks = 0;
  if (!rc) kvbm_seq_blocks(seq, &block_table, &nblocks);
  if (!rc) printf("request: %zu blocks, %zu tokens cached\n", nblocks, *cached);
  kvbm_seq_destroy(seq); /* release, tail first: full blocks stay cached */
  return rc;
}

int main(void) {
  printf("kvbm %s\n", kvbm_version_string());
  if (kvbm_version() != KVBM_VERSION_HEX) {
    fprintf(stderr, "built against kvbm %#x, running %#x\n", KVBM_VERSION_HEX, kvbm_version());
    return 1;
  }
  kvbm_pool_config cfg = kvbm_pool_config_default(1024, BLOCK); /* blocks, tokens per block */
  kvbm_pool *pool;
  kvbm_error err;
  if (kvbm_pool_create(&cfg, &pool, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  uint32_t prompt[PROMPT];
  for (size_t i = 0; i < PROMPT; i++) prompt[i] = (uint32_t)(1000 + i);
  size_t first = 0, second = 0;
  int rc = run_request(pool, prompt, &first);
  if (!rc) rc = run_request(pool, prompt, &second);
  kvbm_pool_destroy(pool);
  if (rc) {
    fprintf(stderr, "kvbm: %s\n", kvbm_strerror(rc));
    return 1;
  }
  size_t want = (PROMPT - 1) / BLOCK * BLOCK;
  printf("second request reused %zu of %d prompt tokens\n", second, PROMPT);
  return first == 0 && second == want ? 0 : 1;
}
