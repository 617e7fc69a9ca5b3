# SPDX-License-Identifier: Apache-2.0
"""kvbm.TierIndex, the G2/G3 slot index kvbm.vllm's manager keeps on kvbm's
own fill-only pool: evictions follow kvbm's rule (least recently released
first; a commit, a touch and a last unpin count as releases), pinned and
pending keys are never evicted, and hostile calls raise kvbm.Error
subclasses naming what is wrong (docs/areas/engines.md, "vLLM")."""

import random

import pytest

import kvbm


def fill(t, keys):
    slots = []
    for k in keys:
        slot, gone = t.take(k)
        assert gone is None
        t.commit(k)
        slots.append(slot)
    return slots


def test_take_commit_slots_and_visibility():
    t = kvbm.TierIndex(3)
    assert (t.capacity, len(t), t.evictable, t.available) == (3, 0, 0, 3)
    slot, gone = t.take(7)
    assert gone is None and 0 <= slot < 3
    assert not t.has(7) and t.is_pending(7) and t.slot(7) == slot and len(t) == 0
    t.commit(7)
    assert t.has(7) and not t.is_pending(7) and len(t) == 1 and t.evictable == 1
    assert sorted(fill(t, [8, 9]) + [slot]) == [0, 1, 2]   # distinct slots
    assert t.take(2**64 - 1)[1] == 7                          # full: the oldest goes


def test_eviction_is_least_recently_released():
    t = kvbm.TierIndex(4)
    fill(t, [1, 2, 3, 4])
    t.touch(1)                        # 1 is now the most recent
    t.pin(2)
    t.unpin(2)                        # a last unpin is a release: 2 is newer than 1
    order = []
    for k in (10, 11, 12, 13):
        slot, gone = t.take(k)
        t.commit(k)
        order.append(gone)
    assert order == [3, 4, 1, 2]
    assert not any(t.has(k) for k in (1, 2, 3, 4))


def test_evicted_slot_is_reused():
    t = kvbm.TierIndex(2)
    s1, s2 = fill(t, [1, 2])
    slot, gone = t.take(3)
    assert (slot, gone) == (s1, 1)


def test_pins_and_pending_protect():
    t = kvbm.TierIndex(3)
    fill(t, [1, 2])
    t.pin(1)
    t.pin(1)
    t.take(3)                         # pending: held until commit
    assert t.pinned() == {1: 2} and t.pin_count(1) == 2 and t.evictable == 1
    assert t.room([]) == 1 and t.room([2]) == 0 and t.room([1, 3]) == 1
    assert t.take(4)[1] == 2          # the only evictable block
    with pytest.raises(kvbm.NoSpaceError, match="pinned or pending"):
        t.take(5)                     # 1 pinned, 3 and 4 pending
    assert not t.has(5) and not t.is_pending(5)
    t.unpin(1)
    with pytest.raises(kvbm.NoSpaceError):
        t.take(5)                     # still pinned once
    t.unpin(1)
    assert t.take(5)[1] == 1
    t.drop(3)                         # a failed store frees its slot
    assert not t.has(3) and not t.is_pending(3) and t.available == 1


def model_check(seed):
    """Random calls against a model of kvbm's rule."""
    rng = random.Random(seed)
    cap = rng.randint(1, 6)
    t = kvbm.TierIndex(cap)
    lrr, pins, pending = [], {}, set()  # lrr: evictable keys, oldest first
    evictions = 0

    def release(k):
        lrr.append(k)

    for _ in range(400):
        op = rng.random()
        k = rng.randint(0, 12)
        present = t.has(k) or t.is_pending(k)
        if op < 0.4 and not present:
            if len(pending) + len(pins) >= cap:   # nothing free or evictable
                with pytest.raises(kvbm.NoSpaceError):
                    t.take(k)
                continue
            held = len(pending) + len(pins) + len(lrr)
            want = lrr.pop(0) if held >= cap else None
            slot, gone = t.take(k)
            assert gone == want, (seed, k, gone, want)
            evictions += gone is not None
            pending.add(k)
        elif op < 0.6 and pending:
            k = rng.choice(sorted(pending))
            pending.discard(k)
            if rng.random() < 0.8:
                t.commit(k)
                release(k)
            else:
                t.drop(k)
        elif op < 0.75 and t.has(k):
            t.pin(k)
            if k in lrr:
                lrr.remove(k)
            pins[k] = pins.get(k, 0) + 1
        elif op < 0.9 and pins:
            k = rng.choice(sorted(pins))
            t.unpin(k)
            pins[k] -= 1
            if not pins[k]:
                del pins[k]
                release(k)
        elif t.has(k):
            t.touch(k)
            if k in lrr:
                lrr.remove(k)
                release(k)
        assert t.pinned() == pins and t.evictable == len(lrr)
        assert len(t) == len(lrr) + len(pins)
    return evictions


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_follow_kvbms_rule(seed):
    assert model_check(seed) > 10     # the order was exercised


def test_hostile_calls():
    with pytest.raises(kvbm.InvalidArgumentError, match="capacity must be at least 1"):
        kvbm.TierIndex(0)
    with pytest.raises(kvbm.InvalidArgumentError, match="capacity"):
        kvbm.TierIndex(2**31)
    with pytest.raises(kvbm.InvalidArgumentError, match="capacity"):
        kvbm.TierIndex(-1)
    with pytest.raises(TypeError, match="capacity"):
        kvbm.TierIndex("8")
    t = kvbm.TierIndex(2)
    for bad in (-1, 2**64):
        with pytest.raises(kvbm.InvalidArgumentError, match="key"):
            t.take(bad)
        with pytest.raises(kvbm.InvalidArgumentError, match="key"):
            t.has(bad)
    for bad in ("1", 1.0, None):
        with pytest.raises(TypeError, match="key"):
            t.pin(bad)
    with pytest.raises(kvbm.NotFoundError, match="unpin: key 0x0000000000000005 is not in"):
        t.unpin(5)
    with pytest.raises(kvbm.NotFoundError, match="pin: key"):
        t.pin(5)
    with pytest.raises(kvbm.NotFoundError, match="slot"):
        t.slot(5)
    with pytest.raises(kvbm.NotFoundError, match="drop"):
        t.drop(5)
    t.take(5)
    with pytest.raises(kvbm.StateError, match="taken but not committed"):
        t.pin(5)                      # a pending store cannot be loaded
    with pytest.raises(kvbm.ExistsError, match="in the index already"):
        t.take(5)
    t.commit(5)
    with pytest.raises(kvbm.StateError, match="committed already"):
        t.commit(5)
    with pytest.raises(kvbm.StateError, match="not pinned"):
        t.unpin(5)
    t.pin(5)
    with pytest.raises(kvbm.StateError, match="pinned 1 times"):
        t.drop(5)
    assert t.has(5) and t.pinned() == {5: 1} and len(t) == 1
