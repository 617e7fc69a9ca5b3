/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_gpu_checksum.c: what the integrity check on the device costs
 * (kvbm_cuda_digest_blocks / kvbm_cuda_verify_blocks, kvbm/cuda.h).
 *
 * Workload W4 (../shared/WORKLOADS.md, data movement): --blocks 2 MiB
 * blocks (32 layers x 16 tokens x 2048 x 2 bytes; 1024 of them: 2 GiB) of
 * random bytes, in pinned host memory (G2) and on the device (G1). Each
 * round measures, on the same bytes and buffers:
 *   onboard   the host-to-device copy of every block from pinned memory,
 *             one cudaMemcpyAsync per block on a non-blocking stream, host
 *             clock from the first call to the stream's synchronization:
 *             what the check rides on. Measured first and again just
 *             before onb+ver; the round's figure is the mean of the two.
 *   d2d       one cudaMemcpyAsync device-to-device of the same bytes
 *             (CUDA events): the memory bandwidth bound of reading them.
 *   kernel    the BLAKE3 kernels alone over every block (CUDA events, mean
 *             of 3 launches; kvbm__cuda_digest_timed).
 *   digest    kvbm_cuda_digest_blocks, host clock: pointer checks,
 *             allocation, table, kernels, digests back.
 *   spans     kvbm_cuda_digest_spans over the same bytes seen as a
 *             LayerSeparate cache (32 layer regions; block b's layer l at
 *             region l + b x 64 KiB: 32 spans a block), host clock.
 *   onb+ver   the onboard and then kvbm_cuda_verify_blocks on the same
 *             stream (no host wait between), host clock.
 *   host      kvbm_blake3_hash of one 2 MiB block on one CPU thread
 *             (16 blocks a round), for comparison.
 * (d2d's GB/s counts the bytes copied: each is read once and written
 * once, so the memory moves twice the bytes the kernel reads.) One
 * untimed warm-up round first. Figures: GB/s median (min-max) over
 * --rounds rounds; ratios measured
 * within each round: kernel / d2d (fraction of the bandwidth bound),
 * digest time / onboard time, and (onb+ver - onboard) / onboard: "checking
 * an onboarded block adds X% to the onboard".
 * Before timing: the device buffer is poisoned, the onboard copies the
 * blocks, every device digest is compared with kvbm_blake3 of the host
 * bytes, verify passes, and a flipped bit is caught.
 *
 * usage: bench_gpu_checksum [--json FILE] [--quick] [--blocks N] [--rounds R] [--device D]
 * Needs a CUDA build with kernels and a GPU (exits 1 saying why otherwise;
 * --help needs neither).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/blake3_hd.h"
#include "kvbm/blake3.h"
#include "bench_util.h"
#include "kvbm/cuda.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void usage(FILE *o) {
  fprintf(o,
          "usage: bench_gpu_checksum [--json FILE] [--quick] [--blocks N (1024)] [--rounds R (7)]\n"
          "                          [--device D (0)]\n"
          "  W4 (2 MiB blocks, 32 x 16 x 2048 x 2): BLAKE3 of every block on the device, against a\n"
          "  device-to-device copy and the pinned host-to-device onboard of the same bytes.\n");
}

#define DIE(...) kvbm_bench_die("bench_gpu_checksum", __VA_ARGS__)

#ifdef KVBM_HAVE_CUDA

#define CK(call) kvbm_bench_cuda_check("bench_gpu_checksum", (call), #call, __LINE__)

#define now kvbm_bench_now

static uint64_t rng = 0x452821e638d01377ull;
static uint64_t rnd(void) { return kvbm_bench_xorshift(&rng); }

typedef kvbm_bench_spread stat3;
#define stats kvbm_bench_spread_of

#define BLOCK (2ull << 20)
#define MAXR 32

enum { ONBOARD, D2D, KERNEL, DIGEST, SPANS, ONBVER, HOST, NF };
static const char *fig_name[NF] = {"onboard", "d2d", "kernel", "digest", "spans", "onb+ver", "host"};
#define LAYERS 32
#define LAYER (BLOCK / LAYERS)

