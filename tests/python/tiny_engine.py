# SPDX-License-Identifier: Apache-2.0
"""A tiny vLLM-shaped engine over a tiny torch transformer: the test bed of
kvbm.connector (tests/python/test_connector.py).

The model is a decoder-only transformer with random weights (a fixed seed;
no downloads): token and learned position embeddings, pre-norm attention and
MLP blocks, a vocabulary head. Its arithmetic is arranged so that the KV and
logits of a position are a function of the tokens up to it only, bit for
bit, whatever the batch: projections are row-wise matrix products, and each
query row attends with the same operations on the same shapes in the paged
engine and in the plain reference (`TinyTransformer.generate`, a full
forward pass over the whole sequence for every token, no cache at all). So
"the engine produced the reference's tokens" and "recomputed KV equals the
KV computed before" are exact checks, not tolerances.

The engine is vLLM v1's loop cut to what a connector sees:

- ``Scheduler.schedule()``: running requests first (decode: one token;
  ``allocate_slots`` may preempt), then waiting requests, in vLLM's order of
  calls: ``get_computed_blocks``, ``connector.get_num_new_matched_tokens``,
  ``allocate_slots``, ``connector.update_state_after_alloc``; a request with
  an asynchronous load waits in WAITING_FOR_REMOTE_KVS; then
  ``connector.build_connector_meta``.
- ``ModelRunner.execute_model()``: ``bind_connector_metadata``,
  ``start_load_kv``, per layer ``wait_for_layer_load`` / write KV into the
  paged cache / attention / ``save_kv_layer``, ``wait_for_save``,
  ``get_finished``, ``get_block_ids_with_load_errors``,
  ``clear_connector_metadata``.
- ``Scheduler.update_from_output()``: sampled tokens, stop checks,
  ``request_finished`` then ``free``, finished loads (with failed blocks
  truncating the request's computed tokens, vLLM's "recompute" policy).

Two things differ from vLLM because kvbm shares blocks before they are
written (see kvbm/connector.py): the scheduler skips a request while
``KvbmCacheManager.dependencies()`` is not empty, and the runner's slot
mapping skips the blocks ``skip_write_blocks()`` names (slot -1, as vLLM's
padding). Prefill is never chunked (a prompt's uncomputed tokens run in one
step) and the runner takes a request's whole block table every step (kvbm
may swap a sealed tail block for an equal registered one).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from typing import Callable, Optional

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- the model


class TinyTransformer:
    """Decoder-only transformer, random weights from ``seed``."""

    def __init__(self, *, vocab: int = 512, num_layers: int = 2, num_heads: int = 4,
                 head_dim: int = 16, ffn: int = 128, max_positions: int = 512, seed: int = 0,
                 dtype=torch.float32):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale):
            return torch.randn(*shape, generator=g, dtype=dtype) * scale

        d = num_heads * head_dim
        self.vocab, self.num_layers, self.num_heads, self.head_dim, self.d = (
            vocab, num_layers, num_heads, head_dim, d)
        self.dtype = dtype
        self.max_positions = max_positions
        self.embed = w(vocab, d, scale=1.0)
        self.pos = w(max_positions, d, scale=0.5)
        self.layers = [dict(wqkv=w(d, 3 * d, scale=d ** -0.5), wo=w(d, d, scale=d ** -0.5),
                            w1=w(d, ffn, scale=d ** -0.5), w2=w(ffn, d, scale=ffn ** -0.5))
                       for _ in range(num_layers)]
        self.head = w(d, vocab, scale=d ** -0.5)
        self.scale = head_dim ** -0.5

    def embed_tokens(self, tokens, positions) -> torch.Tensor:
        t = torch.as_tensor(tokens, dtype=torch.long)
        p = torch.as_tensor(positions, dtype=torch.long)
        return self.embed[t] + self.pos[p]

    def qkv(self, layer: int, h: torch.Tensor):
        """(q, k, v), each [rows, heads, head_dim], contiguous."""
        x = F.layer_norm(h, (self.d,)) @ self.layers[layer]["wqkv"]
        n = h.shape[0]
        q, k, v = (x[:, i * self.d:(i + 1) * self.d].reshape(n, self.num_heads, self.head_dim).contiguous()
                   for i in range(3))
        return q, k, v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One query row [heads, head_dim] over keys/values [n, heads,
        head_dim] (positions 0..n-1, causal by construction) -> [d]."""
        k = keys.contiguous().transpose(0, 1)      # heads, n, dim
        v = values.contiguous().transpose(0, 1)
        s = torch.matmul(q.contiguous().unsqueeze(1), k.transpose(1, 2)) * self.scale  # heads, 1, n
        return torch.matmul(torch.softmax(s, dim=-1), v).reshape(self.d)

    def finish_layer(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        p = self.layers[layer]
        h = h + attn @ p["wo"]
        return h + F.gelu(F.layer_norm(h, (self.d,)) @ p["w1"]) @ p["w2"]

    def logits(self, h_rows: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(h_rows, (self.d,)) @ self.head

    def forward(self, tokens: list[int]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Plain non-paged forward over a whole sequence: (logits of the
        last position, per layer (K, V) [len, heads, head_dim])."""
        n = len(tokens)
        h = self.embed_tokens(tokens, range(n))
        kvs = []
        for layer in range(self.num_layers):
            q, k, v = self.qkv(layer, h)
            attn = torch.stack([self.attend(q[p], k[:p + 1], v[:p + 1]) for p in range(n)])
            h = self.finish_layer(layer, h, attn)
            kvs.append((k, v))
        return self.logits(h[n - 1:n])[0], kvs

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens with kvbm switched off: a full forward pass over
        the whole sequence for every token."""
        seq, out = list(prompt), []
        for _ in range(max_tokens):
            t = int(torch.argmax(self.forward(seq)[0]))
            out.append(t)
            seq.append(t)
        return out


# ---------------------------------------------------------------- requests


class RequestStatus(enum.IntEnum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_LENGTH_CAPPED


class Request:
    """vLLM's Request, the fields an engine and a connector read."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 cache_salt: Optional[str] = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.lora_request = None
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1           # computed tokens when first scheduled
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.load_expected_tokens = 0         # local + external while loading
        self.failed_load_tokens = 0           # of which did not load (recomputed)
        # what the test looks at
        self.local_hit_tokens: list[int] = []  # per admission
        self.external_tokens: list[int] = []

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def is_finished(self) -> bool:
        return self.status.is_finished()


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]   # all tokens (a resumed request's outputs too)
    block_ids: tuple[list[int]]
    num_computed_tokens: int


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list[str]
    block_ids: list[tuple[list[int]]]   # the whole table (see the module notes)
    num_computed_tokens: list[int]


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str]
    skip_write_blocks: dict[str, set[int]]
    kv_connector_metadata: object = None


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    invalid_block_ids: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    kv_connector_output: KVConnectorOutput


@dataclasses.dataclass
class ForwardContext:
    attn_metadata: object = None


# ---------------------------------------------------------------- scheduler


class Scheduler:
    def __init__(self, kv_cache_manager, connector, *, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 2048,
                 on_loaded: Optional[Callable[[Request], None]] = None):
        self.kv = kv_cache_manager
        self.connector = connector
        self.block_size = kv_cache_manager.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.on_loaded = on_loaded
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.num_dependency_waits = 0

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones whose blocks wait for the
        worker (an aborted load is freed when the worker reports it)."""
        return bool(self.requests)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[Request] = []
        cached_reqs: list[Request] = []
        preempted: list[Request] = []

        # Running requests first.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n_new = req.num_tokens - req.num_computed_tokens
            if n_new > budget:
                i += 1
                continue
            while True:
                blocks = self.kv.allocate_slots(req, n_new)
                if blocks is not None:
                    break
                victim = self.running.pop()  # the lowest priority: the last admitted
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if blocks is None:
                break
            if self.kv.dependencies(req.request_id):
                self.num_dependency_waits += 1
                i += 1
                continue
            num_scheduled[req.request_id] = n_new
            budget -= n_new
            cached_reqs.append(req)
            i += 1

        # Then waiting requests (not in a step that preempted).
        skipped: list[Request] = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if not self._update_waiting_for_remote_kv(req):
                    skipped.append(self.waiting.popleft())
                    continue
                req.status = RequestStatus.PREEMPTED if req.num_preemptions else RequestStatus.WAITING
            load_async = False
            ext = 0
            if req.num_computed_tokens == 0:
                computed_blocks, n_local = self.kv.get_computed_blocks(req)
                ext, load_async = self.connector.get_num_new_matched_tokens(req, n_local)
                req.num_external_computed_tokens = ext
                n_computed = n_local + ext
            else:
                computed_blocks, n_local = None, 0
                n_computed = req.num_computed_tokens
            if load_async:
                n_new = 0
            else:
                n_new = req.num_tokens - n_computed
                if n_new > budget:
                    break  # no chunked prefill
            blocks = self.kv.allocate_slots(req, n_new, num_new_computed_tokens=n_local,
                                            new_computed_blocks=computed_blocks,
                                            num_external_computed_tokens=ext,
                                            delay_cache_blocks=load_async)
            if blocks is None:
                break
            self.connector.update_state_after_alloc(req, self.kv.get_blocks(req.request_id), ext)
            self.waiting.popleft()
            if req.num_computed_tokens == 0:
                req.local_hit_tokens.append(n_local)
                req.external_tokens.append(ext)
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                req.load_expected_tokens = n_computed
                skipped.append(req)
                continue
            if self.kv.dependencies(req.request_id):
                self.num_dependency_waits += 1
                req.num_computed_tokens = n_computed
                skipped.append(req)
                continue
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = n_computed
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = n_computed
            num_scheduled[req.request_id] = n_new
            budget -= n_new
            new_reqs.append(req)
        self.waiting.extendleft(reversed(skipped))

        so = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData(r.request_id, r.all_token_ids,
                                               self.kv.get_block_ids(r.request_id), r.num_computed_tokens)
                                for r in new_reqs],
            scheduled_cached_reqs=CachedRequestData(
                [r.request_id for r in cached_reqs],
                [self.kv.get_block_ids(r.request_id) for r in cached_reqs],
                [r.num_computed_tokens for r in cached_reqs]),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted},
            skip_write_blocks={rid: self.kv.skip_write_blocks(rid, self.requests[rid].num_computed_tokens,
                                                              self.requests[rid].num_computed_tokens + n)
                               for rid, n in num_scheduled.items()},
        )
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        self.finished_req_ids = set()
        return so

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _update_waiting_for_remote_kv(self, req: Request) -> bool:
        rid = req.request_id
        if rid not in self.finished_recving_kv_req_ids:
            return False
        self.finished_recving_kv_req_ids.discard(rid)
        if rid in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.discard(rid)
            if req.num_computed_tokens == 0:
                self.kv.free(req)  # nothing valid: look it up again
                return True
        else:
            req.num_computed_tokens = req.load_expected_tokens
        if self.on_loaded is not None:
            self.on_loaded(req)
        return True

    def _handle_invalid_blocks(self, invalid: set[int]) -> None:
        for req in self.waiting:
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                continue
            # Up to what the request counts as computed: its load, or what an
            # earlier failure left of it.
            limit = (req.num_computed_tokens if req.request_id in self.failed_recving_kv_req_ids
                     else req.load_expected_tokens)
            table = self.kv.get_block_ids(req.request_id)[0]
            for k in range(-(-limit // self.block_size)):
                if table[k] in invalid:
                    req.num_computed_tokens = k * self.block_size
                    req.failed_load_tokens += limit - req.num_computed_tokens
                    req.num_external_computed_tokens = max(
                        0, req.num_external_computed_tokens - (limit - req.num_computed_tokens))
                    self.failed_recving_kv_req_ids.add(req.request_id)
                    break

    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[Request]:
        kvo = out.kv_connector_output
        if kvo.invalid_block_ids:
            self._handle_invalid_blocks(kvo.invalid_block_ids)
        finished = []
        for rid in so.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            for t in out.sampled_token_ids[out.req_id_to_index[rid]]:
                req.output_token_ids.append(t)
                if len(req.output_token_ids) >= req.max_tokens:
                    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    break
            if req.is_finished():
                self.running.remove(req)
                self._free_request(req)
                finished.append(req)
        for rid in kvo.finished_recving or ():
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert req.is_finished()
                self._free_blocks(req)
        for rid in kvo.finished_sending or ():
            self._free_blocks(self.requests[rid])
        return finished

    def finish_requests(self, request_ids, status=RequestStatus.FINISHED_ABORTED) -> None:
        """Aborts requests (vLLM's finish_requests)."""
        for rid in list(request_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = rid not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(rid)
                self.failed_recving_kv_req_ids.discard(rid)
            req.status = status
            self._free_request(req, delay_free_blocks=delay)

    def _free_request(self, req: Request, delay_free_blocks: bool = False) -> None:
        rid = req.request_id
        block_ids = self.kv.get_block_ids(rid)[0] if self.kv.has_live_request(rid) else []
        delay, _ = self.connector.request_finished(req, block_ids)
        self.finished_req_ids.add(req.request_id)
        if not (delay or delay_free_blocks):
            self._free_blocks(req)

    def _free_blocks(self, req: Request) -> None:
        if self.kv.has_request(req.request_id):
            self.kv.free(req)
        del self.requests[req.request_id]


# ---------------------------------------------------------------- worker


class ModelRunner:
    def __init__(self, model: TinyTransformer, kv_caches: dict, connector, block_size: int,
                 on_step: Optional[Callable[[SchedulerOutput], None]] = None):
        self.model = model
        self.kv_caches = kv_caches
        self.layer_names = list(kv_caches)
        self.connector = connector
        self.block_size = block_size
        self.on_step = on_step
        self.tokens: dict[str, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        connector.register_kv_caches(kv_caches)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for rid in so.finished_req_ids | so.preempted_req_ids:
            self.tokens.pop(rid, None)
            self.tables.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            self.tokens[nr.req_id] = list(nr.prompt_token_ids)
            self.tables[nr.req_id] = list(nr.block_ids[0])
        cr = so.scheduled_cached_reqs
        for rid, ids in zip(cr.req_ids, cr.block_ids):
            self.tables[rid] = list(ids[0])
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        starts.update(zip(cr.req_ids, cr.num_computed_tokens))

        conn = self.connector
        conn.bind_connector_metadata(so.kv_connector_metadata)
        conn.start_load_kv(ForwardContext())
        req_ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        if so.total_num_scheduled_tokens > 0:
            sampled = self._forward(so, req_ids, starts)
            conn.wait_for_save()
        if self.on_step is not None:
            self.on_step(so)
        finished_sending, finished_recving = conn.get_finished(so.finished_req_ids)
        invalid = conn.get_block_ids_with_load_errors()
        conn.clear_connector_metadata()
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled,
                                 KVConnectorOutput(finished_sending, finished_recving, invalid))

    def _forward(self, so: SchedulerOutput, req_ids: list[str], starts: dict[str, int]) -> list[list[int]]:
        bs = self.block_size
        model = self.model
        tokens, positions, rows, slots = [], [], [], []
        for rid in req_ids:
            start, n = starts[rid], so.num_scheduled_tokens[rid]
            table, skip = self.tables[rid], so.skip_write_blocks[rid]
            first = len(tokens)
            for p in range(start, start + n):
                tokens.append(self.tokens[rid][p])
                positions.append(p)
                k = p // bs
                slots.append(-1 if k in skip else table[k] * bs + p % bs)
            rows.append((rid, first, start, n))
        slots_t = torch.tensor(slots, dtype=torch.long)
        write = slots_t >= 0
        blk, off = slots_t[write] // bs, slots_t[write] % bs
        h = model.embed_tokens(tokens, positions)
        for layer, name in enumerate(self.layer_names):
            self.connector.wait_for_layer_load(name)
            cache = self.kv_caches[name]               # [blocks, 2, bs, heads, dim]
            q, k, v = model.qkv(layer, h)
            cache[blk, 0, off] = k[write]
            cache[blk, 1, off] = v[write]
            attn = torch.empty(len(tokens), model.d, dtype=h.dtype)
            for rid, first, start, n in rows:
                ctx = start + n
                table = torch.tensor(self.tables[rid][: -(-ctx // bs)], dtype=torch.long)
                keys = cache[table, 0].reshape(-1, model.num_heads, model.head_dim)[:ctx]
                values = cache[table, 1].reshape(-1, model.num_heads, model.head_dim)[:ctx]
                for i in range(n):
                    p = start + i
                    attn[first + i] = model.attend(q[first + i], keys[:p + 1], values[:p + 1])
            self.connector.save_kv_layer(name, cache, None)
            h = model.finish_layer(layer, h, attn)
        out = []
        for rid, first, start, n in rows:
            if start + n < len(self.tokens[rid]):
                out.append([])  # not at the end of its tokens: nothing to sample
                continue
            t = int(torch.argmax(model.logits(h[first + n - 1:first + n])[0]))
            self.tokens[rid].append(t)
            out.append([t])
        return out


# ---------------------------------------------------------------- engine


class Engine:
    """Scheduler + model runner + the two connector roles, one process."""

    def __init__(self, model: TinyTransformer, manager, *, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 2048, on_loaded=None, on_step=None):
        from kvbm.connector import KVConnectorRole, KvbmCacheManager, KvbmConnector, g1_kv_caches

        self.model = model
        self.manager = manager
        self.kv = KvbmCacheManager(manager)
        self.scheduler_connector = KvbmConnector(KVConnectorRole.SCHEDULER, self.kv)
        self.worker_connector = KvbmConnector(KVConnectorRole.WORKER, self.kv)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(model.num_layers)]
        self.kv_caches = g1_kv_caches(manager, names, num_kv_heads=model.num_heads, dtype=model.dtype)
        self.scheduler = Scheduler(self.kv, self.scheduler_connector, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens, on_loaded=on_loaded)
        self.runner = ModelRunner(model, self.kv_caches, self.worker_connector, self.kv.block_size,
                                  on_step=on_step)
        self.steps = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def step(self) -> list[Request]:
        so = self.scheduler.schedule()
        out = self.runner.execute_model(so)
        self.steps += 1
        return self.scheduler.update_from_output(so, out)

    def run(self, max_steps: int = 100000) -> list[Request]:
        """Steps until every request finished (loads are waited for by
        stepping, as an engine does)."""
        done = []
        while self.scheduler.has_requests():
            if self.steps >= max_steps:
                raise RuntimeError(f"engine did not finish in {max_steps} steps")
            done += self.step()
        return done

    def close(self) -> None:
        """Drops the G1 views (so the manager can close) and the connectors."""
        self.scheduler_connector.shutdown()
        self.worker_connector.shutdown()
        self.runner.kv_caches = None
        self.kv_caches = None
