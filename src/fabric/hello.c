/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hello.c: the handshake codec of the UCX fabric (see hello.h for the wire
 * format and what each MAC covers).
 *
 * Why this shape. The side channel is a plain TCP port that anyone who can
 * reach the host can connect to, and what it carries ends up in UCX's
 * address unpacker, which trusts its input (a hello of 0xff bytes made UCX
 * assert; mutated addresses crashed ucp_ep_create). So the one rule here is
 * that the peer proves the shared key before any of its bytes are
 * interpreted beyond a fixed-size, fixed-layout challenge, and the hello it
 * sends afterwards is authenticated as a whole before its fields are read.
 *
 *  - Challenge and response, both ways: each end picks a fresh 32-byte nonce
 *    (getrandom) and answers the peer's with a keyed-BLAKE3 MAC over both
 *    nonces and its own role. A recorded proof is useless against a new
 *    nonce, and one reflected back at its maker carries the wrong role.
 *  - The hello's MAC covers the same transcript (role, both nonces) and
 *    every byte of the hello, so a worker address cannot be swapped on the
 *    way, or replayed from another connection.
 *  - The key is derived from the shared secret with BLAKE3's derive_key
 *    mode under a context string of this protocol, so a secret reused
 *    elsewhere does not yield the same MAC key.
 *  - Secret-dependent comparisons use a constant-time compare; the key and
 *    nonces are wiped when the handshake state is.
 *  - Fixed sizes where possible: challenge and proof are exactly 40 bytes,
 *    read without a length prefix, so a peer cannot make us allocate before
 *    it has proved anything.
 */
#include "fabric/hello.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "common/bytes.h"
#include "kvbm/blake3.h"

#define CHALLENGE_MAGIC "KVFC"
#define PROOF_MAGIC "KVFP"
#define HELLO_MAGIC "KVFU"
#define AUTH_VERSION 1u
#define HELLO_VERSION 2u

static const char kRole[2] = {'A', 'C'};

/* Constant-time equality: the time does not depend on where bytes differ. */
static bool ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  volatile uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= (uint8_t)(a[i] ^ b[i]);
  return d == 0;
}

int kvbm__hello_derive(const void *secret, size_t len, uint8_t key[KVBM__HELLO_KEY], kvbm_error *err) {
  if (!secret || len < KVBM_FABRIC_SECRET_MIN || len > KVBM_FABRIC_SECRET_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: the shared key must be %u..%u bytes, not %zu",
                          KVBM_FABRIC_SECRET_MIN, KVBM_FABRIC_SECRET_MAX, secret ? len : 0);
  kvbm_blake3_derive_key(KVBM__HELLO_KDF, secret, len, key, KVBM__HELLO_KEY);
  return KVBM_OK;
}

int kvbm__hello_nonce(uint8_t out[KVBM__HELLO_NONCE], kvbm_error *err) {
  size_t got = 0;
  while (got < KVBM__HELLO_NONCE) {
    ssize_t n = getrandom(out + got, KVBM__HELLO_NONCE - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return kvbm_error_set(err, KVBM_EIO, "fabric: getrandom: %s", n < 0 ? strerror(errno) : "no bytes");
    got += (size_t)n;
  }
  return KVBM_OK;
}

void kvbm__hs_init(kvbm__hs *hs, const uint8_t key[KVBM__HELLO_KEY], kvbm__role role,
                   const uint8_t nonce[KVBM__HELLO_NONCE]) {
  memset(hs, 0, sizeof *hs);
  memcpy(hs->key, key, KVBM__HELLO_KEY);
  hs->role = role;
  memcpy(hs->nonce[role], nonce, KVBM__HELLO_NONCE);
}

void kvbm__hs_wipe(kvbm__hs *hs) {
  if (hs) explicit_bzero(hs, sizeof *hs);
}

void kvbm__hs_challenge(const kvbm__hs *hs, uint8_t out[KVBM__HELLO_AUTH_LEN]) {
  memcpy(out, CHALLENGE_MAGIC, 4);
  kvbm__put_le32(out + 4, AUTH_VERSION);
  memcpy(out + 8, hs->nonce[hs->role], KVBM__HELLO_NONCE);
}

/* Magic, version and exact length of a challenge or a proof. */
static int check_auth_msg(const uint8_t *in, size_t len, const char *magic, const char *what, kvbm_error *err) {
  if (len < KVBM__HELLO_AUTH_LEN)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: handshake: %s of %zu bytes, expected %u", what, len,
                          KVBM__HELLO_AUTH_LEN);
  if (len > KVBM__HELLO_AUTH_LEN)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: handshake: %s of %zu bytes, expected %u", what, len,
                          KVBM__HELLO_AUTH_LEN);
  if (memcmp(in, magic, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC,
                          "fabric: handshake: the peer sent no %s: not a kvbm fabric, or one without "
                          "authentication",
                          what);
  if (kvbm__get_le32(in + 4) != AUTH_VERSION)
    return kvbm_error_set(err, KVBM_EVERSION, "fabric: handshake: %s version %u, expected %u", what,
                          kvbm__get_le32(in + 4), AUTH_VERSION);
  return KVBM_OK;
}

