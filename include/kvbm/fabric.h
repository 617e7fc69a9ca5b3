/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/fabric.h: moving payloads and KV blocks between two nodes.
 *
 * A fabric is one end of a connection between two nodes (or two threads).
 * Every fabric offers the same calls, whatever carries the bytes:
 *
 *   push / next / pull   two-sided messages: the sender pushes a payload and
 *                        gets a handle; the receiver learns of it (next) and
 *                        pulls it by handle into a buffer of its choice.
 *   label                the transport's label for reports ("nixl-synth"
 *                        for the synthetic in-process fabric, "ucx").
 *   name                 each end has a node name, and learns the peer's.
 *   register / export /  one-sided block access: a node registers the memory
 *   import / read /      of a layout (kvbm_layout_desc), exports a
 *   write                descriptor, the peer imports it and then reads or
 *                        writes the node's blocks by (block set, block id)
 *                        without the node taking part.
 *   flush                waits until every earlier push has been pulled and
 *                        every earlier read/write is complete at both ends.
 *
 * Completion by notification: one-sided writes are invisible to the target
 * until it is told. The writer calls kvbm_fabric_flush() and then pushes a
 * message naming the blocks; the target acts on the message only.
 *
 * Three implementations:
 *   in-process  kvbm_fabric_inproc_pair(): two ends in one process (tests,
 *               single-node setups). Thread-safe between the two ends.
 *   UCX         kvbm_fabric_ucx_listen()/accept()/connect(): a real UCX ucp
 *               worker per end; worker addresses are swapped over a TCP side
 *               channel once both ends proved a shared key; pushes are UCX active messages (large ones by
 *               rendezvous, so a pull moves the bytes straight into the
 *               puller's buffer); block reads/writes are ucp_get/ucp_put on
 *               memory registered with ucp_mem_map. Which UCX transports
 *               carry it (shared memory, TCP, RDMA) is UCX's choice, limited
 *               by kvbm_fabric_ucx_config.transports / net_devices.
 *   CUDA IPC    kvbm_fabric_cudaipc_listen()/accept()/connect(): two
 *               processes on one node (prefill and decode on two GPUs of a
 *               host, or on one). The same TCP side channel, shared-key
 *               proof and MAC'd hello as UCX; pushes travel on that socket;
 *               block sets live in DEVICE memory, exported as
 *               cudaIpcMemHandle_t and opened by the importer, whose reads
 *               and writes are cudaMemcpyAsync on its own stream (device to
 *               device; a host buffer works too). Host memory is refused
 *               (KVBM_EUNSUPPORTED): UCX is the fabric for it.
 *
 * Threads: the two ends of an in-process pair may be used from two threads;
 * one end itself (and every UCX fabric) from one thread at a time.
 * All calls return KVBM_OK or a negative kvbm_status and fill the optional
 * kvbm_error. Once a fabric has seen a fatal error (peer gone, protocol
 * violation) every later call returns that error (KVBM_ECLOSED,
 * KVBM_EPROTO, ...) instead of waiting.
 */
#ifndef KVBM_FABRIC_H
#define KVBM_FABRIC_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/blake3.h"
#include "kvbm/frame.h"
#include "kvbm/layout.h"
#include "kvbm/status.h"
#include "kvbm/storage.h"
#include "kvbm/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvbm_fabric kvbm_fabric;

/* Names one pushed payload on a connection. Ids are assigned by the pushing
 * end, 1, 2, 3, ... in push order; a handle is meaningful only on the other
 * end of the same connection. */
typedef struct kvbm_fabric_handle {
  uint64_t id;
} kvbm_fabric_handle;

/* Longest node name (bytes, without the NUL). Names are printable ASCII. */
#define KVBM_FABRIC_NAME_MAX 63

/* ---- In-process fabric ---- */

/* Creates two connected ends named name_a and name_b (NULL: "inproc-a",
 * "inproc-b"). Its label is "nixl-synth" (ADR-0006: a synthetic fabric
 * says so; its figures are memcpy under a lock, not a transport's). A push on one is pulled on the other; a block set registered
 * on one can be imported by the other. Each end is owned by the caller:
 * kvbm_fabric_destroy() both (in any order; once one end is destroyed the
 * other's pushes fail with KVBM_ECLOSED). Errors: KVBM_EINVAL (bad name),
 * KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_fabric_inproc_pair(const char *name_a, const char *name_b,
                            kvbm_fabric **a, kvbm_fabric **b, kvbm_error *err);

/* ---- UCX fabric ---- */

/* The shared key of a UCX connection: a secret both nodes hold, of
 * KVBM_FABRIC_SECRET_MIN..KVBM_FABRIC_SECRET_MAX bytes (any bytes; 32
 * random ones are the right size, e.g. `head -c 32 /dev/urandom`). The
 * 32-byte MAC key is derived from it (BLAKE3 derive_key). */
#define KVBM_FABRIC_SECRET_MIN 16u
#define KVBM_FABRIC_SECRET_MAX 4096u

/* Told of every side-channel connection a listener refused: `peer` is
 * "ip:port", `status` and `why` say what was wrong (KVBM_EAUTH: it does not
 * hold the key; KVBM_EPROTO: not a kvbm fabric; KVBM_ECLOSED: it hung up;
 * KVBM_ETIMEDOUT: it did not finish in time; KVBM_EAGAIN: dropped to make
 * room for a newer one). Called from kvbm_fabric_ucx_accept's thread. */
typedef void (*kvbm_fabric_refused_fn)(void *user, const char *peer, int status, const char *why);

typedef struct kvbm_fabric_ucx_config {
  const char *name;        /* this end's node name, told to the peer in
                              the hello; NULL: "ucx". (The fabric's
                              label, kvbm_fabric_label(), is always
                              "ucx".) */
  const void *key;         /* the shared key (required; see above). Both
                              ends prove it (challenge and keyed-BLAKE3
                              response, both ways) before either reads a
                              byte of the other's hello, so nothing from
                              an unauthenticated peer reaches UCX. Read
                              by listen/connect and not kept: the caller
                              may wipe it after they return. */
  size_t key_len;
  const char *transports;  /* UCX_TLS for this fabric only ("shm,self",
                              "tcp", ...); NULL: the environment's / UCX's
                              default. Set without touching the environment
                              (ucp_config_modify). */
  const char *net_devices; /* UCX_NET_DEVICES likewise ("lo"); NULL: default */
  int timeout_ms;          /* side channel, wire-up and close; default 10000 */
  uint64_t max_payload;    /* largest push accepted from the peer; a bigger
                              one is a protocol error. Default 1 GiB */
  uint64_t max_pending;    /* payloads waiting to be pulled; more is a
                              protocol error. Default 65536 */
  kvbm_fabric_refused_fn on_refused; /* listener: optional */
  void *on_refused_user;
} kvbm_fabric_ucx_config;

/* The defaults above. */
KVBM_EXTERN kvbm_fabric_ucx_config kvbm_fabric_ucx_config_default(void);

typedef struct kvbm_fabric_listener kvbm_fabric_listener;

/* Listens on host:port (host NULL: "127.0.0.1"; port 0: any free port) for
 * peers. The config is copied (the key as the derived MAC key, wiped by
 * destroy). *out is owned by the caller: kvbm_fabric_listener_destroy().
 * KVBM_EINVAL: no key, or one of a bad length; KVBM_EEXIST: port in use;
 * KVBM_EIO. */
KVBM_EXTERN int kvbm_fabric_ucx_listen(const kvbm_fabric_ucx_config *cfg, const char *host,
                           uint16_t port, kvbm_fabric_listener **out,
                           kvbm_error *err);

/* The port actually bound. */
KVBM_EXTERN uint16_t kvbm_fabric_listener_port(const kvbm_fabric_listener *l);

/* Side-channel connections refused so far (see kvbm_fabric_ucx_accept). */
KVBM_EXTERN uint64_t kvbm_fabric_listener_refused(const kvbm_fabric_listener *l);

/* Waits up to cfg.timeout_ms for a peer that proves the shared key, swaps
 * worker addresses and node names with it and returns a connected fabric (*out,
 * owned by the caller). Connections that fail on the way (closed, silent
 * past cfg.timeout_ms, not a kvbm fabric, a wrong key, a hello or wire-up
 * that fails) are closed, counted, reported to cfg.on_refused, and the
 * wait goes on: a bad peer never ends it. Up to 16 connections
 * authenticate at once, so a silent one does not hold up others. May be
 * called again for another peer. KVBM_ETIMEDOUT: no good peer came (the
 * message counts the refused ones and gives the last reason); KVBM_EIO:
 * UCX failed on this side (message has UCX's reason); KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_fabric_ucx_accept(kvbm_fabric_listener *l, kvbm_fabric **out,
                           kvbm_error *err);

KVBM_EXTERN void kvbm_fabric_listener_destroy(kvbm_fabric_listener *l);

/* Connects to a listener at host:port (retrying until cfg->timeout_ms while
 * nobody listens yet) and runs the same handshake. KVBM_EAUTH: the listener
 * does not hold the key (or a hello was tampered with); KVBM_EPROTO: it is
 * not a kvbm fabric; KVBM_ETIMEDOUT, KVBM_ECLOSED, KVBM_EIO, KVBM_EINVAL
 * (no key). */
KVBM_EXTERN int kvbm_fabric_ucx_connect(const kvbm_fabric_ucx_config *cfg,
                            const char *host, uint16_t port,
                            kvbm_fabric **out, kvbm_error *err);

/* ---- CUDA IPC fabric ---- */

/* A CUDA IPC end. Needs a CUDA build and a device: otherwise accept and
 * connect return KVBM_EUNSUPPORTED (no CUDA runtime in this build) or
 * KVBM_EDEVICE (no device, or cfg.device past the last one). */
typedef struct kvbm_fabric_cudaipc_config {
  const char *name;        /* node name told to the peer; NULL: "cudaipc".
                              The label (kvbm_fabric_label) is "cuda-ipc" */
  const void *key;         /* the shared key, as kvbm_fabric_ucx_config's:
                              required, proved both ways before anything
                              else is read; not kept */
  size_t key_len;
  int device;              /* the CUDA ordinal this end copies on (its
                              stream's device; the peer's memory is mapped
                              here with peer access enabled as needed);
                              default 0. Registered memory may be on any
                              device of the node */
  int timeout_ms;          /* side channel, handshake and close; default 10000 */
  uint64_t max_payload;    /* largest push accepted from the peer (larger: a
                              protocol error); default 1 GiB */
  uint64_t max_pending;    /* payloads waiting to be pulled; default 65536 */
  kvbm_fabric_refused_fn on_refused; /* listener: optional */
  void *on_refused_user;
} kvbm_fabric_cudaipc_config;

/* The defaults above. */
KVBM_EXTERN kvbm_fabric_cudaipc_config kvbm_fabric_cudaipc_config_default(void);

typedef struct kvbm_fabric_cudaipc_listener kvbm_fabric_cudaipc_listener;

/* Listens on host:port (host NULL: "127.0.0.1"; port 0: any free port).
 * Touches no CUDA (a process may listen, then fork, then use CUDA). The
 * config is copied (the key as the derived MAC key). *out is owned by the
 * caller: kvbm_fabric_cudaipc_listener_destroy(). KVBM_EINVAL (no key, a
 * bad length, a bad name, timeout_ms <= 0, device < 0), KVBM_EEXIST (port
 * in use), KVBM_EIO. (Works in a build without CUDA too; accept then
 * says KVBM_EUNSUPPORTED.) */
KVBM_EXTERN int kvbm_fabric_cudaipc_listen(const kvbm_fabric_cudaipc_config *cfg, const char *host,
                                           uint16_t port, kvbm_fabric_cudaipc_listener **out,
                                           kvbm_error *err);

KVBM_EXTERN uint16_t kvbm_fabric_cudaipc_listener_port(const kvbm_fabric_cudaipc_listener *l);
KVBM_EXTERN uint64_t kvbm_fabric_cudaipc_listener_refused(const kvbm_fabric_cudaipc_listener *l);

/* As kvbm_fabric_ucx_accept: checks the device first (KVBM_EDEVICE), then
 * waits up to cfg.timeout_ms for a peer that proves the key and is a CUDA
 * IPC end on this host; peers that fail are refused, counted and reported
 * and the wait goes on. KVBM_ETIMEDOUT, KVBM_EIO (CUDA failed here: the
 * message names the call and CUDA's reason), KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_fabric_cudaipc_accept(kvbm_fabric_cudaipc_listener *l, kvbm_fabric **out,
                                           kvbm_error *err);

KVBM_EXTERN void kvbm_fabric_cudaipc_listener_destroy(kvbm_fabric_cudaipc_listener *l);

/* As kvbm_fabric_ucx_connect. KVBM_EAUTH (the listener lacks the key),
 * KVBM_EPROTO (not a CUDA IPC end), KVBM_EUNSUPPORTED (the peer is on
 * another host), KVBM_EDEVICE, KVBM_ETIMEDOUT, KVBM_ECLOSED, KVBM_EIO,
 * KVBM_EINVAL.
 *
 * Block sets on a CUDA IPC fabric: kvbm_fabric_register() takes DEVICE
 * memory only (a region may sit anywhere inside a cudaMalloc allocation:
 * the allocation's handle and the region's offset in it are exported);
 * memory CUDA will not export (host, managed, cudaMallocAsync pools) is
 * refused naming CUDA's reason. kvbm_fabric_import() checks the peer's key
 * (KVBM_EPROTO: not a CUDA IPC key; KVBM_ERANGE: the region outside the
 * allocation, as claimed or as actually mapped) before any copy.
 * kvbm_fabric_storage_create() is KVBM_EUNSUPPORTED (use
 * kvbm_storage_create(KVBM_MEMORY_DEVICE, ...)). Reads and writes are
 * asynchronous on this end's stream; kvbm_fabric_flush() waits for them
 * (and reports a failed copy as a sticky KVBM_EIO). A remote set's release
 * waits for this end's copies, then closes the handle. Not thread-safe:
 * one thread per end. */
KVBM_EXTERN int kvbm_fabric_cudaipc_connect(const kvbm_fabric_cudaipc_config *cfg, const char *host,
                                            uint16_t port, kvbm_fabric **out, kvbm_error *err);

/* ---- Every fabric ---- */

/* Closes the connection and frees the end. UCX: first tells the peer and
 * waits (up to the config's timeout) for it to close too, serving its
 * outstanding pulls meanwhile, so that nothing in flight is cut. Block sets
 * registered or imported on this fabric must be released before. NULL:
 * no-op. */
KVBM_EXTERN void kvbm_fabric_destroy(kvbm_fabric *f);

/* "inproc", "ucx" or "cudaipc": which implementation. */
KVBM_EXTERN const char *kvbm_fabric_kind(const kvbm_fabric *f);

/* The fabric's label (ADR-0006's label()), what a report names the
 * transport by: "nixl-synth" for the in-process fabric (synthetic: its
 * figures are not a transport's), "ucx" for the UCX fabric. A static
 * string; "" for NULL. */
KVBM_EXTERN const char *kvbm_fabric_label(const kvbm_fabric *f);

/* This end's node name, and the peer's (as the peer announced it). Valid
 * for the fabric's lifetime. */
KVBM_EXTERN const char *kvbm_fabric_name(const kvbm_fabric *f);
KVBM_EXTERN const char *kvbm_fabric_peer_name(const kvbm_fabric *f);

/* Sends `len` bytes (0 allowed) to the peer; *out (may be NULL) gets the
 * handle. Ownership: `data` must stay valid and unchanged until
 * kvbm_fabric_flush() returns KVBM_OK (the UCX fabric reads it while the
 * peer pulls; the in-process one copies it at once). Errors: KVBM_ECLOSED
 * (peer gone), KVBM_ETOOLONG (above the peer's max_payload, UCX), KVBM_EIO. */
KVBM_EXTERN int kvbm_fabric_push(kvbm_fabric *f, const void *data, size_t len,
                     kvbm_fabric_handle *out, kvbm_error *err);

/* Waits up to timeout_ms (0: just look; < 0: forever) for a payload from the
 * peer that next() has not returned before, oldest first; *h gets its
 * handle, *len (may be NULL) its size. KVBM_ETIMEDOUT if none came;
 * KVBM_ECLOSED if the peer closed and none is left. */
KVBM_EXTERN int kvbm_fabric_next(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h,
                     size_t *len, kvbm_error *err);

/* Moves payload `h` into buf[0..cap) and forgets it; *len (may be NULL) gets
 * its size. Waits up to timeout_ms for it to arrive if it has not yet.
 * KVBM_ETOOLONG: cap is smaller than the payload (it is kept: retry with a
 * larger buffer); KVBM_ENOTFOUND: already pulled; KVBM_ETIMEDOUT. */
KVBM_EXTERN int kvbm_fabric_pull(kvbm_fabric *f, kvbm_fabric_handle h, void *buf,
                     size_t cap, size_t *len, int timeout_ms,
                     kvbm_error *err);

/* Waits up to timeout_ms (< 0: forever) until every earlier push of this end
 * has been pulled and every earlier block read/write has completed at both
 * ends. KVBM_ETIMEDOUT, or the first error of an operation that failed. */
KVBM_EXTERN int kvbm_fabric_flush(kvbm_fabric *f, int timeout_ms, kvbm_error *err);

/* What one end did, since it was made. Accesses are counted when posted
 * (kvbm_fabric_flush says when they completed); a block of a layer-separate
 * set is one access per layer. Failures are operations the transport
 * failed (KVBM_EIO, KVBM_ECLOSED), not refused arguments or timeouts. */
typedef struct kvbm_fabric_stats {
  uint64_t pushes, push_bytes;   /* payloads sent (kvbm_fabric_push) */
  uint64_t pulls, pull_bytes;    /* payloads taken (kvbm_fabric_pull) */
  uint64_t writes, write_bytes;  /* one-sided writes into the peer's blocks */
  uint64_t reads, read_bytes;    /* one-sided reads of them */
  uint64_t failures;
} kvbm_fabric_stats;

/* Copies the counters: any thread (they are atomics, read a moment stale
 * while the end works); f must stay alive meanwhile. NULL f: zeros. */
KVBM_EXTERN void kvbm_fabric_stats_get(const kvbm_fabric *f, kvbm_fabric_stats *out);

/* ---- Block sets: one-sided access to the peer's blocks ---- */

/* A local layout's memory, registered with the fabric. */
typedef struct kvbm_fabric_local_set kvbm_fabric_local_set;

/* A peer's layout, imported: its blocks can be read and written by id. */
typedef struct kvbm_fabric_remote_set kvbm_fabric_remote_set;

/* Registers every region of desc (region_base are addresses in this
 * process, region_size bytes each) for remote access and keeps a copy of
 * desc. Memory types: SYSTEM and PINNED; others KVBM_EUNSUPPORTED. The
 * regions must stay allocated until kvbm_fabric_local_set_release().
 * *out is owned by the caller. Errors: KVBM_EINVAL (null base, bad desc),
 * KVBM_EIO (registration failed), KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_fabric_register(kvbm_fabric *f, const kvbm_layout_desc *desc,
                         kvbm_fabric_local_set **out, kvbm_error *err);

/* The wire form of a registered set, for the peer's kvbm_fabric_import():
 * the serialized layout (layout.h, "KVLY") plus, per region, the registered
 * extent and the fabric's access key (UCX: the packed rkey). *buf is
 * malloc'd: the caller frees it. Format in docs/areas/fabric.md. */
KVBM_EXTERN int kvbm_fabric_export(const kvbm_fabric_local_set *ls, uint8_t **buf,
                       size_t *len, kvbm_error *err);

/* Host storage (storage.h; name "fabric", memory type SYSTEM) for `layout`
 * whose regions the fabric allocates itself, so that a peer reaches them
 * the fastest way the transport has: over UCX, a peer on the same host maps
 * them (shared memory) and a block write is one memcpy, where memory from
 * elsewhere goes through a copy protocol; on RDMA they are registered once.
 * Register it with kvbm_fabric_register() like any storage (the
 * registration reuses the allocation's). Regions are page-aligned: a layout
 * alignment above 4096 is KVBM_EUNSUPPORTED. Ownership: the caller
 * kvbm_storage_release()s it, before destroying the fabric. Errors:
 * KVBM_ENOMEM, KVBM_EIO, KVBM_EINVAL. */
KVBM_EXTERN int kvbm_fabric_storage_create(kvbm_fabric *f, const kvbm_layout *layout,
                               kvbm_storage **out, kvbm_error *err);

/* Unregisters and frees. The peer's later accesses fail. NULL: no-op. */
KVBM_EXTERN void kvbm_fabric_local_set_release(kvbm_fabric_local_set *ls);

/* Parses an exported set from the peer and prepares access to it. Refuses,
 * before any transfer: malformed input (the layout decoder's errors, or
 * KVBM_EMAGIC / KVBM_EVERSION / KVBM_EPADDING / KVBM_ETRUNCATED /
 * KVBM_ETOOLONG / KVBM_EFORMAT for the fabric's envelope), a layout region
 * that reaches outside the registered extent sent with it (KVBM_ERANGE),
 * a memory type this fabric cannot reach (KVBM_EUNSUPPORTED), a key the
 * transport rejects (KVBM_EPROTO; in-process: a region the peer has not
 * registered, KVBM_ERANGE). *out is owned by the caller. */
KVBM_EXTERN int kvbm_fabric_import(kvbm_fabric *f, const uint8_t *buf, size_t len,
                       kvbm_fabric_remote_set **out, kvbm_error *err);

/* The layout inside an exported set, without importing it (no access is
 * prepared, nothing is kept): to check a peer's blocks before taking its
 * memory. The envelope's and the layout decoder's errors. */
KVBM_EXTERN int kvbm_fabric_export_layout(const uint8_t *buf, size_t len, kvbm_layout *out,
                                          kvbm_error *err);

/* The imported layout (region_base are the peer's addresses). */
KVBM_EXTERN const kvbm_layout_desc *kvbm_fabric_remote_desc(const kvbm_fabric_remote_set *rs);

KVBM_EXTERN void kvbm_fabric_remote_set_release(kvbm_fabric_remote_set *rs);

/* Bytes of one whole block of the set (num_layers * layer_stride): the size
 * a block read/write moves. */
KVBM_EXTERN uint64_t kvbm_fabric_block_bytes(const kvbm_layout *layout);

/* Writes / reads block `block` of the peer's set from / into a local buffer
 * of exactly kvbm_fabric_block_bytes() bytes, laid out [layer][outer][...]
 * (for a LayerSeparate set the layers go to their regions). Asynchronous:
 * the local buffer must stay valid (and, for a write, unchanged) and the
 * data is not at its destination until kvbm_fabric_flush() returns.
 * Refused before any byte moves: block >= num_blocks or a range outside the
 * peer's registered extent (KVBM_ERANGE), len not the block size
 * (KVBM_EINVAL). */
KVBM_EXTERN int kvbm_fabric_write_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                            uint64_t block, const void *src, size_t len,
                            kvbm_error *err);
