# SPDX-License-Identifier: Apache-2.0
"""kvbm: a KV-cache block manager for LLM inference (Python binding).

The C library does the work; this package is a thin layer over it:

- hashing: block_hashes, block_hash, salt_hash (native and Dynamo schemes)
- one tier: Pool and Seq (prefix sharing, copy-on-write fork), run_request
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


__all__ = sorted(
    [n for n in dir(_kvbm) if not n.startswith("_")]
    + ["Tier", "Phase", "frame_decode", "__version__"]
)
