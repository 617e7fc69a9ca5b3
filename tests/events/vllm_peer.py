#!/usr/bin/python3
"""A vLLM peer for kvbm's event tests, written from vLLM's wire description
(vllm/distributed/kv_events.py), with python3-zmq and python3-msgpack only.

  engine MODE...   plays a vLLM engine: binds a PUB and a replay ROUTER on
                   loopback, prints "PUB_ENDPOINT REPLAY_ENDPOINT", waits for
                   "go" on stdin, publishes deterministic batches (some not
                   sent live, to force replay), serves replay, and on
                   "check FILE" compares FILE (kvbm's decoded events, one JSON
                   line per event) with what it sent; exit 0 when equal.
  subscribe EP REPLAY N EXPECTED
                   plays a vLLM subscriber: prints "ready" once subscribed,
                   reads N batches (replaying gaps), decodes them with msgpack
                   and compares field by field with EXPECTED (kvbm's record
                   of what it published, same JSON line format).

Event JSON lines: {"seq", "ts", "dp_rank", "type", "block_hashes", ...} with
hashes as unsigned 64-bit integers.
"""
import json
import random
import struct
import sys
import time

import msgpack
import zmq

MASK = (1 << 64) - 1
END_SEQ = b"\xff" * 8


def canon_hash(h):
    """vLLM hashes: int (any sign) or bytes (low 64 bits, big-endian)."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h, "big") & MASK
    return h & MASK


STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                 "lora_id", "medium", "lora_name", "extra_keys", "group_idx"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]


def canon_event(ev):
    """A decoded wire event (positional list or map) -> canonical dict."""
    if isinstance(ev, list):
        tag = ev[0]
        names = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, [])
        d = dict(zip(names, ev[1:]))
    else:
        d = dict(ev)
        tag = d.pop("type")
    out = {"type": tag}
    if tag in ("BlockStored", "BlockRemoved"):
        out["block_hashes"] = [canon_hash(h) for h in d["block_hashes"]]
        out["medium"] = d.get("medium")
        if d.get("group_idx") is not None:
            out["group_idx"] = d["group_idx"]
    if tag == "BlockStored":
        p = d["parent_block_hash"]
        out["parent_block_hash"] = None if p is None else canon_hash(p)
        out["token_ids"] = list(d["token_ids"])
        out["block_size"] = d["block_size"]
        out["lora_id"] = d.get("lora_id")
        out["lora_name"] = d.get("lora_name")
    return out


def canon_batch(payload, seq):
    b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if isinstance(b, dict):
        ts, events, dp = b["ts"], b["events"], b.get("data_parallel_rank")
    else:
        ts, events = b[0], b[1]
        dp = b[2] if len(b) > 2 else None
    return [dict(canon_event(e), seq=seq, ts=ts, dp_rank=dp) for e in events]


def canon_line(d):
    """kvbm's JSON line -> the same canonical dict (drops event_id)."""
    d = dict(d)
    d.pop("event_id", None)
    if d.get("group_idx") is None:
        d.pop("group_idx", None)
    if d["type"] == "AllBlocksCleared":
        return {k: d[k] for k in ("type", "seq", "ts", "dp_rank")}
    return d


def compare(sent, got_lines, events_only=False):
    got = [canon_line(json.loads(l)) for l in got_lines if l.strip()]
    if events_only:  # a relay re-batches: batch fields are its own
        strip = lambda d: {k: v for k, v in d.items() if k not in ("seq", "ts", "dp_rank")}
        sent, got = [strip(d) for d in sent], [strip(d) for d in got]
    if len(got) != len(sent):
        print(f"event count: sent {len(sent)}, kvbm has {len(got)}", file=sys.stderr)
        return False
    for i, (a, b) in enumerate(zip(sent, got)):
        for k in sorted(set(a) | set(b)):
            va, vb = a.get(k), b.get(k)
            if k == "ts":
                ok = abs(va - vb) <= 1e-6 * max(1.0, abs(va))
            else:
                ok = va == vb
            if not ok:
                print(f"event {i} field {k}: sent {va!r}, kvbm has {vb!r}", file=sys.stderr)
                return False
    return True


# ---------------------------------------------------------------- engine

