/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/ctl.h (private): the MAC on every message of a keyed peer link
 * (issue 23: "the same holds for the fabric's frames between peers that
 * share a key"; src/peer/ctl.c).
 *
 * Block frames were MAC'd since session 8, the link's other messages
 * (acknowledgements, grants, pulls, removes) were not: anyone who could
 * put a message on the link could say "I hold block h" (a forged KVAC)
 * and make a manager drop the cluster's last copy for room, or say "I
 * dropped it" (a forged KVRM). On a keyed link every message after the
 * hellos now ends with a trailer:
 *
 *   u64 seq   (little-endian: 0 for the first message each way, +1 per
 *              message this side pushes)
 *   16 bytes  keyed BLAKE3 of covered(message) || le64(seq), keyed with
 *              the direction's key (below), first 16 bytes of output
 *
 * covered(message) is the whole message, except for a pushed block
 * message ("KVBB", flags bit 1 clear): there it stops after the MRDN
 * frame header, whose keyed sum already binds the body under the frame
 * key (hashing 2 MiB twice would double the cost of a push; hashing the
 * header binds the envelope, identity and tokens, that the frame MAC
 * does not cover).
 *
 * Keys. The control key is BLAKE3 derive_key(KVBM__CTL_KDF, secret):
 * another context than the frame key's (kvbm_fabric_frame_key) and the
 * side channel's, so a block MAC can never pass for a control MAC. Each
 * side sends a fresh 32-byte nonce in its hello; the key of the direction
 * from A to B is keyed BLAKE3(control key, "KVPD" || nonce_A || nonce_B).
 * So a message captured on one connection does not check on another
 * (other nonces), one reflected back at its sender does not check (the
 * other direction's key), and one replayed on the same connection carries
 * a sequence number already seen (the receiver refuses seq below the next
 * it expects).
 *
 * Nothing here allocates or touches the fabric. Comparisons of MACs are
 * constant-time.
 */
#ifndef KVBM_PEER_CTL_H
#define KVBM_PEER_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#define KVBM__CTL_KDF "kvbm peer control v1"
#define KVBM__CTL_KEY 32u
#define KVBM__CTL_NONCE 32u
#define KVBM__CTL_MAC 16u
#define KVBM__CTL_TRAILER (8u + KVBM__CTL_MAC)

/* The control key from the cluster secret (KVBM_FABRIC_SECRET_MIN..MAX
 * bytes; KVBM_EINVAL otherwise). The caller wipes it. */
int kvbm__ctl_key(const void *secret, size_t len, uint8_t key[KVBM__CTL_KEY], kvbm_error *err);

/* The key of the direction whose sender sent nonce `from` and receiver
 * `to` in their hellos. */
void kvbm__ctl_dir_key(const uint8_t ctl[KVBM__CTL_KEY], const uint8_t from[KVBM__CTL_NONCE],
                       const uint8_t to[KVBM__CTL_NONCE], uint8_t out[KVBM__CTL_KEY]);

/* How many of msg[0..len)'s bytes the MAC covers (see above). */
size_t kvbm__ctl_covered(const uint8_t *msg, size_t len);

/* Writes the trailer for msg[0..len) and seq at msg + len (the caller
 * leaves KVBM__CTL_TRAILER bytes there). */
void kvbm__ctl_seal(const uint8_t dir[KVBM__CTL_KEY], uint8_t *msg, size_t len, uint64_t seq);

/* Checks a received message's trailer with the receiving direction's
 * key: on KVBM_OK *body_len is the message without it and *seq its
 * sequence number (the caller checks the order). KVBM_EAUTH (named in
 * err) for a message too short to carry one or a MAC that does not
 * match: nothing of it may be believed. */
int kvbm__ctl_open(const uint8_t dir[KVBM__CTL_KEY], const uint8_t *msg, size_t len, size_t *body_len,
                   uint64_t *seq, kvbm_error *err);

#endif /* KVBM_PEER_CTL_H */
