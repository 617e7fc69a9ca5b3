#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_worker.sh: `kvbm worker` end to end (tests/worker/worker_test.py
# says what it checks): a real worker process on loopback, its KV events
# read back with `kvbm events tail`, a kill -9 and a warm restart, hostile
# bodies. Debian's Python only.
set -euo pipefail
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/worker/worker_test.py"
