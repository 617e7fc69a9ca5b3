/*
 * cmd_fabric_node.c: `kvbm fabric-node`, one node of a block transfer over
 * the UCX fabric ("onboard from the wire").
 *
 *   kvbm fabric-node recv [--capacity N] [--port N] [--port-file F] [--json]
 *   kvbm fabric-node send --port N [--blocks N] [--corrupt K]... [--json]
 *
 * The receiver (node B) listens, allocates storage and a block pool of
 * --capacity blocks, registers the storage with the fabric and sends its
 * exported layout to the sender when it connects. The sender (node A)
 * imports that layout (and refuses a peer whose block geometry differs from
 * its own), prefills --blocks blocks (tokens, chained sequence hashes, and
 * bytes derived from each block's hash), and pushes each block as a block
 * message: identity plus an MRDN v1 frame whose BLAKE3 guards the bytes.
 * --corrupt K flips one byte of block K's body after it was framed, as a
 * bad link would. The receiver pulls each message, verifies the frame,
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
#include "fabric_cli.h"
#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/pool.h"
#include "kvbm/storage.h"

const char kvbm_cmd_fabric_node_help[] =
    "one node of a framed block transfer over UCX (recv: onboard blocks from the wire; send: prefill and push)";

static const char kUsage[] =
    "usage: kvbm fabric-node recv [--capacity N] [--port N] [--port-file FILE] [--json] [options]\n"
    "       kvbm fabric-node send --port N [--blocks N] [--corrupt K]... [--json] [options]\n"
    "  --capacity N       receiver: blocks of storage and pool (default 64)\n"
    "  --port-file FILE   receiver: write the bound port there once listening\n"
    "  --blocks N         sender: blocks to prefill and send (default 16)\n"
    "  --corrupt K        sender: flip a byte of block K in flight (repeatable)\n"
    "  --window N         sender: pushes in flight before a flush (default 8)\n"
    "  --json             one JSON object as the summary\n";

#define CMD "fabric-node"
#define MAX_CORRUPT 64

typedef struct node {
  fab_opts o;
  uint64_t capacity, window;
  const char *port_file;
  bool json;
  uint64_t corrupt[MAX_CORRUPT];
  size_t ncorrupt;
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
    } else if (strcmp(argv[i], "--json") == 0) {
      n->json = true;
    } else {
      fprintf(stderr, "kvbm " CMD ": unknown option '%s'\n%s%s", argv[i], kUsage, fab_opts_usage);
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

typedef struct recv_state {
  uint64_t received, onboarded, rejected, dropped, verified;
  uint64_t *hashes; /* onboarded, in arrival order */
  uint64_t rejected_claims[MAX_CORRUPT];
  int rejected_codes[MAX_CORRUPT];
} recv_state;

