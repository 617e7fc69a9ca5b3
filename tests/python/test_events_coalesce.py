# SPDX-License-Identifier: Apache-2.0
"""KvEventPublisher(coalesce=...) (issue 22), read back through a real ZMQ
subscriber (kvbm.Subscriber, kvbm's decoder) joining late by replay.

What a pool link publishes (one block an event: a prompt's blocks
registered in order, each one's parent the block before; one-block
removes of evicted blocks between them, as a pool at capacity alternates
evict and register) leaves with coalesce=True as vLLM sends a step: one
multi-block BlockStored with the same hashes, tokens and first parent,
and one BlockRemoved with the removed hashes in order; without it, as
published. A medium change is never merged across, and the medium's text
comes back as given. The option is a bool and nothing else. The Python
publisher's sinks (ZMQ, NATS) all take bytes, so the C refusal beside a
callback sink cannot arise here (tests/events/test_coalesce.c holds it).
"""
import struct
import time

import msgpack
import numpy as np
import pytest
import zmq

import kvbm

B = 16
MASK = (1 << 64) - 1
DEADLINE = 60.0
CHAIN = 8


def publisher(**kw):
    kw.setdefault("endpoint", "tcp://127.0.0.1:*")
    kw.setdefault("replay_endpoint", "tcp://127.0.0.1:*")
    # one batch for the whole test unless flush() sends it: coalescing never
    # spans a batch, so what merges does not depend on the timer
    kw.setdefault("max_batch_delay_us", 30_000_000)
    return kvbm.KvEventPublisher(B, **kw)


def recv_blocks(pub, nblocks):
    """Events read by a late subscriber until they carry nblocks blocks."""
    events, end = [], time.monotonic() + DEADLINE
    with kvbm.Subscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, start_seq=0) as sub:
        while sum(len(e["block_hashes"]) for e in events) < nblocks:
            assert time.monotonic() < end, f"got {events}"
            b = sub.recv(timeout=0.5)
            if b is not None:
                events += b.events
    return events


def chain(seed, n=CHAIN):
    toks = (np.arange(n * B, dtype=np.uint32) + seed * 1000) % 50000
    return toks, kvbm.block_hashes(toks, B)


def publish_pool_link(pub, toks, h, evicted):
    """A pool at capacity registering h block by block: evict one, store one."""
    ids = []
    for i in range(len(h)):
        if i < len(evicted):
            ids.append(pub.publish_removed([evicted[i]]))
        parent = h[i - 1] if i else None
        ids.append(pub.publish_stored(toks[i * B:(i + 1) * B], [B], [h[i]], None, parent_hash=parent))
    return ids


@pytest.mark.parametrize("form", ["positional", "map"])
def test_coalesced_pool_link_stream_is_one_event_per_run(form):
    toks, h = chain(1)
    _, old = chain(2, 5)
    with publisher(form=form, coalesce=True) as pub:
        ids = publish_pool_link(pub, toks, h, old)
        assert ids == sorted(ids) and len(set(ids)) == CHAIN + 5  # one id a publish
        pub.flush(timeout=10)
        st = pub.stats()
        assert st["accepted"] == CHAIN + 5 and st["sent_events"] == CHAIN + 5 and st["batches"] == 1
        ev = recv_blocks(pub, CHAIN + 5)
    # the remove run opened first (the first publish), so it leaves first
    assert ev == [{"type": "BlockRemoved", "block_hashes": old, "medium": "GPU", "group_idx": None},
                  {"type": "BlockStored", "block_hashes": h, "parent_block_hash": None,
                   "token_ids": toks.tolist(), "block_size": B, "lora_id": None,
                   "lora_name": None, "medium": "GPU", "group_idx": None}]


def test_without_coalesce_the_events_arrive_as_published():
    toks, h = chain(3)
    _, old = chain(4, 5)
    for kw in ({}, {"coalesce": False}):  # off by default
        with publisher(**kw) as pub:
            publish_pool_link(pub, toks, h, old)
            pub.flush(timeout=10)
            ev = recv_blocks(pub, CHAIN + 5)
        assert len(ev) == CHAIN + 5 and all(len(e["block_hashes"]) == 1 for e in ev)
        want = []
        for i in range(CHAIN):
            if i < 5:
                want.append(("BlockRemoved", old[i], None))
            want.append(("BlockStored", h[i], h[i - 1] if i else None))
        assert [(e["type"], e["block_hashes"][0], e.get("parent_block_hash")) for e in ev] == want
        stored = [e for e in ev if e["type"] == "BlockStored"]
        assert [t for e in stored for t in e["token_ids"]] == toks.tolist()


