/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_gpu_copy.c: the copy engine (kvbm/cuda.h) between device G1 and
 * pinned host G2, against cudaMemcpyAsync of the same bytes between the
 * same buffers in the same run.
 *
 * Part 1, workload W4 (../shared/WORKLOADS.md, data movement): 2 MiB
 * blocks, 32 layers x 2 (K, V) x 16 tokens x 1024 x 2 bytes (= 32 x 16 x
 * 2048 x 2), FullyContiguous and LayerSeparate, --blocks of them (512:
 * 1 GiB on the device and 1 GiB pinned). Each round moves every block,
 * through a random permutation of ids, as ONE job per method: offload
 * (D2H) and onboard (H2D), layer by layer (the onboard an engine waits on
 * layer by layer), plus FullyContiguous offloads with KVBM_CUDA_BLOCKWISE
 * (whole 2 MiB blocks) by memcpy and by auto. Timed on the host from kvbm_cuda_copy_start to the
 * job's sync (planning included).
 *
 * Part 2, small pieces: blocks of 32 layers of 16 KiB (2 x 16 x 256 x 2
 * bytes), LayerSeparate and FullyContiguous, random ids on both sides, so
 * that no two pieces merge: every 16 KiB layer of every block is one piece
 * (--small-blocks 1024: 32768 pieces, 512 MiB a job). Figure: pieces a
 * second. This is where batching matters.
 *
 * The bound: cudaMemcpyAsync of each whole region (one 2 GiB copy for
 * FullyContiguous, 32 copies of 64 MiB for LayerSeparate) between the same
 * two storages, same direction, on a non-blocking stream, then
 * cudaStreamSynchronize: the link's speed for the same bytes with no
 * per-piece cost. Each round runs the bound, then every method, then the
 * bound again; a method's ratio is its GB/s over the mean of the round's
 * two bounds. Figures: median over --rounds rounds (min-max). Small
 * pieces: the bound's bytes/s divided by 16 KiB gives its pieces/s.
 * Before timing, each method's first job is checked: the destination was
 * poisoned, and sampled blocks are compared byte for byte to the source.
 *
 * usage: bench_gpu_copy [--json FILE] [--quick] [--blocks N] [--small-blocks N]
 *                       [--rounds R] [--device D]
 * Needs a CUDA build and a GPU (exits 1 saying why otherwise; --help needs
 * neither).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvbm/cuda.h"
#include "kvbm/layout.h"
#include "kvbm/storage.h"

#ifdef KVBM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void usage(FILE *o) {
  fprintf(o,
          "usage: bench_gpu_copy [--json FILE] [--quick] [--blocks N (512)]\n"
          "                      [--small-blocks N (1024)] [--rounds R (5)] [--device D (0)]\n"
          "  W4 (2 MiB blocks, 32 x 16 x 2048 x 2) device <-> pinned host through the copy\n"
          "  engine (methods memcpy, batch, kernel, auto), and 16 KiB pieces from random ids,\n"
          "  against cudaMemcpyAsync of the same bytes between the same buffers.\n");
}

#define DIE(...) kvbm_bench_die("bench_gpu_copy", __VA_ARGS__)

#ifdef KVBM_HAVE_CUDA

#define CK(call) kvbm_bench_cuda_check("bench_gpu_copy", (call), #call, __LINE__)

#define now kvbm_bench_now

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { return kvbm_bench_xorshift(&rng); }

typedef kvbm_bench_spread stat3;
#define stats kvbm_bench_spread_of

#define NM 4
static const kvbm_cuda_copy_method methods[NM] = {KVBM_CUDA_COPY_MEMCPY, KVBM_CUDA_COPY_BATCH,
                                                   KVBM_CUDA_COPY_KERNEL, KVBM_CUDA_COPY_AUTO};

typedef struct setup {
  kvbm_layout l;
  kvbm_storage *dev, *host;
  uint64_t n;
  uint64_t *ids_dev, *ids_host; /* pair i: dev block ids_dev[i] <-> host block ids_host[i] */
  cudaStream_t bs;              /* the bound's stream */
} setup;

