/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_worker.c: what `kvbm worker` costs over the manager it drives.
 *
 * Workload W2 (../shared/WORKLOADS.md: W1's sequential Mooncake replay
 * through the tiered manager with real bytes), the first --limit requests
 * of the bundled trace, G1 --g1 blocks and G2 --g2 blocks, no G3/G4, 1 KiB
 * blocks. Two sides in the same run, A B A B:
 *   peer   kvsim_w2_run: the replay calls the manager in-process;
 *   worker a kvsim_worker in this process (its HTTP loop on a thread,
 *          batch 1, prefill and decode speeds of 1e12 tokens/s so the
 *          simulated compute sleeps nothing), fed the same trace lines
 *          as POST /generate bodies, one at a time over one keep-alive
 *          loopback connection.
 * Both write and check every block's bytes and wait for the copies after
 * each request, so the ratio worker/peer of the wall time is what the
 * HTTP service, the JSON bodies, the deferred answer and the executor
 * hand-off add per request. The hit tokens of the two sides must be
 * equal (the worker's tiers behave as W2's): the bench fails otherwise.
 *
 *   bench_worker [--limit N] [--g1 B] [--g2 B] [--rounds R] [--trace PATH]
 *                [--side both|peer|worker]
 * --side runs one side only (for callgrind: instruction counts of each
 * side over every thread, the wall clock on this machine being noisy).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"
#include "worker/worker.h"
#include "workload/trace.h"
#include "workload/w2.h"

static const char *prog = "bench_worker";

typedef struct opts {
  size_t limit;
  uint32_t g1, g2;
  int rounds;
  const char *trace;
  const char *side;
} opts;

static double run_peer(const kvsim_trace *t, const opts *o, uint64_t *hits) {
  kvsim_w2_config c = kvsim_w2_config_default();
  c.w1.limit = o->limit;
  c.w1.capacity = o->g1;
  c.g2_blocks = o->g2;
  c.block_bytes = 1024;
  kvsim_w2_result r;
  kvbm_error err = {0};
  double t0 = kvbm_bench_now();
  if (kvsim_w2_run(t, &c, &r, &err)) kvbm_bench_die(prog, "w2: %s", err.msg);
  double s = kvbm_bench_now() - t0;
  *hits = r.w1.hit_tokens;
  return s;
}

static void *serve(void *arg) {
  kvsim_worker_run(arg, NULL);
  return NULL;
}

/* Sends one request and reads its answer; returns the answer's hit
 * tokens (all tiers). */
static uint64_t one(int fd, const char *body, size_t blen, char *buf, size_t cap) {
  char head[128];
  int hl = snprintf(head, sizeof head,
                    "POST /generate HTTP/1.1\r\nHost: b\r\nContent-Length: %zu\r\n\r\n", blen);
  if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
      send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen)
    kvbm_bench_die(prog, "send failed");
  size_t have = 0;
  char *end = NULL;
  size_t want = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + have, cap - 1 - have, 0);
    if (n <= 0) kvbm_bench_die(prog, "the worker closed the connection");
    have += (size_t)n;
    buf[have] = 0;
    if (!end && (end = strstr(buf, "\r\n\r\n"))) {
      const char *cl = strstr(buf, "Content-Length: ");
      if (!cl) kvbm_bench_die(prog, "no Content-Length");
      want = (size_t)(end + 4 - buf) + strtoul(cl + 16, NULL, 10);
    }
    if (end && have >= want) break;
  }
  if (strncmp(buf, "HTTP/1.1 200", 12)) kvbm_bench_die(prog, "answer: %.300s", buf);
  const char *h = strstr(end, "\"hit_tokens\":{");
  uint64_t sum = 0;
  for (const char *p = h; p && (p = strchr(p, ':')) && p < strchr(h, '}'); p++)
    sum += strtoull(p + 1, NULL, 10);
  if (!strstr(end, "\"wrong_bytes\":0}")) kvbm_bench_die(prog, "wrong bytes: %s", end);
  return sum;
}

