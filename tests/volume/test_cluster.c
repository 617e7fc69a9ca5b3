/* SPDX-License-Identifier: Apache-2.0 */
/* test_cluster.c: the redis+cluster:// backend against a real three-master
 * Redis Cluster (redis-server --cluster-enabled yes x3, joined by
 * redis-cli --cluster create --cluster-replicas 0), started here on free
 * loopback ports. Key slots as Redis computes them (CLUSTER KEYSLOT), round
 * trips over all masters, two processes sharing the cluster, a slot moved
 * under the client (MOVED), a slot half migrated (ASK, for a key that has
 * moved and for a new key), a replica promoted by CLUSTER FAILOVER, and a
 * master killed (misses, then hits once a replica took over and the map
 * was refreshed). Also the slot-map and redirection parsers on hostile
 * replies, and hostile nodes (fake_cluster.h, a RESP thread on loopback:
 * a real Redis never misbehaves so): MOVED in a loop, a map that points in
 * circles, an owner that redirects its own slot, a 16384-entry map with
 * holes, an overlapping map, a slow looping node, and many I/O threads
 * sharing one rate-limited refresh. Those assert on counts (CLUSTER SLOTS
 * as the fake node saw them, data commands, the volume's counters) and on
 * statuses; wall time only against a bound a slow machine meets (3x the
 * deadline), and the refresh bound grows with the time the test took, so
 * a slow machine loosens it rather than failing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "volume/cluster.h"
#include "volume/internal.h"
#include "volume/resp.h"
#include "fake_cluster.h"
#include "volume_testutil.h"

static vt_cluster g_cluster;
static char g_url[512];

static int setup(void **state) {
  (void)state;
  if (vt_cluster_start(&g_cluster, 3)) return -1;
  snprintf(g_url, sizeof g_url, "redis+cluster://127.0.0.1:%d,127.0.0.1:%d",
           g_cluster.node[0].port, g_cluster.node[1].port);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  vt_cluster_destroy(&g_cluster);
  return 0;
}

static kvbm_volume *cluster_volume(const char *ns, int timeout_ms) {
  kvbm_volume_config c = kvbm_volume_config_default(g_url);
  c.key_namespace = ns;
  if (timeout_ms) c.timeout_ms = timeout_ms;
  kvbm_volume *v = NULL;
  kvbm_error e;
  int rc = kvbm_volume_register(&c, &v, &e);
  if (rc) fail_msg("register %s: %s", g_url, e.msg);
  return v;
}

static int slot_of(const char *ns, uint64_t key) {
  char k[KVBM__VOLUME_KEY_MAX];
  size_t n = kvbm__volume_key(ns, key, k);
  return kvbm__cluster_keyslot(k, n);
}

/* A key of namespace ns whose slot is `slot`, from `from` on. */
static uint64_t key_in_slot(const char *ns, int slot, uint64_t from) {
  for (uint64_t k = from;; k++)
    if (slot_of(ns, k) == slot) return k;
}

static void test_keyslot(void **state) {
  (void)state;
  /* Redis's own examples, then keys of ours: CLUSTER KEYSLOT agrees */
  assert_int_equal(kvbm__cluster_crc16("123456789", 9), 0x31C3);
  const char *keys[] = {"foo", "{user1000}.following", "{user1000}.followers", "foo{}{bar}",
                        "foo{{bar}}zap", "foo{bar}{zap}", "{}x", "x{", "}{", "a{b", ""};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    char out[64];
    assert_int_equal(VT_CLI(g_cluster.node[0].port, out, sizeof out, "CLUSTER", "KEYSLOT", keys[i]), 0);
    if (atoi(out) != kvbm__cluster_keyslot(keys[i], strlen(keys[i])))
      fail_msg("'%s': redis %d, ours %d", keys[i], atoi(out),
               kvbm__cluster_keyslot(keys[i], strlen(keys[i])));
  }
  for (uint64_t k = 0; k < 40; k++) {
    char key[KVBM__VOLUME_KEY_MAX], out[64];
    uint64_t h = vt_mix(k);
    kvbm__volume_key(k % 2 ? "llama:fp16:16" : "", h, key);
    assert_int_equal(VT_CLI(g_cluster.node[1].port, out, sizeof out, "CLUSTER", "KEYSLOT", key), 0);
    assert_int_equal(atoi(out), slot_of(k % 2 ? "llama:fp16:16" : "", h));
  }
}

