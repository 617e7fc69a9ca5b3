/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_tiers.c: workload W4 (../shared/WORKLOADS.md), data movement
 * between the manager's tiers, against bounds measured in the same run.
 *
 * Blocks of 2 MiB: 32 layers x 2 (K, V) x 16 tokens x 1024 x 2 bytes (the
 * bf16 KV of an 8-head, 128-dim model: 32 x 16 x 2048 x 2 bytes).
 *
 *   G1 -> G2 offload and G2 -> G1 onboard, through the manager (commit to
 *     flush, prefill to wait), as a ratio to memcpy of the same bytes
 *     (2 MiB at a time, one thread, warm buffers);
 *   G2 -> G3 offload and G3 -> G1 onboard (the slot file, O_DIRECT through
 *     io_uring), as a ratio to plain O_DIRECT sequential pwrite / pread of
 *     the same bytes in 2 MiB requests to a preallocated file in the same
 *     directory.
 *
 * Fairness. Each ratio is the median over --reps of a per-rep ratio whose
 * bound is measured right before and right after the timed path (their
 * mean), so a shared disk's drift hits both alike. Same bytes (n blocks of
 * 2 MiB, plus one 4 KiB header page per slot on our side), same file
 * system, same memory (n distinct 2 MiB blocks, warm). Both files are
 * preallocated AND written once before timing (an unmeasured warm-up
 * round for the manager, a full pass for the raw file), so every timed
 * write overwrites written extents on both sides: a write into a fresh
 * fallocated extent also converts it (journalled), which made the raw
 * bound slower than the steady-state tier before and flattered G2 -> G3.
 * The bound keeps one 2 MiB request in flight (plain pread/pwrite); the
 * tier keeps --qd (a kernel interface the bound does not get to use) and
 * also checksums every byte and verifies before counting a block.
 *
 * usage: bench_tiers [--blocks N (128)] [--reps R (3)] [--dir DIR (/tmp)]
 *                    [--qd DEPTH (8): G3 requests in flight]
 *                    [--g1-memory system|pinned|device] [--json]
 *
 * --g1-memory device puts G1 in GPU memory and G2 in pinned memory (copies
 * on CUDA streams); it needs a CUDA build and a GPU, and exits 1 saying so
 * otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/manager.h"

#define MiB (1024.0 * 1024.0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint32_t *prompt(uint32_t base, size_t n) {
  uint32_t *t = malloc(n * sizeof *t);
  for (size_t i = 0; t && i < n; i++) t[i] = base + (uint32_t)i;
  return t;
}

/* Writes every block the request must compute (a cheap per-block pattern:
 * the bench measures copies, not pattern generation). */
static void compute(kvbm_manager *m, kvbm_mreq *r, size_t nfull) {
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  uint32_t layers = (uint32_t)kvbm_manager_layout(m, KVBM_TIER_G1)->config.num_layers;
  bool dev = kvbm_manager_memory(m, KVBM_TIER_G1) == KVBM_MEMORY_DEVICE;
  for (size_t k = 0; k < nfull; k++) {
    if (!kvbm_mreq_must_compute(r, k)) continue;
    for (uint32_t l = 0; l < layers; l++) {
      void *p;
      size_t sz;
      kvbm_manager_block_layer(m, KVBM_TIER_G1, ids[k], l, &p, &sz);
      if (!dev) {
        memset(p, (int)(k * 31 + l), sz);
        continue;
      }
      uint8_t *h = malloc(sz); /* device G1: through the host */
      if (!h) continue;
      memset(h, (int)(k * 31 + l), sz);
      kvbm_manager_block_write(m, KVBM_TIER_G1, ids[k], l, h, sz, NULL);
      free(h);
    }
  }
}

