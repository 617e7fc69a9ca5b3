#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The engine and the judge of tests/events/test_cli_coalesce.sh
(`kvbm events relay --coalesce`), with python3-zmq and python3-msgpack only.

The engine sends what a kvbm pool link sends: one block an event. Each of
its batches is one request's prompt registered block by block (chained
one-block BlockStored events: each one's parent is the block before it),
and, from the third request on, a pool at capacity evicting a block of
an older request before each block it registers (one-block BlockRemoved
events alternating with the stores). One request changes medium in the
middle of its chain (GPU then CPU), which coalescing must not merge
across. Odd requests continue the previous request's chain (their first
parent is its last hash), so a run may continue across engine batches
when the relay's publisher batches them together.

The wire is the positional one SGLang and older vLLM speak: EventBatch
[ts, events, dp_rank], ["BlockStored", hashes, parent, tokens,
block_size, lora_id, medium] and ["BlockRemoved", hashes, medium]; replay
as their ROUTER answers it ([identity, "", seq, payload], then seq -1).

  engine NREQ SENT_JSON
        writes the one-block events it will send to SENT_JSON, binds a PUB
        and a replay ROUTER on loopback, prints "PUB_ENDPOINT
        REPLAY_ENDPOINT", waits for "go" on stdin, sends NREQ batches and
        serves replay until stdin closes.
  check SENT_JSON RELAYED_JSONL MODE
        waits (up to 120 s) until RELAYED_JSONL (`kvbm events tail` lines)
        holds every sent block, then judges it. MODE "exact": the relayed
        events are the sent ones, one for one, in order. MODE "coalesced":
        fewer events than sent, at least one of several blocks, and
        exactly the same blocks: the stored hashes in order, their tokens
        in order, each stored event a chain (its first block's parent is
        the event's parent, each next block's parent the block before),
        one medium an event, the removed hashes in order, and every hash's
        store before its removal. Prints "OK" or what differs, exits 0/1.
"""
import json
import sys
import time

import msgpack
import zmq

B = 4  # tokens a block
CHAIN = 8  # blocks a request
DP = 2
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MASK = (1 << 64) - 1


def block_hash(req, i):
    return ((req * 1000 + i + 1) * 0x9E3779B97F4A7C15) & MASK


def stream(nreq):
    """The batches: lists of one-block events as dicts (the judge's form)."""
    batches, last = [], None
    for r in range(nreq):
        parent = last if r % 2 else None
        evs = []
        for i in range(CHAIN):
            if r >= 2:  # at capacity: evict a block of request r - 2 first
                evs.append({"type": "BlockRemoved", "hash": block_hash(r - 2, i), "medium": "GPU"})
            h = block_hash(r, i)
            medium = "CPU" if r == 3 and i >= CHAIN // 2 else "GPU"
            evs.append({"type": "BlockStored", "hash": h, "parent": parent,
                        "tokens": [(r * 97 + i * B + t) % 50000 for t in range(B)],
                        "medium": medium})
            parent = h
        last = parent
        batches.append(evs)
    return batches


def wire(ev):
    if ev["type"] == "BlockRemoved":
        return ["BlockRemoved", [ev["hash"]], ev["medium"]]
    return ["BlockStored", [ev["hash"]], ev["parent"], ev["tokens"], B, None, ev["medium"]]


def engine(nreq, sent_path):
    batches = stream(nreq)
    with open(sent_path, "w") as f:  # before the endpoints: the judge may read it at once
        json.dump([e for evs in batches for e in evs], f)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port} tcp://127.0.0.1:{rport}", flush=True)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    kept = []
    while True:
        for sock, _ in poller.poll(20):
            if sock is router:
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue
                ident, _, start = frames
                start = int.from_bytes(start, "big")
                for seq, payload in kept:
                    if seq >= start:
                        router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
                router.send_multipart([ident, b"", END_SEQ, b""])
                continue
            line = sys.stdin.readline()
            if not line:
                return 0
            if line.split() == ["go"] and not kept:
                for seq, evs in enumerate(batches):
                    payload = msgpack.packb([time.time(), [wire(e) for e in evs], DP])
                    kept.append((seq, payload))
                    pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
                    time.sleep(0.002)


def read_relayed(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):  # a line tail is still writing waits
                out.append(json.loads(line))
    return out


def judge(sent, got, mode):
    if any(e.get("dp_rank") != DP for e in got):
        return "an event lost the engine's dp_rank"
    if mode == "exact":
        if len(got) != len(sent):
            return f"{len(got)} events relayed, {len(sent)} sent"
        for k, (s, g) in enumerate(zip(sent, got)):
            if g["type"] != s["type"] or g["block_hashes"] != [s["hash"]] or g["medium"] != s["medium"]:
                return f"event {k}: {g} is not {s}"
            if s["type"] == "BlockStored" and (g["parent_block_hash"] != s["parent"]
                                               or g["token_ids"] != s["tokens"]):
                return f"event {k}: {g} is not {s}"
        return None
    if len(got) >= len(sent) or max(len(g["block_hashes"]) for g in got) < 2:
        return f"not coalesced: {len(got)} events for {len(sent)} one-block events"
    by_hash = {s["hash"]: s for s in sent if s["type"] == "BlockStored"}
    stored, tokens, removed, order = [], [], [], []
    for k, g in enumerate(got):
        hs = g["block_hashes"]
        order += [(g["type"], h) for h in hs]
        if g["type"] == "BlockRemoved":
            removed += hs
            if g["medium"] != "GPU":
                return f"event {k}: medium {g['medium']}"
            continue
        if g["type"] != "BlockStored":
            return f"event {k}: unexpected {g['type']}"
        stored += hs
        tokens += g["token_ids"]
        if hs[0] not in by_hash or g["parent_block_hash"] != by_hash[hs[0]]["parent"]:
            return f"event {k}: parent {g['parent_block_hash']} is not its first block's"
        for a, b in zip(hs, hs[1:]):
            if b not in by_hash or by_hash[b]["parent"] != a:
                return f"event {k}: {b} does not continue {a} (not a chain)"
        if any(h not in by_hash or by_hash[h]["medium"] != g["medium"] for h in hs):
            return f"event {k}: blocks of another medium than {g['medium']} merged"
    want_stored = [s["hash"] for s in sent if s["type"] == "BlockStored"]
    want_tokens = [t for s in sent if s["type"] == "BlockStored" for t in s["tokens"]]
    want_removed = [s["hash"] for s in sent if s["type"] == "BlockRemoved"]
    if stored != want_stored:
        return "the stored hashes differ (or their order)"
    if tokens != want_tokens:
        return "the stored tokens differ (or their order)"
    if removed != want_removed:
        return "the removed hashes differ (or their order)"
    pos = {x: i for i, x in enumerate(order)}
    for h in want_removed:
        if h in by_hash and pos[("BlockStored", h)] > pos[("BlockRemoved", h)]:
            return f"{h} removed before it was stored"
    return None


def check(sent_path, relayed_path, mode):
    with open(sent_path) as f:
        sent = json.load(f)
    end = time.monotonic() + 120
    while True:
        got = read_relayed(relayed_path)
        if sum(len(g.get("block_hashes", [])) for g in got) >= len(sent) or time.monotonic() > end:
            break
        time.sleep(0.1)
    why = judge(sent, got, mode)
    print(why or f"OK {len(sent)} one-block events relayed as {len(got)}", flush=True)
    return 1 if why else 0


if __name__ == "__main__":
    if sys.argv[1] == "engine":
        sys.exit(engine(int(sys.argv[2]), sys.argv[3]))
    sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))
