# SPDX-License-Identifier: Apache-2.0
"""The package's surface: what it exports, the type stubs, the docstrings
help() shows, and the error hierarchy."""
import ast
import inspect
import pathlib
import pydoc

import pytest

import kvbm
import kvbm.minivllm

STUBS = pathlib.Path(kvbm.__file__).with_name("__init__.pyi")


def stub_names():
    tree = ast.parse(STUBS.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
            names[node.name] = members
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = set()
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                names[t.id] = set()
    return names


def public():
    return [n for n in kvbm.__all__ if not n.startswith("_")]


def test_stubs_cover_every_public_name_and_member():
    stubs = stub_names()
    for name in public():
        assert name in stubs, f"kvbm.{name} is missing from __init__.pyi"
        obj = getattr(kvbm, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException) and name not in ("Tier", "Phase"):
            members = {m for m in dir(obj) if not m.startswith("_")}
            if issubclass(obj, tuple):  # struct sequences: the named fields
                members -= {"count", "index", "n_fields", "n_sequence_fields", "n_unnamed_fields"}
            missing = members - stubs[name]
            assert not missing, f"kvbm.{name}: {sorted(missing)} not in the stubs"
    assert (pathlib.Path(kvbm.__file__).with_name("py.typed")).exists()


def test_everything_public_is_documented():
    for name in public():
        obj = getattr(kvbm, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 20, f"kvbm.{name} has no docstring"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for m, v in vars(obj).items():
                if m.startswith("_") or type(v).__name__ == "member_descriptor":
                    continue  # struct sequence fields carry their doc in the type
                assert getattr(v, "__doc__", None), f"kvbm.{name}.{m} has no docstring"
    text = pydoc.render_doc(kvbm.Manager, renderer=pydoc.plaintext)
    assert "prefill(tokens, *, salt_hash=0, priority=0) -> Request" in text
    assert "BusyError" in pydoc.render_doc(kvbm.Manager.close, renderer=pydoc.plaintext)
    assert "nano-vllm" in pydoc.render_doc(kvbm.minivllm, renderer=pydoc.plaintext)


def test_error_hierarchy():
    assert issubclass(kvbm.Error, Exception)
    for name in public():
        obj = getattr(kvbm, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, kvbm.Error), name
    assert issubclass(kvbm.InvalidArgumentError, ValueError)
    assert issubclass(kvbm.RangeError, IndexError)
    assert issubclass(kvbm.TimedOutError, TimeoutError)
    assert issubclass(kvbm.BusyError, kvbm.StateError)
    with pytest.raises(kvbm.NoSpaceError) as e:
        kvbm.Pool(1, 16).sequence().prefill(range(40))
    err = e.value
    assert (err.status, err.code) == ("KVBM_ENOSPC", -5)
    assert err.message in str(err) and "KVBM_ENOSPC" in str(err)
    assert kvbm.status_name(-5) == "KVBM_ENOSPC"


def test_tier_enum():
    assert [int(t) for t in kvbm.Tier] == [0, 1, 2, 3]
    assert kvbm.Tier.G2 == 1 and kvbm.TIER_COUNT == 4


def test_phase_enum():
    assert [(p.name, int(p)) for p in kvbm.Phase] == [
        ("THINK_COMPLETE", 0), ("THINK_ACTIVE", 1), ("OUTPUT_CRITICAL", 2)]
    assert issubclass(kvbm.PhaseError, ValueError) and kvbm.PhaseError is not kvbm.TierError


def test_kvbm_objects_refuse_pickle_and_copy():
    import copy
    import pickle
    pool = kvbm.Pool(4, 16)
    for obj in (pool, pool.sequence(), kvbm.Manager(g1_blocks=4), kvbm.Index(), kvbm.Blake3()):
        for f in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError):
                f(obj)
    with pytest.raises(TypeError):
        class Sub(kvbm.Manager):  # noqa: F841 - the types are final
            pass
