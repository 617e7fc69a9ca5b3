/* SPDX-License-Identifier: Apache-2.0 */
/* test_gpu_cudaipc.c: the CUDA IPC fabric between two processes on one GPU.
 *
 * The parent is the prefill node: it listens, forks the decode node, and
 * only then touches CUDA (a process that initialised CUDA cannot hand it
 * to a forked child). Its block set is LayerSeparate, its four regions
 * sliced out of ONE cudaMalloc at an offset (so the exported handle names
 * an allocation whose base is not a region base, and four regions share
 * it). It fills every block with random bytes (getrandom seed) and pushes
 * the seed with the export. The child imports it (after checking the
 * layout bridges to its own FullyContiguous device storage), poisons its
 * storage, reads every block layer by layer device to device, copies back
 * to the host and compares every byte; then writes three blocks of new
 * random bytes into the parent's set, flushes and tells the parent, which
 * compares every byte of its whole set (written blocks new, the others
 * untouched). Refusals over the real connection: a block id past the set,
 * a range past a region, a wrong length, host memory registered as
 * device memory, and an export whose key lies about the allocation (the
 * import checks the real mapping and refuses it). A failing child cannot
 * hang the parent: every wait has a timeout, the child is reaped with a
 * deadline and killed past it. CPU-only checks run first. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "fabric/fabric_impl.h"
#include "gpu_testutil.h"
#include "kvbm/fabric.h"
#include "kvbm/storage.h"

static const char kKey[] = "the shared secret of the cuda ipc gpu test";

#define TIMEOUT_MS 15000

static kvbm_fabric_cudaipc_config config(const char *name) {
  kvbm_fabric_cudaipc_config c = kvbm_fabric_cudaipc_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
  c.timeout_ms = TIMEOUT_MS;
  return c;
}

/* Which process is failing, for the messages. */
static const char *g_who = "parent";

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s: %s:%d: check failed: %s\n", g_who, __FILE__, __LINE__, #cond); \
      if (strcmp(g_who, "child") == 0) _exit(__LINE__ % 250 + 1);                   \
      fail_msg("%s:%d: %s", __FILE__, __LINE__, #cond);                             \
    }                                                                               \
  } while (0)

/* A kvbm call that must succeed; prints its error otherwise. */
#define OK(call)                                                                          \
  do {                                                                                    \
    kvbm_error e_ = {0};                                                                  \
    int rc_ = (call);                                                                     \
    (void)e_;                                                                             \
    if (rc_ != KVBM_OK) {                                                                 \
      fprintf(stderr, "%s: %s:%d: %s -> %s: %s\n", g_who, __FILE__, __LINE__, #call, kvbm_status_name(rc_), e_.msg); \
      CHECK(rc_ == KVBM_OK);                                                              \
    }                                                                                     \
  } while (0)

/* A kvbm call that must fail with `want`. */
#define REFUSED(want, call)                                                                        \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != (want)) {                                                                           \
      fprintf(stderr, "%s: %s:%d: %s -> %s, expected %s (%s)\n", g_who, __FILE__, __LINE__, #call, \
              kvbm_status_name(rc_), kvbm_status_name(want), e.msg);                               \
      CHECK(rc_ == (want));                                                                        \
    }                                                                                              \
  } while (0)

#ifdef KVBM_HAVE_CUDA
#define CU(call)                                                                                     \
  do {                                                                                               \
    cudaError_t ce_ = (call);                                                                        \
    if (ce_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "%s: %s:%d: %s: %s\n", g_who, __FILE__, __LINE__, #call, cudaGetErrorString(ce_)); \
      CHECK(ce_ == cudaSuccess);                                                                     \
    }                                                                                                \
  } while (0)
#endif

/* ---- CPU part: what can be checked without a device ---- */

static void test_cpu_refusals(void **state) {
  (void)state;
  kvbm_error e;
  kvbm_fabric_cudaipc_listener *l = NULL;
  kvbm_fabric_cudaipc_config c = config("x");
  c.key = NULL;
  REFUSED(KVBM_EINVAL, kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e));
  c = config("x");
  c.device = -2;
  kvbm_fabric *f = NULL;
  REFUSED(KVBM_EINVAL, kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", 1, &f, &e));
  REFUSED(KVBM_EINVAL, kvbm_fabric_cudaipc_accept(NULL, &f, &e));
  CHECK(f == NULL);
}

#ifdef KVBM_HAVE_CUDA

