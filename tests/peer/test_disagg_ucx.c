/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_disagg_ucx.c: prefill on one process, decode on another, over the
 * UCX fabric on loopback (issue 12's end-to-end test).
 *
 * The parent is the prefill worker: it computes two prompts, offloads
 * every full block to the decode worker's manager and waits for the
 * acknowledgements; its fabric corrupts the third block of the first
 * prompt in flight (the manager's test seam: one byte changed after the
 * frame was made). The child is the decode worker: it then prefills the
 * same prompts. Its match of the clean prompt is every full block, each
 * byte right; its match of the corrupted one ends before the refused
 * block (it computes from there), and that block is held nowhere. Both
 * sending modes (push: whole framed messages; put: one-sided writes into
 * granted landing blocks, then their headers), each with layouts that
 * differ (LayerSeparate on one side, FullyContiguous on the other), over
 * shared memory and over TCP. Keyed (issue 23): the two managers share a
 * cluster key, so frames carry the keyed MAC (the corrupted block is
 * refused by it, KVBM_EAUTH) and every other message the link's MAC
 * (kvbm/peer.h, "Keyed control messages"): across two processes and a
 * real transport, none of the genuine ones is refused.
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

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "decode: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
      _exit(__LINE__ % 250 + 1);                                           \
    }                                                                      \
  } while (0)

static const char kKey[] = "the disaggregation test's shared secret";
static const uint8_t kPeerKey[32] = "the peers' cluster key, 32 bytes";
#define NA 41 /* prompt A: 10 full blocks, block 2 corrupted */
#define NB 37 /* prompt B: 9 full blocks, clean */

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

static kvbm_manager *manager(kvbm_layout_kind kind, uint64_t corrupt) {
  kvbm_manager_config c = tu_config(NULL, 64, 0, 0);
  c.g1_kind = kind;
  kvbm_manager *m = NULL;
  if (kvbm_manager_create(&c, &m, NULL) != KVBM_OK) return NULL;
  if (corrupt) (void)kvbm__peer_corrupt_offloads(m, corrupt);
  return m;
}

/* The decode worker: attaches, waits for the parent's word, prefills. */
static void decode_main(uint16_t port, int go_fd, int done_fd, kvbm_layout_kind kind, const char *tls, bool keyed) {
  kvbm_fabric_ucx_config uc = ucx_config("decode", tls);
  kvbm_fabric *f = NULL;
  kvbm_error e = {0};
  CHECK(kvbm_fabric_ucx_connect(&uc, "127.0.0.1", port, &f, &e) == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_label(f), "ucx") == 0);
  kvbm_manager *m = manager(kind, 0);
  CHECK(m != NULL);
  uint32_t peer;
  kvbm_peer_config dc = kvbm_peer_config_default();
  if (keyed) {
    dc.key = kPeerKey;
    dc.key_len = sizeof kPeerKey;
  }
  CHECK(kvbm_manager_attach(m, f, &dc, &peer, &e) == KVBM_OK);
  char go;
  CHECK(read(go_fd, &go, 1) == 1 && go == 'g');
  uint32_t *a = tu_prompt(1000, NA), *b = tu_prompt(9000, NB);
  /* the clean prompt: every full block matched and right */
  kvbm_mreq *r;
  kvbm_mreq_info info;
  CHECK(kvbm_manager_prefill(m, 0, 0, b, NB, &r, NULL, &e) == KVBM_OK);
  CHECK(kvbm_mreq_wait(r, -1, &info) == KVBM_OK);
  CHECK(info.matched_tokens == 4 * 9);
  CHECK(tu_verify(m, r, 9) == 9);
  kvbm_mreq_destroy(r);
  /* the corrupted one: the match ends before block 2 */
  CHECK(kvbm_manager_prefill(m, 0, 0, a, NA, &r, NULL, &e) == KVBM_OK);
  CHECK(kvbm_mreq_wait(r, -1, &info) == KVBM_OK);
  CHECK(info.matched_tokens == 4 * 2);
  CHECK(tu_verify(m, r, 2) == 2);
  CHECK(kvbm_mreq_must_compute(r, 2));
  kvbm_mreq_destroy(r);
  uint64_t h[10];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, a, NA, 4, h, 10);
  kvbm_block_location loc;
  CHECK(kvbm_manager_block_location(m, h[2], &loc) == KVBM_OK && !loc.held);
  for (int k = 3; k < 10; k++) CHECK(kvbm_manager_block_location(m, h[k], &loc) == KVBM_OK && loc.held);
  kvbm_peer_stats st;
  CHECK(kvbm_manager_peer_stats_get(m, peer, &st) == KVBM_OK);
  CHECK(st.received == 19 && st.ingested == 18);
  CHECK(keyed ? st.refused_auth == 1 : st.refused_checksum == 1);
  CHECK(strstr(st.last_refusal, keyed ? "KVBM_EAUTH" : "checksum") != NULL);
  CHECK(st.keyed == keyed && st.refused_control == 0);
  /* Checked: tell the prefill worker, so that both ends close together. */
  CHECK(write(done_fd, "k", 1) == 1);
  kvbm_manager_destroy(m);
  kvbm_fabric_destroy(f);
  free(a);
  free(b);
  _exit(0);
}

