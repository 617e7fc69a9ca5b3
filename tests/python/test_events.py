# SPDX-License-Identifier: Apache-2.0
"""KvEventPublisher (Dynamo's shape), Subscriber and the router's Index.

ZMQ PUB/SUB drops what is sent before a subscriber has joined, so no test
relies on timing: readers join late through the replay socket (start_seq=0),
and where a third party publishes (the relay's "engine") it repeats until
its message has been seen, under a generous deadline.
"""
import socket
import struct
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

import kvbm

B = 16
MASK = (1 << 64) - 1
DEADLINE = 60.0


def publisher(**kw):
    kw.setdefault("endpoint", "tcp://127.0.0.1:*")
    kw.setdefault("replay_endpoint", "tcp://127.0.0.1:*")
    kw.setdefault("max_batch_delay_us", 0)
    return kvbm.KvEventPublisher(B, **kw)


def late_subscriber(pub, **kw):
    return kvbm.Subscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, start_seq=0, **kw)


def recv_events(sub, n, deadline=DEADLINE):
    events, end = [], time.monotonic() + deadline
    while len(events) < n:
        assert time.monotonic() < end, f"got {len(events)} of {n} events"
        b = sub.recv(timeout=0.5)
        if b is not None:
            events += b.events
    return events


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("form", ["positional", "map"])
def test_published_events_arrive_as_sent(form):
    toks = np.arange(3 * B, dtype=np.uint32)
    h = kvbm.block_hashes(toks, B)
    signed = [x - 2**64 if x >= 2**63 else x for x in h]  # Dynamo's Python passes signed
    with publisher(form=form, dp_rank=3) as pub:
        ids = [pub.publish_stored(toks, [B] * 3, signed, 7, parent_hash=-5),
               pub.publish_stored(toks[:B].tolist(), [B], h[:1], None, medium="CPU"),
               pub.publish_removed(h[1:]),
               pub.publish_cleared()]
        assert ids == sorted(ids) and len(set(ids)) == 4
        pub.flush(timeout=10)
        st = pub.stats()
        assert st["accepted"] == 4 and st["sent_events"] == 4
        with late_subscriber(pub) as sub:
            ev = recv_events(sub, 4)
    assert ev[0] == {"type": "BlockStored", "block_hashes": h, "parent_block_hash": (-5) & MASK,
                     "token_ids": toks.tolist(), "block_size": B, "lora_id": 7, "lora_name": None,
                     "medium": "GPU", "group_idx": None}
    assert ev[1]["medium"] == "CPU" and ev[1]["parent_block_hash"] is None and ev[1]["lora_id"] is None
    assert ev[2] == {"type": "BlockRemoved", "block_hashes": h[1:], "medium": "GPU", "group_idx": None}
    assert ev[3] == {"type": "AllBlocksCleared"}



def replay_payloads(pub, n):
    """The first n payloads as bytes, read through the replay socket as
    vLLM's subscribers ask for them (a DEALER sends the start seq)."""
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.connect(pub.replay_endpoint)
    try:
        d.send_multipart([b"", struct.pack(">q", 0)])
        out = []
        while True:
            assert d.poll(int(DEADLINE * 1000)), "no replay answer"
            frames = d.recv_multipart()
            seq = struct.unpack(">q", frames[-2])[0]
            if seq < 0:
                break
            out.append(frames[-1])
        assert len(out) >= n
        return out[:n]
    finally:
        d.close(0)


