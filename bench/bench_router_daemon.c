/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_router_daemon.c: `kvbm router` over HTTP, measured from outside:
 * request rate and latency under load, and a bounded soak of hostile
 * clients.
 *
 * The bench starts the router itself (`kvbm` next to this binary, or
 * --kvbm PATH, so that two builds can be compared in one session) with
 * --workers declared workers, and drives it from one thread with epoll:
 *
 *   load:  --connections closed-loop keep-alive clients (one request in
 *          flight each) for --seconds, first GET /health, then POST /route
 *          with --tokens token ids (one of 64 prompts at random per
 *          request). Prints requests/s, p50 and p99 per probe, and the
 *          router's CPU time per answer (user + system, from /proc: less
 *          sensitive than the rate to what else the machine runs).
 *   soak (--soak): the router in approximate mode (--io-timeout 2), 16 measured /route
 *          clients (never sending /done), three phases of --seconds each:
 *          unloaded; loaded, the measured clients next to hostile ones;
 *          after, the hostile ones gone. The hostile mix:
 *            - 2 flood clients pipelining GET /health as fast as the router
 *              takes them, reading and discarding the answers;
 *            - 16 slow clients that pipeline /route requests and never
 *              read (reconnecting when the router closes them);
 *            - 1 client routing 16,384 new block hashes per request (what
 *              approximate mode records).
 *          Reports, as ratios to the unloaded phase: the measured clients'
 *          rate and p99 while loaded and after, the router's RSS peak
 *          (sampled every 50 ms) and RSS after; and the router's /health
 *          counters at the end.
 *   table (--table): the request table full against empty (issue 24).
 *          For the cap --cap (262144, the default) and 4 x it: one router
 *          whose table is filled first (exactly cap tiny /route requests,
 *          pipelined, never /done, so every later /route evicts the
 *          oldest), and an empty one (a fresh router each round, so its
 *          table holds one round's routes at most). --rounds (3)
 *          alternating rounds (empty then full, then full then empty, ...)
 *          of --seconds (2 here) with --connections measured /route
 *          clients that never send /done. Prints each round's rates, the
 *          ratio full / empty (target >= 0.9) as median and min..max, and
 *          the tables' active counts read from /health after each round.
 *
 * The generator shares the machine with the router (2 shared cores here):
 * compare builds in the same run conditions, and read ratios, not
 * absolute figures, across machines.
 *
 * --mix picks hostile kinds for the soak (default flood,slow,hashes).
 *
 * usage: bench_router_daemon [--kvbm PATH] [--seconds 5] [--connections 50]
 *                            [--tokens 1024] [--workers 8] [--soak]
 *                            [--mix flood,slow,hashes] [--json]
 *                            [--table [--cap 262144] [--rounds 3]]
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROMPTS 64
#define SLOW_CLIENTS 16
#define FLOOD_CLIENTS 2
#define SOAK_CLIENTS 16
#define HASH_BODIES 16
#define HASHES_PER_BODY 16384

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* ------------------------------------------------------------- buffers */

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

static void buf_add(buf *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) abort();
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
}