static int check(kvbm_manager *m, kvbm_mreq *r, size_t nfull) {
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  uint32_t layers = (uint32_t)kvbm_manager_layout(m, KVBM_TIER_G1)->config.num_layers;
  for (size_t k = 0; k < nfull; k++)
    for (uint32_t l = 0; l < layers; l++) {
      void *p;
      size_t sz;
      kvbm_manager_block_layer(m, KVBM_TIER_G1, ids[k], l, &p, &sz);
      uint8_t b[2];
      /* First and last byte, read through the manager (G1 may be a GPU). */
      if (kvbm_manager_block_read(m, KVBM_TIER_G1, ids[k], l, b, 1, NULL) ||
          b[0] != (uint8_t)(k * 31 + l))
        return 0;
      if (kvbm_manager_memory(m, KVBM_TIER_G1) != KVBM_MEMORY_DEVICE &&
          ((const uint8_t *)p)[sz - 1] != (uint8_t)(k * 31 + l))
        return 0;
    }
  return 1;
}

typedef struct cfg {
  size_t n;
  int reps;
  const char *dir;
  bool json;
  uint32_t qd;
  kvbm_memory_type g1mem;
} cfg;

static kvbm_manager_config mcfg(const cfg *c, uint32_t g2, uint64_t g3) {
  kvbm_manager_config mc = kvbm_manager_config_default();
  mc.block_size = 16;
  mc.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 32, .outer_dim = 2,
                                   .page_size = 16, .inner_dim = 1024, .dtype_size = 2,
                                   .alignment = 4096};
  mc.g1_blocks = (uint32_t)c->n + 1; /* Q then evicts every block of P */
  mc.g2_blocks = g2;
  mc.g3_blocks = g3;
  mc.g3_dir = c->dir;
  mc.g3_policy = KVBM_OFFLOAD_ALL;
  mc.queue_capacity = (uint32_t)(4 * c->n + 16);
  mc.g3_queue_depth = c->qd;
  mc.g1_memory = c->g1mem;
  if (c->g1mem == KVBM_MEMORY_DEVICE) mc.g2_memory = KVBM_MEMORY_PINNED;
  return mc;
}

/* One offload + onboard round: commit P (timed to flush), flood G1 (and
 * G2 when it is small) with Q, prefill P again (timed to wait). */
static int round_trip(const cfg *c, kvbm_manager *m, uint32_t base, double *off_s, double *on_s,
                      kvbm_tier expect_from) {
  size_t ntok = c->n * 16 + 1;
  uint32_t *p = prompt(base, ntok), *q = prompt(base + 50000000u, ntok);
  kvbm_mreq *r;
  kvbm_mreq_info info;
  int ok = 0;
  if (!p || !q || kvbm_manager_prefill(m, 0, 0, p, ntok, &r, NULL, NULL)) goto out;
  compute(m, r, c->n);
  double t0 = now();
  kvbm_mreq_commit(r);
  kvbm_manager_flush(m);
  *off_s = now() - t0;
  kvbm_mreq_destroy(r);
  if (kvbm_manager_prefill(m, 0, 0, q, ntok, &r, NULL, NULL)) goto out;
  compute(m, r, c->n);
  kvbm_mreq_commit(r);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r);
  t0 = now();
  if (kvbm_manager_prefill(m, 0, 0, p, ntok, &r, NULL, NULL)) goto out;
  kvbm_mreq_wait(r, -1, &info);
  *on_s = now() - t0;
  ok = info.hit_blocks[expect_from] == c->n && check(m, r, c->n);
  if (!ok)
    fprintf(stderr, "bench_tiers: expected %zu blocks from %s, got %zu (g1 %zu g2 %zu g3 %zu)\n",
            c->n, kvbm_tier_name(expect_from), info.hit_blocks[expect_from], info.hit_blocks[0],
            info.hit_blocks[1], info.hit_blocks[2]);
  kvbm_mreq_commit(r);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r);
out:
  free(p);
  free(q);
  return ok;
}

/* Mean of two bound timings, before and after the path it bounds. */
static double mean2(double a, double b) { return (a + b) / 2; }

/* memcpy of n blocks of `bytes`, warm buffers. */
static double memcpy_s(uint8_t *dst, const uint8_t *src, size_t n, size_t bytes) {
  double t0 = now();
  for (size_t k = 0; k < n; k++) memcpy(dst + k * bytes, src + k * bytes, bytes);
  return now() - t0;
}

/* The raw O_DIRECT file: unlinked, preallocated, then written once in
 * full (unmeasured), so timed passes overwrite written extents. -1 on
 * failure. */
