/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_gpu_ipc.c: workload W4 (../shared/WORKLOADS.md, data movement)
 * over the CUDA IPC fabric: two processes on one GPU, the decode node
 * reading (and writing) the prefill node's device blocks, against
 * cudaMemcpy device to device of the same bytes in one process.
 *
 * Blocks of 2 MiB: FullyContiguous, 32 layers x 2 (K, V) x 16 tokens x
 * 1024 x 2 bytes (32 x 16 x 2048 x 2), --blocks of them (512: 1 GiB).
 *
 *   read   the child imports the parent's set and reads every block into
 *          its own device storage: kvbm_fabric_read_block per block (one
 *          cudaMemcpyAsync of 2 MiB from the IPC mapping on the fabric's
 *          stream), then kvbm_fabric_flush; timed from the first read to
 *          the flush's return;
 *   write  the same, kvbm_fabric_write_block from the child's source
 *          buffer into the parent's blocks;
 *   bound  cudaMemcpyAsync device to device of the same bytes, 2 MiB at a
 *          time, from the child's source buffer into the same destination
 *          storage the read fills, on one stream, then
 *          cudaStreamSynchronize: what one process moves between its own
 *          buffers on this GPU, at the same 2 MiB granularity (at HBM
 *          speed a 2 MiB copy takes about as long as its launch, so this
 *          bound counts per-call costs as the fabric's path does);
 *   one copy  (context, not a bound of the same work) the same bytes in
 *          one cudaMemcpyAsync: the device's copy bandwidth.
 *
 * Fairness: each round measures the bound right before and right after
 * the fabric's paths and divides by their mean; the figure is the median
 * over --reps rounds with the min-max of the per-round ratios. Same bytes,
 * same granularity (2 MiB copies), same destination buffers, host wall
 * clock around both. An unmeasured warm-up round first (it pays for the
 * lazy peer mapping); after it, every byte the read brought is compared
 * with the parent's random bytes (regenerated from the seed it sent), the
 * destination having been poisoned before.
 *
 * usage: bench_gpu_ipc [--json FILE] [--quick] [--blocks N] [--reps R]
 * Needs a CUDA build and a GPU (exits 1 saying why otherwise; --help needs
 * neither).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvbm/fabric.h"
#include "kvbm/layout.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void usage(FILE *o) {
  fprintf(o, "usage: bench_gpu_ipc [--json FILE] [--quick] [--blocks N (512)] [--reps R (9)]\n"
             "  W4 (2 MiB blocks, 32 x 16 x 2048 x 2) over the CUDA IPC fabric, two processes on\n"
             "  one GPU: IPC read and write GB/s against cudaMemcpy device-to-device of the same\n"
             "  bytes in one process; --quick: 64 blocks, 3 rounds\n");
}

#ifdef KVBM_HAVE_CUDA

#define TIMEOUT_MS 30000

static const char kKey[] = "bench_gpu_ipc: a key both processes hold";

