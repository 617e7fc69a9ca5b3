/* SPDX-License-Identifier: Apache-2.0 */
/* test_cudaipc_wire.c: the CUDA IPC fabric's refusals that need no GPU.
 *
 * Runs on any machine (CI has neither a GPU nor the toolkit): the config
 * checks; accept/connect without a device (KVBM_EDEVICE) or without CUDA in
 * the build (KVBM_EUNSUPPORTED); the region key and hello address codecs
 * against hostile bytes; and, over a real loopback connection made through
 * the no-device seam, the handshake (a peer without the key, a peer that
 * is not a CUDA IPC end, one on "another host"), pushes both ways with
 * flush waiting for the pulls, host memory refused at register and import,
 * hostile keys refused at import before CUDA is reached, and a hostile
 * peer's frames (unknown type, oversized push, an ack for nothing, a
 * hang-up) ending in sticky errors, never a crash or a hang; and two ends
 * pushing 16 MiB at each other before either pulls (no deadlock). The device
 * path itself is tests/fabric/test_gpu_cudaipc.c. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/bytes.h"
#include "fabric/auth.h"
#include "fabric/cudaipc.h"
#include "fabric/fabric_impl.h"
#include "fabric/hello.h"
#include "fabric/sidechan.h"
#include "kvbm/cuda.h"

static const char kKey[] = "the shared secret of the cuda ipc tests";
static const char kOtherKey[] = "a secret that is not the shared one";

static kvbm_fabric_cudaipc_config config(const char *name) {
  kvbm_fabric_cudaipc_config c = kvbm_fabric_cudaipc_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
  c.timeout_ms = 5000;
  return c;
}

/* ---- config and no device ---- */

static void test_config(void **state) {
  (void)state;
  kvbm_fabric_cudaipc_config d = kvbm_fabric_cudaipc_config_default();
  assert_int_equal(d.device, 0);
  assert_int_equal(d.timeout_ms, 10000);
  assert_true(d.max_payload == (1ull << 30));
  kvbm_fabric_cudaipc_listener *l = NULL;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_cudaipc_listen(NULL, NULL, 0, &l, &e), KVBM_EINVAL);
  kvbm_fabric_cudaipc_config c = config("a");
  c.key = NULL;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "key"));
  c = config("a");
  c.key_len = 3;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_EINVAL);
  c = config("bad\nname");
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_EINVAL);
  c = config("a");
  c.timeout_ms = 0;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_EINVAL);
  c = config("a");
  c.device = -1;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "device"));
  c = config("a");
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", 0, NULL, &e), KVBM_EINVAL);
  kvbm_fabric *f = NULL;
  assert_int_equal(kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", 0, &f, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_fabric_cudaipc_accept(NULL, &f, &e), KVBM_EINVAL);
  assert_null(f);
  assert_int_equal(kvbm_fabric_cudaipc_listener_port(NULL), 0);
  kvbm_fabric_cudaipc_listener_destroy(NULL);
}

/* Without a device (or CUDA) accept and connect say so at once, before
 * waiting for or reaching any peer. */
static void test_no_device(void **state) {
  (void)state;
  int avail = kvbm_cuda_available(NULL, NULL, NULL);
  if (avail == KVBM_OK) skip(); /* a machine with a GPU: the GPU test covers it */
  kvbm_fabric_cudaipc_config c = config("a");
  kvbm_fabric_cudaipc_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_OK);
  kvbm_fabric *f = NULL;
  int64_t t0 = kvbm__sc_now_ms();
  assert_int_equal(kvbm_fabric_cudaipc_accept(l, &f, &e), avail);
  assert_non_null(strstr(e.msg, "cudaipc"));
  assert_int_equal(kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", kvbm_fabric_cudaipc_listener_port(l), &f, &e),
                   avail);
  assert_true(kvbm__sc_now_ms() - t0 < 2000);
  c.device = 4096;
  assert_int_equal(kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", 1, &f, &e), avail);
  assert_null(f);
  kvbm_fabric_cudaipc_listener_destroy(l);
}

