/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sidechan.h (private): the TCP side channel of the UCX fabric.
 *
 * Two nodes need a way to swap UCX worker addresses before UCX itself can
 * carry a byte; this is it. Blocking sockets with poll()-based deadlines,
 * length-prefixed records, nothing UCX-specific (so it can be tested and
 * reasoned about on its own).
 */
#ifndef KVBM_FABRIC_SIDECHAN_H
#define KVBM_FABRIC_SIDECHAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

/* Opens a listening TCP socket on host:port (port 0 = any free port).
 * *fd receives the socket, *bound_port the port actually bound. */
int kvbm__sc_listen(const char *host, uint16_t port, int *fd,
                   uint16_t *bound_port, kvbm_error *err);

/* Waits up to timeout_ms for one connection on lfd; *fd gets it. */
int kvbm__sc_accept(int lfd, int timeout_ms, int *fd, kvbm_error *err);

/* Connects to host:port, retrying refused connections until timeout_ms (the
 * peer may not be listening yet when both are started together). */
int kvbm__sc_connect(const char *host, uint16_t port, int timeout_ms, int *fd,
                    kvbm_error *err);

/* Sends / receives exactly len bytes before the deadline (a monotonic time
 * in ms from kvbm__sc_now_ms). A closed peer is KVBM_ECLOSED. */
int kvbm__sc_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                     kvbm_error *err);
int kvbm__sc_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                     kvbm_error *err);

/* A record: u32 little-endian length, then the bytes. recv refuses (EPROTO)
 * a record longer than max before allocating; *out is malloc'd (free it). */
int kvbm__sc_send_record(int fd, const void *buf, size_t len,
                        int64_t deadline_ms, kvbm_error *err);
int kvbm__sc_recv_record(int fd, size_t max, void **out, size_t *len,
                        int64_t deadline_ms, kvbm_error *err);

/* Monotonic clock in milliseconds. */
int64_t kvbm__sc_now_ms(void);

/* A deadline timeout_ms from now (a negative timeout = no deadline). */
int64_t kvbm__sc_deadline(int timeout_ms);

#endif
