/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hello.h (private): the codec of the UCX fabric's handshake, no sockets.
 *
 * Before a peer's worker address may reach UCX, the peer must prove that it
 * holds the shared key. Each end sends, in this order, and reads the same
 * from the peer (the exchange is symmetric; only the role differs):
 *
 *   challenge  40 bytes  "KVFC", u32 version 1, 32-byte nonce (getrandom)
 *   proof      40 bytes  "KVFP", u32 version 1, 32-byte MAC
 *   hello      record    "KVFU", u32 version 2, u32 name length L,
 *                        u32 address length A, L name bytes, A address
 *                        bytes, 32-byte MAC
 *
 * all integers little-endian. K is the 32-byte key derived from the shared
 * secret (BLAKE3 derive_key, context KVBM__HELLO_KDF). MACs are keyed
 * BLAKE3 with K over:
 *
 *   proof: "KVFP" role nonce[accept] nonce[connect]
 *   hello: "KVFU" role nonce[accept] nonce[connect] hello-without-its-MAC
 *
 * where role is the sender's ('A' accepting, 'C' connecting). The proof
 * answers the peer's fresh nonce (no replay) and names the prover's role (a
 * proof reflected back at its maker does not check); the hello's MAC binds
 * the worker address to this handshake, so nobody on the path can swap it.
 * A hello is decoded only after the peer's proof checked, and its MAC is
 * checked before any other field is read. Every comparison of secret-derived
 * bytes is constant-time.
 *
 * Nothing here allocates or touches a socket, so the whole codec is
 * fuzzed (fuzz/fuzz_fabric_hello.c). Threads: a kvbm__hs is used by one
 * thread at a time.
 */
#ifndef KVBM_FABRIC_HELLO_H
#define KVBM_FABRIC_HELLO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/fabric.h"
#include "kvbm/status.h"

#define KVBM__HELLO_KEY 32u   /* the MAC key derived from the secret */
#define KVBM__HELLO_NONCE 32u
#define KVBM__HELLO_MAC 32u
#define KVBM__HELLO_AUTH_LEN 40u /* a challenge or a proof */
#define KVBM__HELLO_FIXED 16u    /* a hello's fields before the name */
/* Largest hello record we accept (UCX worker addresses are a few hundred
 * bytes to a few KiB, one entry per device). */
#define KVBM__HELLO_MAX (64u << 10)
#define KVBM__HELLO_KDF "kvbm 2025-06 fabric side channel key v1"

typedef enum kvbm__role { KVBM__ROLE_ACCEPT = 0, KVBM__ROLE_CONNECT = 1 } kvbm__role;

/* One end's handshake state. */
typedef struct kvbm__hs {
  uint8_t key[KVBM__HELLO_KEY];          /* K, derived from the secret */
  uint8_t nonce[2][KVBM__HELLO_NONCE];       /* by role: [ACCEPT], [CONNECT] */
  kvbm__role role;                           /* this end's */
  bool have_peer_nonce;                      /* the peer's challenge was taken */
  bool authenticated;                        /* the peer's proof checked */
} kvbm__hs;

/* A decoded hello; addr points into the decoded buffer. */
typedef struct kvbm__hello {
  char name[KVBM_FABRIC_NAME_MAX + 1];
  const uint8_t *addr;
  size_t addr_len;
} kvbm__hello;

/* Derives K from a shared secret of KVBM_FABRIC_SECRET_MIN..
 * KVBM_FABRIC_SECRET_MAX bytes (KVBM_EINVAL otherwise). */
int kvbm__hello_derive(const void *secret, size_t len, uint8_t key[KVBM__HELLO_KEY], kvbm_error *err);

/* 32 fresh random bytes from getrandom(); KVBM_EIO if the kernel has none. */
int kvbm__hello_nonce(uint8_t out[KVBM__HELLO_NONCE], kvbm_error *err);

/* Starts a handshake with key K (from kvbm__hello_derive) and this end's
 * nonce (from kvbm__hello_nonce; tests and the fuzzer pass their own). */
void kvbm__hs_init(kvbm__hs *hs, const uint8_t key[KVBM__HELLO_KEY], kvbm__role role,
                   const uint8_t nonce[KVBM__HELLO_NONCE]);

/* Forgets the key and nonces (explicit_bzero). */
void kvbm__hs_wipe(kvbm__hs *hs);

/* This end's challenge. */
void kvbm__hs_challenge(const kvbm__hs *hs, uint8_t out[KVBM__HELLO_AUTH_LEN]);

/* Takes the peer's challenge: KVBM_ETRUNCATED / KVBM_ETOOLONG (length),
 * KVBM_EMAGIC (not a kvbm fabric, or one from before authentication),
 * KVBM_EVERSION, KVBM_EPROTO (our own nonce sent back), KVBM_ESTATE (a
 * second challenge). */
int kvbm__hs_take_challenge(kvbm__hs *hs, const uint8_t *in, size_t len, kvbm_error *err);

/* This end's proof; KVBM_ESTATE before the peer's challenge was taken. */
int kvbm__hs_proof(const kvbm__hs *hs, uint8_t out[KVBM__HELLO_AUTH_LEN], kvbm_error *err);

/* Checks the peer's proof: KVBM_EAUTH when it was not made with K for this
 * handshake (wrong key, replayed or reflected), the codec's errors for a
 * malformed one, KVBM_ESTATE before the challenge. Marks the peer
 * authenticated on success. */
int kvbm__hs_check_proof(kvbm__hs *hs, const uint8_t *in, size_t len, kvbm_error *err);

/* Bytes of a hello with this name and address (0 if they are too long). */
size_t kvbm__hello_size(size_t name_len, size_t addr_len);

/* Encodes this end's hello (name printable ASCII, at most
 * KVBM_FABRIC_NAME_MAX bytes; address 1..KVBM__HELLO_MAX bytes) into
 * out[0..cap); *len gets its size. KVBM_ESTATE before the peer's challenge,
 * KVBM_EINVAL for a bad name or address, KVBM_ENOSPC if cap is short. */
int kvbm__hs_hello_encode(const kvbm__hs *hs, const char *name, const void *addr, size_t addr_len,
                          uint8_t *out, size_t cap, size_t *len, kvbm_error *err);

/* Writes the MAC of this end's hello buf[0 .. len - 32) into its last 32
 * bytes (encode does it; exposed so the fuzzer can MAC malformed bodies as
 * a buggy key holder would). len >= 32. */
void kvbm__hs_hello_seal(const kvbm__hs *hs, uint8_t *buf, size_t len);

/* Decodes the peer's hello: KVBM_ESTATE unless the peer is authenticated;
 * then the MAC (KVBM_EAUTH), then magic, version and lengths (KVBM_EMAGIC,
 * KVBM_EVERSION, KVBM_ETRUNCATED, KVBM_ETOOLONG, KVBM_EFORMAT for an empty
 * address or a name that is not printable). */
int kvbm__hs_hello_decode(const kvbm__hs *hs, const uint8_t *in, size_t len, kvbm__hello *out,
                          kvbm_error *err);

#endif
