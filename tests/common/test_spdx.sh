#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_spdx.sh: kvbm is Apache-2.0 (LICENSE), and every source file says so
# in an SPDX line within its first three lines: C, CUDA, Python, shell,
# CMake and the templates the build installs. A new file without the line
# fails here, not in a company's licence scan.
set -euo pipefail
src=${KVBM_SOURCE_DIR:?}
cd "$src"
grep -q 'Apache License' LICENSE && grep -q 'Version 2.0, January 2004' LICENSE ||
  { echo "LICENSE is not the Apache License 2.0"; exit 1; }
missing=0
checked=0
while IFS= read -r -d '' f; do
  checked=$((checked + 1))
  if ! head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0'; then
    echo "no SPDX line in the first three lines: ${f#./}"
    missing=$((missing + 1))
  fi
done < <(find . \( -path './build*' -o -path './.git' -o -path './.gpu-*' -o -path './gpu-check-out' \
                   -o -path './fuzz/corpus' -o -path './data' -o -name __pycache__ \) -prune -o \
              -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.py' -o -name '*.pyi' \
                         -o -name '*.sh' -o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name '*.in' \) \
              -print0)
[ "$checked" -gt 300 ] || { echo "only $checked source files found under $src"; exit 1; }
[ "$missing" -eq 0 ] || { echo "$missing of $checked source files lack the SPDX line"; exit 1; }
echo "ok: $checked source files carry SPDX-License-Identifier: Apache-2.0"