KVBM_EXTERN int kvbm_fabric_read_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                           uint64_t block, void *dst, size_t len,
                           kvbm_error *err);

/* Reads blocks blocks[i] of the peer's set into dsts[i] (each
 * kvbm_fabric_block_bytes() bytes, laid out as read_block lays them) and
 * hashes each as it lands: sums + i * sum_len gets the BLAKE3 (plain, the
 * first sum_len bytes, 1..64; a frame's checksum is 16) of what is now at
 * dsts[i], for the caller to check against the sum the sender framed. The
 * receiving half of a checked transfer: the one hash a byte gets on its
 * way.
 *
 * When the transport maps the peer's memory into this process (UCX's
 * shared-memory transports) and the peer's set is FullyContiguous, the
 * copy is the pool's work (kvbm_blake3_pool_submit_copy): each 256 KiB
 * piece is copied by a pool thread or this one and hashed by it at once,
 * from its cache, so the bytes cross memory once and the copy spreads
 * over the threads with the hash. Otherwise (TCP, RDMA, a LayerSeparate
 * peer) the blocks are read, the fabric flushed (at most timeout_ms;
 * < 0 waits as long as the peer lives), then hashed in place on the pool.
 *
 * Synchronous: returns when every block is at its destination and hashed.
 * Threads: the fabric's thread (the pool's threads only copy from the
 * mapping, never call the transport); the pool may be shared. Cost: one
 * allocation of n jobs. Errors, before any byte moves: a NULL argument,
 * n == 0, sum_len outside 1..64, a set of another fabric, a NULL or
 * overlapping destination (KVBM_EINVAL); a block out of range
 * (KVBM_ERANGE); then the transport's (KVBM_ECLOSED, KVBM_ETIMEDOUT, ...).
 * Counted as n reads of a block each (kvbm_fabric_stats). */
