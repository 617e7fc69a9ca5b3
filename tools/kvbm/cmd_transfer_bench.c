/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_transfer_bench.c: `kvbm transfer-bench`, W4 remote: how fast KV
 * blocks move between two nodes over the UCX fabric, as ratios to two
 * references measured in the same run.
 *
 * The bound: memcpy of the same working set (the same source blocks into
 * as many destination slots, in the same order, one thread). That is what
 * a shared-memory transport on one host does at best, so plain transfer
 * is reported as a fraction of it (the target: at least 0.9).
 * For reference: `ucx_perftest -t ucp_put_bw` (server and client processes
 * on 127.0.0.1, same message size as one block, same UCX_TLS /
 * UCX_NET_DEVICES as the fabric), its "overall" bandwidth. It puts one
 * cache-hot buffer again and again, so against kvbm's working set of
 * distinct blocks its ratio measures the working set more than kvbm.
 *
 * Measured: this process is node A, a forked child is node B. B registers
 * --slots blocks of storage and exports its layout; A imports it and sends
 * --blocks blocks from its own (registered) storage, in batches of
 * --batch: one-sided writes of each block into a slot of B by block id,
 * a flush, then a notification message naming the slots. B acknowledges
 * each batch; A reuses a slot only after B acknowledged the batch that
 * filled it (a ring of slots / batch batches in flight). The clock runs
 * from the first write to the last acknowledgement (after one untimed
 * round of the ring as warm-up). Rounds of (reference, plain, checked,
 * pulled, rehash) are interleaved and the medians reported, so that a
 * noisy neighbour on a shared machine weighs on all alike. A's source
 * blocks live in fabric storage (kvbm_fabric_storage_create), exported
 * to B for the pulled mode. Four modes, same connection:
 *   plain    as above;
 *   checked  a block's BLAKE3-128 is computed once in its life (issue 22):
 *            A's source blocks are hashed when they are filled (their
 *            "commit", untimed), and the sum is kept beside them, as the
 *            manager's tiers keep one per block (tier/copy.c). A then only
 *            frames: the MRDN v1 header of each block, with its kept sum,
 *            goes in the notification (A hashes nothing; counted). B
 *            verifies every block in place against its header before
 *            acknowledging it (a block that fails would be rejected; the
 *            bench fails if any does): the one hash a byte gets on its
 *            way (B says in each acknowledgement how many blocks it
 *            hashed; counted as receiver_hashed_bytes). B hashes a batch on a kvbm_blake3_pool of --hash-threads
 *            workers and its main thread (each 2 MiB block in 256 KiB
 *            pieces, so one block spreads over every thread).
 *   pulled   checked's design with the copy moved to the receiver: A only
 *            frames (the same notification, naming its source blocks);
 *            B reads each block out of A's memory, mapped here by UCX's
 *            shared-memory transport, with kvbm_fabric_read_blocks_hashed:
 *            its pool copies a 256 KiB piece (--piece) and hashes it at
 *            once from the copying core's cache, so the bytes cross
 *            memory once and the copy is spread over B's threads with
 *            the hash; then checks each block against its header. The
 *            same work per byte as checked (one copy + one hash), on one
 *            side.
 *   rehash   the design before: A hashes every block at every send too
 *            (on its own pool, batch k+1 while it writes batch k), B
 *            verifies. Kept to show what the kept sum saves, in the same
 *            run, and as the path of a block whose sum was not kept.
 * Output: GB/s (10^9 bytes/s) of block bytes for each mode (median, min,
 * max over the rounds), the references, the ratios, the load average
 * before and after, and the CPU bound of each checked mode on this
 * machine: what the cores could give if its work per byte were spread
 * over all of them perfectly, from the same round's memcpy and
 * single-thread BLAKE3 speeds, at most plain's speed. Checked does one
 * copy and one hash per byte: bound = min(plain, cores / (1/memcpy +
 * 1/blake3)), and checked / bound is its target (at least 0.8); rehash
 * does one copy and two hashes (2/blake3). --json gives one object.
 *
 * CPU per byte: each end's process CPU time (CLOCK_PROCESS_CPUTIME_ID;
 * B's is carried in its acknowledgements) over the bytes moved, per mode,
 * and for the checked modes the work per byte in CPU time (the round's
 * copy and single-thread hash, CLOCK_THREAD_CPUTIME_ID) over that. The
 * wall-clock ratios say how much of two cores the bench got; these say
 * what it did with what it got, which a loaded machine changes far less:
 * 1.0 means no CPU spent beyond one copy + one hash per byte.
 *
 * The two nodes share a fresh random key (drawn before the fork), so the
 * listening side channel refuses anyone else who connects meanwhile.
 *
 * Exit: 0 ok, 1 a failure (including a failed verification or a missing
 * ucx_perftest when a reference is needed), 2 bad usage.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fabric_cli.h"
#include "kvbm/blake3.h"
#include "kvbm/fabric.h"
#include "kvbm/frame.h"
#include "kvbm/storage.h"

const char kvbm_cmd_transfer_bench_help[] =
    "W4 remote: GB/s of 2 MiB blocks over the UCX fabric vs memcpy of the same working set and ucx_perftest, "
    "without BLAKE3, with a kept sum checked once, and hashed at both ends";

static const char kUsage[] =
    "usage: kvbm transfer-bench [options]\n"
    "  --blocks N         blocks sent per mode (default 2048)\n"
    "  --slots N          receiver slots, a multiple of --batch (default 32)\n"
    "  --batch N          blocks per notification (default 8)\n"
    "  --rounds N         rounds of (reference, memcpy, plain, checked, rehash); medians reported (default 3)\n"
    "  --hash-threads N   BLAKE3 workers at each end, besides the waiting thread\n"
    "                     (default: online CPUs - 1)\n"
    "  --piece BYTES      the BLAKE3 pools' piece: what one thread copies and hashes at a time\n"
    "                     (a power of two, 1 KiB .. 1 GiB; default 256 KiB)\n"
    "  --no-reference     skip ucx_perftest (ratios are then omitted)\n"
    "  --perftest PATH    the ucx_perftest binary (default: found in PATH)\n"
    "  --json             one JSON object\n";

#define CMD "transfer-bench"
#define NOTE_MAGIC 0x42545653u /* "SVTB" */
#define FLAG_CHECK 1u
#define FLAG_END 2u
#define FLAG_PULL 4u /* B reads the blocks from A (pulled mode) */

enum { MODE_PLAIN, MODE_CHECKED, MODE_PULLED, MODE_REHASH, MODES };

typedef struct bench {
  fab_opts o;
  uint64_t blocks, slots, batch;
  uint64_t rounds;
  uint64_t hash_threads;
  uint64_t piece; /* the BLAKE3 pools' piece (0: the pool's default) */
  bool reference, json;
  const char *perftest;
} bench;

