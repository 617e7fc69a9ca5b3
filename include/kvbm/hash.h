/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/hash.h: chained 64-bit block hashes over u32 token ids.
 *
 * A block's *sequence hash* names the block together with everything before
 * it: equal sequence hashes mean equal token prefixes (and equal salt), which
 * is what prefix sharing matches on. Two schemes:
 *
 *   KVBM_HASH_NATIVE  seq[0] = xxh3_64(tokens[0], seed = salt_hash)
 *                     seq[k] = xxh3_64(tokens[k], seed = seq[k-1])
 *                     One pass over every token, nothing else: the cheapest
 *                     chain there is, and the default.
 *   KVBM_HASH_DYNAMO  block[k] = xxh3_64(tokens[k], seed = salt_hash)
 *                     seq[0]   = block[0]
 *                     seq[k]   = xxh3_64(le64(seq[k-1]) || le64(block[k]), seed 1337)
 *                     The values NVIDIA Dynamo computes (tokens hashed as
 *                     little-endian u32), so its routers and ours agree.
 *
 * Salt (LoRA adapter, cache salt): salt_hash = xxh3_64(salt bytes, seed 1337),
 * 0 when there is none. All functions are pure and thread-safe.
 */
#ifndef KVBM_HASH_H
#define KVBM_HASH_H

#include "kvbm/version.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_hash_scheme {
  KVBM_HASH_NATIVE = 0,
  KVBM_HASH_DYNAMO = 1,
} kvbm_hash_scheme;

#define KVBM_HASH_DYNAMO_SEED 1337u

/* Hash of a salt (any bytes); 0 for len == 0. */
KVBM_EXTERN uint64_t kvbm_hash_salt(const void *salt, size_t len);

/* The content hash of one block's tokens (Dynamo's "block hash"). */
KVBM_EXTERN uint64_t kvbm_hash_block(uint64_t salt_hash, const uint32_t *tokens, size_t n);

/* The sequence hash of a block of `n` tokens whose predecessor has sequence
 * hash `parent` (ignored when has_parent is false). */
KVBM_EXTERN uint64_t kvbm_hash_next(kvbm_hash_scheme scheme, uint64_t salt_hash,
                        uint64_t parent, bool has_parent,
                        const uint32_t *tokens, size_t n);

/* Sequence hashes of the full blocks of `tokens[0..n)`: writes
 * min(n / block_size, max_out) hashes to `out` and returns how many it wrote.
 * block_size 0 writes nothing. */
KVBM_EXTERN size_t kvbm_hash_chain(kvbm_hash_scheme scheme, uint64_t salt_hash,
                       const uint32_t *tokens, size_t n, size_t block_size,
                       uint64_t *out, size_t max_out);

/* "native" / "dynamo" to a scheme; returns false for anything else. */
KVBM_EXTERN bool kvbm_hash_scheme_parse(const char *name, kvbm_hash_scheme *out);
KVBM_EXTERN const char *kvbm_hash_scheme_name(kvbm_hash_scheme scheme);

#ifdef __cplusplus
}
#endif
#endif
