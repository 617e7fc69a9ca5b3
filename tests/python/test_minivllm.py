# SPDX-License-Identifier: Apache-2.0
"""kvbm.minivllm: nano-vllm shaped Sequence and BlockManager over kvbm.Pool."""
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import kvbm
from conftest import SHARED, load_trace, output_tokens, prompt_tokens
from kvbm.minivllm import BlockManager, Sequence, SequenceStatus

B = 16


@pytest.fixture(autouse=True)
def block_size():
    old = Sequence.block_size
    Sequence.set_block_size(B)
    yield
    Sequence.block_size = old


def test_w1_in_nano_vllms_shape_equals_the_oracle():
    """allocate, then one may_append per generated token, then deallocate:
    the W1 counts must equal the oracle's (../shared/tools/ref_replay.py)."""
    n, cap = 40, 8192
    bm = BlockManager(cap, B)
    hits = 0
    for r, rec in enumerate(load_trace(n)):
        seq = Sequence(prompt_tokens(rec).tolist())
        assert bm.can_allocate(seq)
        bm.allocate(seq)
        seq.status = SequenceStatus.RUNNING
        hits += seq.num_cached_tokens
        for t in output_tokens(r, rec).tolist():
            seq.append_token(t)
            assert bm.can_append(seq)
            bm.may_append(seq)
            assert len(seq.block_table) == seq.num_blocks
        seq.status = SequenceStatus.FINISHED
        bm.deallocate(seq)
        assert seq.block_table == [] and seq.num_cached_tokens == 0
    oracle = subprocess.run([sys.executable, str(SHARED / "tools" / "ref_replay.py"),
                             str(SHARED / "data" / "mooncake_conversation_trace.jsonl"),
                             "--block-size", str(B), "--capacity", str(cap), "--limit", str(n)],
                            capture_output=True, text=True, check=True)
    want = json.loads(oracle.stdout)
    assert hits == want["hit_tokens"] and hits > 0
    assert bm.pool.stats()["allocated"] == want["blocks_allocated"]


def test_sequence_fields():
    s = Sequence([1, 2, 3] * 7)
    assert s.status is SequenceStatus.WAITING and not s.is_finished
    assert (len(s), s.num_tokens, s.num_prompt_tokens, s.last_token) == (21, 21, 21, 3)
    assert s.num_blocks == 2 and s.last_block_num_tokens == 5
    assert s.tokens_in_block(1) == [2, 3, 1, 2, 3] and s.block(0) == s.token_ids[:16]
    with pytest.raises(IndexError):
        s.tokens_in_block(2)
    s.append_token(9)
    assert s.num_completion_tokens == 1 and s.completion_token_ids == [9] and s.last_token == 9
    assert s.prompt_token_ids == [1, 2, 3] * 7 and s[21] == 9
    assert Sequence([5]).seq_id > s.seq_id
    with pytest.raises(kvbm.InvalidArgumentError):
        Sequence([])


def test_pickle_is_compact_once_decoding_started():
    s = Sequence(list(range(1000)))
    s.block_table = [4, 5]
    s.num_cached_tokens = 16
    p = pickle.loads(pickle.dumps(s))  # prefill: the whole token list travels
    assert p.token_ids == s.token_ids and p.last_token == 999 and p.block_table == [4, 5]
    s.append_token(7)
    s.status = SequenceStatus.RUNNING
    blob = pickle.dumps(s)
    assert len(blob) < 300  # counters and the last token, not 1001 tokens
    d = pickle.loads(blob)
    assert d.token_ids == [] and d.last_token == 7
    assert (d.seq_id, d.status, d.num_tokens, d.num_prompt_tokens, d.num_cached_tokens, d.block_table) == \
        (s.seq_id, SequenceStatus.RUNNING, 1001, 1000, 16, [4, 5])


