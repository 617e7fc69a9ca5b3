/* SPDX-License-Identifier: Apache-2.0 */
/* test_tp_bridge.c: TP-portable blocks over the in-process fabric.
 *
 * A model of H = 4 KV heads of head_dim 8 (bfloat16), 3 layers, K and V,
 * 4-token pages. One reference tensor holds every block's full KV
 * ([block][layer][outer][token][head][head_dim]) of random bytes; each
 * writer rank's memory is filled with its heads' slice of it, exactly as a
 * TP rank of vLLM holds them. Readers of other TP sizes import the writer
 * ranks' exported sets (the heads descriptor travels in the export: the
 * layout codec's version 2) and gather their heads; every byte of every
 * block is compared with the reference's slice for the reader's heads.
 * Then the refusals: each field that cannot be bridged, named; a missing
 * writer rank, a forged piece, a block out of range: refused before a byte
 * of the reader's block changes. Last, TP=2 writers in a forked process
 * read by TP=1 and TP=4 readers over UCX (shared memory on loopback): the
 * same per-row reads as ucp_get. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fabric_util.h"
#include "kvbm/fabric.h"
#include "kvbm/layout.h"

enum { H = 4, HD = 8, DS = 2, LAYERS = 3, OUTER = 2, PAGE = 4, BLOCKS = 5, MAXR = 8 };
#define FP 0x5eed0000cafef00dull
#define HEAD_BYTES (HD * DS)
#define ROW_BYTES (H * HEAD_BYTES)

static uint8_t ref[BLOCKS][LAYERS][OUTER][PAGE][ROW_BYTES];

static kvbm_layout_heads heads_of(uint32_t rank, uint32_t tp) {
  return (kvbm_layout_heads){.model_fingerprint = FP, .dtype_id = 3 /* bfloat16 */, .num_kv_heads = H,
                             .head_dim = HD, .tp_rank = rank, .tp_size = tp};
}

static void held(uint32_t rank, uint32_t tp, uint32_t *first, uint32_t *count) {
  kvbm_layout_heads h = heads_of(rank, tp);
  assert_int_equal(kvbm_layout_heads_local(&h, first, count, NULL), KVBM_OK);
}

static kvbm_layout rank_layout(kvbm_layout_kind kind, uint32_t rank, uint32_t tp) {
  uint32_t first, count;
  held(rank, tp, &first, &count);
  kvbm_layout_config c = {.num_blocks = BLOCKS, .num_layers = LAYERS, .outer_dim = OUTER, .page_size = PAGE,
                          .inner_dim = (uint64_t)count * HD, .dtype_size = DS, .alignment = 128};
  kvbm_layout l;
  assert_int_equal(kvbm_layout_init(&l, kind, &c, NULL), KVBM_OK);
  kvbm_layout_heads h = heads_of(rank, tp);
  assert_int_equal(kvbm_layout_attach_heads(&l, &h, NULL), KVBM_OK);
  return l;
}

/* One writer rank: memory holding its heads of every block, registered on
 * the writer end and imported on the reader end. */
typedef struct writer {
  test_set ts;
  kvbm_fabric_local_set *ls;
  kvbm_fabric_remote_set *rs;
} writer;

/* The writer rank's memory, filled from the reference (no asserts: the
 * UCX case runs it in a forked child). */
static int writer_fill(writer *w, uint32_t rank, uint32_t tp) {
  memset(w, 0, sizeof *w);
  /* Alternate kinds: the bridge must not care. */
  kvbm_layout_kind kind = rank % 2 ? KVBM_LAYOUT_LAYER_SEPARATE : KVBM_LAYOUT_FULLY_CONTIGUOUS;
  w->ts.desc.layout = rank_layout(kind, rank, tp);
  const kvbm_layout *l = &w->ts.desc.layout;
  w->ts.desc.memory = KVBM_MEMORY_SYSTEM;
  w->ts.desc.device_id = -1;
  w->ts.desc.block_set_id = 100 + rank;
  w->ts.desc.num_regions = l->num_regions;
  w->ts.desc.region_base = calloc(l->num_regions, sizeof(uint64_t));
  if (!w->ts.desc.region_base) return KVBM_ENOMEM;
  for (uint64_t r = 0; r < l->num_regions; r++) {
    if (posix_memalign(&w->ts.region[r], 128, l->region_size)) return KVBM_ENOMEM;
    memset(w->ts.region[r], 0xEE, l->region_size);
    w->ts.desc.region_base[r] = (uint64_t)(uintptr_t)w->ts.region[r];
  }
  uint32_t first, count;
  held(rank, tp, &first, &count);
  for (uint64_t b = 0; b < BLOCKS; b++)
    for (uint64_t ly = 0; ly < LAYERS; ly++)
      for (uint64_t o = 0; o < OUTER; o++) {
        kvbm_slice s;
        int rc = kvbm_layout_slice(l, b, ly, o, &s, NULL);
        if (rc) return rc;
        uint8_t *p = (uint8_t *)w->ts.region[s.region] + s.offset;
        for (uint64_t t = 0; t < PAGE; t++)
          memcpy(p + t * count * HEAD_BYTES, &ref[b][ly][o][t][first * HEAD_BYTES], count * HEAD_BYTES);
      }
  return KVBM_OK;
}

