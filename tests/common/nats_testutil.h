/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats_testutil.h: a real nats-server for the tests that need one.
 *
 * The tests that speak NATS (events, advisor, router) start their own
 * nats-server on a free loopback port and stop it at the end, optionally
 * with JetStream and its file store in a fresh directory. This header is
 * that fixture, once: static functions only, so that a test includes it
 * and links nothing more than its own module and libnats.
 *
 *   nt_server s;
 *   if (nt_start(&s, false)) ...;     url in s.url
 *   nt_kill(&s); nt_launch(&s);        a restart on the same port and store
 *   nt_stop(&s); nats_Close();         the server gone, its store removed
 *
 * The server's output goes to /dev/null (an inherited pipe would make
 * ctest wait for it) and it dies with the test (PR_SET_PDEATHSIG), so a
 * test that crashes before its teardown leaves no server behind. Being
 * "up" means accepting a connection, and with JetStream also answering an
 * account-info request: the stream API is what those tests use first.
 * nats_Close() stays with the caller, since it ends libnats for the whole
 * process.
 */
#ifndef KVBM_TESTS_NATS_TESTUTIL_H
#define KVBM_TESTS_NATS_TESTUTIL_H

#include <arpa/inet.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NT_SERVER /* a test build may point elsewhere (e.g. to check the skip) */
#define NT_SERVER "/usr/sbin/nats-server"
#endif

typedef struct nt_server {
  pid_t pid;      /* 0: not running */
  int port;
  char url[64];   /* nats://127.0.0.1:<port> */
  char store[64]; /* the JetStream store ("": no JetStream) */
} nt_server;

static inline bool nt_installed(void) { return access(NT_SERVER, X_OK) == 0; }

/* A loopback port nobody listened on a moment ago (also what a test uses
 * for "nobody there"). */
static inline int nt_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(fd, (struct sockaddr *)&a, sizeof a);
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

/* Whether the server at url is up: it accepts a connection and, when
 * jetstream, answers for its account's JetStream. */
static inline bool nt_ready(const char *url, bool jetstream) {
  natsConnection *nc;
  if (natsConnection_ConnectTo(&nc, url) != NATS_OK) return false;
  bool ok = true;
  if (jetstream) {
    jsCtx *js = NULL;
    jsAccountInfo *ai = NULL;
    ok = natsConnection_JetStream(&js, nc, NULL) == NATS_OK &&
         js_GetAccountInfo(&ai, js, NULL, NULL) == NATS_OK;
    jsAccountInfo_Destroy(ai);
    jsCtx_Destroy(js);
  }
  natsConnection_Destroy(nc);
  return ok;
}

/* Stops the server (SIGTERM, waited for); the store stays, for a
 * restart with nt_launch. */
static inline void nt_kill(nt_server *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
  }
  s->pid = 0;
}

/* Runs the server on s->port (with s->store when set) and waits until it
 * is up (15 s at most). 0, or -1 with a line on stderr and the server
 * stopped. */
static inline int nt_launch(nt_server *s) {
  bool js = s->store[0] != '\0';
  s->pid = fork();
  if (s->pid < 0) {
    s->pid = 0;
    perror("fork");
    return -1;
  }
  if (s->pid == 0) {
    char p[16];
    snprintf(p, sizeof p, "%d", s->port);
    if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (js)
      execl(NT_SERVER, NT_SERVER, "-js", "-sd", s->store, "-a", "127.0.0.1", "-p", p, (char *)NULL);
    else
      execl(NT_SERVER, NT_SERVER, "-a", "127.0.0.1", "-p", p, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 300; i++) {
    if (nt_ready(s->url, js)) return 0;
    usleep(50000);
  }
  fprintf(stderr, "nats-server%s did not start on %s\n", js ? " -js" : "", s->url);
  nt_kill(s);
  return -1;
}

/* Stops the server and removes its store. Safe on a server that never
 * started. */
static inline void nt_stop(nt_server *s) {
  nt_kill(s);
  if (s->store[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->store);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", s->store);
    s->store[0] = '\0';
  }
}

/* Starts a server on a free port, with JetStream and a fresh store
 * directory when jetstream. 0, or -1 with a line on stderr (nothing left
 * running, no store left behind). */
static inline int nt_start(nt_server *s, bool jetstream) {
  memset(s, 0, sizeof *s);
  if (!nt_installed()) {
    fprintf(stderr, "no %s\n", NT_SERVER);
    return -1;
  }
  if (jetstream) {
    snprintf(s->store, sizeof s->store, "/tmp/kvbm_nats_XXXXXX");
    if (!mkdtemp(s->store)) {
      perror("mkdtemp");
      s->store[0] = '\0';
      return -1;
    }
  }
  s->port = nt_free_port();
  snprintf(s->url, sizeof s->url, "nats://127.0.0.1:%d", s->port);
  if (nt_launch(s) == 0) return 0;
  nt_stop(s); /* a failed group setup gets no teardown */
  return -1;
}

#endif
