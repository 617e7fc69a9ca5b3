/* SPDX-License-Identifier: Apache-2.0 */
/*
 * snapshot.c: the router daemon's warm restart.
 *
 * A router that restarts empty routes blind until every worker has sent
 * its blocks again, which for a busy cache is never. So the daemon writes
 * its index to a file (cfg.snapshot_path) every snapshot_every_s and when
 * it stops, and loads it when it starts: then it applies only the input
 * that came after the snapshot.
 *
 * Where "after" begins is per source. A JetStream source knows the stream
 * position of the last batch it applied (js_pos, kept under the writer
 * lock, so that it is exactly the input the index snapshot holds); the
 * file keeps it, and on start the source's durable consumer is re-bound
 * there (kvbm_js_consumer resume_after): every batch after the snapshot
 * comes again from the stream, whatever was acked meanwhile, and nothing
 * is asked of the engine. A ZMQ source has no such log: it asks the
 * engine's replay socket for the batches from the worker's next id (the
 * index snapshot keeps each worker's sequence state), as a late joiner
 * does; what the engine no longer keeps is lost, and the worker DEGRADED.
 * Batches that come twice (a JetStream redelivery, a replay that overlaps)
 * are duplicates by the index's id rules.
 *
 * File: "KVBMRTR\1", u32 version 1, u32 sources; per source u64 worker id,
 * u32 kind, u32 0, u64 position; u64 length and the index snapshot
 * (kvbm_index_snapshot: canonical, checked on its own); u64 XXH3 of all
 * before it. Little-endian. Written to a temporary file, synced and renamed
 * over the old one, so a crash leaves one whole snapshot or the other.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "router/daemon_impl.h"

#define MAGIC "KVBMRTR\1"
#define HEAD 16
#define PER_SOURCE 24

static int write_file(const char *path, const uint8_t *buf, size_t len, kvbm_error *err) {
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 16);
  if (!tmp) return kvbm_error_set(err, KVBM_ENOMEM, "router: snapshot: out of memory");
  snprintf(tmp, pl + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp), rc = KVBM_OK;
  if (fd < 0) {
    rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: %s", tmp, strerror(errno));
    free(tmp);
    return rc;
  }
  for (size_t off = 0; off < len && !rc;) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: %s", tmp, strerror(errno));
    else off += (size_t)w;
  }
  if (!rc && fsync(fd)) rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot: fsync: %s", strerror(errno));
  if (close(fd) && !rc) rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot: close: %s", strerror(errno));
  if (!rc && rename(tmp, path))
    rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  free(tmp);
  return rc;
}

int kvbm__rd_snapshot_save(kvbm_router_daemon *d, kvbm_error *err) {
  if (!d->cfg.snapshot_path) return KVBM_OK;
  uint8_t *ix = NULL;
  size_t ixlen = 0;
  uint64_t *pos = calloc(d->nsrc + 1, sizeof *pos);
  if (!pos) return kvbm_error_set(err, KVBM_ENOMEM, "router: snapshot: out of memory");
  /* the index and the positions together: no batch is applied meanwhile */
  pthread_mutex_lock(&d->wlock);
  kvbm__approx_withdraw(d->approx);
  kvbm__approx_withdraw(d->degraded_ap);
  int rc = kvbm_index_snapshot(d->idx, &ix, &ixlen, err);
  kvbm__approx_return(d->approx);
  kvbm__approx_return(d->degraded_ap);
  for (size_t i = 0; i < d->nsrc; i++) pos[i] = d->src[i].js_pos;
  pthread_mutex_unlock(&d->wlock);
  size_t len = HEAD + PER_SOURCE * d->nsrc + 8 + ixlen + 8;
  uint8_t *buf = rc ? NULL : malloc(len);
  if (!rc && !buf) rc = kvbm_error_set(err, KVBM_ENOMEM, "router: snapshot: out of memory");
  if (!rc) {
    uint8_t *p = buf;
    memcpy(p, MAGIC, 8);
    kvbm__put_le(p + 8, 1, 4);
    kvbm__put_le(p + 12, d->nsrc, 4);
    p += HEAD;
    for (size_t i = 0; i < d->nsrc; i++, p += PER_SOURCE) {
      kvbm__put_le(p, d->src[i].cfg.worker_id, 8);
      kvbm__put_le(p + 8, (uint64_t)d->src[i].cfg.kind, 4);
      kvbm__put_le(p + 12, 0, 4);
      kvbm__put_le(p + 16, pos[i], 8);
    }
    kvbm__put_le(p, ixlen, 8);
    memcpy(p + 8, ix, ixlen);
    p += 8 + ixlen;
    kvbm__put_le(p, kvbm_hash_salt(buf, (size_t)(p - buf)), 8);
    rc = write_file(d->cfg.snapshot_path, buf, len, err);
  }
  free(buf);
  free(ix);
  free(pos);
  pthread_mutex_lock(&d->snap_mu);
  if (rc) d->snapshot_failures++;
  else d->snapshots++;
  pthread_mutex_unlock(&d->snap_mu);
  return rc;
}

