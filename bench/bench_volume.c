/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_volume.c: workload W4 (../shared/WORKLOADS.md) for the storage
 * interface, G2 <-> G4: 2 MiB blocks from host memory into a volume and
 * back, as a ratio to a bound measured in the same run.
 *
 *   redis://   kvbm_volume put/get batches against a Redis that the bench
 *              starts itself (redis-server on a free loopback port, no
 *              persistence), or --redis URL; the bound is a plain hiredis
 *              loop on one connection: redisCommand("SET %b %b") /
 *              redisCommand("GET %b") of the same value size, one at a
 *              time, reply freed (no copy into a destination: the bound
 *              is Redis's own bandwidth, the volume copies into the
 *              caller's block). Also reported: the same loop with --batch
 *              commands pipelined (redisAppendCommand), a stricter bound.
 *   file://    kvbm_volume put/get against a directory (--dir, default
 *              /tmp); the bound is plain open(O_CREAT|O_EXCL)+write+close
 *              +rename of the same bytes per block, and open+read+close,
 *              in a sibling directory of the same file system.
 *
 * Fairness. Both sides move the same bytes (n distinct 2 MiB blocks, warm
 * memory) to the same server or file system, over keys or files that
 * already exist (an unmeasured warm-up pass writes them all first, so
 * every timed put replaces a value on both sides). Each rep measures the
 * bound right before and right after the volume and takes the ratio to
 * their mean; the figure is the median over --reps, with min and max.
 * The volume runs as the tier above would use it: batches of --batch ops,
 * --inflight batches submitted at once, --threads I/O threads.
 *
 * usage: bench_volume [--blocks N (64)] [--reps R (5)] [--block-mib M (2)]
 *                     [--batch B (8)] [--inflight Q (2)] [--threads T (1)]
 *                     [--redis URL] [--dir DIR (/tmp)]
 *                     [--only redis|file|disk] [--json]
 *
 * --only disk (not in the default run; it needs a disk, not tmpfs): the
 * disk:// volume (G3's slot file, O_DIRECT through io_uring) against plain
 * O_DIRECT sequential pwrite/pread of the same 2 MiB blocks to a
 * preallocated file in the same directory, one request at a time; both
 * sides overwrite data written in the warm-up.
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/volume.h"

typedef struct opts {
  int blocks, reps, batch, inflight, threads;
  size_t block;
  const char *redis, *dir, *only;
  bool json;
} opts;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- the volume side ---- */

typedef struct inflight {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int outstanding;
  int failed;
} inflight;

static void on_done(void *user, kvbm_volume_op *ops, size_t n) {
  inflight *f = user;
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += ops[i].status != KVBM_OK;
  pthread_mutex_lock(&f->mu);
  f->outstanding--;
  f->failed += bad;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* Moves every block through the volume (put or get) in batches of
 * o->batch, o->inflight at a time; returns seconds, or -1 on a failure. */
static double volume_pass(kvbm_volume *v, const opts *o, uint8_t **blocks, uint8_t **outs,
                          bool put) {
  int n = o->blocks;
  kvbm_volume_op *ops = calloc((size_t)n, sizeof *ops);
  for (int i = 0; i < n; i++)
    ops[i] = put ? (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)i,
                                    .src = blocks[i], .len = o->block}
                 : (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = (uint64_t)i,
                                    .dst = outs[i], .cap = o->block};
  inflight f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  double t0 = now();
  for (int i = 0; i < n; i += o->batch) {
    pthread_mutex_lock(&f.mu);
    while (f.outstanding >= o->inflight) pthread_cond_wait(&f.cv, &f.mu);
    f.outstanding++;
    pthread_mutex_unlock(&f.mu);
    size_t k = (size_t)(n - i < o->batch ? n - i : o->batch);
    int rc;
    while ((rc = kvbm_volume_submit(v, ops + i, k, on_done, &f)) == KVBM_EAGAIN) usleep(100);
    if (rc) {
      fprintf(stderr, "bench_volume: submit: %s\n", kvbm_strerror(rc));
      exit(1);
    }
  }
  pthread_mutex_lock(&f.mu);
  while (f.outstanding) pthread_cond_wait(&f.cv, &f.mu);
  pthread_mutex_unlock(&f.mu);
  double t = now() - t0;
  if (!put)
    for (int i = 0; i < n && !f.failed; i++)
      if (memcmp(outs[i], blocks[i], o->block)) f.failed++;
  free(ops);
  if (f.failed) {
    fprintf(stderr, "bench_volume: %d ops failed or returned wrong bytes\n", f.failed);
    return -1;
  }
  return t;
}

