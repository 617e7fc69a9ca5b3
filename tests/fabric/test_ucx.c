/* test_ucx.c: the UCX fabric between two processes on loopback (the test
 * forks; the child is the other node). Covers the handshake and labels,
 * small (eager) and large (rendezvous) pushes, one-sided block writes and
 * reads into the peer's registered memory with completion by notification,
 * refusals before any transfer, a peer that dies, a peer that speaks
 * garbage, and a peer that pushes more than allowed. UCX is kept on shared
 * memory and TCP over the loopback device. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "fabric/fabric_impl.h"
#include "fabric/fabric_util.h"
#include "fabric/sidechan.h"

/* In the child: on failure, exit with the line number (cmocka cannot
 * report from a forked process). */
#define CHECK(cond)                                               \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      _exit(__LINE__ % 250 + 1);                                  \
    }                                                             \
  } while (0)

static const char *g_tls = "shm,self";

static kvbm_fabric_ucx_config config(const char *label) {
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.label = label;
  c.transports = g_tls;
  c.net_devices = "lo";
  c.timeout_ms = 15000;
  return c;
}

/* The running test's child, killed by the teardown if the test failed
 * before reaping it (so that it cannot disturb the next test). */
static pid_t g_child = -1;

static int kill_child(void **state) {
  (void)state;
  if (g_child > 0) {
    kill(g_child, SIGKILL);
    waitpid(g_child, NULL, 0);
  }
  g_child = -1;
  return 0;
}

static pid_t fork_child(void) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid > 0) g_child = pid;
  return pid;
}

static void wait_child(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  g_child = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("child failed: %s %d", WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

#define BIG (4u << 20)

/* ---- the main scenario ---- */

static void child_main(uint16_t port) {
  kvbm_fabric_ucx_config c = config("node-a");
  kvbm_fabric *f;
  kvbm_error e;
  CHECK(kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e) == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_peer_label(f), "node-b") == 0);
  CHECK(strcmp(kvbm_fabric_kind(f), "ucx") == 0);

  /* two pushes: small and large; flush waits for the peer to pull both */
  unsigned char *big = malloc(BIG);
  test_pattern(big, BIG, 5);
  kvbm_fabric_handle h1, h2;
  CHECK(kvbm_fabric_push(f, "hello", 5, &h1, NULL) == KVBM_OK);
  CHECK(kvbm_fabric_push(f, big, BIG, &h2, NULL) == KVBM_OK);
  CHECK(h1.id == 1 && h2.id == 2);
  CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);

  /* the peer's block set */
  kvbm_fabric_handle h;
  size_t len;
  CHECK(kvbm_fabric_next(f, 15000, &h, &len, &e) == KVBM_OK);
  uint8_t *wire = malloc(len);
  CHECK(kvbm_fabric_pull(f, h, wire, len, &len, 15000, &e) == KVBM_OK);
  kvbm_fabric_remote_set *rs;
  CHECK(kvbm_fabric_import(f, wire, len, &rs, &e) == KVBM_OK);
  free(wire);
  const kvbm_layout_desc *rd = kvbm_fabric_remote_desc(rs);
  CHECK(rd->block_set_id == 77);
  uint64_t nb = rd->layout.config.num_blocks;
  size_t bb = kvbm_fabric_block_bytes(&rd->layout);
  unsigned char *src = malloc(nb * bb);
  for (uint64_t b = 0; b < nb; b++) {
    test_pattern(src + b * bb, bb, 1000 + b);
    CHECK(kvbm_fabric_write_block(f, rs, b, src + b * bb, bb, &e) == KVBM_OK);
  }
  /* refused before any transfer */
  CHECK(kvbm_fabric_write_block(f, rs, nb, src, bb, &e) == KVBM_ERANGE);
  CHECK(kvbm_fabric_write(f, rs, 0, rd->layout.region_size - 8, src, 16, &e) == KVBM_ERANGE);
  CHECK(kvbm_fabric_read(f, rs, rd->num_regions, 0, src, 1, &e) == KVBM_ERANGE);
  /* completion by notification: flush, then tell */
  CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);
  uint64_t done = nb;
  CHECK(kvbm_fabric_push(f, &done, sizeof done, NULL, NULL) == KVBM_OK);

  /* read back what the peer changed after our notification */
  CHECK(kvbm_fabric_next(f, 15000, &h, &len, &e) == KVBM_OK);
  uint64_t changed;
  CHECK(kvbm_fabric_pull(f, h, &changed, sizeof changed, &len, 15000, &e) == KVBM_OK && len == 8);
  unsigned char *back = malloc(bb), *want = malloc(bb);
  CHECK(kvbm_fabric_read_block(f, rs, changed, back, bb, &e) == KVBM_OK);
  CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);
  test_pattern(want, bb, 5000 + changed);
  CHECK(memcmp(back, want, bb) == 0);
  CHECK(kvbm_fabric_read_block(f, rs, 0, back, bb, &e) == KVBM_OK);
  CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);
  CHECK(memcmp(back, src, bb) == 0);
  CHECK(kvbm_fabric_push(f, "ok", 2, NULL, NULL) == KVBM_OK);
  CHECK(kvbm_fabric_flush(f, 15000, &e) == KVBM_OK);

  kvbm_fabric_remote_set_release(rs);
  kvbm_fabric_destroy(f);
  free(big);
  free(src);
  free(back);
  free(want);
  _exit(0);
}

