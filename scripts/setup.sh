#!/usr/bin/env bash
# Create .venv and install memgnn with its test tools, on a machine with nothing but Python.
# torch first: where the local CPU build (torch==2.13.0) is on disk, pip takes it and never
# pulls a multi-GB CUDA build; elsewhere pip picks a torch in the range pyproject.toml allows.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" \
    || .venv/bin/python -m pip install -q --disable-pip-version-check "torch>=2.6,<=2.14.1"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
