/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/frame.h: MRDN v1 frames, the envelope of a block payload on the
 * wire (ADR-0006, disaggregated KV transfer).
 *
 * A frame is a 32-byte header followed by the body. Header, all integers
 * little-endian:
 *   offset  0  4 bytes  magic 'M','R','D','N'
 *   offset  4  u32      version, 1
 *   offset  8  u32      body length in bytes
 *   offset 12  u8       phase label (kvbm_frame_phase)
 *   offset 13  3 bytes  padding, zero
 *   offset 16  16 bytes the first 16 bytes of BLAKE3(body) (plain hash)
 *
 * Version 2 (keyed, issue 23) has the same layout; its 16 bytes at offset
 * 16 are the first 16 of BLAKE3 keyed with a 32-byte key that writer and
 * reader share (a MAC), so that someone who can write the bytes but does
 * not hold the key cannot make a frame that checks. The version tells a
 * reader which it has, and each reader accepts only its own kind:
 *   - a reader without a key refuses a keyed frame (it cannot check it);
 *   - a reader with a key refuses an unkeyed frame (anyone can make one:
 *     that is what an attacker who rewrote the bytes would send);
 *   - a reader with a key refuses a keyed frame whose MAC differs (forged,
 *     another key, or damaged: a keyed reader cannot tell them apart).
 * All three are KVBM_EAUTH. A keyed BLAKE3 costs what a plain one does.
 *
 * Version 3 (sealed, encryption at rest): the body is a 24-byte nonce and
 * then the XChaCha20-Poly1305 ciphertext of the payload; the 16 bytes at
 * offset 16 are the AEAD tag, the associated data the header's first 16
 * bytes. This codec parses such a header and refuses to verify the body
 * (KVBM_EAUTH for every reader here): only the key's holder opens it
 * (G4 values with g4_encrypt, tier/store.c).
 *
 * The byte at offset 12 is the producer's phase label of ADR-0006
 * (ThinkComplete = 0, ThinkActive = 1, OutputCritical = 2): how urgently
 * the receiver will need the block, not where kvbm stores it. kvbm's own
 * storage tier (G1..G4, kvbm/tier.h) is not in the header; a message that
 * needs it carries it outside the 32 bytes (the fabric's block message
 * does, kvbm/fabric.h).
 *
 * The codec knows nothing of transports. Decoding never allocates: bodies
 * are returned as pointers into the caller's buffer, and the streaming
 * path (parse the header, then verify the body, in one piece or many)
 * hands the caller a body length only after checking it against the
 * caller's limit, so a receiver allocates from checked lengths only.
 * Every failure has its own status and a message in `err`:
 *   KVBM_ETRUNCATED  fewer than 32 header bytes, or a body shorter than
 *                    declared (the message says which)
 *   KVBM_EMAGIC      the first 4 bytes are not "MRDN"
 *   KVBM_EVERSION    a version other than 1, 2 or 3
 *   KVBM_EPADDING    nonzero padding bytes
 *   KVBM_EPHASE      a phase byte outside kvbm_frame_phase (3..255)
 *   KVBM_ETOOLONG    a body longer than declared, or a declared length
 *                    above the caller's limit
 *   KVBM_ECHECKSUM   the body does not hash to the header's checksum
 *   KVBM_EAUTH       the frame is not of the reader's kind (keyed or not,
 *                    above), or its MAC does not match the body
 * Checks run in that order of the header's fields (magic, version,
 * padding, phase, length limit), then the body's length, then its hash.
 */
#ifndef KVBM_FRAME_H
#define KVBM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/blake3.h"
#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_FRAME_HEADER_LEN 32
#define KVBM_FRAME_VERSION 1
#define KVBM_FRAME_VERSION_KEYED 2
#define KVBM_FRAME_VERSION_SEALED 3
#define KVBM_FRAME_KEY_LEN 32 /* a MAC key (derive it: kvbm_blake3_derive_key) */
#define KVBM_FRAME_CHECKSUM_LEN 16
/* A sensible receive limit for callers without their own (64 MiB). */
#define KVBM_FRAME_DEFAULT_MAX_BODY (64u << 20)


/* The phase labels of ADR-0006, numbered in the ADR's order. A producer
 * labels each block with the phase of the request that filled it:
 *   THINK_COMPLETE  reasoning that has ended (ExitThink): cold, the first
 *                   to offload and to demote;
 *   THINK_ACTIVE    reasoning still going on;
 *   OUTPUT_CRITICAL output tokens: needed for every next step. */
typedef enum kvbm_frame_phase {
  KVBM_PHASE_THINK_COMPLETE = 0,
  KVBM_PHASE_THINK_ACTIVE = 1,
  KVBM_PHASE_OUTPUT_CRITICAL = 2,
} kvbm_frame_phase;

