/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_fabric_node.c: `kvbm fabric-node`, one node of a block transfer over
 * the UCX fabric ("onboard from the wire").
 *
 *   kvbm fabric-node recv --key-file K [--capacity N] [--port N] [--port-file F] [--json]
 *   kvbm fabric-node send --key-file K --port N [--blocks N] [--mode push|put] [--corrupt K]...
 *
 * Both nodes hold the same secret (--key-file, $KVBM_FABRIC_KEY_FILE or
 * $KVBM_FABRIC_KEY) and prove it to each other before anything else goes
 * over the side channel (kvbm/fabric.h). The receiver waits for one sender
 * that proves it: connections that fail (garbage, a wrong key, hung up,
 * silent) are refused, reported on stderr, counted ("refused_peers") and
 * do not end it.
 *
 * The receiver (node B) listens, allocates storage and a block pool of
 * --capacity blocks, registers the storage with the fabric and sends its
 * exported layout to the sender when it connects. The sender (node A)
 * imports that layout (and refuses a peer whose block geometry differs from
 * its own), prefills --blocks blocks (tokens, chained sequence hashes, and
 * bytes derived from each block's hash), and pushes each block as a block
 * message: identity plus an MRDN v1 frame whose BLAKE3 guards the bytes.
 * With --mode put the sender instead asks the receiver to grant blocks,
 * writes each block's bytes one-sided into a granted block of the
 * receiver's storage, flushes, and then sends placed block messages (the
 * frame header without the bytes); the receiver verifies the bytes where
 * they landed. --corrupt K flips one byte of block K after it was framed,
 * as a bad link would. The receiver pulls each message, verifies the frame,
 * copies the bytes into a block of its pool's storage and registers the
 * block in its pool under the sender's hashes and tokens; a message that
 * fails verification is rejected and nothing of it is kept. When the sender
 * closes, the receiver checks every registered block's bytes against the
 * pattern of its hash and prints a summary.
 *
 * Exit: 0 all good; 1 a runtime failure, or (receiver) any block rejected
 * or failing the final check; 2 bad usage or incompatible peers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/bytes.h"
#include "fabric_cli.h"
#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/pool.h"
#include "kvbm/storage.h"

const char kvbm_cmd_fabric_node_help[] =
    "one node of a framed block transfer over UCX (recv: onboard blocks from the wire; send: prefill and push)";

static const char kUsage[] =
    "usage: kvbm fabric-node recv --key-file FILE [--capacity N] [--port N] [--port-file FILE] [--json] [options]\n"
    "       kvbm fabric-node send --key-file FILE --port N [--blocks N] [--corrupt K]... [--json] [options]\n"
    "  --capacity N       receiver: blocks of storage and pool (default 64)\n"
    "  --port-file FILE   receiver: write the bound port there once listening\n"
    "  --blocks N         sender: blocks to prefill and send (default 16)\n"
    "  --corrupt K        sender: flip a byte of block K in flight (repeatable)\n"
    "  --window N         sender: blocks in flight before a flush (default 8)\n"
    "  --mode M           sender: push (each block a whole framed message, default) or\n"
    "                     put (blocks written one-sided into blocks the receiver\n"
    "                     grants, then announced by frame headers it verifies in place)\n"
    "  --json             one JSON object as the summary\n";

#define CMD "fabric-node"
#define MAX_CORRUPT 64

typedef struct node {
  fab_opts o;
  uint64_t capacity, window;
  const char *port_file, *key_file;
  uint64_t refused; /* receiver: side-channel connections refused */
  bool json;
  uint64_t corrupt[MAX_CORRUPT];
  size_t ncorrupt;
  bool placed; /* --mode put */
} node;

