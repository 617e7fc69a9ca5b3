/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_copy.c: the copy engine (kvbm/cuda.h, src/cuda/copy.c, plan.c).
 *
 * On the CPU, with no device: the planner moves exactly the bytes a
 * brute-force copy of every (pair, layer) moves, on random layouts and id
 * maps (with and without runs), in layer order, with adjacent pieces
 * merged and nothing else; every refusal of kvbm_cuda_transfer_check()
 * (storages that claim any memory type, built here on host memory); the
 * copier's calls without a device say KVBM_EDEVICE or KVBM_EUNSUPPORTED.
 *
 * Then, on a device (kvbm_test_gpu_or_skip), real device and pinned
 * storage with random bytes: every method, offload and onboard and D2D,
 * FullyContiguous and LayerSeparate (and across kinds), ids with and
 * without runs, an odd layer size (the kernel's byte path), the
 * destination poisoned first and compared byte by byte; the per-layer
 * events (an engine stream that waits for layer L reads layer L's new
 * bytes), after_stream ordering, query/sync/release and destroy's refusal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cuda/plan.h"
#include "gpu_testutil.h"
#include "kvbm/cuda.h"

/* ---- random numbers (xorshift; seeded, so a failure can be replayed) ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return rng_state = x;
}
static void fill_random(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rnd() >> 32);
}

/* ---- a storage over host memory that claims any memory type ---- */

typedef struct fake {
  kvbm_storage base;
  kvbm_memory_type mem;
  int32_t dev;
  uint64_t n, size;
  uint8_t *region[];
} fake;

static kvbm_memory_type f_mem(const kvbm_storage *s) { return ((const fake *)(const void *)s)->mem; }
static int32_t f_dev(const kvbm_storage *s) { return ((const fake *)(const void *)s)->dev; }
static uint64_t f_n(const kvbm_storage *s) { return ((const fake *)(const void *)s)->n; }
static uint64_t f_size(const kvbm_storage *s) { return ((const fake *)(const void *)s)->size; }
static void *f_base(const kvbm_storage *s, uint64_t r) {
  const fake *f = (const fake *)(const void *)s;
  return r < f->n ? f->region[r] : NULL;
}
static void f_release(kvbm_storage *s) {
  fake *f = (fake *)(void *)s;
  for (uint64_t r = 0; r < f->n; r++) free(f->region[r]);
  free(f);
}
static const kvbm_storage_vtable fake_vt = {"fake", f_mem, f_dev, f_n, f_size, f_base, f_release};

static fake *fake_create(const kvbm_layout *l, kvbm_memory_type mem, int32_t dev) {
  fake *f = calloc(1, sizeof *f + l->num_regions * sizeof(uint8_t *));
  assert_non_null(f);
  f->base.vt = &fake_vt;
  f->mem = mem, f->dev = dev, f->n = l->num_regions, f->size = l->region_size;
  for (uint64_t r = 0; r < f->n; r++) {
    size_t sz = (size_t)((l->region_size + l->config.alignment - 1) / l->config.alignment *
                         l->config.alignment);
    f->region[r] = aligned_alloc((size_t)l->config.alignment, sz);
    assert_non_null(f->region[r]);
  }
  return f;
}

static kvbm_layout mk(kvbm_layout_kind kind, uint64_t blocks, uint64_t layers, uint64_t outer,
                      uint64_t page, uint64_t inner, uint64_t dtype, uint64_t align) {
  kvbm_layout_config c = {blocks, layers, outer, page, inner, dtype, align};
  kvbm_layout l;
  kvbm_error e = {0};
  if (kvbm_layout_init(&l, kind, &c, &e) != KVBM_OK) fail_msg("layout: %s", e.msg);
  return l;
}

/* ---- id maps ---- */

/* n distinct ids below `range` in `out`: shuffled, or (runs) a few
 * shuffled runs of consecutive ids. */
static void make_ids(uint64_t *out, size_t n, uint64_t range, int runs) {
  uint64_t *perm = malloc(range * sizeof *perm);
  assert_non_null(perm);
  for (uint64_t i = 0; i < range; i++) perm[i] = i;
  if (!runs) {
    for (uint64_t i = range - 1; i > 0; i--) {
      uint64_t j = rnd() % (i + 1), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    memcpy(out, perm, n * sizeof *out);
  } else {
    /* runs of 1..8 starting at random places, no id twice */
    uint8_t *used = calloc(range, 1);
    assert_non_null(used);
    size_t k = 0;
    while (k < n) {
      uint64_t start = rnd() % range, len = 1 + rnd() % 8;
      for (uint64_t i = start; i < range && i < start + len && k < n && !used[i]; i++)
        used[i] = 1, out[k++] = i;
    }
    free(used);
  }
  free(perm);
}

/* ---- the planner against a brute-force copy ---- */

static void model_copy(const kvbm_layout *sl, const kvbm_layout *dl, uint8_t *const *sb,
                       uint8_t *const *db, const uint64_t *s, const uint64_t *d, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (uint64_t ly = 0; ly < sl->config.num_layers; ly++) {
      kvbm_slice a, b;
      assert_int_equal(kvbm_layout_block_layer(sl, s[i], ly, &a, NULL), KVBM_OK);
      assert_int_equal(kvbm_layout_block_layer(dl, d[i], ly, &b, NULL), KVBM_OK);
      memcpy(db[b.region] + b.offset, sb[a.region] + a.offset, (size_t)a.size);
    }
}

/* The layer a piece of `l` at (region, off) belongs to. */
static uint64_t layer_of(const kvbm_layout *l, uint64_t region, uint64_t off) {
  if (l->kind == KVBM_LAYOUT_LAYER_SEPARATE) return region;
  return (off % l->block_stride) / l->layer_stride;
}

static void plan_case(const kvbm_layout *sl, const kvbm_layout *dl, size_t n, int runs,
                      int blockwise) {
  uint64_t *s = malloc(n * sizeof *s), *d = malloc(n * sizeof *d);
  make_ids(s, n, sl->config.num_blocks, runs);
  make_ids(d, n, dl->config.num_blocks, runs);
  int fits = 1; /* identical maps where they fit: long runs in both */
  for (size_t i = 0; i < n; i++) fits &= s[i] < dl->config.num_blocks;
  if (runs && fits && (rnd() & 1)) memcpy(d, s, n * sizeof *d);
  kvbm_error e = {0};
  assert_int_equal(kvbm__plan_check_layouts(sl, dl, &e), KVBM_OK);
  assert_int_equal(kvbm__plan_check_ids(sl, dl, s, d, n, 0, &e), KVBM_OK);
  kvbm__plan p;
  assert_int_equal(kvbm__plan_build(sl, dl, s, d, n, blockwise, &p, &e), KVBM_OK);
  int whole = blockwise && sl->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS &&
              dl->kind == KVBM_LAYOUT_FULLY_CONTIGUOUS;
  assert_int_equal(p.num_layers, sl->config.num_layers);
  assert_int_equal(p.num_steps, whole ? 1 : sl->config.num_layers);
  uint64_t total = 0;
  for (uint64_t st = 0; st < p.num_steps; st++) {
    size_t a = st ? p.step_end[st - 1] : 0;
    assert_true(a <= p.step_end[st]);
    for (size_t i = a; i < p.step_end[st]; i++) {
      const kvbm__piece *q = &p.pieces[i];
      total += q->size;
      assert_true(q->size > 0 && q->size % sl->layer_stride == 0);
      if (!whole) { /* layer order: step st moves layer st only */
        assert_int_equal(layer_of(sl, q->src_region, q->src_off), st);
        assert_int_equal(layer_of(dl, q->dst_region, q->dst_off), st);
      }
      if (i > a) { /* merged: no piece continues the one before it */
        const kvbm__piece *r = &p.pieces[i - 1];
        assert_false(r->src_region == q->src_region && r->dst_region == q->dst_region &&
                     r->src_off + r->size == q->src_off && r->dst_off + r->size == q->dst_off);
      }
    }
  }
  assert_int_equal(p.step_end[p.num_steps - 1], p.num_pieces);
  assert_int_equal(total, (uint64_t)n * sl->config.num_layers * sl->layer_stride);
  /* Same bytes as the brute-force copy: both destinations start equal
   * (random), the sources are random. */
  fake *src = fake_create(sl, KVBM_MEMORY_SYSTEM, -1);
  fake *d1 = fake_create(dl, KVBM_MEMORY_SYSTEM, -1), *d2 = fake_create(dl, KVBM_MEMORY_SYSTEM, -1);
  for (uint64_t r = 0; r < sl->num_regions; r++) fill_random(src->region[r], sl->region_size);
  for (uint64_t r = 0; r < dl->num_regions; r++) {
    fill_random(d1->region[r], dl->region_size);
    memcpy(d2->region[r], d1->region[r], dl->region_size);
  }
  kvbm__plan_run_host(&p, src->region, d1->region);
  model_copy(sl, dl, src->region, d2->region, s, d, n);
  for (uint64_t r = 0; r < dl->num_regions; r++)
    assert_memory_equal(d1->region[r], d2->region[r], dl->region_size);
  f_release(&src->base), f_release(&d1->base), f_release(&d2->base);
  kvbm__plan_free(&p);
  free(s), free(d);
}

static void test_plan_random(void **state) {
  (void)state;
  for (int it = 0; it < 300; it++) {
    kvbm_layout_kind k1 = (rnd() & 1) ? KVBM_LAYOUT_FULLY_CONTIGUOUS : KVBM_LAYOUT_LAYER_SEPARATE;
    kvbm_layout_kind k2 = (rnd() & 1) ? KVBM_LAYOUT_FULLY_CONTIGUOUS : KVBM_LAYOUT_LAYER_SEPARATE;
    uint64_t layers = 1 + rnd() % 5, outer = 1 + rnd() % 2, page = 1 + rnd() % 4;
    uint64_t inner = 1 + rnd() % 9, dtype = 1u << (rnd() % 3), align = 1u << (rnd() % 7);
    uint64_t nb1 = 1 + rnd() % 40, nb2 = 1 + rnd() % 40;
    if (rnd() & 1) nb2 = nb1;
    kvbm_layout sl = mk(k1, nb1, layers, outer, page, inner, dtype, align);
    kvbm_layout dl = mk(k2, nb2, layers, outer, page, inner, dtype, align);
    size_t n = 1 + rnd() % (nb1 < nb2 ? nb1 : nb2);
    plan_case(&sl, &dl, n, (int)(rnd() & 1), (int)(rnd() & 1));
  }
}

static void test_plan_merges(void **state) {
  (void)state;
  kvbm_error e = {0};
  kvbm__plan p;
  /* LayerSeparate, layer 64 bytes = block stride: ids 3,4,5 -> 10,11,12
   * given out of order merge into one piece per layer; 7 -> 20 stays. */
  kvbm_layout ls = mk(KVBM_LAYOUT_LAYER_SEPARATE, 32, 3, 2, 4, 4, 2, 64);
  uint64_t s[] = {5, 3, 7, 4}, d[] = {12, 10, 20, 11};
  assert_int_equal(kvbm__plan_build(&ls, &ls, s, d, 4, 0, &p, &e), KVBM_OK);
  assert_int_equal(p.num_steps, 3);
  assert_int_equal(p.num_pieces, 6);
  for (uint64_t st = 0; st < 3; st++) {
    const kvbm__piece *a = &p.pieces[2 * st], *b = &p.pieces[2 * st + 1];
    assert_int_equal(p.step_end[st], 2 * st + 2);
    assert_int_equal(a->src_region, st);
    assert_int_equal(a->src_off, 3 * 64);
    assert_int_equal(a->dst_off, 10 * 64);
    assert_int_equal(a->size, 3 * 64);
    assert_int_equal(b->src_off, 7 * 64);
    assert_int_equal(b->dst_off, 20 * 64);
    assert_int_equal(b->size, 64);
  }
  kvbm__plan_free(&p);
  /* FullyContiguous layer by layer: a layer never continues the next
   * block's, so 4 pairs x 3 layers = 12 pieces; blockwise: runs merge. */
  kvbm_layout fc = mk(KVBM_LAYOUT_FULLY_CONTIGUOUS, 32, 3, 2, 4, 4, 2, 64);
  assert_int_equal(kvbm__plan_build(&fc, &fc, s, d, 4, 0, &p, &e), KVBM_OK);
  assert_int_equal(p.num_pieces, 12);
  kvbm__plan_free(&p);
  assert_int_equal(kvbm__plan_build(&fc, &fc, s, d, 4, 1, &p, &e), KVBM_OK);
  assert_int_equal(p.num_steps, 1);
  assert_int_equal(p.num_pieces, 2);
  assert_int_equal(p.pieces[0].size, 3 * fc.block_stride);
  kvbm__plan_free(&p);
  /* Blockwise is ignored where a block is not contiguous. */
  assert_int_equal(kvbm__plan_build(&fc, &ls, s, d, 4, 1, &p, &e), KVBM_OK);
  assert_int_equal(p.num_steps, 3);
  kvbm__plan_free(&p);
}

/* ---- refusals, without a device ---- */

static int check(const kvbm_cuda_transfer *t, int32_t dev, const char *needle) {
  kvbm_error e = {0};
  int rc = kvbm_cuda_transfer_check(t, dev, &e);
  if (needle && !strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
  return rc;
}

static void test_check_refusals(void **state) {
  (void)state;
  kvbm_layout fc = mk(KVBM_LAYOUT_FULLY_CONTIGUOUS, 16, 4, 2, 4, 8, 2, 64);
  kvbm_layout ls = mk(KVBM_LAYOUT_LAYER_SEPARATE, 8, 4, 2, 4, 8, 2, 64);
  fake *dev = fake_create(&fc, KVBM_MEMORY_DEVICE, 0);
  fake *dev1 = fake_create(&fc, KVBM_MEMORY_DEVICE, 1);
  fake *pin = fake_create(&ls, KVBM_MEMORY_PINNED, -1);
  fake *sys = fake_create(&ls, KVBM_MEMORY_SYSTEM, -1);
  uint64_t s[] = {0, 1, 2}, d[] = {5, 6, 7};
  kvbm_cuda_transfer ok = {&dev->base, &fc, &pin->base, &ls, KVBM_CUDA_OFFLOAD, s, d, 3, 0};
  assert_int_equal(check(&ok, 0, NULL), KVBM_OK);
  kvbm_cuda_transfer t;

  assert_int_equal(check(NULL, 0, "NULL"), KVBM_EINVAL);
  t = ok, t.src = NULL;
  assert_int_equal(check(&t, 0, "storage is NULL"), KVBM_EINVAL);
  t = ok, t.direction = 9;
  assert_int_equal(check(&t, 0, "direction"), KVBM_EINVAL);
  t = ok, t.flags = 6;
  assert_int_equal(check(&t, 0, "flags"), KVBM_EINVAL);
  /* memory types for the direction */
  t = ok, t.direction = KVBM_CUDA_ONBOARD;
  assert_int_equal(check(&t, 0, "onboard needs pinned"), KVBM_EINVAL);
  t = ok, t.dst = &sys->base;
  assert_int_equal(check(&t, 0, "KVBM_MEMORY_PINNED"), KVBM_EINVAL);
  t = ok, t.direction = KVBM_CUDA_D2D;
  assert_int_equal(check(&t, 0, "needs device"), KVBM_EINVAL);
  /* device ids */
  assert_int_equal(check(&ok, 1, "device 0, the copier on 1"), KVBM_EINVAL);
  t = ok, t.src = &dev1->base;
  assert_int_equal(check(&t, 0, "device 1"), KVBM_EINVAL);
  /* layouts */
  kvbm_layout l5 = mk(KVBM_LAYOUT_LAYER_SEPARATE, 8, 5, 2, 4, 8, 2, 64);
  kvbm_layout o1 = mk(KVBM_LAYOUT_LAYER_SEPARATE, 8, 4, 1, 8, 8, 2, 64);
  kvbm_layout by = mk(KVBM_LAYOUT_LAYER_SEPARATE, 8, 4, 2, 4, 8, 4, 64);
  t = ok, t.dst_layout = &l5;
  assert_int_equal(check(&t, 0, "layers"), KVBM_EINVAL);
  t = ok, t.dst_layout = &o1;
  assert_int_equal(check(&t, 0, "outer_dim"), KVBM_EINVAL);
  t = ok, t.dst_layout = &by;
  assert_int_equal(check(&t, 0, "layer of a block"), KVBM_EINVAL);
  kvbm_layout forged = ls;
  forged.block_stride = 8;
  t = ok, t.dst_layout = &forged;
  assert_int_equal(check(&t, 0, "kvbm_layout_init"), KVBM_EINVAL);
  forged = ls, forged.config.alignment = 3;
  t = ok, t.dst_layout = &forged;
  assert_int_equal(check(&t, 0, "invalid"), KVBM_EINVAL);
  kvbm_layout big = mk(KVBM_LAYOUT_LAYER_SEPARATE, 9, 4, 2, 4, 8, 2, 64);
  t = ok, t.dst_layout = &big;
  assert_int_equal(check(&t, 0, "does not fit"), KVBM_EINVAL);
  t = ok, t.src_layout = NULL;
  assert_int_equal(check(&t, 0, "NULL"), KVBM_EINVAL);
  /* ids */
  uint64_t bad_s[] = {0, 16, 2}, bad_d[] = {5, 8, 7}, dup_d[] = {5, 6, 5};
  t = ok, t.src_blocks = bad_s;
  assert_int_equal(check(&t, 0, "pair 1: src block 16 out of range"), KVBM_ERANGE);
  t = ok, t.dst_blocks = bad_d;
  assert_int_equal(check(&t, 0, "pair 1: dst block 8 out of range"), KVBM_ERANGE);
  t = ok, t.dst_blocks = dup_d;
  assert_int_equal(check(&t, 0, "written twice"), KVBM_EINVAL);
  t = ok, t.num_blocks = 0;
  assert_int_equal(check(&t, 0, "no blocks"), KVBM_EINVAL);
  t = ok, t.num_blocks = (size_t)KVBM_CUDA_MAX_BATCH + 1;
  assert_int_equal(check(&t, 0, "at most"), KVBM_EINVAL);
  t = ok, t.src_blocks = NULL;
  assert_int_equal(check(&t, 0, "NULL"), KVBM_EINVAL);
  /* a batch whose plan would be too large: 2^20 blocks x 65536 layers,
   * refused before any id is read or anything allocated */
  {
    kvbm_layout_config hc = {1u << 20, 65536, 1, 1, 1, 1, 1};
    kvbm_layout huge;
    kvbm_error he = {0};
    assert_int_equal(kvbm_layout_init(&huge, KVBM_LAYOUT_FULLY_CONTIGUOUS, &hc, &he), KVBM_OK);
    assert_int_equal(kvbm__plan_check_ids(&huge, &huge, s, d, (size_t)1 << 20, 0, &he), KVBM_EINVAL);
    assert_non_null(strstr(he.msg, "split the batch"));
  }
  /* one storage: disjoint ids are fine, overlapping ones are not */
  kvbm_cuda_transfer same = {&dev->base, &fc, &dev->base, &fc, KVBM_CUDA_D2D, s, d, 3, 0};
  assert_int_equal(check(&same, 0, NULL), KVBM_OK);
  uint64_t ov[] = {9, 10, 1};
  same.dst_blocks = ov;
  assert_int_equal(check(&same, 0, "both read and written"), KVBM_EINVAL);
  kvbm_layout fc2 = mk(KVBM_LAYOUT_FULLY_CONTIGUOUS, 16, 4, 2, 4, 8, 2, 128);
  same.dst_blocks = d, same.dst_layout = &fc2;
  assert_int_equal(check(&same, 0, "two different layouts"), KVBM_EINVAL);
  f_release(&dev->base), f_release(&dev1->base), f_release(&pin->base), f_release(&sys->base);
}

/* Without a device (or without CUDA) every call refuses cleanly; a NULL
 * anything is KVBM_EINVAL or KVBM_EUNSUPPORTED, never a crash. */
static void test_no_device_calls(void **state) {
  (void)state;
  kvbm_error e = {0};
  int ndev = 0;
  int avail = kvbm_cuda_available(&ndev, NULL, NULL);
  kvbm_cuda_copier *c = (kvbm_cuda_copier *)(uintptr_t)1;
  int rc = kvbm_cuda_copier_create(0, NULL, &c, &e);
  if (avail == KVBM_OK) {
    assert_int_equal(rc, KVBM_OK);
    assert_int_equal(kvbm_cuda_copier_destroy(c, &e), KVBM_OK);
  } else {
    assert_int_equal(rc, avail);
    assert_null(c);
    assert_true(strlen(e.msg) > 0);
  }
  kvbm_cuda_job *j = (kvbm_cuda_job *)(uintptr_t)1;
  int want = kvbm_storage_have_cuda() ? KVBM_EINVAL : KVBM_EUNSUPPORTED;
  assert_int_equal(kvbm_cuda_copy_start(NULL, NULL, NULL, &j, &e), want);
  assert_null(j);
  assert_int_equal(kvbm_cuda_job_wait_layer(NULL, 0, NULL, &e), want);
  assert_int_equal(kvbm_cuda_job_sync_layer(NULL, 0, &e), want);
  assert_int_equal(kvbm_cuda_job_sync(NULL, &e), want);
  assert_int_equal(kvbm_cuda_job_query(NULL, &e), want);
  assert_int_equal(kvbm_cuda_job_release(NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_cuda_copier_destroy(NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_cuda_copier_create(0, NULL, NULL, &e), kvbm_storage_have_cuda() ? KVBM_EINVAL : KVBM_EUNSUPPORTED);
  if (kvbm_storage_have_cuda()) { /* config checks come before the device */
    kvbm_cuda_copier_config cfg = kvbm_cuda_copier_config_default();
    cfg.kernel_threads = 100;
    assert_int_equal(kvbm_cuda_copier_create(0, &cfg, &c, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "kernel_threads"));
    cfg = kvbm_cuda_copier_config_default(), cfg.method = 7;
    assert_int_equal(kvbm_cuda_copier_create(0, &cfg, &c, &e), KVBM_EINVAL);
    cfg = kvbm_cuda_copier_config_default(), cfg.large_method = -1;
    assert_int_equal(kvbm_cuda_copier_create(0, &cfg, &c, &e), KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "large_method"));
    cfg = kvbm_cuda_copier_config_default();
    assert_int_equal(kvbm_cuda_copier_create(-1, &cfg, &c, &e), KVBM_EDEVICE);
  }
  assert_string_equal(kvbm_cuda_copy_method_name(KVBM_CUDA_COPY_KERNEL), "kernel");
  assert_string_equal(kvbm_cuda_copy_method_name(42), "?");
}

/* ---- on a device ---- */

#ifdef KVBM_HAVE_CUDA

#define CK(call)                                                                    \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call,      \
                                    cudaGetErrorString(e_));                        \
  } while (0)
#define KOK(call)                                                                   \
  do {                                                                              \
    kvbm_error ke_ = {0};                                                           \
    int rc_ = (call);                                                               \
    (void)ke_;                                                                      \
    if (rc_ != KVBM_OK) fail_msg("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,    \
                                 kvbm_status_name(rc_), ke_.msg);                   \
  } while (0)

/* A storage and a host mirror of its bytes. */
typedef struct side {
  kvbm_layout l;
  kvbm_storage *s;
  uint8_t **m; /* num_regions host buffers */
} side;

static void side_make(side *x, const kvbm_layout *l, kvbm_memory_type mem) {
  x->l = *l;
  kvbm_error ke = {0};
  int rc = kvbm_storage_create(mem, l, NULL, &x->s, &ke);
  if (rc) fail_msg("kvbm_storage_create(%s): %s", kvbm_memory_type_name(mem), ke.msg);
  x->m = calloc(l->num_regions, sizeof *x->m);
  assert_non_null(x->m);
  for (uint64_t r = 0; r < l->num_regions; r++) {
    x->m[r] = malloc((size_t)l->region_size);
    assert_non_null(x->m[r]);
    fill_random(x->m[r], (size_t)l->region_size);
    CK(cudaMemcpy(kvbm_storage_region_base(x->s, r), x->m[r], (size_t)l->region_size,
                  cudaMemcpyDefault));
  }
}

static void side_free(side *x) {
  for (uint64_t r = 0; r < x->l.num_regions; r++) free(x->m[r]);
  free(x->m);
  kvbm_storage_release(x->s);
}

/* Every byte of the storage equals the mirror. */
static void side_compare(const side *x, const char *what) {
  uint8_t *buf = malloc((size_t)x->l.region_size);
  assert_non_null(buf);
  for (uint64_t r = 0; r < x->l.num_regions; r++) {
    memset(buf, 0x5a, (size_t)x->l.region_size);
    CK(cudaMemcpy(buf, kvbm_storage_region_base(x->s, r), (size_t)x->l.region_size,
                  cudaMemcpyDefault));
    if (memcmp(buf, x->m[r], (size_t)x->l.region_size)) {
      size_t i = 0;
      while (buf[i] == x->m[r][i]) i++;
      fail_msg("%s: region %llu differs first at byte %zu (block %llu): got 0x%02x want 0x%02x",
               what, (unsigned long long)r, i, (unsigned long long)(i / x->l.block_stride),
               buf[i], x->m[r][i]);
    }
  }
  free(buf);
}

static kvbm_cuda_copier *copier_for(kvbm_cuda_copy_method m) {
  kvbm_cuda_copier_config cfg = kvbm_cuda_copier_config_default();
  cfg.method = m;
  if (m == KVBM_CUDA_COPY_AUTO) cfg.small_bytes = 2048; /* both sides of the split in the cases */
  kvbm_cuda_copier *c = NULL;
  kvbm_error ke = {0};
  int rc = kvbm_cuda_copier_create(0, &cfg, &c, &ke);
  if (rc) fail_msg("copier (%s): %s", kvbm_cuda_copy_method_name(m), ke.msg);
  return c;
}

/* One batch by one method: poisoned (random) destination, random source,
 * compared byte for byte with the brute-force model. */
static void gpu_case(kvbm_cuda_copier *c, const char *mname, kvbm_cuda_direction dir,
                     const kvbm_layout *sl, const kvbm_layout *dl, size_t n, int runs,
                     uint32_t flags) {
  kvbm_memory_type sm = dir == KVBM_CUDA_ONBOARD ? KVBM_MEMORY_PINNED : KVBM_MEMORY_DEVICE;
  kvbm_memory_type dm = dir == KVBM_CUDA_OFFLOAD ? KVBM_MEMORY_PINNED : KVBM_MEMORY_DEVICE;
  side src, dst;
  side_make(&src, sl, sm);
  side_make(&dst, dl, dm);
  uint64_t *s = malloc(n * sizeof *s), *d = malloc(n * sizeof *d);
  uint64_t nb = sl->config.num_blocks < dl->config.num_blocks ? sl->config.num_blocks
                                                                : dl->config.num_blocks;
  make_ids(s, n, nb, runs);
  make_ids(d, n, nb, runs);
  if (runs) memcpy(d, s, n * sizeof *d); /* runs in both: merged pieces */
  model_copy(sl, dl, src.m, dst.m, s, d, n);
  kvbm_cuda_transfer t = {src.s, sl, dst.s, dl, dir, s, d, n, flags};
  kvbm_cuda_job *j = NULL;
  KOK(kvbm_cuda_copy_start(c, &t, NULL, &j, &ke_));
  KOK(kvbm_cuda_job_sync(j, &ke_));
  KOK(kvbm_cuda_job_query(j, &ke_));
  uint64_t layers = 0, calls = 0, pieces = 0;
  KOK(kvbm_cuda_job_info(j, &layers, &calls, &pieces));
  assert_int_equal(layers, sl->config.num_layers);
  assert_true(calls >= 1 && pieces >= 1);
  KOK(kvbm_cuda_job_release(j, &ke_));
  char what[160];
  snprintf(what, sizeof what, "%s %s %s->%s n=%zu runs=%d flags=%u", mname,
           dir == KVBM_CUDA_OFFLOAD ? "offload" : dir == KVBM_CUDA_ONBOARD ? "onboard" : "d2d",
           kvbm_layout_kind_name(sl->kind), kvbm_layout_kind_name(dl->kind), n, runs,
           (unsigned)flags);
  side_compare(&dst, what);
  side_compare(&src, what); /* the source is untouched */
  free(s), free(d);
  side_free(&src), side_free(&dst);
}

static void test_gpu_methods(void **state) {
  (void)state;
  const kvbm_cuda_copy_method ms[] = {KVBM_CUDA_COPY_MEMCPY, KVBM_CUDA_COPY_BATCH,
                                      KVBM_CUDA_COPY_KERNEL, KVBM_CUDA_COPY_AUTO};
  const kvbm_cuda_direction dirs[] = {KVBM_CUDA_OFFLOAD, KVBM_CUDA_ONBOARD, KVBM_CUDA_D2D};
  const kvbm_layout_kind kinds[] = {KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE};
  int kernels = 0;
  (void)kvbm_cuda_available(NULL, &kernels, NULL);
  for (size_t mi = 0; mi < 4; mi++) {
    if (ms[mi] == KVBM_CUDA_COPY_KERNEL && !kernels) {
      fprintf(stderr, "note: no kernels in this build, method kernel not tested\n");
      continue;
    }
    kvbm_cuda_copier *c = copier_for(ms[mi]);
    const char *mn = kvbm_cuda_copy_method_name(ms[mi]);
    for (size_t di = 0; di < 3; di++)
      for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 2; b++)
          for (int runs = 0; runs < 2; runs++) {
            kvbm_layout sl = mk(kinds[a], 64, 4, 2, 4, 32, 2, 256);
            kvbm_layout dl = mk(kinds[b], 48, 4, 2, 4, 32, 2, 256);
            gpu_case(c, mn, dirs[di], &sl, &dl, 40, runs, 0);
            if (a == 0 && b == 0) gpu_case(c, mn, dirs[di], &sl, &dl, 40, runs, KVBM_CUDA_BLOCKWISE);
          }
    /* odd layer size (15 bytes): not 16-byte aligned pieces */
    kvbm_layout o1 = mk(KVBM_LAYOUT_FULLY_CONTIGUOUS, 32, 3, 1, 5, 3, 1, 16);
    kvbm_layout o2 = mk(KVBM_LAYOUT_LAYER_SEPARATE, 32, 3, 1, 5, 3, 1, 16);
    gpu_case(c, mn, KVBM_CUDA_ONBOARD, &o1, &o2, 20, 0, 0);
    gpu_case(c, mn, KVBM_CUDA_OFFLOAD, &o2, &o1, 20, 1, 0);
    /* many 16 KiB pieces (several kernel launches, batch calls) and long
     * merged runs (pieces cut into 64 KiB kernel chunks) */
    kvbm_layout b1 = mk(KVBM_LAYOUT_LAYER_SEPARATE, 512, 2, 2, 16, 256, 2, 256);
    kvbm_layout b2 = mk(KVBM_LAYOUT_FULLY_CONTIGUOUS, 512, 2, 2, 16, 256, 2, 256);
    gpu_case(c, mn, KVBM_CUDA_ONBOARD, &b1, &b2, 400, 0, 0);
    gpu_case(c, mn, KVBM_CUDA_OFFLOAD, &b2, &b1, 400, 0, 0);
    gpu_case(c, mn, KVBM_CUDA_ONBOARD, &b1, &b1, 400, 1, 0);
    gpu_case(c, mn, KVBM_CUDA_OFFLOAD, &b1, &b1, 500, 1, 0);
    /* more pieces in a layer than one kernel launch takes (1280) */
    kvbm_layout b3 = mk(KVBM_LAYOUT_LAYER_SEPARATE, 2048, 2, 2, 16, 256, 2, 256);
    gpu_case(c, mn, KVBM_CUDA_ONBOARD, &b3, &b3, 1500, 0, 0);
    gpu_case(c, mn, KVBM_CUDA_OFFLOAD, &b3, &b3, 1500, 0, 0);
    KOK(kvbm_cuda_copier_destroy(c, &ke_));
  }
}

/* An engine stream that waits for layer L reads layer L's new bytes, while
 * later layers may still be on the way; the legacy default stream (NULL)
 * waits too; after_stream orders the copier after the caller's work. */
static void test_gpu_layer_events(void **state) {
  (void)state;
  for (int kind = 0; kind < 2; kind++) {
    kvbm_layout_kind k = kind ? KVBM_LAYOUT_LAYER_SEPARATE : KVBM_LAYOUT_FULLY_CONTIGUOUS;
    kvbm_layout hl = mk(k, 128, 32, 2, 16, 256, 2, 256); /* 16 KiB layers, 512 KiB blocks */
    kvbm_layout dl = mk(k, 128, 32, 2, 16, 256, 2, 256);
    side host, dev;
    side_make(&host, &hl, KVBM_MEMORY_PINNED);
    side_make(&dev, &dl, KVBM_MEMORY_DEVICE);
    size_t n = 128;
    uint64_t *s = malloc(n * sizeof *s), *d = malloc(n * sizeof *d);
    make_ids(s, n, 128, 0);
    make_ids(d, n, 128, 0);
    model_copy(&hl, &dl, host.m, dev.m, s, d, n);
    kvbm_cuda_copier *c = copier_for(KVBM_CUDA_COPY_AUTO);
    cudaStream_t es;
    CK(cudaStreamCreateWithFlags(&es, cudaStreamNonBlocking));
    uint8_t *back;
    size_t lb = (size_t)dl.layer_stride, probes = 4;
    CK(cudaHostAlloc((void **)&back, 32 * probes * lb, cudaHostAllocPortable));
    memset(back, 0x77, 32 * probes * lb);
    kvbm_cuda_transfer t = {host.s, &hl, dev.s, &dl, KVBM_CUDA_ONBOARD, s, d, n, 0};
    kvbm_cuda_job *j = NULL;
    KOK(kvbm_cuda_copy_start(c, &t, NULL, &j, &ke_));
    /* destroy refuses while a job is held */
    {
      kvbm_error e = {0};
      assert_int_equal(kvbm_cuda_copier_destroy(c, &e), KVBM_ESTATE);
      assert_int_equal(kvbm_cuda_job_wait_layer(j, 32, es, &e), KVBM_ERANGE);
    }
    for (uint64_t L = 0; L < 32; L++) {
      KOK(kvbm_cuda_job_wait_layer(j, L, es, &ke_));
      for (size_t p = 0; p < probes; p++) {
        void *ptr;
        KOK(kvbm_storage_block_layer_ptr(dev.s, &dl, d[p * 37 % n], L, &ptr, NULL, &ke_));
        CK(cudaMemcpyAsync(back + (L * probes + p) * lb, ptr, lb, cudaMemcpyDeviceToHost, es));
      }
    }
    CK(cudaStreamSynchronize(es));
    for (uint64_t L = 0; L < 32; L++)
      for (size_t p = 0; p < probes; p++) {
        kvbm_slice sl;
        KOK(kvbm_layout_block_layer(&dl, d[p * 37 % n], L, &sl, &ke_));
        if (memcmp(back + (L * probes + p) * lb, dev.m[sl.region] + sl.offset, lb))
          fail_msg("%s: layer %llu of block %llu read after wait_layer is not the new bytes",
                   kvbm_layout_kind_name(k), (unsigned long long)L,
                   (unsigned long long)d[p * 37 % n]);
      }
    KOK(kvbm_cuda_job_wait_layer(j, 31, NULL, &ke_)); /* legacy stream */
    CK(cudaStreamSynchronize(NULL));
    KOK(kvbm_cuda_job_sync_layer(j, 0, &ke_));
    KOK(kvbm_cuda_job_query(j, &ke_));
    KOK(kvbm_cuda_job_release(j, &ke_));
    side_compare(&dev, "layer events");

    /* after_stream: the device blocks are rewritten on a stream of ours;
     * an offload that names that stream copies the new bytes. */
    uint8_t *fresh;
    CK(cudaHostAlloc((void **)&fresh, (size_t)dl.region_size, cudaHostAllocPortable));
    for (uint64_t r = 0; r < dl.num_regions; r++) {
      fill_random(fresh, (size_t)dl.region_size);
      memcpy(dev.m[r], fresh, (size_t)dl.region_size);
      CK(cudaMemcpyAsync(kvbm_storage_region_base(dev.s, r), fresh, (size_t)dl.region_size,
                         cudaMemcpyHostToDevice, es));
      if (r + 1 < dl.num_regions) CK(cudaStreamSynchronize(es)); /* fresh is reused */
    }
    model_copy(&dl, &hl, dev.m, host.m, d, s, n);
    kvbm_cuda_transfer back_t = {dev.s, &dl, host.s, &hl, KVBM_CUDA_OFFLOAD, d, s, n, 0};
    KOK(kvbm_cuda_copy_start(c, &back_t, es, &j, &ke_));
    KOK(kvbm_cuda_job_release(j, &ke_));
    CK(cudaStreamSynchronize(es));
    side_compare(&host, "after_stream offload");
    CK(cudaFreeHost(fresh));
    CK(cudaFreeHost(back));
    CK(cudaStreamDestroy(es));
    KOK(kvbm_cuda_copier_destroy(c, &ke_));
    free(s), free(d);
    side_free(&host), side_free(&dev);
  }
}

static int gpu_tests(void) {
  const struct CMUnitTest gpu[] = {
      cmocka_unit_test(test_gpu_methods),
      cmocka_unit_test(test_gpu_layer_events),
  };
  return cmocka_run_group_tests_name("gpu", gpu, NULL, NULL) ? 1 : 0;
}

#else
static int gpu_tests(void) { return 0; } /* unreachable: skipped before */
#endif

int main(void) {
  const struct CMUnitTest cpu[] = {
      cmocka_unit_test(test_plan_merges),
      cmocka_unit_test(test_plan_random),
      cmocka_unit_test(test_check_refusals),
      cmocka_unit_test(test_no_device_calls),
  };
  if (cmocka_run_group_tests_name("cpu", cpu, NULL, NULL)) return 1;
  kvbm_test_gpu_or_skip();
  return gpu_tests();
}
