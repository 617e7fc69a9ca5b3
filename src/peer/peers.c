/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.c: a manager's peers (kvbm/peer.h): blocks moved between two
 * managers over a kvbm_fabric, as ADR-0006 asks of disaggregated prefill
 * and decode.
 *
 * A module above the manager (issue 23, "The house"). It was the tier's
 * disagg.c, reaching into seven of the manager's internals, and the
 * manager called it by name. Now it uses only kvbm/manager.h: blocks are
 * pinned, described and released with kvbm_manager_block_pin/unpin,
 * read with kvbm_manager_block_layer/read, placed with
 * kvbm_manager_block_put (the tier's block taken, filled and registered
 * there), their kept sums read and kept with kvbm_manager_block_sum(_keep)
 * (kvbm_manager_keep_sums says of which kind); what the manager needs of
 * the peers (is a block held by one, the pull, ExitThink's batch, "this
 * block left G1 and G2", destroy) are hooks registered once per manager
 * (kvbm_manager_peer_hooks_set) on a peer set, kvbm__peers, the hooks'
 * user pointer. The choices that are the manager's (which blocks ExitThink
 * sends, which G1 copies the pull drops for room, when a block has left
 * both tiers) stayed in the manager (tier/peer_hooks.c).
 *
 * Keyed links (issue 23). Peers that share a cluster key frame each block
 * with a keyed BLAKE3-128 MAC (MRDN frame version 2, the key
 * kvbm_fabric_frame_key derives from the secret, as G4's keyed frames
 * and the fabric codec do); the receiver decodes with that key
 * (kvbm_block_msg_decode_keyed, kvbm_frame_verifier_init_keyed), so a
 * frame from a peer without the key, with another key, or forged is
 * KVBM_EAUTH: counted (refused_auth, the metric), acknowledged as refused,
 * the block dropped. Hashed once: the manager's kept sums are that MAC
 * (kvbm_manager_keep_sums with the key, at attach), computed when a block
 * is first copied to G2 or first sent, and kept; a receiver keeps the
 * MAC it checked (kvbm_manager_block_put's sum), so a block pulled back
 * is not hashed again either. The secret comes from the config's bytes or
 * a key file (common/secret.c's checks), never a command line.
 *
 * Keyed control messages (issue 23). The frame MAC covers a block's
 * bytes; the link's other messages, and a pushed block's envelope, are
 * MAC'd by the link itself (peer/ctl.h has the wire and why): each
 * keyed hello carries a fresh nonce, both sides then exchange a sealed
 * confirmation naming both hellos (another key fails here, at attach),
 * and every later message ends with a sequence number and a keyed
 * BLAKE3-128 under the direction's key, derived from a control key of
 * its own context. handle() checks it before anything else reads the
 * message: a forged, unkeyed or replayed one is dropped, counted
 * (refused_control, refused_replayed) and has no effect; the link stays
 * up (see refuse_control for why). A keyed side and an unkeyed one refuse
 * each other at the hello.
 *
 * Design. A peer is one fabric connection to another manager. Attaching
 * exchanges hellos (a landing zone's export and the sending mode), then a
 * link thread serves what the peer sends: block messages (verified and
 * registered by kvbm_manager_ingest_block, then acknowledged with the
 * outcome), grant requests (landing blocks handed out for the peer's
 * one-sided writes), grants, acknowledgements and pulls. The engine's
 * threads send: offloads, ExitThink's batch, pull requests.
 *
 * The landing zone is memory the fabric allocated for the peer's one-sided
 * writes, apart from the cache: a peer holding the fabric's rkey can write
 * anywhere in what it was given, so it is given no cache block. A placed
 * block is verified where it landed, then copied into a block of the
 * ingest tier; a pushed one is verified in the message. Either way the
 * tier's block is taken only after every check has passed, and registered
 * only once its bytes are in: a refused block never touches the cache.
 *
 * Wire (this file's own messages; block messages are kvbm/fabric.h's),
 * little-endian, each one push:
 *   "KVPH" u32 version 2, u32 mode, u32 landing tier, u32 flags, u32 groups
 *          (kvbm_manager_groups_digest: 0 for one group, the bytes of
 *          before groups; a mismatch is refused at attach), u64 n, n
 *          bytes: the landing zone's export (kvbm_fabric_export)
 *   "KVRQ" u32 n                     grant me n landing blocks
 *   "KVGR" u32 n, n x u32 block ids  granted (n may be fewer, 0: no room)
 *   "KVAC" i32 status, u64 hash      a block message's outcome
 *   "KVPL" u32 n, n x u64 hashes     send these blocks back (a pull)
 *   "KVPM" u64 hash                  a pulled block not held here
 *   "KVRM" u32 flags, u32 n, u32 0, n x u64 hashes   (version 2)
 *                                    blocks I acknowledged and no longer
 *                                    hold; flags bit 0: forget them all
 *   "KVPR" u32 n, n x u64 hashes     as KVPL, answered with KVPB (version 3)
 *   "KVPB" + a placed block message naming the sender's own landing zone
 *          and block (version 3): a pulled block, staged there; read it
 *          one-sided, then acknowledge it (KVAC) to free the block
 * The hello's fourth u32 is its flags: 0 unkeyed (the bytes of before),
 * bit 0 keyed, and then a 32-byte nonce follows the export. Keyed links
 * add, second each way, "KVAU" u32 0, BLAKE3 of the hello sent and of the
 * one received; from it on, every message carries peer/ctl.h's trailer
 * (u64 seq, 16-byte MAC).
 *
 * Versions. A hello says 1, 2 or 3; all are accepted (the lower is
 * spoken). Version 2 adds only "KVRM": a version 1 peer is never sent one
 * (it would count it as unknown), and since it never sends one either,
 * its word is believed only for its lease. Version 3 adds only "KVPR"
 * and "KVPB": never sent to an older peer, whose pulls stay KVPL, pushed
 * back as before. A version above 3 is refused.
 *
 * Pulled blocks (version 3, issue 22). A pull the puller can read in one
 * pass (the peer's zone mapped here: UCX shared memory; asked as KVPR)
 * is answered with the blocks staged in landing blocks of the holder's own zone (lent,
 * SLOT_LENT, never granted, until the answer), each announced by KVPB
 * with its kept sum; the puller reads the block one-sided and hashes it
 * as it lands (kvbm_fabric_read_blocks_hashed: over UCX shared memory each
 * piece is copied and hashed at once, one pass over the bytes), into a
 * stage of its own, and runs every check a placed block gets (frame MAC
 * or checksum, identity, length) before a cache block is taken: the hash
 * is of the bytes that landed, so the holder changing them after the sum
 * costs the block (refused, counted), never a wrong one. Keyed links
 * copy each piece out of the mapping and feed the keyed MAC from the copy
 * at once (the pool hashes plain BLAKE3 only). Not mapped (TCP, RDMA, a
 * LayerSeparate zone), the read would need a flush on the link thread,
 * which waits for the peer's link thread too (two managers pulling from
 * each other would stall until timeout_ms): such pulls stay KVPL, pushed.
 * No landing block free, or a tier whose layers do not fit the zone's:
 * pushed as before. Offloads and ExitThink still push or put.
 *
 * What a peer holds (issue 23). The remote index remembers each hash the
 * peer acknowledged with the time of its answer; an entry is believed for
 * lease_ms from then (a later acknowledgement renews it), and expired
 * entries are dropped when found and from the oldest end on every add, so
 * nothing older than the lease ever makes block_location say remote or
 * lets make_room drop a G1 copy. Entries also go at the peer's word: a
 * "not held" answer to a pull, a KVRM; and all of them when the link
 * closes. The receiving side keeps the mirror image, `given`: the hashes
 * it ingested (bounded like the remote index), told to the peer; when such
 * a block leaves G1 and G2 (the tier's pool listener calls
 * the manager's gone hook, under its lock), its hash is queued (`gone`, a
 * bounded array: past it, one "forget them all" replaces the queue), and
 * the link thread sends the queue before serving each message and after
 * each acknowledgement. Order matters: a hash enters `given` before its
 * block is placed, so an eviction racing the ingest is queued, and the
 * queue goes out after the acknowledgement: the peer then adds, then
 * removes. What remains unsafe is a remove still in flight while the
 * peer drops its copy for room: the lease bounds how old a word may be,
 * not the link's latency.
 *
 * Locks. The fabric is used by one thread at a time (fmu, held for single
 * fabric calls only: waits loop with short timeouts, so that both ends'
 * link threads keep serving while an engine thread waits, and two
 * managers flushing towards each other cannot deadlock). A peer's state
 * has its own leaf lock (mu). Order: the manager's lock, then its hooks'
 * lock (the remote and gone hooks are called under both), then the set's
 * (s->mu, the array), then a peer's mu; fmu is never held with any of
 * them, and no manager call is made under s->mu or a peer's mu. Pushed buffers must live until
 * a flush (the UCX fabric reads them while the peer pulls): they wait in
 * an outbox that every successful flush empties.
 *
 * Acknowledgements. A peer is trusted with the fabric's key, not with
 * our bookkeeping: an acknowledgement counts only for a block message we
 * sent it and still await (the pending index, one count per send, taken
 * before the push so that a fast answer cannot beat it). Anything else is
 * counted (acks_unexpected) and changes nothing: a forged "ingested" must
 * not make block_location say remote, nor let an output-phase prefill
 * drop the only copy to make room, nor end a peer_flush early. The pending
 * index is bounded like the remote index (remote_index_blocks hashes);
 * beyond, the oldest send is forgotten (acks_forgotten): its answer is
 * then unexpected, which errs towards "local", and an honest batch that
 * large would have pushed the same blocks out of the remote index anyway.
 * Both indexes are peer/hindex.h's: O(1) per acknowledgement, lookup and
 * eviction, whatever their fill.
 *
 * Lifetime: a detached peer stays allocated (stopped, its fabric
 * resources released) until the manager is destroyed, so a pointer taken
 * earlier never dangles.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/secret.h"
#include "fabric/hello.h"
#include "fabric/map.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"
#include "kvbm/frame.h"
#include "kvbm/hash.h"
#include "kvbm/metrics.h"
#include "kvbm/peer.h"
#include "peer/ctl.h"
#include "peer/hindex.h"
#include "peer/testing.h"

#define PROTO_VERSION 3u  /* this side's; 1 (no removes) and 2 (no pulled blocks) are accepted */
#define PROTO_MIN 1u
#define LEASE_DEFAULT_MS 30000
#define GONE_MAX 512u /* removes queued before "forget them all" */
#define HELLO_FIXED 32u
#define HELLO_KEYED 1u /* a hello's flags: a cluster key, a nonce follows the export */
#define HELLO_MAX (16u << 20)
#define POLL_MS 5 /* a link thread's wait for the next message */

/* SLOT_LENT: a block of ours staged there for the peer to read (a pulled
 * block, KVPB), until its acknowledgement. */
enum { SLOT_FREE = 0, SLOT_GRANTED = 1, SLOT_BUSY = 2, SLOT_LENT = 3 };

typedef struct kvbm__peer kvbm__peer;

/* A manager's peers: the hooks' user (one per manager, made at its first
 * attach, freed by its destroy hook). */
typedef struct kvbm__peers {
  kvbm_manager *m;
  pthread_mutex_t mu; /* the array (a leaf under the manager's locks) */
  kvbm__peer *peers[KVBM_MANAGER_MAX_PEERS];
  uint32_t n;
  uint32_t B;           /* tokens per block */
  uint64_t block_bytes;
  kvbm_hash_scheme scheme;
  kvbm_metrics *reg;    /* where the collector is (NULL: none) */
  uint64_t reg_id;
  /* the corruption seam (peer/testing.h) */
  _Atomic uint64_t offloads;
  _Atomic uint64_t corrupt;
  _Atomic bool push_pulls; /* kvbm__peer_push_pulls */
} kvbm__peers;

typedef struct outbox_item {
  struct outbox_item *next;
  size_t len;
  uint8_t data[];
} outbox_item;

struct kvbm__peer {
  kvbm_manager *m;
  kvbm__peers *set;
  uint32_t index;
  kvbm_fabric *f;
  kvbm_peer_config cfg;
  pthread_mutex_t fmu; /* the fabric: one thread at a time */
  pthread_mutex_t mu;  /* everything below that the link thread changes */
  pthread_cond_t cv;   /* grants, acknowledgements, ingests, the end */
  pthread_t th;
  bool running;
  _Atomic bool stop;
  bool closed;   /* the link ended (peer gone, protocol error, detached) */
  bool detached;

  /* our landing zone, in the ingest tier's layout */
  kvbm_layout land_layout;
  kvbm_storage *land;
  kvbm_fabric_local_set *land_ls;
  uint64_t land_id;
  uint8_t *slot; /* SLOT_* per landing block */
  uint64_t *lent; /* SLOT_LENT: the hash staged there */

  /* pulled blocks (KVPB) read from the peer's zone: where they land
   * before the checks pass (block_bytes), and the pool that copies and
   * hashes each piece as it lands (no worker threads: the link thread) */
  uint8_t *pull_stage;
  kvbm_blake3_pool *pool;

  /* the peer's */
  kvbm_fabric_remote_set *rs;
  bool rs_mapped; /* mapped here (kvbm__fabric_map_block): pulls are read */
  uint64_t peer_land_id;
  kvbm_tier peer_land_tier;

  /* keyed links: the frame MAC key (kvbm_fabric_frame_key of the
   * cluster secret), zeroed at free */
  bool keyed;
  uint8_t mac_key[32];
  /* ... and its control messages' MAC (peer/ctl.h): the control key
   * (kvbm__ctl_key of the secret), this side's hello nonce, the two
   * directions' keys once the hellos are in, and the sequence numbers:
   * the next this side sends (under fmu, taken in push order) and the
   * lowest it still accepts (link thread). sealed: every push from the
   * confirmation on carries the trailer. All zeroed at free. */
  uint8_t ctl_key[KVBM__CTL_KEY];
  uint8_t nonce[KVBM__CTL_NONCE];
  uint8_t tx_key[KVBM__CTL_KEY], rx_key[KVBM__CTL_KEY];
  uint8_t hello_sent[32], hello_got[32]; /* BLAKE3 of each hello, for the confirmation */
  bool sealed;
  uint64_t tx_seq, rx_next;

  /* grants the peer gave us (put mode), not used yet */
  uint32_t *grants;
  uint32_t ngrants;
  uint64_t grant_replies;

  uint64_t awaiting; /* block messages sent and not yet acknowledged */
  uint64_t handled;  /* block messages and pull misses received */

  /* hindex.h, both bounded by remote_index_blocks: the hashes the peer
   * acknowledged (block_location's "remote", the blocks a pull may drop
   * here), and those sent and awaiting its acknowledgement (count: sends
   * in flight), the only acknowledgements take_ack accepts */
  kvbm__hindex remote, pending;
  uint32_t peer_version; /* the lower of the two hellos' */
  /* the receiving side (version 2 peers): hashes ingested from the peer
   * (its remote index of us), and those gone from G1 and G2 since, to be
   * told (GONE_MAX; gone_all: tell it to forget everything) */
  kvbm__hindex given;
  uint64_t *gone;
  uint32_t ngone;
  bool gone_all;
  int64_t skew_ms; /* the lease clock's test seam (kvbm__peer_skew_clock) */

  outbox_item *outbox; /* pushed, waiting for a flush; under fmu */
  uint8_t *rbuf;       /* the link thread's receive buffer */
  size_t msg_max;
  kvbm_peer_stats st;
};

/* ---- little-endian helpers ---- */


static int64_t now_ms(void) { return (int64_t)(kvbm_clock_ns() / 1000000u); }


/* ---- the peer set and its array ---- */

static kvbm__peers *set_of(kvbm_manager *m) { return kvbm_manager_peer_hooks_user(m); }

static kvbm__peer *peer_get(kvbm_manager *m, uint32_t index) {
  kvbm__peers *s = set_of(m);
  if (!s) return NULL;
  pthread_mutex_lock(&s->mu);
  kvbm__peer *p = index < s->n ? s->peers[index] : NULL;
  pthread_mutex_unlock(&s->mu);
  return p;
}

static uint32_t peer_count(kvbm_manager *m) {
  kvbm__peers *s = set_of(m);
  if (!s) return 0;
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->n;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* ---- the remote index and the awaited acknowledgements (under p->mu) ---- */

/* The lease clock: monotonic milliseconds, plus the test seam's skew. */
static int64_t lease_now(const kvbm__peer *p) { return now_ms() + p->skew_ms; }

static bool expired(const kvbm__peer *p, uint64_t stamp, int64_t now) {
  return now - (int64_t)stamp >= (int64_t)p->cfg.lease_ms;
}

/* Drops the expired entries: they are the oldest (put keeps the age list
 * in stamp order), so this stops at the first live one. */
static void remote_expire(kvbm__peer *p, int64_t now) {
  uint64_t h, stamp;
  while (kvbm__hindex_oldest(&p->remote, &h, &stamp) && expired(p, stamp, now)) {
    kvbm__hindex_drop(&p->remote, h);
    p->st.forgotten_expired++;
  }
}

/* Whether the peer's word that it holds h is there and within its lease;
 * an expired word is dropped here. O(1). */
static bool remote_has(kvbm__peer *p, uint64_t h) {
  uint64_t stamp;
  if (!kvbm__hindex_get(&p->remote, h, &stamp)) return false;
  if (!expired(p, stamp, lease_now(p))) return true;
  kvbm__hindex_drop(&p->remote, h);
  p->st.forgotten_expired++;
  return false;
}

/* Remembers h as held by the peer from now (a new word renews the lease);
 * the oldest goes when remote_index_blocks are held. O(1) amortised
 * (hindex.h; each expired entry is dropped once). */
static void remote_add(kvbm__peer *p, uint64_t h) {
  int64_t now = lease_now(p);
  remote_expire(p, now);
  kvbm__hindex_put(&p->remote, h, (uint64_t)now, NULL, NULL);
}

/* The peer's word that it no longer holds h (a remove, a "not held"). */
static void remote_forget(kvbm__peer *p, uint64_t h) {
  if (kvbm__hindex_drop(&p->remote, h)) p->st.forgotten_removed++;
}

/* A block message for h is about to be pushed: its acknowledgement is
 * awaited from now on (before the push, or the peer's answer could come
 * first and be refused). Beyond remote_index_blocks distinct hashes
 * awaited, the oldest is forgotten: counted in acks_forgotten, no longer
 * waited for by peer_flush, and its acknowledgement, should it come, is
 * refused as unexpected, so the block is not remembered as remote. That
 * errs on the safe side: a block wrongly thought local is at worst sent
 * or computed again; one wrongly thought remote is dropped here for a
 * copy that may not exist. */
static void await_ack(kvbm__peer *p, uint64_t h) {
  uint32_t gone;
  pthread_mutex_lock(&p->mu);
  kvbm__hindex_add(&p->pending, h, &gone, NULL);
  p->awaiting = p->awaiting + 1 - gone;
  p->st.acks_forgotten += gone;
  if (gone) pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* The push for h failed: no acknowledgement is coming for it. */
static void await_cancel(kvbm__peer *p, uint64_t h) {
  pthread_mutex_lock(&p->mu);
  if (kvbm__hindex_take(&p->pending, h)) p->awaiting--;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* ---- sending (fmu for single calls) ---- */

static void outbox_free(kvbm__peer *p) {
  while (p->outbox) {
    outbox_item *o = p->outbox;
    p->outbox = o->next;
    free(o);
  }
}

/* Pushes a copy of data[0..len) (kept until a flush). fmu taken here. */
static int send_copy(kvbm__peer *p, const void *data, size_t len, kvbm_error *err) {
  outbox_item *o = malloc(sizeof *o + len + KVBM__CTL_TRAILER);
  if (!o) return kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  memcpy(o->data, data, len);
  pthread_mutex_lock(&p->fmu);
  /* Sealed under fmu: sequence numbers go out in the order they were
   * taken, so the receiver can refuse any it has seen (peer/ctl.h). */
  if (p->sealed) {
    kvbm__ctl_seal(p->tx_key, o->data, len, p->tx_seq++);
    len += KVBM__CTL_TRAILER;
  }
  o->len = len;
  int rc = kvbm_fabric_push(p->f, o->data, len, NULL, err);
  if (rc) {
    free(o);
  } else {
    o->next = p->outbox;
    p->outbox = o;
  }
  pthread_mutex_unlock(&p->fmu);
  return rc;
}

/* Flushes in short slices, so that the link threads at both ends keep
 * serving meanwhile; an empty outbox and done one-sided writes on OK. */
static int flush_loop(kvbm__peer *p, int timeout_ms, kvbm_error *err) {
  int64_t end = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
  for (;;) {
    pthread_mutex_lock(&p->fmu);
    int rc = kvbm_fabric_flush(p->f, 2, err);
    if (rc == KVBM_OK) outbox_free(p);
    pthread_mutex_unlock(&p->fmu);
    if (rc != KVBM_ETIMEDOUT) return rc;
    if (now_ms() >= end) return kvbm_error_set(err, KVBM_ETIMEDOUT, "peer %u: flush timed out", p->index);
    usleep(200);
  }
}

static int send_ack(kvbm__peer *p, int status, uint64_t hash) {
  uint8_t b[16];
  memcpy(b, "KVAC", 4);
  kvbm__put_le32(b + 4, (uint32_t)status);
  kvbm__put_le64(b + 8, hash);
  return send_copy(p, b, sizeof b, NULL);
}

/* ---- ingest: checks, then the tier ---- */

/* The message's block, all checks passed: into a block of tier ti taken
 * only now, registered under its identity once its bytes are in
 * (kvbm_manager_block_put), with the sum its bytes were checked against
 * kept (of the manager's kind: this link's key or none). */
static int place(kvbm__peer *p, kvbm_tier ti, const kvbm_block_msg *msg, const uint8_t *const *layers,
                 kvbm_error *err) {
  kvbm_block_ref b = {.seq_hash = msg->seq_hash, .parent_hash = msg->parent_hash, .salt_hash = msg->salt_hash,
                      .has_parent = msg->has_parent, .tokens = msg->num_tokens ? msg->tokens : NULL,
                      .phase = msg->phase};
  kvbm_error e = {0};
  int rc = kvbm_manager_block_put(p->m, ti, &b, layers, msg->frame.checksum, &e);
  if (rc == KVBM_ENOSPC)
    return kvbm_error_set(err, rc, "peer %u: %s has no block to spare", p->index, kvbm_tier_name(ti));
  if (rc) return kvbm_error_set(err, rc, "peer %u: %s", p->index, e.msg);
  return KVBM_OK;
}

/* ---- the receiving side: what the peer was told we hold ---- */

/* h is about to be placed for the peer (version 2 only): remembered, so
 * that its eviction is told. Beyond remote_index_blocks the oldest is
 * forgotten untold: the peer's lease ends its word. */
static bool given_add(kvbm__peer *p, uint64_t h) {
  if (p->peer_version < 2) return false;
  pthread_mutex_lock(&p->mu);
  kvbm__hindex_put(&p->given, h, 0, NULL, NULL);
  pthread_mutex_unlock(&p->mu);
  return true;
}

static void given_drop(kvbm__peer *p, uint64_t h) {
  pthread_mutex_lock(&p->mu);
  kvbm__hindex_drop(&p->given, h);
  pthread_mutex_unlock(&p->mu);
}

/* Queues h's removal for the peer (p->mu held). */
static void gone_queue(kvbm__peer *p, uint64_t h) {
  if (!kvbm__hindex_drop(&p->given, h) || p->gone_all) return;
  if (p->ngone < GONE_MAX) p->gone[p->ngone++] = h;
  else p->gone_all = true; /* bounded: the peer forgets more than needed */
}

/* The gone hook (kvbm/manager.h): h left both G1 and G2 here (all: a
 * tier was cleared). Under the manager's locks: no manager call. */
static void hook_gone(void *user, uint64_t h, bool all) {
  kvbm__peers *s = user;
  pthread_mutex_lock(&s->mu);
  for (uint32_t i = 0; i < s->n; i++) {
    kvbm__peer *p = s->peers[i];
    pthread_mutex_lock(&p->mu);
    if (p->peer_version >= 2 && !p->closed) {
      if (all) {
        p->gone_all = true;
      } else {
        gone_queue(p, h);
      }
    }
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&s->mu);
}

/* Streams the frame verifier over a landing block's layers. */
static int verify_landed(kvbm__peer *p, const kvbm_block_msg *msg, const uint8_t **layers, uint64_t *hashed,
                         kvbm_error *err) {
  kvbm_frame_verifier v;
  int rc = kvbm_frame_verifier_init_keyed(&v, &msg->frame, p->keyed ? p->mac_key : NULL, err);
  for (uint64_t l = 0; rc == KVBM_OK && l < p->land_layout.config.num_layers; l++) {
    void *ptr;
    size_t size;
    rc = kvbm_storage_block_layer_ptr(p->land, &p->land_layout, msg->block_id, l, &ptr, &size, err);
    if (rc == KVBM_OK) {
      layers[l] = ptr;
      rc = kvbm_frame_verifier_update(&v, ptr, size, err);
      if (rc == KVBM_OK) *hashed += size;
    }
  }
  return rc ? rc : kvbm_frame_verifier_finish(&v, err);
}

/* A keyed pulled block into pull_stage, its MAC checked. Mapped: each
 * 256 KiB piece copied out of the mapping and fed to the verifier from
 * the copy at once, while in this core's cache (one pass, as the pool
 * does for plain sums). Not mapped (rare: the puller asks for pulled
 * blocks only when block 0 mapped, see hook_pull): a read and a flush. */
static int read_keyed(kvbm__peer *p, const kvbm_block_msg *msg, kvbm_error *err) {
  const size_t bb = (size_t)p->set->block_bytes, piece = KVBM_BLAKE3_POOL_PIECE_DEFAULT;
  uint8_t *dst = p->pull_stage;
  const void *src = NULL;
  pthread_mutex_lock(&p->fmu);
  int rc = kvbm__fabric_map_block(p->f, p->rs, msg->block_id, &src, err);
  if (rc == KVBM_EUNSUPPORTED) {
    src = NULL;
    rc = kvbm_fabric_read_block(p->f, p->rs, msg->block_id, dst, bb, err);
  }
  pthread_mutex_unlock(&p->fmu);
  if (!rc && !src) rc = flush_loop(p, p->cfg.timeout_ms, err);
  kvbm_frame_verifier v;
  if (!rc) rc = kvbm_frame_verifier_init_keyed(&v, &msg->frame, p->mac_key, err);
  for (size_t off = 0; !rc && off < bb; off += piece) {
    size_t n = bb - off < piece ? bb - off : piece;
    if (src) memcpy(dst + off, (const uint8_t *)src + off, n);
    rc = kvbm_frame_verifier_update(&v, dst + off, n, err);
  }
  return rc ? rc : kvbm_frame_verifier_finish(&v, err);
}

/* A pulled block (KVPB): read from the peer's landing zone, where the
 * peer staged it, into pull_stage and hashed as it lands: unkeyed, by
 * kvbm_fabric_read_blocks_hashed (over a mapping, UCX shared memory: each
 * 256 KiB piece copied and hashed at once, one pass over the bytes); keyed
 * (the pool hashes plain BLAKE3 only), read, flushed, then the MAC
 * streamed over the stage. Either way the hash is of what landed here,
 * never of the peer's memory, and is checked against the frame's kept
 * sum: ECHECKSUM / EAUTH on a mismatch, before any cache block is taken. */
static int read_pulled(kvbm__peer *p, const kvbm_block_msg *msg, const uint8_t **layers, uint64_t *hashed,
                       kvbm_error *err) {
  const kvbm_layout *pl = &kvbm_fabric_remote_desc(p->rs)->layout;
  const uint64_t bb = p->set->block_bytes, nl = p->land_layout.config.num_layers;
  if (kvbm_fabric_block_bytes(pl) != bb || pl->config.num_layers != nl)
    return kvbm_error_set(err, KVBM_EFORMAT, "wrong length: the peer's landing blocks are %llu bytes in %llu "
                          "layers, blocks here %llu bytes in %llu",
                          (unsigned long long)kvbm_fabric_block_bytes(pl), (unsigned long long)pl->config.num_layers,
                          (unsigned long long)bb, (unsigned long long)nl);
  void *dst = p->pull_stage;
  int rc;
  if (!p->keyed) {
    uint8_t sum[16];
    pthread_mutex_lock(&p->fmu);
    rc = kvbm_fabric_read_blocks_hashed(p->f, p->rs, &msg->block_id, &dst, 1, p->pool, sum, sizeof sum,
                                        p->cfg.timeout_ms, err);
    pthread_mutex_unlock(&p->fmu);
    if (!rc) *hashed += bb;
    if (!rc && memcmp(sum, msg->frame.checksum, sizeof sum) != 0)
      rc = kvbm_error_set(err, KVBM_ECHECKSUM, "pulled block %016llx: its bytes do not match the frame's checksum",
                          (unsigned long long)msg->seq_hash);
  } else {
    rc = read_keyed(p, msg, err);
    if (rc == KVBM_OK || rc == KVBM_EAUTH) *hashed += bb; /* hashed, matched or not */
  }
  for (uint64_t l = 0; l < nl; l++) layers[l] = p->pull_stage + l * pl->layer_stride;
  return rc;
}

/* The body length a pushed message's frame declares (its envelope and
 * header were checked by the decoder that hashed the body). */
static uint64_t pushed_body_len(const uint8_t *buf, size_t len) {
  kvbm_frame_header h;
  size_t off = KVBM_BLOCK_MSG_FIXED + (size_t)kvbm__get_le32(buf + 48) * 4;
  if (len < off || kvbm_frame_parse_header(buf + off, len - off, UINT32_MAX, &h, NULL)) return 0;
  return h.body_len;
}

/* The landing block a placed message's envelope names, granted and
 * not yet used, is free again (its message was refused before the
 * block's bytes were looked at). */
static void grant_back(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (len < KVBM_BLOCK_MSG_FIXED || !(kvbm__get_le32(buf + 32) & 2u)) return;
  uint64_t off = KVBM_BLOCK_MSG_FIXED + (uint64_t)kvbm__get_le32(buf + 48) * 4;
  if (off + 8 > len) return;
  uint64_t id = kvbm__get_le64(buf + off);
  pthread_mutex_lock(&p->mu);
  if (id < p->cfg.landing_blocks && p->slot[id] == SLOT_GRANTED) p->slot[id] = SLOT_FREE;
  pthread_mutex_unlock(&p->mu);
}

/* Every check of one block message, in order, then place(). *reason is
 * the stats counter the refusal goes to; *hashed the bytes hashed to
 * check it (the one hash a block's bytes get on their way, issue 22). */
static int ingest_msg(kvbm__peer *p, const uint8_t *buf, size_t len, bool pulled, uint64_t **reason,
                      uint64_t *hashed, kvbm_error *err) {
  const kvbm__peers *s = p->set;
  const uint32_t B = s->B;
  uint32_t *tokens = malloc(B * sizeof *tokens);
  const uint8_t **layers = malloc(p->land_layout.config.num_layers * sizeof *layers);
  kvbm_block_msg msg;
  int rc = tokens && layers ? KVBM_OK : kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  *reason = &p->st.refused_other;
  if (!rc) {
    rc = kvbm_block_msg_decode_keyed(p->keyed ? p->mac_key : NULL, buf, len, B, (uint32_t)s->block_bytes, tokens,
                                     &msg, err);
    if (rc == KVBM_ECHECKSUM) *reason = &p->st.refused_checksum;
    if (rc == KVBM_EAUTH) *reason = &p->st.refused_auth;
    if (rc == KVBM_ECHECKSUM || (rc == KVBM_OK && !msg.placed))
      *hashed += pushed_body_len(buf, len);
    if (rc == KVBM_ETOOLONG || rc == KVBM_ETRUNCATED) *reason = &p->st.refused_length;
  }
  /* A pulled block is a placed message naming the peer's own zone. */
  const uint64_t zone = pulled ? p->peer_land_id : p->land_id;
  if (!rc && pulled && !msg.placed)
    rc = kvbm_error_set(err, KVBM_EPROTO, "a pulled block message that is not placed");
  /* Asked for only where the peer's zone is mapped (hook_pull): a read
   * elsewhere would flush on this link thread, which a peer could make
   * wait for as long as timeout_ms with blocks nobody asked for. */
  if (!rc && pulled && !p->rs_mapped)
    rc = kvbm_error_set(err, KVBM_EPROTO, "a pulled block this side never asks for: the peer's landing zone "
                        "is not mapped here");
  if (!rc && msg.layout_id != zone) {
    *reason = &p->st.refused_stale_layout;
    rc = kvbm_error_set(err, KVBM_EPROTO, "stale layout: the block was laid out for block set %016llx, "
                        "it should name %s landing zone %016llx",
                        (unsigned long long)msg.layout_id, pulled ? "the peer's" : "this manager's",
                        (unsigned long long)zone);
  }
  /* A placed message the decoder refused (a frame of the wrong kind or
   * MAC on a keyed link, a bad header) names its landing block only in
   * its envelope: a block granted to the peer goes back all the same, or
   * every refusal would cost the zone a block for good. */
  if (rc && !pulled) grant_back(p, buf, len);
  /* A placed block's landing block is taken first, so that every later
   * refusal gives it back. */
  bool slot_taken = false;
  if (!rc && msg.placed && !pulled) {
    pthread_mutex_lock(&p->mu);
    if (msg.block_id < p->cfg.landing_blocks && p->slot[msg.block_id] == SLOT_GRANTED) {
      p->slot[msg.block_id] = SLOT_BUSY;
      slot_taken = true;
    }
    pthread_mutex_unlock(&p->mu);
    if (!slot_taken) {
      *reason = &p->st.refused_not_granted;
      rc = kvbm_error_set(err, KVBM_EPROTO, "block %llu of the landing zone was not granted",
                          (unsigned long long)msg.block_id);
    }
  }
  if (!rc && (msg.body_len != s->block_bytes || (msg.num_tokens != 0 && msg.num_tokens != B))) {
    *reason = &p->st.refused_length;
    rc = kvbm_error_set(err, KVBM_EFORMAT, "wrong length: a block of %zu bytes and %u tokens, blocks here are "
                        "%llu bytes and %u tokens",
                        msg.body_len, msg.num_tokens, (unsigned long long)s->block_bytes, B);
  }
  if (!rc && msg.num_tokens &&
      kvbm_manager_key_group(p->m, msg.seq_hash, msg.salt_hash, msg.parent_hash, msg.has_parent, tokens, NULL)) {
    *reason = &p->st.refused_hash;
    rc = kvbm_error_set(err, KVBM_EPROTO, "sequence hash %016llx does not follow from the block's tokens",
                        (unsigned long long)msg.seq_hash);
  }
  if (!rc && pulled) {
    rc = read_pulled(p, &msg, layers, hashed, err);
    if (rc == KVBM_ECHECKSUM) *reason = &p->st.refused_checksum;
    if (rc == KVBM_EAUTH) *reason = &p->st.refused_auth;
    if (rc == KVBM_EFORMAT) *reason = &p->st.refused_length;
  } else if (!rc && msg.placed) {
    if (msg.tier != p->cfg.ingest_tier) {
      rc = kvbm_error_set(err, KVBM_EPROTO, "a placed block names tier %s, the landing zone is %s's",
                          kvbm_tier_name(msg.tier), kvbm_tier_name(p->cfg.ingest_tier));
    } else {
      rc = verify_landed(p, &msg, layers, hashed, err);
      if (rc == KVBM_ECHECKSUM) *reason = &p->st.refused_checksum;
      if (rc == KVBM_EAUTH) *reason = &p->st.refused_auth;
    }
  } else if (!rc) {
    for (uint64_t l = 0; l < p->land_layout.config.num_layers; l++)
      layers[l] = msg.body + l * p->land_layout.layer_stride;
  }
  /* Told to the peer before the block is placed: an eviction from then on
   * is queued for it (see "What a peer holds"). */
  bool told = !rc && given_add(p, msg.seq_hash);
  if (!rc) rc = place(p, p->cfg.ingest_tier, &msg, layers, err);
  if (rc && told) given_drop(p, msg.seq_hash);
  if (slot_taken) {
    pthread_mutex_lock(&p->mu);
    p->slot[msg.block_id] = SLOT_FREE;
    pthread_mutex_unlock(&p->mu);
  }
  free(tokens);
  free(layers);
  return rc;
}

/* One block message from peer p: ingested or refused, and counted. The
 * link thread calls it with its own peer: that peer is published in
 * the set's array only after its thread started (attach), so a lookup by index
 * could miss it while the first messages arrive. */
static int peer_ingest(kvbm__peer *p, const uint8_t *msg, size_t len, bool pulled, kvbm_error *err) {
  uint64_t *reason, hashed = 0;
  kvbm_error e = {0};
  int rc = ingest_msg(p, msg, len, pulled, &reason, &hashed, &e);
  pthread_mutex_lock(&p->mu);
  p->st.received++;
  p->st.received_hashed_bytes += hashed;
  if (rc == KVBM_OK) {
    p->st.ingested++;
  } else {
    (*reason)++;
    snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "%.40s: %.200s", kvbm_status_name(rc), e.msg);
  }
  p->handled++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (rc) return kvbm_error_set(err, rc, "%s", e.msg);
  return KVBM_OK;
}

int kvbm_manager_ingest_block(kvbm_manager *m, uint32_t peer, const uint8_t *msg, size_t len, kvbm_error *err) {
  if (!m || (!msg && len)) return kvbm_error_set(err, KVBM_EINVAL, "manager: ingest: NULL argument");
  if (peer_count(m) == 0)
    return kvbm_error_set(err, KVBM_EDISAGG, "manager: disaggregation unavailable: no fabric attached");
  kvbm__peer *p = peer_get(m, peer);
  if (!p) return kvbm_error_set(err, KVBM_ENOTFOUND, "manager: no peer %u", peer);
  return peer_ingest(p, msg, len, false, err);
}

/* ---- sending blocks ---- */

/* A landing block of ours, free, lent to staging h (KVBM_ENOSPC: none). */
static int lend_slot(kvbm__peer *p, uint64_t h, uint32_t *slot) {
  int rc = KVBM_ENOSPC;
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; rc && i < p->cfg.landing_blocks; i++)
    if (p->slot[i] == SLOT_FREE) {
      p->slot[i] = SLOT_LENT;
      p->lent[i] = h;
      *slot = i;
      rc = KVBM_OK;
    }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

/* The staging blocks lent for h are free again (its answer came; p->mu
 * held). The scan is of landing_blocks bytes (16 by default). */
static void unlend(kvbm__peer *p, uint64_t h) {
  for (uint32_t i = 0; i < p->cfg.landing_blocks; i++)
    if (p->slot[i] == SLOT_LENT && p->lent[i] == h) p->slot[i] = SLOT_FREE;
}


/* One block to send: pinned in its tier until sent (kvbm/manager.h). */
typedef kvbm_block_ref src_block;

/* Whether this offload is one the corruption seam spoils. */
static bool corrupt_this(kvbm__peers *s) {
  uint64_t mask = atomic_load_explicit(&s->corrupt, memory_order_relaxed);
  if (!mask) return false;
  uint64_t n = atomic_fetch_add(&s->offloads, 1);
  return n < 64 && (mask >> n & 1);
}

/* The layers of block b for a one-sided write: host tiers in place, a
 * device tier through `stage` (block_bytes). */
static int source_layers(kvbm_manager *m, const src_block *b, uint8_t *stage, const void **layers,
                         kvbm_error *err) {
  const kvbm_layout *L = kvbm_manager_layout(m, b->tier);
  const bool device = kvbm_manager_memory(m, b->tier) == KVBM_MEMORY_DEVICE;
  for (uint64_t l = 0; l < L->config.num_layers; l++) {
    if (!device) {
      void *ptr;
      size_t size;
      int rc = kvbm_manager_block_layer(m, b->tier, b->id, (uint32_t)l, &ptr, &size);
      if (rc) return kvbm_error_set(err, rc, "peer: layer %llu of block %u", (unsigned long long)l, b->id);
      layers[l] = ptr;
      continue;
    }
    uint8_t *dst = stage + l * L->layer_stride;
    int rc = kvbm_manager_block_read(m, b->tier, b->id, (uint32_t)l, dst, L->layer_stride, err);
    if (rc) return rc;
    layers[l] = dst;
  }
  return KVBM_OK;
}

/* The block's sum over its layers in order (its canonical bytes): plain
 * BLAKE3-128, or keyed under the link's key (the frame's MAC). */
static void hash_layers(const kvbm__peer *p, const kvbm_layout *L, const void *const *layers, uint8_t sum[16]) {
  kvbm_blake3_hasher h;
  if (p->keyed) (void)kvbm_blake3_hasher_init_keyed(&h, p->mac_key);
  else kvbm_blake3_hasher_init(&h);
  for (uint64_t l = 0; l < L->config.num_layers; l++) kvbm_blake3_hasher_update(&h, layers[l], L->layer_stride);
  kvbm_blake3_hasher_finalize(&h, sum, 16);
}

/* The frame checksum (or MAC) of pinned block b, whose layers are at
 * `layers`: the one its tier kept (kvbm_manager_block_sum: nothing
 * hashed; of this link's kind, kvbm_manager_keep_sums at attach), else
 * hashed here and kept for its next send. Counted either way. A kept sum
 * is trusted only for the frame: the receiver hashes the bytes it gets,
 * so a sum gone stale (bytes changed behind the manager) costs the block,
 * refused by checksum, never a wrong one. */
static void block_sum(kvbm__peer *p, const src_block *b, const void *const *layers, uint8_t sum[16]) {
  bool kept = kvbm_manager_block_sum(p->m, b->tier, b->id, sum) == KVBM_OK;
  if (!kept) {
    hash_layers(p, kvbm_manager_layout(p->m, b->tier), layers, sum);
    kvbm_manager_block_sum_keep(p->m, b->tier, b->id, sum);
  }
  pthread_mutex_lock(&p->mu);
  if (kept) p->st.sent_sums_kept++;
  else p->st.sent_hashed_bytes += p->set->block_bytes;
  pthread_mutex_unlock(&p->mu);
}

static kvbm_block_msg msg_of(const kvbm__peer *p, const src_block *b, uint32_t ntok) {
  kvbm_block_msg msg = {.seq_hash = b->seq_hash, .parent_hash = b->parent_hash, .salt_hash = b->salt_hash,
                        .has_parent = b->has_parent, .num_tokens = b->tokens ? ntok : 0,
                        .tokens = b->tokens, .tier = p->peer_land_tier, .layout_id = p->peer_land_id,
                        .phase = b->phase, .body_len = (size_t)p->set->block_bytes,
                        .mac_key = p->keyed ? p->mac_key : NULL};
  return msg;
}

/* PUSH: each block gathered into its message where the frame's body
 * goes (one copy), framed with its checksum (kept, or hashed once), pushed. */
static int push_blocks(kvbm__peer *p, const src_block *blocks, size_t n, kvbm_error *err) {
  kvbm_manager *m = p->m;
  const uint32_t B = p->set->B;
  const uint64_t bb = p->set->block_bytes;
  size_t cap = kvbm_block_msg_size(B, bb);
  uint8_t *msgbuf = malloc(cap);
  const kvbm_layout *L0 = kvbm_manager_layout(m, blocks[0].tier);
  const void **layers = malloc(L0->config.num_layers * sizeof *layers);
  int rc = msgbuf && layers ? KVBM_OK : kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const src_block *b = &blocks[i];
    const kvbm_layout *L = kvbm_manager_layout(m, b->tier);
    kvbm_block_msg msg = msg_of(p, b, B);
    uint8_t *body = msgbuf + KVBM_BLOCK_MSG_FIXED + (size_t)msg.num_tokens * 4 + KVBM_FRAME_HEADER_LEN;
    for (uint64_t l = 0; !rc && l < L->config.num_layers; l++) {
      layers[l] = body + l * L->layer_stride;
      rc = kvbm_manager_block_read(m, b->tier, b->id, (uint32_t)l, body + l * L->layer_stride, L->layer_stride, err);
    }
    if (!rc) block_sum(p, b, layers, msg.frame.checksum);
    msg.body = body;
    msg.sum_given = 1;
    size_t len = 0;
    if (!rc) rc = kvbm_block_msg_encode(&msg, msgbuf, cap, &len, err);
    if (!rc && corrupt_this(p->set)) msgbuf[len - 1] ^= 0x5A; /* the seam: a bad link */
    if (!rc) {
      await_ack(p, b->seq_hash);
      rc = send_copy(p, msgbuf, len, err);
      if (rc) await_cancel(p, b->seq_hash);
    }
    if (!rc) {
      pthread_mutex_lock(&p->mu);
      p->st.sent_blocks++;
      p->st.sent_bytes += bb;
      pthread_mutex_unlock(&p->mu);
    }
  }
  free(layers);
  free(msgbuf);
  return rc;
}

/* PUT: landing blocks granted by the peer, up to n (asked for when we
 * hold too few); *got of them in ids. */
static int take_grants(kvbm__peer *p, uint32_t n, uint32_t *ids, uint32_t *got, kvbm_error *err) {
  pthread_mutex_lock(&p->mu);
  uint64_t replies = p->grant_replies;
  uint32_t have = p->ngrants;
  pthread_mutex_unlock(&p->mu);
  if (have < n) {
    uint8_t req[8];
    memcpy(req, "KVRQ", 4);
    kvbm__put_le32(req + 4, n - have);
    int rc = send_copy(p, req, sizeof req, err);
    if (rc) return rc;
    struct timespec dl = kvbm__deadline_after_ms(CLOCK_REALTIME, p->cfg.timeout_ms);
    pthread_mutex_lock(&p->mu);
    while (p->grant_replies == replies && !p->closed)
      if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT) break;
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_lock(&p->mu);
  uint32_t k = p->ngrants < n ? p->ngrants : n;
  for (uint32_t i = 0; i < k; i++) ids[i] = p->grants[--p->ngrants];
  bool closed = p->closed;
  pthread_mutex_unlock(&p->mu);
  *got = k;
  if (k == 0)
    return closed ? kvbm_error_set(err, KVBM_ECLOSED, "peer %u: the link is closed", p->index)
                  : kvbm_error_set(err, KVBM_ENOSPC, "peer %u granted no landing block", p->index);
  return KVBM_OK;
}

/* PUT: written one-sided into granted landing blocks, layer by layer
 * (bridging the layouts), flushed, then announced by placed messages. */
static int put_blocks(kvbm__peer *p, const src_block *blocks, size_t n, kvbm_error *err) {
  kvbm_manager *m = p->m;
  const uint32_t B = p->set->B;
  const uint64_t bb = p->set->block_bytes;
  const kvbm_layout *L0 = kvbm_manager_layout(m, blocks[0].tier);
  const uint64_t nl = L0->config.num_layers, ls = L0->layer_stride;
  uint32_t *slots = malloc(n * sizeof *slots);
  uint8_t (*sums)[16] = malloc(n * 16);
  uint8_t *stage = malloc(n * bb), *spoil = malloc(n);
  const void **layers = malloc(nl * sizeof *layers);
  size_t cap = kvbm_block_msg_placed_size(B), done = 0;
  uint8_t *msgbuf = malloc(cap);
  int rc = slots && sums && stage && spoil && layers && msgbuf ? KVBM_OK
                                                              : kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  while (!rc && done < n) {
    uint32_t got = 0;
    rc = take_grants(p, (uint32_t)(n - done), slots + done, &got, err);
    for (size_t i = done; !rc && i < done + got; i++) {
      const src_block *b = &blocks[i];
      rc = source_layers(m, b, stage + i * bb, layers, err);
      if (!rc) block_sum(p, b, layers, sums[i]);
      if (!rc) {
        pthread_mutex_lock(&p->fmu);
        rc = kvbm_fabric_write_block_layers(p->f, p->rs, slots[i], layers, nl, ls, err);
        if (!rc && corrupt_this(p->set)) { /* the seam: one byte changed after the frame */
          spoil[i] = ((const uint8_t *)layers[0])[0] ^ 0x5A;
          kvbm_slice sl;
          rc = kvbm_layout_block_layer(&kvbm_fabric_remote_desc(p->rs)->layout, slots[i], 0, &sl, err);
          if (!rc) rc = kvbm_fabric_write(p->f, p->rs, sl.region, sl.offset, &spoil[i], 1, err);
        }
        pthread_mutex_unlock(&p->fmu);
      }
    }
    if (!rc) rc = flush_loop(p, p->cfg.timeout_ms, err);
    for (size_t i = done; !rc && i < done + got; i++) {
      kvbm_block_msg msg = msg_of(p, &blocks[i], B);
      msg.placed = 1;
      msg.block_id = slots[i];
      memcpy(msg.frame.checksum, sums[i], 16); /* kept or hashed above, from the source */
      size_t len = 0;
      rc = kvbm_block_msg_encode(&msg, msgbuf, cap, &len, err);
      if (!rc) {
        await_ack(p, blocks[i].seq_hash);
        rc = send_copy(p, msgbuf, len, err);
        if (rc) await_cancel(p, blocks[i].seq_hash);
      }
      if (!rc) {
        pthread_mutex_lock(&p->mu);
        p->st.sent_blocks++;
        p->st.sent_bytes += bb;
        pthread_mutex_unlock(&p->mu);
      }
    }
    done += got;
  }
  free(slots);
  free(sums);
  free(stage);
  free(spoil);
  free(layers);
  free(msgbuf);
  return rc;
}

static int send_blocks(kvbm__peer *p, const src_block *blocks, size_t n, bool force_push, kvbm_error *err) {
  if (n == 0) return KVBM_OK;
  pthread_mutex_lock(&p->mu);
  bool closed = p->closed;
  pthread_mutex_unlock(&p->mu);
  if (closed) return kvbm_error_set(err, KVBM_ECLOSED, "peer %u: the link is closed", p->index);
  if (force_push || p->cfg.mode == KVBM_DISAGG_PUSH) return push_blocks(p, blocks, n, err);
  return put_blocks(p, blocks, n, err);
}

int kvbm_manager_offload_block(kvbm_manager *m, uint32_t peer, uint64_t seq_hash, kvbm_frame_phase phase,
                               kvbm_error *err) {
  if (!m) return kvbm_error_set(err, KVBM_EINVAL, "manager: offload: NULL manager");
  if ((unsigned)phase >= KVBM_FRAME_PHASE_COUNT)
    return kvbm_error_set(err, KVBM_EPHASE, "manager: offload: unknown phase %d", (int)phase);
  if (peer_count(m) == 0)
    return kvbm_error_set(err, KVBM_EDISAGG, "manager: disaggregation unavailable: no fabric attached");
  kvbm__peer *p = peer_get(m, peer);
  if (!p || p->detached) return kvbm_error_set(err, KVBM_ENOTFOUND, "manager: no peer %u", peer);
  src_block b;
  uint32_t *tok = malloc(p->set->B * sizeof *tok);
  if (!tok) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (kvbm_manager_block_pin(m, seq_hash, tok, &b) != KVBM_OK) {
    free(tok);
    return kvbm_error_set(err, KVBM_ENOTFOUND, "manager: offload: block %016llx is not held in G1 or G2",
                          (unsigned long long)seq_hash);
  }
  b.phase = phase;
  int rc = send_blocks(p, &b, 1, false, err);
  kvbm_manager_block_unpin(m, &b, 1);
  free(tok);
  return rc;
}

/* ---- ExitThink (the manager's exit_think hook) ---- */

/* The request's ready ThinkComplete blocks, chosen and pinned by the
 * manager (tier/peer_hooks.c), to peer 0 in one batch; the manager
 * unpins them after. Errors are counted, not returned. */
static void hook_exit_think(void *user, const kvbm_block_ref *blocks, size_t n) {
  kvbm__peers *s = user;
  pthread_mutex_lock(&s->mu);
  kvbm__peer *p = s->n ? s->peers[0] : NULL;
  pthread_mutex_unlock(&s->mu);
  if (!p || p->detached || n == 0) return;
  kvbm_error e = {0};
  int rc = send_blocks(p, blocks, n, false, &e);
  pthread_mutex_lock(&p->mu);
  p->st.exit_think_batches++;
  if (rc == KVBM_OK) {
    p->st.exit_think_blocks += n;
  } else {
    snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "ExitThink offload: %.40s: %.180s", kvbm_status_name(rc),
             e.msg);
  }
  pthread_mutex_unlock(&p->mu);
}

/* ---- the link thread ---- */

/* The link ended: nothing the peer said is believed any longer (it may
 * have died with its cache), and nothing is queued for it. */
static void link_close(kvbm__peer *p, const char *why) {
  pthread_mutex_lock(&p->mu);
  if (!p->closed && why) snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "link closed: %.200s", why);
  p->closed = true;
  p->st.forgotten_closed += kvbm__hindex_size(&p->remote);
  kvbm__hindex_clear(&p->remote);
  kvbm__hindex_clear(&p->given);
  p->ngone = 0;
  p->gone_all = false;
  for (uint32_t i = 0; i < p->cfg.landing_blocks; i++)
    if (p->slot[i] == SLOT_LENT) p->slot[i] = SLOT_FREE;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void serve_grant_request(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (len != 8) return;
  uint32_t want = kvbm__get_le32(buf + 4), n = 0;
  uint32_t cap = p->cfg.landing_blocks;
  uint8_t *rep = malloc(8 + 4 * (size_t)cap);
  if (!rep) return;
  pthread_mutex_lock(&p->mu);
  for (uint32_t s = 0; s < cap && n < want; s++)
    if (p->slot[s] == SLOT_FREE) {
      p->slot[s] = SLOT_GRANTED;
      kvbm__put_le32(rep + 8 + 4 * n++, s);
    }
  p->st.grants_given += n;
  pthread_mutex_unlock(&p->mu);
  memcpy(rep, "KVGR", 4);
  kvbm__put_le32(rep + 4, n);
  (void)send_copy(p, rep, 8 + 4 * (size_t)n, NULL);
  free(rep);
}

static void take_grant_reply(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (len < 8) return;
  uint32_t n = kvbm__get_le32(buf + 4);
  const kvbm_layout *pl = &kvbm_fabric_remote_desc(p->rs)->layout;
  if ((len - 8) / 4 < n) return;
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t s = kvbm__get_le32(buf + 8 + 4 * (size_t)i);
    if (s < pl->config.num_blocks && p->ngrants < pl->config.num_blocks) p->grants[p->ngrants++] = s;
  }
  p->st.grants_received += n;
  p->grant_replies++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* Sends the queued removes (link thread): one KVRM of up to GONE_MAX
 * hashes, or one "forget them all" (given emptied with it: the peer will
 * believe nothing we told it before). */
static void send_removes(kvbm__peer *p) {
  uint8_t buf[16 + 8 * GONE_MAX];
  pthread_mutex_lock(&p->mu);
  uint32_t n = p->gone_all ? 0 : p->ngone, flags = p->gone_all ? 1u : 0u;
  bool any = p->gone_all || p->ngone;
  for (uint32_t i = 0; i < n; i++) kvbm__put_le64(buf + 16 + 8 * (size_t)i, p->gone[i]);
  if (p->gone_all) {
    kvbm__hindex_clear(&p->given);
    p->st.removes_all_sent++;
  }
  p->st.removes_sent += n;
  p->ngone = 0;
  p->gone_all = false;
  pthread_mutex_unlock(&p->mu);
  if (!any) return;
  memcpy(buf, "KVRM", 4);
  kvbm__put_le32(buf + 4, flags);
  kvbm__put_le32(buf + 8, n);
  kvbm__put_le32(buf + 12, 0);
  (void)send_copy(p, buf, 16 + 8 * (size_t)n, NULL); /* lost: the lease ends the word */
}

/* The peer no longer holds these (any version may say so: believing a
 * remove errs towards "local"). */
static void take_removes(kvbm__peer *p, const uint8_t *buf, size_t len) {
  uint32_t flags = kvbm__get_le32(buf + 4), n = kvbm__get_le32(buf + 8);
  bool ok = len >= 16 && kvbm__get_le32(buf + 12) == 0 && (flags & ~1u) == 0 && (len - 16) / 8 == n &&
            (len - 16) % 8 == 0;
  pthread_mutex_lock(&p->mu);
  if (!ok) {
    p->st.refused_other++;
    snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "a malformed remove message of %zu bytes", len);
  } else if (flags & 1u) {
    p->st.forgotten_removed += kvbm__hindex_size(&p->remote);
    kvbm__hindex_clear(&p->remote);
  } else {
    for (uint32_t i = 0; i < n; i++) remote_forget(p, kvbm__get_le64(buf + 16 + 8 * (size_t)i));
  }
  pthread_mutex_unlock(&p->mu);
}

/* An acknowledgement counts only for a block sent to this peer and still
 * awaited (one per send): anything else (a hash never sent, one already
 * answered, one forgotten beyond the bound, see await_ack) is counted in
 * acks_unexpected and changes nothing else. Believing it would let the
 * peer make block_location say "remote" for a block it never received,
 * and an output-phase prefill then drop the only copy to make room, or
 * end a peer_flush before the blocks it waits for were answered. */
static void take_ack(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (len != 16) return;
  int status = (int)kvbm__get_le32(buf + 4);
  uint64_t h = kvbm__get_le64(buf + 8);
  pthread_mutex_lock(&p->mu);
  /* A block staged for it is free again, whether or not the answer is
   * believed: reused early, the peer reads other bytes than the sum it
   * was framed with and refuses them (never a wrong block). */
  unlend(p, h);
  if (!kvbm__hindex_take(&p->pending, h)) {
    p->st.acks_unexpected++;
    pthread_mutex_unlock(&p->mu);
    return;
  }
  p->awaiting--;
  if (status == KVBM_OK) {
    p->st.acked_blocks++;
    remote_add(p, h);
  } else {
    p->st.peer_refused++;
  }
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* A pulled block (version 3 peers, the OutputCritical pull): b's layers
 * copied into a landing block of ours (a block of our exported zone, lent
 * until the peer answers), framed with its kept sum (nothing hashed when
 * kept), and announced as "KVPB" + a placed block message naming our
 * zone and that block. The peer reads it one-sided and hashes it as it
 * lands (read_pulled): one copy here (the block out of the tier, where a
 * push gathers it into the message), and the receiver's copy is its hash
 * pass. KVBM_ENOSPC (no landing block free) or KVBM_EUNSUPPORTED (the
 * tier's layers do not fit the zone's): the caller pushes instead. */
static int send_pulled(kvbm__peer *p, const src_block *b, kvbm_error *err) {
  kvbm_manager *m = p->m;
  const kvbm_layout *L = kvbm_manager_layout(m, b->tier);
  const uint64_t nl = L->config.num_layers;
  if (nl != p->land_layout.config.num_layers || L->layer_stride * nl != p->set->block_bytes)
    return KVBM_EUNSUPPORTED;
  uint32_t slot = 0;
  int rc = lend_slot(p, b->seq_hash, &slot);
  if (rc) return rc;
  const void **layers = malloc(nl * sizeof *layers);
  size_t cap = 4 + kvbm_block_msg_placed_size(p->set->B), len = 0;
  uint8_t *buf = malloc(cap);
  if (!layers || !buf) rc = kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  for (uint64_t l = 0; !rc && l < nl; l++) {
    void *ptr;
    size_t size;
    rc = kvbm_storage_block_layer_ptr(p->land, &p->land_layout, slot, l, &ptr, &size, err);
    if (!rc && size != L->layer_stride) rc = KVBM_EUNSUPPORTED;
    if (!rc) rc = kvbm_manager_block_read(m, b->tier, b->id, (uint32_t)l, ptr, L->layer_stride, err);
    if (!rc) layers[l] = ptr;
  }
  kvbm_block_msg msg = msg_of(p, b, p->set->B);
  if (!rc) block_sum(p, b, layers, msg.frame.checksum);
  /* the seam: the exporter's bytes changed after the sum was kept */
  if (!rc && corrupt_this(p->set)) ((uint8_t *)(uintptr_t)layers[0])[0] ^= 0x5A;
  msg.placed = 1;
  msg.block_id = slot;
  msg.layout_id = p->land_id; /* our zone, where the bytes wait */
  msg.tier = p->cfg.ingest_tier;
  memcpy(buf, "KVPB", 4);
  if (!rc) rc = kvbm_block_msg_encode(&msg, buf + 4, cap - 4, &len, err);
  if (!rc) {
    await_ack(p, b->seq_hash);
    rc = send_copy(p, buf, 4 + len, err);
    if (rc) await_cancel(p, b->seq_hash);
  }
  pthread_mutex_lock(&p->mu);
  if (rc) {
    p->slot[slot] = SLOT_FREE;
  } else {
    p->st.sent_blocks++;
    p->st.sent_bytes += p->set->block_bytes;
  }
  pthread_mutex_unlock(&p->mu);
  free(layers);
  free(buf);
  return rc;
}

/* A pull: the blocks asked for, staged for the peer to read (KVPR, from
 * a version 3 peer that maps our zone) or pushed back (KVPL), or "not
 * held". */
static void serve_pull(kvbm__peer *p, const uint8_t *buf, size_t len, bool read) {
  if (len < 8) return;
  uint32_t n = kvbm__get_le32(buf + 4);
  if ((len - 8) / 8 < n) return;
  kvbm_manager *m = p->m;
  uint32_t *tok = malloc(p->set->B * sizeof *tok);
  if (!tok) return;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t h = kvbm__get_le64(buf + 8 + 8 * (size_t)i);
    src_block b;
    if (kvbm_manager_block_pin(m, h, tok, &b) != KVBM_OK) {
      uint8_t miss[12];
      memcpy(miss, "KVPM", 4);
      kvbm__put_le64(miss + 4, h);
      (void)send_copy(p, miss, sizeof miss, NULL);
      continue;
    }
    b.phase = KVBM_PHASE_OUTPUT_CRITICAL; /* pulled back for output */
    bool pulled = read && !atomic_load_explicit(&p->set->push_pulls, memory_order_relaxed);
    int rc = pulled ? send_pulled(p, &b, NULL) : KVBM_EUNSUPPORTED;
    if (rc == KVBM_ENOSPC || rc == KVBM_EUNSUPPORTED) (void)send_blocks(p, &b, 1, true, NULL);
    kvbm_manager_block_unpin(m, &b, 1);
  }
  free(tok);
}

static void handle_msg(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (len >= 4 && memcmp(buf, KVBM_BLOCK_MSG_MAGIC, 4) == 0) {
    kvbm_error e = {0};
    int rc = peer_ingest(p, buf, len, false, &e);
    uint64_t h = len >= 16 ? kvbm__get_le64(buf + 8) : 0;
    (void)send_ack(p, rc, h);
    send_removes(p); /* an eviction racing the ingest: after its ack */
  } else if (len >= 8 && memcmp(buf, "KVPB", 4) == 0 && memcmp(buf + 4, KVBM_BLOCK_MSG_MAGIC, 4) == 0) {
    kvbm_error e = {0};
    int rc = peer_ingest(p, buf + 4, len - 4, true, &e);
    uint64_t h = len >= 20 ? kvbm__get_le64(buf + 12) : 0;
    (void)send_ack(p, rc, h); /* also frees the peer's staging block */
    send_removes(p);
  } else if (len >= 4 && memcmp(buf, "KVRQ", 4) == 0) {
    serve_grant_request(p, buf, len);
  } else if (len >= 4 && memcmp(buf, "KVGR", 4) == 0) {
    take_grant_reply(p, buf, len);
  } else if (len >= 4 && memcmp(buf, "KVAC", 4) == 0) {
    take_ack(p, buf, len);
  } else if (len >= 4 && memcmp(buf, "KVPL", 4) == 0) {
    serve_pull(p, buf, len, false);
  } else if (len >= 4 && memcmp(buf, "KVPR", 4) == 0 && p->peer_version >= 3) {
    serve_pull(p, buf, len, true);
  } else if (len >= 16 && memcmp(buf, "KVRM", 4) == 0) {
    take_removes(p, buf, len);
  } else if (len == 12 && memcmp(buf, "KVPM", 4) == 0) {
    pthread_mutex_lock(&p->mu);
    remote_forget(p, kvbm__get_le64(buf + 4)); /* "not held": its word is void */
    p->handled++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  } else {
    pthread_mutex_lock(&p->mu);
    p->st.refused_other++;
    snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "an unknown message of %zu bytes", len);
    pthread_mutex_unlock(&p->mu);
  }
}

