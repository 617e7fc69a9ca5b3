#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Forged G4 values across processes (issue 23), the way the issue found
# them: a `kvbm replay` fills a Redis G4 (a redis-server this test starts
# on loopback), an attacker who can write the Redis but holds no key
# rewrites every value with another block's bytes and frames it again with
# a valid plain BLAKE3 (the kvbm Python module's Volume and frame_encode),
# and a second `kvbm replay` reads the store.
#  - without a cluster key the second run onboards the forgeries from G4
#    (no checksum failure) and its own verification finds wrong bytes in
#    G1: the finding;
#  - with --g4-key-file (the same key file for both runs) it onboards
#    nothing from G4, counts the refusals (auth_failures), and verifies
#    every block;
#  - a key file shorter than 16 bytes is refused with a message (exit 2).
set -uo pipefail
tmp=$(mktemp -d "${KVBM_BINARY_DIR:-/tmp}/w2g4forged-XXXXXX")
redis_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The forger is the kvbm Python module: pyenv.sh preloads the sanitizer
# runtime in an ASan build, and skips (77) a TSan one.
. "$KVBM_SOURCE_DIR/tests/python/pyenv.sh"
if ! kvbm_python -c 'import kvbm' 2>/dev/null; then
  echo "FAIL: the kvbm Python module is not importable from $PYTHONPATH"
  exit 1
fi

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --dir "$tmp" >/dev/null 2>&1 &
redis_pid=$!
for _ in $(seq 1 200); do
  redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
redis-cli -p "$port" PING | grep -q PONG || { echo "FAIL: redis-server did not start"; exit 1; }
url="redis://127.0.0.1:$port"

cat > "$tmp/forge.py" <<'EOF'
import subprocess, sys
import kvbm
port = sys.argv[1]
names = subprocess.run(["redis-cli", "-p", port, "--raw", "KEYS", "*"],
                       capture_output=True, text=True, check=True).stdout.split()
by_ns = {}
for n in names:
    ns, h = n.rsplit("/", 1)
    by_ns.setdefault(ns, []).append(int(h, 16))
forged = 0
for ns, keys in by_ns.items():
    v = kvbm.Volume(f"redis://127.0.0.1:{port}", namespace=ns)
    for at in range(0, len(keys), 4096):
        ks = keys[at:at + 4096]
        vals = v.get(ks)
        out = []
        for i, val in enumerate(vals):
            other = vals[(i + 1) % len(vals)]
            body = bytearray(val[32:])  # the frame's body: body header, block
            body[64:] = other[32 + 64:]  # another block's bytes
            out.append(kvbm.frame_encode(bytes(body), 1))
        forged += sum(1 for r in v.put(ks, out) if r == 0)
print(forged)
EOF

args=(--json --no-progress --capacity 8192 --block-bytes 64 --g2-blocks 0 --limit 40 --g4 "$url")
head -c 32 /dev/urandom > "$tmp/key" && chmod 600 "$tmp/key"
field() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

for mode in plain keyed; do
  redis-cli -p "$port" FLUSHALL >/dev/null
  key=()
  [ "$mode" = keyed ] && key=(--g4-key-file "$tmp/key")
  "$KVBM_BIN" replay "${args[@]}" "${key[@]}" > "$tmp/$mode.1.json" || fail "$mode: first run"
  n=$(kvbm_python "$tmp/forge.py" "$port") || fail "$mode: forging"
  [ "${n:-0}" -gt 100 ] || fail "$mode: only ${n:-0} values forged"
  "$KVBM_BIN" replay "${args[@]}" "${key[@]}" > "$tmp/$mode.2.json" || fail "$mode: second run"
  onb=$(field "$tmp/$mode.2.json" 'd["tiers"]["g4"]["onboarded_blocks"]')
  auth=$(field "$tmp/$mode.2.json" 'd["tiers"]["g4"]["auth_failures"]')
  sums=$(field "$tmp/$mode.2.json" 'd["tiers"]["g4"]["checksum_failures"]')
  verify=$(field "$tmp/$mode.2.json" 'd["verify_failures"]')
  echo "$mode: $n forged; second run: G4 onboarded $onb, auth_failures $auth, checksum_failures $sums, verify_failures $verify"
  if [ "$mode" = plain ]; then
    # the finding: forgeries pass the plain checksum and reach G1
    [ "$onb" -gt 0 ] || fail "plain: nothing onboarded from G4 (the forgery did not take)"
    [ "$sums" -eq 0 ] || fail "plain: forgeries failed the plain checksum"
    [ "$verify" -gt 0 ] || fail "plain: no wrong bytes found in G1"
  else
    [ "$onb" -eq 0 ] || fail "keyed: $onb forged blocks onboarded"
    [ "$auth" -gt 0 ] || fail "keyed: no refusal counted"
    [ "$verify" -eq 0 ] || fail "keyed: $verify verify failures"
  fi
done

# a short key is refused, with a message
head -c 8 /dev/urandom > "$tmp/short" && chmod 600 "$tmp/short"
"$KVBM_BIN" replay "${args[@]}" --g4-key-file "$tmp/short" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "short key: exit $rc, want 2"
grep -q "must be 16..4096" "$tmp/err" || fail "short key: no message ($(cat "$tmp/err"))"

[ $fails -eq 0 ] && echo "PASS" || exit 1
