# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the Python package's tests: where things are, the
trace, and workload W1's tokens (../shared/WORKLOADS.md)."""
import gzip
import json
import os
import pathlib

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = pathlib.Path(os.environ.get("KVBM_SOURCE_DIR", HERE.parent.parent))
SHARED = pathlib.Path(os.environ.get("KVBM_SHARED_DIR", SOURCE.parent / "shared"))
BINARY = pathlib.Path(os.environ.get("KVBM_BINARY_DIR", SOURCE / "build"))
TRACE = SOURCE / "data" / "mooncake_conversation_trace.jsonl.gz"


def load_trace(limit):
    out = []
    with gzip.open(TRACE, "rt") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if len(out) == limit:
                    break
    return out


def prompt_tokens(rec):
    """Prompt token i = hash_ids[i // 512] * 512 + i % 512."""
    n = rec["input_length"]
    ids = np.asarray(rec["hash_ids"], dtype=np.uint32) * np.uint32(512)
    return (np.repeat(ids, 512)[:n] + np.arange(n, dtype=np.uint32) % np.uint32(512)).astype(np.uint32)


def output_tokens(r, rec):
    """Output token m of the request on line r = 0x80000000 | r << 16 | m."""
    m = np.arange(rec["output_length"], dtype=np.uint32)
    return (np.uint32(0x80000000 | (r << 16)) | m).astype(np.uint32)


@pytest.fixture
def kvbm_bin():
    path = os.environ.get("KVBM_BIN", str(BINARY / "kvbm"))
    if not os.path.exists(path):
        pytest.skip("no kvbm binary (run from ctest)")
    return path
