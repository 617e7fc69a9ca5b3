/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/group.h: KV cache groups of a hybrid model, and the prefix hit every
 * group can serve.
 *
 * A hybrid model (gpt-oss, Gemma 3, Llama 4, Qwen3-Next, Jamba...) keeps
 * several kinds of per-layer state. vLLM puts the layers of one kind in a
 * KV cache group and gives every group its own block table over one shared
 * block pool (vllm/v1/core/kv_cache_coordinator.py). kvbm names a group by
 * its kind and the one token parameter that kind has:
 *
 *   kind              CLI text      vLLM's kv_cache_spec_kind   parameter
 *   FULL              full          "full_attention"            -
 *   SLIDING_WINDOW    sw:W          "sliding_window"            W tokens
 *   CHUNKED_LOCAL     chunk:C       "chunked_local_attention"   C tokens
 *   MAMBA             mamba         "mamba"                     -
 *   MAMBA_ALIGN       mamba-align   "mamba"                     -
 *
 * Mamba's two kinds are vLLM's two prefix-caching modes of a Mamba layer
 * (CacheConfig.mamba_cache_mode): MAMBA is "all" (a state block per block of
 * tokens, as attention allocates, every one but the last released after each
 * step; the default for models declaring SupportsMambaPrefixCaching, such as
 * Nemotron-H and Granite 4), MAMBA_ALIGN is "align" (one running state
 * block, a state saved only where a step ends on a block boundary, and the
 * scheduler cutting prefill chunks at block boundaries). Both match the
 * same way and publish the same kv_cache_spec_kind.
 *
 * The prefix hit (kvbm_groups_hit) is vLLM's coordinator rule: the longest
 * block-aligned prefix, at most max_tokens long, that every group can serve.
 * For a prefix of H tokens:
 *   - full attention needs every block before H;
 *   - a sliding window of W tokens needs the blocks covering the last W - 1
 *     tokens before H (ceil((W - 1) / block_size) blocks, at least one: as
 *     in vLLM, sw:1 still wants the last block), or every block before H
 *     when H is shorter than that;
 *   - chunked local attention needs the blocks of H's chunk, from
 *     floor(H / C) * C up to H;
 *   - Mamba needs its state saved at H, i.e. block H / block_size - 1.
 * Each group shortens the candidate until all accept it (a fixed point, as
 * vLLM's HybridKVCacheCoordinator.find_longest_cache_hit).
 *
 * kvbm_group_skipped_tokens is vLLM's get_num_skipped_tokens: how many
 * leading tokens a group no longer needs once n tokens are computed. The
 * blocks wholly before that are released while the request runs (they stay
 * cached, evictable) and a hit does not take them.
 *
 * Everything here is pure: no allocation, no global state; any thread.
 */
#ifndef KVBM_GROUP_H
#define KVBM_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_group_kind {
  KVBM_GROUP_FULL = 0,
  KVBM_GROUP_SLIDING_WINDOW = 1,
  KVBM_GROUP_CHUNKED_LOCAL = 2,
  KVBM_GROUP_MAMBA = 3,       /* vLLM's mamba_cache_mode "all" */
  KVBM_GROUP_MAMBA_ALIGN = 4, /* vLLM's mamba_cache_mode "align" */
} kvbm_group_kind;

/* At most this many groups in one list (vLLM's largest configurations have
 * a handful; the pool keeps one registry per group). */
#define KVBM_GROUPS_MAX 16
/* A window or chunk is at most this many tokens. */
#define KVBM_GROUP_MAX_TOKENS (1u << 30)

typedef struct kvbm_group_spec {
  kvbm_group_kind kind;
  uint32_t tokens; /* SLIDING_WINDOW: the window W; CHUNKED_LOCAL: the chunk
                      C; 0 for FULL and MAMBA */
} kvbm_group_spec;

/* vLLM's kv_cache_spec_kind string of a kind ("full_attention",
 * "sliding_window", "chunked_local_attention", "mamba" for both Mamba
 * modes); "unknown" for a
 * value outside the enum. Static storage. */
KVBM_EXTERN const char *kvbm_group_kind_name(kvbm_group_kind kind);

