# SPDX-License-Identifier: Apache-2.0
"""kvbm.sglang: an SGLang HiCache storage backend (L3) over kvbm volumes.

SGLang keeps its KV cache in three levels: the GPU pool, a host pool (L2,
``HostKVCache``) and an optional storage backend (L3, ``HiCacheStorage``)
behind the host pool. SGLang loads a third-party backend by module path and
class name::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvbm",
        "module_path": "kvbm.sglang", "class_name": "KvbmHiCacheStorage",
        "interface_v1": 1, "kvbm_url": "file:///mnt/shared/kv"}'

``KvbmHiCacheStorage`` keeps each page in a ``kvbm.Volume`` (``file://``,
``disk://``, ``redis://``, ``redis+cluster://``), so SGLang servers sharing
one directory, Redis or Redis Cluster share their prefixes. What SGLang's
interface is (names, call order, threads) is written down in
docs/areas/engines.md; this essay says what the backend does with it.

Keys. SGLang names a page by its hash string (SHA-256 hex of the page's
token ids chained on the previous page's hash; ``page_hashes`` below
computes the same chain). Like SGLang's own backends the backend adds a
per-rank suffix (HiCacheFile's ``_<model>_<tp_rank>_<tp_size>``, plus
``_<pp_size>_<pp_rank>`` under pipeline parallelism and
``_cp<rank>_<size>`` under context parallelism; the TP part is left out
for MLA models, whose pages every rank holds whole), a tag of the host
pool's layout (the byte order of a stored page is the layout's, so two
layouts never read each other's pages), and for the zero-copy calls
Mooncake's ``_k`` / ``_v`` component suffix (one value per page and
component). The full string is hashed (BLAKE3-128): 64 bits are the
volume key, the other 64 bits a check stored inside the value, so two
names whose 64-bit keys collide are told apart on read.

Values. file:// and redis:// keep opaque bytes; only disk:// checks its own
slots. Every value is therefore an MRDN v1 frame (``Volume.put(...,
framed=True)``): BLAKE3-128 of a body holding the check and the page
bytes. A read verifies the frame, the check and the exact length before a
byte reaches the host pool; anything else under a key (another version's
page, a truncated file, bytes overwritten by hand) is a miss, counted in
``get_stats()``, and its destination is left as it was.

Zero copy. ``batch_get_v1`` / ``batch_set_v1`` (SGLang calls them when the
extra config sets ``interface_v1``) take the host pool's page pointers
(``get_page_buffer_meta``) and hand the pages to the volume as buffers
over that memory: no tensor, bytes object or Python copy is made; the
bytes pass once through the frame check's scratch in C, with the GIL
released. Every pointer is checked to lie inside the registered pool
first, so a bad host index is an error, never a write elsewhere. The plain
calls (``get`` / ``set`` / ``batch_get`` / ``batch_set``) move one flat
tensor per page, as SGLang's generic path does.

Processes. SGLang builds one backend per TP rank, in that rank's
scheduler process, and calls it from two threads (prefetch and backup);
ranks agree on hits through SGLang's own all-reduce, never through this
backend. A Volume takes batches from several threads at once.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import kvbm

logger = logging.getLogger(__name__)

try:  # SGLang's real interface when it is installed
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    HAVE_SGLANG = True
except ImportError:  # a stand-in with the same names and signatures
    HAVE_SGLANG = False
    from abc import ABC, abstractmethod

    @dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        """SGLang's storage config (hicache_storage.py), field for field."""

        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """SGLang's HiCacheStorage: the abstract methods and the defaults."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        @abstractmethod
        def get(self, key, target_location=None, target_sizes=None): ...

        @abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None): ...

        @abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool: ...

        @abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool: ...

        @abstractmethod
        def exists(self, key) -> bool: ...

        def batch_exists(self, keys, extra_info=None) -> int:
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


__all__ = [
    "KvbmHiCacheStorage",
    "HiCacheStorage",
    "HiCacheStorageConfig",
    "HiCacheStorageExtraInfo",
    "HostPoolStandIn",
    "page_hashes",
    "HAVE_SGLANG",
]

_LAYOUT_TAGS = {"layer_first": "lf", "page_first": "pf", "page_first_direct": "pfd",
                "page_head": "ph"}
_MAX_KEY_CHARS = 4096
_MAX_TRACKED = 1 << 20


def page_hashes(token_ids: Sequence[int], page_size: int,
                prior_hash: Optional[str] = None) -> List[str]:
    """SGLang's page hash chain: for each full page, SHA-256 over the
    previous page's digest (bytes.fromhex of its hex) and the page's token
    ids as 4-byte little-endian unsigned ints; returns the hex digests."""
    if page_size <= 0:
        raise kvbm.InvalidArgumentError(f"page_size: {page_size} is not positive")
    out: List[str] = []
    last = prior_hash
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        h = hashlib.sha256()
        if last:
            h.update(bytes.fromhex(last))
        for t in token_ids[start:start + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        last = h.hexdigest()
        out.append(last)
    return out


def _key_and_check(name: str) -> Tuple[int, int]:
    d = kvbm.blake3(name.encode(), length=16)
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


def _torch():
    import torch  # deferred: the package imports without torch
    return torch


def _tensor_buffer(t, what: str, writable: bool):
    """A uint8 numpy view of a CPU tensor's bytes (no copy)."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise kvbm.InvalidArgumentError(f"{what}: a tensor on {t.device}; the host pool is on the CPU")
    if not t.is_contiguous():
        raise kvbm.InvalidArgumentError(f"{what}: not contiguous")
    if t.numel() == 0:
        raise kvbm.InvalidArgumentError(f"{what}: empty")
    return t.reshape(-1).view(torch.uint8).numpy()


