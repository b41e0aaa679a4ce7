#!/usr/bin/env bash
# The README's test command: set up (if needed), lint, then run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k wire -x).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
venv="${TEMPLAR_VENV:-$root/.venv}"
cd "$root"
echo "[test] ruff"
"$venv/bin/ruff" check src neurons scripts tests benchmarks
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "[test] pytest"
exec "$venv/bin/python" -m pytest -q "$@"