KVBM_EXTERN int kvbm_fabric_read_blocks_hashed(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                                               const uint64_t *blocks, void *const *dsts, size_t n,
                                               kvbm_blake3_pool *pool, uint8_t *sums, size_t sum_len,
                                               int timeout_ms, kvbm_error *err);

/* ---- Bridging layouts ----
 *
 * Two nodes may lay the same blocks out differently: FullyContiguous on
 * one and LayerSeparate on the other, another alignment (so another block
 * stride), another number of blocks. One layer of one block is contiguous
 * in both kinds ([outer_dim][page_size * inner_dim] elements,
 * layer_stride bytes), so a block moves between any two such layouts
 * layer by layer: gathered from one, scattered into the other. What must
 * agree is the shape of a block: layers, outer_dim, page_size, inner_dim,
 * dtype_size. */

/* KVBM_OK if blocks of `ours` can be bridged layer for layer to blocks of
 * `theirs` (the shape agrees; kind, alignment and num_blocks may differ);
 * otherwise KVBM_EUNSUPPORTED with a message naming the first field that
 * differs and both values ("layout mismatch: dtype_size 2 here, 4 at the
 * peer"). When both layouts carry heads (kvbm_layout_heads), their
 * descriptors must agree too (model_fingerprint, dtype_id, num_kv_heads,
 * head_dim, and the same held heads: tp_size, then tp_rank), since a layer
 * copy is only right between ranks holding the same heads; a peer of
 * another TP size is refused here naming tp_size, and is bridged by head
 * with kvbm_fabric_layout_bridge_heads(). Without heads on both sides the
 * shape alone decides, as before. KVBM_EINVAL for NULL. */
