#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm router's event sources against hostile or unlucky workers: restarts,
# stray sequence numbers (ZMQ and NATS), a dp rank flood, replay servers
# that answer out of range or trickle, --worker-timeout with a restart, and
# a NATS outage under `kvbm events relay` (tests/router/sources_e2e.py;
# nats-server, when installed, is started on a free loopback port).
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
NATS=0
command -v nats-server >/dev/null && NATS=1
NATS=$NATS exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/router/sources_e2e.py"
