/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rawpeer.h: a peer played by a test over a raw fabric end, keyed or not,
 * written from the wire's description (docs/areas/fabric.md, "Keyed
 * control messages"; kvbm/peer.h), not from src/peer/: its hello, its
 * confirmation and its MACs are this file's own code over the public
 * BLAKE3 calls, so a test that a manager accepts what it seals checks the
 * manager against the documented layout, and a test that it refuses what
 * the raw peer forges checks the refusal.
 *
 * A raw peer offers a small landing zone in the tests' block shape
 * (tier/tier_testutil.h's layout: 3 layers, outer 2, page 4, inner 8,
 * 2-byte elements), imports the manager's, and then pushes and takes
 * messages one at a time. Keyed, every message it pushes with rp_send is
 * sealed (a sequence number from 0 and a keyed BLAKE3-128), and every
 * message it takes with rp_next is checked and unsealed; rp_push_raw puts
 * bytes on the link as they are (forged or replayed ones).
 */
#ifndef KVBM_TESTS_PEER_RAWPEER_H
#define KVBM_TESTS_PEER_RAWPEER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kvbm/blake3.h"
#include "kvbm/fabric.h"

#define RP_CTX "kvbm peer control v1" /* the derive context the wire names */

typedef struct rawpeer {
  kvbm_fabric *f;
  kvbm_storage *s;
  kvbm_fabric_local_set *ls;
  kvbm_fabric_remote_set *rs;
  uint64_t land_id;              /* the manager's landing zone */
  const uint8_t *secret;         /* NULL: an unkeyed peer */
  size_t secret_len;
  uint32_t version;              /* its hello's (2) */
  uint8_t nonce[32], theirs[32]; /* the hellos' nonces */
  uint8_t tx[32], rx[32];        /* the directions' keys */
  uint8_t hello_sent[32], hello_got[32];
  uint64_t tx_seq;
  bool ok; /* the hello (and keyed, the confirmation) went through */
  /* hostile hellos: reflect: wait for the manager's hello and send its
   * own nonce back in ours; lie: a confirmation (sealed right) naming
   * another hello than the one received, as if it was changed on the way */
  bool reflect, lie;
} rawpeer;

static inline void rp_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t rp_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static inline uint32_t rp_get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The key of the direction from the hello nonce `from` to `to`, under the
 * control key derived from `secret` (rp_dir_key_ctx: under any context,
 * to forge with the wrong one). */
static inline void rp_dir_key_ctx(const char *ctx, const uint8_t *secret, size_t len, const uint8_t from[32],
                                  const uint8_t to[32], uint8_t out[32]) {
  uint8_t ctl[32], in[68];
  kvbm_blake3_derive_key(ctx, secret, len, ctl, 32);
  memcpy(in, "KVPD", 4);
  memcpy(in + 4, from, 32);
  memcpy(in + 36, to, 32);
  kvbm_blake3_keyed_hash(ctl, in, sizeof in, out, 32);
}

/* The bytes the MAC covers: all of a message, but for a pushed block
 * message ("KVBB", flags bit 1 clear) only up to the end of its frame
 * header (52 + 4 x tokens + 32). */
static inline size_t rp_covered(const uint8_t *m, size_t len) {
  if (len < 52 || memcmp(m, "KVBB", 4) != 0 || (rp_get32(m + 32) & 2u)) return len;
  uint64_t end = 52 + 4 * (uint64_t)rp_get32(m + 48) + 32;
  return end <= len ? (size_t)end : len;
}

/* m[0..len) sealed with key and seq into out (len + 24 bytes). */
static inline size_t rp_seal_with(const uint8_t key[32], const uint8_t *m, size_t len, uint64_t seq, uint8_t *out) {
  memmove(out, m, len);
  rp_le64(out + len, seq);
  kvbm_blake3_hasher h;
  kvbm_blake3_hasher_init_keyed(&h, key);
  kvbm_blake3_hasher_update(&h, out, rp_covered(out, len));
  kvbm_blake3_hasher_update(&h, out + len, 8);
  kvbm_blake3_hasher_finalize(&h, out + len + 8, 16);
  return len + 24;
}

/* Pushes bytes as they are (a forgery, a replay). */
static inline int rp_push_raw(rawpeer *r, const uint8_t *m, size_t len) {
  return kvbm_fabric_push(r->f, m, len, NULL, NULL);
}

/* Pushes m, sealed when keyed (the next sequence number); the bytes that
 * went out are copied to `wire` (NULL: not kept) and their length
 * returned (0 on a failed push). */
static inline size_t rp_send(rawpeer *r, const uint8_t *m, size_t len, uint8_t *wire) {
  uint8_t *out = malloc(len + 24);
  size_t n = r->secret ? rp_seal_with(r->tx, m, len, r->tx_seq++, out) : (memcpy(out, m, len), len);
  int rc = rp_push_raw(r, out, n);
  if (wire) memcpy(wire, out, n);
  free(out);
  return rc == KVBM_OK ? n : 0;
}

/* The next message from the manager (timeout_ms), its trailer checked
 * and removed when keyed: its length, or -1 (none, too big, or a MAC that
 * does not check, which *bad_mac says). */