/* One message from the wire: verify, place, register. */
static void onboard(recv_state *st, const uint8_t *buf, size_t len, const fab_opts *o, const kvbm_layout *lay,
                    kvbm_storage *s, kvbm_pool *pool, uint32_t *tokens) {
  uint64_t bb = kvbm_fabric_block_bytes(lay);
  kvbm_block_msg m;
  kvbm_error e = {0};
  int rc = kvbm_block_msg_decode(buf, len, (uint32_t)o->page, (uint32_t)bb, tokens, &m, &e);
  if (rc == KVBM_OK && (m.num_tokens != o->page || m.body_len != bb))
    rc = kvbm_error_set(&e, KVBM_EFORMAT, "block of %u tokens and %zu bytes, expected %" PRIu64 " and %" PRIu64,
                        m.num_tokens, m.body_len, o->page, bb);
  if (rc) {
    /* The identity it claims, for the report only: nothing of it is kept. */
    uint64_t claim = 0;
    if (len >= 16)
      for (int i = 7; i >= 0; i--) claim = claim << 8 | buf[8 + i];
    if (st->rejected < MAX_CORRUPT) {
      st->rejected_claims[st->rejected] = claim;
      st->rejected_codes[st->rejected] = rc;
    }
    st->rejected++;
    fprintf(stderr, "kvbm " CMD ": rejected message %" PRIu64 " (block %016" PRIx64 "): %s: %s\n", st->received,
            claim, kvbm_status_name(rc), e.msg);
    return;
  }
  uint32_t id, out;
  if (kvbm_pool_alloc(pool, 1, &id) != KVBM_OK) {
    st->dropped++;
    return;
  }
  if (fab_block_put(s, lay, id, m.body) != KVBM_OK ||
      kvbm_block_fill(pool, id, m.salt_hash, m.parent_hash, m.has_parent, tokens, m.seq_hash, &out) != KVBM_OK) {
    kvbm_block_release(pool, id, 0);
    st->dropped++;
    return;
  }
  kvbm_block_release(pool, out, 0);
  st->hashes[st->onboarded++] = m.seq_hash;
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
           ", \"dropped\": %" PRIu64 ", \"verified\": %" PRIu64 ", \"registered\": %u, \"rejected_blocks\": [",
           kvbm_fabric_peer_label(f), st->received, st->onboarded, st->rejected, st->dropped, st->verified,
           ps.registered);
    for (uint64_t i = 0; i < st->rejected && i < MAX_CORRUPT; i++)
      printf("%s{\"hash\": \"%016" PRIx64 "\", \"error\": \"%s\"}", i ? ", " : "", st->rejected_claims[i],
             kvbm_status_name(st->rejected_codes[i]));
    printf("]}\n");
  } else {
    printf("peer: %s\nreceived: %" PRIu64 "\nonboarded: %" PRIu64 "\nrejected: %" PRIu64 "\ndropped: %" PRIu64
           "\nverified: %" PRIu64 "\nregistered: %u\n",
           kvbm_fabric_peer_label(f), st->received, st->onboarded, st->rejected, st->dropped, st->verified,
           ps.registered);
  }
}

static int run_recv(node *n) {
  fab_opts *o = &n->o;
  kvbm_error e = {0};
  kvbm_layout lay;
  if (fab_layout(o, n->capacity, &lay, &e)) return fail("layout", &e, 2);
  uint64_t bb = kvbm_fabric_block_bytes(&lay);
  size_t msg_max = kvbm_block_msg_size((uint32_t)o->page, bb);
  kvbm_storage *s = NULL;
  kvbm_pool *pool = NULL;
  kvbm_fabric_listener *l = NULL;
  kvbm_fabric *f = NULL;
  kvbm_fabric_local_set *ls = NULL;
  kvbm_layout_desc desc = {0};
  uint8_t *wire = NULL, *buf = malloc(msg_max), *scratch = malloc(bb);
  uint32_t *tokens = malloc(o->page * sizeof *tokens);
  recv_state st = {0};
  st.hashes = calloc(n->capacity, sizeof *st.hashes);
  int code = 1;
  kvbm_storage_options so = {.zero = 1};
  kvbm_pool_config pc = kvbm_pool_config_default((uint32_t)n->capacity, (uint32_t)o->page);
  pc.keep_tokens = false;
  if (!buf || !scratch || !tokens || !st.hashes) {
    fprintf(stderr, "kvbm " CMD ": out of memory\n");
    goto out;
  }
  if (kvbm_storage_create(KVBM_MEMORY_SYSTEM, &lay, &so, &s, &e)) {
    fail("storage", &e, 1);
    goto out;
  }
  if (kvbm_pool_create(&pc, &pool, &e)) {
    fail("pool", &e, 1);
    goto out;
  }
  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  cfg.max_payload = msg_max; /* anything larger is a protocol error */
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
  if (kvbm_fabric_ucx_accept(l, &f, &e)) {
    fail("accept", &e, 1);
    goto out;
  }
  /* Tell the sender what our blocks look like (and where they are). */
  size_t wlen;
  if (kvbm_storage_describe(s, &lay, 1, &desc, &e) || kvbm_fabric_register(f, &desc, &ls, &e) ||
      kvbm_fabric_export(ls, &wire, &wlen, &e) || kvbm_fabric_push(f, wire, wlen, NULL, &e)) {
    fail("export", &e, 1);
    goto out;
  }
  for (;;) {
    kvbm_fabric_handle h;
    size_t len;
    int rc = kvbm_fabric_next(f, (int)o->timeout_ms, &h, &len, &e);
    if (rc == KVBM_ECLOSED) break;
    if (rc == KVBM_OK) rc = kvbm_fabric_pull(f, h, buf, msg_max, &len, (int)o->timeout_ms, &e);
    if (rc) {
      fail("receive", &e, 1);
      goto out;
    }
    onboard(&st, buf, len, o, &lay, s, pool, tokens);
    st.received++;
  }
  verify_all(&st, &lay, s, pool, scratch);
  recv_report(n, &st, pool, f);
  code = (st.rejected == 0 && st.dropped == 0 && st.verified == st.onboarded) ? 0 : 1;
out:
  kvbm_fabric_local_set_release(ls);
  kvbm_fabric_destroy(f);
  kvbm_fabric_listener_free(l);
  kvbm_layout_desc_release(&desc);
  kvbm_pool_destroy(pool);
  kvbm_storage_release(s);
  free(wire);
  free(buf);
  free(scratch);
  free(tokens);
  free(st.hashes);
  return code;
}

