/* SPDX-License-Identifier: Apache-2.0 */
/*
 * deccost.c: the decoder alone, for callgrind (docs/areas/events.md,
 * "Session 11: the subscriber"). Encodes one batch of 256 events of
 * bench_events' stream (BlockStored of K blocks x 16 tokens, ids j * 7919,
 * then BlockRemoved of the same hashes) in FORM (0 positional, 1 map) and
 * decodes it N times. Run at two N under callgrind and divide the
 * difference by the block events between them: the decoder's
 * instructions per block event with no sockets, no batching, no start-up
 * (bench_events and pubcost's subscriber include ZMQ and the batch cuts).
 * GENERAL 1 reads every event with the general reader only; MIXED 1
 * takes random ids below 150000 instead (a real vocabulary's mix of
 * uint16 and uint32 ids, in no order, where bench_events' ids come in
 * runs of one width).
 *
 *   deccost K FORM N [GENERAL [MIXED]]
 *
 * Not built by CMake: deccost.sh compiles it against a build folder.
 */
#include <stdio.h>
#include <stdlib.h>

#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

int main(int argc, char **argv) {
  unsigned k = argc > 1 ? (unsigned)atoi(argv[1]) : 1;
  int form = argc > 2 ? atoi(argv[2]) : 1;
  long n = argc > 3 ? atol(argv[3]) : 1000;
  int general = argc > 4 && atoi(argv[4]);
  int mixed = argc > 5 && atoi(argv[5]);
  enum { EVENTS = 256 };
  uint64_t *h = calloc((size_t)k * EVENTS, 8);
  uint32_t *t = calloc(16u * k, 4);
  kvbm_event *ev = calloc(EVENTS, sizeof *ev);
  if (!h || !t || !ev || k == 0) return 1;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (unsigned j = 0; j < 16 * k; j++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[j] = mixed ? (uint32_t)(x % 150000) : j * 7919u;
  }
  for (unsigned i = 0; i < EVENTS; i++) {
    uint64_t *eh = h + (size_t)i * k;
    for (unsigned j = 0; j < k; j++) eh[j] = ((i / 2) * k + j) * 0x9e3779b97f4a7c15ull;
    ev[i] = (kvbm_event){.type = i % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED,
                         .block_hashes = eh, .num_block_hashes = k, .medium = KVBM_MEDIUM_GPU};
    if (!(i % 2)) {
      ev[i].has_parent = true;
      ev[i].parent_hash = eh[0] - 1;
      ev[i].token_ids = t;
      ev[i].num_tokens = 16 * k;
      ev[i].block_size = 16;
    }
  }
  kvbm_event_encoder_config cfg = {.form = (kvbm_event_form)form};
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  const uint8_t *p;
  size_t len;
  kvbm_event_batch b = {.ts = 1.7e9, .events = ev, .num_events = EVENTS, .has_dp_rank = true};
  if (kvbm_event_encoder_create(&cfg, &enc, NULL) || kvbm_event_encode(enc, &b, &p, &len, NULL) ||
      kvbm_event_decoder_create(&dec, NULL))
    return 1;
  kvbm__event_decoder_general(dec, general);
  size_t blocks = 0;
  for (long r = 0; r < n; r++) {
    kvbm_event_batch out;
    if (kvbm_event_decode(dec, p, len, (uint64_t)r, &out, NULL) || out.num_events != EVENTS) return 2;
    for (size_t i = 0; i < out.num_events; i++) blocks += out.events[i].num_block_hashes;
  }
  printf("%zu block events, %zu bytes a batch\n", blocks, len);
  kvbm_event_decoder_destroy(dec);
  kvbm_event_encoder_destroy(enc);
  free(h), free(t), free(ev);
  return 0;
}
