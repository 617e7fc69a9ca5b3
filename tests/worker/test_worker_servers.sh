#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_worker_servers.sh: `kvbm worker` with Redis (a shared, keyed G4) and
# NATS JetStream (its KV events), and the G3 fault knobs
# (tests/worker/worker_servers_test.py). 77 (skip) without the servers.
set -euo pipefail
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/worker/worker_servers_test.py"
