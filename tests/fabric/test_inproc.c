/* SPDX-License-Identifier: Apache-2.0 */
/* test_inproc.c: the fabric interface over the in-process fabric: push /
 * next / pull, labels, block set export/import, one-sided block access and
 * every refusal (ranges, stale registrations, malformed envelopes). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "fabric/fabric_impl.h"
#include "fabric/fabric_util.h"
#include "kvbm/metrics.h"
#include "metrics/page_testutil.h"

static void pair(kvbm_fabric **a, kvbm_fabric **b) {
  assert_int_equal(kvbm_fabric_inproc_pair("node-a", "node-b", a, b, NULL), KVBM_OK);
}

/* The label is the transport's (ADR-0006: a synthetic fabric says
 * "nixl-synth"), whatever the ends are named; names are the nodes'. */
static void test_labels_and_names(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  assert_string_equal(kvbm_fabric_kind(a), "inproc");
  assert_string_equal(kvbm_fabric_label(a), "nixl-synth");
  assert_string_equal(kvbm_fabric_label(b), "nixl-synth");
  assert_string_equal(kvbm_fabric_name(a), "node-a");
  assert_string_equal(kvbm_fabric_peer_name(a), "node-b");
  assert_string_equal(kvbm_fabric_name(b), "node-b");
  assert_string_equal(kvbm_fabric_peer_name(b), "node-a");
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
  assert_string_equal(kvbm_fabric_label(NULL), "");

  assert_int_equal(kvbm_fabric_inproc_pair(NULL, NULL, &a, &b, NULL), KVBM_OK);
  assert_string_equal(kvbm_fabric_name(a), "inproc-a");
  assert_string_equal(kvbm_fabric_label(a), "nixl-synth");
  kvbm_fabric_destroy(b);
  kvbm_fabric_destroy(a);

  kvbm_error e;
  assert_int_equal(kvbm_fabric_inproc_pair("", "x", &a, &b, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_inproc_pair("bad\nname", "x", &a, &b, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "node name"));
  char longl[80];
  memset(longl, 'x', sizeof longl - 1);
  longl[79] = 0;
  assert_int_equal(kvbm_fabric_inproc_pair("a", longl, &a, &b, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_inproc_pair("a", "b", NULL, &b, &e), KVBM_EINVAL);
}

static void test_push_pull(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  kvbm_fabric_handle h1, h2, h3, h;
  assert_int_equal(kvbm_fabric_push(a, "hello", 5, &h1, NULL), KVBM_OK);
  char big[5000];
  test_pattern(big, sizeof big, 7);
  assert_int_equal(kvbm_fabric_push(a, big, sizeof big, &h2, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_push(a, NULL, 0, &h3, NULL), KVBM_OK);
  assert_true(h1.id < h2.id && h2.id < h3.id);

  /* next returns each once, oldest first, with sizes */
  size_t len;
  assert_int_equal(kvbm_fabric_next(b, 0, &h, &len, NULL), KVBM_OK);
  assert_int_equal(h.id, h1.id);
  assert_int_equal(len, 5);
  assert_int_equal(kvbm_fabric_next(b, 0, &h, &len, NULL), KVBM_OK);
  assert_int_equal(h.id, h2.id);
  assert_int_equal(len, sizeof big);
  assert_int_equal(kvbm_fabric_next(b, 0, &h, &len, NULL), KVBM_OK);
  assert_int_equal(len, 0);
  kvbm_error e;
  assert_int_equal(kvbm_fabric_next(b, 20, &h, &len, &e), KVBM_ETIMEDOUT);
  /* nothing went the other way */
  assert_int_equal(kvbm_fabric_next(a, 0, &h, &len, NULL), KVBM_ETIMEDOUT);

  /* pull out of order; too small a buffer keeps the payload */
  char out[6000];
  assert_int_equal(kvbm_fabric_pull(b, h2, out, 100, &len, 0, &e), KVBM_ETOOLONG);
  assert_non_null(strstr(e.msg, "5000"));
  assert_int_equal(kvbm_fabric_pull(b, h2, out, sizeof out, &len, 0, NULL), KVBM_OK);
  assert_int_equal(len, sizeof big);
  assert_memory_equal(out, big, sizeof big);
  assert_int_equal(kvbm_fabric_pull(b, h2, out, sizeof out, &len, 0, &e), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_fabric_pull(b, h1, out, 5, &len, 0, NULL), KVBM_OK);
  assert_memory_equal(out, "hello", 5);
  assert_int_equal(kvbm_fabric_pull(b, h3, NULL, 0, &len, 0, NULL), KVBM_OK);
  assert_int_equal(len, 0);
  /* a payload not pushed yet: waits, then times out */
  kvbm_fabric_handle future = {h3.id + 1};
  assert_int_equal(kvbm_fabric_pull(b, future, out, sizeof out, &len, 10, &e), KVBM_ETIMEDOUT);
  kvbm_fabric_handle zero = {0};
  assert_int_equal(kvbm_fabric_pull(b, zero, out, sizeof out, &len, 0, &e), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_fabric_flush(a, 0, NULL), KVBM_OK);
  /* counted: what moved; not the refusals, the buffer too small, the
   * timeouts */
  kvbm_fabric_stats sa, sb;
  kvbm_fabric_stats_get(a, &sa);
  kvbm_fabric_stats_get(b, &sb);
  assert_int_equal(sa.pushes, 3);
  assert_int_equal(sa.push_bytes, 5 + sizeof big);
  assert_int_equal(sa.pulls, 0);
  assert_int_equal(sb.pulls, 3);
  assert_int_equal(sb.pull_bytes, 5 + sizeof big);
  assert_int_equal(sb.pushes, 0);
  assert_int_equal(sa.failures + sb.failures, 0);

  /* bad arguments */
  assert_int_equal(kvbm_fabric_push(NULL, "x", 1, &h, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_push(a, NULL, 3, &h, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_next(b, 0, NULL, &len, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_pull(b, h1, NULL, 4, &len, 0, &e), KVBM_EINVAL);

  /* the peer closes: pushes fail, what is left can still be pulled */
  assert_int_equal(kvbm_fabric_push(b, "last", 4, &h, NULL), KVBM_OK);
  kvbm_fabric_destroy(b);
  assert_int_equal(kvbm_fabric_push(a, "x", 1, NULL, &e), KVBM_ECLOSED);
  kvbm_fabric_handle got;
  assert_int_equal(kvbm_fabric_next(a, 0, &got, &len, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_pull(a, got, out, sizeof out, &len, 0, NULL), KVBM_OK);
  assert_memory_equal(out, "last", 4);
  assert_int_equal(kvbm_fabric_next(a, 100, &got, &len, &e), KVBM_ECLOSED);
  got.id = 99;
  assert_int_equal(kvbm_fabric_pull(a, got, out, sizeof out, &len, 100, &e), KVBM_ECLOSED);
  /* the push and the pull the closed peer failed */
  kvbm_fabric_stats_get(a, &sa);
  assert_int_equal(sa.failures, 2);
  assert_int_equal(sa.pushes, 3);
  assert_int_equal(sa.pulls, 1);
  assert_int_equal(sa.pull_bytes, 4);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(NULL);
}

/* Two threads, one per end: every payload arrives once, intact, in order. */
#define THREAD_MSGS 2000
static void *echo_thread(void *arg) {
  kvbm_fabric *b = arg;
  for (int i = 0; i < THREAD_MSGS; i++) {
    kvbm_fabric_handle h;
    size_t len;
    char buf[64];
    if (kvbm_fabric_next(b, 5000, &h, &len, NULL)) return (void *)1;
    if (kvbm_fabric_pull(b, h, buf, sizeof buf, &len, 0, NULL)) return (void *)2;
    if (kvbm_fabric_push(b, buf, len, NULL, NULL)) return (void *)3;
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, echo_thread, b), 0);
  int sent = 0, got = 0;
  while (got < THREAD_MSGS) {
    if (sent < THREAD_MSGS && sent - got < 16) {
      char msg[32];
      int n = snprintf(msg, sizeof msg, "msg %d", sent);
      assert_int_equal(kvbm_fabric_push(a, msg, (size_t)n, NULL, NULL), KVBM_OK);
      sent++;
      continue;
    }
    kvbm_fabric_handle h;
    char buf[64], want[32];
    size_t len;
    assert_int_equal(kvbm_fabric_next(a, 5000, &h, &len, NULL), KVBM_OK);
    assert_int_equal(kvbm_fabric_pull(a, h, buf, sizeof buf, &len, 0, NULL), KVBM_OK);
    int n = snprintf(want, sizeof want, "msg %d", got);
    assert_int_equal(len, (size_t)n);
    assert_memory_equal(buf, want, (size_t)n);
    got++;
  }
  void *res;
  pthread_join(t, &res);
  assert_null(res);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

/* A writes every block of B's set, reads them back, and B sees its memory
 * hold exactly what was written; for both layout kinds. */
static void blocks_roundtrip(kvbm_layout_kind kind) {
  kvbm_fabric *a, *b;
  pair(&a, &b);
  test_set tb;
  assert_int_equal(test_set_make(&tb, kind, 6, 3, 42), KVBM_OK);
  kvbm_fabric_local_set *ls;
  assert_int_equal(kvbm_fabric_register(b, &tb.desc, &ls, NULL), KVBM_OK);
  uint8_t *wire;
  size_t wlen;
  assert_int_equal(kvbm_fabric_export(ls, &wire, &wlen, NULL), KVBM_OK);

  kvbm_fabric_remote_set *rs;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_import(a, wire, wlen, &rs, &e), KVBM_OK);
  const kvbm_layout_desc *rd = kvbm_fabric_remote_desc(rs);
  assert_int_equal(rd->block_set_id, 42);
  assert_int_equal(rd->layout.kind, kind);
  assert_int_equal(rd->layout.config.num_blocks, 6);
  assert_int_equal(rd->region_base[0], tb.desc.region_base[0]);

  size_t bb = kvbm_fabric_block_bytes(&rd->layout);
  assert_int_equal(bb, 3 * 2 * 4 * 8 * 2);
  unsigned char *src = malloc(bb), *back = malloc(bb), *mem = malloc(bb);
  for (uint64_t blk = 0; blk < 6; blk++) {
    test_pattern(src, bb, blk + 100);
    assert_int_equal(kvbm_fabric_write_block(a, rs, blk, src, bb, NULL), KVBM_OK);
  }
  assert_int_equal(kvbm_fabric_flush(a, 1000, NULL), KVBM_OK);
  for (uint64_t blk = 0; blk < 6; blk++) {
    test_pattern(src, bb, blk + 100);
    test_set_block(&tb, blk, mem);
    assert_memory_equal(mem, src, bb);
    memset(back, 0, bb);
    assert_int_equal(kvbm_fabric_read_block(a, rs, blk, back, bb, NULL), KVBM_OK);
    assert_int_equal(kvbm_fabric_flush(a, 1000, NULL), KVBM_OK);
    assert_memory_equal(back, src, bb);
  }
  /* the writer's counters and its page: one access per block and layer */
  uint64_t nl = kind == KVBM_LAYOUT_FULLY_CONTIGUOUS ? 1 : rd->layout.config.num_layers;
  kvbm_fabric_stats st;
  kvbm_fabric_stats_get(a, &st);
  assert_int_equal(st.writes, 6 * nl);
  assert_int_equal(st.write_bytes, 6 * bb);
  assert_int_equal(st.reads, 6 * nl);
  assert_int_equal(st.read_bytes, 6 * bb);
  kvbm_metrics *reg;
  assert_int_equal(kvbm_metrics_create(&reg, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(reg, kvbm_fabric_metrics_collect, a,
                                         (kvbm_metric_label[]){{"peer", "node-b"}}, 1, NULL, NULL),
                   KVBM_OK);
  char *page = page_render(reg);
  assert_non_null(page);
  assert_true(page_value(page, "kvbm_fabric_ops_total{op=\"write\",peer=\"node-b\"}") ==
              (double)(6 * nl));
  assert_true(page_value(page, "kvbm_fabric_bytes_total{op=\"read\",peer=\"node-b\"}") ==
              (double)(6 * bb));
  assert_true(page_value(page, "kvbm_fabric_ops_total{op=\"push\",peer=\"node-b\"}") == 0);
  assert_true(page_value(page, "kvbm_fabric_failures_total{peer=\"node-b\"}") == 0);
  char missing[256];
  if (page_undocumented(page, missing, sizeof missing)) fail_msg("%s is not documented", missing);
  kvbm_metrics_text_free(page);
  kvbm_metrics_destroy(reg);
  /* refusals: block id, buffer size, region/offset ranges */
  assert_int_equal(kvbm_fabric_write_block(a, rs, 6, src, bb, &e), KVBM_ERANGE);
  assert_non_null(strstr(e.msg, "block 6"));
  assert_int_equal(kvbm_fabric_read_block(a, rs, UINT64_MAX, back, bb, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_fabric_write_block(a, rs, 0, src, bb - 1, &e), KVBM_EINVAL);
  uint64_t rsz = rd->layout.region_size;
  assert_int_equal(kvbm_fabric_write(a, rs, 0, rsz - 4, src, 5, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_fabric_write(a, rs, 0, rsz - 4, src, 4, &e), KVBM_OK);
  kvbm_fabric_stats_get(a, &st);
  assert_int_equal(st.writes, 6 * nl + 1); /* the refusals above were not counted */
  assert_int_equal(st.write_bytes, 6 * bb + 4);
  assert_int_equal(kvbm_fabric_write(a, rs, 0, UINT64_MAX, src, 2, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_fabric_read(a, rs, rd->num_regions, 0, back, 1, &e), KVBM_ERANGE);
  /* a remote set can only be used on the fabric that imported it */
  assert_int_equal(kvbm_fabric_write_block(b, rs, 0, src, bb, &e), KVBM_EINVAL);

  /* once B unregisters, A's accesses are refused, not performed */
  kvbm_fabric_local_set_release(ls);
  assert_int_equal(kvbm_fabric_write_block(a, rs, 0, src, bb, &e), KVBM_ERANGE);
  /* and a fresh import of the stale export is refused too */
  kvbm_fabric_remote_set *rs2;
  assert_int_equal(kvbm_fabric_import(a, wire, wlen, &rs2, &e), KVBM_ERANGE);

  kvbm_fabric_remote_set_release(rs);
  free(wire);
  free(src);
  free(back);
  free(mem);
  test_set_free(&tb);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

/* A layout of the test shape with another kind, alignment and size. */
static kvbm_layout shaped(kvbm_layout_kind kind, uint64_t blocks, uint64_t alignment) {
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = 3, .outer_dim = 2, .page_size = 4,
                          .inner_dim = 8, .dtype_size = 2, .alignment = alignment};
  kvbm_layout l;
  assert_int_equal(kvbm_layout_init(&l, kind, &c, NULL), KVBM_OK);
  return l;
}

/* Per-layer pointers of block b of `l` laid out in `regions`. */
static void layer_ptrs(const kvbm_layout *l, void *const *regions, uint64_t b, void **out) {
  for (uint64_t layer = 0; layer < l->config.num_layers; layer++) {
    kvbm_slice s;
    assert_int_equal(kvbm_layout_block_layer(l, b, layer, &s, NULL), KVBM_OK);
    out[layer] = (char *)regions[s.region] + s.offset;
  }
}

/* Blocks cross layouts that differ in kind, alignment and block count,
 * both ways (FullyContiguous -> LayerSeparate and back), gathered and
 * scattered layer by layer; shapes that differ are refused by name. */
static void test_layout_bridge(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  for (int dir = 0; dir < 2; dir++) {
    kvbm_layout_kind mine = dir ? KVBM_LAYOUT_LAYER_SEPARATE : KVBM_LAYOUT_FULLY_CONTIGUOUS;
    kvbm_layout_kind theirs = dir ? KVBM_LAYOUT_FULLY_CONTIGUOUS : KVBM_LAYOUT_LAYER_SEPARATE;
    /* A's local blocks: 4 of them, alignment 256 */
    kvbm_layout la = shaped(mine, 4, 256);
    void *regions[3] = {0};
    for (uint64_t r = 0; r < la.num_regions; r++) {
      assert_int_equal(posix_memalign(&regions[r], 256, la.region_size), 0);
      test_pattern(regions[r], la.region_size, 7 + r);
    }
    /* B's: 6 blocks, alignment 64 (test_set's) */
    test_set tb;
    assert_int_equal(test_set_make(&tb, theirs, 6, 3, 77), KVBM_OK);
    assert_int_equal(kvbm_fabric_layout_bridge(&la, &tb.desc.layout, NULL), KVBM_OK);
    kvbm_fabric_local_set *ls;
    assert_int_equal(kvbm_fabric_register(b, &tb.desc, &ls, NULL), KVBM_OK);
    uint8_t *wire;
    size_t wlen;
    assert_int_equal(kvbm_fabric_export(ls, &wire, &wlen, NULL), KVBM_OK);
    /* the export's layout, read without importing it */
    kvbm_layout peek;
    assert_int_equal(kvbm_fabric_export_layout(wire, wlen, &peek, NULL), KVBM_OK);
    assert_memory_equal(&peek, &tb.desc.layout, sizeof peek);
    assert_int_equal(kvbm_fabric_export_layout(wire, wlen - 1, &peek, NULL), KVBM_ETRUNCATED);
    kvbm_fabric_remote_set *rs;
    assert_int_equal(kvbm_fabric_import(a, wire, wlen, &rs, NULL), KVBM_OK);
    uint64_t ls_bytes = la.layer_stride;
    void *ptrs[3];
    /* A's block 2 -> B's block 5, A's block 1 -> B's block 0 */
    layer_ptrs(&la, regions, 2, ptrs);
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 5, (const void *const *)ptrs, 3, ls_bytes, NULL), KVBM_OK);
    layer_ptrs(&la, regions, 1, ptrs);
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 0, (const void *const *)ptrs, 3, ls_bytes, NULL), KVBM_OK);
    assert_int_equal(kvbm_fabric_flush(a, 1000, NULL), KVBM_OK);
    size_t bb = 3 * ls_bytes;
    unsigned char *want = malloc(bb), *got = malloc(bb);
    for (int k = 0; k < 2; k++) {
      uint64_t from = k ? 1 : 2, to = k ? 0 : 5;
      layer_ptrs(&la, regions, from, ptrs);
      for (int l = 0; l < 3; l++) memcpy(want + l * ls_bytes, ptrs[l], ls_bytes);
      test_set_block(&tb, to, got);
      assert_memory_equal(got, want, bb);
    }
    /* read back B's block 5 into A's block 3 (scatter into A's layout) */
    layer_ptrs(&la, regions, 3, ptrs);
    assert_int_equal(kvbm_fabric_read_block_layers(a, rs, 5, ptrs, 3, ls_bytes, NULL), KVBM_OK);
    assert_int_equal(kvbm_fabric_flush(a, 1000, NULL), KVBM_OK);
    layer_ptrs(&la, regions, 2, ptrs);
    for (int l = 0; l < 3; l++) memcpy(want + l * ls_bytes, ptrs[l], ls_bytes);
    layer_ptrs(&la, regions, 3, ptrs);
    for (int l = 0; l < 3; l++) assert_memory_equal(ptrs[l], want + l * ls_bytes, ls_bytes);
    /* refusals, before any byte moves */
    kvbm_error e;
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 6, (const void *const *)ptrs, 3, ls_bytes, &e),
                     KVBM_ERANGE);
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 0, (const void *const *)ptrs, 2, ls_bytes, &e),
                     KVBM_EINVAL);
    assert_non_null(strstr(e.msg, "2 layers"));
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 0, (const void *const *)ptrs, 3, ls_bytes + 2, &e),
                     KVBM_EINVAL);
    ptrs[1] = NULL;
    assert_int_equal(kvbm_fabric_write_block_layers(a, rs, 0, (const void *const *)ptrs, 3, ls_bytes, &e),
                     KVBM_EINVAL);
    kvbm_fabric_remote_set_release(rs);
    kvbm_fabric_local_set_release(ls);
    free(wire);
    free(want);
    free(got);
    test_set_free(&tb);
    for (uint64_t r = 0; r < la.num_regions; r++) free(regions[r]);
  }
  /* shapes that cannot be bridged, each named */
  static const struct {
    const char *field;
    uint64_t layers, outer, page, inner, dtype;
  } bad[] = {{"num_layers 3 here, 4", 4, 2, 4, 8, 2}, {"outer_dim 2 here, 1", 3, 1, 4, 8, 2},
             {"page_size 4 here, 16", 3, 2, 16, 8, 2}, {"inner_dim 8 here, 16", 3, 2, 4, 16, 2},
             {"dtype_size 2 here, 4", 3, 2, 4, 8, 4}};
  kvbm_layout ours = shaped(KVBM_LAYOUT_FULLY_CONTIGUOUS, 4, 64);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvbm_layout_config c = {.num_blocks = 4, .num_layers = bad[i].layers, .outer_dim = bad[i].outer,
                            .page_size = bad[i].page, .inner_dim = bad[i].inner, .dtype_size = bad[i].dtype,
                            .alignment = 64};
    kvbm_layout t;
    assert_int_equal(kvbm_layout_init(&t, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL), KVBM_OK);
    kvbm_error e;
    assert_int_equal(kvbm_fabric_layout_bridge(&ours, &t, &e), KVBM_EUNSUPPORTED);
    if (!strstr(e.msg, bad[i].field)) fail_msg("'%s' does not name '%s'", e.msg, bad[i].field);
  }
  assert_int_equal(kvbm_fabric_layout_bridge(&ours, NULL, NULL), KVBM_EINVAL);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

