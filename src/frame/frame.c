/* SPDX-License-Identifier: Apache-2.0 */
/*
 * frame.c: the MRDN v1 frame codec (format in kvbm/frame.h).
 *
 * Design. The header is read and written byte by byte with explicit
 * little-endian helpers, so the code is independent of host endianness and
 * alignment and never casts the caller's buffer to a struct. Decoding is
 * split in two steps that a receiver can run apart (header when 32 bytes
 * have come, body when the declared length has), and the whole-frame
 * decoder is just both steps. Nothing here allocates: the checked body
 * length is the caller's to allocate from, the body stays in the caller's
 * buffer. The checksum is the plain BLAKE3 hash truncated to 16 bytes; the
 * hasher picks its SIMD path, so verifying a large body runs at hashing
 * speed.
 *
 * The header's byte 12 is ADR-0006's phase label, checked against the
 * three labels the ADR defines and refused with its own status
 * (KVBM_EPHASE) otherwise: a producer written to the ADR and kvbm read the
 * byte the same way. Until issue 12 kvbm wrote its storage tier (G1..G4)
 * there, which an ADR reader would have taken for a phase.
 *
 * Keyed frames (version 2, issue 23). A G4 value or a fabric message may
 * be written by anyone who can reach the store or the wire; a plain BLAKE3
 * proves only that the bytes are what their writer meant, and an attacker
 * recomputes it. A keyed frame's sum is BLAKE3 in keyed mode (a MAC) under
 * a key the readers share, at the same cost. The version says which kind a
 * frame is, so nobody has to guess: a reader with a key accepts keyed
 * frames only (an unkeyed one is exactly what a forger can make), a reader
 * without one refuses keyed frames (it cannot check them). Both refusals
 * and a MAC that differs are KVBM_EAUTH, apart from ECHECKSUM (damage to
 * an unkeyed frame). The MAC comparison runs in constant time.
 *
 * Trade-off: checks stop at the first problem, in header field order. A
 * frame with two problems reports the first one only; that keeps each
 * status meaning one precise thing.
 */
#include "kvbm/frame.h"

#include <stdbool.h>
#include <string.h>

#include "common/bytes.h"

static const uint8_t kMagic[4] = {'M', 'R', 'D', 'N'};

#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_LEN 8
#define OFF_PHASE 12
#define OFF_PAD 13
#define OFF_SUM 16

static const char *const kPhaseName[KVBM_FRAME_PHASE_COUNT] = {
    "ThinkComplete", "ThinkActive", "OutputCritical"};

static int phase_valid(int phase) {
  return phase >= 0 && phase < KVBM_FRAME_PHASE_COUNT;
}

const char *kvbm_frame_phase_name(int phase) {
  return phase_valid(phase) ? kPhaseName[phase] : "?";
}

/* The plain checksum (key NULL) or the MAC. */
static void body_sum(const uint8_t *key, const void *body, size_t len,
                     uint8_t out[KVBM_FRAME_CHECKSUM_LEN]) {
  kvbm_blake3_hasher h;
  if (key)
    kvbm_blake3_hasher_init_keyed(&h, key);
  else
    kvbm_blake3_hasher_init(&h);
  kvbm_blake3_hasher_update(&h, body, len);
  kvbm_blake3_hasher_finalize(&h, out, KVBM_FRAME_CHECKSUM_LEN);
  if (key) explicit_bzero(&h, sizeof h); /* holds the key */
}

static void body_checksum(const void *body, size_t len,
                          uint8_t out[KVBM_FRAME_CHECKSUM_LEN]) {
  body_sum(NULL, body, len, out);
}

/* ---- encoding ---- */

int kvbm_frame_encoded_len(size_t body_len, size_t *out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "frame: out is NULL");
  if ((uint64_t)body_len > UINT32_MAX)
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "frame: body of %zu bytes exceeds the u32 length "
                          "field",
                          body_len);
  *out = KVBM_FRAME_HEADER_LEN + body_len;
  return KVBM_OK;
}