static void test_round_trip(void **state) {
  (void)state;
  kvbm_volume *v = cluster_volume("rt", 0);
  enum { N = 90 };
  const size_t len = 10000;
  uint8_t *vals = malloc(N * len), *outs = malloc(N * len);
  kvbm_volume_op ops[2 * N];
  for (int i = 0; i < N; i++) {
    vt_pattern(vals + i * len, len, (uint64_t)i, 1, 0);
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)i, .src = vals + i * len,
                              .len = len};
    ops[N + i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = (uint64_t)i,
                                  .dst = outs + i * len, .cap = len};
  }
  assert_int_equal(kvbm_volume_run(v, ops, 2 * N, NULL), KVBM_OK);
  for (int i = 0; i < 2 * N; i++)
    if (ops[i].status) fail_msg("op %d: %s", i, kvbm_status_name(ops[i].status));
  for (int i = 0; i < N; i++) assert_true(vt_pattern(outs + i * len, len, (uint64_t)i, 1, 1));
  /* spread over the three masters */
  for (int m = 0; m < 3; m++) {
    char out[32];
    assert_int_equal(VT_CLI(g_cluster.node[m].port, out, sizeof out, "DBSIZE"), 0);
    assert_true(atoi(out) > 0);
  }
  size_t sz;
  assert_int_equal(kvbm_volume_exists(v, 5, &sz), KVBM_OK);
  assert_int_equal(sz, len);
  assert_int_equal(kvbm_volume_delete(v, 5), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, 5, outs, len, NULL), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_delete(v, 5), KVBM_ENOTFOUND);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.io_errors, 0);
  kvbm_volume_unregister(v);
  free(vals);
  free(outs);
}

static void test_two_processes(void **state) {
  (void)state;
  pid_t pid = fork();
  if (pid == 0) {
    kvbm_volume_config c = kvbm_volume_config_default(g_url);
    c.key_namespace = "share";
    kvbm_volume *v;
    if (kvbm_volume_register(&c, &v, NULL)) _exit(2);
    uint8_t val[777];
    for (uint64_t k = 0; k < 30; k++) {
      vt_pattern(val, sizeof val, k, 4, 0);
      if (kvbm_volume_put(v, k, val, sizeof val)) _exit(3);
    }
    kvbm_volume_unregister(v);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  kvbm_volume *v = cluster_volume("share", 0);
  uint8_t out[777];
  for (uint64_t k = 0; k < 30; k++) {
    assert_int_equal(kvbm_volume_get(v, k, out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, k, 4, 1));
  }
  kvbm_volume_unregister(v);
}

/* Index of the cluster node on port. */
static int node_at(int port) {
  for (int i = 0; i < g_cluster.n; i++)
    if (g_cluster.node[i].port == port) return i;
  return -1;
}

/* Starts moving `slot` from its owner to another master: IMPORTING on the
 * target, MIGRATING on the source. Returns the target's index; *src the
 * source's. */
static int begin_migration(int slot, int *src, char *src_id, char *dst_id) {
  int sp = vt_cluster_owner(g_cluster.node[0].port, slot, src_id);
  assert_true(sp > 0);
  *src = node_at(sp);
  int dst = (*src + 1) % 3;
  assert_int_equal(vt_cluster_myid(g_cluster.node[dst].port, dst_id), 0);
  char s[16], out[256];
  snprintf(s, sizeof s, "%d", slot);
  assert_int_equal(VT_CLI(g_cluster.node[dst].port, out, sizeof out, "CLUSTER", "SETSLOT", s,
                          "IMPORTING", src_id), 0);
  assert_non_null(strstr(out, "OK"));
  assert_int_equal(VT_CLI(sp, out, sizeof out, "CLUSTER", "SETSLOT", s, "MIGRATING", dst_id), 0);
  assert_non_null(strstr(out, "OK"));
  return dst;
}

static void migrate_key(int src, int dst, const char *key) {
  char port[16], out[256];
  snprintf(port, sizeof port, "%d", g_cluster.node[dst].port);
  assert_int_equal(VT_CLI(g_cluster.node[src].port, out, sizeof out, "MIGRATE", "127.0.0.1", port,
                          "", "0", "5000", "KEYS", key), 0);
  assert_non_null(strstr(out, "OK"));
}

/* Every master learns that slot belongs to dst. */
static void end_migration(int slot, const char *dst_id) {
  char s[16], out[256];
  snprintf(s, sizeof s, "%d", slot);
  for (int i = 0; i < 3; i++)
    assert_int_equal(VT_CLI(g_cluster.node[i].port, out, sizeof out, "CLUSTER", "SETSLOT", s,
                            "NODE", dst_id), 0);
}

/* A slot moved for good after the client read the map: MOVED, followed. */
static void test_moved(void **state) {
  (void)state;
  kvbm_volume *v = cluster_volume("mv", 0);
  uint8_t val[500], out[500];
  uint64_t key = 1000;
  vt_pattern(val, sizeof val, key, 1, 0);
  assert_int_equal(kvbm_volume_put(v, key, val, sizeof val), KVBM_OK); /* map read */
  int slot = slot_of("mv", key), src;
  char src_id[41], dst_id[41], k[KVBM__VOLUME_KEY_MAX];
  int dst = begin_migration(slot, &src, src_id, dst_id);
  kvbm__volume_key("mv", key, k);
  migrate_key(src, dst, k);
  end_migration(slot, dst_id);
  assert_int_equal(vt_cluster_owner(g_cluster.node[src].port, slot, NULL), g_cluster.node[dst].port);
  assert_int_equal(kvbm_volume_get(v, key, out, sizeof out, NULL), KVBM_OK);
  assert_memory_equal(out, val, sizeof val);
  /* a put to the moved slot lands on the new owner */
  uint64_t k2 = key_in_slot("mv", slot, key + 1);
  assert_int_equal(kvbm_volume_put(v, k2, val, sizeof val), KVBM_OK);
  kvbm__volume_key("mv", k2, k);
  char cli[64];
  assert_int_equal(VT_CLI(g_cluster.node[dst].port, cli, sizeof cli, "STRLEN", k), 0);
  assert_int_equal(atoi(cli), (int)sizeof val);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.io_errors, 0);
  kvbm_volume_unregister(v);
}