KVBM_EXTERN int kvbm_fabric_layout_bridge(const kvbm_layout *ours, const kvbm_layout *theirs,
                                          kvbm_error *err);

/* ---- Bridging TP sizes: reading our KV heads out of a peer's blocks ----
 *
 * A TP=2 writer's rank 0 holds heads [0, H/2) and rank 1 [H/2, H); a TP=1
 * reader gathers both halves into each token's row, a TP=4 reader takes a
 * quarter of the heads out of one writer rank's row. Both layouts carry
 * heads (kvbm_layout_attach_heads); blocks are token-major
 * ([layers][outer][page_size][inner_dim], layout.h), so the bytes of a run
 * of heads are, per (layer, outer, token), one piece of
 * num_heads * head_dim * dtype_size bytes. */

/* A run of our heads that one writer rank holds: our local heads
 * [our_offset, our_offset + num_heads) are that rank's local heads
 * [peer_offset, peer_offset + num_heads) (offsets in heads, from each
 * side's first held head; times head_dim * dtype_size they are byte
 * offsets in a token's row). */
typedef struct kvbm_fabric_head_piece {
  uint32_t peer_rank;   /* the writer's tp_rank that holds them */
  uint32_t our_offset;
  uint32_t peer_offset;
  uint32_t num_heads;
} kvbm_fabric_head_piece;