/* ---- codecs ---- */

static void test_key_codec(void **state) {
  (void)state;
  kvbm__cipc_key k = {.offset = 4096, .alloc_size = 1 << 20}, out;
  for (unsigned i = 0; i < KVBM__CIPC_HANDLE; i++) k.handle[i] = (uint8_t)(i * 7 + 1);
  uint8_t b[KVBM__CIPC_KEY_LEN + 1];
  kvbm__cipc_key_encode(&k, b);
  kvbm_error e;
  assert_int_equal(kvbm__cipc_key_decode(b, KVBM__CIPC_KEY_LEN, 65536, &out, &e), KVBM_OK);
  assert_memory_equal(out.handle, k.handle, KVBM__CIPC_HANDLE);
  assert_true(out.offset == 4096 && out.alloc_size == (1u << 20));
  /* the whole rest of the allocation: fits; one byte more: does not */
  assert_int_equal(kvbm__cipc_key_decode(b, KVBM__CIPC_KEY_LEN, (1 << 20) - 4096, &out, &e), KVBM_OK);
  assert_int_equal(kvbm__cipc_key_decode(b, KVBM__CIPC_KEY_LEN, (1 << 20) - 4095, &out, &e), KVBM_ERANGE);
  assert_non_null(strstr(e.msg, "allocation"));
  /* lengths, tag, version */
  assert_int_equal(kvbm__cipc_key_decode(b, KVBM__CIPC_KEY_LEN - 1, 1, &out, &e), KVBM_EPROTO);
  assert_int_equal(kvbm__cipc_key_decode(b, KVBM__CIPC_KEY_LEN + 1, 1, &out, &e), KVBM_EPROTO);
  assert_int_equal(kvbm__cipc_key_decode(NULL, 0, 1, &out, &e), KVBM_EPROTO);
  uint8_t c[KVBM__CIPC_KEY_LEN];
  memcpy(c, b, sizeof c);
  memcpy(c, "UCXK", 4);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 1, &out, &e), KVBM_EPROTO);
  assert_non_null(strstr(e.msg, "not a CUDA IPC key"));
  memcpy(c, b, sizeof c);
  kvbm__put_le32(c + 4, 2);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 1, &out, &e), KVBM_EPROTO);
  /* hostile sizes: no allocation, offset past it, sums that wrap */
  k.alloc_size = 0;
  k.offset = 0;
  kvbm__cipc_key_encode(&k, c);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 1, &out, &e), KVBM_ERANGE);
  k.alloc_size = 100;
  k.offset = 101;
  kvbm__cipc_key_encode(&k, c);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 0, &out, &e), KVBM_ERANGE);
  k.alloc_size = UINT64_MAX;
  k.offset = UINT64_MAX - 8;
  kvbm__cipc_key_encode(&k, c);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 16, &out, &e), KVBM_ERANGE);
  assert_int_equal(kvbm__cipc_key_decode(c, sizeof c, 8, &out, &e), KVBM_OK);
}

