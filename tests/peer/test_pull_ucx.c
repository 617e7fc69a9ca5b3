/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pull_ucx.c: the OutputCritical pull over a real UCX fabric, read
 * one-sided and hashed as it lands (issue 22, "pulled blocks").
 *
 * The parent is a manager with output_pull on and a small G1; it offloads
 * two prompts' blocks to the child's manager (the holder), then fills its
 * G1 with another prompt, so that both prompts are held only by the
 * peer. Its prefill of each pulls them back: the holder (protocol version
 * 3) stages each block in a landing block of its own exported zone and
 * sends "KVPB" with the block's kept sum; the parent reads it with
 * kvbm_fabric_read_blocks_hashed (unkeyed; keyed: read, flush, keyed MAC)
 * and checks it before any cache block is taken. The first prompt comes
 * back whole and byte for byte (tu_verify); in the second, the holder's
 * test seam flips a byte of its staged copy after the sum was kept (the
 * exporter's memory changed): that block is refused by checksum (keyed:
 * by MAC, KVBM_EAUTH), counted, not cached, and the match ends before it.
 * The pulled path, not a push, carried them: the parent's fabric counts
 * one one-sided read per pulled block. Over shared memory with a
 * FullyContiguous holder (its zone mapped here: read and hashed in one
 * pass), keyed and unkeyed. Where the zone is not mapped (TCP; a
 * LayerSeparate holder) the pull is asked as before (KVPL) and pushed
 * back: no read, the same checks, the same refusal.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "kvbm/fabric.h"
#include "kvbm/hash.h"
#include "kvbm/peer.h"
#include "peer/testing.h"
#include "tier/tier_testutil.h"

static const char kKey[] = "the pull test's shared fabric secret";
static const uint8_t kPeerKey[32] = "the peers' cluster key, 32 bytes";
#define NT 25 /* tokens per prompt: (25 - 1) / 4 = 6 blocks matched */
#define NBLK 6

static kvbm_fabric_ucx_config ucx_config(const char *name, const char *tls) {
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
  c.transports = tls;
  c.net_devices = "lo";
  c.timeout_ms = 20000;
  return c;
}

static kvbm_peer_config peer_config(bool keyed) {
  kvbm_peer_config c = kvbm_peer_config_default();
  c.timeout_ms = 20000;
  if (keyed) {
    c.key = kPeerKey;
    c.key_len = sizeof kPeerKey;
  }
  return c;
}

/* The holder: attaches, serves (its link thread answers the pulls),
 * leaves when the parent says so. The third block it stages for the
 * second pull (its 9th pulled send) has a byte flipped after its sum. */
static void holder_main(uint16_t port, int done_fd, const char *tls, bool keyed, kvbm_layout_kind kind) {
  kvbm_fabric_ucx_config uc = ucx_config("holder", tls);
  kvbm_fabric *f = NULL;
  if (kvbm_fabric_ucx_connect(&uc, "127.0.0.1", port, &f, NULL) != KVBM_OK) _exit(2);
  kvbm_manager_config c = tu_config(NULL, 32, 0, 0);
  c.g1_kind = kind;
  kvbm_manager *m = NULL;
  if (kvbm_manager_create(&c, &m, NULL) != KVBM_OK) _exit(3);
  if (kvbm__peer_corrupt_offloads(m, 1ull << (NBLK + 2)) != KVBM_OK) _exit(4);
  kvbm_peer_config pc = peer_config(keyed);
  uint32_t peer;
  if (kvbm_manager_attach(m, f, &pc, &peer, NULL) != KVBM_OK) _exit(5);
  char word;
  if (read(done_fd, &word, 1) != 1) _exit(6);
  kvbm_manager_destroy(m);
  kvbm_fabric_destroy(f);
  _exit(0);
}

static size_t match_on(kvbm_manager *m, const uint32_t *tok, size_t n, size_t *good) {
  kvbm_mreq *r;
  kvbm_mreq_info info;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, tok, n, &r, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  *good = tu_verify(m, r, info.matched_tokens / 4);
  kvbm_mreq_destroy(r);
  return info.matched_tokens / 4;
}

/* read: the pull is expected to be read one-sided (the holder's zone
 * mapped here), else pushed back. */