/* A message a keyed link refuses before reading it (no MAC, a wrong one,
 * or a sequence number already seen): counted, its reason kept, dropped.
 * The link stays up: closing it would forget every word of the genuine
 * peer and fail its flushes, a denial of service any injector could buy
 * with one message; what a forger cannot do is make it count. A genuine
 * message lost this way (changed on the way) is a lost message, which
 * the protocol already survives: a lost remove ends with the lease, a
 * lost acknowledgement leaves the block local (a flush times out). */
static void refuse_control(kvbm__peer *p, bool replay, const char *why) {
  pthread_mutex_lock(&p->mu);
  p->st.refused_control++;
  if (replay) p->st.refused_replayed++;
  snprintf(p->st.last_refusal, sizeof p->st.last_refusal, "KVBM_EAUTH: %.200s", why);
  pthread_mutex_unlock(&p->mu);
}

/* One message from the peer. On a keyed link its trailer is checked
 * first (peer/ctl.h), and nothing of a message that fails reaches
 * handle_msg: no acknowledgement, remove, grant or pull of it is seen.
 * Sequence numbers must grow (gaps are allowed: a message the sender
 * failed to push, or one refused here, used its number). */
static void handle(kvbm__peer *p, const uint8_t *buf, size_t len) {
  if (!p->keyed) {
    handle_msg(p, buf, len);
    return;
  }
  size_t n = 0;
  uint64_t seq = 0;
  kvbm_error e = {0};
  if (kvbm__ctl_open(p->rx_key, buf, len, &n, &seq, &e) != KVBM_OK) {
    refuse_control(p, false, e.msg);
    return;
  }
  if (seq < p->rx_next) {
    char why[128];
    snprintf(why, sizeof why, "a replayed message: sequence number %llu, already past %llu",
             (unsigned long long)seq, (unsigned long long)p->rx_next);
    refuse_control(p, true, why);
    return;
  }
  p->rx_next = seq + 1;
  handle_msg(p, buf, n);
}

