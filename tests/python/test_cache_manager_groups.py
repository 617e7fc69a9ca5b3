# SPDX-License-Identifier: Apache-2.0
"""kvbm.connector.KvbmCacheManager over a kvbm.Manager with KV cache groups
(issue 20): kvbm owns G1 and serves a hybrid model's requests, driven step by
step as vLLM's scheduler drives its KVCacheManager:

    blocks, hit = get_computed_blocks(request)
    allocate_slots(request, len(prompt) - hit, hit, blocks)   # None: no room
    ... the forward pass writes the step's blocks ...
    commit(request_id, num_computed_tokens)                    # wait_for_save
    allocate_slots(request, 1) per decode token, then commit
    free(request)

The "engine" writes into every block it must compute (not in
skip_write_blocks) bytes derived from the block's tokens and its group, so
whatever a later request gets as a hit (shared in G1, or onboarded from
G2/G3) must hold exactly those bytes. Expected tables follow vLLM's rules
(docs/areas/hybrid.md, "vLLM's rules, as facts"): a window of W keeps the
blocks of the last W - 1 tokens, a Mamba group ("all" mode) its last state,
full attention every block; the places before are vLLM's null block
(here the cache manager's null_block_id).
"""
import hashlib

import pytest

import kvbm
from kvbm import Tier
from kvbm.connector import KvbmBlocks, KvbmCacheManager, KvbmConnector, KVConnectorRole

B = 16
NULL = -1

# The three mixes of W1-hybrid, scaled to small pools (windows in tokens).
MIXES = {
    "gpt-oss": dict(groups="full,sw:32"),
    "gemma": dict(groups="full,sw:48,sw:48,sw:48,sw:48,sw:48"),
    "mamba": dict(groups=[("full", None), ("mamba", None)], group_layouts=[None, (1000, 2000)]),
}


def skipped_tokens(kind, n):
    """vLLM's get_num_skipped_tokens(n) per kind (docs/areas/hybrid.md)."""
    if kind == "full":
        return 0
    if kind.startswith("sw:"):
        return max(0, n - int(kind[3:]) + 1)
    assert kind == "mamba"
    return max(0, n - 1)


def kinds(mix):
    g = MIXES[mix]["groups"]
    return g.split(",") if isinstance(g, str) else [k for k, _ in g]


class Req:
    """What KvbmCacheManager reads of vLLM's Request."""

    def __init__(self, rid, tokens):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_computed_tokens = 0
        self.cache_salt = None
        self.lora_request = None


def prompt(seed, n):
    return [seed * 100000 + i for i in range(n)]


def content(tokens, k, g, n):
    """Group g's block k: bytes keyed by the prefix's tokens and the group."""
    seed = hashlib.blake2b(repr((tokens[: (k + 1) * B], g)).encode(), digest_size=16).digest()
    out = bytearray()
    while len(out) < n:
        seed = hashlib.blake2b(seed, digest_size=64).digest()
        out += seed
    return bytes(out[:n])


def write_block(m, blk, data):
    off = 0
    for layer in range(m.num_layers):
        if off >= len(data):
            break
        n = min(m.layer_bytes, len(data) - off)
        m.write_layer(Tier.G1, blk, layer, data[off:off + n] + m.read_layer(Tier.G1, blk, layer)[n:])
        off += n


def read_block(m, blk, n):
    out = b""
    for layer in range(m.num_layers):
        if len(out) >= n:
            break
        out += m.read_layer(Tier.G1, blk, layer)[: min(m.layer_bytes, n - len(out))]
    return out


