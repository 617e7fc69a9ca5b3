#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The engines' side of kvbm's event tests, with python3-zmq and
python3-msgpack only. Every shape below is written from the engines' own
sources (read, not copied):

  vLLM   vllm/distributed/kv_events.py: msgspec structs, tag=True,
         omit_defaults=True; EventBatch [ts, events, data_parallel_rank]
         (array_like). The events were array_like (positional) until PR
         #42892; since then they are tagged maps. Fields grew over time:
           v0.8   BlockStored(block_hashes, parent_block_hash, token_ids,
                  block_size, lora_id); BlockRemoved(block_hashes);
                  EventBatch [ts, events] (no rank)
           v0.10  + medium (required), lora_name (required), a dp rank
           v0.2x  + extra_keys, group_idx, kv_cache_spec_kind,
                  kv_cache_spec_sliding_window (defaults, omitted when
                  trailing); bytes hashes (ExternalBlockHash)
           map    the same as tagged maps (#42892), + locality (#48281),
                  ownership (#52067); media GPU, CPU, FS, OBJ, STORAGE
  SGLang srt/disaggregation/kv_events.py: EventBatch [ts, events,
         attn_dp_rank] (array_like, no omit_defaults: always 3 long);
           positional  BlockStored(block_hashes, parent_block_hash,
                  token_ids, block_size, lora_id, medium), and
                  BlockStoredWithMetadata = the same + a map
                  {"cache_salt": ..., "session_id": ...} at index 7;
                  media GPU, CPU_PINNED, DISK, EXTERNAL (CPU_TIER1/2
                  before); EAGLE radix keys make token_ids pairs
                  [[t0, t1], [t1, t2], ...]
           map    tagged maps with omit_defaults: medium, cache_salt,
                  session_id only when set
  Dynamo lib/kv-router/src/zmq_wire: reads both forms, hashes as signed
         int64 (its Python API) or unsigned, tags it does not know as
         "Ignored".

Replay (vLLM's ROUTER): a request [identity, "", start_seq] is answered
with [identity, "", topic, seq, payload] per kept batch and [identity, "",
"", -1, ""] at the end (vLLM since PR #45177: the "vllm" profile), or
[identity, "", seq, payload] and [identity, "", -1, ""] (older vLLM and
SGLang: every other profile).

  engine PROFILE HASHES NBATCHES SKIP [batch-map]
        plays an engine: binds a PUB and a replay ROUTER on loopback, prints
        "PUB_ENDPOINT REPLAY_ENDPOINT", waits for "go" on stdin, publishes
        NBATCHES deterministic batches (those in SKIP, "3,4", are not sent
        live: replay has them), serves replay, and on "check FILE" (or
        "checkev FILE": events and dp_rank only, for a relay that
        re-batches) compares FILE (kvbm's events as JSON lines) with what it
        sent; "skipped" prints how many events it sent that kvbm must skip.
        PROFILE: vllm-v0.8 vllm-v0.10 vllm-v0.2x vllm sglang-positional
        sglang dynamo; HASHES: int or bytes.
  subscribe EP REPLAY N EXPECTED FORM [signed]
        plays a subscriber of kvbm's publisher: prints "ready", reads N
        batches (replaying gaps), checks every payload against the schema
        a typed vLLM consumer (msgspec, FORM map or positional) reads, and
        compares field by field with EXPECTED (kvbm's record).

Event JSON lines: {"seq", "ts", "dp_rank", "type", "block_hashes", ...} with
hashes as unsigned 64-bit integers, as `kvbm events tail` prints them.
"""
import json
import random
import sys
import time

import msgpack
import zmq

MASK = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)

# Field order of the positional (array_like) BlockStored after the tag, by
# engine; index 7 is vLLM's lora_name or SGLang's metadata map.
VLLM_STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
               "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
               "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
VLLM_REMOVED = ["block_hashes", "medium", "group_idx"]
REQUIRED_MAP = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                "lora_id", "medium", "lora_name"],
                "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}
OPTIONAL = ["extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
            "locality", "ownership", "cache_salt"]


def canon_hash(h):
    """int (any sign) or bytes (low 64 bits, big-endian) -> unsigned."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h, "big") & MASK
    return h & MASK


def jsonish(v):
    """A msgpack value as kvbm prints it in JSON: bytes as hex, tuples as
    lists, keys as strings."""
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [jsonish(x) for x in v]
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else json.dumps(jsonish(k))): jsonish(x)
                for k, x in v.items()}
    return v


def flat_tokens(t):
    """SGLang's pairs [[t0, t1], [t1, t2]] -> [t0, t1, t2] (Dynamo's reading)."""
    if t and isinstance(t[0], (list, tuple)):
        return [p[0] for p in t] + [t[-1][1]], True
    return list(t), False


def canon_event(ev):
    """A wire event (positional list or map) -> the dict kvbm's JSON line
    holds for it."""
    extras = {}
    if isinstance(ev, (list, tuple)):
        tag = ev[0]
        names = {"BlockStored": VLLM_STORED, "BlockRemoved": VLLM_REMOVED}.get(tag, [])
        d = dict(zip(names, ev[1:]))
        if isinstance(d.get("lora_name"), dict):  # SGLang's metadata map
            meta = dict(d.pop("lora_name"))
            if "cache_salt" in meta:
                d["cache_salt"] = meta.pop("cache_salt")
            extras.update(meta)
    else:
        d = dict(ev)
        tag = d.pop("type")
        known = set(VLLM_STORED) | set(OPTIONAL)
        extras.update({k: v for k, v in d.items() if k not in known})
    out = {"type": tag}
    if tag not in ("BlockStored", "BlockRemoved"):
        return out
    out["block_hashes"] = [canon_hash(h) for h in d["block_hashes"]]
    out["medium"] = d.get("medium")
    if d.get("group_idx") is not None:
        out["group_idx"] = d["group_idx"]
    for k in ("locality", "ownership"):
        if d.get(k) is not None:
            out[k] = d[k]
    if extras:
        out["extras"] = jsonish(extras)
    if tag == "BlockRemoved":
        return out
    p = d.get("parent_block_hash")
    out["parent_block_hash"] = None if p is None else canon_hash(p)
    out["token_ids"], pairs = flat_tokens(d["token_ids"])
    if pairs:
        out["token_pairs"] = True
    out["block_size"] = d["block_size"]
    out["lora_id"] = d.get("lora_id")
    out["lora_name"] = d.get("lora_name")
    for k in ("cache_salt", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"):
        if d.get(k) is not None:
            out[k] = d[k]
    if d.get("extra_keys") is not None:
        out["extra_keys"] = jsonish(d["extra_keys"])
    return out


def batch_parts(b):
    if isinstance(b, dict):
        return b["ts"], b["events"], b.get("data_parallel_rank")
    return b[0], b[1], (b[2] if len(b) > 2 else None)


def canon_batch(payload, seq, bad=()):
    """What kvbm decodes of a payload: every event but the `bad` ones."""
    ts, events, dp = batch_parts(msgpack.unpackb(payload, raw=False, strict_map_key=False))
    return [dict(canon_event(e), seq=seq, ts=ts, dp_rank=dp)
            for i, e in enumerate(events) if i not in bad]


def canon_line(d):
    """kvbm's JSON line -> the canonical dict (drops event_id)."""
    d = dict(d)
    d.pop("event_id", None)
    if d["type"] == "AllBlocksCleared":
        return {k: d[k] for k in ("type", "seq", "ts", "dp_rank") if k in d}
    return d


def compare(sent, got_lines, events_only=False):
    got = [canon_line(json.loads(l)) for l in got_lines if l.strip()]
    if events_only:  # a relay re-batches: sequence and time are its own
        strip = lambda d: {k: v for k, v in d.items() if k not in ("seq", "ts")}
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


# ---------------------------------------------------------------- engines

class Gen:
    """Deterministic events of one engine's profile."""

    def __init__(self, profile, hashes, seed):
        self.p, self.hashes, self.rng = profile, hashes, random.Random(seed)
        self.bad = 0

    def h(self):
        r = self.rng
        if self.hashes == "bytes":
            return bytes(r.getrandbits(8) for _ in range(32))
        v = r.getrandbits(64)
        if self.p == "dynamo" and v >= 1 << 63:  # Dynamo's Python API: int64
            return v - (1 << 64)
        return v

    def tokens(self, n):
        r = self.rng
        return [r.getrandbits(32) if r.random() < 0.1 else r.randint(0, 200000) for _ in range(n)]

    def medium(self):
        r = self.rng
        return r.choice({
            "vllm-v0.10": ["GPU", "CPU", None],
            "vllm-v0.2x": ["GPU", "CPU", None, "NVME_X"],
            "vllm": ["GPU", "CPU", "FS", "OBJ", "STORAGE", None],
            "sglang-positional": ["GPU", "CPU_PINNED", "CPU_TIER1", "CPU_TIER2", "DISK",
                                  "EXTERNAL", None],
            "sglang": ["GPU", "CPU_PINNED", "DISK", "EXTERNAL", None],
            "dynamo": ["GPU", "CPU", "DEVICE", "NVME", "NETWORK", "SHARED", "", None],
        }.get(self.p, ["GPU"]))

    def extra_keys(self, n):
        r = self.rng
        choices = [None, ("mm-hash-1", 0), ("lora-a",), ("salt-x",), (b"\x01\x02", -3, 1.5)]
        return [r.choice(choices) for _ in range(n)]

    def stored(self):
        r = self.rng
        n = r.randint(1, 4)
        bs = 16
        hashes = [self.h() for _ in range(n)]
        parent = r.choice([None, self.h()])
        d = {"block_hashes": hashes, "parent_block_hash": parent, "block_size": bs,
             "lora_id": r.choice([None, 0, 7, -1])}
        p = self.p
        if p.startswith("sglang") and r.random() < 0.3:  # EAGLE: bigram keys
            t = self.tokens(n * bs + 1)
            d["token_ids"] = [[t[i], t[i + 1]] for i in range(n * bs)]
        else:
            d["token_ids"] = self.tokens(n * bs)
        if p == "vllm-v0.8":
            return ["BlockStored"] + [d[k] for k in VLLM_STORED[:5]]
        d["medium"] = self.medium()
        if p in ("vllm-v0.10", "vllm-v0.2x", "vllm", "dynamo"):
            d["lora_name"] = r.choice([None, "lora-a"])
        if p in ("vllm-v0.2x", "vllm", "dynamo"):
            if r.random() < 0.5:
                d["extra_keys"] = self.extra_keys(n)
            if r.random() < 0.5:
                d["group_idx"] = r.choice([0, 1, 2])
            if r.random() < 0.3:
                d["kv_cache_spec_kind"] = r.choice(["full_attention", "sliding_window"])
                d["group_idx"] = d.get("group_idx", 0)
            if r.random() < 0.2:
                d["kv_cache_spec_sliding_window"] = 4096
                d["kv_cache_spec_kind"] = d.get("kv_cache_spec_kind", "sliding_window")
                d["group_idx"] = d.get("group_idx", 1)
        if p == "vllm":
            if r.random() < 0.3:
                d["locality"] = r.choice(["LOCAL", "REMOTE"])
            if r.random() < 0.2:
                d["ownership"] = "kvcr"
            if r.random() < 0.2:
                d["remaining_future_field"] = [1, {"a": None}, b"\xff"]
        salt = r.choice([None, None, "tenant-a", "tenant-b"]) if p.startswith("sglang") else None
        session = r.choice([None, "sess-1"]) if salt else None
        if p == "sglang-positional":
            ev = ["BlockStored", d["block_hashes"], d["parent_block_hash"], d["token_ids"],
                  bs, d["lora_id"], d["medium"]]
            if salt:  # BlockStoredWithMetadata
                ev.append({"cache_salt": salt, **({"session_id": session} if session else {})})
            return ev
        if p == "sglang":
            ev = {"type": "BlockStored", **{k: d[k] for k in
                  ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")}}
            if d["medium"] is not None:
                ev["medium"] = d["medium"]
            if salt:
                ev["cache_salt"] = salt
            if session:
                ev["session_id"] = session
            return ev
        if p in ("vllm-v0.10", "vllm-v0.2x", "dynamo"):  # positional, trailing defaults omitted
            fields = [d.get(k) for k in VLLM_STORED]
            last = 7  # lora_id, medium, lora_name are required
            for i in range(7, len(VLLM_STORED)):
                if fields[i] is not None:
                    last = i + 1
            return ["BlockStored"] + fields[:last]
        ev = {"type": "BlockStored"}  # vllm: a tagged map, omit_defaults
        for k in VLLM_STORED + OPTIONAL + ["remaining_future_field"]:
            if k in REQUIRED_MAP["BlockStored"] or d.get(k) is not None:
                ev[k] = d.get(k)
        return ev

    def removed(self):
        r = self.rng
        hashes = [self.h() for _ in range(r.randint(1, 5))]
        p = self.p
        if p == "vllm-v0.8":
            return ["BlockRemoved", hashes]
        medium = self.medium()
        group = r.choice([None, 0, 1]) if p in ("vllm-v0.2x", "vllm", "dynamo") else None
        if p == "vllm":
            ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
            if group is not None:
                ev["group_idx"] = group
            if r.random() < 0.3:
                ev["locality"] = "LOCAL"
            return ev
        if p == "sglang":
            ev = {"type": "BlockRemoved", "block_hashes": hashes}
            if medium is not None:
                ev["medium"] = medium
            return ev
        return ["BlockRemoved", hashes, medium] + ([group] if group is not None else [])

    def cleared(self):
        return {"type": "AllBlocksCleared"} if self.p in ("vllm", "sglang") else ["AllBlocksCleared"]

    def junk(self):
        """An event kvbm must skip, and the batch around it keep."""
        r = self.rng
        return r.choice([
            {"type": "Ignored"},
            ["Ignored", [1, 2]],
            {"type": "BlockStored", "block_hashes": "nope", "token_ids": [], "block_size": 1},
            ["BlockRemoved", [1.5]],
            {"type": "BlockStored", "block_hashes": [1], "token_ids": [[1, 2], [3, 4]],
             "block_size": 2},  # pairs that do not chain
        ])

    def event(self):
        r = self.rng
        if self.p == "dynamo" and r.random() < 0.15:
            return None
        kind = r.choice(["stored", "stored", "stored", "removed", "cleared"])
        return getattr(self, kind)()


def engine(args):
    profile, hashes, nbatches = args[0], args[1], int(args[2])
    skip = {int(x) for x in args[3].split(",") if x} if len(args) > 3 and args[3] != "-" else set()
    batch_map = len(args) > 4 and args[4] == "batch-map"
    gen = Gen(profile, hashes, 1234 + nbatches)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port} tcp://127.0.0.1:{rport}", flush=True)
    buffer, sent = [], []
    nbad = 0
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)

    with_topic = profile == "vllm"  # vLLM PR #45177

    def serve_replay():
        frames = router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        topic = [b"kv"] if with_topic else []
        for seq, payload in buffer:
            if seq >= start:
                router.send_multipart([ident, b""] + topic + [seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b""] + ([b""] if with_topic else []) + [END_SEQ, b""])

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
                    events, bad = [], set()
                    for _ in range(gen.rng.randint(1, 6)):
                        ev = gen.event()
                        if ev is None:
                            bad.add(len(events))
                            ev = gen.junk()
                        events.append(ev)
                    ts = time.time()
                    dp = 2
                    if profile == "vllm-v0.8":
                        obj = [ts, events]
                    elif batch_map:
                        obj = {"ts": ts, "events": events, "data_parallel_rank": dp}
                    else:
                        obj = [ts, events, dp]
                    payload = msgpack.packb(obj, use_bin_type=True)
                    buffer.append((seq, payload))
                    sent.extend(canon_batch(payload, seq, bad))
                    nbad += len(bad)
                    if seq not in skip:
                        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
                    time.sleep(0.002)
            elif cmd and cmd[0] == "skipped":
                print(nbad, flush=True)
            elif cmd and cmd[0] in ("check", "checkev"):
                with open(cmd[1]) as f:
                    ok = compare(sent, f.readlines(), events_only=cmd[0] == "checkev")
                print("OK" if ok else "MISMATCH", flush=True)
                return 0 if ok else 1


# ------------------------------------------------------------ subscriber

def is_hash(v, signed):
    if not isinstance(v, int):
        return False
    return -(1 << 63) <= v < (1 << 63) if signed else 0 <= v <= MASK


def check_schema(payload, form, signed):
    """What a typed vLLM consumer (msgspec structs of kv_events.py) needs
    of a kvbm payload; returns an error text or None."""
    b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(b, list) or len(b) not in (2, 3) or not isinstance(b[0], float):
        return f"batch is not [ts, events, dp_rank]: {b!r:.80}"
    for ev in b[1]:
        if form == "map":
            if not isinstance(ev, dict) or ev.get("type") not in REQUIRED_MAP:
                return f"not a tagged map event: {ev!r:.80}"
            for k in REQUIRED_MAP[ev["type"]]:
                if k not in ev:
                    return f"{ev['type']} lacks required {k}"
            for k, v in ev.items():
                if v is None and k not in ("parent_block_hash", "lora_id", "medium", "lora_name"):
                    return f"{k} written as nil (omit_defaults leaves it out)"
            d = ev
        else:
            if not isinstance(ev, list) or ev[0] not in REQUIRED_MAP:
                return f"not a tagged array event: {ev!r:.80}"
            names = {"BlockStored": VLLM_STORED, "BlockRemoved": VLLM_REMOVED}.get(ev[0], [])
            need = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}[ev[0]]
            if len(ev) - 1 < need:
                return f"{ev[0]} has {len(ev) - 1} fields, vLLM requires {need}"
            d = dict(zip(names, ev[1:]))
        hs = d.get("block_hashes", [])
        if not all(is_hash(h, signed) for h in hs):
            return f"hashes not {'signed' if signed else 'unsigned'} 64-bit: {hs!r:.80}"
        p = d.get("parent_block_hash")
        if p is not None and not is_hash(p, signed):
            return f"parent {p} not {'signed' if signed else 'unsigned'}"
    return None


def subscribe(args):
    ep, rep, n, expected, form = args[0], args[1], int(args[2]), args[3], args[4]
    signed = len(args) > 5 and args[5] == "signed"
    topic_want = args[6].encode() if len(args) > 6 else b""
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
                    frames = req.recv_multipart()  # ["", seq, payload] or ["", topic, seq, payload]
                    if len(frames) == 4 and frames[2] != END_SEQ and frames[1] != topic_want:
                        print(f"replay reply with topic {frames[1]!r}", file=sys.stderr)
                        return 1
                    seqb, payload = frames[-2], frames[-1]
                    if seqb == END_SEQ:
                        break
                    batches.setdefault(int.from_bytes(seqb, "big"), payload)
                req.close(0)
    if sorted(batches) != list(range(n)):
        print(f"got batches {sorted(batches)[:10]}..., wanted 0..{n - 1}", file=sys.stderr)
        return 1
    got = []
    for seq in range(n):
        why = check_schema(batches[seq], form, signed)
        if why:
            print(f"batch {seq}: {why}", file=sys.stderr)
            print("MISMATCH", flush=True)
            return 1
        got.extend(canon_batch(batches[seq], seq))
    with open(expected) as f:
        ok = compare(got, f.readlines())
    print("OK" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    mode = sys.argv[1]
    sys.exit(engine(sys.argv[2:]) if mode == "engine" else subscribe(sys.argv[2:]))