#define MAX_ROUNDS 15

/* A notification: header, then per block a slot id and (checked mode) the
 * frame header. */
typedef struct note_hdr {
  uint32_t magic, batch, count, flags;
} note_hdr;

typedef struct note_entry {
  uint32_t slot; /* B's slot */
  uint32_t src;  /* pulled: A's source block to read into it */
  uint8_t frame[KVBM_FRAME_HEADER_LEN];
} note_entry;

typedef struct ack {
  uint32_t batch, ok, bad, hashed; /* hashed: blocks B hashed to check them */
  uint64_t cpu_ns;                 /* B's process CPU time when it sent this */
} ack;

/* This process's CPU time (all its threads), in ns: what each end spends
 * per byte is the figure the wall clock hides on a shared machine. */
static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static uint64_t cpu_now_ns(void) { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }
static uint64_t thread_cpu_ns(void) { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

/* ---- the reference: ucx_perftest ---- */

/* Starts ucx_perftest with args under the bench's UCX environment;
 * stdout to `out` (a pipe write end) unless -1. */
static pid_t spawn_perftest(const bench *b, const kvbm_fabric_ucx_config *cfg, char *const args[], int out) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (cfg->transports) setenv("UCX_TLS", cfg->transports, 1);
  if (cfg->net_devices) setenv("UCX_NET_DEVICES", cfg->net_devices, 1);
  int devnull = open("/dev/null", O_WRONLY);
  dup2(out >= 0 ? out : devnull, 1);
  dup2(devnull, 2);
  execvp(b->perftest, args);
  _exit(127);
}

/* A free port: bind 0, read it, close (a small race: the caller retries). */
static int free_port(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0
               ? 0 : -1;
  close(fd);
  *port = ntohs(sa.sin_port);
  return rc;
}

/* Whether some socket listens on TCP port `port` (read from /proc/net/tcp
 * and tcp6, so that the check does not connect to the server itself). */
static bool port_listening(uint16_t port) {
  const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(files[i], "r");
    if (!f) continue;
    char line[512];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
      char local[128];
      unsigned st;
      if (sscanf(line, " %*d: %127s %*s %x", local, &st) != 2) continue;
      const char *colon = strrchr(local, ':');
      if (colon && st == 0x0A && strtoul(colon + 1, NULL, 16) == port) found = true;
    }
    fclose(f);
    if (found) return true;
  }
  return false;
}

/* Runs server + client once; *gbps from the client's "Final:" line. */
static int run_reference_once(const bench *b, const kvbm_fabric_ucx_config *cfg, uint64_t bb, double *gbps) {
  uint16_t port;
  if (free_port(&port) != 0) return -1;
  char ps[16], ss[32], ns[32];
  snprintf(ps, sizeof ps, "%u", (unsigned)port);
  snprintf(ss, sizeof ss, "%" PRIu64, bb);
  snprintf(ns, sizeof ns, "%" PRIu64, b->blocks);
  char *srv[] = {(char *)b->perftest, "-p", ps, NULL};
  pid_t sp = spawn_perftest(b, cfg, srv, -1);
  if (sp < 0) return -1;
  /* the client gives up at once if the server is not listening yet */
  for (int i = 0; i < 1000 && !port_listening(port); i++) {
    if (waitpid(sp, NULL, WNOHANG) == sp) return -1; /* the server died */
    usleep(10000);
  }
  int pfd[2];
  if (pipe(pfd) != 0) {
    kill(sp, SIGKILL);
    waitpid(sp, NULL, 0);
    return -1;
  }
  char *cli[] = {(char *)b->perftest, "127.0.0.1", "-p", ps, "-t", "ucp_put_bw", "-s", ss, "-n", ns, NULL};
  pid_t cp = spawn_perftest(b, cfg, cli, pfd[1]);
  close(pfd[1]);
  FILE *f = fdopen(pfd[0], "r");
  char line[512];
  double mbs = -1;
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "Final:", 6) != 0) continue;
    double v[8];
    if (sscanf(line + 6, "%lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6) mbs = v[5];
  }
  if (f) fclose(f);
  int st = 0;
  if (cp > 0) waitpid(cp, &st, 0);
  kill(sp, SIGTERM);
  waitpid(sp, NULL, 0);
  if (mbs <= 0) return -1;
  *gbps = mbs * 1048576.0 / 1e9; /* ucx_perftest's MB is 2^20 bytes */
  return 0;
}

/* ---- node B: the receiver, in a child process ---- */

