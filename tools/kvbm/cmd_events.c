/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_events.c: `kvbm events tail` and `kvbm events relay`.
 *
 *   kvbm events tail ENDPOINT [--replay EP] [--topic T] [--from SEQ]
 *                    [--count N] [--idle-ms MS] [--bind] [--queue-bytes B]
 *   kvbm events tail nats://HOST:PORT --subject S [--replay EP] [--from SEQ]
 *                    [--count N] [--idle-ms MS] [--queue-bytes B]
 *     prints every event of an engine's ZMQ stream (vLLM, SGLang, kvbm), or
 *     of a kvbm NATS subject, as one JSON line: {"seq", "ts", "dp_rank",
 *     "type", "block_hashes", ...}; malformed messages are reported on
 *     stderr and skipped. Both read through the events module's subscriber
 *     (kvbm_subscriber: the same order, replay and budget on either).
 *   kvbm events relay ENDPOINT [--replay EP] [--topic T] [--from SEQ]
 *                    (--nats URL --subject S | --zmq EP [--zmq-replay EP]
 *                    [--zmq-topic T] [--zmq-replay-legacy])
 *                    [--form map|positional] [--signed-hashes]
 *                    [--dp-rank R] [--batch N] [--delay-us US] [--count N]
 *                    [--idle-ms MS] [--coalesce]
 *                    [--metrics-port N [--metrics-host H] [--metrics-port-file P]]
 *     republishes the stream on NATS or on our own ZMQ endpoint (printing
 *     "publishing on EP [replay EP]" first, useful with a '*' port),
 *     keeping the engine's dp_rank (--dp-rank is for batches without one)
 *     and every field of its events.
 *
 * relay --coalesce turns on the publisher's coalescing
 * (kvbm_publisher_config.coalesce, docs/areas/events.md "Coalescing"): a
 * source that sends one block an event (a kvbm pool link, an engine that
 * stores block by block) is republished as vLLM sends a step, chained
 * one-block BlockStored events as one multi-block BlockStored and one-block
 * BlockRemoved events as one BlockRemoved, within a publisher batch. Off by
 * default, because consumers then see fewer events than the source sent
 * (the same blocks, in the same order per hash); it buys nothing for a
 * source that already sends whole steps (vLLM), where it only costs the
 * check. Every relay sink takes bytes, so the publisher never refuses it
 * here (it does beside a callback sink).
 *
 * Both stop after --count batches, after --idle-ms without a message, or on
 * SIGINT/SIGTERM, and print the subscriber's counters on stderr; relay also
 * prints its publisher's (sends a sink failed, e.g. NATS down, are batches
 * lost on that sink). --queue-bytes is the subscriber's byte budget
 * (kvbm_subscriber_config.max_queue_bytes).
 *
 * relay --metrics-port N (or DYN_KVBM_METRICS=true) serves its counters on
 * GET /metrics while it runs: the publisher's (its collector), and the
 * relay's own and its subscriber's, copied after every poll under a mutex
 * (both are driven by this thread alone and have no lock of their own).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "cli.h"
#include "common/vec.h"
#include "kvbm/events.h"
#include "kvbm/metrics.h"
#include "metrics_cli.h"

const char kvbm_cmd_events_help[] =
    "KV events: `events tail ENDPOINT` prints them as JSON lines, `events relay` "
    "republishes an engine's stream to NATS or ZMQ";

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

static void usage_to(FILE *f) {
  fprintf(f,
          "usage: kvbm events tail ENDPOINT [--replay EP] [--topic T] [--from SEQ]\n"
          "                        [--count N] [--idle-ms MS] [--bind] [--queue-bytes B]\n"
          "       kvbm events tail nats://HOST:PORT --subject S [--replay EP] [--from SEQ]\n"
          "                        [--count N] [--idle-ms MS] [--queue-bytes B]\n"
          "       kvbm events relay ENDPOINT [--replay EP] [--topic T] [--from SEQ]\n"
          "                        (--nats URL --subject S | --jetstream URL --stream N\n"
          "                        --subject S [--stream-subjects 'kv.>'] | --zmq EP [--zmq-replay EP]\n"
          "                        [--zmq-topic T] [--zmq-replay-legacy])\n"
          "                        [--form map|positional] [--signed-hashes]\n"
          "                        [--dp-rank R] [--batch N] [--delay-us US] [--count N]\n"
          "                        [--idle-ms MS] [--queue-bytes B] [--coalesce]\n"
          "                        [--metrics-port N [--metrics-host H] [--metrics-port-file PATH]]\n"
          "  relay --coalesce: republish chained one-block BlockStored events (and\n"
          "  one-block BlockRemoved events) as one multi-block event per run within\n"
          "  a batch, as vLLM sends a step; for sources that send a block an event\n"
          "  (a kvbm pool link). Off by default: consumers then see fewer, larger\n"
          "  events than the source sent (the same blocks; docs/areas/events.md).\n");
}