static void writer_make(writer *w, kvbm_fabric *wf, kvbm_fabric *rf, uint32_t rank, uint32_t tp) {
  assert_int_equal(writer_fill(w, rank, tp), KVBM_OK);
  kvbm_error e;
  assert_int_equal(kvbm_fabric_register(wf, &w->ts.desc, &w->ls, &e), KVBM_OK);
  uint8_t *wire = NULL;
  size_t wlen = 0;
  assert_int_equal(kvbm_fabric_export(w->ls, &wire, &wlen, &e), KVBM_OK);
  int rc = kvbm_fabric_import(rf, wire, wlen, &w->rs, &e);
  if (rc) fail_msg("import: %s", e.msg);
  free(wire);
  /* The descriptor crossed the fabric with the layout. */
  const kvbm_layout_desc *d = kvbm_fabric_remote_desc(w->rs);
  assert_int_equal(d->layout.has_heads, 1);
  assert_int_equal(d->layout.heads.tp_rank, rank);
  assert_int_equal(d->layout.heads.tp_size, tp);
  assert_int_equal(d->layout.heads.model_fingerprint, FP);
}

static void writer_free(writer *w) {
  kvbm_fabric_remote_set_release(w->rs);
  kvbm_fabric_local_set_release(w->ls);
  test_set_free(&w->ts);
}

/* A reader's block: one buffer per layer, filled with a sentinel. */
typedef struct reader_block {
  kvbm_layout l;
  void *layers[LAYERS];
} reader_block;

static void rb_make(reader_block *rb, uint32_t rank, uint32_t tp) {
  rb->l = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, rank, tp);
  for (int ly = 0; ly < LAYERS; ly++) {
    rb->layers[ly] = malloc(rb->l.layer_stride);
    memset(rb->layers[ly], 0xAB, rb->l.layer_stride);
  }
}

static void rb_free(reader_block *rb) {
  for (int ly = 0; ly < LAYERS; ly++) free(rb->layers[ly]);
}

static int rb_untouched(const reader_block *rb) {
  for (int ly = 0; ly < LAYERS; ly++)
    for (uint64_t i = 0; i < rb->l.layer_stride; i++)
      if (((const uint8_t *)rb->layers[ly])[i] != 0xAB) return 0;
  return 1;
}

/* Every byte of the reader's block against the reference's slice of its
 * heads (the layer buffers have no padding: every byte is a head's). */
static void rb_check(const reader_block *rb, uint64_t b) {
  uint32_t first, count;
  assert_int_equal(kvbm_layout_heads_local(&rb->l.heads, &first, &count, NULL), KVBM_OK);
  assert_int_equal(rb->l.layer_stride, (uint64_t)OUTER * PAGE * count * HEAD_BYTES);
  for (int ly = 0; ly < LAYERS; ly++)
    for (int o = 0; o < OUTER; o++)
      for (int t = 0; t < PAGE; t++) {
        const uint8_t *got = (const uint8_t *)rb->layers[ly] + o * rb->l.outer_stride + t * count * HEAD_BYTES;
        if (memcmp(got, &ref[b][ly][o][t][first * HEAD_BYTES], count * HEAD_BYTES) != 0)
          fail_msg("block %llu layer %d outer %d token %d: heads %u+%u differ (reader rank %u of %u)",
                   (unsigned long long)b, ly, o, t, (unsigned)first, (unsigned)count, (unsigned)rb->l.heads.tp_rank,
                   (unsigned)rb->l.heads.tp_size);
      }
}

