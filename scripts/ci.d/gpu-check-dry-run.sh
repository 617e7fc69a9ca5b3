#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device check's dry run (issue 21): scripts/gpu-check.sh fetches the
# Debian packages it would carry to a GPU machine, builds kvbm against them
# alone, lists the GPU tests and checks that every GPU benchmark parses its
# arguments, stopping before the first CUDA call. It keeps the one script
# that is only run on a lent device from rotting between such runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out} scripts/gpu-check.sh --dry-run
echo "gpu-check --dry-run: $(cat "${OUT:-$PWD/gpu-check-out}/summary.json")"
