# SPDX-License-Identifier: Apache-2.0
"""The tiny torch engine of tiny_engine.py on CUDA, its paged KV cache a CUDA
tensor the engine allocated and kvbm adopted as device G1 (Manager(g1_ptr=
tensor.data_ptr(), g1_memory='device')), with pinned G2 kvbm allocates.

Prompts share a 3-block prefix. The first request computes its KV into the
engine's tensor and commits (kvbm offloads the full blocks to G2); a filler
request evicts every block of it from G1; the engine then wipes its whole
cache with NaN, so a block kvbm did not bring back cannot pass for one.
The second prompt's prefix must come back from G2 (hit_blocks, onboarded
stats) into the engine's tensor bit for bit (equal to the KV the first
request wrote), and every request's generated tokens must equal the plain
forward's (TinyTransformer.generate: no cache at all), on the same device.

The same logic runs on the CPU (device 'cpu', host memory adopted as
system G1) wherever torch is installed, so CI checks it without a GPU.

Run by pytest (test_pytest.sh, the CPU variant; the CUDA one skips without
a device) and as a script by test_gpu_tiny_engine.sh (ctest label gpu):
exit 77 (skip) without torch or CUDA, unless KVBM_REQUIRE_GPU=1, then 1.
"""
from __future__ import annotations

import math
import os
import sys

try:  # the device's interpreter may lack pytest: the script mode needs none
    import pytest
except ImportError:
    pytest = None

try:
    import torch
except ImportError:
    if __name__ == "__main__":
        why = f"no torch for {sys.executable}"
        print(("GPU required (KVBM_REQUIRE_GPU=1) but " if os.environ.get("KVBM_REQUIRE_GPU") == "1"
               else "skipped: ") + why, file=sys.stderr)
        sys.exit(1 if os.environ.get("KVBM_REQUIRE_GPU") == "1" else 77)
    pytest.skip("torch is not installed", allow_module_level=True)

try:
    import kvbm  # noqa: E402
except ImportError as e:
    if __name__ == "__main__":
        print(f"cannot import kvbm with {sys.executable} ({e}); PYTHONPATH must name a build "
              "configured with -DPython3_EXECUTABLE=<this interpreter>", file=sys.stderr)
        sys.exit(1)
    raise
from kvbm import Tier  # noqa: E402
from tiny_engine import TinyTransformer  # noqa: E402

BS = 16          # tokens per block
ALIGN = 256      # the layout's alignment (torch's CUDA allocations are 512-aligned)
G1_BLOCKS = 8


def on_device(model: TinyTransformer, dev: torch.device) -> TinyTransformer:
    """Moves the model's weights to dev; embeddings are indexed there."""
    model.embed = model.embed.to(dev)
    model.pos = model.pos.to(dev)
    model.head = model.head.to(dev)
    model.layers = [{k: w.to(dev) for k, w in p.items()} for p in model.layers]

    def embed_tokens(tokens, positions):
        t = torch.as_tensor(list(tokens), dtype=torch.long, device=dev)
        p = torch.as_tensor(list(positions), dtype=torch.long, device=dev)
        return model.embed[t] + model.pos[p]

    model.embed_tokens = embed_tokens
    return model


