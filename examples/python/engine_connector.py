# SPDX-License-Identifier: Apache-2.0
"""kvbm.connector in vLLM's order of calls, one request at a time.

Request "a" is computed (its KV written straight into kvbm's G1 through a
torch view) and committed, which offloads it to G2. A filler pushes it out
of G1. Request "b" shares a's prompt: kvbm finds it in G2, the connector
reports it as external tokens loaded asynchronously, the worker watches
the load land in G1, and b only computes its last token. The "model" here
writes a deterministic stand-in for KV; tests/python/test_connector.py runs
a real (tiny) transformer through the same calls.
"""
from types import SimpleNamespace as NS

import torch

import kvbm
from kvbm.connector import KVConnectorRole, KvbmCacheManager, KvbmConnector, g1_kv_caches

BS, HEADS, DIM = 4, 4, 16
m = kvbm.Manager(block_size=BS, num_layers=2, outer_dim=2, inner_dim=HEADS * DIM, dtype_bytes=4,
                 g1_blocks=8, g2_blocks=32)
cache = KvbmCacheManager(m)
scheduler = KvbmConnector(KVConnectorRole.SCHEDULER, cache)
worker = KvbmConnector(KVConnectorRole.WORKER, cache)
layers = ["layers.0.attn", "layers.1.attn"]
kv_caches = g1_kv_caches(m, layers, num_kv_heads=HEADS)   # views of G1, no copy
worker.register_kv_caches(kv_caches)


def fake_kv(token, pos, layer):
    return torch.full((2, HEADS, DIM), float(token * 1000 + pos * 10 + layer))


def engine_step(scheduled):
    """scheduled: [(request, first token to compute, count)]. One step:
    build_connector_meta, then the worker's side of a forward pass."""
    new = [NS(req_id=r.request_id, num_computed_tokens=s) for r, s, n in scheduled]
    out = NS(scheduled_new_reqs=new, scheduled_cached_reqs=None, finished_req_ids=set(),
             num_scheduled_tokens={r.request_id: n for r, s, n in scheduled})
    worker.bind_connector_metadata(scheduler.build_connector_meta(out))
    worker.start_load_kv(None)
    if scheduled:
        for li, name in enumerate(layers):
            worker.wait_for_layer_load(name)
            for r, start, n in scheduled:
                table = cache.get_block_ids(r.request_id)[0]
                skip = cache.skip_write_blocks(r.request_id, start, start + n)
                for p in range(start, start + n):
                    if p // BS not in skip:
                        kv_caches[name][table[p // BS], :, p % BS] = fake_kv(r.all_token_ids[p], p, li)
            worker.save_kv_layer(name, kv_caches[name], None)
        worker.wait_for_save()                 # commit: a's blocks go to G2 now
    _, loaded = worker.get_finished(set())
    errors = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    return loaded or set(), errors


def run(request):
    """Admits one request (vLLM's waiting-queue calls), waits for its load
    if any, computes what is left, finishes it."""
    blocks, local = cache.get_computed_blocks(request)
    ext, load_async = scheduler.get_num_new_matched_tokens(request, local)
    cache.allocate_slots(request, 0 if load_async else request.num_tokens - local - ext,
                         num_new_computed_tokens=local, num_external_computed_tokens=ext,
                         delay_cache_blocks=load_async)
    scheduler.update_state_after_alloc(request, cache.get_blocks(request.request_id), ext)
    print(f"{request.request_id}: {local} tokens in G1, {ext} to load from G2/G3")
    loaded = set()
    while load_async and request.request_id not in loaded:  # WAITING_FOR_REMOTE_KVS
        loaded, errors = engine_step([])
        assert not errors
    computed = local + ext
    table = cache.get_block_ids(request.request_id)[0]
    for li, name in enumerate(layers):         # what landed is what was written
        for p in range(computed):
            assert torch.equal(kv_caches[name][table[p // BS], :, p % BS],
                               fake_kv(request.all_token_ids[p], p, li))
    engine_step([(request, computed, request.num_tokens - computed)])
    print(f"{request.request_id}: computed {request.num_tokens - computed} tokens;",
          "hits per tier (G1, G2, G3):", cache.request(request.request_id).poll().hit_blocks)
    scheduler.request_finished(request, cache.get_block_ids(request.request_id)[0])
    cache.free(request)
    m.flush()


prompt = list(range(100, 121))                 # 21 tokens: 5 full blocks
run(NS(request_id="a", all_token_ids=prompt, num_tokens=21, num_computed_tokens=0))
run(NS(request_id="filler", all_token_ids=list(range(500, 532)), num_tokens=32, num_computed_tokens=0))
b = NS(request_id="b", all_token_ids=prompt, num_tokens=21, num_computed_tokens=0)
run(b)
print("G2 onboarded blocks:", m.stats(kvbm.Tier.G2)["onboarded_blocks"])
del kv_caches                                  # views keep the manager open
worker.shutdown()
scheduler.shutdown()
m.close()