#define now kvbm_bench_now
typedef kvbm_bench_spread spread;
#define spread_of kvbm_bench_spread_of

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fill(uint8_t *p, size_t n, uint64_t seed, uint64_t block) {
  uint64_t s = seed ^ (block * 0x100000001B3ull);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

static const char *g_who = "parent";

#define DIE(...)                                   \
  do {                                             \
    fprintf(stderr, "bench_gpu_ipc: %s: ", g_who); \
    fprintf(stderr, __VA_ARGS__);                  \
    fprintf(stderr, "\n");                         \
    exit(1);                                       \
  } while (0)
#define CU(call)                                                                                  \
  do {                                                                                            \
    cudaError_t ce_ = (call);                                                                     \
    if (ce_ != cudaSuccess) DIE("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(ce_)); \
  } while (0)
#define KV(call)                                                                                       \
  do {                                                                                                 \
    kvbm_error e_ = {0};                                                                               \
    int rc_ = (call);                                                                                  \
    if (rc_ != KVBM_OK) DIE("%s:%d: %s: %s: %s", __FILE__, __LINE__, #call, kvbm_status_name(rc_), e_.msg); \
  } while (0)

static kvbm_layout w4_layout(uint64_t blocks) {
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = 32, .outer_dim = 2, .page_size = 16,
                          .inner_dim = 1024, .dtype_size = 2, .alignment = 256};
  kvbm_layout l;
  kvbm_error e = {0};
  if (kvbm_layout_init(&l, KVBM_LAYOUT_FULLY_CONTIGUOUS, &c, &e)) DIE("layout: %s", e.msg);
  return l;
}

static kvbm_fabric_cudaipc_config config(const char *name) {
  kvbm_fabric_cudaipc_config c = kvbm_fabric_cudaipc_config_default();
  c.name = name;
  c.key = kKey;
  c.key_len = sizeof kKey - 1;
  c.timeout_ms = TIMEOUT_MS;
  return c;
}

/* The decode node: imports, measures, reports. */
static int child_main(uint16_t port, uint64_t blocks, int reps, const char *json) {
  g_who = "child";
  alarm(120);
  kvbm_fabric_cudaipc_config c = config("decode");
  kvbm_fabric *f;
  KV(kvbm_fabric_cudaipc_connect(&c, "127.0.0.1", port, &f, &e_));
  kvbm_fabric_handle h;
  size_t len;
  KV(kvbm_fabric_next(f, TIMEOUT_MS, &h, &len, &e_));
  if (len <= 8) DIE("the parent's message is %zu bytes", len);
  uint8_t *msg = malloc(len);
  KV(kvbm_fabric_pull(f, h, msg, len, &len, TIMEOUT_MS, &e_));
  uint64_t seed;
  memcpy(&seed, msg, 8);
  kvbm_layout mine = w4_layout(blocks), theirs;
  KV(kvbm_fabric_export_layout(msg + 8, len - 8, &theirs, &e_));
  KV(kvbm_fabric_layout_bridge(&mine, &theirs, &e_));
  if (theirs.config.num_blocks != blocks) DIE("the parent exported %llu blocks", (unsigned long long)theirs.config.num_blocks);
  kvbm_fabric_remote_set *rs;
  KV(kvbm_fabric_import(f, msg + 8, len - 8, &rs, &e_));
  size_t bb = kvbm_fabric_block_bytes(&mine);
  size_t total = bb * blocks;
  uint8_t *dst, *src;
  CU(cudaMalloc((void **)&dst, total));
  CU(cudaMalloc((void **)&src, total));
  uint8_t *host = malloc(bb), *want = malloc(bb);
  for (uint64_t b = 0; b < blocks; b++) {
    fill(host, bb, seed ^ 0xABCDEF, b);
    CU(cudaMemcpy(src + b * bb, host, bb, cudaMemcpyHostToDevice));
  }
  CU(cudaMemset(dst, 0xA5, total));
  CU(cudaDeviceSynchronize());
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  double *rd = calloc((size_t)reps, sizeof *rd), *wr = calloc((size_t)reps, sizeof *wr),
         *bd = calloc((size_t)reps, sizeof *bd), *rr = calloc((size_t)reps, sizeof *rr),
         *wrr = calloc((size_t)reps, sizeof *wrr), *bulk = calloc((size_t)reps, sizeof *bulk);
  for (int rep = -1; rep < reps; rep++) {
    double t0 = now();
    for (uint64_t b = 0; b < blocks; b++) CU(cudaMemcpyAsync(dst + b * bb, src + b * bb, bb, cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    double bound1 = now() - t0;
    if (rep < 0) { /* poisoned before the read that is checked */
      CU(cudaMemset(dst, 0xA5, total));
      CU(cudaDeviceSynchronize());
    }
    t0 = now();
    for (uint64_t b = 0; b < blocks; b++) KV(kvbm_fabric_read_block(f, rs, b, dst + b * bb, bb, &e_));
    KV(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
    double tr = now() - t0;
    if (rep < 0) { /* the warm-up: every byte the read brought */
      for (uint64_t b = 0; b < blocks; b++) {
        memset(host, 0x3C, bb);
        CU(cudaMemcpy(host, dst + b * bb, bb, cudaMemcpyDeviceToHost));
        fill(want, bb, seed, b);
        if (memcmp(host, want, bb) != 0) DIE("block %llu read over IPC differs from the parent's bytes", (unsigned long long)b);
      }
    }
    t0 = now();
    for (uint64_t b = 0; b < blocks; b++) KV(kvbm_fabric_write_block(f, rs, b, src + b * bb, bb, &e_));
    KV(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
    double tw = now() - t0;
    t0 = now();
    for (uint64_t b = 0; b < blocks; b++) CU(cudaMemcpyAsync(dst + b * bb, src + b * bb, bb, cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    double bound2 = now() - t0;
    t0 = now(); /* context: the same bytes in one copy (no per-call cost) */
    CU(cudaMemcpyAsync(dst, src, total, cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    double tbulk = now() - t0;
    if (rep < 0) continue;
    double gb = (double)total / 1e9, bgbps = gb / ((bound1 + bound2) / 2);
    rd[rep] = gb / tr;
    wr[rep] = gb / tw;
    bd[rep] = bgbps;
    rr[rep] = rd[rep] / bgbps;
    wrr[rep] = wr[rep] / bgbps;
    bulk[rep] = gb / tbulk;
  }
  /* the last write put src's bytes into the parent's blocks: read one back */
  KV(kvbm_fabric_read_block(f, rs, blocks - 1, dst, bb, &e_));
  KV(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  CU(cudaMemcpy(host, dst, bb, cudaMemcpyDeviceToHost));
  fill(want, bb, seed ^ 0xABCDEF, blocks - 1);
  if (memcmp(host, want, bb) != 0) DIE("block %llu written over IPC did not arrive", (unsigned long long)(blocks - 1));

  struct cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, 0));
  spread r = spread_of(rd, reps), w = spread_of(wr, reps), bo = spread_of(bd, reps), rq = spread_of(rr, reps),
         wq = spread_of(wrr, reps), bk = spread_of(bulk, reps);
  printf("bench_gpu_ipc: W4 over the CUDA IPC fabric, two processes on one %s\n", p.name);
  printf("  %llu blocks of %zu bytes (%.2f GiB), %d rounds after a warm-up; every byte of the warm-up read checked\n",
         (unsigned long long)blocks, bb, (double)total / (1 << 30), reps);
  printf("  %-34s %9s %9s %9s\n", "", "median", "min", "max");
  printf("  %-34s %9.1f %9.1f %9.1f GB/s\n", "cudaMemcpy D2D, one process (bound)", bo.median, bo.min, bo.max);
  printf("  %-34s %9.1f %9.1f %9.1f GB/s\n", "(context: one D2D copy of it all)", bk.median, bk.min, bk.max);
  printf("  %-34s %9.1f %9.1f %9.1f GB/s\n", "IPC read (decode <- prefill)", r.median, r.min, r.max);
  printf("  %-34s %9.1f %9.1f %9.1f GB/s\n", "IPC write (decode -> prefill)", w.median, w.min, w.max);
  printf("  %-34s %9.3f %9.3f %9.3f\n", "IPC read / bound", rq.median, rq.min, rq.max);
  printf("  %-34s %9.3f %9.3f %9.3f\n", "IPC write / bound", wq.median, wq.min, wq.max);
  if (json) {
    FILE *o = fopen(json, "w");
    if (!o) DIE("cannot write %s: %s", json, strerror(errno));
    fprintf(o,
            "{\"workload\":\"W4\",\"device\":\"%s\",\"blocks\":%llu,\"block_bytes\":%zu,\"reps\":%d,"
            "\"bound_gbps\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
            "\"one_copy_gbps\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
            "\"ipc_read_gbps\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
            "\"ipc_write_gbps\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
            "\"ipc_read_ratio\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f},"
            "\"ipc_write_ratio\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}}\n",
            p.name, (unsigned long long)blocks, bb, reps, bo.median, bo.min, bo.max, bk.median, bk.min, bk.max, r.median, r.min, r.max, w.median,
            w.min, w.max, rq.median, rq.min, rq.max, wq.median, wq.min, wq.max);
    fclose(o);
  }
  fflush(stdout);
  kvbm_fabric_remote_set_release(rs);
  KV(kvbm_fabric_push(f, "done", 4, NULL, &e_));
  KV(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  kvbm_fabric_destroy(f);
  cudaStreamDestroy(s);
  cudaFree(dst);
  cudaFree(src);
  return 0;
}

/* The prefill node: random blocks, the export, then waits for done. */
static int parent_main(kvbm_fabric_cudaipc_listener *l, pid_t child, uint64_t blocks) {
  kvbm_fabric *f;
  KV(kvbm_fabric_cudaipc_accept(l, &f, &e_));
  kvbm_layout lay = w4_layout(blocks);
  size_t bb = kvbm_fabric_block_bytes(&lay);
  uint8_t *dev;
  CU(cudaMalloc((void **)&dev, lay.region_size));
  uint64_t seed;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) DIE("getrandom: %s", strerror(errno));
  uint8_t *host = malloc(bb);
  for (uint64_t b = 0; b < blocks; b++) {
    fill(host, bb, seed, b);
    CU(cudaMemcpy(dev + b * bb, host, bb, cudaMemcpyHostToDevice));
  }
  CU(cudaDeviceSynchronize());
  uint64_t base = (uint64_t)(uintptr_t)dev;
  kvbm_layout_desc d = {.layout = lay, .memory = KVBM_MEMORY_DEVICE, .device_id = 0, .block_set_id = 4,
                        .num_regions = 1, .region_base = &base};
  kvbm_fabric_local_set *ls;
  KV(kvbm_fabric_register(f, &d, &ls, &e_));
  uint8_t *wire;
  size_t wlen;
  KV(kvbm_fabric_export(ls, &wire, &wlen, &e_));
  uint8_t *msg = malloc(8 + wlen);
  memcpy(msg, &seed, 8);
  memcpy(msg + 8, wire, wlen);
  KV(kvbm_fabric_push(f, msg, 8 + wlen, NULL, &e_));
  KV(kvbm_fabric_flush(f, TIMEOUT_MS, &e_));
  kvbm_fabric_handle h;
  size_t len;
  char done[8];
  kvbm_error e = {0};
  int rc = kvbm_fabric_next(f, 90000, &h, &len, &e);
  if (rc == KVBM_OK) rc = kvbm_fabric_pull(f, h, done, sizeof done, &len, TIMEOUT_MS, &e);
  if (rc) fprintf(stderr, "bench_gpu_ipc: parent: the child did not finish: %s\n", e.msg);
  kvbm_fabric_local_set_release(ls);
  kvbm_fabric_destroy(f);
  int status = 0;
  for (int waited = 0; waitpid(child, &status, WNOHANG) != child; waited += 10) {
    if (waited > 20000) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      DIE("the child did not end: killed");
    }
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  cudaFree(dev);
  free(host);
  free(msg);
  free(wire);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) DIE("the child failed (status %d)", status);
  return rc ? 1 : 0;
}
#endif

int main(int argc, char **argv) {
  const char *json = NULL;
  uint64_t blocks = 512;
  int reps = 9;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else if (!strcmp(argv[i], "--quick"))
      blocks = 64, reps = 3;
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc)
      blocks = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (blocks < 1 || blocks > 4096 || reps < 1 || reps > 1000) {
    fprintf(stderr, "bench_gpu_ipc: --blocks 1..4096, --reps 1..1000\n");
    return 2;
  }
#ifdef KVBM_HAVE_CUDA
  /* Listen before any CUDA call, fork, and only then touch the GPU. */
  kvbm_fabric_cudaipc_config c = config("prefill");
  kvbm_fabric_cudaipc_listener *l;
  KV(kvbm_fabric_cudaipc_listen(&c, NULL, 0, &l, &e_));
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) DIE("fork: %s", strerror(errno));
  if (pid == 0) _exit(child_main(kvbm_fabric_cudaipc_listener_port(l), blocks, reps, json));
  int rc = parent_main(l, pid, blocks);
  kvbm_fabric_cudaipc_listener_destroy(l);
  return rc;
#else
  (void)json;
  fprintf(stderr, "bench_gpu_ipc: this build has no CUDA runtime\n");
  return 1;
#endif
}
