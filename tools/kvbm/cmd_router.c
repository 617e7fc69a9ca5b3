/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_router.c: `kvbm router`, the KV-aware router daemon: subscribes to
 * workers' KV events (ZMQ, NATS) and answers routing queries over HTTP.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "kvbm/router.h"

const char kvbm_cmd_router_help[] = "KV-aware router daemon: KV events in, routing over HTTP/JSON";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm router [--listen 127.0.0.1:8090] [--port-file PATH]\n"
          "                   [--zmq ID=ENDPOINT[@REPLAY_ENDPOINT]]...\n"
          "                   [--nats ID=URL/SUBJECT[@REPLAY_ENDPOINT]]...\n"
          "                   [--jetstream ID=URL/STREAM/SUBJECT[@REPLAY_ENDPOINT]]...\n"
          "                   [--durable kvbm-router] [--snapshot FILE]\n"
          "                   [--snapshot-every 30]\n"
          "                   [--worker ID[:RANK]]... [--approx-ttl SECONDS]\n"
          "                   [--block-size 16] [--hash native|dynamo] [--recompute]\n"
          "                   [--groups full,sw:128,...]\n"
          "                   [--tier-weights 1,0.75,0.25] [--prefill-weight 1]\n"
          "                   [--load-weight 1] [--load blocks|requests] [--temperature 0]\n"
          "                   [--worker-timeout SECONDS] [--request-ttl 600] [--seed 1]\n"
          "                   [--io-timeout 10] [--max-connections 256] [--max-per-peer 256]\n"
          "                   [--max-active-requests 262144] [--approx-max-blocks 65536]\n"
          "                   [--queue-bytes 67108864] [--max-payload 2097152]\n"
          "                   [--max-ranks 8] [--replay-timeout-ms 2000]\n"
          "--groups: every worker's KV cache groups (a hybrid model: full, sw:W,\n"
          "chunk:C, mamba, mamba-align); without it each worker's groups are learned\n"
          "from its events' group_idx and kv_cache_spec_kind.\n"
          "--jetstream reads the worker's subject of a JetStream stream with the durable\n"
          "consumer '<durable>-<ID>' (replicas: one --durable each). --snapshot: the\n"
          "index is loaded from FILE at start (then only later events are applied:\n"
          "JetStream from the position it holds, ZMQ asks the replay socket) and\n"
          "written every --snapshot-every seconds (0: only at exit) and at exit.\n"
          "Each --zmq/--nats source is one worker (ID, an unsigned integer; the dp rank\n"
          "comes from its events). @REPLAY_ENDPOINT is the worker's ZMQ replay socket,\n"
          "asked for missing batches. --worker declares workers up front; with\n"
          "--approx-ttl (approximate mode, for engines without events) every routing\n"
          "decision counts as stored on the chosen worker for that long, at most\n"
          "--approx-max-blocks blocks per worker (the oldest decisions go first).\n"
          "Each source needs its own worker ID. --request-ttl and --max-active-requests\n"
          "bound the /route records kept for /done (the oldest go first).\n"
          "--io-timeout: a request must arrive, and its answer be read, within it.\n"
          "--max-connections must fit the descriptor limit (ulimit -n); the soft limit\n"
          "is raised toward the hard one when needed. A new connection past it, or past\n"
          "--max-per-peer from one client address, takes the slot of the connection idle\n"
          "longest (its address's own at --max-per-peer); 503 only when none is idle.\n"
          "HTTP: POST /route {\"token_ids\": [...]} or {\"block_hashes\": [...]};\n"
          "      POST /done {\"request_id\": N}; GET /health.\n"
          "--port-file: write the port (useful with --listen 127.0.0.1:0); the router\n"
          "exits at start when it cannot.\n"
          "--queue-bytes: byte budget of each source's queue (>= 2 x --max-payload);\n"
          "--max-payload: larger batches are refused; --max-ranks: dp ranks one\n"
          "source may add as workers (more are refused, counted in /health).\n");
}

static kvbm_router_daemon *g_daemon; /* for the signal handler only */

static void on_signal(int sig) {
  (void)sig;
  if (g_daemon) kvbm_router_daemon_stop(g_daemon);
}

static void log_line(void *user, const char *line) {
  (void)user;
  fprintf(stderr, "kvbm router: %s\n", line);
}

/* "ID=REST" -> id and REST; false (after a message) when malformed. */
static bool split_id(const char *opt, const char *v, uint64_t *id, const char **rest) {
  const char *eq = strchr(v, '=');
  char num[32];
  if (!eq || eq == v || (size_t)(eq - v) >= sizeof num || !eq[1]) {
    fprintf(stderr, "kvbm router: %s: '%s' is not ID=ENDPOINT\n", opt, v);
    return false;
  }
  memcpy(num, v, (size_t)(eq - v));
  num[eq - v] = 0;
  if (!cli_parse_u64("router", opt, num, 0, UINT64_MAX, id)) return false;
  *rest = eq + 1;
  return true;
}

