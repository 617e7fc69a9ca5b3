/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_frame.c: libFuzzer target for the MRDN v1 frame decoder.
 * fuzz-modules: common blake3 frame
 *
 * Properties checked on every input, beyond "no crash, no leak, no UB":
 *   - a failure is one of the decoder's documented statuses and carries a
 *     message;
 *   - an accepted frame has exactly body_len + 32 bytes and re-encodes to
 *     the same bytes;
 *   - the streaming path (header, then the body in pieces whose sizes come
 *     from the input) gives the same verdict as the one-shot decoder;
 *   - a declared length above the limit is refused from the header alone;
 *   - an accepted frame's phase is one of the ADR's three labels, and any
 *     other byte 12 is refused as KVBM_EPHASE (unless an earlier field
 *     already failed).
 * Half the time the input's body is wrapped in a freshly encoded valid
 * header with a few bytes mutated, so the fuzzer reaches the checksum and
 * length checks instead of dying at the magic.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/frame.h"

#define CHECK(x)                \
  do {                          \
    if (!(x)) __builtin_trap(); \
  } while (0)

#define MAX_BODY (1u << 16)

static int known_status(int rc) {
  switch (rc) {
    case KVBM_OK: case KVBM_ETRUNCATED: case KVBM_EMAGIC: case KVBM_EVERSION:
    case KVBM_EPADDING: case KVBM_EPHASE: case KVBM_ETOOLONG:
    case KVBM_ECHECKSUM: case KVBM_EAUTH: /* keyed or sealed: no key here */
      return 1;
  }
  return 0;
}

/* The streaming verdict for the same bytes, pieces sized by `seed`. */
static int decode_in_pieces(const uint8_t *f, size_t len, uint32_t seed) {
  kvbm_frame_header hdr;
  int rc = kvbm_frame_parse_header(f, len, MAX_BODY, &hdr, NULL);
  if (rc) return rc;
  kvbm_frame_verifier v;
  rc = kvbm_frame_verifier_init(&v, &hdr, NULL);
  if (rc) return rc; /* KVBM_EAUTH: a keyed or sealed header */
  size_t off = 32;
  while (off < len) {
    seed = seed * 1103515245u + 12345u;
    size_t n = 1 + (seed >> 16) % 3000;
    if (n > len - off) n = len - off;
    rc = kvbm_frame_verifier_update(&v, f + off, n, NULL);
    if (rc) return rc;
    off += n;
  }
  return kvbm_frame_verifier_finish(&v, NULL);
}

static void check(const uint8_t *f, size_t len, uint32_t seed) {
  kvbm_frame_header hdr;
  const uint8_t *body = NULL;
  kvbm_error err;
  kvbm_error_clear(&err);
  int rc = kvbm_frame_decode(f, len, MAX_BODY, &hdr, &body, &err);
  CHECK(known_status(rc));
  if (rc != KVBM_OK) {
    CHECK(err.code == rc && err.msg[0] != '\0' && body == NULL);
  } else {
    CHECK(body == f + 32 && hdr.body_len == len - 32);
    CHECK(hdr.body_len <= MAX_BODY);
    CHECK((unsigned)hdr.phase < KVBM_FRAME_PHASE_COUNT && f[12] == (uint8_t)hdr.phase);
    uint8_t *again = malloc(len);
    CHECK(again != NULL);
    size_t n = 0;
    CHECK(kvbm_frame_encode(hdr.phase, body, hdr.body_len, again, len, &n,
                            NULL) == KVBM_OK);
    CHECK(n == len && memcmp(again, f, len) == 0);
    free(again);
  }
  CHECK(decode_in_pieces(f, len, seed) == rc);
  /* A bad phase byte behind a good magic, version and padding is EPHASE. */
  if (len >= 32 && f[12] >= KVBM_FRAME_PHASE_COUNT && rc != KVBM_ETRUNCATED &&
      rc != KVBM_EMAGIC && rc != KVBM_EVERSION && rc != KVBM_EPADDING)
    CHECK(rc == KVBM_EPHASE);
  /* A limit below the declared length: refused by the header check. */
  if (len >= 32 && rc != KVBM_ETRUNCATED && rc != KVBM_EMAGIC &&
      rc != KVBM_EVERSION && rc != KVBM_EPADDING && rc != KVBM_EPHASE) {
    uint32_t declared = (uint32_t)f[8] | (uint32_t)f[9] << 8 |
                        (uint32_t)f[10] << 16 | (uint32_t)f[11] << 24;
    if (declared > 0)
      CHECK(kvbm_frame_parse_header(f, len, declared - 1, &hdr, NULL) ==
            KVBM_ETOOLONG);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 0 && (data[0] & 1) && size >= 4) {
    /* data[1..3]: phase, mutation position, mutation xor; rest: body. */
    const uint8_t *body = data + 4;
    size_t blen = size - 4;
    size_t len = 0;
    CHECK(kvbm_frame_encode((kvbm_frame_phase)(data[1] % KVBM_FRAME_PHASE_COUNT), body, blen, NULL, 0,
                            &len, NULL) == KVBM_OK);
    uint8_t *f = malloc(len + 1);
    CHECK(f != NULL);
    CHECK(kvbm_frame_encode((kvbm_frame_phase)(data[1] % KVBM_FRAME_PHASE_COUNT), body, blen, f, len,
                            &len, NULL) == KVBM_OK);
    check(f, len, data[0]); /* valid as encoded */
    f[data[2] % len] ^= data[3];
    size_t cut = (data[1] & 0x80) ? len - (data[1] >> 4 & 7) % len : len;
    check(f, cut, data[2]);
    free(f);
  } else {
    check(data, size, size > 1 ? data[1] : 0);
  }
  return 0;
}
