/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_worker.c: `kvbm worker`, the engine simulator (src/worker/worker.h;
 * the contract is docs/areas/cluster.md, "## kvbm worker").
 *
 * This file is the command line only: flags into a kvsim_worker_config,
 * SIGINT/SIGTERM to stop, a line on stderr when listening (and the port
 * in --port-file, for scripts that ask for port 0). Secrets are never
 * flags: G4's cluster key comes from --g4-key-file.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "worker/worker.h"

const char kvbm_cmd_worker_help[] = "an engine simulator on a real manager (HTTP, KV events)";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm worker --id N --listen HOST:PORT\n"
          "                   [--g1 BLOCKS] [--g2 BLOCKS] [--g3 DIR[:BLOCKS]] [--g4 URL]\n"
          "                   [--g4-key-file FILE] [--g2-policy P] [--g3-policy P]\n"
          "                   [--events tcp://HOST:PORT | nats://HOST:PORT/STREAM/SUBJECT]\n"
          "                   [--events-coalesce] [--storage-events (same forms)] [--block-size N]\n"
          "                   [--block-bytes N] [--prefill-tps N] [--decode-tps N] [--batch N]\n"
          "                   [--time-scale X] [--memory-budget-mb M] [--max-queue N]\n"
          "                   [--max-tokens N] [--request-timeout-s S] [--port-file PATH]\n"
          "Serves POST /generate, GET /blocks, /health, /metrics, POST /admin/fault\n"
          "(docs/areas/cluster.md). Defaults: --g1 4096, --g3 DIR:65536 (persistent: warm\n"
          "restart), --block-size 16, --block-bytes 1024, --prefill-tps 10000,\n"
          "--decode-tps 50, --batch 8, --time-scale 1, --memory-budget-mb 1024,\n"
          "--max-queue 1024, --max-tokens 131072, --request-timeout-s 600; policies\n"
          "never|all|frequency (G2 all, G3 frequency). --events tcp://HOST:PORT binds a\n"
          "ZMQ PUB there and its replay ROUTER on PORT+1; --events-coalesce sends a\n"
          "batch's chained one-block stores (and one-block removes) as one multi-block\n"
          "event each (docs/areas/events.md, Coalescing).\n");
}

static kvsim_worker *g_worker; /* for the signal handler only */

static void on_signal(int sig) {
  (void)sig;
  if (g_worker) kvsim_worker_stop(g_worker);
}

/* "HOST:PORT" into the config. */
static bool parse_listen(const char *v, kvsim_worker_config *c, char *host, size_t cap) {
  const char *colon = strrchr(v, ':');
  uint64_t port;
  if (!colon || colon == v || (size_t)(colon - v) >= cap) {
    fprintf(stderr, "kvbm worker: --listen '%s' is not HOST:PORT\n", v);
    return false;
  }
  if (!cli_parse_u64("worker", "--listen", colon + 1, 0, 65535, &port)) return false;
  memcpy(host, v, (size_t)(colon - v));
  host[colon - v] = 0;
  c->host = host;
  c->port = (uint16_t)port;
  return true;
}

/* "DIR" or "DIR:BLOCKS". */
static bool parse_g3(const char *v, kvsim_worker_config *c, char *dir, size_t cap) {
  const char *colon = strrchr(v, ':');
  size_t n = colon ? (size_t)(colon - v) : strlen(v);
  if (!n || n >= cap) {
    fprintf(stderr, "kvbm worker: --g3 '%s' is not DIR[:BLOCKS]\n", v);
    return false;
  }
  memcpy(dir, v, n);
  dir[n] = 0;
  c->g3_dir = dir;
  return !colon || cli_parse_u64("worker", "--g3", colon + 1, 1, 1u << 30, &c->g3_blocks);
}

static bool parse_policy(const char *opt, const char *v, kvbm_offload_policy *p) {
  if (kvbm_offload_policy_parse(v, p)) return true;
  fprintf(stderr, "kvbm worker: %s '%s' (never, all or frequency)\n", opt, v);
  return false;
}

