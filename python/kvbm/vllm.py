# SPDX-License-Identifier: Apache-2.0
"""kvbm.vllm: kvbm's tiers as a vLLM ``OffloadingSpec``, in vLLM's process model.

Stock vLLM loads offloading back ends by name, with no patch to the engine:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {
                               "spec_name": "KvbmOffloadingSpec",
                               "spec_module_path": "kvbm.vllm", ...}}'

vLLM's block manager keeps the GPU cache (G1). Its ``OffloadingConnector``
asks the spec for two things, in two kinds of process:

- the scheduler (EngineCore) calls ``get_manager()`` once and drives the
  ``OffloadingManager`` (lookup, prepare_load, touch, complete_load,
  prepare_store, complete_store, take_events). Here that is
  ``KvbmOffloadingManager``: the index of what G2 (host), G3 (disk) and G4
  (a shared kvbm volume: ``file://``, ``redis://``, ...) hold, by block hash.
  It never holds KV bytes; it decides where each block goes (slots, tiers,
  eviction, admission) and hands the workers plain, picklable
  ``KvbmLoadStoreSpec`` objects saying so.
- each worker (one process per TP rank) calls ``get_handlers(kv_caches)``
  and drives the handler's ``transfer_async`` / ``get_finished`` / ``wait``.
  Here ``KvbmOffloadingHandler`` holds that rank's bytes: a host tensor
  for its G2 slots, its G3 volume, and the shared G4 volume; it copies
  between vLLM's paged KV tensors (vLLM's block ids, FlashAttention's
  layout ``[2, num_blocks, block_size, num_kv_heads, head_size]`` per
  layer, K at 0 and V at 1) and those stores.

vLLM's manager interface changed in 2026 to a per-key form (``lookup(key,
req_context) -> LookupResult``, ``on_new_request``, ...; the newest worker
side is ``get_worker`` with ``submit_store``/``submit_load``): the manager,
handler and spec answer both forms (docs/areas/engines.md, "The per-key
interface").

Hybrid models: every KV cache group of vLLM's ``kv_cache_config``, Mamba
included. A block of group g is vLLM's OffloadKey (hash + group); a Mamba
group's block is its layers' (conv, temporal) states at one block id
(``StateLayout``, from the group's ``MambaSpec``), copied whole per rank.

Ranks agree on what exists only through the scheduler's specs: each rank
stores its own heads of the same blocks into the same slots, and a load is
done when every rank reported it (vLLM counts the ranks' completions).

TP-portable blocks. What a rank stores carries its KV heads plus a layout
descriptor (``KvLayout``: model fingerprint, dtype id, kv heads, head dim,
block size, layers, tp rank, tp size). G2 and G3 are private to one
deployment and hold a rank's head range per block. G4 is shared between
deployments of any TP size, so it holds **one value per (block, KV head)**
(key: BLAKE3 of the block key and the head number), each an MRDN frame
(BLAKE3-checked) whose body starts with a header naming the block, the head
and the layout; the deployment's descriptor sits under one well-known key
of the namespace. A TP=2 writer's blocks are then read by a TP=1 reader
(all heads: both writers' halves) and by a TP=4 reader (exactly its one
head), and a reader whose layout cannot be bridged (another model
fingerprint, dtype, head dim, block size, layer count, or a TP size that
does not divide the heads) is refused with ``LayoutError`` naming the field.

Checks. Every load is staged and verified (frame checksum, header naming
the expected block, head and layout) before a byte reaches the engine's
tensors; a load that fails any check writes nothing and reports
``success=False`` (vLLM recomputes). Hostile calls (unknown block ids,
tensors of the wrong shape or dtype, specs of the wrong kind) raise
``kvbm.Error`` subclasses naming what was wrong.

``KvbmConnectorV1`` is the same manager and handler behind vLLM's other
plug-in point, a ``KVConnectorBase_V1`` (``kv_connector: "KvbmConnectorV1"``,
``kv_connector_module_path: "kvbm.vllm"``), in the copy model: vLLM's block
manager keeps the GPU cache, kvbm gets lookups, loads and saves.

Each class subclasses vLLM's own base class when ``vllm`` is importable and
a local stand-in with the same method names and signatures otherwise, so
the module runs (and is tested) without vLLM. Interfaces as read from
vLLM's source: docs/areas/engines.md, section "vLLM".
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
import json
import math
import struct
import threading
from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator, Optional

from . import _kvbm
from ._kvbm import (ChecksumError, Error, InvalidArgumentError, IoError, NotFoundError,
                    RangeError, StateError, TimedOutError, UnsupportedError)

__all__ = [
    "HAVE_VLLM", "KvLayout", "KvbmLoadStoreSpec", "KvbmOffloadingHandler",
    "KvbmConnectorMetadata", "KvbmConnectorV1", "KvbmOffloadingManager", "KvbmOffloadingSpec",
    "KvbmWorkerMetadata", "LayoutError", "TransferFailedError",
    "block_key", "first_needed_block", "group_key", "slice_key",
    "StateLayout", "mamba_state_layout", "state_slice_key",
    "LookupResult", "ReqContext", "RequestOffloadingContext", "OffloadPolicy", "Medium",
    "Locality", "KeyOffloadingEvent", "KeyPrepareStoreOutput",
]

# ---------------------------------------------------------------- vLLM or stand-ins


def _import_vllm():
    """vLLM's classes where vLLM is installed (both module layouts seen in
    its history), else None."""
    try:
        try:
            from vllm.v1.kv_offload.abstract import (LoadStoreSpec, OffloadingEvent,
                                                     OffloadingManager, PrepareStoreOutput)
        except ImportError:
            from vllm.v1.kv_offload.base import (LoadStoreSpec, OffloadingEvent,  # type: ignore
                                                 OffloadingManager, PrepareStoreOutput)
        from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
        from vllm.v1.kv_offload.spec import OffloadingSpec
        from vllm.v1.kv_offload.worker.worker import OffloadingHandler
        try:
            from vllm.v1.kv_offload.worker.worker import TransferResult
        except ImportError:
            TransferResult = None
        return (LoadStoreSpec, OffloadingEvent, OffloadingManager, PrepareStoreOutput,
                GPULoadStoreSpec, OffloadingSpec, OffloadingHandler, TransferResult)
    except Exception:  # not installed, or an incompatible version
        return None


_VLLM = _import_vllm()
HAVE_VLLM = _VLLM is not None

if HAVE_VLLM:
    (LoadStoreSpec, OffloadingEvent, OffloadingManager, PrepareStoreOutput,
     GPULoadStoreSpec, OffloadingSpec, OffloadingHandler, _VllmTransferResult) = _VLLM
else:
    class LoadStoreSpec(ABC):  # type: ignore[no-redef]
        """Stand-in for vllm.v1.kv_offload.abstract.LoadStoreSpec."""

        @staticmethod
        @abstractmethod
        def medium() -> str: ...

    @dataclasses.dataclass
    class PrepareStoreOutput:  # type: ignore[no-redef]
        block_hashes_to_store: list
        store_spec: LoadStoreSpec
        block_hashes_evicted: list

    @dataclasses.dataclass
    class OffloadingEvent:  # type: ignore[no-redef]
        block_hashes: list
        block_size: int
        medium: str
        removed: bool

    class OffloadingManager(ABC):  # type: ignore[no-redef]
        """Stand-in for vLLM's OffloadingManager (scheduler side)."""

        @abstractmethod
        def lookup(self, block_hashes: Iterable) -> int: ...

        @abstractmethod
        def prepare_load(self, block_hashes: Iterable) -> LoadStoreSpec: ...

        def touch(self, block_hashes: Iterable) -> None:
            return None

        def complete_load(self, block_hashes: Iterable) -> None:
            return None

        @abstractmethod
        def prepare_store(self, block_hashes: Iterable) -> Optional[PrepareStoreOutput]: ...

        def complete_store(self, block_hashes: Iterable, success: bool = True) -> None:
            return None

        def take_events(self) -> Iterable[OffloadingEvent]:
            return ()

    class GPULoadStoreSpec(LoadStoreSpec):  # type: ignore[no-redef]
        """Stand-in for vllm.v1.kv_offload.mediums.GPULoadStoreSpec."""

        def __init__(self, block_ids, group_sizes=None, block_indices=None):
            self.block_ids = [int(b) for b in block_ids]
            # vLLM's hybrid form (vllm/v1/kv_offload/base.py): ids ordered
            # by KV cache group, group_sizes[i] of them for group i
            self.group_sizes = None if group_sizes is None else [int(n) for n in group_sizes]
            self.block_indices = None if block_indices is None else [int(i) for i in block_indices]

        @staticmethod
        def medium() -> str:
            return "GPU"

        def __repr__(self) -> str:
            return f"GPULoadStoreSpec({self.block_ids})"

    class OffloadingSpec(ABC):  # type: ignore[no-redef]
        """Stand-in for vllm.v1.kv_offload.spec.OffloadingSpec."""

        def __init__(self, vllm_config, kv_cache_config=None):
            self.vllm_config = vllm_config
            self.kv_cache_config = kv_cache_config
            self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
            self.gpu_block_size = vllm_config.cache_config.block_size
            self.offloaded_block_size = int(self.extra_config.get("block_size",
                                                                  self.gpu_block_size))

        @abstractmethod
        def get_manager(self) -> OffloadingManager: ...

        @abstractmethod
        def get_handlers(self, kv_caches, attn_backends=None) -> Iterator: ...

    class OffloadingHandler(ABC):  # type: ignore[no-redef]
        """Stand-in for vllm.v1.kv_offload.worker.worker.OffloadingHandler."""

        @abstractmethod
        def transfer_async(self, job_id: int, spec) -> bool: ...

        @abstractmethod
        def get_finished(self) -> list: ...

        @abstractmethod
        def wait(self, job_ids: set) -> None: ...

    _VllmTransferResult = None


@dataclasses.dataclass
class _TransferResult:
    """vLLM's TransferResult (job id, success; size in bytes, seconds)."""

    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None
    transfer_type: Optional[tuple] = None


# vLLM's TransferResult where it is a class (older vLLM: a tuple alias)
TransferResult = (_VllmTransferResult if _VllmTransferResult is not None
                  and dataclasses.is_dataclass(_VllmTransferResult) else _TransferResult)

# ---------------------------------------------------------------- the per-key interface
#
# vLLM's offloading manager became per key in 2026 (vllm/v1/kv_offload/base.py;
# docs/areas/engines.md, "The per-key interface"): lookup(key, req_context) ->
# LookupResult for one OffloadKey, the batch calls take a ReqContext, and
# prepare_store answers keys_to_store / evicted_keys. Its names are vLLM's own
# where vLLM is importable (the scheduler compares lookup's answer with its own
# enum, so the members must be vLLM's), stand-ins with the same names otherwise.
# The older per-key base (lookup -> bool | None) has no LookupResult: lookup
# then answers True / False / None.


def _import_vllm_base():
    try:
        import vllm.v1.kv_offload.base as base  # type: ignore
        return base if hasattr(base, "make_offload_key") else None
    except Exception:  # not installed, or a vLLM before the per-key interface
        return None


_VLLM_BASE = _import_vllm_base()
_LOOKUP_IS_BOOL = _VLLM_BASE is not None and not hasattr(_VLLM_BASE, "LookupResult")


class _LookupResult(enum.Enum):
    """Stand-in for vllm.v1.kv_offload.base.LookupResult."""

    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class _OffloadPolicy(enum.Enum):
    """Stand-in for vllm.v1.kv_offload.base.OffloadPolicy."""

    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


class _Medium(enum.Enum):
    """Stand-in for vllm.v1.kv_offload.base.Medium."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class _Locality(enum.Enum):
    """Stand-in for vllm.v1.kv_offload.base.Locality."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclasses.dataclass
class _ReqContext:
    """Stand-in for vllm.v1.kv_offload.base.ReqContext (what a manager reads)."""

    req_id: str
    kv_transfer_params: Optional[dict] = None


@dataclasses.dataclass
class _RequestOffloadingContext:
    """Stand-in for vllm.v1.kv_offload.base.RequestOffloadingContext."""

    policy: Any = _OffloadPolicy.CHUNK_LEVEL


@dataclasses.dataclass
class _KeyOffloadingEvent:
    """Stand-in for the per-key vllm.v1.kv_offload.base.OffloadingEvent."""

    keys: list
    medium: Any
    removed: bool
    locality: Any = None
    ownership: Optional[str] = None
    removal_expected: bool = False


@dataclasses.dataclass
class _KeyPrepareStoreOutput:
    """Stand-in for the per-key vllm.v1.kv_offload.base.PrepareStoreOutput."""

    keys_to_store: list
    store_spec: Any
    evicted_keys: list


def _vllm_or(name: str, fallback):
    """vLLM's per-key class of this name where vLLM has it, else the stand-in."""
    return getattr(_VLLM_BASE, name, fallback) if _VLLM_BASE is not None else fallback