/* ---- the bytes: random, reproducible from a seed on both sides ---- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The bytes of (block, layer) for `seed`. */
static void fill(uint8_t *p, size_t n, uint64_t seed, uint64_t block, uint64_t layer) {
  uint64_t s = seed ^ (block * 0x100000001B3ull) ^ (layer << 48);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

/* Both ends' block shape: 4 layers x 2 x 16 tokens x 512 x 2 bytes = 32
 * KiB a layer, 128 KiB a block, 24 blocks. */
static kvbm_layout_config shape(void) {
  return (kvbm_layout_config){.num_blocks = 24, .num_layers = 4, .outer_dim = 2, .page_size = 16,
                              .inner_dim = 512, .dtype_size = 2, .alignment = 256};
}

#define WRITE_FIRST 5
#define WRITE_COUNT 3

/* ---- the decode node (child) ---- */

static void child_main(uint16_t port) {
  g_who = "child";
  alarm(60); /* a last resort: the parent kills us at its own deadline */
  kvbm_fabric_cudaipc_config c = config("decode");
  kvbm_fabric *f;
  kvbm_error e = {0};
  int rc = kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", port, &f, &e);
  if (rc) fprintf(stderr, "child: connect: %s\n", e.msg);
  CHECK(rc == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_label(f), "cuda-ipc") == 0);
  CHECK(strcmp(kvbm_fabric_peer_name(f), "prefill") == 0);

  /* our own storage: FullyContiguous, one cudaMalloc per region */
  kvbm_layout_config sc = shape();
  kvbm_layout mine;
  OK(kvbm_layout_init(&mine, KVBM_LAYOUT_FULLY_CONTIGUOUS, &sc, &e_));
  kvbm_storage *st;
  OK(kvbm_storage_create(KVBM_MEMORY_DEVICE, &mine, NULL, &st, &e_));

  /* the parent's seed and export */
  kvbm_fabric_handle h;
  size_t len;
  OK(kvbm_fabric_next(f, TIMEOUT_MS, &h, &len, &e_));
  CHECK(len > 8);
  uint8_t *msg = malloc(len);
  OK(kvbm_fabric_pull(f, h, msg, len, &len, TIMEOUT_MS, &e_));
  uint64_t seed;
  memcpy(&seed, msg, 8);
  const uint8_t *wire = msg + 8;
  size_t wire_len = len - 8;
  kvbm_layout theirs;
  OK(kvbm_fabric_export_layout(wire, wire_len, &theirs, &e_));
  OK(kvbm_fabric_layout_bridge(&mine, &theirs, &e_));

  uint8_t *scrambled = NULL;
  size_t scrambled_len = 0;
  /* a lying export: the key claims a huge allocation and puts region 0
   * past the real one; cudaIpcOpenMemHandle succeeds, the real mapping's
   * size refuses it */
  {
    kvbm_layout_desc d;
    kvbm_fabric_wire_region *w;
    OK(kvbm__fabric_wire_decode(wire, wire_len, &d, &w, &e_));
    uint8_t *keys = malloc(d.num_regions * 88);
    for (uint64_t r = 0; r < d.num_regions; r++) {
      CHECK(w[r].key_len == 88);
      memcpy(keys + r * 88, w[r].key, 88);
      w[r].key = keys + r * 88;
    }
    uint64_t huge = 1ull << 40, off = 1ull << 36; /* offset 64 GiB, "allocation" 1 TiB */
    memcpy(keys + 8 + 64, &off, 8);
    memcpy(keys + 16 + 64, &huge, 8);
    uint8_t *bad;
    size_t bad_len;
    OK(kvbm__fabric_wire_encode(&d, w, &bad, &bad_len, &e_));
    kvbm_fabric_remote_set *rs_bad = NULL;
    REFUSED(KVBM_ERANGE, kvbm_fabric_import(f, bad, bad_len, &rs_bad, &e));
    CHECK(strstr(e.msg, "as mapped") != NULL);
    CHECK(rs_bad == NULL);
    /* keep the handle bytes scrambled for later (scrambled_import) */
    for (int i = 0; i < 64; i++) keys[8 + i] ^= 0x5a;
    memcpy(keys + 8 + 64, &(uint64_t){0}, 8);
    free(bad);
    OK(kvbm__fabric_wire_encode(&d, w, &scrambled, &scrambled_len, &e_));
    free(keys);
    free(w);
    kvbm_layout_desc_release(&d);
  }

  kvbm_fabric_remote_set *rs;
  OK(kvbm_fabric_import(f, wire, wire_len, &rs, &e_));
  const kvbm_layout_desc *rd = kvbm_fabric_remote_desc(rs);
  CHECK(rd->memory == KVBM_MEMORY_DEVICE && rd->block_set_id == 41);
  uint64_t nb = theirs.config.num_blocks, nl = theirs.config.num_layers, ls = theirs.layer_stride;
  size_t bb = kvbm_fabric_block_bytes(&theirs);

  /* poison, then read every block into our storage, layer by layer */
  for (uint64_t r = 0; r < kvbm_storage_num_regions(st); r++)
    CU(cudaMemset(kvbm_storage_region_base(st, r), 0xA5, kvbm_storage_region_size(st)));
  CU(cudaDeviceSynchronize());
  void *layers[8];
  for (uint64_t b = 0; b < nb; b++) {
    for (uint64_t l = 0; l < nl; l++) OK(kvbm_storage_block_layer_ptr(st, &mine, b, l, &layers[l], NULL, &e_));
    OK(kvbm_fabric_read_block_layers(f, rs, b, layers, nl, ls, &e_));
  }
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  uint8_t *host = malloc(bb), *want = malloc(bb);
  for (uint64_t b = 0; b < nb; b++) {
    for (uint64_t l = 0; l < nl; l++) {
      OK(kvbm_storage_block_layer_ptr(st, &mine, b, l, &layers[l], NULL, &e_));
      memset(host + l * ls, 0x3C, ls);
      CU(cudaMemcpy(host + l * ls, layers[l], ls, cudaMemcpyDeviceToHost));
      fill(want + l * ls, ls, seed, b, l);
    }
    if (memcmp(host, want, bb) != 0) fprintf(stderr, "child: block %llu differs after the read\n", (unsigned long long)b);
    CHECK(memcmp(host, want, bb) == 0);
  }
  /* read_block into a contiguous device buffer too */
  void *dbuf;
  CU(cudaMalloc(&dbuf, bb));
  CU(cudaMemset(dbuf, 0x5A, bb));
  OK(kvbm_fabric_read_block(f, rs, nb - 1, dbuf, bb, &e_));
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  CU(cudaMemcpy(host, dbuf, bb, cudaMemcpyDeviceToHost));
  for (uint64_t l = 0; l < nl; l++) fill(want + l * ls, ls, seed, nb - 1, l);
  CHECK(memcmp(host, want, bb) == 0);

  /* refusals before any byte moves */
  REFUSED(KVBM_ERANGE, kvbm_fabric_read_block(f, rs, nb, dbuf, bb, &e));
  CHECK(strstr(e.msg, "out of range") != NULL);
  REFUSED(KVBM_ERANGE, kvbm_fabric_write_block(f, rs, UINT64_MAX, dbuf, bb, &e));
  REFUSED(KVBM_EINVAL, kvbm_fabric_read_block(f, rs, 0, dbuf, bb - 1, &e));
  REFUSED(KVBM_ERANGE, kvbm_fabric_read(f, rs, 0, theirs.region_size - 8, dbuf, 16, &e));
  REFUSED(KVBM_ERANGE, kvbm_fabric_write(f, rs, rd->num_regions, 0, dbuf, 1, &e));
  REFUSED(KVBM_EINVAL, kvbm_fabric_read_block_layers(f, rs, 0, layers, nl - 1, ls, &e));

  /* write new random bytes into WRITE_COUNT of the parent's blocks */
  uint64_t seed2;
  CHECK(getrandom(&seed2, sizeof seed2, 0) == sizeof seed2);
  for (uint64_t b = WRITE_FIRST; b < WRITE_FIRST + WRITE_COUNT; b++) {
    for (uint64_t l = 0; l < nl; l++) fill(host + l * ls, ls, seed2, b, l);
    OK(kvbm_storage_block_layer_ptr(st, &mine, b, 0, &layers[0], NULL, &e_));
    CU(cudaMemcpy(layers[0], host, bb, cudaMemcpyHostToDevice)); /* FullyContiguous: the block is contiguous */
    for (uint64_t l = 0; l < nl; l++) OK(kvbm_storage_block_layer_ptr(st, &mine, b, l, &layers[l], NULL, &e_));
    OK(kvbm_fabric_write_block_layers(f, rs, b, (const void *const *)layers, nl, ls, &e_));
  }
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  OK(kvbm_fabric_push(f, &seed2, sizeof seed2, NULL, &e_));
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));

  /* a key whose handle bytes are scrambled: CUDA must refuse it (checked
   * last: it is the driver's validation we lean on here) */
  {
    kvbm_fabric_remote_set *rs_bad = NULL;
    rc = kvbm_fabric_import(f, scrambled, scrambled_len, &rs_bad, &e);
    fprintf(stderr, "child: import of a scrambled handle: %s (%s)\n", kvbm_status_name(rc), e.msg);
    CHECK((rc == KVBM_EPROTO || rc == KVBM_ERANGE) && rs_bad == NULL);
    free(scrambled);
  }

  kvbm_fabric_stats s;
  kvbm_fabric_stats_get(f, &s);
  CHECK(s.reads == nb * nl + nl && s.read_bytes == (nb + 1) * bb);
  CHECK(s.writes == WRITE_COUNT * nl && s.write_bytes == WRITE_COUNT * bb && s.failures == 0);

  /* done: release the import (closes the handle), say so, close */
  kvbm_fabric_remote_set_release(rs);
  OK(kvbm_fabric_push(f, "done", 4, NULL, &e_));
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  kvbm_fabric_destroy(f);
  CU(cudaFree(dbuf));
  kvbm_storage_release(st);
  free(host);
  free(want);
  free(msg);
  _exit(0);
}