def test_a_medium_change_or_a_break_in_the_chain_ends_a_run():
    toks, h = chain(5)
    with publisher(coalesce=True) as pub:
        for i in range(CHAIN):
            medium = "CPU" if i >= 6 else "GPU"
            parent = h[i - 1] if i and i != 3 else None  # block 3 starts a new chain
            pub.publish_stored(toks[i * B:(i + 1) * B], [B], [h[i]], None, parent_hash=parent,
                               medium=medium)
        pub.flush(timeout=10)
        ev = recv_blocks(pub, CHAIN)
    assert [(e["block_hashes"], e["parent_block_hash"], e["medium"]) for e in ev] == \
        [(h[:3], None, "GPU"), (h[3:6], None, "GPU"), (h[6:], h[5], "CPU")]
    assert [t for e in ev for t in e["token_ids"]] == toks.tolist()


def test_coalesce_must_be_a_bool():
    for bad in (1, 0, "yes", None, 1.5, [True]):
        with pytest.raises(TypeError, match="coalesce: expected a bool"):
            kvbm.KvEventPublisher(B, endpoint="tcp://127.0.0.1:*", coalesce=bad)
    with kvbm.KvEventPublisher(B, endpoint="tcp://127.0.0.1:*", coalesce=False) as pub:
        assert not pub.closed


def test_relay_mode_coalesces_an_engines_one_block_events():
    """zmq_endpoint + coalesce=True: an engine sending one block an event is
    republished with fewer events carrying the same blocks in order."""
    ctx = zmq.Context.instance()
    engine = ctx.socket(zmq.PUB)
    port = engine.bind_to_random_port("tcp://127.0.0.1")
    toks, h = chain(6, 32)
    wire = [["BlockStored", [x], h[i - 1] if i else None, toks[i * B:(i + 1) * B].tolist(), B, None,
             "GPU"] for i, x in enumerate(h)]
    with publisher(zmq_endpoint=f"tcp://127.0.0.1:{port}", coalesce=True,
                   max_batch_delay_us=200_000) as relay:
        # PUB drops what it sends before the relay's SUB has joined: a probe
        # (a remove of an unrelated block) goes until the relay has one
        seq, end = 0, time.monotonic() + DEADLINE
        while relay.stats()["relay_delivered"] < 1:
            assert time.monotonic() < end, "the relay never joined"
            engine.send_multipart([b"", struct.pack(">Q", seq),
                                   msgpack.packb([time.time(), [["BlockRemoved", [7], "GPU"]], 0])])
            seq += 1
            time.sleep(0.05)
        for k in range(0, len(wire), 8):  # four engine batches of 8 one-block stores
            engine.send_multipart([b"", struct.pack(">Q", seq),
                                   msgpack.packb([time.time(), wire[k:k + 8], 0])])
            seq += 1
        ev = []
        with kvbm.Subscriber(relay.endpoint, replay_endpoint=relay.replay_endpoint,
                             start_seq=0) as sub:
            while sum(len(e["block_hashes"]) for e in ev) < 32:
                assert time.monotonic() < end, ev
                b = sub.recv(timeout=0.5)
                if b is not None:
                    ev += [e for e in b.events if e["type"] == "BlockStored"]
    engine.close(0)
    assert [x for e in ev for x in e["block_hashes"]] == h
    assert [t for e in ev for t in e["token_ids"]] == toks.tolist()
    assert ev[0]["parent_block_hash"] is None
    assert len(ev) < 32 and max(len(e["block_hashes"]) for e in ev) >= 8, [len(e["block_hashes"]) for e in ev]
    assert all(e["medium"] == "GPU" for e in ev)


def test_a_medium_text_of_its_own_is_kept_and_not_merged():
    """medium='CPU_PINNED' (SGLang's) is kvbm's CPU under another text: the
    text goes on the wire as given, so such an event stays as published."""
    toks, h = chain(7, 3)
    with publisher(coalesce=True, form="map") as pub:
        for i in range(3):
            pub.publish_stored(toks[i * B:(i + 1) * B], [B], [h[i]], None,
                               parent_hash=h[i - 1] if i else None, medium="CPU_PINNED")
        pub.flush(timeout=10)
        ev = recv_blocks(pub, 3)
        raw = replay_payload(pub)
    # the dicts name kvbm's medium (CPU); the wire has the text as given
    assert [(e["block_hashes"], e["medium"]) for e in ev] == [([x], "CPU") for x in h]
    events = msgpack.unpackb(raw, raw=False, strict_map_key=False)[1]
    assert [(e["block_hashes"], e["medium"]) for e in events] == [([x], "CPU_PINNED") for x in h]


def replay_payload(pub):
    """The first batch's payload as bytes, asked of the replay ROUTER as
    vLLM's subscribers ask (a DEALER sends the start seq)."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.connect(pub.replay_endpoint)
    try:
        d.send_multipart([b"", struct.pack(">q", 0)])
        assert d.poll(int(DEADLINE * 1000)), "no replay answer"
        return d.recv_multipart()[-1]
    finally:
        d.close(0)
