/* test_python.c: wire compatibility with an independent peer
 * (tests/events/vllm_peer.py, python3-zmq + python3-msgpack):
 *  - a Python "vLLM engine" publishes in the positional and the map form,
 *    hashes as ints (some negative) and as 32-byte bytes, batches as arrays
 *    and as maps, and drops some batches on the live socket; our subscriber
 *    must recover them through the engine's replay socket and decode
 *    exactly what was sent (the engine compares, field by field);
 *  - our publisher's batches, decoded by a Python subscriber, must match
 *    field by field what our publisher says it sent. */
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

#define PEER KVBM_SOURCE_DIR "/tests/events/vllm_peer.py"

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

static void from_engine(const char *form, const char *hashes, const char *batch_form) {
  alarm(120);
  const int nbatches = 40;
  char *argv[] = {"/usr/bin/python3", PEER, "engine", (char *)form, (char *)hashes, "40",
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
  for (int i = 0; i < nbatches; i++) {
    int rc = kvbm_subscriber_recv(sub, 10000, &b, &err);
    if (rc) fail_msg("batch %d: %s", i, err.msg);
    assert_int_equal(b.seq, (uint64_t)i);
    assert_int_equal(b.lost_before, 0);
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
  fprintf(c.in, "check %s\n", path);
  fflush(c.in);
  read_line(&c, line, sizeof line);
  assert_string_equal(line, "OK");
  assert_int_equal(finish(&c), 0);
  unlink(path);
  kvbm_subscriber_destroy(sub);
  alarm(0);
}

static void test_engine_positional_int(void **s) { (void)s; from_engine("positional", "int", "-"); }
static void test_engine_positional_bytes(void **s) { (void)s; from_engine("positional", "bytes", "-"); }
static void test_engine_map_int(void **s) { (void)s; from_engine("map", "int", "-"); }
static void test_engine_map_bytes_batch_map(void **s) {
  (void)s;
  from_engine("map", "bytes", "batch-map");
}

/* ------------------------------------------------- kvbm -> python */

static void record(void *user, const kvbm_event_batch *b) {
  FILE *f = user;
  for (size_t i = 0; i < b->num_events; i++) write_event_line(f, b, &b->events[i]);
  fflush(f);
}

static void to_python(kvbm_event_form form) {
  alarm(120);
  char path[] = "/tmp/kvbm_events_sent_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  kvbm_publisher_config o = kvbm_publisher_config_default();
  o.max_batch_events = 5;
  o.max_batch_delay_us = 60u * 1000 * 1000; /* only count and flush send */
  o.form = form;
  o.dp_rank = 4;
  kvbm_publisher *p;
  kvbm_error err;
  assert_int_equal(kvbm_publisher_create(&o, &p, &err), KVBM_OK);
  assert_int_equal(kvbm_publisher_add_callback(p, record, f, &err), KVBM_OK);
  kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default("tcp://127.0.0.1:*");
  zo.replay_endpoint = "tcp://127.0.0.1:*";
  if (kvbm_publisher_add_zmq(p, &zo, &err)) fail_msg("%s", err.msg);
  char ep[256], rep[256];
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 1, false, ep, sizeof ep), KVBM_OK);
  assert_int_equal(kvbm_publisher_zmq_endpoint(p, 1, true, rep, sizeof rep), KVBM_OK);
  assert_int_equal(kvbm_publisher_start(p, &err), KVBM_OK);
  const int nbatches = 20;
  char nb[16];
  snprintf(nb, sizeof nb, "%d", nbatches);
  char *argv[] = {"/usr/bin/python3", PEER, "subscribe", ep, rep, nb, path, NULL};
  child c;
  spawn(&c, argv);
  char line[256];
  read_line(&c, line, sizeof line);
  assert_string_equal(line, "ready");
  uint64_t x = 0x9e3779b97f4a7c15ull;
  static const char *const other[] = {"NVME_tier", NULL};
  for (int bi = 0; bi < nbatches; bi++) {
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
        ev.medium_name = ev.medium == KVBM_MEDIUM_OTHER ? other[0] : NULL;
        if (k == 2) ev.group_idx = bi, ev.has_group_idx = true;
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

static void test_publisher_positional_to_python(void **s) { (void)s; to_python(KVBM_FORM_POSITIONAL); }
static void test_publisher_map_to_python(void **s) { (void)s; to_python(KVBM_FORM_MAP); }

int main(void) {
  if (access("/usr/bin/python3", X_OK)) {
    fprintf(stderr, "no /usr/bin/python3\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_positional_int),
      cmocka_unit_test(test_engine_positional_bytes),
      cmocka_unit_test(test_engine_map_int),
      cmocka_unit_test(test_engine_map_bytes_batch_map),
      cmocka_unit_test(test_publisher_positional_to_python),
      cmocka_unit_test(test_publisher_map_to_python),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
