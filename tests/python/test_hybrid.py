# SPDX-License-Identifier: Apache-2.0
"""Hybrid models through the binding: kvbm.Pool(groups=...),
Pool.hybrid_sequence() (kvbm/hybrid.h) and kvbm.groups_from_vllm.

A request stepped from Python as vLLM's scheduler steps it gives the counts
of the Python reference tests/workload/hybrid_ref.py (vLLM's rules) and of
`kvbm replay --groups` on the first requests of the bundled trace; a
sliding window's table is null before the window; hostile group lists are
refused naming the item; a step that does not fit raises NoSpaceError and
changes nothing; vLLM's KVCacheConfig maps onto the group list.
"""
import dataclasses
import importlib.util
import json
import subprocess

import pytest

import kvbm
from conftest import SOURCE, TRACE, load_trace, output_tokens, prompt_tokens

B = 16


def _hybrid_ref():
    spec = importlib.util.spec_from_file_location("hybrid_ref", SOURCE / "tests" / "workload" / "hybrid_ref.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def replay_through_python(records, groups, capacity, mbt=0):
    """W1-hybrid's counts, every request stepped through HybridSequence."""
    pool = kvbm.Pool(capacity, B, groups=groups)
    n = len(pool.groups)
    res = dict(hit_tokens=0, blocks_allocated_per_group=[0] * n,
               peak_blocks_held_per_group=[0] * n, peak_blocks_held=0)
    for r, rec in enumerate(records):
        prompt, out = prompt_tokens(rec), output_tokens(r, rec)
        L = len(prompt)
        if L == 0:
            continue
        seq = pool.hybrid_sequence(max_tokens=L + len(out))
        seq.append(prompt)
        hit = seq.find_hit()
        computed = hit
        while computed < L:  # the prefill, in chunks of at most mbt tokens
            step = min(mbt, L - computed) if mbt else L - computed
            seq.step(num_new=step)
            computed += step
        assert seq.num_computed == L
        for m in range(len(out)):  # one decode step per output token
            seq.step(out[m:m + 1])
        st = seq.stats()
        res["hit_tokens"] += seq.hit_tokens
        for g in range(n):
            res["blocks_allocated_per_group"][g] += st["groups"][g]["allocated"]
            res["peak_blocks_held_per_group"][g] = max(res["peak_blocks_held_per_group"][g],
                                                       st["groups"][g]["peak_held"])
        res["peak_blocks_held"] = max(res["peak_blocks_held"], st["peak_held"])
        seq.destroy()
    assert pool.stats()["active"] == 0
    pool.close()
    return res


KEYS = ["hit_tokens", "blocks_allocated_per_group", "peak_blocks_held_per_group", "peak_blocks_held"]


# (a pool large enough that the reference refuses nothing: W1-hybrid's
# refusal is the driver's, a dry run before the request, not the library's)
@pytest.mark.parametrize("groups,mbt,capacity", [
    ("full,sw:128", 0, 16384),                   # gpt-oss-like
    ("full,sw:128", 2048, 16384),                # chunked prefill: the window frees between chunks
    ("full,sw:1024,sw:1024,sw:1024", 0, 65536),  # Gemma-3-like (fewer local groups)
    ("full,mamba,mamba", 8192, 65536),           # a Mamba hybrid ("all" mode)
    ("full,chunk:1000", 0, 16384),               # chunked local attention
])
def test_python_equals_reference_and_replay(groups, mbt, capacity, kvbm_bin):
    limit = 30
    records = load_trace(limit)
    ref = _hybrid_ref()
    specs = ref.parse_groups(groups)
    want = ref.replay(records, specs, B, capacity, mbt)
    assert want["refused"] == 0
    got = replay_through_python(records, groups, capacity, mbt)
    assert {k: got[k] for k in KEYS} == {k: want[k] for k in KEYS}
    assert got["hit_tokens"] > 0  # the trace shares prefixes: a test that can fail
    # the binding's sequences cache every full block (vLLM's
    # prefix_cache_retention_interval None); the CLI's default is vLLM's 0
    cmd = [kvbm_bin, "replay", str(TRACE), "--groups", groups, "--limit", str(limit),
           "--capacity", str(capacity), "--prefix-cache-retention-interval", "none",
           "--json", "--no-progress"]
    if mbt:
        cmd += ["--max-num-batched-tokens", str(mbt)]
    c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    assert {k: c[k] for k in KEYS} == {k: got[k] for k in KEYS}


def test_sparse_retention_registers_window_blocks_at_the_boundaries_only():
    # full,sw:8, B 4: a hit needs cdiv(7, 4) = 2 window blocks. A 40-token
    # prompt (10 blocks) run to its end, then released: with vLLM's sparse
    # retention (0) the window group registers only blocks 7 and 8 (ending
    # at (40 - 1) // 4 = 9); with None every full block.
    prompt = list(range(1000, 1040))
    for interval, want in ((None, list(range(10))), (0, [7, 8])):
        with kvbm.Pool(64, 4, groups=[("full", None), ("sw", 8)]) as pool:
            seq = pool.hybrid_sequence(prefix_cache_retention_interval=interval)
            seq.step(prompt)
            seq.destroy()
            # a second request over the same prompt: the window's hit
            # shows which blocks are there (a hit at 36 needs blocks 7, 8)
            again = pool.hybrid_sequence()
            again.append(prompt)
            assert again.find_hit() == 36
            again.destroy()
            stats = pool.stats()
            assert stats["cached"] == 10 + len(want), (interval, stats)
    with kvbm.Pool(64, 4, groups=[("full", None), ("sw", 8)]) as pool:
        for bad in (512, -1, True, "0", 0.0):
            with pytest.raises((ValueError, TypeError), match="prefix_cache_retention_interval"):
                pool.hybrid_sequence(prefix_cache_retention_interval=bad)


def test_sliding_window_table_is_null_before_the_window():
    with kvbm.Pool(64, 4, groups=[("full", None), ("sw", 8)]) as pool:
        assert pool.groups == [("full", None), ("sw", 8)]
        seq = pool.hybrid_sequence()
        seq.step(list(range(20)))          # 20 tokens computed
        seq.step([100])
        seq.step([101])                    # this step starts at 21: 14 tokens skipped
        full, sw = seq.block_tables
        assert len(full) == len(sw) == 6
        assert None not in full
        assert sw[:3] == [None, None, None] and None not in sw[3:]
        assert seq.stats()["groups"][1]["held"] == 3
        # a second request with the same prompt hits 16 of 20 tokens; the
        # window takes only the blocks covering the 7 tokens before 16
        seq.destroy()
        again = pool.hybrid_sequence()
        again.append(list(range(20)))
        assert again.find_hit() == 16
        again.step()
        assert again.hit_tokens == 16 and again.num_computed == 20
        full2, sw2 = again.block_tables
        assert full2[:4] == full[:4]
        assert sw2[:2] == [None, None] and None not in sw2[2:]


@pytest.mark.parametrize("groups,names", [
    ("full,bogus", "'bogus'"),
    ("full,sw:0", "'sw:0'"),
    ("full,sw", "'sw'"),
    ("mamba:4", "'mamba:4'"),
    ("", "empty"),
    ("full," * 16 + "full", "more than 16"),
    ([("full", None), ("sw", -5)], "item 1"),
    ([("full", None), ("sw", 0)], "'sw:0'"),
    ([("full", None), ("sw:1", None)], "item 1"),
    ([("full", None), (3, None)], "item 1"),
    ([("full", 1, 2)], "item 0"),
    ([], "empty"),
])
def test_hostile_groups_are_refused_naming_the_item(groups, names):
    with pytest.raises(kvbm.InvalidArgumentError) as e:
        kvbm.Pool(64, 16, groups=groups)
    assert names in str(e.value)


def test_more_groups_than_blocks_is_refused():
    with pytest.raises(kvbm.InvalidArgumentError, match="3 groups cannot share 2 blocks"):
        kvbm.Pool(2, 16, groups="full,sw:128,mamba")


def test_a_step_that_cannot_fit_changes_nothing():
    with kvbm.Pool(8, 4, groups="full,sw:8") as pool:
        seq = pool.hybrid_sequence()
        seq.step(list(range(12)))                      # 3 + 3 blocks of 8
        before = (seq.block_tables, seq.num_tokens, seq.num_computed, seq.stats(), pool.stats())
        with pytest.raises(kvbm.NoSpaceError):
            seq.step(list(range(12, 24)))              # 6 more, 2 free + 1 the window frees
        assert (seq.block_tables, seq.num_tokens, seq.num_computed, seq.stats(), pool.stats()) == before
        seq.step(list(range(12, 16)))                  # 2 more fit
        assert seq.num_computed == 16
        # a request that cannot fit at all: refused on its first step, nothing held
        other = pool.hybrid_sequence(max_tokens=64)
        with pytest.raises(kvbm.NoSpaceError):
            other.step(list(range(500, 540)))
        assert other.block_tables == [[], []] and other.num_tokens == 0


def test_bad_steps_and_close():
    pool = kvbm.Pool(64, 4, groups="full,sw:8")
    seq = pool.hybrid_sequence(max_tokens=8)
    with pytest.raises(kvbm.InvalidArgumentError, match="max_tokens"):
        seq.step(list(range(9)))
    with pytest.raises(kvbm.InvalidArgumentError):
        seq.step(list(range(4)), num_new=5)
    assert seq.num_tokens == 0
    seq.step(list(range(4)))
    with pytest.raises(kvbm.StateError):
        seq.find_hit()  # after the first step
    pool.close()
    assert seq.destroyed
    with pytest.raises(kvbm.ClosedError):
        seq.step([1])


# --- vLLM's KVCacheConfig, duck-typed: classes named as in
# vllm/v1/kv_cache_interface.py, with the fields kvbm reads.
@dataclasses.dataclass
class FullAttentionSpec:
    block_size: int = 16
    sliding_window: object = None


class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclasses.dataclass
class SlidingWindowSpec:
    sliding_window: int
    block_size: int = 16


@dataclasses.dataclass
class ChunkedLocalAttentionSpec:
    attention_chunk_size: int
    block_size: int = 16


@dataclasses.dataclass
class MambaSpec:
    mamba_cache_mode: str = "all"
    block_size: int = 16


@dataclasses.dataclass
class CrossAttentionSpec:
    block_size: int = 16


@dataclasses.dataclass
class UniformTypeKVCacheSpecs:
    kv_cache_specs: dict
    block_size: int = 16


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def _config(*specs):
    return KVCacheConfig(1025, [], [KVCacheGroupSpec(["l%d" % i], s) for i, s in enumerate(specs)])


def test_groups_from_vllm_maps_the_kv_cache_groups():
    cfg = _config(FullAttentionSpec(), SlidingWindowSpec(128), ChunkedLocalAttentionSpec(8192),
                  MambaSpec("all"), MambaSpec("align"), MLAAttentionSpec(),
                  FullAttentionSpec(sliding_window=4096),  # hybrid allocator off: full
                  UniformTypeKVCacheSpecs({"a": SlidingWindowSpec(512), "b": SlidingWindowSpec(512)}))
    groups = kvbm.groups_from_vllm(cfg)
    assert groups == [("full", None), ("sw", 128), ("chunk", 8192), ("mamba", None),
                      ("mamba-align", None), ("full", None), ("full", None), ("sw", 512)]
    assert kvbm.groups_from_vllm(cfg.kv_cache_groups) == groups
    pool = kvbm.Pool(cfg.num_blocks - 1, 16, groups=groups)  # vLLM keeps one null block
    assert pool.groups == groups
    pool.close()


@pytest.mark.parametrize("spec,names", [
    (MambaSpec("none"), "kv_cache_groups[1]: MambaSpec with mamba_cache_mode 'none'"),
    (CrossAttentionSpec(), "kv_cache_groups[1]: CrossAttentionSpec"),
    (UniformTypeKVCacheSpecs({}), "kv_cache_groups[1]: UniformTypeKVCacheSpecs"),
])
def test_groups_from_vllm_refuses_what_it_cannot_manage(spec, names):
    with pytest.raises(kvbm.InvalidArgumentError) as e:
        kvbm.groups_from_vllm(_config(FullAttentionSpec(), spec))
    assert names in str(e.value)


def test_groups_from_vllm_hostile_config():
    with pytest.raises(kvbm.InvalidArgumentError, match="no kv_cache_groups"):
        kvbm.groups_from_vllm(_config())
    with pytest.raises(kvbm.InvalidArgumentError, match="has no kv_cache_groups"):
        kvbm.groups_from_vllm(42)
    with pytest.raises(kvbm.InvalidArgumentError, match=r"kv_cache_groups\[0\] has no kv_cache_spec"):
        kvbm.groups_from_vllm([object()])
    # a window of 0 passes the mapping and is refused by the pool, naming it
    with pytest.raises(kvbm.InvalidArgumentError, match="item 1"):
        kvbm.Pool(64, 16, groups=kvbm.groups_from_vllm(_config(FullAttentionSpec(), SlidingWindowSpec(0))))