static void test_addr_codec(void **state) {
  (void)state;
  kvbm__cipc_addr self, out;
  kvbm__cipc_addr_self(&self);
  assert_int_equal(self.pid, (uint32_t)getpid());
  for (int i = 0; i < 16; i++) self.uuid[i] = (uint8_t)(0xA0 + i);
  uint8_t b[KVBM__CIPC_ADDR_LEN], c[KVBM__CIPC_ADDR_LEN];
  kvbm__cipc_addr_encode(&self, b);
  kvbm_error e;
  assert_int_equal(kvbm__cipc_addr_decode(b, sizeof b, &self, &out, &e), KVBM_OK);
  assert_memory_equal(out.uuid, self.uuid, 16);
  assert_int_equal(out.pid, self.pid);
  assert_int_equal(kvbm__cipc_addr_decode(b, sizeof b - 1, &self, &out, &e), KVBM_EPROTO);
  assert_int_equal(kvbm__cipc_addr_decode((const uint8_t *)"a UCX worker address", 20, &self, &out, &e),
                   KVBM_EPROTO);
  assert_non_null(strstr(e.msg, "not a CUDA IPC fabric"));
  memcpy(c, b, sizeof c);
  kvbm__put_le32(c + 4, 9);
  assert_int_equal(kvbm__cipc_addr_decode(c, sizeof c, &self, &out, &e), KVBM_EPROTO);
  memcpy(c, b, sizeof c);
  c[13] = 1;
  assert_int_equal(kvbm__cipc_addr_decode(c, sizeof c, &self, &out, &e), KVBM_EPROTO);
  kvbm__cipc_addr other = self;
  other.boot_id[0] = other.boot_id[0] == 'x' ? 'y' : 'x';
  kvbm__cipc_addr_encode(&other, c);
  assert_int_equal(kvbm__cipc_addr_decode(c, sizeof c, &self, &out, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "another host"));
}

/* ---- over a real connection (no-device seam) ---- */

typedef struct peer_args {
  uint16_t port;
  int mode; /* see peer_main */
  int rc;
  char msg[KVBM_ERROR_MSG_MAX + 32];
} peer_args;

#define BIG (3u << 20)

/* A fake peer that holds the key and runs the handshake by hand, with the
 * address `addr`; returns the socket (blocking), or -1. */
