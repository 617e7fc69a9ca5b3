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
 */
#include "kvbm/hash.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvbm hashes tokens as little-endian u32; big-endian hosts need a byte swap here"
#endif

uint64_t kvbm_hash_salt(const void *salt, size_t len) {
  if (!salt || len == 0) return 0;
  return XXH3_64bits_withSeed(salt, len, KVBM_HASH_DYNAMO_SEED);
}

uint64_t kvbm_hash_block(uint64_t salt_hash, const uint32_t *tokens, size_t n) {
  return XXH3_64bits_withSeed(tokens, n * sizeof *tokens, salt_hash);
}

static inline uint64_t dynamo_combine(uint64_t parent, uint64_t block) {
  uint64_t pair[2] = {parent, block};
  return XXH3_64bits_withSeed(pair, sizeof pair, KVBM_HASH_DYNAMO_SEED);
}

uint64_t kvbm_hash_next(kvbm_hash_scheme scheme, uint64_t salt_hash,
                        uint64_t parent, bool has_parent,
                        const uint32_t *tokens, size_t n) {
  if (scheme == KVBM_HASH_DYNAMO) {
    uint64_t block = kvbm_hash_block(salt_hash, tokens, n);
    return has_parent ? dynamo_combine(parent, block) : block;
  }
  return XXH3_64bits_withSeed(tokens, n * sizeof *tokens,
                              has_parent ? parent : salt_hash);
}

size_t kvbm_hash_chain(kvbm_hash_scheme scheme, uint64_t salt_hash,
                       const uint32_t *tokens, size_t n, size_t block_size,
                       uint64_t *out, size_t max_out) {
  if (block_size == 0 || !tokens) return 0;
  size_t nb = n / block_size;
  if (nb > max_out) nb = max_out;
  uint64_t parent = 0;
  for (size_t k = 0; k < nb; k++) {
    parent = kvbm_hash_next(scheme, salt_hash, parent, k > 0,
                            tokens + k * block_size, block_size);
    out[k] = parent;
  }
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
