/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/sendbuf.h: sending a queued answer on a non-blocking socket, the
 * loop both HTTP servers (the router's and the metrics endpoint's) had
 * each written; its one user now is the HTTP service layer they both run
 * on (src/service/service.c). Private to src/; header-only: one small
 * loop on the write path. The protocol stays in common/http.c, which
 * knows no sockets.
 */
#ifndef KVBM_COMMON_SENDBUF_H
#define KVBM_COMMON_SENDBUF_H

#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Sends buf[*off..len) on non-blocking socket fd, advancing *off, until
 * all is out or the socket would block; never raises SIGPIPE. Returns 1
 * when all is out, 0 when the socket would block (the rest waits for
 * POLLOUT), -1 when the connection failed (errno says how). */
static inline int kvbm__send_pending(int fd, const char *buf, size_t len, size_t *off) {
  while (*off < len) {
    ssize_t n = send(fd, buf + *off, len - *off, MSG_NOSIGNAL);
    if (n > 0) {
      *off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  return 1;
}

#endif
