/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_peer_ctl.c: libFuzzer target for the MAC on a keyed peer link's
 * messages (src/peer/ctl.h): what a receiver runs on every message a peer,
 * or anyone on the path, puts on the link.
 * fuzz-modules: common blake3 peer/ctl.c
 *
 * The input is split: its first byte picks a mode, the next 8 a sequence
 * number, the rest is a message. Properties checked on every input, beyond
 * "no crash, no leak, no UB":
 *   - opening the raw bytes either fails with KVBM_EAUTH and a message, or
 *     succeeds only for bytes that are exactly the seal of their body and
 *     sequence number (re-sealing gives the same bytes): nothing else
 *     passes the MAC;
 *   - kvbm__ctl_covered never claims more than the message's length, even
 *     for a block message whose header declares a huge token count;
 *   - the message sealed here opens, giving back its length and sequence
 *     number; one byte changed anywhere in the covered part or the trailer
 *     (position from the input) makes it fail, and a change past the
 *     covered part of a pushed block message (its body, which the frame's
 *     own MAC covers) does not;
 *   - the other direction's key, or another connection's, refuses it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "peer/ctl.h"

#define CHECK(x)                \
  do {                          \
    if (!(x)) __builtin_trap(); \
  } while (0)

#define MAX_MSG (1u << 16)

static void keys(uint8_t ab[KVBM__CTL_KEY], uint8_t ba[KVBM__CTL_KEY], uint8_t other[KVBM__CTL_KEY]) {
  static const char secret[] = "fuzz cluster secret, 32 bytes ok";
  uint8_t ctl[KVBM__CTL_KEY], na[KVBM__CTL_NONCE], nb[KVBM__CTL_NONCE], nc[KVBM__CTL_NONCE];
  CHECK(kvbm__ctl_key(secret, sizeof secret - 1, ctl, NULL) == KVBM_OK);
  memset(na, 0xA1, sizeof na);
  memset(nb, 0xB2, sizeof nb);
  memset(nc, 0xC3, sizeof nc);
  kvbm__ctl_dir_key(ctl, na, nb, ab);
  kvbm__ctl_dir_key(ctl, nb, na, ba);
  kvbm__ctl_dir_key(ctl, na, nc, other); /* A's key toward another connection */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 9 || size - 9 > MAX_MSG) return 0;
  uint8_t ab[KVBM__CTL_KEY], ba[KVBM__CTL_KEY], other[KVBM__CTL_KEY];
  keys(ab, ba, other);
  uint8_t mode = data[0];
  uint64_t seq = kvbm__get_le64(data + 1);
  const uint8_t *msg = data + 9;
  size_t len = size - 9;

  /* 1: the raw bytes as a received message */
  size_t body = 0;
  uint64_t s = 0;
  kvbm_error err = {0};
  int rc = kvbm__ctl_open(ab, msg, len, &body, &s, &err);
  CHECK(rc == KVBM_OK || rc == KVBM_EAUTH);
  if (rc) {
    CHECK(err.msg[0] != 0);
  } else {
    CHECK(body + KVBM__CTL_TRAILER == len);
    uint8_t *again = malloc(len);
    CHECK(again);
    memcpy(again, msg, body);
    kvbm__ctl_seal(ab, again, body, s);
    CHECK(memcmp(again, msg, len) == 0);
    free(again);
  }
  size_t cov = kvbm__ctl_covered(msg, len);
  CHECK(cov <= len);

  /* 2: the same bytes sealed by a genuine sender */
  if (len < 4) return 0;
  uint8_t *m = malloc(len + KVBM__CTL_TRAILER);
  CHECK(m);
  memcpy(m, msg, len);
  kvbm__ctl_seal(ab, m, len, seq);
  size_t n = len + KVBM__CTL_TRAILER;
  CHECK(kvbm__ctl_open(ab, m, n, &body, &s, NULL) == KVBM_OK);
  CHECK(body == len && s == seq);
  CHECK(kvbm__ctl_open(ba, m, n, &body, &s, NULL) == KVBM_EAUTH);    /* reflected */
  CHECK(kvbm__ctl_open(other, m, n, &body, &s, NULL) == KVBM_EAUTH); /* other link */

  /* 3: one byte changed, where the input says */
  size_t at = (size_t)(seq % n);
  uint8_t flip = (uint8_t)(mode | 1u);
  m[at] ^= flip;
  rc = kvbm__ctl_open(ab, m, n, &body, &s, &err);
  bool covered = at < cov || at >= len; /* the covered body, or the trailer */
  if (covered) {
    CHECK(rc == KVBM_EAUTH);
  } else {
    /* inside a pushed block's body, past its frame header: the frame's own
     * MAC covers it, so the link's MAC does not (the header, which sets
     * where the covered part ends, is unchanged) */
    CHECK(rc == KVBM_OK);
  }
  free(m);
  return 0;
}
