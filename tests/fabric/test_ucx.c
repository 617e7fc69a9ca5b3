/* SPDX-License-Identifier: Apache-2.0 */
/* test_ucx.c: the UCX fabric between two processes on loopback (the test
 * forks; the child is the other node). Covers the handshake, labels and names,
 * small (eager) and large (rendezvous) pushes, one-sided block writes and
 * reads into the peer's registered memory with completion by notification,
 * blocks read and hashed as they land (kvbm_fabric_read_blocks_hashed, the
 * mapped copy-and-hash path and the read-then-hash one), refusals before
 * any transfer, a peer that dies, hostile peers on the
 * side channel (garbage, the 0xff hello that made UCX abort, wrong keys,
 * reflected challenges, tampered hellos, silent and hung-up peers) on
 * either end, and a peer that pushes more than allowed. UCX is kept on
 * shared memory and TCP over the loopback device. */
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
#include "fabric/hello.h"
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
static const char kKey[] = "the shared secret of the fabric tests";
static const char kOtherKey[] = "a secret that is not the shared one";

static kvbm_fabric_ucx_config config(const char *name) {
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
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

/* Every block read and hashed as it lands (kvbm_fabric_read_blocks_hashed:
 * the mapped path over shared memory into fabric storage, a read and a
 * hash otherwise), in an order of our own: each lands whole and its sum is
 * the plain BLAKE3 of its bytes; bad arguments are refused. */
static void read_hashed(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t nb, size_t bb,
                        const unsigned char *src, uint64_t changed) {
  kvbm_error e;
  kvbm_blake3_pool *pool;
  CHECK(kvbm_blake3_pool_create(1, 4096, &pool, &e) == KVBM_OK);
  uint64_t *blocks = calloc(nb, sizeof *blocks);
  void **dsts = calloc(nb, sizeof *dsts);
  unsigned char *got = malloc(nb * bb), *want = malloc(bb);
  uint8_t(*sums)[16] = calloc(nb, 16);
  CHECK(blocks && dsts && got && want && sums);
  memset(got, 0xA5, nb * bb);
  for (uint64_t i = 0; i < nb; i++) {
    blocks[i] = nb - 1 - i;
    dsts[i] = got + i * bb;
  }
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, dsts, nb, pool, &sums[0][0], 16, 15000, &e) == KVBM_OK);
  for (uint64_t i = 0; i < nb; i++) {
    uint64_t b = blocks[i];
    if (b == changed)
      test_pattern(want, bb, 5000 + b);
    else
      memcpy(want, src + b * bb, bb);
    CHECK(memcmp(got + i * bb, want, bb) == 0);
    uint8_t sum[16];
    kvbm_blake3_hash(want, bb, sum, 16);
    CHECK(memcmp(sums[i], sum, 16) == 0);
  }
  /* refused, before any byte moves */
  uint64_t far = nb;
  memset(got, 0xA5, bb);
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, &far, dsts, 1, pool, &sums[0][0], 16, 15000, &e) == KVBM_ERANGE);
  CHECK(strstr(e.msg, "out of range") != NULL);
  CHECK(got[0] == 0xA5);
  void *none = NULL;
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, &none, 1, pool, &sums[0][0], 16, 15000, &e) == KVBM_EINVAL);
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, dsts, 1, NULL, &sums[0][0], 16, 15000, &e) == KVBM_EINVAL);
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, dsts, 0, pool, &sums[0][0], 16, 15000, &e) == KVBM_EINVAL);
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, dsts, 1, pool, &sums[0][0], 0, 15000, &e) == KVBM_EINVAL);
  CHECK(kvbm_fabric_read_blocks_hashed(f, rs, blocks, dsts, 1, pool, &sums[0][0], 65, 15000, &e) == KVBM_EINVAL);
  CHECK(kvbm_fabric_read_blocks_hashed(NULL, rs, blocks, dsts, 1, pool, &sums[0][0], 16, 15000, &e) == KVBM_EINVAL);
  kvbm_blake3_pool_destroy(pool);
  free(blocks);
  free(dsts);
  free(got);
  free(want);
  free(sums);
}