static void run_main(kvbm_layout_kind kind, bool fabric_storage) {
  kvbm_fabric_ucx_config c = config("node-b");
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  assert_true(port > 0);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    child_main(port);
  }
  kvbm_fabric *f;
  if (kvbm_fabric_ucx_accept(l, &f, &e) != KVBM_OK) fail_msg("accept: %s", e.msg);
  kvbm_fabric_listener_destroy(l);
  assert_string_equal(kvbm_fabric_peer_label(f), "node-a");
  assert_string_equal(kvbm_fabric_label(f), "node-b");

  kvbm_fabric_handle h;
  size_t len;
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  assert_int_equal(h.id, 1);
  assert_int_equal(len, 5);
  kvbm_fabric_handle h2;
  assert_int_equal(kvbm_fabric_next(f, 15000, &h2, &len, &e), KVBM_OK);
  assert_int_equal(h2.id, 2);
  assert_int_equal(len, BIG);
  unsigned char *big = malloc(BIG), *want = malloc(BIG);
  test_pattern(want, BIG, 5);
  /* too small first: the payload stays and can be pulled after */
  assert_int_equal(kvbm_fabric_pull(f, h2, big, BIG - 1, &len, 0, &e), KVBM_ETOOLONG);
  assert_int_equal(kvbm_fabric_pull(f, h2, big, BIG, &len, 15000, &e), KVBM_OK);
  assert_memory_equal(big, want, BIG);
  char small[8];
  assert_int_equal(kvbm_fabric_pull(f, h, small, sizeof small, &len, 0, &e), KVBM_OK);
  assert_memory_equal(small, "hello", 5);
  assert_int_equal(kvbm_fabric_pull(f, h, small, sizeof small, &len, 0, &e), KVBM_ENOTFOUND);

  /* expose a block set, let the peer write it */
  test_set ts;
  if (fabric_storage)
    assert_int_equal(test_set_make_fabric(&ts, f, kind, 5, 4, 77), KVBM_OK);
  else
    assert_int_equal(test_set_make(&ts, kind, 5, 4, 77), KVBM_OK);
  kvbm_fabric_local_set *ls;
  assert_int_equal(kvbm_fabric_register(f, &ts.desc, &ls, &e), KVBM_OK);
  uint8_t *wire;
  size_t wlen;
  assert_int_equal(kvbm_fabric_export(ls, &wire, &wlen, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_push(f, wire, wlen, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  uint64_t done = 0;
  assert_int_equal(kvbm_fabric_pull(f, h, &done, sizeof done, &len, 15000, &e), KVBM_OK);
  assert_int_equal(done, 5);
  free(wire);
  size_t bb = kvbm_fabric_block_bytes(&ts.desc.layout);
  unsigned char *blk = malloc(bb), *exp = malloc(bb);
  for (uint64_t b = 0; b < 5; b++) {
    test_set_block(&ts, b, blk);
    test_pattern(exp, bb, 1000 + b);
    assert_memory_equal(blk, exp, bb);
  }
  /* change block 3 locally, tell the peer, which reads it */
  test_pattern(exp, bb, 5003);
  for (uint64_t layer = 0; layer < 4; layer++) {
    kvbm_slice s;
    assert_int_equal(kvbm_layout_block_layer(&ts.desc.layout, 3, layer, &s, NULL), KVBM_OK);
    memcpy((char *)ts.region[s.region] + s.offset, exp + layer * ts.desc.layout.layer_stride, s.size);
  }
  uint64_t changed = 3;
  assert_int_equal(kvbm_fabric_push(f, &changed, sizeof changed, NULL, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_pull(f, h, small, sizeof small, &len, 15000, &e), KVBM_OK);
  assert_memory_equal(small, "ok", 2);
  /* the peer is done and closes: nothing more will come */
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_ECLOSED);
  kvbm_fabric_local_set_release(ls);
  test_set_free(&ts);
  kvbm_fabric_destroy(f);
  wait_child(pid);
  free(big);
  free(want);
  free(blk);
  free(exp);
}

static void test_shm_contiguous(void **state) {
  (void)state;
  g_tls = "shm,self";
  run_main(KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
}

/* Receiving blocks into memory the fabric allocated (the fast path). */
static void test_shm_fabric_storage(void **state) {
  (void)state;
  g_tls = "shm,self";
  run_main(KVBM_LAYOUT_LAYER_SEPARATE, true);
}

static void test_shm_layer_separate(void **state) {
  (void)state;
  g_tls = "shm,self";
  run_main(KVBM_LAYOUT_LAYER_SEPARATE, false);
}

static void test_tcp_loopback(void **state) {
  (void)state;
  g_tls = "tcp,self";
  run_main(KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
  g_tls = "shm,self";
}

/* ---- failures ---- */

/* The peer connects, then dies without closing: the survivor's calls end
 * with KVBM_ECLOSED instead of hanging, and destroy returns. */
static void peer_dies(void) {
  kvbm_fabric_ucx_config c = config("survivor");
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, NULL, 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    kvbm_fabric_ucx_config cc = config("doomed");
    kvbm_fabric *f;
    CHECK(kvbm_fabric_ucx_connect(&cc, NULL, port, &f, NULL) == KVBM_OK);
    CHECK(kvbm_fabric_push(f, "x", 1, NULL, NULL) == KVBM_OK);
    CHECK(kvbm_fabric_flush(f, 15000, NULL) == KVBM_OK);
    _exit(0); /* no destroy: the process simply vanishes */
  }
  kvbm_fabric *f;
  assert_int_equal(kvbm_fabric_ucx_accept(l, &f, &e), KVBM_OK);
  kvbm_fabric_listener_destroy(l);
  kvbm_fabric_handle h;
  size_t len;
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  char b;
  assert_int_equal(kvbm_fabric_pull(f, h, &b, 1, &len, 0, &e), KVBM_OK);
  /* next() keeps our worker running, which the child's flush needs (over
   * TCP the flush waits for our acknowledgement) */
  int rc = kvbm_fabric_next(f, 15000, &h, &len, &e);
  assert_int_equal(rc, KVBM_ECLOSED);
  wait_child(pid);
  rc = kvbm_fabric_push(f, "y", 1, NULL, &e);
  assert_int_equal(rc, KVBM_ECLOSED);
  double t0 = (double)kvbm__sc_now_ms();
  kvbm_fabric_destroy(f);
  assert_true((double)kvbm__sc_now_ms() - t0 < 5000);
}

static void test_peer_dies(void **state) {
  (void)state;
  g_tls = "shm,self";
  peer_dies();
}

static void test_peer_dies_tcp(void **state) {
  (void)state;
  g_tls = "tcp,self";
  peer_dies();
  g_tls = "shm,self";
}

/* A TCP client that is not a fabric: accept says so (KVBM_EPROTO); one that
 * says nothing: accept times out. */
static void test_bad_peers(void **state) {
  (void)state;
  kvbm_fabric_ucx_config c = config("strict");
  c.timeout_ms = 500;
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);

  const char *junk[] = {"GET / HTTP/1.0\r\n\r\n", "\x10\x00\x00\x00KVFU\x09\x00\x00\x00xxxxxxxx",
                        "\x14\x00\x00\x00KVFU\x01\x00\x00\x00\xff\x00\x00\x00\x01\x00\x00\x00" "abcd"};
  size_t junk_len[] = {18, 20, 24};
  for (int i = 0; i < 3; i++) {
    int fd;
    assert_int_equal(kvbm__sc_connect("127.0.0.1", port, 1000, &fd, NULL), KVBM_OK);
    assert_int_equal(kvbm__sc_send_all(fd, junk[i], junk_len[i], kvbm__sc_deadline(1000), NULL), KVBM_OK);
    kvbm_fabric *f = NULL;
    int rc = kvbm_fabric_ucx_accept(l, &f, &e);
    if (rc != KVBM_EPROTO) fail_msg("junk %d: %s (%s)", i, kvbm_status_name(rc), e.msg);
    assert_null(f);
    close(fd);
  }
  /* silent peer */
  int fd;
  assert_int_equal(kvbm__sc_connect("127.0.0.1", port, 1000, &fd, NULL), KVBM_OK);
  kvbm_fabric *f = NULL;
  assert_int_equal(kvbm_fabric_ucx_accept(l, &f, &e), KVBM_ETIMEDOUT);
  close(fd);
  /* nobody at all */
  assert_int_equal(kvbm_fabric_ucx_accept(l, &f, &e), KVBM_ETIMEDOUT);
  kvbm_fabric_listener_destroy(l);

  /* nobody listening */
  c.timeout_ms = 200;
  assert_int_equal(kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e), KVBM_ETIMEDOUT);
  /* bad configs */
  kvbm_fabric_ucx_config bad = c;
  bad.timeout_ms = 0;
  assert_int_equal(kvbm_fabric_ucx_connect(&bad, "127.0.0.1", 1, &f, &e), KVBM_EINVAL);
  bad = c;
  bad.label = "";
  assert_int_equal(kvbm_fabric_ucx_listen(&bad, NULL, 0, &l, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_ucx_connect(&c, "127.0.0.1", 0, &f, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_ucx_connect(&c, "no-such-host.invalid", 5, &f, &e), KVBM_EINVAL);
}

/* The peer pushes more than this end accepts: a protocol error, reported
 * by next(), and nothing allocated for it. */
static void test_payload_limit(void **state) {
  (void)state;
  kvbm_fabric_ucx_config c = config("small");
  c.max_payload = 1000;
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, NULL, 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    kvbm_fabric_ucx_config cc = config("pushy");
    kvbm_fabric *f;
    CHECK(kvbm_fabric_ucx_connect(&cc, NULL, port, &f, NULL) == KVBM_OK);
    static char buf[5000];
    CHECK(kvbm_fabric_push(f, buf, 999, NULL, NULL) == KVBM_OK);
    CHECK(kvbm_fabric_push(f, buf, sizeof buf, NULL, NULL) == KVBM_OK);
    kvbm_fabric_flush(f, 2000, NULL); /* the peer never pulls the big one */
    kvbm_fabric_destroy(f);
    _exit(0);
  }
  kvbm_fabric *f;
  assert_int_equal(kvbm_fabric_ucx_accept(l, &f, &e), KVBM_OK);
  kvbm_fabric_listener_destroy(l);
  kvbm_fabric_handle h;
  size_t len;
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  assert_int_equal(len, 999);
  int rc = kvbm_fabric_next(f, 15000, &h, &len, &e);
  assert_int_equal(rc, KVBM_EPROTO);
  assert_non_null(strstr(e.msg, "limit"));
  /* sticky */
  assert_int_equal(kvbm_fabric_push(f, "x", 1, NULL, &e), KVBM_EPROTO);
  kvbm_fabric_destroy(f);
  wait_child(pid);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_shm_contiguous, kill_child),
      cmocka_unit_test_teardown(test_shm_layer_separate, kill_child),
      cmocka_unit_test_teardown(test_shm_fabric_storage, kill_child),
      cmocka_unit_test_teardown(test_tcp_loopback, kill_child),
      cmocka_unit_test_teardown(test_peer_dies, kill_child),
      cmocka_unit_test_teardown(test_peer_dies_tcp, kill_child),
      cmocka_unit_test_teardown(test_bad_peers, kill_child),
      cmocka_unit_test_teardown(test_payload_limit, kill_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