typedef struct fx {
  kvbm_fabric *r, *w; /* reader end, writer end */
} fx;

static int setup(void **state) {
  fx *x = calloc(1, sizeof *x);
  if (kvbm_fabric_inproc_pair("reader", "writer", &x->r, &x->w, NULL)) return -1;
  test_pattern(ref, sizeof ref, 19);
  *state = x;
  return 0;
}

static int teardown(void **state) {
  fx *x = *state;
  kvbm_fabric_destroy(x->r);
  kvbm_fabric_destroy(x->w);
  free(x);
  return 0;
}

/* Writers of TP tp_w, every reader rank of TP tp_r, every block, every
 * byte; and the reads issued: one per (layer, outer) slice when a piece is
 * a whole row on both sides, else one per token row of each piece. */
static void bridge(fx *x, uint32_t tp_w, uint32_t tp_r) {
  writer w[MAXR];
  kvbm_fabric_remote_set *peers[MAXR];
  for (uint32_t r = 0; r < tp_w; r++) {
    writer_make(&w[r], x->w, x->r, r, tp_w);
    peers[tp_w - 1 - r] = w[r].rs; /* any order */
  }
  for (uint32_t rr = 0; rr < tp_r; rr++) {
    reader_block rb;
    rb_make(&rb, rr, tp_r);
    kvbm_fabric_head_piece map[MAXR];
    size_t n = 0;
    kvbm_error e;
    int rc = kvbm_fabric_layout_bridge_heads(&rb.l, &w[0].ts.desc.layout, map, MAXR, &n, &e);
    if (rc) fail_msg("bridge %u -> %u: %s", tp_w, tp_r, e.msg);
    uint64_t want_reads = 0, heads_covered = 0;
    for (size_t k = 0; k < n; k++) {
      uint32_t wf, wc;
      held(map[k].peer_rank, tp_w, &wf, &wc);
      int whole = map[k].num_heads == wc && map[k].num_heads * HD == rb.l.config.inner_dim;
      want_reads += (uint64_t)LAYERS * OUTER * (whole ? 1 : PAGE);
      heads_covered += map[k].num_heads;
    }
    assert_int_equal(heads_covered, rb.l.config.inner_dim / HD);
    for (uint64_t b = 0; b < BLOCKS; b++) {
      for (int ly = 0; ly < LAYERS; ly++) memset(rb.layers[ly], 0xAB, rb.l.layer_stride);
      kvbm_fabric_stats before, after;
      kvbm_fabric_stats_get(x->r, &before);
      rc = kvbm_fabric_read_block_tp(x->r, peers, tp_w, b, &rb.l, rb.layers, LAYERS, &e);
      if (rc) fail_msg("read %u -> %u: %s", tp_w, tp_r, e.msg);
      assert_int_equal(kvbm_fabric_flush(x->r, 1000, NULL), KVBM_OK);
      kvbm_fabric_stats_get(x->r, &after);
      assert_int_equal(after.reads - before.reads, want_reads);
      assert_int_equal(after.read_bytes - before.read_bytes, (uint64_t)LAYERS * rb.l.layer_stride);
      rb_check(&rb, b);
    }
    rb_free(&rb);
  }
  for (uint32_t r = 0; r < tp_w; r++) writer_free(&w[r]);
}

static void tp2_read_by_tp1(void **state) { bridge(*state, 2, 1); }
static void tp2_read_by_tp4(void **state) { bridge(*state, 2, 4); }
static void tp2_read_by_tp8_replicated(void **state) { bridge(*state, 2, 8); }
static void tp8_replicated_read_by_tp1(void **state) { bridge(*state, 8, 1); }
static void tp4_read_by_tp2(void **state) { bridge(*state, 4, 2); }
static void tp1_read_by_tp2(void **state) { bridge(*state, 1, 2); }
static void tp2_read_by_tp2(void **state) { bridge(*state, 2, 2); }