@pytest.mark.parametrize("form", ["positional", "map"])
def test_group_fields_as_vllm_sends_them(form):
    """Hybrid models: BlockStored carries group_idx, kv_cache_spec_kind and
    kv_cache_spec_sliding_window, BlockRemoved group_idx, in vLLM's order
    (positional: indices 9, 10, 11 and 3; trailing absent fields left off),
    and a one-group event has none of them on the wire."""
    toks = np.arange(B, dtype=np.uint32)
    h = kvbm.block_hashes(toks, B)
    with publisher(form=form, max_batch_events=1) as pub:
        pub.publish_stored(toks, [B], h, group_idx=1, kv_cache_spec_kind="sliding_window",
                           sliding_window=128)
        pub.publish_stored(toks, [B], h, group_idx=0, kv_cache_spec_kind="full_attention")
        pub.publish_removed(h, group_idx=1)
        pub.publish_stored(toks, [B], h)
        pub.flush(timeout=10)
        with late_subscriber(pub) as sub:
            ev = recv_events(sub, 4)
        raw = [msgpack.unpackb(p, raw=False, strict_map_key=False)[1][0]
               for p in replay_payloads(pub, 4)]
    assert (ev[0]["group_idx"], ev[0]["kv_cache_spec_kind"], ev[0]["kv_cache_spec_sliding_window"]) \
        == (1, "sliding_window", 128)
    assert ev[1]["group_idx"] == 0 and ev[1]["kv_cache_spec_kind"] == "full_attention"
    assert "kv_cache_spec_sliding_window" not in ev[1]
    assert ev[2] == {"type": "BlockRemoved", "block_hashes": h, "medium": "GPU", "group_idx": 1}
    assert ev[3]["group_idx"] is None and "kv_cache_spec_kind" not in ev[3]
    if form == "positional":
        assert raw[0][0] == "BlockStored" and len(raw[0]) == 12
        assert raw[0][8:] == [None, 1, "sliding_window", 128]
        assert len(raw[1]) == 11 and raw[1][9:] == [0, "full_attention"]
        assert raw[2] == ["BlockRemoved", h, "GPU", 1]
        assert len(raw[3]) == 8
    else:
        assert list(raw[0])[-3:] == ["group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
        assert raw[0]["kv_cache_spec_sliding_window"] == 128
        assert raw[2] == {"type": "BlockRemoved", "block_hashes": h, "medium": "GPU", "group_idx": 1}
        assert not {"group_idx", "kv_cache_spec_kind"} & set(raw[3])


def test_group_keywords_hostile():
    with publisher() as pub:
        for kw in ({"group_idx": -1}, {"group_idx": 2**63}, {"sliding_window": -5},
                   {"kv_cache_spec_kind": 3}, {"group_idx": "1"}):
            with pytest.raises((kvbm.Error, TypeError, ValueError, OverflowError)):
                pub.publish_stored([1] * B, [B], [5], **kw)
        with pytest.raises((kvbm.Error, TypeError, ValueError, OverflowError)):
            pub.publish_removed([5], group_idx=-1)
        assert pub.stats()["accepted"] == 0

def test_batches_carry_seq_ts_and_dp_rank():
    with publisher(dp_rank=2) as pub:
        pub.publish_removed([1])
        pub.flush()
        pub.publish_removed([2])
        pub.flush()
        with late_subscriber(pub) as sub:
            b0, b1 = sub.recv(timeout=DEADLINE), sub.recv(timeout=DEADLINE)
    ts, dp, seq, events = b0
    assert (dp, seq, b1.seq) == (2, 0, 1) and abs(ts - time.time()) < 3600
    assert events[0]["block_hashes"] == [1] and b1.events[0]["block_hashes"] == [2]
    assert b0.replayed and b0.lost_before == 0


def test_relay_mode_republishes_an_engines_events():
    """zmq_endpoint: the publisher subscribes to a vLLM-style engine's PUB and
    republishes every event it reads on its own sink."""
    ctx = zmq.Context.instance()
    engine = ctx.socket(zmq.PUB)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    sent = {}
    with publisher(zmq_endpoint=f"tcp://127.0.0.1:{port}") as relay, late_subscriber(relay) as sub:
        got, seq, end = [], 0, time.monotonic() + DEADLINE
        while not got:
            assert time.monotonic() < end, "nothing was relayed"
            h = (seq * 0x9E3779B97F4A7C15 + 1) & MASK
            ev = ["BlockStored", [h - 2**64 if h >= 2**63 else h], None, list(range(seq, seq + B)),
                  B, None, "GPU"]
            sent[h] = ev
            engine.send_multipart([b"", struct.pack(">Q", seq),
                                   msgpack.packb([time.time(), [ev], 0])])
            seq += 1
            b = sub.recv(timeout=0.05)
            if b is not None:
                got += b.events
        while relay.stats()["relay_delivered"] < 1:  # the relay thread's copy of its counters
            assert time.monotonic() < end
            time.sleep(0.01)
    engine.close(0)
    for e in got:
        h = e["block_hashes"][0]
        assert h in sent, "relayed an event the engine never sent"
        assert e["token_ids"] == sent[h][3] and e["block_size"] == B and e["medium"] == "GPU"


def test_stats_after_shutdown_and_close_are_the_final_counts():
    """What a user reads after shutdown() / close() is the final count: stats()
    returns it (it raised ClosedError before issue 24). Events still queued
    at shutdown are sent by it, and counted."""
    pub = publisher(max_batch_delay_us=60 * 1000 * 1000, max_batch_events=1000)
    for i in range(300):  # one batch, left queued: the delay is a minute
        pub.publish_removed([i])
    sub = late_subscriber(pub)
    pub.shutdown()
    st = pub.stats()
    assert st["accepted"] == 300 and st["sent_events"] == 300 and st["batches"] == 1
    assert st["dropped"] == 0 and pub.closed
    assert pub.stats() == st
    sub.close()
    assert sub.closed and sub.stats()["delivered"] == 0

    # a subscriber's counts at close(), the same dict as before it
    with publisher() as pub2:
        for i in range(3):
            pub2.publish_removed([i])
            pub2.flush()
        sub = late_subscriber(pub2)
        recv_events(sub, 3)
        before = sub.stats()
        sub.close()
        assert sub.stats() == before and before["delivered"] == 3 and before["replayed"] == 3


def test_relay_stats_after_shutdown_keep_the_relay_counts():
    ctx = zmq.Context.instance()
    engine = ctx.socket(zmq.PUB)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    relay = publisher(zmq_endpoint=f"tcp://127.0.0.1:{port}")
    seq, end = 0, time.monotonic() + DEADLINE
    while relay.stats()["relay_delivered"] < 1:  # the engine repeats until the relay hears it
        assert time.monotonic() < end, "nothing was relayed"
        engine.send_multipart([b"", struct.pack(">Q", seq),
                               msgpack.packb([time.time(), [["AllBlocksCleared"]], 0])])
        seq += 1
        time.sleep(0.01)
    relay.shutdown()
    engine.close(0)
    st = relay.stats()
    assert st["relay_delivered"] >= 1 and st["relay_messages"] >= st["relay_delivered"]
    assert st["accepted"] >= st["relay_delivered"] and st["sent_events"] == st["accepted"]


def test_subscriber_busy_from_two_threads_and_recv_releases_the_gil():
    with publisher() as pub, late_subscriber(pub) as sub:
        result = {}

        def reader():
            result["batch"] = sub.recv(timeout=DEADLINE)

        t = threading.Thread(target=reader)
        t.start()
        end = time.monotonic() + DEADLINE
        while not sub.busy:  # this loop runs while the reader waits: the GIL is free
            assert time.monotonic() < end
            time.sleep(0.001)
        with pytest.raises(kvbm.BusyError):
            sub.recv(timeout=0)
        with pytest.raises(kvbm.BusyError):
            sub.stats()
        with pytest.raises(kvbm.BusyError):
            sub.close()
        while t.is_alive():  # the reader may have joined after a first send
            assert time.monotonic() < end
            pub.publish_removed([42])
            t.join(0.05)
        assert result["batch"].events[0]["block_hashes"] == [42]
    assert sub.closed


def test_malformed_input_raises_and_the_subscriber_goes_on():
    ctx = zmq.Context.instance()
    engine = ctx.socket(zmq.PUB)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    sub = kvbm.Subscriber(f"tcp://127.0.0.1:{port}")
    end = time.monotonic() + DEADLINE
    seen_error = None
    seq = 0
    while seen_error is None:
        assert time.monotonic() < end
        engine.send_multipart([b"", struct.pack(">Q", seq), b"\xc1not msgpack"])
        seq += 1
        try:
            sub.recv(timeout=0.05)
        except kvbm.Error as e:
            seen_error = e
    assert isinstance(seen_error, kvbm.FormatError)
    got = None
    while got is None:
        assert time.monotonic() < end
        engine.send_multipart([b"", struct.pack(">Q", seq),
                               msgpack.packb([1.0, [["AllBlocksCleared"]]])])
        seq += 1
        try:
            got = sub.recv(timeout=0.05)
        except kvbm.FormatError:
            pass  # a garbage message still in flight
    assert got.events == [{"type": "AllBlocksCleared"}] and got.dp_rank is None
    assert sub.stats()["bad_payload"] >= 1
    sub.close()
    engine.close(0)
    with pytest.raises(kvbm.ClosedError):
        sub.recv(timeout=0)


def test_publisher_hostile_arguments():
    for kw in ({}, {"nats_url": "nats://127.0.0.1:1"}, {"endpoint": "tcp://127.0.0.1:*", "form": "xml"},
               {"replay_endpoint": "tcp://127.0.0.1:*"}):
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.KvEventPublisher(B, **kw)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.KvEventPublisher(0, endpoint="tcp://127.0.0.1:*")
    with pytest.raises(kvbm.IoError):
        kvbm.KvEventPublisher(B, endpoint="nonsense://x")
    with pytest.raises(kvbm.IoError):
        kvbm.KvEventPublisher(B, nats_url=f"nats://127.0.0.1:{free_port()}", nats_subject="kv")
    with pytest.raises(TypeError):
        kvbm.KvEventPublisher(B, endpoint=5)
    pub = publisher()
    h = kvbm.block_hashes(np.arange(2 * B, dtype=np.uint32), B)
    toks = list(range(2 * B))
    for args in ((toks, [B], h, None),          # counts differ
                 (toks, [B, B - 1], h, None),   # a block of the wrong size
                 (toks[:-1], [B, B], h, None),  # tokens short
                 (toks, [B, B], [2**64, 1], None),
                 (toks, [B, B], h, 2**64)):
        with pytest.raises(kvbm.InvalidArgumentError):
            pub.publish_stored(*args)
    for args in ((toks, [B, B], "ab", None), (toks, [B, B], h, "lora"), ("tokens", [B, B], h, None),
                 (toks, [B, B], h, None, "parent")):
        with pytest.raises(TypeError):
            pub.publish_stored(*args)
    with pytest.raises(TypeError):
        pub.publish_removed(None)
    with pytest.raises(TypeError):
        pub.publish_removed([1], medium=3)
    with pytest.raises(kvbm.InvalidArgumentError):
        pub.flush(timeout=-1)
    pub.shutdown()
    pub.shutdown()
    assert pub.closed
    with pytest.raises(kvbm.ClosedError):
        pub.publish_removed([1])
    assert pub.stats()["sent_events"] == pub.stats()["accepted"]  # the final counts
    with pytest.raises(kvbm.Error):
        kvbm.Subscriber("not an endpoint")
    with pytest.raises(TypeError):
        kvbm.Subscriber(None)


def test_publish_from_many_threads():
    with publisher() as pub:
        def worker(i):
            for k in range(200):
                pub.publish_removed([i * 1000 + k])

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        pub.flush(timeout=30)
        assert pub.stats()["sent_events"] == 800
        with late_subscriber(pub) as sub:
            ev = recv_events(sub, 800)
    got = sorted(e["block_hashes"][0] for e in ev)
    assert got == sorted(i * 1000 + k for i in range(4) for k in range(200))


# ------------------------------------------------------------------- router

def stored(tokens, medium="GPU", parent=None):
    h = kvbm.block_hashes(tokens, B)
    return {"type": "BlockStored", "block_hashes": h, "parent_block_hash": parent,
            "token_ids": list(tokens[:len(h) * B]), "block_size": B, "medium": medium}


def test_index_overlap_per_worker_and_tier():
    a = np.arange(8 * B, dtype=np.uint32)
    idx = kvbm.Index(B)
    idx.apply(1, [stored(a[:4 * B])])                  # worker 1: 4 blocks on device
    h = kvbm.block_hashes(a, B)
    idx.apply(2, [stored(a[:2 * B]), {"type": "BlockStored", "block_hashes": h[2:6],
                                      "parent_block_hash": h[1], "token_ids": a[2 * B:6 * B],
                                      "block_size": B, "medium": "CPU"}])
    idx.apply(3, [stored(a[:B], medium="DISK")])
    idx.apply(4, [stored(a[:2 * B], medium="REMOTE")])
    ov = idx.overlap(np.concatenate([a, [1]]).astype(np.uint32))
    # per tier G1..G4, each prefix counting the tiers above it
    assert ov == {(1, 0): (4, 4, 4, 4), (2, 0): (2, 6, 6, 6), (3, 0): (0, 0, 1, 1),
                  (4, 0): (0, 0, 0, 2)}
    assert idx.overlap_hashes(h[:3])[(2, 0)] == (2, 3, 3, 3)
    idx.apply(1, [{"type": "BlockRemoved", "block_hashes": [h[1]], "medium": "GPU"}])
    assert idx.overlap(a)[(1, 0)] == (1, 1, 1, 1)
    idx.apply(2, [{"type": "AllBlocksCleared"}])
    assert idx.overlap(a)[(2, 0)] == (0, 0, 0, 0)
    assert sorted(idx.workers()) == [(1, 0), (2, 0), (3, 0), (4, 0)]
    idx.remove_worker(3)
    with pytest.raises(kvbm.NotFoundError):
        idx.remove_worker(3)
    assert (3, 0) not in idx.overlap(a)
    assert idx.stats()["workers"] == 3


def test_index_fed_by_a_subscriber_and_dedup_by_seq():
    a = np.arange(5 * B, dtype=np.uint32)
    with publisher(dp_rank=1) as pub:
        h = kvbm.block_hashes(a, B)
        pub.publish_stored(a, [B] * 5, h, None)
        pub.flush()
        with late_subscriber(pub) as sub:
            batch = sub.recv(timeout=DEADLINE)
    idx = kvbm.Index(B)
    idx.apply(9, batch)
    idx.apply(9, batch)  # the same seq again: a duplicate, skipped
    assert idx.overlap(a) == {(9, 1): (5, 5, 5, 5)}
    assert idx.stats()["duplicates"] >= 1 and idx.stats()["stored"] == 5


def test_a_restarted_engine_is_a_new_stream():
    """An engine numbers batches from 0 again after a restart: the batch
    says reset, and the index forgets the worker's old blocks."""
    ctx = zmq.Context.instance()
    engine = ctx.socket(zmq.PUB)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    sub = kvbm.Subscriber(f"tcp://127.0.0.1:{port}", max_queue_bytes=1 << 22)
    a, b = np.arange(2 * B, dtype=np.uint32), np.arange(100, 100 + B, dtype=np.uint32)
    ha, hb = kvbm.block_hashes(a, B), kvbm.block_hashes(b, B)

    def stored(h, toks):
        return msgpack.packb([1.0, [["BlockStored", h, None, toks.tolist(), B, None, "GPU"]], 0])

    end, seq, first = time.monotonic() + DEADLINE, 0, None
    while first is None:  # until the subscription reached the engine
        assert time.monotonic() < end
        engine.send_multipart([b"", struct.pack(">Q", seq), stored(ha, a)])
        seq += 1
        first = sub.recv(timeout=0.05)
    idx = kvbm.Index(B)
    idx.apply(4, first)
    for s in range(first.seq + 1, first.seq + 5):
        engine.send_multipart([b"", struct.pack(">Q", s), msgpack.packb([1.0, [], 0])])
    engine.send_multipart([b"", struct.pack(">Q", 0), stored(hb, b)])  # restarted
    got = []
    while not got or not got[-1].reset:
        assert time.monotonic() < end
        x = sub.recv(timeout=0.5)
        if x is not None:
            got.append(x)
    assert [x.reset for x in got] == [False] * 4 + [True] and got[-1].seq == 0
    for x in got:
        idx.apply(4, x)
    assert idx.overlap(a) == {(4, 0): (0, 0, 0, 0)} and idx.overlap(b)[(4, 0)][0] == 1
    st = sub.stats()
    assert st["resets"] == 1 and st["lost"] == 0 and st["overflow"] == 0
    sub.close()
    engine.close(0)


def test_index_recompute_in_dynamo_scheme():
    """Engines with hashes a router cannot reproduce: recompute keys from tokens."""
    a = np.arange(4 * B, dtype=np.uint32)
    idx = kvbm.Index(B, "dynamo", recompute=True)
    idx.apply(1, [{"type": "BlockStored", "block_hashes": [11, 12, 13, 14], "parent_block_hash": None,
                   "token_ids": a, "block_size": B}])
    assert idx.overlap(a) == {(1, 0): (4, 4, 4, 4)}
    assert idx.overlap_hashes(kvbm.block_hashes(a, B, scheme="dynamo")) == {(1, 0): (4, 4, 4, 4)}
    idx.apply(1, [{"type": "BlockRemoved", "block_hashes": [13]}])
    assert idx.overlap(a) == {(1, 0): (2, 2, 2, 2)}


def test_index_hostile_events():
    idx = kvbm.Index(B)
    for bad in ([{}], [{"type": "Bogus"}], [{"type": "BlockStored"}],
                [{"type": "BlockStored", "block_hashes": [2**64]}]):
        with pytest.raises(kvbm.InvalidArgumentError):
            idx.apply(1, bad)
    for bad in ([5], [{"type": 5}], [{"type": "BlockRemoved", "block_hashes": "ab"}],
                [{"type": "BlockRemoved", "block_hashes": [1], "medium": 3}],
                {"type": "AllBlocksCleared"}, None, 5):
        with pytest.raises(TypeError):
            idx.apply(1, bad)
    with pytest.raises(kvbm.InvalidArgumentError):
        idx.apply(-1, [])
    r = kvbm.Index(B, recompute=True)
    with pytest.raises(kvbm.InvalidArgumentError):  # tokens are not blocks x block size
        r.apply(1, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": B}])
    assert idx.stats()["events"] == 0
    for kw in ({"block_size": 0}, {"scheme": "x"}, {"block_size": -1}):
        with pytest.raises(kvbm.InvalidArgumentError):
            kvbm.Index(**kw)
    idx.close()
    with pytest.raises(kvbm.ClosedError):
        idx.overlap([1])
    # 64 workers at most
    many = kvbm.Index(B)
    for w in range(64):
        many.apply(w, [{"type": "AllBlocksCleared"}])
    with pytest.raises(kvbm.NoSpaceError):
        many.apply(64, [{"type": "AllBlocksCleared"}])


def test_shutdown_racing_publishes_on_other_threads():
    pub = publisher()
    results = {"ok": 0, "closed": 0, "other": []}
    lock = threading.Lock()

    def worker():
        for k in range(2000):
            try:
                pub.publish_removed([k])
                with lock:
                    results["ok"] += 1
            except kvbm.ClosedError:
                with lock:
                    results["closed"] += 1
                return
            except Exception as e:  # pragma: no cover
                results["other"].append(e)
                return

    ts = [threading.Thread(target=worker) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.01)
    pub.shutdown()
    for t in ts:
        t.join()
    assert not results["other"] and pub.closed
    assert results["ok"] + results["closed"] > 0

