#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reference for workload W1-hybrid: W1 of ../shared/WORKLOADS.md run through
vLLM's KVCacheManager rules with several KV cache groups over one pool.

What and why. kvbm's `replay --groups ...` must give the same counts as vLLM's
hybrid KV cache manager driven one request at a time. This file is the slow,
simple statement of those rules, written from vLLM's code (the files and the
commit read are in docs/areas/hybrid.md, which also lists every choice made
where vLLM left one open). It is a test oracle, not a library: no speed, no
API, one pass over the trace.

The model, in vLLM's names:
  * one BlockPool of capacity + 1 blocks; block 0 is the null block, never
    counted. Its free queue is [fresh blocks][cached blocks, LRU first]:
    free_blocks() prepends blocks without a hash and appends cached ones, and
    get_new_blocks() pops from the front, evicting a cached block it takes.
  * a cached block is keyed by (block hash, group index).
  * one SingleTypeKVCacheManager per group: full, sw:W (SlidingWindowManager),
    chunk:C (ChunkedLocalAttentionManager), mamba (MambaManager in "all" mode:
    vLLM's default with prefix caching on for models that declare
    SupportsMambaPrefixCaching, e.g. Nemotron-H and Granite 4: a state block
    per block of tokens, as attention allocates, all but the last freed after
    each step) and mamba-align (MambaManager in "align" mode, the default for
    the other Mamba models: one running state block, saved at chunk ends).
  * HybridKVCacheCoordinator.find_longest_cache_hit: groups with equal specs
    form one attention type; full attention first; every type may shorten the
    hit; repeat until no type shortens it (one pass when the model is one full
    type plus one other type).
  * KVCacheManager.allocate_slots per step: remove_skipped_blocks, then
    get_num_blocks_to_allocate (refuse if more than free), then
    allocate_new_computed_blocks (touch the hit), allocate_new_blocks,
    cache_blocks up to the tokens computed by the end of the step.
  * the scheduler's chunked prefill: at most --max-num-batched-tokens a step,
    and with a mamba-align group _mamba_block_aligned_split cuts chunks at
    block boundaries and stops once at the last block boundary of the prompt.

