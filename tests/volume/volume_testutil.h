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

#endif