LookupResult = _vllm_or("LookupResult", _LookupResult)
OffloadPolicy = _vllm_or("OffloadPolicy", _OffloadPolicy)
Medium = _vllm_or("Medium", _Medium)
Locality = _vllm_or("Locality", _Locality)
ReqContext = _vllm_or("ReqContext", _ReqContext)
RequestOffloadingContext = _vllm_or("RequestOffloadingContext", _RequestOffloadingContext)
KeyOffloadingEvent = _vllm_or("OffloadingEvent", _KeyOffloadingEvent)
KeyPrepareStoreOutput = _vllm_or("PrepareStoreOutput", _KeyPrepareStoreOutput)

# ---------------------------------------------------------------- errors

_STATUS = {
    InvalidArgumentError: ("KVBM_EINVAL", -1),
    StateError: ("KVBM_ESTATE", -4),
    NotFoundError: ("KVBM_ENOTFOUND", -6),
    ChecksumError: ("KVBM_ECHECKSUM", -11),
    IoError: ("KVBM_EIO", -12),
    UnsupportedError: ("KVBM_EUNSUPPORTED", -14),
    RangeError: ("KVBM_ERANGE", -22),
    TimedOutError: ("KVBM_ETIMEDOUT", -16),
}


class LayoutError(InvalidArgumentError):
    """Two KV layouts that cannot be bridged; ``.field`` names the one that differs."""


class TransferFailedError(IoError):
    """A transfer (or the worker doing it) failed; nothing it touched is to be trusted."""


def _error(cls, message: str, **attrs) -> Error:
    base = next(b for b in cls.__mro__ if b in _STATUS)
    e = cls(message)
    e.status, e.code = _STATUS[base]
    e.message = message
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


# ---------------------------------------------------------------- layout and keys

_DTYPE_IDS = {"float32": 1, "float16": 2, "bfloat16": 3, "float8_e4m3fn": 4,
              "float8_e5m2": 5, "int8": 6, "uint8": 7, "float64": 8}
