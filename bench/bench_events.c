/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_events.c: block events per second through the batching publisher
 * over ZMQ on loopback (tcp and ipc), decoded by our subscriber in another
 * process, end to end: from the first publish in this process to the last
 * batch decoded in the child.
 *
 * Workload (events side of W3, synthetic): a stream alternating
 * BlockStored of K blocks (16 tokens each, a parent hash, medium GPU) and
 * BlockRemoved of the same K blocks; a "block event" is one block hash in
 * one of them. K = 1 is what the pool link sends (one block per register or
 * eviction, as in W1/W3); K = 16 is an engine that reports a request step's
 * blocks together, as vLLM does.
 *
 * Reference in the same run: the same payloads, encoded beforehand, sent
 * as raw 3-frame ZMQ messages and only received (not decoded) by the child:
 * the transport's bound. The report gives ours / bound, and the CPU time
 * each side spent per block event (publisher process: producer and
 * publisher thread; subscriber process), which a loaded machine disturbs
 * far less than the rate.
 *
 *   bench_events [--blocks N] [--k K] [--batch B] [--form map|positional]
 *                [--queue-bytes B]
 *   (default: 2,000,000 block events per run; K = 1 and 16; B = 256; the
 *   publisher's default wire form, tagged maps; the subscriber's default
 *   byte budget. A budget of 2^42 gives its socket a queue of a million
 *   messages, as before issue 15, to compare. Target >= 2M block events/s
 *   end to end.)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvbm/events.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) return -1;
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

typedef struct result {
  double t_end;
  unsigned long long blocks, batches, lost, malformed;
  double cpu_s; /* the child's user + system time */
} result;

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Child: our subscriber, decoding every batch, until `blocks` block
 * events have arrived. */
