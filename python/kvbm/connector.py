# SPDX-License-Identifier: Apache-2.0
"""kvbm.connector: kvbm's tiered manager behind vLLM's KV-connector interface.

vLLM (v1) lets a *KV connector* load KV from outside the engine's paged cache
and save KV out of it. Its base class, ``KVConnectorBase_V1``
(vllm/distributed/kv_transfer/kv_connector/v1/base.py), splits the work in
two roles: the scheduler's connector decides what to load and save and
packs it into per-step metadata; each worker's connector carries the
metadata out around the forward pass. This module implements those methods
over ``kvbm.Manager`` without importing vLLM, in two classes:

``KvbmCacheManager`` plays vLLM's ``KVCacheManager``: kvbm's manager *owns
G1*, the engine's paged KV cache. ``get_computed_blocks`` is kvbm's prefill
(prefix walk over G1, G2 and G3, G1 allocation of the whole prompt,
onboarding copies queued), ``allocate_slots`` appends decode tokens,
``free`` destroys the request. The engine's per-layer KV tensors are
zero-copy torch views of G1 (``g1_kv_caches``), so block ids are G1 block ids
and nothing is ever copied between "the engine's cache" and "G1".

``KvbmConnector`` is the connector, one object per role as in vLLM:

- scheduler: ``get_num_new_matched_tokens`` reports the part of kvbm's
  match that is not in G1 yet as *external* tokens, loaded asynchronously
  (vLLM's WAITING_FOR_REMOTE_KVS): blocks onboarding from G2/G3, and G1
  blocks another request has registered but not yet written.
  ``update_state_after_alloc`` records the load, ``build_connector_meta``
  packs the step's loads and saves, ``request_finished`` ends the request's
  connector state (frees are never delayed: kvbm's copies pin their own
  blocks).
- worker: ``register_kv_caches`` checks that every layer tensor *is* a view
  of G1 (anything else would silently bypass kvbm); ``start_load_kv``
  watches the step's loads, ``get_finished`` reports those that have
  landed (and ``get_block_ids_with_load_errors`` the blocks that did not:
  a failed G3 read, a request that went away before writing a block);
  ``save_kv_layer`` checks the layer was written in place;
  ``wait_for_save`` commits, which is what offloads to G2/G3.

Hybrid models. ``KvbmCacheManager`` over a ``kvbm.Manager`` of several KV
cache groups (``groups=``; ``kvbm.groups_from_vllm`` maps vLLM's
``KVCacheConfig``) serves the manager's hybrid requests
(``Manager.hprefill``, ``HybridRequest``): ``get_computed_blocks`` is the
hit every group can serve (vLLM's coordinator rule, in the library) with
one block list per group, as vLLM's ``KVCacheBlocks.blocks[i][j]`` is group
i's block j; the places a group skips (a window's blocks before the window,
Mamba's states before the last) hold ``null_block_id`` where vLLM puts its
null block (block 0 of vLLM's pool: kvbm has no block to spare, so the
default is -1, the engine's padding slot). ``allocate_slots`` appends in
every group (room for all groups first; None and nothing changed without
it), ``get_block_ids`` is a tuple of one list per group, ``commit`` (once
every token the request holds is computed) releases what each group no
longer needs (vLLM's remove_skipped_blocks: the ids turn to null),
``skip_write_blocks`` answers per group (a tuple of sets) and
``dependencies`` over every group's blocks. What differs from one group:
the hit's onboards from G2/G3/G4 are waited for in ``get_computed_blocks``
(the hit is then local, in G1, with its bytes), and a hit that settles
shorter than found (a failed read, a G4 deadline) gets, in kvbm's wait, a
block in every group at each place the engine must now write (no room for
them: the request is dropped and asked for again later). ``KvbmConnector``
serves a hybrid cache manager too: block ids come and go as one list per
group (vLLM's ``get_block_ids()`` tuple; ``request_finished_all_groups``,
vLLM's ``SupportsHMA``), a save carries each group's blocks, the worker
learns each layer's group from ``kv_cache_groups`` (vLLM's
``KVCacheConfig``), and no load is external, the hit being in G1 already
when ``get_computed_blocks`` returns (so a request that shares another's
unwritten blocks is not held back by the connector: the engine skips it
while ``dependencies()`` is not empty, and scheduling it is refused).
vLLM's own cache with a hybrid model goes through
``kvbm.vllm.KvbmConnectorV1`` or ``KvbmOffloadingSpec``.

The order of calls is vLLM's (scheduler: get_computed_blocks,
get_num_new_matched_tokens, allocate_slots, update_state_after_alloc, ...,
build_connector_meta; worker: bind_connector_metadata, start_load_kv,
per layer wait_for_layer_load / save_kv_layer, wait_for_save, get_finished,
get_block_ids_with_load_errors, clear_connector_metadata), and every method
checks it: a call out of order, on the wrong role, or about a request the
connector does not know raises a ``kvbm.Error`` subclass naming what was
wrong (StateError, NotFoundError, InvalidArgumentError; TypeError for wrong
types). Nothing here is thread-safe: one engine thread drives both roles.

Why "external" includes G1 blocks another request is writing. kvbm
registers a prompt's blocks at prefill, before their KV exists (state
UNCOMPUTED), and a later request that matches them must neither write
them (they are their owner's) nor read them until the owner commits. In
vLLM the same block would simply not be cached yet. A request whose match
runs into such blocks therefore waits, exactly like a request whose blocks
are onboarding, until the owner has committed (or gone away, after which
the blocks are recomputed). The cache manager keeps that bookkeeping
(which G1 blocks have a live owner that has not committed them) because
the Python surface of kvbm_mreq says what a request must compute, not
whether a block it does not compute is written yet.

Process model. The metadata is plain data (request ids, token counts, G1
block ids) and pickles, but both roles reach the same ``KvbmCacheManager``:
kvbm's manager lives in one process, the engine's (vLLM's in-process
executor). See docs/areas/connector.md.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
from typing import Any, Iterable, Optional

from . import _kvbm
from ._kvbm import (Error, InvalidArgumentError, NotFoundError, StateError, NoSpaceError,
                    UnsupportedError)

__all__ = [
    "KVConnectorRole",
    "KvbmBlocks",
    "KvbmCacheManager",
    "KvbmConnector",
    "KvbmConnectorMetadata",
    "LoadSpec",
    "SaveSpec",
    "g1_kv_caches",
]

_G1, _G2, _G3 = 0, 1, 2
_UNSET = object()  # KvbmCacheManager(prefix_cache_retention_interval=...) not given

_STATUS = {
    InvalidArgumentError: ("KVBM_EINVAL", -1),
    StateError: ("KVBM_ESTATE", -4),
    NotFoundError: ("KVBM_ENOTFOUND", -6),
    UnsupportedError: ("KVBM_EUNSUPPORTED", -14),
}


def _error(cls, message: str) -> Error:
    """A kvbm.Error subclass instance carrying .status, .code and .message as
    the extension's own errors do."""
    e = cls(message)
    e.status, e.code = _STATUS[cls]
    e.message = message
    return e


class KVConnectorRole(enum.IntEnum):
    """vLLM's KVConnectorRole (same names and values)."""

    SCHEDULER = 0
    WORKER = 1