static int fake_peer(uint16_t port, const uint8_t *addr, size_t addr_len) {
  uint8_t key[KVBM__HELLO_KEY];
  if (kvbm__hello_derive(kKey, sizeof kKey - 1, key, NULL)) return -1;
  int fd;
  if (kvbm__sc_connect("127.0.0.1", port, 5000, &fd, NULL)) return -1;
  kvbm__hs hs;
  int64_t dl = kvbm__sc_deadline(5000);
  uint8_t hello[256];
  size_t n;
  if (kvbm__auth_connect(fd, key, dl, &hs, NULL) ||
      kvbm__hs_hello_encode(&hs, "fake", addr, addr_len, hello, sizeof hello, &n, NULL) ||
      kvbm__sc_send_record(fd, hello, n, dl, NULL)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Finishes a fake peer's handshake: the listener's hello, ready both ways. */
static int fake_ready(int fd) {
  int64_t dl = kvbm__sc_deadline(5000);
  void *rec;
  size_t n;
  if (kvbm__sc_recv_record(fd, KVBM__HELLO_MAX, &rec, &n, dl, NULL)) return -1;
  free(rec);
  unsigned char r = 'R';
  if (kvbm__sc_send_all(fd, &r, 1, dl, NULL) || kvbm__sc_recv_all(fd, &r, 1, dl, NULL) || r != 'R') return -1;
  return 0;
}

static void *peer_main(void *arg) {
  peer_args *a = arg;
  kvbm_error e = {0};
  a->rc = KVBM_OK;
  if (a->mode == 0) {
    /* a peer without the key, one that is not a CUDA IPC end, then the real one */
    kvbm_fabric_cudaipc_config c = config("wrong-key");
    c.key = kOtherKey;
    c.key_len = sizeof kOtherKey - 1;
    kvbm_fabric *f = NULL;
    int rc = kvbm__fabric_cudaipc_connect_nodev(&c, "127.0.0.1", a->port, &f, &e);
    if (rc != KVBM_EAUTH) {
      a->rc = rc ? rc : -999;
      snprintf(a->msg, sizeof a->msg, "wrong key: %s", e.msg);
      return NULL;
    }
    int fd = fake_peer(a->port, (const uint8_t *)"a UCX worker address", 20);
    if (fd < 0) {
      a->rc = -998;
      return NULL;
    }
    unsigned char b;
    (void)recv(fd, &b, 1, 0); /* wait for the listener to hang up */
    close(fd);
    c = config("decode");
    rc = kvbm__fabric_cudaipc_connect_nodev(&c, "127.0.0.1", a->port, &f, &e);
    if (rc) {
      a->rc = rc;
      snprintf(a->msg, sizeof a->msg, "connect: %s", e.msg);
      return NULL;
    }
    /* push a small and a large payload, flush (waits for the pulls), then
     * take the answer */
    uint8_t *big = malloc(BIG);
    for (size_t i = 0; i < BIG; i++) big[i] = (uint8_t)(i * 31 + 7);
    kvbm_fabric_handle h;
    rc = kvbm_fabric_push(f, "hello", 5, &h, &e);
    if (!rc) rc = kvbm_fabric_push(f, big, BIG, &h, &e);
    if (!rc) rc = kvbm_fabric_flush(f, 5000, &e);
    size_t len = 0;
    if (!rc) rc = kvbm_fabric_next(f, 5000, &h, &len, &e);
    uint8_t *back = malloc(BIG);
    if (!rc) rc = kvbm_fabric_pull(f, h, back, BIG, &len, 5000, &e);
    if (!rc && (len != BIG || memcmp(back, big, BIG) != 0)) rc = -997;
    free(back);
    free(big);
    a->rc = rc;
    snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    kvbm_fabric_destroy(f);
    return NULL;
  }
  /* modes 1..4: a peer that completes the handshake, then misbehaves */
  kvbm__cipc_addr self;
  kvbm__cipc_addr_self(&self);
  uint8_t addr[KVBM__CIPC_ADDR_LEN];
  kvbm__cipc_addr_encode(&self, addr);
  int fd = fake_peer(a->port, addr, sizeof addr);
  if (fd < 0 || fake_ready(fd)) {
    a->rc = -996;
    if (fd >= 0) close(fd);
    return NULL;
  }
  int64_t dl = kvbm__sc_deadline(5000);
  uint8_t fr[17] = {0};
  if (a->mode == 1) { /* an unknown frame type */
    fr[0] = 'X';
    kvbm__sc_send_all(fd, fr, 1, dl, NULL);
  } else if (a->mode == 2) { /* a push above max_payload */
    fr[0] = 'P';
    kvbm__put_le64(fr + 1, 1);
    kvbm__put_le64(fr + 9, UINT64_MAX);
    kvbm__sc_send_all(fd, fr, 17, dl, NULL);
  } else if (a->mode == 3) { /* an ack for a payload never pushed */
    fr[0] = 'K';
    kvbm__put_le64(fr + 1, 5);
    kvbm__sc_send_all(fd, fr, 9, dl, NULL);
  }
  /* mode 4: hang up at once */
  unsigned char b;
  if (a->mode != 4) (void)recv(fd, &b, 1, 0); /* until the listener hangs up */
  close(fd);
  return NULL;
}

/* An export envelope of a small FullyContiguous set in `memory`, with one
 * region key of key_len bytes. */
static void make_export(kvbm_memory_type memory, const uint8_t *key, uint32_t key_len, uint8_t **buf,
                        size_t *len) {
  kvbm_layout_config c = {.num_blocks = 4, .num_layers = 2, .outer_dim = 2, .page_size = 4,
                          .inner_dim = 8, .dtype_size = 2, .alignment = 256};
  kvbm_layout_desc d = {0};
  assert_int_equal(kvbm_layout_init(&d.layout, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, NULL), KVBM_OK);
  uint64_t base = 0x7f0000000000ull;
  d.memory = memory;
  d.device_id = memory == KVBM_MEMORY_DEVICE ? 0 : -1;
  d.block_set_id = 9;
  d.num_regions = 1;
  d.region_base = &base;
  kvbm_fabric_wire_region w = {.base = base, .len = d.layout.region_size, .key = key, .key_len = key_len};
  assert_int_equal(kvbm__fabric_wire_encode(&d, &w, buf, len, NULL), KVBM_OK);
}

static int nodev_code(void) {
  int avail = kvbm_cuda_available(NULL, NULL, NULL);
  return avail == KVBM_EUNSUPPORTED ? KVBM_EUNSUPPORTED : KVBM_EDEVICE;
}

static void test_connection(void **state) {
  (void)state;
  kvbm_fabric_cudaipc_config c = config("prefill");
  kvbm_fabric_cudaipc_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_OK);
  peer_args a = {.port = kvbm_fabric_cudaipc_listener_port(l), .mode = 0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, peer_main, &a), 0);
  kvbm_fabric *f = NULL;
  assert_int_equal(kvbm__fabric_cudaipc_accept_nodev(l, &f, &e), KVBM_OK);
  /* the wrong key and the UCX-looking hello were refused, the wait went on */
  assert_int_equal(kvbm_fabric_cudaipc_listener_refused(l), 2);
  assert_string_equal(kvbm_fabric_kind(f), "cudaipc");
  assert_string_equal(kvbm_fabric_label(f), "cuda-ipc");
  assert_string_equal(kvbm_fabric_name(f), "prefill");
  assert_string_equal(kvbm_fabric_peer_name(f), "decode");

  /* messages: both payloads, in order, exactly */
  kvbm_fabric_handle h;
  size_t len;
  char small[8];
  assert_int_equal(kvbm_fabric_next(f, 5000, &h, &len, &e), KVBM_OK);
  assert_int_equal(len, 5);
  assert_int_equal(kvbm_fabric_pull(f, h, small, 2, &len, 5000, &e), KVBM_ETOOLONG); /* kept */
  assert_int_equal(kvbm_fabric_pull(f, h, small, sizeof small, &len, 5000, &e), KVBM_OK);
  assert_memory_equal(small, "hello", 5);
  assert_int_equal(kvbm_fabric_pull(f, h, small, sizeof small, &len, 0, &e), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_fabric_next(f, 5000, &h, &len, &e), KVBM_OK);
  assert_int_equal(len, BIG);
  uint8_t *big = malloc(BIG);
  assert_int_equal(kvbm_fabric_pull(f, h, big, BIG, &len, 5000, &e), KVBM_OK);
  for (size_t i = 0; i < BIG; i += 4099) assert_int_equal(big[i], (uint8_t)(i * 31 + 7));
  assert_int_equal(kvbm_fabric_next(f, 0, &h, &len, &e), KVBM_ETIMEDOUT);

  /* block sets: host memory is refused, with the reason */
  uint64_t hb[1];
  void *host = malloc(4096 * 4);
  hb[0] = (uint64_t)(uintptr_t)host;
  kvbm_layout_config lc = {.num_blocks = 4, .num_layers = 2, .outer_dim = 2, .page_size = 4,
                           .inner_dim = 8, .dtype_size = 2, .alignment = 1};
  kvbm_layout_desc d = {0};
  assert_int_equal(kvbm_layout_init(&d.layout, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, NULL), KVBM_OK);
  d.memory = KVBM_MEMORY_SYSTEM;
  d.device_id = -1;
  d.num_regions = 1;
  d.region_base = hb;
  kvbm_fabric_local_set *ls = NULL;
  assert_int_equal(kvbm_fabric_register(f, &d, &ls, &e), KVBM_EUNSUPPORTED);
  assert_non_null(strstr(e.msg, "system memory is not reachable"));
  d.memory = KVBM_MEMORY_PINNED;
  assert_int_equal(kvbm_fabric_register(f, &d, &ls, &e), KVBM_EUNSUPPORTED);
  /* device memory on an end without a device: refused, not a crash */
  d.memory = KVBM_MEMORY_DEVICE;
  d.device_id = 0;
  assert_int_equal(kvbm_fabric_register(f, &d, &ls, &e), nodev_code());
  assert_null(ls);
  kvbm_storage *st = NULL;
  assert_int_equal(kvbm_fabric_storage_create(f, &d.layout, &st, &e), KVBM_EUNSUPPORTED);
  assert_null(st);
  free(host);

  /* imports: host memory, keys that are not ours, keys out of range, all
   * refused before CUDA would be reached; a good key reaches "no device" */
  kvbm__cipc_key k = {.offset = 0, .alloc_size = 1 << 20};
  memset(k.handle, 0x5a, sizeof k.handle);
  uint8_t key[KVBM__CIPC_KEY_LEN];
  kvbm__cipc_key_encode(&k, key);
  uint8_t *buf;
  size_t blen;
  kvbm_fabric_remote_set *rs = NULL;
  make_export(KVBM_MEMORY_SYSTEM, key, sizeof key, &buf, &blen);
  assert_int_equal(kvbm_fabric_import(f, buf, blen, &rs, &e), KVBM_EUNSUPPORTED);
  free(buf);
  make_export(KVBM_MEMORY_DEVICE, (const uint8_t *)"UCXKxxxxxxxx", 12, &buf, &blen);
  assert_int_equal(kvbm_fabric_import(f, buf, blen, &rs, &e), KVBM_EPROTO);
  free(buf);
  k.alloc_size = 64; /* smaller than the region */
  kvbm__cipc_key_encode(&k, key);
  make_export(KVBM_MEMORY_DEVICE, key, sizeof key, &buf, &blen);
  assert_int_equal(kvbm_fabric_import(f, buf, blen, &rs, &e), KVBM_ERANGE);
  free(buf);
  k.alloc_size = 1 << 20;
  kvbm__cipc_key_encode(&k, key);
  make_export(KVBM_MEMORY_DEVICE, key, sizeof key, &buf, &blen);
  assert_int_equal(kvbm_fabric_import(f, buf, blen - 1, &rs, &e), KVBM_ETRUNCATED);
  assert_int_equal(kvbm_fabric_import(f, buf, blen, &rs, &e), nodev_code());
  assert_null(rs);
  free(buf);

  /* answer the peer's big payload with itself; its flush saw our pulls */
  assert_int_equal(kvbm_fabric_push(f, big, BIG, &h, &e), KVBM_OK);
  assert_int_equal(kvbm_fabric_flush(f, 5000, &e), KVBM_OK);
  /* the peer checks it and closes: nothing left */
  assert_int_equal(kvbm_fabric_next(f, 5000, &h, &len, &e), KVBM_ECLOSED);
  assert_int_equal(kvbm_fabric_push(f, "x", 1, &h, &e), KVBM_ECLOSED);
  free(big);
  kvbm_fabric_destroy(f);
  assert_int_equal(pthread_join(t, NULL), 0);
  if (a.rc) fail_msg("peer: %d %s", a.rc, a.msg);
  kvbm_fabric_cudaipc_listener_destroy(l);
}

