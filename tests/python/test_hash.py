# SPDX-License-Identifier: Apache-2.0
"""Hashing, BLAKE3 and MRDN frames through the binding, checked against
independent implementations (python3-xxhash, the BLAKE3 test vectors,
Debian's b3sum) and against the frame format's own rules."""
import array
import json
import shutil
import struct
import subprocess
import threading

import numpy as np
import pytest
import xxhash

import kvbm
from conftest import SHARED

SEED = 1337


def ref_native(tokens, bs, salt=0):
    out, parent = [], salt
    for k in range(len(tokens) // bs):
        blk = np.asarray(tokens[k * bs:(k + 1) * bs], dtype="<u4").tobytes()
        parent = xxhash.xxh3_64_intdigest(blk, seed=parent)
        out.append(parent)
    return out


def ref_dynamo(tokens, bs, salt=0):
    out = []
    for k in range(len(tokens) // bs):
        blk = xxhash.xxh3_64_intdigest(np.asarray(tokens[k * bs:(k + 1) * bs], dtype="<u4").tobytes(),
                                       seed=salt)
        if not out:
            out.append(blk)
        else:
            out.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", out[-1], blk), seed=SEED))
    return out


def test_chains_match_an_independent_xxh3():
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 2**32, 1000, dtype=np.uint32)
    salt = kvbm.salt_hash("my-lora")
    assert salt == xxhash.xxh3_64_intdigest(b"my-lora", seed=SEED)
    assert kvbm.salt_hash(b"my-lora") == salt and kvbm.salt_hash("") == 0
    for bs in (1, 16, 64, 999, 1000):
        assert kvbm.block_hashes(toks, bs) == ref_native(toks, bs)
        assert kvbm.block_hashes(toks, bs, salt_hash=salt) == ref_native(toks, bs, salt)
        assert kvbm.block_hashes(toks, bs, scheme="dynamo") == ref_dynamo(toks, bs)
        assert kvbm.block_hashes(toks, bs, scheme="dynamo", salt_hash=salt) == ref_dynamo(toks, bs, salt)
    assert kvbm.block_hashes(toks, 1001) == []
    assert kvbm.block_hash(toks[:16], salt) == xxhash.xxh3_64_intdigest(toks[:16].tobytes(), seed=salt)


def test_every_token_form_gives_the_same_hashes():
    base = list(range(100, 164))
    want = kvbm.block_hashes(base, 16)
    forms = [tuple(base), np.array(base, dtype=np.uint32), array.array("I", base),
             memoryview(array.array("I", base)), memoryview(np.array(base, dtype=np.uint32).tobytes()).cast("I"),
             (t for t in base), np.arange(100, 228, dtype=np.uint32)[::2][:0].tolist() or base,
             [np.uint32(t) for t in base], [np.int64(t) for t in base]]
    for f in forms:
        assert kvbm.block_hashes(f, 16) == want
    strided = np.zeros(128, dtype=np.uint32)
    strided[::2] = base
    assert kvbm.block_hashes(strided[::2], 16) == want
    assert kvbm.block_hashes(np.array(base, dtype=np.uint32)[::-1][::-1], 16) == want
    # a hash given signed is the same hash
    h = want[0]
    assert kvbm.block_hashes(base, 16, salt_hash=h) == kvbm.block_hashes(base, 16, salt_hash=h - 2**64)


@pytest.mark.parametrize("bad", [b"\x00\x01\x02\x03", bytearray(8), np.zeros(4, dtype=np.int64),
                                 np.zeros(4, dtype=np.float32), np.zeros(4, dtype=np.int32),
                                 np.zeros((2, 2), dtype=np.uint32), array.array("H", [1, 2]),
                                 "abcd", 5, None, [1.0, 2.0], [[1], [2]], [object()],
                                 np.zeros(4, dtype=">u4")])
def test_tokens_of_the_wrong_type_are_type_errors(bad):
    with pytest.raises(TypeError):
        kvbm.block_hashes(bad, 2)


@pytest.mark.parametrize("bad", [[-1], [2**32], [2**64], [-(2**70)], [1, 2, 3, 2**100]])
def test_tokens_out_of_range_are_invalid_arguments(bad):
    with pytest.raises(kvbm.InvalidArgumentError) as e:
        kvbm.block_hashes(bad, 1)
    assert e.value.status == "KVBM_EINVAL" and e.value.code == -1
    assert "token id" in e.value.message


def test_bad_hash_arguments():
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 0)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], -3)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 2**32)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 1, scheme="sha256")
    with pytest.raises(TypeError):
        kvbm.block_hashes([1], 1, scheme=1)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 1, salt_hash=2**64)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 1, salt_hash=-(2**63) - 1)
    with pytest.raises(TypeError):
        kvbm.salt_hash(5)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.block_hashes([1], 1, scheme="native\0x")


def test_big_inputs_release_the_gil_and_stay_right():
    toks = np.arange(1 << 20, dtype=np.uint32)
    assert kvbm.block_hashes(toks, 4096)[-1] == ref_native(toks, 4096)[-1]


# ------------------------------------------------------------------ BLAKE3

def vectors():
    return json.loads((SHARED / "data" / "blake3_test_vectors.json").read_text())