_MASK64 = (1 << 64) - 1
_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "int8": 1, "uint8": 1, "float64": 8}


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_IDS:
        raise _error(LayoutError, f"kvbm.vllm: dtype {dtype!r} is not one of {sorted(_DTYPE_IDS)}",
                     field="dtype")
    return name


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """What one rank's stored KV is: the model, the element type, the
    geometry, and which heads (``tp_rank`` of ``tp_size``) it holds."""

    model_fingerprint: str
    dtype: str
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_layers: int
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self):
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        for f in ("num_kv_heads", "head_dim", "block_size", "num_layers", "tp_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise _error(LayoutError, f"kvbm.vllm: {f} must be an int >= 1, got {v!r}", field=f)
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise _error(LayoutError, f"kvbm.vllm: tp_rank {self.tp_rank!r} is not in "
                         f"0..{self.tp_size - 1}", field="tp_rank")
        if not self.model_fingerprint or not isinstance(self.model_fingerprint, str):
            raise _error(LayoutError, "kvbm.vllm: model_fingerprint must be a non-empty str",
                         field="model_fingerprint")
        if self.num_kv_heads % self.tp_size:
            raise _error(LayoutError, f"kvbm.vllm: num_kv_heads {self.num_kv_heads} is not "
                         f"divisible by tp_size {self.tp_size}", field="num_kv_heads")

    @property
    def dtype_id(self) -> int:
        return _DTYPE_IDS[self.dtype]

    @property
    def local_heads(self) -> int:
        return self.num_kv_heads // self.tp_size

    @property
    def heads(self) -> range:
        """The KV heads this rank holds."""
        return range(self.tp_rank * self.local_heads, (self.tp_rank + 1) * self.local_heads)

    @property
    def fingerprint64(self) -> int:
        return int.from_bytes(_kvbm.blake3(self.model_fingerprint.encode(), length=8), "little")

    def for_rank(self, tp_rank: int, tp_size: Optional[int] = None) -> "KvLayout":
        return dataclasses.replace(self, tp_rank=tp_rank,
                                   tp_size=self.tp_size if tp_size is None else tp_size)

    def to_bytes(self) -> bytes:
        d = dataclasses.asdict(self)
        d["dtype_id"] = self.dtype_id
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "KvLayout":
        try:
            d = json.loads(bytes(data).decode())
            d.pop("dtype_id", None)
            return cls(**d)
        except (ValueError, TypeError) as e:
            raise _error(LayoutError, f"kvbm.vllm: stored layout descriptor is malformed ({e})",
                         field="descriptor") from None

    def check_bridge(self, stored: "KvLayout") -> None:
        """Can this rank read blocks written under ``stored``? Heads are
        stored one by one, so any TP sizes bridge if both divide the heads;
        everything else must be equal. Raises LayoutError naming the field."""
        for f in ("model_fingerprint", "dtype", "num_kv_heads", "head_dim", "block_size",
                  "num_layers"):
            mine, theirs = getattr(self, f), getattr(stored, f)
            if mine != theirs:
                raise _error(LayoutError, f"kvbm.vllm: {f} differs: this engine has {mine!r}, "
                             f"the store holds {theirs!r}", field=f)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """A Mamba group's state on one rank, from vLLM's ``MambaSpec``: the
    shape of each state of a layer without its block axis (conv, then the
    temporal/SSM state), their dtypes, and the group's layer count. A block
    of the group is every layer's states at one block id, stored as all
    layers' first (conv) state, then all layers' second, ... (kvbm's
    ``kvbm_group_layout``: ``conv_bytes`` then ``ssm_bytes``)."""

    shapes: tuple
    dtypes: tuple
    num_layers: int

    def __post_init__(self):
        object.__setattr__(self, "shapes", tuple(tuple(int(x) for x in sh) for sh in self.shapes))
        object.__setattr__(self, "dtypes", tuple(_dtype_name(d) for d in self.dtypes))
        if not self.shapes or len(self.shapes) != len(self.dtypes) or any(
                not sh or min(sh) < 1 for sh in self.shapes):
            raise _error(LayoutError, f"kvbm.vllm: a Mamba state layout needs one dtype per "
                         f"non-empty shape, got shapes {self.shapes} dtypes {self.dtypes}",
                         field="mamba_state")
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise _error(LayoutError, f"kvbm.vllm: num_layers {self.num_layers!r} must be >= 1",
                         field="num_layers")

    def state_bytes(self, i: int) -> int:
        """One layer's state i, in bytes."""
        return math.prod(self.shapes[i]) * _DTYPE_SIZES[self.dtypes[i]]

    @property
    def layer_bytes(self) -> int:
        return sum(self.state_bytes(i) for i in range(len(self.shapes)))

    @property
    def block_bytes(self) -> int:
        return self.layer_bytes * self.num_layers

    @property
    def conv_bytes(self) -> int:
        return self.state_bytes(0) * self.num_layers

    @property
    def ssm_bytes(self) -> int:
        return self.block_bytes - self.conv_bytes

    def group_layout(self) -> tuple:
        """``(conv_bytes, ssm_bytes)``: this group's item of
        ``kvbm.Manager(group_layouts=...)`` (kvbm_group_layout)."""
        return (self.conv_bytes, self.ssm_bytes)

    @property
    def fingerprint64(self) -> int:
        """What a stored state's header names: shapes, dtypes, layers."""
        text = json.dumps([self.shapes, self.dtypes, self.num_layers]).encode()
        return int.from_bytes(_kvbm.blake3(b"kvbm.vllm/state-layout" + text, length=8), "little")


def mamba_state_layout(mamba_spec, num_layers: int) -> StateLayout:
    """The StateLayout of a vLLM ``MambaSpec`` (its ``shapes`` and
    ``dtypes``: one rank's states of one layer, vLLM's
    MambaStateShapeCalculator already divided them by the TP size) for a
    group of ``num_layers`` layers."""
    shapes = getattr(mamba_spec, "shapes", None)
    dtypes = getattr(mamba_spec, "dtypes", None)
    if not shapes or not dtypes:
        raise _error(LayoutError, f"kvbm.vllm: {type(mamba_spec).__name__} has no shapes/dtypes "
                     "(vLLM's MambaSpec fields) to lay its states out", field="mamba_state")
    return StateLayout(tuple(shapes), tuple(dtypes), num_layers)


def block_key(block_hash) -> int:
    """The 64-bit key of a vLLM block hash: ``bytes`` (vLLM's BlockHash) are
    hashed with BLAKE3; ints (kvbm's hashes, old vLLM's ``hash_value``) are
    taken as they are, modulo 2**64."""
    if isinstance(block_hash, (bytes, bytearray, memoryview)):
        return int.from_bytes(_kvbm.blake3(bytes(block_hash), length=8), "little")
    value = getattr(block_hash, "hash_value", block_hash)
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK64
    raise TypeError(f"kvbm.vllm: a block hash must be bytes or int, got {type(block_hash).__name__}")


def slice_key(key: int, head: int) -> int:
    """G4 key of one KV head of one block."""
    return int.from_bytes(_kvbm.blake3(b"kvbm.vllm/head" + struct.pack("<QI", key, head),
                                       length=8), "little")


def state_slice_key(key: int, tp_rank: int) -> int:
    """G4 key of one TP rank's Mamba state of one block (a state is stored
    whole per rank: its heads are not split out as attention KV's are)."""
    return int.from_bytes(_kvbm.blake3(b"kvbm.vllm/state" + struct.pack("<QI", key, tp_rank),
                                       length=8), "little")


DESCRIPTOR_KEY = int.from_bytes(_kvbm.blake3(b"kvbm.vllm/layout", length=8), "little")

# A stored slice: header, then [layers, 2, block_size, heads, head_dim] elements.
_SLICE_MAGIC = b"KVBMVL1\0"
_SLICE_HDR = struct.Struct("<8sQQIIIIII")  # magic, fp64, key, dtype, head_dim, bs, layers, head0, nheads


def _slice_header(layout: KvLayout, key: int, head0: int, nheads: int) -> bytes:
    return _SLICE_HDR.pack(_SLICE_MAGIC, layout.fingerprint64, key, layout.dtype_id,
                           layout.head_dim, layout.block_size, layout.num_layers, head0, nheads)


# A stored Mamba state: header, then the group's block_bytes (StateLayout order).
_STATE_MAGIC = b"KVBMVS1\0"
_STATE_HDR = struct.Struct("<8sQQQIIII")  # magic, fp64, key, state fp64, bs, rank, tp, bytes


def _state_header(layout: KvLayout, st: StateLayout, key: int) -> bytes:
    return _STATE_HDR.pack(_STATE_MAGIC, layout.fingerprint64, key, st.fingerprint64,
                           layout.block_size, layout.tp_rank, layout.tp_size, st.block_bytes)


# ---------------------------------------------------------------- volumes


class Volume:
    """The calls kvbm.vllm makes of a ``kvbm.Volume`` (kvbm/volume.h): one
    batch each, GIL released; a miss is None/False, never an exception."""

    def __init__(self, url: str, namespace: str = "", *, timeout_ms: int = 10000):
        self._v = _kvbm.Volume(url, namespace=namespace, timeout_ms=timeout_ms)
        self.url, self.namespace = url, namespace

    def put_many(self, items: list) -> list[int]:
        """[(key, bytes)] -> per item 0 or a negative kvbm status."""
        if not items:
            return []
        return self._v.put([k for k, _ in items], [v for _, v in items])

    def get_many(self, keys: list, cap: int) -> list:
        """Per key the value's bytes, or None."""
        return self._v.get(keys, cap) if keys else []

    def exists_many(self, keys: list) -> list[bool]:
        return self._v.exists(keys) if keys else []

    def close(self) -> None:
        self._v.close()


def _check_descriptor(vol: Volume, layout: KvLayout, *, write: bool) -> None:
    """Refuses a G4 whose stored layout cannot be bridged; stores ours
    under the well-known key when the namespace has none yet."""
    got = vol.get_many([DESCRIPTOR_KEY], 64 * 1024)[0]
    if got is None:
        if write:
            vol.put_many([(DESCRIPTOR_KEY, _kvbm.frame_encode(layout.to_bytes(), 0))])
        return
    try:
        _, body = _kvbm.frame_decode(got)
    except Error as e:
        raise _error(LayoutError, f"kvbm.vllm: the layout descriptor in {vol.url!r} fails its "
                     f"check ({e})", field="descriptor") from None
    layout.check_bridge(KvLayout.from_bytes(body))


# ---------------------------------------------------------------- the spec the workers get

G2, G3, G4 = 1, 2, 3
MEDIUM = {G2: "CPU", G3: "DISK", G4: "KVBM_G4"}
# the per-key events' Medium and Locality of each tier's medium string
_KEY_MEDIUM = {"CPU": Medium.CPU, "DISK": Medium.STORAGE, "KVBM_G4": Medium.STORAGE}
_KEY_LOCALITY = {"CPU": Locality.LOCAL, "DISK": Locality.LOCAL, "KVBM_G4": Locality.REMOTE}


class KvbmLoadStoreSpec(LoadStoreSpec):
    """Where blocks are (a load) or go (a store) in kvbm's tiers; plain
    lists, so it pickles. ``keys[i]`` is block i's 64-bit key; a store
    names its G2 slot, its G3 slot (-1: not admitted) and whether it goes to
    G4; a load names one source tier per block and its slot (-1 for G4)."""

    def __init__(self, kind: str, keys, *, g2_slots=(), g3_slots=(), g4=(), tiers=(), slots=()):
        self.kind = kind
        self.keys = [int(k) for k in keys]
        self.g2_slots = [int(s) for s in g2_slots]
        self.g3_slots = [int(s) for s in g3_slots]
        self.g4 = [bool(x) for x in g4]
        self.tiers = [int(t) for t in tiers]
        self.slots = [int(s) for s in slots]

    @staticmethod
    def medium() -> str:
        return "KVBM"

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"KvbmLoadStoreSpec({self.kind}, {len(self.keys)} blocks)"


def _key_event(e) -> Any:
    """A batch-form event in vLLM's per-key form: the keys as given, the
    tier as a Medium and Locality (the first per-key base, 14d6506e, has
    neither: a medium string, no locality field)."""
    kw = dict(keys=list(e.block_hashes), removed=e.removed,
              medium=(_KEY_MEDIUM[e.medium] if _VLLM_BASE is None or Medium is not _Medium
                      else e.medium),
              locality=_KEY_LOCALITY[e.medium])
    if dataclasses.is_dataclass(KeyOffloadingEvent):
        names = {f.name for f in dataclasses.fields(KeyOffloadingEvent)}
        kw = {k: v for k, v in kw.items() if k in names}
    return KeyOffloadingEvent(**kw)


# ---------------------------------------------------------------- scheduler side


class _Lru:
    """A mapping that keeps its ``cap`` most recently used keys."""

    def __init__(self, cap: int):
        self.cap, self.d = cap, collections.OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self.d

    def __len__(self) -> int:
        return len(self.d)

    def get(self, key, default=0):
        return self.d.get(key, default)

    def put(self, key, value) -> list:
        """Sets key (most recent); returns the keys pushed out."""
        self.d[key] = value
        self.d.move_to_end(key)
        out = []
        while len(self.d) > self.cap:
            out.append(self.d.popitem(last=False)[0])
        return out


class _Tier:
    """One bounded tier's index (G2 or G3): kvbm's own slot index,
    ``kvbm.TierIndex``, a fill-only kvbm pool whose block ids are the slots.
    Eviction is kvbm's rule (lowest priority, then least recently released:
    a commit, a touch or a pin's release makes a block the most recent);
    pinned blocks (loads in flight) and pending ones (stores in flight) are
    never evicted. A tier of 0 slots has no index and holds nothing."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.index = _kvbm.TierIndex(capacity) if capacity > 0 else None

    def has(self, key: int) -> bool:
        return self.index is not None and self.index.has(key)

    def is_pending(self, key: int) -> bool:
        return self.index is not None and self.index.is_pending(key)

    def slot(self, key: int) -> int:
        return self.index.slot(key)

    @property
    def pins(self) -> dict:
        """{key: pins} of the pinned blocks."""
        return self.index.pinned() if self.index is not None else {}

    def room(self, protect) -> int:
        """Slots a store could get without evicting a key of ``protect``."""
        return self.index.room(list(protect)) if self.index is not None else 0

    def pin(self, key: int) -> None:
        self.index.pin(key)

    def unpin(self, key) -> bool:
        """Drops one pin; False when the key is not pinned here."""
        if self.index is None or not self.index.pin_count(key):
            return False
        self.index.unpin(key)
        return True

    def touch(self, key: int) -> None:
        if self.has(key):
            self.index.touch(key)

    def take_all(self, keys, protect) -> tuple[list, list]:
        """Slots for ``keys`` (pending until commit), evicting by kvbm's rule
        but none of the committed keys of ``protect`` (pinned meanwhile, so
        their release makes them recent, as a use does): (slots, evicted)."""
        held = [k for k in dict.fromkeys(protect) if self.has(k)]
        for k in held:
            self.index.pin(k)
        try:
            slots, evicted = [], []
            for k in keys:
                slot, gone = self.index.take(k)
                slots.append(slot)
                if gone is not None:
                    evicted.append(gone)
            return slots, evicted
        finally:
            for k in held:
                self.index.unpin(k)

    def finish(self, key: int, success: bool) -> bool:
        """Ends a pending store: committed, or its slot freed. False when
        the key was not pending here."""
        if not self.is_pending(key):
            return False
        if success:
            self.index.commit(key)
        else:
            self.index.drop(key)
        return True


class KvbmOffloadingManager(OffloadingManager):
    """The scheduler's index of kvbm's G2/G3/G4 (no KV bytes here).

    Policies (kvbm's, docs/areas/tiers.md): G2 and G3 are each kvbm's own
    index, a ``kvbm.TierIndex`` (a fill-only kvbm pool whose block ids are
    the tier's slots), so they evict by kvbm's rule: lowest priority, then
    least recently released (a commit, a lookup hit via ``touch``, a load's
    unpin, or a store naming a block it already holds, makes a block the
    most recent); pinned and pending blocks are never evicted. G2 takes
    every stored block; G3 admits a block on ``g3_policy="all"`` or, with
    ``"frequency"``, once it was looked up or stored ``freq_threshold``
    times; G4 takes every block
    (a shared store that may drop blocks on its own: a load that misses
    fails and vLLM recomputes). Loads read the fastest tier holding a block.
    Blocks being loaded are pinned until ``complete_load``; stored blocks
    become loadable at ``complete_store``.

    ``events_endpoint``: also publish every stored/removed event on kvbm's
    own KV-event publisher (ZMQ PUB, vLLM's wire; hashes are ``block_key``s).
    """

    def __init__(self, layout: KvLayout, *, g2_blocks: int, g3_blocks: int = 0,
                 g3_policy: str = "all", freq_threshold: int = 2,
                 g4_url: Optional[str] = None, g4_namespace: str = "kvbm-vllm",
                 events_endpoint: Optional[str] = None,
                 events_replay_endpoint: Optional[str] = None,
                 g4_index_entries: int = 1 << 20, freq_entries: int = 1 << 20,
                 groups: Optional[list] = None):
        if not isinstance(layout, KvLayout):
            raise TypeError("KvbmOffloadingManager: layout must be a KvLayout")
        if g2_blocks < 1 or g3_blocks < 0:
            raise _error(InvalidArgumentError, f"KvbmOffloadingManager: g2_blocks {g2_blocks} "
                         f"must be >= 1 and g3_blocks {g3_blocks} >= 0")
        if g3_policy not in ("all", "frequency"):
            raise _error(InvalidArgumentError,
                         f"KvbmOffloadingManager: g3_policy {g3_policy!r} is not 'all' or 'frequency'")
        self.layout = layout
        # a hybrid model's (kind, tokens) per group (kvbm.groups_from_vllm):
        # kvbm's events then name (hash, group_idx), as vLLM's do
        self._groups = None if groups is None else [(str(k), t) for k, t in groups]
        self._state_groups = {g for g, (k, _) in enumerate(self._groups or ())
                              if k.startswith("mamba")}
        self._per_key = False     # a per-key caller seen: events in vLLM's per-key form
        self._requests: dict = {}  # req id -> ReqContext (per-key form)
        self.block_size = layout.block_size
        self._g2, self._g3 = _Tier(g2_blocks), _Tier(g3_blocks)
        self._g3_policy, self._freq_threshold = g3_policy, freq_threshold
        # everything per block is bounded: the tiers by their slots, the
        # rest by these LRUs (a G4 block pushed out of the index is looked
        # up in the store again; a count pushed out starts again at 0)
        self._freq = _Lru(freq_entries)
        self._g4: Optional[Volume] = None
        self._g4_known = _Lru(g4_index_entries)
        self._g4_pending: set = set()
        if g4_url:
            self._g4 = Volume(g4_url, g4_namespace)
            _check_descriptor(self._g4, layout, write=False)
        self._hash_of: dict[int, Any] = {}
        self._events: list = []
        self._publisher = None
        if events_endpoint:
            self._publisher = _kvbm.KvEventPublisher(layout.block_size, endpoint=events_endpoint,
                                                     replay_endpoint=events_replay_endpoint)
        self.stats = {"lookups": 0, "key_lookups": 0, "hit_blocks": [0, 0, 0, 0],
                      "stored_blocks": [0, 0, 0, 0],
                      "evicted_blocks": [0, 0, 0, 0], "store_refused": 0}

    # -- helpers
    @staticmethod
    def _keys(block_hashes) -> list[int]:
        return [block_key(h) for h in block_hashes]

    def _held(self, k: int) -> bool:
        return (self._g2.has(k) or self._g2.is_pending(k) or self._g3.has(k)
                or self._g3.is_pending(k) or k in self._g4_known or k in self._g4_pending)

    def _forget(self, keys) -> None:
        """Drops the vLLM hash of blocks no tier holds any more."""
        for k in keys:
            if not self._held(k):
                self._hash_of.pop(k, None)

    def _known_in_g4(self, k: int) -> None:
        self._forget(self._g4_known.put(k, True))

    def _is_state(self, given) -> bool:
        """Whether a given hash names a block of a Mamba group (an
        OffloadKey whose 4 group bytes name a group of kind mamba*)."""
        if not self._state_groups or not isinstance(given, (bytes, bytearray, memoryview)) \
                or len(given) <= 4:
            return False
        return int.from_bytes(bytes(given)[-4:], "big") in self._state_groups

    def _slices(self, k: int, given) -> list[int]:
        """G4 values a block is complete with: one per KV head, or one per
        TP rank for a Mamba state (its heads are not split out)."""
        if self._is_state(given):
            return [state_slice_key(k, r) for r in range(self.layout.tp_size)]
        return [slice_key(k, h) for h in range(self.layout.num_kv_heads)]

    def _in_g4(self, keys: list[int], given: Optional[list] = None) -> list[bool]:
        """Complete in G4 = every value of the block is there (checked in
        one batch for the keys not known yet)."""
        if self._g4 is None:
            return [False] * len(keys)
        given = given if given is not None else [None] * len(keys)
        unknown = [(k, h) for k, h in zip(keys, given) if k not in self._g4_known]
        if unknown:
            slices = [self._slices(k, h) for k, h in unknown]
            found = iter(self._g4.exists_many([s for ss in slices for s in ss]))
            for (k, _), ss in zip(unknown, slices):
                if all([next(found) for _ in ss]):
                    self._known_in_g4(k)
        return [k in self._g4_known for k in keys]

    def _event(self, keys: list[int], tier: int, removed: bool) -> None:
        if not keys:
            return
        self._events.append(OffloadingEvent(block_hashes=[self._hash_of.get(k, k) for k in keys],
                                            block_size=self.block_size, medium=MEDIUM[tier],
                                            removed=removed))
        if self._publisher is None:
            return
        for group, hashes in self._published(keys):
            kw = {"medium": MEDIUM[tier]}
            if group is not None:
                kw["group_idx"] = group
            if removed:
                self._publisher.publish_removed(hashes, **kw)
                continue
            if group is not None and group < len(self._groups):
                kind, tokens = self._groups[group]
                kw["kv_cache_spec_kind"] = _SPEC_KIND.get(kind, kind)
                if kind == "sw":
                    kw["sliding_window"] = tokens
            n = len(hashes)  # the manager sees hashes, not tokens: token ids are zeros
            self._publisher.publish_stored([0] * (n * self.block_size), [self.block_size] * n,
                                           hashes, **kw)

    def _published(self, keys: list[int]) -> list:
        """(group, hashes) runs of kvbm's events for these keys: one group
        (None) of the keys themselves without groups; with groups, each
        block's own hash (block_key of its OffloadKey less the 4 group
        bytes, what a one-group deployment publishes for it) under its
        group_idx, in order. A key whose given hash is unknown or not an
        OffloadKey goes out as it is, without a group."""
        if self._groups is None:
            return [(None, keys)]
        runs: list = []
        for k in keys:
            given = self._hash_of.get(k)
            if isinstance(given, (bytes, bytearray, memoryview)) and len(given) > 4:
                g, h = int.from_bytes(bytes(given)[-4:], "big"), block_key(bytes(given)[:-4])
            else:
                g, h = None, k
            if runs and runs[-1][0] == g:
                runs[-1][1].append(h)
            else:
                runs.append((g, [h]))
        return runs

    def key_of(self, block_hash) -> int:
        return block_key(block_hash)

    # -- OffloadingManager
    def lookup(self, block_hashes, req_context=None):
        """The batch form (vLLM before 2026): the number of leading blocks
        of ``block_hashes`` offloaded. The per-key form (``lookup(key,
        req_context)``, a ReqContext given): one block's LookupResult."""
        if req_context is not None:
            return self._lookup_key(block_hashes, req_context)
        self.stats["lookups"] += 1
        block_hashes = list(block_hashes)
        keys = self._keys(block_hashes)
        n = 0
        while n < len(keys) and (self._g2.has(keys[n]) or self._g3.has(keys[n])):
            n += 1
        if n < len(keys) and self._g4 is not None:
            for present in self._in_g4(keys[n:], list(block_hashes)[n:]):
                if not present:
                    break
                n += 1
        return n

    def held(self, block_hashes: Iterable) -> list[bool]:
        """Whether each block is offloaded (G2, G3, or G4, asked in one
        batch), each on its own: a sliding-window group needs blocks after
        a gap, which lookup (a prefix count) cannot say."""
        block_hashes = list(block_hashes)
        keys = self._keys(block_hashes)
        out = [self._g2.has(k) or self._g3.has(k) for k in keys]
        rest = [i for i, x in enumerate(out) if not x]
        if rest and self._g4 is not None:
            for i, present in zip(rest, self._in_g4([keys[i] for i in rest],
                                                    [block_hashes[i] for i in rest])):
                out[i] = present
        return out

    def prepare_load(self, block_hashes: Iterable, req_context=None) -> KvbmLoadStoreSpec:
        keys = self._keys(block_hashes)
        tiers, slots = [], []
        for k in keys:
            if self._g2.has(k):
                tiers.append(G2), slots.append(self._g2.slot(k))
            elif self._g3.has(k):
                tiers.append(G3), slots.append(self._g3.slot(k))
            elif k in self._g4_known:
                tiers.append(G4), slots.append(-1)
            else:
                raise _error(NotFoundError, f"kvbm.vllm: prepare_load: block {k:#018x} is not "
                             "offloaded (lookup did not count it)")
        for k, t in zip(keys, tiers):
            if t == G2:
                self._g2.pin(k)
            elif t == G3:
                self._g3.pin(k)
            self.stats["hit_blocks"][t] += 1
        return KvbmLoadStoreSpec("load", keys, tiers=tiers, slots=slots)

    def touch(self, block_hashes: Iterable, req_context=None) -> None:
        for k in self._keys(block_hashes):
            self._freq.put(k, self._freq.get(k) + 1)
            for tier in (self._g2, self._g3):
                tier.touch(k)

    def complete_load(self, block_hashes: Iterable, req_context=None) -> None:
        for k in self._keys(block_hashes):
            if not self._g2.unpin(k):
                self._g3.unpin(k)

    def prepare_store(self, block_hashes: Iterable, req_context=None):
        """Slots for the blocks not stored yet, or None when G2 has no room.
        The batch form answers vLLM's older PrepareStoreOutput
        (block_hashes_to_store, block_hashes_evicted); with a ReqContext,
        the per-key one (keys_to_store, evicted_keys)."""
        hashes = list(block_hashes)
        keys = self._keys(hashes)
        given = dict(zip(keys, hashes))
        new = [k for k in dict.fromkeys(keys) if not self._g2.has(k) and not self._g2.is_pending(k)]
        protect = list(dict.fromkeys(keys))
        if self._g2.room(protect) < len(new):
            self.stats["store_refused"] += 1
            return None
        g2_slots, evicted = self._g2.take_all(new, protect)
        self._event(evicted, G2, removed=True)
        self.stats["evicted_blocks"][G2] += len(evicted)
        g3_slots, g3_evicted = [], []
        for k in new:
            admit = (self._g3.capacity > 0 and not self._g3.has(k) and not self._g3.is_pending(k)
                     and (self._g3_policy == "all"
                          or self._freq.get(k) + 1 >= self._freq_threshold)
                     and self._g3.room(protect) >= 1)
            if admit:
                (slot,), gone = self._g3.take_all([k], protect)
                g3_evicted.extend(gone)
            g3_slots.append(slot if admit else -1)
        self._event(g3_evicted, G3, removed=True)
        self.stats["evicted_blocks"][G3] += len(g3_evicted)
        g4 = [self._g4 is not None and k not in self._g4_known for k in new]
        self._g4_pending.update(k for k, w in zip(new, g4) if w)
        for k in new:
            self._hash_of[k] = given[k]
        evicted_hashes = [self._hash_of.get(k, k) for k in evicted]
        self._forget(evicted + g3_evicted)
        spec = KvbmLoadStoreSpec("store", new, g2_slots=g2_slots, g3_slots=g3_slots, g4=g4)
        if req_context is not None:
            self._per_key = True
            return KeyPrepareStoreOutput(keys_to_store=[given[k] for k in new],
                                         store_spec=spec, evicted_keys=evicted_hashes)
        return PrepareStoreOutput(block_hashes_to_store=[given[k] for k in new],
                                  store_spec=spec, block_hashes_evicted=evicted_hashes)

    def complete_store(self, block_hashes: Iterable, req_context=None, success: bool = True) -> None:
        if isinstance(req_context, bool):  # the batch form's complete_store(hashes, False)
            req_context, success = None, req_context
        keys = self._keys(block_hashes)
        stored = {G2: [], G3: [], G4: []}
        for k in keys:
            for tier_id, tier in ((G2, self._g2), (G3, self._g3)):
                if tier.finish(k, success) and success:
                    stored[tier_id].append(k)
            if k in self._g4_pending:
                self._g4_pending.discard(k)
                if success:
                    stored[G4].append(k)
        for tier_id, ks in stored.items():
            self.stats["stored_blocks"][tier_id] += len(ks)
            self._event(ks, tier_id, removed=False)
        for k in stored[G4]:
            self._known_in_g4(k)
        if not success:
            self._forget(keys)

    def take_events(self) -> Iterable:
        """The events since the last call: vLLM's batch-form OffloadingEvent
        (block_hashes, block_size, medium string), or, once a per-key
        caller was seen, the per-key one (keys, Medium, removed, Locality)."""
        events, self._events = self._events, []
        if not self._per_key:
            yield from events
            return
        for e in events:
            yield _key_event(e)

    # -- the per-key interface (vllm/v1/kv_offload/base.py, 2026)
    def _lookup_key(self, key, req_context):
        """One block: HIT when a tier holds it readable, HIT_PENDING while
        its store is in flight, MISS otherwise (never RETRY: G4 is asked
        synchronously). The older per-key base: True / None / False."""
        self._per_key = True
        self.stats["key_lookups"] += 1
        k = block_key(key)
        if self._g2.has(k) or self._g3.has(k):
            result = LookupResult.HIT
        elif self._g2.is_pending(k) or self._g3.is_pending(k) or k in self._g4_pending:
            result = LookupResult.HIT_PENDING
        elif self._g4 is not None and self._in_g4([k], [key])[0]:
            result = LookupResult.HIT
        else:
            result = LookupResult.MISS
        if _LOOKUP_IS_BOOL:
            return {"HIT": True, "MISS": False}.get(result.name)
        return result

    def on_new_request(self, req_context):
        """Every request's blocks are offloaded as they are computed
        (CHUNK_LEVEL: prefix hits are not stored again)."""
        self._per_key = True
        self._requests[req_context.req_id] = req_context
        return RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        self._requests.pop(req_context.req_id, None)

    def on_schedule_end(self, context) -> None:
        return None  # nothing deferred: every call acts at once

    def has_pending_work(self) -> bool:
        return False  # stores complete through complete_store, not by stepping

    def get_stats(self):
        return None  # kvbm's counts are in .stats (vLLM's OffloadingConnectorStats is not built)

    def reset_cache(self) -> None:
        """Forgets every offloaded block (G2 and G3 emptied, G4's index and
        the use counts dropped; G4 itself is shared and keeps its values).
        Refused while a load or a store is in flight."""
        for tier in (self._g2, self._g3):
            if tier.pins or any(tier.is_pending(k) for k in self._hash_of):
                raise _error(StateError, "KvbmOffloadingManager.reset_cache: a load or a "
                             "store is in flight (complete it first)")
        for tier_id, tier in ((G2, self._g2), (G3, self._g3)):
            gone = [k for k in self._hash_of if tier.has(k)]
            self._event(gone, tier_id, removed=True)
        self._g2, self._g3 = _Tier(self._g2.capacity), _Tier(self._g3.capacity)
        self._g4_known = _Lru(self._g4_known.cap)
        self._freq = _Lru(self._freq.cap)
        self._hash_of = {k: h for k, h in self._hash_of.items() if k in self._g4_pending}

    def shutdown(self) -> None:
        self.close()

    def flush_events(self, timeout: Optional[float] = None) -> None:
        if self._publisher is not None:
            self._publisher.flush(timeout)

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.shutdown()
            self._publisher = None
        if self._g4 is not None:
            self._g4.close()


# ---------------------------------------------------------------- worker side


def _torch():
    import torch  # imported lazily: the scheduler side does not need torch
    return torch


class KvbmOffloadingHandler(OffloadingHandler):
    """One TP rank's bytes and copies: vLLM's paged KV tensors <-> kvbm.

    ``kv_caches``: {layer name: tensor [2, num_blocks, block_size,
    local_kv_heads, head_dim]} (FlashAttention's layout; ``kv_layout=
    "flashinfer"`` takes [num_blocks, 2, ...]), layers in model order.
    Transfers run on one thread per handler, in submission order; results
    come back through ``get_finished``.

    ``groups``: a hybrid model's KV cache groups, the layer names of each
    (vLLM's ``kv_cache_groups[i].layer_names``, each of ``layout.num_layers``
    layers, as vLLM's uniform page makes them). A block of group g is the KV
    of group g's layers; a transfer's GPU spec says which of its blocks
    belong to which group (``group_sizes``, ids ordered by group); G2's slots
    serve every group (one budget). The keys already differ per group (vLLM's
    OffloadKey carries the group index).

    ``states``: per group None (attention) or the ``StateLayout`` of a
    Mamba group (``mamba_state_layout`` of its MambaSpec). A Mamba layer's
    ``kv_caches`` entry is vLLM's list of state tensors ``[num_blocks,
    *shape]`` (conv, temporal) or the byte page view ``[num_blocks, 1, 1,
    page_bytes]`` they are cut from; a block of the group is all its layers'
    states at one block id, one G2 byte row, one framed value per rank in
    G3 and G4 (header: model, key, state layout, block size, TP rank/size),
    verified before anything is written on a load."""

    def __init__(self, kv_caches, layout: KvLayout, *, g2_blocks: int, g3_blocks: int = 0,
                 g3_url: Optional[str] = None, g4_url: Optional[str] = None,
                 g4_namespace: str = "kvbm-vllm", kv_layout: str = "flash_attn",
                 groups: Optional[list] = None, states: Optional[list] = None):
        torch = _torch()
        if kv_layout not in ("flash_attn", "flashinfer"):
            raise _error(InvalidArgumentError, f"kvbm.vllm: kv_layout {kv_layout!r} is not "
                         "'flash_attn' or 'flashinfer'")
        if isinstance(kv_caches, dict):
            names, tensors = list(kv_caches), list(kv_caches.values())
        else:
            tensors = list(kv_caches)
            names = [f"layer{i}" for i in range(len(tensors))]
        self.layout = layout
        group_names = self._group_names(names, groups, layout, isinstance(kv_caches, dict))
        # per group: None (attention KV) or the StateLayout of a Mamba group
        self._states = self._group_states(states, len(group_names))
        by_name = dict(zip(names, tensors))
        att = [g for g in range(len(group_names)) if self._states[g] is None]
        tensors = [by_name[n] for g in att for n in group_names[g]]
        names = [n for g in att for n in group_names[g]]
        self._kv = [t if kv_layout == "flash_attn" else t.transpose(0, 1) for t in tensors]
        L = layout.num_layers
        # each attention group's per-layer tensors (one group: all of them);
        # a Mamba group's per-layer state tensors are in _state_kv
        self._kv_groups = [None] * len(group_names)
        for i, g in enumerate(att):
            self._kv_groups[g] = self._kv[i * L:(i + 1) * L]
        self.num_blocks = -1
        if self._kv:
            self.num_blocks = self._kv[0].shape[1] if self._kv[0].dim() == 5 else -1
        self._state_kv = [None if st is None else
                          [self._state_tensors(by_name[n], n, st) for n in group_names[g]]
                          for g, st in enumerate(self._states)]
        if not self._kv:  # a model of Mamba layers only
            first = next(ts for ts in self._state_kv if ts is not None)
            self.num_blocks = first[0][0].shape[0]
        for g, ts in enumerate(self._state_kv):
            for n, layer in zip(group_names[g], ts or ()):
                if layer[0].shape[0] != self.num_blocks:
                    raise _error(InvalidArgumentError, f"kvbm.vllm: Mamba state of {n!r} has "
                                 f"{layer[0].shape[0]} blocks, the KV cache {self.num_blocks}")
        want_dtype = getattr(torch, layout.dtype)
        for name, t in zip(names, self._kv):
            want = (2, self.num_blocks, layout.block_size, layout.local_heads, layout.head_dim)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != want_dtype:
                raise _error(InvalidArgumentError, f"kvbm.vllm: KV tensor {name!r} is "
                             f"{tuple(getattr(t, 'shape', ()))} {getattr(t, 'dtype', type(t))}; "
                             f"rank {layout.tp_rank} of {layout.tp_size} wants {want} {want_dtype} "
                             f"({kv_layout} layout)")
        if self.num_blocks < 1:
            raise _error(InvalidArgumentError, "kvbm.vllm: KV tensors hold no blocks")
        self.device = (self._kv[0] if self._kv else first[0][0]).device
        self._slot_shape = (layout.num_layers, 2, layout.block_size, layout.local_heads,
                            layout.head_dim)
        pin = self.device.type == "cuda"
        # G2 per layer in the engine's own layout [2, slots, ...], so a run of
        # blocks is one copy each way (no slots without attention layers)
        self.g2_blocks = g2_blocks
        self.g2 = [torch.empty((2, g2_blocks if self._kv else 0) + self._slot_shape[2:],
                               dtype=want_dtype, pin_memory=pin)
                   for _ in range(layout.num_layers)]
        self._esize = self.g2[0].element_size()
        self._rank_bytes = math.prod(self._slot_shape) * self._esize
        self._head_bytes = self._rank_bytes // layout.local_heads
        # Mamba states in G2: one byte row per slot (any group's block may
        # take any slot: one budget), as wide as the widest group's state
        widths = [st.block_bytes for st in self._states if st is not None]
        self.g2_state = (torch.empty((g2_blocks, max(widths)), dtype=torch.uint8,
                                     pin_memory=pin) if widths else None)
        self.g3 = Volume(g3_url, f"rank{layout.tp_rank}-of-{layout.tp_size}") if g3_blocks and g3_url else None
        self.g3_blocks = g3_blocks if self.g3 is not None else 0
        self.g4 = None
        if g4_url:
            self.g4 = Volume(g4_url, g4_namespace)
            _check_descriptor(self.g4, layout, write=layout.tp_rank == 0)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvbm-vllm")
        self._lock = threading.Lock()
        self._jobs: dict[int, concurrent.futures.Future] = {}
        self._finished: list = []
        self.last_error: Optional[BaseException] = None  # why the last failed job failed
        self.stats = {"loads": 0, "stores": 0, "failed": 0, "bytes_loaded": 0, "bytes_stored": 0,
                      "g4_slices_read": 0, "rejected_slices": 0}

    @staticmethod
    def _group_names(names, groups, layout, named) -> list:
        """The layer names of each group, checked: one group of every layer
        without ``groups``; with it, a dict of caches naming every layer of
        every group once, num_layers layers a group."""
        if groups is None:
            if len(names) != layout.num_layers:
                raise _error(InvalidArgumentError, f"kvbm.vllm: {len(names)} KV tensors, the "
                             f"layout has num_layers {layout.num_layers}")
            return [list(names)]
        groups = [list(g) for g in groups]
        if not named:
            raise _error(InvalidArgumentError, "kvbm.vllm: KV cache groups need the KV "
                         "tensors as a dict by layer name")
        if not groups or len(groups) > 16:
            raise _error(InvalidArgumentError, f"kvbm.vllm: {len(groups)} KV cache groups "
                         "(1..16)")
        seen = set()
        for i, g in enumerate(groups):
            if len(g) != layout.num_layers:
                raise _error(InvalidArgumentError, f"kvbm.vllm: KV cache group {i} has {len(g)} "
                             f"layers, the layout num_layers {layout.num_layers}")
            for n in g:
                if n not in names or n in seen:
                    raise _error(InvalidArgumentError, f"kvbm.vllm: KV cache group {i}: layer "
                                 f"{n!r} is {'listed twice' if n in seen else 'not in the KV tensors'}")
                seen.add(n)
        return groups

    @staticmethod
    def _group_states(states, ngroups: int) -> list:
        """One item per group: None for attention, a StateLayout for Mamba."""
        if states is None:
            return [None] * ngroups
        states = list(states)
        if len(states) != ngroups or any(st is not None and not isinstance(st, StateLayout)
                                         for st in states):
            raise _error(InvalidArgumentError, f"kvbm.vllm: states: one item per KV cache "
                         f"group ({ngroups}), None or a StateLayout, got {states!r:.120}")
        return states

    def _state_tensors(self, t, name: str, st: "StateLayout") -> list:
        """A Mamba layer's state tensors, checked against the group's
        MambaSpec: vLLM's (conv, temporal) list, each [num_blocks, *shape]
        in its dtype (a block id indexes dim 0), or the newer runner's byte
        page view [num_blocks, 1, 1, page_bytes], cut into those states as
        vLLM's Mamba layer does. Anything else: InvalidArgumentError naming
        the layer, what it is and what the spec wants."""
        torch = _torch()
        dts = [getattr(torch, d) for d in st.dtypes]
        if isinstance(t, torch.Tensor) and t.dtype in (torch.int8, torch.uint8) and t.dim() >= 2 \
                and t[0].numel() >= st.layer_bytes:
            pages = t.reshape(t.shape[0], -1)
            out, off = [], 0
            for i, (shape, dt) in enumerate(zip(st.shapes, dts)):
                nbytes = st.state_bytes(i)
                out.append(pages[:, off:off + nbytes].view(dt).view(-1, *shape))
                off += nbytes
            return out
        got = list(t) if isinstance(t, (list, tuple)) else [t]
        ok = len(got) == len(st.shapes) and all(
            isinstance(x, torch.Tensor) and x.dim() == len(shape) + 1 and x.dtype == dt
            and tuple(x.shape[1:]) == tuple(shape) for x, shape, dt in zip(got, st.shapes, dts))
        if not ok:
            desc = [(tuple(x.shape), str(x.dtype).replace("torch.", ""))
                    if isinstance(x, torch.Tensor) else type(x).__name__ for x in got]
            raise _error(LayoutError, f"kvbm.vllm: Mamba layer {name!r} holds {desc}; its "
                         f"MambaSpec wants states {[(('num_blocks',) + tuple(sh), d) for sh, d in zip(st.shapes, st.dtypes)]}",
                         field="mamba_state")
        return got

    def _block_groups(self, job_id, gpu, n) -> list[int]:
        """The group of each of a transfer's n GPU blocks (vLLM's
        group_sizes: ids ordered by group); all group 0 without it."""
        sizes = getattr(gpu, "group_sizes", None)
        if sizes is None:
            return [0] * n
        sizes = [int(x) for x in sizes]
        if len(sizes) > len(self._kv_groups) or any(x < 0 for x in sizes) or sum(sizes) != n:
            raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: group_sizes {sizes} "
                         f"do not split {n} blocks over this handler's "
                         f"{len(self._kv_groups)} KV cache group(s)")
        return [g for g, x in enumerate(sizes) for _ in range(x)]

    # -- checks done before anything is queued
    def _check(self, job_id, spec) -> tuple[str, KvbmLoadStoreSpec, list[int], list[int]]:
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise TypeError(f"kvbm.vllm: job_id must be an int, got {type(job_id).__name__}")
        with self._lock:
            if job_id in self._jobs:
                raise _error(StateError, f"kvbm.vllm: job {job_id} is already running")
        try:
            src, dst = spec
        except (TypeError, ValueError):
            raise TypeError("kvbm.vllm: a transfer spec is a (src, dst) pair") from None
        if src.medium() == "GPU" and isinstance(dst, KvbmLoadStoreSpec) and dst.kind == "store":
            gpu, kv, direction = src, dst, "store"
        elif dst.medium() == "GPU" and isinstance(src, KvbmLoadStoreSpec) and src.kind == "load":
            gpu, kv, direction = dst, src, "load"
        else:
            raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: no transfer from "
                         f"{src!r} to {dst!r} (GPU->KVBM store or KVBM->GPU load)")
        ids = [int(b) for b in gpu.block_ids]
        grp = self._block_groups(job_id, gpu, len(ids))
        if len(ids) != len(kv.keys):
            raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: {len(ids)} GPU blocks "
                         f"for {len(kv.keys)} kvbm blocks")
        for b in ids:
            if not 0 <= b < self.num_blocks:
                raise _error(RangeError, f"kvbm.vllm: job {job_id}: GPU block id {b} is not in "
                             f"0..{self.num_blocks - 1}")
        if direction == "store":
            lens = (len(kv.g2_slots), len(kv.g3_slots), len(kv.g4))
            if lens != (len(ids),) * 3:
                raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: store spec lists "
                             f"of lengths {lens} for {len(ids)} blocks")
            self._check_slots(job_id, kv.g2_slots, self.g2_blocks, "G2", allow_none=False)
            self._check_slots(job_id, kv.g3_slots, self.g3_blocks, "G3", allow_none=True)
            if any(kv.g4) and self.g4 is None:
                raise _error(StateError, f"kvbm.vllm: job {job_id}: G4 store but no G4 volume")
        else:
            if (len(kv.tiers), len(kv.slots)) != (len(ids), len(ids)):
                raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: load spec lists "
                             f"do not match its {len(ids)} blocks")
            for t, s in zip(kv.tiers, kv.slots):
                if t == G2:
                    self._check_slots(job_id, [s], self.g2_blocks, "G2", allow_none=False)
                elif t == G3 and self.g3 is not None:
                    self._check_slots(job_id, [s], self.g3_blocks, "G3", allow_none=False)
                elif t != G4 or self.g4 is None:
                    raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: tier {t} has "
                                 "no store on this worker")
        return direction, kv, ids, grp

    @staticmethod
    def _check_slots(job_id, slots, n, tier, *, allow_none):
        for s in slots:
            if not (0 <= s < n or (allow_none and s == -1)):
                raise _error(RangeError, f"kvbm.vllm: job {job_id}: {tier} slot {s} is not in "
                             f"0..{n - 1}")

    # -- OffloadingHandler
    def transfer_async(self, job_id: int, spec) -> bool:
        direction, kv, ids, grp = self._check(job_id, spec)
        run = self._store if direction == "store" else self._load
        with self._lock:
            self._jobs[job_id] = self._pool.submit(self._run, job_id, direction, run, kv, ids, grp)
        return True

    # the newest vLLM's OffloadingWorker names the direction (base.py @ 0105e232)
    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        """GPU -> kvbm: ``transfer_async(job_id, (src_spec, dst_spec))``."""
        if src_spec.medium() != "GPU":
            raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: submit_store reads "
                         f"the GPU, not {src_spec!r}")
        return self.transfer_async(job_id, (src_spec, dst_spec))

    def submit_load(self, job_id: int, src_spec, dst_spec) -> bool:
        """kvbm -> GPU: ``transfer_async(job_id, (src_spec, dst_spec))``."""
        if dst_spec.medium() != "GPU":
            raise _error(InvalidArgumentError, f"kvbm.vllm: job {job_id}: submit_load writes "
                         f"the GPU, not {dst_spec!r}")
        return self.transfer_async(job_id, (src_spec, dst_spec))

    def shutdown(self) -> None:
        self.close()

    def _run(self, job_id, direction, run, kv, ids, grp) -> None:
        import time
        t0 = time.monotonic()
        try:
            nbytes = run(kv, ids, grp)
            ok = True
        except Exception as e:  # reported as a failed job, never as bytes
            self.last_error = e
            nbytes, ok = None, False
            self.stats["failed"] += 1
        with self._lock:
            self._finished.append(TransferResult(
                job_id=job_id, success=ok, transfer_size=nbytes,
                transfer_time=time.monotonic() - t0,
                transfer_type=("GPU", "KVBM") if direction == "store" else ("KVBM", "GPU")))

    def get_finished(self) -> list:
        with self._lock:
            out, self._finished = self._finished, []
            for r in out:
                self._jobs.pop(r.job_id, None)
        return out

    def wait(self, job_ids) -> None:
        with self._lock:
            futs = [self._jobs[j] for j in job_ids if j in self._jobs]
        concurrent.futures.wait(futs)

    # -- the copies
    @staticmethod
    def _runs(src_ids, dst_ids):
        """(src, dst, n): maximal runs where both id lists go up by one."""
        i = 0
        while i < len(src_ids):
            n = 1
            while (i + n < len(src_ids) and src_ids[i + n] == src_ids[i] + n
                   and dst_ids[i + n] == dst_ids[i] + n):
                n += 1
            yield src_ids[i], dst_ids[i], n
            i += n

    def _copy(self, copies) -> None:
        """copies: [(src per-layer tensors, src ids, dst ids)] into the
        engine's tensors, or [(..., to G2)] when the destination is G2 (a
        store): one tensor copy per layer and run of blocks."""
        for src, src_ids, dst_ids, dst in copies:
            for layer in range(len(src)):
                s, d = src[layer], dst[layer]
                for a, b, n in self._runs(src_ids, dst_ids):
                    d[:, b:b + n].copy_(s[:, a:a + n], non_blocking=True)
        if self.device.type == "cuda":
            _torch().cuda.synchronize(self.device)

    def _block(self, slot: int):
        """One G2 block as [layers, 2, bs, heads, hd] (a copy)."""
        return _torch().stack([g[:, slot] for g in self.g2])

    @staticmethod
    def _per_group(grp):
        """(g, [positions]) for each group present, in order."""
        out: dict = {}
        for i, g in enumerate(grp):
            out.setdefault(g, []).append(i)
        return out.items()

    def _gather_states(self, g: int, ids: list[int]):
        """Group g's states at these GPU block ids as [n, block_bytes]
        bytes: every layer's first (conv) state, then every layer's second."""
        torch = _torch()
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        parts = [layer[j].index_select(0, idx).reshape(len(ids), -1).view(torch.uint8)
                 for j in range(len(self._states[g].shapes)) for layer in self._state_kv[g]]
        return torch.cat(parts, dim=1).cpu()

    def _put_states(self, g: int, ids: list[int], rows) -> None:
        """Writes [n, block_bytes] bytes into group g's states at these
        GPU block ids (the inverse of _gather_states)."""
        torch = _torch()
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        rows = rows.to(self.device)
        off = 0
        for j, shape in enumerate(self._states[g].shapes):
            nbytes = self._states[g].state_bytes(j)
            for layer in self._state_kv[g]:
                t = layer[j]
                t.index_copy_(0, idx, rows[:, off:off + nbytes].contiguous().view(t.dtype)
                              .view(len(ids), *shape))
                off += nbytes

    def _is_state(self, g: int) -> bool:
        return self._states[g] is not None

    def _store(self, kv: KvbmLoadStoreSpec, ids: list[int], grp: list[int]) -> int:
        torch = _torch()
        self._copy([(self._kv_groups[g], [ids[i] for i in pos], [kv.g2_slots[i] for i in pos],
                     self.g2) for g, pos in self._per_group(grp) if not self._is_state(g)])
        nbytes = 0
        for g, pos in self._per_group(grp):
            if self._is_state(g):
                st = self._states[g]
                slots = torch.tensor([kv.g2_slots[i] for i in pos], dtype=torch.long)
                self.g2_state[:, :st.block_bytes].index_copy_(
                    0, slots, self._gather_states(g, [ids[i] for i in pos]))
                nbytes += len(pos) * st.block_bytes
            else:
                nbytes += len(pos) * self._rank_bytes
        lay = self.layout
        g3_items, g4_items = [], []
        for i, key in enumerate(kv.keys):
            if kv.g3_slots[i] < 0 and not kv.g4[i]:
                continue
            st = self._states[grp[i]]
            if st is not None:   # a state is one value per rank in G3 and G4
                body = (_state_header(lay, st, key)
                        + self.g2_state[kv.g2_slots[i], :st.block_bytes].numpy().tobytes())
                frame = _kvbm.frame_encode(body, 0)
                if kv.g3_slots[i] >= 0:
                    g3_items.append((kv.g3_slots[i], frame))
                if kv.g4[i]:
                    g4_items.append((state_slice_key(key, lay.tp_rank), frame))
                continue
            blk = self._block(kv.g2_slots[i])
            if kv.g3_slots[i] >= 0:
                body = (_slice_header(lay, key, lay.heads.start, lay.local_heads)
                        + _tensor_bytes(blk))
                g3_items.append((kv.g3_slots[i], _kvbm.frame_encode(body, 0)))
            if kv.g4[i]:   # heads first: each head's slice is one contiguous piece
                per_head = blk.permute(3, 0, 1, 2, 4).contiguous()
                for j, head in enumerate(lay.heads):
                    body = _slice_header(lay, key, head, 1) + _tensor_bytes(per_head[j])
                    g4_items.append((slice_key(key, head), _kvbm.frame_encode(body, 0)))
        for vol, items, tier in ((self.g3, g3_items, "G3"), (self.g4, g4_items, "G4")):
            if items:
                bad = [s for s in vol.put_many(items) if s != 0]
                if bad:
                    raise _error(IoError, f"kvbm.vllm: {len(bad)} {tier} puts failed "
                                 f"(first status {bad[0]})")
        self.stats["stores"] += 1
        self.stats["bytes_stored"] += nbytes
        return nbytes

    def _verified_state(self, raw, key: int, st: StateLayout) -> bytes:
        """The payload of a stored Mamba state, or an error: a frame whose
        BLAKE3 fails, or a header naming another block, model, state layout
        (shapes, dtypes, layers), block size or TP rank/size."""
        if raw is None:
            raise _error(NotFoundError, f"kvbm.vllm: Mamba state of block {key:#018x} "
                         f"(rank {self.layout.tp_rank}) is not in the store")
        try:
            _, body = _kvbm.frame_decode(raw)
        except Error as e:
            self.stats["rejected_slices"] += 1
            raise _error(ChecksumError, f"kvbm.vllm: Mamba state of block {key:#018x}: {e}") \
                from None
        want = _state_header(self.layout, st, key)
        if body[:_STATE_HDR.size] != want or len(body) != _STATE_HDR.size + st.block_bytes:
            self.stats["rejected_slices"] += 1
            raise _error(LayoutError, f"kvbm.vllm: Mamba state of block {key:#018x}: stored "
                         "header or size does not match this engine's (another block, model, "
                         "state layout, block size or TP rank)", field="mamba_state")
        return body[_STATE_HDR.size:]

    def _verified(self, raw, key: int, head0: int, nheads: int, nbytes: int) -> bytes:
        """The payload of a stored slice, or ChecksumError: a frame whose
        BLAKE3 fails, or a header naming another block, head or layout."""
        if raw is None:
            raise _error(NotFoundError, f"kvbm.vllm: block {key:#018x} heads {head0}+{nheads} "
                         "is not in the store")
        try:
            _, body = _kvbm.frame_decode(raw)
        except Error as e:
            self.stats["rejected_slices"] += 1
            raise _error(ChecksumError, f"kvbm.vllm: block {key:#018x}: {e}") from None
        want = _slice_header(self.layout, key, head0, nheads)
        if body[:_SLICE_HDR.size] != want or len(body) != _SLICE_HDR.size + nbytes:
            self.stats["rejected_slices"] += 1
            raise _error(ChecksumError, f"kvbm.vllm: block {key:#018x} heads {head0}+{nheads}: "
                         "stored header or size does not match (another block or layout)")
        return body[_SLICE_HDR.size:]

    def _load(self, kv: KvbmLoadStoreSpec, ids: list[int], grp: list[int]) -> int:
        torch = _torch()
        lay = self.layout
        state = [i for i in range(len(ids)) if self._is_state(grp[i])]
        states = self._load_states(kv, state, grp)   # verified, nothing written yet
        far = [i for i, t in enumerate(kv.tiers)           # G3/G4: staged, verified
               if t != G2 and not self._is_state(grp[i])]
        dtype = self.g2[0].dtype
        stage = torch.empty((lay.num_layers, 2, len(far)) + self._slot_shape[2:], dtype=dtype)
        row = {i: r for r, i in enumerate(far)}

        def put(i, payload, shape):
            stage[:, :, row[i]] = _from_bytes(payload, shape, dtype)
        g3_want = [(i, kv.slots[i]) for i in far if kv.tiers[i] == G3]
        g4_want = [i for i in far if kv.tiers[i] == G4]
        if g3_want:
            got = self.g3.get_many([s for _, s in g3_want], self._rank_bytes + 4096)
            for (i, _), raw in zip(g3_want, got):
                put(i, self._verified(raw, kv.keys[i], lay.heads.start, lay.local_heads,
                                      self._rank_bytes), self._slot_shape)
        if g4_want:
            keys = [slice_key(kv.keys[i], h) for i in g4_want for h in lay.heads]
            got = self.g4.get_many(keys, self._head_bytes + 4096)
            self.stats["g4_slices_read"] += len(keys)
            one = self._slot_shape[:3] + (lay.head_dim,)
            heads = torch.empty((lay.local_heads,) + one, dtype=dtype)
            for n, i in enumerate(g4_want):
                for j, head in enumerate(lay.heads):
                    heads[j] = _from_bytes(self._verified(got[n * lay.local_heads + j],
                                                          kv.keys[i], head, 1, self._head_bytes),
                                           one, dtype)
                stage[:, :, row[i]] = heads.permute(1, 2, 3, 0, 4)
        # every block checked: now, and only now, the engine's blocks are written
        copies = []
        for g, pos in self._per_group(grp):
            if self._is_state(g):
                continue
            near = [i for i in pos if kv.tiers[i] == G2]
            mine = [i for i in pos if kv.tiers[i] != G2]
            copies += [(self.g2, [kv.slots[i] for i in near], [ids[i] for i in near],
                        self._kv_groups[g]),
                       (list(stage), [row[i] for i in mine], [ids[i] for i in mine],
                        self._kv_groups[g])]
        self._scatter(copies)
        nbytes = (len(ids) - len(state)) * self._rank_bytes
        for g, (pos, rows) in states.items():
            self._put_states(g, [ids[i] for i in pos], rows)
            nbytes += len(pos) * self._states[g].block_bytes
        self.stats["loads"] += 1
        self.stats["bytes_loaded"] += nbytes
        return nbytes

    def _load_states(self, kv: KvbmLoadStoreSpec, state: list[int], grp: list[int]) -> dict:
        """{group: (positions, [n, block_bytes] bytes)} of a load's Mamba
        blocks, read from G2 or read and verified from G3/G4; writes nothing."""
        torch = _torch()
        far = [i for i in state if kv.tiers[i] != G2]
        payload = {}
        for tier, vol in ((G3, self.g3), (G4, self.g4)):
            want = [i for i in far if kv.tiers[i] == tier]
            if not want:
                continue
            keys = ([kv.slots[i] for i in want] if tier == G3 else
                    [state_slice_key(kv.keys[i], self.layout.tp_rank) for i in want])
            cap = max(self._states[grp[i]].block_bytes for i in want) + 4096
            for i, raw in zip(want, vol.get_many(keys, cap)):
                payload[i] = self._verified_state(raw, kv.keys[i], self._states[grp[i]])
        out = {}
        for g, pos in self._per_group([grp[i] for i in state]):
            pos = [state[p] for p in pos]
            nb = self._states[g].block_bytes
            rows = torch.empty((len(pos), nb), dtype=torch.uint8)
            for r, i in enumerate(pos):
                if kv.tiers[i] == G2:
                    rows[r] = self.g2_state[kv.slots[i], :nb]
                else:
                    rows[r] = torch.frombuffer(bytearray(payload[i]), dtype=torch.uint8)
            out[g] = (pos, rows)
        return out

    def _scatter(self, copies) -> None:
        """The only place a load writes the engine's tensors."""
        self._copy(copies)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for v in (self.g3, self.g4):
            if v is not None:
                v.close()