static double run_worker(const kvsim_trace *t, const opts *o, size_t n, uint64_t *hits) {
  kvsim_worker_config c = kvsim_worker_config_default();
  c.g1_blocks = o->g1;
  c.g2_blocks = o->g2;
  c.block_bytes = 1024;
  c.prefill_tps = c.decode_tps = 1e12;
  c.batch = 1;
  c.max_tokens = 1u << 20;
  c.memory_budget_mb = 4096;
  kvsim_worker *w;
  kvbm_error err = {0};
  if (kvsim_worker_create(&c, &w, &err)) kvbm_bench_die(prog, "worker: %s", err.msg);
  pthread_t th;
  pthread_create(&th, NULL, serve, w);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(kvsim_worker_port(w))};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) kvbm_bench_die(prog, "connect failed");
  int one_ = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one_, sizeof one_);
  size_t bcap = 1 << 20;
  char *body = malloc(bcap), *buf = malloc(1 << 16);
  *hits = 0;
  double t0 = kvbm_bench_now();
  for (size_t i = 0; i < n; i++) {
    const kvsim_trace_request *q = kvsim_trace_get(t, i);
    if (!q->input_length) continue; /* W2 opens those with an output token; not a body */
    if ((size_t)q->num_hash_ids * 11 + 128 > bcap) kvbm_bench_die(prog, "line %zu too long", i);
    size_t k = (size_t)snprintf(body, bcap, "{\"request_id\":\"r%zu\",\"hash_ids\":[", i);
    for (uint32_t j = 0; j < q->num_hash_ids; j++)
      k += (size_t)snprintf(body + k, bcap - k, j ? ",%u" : "%u", q->hash_ids[j]);
    k += (size_t)snprintf(body + k, bcap - k, "],\"input_length\":%u,\"output_length\":%u}",
                          q->input_length, q->output_length);
    *hits += one(fd, body, k, buf, 1 << 16);
  }
  double s = kvbm_bench_now() - t0;
  close(fd);
  kvsim_worker_stop(w);
  pthread_join(th, NULL);
  kvsim_worker_destroy(w);
  free(body);
  free(buf);
  return s;
}

int main(int argc, char **argv) {
  opts o = {.limit = 300, .g1 = 16384, .g2 = 32768, .rounds = 3, .trace = KVBM_DEFAULT_TRACE,
            .side = "both"};
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--limit")) o.limit = strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--g1")) o.g1 = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--g2")) o.g2 = (uint32_t)strtoul(argv[++i], NULL, 10);
    else if (i + 1 < argc && !strcmp(argv[i], "--rounds")) o.rounds = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--trace")) o.trace = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--side")) o.side = argv[++i];
    else kvbm_bench_die(prog, "usage: bench_worker [--limit N] [--g1 B] [--g2 B] [--rounds R] [--trace PATH]");
  }
  if (o.rounds < 1 || o.rounds > 100 || !o.limit || !o.g1)
    kvbm_bench_die(prog, "--rounds 1..100, --limit and --g1 >= 1");
  bool peer_only = !strcmp(o.side, "peer"), worker_only = !strcmp(o.side, "worker");
  if (!peer_only && !worker_only && strcmp(o.side, "both"))
    kvbm_bench_die(prog, "--side both, peer or worker");
  kvsim_trace *t;
  kvbm_error err = {0};
  if (kvsim_trace_load(o.trace, o.limit, &t, &err)) kvbm_bench_die(prog, "%s", err.msg);
  size_t n = kvsim_trace_count(t);
  double peer[100], work[100], ratio[100];
  uint64_t hp = 0, hw = 0;
  if (peer_only || worker_only) {
    double s = peer_only ? run_peer(t, &o, &hp) : run_worker(t, &o, n, &hw);
    printf("bench_worker: %s side only, %zu requests, %.3f s, hit tokens %llu\n", o.side, n, s,
           (unsigned long long)(peer_only ? hp : hw));
    kvsim_trace_destroy(t);
    return 0;
  }
  for (int r = 0; r < o.rounds; r++) { /* A B A B */
    peer[r] = run_peer(t, &o, &hp);
    work[r] = run_worker(t, &o, n, &hw);
    ratio[r] = work[r] / peer[r];
    if (hp != hw)
      kvbm_bench_die(prog, "hit tokens differ: worker %llu, W2 %llu", (unsigned long long)hw,
                     (unsigned long long)hp);
  }
  kvbm_bench_spread sp = kvbm_bench_spread_of(peer, o.rounds),
                    sw = kvbm_bench_spread_of(work, o.rounds),
                    sr = kvbm_bench_spread_of(ratio, o.rounds);
  printf("bench_worker: W2, %zu requests of %s, G1 %u G2 %u blocks of 1 KiB, %d rounds A B A B\n",
         n, o.trace, o.g1, o.g2, o.rounds);
  printf("  hit tokens      %llu on both sides\n", (unsigned long long)hp);
  printf("  W2 in-process   %.3f s median (%.3f..%.3f), %.0f requests/s\n", sp.median, sp.min,
         sp.max, n / sp.median);
  printf("  kvbm worker     %.3f s median (%.3f..%.3f), %.0f requests/s\n", sw.median, sw.min,
         sw.max, n / sw.median);
  printf("  worker / W2     %.2f per-round median (%.2f..%.2f)\n", sr.median, sr.min, sr.max);
  kvsim_trace_destroy(t);
  return 0;
}
