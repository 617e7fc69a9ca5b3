#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kvbm from Python in a minute: a prefix cache over tiers, KV memory viewed
by numpy without a copy, and the blocks a second request gets back."""
import numpy as np

import kvbm
from kvbm import Tier


def kv_of(m, block):
    """Layer 0 of a G1 block as a float16 array: the tier's memory, no copy.
    (Views keep the manager busy: Manager.close() refuses while one lives.)"""
    return np.frombuffer(m.block_layer(Tier.G1, block, 0), dtype=np.float16)


# G1 holds 8 blocks of 16 tokens; G2 (host) keeps copies of committed blocks.
with kvbm.Manager(block_size=16, num_layers=2, inner_dim=64, g1_blocks=8, g2_blocks=64) as m:
    prompt = np.arange(100, dtype=np.uint32)  # token ids

    # First request: nothing cached. Write the KV of the blocks we must compute.
    with m.prefill(prompt) as req:
        print("first request: cached tokens", req.wait().matched_tokens)
        for k, block in enumerate(req.block_table):
            if req.must_compute(k):
                kv_of(m, block)[:] = k  # stands in for the attention layer's output
        req.commit()  # full blocks are registered, and offloaded to G2
    m.flush()         # wait for the copies (they hold their G1 blocks meanwhile)

    # Other prompts push the first one out of G1.
    for s in range(1, 3):
        with m.prefill(prompt + 1000 * s) as other:
            other.commit()
        m.flush()

    # The same prompt again: its 6 full blocks come back from G2.
    with m.prefill(prompt) as req:
        info = req.wait()
        print("second request: cached tokens", info.matched_tokens,
              "from (G1, G2, G3) =", info.hit_blocks)
        assert (kv_of(m, req.block_table[3]) == 3).all()  # the bytes written, onboarded

print("block hashes:", kvbm.block_hashes(prompt, 16)[:2], "...")