/* Splits off "@REPLAY" (allocates the pieces). */
static void split_replay(const char *s, char **main, char **replay) {
  const char *at = strrchr(s, '@');
  if (at && strncmp(at, "@tcp://", 7) && strncmp(at, "@ipc://", 7) && strncmp(at, "@inproc://", 10))
    at = NULL; /* an @ that belongs to the endpoint (user@host) */
  *main = at ? strndup(s, (size_t)(at - s)) : strdup(s);
  *replay = at ? strdup(at + 1) : NULL;
}

typedef struct args {
  kvbm_router_daemon_config c;
  kvbm_router_source src[KVBM_ROUTER_MAX_WORKERS];
  kvbm_worker_key workers[KVBM_ROUTER_MAX_WORKERS];
  kvbm_group_spec groups[KVBM_GROUPS_MAX]; /* --groups */
  char *owned[4 * KVBM_ROUTER_MAX_WORKERS + 4];
  size_t nowned;
  const char *port_file;
} args;

static char *own(args *a, char *s) {
  if (s && a->nowned < sizeof a->owned / sizeof a->owned[0]) a->owned[a->nowned++] = s;
  return s;
}

static bool add_source(args *a, kvbm_source_kind kind, const char *opt, const char *v) {
  uint64_t id;
  const char *rest;
  if (!split_id(opt, v, &id, &rest)) return false;
  if (a->c.num_sources == KVBM_ROUTER_MAX_WORKERS) {
    fprintf(stderr, "kvbm router: at most %d sources\n", KVBM_ROUTER_MAX_WORKERS);
    return false;
  }
  char *ep, *replay;
  split_replay(rest, &ep, &replay);
  own(a, ep);
  own(a, replay);
  kvbm_router_source *s = &a->src[a->c.num_sources];
  *s = (kvbm_router_source){.kind = kind, .worker_id = id, .endpoint = ep,
                            .replay_endpoint = replay};
  if (kind == KVBM_SOURCE_NATS || kind == KVBM_SOURCE_JETSTREAM) {
    /* URL/SUBJECT: the subject follows the first '/' after "scheme://host";
     * JetStream: URL/STREAM/SUBJECT */
    const char *p = strstr(ep, "://");
    char *slash = strchr(p ? p + 3 : ep, '/');
    char *slash2 = kind == KVBM_SOURCE_JETSTREAM && slash ? strchr(slash + 1, '/') : NULL;
    if (!slash || !slash[1] || (kind == KVBM_SOURCE_JETSTREAM && (!slash2 || slash2 == slash + 1 ||
                                                               !slash2[1]))) {
      fprintf(stderr, "kvbm router: %s: '%s' is not ID=nats://HOST:PORT/%s\n", opt, v,
              kind == KVBM_SOURCE_NATS ? "SUBJECT" : "STREAM/SUBJECT");
      return false;
    }
    if (slash2) {
      s->stream = slash + 1;
      s->subject = slash2 + 1;
      *slash2 = 0;
    } else {
      s->subject = slash + 1;
    }
    *slash = 0; /* ep is ours: cut the URL there */
  }
  a->c.num_sources++;
  return true;
}

/* "G1,G2,G3" or "G1,G2,G3,G4" weights (G4 keeps its default when three
 * are given, as before G4 existed). */
static bool parse_weights(const char *v, double w[KVBM_TIER_COUNT]) {
  double x[KVBM_TIER_COUNT];
  char *end;
  int i = 0;
  for (;; i++) {
    errno = 0;
    x[i] = strtod(v, &end);
    if (errno || end == v || !(x[i] >= 0) || x[i] > 1e9) return false;
    if (*end == 0 || i == KVBM_TIER_COUNT - 1) break;
    if (*end != ',') return false;
    v = end + 1;
  }
  if (*end != 0 || i < 2) return false;
  for (int t = 0; t <= i; t++) w[t] = x[t];
  return true;
}

static int parse(int argc, char **argv, args *a) {
  kvbm_router_daemon_config *c = &a->c;
  const char *v;
  uint64_t x;
  double d;
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--recompute")) {
      c->index.recompute = true;
      continue;
    }