/* Parses a comma list of groups: `full`, `sw:W`, `chunk:C`, `mamba`,
 * `mamba-align` (vLLM's
 * names are accepted too: `full_attention`, `sliding_window:W`,
 * `chunked_local_attention:C`). W and C are decimal, 1..2^30. Writes at most
 * `max` specs into out[] and their count into *n. KVBM_EINVAL with a message
 * naming the offending item for: NULL/empty text, an unknown kind, a missing
 * or zero or malformed window/chunk, a parameter on full/mamba, an empty
 * item, trailing junk, more than `max` (or KVBM_GROUPS_MAX) groups. Nothing
 * is written to *n on error. */
KVBM_EXTERN int kvbm_groups_parse(const char *text, kvbm_group_spec *out, size_t max, size_t *n,
                                  kvbm_error *err);

/* Writes the list back in the CLI syntax ("full,sw:128") into buf (NUL
 * terminated, truncated to cap). Returns the length it needed. */
KVBM_EXTERN size_t kvbm_groups_format(const kvbm_group_spec *groups, size_t n, char *buf, size_t cap);

/* Leading tokens a group no longer needs once `computed` tokens are computed
 * (vLLM's get_num_skipped_tokens): 0 for FULL; max(0, computed - W + 1) for a
 * window; floor(computed / C) * C for chunked local; max(0, computed - 1)
 * for Mamba (both modes). */
KVBM_EXTERN uint64_t kvbm_group_skipped_tokens(const kvbm_group_spec *g, uint64_t computed);

/* Whether block `block` (0-based) of the request is cached in group
 * `group` (an index into the list). Must not change what it looks at. */
typedef bool (*kvbm_group_lookup)(void *user, uint32_t group, size_t block);

/* The prefix hit, in tokens (a multiple of block_size, <= max_tokens), that
 * every group of groups[0..n) can serve, by vLLM's coordinator rule (see
 * above). Groups with equal specs form one attention type whose blocks must
 * be cached in each of them; full attention is evaluated first. n == 0 or
 * block_size == 0 gives 0. Cost: O(blocks) lookups per group and pass; a
 * pass that shortens the hit is repeated, at most once more per block. */
KVBM_EXTERN uint64_t kvbm_groups_hit(const kvbm_group_spec *groups, size_t n, uint32_t block_size,
                                     uint64_t max_tokens, kvbm_group_lookup lookup, void *user);

/* kvbm_groups_hit, and where the first attention type's own hit ends (the
 * first pass of full attention, when there is one) in *junction when that
 * is longer than the hit every group can serve, else 0: vLLM's
 * shared_prefix_boundary (KVCacheManager.get_computed_blocks), the second
 * point a sparse prefix-cache retention keeps besides the prompt's end.
 * junction may be NULL. Cost: kvbm_groups_hit's. */
KVBM_EXTERN uint64_t kvbm_groups_hit_junction(const kvbm_group_spec *groups, size_t n, uint32_t block_size,
                                              uint64_t max_tokens, kvbm_group_lookup lookup, void *user,
                                              uint64_t *junction);

/* The full blocks group g caches under vLLM's sparse prefix-cache
 * retention (prefix_cache_retention_interval 0; its reachable_block_mask),
 * as at most two ranges of block indexes [lo[i], hi[i]) in position order;
 * returns their number. Full attention and chunked local: every block, one
 * range [0, SIZE_MAX). A sliding window of W: the cdiv(W - 1, block_size)
 * blocks ending at each boundary; Mamba (both modes): the one block ending
 * there. The boundaries are the prompt's last token (prompt_tokens - 1)
 * and `junction` (kvbm_groups_hit_junction's; 0: none), each floored to a
 * block; overlapping or adjacent ranges are merged. prompt_tokens 0 or
 * block_size 0 gives 0 ranges for a window or Mamba group. Pure; O(1). */
KVBM_EXTERN size_t kvbm_group_kept_ranges(const kvbm_group_spec *g, uint32_t block_size, uint64_t prompt_tokens,
                                          uint64_t junction, size_t lo[2], size_t hi[2]);

#ifdef __cplusplus
}
#endif
#endif