/* Can this rank (`ours`) read its heads from blocks written under `theirs`
 * (the layout of any one rank of the writer deployment)? Both must carry
 * heads (otherwise KVBM_EINVAL naming the side); model_fingerprint,
 * dtype_id, head_dim, num_kv_heads and the block's num_layers, outer_dim,
 * page_size and dtype_size must agree (KVBM_EUNSUPPORTED naming the first
 * field that differs, both values); tp_size and tp_rank may differ. On
 * success pieces[0..*num_pieces) is the head map: our held heads in order,
 * each run that one writer rank holds as one piece (when the writer
 * replicates heads, tp_size > num_kv_heads, the first rank holding a head
 * is named). At most min(our held heads, writer tp_size) pieces;
 * cap too small: KVBM_ENOSPC with *num_pieces set to the count needed.
 * No allocation; any thread. */
KVBM_EXTERN int kvbm_fabric_layout_bridge_heads(const kvbm_layout *ours, const kvbm_layout *theirs,
                                                kvbm_fabric_head_piece *pieces, size_t cap,
                                                size_t *num_pieces, kvbm_error *err);

/* Reads the heads of one piece of block `block` of the peer's set `rs` (a
 * writer rank's imported set, whose layout carries heads) into our block:
 * layers[l] is our layer l of the block (num_layers pointers, each
 * ours->layer_stride bytes: [outer][page_size * inner_dim] elements);
 * every other byte of our layers is left as it is. The piece must be one
 * kvbm_fabric_layout_bridge_heads(ours, that set's layout) gives (checked:
 * the set's tp_rank is the piece's peer_rank and the global heads agree;
 * else KVBM_EINVAL); every range is checked before the first byte moves
 * (KVBM_ERANGE). One read per (layer, outer, token) piece, or per (layer,
 * outer) slice where the piece is a whole row on both sides: the generic
 * one-sided read of every fabric (in-process: memcpy; UCX: one ucp_get
 * each, no iovec). Asynchronous: complete at kvbm_fabric_flush(). */