static void usage(void) { usage_to(stderr); }

typedef struct args {
  kvbm_subscriber_config sub;
  uint64_t count, idle_ms;
  const char *nats, *jetstream, *stream, *stream_subjects, *subject, *zmq, *zmq_replay, *zmq_topic;
  bool zmq_replay_legacy;
  kvbm_publisher_config pub;
  metrics_cli metrics; /* relay: the endpoint */
} args;

/* Parses the options shared by both subcommands and relay's own. */
static int parse(const char *cmd, int argc, char **argv, bool relay, args *a) {
  a->sub = kvbm_subscriber_config_default(NULL);
  a->pub = kvbm_publisher_config_default();
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    uint64_t u;
#define OPT(name) ((r = cli_opt_value(cmd, argc, argv, &i, name, &v)) != 0)
    if (OPT("--replay")) { if (r < 0) return 2; a->sub.replay_endpoint = v; }
    else if (OPT("--topic")) { if (r < 0) return 2; a->sub.topic = v; }
    else if (OPT("--from")) {
      if (r < 0 || !cli_parse_u64(cmd, "--from", v, 0, INT64_MAX, &u)) return 2;
      a->sub.start_seq = (int64_t)u;
    } else if (OPT("--count")) {
      if (r < 0 || !cli_parse_u64(cmd, "--count", v, 1, UINT64_MAX, &a->count)) return 2;
    } else if (OPT("--idle-ms")) {
      if (r < 0 || !cli_parse_u64(cmd, "--idle-ms", v, 1, INT32_MAX, &a->idle_ms)) return 2;
    } else if (OPT("--queue-bytes")) {
      if (r < 0 || !cli_parse_u64(cmd, "--queue-bytes", v, 2, (uint64_t)1 << 40, &u)) return 2;
      a->sub.max_queue_bytes = (size_t)u;
      if (a->sub.max_payload > u / 2) a->sub.max_payload = (size_t)(u / 2);
    } else if (!strcmp(argv[i], "--bind")) {
      a->sub.bind = true;
    } else if (relay && !strcmp(argv[i], "--signed-hashes")) {
      a->pub.signed_hashes = true;
    } else if (relay && !strcmp(argv[i], "--coalesce")) {
      a->pub.coalesce = true;
    } else if (relay && (r = metrics_cli_take(cmd, argc, argv, &i, &a->metrics))) {
      if (r < 0) return 2;
    } else if (relay && OPT("--nats")) { if (r < 0) return 2; a->nats = v; }
    else if (relay && OPT("--jetstream")) { if (r < 0) return 2; a->jetstream = v; }
    else if (relay && OPT("--stream")) { if (r < 0) return 2; a->stream = v; }
    else if (relay && OPT("--stream-subjects")) { if (r < 0) return 2; a->stream_subjects = v; }
    else if (OPT("--subject")) { if (r < 0) return 2; a->subject = v; }
    else if (relay && OPT("--zmq")) { if (r < 0) return 2; a->zmq = v; }
    else if (relay && OPT("--zmq-replay")) { if (r < 0) return 2; a->zmq_replay = v; }
    else if (relay && OPT("--zmq-topic")) { if (r < 0) return 2; a->zmq_topic = v; }
    else if (relay && !strcmp(argv[i], "--zmq-replay-legacy")) a->zmq_replay_legacy = true;
    else if (relay && OPT("--form")) {
      if (r < 0) return 2;
      if (!strcmp(v, "positional")) a->pub.form = KVBM_FORM_POSITIONAL;
      else if (!strcmp(v, "map")) a->pub.form = KVBM_FORM_MAP;
      else {
        fprintf(stderr, "kvbm %s: --form: '%s' is not positional or map\n", cmd, v);
        return 2;
      }
    } else if (relay && OPT("--dp-rank")) {
      if (r < 0 || !cli_parse_u64(cmd, "--dp-rank", v, 0, INT32_MAX, &u)) return 2;
      a->pub.dp_rank = (int32_t)u;
    } else if (relay && OPT("--batch")) {
      if (r < 0 || !cli_parse_u64(cmd, "--batch", v, 1, 1u << 20, &u)) return 2;
      a->pub.max_batch_events = (size_t)u;
      if (a->pub.queue_events < u) a->pub.queue_events = (size_t)u;
    } else if (relay && OPT("--delay-us")) {
      if (r < 0 || !cli_parse_u64(cmd, "--delay-us", v, 0, 60000000, &u)) return 2;
      a->pub.max_batch_delay_us = (uint32_t)u;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "kvbm %s: unknown option '%s'\n", cmd, argv[i]);
      return 2;
    } else if (!a->sub.endpoint) {
      a->sub.endpoint = argv[i];
    } else {
      fprintf(stderr, "kvbm %s: unexpected argument '%s'\n", cmd, argv[i]);
      return 2;
    }
