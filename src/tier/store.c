/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store.c: what a volume tier keeps under a key, and the G4 lookup.
 *
 * Values. A remote volume hands back whatever is stored under a key, and
 * anyone may have stored it: another engine with another model or layout,
 * an older kvbm, a torn write, a person with redis-cli. So a value in a
 * framed tier (G4, and G3 over any URL but disk://) is an MRDN v1 frame
 * (kvbm/frame.h) whose body opens with its own 64-byte header:
 *
 *   off size  field (little-endian)
 *     0   8   magic "KVBMBLK1"
 *     8  16   BLAKE3-128 of the namespace string (below)
 *    24   8   key: the block's sequence hash
 *    32   8   parent hash
 *    40   8   layout fingerprint (one FullyContiguous block)
 *    48   4   flags (bit 0: has parent)
 *    52   4   block size in tokens
 *    56   8   data length
 *
 * then the block's bytes (FullyContiguous order, whatever the tiers'
 * layouts). The frame's BLAKE3-128 covers the body header and the data, so
 * a value that passes the frame check and carries our namespace, the
 * key it was read under, our layout and our length is this block's KV;
 * anything else is a counted miss (store.c never hands bytes on that it
 * could not check). The frame's phase byte (ADR-0006) is the block's label
 * from the request that committed it (kvbm_mreq_set_phase): informative,
 * not relied on here.
 *
 * Authenticated values (issue 23). The frame's plain BLAKE3 catches
 * damage, not forgery: anyone who can write the shared store can put any
 * bytes under a block's key and recompute the sum, and every manager
 * reading that key would onboard them (tried: 200 rewritten keys, 37,112
 * blocks onboarded, 0 checksum failures). With a cluster key (g4_key or
 * g4_key_file, kvbm/manager.h) G4 values are keyed frames (frame.h,
 * version 2): the sum is BLAKE3 keyed with a key derived from the secret
 * (context KEY_CONTEXT), at plain BLAKE3's cost. A reader with the key
 * refuses unkeyed frames and MACs that differ; a reader without one
 * refuses keyed frames; each is a counted miss (auth_failures), never
 * bytes in G1. The secret is read once at create, from the caller's bytes
 * or a file that only its owner can read (a command line would show it to
 * every user of the machine), and every copy of it made here is zeroed;
 * only the derived key is kept, in the tier, zeroed at destroy.
 *
 * Encryption at rest (g4_encrypt). A tenant that does not want the store
 * to see its KV gets sealed values: the frame (version 3) carries a random
 * 24-byte nonce, then the body header and the block encrypted with
 * XChaCha20-Poly1305 under a second key derived from the same secret
 * (AEAD_CONTEXT), the tag in the frame's sum and the frame header's first
 * 16 bytes as associated data. Decryption is in place, in the worker's
 * staging buffer, and a value that does not open is refused like a MAC
 * that differs (auth_failures). XChaCha's 192-bit nonce can be drawn at
 * random for every value without a counter shared between managers.
 * The body header travels encrypted too, so the identity checks below run
 * on what the key opened.
 *
 * The disk:// slot file is not framed: its slots carry their own XXH3
 * header (volume/disk.h) and are checked by the volume, which keeps G3's
 * zero-copy path (the block's bytes straight between tier memory and the
 * disk) and spends no BLAKE3 on a local disk's bandwidth.
 *
 * Namespace. Keys are "<namespace>/<sequence hash>": the namespace names
 * the format version, the model id, the layout fingerprint, the hash
 * scheme and the block size, so two models or two layouts sharing one
 * Redis address different keys, and the body header checks it again.
 *
 * Lookup. A shared tier (G4) may hold blocks this manager never stored, so
 * a prefill whose walk ends before G4 asks the store about the rest of the
 * prompt with one EXISTS batch (pipelined by the Redis backends) and waits
 * for it at most g4_lookup_timeout_ms. A lookup that is late is abandoned,
 * not cancelled: its batch completes later and frees itself. The engine
 * never waits on the store longer than that deadline.
 *
 * One deadline per prefill. The gets that bring a prefill's blocks from a
 * framed store go out in several batches (g4_queue_depth in flight), and
 * a store that says "exists" and then trickles its values would make the
 * engine wait a batch deadline per batch (a 422-block prompt once waited
 * 55 s). So a prefill has one deadline, g4_timeout_ms from when its onboards are
 * queued (its lookup and a peer pull before have deadlines of their own)
 * (kvbm__onboards.deadline_ns), and request.c's settle() ends the match at the
 * first block that failed or is still out at that deadline; every onboard
 * of that request still queued or in flight past that point is abandoned
 * (counted): a queued one is never sent, an answer that comes later is
 * dropped in the worker's staging buffer and never reaches G1. Only
 * framed tiers' gets are abandonable (kvbm__abandonable): their bytes
 * land in a buffer before a check, while a bare tier's (the disk:// slot
 * file) are read straight into G1 by the volume, which cannot be called
 * back; those are bounded by their own volume's deadline.
 *
 * Back-off. A shared store that keeps failing reads (KVBM__BACKOFF_FAILS
 * lookups or gets in a row: down, late, erroring, or answering with values
 * that are not ours), or that made a prefill wait its whole deadline, is
 * left alone for g4_backoff_ms, doubling up to 32
 * times that while it goes on failing after each pause: no lookups, no G4
 * hits and no puts meanwhile (backoffs, backoff_skips), so the requests
 * after the one that paid the deadline do not pay it again. The first
 * good read after a pause starts the count afresh.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "kvbm/blake3.h"
