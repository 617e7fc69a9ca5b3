# SPDX-License-Identifier: Apache-2.0
"""kvbm: a KV-cache block manager for LLM inference (Python binding).

The C library does the work; this package is a thin layer over it:

- hashing: block_hashes, block_hash, salt_hash (native and Dynamo schemes)
- one tier: Pool and Seq (prefix sharing, copy-on-write fork), run_request
- hybrid models: Pool(groups=...), HybridSequence (a block table per KV
  cache group), groups_from_vllm (vLLM's KVCacheConfig onto a group list)
- nano-vllm shaped classes: kvbm.minivllm.Sequence, BlockManager
- tiers: Manager and Request (G1/G2/G3, onboarding, offload), block memory as
  buffers numpy and torch view without a copy
- events: KvEventPublisher (Dynamo's shape), Subscriber (vLLM's wire)
- router: Index (overlap scores per worker and tier)
- volumes: Volume (disk://, file://, redis://, redis+cluster:// stores by key);
  kvbm.sglang, an SGLang HiCache storage backend over them
- transfer: BLAKE3 (blake3, Blake3), MRDN frames (frame_encode, frame_decode)

Errors derive from kvbm.Error, which carries .status, .code and .message.
Wrong Python types raise TypeError.
"""

from enum import IntEnum as _IntEnum

from . import _kvbm
from ._kvbm import *  # noqa: F401,F403  (the extension's names, listed below)
from ._kvbm import __version__  # noqa: F401


class Tier(_IntEnum):
    """Where a block lives: G1 device (the engine's), G2 host, G3 disk, G4 remote."""

    G1 = 0
    G2 = 1
    G3 = 2
    G4 = 3


class Phase(_IntEnum):
    """A frame's phase label (ADR-0006): how soon the receiver needs the block.

    THINK_COMPLETE: reasoning that has ended (cold); THINK_ACTIVE: reasoning
    still going on; OUTPUT_CRITICAL: output, needed at every next step.
    """

    THINK_COMPLETE = 0
    THINK_ACTIVE = 1
    OUTPUT_CRITICAL = 2


def frame_decode(buf, *, max_body=None):
    """frame_decode(buf, *, max_body=64 MiB) -> (Phase, bytes)

    Validates a whole MRDN v1 frame (header, length, BLAKE3 checksum) and
    returns its phase label and a copy of its body. Raises the kvbm.Error
    subclass of the first check that fails (MagicError, VersionError,
    PaddingError, PhaseError, TooLongError, TruncatedError, ChecksumError).
    """
    phase, body = (_kvbm.frame_decode(buf) if max_body is None
                   else _kvbm.frame_decode(buf, max_body=max_body))
    return Phase(phase), body


# vLLM's KVCacheSpec classes (vllm/v1/kv_cache_interface.py), most derived
# first: a class is known by its name or a base's, so vLLM need not be
# imported. FullAttentionSpec covers MLAAttentionSpec, SinkFullAttentionSpec
# and TQFullAttentionSpec (subclasses), and a FullAttentionSpec that records a
# sliding_window or attention_chunk_size: vLLM makes those only with the
# hybrid allocator off, and then allocates every token's block (full).
_VLLM_SPECS = ("SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MambaSpec",
               "UniformTypeKVCacheSpecs", "FullAttentionSpec")


def _vllm_group(spec, where):
    names = [c.__name__ for c in type(spec).__mro__]
    kind = next((k for k in _VLLM_SPECS if k in names), None)
    if kind == "SlidingWindowSpec":
        return ("sw", getattr(spec, "sliding_window", None))
    if kind == "ChunkedLocalAttentionSpec":
        return ("chunk", getattr(spec, "attention_chunk_size", None))
    if kind == "MambaSpec":
        mode = getattr(spec, "mamba_cache_mode", None)
        if mode == "all":
            return ("mamba", None)
        if mode == "align":
            return ("mamba-align", None)
        raise InvalidArgumentError(
            "groups_from_vllm: %s: MambaSpec with mamba_cache_mode %r: no prefix "
            "caching to manage (kvbm knows 'all' and 'align')" % (where, mode))
    if kind == "UniformTypeKVCacheSpecs":
        specs = list(getattr(spec, "kv_cache_specs", {}).values())
        if not specs:
            raise InvalidArgumentError("groups_from_vllm: %s: UniformTypeKVCacheSpecs "
                                       "without kv_cache_specs" % where)
        return _vllm_group(specs[0], where)  # uniform: every layer the same type
    if kind == "FullAttentionSpec":
        return ("full", None)
    raise InvalidArgumentError(
        "groups_from_vllm: %s: %s is not a prefix-cached KV cache spec kvbm knows "
        "(FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)"
        % (where, type(spec).__name__))


def groups_from_vllm(kv_cache_config):
    """groups_from_vllm(kv_cache_config) -> list[(kind, tokens)]

    vLLM's KVCacheConfig (or its kv_cache_groups list) as the group list of
    Pool(groups=...): group i is kv_cache_groups[i], each KVCacheGroupSpec's
    kv_cache_spec mapped by class (duck-typed by name, no vLLM import):
    FullAttentionSpec -> ('full', None), SlidingWindowSpec(sliding_window=W)
    -> ('sw', W), ChunkedLocalAttentionSpec(attention_chunk_size=C) ->
    ('chunk', C), MambaSpec(mamba_cache_mode='all' / 'align') -> ('mamba',
    None) / ('mamba-align', None). Raises InvalidArgumentError naming the
    group for anything else (cross attention, encoder-only, Mamba without
    prefix caching). Pool checks the windows and chunks.
    """
    groups = getattr(kv_cache_config, "kv_cache_groups", kv_cache_config)
    try:
        groups = list(groups)
    except TypeError:
        raise InvalidArgumentError("groups_from_vllm: %s has no kv_cache_groups"
                                   % type(kv_cache_config).__name__) from None
    if not groups:
        raise InvalidArgumentError("groups_from_vllm: no kv_cache_groups")
    out = []
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        if spec is None:
            raise InvalidArgumentError("groups_from_vllm: kv_cache_groups[%d] has no "
                                       "kv_cache_spec" % i)
        out.append(_vllm_group(spec, "kv_cache_groups[%d]" % i))
    return out


__all__ = sorted(
    [n for n in dir(_kvbm) if not n.startswith("_")]
    + ["Tier", "Phase", "frame_decode", "groups_from_vllm", "__version__"]
)
