# SPDX-License-Identifier: Apache-2.0
"""Type stubs of the kvbm package (the C extension kvbm._kvbm and its Python layer).

Tokens: every `tokens`-like argument takes a 1-dimensional buffer of uint32
(numpy.uint32 array, array('I'), memoryview.cast('I')), used without a copy,
or any iterable of ints 0 <= t < 2**32 (copied). Hashes are 64-bit ints,
accepted signed or unsigned and returned unsigned.
"""
from enum import IntEnum
from typing import Any, Iterable, Optional, Sequence, SupportsIndex, Tuple, Union

_Buffer = Any  # any object with the buffer protocol (collections.abc.Buffer from 3.12)

Tokens = Union["_Buffer", Iterable[SupportsIndex]]
Hash = int

__version__: str
TIER_COUNT: int

class Tier(IntEnum):
    G1 = 0
    G2 = 1
    G3 = 2
    G4 = 3

class Phase(IntEnum):
    THINK_COMPLETE = 0
    THINK_ACTIVE = 1
    OUTPUT_CRITICAL = 2

def status_name(code: int) -> str: ...

# ---- errors ---------------------------------------------------------------

class Error(Exception):
    """Base of every error kvbm raises."""
    status: str   # 'KVBM_ENOSPC'
    code: int     # -5
    message: str  # kvbm's message

class InvalidArgumentError(Error, ValueError): ...  # KVBM_EINVAL
class NoMemoryError(Error, MemoryError): ...        # KVBM_ENOMEM
class SizeOverflowError(Error, OverflowError): ...  # KVBM_EOVERFLOW
class StateError(Error): ...                        # KVBM_ESTATE
class BusyError(StateError): ...                    # KVBM_ESTATE: used from two threads at once
class NoSpaceError(Error): ...                      # KVBM_ENOSPC
class NotFoundError(Error, LookupError): ...        # KVBM_ENOTFOUND
class FormatError(Error, ValueError): ...           # KVBM_EFORMAT
class TruncatedError(FormatError): ...              # KVBM_ETRUNCATED
class TooLongError(FormatError): ...                # KVBM_ETOOLONG
class VersionError(FormatError): ...                # KVBM_EVERSION
class MagicError(FormatError): ...                  # KVBM_EMAGIC
class PaddingError(FormatError): ...                # KVBM_EPADDING
class ChecksumError(Error): ...                     # KVBM_ECHECKSUM
class IoError(Error, OSError): ...                  # KVBM_EIO
class WouldBlockError(Error): ...                   # KVBM_EAGAIN
class UnsupportedError(Error): ...                  # KVBM_EUNSUPPORTED
class ClosedError(Error): ...                       # KVBM_ECLOSED: used after close/destroy
class TimedOutError(Error, TimeoutError): ...       # KVBM_ETIMEDOUT
class TierError(Error, ValueError): ...             # KVBM_ETIER
class ExistsError(Error): ...                       # KVBM_EEXIST
class ProtocolError(Error): ...                     # KVBM_EPROTO
class RangeError(Error, IndexError): ...            # KVBM_ERANGE
class DeviceError(Error): ...                       # KVBM_EDEVICE
class AuthError(Error): ...                         # KVBM_EAUTH
class PhaseError(Error, ValueError): ...            # KVBM_EPHASE
class DisaggregationUnavailableError(Error): ...    # KVBM_EDISAGG

# ---- hashing, BLAKE3, frames ---------------------------------------------

def block_hashes(tokens: Tokens, block_size: int, *, scheme: str = "native",
                 salt_hash: Hash = 0) -> list[int]:
    """Sequence hashes of the full blocks of tokens ('native' or 'dynamo' scheme)."""
def block_hash(tokens: Tokens, salt_hash: Hash = 0) -> int:
    """Content hash of one block's tokens."""
def salt_hash(salt: Union[str, bytes, "_Buffer"]) -> int:
    """Hash of a salt (LoRA name, cache salt); 0 for an empty one."""
def blake3(data: "_Buffer", *, key: Optional["_Buffer"] = None, length: int = 32) -> bytes: ...