static void test_blocks_contiguous(void **state) {
  (void)state;
  blocks_roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS);
}

static void test_blocks_layer_separate(void **state) {
  (void)state;
  blocks_roundtrip(KVBM_LAYOUT_LAYER_SEPARATE);
}

/* Envelopes whose layout reaches outside the registered extent are refused
 * at import, before any transfer could happen. */
static void test_import_outside_extent(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  test_set tb;
  assert_int_equal(test_set_make(&tb, KVBM_LAYOUT_FULLY_CONTIGUOUS, 4, 2, 1), KVBM_OK);
  kvbm_fabric_local_set *ls;
  assert_int_equal(kvbm_fabric_register(b, &tb.desc, &ls, NULL), KVBM_OK);
  const kvbm_fabric_local_region *lr = &ls->regions[0];
  uint64_t size = tb.desc.layout.region_size;

  struct {
    uint64_t layout_base, ext_base, ext_len;
    int want;
  } cases[] = {
      {lr->base, lr->base, size, KVBM_OK},                 /* exact */
      {lr->base, lr->base, size - 1, KVBM_ERANGE},         /* extent one byte short */
      {lr->base + 64, lr->base, size, KVBM_ERANGE},        /* layout shifted past the end */
      {lr->base, lr->base + 64, size, KVBM_ERANGE},        /* layout starts before the extent */
      {lr->base, lr->base, UINT64_MAX, KVBM_ERANGE},       /* extent wraps */
      {lr->base, 0, 0, KVBM_ERANGE},                       /* empty extent */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kvbm_layout_desc d = tb.desc;
    uint64_t base = cases[i].layout_base;
    d.region_base = &base;
    kvbm_fabric_wire_region w = {cases[i].ext_base, cases[i].ext_len, lr->key, (uint32_t)lr->key_len};
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvbm__fabric_wire_encode(&d, &w, &buf, &len, NULL), KVBM_OK);
    kvbm_fabric_remote_set *rs = NULL;
    kvbm_error e;
    int rc = kvbm_fabric_import(a, buf, len, &rs, &e);
    if (rc != cases[i].want) fail_msg("case %zu: got %s (%s)", i, kvbm_status_name(rc), e.msg);
    if (rc == KVBM_OK) kvbm_fabric_remote_set_release(rs);
    free(buf);
  }

  /* A key naming a registration the peer never made. */
  kvbm_layout_desc d = tb.desc;
  uint8_t fake[8] = {0xee, 0xee, 0, 0, 0, 0, 0, 0};
  kvbm_fabric_wire_region w = {lr->base, size, fake, 8};
  uint8_t *buf;
  size_t len;
  assert_int_equal(kvbm__fabric_wire_encode(&d, &w, &buf, &len, NULL), KVBM_OK);
  kvbm_fabric_remote_set *rs;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_import(a, buf, len, &rs, &e), KVBM_ERANGE);
  /* A fabric cannot import its own registration as the peer's. */
  uint8_t *own;
  size_t own_len;
  assert_int_equal(kvbm_fabric_export(ls, &own, &own_len, NULL), KVBM_OK);
  assert_int_equal(kvbm_fabric_import(b, own, own_len, &rs, &e), KVBM_ERANGE);
  free(own);
  free(buf);

  kvbm_fabric_local_set_release(ls);
  test_set_free(&tb);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

