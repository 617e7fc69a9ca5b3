/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_blake3.c: libFuzzer target, differential test of BLAKE3 paths.
 * fuzz-modules: common blake3
 *
 * The input is hashed on every compression path this CPU has, in one
 * piece and in pieces whose sizes come from the input's first bytes; all
 * must agree, and the extended output read from an offset must equal the
 * matching slice of the full output.
 */
#include <stdint.h>
#include <string.h>

#include "kvbm/blake3.h"

#define CHECK(x)                \
  do {                          \
    if (!(x)) __builtin_trap(); \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t want[200], got[200];
  CHECK(kvbm_blake3_hash(data, size, want, sizeof want) == KVBM_OK);
  for (int impl = KVBM_BLAKE3_IMPL_PORTABLE; impl <= KVBM_BLAKE3_IMPL_AVX512;
       impl++) {
    if (!kvbm_blake3_impl_available((kvbm_blake3_impl)impl)) continue;
    kvbm_blake3_hasher h;
    kvbm_blake3_hasher_init(&h);
    CHECK(kvbm_blake3_hasher_set_impl(&h, (kvbm_blake3_impl)impl, NULL) == 0);
    size_t off = 0, k = 0;
    while (off < size) {
      size_t n = size > 8 ? 1 + (size_t)data[k++ % 8] * 97 : 1;
      if (n > size - off) n = size - off;
      kvbm_blake3_hasher_update(&h, data + off, n);
      off += n;
    }
    CHECK(kvbm_blake3_hasher_finalize(&h, got, sizeof got) == KVBM_OK);
    CHECK(memcmp(got, want, sizeof got) == 0);
    size_t seek = size % 150;
    CHECK(kvbm_blake3_hasher_finalize_seek(&h, seek, got, 50) == KVBM_OK);
    CHECK(memcmp(got, want + seek, 50) == 0);
  }
  return 0;
}