static int parse(node *n, int argc, char **argv) {
  for (int i = 2; i < argc; i++) {
    int r = fab_opts_parse(CMD, &n->o, argc, argv, &i);
    if (r < 0) return 2;
    if (r > 0) continue;
    const char *v;
    if ((r = cli_opt_value(CMD, argc, argv, &i, "--capacity", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--capacity", v, 1, KVBM_POOL_MAX_BLOCKS, &n->capacity)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--blocks", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--blocks", v, 1, 1u << 20, &n->o.blocks)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--window", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--window", v, 1, 1024, &n->window)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--corrupt", &v)) != 0) {
      if (r < 0 || n->ncorrupt == MAX_CORRUPT ||
          !cli_parse_u64(CMD, "--corrupt", v, 0, UINT64_MAX, &n->corrupt[n->ncorrupt]))
        return 2;
      n->ncorrupt++;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--port-file", &v)) != 0) {
      if (r < 0) return 2;
      n->port_file = v;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--key-file", &v)) != 0) {
      if (r < 0) return 2;
      n->key_file = v;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--mode", &v)) != 0) {
      if (r < 0 || (strcmp(v, "push") != 0 && strcmp(v, "put") != 0)) {
        fprintf(stderr, "kvbm " CMD ": --mode must be push or put\n");
        return 2;
      }
      n->placed = strcmp(v, "put") == 0;
    } else if (strcmp(argv[i], "--json") == 0) {
      n->json = true;
    } else {
      fprintf(stderr, "kvbm " CMD ": unknown option '%s'\n%s%s%s", argv[i], kUsage, fab_key_usage, fab_opts_usage);
      return 2;
    }
  }
  return 0;
}

static int fail(const char *what, const kvbm_error *e, int code) {
  fprintf(stderr, "kvbm " CMD ": %s: %s\n", what, e->msg[0] ? e->msg : kvbm_strerror(e->code));
  return code;
}

/* Writes the port to FILE atomically (the test polls for the file). */
static int write_port_file(const char *path, unsigned port) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fprintf(f, "%u\n", port);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

/* ---- receiver ---- */

/* Grant protocol of the placed mode (this command's own messages):
 *   request "KVRQ" u32 n            the sender wants n blocks to write into
 *   grant   "KVGR" u32 n, n x u32   the receiver's block ids (n = 0: no room)
 * The granted blocks are allocated in the receiver's pool, so nothing else
 * takes them while the bytes are on their way. */
#define GRANT_REQ "KVRQ"
#define GRANT_REP "KVGR"

typedef struct recv_state {
  uint64_t received, onboarded, rejected, dropped, verified;
  uint64_t *hashes; /* onboarded, in arrival order */
  uint8_t *granted; /* per block id: granted and not yet used */
  uint64_t rejected_claims[MAX_CORRUPT];
  int rejected_codes[MAX_CORRUPT];
} recv_state;

typedef struct recv_ctx {
  const fab_opts *o;
  kvbm_layout lay;
  uint64_t bb;
  kvbm_storage *s;
  kvbm_pool *pool;
  kvbm_fabric *f;
  uint32_t *tokens;
  uint32_t *grant; /* reply buffer: "KVGR", n, ids */
  recv_state st;
} recv_ctx;

/* The block_set_id of the receiver's export: what a sender's messages
 * must name as their layout. */
#define RECV_SET_ID 1

static void reject(recv_ctx *c, const uint8_t *buf, size_t len, int rc, const kvbm_error *e) {
  /* The identity it claims, for the report only: nothing of it is kept. */
  uint64_t claim = len >= 16 ? kvbm__get_le64(buf + 8) : 0;
  if (c->st.rejected < MAX_CORRUPT) {
    c->st.rejected_claims[c->st.rejected] = claim;
    c->st.rejected_codes[c->st.rejected] = rc;
  }
  c->st.rejected++;
  fprintf(stderr, "kvbm " CMD ": rejected message %" PRIu64 " (block %016" PRIx64 "): %s: %s\n", c->st.received,
          claim, kvbm_status_name(rc), e->msg);
}

/* Checks a placed block where it landed, layer by layer, without a copy. */
static int verify_in_place(recv_ctx *c, const kvbm_block_msg *m, kvbm_error *e) {
  kvbm_frame_verifier v;
  int rc = kvbm_frame_verifier_init(&v, &m->frame, e);
  for (uint64_t layer = 0; rc == KVBM_OK && layer < c->lay.config.num_layers; layer++) {
    void *ptr;
    size_t size;
    rc = kvbm_storage_block_layer_ptr(c->s, &c->lay, m->block_id, layer, &ptr, &size, e);
    if (rc == KVBM_OK) rc = kvbm_frame_verifier_update(&v, ptr, size, e);
  }
  return rc ? rc : kvbm_frame_verifier_finish(&v, e);
}

