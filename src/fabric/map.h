/* SPDX-License-Identifier: Apache-2.0 */
/*
 * map.h (private): where a block of a peer's set is mapped into this
 * process, for a reader above the fabric that hashes what it copies.
 *
 * kvbm_fabric_read_blocks_hashed copies and hashes each piece in one pass
 * where the transport maps the peer's memory (UCX's shared-memory
 * transports, ucp_rkey_ptr; a FullyContiguous set), but its pool hashes
 * plain BLAKE3 only. The manager's peers (src/peer/peers.c) also read
 * keyed blocks (a frame MAC), and must know before asking a peer for a
 * pulled block whether the read will be that one pass or a read and a
 * flush (which waits for the peer's link thread too): both need to ask
 * "is it mapped", which the public interface does not answer. Private:
 * the address is into the peer's memory, which the peer may change at
 * any time; a reader copies out of it and hashes the copy, never the
 * mapping.
 */
#ifndef KVBM_FABRIC_MAP_H
#define KVBM_FABRIC_MAP_H

#include <stdint.h>

#include "kvbm/fabric.h"

/* Block `block` of rs, mapped here: *out its first byte
 * (kvbm_fabric_block_bytes of the set's layout, readable by any thread
 * until rs is released). KVBM_EUNSUPPORTED: not mapped (the transport
 * does not map, or a LayerSeparate set); KVBM_ERANGE: out of range;
 * KVBM_EINVAL: NULL or a set of another fabric. */
int kvbm__fabric_map_block(kvbm_fabric *f, kvbm_fabric_remote_set *rs, uint64_t block, const void **out,
                           kvbm_error *err);

#endif /* KVBM_FABRIC_MAP_H */
