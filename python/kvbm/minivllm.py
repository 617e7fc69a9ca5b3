# SPDX-License-Identifier: Apache-2.0
"""nano-vllm / minivllm shaped Sequence and BlockManager over kvbm.

An engine written against nano-vllm's scheduler (``Sequence``,
``SequenceStatus``, ``BlockManager`` with ``can_allocate`` / ``allocate`` /
``deallocate`` / ``can_append`` / ``may_append``) can use these classes as
they are; the block bookkeeping (prefix matching by chained hash, reference
counts, deduplication on register, eviction of cached blocks tail first)
is kvbm's C pool underneath, not Python dictionaries.

Differences worth knowing:

- A block that fills is registered by kvbm; when an equal block is already
  registered the sequence switches to it (deduplication), so an id in
  ``seq.block_table`` can change at ``may_append``. The table is updated in
  place: keep reading it from the sequence.
- ``BlockManager.fork(seq)`` (not in nano-vllm) shares every full block and
  copies the partial tail: it returns the child and the ``(src, dst)``
  blocks whose KV the engine must copy, or None.
- ``BlockManager.append(seq, token_id)`` appends a token to both the
  sequence and its blocks, all or nothing.
"""

from enum import Enum, auto
from itertools import count

from . import _kvbm

__all__ = ["SequenceStatus", "Sequence", "BlockManager"]


def _error(cls, status, code, message):
    e = cls(f"{message} ({status})")
    e.status, e.code, e.message = status, code, message
    return e


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """One request: its tokens, its status and its block table.

    ``block_size`` is a class attribute, as in nano-vllm (``set_block_size``).
    Pickling keeps the compact form nano-vllm sends to its workers: the
    counters, the block table and, once decoding started, only the last
    token instead of the whole token list.
    """

    block_size = 16
    counter = count()

    @classmethod
    def set_block_size(cls, block_size):
        cls.block_size = block_size

    def __init__(self, token_ids, sampling_params=None):
        token_ids = list(token_ids)
        if not token_ids:
            raise _error(_kvbm.InvalidArgumentError, "KVBM_EINVAL", -1,
                         "Sequence: a prompt has at least one token")
        self.seq_id = next(Sequence.counter)
        self.status = SequenceStatus.WAITING
        self.token_ids = token_ids
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0
        self.block_table = []
        self.temperature = getattr(sampling_params, "temperature", 1.0)
        self.max_tokens = getattr(sampling_params, "max_tokens", 64)
        self.ignore_eos = getattr(sampling_params, "ignore_eos", False)

    def __len__(self):
        return self.num_tokens

    def __getitem__(self, key):
        return self.token_ids[key]

    @property
    def is_finished(self):
        return self.status == SequenceStatus.FINISHED

    @property
    def num_completion_tokens(self):
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self):
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def completion_token_ids(self):
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_cached_blocks(self):
        return self.num_cached_tokens // self.block_size

    @property
    def num_blocks(self):
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self):
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def tokens_in_block(self, i):
        """The tokens of block i (the last block may be partial)."""
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i}: the sequence has {self.num_blocks} block(s)")
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    block = tokens_in_block  # nano-vllm's name

    def append_token(self, token_id):
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def __getstate__(self):
        decoding = self.num_tokens > self.num_prompt_tokens
        return (self.seq_id, self.status, self.num_tokens, self.num_prompt_tokens,
                self.num_cached_tokens, self.block_table,
                self.last_token if decoding else self.token_ids)

    def __setstate__(self, state):
        (self.seq_id, self.status, self.num_tokens, self.num_prompt_tokens,
         self.num_cached_tokens, self.block_table, last) = state
        if isinstance(last, list):
            self.token_ids = last
            self.last_token = last[-1]
        else:
            self.token_ids = []
            self.last_token = last

    def __repr__(self):
        return (f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
                f"num_tokens={self.num_tokens}, num_cached_tokens={self.num_cached_tokens}, "
                f"block_table={self.block_table})")


