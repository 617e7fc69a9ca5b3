/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pubcost.c: the events bisect driver (docs/areas/events.md, "The slowdown
 * since 24eb50e"). A publisher with one ZMQ sink (ipc) publishes N block
 * events, K blocks an event (BlockStored then BlockRemoved, as
 * bench_events), to a child that only receives (DECODE 0) or decodes with
 * kvbm's subscriber (DECODE 1); it prints the CPU time (getrusage) and
 * context switches per block event of both processes. ROLE 1 / 2 run the
 * publisher / the decoding subscriber alone (fixed endpoint), so that
 * callgrind can count one of them (subcg.sh).
 *
 *   pubcost K N FORM(-1 default, 0 positional, 1 map) [DECODE [ROLE [WIRE]]]
 *
 * WIRE: ipc (default) or tcp (loopback; forked mode, ROLE 0, only).
 *
 * Not built by CMake: pubcost.sh compiles it in place of bench_events.c
 * in a worktree of any commit, naming the API of that commit
 * (PUBCFG/ZCFG/SUBCFG: kvbm_*_options before d0d17eb, kvbm_*_config
 * after). The counter below reads nothing where the VM has no PMU.
 */
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>
#include "kvbm/events.h"

static double cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}
static int counter(void) {
  struct perf_event_attr a = {.type = PERF_TYPE_HARDWARE, .size = sizeof a,
                              .config = PERF_COUNT_HW_INSTRUCTIONS, .exclude_kernel = 1,
                              .exclude_hv = 1, .inherit = 1, .disabled = 0};
  return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}
int main(int argc, char **argv) {
  unsigned k = argc > 1 ? atoi(argv[1]) : 1;
  unsigned long long blocks = argc > 2 ? strtoull(argv[2], 0, 10) : 1000000;
  int form = argc > 3 ? atoi(argv[3]) : -1; /* -1 default, 0 positional, 1 map */
  char ep[64];
  int role = argc > 5 ? atoi(argv[5]) : 0; /* 0 fork a child, 1 publisher only, 2 decoding subscriber only */
  if (role) snprintf(ep, sizeof ep, "ipc:///tmp/kvbm-pubcost-ev");
  else if (argc > 6 && !strcmp(argv[6], "tcp"))
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", 20000 + (int)getpid() % 20000);
  else snprintf(ep, sizeof ep, "ipc:///tmp/kvbm-pubcost-%d", (int)getpid());
  int decode = argc > 4 && atoi(argv[4]);
  int pfd[2];
  if (pipe(pfd)) return 1;
  pid_t pid = role == 1 ? 1 : role == 2 ? 0 : fork();
  if (pid == 0 && decode) {
    SUBCFG so = SUBCFG_DEFAULT(ep);
    kvbm_subscriber *s;
    kvbm_error e;
    if (kvbm_subscriber_create(&so, &s, &e)) _exit(1);
    usleep(500000);
    if (write(pfd[1], "R", 1) != 1) _exit(1);
    unsigned long long got = 0;
    while (got < blocks) {
      kvbm_event_batch b;
      int rc = kvbm_subscriber_recv(s, 10000, &b, &e);
      if (rc == KVBM_ETIMEDOUT) break;
      if (rc) continue;
      for (size_t i = 0; i < b.num_events; i++) got += b.events[i].num_block_hashes;
    }
    kvbm_subscriber_destroy(s);
    if (role == 2) printf("sub got %llu\n", got), fflush(stdout);
    _exit(got == blocks ? 0 : 3);
  }
  if (pid == 0) {
    void *c = zmq_ctx_new(), *s = zmq_socket(c, ZMQ_SUB);
    int to = 1500, hwm = 0;
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
    zmq_connect(s, ep);
    usleep(500000);
    if (write(pfd[1], "R", 1) != 1) _exit(1);
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, s, 0) >= 0) {}
    _exit(0);
  }
  int fd = counter();
  double c0 = cpu();
  PUBCFG o = PUBCFG_DEFAULT();
  if (form >= 0) o.form = (kvbm_event_form)form;
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) return 1;
  ZCFG zo = ZCFG_DEFAULT(ep);
  zo.mode = KVBM_ZMQ_BIND;
  zo.hwm = 0;
  zo.linger_ms = 120000; /* a subscriber under valgrind takes its time */
  if (kvbm_publisher_add_zmq(p, &zo, &err) || kvbm_publisher_start(p, &err)) return 1;
  char ch;
  if (role == 1) sleep(4); /* the subscriber (under valgrind) connects */
  else if (read(pfd[0], &ch, 1) != 1) return 1;
  uint64_t *h = calloc(k, 8);
  uint32_t *t = calloc(16 * k, 4);
  for (unsigned j = 0; j < 16 * k; j++) t[j] = j * 7919u;
  unsigned long long nev = blocks / k;