static void *link_main(void *arg) {
  kvbm__peer *p = arg;
  unsigned idle = 0;
  while (!atomic_load(&p->stop)) {
    kvbm_fabric_handle h;
    size_t len = 0;
    kvbm_error e = {0};
    pthread_mutex_lock(&p->fmu);
    int rc = kvbm_fabric_next(p->f, POLL_MS, &h, &len, &e);
    bool too_long = rc == KVBM_OK && len > p->msg_max;
    if (rc == KVBM_OK && !too_long) rc = kvbm_fabric_pull(p->f, h, p->rbuf, p->msg_max, &len, p->cfg.timeout_ms, &e);
    /* Now and then, while idle: a flush without waiting frees the outbox. */
    if (rc == KVBM_ETIMEDOUT && p->outbox && ++idle % 8 == 0 && kvbm_fabric_flush(p->f, 0, NULL) == KVBM_OK)
      outbox_free(p);
    pthread_mutex_unlock(&p->fmu);
    if (too_long) {
      char why[96];
      snprintf(why, sizeof why, "a message of %zu bytes, above %zu", len, p->msg_max);
      pthread_mutex_lock(&p->mu);
      p->st.refused_other++;
      pthread_mutex_unlock(&p->mu);
      link_close(p, why);
      break;
    }
    /* Removes first: those queued before a message arrived precede its
     * answer on the wire (a peer's flush then sees them). */
    send_removes(p);
    if (rc == KVBM_ETIMEDOUT) continue;
    if (rc) {
      link_close(p, e.msg);
      break;
    }
    handle(p, p->rbuf, len);
  }
  return NULL;
}