#undef OPT
  }
  if (!a->sub.endpoint) {
    fprintf(stderr, "kvbm %s: no ENDPOINT\n", cmd);
    return 2;
  }
  if (!relay && !strncmp(a->sub.endpoint, "nats://", 7) && !a->subject) {
    fprintf(stderr, "kvbm %s: a nats:// endpoint needs --subject\n", cmd);
    return 2;
  }
  if (!relay) a->sub.subject = a->subject; /* tail: the subject read */
  if (relay && !!a->nats + !!a->jetstream + !!a->zmq != 1) {
    fprintf(stderr, "kvbm %s: give one of --nats URL, --jetstream URL or --zmq EP\n", cmd);
    return 2;
  }
  if (relay && (a->nats || a->jetstream) && !a->subject) {
    fprintf(stderr, "kvbm %s: --nats and --jetstream need --subject\n", cmd);
    return 2;
  }
  if (relay && !!a->jetstream != !!a->stream) {
    fprintf(stderr, "kvbm %s: --stream goes with --jetstream (and it needs one)\n", cmd);
    return 2;
  }
  return 0;
}

static void print_stats(const char *cmd, const kvbm_subscriber *s) {
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(s, &st);
  fprintf(stderr,
          "kvbm %s: %" PRIu64 " batches, %" PRIu64 " events, %" PRIu64 " gaps, %" PRIu64
          " replayed, %" PRIu64 " lost, %" PRIu64 " duplicates, %" PRIu64 " resets, %" PRIu64
          " jumps, %" PRIu64 " overflow, %" PRIu64 " malformed\n",
          cmd, st.delivered, st.events, st.gaps, st.replayed, st.lost, st.duplicates, st.resets,
          st.jumps, st.overflow, st.malformed);
}

/* The relay's own losses: batches a sink could not send (NATS down and its
 * reconnect buffer full, ...) and events its queue dropped. */
static void print_publisher(const char *cmd, kvbm_publisher *p) {
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  fprintf(stderr,
          "kvbm %s: published %" PRIu64 " batches (%" PRIu64 " events), %" PRIu64
          " failed sends (batches lost on that sink), %" PRIu64 " events dropped\n",
          cmd, ps.batches, ps.sent_events, ps.sink_errors, ps.dropped);
}

static void install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* One wait of the loop: up to 200 ms, or what is left of --idle-ms. */
static int slice_ms(const args *a, double idle_since) {
  if (!a->idle_ms) return 200;
  double left = (double)a->idle_ms - (cli_now() - idle_since) * 1000.0;
  if (left <= 0) return 0;
  return left < 200 ? (int)left + 1 : 200;
}

static bool idle_over(const args *a, double idle_since) {
  return a->idle_ms && (cli_now() - idle_since) * 1000.0 >= (double)a->idle_ms;
}

