/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_hint_decode.c: libFuzzer target for the advisor's hints decoder
 * (kvbm_hint_decode, docs/areas/advisor.md).
 * fuzz-modules: common event_codec/event.c advisor/hint_codec.c advisor/advisor.c router/index.c router/wmap.c events/seq.c hash group blake3
 *
 * Beyond "no crash, no leak, no UB" (heap copies of exactly the input's
 * size): what decodes re-encodes and decodes to the same hints; a batch
 * never claims more hints than its input could hold; refusals carry a
 * message; the input with its last byte cut is decoded too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/advisor.h"

static bool same(const char *a, size_t an, const char *b, size_t bn) {
  return an == bn && (!an || !memcmp(a, b, an)) && (a == NULL) == (b == NULL);
}

static void check(kvbm_hint_decoder *d, kvbm_hint_decoder *d2, const uint8_t *buf, size_t size) {
  kvbm_hint_batch b;
  kvbm_error err = {0};
  if (kvbm_hint_decode(d, buf, size, 3, &b, &err)) {
    if (!err.msg[0]) abort();
    return;
  }
  if (b.num_hints > size / 12) abort();
  uint8_t *out = NULL;
  size_t len = 0, cap = 0;
  if (kvbm_hints_encode(&b, &out, &len, &cap, &err)) abort();
  kvbm_hint_batch c;
  if (kvbm_hint_decode(d2, out, len, 3, &c, &err) || c.num_hints != b.num_hints) abort();
  for (size_t i = 0; i < b.num_hints; i++) {
    const kvbm_wire_hint *x = &b.hints[i], *y = &c.hints[i];
    if (x->kind != y->kind || x->sequence_hash != y->sequence_hash || x->prefix_hash != y->prefix_hash ||
        !same(x->from, x->from_len, y->from, y->from_len) || !same(x->to, x->to_len, y->to, y->to_len) ||
        x->uses != y->uses || x->idle_ms != y->idle_ms || x->live_blocks != y->live_blocks ||
        x->high_water != y->high_water)
      abort();
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1);
  if (size) memcpy(buf, data, size);
  kvbm_hint_decoder *d, *d2;
  if (kvbm_hint_decoder_create(&d, NULL) || kvbm_hint_decoder_create(&d2, NULL)) abort();
  check(d, d2, buf, size);
  if (size) check(d, d2, buf, size - 1);
  kvbm_hint_decoder_destroy(d);
  kvbm_hint_decoder_destroy(d2);
  free(buf);
  return 0;
}
