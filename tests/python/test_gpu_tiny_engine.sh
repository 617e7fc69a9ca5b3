#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tiny torch engine on CUDA with kvbm's device G1 adopted from the
# engine's own KV tensor (tests/python/test_tiny_engine_cuda.py, run as a
# script). Label gpu (cmake/gpu.cmake: the name has _test_gpu_): skips (77)
# without torch or a CUDA device, fails instead with KVBM_REQUIRE_GPU=1.
#
# The interpreter is KVBM_PYTHON (default /usr/bin/python3, whose Debian
# torch has no CUDA): on a device machine give the one with CUDA torch, and
# build this tree for it (cmake -DPython3_EXECUTABLE=$KVBM_PYTHON), since
# the extension is built for one interpreter's ABI.
set -euo pipefail
. "$(dirname "$0")/pyenv.sh"
cd "$KVBM_SOURCE_DIR/tests/python"
if [ -n "${KVBM_PYTHON:-}" ]; then
  exec "$KVBM_PYTHON" test_tiny_engine_cuda.py
fi
kvbm_python test_tiny_engine_cuda.py