static int receiver(const bench *b, uint16_t port) {
  const fab_opts *o = &b->o;
  kvbm_error e = {0};
  kvbm_layout lay;
  if (fab_layout(o, b->slots, &lay, &e)) return 2;
  uint64_t bb = kvbm_fabric_block_bytes(&lay);
  kvbm_storage *s = NULL;
  kvbm_fabric *f = NULL;
  kvbm_fabric_local_set *ls = NULL;
  kvbm_layout_desc desc = {0};
  uint8_t *wire = NULL, *awire = NULL;
  kvbm_fabric_remote_set *ars = NULL; /* A's source blocks (pulled mode) */
  uint64_t *srcs = calloc(b->batch, sizeof *srcs);
  void **dsts = calloc(b->batch, sizeof *dsts);
  size_t wlen, note_max = sizeof(note_hdr) + b->batch * sizeof(note_entry);
  uint8_t *note = malloc(note_max);
  uint8_t(*sums)[KVBM_FRAME_CHECKSUM_LEN] = calloc(b->batch, KVBM_FRAME_CHECKSUM_LEN);
  kvbm_blake3_job *jobs = calloc(b->batch, sizeof *jobs);
  kvbm_frame_header *fhs = calloc(b->batch, sizeof *fhs);
  kvbm_blake3_pool *pool = NULL;
  int code = 1;
  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  cfg.name = "bench-b";
  if (!sums || !jobs || !fhs || !srcs || !dsts || kvbm_blake3_pool_create((unsigned)b->hash_threads, b->piece, &pool, &e)) {
    fprintf(stderr, "kvbm " CMD ": receiver: %s\n", e.msg[0] ? e.msg : "out of memory");
    goto out;
  }
  /* The slots live in memory the fabric allocated: what a receiving node
   * should use (see kvbm_fabric_storage_create). */
  if (!note || kvbm_fabric_ucx_connect(&cfg, "127.0.0.1", port, &f, &e) ||
      kvbm_fabric_storage_create(f, &lay, &s, &e) || kvbm_storage_describe(s, &lay, 2, &desc, &e) ||
      kvbm_fabric_register(f, &desc, &ls, &e) || kvbm_fabric_export(ls, &wire, &wlen, &e) ||
      kvbm_fabric_push(f, wire, wlen, NULL, &e)) {
    fprintf(stderr, "kvbm " CMD ": receiver: %s\n", e.msg);
    goto out;
  }
  /* A's source set, which B reads from in pulled mode */
  {
    kvbm_fabric_handle h;
    size_t alen;
    if (kvbm_fabric_next(f, (int)o->timeout_ms, &h, &alen, &e) || !(awire = malloc(alen ? alen : 1)) ||
        kvbm_fabric_pull(f, h, awire, alen, &alen, (int)o->timeout_ms, &e) ||
        kvbm_fabric_import(f, awire, alen, &ars, &e)) {
      fprintf(stderr, "kvbm " CMD ": receiver: A's set: %s\n", e.msg[0] ? e.msg : "out of memory");
      goto out;
    }
  }
  ack acks[64];
  unsigned next_ack = 0;
  for (;;) {
    kvbm_fabric_handle h;
    size_t len;
    if (kvbm_fabric_next(f, (int)o->timeout_ms, &h, &len, &e) ||
        kvbm_fabric_pull(f, h, note, note_max, &len, (int)o->timeout_ms, &e)) {
      fprintf(stderr, "kvbm " CMD ": receiver: %s\n", e.msg);
      goto out;
    }
    note_hdr nh;
    if (len < sizeof nh) goto out;
    memcpy(&nh, note, sizeof nh);
    if (nh.magic != NOTE_MAGIC || nh.count > b->batch || len != sizeof nh + nh.count * sizeof(note_entry)) goto out;
    if (nh.flags & FLAG_END) break;
    ack *a = &acks[next_ack++ % 64];
    memset(a, 0, sizeof *a);
    a->batch = nh.batch;
    /* Checked: every block of the batch hashed where it landed, in pieces
     * on the pool's workers and this thread, then checked against its
     * header. */
    size_t nj = 0;
    for (uint32_t i = 0; i < nh.count; i++) {
      note_entry ne;
      memcpy(&ne, note + sizeof nh + i * sizeof ne, sizeof ne);
      if (ne.slot >= b->slots) goto out;
      if (!(nh.flags & FLAG_CHECK)) {
        a->ok++;
      } else if (kvbm_frame_parse_header(ne.frame, sizeof ne.frame, (uint32_t)bb, &fhs[nj], NULL) != KVBM_OK) {
        a->bad++;
      } else {
        jobs[nj] = (kvbm_blake3_job){fab_block_ptr(s, &lay, ne.slot), bb, sums[nj], KVBM_FRAME_CHECKSUM_LEN};
        srcs[nj] = ne.src;
        dsts[nj] = fab_block_ptr(s, &lay, ne.slot);
        nj++;
      }
    }
    /* Pulled: B reads each block from A's memory into its slot, hashing
     * it as it lands (on the pool, a piece copied and hashed by the same
     * thread), then checks it against its header. */
    if (nj > 0 && (nh.flags & FLAG_PULL)) {
      if (kvbm_fabric_read_blocks_hashed(f, ars, srcs, dsts, nj, pool, &sums[0][0], KVBM_FRAME_CHECKSUM_LEN,
                                         (int)o->timeout_ms, &e)) {
        fprintf(stderr, "kvbm " CMD ": receiver: %s\n", e.msg);
        goto out;
      }
      a->hashed = (uint32_t)nj;
      for (size_t i = 0; i < nj; i++) {
        if (kvbm_frame_check_sum(&fhs[i], bb, sums[i], NULL) == KVBM_OK)
          a->ok++;
        else
          a->bad++;
      }
    } else if (nj > 0) {
      uint64_t t;
      if (kvbm_blake3_pool_submit(pool, jobs, nj, &t, &e) || kvbm_blake3_pool_wait(pool, t, &e)) {
        fprintf(stderr, "kvbm " CMD ": receiver: %s\n", e.msg);
        goto out;
      }
      a->hashed = (uint32_t)nj;
      for (size_t i = 0; i < nj; i++) {
        if (kvbm_frame_check_sum(&fhs[i], bb, sums[i], NULL) == KVBM_OK)
          a->ok++;
        else
          a->bad++;
      }
    }
    /* acks live in a ring of 64: the sender never has more in flight */
    a->cpu_ns = cpu_now_ns();
    if (kvbm_fabric_push(f, a, sizeof *a, NULL, &e)) goto out;
  }
  kvbm_fabric_flush(f, (int)o->timeout_ms, NULL);
  code = 0;
out:
  kvbm_blake3_pool_destroy(pool);
  kvbm_fabric_remote_set_release(ars);
  kvbm_fabric_local_set_release(ls);
  kvbm_storage_release(s);
  kvbm_fabric_destroy(f);
  kvbm_layout_desc_release(&desc);
  free(wire);
  free(awire);
  free(srcs);
  free(dsts);
  free(note);
  free(sums);
  free(jobs);
  free(fhs);
  return code;
}

/* ---- node A: the sender, measuring ---- */

typedef struct sender {
  const bench *b;
  kvbm_fabric *f;
  kvbm_fabric_remote_set *rs;
  kvbm_storage *src;
  kvbm_layout lay;
  uint64_t bb;
  uint8_t *notes; /* one notification buffer per batch in flight */
  size_t note_len;
  uint64_t bad;
  /* checked mode: the hashing of two batches at most is outstanding
   * (batch k, being written, and k+1, submitted ahead) */
  kvbm_blake3_pool *pool;
  kvbm_blake3_job *jobs;                  /* 2 x batch */
  uint8_t (*sums)[KVBM_FRAME_CHECKSUM_LEN]; /* 2 x batch */
  uint64_t tickets[2];
  /* checked mode: each source block's sum, computed once when it was
   * filled (its "commit"), as a tier keeps it */
  uint8_t (*kept)[KVBM_FRAME_CHECKSUM_LEN]; /* slots */
  uint64_t hashed[MODES];                   /* bytes A hashed while sending */
  uint64_t rhashed[MODES];                  /* bytes B hashed to check them */
  uint64_t rcpu_ns;                         /* B's CPU time in its latest ack */
  int mode;                                 /* the mode being sent */
} sender;

/* Source block i of batch k. */
static const void *src_block(const sender *sd, uint64_t k, uint64_t i) {
  return fab_block_ptr(sd->src, &sd->lay, (k * sd->b->batch + i) % sd->b->slots);
}

/* Queues the hashing of batch k's blocks on the pool. */
static int submit_hash(sender *sd, uint64_t k, kvbm_error *e) {
  const uint64_t n = sd->b->batch, half = (k % 2) * n;
  for (uint64_t i = 0; i < n; i++)
    sd->jobs[half + i] = (kvbm_blake3_job){src_block(sd, k, i), sd->bb, sd->sums[half + i], KVBM_FRAME_CHECKSUM_LEN};
  return kvbm_blake3_pool_submit(sd->pool, sd->jobs + half, n, &sd->tickets[k % 2], e);
}