def test_can_allocate_is_exact():
    bm = BlockManager(6, B)
    a = Sequence(list(range(4 * B + 1)))  # 5 blocks
    bm.allocate(a)
    b = Sequence(list(range(4 * B)) + [77])  # shares a's 4 full blocks: needs 1
    c = Sequence(list(range(1000, 1000 + 2 * B)))  # needs 2, one available
    assert bm.can_allocate(b) and not bm.can_allocate(c)
    with pytest.raises(kvbm.NoSpaceError):
        bm.allocate(c)
    assert c.block_table == [] and bm.num_free_blocks == 1
    bm.allocate(b)
    assert b.num_cached_tokens == 4 * B and b.block_table[:4] == a.block_table[:4]
    with pytest.raises(kvbm.StateError):
        bm.allocate(b)


def test_can_append_and_preemption():
    bm = BlockManager(2, B)
    s = Sequence(list(range(B)))
    bm.allocate(s)
    s.append_token(1)  # opens block 2
    assert bm.can_append(s)
    bm.may_append(s)
    t = Sequence(list(range(500, 500 + 3)))
    assert not bm.can_allocate(t)
    for i in range(B - 1):
        s.append_token(i)
        bm.may_append(s)
    s.append_token(99)  # would need a third block
    assert not bm.can_append(s)
    with pytest.raises(kvbm.NoSpaceError):
        bm.may_append(s)
    bm.deallocate(s)  # preempt, as nano-vllm's scheduler does
    assert bm.num_free_blocks == 2 and s.block_table == []


def test_append_and_fork():
    bm = BlockManager(16, B)
    s = Sequence(list(range(20)))
    bm.allocate(s)
    bm.append(s, 5)
    assert s.num_tokens == 21 and s.token_ids[-1] == 5
    child, cow = bm.fork(s)
    assert child.seq_id != s.seq_id and child.token_ids == s.token_ids
    assert child.token_ids is not s.token_ids and child.block_table is not s.block_table
    assert child.block_table[0] == s.block_table[0]
    assert cow == (s.block_table[1], child.block_table[1])
    bm.append(child, 6)
    assert s.num_tokens == 21 and child.num_tokens == 22
    s.append_token(8)
    with pytest.raises(kvbm.StateError):
        bm.fork(s)
    bm.deallocate(s)
    bm.deallocate(child)
    assert bm.pool.stats()["active"] == 0
    with pytest.raises(kvbm.StateError):
        bm.may_append(s)


def test_block_size_must_match():
    bm = BlockManager(8, 8)
    with pytest.raises(kvbm.InvalidArgumentError):
        bm.can_allocate(Sequence([1, 2, 3]))


def test_a_nano_vllm_scheduler_loop_runs_to_completion():
    """The scheduler of nano-vllm, in miniature: prefill what fits, decode
    the rest one token at a time, preempt when a block is missing."""
    rng = np.random.default_rng(5)
    bm = BlockManager(24, B)
    shared = list(range(3 * B))
    seqs = [Sequence(shared + rng.integers(0, 1000, int(rng.integers(1, 30))).tolist()) for _ in range(12)]
    for s in seqs:
        s.max_tokens = int(rng.integers(1, 40))
    waiting, running = list(seqs), []
    steps = 0
    while waiting or running:
        steps += 1
        assert steps < 10000
        scheduled = []
        while waiting and bm.can_allocate(waiting[0]):
            s = waiting.pop(0)
            bm.allocate(s)
            s.status = SequenceStatus.RUNNING
            running.append(s)
            scheduled.append(s)
        if not scheduled:
            for s in list(running):
                if s not in running:
                    continue
                while not bm.can_append(s):
                    victim = running.pop()
                    victim.status = SequenceStatus.WAITING
                    bm.deallocate(victim)
                    waiting.insert(0, victim)
                    if victim is s:
                        break
                else:
                    bm.may_append(s)
                    scheduled.append(s)
        for s in scheduled:  # "generate" one token each
            s.append_token(int(rng.integers(0, 1000)))
            if s.num_completion_tokens >= s.max_tokens:
                s.status = SequenceStatus.FINISHED
                bm.deallocate(s)
                running.remove(s)
    assert all(s.is_finished for s in seqs)
    assert bm.pool.stats()["active"] == 0
