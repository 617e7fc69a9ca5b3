#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end test of the router's GET /index?worker=ID (run by
test_index_route.sh).

The cluster run (docs/areas/cluster.md) checks that each router replica's
index converged to what every worker holds, by comparing GET /index with
the worker's GET /blocks. This test drives one fake vLLM worker over ZMQ
(tests/router/daemon_e2e.py's Worker) through stores on three media,
removals and a clear, and checks that /index lists exactly
what a model of those events says, per tier, as sorted decimal u64 (hashes
above 2^63 included); that approximate-mode records (decisions, not
events) are not listed; and that bad queries, unknown workers and other
methods get a 4xx with the daemon still up.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmq  # noqa: E402

from daemon_e2e import Router, Worker, wait_for, warm_up, health, source  # noqa: E402

TIERS = {"GPU": "g1", "CPU": "g2", "DISK": "g3"}


def applied(router, w, n):
    """Waits until the router applied the worker's first n batches."""
    wait_for(lambda: source(health(router), w.wid)["batches"] >= n, "batches applied", [w])


def check(router, wid, model):
    st, got = router.request("GET", "/index?worker=%d" % wid)
    assert st == 200, got
    assert got["worker"] == wid and got["dp_rank"] == 0 and got["block_size"] == 4, got
    for g in ("g1", "g2", "g3", "g4"):
        want = sorted(h for h, tiers in model.items() if g in tiers)
        assert got[g] == want, (g, got[g], want)


def main():
    ctx = zmq.Context()
    w = Worker(ctx, 1, "map")
    router = Router(["--zmq", "1=tcp://127.0.0.1:%d@tcp://127.0.0.1:%d" % (w.pub_port, w.rep_port),
                     "--block-size", "4", "--worker", "1", "--approx-ttl", "60"])
    try:
        warm_up(router, [w])
        base = source(health(router), 1)["batches"]
        model = {}

        def store(hashes, medium, parent=None):
            w.publish([w.event("BlockStored", hashes, parent, [1] * 4 * len(hashes), medium)])
            for h in hashes:
                model.setdefault(h, set()).add(TIERS[medium])

        def remove(hashes, medium):
            w.publish([w.event("BlockRemoved", hashes, medium=medium)])
            for h in hashes:
                model[h].discard(TIERS[medium])
                if not model[h]:
                    del model[h]

        big = [2**64 - 1, 2**63 + 5, 2**63]
        store([11, 12, 13], "GPU")
        store([14] + big, "GPU", parent=13)
        store([11, 12], "CPU")
        store([21, 22], "DISK")
        remove([13], "GPU")
        remove([22], "DISK")
        applied(router, w, base + 6)
        check(router, 1, model)

        # a clear forgets everything; what follows is listed alone
        w.publish([w.event("AllBlocksCleared")])
        model.clear()
        store([31, 32], "CPU")
        applied(router, w, base + 8)
        check(router, 1, model)

        # a decision of approximate mode is a record, not an event: a
        # /route to this worker records blocks the listing must not show
        st, r = router.request("POST", "/route", {"block_hashes": [901, 902, 903]})
        assert st == 200 and r["worker_id"] == 1 and r["approximate"], r
        st, r = router.request("POST", "/route", {"block_hashes": [901, 902, 903]})
        assert st == 200 and r["workers"][0]["device"] == 3, r  # the record is in the index
        check(router, 1, model)

        # hostile or unknown queries
        for q in ["", "?", "?worker=", "?worker=x", "?worker=1&", "?worker=1&worker=1",
                  "?worker=18446744073709551616", "?worker=-1", "?rank=0", "?worker=1&rank=4294967296",
                  "?worker=1&other=2", "?worker=1;rank=0", "?worker"]:
            st, r = router.request("GET", "/index" + q)
            assert st == 400 and "worker=ID" in r["error"], (q, st, r)
        st, r = router.request("GET", "/index?worker=2")
        assert st == 404 and "not in the index" in r["error"], r
        st, r = router.request("GET", "/index?worker=1&rank=3")
        assert st == 404, r
        st, r = router.request("GET", "/index?rank=0&worker=1")
        assert st == 200 and r["g2"] == [31, 32], r
        st, r = router.request("POST", "/index?worker=1", b"{}")
        assert st == 405, r
        st, r = router.request("GET", "/nothing")
        assert st == 404 and "/index" in r["error"], r
        assert router.stop() == 0
    except Exception:
        sys.stderr.write("router log:\n" + router.logtext())
        router.p.kill()
        raise
    print("index_e2e: ok")


if __name__ == "__main__":
    main()