static void buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(buf *b, const char *fmt, ...) {
  char tmp[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  buf_add(b, tmp, (size_t)n);
}

/* A POST with `body` as one request's bytes. */
static buf post(const char *path, const buf *body) {
  buf r = {0};
  buf_printf(&r, "POST %s HTTP/1.1\r\n", path);
  buf_printf(&r, "Content-Length: %zu\r\n\r\n", body->len);
  buf_add(&r, body->p, body->len);
  return r;
}

/* ------------------------------------------------------------- router */

typedef struct router {
  pid_t pid;
  int port;
  char dir[64];
} router;

/* max_active: --max-active-requests (0: the router's default). */
static bool router_start(router *r, const char *kvbm, int workers, bool approx, size_t max_active) {
  snprintf(r->dir, sizeof r->dir, "/tmp/kvbm-bench-XXXXXX");
  if (!mkdtemp(r->dir)) return false;
  char pf[128], log[128];
  snprintf(pf, sizeof pf, "%s/port", r->dir);
  snprintf(log, sizeof log, "%s/log", r->dir);
  char *argv[18 + 2 * 64];
  char cap[32];
  int k = 0;
  static char wid[64][8];
  argv[k++] = (char *)kvbm;
  argv[k++] = "router";
  argv[k++] = "--listen";
  argv[k++] = "127.0.0.1:0";
  argv[k++] = "--port-file";
  argv[k++] = pf;
  argv[k++] = "--block-size";
  argv[k++] = "16";
  for (int w = 0; w < workers && w < 64; w++) {
    snprintf(wid[w], sizeof wid[w], "%d", w + 1);
    argv[k++] = "--worker";
    argv[k++] = wid[w];
  }
  if (approx) { /* the soak: slow clients lose their slots within a phase */
    argv[k++] = "--approx-ttl";
    argv[k++] = "600";
    argv[k++] = "--io-timeout";
    argv[k++] = "2";
  }
  if (max_active) {
    snprintf(cap, sizeof cap, "%zu", max_active);
    argv[k++] = "--max-active-requests";
    argv[k++] = cap;
  }
  argv[k] = NULL;
  r->pid = fork();
  if (r->pid < 0) return false;
  if (r->pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    execv(kvbm, argv);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    FILE *f = fopen(pf, "r");
    if (f) {
      int ok = fscanf(f, "%d", &r->port);
      fclose(f);
      if (ok == 1 && r->port > 0) return true;
    }
    if (waitpid(r->pid, NULL, WNOHANG) == r->pid) break;
    usleep(25000);
  }
  fprintf(stderr, "bench_router_daemon: %s router did not start (see %s)\n", kvbm, log);
  return false;
}

static void router_stop(router *r) {
  kill(r->pid, SIGTERM);
  waitpid(r->pid, NULL, 0);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", r->dir);
  if (system(cmd)) { /* nothing to do */
  }
}

/* VmRSS of the router, in KiB (0 when unreadable). */
static long router_rss(const router *r) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)r->pid);
  FILE *f = fopen(path, "r");
  long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kb;
}

/* CPU seconds the router has used (user + system). */
static double router_cpu(const router *r) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)r->pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char *p = fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
  fclose(f);
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ------------------------------------------------------------- clients */

typedef enum kind { MEASURED, HEALTH, FLOOD, SLOW, HASHES } kind;
/* MEASURED: /route closed loop; HEALTH: GET /health closed loop (both
 * timed); HASHES: /route of new hashes, closed loop, not timed. */

typedef struct client {
  kind k;
  int fd;
  buf in;
  const buf *req; /* the request in flight (MEASURED, HASHES) */
  size_t sent;
  double t_sent;
  bool waiting;   /* a request is in flight */
} client;

typedef struct lat {
  uint32_t *us;
  size_t n, cap;
} lat;

typedef struct run {
  int ep;
  int port;
  uint64_t rng;
  const buf *prompts; /* PROMPTS requests */
  const buf *health;
  const buf *flood;   /* pipelined GET /health */
  const buf *slow;    /* pipelined /route */
  const buf *hashes;  /* HASH_BODIES requests */
  lat l;
  uint64_t ok, errors, reconnects;
} run;

