#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_layering.sh: the peers sit above the tiered manager, never in a
# circle with it (issue 23, "The house"; docs/areas/peers.md, "The
# module"). The manager's files include nothing of the peers (they are
# called through the hooks of kvbm/manager.h), the public manager header
# does not pull in kvbm/peer.h, and the peers use the manager only through
# its public header: no tier/*.h internal, no kvbm__ helper of the tier.
# CMakeLists.txt builds kvbm_peer on kvbm_tier and never the other way.
set -euo pipefail
src=${KVBM_SOURCE_DIR:?}
cd "$src"
fail=0
say() { echo "$*"; fail=1; }
[ -d src/peer ] && [ -f include/kvbm/peer.h ] || say "src/peer/ or include/kvbm/peer.h is missing"
# the manager knows no peer header
if grep -nE '#include[[:space:]]*"(kvbm/peer\.h|peer/)' src/tier/*.c src/tier/*.h include/kvbm/manager.h; then
  say "the tier includes a peer header (above)"
fi
# the peers use no tier internal
if grep -nE '#include[[:space:]]*"tier/' src/peer/*.c src/peer/*.h; then
  say "the peers include a tier internal (above)"
fi
# ... nor any of the tier's private kvbm__ functions or its structs' insides
if grep -nE 'kvbm__(sum_|layer_ptr|disagg_|tier|manager_testing|block_hash|copy_block|q_push)|m->(t\[|mu\b|cfg\.)' \
     src/peer/*.c; then
  say "the peers reach into the manager's internals (above)"
fi
# the module graph: peer on tier, tier not on peer
grep -qE '^kvbm_module\(peer +DEPS .*kvbm_tier' CMakeLists.txt || say "kvbm_peer does not name kvbm_tier"
if grep -E '^kvbm_module\(tier ' CMakeLists.txt | grep -q kvbm_peer; then say "kvbm_tier depends on kvbm_peer"; fi
[ "$fail" -eq 0 ] || exit 1
echo "ok: the peers use only kvbm/manager.h; the tier includes nothing of them"