/* A slot half migrated: the source answers ASK for keys it no longer has;
 * the client asks the target (ASKING first) for that one op. */
static void test_ask(void **state) {
  (void)state;
  kvbm_volume *v = cluster_volume("ask", 0);
  uint8_t val[300], out[300];
  uint64_t key = 2000;
  vt_pattern(val, sizeof val, key, 1, 0);
  assert_int_equal(kvbm_volume_put(v, key, val, sizeof val), KVBM_OK);
  int slot = slot_of("ask", key), src;
  char src_id[41], dst_id[41], k[KVBM__VOLUME_KEY_MAX];
  int dst = begin_migration(slot, &src, src_id, dst_id);
  kvbm__volume_key("ask", key, k);
  migrate_key(src, dst, k);
  /* the source still owns the slot, but the key is on the target */
  char cli[256];
  assert_int_equal(VT_CLI(g_cluster.node[src].port, cli, sizeof cli, "GET", k), 0);
  assert_non_null(strstr(cli, "ASK"));
  assert_int_equal(kvbm_volume_get(v, key, out, sizeof out, NULL), KVBM_OK);
  assert_memory_equal(out, val, sizeof val);
  /* a new key in the migrating slot goes to the target too */
  uint64_t k2 = key_in_slot("ask", slot, key + 1);
  vt_pattern(val, sizeof val, k2, 1, 0);
  assert_int_equal(kvbm_volume_put(v, k2, val, sizeof val), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, k2, out, sizeof out, NULL), KVBM_OK);
  assert_memory_equal(out, val, sizeof val);
  end_migration(slot, dst_id);
  assert_int_equal(kvbm_volume_get(v, k2, out, sizeof out, NULL), KVBM_OK);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.io_errors, 0);
  assert_int_equal(s.misses, 0);
  kvbm_volume_unregister(v);
}

/* Whether the replica on port has every key its master has. */
static int replica_synced(int master_port, int replica_port) {
  char a[32], b[256];
  if (VT_CLI(master_port, a, sizeof a, "DBSIZE") || VT_CLI(replica_port, b, sizeof b, "DBSIZE"))
    return 0;
  return atoi(a) == atoi(b);
}

/* A replica taken over gracefully (CLUSTER FAILOVER): the old master
 * answers MOVED, the client follows, no miss. Then the new master is
 * killed: misses (never wrong bytes) until the cluster promotes the old
 * one back and the client's refreshed map points at it, then hits. */
