#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# W5's invariant checkers and schedule reader against synthetic broken runs
# (tests/cluster/checks_test.py): each must be caught.
set -euo pipefail
: "${KVBM_SOURCE_DIR:?}"
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/cluster/checks_test.py"