def engine_cache(model: TinyTransformer, num_blocks: int, dev: torch.device):
    """The engine's paged KV cache [blocks, layers, K/V, BS, heads*dim]
    (kvbm's FullyContiguous block order), its base aligned to ALIGN, and the
    tensor that owns the memory."""
    shape = (num_blocks, model.num_layers, 2, BS, model.d)
    n = math.prod(shape)
    esz = torch.tensor([], dtype=model.dtype).element_size()
    owner = torch.empty(n + ALIGN // esz, dtype=model.dtype, device=dev)
    skip = (-owner.data_ptr() % ALIGN) // esz
    kv = owner[skip:skip + n].view(shape)
    assert kv.data_ptr() % ALIGN == 0
    kv.fill_(float("nan"))
    return kv, owner


class PagedEngine:
    """One request at a time over kvbm's manager: prefill (kvbm's match),
    compute the rest into the engine's cache, decode, commit."""

    def __init__(self, model: TinyTransformer, manager: kvbm.Manager, kv: torch.Tensor,
                 dev: torch.device):
        self.model, self.m, self.kv, self.dev = model, manager, kv, dev

    def keys_values(self, table: list[int], layer: int, n: int):
        """Positions 0..n-1 of one layer, gathered from the cache."""
        nb = (n + BS - 1) // BS
        idx = torch.as_tensor(table[:nb], dtype=torch.long, device=self.dev)
        blocks = self.kv[idx, layer]                      # nb, 2, BS, d
        h, dim = self.model.num_heads, self.model.head_dim
        k = blocks[:, 0].reshape(nb * BS, h, dim)[:n]
        v = blocks[:, 1].reshape(nb * BS, h, dim)[:n]
        return k, v

    def forward(self, table: list[int], seq: list[int], start: int) -> torch.Tensor:
        """Computes (and writes) the KV of positions start..len(seq)-1 and
        returns the logits of the last."""
        model, n = self.model, len(seq)
        pos = list(range(start, n))
        h = model.embed_tokens(seq[start:], pos)
        for layer in range(model.num_layers):
            q, k, v = model.qkv(layer, h)
            for i, p in enumerate(pos):
                b, s = table[p // BS], p % BS
                self.kv[b, layer, 0, s] = k[i].reshape(-1)
                self.kv[b, layer, 1, s] = v[i].reshape(-1)
            keys, values = self.keys_values(table, layer, n)
            attn = torch.stack([model.attend(q[i], keys[:p + 1], values[:p + 1])
                                for i, p in enumerate(pos)])
            h = model.finish_layer(layer, h, attn)
        return model.logits(h[-1:])[0]

    def run(self, prompt: list[int], max_tokens: int):
        """(generated tokens, RequestInfo of the prefill, the request's block
        table at the end). The request is committed and destroyed."""
        r = self.m.prefill(prompt)
        try:
            info = r.wait(timeout=30.0)
            assert info.ready
            matched = info.matched_tokens
            assert matched % BS == 0 and matched < len(prompt)
            for k in range(matched // BS):
                assert not r.must_compute(k)
            seq, out, start = list(prompt), [], matched
            while True:
                logits = self.forward(r.block_table, seq, start)
                t = int(torch.argmax(logits))
                out.append(t)
                if len(out) == max_tokens:
                    break
                seq.append(t)
                r.append([t])
                start = len(seq) - 1
            if self.dev.type == "cuda":
                torch.cuda.synchronize(self.dev)  # the KV is written before kvbm copies it
            table = list(r.block_table)
            r.commit()
            return out, info, table
        finally:
            r.destroy()


def run_engine(dev: torch.device) -> None:
    torch.manual_seed(0)
    model = on_device(TinyTransformer(num_layers=2, num_heads=4, head_dim=16, seed=5), dev)
    cuda = dev.type == "cuda"
    if cuda:  # full float32 products (no TF32), as on the CPU
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    kv, owner = engine_cache(model, G1_BLOCKS, dev)
    esz = kv.element_size()
    m = kvbm.Manager(block_size=BS, num_layers=model.num_layers, outer_dim=2, inner_dim=model.d,
                     dtype_bytes=esz, alignment=ALIGN, g1_blocks=G1_BLOCKS, g2_blocks=64,
                     g2_policy="all", g1_memory="device" if cuda else "system",
                     g2_memory="pinned" if cuda else "system",
                     g1_device=(dev.index or 0) if cuda else 0,
                     g1_ptr=kv.data_ptr(), g1_owner=owner)
    try:
        assert m.memory(Tier.G1) == ("device" if cuda else "system")
        lay = m.layout(Tier.G1)
        # The engine's tensor is kvbm's layout, byte for byte.
        assert lay["num_regions"] == 1
        assert lay["block_stride"] == kv.stride(0) * esz
        assert lay["layer_stride"] == kv.stride(1) * esz
        assert lay["outer_stride"] == kv.stride(2) * esz
        assert lay["region_size"] == kv.numel() * esz

        g = torch.Generator().manual_seed(11)
        prefix = torch.randint(0, model.vocab, (3 * BS,), generator=g).tolist()
        a = prefix + torch.randint(0, model.vocab, (10,), generator=g).tolist()
        b = prefix + torch.randint(0, model.vocab, (7,), generator=g).tolist()
        filler = torch.randint(0, model.vocab, ((G1_BLOCKS - 1) * BS + 1,), generator=g).tolist()
        eng = PagedEngine(model, m, kv, dev)

        out_a, info_a, table_a = eng.run(a, 8)
        assert info_a.matched_tokens == 0
        ref_a = model.generate(a, 8)
        assert out_a == ref_a, f"request A on {dev}: tokens {out_a} != the plain forward's {ref_a}"
        m.flush()
        assert m.stats(Tier.G2)["offloaded_blocks"] >= 4  # (58 + 7) tokens: 4 full blocks
        saved = kv[torch.as_tensor(table_a[:3], device=dev)].clone()  # the prefix's KV

        eng.run(filler, 1)  # the whole G1: A's blocks are evicted
        m.flush()
        assert m.stats(Tier.G1)["evictions"] >= 4
        kv.fill_(float("nan"))  # the engine reuses its memory: only G2 holds A's KV
        if cuda:
            torch.cuda.synchronize(dev)

        before = m.stats(Tier.G2)["onboarded_blocks"]
        out_b, info_b, table_b = eng.run(b, 8)
        assert info_b.matched_tokens == 3 * BS, info_b
        assert tuple(info_b.hit_blocks) == (0, 3, 0, 0), info_b
        assert m.stats(Tier.G2)["onboarded_blocks"] - before == 3
        assert m.stats(Tier.G2)["copy_errors"] == 0
        got = kv[torch.as_tensor(table_b[:3], device=dev)]
        if not torch.equal(got, saved):
            bad = (got != saved).nonzero()
            raise AssertionError(f"onboarded KV on {dev} differs from the KV the engine wrote at "
                                 f"{bad.shape[0]} elements, first {bad[:4].tolist()}")
        ref_b = model.generate(b, 8)
        assert out_b == ref_b, f"request B on {dev}: tokens {out_b} != the plain forward's {ref_b}"
    finally:
        m.close()
    # kvbm never frees the engine's memory: it is still usable after close.
    kv.fill_(1.5)
    assert float(kv.sum()) == 1.5 * kv.numel()


def test_tiny_engine_cpu_adopted_g1():
    run_engine(torch.device("cpu"))


def require_gpu() -> bool:
    return os.environ.get("KVBM_REQUIRE_GPU") == "1"


def test_tiny_engine_cuda_adopted_g1():
    if not torch.cuda.is_available():
        if require_gpu():
            pytest.fail("KVBM_REQUIRE_GPU=1 but torch.cuda.is_available() is False "
                        f"(torch {torch.__version__}, {sys.executable})")
        pytest.skip("no CUDA device for torch")
    run_engine(torch.device("cuda", 0))


def test_adoption_refusals():
    """Hostile g1_ptr values are refused with clear errors."""
    kv, owner = engine_cache(TinyTransformer(num_layers=2, num_heads=4, head_dim=16),
                             G1_BLOCKS, torch.device("cpu"))
    base = dict(block_size=BS, num_layers=2, outer_dim=2, inner_dim=64, dtype_bytes=4,
                alignment=ALIGN, g1_blocks=G1_BLOCKS)
    p = kv.data_ptr()
    with pytest.raises(kvbm.InvalidArgumentError, match="out of range"):
        kvbm.Manager(**base, g1_ptr=-p)
    with pytest.raises(TypeError, match="g1_ptr"):
        kvbm.Manager(**base, g1_ptr=float(p))
    with pytest.raises(kvbm.InvalidArgumentError, match="2 base pointers for a layout of 1"):
        kvbm.Manager(**base, g1_ptr=[p, p])
    with pytest.raises(kvbm.InvalidArgumentError, match="not aligned"):
        kvbm.Manager(**base, g1_ptr=p + 4)
    with pytest.raises(kvbm.InvalidArgumentError, match="is NULL"):
        kvbm.Manager(**base, g1_ptr=0)
    with pytest.raises(kvbm.InvalidArgumentError, match="region"):
        kvbm.Manager(**dict(base, layout="layer_separate"), g1_ptr=[p])
    with pytest.raises(TypeError, match="g1_owner"):
        kvbm.Manager(**base, g1_owner=owner)
    with pytest.raises(kvbm.InvalidArgumentError, match="not inside g1_owner"):
        kvbm.Manager(**base, g1_ptr=p, g1_owner=bytearray(64))
    if not kvbm.Manager.__doc__ or "g1_ptr" not in kvbm.Manager.__doc__:
        pytest.fail("Manager's docstring does not describe g1_ptr")


if __name__ == "__main__":
    # The device run (test_gpu_tiny_engine.sh): skip (77) where it cannot
    # run, unless a GPU was promised.
    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} at {sys.executable} sees no CUDA device"
        if require_gpu():
            print(f"GPU required (KVBM_REQUIRE_GPU=1) but {why}", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: {why}", file=sys.stderr)
        sys.exit(77)
    if pytest is not None:
        test_adoption_refusals()
    run_engine(torch.device("cpu"))
    run_engine(torch.device("cuda", 0))
    print("tiny engine on CUDA with adopted device G1: tokens equal the plain forward; "
          "prefix onboarded from pinned G2 bit for bit")