W1 parts kept as W1 defines them (so that `--groups full` equals
../shared/tools/ref_replay.py): every prompt and output token takes a slot
(output m is decoded in its own step), a block that fills with content
already registered under the same key goes straight back to the free list
and the request shares the registered one (dedup on register; vLLM keeps
both: --no-dedup gives vLLM's rule), and a request is released at its end.

A request that cannot fit (some step needs more blocks than are free) is
refused before it runs: it changes nothing, counts in `refused`, and adds no
hits and no allocations. With one request at a time every block not held by
it is free or cached, so a dry run of its steps on block counts alone decides.

usage: hybrid_ref.py TRACE (--groups LIST | --mix NAME) [--block-size 16]
       [--capacity 16384] [--max-num-batched-tokens N] [--limit R] [--json]
       [--no-dedup]
"""
import argparse
import collections
import gzip
import hashlib
import json
import struct
import sys

TRACE_BLOCK = 512

# The three model mixes of docs/areas/hybrid.md, as vLLM groups their layers
# (kv_cache_utils._get_kv_cache_groups_uniform_page_size: group size = the
# smallest layer count among the specs, each spec split into groups of it).
MIXES = {
    # gpt-oss-20b: 24 layers, 12 full + 12 sliding window of 128 tokens
    "gpt-oss": "full,sw:128",
    # Gemma-3-12B: 48 layers, 8 global + 40 local (1024-token window): 8 a group
    "gemma3": "full," + ",".join(["sw:1024"] * 5),
    # Nemotron-H-8B: 4 attention + 24 Mamba-2 layers: 4 a group; it declares
    # SupportsMambaPrefixCaching, so its default mamba_cache_mode is "all"
    "mamba-hybrid": "full," + ",".join(["mamba"] * 6),
}


def cdiv(a, b):
    return -(-a // b)


def parse_groups(text):
    """'full,sw:128,...' -> list of (kind, param); raises ValueError."""
    if not text or not text.strip():
        raise ValueError("empty group list")
    groups = []
    for i, item in enumerate(text.split(",")):
        kind, _, arg = item.strip().partition(":")
        if kind in ("full", "mamba", "mamba-align"):
            if arg:
                raise ValueError("group %d (%r): %s takes no parameter" % (i, item, kind))
            groups.append((kind, 0))
        elif kind in ("sw", "chunk"):
            try:
                n = int(arg)
            except ValueError:
                raise ValueError("group %d (%r): %s needs a token count, e.g. %s:128"
                                 % (i, item, kind, kind)) from None
            if n <= 0:
                raise ValueError("group %d (%r): the %s must be at least 1 token"
                                 % (i, item, "window" if kind == "sw" else "chunk"))
            groups.append((kind, n))
        else:
            raise ValueError("group %d (%r): unknown kind (full, sw:W, chunk:C, mamba, "
                             "mamba-align)"
                             % (i, item))
    return groups


# ---------------------------------------------------------------- trace
def read_trace(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            if limit and len(out) >= limit:
                break
            if line.strip():
                out.append(json.loads(line))
    return out


def request_tokens(r, rec):
    h, n = rec["hash_ids"], rec["input_length"]
    prompt = [h[i // TRACE_BLOCK] * TRACE_BLOCK + i % TRACE_BLOCK for i in range(n)]
    out = [0x80000000 | (r << 16) | m for m in range(rec["output_length"])]
    return prompt, out


def block_hashes(tokens, B):
    """Chained 64-bit BLAKE2b of every full block, as ref_replay.py."""
    hs, parent = [], 0
    for k in range(len(tokens) // B):
        blk = tokens[k * B:(k + 1) * B]
        data = struct.pack("<Q", parent) + struct.pack("<%dI" % B, *blk)
        parent = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        hs.append(parent)
    return hs


# ---------------------------------------------------------------- pool
class Block:
    __slots__ = ("bid", "ref", "key", "is_null")

    def __init__(self, bid):
        self.bid, self.ref, self.key, self.is_null = bid, 0, None, False


NULL = Block(0)
NULL.is_null = True


class Pool:
    """vLLM's BlockPool: free queue = fresh blocks, then cached blocks in LRU
    order; cached_block_hash_to_block keyed by (hash, group)."""

    def __init__(self, capacity, dedup):
        self.capacity = capacity
        self.fresh = [Block(i) for i in range(capacity, 0, -1)]  # pop() = front
        self.lru = collections.OrderedDict()                       # bid -> Block
        self.cached = {}                                           # key -> [Block]
        self.dedup = dedup
        self.allocated = 0

    def num_free(self):
        return len(self.fresh) + len(self.lru)

    def get_cached(self, h, gids):
        got = []
        for g in gids:
            blocks = self.cached.get((h, g))
            if not blocks:
                return None
            got.append(blocks[0])   # vLLM: the first block under the key
        return got

    def get_new(self, n):
        assert n <= self.num_free()
        out = []
        for _ in range(n):
            if self.fresh:
                b = self.fresh.pop()
            else:
                _, b = self.lru.popitem(last=False)
                self._evict(b)
            b.ref = 1
            out.append(b)
        self.allocated += n
        return out

    def _evict(self, b):
        blocks = self.cached[b.key]
        blocks.remove(b)
        if not blocks:
            del self.cached[b.key]
        b.key = None

    def touch(self, blocks):
        for b in blocks:
            if b.is_null:
                continue
            if b.ref == 0:
                del self.lru[b.bid]
            b.ref += 1

    def free(self, ordered):
        freeable = []
        for b in ordered:
            if b.is_null:
                continue
            b.ref -= 1
            if b.ref == 0:
                freeable.append(b)
        # fresh blocks to the front (used first), cached ones to the back
        self.fresh.extend(reversed([b for b in freeable if b.key is None]))
        for b in freeable:
            if b.key is not None:
                self.lru[b.bid] = b

    def cache_full_blocks(self, table, first, end, hashes, g, mask=None):
        """Register table[first:end] (those mask(i) keeps, all without a
        mask); returns how many blocks dedup returned."""
        for i in range(first, end):
            b = table[i]
            if b.is_null or b.key is not None:   # skipped, or a prefix hit
                continue
            if mask is not None and not mask(i):  # sparse retention: never hashed
                continue
            key = (hashes[i], g)
            if self.dedup and key in self.cached:
                # W1: the new block goes straight back to the free list and
                # the request shares the registered one
                reg = self.cached[key][0]
                b.ref = 0
                self.fresh.append(b)
                self.touch([reg])
                table[i] = reg
                continue
            b.key = key
            self.cached.setdefault(key, []).append(b)


class DryPool:
    """Block counts only, for deciding whether a request fits: lookups read the
    real pool, nothing in it changes."""

    def __init__(self, real):
        self.real, self.held, self.allocated = real, 0, 0

    def num_free(self):
        return self.real.capacity - self.held

    def get_cached(self, h, gids):
        return self.real.get_cached(h, gids)

    def get_new(self, n):
        self.held += n
        return [Block(-1) for _ in range(n)]

    def touch(self, blocks):
        self.held += sum(1 for b in blocks if not b.is_null)

    def free(self, ordered):
        self.held -= sum(1 for b in ordered if not b.is_null)

    def cache_full_blocks(self, table, first, end, hashes, g, mask=None):
        pass


# ------------------------------------------------------- single-type managers
def skipped_tokens(kind, param, n):
    """get_num_skipped_tokens: tokens no longer attended to after n computed."""
    if kind == "sw":
        return max(0, n - param + 1)
    if kind == "chunk":
        return n // param * param
    if kind in ("mamba", "mamba-align"):
        return n - 1
    return 0


def hit_full(pool, hashes, max_len, gids, B):
    out = [[] for _ in gids]
    for i in range(max_len // B):
        got = pool.get_cached(hashes[i], gids)
        if got is None:
            break
        for lst, b in zip(out, got):
            lst.append(b)
    return out


def hit_sw(pool, hashes, max_len, gids, B, W):
    need = cdiv(W - 1, B)          # contiguous blocks for a hit
    n = max_len // B
    out = [[NULL] * n for _ in gids]
    run, found = 0, False
    for i in range(n - 1, -1, -1):  # right to left, stop at the first run
        got = pool.get_cached(hashes[i], gids)
        if got is None:
            run = 0
            continue
        for lst, b in zip(out, got):
            lst[i] = b
        run += 1
        if run >= need:
            for lst in out:
                del lst[i + run:]
            found = True
            break
    if not found:                   # the blocks from 0 on that are cached
        for lst in out:
            del lst[run:]
    return out


def hit_chunk(pool, hashes, max_len, gids, B, C):
    n = max_len // B
    start = (max_len // C * C if max_len > 0 else 0) // B
    out = [[NULL] * start for _ in gids]
    for i in range(start, n):
        got = pool.get_cached(hashes[i], gids)
        if got is None:
            break
        for lst, b in zip(out, got):
            lst.append(b)
    return out


def hit_mamba(pool, hashes, max_len, gids, B):
    out = [[] for _ in gids]
    for i in range(max_len // B - 1, -1, -1):   # the last saved state wins
        got = pool.get_cached(hashes[i], gids)
        if got is not None:
            for lst, b in zip(out, got):
                lst.extend([NULL] * i)
                lst.append(b)
            break
    return out


class Coordinator:
    def __init__(self, groups, B):
        self.groups, self.B = groups, B
        types = []                        # [spec, [group ids]] in first-seen order
        for g, spec in enumerate(groups):
            for t in types:
                if t[0] == spec:
                    t[1].append(g)
                    break
            else:
                types.append([spec, [g]])
        # full attention first (a stable sort, as vLLM's sorted())
        self.types = sorted(types, key=lambda t: t[0][0] != "full")
        self.simple = len(self.types) == 2 and self.types[0][0][0] == "full"

    def _find(self, pool, spec, gids, hashes, max_len):
        kind, p = spec
        if kind == "full":
            return hit_full(pool, hashes, max_len, gids, self.B)
        if kind == "sw":
            return hit_sw(pool, hashes, max_len, gids, self.B, p)
        if kind == "chunk":
            return hit_chunk(pool, hashes, max_len, gids, self.B, p)
        return hit_mamba(pool, hashes, max_len, gids, self.B)

    def find_longest_cache_hit(self, pool, hashes, max_len):
        B = self.B
        per_group = [None] * len(self.groups)
        self.longest = None               # the first type's own hit (junction)
        if len(self.types) == 1:          # UnitaryKVCacheCoordinator
            spec, gids = self.types[0]
            got = self._find(pool, spec, gids, hashes, max_len)
            for g, lst in zip(gids, got):
                per_group[g] = lst
            self.longest = len(got[0]) * B
            return per_group, len(got[0]) * B
        hit = max_len
        while True:                       # HybridKVCacheCoordinator fixed point
            cur = hit
            for spec, gids in self.types:
                if spec[0] == "full" and per_group[gids[0]] is not None:
                    cur = cur // B * B    # full attention: downward closed
                    continue
                got = self._find(pool, spec, gids, hashes, cur)
                cur = len(got[0]) * B
                if self.longest is None:
                    self.longest = cur
                for g, lst in zip(gids, got):
                    per_group[g] = lst
            if cur >= hit:
                break
            hit = cur
            if self.simple:
                break
        spec, gids = self.types[0]
        if spec[0] == "full":
            for g in gids:
                del per_group[g][hit // B:]
        return [lst if lst is not None else [] for lst in per_group], hit


class Request:
    """The per-request state of every single-type manager, and the step
    functions of KVCacheManager.allocate_slots."""

    def __init__(self, groups, B, pool, hashes, L, sparse=False):
        n = len(groups)
        self.groups, self.B, self.pool, self.hashes, self.L = groups, B, pool, hashes, L
        self.sparse = sparse              # prefix_cache_retention_interval 0
        self.junction = 0                 # request.shared_prefix_boundary
        self.table = [[] for _ in range(n)]
        self.ncached = [None] * n         # num_cached_block; None = no entry
        self.last_state = [None] * n      # MambaManager.last_state_block_idx
        self.mamba_allocated = [False] * n
        self.held = [0] * n
        self.alloc = [0] * n
        self.peak = [0] * n
        self.peak_total = 0

    # -- remove_skipped_blocks
    def remove_skipped(self, g, n):
        kind, p = self.groups[g]
        B, table = self.B, self.table[g]
        ns = skipped_tokens(kind, p, n)
        if ns > 0:
            removed = []
            for i in range(min(ns // B, len(table)) - 1, -1, -1):
                if table[i] is NULL:
                    break
                removed.append(table[i])
                table[i] = NULL
            self.pool.free(removed)
            self.held[g] -= len(removed)
        if kind == "mamba-align":         # the state two steps back
            lsi = self.last_state[g]
            if lsi is not None and lsi < cdiv(n, B) - 1 and table[lsi] is not NULL:
                self.pool.free([table[lsi]])
                table[lsi] = NULL
                self.held[g] -= 1

    # -- get_num_blocks_to_allocate
    def blocks_to_allocate(self, g, num_tokens, new_computed, total_computed):
        kind, p = self.groups[g]
        B, table = self.B, self.table[g]
        if kind == "mamba-align":
            n = cdiv(num_tokens, B) - len(new_computed) - len(table)
            if n > 0:
                n = 1
            return n + sum(1 for b in new_computed if not b.is_null and b.ref == 0)
        required = cdiv(num_tokens, B)
        if self.ncached[g] is not None:   # a running request: no new hits
            return max(required - len(table), 0)
        nsb = skipped_tokens(kind, p, total_computed) // B
        n = max(required - max(nsb, len(new_computed) + len(table)), 0)
        skip = max(0, nsb - len(table))
        return n + sum(1 for b in new_computed[skip:] if not b.is_null and b.ref == 0)

    # -- allocate_new_computed_blocks
    def add_hit(self, g, new_computed, computed):
        if self.ncached[g] is not None:
            return
        kind, p = self.groups[g]
        nsb = skipped_tokens(kind, p, computed) // self.B
        if nsb > 0:
            new_computed = new_computed[nsb:]
        self.pool.touch(new_computed)
        self.held[g] += sum(1 for b in new_computed if not b.is_null)
        self.table[g].extend([NULL] * max(nsb, 0))
        self.table[g].extend(new_computed)
        self.ncached[g] = len(self.table[g])

    # -- allocate_new_blocks
    def allocate(self, g, num_tokens):
        kind, B, table = self.groups[g][0], self.B, self.table[g]
        required = cdiv(num_tokens, B)
        if kind != "mamba-align":       # "all" mode allocates as attention
            n = required - len(table)
            if n > 0:
                table.extend(self.pool.get_new(n))
                self.held[g] += n
                self.alloc[g] += n
            return
        if required == len(table):
            return
        prev = len(table)
        if self.mamba_allocated[g] or prev > 0:
            self.last_state[g] = prev - 1
        if prev < required - 1:
            table.extend([NULL] * (required - 1 - prev))
        n = required - len(table)
        table.extend(self.pool.get_new(n))
        self.held[g] += n
        self.alloc[g] += n
        self.mamba_allocated[g] = True

    # -- cache_blocks
    def cache(self, g, num_tokens):
        nc = self.ncached[g] or 0
        nf = num_tokens // self.B
        if nc >= nf:
            return
        self.pool.cache_full_blocks(self.table[g], nc, nf, self.hashes, g, self.mask(g))
        self.ncached[g] = nf

    # -- reachable_block_mask with prefix_cache_retention_interval 0: a
    # sliding-window group keeps the cdiv(W - 1, B) blocks ending at each
    # replay boundary, a Mamba group the state block ending there; the
    # boundaries are the prompt's last token (L - 1) and the shared-prefix
    # junction. None (cache every block) for other kinds and when dense.
    def mask(self, g):
        kind, p = self.groups[g]
        if not self.sparse or kind not in ("sw", "mamba", "mamba-align"):
            return None
        B = self.B
        bounds = [self.L - 1] + ([self.junction] if self.junction else [])
        if kind == "sw":
            need = cdiv(p - 1, B)
            ranges = [(b // B - need, b // B) for b in bounds]
            return lambda i: any(lo <= i < hi for lo, hi in ranges)
        keep = set(b // B - 1 for b in bounds)
        return lambda i: i in keep

    # -- KVCacheManager.allocate_slots; False when the blocks are not there
    def allocate_slots(self, computed, num_new, hit_blocks, hit, num_tokens_now):
        total = computed + hit
        need_slots = total + num_new
        G = range(len(self.groups))
        for g in G:
            self.remove_skipped(g, total)
        empty = []
        need = sum(self.blocks_to_allocate(g, need_slots, hit_blocks[g] if hit_blocks else empty,
                                           total) for g in G)
        if need > self.pool.num_free():
            return False
        if hit_blocks is not None and hit > 0:
            for g in G:
                self.add_hit(g, hit_blocks[g], total)
        for g in G:
            self.allocate(g, need_slots)
        to_cache = min(total + num_new, num_tokens_now)
        for g in G:
            self.cache(g, to_cache)
        s = 0
        for g in G:
            s += self.held[g]
            if self.held[g] > self.peak[g]:
                self.peak[g] = self.held[g]
        if s > self.peak_total:
            self.peak_total = s
        return True

    def free(self):
        for g in range(len(self.groups)):   # group order, tail first
            self.pool.free(reversed(self.table[g]))
            self.table[g] = []


def mamba_split(L, B, computed, num_new):
    """Scheduler._mamba_block_aligned_split for a prefill step."""
    last = L - L % B
    after = computed + num_new
    if after < last:
        return num_new // B * B
    if computed < last < after:
        return last - computed
    return num_new


def run_request(groups, coord, B, pool, hashes, L, O, mbt, has_mamba, sparse=False):
    """All steps of one request; None if a step could not get its blocks."""
    req = Request(groups, B, pool, hashes, L, sparse)
    hit_blocks, hit = coord.find_longest_cache_hit(pool, hashes, L - 1)
    # get_computed_blocks' junction: where the longest single-type hit
    # ends, when it is longer than the hit every group can serve
    if coord.longest is not None and coord.longest > hit:
        req.junction = coord.longest
    computed, first = 0, True
    while computed + (hit if first else 0) < L:          # prefill chunks
        start = computed + (hit if first else 0)
        num_new = L - start
        if mbt:
            num_new = min(num_new, mbt)
        if has_mamba:
            num_new = mamba_split(L, B, start, num_new)
        if num_new <= 0:
            return None
        if not req.allocate_slots(computed, num_new, hit_blocks if first else None,
                                  hit if first else 0, L):
            return None
        computed = start + num_new
        first = False
    for m in range(O):                                    # decode, W1: every output
        if not req.allocate_slots(computed, 1, None, 0, L + m + 1):
            return None
        computed += 1
    req.free()
    return req, hit


def replay(records, groups, B, capacity, mbt=0, dedup=True, sparse=False):
    pool = Pool(capacity, dedup)
    coord = Coordinator(groups, B)
    has_mamba = any(k == "mamba-align" for k, _ in groups)   # the aligned split
    n = len(groups)
    res = dict(requests=0, prompt_tokens=0, hit_tokens=0, refused=0,
               blocks_allocated=0, blocks_allocated_per_group=[0] * n,
               peak_blocks_held=0, peak_blocks_held_per_group=[0] * n)
    for r, rec in enumerate(records):
        prompt, out = request_tokens(r, rec)
        L, O = len(prompt), len(out)
        res["requests"] += 1
        res["prompt_tokens"] += L
        if L == 0:
            continue
        hashes = block_hashes(prompt + out, B)
        # blocks held never exceed a full table per group; if even that
        # fits there is nothing to check, else a dry run on counts decides.
        # A chunk limit below one block stalls a mamba-align prompt (the
        # aligned split rounds its chunk down to 0 tokens: vLLM would never
        # schedule it); the dry run finds that too, and it is refused.
        if n * cdiv(L + O, B) > capacity or (has_mamba and 0 < mbt < B):
            dry = run_request(groups, coord, B, DryPool(pool), hashes, L, O, mbt, has_mamba, sparse)
            if dry is None:
                res["refused"] += 1
                continue
        got = run_request(groups, coord, B, pool, hashes, L, O, mbt, has_mamba, sparse)
        assert got is not None, "dry run and run disagree"
        req, hit = got
        assert pool.num_free() == capacity, "blocks leaked"
        res["hit_tokens"] += hit
        for g in range(n):
            res["blocks_allocated_per_group"][g] += req.alloc[g]
            res["peak_blocks_held_per_group"][g] = max(res["peak_blocks_held_per_group"][g],
                                                       req.peak[g])
        res["peak_blocks_held"] = max(res["peak_blocks_held"], req.peak_total)
    res["blocks_allocated"] = sum(res["blocks_allocated_per_group"])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--groups", help="comma list of full, sw:W, chunk:C, mamba, mamba-align")
    ap.add_argument("--mix", choices=sorted(MIXES), help="a named group list")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=16384)
    ap.add_argument("--max-num-batched-tokens", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-dedup", action="store_true",
                    help="vLLM's rule: a block that fills with registered content stays")
    ap.add_argument("--prefix-cache-retention-interval", default="0", choices=["none", "0"],
                    help="vLLM's setting: 0 (its default since 2026-08) caches only what a "
                         "hit at a replay boundary can use in sliding-window and Mamba "
                         "groups; none caches every full block (dense)")
    a = ap.parse_args()
    if (a.groups is None) == (a.mix is None):
        ap.error("give exactly one of --groups and --mix")
    try:
        groups = parse_groups(a.groups if a.groups is not None else MIXES[a.mix])
    except ValueError as e:
        ap.error("--groups: %s" % e)
    if a.block_size <= 0:
        ap.error("--block-size must be at least 1")
    if a.capacity <= 0:
        ap.error("--capacity must be at least 1")
    if a.max_num_batched_tokens < 0:
        ap.error("--max-num-batched-tokens must be positive")
    if a.limit < 0:
        ap.error("--limit must not be negative")
    records = read_trace(a.trace, a.limit)
    sparse = a.prefix_cache_retention_interval == "0"
    out = replay(records, groups, a.block_size, a.capacity, a.max_num_batched_tokens,
                 not a.no_dedup, sparse)
    out.update(groups=",".join(k if not p else "%s:%d" % (k, p)
                               for k, p in groups),
               block_size=a.block_size, capacity=a.capacity,
               max_num_batched_tokens=a.max_num_batched_tokens, dedup=not a.no_dedup,
               prefix_cache_retention_interval=a.prefix_cache_retention_interval)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print("%-28s %s" % (k, v))


if __name__ == "__main__":
    main()