/* ---- sender ---- */

static bool is_corrupt(const node *n, uint64_t b) {
  for (size_t i = 0; i < n->ncorrupt; i++)
    if (n->corrupt[i] == b) return true;
  return false;
}

/* The peer's layout must hold our blocks: same block bytes and tokens. */
static int check_peer(const kvbm_fabric_remote_set *rs, const kvbm_layout *ours, uint64_t blocks) {
  const kvbm_layout_desc *d = kvbm_fabric_remote_desc(rs);
  const kvbm_layout_config *a = &d->layout.config, *b = &ours->config;
  if (a->num_layers != b->num_layers || a->page_size != b->page_size || a->inner_dim * a->outer_dim !=
      b->inner_dim * b->outer_dim || a->dtype_size != b->dtype_size) {
    fprintf(stderr,
            "kvbm " CMD ": the peer's blocks are %" PRIu64 " layers x %" PRIu64 " tokens x %" PRIu64 " x %" PRIu64
            " bytes, ours %" PRIu64 " x %" PRIu64 " x %" PRIu64 " x %" PRIu64 "\n",
            a->num_layers, a->page_size, a->inner_dim * a->outer_dim, a->dtype_size, b->num_layers, b->page_size,
            b->inner_dim * b->outer_dim, b->dtype_size);
    return 2;
  }
  if (a->num_blocks < blocks) {
    fprintf(stderr, "kvbm " CMD ": the peer holds %" PRIu64 " blocks, we send %" PRIu64 "\n", a->num_blocks, blocks);
    return 2;
  }
  return 0;
}