/* ---- attach / detach ---- */

kvbm_peer_config kvbm_peer_config_default(void) {
  kvbm_peer_config c = {.mode = KVBM_DISAGG_PUSH, .landing_blocks = 16, .ingest_tier = KVBM_TIER_G1,
                        .timeout_ms = 10000, .remote_index_blocks = 65536, .lease_ms = LEASE_DEFAULT_MS};
  return c;
}

int kvbm_peer_config_env(kvbm_peer_config *cfg, const char *const *env, kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "peer: config_env: NULL config");
  static const char name[] = "KVBM_PEER_KEY_FILE=";
  for (size_t i = 0; env && env[i]; i++) {
    if (strncmp(env[i], name, sizeof name - 1) != 0) continue;
    const char *v = env[i] + sizeof name - 1;
    if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "peer: KVBM_PEER_KEY_FILE is empty");
    cfg->key_file = v;
  }
  return KVBM_OK;
}

/* The link's frame MAC key from the config's secret (bytes or file),
 * every copy of the secret zeroed: *keyed false without one. */
static int key_init(const kvbm_peer_config *c, bool *keyed, uint8_t key[32], uint8_t ctl[KVBM__CTL_KEY],
                    kvbm_error *err) {
  *keyed = false;
  if (c->key && c->key_file)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: both key and key_file are set; give the key once");
  if (!c->key && !c->key_file) return KVBM_OK;
  uint8_t *buf = NULL;
  size_t len = c->key_len;
  int rc = KVBM_OK;
  if (c->key_file) {
    buf = malloc(KVBM_FABRIC_SECRET_MAX);
    if (!buf) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    rc = kvbm__secret_file_read(c->key_file, buf, KVBM_FABRIC_SECRET_MAX, &len, err);
  }
  const uint8_t *secret = buf ? buf : c->key;
  if (!rc && (len < KVBM_FABRIC_SECRET_MIN || len > KVBM_FABRIC_SECRET_MAX))
    rc = kvbm_error_set(err, KVBM_EINVAL, "manager: attach: the peers' key must be %u..%u bytes, not %zu",
                        KVBM_FABRIC_SECRET_MIN, KVBM_FABRIC_SECRET_MAX, len);
  if (!rc) rc = kvbm_fabric_frame_key(secret, len, key, err);
  if (!rc) rc = kvbm__ctl_key(secret, len, ctl, err); /* its own context: never the frame key */
  if (buf) {
    explicit_bzero(buf, KVBM_FABRIC_SECRET_MAX);
    free(buf);
  }
  if (!rc) *keyed = true;
  return rc;
}