class _Stats:
    """What get_stats() returns: SGLang's StorageMetrics lists when SGLang is
    installed (prefetch_pgs, backup_pgs, *_bandwidth), plus kvbm's counters."""

    def __init__(self, counters: dict):
        self.prefetch_pgs: List[int] = []
        self.backup_pgs: List[int] = []
        self.prefetch_bandwidth: List[float] = []
        self.backup_bandwidth: List[float] = []
        self.kvbm = counters

    def __repr__(self):
        return f"KvbmStorageStats({self.kvbm})"


class KvbmHiCacheStorage(HiCacheStorage):
    """HiCacheStorage over a kvbm.Volume; see the module's docstring.

    Built by SGLang as ``KvbmHiCacheStorage(storage_config, kwargs)``;
    ``storage_config.extra_config`` carries SGLang's keys (backend_name,
    module_path, class_name, interface_v1) and kvbm's:

    - ``kvbm_url`` (required): the volume's URL; ``{tp_rank}``, ``{pp_rank}``
      and ``{dp_rank}`` in it are replaced by this rank's (a disk:// slot
      file belongs to one process: give each rank its own folder).
    - ``kvbm_namespace``: the volume's key namespace (default "sglang").
    - ``kvbm_timeout_ms``, ``kvbm_threads``, ``kvbm_max_value_bytes``,
      ``kvbm_hash_threads``: the Volume's settings of those names (the last:
      workers hashing frames besides the calling thread, default 0).
    - ``kvbm_disk_slots``: disk:// only, how many pages' slots (default 4096).
    - ``kvbm_disk_persist``: disk:// only, keep the slot file (warm restart).
    """

    def __init__(self, storage_config: Optional[HiCacheStorageConfig] = None,
                 kwargs: Optional[dict] = None, **more: Any):
        if storage_config is None:
            raise kvbm.InvalidArgumentError("storage_config: required (SGLang's HiCacheStorageConfig)")
        extra = dict(storage_config.extra_config or {})
        extra.update(more)
        url = extra.get("kvbm_url")
        if not isinstance(url, str) or not url:
            raise kvbm.InvalidArgumentError(
                "extra_config: 'kvbm_url' (the volume's URL, e.g. file:///mnt/kv) is required")
        for field in ("tp_rank", "pp_rank", "dp_rank"):  # a folder per rank for disk://
            url = url.replace("{%s}" % field, str(getattr(storage_config, field, 0)))
        if getattr(storage_config, "should_split_heads", False):  # older SGLang: no field
            raise kvbm.UnsupportedError(
                "storage_config.should_split_heads: tp_lcm_size head splitting is not supported")
        self.config = storage_config
        self.url = url
        self.zero_copy = bool(extra.get("interface_v1", 0))
        self.is_mla = bool(storage_config.is_mla_model)
        self._extra = extra
        self._suffix = self._rank_suffix(storage_config)
        self._lock = threading.Lock()
        self._counters = dict(pages_stored=0, pages_loaded=0, page_misses=0, store_failures=0,
                              pages_already_stored=0)
        self._tracked: set = set()
        self._layout_tag = ""
        self.mem_pool_host = None
        self.volume: Optional[kvbm.Volume] = None
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        if not url.startswith("disk:"):  # disk:// needs the page size: opened at register
            self.volume = self._open(0)

    # ---------------------------------------------------------- setup

    @staticmethod
    def _rank_suffix(c) -> str:
        model = "-".join((c.model_name or "").split("/"))
        s = f"_{model}"
        if not c.is_mla_model:
            s += f"_{c.tp_rank}_{c.tp_size}"
        if c.pp_size > 1:
            s += f"_{c.pp_size}_{c.pp_rank}"
        if getattr(c, "attn_cp_size", 1) > 1:
            s += f"_cp{c.attn_cp_rank}_{c.attn_cp_size}"
        return s

    def _open(self, block_bytes: int) -> kvbm.Volume:
        e = self._extra
        opts = dict(namespace=str(e.get("kvbm_namespace", "sglang")))
        for k in ("timeout_ms", "threads", "max_value_bytes", "hash_threads"):
            if e.get("kvbm_" + k) is not None:
                opts[k] = int(e["kvbm_" + k])
        if self.url.startswith("disk:"):
            path = self.url[len("disk://"):].split("?")[0]
            if path:  # like HiCacheFile, the backend makes its folder
                os.makedirs(path, exist_ok=True)
            opts.update(slots=int(e.get("kvbm_disk_slots", 4096)), block_bytes=block_bytes,
                        persist=bool(e.get("kvbm_disk_persist", False)))
            opts.setdefault("max_value_bytes", max(block_bytes, 64 << 20))
        return kvbm.Volume(self.url, **opts)

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        layout = getattr(mem_pool_host, "layout", None)
        if layout not in _LAYOUT_TAGS:
            raise kvbm.UnsupportedError(f"mem_pool_host.layout: {layout!r} is not one of "
                                        f"{sorted(_LAYOUT_TAGS)}")
        self._layout_tag = "_" + _LAYOUT_TAGS[layout]
        self.page_size = int(mem_pool_host.page_size)
        page = mem_pool_host.get_dummy_flat_data_page()
        self.page_bytes = page.numel() * page.element_size()
        buf = getattr(mem_pool_host, "kv_buffer", None)
        self._region = (buf.data_ptr(), buf.numel() * buf.element_size()) if buf is not None else None
        if self.volume is None:  # framed: 40 bytes over the page
            self.volume = self._open(self.page_bytes + 40)

    def close(self) -> None:
        if self.volume is not None:
            self.volume.close()

    # ------------------------------------------------------------ keys

    def _name(self, key: str, component: str = "") -> str:
        if not isinstance(key, str):
            raise TypeError(f"key: expected a str (SGLang's page hash), got {type(key).__name__}")
        if len(key) > _MAX_KEY_CHARS:
            raise kvbm.InvalidArgumentError(
                f"key: {len(key)} characters, above {_MAX_KEY_CHARS} (SGLang's are 64)")
        return f"{key}{self._suffix}{self._layout_tag}{component}"

    def _components(self) -> Tuple[str, ...]:
        return ("_k",) if self.is_mla else ("_k", "_v")

    def _keys(self, names: Sequence[str]) -> Tuple[List[int], List[int]]:
        kc = [_key_and_check(n) for n in names]
        return [k for k, _ in kc], [c for _, c in kc]

    def _vol(self) -> kvbm.Volume:
        if self.volume is None:
            raise kvbm.StateError("KvbmHiCacheStorage: disk:// opens at register_mem_pool_host; "
                                  "register the host pool first")
        return self.volume

    def _track(self, keys: Sequence[int]) -> None:
        if len(self._tracked) < _MAX_TRACKED:
            self._tracked.update(keys)

    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                self._counters[k] += v

    # ----------------------------------------------------- zero copy

    def _page_segments(self, keys: List[str], host_indices) -> List[List[List[Tuple[int, int]]]]:
        """Per page, per component, the (pointer, size) segments of the host
        pool's memory (get_page_buffer_meta), each checked against the pool."""
        pool = self.mem_pool_host
        if pool is None:
            raise kvbm.StateError("KvbmHiCacheStorage: no host pool registered")
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != len(keys) * self.page_size:
            raise kvbm.InvalidArgumentError(
                f"host_indices: {len(idx)} indices for {len(keys)} pages of {self.page_size} tokens")
        size = getattr(pool, "size", None)
        for p in range(len(keys)):
            first = idx[p * self.page_size]
            if first < 0 or (size is not None and first + self.page_size > size):
                raise kvbm.RangeError(f"host_indices[{p * self.page_size}]: page at {first} "
                                      f"is outside the host pool ({size} tokens)")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(sizes) or len(ptrs) % max(len(keys), 1):
            raise kvbm.FormatError(f"get_page_buffer_meta: {len(ptrs)} pointers and {len(sizes)} "
                                   f"sizes for {len(keys)} pages")
        per_page = len(ptrs) // max(len(keys), 1)
        ncomp = len(self._components())
        if per_page % ncomp:
            raise kvbm.FormatError(f"get_page_buffer_meta: {per_page} pointers per page for "
                                   f"{ncomp} components")
        lo, n = self._region if self._region else (None, None)
        out = []
        for p in range(len(keys)):
            seg = list(zip(ptrs[p * per_page:(p + 1) * per_page], sizes[p * per_page:(p + 1) * per_page]))
            for ptr, sz in seg:
                if lo is not None and not (lo <= ptr and ptr + sz <= lo + n):
                    raise kvbm.RangeError(f"page {p}: a pointer outside the host pool's buffer")
            # MHA alternates k, v (per layer in layer_first); MLA has one component
            out.append([seg[c::ncomp] for c in range(ncomp)])
        return out

    @staticmethod
    def _view(ptr: int, size: int):
        return (ctypes.c_ubyte * size).from_address(ptr)

    def _component_buffers(self, segs):
        """A buffer per component: the pool's memory itself when the
        component is one segment, else a scratch bytearray (gathered or
        scattered by the caller)."""
        if len(segs) == 1:
            return self._view(*segs[0]), None
        scratch = bytearray(sum(s for _, s in segs))
        return scratch, segs

    def _page_keys(self, keys: List[str], host_indices):
        """The zero-copy calls' common start: each page's memory segments, the
        components a page has (k and v, or one), and the volume keys and
        checks of every (page, component) in that order."""
        pages = self._page_segments(keys, host_indices)
        comps = self._components()
        vkeys, checks = self._keys([self._name(k, c) for k in keys for c in comps])
        return pages, comps, vkeys, checks

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        if not keys:
            return []
        pages, comps, vkeys, checks = self._page_keys(keys, host_indices)
        bufs, scatter = [], []
        for page in pages:
            for segs in page:
                b, s = self._component_buffers(segs)
                bufs.append(b)
                scatter.append(s)
        res = self._vol().get_into(vkeys, bufs, framed=True, checks=checks)
        ok = []
        nc = len(comps)
        for p in range(len(keys)):
            good = all(r >= 0 for r in res[p * nc:(p + 1) * nc])
            if good:
                for j in range(p * nc, (p + 1) * nc):
                    if scatter[j]:
                        self._scatter(bufs[j], scatter[j])
            ok.append(good)
        hits = sum(ok)
        self._count(pages_loaded=hits, page_misses=len(keys) - hits)
        if self._metrics:
            self._prefetch_pgs.append(hits)
        return ok

    @staticmethod
    def _scatter(scratch: bytearray, segs) -> None:
        src = (ctypes.c_ubyte * len(scratch)).from_buffer(scratch)
        off = 0
        for ptr, sz in segs:
            ctypes.memmove(ptr, ctypes.addressof(src) + off, sz)
            off += sz

    @staticmethod
    def _gather(scratch: bytearray, segs) -> None:
        dst = (ctypes.c_ubyte * len(scratch)).from_buffer(scratch)
        off = 0
        for ptr, sz in segs:
            ctypes.memmove(ctypes.addressof(dst) + off, ptr, sz)
            off += sz

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        if not keys:
            return []
        pages, comps, vkeys, checks = self._page_keys(keys, host_indices)
        vol = self._vol()
        there = vol.exists(vkeys)  # content-named pages: what is stored stays
        todo = [i for i, e in enumerate(there) if not e]
        wanted = set(todo)
        bufs = {}
        for p, page in enumerate(pages):
            for c, segs in enumerate(page):
                i = p * len(comps) + c
                if i in wanted:
                    b, s = self._component_buffers(segs)
                    if s:
                        self._gather(b, s)
                    bufs[i] = b
        res = [0] * len(vkeys)
        if todo:
            st = vol.put([vkeys[i] for i in todo], [bufs[i] for i in todo], framed=True,
                         checks=[checks[i] for i in todo])
            for i, r in zip(todo, st):
                res[i] = r
            self._track(vkeys[i] for i, r in zip(todo, st) if r == 0)
        nc = len(comps)
        ok = [all(r == 0 for r in res[p * nc:(p + 1) * nc]) for p in range(len(keys))]
        stored = sum(ok)
        self._count(pages_stored=stored, store_failures=len(keys) - stored,
                    pages_already_stored=sum(1 for p in range(len(keys))
                                             if all(there[p * nc:(p + 1) * nc])))
        if self._metrics:
            self._backup_pgs.append(stored)
        return ok

    # --------------------------------------------------------- plain

    def _target(self, target_location):
        if target_location is not None:
            return target_location
        if self.mem_pool_host is None:
            raise kvbm.StateError("get: no target_location and no host pool to size a page")
        return self.mem_pool_host.get_dummy_flat_data_page()

    def get(self, key: str, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None):
        if not keys:
            return []
        targets = [self._target(t) for t in (target_locations or [None] * len(keys))]
        if len(targets) != len(keys):
            raise kvbm.InvalidArgumentError(
                f"target_locations: {len(targets)} targets for {len(keys)} keys")
        bufs = [_tensor_buffer(t, f"target_locations[{i}]", True) for i, t in enumerate(targets)]
        vkeys, checks = self._keys([self._name(k) for k in keys])
        res = self._vol().get_into(vkeys, bufs, framed=True, checks=checks)
        out = [t if r >= 0 else None for t, r in zip(targets, res)]
        hits = sum(r >= 0 for r in res)
        self._count(pages_loaded=hits, page_misses=len(keys) - hits)
        return out

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values=None, target_locations=None,
                  target_sizes=None) -> bool:
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            raise kvbm.InvalidArgumentError(
                f"values: {0 if values is None else len(values)} values for {len(keys)} keys")
        bufs = [_tensor_buffer(v, f"values[{i}]", False) for i, v in enumerate(values)]
        vkeys, checks = self._keys([self._name(k) for k in keys])
        vol = self._vol()
        there = vol.exists(vkeys)
        todo = [i for i, e in enumerate(there) if not e]
        ok = True
        if todo:
            st = vol.put([vkeys[i] for i in todo], [bufs[i] for i in todo], framed=True,
                         checks=[checks[i] for i in todo])
            ok = all(r == 0 for r in st)
            good = sum(r == 0 for r in st)
            self._track(vkeys[i] for i, r in zip(todo, st) if r == 0)
            self._count(pages_stored=good, store_failures=len(todo) - good)
        self._count(pages_already_stored=len(keys) - len(todo))
        return ok

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        if not keys:
            return 0
        comps = self._components() if self.zero_copy else ("",)
        vkeys, _ = self._keys([self._name(k, c) for k in keys for c in comps])
        there = self._vol().exists(vkeys)
        nc = len(comps)
        for p in range(len(keys)):
            if not all(there[p * nc:(p + 1) * nc]):
                return p
        return len(keys)

    # -------------------------------------------------------- admin

    def clear(self) -> None:
        """Deletes the pages this backend stored (the volumes file:// and
        redis:// cannot be listed; pages other servers stored stay)."""
        keys = list(self._tracked)
        for i in range(0, len(keys), 4096):
            self._vol().delete(keys[i:i + 4096])
        self._tracked.clear()

    def counters(self) -> dict:
        """kvbm's counters: pages stored/loaded, misses, and the volume's
        own (frames_corrupt, frames_wrong_size, frames_foreign: values that
        failed their check and were counted as misses)."""
        with self._lock:
            c = dict(self._counters)
        if self.volume is not None:
            c.update({f"volume_{k}": v for k, v in self.volume.stats().items()})
            c["verify_failures"] = (c["volume_frames_corrupt"] + c["volume_frames_wrong_size"]
                                    + c["volume_frames_foreign"] + c["volume_corrupt"])
        return c

    def get_stats(self):
        """SGLang's StorageMetrics (when SGLang is installed) with the pages
        of each prefetch/backup batch since the last call, and kvbm's
        counters as attribute ``kvbm``."""
        stats = _Stats(self.counters())
        if HAVE_SGLANG:
            try:
                from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
                m = StorageMetrics()
                m.kvbm = stats.kvbm
                stats = m
            except ImportError:
                pass
        stats.prefetch_pgs.extend(self._prefetch_pgs)
        stats.backup_pgs.extend(self._backup_pgs)
        self._prefetch_pgs.clear()
        self._backup_pgs.clear()
        return stats