def test_blake3_test_vectors():
    v = vectors()
    key = v["key"].encode()
    ctx = v["context_string"]
    for case in v["cases"]:
        data = bytes(i % 251 for i in range(case["input_len"]))
        n = len(case["hash"]) // 2
        assert kvbm.blake3(data, length=n).hex() == case["hash"]
        assert kvbm.blake3(data)[:32].hex() == case["hash"][:64]
        assert kvbm.blake3(data, key=key, length=n).hex() == case["keyed_hash"]
        h = kvbm.Blake3(derive_key_context=ctx)
        h.update(data)
        assert h.hexdigest(length=n) == case["derive_key"]
        # split updates, copies and resets
        h = kvbm.Blake3(key=key)
        for i in range(0, len(data), 1000):
            h.update(data[i:i + 1000])
        c = h.copy()
        assert c.digest(n).hex() == case["keyed_hash"]
        c.update(b"more")
        assert h.digest(n).hex() == case["keyed_hash"]
        h.reset()
        assert h.digest() == kvbm.blake3(b"", key=key)


@pytest.mark.skipif(shutil.which("b3sum") is None, reason="Debian's b3sum is not installed")
def test_blake3_matches_b3sum():
    data = np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    out = subprocess.run(["b3sum", "--no-names", "-"], input=data, capture_output=True, check=True)
    assert kvbm.blake3(data).hex() == out.stdout.decode().strip()
    assert kvbm.blake3(memoryview(data)[1:]).hex() != out.stdout.decode().strip()


def test_blake3_hostile():
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.blake3(b"x", key=b"short")
    with pytest.raises(TypeError):
        kvbm.blake3(b"x", key=5)
    with pytest.raises(TypeError):
        kvbm.blake3("text")
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.blake3(b"x", length=-1)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.blake3(b"x", length=2**40)
    assert kvbm.blake3(b"x", length=0) == b""
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.Blake3(key=b"k" * 32, derive_key_context="ctx")
    with pytest.raises(TypeError):
        kvbm.Blake3().update("text")
    assert kvbm.Blake3(b"abc").hexdigest() == kvbm.blake3(b"abc").hex()
    assert kvbm.Blake3().name == "blake3" and kvbm.Blake3().digest_size == 32


# ------------------------------------------------------------------ frames

def test_frames_round_trip_every_phase():
    for phase in kvbm.Phase:
        for body in (b"", b"x", bytes(range(256)) * 300):
            f = kvbm.frame_encode(body, phase)
            assert len(f) == 32 + len(body) and f[:4] == b"MRDN"
            assert struct.unpack_from("<IIB", f, 4) == (1, len(body), int(phase))
            assert f[16:32] == kvbm.blake3(body)[:16]
            p, b = kvbm.frame_decode(f)
            assert p is phase and b == body
    assert kvbm.frame_decode(bytearray(kvbm.frame_encode(b"ab", 1)))[1] == b"ab"


def corrupt(f, off, value):
    b = bytearray(f)
    b[off] = value
    return bytes(b)


def test_frame_errors_have_their_own_class():
    f = kvbm.frame_encode(b"hello world", kvbm.Phase.THINK_ACTIVE)
    cases = [
        (f[:10], kvbm.TruncatedError, "KVBM_ETRUNCATED"),
        (corrupt(f, 0, ord("X")), kvbm.MagicError, "KVBM_EMAGIC"),
        (corrupt(f, 4, 4), kvbm.VersionError, "KVBM_EVERSION"),  # 2, 3: keyed, sealed (EAUTH)
        (corrupt(f, 13, 1), kvbm.PaddingError, "KVBM_EPADDING"),
        (corrupt(f, 12, 3), kvbm.PhaseError, "KVBM_EPHASE"),
        (corrupt(f, 12, 255), kvbm.PhaseError, "KVBM_EPHASE"),
        (f + b"!", kvbm.TooLongError, "KVBM_ETOOLONG"),
        (f[:-1], kvbm.TruncatedError, "KVBM_ETRUNCATED"),
        (corrupt(f, 40, ord("H")), kvbm.ChecksumError, "KVBM_ECHECKSUM"),
        (corrupt(f, 20, f[20] ^ 1), kvbm.ChecksumError, "KVBM_ECHECKSUM"),
    ]
    for buf, cls, status in cases:
        with pytest.raises(cls) as e:
            kvbm.frame_decode(buf)
        assert e.value.status == status and e.value.message
        assert isinstance(e.value, kvbm.Error)
    for cls in (kvbm.TruncatedError, kvbm.MagicError, kvbm.VersionError, kvbm.PaddingError,
                kvbm.TooLongError):
        assert issubclass(cls, kvbm.FormatError)
    with pytest.raises(kvbm.TooLongError):
        kvbm.frame_decode(f, max_body=4)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.frame_decode(f, max_body=-1)
    with pytest.raises(kvbm.PhaseError):
        kvbm.frame_encode(b"x", 3)
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.frame_encode(b"x", -1)
    with pytest.raises(TypeError):
        kvbm.frame_encode("text", 0)
    with pytest.raises(TypeError):
        kvbm.frame_decode(None)


def test_blake3_from_two_threads():
    h = kvbm.Blake3()
    big = bytes(8 << 20)
    errors = []

    def feed():
        for _ in range(5):
            try:
                h.update(big)
            except kvbm.BusyError:
                pass
            except Exception as e:  # pragma: no cover
                errors.append(e)

    ts = [threading.Thread(target=feed) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and len(h.digest()) == 32