static void child_decode(const char *ep, unsigned long long blocks, size_t queue_bytes, int wfd) {
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  if (queue_bytes) so.max_queue_bytes = queue_bytes;
  kvbm_subscriber *s;
  kvbm_error err;
  if (kvbm_subscriber_create(&so, &s, &err)) {
    fprintf(stderr, "child: %s\n", err.msg);
    _exit(1);
  }
  usleep(300000);
  if (write(wfd, "R", 1) != 1) _exit(1);
  result r = {0};
  double c0 = cpu_seconds();
  while (r.blocks < blocks) {
    kvbm_event_batch b;
    int rc = kvbm_subscriber_recv(s, 10000, &b, &err);
    if (rc == KVBM_ETIMEDOUT) break;
    if (rc) continue;
    r.batches++;
    for (size_t i = 0; i < b.num_events; i++) r.blocks += b.events[i].num_block_hashes;
  }
  r.t_end = now();
  r.cpu_s = cpu_seconds() - c0;
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s, &st);
  r.lost = st.lost;
  r.malformed = st.malformed;
  if (write(wfd, &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
  kvbm_subscriber_destroy(s);
  _exit(0);
}

/* Child: raw ZMQ receive of `msgs` messages, no decoding. */
static void child_raw(const char *ep, unsigned long long msgs, int wfd) {
  void *ctx = zmq_ctx_new();
  void *sub = zmq_socket(ctx, ZMQ_SUB);
  int hwm = 1000000;
  zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  zmq_connect(sub, ep);
  int to = 10000;
  zmq_setsockopt(sub, ZMQ_RCVTIMEO, &to, sizeof to);
  usleep(300000);
  if (write(wfd, "R", 1) != 1) _exit(1);
  result r = {0};
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (r.batches < msgs) {
    if (zmq_msg_recv(&m, sub, 0) < 0) break;
    if (!zmq_msg_more(&m)) r.batches++;
  }
  r.t_end = now();
  zmq_msg_close(&m);
  if (write(wfd, &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
  int zero = 0;
  zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(sub);
  zmq_ctx_term(ctx);
  _exit(0);
}

typedef struct stream {
  unsigned k;
  uint64_t *hashes;
  uint32_t *tokens;
} stream;

/* Event i of the stream: even = BlockStored of K blocks, odd = BlockRemoved
 * of the same K. */
static kvbm_event stream_event(const stream *s, unsigned long long i) {
  unsigned long long pair = i / 2;
  uint64_t *h = s->hashes + (i / 2 % 64) * s->k;
  for (unsigned j = 0; j < s->k; j++) h[j] = (pair * s->k + j) * 0x9e3779b97f4a7c15ull;
  kvbm_event ev = {.type = i % 2 ? KVBM_EVENT_REMOVED : KVBM_EVENT_STORED,
                   .block_hashes = h, .num_block_hashes = s->k, .medium = KVBM_MEDIUM_GPU};
  if (ev.type == KVBM_EVENT_STORED) {
    ev.has_parent = true;
    ev.parent_hash = h[0] - 1;
    ev.token_ids = s->tokens;
    ev.num_tokens = 16u * s->k;
    ev.block_size = 16;
  }
  return ev;
}

static pid_t spawn(int which, const char *ep, unsigned long long n, size_t queue_bytes, int *rfd) {
  int fds[2];
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (which == 0) child_decode(ep, n, queue_bytes, fds[1]);
    else child_raw(ep, n, fds[1]);
  }
  close(fds[1]);
  char c;
  if (read(fds[0], &c, 1) != 1) return -1;
  *rfd = fds[0];
  return pid;
}

static int finish(pid_t pid, int rfd, result *r) {
  ssize_t got = read(rfd, r, sizeof *r);
  close(rfd);
  int st;
  waitpid(pid, &st, 0);
  return got == (ssize_t)sizeof *r && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Ours: publish the stream through the batching publisher. Returns block
 * events per second, end to end. */
static kvbm_event_form g_form = KVBM_FORM_MAP;

static double g_pub_cpu; /* the last run_ours's publisher CPU seconds */

static double run_ours(const char *bind_ep, const char *conn_ep, unsigned k, unsigned batch,
                       unsigned long long blocks, size_t queue_bytes, result *r) {
  int rfd;
  pid_t pid = spawn(0, conn_ep, blocks, queue_bytes, &rfd);
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = batch;
  o.form = g_form;
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&o, &p, &err)) return -1;
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default(bind_ep);
  zo.mode = KVBM_ZMQ_BIND;
  zo.hwm = 0;
  if (kvbm_publisher_add_zmq(p, &zo, &err) || kvbm_publisher_start(p, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  usleep(300000); /* the child connects and subscribes */
  stream s = {k, calloc(64 * (size_t)k, 8), calloc(16 * (size_t)k, 4)};
  for (unsigned j = 0; j < 16 * k; j++) s.tokens[j] = j * 7919u;
  unsigned long long nev = blocks / k;
  double t0 = now(), c0 = cpu_seconds();
  for (unsigned long long i = 0; i < nev; i++) {
    kvbm_event ev = stream_event(&s, i);
    if (kvbm_publisher_publish(p, &ev, NULL, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return -1;
    }
  }
  kvbm_publisher_flush(p, -1, NULL);
  g_pub_cpu = cpu_seconds() - c0;
  int ok = finish(pid, rfd, r);
  kvbm_publisher_destroy(p);
  free(s.hashes);
  free(s.tokens);
  if (ok || r->blocks < nev * k) return -1;
  return (double)r->blocks / (r->t_end - t0);
}

/* Bound: the same payloads, pre-encoded, sent raw. */
static double run_raw(const char *bind_ep, const char *conn_ep, unsigned k, unsigned batch,
                      unsigned long long blocks, result *r) {
  unsigned long long nev = blocks / k, nbatch = (nev + batch - 1) / batch;
  stream s = {k, calloc(64 * (size_t)k, 8), calloc(16 * (size_t)k, 4)};
  for (unsigned j = 0; j < 16 * k; j++) s.tokens[j] = j * 7919u;
  kvbm_event_encoder *enc;
  kvbm_event_encoder_config ec = {.form = g_form};
  kvbm_event_encoder_create(&ec, &enc, NULL);
  uint8_t **pay = calloc(nbatch, sizeof *pay);
  size_t *len = calloc(nbatch, sizeof *len);
  kvbm_event *evs = calloc(batch, sizeof *evs);
  uint64_t *hcopy = calloc((size_t)batch * k, 8);
  for (unsigned long long b = 0; b < nbatch; b++) {
    size_t n = 0;
    for (unsigned long long i = b * batch; i < nev && n < batch; i++, n++) {
      evs[n] = stream_event(&s, i);
      memcpy(hcopy + n * k, evs[n].block_hashes, 8 * (size_t)k);
      evs[n].block_hashes = hcopy + n * k;
    }
    kvbm_event_batch eb = {.seq = b, .ts = 1.0, .has_dp_rank = true, .events = evs,
                           .num_events = n};
    const uint8_t *d;
    kvbm_event_encode(enc, &eb, &d, &len[b], NULL);
    pay[b] = malloc(len[b]);
    memcpy(pay[b], d, len[b]);
  }
  int rfd;
  pid_t pid = spawn(1, conn_ep, nbatch, 0, &rfd);
  void *ctx = zmq_ctx_new();
  void *pub = zmq_socket(ctx, ZMQ_PUB);
  int zero = 0;
  zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof zero);
  zmq_bind(pub, bind_ep);
  usleep(300000);
  double t0 = now();
  for (unsigned long long b = 0; b < nbatch; b++) {
    uint8_t seq[8];
    for (int i = 7, v = 0; i >= 0; i--, v += 8) seq[i] = (uint8_t)(b >> v);
    zmq_send(pub, "", 0, ZMQ_SNDMORE);
    zmq_send(pub, seq, 8, ZMQ_SNDMORE);
    zmq_send(pub, pay[b], len[b], 0);
  }
  int ok = finish(pid, rfd, r);
  zmq_close(pub);
  zmq_ctx_term(ctx);
  for (unsigned long long b = 0; b < nbatch; b++) free(pay[b]);
  free(pay);
  free(len);
  free(evs);
  free(hcopy);
  free(s.hashes);
  free(s.tokens);
  kvbm_event_encoder_destroy(enc);
  if (ok || r->batches < nbatch) return -1;
  return (double)blocks / (r->t_end - t0);
}

int main(int argc, char **argv) {
  unsigned long long blocks = 2000000;
  unsigned batch = 256, ks[2] = {1, 16}, nk = 2;
  size_t queue_bytes = 0; /* the subscriber's default */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--k") && i + 1 < argc) ks[0] = (unsigned)atoi(argv[++i]), nk = 1;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--queue-bytes") && i + 1 < argc)
      queue_bytes = (size_t)strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--form") && i + 1 < argc && !strcmp(argv[i + 1], "map")) g_form = KVBM_FORM_MAP, i++;
    else if (!strcmp(argv[i], "--form") && i + 1 < argc && !strcmp(argv[i + 1], "positional"))
      g_form = KVBM_FORM_POSITIONAL, i++;
    else {
      fprintf(stderr, "usage: bench_events [--blocks N] [--k K] [--batch B] [--form map|positional] [--queue-bytes B]\n");
      return 2;
    }
  }
  if (blocks == 0 || batch == 0 || ks[0] == 0) return 2;
  printf("bench_events: W3-style event stream (BlockStored of K blocks x 16 tokens, then "
         "BlockRemoved of them), %llu block events per run, batches of %u events, %s form\n",
         blocks, batch, g_form == KVBM_FORM_MAP ? "map" : "positional");
  printf("%-4s %3s %16s %16s %7s %9s %9s  %s\n", "wire", "K", "ours blk/s", "raw zmq blk/s",
         "ratio", "pub ns/b", "sub ns/b", "checks");
  int fails = 0;
  for (unsigned ki = 0; ki < nk; ki++) {
    for (int t = 0; t < 2; t++) {
      char bind_ep[128], conn_ep[128];
      if (t == 0) {
        int port = free_port();
        snprintf(bind_ep, sizeof bind_ep, "tcp://127.0.0.1:%d", port);
        snprintf(conn_ep, sizeof conn_ep, "tcp://127.0.0.1:%d", port);
      } else {
        snprintf(bind_ep, sizeof bind_ep, "ipc:///tmp/kvbm-bench-ev-%d", (int)getpid());
        snprintf(conn_ep, sizeof conn_ep, "%s", bind_ep);
      }
      result ro = {0}, rr = {0};
      double ours = run_ours(bind_ep, conn_ep, ks[ki], batch, blocks, queue_bytes, &ro);
      if (t == 0) { /* a fresh port: the last one may linger in TIME_WAIT */
        int port = free_port();
        snprintf(bind_ep, sizeof bind_ep, "tcp://127.0.0.1:%d", port);
        snprintf(conn_ep, sizeof conn_ep, "tcp://127.0.0.1:%d", port);
      }
      double raw = run_raw(bind_ep, conn_ep, ks[ki], batch, blocks, &rr);
      if (ours < 0 || raw < 0) {
        printf("%-4s %3u  run failed (ours %.0f, raw %.0f)\n", t ? "ipc" : "tcp", ks[ki], ours,
               raw);
        fails++;
        continue;
      }
      printf("%-4s %3u %16.0f %16.0f %7.2f %9.0f %9.0f  %llu batches decoded, lost %llu, "
             "malformed %llu%s\n",
             t ? "ipc" : "tcp", ks[ki], ours, raw, ours / raw, g_pub_cpu * 1e9 / (double)blocks,
             ro.cpu_s * 1e9 / (double)blocks, ro.batches, ro.lost, ro.malformed,
             ours >= 2e6 ? "" : "  (below the 2M/s target)");
    }
  }
  return fails ? 1 : 0;
}