def _tensor_bytes(t) -> bytes:
    return t.contiguous().view(_torch().uint8).numpy().tobytes()


def _from_bytes(payload: bytes, shape, dtype):
    torch = _torch()
    return torch.frombuffer(bytearray(payload), dtype=dtype).reshape(shape)


# ---------------------------------------------------------------- the spec


def _layout_from_config(spec) -> KvLayout:
    """The layout from kv_connector_extra_config ("kvbm_*" keys), falling
    back to what vLLM's config says where vLLM is there."""
    extra, cfg = spec.extra_config, spec.vllm_config
    mc = getattr(cfg, "model_config", None)
    pc = getattr(cfg, "parallel_config", None)

    def pick(key, fallback):
        v = extra.get(key)
        if v is not None:
            return v
        try:
            return fallback()
        except Exception:
            raise _error(InvalidArgumentError, f"kvbm.vllm: kv_connector_extra_config needs "
                         f"{key!r} (not found in vLLM's config)") from None

    tp_size = int(pick("kvbm_tp_size", lambda: pc.tensor_parallel_size))
    heads = int(pick("kvbm_num_kv_heads", lambda: mc.get_total_num_kv_heads()))

    def rank():
        import torch.distributed as dist
        return dist.get_rank() % tp_size if dist.is_initialized() else 0

    return KvLayout(
        model_fingerprint=str(pick("kvbm_model_fingerprint",
                                   lambda: f"{mc.model}@{mc.revision or 'main'}")),
        dtype=str(pick("kvbm_dtype", lambda: mc.dtype)),
        num_kv_heads=heads, head_dim=int(pick("kvbm_head_dim", lambda: mc.get_head_size())),
        block_size=int(pick("block_size", lambda: spec.gpu_block_size)),
        num_layers=int(pick("kvbm_num_layers", lambda: mc.get_num_layers(pc))),
        tp_rank=int(pick("kvbm_tp_rank", rank)), tp_size=tp_size)