class Blake3:
    name: str
    digest_size: int
    block_size: int
    def __init__(self, data: Optional["_Buffer"] = None, *, key: Optional["_Buffer"] = None,
                 derive_key_context: Optional[str] = None) -> None: ...
    def update(self, data: "_Buffer") -> None: ...
    def digest(self, length: int = 32) -> bytes: ...
    def hexdigest(self, length: int = 32) -> str: ...
    def copy(self) -> "Blake3": ...
    def reset(self) -> None: ...

def frame_encode(body: "_Buffer", phase: int) -> bytes:
    """An MRDN v1 frame (32-byte header with the phase label and BLAKE3-128 of the body, then the body)."""
def frame_decode(buf: "_Buffer", *, max_body: Optional[int] = None) -> Tuple[Phase, bytes]:
    """Validates a whole frame; raises the Error subclass of the first failed check."""

# ---- one tier: Pool and Seq ----------------------------------------------

class Pool:
    num_blocks: int
    block_size: int
    scheme: str
    available: int
    closed: bool
    groups: list[Tuple[str, Optional[int]]]  # [('full', None)] unless configured
    def __init__(self, num_blocks: int, block_size: int, *, scheme: str = "native",
                 allow_duplicates: bool = False,
                 groups: Union[str, Sequence[Union[str, Tuple[str, Optional[int]]]], None] = None) -> None:
        """groups: KV cache groups sharing the blocks, "full,sw:128" or [("full", None), ("sw", 128)]."""
    def sequence(self, salt_hash: Hash = 0, priority: int = 0) -> "Seq": ...
    def hybrid_sequence(self, salt_hash: Hash = 0, *, max_tokens: Optional[int] = None,
                        prefix_cache_retention_interval: Optional[int] = None) -> "HybridSequence":
        """A request with a block table per group; buffers for max_tokens (default num_blocks * block_size)."""
    def run_request(self, prompt: Tokens, output: Tokens, salt_hash: Hash = 0) -> int:
        """W1's whole request (create, prefill, append output, destroy); returns hit tokens."""
    def blocks_needed(self, tokens: Tokens, salt_hash: Hash = 0) -> int:
        """Available blocks a prefill of tokens would take now (prefill succeeds iff <= available)."""
    def contains(self, hash: Hash) -> bool: ...
    def block_info(self, block: int) -> dict[str, Any]: ...
    def stats(self) -> dict[str, int]: ...
    def clear_cache(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Pool": ...
    def __exit__(self, *exc: object) -> None: ...

class HybridSequence:
    block_tables: list[list[Optional[int]]]  # per group; None where the group holds nothing
    hit_tokens: int
    num_tokens: int
    num_computed: int
    destroyed: bool
    def append(self, tokens: Tokens) -> None: ...
    def find_hit(self) -> int:
        """Before the first step: the prefix hit every group can serve (changes nothing)."""
    def step(self, tokens: Tokens = ..., num_new: Optional[int] = None) -> None:
        """Appends tokens, computes num_new more (None: all known); NoSpaceError changes nothing."""
    def stats(self) -> dict[str, Any]: ...
    def destroy(self) -> None: ...

def groups_from_vllm(kv_cache_config: Any) -> list[Tuple[str, Optional[int]]]:
    """vLLM's KVCacheConfig.kv_cache_groups as Pool(groups=...)'s list."""

class Seq:
    block_table: list[int]
    num_tokens: int
    cow: Optional[Tuple[int, int]]  # for a forked child: the tail block to copy (src, dst)
    salt_hash: int
    closed: bool
    def prefill(self, tokens: Tokens) -> int:
        """Returns the cached (matched) token count; NoSpaceError changes nothing."""
    def append(self, tokens: Tokens) -> None: ...
    def fork(self) -> "Seq": ...
    def block_hash(self, k: int) -> int: ...
    def destroy(self) -> None: ...
    def __enter__(self) -> "Seq": ...
    def __exit__(self, *exc: object) -> None: ...

# ---- tiers: Manager and Request ------------------------------------------

class RequestInfo(Tuple[bool, int, Tuple[int, int, int, int], int]):
    ready: bool                       # every onboarding of the match finished
    matched_tokens: int               # the match now (shortened by failed onboards)
    hit_blocks: Tuple[int, int, int, int]  # blocks of the match from G1, G2, G3, G4
    num_tokens: int

class Manager:
    block_size: int
    num_groups: int  # KV cache groups (1 without groups=)
    prefix_cache_retention_interval: Optional[int]  # None (dense) or 0 (sparse), as created
    block_bytes: int
    layer_bytes: int
    num_layers: int
    g3_mode: str
    g3_error: str
    closed: bool
    def __init__(self, *, block_size: int = 16, num_layers: int = 2, outer_dim: int = 1,
                 inner_dim: int = 64, dtype_bytes: int = 2, alignment: int = 4096,
                 layout: str = "fully_contiguous", g1_blocks: int = 1024, g2_blocks: int = 0,
                 g3_blocks: int = 0, g3_dir: Optional[str] = None, g3_persist: bool = False,
                 g3_direct: bool = True, g2_policy: str = "all", g3_policy: str = "frequency",
                 freq_threshold: int = 2, scheme: str = "native",
                 env: Union[bool, dict[str, str]] = False, g1_memory: str = "system",
                 g2_memory: str = "system", g1_device: int = 0,
                 g3_key: Optional["_Buffer"] = None, metrics: Optional[bool] = None,
                 metrics_port: Optional[int] = None,
                 metrics_host: Optional[str] = None,
                 g1_ptr: Union[None, int, Sequence[int]] = None,
                 g1_owner: Optional[object] = None,
                 groups: Union[None, str, Sequence[Union[str, Tuple[str, Optional[int]]]]] = None,
                 group_layouts: Optional[Sequence[Union[None, int, Tuple[int, int]]]] = None,
                 prefix_cache_retention_interval: Optional[int] = None) -> None:
        """metrics=True serves GET /metrics (Prometheus) on metrics_host:metrics_port
        (0.0.0.0:6880 by default); with env, DYN_KVBM_METRICS=true does the same.
        g1_ptr: engine-owned G1, adopted in place (kvbm never frees it): the
        address of each region of G1's layout (one int for fully_contiguous,
        one per layer for layer_separate; e.g. tensor.data_ptr()) in memory of
        type g1_memory on g1_device. g1_owner (e.g. the tensor) is referenced
        until close(); a host owner exporting its buffer must contain every
        region.
        groups: KV cache groups of a hybrid model, as Pool(groups=...)
        ("full,sw:128", or (kind, tokens) pairs; kvbm.groups_from_vllm gives
        vLLM's); every tier keeps all groups' blocks in its one budget, under
        (sequence hash, group). group_layouts: one item per group, None (the
        whole block), an int (the group's block bytes) or (conv_bytes,
        ssm_bytes) for a Mamba state. Serve them with hprefill().
        prefix_cache_retention_interval: vLLM's setting for hybrid requests:
        None (the default) registers and offloads every full block of every
        group; 0 (vLLM's default) only the window / Mamba blocks a hit at
        the prompt's end or the shared-prefix junction can use (the others
        are never registered, offloaded or announced); anything else is a
        ValueError."""
    metrics_port: Optional[int]
    def metrics_text(self) -> str:
        """The manager's metrics in Prometheus' text format (what GET /metrics serves)."""
    def prefill(self, tokens: Tokens, *, salt_hash: Hash = 0, priority: int = 0) -> "Request": ...
    def hprefill(self, tokens: Tokens, *, salt_hash: Hash = 0, priority: int = 0) -> "HybridRequest":
        """The hybrid hit over G1..G4 (kvbm_groups_hit); only what each group needs onboarded."""
    def group_bytes(self, g: int) -> int: ...
    def stats(self, tier: int) -> dict[str, Any]: ...
    def layout(self, tier: int) -> dict[str, Any]: ...
    def memory(self, tier: int) -> Optional[str]: ...
    def block_layer(self, tier: int, block: int, layer: int) -> memoryview:
        """Writable zero-copy view of one layer of a G1/G2 block; keeps the manager alive."""
    def region(self, tier: int, index: int = 0) -> memoryview:
        """Writable zero-copy view of a whole region of a G1/G2 tier."""
    def read_layer(self, tier: int, block: int, layer: int) -> bytes: ...
    def write_layer(self, tier: int, block: int, layer: int, data: "_Buffer") -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None:
        """Destroys live requests and frees the tiers; BusyError while views exist."""
    def __enter__(self) -> "Manager": ...
    def __exit__(self, *exc: object) -> None: ...

class Request:
    block_table: list[int]
    matched_tokens: int  # optimistic, from prefill
    num_tokens: int
    closed: bool
    busy: bool
    def poll(self) -> RequestInfo: ...
    def wait(self, timeout: Optional[float] = None) -> RequestInfo: ...
    def must_compute(self, k: int) -> bool: ...
    def block_source(self, k: int) -> int: ...
    def block_hash(self, k: int) -> int: ...
    def append(self, tokens: Tokens) -> None: ...
    def commit(self) -> None: ...
    def destroy(self) -> None: ...
    def __enter__(self) -> "Request": ...
    def __exit__(self, *exc: object) -> None: ...

class HybridRequest:
    """A request of a Manager with groups: one G1 block table per group."""
    tables: list[list[Optional[int]]]  # None where a group holds nothing
    hit_tokens: int  # found by hprefill, before onboarding
    def wait(self) -> dict[str, Any]:
        """{'hit_tokens', 'num_tokens', 'hit_g1': [per group], 'onboarded': [per group],
        'onboarded_from': {'G2': n, 'G3': n, 'G4': n}}"""
    def must_compute(self, group: int, k: int) -> bool: ...
    def append(self, tokens: Tokens) -> None:
        """One decode step in every group (ENOSPC: nothing changed)."""
    def commit(self) -> None:
        """After the prompt and after each decode step."""
    def destroy(self) -> None: ...

# ---- events ---------------------------------------------------------------

Event = dict[str, Any]  # {'type': 'BlockStored', 'block_hashes': [...], 'parent_block_hash',
                        #  'token_ids', 'block_size', 'lora_id', 'lora_name', 'medium',
                        #  'group_idx'} (vLLM's field names)

class EventBatch(Tuple[float, Optional[int], int, list[Event]]):
    ts: float
    dp_rank: Optional[int]
    seq: int
    events: list[Event]
    lost_before: int
    replayed: bool
    reset: bool

class KvEventPublisher:
    endpoint: Optional[str]
    replay_endpoint: Optional[str]
    kv_block_size: int
    closed: bool
    def __init__(self, kv_block_size: int, *, dp_rank: int = 0, endpoint: Optional[str] = None,
                 replay_endpoint: Optional[str] = None, topic: str = "",
                 nats_url: Optional[str] = None, nats_subject: Optional[str] = None,
                 form: str = "map", medium: Optional[str] = "GPU",
                 zmq_endpoint: Optional[str] = None, zmq_topic: Optional[str] = None,
                 zmq_replay_endpoint: Optional[str] = None, max_batch_events: int = 256,
                 max_batch_delay_us: int = 1000, drop_when_full: bool = False,
                 coalesce: bool = False) -> None: ...
    def publish_stored(self, token_ids: Tokens, num_block_tokens: Sequence[int],
                       block_hashes: Sequence[Hash], lora_id: Optional[int] = None,
                       parent_hash: Optional[Hash] = None, *,
                       medium: Optional[str] = ..., group_idx: Optional[int] = None,
                       kv_cache_spec_kind: Optional[str] = None,
                       sliding_window: Optional[int] = None) -> int: ...
    def publish_removed(self, block_hashes: Sequence[Hash], *, medium: Optional[str] = ...,
                        group_idx: Optional[int] = None) -> int: ...
    def publish_cleared(self) -> int: ...
    def flush(self, timeout: Optional[float] = None) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> "KvEventPublisher": ...
    def __exit__(self, *exc: object) -> None: ...

class Subscriber:
    busy: bool
    closed: bool
    def __init__(self, endpoint: str, *, replay_endpoint: Optional[str] = None,
                 topic: Optional[str] = None, bind: bool = False,
                 start_seq: Optional[int] = None, max_payload: int = ...,
                 max_queue_bytes: int = ...) -> None: ...
    def recv(self, timeout: Optional[float] = None) -> Optional[EventBatch]: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Subscriber": ...
    def __exit__(self, *exc: object) -> None: ...

# ---- router ---------------------------------------------------------------

class Index:
    def __init__(self, block_size: int = 16, scheme: str = "native", *, recompute: bool = False,
                 salt_hash: Hash = 0, expected_blocks: int = 16384) -> None: ...
    def apply(self, worker_id: int, events: Union[EventBatch, Sequence[Event]], *,
              dp_rank: Optional[int] = None) -> None: ...
    def overlap(self, tokens: Tokens, salt_hash: Optional[Hash] = None
                ) -> dict[Tuple[int, int], Tuple[int, int, int, int]]:
        """Per worker (worker_id, dp_rank): cached prefix blocks per tier (G1, G2, G3, G4),
        each counting the tiers above it."""
    def overlap_hashes(self, block_hashes: Sequence[Hash]
                       ) -> dict[Tuple[int, int], Tuple[int, int, int, int]]: ...
    def workers(self) -> list[Tuple[int, int]]: ...
    def remove_worker(self, worker_id: int, dp_rank: int = 0) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Index": ...
    def __exit__(self, *exc: object) -> None: ...

# ---- volumes ----------------------------------------------------------------

class Volume:
    """A store of values by 64-bit key (kvbm/volume.h): disk:///DIR (slots and
    block_bytes required), file:///DIR, redis://HOST:PORT,
    redis+cluster://HOST:PORT[,HOST:PORT...]. Each call is one batch run with
    the GIL released; a miss is a result (a negative status, None, False),
    never an exception."""
    name: str
    url: str
    mode: str
    closed: bool
    calls: int
    def __init__(self, url: str, *, namespace: str = "", name: Optional[str] = None,
                 timeout_ms: int = 1000, threads: int = 1, queue_capacity: int = 256,
                 max_value_bytes: int = 64 << 20, slots: int = 0, block_bytes: int = 0,
                 persist: bool = False, disk_key: Optional[bytes] = None,
                 cluster_refresh_ms: int = 100, hash_threads: int = 0) -> None: ...
    def put(self, keys: Sequence[Hash], values: Sequence["_Buffer"], *, framed: bool = False,
            checks: Optional[Sequence[int]] = None, phase: int = 0) -> list[int]:
        """0 or a negative kvbm status per key (kvbm.status_name names it)."""
    def get_into(self, keys: Sequence[Hash], buffers: Sequence["_Buffer"], *,
                 framed: bool = False, checks: Optional[Sequence[int]] = None) -> list[int]:
        """Per key the value's size, or a negative kvbm status; writes in place."""
    def get(self, keys: Sequence[Hash], size_hint: int = 65536) -> list[Optional[bytes]]: ...
    def exists(self, keys: Sequence[Hash]) -> list[bool]: ...
    def delete(self, keys: Sequence[Hash]) -> list[bool]: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Volume": ...
    def __exit__(self, *exc: object) -> None: ...


# ---- TierIndex (_kvbm_tierindex.c): a lower tier's slot index on a fill-only kvbm pool

class TierIndex:
    """64-bit keys to slots 0..capacity-1 on kvbm's own fill-only pool:
    eviction by kvbm's rule (lowest priority, then least recently
    released); pinned and pending (taken, not committed) keys are never
    evicted. len() counts committed keys."""
    capacity: int
    evictable: int
    available: int
    def __init__(self, capacity: int) -> None: ...
    def take(self, key: int) -> tuple[int, Optional[int]]:
        """(slot, evicted key or None); the key is pending until commit."""
    def commit(self, key: int) -> None: ...
    def has(self, key: int) -> bool: ...
    def is_pending(self, key: int) -> bool: ...
    def slot(self, key: int) -> int: ...
    def pin(self, key: int) -> None: ...
    def unpin(self, key: int) -> None: ...
    def pin_count(self, key: int) -> int: ...
    def pinned(self) -> dict[int, int]: ...
    def touch(self, key: int) -> None: ...
    def drop(self, key: int) -> None: ...
    def room(self, protect: Sequence[int]) -> int: ...
    def __len__(self) -> int: ...
