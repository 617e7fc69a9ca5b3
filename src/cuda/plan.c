/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plan.c: the copy engine's piece planner.
 *
 * What: turn a batch of (src block, dst block) pairs between two layouts
 * into the list of byte ranges the GPU must move, step by step: one step
 * per layer (so that an event after each step tells the engine that layer
 * has arrived), or one step of whole blocks when nobody waits on layers.
 *
 * Why a planner of its own: every method (cudaMemcpyAsync per piece, the
 * batched copy, the gather kernel) moves the same pieces, and fewer,
 * larger pieces are what make a copy cheap: a cudaMemcpyAsync costs a few
 * microseconds of CPU and DMA set-up whatever its size. So adjacent pieces
 * are merged: pairs are sorted by src id, and a pair whose layer bytes
 * continue the previous piece in both src and dst (LayerSeparate regions
 * with consecutive ids, or whole FullyContiguous blocks) extends it. A
 * FullyContiguous layer of a block is never adjacent to the same layer of
 * the next block (the other layers sit between), so layer-by-layer plans of
 * those stay one piece per block and layer: the methods for small pieces
 * exist for them.
 *
 * Trade-offs: sorting reorders the copies inside a step, which is allowed
 * (a batch's copies are unordered; duplicate dst ids are refused for that
 * reason) and costs O(n log n) once per batch. Pieces are stored, not
 * generated on the fly, so that a method can count, split and group them:
 * 40 bytes per piece, at most n * num_layers of them (the batch cap bounds
 * this).
 */
#include "cuda/plan.h"

#include <stdlib.h>
#include <string.h>

#include "kvbm/cuda.h"

int kvbm__plan_check_layouts(const kvbm_layout *src, const kvbm_layout *dst, kvbm_error *err) {
  if (!src || !dst) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: a layout is NULL");
  const kvbm_layout *l[2] = {src, dst};
  const char *name[2] = {"src", "dst"};
  for (int i = 0; i < 2; i++) {
    kvbm_layout again;
    kvbm_error e2 = {0};
    if (kvbm_layout_init(&again, l[i]->kind, &l[i]->config, &e2) != KVBM_OK)
      return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: %s layout is invalid (%s)", name[i],
                            e2.msg);
    if (again.outer_stride != l[i]->outer_stride || again.layer_stride != l[i]->layer_stride ||
        again.block_stride != l[i]->block_stride || again.region_size != l[i]->region_size ||
        again.num_regions != l[i]->num_regions)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "cuda copy: %s layout's strides are not those of its config "
                            "(fill it with kvbm_layout_init)", name[i]);
  }
  if (src->config.num_layers != dst->config.num_layers)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: src has %llu layers, dst %llu",
                          (unsigned long long)src->config.num_layers,
                          (unsigned long long)dst->config.num_layers);
  if (src->config.outer_dim != dst->config.outer_dim)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: src outer_dim %llu, dst %llu",
                          (unsigned long long)src->config.outer_dim,
                          (unsigned long long)dst->config.outer_dim);
  if (src->layer_stride != dst->layer_stride)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "cuda copy: a layer of a block is %llu bytes in src, %llu in dst "
                          "(page_size * inner_dim * dtype_size differ)",
                          (unsigned long long)src->layer_stride,
                          (unsigned long long)dst->layer_stride);
  return KVBM_OK;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int kvbm__plan_check_ids(const kvbm_layout *src, const kvbm_layout *dst, const uint64_t *src_ids,
                         const uint64_t *dst_ids, size_t n, int same_storage, kvbm_error *err) {
  if (n == 0) return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: no blocks to move");
  if (n > KVBM_CUDA_MAX_BATCH)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: %zu blocks in one batch (at most %u)", n,
                          (unsigned)KVBM_CUDA_MAX_BATCH);
  if (!src_ids || !dst_ids)
    return kvbm_error_set(err, KVBM_EINVAL, "cuda copy: block id array is NULL");
  /* The plan stores up to n * num_layers pieces of 40 bytes: bounded so
   * that a hostile batch cannot ask for terabytes (split it instead). */
  if ((uint64_t)n * src->config.num_layers > KVBM__PLAN_MAX_PIECES)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "cuda copy: %zu blocks x %llu layers is more than %llu pieces "
                          "(split the batch)", n, (unsigned long long)src->config.num_layers,
                          (unsigned long long)KVBM__PLAN_MAX_PIECES);
  for (size_t i = 0; i < n; i++) {
    if (src_ids[i] >= src->config.num_blocks)
      return kvbm_error_set(err, KVBM_ERANGE,
                            "cuda copy: pair %zu: src block %llu out of range (%llu blocks)", i,
                            (unsigned long long)src_ids[i],
                            (unsigned long long)src->config.num_blocks);
    if (dst_ids[i] >= dst->config.num_blocks)
      return kvbm_error_set(err, KVBM_ERANGE,
                            "cuda copy: pair %zu: dst block %llu out of range (%llu blocks)", i,
                            (unsigned long long)dst_ids[i],
                            (unsigned long long)dst->config.num_blocks);
  }
  uint64_t *d = malloc(n * sizeof *d * (same_storage ? 2 : 1));
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "cuda copy: no memory to check %zu ids", n);
  memcpy(d, dst_ids, n * sizeof *d);
  qsort(d, n, sizeof *d, cmp_u64);
  int rc = KVBM_OK;
  for (size_t i = 1; i < n && !rc; i++)
    if (d[i] == d[i - 1])
      rc = kvbm_error_set(err, KVBM_EINVAL,
                          "cuda copy: dst block %llu is written twice in one batch",
                          (unsigned long long)d[i]);
  if (!rc && same_storage) {
    uint64_t *s = d + n;
    memcpy(s, src_ids, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_u64);
    for (size_t i = 0, j = 0; i < n && j < n && !rc;) {
      if (s[i] < d[j]) i++;
      else if (s[i] > d[j]) j++;
      else
        rc = kvbm_error_set(err, KVBM_EINVAL,
                            "cuda copy: block %llu is both read and written in one storage",
                            (unsigned long long)s[i]);
    }
  }
  free(d);
  return rc;
}

