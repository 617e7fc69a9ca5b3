# SPDX-License-Identifier: Apache-2.0
"""A tiny engine in vLLM's process model, the test bed of kvbm.vllm
(tests/python/test_vllm_*.py).

Processes, as vLLM v1 runs them: the scheduler (vLLM's EngineCore; here the
test's own process) and one worker process per TP rank, started with
``torch.multiprocessing`` (fork) and joined in a ``torch.distributed`` gloo
group of their own. Each worker holds the KV heads of its rank in its own
paged KV tensors, per layer ``[2, num_blocks, block_size, local_heads,
head_dim]`` (FlashAttention's layout, as vLLM allocates it). The scheduler
keeps the engine's own block manager (``BlockPool``: vLLM's prefix-caching
block pool, GPU block ids); kvbm only sees what vLLM's OffloadingConnector
shows an ``OffloadingSpec``.

What crosses the process boundary is what vLLM sends: each step the
scheduler pickles a ``StepData`` (the requests' new tokens and block tables
plus the connector metadata: load and store jobs, each a pair of
LoadStoreSpecs) with ``pickle.dumps``; workers answer with the finished
job ids (and rank 0 with the logits). A job is done when every rank
reported it, as vLLM's scheduler counts its workers' completions.

The connector calls are made in the order of vLLM's OffloadingConnector
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py and
its scheduler/worker halves):

- scheduler, per admitted request: the GPU prefix hit (the block pool),
  ``manager.touch`` of the request's blocks, ``manager.lookup`` of the blocks
  after the GPU hit (get_num_new_matched_tokens; loads are asynchronous),
  allocation, ``manager.prepare_load`` (update_state_after_alloc); per
  step ``manager.prepare_store`` of the blocks the step fills
  (build_connector_meta); on completions ``complete_load`` /
  ``complete_store`` (update_connector_output); a finished request's blocks
  are freed only once its stores are done (request_finished -> True).
- worker, per step: submit last step's deferred stores and this step's
  loads with ``handler.transfer_async`` (start_load_kv), the forward,
  defer this step's stores (wait_for_save), ``handler.get_finished``
  (get_finished).

The model is the tiny transformer's idea (tests/python/tiny_engine.py) cut
per head: every head's projections and attention are their own matrix
products on the same shapes whatever the TP size, the heads' outputs are
all-gathered (not all-reduced) and the output projection is replicated, so
a TP=1, 2 or 4 engine and the plain reference (``TPModel.forward``: the
whole sequence, no cache) produce the same bits. Prefill is one chunk; one
request runs at a time (requests are independent here; batching is not
what kvbm.vllm is about).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import time
import types
import uuid
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import kvbm
from kvbm import vllm as kv


# ---------------------------------------------------------------- the model


class TPModel:
    """Decoder-only transformer, random weights from ``seed``, per-head
    projections (so any TP split computes the same bits)."""

    def __init__(self, *, vocab=256, num_layers=2, num_heads=4, head_dim=8, ffn=64,
                 max_positions=256, seed=0):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale):
            return torch.randn(*shape, generator=g) * scale

        d = num_heads * head_dim
        self.vocab, self.num_layers, self.num_heads, self.head_dim, self.d = (
            vocab, num_layers, num_heads, head_dim, d)
        self.embed = w(vocab, d, scale=1.0)
        self.pos = w(max_positions, d, scale=0.5)
        self.layers = [dict(wq=w(num_heads, d, head_dim, scale=d ** -0.5),
                            wk=w(num_heads, d, head_dim, scale=d ** -0.5),
                            wv=w(num_heads, d, head_dim, scale=d ** -0.5),
                            wo=w(d, d, scale=d ** -0.5), w1=w(d, ffn, scale=d ** -0.5),
                            w2=w(ffn, d, scale=ffn ** -0.5)) for _ in range(num_layers)]
        self.head = w(d, vocab, scale=d ** -0.5)
        self.scale = head_dim ** -0.5

    def embed_tokens(self, tokens, positions):
        return (self.embed[torch.as_tensor(tokens, dtype=torch.long)]
                + self.pos[torch.as_tensor(positions, dtype=torch.long)])

    def norm(self, h):
        return F.layer_norm(h, (self.d,))

    def qkv_head(self, layer, xn, head):
        p = self.layers[layer]
        return xn @ p["wq"][head], xn @ p["wk"][head], xn @ p["wv"][head]

    def attend_head(self, q, keys, values):
        """One query row [hd] over keys/values [n, hd] -> [hd]."""
        s = (q.contiguous().unsqueeze(0) @ keys.contiguous().t()) * self.scale
        return (torch.softmax(s, dim=-1) @ values.contiguous())[0]

    def finish_layer(self, layer, h, attn):
        p = self.layers[layer]
        h = h + attn @ p["wo"]
        return h + F.gelu(self.norm(h) @ p["w1"]) @ p["w2"]

    def logits(self, h_rows):
        return self.norm(h_rows) @ self.head

    def forward(self, tokens):
        """Plain forward, no cache: (last logits, per layer (K, V) [n, heads, hd])."""
        n = len(tokens)
        h = self.embed_tokens(tokens, range(n))
        kvs = []
        for layer in range(self.num_layers):
            xn = self.norm(h)
            heads, ks, vs = [], [], []
            for hd in range(self.num_heads):
                q, k, v = self.qkv_head(layer, xn, hd)
                heads.append(torch.stack([self.attend_head(q[p], k[:p + 1], v[:p + 1])
                                          for p in range(n)]))
                ks.append(k), vs.append(v)
            h = self.finish_layer(layer, h, torch.stack(heads, dim=1).reshape(n, self.d))
            kvs.append((torch.stack(ks, dim=1), torch.stack(vs, dim=1)))
        return self.logits(h[n - 1:n])[0], kvs

    def generate(self, prompt, max_tokens):
        seq, out = list(prompt), []
        for _ in range(max_tokens):
            t = int(torch.argmax(self.forward(seq)[0]))
            out.append(t)
            seq.append(t)
        return out


# ---------------------------------------------------------------- the engine's block manager


class BlockPool:
    """vLLM's GPU block pool, cut down: free blocks, prefix caching by block
    hash, LRU eviction of cached blocks nobody uses, ``reset_prefix_cache``."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free = collections.deque(range(num_blocks))
        self.evictable: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        self.by_hash: dict = {}
        self.hash_of: list = [None] * num_blocks
        self.ref = [0] * num_blocks

    def get_computed_blocks(self, hashes):
        out = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def _take(self):
        if self.free:
            return self.free.popleft()
        if not self.evictable:
            raise RuntimeError("BlockPool: out of GPU blocks")
        b, _ = self.evictable.popitem(last=False)
        del self.by_hash[self.hash_of[b]]
        self.hash_of[b] = None
        return b

    def allocate(self, computed, total):
        for b in computed:
            self.ref[b] += 1
            self.evictable.pop(b, None)
        new = [self._take() for _ in range(total - len(computed))]
        for b in new:
            self.ref[b] = 1
        return list(computed) + new

    def grow(self, blocks, total):
        while len(blocks) < total:
            b = self._take()
            self.ref[b] = 1
            blocks.append(b)

    def cache(self, block, h):
        if self.hash_of[block] is None and h not in self.by_hash:
            self.hash_of[block], self.by_hash[h] = h, block

    def release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash_of[b] is not None:
                    self.evictable[b] = None
                else:
                    self.free.append(b)

    def reset_prefix_cache(self):
        for b in list(self.evictable):
            del self.by_hash[self.hash_of[b]]
            self.hash_of[b] = None
            self.free.append(b)
        self.evictable.clear()


