/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_redis.h: a hostile Redis for the G4 tests and the G4 fault bench
 * (bench/bench_g4_prefill.c): a thread speaking RESP on loopback that keeps
 * what it is given with SET (while GOOD; a faulty store keeps nothing new),
 * answers STRLEN with a length for every key
 * (a liar) unless it is GOOD, and answers GET of a key it does not hold by
 * trickling a value a byte every 50 ms, by never answering (STALL), with
 * an error, or with garbage. With hold_ms, answers to GETs of keys it
 * holds are held back that long; a GET of the key ending in `poison` is an
 * error at once. Pipelined commands wait behind an answer still owed, as
 * on one Redis connection. Header-only, for tests and benchmarks.
 */
#ifndef KVBM_TESTS_FAKE_REDIS_H
#define KVBM_TESTS_FAKE_REDIS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static inline double fake_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { GOOD, TRICKLE, STALL, ERROR, GARBAGE };

#define MAXC 64
#define MAXKEYS 4096

typedef struct fconn {
  int fd;
  char in[1 << 16];
  size_t in_len;
  char out[1 << 12];
  size_t out_len, out_off;
  double hold_until;   /* out is sent then (a held-back answer) */
  size_t trickle_left; /* bytes still to trickle, one per tick */
  double next_drip;
  bool stalled;        /* never answers again */
} fconn;

typedef struct fake {
  int lfd, port;
  pthread_t th;
  pthread_mutex_t mu;
  bool stop;
  int mode;               /* for GETs of keys it does not hold */
  char poison[17];        /* GET of a key ending so: an error at once */
  int hold_ms;            /* GETs of held keys answered this late */
  char *keys[MAXKEYS];
  char *vals[MAXKEYS];
  size_t lens[MAXKEYS], nkeys;
  uint64_t gets, strlens, sets, cmds;
  fconn c[MAXC];
} fake;

static inline void f_out(fconn *c, const void *p, size_t n) {
  if (c->out_len + n > sizeof c->out) return; /* only small replies are queued */
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
}

static inline void f_status(fconn *c, const char *s) { f_out(c, s, strlen(s)); }

static inline int f_find(fake *f, const char *k, size_t kl) {
  for (size_t i = 0; i < f->nkeys; i++)
    if (strlen(f->keys[i]) == kl && !memcmp(f->keys[i], k, kl)) return (int)i;
  return -1;
}

/* Sends a value at once (blocking: values are a few KB), in one writev
 * behind what is queued. */
static inline void f_value(fconn *c, const char *v, size_t n) {
  char h[32];
  int hl = snprintf(h, sizeof h, "$%zu\r\n", n);
  struct iovec iov[4] = {{c->out + c->out_off, c->out_len - c->out_off},
                         {h, (size_t)hl},
                         {(void *)v, n},
                         {"\r\n", 2}};
  c->out_len = c->out_off = 0;
  int k = 0;
  while (k < 4) {
    ssize_t w = writev(c->fd, iov + k, 4 - k);
    if (w <= 0) return;
    while (k < 4 && (size_t)w >= iov[k].iov_len) w -= (ssize_t)iov[k++].iov_len;
    if (k < 4) {
      iov[k].iov_base = (char *)iov[k].iov_base + w;
      iov[k].iov_len -= (size_t)w;
    }
  }
}

