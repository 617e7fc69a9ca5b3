# SPDX-License-Identifier: Apache-2.0
# test_b3sum.sh: `kvbm b3sum` prints what Debian's b3sum prints.
#
# Random files of odd sizes (around chunk and batch edges, and several
# MiB), standard input, --length, --no-names, --raw, --derive-key, --keyed,
# awkward file names, and a missing file / a directory among good files.
set -euo pipefail
: "${KVBM_BIN:?}"
command -v b3sum >/dev/null || { echo "b3sum (Debian package b3sum) is not installed" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

fail() { echo "FAIL: $*" >&2; exit 1; }
same() { # same DESCRIPTION -- ARGS...: both tools, same stdout and exit code
  local what=$1; shift 2
  local ours theirs rc_ours=0 rc_theirs=0
  ours=$("$KVBM_BIN" b3sum "$@" 2>/dev/null) || rc_ours=$?
  theirs=$(b3sum "$@" 2>/dev/null) || rc_theirs=$?
  [ "$ours" == "$theirs" ] || fail "$what: output differs
ours:   $ours
b3sum:  $theirs"
  [ "$rc_ours" == "$rc_theirs" ] || fail "$what: exit $rc_ours, b3sum exits $rc_theirs"
}

same_stdin() { # same_stdin FILE ARGS...: each tool reads FILE on its stdin
  local f=$1; shift
  local ours theirs
  ours=$("$KVBM_BIN" b3sum "$@" < "$f") || fail "stdin $f: kvbm failed"
  theirs=$(b3sum "$@" < "$f")
  [ "$ours" == "$theirs" ] || fail "stdin $f: ours $ours, b3sum $theirs"
}

sizes="0 1 63 64 65 1023 1024 1025 2047 2048 2049 4095 16383 16384 16385
       65537 131071 262144 262145 263169 1048576 1048577 3145728 5242881"
files=()
for n in $sizes; do
  head -c "$n" /dev/urandom > "f_$n"
  files+=("f_$n")
done

same "all sizes" -- "${files[@]}"
for f in "${files[@]}"; do same_stdin "$f"; done
same_stdin f_65537 -
same_stdin f_1025 --length 40 -
# Standard input mid-file: hashing starts at the current offset.
[ "$( (head -c 100 >/dev/null; "$KVBM_BIN" b3sum) < f_65537)" == \
  "$(tail -c +101 f_65537 | b3sum)" ] || fail "stdin mid-file"
# A pipe (not a regular file) on stdin.
[ "$(cat f_263169 | "$KVBM_BIN" b3sum)" == "$(cat f_263169 | b3sum)" ] ||
  fail "stdin pipe"
same "--no-mmap" -- --no-mmap f_1048577 f_1025
same "--length 0" -- --length 0 f_1025
same "--length 5" -- --length 5 f_1025 f_0
same "--length 1000 (extended output)" -- --length 1000 f_65537
same "-l 77" -- -l 77 f_2049
same "--length=3" -- --length=3 f_1
same "--no-names" -- --no-names f_1 f_16385
same "--derive-key" -- --derive-key "kvbm 2026 test context" f_263169
same "--num-threads 1" -- --num-threads 1 f_3145728

# --raw writes bytes: compare as hex.
[ "$("$KVBM_BIN" b3sum --raw --length 100 f_4095 | od -An -tx1)" == \
  "$(b3sum --raw --length 100 f_4095 | od -An -tx1)" ] || fail "--raw"

# --keyed: the key comes from stdin.
head -c 32 /dev/urandom > key
[ "$("$KVBM_BIN" b3sum --keyed f_1048577 f_0 < key)" == \
  "$(b3sum --keyed f_1048577 f_0 < key)" ] || fail "--keyed"
head -c 31 /dev/urandom > shortkey
if "$KVBM_BIN" b3sum --keyed f_1 < shortkey 2>err; then fail "short key accepted"; fi
grep -q "exactly 32 bytes" err || fail "short key message: $(cat err)"

# Names b3sum escapes (backslash, newline) or repairs (invalid UTF-8).
printf a > 'back\slash'
printf b > "$(printf 'new\nline')"
printf c > "$(printf 'bad\xffutf8')"
printf d > "$(printf 'cr\rhere')"
printf e > 'plain name'
same "awkward names" -- 'back\slash' "$(printf 'new\nline')" \
  "$(printf 'bad\xffutf8')" "$(printf 'cr\rhere')" 'plain name'

# Errors: a missing file and a directory are reported, the rest printed,
# exit status 1 like b3sum; the message names the file and the OS error.
same "missing file and directory" -- f_1 no_such_file f_2049 .
"$KVBM_BIN" b3sum f_1 no_such_file 2>err >/dev/null && fail "missing file: exit 0"
grep -q "no_such_file: No such file or directory (os error 2)" err ||
  fail "missing file message: $(cat err)"
"$KVBM_BIN" b3sum . 2>err >/dev/null && fail "directory: exit 0"
grep -q "Is a directory (os error 21)" err || fail "directory message: $(cat err)"

# --check reads b3sum's own lines back: same verdicts, same exit status.
b3sum f_1 f_65537 'back\slash' "$(printf 'new\nline')" f_1048577 > sums
b3sum f_2049 > sums_ok
same "check, all good" -- --check sums
same "check, quiet" -- --check --quiet sums_ok
cp f_2049 keep && printf x >> f_65537 && rm f_1
same "check, changed and missing files" -- -c sums
same "check, quiet with failures" -- -c --quiet sums
same_stdin sums_ok -c -
same "check, missing checkfile" -- -c no_such_sums
# Lines b3sum refuses, each reported and counted while the other lines are
# still checked: uppercase hex, a NUL in the name (it would cut the name
# short, and the file before the NUL would be checked in its place), an
# empty line, a bad escape, a non-ASCII prefix, U+FFFD in a name, one
# space, no name. A line that is not UTF-8, or an unreadable checkfile,
# stops the check there (no later checkfile is read).
good=$(b3sum f_2049)
hex=${good:0:64}
up=$(tr a-f A-F <<<"$hex")
printf '%s  f_2049\n' "$up" > upper_sums
same "check: uppercase hex" -- -c upper_sums
printf '%s  f_2049\0tail\n' "$hex" > nul_sums
same "check: NUL in a name" -- -c nul_sums
{ echo "$good"; printf '%s  f_2049\n' "$up"; printf '\n'; printf '\\%s  f_2049\\x\n' "$hex"
  printf '%s\xc3\xa9 f_2049\n' "${hex:0:63}"; printf '%s  \xef\xbf\xbd\n' "$hex"
  printf '%s f_2049\n' "$hex"; printf '%s  \n' "$hex"; printf '%s  f_2049\0x\n' "$hex"; echo "$good"; } > mixed_sums
same "check: malformed lines among good ones" -- -c mixed_sums
same "check: malformed lines, quiet" -- -c --quiet mixed_sums
{ echo "$good"; printf '%s  f_2049\xff\n' "$hex"; echo "$good"; } > notutf8_sums
same "check: a line that is not UTF-8" -- -c notutf8_sums
same "check: an unreadable checkfile stops the check" -- -c sums_ok no_such_sums sums_ok
printf 'zz  f_2049\n' > badsums
rc=0; "$KVBM_BIN" b3sum -c badsums 2>err >/dev/null || rc=$?
[ "$rc" == 1 ] && grep -q "line 1" err || fail "malformed check line: rc $rc $(cat err)"

# Usage errors exit 2 with a message.
rc=0; "$KVBM_BIN" b3sum --bogus 2>err || rc=$?
[ "$rc" == 2 ] && grep -q "unknown option" err || fail "--bogus: rc $rc"
rc=0; "$KVBM_BIN" b3sum --length abc f_1 2>err || rc=$?
[ "$rc" == 2 ] && grep -q "length" err || fail "--length abc: rc $rc"
rc=0; "$KVBM_BIN" b3sum --raw f_1 f_2049 2>err || rc=$?
[ "$rc" == 2 ] || fail "--raw with two files: rc $rc"
echo "kvbm b3sum matches b3sum"
