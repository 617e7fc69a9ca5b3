/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_peer_transfer.c: W4 (data movement, ../shared/WORKLOADS.md) between
 * two managers' peers: blocks offloaded from a prefill manager's G1 to a
 * decode manager's G1 over the in-process fabric, PUSH mode, and
 * acknowledged (kvbm_manager_peer_flush).
 *
 * Each block is W4-shaped (layers x 16 tokens x inner_dim x 2 bytes). What
 * a transfer must do at least, per block: copy its bytes once (into the
 * message) and hash them once (the receiver's check; the sender frames the
 * sum its tier kept, or hashes it once and keeps it). The bound, measured
 * in the same run on the same bytes: one memcpy plus one BLAKE3 (keyed:
 * keyed BLAKE3) of every block. The ratio is bound time / transfer time
 * (1: the transfer costs only that).
 *
 * --keyed: both peers share a key (kvbm_peer_config.key, issue 23): the
 * frames are MAC'd. Run with and without it for the MAC's cost.
 *
 * --pull: the timed transfer is the OutputCritical pull instead (issue
 * 22): the blocks, offloaded to the decode manager untimed, leave the
 * prefill manager's G1 (another prompt takes it), and its prefill of the
 * prompt pulls them all back; the holder stages each in its landing zone
 * and the puller reads it one-sided, hashing it as it lands (KVPB).
 * --pull-pushed: the same pull answered by pushes (the holder's seam
 * kvbm__peer_push_pulls: what a version 2 peer does, the code before):
 * the before of --pull in one binary. A pull is read one-sided only where
 * the holder's zone is mapped into the puller (UCX shared memory): with
 * the in-process fabric (no mapping) --pull is pushed back too. --ucx:
 * the two managers talk over UCX shared memory on loopback, in this one
 * process (the fabric's label says so), so that --pull is the read.
 * Under callgrind (--pull, --pull-pushed) the pull's window is dumped on
 * its own (below): its instructions divided by the blocks pulled are the
 * figure; compare --pull with --pull-pushed at the same sizes.
 * Under callgrind, use a few rounds and small blocks: the instruction
 * count of the whole run is the figure.
 *
 * usage: bench_peer_transfer [--blocks N (256)] [--layers L (8)]
 *        [--inner D (512)] [--rounds R (5)] [--keyed] [--pull | --pull-pushed] [--ucx]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/manager.h"
#if __has_include("kvbm/peer.h")
#include "kvbm/peer.h"
#define HAVE_PEER_H 1
#endif
#if __has_include("peer/testing.h")
#include "peer/testing.h"
#define HAVE_PULL_SEAM 1
#endif

/* Under callgrind the pull alone is counted: everything before the
 * prefill that pulls is dumped (a dump also zeroes every thread's counts;
 * CALLGRIND_ZERO_STATS does not), and the pull's window dumped after it:
 * the even parts of callgrind.out.N (2, 4, ...: one per round). */
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_DUMP_STATS_AT(x)
#endif

#define PROG "bench_peer_transfer"
#define B 16u

static void check(const char *what, int rc, const kvbm_error *e) {
  if (rc) kvbm_bench_die(PROG, "%s: %s %s", what, kvbm_status_name(rc), e ? e->msg : "");
}

typedef struct side {
  kvbm_manager *m;
  kvbm_fabric *f;
  kvbm_peer_config pc;
  int rc;
  kvbm_error e;
} side;

static void *attach_thread(void *arg) {
  side *s = arg;
  uint32_t peer;
  s->rc = kvbm_manager_attach(s->m, s->f, &s->pc, &peer, &s->e);
  return NULL;
}

static kvbm_manager *make(uint32_t blocks, uint32_t layers, uint32_t inner, bool pull) {
  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = B;
  c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = layers, .outer_dim = 2, .page_size = B,
                                  .inner_dim = inner, .dtype_size = 2, .alignment = 256};
  c.g1_blocks = blocks + 8;
  c.g2_blocks = 0;
  if (pull) { /* the puller: the pull on, nothing pushed at ExitThink */
    c.output_pull = true;
    c.pull_timeout_ms = 60000;
    c.offload_threshold_blocks = 0;
  }
  kvbm_manager *m;
  kvbm_error e;
  check("create", kvbm_manager_create(&c, &m, &e), &e);
  return m;
}

