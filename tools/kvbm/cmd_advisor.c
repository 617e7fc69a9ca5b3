/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_advisor.c: `kvbm advisor`, the storage advisor daemon
 * (advisor/daemon.h, docs/areas/advisor.md).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "advisor/daemon.h"
#include "cli.h"

const char kvbm_cmd_advisor_help[] =
    "storage advisor daemon: storage and KV events in, promote/demote/compaction hints out";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm advisor [--listen 127.0.0.1:8091] [--port-file FILE]\n"
          "         [--storage-zmq EP[@REPLAY]]... [--storage-nats URL/SUBJECT[@REPLAY]]...\n"
          "         [--kv-zmq NAME=EP[@REPLAY]]... [--kv-nats NAME=URL/SUBJECT[@REPLAY]]...\n"
          "         [--volume NAME=G2|G3|G4]... [--hints-nats URL/SUBJECT]\n"
          "         [--hint-period-ms 10000] [--max-hints 4096] [--max-blocks 1048576]\n"
          "         [--max-prefixes 65536] [--demote-min-uses 2] [--demote-fraction 0.7]\n"
          "         [--promote-min-score 2] [--promote-window-ms 60000] [--no-drop]\n"
          "         [--compact-ratio 0.5] [--compact-min-blocks 1024] [--rehint-ms 30000]\n"
          "         [--max-connections 64 (<= 4096)] [--io-timeout-ms 10000] [--queue-bytes 16777216]\n"
          "         [--max-payload 2097152]\n"
          "Subscribes to storage events (StoreEvent/RemoveEvent of the manager's volumes)\n"
          "and KV events (vLLM's wire, both forms) over ZMQ and NATS (Kvbm-Seq), gaps\n"
          "replayed by the engine's ZMQ replay ROUTER (@REPLAY) if given, and keeps an index of the blocks each volume holds, and derives\n"
          "hints every --hint-period-ms: published on --hints-nats (msgpack, Kvbm-Seq) and\n"
          "served over HTTP: GET /hints, /volumes, /prefix?hash=N[&namespace=N], /health,\n"
          "and the counters in Prometheus' format at GET /metrics (same port).\n"
          "--volume declares a volume's tier (the events' \"tier\" metadata also does).\n");
}

/* The strings the options make (freed at exit, whatever the path). */
typedef struct strpool {
  char *s[5 * KVBM__ADVISOR_MAX_SOURCES + KVBM_ADVISOR_MAX_VOLUMES + 8]; /* a source: up to 5 */
  size_t n;
} strpool;

static char *keep(strpool *p, char *s) {
  if (s && p->n < sizeof p->s / sizeof p->s[0]) return p->s[p->n++] = s;
  free(s);
  return NULL;
}

static void pool_free(strpool *p) {
  while (p->n) free(p->s[--p->n]);
}

/* URL/SUBJECT: the subject follows the last '/' after the scheme's "//". */
static bool split_nats(strpool *p, const char *v, char **url, char **subject) {
  const char *s = strstr(v, "://");
  const char *slash = strrchr(v, '/');
  if (!s || !slash || slash <= s + 2 || !slash[1]) return false;
  *url = keep(p, strndup(v, (size_t)(slash - v)));
  *subject = keep(p, strdup(slash + 1));
  return *url && *subject;
}

/* "...@tcp://..." (or ipc://, inproc://): the replay ROUTER after the
 * last '@' that starts one (an '@' of user@host stays in the URL). */
static void split_replay(strpool *p, const char *v, const char **main, const char **replay) {
  const char *at = strrchr(v, '@');
  if (at && strncmp(at, "@tcp://", 7) && strncmp(at, "@ipc://", 7) && strncmp(at, "@inproc://", 10))
    at = NULL;
  *main = keep(p, at ? strndup(v, (size_t)(at - v)) : strdup(v));
  *replay = at ? keep(p, strdup(at + 1)) : NULL;
}