static inline long rp_next(rawpeer *r, uint8_t *buf, size_t cap, int timeout_ms, bool *bad_mac) {
  kvbm_fabric_handle h;
  size_t len = 0;
  if (bad_mac) *bad_mac = false;
  if (kvbm_fabric_next(r->f, timeout_ms, &h, &len, NULL) || len > cap) return -1;
  if (kvbm_fabric_pull(r->f, h, buf, cap, &len, 1000, NULL)) return -1;
  if (!r->secret) return (long)len;
  if (len < 28) {
    if (bad_mac) *bad_mac = true;
    return -1;
  }
  size_t n = len - 24;
  uint8_t *chk = malloc(len);
  rp_seal_with(r->rx, buf, n, rp_get64(buf + n), chk);
  bool ok = memcmp(chk + n + 8, buf + n + 8, 16) == 0;
  free(chk);
  if (!ok) {
    if (bad_mac) *bad_mac = true;
    return -1;
  }
  return (long)n;
}

/* The raw peer's side of attach (run on its own thread while the manager
 * attaches): hello (keyed: flags 1 and a nonce), the manager's hello
 * imported, then keyed the confirmations both ways. */
static inline void *rp_hello(void *arg) {
  rawpeer *r = arg;
  kvbm_layout_config lc = {.num_blocks = 2, .num_layers = 3, .outer_dim = 2, .page_size = 4, .inner_dim = 8,
                           .dtype_size = 2, .alignment = 256};
  kvbm_layout lay;
  kvbm_layout_desc d = {0};
  uint8_t *wire;
  size_t wlen;
  if (kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, NULL) ||
      kvbm_fabric_storage_create(r->f, &lay, &r->s, NULL) || kvbm_storage_describe(r->s, &lay, 7, &d, NULL) ||
      kvbm_fabric_register(r->f, &d, &r->ls, NULL) || kvbm_fabric_export(r->ls, &wire, &wlen, NULL))
    return NULL;
  kvbm_layout_desc_release(&d);
  const size_t extra = r->secret ? 32 : 0;
  kvbm_fabric_handle hd;
  size_t len = 0;
  uint8_t *buf = NULL;
  if (r->reflect) { /* theirs first: its nonce becomes ours */
    if (kvbm_fabric_next(r->f, 5000, &hd, &len, NULL)) return NULL;
    buf = malloc(len);
    if (kvbm_fabric_pull(r->f, hd, buf, len, &len, 1000, NULL) || len < 64) {
      free(buf);
      return NULL;
    }
  }
  uint8_t *msg = calloc(1, 32 + wlen + extra);
  memcpy(msg, "KVPH", 4);
  msg[4] = (uint8_t)(r->version ? r->version : 2);
  msg[16] = r->secret ? 1 : 0;
  rp_le64(msg + 24, wlen);
  memcpy(msg + 32, wire, wlen);
  if (r->secret) {
    if (r->reflect) memcpy(r->nonce, buf + len - 32, 32);
    else if (getrandom(r->nonce, 32, 0) != 32) abort();
    memcpy(msg + 32 + wlen, r->nonce, 32);
  }
  kvbm_blake3_hash(msg, 32 + wlen + extra, r->hello_sent, 32);
  kvbm_fabric_push(r->f, msg, 32 + wlen + extra, NULL, NULL);
  free(msg);
  free(wire);
  bool ok = true;
  if (!buf) {
    if (kvbm_fabric_next(r->f, 5000, &hd, &len, NULL)) return NULL;
    buf = malloc(len);
    ok = kvbm_fabric_pull(r->f, hd, buf, len, &len, 1000, NULL) == KVBM_OK;
  }
  ok = ok && len >= 32;
  size_t theirs_extra = ok && (buf[16] & 1) ? 32 : 0;
  if (ok && kvbm_fabric_import(r->f, buf + 32, len - 32 - theirs_extra, &r->rs, NULL) == KVBM_OK)
    r->land_id = kvbm_fabric_remote_desc(r->rs)->block_set_id;
  else
    ok = false;
  if (ok && r->secret && theirs_extra) {
    memcpy(r->theirs, buf + len - 32, 32);
    kvbm_blake3_hash(buf, len, r->hello_got, 32);
    rp_dir_key_ctx(RP_CTX, r->secret, r->secret_len, r->nonce, r->theirs, r->tx);
    rp_dir_key_ctx(RP_CTX, r->secret, r->secret_len, r->theirs, r->nonce, r->rx);
    uint8_t c[72];
    memcpy(c, "KVAU", 4);
    memset(c + 4, 0, 4);
    memcpy(c + 8, r->hello_sent, 32);
    memcpy(c + 40, r->hello_got, 32);
    if (r->lie) c[40] ^= 1;
    rp_send(r, c, sizeof c, NULL);
    uint8_t got[128];
    long n = rp_next(r, got, sizeof got, 2000, NULL);
    ok = n == 72 && memcmp(got, "KVAU", 4) == 0 && memcmp(got + 8, r->hello_got, 32) == 0 &&
         memcmp(got + 40, r->hello_sent, 32) == 0;
  } else if (ok && (r->secret != NULL) != (theirs_extra != 0)) {
    ok = false; /* one side keyed, the other not: refused, as a manager does */
  }
  r->ok = ok;
  free(buf);
  return NULL;
}

static inline void rp_free(rawpeer *r) {
  kvbm_fabric_remote_set_release(r->rs);
  kvbm_fabric_local_set_release(r->ls);
  kvbm_storage_release(r->s);
  kvbm_fabric_destroy(r->f);
}

#endif /* KVBM_TESTS_PEER_RAWPEER_H */
