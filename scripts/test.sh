#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh           the whole suite (what CI runs)
#   bash scripts/test.sh --fast    the everyday tier: tests not marked slow (by hand or in
#                                  tests/slow_tests.txt), on two pytest-xdist workers
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--fast" ]; then
  shift
  exec .venv/bin/python -m pytest -q -m "not slow" -n "${MEMGNN_TEST_WORKERS:-2}" "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