#ifdef PUBCOST_STAGE
  /* PUBCOST_STAGE=S in the environment (pubcost_here.sh builds only):
   * publish through a stage of S events (kvbm_publisher_stage_*) */
  kvbm_publisher_stage *stg = NULL;
  const char *sv = getenv("PUBCOST_STAGE");
  if (sv && atoi(sv) > 0 && kvbm_publisher_stage_create(p, (size_t)atoi(sv), &stg, &err)) return 1;
#define PUBLISH_ONE(ev) (stg ? kvbm_publisher_stage_publish(stg, ev, &err) : kvbm_publisher_publish(p, ev, NULL, &err))
#else
#define PUBLISH_ONE(ev) kvbm_publisher_publish(p, ev, NULL, &err)
#endif
#ifdef PUBCOST_BATCH
  /* PUBCOST_BATCH=B: publish B events a kvbm_publisher_publish_batch call
   * (the relay's path), each with hashes of its own */
  size_t nb = 0, bn = 0;
  kvbm_event *bev = NULL;
  uint64_t *bh = NULL;
  const char *bv = getenv("PUBCOST_BATCH");
  if (bv && atoi(bv) > 0) {
    nb = (size_t)atoi(bv);
    bev = calloc(nb, sizeof *bev);
    bh = calloc(nb * k, 8);
  }
#endif
  for (unsigned long long i = 0; i < nev; i++) {
    for (unsigned j = 0; j < k; j++) h[j] = ((i / 2) * k + j) * 0x9e3779b97f4a7c15ull;
    kvbm_event ev = {.type = i % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED, .block_hashes = h,
                     .num_block_hashes = k, .medium = KVBM_MEDIUM_GPU};
    if (!(i % 2)) {
      ev.has_parent = 1; ev.parent_hash = h[0] - 1; ev.token_ids = t; ev.num_tokens = 16 * k; ev.block_size = 16;
    }
#ifdef PUBCOST_BATCH
    if (bev) {
      memcpy(bh + bn * k, h, (size_t)k * 8);
      ev.block_hashes = bh + bn * k;
      bev[bn++] = ev;
      if (bn == nb) {
        kvbm_event_batch b = {.events = bev, .num_events = bn};
        if (kvbm_publisher_publish_batch(p, &b, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        bn = 0;
      }
      continue;
    }
#endif
    if (PUBLISH_ONE(&ev)) { fprintf(stderr, "%s\n", err.msg); return 1; }
  }
#ifdef PUBCOST_BATCH
  if (bn) {
    kvbm_event_batch b = {.events = bev, .num_events = bn};
    if (kvbm_publisher_publish_batch(p, &b, NULL, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
  }
  free(bev);
  free(bh);
#endif
#ifdef PUBCOST_STAGE
  if (stg && kvbm_publisher_stage_flush(stg, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
  kvbm_publisher_stage_destroy(stg);
#endif
  kvbm_publisher_flush(p, -1, NULL);
  kvbm_publisher_destroy(p);
  long long ins = 0;
  if (fd < 0 || read(fd, &ins, sizeof ins) != sizeof ins) ins = -1;
  double c = cpu() - c0 - 0.3 * 0; /* the sleep costs no CPU */
  int st;
  struct rusage cr = {0}, pr;
  if (role == 1) st = 0;
  else wait4(pid, &st, 0, &cr);
  getrusage(RUSAGE_SELF, &pr);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) fprintf(stderr, "child failed\n");
  double sc = cr.ru_utime.tv_sec + cr.ru_utime.tv_usec * 1e-6 + cr.ru_stime.tv_sec + cr.ru_stime.tv_usec * 1e-6;
  printf("{\"k\": %u, \"form\": %d, \"pub_cpu_ns_per_block\": %.1f, \"pub_sys_ns_per_block\": %.1f, \"pub_csw_per_kblock\": %.1f, \"sub_cpu_ns_per_block\": %.1f, \"sub_csw_per_kblock\": %.1f}\n", k,
         form, c * 1e9 / blocks, (pr.ru_stime.tv_sec + pr.ru_stime.tv_usec * 1e-6) * 1e9 / blocks, (pr.ru_nvcsw + pr.ru_nivcsw) * 1e3 / blocks, sc * 1e9 / blocks, (cr.ru_nvcsw + cr.ru_nivcsw) * 1e3 / blocks);
  return 0;
}