static int tail(int argc, char **argv) {
  const char *cmd = "events tail";
  args a = {0};
  int rc = parse(cmd, argc, argv, false, &a);
  if (rc) {
    usage();
    return rc;
  }
  kvbm_subscriber *sub;
  kvbm_error err;
  if ((rc = kvbm_subscriber_create(&a.sub, &sub, &err))) {
    fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
    /* a ZMQ endpoint that zmq refuses is bad input; a NATS server that
     * does not answer is a failure at run time */
    return rc == KVBM_EIO && !strncmp(a.sub.endpoint, "nats://", 7) ? 1 : 2;
  }
  install_signals();
  size_t cap = 1 << 16;
  char *buf = malloc(cap);
  uint64_t n = 0;
  int status = 0;
  double idle_since = cli_now();
  while (!g_stop && (!a.count || n < a.count) && buf) {
    kvbm_event_batch b;
    rc = kvbm_subscriber_recv(sub, slice_ms(&a, idle_since), &b, &err);
    if (rc == KVBM_ETIMEDOUT) {
      if (idle_over(&a, idle_since)) break;
      continue;
    }
    idle_since = cli_now();
    if (rc == KVBM_EIO) {
      fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
      status = 1;
      break;
    }
    if (rc) {
      fprintf(stderr, "kvbm %s: skipped: %s\n", cmd, err.msg);
      continue;
    }
    n++;
    if (b.reset)
      fprintf(stderr, "kvbm %s: a new stream begins at %" PRIu64 " (the engine restarted)\n",
              cmd, b.seq);
    if (b.skipped)
      fprintf(stderr, "kvbm %s: batch %" PRIu64 ": %zu events skipped\n", cmd, b.seq, b.skipped);
    if (b.lost_before)
      fprintf(stderr, "kvbm %s: %" PRIu64 " batches lost before %" PRIu64 "\n", cmd,
              b.lost_before, b.seq);
    for (size_t i = 0; i < b.num_events && buf; i++) {
      size_t need = kvbm_event_to_json(&b.events[i], buf, cap);
      if (need >= cap) { /* exactly this event's JSON (common/vec.h) */
        if (kvbm__vec_resize_of(&buf, &cap, need + 1, KVBM__VEC_NO_LIMIT)) break;
        kvbm_event_to_json(&b.events[i], buf, cap);
      }
      printf("{\"seq\":%" PRIu64 ",\"ts\":%.17g,\"dp_rank\":", b.seq, b.ts);
      if (b.has_dp_rank) printf("%d,", (int)b.dp_rank);
      else printf("null,");
      printf("%s\n", buf + 1);
    }
    fflush(stdout);
  }
  if (!buf) {
    fprintf(stderr, "kvbm %s: out of memory\n", cmd);
    status = 1;
  }
  free(buf);
  print_stats(cmd, sub);
  kvbm_subscriber_destroy(sub);
  return status;
}

/* The relay's page: its subscriber's counters and its own (batches,
 * events, skipped and refused events) as of the last poll. */
typedef struct relay_view {
  pthread_mutex_t mu;
  kvbm_subscriber_stats sub;
  kvbm_relay_stats relay;
} relay_view;

static void relay_collect(void *user, kvbm_metrics_writer *w) {
  relay_view *v = user;
  pthread_mutex_lock(&v->mu);
  kvbm_subscriber_stats s = v->sub;
  kvbm_relay_stats rs = v->relay;
  pthread_mutex_unlock(&v->mu);
  kvbm_subscriber_metrics_write(w, &s, NULL, 0);
  kvbm_relay_metrics_write(w, &rs, NULL, 0);
}

static void relay_view_take(relay_view *v, const kvbm_relay *r) {
  kvbm_subscriber_stats s;
  kvbm_relay_stats rs;
  kvbm_subscriber_stats_get(kvbm_relay_subscriber(r), &s);
  kvbm_relay_stats_get(r, &rs);
  pthread_mutex_lock(&v->mu);
  v->sub = s;
  v->relay = rs;
  pthread_mutex_unlock(&v->mu);
}