/* The head maps the issue names, piece by piece. */
static void head_maps(void **state) {
  (void)state;
  kvbm_layout w0 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 0, 2);
  kvbm_fabric_head_piece m[8];
  size_t n = 0;
  /* TP=1 gathers from both TP=2 writers: heads 0-1 at rank 0, 2-3 at rank 1. */
  kvbm_layout r1 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 0, 1);
  assert_int_equal(kvbm_fabric_layout_bridge_heads(&r1, &w0, m, 8, &n, NULL), KVBM_OK);
  assert_int_equal(n, 2);
  assert_int_equal(m[0].peer_rank, 0), assert_int_equal(m[0].our_offset, 0);
  assert_int_equal(m[0].peer_offset, 0), assert_int_equal(m[0].num_heads, 2);
  assert_int_equal(m[1].peer_rank, 1), assert_int_equal(m[1].our_offset, 2);
  assert_int_equal(m[1].peer_offset, 0), assert_int_equal(m[1].num_heads, 2);
  /* TP=4 rank 3 takes the second half of writer rank 1's heads. */
  kvbm_layout r4 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 3, 4);
  assert_int_equal(kvbm_fabric_layout_bridge_heads(&r4, &w0, m, 8, &n, NULL), KVBM_OK);
  assert_int_equal(n, 1);
  assert_int_equal(m[0].peer_rank, 1), assert_int_equal(m[0].our_offset, 0);
  assert_int_equal(m[0].peer_offset, 1), assert_int_equal(m[0].num_heads, 1);
  /* Too small a map: ENOSPC and the count needed. */
  kvbm_error e;
  assert_int_equal(kvbm_fabric_layout_bridge_heads(&r1, &w0, m, 1, &n, &e), KVBM_ENOSPC);
  assert_int_equal(n, 2);
  /* Replicated writers (TP=8): the first replica of each head. */
  kvbm_layout w8 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 5, 8);
  assert_int_equal(kvbm_fabric_layout_bridge_heads(&r1, &w8, m, 8, &n, NULL), KVBM_OK);
  assert_int_equal(n, 4);
  for (uint32_t k = 0; k < 4; k++) {
    assert_int_equal(m[k].peer_rank, 2 * k);
    assert_int_equal(m[k].our_offset, k);
    assert_int_equal(m[k].peer_offset, 0);
  }
}

static void expect_refused(const kvbm_layout *ours, const kvbm_layout *theirs, int code, const char *field) {
  kvbm_fabric_head_piece m[8];
  size_t n = 0;
  kvbm_error e;
  kvbm_error_clear(&e);
  int rc = kvbm_fabric_layout_bridge_heads(ours, theirs, m, 8, &n, &e);
  if (rc != code) fail_msg("%s: got %s (%s)", field, kvbm_status_name(rc), e.msg);
  if (!strstr(e.msg, field)) fail_msg("message \"%s\" does not name %s", e.msg, field);
}

/* A layout like rank_layout's with one thing changed. */
static kvbm_layout custom(kvbm_layout_config c, kvbm_layout_heads h) {
  kvbm_layout l;
  assert_int_equal(kvbm_layout_init(&l, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, NULL), KVBM_OK);
  assert_int_equal(kvbm_layout_attach_heads(&l, &h, NULL), KVBM_OK);
  return l;
}

static void refusals_name_the_field(void **state) {
  (void)state;
  kvbm_layout ours = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 1, 4); /* 1 head: inner 8 */
  kvbm_layout w = rank_layout(KVBM_LAYOUT_LAYER_SEPARATE, 0, 2);      /* 2 heads: inner 16 */
  const kvbm_layout_config wc = w.config;
  kvbm_layout_heads wh = w.heads;
  kvbm_layout_config c;
  kvbm_layout_heads h;

  h = wh, h.model_fingerprint ^= 1;
  kvbm_layout t = custom(wc, h);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "model_fingerprint");
  h = wh, h.dtype_id = 2; /* float16: same size, another type */
  t = custom(wc, h);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "dtype_id");
  h = wh, h.num_kv_heads = 8, h.tp_size = 4; /* 2 heads held, inner 16 still */
  t = custom(wc, h);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "num_kv_heads");
  h = wh, h.head_dim = 4, h.tp_size = 1; /* 4 heads of 4: inner 16 */
  t = custom(wc, h);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "head_dim");
  c = wc, c.page_size = 8;
  t = custom(c, wh);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "page_size");
  c = wc, c.num_layers = 2;
  t = custom(c, wh);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "num_layers");
  c = wc, c.outer_dim = 1;
  t = custom(c, wh);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "outer_dim");
  c = wc, c.dtype_size = 4, c.inner_dim = 16;
  h = wh, h.dtype_id = 1; /* float32 */
  t = custom(c, h);
  expect_refused(&ours, &t, KVBM_EUNSUPPORTED, "dtype_size");
  /* No descriptor on one side. */
  kvbm_layout bare = w;
  assert_int_equal(kvbm_layout_attach_heads(&bare, NULL, NULL), KVBM_OK);
  expect_refused(&ours, &bare, KVBM_EINVAL, "peer");
  expect_refused(&bare, &ours, KVBM_EINVAL, "our");
  /* A descriptor edited after attaching no longer matches its layout. */
  kvbm_layout edited = ours;
  edited.heads.tp_size = 2; /* would hold 2 heads: inner_dim 16, not 8 */
  expect_refused(&edited, &w, KVBM_EINVAL, "inner_dim");
  edited = w;
  edited.config.inner_dim = 24;
  expect_refused(&ours, &edited, KVBM_EINVAL, "inner_dim");
}