typedef struct pair {
  uint64_t s, d;
} pair;

static int cmp_pair(const void *a, const void *b) {
  const pair *x = a, *y = b;
  if (x->s != y->s) return x->s < y->s ? -1 : 1;
  return x->d < y->d ? -1 : x->d > y->d;
}

/* Region and offset of (block, layer) without the range checks (done). */
static void where(const kvbm_layout *l, uint64_t b, uint64_t layer, uint64_t *region,
                  uint64_t *off) {
  if (l->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    *region = 0;
    *off = b * l->block_stride + layer * l->layer_stride;
  } else {
    *region = layer;
    *off = b * l->block_stride;
  }
}

int kvbm__plan_build(const kvbm_layout *src, const kvbm_layout *dst, const uint64_t *src_ids,
                     const uint64_t *dst_ids, size_t n, int blockwise, kvbm__plan *out,
                     kvbm_error *err) {
  memset(out, 0, sizeof *out);
  uint64_t layers = src->config.num_layers;
  int whole = blockwise && src->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS &&
              dst->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS;
  uint64_t steps = whole ? 1 : layers;
  uint64_t per_step_pieces = n;
  /* n <= 2^20 and layers <= 2^16: the product fits easily. */
  size_t max_pieces = (size_t)(per_step_pieces * steps);
  pair *p = malloc(n * sizeof *p);
  out->pieces = malloc(max_pieces * sizeof *out->pieces);
  out->step_end = malloc(steps * sizeof *out->step_end);
  if (!p || !out->pieces || !out->step_end) {
    free(p);
    kvbm__plan_free(out);
    return kvbm_error_set(err, KVBM_ENOMEM, "cuda copy: no memory for a plan of %zu pieces",
                          max_pieces);
  }
  for (size_t i = 0; i < n; i++) p[i] = (pair){src_ids[i], dst_ids[i]};
  qsort(p, n, sizeof *p, cmp_pair);
  uint64_t size = whole ? layers * src->layer_stride : src->layer_stride;
  size_t k = 0;
  for (uint64_t st = 0; st < steps; st++) {
    size_t first = k;
    for (size_t i = 0; i < n; i++) {
      kvbm__piece q;
      where(src, p[i].s, st, &q.src_region, &q.src_off);
      where(dst, p[i].d, st, &q.dst_region, &q.dst_off);
      q.size = size;
      if (k > first) {
        kvbm__piece *last = &out->pieces[k - 1];
        if (last->src_region == q.src_region && last->dst_region == q.dst_region &&
            last->src_off + last->size == q.src_off && last->dst_off + last->size == q.dst_off) {
          last->size += q.size;
          continue;
        }
      }
      out->pieces[k++] = q;
    }
    out->step_end[st] = k;
  }
  free(p);
  out->num_pieces = k;
  out->num_steps = steps;
  out->num_layers = layers;
  return KVBM_OK;
}

void kvbm__plan_free(kvbm__plan *p) {
  if (!p) return;
  free(p->pieces);
  free(p->step_end);
  memset(p, 0, sizeof *p);
}

void kvbm__plan_run_host(const kvbm__plan *p, uint8_t *const *src_base, uint8_t *const *dst_base) {
  for (size_t i = 0; i < p->num_pieces; i++) {
    const kvbm__piece *q = &p->pieces[i];
    memcpy(dst_base[q->dst_region] + q->dst_off, src_base[q->src_region] + q->src_off,
           (size_t)q->size);
  }
}
