/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the volume tests: value patterns keyed by (key,
 * version), temporary directories, free loopback ports, and redis-server
 * processes started, stopped and restarted by the tests themselves. */
#ifndef KVBM_VOLUME_TESTUTIL_H
#define KVBM_VOLUME_TESTUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbm/volume.h"

static inline uint64_t vt_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Fills (check 0) or checks (check 1, returns 0 on a mismatch) n bytes of
 * the value (key, version). The first 16 bytes are key and version, so a
 * reader can tell which whole value it got. */
static inline int vt_pattern(uint8_t *p, size_t n, uint64_t key, uint64_t version, int check) {
  uint64_t x = key * 31 + version;
  for (size_t i = 0; i < n; i++) {
    uint8_t v;
    if (i < 8) v = (uint8_t)(key >> (8 * i));
    else if (i < 16) v = (uint8_t)(version >> (8 * (i - 8)));
    else {
      if (i % 8 == 0) x = vt_mix(x);
      v = (uint8_t)(x >> (8 * (i % 8)));
    }
    if (check && p[i] != v) return 0;
    if (!check) p[i] = v;
  }
  return 1;
}

/* The version a value claims (bytes 8..16). */
static inline uint64_t vt_version(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[8 + i];
  return v;
}

static inline char *vt_tmpdir(const char *tag) {
  char *d = malloc(256);
  snprintf(d, 256, "/tmp/kvbm-vol-%s-XXXXXX", tag);
  if (!mkdtemp(d)) {
    perror("mkdtemp");
    abort();
  }
  return d;
}

static inline void vt_rmrf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline double vt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int vt_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

/* ---- redis-server ---- */

#define VT_REDIS_SERVER "/usr/bin/redis-server"
#define VT_REDIS_CLI "/usr/bin/redis-cli"

typedef struct vt_redis {
  pid_t pid;
  int port;
  char dir[256];
  char extra[8][64]; /* more "--name value" words */
  int nextra;
} vt_redis;

/* Runs redis-cli against port with argv words; returns its exit status and
 * copies its stdout (up to cap bytes) to out when given. */