/* A block message: verify, place (unless placed already), register. */
static void onboard(recv_ctx *c, const uint8_t *buf, size_t len) {
  kvbm_block_msg m;
  kvbm_error e = {0};
  int rc = kvbm_block_msg_decode(buf, len, (uint32_t)c->o->page, (uint32_t)c->bb, c->tokens, &m, &e);
  if (rc == KVBM_OK && (m.num_tokens != c->o->page || m.body_len != c->bb))
    rc = kvbm_error_set(&e, KVBM_EFORMAT, "block of %u tokens and %zu bytes, expected %" PRIu64 " and %" PRIu64,
                        m.num_tokens, m.body_len, c->o->page, c->bb);
  if (rc == KVBM_OK && m.layout_id != RECV_SET_ID)
    rc = kvbm_error_set(&e, KVBM_EPROTO, "stale layout: laid out for block set %" PRIu64 ", this receiver exports %d",
                        m.layout_id, RECV_SET_ID);
  if (rc == KVBM_OK && m.placed && m.tier != KVBM_TIER_G2)
    rc = kvbm_error_set(&e, KVBM_EPROTO, "placed block names tier %s; this receiver exports G2",
                        kvbm_tier_name(m.tier));
  if (rc == KVBM_OK && m.placed &&
      (m.block_id >= c->lay.config.num_blocks || !c->st.granted[m.block_id]))
    rc = kvbm_error_set(&e, KVBM_EPROTO, "block %" PRIu64 " was not granted", m.block_id);
  uint32_t id, out;
  if (rc == KVBM_OK && m.placed) {
    id = (uint32_t)m.block_id;
    c->st.granted[id] = 0;
    rc = verify_in_place(c, &m, &e);
    if (rc) kvbm_block_release(c->pool, id, 0); /* back to the free list */
  }
  if (rc) {
    reject(c, buf, len, rc, &e);
    return;
  }
  if (!m.placed) {
    if (kvbm_pool_alloc(c->pool, 1, &id) != KVBM_OK) {
      c->st.dropped++;
      return;
    }
    if (fab_block_put(c->s, &c->lay, id, m.body) != KVBM_OK) {
      kvbm_block_release(c->pool, id, 0);
      c->st.dropped++;
      return;
    }
  }
  if (kvbm_block_fill(c->pool, id, m.salt_hash, m.parent_hash, m.has_parent, c->tokens, m.seq_hash, &out) !=
      KVBM_OK) {
    kvbm_block_release(c->pool, id, 0);
    c->st.dropped++;
    return;
  }
  kvbm_block_release(c->pool, out, 0);
  c->st.hashes[c->st.onboarded++] = m.seq_hash;
}

/* A grant request: allocate n blocks and tell their ids (0 if no room). */
static int grant(recv_ctx *c, const uint8_t *buf, size_t len, kvbm_error *e) {
  uint32_t n;
  if (len != 8) return kvbm_error_set(e, KVBM_EPROTO, "grant request of %zu bytes", len);
  memcpy(&n, buf + 4, 4);
  uint32_t *ids = c->grant + 2;
  memcpy(c->grant, GRANT_REP, 4);
  if (n > c->lay.config.num_blocks || kvbm_pool_alloc(c->pool, n, ids) != KVBM_OK) n = 0;
  c->grant[1] = n;
  for (uint32_t i = 0; i < n; i++) c->st.granted[ids[i]] = 1;
  /* the reply buffer is reused only after the next request, which the
   * sender sends after pulling this one */
  return kvbm_fabric_push(c->f, c->grant, 8 + 4 * (size_t)n, NULL, e);
}

/* Every onboarded block must be registered and hold its hash's pattern. */
static void verify_all(recv_state *st, const kvbm_layout *lay, const kvbm_storage *s, const kvbm_pool *pool,
                       uint8_t *scratch) {
  uint64_t bb = kvbm_fabric_block_bytes(lay);
  for (uint64_t i = 0; i < st->onboarded; i++) {
    uint32_t id;
    bool cached;
    if (kvbm_pool_peek(pool, st->hashes[i], &id, &cached) != KVBM_OK) continue;
    if (fab_block_get(s, lay, id, scratch) != KVBM_OK) continue;
    if (fab_check_pattern(scratch, bb, st->hashes[i])) st->verified++;
  }
}