static void peer_release_fabric(kvbm__peer *p) {
  if (p->f) {
    (void)flush_loop(p, p->cfg.timeout_ms > 1000 ? 1000 : p->cfg.timeout_ms, NULL);
    outbox_free(p); /* what the peer never pulled: the fabric is going */
  }
  kvbm_fabric_remote_set_release(p->rs);
  kvbm_fabric_local_set_release(p->land_ls);
  kvbm_storage_release(p->land);
  p->rs = NULL;
  p->land_ls = NULL;
  p->land = NULL;
  p->f = NULL;
}

static void peer_free(kvbm__peer *p) {
  if (!p) return;
  pthread_mutex_destroy(&p->fmu);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->slot);
  free(p->lent);
  free(p->pull_stage);
  kvbm_blake3_pool_destroy(p->pool);
  free(p->grants);
  kvbm__hindex_free(&p->remote);
  kvbm__hindex_free(&p->pending);
  kvbm__hindex_free(&p->given);
  free(p->gone);
  free(p->rbuf);
  explicit_bzero(p->mac_key, sizeof p->mac_key);
  explicit_bzero(p->ctl_key, sizeof p->ctl_key);
  explicit_bzero(p->tx_key, sizeof p->tx_key);
  explicit_bzero(p->rx_key, sizeof p->rx_key);
  free(p);
}

