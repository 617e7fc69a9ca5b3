/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_tp_bridge.c: what reading blocks across TP sizes costs (issue 19),
 * W4's block shape (WORKLOADS.md: 32 layers, K and V, 16 tokens, 8 KV heads
 * of 128 bfloat16 elements: 2 MiB a block at TP=1).
 *
 * Two TP=2 writer ranks (1 MiB of each block each) are registered on one
 * end of the in-process fabric (label "nixl-synth": a memcpy per read under
 * a lock, not a transport) and read from the other end by
 *   tp1   a TP=1 reader: every block gathered from both writers, one read
 *         per (layer, outer, token) row piece of 4 heads (1 KiB);
 *   tp4   a TP=4 reader (rank 1): half of writer rank 0's heads, one read
 *         per 512-byte row piece;
 *   tp2   a TP=2 reader of its own heads: whole (layer, outer) slices,
 *         kvbm_fabric_read_block_tp's fast path (the same bytes as tp4 x 2);
 * each against the bound measured in the same run: memcpy of the same
 * number of bytes (W4's bound for host tiers), right after each pass. One
 * warm-up pass per case is not counted. Prints GB/s and the ratio, median
 * over rounds with min..max (wall clock: noisy on a shared machine; the
 * read count, exact, is the cost model: one read per row piece).
 *
 *   bench_tp_bridge [blocks per writer (64)] [rounds (7)] [tp1|tp4|tp2: that case only]
 *
 * For figures on a loaded machine count instructions instead:
 *   valgrind --tool=callgrind --toggle-collect=pass bench_tp_bridge 8 1 tp1
 * (pass() runs twice per case: the warm-up and the one round).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvbm/fabric.h"
#include "kvbm/layout.h"

#define PROG "bench_tp_bridge"
enum { H = 8, HD = 128, DS = 2, LAYERS = 32, PAGE = 16, ROUNDS_MAX = 64 };

static kvbm_layout rank_layout(uint64_t blocks, uint32_t rank, uint32_t tp) {
  kvbm_layout_heads h = {.model_fingerprint = 0x4b56424d57340001ull, .dtype_id = 3, .num_kv_heads = H,
                         .head_dim = HD, .tp_rank = rank, .tp_size = tp};
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = LAYERS, .outer_dim = 2, .page_size = PAGE,
                          .inner_dim = (uint64_t)(H / tp) * HD, .dtype_size = DS, .alignment = 4096};
  kvbm_layout l;
  kvbm_error e;
  if (kvbm_layout_init(&l, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, &e) || kvbm_layout_attach_heads(&l, &h, &e))
    kvbm_bench_die(PROG, "layout: %s", e.msg);
  return l;
}

/* A reader of TP tp (rank) reads every block; seconds for the pass. */
static double pass(kvbm_fabric *f, kvbm_fabric_remote_set **peers, uint64_t blocks, uint32_t rank, uint32_t tp,
                   uint8_t *dst, uint64_t *bytes) {
  kvbm_layout ours = rank_layout(1, rank, tp);
  void *layers[LAYERS];
  kvbm_error e;
  double t0 = kvbm_bench_now();
  for (uint64_t b = 0; b < blocks; b++) {
    for (int l = 0; l < LAYERS; l++) layers[l] = dst + (b * LAYERS + (uint64_t)l) * ours.layer_stride;
    if (kvbm_fabric_read_block_tp(f, peers, 2, b, &ours, layers, LAYERS, &e)) kvbm_bench_die(PROG, "read: %s", e.msg);
  }
  if (kvbm_fabric_flush(f, 10000, &e)) kvbm_bench_die(PROG, "flush: %s", e.msg);
  double t = kvbm_bench_now() - t0;
  *bytes = blocks * LAYERS * ours.layer_stride;
  return t;
}

