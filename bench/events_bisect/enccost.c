/* SPDX-License-Identifier: Apache-2.0 */
/*
 * enccost.c: the plain event's encoder alone, timed (docs/areas/events.md,
 * "Session 13: the encoder's token ids"). Encodes BlockStored events of K
 * blocks x 16 tokens (a parent, medium GPU, map form, as the publisher's
 * lean path writes them: kvbm__event_put_plain) into one buffer, again and
 * again, and prints the best of 7 rounds in ns per block. The ids are
 * bench_events' (j * 7919) with VOCAB 0, else drawn at random below VOCAB
 * (xorshift64, the same each run) from 64 blocks' worth, so that a model's
 * vocabulary, whose ids are uint16 and uint32 on the wire at random, is
 * measured too. The event structs are made before the clock, so that only
 * the encode is timed (making a 216-byte kvbm_event costs about what the
 * encode of a one-block event does on the 2-core VM).
 *
 *   enccost K VOCAB
 *
 * Not built by CMake: enccost.sh compiles it against a build folder, so
 * that two builds (an old and a new library) can be timed in turn.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../bench_util.h"
#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

int main(int argc, char **argv) {
  unsigned k = argc > 1 ? (unsigned)atoi(argv[1]) : 16;
  uint32_t vocab = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 0;
  if (k == 0 || k > 64) {
    fprintf(stderr, "usage: enccost K (1..64) VOCAB (0: j * 7919)\n");
    return 2;
  }
  enum { SETS = 64 };
  uint64_t h[64];
  uint32_t *t = malloc((size_t)SETS * 16 * k * sizeof *t);
  uint8_t *buf = malloc(kvbm__event_plain_bound(k, 16 * k));
  kvbm_event *ev = calloc(SETS, sizeof *ev);
  if (!t || !buf || !ev) return 1;
  uint64_t x = 88172645463325252ull;
  for (size_t j = 0; j < (size_t)SETS * 16 * k; j++)
    t[j] = vocab ? (uint32_t)(kvbm_bench_xorshift(&x) % vocab) : (uint32_t)(j % (16 * k)) * 7919u;
  for (unsigned j = 0; j < k; j++) h[j] = 0x9e3779b97f4a7c15ull * (j + 1);
  for (int s = 0; s < SETS; s++)
    ev[s] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = h, .num_block_hashes = k,
                         .has_parent = true, .parent_hash = 5, .token_ids = t + (size_t)s * 16 * k,
                         .num_tokens = 16 * k, .block_size = 16, .medium = KVBM_MEDIUM_GPU};
  const kvbm_event_encoder_config ec = {.form = KVBM_FORM_MAP};
  const long n = 3200000 / k; /* 3.2 M blocks a round */
  size_t bytes = 0;
  double best = 1e30;
  for (int r = 0; r < 7; r++) {
    double t0 = kvbm_bench_now();
    for (long i = 0; i < n; i++) {
      bytes += (size_t)(kvbm__event_put_plain(buf, &ev[i % SETS], &ec) - buf);
      __asm__ volatile("" ::: "memory"); /* the bytes count as written */
    }
    double dt = (kvbm_bench_now() - t0) * 1e9 / ((double)n * k);
    if (dt < best) best = dt;
  }
  printf("k=%u vocab=%u: %.2f ns a block (best of 7; %.1f bytes a block)\n", k, vocab, best,
         (double)bytes / (7.0 * (double)n * k));
  free(t);
  free(buf);
  free(ev);
  return 0;
}