KVBM_EXTERN int kvbm_fabric_read_block_heads(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block,
                                             const kvbm_layout *ours, void *const *layers,
                                             uint64_t num_layers, const kvbm_fabric_head_piece *piece,
                                             kvbm_error *err);

/* The whole gather: our heads of block `block` from the writer ranks'
 * sets peers[0..num_peers) (any order; each found by its layout's
 * tp_rank), every piece of the head map read into layers as
 * kvbm_fabric_read_block_heads does. The map is made from peers[0]'s
 * layout and every peer is bridged (so all must be one deployment); a
 * writer rank the map needs and no peer provides: KVBM_ENOTFOUND naming it.
 * All pieces are checked before the first byte moves. Complete at
 * kvbm_fabric_flush(). */
KVBM_EXTERN int kvbm_fabric_read_block_tp(kvbm_fabric *f, kvbm_fabric_remote_set *const *peers,
                                          size_t num_peers, uint64_t block, const kvbm_layout *ours,
                                          void *const *layers, uint64_t num_layers, kvbm_error *err);

/* kvbm_fabric_write_block / read_block from / into a block of any local
 * layout: layers[l] is this node's layer l of the block (num_layers
 * pointers, each layer_bytes long: the peer's layer_stride), wherever the
 * local layout keeps it. Each layer goes to (comes from) the peer's block
 * layer l in the peer's own layout. Every range is checked before the
 * first byte moves (KVBM_ERANGE); num_layers or layer_bytes that do not
 * match the peer's set: KVBM_EINVAL naming both. Asynchronous like
 * write_block: complete at kvbm_fabric_flush(). */