# ---------------------------------------------------------------- plain data between processes


@dataclasses.dataclass
class TransferJob:
    req_id: str
    src_spec: object
    dst_spec: object


@dataclasses.dataclass
class ConnectorMetadata:
    """vLLM's OffloadingConnectorMetadata (job-id form)."""

    load_jobs: dict
    store_jobs: dict


@dataclasses.dataclass
class StepData:
    req_id: Optional[str]
    tokens: list          # the tokens this step computes
    positions: list
    block_table: list     # GPU block ids of the request
    meta: object          # ConnectorMetadata, or KvbmConnectorV1's KvbmConnectorMetadata
    finished_req_ids: set = dataclasses.field(default_factory=set)


def vllm_config(block_size, extra):
    """What kvbm.vllm reads of vLLM's config (VllmConfig's field names)."""
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(kv_connector="OffloadingConnector",
                                                 kv_role="kv_both",
                                                 kv_connector_extra_config=dict(extra)),
        cache_config=types.SimpleNamespace(block_size=block_size))


def block_hash_bytes(tokens, block_size):
    """The request's full-block hashes as vLLM's BlockHash (bytes)."""
    return [h.to_bytes(8, "little") for h in kvbm.block_hashes(tokens, block_size)] \
        if len(tokens) >= block_size else []