/* Waits for the acknowledgement of batch `want`. */
static int wait_ack(sender *sd, uint32_t want, kvbm_error *e) {
  kvbm_fabric_handle h;
  size_t len;
  ack a;
  int rc = kvbm_fabric_next(sd->f, (int)sd->b->o.timeout_ms, &h, &len, e);
  if (!rc) rc = kvbm_fabric_pull(sd->f, h, &a, sizeof a, &len, (int)sd->b->o.timeout_ms, e);
  if (rc) return rc;
  if (len != sizeof a || a.batch != want)
    return kvbm_error_set(e, KVBM_EPROTO, "acknowledgement of batch %u, expected %u", a.batch, want);
  sd->bad += a.bad;
  sd->rhashed[sd->mode] += (uint64_t)a.hashed * sd->bb;
  sd->rcpu_ns = a.cpu_ns;
  return KVBM_OK;
}

/* The frame checksum of batch k's block i: kept (checked) or just hashed
 * on the pool (rehash). */
static const uint8_t *block_sum(const sender *sd, int mode, uint64_t k, uint64_t i) {
  if (mode != MODE_REHASH) return sd->kept[(k * sd->b->batch + i) % sd->b->slots];
  return sd->sums[(k % 2) * sd->b->batch + i];
}

/* Sends `nbatches` batches; returns seconds from the first write to the
 * last acknowledgement. */
static int send_batches(sender *sd, uint64_t nbatches, int mode, double *secs, kvbm_error *e) {
  const bench *b = sd->b;
  uint64_t ring = b->slots / b->batch;
  const bool check = mode != MODE_PLAIN, rehash = mode == MODE_REHASH, pull = mode == MODE_PULLED;
  sd->mode = mode;
  double t0 = cli_now();
  if (rehash && submit_hash(sd, 0, e)) return 1;
  for (uint64_t k = 0; k < nbatches; k++) {
    if (k >= ring && wait_ack(sd, (uint32_t)(k - ring), e)) return 1;
    /* rehash: the next batch's hashing starts now, on the workers, while
     * this thread writes this batch: hashing overlaps the transfer. */
    if (rehash && k + 1 < nbatches && submit_hash(sd, k + 1, e)) return 1;
    uint8_t *note = sd->notes + (k % ring) * sd->note_len;
    note_hdr nh = {NOTE_MAGIC, (uint32_t)k, (uint32_t)b->batch, (check ? FLAG_CHECK : 0) | (pull ? FLAG_PULL : 0)};
    memcpy(note, &nh, sizeof nh);
    /* pulled: B moves the bytes; A only frames */
    for (uint64_t i = 0; i < b->batch && !pull; i++) {
      uint64_t slot = (k % ring) * b->batch + i;
      if (kvbm_fabric_write_block(sd->f, sd->rs, slot, src_block(sd, k, i), sd->bb, e)) return 1;
    }
    /* rehash: this batch's headers are due with its notification: wait
     * for its hashes (helping with what is still queued). */
    if (rehash) {
      if (kvbm_blake3_pool_wait(sd->pool, sd->tickets[k % 2], e)) return 1;
      sd->hashed[mode] += b->batch * sd->bb;
    }
    for (uint64_t i = 0; i < b->batch; i++) {
      note_entry ne = {.slot = (uint32_t)((k % ring) * b->batch + i),
                       .src = (uint32_t)((k * b->batch + i) % b->slots)};
      if (check &&
          kvbm_frame_encode_header_sum(KVBM_PHASE_THINK_COMPLETE, sd->bb, block_sum(sd, mode, k, i), ne.frame, e))
        return 1;
      memcpy(note + sizeof nh + i * sizeof ne, &ne, sizeof ne);
    }
    if (!pull && kvbm_fabric_flush(sd->f, (int)b->o.timeout_ms, e)) return 1;
    if (kvbm_fabric_push(sd->f, note, sd->note_len, NULL, e)) return 1;
  }
  for (uint64_t k = nbatches > ring ? nbatches - ring : 0; k < nbatches; k++)
    if (wait_ack(sd, (uint32_t)k, e)) return 1;
  *secs = cli_now() - t0;
  return 0;
}

/* One mode's figures in one round: speed, and the CPU each end spent per
 * byte moved (A: its process from the first write to the last
 * acknowledgement; B: between its acknowledgement of the warm-up's last
 * batch and of the timed run's last). */
typedef struct mode_run {
  double gbps, a_ns, b_ns;
} mode_run;

/* One mode: a warm-up round of the ring, then the timed run. */
static int measure(sender *sd, int mode, mode_run *m, kvbm_error *e) {
  const bench *b = sd->b;
  double secs;
  if (send_batches(sd, b->slots / b->batch, mode, &secs, e)) return 1;
  uint64_t nbatches = b->blocks / b->batch, b0 = sd->rcpu_ns, a0 = cpu_now_ns();
  if (send_batches(sd, nbatches, mode, &secs, e)) return 1;
  double bytes = (double)(nbatches * b->batch * sd->bb);
  m->gbps = bytes / secs / 1e9;
  m->a_ns = (double)(cpu_now_ns() - a0) / bytes;
  m->b_ns = (double)(sd->rcpu_ns - b0) / bytes;
  return 0;
}

/* ucx_perftest, up to three tries (its port is picked racily). */
static int reference(const bench *b, const kvbm_fabric_ucx_config *cfg, uint64_t bb, double *gbps) {
  for (int attempt = 0; attempt < 3; attempt++)
    if (run_reference_once(b, cfg, bb, gbps) == 0) return 0;
  fprintf(stderr, "kvbm " CMD ": ucx_perftest (%s) gave no bandwidth; is ucx-utils installed? "
                  "(--no-reference skips it)\n", b->perftest);
  return -1;
}

/* A copy with non-temporal stores (SSE2, in every x86-64): the
 * destination is not read for ownership and does not evict the cache,
 * which is what a shared-memory transport's large copies do (and why
 * UCX's puts can beat glibc's memcpy, which keeps regular stores for a
 * 2 MiB copy on a host with a large L3). Both ends 16-byte aligned. */
#if defined(__x86_64__)
#include <emmintrin.h>
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_load_si128((const __m128i *)(src + i)), b = _mm_load_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_load_si128((const __m128i *)(src + i + 32)), d = _mm_load_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  _mm_sfence();
  memcpy(dst + i, src + i, n - i);
}
#else
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }
#endif

/* The bound: a copy of the same working set, in the same order (source
 * block (k*batch+i) % slots into destination slot (k % ring)*batch+i),
 * one thread, into memory of its own (touched once beforehand), after a
 * warm-up round of the ring like the fabric's; the faster of glibc's
 * memcpy and the non-temporal copy (a bound is the best a copy does). */
