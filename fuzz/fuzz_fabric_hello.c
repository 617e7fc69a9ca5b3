/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_fabric_hello.c: libFuzzer target for the UCX fabric's handshake
 * codec (src/fabric/hello.c): what a listener reads from a stranger.
 * fuzz-modules: common service metrics blake3 frame layout fabric
 * fuzz-libs: ucp ucs
 *
 * The listening end's state is fixed (key, nonce); a genuine connecting
 * end with the same key is built alongside, so every verdict has an
 * oracle. Input byte 0 picks a mode:
 *   0: raw bytes as challenge (40), proof (40) and hello (the rest), as a
 *      stranger would send them;
 *   1: a genuine transcript (the connector's nonce from the input), then
 *      edits from the input (pairs: u16 offset, u8 xor) over it;
 *   2: the rest is a hello body from a peer that holds the key (the
 *      harness MACs it), to reach the field checks behind the MAC.
 * Properties: a challenge is taken only with the right magic and version
 * and a nonce that is not the listener's; a proof is accepted exactly when
 * it equals the proof a key holder makes for the nonce received; a hello is
 * decoded only after that, exactly when its MAC is the key holder's, and
 * then it re-encodes to the same bytes with its address inside the input;
 * every refusal has a negative status and a message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/hello.h"

#define CHECK(x)                \
  do {                          \
    if (!(x)) __builtin_trap(); \
  } while (0)

static const char kSecret[] = "fuzzing secret, sixteen bytes or more";
static const uint8_t kListenerNonce[KVBM__HELLO_NONCE] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

static void refused(int rc, const kvbm_error *e) {
  CHECK(rc < 0);
  CHECK(e->code == rc && e->msg[0] != '\0');
}

/* Feeds challenge, proof and hello to a listener, checking each verdict
 * against what a key holder would have sent. */
static void listener_reads(const uint8_t *ch, size_t chn, const uint8_t *pr, size_t prn, const uint8_t *he,
                           size_t hen) {
  uint8_t key[KVBM__HELLO_KEY];
  CHECK(kvbm__hello_derive(kSecret, sizeof kSecret - 1, key, NULL) == KVBM_OK);
  kvbm__hs l;
  kvbm__hs_init(&l, key, KVBM__ROLE_ACCEPT, kListenerNonce);
  kvbm_error e = {0};
  kvbm__hello h;
  /* nothing is decoded before the peer proved the key */
  CHECK(kvbm__hs_hello_decode(&l, he, hen, &h, &e) == KVBM_ESTATE);
  int rc = kvbm__hs_take_challenge(&l, ch, chn, &e);
  if (rc) {
    refused(rc, &e);
    CHECK(kvbm__hs_check_proof(&l, pr, prn, &e) == KVBM_ESTATE);
    return;
  }
  CHECK(chn == KVBM__HELLO_AUTH_LEN && memcmp(ch, "KVFC\x01\0\0\0", 8) == 0);
  CHECK(memcmp(ch + 8, kListenerNonce, KVBM__HELLO_NONCE) != 0);
  /* the oracle: a key holder connecting with the nonce that was received */
  kvbm__hs c;
  kvbm__hs_init(&c, key, KVBM__ROLE_CONNECT, ch + 8);
  uint8_t lch[KVBM__HELLO_AUTH_LEN], good[KVBM__HELLO_AUTH_LEN];
  kvbm__hs_challenge(&l, lch);
  CHECK(kvbm__hs_take_challenge(&c, lch, sizeof lch, NULL) == KVBM_OK);
  CHECK(kvbm__hs_proof(&c, good, NULL) == KVBM_OK);
  bool genuine = prn == sizeof good && memcmp(pr, good, sizeof good) == 0;
  rc = kvbm__hs_check_proof(&l, pr, prn, &e);
  CHECK((rc == KVBM_OK) == genuine);
  if (rc) {
    refused(rc, &e);
    CHECK(kvbm__hs_hello_decode(&l, he, hen, &h, &e) == KVBM_ESTATE);
    return;
  }
  rc = kvbm__hs_hello_decode(&l, he, hen, &h, &e);
  if (rc) {
    refused(rc, &e);
    return;
  }
  /* accepted: the key holder's hello, byte for byte, address inside it */
  CHECK(h.addr >= he && h.addr + h.addr_len <= he + hen && h.addr_len > 0);
  size_t llen = strlen(h.name);
  CHECK(llen >= 1 && llen <= KVBM_FABRIC_NAME_MAX);
  uint8_t *again = malloc(hen);
  size_t n = 0;
  CHECK(again && kvbm__hs_hello_encode(&c, h.name, h.addr, h.addr_len, again, hen, &n, NULL) == KVBM_OK);
  CHECK(n == hen && memcmp(again, he, n) == 0);
  free(again);
  kvbm__hs_wipe(&c);
  kvbm__hs_wipe(&l);
}

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

/* A genuine connector's challenge, proof and hello, in one buffer. */
static size_t transcript(const uint8_t nonce[KVBM__HELLO_NONCE], const char *name, const uint8_t *addr,
                         size_t alen, uint8_t *out, size_t cap) {
  uint8_t key[KVBM__HELLO_KEY];
  CHECK(kvbm__hello_derive(kSecret, sizeof kSecret - 1, key, NULL) == KVBM_OK);
  kvbm__hs l, c;
  kvbm__hs_init(&l, key, KVBM__ROLE_ACCEPT, kListenerNonce);
  kvbm__hs_init(&c, key, KVBM__ROLE_CONNECT, nonce);
  uint8_t lch[KVBM__HELLO_AUTH_LEN];
  kvbm__hs_challenge(&l, lch);
  kvbm__hs_challenge(&c, out);
  if (kvbm__hs_take_challenge(&c, lch, sizeof lch, NULL) != KVBM_OK) return 0; /* our own nonce */
  CHECK(kvbm__hs_proof(&c, out + KVBM__HELLO_AUTH_LEN, NULL) == KVBM_OK);
  size_t n = 0;
  CHECK(kvbm__hs_hello_encode(&c, name, addr, alen, out + 2 * KVBM__HELLO_AUTH_LEN,
                              cap - 2 * KVBM__HELLO_AUTH_LEN, &n, NULL) == KVBM_OK);
  return 2 * KVBM__HELLO_AUTH_LEN + n;
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t n) {
  if (n == 0) return 0;
  uint8_t mode = in[0] % 3;
  in++, n--;
  if (mode == 0) {
    size_t a = n < 40 ? n : 40, b = n - a < 40 ? n - a : 40;
    listener_reads(in, a, in + a, b, in + a + b, n - a - b);
    return 0;
  }
  if (mode == 1) {
    if (n < KVBM__HELLO_NONCE) return 0;
    static uint8_t buf[2 * KVBM__HELLO_AUTH_LEN + KVBM__HELLO_FIXED + 64 + 512 + KVBM__HELLO_MAC];
    uint8_t addr[300];
    for (size_t i = 0; i < sizeof addr; i++) addr[i] = (uint8_t)(i * 7 + 1);
    size_t alen = 1 + in[KVBM__HELLO_NONCE - 1] % sizeof addr;
    size_t len = transcript(in, "node-a", addr, alen, buf, sizeof buf);
    if (!len) return 0;
    size_t i = KVBM__HELLO_NONCE;
    while (i + 3 <= n) {
      buf[rd16(in + i) % len] ^= in[i + 2];
      i += 3;
    }
    listener_reads(buf, 40, buf + 40, 40, buf + 80, len - 80);
    return 0;
  }
  /* mode 2: a hello body of the fuzzer's, MAC'd as a key holder would */
  if (n > 4096) return 0;
  uint8_t key[KVBM__HELLO_KEY], nonce[KVBM__HELLO_NONCE] = {42};
  CHECK(kvbm__hello_derive(kSecret, sizeof kSecret - 1, key, NULL) == KVBM_OK);
  uint8_t *buf = malloc(2 * KVBM__HELLO_AUTH_LEN + n + KVBM__HELLO_MAC + 600);
  CHECK(buf);
  uint8_t addr[1] = {1};
  size_t len = transcript(nonce, "x", addr, 1, buf, 2 * KVBM__HELLO_AUTH_LEN + n + KVBM__HELLO_MAC + 600);
  CHECK(len);
  /* replace the genuine hello by the input, MAC'd with the genuine state */
  kvbm__hs l, c;
  kvbm__hs_init(&l, key, KVBM__ROLE_ACCEPT, kListenerNonce);
  kvbm__hs_init(&c, key, KVBM__ROLE_CONNECT, nonce);
  uint8_t lch[KVBM__HELLO_AUTH_LEN];
  kvbm__hs_challenge(&l, lch);
  CHECK(kvbm__hs_take_challenge(&c, lch, sizeof lch, NULL) == KVBM_OK);
  uint8_t *he = buf + 2 * KVBM__HELLO_AUTH_LEN;
  memcpy(he, in, n);
  kvbm__hs_hello_seal(&c, he, n + KVBM__HELLO_MAC);
  listener_reads(buf, 40, buf + 40, 40, he, n + KVBM__HELLO_MAC);
  free(buf);
  return 0;
}