/* After the index is restored: each ZMQ source joins its engine's stream
 * at the lowest next id of the worker's ranks. */
static void zmq_resume(kvbm_router_daemon *d) {
  for (size_t i = 0; i < d->nsrc; i++) {
    source *s = &d->src[i];
    if (s->cfg.kind != KVBM_SOURCE_ZMQ) continue;
    uint64_t best = UINT64_MAX;
    for (uint32_t slot = 0; slot < KVBM_ROUTER_MAX_WORKERS; slot++) {
      kvbm_worker_key k;
      uint64_t next;
      if (kvbm_index_slot_worker(d->idx, slot, &k) && k.worker_id == s->cfg.worker_id &&
          kvbm_index_next_id(d->idx, k, &next) == KVBM_OK && next < best)
        best = next;
    }
    if (best != UINT64_MAX && best < (uint64_t)INT64_MAX) s->resume_after = best + 1;
  }
}

int kvbm__rd_snapshot_load(kvbm_router_daemon *d, kvbm_error *err) {
  const char *path = d->cfg.snapshot_path;
  if (!path) return KVBM_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      kvbm__rd_log(d, "snapshot %s: none yet, the index starts empty", path);
      return KVBM_OK;
    }
    return kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: %s", path, strerror(errno));
  }
  struct stat st;
  uint8_t *buf = NULL;
  int rc = KVBM_OK;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode))
    rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: not a regular file", path);
  else if ((uint64_t)st.st_size > ((uint64_t)1 << 40) || st.st_size < HEAD + 16)
    rc = kvbm_error_set(err, KVBM_EFORMAT, "router: snapshot %s: %lld bytes", path,
                        (long long)st.st_size);
  else if (!(buf = malloc((size_t)st.st_size)))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "router: snapshot: out of memory");
  size_t len = 0;
  while (!rc && len < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + len, (size_t)st.st_size - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) rc = kvbm_error_set(err, KVBM_EIO, "router: snapshot %s: short read", path);
    else len += (size_t)r;
  }
  close(fd);
  const uint8_t *p = buf, *end = buf + len - 8;
  if (!rc && memcmp(p, MAGIC, 8))
    rc = kvbm_error_set(err, KVBM_EMAGIC, "router: %s is not a router snapshot", path);
  if (!rc && kvbm__get_le(p + 8, 4) != 1)
    rc = kvbm_error_set(err, KVBM_EVERSION, "router: snapshot %s: version %u", path,
                        (unsigned)kvbm__get_le(p + 8, 4));
  if (!rc && kvbm__get_le(end, 8) != kvbm_hash_salt(buf, len - 8))
    rc = kvbm_error_set(err, KVBM_ECHECKSUM, "router: snapshot %s: checksum mismatch", path);
  uint64_t n = rc ? 0 : kvbm__get_le(p + 12, 4);
  if (!rc && n > (size_t)(end - p - HEAD) / PER_SOURCE)
    rc = kvbm_error_set(err, KVBM_EFORMAT, "router: snapshot %s: %llu sources", path,
                        (unsigned long long)n);
  if (!rc) {
    p += HEAD;
    for (uint64_t i = 0; i < n; i++, p += PER_SOURCE) {
      uint64_t wid = kvbm__get_le(p, 8), pos = kvbm__get_le(p + 16, 8);
      for (size_t k = 0; k < d->nsrc; k++)
        if (d->src[k].cfg.worker_id == wid && (uint64_t)d->src[k].cfg.kind == kvbm__get_le(p + 8, 4) &&
            d->src[k].cfg.kind == KVBM_SOURCE_JETSTREAM && pos) {
          d->src[k].resume_after = pos;
          d->src[k].js_pos = pos;
          /* /health's position too: it was 0 until the next batch, so a
           * restored router of a worker that sends nothing more looked as
           * if it had read nothing (the W5 run's recovery probe waited) */
          atomic_store(&d->src[k].n.js_pos, pos);
        }
    }
    uint64_t ixlen = kvbm__get_le(p, 8);
    if (ixlen != (uint64_t)(end - p - 8))
      rc = kvbm_error_set(err, KVBM_EFORMAT, "router: snapshot %s: index of %llu bytes in %zu",
                          path, (unsigned long long)ixlen, (size_t)(end - p - 8));
    else
      rc = kvbm_index_restore(d->idx, p + 8, (size_t)ixlen, err);
  }
  free(buf);
  if (rc) { /* nothing half-loaded stays: the router starts as if none */
    for (size_t k = 0; k < d->nsrc; k++) d->src[k].resume_after = d->src[k].js_pos = 0;
    return rc;
  }
  zmq_resume(d);
  kvbm_index_stats ist;
  kvbm_index_stats_get(d->idx, &ist);
  kvbm__rd_log(d, "snapshot %s: %u workers, %" PRIu64 " blocks loaded", path, ist.workers,
               ist.entries);
  return KVBM_OK;
}

