/* SPDX-License-Identifier: Apache-2.0 */
/* test_python.c: wire compatibility with independent peers
 * (tests/events/engine_peer.py, python3-zmq + python3-msgpack, shapes
 * written from the engines' sources):
 *  - Python engines publish each engine's shapes, today's and older ones:
 *    vLLM v0.8 ([ts, events], 5-field events), v0.10 (medium, LoRA name,
 *    dp rank), v0.2x (extra_keys, group, kind, window; bytes hashes), today
 *    (tagged maps, locality, ownership, fields kvbm does not know), SGLang
 *    positional (salt map at index 7, session id, CPU_PINNED, token pairs)
 *    and maps, and Dynamo (signed hashes, "Ignored" and other bad events);
 *    some batches are withheld from the live socket. Our subscriber must
 *    recover them by replay, decode exactly what was sent (the engine
 *    compares, field by field) and skip exactly the bad events;
 *  - our publisher's batches, read by a Python subscriber that checks what
 *    a typed vLLM consumer needs (map and positional, unsigned and signed
 *    hashes), must match field by field what our publisher says it sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvbm/events.h"

#define PEER KVBM_SOURCE_DIR "/tests/events/engine_peer.py"

typedef struct child {
  pid_t pid;
  FILE *in, *out;
} child;

static void spawn(child *c, char *const argv[]) {
  int to[2], from[2];
  assert_int_equal(pipe(to), 0);
  assert_int_equal(pipe(from), 0);
  c->pid = fork();
  assert_true(c->pid >= 0);
  if (c->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  c->in = fdopen(to[1], "w");
  c->out = fdopen(from[0], "r");
}

static void read_line(child *c, char *buf, size_t cap) {
  if (!fgets(buf, (int)cap, c->out)) fail_msg("the python peer said nothing (crashed?)");
  buf[strcspn(buf, "\n")] = '\0';
}

static int finish(child *c) {
  fclose(c->in);
  fclose(c->out);
  int st;
  waitpid(c->pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void write_event_line(FILE *f, const kvbm_event_batch *b, const kvbm_event *ev) {
  char buf[1 << 16];
  size_t need = kvbm_event_to_json(ev, buf, sizeof buf);
  assert_true(need < sizeof buf);
  fprintf(f, "{\"seq\":%" PRIu64 ",\"ts\":%.17g,\"dp_rank\":", b->seq, b->ts);
  if (b->has_dp_rank) fprintf(f, "%d,", (int)b->dp_rank);
  else fprintf(f, "null,");
  fprintf(f, "%s\n", buf + 1);
}

/* ------------------------------------------------- engine -> kvbm */

static void from_engine(const char *profile, const char *hashes, const char *batch_form) {
  alarm(120);
  const int nbatches = 40;
  char *argv[] = {"/usr/bin/python3", PEER, "engine", (char *)profile, (char *)hashes, "40",
                  "3,4,17", (char *)batch_form, NULL};
  child c;
  spawn(&c, argv);
  char line[512], ep[256], rep[256];
  read_line(&c, line, sizeof line);
  assert_int_equal(sscanf(line, "%255s %255s", ep, rep), 2);
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.start_seq = 0;
  so.topic = "kv";
  kvbm_subscriber *sub;
  kvbm_error err;
  assert_int_equal(kvbm_subscriber_create(&so, &sub, &err), KVBM_OK);
  kvbm_event_batch b;
  /* joins (asks replay from 0: nothing yet) and lets the subscription land */
  assert_int_equal(kvbm_subscriber_recv(sub, 300, &b, &err), KVBM_ETIMEDOUT);
  fprintf(c.in, "go\n");
  fflush(c.in);
  char path[] = "/tmp/kvbm_events_got_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  size_t skipped = 0;
  for (int i = 0; i < nbatches; i++) {
    int rc = kvbm_subscriber_recv(sub, 10000, &b, &err);
    if (rc) fail_msg("%s batch %d: %s", profile, i, err.msg);
    assert_int_equal(b.seq, (uint64_t)i);
    assert_int_equal(b.lost_before, 0);
    skipped += b.skipped;
    for (size_t e = 0; e < b.num_events; e++) write_event_line(f, &b, &b.events[e]);
  }
  fclose(f);
  kvbm_subscriber_stats st;
  kvbm_subscriber_stats_get(sub, &st);
  assert_int_equal(st.delivered, nbatches);
  assert_true(st.gaps >= 1); /* 3, 4 and 17 were not sent live */
  assert_true(st.replayed >= 3);
  assert_int_equal(st.lost, 0);
  assert_int_equal(st.malformed, 0);
  fprintf(c.in, "skipped\n");
  fflush(c.in);
  read_line(&c, line, sizeof line);
  assert_int_equal(skipped, strtoul(line, NULL, 10)); /* the bad events, no more */
  if (!strcmp(profile, "dynamo")) assert_true(skipped > 0);
  fprintf(c.in, "check %s\n", path);
  fflush(c.in);
  read_line(&c, line, sizeof line);
  if (strcmp(line, "OK")) fail_msg("%s/%s: the engine says kvbm decoded other events", profile, hashes);
  assert_int_equal(finish(&c), 0);
  unlink(path);
  kvbm_subscriber_destroy(sub);
  alarm(0);
}

