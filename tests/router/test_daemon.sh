#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm router end to end: fake vLLM workers over ZMQ (and one through
# kvbm events relay and a real nats-server), routing queries and hostile
# HTTP input from Python (tests/router/daemon_e2e.py).
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
NATS=0
command -v nats-server >/dev/null && NATS=1
NATS=$NATS exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/router/daemon_e2e.py"