/* A peer that proved the key and then breaks the framing: each is a
 * sticky error (or a clean close), seen within the timeout. */
static void test_hostile_frames(void **state) {
  (void)state;
  const int want[] = {0, KVBM_EPROTO, KVBM_EPROTO, KVBM_EPROTO, KVBM_ECLOSED};
  for (int mode = 1; mode <= 4; mode++) {
    kvbm_fabric_cudaipc_config c = config("prefill");
    kvbm_fabric_cudaipc_listener *l;
    kvbm_error e;
    assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_OK);
    peer_args a = {.port = kvbm_fabric_cudaipc_listener_port(l), .mode = mode};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, peer_main, &a), 0);
    kvbm_fabric *f = NULL;
    assert_int_equal(kvbm__fabric_cudaipc_accept_nodev(l, &f, &e), KVBM_OK);
    assert_string_equal(kvbm_fabric_peer_name(f), "fake");
    kvbm_fabric_handle h;
    int64_t t0 = kvbm__sc_now_ms();
    int rc = kvbm_fabric_next(f, 5000, &h, NULL, &e);
    assert_true(kvbm__sc_now_ms() - t0 < 4000);
    if (rc != want[mode]) fail_msg("mode %d: %d (%s), expected %d", mode, rc, e.msg, want[mode]);
    if (want[mode] == KVBM_EPROTO) { /* sticky */
      assert_int_equal(kvbm_fabric_push(f, "x", 1, &h, &e), KVBM_EPROTO);
      assert_int_equal(kvbm_fabric_flush(f, 100, &e), KVBM_EPROTO);
    }
    kvbm_fabric_destroy(f); /* hangs up: the fake peer's recv returns */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.rc, 0);
    kvbm_fabric_cudaipc_listener_destroy(l);
  }
}

