/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume/internal.h: what the volume module's files share (private to
 * src/volume/): the parsed descriptor, the key and namespace rules, and the
 * built-in backends.
 *
 * A built-in backend is an ordinary kvbm_volume_backend (kvbm/volume.h);
 * the only thing it gets that a vendor's does not is its `user` argument:
 * the core hands it a kvbm__volume_ctx (the parsed URL and the counters a
 * caller cannot see from the ops alone, such as reconnects).
 */
#ifndef KVBM_VOLUME_INTERNAL_H
#define KVBM_VOLUME_INTERNAL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"
#include "kvbm/volume.h"

#define KVBM__VOLUME_URL_MAX 4096  /* bytes of a descriptor, NUL excluded */
#define KVBM__VOLUME_HOSTS_MAX 16  /* seeds of a redis+cluster:// URL */
#define KVBM__VOLUME_HOST_MAX 255  /* bytes of one host name */
#define KVBM__VOLUME_NS_MAX 200    /* bytes of a key namespace */
#define KVBM__VOLUME_SCHEME_MAX 32 /* bytes of a scheme */
/* "<namespace>/<16 hex digits>" and its NUL. */
#define KVBM__VOLUME_KEY_MAX (KVBM__VOLUME_NS_MAX + 1 + 16 + 1)

typedef enum kvbm__volume_kind {
  KVBM__VOLUME_OTHER = 0, /* a caller's scheme: only the scheme is checked */
  KVBM__VOLUME_FILE,
  KVBM__VOLUME_DISK,
  KVBM__VOLUME_REDIS,
  KVBM__VOLUME_CLUSTER,
} kvbm__volume_kind;

typedef struct kvbm__volume_host {
  char host[KVBM__VOLUME_HOST_MAX + 1]; /* without IPv6 brackets */
  uint16_t port;
} kvbm__volume_host;

/* A parsed descriptor. Strings are decoded (%XX) and NUL-terminated. */
typedef struct kvbm__volume_url {
  kvbm__volume_kind kind;
  char scheme[KVBM__VOLUME_SCHEME_MAX + 1]; /* lower case */
  char user[256];                           /* redis ACL user ("": none) */
  char password[256];                       /* "" with has_password false: none */
  bool has_password;
  kvbm__volume_host hosts[KVBM__VOLUME_HOSTS_MAX];
  uint32_t nhosts;
  char path[PATH_MAX]; /* file://, disk://: the directory (absolute) */
  /* disk:// options from the query (?direct=0&uring=0&depth=8): -1 unset */
  int disk_direct, disk_uring;
  int disk_depth;
  uint32_t disk_test_refuse; /* ?test_refuse=direct,uring (tests only) */
  uint32_t db;         /* redis://: the database */
  char display[KVBM__VOLUME_URL_MAX + 1]; /* the URL without user info */
} kvbm__volume_url;

/* Parses a descriptor (see kvbm/volume.h for the forms). KVBM_EINVAL names
 * what is wrong and where; an unknown scheme parses as KVBM__VOLUME_OTHER
 * (the caller decides whether a backend serves it). Never reads past the
 * NUL or KVBM__VOLUME_URL_MAX + 1 bytes. */
int kvbm__volume_url_parse(const char *url, kvbm__volume_url *out, kvbm_error *err);

/* Checks a key namespace: [A-Za-z0-9._:-]{0,200}, and not "." or "..".
 * NULL is the empty namespace. */
int kvbm__volume_ns_check(const char *ns, kvbm_error *err);

/* Writes the stored key "<ns>/<16 lower-case hex digits>" (just the digits
 * when ns is empty) to out (KVBM__VOLUME_KEY_MAX bytes); returns its
 * length. ns must have passed kvbm__volume_ns_check. */
size_t kvbm__volume_key(const char *ns, uint64_t key, char *out);

/* The 16 hex digits of a key (a file name). out has 17 bytes. */
void kvbm__volume_hex(uint64_t key, char *out);

/* What a built-in backend's open() gets as `user`. */
typedef struct kvbm__volume_ctx {
  const kvbm__volume_url *url;
  const kvbm_volume_config *cfg; /* the volume's own copy (strings kept) */
  const char *ns;                /* never NULL */
  uint64_t max_value_bytes;
  atomic_uint_fast64_t reconnects; /* connections re-established */
  /* redis+cluster:// (cluster.c): the state its I/O threads share (made
   * by the first open, freed by the last close, both on the registering
   * thread) and its counters (kvbm_volume_stats) */
  void *cluster;
  atomic_uint_fast64_t slot_refreshes, slot_refreshes_limited, redirect_loops, slot_maps_refused;
  bool disk_keyed;                 /* disk://: keyed sums, with this key */
  uint8_t disk_key[32];
} kvbm__volume_ctx;

#define KVBM__VOLUME_DISK_KEY_MIN 16u
#define KVBM__VOLUME_DISK_KEY_MAX 4096u

/* A backend reports a value that failed its own check (a torn slot, a
 * non-regular file, a key of the wrong type) with this status; the core
 * counts it in `corrupt` and keeps it for a get (a miss the tier above
 * counts apart from a missing block), KVBM_ENOTFOUND otherwise. */
#define KVBM__VOLUME_CORRUPT KVBM_ECHECKSUM

/* A built-in backend that streams (one I/O thread): the core hands it the
 * next batch while the previous one's transfers are still in flight, and
 * completes batches in order as their ops finish. */
typedef struct kvbm__volume_stream {
  /* Starts ops[0..n) in order after everything started before (reaping
   * older transfers when it needs room); each op finished, here or by a
   * later reap, decrements *left, which must stay valid until then. */
  void (*issue)(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns, size_t *left);
  /* Waits for one transfer in flight and finishes it; false if none is. */
  bool (*reap)(void *state);
} kvbm__volume_stream;

extern const kvbm__volume_stream kvbm__volume_disk_stream;

extern const kvbm_volume_backend kvbm__volume_file_backend;
extern const kvbm_volume_backend kvbm__volume_disk_backend;
extern const kvbm_volume_backend kvbm__volume_redis_backend;
extern const kvbm_volume_backend kvbm__volume_cluster_backend;

#endif