static void onboard(uint8_t *d, const uint8_t *h, uint64_t n, cudaStream_t s) {
  for (uint64_t i = 0; i < n; i++) CK(cudaMemcpyAsync(d + i * BLOCK, h + i * BLOCK, BLOCK, cudaMemcpyHostToDevice, s));
}

int main(int argc, char **argv) {
  const char *json = NULL;
  uint64_t blocks = 1024;
  int rounds = 7, device = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--quick")) blocks = 256, rounds = 5;
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (blocks < 2 || blocks > 16384 || rounds < 1 || rounds > MAXR) DIE("--blocks 2..16384, --rounds 1..%d", MAXR);
  kvbm_error e = {0};
  int ndev = 0, kernels = 0;
  if (kvbm_cuda_available(&ndev, &kernels, &e)) DIE("%s", e.msg);
  if (!kernels) DIE("this build has no CUDA kernels (nvcc not found at build time)");
  if (device < 0 || device >= ndev) DIE("no device %d (%d present)", device, ndev);
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  int rt = 0, drv = 0;
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  printf("device %d: %s (sm_%d%d, %d SMs), runtime %d, driver %d; W4: %llu blocks of 2 MiB (%.2f GiB), %d rounds\n",
         device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, rt, drv, (unsigned long long)blocks,
         (double)(blocks * BLOCK) / (1u << 30), rounds);
  CK(cudaSetDevice(device));
  double t_start = now();
  const uint64_t total = blocks * BLOCK;
  uint8_t *h = NULL, *d = NULL, *d2 = NULL;
  CK(cudaMallocHost((void **)&h, total));
  CK(cudaMalloc((void **)&d, total));
  CK(cudaMalloc((void **)&d2, total));
  for (uint64_t i = 0; i < total / 8; i++) {
    uint64_t v = rnd();
    memcpy(h + 8 * i, &v, 8);
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  const void **ptrs = malloc(blocks * sizeof *ptrs);
  uint64_t *lens = malloc(blocks * sizeof *lens);
  uint8_t(*dig)[32] = malloc(blocks * 32), *want = malloc(blocks * 32);
  if (!ptrs || !lens || !dig || !want) DIE("out of memory");
  for (uint64_t i = 0; i < blocks; i++) ptrs[i] = d + i * BLOCK, lens[i] = BLOCK;

  /* Correctness first: poisoned device, onboard, every digest checked. */
  CK(cudaMemset(d, 0xa5, total));
  onboard(d, h, blocks, s);
  CK(cudaStreamSynchronize(s));
  double th = now();
  for (uint64_t i = 0; i < blocks; i++)
    if (kvbm_blake3_hash(h + i * BLOCK, BLOCK, want + 32 * i, 32)) DIE("kvbm_blake3_hash failed");
  th = now() - th;
  memset(dig, 0x5a, blocks * 32);
  if (kvbm_cuda_digest_blocks(device, s, ptrs, lens, (uint32_t)blocks, dig, &e)) DIE("digest: %s", e.msg);
  for (uint64_t i = 0; i < blocks; i++)
    if (memcmp(dig[i], want + 32 * i, 32)) DIE("block %llu: device digest differs from kvbm_blake3", (unsigned long long)i);
  uint32_t bi = 0, bc = 0;
  if (kvbm_cuda_verify_blocks(device, s, ptrs, lens, (uint32_t)blocks, want, 32, &bi, &bc, &e)) DIE("verify: %s", e.msg);
  uint64_t victim = blocks / 3, at = rnd() % BLOCK;
  uint8_t byte;
  CK(cudaMemcpy(&byte, d + victim * BLOCK + at, 1, cudaMemcpyDeviceToHost));
  byte ^= 0x10;
  CK(cudaMemcpy(d + victim * BLOCK + at, &byte, 1, cudaMemcpyHostToDevice));
  if (kvbm_cuda_verify_blocks(device, s, ptrs, lens, (uint32_t)blocks, want, 32, &bi, &bc, &e) != KVBM_ECHECKSUM ||
      bi != victim || bc != 1)
    DIE("a flipped bit in block %llu was not reported (index %u, count %u)", (unsigned long long)victim, bi, bc);
  /* The same bytes as LayerSeparate blocks: 32 spans each. */
  kvbm_cuda_span *sp = malloc(blocks * LAYERS * sizeof *sp);
  uint32_t *counts = malloc(blocks * sizeof *counts);
  uint8_t *cat = malloc(BLOCK), sd[8][32], sw[32];
  if (!sp || !counts || !cat) DIE("out of memory");
  for (uint64_t b = 0; b < blocks; b++) {
    counts[b] = LAYERS;
    for (uint64_t l = 0; l < LAYERS; l++)
      sp[b * LAYERS + l] = (kvbm_cuda_span){d + l * blocks * LAYER + b * LAYER, LAYER};
  }
  if (kvbm_cuda_digest_spans(device, s, sp, counts, 8, sd, &e)) DIE("spans: %s", e.msg);
  for (uint64_t b = 0; b < 8; b++) {
    for (uint64_t l = 0; l < LAYERS; l++) memcpy(cat + l * LAYER, h + l * blocks * LAYER + b * LAYER, LAYER);
    if (kvbm_blake3_hash(cat, BLOCK, sw, 32) || memcmp(sw, sd[b], 32))
      DIE("LayerSeparate block %llu: span digest differs from kvbm_blake3", (unsigned long long)b);
  }
  printf("checked: %llu device digests equal kvbm_blake3 (host, 1 thread: %.2f GB/s over all); a flipped bit is "
         "caught\n",
         (unsigned long long)blocks, (double)total / th / 1e9);

  double t[NF][MAXR];
  /* Round -1 warms up (the first onboard after allocation ran at half
   * speed on an H100) and is overwritten by round 0. */
  for (int rr = -1; rr < rounds; rr++) {
    const int r = rr < 0 ? 0 : rr;
    double t0 = now();
    onboard(d, h, blocks, s);
    CK(cudaStreamSynchronize(s));
    t[ONBOARD][r] = now() - t0;

    float ms = 0;
    CK(cudaEventRecord(ev[0], s));
    CK(cudaMemcpyAsync(d2, d, total, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(ev[1], s));
    CK(cudaEventSynchronize(ev[1]));
    CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    t[D2D][r] = ms * 1e-3;

    if (kvbm__cuda_digest_timed(device, s, ptrs, lens, (uint32_t)blocks, dig, 3, &ms, &e)) DIE("timed: %s", e.msg);
    t[KERNEL][r] = ms * 1e-3;

    t0 = now();
    if (kvbm_cuda_digest_blocks(device, s, ptrs, lens, (uint32_t)blocks, dig, &e)) DIE("digest: %s", e.msg);
    t[DIGEST][r] = now() - t0;
    for (uint64_t i = 0; i < blocks; i++)
      if (memcmp(dig[i], want + 32 * i, 32)) DIE("round %d block %llu: digest differs", r, (unsigned long long)i);

    t0 = now();
    if (kvbm_cuda_digest_spans(device, s, sp, counts, (uint32_t)blocks, dig, &e)) DIE("spans: %s", e.msg);
    t[SPANS][r] = now() - t0;

    t0 = now(); /* the onboard again, next to onb+ver: the mean of both is the round's onboard */
    onboard(d, h, blocks, s);
    CK(cudaStreamSynchronize(s));
    t[ONBOARD][r] = (t[ONBOARD][r] + now() - t0) / 2;

    t0 = now();
    onboard(d, h, blocks, s);
    if (kvbm_cuda_verify_blocks(device, s, ptrs, lens, (uint32_t)blocks, want, 32, &bi, &bc, &e))
      DIE("onboard + verify: %s", e.msg);
    t[ONBVER][r] = now() - t0;

    t0 = now();
    uint8_t hd[32];
    for (int k = 0; k < 16; k++) kvbm_blake3_hash(h + (uint64_t)(k % blocks) * BLOCK, BLOCK, hd, 32);
    t[HOST][r] = (now() - t0) / 16.0 * (double)blocks; /* scaled to the same bytes */
  }
  stat3 gb[NF];
  double v[MAXR];
  for (int f = 0; f < NF; f++) {
    for (int r = 0; r < rounds; r++) v[r] = (double)total / t[f][r] / 1e9;
    gb[f] = stats(v, rounds);
  }
  for (int r = 0; r < rounds; r++) v[r] = t[D2D][r] / t[KERNEL][r];
  stat3 r_bound = stats(v, rounds);
  for (int r = 0; r < rounds; r++) v[r] = t[DIGEST][r] / t[ONBOARD][r];
  stat3 r_alone = stats(v, rounds);
  for (int r = 0; r < rounds; r++) v[r] = (t[ONBVER][r] - t[ONBOARD][r]) / t[ONBOARD][r];
  stat3 r_adds = stats(v, rounds);
  for (int r = 0; r < rounds; r++) v[r] = t[HOST][r] / t[KERNEL][r];
  stat3 r_host = stats(v, rounds);

  printf("figure    GB/s median (min-max) over %d rounds (same %.2f GiB each)\n", rounds,
         (double)total / (1u << 30));
  for (int f = 0; f < NF; f++)
    printf("%-9s %9.1f (%.1f-%.1f)\n", fig_name[f], gb[f].median, gb[f].min, gb[f].max);
  printf("(d2d counts bytes copied: each read and written once)\n");
  printf("kernel / d2d copy (bandwidth bound): %.3f (%.3f-%.3f)\n", r_bound.median, r_bound.min, r_bound.max);
  printf("digest call time / onboard time: %.3f (%.3f-%.3f)\n", r_alone.median, r_alone.min, r_alone.max);
  printf("device kernel speed-up over 1 host thread: %.0fx (%.0f-%.0f)\n", r_host.median, r_host.min, r_host.max);
  double elapsed = now() - t_start;
  printf("bench_gpu_checksum: %s: W4 BLAKE3 on the device %.1f GB/s (kernel, %.2f of a D2D copy); checking an "
         "onboarded block adds %.1f%% (%.1f-%.1f) to the onboard; %.1f s\n",
         prop.name, gb[KERNEL].median, r_bound.median, 100 * r_adds.median, 100 * r_adds.min, 100 * r_adds.max, elapsed);
  if (json) {
    FILE *o = fopen(json, "w");
    if (!o) DIE("cannot write %s: %s", json, strerror(errno));
    fprintf(o, "{\"bench\": \"bench_gpu_checksum\", \"workload\": \"W4\", \"device\": \"%s\", \"runtime\": %d, "
               "\"driver\": %d, \"blocks\": %llu, \"block_bytes\": %llu, \"rounds\": %d, \"gbps\": {",
            prop.name, rt, drv, (unsigned long long)blocks, (unsigned long long)BLOCK, rounds);
    for (int f = 0; f < NF; f++)
      fprintf(o, "%s\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}", f ? ", " : "", fig_name[f], gb[f].median,
              gb[f].min, gb[f].max);
    fprintf(o, "}, \"kernel_over_d2d\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}, "
               "\"digest_over_onboard\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}, "
               "\"verify_adds_to_onboard\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}, "
               "\"kernel_over_host_thread\": {\"median\": %.2f, \"min\": %.2f, \"max\": %.2f}, \"seconds\": %.2f}\n",
            r_bound.median, r_bound.min, r_bound.max, r_alone.median, r_alone.min, r_alone.max, r_adds.median, r_adds.min,
            r_adds.max, r_host.median, r_host.min, r_host.max, elapsed);
    fclose(o);
  }
  CK(cudaEventDestroy(ev[0]));
  CK(cudaEventDestroy(ev[1]));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFree(d2));
  CK(cudaFreeHost(h));
  free(ptrs), free(lens), free(dig), free(want), free(sp), free(counts), free(cat);
  return 0;
}

#else /* !KVBM_HAVE_CUDA */

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
  DIE("this build has no CUDA runtime");
}
#endif