/* Our hello: the landing zone's export and how we send; keyed, flags
 * bit 0 and a fresh nonce after the export (an unkeyed hello is the
 * same bytes as before keyed control messages). */
static int send_hello(kvbm__peer *p, kvbm_error *err) {
  uint8_t *wire = NULL;
  size_t wlen = 0;
  int rc = p->keyed ? kvbm__hello_nonce(p->nonce, err) : KVBM_OK;
  if (!rc) rc = kvbm_fabric_export(p->land_ls, &wire, &wlen, err);
  if (rc) return rc;
  const size_t extra = p->keyed ? KVBM__CTL_NONCE : 0;
  uint8_t *h = malloc(HELLO_FIXED + wlen + extra);
  if (!h) {
    free(wire);
    return kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  }
  memcpy(h, "KVPH", 4);
  kvbm__put_le32(h + 4, PROTO_VERSION);
  kvbm__put_le32(h + 8, (uint32_t)p->cfg.mode);
  kvbm__put_le32(h + 12, (uint32_t)p->cfg.ingest_tier);
  kvbm__put_le32(h + 16, p->keyed ? HELLO_KEYED : 0);
  kvbm__put_le32(h + 20, kvbm_manager_groups_digest(p->m, NULL, 0)); /* 0: one group, as before */
  kvbm__put_le64(h + 24, wlen);
  memcpy(h + HELLO_FIXED, wire, wlen);
  if (p->keyed) memcpy(h + HELLO_FIXED + wlen, p->nonce, KVBM__CTL_NONCE);
  kvbm_blake3_hash(h, HELLO_FIXED + wlen + extra, p->hello_sent, sizeof p->hello_sent);
  rc = send_copy(p, h, HELLO_FIXED + wlen + extra, err);
  free(h);
  free(wire);
  return rc;
}

/* Whether the peer's hello says it holds a key as we do: both or neither
 * (KVBM_EAUTH, named, otherwise; nothing of the peer is imported). */
static int hello_keys_match(const kvbm__peer *p, bool theirs, kvbm_error *err) {
  if (p->keyed == theirs) return KVBM_OK;
  if (p->keyed)
    return kvbm_error_set(err, KVBM_EAUTH, "peer: attach refused: this side holds a cluster key (key, key_file "
                          "or KVBM_PEER_KEY_FILE) and the peer none: its messages could not be authenticated");
  return kvbm_error_set(err, KVBM_EAUTH, "peer: attach refused: the peer holds a cluster key and this side "
                        "none (give both the same key, or neither)");
}

/* Whether the peer's hello names this manager's KV cache groups (the word
 * after the flags: kvbm_manager_groups_digest, 0 for one group). A block
 * travels under its group's key, which files it nowhere useful in a
 * manager of another group list: KVBM_EPROTO, named; nothing imported. */
static int hello_groups_match(const kvbm__peer *p, uint32_t theirs, kvbm_error *err) {
  char list[160];
  uint32_t ours = kvbm_manager_groups_digest(p->m, list, sizeof list);
  if (ours == theirs) return KVBM_OK;
  return kvbm_error_set(err, KVBM_EPROTO,
                        "peer: attach refused: the KV cache groups differ (this side %s, digest %08x; the peer's "
                        "digest %08x%s): equal group lists and layouts on both sides, or one group on both",
                        list, ours, theirs, theirs ? "" : ", one group");
}

/* The peer's hello: its landing zone imported, its blocks' shape checked;
 * keyed, its nonce taken and the two directions' keys made. */