int kvbm__hs_take_challenge(kvbm__hs *hs, const uint8_t *in, size_t len, kvbm_error *err) {
  if (hs->have_peer_nonce) return kvbm_error_set(err, KVBM_ESTATE, "fabric: handshake: a second challenge");
  int rc = check_auth_msg(in, len, CHALLENGE_MAGIC, "challenge", err);
  if (rc) return rc;
  if (ct_equal(in + 8, hs->nonce[hs->role], KVBM__HELLO_NONCE))
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: handshake: the peer sent our own challenge back");
  memcpy(hs->nonce[!hs->role], in + 8, KVBM__HELLO_NONCE);
  hs->have_peer_nonce = true;
  return KVBM_OK;
}

/* Starts a MAC over the transcript: tag, the sender's role, both nonces. */
static void mac_begin(const kvbm__hs *hs, kvbm_blake3_hasher *h, const char *tag, kvbm__role sender) {
  kvbm_blake3_hasher_init_keyed(h, hs->key);
  kvbm_blake3_hasher_update(h, tag, 4);
  kvbm_blake3_hasher_update(h, &kRole[sender], 1);
  kvbm_blake3_hasher_update(h, hs->nonce[KVBM__ROLE_ACCEPT], KVBM__HELLO_NONCE);
  kvbm_blake3_hasher_update(h, hs->nonce[KVBM__ROLE_CONNECT], KVBM__HELLO_NONCE);
}

static void proof_mac(const kvbm__hs *hs, kvbm__role sender, uint8_t mac[KVBM__HELLO_MAC]) {
  kvbm_blake3_hasher h;
  mac_begin(hs, &h, PROOF_MAGIC, sender);
  kvbm_blake3_hasher_finalize(&h, mac, KVBM__HELLO_MAC);
  explicit_bzero(&h, sizeof h);
}

int kvbm__hs_proof(const kvbm__hs *hs, uint8_t out[KVBM__HELLO_AUTH_LEN], kvbm_error *err) {
  if (!hs->have_peer_nonce)
    return kvbm_error_set(err, KVBM_ESTATE, "fabric: handshake: proof before the peer's challenge");
  memcpy(out, PROOF_MAGIC, 4);
  kvbm__put_le32(out + 4, AUTH_VERSION);
  proof_mac(hs, hs->role, out + 8);
  return KVBM_OK;
}

int kvbm__hs_check_proof(kvbm__hs *hs, const uint8_t *in, size_t len, kvbm_error *err) {
  if (!hs->have_peer_nonce)
    return kvbm_error_set(err, KVBM_ESTATE, "fabric: handshake: proof before the peer's challenge");
  int rc = check_auth_msg(in, len, PROOF_MAGIC, "proof", err);
  if (rc) return rc;
  uint8_t want[KVBM__HELLO_MAC];
  proof_mac(hs, !hs->role, want);
  bool ok = ct_equal(want, in + 8, KVBM__HELLO_MAC);
  explicit_bzero(want, sizeof want);
  if (!ok)
    return kvbm_error_set(err, KVBM_EAUTH,
                          "fabric: handshake: the peer did not prove the shared key (wrong key?)");
  hs->authenticated = true;
  return KVBM_OK;
}

size_t kvbm__hello_size(size_t name_len, size_t addr_len) {
  if (name_len > KVBM_FABRIC_NAME_MAX || addr_len > KVBM__HELLO_MAX) return 0;
  size_t n = KVBM__HELLO_FIXED + name_len + addr_len + KVBM__HELLO_MAC;
  return n > KVBM__HELLO_MAX ? 0 : n;
}

static void hello_mac(const kvbm__hs *hs, kvbm__role sender, const uint8_t *body, size_t len,
                      uint8_t mac[KVBM__HELLO_MAC]) {
  kvbm_blake3_hasher h;
  mac_begin(hs, &h, HELLO_MAGIC, sender);
  kvbm_blake3_hasher_update(&h, body, len);
  kvbm_blake3_hasher_finalize(&h, mac, KVBM__HELLO_MAC);
  explicit_bzero(&h, sizeof h);
}

