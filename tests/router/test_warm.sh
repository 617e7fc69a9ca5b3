#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm router: tenants' namespaces in /route, DEGRADED workers, a warm
# restart from a snapshot over ZMQ, and JetStream sources (two routers, one
# restarted mid-stream; nats-server -js, when installed)
# (tests/router/warm_e2e.py).
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
NATS=0
command -v nats-server >/dev/null && NATS=1
NATS=$NATS exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/router/warm_e2e.py"