static inline int vt_cli(int port, char *out, size_t cap, const char *const *words) {
  int pfd[2];
  if (pipe(pfd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    close(pfd[1]);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    const char *argv[48] = {VT_REDIS_CLI, "-h", "127.0.0.1", "-p", p};
    int n = 5;
    for (int i = 0; words[i] && n < 47; i++) argv[n++] = words[i];
    argv[n] = NULL;
    execv(VT_REDIS_CLI, (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t got = 0;
  char buf[4096];
  for (;;) {
    ssize_t r = read(pfd[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (out && got + 1 < cap) {
      size_t k = (size_t)r < cap - 1 - got ? (size_t)r : cap - 1 - got;
      memcpy(out + got, buf, k);
      got += k;
    }
  }
  if (out && cap) out[got] = 0;
  close(pfd[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define VT_CLI(port, out, cap, ...) vt_cli(port, out, cap, (const char *const[]){__VA_ARGS__, NULL})

static inline int vt_ping(int port) {
  char out[64];
  VT_CLI(port, out, sizeof out, "PING");
  return !strncmp(out, "PONG", 4) || strstr(out, "NOAUTH"); /* up (with a password) */
}

/* Forks redis-server on r->port in r->dir (no persistence) and waits until
 * it answers PING; 0, or -1 when it exited or stayed silent. */
static inline int vt_redis_spawn(vt_redis *r) {
  r->pid = fork();
  if (r->pid == 0) {
    char p[16];
    snprintf(p, sizeof p, "%d", r->port);
    if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphan server if the test dies */
    const char *argv[40] = {VT_REDIS_SERVER, "--port", p, "--bind", "127.0.0.1", "--dir", r->dir,
                            "--save", "", "--appendonly", "no", "--daemonize", "no"};
    int n = 13;
    for (int i = 0; i < r->nextra && n < 38; i++) argv[n++] = r->extra[i];
    argv[n] = NULL;
    execv(VT_REDIS_SERVER, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    if (vt_ping(r->port)) return 0;
    int st;
    if (waitpid(r->pid, &st, WNOHANG) == r->pid) { /* exited: port taken? */
      r->pid = 0;
      return -1;
    }
    usleep(25000);
  }
  kill(r->pid, SIGKILL);
  waitpid(r->pid, NULL, 0);
  r->pid = 0;
  return -1;
}

/* Starts redis-server on a free loopback port in a fresh temporary dir
 * (r->extra: more arguments). Returns 0 or -1. */
static inline int vt_redis_start(vt_redis *r) {
  if (!r->dir[0]) {
    char *d = vt_tmpdir("redis");
    snprintf(r->dir, sizeof r->dir, "%s", d);
    free(d);
  }
  for (int attempt = 0; attempt < 5; attempt++) {
    r->port = vt_free_port();
    if (vt_redis_spawn(r) == 0) return 0;
  }
  fprintf(stderr, "redis-server did not start\n");
  return -1;
}

/* Starts it again on the same port (after vt_redis_stop). */
static inline int vt_redis_restart(vt_redis *r) {
  for (int attempt = 0; attempt < 40; attempt++) {
    if (vt_redis_spawn(r) == 0) return 0;
    usleep(100000); /* the port may linger a moment */
  }
  fprintf(stderr, "redis-server did not restart on port %d\n", r->port);
  return -1;
}

/* SIGKILL (crash) or SIGTERM, and wait. */
static inline void vt_redis_stop(vt_redis *r, int sig) {
  if (r->pid > 0) {
    kill(r->pid, sig);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
  }
}

static inline void vt_redis_destroy(vt_redis *r) {
  vt_redis_stop(r, SIGKILL);
  if (r->dir[0]) vt_rmrf(r->dir);
  r->dir[0] = 0;
}

/* ---- a Redis Cluster of real servers ---- */

#define VT_CLUSTER_MAX 8

typedef struct vt_cluster {
  vt_redis node[VT_CLUSTER_MAX];
  int n;
} vt_cluster;

static inline void vt_cluster_node_args(vt_redis *r) {
  const char *a[] = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "1000", "--enable-debug-command", "yes"};
  r->nextra = 8;
  for (int i = 0; i < 8; i++) snprintf(r->extra[i], sizeof r->extra[i], "%s", a[i]);
}

/* Whether the node on port says cluster_state:ok and sees `known` nodes. */
static inline int vt_cluster_node_ok(int port, int known) {
  char out[4096];
  if (VT_CLI(port, out, sizeof out, "CLUSTER", "INFO") != 0) return 0;
  char want[64];
  snprintf(want, sizeof want, "cluster_known_nodes:%d", known);
  return strstr(out, "cluster_state:ok") && strstr(out, want);
}

/* Waits (up to ~30 s) until every live node is ok and knows every node. */
static inline int vt_cluster_wait_ok(vt_cluster *c) {
  for (int t = 0; t < 300; t++) {
    int ok = 1, live = 0;
    for (int i = 0; i < c->n; i++) live += c->node[i].pid > 0;
    for (int i = 0; ok && i < c->n; i++)
      if (c->node[i].pid > 0) ok = vt_cluster_node_ok(c->node[i].port, c->n);
    if (ok && live) return 0;
    usleep(100000);
  }
  fprintf(stderr, "the cluster did not become ok\n");
  return -1;
}

/* Starts `masters` cluster nodes and joins them with redis-cli --cluster
 * create (slots split evenly, no replicas). */
static inline int vt_cluster_start(vt_cluster *c, int masters) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < masters; i++) {
    vt_cluster_node_args(&c->node[i]);
    if (vt_redis_start(&c->node[i])) return -1;
    c->n++;
  }
  char addr[VT_CLUSTER_MAX][32];
  const char *w[VT_CLUSTER_MAX + 8] = {"--cluster", "create"};
  int k = 2;
  for (int i = 0; i < masters; i++) {
    snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", c->node[i].port);
    w[k++] = addr[i];
  }
  w[k++] = "--cluster-replicas";
  w[k++] = "0";
  w[k++] = "--cluster-yes";
  w[k] = NULL;
  if (vt_cli(c->node[0].port, NULL, 0, w) != 0) {
    fprintf(stderr, "redis-cli --cluster create failed\n");
    return -1;
  }
  return vt_cluster_wait_ok(c);
}

/* The node id of the server on port (CLUSTER MYID), in out[41]. */
static inline int vt_cluster_myid(int port, char *out) {
  char buf[128];
  if (VT_CLI(port, buf, sizeof buf, "CLUSTER", "MYID") != 0) return -1;
  size_t n = strcspn(buf, "\r\n");
  if (n != 40) return -1;
  memcpy(out, buf, 40);
  out[40] = 0;
  return 0;
}

/* Adds a replica of node `master`; returns its index, or -1. */
static inline int vt_cluster_add_replica(vt_cluster *c, int master) {
  if (c->n == VT_CLUSTER_MAX) return -1;
  vt_redis *r = &c->node[c->n];
  vt_cluster_node_args(r);
  if (vt_redis_start(r)) return -1;
  char id[41], me[32], to[32];
  if (vt_cluster_myid(c->node[master].port, id)) return -1;
  snprintf(me, sizeof me, "127.0.0.1:%d", r->port);
  snprintf(to, sizeof to, "127.0.0.1:%d", c->node[master].port);
  if (VT_CLI(r->port, NULL, 0, "--cluster", "add-node", me, to, "--cluster-slave",
             "--cluster-master-id", id) != 0)
    return -1;
  c->n++;
  return vt_cluster_wait_ok(c) ? -1 : c->n - 1;
}

/* The port (and node id, when id is not NULL) of the master serving
 * `slot` as the node on asker_port sees it (CLUSTER NODES), or -1. */
static inline int vt_cluster_owner(int asker_port, int slot, char *id) {
  static char out[1 << 16];
  if (VT_CLI(asker_port, out, sizeof out, "CLUSTER", "NODES") != 0) return -1;
  char *save = NULL;
  for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char nid[64], addr[128], flags[128], master[64], ping[32], pong[32], epoch[32], link[32];
    int used = 0;
    if (sscanf(line, "%63s %127s %127s %63s %31s %31s %31s %31s %n", nid, addr, flags, master,
               ping, pong, epoch, link, &used) < 8)
      continue;
    if (!strstr(flags, "master") || strstr(flags, "fail")) continue;
    for (char *tok = line + used; *tok;) {
      char *end;
      long a = strtol(tok, &end, 10), b = a; /* "a-b" or "a"; "[...]" is a migration */
      if (end != tok && *end == '-') b = strtol(end + 1, &end, 10);
      if (end != tok && *tok != '[' && slot >= a && slot <= b) {
        char *colon = strchr(addr, ':');
        if (id) snprintf(id, 41, "%.40s", nid);
        return colon ? atoi(colon + 1) : -1;
      }
      while (*tok && *tok != ' ') tok++;
      while (*tok == ' ') tok++;
    }
  }
  return -1;
}

static inline void vt_cluster_destroy(vt_cluster *c) {
  for (int i = 0; i < c->n; i++) vt_redis_destroy(&c->node[i]);
  c->n = 0;
}

#endif
