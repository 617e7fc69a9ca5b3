/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sidechan.c: the TCP side channel used to bootstrap the UCX fabric.
 *
 * UCX endpoints are created from the peer's worker address, which has to
 * travel some other way first; a plain TCP connection is the simplest
 * thing that works between two processes (the same thing ucx_perftest
 * does). Design choices:
 *  - blocking file descriptors, but every wait goes through poll() with a
 *    deadline, so a silent or dead peer turns into KVBM_ETIMEDOUT or
 *    KVBM_ECLOSED and never a hang;
 *  - records are length-prefixed and the receiver checks the length
 *    against a caller-given maximum before it allocates anything, because
 *    the peer is not trusted;
 *  - MSG_NOSIGNAL on send: a vanished peer is an error code, not SIGPIPE.
 */
#include "fabric/sidechan.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/bytes.h"
#include "common/clock.h"


int64_t kvbm__sc_now_ms(void) { return (int64_t)(kvbm_clock_ns() / 1000000u); }

int64_t kvbm__sc_deadline(int timeout_ms) {
  if (timeout_ms < 0) return INT64_MAX;
  return kvbm__sc_now_ms() + timeout_ms;
}

/* Milliseconds left before the deadline, clamped for poll(). */
static int remaining_ms(int64_t deadline_ms) {
  if (deadline_ms == INT64_MAX) return -1;
  int64_t left = deadline_ms - kvbm__sc_now_ms();
  if (left < 0) return 0;
  if (left > 1000000) return 1000000;
  return (int)left;
}

/* Waits for `events` on fd; KVBM_OK when ready. */
static int wait_fd(int fd, short events, int64_t deadline_ms, const char *what,
                   kvbm_error *err) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, remaining_ms(deadline_ms));
    if (r > 0) return KVBM_OK;
    if (r == 0)
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: side channel: timed out waiting to %s", what);
    if (errno != EINTR)
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: poll: %s", strerror(errno));
  }
}

static int resolve(const char *host, uint16_t port, struct sockaddr_in *sa,
                   kvbm_error *err) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(port);
  if (!host || !*host) host = "127.0.0.1";
  if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return KVBM_OK;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: side channel: cannot resolve host '%s': %s",
                          host, gai_strerror(rc));
  sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return KVBM_OK;
}

int kvbm__sc_listen(const char *host, uint16_t port, int *fd, uint16_t *bound_port,
                   kvbm_error *err) {
  struct sockaddr_in sa;
  int rc = resolve(host, port, &sa, err);
  if (rc) return rc;
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: socket: %s", strerror(errno));
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 64) != 0) {
    int e = errno;
    close(s);
    return kvbm_error_set(err, e == EADDRINUSE ? KVBM_EEXIST : KVBM_EIO,
                          "fabric: side channel: cannot listen on %s:%u: %s",
                          host ? host : "127.0.0.1", (unsigned)port, strerror(e));
  }
  socklen_t len = sizeof sa;
  getsockname(s, (struct sockaddr *)&sa, &len);
  *fd = s;
  if (bound_port) *bound_port = ntohs(sa.sin_port);
  return KVBM_OK;
}

static void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int kvbm__sc_accept(int lfd, int timeout_ms, int *fd, kvbm_error *err) {
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  for (;;) {
    int rc = wait_fd(lfd, POLLIN, deadline, "accept a peer", err);
    if (rc) return rc;
    int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (s >= 0) {
      tune(s);
      *fd = s;
      return KVBM_OK;
    }
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: accept: %s", strerror(errno));
  }
}

/* One non-blocking connect attempt, waited for until the deadline (a
 * blocking connect to an unreachable host would ignore it). Returns 0, or
 * the errno of the failure. */
static int connect_once(int s, const struct sockaddr_in *sa, int64_t deadline_ms) {
  int fl = fcntl(s, F_GETFL);
  fcntl(s, F_SETFL, fl | O_NONBLOCK);
  int e = 0;
  if (connect(s, (const struct sockaddr *)sa, sizeof *sa) != 0) {
    e = errno;
    if (e == EINPROGRESS) {
      struct pollfd p = {.fd = s, .events = POLLOUT};
      int r;
      do r = poll(&p, 1, remaining_ms(deadline_ms));
      while (r < 0 && errno == EINTR);
      socklen_t len = sizeof e;
      if (r == 0)
        e = ETIMEDOUT;
      else if (r < 0 || getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
        e = errno;
    }
  }
  fcntl(s, F_SETFL, fl);
  return e;
}

int kvbm__sc_connect(const char *host, uint16_t port, int timeout_ms, int *fd,
                    kvbm_error *err) {
  struct sockaddr_in sa;
  int rc = resolve(host, port, &sa, err);
  if (rc) return rc;
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  for (;;) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: socket: %s", strerror(errno));
    int e = connect_once(s, &sa, deadline);
    if (e == 0) {
      tune(s);
      *fd = s;
      return KVBM_OK;
    }
    close(s);
    if (e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT)
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: connect to %s:%u: %s",
                            host ? host : "127.0.0.1", (unsigned)port, strerror(e));
    if (e == ETIMEDOUT || kvbm__sc_now_ms() >= deadline)
      return kvbm_error_set(err, KVBM_ETIMEDOUT,
                            "fabric: side channel: nobody answers on %s:%u",
                            host ? host : "127.0.0.1", (unsigned)port);
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
  }
}

int kvbm__sc_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                     kvbm_error *err) {
  const char *p = buf;
  while (len > 0) {
    int rc = wait_fd(fd, POLLOUT, deadline_ms, "send", err);
    if (rc) return rc;
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET)
        return kvbm_error_set(err, KVBM_ECLOSED, "fabric: side channel: peer closed the connection");
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: send: %s", strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return KVBM_OK;
}

int kvbm__sc_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                     kvbm_error *err) {
  char *p = buf;
  while (len > 0) {
    int rc = wait_fd(fd, POLLIN, deadline_ms, "receive", err);
    if (rc) return rc;
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: side channel: peer closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET)
        return kvbm_error_set(err, KVBM_ECLOSED, "fabric: side channel: peer reset the connection");
      return kvbm_error_set(err, KVBM_EIO, "fabric: side channel: recv: %s", strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return KVBM_OK;
}

int kvbm__sc_send_record(int fd, const void *buf, size_t len, int64_t deadline_ms,
                        kvbm_error *err) {
  if (len > UINT32_MAX)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: side channel: record of %zu bytes", len);
  uint8_t hdr[4];
  kvbm__put_le32(hdr, (uint32_t)len);
  int rc = kvbm__sc_send_all(fd, hdr, 4, deadline_ms, err);
  if (rc) return rc;
  return kvbm__sc_send_all(fd, buf, len, deadline_ms, err);
}

int kvbm__sc_recv_record(int fd, size_t max, void **out, size_t *len,
                        int64_t deadline_ms, kvbm_error *err) {
  uint8_t hdr[4];
  int rc = kvbm__sc_recv_all(fd, hdr, 4, deadline_ms, err);
  if (rc) return rc;
  size_t n = kvbm__get_le32(hdr);
  if (n > max)
    return kvbm_error_set(err, KVBM_EPROTO,
                          "fabric: side channel: peer announced a %zu-byte record (limit %zu)", n, max);
  void *buf = malloc(n ? n : 1);
  if (!buf) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: side channel: out of memory");
  rc = kvbm__sc_recv_all(fd, buf, n, deadline_ms, err);
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  *len = n;
  return KVBM_OK;
}