static void recv_report(const node *n, const recv_state *st, const kvbm_pool *pool, const kvbm_fabric *f) {
  kvbm_pool_stats ps;
  kvbm_pool_stats_get(pool, &ps);
  if (n->json) {
    printf("{\"peer\": \"%s\", \"received\": %" PRIu64 ", \"onboarded\": %" PRIu64 ", \"rejected\": %" PRIu64
           ", \"dropped\": %" PRIu64 ", \"verified\": %" PRIu64 ", \"registered\": %u, \"refused_peers\": %" PRIu64
           ", \"rejected_blocks\": [",
           kvbm_fabric_peer_name(f), st->received, st->onboarded, st->rejected, st->dropped, st->verified,
           ps.registered, n->refused);
    for (uint64_t i = 0; i < st->rejected && i < MAX_CORRUPT; i++)
      printf("%s{\"hash\": \"%016" PRIx64 "\", \"error\": \"%s\"}", i ? ", " : "", st->rejected_claims[i],
             kvbm_status_name(st->rejected_codes[i]));
    printf("]}\n");
  } else {
    printf("peer: %s\nreceived: %" PRIu64 "\nonboarded: %" PRIu64 "\nrejected: %" PRIu64 "\ndropped: %" PRIu64
           "\nverified: %" PRIu64 "\nregistered: %u\nrefused peers: %" PRIu64 "\n",
           kvbm_fabric_peer_name(f), st->received, st->onboarded, st->rejected, st->dropped, st->verified,
           ps.registered, n->refused);
  }
}

/* A side-channel connection the listener refused: say who and why. */
static void on_refused(void *user, const char *peer, int status, const char *why) {
  node *n = user;
  n->refused++;
  fprintf(stderr, "kvbm " CMD ": refused a peer from %s: %s: %s\n", peer, kvbm_status_name(status), why);
}

static int run_recv(node *n) {
  fab_opts *o = &n->o;
  kvbm_error e = {0};
  recv_ctx c = {.o = o};
  if (fab_layout(o, n->capacity, &c.lay, &e)) return fail("layout", &e, 2);
  c.bb = kvbm_fabric_block_bytes(&c.lay);
  size_t msg_max = kvbm_block_msg_size((uint32_t)o->page, c.bb);
  kvbm_fabric_listener *l = NULL;
  kvbm_fabric_local_set *ls = NULL;
  kvbm_layout_desc desc = {0};
  uint8_t *wire = NULL, *buf = malloc(msg_max), *scratch = malloc(c.bb);
  c.tokens = malloc(o->page * sizeof *c.tokens);
  c.grant = malloc(8 + 4 * n->capacity);
  c.st.hashes = calloc(n->capacity, sizeof *c.st.hashes);
  c.st.granted = calloc(n->capacity, 1);
  int code = 1;
  kvbm_pool_config pc = kvbm_pool_config_default((uint32_t)n->capacity, (uint32_t)o->page);
  pc.keep_tokens = false;
  if (!buf || !scratch || !c.tokens || !c.grant || !c.st.hashes || !c.st.granted) {
    fprintf(stderr, "kvbm " CMD ": out of memory\n");
    goto out;
  }
  if (kvbm_pool_create(&pc, &c.pool, &e)) {
    fail("pool", &e, 1);
    goto out;
  }
  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  cfg.max_payload = msg_max; /* anything larger is a protocol error */
  cfg.on_refused = on_refused;
  cfg.on_refused_user = n;
  if (kvbm_fabric_ucx_listen(&cfg, o->host, (uint16_t)o->port, &l, &e)) {
    fail("listen", &e, 1);
    goto out;
  }
  unsigned port = kvbm_fabric_listener_port(l);
  if (n->port_file && write_port_file(n->port_file, port) != 0) {
    fprintf(stderr, "kvbm " CMD ": cannot write %s\n", n->port_file);
    goto out;
  }
  if (!n->json) printf("listening: %u\n", port);
  fflush(stdout);
  if (kvbm_fabric_ucx_accept(l, &c.f, &e)) {
    fail("accept", &e, 1);
    goto out;
  }
  /* Blocks live in fabric-allocated storage (the fast target of one-sided
   * writes); tell the sender what they look like and where they are. */
  size_t wlen;
  if (kvbm_fabric_storage_create(c.f, &c.lay, &c.s, &e) || kvbm_storage_describe(c.s, &c.lay, RECV_SET_ID, &desc, &e) ||
      kvbm_fabric_register(c.f, &desc, &ls, &e) || kvbm_fabric_export(ls, &wire, &wlen, &e) ||
      kvbm_fabric_push(c.f, wire, wlen, NULL, &e)) {
    fail("export", &e, 1);
    goto out;
  }
  for (;;) {
    kvbm_fabric_handle h;
    size_t len;
    int rc = kvbm_fabric_next(c.f, (int)o->timeout_ms, &h, &len, &e);
    if (rc == KVBM_ECLOSED) break;
    if (rc == KVBM_OK) rc = kvbm_fabric_pull(c.f, h, buf, msg_max, &len, (int)o->timeout_ms, &e);
    if (rc == KVBM_OK && len >= 4 && memcmp(buf, GRANT_REQ, 4) == 0) {
      rc = grant(&c, buf, len, &e);
    } else if (rc == KVBM_OK) {
      onboard(&c, buf, len);
      c.st.received++;
    }
    if (rc) {
      fail("receive", &e, 1);
      goto out;
    }
  }
  verify_all(&c.st, &c.lay, c.s, c.pool, scratch);
  recv_report(n, &c.st, c.pool, c.f);
  code = (c.st.rejected == 0 && c.st.dropped == 0 && c.st.verified == c.st.onboarded) ? 0 : 1;
out:
  kvbm_fabric_local_set_release(ls);
  kvbm_storage_release(c.s);
  kvbm_fabric_destroy(c.f);
  kvbm_fabric_listener_destroy(l);
  kvbm_layout_desc_release(&desc);
  kvbm_pool_destroy(c.pool);
  free(wire);
  free(buf);
  free(scratch);
  free(c.tokens);
  free(c.grant);
  free(c.st.hashes);
  free(c.st.granted);
  return code;
}