/* ---- the Redis bound ---- */

static double hiredis_pass(redisContext *c, const opts *o, uint8_t **blocks, bool put) {
  double t0 = now();
  for (int i = 0; i < o->blocks; i++) {
    char key[32];
    int kl = snprintf(key, sizeof key, "bound/%016x", i);
    redisReply *r = put ? redisCommand(c, "SET %b %b", key, (size_t)kl, blocks[i], o->block)
                        : redisCommand(c, "GET %b", key, (size_t)kl);
    if (!r || (put && r->type != REDIS_REPLY_STATUS) ||
        (!put && (r->type != REDIS_REPLY_STRING || r->len != o->block))) {
      fprintf(stderr, "bench_volume: hiredis %s failed\n", put ? "SET" : "GET");
      exit(1);
    }
    freeReplyObject(r);
  }
  return now() - t0;
}

/* The same with --batch commands pipelined (redisAppendCommand, then the
 * replies): a stricter bound, reported alongside. */
static double hiredis_pipelined(redisContext *c, const opts *o, uint8_t **blocks, bool put) {
  double t0 = now();
  for (int i = 0; i < o->blocks; i += o->batch) {
    int k = o->blocks - i < o->batch ? o->blocks - i : o->batch;
    for (int j = i; j < i + k; j++) {
      char key[32];
      int kl = snprintf(key, sizeof key, "bound/%016x", j);
      if (put) redisAppendCommand(c, "SET %b %b", key, (size_t)kl, blocks[j], o->block);
      else redisAppendCommand(c, "GET %b", key, (size_t)kl);
    }
    for (int j = 0; j < k; j++) {
      void *r = NULL;
      if (redisGetReply(c, &r) != REDIS_OK || !r) {
        fprintf(stderr, "bench_volume: hiredis pipeline failed\n");
        exit(1);
      }
      freeReplyObject(r);
    }
  }
  return now() - t0;
}

/* ---- the file bound ---- */

static double files_pass(const char *dir, const opts *o, uint8_t **blocks, uint8_t **outs,
                         bool put) {
  double t0 = now();
  for (int i = 0; i < o->blocks; i++) {
    char path[4200], tmp[4200];
    snprintf(path, sizeof path, "%s/%016x", dir, i);
    if (put) {
      snprintf(tmp, sizeof tmp, "%s/.%016x.tmp", dir, i);
      int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      bool ok = fd >= 0 && write(fd, blocks[i], o->block) == (ssize_t)o->block;
      ok = fd >= 0 && close(fd) == 0 && ok && rename(tmp, path) == 0;
      if (!ok) {
        fprintf(stderr, "bench_volume: write %s: %s\n", tmp, strerror(errno));
        exit(1);
      }
    } else {
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      bool ok = fd >= 0 && read(fd, outs[i], o->block) == (ssize_t)o->block;
      if (fd >= 0) close(fd);
      if (!ok) {
        fprintf(stderr, "bench_volume: read %s: %s\n", path, strerror(errno));
        exit(1);
      }
    }
  }
  return now() - t0;
}

/* ---- the disk bound: O_DIRECT sequential pwrite/pread ---- */

typedef struct raw_disk {
  int fd;
} raw_disk;

static double disk_pass(void *ctx, const opts *o, uint8_t **blocks, uint8_t **outs, bool put) {
  raw_disk *r = ctx;
  double t0 = now();
  for (int i = 0; i < o->blocks; i++) {
    off_t off = (off_t)i * (off_t)o->block;
    ssize_t n = put ? pwrite(r->fd, blocks[i], o->block, off) : pread(r->fd, outs[i], o->block, off);
    if (n != (ssize_t)o->block) {
      fprintf(stderr, "bench_volume: raw %s: %s\n", put ? "pwrite" : "pread", strerror(errno));
      exit(1);
    }
  }
  return now() - t0;
}