/* ---- the prefill node (parent) ---- */

static pid_t g_child = -1;

/* Reaps the child within `ms`, killing it past that; its exit status. */
static int reap(int ms) {
  if (g_child <= 0) return -1;
  int status = 0;
  for (int waited = 0;; waited += 10) {
    pid_t p = waitpid(g_child, &status, WNOHANG);
    if (p == g_child) break;
    if (p < 0 && errno != EINTR) return -1;
    if (waited >= ms) {
      fprintf(stderr, "parent: the child did not end within %d ms: killed\n", ms);
      kill(g_child, SIGKILL);
      waitpid(g_child, &status, 0);
      g_child = -1;
      return -1;
    }
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  g_child = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "parent: the child died of signal %d\n", WTERMSIG(status));
  return -1;
}

static int teardown(void **state) {
  (void)state;
  if (g_child > 0) {
    kill(g_child, SIGKILL);
    waitpid(g_child, NULL, 0);
    g_child = -1;
  }
  return 0;
}

static void test_two_processes(void **state) {
  (void)state;
  kvbm_fabric_cudaipc_config c = config("prefill");
  kvbm_fabric_cudaipc_listener *lst;
  OK(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &lst, &e_)); /* no CUDA yet */
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) child_main(kvbm_fabric_cudaipc_listener_port(lst));
  g_child = pid;

  kvbm_fabric *f;
  kvbm_error e = {0};
  int rc = kvbm_fabric_cudaipc_accept(lst, &f, &e);
  if (rc) fprintf(stderr, "parent: accept: %s\n", e.msg);
  CHECK(rc == KVBM_OK);
  CHECK(strcmp(kvbm_fabric_kind(f), "cudaipc") == 0);
  CHECK(strcmp(kvbm_fabric_peer_name(f), "decode") == 0);

  /* host memory that claims to be device memory: refused by CUDA's word */
  kvbm_layout_config sc = shape();
  kvbm_layout lay;
  OK(kvbm_layout_init(&lay, KVBM_LAYOUT_LAYER_SEPARATE, &sc, &e_));
  CHECK(lay.num_regions == 4);
  void *pinned;
  CU(cudaMallocHost(&pinned, lay.region_size));
  uint64_t pb[4];
  for (int r = 0; r < 4; r++) pb[r] = (uint64_t)(uintptr_t)pinned;
  kvbm_layout_desc d = {.layout = lay, .memory = KVBM_MEMORY_DEVICE, .device_id = 0, .block_set_id = 41,
                        .num_regions = 4, .region_base = pb};
  kvbm_fabric_local_set *set = NULL;
  REFUSED(KVBM_EUNSUPPORTED, kvbm_fabric_register(f, &d, &set, &e));
  CHECK(strstr(e.msg, "not device memory") != NULL && set == NULL);
  CU(cudaFreeHost(pinned));

  /* ONE allocation, four regions at an offset inside it */
  /* some room ahead of the first region, chosen so that the allocation is
   * a whole number of 2 MiB pages: no rounding of its size can hide the
   * region pushed past its end below */
  size_t body = 4 * lay.region_size, page = 2u << 20;
  size_t head = (body + page - 1) / page * page - body;
  if (head < 4096) head += page;
  uint8_t *dev;
  CU(cudaMalloc((void **)&dev, head + 4 * lay.region_size));
  for (int r = 0; r < 4; r++) pb[r] = (uint64_t)(uintptr_t)(dev + head + r * lay.region_size);
  /* a region reaching past its allocation is refused */
  pb[3] += 256;
  REFUSED(KVBM_EINVAL, kvbm_fabric_register(f, &d, &set, &e));
  pb[3] -= 256;
  uint64_t seed;
  CHECK(getrandom(&seed, sizeof seed, 0) == sizeof seed);
  uint64_t nb = lay.config.num_blocks, nl = lay.config.num_layers, ls = lay.layer_stride;
  uint8_t *host = malloc(ls);
  for (uint64_t b = 0; b < nb; b++)
    for (uint64_t l = 0; l < nl; l++) {
      kvbm_slice s;
      OK(kvbm_layout_block_layer(&lay, b, l, &s, &e_));
      fill(host, ls, seed, b, l);
      CU(cudaMemcpy((uint8_t *)(uintptr_t)pb[s.region] + s.offset, host, ls, cudaMemcpyHostToDevice));
    }
  CU(cudaDeviceSynchronize());
  OK(kvbm_fabric_register(f, &d, &set, &e_));
  uint8_t *wire;
  size_t wire_len;
  OK(kvbm_fabric_export(set, &wire, &wire_len, &e_));
  uint8_t *msg = malloc(8 + wire_len);
  memcpy(msg, &seed, 8);
  memcpy(msg + 8, wire, wire_len);
  OK(kvbm_fabric_push(f, msg, 8 + wire_len, NULL, &e_));
  OK(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));

  /* the child's writes, then its done */
  kvbm_fabric_handle h;
  size_t len;
  uint64_t seed2;
  rc = kvbm_fabric_next(f, TIMEOUT_MS, &h, &len, &e);
  if (rc) fprintf(stderr, "parent: waiting for the child's writes: %s (child exit %d)\n", e.msg, reap(5000));
  CHECK(rc == KVBM_OK && len == 8);
  OK(kvbm_fabric_pull(f, h, &seed2, 8, &len, TIMEOUT_MS, &e_));
  uint8_t *got = malloc(ls), *want = malloc(ls);
  uint64_t bad = 0;
  for (uint64_t b = 0; b < nb; b++)
    for (uint64_t l = 0; l < nl; l++) {
      kvbm_slice s;
      OK(kvbm_layout_block_layer(&lay, b, l, &s, &e_));
      memset(got, 0xC3, ls);
      CU(cudaMemcpy(got, (uint8_t *)(uintptr_t)pb[s.region] + s.offset, ls, cudaMemcpyDeviceToHost));
      bool written = b >= WRITE_FIRST && b < WRITE_FIRST + WRITE_COUNT;
      fill(want, ls, written ? seed2 : seed, b, l);
      if (memcmp(got, want, ls) != 0) bad++;
    }
  if (bad) fprintf(stderr, "parent: %llu block layers differ after the child's writes\n", (unsigned long long)bad);
  CHECK(bad == 0);
  char done[8];
  OK(kvbm_fabric_next(f, TIMEOUT_MS, &h, &len, &e_));
  OK(kvbm_fabric_pull(f, h, done, sizeof done, &len, TIMEOUT_MS, &e_));
  CHECK(len == 4 && memcmp(done, "done", 4) == 0);

  kvbm_fabric_local_set_release(set);
  kvbm_fabric_destroy(f); /* waits for the child's bye */
  kvbm_fabric_cudaipc_listener_destroy(lst);
  int st = reap(20000);
  if (st != 0) fprintf(stderr, "parent: child exit %d (a line number of this file mod 250, + 1)\n", st);
  CHECK(st == 0);
  CU(cudaFree(dev));
  free(host);
  free(got);
  free(want);
  free(msg);
  free(wire);
}

