/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_layout.c: libFuzzer target for the serialized layout decoder.
 * fuzz-modules: common layout
 *
 * Properties checked on every input, beyond "no crash, no leak, no UB":
 *   - a failure returns a known negative status, a message, and no
 *     allocation;
 *   - an accepted input re-encodes to exactly the same bytes (the format has
 *     one encoding per value, so the decoder accepted nothing it should not);
 *   - every slice of an accepted layout, at the corners of its index space,
 *     lies inside its region, and the region end does not wrap past 2^64.
 * The first input bytes seed a valid message ~half the time (see below), so
 * the fuzzer spends its time past the magic and version checks; half of
 * those seeds are version 2 (a heads trailer, kvbm_layout_heads).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/layout.h"

#define CHECK(x) \
  do {           \
    if (!(x)) __builtin_trap(); \
  } while (0)

static void check_accepted(const kvbm_layout_desc *d, const uint8_t *data, size_t size) {
  size_t n = kvbm_layout_desc_encoded_size(d);
  CHECK(n == size);
  uint8_t *again = malloc(n);
  CHECK(again != NULL);
  size_t m = 0;
  CHECK(kvbm_layout_desc_encode(d, again, n, &m, NULL) == KVBM_OK);
  CHECK(m == n && memcmp(again, data, n) == 0);
  free(again);

  const kvbm_layout *l = &d->layout;
  const uint64_t bs[2] = {0, l->config.num_blocks - 1};
  const uint64_t ls[2] = {0, l->config.num_layers - 1};
  const uint64_t os[2] = {0, l->config.outer_dim - 1};
  for (int i = 0; i < 8; i++) {
    kvbm_slice s;
    CHECK(kvbm_layout_slice(l, bs[i & 1], ls[(i >> 1) & 1], os[i >> 2], &s, NULL) == KVBM_OK);
    CHECK(s.region < d->num_regions);
    CHECK(s.offset <= l->region_size && s.size <= l->region_size - s.offset);
    uint64_t end;
    CHECK(!__builtin_add_overflow(d->region_base[s.region], s.offset + s.size, &end));
  }
  kvbm_slice s;
  CHECK(kvbm_layout_slice(l, l->config.num_blocks, 0, 0, &s, NULL) == KVBM_ERANGE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvbm_layout_desc d;
  kvbm_error e;
  kvbm_error_clear(&e);
  int rc = kvbm_layout_desc_decode(data, size, &d, &e);
  if (rc == KVBM_OK) {
    check_accepted(&d, data, size);
    kvbm_layout_desc_release(&d);
  } else {
    CHECK(rc < 0 && rc >= KVBM_EDEVICE);
    CHECK(e.code == rc && e.msg[0] != '\0');
    CHECK(d.region_base == NULL);
  }

  /* Also decode the input laid over a valid header, so mutations land on
   * individual fields of an otherwise well-formed message. */
  if (size >= 1 && (data[0] & 1)) {
    kvbm_layout_desc v;
    memset(&v, 0, sizeof v);
    kvbm_layout_config c = {8, 3, 2, 16, 8, 2, 64};
    uint64_t bases[3] = {0x10000, 0x20000, 0x30000};
    CHECK(kvbm_layout_init(&v.layout, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL) == KVBM_OK);
    /* Odd sizes: the version 2 form, with a heads trailer to mutate
     * (rank 1 of TP=2 over 4 heads of 4: inner_dim 8, bfloat16). */
    if (size & 1) {
      const kvbm_layout_heads h = {.model_fingerprint = 0x1234, .dtype_id = 3, .num_kv_heads = 4,
                                   .head_dim = 4, .tp_rank = 1, .tp_size = 2};
      CHECK(kvbm_layout_attach_heads(&v.layout, &h, NULL) == KVBM_OK);
    }
    v.memory = KVBM_MEMORY_PINNED;
    v.device_id = 0;
    v.num_regions = 3;
    v.region_base = bases;
    uint8_t buf[KVBM_LAYOUT_WIRE_HEADER + 3 * 8 + 64];
    size_t n;
    CHECK(kvbm_layout_desc_encode(&v, buf, sizeof buf, &n, NULL) == KVBM_OK);
    /* data[1..] overwrites bytes starting at offset data[0] >> 1. */
    size_t at = data[0] >> 1, len = size - 1;
    if (at > n) at = n;
    if (len > sizeof buf - at) len = sizeof buf - at;
    memcpy(buf + at, data + 1, len);
    size_t total = at + len > n ? at + len : n;
    rc = kvbm_layout_desc_decode(buf, total, &d, NULL);
    if (rc == KVBM_OK) {
      check_accepted(&d, buf, total);
      kvbm_layout_desc_release(&d);
    } else {
      CHECK(d.region_base == NULL);
    }
  }
  return 0;
}