static void setup_make(setup *s, kvbm_layout_kind kind, uint64_t blocks, uint64_t inner,
                       int32_t device) {
  kvbm_layout_config c = {blocks, 32, 2, 16, inner, 2, 4096};
  kvbm_error e = {0};
  if (kvbm_layout_init(&s->l, kind, &c, &e)) DIE("layout: %s", e.msg);
  kvbm_storage_config sc = kvbm_storage_config_default();
  sc.device_id = device;
  if (kvbm_storage_create(KVBM_MEMORY_DEVICE, &s->l, &sc, &s->dev, &e)) DIE("device storage: %s", e.msg);
  if (kvbm_storage_create(KVBM_MEMORY_PINNED, &s->l, &sc, &s->host, &e)) DIE("pinned storage: %s", e.msg);
  for (uint64_t r = 0; r < s->l.num_regions; r++) {
    uint64_t *h = kvbm_storage_region_base(s->host, r);
    for (uint64_t i = 0; i < s->l.region_size / 8; i++) h[i] = rnd();
    CK(cudaMemcpy(kvbm_storage_region_base(s->dev, r), h, (size_t)s->l.region_size,
                  cudaMemcpyHostToDevice));
  }
  s->n = blocks;
  s->ids_dev = malloc(blocks * sizeof *s->ids_dev);
  s->ids_host = malloc(blocks * sizeof *s->ids_host);
  if (!s->ids_dev || !s->ids_host) DIE("out of memory");
  for (uint64_t i = 0; i < blocks; i++) s->ids_dev[i] = s->ids_host[i] = i;
  for (uint64_t i = blocks - 1; i > 0; i--) { /* two independent shuffles */
    uint64_t j = rnd() % (i + 1), t = s->ids_dev[i];
    s->ids_dev[i] = s->ids_dev[j], s->ids_dev[j] = t;
    j = rnd() % (i + 1), t = s->ids_host[i];
    s->ids_host[i] = s->ids_host[j], s->ids_host[j] = t;
  }
  CK(cudaStreamCreateWithFlags(&s->bs, cudaStreamNonBlocking));
}

static void setup_free(setup *s) {
  CK(cudaStreamDestroy(s->bs));
  kvbm_storage_release(s->dev);
  kvbm_storage_release(s->host);
  free(s->ids_dev), free(s->ids_host);
}

/* Seconds for the bound: every region in one cudaMemcpyAsync. */
static double bound(setup *s, kvbm_cuda_direction dir) {
  double t0 = now();
  for (uint64_t r = 0; r < s->l.num_regions; r++) {
    void *d = kvbm_storage_region_base(s->dev, r), *h = kvbm_storage_region_base(s->host, r);
    if (dir == KVBM_CUDA_OFFLOAD)
      CK(cudaMemcpyAsync(h, d, (size_t)s->l.region_size, cudaMemcpyDeviceToHost, s->bs));
    else
      CK(cudaMemcpyAsync(d, h, (size_t)s->l.region_size, cudaMemcpyHostToDevice, s->bs));
  }
  CK(cudaStreamSynchronize(s->bs));
  return now() - t0;
}

static kvbm_cuda_transfer transfer(setup *s, kvbm_cuda_direction dir, uint32_t flags) {
  kvbm_cuda_transfer t;
  memset(&t, 0, sizeof t);
  int off = dir == KVBM_CUDA_OFFLOAD;
  t.src = off ? s->dev : s->host;
  t.dst = off ? s->host : s->dev;
  t.src_layout = t.dst_layout = &s->l;
  t.direction = dir;
  t.src_blocks = off ? s->ids_dev : s->ids_host;
  t.dst_blocks = off ? s->ids_host : s->ids_dev;
  t.num_blocks = (size_t)s->n;
  t.flags = flags;
  return t;
}

/* Seconds for one job; *calls receives its copy calls. */
static double run_job(kvbm_cuda_copier *c, const kvbm_cuda_transfer *t, uint64_t *calls) {
  kvbm_error e = {0};
  kvbm_cuda_job *j = NULL;
  double t0 = now();
  if (kvbm_cuda_copy_start(c, t, NULL, &j, &e)) DIE("copy_start: %s", e.msg);
  if (kvbm_cuda_job_sync(j, &e)) DIE("job_sync: %s", e.msg);
  double dt = now() - t0;
  if (calls) kvbm_cuda_job_info(j, NULL, calls, NULL);
  if (kvbm_cuda_job_release(j, &e)) DIE("job_release: %s", e.msg);
  return dt;
}

