/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dectok.c: the subscriber's token ids of a large vocabulary (issue 22,
 * docs/areas/events.md "Session 13: the subscriber's token ids"). Encodes
 * one batch of 64 BlockStored events of K blocks x 16 tokens in map form
 * (what the publisher writes), the ids random below V (V = 0: bench_events'
 * ids j * 7919, which come in runs of one width), and times its decode:
 * ns per block event, best of ROUNDS rounds of REPS decodes each, taking
 * NB (16, or 256 / K below K 16: 256k ids in all) such batches of different ids in turn (one batch decoded again
 * and again lets the branch predictor learn its ids' widths: with NB 1
 * the scalar reader looks up to ~1.5x faster at V 128256). Random
 * ids of a vocabulary above 65536 are uint16 or uint32 at random (~half
 * each for 128256 and 201088), the case the decoder's one-width runs miss.
 *
 *   dectok V K REPS ROUNDS [NB [GENERAL]]
 *
 * With ROUNDS 1 and two REPS under callgrind, dectok.sh gives the
 * decoder's instructions per block event. Not built by CMake: dectok.sh
 * compiles it against a build folder, so that an old and a new build can
 * be compared with one source.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../bench_util.h"
#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

int main(int argc, char **argv) {
  uint32_t v = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 0;
  unsigned k = argc > 2 ? (unsigned)atoi(argv[2]) : 16;
  long reps = argc > 3 ? atol(argv[3]) : 2000;
  int rounds = argc > 4 ? atoi(argv[4]) : 7;
  unsigned nb = argc > 5 ? (unsigned)atoi(argv[5]) : k >= 16 ? 16 : 256 / k; /* >= 256k ids in all */
  int general = argc > 6 && atoi(argv[6]);
  enum { EVENTS = 64 };
  if (k == 0 || reps <= 0 || rounds <= 0 || nb == 0) return 1;
  size_t per = (size_t)16 * k * EVENTS; /* ids a batch */
  uint64_t *h = calloc((size_t)k * EVENTS, 8);
  uint32_t *t = calloc(per * nb, 4);
  kvbm_event *ev = calloc(EVENTS, sizeof *ev);
  uint8_t **pay = calloc(nb, sizeof *pay);
  size_t *plen = calloc(nb, sizeof *plen), bytes = 0;
  if (!h || !t || !ev || !pay || !plen) return 1;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t j = 0; j < per * nb; j++)
    t[j] = v ? (uint32_t)(kvbm_bench_xorshift(&x) % v) : (uint32_t)(j % (16 * k)) * 7919u;
  kvbm_event_encoder_config cfg = {.form = KVBM_FORM_MAP};
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  if (kvbm_event_encoder_create(&cfg, &enc, NULL) || kvbm_event_decoder_create(&dec, NULL)) return 1;
  /* nb batches of different ids: the branch predictor cannot learn a
   * stream's widths by heart as it can one batch decoded again and again */
  for (unsigned bi = 0; bi < nb; bi++) {
    for (unsigned i = 0; i < EVENTS; i++) {
      uint64_t *eh = h + (size_t)i * k;
      for (unsigned j = 0; j < k; j++) eh[j] = ((uint64_t)i * k + j + 1) * 0x9e3779b97f4a7c15ull;
      ev[i] = (kvbm_event){.type = KVBM_EVENT_STORED, .block_hashes = eh, .num_block_hashes = k,
                           .medium = KVBM_MEDIUM_GPU, .has_parent = true, .parent_hash = eh[0] - 1,
                           .token_ids = t + per * bi + (size_t)16 * k * i, .num_tokens = 16 * k,
                           .block_size = 16};
    }
    kvbm_event_batch b = {.ts = 1.7e9, .events = ev, .num_events = EVENTS, .has_dp_rank = true};
    const uint8_t *p;
    if (kvbm_event_encode(enc, &b, &p, &plen[bi], NULL) || !(pay[bi] = malloc(plen[bi]))) return 1;
    memcpy(pay[bi], p, plen[bi]);
    bytes += plen[bi];
  }
  kvbm__event_decoder_general(dec, general);
  double best = 1e300;
  size_t blocks = 0;
  uint64_t sum = 0; /* the ids read, so that no decode is dead code */
  for (int r = 0; r < rounds; r++) {
    double t0 = kvbm_bench_now();
    for (long i = 0; i < reps; i++) {
      kvbm_event_batch out;
      if (kvbm_event_decode(dec, pay[i % nb], plen[i % nb], (uint64_t)i, &out, NULL) || out.num_events != EVENTS)
        return 2;
      for (size_t e = 0; e < out.num_events; e++) {
        blocks += out.events[e].num_block_hashes;
        sum += out.events[e].token_ids[out.events[e].num_tokens - 1];
      }
    }
    double ns = (kvbm_bench_now() - t0) * 1e9 / ((double)reps * EVENTS * k);
    if (ns < best) best = ns;
  }
  /* the ids decoded must be the ids encoded (a wrong decode is no speed) */
  for (unsigned bi = 0; bi < nb; bi++) {
    kvbm_event_batch out;
    if (kvbm_event_decode(dec, pay[bi], plen[bi], 0, &out, NULL)) return 2;
    for (size_t e = 0; e < EVENTS; e++)
      for (size_t j = 0; j < out.events[e].num_tokens; j++)
        if (out.events[e].token_ids[j] != t[per * bi + e * 16 * k + j]) return fprintf(stderr, "id mismatch\n"), 3;
    free(pay[bi]);
  }
  printf("V=%u K=%u ns/block %.2f (best of %d x %ld decodes of %d events, %u batches of %zu bytes; %zu blocks, sum %llu)\n",
         v, k, best, rounds, reps, EVENTS, nb, bytes / nb, blocks, (unsigned long long)sum);
  kvbm_event_decoder_destroy(dec);
  kvbm_event_encoder_destroy(enc);
  free(h), free(t), free(ev), free(pay), free(plen);
  return 0;
}
