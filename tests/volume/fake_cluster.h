/* SPDX-License-Identifier: Apache-2.0 */
/* fake_cluster.h: a fake Redis Cluster node on loopback for hostile-node
 * tests and benchmarks (tests/volume/test_cluster.c,
 * bench/bench_g4_faults.c). Header-only, one thread per node.
 *
 * Why a fake: a real redis-server never answers MOVED in a loop or serves
 * a slot map with holes and 16384 entries; these are the behaviours of a
 * broken or hostile node, and the point of the tests that use this. The
 * node speaks just enough RESP: CLUSTER SLOTS (the map it was given),
 * ASKING/AUTH/SELECT/PING (+OK), and SET/GET/STRLEN/DEL, answered either
 * with MOVED to another port or as an empty store would (+OK, nil, 0). It
 * counts what it was asked, so a test can bound the client's traffic
 * (CLUSTER SLOTS refreshes above all) from the server's side, whatever
 * the client's own counters say.
 *
 * Threads: fc_start/fc_stop on one thread; the counters are atomics read
 * from any thread. */
#ifndef KVBM_TESTS_FAKE_CLUSTER_H
#define KVBM_TESTS_FAKE_CLUSTER_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "volume/cluster.h"

#define FC_CLIENTS 64

typedef enum fc_map {
  FC_MAP_ONE = 0,  /* one range, 0..16383 */
  FC_MAP_SINGLES,  /* 16384 single-slot entries */
  FC_MAP_HOLES,    /* 16384 single-slot entries, the odd ones without an
                      endpoint ("?", port 0: a node in handshake) */
  FC_MAP_OVERLAP,  /* 0..16383 twice, to two owners */
  FC_MAP_RAW,      /* raw_map, verbatim */
} fc_map;

typedef struct fc_node {
  /* behaviour: set before fc_start, constant after */
  fc_map map;
  int map_port;    /* the owner the map names (0: this node) */
  int moved_port;  /* data commands answer MOVED to this port (0: served) */
  int delay_ms;    /* sleep before each reply */
  const char *raw_map;
  /* counters */
  atomic_uint slots_asked; /* CLUSTER SLOTS commands */
  atomic_uint data_cmds;   /* SET/GET/STRLEN/DEL */
  /* private */
  int lfd, port, wake[2];
  char *map_bytes;
  size_t map_len;
  pthread_t t;
} fc_node;

typedef struct fc_client {
  int fd;
  char *buf;
  size_t len, cap;
} fc_client;

static inline void fc_append(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n > *cap) {
    size_t c = *cap ? *cap : 4096;
    while (c < *len + n) c *= 2;
    char *nb = realloc(*b, c);
    if (!nb) abort();
    *b = nb;
    *cap = c;
  }
  memcpy(*b + *len, s, n);
  *len += n;
}

