# SPDX-License-Identifier: Apache-2.0
"""kvbm.Manager(groups=...) and kvbm.HybridRequest: the tier manager with KV
cache groups through the binding (issue 20; kvbm/manager.h, "Hybrid
requests").

The "engine" writes, into every block it must compute, bytes derived from
the block's tokens and its group; whatever a later hit brings back (from G1
or onboarded from G2/G3) must be exactly those bytes, and only the blocks a
group needs for the hit may be copied.
"""
import array
import hashlib

import pytest

import kvbm
from kvbm import Tier

B = 16


def content(tokens, k, g, n):
    """The bytes of group g's block k (keyed by the prefix's tokens)."""
    seed = hashlib.blake2b(bytes(memoryview(tokens[: (k + 1) * B])) + bytes([g]), digest_size=16).digest()
    out = bytearray()
    while len(out) < n:
        seed = hashlib.blake2b(seed, digest_size=64).digest()
        out += seed
    return bytes(out[:n])


def write_group(m, blk, data):
    """A group's bytes into G1 block blk, layer 0 first."""
    off = 0
    for layer in range(m.num_layers):
        if off >= len(data):
            break
        n = min(m.layer_bytes, len(data) - off)
        view = m.block_layer(Tier.G1, blk, layer)
        view[:n] = data[off:off + n]
        view.release()
        off += n


def read_group(m, blk, n):
    out = b""
    for layer in range(m.num_layers):
        if len(out) >= n:
            break
        view = m.block_layer(Tier.G1, blk, layer)
        out += view.tobytes()[: min(m.layer_bytes, n - len(out))]
        view.release()
    return out


