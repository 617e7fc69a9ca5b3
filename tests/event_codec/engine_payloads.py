#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Payloads as the engines write them, for the decoder's differential test
(test_decode_diff.c): every profile of tests/events/engine_peer.py (vLLM
v0.8, v0.10, v0.2x and today's tagged maps, SGLang positional and maps,
Dynamo), int and bytes hashes, batches as arrays and as maps, with the
events kvbm must skip mixed in. The events come from engine_peer's Gen,
which is written from the engines' sources; this only packs batches.

  engine_payloads.py N   writes N batches per profile and hash kind to
                         stdout, each as a 4-byte little-endian length and
                         the msgpack payload.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "events"))
import msgpack  # noqa: E402
from engine_peer import Gen  # noqa: E402

PROFILES = ["vllm-v0.8", "vllm-v0.10", "vllm-v0.2x", "vllm", "sglang-positional", "sglang",
            "dynamo"]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    out = sys.stdout.buffer
    for profile in PROFILES:
        for hashes in ("int", "bytes"):
            gen = Gen(profile, hashes, 4321 + n)
            for b in range(n):
                events = []
                for _ in range(gen.rng.randint(1, 8)):
                    ev = gen.event()
                    if ev is None or gen.rng.random() < 0.05:
                        ev = gen.junk()
                    events.append(ev)
                ts = 1.7e9 + b * 0.25
                if profile == "vllm-v0.8":
                    obj = [ts, events]
                elif b % 5 == 4:
                    obj = {"ts": ts, "events": events, "data_parallel_rank": b % 3}
                else:
                    obj = [ts, events, b % 3 if b % 7 else None]
                payload = msgpack.packb(obj, use_bin_type=True)
                out.write(struct.pack("<I", len(payload)))
                out.write(payload)
    out.flush()


if __name__ == "__main__":
    main()