KVBM_EXTERN int kvbm_fabric_write_block_layers(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                                               uint64_t block, const void *const *layers,
                                               uint64_t num_layers, uint64_t layer_bytes,
                                               kvbm_error *err);
KVBM_EXTERN int kvbm_fabric_read_block_layers(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                                              uint64_t block, void *const *layers,
                                              uint64_t num_layers, uint64_t layer_bytes,
                                              kvbm_error *err);

/* The general form: `len` bytes at byte `offset` of region `region` of the
 * peer's set. KVBM_ERANGE when [offset, offset+len) is not inside the
 * region's registered extent or region is out of range. */
KVBM_EXTERN int kvbm_fabric_write(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                      uint64_t region, uint64_t offset, const void *src,
                      size_t len, kvbm_error *err);
KVBM_EXTERN int kvbm_fabric_read(kvbm_fabric *f, kvbm_fabric_remote_set *rs,
                     uint64_t region, uint64_t offset, void *dst, size_t len,
                     kvbm_error *err);

/* ---- Block messages: one KV block on the wire, ready to onboard ---- */

/* What a receiver needs to place a block and register it in its pool: the
 * block's identity (sequence hash, parent, salt, tokens), the kvbm storage
 * tier it is meant for, and its bytes as an MRDN v1 frame (frame.h), so
 * that the bytes are checked (BLAKE3) before they are used. The frame's
 * byte 12 is ADR-0006's phase label (kvbm_frame_phase); kvbm's storage
 * tier is not in the frame but in this envelope. Little-endian:
 *   0   4  magic "KVBB"
 *   4   4  version (2; version 1 had no tier byte and wrote the storage
 *          tier into the frame's phase byte: refused, KVBM_EVERSION)
 *   8   8  sequence hash
 *   16  8  parent hash (meaningful when flags bit 0 is set)
 *   24  8  salt hash
 *   32  4  flags: bit 0 has_parent; bit 1 placed; other bits zero
 *   36  1  storage tier (kvbm_tier, 0..3): placed, the receiver's tier whose
 *          exported block set holds block_id; not placed, the tier the
 *          sender asks the receiver to keep the block in
 *   37  3  reserved, zero
 *   40  8  layout id: the block_set_id of the receiver's export that the
 *          sender laid the bytes out for (placed: wrote them into). A
 *          receiver refuses an id that is not its current export's (a
 *          stale layout)
 *   48  4  n = number of tokens
 *   52  4n tokens (u32 each)
 *   then, not placed: the MRDN v1 frame (32-byte header, then the bytes);
 *         placed:     u64 block id, then the MRDN v1 header alone: the bytes
 *                     were already written (one-sided) into that block of
 *                     the receiver's block set, where it verifies them.
 * nothing after that. */
#define KVBM_BLOCK_MSG_MAGIC "KVBB"
#define KVBM_BLOCK_MSG_VERSION 2u
#define KVBM_BLOCK_MSG_FIXED 52u