static double copy_pass(sender *sd, uint8_t *dst, bool nt, double *cpu_ns) {
  const bench *b = sd->b;
  uint64_t ring = b->slots / b->batch, nbatches = b->blocks / b->batch, c0 = 0;
  double t0 = 0;
  for (uint64_t k = 0; k < ring + nbatches; k++) {
    if (k == ring) {
      t0 = cli_now();
      c0 = thread_cpu_ns();
    }
    for (uint64_t i = 0; i < b->batch; i++) {
      uint8_t *d = dst + ((k % ring) * b->batch + i) * sd->bb;
      const uint8_t *s = src_block(sd, k, i);
      if (nt && ((uintptr_t)d | (uintptr_t)s) % 16 == 0)
        copy_nt(d, s, sd->bb);
      else
        memcpy(d, s, sd->bb);
    }
  }
  double secs = cli_now() - t0, bytes = (double)(nbatches * b->batch * sd->bb);
  *cpu_ns = (double)(thread_cpu_ns() - c0) / bytes;
  return bytes / secs / 1e9;
}

/* *cpu_ns: CPU ns per byte of the faster copy (what the work costs this
 * core, whatever share of it the neighbours leave). */
static int measure_memcpy(sender *sd, uint8_t *dst, double *gbps, double *cpu_ns) {
  double c1, c2, plain = copy_pass(sd, dst, false, &c1), nt = copy_pass(sd, dst, true, &c2);
  *gbps = plain > nt ? plain : nt;
  *cpu_ns = plain > nt ? c1 : c2;
  return 0;
}

/* Single-thread BLAKE3 over the source blocks (for the CPU bound). */
static double measure_hash(sender *sd, double *cpu_ns) {
  uint8_t sum[KVBM_FRAME_CHECKSUM_LEN];
  uint64_t n = sd->b->slots * 2, c0 = thread_cpu_ns();
  double t0 = cli_now();
  for (uint64_t i = 0; i < n; i++) kvbm_blake3_hash(src_block(sd, 0, i), sd->bb, sum, sizeof sum);
  double secs = cli_now() - t0;
  *cpu_ns = (double)(thread_cpu_ns() - c0) / (double)(n * sd->bb);
  return (double)(n * sd->bb) / secs / 1e9;
}

/* The same blocks hashed on the pool, a batch per submission (what each
 * end does in the checked mode, without the transfer). */
static double measure_pool_hash(sender *sd) {
  const uint64_t n = sd->b->slots * 2, per = sd->b->batch;
  double t0 = cli_now();
  for (uint64_t k = 0; k * per < n; k++) {
    if (submit_hash(sd, k, NULL) || kvbm_blake3_pool_wait(sd->pool, sd->tickets[k % 2], NULL)) return 0;
  }
  return (double)(n / per * per * sd->bb) / (cli_now() - t0) / 1e9;
}

/* Median, min and max of the rounds (v is sorted in place). */
typedef struct spread {
  double med, min, max;
} spread;