#define OPT(name) if ((r = cli_opt_value("router", argc, argv, &i, name, &v)) && r < 0) return 2; else if (r)
    OPT("--listen") {
      const char *colon = strrchr(v, ':');
      if (!colon || colon == v || !cli_parse_u64("router", "--listen", colon + 1, 0, 65535, &x)) {
        if (!colon || colon == v) fprintf(stderr, "kvbm router: --listen: '%s' is not HOST:PORT\n", v);
        return 2;
      }
      c->host = own(a, strndup(v, (size_t)(colon - v)));
      c->port = (uint16_t)x;
      continue;
    }
    OPT("--port-file") { a->port_file = v; continue; }
    OPT("--zmq") { if (!add_source(a, KVBM_SOURCE_ZMQ, "--zmq", v)) return 2; continue; }
    OPT("--nats") { if (!add_source(a, KVBM_SOURCE_NATS, "--nats", v)) return 2; continue; }
    OPT("--jetstream") {
      if (!add_source(a, KVBM_SOURCE_JETSTREAM, "--jetstream", v)) return 2;
      continue;
    }
    OPT("--durable") { c->durable = v; continue; }
    OPT("--snapshot") { c->snapshot_path = v; continue; }
    OPT("--worker") {
      char num[32];
      const char *colon = strchr(v, ':');
      size_t n = colon ? (size_t)(colon - v) : strlen(v);
      uint64_t rank = 0;
      if (n == 0 || n >= sizeof num) {
        fprintf(stderr, "kvbm router: --worker: '%s' is not ID[:RANK]\n", v);
        return 2;
      }
      memcpy(num, v, n);
      num[n] = 0;
      if (!cli_parse_u64("router", "--worker", num, 0, UINT64_MAX, &x)) return 2;
      if (colon && !cli_parse_u64("router", "--worker", colon + 1, 0, INT32_MAX, &rank)) return 2;
      if (c->num_workers == KVBM_ROUTER_MAX_WORKERS) {
        fprintf(stderr, "kvbm router: at most %d workers\n", KVBM_ROUTER_MAX_WORKERS);
        return 2;
      }
      a->workers[c->num_workers++] = (kvbm_worker_key){x, (uint32_t)rank};
      continue;
    }
    OPT("--block-size") {
      if (!cli_parse_u64("router", "--block-size", v, 1, KVBM_POOL_MAX_BLOCK_SIZE, &x)) return 2;
      c->index.block_size = (uint32_t)x;
      continue;
    }
    OPT("--groups") {
      kvbm_error err = {0};
      if (kvbm_groups_parse(v, a->groups, KVBM_GROUPS_MAX, &c->index.num_groups, &err)) {
        fprintf(stderr, "kvbm router: --groups: %s\n", err.msg);
        return 2;
      }
      c->index.groups = a->groups;
      continue;
    }
    OPT("--hash") {
      if (!kvbm_hash_scheme_parse(v, &c->index.scheme)) {
        fprintf(stderr, "kvbm router: --hash: '%s' is not native or dynamo\n", v);
        return 2;
      }
      continue;
    }
    OPT("--tier-weights") {
      if (!parse_weights(v, c->choice.tier_weight)) {
        fprintf(stderr, "kvbm router: --tier-weights: '%s' is not three or four numbers >= 0 "
                        "(G1,G2,G3[,G4]: device,host,disk[,remote])\n", v);
        return 2;
      }
      continue;
    }
    OPT("--load") {
      if (!strcmp(v, "blocks")) c->choice.load_kind = KVBM_LOAD_BLOCKS;
      else if (!strcmp(v, "requests")) c->choice.load_kind = KVBM_LOAD_REQUESTS;
      else {
        fprintf(stderr, "kvbm router: --load: '%s' is not blocks or requests\n", v);
        return 2;
      }
      continue;
    }
