/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_storage_decode.c: libFuzzer target for the storage events' decoder
 * (kvbm_storage_decode, docs/areas/storage-events.md).
 * fuzz-modules: common events/storage_codec.c
 *
 * Beyond "no crash, no leak, no UB" (each input is decoded from a heap
 * copy of exactly its size, so ASan sees a read one past the end): what
 * decodes re-encodes, and the re-encoded bytes decode to the same events
 * (type, ids, hashes, size, location, tier, metadata bytes); a decoded
 * batch never claims more events than its input could hold; a refusal
 * always comes with a message; the input with its last byte cut is
 * decoded too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/storage_events.h"

static void check(kvbm_storage_decoder *d, kvbm_storage_decoder *d2, const uint8_t *buf, size_t size) {
  kvbm_storage_batch b;
  kvbm_error err = {0};
  int rc = kvbm_storage_decode(d, buf, size, 7, &b, &err);
  if (rc) {
    if (!err.msg[0]) abort();
    return;
  }
  if (b.num_events > size / 8 || b.seq != 7) abort();
  uint8_t *out = NULL;
  size_t len = 0, cap = 0;
  if (kvbm_storage_encode(&b, &out, &len, &cap, &err)) abort(); /* what decodes encodes */
  kvbm_storage_batch c;
  if (kvbm_storage_decode(d2, out, len, 7, &c, &err) || c.num_events != b.num_events) abort();
  for (size_t i = 0; i < b.num_events; i++) {
    const kvbm_storage_event *x = &b.events[i], *y = &c.events[i];
    if (x->type != y->type || x->event_id != y->event_id || x->sequence_hash != y->sequence_hash ||
        x->prefix_hash != y->prefix_hash || x->block_size != y->block_size ||
        x->location_len != y->location_len || memcmp(x->location, y->location, x->location_len) ||
        x->tier != y->tier || x->extra_metadata_len != y->extra_metadata_len ||
        (x->extra_metadata_len && memcmp(x->extra_metadata, y->extra_metadata, x->extra_metadata_len)))
      abort();
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1);
  if (size) memcpy(buf, data, size);
  kvbm_storage_decoder *d, *d2;
  if (kvbm_storage_decoder_create(&d, NULL) || kvbm_storage_decoder_create(&d2, NULL)) abort();
  check(d, d2, buf, size);
  if (size) check(d, d2, buf, size - 1);
  kvbm_storage_decoder_destroy(d);
  kvbm_storage_decoder_destroy(d2);
  free(buf);
  return 0;
}