/* Poisons the destination, runs the job once, compares 16 sampled pairs
 * (every layer) byte for byte. */
static void verify(kvbm_cuda_copier *c, setup *s, const kvbm_cuda_transfer *t, const char *what) {
  int off = t->direction == KVBM_CUDA_OFFLOAD;
  for (uint64_t r = 0; r < s->l.num_regions; r++) {
    if (off) memset(kvbm_storage_region_base(s->host, r), 0xA5, (size_t)s->l.region_size);
    else CK(cudaMemset(kvbm_storage_region_base(s->dev, r), 0xA5, (size_t)s->l.region_size));
  }
  /* the source side was overwritten by the other direction's jobs, with
   * the same bytes moved back and forth; read it as it is now */
  (void)run_job(c, t, NULL);
  size_t lb = (size_t)s->l.layer_stride;
  uint8_t *a = malloc(lb), *b = malloc(lb);
  if (!a || !b) DIE("out of memory");
  for (int k = 0; k < 16; k++) {
    size_t i = (size_t)(rnd() % t->num_blocks);
    for (uint64_t L = 0; L < s->l.config.num_layers; L++) {
      void *ps, *pd;
      kvbm_error e = {0};
      if (kvbm_storage_block_layer_ptr(t->src, &s->l, t->src_blocks[i], L, &ps, NULL, &e) ||
          kvbm_storage_block_layer_ptr(t->dst, &s->l, t->dst_blocks[i], L, &pd, NULL, &e))
        DIE("%s", e.msg);
      CK(cudaMemcpy(a, ps, lb, cudaMemcpyDefault));
      CK(cudaMemcpy(b, pd, lb, cudaMemcpyDefault));
      if (memcmp(a, b, lb)) DIE("%s: WRONG BYTES in pair %zu layer %llu", what, i, (unsigned long long)L);
    }
  }
  free(a), free(b);
}

typedef struct row {
  const char *part, *layout, *dir, *method;
  stat3 gbps, ratio, bound_gbps;
  uint64_t calls, piece_bytes;
} row;

static row rows[64];
static int nrows;

/* Variant v of a row: the methods, then (FullyContiguous offloads)
 * memcpy and auto with whole blocks. Returns the transfer's flags. */
static int variant(int v, int *m) {
  if (v < NM) return *m = v, 0;
  *m = v == NM ? 0 : NM - 1;
  return KVBM_CUDA_BLOCKWISE;
}