def make_event(rng, form, hashes, k):
    def h():
        if hashes == "bytes":
            return bytes(rng.getrandbits(8) for _ in range(32))
        v = rng.getrandbits(64)
        return v - (1 << 64) if (k % 3 == 0 and v >= 1 << 63) else v  # some negative

    kind = rng.choice(["stored", "stored", "stored", "removed", "cleared"])
    if kind == "stored":
        n = rng.randint(1, 4)
        bs = 16
        medium = rng.choice(["GPU", "CPU", None, "NVME_X"])
        fields = [[h() for _ in range(n)], rng.choice([None, h()]),
                  [rng.getrandbits(32) if rng.random() < 0.1 else rng.randint(0, 200000)
                   for _ in range(n * bs)],
                  bs, rng.choice([None, 0, 7, -1]), medium, rng.choice([None, "lora-a"])]
        extra = [None, rng.choice([None, 0, 2])] if rng.random() < 0.5 else []
        fields += extra
        if form == "positional":
            return ["BlockStored"] + fields + (["unknown-future-field", {"x": 1}] if extra else [])
        d = dict(zip(STORED_FIELDS, fields))
        d["some_future_key"] = [1, 2, {"a": None}]
        return dict(type="BlockStored", **d)
    if kind == "removed":
        fields = [[h() for _ in range(rng.randint(1, 5))], rng.choice(["GPU", "DISK", None])]
        if form == "positional":
            return ["BlockRemoved"] + fields
        return dict(type="BlockRemoved", **dict(zip(REMOVED_FIELDS, fields)))
    return ["AllBlocksCleared"] if form == "positional" else {"type": "AllBlocksCleared"}


def engine(args):
    form, hashes, nbatches = args[0], args[1], int(args[2])
    skip = {int(x) for x in args[3].split(",") if x} if len(args) > 3 else set()
    batch_map = len(args) > 4 and args[4] == "batch-map"
    rng = random.Random(1234 + nbatches)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port} tcp://127.0.0.1:{rport}", flush=True)
    buffer, sent = [], []
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)

    def serve_replay():
        frames = router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, payload in buffer:
            if seq >= start:
                router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b"", END_SEQ, b""])

    published = False
    while True:
        for sock, _ in poller.poll(20):
            if sock is router:
                serve_replay()
                continue
            line = sys.stdin.readline()
            if not line:
                return 1
            cmd = line.split()
            if cmd and cmd[0] == "go" and not published:
                published = True
                for seq in range(nbatches):
                    events = [make_event(rng, form, hashes, k) for k in range(rng.randint(1, 6))]
                    ts = time.time()
                    dp = 2
                    if batch_map:
                        obj = {"ts": ts, "events": events, "data_parallel_rank": dp}
                    else:
                        obj = [ts, events, dp]
                    payload = msgpack.packb(obj, use_bin_type=True)
                    buffer.append((seq, payload))
                    sent.extend(canon_batch(payload, seq))
                    if seq not in skip:
                        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
                    time.sleep(0.002)
                # a last live batch makes a gap at the end visible too
            elif cmd and cmd[0] in ("check", "checkev"):
                with open(cmd[1]) as f:
                    ok = compare(sent, f.readlines(), events_only=cmd[0] == "checkev")
                print("OK" if ok else "MISMATCH", flush=True)
                return 0 if ok else 1


# ------------------------------------------------------------ subscriber

def subscribe(args):
    ep, rep, n, expected = args[0], args[1], int(args[2]), args[3]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep)
    time.sleep(0.3)  # let the subscription reach the publisher
    print("ready", flush=True)
    batches = {}
    deadline = time.time() + 20
    while len(batches) < n and time.time() < deadline:
        if sub.poll(200):
            topic, seqb, payload = sub.recv_multipart()
            if len(seqb) != 8:
                print("bad sequence frame", file=sys.stderr)
                return 1
            batches[int.from_bytes(seqb, "big")] = payload
        elif rep != "-":
            missing = [s for s in range(n) if s not in batches]
            if missing:  # replay what the live socket did not bring
                req = ctx.socket(zmq.DEALER)
                req.connect(rep)
                req.send_multipart([b"", missing[0].to_bytes(8, "big")])
                while req.poll(2000):
                    _, seqb, payload = req.recv_multipart()
                    if seqb == END_SEQ:
                        break
                    batches.setdefault(int.from_bytes(seqb, "big"), payload)
                req.close(0)
    if sorted(batches) != list(range(n)):
        print(f"got batches {sorted(batches)[:10]}..., wanted 0..{n - 1}", file=sys.stderr)
        return 1
    got = []
    for seq in range(n):
        got.extend(canon_batch(batches[seq], seq))
    with open(expected) as f:
        ok = compare(got, f.readlines())
    print("OK" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    mode = sys.argv[1]
    sys.exit(engine(sys.argv[2:]) if mode == "engine" else subscribe(sys.argv[2:]))