static int take_hello(kvbm__peer *p, kvbm_error *err) {
  kvbm_fabric_handle h;
  size_t len = 0;
  pthread_mutex_lock(&p->fmu);
  int rc = kvbm_fabric_next(p->f, p->cfg.timeout_ms, &h, &len, err);
  uint8_t *buf = NULL;
  if (!rc && (len < HELLO_FIXED || len > HELLO_MAX))
    rc = kvbm_error_set(err, KVBM_EPROTO, "peer: a first message of %zu bytes is not a hello", len);
  if (!rc && !(buf = malloc(len))) rc = kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  if (!rc) rc = kvbm_fabric_pull(p->f, h, buf, len, &len, p->cfg.timeout_ms, err);
  uint32_t version = !rc ? kvbm__get_le32(buf + 4) : 0;
  uint32_t flags = !rc ? kvbm__get_le32(buf + 16) : 0;
  const size_t extra = flags & HELLO_KEYED ? KVBM__CTL_NONCE : 0;
  if (!rc && (memcmp(buf, "KVPH", 4) != 0 || version < PROTO_MIN || version > PROTO_VERSION ||
              (flags & ~HELLO_KEYED) != 0 || (extra && version < 2) ||
              len - HELLO_FIXED < extra || kvbm__get_le64(buf + 24) != len - HELLO_FIXED - extra ||
              kvbm__get_le32(buf + 8) > KVBM_DISAGG_PUT || kvbm__get_le32(buf + 12) > KVBM_TIER_G2))
    rc = kvbm_error_set(err, KVBM_EPROTO, "peer: a malformed hello (not a kvbm manager of protocol version %u..%u)",
                        PROTO_MIN, PROTO_VERSION);
  if (!rc) rc = hello_keys_match(p, extra != 0, err);
  if (!rc) rc = hello_groups_match(p, kvbm__get_le32(buf + 20), err);
  const size_t wlen = !rc ? len - HELLO_FIXED - extra : 0;
  if (!rc && extra && memcmp(buf + HELLO_FIXED + wlen, p->nonce, KVBM__CTL_NONCE) == 0)
    rc = kvbm_error_set(err, KVBM_EAUTH, "peer: the peer's hello carries this side's own nonce (a reflected hello)");
  /* The shape first: a peer whose blocks cannot be bridged is refused
   * before its memory is imported. */
  kvbm_layout theirs;
  if (!rc) rc = kvbm_fabric_export_layout(buf + HELLO_FIXED, wlen, &theirs, err);
  if (!rc) rc = kvbm_fabric_layout_bridge(kvbm_manager_layout(p->m, KVBM_TIER_G1), &theirs, err);
  if (!rc) rc = kvbm_fabric_import(p->f, buf + HELLO_FIXED, wlen, &p->rs, err);
  pthread_mutex_unlock(&p->fmu);
  if (!rc) {
    const kvbm_layout_desc *d = kvbm_fabric_remote_desc(p->rs);
    p->peer_land_id = d->block_set_id;
    p->peer_land_tier = (kvbm_tier)kvbm__get_le32(buf + 12);
    p->peer_version = version; /* before the link thread starts */
    p->grants = malloc(d->layout.config.num_blocks * sizeof *p->grants);
    if (!rc && !p->grants) rc = kvbm_error_set(err, KVBM_ENOMEM, "peer: out of memory");
  }
  if (!rc && extra) {
    const uint8_t *theirs_nonce = buf + HELLO_FIXED + wlen;
    kvbm__ctl_dir_key(p->ctl_key, p->nonce, theirs_nonce, p->tx_key);
    kvbm__ctl_dir_key(p->ctl_key, theirs_nonce, p->nonce, p->rx_key);
    kvbm_blake3_hash(buf, len, p->hello_got, sizeof p->hello_got);
  }
  free(buf);
  return rc;
}

/* Keyed: the first sealed message each way, "KVAU" u32 0, the BLAKE3 of
 * the hello this side sent, then of the one it received. It proves the
 * key (a peer with another key fails its MAC) and binds both hellos,
 * landing zone exports included, to the link: a hello changed on the way
 * shows as a confirmation that names other hellos. */
static int send_confirm(kvbm__peer *p, kvbm_error *err) {
  uint8_t c[8 + 64];
  memcpy(c, "KVAU", 4);
  kvbm__put_le32(c + 4, 0);
  memcpy(c + 8, p->hello_sent, 32);
  memcpy(c + 40, p->hello_got, 32);
  p->sealed = true; /* before the link thread starts: no other sender yet */
  return send_copy(p, c, sizeof c, err);
}

static int take_confirm(kvbm__peer *p, kvbm_error *err) {
  kvbm_fabric_handle h;
  size_t len = 0, n = 0;
  uint64_t seq = 0;
  uint8_t buf[8 + 64 + KVBM__CTL_TRAILER];
  pthread_mutex_lock(&p->fmu);
  int rc = kvbm_fabric_next(p->f, p->cfg.timeout_ms, &h, &len, err);
  if (!rc && len != sizeof buf)
    rc = kvbm_error_set(err, KVBM_EPROTO, "peer: a message of %zu bytes after the hello is not a confirmation", len);
  if (!rc) rc = kvbm_fabric_pull(p->f, h, buf, sizeof buf, &len, p->cfg.timeout_ms, err);
  pthread_mutex_unlock(&p->fmu);
  kvbm_error e = {0};
  if (!rc && kvbm__ctl_open(p->rx_key, buf, len, &n, &seq, &e) != KVBM_OK)
    rc = kvbm_error_set(err, KVBM_EAUTH, "peer: attach refused: the peer's confirmation fails the link's MAC: "
                        "it holds another cluster key");
  if (!rc && (memcmp(buf, "KVAU", 4) != 0 || kvbm__get_le32(buf + 4) != 0 || seq != 0))
    rc = kvbm_error_set(err, KVBM_EPROTO, "peer: a malformed confirmation");
  if (!rc && (memcmp(buf + 8, p->hello_got, 32) != 0 || memcmp(buf + 40, p->hello_sent, 32) != 0))
    rc = kvbm_error_set(err, KVBM_EAUTH, "peer: attach refused: the peer saw other hellos than this side "
                        "(changed on the way)");
  if (!rc) p->rx_next = 1;
  return rc;
}

/* ---- the peer set: made at the first attach, its hooks registered ---- */

static bool hook_remote(void *user, uint64_t h, bool for_room, uint32_t *peer);
static size_t hook_pull(void *user, uint32_t peer, const uint64_t *hashes, size_t n, int timeout_ms);
static void hook_destroy(void *user);
static void metrics_collect(void *user, kvbm_metrics_writer *w);

static void set_free(kvbm__peers *s) {
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* The manager's peer set, made and registered if it has none (two first
 * attaches racing: the loser frees its own and takes the winner's). */
static kvbm__peers *set_make(kvbm_manager *m, kvbm_error *err) {
  kvbm__peers *s = set_of(m);
  if (s) return s;
  s = calloc(1, sizeof *s);
  if (!s) {
    kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    return NULL;
  }
  s->m = m;
  pthread_mutex_init(&s->mu, NULL);
  s->B = kvbm_manager_block_tokens(m);
  s->block_bytes = kvbm_manager_block_bytes(m);
  s->scheme = kvbm_manager_hash_scheme(m);
  kvbm_manager_peer_hooks h = {.user = s, .remote = hook_remote, .pull = hook_pull, .exit_think = hook_exit_think,
                               .gone = hook_gone, .destroy = hook_destroy};
  int rc = kvbm_manager_peer_hooks_set(m, &h, NULL);
  if (rc == KVBM_EEXIST) {
    set_free(s);
    return set_of(m);
  }
  if (rc) {
    set_free(s);
    kvbm_error_set(err, rc, "manager: the peers' hooks could not be set");
    return NULL;
  }
  /* Refusals on the manager's metrics page, when it serves one. */
  s->reg = kvbm_manager_metrics(m);
  if (s->reg && kvbm_metrics_register(s->reg, metrics_collect, s, NULL, 0, &s->reg_id, NULL) != KVBM_OK)
    s->reg = NULL;
  return s;
}

int kvbm_manager_attach(kvbm_manager *m, kvbm_fabric *f, const kvbm_peer_config *cfg, uint32_t *peer,
                        kvbm_error *err) {
  if (!m || !f || !peer) return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: NULL argument");
  kvbm_peer_config c = cfg ? *cfg : kvbm_peer_config_default();
  if (c.mode != KVBM_DISAGG_PUSH && c.mode != KVBM_DISAGG_PUT)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: mode %d is neither PUSH nor PUT", (int)c.mode);
  if (c.landing_blocks == 0 || c.landing_blocks > (1u << 20))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: landing_blocks %u (1 .. 2^20)", c.landing_blocks);
  if (c.remote_index_blocks == 0 || c.remote_index_blocks > (1u << 26))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: remote_index_blocks %u (1 .. 2^26)",
                          c.remote_index_blocks);
  if (c.timeout_ms <= 0) return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: timeout_ms must be > 0");
  if (c.lease_ms == 0) c.lease_ms = LEASE_DEFAULT_MS;
  if (c.lease_ms < 0) return kvbm_error_set(err, KVBM_EINVAL, "manager: attach: lease_ms %d must be > 0", (int)c.lease_ms);
  const kvbm_layout *ingest = (c.ingest_tier == KVBM_TIER_G1 || c.ingest_tier == KVBM_TIER_G2)
                                  ? kvbm_manager_layout(m, c.ingest_tier) : NULL;
  if (!ingest || kvbm_manager_tier_error(m, c.ingest_tier)[0])
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: attach: the ingest tier %s is absent (G1 or G2)",
                          kvbm_tier_name(c.ingest_tier));
  bool keyed;
  uint8_t key[32], ctl[KVBM__CTL_KEY];
  int rc = key_init(&c, &keyed, key, ctl, err);
  if (rc) return rc;
  kvbm__peers *s = set_make(m, err);
  /* The manager's kept sums become this link's kind (its MAC when keyed):
   * every peer of one manager shares one key or none. */
  rc = !s ? KVBM_ENOMEM : kvbm_manager_keep_sums(m, keyed ? key : NULL, err);
  if (rc) {
    explicit_bzero(key, sizeof key);
    explicit_bzero(ctl, sizeof ctl);
    return rc;
  }
  pthread_mutex_lock(&s->mu);
  uint32_t index = s->n;
  pthread_mutex_unlock(&s->mu);
  if (index >= KVBM_MANAGER_MAX_PEERS) {
    explicit_bzero(key, sizeof key);
    explicit_bzero(ctl, sizeof ctl);
    return kvbm_error_set(err, KVBM_ENOSPC, "manager: attach: %d peers already", KVBM_MANAGER_MAX_PEERS);
  }

  kvbm__peer *p = calloc(1, sizeof *p);
  if (!p) {
    explicit_bzero(key, sizeof key);
    explicit_bzero(ctl, sizeof ctl);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  p->m = m;
  p->set = s;
  p->f = f;
  p->cfg = c;
  p->cfg.key = NULL; /* read, not kept */
  p->cfg.key_len = 0;
  p->cfg.key_file = NULL;
  p->index = index;
  p->keyed = keyed;
  memcpy(p->mac_key, key, sizeof key);
  memcpy(p->ctl_key, ctl, sizeof ctl);
  explicit_bzero(key, sizeof key);
  explicit_bzero(ctl, sizeof ctl);
  p->st.keyed = keyed;
  pthread_mutex_init(&p->fmu, NULL);
  pthread_mutex_init(&p->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_cond_init(&p->cv, &ca);
  pthread_condattr_destroy(&ca);
  p->msg_max = kvbm_block_msg_size(s->B, s->block_bytes);
  if (p->msg_max < 8 + 8 * 4096) p->msg_max = 8 + 8 * 4096; /* pulls of up to 4096 hashes */
  if (keyed) p->msg_max += KVBM__CTL_TRAILER;
  p->slot = calloc(c.landing_blocks, 1);
  p->rbuf = malloc(p->msg_max);
  /* the indexes' slot functions: random, so that a client cannot choose
   * prompts whose hashes pile up in one probe run (hindex.h) */
  uint64_t seed[2] = {0, 0};
  if (getrandom(seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
    seed[0] = (uint64_t)now_ms() ^ (uint64_t)(uintptr_t)p;
    seed[1] = seed[0] * 0x9E3779B97F4A7C15ull;
  }
  p->gone = malloc(GONE_MAX * sizeof *p->gone);
  p->lent = calloc(c.landing_blocks, sizeof *p->lent);
  p->pull_stage = aligned_alloc(64, (s->block_bytes + 63) & ~(uint64_t)63);
  rc = p->slot && p->lent && p->pull_stage && p->rbuf && p->gone ? KVBM_OK : KVBM_ENOMEM;
  if (!rc && kvbm_blake3_pool_create(0, 0, &p->pool, NULL)) rc = KVBM_ENOMEM;
  if (!rc) rc = kvbm__hindex_init(&p->remote, c.remote_index_blocks, seed[0]);
  if (!rc) rc = kvbm__hindex_init(&p->pending, c.remote_index_blocks, seed[1]);
  if (!rc) rc = kvbm__hindex_init(&p->given, c.remote_index_blocks, seed[0] ^ seed[1]);
  if (rc) rc = kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  /* The landing zone: the ingest tier's layout, in memory the fabric
   * allocated (the fastest for the peer's writes), apart from the cache.
   * Its block set id is random: a message laid out for an older zone
   * (another attach) names another id. */
  kvbm_layout_config lc = ingest->config;
  lc.num_blocks = c.landing_blocks;
  if (lc.alignment > 4096) lc.alignment = 4096;
  kvbm_layout_desc desc = {0};
  if (!rc) rc = kvbm_layout_init(&p->land_layout, ingest->kind, &lc, err);
  if (!rc) rc = kvbm_fabric_storage_create(f, &p->land_layout, &p->land, err);
  if (!rc) {
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) kvbm__put_le64(rnd, (uint64_t)now_ms() * 0x9E3779B97F4A7C15ull);
    p->land_id = kvbm__get_le64(rnd) | 1; /* never 0 */
    rc = kvbm_storage_describe(p->land, &p->land_layout, p->land_id, &desc, err);
  }
  if (!rc) rc = kvbm_fabric_register(f, &desc, &p->land_ls, err);
  kvbm_layout_desc_release(&desc);
  if (!rc) rc = send_hello(p, err);
  if (!rc) rc = take_hello(p, err);
  const void *mapped = NULL;
  if (!rc) p->rs_mapped = kvbm__fabric_map_block(f, p->rs, 0, &mapped, NULL) == KVBM_OK;
  if (!rc && keyed) rc = send_confirm(p, err);
  if (!rc && keyed) rc = take_confirm(p, err);
  if (!rc) {
    p->st.attached = true;
    p->st.mode = c.mode;
    if (pthread_create(&p->th, NULL, link_main, p) != 0)
      rc = kvbm_error_set(err, KVBM_EIO, "manager: attach: the link thread would not start");
    else
      p->running = true;
  }
  if (rc) {
    peer_release_fabric(p);
    peer_free(p);
    return rc;
  }
  pthread_mutex_lock(&s->mu);
  s->peers[index] = p;
  s->n = index + 1;
  pthread_mutex_unlock(&s->mu);
  *peer = index;
  return KVBM_OK;
}

static void peer_stop(kvbm__peer *p) {
  if (p->detached) return;
  atomic_store(&p->stop, true);
  if (p->running) pthread_join(p->th, NULL);
  p->running = false;
  link_close(p, NULL);
  peer_release_fabric(p);
  p->detached = true;
  p->st.attached = false;
}

int kvbm_manager_detach(kvbm_manager *m, uint32_t peer, kvbm_error *err) {
  if (!m) return kvbm_error_set(err, KVBM_EINVAL, "manager: detach: NULL manager");
  kvbm__peer *p = peer_get(m, peer);
  if (!p || p->detached) return kvbm_error_set(err, KVBM_ENOTFOUND, "manager: no peer %u", peer);
  peer_stop(p);
  return KVBM_OK;
}

/* The destroy hook (kvbm_manager_destroy, before the tiers go). The
 * peers leave the array before they stop: a pool event of a worker still
 * finishing (the gone hook) or a lookup then finds none, never one being
 * freed. */
static void hook_destroy(void *user) {
  kvbm__peers *s = user;
  kvbm__peer *ps[KVBM_MANAGER_MAX_PEERS];
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->n;
  for (uint32_t i = 0; i < n; i++) {
    ps[i] = s->peers[i];
    s->peers[i] = NULL;
  }
  s->n = 0;
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < n; i++) {
    peer_stop(ps[i]);
    peer_free(ps[i]);
  }
  /* The registry goes before the peers at destroy (its collectors are
   * then forgotten); only one still there is left. */
  if (s->reg && kvbm_manager_metrics(s->m) == s->reg) (void)kvbm_metrics_unregister(s->reg, s->reg_id);
  set_free(s);
}

