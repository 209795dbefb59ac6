#!/usr/bin/env bash
# Creates (or updates) .venv with harness, CPU TensorFlow, the test tools and asv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
stamp=.venv/.harness-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,lint,bench]" "tensorflow-cpu==2.21.*"
  touch "$stamp"
fi