def _role(role) -> KVConnectorRole:
    if isinstance(role, KVConnectorRole):
        return role
    name = getattr(role, "name", role)  # vLLM's own enum, or a name
    if isinstance(name, str) and name in KVConnectorRole.__members__:
        return KVConnectorRole[name]
    if isinstance(role, int) and not isinstance(role, bool) and role in (0, 1):
        return KVConnectorRole(role)
    raise TypeError(f"KvbmConnector: role must be KVConnectorRole.SCHEDULER or WORKER, got {role!r}")


class KvbmBlocks:
    """vLLM's KVCacheBlocks: G1 block ids, one list per KV-cache group.

    ``KvbmBlocks([ids])`` is one group's (a one-group manager);
    ``KvbmBlocks(groups=[[ids], [ids], ...])`` one list per group, as vLLM's
    ``KVCacheBlocks.blocks[i][j]`` is group i's block j. A hybrid request's
    skipped places (a window's blocks before the window, Mamba's states
    before the last) hold the cache manager's ``null_block_id``, where vLLM
    puts its null block (id 0 in vLLM's pool)."""

    __slots__ = ("groups",)

    def __init__(self, block_ids: Iterable[int] = (), *, groups: Optional[Iterable[Iterable[int]]] = None):
        self.groups = (list(block_ids),) if groups is None else tuple(list(g) for g in groups)

    @property
    def block_ids(self) -> list[int]:
        """Group 0's ids (the only group of a one-group manager)."""
        return self.groups[0]

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and not any(self.groups):
            return None
        return tuple(list(g) for g in self.groups)

    def __len__(self) -> int:
        return len(self.groups[0])

    def __repr__(self) -> str:
        if len(self.groups) == 1:
            return f"KvbmBlocks({self.groups[0]})"
        return f"KvbmBlocks(groups={list(self.groups)})"


def _block_ids_of(blocks, what: str) -> list[int]:
    """G1 block ids from a KVCacheBlocks-like object or a sequence of ints."""
    if hasattr(blocks, "get_block_ids"):
        groups = blocks.get_block_ids()
        if groups is None:
            return []
        if len(groups) != 1:
            raise _error(InvalidArgumentError,
                         f"{what}: {len(groups)} KV-cache groups; kvbm manages one (no hybrid allocator)")
        blocks = groups[0]
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
        raise TypeError(f"{what}: blocks must be KVCacheBlocks or a sequence of block ids, "
                        f"got {type(blocks).__name__}")
    ids = list(blocks)
    for b in ids:
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"{what}: block ids must be ints, got {type(b).__name__}")
    return ids


def _request_id(request, what: str) -> str:
    rid = getattr(request, "request_id", None)
    if not isinstance(rid, str):
        raise TypeError(f"{what}: expected a request with a str request_id, got {type(request).__name__}")
    return rid


def _salt_of(request) -> int:
    """kvbm's salt hash for what vLLM folds into its block hashes: the
    request's cache_salt and LoRA adapter name."""
    parts = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append("lora:" + str(getattr(lora, "lora_name", lora)))
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append("salt:" + str(salt))
    return _kvbm.salt_hash("\0".join(parts)) if parts else 0


# Load states of a request (KvbmCacheManager slots; the connector drives them).
_NO_LOAD, _LOAD_RECORDED, _LOAD_SENT, _LOAD_DONE = 0, 1, 2, 3


class _Slot:
    """One engine request's kvbm request and the connector's state for it."""

    __slots__ = ("rid", "req", "num_tokens", "walk_tokens", "local_tokens", "committed_blocks",
                 "load", "expected_tokens", "finished")

    def __init__(self, rid: str, req):
        self.rid = rid
        self.req = req              # kvbm.Request (kvbm.HybridRequest with groups),
                                    # or None: no room in G1 at prefill
        self.num_tokens = 0         # tokens the kvbm request holds (prompt + appended)
        self.walk_tokens = 0        # kvbm's match (optimistic, before onboarding settles)
        self.local_tokens = 0       # of which in G1 and written: vLLM's local prefix hit
        self.committed_blocks = 0   # full blocks committed (offloaded per policy);
                                    # a hybrid request: tokens committed
        self.load = _NO_LOAD
        self.expected_tokens = 0    # local + external, when a load was recorded
        self.finished = False       # request_finished() was called


