#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The proof with the real thing: Debian's prometheus scrapes `kvbm replay`
# (tiers, the manager's own endpoint) and `kvbm router` on loopback, and
# the values it stores agree with each process's own JSON
# (tests/metrics/prometheus_e2e.py).
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
command -v prometheus >/dev/null || { echo "prometheus is not installed (scripts/setup.sh)" >&2; exit 1; }
command -v promtool >/dev/null || { echo "promtool is not installed (scripts/setup.sh)" >&2; exit 1; }
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/metrics/prometheus_e2e.py"