static void run_pull(const char *tls, bool keyed, kvbm_layout_kind holder_kind, bool read) {
  kvbm_fabric_ucx_config uc = ucx_config("puller", tls);
  kvbm_fabric_listener *l;
  kvbm_error e = {0};
  assert_int_equal(kvbm_fabric_ucx_listen(&uc, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  int done[2];
  assert_int_equal(pipe(done), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(done[1]);
    kvbm_fabric_listener_destroy(l);
    holder_main(port, done[0], tls, keyed, holder_kind);
  }
  close(done[0]);
  kvbm_fabric *f = NULL;
  if (kvbm_fabric_ucx_accept(l, &f, &e) != KVBM_OK) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("accept: %s", e.msg);
  }
  kvbm_fabric_listener_destroy(l);
  kvbm_manager_config c = tu_config(NULL, 12, 0, 0);
  c.output_pull = true;
  c.pull_timeout_ms = 20000;
  c.offload_threshold_blocks = 0;
  kvbm_manager *m = NULL;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  kvbm_peer_config pc = peer_config(keyed);
  uint32_t peer;
  if (kvbm_manager_attach(m, f, &pc, &peer, &e) != KVBM_OK) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("attach: %s", e.msg);
  }
  uint32_t *p = tu_prompt(1000, NT), *q = tu_prompt(5000, NT), *other = tu_prompt(40000, 45);
  uint64_t hp[NBLK], hq[NBLK];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, p, NT, 4, hp, NBLK);
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, q, NT, 4, hq, NBLK);
  for (int j = 0; j < 2; j++) { /* one prompt at a time: G1 holds one */
    assert_int_equal(tu_run(m, j ? q : p, NT, NULL, NULL), 0);
    for (int k = 0; k < NBLK; k++)
      assert_int_equal(kvbm_manager_offload_block(m, peer, (j ? hq : hp)[k], KVBM_PHASE_OUTPUT_CRITICAL, &e),
                       KVBM_OK);
    if (kvbm_manager_peer_flush(m, peer, 20000, &e) != KVBM_OK) fail_msg("flush: %s", e.msg);
  }
  /* G1 (12 blocks) taken by another prompt: p and q are the peer's only */
  assert_int_equal(tu_run(m, other, 45, NULL, NULL), 0);
  kvbm_block_location loc;
  assert_int_equal(kvbm_manager_block_location(m, hp[0], &loc), KVBM_OK);
  assert_true(loc.remote && !loc.held);
  kvbm_peer_stats st0;
  assert_int_equal(kvbm_manager_peer_stats_get(m, peer, &st0), KVBM_OK);
  assert_int_equal(st0.peer_version, 3);
  kvbm_fabric_stats fs0, fs1;
  kvbm_fabric_stats_get(f, &fs0);

  /* p: pulled back whole, byte for byte */
  size_t good = 0;
  assert_int_equal(match_on(m, p, NT, &good), NBLK);
  assert_int_equal(good, NBLK);
  /* q: its third block changed in the holder's memory after its sum was
   * kept: refused and counted, never cached; the match ends before it */
  assert_int_equal(match_on(m, q, NT, &good), 2);
  assert_int_equal(good, 2);
  assert_int_equal(kvbm_manager_block_location(m, hq[2], &loc), KVBM_OK);
  assert_false(loc.held);

  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(m, peer, &st), KVBM_OK);
  assert_int_equal(st.received - st0.received, 2 * NBLK);
  assert_int_equal(st.ingested - st0.ingested, 2 * NBLK - 1);
  if (keyed) {
    assert_int_equal(st.refused_auth, 1);
    assert_int_equal(st.refused_checksum, 0);
    assert_non_null(strstr(st.last_refusal, "KVBM_EAUTH"));
  } else {
    assert_int_equal(st.refused_checksum, 1);
    assert_non_null(strstr(st.last_refusal, "checksum"));
  }
  assert_int_equal(st.refused_control, 0);
  assert_int_equal(st.pulls_asked, 2);
  /* each block hashed once here, as it was read one-sided (or pushed) */
  kvbm_fabric_stats_get(f, &fs1);
  const uint64_t bb = kvbm_fabric_block_bytes(kvbm_manager_layout(m, KVBM_TIER_G1));
  if (read) { /* only the small KVPB messages came as messages */
    assert_true(fs1.pull_bytes - fs0.pull_bytes < NBLK * bb);
    /* unkeyed: kvbm_fabric_read_blocks_hashed, one counted read a block;
     * keyed: copied out of the mapping by the peers (no fabric read) */
    assert_int_equal(fs1.reads - fs0.reads, keyed ? 0 : 2 * NBLK);
  } else { /* pushed back whole */
    assert_int_equal(fs1.reads - fs0.reads, 0);
    assert_true(fs1.pull_bytes - fs0.pull_bytes >= 2 * NBLK * bb);
  }
  /* (a pushed block refused by its MAC is not counted as hashed: the
   * push path's count, unchanged) */
  const uint64_t hashed_blocks = 2 * NBLK - (keyed && !read ? 1 : 0);
  assert_int_equal(st.received_hashed_bytes - st0.received_hashed_bytes, hashed_blocks * bb);

  assert_int_equal(write(done[1], "k", 1), 1);
  kvbm_manager_destroy(m);
  kvbm_fabric_destroy(f);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(done[1]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("holder failed (%s %d)", WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  free(p);
  free(q);
  free(other);
}

static void test_pull_shm(void **state) {
  (void)state;
  run_pull("shm,self", false, KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
}

static void test_pull_shm_keyed(void **state) {
  (void)state;
  run_pull("shm,self", true, KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
}

static void test_pull_shm_layer_separate(void **state) {
  (void)state;
  run_pull("shm,self", false, KVBM_LAYOUT_LAYER_SEPARATE, false);
}

static void test_pull_tcp(void **state) {
  (void)state;
  run_pull("tcp,self", false, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
}

static void test_pull_tcp_keyed(void **state) {
  (void)state;
  run_pull("tcp,self", true, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull_shm),
      cmocka_unit_test(test_pull_shm_keyed),
      cmocka_unit_test(test_pull_shm_layer_separate),
      cmocka_unit_test(test_pull_tcp),
      cmocka_unit_test(test_pull_tcp_keyed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