static int run_send(node *n) {
  fab_opts *o = &n->o;
  if (o->port == 0) {
    fprintf(stderr, "kvbm " CMD ": send needs --port\n%s", kUsage);
    return 2;
  }
  kvbm_error e = {0};
  kvbm_layout lay;
  if (fab_layout(o, o->blocks, &lay, &e)) return fail("layout", &e, 2);
  uint64_t nb = o->blocks, bb = kvbm_fabric_block_bytes(&lay);
  size_t msg_len = kvbm_block_msg_size((uint32_t)o->page, bb);
  uint64_t w = n->window;
  kvbm_storage *s = NULL;
  kvbm_fabric *f = NULL;
  kvbm_fabric_remote_set *rs = NULL;
  uint32_t *tokens = malloc(nb * o->page * sizeof *tokens);
  uint64_t *hashes = malloc(nb * sizeof *hashes);
  uint8_t *ring = malloc(w * msg_len), *body = malloc(bb), *wire = NULL;
  int code = 1;
  if (!tokens || !hashes || !ring || !body) {
    fprintf(stderr, "kvbm " CMD ": out of memory\n");
    goto out;
  }
  /* Prefill: tokens, chained hashes, bytes from each hash. */
  for (uint64_t i = 0; i < nb * o->page; i++) tokens[i] = (uint32_t)(i + 1);
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tokens, nb * o->page, o->page, hashes, nb);
  kvbm_storage_options so = {0};
  if (kvbm_storage_create(KVBM_MEMORY_SYSTEM, &lay, &so, &s, &e)) {
    fail("storage", &e, 1);
    goto out;
  }
  for (uint64_t b = 0; b < nb; b++) {
    fab_fill_pattern(body, bb, hashes[b]);
    fab_block_put(s, &lay, b, body);
  }

  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  if (kvbm_fabric_ucx_connect(&cfg, o->host, (uint16_t)o->port, &f, &e)) {
    fail("connect", &e, 1);
    goto out;
  }
  kvbm_fabric_handle h;
  size_t len;
  if (kvbm_fabric_next(f, (int)o->timeout_ms, &h, &len, &e) || !(wire = malloc(len ? len : 1)) ||
      kvbm_fabric_pull(f, h, wire, len, &len, (int)o->timeout_ms, &e) || kvbm_fabric_import(f, wire, len, &rs, &e)) {
    fail("import the peer's layout", &e, 1);
    goto out;
  }
  if ((code = check_peer(rs, &lay, nb)) != 0) goto out;
  code = 1;

  uint64_t corrupted = 0, corrupted_hash[MAX_CORRUPT];
  for (uint64_t b = 0; b < nb; b++) {
    if (b > 0 && b % w == 0 && kvbm_fabric_flush(f, (int)o->timeout_ms, &e)) {
      fail("flush", &e, 1);
      goto out;
    }
    uint8_t *msg = ring + (b % w) * msg_len;
    fab_block_get(s, &lay, b, body);
    kvbm_block_msg m = {.seq_hash = hashes[b], .parent_hash = b ? hashes[b - 1] : 0, .has_parent = b > 0,
                        .salt_hash = 0, .num_tokens = (uint32_t)o->page, .tokens = tokens + b * o->page,
                        .tier = KVBM_FRAME_TIER_G2, .body = body, .body_len = bb};
    size_t mlen;
    if (kvbm_block_msg_encode(&m, msg, msg_len, &mlen, &e)) {
      fail("encode", &e, 1);
      goto out;
    }
    if (is_corrupt(n, b)) {
      msg[mlen - bb / 2 - 1] ^= 0x20; /* a bad link: one byte of the body */
      corrupted_hash[corrupted++] = hashes[b];
    }
    if (kvbm_fabric_push(f, msg, mlen, NULL, &e)) {
      fail("push", &e, 1);
      goto out;
    }
  }
  if (kvbm_fabric_flush(f, (int)o->timeout_ms, &e)) {
    fail("flush", &e, 1);
    goto out;
  }
  if (n->json) {
    printf("{\"peer\": \"%s\", \"sent\": %" PRIu64 ", \"corrupted\": %" PRIu64 ", \"block_bytes\": %" PRIu64
           ", \"corrupted_blocks\": [",
           kvbm_fabric_peer_label(f), nb, corrupted, bb);
    for (uint64_t i = 0; i < corrupted; i++) printf("%s\"%016" PRIx64 "\"", i ? ", " : "", corrupted_hash[i]);
    printf("]}\n");
  } else {
    printf("peer: %s\nsent: %" PRIu64 "\ncorrupted: %" PRIu64 "\nblock_bytes: %" PRIu64 "\n",
           kvbm_fabric_peer_label(f), nb, corrupted, bb);
  }
  code = 0;
out:
  kvbm_fabric_remote_set_release(rs);
  kvbm_fabric_destroy(f);
  kvbm_storage_release(s);
  free(tokens);
  free(hashes);
  free(ring);
  free(body);
  free(wire);
  return code;
}

int kvbm_cmd_fabric_node(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "recv") != 0 && strcmp(argv[1], "send") != 0)) {
    fprintf(stderr, "%s%s", kUsage, fab_opts_usage);
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
  return recv ? run_recv(&n) : run_send(&n);
}