int kvbm_cmd_worker(int argc, char **argv) {
  kvsim_worker_config c = kvsim_worker_config_default();
  char host[64], g3dir[4096];
  const char *port_file = NULL;
  bool have_id = false, have_listen = false;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    uint64_t u;
    double d;
    int r;
#define OPT(name) ((r = cli_opt_value("worker", argc, argv, &i, name, &v)) != 0)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (OPT("--id")) {
      if (r < 0 || !cli_parse_u64("worker", "--id", v, 0, UINT32_MAX, &u)) return 2;
      c.id = (uint32_t)u;
      have_id = true;
    } else if (OPT("--listen")) {
      if (r < 0 || !parse_listen(v, &c, host, sizeof host)) return 2;
      have_listen = true;
    } else if (OPT("--g1")) {
      if (r < 0 || !cli_parse_u64("worker", "--g1", v, 1, 1u << 28, &u)) return 2;
      c.g1_blocks = (uint32_t)u;
    } else if (OPT("--g2")) {
      if (r < 0 || !cli_parse_u64("worker", "--g2", v, 0, 1u << 28, &u)) return 2;
      c.g2_blocks = (uint32_t)u;
    } else if (OPT("--g3")) {
      if (r < 0 || !parse_g3(v, &c, g3dir, sizeof g3dir)) return 2;
    } else if (OPT("--g4")) {
      if (r < 0) return 2;
      c.g4_url = v;
    } else if (OPT("--g4-key-file")) {
      if (r < 0) return 2;
      c.g4_key_file = v;
    } else if (OPT("--g2-policy")) {
      if (r < 0 || !parse_policy("--g2-policy", v, &c.g2_policy)) return 2;
    } else if (OPT("--g3-policy")) {
      if (r < 0 || !parse_policy("--g3-policy", v, &c.g3_policy)) return 2;
    } else if (OPT("--events")) {
      if (r < 0) return 2;
      c.events = v;
    } else if (!strcmp(argv[i], "--events-coalesce")) {
      c.events_coalesce = true;
    } else if (OPT("--storage-events")) {
      if (r < 0) return 2;
      c.storage_events = v;
    } else if (OPT("--block-size")) {
      if (r < 0 || !cli_parse_u64("worker", "--block-size", v, 1, 4096, &u)) return 2;
      c.block_size = (uint32_t)u;
    } else if (OPT("--block-bytes")) {
      if (r < 0 || !cli_parse_u64("worker", "--block-bytes", v, 16, 64u << 20, &c.block_bytes))
        return 2;
    } else if (OPT("--prefill-tps")) {
      if (r < 0 || !cli_parse_double("worker", "--prefill-tps", v, 1e-3, 1e12, &c.prefill_tps))
        return 2;
    } else if (OPT("--decode-tps")) {
      if (r < 0 || !cli_parse_double("worker", "--decode-tps", v, 1e-3, 1e12, &c.decode_tps))
        return 2;
    } else if (OPT("--batch")) {
      if (r < 0 || !cli_parse_u64("worker", "--batch", v, 1, 1024, &u)) return 2;
      c.batch = (uint32_t)u;
    } else if (OPT("--time-scale")) {
      if (r < 0 || !cli_parse_double("worker", "--time-scale", v, 1e-6, 1e9, &d)) return 2;
      c.time_scale = d;
    } else if (OPT("--memory-budget-mb")) {
      if (r < 0 || !cli_parse_u64("worker", "--memory-budget-mb", v, 1, 1u << 24,
                                  &c.memory_budget_mb))
        return 2;
    } else if (OPT("--max-queue")) {
      if (r < 0 || !cli_parse_u64("worker", "--max-queue", v, 1, 1u << 20, &u)) return 2;
      c.max_queue = (uint32_t)u;
    } else if (OPT("--max-tokens")) {
      if (r < 0 || !cli_parse_u64("worker", "--max-tokens", v, 1, 1u << 24, &u)) return 2;
      c.max_tokens = (uint32_t)u;
    } else if (OPT("--request-timeout-s")) {
      if (r < 0 ||
          !cli_parse_double("worker", "--request-timeout-s", v, 0.001, 86400, &c.request_timeout_s))
        return 2;
    } else if (OPT("--port-file")) {
      if (r < 0) return 2;
      port_file = v;
    } else {
      fprintf(stderr, "kvbm worker: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
#undef OPT
  }
  if (!have_id || !have_listen) {
    fprintf(stderr, "kvbm worker: --id and --listen are required\n");
    usage(stderr);
    return 2;
  }
  if (c.events_coalesce && !c.events) {
    fprintf(stderr, "kvbm worker: --events-coalesce goes with --events\n");
    return 2;
  }
  kvbm_error err = {0};
  kvsim_worker *w;
  int rc = kvsim_worker_create(&c, &w, &err);
  if (rc) {
    fprintf(stderr, "kvbm worker: %s\n", err.msg);
    return rc == KVBM_EINVAL || rc == KVBM_ENOSPC ? 2 : 1;
  }
  g_worker = w;
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  uint16_t port = kvsim_worker_port(w);
  if (port_file) {
    char tmp[4096 + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) || rename(tmp, port_file)) {
      fprintf(stderr, "kvbm worker: cannot write --port-file %s\n", port_file);
      kvsim_worker_destroy(w);
      return 1;
    }
  }
  fprintf(stderr, "kvbm worker %u: listening on %s:%u\n", c.id, c.host, port);
  rc = kvsim_worker_run(w, &err);
  g_worker = NULL;
  kvsim_worker_destroy(w);
  if (rc) {
    fprintf(stderr, "kvbm worker: %s\n", err.msg);
    return 1;
  }
  return 0;
}
