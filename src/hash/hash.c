/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash.c: the chained block hashes of kvbm/hash.h, on libxxhash's XXH3.
 *
 * Tokens are hashed as their in-memory bytes, which is little-endian u32 on
 * every machine kvbm targets (x86-64, aarch64); a big-endian build is refused
 * at compile time rather than silently disagreeing with Dynamo.
 *
 * The native chain seeds each block's hash with its parent's, so building a
 * sequence hash reads each token exactly once: this is the bound the W1
 * benchmark compares the whole replay against.
 *
 * The step itself lives in hash/hash_inline.h (kvbm__hash_next_inline), so
 * that the library's own hot loops (the pool's prefill) inline it; the
 * exported calls here are that step, and kvbm_hash_chain runs it in a loop
 * compiled once per scheme, so a chain pays no call and no scheme test a
 * block.
 */
#include "kvbm/hash.h"

#include <string.h>

#include "hash/hash_inline.h"

uint64_t kvbm_hash_salt(const void *salt, size_t len) {
  if (!salt || len == 0) return 0;
  return XXH3_64bits_withSeed(salt, len, KVBM_HASH_DYNAMO_SEED);
}

uint64_t kvbm_hash_block(uint64_t salt_hash, const uint32_t *tokens, size_t n) {
  return XXH3_64bits_withSeed(tokens, n * sizeof *tokens, salt_hash);
}

uint64_t kvbm_hash_next(kvbm_hash_scheme scheme, uint64_t salt_hash,
                        uint64_t parent, bool has_parent,
                        const uint32_t *tokens, size_t n) {
  return kvbm__hash_next_inline(scheme, salt_hash, parent, has_parent, tokens, n);
}

/* kvbm_hash_chain's loop, compiled once per scheme (a constant at every
 * call site) and, for the native scheme, once more for blocks of 16
 * tokens (vLLM's default block size; the pool's prefill loop has the same
 * instance, pool.c): block 0 is seeded with the salt, every later one
 * with its parent, so the test of has_parent goes out of the loop too. */
static inline __attribute__((always_inline)) void chain_run(const kvbm_hash_scheme scheme, uint64_t salt_hash,
                                                            const uint32_t *tokens, size_t nb,
                                                            const size_t block_size, uint64_t *out) {
  uint64_t parent = kvbm__hash_next_inline(scheme, salt_hash, 0, false, tokens, block_size);
  out[0] = parent;
  for (size_t k = 1; k < nb; k++) {
    tokens += block_size;
    parent = kvbm__hash_next_inline(scheme, salt_hash, parent, true, tokens, block_size);
    out[k] = parent;
  }
}

size_t kvbm_hash_chain(kvbm_hash_scheme scheme, uint64_t salt_hash,
                       const uint32_t *tokens, size_t n, size_t block_size,
                       uint64_t *out, size_t max_out) {
  if (block_size == 0 || !tokens) return 0;
  size_t nb = n / block_size;
  if (nb > max_out) nb = max_out;
  if (nb == 0) return 0;
  if (scheme == KVBM_HASH_DYNAMO)
    chain_run(KVBM_HASH_DYNAMO, salt_hash, tokens, nb, block_size, out);
  else if (block_size == 16)
    chain_run(KVBM_HASH_NATIVE, salt_hash, tokens, nb, 16, out);
  else
    chain_run(KVBM_HASH_NATIVE, salt_hash, tokens, nb, block_size, out);
  return nb;
}

bool kvbm_hash_scheme_parse(const char *name, kvbm_hash_scheme *out) {
  if (!name) return false;
  if (!strcmp(name, "native")) {
    *out = KVBM_HASH_NATIVE;
    return true;
  }
  if (!strcmp(name, "dynamo")) {
    *out = KVBM_HASH_DYNAMO;
    return true;
  }
  return false;
}

const char *kvbm_hash_scheme_name(kvbm_hash_scheme scheme) {
  return scheme == KVBM_HASH_DYNAMO ? "dynamo" : "native";
}
