/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctl.c: the MAC on a keyed peer link's messages (peer/ctl.h has the
 * wire and the reasons). Kept apart from peers.c so that the codec is a
 * few pure functions over bytes: the link thread, the tests' hostile
 * peers and the benchmark's raw peer all seal and open with the same
 * code, and nothing here knows of threads or the fabric.
 *
 * Cost: a control message is tens of bytes, so its MAC is one BLAKE3
 * compression or two (a 64-byte block each) plus the keyed hasher's
 * setup; a pushed block message's is the same, over its envelope and
 * frame header only (its body is bound by the frame's own MAC).
 */
#include "peer/ctl.h"

#include <string.h>

#include "common/bytes.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"

int kvbm__ctl_key(const void *secret, size_t len, uint8_t key[KVBM__CTL_KEY], kvbm_error *err) {
  if (!secret || len < KVBM_FABRIC_SECRET_MIN || len > KVBM_FABRIC_SECRET_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "peer: the cluster key must be %u..%u bytes, not %zu",
                          KVBM_FABRIC_SECRET_MIN, KVBM_FABRIC_SECRET_MAX, secret ? len : 0);
  return kvbm_blake3_derive_key(KVBM__CTL_KDF, secret, len, key, KVBM__CTL_KEY);
}

void kvbm__ctl_dir_key(const uint8_t ctl[KVBM__CTL_KEY], const uint8_t from[KVBM__CTL_NONCE],
                       const uint8_t to[KVBM__CTL_NONCE], uint8_t out[KVBM__CTL_KEY]) {
  uint8_t in[4 + 2 * KVBM__CTL_NONCE];
  memcpy(in, "KVPD", 4);
  memcpy(in + 4, from, KVBM__CTL_NONCE);
  memcpy(in + 4 + KVBM__CTL_NONCE, to, KVBM__CTL_NONCE);
  (void)kvbm_blake3_keyed_hash(ctl, in, sizeof in, out, KVBM__CTL_KEY);
}

size_t kvbm__ctl_covered(const uint8_t *msg, size_t len) {
  if (len < KVBM_BLOCK_MSG_FIXED || memcmp(msg, KVBM_BLOCK_MSG_MAGIC, 4) != 0) return len;
  if (kvbm__get_le32(msg + 32) & 2u) return len; /* placed: no body in the message */
  uint64_t end = KVBM_BLOCK_MSG_FIXED + 4 * (uint64_t)kvbm__get_le32(msg + 48) + KVBM_FRAME_HEADER_LEN;
  return end <= len ? (size_t)end : len;
}

static void mac(const uint8_t dir[KVBM__CTL_KEY], const uint8_t *msg, size_t len, uint64_t seq,
                uint8_t out[KVBM__CTL_MAC]) {
  uint8_t s[8];
  kvbm__put_le64(s, seq);
  kvbm_blake3_hasher h;
  (void)kvbm_blake3_hasher_init_keyed(&h, dir);
  kvbm_blake3_hasher_update(&h, msg, kvbm__ctl_covered(msg, len));
  kvbm_blake3_hasher_update(&h, s, sizeof s);
  kvbm_blake3_hasher_finalize(&h, out, KVBM__CTL_MAC);
}

void kvbm__ctl_seal(const uint8_t dir[KVBM__CTL_KEY], uint8_t *msg, size_t len, uint64_t seq) {
  kvbm__put_le64(msg + len, seq);
  mac(dir, msg, len, seq, msg + len + 8);
}

int kvbm__ctl_open(const uint8_t dir[KVBM__CTL_KEY], const uint8_t *msg, size_t len, size_t *body_len,
                   uint64_t *seq, kvbm_error *err) {
  if (len < 4 + KVBM__CTL_TRAILER)
    return kvbm_error_set(err, KVBM_EAUTH, "a message of %zu bytes on a keyed link: too short for its MAC", len);
  size_t n = len - KVBM__CTL_TRAILER;
  uint64_t s = kvbm__get_le64(msg + n);
  uint8_t want[KVBM__CTL_MAC];
  mac(dir, msg, n, s, want);
  volatile uint8_t d = 0; /* constant-time: the time says nothing of where a guess differs */
  for (size_t i = 0; i < KVBM__CTL_MAC; i++) d |= (uint8_t)(want[i] ^ msg[n + 8 + i]);
  if (d != 0) {
    char m[5];
    for (int i = 0; i < 4; i++) m[i] = msg[i] >= 0x20 && msg[i] < 0x7F ? (char)msg[i] : '?';
    m[4] = 0;
    return kvbm_error_set(err, KVBM_EAUTH, "a \"%s\" message of %zu bytes fails the link's MAC (no key, "
                          "another key, changed on the way, or from another connection)", m, len);
  }
  *body_len = n;
  *seq = s;
  return KVBM_OK;
}