/* Runs one setup: for both directions, every variant, `rounds` rounds, bound before and after. */
static void measure(setup *s, const char *part, kvbm_cuda_copier **cp, int rounds,
                    double *best_ratio, const char **best_what) {
  const kvbm_cuda_direction dirs[2] = {KVBM_CUDA_OFFLOAD, KVBM_CUDA_ONBOARD};
  double bytes = (double)s->n * (double)s->l.config.num_layers * (double)s->l.layer_stride;
  for (int di = 0; di < 2; di++) {
    int nvar = NM + 2 * (di == 0 && s->l.kind == KVBM_LAYOUT_FULLY_CONTIGUOUS);
    double gb[NM + 2][32], ra[NM + 2][32], bg[32];
    uint64_t calls[NM + 2] = {0};
    for (int v = 0; v < nvar; v++) {
      int m, fl = variant(v, &m);
      if (!cp[m]) continue;
      kvbm_cuda_transfer t = transfer(s, dirs[di], (uint32_t)fl);
      char what[128];
      snprintf(what, sizeof what, "%s %s %s %s%s", part, kvbm_layout_kind_name(s->l.kind),
               di ? "onboard" : "offload", kvbm_cuda_copy_method_name(methods[m]),
               fl ? "+blockwise" : "");
      verify(cp[m], s, &t, what);
    }
    for (int r = 0; r < rounds; r++) {
      double b0 = bound(s, dirs[di]);
      double tm[NM + 2];
      for (int v = 0; v < nvar; v++) {
        int m, fl = variant(v, &m);
        if (!cp[m]) continue;
        kvbm_cuda_transfer t = transfer(s, dirs[di], (uint32_t)fl);
        tm[v] = run_job(cp[m], &t, &calls[v]);
      }
      double b1 = bound(s, dirs[di]), bt = (b0 + b1) / 2;
      bg[r] = bytes / bt / 1e9;
      for (int v = 0; v < nvar; v++) {
        int m;
        (void)variant(v, &m);
        if (!cp[m]) continue;
        gb[v][r] = bytes / tm[v] / 1e9;
        ra[v][r] = bt / tm[v];
      }
    }
    stat3 bs = stats(bg, rounds);
    for (int v = 0; v < nvar; v++) {
      int m, fl = variant(v, &m);
      if (!cp[m] || nrows == 64) continue;
      row *w = &rows[nrows++];
      w->part = part;
      w->layout = kvbm_layout_kind_name(s->l.kind);
      w->dir = di ? "onboard" : "offload";
      w->method = !fl ? kvbm_cuda_copy_method_name(methods[m])
                  : m == 0 ? "memcpy+blockwise" : "auto+blockwise";
      w->gbps = stats(gb[v], rounds);
      w->ratio = stats(ra[v], rounds);
      w->bound_gbps = bs;
      w->calls = calls[v];
      w->piece_bytes = s->l.layer_stride;
      double pps = w->gbps.median * 1e9 / (double)s->l.layer_stride;
      printf("%-5s %-16s %-7s %-15s %7.2f GB/s (%6.2f-%6.2f) ratio %5.3f (%5.3f-%5.3f) "
             "bound %6.2f GB/s  %9.0f pieces/s  calls %llu\n",
             part, w->layout, w->dir, w->method, w->gbps.median, w->gbps.min, w->gbps.max,
             w->ratio.median, w->ratio.min, w->ratio.max, bs.median, pps, (unsigned long long)w->calls);
      fflush(stdout);
      int k = di; /* best per direction; whole blocks are not small pieces */
      if (w->ratio.median > best_ratio[k] && !(fl && strcmp(part, "W4") != 0)) {
        best_ratio[k] = w->ratio.median;
        best_what[k] = w->method;
      }
    }
  }
}

static void pcie_link(int device, char *gen, size_t gl, char *width, size_t wl, char *bus, size_t bl) {
  snprintf(gen, gl, "unknown");
  snprintf(width, wl, "unknown");
  if (cudaDeviceGetPCIBusId(bus, (int)bl, device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(bus, bl, "unknown");
    return;
  }
  char low[64], path[160];
  size_t i = 0;
  for (; bus[i] && i + 1 < sizeof low; i++) low[i] = (char)(bus[i] >= 'A' && bus[i] <= 'F' ? bus[i] + 32 : bus[i]);
  low[i] = 0;
  const char *f[2] = {"current_link_speed", "current_link_width"};
  char *out[2] = {gen, width};
  size_t ol[2] = {gl, wl};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", low, f[k]);
    FILE *fp = fopen(path, "r");
    if (!fp) continue;
    if (fgets(out[k], (int)ol[k], fp)) out[k][strcspn(out[k], "\n")] = 0;
    fclose(fp);
  }
}

