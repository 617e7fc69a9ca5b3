#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package's tests (tests/python/test_*.py, pytest) against the
# build tree's package; see pyenv.sh for the sanitizer builds.
set -euo pipefail
. "$(dirname "$0")/pyenv.sh"
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
cd "$KVBM_SOURCE_DIR/tests/python"
kvbm_python -m pytest -q -p no:cacheprovider "$@" .