/* Both ends push 16 MiB at each other before either pulls (more than the
 * socket buffers hold): each push is queued and every wait pumps both
 * ways, so neither blocks on a full buffer while the other does too. */
#define CROSS (16u << 20)

static int cross_side(kvbm_fabric *f, uint8_t seed, char *msg, size_t cap) {
  kvbm_error e = {0};
  uint8_t *out = malloc(CROSS), *in = malloc(CROSS);
  for (size_t i = 0; i < CROSS; i++) out[i] = (uint8_t)(i * 13 + seed);
  kvbm_fabric_handle h;
  size_t len = 0;
  int rc = kvbm_fabric_push(f, out, CROSS, &h, &e);
  if (!rc) rc = kvbm_fabric_next(f, 10000, &h, &len, &e);
  if (!rc) rc = kvbm_fabric_pull(f, h, in, CROSS, &len, 10000, &e);
  if (!rc) rc = kvbm_fabric_flush(f, 10000, &e);
  uint8_t other = seed == 1 ? 2 : 1;
  for (size_t i = 0; !rc && i < CROSS; i++)
    if (in[i] != (uint8_t)(i * 13 + other)) rc = -990;
  snprintf(msg, cap, "%s", e.msg);
  free(out);
  free(in);
  return rc;
}

static void *cross_peer(void *arg) {
  peer_args *a = arg;
  kvbm_fabric_cudaipc_config c = config("decode");
  kvbm_fabric *f = NULL;
  kvbm_error e = {0};
  a->rc = kvbm__fabric_cudaipc_connect_nodev(&c, "127.0.0.1", a->port, &f, &e);
  if (a->rc) {
    snprintf(a->msg, sizeof a->msg, "connect: %s", e.msg);
    return NULL;
  }
  a->rc = cross_side(f, 2, a->msg, sizeof a->msg);
  kvbm_fabric_destroy(f);
  return NULL;
}