static int dial(int port, int rcvbuf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

static uint32_t events_of(const client *c) {
  switch (c->k) {
    case SLOW: return EPOLLOUT | EPOLLRDHUP; /* never reads */
    case FLOOD: return EPOLLIN | EPOLLOUT;
    default: return c->sent < c->req->len ? EPOLLOUT : EPOLLIN;
  }
}

static void arm(run *r, client *c, int op) {
  struct epoll_event ev = {.events = events_of(c), .data.ptr = c};
  epoll_ctl(r->ep, op, c->fd, &ev);
}

static void next_request(run *r, client *c) {
  c->req = c->k == HASHES   ? &r->hashes[rnd(&r->rng) % HASH_BODIES]
           : c->k == HEALTH ? r->health
                            : &r->prompts[rnd(&r->rng) % PROMPTS];
  c->sent = 0;
  c->in.len = 0;
  c->t_sent = now_s();
  c->waiting = true;
}

static bool client_open(run *r, client *c) {
  c->fd = dial(r->port, c->k == SLOW ? 4096 : 0);
  if (c->fd < 0) return false;
  c->in.len = 0;
  c->sent = 0;
  if (c->k != FLOOD && c->k != SLOW) next_request(r, c);
  arm(r, c, EPOLL_CTL_ADD);
  return true;
}

static void client_reopen(run *r, client *c) {
  epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  r->reconnects++;
  if (!client_open(r, c)) c->fd = -1;
}

static void record(run *r, double seconds) {
  if (r->l.n == r->l.cap) {
    r->l.cap = r->l.cap ? r->l.cap * 2 : 1 << 16;
    r->l.us = realloc(r->l.us, r->l.cap * sizeof *r->l.us);
    if (!r->l.us) abort();
  }
  double us = seconds * 1e6;
  r->l.us[r->l.n++] = us > 4e9 ? 4000000000u : (uint32_t)us;
}

/* A complete response at the front of c->in: its total length, 0 if not yet. */
static size_t response_len(const buf *in, int *status) {
  char *end = memmem(in->p, in->len, "\r\n\r\n", 4);
  if (!end) return 0;
  *status = atoi(in->p + 9);
  size_t head = (size_t)(end - in->p) + 4, body = 0;
  char *cl = memmem(in->p, head, "Content-Length: ", 16);
  if (cl) body = strtoul(cl + 16, NULL, 10);
  return in->len >= head + body ? head + body : 0;
}

/* A closed-loop client: one request in flight, latency of each answer. */
static void on_measured(run *r, client *c, uint32_t ev, bool count) {
  if (ev & (EPOLLERR | EPOLLHUP)) goto broken;
  if (c->sent < c->req->len) {
    ssize_t n = send(c->fd, c->req->p + c->sent, c->req->len - c->sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) goto broken;
    if (n > 0) c->sent += (size_t)n;
    if (c->sent == c->req->len) arm(r, c, EPOLL_CTL_MOD);
    return;
  }
  char tmp[65536];
  ssize_t n = recv(c->fd, tmp, sizeof tmp, 0);
  if (n == 0 || (n < 0 && errno != EAGAIN)) goto broken;
  if (n < 0) return;
  buf_add(&c->in, tmp, (size_t)n);
  int status = 0;
  size_t len = response_len(&c->in, &status);
  if (!len) return;
  if (count && c->k != HASHES) {
    if (status == 200) {
      r->ok++;
      record(r, now_s() - c->t_sent);
    } else {
      r->errors++;
    }
  }
  next_request(r, c);
  arm(r, c, EPOLL_CTL_MOD);
  return;
broken:
  if (count && c->k != HASHES) r->errors++;
  client_reopen(r, c);
}

static void on_flood(run *r, client *c, uint32_t ev) {
  if (ev & (EPOLLERR | EPOLLHUP)) {
    client_reopen(r, c);
    return;
  }
  if (ev & EPOLLIN) {
    char tmp[65536];
    while (recv(c->fd, tmp, sizeof tmp, 0) > 0) {
    }
  }
  if (ev & EPOLLOUT) {
    ssize_t n = send(c->fd, r->flood->p, r->flood->len, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) client_reopen(r, c);
  }
}

static void on_slow(run *r, client *c, uint32_t ev) {
  if (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) { /* the router let it go */
    client_reopen(r, c);
    return;
  }
  ssize_t n = send(c->fd, r->slow->p, r->slow->len, MSG_NOSIGNAL);
  if (n < 0 && errno != EAGAIN) client_reopen(r, c);
}

typedef struct phase_out {
  double rate, p50_ms, p99_ms;
  double cpu_us; /* router CPU per measured answer (all clients' work included) */
  uint64_t ok, errors;
  long rss_peak_kb, rss_end_kb;
} phase_out;

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Runs the clients for `seconds` after `warm` seconds not counted. */
static phase_out phase(run *r, client *cs, size_t n, double warm, double seconds, const router *rt) {
  phase_out o = {0};
  r->l.n = 0;
  r->ok = r->errors = 0;
  double t0 = now_s(), start = t0 + warm, stop = start + seconds, next_rss = t0;
  bool counting = false;
  double cpu0 = 0;
  struct epoll_event evs[256];
  for (;;) {
    double t = now_s();
    if (t >= stop) break;
    if (!counting && t >= start) {
      counting = true;
      r->l.n = 0;
      r->ok = r->errors = 0;
      cpu0 = router_cpu(rt);
    }
    if (t >= next_rss) {
      long kb = router_rss(rt);
      if (kb > o.rss_peak_kb) o.rss_peak_kb = kb;
      next_rss = t + 0.05;
    }
    int k = epoll_wait(r->ep, evs, 256, 10);
    for (int i = 0; i < k; i++) {
      client *c = evs[i].data.ptr;
      if (c->fd < 0) continue;
      if (c->k == FLOOD) on_flood(r, c, evs[i].events);
      else if (c->k == SLOW) on_slow(r, c, evs[i].events);
      else on_measured(r, c, evs[i].events, counting);
    }
    for (size_t j = 0; j < n; j++) /* the router refused a reconnect: try again */
      if (cs[j].fd < 0) client_open(r, &cs[j]);
  }
  o.ok = r->ok;
  o.errors = r->errors;
  if (r->ok) o.cpu_us = (router_cpu(rt) - cpu0) * 1e6 / (double)r->ok;
  o.rate = (double)r->ok / seconds;
  if (r->l.n) {
    qsort(r->l.us, r->l.n, sizeof *r->l.us, cmp_u32);
    o.p50_ms = r->l.us[r->l.n / 2] * 1e-3;
    o.p99_ms = r->l.us[(size_t)((double)(r->l.n - 1) * 0.99)] * 1e-3;
  }
  o.rss_end_kb = router_rss(rt);
  if (o.rss_end_kb > o.rss_peak_kb) o.rss_peak_kb = o.rss_end_kb;
  return o;
}

static void close_clients(run *r, client *cs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (cs[i].fd < 0) continue;
    epoll_ctl(r->ep, EPOLL_CTL_DEL, cs[i].fd, NULL);
    close(cs[i].fd);
    cs[i].fd = -1;
    free(cs[i].in.p);
    cs[i].in = (buf){0};
  }
}

