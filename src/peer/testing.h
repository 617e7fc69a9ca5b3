/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/testing.h: test seams of the peers (src/peer/peers.c). Not
 * installed, not exported from libkvbm.so: only the tests and benchmarks
 * reach them, through the static module library. They stay out of
 * kvbm_peer_config so that an engine cannot turn one on by accident.
 */
#ifndef KVBM_PEER_TESTING_H
#define KVBM_PEER_TESTING_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbm/manager.h"

/* Slots examined so far by peer `peer`'s two hash indexes (peer/hindex.h:
 * the blocks it acknowledged, those awaiting its acknowledgement), to
 * check that an acknowledgement costs O(1) probes. KVBM_ENOTFOUND. */
int kvbm__peer_index_probes(kvbm_manager *m, uint32_t peer, uint64_t *probes);
/* Moves peer `peer`'s lease clock ms milliseconds ahead, so a test can
 * age the peer's word past its lease without sleeping. */
int kvbm__peer_skew_clock(kvbm_manager *m, uint32_t peer, int64_t ms);
/* A bad link: bit i of mask set corrupts the (i+1)-th block this
 * manager offloads to a peer from now on (over all peers), one byte
 * flipped in flight after its frame was made (push: in the message; put:
 * written over the landing block after the block). Callable before the
 * first attach (it makes the manager's peer set). KVBM_EINVAL. */
int kvbm__peer_corrupt_offloads(kvbm_manager *m, uint64_t mask);
/* on: this manager answers its peers' pulls by pushing the blocks, as a
 * version 2 peer does, instead of staging them for a one-sided read
 * (KVPB); for a benchmark's before/after in one run. Callable before the
 * first attach. KVBM_EINVAL. */
int kvbm__peer_push_pulls(kvbm_manager *m, bool on);

#endif /* KVBM_PEER_TESTING_H */