/* ---- sender ---- */

static bool is_corrupt(const node *n, uint64_t b) {
  for (size_t i = 0; i < n->ncorrupt; i++)
    if (n->corrupt[i] == b) return true;
  return false;
}

/* The peer's layout must hold our blocks: the same shape (its kind and
 * alignment may differ: blocks are moved layer by layer). */
static int check_peer(const kvbm_fabric_remote_set *rs, const kvbm_layout *ours, uint64_t blocks) {
  const kvbm_layout_desc *d = kvbm_fabric_remote_desc(rs);
  const kvbm_layout_config *a = &d->layout.config;
  kvbm_error e = {0};
  if (kvbm_fabric_layout_bridge(ours, &d->layout, &e) != KVBM_OK) {
    fprintf(stderr, "kvbm " CMD ": %s\n", e.msg);
    return 2;
  }
  if (a->num_blocks < blocks) {
    fprintf(stderr, "kvbm " CMD ": the peer holds %" PRIu64 " blocks, we send %" PRIu64 "\n", a->num_blocks, blocks);
    return 2;
  }
  return 0;
}

/* The sender's state, shared by the two ways of sending. */
typedef struct send_ctx {
  const node *n;
  const fab_opts *o;
  kvbm_layout lay;
  uint64_t nb, bb;
  kvbm_storage *s;
  kvbm_fabric *f;
  kvbm_fabric_remote_set *rs;
  uint32_t *tokens;
  uint64_t *hashes;
  uint8_t *msgs, *bodies; /* window-sized rings */
  uint64_t corrupted, corrupted_hash[MAX_CORRUPT];
} send_ctx;

static kvbm_block_msg block_msg(const send_ctx *c, uint64_t b, const uint8_t *body) {
  kvbm_block_msg m = {.seq_hash = c->hashes[b], .parent_hash = b ? c->hashes[b - 1] : 0, .has_parent = b > 0,
                      .salt_hash = 0, .num_tokens = (uint32_t)c->o->page, .tokens = c->tokens + b * c->o->page,
                      .tier = KVBM_TIER_G2, .layout_id = kvbm_fabric_remote_desc(c->rs)->block_set_id,
                      .phase = KVBM_PHASE_OUTPUT_CRITICAL, .body = body,
                      .body_len = c->bb};
  return m;
}

/* A bad link: one byte of the block's bytes changes after framing. */
static void maybe_corrupt(send_ctx *c, uint64_t b, uint8_t *byte) {
  if (!is_corrupt(c->n, b)) return;
  *byte ^= 0x20;
  c->corrupted_hash[c->corrupted++] = c->hashes[b];
}