static inline void fc_appendf(char **b, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void fc_appendf(char **b, size_t *len, size_t *cap, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  fc_append(b, len, cap, tmp, (size_t)n);
}

/* One CLUSTER SLOTS entry: start..end owned by 127.0.0.1:port (port 0:
 * "?", no endpoint). */
static inline void fc_entry(char **b, size_t *len, size_t *cap, int start, int end, int port) {
  if (port)
    fc_appendf(b, len, cap,
               "*3\r\n:%d\r\n:%d\r\n*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$40\r\n"
               "%040d\r\n",
               start, end, port, port);
  else
    fc_appendf(b, len, cap, "*3\r\n:%d\r\n:%d\r\n*3\r\n$1\r\n?\r\n:0\r\n$40\r\n%040d\r\n",
               start, end, 0);
}

static inline void fc_build_map(fc_node *f) {
  char *b = NULL;
  size_t len = 0, cap = 0;
  int owner = f->map_port ? f->map_port : f->port;
  switch (f->map) {
  case FC_MAP_ONE:
    fc_append(&b, &len, &cap, "*1\r\n", 4);
    fc_entry(&b, &len, &cap, 0, KVBM__CLUSTER_SLOTS - 1, owner);
    break;
  case FC_MAP_SINGLES:
  case FC_MAP_HOLES:
    fc_appendf(&b, &len, &cap, "*%u\r\n", KVBM__CLUSTER_SLOTS);
    for (int s = 0; s < (int)KVBM__CLUSTER_SLOTS; s++)
      fc_entry(&b, &len, &cap, s, s, f->map == FC_MAP_HOLES && (s & 1) ? 0 : owner);
    break;
  case FC_MAP_OVERLAP:
    fc_append(&b, &len, &cap, "*2\r\n", 4);
    fc_entry(&b, &len, &cap, 0, KVBM__CLUSTER_SLOTS - 1, owner);
    fc_entry(&b, &len, &cap, 100, 200, f->port);
    break;
  case FC_MAP_RAW: fc_append(&b, &len, &cap, f->raw_map, strlen(f->raw_map)); break;
  }
  f->map_bytes = b;
  f->map_len = len;
}

/* Parses one command (an array of bulk strings) at the head of buf:
 * returns its length, 0 if incomplete, -1 if malformed; argv/argl get up
 * to 4 arguments (pointers into buf). */
static inline long fc_parse(const char *buf, size_t len, const char **argv, size_t *argl, int *argc) {
  size_t i = 0;
  if (len < 4) return 0;
  if (buf[0] != '*') return -1;
  char *end;
  long n = strtol(buf + 1, &end, 10);
  const char *nl = memchr(buf, '\n', len);
  if (!nl) return 0;
  if (n < 1 || n > 16) return -1;
  i = (size_t)(nl - buf) + 1;
  *argc = (int)n;
  for (long a = 0; a < n; a++) {
    if (i >= len) return 0;
    if (buf[i] != '$') return -1;
    nl = memchr(buf + i, '\n', len - i);
    if (!nl) return 0;
    long l = strtol(buf + i + 1, &end, 10);
    if (l < 0) return -1;
    i = (size_t)(nl - buf) + 1;
    if (i + (size_t)l + 2 > len) return 0;
    if (a < 4) {
      argv[a] = buf + i;
      argl[a] = (size_t)l;
    }
    i += (size_t)l + 2;
  }
  return (long)i;
}

static inline int fc_is(const char *a, size_t l, const char *w) {
  return l == strlen(w) && !strncasecmp(a, w, l);
}

static inline void fc_send(int fd, const char *b, size_t n) {
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    b += w;
    n -= (size_t)w;
  }
}

/* Answers every whole command in c's buffer; false: drop the client. */
static inline int fc_serve(fc_node *f, fc_client *c) {
  char *out = NULL;
  size_t olen = 0, ocap = 0;
  size_t off = 0;
  int ok = 1;
  for (;;) {
    const char *argv[4] = {0};
    size_t argl[4] = {0};
    int argc = 0;
    long n = fc_parse(c->buf + off, c->len - off, argv, argl, &argc);
    if (n < 0) ok = 0;
    if (n <= 0) break;
    off += (size_t)n;
    if (argc >= 2 && fc_is(argv[0], argl[0], "CLUSTER") && fc_is(argv[1], argl[1], "SLOTS")) {
      atomic_fetch_add(&f->slots_asked, 1);
      fc_append(&out, &olen, &ocap, f->map_bytes, f->map_len);
    } else if (argc >= 2 && (fc_is(argv[0], argl[0], "SET") || fc_is(argv[0], argl[0], "GET") ||
                             fc_is(argv[0], argl[0], "STRLEN") || fc_is(argv[0], argl[0], "DEL"))) {
      atomic_fetch_add(&f->data_cmds, 1);
      if (f->moved_port)
        fc_appendf(&out, &olen, &ocap, "-MOVED %u 127.0.0.1:%d\r\n",
                   kvbm__cluster_keyslot(argv[1], argl[1]), f->moved_port);
      else if (fc_is(argv[0], argl[0], "SET"))
        fc_append(&out, &olen, &ocap, "+OK\r\n", 5);
      else if (fc_is(argv[0], argl[0], "GET"))
        fc_append(&out, &olen, &ocap, "$-1\r\n", 5);
      else
        fc_append(&out, &olen, &ocap, ":0\r\n", 4);
    } else if (argc >= 1 && (fc_is(argv[0], argl[0], "ASKING") || fc_is(argv[0], argl[0], "AUTH") ||
                             fc_is(argv[0], argl[0], "SELECT") || fc_is(argv[0], argl[0], "PING"))) {
      fc_append(&out, &olen, &ocap, "+OK\r\n", 5);
    } else {
      fc_append(&out, &olen, &ocap, "-ERR unknown command\r\n", 22);
    }
  }
  memmove(c->buf, c->buf + off, c->len - off);
  c->len -= off;
  if (olen) {
    if (f->delay_ms) usleep((useconds_t)f->delay_ms * 1000u); /* the slow node's behaviour */
    fc_send(c->fd, out, olen);
  }
  free(out);
  return ok;
}