class HostPoolStandIn:
    """The storage-facing part of SGLang's MHATokenToKVPoolHost, for use
    without SGLang (tests, examples): ``kv_buffer`` in SGLang's layouts,
    ``page_size``, ``size``, ``layout``, ``dtype``, ``get_page_buffer_meta``,
    ``get_data_page``, ``get_dummy_flat_data_page``,
    ``set_from_flat_data_page``, ``alloc``. Shapes (SGLang's):

    - layer_first:       (2, layers, size, heads, head_dim)
    - page_first:        (2, size, layers, heads, head_dim)
    - page_first_direct: (2, pages, layers, page_size, heads, head_dim)
    """

    def __init__(self, *, layers: int, heads: int, head_dim: int, page_size: int, pages: int,
                 layout: str = "page_first", dtype=None):
        torch = _torch()
        self.layer_num, self.head_num, self.head_dim = layers, heads, head_dim
        self.page_size, self.page_num = page_size, pages
        self.size = pages * page_size
        self.layout = layout
        self.dtype = dtype or torch.bfloat16
        if layout == "layer_first":
            dims = (2, layers, self.size, heads, head_dim)
        elif layout == "page_first":
            dims = (2, self.size, layers, heads, head_dim)
        elif layout == "page_first_direct":
            dims = (2, pages, layers, page_size, heads, head_dim)
        else:
            raise kvbm.UnsupportedError(f"layout: {layout!r}")
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)
        self._next = 0

    def alloc(self, need: int):
        torch = _torch()
        if need % self.page_size or self._next + need > self.size:
            return None
        idx = torch.arange(self._next, self._next + need, dtype=torch.int64)
        self._next += need
        return idx

    def _item(self) -> int:
        return self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        base, it = self.kv_buffer.data_ptr(), self._item()
        hd = self.head_num * self.head_dim * it
        v_off = self.layer_num * self.size * hd
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + idx[i] * hd + layer * self.size * hd
                    ptrs += [k, k + v_off]
            size = self.page_size * hd
        else:
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * hd
                ptrs += [k, k + v_off]
            size = self.layer_num * self.page_size * hd
        return ptrs, [size] * len(ptrs)

    def get_data_page(self, index: int, flat: bool = True):
        ps = self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + ps]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + ps]
        else:
            page = self.kv_buffer[:, index // ps:index // ps + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        torch = _torch()
        return torch.zeros(2 * self.layer_num * self.page_size * self.head_num * self.head_dim,
                           dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        page = self.get_data_page(index, flat=False)
        page.copy_(data_page.reshape(page.shape))