int main(int argc, char **argv) {
  const char *json = NULL;
  uint64_t blocks = 512, small_blocks = 1024;
  int rounds = 5, device = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--quick")) blocks = 128, small_blocks = 256, rounds = 3;
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--small-blocks") && i + 1 < argc) small_blocks = strtoull(argv[++i], NULL, 10);
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
  if (blocks < 2 || blocks > 65536 || small_blocks < 2 || small_blocks > (1u << 20) || rounds < 1 ||
      rounds > 32)
    DIE("--blocks 2..65536, --small-blocks 2..1048576, --rounds 1..32");
  kvbm_error e = {0};
  int ndev = 0, kernels = 0;
  if (kvbm_cuda_available(&ndev, &kernels, &e)) DIE("%s", e.msg);
  if (device < 0 || device >= ndev) DIE("no device %d (%d present)", device, ndev);
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  char gen[64], width[32], bus[32];
  pcie_link(device, gen, sizeof gen, width, sizeof width, bus, sizeof bus);
  int rt = 0, drv = 0;
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  printf("device %d: %s (sm_%d%d, %d SMs), PCI %s, link %s x%s, runtime %d, driver %d, kernels %s\n",
         device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, bus, gen, width, rt,
         drv, kernels ? "built" : "not built");
  kvbm_cuda_copier *cp[NM] = {0};
  for (int m = 0; m < NM; m++) {
    kvbm_cuda_copier_config cfg = kvbm_cuda_copier_config_default();
    cfg.method = methods[m];
    int rc = kvbm_cuda_copier_create(device, &cfg, &cp[m], &e);
    if (rc == KVBM_EUNSUPPORTED) printf("method %s: not available (%s)\n", kvbm_cuda_copy_method_name(methods[m]), e.msg);
    else if (rc) DIE("copier %s: %s", kvbm_cuda_copy_method_name(methods[m]), e.msg);
  }
  CK(cudaSetDevice(device));
  double t_start = now();
  double best_w4[2] = {0, 0}, best_small[2] = {0, 0};
  const char *w4_what[2] = {"-", "-"}, *small_what[2] = {"-", "-"};
  printf("part  layout           dir     method          GB/s median (min-max) ratio to cudaMemcpyAsync, %d rounds\n", rounds);
  for (int k = 0; k < 2; k++) { /* W4 */
    setup s;
    setup_make(&s, k ? KVBM_LAYOUT_LAYER_SEPARATE : KVBM_LAYOUT_FULLY_CONTIGUOUS, blocks, 1024, device);
    measure(&s, "W4", cp, rounds, best_w4, w4_what);
    setup_free(&s);
  }
  for (int k = 0; k < 2; k++) { /* 16 KiB pieces */
    setup s;
    setup_make(&s, k ? KVBM_LAYOUT_LAYER_SEPARATE : KVBM_LAYOUT_FULLY_CONTIGUOUS, small_blocks, 256, device);
    measure(&s, "16KiB", cp, rounds, best_small, small_what);
    setup_free(&s);
  }
  for (int m = 0; m < NM; m++)
    if (cp[m] && kvbm_cuda_copier_destroy(cp[m], &e)) DIE("destroy: %s", e.msg);
  double elapsed = now() - t_start;
  printf("bench_gpu_copy: %s: W4 offload best ratio %.3f (%s), onboard %.3f (%s) [target 0.9]; "
         "16 KiB pieces offload %.3f (%s), onboard %.3f (%s) of cudaMemcpyAsync; %.1f s\n",
         prop.name, best_w4[0], w4_what[0], best_w4[1], w4_what[1], best_small[0], small_what[0],
         best_small[1], small_what[1], elapsed);
  if (json) {
    FILE *o = fopen(json, "w");
    if (!o) DIE("cannot write %s: %s", json, strerror(errno));
    fprintf(o, "{\"bench\": \"bench_gpu_copy\", \"device\": \"%s\", \"pci_bus\": \"%s\", "
               "\"link_speed\": \"%s\", \"link_width\": \"%s\", \"runtime\": %d, \"driver\": %d, "
               "\"rounds\": %d, \"w4_blocks\": %llu, \"small_blocks\": %llu, \"rows\": [",
            prop.name, bus, gen, width, rt, drv, rounds, (unsigned long long)blocks,
            (unsigned long long)small_blocks);
    for (int i = 0; i < nrows; i++) {
      row *w = &rows[i];
      fprintf(o, "%s{\"workload\": \"%s\", \"layout\": \"%s\", \"dir\": \"%s\", \"method\": \"%s\", "
                 "\"piece_bytes\": %llu, \"gbps\": %.4f, \"gbps_min\": %.4f, \"gbps_max\": %.4f, "
                 "\"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f, \"bound_gbps\": %.4f, "
                 "\"pieces_per_s\": %.1f, \"bound_pieces_per_s\": %.1f, \"calls\": %llu}",
              i ? ", " : "", w->part, w->layout, w->dir, w->method,
              (unsigned long long)w->piece_bytes, w->gbps.median, w->gbps.min, w->gbps.max,
              w->ratio.median, w->ratio.min, w->ratio.max, w->bound_gbps.median,
              w->gbps.median * 1e9 / (double)w->piece_bytes,
              w->bound_gbps.median * 1e9 / (double)w->piece_bytes, (unsigned long long)w->calls);
    }
    fprintf(o, "], \"best\": {\"w4_offload\": %.4f, \"w4_onboard\": %.4f, \"small_offload\": %.4f, "
               "\"small_onboard\": %.4f}, \"seconds\": %.2f}\n",
            best_w4[0], best_w4[1], best_small[0], best_small[1], elapsed);
    fclose(o);
  }
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