/* Forks a probe so that the parent itself never initialises CUDA before
 * its own fork: 0 = a device answers. */
static int probe_device(char *why, size_t cap) {
  fflush(NULL);
  pid_t p = fork();
  if (p == 0) {
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) fprintf(stderr, "probe: cudaGetDeviceCount: %s\n", cudaGetErrorString(ce));
    _exit(ce == cudaSuccess && n > 0 ? 0 : 77);
  }
  int status = 0;
  if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status)) {
    snprintf(why, cap, "the device probe failed");
    return -1;
  }
  snprintf(why, cap, "no CUDA device (the probe says so above)");
  return WEXITSTATUS(status);
}
#endif

int main(void) {
  const struct CMUnitTest cpu[] = {cmocka_unit_test(test_cpu_refusals)};
  int rc = cmocka_run_group_tests_name("cpu", cpu, NULL, NULL);
  if (rc) return rc;
#ifdef KVBM_HAVE_CUDA
  char why[128];
  if (probe_device(why, sizeof why) != 0) kvbm_test_gpu_skip(why);
  const struct CMUnitTest gpu[] = {cmocka_unit_test_teardown(test_two_processes, teardown)};
  return cmocka_run_group_tests_name("gpu", gpu, NULL, NULL);
#else
  kvbm_test_gpu_or_skip();
  return 77;
#endif
}