static int relay(int argc, char **argv) {
  const char *cmd = "events relay";
  args a = {0};
  if (!metrics_cli_init(&a.metrics, cmd)) return 2;
  int rc = parse(cmd, argc, argv, true, &a);
  if (rc) {
    usage();
    return rc;
  }
  kvbm_publisher *p;
  kvbm_error err;
  if (kvbm_publisher_create(&a.pub, &p, &err)) {
    fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
    return 2;
  }
  if (a.nats) {
    rc = kvbm_publisher_add_nats(p, a.nats, a.subject, &err);
  } else if (a.jetstream) {
    kvbm_jetstream_config jo = kvbm_jetstream_config_default(a.jetstream, a.stream, a.subject);
    jo.stream_subjects = a.stream_subjects;
    rc = kvbm_publisher_add_jetstream(p, &jo, &err);
  } else {
    kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default(a.zmq);
    zo.replay_endpoint = a.zmq_replay;
    zo.topic = a.zmq_topic;
    zo.replay_legacy = a.zmq_replay_legacy;
    rc = kvbm_publisher_add_zmq(p, &zo, &err);
  }
  if (rc || (rc = kvbm_publisher_start(p, &err))) {
    fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
    kvbm_publisher_destroy(p);
    return rc == KVBM_EIO ? 1 : 2;
  }
  if (a.zmq) {
    char ep[256], rep[256];
    kvbm_publisher_zmq_endpoint(p, 0, false, ep, sizeof ep);
    printf("publishing on %s", ep);
    if (kvbm_publisher_zmq_endpoint(p, 0, true, rep, sizeof rep) == KVBM_OK)
      printf(" replay %s", rep);
    printf("\n");
  } else if (a.jetstream) {
    printf("publishing on %s stream %s subject %s\n", a.jetstream, a.stream, a.subject);
  } else {
    printf("publishing on %s subject %s\n", a.nats, a.subject);
  }
  fflush(stdout);
  kvbm_relay *r;
  if (kvbm_relay_create(&a.sub, p, &r, &err)) {
    fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
    kvbm_publisher_destroy(p);
    return 2;
  }
  relay_view view = {.mu = PTHREAD_MUTEX_INITIALIZER};
  kvbm_metrics *reg = NULL;
  kvbm_metrics_server *srv = NULL;
  if (a.metrics.cfg.enabled) {
    err = (kvbm_error){0};
    if (kvbm_metrics_create(&reg, &err) ||
        kvbm_metrics_register(reg, kvbm_publisher_metrics_collect, p, NULL, 0, NULL, &err) ||
        kvbm_metrics_register(reg, relay_collect, &view, NULL, 0, NULL, &err) ||
        kvbm_metrics_server_start(reg, &a.metrics.cfg, &srv, &err) ||
        !metrics_cli_announce(&a.metrics, cmd, kvbm_metrics_server_port(srv))) {
      if (err.msg[0]) fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
      kvbm_metrics_server_stop(srv);
      kvbm_metrics_destroy(reg);
      kvbm_relay_destroy(r);
      kvbm_publisher_destroy(p);
      return 1;
    }
  }
  install_signals();
  uint64_t n = 0;
  int status = 0;
  double idle_since = cli_now();
  while (!g_stop && (!a.count || n < a.count)) {
    size_t nb = 0;
    rc = kvbm_relay_poll(r, slice_ms(&a, idle_since), &nb, &err);
    n += nb;
    if (srv) relay_view_take(&view, r);
    if (rc == KVBM_ETIMEDOUT) {
      if (idle_over(&a, idle_since)) break;
      continue;
    }
    idle_since = cli_now();
    if (rc == KVBM_EIO || rc == KVBM_ECLOSED) {
      fprintf(stderr, "kvbm %s: %s\n", cmd, err.msg);
      status = 1;
      break;
    }
    if (rc) fprintf(stderr, "kvbm %s: skipped: %s\n", cmd, err.msg);
  }
  print_stats(cmd, kvbm_relay_subscriber(r));
  kvbm_relay_stats rs;
  kvbm_relay_stats_get(r, &rs);
  fprintf(stderr, "kvbm %s: %" PRIu64 " events relayed, %" PRIu64 " skipped (not decodable), %" PRIu64
          " refused by the publisher\n", cmd, rs.events, rs.skipped, rs.refused);
  /* the endpoint goes first: its collectors read the relay and the publisher */
  kvbm_metrics_server_stop(srv);
  kvbm_metrics_destroy(reg);
  kvbm_relay_destroy(r);
  kvbm_publisher_flush(p, 5000, NULL); /* sends everything accepted, then counts */
  print_publisher(cmd, p);
  kvbm_publisher_destroy(p);
  return status;
}

int kvbm_cmd_events(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage_to(stdout);
      return 0;
    }
  if (argc < 2) {
    usage();
    return 2;
  }
  if (!strcmp(argv[1], "tail")) return tail(argc - 1, argv + 1);
  if (!strcmp(argv[1], "relay")) return relay(argc - 1, argv + 1);
  fprintf(stderr, "kvbm events: unknown subcommand '%s'\n", argv[1]);
  usage();
  return 2;
}