/* Every field but the checksum, after checking the arguments. */
static int write_header_v(uint32_t version, kvbm_frame_phase phase, size_t body_len,
                          uint8_t header[KVBM_FRAME_HEADER_LEN], kvbm_error *err) {
  size_t total;
  if (!phase_valid((int)phase))
    return kvbm_error_set(err, KVBM_EPHASE,
                          "frame: unknown phase %d (ThinkComplete 0, "
                          "ThinkActive 1, OutputCritical 2)",
                          (int)phase);
  int rc = kvbm_frame_encoded_len(body_len, &total, err);
  if (rc) return rc;
  memcpy(header + OFF_MAGIC, kMagic, 4);
  kvbm__put_le32(header + OFF_VERSION, version);
  kvbm__put_le32(header + OFF_LEN, (uint32_t)body_len);
  header[OFF_PHASE] = (uint8_t)phase;
  memset(header + OFF_PAD, 0, 3);
  return KVBM_OK;
}

static int write_header(kvbm_frame_phase phase, size_t body_len,
                        uint8_t header[KVBM_FRAME_HEADER_LEN], kvbm_error *err) {
  return write_header_v(KVBM_FRAME_VERSION, phase, body_len, header, err);
}

int kvbm_frame_encode_header(kvbm_frame_phase phase, const void *body,
                             size_t body_len,
                             uint8_t header[KVBM_FRAME_HEADER_LEN],
                             kvbm_error *err) {
  if (!header || (!body && body_len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or body");
  /* Arguments first: a frame that cannot be written is not hashed. */
  int rc = write_header(phase, body_len, header, err);
  if (rc) return rc;
  body_checksum(body, body_len, header + OFF_SUM);
  return KVBM_OK;
}

int kvbm_frame_encode_header_sum(kvbm_frame_phase phase, size_t body_len,
                                 const uint8_t sum[KVBM_FRAME_CHECKSUM_LEN],
                                 uint8_t header[KVBM_FRAME_HEADER_LEN],
                                 kvbm_error *err) {
  if (!header || !sum)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or checksum");
  int rc = write_header(phase, body_len, header, err);
  if (rc) return rc;
  memcpy(header + OFF_SUM, sum, KVBM_FRAME_CHECKSUM_LEN);
  return KVBM_OK;
}

int kvbm_frame_encode(kvbm_frame_phase phase, const void *body, size_t body_len,
                      void *out, size_t cap, size_t *out_len,
                      kvbm_error *err) {
  size_t total = 0;
  if (!out_len) return kvbm_error_set(err, KVBM_EINVAL, "frame: out_len is NULL");
  int rc = kvbm_frame_encoded_len(body_len, &total, err);
  if (rc) return rc;
  *out_len = total;
  if (!out) return KVBM_OK; /* size query */
  if (cap < total)
    return kvbm_error_set(err, KVBM_ENOSPC,
                          "frame: buffer of %zu bytes, frame needs %zu", cap,
                          total);
  if (!body && body_len > 0)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: body is NULL");
  uint8_t *o = out;
  /* Move the body first: the header would overwrite a body that starts
   * inside the first 32 bytes of `out`. */
  if (body_len > 0 && (const uint8_t *)body != o + KVBM_FRAME_HEADER_LEN)
    memmove(o + KVBM_FRAME_HEADER_LEN, body, body_len);
  return kvbm_frame_encode_header(phase, o + KVBM_FRAME_HEADER_LEN, body_len,
                                  o, err);
}

int kvbm_frame_encode_header_keyed(const uint8_t *key, kvbm_frame_phase phase,
                                   const void *body, size_t body_len,
                                   uint8_t header[KVBM_FRAME_HEADER_LEN], kvbm_error *err) {
  if (!key) return kvbm_frame_encode_header(phase, body, body_len, header, err);
  if (!header || (!body && body_len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or body");
  int rc = write_header_v(KVBM_FRAME_VERSION_KEYED, phase, body_len, header, err);
  if (rc) return rc;
  body_sum(key, body, body_len, header + OFF_SUM);
  return KVBM_OK;
}

int kvbm_frame_encode_header_sealed(kvbm_frame_phase phase, size_t body_len,
                                    uint8_t header[KVBM_FRAME_HEADER_LEN], kvbm_error *err) {
  if (!header) return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header");
  int rc = write_header_v(KVBM_FRAME_VERSION_SEALED, phase, body_len, header, err);
  if (!rc) memset(header + OFF_SUM, 0, KVBM_FRAME_CHECKSUM_LEN);
  return rc;
}

int kvbm_frame_encode_header_mac(kvbm_frame_phase phase, size_t body_len,
                                 const uint8_t mac[KVBM_FRAME_CHECKSUM_LEN],
                                 uint8_t header[KVBM_FRAME_HEADER_LEN], kvbm_error *err) {
  if (!header || !mac)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or MAC");
  int rc = write_header_v(KVBM_FRAME_VERSION_KEYED, phase, body_len, header, err);
  if (rc) return rc;
  memcpy(header + OFF_SUM, mac, KVBM_FRAME_CHECKSUM_LEN);
  return KVBM_OK;
}

int kvbm_frame_encode_keyed(const uint8_t *key, kvbm_frame_phase phase, const void *body,
                            size_t body_len, void *out, size_t cap, size_t *out_len,
                            kvbm_error *err) {
  if (!key) return kvbm_frame_encode(phase, body, body_len, out, cap, out_len, err);
  /* The unkeyed encoder places the body and sizes everything; then the
   * header is written again, keyed (the body is hashed once). */
  size_t total = 0;
  if (!out_len) return kvbm_error_set(err, KVBM_EINVAL, "frame: out_len is NULL");
  int rc = kvbm_frame_encoded_len(body_len, &total, err);
  if (rc) return rc;
  *out_len = total;
  if (!out) return KVBM_OK;
  if (cap < total)
    return kvbm_error_set(err, KVBM_ENOSPC, "frame: buffer of %zu bytes, frame needs %zu", cap,
                          total);
  if (!body && body_len > 0) return kvbm_error_set(err, KVBM_EINVAL, "frame: body is NULL");
  uint8_t *o = out;
  if (body_len > 0 && (const uint8_t *)body != o + KVBM_FRAME_HEADER_LEN)
    memmove(o + KVBM_FRAME_HEADER_LEN, body, body_len);
  return kvbm_frame_encode_header_keyed(key, phase, o + KVBM_FRAME_HEADER_LEN, body_len, o, err);
}

/* ---- decoding ---- */

int kvbm_frame_parse_header(const void *buf, size_t len, uint32_t max_body,
                            kvbm_frame_header *hdr, kvbm_error *err) {
  if (!hdr || (!buf && len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL buffer or header");
  if (len < KVBM_FRAME_HEADER_LEN)
    return kvbm_error_set(err, KVBM_ETRUNCATED,
                          "frame: header truncated: %zu of %d bytes", len,
                          KVBM_FRAME_HEADER_LEN);
  const uint8_t *p = buf;
  if (memcmp(p + OFF_MAGIC, kMagic, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC,
                          "frame: bad magic %02x %02x %02x %02x (want 'MRDN')",
                          p[0], p[1], p[2], p[3]);
  uint32_t version = kvbm__get_le32(p + OFF_VERSION);
  if (version < KVBM_FRAME_VERSION || version > KVBM_FRAME_VERSION_SEALED)
    return kvbm_error_set(err, KVBM_EVERSION,
                          "frame: unknown version %u (this build reads %d to %d)",
                          version, KVBM_FRAME_VERSION, KVBM_FRAME_VERSION_SEALED);
  if (p[OFF_PAD] | p[OFF_PAD + 1] | p[OFF_PAD + 2])
    return kvbm_error_set(err, KVBM_EPADDING,
                          "frame: nonzero padding bytes %02x %02x %02x",
                          p[OFF_PAD], p[OFF_PAD + 1], p[OFF_PAD + 2]);
  if (!phase_valid(p[OFF_PHASE]))
    return kvbm_error_set(err, KVBM_EPHASE,
                          "frame: unknown phase %u (ThinkComplete 0, "
                          "ThinkActive 1, OutputCritical 2)",
                          p[OFF_PHASE]);
  uint32_t body_len = kvbm__get_le32(p + OFF_LEN);
  if (body_len > max_body)
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "frame: declared body length %u exceeds the limit %u",
                          body_len, max_body);
  hdr->version = version;
  hdr->body_len = body_len;
  hdr->phase = (kvbm_frame_phase)p[OFF_PHASE];
  memcpy(hdr->checksum, p + OFF_SUM, KVBM_FRAME_CHECKSUM_LEN);
  return KVBM_OK;
}

/* Whether the frame is of the reader's kind (keyed or not). */
static int check_kind(const kvbm_frame_header *hdr, bool keyed, kvbm_error *err) {
  if (hdr->version == KVBM_FRAME_VERSION_SEALED)
    return kvbm_error_set(err, KVBM_EAUTH,
                          "frame: sealed frame (version 3, encrypted): only its key's holder opens it");
  bool frame_keyed = hdr->version == KVBM_FRAME_VERSION_KEYED;
  if (frame_keyed == keyed) return KVBM_OK;
  return keyed ? kvbm_error_set(err, KVBM_EAUTH,
                                "frame: unkeyed frame (version 1) refused: this reader "
                                "holds a key and accepts keyed frames only")
               : kvbm_error_set(err, KVBM_EAUTH,
                                "frame: keyed frame (version 2) and no key to check it");
}

/* Constant time: how many leading bytes of a MAC match must not show. */
static bool same16(const uint8_t *a, const uint8_t *b) {
  uint8_t d = 0;
  for (int i = 0; i < KVBM_FRAME_CHECKSUM_LEN; i++) d |= (uint8_t)(a[i] ^ b[i]);
  return d == 0;
}

static int check_sum(const kvbm_frame_header *hdr,
                     const uint8_t got[KVBM_FRAME_CHECKSUM_LEN],
                     kvbm_error *err) {
  if (hdr->version == KVBM_FRAME_VERSION_KEYED) {
    if (!same16(got, hdr->checksum))
      return kvbm_error_set(err, KVBM_EAUTH,
                            "frame: body MAC mismatch (forged, another key, or damaged)");
    return KVBM_OK;
  }
  if (memcmp(got, hdr->checksum, KVBM_FRAME_CHECKSUM_LEN) != 0)
    return kvbm_error_set(err, KVBM_ECHECKSUM,
                          "frame: body checksum mismatch (header %02x%02x%02x"
                          "%02x..., body hashes to %02x%02x%02x%02x...)",
                          hdr->checksum[0], hdr->checksum[1], hdr->checksum[2],
                          hdr->checksum[3], got[0], got[1], got[2], got[3]);
  return KVBM_OK;
}

static int check_len(const kvbm_frame_header *hdr, uint64_t len,
                     kvbm_error *err) {
  if (len < hdr->body_len)
    return kvbm_error_set(err, KVBM_ETRUNCATED,
                          "frame: body truncated: %llu of %u declared bytes",
                          (unsigned long long)len, hdr->body_len);
  if (len > hdr->body_len)
    return kvbm_error_set(err, KVBM_ETOOLONG,
                          "frame: body longer than declared: %llu bytes, "
                          "header says %u",
                          (unsigned long long)len, hdr->body_len);
  return KVBM_OK;
}

int kvbm_frame_verify_body(const kvbm_frame_header *hdr, const void *body,
                           size_t body_len, kvbm_error *err) {
  if (!hdr || (!body && body_len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or body");
  return kvbm_frame_verify_body_keyed(hdr, NULL, body, body_len, err);
}

int kvbm_frame_verify_body_keyed(const kvbm_frame_header *hdr, const uint8_t *key,
                                 const void *body, size_t body_len, kvbm_error *err) {
  if (!hdr || (!body && body_len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or body");
  /* The kind first, as the streaming verifier (which learns the length
   * last) does: both give the same status for the same bytes. */
  int rc = check_kind(hdr, key != NULL, err);
  if (!rc) rc = check_len(hdr, body_len, err);
  if (rc) return rc;
  uint8_t sum[KVBM_FRAME_CHECKSUM_LEN];
  body_sum(key, body, body_len, sum);
  return check_sum(hdr, sum, err);
}

int kvbm_frame_check_sum(const kvbm_frame_header *hdr, size_t body_len,
                         const uint8_t sum[KVBM_FRAME_CHECKSUM_LEN],
                         kvbm_error *err) {
  if (!hdr || !sum)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or checksum");
  int rc = check_kind(hdr, false, err);
  if (!rc) rc = check_len(hdr, body_len, err);
  return rc ? rc : check_sum(hdr, sum, err);
}

int kvbm_frame_check_mac(const kvbm_frame_header *hdr, size_t body_len,
                         const uint8_t mac[KVBM_FRAME_CHECKSUM_LEN], kvbm_error *err) {
  if (!hdr || !mac)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL header or MAC");
  int rc = check_kind(hdr, true, err);
  if (!rc) rc = check_len(hdr, body_len, err);
  return rc ? rc : check_sum(hdr, mac, err);
}

int kvbm_frame_decode(const void *buf, size_t len, uint32_t max_body,
                      kvbm_frame_header *hdr, const uint8_t **body,
                      kvbm_error *err) {
  return kvbm_frame_decode_keyed(NULL, buf, len, max_body, hdr, body, err);
}

int kvbm_frame_decode_keyed(const uint8_t *key, const void *buf, size_t len,
                            uint32_t max_body, kvbm_frame_header *hdr,
                            const uint8_t **body, kvbm_error *err) {
  if (!body) return kvbm_error_set(err, KVBM_EINVAL, "frame: body is NULL");
  int rc = kvbm_frame_parse_header(buf, len, max_body, hdr, err);
  if (rc) return rc;
  const uint8_t *b = (const uint8_t *)buf + KVBM_FRAME_HEADER_LEN;
  rc = kvbm_frame_verify_body_keyed(hdr, key, b, len - KVBM_FRAME_HEADER_LEN, err);
  if (rc) return rc;
  *body = b;
  return KVBM_OK;
}

/* ---- pieces ---- */

int kvbm_frame_verifier_init(kvbm_frame_verifier *v,
                             const kvbm_frame_header *hdr, kvbm_error *err) {
  return kvbm_frame_verifier_init_keyed(v, hdr, NULL, err);
}

int kvbm_frame_verifier_init_keyed(kvbm_frame_verifier *v, const kvbm_frame_header *hdr,
                                   const uint8_t *key, kvbm_error *err) {
  if (!v || !hdr)
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL verifier or header");
  int rc = check_kind(hdr, key != NULL, err);
  if (rc) return rc;
  v->hdr = *hdr;
  v->seen = 0;
  v->failed = 0;
  if (key)
    kvbm_blake3_hasher_init_keyed(&v->hasher, key);
  else
    kvbm_blake3_hasher_init(&v->hasher);
  return KVBM_OK;
}

int kvbm_frame_verifier_update(kvbm_frame_verifier *v, const void *piece,
                               size_t len, kvbm_error *err) {
  if (!v || (!piece && len > 0))
    return kvbm_error_set(err, KVBM_EINVAL, "frame: NULL verifier or piece");
  if (v->failed)
    return kvbm_error_set(err, KVBM_ESTATE, "frame: verifier already failed");
  if (len > v->hdr.body_len - v->seen) {
    v->failed = 1;
    return check_len(&v->hdr, v->seen + len, err);
  }
  kvbm_blake3_hasher_update(&v->hasher, piece, len);
  v->seen += len;
  return KVBM_OK;
}

int kvbm_frame_verifier_finish(kvbm_frame_verifier *v, kvbm_error *err) {
  if (!v) return kvbm_error_set(err, KVBM_EINVAL, "frame: verifier is NULL");
  if (v->failed)
    return kvbm_error_set(err, KVBM_ESTATE, "frame: verifier already failed");
  int rc = check_len(&v->hdr, v->seen, err);
  if (rc) return rc;
  uint8_t sum[KVBM_FRAME_CHECKSUM_LEN];
  kvbm_blake3_hasher_finalize(&v->hasher, sum, sizeof sum);
  return check_sum(&v->hdr, sum, err);
}