# kvbm's group kinds as vLLM's events name them (kv_cache_spec_kind;
# kvbm_group_kind_name in C)
_SPEC_KIND = {"full": "full_attention", "sw": "sliding_window",
              "chunk": "chunked_local_attention", "mamba": "mamba", "mamba-align": "mamba"}


def _groups_from_vllm(kv_cache_config) -> list:
    from . import groups_from_vllm
    return groups_from_vllm(kv_cache_config)


def group_key(block_hash, group: int) -> bytes:
    """The key of a block of KV cache group ``group``, as vLLM's hybrid
    offloading makes it (``make_offload_key``): the hash's bytes, then the
    group as 4 big-endian bytes. An int hash (kvbm's, old vLLM's
    ``hash_value``) is taken as its 8 little-endian bytes. Two groups' blocks
    of one hash are two keys, and KvbmConnectorV1 and KvbmOffloadingSpec
    name a block alike in a shared G4."""
    if isinstance(block_hash, (bytes, bytearray, memoryview)):
        raw = bytes(block_hash)
    else:
        value = getattr(block_hash, "hash_value", block_hash)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"kvbm.vllm: a block hash must be bytes or int, "
                            f"got {type(block_hash).__name__}")
        raw = (value & _MASK64).to_bytes(8, "little")
    return raw + int(group).to_bytes(4, "big")