/* A tcp:// endpoint's port must be 1..65535 (ZMQ itself takes 99999). */
static bool tcp_port_ok(const char *ep) {
  if (strncmp(ep, "tcp://", 6)) return true;
  const char *c = strrchr(ep, ':');
  if (!c || c < ep + 6) return false;
  if (!strcmp(c + 1, "*")) return true;
  char *end;
  long p = strtol(c + 1, &end, 10);
  return c[1] && !*end && p >= 1 && p <= 65535;
}

static volatile sig_atomic_t g_stop; /* the signal handler's flag: a signal handler has no argument */

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static int add_source(strpool *pool, kvbm__advisor_daemon_config *c, kvbm__asrc_kind kind,
                      const char *opt, const char *v) {
  if (c->nsources == KVBM__ADVISOR_MAX_SOURCES) {
    fprintf(stderr, "kvbm advisor: at most %d sources\n", KVBM__ADVISOR_MAX_SOURCES);
    return 2;
  }
  kvbm__asrc_config *s = &c->sources[c->nsources];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  const char *rest = v;
  if (kind == KVBM__ASRC_KV_ZMQ || kind == KVBM__ASRC_KV_NATS) {
    const char *eq = strchr(v, '=');
    if (!eq || eq == v) {
      fprintf(stderr, "kvbm advisor: %s: '%s' is not NAME=...\n", opt, v);
      return 2;
    }
    s->name = keep(pool, strndup(v, (size_t)(eq - v)));
    rest = eq + 1;
  } else {
    s->name = keep(pool, strdup(v));
  }
  if (kind == KVBM__ASRC_STORAGE_NATS || kind == KVBM__ASRC_KV_NATS) {
    const char *main;
    char *url, *subject;
    split_replay(pool, rest, &main, &s->replay);
    if (!main || !split_nats(pool, main, &url, &subject) || strncmp(url, "nats://", 7) ||
        !tcp_port_ok(url + 1)) {
      fprintf(stderr, "kvbm advisor: %s: '%s' is not nats://HOST:PORT/SUBJECT[@REPLAY]\n", opt, rest);
      return 2;
    }
    if (s->replay && !tcp_port_ok(s->replay)) {
      fprintf(stderr, "kvbm advisor: %s: '%s': a tcp:// port is not in 1..65535\n", opt, rest);
      return 2;
    }
    s->endpoint = url;
    s->subject = subject;
  } else {
    const char *at = strchr(rest, '@');
    s->endpoint = keep(pool, at ? strndup(rest, (size_t)(at - rest)) : strdup(rest));
    s->replay = at ? keep(pool, strdup(at + 1)) : NULL;
    if (!s->endpoint || !*s->endpoint || !tcp_port_ok(s->endpoint) || (s->replay && !tcp_port_ok(s->replay))) {
      fprintf(stderr, "kvbm advisor: %s: '%s': a tcp:// port is not in 1..65535\n", opt, rest);
      return 2;
    }
  }
  c->nsources++;
  return 0;
}