/* Every kind of malformed envelope gets its own error; every truncation of a
 * good one is refused without a crash. */
static void test_import_malformed(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  test_set tb;
  assert_int_equal(test_set_make(&tb, KVBM_LAYOUT_LAYER_SEPARATE, 4, 3, 9), KVBM_OK);
  kvbm_fabric_local_set *ls;
  assert_int_equal(kvbm_fabric_register(b, &tb.desc, &ls, NULL), KVBM_OK);
  uint8_t *good;
  size_t glen;
  assert_int_equal(kvbm_fabric_export(ls, &good, &glen, NULL), KVBM_OK);
  uint8_t *buf = malloc(glen + 8);
  kvbm_fabric_remote_set *rs;
  kvbm_error e;

  for (size_t n = 0; n < glen; n++) {
    memcpy(buf, good, n);
    int rc = kvbm_fabric_import(a, buf, n, &rs, &e);
    if (rc != KVBM_ETRUNCATED) fail_msg("truncated to %zu: %s (%s)", n, kvbm_status_name(rc), e.msg);
  }
  memcpy(buf, good, glen);
  buf[glen] = 0;
  assert_int_equal(kvbm_fabric_import(a, buf, glen + 1, &rs, &e), KVBM_ETOOLONG);

#define MUTATE(off, val, want)                                        \
  do {                                                                \
    memcpy(buf, good, glen);                                          \
    buf[off] = (uint8_t)(val);                                        \
    int rc_ = kvbm_fabric_import(a, buf, glen, &rs, &e);              \
    if (rc_ != (want))                                                \
      fail_msg("byte %d = %d: %s (%s)", (int)(off), (int)(val), kvbm_status_name(rc_), e.msg); \
  } while (0)
  MUTATE(0, 'X', KVBM_EMAGIC);
  MUTATE(4, 2, KVBM_EVERSION);
  MUTATE(12, 1, KVBM_EPADDING);
  MUTATE(8, 2, KVBM_EFORMAT);                 /* region count differs from the layout's */
  MUTATE(KVBM_FABRIC_WIRE_HEADER, 'Z', KVBM_EMAGIC); /* the layout's own magic */
  size_t lay = kvbm_layout_desc_encoded_size(&tb.desc);
  size_t r0 = KVBM_FABRIC_WIRE_HEADER + lay;
  MUTATE(r0 + 20, 1, KVBM_EPADDING);          /* region reserved */
  MUTATE(r0 + 18, 1, KVBM_EFORMAT);           /* key length 65536 + 8 */
  MUTATE(r0 + 16, 200, KVBM_ETRUNCATED);      /* key longer than the input */
  MUTATE(r0 + 9, 0, KVBM_ERANGE);             /* registered length shrunk to 0 */
  MUTATE(r0 + 7, 0x80, KVBM_ERANGE);          /* registered base moved far away */
  assert_int_equal(kvbm_fabric_import(a, NULL, 0, &rs, &e), KVBM_ETRUNCATED);

  free(buf);
  free(good);
  kvbm_fabric_local_set_release(ls);
  test_set_free(&tb);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

static void test_register_refusals(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  test_set tb;
  assert_int_equal(test_set_make(&tb, KVBM_LAYOUT_FULLY_CONTIGUOUS, 4, 2, 1), KVBM_OK);
  kvbm_fabric_local_set *ls;
  kvbm_error e;
  kvbm_layout_desc d = tb.desc;
  d.memory = KVBM_MEMORY_DISK;
  assert_int_equal(kvbm_fabric_register(a, &d, &ls, &e), KVBM_EUNSUPPORTED);
  d = tb.desc;
  d.memory = KVBM_MEMORY_DEVICE;
  d.device_id = 0;
  assert_int_equal(kvbm_fabric_register(a, &d, &ls, &e), KVBM_EUNSUPPORTED);
  d = tb.desc;
  d.num_regions = 2;
  assert_int_equal(kvbm_fabric_register(a, &d, &ls, &e), KVBM_EINVAL);
  d = tb.desc;
  uint64_t zero = 0;
  d.region_base = &zero;
  assert_int_equal(kvbm_fabric_register(a, &d, &ls, &e), KVBM_EINVAL);
  d = tb.desc;
  uint64_t odd = tb.desc.region_base[0] + 1; /* not aligned: the layout codec refuses */
  d.region_base = &odd;
  assert_int_not_equal(kvbm_fabric_register(a, &d, &ls, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_register(a, NULL, &ls, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_register(NULL, &tb.desc, &ls, &e), KVBM_EINVAL);

  /* A DEVICE layout exported by someone cannot be imported here. */
  d = tb.desc;
  d.memory = KVBM_MEMORY_DEVICE;
  d.device_id = 0;
  kvbm_fabric_wire_region w = {tb.desc.region_base[0], tb.desc.layout.region_size, (const uint8_t *)"k", 1};
  uint8_t *buf;
  size_t len;
  assert_int_equal(kvbm__fabric_wire_encode(&d, &w, &buf, &len, NULL), KVBM_OK);
  kvbm_fabric_remote_set *rs;
  assert_int_equal(kvbm_fabric_import(a, buf, len, &rs, &e), KVBM_EUNSUPPORTED);
  free(buf);
  test_set_free(&tb);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

/* Fabric-allocated storage: page-aligned regions, usable as a block set. */
static void test_fabric_storage(void **state) {
  (void)state;
  kvbm_fabric *a, *b;
  pair(&a, &b);
  test_set ts;
  assert_int_equal(test_set_make_fabric(&ts, b, KVBM_LAYOUT_LAYER_SEPARATE, 3, 2, 5), KVBM_OK);
  assert_string_equal(ts.storage->vt->name, "fabric");
  assert_int_equal(ts.storage->vt->num_regions(ts.storage), 2);
  assert_null(ts.storage->vt->region_base(ts.storage, 2));
  for (int r = 0; r < 2; r++) assert_int_equal((uintptr_t)ts.region[r] % 4096, 0);
  kvbm_fabric_local_set *ls;
  assert_int_equal(kvbm_fabric_register(b, &ts.desc, &ls, NULL), KVBM_OK);
  uint8_t *wire;
  size_t wlen;
  assert_int_equal(kvbm_fabric_export(ls, &wire, &wlen, NULL), KVBM_OK);
  kvbm_fabric_remote_set *rs;
  assert_int_equal(kvbm_fabric_import(a, wire, wlen, &rs, NULL), KVBM_OK);
  size_t bb = kvbm_fabric_block_bytes(&ts.desc.layout);
  unsigned char *src = malloc(bb), *got = malloc(bb);
  test_pattern(src, bb, 11);
  assert_int_equal(kvbm_fabric_write_block(a, rs, 2, src, bb, NULL), KVBM_OK);
  test_set_block(&ts, 2, got);
  assert_memory_equal(got, src, bb);
  kvbm_layout big = ts.desc.layout;
  big.config.alignment = 8192;
  kvbm_storage *s2;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_storage_create(a, &big, &s2, &e), KVBM_EUNSUPPORTED);
  assert_int_equal(kvbm_fabric_storage_create(NULL, &big, &s2, &e), KVBM_EINVAL);
  kvbm_fabric_remote_set_release(rs);
  kvbm_fabric_local_set_release(ls);
  test_set_free(&ts);
  free(wire);
  free(src);
  free(got);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_labels_and_names),
      cmocka_unit_test(test_push_pull),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_blocks_contiguous),
      cmocka_unit_test(test_layout_bridge),
      cmocka_unit_test(test_blocks_layer_separate),
      cmocka_unit_test(test_import_outside_extent),
      cmocka_unit_test(test_import_malformed),
      cmocka_unit_test(test_register_refusals),
      cmocka_unit_test(test_fabric_storage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