class EngineRequest:
    """vLLM's Request, what a connector reads: request_id, all_token_ids,
    num_tokens, block_hashes (of the full blocks, vLLM's bytes)."""

    def __init__(self, request_id, tokens, block_size):
        self.request_id, self.all_token_ids, self.block_size = request_id, list(tokens), block_size

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    @property
    def block_hashes(self):
        return block_hash_bytes(self.all_token_ids, self.block_size)


class KVCacheBlocks:
    """vLLM's KVCacheBlocks: get_block_ids() -> one list per KV-cache group."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


# ---------------------------------------------------------------- a worker (one TP rank)


def _worker_main(rank, tp, store_path, conn, seed, model_kw, num_blocks, block_size, extra,
                 stall_event, mode):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=tp)
    model = TPModel(seed=seed, **model_kw)
    lh = model.num_heads // tp
    heads = range(rank * lh, (rank + 1) * lh)
    caches = {f"model.layers.{i}.attn": torch.zeros(2, num_blocks, block_size, lh,
                                                    model.head_dim)
              for i in range(model.num_layers)}
    cfg = vllm_config(block_size, dict(extra, kvbm_tp_rank=rank))
    handlers, connector = {}, None
    if mode == "connector":                          # KVConnectorBase_V1, worker role
        connector = kv.KvbmConnectorV1(cfg, kv.KVConnectorRole.WORKER)
        connector.register_kv_caches(caches)
        handler = connector.handler
    else:                                            # vLLM's OffloadingWorker registry
        spec = kv.KvbmOffloadingSpec(cfg)
        for src, dst, h in spec.get_handlers(caches):
            handlers[(src.medium(), dst.medium())] = h
        handler = next(iter(handlers.values()))
    deferred, pending = [], set()
    kv_list = list(caches.values())

    def submit(job_id, src, dst):
        handlers[(src.medium(), dst.medium())].transfer_async(job_id, (src, dst))
        pending.add(job_id)

    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            handler.close()
            conn.send(("stopped",))
            break
        if msg[0] == "stall_loads":
            real = handler._scatter

            def stalled(copies, real=real):
                real([(s, a[:1], b[:1], d) for s, a, b, d in copies])  # part has landed...
                stall_event.set()
                time.sleep(600)                 # ...and the rest never comes
            handler._scatter = stalled
            conn.send(("ok",))
            continue
        if msg[0] == "dump":
            ids = torch.tensor(msg[1], dtype=torch.long)
            conn.send(("kv", [t.index_select(1, ids).clone() for t in kv_list]))
            continue
        step: StepData = pickle.loads(msg[1])
        if connector is not None:
            conn.send(("step",) + _connector_step(connector, model, kv_list, heads, tp, step,
                                                  block_size, rank))
            continue
        # start_load_kv: last step's stores, then this step's loads
        for job_id, src, dst in deferred:
            submit(job_id, src, dst)
        deferred = []
        for job_id, job in step.meta.load_jobs.items():
            submit(job_id, job.src_spec, job.dst_spec)
        logits = None
        if step.tokens:
            logits = _forward(model, kv_list, heads, tp, step, block_size)
        # wait_for_save: stores start at the next step (after sampling), as in vLLM
        deferred = [(j, job.src_spec, job.dst_spec) for j, job in step.meta.store_jobs.items()]
        if not step.tokens and pending:  # an idle step: give transfers a moment
            handler.wait(set(list(pending)[:1]))
        done = [(r.job_id, bool(r.success)) for r in handler.get_finished()]
        pending.difference_update(j for j, _ in done)
        conn.send(("step", logits if rank == 0 else None, done))
    dist.destroy_process_group()


def _connector_step(connector, model, kv_list, heads, tp, step, block_size, rank):
    """One step of vLLM's model runner around a KVConnectorBase_V1."""
    connector.bind_connector_metadata(step.meta)
    connector.start_load_kv(None)
    logits = None
    if step.tokens:
        logits = _forward(model, kv_list, heads, tp, step, block_size, connector)
    connector.wait_for_save()
    if not step.tokens:                               # an idle step: give transfers a moment
        connector.handler.wait(set(list(connector.handler._jobs)[:1]))
    sending, recving = connector.get_finished(step.finished_req_ids)
    errors = connector.get_block_ids_with_load_errors()
    meta = connector.build_connector_worker_meta()
    connector.clear_connector_metadata()
    return logits if rank == 0 else None, (sending, recving, errors, meta)