static void test_failover(void **state) {
  (void)state;
  kvbm_volume *v = cluster_volume("fo", 300);
  uint64_t key = 3000;
  int slot = slot_of("fo", key);
  int mport = vt_cluster_owner(g_cluster.node[0].port, slot, NULL);
  int m = node_at(mport);
  uint8_t val[2000], out[2000];
  /* keys of this master's slot (a few) */
  uint64_t keys[4];
  keys[0] = key;
  for (int i = 1; i < 4; i++) keys[i] = key_in_slot("fo", slot, keys[i - 1] + 1);
  for (int i = 0; i < 4; i++) {
    vt_pattern(val, sizeof val, keys[i], 7, 0);
    assert_int_equal(kvbm_volume_put(v, keys[i], val, sizeof val), KVBM_OK);
  }
  int r = vt_cluster_add_replica(&g_cluster, m);
  assert_true(r > 0);
  int rport = g_cluster.node[r].port;
  for (int t = 0; t < 300 && !replica_synced(mport, rport); t++) usleep(100000);
  assert_true(replica_synced(mport, rport));
  char cli[256];
  assert_int_equal(VT_CLI(rport, cli, sizeof cli, "CLUSTER", "FAILOVER"), 0);
  for (int t = 0; t < 300 && vt_cluster_owner(mport, slot, NULL) != rport; t++) usleep(100000);
  assert_int_equal(vt_cluster_owner(mport, slot, NULL), rport);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(kvbm_volume_get(v, keys[i], out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, keys[i], 7, 1));
  }
  kvbm_volume_stats s0;
  kvbm_volume_stats_get(v, &s0);
  assert_int_equal(s0.misses, 0);
  /* now kill the new master: the old one (its replica now) takes over */
  for (int t = 0; t < 300 && !replica_synced(rport, mport); t++) usleep(100000);
  vt_redis_stop(&g_cluster.node[r], SIGKILL);
  int misses = 0, hit = 0;
  double t0 = vt_now();
  while (vt_now() - t0 < 40 && !hit) {
    memset(out, 0, sizeof out);
    int rc = kvbm_volume_get(v, keys[1], out, sizeof out, NULL);
    if (rc == KVBM_OK) {
      assert_true(vt_pattern(out, sizeof out, keys[1], 7, 1));
      hit = 1;
    } else {
      assert_true(rc == KVBM_EIO || rc == KVBM_ETIMEDOUT);
      misses++;
      usleep(50000);
    }
  }
  assert_true(hit);
  assert_true(misses > 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(kvbm_volume_get(v, keys[i], out, sizeof out, NULL), KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, keys[i], 7, 1));
  }
  /* the killed node is out of the cluster for the tests that follow */
  g_cluster.n--;
  vt_redis_destroy(&g_cluster.node[r]);
  kvbm_volume_unregister(v);
}

/* ---- the pure parsers on canned replies ---- */

static redisReply *parse(const char *wire) {
  redisReader *r = kvbm__resp_reader();
  redisReaderFeed(r, wire, strlen(wire));
  void *out = NULL;
  if (redisReaderGetReply(r, &out) != REDIS_OK) out = NULL;
  redisReaderFree(r);
  return out;
}

static void free_reply(redisReply *r) { kvbm__resp_reply_free(r); }