/* ---- a Redis for the bench ---- */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(fd, (struct sockaddr *)&a, sizeof a);
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

static pid_t start_redis(int port, const char *dir) {
  fflush(stdout); /* the child must not write our buffered lines again */
  pid_t pid = fork();
  if (pid == 0) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl("/usr/bin/redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--dir", dir,
          "--save", "", "--appendonly", "no", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    redisContext *c = redisConnect("127.0.0.1", port);
    if (c && !c->err) {
      redisFree(c);
      return pid;
    }
    if (c) redisFree(c);
    usleep(25000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* ---- runs ---- */

typedef struct result {
  const char *name;
  double gbs[2], bound[2];     /* put, get: medians */
  double ratio[2], lo[2], hi[2]; /* ratio median, min, max */
  bool piped;                  /* redis: the pipelined bound too */
  double pbound[2], pratio[2];
} result;

typedef double (*bound_fn)(void *ctx, const opts *o, uint8_t **blocks, uint8_t **outs, bool put);

static double redis_bound(void *ctx, const opts *o, uint8_t **b, uint8_t **out, bool put) {
  (void)out;
  return hiredis_pass(ctx, o, b, put);
}

static double redis_piped(void *ctx, const opts *o, uint8_t **b, uint8_t **out, bool put) {
  (void)out;
  return hiredis_pipelined(ctx, o, b, put);
}

static double file_bound(void *ctx, const opts *o, uint8_t **b, uint8_t **out, bool put) {
  return files_pass(ctx, o, b, out, put);
}

static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void measure(result *res, kvbm_volume *v, bound_fn bound, bound_fn piped, void *bctx,
                    const opts *o, uint8_t **blocks, uint8_t **outs) {
  double bytes = (double)o->blocks * (double)o->block;
  /* warm-up: every key/file exists on both sides */
  bound(bctx, o, blocks, outs, true);
  if (volume_pass(v, o, blocks, outs, true) < 0) exit(1);
  for (int dir = 0; dir < 2; dir++) {
    bool put = dir == 0;
    double *r = calloc((size_t)o->reps, sizeof *r), *g = calloc((size_t)o->reps, sizeof *g),
           *bd = calloc((size_t)o->reps, sizeof *bd), *pr = calloc((size_t)o->reps, sizeof *pr),
           *pb = calloc((size_t)o->reps, sizeof *pb);
    for (int k = 0; k < o->reps; k++) {
      double p0 = piped ? piped(bctx, o, blocks, outs, put) : 0;
      double b0 = bound(bctx, o, blocks, outs, put);
      double t = volume_pass(v, o, blocks, outs, put);
      double b1 = bound(bctx, o, blocks, outs, put);
      double p1 = piped ? piped(bctx, o, blocks, outs, put) : 0;
      if (t < 0) exit(1);
      double bt = (b0 + b1) / 2, pt = (p0 + p1) / 2;
      r[k] = bt / t;
      g[k] = bytes / t / 1e9;
      bd[k] = bytes / bt / 1e9;
      pr[k] = piped ? pt / t : 0;
      pb[k] = piped ? bytes / pt / 1e9 : 0;
    }
    res->piped = piped != NULL;
    res->pratio[dir] = median_of(pr, o->reps);
    res->pbound[dir] = median_of(pb, o->reps);
    free(pr);
    free(pb);
    qsort(r, (size_t)o->reps, sizeof *r, cmp_d);
    qsort(g, (size_t)o->reps, sizeof *g, cmp_d);
    qsort(bd, (size_t)o->reps, sizeof *bd, cmp_d);
    int m = o->reps / 2;
    res->ratio[dir] = o->reps % 2 ? r[m] : (r[m - 1] + r[m]) / 2;
    res->gbs[dir] = o->reps % 2 ? g[m] : (g[m - 1] + g[m]) / 2;
    res->bound[dir] = o->reps % 2 ? bd[m] : (bd[m - 1] + bd[m]) / 2;
    res->lo[dir] = r[0];
    res->hi[dir] = r[o->reps - 1];
    free(r);
    free(g);
    free(bd);
  }
}

static kvbm_volume *open_volume(const char *url, const opts *o, const char *ns) {
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.slots = (uint64_t)o->blocks; /* disk:// */
  c.block_bytes = o->block;
  c.key_namespace = ns;
  c.threads = (uint32_t)o->threads;
  c.timeout_ms = 60000;
  kvbm_volume *v;
  kvbm_error e;
  if (kvbm_volume_register(&c, &v, &e)) {
    fprintf(stderr, "bench_volume: %s\n", e.msg);
    exit(1);
  }
  return v;
}

static void report(const result *r, const opts *o, bool last) {
  if (o->json) {
    printf("  \"%s\": {\"put_gbs\": %.3f, \"put_bound_gbs\": %.3f, \"put_ratio\": %.3f, "
           "\"put_ratio_min\": %.3f, \"put_ratio_max\": %.3f, \"get_gbs\": %.3f, "
           "\"get_bound_gbs\": %.3f, \"get_ratio\": %.3f, \"get_ratio_min\": %.3f, "
           "\"get_ratio_max\": %.3f, \"put_pipelined_bound_gbs\": %.3f, "
           "\"put_pipelined_ratio\": %.3f, \"get_pipelined_bound_gbs\": %.3f, "
           "\"get_pipelined_ratio\": %.3f}%s\n",
           r->name, r->gbs[0], r->bound[0], r->ratio[0], r->lo[0], r->hi[0], r->gbs[1],
           r->bound[1], r->ratio[1], r->lo[1], r->hi[1], r->pbound[0], r->pratio[0], r->pbound[1],
           r->pratio[1], last ? "" : ",");
    return;
  }
  const char *what[2] = {"put (from G2)", "get (into G2)"};
  for (int d = 0; d < 2; d++) {
    printf("%-7s %-13s %7.3f GB/s  bound %7.3f GB/s  ratio %.3f (min %.3f, max %.3f)\n", r->name,
           what[d], r->gbs[d], r->bound[d], r->ratio[d], r->lo[d], r->hi[d]);
    if (r->piped)
      printf("%-7s %-13s %7s       pipelined bound %7.3f GB/s  ratio %.3f\n", "", "", "",
             r->pbound[d], r->pratio[d]);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: bench_volume [--blocks N] [--reps R] [--block-mib M] [--batch B] "
                  "[--inflight Q] [--threads T] [--redis URL] [--dir DIR] [--only redis|file] "
                  "[--json]\n");
  exit(2);
}

int main(int argc, char **argv) {
  opts o = {64, 5, 8, 2, 1, 2u << 20, NULL, "/tmp", NULL, false};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) { o.json = true; continue; }
    if (!v) usage();
    if (!strcmp(a, "--blocks")) o.blocks = atoi(v);
    else if (!strcmp(a, "--reps")) o.reps = atoi(v);
    else if (!strcmp(a, "--block-mib")) o.block = (size_t)atoi(v) << 20;
    else if (!strcmp(a, "--batch")) o.batch = atoi(v);
    else if (!strcmp(a, "--inflight")) o.inflight = atoi(v);
    else if (!strcmp(a, "--threads")) o.threads = atoi(v);
    else if (!strcmp(a, "--redis")) o.redis = v;
    else if (!strcmp(a, "--dir")) o.dir = v;
    else if (!strcmp(a, "--only")) o.only = v;
    else usage();
    i++;
  }
  if (o.blocks < 1 || o.reps < 1 || o.block < 1 || o.batch < 1 || o.inflight < 1 ||
      o.threads < 1 || o.threads > 64)
    usage();
  uint8_t **blocks = calloc((size_t)o.blocks, sizeof *blocks);
  uint8_t **outs = calloc((size_t)o.blocks, sizeof *outs);
  for (int i = 0; i < o.blocks; i++) {
    if (posix_memalign((void **)&blocks[i], 4096, o.block) ||
        posix_memalign((void **)&outs[i], 4096, o.block)) {
      fprintf(stderr, "bench_volume: out of memory\n");
      return 1;
    }
    for (size_t k = 0; k < o.block; k += 8) {
      uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + k;
      memcpy(blocks[i] + k, &x, 8);
    }
    memset(outs[i], 0, o.block);
  }
  result res[3];
  int nres = 0;
  if (o.json) printf("{\n");
  else
    printf("W4 G2 <-> volume: %d blocks of %zu MiB, %d reps, batch %d, %d in flight, %d I/O "
           "thread(s)\n",
           o.blocks, o.block >> 20, o.reps, o.batch, o.inflight, o.threads);

  if (!o.only || !strcmp(o.only, "redis")) {
    char url[512], dir[] = "/tmp/bench-volume-redis-XXXXXX";
    pid_t pid = 0;
    int port = 0;
    char host[256] = "127.0.0.1";
    if (o.redis) {
      snprintf(url, sizeof url, "%s", o.redis);
      if (sscanf(o.redis, "redis://%255[^:/]:%d", host, &port) != 2) {
        fprintf(stderr, "bench_volume: --redis wants redis://HOST:PORT\n");
        return 2;
      }
    } else {
      if (!mkdtemp(dir)) return 1;
      port = free_port();
      pid = start_redis(port, dir);
      if (pid < 0) {
        fprintf(stderr, "bench_volume: redis-server did not start\n");
        return 1;
      }
      snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    }
    redisContext *c = redisConnect(host, port);
    if (!c || c->err) {
      fprintf(stderr, "bench_volume: cannot connect to %s\n", url);
      return 1;
    }
    kvbm_volume *v = open_volume(url, &o, "w4");
    res[nres] = (result){.name = "redis"};
    measure(&res[nres++], v, redis_bound, redis_piped, c, &o, blocks, outs);
    kvbm_volume_unregister(v);
    redisFree(c);
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, NULL, 0);
      char cmd[600];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
      if (system(cmd)) {
      }
    }
  }
  if (!o.only || !strcmp(o.only, "file")) {
    char base[4096], bdir[4200], url[4300];
    snprintf(base, sizeof base, "%s/bench-volume-file-XXXXXX", o.dir);
    if (!mkdtemp(base)) {
      fprintf(stderr, "bench_volume: cannot make a directory in %s\n", o.dir);
      return 1;
    }
    snprintf(bdir, sizeof bdir, "%s/bound", base);
    mkdir(bdir, 0700);
    snprintf(url, sizeof url, "file://%s", base);
    kvbm_volume *v = open_volume(url, &o, "w4");
    res[nres] = (result){.name = "file"};
    measure(&res[nres++], v, file_bound, NULL, bdir, &o, blocks, outs);
    kvbm_volume_unregister(v);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd)) {
    }
  }
  if (o.only && !strcmp(o.only, "disk")) {
    char base[4096], raw[4200], url[4300];
    snprintf(base, sizeof base, "%s/bench-volume-disk-XXXXXX", o.dir);
    if (!mkdtemp(base)) {
      fprintf(stderr, "bench_volume: cannot make a directory in %s\n", o.dir);
      return 1;
    }
    snprintf(raw, sizeof raw, "%s/raw", base);
    raw_disk rd = {open(raw, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600)};
    if (rd.fd < 0 || fallocate(rd.fd, 0, 0, (off_t)o.blocks * (off_t)o.block) != 0) {
      fprintf(stderr, "bench_volume: %s: O_DIRECT file: %s (tmpfs? use --dir on a disk)\n", raw,
              strerror(errno));
      return 1;
    }
    snprintf(url, sizeof url, "disk://%s", base);
    kvbm_volume *v = open_volume(url, &o, "w4");
    if (!o.json) printf("disk mode: %s\n", kvbm_volume_mode(v));
    res[nres] = (result){.name = "disk"};
    measure(&res[nres++], v, disk_pass, NULL, &rd, &o, blocks, outs);
    kvbm_volume_unregister(v);
    close(rd.fd);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd)) {
    }
  }
  for (int i = 0; i < nres; i++) report(&res[i], &o, i == nres - 1);
  if (o.json) printf("}\n");
  for (int i = 0; i < o.blocks; i++) {
    free(blocks[i]);
    free(outs[i]);
  }
  free(blocks);
  free(outs);
  return 0;
}