int main(int argc, char **argv) {
  uint64_t blocks = argc > 1 ? strtoull(argv[1], NULL, 10) : 64;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (blocks == 0 || rounds < 1 || rounds > ROUNDS_MAX) kvbm_bench_die(PROG, "usage: %s [blocks] [rounds 1..64]", PROG);
  kvbm_fabric *r, *w;
  kvbm_error e;
  if (kvbm_fabric_inproc_pair("reader", "writer", &r, &w, &e)) kvbm_bench_die(PROG, "pair: %s", e.msg);

  kvbm_fabric_remote_set *peers[2];
  kvbm_fabric_local_set *ls[2];
  void *mem[2];
  for (uint32_t k = 0; k < 2; k++) {
    kvbm_layout_desc d = {.layout = rank_layout(blocks, k, 2), .memory = KVBM_MEMORY_SYSTEM, .device_id = -1,
                          .block_set_id = k + 1, .num_regions = 1};
    if (posix_memalign(&mem[k], 4096, d.layout.region_size)) kvbm_bench_die(PROG, "out of memory");
    uint64_t x = 0x9E3779B97F4A7C15ull + k;
    for (uint64_t i = 0; i < d.layout.region_size / 8; i++) ((uint64_t *)mem[k])[i] = kvbm_bench_xorshift(&x);
    uint64_t base = (uint64_t)(uintptr_t)mem[k];
    d.region_base = &base;
    uint8_t *wire;
    size_t len;
    if (kvbm_fabric_register(w, &d, &ls[k], &e) || kvbm_fabric_export(ls[k], &wire, &len, &e) ||
        kvbm_fabric_import(r, wire, len, &peers[k], &e))
      kvbm_bench_die(PROG, "set: %s", e.msg);
    free(wire);
  }
  const uint64_t full = blocks * LAYERS * 2 * PAGE * H * HD * DS; /* TP=1 bytes */
  uint8_t *dst = malloc(full), *src = malloc(full);
  if (!dst || !src) kvbm_bench_die(PROG, "out of memory");
  memset(dst, 1, full);
  memset(src, 2, full);

  const struct {
    const char *name;
    uint32_t rank, tp;
  } cases[] = {{"tp1", 0, 1}, {"tp4", 1, 4}, {"tp2", 0, 2}};
  printf("%s: W4 blocks (32 layers x K,V x 16 tokens x 8 heads x 128 x bf16), %llu blocks per TP=2 writer rank, "
         "in-process fabric (nixl-synth), %d rounds; bound: memcpy of the same bytes in the same round\n",
         PROG, (unsigned long long)blocks, rounds);
  const char *only = argc > 3 ? argv[3] : NULL;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    if (only && strcmp(only, cases[c].name) != 0) continue;
    double gbs[ROUNDS_MAX], bound[ROUNDS_MAX], ratio[ROUNDS_MAX];
    uint64_t bytes = 0;
    pass(r, peers, blocks, cases[c].rank, cases[c].tp, dst, &bytes); /* warm-up, not counted */
    for (int i = 0; i < rounds; i++) {
      double t = pass(r, peers, blocks, cases[c].rank, cases[c].tp, dst, &bytes);
      double t0 = kvbm_bench_now();
      memcpy(dst, src, bytes);
      double tb = kvbm_bench_now() - t0;
      gbs[i] = (double)bytes / t / 1e9;
      bound[i] = (double)bytes / tb / 1e9;
      ratio[i] = gbs[i] / bound[i];
    }
    kvbm_bench_spread g = kvbm_bench_spread_of(gbs, rounds), b = kvbm_bench_spread_of(bound, rounds),
                      q = kvbm_bench_spread_of(ratio, rounds);
    printf("  %s reader (rank %u of %u): %.2f GB/s (%.2f..%.2f), memcpy %.2f GB/s (%.2f..%.2f), ratio %.3f "
           "(%.3f..%.3f), %.1f MiB a pass\n",
           cases[c].name, cases[c].rank, cases[c].tp, g.median, g.min, g.max, b.median, b.min, b.max, q.median,
           q.min, q.max, (double)bytes / (1 << 20));
  }
  kvbm_fabric_stats st;
  kvbm_fabric_stats_get(r, &st);
  printf("  reads issued: %llu for %.1f MiB (%.0f B a read on average)\n", (unsigned long long)st.reads,
         (double)st.read_bytes / (1 << 20), (double)st.read_bytes / (double)st.reads);
  for (int k = 0; k < 2; k++) {
    kvbm_fabric_remote_set_release(peers[k]);
    kvbm_fabric_local_set_release(ls[k]);
    free(mem[k]);
  }
  kvbm_fabric_destroy(r);
  kvbm_fabric_destroy(w);
  free(dst);
  free(src);
  return 0;
}