class Engine:
    """The scheduler's and the forward pass's calls, in vLLM's order."""

    def __init__(self, m, **kw):
        self.m = m
        self.cm = KvbmCacheManager(m, null_block_id=NULL, **kw)
        self.written = {}  # (request id, group, k) -> block id the engine wrote

    def write(self, r, start, end):
        """The forward pass over tokens [start, end): every full block it
        completes that the request must write gets its bytes."""
        skip = self.cm.skip_write_blocks(r.request_id, start, end)
        ids = self.cm.get_block_ids(r.request_id)
        for g, table in enumerate(ids):
            for k in range(start // B, end // B):
                if (k + 1) * B > end or k in skip[g]:
                    continue
                assert table[k] != NULL, f"group {g} block {k} must be written but is null"
                write_block(self.m, table[k], content(r.all_token_ids, k, g, self.m.group_bytes(g)))
                self.written[(r.request_id, g, k)] = table[k]

    def check_hit(self, r, blocks, hit):
        """Every non-null hit block holds the bytes written for its prefix."""
        for g, table in enumerate(blocks.get_block_ids()):
            assert len(table) == hit // B
            for k, bid in enumerate(table):
                if bid != NULL:
                    assert read_block(self.m, bid, self.m.group_bytes(g)) == \
                        content(r.all_token_ids, k, g, self.m.group_bytes(g)), f"group {g} block {k}"

    def prefill(self, r):
        """One prefill step; returns the hit or None (no room)."""
        blocks, hit = self.cm.get_computed_blocks(r)
        new = self.cm.allocate_slots(r, len(r.all_token_ids) - hit, hit, blocks)
        if new is None:
            return None
        assert not self.cm.dependencies(r.request_id)
        self.check_hit(r, blocks, hit)
        r.num_computed_tokens = hit
        self.write(r, hit, len(r.all_token_ids))
        r.num_computed_tokens = len(r.all_token_ids)
        assert self.cm.commit(r.request_id, r.num_computed_tokens)
        return hit

    def decode(self, r, token):
        r.all_token_ids.append(token)
        new = self.cm.allocate_slots(r, 1)
        if new is None:
            r.all_token_ids.pop()
            return None
        n = r.num_computed_tokens
        self.write(r, n, n + 1)
        r.num_computed_tokens = n + 1
        assert self.cm.commit(r.request_id, n + 1)
        return new

    def run(self, r, decode=0):
        hit = self.prefill(r)
        for i in range(decode):
            assert self.decode(r, 7 + i) is not None
        return hit


def expect_nulls(mix, ids, n):
    """The null places of every group's table at n computed tokens."""
    for kind, table in zip(kinds(mix), ids):
        first = min(skipped_tokens(kind, n) // B, len(table))
        assert table[:first] == [NULL] * first, (kind, table)
        assert NULL not in table[first:], (kind, table)


@pytest.mark.parametrize("mix", MIXES)
def test_prefix_hit_by_group_rule_shares_written_blocks(mix):
    """B shares A's prefix: hit of 8 blocks; every group's hit table has the
    nulls vLLM's rule gives and the bytes A wrote (through G1)."""
    with kvbm.Manager(g1_blocks=200, **MIXES[mix]) as m:
        e = Engine(m)
        a = Req("a", prompt(1, 10 * B + 5))
        assert e.run(a, decode=3) == 0
        expect_nulls(mix, e.cm.get_block_ids("a"), len(a.all_token_ids))
        a_ids = e.cm.get_block_ids("a")
        e.cm.free(a)
        b = Req("b", prompt(1, 8 * B) + [5, 6, 7])
        blocks, hit = e.cm.get_computed_blocks(b)
        assert hit == 8 * B
        ids = blocks.get_block_ids()
        assert isinstance(ids, tuple) and len(ids) == m.num_groups
        expect_nulls(mix, ids, hit)
        for g, table in enumerate(ids):  # the hit blocks are the ones A wrote
            for k, bid in enumerate(table):
                if bid != NULL:
                    assert e.written[("a", g, k)] == bid
                    assert a_ids[g][k] in (bid, NULL)  # A's window released some at its commits
        assert e.prefill(b) == hit
        # The whole prompt is in every group's table after the prefill; the
        # commit released what each group no longer needs.
        expect_nulls(mix, e.cm.get_block_ids("b"), len(b.all_token_ids))
        assert [len(t) for t in e.cm.get_block_ids("b")] == [9] * m.num_groups
        # The same prompt again hits at most L - 1 tokens: 8 blocks, not 9.
        c = Req("c", list(b.all_token_ids))
        assert e.prefill(c) == 8 * B
        for r in (b, c):
            e.cm.free(r)
        assert m.stats(Tier.G1)["active"] == 0


def test_window_group_serves_a_hit_full_attention_could_not():
    """The hit needs only the window's blocks: with A's sliding-window blocks
    before the window gone from every tier (released first, evicted
    first), B still hits 8 blocks; a rule treating every group as full
    attention would find 0."""
    with kvbm.Manager(g1_blocks=30, groups="full,sw:32") as m:
        e = Engine(m)
        a = Req("a", prompt(1, 8 * B + 1))
        e.run(a)  # 9 + 9 blocks held, the window's 0..5 released at commit
        e.cm.free(a)  # 16 cached (the partial tails are not), 14 free
        # A filler of 20 new blocks: the 14 free, then the 6 released the
        # longest ago: A's window blocks 0..5, released at its commit.
        f = Req("f", prompt(2, 10 * B - 1))
        evicted = m.stats(Tier.G1)["evictions"]
        e.run(f)
        assert m.stats(Tier.G1)["evictions"] - evicted == 6
        e.cm.free(f)
        b = Req("b", prompt(1, 8 * B + 3))
        blocks, hit = e.cm.get_computed_blocks(b)
        assert hit == 8 * B
        full, window = blocks.get_block_ids()
        # skipped(128) = 97 tokens: the window needs blocks 6 and 7 only
        assert NULL not in full and window[:6] == [NULL] * 6 and NULL not in window[6:]
        assert e.prefill(b) == hit
        e.cm.free(b)
        # E = A's first 6 blocks + 1: full attention holds all 6, the window
        # would need blocks 4 and 5, evicted: no hit. The full group's blocks
        # are shared and hold their bytes already (not to be written again),
        # the window group's are new (to be written): skip_write_blocks is
        # per group.
        e_ = Req("e", prompt(1, 6 * B) + [1])
        blocks, hit = e.cm.get_computed_blocks(e_)
        assert hit == 0
        assert e.cm.skip_write_blocks("e", 0, 6 * B + 1) == (set(range(6)), set())
        assert e.prefill(e_) == 0
        full = e.cm.get_block_ids("e")[0]
        for k in range(6):  # what A wrote, not rewritten
            assert e.written[("a", 0, k)] == full[k] and ("e", 0, k) not in e.written
            assert read_block(m, full[k], m.group_bytes(0)) == content(e_.all_token_ids, k, 0, m.group_bytes(0))
        e.cm.free(e_)


@pytest.mark.parametrize("mix", ["gpt-oss", "mamba"])
def test_decode_releases_what_a_group_no_longer_needs(mix):
    """Decode token by token: after each commit the window (Mamba: state)
    group's places before its needed blocks are null and their blocks are
    no longer held (vLLM's remove_skipped_blocks); full attention keeps all."""
    with kvbm.Manager(g1_blocks=40, **MIXES[mix]) as m:
        e = Engine(m)
        r = Req("r", prompt(3, 2 * B))
        e.prefill(r)
        for i in range(3 * B + 1):
            new = e.decode(r, 100 + i)
            n = len(r.all_token_ids)
            got = new.get_block_ids()
            # A new block in every group exactly when the token opens one.
            assert [len(t) for t in got] == [1 if n % B == 1 else 0] * 2
            ids = e.cm.get_block_ids("r")
            expect_nulls(mix, ids, n)
            held = sum(1 for t in ids for b in t if b != NULL)
            assert m.stats(Tier.G1)["active"] == held
        assert len(ids[0]) == 6 and NULL not in ids[0]
        e.cm.free(r)
        assert m.stats(Tier.G1)["active"] == 0


@pytest.mark.parametrize("mix", ["gpt-oss", "mamba"])
def test_no_room_refused_nothing_changed(mix):
    """A prompt that does not fit every group: no hit, allocate_slots None,
    G1 and the cache manager unchanged; a decode step whose blocks do not
    fit every group: None, tables and G1 unchanged; once room is made (a
    free) the same step goes through."""
    with kvbm.Manager(g1_blocks=12, **MIXES[mix]) as m:
        e = Engine(m)
        a = Req("a", prompt(1, 4 * B))
        e.prefill(a)  # 4 full blocks, the other group fewer after its commit
        before = m.stats(Tier.G1)
        b = Req("b", prompt(2, 6 * B))  # 6 blocks a group: more than G1 has left
        assert 12 > 12 - before["active"]
        blocks, hit = e.cm.get_computed_blocks(b)
        assert hit == 0 and blocks.get_block_ids() == ([], [])
        assert e.cm.allocate_slots(b, 6 * B, 0, blocks) is None
        assert m.stats(Tier.G1) == before and not e.cm.has_request("b")
        c = Req("c", prompt(3, 2 * B + 8))
        assert e.prefill(c) == 0
        avail = 12 - m.stats(Tier.G1)["active"]
        need = avail // 2 + 1  # blocks a group: 2 x need > avail
        before, tables = m.stats(Tier.G1), e.cm.get_block_ids("a")
        a.all_token_ids += [9] * (need * B)
        assert e.cm.allocate_slots(a, need * B) is None
        assert e.cm.get_block_ids("a") == tables and m.stats(Tier.G1) == before
        e.cm.free(c)
        new = e.cm.allocate_slots(a, need * B)
        assert new is not None and [len(t) for t in new.get_block_ids()] == [need, need]
        e.write(a, 4 * B, (4 + need) * B)
        a.num_computed_tokens = (4 + need) * B
        assert e.cm.commit("a", a.num_computed_tokens)
        expect_nulls(mix, e.cm.get_block_ids("a"), a.num_computed_tokens)
        e.cm.free(a)


@pytest.mark.parametrize("tier", ["g2", "g3"])
@pytest.mark.parametrize("mix", ["gpt-oss", "mamba"])
def test_hit_after_eviction_onboards_written_bytes(tmp_path, tier, mix):
    """A's blocks evicted from G1 come back from G2/G3 for B's hit with the
    bytes A wrote, only what each group needs onboarded."""
    kw = dict(g2_blocks=400) if tier == "g2" else dict(g3_blocks=400, g3_dir=str(tmp_path), g3_policy="all")
    with kvbm.Manager(g1_blocks=40, **MIXES[mix], **kw) as m:
        e = Engine(m)
        a = Req("a", prompt(1, 12 * B + 3))
        e.run(a)
        e.cm.free(a)
        m.flush()
        for i in range(3):  # three other prompts push A out of G1
            f = Req(f"f{i}", prompt(10 + i, 12 * B + 3))
            e.run(f)
            e.cm.free(f)
            m.flush()
        src = Tier.G2 if tier == "g2" else Tier.G3
        onboarded = m.stats(src)["onboarded_blocks"]
        b = Req("b", prompt(1, 12 * B) + [1, 2, 3, 4])
        blocks, hit = e.cm.get_computed_blocks(b)
        assert hit == 12 * B
        second = 2 if mix == "gpt-oss" else 1  # a window of 32: 2 blocks; Mamba: 1 state
        assert m.stats(src)["onboarded_blocks"] - onboarded == 12 + second
        e.check_hit(b, blocks, hit)  # the bytes A wrote
        assert [sum(1 for x in t if x != NULL) for t in blocks.get_block_ids()] == [12, second]
        assert e.prefill(b) == hit
        e.cm.free(b)


def test_failed_onboards_settle_the_hit(tmp_path):
    """G3's copies of A's blocks are corrupted: hprefill finds the hit in G3,
    every read fails its checksum, and get_computed_blocks returns the
    settled hit (0), not the one found, with tables the engine can compute
    from 0 (the window group has no null where it must write: kvbm's wait
    gave it blocks once the hit settled short); a later request hits
    the recomputed blocks in G1 with the bytes written."""
    with kvbm.Manager(g1_blocks=40, g3_blocks=400, g3_dir=str(tmp_path), g3_policy="all", g3_persist=True,
                      groups="full,sw:32") as m:
        e = Engine(m)
        for i, seed in enumerate((1, 10, 11, 12)):  # A, then three that push it out of G1
            r = Req(f"r{i}", prompt(seed, 12 * B + 3))
            e.run(r)
            e.cm.free(r)
            m.flush()
        path = tmp_path / "kvbm-g3.slots"
        data = bytearray(path.read_bytes())
        for i in range(0, len(data), 97):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        b = Req("b", prompt(1, 12 * B) + [1, 2, 3, 4])
        blocks, hit = e.cm.get_computed_blocks(b)
        assert hit == 0 and blocks.get_block_ids() == ([], [])
        assert m.stats(Tier.G3)["checksum_failures"] == 14  # found in G3: 12 full + the window's 2
        assert [t.count(NULL) for t in e.cm.get_block_ids("b")] == [0, 0]
        assert e.cm.skip_write_blocks("b", 0, len(b.all_token_ids)) == (set(), set())
        assert e.prefill(b) == 0
        c = Req("c", list(b.all_token_ids))
        blocks, hit = e.cm.get_computed_blocks(c)
        assert hit == 12 * B
        e.check_hit(c, blocks, hit)
        for r in (b, c):
            e.cm.free(r)


def test_dependencies_on_a_request_still_writing():
    """B registered after A, before A's commit: A's blocks are no hit for B
    (no KV yet) but B shares them (one registration per key): B must not
    write them (skip_write_blocks, every group) and must wait for A
    (dependencies) until A commits. If A goes away instead, B writes them."""
    with kvbm.Manager(g1_blocks=60, groups="full,sw:32") as m:
        for a_commits in (True, False):
            e = Engine(m)
            p = prompt(5 if a_commits else 6, 4 * B + 2)
            a, b = Req("a", p), Req("b", p)
            _, hit_a = e.cm.get_computed_blocks(a)
            assert e.cm.allocate_slots(a, len(p), 0) is not None
            blocks, hit = e.cm.get_computed_blocks(b)
            assert hit_a == hit == 0
            e.cm.allocate_slots(b, len(p), 0)
            assert e.cm.dependencies("b") == {"a"} and not e.cm.dependencies("a")
            # Shared full blocks; each has its own partial tail.
            assert [t[:4] for t in e.cm.get_block_ids("b")] == [t[:4] for t in e.cm.get_block_ids("a")]
            assert e.cm.skip_write_blocks("b", 0, len(p)) == ({0, 1, 2, 3}, {0, 1, 2, 3})
            assert e.cm.skip_write_blocks("a", 0, len(p)) == (set(), set())
            if a_commits:
                e.write(a, 0, len(p))
                assert e.cm.commit("a", len(p))
            else:
                e.cm.free(a)
            assert not e.cm.dependencies("b")
            want = set() if not a_commits else {0, 1, 2, 3}
            assert e.cm.skip_write_blocks("b", 0, len(p)) == (want, want)
            e.write(b, 0, len(p))
            assert e.cm.commit("b", len(p))
            c = Req("c", p + [1])
            blocks, hit = e.cm.get_computed_blocks(c)
            assert hit == 4 * B
            e.check_hit(c, blocks, hit)
            for r in (b, c) if not a_commits else (a, b, c):
                e.cm.free(r)


def test_commit_waits_for_every_token():
    """A chunked prefill commits after its last chunk: commit before it
    does nothing (kvbm's commit says every token is computed)."""
    with kvbm.Manager(g1_blocks=40, groups="full,sw:32") as m:
        e = Engine(m)
        r = Req("r", prompt(4, 6 * B))
        blocks, hit = e.cm.get_computed_blocks(r)
        e.cm.allocate_slots(r, 3 * B, hit, blocks)  # first chunk
        e.write(r, 0, 3 * B)
        assert not e.cm.commit("r", 3 * B)
        assert NULL not in e.cm.get_block_ids("r")[1]  # nothing released yet
        e.write(r, 3 * B, 6 * B)
        assert e.cm.commit("r", 6 * B)
        assert not e.cm.commit("r", 6 * B)  # nothing new
        expect_nulls("gpt-oss", e.cm.get_block_ids("r"), 6 * B)
        e.cm.free(r)


def test_hybrid_surface_checks():
    with kvbm.Manager(g1_blocks=16, groups="full,sw:32") as m:
        with pytest.raises(kvbm.InvalidArgumentError, match="null_block_id 0 is a G1 block"):
            KvbmCacheManager(m, null_block_id=0)
        with pytest.raises(TypeError, match="null_block_id"):
            KvbmCacheManager(m, null_block_id="0")
        cm = KvbmCacheManager(m)
        assert cm.num_groups == 2 and cm.null_block_id == -1
        # KvbmConnector serves it (test_connector_groups.py)
        assert KvbmConnector(KVConnectorRole.SCHEDULER, cm).role == KVConnectorRole.SCHEDULER
        with pytest.raises(kvbm.NotFoundError):
            cm.get_block_ids("nobody")
        with pytest.raises(kvbm.InvalidArgumentError, match="no tokens"):
            cm.get_computed_blocks(Req("x", []))
    blocks = KvbmBlocks(groups=[[1, 2], [NULL, 3]])
    assert blocks.get_block_ids() == ([1, 2], [NULL, 3]) and blocks.block_ids == [1, 2]
    assert KvbmBlocks(groups=[[], []]).get_block_ids(allow_none=True) is None


@pytest.mark.parametrize("mix", MIXES)
def test_sparse_retention_hits_as_hybrid_sequence(mix):
    """Manager(prefix_cache_retention_interval=0) behind the cache manager:
    A, A again, then C and D sharing A's first 6 blocks (the junction). The
    engine writes only what skip_write_blocks leaves; every hit block holds
    the bytes written for it (check_hit); the hits equal those of the
    library's own hybrid request (Pool.hybrid_sequence) under the same
    retention, and under sparse the third prompt hits less than dense
    (A kept no window/Mamba block at C's junction)."""
    L = 10 * B + 5
    a = prompt(1, L)
    prompts = [a, a, a[:6 * B] + prompt(2, L - 6 * B), a[:6 * B] + prompt(3, L - 6 * B)]

    def engine_hits(interval):
        with kvbm.Manager(g1_blocks=400, prefix_cache_retention_interval=interval, **MIXES[mix]) as m:
            e = Engine(m, prefix_cache_retention_interval=interval)
            hits = []
            for i, p in enumerate(prompts):
                r = Req(f"r{i}", p)
                hits.append(e.run(r, decode=2))
                e.cm.free(r)
            return hits

    def pool_hits(interval):
        with kvbm.Pool(400, B, groups=MIXES[mix]["groups"]) as pool:
            hits = []
            for p in prompts:
                s = pool.hybrid_sequence(prefix_cache_retention_interval=interval)
                s.append(p)
                hits.append(s.find_hit())
                s.step()
                s.step([7])
                s.step([8])
                s.destroy()
            return hits

    sparse, dense = engine_hits(0), engine_hits(None)
    assert sparse == pool_hits(0)
    assert dense == pool_hits(None)
    assert sparse[1] == dense[1] == 10 * B  # L - 1 tokens, floored
    assert sparse[2] < dense[2] == 6 * B
    assert sparse[3] == 6 * B  # C kept its blocks at the junction