#include "kvbm/frame.h"
#include "tier/internal.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/secret.h"

#define BODY_HDR 64u
static const char BODY_MAGIC[8] = {'K', 'V', 'B', 'M', 'B', 'L', 'K', '1'};


#define NONCE crypto_aead_xchacha20poly1305_ietf_NPUBBYTES /* 24 */

/* Bytes between the frame header and the body header. */
static size_t nonce_len(const kvbm__tier *t) { return t->sealed ? NONCE : 0; }

size_t kvbm__value_data_off(const kvbm__tier *t) {
  return t->framed ? KVBM_FRAME_HEADER_LEN + nonce_len(t) + BODY_HDR : 0;
}

size_t kvbm__value_len(const kvbm_manager *m, const kvbm__tier *t) {
  return kvbm__value_data_off(t) + (size_t)m->block_bytes;
}

/* A framed value carries its group's bytes only (a Mamba state is smaller
 * than the attention page it shares the tier's slot with); a bare one is
 * the slot. */
size_t kvbm__value_len_group(const kvbm_manager *m, const kvbm__tier *t, uint32_t g) {
  return kvbm__value_data_off(t) + (size_t)(t->framed ? m->gbytes[g] : m->block_bytes);
}

void kvbm__value_seal(const kvbm_manager *m, const kvbm__tier *t, uint8_t *buf, uint64_t key,
                      uint64_t parent, bool has_parent, kvbm_frame_phase phase, uint32_t grp) {
  uint8_t *h = buf + KVBM_FRAME_HEADER_LEN + nonce_len(t);
  memcpy(h, BODY_MAGIC, 8);
  memcpy(h + 8, m->ns_digest, 16);
  kvbm__put_le64(h + 24, key);
  kvbm__put_le64(h + 32, parent);
  kvbm__put_le64(h + 40, m->gfp[grp]);
  kvbm__put_le32(h + 48, has_parent ? 1u : 0u);
  kvbm__put_le32(h + 52, m->cfg.block_size);
  kvbm__put_le64(h + 56, m->gbytes[grp]);
  size_t body = BODY_HDR + (size_t)m->gbytes[grp], len;
  if (t->sealed) {
    uint8_t *nonce = buf + KVBM_FRAME_HEADER_LEN;
    KVBM__MUST(kvbm_frame_encode_header_sealed(phase, NONCE + body, buf, NULL));
    randombytes_buf(nonce, NONCE);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(h, buf + 16, NULL, h, body, buf, 16, NULL,
                                                        nonce, t->aead_key);
    return;
  }
  /* Cannot fail: the body sits at buf + 32 in a buffer of exactly its size
   * and block_bytes is far below the frame's u32 limit (checked at create). */
  KVBM__MUST(kvbm_frame_encode_keyed(t->keyed ? t->mac_key : NULL, phase, h, body, buf,
                                     kvbm__value_len_group(m, t, grp), &len, NULL));
}

/* A sealed value: its header, then decrypted in place. */
static int open_sealed(const kvbm__tier *t, uint8_t *buf, size_t size, const uint8_t **body) {
  kvbm_frame_header fh;
  int rc = kvbm_frame_parse_header(buf, size, (uint32_t)(size - KVBM_FRAME_HEADER_LEN), &fh, NULL);
  if (rc) return KVBM_ECHECKSUM;
  if (fh.version != KVBM_FRAME_VERSION_SEALED || fh.body_len != size - KVBM_FRAME_HEADER_LEN)
    return KVBM_EAUTH; /* not sealed: not ours */
  uint8_t *nonce = buf + KVBM_FRAME_HEADER_LEN, *c = nonce + NONCE;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(c, NULL, c, fh.body_len - NONCE, fh.checksum,
                                                          buf, 16, nonce, t->aead_key))
    return KVBM_EAUTH;
  *body = c;
  return KVBM_OK;
}