static void *destroy_thread(void *f) {
  kvbm_fabric_destroy(f);
  return NULL;
}

/* --ucx: both ends of a UCX fabric over shared memory, in this process
 * (the connecting end on a thread of its own). */
typedef struct ucx_conn {
  uint16_t port;
  kvbm_fabric *f;
  int rc;
  kvbm_error e;
} ucx_conn;

static kvbm_fabric_ucx_config ucx_cfg(const char *name) {
  static const char secret[] = "bench_peer_transfer's fabric secret";
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.name = name;
  c.key = secret;
  c.key_len = sizeof secret - 1;
  c.transports = "shm,self";
  c.net_devices = "lo";
  c.timeout_ms = 60000;
  return c;
}

static void *ucx_connect_thread(void *arg) {
  ucx_conn *u = arg;
  kvbm_fabric_ucx_config c = ucx_cfg("decode");
  u->rc = kvbm_fabric_ucx_connect(&c, "127.0.0.1", u->port, &u->f, &u->e);
  return NULL;
}

static void ucx_pair(kvbm_fabric **a, kvbm_fabric **b) {
  kvbm_fabric_ucx_config c = ucx_cfg("prefill");
  kvbm_fabric_listener *l;
  kvbm_error e;
  check("ucx listen", kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), &e);
  ucx_conn u = {.port = kvbm_fabric_listener_port(l)};
  pthread_t th;
  pthread_create(&th, NULL, ucx_connect_thread, &u);
  int rc = kvbm_fabric_ucx_accept(l, a, &e);
  pthread_join(th, NULL);
  kvbm_fabric_listener_destroy(l);
  check("ucx accept", rc, &e);
  check("ucx connect", u.rc, &u.e);
  *b = u.f;
}

/* --pull: a's G1 taken by another prompt (the offloaded blocks are then
 * the peer's only), then the timed prefill of the prompt, which pulls all
 * nb blocks back; its seconds. */
static double pull_back(kvbm_manager *a, const uint32_t *tok, size_t nt, uint32_t nb, uint64_t *seed) {
  size_t no = (size_t)(nb + 7) * B + 1; /* G1 (nb + 8) whole: every block of ours leaves */
  uint32_t *other = malloc(no * sizeof *other);
  for (size_t i = 0; i < no; i++) other[i] = (uint32_t)kvbm_bench_xorshift(seed);
  kvbm_mreq *q;
  kvbm_error e;
  check("prefill other", kvbm_manager_prefill(a, 0, 0, other, no, &q, NULL, &e), &e);
  kvbm_mreq_wait(q, -1, NULL);
  check("commit other", kvbm_mreq_commit(q), NULL);
  kvbm_mreq_destroy(q);
  free(other);
  kvbm_peer_stats st0, st1;
  kvbm_manager_peer_stats_get(a, 0, &st0);
  CALLGRIND_DUMP_STATS_AT("before the pull"); /* and zeroed: every thread */
  double t0 = kvbm_bench_now();
  kvbm_mreq_info info;
  check("prefill pull", kvbm_manager_prefill(a, 0, 0, tok, nt, &q, NULL, &e), &e);
  kvbm_mreq_wait(q, -1, &info);
  double t = kvbm_bench_now() - t0;
  CALLGRIND_DUMP_STATS_AT("pull");
  kvbm_mreq_destroy(q);
  kvbm_manager_peer_stats_get(a, 0, &st1);
  if (info.matched_tokens != (size_t)nb * B || st1.ingested - st0.ingested != nb)
    kvbm_bench_die(PROG, "pull: %llu tokens matched, %llu blocks ingested, of %u blocks",
                   (unsigned long long)info.matched_tokens, (unsigned long long)(st1.ingested - st0.ingested), nb);
  return t;
}

