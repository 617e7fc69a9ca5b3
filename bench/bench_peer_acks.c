/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_peer_acks.c: how fast a manager takes its peer's acknowledgements
 * with its remote index full (issue 24: every acknowledgement used to scan
 * all of the index's slots, 131072 at the default).
 *
 * A manager is attached over the in-process fabric to a raw fabric end
 * that plays the peer: it takes the block messages the manager pushes and
 * answers each with a KVAC. Per round, the manager offloads a batch of
 * distinct blocks, the peer drains them, then pushes one acknowledgement
 * per block; timed from the first acknowledgement pushed until the
 * manager's stats count them all (its link thread's work). The first
 * `index` acknowledgements fill the remote index; the next `--acks` are
 * timed with it full. The bound, in the same run: the same acknowledgements
 * into a 64-block index (the same work minus the index's size); the ratio
 * full / small is about 1 when an acknowledgement's cost does not depend
 * on the index's size.
 *
 * --keyed (issue 23, keyed control messages): the manager and the raw
 * peer share a cluster key, so every message after the hellos carries the
 * link's MAC (peer/ctl.h): the manager seals each block message it
 * pushes and opens each acknowledgement, the raw peer the other way
 * round (with the same kvbm__ctl_* code). The cost of the MAC is then
 * the difference between a --keyed run and a plain one, best counted in
 * instructions (docs/areas/fabric.md, "Keyed control messages: cost"):
 *   valgrind --tool=callgrind bench_peer_acks --index 64 --acks 4096 [--keyed]
 *
 * usage: bench_peer_acks [--index N (65536, the default)] [--acks N (32768)]
 *                        [--batch N (64): blocks per round] [--keyed]
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabric/hello.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/manager.h"
#include "kvbm/peer.h"
#include "peer/ctl.h"

static const uint8_t KEY[32] = "bench_peer_acks: a cluster key."; /* --keyed */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rc, const kvbm_error *e) {
  fprintf(stderr, "bench_peer_acks: %s: %s %s\n", what, kvbm_status_name(rc), e ? e->msg : "");
  exit(1);
}

typedef struct raw_peer {
  kvbm_fabric *f;
  kvbm_storage *s;
  kvbm_fabric_local_set *ls;
  kvbm_fabric_remote_set *rs;
  bool keyed;
  uint8_t tx[KVBM__CTL_KEY], rx[KVBM__CTL_KEY];
  uint64_t tx_seq;
} raw_peer;

/* Pushes m (sealed when keyed: room for the trailer after len). */
static int raw_push(raw_peer *r, uint8_t *m, size_t len, kvbm_error *e) {
  if (r->keyed) {
    kvbm__ctl_seal(r->tx, m, len, r->tx_seq++);
    len += KVBM__CTL_TRAILER;
  }
  return kvbm_fabric_push(r->f, m, len, NULL, e);
}

/* Keyed: the hellos' nonces make the directions' keys, then the
 * confirmations both ways (kvbm/peer.h, "Keyed control messages"). */
static bool raw_confirm(raw_peer *h, const uint8_t *mine, size_t mine_len, const uint8_t *theirs,
                        size_t theirs_len) {
  uint8_t ctl[KVBM__CTL_KEY], c[72 + KVBM__CTL_TRAILER], got[128];
  kvbm__ctl_key(KEY, sizeof KEY, ctl, NULL);
  const uint8_t *n_mine = mine + mine_len - KVBM__CTL_NONCE, *n_theirs = theirs + theirs_len - KVBM__CTL_NONCE;
  kvbm__ctl_dir_key(ctl, n_mine, n_theirs, h->tx);
  kvbm__ctl_dir_key(ctl, n_theirs, n_mine, h->rx);
  memcpy(c, "KVAU", 4);
  memset(c + 4, 0, 4);
  kvbm_blake3_hash(mine, mine_len, c + 8, 32);
  kvbm_blake3_hash(theirs, theirs_len, c + 40, 32);
  if (raw_push(h, c, 72, NULL)) return false;
  kvbm_fabric_handle hd;
  size_t len, n;
  uint64_t seq;
  return kvbm_fabric_next(h->f, 5000, &hd, &len, NULL) == KVBM_OK && len <= sizeof got &&
         kvbm_fabric_pull(h->f, hd, got, sizeof got, &len, 1000, NULL) == KVBM_OK &&
         kvbm__ctl_open(h->rx, got, len, &n, &seq, NULL) == KVBM_OK;
}