/* kvbm_fabric_layout_bridge (a layer-for-layer copy) keeps its meaning:
 * without descriptors the shape alone; with them, the same heads too. */
static void layer_bridge_keeps_its_meaning(void **state) {
  (void)state;
  kvbm_error e;
  kvbm_layout a = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 0, 2);
  kvbm_layout b = rank_layout(KVBM_LAYOUT_LAYER_SEPARATE, 0, 2);
  assert_int_equal(kvbm_fabric_layout_bridge(&a, &b, &e), KVBM_OK);
  kvbm_layout other_rank = rank_layout(KVBM_LAYOUT_LAYER_SEPARATE, 1, 2);
  assert_int_equal(kvbm_fabric_layout_bridge(&a, &other_rank, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "tp_rank"));
  kvbm_layout tp4 = rank_layout(KVBM_LAYOUT_LAYER_SEPARATE, 0, 4);
  assert_int_equal(kvbm_fabric_layout_bridge(&a, &tp4, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "inner_dim")); /* the shape is checked first */
  /* Same shape (inner 16), another model shape: 4 heads of 4 on TP=1. */
  kvbm_layout_heads h = heads_of(0, 1);
  h.head_dim = 4;
  kvbm_layout c = custom(a.config, h);
  assert_int_equal(kvbm_fabric_layout_bridge(&a, &c, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "head_dim"));
  kvbm_layout mf = a;
  mf.heads.model_fingerprint ^= 2;
  assert_int_equal(kvbm_fabric_layout_bridge(&a, &mf, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "model_fingerprint"));
  /* Replicated TP=8 rank 1 holds head 0 alone, as TP=4 rank 0 does: the
   * same heads, a layer copy is right. */
  kvbm_layout r8 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 1, 8);
  kvbm_layout r4 = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 0, 4);
  assert_int_equal(kvbm_fabric_layout_bridge(&r8, &r4, &e), KVBM_OK);
  kvbm_layout r4b = rank_layout(KVBM_LAYOUT_FULLY_CONTIGUOUS, 1, 4);
  assert_int_equal(kvbm_fabric_layout_bridge(&r8, &r4b, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "tp_size"));
  /* Descriptor on one side only: today's rule, the shape. */
  kvbm_layout bare = b;
  assert_int_equal(kvbm_layout_attach_heads(&bare, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_layout_bridge(&other_rank, &bare, &e), KVBM_OK);
  kvbm_layout bare4 = tp4;
  assert_int_equal(kvbm_layout_attach_heads(&bare4, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_layout_bridge(&bare, &bare4, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "inner_dim"));
}

/* Refused reads leave the reader's block as it was. */
static void hostile_reads_change_nothing(void **state) {
  fx *x = *state;
  writer w[2];
  for (uint32_t r = 0; r < 2; r++) writer_make(&w[r], x->w, x->r, r, 2);
  reader_block rb;
  rb_make(&rb, 0, 1);
  kvbm_error e;
  /* Writer rank 1 missing: rank 0's heads are not read either. */
  kvbm_fabric_remote_set *only0[1] = {w[0].rs};
  assert_int_equal(kvbm_fabric_read_block_tp(x->r, only0, 1, 0, &rb.l, rb.layers, LAYERS, &e), KVBM_ENOTFOUND);
  assert_non_null(strstr(e.msg, "rank 1"));
  assert_int_equal(kvbm_fabric_flush(x->r, 1000, NULL), KVBM_OK);
  assert_true(rb_untouched(&rb));
  kvbm_fabric_remote_set *both[2] = {w[0].rs, w[1].rs};
  assert_int_equal(kvbm_fabric_read_block_tp(x->r, both, 2, BLOCKS, &rb.l, rb.layers, LAYERS, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_fabric_read_block_tp(x->r, both, 2, 0, &rb.l, rb.layers, LAYERS - 1, &e), KVBM_EINVAL);
  /* Two copies of one rank are not a deployment's ranks. */
  kvbm_fabric_remote_set *twice[2] = {w[0].rs, w[0].rs};
  assert_int_equal(kvbm_fabric_read_block_tp(x->r, twice, 2, 0, &rb.l, rb.layers, LAYERS, &e), KVBM_ENOTFOUND);
  /* Forged pieces: wrong rank for the set, heads that do not line up, too
   * many heads, none. */
  const kvbm_fabric_head_piece bad[] = {
      {.peer_rank = 1, .our_offset = 0, .peer_offset = 0, .num_heads = 2},
      {.peer_rank = 0, .our_offset = 1, .peer_offset = 0, .num_heads = 1},
      {.peer_rank = 0, .our_offset = 0, .peer_offset = 0, .num_heads = 3},
      {.peer_rank = 0, .our_offset = 0, .peer_offset = 1, .num_heads = 2},
      {.peer_rank = 0, .our_offset = 0, .peer_offset = 0, .num_heads = 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = kvbm_fabric_read_block_heads(x->r, w[0].rs, 0, &rb.l, rb.layers, LAYERS, &bad[i], &e);
    if (rc != KVBM_EINVAL) fail_msg("forged piece %zu: %s (%s)", i, kvbm_status_name(rc), e.msg);
  }
  /* A set imported on another fabric. */
  kvbm_fabric_head_piece good = {.peer_rank = 0, .our_offset = 0, .peer_offset = 0, .num_heads = 2};
  assert_int_equal(kvbm_fabric_read_block_heads(x->w, w[0].rs, 0, &rb.l, rb.layers, LAYERS, &good, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_flush(x->r, 1000, NULL), KVBM_OK);
  assert_true(rb_untouched(&rb));
  /* The one good piece: our heads 0-1 land, heads 2-3 keep the sentinel. */
  assert_int_equal(kvbm_fabric_read_block_heads(x->r, w[0].rs, 2, &rb.l, rb.layers, LAYERS, &good, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_flush(x->r, 1000, NULL), KVBM_OK);
  for (int ly = 0; ly < LAYERS; ly++)
    for (int o = 0; o < OUTER; o++)
      for (int t = 0; t < PAGE; t++) {
        const uint8_t *row = (const uint8_t *)rb.layers[ly] + o * rb.l.outer_stride + t * ROW_BYTES;
        assert_memory_equal(row, &ref[2][ly][o][t][0], 2 * HEAD_BYTES);
        for (int i = 2 * HEAD_BYTES; i < ROW_BYTES; i++) assert_int_equal(row[i], 0xAB);
      }
  rb_free(&rb);
  for (uint32_t r = 0; r < 2; r++) writer_free(&w[r]);
}

/* ---- The same over UCX: the writer ranks in another process ---- */

static const char kKey[] = "the shared secret of the tp bridge test";

static kvbm_fabric_ucx_config ucx_config(const char *name) {
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
  c.transports = "shm,self";
  c.net_devices = "lo";
  c.timeout_ms = 15000;
  return c;
}

#define CHILD_CHECK(cond)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "writer: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
      _exit(__LINE__ % 250 + 1);                                           \
    }                                                                      \
  } while (0)

/* The writer node: TP=2 ranks' memory registered, both exports pushed,
 * then it waits for the reader's "done" before letting the memory go. */
static void ucx_writer(uint16_t port) {
  kvbm_fabric_ucx_config c = ucx_config("writer");
  kvbm_fabric *f;
  kvbm_error e;
  CHILD_CHECK(kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e) == KVBM_OK);
  writer w[2];
  for (uint32_t r = 0; r < 2; r++) {
    CHILD_CHECK(writer_fill(&w[r], r, 2) == KVBM_OK);
    CHILD_CHECK(kvbm_fabric_register(f, &w[r].ts.desc, &w[r].ls, &e) == KVBM_OK);
    uint8_t *wire;
    size_t len;
    kvbm_fabric_handle h;
    CHILD_CHECK(kvbm_fabric_export(w[r].ls, &wire, &len, &e) == KVBM_OK);
    CHILD_CHECK(kvbm_fabric_push(f, wire, len, &h, &e) == KVBM_OK);
    CHILD_CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);
    free(wire);
  }
  kvbm_fabric_handle h;
  size_t len;
  char done[8];
  CHILD_CHECK(kvbm_fabric_next(f, 30000, &h, &len, &e) == KVBM_OK);
  CHILD_CHECK(kvbm_fabric_pull(f, h, done, sizeof done, &len, 15000, &e) == KVBM_OK);
  CHILD_CHECK(len == 4 && memcmp(done, "done", 4) == 0);
  for (uint32_t r = 0; r < 2; r++) {
    kvbm_fabric_local_set_release(w[r].ls);
    test_set_free(&w[r].ts);
  }
  kvbm_fabric_destroy(f);
  _exit(0);
}

static void tp2_read_by_tp1_and_tp4_over_ucx(void **state) {
  (void)state;
  test_pattern(ref, sizeof ref, 23);
  kvbm_fabric_ucx_config c = ucx_config("reader");
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    ucx_writer(port);
  }
  kvbm_fabric *f;
  int rc = kvbm_fabric_ucx_accept(l, &f, &e);
  kvbm_fabric_listener_destroy(l);
  if (rc) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("accept: %s", e.msg);
  }
  kvbm_fabric_remote_set *peers[2];
  for (int r = 0; r < 2; r++) {
    kvbm_fabric_handle h;
    size_t len;
    assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
    uint8_t *wire = malloc(len);
    assert_int_equal(kvbm_fabric_pull(f, h, wire, len, &len, 15000, &e), KVBM_OK);
    assert_int_equal(kvbm_fabric_import(f, wire, len, &peers[r], &e), KVBM_OK);
    free(wire);
    assert_int_equal(kvbm_fabric_remote_desc(peers[r])->layout.has_heads, 1);
    assert_int_equal(kvbm_fabric_remote_desc(peers[r])->layout.heads.tp_rank, r);
  }
  const uint32_t tps[] = {1, 4};
  for (int k = 0; k < 2; k++)
    for (uint32_t rr = 0; rr < tps[k]; rr++) {
      reader_block rb;
      rb_make(&rb, rr, tps[k]);
      for (uint64_t b = 0; b < BLOCKS; b++) {
        for (int ly = 0; ly < LAYERS; ly++) memset(rb.layers[ly], 0xAB, rb.l.layer_stride);
        rc = kvbm_fabric_read_block_tp(f, peers, 2, b, &rb.l, rb.layers, LAYERS, &e);
        if (rc) fail_msg("ucx read: %s", e.msg);
        assert_int_equal(kvbm_fabric_flush(f, 15000, &e), KVBM_OK);
        rb_check(&rb, b);
      }
      rb_free(&rb);
    }
  for (int r = 0; r < 2; r++) kvbm_fabric_remote_set_release(peers[r]);
  kvbm_fabric_handle h;
  assert_int_equal(kvbm_fabric_push(f, "done", 4, &h, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_flush(f, 15000, &e), KVBM_OK);
  kvbm_fabric_destroy(f);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("writer failed: status %d", status);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(head_maps),
      cmocka_unit_test(refusals_name_the_field),
      cmocka_unit_test(layer_bridge_keeps_its_meaning),
      cmocka_unit_test_setup_teardown(tp2_read_by_tp1, setup, teardown),
      cmocka_unit_test_setup_teardown(tp2_read_by_tp4, setup, teardown),
      cmocka_unit_test_setup_teardown(tp2_read_by_tp8_replicated, setup, teardown),
      cmocka_unit_test_setup_teardown(tp8_replicated_read_by_tp1, setup, teardown),
      cmocka_unit_test_setup_teardown(tp4_read_by_tp2, setup, teardown),
      cmocka_unit_test_setup_teardown(tp1_read_by_tp2, setup, teardown),
      cmocka_unit_test_setup_teardown(tp2_read_by_tp2, setup, teardown),
      cmocka_unit_test_setup_teardown(hostile_reads_change_nothing, setup, teardown),
      cmocka_unit_test(tp2_read_by_tp1_and_tp4_over_ucx),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
