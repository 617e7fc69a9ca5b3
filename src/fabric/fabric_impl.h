/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fabric_impl.h (private): the vtable behind kvbm_fabric, and the structs
 * shared by the generic layer (fabric.c) and the implementations
 * (inproc.c, ucx.c).
 *
 * The generic layer owns everything that does not depend on the transport:
 * argument checks, names, handle ids, the sticky fatal error, block set
 * bookkeeping and every range check. An implementation only moves bytes
 * and manages its keys, so a range check cannot be forgotten by one of them.
 */
#ifndef KVBM_FABRIC_IMPL_H
#define KVBM_FABRIC_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "kvbm/fabric.h"

typedef struct kvbm_fabric_vtable {
  const char *kind;  /* "inproc", "ucx" */
  const char *label; /* the transport's label for reports (ADR-0006):
                        "nixl-synth" for the synthetic in-process fabric,
                        "ucx" */
  /* Which memory a block set may live in: false, host memory (SYSTEM and
   * PINNED: in-process, UCX); true, DEVICE memory only (CUDA IPC). */
  bool device_memory;
  /* Sends a payload under handle id `id` (assigned by the generic layer). */
  int (*push)(kvbm_fabric *f, const void *data, size_t len, uint64_t id,
              kvbm_error *err);
  int (*next)(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h,
              size_t *len, kvbm_error *err);
  int (*pull)(kvbm_fabric *f, kvbm_fabric_handle h, void *buf, size_t cap,
              size_t *len, int timeout_ms, kvbm_error *err);
  int (*flush)(kvbm_fabric *f, int timeout_ms, kvbm_error *err);
  /* Registers [base, base+len); returns an opaque registration and the key
   * a peer needs (malloc'd, owned by the caller; may be empty). */
  int (*mem_register)(kvbm_fabric *f, void *base, uint64_t len, void **reg,
                      uint8_t **key, size_t *key_len, kvbm_error *err);
  void (*mem_deregister)(kvbm_fabric *f, void *reg);
  /* Allocates len bytes of host memory the fabric can expose best (UCX:
   * ucp_mem_map ALLOCATE, shared-memory capable), page-aligned; *alloc is
   * the handle for mem_free. A later mem_register of a range inside it
   * reuses the allocation's registration. */
  int (*mem_alloc)(kvbm_fabric *f, uint64_t len, void **addr, void **alloc, kvbm_error *err);
  void (*mem_free)(kvbm_fabric *f, void *alloc);
  /* Prepares access to the peer's registered extent [base, base+len). */
  int (*key_attach)(kvbm_fabric *f, uint64_t base, uint64_t len,
                    const uint8_t *key, size_t key_len, void **rkey,
                    kvbm_error *err);
  void (*key_detach)(kvbm_fabric *f, void *rkey);
  /* Starts a one-sided transfer of len bytes between local memory and the
   * peer's address raddr (already range-checked). `lreg` is the local
   * registration covering `local`, or NULL. Completes by flush. */
  int (*rma)(kvbm_fabric *f, bool write, void *rkey, uint64_t raddr,
             void *local, size_t len, void *lreg, kvbm_error *err);
  /* Optional (NULL: never mapped): where the peer's [raddr, raddr+len)
   * (already range-checked) is mapped into this process, readable by any
   * thread until the remote set is released; KVBM_EUNSUPPORTED when this
   * transport does not map it. Lets a reader copy on threads of its own
   * (kvbm_fabric_read_blocks_hashed). */
  int (*map)(kvbm_fabric *f, void *rkey, uint64_t raddr, size_t len,
             const void **out);
  void (*destroy)(kvbm_fabric *f);
} kvbm_fabric_vtable;

typedef struct kvbm_fabric_local_region {
  uint64_t base, len;
  void *reg;
  uint8_t *key;
  size_t key_len;
} kvbm_fabric_local_region;

struct kvbm_fabric_local_set {
  kvbm_fabric *fabric;
  kvbm_layout_desc desc; /* own copy, region_base malloc'd */
  kvbm_fabric_local_region *regions;
  kvbm_fabric_local_set *next; /* in fabric->local_sets */
};

typedef struct kvbm_fabric_remote_region {
  uint64_t base, len; /* the peer's registered extent */
  void *rkey;
} kvbm_fabric_remote_region;

struct kvbm_fabric_remote_set {
  kvbm_fabric *fabric;
  kvbm_layout_desc desc; /* from the layout decoder */
  uint64_t block_bytes;
  kvbm_fabric_remote_region *regions;
};

/* Every implementation's struct starts with this. */
struct kvbm_fabric {
  const kvbm_fabric_vtable *vt;
  char name[KVBM_FABRIC_NAME_MAX + 1];      /* this end's node name */
  char peer_name[KVBM_FABRIC_NAME_MAX + 1]; /* the peer's, as it announced it */
  uint64_t next_push_id;
  int fatal;                  /* sticky error, 0 while healthy */
  char fatal_msg[KVBM_ERROR_MSG_MAX];
  kvbm_fabric_local_set *local_sets; /* to find a local registration */
  /* kvbm_fabric_stats: written by the end's one thread, read by any
   * (a metrics collector), so atomics read and written relaxed */
  _Atomic uint64_t pushes, push_bytes, pulls, pull_bytes, writes, write_bytes, reads, read_bytes,
      failures;
};

/* Initialises the common part (name already validated). */
void kvbm__fabric_base_init(kvbm_fabric *f, const kvbm_fabric_vtable *vt,
                           const char *name);

/* Records a fatal error once (later calls keep the first) and returns it
 * through err. */
int kvbm__fabric_set_fatal(kvbm_fabric *f, kvbm_error *err, int code,
                          const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* KVBM_OK if healthy, else the fatal error (copied to err). */
int kvbm__fabric_check(const kvbm_fabric *f, kvbm_error *err);

/* Checks a node name: NULL is allowed (caller picks a default), otherwise
 * 1..63 printable ASCII bytes. */
int kvbm__fabric_name_check(const char *name, kvbm_error *err);

/* ---- The export envelope (wire.c): a codec, no transport inside ---- */

#define KVBM_FABRIC_WIRE_MAGIC "KVFS"
#define KVBM_FABRIC_WIRE_VERSION 1u
#define KVBM_FABRIC_WIRE_HEADER 24u
#define KVBM_FABRIC_WIRE_REGION 24u /* per region, before its key */
#define KVBM_FABRIC_KEY_MAX 65536u

typedef struct kvbm_fabric_wire_region {
  uint64_t base, len;
  const uint8_t *key; /* encode: the key; decode: points into the input */
  uint32_t key_len;
} kvbm_fabric_wire_region;

/* Encodes desc + one wire region per layout region into a malloc'd buffer. */
int kvbm__fabric_wire_encode(const kvbm_layout_desc *desc,
                            const kvbm_fabric_wire_region *regions,
                            uint8_t **buf, size_t *len, kvbm_error *err);

/* Decodes; on success *desc is the layout decoder's output (release with
 * kvbm_layout_desc_release) and *regions a malloc'd array of
 * desc->num_regions entries whose keys point into buf. Checks that every
 * layout region lies inside its registered extent (KVBM_ERANGE). */
int kvbm__fabric_wire_decode(const uint8_t *buf, size_t len,
                            kvbm_layout_desc *desc,
                            kvbm_fabric_wire_region **regions,
                            kvbm_error *err);

#endif