/* The peer's hello (a landing zone of the manager's block shape), then the
 * manager's hello imported. */
static void *raw_hello(void *arg) {
  raw_peer *h = arg;
  kvbm_layout_config lc = {.num_blocks = 2, .num_layers = 3, .outer_dim = 2, .page_size = 4, .inner_dim = 8,
                           .dtype_size = 2, .alignment = 256};
  kvbm_layout lay;
  kvbm_layout_desc d = {0};
  uint8_t *wire;
  size_t wlen;
  if (kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, NULL) ||
      kvbm_fabric_storage_create(h->f, &lay, &h->s, NULL) || kvbm_storage_describe(h->s, &lay, 7, &d, NULL) ||
      kvbm_fabric_register(h->f, &d, &h->ls, NULL) || kvbm_fabric_export(h->ls, &wire, &wlen, NULL))
    return NULL;
  kvbm_layout_desc_release(&d);
  const size_t extra = h->keyed ? KVBM__CTL_NONCE : 0;
  uint8_t *msg = calloc(1, 32 + wlen + extra);
  memcpy(msg, "KVPH", 4);
  msg[4] = h->keyed ? 2 : 1;
  msg[16] = h->keyed ? 1 : 0; /* flags: keyed, a nonce after the export */
  for (int i = 0; i < 8; i++) msg[24 + i] = (uint8_t)((uint64_t)wlen >> (8 * i));
  memcpy(msg + 32, wire, wlen);
  if (h->keyed && kvbm__hello_nonce(msg + 32 + wlen, NULL)) return NULL;
  kvbm_fabric_push(h->f, msg, 32 + wlen + extra, NULL, NULL);
  free(wire);
  kvbm_fabric_handle hd;
  size_t len;
  if (kvbm_fabric_next(h->f, 5000, &hd, &len, NULL)) {
    free(msg);
    return NULL;
  }
  uint8_t *buf = malloc(len);
  if (kvbm_fabric_pull(h->f, hd, buf, len, &len, 1000, NULL) == KVBM_OK &&
      kvbm_fabric_import(h->f, buf + 32, len - 32 - extra, &h->rs, NULL) == KVBM_OK && h->keyed &&
      !raw_confirm(h, msg, 32 + wlen + extra, buf, len)) {
    kvbm_fabric_remote_set_release(h->rs);
    h->rs = NULL;
  }
  free(buf);
  free(msg);
  return NULL;
}

/* Offloads h[from..to), drains them at the peer, acknowledges them all:
 * the seconds until the manager counted every acknowledgement. */
static double round_trip(kvbm_manager *m, raw_peer *r, const uint64_t *h, size_t from, size_t to,
                         uint64_t acked_before) {
  kvbm_error e;
  for (size_t k = from; k < to; k++) {
    int rc = kvbm_manager_offload_block(m, 0, h[k], KVBM_PHASE_OUTPUT_CRITICAL, &e);
    if (rc) die("offload", rc, &e);
  }
  static uint8_t buf[4096];
  for (size_t k = from; k < to; k++) {
    kvbm_fabric_handle hd;
    size_t n;
    int rc = kvbm_fabric_next(r->f, 5000, &hd, &n, &e);
    if (!rc) rc = kvbm_fabric_pull(r->f, hd, buf, sizeof buf, &n, 1000, &e);
    size_t body;
    uint64_t seq;
    if (!rc && r->keyed) rc = kvbm__ctl_open(r->rx, buf, n, &body, &seq, &e); /* the receiver's check */
    if (rc) die("peer: pull", rc, &e);
  }
  double t0 = now_s();
  for (size_t k = from; k < to; k++) {
    uint8_t ack[16 + KVBM__CTL_TRAILER] = {'K', 'V', 'A', 'C'};
    for (int i = 0; i < 8; i++) ack[8 + i] = (uint8_t)(h[k] >> (8 * i));
    int rc = raw_push(r, ack, 16, &e);
    if (rc) die("peer: push", rc, &e);
  }
  kvbm_peer_stats st;
  do {
    sched_yield();
    kvbm_manager_peer_stats_get(m, 0, &st);
  } while (st.acked_blocks < acked_before + (to - from) && !st.closed);
  if (st.closed) die("the link closed", KVBM_ECLOSED, NULL);
  return now_s() - t0;
}

