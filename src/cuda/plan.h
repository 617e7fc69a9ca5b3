/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plan.h (private): the copy engine's piece planner -- which byte ranges a
 * batch of (src block, dst block) pairs moves, merged where they are back
 * to back in both layouts, in layer order. Pure functions on layouts and
 * ids: no CUDA, no storage addresses, so the CPU tests check them in full.
 */
#ifndef KVBM_CUDA_PLAN_H
#define KVBM_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/layout.h"
#include "kvbm/status.h"

/* `size` bytes from (src_region, src_off) to (dst_region, dst_off). */
typedef struct kvbm__piece {
  uint64_t src_region, src_off;
  uint64_t dst_region, dst_off;
  uint64_t size;
} kvbm__piece;

/* Steps run in order; the pieces of one step are unordered among
 * themselves. Step s holds pieces [s ? step_end[s-1] : 0, step_end[s]).
 * num_steps is num_layers (step s = layer s), or 1 for a blockwise plan
 * (each block's layers in one piece). */
typedef struct kvbm__plan {
  kvbm__piece *pieces;
  size_t num_pieces;
  size_t *step_end;
  uint64_t num_steps;
  uint64_t num_layers;
} kvbm__plan;

/* The layout checks of a transfer: both layouts are what kvbm_layout_init
 * makes of their kind and config (a hand-edited layout is refused), and
 * they agree on num_layers, outer_dim and layer bytes. KVBM_EINVAL naming
 * the mismatch. */
int kvbm__plan_check_layouts(const kvbm_layout *src, const kvbm_layout *dst, kvbm_error *err);

/* At most this many (block, layer) pieces in one plan (40 bytes each). */
#define KVBM__PLAN_MAX_PIECES (1ull << 26)

/* The id checks: n in 1..KVBM_CUDA_MAX_BATCH, n * num_layers at most
 * KVBM__PLAN_MAX_PIECES, arrays non-NULL, each id
 * below its layout's num_blocks (KVBM_ERANGE naming pair i), no dst id
 * twice, and when `same_storage` no id both read and written
 * (KVBM_EINVAL). O(n log n); allocates scratch (KVBM_ENOMEM). */
int kvbm__plan_check_ids(const kvbm_layout *src, const kvbm_layout *dst, const uint64_t *src_ids,
                         const uint64_t *dst_ids, size_t n, int same_storage, kvbm_error *err);

/* Builds the plan of checked input (call both checks first): pairs sorted
 * by src id, then per layer one piece per pair, a piece merged into the
 * one before when it continues it in both src and dst (same regions, both
 * offsets adjacent). `blockwise` and both layouts FullyContiguous: one
 * step of whole blocks (num_layers * layer_stride bytes each). On success
 * *out owns two allocations: kvbm__plan_free(). KVBM_ENOMEM. */
int kvbm__plan_build(const kvbm_layout *src, const kvbm_layout *dst, const uint64_t *src_ids,
                     const uint64_t *dst_ids, size_t n, int blockwise, kvbm__plan *out,
                     kvbm_error *err);

void kvbm__plan_free(kvbm__plan *p);

/* Runs the plan with memcpy between host regions (src_base[r], dst_base[r]):
 * the reference the tests compare the planner against. */
void kvbm__plan_run_host(const kvbm__plan *p, uint8_t *const *src_base, uint8_t *const *dst_base);

#endif