typedef struct kvbm_block_msg {
  uint64_t seq_hash;
  uint64_t parent_hash;
  uint64_t salt_hash;
  int has_parent;
  uint32_t num_tokens;
  const uint32_t *tokens;  /* encode: num_tokens tokens. decode: the
                              caller's array, filled */
  kvbm_tier tier;          /* the storage tier (envelope byte 36, above) */
  uint64_t layout_id;      /* the receiver's export it was laid out for */
  kvbm_frame_phase phase;  /* the frame's phase label (ADR-0006) */
  const uint8_t *body;     /* encode: the block bytes (hashed; copied unless
                              placed; placed and NULL: frame.checksum is
                              their checksum, computed by the caller).
                              decode: points into the input buffer (no
                              copy); NULL when placed */
  size_t body_len;
  int placed;              /* the bytes travel separately, to block_id */
  uint64_t block_id;       /* placed: the receiver's block holding them */
  kvbm_frame_header frame; /* decode: the frame header (placed: verify the
                              block with kvbm_frame_verify_body).
                              encode with sum_given: frame.checksum */
  int sum_given;           /* encode: frame.checksum is the body's BLAKE3-128,
                              kept by the caller since the bytes were last
                              written (tier metadata): the body is framed,
                              not hashed. A sum that does not match the
                              bytes is sent as it is: the receiver refuses
                              the block (KVBM_ECHECKSUM). decode: 0 */
  const uint8_t *mac_key;  /* encode: NULL, an MRDN v1 frame (plain
                              BLAKE3); else the 32-byte frame MAC key of
                              the peers (kvbm_fabric_frame_key): a keyed
                              frame (version 2), and with sum_given,
                              frame.checksum is the body's MAC under this
                              key (kept keyed: still hashed once). Read,
                              not kept. decode: NULL */
} kvbm_block_msg;

/* The frame MAC key of peers that share a fabric secret (the same
 * KVBM_FABRIC_SECRET_MIN..MAX bytes as kvbm_fabric_ucx_config.key):
 * BLAKE3 derive_key under a context of its own, so it is neither the side
 * channel's key nor any other use's of the same secret. 32 bytes into out;
 * KVBM_EINVAL for a secret of the wrong length. The caller wipes out when
 * done (explicit_bzero). */
KVBM_EXTERN int kvbm_fabric_frame_key(const void *secret, size_t len, uint8_t out[32],
                                      kvbm_error *err);

/* kvbm_block_msg_decode for a receiver holding the peers' frame MAC key
 * (NULL: kvbm_block_msg_decode). With a key, an unkeyed frame (version 1,
 * what anyone on the path can make) is KVBM_EAUTH, and so is a MAC that
 * does not match; without one, a keyed frame is KVBM_EAUTH. Placed: the
 * header's kind is checked here and the caller verifies the bytes with
 * kvbm_frame_verifier_init_keyed. */
KVBM_EXTERN int kvbm_block_msg_decode_keyed(const uint8_t *key, const uint8_t *buf, size_t len,
                                            uint32_t max_tokens, uint32_t max_body,
                                            uint32_t *tokens, kvbm_block_msg *m,
                                            kvbm_error *err);

/* Bytes of the encoded message, or 0 if the sizes do not fit. For a placed
 * message the body is not included (body_len only bounds the frame). */
KVBM_EXTERN size_t kvbm_block_msg_size(uint32_t num_tokens, size_t body_len);
KVBM_EXTERN size_t kvbm_block_msg_placed_size(uint32_t num_tokens);

/* Encodes m into out[0..cap) (hashing the body with BLAKE3 for the frame,
 * unless m->sum_given or a placed m->body of NULL supplies the checksum:
 * then nothing is hashed); *len gets the size. KVBM_ENOSPC if cap is too small; KVBM_EINVAL for
 * NULL pointers; KVBM_ETIER for a storage tier outside G1..G4;
 * KVBM_EPHASE for a phase outside kvbm_frame_phase; KVBM_ETOOLONG for a
 * body above 4 GiB. */
KVBM_EXTERN int kvbm_block_msg_encode(const kvbm_block_msg *m, uint8_t *out, size_t cap,
                          size_t *len, kvbm_error *err);

/* Decodes buf[0..len): the envelope (KVBM_EMAGIC, KVBM_EVERSION,
 * KVBM_EPADDING for unknown flags or reserved bytes, KVBM_ETIER for a
 * storage tier above G4, KVBM_ETRUNCATED, KVBM_ETOOLONG for more than
 * max_tokens tokens), then the frame with every error of
 * kvbm_frame_decode() (KVBM_EPHASE, KVBM_ECHECKSUM when the bytes were changed on the
 * way; a body above max_body is KVBM_ETOOLONG). Not placed: the body is
 * verified here, m->body points into buf. Placed: only the header is
 * checked (its fields and max_body); the caller verifies the block's bytes
 * against m->frame. m->tokens is `tokens` (room for max_tokens, filled).
 * Allocates nothing. */
KVBM_EXTERN int kvbm_block_msg_decode(const uint8_t *buf, size_t len, uint32_t max_tokens,
                          uint32_t max_body, uint32_t *tokens,
                          kvbm_block_msg *m, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_FABRIC_H */