/* acks/s of `acks` acknowledgements after `fill` ones, index of `index`. */
static double run(uint32_t index, size_t fill, size_t acks, size_t batch, bool keyed) {
  kvbm_manager_config c = kvbm_manager_config_default();
  c.block_size = 4;
  c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 3, .outer_dim = 2, .page_size = 4, .inner_dim = 8,
                                  .dtype_size = 2, .alignment = 256};
  size_t nb = fill + acks;
  c.g1_blocks = (uint32_t)nb + 8;
  kvbm_manager *m;
  kvbm_error e;
  int rc = kvbm_manager_create(&c, &m, &e);
  if (rc) die("create", rc, &e);
  raw_peer r = {.keyed = keyed};
  kvbm_fabric *fm;
  if ((rc = kvbm_fabric_inproc_pair("prefill", "peer", &fm, &r.f, &e))) die("fabric", rc, &e);
  pthread_t th;
  pthread_create(&th, NULL, raw_hello, &r);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.remote_index_blocks = index;
  if (keyed) {
    pc.key = KEY;
    pc.key_len = sizeof KEY;
  }
  uint32_t peer;
  if ((rc = kvbm_manager_attach(m, fm, &pc, &peer, &e))) die("attach", rc, &e);
  pthread_join(th, NULL);
  if (!r.rs) die("the raw peer's hello", KVBM_EPROTO, NULL);
  /* one prompt of nb full blocks, committed (its bytes do not matter) */
  size_t nt = nb * 4 + 1;
  uint32_t *tok = malloc(nt * sizeof *tok);
  uint64_t *h = malloc(nb * sizeof *h);
  for (size_t i = 0; i < nt; i++) tok[i] = (uint32_t)(i * 2654435761u + index);
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, tok, nt, 4, h, nb);
  kvbm_mreq *q;
  if ((rc = kvbm_manager_prefill(m, 0, 0, tok, nt, &q, NULL, &e))) die("prefill", rc, &e);
  kvbm_mreq_wait(q, -1, NULL);
  if ((rc = kvbm_mreq_commit(q))) die("commit", rc, NULL);
  kvbm_mreq_destroy(q);
  uint64_t acked = 0;
  for (size_t k = 0; k < fill; k += batch) {
    size_t to = k + batch < fill ? k + batch : fill;
    round_trip(m, &r, h, k, to, acked);
    acked += to - k;
  }
  double t = 0;
  for (size_t k = fill; k < nb; k += batch) {
    size_t to = k + batch < nb ? k + batch : nb;
    t += round_trip(m, &r, h, k, to, acked);
    acked += to - k;
  }
  kvbm_manager_destroy(m);
  kvbm_fabric_remote_set_release(r.rs);
  kvbm_fabric_local_set_release(r.ls);
  kvbm_storage_release(r.s);
  kvbm_fabric_destroy(r.f);
  kvbm_fabric_destroy(fm);
  free(tok);
  free(h);
  return (double)acks / t;
}

int main(int argc, char **argv) {
  uint32_t index = 65536;
  size_t acks = 32768, batch = 64;
  bool keyed = false;
  for (int i = 1; i < argc; i += 2) {
    if (!strcmp(argv[i], "--keyed")) {
      keyed = true;
      i--;
    } else if (i + 1 >= argc) {
      fprintf(stderr, "usage: bench_peer_acks [--index N] [--acks N] [--batch N] [--keyed]\n");
      return 2;
    } else if (!strcmp(argv[i], "--index")) index = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--acks")) acks = strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--batch")) batch = strtoul(argv[i + 1], NULL, 10);
    else {
      fprintf(stderr, "usage: bench_peer_acks [--index N] [--acks N] [--batch N] [--keyed]\n");
      return 2;
    }
  }
  if (batch > index) batch = index; /* every ack in a batch awaited */
  double full = run(index, index, acks, batch, keyed);
  double small = run(64, 64, acks, 64, keyed);
  printf("link: %s\n", keyed ? "keyed (every message MAC'd, peer/ctl.h)" : "unkeyed");
  printf("acks/s, remote index of %u full: %.0f\n", index, full);
  printf("acks/s, remote index of 64 full (bound): %.0f\n", small);
  printf("ratio full / bound: %.3f\n", full / small);
  return 0;
}