class BlockManager:
    """nano-vllm's BlockManager over a kvbm.Pool of ``num_blocks`` blocks.

    ``can_allocate`` is exact (kvbm.Pool.blocks_needed: the prefix that would
    be shared is not counted unless it sits in the cache), and ``allocate``
    raises kvbm.NoSpaceError, with nothing changed, when it is False.
    """

    def __init__(self, num_blocks, block_size, *, scheme="native", salt_hash=0):
        self.block_size = block_size
        self.salt_hash = salt_hash
        self.pool = _kvbm.Pool(num_blocks, block_size, scheme=scheme)
        self._seqs = {}  # seq_id -> kvbm.Seq

    @property
    def num_free_blocks(self):
        """Blocks an allocation could take now (free + cached)."""
        return self.pool.available

    def _check(self, seq):
        if seq.block_size != self.block_size:
            raise _error(_kvbm.InvalidArgumentError, "KVBM_EINVAL", -1,
                         f"Sequence.block_size is {seq.block_size}, the BlockManager's "
                         f"{self.block_size}")

    def _kseq(self, seq):
        ks = self._seqs.get(seq.seq_id)
        if ks is None:
            raise _error(_kvbm.StateError, "KVBM_ESTATE", -4,
                         f"sequence {seq.seq_id} has no blocks (allocate it first)")
        return ks

    def can_allocate(self, seq):
        self._check(seq)
        return self.pool.blocks_needed(seq.token_ids, self.salt_hash) <= self.pool.available

    def allocate(self, seq):
        self._check(seq)
        if seq.block_table or seq.seq_id in self._seqs:
            raise _error(_kvbm.StateError, "KVBM_ESTATE", -4,
                         f"sequence {seq.seq_id} already has blocks")
        ks = self.pool.sequence(salt_hash=self.salt_hash)
        try:
            seq.num_cached_tokens = ks.prefill(seq.token_ids)
        except BaseException:
            ks.destroy()
            raise
        seq.block_table[:] = ks.block_table
        self._seqs[seq.seq_id] = ks

    def deallocate(self, seq):
        ks = self._seqs.pop(seq.seq_id, None)
        if ks is not None:
            ks.destroy()
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def _pending(self, seq, ks):
        seen = ks.num_tokens
        if seq.num_tokens < seen or len(seq.token_ids) != seq.num_tokens:
            raise _error(_kvbm.StateError, "KVBM_ESTATE", -4,
                         f"sequence {seq.seq_id}: its tokens do not extend the "
                         f"{seen} the manager has")
        return seq.token_ids[seen:]

    def can_append(self, seq):
        ks = self._kseq(seq)
        b = self.block_size
        need = -(-seq.num_tokens // b) - -(-ks.num_tokens // b)
        return self.pool.available >= need

    def may_append(self, seq):
        """Gives the manager the tokens the sequence gained since (a block
        that opens is allocated, one that fills is registered)."""
        ks = self._kseq(seq)
        new = self._pending(seq, ks)
        if new:
            ks.append(new)
            seq.block_table[:] = ks.block_table

    def append(self, seq, token_id):
        """append_token and may_append at once, all or nothing."""
        ks = self._kseq(seq)
        if self._pending(seq, ks):
            self.may_append(seq)
        ks.append([token_id])
        seq.append_token(token_id)
        seq.block_table[:] = ks.block_table

    def fork(self, seq):
        """Returns (child, cow): a new Sequence with the same tokens, sharing
        every full block; cow is (src, dst) when the partial tail block was
        copied (the engine copies its KV from src to dst), else None."""
        ks = self._kseq(seq)
        if self._pending(seq, ks):
            raise _error(_kvbm.StateError, "KVBM_ESTATE", -4,
                         f"sequence {seq.seq_id} has tokens the manager has not seen; "
                         "call may_append first")
        kc = ks.fork()
        child = Sequence.__new__(Sequence)
        child.__dict__.update(seq.__dict__)
        child.seq_id = next(Sequence.counter)
        child.token_ids = list(seq.token_ids)
        child.block_table = kc.block_table
        self._seqs[child.seq_id] = kc
        return child, kc.cow
