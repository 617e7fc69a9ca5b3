/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_index_restore.c: libFuzzer target for the router index's snapshot
 * reader (kvbm_index_restore), run by scripts/ci.d/fuzz.sh.
 * fuzz-modules: common hash group event_codec events/seq.c router/index.c router/wmap.c
 * fuzz-libs: xxhash msgpackc
 *
 * The input is a snapshot's body; the target seals it with a valid sum so
 * that the reader's checks behind the sum are what gets explored (a body
 * with a wrong sum is refused first). Properties: restoring returns a
 * status, never crashes, leaks or reads outside the input; a refused
 * snapshot leaves the index without workers and says why; an accepted one
 * snapshots again, and that restores into a second index whose snapshot
 * is byte-equal (the canonical form is a fixed point); lookups on it work.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/router.h"

static kvbm_index *mk(bool recompute) {
  kvbm_index_config c = kvbm_index_config_default();
  c.block_size = 1;
  c.recompute = recompute;
  c.expected_blocks = 4;
  kvbm_index *idx;
  if (kvbm_index_create(&c, &idx, NULL)) abort();
  return idx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1u << 20)) return 0;
  uint8_t *buf = malloc(size + 8);
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  uint64_t h = kvbm_hash_salt(buf, size);
  for (int i = 0; i < 8; i++) buf[size + i] = (uint8_t)(h >> (8 * i));
  bool recompute = size > 12 && data[12] == 1;
  kvbm_index *a = mk(recompute), *b = mk(recompute);
  kvbm_error err = {0};
  int rc = kvbm_index_restore(a, buf, size + 8, &err);
  if (rc) {
    if (kvbm_index_workers(a) || !err.msg[0]) abort();
  } else {
    uint8_t *s1, *s2;
    size_t n1, n2;
    if (kvbm_index_snapshot(a, &s1, &n1, NULL)) abort();
    if (kvbm_index_restore(b, s1, n1, &err)) abort();
    if (kvbm_index_snapshot(b, &s2, &n2, NULL)) abort();
    if (n1 != n2 || memcmp(s1, s2, n1)) abort();
    free(s1);
    free(s2);
    uint64_t keys[4] = {1, 2, 3, 4};
    kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
    kvbm_index_lookup(a, keys, 4, ov, NULL);
  }
  kvbm_index_destroy(a);
  kvbm_index_destroy(b);
  free(buf);
  return 0;
}