static void child_main(uint16_t port) {
  kvbm_fabric_ucx_config c = config("node-a");
  kvbm_fabric *f;
  kvbm_error e;
  CHECK(kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e) == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_peer_name(f), "node-b") == 0);
  CHECK(strcmp(kvbm_fabric_kind(f), "ucx") == 0);
  CHECK(strcmp(kvbm_fabric_label(f), "ucx") == 0);

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
  read_hashed(f, rs, nb, bb, src, changed);
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
  assert_string_equal(kvbm_fabric_peer_name(f), "node-a");
  assert_string_equal(kvbm_fabric_name(f), "node-b");
  assert_string_equal(kvbm_fabric_label(f), "ucx");

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

/* FullyContiguous in fabric storage: the peer's blocks are mapped, so
 * read_hashed takes the copy-and-hash path. */
static void test_shm_fabric_storage_contiguous(void **state) {
  (void)state;
  g_tls = "shm,self";
  run_main(KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
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

/* ---- hostile peers on the side channel ---- */

/* What the listener's refusal callback heard. */
typedef struct refusals {
  int n;
  int status[64];
} refusals;

static void on_refused(void *user, const char *peer, int status, const char *why) {
  refusals *r = user;
  if (r->n < 64) r->status[r->n] = status;
  r->n++;
  if (!peer || !*peer || !why || !*why) fail_msg("refusal without a peer or a reason");
}

static int count(const refusals *r, int status) {
  int k = 0;
  for (int i = 0; i < r->n && i < 64; i++) k += r->status[i] == status;
  return k;
}

/* The hello of the old, unauthenticated protocol whose 200-byte "worker
 * address" of 0xff made UCX assert and abort the receiver. */
static size_t ff_hello(uint8_t *b) {
  size_t n = 16 + 4 + 200;
  uint32_t v[5] = {(uint32_t)n, 0, 1, 4, 200};
  memcpy(b, v, 4);
  memcpy(b + 4, "KVFU", 4);
  memcpy(b + 8, &v[2], 12);
  memcpy(b + 20, "evil", 4);
  memset(b + 24, 0xff, 200);
  return 4 + n;
}

/* Connects a raw socket to the listener (child side). */
static int raw(uint16_t port) {
  int fd;
  CHECK(kvbm__sc_connect("127.0.0.1", port, 5000, &fd, NULL) == KVBM_OK);
  return fd;
}

/* Waits until the listener closed fd (it refused us). */
static void wait_closed(int fd) {
  char b[256];
  while (kvbm__sc_recv_all(fd, b, 1, kvbm__sc_deadline(10000), NULL) == KVBM_OK) {
  }
  close(fd);
}

/* The child: every kind of bad peer, one after another, while one silent
 * connection stays open; then a good one. */
static void hostile_child(uint16_t port) {
  uint8_t b[512], msg[KVBM__HELLO_AUTH_LEN];
  int silent = raw(port); /* holds a place and says nothing */
  /* connect and close */
  close(raw(port));
  /* the old hello with a 0xff address */
  int fd = raw(port);
  CHECK(kvbm__sc_send_all(fd, b, ff_hello(b), kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  wait_closed(fd);
  /* an HTTP client */
  fd = raw(port);
  CHECK(kvbm__sc_send_all(fd, "GET / HTTP/1.0\r\n\r\n" "0123456789abcdefghijklmno", 43, kvbm__sc_deadline(5000),
                         NULL) == KVBM_OK);
  wait_closed(fd);
  /* a valid challenge, then a proof of random bytes */
  uint8_t key[KVBM__HELLO_KEY], nonce[KVBM__HELLO_NONCE];
  kvbm__hs hs;
  fd = raw(port);
  CHECK(kvbm__hello_nonce(nonce, NULL) == KVBM_OK);
  CHECK(kvbm__hello_derive(kOtherKey, sizeof kOtherKey - 1, key, NULL) == KVBM_OK);
  kvbm__hs_init(&hs, key, KVBM__ROLE_CONNECT, nonce);
  kvbm__hs_challenge(&hs, msg);
  CHECK(kvbm__sc_send_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  memcpy(msg, "KVFP\x01\x00\x00\x00", 8);
  CHECK(kvbm__hello_nonce(msg + 8, NULL) == KVBM_OK);
  CHECK(kvbm__sc_send_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  wait_closed(fd);
  /* the listener's own challenge sent back to it */
  fd = raw(port);
  CHECK(kvbm__sc_recv_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  CHECK(kvbm__sc_send_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  wait_closed(fd);
  /* a real fabric with a wrong key: both ends see it */
  kvbm_fabric_ucx_config cc = config("wrong-key");
  cc.key = kOtherKey;
  cc.key_len = sizeof kOtherKey - 1;
  kvbm_fabric *f = NULL;
  kvbm_error e;
  CHECK(kvbm_fabric_ucx_connect(&cc, NULL, port, &f, &e) == KVBM_EAUTH && f == NULL);
  /* the right key, then a hello whose MAC does not cover it: the 0xff
   * address again, now after a valid proof */
  fd = raw(port);
  CHECK(kvbm__hello_derive(kKey, sizeof kKey - 1, key, NULL) == KVBM_OK);
  kvbm__hs_init(&hs, key, KVBM__ROLE_CONNECT, nonce);
  kvbm__hs_challenge(&hs, msg);
  CHECK(kvbm__sc_send_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  CHECK(kvbm__sc_recv_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  CHECK(kvbm__hs_take_challenge(&hs, msg, sizeof msg, NULL) == KVBM_OK);
  CHECK(kvbm__hs_proof(&hs, msg, NULL) == KVBM_OK);
  CHECK(kvbm__sc_send_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  CHECK(kvbm__sc_recv_all(fd, msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  CHECK(kvbm__hs_check_proof(&hs, msg, sizeof msg, NULL) == KVBM_OK);
  size_t n;
  uint8_t addr[200];
  memset(addr, 0xff, sizeof addr);
  CHECK(kvbm__hs_hello_encode(&hs, "tamper", addr, sizeof addr, b, sizeof b, &n, NULL) == KVBM_OK);
  b[20] ^= 1; /* one bit of the node name after the MAC was made */
  CHECK(kvbm__sc_send_record(fd, b, n, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  wait_closed(fd);
  /* and a good peer still gets through, while the silent one waits */
  cc = config("good");
  CHECK(kvbm_fabric_ucx_connect(&cc, NULL, port, &f, &e) == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_peer_name(f), "strict") == 0);
  CHECK(kvbm_fabric_push(f, "ok", 2, NULL, NULL) == KVBM_OK);
  CHECK(kvbm_fabric_flush(f, 15000, NULL) == KVBM_OK);
  kvbm_fabric_destroy(f);
  close(silent);
  _exit(0);
}

/* A listener refuses every bad peer, with the right reason, and stays up:
 * the good peer after them is accepted by the same accept call. Before
 * authentication these ended accept (and `fabric-node recv`), and the 0xff
 * hello aborted the process inside UCX. */
static void test_hostile_peers(void **state) {
  (void)state;
  refusals r = {0};
  kvbm_fabric_ucx_config c = config("strict");
  c.on_refused = on_refused;
  c.on_refused_user = &r;
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    hostile_child(port);
  }
  kvbm_fabric *f = NULL;
  if (kvbm_fabric_ucx_accept(l, &f, &e) != KVBM_OK) fail_msg("accept: %s", e.msg);
  assert_string_equal(kvbm_fabric_peer_name(f), "good");
  kvbm_fabric_handle h;
  size_t len;
  char buf[8];
  assert_int_equal(kvbm_fabric_next(f, 15000, &h, &len, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_pull(f, h, buf, sizeof buf, &len, 0, &e), KVBM_OK);
  assert_memory_equal(buf, "ok", 2);
  kvbm_fabric_destroy(f);
  wait_child(pid);
  /* connect-and-close; 0xff hello and HTTP; random proof, wrong key and
   * tampered hello; the reflected challenge */
  if (count(&r, KVBM_ECLOSED) != 1 || count(&r, KVBM_EPROTO) != 3 || count(&r, KVBM_EAUTH) != 3 || r.n != 7) {
    for (int i = 0; i < r.n && i < 64; i++) print_message("refusal %d: %s\n", i, kvbm_status_name(r.status[i]));
    fail_msg("%d refusals", r.n);
  }
  assert_int_equal(kvbm_fabric_listener_refused(l), 7);
  kvbm_fabric_listener_destroy(l);
}

/* A fake listener (child) that answers a connect with `reply` and waits
 * for the connector to hang up, or (reply NULL) hangs up at once. */
static void fake_listener(int lfd, const uint8_t *reply, size_t len) {
  int fd;
  CHECK(kvbm__sc_accept(lfd, 10000, &fd, NULL) == KVBM_OK);
  if (!reply) _exit(0);
  CHECK(kvbm__sc_send_all(fd, reply, len, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
  wait_closed(fd);
  _exit(0);
}

/* The handshake is symmetric, so a fake receiver must not hurt the
 * connecting end either: the 0xff hello, garbage, a hang-up and a listener
 * with another key each give a clear error, not a crash. */
static void test_hostile_listeners(void **state) {
  (void)state;
  uint8_t hello[512];
  size_t hn = ff_hello(hello);
  struct {
    const uint8_t *reply;
    size_t len;
    int want;
  } cases[] = {{hello, hn, KVBM_EPROTO},
               {(const uint8_t *)"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefghijklmn", 43, KVBM_EPROTO},
               {NULL, 0, KVBM_ECLOSED}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int lfd;
    uint16_t port;
    assert_int_equal(kvbm__sc_listen("127.0.0.1", 0, &lfd, &port, NULL), KVBM_OK);
    pid_t pid = fork_child();
    if (pid == 0) fake_listener(lfd, cases[i].reply, cases[i].len);
    close(lfd);
    kvbm_fabric_ucx_config c = config("connector");
    kvbm_fabric *f = NULL;
    kvbm_error e;
    int rc = kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e);
    if (rc != cases[i].want) fail_msg("case %zu: %s (%s)", i, kvbm_status_name(rc), e.msg);
    assert_null(f);
    wait_child(pid);
  }
  /* a real listener with another key */
  kvbm_fabric_ucx_config lc = config("other");
  lc.key = kOtherKey;
  lc.key_len = sizeof kOtherKey - 1;
  lc.timeout_ms = 3000;
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&lc, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric *f = NULL;
    CHECK(kvbm_fabric_ucx_accept(l, &f, NULL) == KVBM_ETIMEDOUT && f == NULL);
    CHECK(kvbm_fabric_listener_refused(l) == 1);
    kvbm_fabric_listener_destroy(l);
    _exit(0);
  }
  kvbm_fabric_listener_destroy(l);
  kvbm_fabric_ucx_config c = config("connector");
  kvbm_fabric *f = NULL;
  int rc = kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e);
  if (rc != KVBM_EAUTH) fail_msg("wrong key: %s (%s)", kvbm_status_name(rc), e.msg);
  assert_non_null(strstr(e.msg, "key"));
  assert_null(f);
  wait_child(pid);
}

/* A silent connection is refused after timeout_ms; sixteen of them do not
 * lock a good peer out (the oldest make room); nobody at all is a
 * timeout; bad configurations are refused. */
static void test_silent_peers_and_configs(void **state) {
  (void)state;
  refusals r = {0};
  kvbm_fabric_ucx_config c = config("strict");
  c.timeout_ms = 300;
  c.on_refused = on_refused;
  c.on_refused_user = &r;
  kvbm_fabric_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  uint16_t port = kvbm_fabric_listener_port(l);
  int fd;
  assert_int_equal(kvbm__sc_connect("127.0.0.1", port, 1000, &fd, NULL), KVBM_OK);
  kvbm_fabric *f = NULL;
  /* accept's wait may end before the silent peer's own deadline; within
   * two waits it is refused for its silence */
  for (int i = 0; i < 2 && r.n == 0; i++) assert_int_equal(kvbm_fabric_ucx_accept(l, &f, &e), KVBM_ETIMEDOUT);
  assert_int_equal(r.n, 1);
  assert_int_equal(r.status[0], KVBM_ETIMEDOUT);
  assert_non_null(strstr(e.msg, "1 refused"));
  close(fd);
  kvbm_fabric_listener_destroy(l);

  /* twenty silent connections, then a good peer */
  r.n = 0;
  c.timeout_ms = 15000;
  assert_int_equal(kvbm_fabric_ucx_listen(&c, "127.0.0.1", 0, &l, &e), KVBM_OK);
  port = kvbm_fabric_listener_port(l);
  pid_t pid = fork_child();
  if (pid == 0) {
    kvbm_fabric_listener_destroy(l);
    int s[20];
    for (int i = 0; i < 20; i++) {
      s[i] = raw(port);
      /* each is taken by the gate before the next (the child reads the
       * gate's challenge), so arrival order is connection order */
      uint8_t msg[KVBM__HELLO_AUTH_LEN];
      CHECK(kvbm__sc_recv_all(s[i], msg, sizeof msg, kvbm__sc_deadline(5000), NULL) == KVBM_OK);
    }
    kvbm_fabric_ucx_config cc = config("patient");
    kvbm_fabric *g = NULL;
    CHECK(kvbm_fabric_ucx_connect(&cc, NULL, port, &g, NULL) == KVBM_OK);
    kvbm_fabric_destroy(g);
    for (int i = 0; i < 20; i++) close(s[i]);
    _exit(0);
  }
  if (kvbm_fabric_ucx_accept(l, &f, &e) != KVBM_OK) fail_msg("accept: %s", e.msg);
  assert_string_equal(kvbm_fabric_peer_name(f), "patient");
  kvbm_fabric_destroy(f);
  wait_child(pid);
  assert_int_equal(count(&r, KVBM_EAGAIN), 5); /* 21 arrivals, 16 places */
  kvbm_fabric_listener_destroy(l);

  /* nobody listening */
  c.timeout_ms = 200;
  assert_int_equal(kvbm_fabric_ucx_connect(&c, "127.0.0.1", port, &f, &e), KVBM_ETIMEDOUT);
  /* bad configs */
  kvbm_fabric_ucx_config bad = c;
  bad.timeout_ms = 0;
  assert_int_equal(kvbm_fabric_ucx_connect(&bad, "127.0.0.1", 1, &f, &e), KVBM_EINVAL);
  bad = c;
  bad.name = "";
  assert_int_equal(kvbm_fabric_ucx_listen(&bad, NULL, 0, &l, &e), KVBM_EINVAL);
  bad = c;
  bad.key = NULL;
  assert_int_equal(kvbm_fabric_ucx_listen(&bad, NULL, 0, &l, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "key"));
  assert_int_equal(kvbm_fabric_ucx_connect(&bad, "127.0.0.1", 1, &f, &e), KVBM_EINVAL);
  bad.key = "too short";
  bad.key_len = 9;
  assert_int_equal(kvbm_fabric_ucx_connect(&bad, "127.0.0.1", 1, &f, &e), KVBM_EINVAL);
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
      cmocka_unit_test_teardown(test_shm_fabric_storage_contiguous, kill_child),
      cmocka_unit_test_teardown(test_tcp_loopback, kill_child),
      cmocka_unit_test_teardown(test_peer_dies, kill_child),
      cmocka_unit_test_teardown(test_peer_dies_tcp, kill_child),
      cmocka_unit_test_teardown(test_hostile_peers, kill_child),
      cmocka_unit_test_teardown(test_hostile_listeners, kill_child),
      cmocka_unit_test_teardown(test_silent_peers_and_configs, kill_child),
      cmocka_unit_test_teardown(test_payload_limit, kill_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