static inline void *fc_main(void *p) {
  fc_node *f = p;
  fc_client cl[FC_CLIENTS];
  int ncl = 0;
  for (;;) {
    struct pollfd pf[FC_CLIENTS + 2];
    pf[0] = (struct pollfd){.fd = f->wake[0], .events = POLLIN};
    pf[1] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
    for (int i = 0; i < ncl; i++) pf[2 + i] = (struct pollfd){.fd = cl[i].fd, .events = POLLIN};
    if (poll(pf, (nfds_t)(2 + ncl), -1) < 0) continue;
    if (pf[0].revents) break;
    if (pf[1].revents & POLLIN) {
      int fd = accept(f->lfd, NULL, NULL);
      int one = 1; /* replies go at once, as Redis's do (no Nagle wait on our ACKs) */
      if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (fd >= 0 && ncl < FC_CLIENTS) cl[ncl++] = (fc_client){fd, NULL, 0, 0};
      else if (fd >= 0) close(fd);
    }
    for (int i = ncl - 1; i >= 0; i--) {
      if (!pf[2 + i].revents) continue;
      char tmp[65536];
      ssize_t r = read(cl[i].fd, tmp, sizeof tmp);
      int keep = r > 0;
      if (keep) {
        fc_append(&cl[i].buf, &cl[i].len, &cl[i].cap, tmp, (size_t)r);
        keep = fc_serve(f, &cl[i]);
      }
      if (!keep) {
        close(cl[i].fd);
        free(cl[i].buf);
        cl[i] = cl[--ncl];
      }
    }
  }
  for (int i = 0; i < ncl; i++) {
    close(cl[i].fd);
    free(cl[i].buf);
  }
  return NULL;
}

/* Binds a free loopback port (f->port); the node serves once fc_start
 * runs. Split in two so that two nodes can name each other. 0 or -1. */
static inline int fc_bind(fc_node *f) {
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) ||
      getsockname(f->lfd, (struct sockaddr *)&a, &l) || listen(f->lfd, 64))
    return -1;
  f->port = ntohs(a.sin_port);
  return 0;
}

static inline int fc_start(fc_node *f) {
  atomic_init(&f->slots_asked, 0);
  atomic_init(&f->data_cmds, 0);
  fc_build_map(f);
  if (pipe(f->wake)) return -1;
  return pthread_create(&f->t, NULL, fc_main, f) ? -1 : 0;
}

static inline void fc_stop(fc_node *f) {
  if (write(f->wake[1], "x", 1) < 0) {
  }
  pthread_join(f->t, NULL);
  close(f->wake[0]);
  close(f->wake[1]);
  close(f->lfd);
  free(f->map_bytes);
  f->map_bytes = NULL;
}

#endif