static void test_parsers(void **state) {
  (void)state;
  kvbm__slot_range rg[8];
  size_t n;
  kvbm_error e;
  redisReply *r = parse("*2\r\n*3\r\n:0\r\n:100\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
                        "*4\r\n:101\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n*2\r\n$1\r\nr\r\n:1\r\n");
  assert_non_null(r);
  assert_int_equal(kvbm__cluster_parse_slots(r, "seed.host", rg, 8, &n, &e), KVBM_OK);
  assert_int_equal(n, 2);
  assert_int_equal(rg[0].end, 100);
  assert_string_equal(rg[0].host, "127.0.0.1");
  assert_int_equal(rg[1].port, 7001);
  assert_string_equal(rg[1].host, "seed.host"); /* "" : the node we asked */
  assert_int_equal(kvbm__cluster_parse_slots(r, "h", rg, 1, &n, &e), KVBM_EPROTO);
  free_reply(r);
#define W(x) x, sizeof(x) - 1
  struct {
    const char *wire;
    size_t len;
    const char *needle;
  } bad[] = {
      {W("+OK\r\n"), "not answer an array"},
      {W("*1\r\n:5\r\n"), "entry 0 is not"},
      {W("*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n"), "bad range"},
      {W("*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n"), "bad range"},
      {W("*1\r\n*3\r\n:0\r\n:1\r\n:7\r\n"), "no [host, port]"},
      {W("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:70000\r\n"), "bad port"},
      {W("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:1\r\n:1\r\n"), "bad host"},
      {W("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$3\r\na\0b\r\n:1\r\n"), "bad host"},
      {W("*2\r\n*3\r\n:0\r\n:10\r\n*2\r\n$1\r\nh\r\n:1\r\n"
         "*3\r\n:10\r\n:20\r\n*2\r\n$1\r\nh\r\n:2\r\n"), "overlaps"},
      {W("*2\r\n*3\r\n:5\r\n:5\r\n*2\r\n$1\r\nh\r\n:1\r\n"
         "*3\r\n:0\r\n:9\r\n*2\r\n$1\r\n?\r\n:0\r\n"), "overlaps"},
  };
#undef W
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    redisReader *rd = kvbm__resp_reader();
    redisReaderFeed(rd, bad[i].wire, bad[i].len);
    void *out = NULL;
    assert_int_equal(redisReaderGetReply(rd, &out), REDIS_OK);
    redisReaderFree(rd);
    assert_int_equal(kvbm__cluster_parse_slots(out, "h", rg, 8, &n, &e), KVBM_EPROTO);
    if (!strstr(e.msg, bad[i].needle)) fail_msg("case %zu: %s", i, e.msg);
    free_reply(out);
  }
  /* "?" endpoints are skipped, not fatal */
  r = parse("*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\n?\r\n:1\r\n");
  assert_int_equal(kvbm__cluster_parse_slots(r, "h", rg, 8, &n, &e), KVBM_OK);
  assert_int_equal(n, 0);
  free_reply(r);

  kvbm__redirect rd;
  const char *m1 = "MOVED 3999 127.0.0.1:6381";
  assert_true(kvbm__cluster_parse_redirect(m1, strlen(m1), "cur", &rd));
  assert_false(rd.ask);
  assert_int_equal(rd.slot, 3999);
  assert_string_equal(rd.host, "127.0.0.1");
  assert_int_equal(rd.port, 6381);
  const char *m2 = "ASK 1 :7000";
  assert_true(kvbm__cluster_parse_redirect(m2, strlen(m2), "cur", &rd));
  assert_true(rd.ask);
  assert_string_equal(rd.host, "cur");
  const char *m3 = "MOVED 5 ::1:7000";
  assert_true(kvbm__cluster_parse_redirect(m3, strlen(m3), "cur", &rd));
  assert_string_equal(rd.host, "::1");
  const char *badr[] = {"MOVED", "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:0",
                        "MOVED 1 h:99999", "ASK 1 h:1x", "MOVED 1  h:1", "ERR x", "MOVED 123456 h:1"};
  for (size_t i = 0; i < sizeof badr / sizeof *badr; i++)
    if (kvbm__cluster_parse_redirect(badr[i], strlen(badr[i]), "cur", &rd))
      fail_msg("accepted '%s'", badr[i]);
}

/* ---- hostile nodes ---- */

static kvbm_volume *hostile_volume(int port, int timeout_ms, uint32_t refresh_ms, uint32_t threads) {
  char url[128];
  snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", port);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = "hostile";
  c.timeout_ms = timeout_ms;
  c.cluster_refresh_ms = refresh_ms;
  c.threads = threads;
  kvbm_volume *v = NULL;
  kvbm_error e;
  if (kvbm_volume_register(&c, &v, &e)) fail_msg("register %s: %s", url, e.msg);
  return v;
}

/* The most CLUSTER SLOTS a rate-limited client may send in `secs`: one
 * at the start, one per interval after it, and one for slack. */
static unsigned refresh_bound(double secs, uint32_t refresh_ms) {
  return 2u + (unsigned)(secs * 1000.0 / refresh_ms);
}

static unsigned asked(fc_node *a, fc_node *b) {
  return atomic_load(&a->slots_asked) + (b ? atomic_load(&b->slots_asked) : 0);
}