/* ---- location, flush, stats, pulls ---- */

/* The remote hook: whether a peer holds h by a word within its lease
 * (for_room: the manager drops its G1 copy on it, counted to that peer).
 * Under the manager's locks: no manager call. */
static bool hook_remote(void *user, uint64_t h, bool for_room, uint32_t *peer) {
  kvbm__peers *s = user;
  bool found = false;
  pthread_mutex_lock(&s->mu);
  for (uint32_t i = 0; !found && i < s->n; i++) {
    kvbm__peer *p = s->peers[i];
    pthread_mutex_lock(&p->mu);
    /* remote_has: a word within its lease, never older */
    if (!p->detached && !p->closed && remote_has(p, h)) {
      found = true;
      if (peer) *peer = i;
      if (for_room) p->st.dropped_for_room++;
    }
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return found;
}

int kvbm_manager_peer_flush(kvbm_manager *m, uint32_t peer, int timeout_ms, kvbm_error *err) {
  if (!m) return kvbm_error_set(err, KVBM_EINVAL, "manager: peer_flush: NULL manager");
  if (peer_count(m) == 0)
    return kvbm_error_set(err, KVBM_EDISAGG, "manager: disaggregation unavailable: no fabric attached");
  kvbm__peer *p = peer_get(m, peer);
  if (!p || p->detached) return kvbm_error_set(err, KVBM_ENOTFOUND, "manager: no peer %u", peer);
  int64_t end = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
  int rc = flush_loop(p, timeout_ms, err);
  if (rc) return rc;
  pthread_mutex_lock(&p->mu);
  while (p->awaiting > 0 && !p->closed) {
    int64_t left = end == INT64_MAX ? 1000 : end - now_ms();
    if (left <= 0) break;
    struct timespec dl = kvbm__deadline_after_ms(CLOCK_REALTIME, left > 1000 ? 1000 : left);
    pthread_cond_timedwait(&p->cv, &p->mu, &dl);
  }
  bool done = p->awaiting == 0, closed = p->closed;
  uint64_t missing = p->awaiting;
  pthread_mutex_unlock(&p->mu);
  if (done) return KVBM_OK;
  if (closed) return kvbm_error_set(err, KVBM_ECLOSED, "peer %u: the link closed with %llu blocks unanswered",
                                    peer, (unsigned long long)missing);
  return kvbm_error_set(err, KVBM_ETIMEDOUT, "peer %u: %llu blocks not acknowledged in time", peer,
                        (unsigned long long)missing);
}

int kvbm_manager_peer_stats_get(kvbm_manager *m, uint32_t peer, kvbm_peer_stats *out) {
  if (!m || !out) return KVBM_EINVAL;
  kvbm__peer *p = peer_get(m, peer);
  if (!p) return KVBM_ENOTFOUND;
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  out->closed = p->closed;
  out->peer_version = p->peer_version;
  pthread_mutex_unlock(&p->mu);
  return KVBM_OK;
}

/* The refusals by reason, per peer, on the manager's metrics page. */
static void metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm__peers *s = user;
  kvbm_peer_stats st[KVBM_MANAGER_MAX_PEERS];
  pthread_mutex_lock(&s->mu);
  uint32_t n = s->n;
  for (uint32_t i = 0; i < n; i++) {
    pthread_mutex_lock(&s->peers[i]->mu);
    st[i] = s->peers[i]->st;
    pthread_mutex_unlock(&s->peers[i]->mu);
  }
  pthread_mutex_unlock(&s->mu);
  kvbm_metrics_family(w, "kvbm_peer_refused_total", KVBM_METRIC_COUNTER,
                      "Messages from a peer refused, by reason (auth: a block frame's MAC failed; control: a "
                      "keyed link's message MAC failed or was replayed)");
  for (uint32_t i = 0; i < n; i++) {
    char idx[16];
    snprintf(idx, sizeof idx, "%u", i);
    const struct {
      const char *reason;
      uint64_t v;
    } r[] = {{"auth", st[i].refused_auth},         {"control", st[i].refused_control},
             {"checksum", st[i].refused_checksum},
             {"length", st[i].refused_length},     {"not_granted", st[i].refused_not_granted},
             {"stale_layout", st[i].refused_stale_layout}, {"hash", st[i].refused_hash},
             {"other", st[i].refused_other}};
    for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
      kvbm_metric_label l[2] = {{"peer", idx}, {"reason", r[k].reason}};
      kvbm_metrics_value_u64(w, l, 2, r[k].v);
    }
  }
}

int kvbm__peer_index_probes(kvbm_manager *m, uint32_t peer, uint64_t *probes) {
  kvbm__peer *p = m ? peer_get(m, peer) : NULL;
  if (!probes) return KVBM_EINVAL;
  if (!p) return KVBM_ENOTFOUND;
  pthread_mutex_lock(&p->mu);
  *probes = p->remote.probes + p->pending.probes;
  pthread_mutex_unlock(&p->mu);
  return KVBM_OK;
}

int kvbm__peer_skew_clock(kvbm_manager *m, uint32_t peer, int64_t ms) {
  kvbm__peer *p = m ? peer_get(m, peer) : NULL;
  if (!p) return KVBM_ENOTFOUND;
  pthread_mutex_lock(&p->mu);
  p->skew_ms += ms;
  pthread_mutex_unlock(&p->mu);
  return KVBM_OK;
}

int kvbm__peer_corrupt_offloads(kvbm_manager *m, uint64_t mask) {
  kvbm__peers *s = m ? set_make(m, NULL) : NULL;
  if (!s) return KVBM_EINVAL;
  atomic_store(&s->offloads, 0);
  atomic_store(&s->corrupt, mask);
  return KVBM_OK;
}

int kvbm__peer_push_pulls(kvbm_manager *m, bool on) {
  kvbm__peers *s = m ? set_make(m, NULL) : NULL;
  if (!s) return KVBM_EINVAL;
  atomic_store(&s->push_pulls, on);
  return KVBM_OK;
}

/* Whether every hash is held here (G1 or G2, bytes in place). */
static bool all_here(kvbm_manager *m, const uint64_t *hashes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    kvbm_block_location loc;
    if (kvbm_manager_block_location(m, hashes[i], &loc) || !loc.held || loc.tier > KVBM_TIER_G2) return false;
  }
  return true;
}

/* The pull hook: asks `peer` for hashes[0..n) back and waits (at most
 * timeout_ms) until they are held here; returns how many are. Called
 * without the manager's locks. */
static size_t hook_pull(void *user, uint32_t peer, const uint64_t *hashes, size_t n, int timeout_ms) {
  kvbm__peers *s = user;
  kvbm_manager *m = s->m;
  kvbm__peer *p = peer_get(m, peer);
  if (!p || p->detached || n == 0) return 0;
  if (n > 4096) n = 4096;
  uint8_t *req = malloc(8 + 8 * n);
  if (!req) return 0;
  /* Read one-sided (KVPR) where the peer's zone is mapped here: one pass
   * over each block. Elsewhere the read would wait for a flush on the
   * link thread (our pushes pulled by the peer's), so pushed (KVPL). */
  memcpy(req, p->peer_version >= 3 && p->rs_mapped ? "KVPR" : "KVPL", 4);
  kvbm__put_le32(req + 4, (uint32_t)n);
  for (size_t i = 0; i < n; i++) kvbm__put_le64(req + 8 + 8 * i, hashes[i]);
  pthread_mutex_lock(&p->mu);
  uint64_t start = p->handled;
  p->st.pulls_asked++;
  pthread_mutex_unlock(&p->mu);
  int rc = send_copy(p, req, 8 + 8 * n, NULL);
  free(req);
  if (rc) return 0;
  int64_t end = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    if (all_here(m, hashes, n)) break;
    pthread_mutex_lock(&p->mu);
    bool answered = p->handled - start >= n || p->closed;
    int64_t left = end - now_ms();
    if (!answered && left > 0) {
      struct timespec dl = kvbm__deadline_after_ms(CLOCK_REALTIME, left > 20 ? 20 : left);
      pthread_cond_timedwait(&p->cv, &p->mu, &dl);
    }
    pthread_mutex_unlock(&p->mu);
    if (answered || left <= 0) break;
  }
  size_t got = 0;
  for (size_t i = 0; i < n; i++) got += all_here(m, hashes + i, 1);
  pthread_mutex_lock(&p->mu);
  p->st.pulled_blocks += got;
  pthread_mutex_unlock(&p->mu);
  return got;
}