/* GET /health over a fresh connection (blocking): the body, or NULL. */
static char *get_health(int port) {
  int fd = dial(port, 0);
  if (fd < 0) return NULL;
  fcntl(fd, F_SETFL, 0);
  static const char q[] = "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
  if (send(fd, q, sizeof q - 1, MSG_NOSIGNAL) < 0) {
    close(fd);
    return NULL;
  }
  buf b = {0};
  char tmp[65536];
  for (ssize_t n; (n = recv(fd, tmp, sizeof tmp, 0)) > 0;) buf_add(&b, tmp, (size_t)n);
  close(fd);
  buf_add(&b, "", 1);
  char *body = strstr(b.p, "\r\n\r\n");
  char *out = body ? strdup(body + 4) : NULL;
  free(b.p);
  if (out) out[strcspn(out, "\n")] = 0;
  return out;
}

/* ------------------------------------------------------------- requests */

static void make_requests(run *r, size_t tokens, buf *prompts, buf *hashes, buf *health,
                          buf *flood, buf *slow) {
  uint64_t s = 0x15;
  for (int p = 0; p < PROMPTS; p++) {
    buf body = {0};
    buf_printf(&body, "{\"token_ids\":[");
    for (size_t t = 0; t < tokens; t++) /* prompts share their first half */
      buf_printf(&body, "%s%u", t ? "," : "",
                 (unsigned)(t < tokens / 2 ? t * 7 + 1 : rnd(&s) % 32000));
    buf_printf(&body, "]}");
    prompts[p] = post("/route", &body);
    free(body.p);
  }
  for (int h = 0; h < HASH_BODIES; h++) {
    buf body = {0};
    buf_printf(&body, "{\"block_hashes\":[");
    for (int i = 0; i < HASHES_PER_BODY; i++)
      buf_printf(&body, "%s%llu", i ? "," : "", (unsigned long long)(rnd(&s) >> 1));
    buf_printf(&body, "]}");
    hashes[h] = post("/route", &body);
    free(body.p);
  }
  static const char hq[] = "GET /health HTTP/1.1\r\n\r\n";
  buf_add(health, hq, sizeof hq - 1);
  for (int i = 0; i < 2048; i++) buf_add(flood, hq, sizeof hq - 1);
  for (int i = 0; i < 16; i++) buf_add(slow, prompts[i].p, prompts[i].len);
  r->prompts = prompts;
  r->hashes = hashes;
  r->health = health;
  r->flood = flood;
  r->slow = slow;
}

/* ------------------------------------------------------------- modes */