int kvbm__value_check(const kvbm_manager *m, const kvbm__tier *t, uint8_t *buf,
                      size_t size, uint64_t key, uint32_t grp) {
  size_t want = KVBM_FRAME_HEADER_LEN + nonce_len(t) + BODY_HDR + (size_t)m->gbytes[grp];
  /* A frame of another kind (plain, keyed, sealed) is refused as such
   * before its length, which differs for sealed values. */
  kvbm_frame_header kind;
  uint32_t ours = t->sealed ? KVBM_FRAME_VERSION_SEALED
                            : t->keyed ? KVBM_FRAME_VERSION_KEYED : KVBM_FRAME_VERSION;
  if (kvbm_frame_parse_header(buf, size, UINT32_MAX, &kind, NULL) == KVBM_OK && kind.version != ours)
    return KVBM_EAUTH;
  if (size < want) return KVBM_ETRUNCATED;
  if (size > want) return KVBM_ETOOLONG;
  kvbm_frame_header fh;
  const uint8_t *body;
  int rc = t->sealed ? open_sealed(t, buf, size, &body)
                     : kvbm_frame_decode_keyed(t->keyed ? t->mac_key : NULL, buf, size,
                                               (uint32_t)(want - KVBM_FRAME_HEADER_LEN), &fh, &body,
                                               NULL);
  if (rc) return rc == KVBM_EAUTH ? KVBM_EAUTH : KVBM_ECHECKSUM;
  /* The frame checks: everything below was written by a kvbm that sealed
   * it, so a mismatch is another namespace's or key's value, not damage. */
  if (memcmp(body, BODY_MAGIC, 8) || memcmp(body + 8, m->ns_digest, 16) || kvbm__get_le64(body + 24) != key ||
      kvbm__get_le64(body + 40) != m->gfp[grp] || kvbm__get_le32(body + 52) != m->cfg.block_size ||
      kvbm__get_le64(body + 56) != m->gbytes[grp] || (kvbm__get_le32(body + 48) & ~1u))
    return KVBM_EFORMAT;
  return KVBM_OK;
}

/* ---- the cluster key ---- */

/* A hard-coded, kvbm-specific context: the derived key is used for G4
 * frames only, whatever else the same secret keys. */
#define KEY_CONTEXT "kvbm 2026-11 G4 value MAC v1"
#define AEAD_CONTEXT "kvbm 2026-11 G4 value AEAD v1"

int kvbm__value_key_init(kvbm_manager *m, kvbm__tier *t, kvbm_error *err) {
  const kvbm_manager_config *c = &m->cfg;
  if (!c->g4_key && !c->g4_key_file) return KVBM_OK;
  uint8_t buf[KVBM_MANAGER_G4_KEY_MAX + 2];
  size_t len = c->g4_key_len;
  const uint8_t *secret = c->g4_key;
  int rc = KVBM_OK;
  if (c->g4_key_file) {
    kvbm_error e = {0};
    rc = kvbm__secret_file_read(c->g4_key_file, buf, sizeof buf, &len, &e);
    if (rc) rc = kvbm_error_set(err, rc, "manager: g4_%s", e.msg);
    secret = buf;
  }
  if (!rc && (len < KVBM_MANAGER_G4_KEY_MIN || len > KVBM_MANAGER_G4_KEY_MAX))
    rc = kvbm_error_set(err, KVBM_EINVAL,
                        "manager: the G4 key (%s) is %zu bytes; it must be %u..%u "
                        "(e.g. head -c 32 /dev/urandom > key && chmod 600 key)",
                        c->g4_key_file ? c->g4_key_file : "g4_key", len,
                        KVBM_MANAGER_G4_KEY_MIN, KVBM_MANAGER_G4_KEY_MAX);
  if (!rc && c->g4_encrypt && sodium_init() < 0)
    rc = kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: g4_encrypt: libsodium failed to start");
  if (!rc) {
    kvbm_blake3_derive_key(KEY_CONTEXT, secret, len, t->mac_key, sizeof t->mac_key);
    t->keyed = true;
    if (c->g4_encrypt) {
      kvbm_blake3_derive_key(AEAD_CONTEXT, secret, len, t->aead_key, sizeof t->aead_key);
      t->sealed = true;
    }
  }
  explicit_bzero(buf, sizeof buf);
  return rc;
}

int kvbm__namespace_init(kvbm_manager *m, kvbm_error *err) {
  const char *model = m->model_id ? m->model_id : "default";
  int n = snprintf(m->ns, sizeof m->ns, "kvbm1.%s.%016llx.%s.b%u", model,
                   (unsigned long long)m->fingerprint, kvbm_hash_scheme_name(m->cfg.scheme),
                   m->cfg.block_size);
  if (n < 0 || (size_t)n >= sizeof m->ns)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: the key namespace is too long");
  return kvbm_blake3_hash(m->ns, (size_t)n, m->ns_digest, sizeof m->ns_digest);
}

