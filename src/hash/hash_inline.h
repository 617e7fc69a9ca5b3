/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash/hash_inline.h: one step of a block hash chain, inlined where it is
 * called (private: kvbm__hash_next_inline, kvbm__xxh3_seeded).
 *
 * kvbm_hash_next (kvbm/hash.h) is an exported function of the hash module,
 * so a hot loop elsewhere calls it out of line: the pool's prefill loop
 * (fill_run_plain) hashes one block per iteration, and across that call
 * only the six callee-saved registers survive, so the loop's state goes to
 * the stack and back every block (38 loads and stores a block in the W1
 * replay's profile, docs/areas/pool-speed.md), and the call then tests the
 * scheme and calls XXH3_64bits_withSeed, itself out of line (GCC does not
 * inline the whole length dispatch). Here the step is static inline, so
 * the caller's loop keeps its registers and, where the scheme is a
 * constant in the loop, loses the dispatch too.
 *
 * The XXH3 of a block of B tokens is XXH3_64bits_withSeed's value, bit for
 * bit: libxxhash's header is included with XXH_INLINE_ALL, and for the
 * lengths a block usually has (17..128 bytes: 5..32 tokens; W1's block of
 * 16 tokens is 64 bytes) its mid-size kernel is called directly, which is
 * exactly the branch XXH3_64bits_withSeed takes for those lengths (the 0.8
 * header: XXH3_64bits_internal). That kernel is an internal name of the
 * 0.8 header; with another version, or any other length, the public call
 * is made. tests/hash checks both against python3-xxhash's values.
 *
 * Including this header defines XXH_INLINE_ALL for the including file: its
 * XXH names are then the header's static copies (prefixed XXH_INLINE_),
 * not libxxhash's exported ones, which is harmless in a file that uses no
 * other XXH state.
 */
#ifndef KVBM_HASH_INLINE_H
#define KVBM_HASH_INLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/hash.h"

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvbm hashes tokens as little-endian u32; big-endian hosts need a byte swap here"
#endif

/* The mid-size kernel is called directly only where its name and
 * signature are the ones this was written against (xxhash 0.8.x). */
#if XXH_VERSION_MAJOR == 0 && XXH_VERSION_MINOR == 8
#define KVBM__XXH3_MID_DIRECT 1
#else
#define KVBM__XXH3_MID_DIRECT 0
#endif

/* XXH3_64bits_withSeed(data, len, seed), with the 17..128-byte case (a
 * block's usual length) inlined into the caller. */
static inline __attribute__((always_inline)) uint64_t kvbm__xxh3_seeded(const void *data, size_t len,
                                                                        uint64_t seed) {
#if KVBM__XXH3_MID_DIRECT
  if (len > 16 && len <= 128)
    return XXH3_len_17to128_64b((const xxh_u8 *)data, len, XXH3_kSecret, sizeof XXH3_kSecret, seed);
#endif
  return XXH3_64bits_withSeed(data, len, seed);
}

/* Dynamo's combine step: xxh3_64(le64(parent) || le64(block), seed 1337). */
static inline __attribute__((always_inline)) uint64_t kvbm__hash_dynamo_combine(uint64_t parent,
                                                                                uint64_t block) {
  const uint64_t pair[2] = {parent, block};
  return XXH3_64bits_withSeed(pair, sizeof pair, KVBM_HASH_DYNAMO_SEED);
}

/* kvbm_hash_next(scheme, salt_hash, parent, has_parent, tokens, n), inlined:
 * the same value for every argument (kvbm_hash_next is this). A caller
 * whose scheme is a compile-time constant gets one scheme's code only. */
static inline __attribute__((always_inline)) uint64_t kvbm__hash_next_inline(kvbm_hash_scheme scheme,
                                                                             uint64_t salt_hash,
                                                                             uint64_t parent, bool has_parent,
                                                                             const uint32_t *tokens, size_t n) {
  if (scheme == KVBM_HASH_DYNAMO) {
    const uint64_t block = kvbm__xxh3_seeded(tokens, n * sizeof *tokens, salt_hash);
    return has_parent ? kvbm__hash_dynamo_combine(parent, block) : block;
  }
  return kvbm__xxh3_seeded(tokens, n * sizeof *tokens, has_parent ? parent : salt_hash);
}

#endif