static void print_phase(const char *name, const phase_out *o, bool json, bool last) {
  if (json)
    printf("\"%s\":{\"rate\":%.0f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"cpu_us\":%.1f,\"ok\":%llu,"
           "\"errors\":%llu,\"rss_peak_kb\":%ld,\"rss_end_kb\":%ld}%s",
           name, o->rate, o->p50_ms, o->p99_ms, o->cpu_us, (unsigned long long)o->ok,
           (unsigned long long)o->errors, o->rss_peak_kb, o->rss_end_kb, last ? "" : ",");
  else
    printf("%-9s %7.0f req/s  p50 %6.3f ms  p99 %7.3f ms  router CPU %5.1f us/answer  errors %llu"
           "  RSS peak %ld KiB, end %ld KiB\n",
           name, o->rate, o->p50_ms, o->p99_ms, o->cpu_us, (unsigned long long)o->errors,
           o->rss_peak_kb, o->rss_end_kb);
}

static int load(run *r, const router *rt, size_t conns, double seconds, bool json) {
  client *cs = calloc(conns, sizeof *cs);
  phase_out o[2];
  for (int probe = 0; probe < 2; probe++) {
    for (size_t i = 0; i < conns; i++) {
      cs[i] = (client){.k = probe == 0 ? HEALTH : MEASURED, .fd = -1};
      if (!client_open(r, &cs[i])) return 1;
    }
    o[probe] = phase(r, cs, conns, 0.5, seconds, rt);
    close_clients(r, cs, conns);
  }
  if (json) printf("{\"connections\":%zu,", conns);
  print_phase("health", &o[0], json, false);
  print_phase("route", &o[1], json, true);
  if (json) printf("}\n");
  free(cs);
  return 0;
}

static int soak(run *r, const router *rt, double seconds, const char *mix, bool json) {
  size_t n = SOAK_CLIENTS + FLOOD_CLIENTS + SLOW_CLIENTS + 1;
  client *cs = calloc(n, sizeof *cs);
  for (size_t i = 0; i < n; i++) cs[i] = (client){.k = MEASURED, .fd = -1};
  for (size_t i = 0; i < SOAK_CLIENTS; i++)
    if (!client_open(r, &cs[i])) return 1;
  phase_out base = phase(r, cs, SOAK_CLIENTS, 0.5, seconds, rt);
  size_t k = SOAK_CLIENTS;
  if (strstr(mix, "flood"))
    for (int i = 0; i < FLOOD_CLIENTS; i++) cs[k++].k = FLOOD;
  if (strstr(mix, "slow"))
    for (int i = 0; i < SLOW_CLIENTS; i++) cs[k++].k = SLOW;
  if (strstr(mix, "hashes")) cs[k++].k = HASHES;
  n = k;
  for (size_t i = SOAK_CLIENTS; i < n; i++) client_open(r, &cs[i]);
  phase_out loaded = phase(r, cs, n, 0, seconds, rt);
  close_clients(r, cs + SOAK_CLIENTS, n - SOAK_CLIENTS);
  phase_out after = phase(r, cs, SOAK_CLIENTS, 0.5, seconds, rt);
  close_clients(r, cs, SOAK_CLIENTS);
  char *health = get_health(rt->port);
  double rate = base.rate > 0 ? loaded.rate / base.rate : 0;
  double p99 = base.p99_ms > 0 ? loaded.p99_ms / base.p99_ms : 0;
  double rate_after = base.rate > 0 ? after.rate / base.rate : 0;
  double p99_after = base.p99_ms > 0 ? after.p99_ms / base.p99_ms : 0;
  double rss_peak = base.rss_end_kb ? (double)loaded.rss_peak_kb / (double)base.rss_end_kb : 0;
  double rss_after = base.rss_end_kb ? (double)after.rss_end_kb / (double)base.rss_end_kb : 0;
  if (json) {
    printf("{");
    print_phase("unloaded", &base, true, false);
    print_phase("loaded", &loaded, true, false);
    print_phase("after", &after, true, false);
    printf("\"ratios\":{\"rate_loaded\":%.3f,\"p99_loaded\":%.3f,\"rate_after\":%.3f,"
           "\"p99_after\":%.3f,\"rss_peak\":%.3f,\"rss_after\":%.3f},\"reconnects\":%llu,"
           "\"health\":%s}\n",
           rate, p99, rate_after, p99_after, rss_peak, rss_after,
           (unsigned long long)r->reconnects, health ? health : "null");
  } else {
    print_phase("unloaded", &base, false, false);
    print_phase("loaded", &loaded, false, false);
    print_phase("after", &after, false, false);
    printf("ratios to unloaded: rate %.2f, p99 %.2f (loaded); rate %.2f, p99 %.2f (after); "
           "RSS peak %.2f, RSS after %.2f\n",
           rate, p99, rate_after, p99_after, rss_peak, rss_after);
    printf("hostile reconnects %llu\nhealth %s\n", (unsigned long long)r->reconnects,
           health ? health : "(none)");
  }
  free(health);
  free(cs);
  return 0;
}