static unsigned data(fc_node *a, fc_node *b) {
  return atomic_load(&a->data_cmds) + (b ? atomic_load(&b->data_cmds) : 0);
}

/* MOVED in a loop, three shapes: A's map says A and A sends to B, which
 * sends back; A's map says B and B and A send each other's way; A owns
 * every slot and redirects each to itself. Every put fails fast (EIO, a
 * redirect loop counted), within its deadline, and the map is read a
 * bounded number of times: today's code read it up to 7 times a batch. */
static void test_moved_loop(void **state) {
  (void)state;
  enum { K = 120, TIMEOUT = 500 };
  const uint32_t refresh_ms = 200;
  for (int shape = 0; shape < 3; shape++) {
    fc_node a = {0}, b = {0};
    assert_int_equal(fc_bind(&a), 0);
    assert_int_equal(fc_bind(&b), 0);
    if (shape == 0) a.moved_port = b.port, b.moved_port = a.port;
    if (shape == 1) a.map_port = b.port, a.moved_port = b.port, b.moved_port = a.port;
    if (shape == 2) a.moved_port = a.port, b.moved_port = a.port;
    assert_int_equal(fc_start(&a), 0);
    assert_int_equal(fc_start(&b), 0);
    kvbm_volume *v = hostile_volume(a.port, TIMEOUT, refresh_ms, 1);
    uint8_t val[64] = {1};
    double t0 = vt_now(), worst = 0;
    /* one key again and again: once its slot is known to loop, a put costs
     * no round trip until the next refresh */
    for (int i = 0; i < K; i++) {
      double s0 = vt_now();
      int rc = kvbm_volume_put(v, 7, val, sizeof val);
      if (rc != KVBM_EIO) fail_msg("shape %d put %d: %s", shape, i, kvbm_status_name(rc));
      if (vt_now() - s0 > worst) worst = vt_now() - s0;
    }
    double t1 = vt_now();
    unsigned refreshes_same = asked(&a, &b), data_same = data(&a, &b);
    /* a different key every time */
    for (int i = 0; i < K; i++) {
      double s0 = vt_now();
      int rc = kvbm_volume_put(v, 1000 + (uint64_t)i, val, sizeof val);
      if (rc != KVBM_EIO) fail_msg("shape %d key %d: %s", shape, i, kvbm_status_name(rc));
      if (vt_now() - s0 > worst) worst = vt_now() - s0;
    }
    double t2 = vt_now();
    kvbm_volume_stats s;
    kvbm_volume_stats_get(v, &s);
    kvbm_volume_unregister(v);
    fc_stop(&a);
    fc_stop(&b);
    if (refreshes_same > refresh_bound(t1 - t0, refresh_ms))
      fail_msg("shape %d: %u CLUSTER SLOTS for %d puts in %.2f s", shape, refreshes_same, K,
               t1 - t0);
    /* each refresh lets the slot be tried once more: at most 3 hops */
    if (data_same > 3 * refreshes_same + 3)
      fail_msg("shape %d: %u data commands for %d puts of one looping slot (%u refreshes)",
               shape, data_same, K, refreshes_same);
    unsigned all = asked(&a, &b);
    if (all > refresh_bound(t2 - t0, refresh_ms))
      fail_msg("shape %d: %u CLUSTER SLOTS for %d puts in %.2f s", shape, all, 2 * K, t2 - t0);
    assert_int_equal(s.slot_refreshes, all);
    assert_true(s.slot_refreshes_limited > 0);
    assert_int_equal(s.redirect_loops, 2 * K);
    assert_int_equal(s.io_errors, 2 * K);
    if (worst > 3.0 * TIMEOUT / 1000) fail_msg("shape %d: a put took %.2f s", shape, worst);
  }
}

/* A looping node that is also slow (150 ms a reply) and a batch of 32
 * puts under a 400 ms deadline: every op ends EIO or ETIMEDOUT, the batch
 * returns by its deadline (3x for a slow machine), and the late ops are
 * counted as timeouts. */