void kvbm__hs_hello_seal(const kvbm__hs *hs, uint8_t *buf, size_t len) {
  hello_mac(hs, hs->role, buf, len - KVBM__HELLO_MAC, buf + len - KVBM__HELLO_MAC);
}

static bool printable(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) return false;
  return true;
}

int kvbm__hs_hello_encode(const kvbm__hs *hs, const char *name, const void *addr, size_t addr_len,
                          uint8_t *out, size_t cap, size_t *len, kvbm_error *err) {
  if (!hs->have_peer_nonce)
    return kvbm_error_set(err, KVBM_ESTATE, "fabric: handshake: hello before the peer's challenge");
  size_t llen = name ? strlen(name) : 0;
  if (!name || llen == 0 || !printable(name, llen))
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: handshake: the node name must be printable ASCII");
  if (!addr || addr_len == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: handshake: empty worker address");
  size_t n = kvbm__hello_size(llen, addr_len);
  if (n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: handshake: node name of %zu or address of %zu bytes too long",
                          llen, addr_len);
  if (!out || cap < n)
    return kvbm_error_set(err, KVBM_ENOSPC, "fabric: handshake: a hello of %zu bytes, room for %zu", n, cap);
  memcpy(out, HELLO_MAGIC, 4);
  kvbm__put_le32(out + 4, HELLO_VERSION);
  kvbm__put_le32(out + 8, (uint32_t)llen);
  kvbm__put_le32(out + 12, (uint32_t)addr_len);
  memcpy(out + KVBM__HELLO_FIXED, name, llen);
  memcpy(out + KVBM__HELLO_FIXED + llen, addr, addr_len);
  kvbm__hs_hello_seal(hs, out, n);
  *len = n;
  return KVBM_OK;
}

int kvbm__hs_hello_decode(const kvbm__hs *hs, const uint8_t *in, size_t len, kvbm__hello *out,
                          kvbm_error *err) {
  if (!hs->authenticated)
    return kvbm_error_set(err, KVBM_ESTATE, "fabric: handshake: a hello from a peer that has not proved the key");
  if (len < KVBM__HELLO_FIXED + KVBM__HELLO_MAC)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: handshake: hello of %zu bytes", len);
  if (len > KVBM__HELLO_MAX)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: handshake: hello of %zu bytes (limit %u)", len,
                          KVBM__HELLO_MAX);
  /* The MAC first: nothing of an unauthenticated hello is read. */
  uint8_t want[KVBM__HELLO_MAC];
  hello_mac(hs, !hs->role, in, len - KVBM__HELLO_MAC, want);
  bool ok = ct_equal(want, in + len - KVBM__HELLO_MAC, KVBM__HELLO_MAC);
  explicit_bzero(want, sizeof want);
  if (!ok)
    return kvbm_error_set(err, KVBM_EAUTH, "fabric: handshake: the peer's hello does not carry its MAC");
  if (memcmp(in, HELLO_MAGIC, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC, "fabric: handshake: hello magic");
  if (kvbm__get_le32(in + 4) != HELLO_VERSION)
    return kvbm_error_set(err, KVBM_EVERSION, "fabric: handshake: hello version %u, expected %u", kvbm__get_le32(in + 4),
                          HELLO_VERSION);
  uint64_t llen = kvbm__get_le32(in + 8), alen = kvbm__get_le32(in + 12);
  uint64_t body = len - KVBM__HELLO_FIXED - KVBM__HELLO_MAC;
  if (llen + alen < body)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: handshake: hello has bytes after its fields");
  if (llen + alen > body)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "fabric: handshake: hello shorter than its fields");
  const char *name = (const char *)in + KVBM__HELLO_FIXED;
  if (llen == 0 || llen > KVBM_FABRIC_NAME_MAX || !printable(name, (size_t)llen))
    return kvbm_error_set(err, KVBM_EFORMAT, "fabric: handshake: the peer's node name is not 1..%d printable bytes",
                          KVBM_FABRIC_NAME_MAX);
  if (alen == 0) return kvbm_error_set(err, KVBM_EFORMAT, "fabric: handshake: empty worker address");
  memcpy(out->name, name, (size_t)llen);
  out->name[llen] = '\0';
  out->addr = in + KVBM__HELLO_FIXED + llen;
  out->addr_len = (size_t)alen;
  return KVBM_OK;
}