int main(int argc, char **argv) {
  uint32_t nb = 256, layers = 8, inner = 512, rounds = 5;
  bool keyed = false;
  int pull = 0; /* 1: --pull, 2: --pull-pushed */
  bool ucx = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--keyed")) keyed = true;
    else if (!strcmp(argv[i], "--pull")) pull = 1;
    else if (!strcmp(argv[i], "--pull-pushed")) pull = 2;
    else if (!strcmp(argv[i], "--ucx")) ucx = true;
    else if (i + 1 < argc && !strcmp(argv[i], "--blocks")) nb = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--layers")) layers = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--inner")) inner = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--rounds")) rounds = (uint32_t)strtoul(argv[++i], NULL, 10);
    else kvbm_bench_die(PROG, "usage: %s [--blocks N] [--layers L] [--inner D] [--rounds R] [--keyed] [--pull | --pull-pushed] [--ucx]",
                          PROG);
  }
  if (nb == 0 || layers == 0 || inner == 0 || rounds == 0 || rounds > 64) kvbm_bench_die(PROG, "bad sizes");
#ifndef HAVE_PEER_H
  if (keyed) kvbm_bench_die(PROG, "--keyed: this build has no keyed peer links");
#endif
#ifndef HAVE_PULL_SEAM
  if (pull) kvbm_bench_die(PROG, "--pull: this build has no pulled blocks");
