#!/usr/bin/env bash
# The README's run command: set up (if needed), then run the whole subnet on this machine.
# Arguments go to `templar localnet` (see `templar localnet --help`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
venv="${TEMPLAR_VENV:-$root/.venv}"
cd "$root"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/templar" localnet "$@"