#define KVBM_FRAME_PHASE_COUNT 3

/* "ThinkComplete", "ThinkActive", "OutputCritical" (the ADR's names), or
 * "?" for any other value. Static strings; never NULL. */
KVBM_EXTERN const char *kvbm_frame_phase_name(int phase);

/* A decoded (and validated) header. */
typedef struct kvbm_frame_header {
  uint32_t version;
  uint32_t body_len;
  kvbm_frame_phase phase;
  uint8_t checksum[KVBM_FRAME_CHECKSUM_LEN];
} kvbm_frame_header;

/* ---- encoding ---- */

/* Bytes a frame with a `body_len`-byte body takes (header + body) in
 * *out. KVBM_ETOOLONG if body_len does not fit the u32 length field. */
KVBM_EXTERN int kvbm_frame_encoded_len(size_t body_len, size_t *out, kvbm_error *err);

/* Writes the 32-byte header for `body` (hashing it) into `header`, for
 * senders that keep the body where it is and send two pieces.
 * KVBM_EPHASE for a phase outside the enum, KVBM_ETOOLONG as above,
 * KVBM_EINVAL for NULL pointers (body may be NULL when body_len is 0). */
KVBM_EXTERN int kvbm_frame_encode_header(kvbm_frame_phase phase, const void *body,
                             size_t body_len,
                             uint8_t header[KVBM_FRAME_HEADER_LEN],
                             kvbm_error *err);

/* Writes the header for a body of `body_len` bytes whose checksum (the
 * first 16 bytes of its plain BLAKE3 hash) the caller computed, e.g. on
 * several threads with a kvbm_blake3_pool, or once for a block that does
 * not change. Hashes nothing. Errors as kvbm_frame_encode_header. */
KVBM_EXTERN int kvbm_frame_encode_header_sum(kvbm_frame_phase phase, size_t body_len,
                                             const uint8_t sum[KVBM_FRAME_CHECKSUM_LEN],
                                             uint8_t header[KVBM_FRAME_HEADER_LEN],
                                             kvbm_error *err);

/* Writes a whole frame into the caller's buffer `out` of `cap` bytes and
 * sets *out_len to its size. With out == NULL it only sets *out_len (size
 * query). KVBM_ENOSPC (and *out_len set) if cap is too small. The body may
 * already sit at out + 32 (then it is not moved) or anywhere else,
 * overlapping or not. Allocates nothing. */
KVBM_EXTERN int kvbm_frame_encode(kvbm_frame_phase phase, const void *body, size_t body_len,
                      void *out, size_t cap, size_t *out_len,
                      kvbm_error *err);

/* ---- decoding ---- */

/* Validates the header at the start of `buf` (`len` bytes available; only
 * the first 32 are read) and fills *hdr. A declared body length above
 * `max_body` is KVBM_ETOOLONG: after success, hdr->body_len is safe to
 * allocate. */
KVBM_EXTERN int kvbm_frame_parse_header(const void *buf, size_t len, uint32_t max_body,
                            kvbm_frame_header *hdr, kvbm_error *err);

/* Checks a complete body against a parsed header: its length (shorter:
 * KVBM_ETRUNCATED, longer: KVBM_ETOOLONG), then its hash. */
KVBM_EXTERN int kvbm_frame_verify_body(const kvbm_frame_header *hdr, const void *body,
                           size_t body_len, kvbm_error *err);

/* kvbm_frame_verify_body for a caller that hashed the body itself (its
 * `body_len` bytes hash to `sum`, the first 16 bytes of their plain
 * BLAKE3): the length check, then the checksum, same statuses and
 * messages. */
KVBM_EXTERN int kvbm_frame_check_sum(const kvbm_frame_header *hdr, size_t body_len,
                                     const uint8_t sum[KVBM_FRAME_CHECKSUM_LEN],
                                     kvbm_error *err);

/* Both steps on a whole frame in memory: `len` must be exactly the frame
 * (trailing bytes are a body longer than declared). On success *body
 * points at the body inside `buf` (no copy) and *hdr is filled. */
KVBM_EXTERN int kvbm_frame_decode(const void *buf, size_t len, uint32_t max_body,
                      kvbm_frame_header *hdr, const uint8_t **body,
                      kvbm_error *err);

/* ---- keyed frames (version 2) ----
 *
 * The same calls with a 32-byte MAC key. `key` NULL is the unkeyed call
 * (version 1) in every one of them, so a caller passes its key, or NULL
 * when it has none, through one path. The key is read, never kept. */