#endif
  uint8_t secret[32];
  for (int i = 0; i < 32; i++) secret[i] = (uint8_t)(i * 37 + 11);

  double t_xfer[64], t_bound[64];
  uint64_t bytes = 0;
  for (uint32_t r = 0; r < rounds; r++) {
    kvbm_manager *a = make(nb, layers, inner, pull != 0), *b = make(nb, layers, inner, false);
#ifdef HAVE_PULL_SEAM
    if (pull == 2) check("seam", kvbm__peer_push_pulls(b, true), NULL);
#endif
    const uint64_t bb = kvbm_manager_block_bytes(a);
    bytes = bb * nb;
    side sa = {.m = a, .pc = kvbm_peer_config_default()}, sb = {.m = b, .pc = kvbm_peer_config_default()};
#ifdef HAVE_PEER_H
    if (keyed) {
      sa.pc.key = sb.pc.key = secret;
      sa.pc.key_len = sb.pc.key_len = sizeof secret;
    }
#endif
    kvbm_error e;
    if (ucx) ucx_pair(&sa.f, &sb.f);
    else check("fabric", kvbm_fabric_inproc_pair("prefill", "decode", &sa.f, &sb.f, &e), &e);
    pthread_t th;
    pthread_create(&th, NULL, attach_thread, &sb);
    attach_thread(&sa);
    pthread_join(th, NULL);
    check("attach a", sa.rc, &sa.e);
    check("attach b", sb.rc, &sb.e);

    /* one prompt of nb full blocks in a's G1, its bytes written */
    size_t nt = (size_t)nb * B + 1;
    uint32_t *tok = malloc(nt * sizeof *tok);
    uint64_t *h = malloc(nb * sizeof *h);
    uint64_t seed = 88172645463325252ull + r;
    for (size_t i = 0; i < nt; i++) tok[i] = (uint32_t)kvbm_bench_xorshift(&seed);
    kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, nt, B, h, nb);
    kvbm_mreq *q;
    check("prefill", kvbm_manager_prefill(a, 0, 0, tok, nt, &q, NULL, &e), &e);
    kvbm_mreq_wait(q, -1, NULL);
    const uint32_t *ids;
    size_t nids;
    kvbm_mreq_blocks(q, &ids, &nids);
    uint32_t *g1 = malloc(nb * sizeof *g1);
    memcpy(g1, ids, nb * sizeof *g1); /* the table dies with the request */
    const kvbm_layout *L = kvbm_manager_layout(a, KVBM_TIER_G1);
    uint8_t *layer = malloc(L->layer_stride);
    for (uint32_t k = 0; k < nb; k++)
      for (uint32_t l = 0; l < layers; l++) {
        for (uint64_t i = 0; i < L->layer_stride; i++) layer[i] = (uint8_t)kvbm_bench_xorshift(&seed);
        check("write", kvbm_manager_block_write(a, KVBM_TIER_G1, g1[k], l, layer, L->layer_stride, &e), &e);
      }
    check("commit", kvbm_mreq_commit(q), NULL);
    kvbm_mreq_destroy(q);

    double t0 = kvbm_bench_now();
    for (uint32_t k = 0; k < nb; k++)
      check("offload", kvbm_manager_offload_block(a, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, &e), &e);
    check("flush", kvbm_manager_peer_flush(a, 0, 60000, &e), &e);
    t_xfer[r] = kvbm_bench_now() - t0;
    kvbm_peer_stats st;
    kvbm_manager_peer_stats_get(a, 0, &st);
    if (st.acked_blocks != nb) kvbm_bench_die(PROG, "%llu of %u blocks acknowledged", (unsigned long long)st.acked_blocks, nb);
    if (pull) t_xfer[r] = pull_back(a, tok, nt, nb, &seed);

    /* the bound: one copy and one hash of the same bytes */
    uint8_t *dst = malloc(bb), key[32] = {0};
    if (keyed) check("frame key", kvbm_fabric_frame_key(secret, sizeof secret, key, &e), &e);
    t0 = kvbm_bench_now();
    uint8_t sum[16], acc = 0;
    for (uint32_t k = 0; k < nb; k++) {
      kvbm_blake3_hasher hs;
      if (keyed) kvbm_blake3_hasher_init_keyed(&hs, key);
      else kvbm_blake3_hasher_init(&hs);
      for (uint32_t l = 0; l < layers; l++) {
        void *p;
        size_t n;
        check("layer", kvbm_manager_block_layer(a, KVBM_TIER_G1, g1[k], l, &p, &n), NULL);
        memcpy(dst + (size_t)l * n, p, n);
        kvbm_blake3_hasher_update(&hs, dst + (size_t)l * n, n);
      }
      kvbm_blake3_hasher_finalize(&hs, sum, 16);
      acc ^= sum[0];
    }
    t_bound[r] = kvbm_bench_now() - t0;
    if (acc == 0x5a && t_bound[r] < 0) puts(""); /* keep the work */
    free(dst);
    free(g1);
    free(layer);
    free(tok);
    free(h);
    kvbm_manager_destroy(a);
    kvbm_manager_destroy(b);
    /* UCX's ends wait for each other's goodbye: destroyed side by side */
    pthread_t td;
    pthread_create(&td, NULL, destroy_thread, sb.f);
    kvbm_fabric_destroy(sa.f);
    pthread_join(td, NULL);
  }
  double ratio[64];
  for (uint32_t r = 0; r < rounds; r++) ratio[r] = t_bound[r] / t_xfer[r];
  kvbm_bench_spread x = kvbm_bench_spread_of(t_xfer, (int)rounds), bo = kvbm_bench_spread_of(t_bound, (int)rounds),
                    ra = kvbm_bench_spread_of(ratio, (int)rounds);
  printf("W4 peer transfer (%s, %s%s): %u blocks of %llu bytes, %u rounds\n",
         pull == 1 ? "OutputCritical pull, read one-sided where mapped" : pull == 2 ? "OutputCritical pull, pushed back"
                                                                         : "PUSH",
         ucx ? "UCX shared memory, one process" : "in-process fabric", keyed ? ", keyed frames" : "", nb, (unsigned long long)(bytes / nb), rounds);
  printf("transfer GB/s: %.2f (median; %.2f..%.2f)\n", bytes / x.median / 1e9, bytes / x.max / 1e9,
         bytes / x.min / 1e9);
  printf("bound (memcpy + %sBLAKE3) GB/s: %.2f (median)\n", keyed ? "keyed " : "", bytes / bo.median / 1e9);
  printf("ratio transfer / bound: %.3f (median; %.3f..%.3f)\n", ra.median, ra.min, ra.max);
  return 0;
}
