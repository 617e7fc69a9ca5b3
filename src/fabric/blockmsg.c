/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blockmsg.c: the block message codec (format in kvbm/fabric.h).
 *
 * A codec only: bytes in, bytes out, no fabric. The block bytes travel as
 * an MRDN v1 frame so that the one definition of "checked payload" (the
 * frame module, BLAKE3-128 of the body) guards them; the envelope around it
 * carries what the frame does not: the block's identity, so that the
 * receiver can register what it onboards, and kvbm's storage tier. The
 * frame's own byte 12 is ADR-0006's phase label; kvbm used to write its
 * storage tier there (envelope version 1), so the tier moved here and the
 * version went to 2: an old message is refused rather than misread. A "placed" message carries the
 * frame header alone: the bytes went ahead by a one-sided write into the
 * receiver's block, where the receiver verifies them against the header.
 * A sender that kept the block's checksum since its bytes were written
 * (the tiers keep one per block, issue 22) passes it (sum_given): the
 * message is then framed without hashing, and the receiver's check is the
 * one hash the bytes get on the way. Decoding copies the tokens into
 * the caller's array (they may sit unaligned in the buffer) and leaves the
 * body where it is; every length is checked against the input before use.
 *
 * Keyed frames (issue 23). Peers that share a fabric secret can key their
 * frames (mac_key, kvbm_fabric_frame_key): the frame's sum is then BLAKE3
 * keyed (frame.h, version 2), which someone on the path without the
 * secret cannot recompute for bytes of their own. A kept sum stays the one
 * hash of the bytes when it was kept keyed (the same cost). The decoder
 * refuses the other kind outright (KVBM_EAUTH), placed or not.
 */
#include <string.h>

#include "kvbm/fabric.h"
#include "common/bytes.h"


size_t kvbm_block_msg_placed_size(uint32_t num_tokens) {
  return KVBM_BLOCK_MSG_FIXED + (size_t)num_tokens * 4 + 8 + KVBM_FRAME_HEADER_LEN;
}

size_t kvbm_block_msg_size(uint32_t num_tokens, size_t body_len) {
  size_t fixed = KVBM_BLOCK_MSG_FIXED + (size_t)num_tokens * 4 + KVBM_FRAME_HEADER_LEN;
  if (body_len > UINT32_MAX || body_len > SIZE_MAX - fixed) return 0;
  return fixed + body_len;
}

/* The header for a checksum the caller gave: a plain sum, or a MAC. */
static int header_sum(const kvbm_block_msg *m, uint8_t *hdr, kvbm_error *err) {
  return m->mac_key ? kvbm_frame_encode_header_mac(m->phase, m->body_len, m->frame.checksum, hdr, err)
                    : kvbm_frame_encode_header_sum(m->phase, m->body_len, m->frame.checksum, hdr, err);
}

int kvbm_block_msg_encode(const kvbm_block_msg *m, uint8_t *out, size_t cap, size_t *len, kvbm_error *err) {
  if (!m || !out || !len || (!m->tokens && m->num_tokens) || (!m->body && m->body_len && !m->placed))
    return kvbm_error_set(err, KVBM_EINVAL, "block message: NULL argument");
  size_t need = m->placed ? kvbm_block_msg_placed_size(m->num_tokens) : kvbm_block_msg_size(m->num_tokens, m->body_len);
  if (need == 0 || m->body_len > UINT32_MAX)
    return kvbm_error_set(err, KVBM_ETOOLONG, "block message: body of %zu bytes", m->body_len);
  if ((unsigned)m->tier >= KVBM_TIER_COUNT)
    return kvbm_error_set(err, KVBM_ETIER, "block message: storage tier %d is not G1..G4", (int)m->tier);
  if (cap < need)
    return kvbm_error_set(err, KVBM_ENOSPC, "block message: needs %zu bytes, buffer %zu", need, cap);
  size_t tok = (size_t)m->num_tokens * 4;
  uint8_t *frame = out + KVBM_BLOCK_MSG_FIXED + tok;
  size_t flen = KVBM_FRAME_HEADER_LEN;
  int rc;
  if (m->placed) {
    kvbm__put_le64(frame, m->block_id);
    frame += 8;
    /* The bytes went ahead: hash them here, or take the checksum the
     * caller computed (body NULL). */
    rc = m->body && !m->sum_given ? kvbm_frame_encode_header_keyed(m->mac_key, m->phase, m->body, m->body_len,
                                                                   frame, err)
                                  : header_sum(m, frame, err);
    flen += 8;
  } else if (m->sum_given) {
    /* The sender kept the body's checksum: frame it, hash nothing. */
    uint8_t hdr[KVBM_FRAME_HEADER_LEN]; /* first, in case the body overlaps where it goes */
    rc = header_sum(m, hdr, err);
    if (!rc) {
      /* a body gathered in place (at frame + 32) is not moved */
      if (m->body_len && m->body != frame + KVBM_FRAME_HEADER_LEN)
        memmove(frame + KVBM_FRAME_HEADER_LEN, m->body, m->body_len);
      memcpy(frame, hdr, sizeof hdr);
    }
    flen += m->body_len;
  } else {
    rc = kvbm_frame_encode_keyed(m->mac_key, m->phase, m->body, m->body_len, frame,
                                 cap - KVBM_BLOCK_MSG_FIXED - tok, &flen, err);
  }
  if (rc) return rc;
  memcpy(out, KVBM_BLOCK_MSG_MAGIC, 4);
  kvbm__put_le32(out + 4, KVBM_BLOCK_MSG_VERSION);
  kvbm__put_le64(out + 8, m->seq_hash);
  kvbm__put_le64(out + 16, m->has_parent ? m->parent_hash : 0);
  kvbm__put_le64(out + 24, m->salt_hash);
  kvbm__put_le32(out + 32, (m->has_parent ? 1u : 0u) | (m->placed ? 2u : 0u));
  out[36] = (uint8_t)m->tier;
  memset(out + 37, 0, 3);
  kvbm__put_le64(out + 40, m->layout_id);
  kvbm__put_le32(out + 48, m->num_tokens);
  for (uint32_t i = 0; i < m->num_tokens; i++) kvbm__put_le32(out + KVBM_BLOCK_MSG_FIXED + 4 * (size_t)i, m->tokens[i]);
  *len = KVBM_BLOCK_MSG_FIXED + tok + flen;
  return KVBM_OK;
}

