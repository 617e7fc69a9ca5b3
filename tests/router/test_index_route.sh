#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvbm router's GET /index?worker=ID against a fake vLLM worker's events
# (tests/router/index_e2e.py): what the cluster run compares with /blocks.
set -euo pipefail
: "${KVBM_BIN:?}" "${KVBM_SOURCE_DIR:?}"
exec /usr/bin/python3 "$KVBM_SOURCE_DIR/tests/router/index_e2e.py"