static void test_vllm_v08(void **s) { (void)s; from_engine("vllm-v0.8", "int", "-"); }
static void test_vllm_v010_int(void **s) { (void)s; from_engine("vllm-v0.10", "int", "-"); }
static void test_vllm_v010_bytes(void **s) { (void)s; from_engine("vllm-v0.10", "bytes", "-"); }
static void test_vllm_v02x_positional(void **s) { (void)s; from_engine("vllm-v0.2x", "bytes", "-"); }
static void test_vllm_map(void **s) { (void)s; from_engine("vllm", "int", "-"); }
static void test_vllm_map_bytes_batch_map(void **s) {
  (void)s;
  from_engine("vllm", "bytes", "batch-map");
}
static void test_sglang_positional(void **s) { (void)s; from_engine("sglang-positional", "int", "-"); }
static void test_sglang_map(void **s) { (void)s; from_engine("sglang", "int", "-"); }
static void test_dynamo_signed_ignored(void **s) { (void)s; from_engine("dynamo", "int", "-"); }

/* ------------------------------------------------- kvbm -> python */

static void record(void *user, const kvbm_event_batch *b) {
  FILE *f = user;
  for (size_t i = 0; i < b->num_events; i++) write_event_line(f, b, &b->events[i]);
  fflush(f);
}