static spread stats(double *v, uint64_t n) {
  for (uint64_t i = 1; i < n; i++)
    for (uint64_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  spread s = {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[0], v[n - 1]};
  return s;
}

static double loadavg(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  double l = -1;
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

/* CPU ns per byte moved: A's, B's, and their sum. */
typedef struct cpu_use {
  spread a, b, total;
} cpu_use;

static void json_cpu(cpu_use c) {
  printf(", \"cpu_ns_per_byte\": {\"sender\": %.4g, \"receiver\": %.4g, \"total\": %.4g, \"min_total\": %.4g"
         ", \"max_total\": %.4g}",
         c.a.med, c.b.med, c.total.med, c.total.min, c.total.max);
}

static void json_spread(const char *name, spread s) {
  printf("\"%s\": {\"gbps\": %.4g, \"min_gbps\": %.4g, \"max_gbps\": %.4g", name, s.med, s.min, s.max);
}

static int run(bench *b) {
  fab_opts *o = &b->o;
  kvbm_error e = {0};
  sender sd = {.b = b};
  double load_before = loadavg();
  if (fab_layout(o, b->slots, &sd.lay, &e)) {
    fprintf(stderr, "kvbm " CMD ": %s\n", e.msg);
    return 2;
  }
  sd.bb = kvbm_fabric_block_bytes(&sd.lay);
  kvbm_fabric_ucx_config cfg = fab_ucx_config(o);
  cfg.name = "bench-a";

  /* One reference run first, to fail early when the tool is missing. */
  double refs[MAX_ROUNDS], copies[MAX_ROUNDS], plains[MAX_ROUNDS], checks[MAX_ROUNDS], rehashes[MAX_ROUNDS],
      hashes[MAX_ROUNDS], phashes[MAX_ROUNDS];
  double a_ns[MODES][MAX_ROUNDS], b_ns[MODES][MAX_ROUNDS], ideal_ns[MAX_ROUNDS], pulls[MAX_ROUNDS];
  if (b->reference && reference(b, &cfg, sd.bb, &refs[0]) != 0) return 1;
  kvbm_fabric_listener *l = NULL;
  if (kvbm_fabric_ucx_listen(&cfg, "127.0.0.1", 0, &l, &e)) {
    fprintf(stderr, "kvbm " CMD ": %s\n", e.msg);
    return 1;
  }
  uint16_t port = kvbm_fabric_listener_port(l);
  fflush(NULL);
  pid_t child = fork();
  if (child < 0) {
    kvbm_fabric_listener_destroy(l);
    return 1;
  }
  if (child == 0) {
    kvbm_fabric_listener_destroy(l);
    _exit(receiver(b, port));
  }
  int code = 1;
  kvbm_fabric_local_set *ls = NULL;
  kvbm_layout_desc desc = {0};
  uint8_t *wire = NULL, *dst = NULL, *awire = NULL; /* awire: A's source set, for B to read from */
  size_t alen = 0;
  sd.note_len = sizeof(note_hdr) + b->batch * sizeof(note_entry);
  sd.notes = calloc(b->slots / b->batch, sd.note_len);
  sd.jobs = calloc(2 * b->batch, sizeof *sd.jobs);
  sd.sums = calloc(2 * b->batch, sizeof *sd.sums);
  sd.kept = calloc(b->slots, sizeof *sd.kept);
  if (posix_memalign((void **)&dst, 4096, b->slots * sd.bb) != 0) dst = NULL;
  if (!sd.notes || !sd.jobs || !sd.sums || !sd.kept || !dst ||
      kvbm_blake3_pool_create((unsigned)b->hash_threads, b->piece, &sd.pool, &e) ||
      kvbm_fabric_ucx_accept(l, &sd.f, &e) || kvbm_fabric_storage_create(sd.f, &sd.lay, &sd.src, &e)) {
    fprintf(stderr, "kvbm " CMD ": %s\n", e.msg[0] ? e.msg : "out of memory");
    goto out;
  }
  memset(dst, 0, b->slots * sd.bb);
  /* The source blocks are written once ("committed"), and each one's sum
   * computed then and kept: the only time A hashes them in checked mode. */
  for (uint64_t s = 0; s < b->slots; s++) {
    fab_fill_pattern(fab_block_ptr(sd.src, &sd.lay, s), sd.bb, s + 1);
    kvbm_blake3_hash(fab_block_ptr(sd.src, &sd.lay, s), sd.bb, sd.kept[s], KVBM_FRAME_CHECKSUM_LEN);
  }
  kvbm_fabric_handle h;
  size_t len;
  if (kvbm_storage_describe(sd.src, &sd.lay, 1, &desc, &e) || kvbm_fabric_register(sd.f, &desc, &ls, &e) ||
      kvbm_fabric_next(sd.f, (int)o->timeout_ms, &h, &len, &e) || !(wire = malloc(len)) ||
      kvbm_fabric_pull(sd.f, h, wire, len, &len, (int)o->timeout_ms, &e) ||
      kvbm_fabric_import(sd.f, wire, len, &sd.rs, &e) || kvbm_fabric_export(ls, &awire, &alen, &e) ||
      kvbm_fabric_push(sd.f, awire, alen, NULL, &e)) {
    fprintf(stderr, "kvbm " CMD ": setup: %s\n", e.msg);
    goto out;
  }
  /* Rounds of (reference, memcpy, plain, checked), interleaved so that a
   * noisy neighbour hits all alike; medians (and the spread) reported. */
  for (uint64_t r = 0; r < b->rounds; r++) {
    if (b->reference && r > 0 && reference(b, &cfg, sd.bb, &refs[r]) != 0) goto out;
    double copy_cpu, hash_cpu;
    measure_memcpy(&sd, dst, &copies[r], &copy_cpu);
    hashes[r] = measure_hash(&sd, &hash_cpu);
    phashes[r] = measure_pool_hash(&sd);
    mode_run m[MODES];
    if (measure(&sd, MODE_PLAIN, &m[MODE_PLAIN], &e) || measure(&sd, MODE_CHECKED, &m[MODE_CHECKED], &e) ||
        measure(&sd, MODE_PULLED, &m[MODE_PULLED], &e) || measure(&sd, MODE_REHASH, &m[MODE_REHASH], &e)) {
      fprintf(stderr, "kvbm " CMD ": %s\n", e.msg);
      goto out;
    }
    plains[r] = m[MODE_PLAIN].gbps;
    checks[r] = m[MODE_CHECKED].gbps;
    pulls[r] = m[MODE_PULLED].gbps;
    rehashes[r] = m[MODE_REHASH].gbps;
    for (int k = 0; k < MODES; k++) {
      a_ns[k][r] = m[k].a_ns;
      b_ns[k][r] = m[k].b_ns;
    }
    /* the work checked mode must do, per byte: one copy and one hash, in
     * CPU time (single-thread, this round) */
    ideal_ns[r] = copy_cpu + hash_cpu;
  }
  note_hdr end = {NOTE_MAGIC, 0, 0, FLAG_END};
  if (kvbm_fabric_push(sd.f, &end, sizeof end, NULL, &e) || kvbm_fabric_flush(sd.f, (int)o->timeout_ms, &e)) {
    fprintf(stderr, "kvbm " CMD ": %s\n", e.msg);
    goto out;
  }
  if (sd.bad) {
    fprintf(stderr, "kvbm " CMD ": %" PRIu64 " blocks failed verification\n", sd.bad);
    goto out;
  }
  /* Per-round ratios first (each round's modes ran side by side), then
   * every series summarised. The CPU bounds: each mode's work per byte
   * (one copy, and one hash for checked, two for rehash) over every core,
   * at the round's memcpy and single-thread BLAKE3 speeds, at most plain. */
  double r_copy[MAX_ROUNDS], r_check[MAX_ROUNDS], r_ref[MAX_ROUNDS], bound[MAX_ROUNDS], r_bound[MAX_ROUNDS];
  double r_rehash[MAX_ROUNDS], bound2[MAX_ROUNDS], r_bound2[MAX_ROUNDS], r_pull[MAX_ROUNDS], r_pbound[MAX_ROUNDS];
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (uint64_t r = 0; r < b->rounds; r++) {
    r_copy[r] = plains[r] / copies[r];
    r_check[r] = checks[r] / plains[r];
    r_rehash[r] = rehashes[r] / plains[r];
    r_ref[r] = b->reference ? plains[r] / refs[r] : 0;
    double one = (double)cores / (1 / copies[r] + 1 / hashes[r]), two = (double)cores / (1 / copies[r] + 2 / hashes[r]);
    bound[r] = one < plains[r] ? one : plains[r];
    bound2[r] = two < plains[r] ? two : plains[r];
    r_bound[r] = checks[r] / bound[r];
    r_pull[r] = pulls[r] / plains[r];
    r_pbound[r] = pulls[r] / bound[r]; /* the same work per byte as checked */
    r_bound2[r] = rehashes[r] / bound2[r];
  }
  /* the bounds as fractions of plain (before bound[] is sorted) */
  double bp[MAX_ROUNDS], bp2[MAX_ROUNDS];
  for (uint64_t r = 0; r < b->rounds; r++) {
    bp[r] = bound[r] / plains[r];
    bp2[r] = bound2[r] / plains[r];
  }
  spread ref = b->reference ? stats(refs, b->rounds) : (spread){-1, -1, -1};
  spread cp = stats(copies, b->rounds), pl = stats(plains, b->rounds), ck = stats(checks, b->rounds);
  spread rh = stats(rehashes, b->rounds);
  spread hs = stats(hashes, b->rounds), rc = stats(r_copy, b->rounds), rk = stats(r_check, b->rounds);
  spread rk2 = stats(r_rehash, b->rounds), bd = stats(bound, b->rounds), bd2 = stats(bound2, b->rounds);
  spread rb = stats(r_bound, b->rounds), rb2 = stats(r_bound2, b->rounds);
  spread bpl = stats(bp, b->rounds), bpl2 = stats(bp2, b->rounds);
  spread ph = stats(phashes, b->rounds);
  spread rr = stats(r_ref, b->rounds);
  /* CPU per byte moved, each end and both, and for checked the share of
   * it that is the work itself (one copy + one hash per byte at this
   * round's single-thread speeds): 1.0 would be no overhead at all. */
  double tot[MODES][MAX_ROUNDS], eff[MAX_ROUNDS], peff[MAX_ROUNDS];
  for (uint64_t r = 0; r < b->rounds; r++) {
    for (int k = 0; k < MODES; k++) tot[k][r] = a_ns[k][r] + b_ns[k][r];
    eff[r] = ideal_ns[r] / tot[MODE_CHECKED][r];
    peff[r] = ideal_ns[r] / tot[MODE_PULLED][r];
  }
  cpu_use cu[MODES];
  for (int k = 0; k < MODES; k++)
    cu[k] = (cpu_use){stats(a_ns[k], b->rounds), stats(b_ns[k], b->rounds), stats(tot[k], b->rounds)};
  spread work = stats(ideal_ns, b->rounds), ef = stats(eff, b->rounds), pef = stats(peff, b->rounds);
  spread pu = stats(pulls, b->rounds), rpu = stats(r_pull, b->rounds), rpb = stats(r_pbound, b->rounds);
  double load_after = loadavg();
  const char *tls = cfg.transports ? cfg.transports : getenv("UCX_TLS") ? getenv("UCX_TLS") : "default";
  const char *dev = cfg.net_devices ? cfg.net_devices : getenv("UCX_NET_DEVICES") ? getenv("UCX_NET_DEVICES") : "default";
  if (b->json) {
    printf("{\"workload\": \"W4 remote\", \"fabric\": \"%s\", \"block_bytes\": %" PRIu64 ", \"blocks\": %" PRIu64
           ", \"batch\": %" PRIu64 ", \"slots\": %" PRIu64 ", \"rounds\": %" PRIu64
           ", \"hash_threads\": %" PRIu64 ", \"cores\": %ld, \"load_before\": %.2f, \"load_after\": %.2f"
           ", \"ucx_tls\": \"%s\", \"ucx_net_devices\": \"%s\", ",
           kvbm_fabric_label(sd.f), sd.bb, b->blocks / b->batch * b->batch, b->batch, b->slots, b->rounds,
           b->hash_threads, cores, load_before, load_after, tls, dev);
    if (ref.med > 0) printf("\"reference\": \"ucx_perftest -t ucp_put_bw -s %" PRIu64 "\", ", sd.bb);
    json_spread("memcpy", cp);
    printf("}, ");
    json_spread("blake3_1thread", hs);
    printf("}, ");
    json_spread("blake3_pool", ph);
    printf(", \"threads\": %" PRIu64 "}, ", b->hash_threads + 1);
    json_spread("plain", pl);
    printf(", \"memcpy_ratio\": %.4g, \"min_memcpy_ratio\": %.4g, \"max_memcpy_ratio\": %.4g", rc.med, rc.min,
           rc.max);
    if (ref.med > 0)
      printf(", \"reference_gbps\": %.4g, \"ratio\": %.4g, \"min_ratio\": %.4g, \"max_ratio\": %.4g", ref.med, rr.med,
             rr.min, rr.max);
    json_cpu(cu[MODE_PLAIN]);
    printf("}, ");
    json_spread("checked", ck);
    printf(", \"plain_ratio\": %.4g, \"min_plain_ratio\": %.4g, \"max_plain_ratio\": %.4g"
           ", \"cpu_bound_gbps\": %.4g, \"min_cpu_bound_gbps\": %.4g, \"max_cpu_bound_gbps\": %.4g"
           ", \"cpu_bound_plain_ratio\": %.4g"
           ", \"bound_ratio\": %.4g, \"min_bound_ratio\": %.4g, \"max_bound_ratio\": %.4g"
           ", \"sender_hashed_bytes\": %" PRIu64 ", \"receiver_hashed_bytes\": %" PRIu64,
           rk.med, rk.min, rk.max, bd.med, bd.min, bd.max, bpl.med, rb.med, rb.min, rb.max, sd.hashed[MODE_CHECKED],
           sd.rhashed[MODE_CHECKED]);
    if (ref.med > 0) printf(", \"reference_gbps\": %.4g, \"ratio\": %.4g", ref.med, ck.med / ref.med);
    json_cpu(cu[MODE_CHECKED]);
    printf(", \"work_ns_per_byte\": %.4g, \"work_cpu_ratio\": %.4g, \"min_work_cpu_ratio\": %.4g"
           ", \"max_work_cpu_ratio\": %.4g}, ",
           work.med, ef.med, ef.min, ef.max);
    json_spread("pulled", pu);
    printf(", \"plain_ratio\": %.4g, \"min_plain_ratio\": %.4g, \"max_plain_ratio\": %.4g"
           ", \"cpu_bound_gbps\": %.4g, \"cpu_bound_plain_ratio\": %.4g"
           ", \"bound_ratio\": %.4g, \"min_bound_ratio\": %.4g, \"max_bound_ratio\": %.4g"
           ", \"sender_hashed_bytes\": %" PRIu64 ", \"receiver_hashed_bytes\": %" PRIu64,
           rpu.med, rpu.min, rpu.max, bd.med, bpl.med, rpb.med, rpb.min, rpb.max, sd.hashed[MODE_PULLED],
           sd.rhashed[MODE_PULLED]);
    json_cpu(cu[MODE_PULLED]);
    printf(", \"work_cpu_ratio\": %.4g, \"min_work_cpu_ratio\": %.4g, \"max_work_cpu_ratio\": %.4g}, ", pef.med,
           pef.min, pef.max);
    json_spread("rehash", rh);
    printf(", \"plain_ratio\": %.4g, \"min_plain_ratio\": %.4g, \"max_plain_ratio\": %.4g"
           ", \"cpu_bound_gbps\": %.4g, \"cpu_bound_plain_ratio\": %.4g"
           ", \"bound_ratio\": %.4g, \"min_bound_ratio\": %.4g, \"max_bound_ratio\": %.4g"
           ", \"sender_hashed_bytes\": %" PRIu64 ", \"receiver_hashed_bytes\": %" PRIu64,
           rk2.med, rk2.min, rk2.max, bd2.med, bpl2.med, rb2.med, rb2.min, rb2.max, sd.hashed[MODE_REHASH],
           sd.rhashed[MODE_REHASH]);
    json_cpu(cu[MODE_REHASH]);
    printf("}, \"plain_receiver_hashed_bytes\": %" PRIu64 "}\n", sd.rhashed[MODE_PLAIN]);
  } else {
    printf("workload: W4 remote over %s, %" PRIu64 " blocks of %" PRIu64 " bytes, batches of %" PRIu64 ", %" PRIu64
           " slots, median [min-max] of %" PRIu64 " rounds, UCX_TLS=%s UCX_NET_DEVICES=%s\n",
           kvbm_fabric_label(sd.f), b->blocks / b->batch * b->batch, sd.bb, b->batch, b->slots, b->rounds, tls, dev);
    printf("machine: %ld cores, load %.2f before, %.2f after; %" PRIu64 " hash threads at each end (+ the waiter)\n",
           cores, load_before, load_after, b->hash_threads);
    printf("bound (memcpy, same working set): %.3f GB/s [%.3f-%.3f]; BLAKE3 one thread %.3f GB/s [%.3f-%.3f], "
           "on the pool's %" PRIu64 " threads %.3f GB/s\n",
           cp.med, cp.min, cp.max, hs.med, hs.min, hs.max, b->hash_threads + 1, ph.med);
    if (ref.med > 0) printf("reference (ucx_perftest ucp_put_bw): %.3f GB/s [%.3f-%.3f]\n", ref.med, ref.min, ref.max);
    printf("fabric, plain:   %.3f GB/s [%.3f-%.3f]  %.3f [%.3f-%.3f] of memcpy", pl.med, pl.min, pl.max, rc.med,
           rc.min, rc.max);
    if (ref.med > 0) printf(", %.3f of ucx_perftest", rr.med);
    printf("\nfabric, checked (sum kept, one hash per byte): %.3f GB/s [%.3f-%.3f]  %.3f [%.3f-%.3f] of plain; "
           "%.3f [%.3f-%.3f] of its CPU bound (%.3f GB/s [%.3f-%.3f]: one copy + one hash per byte on %ld cores); "
           "sender hashed %" PRIu64 " bytes, receiver %" PRIu64 "\n",
           ck.med, ck.min, ck.max, rk.med, rk.min, rk.max, rb.med, rb.min, rb.max, bd.med, bd.min, bd.max, cores,
           sd.hashed[MODE_CHECKED], sd.rhashed[MODE_CHECKED]);
    printf("fabric, pulled (sum kept; B reads each block from A, hashing each 256 KiB piece as it lands): "
           "%.3f GB/s [%.3f-%.3f]  %.3f [%.3f-%.3f] of plain; %.3f [%.3f-%.3f] of checked's CPU bound; "
           "sender hashed %" PRIu64 " bytes, receiver %" PRIu64 "\n",
           pu.med, pu.min, pu.max, rpu.med, rpu.min, rpu.max, rpb.med, rpb.min, rpb.max, sd.hashed[MODE_PULLED],
           sd.rhashed[MODE_PULLED]);
    printf("fabric, rehash (hashed at both ends, as before): %.3f GB/s [%.3f-%.3f]  %.3f [%.3f-%.3f] of plain; "
           "%.3f [%.3f-%.3f] of its CPU bound (%.3f GB/s: one copy + two hashes per byte)\n",
           rh.med, rh.min, rh.max, rk2.med, rk2.min, rk2.max, rb2.med, rb2.min, rb2.max, bd2.med);
    printf("CPU ns per byte moved (sender + receiver = total [min-max]):");
    static const char *const names[MODES] = {"plain", "checked", "pulled", "rehash"};
    for (int k = 0; k < MODES; k++)
      printf("%s %s %.3f + %.3f = %.3f [%.3f-%.3f]", k ? ";" : "", names[k], cu[k].a.med, cu[k].b.med,
             cu[k].total.med, cu[k].total.min, cu[k].total.max);
    printf("\nthe work (one copy + one hash per byte): %.3f ns/byte; %.3f [%.3f-%.3f] of checked's CPU, %.3f "
           "[%.3f-%.3f] of pulled's\n",
           work.med, ef.med, ef.min, ef.max, pef.med, pef.min, pef.max);
  }
  code = 0;
out:
  kvbm_fabric_remote_set_release(sd.rs);
  kvbm_fabric_local_set_release(ls);
  kvbm_storage_release(sd.src); /* fabric storage: before its fabric */
  sd.src = NULL;
  kvbm_fabric_destroy(sd.f);
  kvbm_fabric_listener_destroy(l);
  int st = 0;
  if (code != 0) kill(child, SIGKILL);
  waitpid(child, &st, 0);
  if (code == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
    fprintf(stderr, "kvbm " CMD ": the receiver failed\n");
    code = 1;
  }
  kvbm_blake3_pool_destroy(sd.pool);
  kvbm_layout_desc_release(&desc);
  kvbm_storage_release(sd.src);
  free(sd.notes);
  free(sd.jobs);
  free(sd.sums);
  free(sd.kept);
  free(dst);
  free(wire);
  free(awire);
  return code;
}

int kvbm_cmd_transfer_bench(int argc, char **argv) {
  bench b = {0};
  fab_opts_init(&b.o, "bench-a");
  b.blocks = 2048;
  b.slots = 32;
  b.batch = 8;
  b.rounds = 3;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  b.hash_threads = cpus > 1 ? (uint64_t)cpus - 1 : 0;
  b.reference = true;
  b.perftest = "ucx_perftest";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("%s%s", kUsage, fab_opts_usage);
      return 0;
    }
    int r = fab_opts_parse(CMD, &b.o, argc, argv, &i);
    if (r < 0) return 2;
    if (r > 0) continue;
    const char *v;
    if ((r = cli_opt_value(CMD, argc, argv, &i, "--blocks", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--blocks", v, 1, 1u << 24, &b.blocks)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--slots", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--slots", v, 1, 4096, &b.slots)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--batch", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--batch", v, 1, 1024, &b.batch)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--rounds", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--rounds", v, 1, MAX_ROUNDS, &b.rounds)) return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--hash-threads", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--hash-threads", v, 0, KVBM_BLAKE3_POOL_MAX_THREADS, &b.hash_threads))
        return 2;
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--piece", &v)) != 0) {
      if (r < 0 || !cli_parse_u64(CMD, "--piece", v, 1024, 1u << 30, &b.piece)) return 2;
      if (b.piece & (b.piece - 1)) {
        fprintf(stderr, "kvbm " CMD ": --piece %" PRIu64 " is not a power of two\n", b.piece);
        return 2;
      }
    } else if ((r = cli_opt_value(CMD, argc, argv, &i, "--perftest", &v)) != 0) {
      if (r < 0) return 2;
      b.perftest = v;
    } else if (strcmp(argv[i], "--no-reference") == 0) {
      b.reference = false;
    } else if (strcmp(argv[i], "--json") == 0) {
      b.json = true;
    } else {
      fprintf(stderr, "kvbm " CMD ": unknown option '%s'\n%s%s", argv[i], kUsage, fab_opts_usage);
      return 2;
    }
  }
  if (b.slots % b.batch != 0 || b.slots / b.batch > 64 || b.blocks < b.batch) {
    fprintf(stderr, "kvbm " CMD ": --slots must be a multiple of --batch (at most 64 batches), "
                    "--blocks at least --batch\n");
    return 2;
  }
  if (b.o.kind != KVBM_LAYOUT_FULLY_CONTIGUOUS) {
    fprintf(stderr, "kvbm " CMD ": the bench moves whole contiguous blocks (no --layer-separate)\n");
    return 2;
  }
  if (fab_key_random(CMD, &b.o) != 0) return 1;
  int rc = run(&b);
  fab_key_wipe(&b.o);
  return rc;
}