#define DBL(name, lo, hi, dst) \
    OPT(name) { if (!cli_parse_double("router", name, v, lo, hi, &d)) return 2; dst = d; continue; }
    DBL("--prefill-weight", 0, 1e9, c->choice.prefill_weight)
    DBL("--load-weight", 0, 1e9, c->choice.load_weight)
    DBL("--temperature", 0, 1e6, c->choice.temperature)
    DBL("--approx-ttl", 0, 1e9, c->approx_ttl_s)
    DBL("--worker-timeout", 0, 1e9, c->worker_timeout_s)
    DBL("--request-ttl", 0.001, 1e9, c->request_ttl_s)
    DBL("--io-timeout", 0.001, 1e6, c->io_timeout_s)
    DBL("--snapshot-every", 0, 1e6, c->snapshot_every_s)
    OPT("--max-connections") {
      if (!cli_parse_u64("router", "--max-connections", v, 1, 100000, &x)) return 2;
      c->max_connections = (size_t)x;
      continue;
    }
    OPT("--max-per-peer") {
      if (!cli_parse_u64("router", "--max-per-peer", v, 1, 100000, &x)) return 2;
      c->max_per_peer = (size_t)x;
      continue;
    }
    OPT("--max-active-requests") {
      if (!cli_parse_u64("router", "--max-active-requests", v, 1, (uint64_t)1 << 32, &x)) return 2;
      c->max_active_requests = (size_t)x;
      continue;
    }
    OPT("--approx-max-blocks") {
      if (!cli_parse_u64("router", "--approx-max-blocks", v, 1, (uint64_t)1 << 32, &x)) return 2;
      c->approx_max_blocks = (size_t)x;
      continue;
    }
    OPT("--seed") {
      if (!cli_parse_u64("router", "--seed", v, 0, UINT64_MAX, &x)) return 2;
      c->seed = x;
      continue;
    }
    OPT("--queue-bytes") {
      if (!cli_parse_u64("router", "--queue-bytes", v, 2, (uint64_t)1 << 40, &x)) return 2;
      c->queue_bytes = (size_t)x;
      continue;
    }
    OPT("--max-payload") {
      if (!cli_parse_u64("router", "--max-payload", v, 1, (uint64_t)1 << 31, &x)) return 2;
      c->max_payload = (size_t)x;
      continue;
    }
    OPT("--max-ranks") {
      if (!cli_parse_u64("router", "--max-ranks", v, 1, KVBM_ROUTER_MAX_WORKERS, &x)) return 2;
      c->max_ranks = (uint32_t)x;
      continue;
    }
    OPT("--replay-timeout-ms") {
      if (!cli_parse_u64("router", "--replay-timeout-ms", v, 1, 600000, &x)) return 2;
      c->replay_timeout_ms = (int)x;
      continue;
    }
#undef DBL
#undef OPT
    fprintf(stderr, "kvbm router: unknown argument '%s'\n", argv[i]);
    usage(stderr);
    return 2;
  }
  if (!c->num_sources && !c->num_workers) {
    fprintf(stderr, "kvbm router: give at least one --zmq, --nats, --jetstream or --worker\n");
    return 2;
  }
  if (c->approx_ttl_s > 0 && !c->num_workers) {
    fprintf(stderr, "kvbm router: --approx-ttl needs the workers (--worker)\n");
    return 2;
  }
  return -1;
}

/* Raises the soft descriptor limit toward the hard one when max_connections
 * needs more (the daemon checks the limit and refuses what does not fit). */
static void raise_fd_limit(const kvbm_router_daemon_config *c) {
  struct rlimit rl;
  rlim_t want = (rlim_t)c->max_connections + 64 + 4 * (rlim_t)c->num_sources;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return;
  rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
  setrlimit(RLIMIT_NOFILE, &rl);
}

/* Writes the port to `path`; false (after a message) when it cannot. */
static bool write_port_file(const char *path, unsigned port) {
  FILE *f = fopen(path, "w");
  bool ok = f && fprintf(f, "%u\n", port) > 0;
  if (f && fclose(f)) ok = false;
  if (!ok) fprintf(stderr, "kvbm router: --port-file %s: %s\n", path, strerror(errno));
  return ok;
}

int kvbm_cmd_router(int argc, char **argv) {
  static args a;
  memset(&a, 0, sizeof a);
  a.c = kvbm_router_daemon_config_default();
  a.c.sources = a.src;
  a.c.workers = a.workers;
  a.c.port = 8090;
  a.c.log = log_line;
  int rc = parse(argc, argv, &a);
  if (rc < 0) {
    kvbm_error err = {0};
    kvbm_router_daemon *d;
    raise_fd_limit(&a.c);
    rc = kvbm_router_daemon_create(&a.c, &d, &err);
    if (rc) {
      fprintf(stderr, "kvbm router: %s\n", err.msg);
      rc = rc == KVBM_EINVAL ? 2 : 1;
    } else {
      g_daemon = d;
      struct sigaction sa = {0};
      sa.sa_handler = on_signal;
      sigaction(SIGINT, &sa, NULL);
      sigaction(SIGTERM, &sa, NULL);
      signal(SIGPIPE, SIG_IGN);
      if (a.port_file && !write_port_file(a.port_file, kvbm_router_daemon_port(d))) {
        rc = 1; /* whoever waits for the file would wait forever */
      } else {
        fprintf(stderr, "kvbm router: listening on %s:%u, %zu source(s), %zu worker(s) declared%s\n",
                a.c.host, kvbm_router_daemon_port(d), a.c.num_sources, a.c.num_workers,
                a.c.approx_ttl_s > 0 ? ", approximate mode" : "");
        rc = kvbm_router_daemon_run(d, &err) ? 1 : 0;
        if (rc) fprintf(stderr, "kvbm router: %s\n", err.msg);
      }
      g_daemon = NULL;
      kvbm_router_daemon_destroy(d);
    }
  }
  for (size_t i = 0; i < a.nowned; i++) free(a.owned[i]);
  return rc;
}