static void test_crossing_pushes(void **state) {
  (void)state;
  kvbm_fabric_cudaipc_config c = config("prefill");
  kvbm_fabric_cudaipc_listener *l;
  kvbm_error e;
  assert_int_equal(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e), KVBM_OK);
  peer_args a = {.port = kvbm_fabric_cudaipc_listener_port(l)};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, cross_peer, &a), 0);
  kvbm_fabric *f = NULL;
  assert_int_equal(kvbm__fabric_cudaipc_accept_nodev(l, &f, &e), KVBM_OK);
  char msg[KVBM_ERROR_MSG_MAX];
  int rc = cross_side(f, 1, msg, sizeof msg);
  kvbm_fabric_destroy(f);
  assert_int_equal(pthread_join(t, NULL), 0);
  if (rc) fail_msg("listener side: %d %s", rc, msg);
  if (a.rc) fail_msg("peer side: %d %s", a.rc, a.msg);
  kvbm_fabric_cudaipc_listener_destroy(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),         cmocka_unit_test(test_no_device),
      cmocka_unit_test(test_key_codec),      cmocka_unit_test(test_addr_codec),
      cmocka_unit_test(test_connection),     cmocka_unit_test(test_hostile_frames),
      cmocka_unit_test(test_crossing_pushes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