/* Pushed: each block a whole message (frame with its bytes). */
static int send_pushed(send_ctx *c, kvbm_error *e) {
  uint64_t w = c->n->window;
  size_t msg_len = kvbm_block_msg_size((uint32_t)c->o->page, c->bb);
  for (uint64_t b = 0; b < c->nb; b++) {
    /* reuse a ring slot only once its push has been pulled */
    if (b > 0 && b % w == 0 && kvbm_fabric_flush(c->f, (int)c->o->timeout_ms, e)) return 1;
    uint8_t *msg = c->msgs + (b % w) * msg_len, *body = c->bodies + (b % w) * c->bb;
    fab_block_get(c->s, &c->lay, b, body);
    kvbm_block_msg m = block_msg(c, b, body);
    size_t mlen;
    if (kvbm_block_msg_encode(&m, msg, msg_len, &mlen, e)) return 1;
    maybe_corrupt(c, b, &msg[mlen - c->bb / 2 - 1]);
    if (kvbm_fabric_push(c->f, msg, mlen, NULL, e)) return 1;
  }
  return kvbm_fabric_flush(c->f, (int)c->o->timeout_ms, e) ? 1 : 0;
}

/* Placed: the receiver grants blocks; each window's bytes are written
 * one-sided into them, flushed, and only then announced by placed block
 * messages (completion by notification). */
static int send_placed(send_ctx *c, kvbm_error *e) {
  uint64_t w = c->n->window;
  size_t msg_len = kvbm_block_msg_placed_size((uint32_t)c->o->page), len;
  uint32_t req[2], *rep = malloc(8 + 4 * c->nb);
  memcpy(req, GRANT_REQ, 4);
  req[1] = (uint32_t)c->nb;
  kvbm_fabric_handle h;
  int rc = rep ? KVBM_OK : kvbm_error_set(e, KVBM_ENOMEM, "out of memory");
  if (!rc) rc = kvbm_fabric_push(c->f, req, sizeof req, NULL, e);
  if (!rc) rc = kvbm_fabric_next(c->f, (int)c->o->timeout_ms, &h, &len, e);
  if (!rc) rc = kvbm_fabric_pull(c->f, h, rep, 8 + 4 * c->nb, &len, (int)c->o->timeout_ms, e);
  if (!rc && (len != 8 + 4 * c->nb || memcmp(rep, GRANT_REP, 4) != 0 || rep[1] != c->nb))
    rc = kvbm_error_set(e, KVBM_EPROTO, "the peer granted no room for %" PRIu64 " blocks", c->nb);
  for (uint64_t b0 = 0; !rc && b0 < c->nb; b0 += w) {
    uint64_t end = b0 + w < c->nb ? b0 + w : c->nb;
    /* the previous window's messages must be pulled before reuse */
    if (b0 > 0) rc = kvbm_fabric_flush(c->f, (int)c->o->timeout_ms, e);
    for (uint64_t b = b0; !rc && b < end; b++) {
      uint8_t *msg = c->msgs + (b - b0) * msg_len, *body = c->bodies + (b - b0) * c->bb;
      fab_block_get(c->s, &c->lay, b, body);
      kvbm_block_msg m = block_msg(c, b, body);
      m.placed = 1;
      m.block_id = rep[2 + b];
      size_t mlen;
      rc = kvbm_block_msg_encode(&m, msg, msg_len, &mlen, e);
      maybe_corrupt(c, b, &body[c->bb / 2]);
      if (!rc) rc = kvbm_fabric_write_block(c->f, c->rs, rep[2 + b], body, c->bb, e);
    }
    if (!rc) rc = kvbm_fabric_flush(c->f, (int)c->o->timeout_ms, e); /* the bytes are there */
    for (uint64_t b = b0; !rc && b < end; b++)
      rc = kvbm_fabric_push(c->f, c->msgs + (b - b0) * msg_len, msg_len, NULL, e);
  }
  if (!rc) rc = kvbm_fabric_flush(c->f, (int)c->o->timeout_ms, e);
  free(rep);
  return rc ? 1 : 0;
}

