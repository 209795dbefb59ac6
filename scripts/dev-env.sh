#!/usr/bin/env bash
# Creates (or updates) .venv with harness, CPU TensorFlow, tf-keras, CPU JAX (Keras 3 on JAX: tests/onjax), the test
# tools, asv, the docs site's MkDocs and Playwright (the browser tests drive the system's Chromium with it; .ci/run
# installs Debian's chromium).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
stamp=.venv/.harness-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,lint,bench,docs,browser,jax]" "tensorflow-cpu==2.21.*" \
    "jax==0.10.2" "jaxlib==0.10.2"
  # tf-keras, so the Keras 2 tests run here too (tf_keras models beside Keras 3, no TF_USE_LEGACY_KERAS).
  # --no-deps: it requires the `tensorflow` distribution, whose CUDA build would land over tensorflow-cpu.
  .venv/bin/python -m pip install --quiet --no-deps "tf-keras==2.21.*"
  touch "$stamp"
fi
# jq: the nightly workflow's issue report is jq over JSON, and tests/ci/test_publish_tracking.py runs it.
if ! command -v jq > /dev/null && command -v apt-get > /dev/null && [ "$(id -u)" -eq 0 ]; then
  apt-get install -y -qq jq > /dev/null 2>&1 || { apt-get update -qq > /dev/null && apt-get install -y -qq jq > /dev/null; }
fi
# What the suite needs from this environment, checked here: without it the tests that need it would skip, and a
# skip the allowlist accepts elsewhere (a Keras 2 env's Keras 3 tests) would hide a broken environment.
.venv/bin/python - <<'PY'
import sys
from importlib import metadata

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

wanted = {"keras": lambda v: v is not None and v.split(".")[0] == "3", "tf-keras": lambda v: v is not None,
          "asv": lambda v: v is not None, "tensorflow-cpu": lambda v: v is not None, "jax": lambda v: v is not None,
          "jaxlib": lambda v: v is not None}
broken = [f"{name} ({version(name) or 'missing'})" for name, ok in wanted.items() if not ok(version(name))]
if broken:
    sys.exit("scripts/dev-env.sh: .venv lacks what the suite needs: " + ", ".join(broken)
             + " (Keras 3 as keras, tf-keras, asv, tensorflow-cpu, jax); remove .venv and run this again")
PY