/* ---- back-off and abandonment ---- */

bool kvbm__abandonable(const kvbm__tier *t) { return t->store == KVBM__STORE_VOLUME && t->framed; }

void kvbm__onboards_release(kvbm__onboards *og) {
  if (og && --og->refs == 0) free(og);
}

bool kvbm__onboard_given_up(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j) {
  if (j->hint || j->kind != KVBM__J_GET) return false;
  uint8_t *st = &m->t[KVBM_TIER_G1].state[j->id[KVBM_TIER_G1]];
  if (*st != KVBM__PENDING && *st != KVBM__LANDING) return true; /* its request gave it up */
  if (*st == KVBM__LANDING || !j->og) return false; /* its bytes are on their way in */
  if (j->k <= j->og->cut) {
    if (kvbm_clock_ns() < j->og->deadline_ns) return false;
    kvbm__onboards_late(m, t, j->og); /* late: in its prompt's match, past the deadline */
  }
  *st = KVBM__FAILED;
  t->st.abandoned++;
  return true;
}

bool kvbm__backed_off(const kvbm__tier *t) {
  return t->backoff_until_ns && kvbm_clock_ns() < t->backoff_until_ns;
}

void kvbm__read_result(kvbm_manager *m, kvbm__tier *t, bool failed) {
  if (!t->shared || m->cfg.g4_backoff_ms <= 0) return;
  if (!failed) {
    t->fail_run = 0;
    t->backoff_level = 0;
    return;
  }
  /* Reads still coming back from before the pause began do not extend it. */
  if (kvbm__backed_off(t)) return;
  if (++t->fail_run < KVBM__BACKOFF_FAILS) return;
  uint32_t shift = t->backoff_level < 5 ? t->backoff_level : 5;
  t->backoff_until_ns = kvbm_clock_ns() + ((uint64_t)m->cfg.g4_backoff_ms << shift) * 1000000u;
  t->backoff_level++;
  /* After the pause one more failure is enough to pause again (doubled). */
  t->fail_run = KVBM__BACKOFF_FAILS - 1;
  t->st.backoffs++;
}

void kvbm__onboards_late(kvbm_manager *m, kvbm__tier *t, kvbm__onboards *og) {
  if (!og || og->late || !og->sent) return;
  og->late = true;
  /* The engine paid a whole deadline: the next requests should not, so a
   * back-off at once, as if the whole run of failures had been seen. */
  if (t->fail_run < KVBM__BACKOFF_FAILS - 1) t->fail_run = KVBM__BACKOFF_FAILS - 1;
  kvbm__read_result(m, t, true);
}

/* ---- the G4 lookup ---- */

/* One lookup in flight. Owned by the prefill until it gives up; then by
 * the volume's completion, which frees it. */
typedef struct lookup {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, abandoned;
  size_t n;
  kvbm_volume_op ops[];
} lookup;

static void lookup_free(lookup *l) {
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  free(l);
}

static void lookup_done(void *user, kvbm_volume_op *ops, size_t n) {
  (void)ops;
  (void)n;
  lookup *l = user;
  pthread_mutex_lock(&l->mu);
  bool orphan = l->abandoned;
  l->done = true;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
  if (orphan) lookup_free(l);
}


int kvbm__lookup_run(kvbm_manager *m, kvbm__tier *t, const uint64_t *hashes, size_t n,
                     bool *found) {
  memset(found, 0, n * sizeof *found);
  lookup *l = calloc(1, sizeof *l + n * sizeof l->ops[0]);
  if (!l) return KVBM_ENOMEM;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, &ca);
  pthread_condattr_destroy(&ca);
  l->n = n;
  for (size_t i = 0; i < n; i++)
    l->ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_EXISTS, .key = hashes[i]};
  int rc = kvbm_volume_submit(t->lookup_vol, l->ops, n, lookup_done, l);
  if (rc) {
    lookup_free(l);
    return rc;
  }
  struct timespec dl = kvbm__deadline_after_ms(CLOCK_MONOTONIC, m->cfg.g4_lookup_timeout_ms);
  pthread_mutex_lock(&l->mu);
  while (!l->done && pthread_cond_timedwait(&l->cv, &l->mu, &dl) == 0) {
  }
  if (!l->done) {
    l->abandoned = true; /* its completion frees it */
    pthread_mutex_unlock(&l->mu);
    return KVBM_ETIMEDOUT;
  }
  pthread_mutex_unlock(&l->mu);
  rc = KVBM_OK;
  for (size_t i = 0; i < n; i++) {
    found[i] = l->ops[i].status == KVBM_OK;
    int s = l->ops[i].status;
    if (s != KVBM_OK && s != KVBM_ENOTFOUND && rc == KVBM_OK) rc = s;
  }
  lookup_free(l);
  return rc;
}
