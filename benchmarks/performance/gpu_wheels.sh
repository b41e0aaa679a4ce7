#!/usr/bin/env bash
# The wheels benchmarks/performance/gpu.py needs on a GPU machine that has only Python, torch, transformers,
# safetensors and numpy, and no network: put them in benchmarks/.gpu_wheels/ (git-ignored) from the
# package index pip is configured with here, then carry that folder to the machine (see the
# docstring of benchmarks/performance/gpu.py for the one-call command that installs them with --no-index).
#
#   bash benchmarks/performance/gpu_wheels.sh                 # CPython 3.12, manylinux x86_64 (the device image)
#   PYTHON_VERSION=3.11 DEST=/tmp/w311 bash benchmarks/performance/gpu_wheels.sh   # another interpreter
#
# The set is what the script's imports pull in beyond the image (checked by importing them with
# bittensor blocked): pydantic (templar.core.config, templar.wire), loguru (templar.compress,
# templar.data), openskill (the noise phase's evaluation sequences come from templar.gauntlet, whose
# package imports the rating), and aiobotocore with its closure (templar.data imports templar.storage, whose S3
# bucket is aiobotocore; the benchmark reads a local corpus). Versions are those of this
# repository's .venv, the ones the suite runs. tokenizers is not fetched: transformers depends on it,
# so the image has it, and a newer one would drag in another huggingface-hub.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${TEMPLAR_VENV:-$root/.venv}/bin/python"
dest="${DEST:-$root/benchmarks/.gpu_wheels}"
version="${PYTHON_VERSION:-3.12}"
packages=(pydantic loguru aiobotocore openskill)

pins=()
for name in "${packages[@]}"; do
  pins+=("$name==$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
mkdir -p "$dest"
"$python" -m pip download --disable-pip-version-check -q --dest "$dest" --only-binary=:all: \
  --python-version "$version" --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
echo "[gpu_wheels] ${pins[*]} and their dependencies for CPython $version in $dest:" \
  "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1)"
