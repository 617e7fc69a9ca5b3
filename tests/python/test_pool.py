# SPDX-License-Identifier: Apache-2.0
"""kvbm.Pool and kvbm.Seq: one tier's blocks through the binding."""
import json
import subprocess
import threading

import numpy as np
import pytest

import kvbm
from conftest import TRACE, load_trace, output_tokens, prompt_tokens

B = 16


def toks(start, n):
    return np.arange(start, start + n, dtype=np.uint32)


def test_w1_through_run_request_equals_the_c_replay(kvbm_bin):
    n, cap = 300, 8192
    pool = kvbm.Pool(cap, B)
    hits = prompt = 0
    for r, rec in enumerate(load_trace(n)):
        hits += pool.run_request(prompt_tokens(rec), output_tokens(r, rec))
        prompt += rec["input_length"]
    out = subprocess.run([kvbm_bin, "replay", str(TRACE), "--limit", str(n), "--capacity", str(cap),
                          "--json", "--no-progress"], capture_output=True, text=True, check=True)
    c = json.loads(out.stdout)
    assert (hits, prompt, pool.stats()["allocated"]) == (c["hit_tokens"], c["prompt_tokens"],
                                                          c["blocks_allocated"])
    assert hits > 0


def test_prefix_sharing_and_the_last_token_rule():
    with kvbm.Pool(64, B) as pool:
        a = pool.sequence()
        assert a.prefill(toks(0, 40)) == 0
        b = pool.sequence()
        assert b.prefill(toks(0, 40)) == 32
        assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
        c = pool.sequence()
        assert c.prefill(toks(0, 32)) == 16  # the last prompt token is always computed
        assert a.num_tokens == 40 and [a.block_hash(k) for k in range(2)] == kvbm.block_hashes(toks(0, 40), B)
        with pytest.raises(kvbm.RangeError):
            a.block_hash(2)
        with pytest.raises(kvbm.StateError):
            a.prefill(toks(0, 8))
        assert pool.block_info(a.block_table[0])["refcount"] == 3


def test_no_space_changes_nothing():
    pool = kvbm.Pool(4, B)
    s = pool.sequence()
    s.prefill(toks(0, 3 * B))
    before = pool.stats()
    t = pool.sequence()
    with pytest.raises(kvbm.NoSpaceError) as e:
        t.prefill(toks(1000, 2 * B))
    assert e.value.status == "KVBM_ENOSPC"
    assert pool.stats() == before and t.num_tokens == 0
    with pytest.raises(kvbm.NoSpaceError):
        s.append(toks(5000, 2 * B))
    assert pool.stats() == before and s.num_tokens == 3 * B


def test_release_is_tail_first_and_eviction_takes_the_tail():
    pool = kvbm.Pool(4, B)
    s = pool.sequence()
    s.prefill(toks(0, 3 * B + 1))  # 3 full blocks + 1 partial
    h = [s.block_hash(k) for k in range(3)]
    s.destroy()
    assert pool.stats()["cached"] == 3
    t = pool.sequence()
    t.prefill(toks(9000, 2 * B))  # takes the free block, then evicts one cached
    assert [pool.contains(x) for x in h] == [True, True, False]


def test_fork_is_copy_on_write():
    pool = kvbm.Pool(16, B)
    s = pool.sequence()
    s.prefill(toks(0, 2 * B + 5))
    c = s.fork()
    assert s.cow is None and c.cow is not None
    src, dst = c.cow
    assert src == s.block_table[2] and dst == c.block_table[2] and src != dst
    assert c.block_table[:2] == s.block_table[:2] and c.num_tokens == s.num_tokens
    c.append(toks(100, 20))
    assert s.num_tokens == 2 * B + 5 and len(s.block_table) == 3
    s.destroy()
    assert c.num_tokens == 2 * B + 25
    full = pool.sequence()
    full.prefill(toks(0, 2 * B))
    assert full.fork().cow is None


def test_dedup_on_register():
    pool = kvbm.Pool(16, B)
    a, b = pool.sequence(), pool.sequence()
    a.prefill(toks(0, 5))
    b.prefill(toks(0, 5))
    assert a.block_table != b.block_table
    a.append(toks(5, B - 5))
    b.append(toks(5, B - 5))  # fills an equal block: deduplicated onto a's
    assert a.block_table == b.block_table
    assert pool.stats()["dedup"] == 1
    dup = kvbm.Pool(16, B, allow_duplicates=True)
    a, b = dup.sequence(), dup.sequence()
    for s in (a, b):
        s.prefill(toks(0, 5))
        s.append(toks(5, B - 5))
    assert a.block_table != b.block_table  # both stay registered