def run(m, tokens):
    """One hybrid request as an engine runs it; returns (wait() info, tables)."""
    r = m.hprefill(tokens)
    try:
        info = r.wait()
        tables = r.tables
        for g, table in enumerate(tables):
            nbytes = m.group_bytes(g)
            for k in range(len(tokens) // B):
                if table[k] is None:
                    continue
                want = content(tokens, k, g, nbytes)
                if r.must_compute(g, k):
                    write_group(m, table[k], want)
                else:  # a hit: the bytes must be what was written for it
                    assert read_group(m, table[k], nbytes) == want, f"group {g} block {k}"
        r.commit()
        m.flush()
        return info, tables
    finally:
        r.destroy()


def prompt(seed, n):
    return array.array("I", [seed * 100000 + i for i in range(n)])


@pytest.mark.parametrize("groups,second,layouts", [
    ("full,sw:32", 2, None),                         # window of 32: 2 blocks of 16
    ([("full", None), ("mamba", None)], 1, [None, (1000, 2000)]),  # one state block
])
@pytest.mark.parametrize("tier", ["g2", "g3"])
def test_hybrid_hit_onboards_only_what_groups_need(tmp_path, groups, second, layouts, tier):
    kw = dict(g2_blocks=400) if tier == "g2" else dict(g3_blocks=400, g3_dir=str(tmp_path), g3_policy="all")
    with kvbm.Manager(g1_blocks=40, groups=groups, group_layouts=layouts, **kw) as m:
        assert m.num_groups == 2
        if layouts:
            assert m.group_bytes(1) == 3000 < m.block_bytes
        a = prompt(1, 12 * B)
        info, _ = run(m, a)
        assert info["hit_tokens"] == 0
        for i in range(3):  # G1 of 40 blocks forgets a's blocks
            run(m, prompt(10 + i, 12 * B))
        src = Tier.G2 if tier == "g2" else Tier.G3
        before = m.stats(src)["onboarded_blocks"]
        longer = prompt(1, 14 * B)
        info, tables = run(m, longer)
        assert info["hit_tokens"] == 12 * B
        assert info["hit_g1"] == [0, 0]
        assert info["onboarded"] == [12, second]
        assert info["onboarded_from"][tier.upper()] == 12 + second
        assert m.stats(src)["onboarded_blocks"] - before == 12 + second
        assert all(b is not None for b in tables[0])
        assert tables[1][: 12 - second] == [None] * (12 - second)


def test_one_group_matches_plain_prefill():
    with kvbm.Manager(g1_blocks=64) as m:
        assert m.num_groups == 1
        a = prompt(3, 100)
        info, _ = run(m, a)
        assert info["hit_tokens"] == 0
        with m.prefill(a) as r:
            assert r.wait(timeout=30).matched_tokens == (100 - 1) // B * B
        info, _ = run(m, a)
        assert info["hit_tokens"] == (100 - 1) // B * B
        assert info["hit_g1"] == [6]


def test_no_room_changes_nothing():
    with kvbm.Manager(g1_blocks=10, groups="full,sw:16") as m:
        free = m.stats(Tier.G1)["free"]
        with pytest.raises(kvbm.NoSpaceError, match="does not fit"):
            m.hprefill(prompt(1, 6 * B))  # 12 blocks > 10
        assert m.stats(Tier.G1)["free"] == free
        run(m, prompt(1, 5 * B))


@pytest.mark.parametrize("kw,msg", [
    (dict(groups="full,sw:0"), "sw:0"),
    (dict(groups="full,lstm"), "lstm"),
    (dict(groups=[("full", None), ("sw", -3)]), "tokens must be an int"),
    (dict(groups=42), "groups is a string or a list"),
    (dict(groups="full," * 8 + "full", g1_blocks=8), "cannot be served by g1_blocks 8"),
    (dict(groups="full,full", group_layouts=[None, 10 ** 9]), "do not fit the tier's block"),
    (dict(groups="full,mamba", group_layouts=[None]), "1 items for 2 groups"),
    (dict(groups="full,sw:16", group_layouts=[None, (8, 8)]), "conv/ssm state sizes for a sliding_window"),
])
def test_hostile_configs(kw, msg):
    kw.setdefault("g1_blocks", 16)
    with pytest.raises(kvbm.InvalidArgumentError, match=msg):
        kvbm.Manager(**kw)


def test_close_waits_for_hybrid_requests():
    m = kvbm.Manager(g1_blocks=16, groups="full,mamba")
    r = m.hprefill(prompt(2, 40))
    with pytest.raises(kvbm.Error, match="HybridRequest"):
        m.close()
    r.destroy()
    with pytest.raises(kvbm.ClosedError):
        r.commit()
    m.close()


def test_hybrid_append_decodes_and_refuses_without_room():
    """HybridRequest.append: a decode step in every group; the window group
    drops (at commit) the block that left its window, vLLM's
    remove_skipped_blocks; no room: NoSpaceError and nothing changed."""
    with kvbm.Manager(g1_blocks=10, groups="full,sw:32") as m:
        toks = prompt(3, 4 * B + 1)
        r = m.hprefill(toks[: 2 * B])  # 2 blocks a group
        try:
            r.wait()
            r.commit()
            for i in range(2 * B, 4 * B):  # decode to 64 tokens, token by token
                r.append(toks[i:i + 1])
                r.commit()
            full, window = r.tables
            assert len(full) == len(window) == 4 and None not in full
            # 64 computed: skipped 64 - 32 + 1 = 33 tokens: blocks 0 and 1
            assert window[:2] == [None, None] and None not in window[2:]
            r.append(toks[4 * B:4 * B + 1])  # 65: a new block a group
            r.commit()                        # skipped 34: still blocks 0, 1
            assert [len(t) for t in r.tables] == [5, 5]
            assert r.tables[1][:3].count(None) == 2
            before = m.stats(Tier.G1)
            with pytest.raises(kvbm.NoSpaceError, match="need 4 new G1 blocks"):
                r.append(array.array("I", [7] * (2 * B)))  # 2 more a group, 2 available
            assert [len(t) for t in r.tables] == [5, 5]
            assert m.stats(Tier.G1) == before
            r.append(array.array("I", [7] * B))  # 1 more a group fits
            assert [len(t) for t in r.tables] == [6, 6]
        finally:
            r.destroy()


# ---- prefix_cache_retention_interval (vLLM's setting; hybrid.md, "Session
# 15: the manager follows sparse retention on request") ----

@pytest.mark.parametrize("bad", [512, -1, 1, True, "0", 0.0])
def test_retention_interval_refused(bad):
    with pytest.raises(ValueError, match="prefix_cache_retention_interval"):
        kvbm.Manager(g1_blocks=40, groups="full,sw:8", prefix_cache_retention_interval=bad)


def g2_offloaded(interval):
    """G2 copies a 40-token prompt leaves under full,sw:8 (B 4: 10 full blocks a group)."""
    with kvbm.Manager(block_size=4, g1_blocks=64, g2_blocks=200, groups="full,sw:8",
                      prefix_cache_retention_interval=interval) as m:
        before = m.stats(Tier.G2)["offloaded_blocks"]
        r = m.hprefill(prompt(3, 40))
        try:
            r.wait()
            # every block is new: the engine computes all of them, kept or not
            assert all(r.must_compute(g, k) for g in range(2) for k in range(10))
            r.commit()
            m.flush()
        finally:
            r.destroy()
        return m.stats(Tier.G2)["offloaded_blocks"] - before


def test_sparse_offloads_only_kept_blocks():
    # dense (None, the default): 10 blocks in each group; sparse (0): the
    # full group's 10 and the window's 2 ending at the prompt's last token
    # (39 // 4 = 9: blocks 7 and 8).
    assert g2_offloaded(None) == 20
    assert g2_offloaded(0) == 12


def test_cache_manager_checks_retention_interval():
    from kvbm.connector import KvbmCacheManager
    with kvbm.Manager(g1_blocks=40, groups="full,sw:16", prefix_cache_retention_interval=0) as m:
        assert m.prefix_cache_retention_interval == 0
        assert KvbmCacheManager(m).prefix_cache_retention_interval == 0
        assert KvbmCacheManager(m, prefix_cache_retention_interval=0).prefix_cache_retention_interval == 0
        with pytest.raises(ValueError, match="created with 0"):
            KvbmCacheManager(m, prefix_cache_retention_interval=None)
        with pytest.raises(ValueError, match="not modelled"):
            KvbmCacheManager(m, prefix_cache_retention_interval=512)
    with kvbm.Manager(g1_blocks=40, groups="full,sw:16") as m:
        assert m.prefix_cache_retention_interval is None
        assert KvbmCacheManager(m).prefix_cache_retention_interval is None
        with pytest.raises(ValueError, match="created with None"):
            KvbmCacheManager(m, prefix_cache_retention_interval=0)