static int direct_open(const char *dir, size_t n, size_t bytes, uint8_t *buf) {
  char path[4096];
  snprintf(path, sizeof path, "%s/bench-tiers-raw-XXXXXX", dir);
  int t = mkstemp(path);
  if (t < 0) return -1;
  close(t);
  int fd = open(path, O_RDWR | O_DIRECT);
  unlink(path);
  if (fd < 0) return -1;
  int ok = fallocate(fd, 0, 0, (off_t)(n * bytes)) == 0;
  for (size_t k = 0; ok && k < n; k++)
    ok = pwrite(fd, buf + k * bytes, bytes, (off_t)(k * bytes)) == (ssize_t)bytes;
  if (!ok) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Plain O_DIRECT: one sequential pass of n x bytes, 2 MiB at a time, from
 * or into n distinct blocks of memory (as the tiers do). Seconds, or -1. */
static double direct_pass(int fd, size_t n, size_t bytes, uint8_t *buf, bool write) {
  double t0 = now();
  for (size_t k = 0; k < n; k++) {
    ssize_t r = write ? pwrite(fd, buf + k * bytes, bytes, (off_t)(k * bytes))
                      : pread(fd, buf + k * bytes, bytes, (off_t)(k * bytes));
    if (r != (ssize_t)bytes) return -1;
  }
  return now() - t0;
}

/* The bound of one rep: a pass before and a pass after (see the top). */
typedef struct bounds {
  int fd;
  size_t n, bytes;
  uint8_t *a, *b;
  double w[2], r[2], mc[2];
  int phase; /* 0: before the timed paths, 1: after */
  bool ok;
} bounds;

static void measure_bounds(bounds *bd, bool disk) {
  int p = bd->phase;
  if (!disk) {
    bd->mc[p] = memcpy_s(bd->b, bd->a, bd->n, bd->bytes);
    return;
  }
  bd->w[p] = direct_pass(bd->fd, bd->n, bd->bytes, bd->b, true);
  bd->r[p] = direct_pass(bd->fd, bd->n, bd->bytes, bd->b, false);
  if (bd->w[p] < 0 || bd->r[p] < 0) bd->ok = false;
}

int main(int argc, char **argv) {
  cfg c = {.n = 128, .reps = 3, .dir = "/tmp", .qd = 8, .g1mem = KVBM_MEMORY_SYSTEM};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks") && i + 1 < argc) c.n = (size_t)strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) c.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) c.dir = argv[++i];
    else if (!strcmp(argv[i], "--json")) c.json = true;
    else if (!strcmp(argv[i], "--qd") && i + 1 < argc) c.qd = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--g1-memory") && i + 1 < argc && !strcmp(argv[i + 1], "system"))
      c.g1mem = KVBM_MEMORY_SYSTEM, i++;
    else if (!strcmp(argv[i], "--g1-memory") && i + 1 < argc && !strcmp(argv[i + 1], "pinned"))
      c.g1mem = KVBM_MEMORY_PINNED, i++;
    else if (!strcmp(argv[i], "--g1-memory") && i + 1 < argc && !strcmp(argv[i + 1], "device"))
      c.g1mem = KVBM_MEMORY_DEVICE, i++;
    else {
      fprintf(stderr, "usage: bench_tiers [--blocks N] [--reps R] [--dir DIR] [--qd D] "
                      "[--g1-memory system|pinned|device] [--json]\n");
      return 2;
    }
  }
  if (c.n < 1 || c.n > 4096 || c.reps < 1 || c.reps > 50 || c.qd < 1 || c.qd > 128) {
    fprintf(stderr, "bench_tiers: --blocks 1..4096, --reps 1..50, --qd 1..128\n");
    return 2;
  }
  struct statfs sf;
  if (statfs(c.dir, &sf) == 0 && sf.f_type == 0x01021994)
    fprintf(stderr, "bench_tiers: %s is tmpfs: O_DIRECT is refused there, use --dir on a disk\n",
            c.dir);

  kvbm_error e = {0};
  kvbm_manager *mh, *md = NULL;
  kvbm_manager_config hc = mcfg(&c, (uint32_t)(2 * c.n + 4), 0);
  if (kvbm_manager_create(&hc, &mh, &e)) {
    fprintf(stderr, "bench_tiers: %s\n", e.msg);
    if (c.g1mem != KVBM_MEMORY_SYSTEM)
      fprintf(stderr, "bench_tiers: --g1-memory %s needs a CUDA build and a GPU\n",
              kvbm_memory_type_name(c.g1mem));
    return 1;
  }
  size_t bytes = kvbm_manager_block_bytes(mh);
  double total = (double)(c.n * bytes);
  uint8_t *a = NULL, *b = NULL;
  if (posix_memalign((void **)&a, 2 << 20, c.n * bytes) ||
      posix_memalign((void **)&b, 2 << 20, c.n * bytes)) {
    fprintf(stderr, "bench_tiers: out of memory\n");
    return 1;
  }
  /* The bounds' memory is the tiers' kind: 2 MiB-aligned, advised huge
   * (as the manager backs large host tiers), so both sides' O_DIRECT
   * requests are built from the same page sizes. */
  madvise(a, c.n * bytes, MADV_HUGEPAGE);
  madvise(b, c.n * bytes, MADV_HUGEPAGE);
  memset(a, 1, c.n * bytes);
  memset(b, 2, c.n * bytes);

  /* Per rep: times (for GB/s) and ratios to the bound around them. */
  size_t R = (size_t)c.reps;
  double *off2 = calloc(R, sizeof(double)), *on2 = calloc(R, sizeof(double));
  double *mc = calloc(R, sizeof(double)), *q_off2 = calloc(R, sizeof(double));
  double *q_on2 = calloc(R, sizeof(double));
  double *off3 = calloc(R, sizeof(double)), *on3 = calloc(R, sizeof(double));
  double *rw = calloc(R, sizeof(double)), *rr = calloc(R, sizeof(double));
  double *q_off3 = calloc(R, sizeof(double)), *q_on3 = calloc(R, sizeof(double));
  bounds bd = {.fd = -1, .n = c.n, .bytes = bytes, .a = a, .b = b, .ok = true};
  double t_off, t_on;
  memcpy_s(b, a, c.n, bytes); /* warm */
  int ok = round_trip(&c, mh, 7u * 100000000u, &t_off, &t_on, KVBM_TIER_G2); /* warm-up */
  for (int i = 0; i < c.reps && ok; i++) {
    bd.phase = 0;
    measure_bounds(&bd, false);
    ok = round_trip(&c, mh, (uint32_t)(i + 1) * 100000000u, &off2[i], &on2[i], KVBM_TIER_G2);
    bd.phase = 1;
    measure_bounds(&bd, false);
    mc[i] = mean2(bd.mc[0], bd.mc[1]);
    q_off2[i] = mc[i] / off2[i];
    q_on2[i] = mc[i] / on2[i];
  }
  kvbm_manager_destroy(mh);

  kvbm_manager_config dc = mcfg(&c, (uint32_t)c.n, 2 * c.n + 8);
  if (ok && kvbm_manager_create(&dc, &md, &e)) {
    fprintf(stderr, "bench_tiers: %s\n", e.msg);
    return 1;
  }
  const char *mode = ok ? kvbm_manager_g3_mode(md) : "";
  if (ok && !*mode) {
    fprintf(stderr, "bench_tiers: G3 unavailable: %s\n", kvbm_manager_g3_error(md));
    ok = 0;
  }
  if (ok && (bd.fd = direct_open(c.dir, c.n, bytes, b)) < 0) {
    fprintf(stderr, "bench_tiers: plain O_DIRECT I/O in %s failed: %s\n", c.dir, strerror(errno));
    ok = 0;
  }
  /* Warm-up: every G3 slot the timed reps use has been written once. */
  if (ok) ok = round_trip(&c, md, 9u * 100000000u, &t_off, &t_on, KVBM_TIER_G3);
  for (int i = 0; i < c.reps && ok; i++) {
    bd.phase = 0;
    measure_bounds(&bd, true);
    ok = round_trip(&c, md, (uint32_t)(i + 10) * 100000000u, &off3[i], &on3[i], KVBM_TIER_G3);
    bd.phase = 1;
    measure_bounds(&bd, true);
    if (!bd.ok) {
      fprintf(stderr, "bench_tiers: plain O_DIRECT I/O in %s failed: %s\n", c.dir, strerror(errno));
      ok = 0;
    }
    rw[i] = mean2(bd.w[0], bd.w[1]);
    rr[i] = mean2(bd.r[0], bd.r[1]);
    q_off3[i] = rw[i] / off3[i];
    q_on3[i] = rr[i] / on3[i];
  }
  if (bd.fd >= 0) close(bd.fd);
  char modebuf[64] = "";
  if (ok) snprintf(modebuf, sizeof modebuf, "%s", mode);
  kvbm_manager_destroy(md);
  if (!ok) return 1;

  double m_mc = median(mc, c.reps), m_off2 = median(off2, c.reps), m_on2 = median(on2, c.reps);
  double m_off3 = median(off3, c.reps), m_on3 = median(on3, c.reps);
  double m_rw = median(rw, c.reps), m_rr = median(rr, c.reps);
  double r_off2 = median(q_off2, c.reps), r_on2 = median(q_on2, c.reps);
  double r_off3 = median(q_off3, c.reps), r_on3 = median(q_on3, c.reps);
  double gb = total / 1e9;
  if (c.json) {
    printf("{\"workload\":\"W4\",\"block_bytes\":%zu,\"blocks\":%zu,\"reps\":%d,\"g3_mode\":\"%s\","
           "\"memcpy_gbps\":%.3f,\"g1_to_g2_gbps\":%.3f,\"g2_to_g1_gbps\":%.3f,"
           "\"g1_to_g2_ratio\":%.3f,\"g2_to_g1_ratio\":%.3f,"
           "\"direct_write_gbps\":%.3f,\"direct_read_gbps\":%.3f,"
           "\"g2_to_g3_gbps\":%.3f,\"g3_to_g1_gbps\":%.3f,"
           "\"g2_to_g3_ratio\":%.3f,\"g3_to_g1_ratio\":%.3f}\n",
           bytes, c.n, c.reps, modebuf, gb / m_mc, gb / m_off2, gb / m_on2, r_off2, r_on2,
           gb / m_rw, gb / m_rr, gb / m_off3, gb / m_on3, r_off3, r_on3);
  } else {
    printf("W4 data movement: %zu blocks of %.0f MiB (32 layers x 2 x 16 tokens x 1024 x 2 B), "
           "median of %d\n", c.n, (double)bytes / MiB, c.reps);
    printf("  memcpy bound            %6.2f GB/s\n", gb / m_mc);
    printf("  G1 -> G2 offload        %6.2f GB/s  ratio %.2f (target 0.8)\n", gb / m_off2, r_off2);
    printf("  G2 -> G1 onboard        %6.2f GB/s  ratio %.2f (target 0.8)\n", gb / m_on2, r_on2);
    printf("  O_DIRECT write bound    %6.2f GB/s  (plain pwrite, 2 MiB, %s)\n", gb / m_rw, c.dir);
    printf("  O_DIRECT read bound     %6.2f GB/s  (plain pread, 2 MiB)\n", gb / m_rr);
    printf("  G2 -> G3 offload        %6.2f GB/s  ratio %.2f (target 0.8; %s)\n", gb / m_off3,
           r_off3, modebuf);
    printf("  G3 -> G1 onboard        %6.2f GB/s  ratio %.2f (target 0.8)\n", gb / m_on3, r_on3);
    printf("  (ratios: median over reps of the rep's bound, before and after, / its time;\n"
           "   per rep G2->G3:");
    for (int i = 0; i < c.reps; i++) printf(" %.2f", q_off3[i]);
    printf("; G3->G1:");
    for (int i = 0; i < c.reps; i++) printf(" %.2f", q_on3[i]);
    printf(")\n");
  }
  free(a);
  free(b);
  free(off2);
  free(on2);
  free(mc);
  free(off3);
  free(on3);
  free(rw);
  free(rr);
  free(q_off2);
  free(q_on2);
  free(q_off3);
  free(q_on3);
  return 0;
}