/* kvbm_frame_encode_header, writing a version-2 header (keyed MAC). */
KVBM_EXTERN int kvbm_frame_encode_header_keyed(const uint8_t *key, kvbm_frame_phase phase,
                                               const void *body, size_t body_len,
                                               uint8_t header[KVBM_FRAME_HEADER_LEN],
                                               kvbm_error *err);

/* kvbm_frame_encode_header_sum for a MAC the caller computed (the first
 * 16 bytes of BLAKE3 keyed with the reader's key, e.g. kept since the
 * bytes were written): writes a version-2 header, hashes nothing. */
KVBM_EXTERN int kvbm_frame_encode_header_mac(kvbm_frame_phase phase, size_t body_len,
                                             const uint8_t mac[KVBM_FRAME_CHECKSUM_LEN],
                                             uint8_t header[KVBM_FRAME_HEADER_LEN],
                                             kvbm_error *err);

/* Writes a version-3 (sealed) header for a body of body_len bytes (nonce
 * and ciphertext) with a zero tag: the caller encrypts with the header's
 * first 16 bytes as associated data and writes the tag at offset 16. */
KVBM_EXTERN int kvbm_frame_encode_header_sealed(kvbm_frame_phase phase, size_t body_len,
                                                uint8_t header[KVBM_FRAME_HEADER_LEN],
                                                kvbm_error *err);

/* kvbm_frame_encode, keyed (version 2) when key is not NULL. */
KVBM_EXTERN int kvbm_frame_encode_keyed(const uint8_t *key, kvbm_frame_phase phase,
                                        const void *body, size_t body_len, void *out,
                                        size_t cap, size_t *out_len, kvbm_error *err);

/* kvbm_frame_verify_body for a reader holding `key` (NULL: none): the
 * kind (KVBM_EAUTH when the frame is not of the reader's kind), then the
 * length check, then the MAC (KVBM_EAUTH) or the plain checksum
 * (KVBM_ECHECKSUM). The unkeyed calls (verify_body, check_sum, decode,
 * verifier_init) refuse keyed and sealed frames the same way. */
KVBM_EXTERN int kvbm_frame_verify_body_keyed(const kvbm_frame_header *hdr, const uint8_t *key,
                                             const void *body, size_t body_len,
                                             kvbm_error *err);

/* kvbm_frame_check_sum for a keyed reader that computed the body's MAC
 * itself: KVBM_EAUTH for an unkeyed header or a MAC that differs. */
KVBM_EXTERN int kvbm_frame_check_mac(const kvbm_frame_header *hdr, size_t body_len,
                                     const uint8_t mac[KVBM_FRAME_CHECKSUM_LEN],
                                     kvbm_error *err);

/* kvbm_frame_decode for a reader holding `key` (NULL: none). */
KVBM_EXTERN int kvbm_frame_decode_keyed(const uint8_t *key, const void *buf, size_t len,
                                        uint32_t max_body, kvbm_frame_header *hdr,
                                        const uint8_t **body, kvbm_error *err);

/* ---- verifying a body that arrives in pieces ---- */

/* Caller-owned state (a plain struct, no allocation); fields private. */
typedef struct kvbm_frame_verifier {
  kvbm_frame_header hdr;
  uint64_t seen;
  int failed;
  kvbm_blake3_hasher hasher;
} kvbm_frame_verifier;

/* Starts verifying the body of a header from kvbm_frame_parse_header.
 * KVBM_EAUTH for a keyed header (no key to check it with). */
KVBM_EXTERN int kvbm_frame_verifier_init(kvbm_frame_verifier *v,
                             const kvbm_frame_header *hdr, kvbm_error *err);

/* The same for a reader holding `key` (NULL: kvbm_frame_verifier_init):
 * KVBM_EAUTH for an unkeyed header; finish says KVBM_EAUTH for a MAC that
 * differs. */
KVBM_EXTERN int kvbm_frame_verifier_init_keyed(kvbm_frame_verifier *v,
                                               const kvbm_frame_header *hdr,
                                               const uint8_t *key, kvbm_error *err);

/* Feeds the next piece. KVBM_ETOOLONG as soon as the pieces exceed the
 * declared length (the verifier then stays failed). */
KVBM_EXTERN int kvbm_frame_verifier_update(kvbm_frame_verifier *v, const void *piece,
                               size_t len, kvbm_error *err);

/* Ends the body: KVBM_ETRUNCATED if fewer bytes than declared came,
 * KVBM_ECHECKSUM if the hash differs, KVBM_ESTATE after a failed update. */
KVBM_EXTERN int kvbm_frame_verifier_finish(kvbm_frame_verifier *v, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_FRAME_H */