static void run_pair_k(kvbm_disagg_mode mode, kvbm_layout_kind prefill_kind, kvbm_layout_kind decode_kind,
                       const char *tls, bool keyed) {
  kvbm_fabric_ucx_config uc = ucx_config("prefill", tls);
  kvbm_fabric_listener *l;
  kvbm_error e = {0};
  assert_int_equal(kvbm_fabric_ucx_listen(&uc, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  int go[2], done[2];
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(done), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(go[1]);
    close(done[0]);
    kvbm_fabric_listener_destroy(l);
    decode_main(port, go[0], done[1], decode_kind, tls, keyed);
  }
  close(go[0]);
  close(done[1]);
  kvbm_fabric *f = NULL;
  if (kvbm_fabric_ucx_accept(l, &f, &e) != KVBM_OK) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("accept: %s", e.msg);
  }
  kvbm_fabric_listener_destroy(l);
  /* the third block offloaded (block 2 of prompt A) goes bad in flight */
  kvbm_manager *m = manager(prefill_kind, 1u << 2);
  assert_non_null(m);
  kvbm_peer_config pc = kvbm_peer_config_default();
  pc.mode = mode;
  pc.timeout_ms = 20000;
  if (keyed) {
    pc.key = kPeerKey;
    pc.key_len = sizeof kPeerKey;
  }
  uint32_t peer;
  if (kvbm_manager_attach(m, f, &pc, &peer, &e) != KVBM_OK) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("attach: %s", e.msg);
  }
  uint32_t *a = tu_prompt(1000, NA), *b = tu_prompt(9000, NB);
  assert_int_equal(tu_run(m, a, NA, NULL, NULL), 0);
  assert_int_equal(tu_run(m, b, NB, NULL, NULL), 0);
  uint64_t ha[10], hb[9];
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, a, NA, 4, ha, 10);
  kvbm_hash_chain(KVBM_HASH_NATIVE, 0, b, NB, 4, hb, 9);
  for (int k = 0; k < 10; k++)
    assert_int_equal(kvbm_manager_offload_block(m, peer, ha[k], KVBM_PHASE_OUTPUT_CRITICAL, &e), KVBM_OK);
  for (int k = 0; k < 9; k++)
    assert_int_equal(kvbm_manager_offload_block(m, peer, hb[k], KVBM_PHASE_OUTPUT_CRITICAL, &e), KVBM_OK);
  if (kvbm_manager_peer_flush(m, peer, 20000, &e) != KVBM_OK) fail_msg("flush: %s", e.msg);
  kvbm_peer_stats st;
  assert_int_equal(kvbm_manager_peer_stats_get(m, peer, &st), KVBM_OK);
  assert_int_equal(st.sent_blocks, 19);
  assert_int_equal(st.acked_blocks, 18);
  assert_int_equal(st.peer_refused, 1);
  if (mode == KVBM_DISAGG_PUT) assert_int_equal(st.grants_received, 19);
  assert_int_equal(st.keyed, keyed);
  assert_int_equal(st.refused_control, 0);
  assert_int_equal(write(go[1], "g", 1), 1);
  /* The decode worker's word (or its end: a failed check exits), then
   * both ends close at once. */
  char word = 0;
  ssize_t got = read(done[0], &word, 1);
  kvbm_manager_destroy(m);
  kvbm_fabric_destroy(f);
  m = NULL;
  f = NULL;
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(done[0]);
  assert_true(got == 1 && word == 'k');
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("decode worker failed (%s %d): see its line above", WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  close(go[1]);
  free(a);
  free(b);
}

static void run_pair(kvbm_disagg_mode mode, kvbm_layout_kind prefill_kind, kvbm_layout_kind decode_kind,
                     const char *tls) {
  run_pair_k(mode, prefill_kind, decode_kind, tls, false);
}

static void test_push_shm(void **state) {
  (void)state;
  run_pair(KVBM_DISAGG_PUSH, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, "shm,self");
}

static void test_put_shm(void **state) {
  (void)state;
  run_pair(KVBM_DISAGG_PUT, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, "shm,self");
}

static void test_push_tcp(void **state) {
  (void)state;
  run_pair(KVBM_DISAGG_PUSH, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, "tcp,self");
}

static void test_put_tcp(void **state) {
  (void)state;
  run_pair(KVBM_DISAGG_PUT, KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_LAYER_SEPARATE, "tcp,self");
}

static void test_put_shm_keyed(void **state) {
  (void)state;
  run_pair_k(KVBM_DISAGG_PUT, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, "shm,self", true);
}

static void test_push_tcp_keyed(void **state) {
  (void)state;
  run_pair_k(KVBM_DISAGG_PUSH, KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, "tcp,self", true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_shm),
      cmocka_unit_test(test_put_shm),
      cmocka_unit_test(test_push_tcp),
      cmocka_unit_test(test_put_tcp),
      cmocka_unit_test(test_put_shm_keyed),
      cmocka_unit_test(test_push_tcp_keyed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