class KvbmCacheManager:
    """vLLM's KVCacheManager role over ``kvbm.Manager``: the manager owns G1.

    Methods keep vLLM's names and arguments (``get_computed_blocks``,
    ``allocate_slots``, ``get_blocks``, ``get_block_ids``, ``free``) where
    an engine calls them; the rest is what an engine needs because kvbm
    shares blocks between requests before their KV is written:

    - ``dependencies(request_id)``: live requests whose uncommitted blocks
      this request uses; schedule it only when empty.
    - ``skip_write_blocks(request_id, start, end)``: block indices in the
      token range [start, end) whose KV this request must not write (they
      are another request's, or already hold the right bytes): map their
      slots to -1, as vLLM does for padding.
    - ``commit(request_id, num_computed_tokens)``: the KV of every full
      block is written (the worker connector calls it in wait_for_save).

    A manager of several groups: block lists per group, ``null_block_id``
    (an int that is not a G1 block; default -1) where a group holds nothing,
    ``skip_write_blocks`` a tuple of sets (module notes, "Hybrid models").
    ``prefix_cache_retention_interval``: vLLM's setting (None or 0), checked
    against the one the manager was created with (ValueError if they
    differ); absent: the manager's, which the attribute of that name says.

    Not thread-safe: one engine thread.
    """

    def __init__(self, manager, *, priority: int = 0, null_block_id: int = -1,
                 prefix_cache_retention_interval=_UNSET):
        if not isinstance(manager, _kvbm.Manager):
            raise TypeError(f"KvbmCacheManager: expected a kvbm.Manager, got {type(manager).__name__}")
        # vLLM's CacheConfig.prefix_cache_retention_interval (None: every
        # full block cached; 0, vLLM's default: sparse). The manager fixed
        # its rule at create (Manager(prefix_cache_retention_interval=...)),
        # so here it is a check: an engine that passes vLLM's value learns
        # of a manager built for the other rule at once, instead of caching
        # blocks vLLM's scheduler would not (or the reverse).
        have = manager.prefix_cache_retention_interval
        if prefix_cache_retention_interval is not _UNSET:
            want = prefix_cache_retention_interval
            if want is not None and (isinstance(want, bool) or not isinstance(want, int) or want != 0):
                raise ValueError(f"KvbmCacheManager: prefix_cache_retention_interval must be None "
                                 f"(every full block cached) or 0 (vLLM's sparse retention), not "
                                 f"{want!r}; other intervals are not modelled")
            if want != have:
                raise ValueError(f"KvbmCacheManager: prefix_cache_retention_interval {want!r} but the "
                                 f"manager was created with {have!r}; pass the same value to "
                                 f"kvbm.Manager(prefix_cache_retention_interval=...)")
        self.prefix_cache_retention_interval = have
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255:
            raise _error(InvalidArgumentError,
                         f"KvbmCacheManager: priority must be an int in 0..255, got {priority!r}")
        if isinstance(null_block_id, bool) or not isinstance(null_block_id, int):
            raise TypeError(f"KvbmCacheManager: null_block_id must be an int, got "
                            f"{type(null_block_id).__name__}")
        self.manager = manager
        # Several groups: requests are Manager.hprefill's (module notes,
        # "Hybrid models"); one group keeps kvbm_manager_prefill's request.
        self.num_groups = manager.num_groups
        self.null_block_id = null_block_id
        self.block_size = manager.block_size
        self.num_gpu_blocks = manager.layout(_G1)["num_blocks"]
        if 0 <= null_block_id < self.num_gpu_blocks:
            raise _error(InvalidArgumentError,
                         f"KvbmCacheManager: null_block_id {null_block_id} is a G1 block (0.."
                         f"{self.num_gpu_blocks - 1}); vLLM's null block is a place no group "
                         "reads, kvbm has no block to spare for it")
        self._priority = priority
        self._slots: dict[str, _Slot] = {}
        # G1 block -> the live request that registered it (or receives it by
        # onboarding) and has not committed it yet.
        self._owner: dict[int, str] = {}
        # G1 blocks whose owner went away uncommitted: registered, no KV.
        self._failed: set[int] = set()

    # ---- vLLM's KVCacheManager methods ----

    @property
    def usage(self) -> float:
        """Share of G1 blocks held by requests (cached blocks count as free)."""
        s = self.manager.stats(_G1)
        return s["active"] / max(1, s["num_blocks"])

    def get_computed_blocks(self, request) -> tuple[KvbmBlocks, int]:
        """kvbm's prefill of the request's tokens; returns the G1 blocks of
        its local prefix hit and their token count.

        The whole prompt is allocated here (kvbm allocates and registers at
        prefill: no lookup can go stale before allocation); G2/G3 hits start
        onboarding now. No room in G1: returns no hit, and the following
        allocate_slots returns None (vLLM's "cannot schedule now"). Calling
        it again for a request that has its kvbm request returns the same
        answer (vLLM retries requests it could not schedule)."""
        rid = _request_id(request, "get_computed_blocks")
        if self.num_groups > 1:
            return self._h_computed_blocks(request, rid)
        slot = self._slots.get(rid)
        if slot is None or slot.req is None:
            tokens = list(getattr(request, "all_token_ids", None) or [])
            if not tokens:
                raise _error(InvalidArgumentError,
                             f"get_computed_blocks: request {rid!r} has no tokens")
            try:
                req = self.manager.prefill(tokens, salt_hash=_salt_of(request), priority=self._priority)
            except NoSpaceError:
                self._slots[rid] = _Slot(rid, None)
                return KvbmBlocks(), 0
            slot = self._admit(rid, req, len(tokens))
        table = slot.req.block_table
        return KvbmBlocks(table[: slot.local_tokens // self.block_size]), slot.local_tokens

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       **_ignored) -> Optional[KvbmBlocks]:
        """Slots for ``num_new_tokens`` more tokens after what the request
        has computed (plus the hits passed in). For a request just prefilled
        the prompt's slots exist already; decode tokens are appended to the
        kvbm request (their blocks registered as they fill). None when G1
        has no room (nothing changed): vLLM preempts or stops admitting."""
        rid = _request_id(request, "allocate_slots")
        slot = self._slots.get(rid)
        if slot is None:
            raise _error(NotFoundError,
                         f"allocate_slots: request {rid!r} has no kvbm request; kvbm allocates at "
                         "prefill, in get_computed_blocks, which must come first")
        if slot.req is None:  # get_computed_blocks found no room
            del self._slots[rid]
            return None
        for name, v in (("num_new_tokens", num_new_tokens), ("num_new_computed_tokens", num_new_computed_tokens),
                        ("num_lookahead_tokens", num_lookahead_tokens),
                        ("num_external_computed_tokens", num_external_computed_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _error(InvalidArgumentError, f"allocate_slots: {name} must be an int >= 0, got {v!r}")
        hits = num_new_computed_tokens + num_external_computed_tokens
        if hits and hits > slot.walk_tokens:
            raise _error(InvalidArgumentError,
                         f"allocate_slots: request {rid!r}: {hits} hit tokens, but kvbm matched "
                         f"{slot.walk_tokens}")
        want = int(getattr(request, "num_computed_tokens", 0)) + hits + num_new_tokens + num_lookahead_tokens
        if self.num_groups > 1:
            return self._h_allocate(request, slot, want)
        before = len(slot.req.block_table)
        old = slot.num_tokens
        if not self._grow(request, slot, want):
            return None
        if want > old:
            self._own_sealed(slot, old, want)
        return KvbmBlocks(slot.req.block_table[before:])

    def _grow(self, request, slot: _Slot, want: int) -> bool:
        """Appends the request's tokens up to `want` to its kvbm request
        (one group or every group: Request.append and HybridRequest.append
        check room first and change nothing without it); False when G1
        has no room now."""
        if want <= slot.num_tokens:
            return True
        tokens = list(request.all_token_ids)
        if want > len(tokens):
            raise _error(InvalidArgumentError,
                         f"allocate_slots: request {slot.rid!r} asks for {want} slots but has "
                         f"{len(tokens)} tokens (lookahead slots are not supported)")
        try:
            slot.req.append(tokens[slot.num_tokens:want])
        except NoSpaceError:
            return False
        slot.num_tokens = want
        return True

    def get_blocks(self, request_id: str) -> KvbmBlocks:
        """The request's blocks (every group's table, null_block_id where a
        group holds nothing)."""
        slot = self._live(request_id, "get_blocks")
        if self.num_groups > 1:
            return KvbmBlocks(groups=self._h_tables(slot))
        return KvbmBlocks(slot.req.block_table)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """vLLM's shape: one list of block ids per group."""
        slot = self._live(request_id, "get_block_ids")
        if self.num_groups > 1:
            return tuple(self._h_tables(slot))
        return (slot.req.block_table,)

    def free(self, request) -> None:
        """Destroys the request's kvbm request (waits for its onboards,
        releases its G1 blocks tail first). Blocks it registered and never
        committed have no KV: other requests recompute them."""
        rid = _request_id(request, "free")
        slot = self._slots.pop(rid, None)
        if slot is None:
            raise _error(NotFoundError, f"free: request {rid!r} has no kvbm request")
        if slot.req is None:
            return
        if self.num_groups > 1:
            self._h_disown(slot)
            slot.req.destroy()
            return
        for bid in slot.req.block_table:
            if self._owner.get(bid) == rid:
                del self._owner[bid]
                self._failed.add(bid)
        slot.req.destroy()

    # ---- what kvbm adds ----

    def has_request(self, request_id: str) -> bool:
        """Whether free() has something to free for the request."""
        return request_id in self._slots

    def has_live_request(self, request_id: str) -> bool:
        """Whether the request holds G1 blocks."""
        slot = self._slots.get(request_id)
        return slot is not None and slot.req is not None

    def request(self, request_id: str):
        """The kvbm.Request behind an engine request (for tests and tools)."""
        return self._live(request_id, "request").req

    def hit_tokens(self, request_id: str) -> tuple[int, int]:
        """(local G1 hit, kvbm's whole match) in tokens, as found at prefill."""
        slot = self._live(request_id, "hit_tokens")
        return slot.local_tokens, slot.walk_tokens

    def dependencies(self, request_id: str) -> set[str]:
        """Live requests that registered blocks this request uses and have
        not written them yet. Reading those blocks now would read garbage."""
        slot = self._live(request_id, "dependencies")
        full = slot.num_tokens // self.block_size
        if self.num_groups > 1:
            return {o for ids in slot.req.tables for bid in ids[:full] if bid is not None
                    for o in (self._owner.get(bid),) if o is not None and o != request_id}
        deps = set()
        for bid in slot.req.block_table[:full]:
            owner = self._owner.get(bid)
            if owner is not None and owner != request_id:
                deps.add(owner)
        return deps

    def skip_write_blocks(self, request_id: str, start: int, end: int):
        """Block indices covering tokens [start, end) whose KV this request
        must not write (kvbm's must_compute is false: another request's
        block, or one that already holds its bytes). Several groups: a tuple
        of one such set per group (a group's null places are in it)."""
        slot = self._live(request_id, "skip_write_blocks")
        if not 0 <= start <= end <= slot.num_tokens:
            raise _error(InvalidArgumentError,
                         f"skip_write_blocks: tokens [{start}, {end}) outside request "
                         f"{request_id!r}'s {slot.num_tokens}")
        bs = self.block_size
        if self.num_groups > 1:
            return tuple({k for k in range(start // bs, -(-end // bs)) if not slot.req.must_compute(g, k)}
                         for g in range(self.num_groups))
        return {k for k in range(start // bs, -(-end // bs)) if not slot.req.must_compute(k)}

    def commit(self, request_id: str, num_computed_tokens: int) -> bool:
        """Tells kvbm the KV of the request's full blocks is written, once
        all of them are (a prefill computed in chunks commits after its last
        chunk). Offloads to G2/G3 per policy. Returns whether it committed."""
        slot = self._live(request_id, "commit")
        if self.num_groups > 1:
            return self._h_commit(slot, num_computed_tokens)
        full = slot.num_tokens // self.block_size
        if num_computed_tokens // self.block_size < full or full <= slot.committed_blocks:
            return False
        slot.req.commit()
        slot.committed_blocks = full
        for bid in slot.req.block_table[:full]:
            if self._owner.get(bid) == request_id:
                del self._owner[bid]
            self._failed.discard(bid)
        return True

    # ---- hybrid requests (a Manager of several groups) ----

    def _h_tables(self, slot: _Slot, start: int = 0, end: Optional[int] = None) -> list[list[int]]:
        """Every group's table[start:end], None (kvbm's null) as null_block_id."""
        null = self.null_block_id
        return [[null if b is None else b for b in t[start:end]] for t in slot.req.tables]

    def _h_computed_blocks(self, request, rid: str) -> tuple[KvbmBlocks, int]:
        """get_computed_blocks with groups: Manager.hprefill (the hit by the
        group rule, the whole prompt allocated in every group, onboards
        queued), then waits for the onboards, so the settled hit is local:
        its blocks hold their KV when this returns."""
        slot = self._slots.get(rid)
        if slot is None or slot.req is None:
            tokens = list(getattr(request, "all_token_ids", None) or [])
            if not tokens:
                raise _error(InvalidArgumentError, f"get_computed_blocks: request {rid!r} has no tokens")
            req = self._h_prefill(request, tokens)
            if req is None:  # no room (or no settled hit to hand out): not now
                self._slots[rid] = _Slot(rid, None)
                return KvbmBlocks(groups=[[]] * self.num_groups), 0
            slot = self._h_admit(rid, req, len(tokens))
        hit = slot.local_tokens
        return KvbmBlocks(groups=self._h_tables(slot, 0, hit // self.block_size)), hit

    def _h_prefill(self, request, tokens):
        """Manager.hprefill whose onboards are over: the hit found may
        settle shorter (a failed read, a G4 deadline), and kvbm's wait then
        gives every group a block at each place its rule needs from the
        settled hit on (vLLM's allocate_slots after a load failure cut the
        computed tokens back), so no group hands the engine a null where it
        must write. None: no room in G1 for the prompt, or, once the hit
        settled short, for those places (NoSpaceError from wait): the
        request is dropped and asked for again at a later step, as vLLM
        leaves a request waiting when allocate_slots returns None."""
        try:
            req = self.manager.hprefill(tokens, salt_hash=_salt_of(request), priority=self._priority)
        except NoSpaceError:
            return None
        try:
            req.wait()
        except NoSpaceError:
            req.destroy()
            return None
        return req

    def _h_admit(self, rid: str, req, n: int) -> _Slot:
        slot = _Slot(rid, req)
        slot.num_tokens = n
        slot.walk_tokens = slot.local_tokens = req.wait()["hit_tokens"]
        slot.load = _LOAD_DONE  # nothing left to load: the onboards are over
        self._slots[rid] = slot
        self._h_own(slot, 0, n)
        return slot

    def _h_own(self, slot: _Slot, old: int, new: int) -> None:
        """Full blocks between token counts old and new that this request
        registered (must write) are its own until it commits; a request that
        shares them (registered before their KV exists) depends on it."""
        for g, table in enumerate(slot.req.tables):
            for k in range(old // self.block_size, new // self.block_size):
                bid = table[k]
                if bid is not None and bid not in self._owner and slot.req.must_compute(g, k):
                    self._owner[bid] = slot.rid

    def _h_disown(self, slot: _Slot) -> None:
        for table in slot.req.tables:
            for bid in table:
                if bid is not None and self._owner.get(bid) == slot.rid:
                    del self._owner[bid]

    def _h_allocate(self, request, slot: _Slot, want: int) -> Optional[KvbmBlocks]:
        """allocate_slots with groups: HybridRequest.append grows every
        group's table (room in G1 for all of them checked first: no room
        returns None, nothing changed); returns each group's new blocks."""
        before = len(slot.req.tables[0])
        old = slot.num_tokens
        if not self._grow(request, slot, want):
            return None
        if want > old:
            self._h_own(slot, old, want)
        return KvbmBlocks(groups=self._h_tables(slot, before))

    def _h_commit(self, slot: _Slot, num_computed_tokens: int) -> bool:
        """commit with groups: HybridRequest.commit says every token the
        request holds is computed (kvbm releases what each group no longer
        needs at that length), so it waits for the last of them; commits
        once per new token count."""
        if isinstance(num_computed_tokens, bool) or not isinstance(num_computed_tokens, int):
            raise TypeError("commit: num_computed_tokens must be an int")
        if num_computed_tokens < slot.num_tokens or slot.num_tokens <= slot.committed_blocks:
            return False
        self._h_disown(slot)  # before the commit, which turns window blocks into nulls
        slot.req.commit()
        slot.committed_blocks = slot.num_tokens  # with groups: tokens committed
        return True

    # ---- internals ----

    def _live(self, request_id, what: str) -> _Slot:
        if not isinstance(request_id, str):
            raise TypeError(f"{what}: request_id must be a str, got {type(request_id).__name__}")
        slot = self._slots.get(request_id)
        if slot is None or slot.req is None:
            raise _error(NotFoundError, f"{what}: request {request_id!r} has no kvbm request")
        return slot

    def _admit(self, rid: str, req, n: int) -> _Slot:
        """Bookkeeping after a prefill: the local hit (the leading G1 blocks
        whose KV is written) and the blocks this request now owns."""
        bs = self.block_size
        slot = _Slot(rid, req)
        slot.num_tokens = n
        table = req.block_table
        walk = req.matched_tokens // bs
        src = [req.block_source(k) for k in range(walk)]
        local = 0
        while local < walk and src[local] == _G1:
            bid = table[local]
            owner = self._owner.get(bid)
            if (owner is not None and owner != rid) or bid in self._failed:
                break
            local += 1
        for k in range(n // bs):
            if k < walk and src[k] == _G1:
                continue  # a G1 hit: its owner, if any, stays its owner
            bid = table[k]
            if bid not in self._owner:  # registered or onboarded by this request
                self._owner[bid] = rid
                self._failed.discard(bid)
        slot.walk_tokens, slot.local_tokens = walk * bs, local * bs
        if local == walk:
            # Nothing to load or wait for: settle now (an untracked unwritten
            # block would shorten the match here rather than be read).
            info = req.poll()
            if info.ready and info.matched_tokens < slot.walk_tokens:
                slot.walk_tokens = slot.local_tokens = info.matched_tokens
        self._slots[rid] = slot
        return slot

    def _own_sealed(self, slot: _Slot, old: int, new: int) -> None:
        """Blocks that filled between token counts old and new: the ones the
        request must write are its own until it commits."""
        table = slot.req.block_table
        for k in range(old // self.block_size, new // self.block_size):
            bid = table[k]
            if slot.req.must_compute(k) and bid not in self._owner:
                self._owner[bid] = slot.rid
                self._failed.discard(bid)

    def _load_finished(self, slot: _Slot) -> Optional[int]:
        """None while the request's KV is still on its way (a dependency has
        not committed, or an onboard is in flight); otherwise the settled
        match in tokens."""
        if self.dependencies(slot.rid):
            return None  # do not settle while an owner has not written: the match would end there
        info = slot.req.poll()
        return info.matched_tokens if info.ready else None


@dataclasses.dataclass
class LoadSpec:
    """A request whose KV is being loaded into G1 (asynchronously)."""

    request_id: str
    local_tokens: int       # already in G1 (vLLM's local hit)
    expected_tokens: int    # local + external: what the request will have when loaded
    block_ids: list[int]    # G1 blocks receiving the external tokens


@dataclasses.dataclass
class SaveSpec:
    """A request that computes KV for tokens [start, end) in this step."""

    request_id: str
    start: int
    end: int
    # Several KV cache groups: each group's G1 blocks covering [start, end)
    # (the cache manager's null_block_id where the group holds none), as
    # vLLM's tuple of one block list per group; None with one group.
    group_block_ids: Optional[list[list[int]]] = None


@dataclasses.dataclass
class KvbmConnectorMetadata:
    """Scheduler -> worker, one per step (vLLM's KVConnectorMetadata)."""

    step: int
    loads: list[LoadSpec] = dataclasses.field(default_factory=list)
    saves: list[SaveSpec] = dataclasses.field(default_factory=list)
    finished_req_ids: set[str] = dataclasses.field(default_factory=set)


def _g1_regions(manager) -> tuple[dict, list[tuple[int, int]]]:
    """The G1 layout and (address, size) of each of its host regions."""
    layout = manager.layout(_G1)
    regions = []
    for i in range(layout["num_regions"]):
        mv = manager.region(_G1, i)
        try:
            c = ctypes.c_char.from_buffer(mv)
            addr = ctypes.addressof(c)
            del c
        finally:
            mv.release()
        regions.append((addr, layout["region_size"]))
    return layout, regions


def _torch_dtype(torch, dtype_size: int, dtype):
    if dtype is None:
        dtype = {4: torch.float32, 8: torch.float64, 2: torch.float16, 1: torch.uint8}.get(dtype_size)
    if dtype is None or torch.empty((), dtype=dtype).element_size() != dtype_size:
        raise _error(InvalidArgumentError,
                     f"g1_kv_caches: dtype {dtype} does not have the manager's {dtype_size}-byte elements")
    return dtype


def g1_kv_caches(manager, layer_names: Iterable[str], *, num_kv_heads: int, dtype=None) -> dict:
    """Zero-copy torch views of the manager's G1 memory, one per layer:
    ``{name: tensor[num_blocks, outer_dim, block_size, num_kv_heads, head_size]}``
    (FlashInfer's paged layout; outer index 0 is K, 1 is V). Writing a view
    writes G1. The views keep the manager alive and make ``close()`` raise
    BusyError until they are dropped. ``dtype`` defaults to the float type
    of the manager's element size (uint8 for 1 byte)."""
    import torch

    layout, _ = _g1_regions(manager)
    names = list(layer_names)
    if len(names) != layout["num_layers"] or len(set(names)) != len(names):
        raise _error(InvalidArgumentError,
                     f"g1_kv_caches: {len(names)} layer names for a manager of {layout['num_layers']} layers "
                     "(names must be distinct)")
    inner = layout["inner_dim"]
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads <= 0 \
            or inner % num_kv_heads:
        raise _error(InvalidArgumentError,
                     f"g1_kv_caches: num_kv_heads {num_kv_heads!r} does not divide inner_dim {inner}")
    dtype = _torch_dtype(torch, layout["dtype_size"], dtype)
    esz = layout["dtype_size"]
    shape = (layout["num_blocks"], layout["outer_dim"], layout["page_size"], num_kv_heads, inner // num_kv_heads)
    strides = (layout["block_stride"] // esz, layout["outer_stride"] // esz, inner, inner // num_kv_heads, 1)
    layer_separate = layout["kind"] == "layer_separate"
    out = {}
    flat = None
    for l, name in enumerate(names):
        if layer_separate or flat is None:
            region = manager.region(_G1, l if layer_separate else 0)
            flat = torch.frombuffer(region, dtype=dtype)
        offset = 0 if layer_separate else l * layout["layer_stride"] // esz
        out[name] = flat.as_strided(shape, strides, offset)
    return out


def _layer_groups(kv_cache_groups, num_groups: int) -> Optional[dict[str, int]]:
    """Layer name -> group from vLLM's KVCacheConfig (its .kv_cache_groups),
    a list of KVCacheGroupSpec (each .layer_names), or a list of layer-name
    lists, one per group; None when not given."""
    if kv_cache_groups is None:
        return None
    groups = getattr(kv_cache_groups, "kv_cache_groups", kv_cache_groups)
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError("KvbmConnector: kv_cache_groups must be a KVCacheConfig or a list of groups")
    groups = [getattr(g, "layer_names", g) for g in groups]
    if len(groups) != num_groups:
        raise _error(InvalidArgumentError,
                     f"KvbmConnector: kv_cache_groups has {len(groups)} groups, the cache manager "
                     f"{num_groups}")
    out: dict[str, int] = {}
    for g, names in enumerate(groups):
        if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
            raise TypeError(f"KvbmConnector: group {g}'s layer names must be a list of str")
        names = list(names)
        if not names:
            raise _error(InvalidArgumentError, f"KvbmConnector: group {g} has no layers")
        for n in names:
            if not isinstance(n, str):
                raise TypeError(f"KvbmConnector: group {g}'s layer names must be str, got {type(n).__name__}")
            if n in out:
                raise _error(InvalidArgumentError,
                             f"KvbmConnector: layer {n!r} is in groups {out[n]} and {g} (a layer "
                             "belongs to one group)")
            out[n] = g
    return out


def _group_block_ids(blocks, num_groups: int, what: str) -> list[list[int]]:
    """One G1 block-id list per group from vLLM's KVCacheBlocks (or its
    get_block_ids() tuple): what a hybrid scheduler passes."""
    groups = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
    if groups is None:
        return [[] for _ in range(num_groups)]
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise TypeError(f"{what}: blocks must be KVCacheBlocks or a tuple of block-id lists, "
                        f"got {type(groups).__name__}")
    groups = list(groups)
    if len(groups) != num_groups:
        raise _error(InvalidArgumentError,
                     f"{what}: {len(groups)} block lists for a cache manager of {num_groups} KV cache "
                     "groups (one list per group)")
    return [_block_ids_of(g, what) for g in groups]


class KvbmConnector:
    """vLLM's KVConnectorBase_V1 methods over kvbm (see the module notes).

    ``KvbmConnector(role, cache_manager)``: ``role`` is
    KVConnectorRole.SCHEDULER or WORKER (vLLM's enum works too);
    ``cache_manager`` the engine's KvbmCacheManager, shared by both roles.

    A cache manager of several KV cache groups (a hybrid model): block ids
    come and go as one list per group (vLLM's ``get_block_ids()`` tuple);
    ``kv_cache_groups`` (vLLM's KVCacheConfig, or one layer-name list per
    group) says which group each layer is in, which the worker's
    ``register_kv_caches`` needs; the hit is settled in G1 by
    ``get_computed_blocks``, so no load is ever external; ``wait_for_save``
    commits every group through the cache manager; ``SupportsHMA``'s
    ``request_finished_all_groups`` is served.
    """

    def __init__(self, role, cache_manager: KvbmCacheManager, *, kv_cache_groups=None):
        if not isinstance(cache_manager, KvbmCacheManager):
            raise TypeError(f"KvbmConnector: expected a KvbmCacheManager, got {type(cache_manager).__name__}")
        self._role = _role(role)
        self._cache = cache_manager
        # Several groups (a hybrid model): the hit is settled, bytes in G1,
        # by get_computed_blocks, so there is nothing to load; saves commit
        # every group through the cache manager (module notes, "Hybrid").
        self._num_groups = cache_manager.num_groups
        self._layer_group = _layer_groups(kv_cache_groups, self._num_groups)
        self._closed = False
        # scheduler side
        self._recorded: list[str] = []
        self._step = 0
        # worker side
        # name -> (kvbm layer, shape, stride, data_ptr, group)
        self._layers: dict[str, tuple[int, tuple, tuple, int, int]] = {}
        self._meta: Optional[KvbmConnectorMetadata] = None
        self._started = False
        self._saved: set[str] = set()
        self._loading: dict[str, LoadSpec] = {}
        self._load_errors: set[int] = set()

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    def _check(self, role: KVConnectorRole, what: str) -> None:
        if self._closed:
            raise _error(StateError, f"{what}: the connector is shut down")
        if self._role != role:
            raise _error(StateError,
                         f"{what} is a {role.name.lower()}-side method; this connector's role is "
                         f"{self._role.name}")

    def _slot(self, request_id: str, what: str) -> _Slot:
        slot = self._cache._slots.get(request_id)
        if slot is None:
            raise _error(NotFoundError,
                         f"{what}: unknown request {request_id!r} (no kvbm request: the engine's KV "
                         "cache manager must be this connector's KvbmCacheManager, and "
                         "get_computed_blocks must come first)")
        return slot

    # ================= scheduler side =================

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond the local G1 hit that kvbm will load: blocks
        onboarding from G2/G3 and G1 blocks another request is still
        writing. Always asynchronous (True) when there are any; (0, False)
        otherwise. Side-effect free; may be called again."""
        self._check(KVConnectorRole.SCHEDULER, "get_num_new_matched_tokens")
        rid = _request_id(request, "get_num_new_matched_tokens")
        if isinstance(num_computed_tokens, bool) or not isinstance(num_computed_tokens, int):
            raise TypeError("get_num_new_matched_tokens: num_computed_tokens must be an int")
        slot = self._slot(rid, "get_num_new_matched_tokens")
        if slot.req is None:
            return 0, False  # no room in G1: allocate_slots will say so
        if num_computed_tokens != slot.local_tokens:
            raise _error(InvalidArgumentError,
                         f"get_num_new_matched_tokens: request {rid!r}: num_computed_tokens "
                         f"{num_computed_tokens}, but its local G1 hit is {slot.local_tokens} tokens "
                         "(pass what get_computed_blocks returned)")
        if slot.load != _NO_LOAD:
            return 0, False  # already loaded (or loading): nothing new beyond it
        ext = slot.walk_tokens - slot.local_tokens
        return (ext, True) if ext > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """Records the load of ``num_external_tokens`` into the request's
        blocks (kvbm already queued the copies at prefill; the worker watches
        them from the next step). A call with 0 records nothing (vLLM calls
        again after the load, and for requests without external tokens)."""
        self._check(KVConnectorRole.SCHEDULER, "update_state_after_alloc")
        rid = _request_id(request, "update_state_after_alloc")
        if isinstance(num_external_tokens, bool) or not isinstance(num_external_tokens, int) \
                or num_external_tokens < 0:
            raise _error(InvalidArgumentError,
                         f"update_state_after_alloc: num_external_tokens must be an int >= 0, "
                         f"got {num_external_tokens!r}")
        slot = self._slot(rid, "update_state_after_alloc")
        if self._num_groups > 1:
            self._h_after_alloc(rid, slot, blocks, num_external_tokens)
            return
        ids = _block_ids_of(blocks, "update_state_after_alloc")
        if slot.req is None:
            raise _error(StateError,
                         f"update_state_after_alloc: request {rid!r} got no G1 blocks (allocate_slots "
                         "returned None)")
        table = slot.req.block_table
        if ids != table[: len(ids)]:
            raise _error(InvalidArgumentError,
                         f"update_state_after_alloc: request {rid!r}: blocks {ids[:8]}... are not its "
                         f"kvbm block table {table[:8]}...: allocate through KvbmCacheManager")
        if num_external_tokens == 0:
            return
        ext = slot.walk_tokens - slot.local_tokens
        if slot.load != _NO_LOAD:
            raise _error(StateError,
                         f"update_state_after_alloc: request {rid!r}: its load was recorded already")
        if num_external_tokens != ext:
            raise _error(InvalidArgumentError,
                         f"update_state_after_alloc: request {rid!r}: {num_external_tokens} external "
                         f"tokens, but get_num_new_matched_tokens reported {ext}")
        slot.load = _LOAD_RECORDED
        slot.expected_tokens = slot.local_tokens + ext
        self._recorded.append(rid)

    def _h_after_alloc(self, rid: str, slot: _Slot, blocks, num_external_tokens: int) -> None:
        """update_state_after_alloc with groups: each group's blocks must be
        the request's table in that group (nulls where the group holds
        none); nothing is recorded, the hit being local already."""
        ids = _group_block_ids(blocks, self._num_groups, "update_state_after_alloc")
        if slot.req is None:
            raise _error(StateError,
                         f"update_state_after_alloc: request {rid!r} got no G1 blocks (allocate_slots "
                         "returned None)")
        tables = self._cache._h_tables(slot)
        for g, (got, table) in enumerate(zip(ids, tables)):
            if got != table[: len(got)]:
                raise _error(InvalidArgumentError,
                             f"update_state_after_alloc: request {rid!r}: group {g}'s blocks "
                             f"{got[:8]}... are not its kvbm block table {table[:8]}...: allocate "
                             "through KvbmCacheManager")
        if num_external_tokens != 0:
            raise _error(InvalidArgumentError,
                         f"update_state_after_alloc: request {rid!r}: {num_external_tokens} external "
                         "tokens, but a hybrid cache manager's hit is local (get_computed_blocks "
                         "settled it; get_num_new_matched_tokens reported 0)")

    def build_connector_meta(self, scheduler_output) -> KvbmConnectorMetadata:
        """This step's loads (recorded since the last call) and saves (every
        scheduled request: tokens [num_computed, num_computed + scheduled)).
        Resets the recorded loads; does not modify scheduler_output."""
        self._check(KVConnectorRole.SCHEDULER, "build_connector_meta")
        # Check everything before changing anything: a refused call loses no load.
        saves = []
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None)
        if not isinstance(scheduled, dict):
            raise TypeError("build_connector_meta: scheduler_output.num_scheduled_tokens must be a dict")
        computed = {}
        for nr in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            computed[nr.req_id] = nr.num_computed_tokens
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for rid, n in scheduled.items():
            if rid not in computed:
                raise _error(InvalidArgumentError,
                             f"build_connector_meta: request {rid!r} is scheduled but in neither "
                             "scheduled_new_reqs nor scheduled_cached_reqs")
            slot = self._slot(rid, "build_connector_meta")
            if slot.req is None:
                raise _error(StateError, f"build_connector_meta: request {rid!r} has no G1 blocks")
            if slot.load in (_LOAD_RECORDED, _LOAD_SENT):
                raise _error(StateError,
                             f"build_connector_meta: request {rid!r} is scheduled while its KV is still "
                             "loading (wait for get_finished to report it)")
            start = computed[rid]
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or start + n > slot.num_tokens:
                raise _error(InvalidArgumentError,
                             f"build_connector_meta: request {rid!r}: {n!r} tokens after {start}, but "
                             f"it has slots for {slot.num_tokens}")
            saves.append(self._save_spec(rid, slot, start, start + n))
        meta = KvbmConnectorMetadata(step=self._step)
        bs = self._cache.block_size
        for rid in self._recorded:
            slot = self._cache._slots.get(rid)
            if slot is None or slot.load != _LOAD_RECORDED:
                continue  # freed before this step (aborted)
            slot.load = _LOAD_SENT
            table = slot.req.block_table
            meta.loads.append(LoadSpec(rid, slot.local_tokens, slot.expected_tokens,
                                       table[slot.local_tokens // bs: slot.expected_tokens // bs]))
        self._recorded = []
        meta.saves = saves
        meta.finished_req_ids = set(getattr(scheduler_output, "finished_req_ids", ()) or ())
        self._step += 1
        return meta

    def _save_spec(self, rid: str, slot: _Slot, start: int, end: int) -> SaveSpec:
        """One scheduled request's save. With groups it carries each
        group's blocks of [start, end), and the request must not read
        blocks another request has yet to write (a hybrid hit is local at
        once, so nothing else holds it back: the engine skips a request
        while ``dependencies()`` is not empty)."""
        if self._num_groups == 1:
            return SaveSpec(rid, start, end)
        deps = self._cache.dependencies(rid)
        if deps:
            raise _error(StateError,
                         f"build_connector_meta: request {rid!r} is scheduled but reads blocks that "
                         f"{sorted(deps)} registered and have not written yet (skip it while "
                         "KvbmCacheManager.dependencies() is not empty)")
        bs = self._cache.block_size
        return SaveSpec(rid, start, end, self._cache._h_tables(slot, start // bs, -(-end // bs)))

    def request_finished(self, request, block_ids) -> tuple[bool, Optional[dict[str, Any]]]:
        """Called once when the request finishes, before its blocks are
        freed. Never delays the free (False): kvbm's offload copies hold
        their own references to the G1 blocks they read. With groups,
        ``block_ids`` is one list per group (request_finished_all_groups)."""
        self._check(KVConnectorRole.SCHEDULER, "request_finished")
        rid = _request_id(request, "request_finished")
        if self._num_groups > 1:
            _group_block_ids(block_ids, self._num_groups, "request_finished")
        else:
            _block_ids_of(block_ids, "request_finished")
        slot = self._cache._slots.get(rid)
        if slot is None:
            return False, None  # never reached kvbm (aborted while waiting): nothing to do
        if slot.finished:
            raise _error(StateError, f"request_finished: request {rid!r} finished already")
        slot.finished = True
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, Optional[dict[str, Any]]]:
        """vLLM's SupportsHMA entry point (called instead of request_finished
        when the hybrid allocator is on): ``block_ids`` is one list per
        group. Same contract as request_finished."""
        if self._num_groups == 1:
            self._check(KVConnectorRole.SCHEDULER, "request_finished_all_groups")
            block_ids = _group_block_ids(block_ids, 1, "request_finished_all_groups")[0]
        return self.request_finished(request, block_ids)

    def update_connector_output(self, connector_output) -> None:
        """Nothing to do: the worker reports through get_finished."""
        self._check(KVConnectorRole.SCHEDULER, "update_connector_output")

    def take_events(self):
        return ()

    # ================= worker side =================

    def register_kv_caches(self, kv_caches: dict) -> None:
        """The engine's per-layer paged KV tensors, which must be views of
        the manager's G1 memory (g1_kv_caches makes them): one per kvbm
        layer, block dimension first with G1's block stride. A tensor
        anywhere else would bypass kvbm, so it is refused. With groups:
        every layer of kv_cache_groups, each kvbm layer once per group
        (layers of different groups share it, as vLLM's KVCacheTensor)."""
        self._check(KVConnectorRole.WORKER, "register_kv_caches")
        if self._layers:
            raise _error(StateError, "register_kv_caches: KV caches are registered already")
        if not isinstance(kv_caches, dict) or not kv_caches:
            raise TypeError("register_kv_caches: expected a non-empty dict of layer name -> tensor")
        hybrid = self._num_groups > 1
        if hybrid and self._layer_group is None:
            raise _error(StateError,
                         f"register_kv_caches: the cache manager has {self._num_groups} KV cache groups; "
                         "say which layers are in which (KvbmConnector(..., kv_cache_groups=))")
        layout, regions = _g1_regions(self._cache.manager)
        esz = layout["dtype_size"]
        layers = {}
        for name, t in kv_caches.items():
            if not isinstance(name, str) or not all(hasattr(t, a) for a in ("data_ptr", "stride", "shape")):
                raise TypeError(f"register_kv_caches: {name!r}: expected str -> tensor")
            group = 0
            if self._layer_group is not None:
                if name not in self._layer_group:
                    raise _error(NotFoundError,
                                 f"register_kv_caches: layer {name!r} is in no KV cache group "
                                 "(kv_cache_groups)")
                group = self._layer_group[name]
            ptr = t.data_ptr()
            where = [(i, ptr - a) for i, (a, size) in enumerate(regions) if a <= ptr < a + size]
            if not where or t.element_size() != esz:
                raise _error(InvalidArgumentError,
                             f"register_kv_caches: layer {name!r} is not a view of kvbm's G1 memory "
                             "(make the KV caches with kvbm.connector.g1_kv_caches)")
            region, off = where[0]
            layer = region if layout["kind"] == "layer_separate" else off // layout["layer_stride"]
            per_block = 1
            for d in tuple(t.shape)[1:]:
                per_block *= d
            # With groups a layer may use less than its share of a block (a
            # Mamba state smaller than a page of KV).
            fits = per_block * esz <= layout["layer_stride"] if hybrid \
                else per_block * esz == layout["layer_stride"]
            if off % layout["layer_stride"] or tuple(t.shape)[0] != layout["num_blocks"] \
                    or t.stride(0) * esz != layout["block_stride"] or layer >= layout["num_layers"] \
                    or not fits:
                raise _error(InvalidArgumentError,
                             f"register_kv_caches: layer {name!r} views G1 but not as [num_blocks, ...] "
                             "starting at a layer (block stride, start or block count differ)")
            # Layers of different groups share a kvbm layer (vLLM's
            # KVCacheTensor shared_by): a block is in one group at a time.
            if any(v[0] == layer and v[4] == group for v in layers.values()):
                raise _error(InvalidArgumentError,
                             f"register_kv_caches: layer {name!r} views kvbm layer {layer}, which another "
                             f"name views too (in group {group})")
            layers[name] = (layer, tuple(t.shape), tuple(t.stride()), ptr, group)
        if self._layer_group is not None and set(layers) != set(self._layer_group):
            raise _error(InvalidArgumentError,
                         f"register_kv_caches: layers {sorted(set(self._layer_group) - set(layers))} of "
                         "kv_cache_groups have no KV cache")
        if not hybrid and len(layers) != layout["num_layers"]:
            raise _error(InvalidArgumentError,
                         f"register_kv_caches: {len(layers)} layers for a manager of {layout['num_layers']}")
        self._layers = layers

    def bind_connector_metadata(self, connector_metadata: KvbmConnectorMetadata) -> None:
        self._check(KVConnectorRole.WORKER, "bind_connector_metadata")
        if not isinstance(connector_metadata, KvbmConnectorMetadata):
            raise TypeError(f"bind_connector_metadata: expected KvbmConnectorMetadata, got "
                            f"{type(connector_metadata).__name__}")
        if self._meta is not None:
            raise _error(StateError,
                         "bind_connector_metadata: metadata of the previous step is still bound "
                         "(clear_connector_metadata ends a step)")
        self._meta = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._check(KVConnectorRole.WORKER, "clear_connector_metadata")
        self._meta = None
        self._started = False
        self._saved = set()

    def has_connector_metadata(self) -> bool:
        return self._meta is not None

    def _bound(self, what: str) -> KvbmConnectorMetadata:
        self._check(KVConnectorRole.WORKER, what)
        if self._meta is None:
            raise _error(StateError, f"{what}: no connector metadata bound (bind_connector_metadata first)")
        return self._meta

    def start_load_kv(self, forward_context, **kwargs) -> None:
        """Takes the step's loads: kvbm started their copies at prefill;
        from now on get_finished reports each when it has landed."""
        meta = self._bound("start_load_kv")
        if not self._layers:
            raise _error(StateError, "start_load_kv: no KV caches registered (register_kv_caches first)")
        if self._started:
            raise _error(StateError, "start_load_kv: called twice in one step")
        for load in meta.loads:
            if load.request_id in self._loading:
                raise _error(StateError, f"start_load_kv: request {load.request_id!r} is loading already")
            self._loading[load.request_id] = load
        self._started = True

    def _layer(self, layer_name, what: str):
        if not self._started:
            raise _error(StateError, f"{what}: start_load_kv has not run in this step")
        if layer_name not in self._layers:
            raise _error(NotFoundError, f"{what}: unknown layer {layer_name!r} (not registered)")
        return self._layers[layer_name]

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are asynchronous: a request is scheduled only after its
        load was reported finished, so nothing is waited for; checks that no
        request of this step is still loading."""
        meta = self._bound("wait_for_layer_load")
        self._layer(layer_name, "wait_for_layer_load")
        for s in meta.saves:
            if s.request_id in self._loading:
                raise _error(StateError,
                             f"wait_for_layer_load: request {s.request_id!r} runs in this step but its "
                             "KV is still loading")

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        """The engine wrote this layer's KV into its G1 view: nothing to
        copy. Checks it is the registered view."""
        self._bound("save_kv_layer")
        layer, shape, stride, ptr, _ = self._layer(layer_name, "save_kv_layer")
        if not hasattr(kv_layer, "data_ptr") or kv_layer.data_ptr() != ptr \
                or tuple(kv_layer.shape) != shape or tuple(kv_layer.stride()) != stride:
            raise _error(InvalidArgumentError,
                         f"save_kv_layer: the tensor given for layer {layer_name!r} is not its "
                         "registered G1 view (kvbm saves in place)")
        if layer_name in self._saved:
            raise _error(StateError, f"save_kv_layer: layer {layer_name!r} saved twice in one step")
        self._saved.add(layer_name)

    def wait_for_save(self) -> None:
        """Every layer is written: commits each request whose full blocks
        are all computed now, which registers them as valid in G1 and
        offloads them to G2/G3 per policy (the copies run on kvbm's
        workers; nothing waits for them)."""
        meta = self._bound("wait_for_save")
        if not self._started:
            raise _error(StateError, "wait_for_save: start_load_kv has not run in this step")
        missing = sorted(set(self._layers) - self._saved)
        if meta.saves and missing:
            raise _error(StateError, f"wait_for_save: save_kv_layer was not called for {missing}")
        for s in meta.saves:
            self._cache.commit(s.request_id, s.end)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        """(finished sending, finished receiving): sending is always None
        (request_finished never delays a free); receiving lists the requests
        whose KV has landed in G1. Blocks that did not land (a failed read,
        or an owner that went away unwritten) are reported by
        get_block_ids_with_load_errors in the same step."""
        self._check(KVConnectorRole.WORKER, "get_finished")
        if not isinstance(finished_req_ids, (set, frozenset, list, tuple)):
            raise TypeError("get_finished: finished_req_ids must be a set of request ids")
        done = set()
        bs = self._cache.block_size
        for rid, load in list(self._loading.items()):
            slot = self._cache._slots.get(rid)
            if slot is None or slot.req is None:  # freed meanwhile
                del self._loading[rid]
                continue
            settled = self._cache._load_finished(slot)
            if settled is None:
                continue
            if settled < load.expected_tokens:
                self._load_errors.update(slot.req.block_table[settled // bs: load.expected_tokens // bs])
            slot.load = _LOAD_DONE
            del self._loading[rid]
            done.add(rid)
        return None, (done or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._check(KVConnectorRole.WORKER, "get_block_ids_with_load_errors")
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        """Ends the connector; later calls raise StateError. The manager's
        copies are the manager's (flush/close it)."""
        self._closed = True
        self._meta = None
        self._loading.clear()