static void to_python(kvbm_event_form form, bool sgn) {
  alarm(120);
  char path[] = "/tmp/kvbm_events_sent_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 5;
  o.max_batch_delay_us = 60u * 1000 * 1000; /* only count and flush send */
  o.form = form;
  o.signed_hashes = sgn;
  o.dp_rank = 4;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, record, f, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  zo.topic = "kv@pod-1@model";
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  char ep[256], rep[256];
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 1, false, ep, sizeof ep), KVBM_OK);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 1, true, rep, sizeof rep), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  const int nbatches = 20;
  char nb[16];
  snprintf(nb, sizeof nb, "%d", nbatches);
  /* batches 0 and 1 go before the subscriber is there: it gets them by
   * replay, with their topic (vLLM #45177), which it checks */
  char *argv[] = {"/usr/bin/python3", PEER, "subscribe", ep, rep, nb, path,
                  form == KVBM_FORM_MAP ? "map" : "positional", sgn ? "signed" : "unsigned",
                  "kv@pod-1@model", NULL};
  child c;
  char line[256];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  static const char *const other[] = {"NVME_tier", NULL};
  static const char *const names[] = {NULL, "GPU", "CPU_PINNED", "STORAGE", "OBJ", NULL};
  static const uint8_t ekeys[] = {0x92, 0x92, 0xa2, 'm', 'm', 0x05, 0xc0};
  static const uint8_t extras[] = {0xaa, 's', 'e', 's', 's', 'i', 'o', 'n', '_', 'i', 'd',
                                   0xc4, 0x02, 0xbe, 0xef};
  for (int bi = 0; bi < nbatches; bi++) {
    if (bi == 2) {
      spawn(&c, argv);
      read_line(&c, line, sizeof line);
      assert_string_equal(line, "ready");
    }
    for (int k = 0; k < 5; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      uint64_t h[3] = {x, x ^ (x >> 7), UINT64_MAX - (uint64_t)k};
      uint32_t tok[48];
      for (int t = 0; t < 48; t++) tok[t] = (uint32_t)(x >> (t % 32)) + (uint32_t)t;
      kvbm_event ev = {.type = (kvbm_event_type)(1 + (bi + k) % 3)};
      if (ev.type != KVBM_EVENT_CLEARED) {
        ev.block_hashes = h;
        ev.num_block_hashes = 1 + (size_t)(k % 3);
        ev.medium = (kvbm_medium)((bi + k) % 6);
        ev.medium_name = ev.medium == KVBM_MEDIUM_OTHER ? other[0] : bi % 2 ? names[ev.medium] : NULL;
        if (k == 2) ev.group_idx = bi, ev.has_group_idx = true;
        if (form == KVBM_FORM_MAP && k == 3) {
          ev.locality = "REMOTE";
          ev.ownership = "kvcr";
          ev.extras = extras;
          ev.extras_len = sizeof extras;
          ev.num_extras = 1;
        }
      }
      if (ev.type == KVBM_EVENT_STORED) {
        ev.block_size = 16;
        ev.token_ids = tok;
        ev.num_tokens = 16 * ev.num_block_hashes;
        ev.has_parent = k % 2;
        ev.parent_hash = x >> 1;
        ev.has_lora_id = bi % 2;
        ev.lora_id = -bi;
        ev.lora_name = k == 1 ? "lora-\"q\"" : NULL;
        if (k == 0) ev.cache_salt = "tenant-\u00e9"; /* SGLang's salt (UTF-8) */
        if (k == 4 && bi % 3 == 0) ev.token_pairs = true;
        if (k == 4) {
          ev.extra_keys = ekeys;
          ev.extra_keys_len = sizeof ekeys;
          ev.kv_cache_spec_kind = "sliding_window";
          ev.sliding_window = 128;
          ev.has_sliding_window = true;
        }
      }
      assert_int_equal(kvbm_publisher_publish(p, &ev, NULL, &err), KVBM_OK);
    }
    assert_int_equal(kvbm_publisher_flush(p, 5000, &err), KVBM_OK);
  }
  read_line(&c, line, sizeof line);
  assert_string_equal(line, "OK");
  assert_int_equal(finish(&c), 0);
  kvbm_publisher_stats ps;
  kvbm_publisher_stats_get(p, &ps);
  assert_int_equal(ps.batches, nbatches);
  kvbm_publisher_destroy(p);
  fclose(f);
  unlink(path);
  alarm(0);
}

static void test_publisher_positional_to_python(void **s) {
  (void)s;
  to_python(KVBM_FORM_POSITIONAL, false);
}
static void test_publisher_map_to_python(void **s) { (void)s; to_python(KVBM_FORM_MAP, false); }
static void test_publisher_signed_to_python(void **s) {
  (void)s;
  to_python(KVBM_FORM_MAP, true);
  to_python(KVBM_FORM_POSITIONAL, true);
}

int main(void) {
  if (access("/usr/bin/python3", X_OK)) {
    fprintf(stderr, "no /usr/bin/python3\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vllm_v08),
      cmocka_unit_test(test_vllm_v010_int),
      cmocka_unit_test(test_vllm_v010_bytes),
      cmocka_unit_test(test_vllm_v02x_positional),
      cmocka_unit_test(test_vllm_map),
      cmocka_unit_test(test_vllm_map_bytes_batch_map),
      cmocka_unit_test(test_sglang_positional),
      cmocka_unit_test(test_sglang_map),
      cmocka_unit_test(test_dynamo_signed_ignored),
      cmocka_unit_test(test_publisher_positional_to_python),
      cmocka_unit_test(test_publisher_map_to_python),
      cmocka_unit_test(test_publisher_signed_to_python),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