def _forward(model, kv_list, heads, tp, step, block_size, connector=None):
    n = len(step.tokens)
    h = model.embed_tokens(step.tokens, step.positions)
    for layer in range(model.num_layers):
        cache = kv_list[layer]
        name = f"model.layers.{layer}.attn"
        if connector is not None:
            connector.wait_for_layer_load(name)
        xn = model.norm(h)
        outs = []
        for j, head in enumerate(heads):
            q, k, v = model.qkv_head(layer, xn, head)
            for i, p in enumerate(step.positions):
                b, off = step.block_table[p // block_size], p % block_size
                cache[0, b, off, j] = k[i]
                cache[1, b, off, j] = v[i]
            rows = []
            for i, p in enumerate(step.positions):
                blocks = torch.tensor(step.block_table[:p // block_size + 1], dtype=torch.long)
                keys = cache[0].index_select(0, blocks)[:, :, j].reshape(-1, model.head_dim)
                vals = cache[1].index_select(0, blocks)[:, :, j].reshape(-1, model.head_dim)
                rows.append(model.attend_head(q[i], keys[:p + 1], vals[:p + 1]))
            outs.append(torch.stack(rows))
        local = torch.stack(outs, dim=1).contiguous()      # rows, local heads, hd
        parts = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(parts, local)
        if connector is not None:
            connector.save_kv_layer(name, cache, None)
        h = model.finish_layer(layer, h, torch.cat(parts, dim=1).reshape(n, model.d))
    return model.logits(h[n - 1:n])[0]


# ---------------------------------------------------------------- the scheduler (EngineCore)


@dataclasses.dataclass
class Result:
    tokens: list
    gpu_hit_tokens: int
    external_tokens: int
    load_failed: bool
    block_table: list


class TPEngine:
    """The scheduler process's side: block pool, kvbm's OffloadingManager,
    the per-step pickled data, the workers."""

    def __init__(self, *, tp, extra, tmpdir, num_gpu_blocks=48, block_size=4, seed=0,
                 model_kw=None, mode="offloading"):
        self.tp, self.block_size, self.mode = tp, block_size, mode
        self.model_kw = model_kw or {}
        cfg = vllm_config(block_size, dict(extra, kvbm_tp_rank=0))
        if mode == "connector":
            self.connector = kv.KvbmConnectorV1(cfg, kv.KVConnectorRole.SCHEDULER)
            self.manager = self.connector.manager
        else:
            self.spec = kv.KvbmOffloadingSpec(cfg)
            self.manager = self.spec.get_manager()
        self.pool = BlockPool(num_gpu_blocks)
        self.next_job = 1
        self.jobs: dict = {}          # job id -> (kind, req_id, block hashes)
        self.counts: collections.Counter = collections.Counter()
        self.failed: set = set()
        self.meta_bytes = []          # the pickled steps, for the tests
        ctx = mp.get_context("fork")
        self.stall_event = ctx.Event()
        store = os.path.join(str(tmpdir), f"gloo-{uuid.uuid4().hex}")
        self.conns, self.procs = [], []
        for r in range(tp):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, daemon=True,
                            args=(r, tp, store, child, seed, self.model_kw, num_gpu_blocks,
                                  block_size, extra, self.stall_event, mode))
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    # -- talking to the workers
    def _recv(self, rank):
        try:
            return self.conns[rank].recv()
        except (EOFError, ConnectionError, OSError):
            raise self._died(rank) from None

    def _died(self, rank):
        lost = sorted(j for j, (kind, _, _) in self.jobs.items())
        for j in lost:                      # nothing of theirs is trusted: unpin, fail
            kind, _, hashes = self.jobs.pop(j)
            if kind == "load":
                self.manager.complete_load(hashes)
            else:
                self.manager.complete_store(hashes, success=False)
        return kv._error(kv.TransferFailedError, f"tiny engine: worker rank {rank} died; "
                         f"transfer jobs {lost} failed")

    def _step(self, data: StepData):
        blob = pickle.dumps(data)            # vLLM ships SchedulerOutput to its workers
        self.meta_bytes.append(len(blob))
        for r, c in enumerate(self.conns):
            try:
                c.send(("step", blob))
            except (BrokenPipeError, ConnectionError, OSError):
                raise self._died(r) from None
        logits = None
        for r in range(self.tp):
            kind, lg, done = self._recv(r)
            if r == 0:
                logits = lg
            for job_id, ok in done:           # vLLM aggregates the ranks' completions
                self.counts[job_id] += 1
                if not ok:
                    self.failed.add(job_id)
        finished = []
        for job_id in [j for j, c in self.counts.items() if c == self.tp]:
            del self.counts[job_id]
            kind, req_id, hashes = self.jobs.pop(job_id)
            ok = job_id not in self.failed
            self.failed.discard(job_id)
            if kind == "load":
                self.manager.complete_load(hashes)
            else:
                self.manager.complete_store(hashes, success=ok)
            finished.append((kind, req_id, ok))
        return logits, finished

    def command(self, rank, *msg):
        self.conns[rank].send(msg)
        return self._recv(rank)

    def dump_kv(self, block_ids):
        """Per rank, per layer, the [2, n, bs, local_heads, hd] KV of GPU blocks."""
        return [self.command(r, "dump", list(block_ids))[1] for r in range(self.tp)]

    # -- one request
    def _store_jobs(self, req_id, tokens, n_tokens_done, blocks, state):
        """prepare_store for the blocks this step fills (build_connector_meta)."""
        hashes = block_hash_bytes(tokens[:n_tokens_done], self.block_size)
        start = state["next_store"]
        if len(hashes) <= start:
            return {}
        new = hashes[start:]
        out = self.manager.prepare_store(new)
        if out is None:
            return {}
        state["next_store"] = len(hashes)
        to_store = set(out.block_hashes_to_store)
        if not to_store:
            return {}
        self.manager.touch(hashes)
        ids = [blocks[start + i] for i, h in enumerate(new) if h in to_store]
        job = self.next_job
        self.next_job += 1
        stored = [h for h in new if h in to_store]
        self.jobs[job] = ("store", req_id, stored)
        state["stores"].add(job)
        return {job: TransferJob(req_id, kv.GPULoadStoreSpec(ids), out.store_spec)}

    def generate(self, req_id, prompt, max_tokens, *, step_limit=500) -> Result:
        if self.mode == "connector":
            return self._generate_v1(req_id, prompt, max_tokens, step_limit)
        bs = self.block_size
        tokens = list(prompt)
        # admission: GPU prefix hit, then the connector (prompt[:-1]: one token is computed)
        hashes = block_hash_bytes(tokens[:-1], bs)
        computed = self.pool.get_computed_blocks(hashes)
        n_local = len(computed) * bs
        self.manager.touch(hashes)                                   # get_num_new_matched_tokens
        hits = self.manager.lookup(hashes[len(computed):]) if len(hashes) > len(computed) else 0
        n_ext = hits * bs
        blocks = self.pool.allocate(computed, -(-len(tokens) // bs))
        state = {"next_store": len(computed) + hits, "stores": set()}
        load_jobs = {}
        if hits:                                                     # update_state_after_alloc
            load_hashes = hashes[len(computed):len(computed) + hits]
            src = self.manager.prepare_load(load_hashes)
            dst = kv.GPULoadStoreSpec(blocks[len(computed):len(computed) + hits])
            job = self.next_job
            self.next_job += 1
            self.jobs[job] = ("load", req_id, load_hashes)
            load_jobs[job] = TransferJob(req_id, src, dst)
        num_computed, load_failed = n_local, False
        waiting_load = bool(load_jobs)
        out_tokens: list = []
        meta = ConnectorMetadata(load_jobs, {})
        steps = 0
        while True:
            steps += 1
            if steps > step_limit:
                raise kv._error(kvbm.TimedOutError, f"tiny engine: {req_id} did not finish")
            if waiting_load or len(out_tokens) >= max_tokens:
                data = StepData(None, [], [], blocks, meta)          # nothing to compute
            else:
                new = tokens[num_computed:]
                pos = list(range(num_computed, len(tokens)))
                self.pool.grow(blocks, -(-len(tokens) // bs))
                meta.store_jobs.update(self._store_jobs(req_id, tokens, len(tokens), blocks,
                                                        state))
                data = StepData(req_id, new, pos, list(blocks), meta)
            logits, finished = self._step(data)
            meta = ConnectorMetadata({}, {})
            for kind, rid, ok in finished:
                if kind == "load" and rid == req_id:
                    waiting_load = False
                    if ok:
                        num_computed = n_local + n_ext
                    else:                                            # vLLM: recompute
                        load_failed = True
            if data.tokens:
                num_computed = len(tokens)
                for i, h in enumerate(block_hash_bytes(tokens, bs)):
                    self.pool.cache(blocks[i], h)
                if len(out_tokens) < max_tokens:
                    t = int(torch.argmax(logits))
                    out_tokens.append(t)
                    tokens.append(t)
            if len(out_tokens) >= max_tokens and not waiting_load:
                # request_finished: blocks wait for the stores in flight
                if not any(j in self.jobs for j in state["stores"]):
                    break
        result = Result(out_tokens, n_local, 0 if load_failed else n_ext, load_failed,
                        list(blocks))
        self.pool.release(blocks)
        return result

    # -- one request through a KVConnectorBase_V1 (kvbm.vllm.KvbmConnectorV1)
    def _send_step(self, data):
        blob = pickle.dumps(data)
        self.meta_bytes.append(len(blob))
        for r, c in enumerate(self.conns):
            try:
                c.send(("step", blob))
            except (BrokenPipeError, ConnectionError, OSError):
                raise self._died(r) from None
        return [self._recv(r) for r in range(self.tp)]

    def _generate_v1(self, req_id, prompt, max_tokens, step_limit) -> Result:
        bs, conn = self.block_size, self.connector
        req = EngineRequest(req_id, prompt, bs)
        computed = self.pool.get_computed_blocks(block_hash_bytes(prompt[:-1], bs))
        n_local = len(computed) * bs
        n_ext, _ = conn.get_num_new_matched_tokens(req, n_local)
        blocks = self.pool.allocate(computed, -(-len(prompt) // bs))
        conn.update_state_after_alloc(req, KVCacheBlocks(blocks), n_ext)
        waiting, failed, first, known = n_ext > 0, False, True, 0
        num_computed, out_tokens, finishing = n_local, [], 0
        recv_counts, send_counts = collections.Counter(), collections.Counter()
        for _ in range(step_limit):
            so = types.SimpleNamespace(
                scheduled_new_reqs=[], num_scheduled_tokens={},
                scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], new_block_ids=[],
                                                            num_computed_tokens=[]))
            tokens = req.all_token_ids
            compute = not waiting and len(out_tokens) < max_tokens
            if compute:
                self.pool.grow(blocks, -(-len(tokens) // bs))
                if first:
                    so.scheduled_new_reqs.append(types.SimpleNamespace(
                        req_id=req_id, block_ids=(list(blocks),), num_computed_tokens=num_computed))
                else:
                    c = so.scheduled_cached_reqs
                    c.req_ids.append(req_id)
                    c.new_block_ids.append((blocks[known:],) if len(blocks) > known else None)
                    c.num_computed_tokens.append(num_computed)
                first, known = False, len(blocks)
                so.num_scheduled_tokens[req_id] = len(tokens) - num_computed
            meta = conn.build_connector_meta(so)
            data = StepData(req_id if compute else None, tokens[num_computed:] if compute else [],
                            list(range(num_computed, len(tokens))) if compute else [],
                            list(blocks), meta, {req_id} if finishing == 1 else set())
            answers = self._send_step(data)
            logits, agg, errors = answers[0][1], None, set()
            for _, _, (sending, recving, errs, wmeta) in answers:   # vLLM's KVOutputAggregator
                recv_counts.update(recving or ())
                send_counts.update(sending or ())
                errors |= errs
                if wmeta is not None:
                    agg = wmeta if agg is None else agg.aggregate(wmeta)
            out = types.SimpleNamespace(
                finished_recving={r for r, n in recv_counts.items() if n >= self.tp},
                finished_sending={r for r, n in send_counts.items() if n >= self.tp},
                kv_connector_worker_meta=agg)
            conn.update_connector_output(out)
            if waiting and req_id in out.finished_recving:
                waiting = False
                bad = [i for i, b in enumerate(blocks) if b in errors]
                failed = bool(bad)
                num_computed = min(bad[0] * bs, n_local) if bad else n_local + n_ext
            if compute:
                num_computed = len(tokens)
                for i, h in enumerate(block_hash_bytes(tokens, bs)):
                    self.pool.cache(blocks[i], h)
                t = int(torch.argmax(logits))
                out_tokens.append(t)
                req.all_token_ids.append(t)
            if finishing:
                finishing += 1                   # finished_req_ids go out once, as in vLLM
            if len(out_tokens) >= max_tokens and not waiting:
                if not finishing:
                    finishing = 1
                    delay, _ = conn.request_finished(req, list(blocks))
                    if not delay:
                        break
                elif req_id in out.finished_sending:
                    break
        else:
            raise kv._error(kvbm.TimedOutError, f"tiny engine: {req_id} did not finish "
                            f"(jobs {sorted(conn._jobs)}, rank counts {dict(conn._counts)}, "
                            f"sent {dict(send_counts)}, waiting {waiting}, "
                            f"finishing {finishing}, tokens {len(out_tokens)})")
        self.pool.release(blocks)
        return Result(out_tokens, n_local, 0 if failed else n_ext, failed, list(blocks))

    def close(self):
        for r, c in enumerate(self.conns):
            try:
                if self.procs[r].is_alive():
                    c.send(("stop",))
                    c.recv()
            except (EOFError, ConnectionError, OSError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        if self.mode == "connector":
            self.connector.shutdown()
        else:
            self.manager.close()