static void test_slow_loop_deadline(void **state) {
  (void)state;
  enum { N = 32, TIMEOUT = 400 };
  fc_node a = {0}, b = {0};
  assert_int_equal(fc_bind(&a), 0);
  assert_int_equal(fc_bind(&b), 0);
  a.moved_port = b.port, b.moved_port = a.port;
  a.delay_ms = b.delay_ms = 150;
  assert_int_equal(fc_start(&a), 0);
  assert_int_equal(fc_start(&b), 0);
  kvbm_volume *v = hostile_volume(a.port, TIMEOUT, 50, 1);
  uint8_t val[64] = {2};
  uint64_t timeouts = 0;
  for (int rep = 0; rep < 3; rep++) {
    kvbm_volume_op ops[N];
    for (int i = 0; i < N; i++)
      ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)(rep * N + i),
                                .src = val, .len = sizeof val};
    double t0 = vt_now();
    assert_int_equal(kvbm_volume_run(v, ops, N, NULL), KVBM_OK);
    double dt = vt_now() - t0;
    if (dt > 3.0 * TIMEOUT / 1000) fail_msg("rep %d: the batch took %.2f s", rep, dt);
    for (int i = 0; i < N; i++) {
      if (ops[i].status != KVBM_EIO && ops[i].status != KVBM_ETIMEDOUT)
        fail_msg("rep %d op %d: %s", rep, i, kvbm_status_name(ops[i].status));
      timeouts += ops[i].status == KVBM_ETIMEDOUT;
    }
  }
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.timeouts, timeouts);
  assert_int_equal(s.timeouts + s.io_errors, 3 * N);
  kvbm_volume_unregister(v);
  fc_stop(&a);
  fc_stop(&b);
}

typedef struct counted {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int left;
  int bad;
} counted;

static void count_done(void *user, kvbm_volume_op *ops, size_t n) {
  counted *c = user;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < n; i++) c->bad += ops[i].status != KVBM_EIO && ops[i].status != KVBM_ETIMEDOUT;
  c->left--;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* Four I/O threads and many batches at once on a looping node: the
 * threads share one map and one rate limit, so the map is read about once
 * per interval for the whole volume (today: every thread, several times a
 * batch). */
static void test_shared_refresh(void **state) {
  (void)state;
  enum { B = 64, N = 16, ROUNDS = 6 };
  const uint32_t refresh_ms = 1000;
  fc_node a = {0}, b = {0};
  assert_int_equal(fc_bind(&a), 0);
  assert_int_equal(fc_bind(&b), 0);
  a.moved_port = b.port, b.moved_port = a.port;
  assert_int_equal(fc_start(&a), 0);
  assert_int_equal(fc_start(&b), 0);
  kvbm_volume *v = hostile_volume(a.port, 2000, refresh_ms, 4);
  static kvbm_volume_op ops[B][N];
  uint8_t val[64] = {3};
  counted c = {.left = 0};
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cv, NULL);
  double t0 = vt_now();
  for (int r = 0; r < ROUNDS; r++) {
    c.left = B;
    for (int i = 0; i < B; i++) {
      for (int j = 0; j < N; j++)
        ops[i][j] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)(i * N + j),
                                     .src = val, .len = sizeof val};
      assert_int_equal(kvbm_volume_submit(v, ops[i], N, count_done, &c), KVBM_OK);
    }
    pthread_mutex_lock(&c.mu);
    while (c.left) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
  }
  double dt = vt_now() - t0;
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  kvbm_volume_unregister(v);
  fc_stop(&a);
  fc_stop(&b);
  assert_int_equal(c.bad, 0);
  unsigned n = asked(&a, &b);
  if (n > refresh_bound(dt, refresh_ms))
    fail_msg("%u CLUSTER SLOTS for %d batches on 4 threads in %.2f s", n, B * ROUNDS, dt);
  assert_int_equal(s.slot_refreshes, n);
  pthread_mutex_destroy(&c.mu);
  pthread_cond_destroy(&c.cv);
}

/* A 16384-entry map, every odd slot without an endpoint: ops in even
 * slots are served, ops in odd slots miss at once, and the map is read a
 * bounded number of times (today: once per batch that touches a hole).
 * The same map without holes is read once. */