static int run_send(node *n) {
  fab_opts *o = &n->o;
  if (o->port == 0) {
    fprintf(stderr, "kvbm " CMD ": send needs --port\n%s", kUsage);
    return 2;
  }
  kvbm_error e = {0};
  send_ctx c = {.n = n, .o = o, .nb = o->blocks};
  if (fab_layout(o, o->blocks, &c.lay, &e)) return fail("layout", &e, 2);
  c.bb = kvbm_fabric_block_bytes(&c.lay);
  uint64_t w = n->window;
  uint8_t *wire = NULL;
  c.tokens = malloc(c.nb * o->page * sizeof *c.tokens);
  c.hashes = malloc(c.nb * sizeof *c.hashes);
  c.msgs = malloc(w * kvbm_block_msg_size((uint32_t)o->page, c.bb));
  c.bodies = malloc(w * c.bb);
  int code = 1;
  if (!c.tokens || !c.hashes || !c.msgs || !c.bodies) {
    fprintf(stderr, "kvbm " CMD ": out of memory\n");
    goto out;
  }
  /* Prefill: tokens, chained hashes, bytes from each hash. */
  for (uint64_t i = 0; i < c.nb * o->page; i++) c.tokens[i] = (uint32_t)(i + 1);
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, c.tokens, c.nb * o->page, o->page, c.hashes, c.nb);
  kvbm_storage_config so = {0};
  if (kvbm_storage_create(KVBM_MEMORY_SYSTEM, &c.lay, &so, &c.s, &e)) {
    fail("storage", &e, 1);
    goto out;
  }
  for (uint64_t b = 0; b < c.nb; b++) {
    fab_fill_pattern(c.bodies, c.bb, c.hashes[b]);
    fab_block_put(c.s, &c.lay, b, c.bodies);
  }

  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  if (kvbm_fabric_ucx_connect(&cfg, o->host, (uint16_t)o->port, &c.f, &e)) {
    fail("connect", &e, 1);
    goto out;
  }
  kvbm_fabric_handle h;
  size_t len;
  if (kvbm_fabric_next(c.f, (int)o->timeout_ms, &h, &len, &e) || !(wire = malloc(len ? len : 1)) ||
      kvbm_fabric_pull(c.f, h, wire, len, &len, (int)o->timeout_ms, &e) ||
      kvbm_fabric_import(c.f, wire, len, &c.rs, &e)) {
    fail("import the peer's layout", &e, 1);
    goto out;
  }
  if ((code = check_peer(c.rs, &c.lay, c.nb)) != 0) goto out;
  code = 1;
  if ((n->placed ? send_placed(&c, &e) : send_pushed(&c, &e)) != 0) {
    fail("send", &e, 1);
    goto out;
  }
  if (n->json) {
    printf("{\"peer\": \"%s\", \"mode\": \"%s\", \"sent\": %" PRIu64 ", \"corrupted\": %" PRIu64
           ", \"block_bytes\": %" PRIu64 ", \"corrupted_blocks\": [",
           kvbm_fabric_peer_name(c.f), n->placed ? "put" : "push", c.nb, c.corrupted, c.bb);
    for (uint64_t i = 0; i < c.corrupted; i++) printf("%s\"%016" PRIx64 "\"", i ? ", " : "", c.corrupted_hash[i]);
    printf("]}\n");
  } else {
    printf("peer: %s\nmode: %s\nsent: %" PRIu64 "\ncorrupted: %" PRIu64 "\nblock_bytes: %" PRIu64 "\n",
           kvbm_fabric_peer_name(c.f), n->placed ? "put" : "push", c.nb, c.corrupted, c.bb);
  }
  code = 0;
out:
  kvbm_fabric_remote_set_release(c.rs);
  kvbm_fabric_destroy(c.f);
  kvbm_storage_release(c.s);
  free(c.tokens);
  free(c.hashes);
  free(c.msgs);
  free(c.bodies);
  free(wire);
  return code;
}

int kvbm_cmd_fabric_node(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("%s%s%s", kUsage, fab_key_usage, fab_opts_usage);
      return 0;
    }
  if (argc < 2 || (strcmp(argv[1], "recv") != 0 && strcmp(argv[1], "send") != 0)) {
    fprintf(stderr, "%s%s%s", kUsage, fab_key_usage, fab_opts_usage);
    return 2;
  }
  bool recv = strcmp(argv[1], "recv") == 0;
  node n = {0};
  fab_opts_init(&n.o, recv ? "node-b" : "node-a");
  n.o.blocks = 16;
  n.capacity = 64;
  n.window = 8;
  int rc = parse(&n, argc, argv);
  if (rc) return rc;
  if (fab_key_load(CMD, &n.o, n.key_file) != 0) return 2;
  rc = recv ? run_recv(&n) : run_send(&n);
  fab_key_wipe(&n.o);
  return rc;
}
