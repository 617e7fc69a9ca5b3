/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/peer.h: a manager's peers, disaggregated prefill and decode
 * (ADR-0006). The module above the tiered manager (src/peer/): it uses
 * only the manager's public calls (kvbm/manager.h, "The peers' side of
 * the manager") and is called back through the hooks it registers there,
 * so the manager knows no peer code. These calls kept their names from
 * when they lived in kvbm/manager.h (same symbols in libkvbm.so); a
 * program calling them now includes this header too.
 *
 * A manager can be attached to peers, each over a kvbm_fabric (kvbm/
 * fabric.h: UCX between processes, or the in-process pair). Blocks move
 * between the two managers' tiers: offload sends a block to a peer, the
 * peer ingests it (verifies it and registers it in its G1 or G2, where its
 * prefill of the same prompt then finds it), and block_location
 * (kvbm/manager.h) tells where a block is. Without a peer, offload and
 * ingest return KVBM_EDISAGG ("disaggregation unavailable") and
 * block_location says local, the ADR's defaults.
 *
 * Attaching exchanges hellos: each side offers a landing zone of
 * landing_blocks blocks (fabric memory in its ingest tier's layout, apart
 * from its cache) and its layout; a peer whose blocks have another shape
 * is refused, naming the field (kvbm_fabric_layout_bridge: kind,
 * alignment and block count may differ, blocks are moved layer by layer).
 * Each side then runs a link thread that serves the peer's messages
 * (blocks, grant requests, acknowledgements, pulls). Two ways to send,
 * per side:
 *   PUSH  each block is one pushed message: identity plus an MRDN frame
 *         of its bytes;
 *   PUT   the sender asks for landing blocks, writes each block one-sided
 *         into a granted one (layer by layer, bridging the layouts),
 *         flushes, then pushes the block's identity and frame header; the
 *         receiver verifies the bytes where they landed.
 * The receiver refuses, and acknowledges with the reason, a block it did
 * not grant, one of the wrong length or token count, one whose bytes fail
 * their BLAKE3, one laid out for another (stale) landing zone, one whose
 * sequence hash does not follow from its tokens: nothing of it reaches the
 * cache (a landing block goes back to the free list; a pushed block is
 * verified before any cache block is taken).
 *
 * Keyed links (issue 23). Peers that share a cluster key (key or
 * key_file below, or KVBM_PEER_KEY_FILE through kvbm_peer_config_env;
 * never a command line) frame every block with a keyed BLAKE3-128 MAC
 * (an MRDN version-2 frame under kvbm_fabric_frame_key's key, the same as
 * the fabric codec's): a block from a peer without the key, with another
 * key, or forged (bytes or sum changed on the way) is refused with
 * KVBM_EAUTH, counted (refused_auth, and kvbm_peer_refused_total{reason=
 * "auth"} on the manager's metrics), acknowledged as refused, never
 * served. A keyed side refuses an unkeyed frame and an unkeyed side a
 * keyed one. The manager's kept sums (kvbm/manager.h,
 * kvbm_manager_keep_sums) are then that MAC: a block is still hashed
 * once. Every peer of one manager shares one key or none (the first
 * attach decides; another is refused, KVBM_EINVAL).
 *
 * Keyed control messages. On a keyed link every message after the
 * hellos (acknowledgements, grant requests and grants, pulls, "not held"
 * answers, removes, and the block messages' envelopes) also carries a
 * keyed BLAKE3-128 under a key derived from the cluster key for this
 * alone ("kvbm peer control v1"), per direction and per connection (each
 * hello carries a fresh nonce), over the message and a sequence number:
 * a forged message (no MAC, a wrong one) or one replayed (on this link or
 * from another) is dropped unread, counted (refused_control,
 * refused_replayed; kvbm_peer_refused_total{reason="control"}), and
 * changes nothing: no block is believed held or forgotten, no landing
 * block granted, nothing sent back. The link stays up (a forger must not
 * be able to cut it). Attach refuses, KVBM_EAUTH naming why, a peer that
 * holds a key when this side holds none or the other way round (at the
 * hello), and one with another key (its confirmation fails the MAC).
 * Unkeyed links are unchanged on the wire. docs/areas/fabric.md has the
 * layout. kvbm_manager_ingest_block (an engine's own transport) checks
 * the frame's MAC only.
 *
 * What a peer holds (issue 23, docs/areas/peers.md). A block the peer
 * acknowledged is remembered as held there for lease_ms from that answer,
 * and no longer: after it block_location says local (not held) and an
 * OutputCritical prefill does not drop a G1 copy for room on that word.
 * The peer says what it stops holding: when a block it ingested from us
 * leaves its G1 and G2 (evicted, reset, cleared), it sends a remove
 * message and we forget it at once; its "not held" answer to a pull does
 * the same; and when the link closes (peer gone, protocol error, detach)
 * everything it said is forgotten. Removes are a version 2 protocol
 * message: a version 1 peer is accepted but never told, and its word
 * lives only as long as its lease.
 *
 * Threads: any thread may call; the fabric belongs to the caller, who
 * keeps it until kvbm_manager_detach (or kvbm_manager_destroy) returns;
 * the peers serialise their own use of it. Peers are freed by
 * kvbm_manager_destroy (the hook it calls first). */
#ifndef KVBM_PEER_H
#define KVBM_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/fabric.h"
#include "kvbm/frame.h"
#include "kvbm/manager.h"
#include "kvbm/status.h"
#include "kvbm/tier.h"
#include "kvbm/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_MANAGER_MAX_PEERS 8

typedef enum kvbm_disagg_mode {
  KVBM_DISAGG_PUSH = 0,
  KVBM_DISAGG_PUT = 1,
} kvbm_disagg_mode;

typedef struct kvbm_peer_config {
  kvbm_disagg_mode mode;   /* how this side sends (PUSH) */
  uint32_t landing_blocks; /* blocks this side offers the peer's one-sided
                              writes (16; at least 1) */
  kvbm_tier ingest_tier;   /* where received blocks are registered: G1
                              (default) or G2 */
  int32_t timeout_ms;      /* attach, grants, flushes (10000) */
  uint32_t remote_index_blocks; /* blocks remembered as held by the peer,
                              for block_location and pulls (65536); also
                              the most blocks sent and awaiting the peer's
                              answer: past it the oldest wait is dropped
                              (acks_forgotten) and its late answer refused
                              (acks_unexpected), never believed */
  int32_t lease_ms;        /* how long the peer's word that it holds a
                              block is believed (30000; 0: the default;
                              at least 1): see "What a peer holds" */
  /* The cluster key shared with the peer ("Keyed links"): at most one of
   * key (KVBM_FABRIC_SECRET_MIN..MAX bytes, read at attach, not kept) and
   * key_file (a file of this user's, mode 600, not a link: the secret,
   * one trailing newline ignored). Both NULL: frames are not keyed. */
  const uint8_t *key;
  size_t key_len;
  const char *key_file;
} kvbm_peer_config;

KVBM_EXTERN kvbm_peer_config kvbm_peer_config_default(void);

/* Reads the peer settings kvbm takes from the environment into *cfg:
 * KVBM_PEER_KEY_FILE (the key file's path; the key itself is never taken
 * from the environment's values or a command line). env: "NAME=value"
 * strings, NULL-terminated (NULL: none set). cfg->key_file points into
 * env afterwards. KVBM_EINVAL for an empty path. */
KVBM_EXTERN int kvbm_peer_config_env(kvbm_peer_config *cfg, const char *const *env, kvbm_error *err);

/* Attaches the manager to the peer at the other end of `f` (the peer's
 * manager attaches to its end at about the same time: attach waits up to
 * timeout_ms for its hello). *peer gets the peer's index (0, 1, ...).
 * KVBM_EUNSUPPORTED: the peer's blocks have another shape (the message
 * names the field), or this side's ingest tier is absent;
 * KVBM_ETIMEDOUT: no hello; KVBM_EPROTO: a malformed hello; KVBM_EAUTH
 * (named): one side keyed and the other not, or another key;
 * KVBM_ENOSPC:
 * KVBM_MANAGER_MAX_PEERS already; KVBM_EINVAL (named): a bad field, a key
 * that cannot be used (length, a file others can read, both key and
 * key_file), a key other than the manager's earlier peers' (or keyed
 * after unkeyed, and the other way round); the fabric's own errors. */
KVBM_EXTERN int kvbm_manager_attach(kvbm_manager *m, kvbm_fabric *f, const kvbm_peer_config *cfg,
                                    uint32_t *peer, kvbm_error *err);

/* Stops serving the peer and forgets it (its index is not reused). The
 * caller may then destroy the fabric. kvbm_manager_destroy detaches every
 * peer. KVBM_ENOTFOUND for an unknown index. */
KVBM_EXTERN int kvbm_manager_detach(kvbm_manager *m, uint32_t peer, kvbm_error *err);

/* Sends the block registered under seq_hash (held in G1 or G2 with its
 * bytes in place) to the peer, labelled `phase`, the peer's way (PUSH or
 * PUT). Returns once the bytes are on the way (the peer's acknowledgement
 * comes later: kvbm_manager_peer_flush). KVBM_EDISAGG without a peer;
 * KVBM_ENOTFOUND: the block is not held here; KVBM_ENOSPC: the peer
 * granted no landing block; KVBM_ECLOSED: the peer is gone. */
KVBM_EXTERN int kvbm_manager_offload_block(kvbm_manager *m, uint32_t peer, uint64_t seq_hash,
                                           kvbm_frame_phase phase, kvbm_error *err);

/* Verifies and registers a block message (kvbm/fabric.h) that peer `peer`
 * sent: what the link thread does with every one it receives, open to an
 * engine that carries block messages itself. On KVBM_OK the block is in
 * the ingest tier (or was already there); otherwise the status says why
 * it was refused (KVBM_ECHECKSUM, KVBM_EAUTH for a frame of the wrong
 * kind or MAC on a keyed link, KVBM_EFORMAT for a wrong length or token
 * count, KVBM_EPROTO for a block not granted, a stale layout or a hash
 * that does not follow from the tokens, the decoder's errors) and the
 * cache is untouched. KVBM_EDISAGG without a peer. */
KVBM_EXTERN int kvbm_manager_ingest_block(kvbm_manager *m, uint32_t peer, const uint8_t *msg,
                                          size_t len, kvbm_error *err);

/* Waits until every block sent to the peer has been acknowledged (or
 * timeout_ms, < 0 forever). KVBM_ETIMEDOUT, KVBM_ECLOSED, KVBM_EDISAGG. */
KVBM_EXTERN int kvbm_manager_peer_flush(kvbm_manager *m, uint32_t peer, int timeout_ms,
                                        kvbm_error *err);

typedef struct kvbm_peer_stats {
  bool attached, closed;   /* closed: the link ended (peer gone, protocol) */
  kvbm_disagg_mode mode;
  uint64_t sent_blocks, sent_bytes;   /* offloads sent */
  uint64_t acked_blocks;              /* ... that the peer ingested */
  uint64_t peer_refused;              /* ... that the peer refused */
  uint64_t acks_unexpected;  /* acknowledgements refused: for no block sent
                                and awaited (never sent, answered already,
                                or forgotten); nothing else changed */
  uint64_t acks_forgotten;   /* sent blocks no longer awaited: more than
                                remote_index_blocks hashes were awaited */
  uint64_t received, ingested;        /* block messages from the peer */
  uint64_t refused_checksum, refused_length, refused_not_granted,
           refused_stale_layout, refused_hash, refused_other;
  uint64_t grants_given, grants_received;
  uint64_t exit_think_batches, exit_think_blocks; /* ExitThink offloads */
  uint64_t pulls_asked, pulled_blocks;            /* OutputCritical pulls */
  uint64_t dropped_for_room; /* G1 copies of blocks this peer holds that
                                an OutputCritical prefill dropped for room */
  /* Hashing (issue 22): a block's checksum is kept by its tier once
   * computed (at its first offload to G2 with a peer attached, or at its
   * first send), so a send frames it without hashing it again. */
  uint64_t sent_sums_kept;        /* blocks sent with their tier's kept checksum */
  uint64_t sent_hashed_bytes;     /* bytes the send path hashed (blocks with none kept) */
  uint64_t received_hashed_bytes; /* bytes hashed to check this peer's blocks */
  char last_refusal[KVBM_ERROR_MSG_MAX];          /* why the last refused block was */
  /* What the peer holds (issue 23). */
  uint32_t peer_version;     /* the peer's protocol version (1 or 2) */
  uint64_t removes_sent;     /* blocks we told the peer we no longer hold */
  uint64_t removes_all_sent; /* "forget everything" messages sent (a
                                tier cleared, or more removes queued than
                                bounded: the peer forgets more than needed) */
  uint64_t forgotten_removed; /* remote entries dropped at the peer's word
                                (remove message or "not held" answer) */
  uint64_t forgotten_expired; /* ... whose lease ran out */
  uint64_t forgotten_closed;  /* ... because the link closed */
  /* Keyed links (issue 23). */
  bool keyed;                /* this side frames and checks with the key */
  uint64_t refused_auth;     /* block messages refused by their MAC: no
                                key, another key, or forged (KVBM_EAUTH) */
  uint64_t refused_control;  /* keyed link: messages of any kind refused
                                by the link's MAC before being read (none,
                                a wrong one, or replayed): dropped, with
                                no effect ("Keyed links") */
  uint64_t refused_replayed; /* ... of them, genuine but replayed (a
                                sequence number already seen) */
} kvbm_peer_stats;

KVBM_EXTERN int kvbm_manager_peer_stats_get(kvbm_manager *m, uint32_t peer, kvbm_peer_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* KVBM_PEER_H */