def test_blocks_needed_predicts_prefill_exactly():
    rng = np.random.default_rng(7)
    pool = kvbm.Pool(40, 8)
    live = []
    prefixes = [rng.integers(0, 1000, 64, dtype=np.uint32) for _ in range(4)]
    for step in range(400):
        if live and rng.random() < 0.45:
            live.pop(int(rng.integers(len(live)))).destroy()
            continue
        p = prefixes[int(rng.integers(4))][: int(rng.integers(1, 64))]
        tail = rng.integers(0, 1000, int(rng.integers(0, 40)), dtype=np.uint32)
        prompt = np.concatenate([p, tail]).astype(np.uint32)
        need, avail = pool.blocks_needed(prompt), pool.available
        before = pool.stats()
        s = pool.sequence()
        try:
            s.prefill(prompt)
            assert need <= avail, step
            assert pool.available == avail - need, step
            live.append(s)
        except kvbm.NoSpaceError:
            assert need > avail, step
            assert pool.stats() == before
            s.destroy()


def test_close_destroys_live_sequences():
    pool = kvbm.Pool(8, B)
    s = pool.sequence()
    s.prefill(toks(0, 20))
    pool.close()
    pool.close()
    assert pool.closed and s.closed
    for call in (lambda: s.append([1]), s.fork, lambda: s.block_table, lambda: pool.sequence(),
                 lambda: pool.run_request([1], [2]), lambda: pool.available):
        with pytest.raises(kvbm.ClosedError):
            call()
    s.destroy()


def test_stats_after_close_are_the_final_counts():
    """What a user reads after close() is the last count, with the live
    sequences' blocks released by the close (issue 24), not an error."""
    pool = kvbm.Pool(8, B)
    s = pool.sequence()
    s.prefill(toks(0, 3 * B + 1))
    assert pool.stats()["active"] == 4
    pool.close()
    st = pool.stats()
    assert st["active"] == 0 and st["cached"] == 3 and st["allocated"] == 4
    assert pool.stats() == st


def test_index_stats_after_close_are_the_final_counts():
    idx = kvbm.Index(B)
    a = toks(0, 4 * B)
    idx.apply(1, [{"type": "BlockStored", "block_hashes": kvbm.block_hashes(a, B),
                   "parent_block_hash": None, "token_ids": a, "block_size": B}])
    before = idx.stats()
    assert before["stored"] == 4 and before["workers"] == 1
    idx.close()
    assert idx.stats() == before
    with pytest.raises(kvbm.ClosedError):
        idx.overlap(a)


def test_a_sequence_keeps_its_pool_alive():
    pool = kvbm.Pool(8, B)
    s = pool.sequence()
    del pool
    s.prefill(toks(0, 20))
    assert len(s.block_table) == 2


def test_hostile_arguments():
    for args in ((0, 16), (8, 0), (8, 70000), (-1, 16), (2**32, 16), (8, -16)):
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.Pool(*args)
    for args in (("8", 16), (8.0, 16), (None, 16)):
        with pytest.raises(TypeError):
            kvbm.Pool(*args)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.Pool(8, 16, scheme="md5")
    with pytest.raises(TypeError):
        kvbm.Seq()
    pool = kvbm.Pool(8, B)
    for bad in (-1, 8, 2**40):
        with pytest.raises((kvbm.RangeError, kvbm.InvalidArgumentError)):
            pool.block_info(bad)
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.sequence(priority=256)
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.sequence(salt_hash=2**64)
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.sequence().prefill([])
    with pytest.raises(TypeError):
        pool.sequence().prefill(np.zeros(4, dtype=np.int64))
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.blocks_needed([])
    for call in (lambda: pool.run_request([1]), lambda: pool.run_request([1], [2], 0, 0),
                 lambda: pool.run_request([1], [2], salt=0), lambda: pool.run_request([1], "ab"),
                 lambda: pool.run_request(None, [2])):
        with pytest.raises(TypeError):
            call()
    assert pool.run_request([], [1, 2]) == 0  # an empty prompt is skipped, as in W1
    assert pool.run_request([1, 2, 3], [], salt_hash=5) == 0
    with pytest.raises(kvbm.NoSpaceError):
        pool.run_request(toks(0, 9 * B), [])
    assert pool.stats()["active"] == 0


def test_evil_conversion_cannot_close_the_pool_under_a_call():
    pool = kvbm.Pool(8, B)
    s = pool.sequence()

    class Evil:
        def __index__(self):
            pool.close()
            return 1

    with pytest.raises(kvbm.ClosedError):
        s.prefill([1, Evil(), 3])
    with pytest.raises(kvbm.ClosedError):
        pool.run_request([Evil()], [1])


def test_threads_share_a_pool():
    pool = kvbm.Pool(512, B)
    recs = load_trace(40)
    errors = []

    def worker(off):
        try:
            for r in range(off, len(recs), 4):
                rec = recs[r]
                if rec["input_length"] + rec["output_length"] <= 512 * B:
                    pool.run_request(prompt_tokens(rec), output_tokens(r, rec))
                s = pool.sequence()
                s.prefill(toks(r, 50))
                s.fork().destroy()
                s.destroy()
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    st = pool.stats()
    assert st["active"] == 0 and st["free"] + st["cached"] == st["num_blocks"]