/* One command: argv[0..argc) with lengths. Lock held. */
static inline void f_command(fake *f, fconn *c, int argc, char **argv, size_t *len, double now) {
  f->cmds++;
  char name[16] = {0};
  for (size_t i = 0; i < len[0] && i < sizeof name - 1; i++)
    name[i] = (char)(argv[0][i] & ~0x20);
  if (!strcmp(name, "SET") && argc >= 3) {
    f->sets++;
    int i = f->mode == GOOD ? f_find(f, argv[1], len[1]) : -2; /* a faulty store keeps nothing */
    if (i == -1 && f->nkeys < MAXKEYS) {
      i = (int)f->nkeys++;
      f->keys[i] = strndup(argv[1], len[1]);
      f->vals[i] = NULL;
    }
    if (i >= 0) {
      free(f->vals[i]);
      f->vals[i] = malloc(len[2]);
      memcpy(f->vals[i], argv[2], len[2]);
      f->lens[i] = len[2];
    }
    f_status(c, "+OK\r\n");
  } else if (!strcmp(name, "STRLEN") && argc >= 2) {
    f->strlens++;
    int i = f_find(f, argv[1], len[1]);
    char r[32];
    snprintf(r, sizeof r, ":%zu\r\n", i >= 0 ? f->lens[i] : f->mode == GOOD ? 0 : (size_t)480);
    f_status(c, r);
  } else if (!strcmp(name, "GET") && argc >= 2) {
    f->gets++;
    int i = f_find(f, argv[1], len[1]);
    if (f->poison[0] && len[1] >= 16 && !memcmp(argv[1] + len[1] - 16, f->poison, 16)) {
      f_status(c, "-ERR injected\r\n");
    } else if (i >= 0 && f->hold_ms) {
      char h[32];
      int hl = snprintf(h, sizeof h, "$%zu\r\n", f->lens[i]);
      if (hl + f->lens[i] + 2 <= sizeof c->out) {
        f_out(c, h, (size_t)hl);
        f_out(c, f->vals[i], f->lens[i]);
        f_out(c, "\r\n", 2);
        c->hold_until = now + f->hold_ms / 1000.0;
      }
    } else if (i >= 0) {
      f_value(c, f->vals[i], f->lens[i]);
    } else if (f->mode == GOOD) {
      f_status(c, "$-1\r\n");
    } else if (f->mode == TRICKLE) {
      f_status(c, "$480\r\n");
      c->trickle_left = 482;
      c->next_drip = now;
    } else if (f->mode == STALL) {
      c->stalled = true;
    } else if (f->mode == ERROR) {
      f_status(c, "-ERR injected\r\n");
    } else {
      f_status(c, "$11\r\nnot a block\r\n");
    }
  } else if (!strcmp(name, "PING")) {
    f_status(c, "+PONG\r\n");
  } else if (!strcmp(name, "DEL")) {
    f_status(c, ":1\r\n");
  } else {
    f_status(c, "+OK\r\n");
  }
}

/* Parses one RESP array of bulk strings at the front of c->in; returns the
 * bytes it took (0: incomplete). Lock held. */
static inline size_t f_parse(fake *f, fconn *c, double now) {
  char *p = c->in, *e = c->in + c->in_len;
  char *argv[8];
  size_t len[8];
  if (p >= e || *p != '*') return c->in_len ? c->in_len : 0; /* not ours: dropped */
  char *nl = memchr(p, '\n', (size_t)(e - p));
  if (!nl) return 0;
  int argc = atoi(p + 1);
  p = nl + 1;
  for (int a = 0; a < argc; a++) {
    if (p >= e || *p != '$') return 0;
    nl = memchr(p, '\n', (size_t)(e - p));
    if (!nl) return 0;
    size_t n = (size_t)atol(p + 1);
    p = nl + 1;
    if ((size_t)(e - p) < n + 2) return 0;
    if (a < 8) {
      argv[a] = p;
      len[a] = n;
    }
    p += n + 2;
  }
  if (argc >= 1) f_command(f, c, argc < 8 ? argc : 8, argv, len, now);
  return (size_t)(p - c->in);
}

static inline bool f_busy(const fconn *c, double now) {
  return c->stalled || c->trickle_left || c->out_len || now < c->hold_until;
}