def first_needed_block(kind: str, tokens: Optional[int], hit_tokens: int, block_size: int) -> int:
    """The first block a group needs for a hit of ``hit_tokens`` (kvbm's
    kvbm_group_skipped_tokens / block_size, vLLM's get_num_skipped_tokens):
    0 for full attention, the blocks covering the last W - 1 tokens for a
    window of W, the hit's chunk for chunked local attention, the last
    state for Mamba."""
    if kind == "sw":
        skipped = max(0, hit_tokens + 1 - tokens)
    elif kind == "chunk":
        skipped = hit_tokens // tokens * tokens
    elif kind.startswith("mamba"):
        skipped = max(0, hit_tokens - 1)
    else:
        skipped = 0
    return skipped // block_size


class KvbmOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over kvbm. kv_connector_extra_config keys:

    ``kvbm_g2_blocks`` (host blocks per rank, required), ``kvbm_g3_blocks``
    and ``kvbm_g3_url`` (a local kvbm volume per rank, e.g. ``file:///nvme/kvbm``),
    ``kvbm_g3_policy`` (``all``/``frequency``), ``kvbm_freq_threshold``,
    ``kvbm_g4_url`` (shared kvbm volume: ``file://``, ``redis://``, ...),
    ``kvbm_g4_namespace``, ``kvbm_events_endpoint`` (kvbm's KV events),
    ``kvbm_model_fingerprint``, and layout overrides ``kvbm_num_kv_heads``,
    ``kvbm_head_dim``, ``kvbm_num_layers``, ``kvbm_dtype``, ``kvbm_tp_size``,
    ``kvbm_tp_rank`` (read from vLLM's config where vLLM is there)."""

    def __init__(self, vllm_config, kv_cache_config=None):
        super().__init__(vllm_config, kv_cache_config)
        if not hasattr(self, "gpu_block_size"):
            self.gpu_block_size = vllm_config.cache_config.block_size
        bs = self.gpu_block_size
        self.gpu_block_size = bs[0] if isinstance(bs, tuple) else bs
        x = self.extra_config
        if "kvbm_g2_blocks" not in x:
            raise _error(InvalidArgumentError,
                         "kvbm.vllm: kv_connector_extra_config needs 'kvbm_g2_blocks'")
        self.layout = _layout_from_config(self)
        self._groups = self._kv_groups_of(kv_cache_config)
        # (kind, tokens) of each group, kvbm.groups_from_vllm's; None: one group
        self.group_kinds = (None if self._groups is None else
                            _groups_from_vllm(kv_cache_config))
        # per group None or a Mamba group's StateLayout (its MambaSpec)
        self.states = (None if self._groups is None else
                       self._states_of(kv_cache_config, self._groups))
        if self._groups and "kvbm_num_layers" not in x:  # the layers of one group
            self.layout = dataclasses.replace(self.layout, num_layers=len(self._groups[0]))
        if self.layout.block_size != self.gpu_block_size:
            raise _error(LayoutError, f"kvbm.vllm: block_size {self.layout.block_size} differs "
                         f"from the GPU block size {self.gpu_block_size}", field="block_size")
        self._manager: Optional[KvbmOffloadingManager] = None

    def _opt(self, key, default=None):
        return self.extra_config.get(key, default)

    @staticmethod
    def _kv_groups_of(kv_cache_config) -> Optional[list]:
        """A hybrid model's groups (kv_cache_config with more than one
        kv_cache_group, or any Mamba group): each group's layer names, after
        kvbm.groups_from_vllm checked the kinds. None for one attention
        group (or no config)."""
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        if not groups:
            return None
        kinds = _groups_from_vllm(groups)
        if len(groups) == 1 and not kinds[0][0].startswith("mamba"):
            return None
        return [list(g.layer_names) for g in groups]

    @staticmethod
    def _states_of(kv_cache_config, names: list) -> list:
        """Per group None (attention) or the StateLayout of a Mamba group's
        MambaSpec (shapes and dtypes per layer, the group's layer count)."""
        out = []
        for g, layer_names in zip(kv_cache_config.kv_cache_groups, names):
            spec = g.kv_cache_spec
            if "UniformTypeKVCacheSpecs" in [c.__name__ for c in type(spec).__mro__]:
                spec = next(iter(spec.kv_cache_specs.values()))
            is_mamba = "MambaSpec" in [c.__name__ for c in type(spec).__mro__]
            out.append(mamba_state_layout(spec, len(layer_names)) if is_mamba else None)
        return out

    def get_manager(self) -> KvbmOffloadingManager:
        if self._manager is None:
            self._manager = KvbmOffloadingManager(
                self.layout, g2_blocks=int(self._opt("kvbm_g2_blocks")),
                g3_blocks=int(self._opt("kvbm_g3_blocks", 0)),
                g3_policy=self._opt("kvbm_g3_policy", "all"),
                freq_threshold=int(self._opt("kvbm_freq_threshold", 2)),
                g4_url=self._opt("kvbm_g4_url"),
                g4_namespace=self._opt("kvbm_g4_namespace", "kvbm-vllm"),
                events_endpoint=self._opt("kvbm_events_endpoint"),
                events_replay_endpoint=self._opt("kvbm_events_replay_endpoint"),
                groups=self.group_kinds)
        return self._manager

    def get_handlers(self, kv_caches, attn_backends=None) -> Iterator:
        if hasattr(kv_caches, "tensors") and hasattr(kv_caches, "group_data_refs"):
            raise _error(UnsupportedError, "kvbm.vllm: vLLM's canonical (byte-page) KV caches "
                         "hide the head axis TP-portable blocks need; pass the per-layer tensors")
        handler = KvbmOffloadingHandler(
            kv_caches, self.layout, g2_blocks=int(self._opt("kvbm_g2_blocks")),
            g3_blocks=int(self._opt("kvbm_g3_blocks", 0)), g3_url=self._opt("kvbm_g3_url"),
            g4_url=self._opt("kvbm_g4_url"),
            g4_namespace=self._opt("kvbm_g4_namespace", "kvbm-vllm"),
            kv_layout=self._opt("kvbm_kv_layout", "flash_attn"), groups=self._groups,
            states=self.states)
        yield GPULoadStoreSpec, KvbmLoadStoreSpec, handler
        yield KvbmLoadStoreSpec, GPULoadStoreSpec, handler

    def get_worker(self, kv_caches) -> KvbmOffloadingHandler:
        """The newest vLLM's worker-side call (one OffloadingWorker with
        submit_store / submit_load): the same handler. vLLM passes it
        CanonicalKVCaches there, which are refused as in get_handlers."""
        ((_, _, handler), _) = self.get_handlers(kv_caches)
        return handler


# ---------------------------------------------------------------- a KVConnectorBase_V1 (copy model)


def _import_connector_base():
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import (
                KVConnectorWorkerMetadata)
        except ImportError:
            KVConnectorWorkerMetadata = object
        return KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata
    except Exception:
        return None


_VLLM_CONNECTOR = _import_connector_base() if HAVE_VLLM else None

if _VLLM_CONNECTOR is not None:
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata = \
        _VLLM_CONNECTOR
else:
    from .connector import KVConnectorRole  # the stand-in enum kvbm.connector uses

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorMetadata (scheduler -> workers)."""

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorWorkerMetadata (workers -> scheduler)."""

        def aggregate(self, other):
            raise NotImplementedError

    class KVConnectorBase_V1(ABC):  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorBase_V1: the same method names."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches) -> None:
            return None

        def handle_preemptions(self, kv_connector_metadata) -> None:
            return None

        @abstractmethod
        def start_load_kv(self, forward_context, **kwargs) -> None: ...

        @abstractmethod
        def wait_for_layer_load(self, layer_name: str) -> None: ...

        @abstractmethod
        def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None: ...

        @abstractmethod
        def wait_for_save(self) -> None: ...

        def get_finished(self, finished_req_ids):
            return None, None

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def shutdown(self) -> None:
            return None

        @abstractmethod
        def get_num_new_matched_tokens(self, request, num_computed_tokens: int): ...

        @abstractmethod
        def update_state_after_alloc(self, request, blocks, num_external_tokens: int): ...

        @abstractmethod
        def build_connector_meta(self, scheduler_output): ...

        def update_connector_output(self, connector_output) -> None:
            return None

        def request_finished(self, request, block_ids):
            return False, None

        def take_events(self):
            return ()


@dataclasses.dataclass
class KvbmTransferJob:
    """One transfer: the request it serves, its (src, dst) LoadStoreSpecs."""

    req_id: str
    src_spec: Any
    dst_spec: Any


@dataclasses.dataclass
class KvbmConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> every worker, per step: the jobs to start (plain data)."""

    load_jobs: dict
    store_jobs: dict


@dataclasses.dataclass
class KvbmWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: job id -> ranks that finished it / failed it;
    vLLM sums these over the ranks of a step (``aggregate``)."""

    completed: dict = dataclasses.field(default_factory=dict)
    failed: dict = dataclasses.field(default_factory=dict)

    def aggregate(self, other):
        out = KvbmWorkerMetadata(dict(self.completed), dict(self.failed))
        for src, dst in ((other.completed, out.completed), (other.failed, out.failed)):
            for j, n in src.items():
                dst[j] = dst.get(j, 0) + n
        return out


def _block_ids(blocks, ngroups: int = 1, tables: bool = False) -> list:
    """vLLM's KVCacheBlocks (``get_block_ids()`` -> one list per group), or
    ids: group 0's ids for one group, one list per group for ``ngroups`` >
    1 or ``tables`` (then exactly ``ngroups`` lists)."""
    groups = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else None
    if ngroups == 1 and not tables:
        if groups is None:
            return [int(b) for b in blocks]
        if len(groups) != 1:
            raise _error(UnsupportedError, f"kvbm.vllm: {len(groups)} KV-cache groups, but "
                         "the kv_cache_config given to KvbmConnectorV1 has one")
        return [int(b) for b in groups[0]]
    if groups is None:
        groups = blocks
    return _group_tables(groups, ngroups, "blocks")


def _group_tables(groups, ngroups: int, what: str) -> list:
    """One list of block ids per group, checked: exactly ``ngroups`` lists."""
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__len__") or \
            len(groups) != ngroups or any(isinstance(g, (int, str, bytes)) for g in groups):
        raise _error(InvalidArgumentError, f"KvbmConnectorV1: {what}: expected {ngroups} "
                     f"lists of block ids (one per KV cache group), got {groups!r:.80}")
    return [[int(b) for b in g] for g in groups]


class KvbmConnectorV1(KVConnectorBase_V1):
    """kvbm as a vLLM KV connector in the copy model (LMCache's shape):
    vLLM's block manager keeps the GPU cache; kvbm gets lookups, loads and
    saves. Loaded by ``kv_connector: "KvbmConnectorV1"``,
    ``kv_connector_module_path: "kvbm.vllm"``; the same
    ``kv_connector_extra_config`` as KvbmOffloadingSpec.

    Scheduler role: the spec's ``KvbmOffloadingManager``; worker role: the
    spec's ``KvbmOffloadingHandler`` over the registered KV tensors. Loads
    are asynchronous (the request waits in WAITING_FOR_REMOTE_KVS); stores
    of the blocks a step fills start at the next step (after sampling) and
    a finished request's blocks are held until its stores finished on every
    rank. A job is done when every rank reported it (``KvbmWorkerMetadata``
    counts, summed by vLLM over the ranks; ``world_size`` ranks).

    Hybrid models (``kv_cache_config`` with several ``kv_cache_groups``:
    full, sliding window, chunked local attention, Mamba): a block of group g
    is stored under
    ``group_key(hash, g)`` (vLLM's OffloadKey) from group g's layers. The
    lookup is the longest prefix every group can serve (vLLM's coordinator
    rule): full attention needs every block, a window of W the blocks
    covering the last W - 1 tokens, a chunk its chunk's blocks; a load
    copies exactly those, each into its own group's GPU block. A step
    stores every group's new full blocks that vLLM still holds after it: a
    window's blocks that fall out of the window in the step that fills
    them are not stored (vLLM frees them at the next schedule, before the
    deferred store would read them), so a window group offloads what a hit
    at the end of a step needs, not every boundary's. A Mamba group needs
    the one state block at the hit's last block (vLLM's rule: a hit lands on
    a boundary where a state was saved), so the hit is shortened to the
    last boundary whose state kvbm holds; a step stores the state block of
    its end when the step ends on a block boundary (vLLM frees the others
    at the next schedule), and a load copies that one state into the
    group's GPU block at the hit's last position."""

    NULL_BLOCK = 0  # vLLM's null block id: table entries a group skips

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._spec = KvbmOffloadingSpec(vllm_config, kv_cache_config)
        self._kinds = self._spec.group_kinds  # None: one group
        self.num_groups = 1 if self._kinds is None else len(self._kinds)
        self.block_size = self._spec.layout.block_size
        self.world_size = self._spec.layout.tp_size
        self._is_scheduler = getattr(role, "name", role) in ("SCHEDULER", 0)
        self.manager = self._spec.get_manager() if self._is_scheduler else None
        self.handler: Optional[KvbmOffloadingHandler] = None
        # scheduler state
        self._next_job = 1
        self._lookups: dict = {}       # req id -> (start block, hit blocks)
        self._reqs: dict = {}          # req id -> request
        self._blocks: dict = {}        # req id -> GPU block ids
        self._next_store: dict = {}    # req id -> first block not yet stored
        self._jobs: dict = {}          # job id -> (kind, req id, block hashes)
        self._counts: collections.Counter = collections.Counter()
        self._failed_jobs: set = set()
        self._loads: dict = {}
        # worker state
        self._deferred: list = []
        self._job_req: dict = {}       # job id -> (kind, req id, GPU block ids)
        self._req_stores: dict = collections.defaultdict(set)
        self._finishing: set = set()
        self._done_meta = KvbmWorkerMetadata()
        self._load_errors: set = set()

    def _need(self, scheduler: bool, what: str) -> None:
        if self._is_scheduler != scheduler:
            raise _error(StateError, f"KvbmConnectorV1.{what} is a "
                         f"{'scheduler' if scheduler else 'worker'}-side call")

    def _hashes(self, request) -> list:
        """The request's full-block hashes that may be served from kvbm:
        never its last token (one token is always computed)."""
        n = max(0, (request.num_tokens - 1) // self.block_size)
        return list(request.block_hashes[:n])

    def _gkeys(self, hashes, g: int) -> list:
        """Group g's keys of these block hashes (the hashes themselves with
        one group: the keys before groups)."""
        if self._kinds is None:
            return list(hashes)
        return [group_key(h, g) for h in hashes]

    def _first(self, g: int, hit_blocks: int) -> int:
        kind, tokens = self._kinds[g]
        return first_needed_block(kind, tokens, hit_blocks * self.block_size, self.block_size)

    def _hybrid_hit(self, hashes: list, start: int) -> int:
        """The longest hit h (blocks, > start: the GPU's own prefix) every
        group can serve from kvbm, or start: for each h from the longest
        down, each group holds its needed blocks from max(start, first
        needed) to h (prefix sums of what kvbm holds, one batch a group)."""
        n = len(hashes)
        held = []
        for g in range(self.num_groups):
            c = [0]
            for x in self.manager.held(self._gkeys(hashes[start:], g)):
                c.append(c[-1] + bool(x))
            held.append(c)
        for h in range(n, start, -1):
            if all(held[g][h - start] - held[g][lo - start] == h - lo
                   for g in range(self.num_groups)
                   for lo in (max(start, self._first(g, h)),)):
                return h
        return start

    # -- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._need(True, "get_num_new_matched_tokens")
        hashes = self._hashes(request)
        for g in range(self.num_groups):
            self.manager.touch(self._gkeys(hashes, g))
        start = num_computed_tokens // self.block_size
        if num_computed_tokens % self.block_size or start >= len(hashes):
            return 0, False
        if self._kinds is None:
            hits = self.manager.lookup(hashes[start:])
        else:
            hits = self._hybrid_hit(hashes, start) - start
        self._lookups[request.request_id] = (start, hits)
        return (hits * self.block_size, True) if hits else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._need(True, "update_state_after_alloc")
        rid = request.request_id
        self._reqs[rid] = request
        self._blocks[rid] = _block_ids(blocks, self.num_groups, self._kinds is not None)
        if num_external_tokens == 0:
            return
        start, hits = self._lookups.pop(rid, (None, 0))
        if start is None or hits * self.block_size != num_external_tokens:
            raise _error(InvalidArgumentError, f"KvbmConnectorV1: {rid}: "
                         f"{num_external_tokens} external tokens, the lookup found "
                         f"{hits * self.block_size}")
        if self._kinds is not None:
            self._hybrid_load(request, start, start + hits)
            return
        ids = self._blocks[rid][start:start + hits]
        if len(ids) != hits:
            raise _error(InvalidArgumentError, f"KvbmConnectorV1: {rid}: {len(ids)} blocks "
                         f"allocated for {hits} to load")
        hashes = self._hashes(request)[start:start + hits]
        src = self.manager.prepare_load(hashes)
        job = self._new_job("load", rid, hashes)
        self._loads[job] = KvbmTransferJob(rid, src, GPULoadStoreSpec(ids))
        self._next_store[rid] = start + hits

    def _hybrid_load(self, request, start: int, hit: int) -> None:
        """The load of a hybrid hit: each group's needed blocks from
        max(start, first needed) to hit, into its own table's GPU blocks
        (ids ordered by group, vLLM's group_sizes)."""
        rid = request.request_id
        hashes = self._hashes(request)
        keys, ids, sizes, firsts = [], [], [], []
        for g, table in enumerate(self._blocks[rid]):
            lo = max(start, self._first(g, hit))
            gids = table[lo:hit]
            if len(gids) != hit - lo or self.NULL_BLOCK in gids:
                raise _error(InvalidArgumentError, f"KvbmConnectorV1: {rid}: group {g} has "
                             f"blocks {gids} for the {hit - lo} it loads (positions {lo}.."
                             f"{hit - 1}; null blocks or missing)")
            keys += self._gkeys(hashes[lo:hit], g)
            ids += gids
            sizes.append(len(gids))
            firsts.append(lo)
        src = self.manager.prepare_load(keys)
        job = self._new_job("load", rid, keys)
        self._loads[job] = KvbmTransferJob(rid, src, GPULoadStoreSpec(
            ids, group_sizes=sizes, block_indices=firsts))
        self._next_store[rid] = hit

    def _hybrid_stores(self, rid, req, done: int, stores: dict) -> None:
        """A step's stores of a hybrid request: every group's full blocks
        from the first not stored yet up to `done` tokens that the group
        still holds after the step (at or after its first needed block for
        `done`, not a null block), one job, ids ordered by group."""
        hashes = list(req.block_hashes[:done // self.block_size])
        start = self._next_store.get(rid, 0)
        if len(hashes) <= start:
            return
        items = []
        for g, table in enumerate(self._blocks[rid]):
            lo = max(start, first_needed_block(*self._kinds[g], done, self.block_size))
            items += [(g, k) for k in range(lo, min(len(hashes), len(table)))
                      if table[k] != self.NULL_BLOCK]
        keys = [group_key(hashes[k], g) for g, k in items]
        out = self.manager.prepare_store(keys) if keys else None
        if out is None and keys:
            return  # no room now: tried again next step
        self._next_store[rid] = len(hashes)
        keep = set(out.block_hashes_to_store) if out else set()
        sel = [(g, k, key) for (g, k), key in zip(items, keys) if key in keep]
        if not sel:
            return
        sizes = [sum(1 for g, _, _ in sel if g == grp) for grp in range(self.num_groups)]
        firsts = [next((k for g, k, _ in sel if g == grp), 0) for grp in range(self.num_groups)]
        job = self._new_job("store", rid, [key for _, _, key in sel])
        stores[job] = KvbmTransferJob(rid, GPULoadStoreSpec(
            [self._blocks[rid][g][k] for g, k, _ in sel], group_sizes=sizes,
            block_indices=firsts), out.store_spec)

    def _new_job(self, kind, rid, hashes) -> int:
        job = self._next_job
        self._next_job += 1
        self._jobs[job] = (kind, rid, list(hashes))
        return job

    @staticmethod
    def _scheduled(scheduler_output):
        """(req id, new block ids, num computed) of every scheduled request,
        from vLLM's SchedulerOutput (scheduled_new_reqs, scheduled_cached_reqs)."""
        for r in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            yield r.req_id, True, getattr(r, "block_ids", None), r.num_computed_tokens
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            for i, rid in enumerate(cached.req_ids):
                new = cached.new_block_ids[i] if cached.new_block_ids else None
                yield rid, False, new, cached.num_computed_tokens[i]

    def build_connector_meta(self, scheduler_output) -> KvbmConnectorMetadata:
        self._need(True, "build_connector_meta")
        stores = {}
        for rid, is_new, block_ids, num_computed in self._scheduled(scheduler_output):
            req = self._reqs.get(rid)
            if req is None:
                raise _error(NotFoundError, f"KvbmConnectorV1: {rid} was scheduled but "
                             "update_state_after_alloc never saw it")
            done = min(num_computed + scheduler_output.num_scheduled_tokens[rid], req.num_tokens)
            if self._kinds is not None:
                if block_ids:  # one list per group
                    new = _group_tables(block_ids, self.num_groups, f"{rid}: new block ids")
                    self._blocks[rid] = new if is_new else [
                        old + ids for old, ids in zip(self._blocks[rid], new)]
                self._hybrid_stores(rid, req, done, stores)
                continue
            if block_ids:   # a new request's whole table, a running one's new blocks
                ids = [int(b) for b in (block_ids[0] if isinstance(block_ids, tuple)
                                        else block_ids)]
                self._blocks[rid] = ids if is_new else self._blocks[rid] + ids
            hashes = list(req.block_hashes[:done // self.block_size])
            start = self._next_store.get(rid, 0)
            if len(hashes) <= start:
                continue
            out = self.manager.prepare_store(hashes[start:])
            if out is None:
                continue
            self._next_store[rid] = len(hashes)
            keep = set(out.block_hashes_to_store)
            if not keep:
                continue
            idx = [i for i in range(start, len(hashes)) if hashes[i] in keep]
            job = self._new_job("store", rid, [hashes[i] for i in idx])
            stores[job] = KvbmTransferJob(
                rid, GPULoadStoreSpec([self._blocks[rid][i] for i in idx]), out.store_spec)
        meta = KvbmConnectorMetadata(load_jobs=self._loads, store_jobs=stores)
        self._loads = {}
        return meta

    def update_connector_output(self, connector_output) -> None:
        self._need(True, "update_connector_output")
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if meta is None:
            return
        for job, n in meta.completed.items():
            self._counts[job] += n
        self._failed_jobs.update(meta.failed)
        for job in [j for j, n in self._counts.items() if n >= self.world_size]:
            del self._counts[job]
            kind, _, hashes = self._jobs.pop(job)
            ok = job not in self._failed_jobs
            self._failed_jobs.discard(job)
            if kind == "load":
                self.manager.complete_load(hashes)
            else:
                self.manager.complete_store(hashes, success=ok)

    def request_finished(self, request, block_ids):
        self._need(True, "request_finished")
        rid = request.request_id
        for d in (self._reqs, self._blocks, self._next_store, self._lookups):
            d.pop(rid, None)
        storing = any(kind == "store" and r == rid for kind, r, _ in self._jobs.values())
        return storing, None

    def take_events(self):
        self._need(True, "take_events")
        yield from self.manager.take_events()

    # -- worker side
    def register_kv_caches(self, kv_caches) -> None:
        self._need(False, "register_kv_caches")
        if self.handler is not None:
            raise _error(StateError, "KvbmConnectorV1: KV caches are registered already")
        (_, _, self.handler), _ = self._spec.get_handlers(kv_caches)

    def _submit(self, job, t: KvbmTransferJob, kind: str) -> None:
        gpu = t.dst_spec if kind == "load" else t.src_spec
        self._job_req[job] = (kind, t.req_id, list(gpu.block_ids))
        if kind == "store":
            self._req_stores[t.req_id].add(job)
        self.handler.transfer_async(job, (t.src_spec, t.dst_spec))

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._need(False, "start_load_kv")
        if self.handler is None:
            raise _error(StateError, "KvbmConnectorV1: start_load_kv before register_kv_caches")
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvbmConnectorMetadata):
            raise _error(StateError, "KvbmConnectorV1: no KvbmConnectorMetadata bound")
        for job, t in self._deferred:
            self._submit(job, t, "store")
        self._deferred = []
        for job, t in meta.load_jobs.items():
            self._submit(job, t, "load")

    def handle_preemptions(self, kv_connector_metadata=None) -> None:
        """vLLM calls this before preempted requests' blocks are reused:
        every store (deferred ones included) and load in flight finishes
        first, so no copy reads or writes a block after it changed hands."""
        self._need(False, "handle_preemptions")
        if self.handler is None:
            return
        for job, t in self._deferred:
            self._submit(job, t, "store")
        self._deferred = []
        self.handler.wait(set(self._job_req))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are asynchronous: a request runs once its load is reported

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return None  # blocks are copied out of the paged cache after the step

    def wait_for_save(self) -> None:
        self._need(False, "wait_for_save")
        meta = self._get_connector_metadata()
        # started at the next step, after sampling (vLLM's OffloadingConnector does the same)
        self._deferred += list(meta.store_jobs.items())

    def get_finished(self, finished_req_ids):
        self._need(False, "get_finished")
        self._finishing.update(finished_req_ids or ())
        recving = set()
        for r in self.handler.get_finished():
            kind, rid, ids = self._job_req.pop(r.job_id)
            self._done_meta.completed[r.job_id] = 1
            if not r.success:
                self._done_meta.failed[r.job_id] = 1
            if kind == "load":
                recving.add(rid)
                if not r.success:
                    self._load_errors.update(ids)
            else:
                self._req_stores[rid].discard(r.job_id)
        pending_deferred = {t.req_id for _, t in self._deferred}
        sending = {rid for rid in self._finishing
                   if not self._req_stores.get(rid) and rid not in pending_deferred}
        self._finishing -= sending
        for rid in sending:
            self._req_stores.pop(rid, None)
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> set:
        out, self._load_errors = self._load_errors, set()
        return out

    def build_connector_worker_meta(self) -> Optional[KvbmWorkerMetadata]:
        if not self._done_meta.completed:
            return None
        out, self._done_meta = self._done_meta, KvbmWorkerMetadata()
        return out

    def shutdown(self) -> None:
        if self.handler is not None:
            self.handler.close()
        if self.manager is not None:
            self.manager.close()