static void *snap_main(void *arg) {
  kvbm_router_daemon *d = arg;
  pthread_mutex_lock(&d->snap_mu);
  while (!d->snap_stop) {
    /* snapshot_every_s <= 1e6 (checked at create): well within u64 ns */
    struct timespec dl =
        kvbm__deadline_after_ns(CLOCK_MONOTONIC, (uint64_t)(d->cfg.snapshot_every_s * 1e9));
    while (!d->snap_stop && pthread_cond_timedwait(&d->snap_cv, &d->snap_mu, &dl) != ETIMEDOUT) {
    }
    if (d->snap_stop) break;
    pthread_mutex_unlock(&d->snap_mu);
    kvbm_error err = {0};
    if (kvbm__rd_snapshot_save(d, &err)) kvbm__rd_log(d, "snapshot: %s", err.msg);
    pthread_mutex_lock(&d->snap_mu);
  }
  pthread_mutex_unlock(&d->snap_mu);
  return NULL;
}

int kvbm__rd_snapshot_start(kvbm_router_daemon *d, kvbm_error *err) {
  if (!d->cfg.snapshot_path || d->cfg.snapshot_every_s <= 0) return KVBM_OK;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_destroy(&d->snap_cv);
  pthread_cond_init(&d->snap_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&d->snap_th, NULL, snap_main, d))
    return kvbm_error_set(err, KVBM_ENOMEM, "router: cannot start the snapshot thread");
  d->snap_started = true;
  return KVBM_OK;
}

void kvbm__rd_snapshot_stop(kvbm_router_daemon *d) {
  pthread_mutex_lock(&d->snap_mu);
  d->snap_stop = true;
  pthread_cond_broadcast(&d->snap_cv);
  pthread_mutex_unlock(&d->snap_mu);
  if (d->snap_started) pthread_join(d->snap_th, NULL);
  d->snap_started = false;
  if (!d->snap_armed || !d->cfg.snapshot_path) return; /* a failed create keeps the old file */
  kvbm_error err = {0};
  if (kvbm__rd_snapshot_save(d, &err)) kvbm__rd_log(d, "last snapshot: %s", err.msg);
  else kvbm__rd_log(d, "last snapshot written to %s", d->cfg.snapshot_path);
  d->snap_armed = false;
}