/* ------------------------------------------------------------- table */

/* "active" of /health's "requests" object, -1 when unreadable. */
static long long health_active(int port) {
  char *h = get_health(port);
  char *p = h ? strstr(h, "\"requests\":{\"active\":") : NULL;
  long long v = p ? strtoll(p + 21, NULL, 10) : -1;
  free(h);
  return v;
}

/* Sends `count` tiny /route requests (one block hash each, never /done)
 * over FILLERS pipelining connections, each at most WINDOW requests ahead
 * of its answers; true when every one was answered 200. */
static bool fill(int port, uint64_t count) {
  enum { FILLERS = 4, WINDOW = 512, CHUNK = WINDOW / 2 };
  buf body = {0}, one, chunk = {0};
  buf_printf(&body, "{\"block_hashes\":[1]}");
  one = post("/route", &body);
  for (int i = 0; i < CHUNK; i++) buf_add(&chunk, one.p, one.len);
  struct {
    int fd;
    uint64_t quota, sent, got;
    size_t chunk_len, chunk_off; /* bytes of the chunk being sent */
    buf in;
  } f[FILLERS] = {0};
  int ep = epoll_create1(EPOLL_CLOEXEC);
  bool ok = ep >= 0;
  for (int i = 0; ok && i < FILLERS; i++) {
    f[i].quota = count / FILLERS + (i < (int)(count % FILLERS));
    f[i].fd = dial(port, 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)i};
    ok = f[i].fd >= 0 && !epoll_ctl(ep, EPOLL_CTL_ADD, f[i].fd, &ev);
  }
  uint64_t got = 0;
  double deadline = now_s() + 300;
  while (ok && got < count) {
    if (now_s() > deadline) {
      fprintf(stderr, "bench_router_daemon: filling the table took over 300 s\n");
      ok = false;
      break;
    }
    struct epoll_event evs[FILLERS];
    int k = epoll_wait(ep, evs, FILLERS, 100);
    for (int e = 0; ok && e < k; e++) {
      int i = (int)evs[e].data.u32;
      if (evs[e].events & (EPOLLERR | EPOLLHUP)) {
        ok = false;
        break;
      }
      if (evs[e].events & EPOLLIN) {
        char tmp[65536];
        ssize_t n = recv(f[i].fd, tmp, sizeof tmp, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
          ok = false;
          break;
        }
        if (n > 0) buf_add(&f[i].in, tmp, (size_t)n);
        size_t off = 0, len;
        int status = 0;
        for (;;) {
          buf rest = {.p = f[i].in.p + off, .len = f[i].in.len - off};
          if (!rest.len || !(len = response_len(&rest, &status))) break;
          if (status != 200) ok = false;
          off += len;
          f[i].got++;
          got++;
        }
        memmove(f[i].in.p, f[i].in.p + off, f[i].in.len - off);
        f[i].in.len -= off;
      }
      /* a new chunk when half the window is answered */
      if (!f[i].chunk_len && f[i].sent < f[i].quota && f[i].sent - f[i].got <= CHUNK) {
        uint64_t m = f[i].quota - f[i].sent < CHUNK ? f[i].quota - f[i].sent : CHUNK;
        f[i].chunk_len = (size_t)m * one.len;
        f[i].chunk_off = 0;
        f[i].sent += m;
      }
      if (f[i].chunk_len) {
        ssize_t n = send(f[i].fd, chunk.p + f[i].chunk_off, f[i].chunk_len - f[i].chunk_off,
                         MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) ok = false;
        if (n > 0) f[i].chunk_off += (size_t)n;
        if (f[i].chunk_off == f[i].chunk_len) f[i].chunk_len = 0;
      }
      struct epoll_event ev = {.events = EPOLLIN | (f[i].chunk_len ? EPOLLOUT : 0u),
                               .data.u32 = (uint32_t)i};
      /* nothing to send and the window not half answered: wait for answers */
      if (!f[i].chunk_len && f[i].sent < f[i].quota && f[i].sent - f[i].got <= CHUNK)
        ev.events |= EPOLLOUT;
      epoll_ctl(ep, EPOLL_CTL_MOD, f[i].fd, &ev);
    }
  }
  for (int i = 0; i < FILLERS; i++) {
    if (f[i].fd >= 0) close(f[i].fd);
    free(f[i].in.p);
  }
  if (ep >= 0) close(ep);
  free(body.p);
  free(one.p);
  free(chunk.p);
  return ok;
}