static inline void *f_main(void *arg) {
  fake *f = arg;
  for (;;) {
    struct pollfd pf[MAXC + 1];
    pthread_mutex_lock(&f->mu);
    if (f->stop) {
      pthread_mutex_unlock(&f->mu);
      break;
    }
    pf[0] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
    for (int i = 0; i < MAXC; i++) pf[i + 1] = (struct pollfd){.fd = f->c[i].fd, .events = POLLIN};
    pthread_mutex_unlock(&f->mu);
    poll(pf, MAXC + 1, 5);
    pthread_mutex_lock(&f->mu);
    double now = fake_now();
    if (pf[0].revents & POLLIN) {
      int fd = accept(f->lfd, NULL, NULL);
      int i = 0;
      while (fd >= 0 && i < MAXC && f->c[i].fd >= 0) i++;
      if (fd >= 0 && i < MAXC) {
        int one = 1; /* answers go out as they are made, as Redis's do */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        memset(&f->c[i], 0, sizeof f->c[i]);
        f->c[i].fd = fd;
      } else if (fd >= 0) {
        close(fd);
      }
    }
    for (int i = 0; i < MAXC; i++) {
      fconn *c = &f->c[i];
      if (c->fd < 0) continue;
      if (pf[i + 1].fd == c->fd && (pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = read(c->fd, c->in + c->in_len, sizeof c->in - c->in_len);
        if (n <= 0) {
          close(c->fd);
          c->fd = -1;
          continue;
        }
        c->in_len += (size_t)n;
      }
      if (c->trickle_left && now >= c->next_drip) { /* a byte every 50 ms */
        (void)!write(c->fd, "x", 1);
        c->trickle_left--;
        c->next_drip = now + 0.05;
      }
      /* Pipelined commands wait behind an answer still owed. */
      for (;;) {
        if (c->out_len && now >= c->hold_until) { /* small answers: written whole */
          while (c->out_off < c->out_len) {
            ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
            if (w <= 0) break;
            c->out_off += (size_t)w;
          }
          c->out_len = c->out_off = 0;
        }
        if (f_busy(c, now) || !c->in_len) break;
        size_t took = f_parse(f, c, now);
        if (!took) break;
        memmove(c->in, c->in + took, c->in_len - took);
        c->in_len -= took;
      }
    }
    pthread_mutex_unlock(&f->mu);
  }
  return NULL;
}

/* Starts the store on a free loopback port (f->port); 0 or -1. */
static inline int fake_start(fake *f, int mode) {
  memset(f, 0, sizeof *f);
  for (int i = 0; i < MAXC; i++) f->c[i].fd = -1;
  f->mode = mode;
  pthread_mutex_init(&f->mu, NULL);
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) || listen(f->lfd, 64) ||
      getsockname(f->lfd, (struct sockaddr *)&a, &al))
    return -1;
  f->port = ntohs(a.sin_port);
  return pthread_create(&f->th, NULL, f_main, f) ? -1 : 0;
}

static inline void fake_set(fake *f, int mode, int hold_ms, const char *poison) {
  pthread_mutex_lock(&f->mu);
  f->mode = mode;
  f->hold_ms = hold_ms;
  snprintf(f->poison, sizeof f->poison, "%s", poison ? poison : "");
  pthread_mutex_unlock(&f->mu);
}

static inline uint64_t fake_count(fake *f, const uint64_t *which) {
  pthread_mutex_lock(&f->mu);
  uint64_t v = *which;
  pthread_mutex_unlock(&f->mu);
  return v;
}

static inline void fake_stop(fake *f) {
  pthread_mutex_lock(&f->mu);
  f->stop = true;
  pthread_mutex_unlock(&f->mu);
  pthread_join(f->th, NULL);
  close(f->lfd);
  for (int i = 0; i < MAXC; i++)
    if (f->c[i].fd >= 0) close(f->c[i].fd);
  for (size_t i = 0; i < f->nkeys; i++) {
    free(f->keys[i]);
    free(f->vals[i]);
  }
  pthread_mutex_destroy(&f->mu);
}

#endif