int kvbm_block_msg_decode(const uint8_t *buf, size_t len, uint32_t max_tokens, uint32_t max_body, uint32_t *tokens,
                          kvbm_block_msg *m, kvbm_error *err) {
  return kvbm_block_msg_decode_keyed(NULL, buf, len, max_tokens, max_body, tokens, m, err);
}

int kvbm_block_msg_decode_keyed(const uint8_t *key, const uint8_t *buf, size_t len, uint32_t max_tokens,
                                uint32_t max_body, uint32_t *tokens, kvbm_block_msg *m, kvbm_error *err) {
  if (!m || (!tokens && max_tokens)) return kvbm_error_set(err, KVBM_EINVAL, "block message: NULL argument");
  memset(m, 0, sizeof *m);
  if (!buf || len < KVBM_BLOCK_MSG_FIXED)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "block message: %zu bytes, shorter than the %u-byte envelope",
                          buf ? len : 0, KVBM_BLOCK_MSG_FIXED);
  if (memcmp(buf, KVBM_BLOCK_MSG_MAGIC, 4) != 0)
    return kvbm_error_set(err, KVBM_EMAGIC, "block message: wrong magic");
  if (kvbm__get_le32(buf + 4) == 1)
    return kvbm_error_set(err, KVBM_EVERSION,
                          "block message: version 1 (its frame's phase byte held a storage tier); this build reads 2");
  if (kvbm__get_le32(buf + 4) != KVBM_BLOCK_MSG_VERSION)
    return kvbm_error_set(err, KVBM_EVERSION, "block message: unknown version %u", kvbm__get_le32(buf + 4));
  uint32_t flags = kvbm__get_le32(buf + 32);
  if (flags & ~3u) return kvbm_error_set(err, KVBM_EPADDING, "block message: unknown flags 0x%x", flags);
  if (buf[37] | buf[38] | buf[39])
    return kvbm_error_set(err, KVBM_EPADDING, "block message: nonzero reserved bytes %02x %02x %02x", buf[37],
                          buf[38], buf[39]);
  if (buf[36] >= KVBM_TIER_COUNT)
    return kvbm_error_set(err, KVBM_ETIER, "block message: storage tier %u is not G1..G4 (0..3)", buf[36]);
  uint32_t n = kvbm__get_le32(buf + 48);
  if (n > max_tokens)
    return kvbm_error_set(err, KVBM_ETOOLONG, "block message: %u tokens (limit %u)", n, max_tokens);
  if ((len - KVBM_BLOCK_MSG_FIXED) / 4 < n)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "block message: %u tokens announced, input ends first", n);
  size_t off = KVBM_BLOCK_MSG_FIXED + (size_t)n * 4;
  kvbm_frame_header hdr;
  const uint8_t *body = NULL;
  uint64_t block_id = 0;
  int rc;
  if (flags & 2u) {
    /* placed: block id, then a header with no body behind it */
    if (len - off < 8 + KVBM_FRAME_HEADER_LEN)
      return kvbm_error_set(err, KVBM_ETRUNCATED, "block message: placed block id and header truncated");
    if (len - off > 8 + KVBM_FRAME_HEADER_LEN)
      return kvbm_error_set(err, KVBM_ETOOLONG, "block message: %zu bytes after a placed header",
                            len - off - 8 - KVBM_FRAME_HEADER_LEN);
    block_id = kvbm__get_le64(buf + off);
    rc = kvbm_frame_parse_header(buf + off + 8, KVBM_FRAME_HEADER_LEN, max_body, &hdr, err);
    if (!rc && hdr.version != (key ? KVBM_FRAME_VERSION_KEYED : KVBM_FRAME_VERSION))
      rc = kvbm_error_set(err, KVBM_EAUTH, "block message: a placed header of frame version %u, and this "
                          "receiver %s", hdr.version, key ? "accepts keyed frames (2) only" : "holds no key");
  } else {
    rc = kvbm_frame_decode_keyed(key, buf + off, len - off, max_body, &hdr, &body, err);
  }
  if (rc) return rc;
  for (uint32_t i = 0; i < n; i++) tokens[i] = kvbm__get_le32(buf + KVBM_BLOCK_MSG_FIXED + 4 * (size_t)i);
  m->seq_hash = kvbm__get_le64(buf + 8);
  m->parent_hash = kvbm__get_le64(buf + 16);
  m->salt_hash = kvbm__get_le64(buf + 24);
  m->has_parent = flags & 1u;
  m->num_tokens = n;
  m->tokens = tokens;
  m->tier = (kvbm_tier)buf[36];
  m->layout_id = kvbm__get_le64(buf + 40);
  m->phase = hdr.phase;
  m->body = body;
  m->body_len = hdr.body_len;
  m->placed = (flags & 2u) != 0;
  m->block_id = block_id;
  m->frame = hdr;
  return KVBM_OK;
}
