/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/volume.h: the storage interface. A volume is a store of blocks by
 * key; the G3 and G4 tiers of the manager keep their bytes in volumes, and a
 * storage vendor plugs a backend in under this header alone.
 *
 * The verbs are the KVBM seed's: register a volume from a descriptor (a URL
 * and a few settings), unregister it, put and get blocks by key, plus
 * exists and delete. Operations are batched and asynchronous: a batch is
 * submitted, runs on the volume's I/O thread(s), and its completion is
 * reported once, by a callback; kvbm_volume_run() is the synchronous form.
 *
 * Backends, chosen by the URL's scheme:
 *   disk:///DIR[?direct=0|1&uring=0|1&depth=N]
 *                      the local slot file (io_uring, O_DIRECT, checksummed
 *                      slot headers, warm restart) in DIR (a bare disk://
 *                      is the private /tmp/kvbm-<uid>); needs the
 *                      config's slots and block_bytes; one I/O thread, so
 *                      its batches run in submission order
 *   file:///DIR        one file per block under DIR, written to a temporary
 *                      name and renamed into place: two processes (or two
 *                      machines over NFS/Lustre) pointed at one directory
 *                      share blocks
 *   redis://HOST:PORT  one Redis value per block, over hiredis
 *   redis+cluster://HOST:PORT[,HOST:PORT...]
 *                      Redis Cluster: the slot map is read from the seeds,
 *                      MOVED and ASK are followed, the map is refreshed when
 *                      the cluster changes (at most once per
 *                      cluster_refresh_ms for the volume); a slot whose
 *                      redirections go in circles fails at once until the
 *                      next refresh
 * or any backend the caller passes in the config (kvbm_volume_backend):
 * see examples/volume/ for a vendor backend in a few dozen lines.
 *
 * Keys. A block's key is its 64-bit sequence hash under the volume's
 * namespace (kvbm_volume_config.key_namespace): the backend stores it as
 * "<namespace>/<16 hex digits>" (Redis key, or file name under a folder per
 * namespace; with the empty namespace, just the 16 hex digits). The
 * manager's namespace names the layout fingerprint, the hash scheme, the
 * block size and the model id, so two models or two layouts sharing one
 * store never see each other's blocks.
 *
 * Values are opaque bytes to a volume; the manager stores MRDN v1 frames
 * (kvbm/frame.h) in remote volumes, so every block carries its own
 * BLAKE3-128 check and a get never hands the engine bytes it cannot verify.
 * A volume may drop a block at any time (eviction, a restart, a failover):
 * a get then reports KVBM_ENOTFOUND, a miss. A get that does not end
 * KVBM_OK leaves dst's content unspecified.
 *
 * Threads: every function may be called from any thread. Callbacks run on
 * a volume I/O thread and must not call kvbm_volume_unregister.
 *
 * Errors per operation (kvbm_volume_op.status): KVBM_OK; KVBM_ENOTFOUND (no
 * such key: get, exists, delete); KVBM_ECHECKSUM (get: a stored value
 * failed the backend's own check, e.g. a torn slot or a foreign file; a
 * miss, counted in stats.corrupt); KVBM_ENOSPC (a full store refused a put,
 * or a get's buffer is too small: size says what it needs); KVBM_ETIMEDOUT
 * (the deadline passed); KVBM_EIO (the store failed or is unreachable);
 * KVBM_ETOOLONG (a value above max_value_bytes); KVBM_ECLOSED (the volume
 * was unregistered before the operation ran).
 *
 * Cost: a batch is one queue slot and one wake-up; the backends pipeline a
 * batch's operations (Redis) or keep them in flight together (disk), so
 * batching is what buys throughput.
 */
#ifndef KVBM_VOLUME_H
#define KVBM_VOLUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvbm_volume kvbm_volume;

typedef enum kvbm_volume_op_kind {
  KVBM_VOLUME_PUT = 0,    /* store len >= 1 bytes at src under key (replace) */
  KVBM_VOLUME_GET = 1,    /* copy the value into dst (cap bytes) */
  KVBM_VOLUME_EXISTS = 2, /* is there a value? (size set when known) */
  KVBM_VOLUME_DELETE = 3, /* remove the value (ENOTFOUND if none) */
} kvbm_volume_op_kind;

/* One operation of a batch. The caller owns the array and the buffers
 * until the batch completes. */
typedef struct kvbm_volume_op {
  kvbm_volume_op_kind kind;
  uint64_t key;    /* the block's sequence hash */
  const void *src; /* PUT: the bytes */
  size_t len;      /* PUT: how many */
  void *dst;       /* GET: where the value goes */
  size_t cap;      /* GET: room at dst */
  size_t size;     /* out, GET and EXISTS: the value's size (0 unknown) */
  int status;      /* out: see the top of this file */
  uint32_t tag;    /* PUT: a label of the value's, 0..255 (above: the
                      batch is KVBM_EINVAL), kept where the backend can
                      (disk://, in the slot's header) and listed by
                      kvbm_volume_keys_tagged; others ignore it (0) */
} kvbm_volume_op;

/* Called once per submitted batch, on an I/O thread, when every operation
 * of it has a status. */
typedef void (*kvbm_volume_done_cb)(void *user, kvbm_volume_op *ops, size_t n);

typedef struct kvbm_volume_config kvbm_volume_config;

/* A backend: what a storage vendor implements. `open` is called once per
 * I/O thread of the volume (each thread gets its own state, e.g. its own
 * connection) unless `max_threads` is 1; `run` executes a batch on that
 * thread's state, setting every op's status, and must return by the
 * deadline (a CLOCK_MONOTONIC time in nanoseconds) with KVBM_ETIMEDOUT for
 * what it could not finish; `close` frees a state. Only `scheme`, `open`,
 * `run` and `close` are required. `open` runs in kvbm_volume_register (its
 * error fails the registration; cfg->url is the URL as given, user info
 * included), `run` and `close` on the state's own I/O thread or in
 * unregister. `run` never sees a put above max_value_bytes (the volume
 * refuses it). It may report a value that failed the backend's own check
 * (a torn record, a foreign file) as KVBM_ECHECKSUM: the volume counts it
 * (stats.corrupt) and reports it as such for a get, as KVBM_ENOTFOUND for
 * exists or delete; any status outside the list at the top of this file
 * becomes KVBM_EIO. */
typedef struct kvbm_volume_backend {
  const char *scheme;   /* the URL scheme it serves ("myvendor") */
  uint32_t max_threads; /* 0: any number; 1: one I/O thread only */
  int (*open)(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err);
  void (*run)(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns);
  void (*close)(void *state);
  /* Optional (NULL: kvbm_volume_keys says KVBM_EUNSUPPORTED): calls fn for
   * every key the state holds, oldest write first, and sets *skipped to
   * the records found broken when the state was opened. On the I/O
   * thread. */
  int (*keys)(void *state, void (*fn)(void *user, uint64_t key, size_t size), void *user,
              uint64_t *skipped);
  /* Optional: a short static text saying how the state runs (see
   * kvbm_volume_mode). */
  const char *(*describe)(void *state);
  /* Optional: `keys` with each value's tag (kvbm_volume_op.tag); used
   * instead of `keys` when given. */
  int (*keys_tagged)(void *state, void (*fn)(void *user, uint64_t key, size_t size, uint32_t tag),
                     void *user, uint64_t *skipped);
} kvbm_volume_backend;

/* Settings; a zero timeout, thread count, queue capacity or value bound
 * means its default. */
struct kvbm_volume_config {
  const char *url;           /* the descriptor: scheme://... (required) */
  const char *name;          /* volume id in storage events; NULL: the URL
                                without user info */
  const char *key_namespace; /* "" by default; [A-Za-z0-9._:-]{0,200} */
  int timeout_ms;            /* deadline of one batch, counted from its
                                submission (1000; 0: the default) */
  uint32_t threads;          /* I/O threads (1; at most 64) */
  uint32_t queue_capacity;   /* batches waiting; more: KVBM_EAGAIN (256) */
  uint64_t max_value_bytes;  /* largest value put or accepted by get (64 MiB) */
  /* disk:// only: the slot file's geometry, and whether it outlives the
   * volume (warm restart). */
  uint64_t slots;
  uint64_t block_bytes;
  bool persist;
  /* disk:// only: NULL (default), slots carry XXH3 sums (torn writes, bit
   * rot); or a secret of 16..4096 bytes (read at register, not kept) from
   * which the slots' keyed-BLAKE3 sums are derived, so a slot forged by
   * someone who can write the file but lacks the secret is a miss. Costs
   * BLAKE3's speed on every write and read. */
  const void *disk_key;
  size_t disk_key_len;
  /* disk:// only: the writer's label (NULL or "": none; at most 255
   * bytes; read at register), kept in the slot file's superblock: what the
   * values' tags mean (the manager: its KV cache groups). A persistent
   * file written under another label is refused at register (KVBM_EFORMAT
   * naming both labels); one written under none takes this one. */
  const char *disk_label;
  /* A caller's backend for url's scheme (NULL: the built-in one). */
  const kvbm_volume_backend *backend;
  void *backend_user;
  /* redis+cluster:// only: the least time between two reads of the slot
   * map (CLUSTER SLOTS), shared by the volume's I/O threads (100 ms; 0:
   * the default; at most 3600000). A batch that needs a fresh map sooner
   * uses the one it has, or the one another thread just read. */
  uint32_t cluster_refresh_ms;
};

/* The defaults above for `url` (pointed to, not copied). */
KVBM_EXTERN kvbm_volume_config kvbm_volume_config_default(const char *url);

/* registerVolume: parses the descriptor, opens the backend (a Redis that
 * is down is not an error here: the volume starts, its operations fail
 * with KVBM_EIO and it reconnects later) and starts the I/O threads.
 * KVBM_EINVAL names a bad URL or setting; KVBM_EUNSUPPORTED an unknown
 * scheme. Strings are copied. Free with kvbm_volume_unregister(). */
KVBM_EXTERN int kvbm_volume_register(const kvbm_volume_config *cfg, kvbm_volume **out,
                                     kvbm_error *err);

/* unregisterVolume: batches not yet started complete with KVBM_ECLOSED,
 * the running ones finish; then the threads stop and everything is freed.
 * NULL: no-op. */
KVBM_EXTERN void kvbm_volume_unregister(kvbm_volume *v);

/* Queues a batch of 1 <= n <= 65536 operations; `done` reports it.
 * KVBM_EAGAIN when the queue is full (nothing queued, done not called),
 * KVBM_ECLOSED after unregister began, KVBM_EINVAL for a bad op (kind, NULL
 * buffer, a put of 0 bytes). Never blocks. */
KVBM_EXTERN int kvbm_volume_submit(kvbm_volume *v, kvbm_volume_op *ops, size_t n,
                                   kvbm_volume_done_cb done, void *user);

/* Submits and waits. Returns KVBM_OK when the batch ran (each op has its
 * own status), or submit's error. */
KVBM_EXTERN int kvbm_volume_run(kvbm_volume *v, kvbm_volume_op *ops, size_t n,
                                kvbm_error *err);

/* One-operation conveniences over kvbm_volume_run (return the op's
 * status). *size (may be NULL) receives the value's size. */
KVBM_EXTERN int kvbm_volume_put(kvbm_volume *v, uint64_t key, const void *src, size_t len);
KVBM_EXTERN int kvbm_volume_get(kvbm_volume *v, uint64_t key, void *dst, size_t cap,
                                size_t *size);
KVBM_EXTERN int kvbm_volume_exists(kvbm_volume *v, uint64_t key, size_t *size);
KVBM_EXTERN int kvbm_volume_delete(kvbm_volume *v, uint64_t key);

/* Lists the keys the volume holds, oldest write first, where its backend
 * keeps an index of its own: disk:// (what a warm restart found, and what
 * was stored since). *skipped (may be NULL) receives how many stored
 * records were found broken at register (torn or foreign slots). Runs on
 * the I/O thread, after the batches submitted before it, and calls fn
 * there; returns when done. KVBM_EUNSUPPORTED where the store cannot be
 * listed (file://, redis://: shared and unbounded), KVBM_EAGAIN (queue
 * full), KVBM_ECLOSED. */
typedef void (*kvbm_volume_key_cb)(void *user, uint64_t key, size_t size);
KVBM_EXTERN int kvbm_volume_keys(kvbm_volume *v, kvbm_volume_key_cb fn, void *user,
                                 uint64_t *skipped, kvbm_error *err);

/* kvbm_volume_keys with each value's tag (kvbm_volume_op.tag; 0 where
 * the backend keeps none, and for disk:// slots written before tags). */
typedef void (*kvbm_volume_tagged_key_cb)(void *user, uint64_t key, size_t size, uint32_t tag);
KVBM_EXTERN int kvbm_volume_keys_tagged(kvbm_volume *v, kvbm_volume_tagged_key_cb fn, void *user,
                                        uint64_t *skipped, kvbm_error *err);

/* How the backend runs, for logs and reports: disk:// says
 * "io_uring+O_DIRECT", "pread/pwrite+buffered", ...; "" when the backend
 * does not say. Static for the volume's life. */
KVBM_EXTERN const char *kvbm_volume_mode(const kvbm_volume *v);

/* The volume's id and its URL without user info (static for its life). */
KVBM_EXTERN const char *kvbm_volume_name(const kvbm_volume *v);
KVBM_EXTERN const char *kvbm_volume_url(const kvbm_volume *v);

/* Counters since register. hits + misses == gets: a miss is any get that
 * did not return the value (not found, timed out, failed). */
typedef struct kvbm_volume_stats {
  uint64_t puts, gets, hits, misses, exists, deletes;
  uint64_t bytes_put, bytes_got;
  uint64_t timeouts, io_errors, full; /* ops that ended so (full: puts) */
  uint64_t corrupt;                   /* ops that met a stored value failing
                                         the backend's check (the gets among
                                         them: KVBM_ECHECKSUM, misses) */
  uint64_t rejected;                  /* batches refused: queue full */
  uint64_t reconnects;                /* connections re-established */
  uint64_t queued;                    /* batches waiting now */
  /* redis+cluster:// only (0 elsewhere): slot maps read (CLUSTER SLOTS
   * asked, whatever the answer); refreshes a batch wanted but the rate
   * limit (cluster_refresh_ms) refused, so it used the map it had; ops
   * failed fast because their slot's redirections go in circles (MOVED
   * back and forth, or an owner that redirects its own slot; the slot is
   * refused until the next refresh) or past 5 hops; slot maps refused as
   * malformed (ranges out of 0..16383, overlapping, more than 16384). */
  uint64_t slot_refreshes, slot_refreshes_limited, redirect_loops, slot_maps_refused;
} kvbm_volume_stats;

KVBM_EXTERN void kvbm_volume_stats_get(const kvbm_volume *v, kvbm_volume_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_VOLUME_H */
