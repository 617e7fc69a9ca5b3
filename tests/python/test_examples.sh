#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every Python example (examples/python/*.py) against the build tree's
# package: the README's quick start must keep working.
set -euo pipefail
. "$(dirname "$0")/pyenv.sh"
for ex in "$KVBM_SOURCE_DIR"/examples/python/*.py; do
  echo "== $ex"
  kvbm_python "$ex"
done
