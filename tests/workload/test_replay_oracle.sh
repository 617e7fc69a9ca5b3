#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# W1 counts of `kvbm replay` equal the oracle ../shared/tools/ref_replay.py
# exactly, on the first 500 requests, at two capacities and two block sizes,
# for both hash schemes; and the bundled trace is the shared one.
set -euo pipefail
TRACE="$KVBM_SHARED_DIR/data/mooncake_conversation_trace.jsonl"
ORACLE="$KVBM_SHARED_DIR/tools/ref_replay.py"
BUNDLED="$KVBM_SOURCE_DIR/data/mooncake_conversation_trace.jsonl.gz"

zcat "$BUNDLED" | cmp - "$TRACE"

compare() { # block_size capacity hash
  local want got
  want=$(/usr/bin/python3 "$ORACLE" "$TRACE" --limit 500 --block-size "$1" --capacity "$2")
  got=$("$KVBM_BIN" replay "$TRACE" --limit 500 --block-size "$1" --capacity "$2" --hash "$3" --json)
  /usr/bin/python3 - "$want" "$got" <<'PY'
import json, sys
want, got = json.loads(sys.argv[1]), json.loads(sys.argv[2])
keys = ["requests", "prompt_tokens", "hit_tokens", "blocks_allocated"]
diff = {k: (want[k], got[k]) for k in keys if want[k] != got[k]}
if diff:
    sys.exit("mismatch (oracle, kvbm): %r" % diff)
assert want["requests"] == 500 and want["hit_tokens"] > 0, want
for k in ["seconds", "prompt_tokens_per_s"]:
    assert k in got, k
print("ok", {k: got[k] for k in keys})
PY
}

compare 16 16384 native
compare 16 8000 native
compare 32 9000 dynamo
compare 16 12000 dynamo