typedef struct table_round {
  phase_out empty, full;
  long long empty_active, full_active;
} table_round;

/* Measured /route clients (never /done) on router `rt` for one round. */
static bool table_phase(run *r, const router *rt, size_t conns, double seconds, phase_out *o,
                        long long *active) {
  client *cs = calloc(conns, sizeof *cs);
  if (!cs) return false;
  r->port = rt->port;
  for (size_t i = 0; i < conns; i++) {
    cs[i] = (client){.k = MEASURED, .fd = -1};
    if (!client_open(r, &cs[i])) {
      close_clients(r, cs, i);
      free(cs);
      return false;
    }
  }
  *o = phase(r, cs, conns, 0.5, seconds, rt);
  close_clients(r, cs, conns);
  free(cs);
  *active = health_active(rt->port);
  return true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One cap: fill a router's table, then alternate rounds against fresh
 * empty routers. */
static int table_cap(run *r, const char *kvbm, int workers, size_t conns, double seconds,
                     int rounds, size_t cap, bool json, bool last) {
  router full;
  if (!router_start(&full, kvbm, workers, false, cap)) return 1;
  double t = now_s();
  bool ok = fill(full.port, cap);
  double fill_s = now_s() - t;
  long long filled = health_active(full.port);
  if (!ok || filled != (long long)cap) {
    fprintf(stderr, "bench_router_daemon: filling %zu records failed (active %lld)\n", cap, filled);
    router_stop(&full);
    return 1;
  }
  table_round *rd = calloc((size_t)rounds, sizeof *rd);
  double *ratio = calloc((size_t)rounds, sizeof *ratio), *er = calloc((size_t)rounds, sizeof *er),
         *fr = calloc((size_t)rounds, sizeof *fr);
  for (int i = 0; ok && i < rounds; i++) {
    router empty;
    if (!router_start(&empty, kvbm, workers, false, cap)) {
      ok = false;
      break;
    }
    if (i % 2 == 0)
      ok = table_phase(r, &empty, conns, seconds, &rd[i].empty, &rd[i].empty_active) &&
           table_phase(r, &full, conns, seconds, &rd[i].full, &rd[i].full_active);
    else
      ok = table_phase(r, &full, conns, seconds, &rd[i].full, &rd[i].full_active) &&
           table_phase(r, &empty, conns, seconds, &rd[i].empty, &rd[i].empty_active);
    router_stop(&empty);
    er[i] = rd[i].empty.rate;
    fr[i] = rd[i].full.rate;
    ratio[i] = rd[i].empty.rate > 0 ? rd[i].full.rate / rd[i].empty.rate : 0;
  }
  router_stop(&full);
  if (ok) {
    double lo = ratio[0], hi = ratio[0];
    for (int i = 1; i < rounds; i++) {
      if (ratio[i] < lo) lo = ratio[i];
      if (ratio[i] > hi) hi = ratio[i];
    }
    if (json) {
      printf("{\"cap\":%zu,\"fill_s\":%.2f,\"rounds\":[", cap, fill_s);
      for (int i = 0; i < rounds; i++)
        printf("%s{\"empty\":{\"rate\":%.0f,\"p99_ms\":%.3f,\"active\":%lld},"
               "\"full\":{\"rate\":%.0f,\"p99_ms\":%.3f,\"active\":%lld},\"ratio\":%.3f}",
               i ? "," : "", rd[i].empty.rate, rd[i].empty.p99_ms, rd[i].empty_active,
               rd[i].full.rate, rd[i].full.p99_ms, rd[i].full_active, ratio[i]);
    } else {
      printf("cap %zu (filled in %.1f s)\n", cap, fill_s);
      for (int i = 0; i < rounds; i++)
        printf("  round %d  empty %7.0f req/s p99 %7.3f ms (active %lld)   full %7.0f req/s p99 "
               "%7.3f ms (active %lld)   full/empty %.3f\n",
               i + 1, rd[i].empty.rate, rd[i].empty.p99_ms, rd[i].empty_active, rd[i].full.rate,
               rd[i].full.p99_ms, rd[i].full_active, ratio[i]);
    }
    double rm = median(ratio, rounds), em = median(er, rounds), fm = median(fr, rounds);
    if (json)
      printf("],\"median\":{\"empty\":%.0f,\"full\":%.0f,\"ratio\":%.3f},\"ratio_min\":%.3f,"
             "\"ratio_max\":%.3f}%s\n",
             em, fm, rm, lo, hi, last ? "" : ",");
    else
      printf("  median   empty %7.0f req/s   full %7.0f req/s   full/empty %.3f (min %.3f, max "
             "%.3f; target >= 0.9)\n",
             em, fm, rm, lo, hi);
  }
  free(rd);
  free(ratio);
  free(er);
  free(fr);
  return ok ? 0 : 1;
}

static int table(run *r, const char *kvbm, int workers, size_t conns, double seconds, int rounds,
                 size_t cap, bool json) {
  if (json) printf("{\"connections\":%zu,\"seconds\":%.1f,\"caps\":[", conns, seconds);
  int rc = table_cap(r, kvbm, workers, conns, seconds, rounds, cap, json, false);
  if (!rc) rc = table_cap(r, kvbm, workers, conns, seconds, rounds, 4 * cap, json, true);
  if (json) printf("]}\n");
  return rc;
}

int main(int argc, char **argv) {
  char kvbm[PATH_MAX];
  double seconds = 0; /* 5, or 2 for --table */
  size_t conns = 50, tokens = 1024, cap = (size_t)1 << 18;
  int workers = 8, rounds = 3;
  bool do_soak = false, do_table = false, json = false;
  const char *mix = "flood,slow,hashes";
  ssize_t m = readlink("/proc/self/exe", kvbm, sizeof kvbm - 8);
  if (m < 0) m = 0;
  kvbm[m] = 0;
  snprintf(kvbm + strlen(dirname(kvbm)), 6, "/kvbm");
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--kvbm") && i + 1 < argc) snprintf(kvbm, sizeof kvbm, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--connections") && i + 1 < argc) conns = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--soak")) do_soak = true;
    else if (!strcmp(argv[i], "--mix") && i + 1 < argc) mix = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = true;
    else if (!strcmp(argv[i], "--table")) do_table = true;
    else if (!strcmp(argv[i], "--cap") && i + 1 < argc) cap = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_router_daemon [--kvbm PATH] [--seconds 5] [--connections 50]\n"
                      "                           [--tokens 1024] [--workers 8] [--soak]\n"
                      "                           [--mix flood,slow,hashes] [--json]\n"
                      "                           [--table [--cap 262144] [--rounds 3]]\n");
      return 2;
    }
  }
  if (!seconds) seconds = do_table ? 2 : 5;
  if (do_table && (cap < 1 || cap > ((size_t)1 << 30) || rounds < 1 || rounds > 99)) {
    fprintf(stderr, "bench_router_daemon: bad --cap (1..2^30) or --rounds (1..99)\n");
    return 2;
  }
  if (!(seconds > 0) || conns < 1 || conns > 200 || tokens < 16 || workers < 1 || workers > 64) {
    fprintf(stderr, "bench_router_daemon: bad --seconds, --connections (1..200), --tokens (>= 16) "
                    "or --workers (1..64)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  static buf prompts[PROMPTS], hashes[HASH_BODIES];
  buf health = {0}, flood = {0}, slow = {0};
  run r = {.rng = 0x9e3779b97f4a7c15ull};
  make_requests(&r, tokens, prompts, hashes, &health, &flood, &slow);
  r.ep = epoll_create1(EPOLL_CLOEXEC);
  int rc;
  if (do_table) {
    rc = table(&r, kvbm, workers, conns, seconds, rounds, cap, json);
  } else {
    router rt;
    if (!router_start(&rt, kvbm, workers, do_soak, 0)) return 1;
    r.port = rt.port;
    rc = do_soak ? soak(&r, &rt, seconds, mix, json) : load(&r, &rt, conns, seconds, json);
    router_stop(&rt);
  }
  close(r.ep);
  for (int i = 0; i < PROMPTS; i++) free(prompts[i].p);
  for (int i = 0; i < HASH_BODIES; i++) free(hashes[i].p);
  free(health.p);
  free(flood.p);
  free(slow.p);
  free(r.l.us);
  return rc;
}