static void test_huge_map(void **state) {
  (void)state;
  enum { K = 150, N = 8, TIMEOUT = 1000 };
  const uint32_t refresh_ms = 200;
  for (int holes = 1; holes >= 0; holes--) {
    fc_node a = {0};
    assert_int_equal(fc_bind(&a), 0);
    a.map = holes ? FC_MAP_HOLES : FC_MAP_SINGLES;
    assert_int_equal(fc_start(&a), 0);
    kvbm_volume *v = hostile_volume(a.port, TIMEOUT, refresh_ms, 1);
    uint8_t val[64] = {4};
    double t0 = vt_now(), worst = 0;
    int served = 0, holed = 0;
    for (int k = 0; k < K; k++) {
      kvbm_volume_op ops[N];
      for (int i = 0; i < N; i++)
        ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = (uint64_t)(k * N + i),
                                  .src = val, .len = sizeof val};
      double s0 = vt_now();
      assert_int_equal(kvbm_volume_run(v, ops, N, NULL), KVBM_OK);
      if (vt_now() - s0 > worst) worst = vt_now() - s0;
      for (int i = 0; i < N; i++) {
        int odd = slot_of("hostile", ops[i].key) & 1;
        int want = odd && holes ? KVBM_EIO : KVBM_OK;
        if (ops[i].status != want)
          fail_msg("holes %d batch %d op %d (slot %d): %s", holes, k, i,
                   slot_of("hostile", ops[i].key), kvbm_status_name(ops[i].status));
        if (want) holed++;
        else served++;
      }
    }
    double dt = vt_now() - t0;
    kvbm_volume_stats s;
    kvbm_volume_stats_get(v, &s);
    kvbm_volume_unregister(v);
    fc_stop(&a);
    assert_true(served > 0);
    assert_true(holes ? holed > 0 : holed == 0);
    unsigned n = asked(&a, NULL);
    if (n > (holes ? refresh_bound(dt, refresh_ms) : 1u))
      fail_msg("holes %d: %u CLUSTER SLOTS for %d batches in %.2f s", holes, n, K, dt);
    assert_int_equal(s.slot_refreshes, n);
    assert_int_equal(s.slot_maps_refused, 0);
    if (worst > 3.0 * TIMEOUT / 1000) fail_msg("holes %d: a batch took %.2f s", holes, worst);
  }
}

/* A map whose ranges overlap (every slot to A, then 100..200 to B as
 * well) is refused: no op goes anywhere, each fails at once, the refusal
 * is counted, and the map is asked for a bounded number of times. */
static void test_overlapping_map(void **state) {
  (void)state;
  enum { K = 60 };
  const uint32_t refresh_ms = 200;
  fc_node a = {0}, b = {0};
  assert_int_equal(fc_bind(&a), 0);
  assert_int_equal(fc_bind(&b), 0);
  a.map = FC_MAP_OVERLAP;
  a.map_port = b.port; /* 0..16383 to B, then 100..200 to A */
  assert_int_equal(fc_start(&a), 0);
  assert_int_equal(fc_start(&b), 0);
  kvbm_volume *v = hostile_volume(a.port, 1000, refresh_ms, 1);
  uint8_t val[64] = {5};
  double t0 = vt_now();
  for (int k = 0; k < K; k++) {
    int rc = kvbm_volume_put(v, (uint64_t)k, val, sizeof val);
    if (rc != KVBM_EIO) fail_msg("put %d: %s", k, kvbm_status_name(rc));
  }
  double dt = vt_now() - t0;
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  kvbm_volume_unregister(v);
  fc_stop(&a);
  fc_stop(&b);
  assert_int_equal(data(&a, &b), 0);
  unsigned n = asked(&a, &b);
  if (n > refresh_bound(dt, refresh_ms)) fail_msg("%u CLUSTER SLOTS for %d puts in %.2f s", n, K, dt);
  assert_true(n >= 1);
  assert_int_equal(s.slot_maps_refused, n);
}

/* cluster_refresh_ms out of range is refused by name. */
static void test_refresh_setting(void **state) {
  (void)state;
  kvbm_volume_config c = kvbm_volume_config_default("redis+cluster://127.0.0.1:1");
  c.cluster_refresh_ms = 3600001;
  kvbm_volume *v = NULL;
  kvbm_error e;
  assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_EINVAL);
  assert_null(v);
  assert_non_null(strstr(e.msg, "cluster_refresh_ms"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parsers),       cmocka_unit_test(test_keyslot),
      cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_two_processes),
      cmocka_unit_test(test_moved),         cmocka_unit_test(test_ask),
      cmocka_unit_test(test_failover),
      cmocka_unit_test(test_moved_loop),    cmocka_unit_test(test_slow_loop_deadline),
      cmocka_unit_test(test_shared_refresh), cmocka_unit_test(test_huge_map),
      cmocka_unit_test(test_overlapping_map), cmocka_unit_test(test_refresh_setting),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
