/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_events.c: block events per second through the batching publisher
 * over ZMQ on loopback (tcp and ipc), decoded by our subscriber in another
 * process, end to end: from the first publish in this process to the last
 * batch decoded in the child; and the CPU each side spends per block event.
 *
 * Workload (the events side of W3 in ../shared/WORKLOADS.md, synthetic): a
 * stream alternating BlockStored of K blocks (16 tokens each, a parent
 * hash, medium GPU) and BlockRemoved of the same K blocks; a "block event"
 * is one block hash in one of them. K = 1 is what the pool link sends (one
 * block per register or eviction, as in W1/W3); K = 16 is vLLM (one event
 * per step with all the step's new blocks); 4 and 64 around them.
 *
 * Peer in the same run (raw ZMQ): the same payloads, encoded beforehand,
 * sent as raw 3-frame ZMQ messages and only received (not decoded) by the
 * child: the transport's bound. The two move the same messages: vLLM's
 * three frames (topic "", 8-byte sequence, payload), batches of the same
 * events in the same msgpack form (the peer's payload bytes are the ones
 * kvbm's encoder writes), and the peer's SUB socket is given the queue our
 * subscriber gives its own (ZMQ_RCVHWM and ZMQ_MAXMSGSIZE from the same
 * byte budget), so that only the work differs: ours encodes every event
 * when it is published, batches and frames it, and our subscriber checks
 * each message's frames and sequence and decodes its payload into
 * kvbm_event structs (what a consumer must do); the peer's sender only
 * sends bytes encoded before the clock starts, its receiver only receives.
 * Both children count the messages and payload bytes they got, printed per
 * block event beside the rates (a check that the wire is the same: a row
 * whose bytes differ by more than 1% is marked). Each round runs ours and
 * the peer, ours first in even rounds and the peer first in odd ones; the
 * table gives, over the rounds, the median [min..max] of: our rate, the
 * peer's, ours / peer's (of the same round), and the CPU time (user +
 * system, getrusage) per block event of our publisher process (producer,
 * publisher thread, ZMQ's I/O thread: from the first publish until the
 * child has the last batch), of our subscriber process, and of the peer's
 * two sides. CPU per block is what a loaded machine disturbs least.
 * Under each row, the same CPU split by thread (see "CPU time by thread"
 * below: producer, publisher thread and ZMQ's I/O thread; decoder and
 * ZMQ's I/O thread; the peer's loops and its ZMQ threads) and the ratio
 * of the two sides' busiest threads, the bound with a core a thread;
 * and the rate of the producer's publish loop alone (the peer's: its send
 * loop), to the last publish, before the flush: where it is far above the
 * end-to-end rate the producer ran ahead (ZMQ queues without bound here,
 * SNDHWM 0, as the peer's) and does not set the pace.
 *
 *   bench_events [--blocks N] [--k K[,K...]] [--form map|positional|both]
 *                [--wire tcp|ipc|both] [--runs R] [--batch B]
 *                [--queue-bytes B] [--publish whole|split|coalesce|all] [--no-peer]
 *                [--vocab V] [--stage] [--aa] [--json]
 *
 * --publish: how ours publishes an event of K blocks. whole (default): as
 * one event. split: as K one-block events, chained (each store's parent is
 * the block before), as the pool link does (one publish per block the pool
 * registers or evicts): what consumers of a pool see today. coalesce: the
 * same K one-block publishes with the publisher's `coalesce` option, which
 * sends each chain as one K-block event again (a batch holds max_batch
 * publishes, so B / K events of K blocks). The peer sends what ours should
 * put on the wire in each mode: K-block events in batches of B (whole),
 * one-block events in batches of B (split), K-block events in batches of
 * B publishes (coalesce); the bytes check still compares the two. Rows of
 * split and coalesce are keyed wire.form.kK.split / .coalesce in --json.
 *
 * --stage: ours publishes through a producer stage of B events
 * (kvbm_publisher_stage_*: encoded outside the lock, handed over under
 * one lock a batch; the same bytes and batches) instead of one
 * kvbm_publisher_publish an event; with coalesce it publishes at once.
 *
 * --vocab V: the blocks' token ids drawn at random below V (the same ids
 * in every run, ours and the peer's), as a model's vocabulary gives them
 * (Llama-3: 128256, gpt-oss: 201088): at V above 65536 they are uint16 or
 * uint32 on the wire at random, where the default ids (j * 7919, the
 * same every event) are of one width from the tenth on.
 *
 * --aa: the peer runs a second time in each round, last (after ours and
 * its first run, whichever order those took), and
 * the row gives the second's rate over the first's (raw_aa_ratio in
 * --json): what the peer's own round-to-round noise does to a ratio of
 * two runs, the floor under the spread of ours / raw. The row's other
 * peer figures stay the first run's.
 *
 * --no-peer: ours only (the peer's figures and the ratio print as 0), for
 * counting our publisher's instructions under callgrind without the peer's
 * pre-encoding in the same process (the subscriber is a child: callgrind
 * without --trace-children counts the publisher process alone).
 *   (default: 1,000,000 block events per run; K = 1,4,16,64; both forms;
 *   both wires; 3 rounds; batches of 256 events; the subscriber's default
 *   byte budget (2^42 gives its socket a queue of a million messages, as
 *   before issue 15). --json prints one JSON document (rows keyed
 *   wire.form.kK, each figure {median, min, max}) for bench/compare.sh.
 *   Target (issue 22): ours >= 0.8 of raw ZMQ at K = 1 and 16.)
 */
#include <arpa/inet.h>
#include <dirent.h>
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

#include "bench_util.h"
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
  unsigned long long payload_bytes; /* the payload frames' bytes received */
  double cpu_s; /* the child's user + system time */
  double th_ns[3]; /* the child's CPU ns by thread role (TH_*) */
  double th_max_ns; /* its busiest thread's */
} result;

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* ---- CPU time by thread ------------------------------------------------
 *
 * Why: on a machine with a core for every thread, a pipeline of threads
 * runs at the pace of its busiest thread, not of its processes' summed
 * CPU. Ours has five (producer, publisher thread and ZMQ's I/O thread in
 * the publisher process; the decoding caller and ZMQ's I/O thread in the
 * subscriber), the peer four, so the summed CPU above (what bounds the
 * rate on 2 shared cores) cannot say which one holds K = 1 back on 16.
 * Each thread's CPU time is read from /proc/self/task/TID/schedstat (its
 * first field: nanoseconds on a CPU) at the clock's start and end, and
 * summed by role: the main thread (ours: the producer, or the subscriber's
 * caller that decodes; the peer's: its send or receive loop), ZMQ's
 * background threads (named "ZMQbg/..."), and the rest (the publisher's
 * own thread). The busiest single thread of each side gives a bound for
 * one core a thread: raw's busiest / ours' busiest. On a 2-core machine
 * each thread's time includes what the others' cache traffic cost it, so
 * this is a pointer to the bound, not the 16-core figure. */
enum { TH_MAIN, TH_OTHER, TH_ZMQ, NTH };
#define MAX_THREADS 64

typedef struct thread_snap {
  int n;
  long tid[MAX_THREADS];
  int role[MAX_THREADS];
  double ns[MAX_THREADS];
} thread_snap;

/* This process's threads and the CPU ns each has run so far. */
static void thread_snap_take(thread_snap *t) {
  t->n = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return;
  const long self = (long)getpid();
  struct dirent *e;
  while ((e = readdir(d)) && t->n < MAX_THREADS) {
    long tid = strtol(e->d_name, NULL, 10);
    if (tid <= 0) continue;
    char path[64], comm[32] = "";
    unsigned long long ns = 0;
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", tid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    int got = fscanf(f, "%llu", &ns);
    fclose(f);
    if (got != 1) continue;
    snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
    if ((f = fopen(path, "r"))) {
      if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
      fclose(f);
    }
    t->tid[t->n] = tid;
    t->role[t->n] = tid == self ? TH_MAIN : !strncmp(comm, "ZMQbg/", 6) ? TH_ZMQ : TH_OTHER;
    t->ns[t->n] = (double)ns;
    t->n++;
  }
  closedir(d);
}

/* The CPU ns each role's threads ran since snapshot `a` (a thread born
 * since counts whole), and the busiest thread's into *max_ns. */
static void thread_snap_since(const thread_snap *a, double ns[NTH], double *max_ns) {
  thread_snap b;
  thread_snap_take(&b);
  for (int r = 0; r < NTH; r++) ns[r] = 0;
  *max_ns = 0;
  for (int i = 0; i < b.n; i++) {
    double d = b.ns[i];
    for (int j = 0; j < a->n; j++)
      if (a->tid[j] == b.tid[i]) d -= a->ns[j];
    ns[b.role[i]] += d;
    if (d > *max_ns) *max_ns = d;
  }
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
  usleep(150000);
  if (write(wfd, "R", 1) != 1) _exit(1);
  result r = {0};
  thread_snap th0;
  thread_snap_take(&th0);
  double c0 = cpu_seconds();
  while (r.blocks < blocks) {
    kvbm_event_batch b;
    size_t plen = 0;
    /* recv does exactly this (recv_raw without the payload's place) */
    int rc = kvbm_subscriber_recv_raw(s, 10000, &b, NULL, &plen, &err);
    if (rc == KVBM_ETIMEDOUT) break;
    if (rc) continue;
    r.batches++;
    r.payload_bytes += plen;
    for (size_t i = 0; i < b.num_events; i++) r.blocks += b.events[i].num_block_hashes;
  }
  r.t_end = now();
  r.cpu_s = cpu_seconds() - c0;
  thread_snap_since(&th0, r.th_ns, &r.th_max_ns);
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s, &st);
  r.lost = st.lost;
  r.malformed = st.malformed;
  if (write(wfd, &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
  kvbm_subscriber_destroy(s);
  _exit(0);
}

/* The SUB socket limits our subscriber sets for a byte budget (its
 * limit_socket, src/events/subscriber.c): half the budget in messages of
 * at most twice max_payload. The peer's socket gets the same. */
static void sub_limits(size_t queue_bytes, int *hwm, int64_t *maxmsg) {
  kvbm_subscriber_config so = kvbm_subscriber_config_default("");
  size_t share = (queue_bytes ? queue_bytes : so.max_queue_bytes) / 2, maxp = so.max_payload;
  size_t ceiling = share - maxp >= maxp ? 2 * maxp : share;
  size_t msgs = share / ceiling;
  *hwm = msgs > 2147483647u ? 2147483647 : (int)msgs;
  *maxmsg = (int64_t)ceiling;
}

/* Child: raw ZMQ receive of `msgs` messages, no decoding. */
static void child_raw(const char *ep, unsigned long long msgs, size_t queue_bytes, int wfd) {
  void *ctx = zmq_ctx_new();
  void *sub = zmq_socket(ctx, ZMQ_SUB);
  int hwm;
  int64_t maxmsg;
  sub_limits(queue_bytes, &hwm, &maxmsg);
  zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  zmq_connect(sub, ep);
  int to = 10000;
  zmq_setsockopt(sub, ZMQ_RCVTIMEO, &to, sizeof to);
  usleep(150000);
  if (write(wfd, "R", 1) != 1) _exit(1);
  result r = {0};
  thread_snap th0;
  thread_snap_take(&th0);
  double c0 = cpu_seconds();
  zmq_msg_t m;
  zmq_msg_init(&m);
  while (r.batches < msgs) {
    if (zmq_msg_recv(&m, sub, 0) < 0) break;
    if (!zmq_msg_more(&m)) r.batches++, r.payload_bytes += zmq_msg_size(&m);
  }
  r.t_end = now();
  r.cpu_s = cpu_seconds() - c0;
  thread_snap_since(&th0, r.th_ns, &r.th_max_ns);
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
  kvbm_event tmpl[2]; /* stream_next's: BlockStored, BlockRemoved */
} stream;

/* Event i of the stream: even = BlockStored of K blocks, odd = BlockRemoved
 * of the same K. */
static kvbm_event stream_event(const stream *s, unsigned long long i);

/* Blocks [j0, j0 + m) of event `w` of the stream (the tokens of those
 * blocks, the parent the block before j0): one publish of a split event,
 * or the run coalescing makes of them. */
static kvbm_event piece(const kvbm_event *w, unsigned j0, unsigned m) {
  kvbm_event ev = *w;
  ev.block_hashes = w->block_hashes + j0;
  ev.num_block_hashes = m;
  if (ev.type == KVBM_EVENT_STORED) {
    if (j0) ev.parent_hash = w->block_hashes[j0 - 1];
    ev.token_ids = w->token_ids + 16u * j0;
    ev.num_tokens = 16u * m;
  }
  return ev;
}

enum { PUB_WHOLE, PUB_SPLIT, PUB_COALESCE };
static const char *const kPub[] = {"whole", "split", "coalesce"};
static int g_pub = PUB_WHOLE;
static int g_no_peer; /* --no-peer */
static int g_stage;   /* --stage */
static int g_aa;      /* --aa: the peer run twice a round, its own noise */
static uint32_t g_vocab; /* --vocab: token ids drawn below it; 0: j * 7919 */

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

/* The same event i, for the timed loop: written over one of two templates
 * made once (stream_init), changing only the fields that differ from one
 * event to the next (its hashes and their pointer, the parent). A
 * kvbm_event is 216 bytes; made whole for every publish (zeroed, filled,
 * copied), as stream_event does, it cost this producer 46 ns an event on
 * the 2-core machine (a quarter of ours' publisher CPU at K = 1), which the
 * raw peer, whose payloads are encoded before its clock starts, never
 * pays. The publisher copies what it needs during the publish call, so
 * the template may change afterwards. */
static const kvbm_event *stream_next(stream *s, unsigned long long i) {
  unsigned long long pair = i / 2;
  uint64_t *h = s->hashes + (pair % 64) * s->k;
  for (unsigned j = 0; j < s->k; j++) h[j] = (pair * s->k + j) * 0x9e3779b97f4a7c15ull;
  kvbm_event *ev = &s->tmpl[i % 2];
  ev->block_hashes = h;
  if (i % 2 == 0) ev->parent_hash = h[0] - 1;
  return ev;
}

/* The stream's buffers and templates; false when out of memory. */
static bool stream_init(stream *s, unsigned k) {
  s->k = k;
  s->hashes = calloc(64 * (size_t)k, 8);
  s->tokens = calloc(16 * (size_t)k, 4);
  if (!s->hashes || !s->tokens) return false;
  uint64_t x = 0x9e3779b97f4a7c15ull; /* the same ids in every run and peer */
  for (unsigned j = 0; j < 16 * k; j++)
    s->tokens[j] = g_vocab ? (uint32_t)(kvbm_bench_xorshift(&x) % g_vocab) : j * 7919u;
  s->tmpl[0] = stream_event(s, 0);
  s->tmpl[1] = stream_event(s, 1);
  return true;
}

/* A child (0: our subscriber, 1: the raw receiver) is this program run
 * again (exec of /proc/self/exe with --child), not a plain fork: a forked
 * child shares the parent's heap copy-on-write, so each page of it the
 * parent then writes (the publisher's chunks, reusing memory an earlier
 * run freed) took a copy fault and a TLB shootdown across the cores,
 * inside the timed part, and the raw peer, whose payloads are written
 * before its child is forked, hardly any (perf: ~8 % of the K = 1 run's
 * samples in do_wp_page and its IPIs, nearly all in our producer). No
 * engine forks its subscriber off the publisher. */
static pid_t spawn(int which, const char *ep, unsigned long long n, size_t queue_bytes, int *rfd) {
  int fds[2];
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char ns[32], qs[32], fs[16];
    snprintf(ns, sizeof ns, "%llu", n);
    snprintf(qs, sizeof qs, "%zu", queue_bytes);
    snprintf(fs, sizeof fs, "%d", fds[1]);
    execl("/proc/self/exe", "bench_events", "--child", which ? "raw" : "decode", ep, ns, qs, fs,
          (char *)NULL);
    _exit(1);
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

static double g_pub_cpu;     /* the last run_ours's publisher CPU seconds */
static double g_raw_pub_cpu; /* the last run_raw's sender CPU seconds */
static double g_pub_th[NTH], g_pub_th_max;         /* run_ours's threads (TH_*), ns */
static double g_prod_s, g_raw_send_s; /* the publish (send) loop's wall time, flush not included */
static double g_raw_pub_th[NTH], g_raw_pub_th_max; /* run_raw's */

static double run_ours(const char *bind_ep, const char *conn_ep, unsigned k, unsigned batch,
                       unsigned long long blocks, size_t queue_bytes, result *r) {
  int rfd;
  pid_t pid = spawn(0, conn_ep, blocks, queue_bytes, &rfd);
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = batch;
  o.form = g_form;
  o.coalesce = g_pub == PUB_COALESCE;
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
  usleep(150000); /* the child connects and subscribes */
  stream s;
  if (!stream_init(&s, k)) return -1;
  unsigned long long nev = blocks / k;
  thread_snap th0;
  thread_snap_take(&th0);
  double t0 = now(), c0 = cpu_seconds();
  unsigned per = g_pub == PUB_WHOLE ? 1 : k; /* publishes per event of K blocks */
  kvbm_publisher_stage *st = NULL;
  if (g_stage && kvbm_publisher_stage_create(p, batch, &st, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  for (unsigned long long i = 0; i < nev; i++) {
    const kvbm_event *w = stream_next(&s, i);
    kvbm_event piece1;
    if (per > 1) piece1 = *w; /* the pieces' fields change: a copy an event of K blocks */
    for (unsigned j = 0; j < per; j++) {
      if (per > 1) { /* piece(w, j, 1), without copying the struct again */
        piece1.block_hashes = w->block_hashes + j;
        piece1.num_block_hashes = 1;
        if (piece1.type == KVBM_EVENT_STORED) {
          if (j) piece1.parent_hash = w->block_hashes[j - 1];
          piece1.token_ids = w->token_ids + 16u * j;
          piece1.num_tokens = 16;
        }
      }
      const kvbm_event *ev = per > 1 ? &piece1 : w;
      if (st ? kvbm_publisher_stage_publish(st, ev, &err)
             : kvbm_publisher_publish(p, ev, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
      }
    }
  }
  if (st && kvbm_publisher_stage_flush(st, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  kvbm_publisher_stage_destroy(st);
  g_prod_s = now() - t0;
  kvbm_publisher_flush(p, -1, NULL);
  int ok = finish(pid, rfd, r); /* the child has the last batch: our I/O thread is done */
  g_pub_cpu = cpu_seconds() - c0;
  thread_snap_since(&th0, g_pub_th, &g_pub_th_max);
  kvbm_publisher_destroy(p);
  free(s.hashes);
  free(s.tokens);
  if (ok || r->blocks < nev * k) return -1;
  return (double)r->blocks / (r->t_end - t0);
}

/* Bound: the same payloads, pre-encoded, sent raw. A batch holds `batch`
 * publishes ("units": events of K blocks, or single blocks when split or
 * coalesced); coalesced, a batch's consecutive blocks of one event are
 * one event, as the publisher's runs make them. */
static double run_raw(const char *bind_ep, const char *conn_ep, unsigned k, unsigned batch,
                      unsigned long long blocks, size_t queue_bytes, result *r) {
  unsigned long long nev = blocks / k;
  unsigned per = g_pub == PUB_WHOLE ? 1 : k; /* units per event */
  unsigned long long units = nev * per, nbatch = (units + batch - 1) / batch;
  stream s;
  if (!stream_init(&s, k)) return -1;
  kvbm_event_encoder *enc;
  kvbm_event_encoder_config ec = {.form = g_form};
  kvbm_event_encoder_create(&ec, &enc, NULL);
  uint8_t **pay = calloc(nbatch, sizeof *pay);
  size_t *len = calloc(nbatch, sizeof *len);
  kvbm_event *evs = calloc(batch, sizeof *evs);
  uint64_t *hcopy = calloc((size_t)batch * k, 8);
  for (unsigned long long b = 0; b < nbatch; b++) {
    size_t n = 0, nh = 0;
    for (unsigned long long u = b * batch; u < units && u < (b + 1) * batch;) {
      unsigned long long i = u / per;
      unsigned j0 = (unsigned)(u % per), m = 1;
      if (g_pub == PUB_WHOLE) m = k;
      else if (g_pub == PUB_COALESCE)
        while (j0 + m < k && u + m < (b + 1) * batch && u + m < units) m++;
      kvbm_event w = stream_event(&s, i);
      evs[n] = g_pub == PUB_WHOLE ? w : piece(&w, j0, m);
      memcpy(hcopy + nh, evs[n].block_hashes, 8 * (size_t)evs[n].num_block_hashes);
      evs[n].block_hashes = hcopy + nh;
      nh += evs[n].num_block_hashes;
      n++;
      u += g_pub == PUB_WHOLE ? 1 : m;
    }
    kvbm_event_batch eb = {.seq = b, .ts = 1.0, .has_dp_rank = true, .events = evs,
                           .num_events = n};
    const uint8_t *d;
    kvbm_event_encode(enc, &eb, &d, &len[b], NULL);
    pay[b] = malloc(len[b]);
    memcpy(pay[b], d, len[b]);
  }
  int rfd;
  pid_t pid = spawn(1, conn_ep, nbatch, queue_bytes, &rfd);
  void *ctx = zmq_ctx_new();
  void *pub = zmq_socket(ctx, ZMQ_PUB);
  int zero = 0;
  zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof zero);
  zmq_bind(pub, bind_ep);
  usleep(150000);
  thread_snap th0;
  thread_snap_take(&th0);
  double t0 = now(), c0 = cpu_seconds();
  for (unsigned long long b = 0; b < nbatch; b++) {
    uint8_t seq[8];
    for (int i = 7, v = 0; i >= 0; i--, v += 8) seq[i] = (uint8_t)(b >> v);
    zmq_send(pub, "", 0, ZMQ_SNDMORE);
    zmq_send(pub, seq, 8, ZMQ_SNDMORE);
    zmq_send(pub, pay[b], len[b], 0);
  }
  g_raw_send_s = now() - t0;
  int ok = finish(pid, rfd, r);
  g_raw_pub_cpu = cpu_seconds() - c0;
  thread_snap_since(&th0, g_raw_pub_th, &g_raw_pub_th_max);
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

/* The figures of one configuration, one value per round. */
enum { F_OURS, F_RAW, F_RATIO, F_PUB, F_SUB, F_RPUB, F_RSUB, F_OBYTES, F_RBYTES, F_OMSGS,
       F_RMSGS,
       /* CPU ns a block event by thread (see "CPU time by thread") */
       F_PMAIN, F_PTHR, F_PZMQ, F_SMAIN, F_SOTHER, F_SZMQ, F_RPMAIN, F_RPZMQ, F_RSMAIN, F_RSZMQ,
       F_OBUSY, F_RBUSY, F_TBOUND, F_PROD, F_RSEND, F_AA, NF };
static const char *const kFig[NF] = {"ours_blk_s", "raw_blk_s", "ratio", "pub_cpu_ns_per_blk",
                                     "sub_cpu_ns_per_blk", "raw_pub_cpu_ns_per_blk",
                                     "raw_sub_cpu_ns_per_blk", "payload_bytes_per_blk",
                                     "raw_payload_bytes_per_blk", "messages", "raw_messages",
                                     "pub_main_ns_per_blk", "pub_thread_ns_per_blk",
                                     "pub_zmq_ns_per_blk", "sub_main_ns_per_blk",
                                     "sub_other_ns_per_blk", "sub_zmq_ns_per_blk",
                                     "raw_pub_main_ns_per_blk", "raw_pub_zmq_ns_per_blk",
                                     "raw_sub_main_ns_per_blk", "raw_sub_zmq_ns_per_blk",
                                     "busiest_thread_ns_per_blk", "raw_busiest_thread_ns_per_blk",
                                     "thread_bound_ratio", "producer_blk_s", "raw_sender_blk_s",
                                     "raw_aa_ratio"};

typedef struct row {
  const char *wire;
  kvbm_event_form form;
  unsigned k;
  int pub; /* PUB_*: how ours publishes */
  int ok;  /* rounds that ran */
  double v[NF][64];
  unsigned long long lost, malformed;
} row;

static void endpoints(int tcp, char *bind_ep, char *conn_ep, size_t cap) {
  if (tcp) {
    int port = free_port(); /* a fresh port each run: the last may linger in TIME_WAIT */
    snprintf(bind_ep, cap, "tcp://127.0.0.1:%d", port);
    snprintf(conn_ep, cap, "tcp://127.0.0.1:%d", port);
  } else {
    snprintf(bind_ep, cap, "ipc:///tmp/kvbm-bench-ev-%d", (int)getpid());
    snprintf(conn_ep, cap, "%s", bind_ep);
  }
}

static void run_round(row *w, int round, unsigned batch, unsigned long long blocks,
                      size_t queue_bytes) {
  char bind_ep[128], conn_ep[128];
  int tcp = !strcmp(w->wire, "tcp");
  g_form = w->form;
  g_pub = w->pub;
  unsigned long long n = blocks / w->k * w->k; /* whole events */
  result ro = {0}, rr = {0};
  /* ours first in even rounds, the peer first in odd ones: whatever the
   * run before leaves behind (the heap, the socket buffers, a core's
   * clock) falls on both alike */
  const bool peer_first = round % 2 && !g_no_peer;
  double ours = 0, raw = 0;
  for (int leg = 0; leg < 2; leg++) {
    endpoints(tcp, bind_ep, conn_ep, sizeof bind_ep);
    if ((leg == 0) != peer_first)
      ours = run_ours(bind_ep, conn_ep, w->k, batch, n, queue_bytes, &ro);
    else if (!g_no_peer)
      raw = run_raw(bind_ep, conn_ep, w->k, batch, n, queue_bytes, &rr);
  }
  if (g_no_peer) g_raw_pub_cpu = 0;
  double raw2 = 0;
  if (g_aa && !g_no_peer && raw > 0) { /* after the first: its figures below stay the first's */
    double cpu = g_raw_pub_cpu, th[NTH], thmax = g_raw_pub_th_max, send = g_raw_send_s;
    memcpy(th, g_raw_pub_th, sizeof th);
    result r2 = {0};
    endpoints(tcp, bind_ep, conn_ep, sizeof bind_ep);
    raw2 = run_raw(bind_ep, conn_ep, w->k, batch, n, queue_bytes, &r2);
    g_raw_pub_cpu = cpu, g_raw_pub_th_max = thmax, g_raw_send_s = send;
    memcpy(g_raw_pub_th, th, sizeof th);
  }
  if (ours < 0 || raw < 0 || raw2 < 0) {
    fprintf(stderr, "bench_events: %s %s K=%u %s: run failed (ours %.0f, raw %.0f, raw again %.0f)\n",
            w->wire, w->form == KVBM_FORM_MAP ? "map" : "positional", w->k, kPub[w->pub], ours, raw,
            raw2);
    return;
  }
  int i = w->ok++;
  double nb = (double)n;
  w->v[F_OURS][i] = ours;
  w->v[F_RAW][i] = raw;
  w->v[F_RATIO][i] = raw > 0 ? ours / raw : 0;
  w->v[F_PUB][i] = g_pub_cpu * 1e9 / nb;
  w->v[F_SUB][i] = ro.cpu_s * 1e9 / nb;
  w->v[F_RPUB][i] = g_raw_pub_cpu * 1e9 / nb;
  w->v[F_RSUB][i] = rr.cpu_s * 1e9 / nb;
  w->v[F_OBYTES][i] = (double)ro.payload_bytes / nb;
  w->v[F_RBYTES][i] = (double)rr.payload_bytes / nb;
  w->v[F_OMSGS][i] = (double)ro.batches;
  w->v[F_RMSGS][i] = (double)rr.batches;
  w->v[F_PMAIN][i] = g_pub_th[TH_MAIN] / nb;
  w->v[F_PTHR][i] = g_pub_th[TH_OTHER] / nb;
  w->v[F_PZMQ][i] = g_pub_th[TH_ZMQ] / nb;
  w->v[F_SMAIN][i] = ro.th_ns[TH_MAIN] / nb;
  w->v[F_SOTHER][i] = ro.th_ns[TH_OTHER] / nb;
  w->v[F_SZMQ][i] = ro.th_ns[TH_ZMQ] / nb;
  w->v[F_RPMAIN][i] = g_no_peer ? 0 : g_raw_pub_th[TH_MAIN] / nb;
  w->v[F_RPZMQ][i] = g_no_peer ? 0 : g_raw_pub_th[TH_ZMQ] / nb;
  w->v[F_RSMAIN][i] = rr.th_ns[TH_MAIN] / nb;
  w->v[F_RSZMQ][i] = rr.th_ns[TH_ZMQ] / nb;
  double obusy = g_pub_th_max > ro.th_max_ns ? g_pub_th_max : ro.th_max_ns;
  double rbusy = g_no_peer ? 0 : g_raw_pub_th_max > rr.th_max_ns ? g_raw_pub_th_max : rr.th_max_ns;
  w->v[F_OBUSY][i] = obusy / nb;
  w->v[F_RBUSY][i] = rbusy / nb;
  w->v[F_TBOUND][i] = obusy > 0 ? rbusy / obusy : 0;
  w->v[F_PROD][i] = g_prod_s > 0 ? nb / g_prod_s : 0;
  w->v[F_RSEND][i] = !g_no_peer && g_raw_send_s > 0 ? nb / g_raw_send_s : 0;
  w->v[F_AA][i] = raw2 > 0 ? raw2 / raw : 0;
  w->lost += ro.lost;
  w->malformed += ro.malformed;
}

/* Whether the two sides' payload bytes per block event agree within 1%
 * in every round (the timestamp and batch cuts may move a few bytes). */
static bool same_wire(const kvbm_bench_spread *ours, const kvbm_bench_spread *raw) {
  return ours->min >= 0.99 * raw->min && ours->max <= 1.01 * raw->max;
}

static unsigned parse_ks(const char *s, unsigned *ks, unsigned max) {
  unsigned n = 0;
  for (char *end; *s && n < max; s = *end ? end + 1 : end) {
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || v == 0 || v > 4096 || (*end && *end != ',')) return 0;
    ks[n++] = (unsigned)v;
  }
  return n;
}

static void usage(void) {
  fprintf(stderr, "usage: bench_events [--blocks N] [--k K[,K...]] [--form map|positional|both] "
                  "[--wire tcp|ipc|both] [--runs R (1..64)] [--batch B] [--queue-bytes B] "
                  "[--publish whole|split|coalesce|all] [--vocab V] [--no-peer] [--stage] [--aa] [--json]\n");
  exit(2);
}

int main(int argc, char **argv) {
  if (argc == 7 && !strcmp(argv[1], "--child")) { /* spawn's child: never returns */
    unsigned long long n = strtoull(argv[4], NULL, 10);
    size_t qb = (size_t)strtoull(argv[5], NULL, 10);
    int wfd = atoi(argv[6]);
    if (!strcmp(argv[2], "decode")) child_decode(argv[3], n, qb, wfd);
    child_raw(argv[3], n, qb, wfd);
  }
  unsigned long long blocks = 1000000;
  unsigned batch = 256, ks[16] = {1, 4, 16, 64}, nk = 4;
  int runs = 3, forms = 3, wires = 3, json = 0; /* forms/wires: bit 0 map|tcp, bit 1 positional|ipc */
  int pubs = 1; /* bit PUB_*: whole, split, coalesce */
  size_t queue_bytes = 0; /* the subscriber's default */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) { json = 1; continue; }
    if (!strcmp(a, "--no-peer")) { g_no_peer = 1; continue; }
    if (!strcmp(a, "--stage")) { g_stage = 1; continue; }
    if (!strcmp(a, "--aa")) { g_aa = 1; continue; }
    if (!v) usage();
    i++;
    if (!strcmp(a, "--blocks")) blocks = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--k")) { if (!(nk = parse_ks(v, ks, 16))) usage(); }
    else if (!strcmp(a, "--batch")) batch = (unsigned)atoi(v);
    else if (!strcmp(a, "--runs")) runs = atoi(v);
    else if (!strcmp(a, "--vocab")) g_vocab = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--queue-bytes")) queue_bytes = (size_t)strtoull(v, NULL, 10);
    else if (!strcmp(a, "--form")) forms = !strcmp(v, "map") ? 1 : !strcmp(v, "positional") ? 2 : !strcmp(v, "both") ? 3 : 0;
    else if (!strcmp(a, "--publish"))
      pubs = !strcmp(v, "whole") ? 1 : !strcmp(v, "split") ? 2 : !strcmp(v, "coalesce") ? 4
           : !strcmp(v, "all") ? 7 : 0;
    else if (!strcmp(a, "--wire")) wires = !strcmp(v, "tcp") ? 1 : !strcmp(v, "ipc") ? 2 : !strcmp(v, "both") ? 3 : 0;
    else usage();
  }
  if (blocks == 0 || batch == 0 || runs < 1 || runs > 64 || !forms || !wires || !pubs) usage();
  static row rows[2 * 2 * 16 * 3];
  size_t nr = 0;
  for (int f = 0; f < 2; f++)
    for (unsigned ki = 0; ki < nk; ki++)
      for (int m = 0; m < 3; m++)
        for (int t = 0; t < 2; t++)
          if ((forms >> f & 1) && (wires >> t & 1) && (pubs >> m & 1))
            rows[nr++] = (row){.wire = t ? "ipc" : "tcp", .pub = m,
                               .form = f ? KVBM_FORM_POSITIONAL : KVBM_FORM_MAP, .k = ks[ki]};
  /* rounds outermost: whatever else the machine does falls on every row alike */
  for (int r = 0; r < runs; r++)
    for (size_t i = 0; i < nr; i++) run_round(&rows[i], r, batch, blocks, queue_bytes);
  int fails = 0;
  if (json) {
    printf("{\"bench\": \"bench_events\", \"workload\": \"W3 events (BlockStored/BlockRemoved of K "
           "blocks x 16 tokens)\", \"blocks_per_run\": %llu, \"batch\": %u, \"runs\": %d, "
           "\"stage\": %s, \"vocab\": %u, \"rows\": {",
           blocks, batch, runs, g_stage ? "true" : "false", g_vocab);
  } else {
    printf("bench_events: W3 event stream (BlockStored of K blocks x 16 tokens, then BlockRemoved "
           "of them), %llu block events per run, batches of %u events, %d rounds: median "
           "[min..max]; CPU in ns per block event\n"
           "  ours: publish (check, encode once, queue), batch and frame (topic, seq, payload), "
           "send; subscriber: frames and sequence checked, payload decoded into kvbm_event "
           "structs\n"
           "%s"
           "  raw zmq: the same payloads encoded before the clock starts, sent as the same 3 "
           "frames; receiver: zmq_msg_recv only, same SUB queue limits\n"
           "  bytes/blk and msgs: payload bytes per block event and messages as each receiver "
           "counted them (ours | raw; same wire when equal)\n",
           blocks, batch, runs,
           g_stage ? "  ours publishes through a producer stage of one batch (--stage)\n" : "");
    printf("%-4s %-10s %-8s %3s %26s %26s %18s %16s %16s %14s %14s %15s %13s\n", "wire", "form",
           "publish", "K",
           "ours M blk/s", "raw zmq M blk/s", "ours/raw", "pub cpu", "sub cpu", "raw pub",
           "raw sub", "bytes/blk", "msgs");
  }
  for (size_t i = 0; i < nr; i++) {
    row *w = &rows[i];
    const char *fname = w->form == KVBM_FORM_MAP ? "map" : "positional";
    if (w->ok < runs) fails++;
    kvbm_bench_spread sp[NF];
    for (int f = 0; f < NF && w->ok; f++) sp[f] = kvbm_bench_spread_of(w->v[f], w->ok);
    if (json) {
      printf("%s\n  \"%s.%s.k%u%s%s\": {\"wire\": \"%s\", \"form\": \"%s\", \"k\": %u, "
             "\"publish\": \"%s\", \"rounds\": %d, \"lost\": %llu, \"malformed\": %llu",
             i ? "," : "", w->wire, fname, w->k, w->pub ? "." : "", w->pub ? kPub[w->pub] : "",
             w->wire, fname, w->k, kPub[w->pub], w->ok, w->lost, w->malformed);
      for (int f = 0; f < NF && w->ok; f++)
        printf(", \"%s\": {\"median\": %.6g, \"min\": %.6g, \"max\": %.6g}", kFig[f],
               sp[f].median, sp[f].min, sp[f].max);
      printf("}");
      continue;
    }
    if (!w->ok) {
      printf("%-4s %-10s %-8s %3u  every round failed\n", w->wire, fname, kPub[w->pub], w->k);
      continue;
    }
    printf("%-4s %-10s %-8s %3u %8.2f [%6.2f..%6.2f] %8.2f [%6.2f..%6.2f] %4.2f [%4.2f..%4.2f] "
           "%4.0f [%4.0f..%4.0f] %4.0f [%4.0f..%4.0f] %4.0f [%3.0f..%3.0f] %4.0f [%3.0f..%3.0f] "
           "%6.1f|%-6.1f %6.0f|%-6.0f%s%s\n",
           w->wire, fname, kPub[w->pub], w->k, sp[F_OURS].median / 1e6, sp[F_OURS].min / 1e6,
           sp[F_OURS].max / 1e6, sp[F_RAW].median / 1e6, sp[F_RAW].min / 1e6, sp[F_RAW].max / 1e6,
           sp[F_RATIO].median, sp[F_RATIO].min, sp[F_RATIO].max, sp[F_PUB].median, sp[F_PUB].min,
           sp[F_PUB].max, sp[F_SUB].median, sp[F_SUB].min, sp[F_SUB].max, sp[F_RPUB].median,
           sp[F_RPUB].min, sp[F_RPUB].max, sp[F_RSUB].median, sp[F_RSUB].min, sp[F_RSUB].max,
           sp[F_OBYTES].median, sp[F_RBYTES].median, sp[F_OMSGS].median, sp[F_RMSGS].median,
           w->lost || w->malformed ? "  LOST/MALFORMED" : "",
           g_no_peer || same_wire(&sp[F_OBYTES], &sp[F_RBYTES]) ? "" : "  BYTES DIFFER");
    printf("      threads, CPU ns a block event (medians): ours pub main %.0f, thread %.0f, zmq "
           "%.0f; sub main %.0f, other %.0f, zmq %.0f | raw pub main %.0f, zmq %.0f; sub main "
           "%.0f, zmq %.0f | busiest: ours %.0f, raw %.0f; one core a thread: %.2f [%.2f..%.2f] | "
           "the producer's loop alone %.2f M blk/s, the peer's sender's %.2f\n",
           sp[F_PMAIN].median, sp[F_PTHR].median, sp[F_PZMQ].median, sp[F_SMAIN].median,
           sp[F_SOTHER].median, sp[F_SZMQ].median, sp[F_RPMAIN].median, sp[F_RPZMQ].median,
           sp[F_RSMAIN].median, sp[F_RSZMQ].median, sp[F_OBUSY].median, sp[F_RBUSY].median,
           sp[F_TBOUND].median, sp[F_TBOUND].min, sp[F_TBOUND].max, sp[F_PROD].median / 1e6,
           sp[F_RSEND].median / 1e6);
    if (g_aa && !g_no_peer)
      printf("      the peer against itself (--aa: run again after it, each round): %.2f "
             "[%.2f..%.2f]\n",
             sp[F_AA].median, sp[F_AA].min, sp[F_AA].max);
  }
  if (json) printf("\n}}\n");
  return fails ? 1 : 0;
}