static int run(int argc, char **argv, strpool *pool) {
  kvbm__advisor_daemon_config c = kvbm__advisor_daemon_config_default();
  const char *v;
  uint64_t x;
  double dv;
  int r;
  for (int i = 1; i < argc; i++) {
#define U64(name, lo, hi, dst)                                             \
  if ((r = cli_opt_value("advisor", argc, argv, &i, name, &v))) {          \
    if (r < 0 || !cli_parse_u64("advisor", name, v, lo, hi, &x)) return 2; \
    dst = x;                                                               \
    continue;                                                              \
  }
#define DBL(name, lo, hi, dst)                                                \
  if ((r = cli_opt_value("advisor", argc, argv, &i, name, &v))) {             \
    if (r < 0 || !cli_parse_double("advisor", name, v, lo, hi, &dv)) return 2; \
    dst = dv;                                                                 \
    continue;                                                                 \
  }
#define SRC(name, kind)                                               \
  if ((r = cli_opt_value("advisor", argc, argv, &i, name, &v))) {     \
    if (r < 0 || add_source(pool, &c, kind, name, v)) return 2;       \
    continue;                                                         \
  }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--no-drop")) {
      c.advisor.drop_cold = false;
      continue;
    }
    if ((r = cli_opt_value("advisor", argc, argv, &i, "--listen", &v))) {
      if (r < 0) return 2;
      c.listen = v;
      continue;
    }
    if ((r = cli_opt_value("advisor", argc, argv, &i, "--port-file", &v))) {
      if (r < 0) return 2;
      c.port_file = v;
      continue;
    }
    if ((r = cli_opt_value("advisor", argc, argv, &i, "--volume", &v))) {
      const char *eq = r < 0 ? NULL : strrchr(v, '=');
      kvbm_tier t;
      if (!eq || eq == v || !kvbm_tier_parse(eq + 1, &t) || t == KVBM_TIER_G1) {
        fprintf(stderr, "kvbm advisor: --volume: '%s' is not NAME=G2|G3|G4\n", r < 0 ? "" : v);
        return 2;
      }
      if (c.nvolumes == KVBM_ADVISOR_MAX_VOLUMES) {
        fprintf(stderr, "kvbm advisor: at most %d volumes\n", KVBM_ADVISOR_MAX_VOLUMES);
        return 2;
      }
      c.volume_names[c.nvolumes] = keep(pool, strndup(v, (size_t)(eq - v)));
      c.volume_tiers[c.nvolumes++] = t;
      continue;
    }
    if ((r = cli_opt_value("advisor", argc, argv, &i, "--hints-nats", &v))) {
      char *url, *subject;
      if (r < 0 || !split_nats(pool, v, &url, &subject) || strncmp(url, "nats://", 7)) {
        fprintf(stderr, "kvbm advisor: --hints-nats: '%s' is not nats://HOST:PORT/SUBJECT\n",
                r < 0 ? "" : v);
        return 2;
      }
      c.hints_url = url;
      c.hints_subject = subject;
      continue;
    }
    SRC("--storage-zmq", KVBM__ASRC_STORAGE_ZMQ)
    SRC("--storage-nats", KVBM__ASRC_STORAGE_NATS)
    SRC("--kv-zmq", KVBM__ASRC_KV_ZMQ)
    SRC("--kv-nats", KVBM__ASRC_KV_NATS)
    U64("--hint-period-ms", 1, 86400000, c.hint_period_ms)
    U64("--max-hints", 1, 1u << 20, c.max_hints)
    U64("--max-blocks", 16, 1u << 28, c.advisor.max_blocks)
    U64("--max-prefixes", 16, 1u << 24, c.advisor.max_prefixes)
    U64("--demote-min-uses", 0, 65535, c.advisor.demote_min_uses)
    U64("--promote-window-ms", 1, 1ull << 40, c.advisor.promote_window_ms)
    U64("--compact-min-blocks", 0, UINT64_MAX, c.advisor.compact_min_blocks)
    U64("--rehint-ms", 0, 1ull << 40, c.advisor.rehint_ms)
    U64("--max-connections", 1, 4096, c.max_connections)
    U64("--io-timeout-ms", 1, 3600000, c.io_timeout_ms)
    U64("--queue-bytes", 4096, 1ull << 34, c.queue_bytes)
    U64("--max-payload", 1024, 1u << 30, c.max_payload)
    DBL("--demote-fraction", 0.001, 0.999, c.advisor.demote_fraction)
    DBL("--promote-min-score", 1e-6, 1e12, c.advisor.promote_min_score)
    DBL("--compact-ratio", 0, 0.999, c.advisor.compact_live_ratio)
    fprintf(stderr, "kvbm advisor: unknown option '%s'\n", argv[i]);
    usage(stderr);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  kvbm_error err = {0};
  int rc = kvbm__advisor_daemon_run(&c, &g_stop, &err);
  if (rc) {
    fprintf(stderr, "kvbm advisor: %s\n", err.msg);
    return rc == KVBM_EINVAL ? 2 : 1;
  }
  return 0;
}

int kvbm_cmd_advisor(int argc, char **argv) {
  strpool pool = {.n = 0};
  int rc = run(argc, argv, &pool);
  pool_free(&pool);
  return rc;
}
