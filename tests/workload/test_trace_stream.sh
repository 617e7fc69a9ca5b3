#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The trace reader streams, under a memory limit (ulimit -v) that reading
# a whole file would break:
#  - a gzip bomb (a 256 KB file that inflates to 256 MiB of blank lines
#    after one request) with --limit 1, and without a limit (streamed, the
#    blank lines cost nothing); before, the whole file was inflated into
#    memory first;
#  - a line longer than 16 MiB is refused without holding more of it;
#  - a request with input_length 2^31-1 is refused as not fitting the pool
#    before 8 GiB are allocated for its prompt (W1, W2 and W3);
#  - a gzip file cut at a flush point (everything before the cut inflates
#    cleanly) is an error, not a shorter trace; --limit within the intact
#    part still reads.
# Under a sanitizer the limits are skipped (ASan reserves terabytes of
# address space); the verdicts are still checked.
set -euo pipefail
: "${KVBM_BIN:?}"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$T"/err 2>/dev/null >&2; exit 1; }
LIMITED=1
# (the build says so in KVBM_SANITIZE; ldd's output is read whole: `grep -q`
# under pipefail fails when it closes the pipe before ldd is done)
if [ -n "${KVBM_SANITIZE:-}" ] || ldd "$KVBM_BIN" 2>/dev/null | grep 'lib[at]san' >/dev/null; then
  LIMITED=0
fi

# limited KB CMD...: CMD under an address-space limit of KB
limited() {
  local kb=$1; shift
  if [ "$LIMITED" = 1 ]; then (ulimit -v "$kb"; "$@"); else "$@"; fi
}

"$PY" - "$T" <<'PY'
import gzip, sys, zlib
d = sys.argv[1]
good = b'{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1]}\n'
# the bomb: one request, then 256 MiB of newlines, compressed ~1000:1
c = zlib.compressobj(9, zlib.DEFLATED, 31)
with open(d + "/bomb.gz", "wb") as f:
    f.write(c.compress(good))
    chunk = b"\n" * (1 << 20)
    for _ in range(256):
        f.write(c.compress(chunk))
    f.write(c.flush())
# one line of 64 MiB of spaces (no newline at all)
c = zlib.compressobj(9, zlib.DEFLATED, 31)
with open(d + "/longline.gz", "wb") as f:
    f.write(c.compress(good))
    chunk = b" " * (1 << 20)
    for _ in range(64):
        f.write(c.compress(chunk))
    f.write(c.flush())
# a prompt of 2^31-1 tokens: 4194304 hash ids (the most the length allows)
with open(d + "/huge.jsonl", "wb") as f:
    f.write(good)
    f.write(b'{"timestamp": 1, "input_length": 2147483647, "output_length": 1, "hash_ids": [')
    f.write(b"1," * (4194304 - 1) + b"1]}\n")
# 200 requests; the file cut right after a sync flush at request 100
lines = [b'{"timestamp": %d, "input_length": 20, "output_length": 3, "hash_ids": [%d]}\n' % (i, i)
         for i in range(200)]
with open(d + "/whole.gz", "wb") as f:
    f.write(gzip.compress(b"".join(lines)))
c = zlib.compressobj(9, zlib.DEFLATED, 31)
with open(d + "/cut.gz", "wb") as f:
    f.write(c.compress(b"".join(lines[:100])) + c.flush(zlib.Z_SYNC_FLUSH))
PY
[ "$(stat -c %s "$T/bomb.gz")" -lt 3000000 ] || fail "the bomb is not small"

jget() { "$PY" -c "import json,sys; print(json.load(sys.stdin)[sys.argv[1]])" "$1"; }
run() { "$KVBM_BIN" replay "$@" --json --no-progress 2>"$T/err"; }

# 1. the bomb: --limit 1 stops reading; no limit streams through
out=$(limited 200000 run "$T/bomb.gz" --limit 1) || fail "bomb --limit 1"
[ "$(jget requests <<<"$out")" = 1 ] || fail "bomb --limit 1: requests"
out=$(limited 200000 run "$T/bomb.gz") || fail "bomb, whole"
[ "$(jget requests <<<"$out")" = 1 ] || fail "bomb, whole: requests"

# 2. a line that never ends
rc=0; limited 200000 run "$T/longline.gz" >/dev/null || rc=$?
[ "$rc" = 2 ] && grep -q "line 2: longer than 16777216 bytes" "$T/err" || fail "long line: exit $rc"

# 3. a prompt that cannot fit: refused before allocating for it
rc=0; limited 400000 run "$T/huge.jsonl" >/dev/null || rc=$?
[ "$rc" = 1 ] && grep -q "request 1 (2147483647 prompt + 1 output tokens, 134217728 blocks) does not fit in the pool of 16384 blocks" "$T/err" ||
  fail "huge prompt, W1: exit $rc"
rc=0; limited 400000 run "$T/huge.jsonl" --g2-blocks 16 --g3-blocks 0 >/dev/null || rc=$?
[ "$rc" = 1 ] && grep -q "does not fit in the pool of 16384 blocks" "$T/err" || fail "huge prompt, W2: exit $rc"
rc=0; limited 400000 "$KVBM_BIN" route-sim "$T/huge.jsonl" --json >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "does not fit in the pool of 16384 blocks" "$T/err" || fail "huge prompt, W3: exit $rc"
out=$(limited 400000 run "$T/huge.jsonl" --limit 1) || fail "huge prompt after --limit"
[ "$(jget requests <<<"$out")" = 1 ] || fail "huge prompt after --limit: requests"

# 4. a gzip file cut at a flush point
out=$(run "$T/whole.gz") || fail "whole file"
[ "$(jget requests <<<"$out")" = 200 ] || fail "whole file: requests"
rc=0; run "$T/cut.gz" >/dev/null || rc=$?
[ "$rc" = 2 ] && grep -q "truncated" "$T/err" || fail "cut file accepted: exit $rc"
out=$(run "$T/cut.gz" --limit 50) || fail "cut file, --limit 50"
[ "$(jget requests <<<"$out")" = 50 ] || fail "cut file, --limit 50: requests"
echo "trace streaming: ok"
